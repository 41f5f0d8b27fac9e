"""The contract's operations on the two Python backends: the host API in process, and the gateway over HTTP.

Both answer each operation with plain JSON values; a refusal is ``{"error": {"code", "message"}}``,
whether the host API raised it (a lifecycle error) or returned it (a model's send).
"""

import asyncio
import dataclasses
import json
import urllib.error
import urllib.parse
import urllib.request

import jsonschema

from treemail.domain.commands import SendContext
from treemail.domain.errors import LifecycleError, UnknownSessionError
from treemail.domain.limits import IdentifierError
from treemail.entrypoints import gatewayapi
from treemail.entrypoints.gatewayops import OPERATIONS
from treemail.entrypoints.gatewaywire import PREFIX

# A wake or an interrupt of the case's session may follow those of earlier cases: read until it comes.
FOLLOW_READS = 50
FOLLOW_BLOCK_MS = 200


def _ctx(args: dict) -> SendContext:
    return SendContext(args["session"], args["run"], args["call"])


def _delivery(d) -> dict:
    return {**dataclasses.asdict(d), "parts": list(d.parts)}


class HostBackend:
    """The Python host API, called as an engine embedding it calls it."""

    def __init__(self, tm) -> None:
        self.tm = tm

    async def __call__(self, op: str, a: dict):
        try:
            return await getattr(self, op)(a)
        except (LifecycleError, IdentifierError) as error:
            return {"error": {"code": error.code, "message": error.message}}
        except UnknownSessionError as error:
            return {"error": {"code": "lifecycle:unknown_session", "message": str(error)}}

    async def register_root(self, a):
        return dataclasses.asdict(await self.tm.register_root(**a))

    async def register_child(self, a):
        a = dict(a)
        return dataclasses.asdict(await self.tm.register_child(a.pop("parent"), **a))

    async def set_status(self, a):
        await self.tm.set_status(a["session"], a["status"])
        return {}

    async def tool_names(self, a):
        return [d["name"] for d in await self.tm.tools.definitions(a["session"])]

    async def install_tools(self, a):
        return await self.tm.tools.install(a["session"], a["names"])

    async def start_run(self, a):
        await self.tm.start_run(a["session"], a["run"])
        return {}

    async def finish_run(self, a):
        return {"gate": await self.tm.finish_run(a["session"], a["run"], a.get("reason"), a.get("closing_text"))}

    async def send_message(self, a):
        return await self.tm.send_message(_ctx(a), a["arguments"])

    async def call_tool(self, a):
        return await self.tm.tools.call(_ctx(a), a["name"], a["arguments"])

    async def host_send(self, a):
        a = dict(a)
        return await self.tm.send(a.pop("session"), a.pop("to"), a.pop("body"), **a)

    async def claim(self, a):
        return [_delivery(d) for d in await self.tm.claim(a["session"], a["run"], a.get("step"))]

    async def consume(self, a):
        await self.tm.consume(a["session"], a["message"], step=a.get("step"))
        return {}

    async def release(self, a):
        await self.tm.release(a["session"], a["message"], reason=a.get("reason", ""))
        return {}

    async def discard(self, a):
        await self.tm.discard(a["session"], a["message"], a.get("reason", ""))
        return {}

    async def inject(self, a):
        return {"message_id": await self.tm.inject(a["session"], a["owner"], a["body"], a.get("mode", "queue"))}

    async def inspect(self, a):
        return await self.tm.obligations.inspect(a["message"], a.get("caller"))

    async def retry(self, a):
        return await self.tm.obligations.retry(a["message"], a.get("caller"))

    async def cancel(self, a):
        return await self.tm.obligations.cancel(a["message"], a.get("caller"))

    async def wake_for(self, a):
        for _ in range(FOLLOW_READS):
            for wake in await self.tm.wakes(a["consumer"], block_ms=FOLLOW_BLOCK_MS):
                if wake.session_id == a["session"]:
                    return {"started": await self.tm.wake_run(wake, a["run"])}
        raise AssertionError(f"no wake for {a['session']}")

    async def interrupt_for(self, a):
        for _ in range(FOLLOW_READS):
            for it in await self.tm.interrupts.read(a["consumer"], block_ms=FOLLOW_BLOCK_MS):
                if it.session_id == a["session"]:
                    return {"aborted": await self.tm.interrupts.abort_run(it)}
        raise AssertionError(f"no interrupt for {a['session']}")

    async def register_route(self, a):
        a = dict(a)
        await self.tm.peers.register_route(a.pop("name"), a.pop("target_session_id"), **a)
        return {}

    async def revoke_route(self, a):
        a = dict(a)
        return {"revoked": await self.tm.peers.revoke_route(a.pop("name"), **a)}

    async def set_grant(self, a):
        a = dict(a)
        return {"principal": await self.tm.peers.set_grant(a.pop("target_session_id"), **a)}

    async def routes(self, a):
        return await self.tm.peers.routes(a["session"])

    async def dispose(self, a):
        return dataclasses.asdict(await self.tm.disposal.dispose(a["session"], a.get("reason"),
                                                                 a.get("closing_text")))


