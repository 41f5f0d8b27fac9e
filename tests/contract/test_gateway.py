"""The host gateway: its OpenAPI document is the served routes, its answers are as documented, and it refuses
bad input with a stable code before the host API is called."""

import json
import urllib.request
from pathlib import Path

import redis.asyncio as aioredis
from starlette.routing import Route

from treemail.adapters.config import Config, MessagingConfig, ServiceConfig
from treemail.domain.protocol import PROTOCOL_VERSION
from treemail.entrypoints import gatewayapi
from treemail.entrypoints.gateway import create_app
from treemail.entrypoints.gatewayops import OPERATIONS
from treemail.entrypoints.gatewaywire import PREFIX

from .backends import HttpBackend
from .interpreter import cases, run_case
from .stack import gateway_stack

CHECKED_IN = Path(__file__).resolve().parents[2] / "schemas" / "host-gateway.openapi.json"
# The OpenAPI Initiative's JSON Schema for 3.1 (tests/fixtures/openapi/README.md says where from).
OFFICIAL = Path(__file__).resolve().parents[1] / "fixtures" / "openapi" / "3.1.json"


def test_the_checked_in_openapi_document_matches_the_code():
    assert CHECKED_IN.read_text() == gatewayapi.render(), (
        "the gateway's routes or bodies changed: regenerate with "
        "`.venv/bin/python -m treemail.entrypoints.gatewayapi --write`")


def test_the_document_is_valid_openapi_3_1_and_the_check_would_catch_a_broken_one():
    import jsonschema

    official = jsonschema.Draft202012Validator(json.loads(OFFICIAL.read_text()))
    doc = json.loads(CHECKED_IN.read_text())
    assert [error.message for error in official.iter_errors(doc)] == []
    doc["paths"][PREFIX]["get"]["responses"]["200"]["description"] = 7  # a string in the spec
    assert list(official.iter_errors(doc))


def test_every_served_route_is_documented_and_every_documented_route_is_served():
    app = create_app(Config(service=ServiceConfig(redis_url="redis://unused")))
    # The probes (/healthz, /readyz) answer as every treemail process's do: not operations of the host API.
    served = {(route.path, method.lower()) for route in app.routes if isinstance(route, Route)
              and route.path not in ("/healthz", "/readyz") for method in route.methods - {"HEAD"}}
    documented = {(path, method) for path, item in json.loads(CHECKED_IN.read_text())["paths"].items()
                  for method in item}
    assert served == documented
    assert all(path.startswith(PREFIX) for path, _ in served)


def test_every_operation_has_a_unique_id_and_a_documented_body():
    doc = gatewayapi.document()
    ids = [op.id for op in OPERATIONS]
    assert len(ids) == len(set(ids))
    streams = {PREFIX + op.path for op in OPERATIONS if op.events}
    assert streams == {PREFIX + "/wakes/stream", PREFIX + "/interrupts/stream"}
    for path, item in doc["paths"].items():
        for method, operation in item.items():
            ok = operation["responses"]["200"]["content"]
            if path in streams:
                refs = [event["$ref"] for event in ok["text/event-stream"]["x-events"].values()]
                assert all(ref.rsplit("/", 1)[1] in doc["components"]["schemas"] for ref in refs), path
            else:
                assert ok["application/json"]["schema"]["$ref"], (path, method)
            for status, response in operation["responses"].items():
                if status == "200" and path in streams:
                    continue
                schema = response["content"]["application/json"]["schema"]
                for ref in [schema.get("$ref")] if "$ref" in schema else [s["$ref"] for s in schema["anyOf"]]:
                    assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"], (path, method, status)


