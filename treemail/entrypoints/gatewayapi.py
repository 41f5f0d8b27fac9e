"""The host gateway's OpenAPI 3.1 document, built from the same rows the app is built from.

``schemas/host-gateway.openapi.json`` is this document checked in (a test fails when they drift apart;
regenerate with ``python -m treemail.entrypoints.gatewayapi --write``). The bodies' schemas are the wire
models' own JSON Schemas (``gatewaywire``), which OpenAPI 3.1 takes as they are.
"""

import json
import re
import sys
from pathlib import Path

from pydantic.json_schema import models_json_schema

from treemail.domain.protocol import PROTOCOL_VERSION

from . import gatewaywire as w
from .gatewayops import OPERATIONS, Operation

CHECKED_IN = Path("schemas") / "host-gateway.openapi.json"
REF = "#/components/schemas/{model}"
STATUS_TEXT = {200: "the host API's answer", 400: "the request is malformed (gateway:invalid_request) or a value "
               "the host API refuses", 403: "refused: not permitted", 404: "an unknown session, message, tool or "
               "route", 409: "refused by the state the request found", 429: "refused for now: retry after "
               "retry_after_ms (also the Retry-After header)", 500: "the gateway failed (gateway:internal)",
               413: "the request body is over 16 MiB (gateway:request_too_large)",
               503: "the server is unreachable, or the service is shutting down or draining"}


def _models() -> list:
    found = {op.response for op in OPERATIONS} | {op.request for op in OPERATIONS if op.request} | {w.Error}
    return sorted(found, key=lambda model: model.__name__)


def _json(*names: str) -> dict:
    refs = [{"$ref": REF.format(model=name)} for name in names]
    return {"application/json": {"schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}}


def _parameters(op: Operation) -> list[dict]:
    out = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
           for name in re.findall(r"\{(\w+)\}", op.path)]
    for q in op.query:
        schema: dict = {"type": "integer" if q.kind is int else "string"}
        if q.default is not None:
            schema["default"] = q.default
        if q.minimum is not None:
            schema["minimum"] = q.minimum
        if q.maximum is not None:
            schema["maximum"] = q.maximum
        out.append({"name": q.name, "in": "query", "required": q.required, "schema": schema,
                    "description": q.description})
    if op.events is not None:
        out.append({"name": "Last-Event-ID", "in": "header", "required": False, "schema": {"type": "string"},
                    "description": "the id of the last event received: the stream resumes just after it"})
    return out


def _events(op: Operation) -> dict:
    """An event stream's answer: OpenAPI 3.1 has no schema for a stream's items, so its events are described
    beside it (x-events), each event's data by its schema."""
    data = op.response.__name__
    return {"text/event-stream": {
        "schema": {"type": "string", "description": f"`{op.events}` events (data: {data}, id: the position to resume "
                   "after), a comment line as a heartbeat, and `error` (data: Error) before the stream ends"},
        "x-events": {op.events: {"$ref": REF.format(model=data)}, "error": {"$ref": REF.format(model="Error")}},
    }}


def _operation(op: Operation) -> dict:
    ok = op.response.__name__
    responses = {"200": {"description": STATUS_TEXT[200], "content": _events(op) if op.events else _json(ok)}}
    for status in sorted({400, 503, *op.errors, *((413,) if op.request is not None else ())}):
        # A model-facing call answers the tool's refusal with the tool's whole answer (which carries the error
        # too), and a refusal of the request itself (its body, its session, the server) as every route does.
        names = (ok, "Error") if op.response is w.ToolAnswer else ("Error",)
        responses[str(status)] = {"description": STATUS_TEXT[status], "content": _json(*names)}
    body = {"operationId": op.id, "summary": op.summary, "parameters": _parameters(op), "responses": responses}
    if op.request is not None:
        body["requestBody"] = {"required": True, "content": _json(op.request.__name__)}
    return body


def document() -> dict:
    _, definitions = models_json_schema([(model, "validation" if model in {op.request for op in OPERATIONS}
                                          else "serialization") for model in _models()], ref_template=REF)
    paths: dict[str, dict] = {}
    for op in OPERATIONS:
        paths.setdefault(w.PREFIX + op.path, {})[op.method.lower()] = _operation(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "treemail host gateway",
            "version": str(w.GATEWAY_VERSION),
            "description": "The treemail host API over HTTP/JSON (`treemail gateway`). Every answer carries the "
                           f"headers {w.VERSION_HEADER} and {w.PROTOCOL_HEADER} (event protocol "
                           f"{PROTOCOL_VERSION}). Errors are {{\"error\": {{\"code\", \"message\", "
                           "\"retry_after_ms\"?}}} with the host API's stable codes.",
        },
        "paths": paths,
        "components": {"schemas": definitions["$defs"]},
    }


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        CHECKED_IN.write_text(render())
    else:
        sys.stdout.write(render())
