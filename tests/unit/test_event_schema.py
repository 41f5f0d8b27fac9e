"""The checked-in event schema is the storage contract: code and file must not drift apart."""

from pathlib import Path

from treemail import PROTOCOL_VERSION
from treemail.domain.events import EVENT_TYPES
from treemail.domain.schema import event_schemas, render

CHECKED_IN = Path(__file__).resolve().parents[2] / "schemas" / "events.schema.json"


def test_checked_in_schema_matches_the_code():
    assert CHECKED_IN.read_text() == render(), (
        "event types changed: regenerate with `treemail schema > schemas/events.schema.json` "
        "and bump PROTOCOL_VERSION if old readers cannot read the new events"
    )


def test_every_event_type_has_a_schema_and_the_protocol_version_is_recorded():
    schemas = event_schemas()
    assert set(schemas["events"]) == set(EVENT_TYPES)
    assert schemas["protocol_version"] == PROTOCOL_VERSION
    assert "agent_hop" in schemas["events"]["ProducerMessageAccepted"]["properties"]