async def test_every_contract_operation_answers_as_documented_and_the_rest_are_reached_here(contract_stack):
    _, base_url = contract_stack
    http = HttpBackend(base_url)
    for case in cases():
        await run_case(case, http)
    # What the contract does not reach, reached here, each answer validated against the document too.
    root = (await http.request("registerRoot", body={"agent_type": "planner", "rules": {"child": "allow"}}))[1]
    child = (await http.request("registerChild", {"session_id": root["session_id"]},
                                {"agent_type": "explore", "rules": {"parent": "allow"}, "status": "running"}))[1]
    status, info = await http.request("info")
    assert (status, info["protocol_version"]) == (200, PROTOCOL_VERSION)
    status, tools = await http.request("tools", {"session_id": child["session_id"]}, query={"format": "openai"})
    assert status == 200 and tools["tools"][0]["function"]["name"] == "send_message"
    await _permissions_approvals_and_drains(http, root, child)
    status, answer = await http.request("reconcile", body={"interrupted_runs": False})
    assert status == 200 and answer["woken"] >= 0
    status, stopped = await http.request("stopSubtree", {"session_id": root["session_id"]}, {"how": "dispose"})
    assert status == 200 and [row["session_id"] for row in stopped["stopped"]][-1] == root["session_id"]
    # The event streams are followed in test_gateway_events.py.
    assert {op.id for op in OPERATIONS if not op.events} == {op_id for op_id, _ in http.answered}


async def _permissions_approvals_and_drains(http: HttpBackend, root: dict, child: dict) -> None:
    """The person's side of an ``ask`` rule, the host's overlay of rules, and drains, over the gateway."""
    import asyncio

    path = {"session_id": child["session_id"]}
    status, report = await http.request("permissions", path)
    assert status == 200 and report["labels"]["parent"]["effect"] == "allow"
    status, guidance = await http.request("returnGuidance", path)
    assert status == 200 and root["handle"] in guidance["guidance"]
    status, _ = await http.request("setMessageRules", path, {"rules": {"parent": "ask"}})
    assert status == 200
    await http.start_run({"session": child["session_id"], "run": "c-1"})
    context = {"session_id": child["session_id"], "run_id": "c-1", "tool_call_id": "ask-1"}
    asking = asyncio.create_task(http.request("sendMessage", body={
        "context": context, "arguments": {"to": root["handle"], "body": "may I?"}}))
    for _ in range(200):
        _, waiting = await http.request("pendingApprovals")
        mine = [a for a in waiting["approvals"] if a["sender_session_id"] == child["session_id"]]
        if mine:
            break
        await asyncio.sleep(0.05)
    status, decided = await http.request("approve", {"request_id": mine[0]["request_id"]}, {"scope": "once"})
    assert (status, decided["status"]) == (200, "approved")
    status, answer = await asyncio.wait_for(asking, 30)
    assert status == 200 and "message_id" in answer["result"]
    status, answer = await http.request("deny", {"request_id": mine[0]["request_id"]}, {})
    # Decided already: the gateway answers with the host API's own code.
    assert (status, answer["error"]["code"]) == (409, "approval:already_decided")
    status, answer = await http.request("approve", {"request_id": "no-such-request"}, {})
    assert (status, answer["error"]["code"]) == (404, "approval:unknown_request")
    await http.request("setMessageRules", path, {"rules": None})
    status, drained = await http.request("drain", body={"session_id": child["session_id"]})
    assert (status, drained["sessions"]) == (200, 1)
    refused = await http.send_message({"session": child["session_id"], "run": "c-1", "call": "drained-1",
                                       "arguments": {"to": root["handle"], "body": "x"}})
    assert refused["error"]["code"] == "send_message:draining"
    status, lifted = await http.request("undrain", body={"session_id": child["session_id"]})
    assert (status, lifted["sessions"]) == (200, 1)


