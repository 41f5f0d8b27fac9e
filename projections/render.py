"""How events print for people: one row per event, the same live and replayed."""

import json

from treemail.domain import events as ev


def history_row(seq: int, event: ev.Event) -> str:
    name = type(event).__name__
    match event:
        case ev.ProducerMessageAccepted():
            sender = event.sender_handle or event.owner
            # Peer routes: mail over a peer route shows the principal it was delivered as.
            via = f" peer={event.peer} principal={event.principal}" if event.principal is not None else ""
            return f"{seq:>6} {name:<26} {event.message_id} from={sender}{via} mode={event.mode} body={event.body!r}"
        case ev.MessageEvent():
            run = f" run={event.run_id}" if event.run_id else ""
            # The engine's step and the tokens the message cost, when the host reported them.
            run += "".join(f" {k}={v}" for k in ("step", "tokens") if (v := getattr(event, k, None)) is not None)
            # Then why (a discard's, a release's, a parking's reason and detail, what superseded it, when it is due
            # again): what a person reading the history needs most.
            why = _fields(event, exclude=_MESSAGE_ROW_SHOWN, defaults=False)
            return f"{seq:>6} {name:<26} {event.message_id}{run}{' ' + why if why else ''}"
        case ev.SessionRegistered():
            return f"{seq:>6} {name:<26} {event.handle or event.session_id} status={event.status}"
        case ev.SessionStatusChanged():
            return f"{seq:>6} {name:<26} status={event.status}"
        case _:
            return f"{seq:>6} {name:<26} {_fields(event)}".rstrip()


# What a message event's row shows before its other fields, or leaves to the message's accepted row (who sent it).
_MESSAGE_ROW_SHOWN = frozenset({"at", "message_id", "run_id", "step", "tokens", "owner", "sender_session_id",
                                "agent_hop"})


def _fields(event: ev.Event, exclude: frozenset[str] = frozenset({"at"}), defaults: bool = True) -> str:
    """key=value for any other event, like the rows above; raw JSON rows read as a different tool's output.
    ``defaults=False``: a field at its default is left out too (a release with no change to its attempts)."""
    parts = []
    for key, value in event.model_dump(mode="json", exclude=set(exclude), exclude_defaults=not defaults).items():
        if value is None or value == "" or value == [] or value == {}:
            continue
        text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
        parts.append(f"{key}={text if text and not any(c.isspace() for c in text) else repr(text)}")
    return " ".join(parts)
