"""TLS: a host, a FastStream worker and the CLI reach the server over `rediss://`.

The embedded Valkey is built without TLS, so the server side here is a
TLS-terminating proxy in front of it (as stunnel or a cloud load balancer
would be), with a certificate made for the test: the clients' side is the
real one, certificate checks included.
"""

import asyncio
import datetime
import ipaddress
import ssl
import threading

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from treemail.adapters.embedded import free_port
from treemail.consumers.app import Worker
from treemail.host import Treemail

from .conftest import Calls, make_config
from .test_cli_usage import cli, one_line_error


def self_signed(directory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key, as PEM files; the certificate is its own CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "treemail-test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(cert_path), str(key_path)


class TlsProxy:
    """Terminates TLS on a port of its own and forwards the bytes to the server, on a thread of its own."""

    def __init__(self, server_port: int, cert: str, key: str) -> None:
        self.server_port = server_port
        self.port = free_port()
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> "TlsProxy":
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._forward, "127.0.0.1", self.port, ssl=self.context), self.loop).result(10)
        return self

    def __exit__(self, *exc) -> None:
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _close(self) -> None:
        self.server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _forward(self, client_reader, client_writer) -> None:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.server_port)

        async def pipe(reader, writer) -> None:
            try:
                while data := await reader.read(65536):
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, ssl.SSLError):
                pass
            finally:
                writer.close()

        await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))


@pytest.fixture
def tls(valkey, redis_url, tmp_path):
    cert, key = self_signed(tmp_path)
    with TlsProxy(valkey.port, cert, key) as proxy:
        yield proxy, cert


async def test_a_send_goes_through_a_worker_and_a_host_that_reach_the_server_over_tls(tls):
    proxy, cert = tls
    url = f"rediss://127.0.0.1:{proxy.port}/0?ssl_ca_certs={cert}"
    config = make_config(url)
    worker = Worker(config, url, consumer="tls-worker")
    await worker.start()
    host = await Treemail.connect(config, url)
    try:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x", status="running")
        await host.start_run(root.session_id, "run-1")
        result = await host.send_message(Calls().ctx(root.session_id), {"to": child.handle, "body": "over TLS"})
        assert "message_id" in result, result
        assert [e.body for _, e in await host.history(child.session_id) if hasattr(e, "body")] == ["over TLS"]
    finally:
        await host.close()
        await worker.stop()


def test_a_certificate_the_client_does_not_trust_is_a_one_line_error(tls):
    proxy, cert = tls
    # Without the CA the client checks the certificate against the system's store, which does not know it.
    done = cli(f"rediss://127.0.0.1:{proxy.port}/0", "trees", TREEMAIL_SERVICE_CONNECT_ATTEMPTS="1")
    line = one_line_error(done)
    assert "cannot reach Redis/Valkey" in line and "certificate verify failed" in line, line
    trusted = cli(f"rediss://127.0.0.1:{proxy.port}/0?ssl_ca_certs={cert}", "trees")
    assert trusted.returncode == 0, trusted.stderr