async def test_bad_input_is_refused_with_a_stable_code_before_the_host_api_is_called(contract_stack):
    _, base_url = contract_stack
    http = HttpBackend(base_url)
    _, root = await http.request("registerRoot", body={"agent_type": "planner"})
    path = {"session_id": root["session_id"]}
    for body in ({"status": "sleeping"}, {"status": 3}, {"status": "idle", "extra": 1}, {}):
        status, answer = await http.request("setStatus", path, body)
        assert (status, answer["error"]["code"]) == (400, "gateway:invalid_request"), body
    for block_ms in (10 ** 9, 0):  # 0 would be "forever" to the server
        status, answer = await http.request("pollWakes", query={"consumer": "r", "block_ms": block_ms})
        assert (status, answer["error"]["code"]) == (400, "gateway:invalid_request")
    status, answer = await http.request("pollWakes")  # no consumer
    assert (status, answer["error"]["code"]) == (400, "gateway:invalid_request")
    forged = {"session_id": root["session_id"], "message_id": None, "stream": "tm:cmd:{c0}", "entry_id": "0-1"}
    status, answer = await http.request("wakeRun", body={"wake": forged, "run_id": "r"})
    assert (status, answer["error"]["code"]) == (400, "gateway:invalid_request")  # only wake streams are acked
    context = {"session_id": "00000000-0000-7000-8000-000000000000", "run_id": "r", "tool_call_id": "t"}
    status, answer = await http.request("callTool", {"name": "interrupt_agent"}, {"context": context, "arguments": {}})
    assert (status, answer["error"]["code"]) == (404, "lifecycle:unknown_session")  # the request's, not the tool's
    status, answer = await http.request("sendMessage", body={"context": {"session_id": "s"}, "arguments": {}})
    assert (status, answer["error"]["code"]) == (400, "gateway:invalid_request")
    status, answer = await http.request("startRun", path, {"run_id": "x" * 1000})
    assert (status, answer["error"]["code"]) == (400, "identifier:too_long")
    # A wake token whose entry id the server could not have written is refused before its run is started.
    for entry_id in ("abc", "", "99999999999999999999999-0"):
        token = {"session_id": root["session_id"], "message_id": None, "stream": "tm:{p0}:wakes", "entry_id": entry_id}
        status, answer = await http.request("wakeRun", body={"wake": token, "run_id": "woken"})
        assert (status, answer["error"]["code"]) == (400, "gateway:invalid_request"), entry_id
    assert (await http.request("startRun", path, {"run_id": "woken"}))[0] == 200  # no run was left open
    # A query is strict: a name the operation does not take, a name twice, a number in other digits, an empty id.
    for query, said in (({"consumer": "r", "blockms": "10"}, "unknown query parameter"),
                        ({"consumer": "r", "count": "²"}, "non-negative integer"),
                        ({"consumer": "r", "count": "５"}, "non-negative integer"),
                        ({"consumer": "r", "count": "9" * 5000}, "at most 18 digits")):
        status, answer = await http.request("pollWakes", query=query)
        assert (status, answer["error"]["code"]) == (400, "gateway:invalid_request") and said in answer["error"][
            "message"] and len(answer["error"]["message"]) < 300, query
    # A step a JavaScript engine could not hold exactly is refused, not stored to come back changed.
    status, answer = await http.request("claim", {**path, "run_id": "woken"}, {"step": 2 ** 53})
    assert (status, answer["error"]["code"]) == (400, "gateway:invalid_request")
    status, answer = await http.request("pollWakes", query={"consumer": ""})
    assert (status, answer["error"]["code"]) == (400, "identifier:invalid")
    status, answer = await http.request("pollWakes", query={"consumer": "r" * 300})
    assert (status, answer["error"]["code"]) == (400, "identifier:too_long")
    # A refusal the host API raises keeps its own code, the one a Python host catches, not a gateway's.
    status, answer = await http.request("registerRoute", body={"name": "me", "target_session_id": root["session_id"],
                                                               "source_session_id": root["session_id"]})
    assert (status, answer["error"]["code"]) == (409, "peer_route:self")


def _raw(url: str, method: str = "GET", data: bytes | None = None):
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


async def test_unknown_routes_and_malformed_bodies_get_the_error_shape_and_every_answer_names_its_versions(
        contract_stack):
    import asyncio

    _, base_url = contract_stack
    status, headers, body = await asyncio.to_thread(_raw, base_url + "/v2/sessions")
    assert (status, body["error"]["code"]) == (404, "gateway:not_found")
    status, headers, body = await asyncio.to_thread(_raw, base_url + PREFIX + "/sessions", "POST", b"{not json")
    assert (status, body["error"]["code"]) == (400, "gateway:invalid_request")
    assert headers["treemail-gateway-version"] == "1"
    assert headers["treemail-protocol-version"] == str(PROTOCOL_VERSION)
    status, headers, body = await asyncio.to_thread(_raw, base_url + PREFIX)
    assert status == 200 and headers["treemail-gateway-version"] == "1"
    # Nested past any parser's recursion, whole or inside a field: a refusal in the shape, never a 500.
    for deep in (b"[" * 100_000 + b"]" * 100_000,
                 b'{"agent_type": "x", "rules": ' + b"[" * 990 + b"]" * 990 + b"}"):
        status, headers, body = await asyncio.to_thread(_raw, base_url + PREFIX + "/sessions", "POST", deep)
        assert (status, body["error"]["code"]) == (400, "gateway:invalid_request") and "nests deeper" in body[
            "error"]["message"]
    # An operation's body is required: an empty one is not taken for its defaults (a drain of the whole service).
    status, headers, body = await asyncio.to_thread(_raw, base_url + PREFIX + "/drain", "POST", b"")
    assert (status, body["error"]["code"]) == (400, "gateway:invalid_request") and "required" in body["error"][
        "message"]
    huge = json.dumps({"agent_type": "x", "description": "d" * (16 * 1024 * 1024)}).encode()
    status, headers, body = await asyncio.to_thread(_raw, base_url + PREFIX + "/sessions", "POST", huge)
    assert (status, body["error"]["code"]) == (413, "gateway:request_too_large")


