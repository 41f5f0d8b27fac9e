"""The W3C trace context a message carries (``traceparent``: ``00-<trace id>-<span id>-<flags>``). Pure.

Kept as the text the propagator wrote, so a reader of the streams needs no tracing library to tell which
trace a message belongs to.
"""


def trace_id(traceparent: str | None) -> str | None:
    """The trace id of a traceparent; None when there is none or it is malformed."""
    parts = (traceparent or "").split("-")
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None
