"""tracing.span with tracing off: nothing is made for a span that only stands for the current context."""

import pytest
from opentelemetry import context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from treemail.adapters import tracing

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def tracing_off(monkeypatch):
    monkeypatch.setattr(tracing, "enabled", lambda: False)


def test_a_span_without_parent_makes_nothing_and_the_current_context_stays(tracing_off, monkeypatch):
    monkeypatch.setattr(tracing, "tracer", lambda: pytest.fail("no span is made with tracing off"))
    token = context.attach(TraceContextTextMapPropagator().extract({"traceparent": PARENT}))
    try:
        with tracing.span("treemail.prepare", sender_session_id="s-1"):
            assert tracing.traceparent() == PARENT  # what the command carries, as before
    finally:
        context.detach(token)


def test_a_span_with_a_parent_still_makes_that_parent_current(tracing_off):
    assert tracing.traceparent() == ""
    with tracing.span("treemail.claim", PARENT, message_id="m-1"):
        assert tracing.traceparent().split("-")[1] == PARENT.split("-")[1]
    assert tracing.traceparent() == ""
