"""A server-sent events client for the tests, reading a stream as a client does: blocks of fields separated by a
blank line, comment lines (heartbeats) among them. Plain HTTP/1.1 over a socket, so a test decides exactly when
it stops reading and closes."""

import asyncio
import json
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Block:
    """One block of a stream: an event (``event``, ``id``, ``data``) or only comment lines (a heartbeat)."""

    event: str | None = None
    id: str | None = None
    data: str = ""
    comments: list[str] = field(default_factory=list)

    def json(self):
        return json.loads(self.data)


class EventStream:
    def __init__(self, status: int, headers: dict[str, str], reader, writer) -> None:
        self.status, self.headers = status, headers
        self._reader, self._writer = reader, writer
        self._buffer = ""

    @classmethod
    async def open(cls, base_url: str, target: str, last_event_id: str | None = None) -> "EventStream":
        url = urlsplit(base_url)
        reader, writer = await asyncio.open_connection(url.hostname, url.port)
        head = f"GET {target} HTTP/1.1\r\nHost: {url.netloc}\r\nAccept: text/event-stream\r\n"
        if last_event_id is not None:
            head += f"Last-Event-ID: {last_event_id}\r\n"
        writer.write((head + "\r\n").encode())
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        return cls(status, headers, reader, writer)

    async def refusal(self) -> dict:
        """The JSON answer of a stream the gateway refused to open."""
        body = json.loads(await self._reader.readexactly(int(self.headers["content-length"])))
        await self.close()
        return body

    async def _chunk(self) -> str:
        size = int((await self._reader.readline()).strip(), 16)  # the body is chunked: it has no length
        data = await self._reader.readexactly(size + 2)
        if size == 0:
            raise EOFError("the stream ended")
        return data[:-2].decode()

    async def block(self, timeout: float = 30) -> Block:
        while "\n\n" not in self._buffer:
            self._buffer += await asyncio.wait_for(self._chunk(), timeout)
        text, _, self._buffer = self._buffer.partition("\n\n")
        block = Block()
        for line in text.split("\n"):
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "":
                block.comments.append(value)
            elif name == "data":
                block.data += value
            elif name in ("event", "id"):
                setattr(block, name, value)
        return block

    async def event(self, timeout: float = 30) -> Block:
        """The next event, past heartbeats and comments."""
        while (block := await self.block(timeout)).event is None:
            pass
        return block

    async def close(self) -> None:
        self._writer.close()
        await self._writer.wait_closed()