class HttpBackend:
    """The gateway over HTTP, each answer validated against the checked-in OpenAPI document."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url.rstrip("/")
        self.document = gatewayapi.document()
        self.operations = {op.id: op for op in OPERATIONS}
        self.answered: set[tuple[str, int]] = set()

    def _validate(self, op_id: str, status: int, body) -> None:
        op = self.operations[op_id]
        responses = self.document["paths"][PREFIX + op.path][op.method.lower()]["responses"]
        assert str(status) in responses, f"{op_id} answered {status}, which its document does not list: {body}"
        schema = {**responses[str(status)]["content"]["application/json"]["schema"],
                  "components": self.document["components"]}
        jsonschema.Draft202012Validator(schema).validate(body)
        self.answered.add((op_id, status))

    async def request(self, op_id: str, path: dict | None = None, body: dict | None = None,
                      query: dict | None = None):
        op = self.operations[op_id]
        url = self.base + PREFIX + op.path.format(**{k: urllib.parse.quote(v, safe="") for k, v in (path or {}).items()})
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=op.method,
                                         headers={"Content-Type": "application/json"})

        def send():
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())

        status, answer = await asyncio.to_thread(send)
        self._validate(op_id, status, answer)
        return status, answer

    async def __call__(self, op: str, a: dict):
        return await getattr(self, op)(a)

    async def _plain(self, op_id, path=None, body=None, query=None):
        """An operation's answer, or its error body (the same shape a refusal has everywhere)."""
        _, answer = await self.request(op_id, path, body, query)
        return answer

    async def _tool(self, op_id, path, body):
        _, answer = await self.request(op_id, path, body)
        return answer["result"]

    async def register_root(self, a):
        return await self._plain("registerRoot", body=a)

    async def register_child(self, a):
        a = dict(a)
        return await self._plain("registerChild", {"session_id": a.pop("parent")}, a)

    async def set_status(self, a):
        return await self._plain("setStatus", {"session_id": a["session"]}, {"status": a["status"]})

    async def tool_names(self, a):
        answer = await self._plain("tools", {"session_id": a["session"]})
        return answer if "error" in answer else [d["name"] for d in answer["tools"]]

    async def install_tools(self, a):
        answer = await self._plain("installTools", {"session_id": a["session"]}, {"names": a["names"]})
        return answer.get("installed", answer)

    async def start_run(self, a):
        return await self._plain("startRun", {"session_id": a["session"]}, {"run_id": a["run"]})

    async def finish_run(self, a):
        body = {k: a[k] for k in ("reason", "closing_text") if k in a}
        return await self._plain("finishRun", {"session_id": a["session"], "run_id": a["run"]}, body)

    async def send_message(self, a):
        context = {"session_id": a["session"], "run_id": a["run"], "tool_call_id": a["call"]}
        return await self._tool("sendMessage", None, {"context": context, "arguments": a["arguments"]})

    async def call_tool(self, a):
        context = {"session_id": a["session"], "run_id": a["run"], "tool_call_id": a["call"]}
        return await self._tool("callTool", {"name": a["name"]}, {"context": context, "arguments": a["arguments"]})

    async def host_send(self, a):
        a = dict(a)
        return await self._plain("send", {"session_id": a.pop("session")}, a)

    async def claim(self, a):
        body = {"step": a["step"]} if "step" in a else {}
        answer = await self._plain("claim", {"session_id": a["session"], "run_id": a["run"]}, body)
        return answer.get("deliveries", answer)

    async def consume(self, a):
        body = {"step": a["step"]} if "step" in a else {}
        return await self._plain("consume", {"session_id": a["session"], "message_id": a["message"]}, body)

    async def release(self, a):
        return await self._plain("release", {"session_id": a["session"], "message_id": a["message"]},
                                 {"reason": a.get("reason", "")})

    async def discard(self, a):
        return await self._plain("discard", {"session_id": a["session"], "message_id": a["message"]},
                                 {"reason": a.get("reason", "")})

    async def inject(self, a):
        a = dict(a)
        return await self._plain("inject", {"session_id": a.pop("session")}, a)

    async def inspect(self, a):
        return await self._plain("inspect", {"message_id": a["message"]}, query={"caller_session_id": a.get("caller")})

    async def retry(self, a):
        return await self._plain("retry", {"message_id": a["message"]}, {"caller_session_id": a.get("caller")})

    async def cancel(self, a):
        return await self._plain("cancel", {"message_id": a["message"]}, {"caller_session_id": a.get("caller")})

    async def wake_for(self, a):
        for _ in range(FOLLOW_READS):
            answer = await self._plain("pollWakes", query={"consumer": a["consumer"], "block_ms": FOLLOW_BLOCK_MS})
            for wake in answer["wakes"]:
                if wake["session_id"] == a["session"]:
                    return await self._plain("wakeRun", body={"wake": wake, "run_id": a["run"]})
        raise AssertionError(f"no wake for {a['session']}")

    async def interrupt_for(self, a):
        for _ in range(FOLLOW_READS):
            answer = await self._plain("pollInterrupts", query={"consumer": a["consumer"], "block_ms": FOLLOW_BLOCK_MS})
            for it in answer["interrupts"]:
                if it["session_id"] == a["session"]:
                    return await self._plain("abortRun", body={"interrupt": it})
        raise AssertionError(f"no interrupt for {a['session']}")

    async def register_route(self, a):
        return await self._plain("registerRoute", body=a)

    async def revoke_route(self, a):
        return await self._plain("revokeRoute", body=a)

    async def set_grant(self, a):
        return await self._plain("setGrant", body=a)

    async def routes(self, a):
        answer = await self._plain("routes", {"session_id": a["session"]})
        return answer.get("routes", answer)

    async def dispose(self, a):
        a = dict(a)
        return await self._plain("dispose", {"session_id": a.pop("session")}, a)
