"""JSON Schema of every event type, the storage contract readers in other languages build on.

`treemail schema > schemas/events.schema.json` regenerates the checked-in
file; a test fails when the code and the file drift apart, which is the
reminder to bump PROTOCOL_VERSION for an incompatible change.
"""

import json

from .protocol import PROTOCOL_VERSION
from .events import EVENT_TYPES


def event_schemas() -> dict:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "treemail session stream events",
        "protocol_version": PROTOCOL_VERSION,
        "description": "Each stream entry has fields `type` (a key below) and `data` (JSON matching its schema).",
        "events": {name: cls.model_json_schema() for name, cls in sorted(EVENT_TYPES.items())},
    }


def render() -> str:
    return json.dumps(event_schemas(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
