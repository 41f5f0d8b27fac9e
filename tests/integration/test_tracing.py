"""OpenTelemetry: one message's journey (prepare, admit, claim, release by the pump, consume) is one
trace, read back with the SDK's in-memory exporter; off by default."""

import asyncio

import pytest

from treemail.adapters import tracing
from treemail.domain import events as ev

from .conftest import live, running_stack, timed_stack


def test_tracing_is_off_unless_an_exporter_is_named():
    assert tracing.configure_from_env({}) is False
    assert tracing.configure_from_env({"OTEL_TRACES_EXPORTER": "none"}) is False
    assert tracing.configure_from_env({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}) is False


async def test_one_message_is_one_trace_from_preparation_to_consumption(redis_url, calls, exporter):
    async with timed_stack(redis_url, backoff_initial_s=0, backoff_max_s=0) as env:
        host = env.tm
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x", rules={"parent": "allow"}, status="running")
        await live(host, root, child)  # only a session's open run may send (exact live sender)
        exporter.clear()
        sent = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "traced"})
        [delivery] = await host.claim(child.session_id, "run-1")
        await env.advance(env.config.messaging.attempt_timeout_s)  # the claim timed out: the pump releases it
        [again] = await host.claim(child.session_id, "run-1")
        await host.consume(child.session_id, again.message_id)
        history = await host.history(child.session_id)

    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("treemail.")]
    by_name = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    [prepare] = by_name["treemail.prepare"]
    [admit] = by_name["treemail.admit"]
    assert [s.name for s in spans if s.context.trace_id != prepare.context.trace_id] == []
    assert admit.parent.span_id == prepare.context.span_id
    assert admit.attributes["treemail.message_id"] == sent["message_id"]
    assert len(by_name["treemail.claim"]) == 2
    assert [s.attributes["treemail.reason"] for s in by_name["treemail.release"]] == ["attempt_timeout"]
    assert len(by_name["treemail.consume"]) == 1
    # The context is recorded on the message itself: any later process continues the same trace.
    [accepted] = [e for _, e in history if isinstance(e, ev.ProducerMessageAccepted)]
    assert accepted.traceparent.split("-")[1] == format(prepare.context.trace_id, "032x")
    assert delivery.message_id == sent["message_id"]


async def test_a_peer_send_and_each_of_its_admission_attempts_are_one_trace(redis_url, calls, exporter):
    async with running_stack(redis_url) as host:  # the host makes the first attempt itself
        planner = await host.register_root("planner", "x", rules={})
        advisor = await host.register_root("advisor", "y", rules={}, status="idle")
        await host.peers.register_route("advisor", advisor.session_id, source_session_id=planner.session_id)
        await host.peers.set_grant(advisor.session_id, source_session_id=planner.session_id, send=True)
        await live(host, planner)
        exporter.clear()
        sent = await host.peers.send(calls.ctx(planner.session_id), {"peer": "advisor", "body": "traced"})
        [intent] = [e for _, e in await host.history(planner.session_id) if isinstance(e, ev.PeerIntentStored)]

    spans = {s.name: s for s in exporter.get_finished_spans() if s.name.startswith("treemail.peer.")}
    prepare, admit = spans["treemail.peer.prepare"], spans["treemail.peer.admit"]
    assert admit.context.trace_id == prepare.context.trace_id and intent.traceparent
    assert admit.attributes["treemail.message_id"] == sent["message_id"]
    assert (admit.attributes["treemail.attempt"], admit.attributes["treemail.outcome"]) == (1, "accepted")


async def test_a_causal_chain_across_a_tree_and_a_peer_route_is_one_trace(redis_url, calls, exporter):
    """parent -> child -> grandchild -> peer: each message is sent by a run that consumed the one before, so
    each continues its cause's trace; the peer's copy keeps its sender's trace through outbox and admission.
    What the deliveries and inspect report is the history's own record of it."""
    async with running_stack(redis_url) as host:
        root = await host.register_root("planner", "x", rules={"child": "allow"})
        child = await host.register_child(root.session_id, "explore", "x", rules={"parent": "allow", "child": "allow"},
                                          status="running")
        grand = await host.register_child(child.session_id, "worker", "x", rules={"parent": "allow"},
                                          status="running")
        advisor = await host.register_root("advisor", "y", rules={})
        await host.peers.register_route("advisor", advisor.session_id, source_session_id=grand.session_id)
        await host.peers.set_grant(advisor.session_id, source_session_id=grand.session_id, send=True)
        await live(host, root, child, grand, advisor)
        exporter.clear()

        first = await host.send_message(calls.ctx(root.session_id), {"to": child.handle, "body": "split the work"})
        [to_child] = await host.claim(child.session_id, "run-1")
        await host.consume(child.session_id, to_child.message_id)
        second = await host.send_message(calls.ctx(child.session_id), {"to": grand.handle, "body": "do part 1"})
        [to_grand] = await host.claim(grand.session_id, "run-1", step=1)
        await host.consume(grand.session_id, to_grand.message_id, step=1)
        third = await host.peers.send(calls.ctx(grand.session_id), {"peer": "advisor", "body": "is part 1 right?"})
        to_peer = []
        for _ in range(2400):  # the host's own first attempt admits it; the pump would retry otherwise (within 120 s)
            if to_peer := await host.claim(advisor.session_id, "run-1"):
                break
            await asyncio.sleep(0.05)
        [to_peer] = to_peer
        await host.consume(advisor.session_id, to_peer.message_id)
        status = await host.obligations.inspect(second["message_id"])
        peer_status = await host.obligations.inspect(third["message_id"])

    spans = [s for s in exporter.get_finished_spans() if s.name.startswith("treemail.")]
    traces = {format(s.context.trace_id, "032x") for s in spans}
    assert len(traces) == 1, sorted({(s.name, format(s.context.trace_id, "032x")) for s in spans})
    [trace] = traces
    names = {s.name for s in spans}
    assert {"treemail.prepare", "treemail.admit", "treemail.claim", "treemail.consume", "treemail.peer.prepare",
            "treemail.peer.admit"} <= names
    # Three roots would be three traces: only the first send starts one.
    assert [s.name for s in spans if s.parent is None] == ["treemail.prepare"]
    # Each delivery carries what the history knows of it.
    assert [d.trace_id for d in (to_child, to_grand, to_peer)] == [trace] * 3
    assert [d.message_id for d in (to_child, to_grand, to_peer)] == [
        first["message_id"], second["message_id"], third["message_id"]]
    assert [(d.caused_by, d.chain_id) for d in (to_child, to_grand, to_peer)] == [
        (None, first["message_id"]), (first["message_id"], first["message_id"]),
        (second["message_id"], first["message_id"])]
    assert [d.sequence for d in (to_child, to_grand, to_peer)] == [1, 1, 1]
    assert to_grand.traceparent.split("-")[1] == trace
    receipt = status["receipt"]
    assert (receipt["sequence"], receipt["caused_by"], receipt["chain_id"], receipt["trace_id"]) == (
        1, first["message_id"], first["message_id"], trace)
    # Peer mail, once admitted: its receipt came back from the destination, and the destination's record says the same.
    receipt = peer_status["receipt"]
    assert (receipt["caused_by"], receipt["chain_id"], receipt["trace_id"]) == (
        second["message_id"], first["message_id"], trace)