async def test_a_client_gone_before_its_body_arrived_leaves_no_error_in_the_log(contract_stack, caplog):
    import asyncio
    import logging

    _, base_url = contract_stack
    http = HttpBackend(base_url)
    host, port = base_url.split("//", 1)[1].split(":")
    with caplog.at_level(logging.WARNING):
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"POST {PREFIX}/sessions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     "Content-Length: 1000\r\n\r\n{\"agent_type\": \"gone".encode())
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        # The server reads on until it finds the connection closed; a request after it is answered as ever.
        for _ in range(20):
            await asyncio.sleep(0.05)
        assert (await http.request("registerRoot", body={"agent_type": "planner"}))[0] == 200
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def _own_database(valkey, number: int) -> str:
    """A clean database beside the module's stack (database 0), whose worker reads the same command stream."""
    url = valkey.url.rsplit("/", 1)[0] + f"/{number}"
    client = aioredis.Redis.from_url(url)
    await client.execute_command("FLUSHDB", "SYNC")
    await client.aclose()
    return url


async def test_a_refusal_that_may_pass_later_is_429_with_retry_after(valkey):
    # A database of its own: the workers decide by their own guards, and the module's stack (default guards)
    # reads the same command stream on database 0.
    url = await _own_database(valkey, 7)
    config = Config(messaging=MessagingConfig(max_pending_per_session=1),
                    service=ServiceConfig(redis_url=url, command_streams=1, partitions=4))
    async with gateway_stack(url, config) as (_, base_url):
        http = HttpBackend(base_url)
        root = await http.register_root({"agent_type": "planner", "rules": {"child": "allow"}})
        child = await http.register_child({"parent": root["session_id"], "agent_type": "explore"})
        await http.start_run({"session": root["session_id"], "run": "r"})
        context = {"session_id": root["session_id"], "run_id": "r"}
        answers = [await http.request("sendMessage", body={
            "context": {**context, "tool_call_id": f"t{i}"}, "arguments": {"to": child["handle"], "body": "x"}})
            for i in range(2)]
        (first, _), (status, refused) = answers
        assert first == 200
        assert (status, refused["error"]["code"]) == (429, "send_message:inbox_full")
        assert refused["is_error"] and refused["error"]["retry_after_ms"] > 0
        assert refused["text"].startswith("send_message:inbox_full")


async def test_long_polls_past_the_bound_are_told_to_come_back_so_other_operations_keep_a_connection(
        valkey, monkeypatch):
    import asyncio

    from treemail.entrypoints import gatewaywire

    monkeypatch.setattr(gatewaywire, "MAX_WAITING_READS", 2)
    url = await _own_database(valkey, 8)  # no wake triggers: each poll waits its whole block_ms
    async with gateway_stack(url) as (_, base_url):
        http = HttpBackend(base_url)
        waiting = [asyncio.create_task(http.request("pollWakes", query={"consumer": f"bound-{i}", "block_ms": 3000}))
                   for i in range(2)]
        await asyncio.sleep(1)  # both are waiting at the gateway by then (each for 3 s): a third is refused at once
        status, answer = await http.request("pollWakes", query={"consumer": "bound-3", "block_ms": 3000})
        assert (status, answer["error"]["code"]) == (429, "gateway:too_many_polls")
        assert answer["error"]["retry_after_ms"] > 0
        status, _ = await http.request("info")  # other operations still answered meanwhile
        assert status == 200
        assert [status for status, _ in await asyncio.gather(*waiting)] == [200, 200]
