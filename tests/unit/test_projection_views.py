"""Projections are folds: live (feed order, with overlaps) equals a rebuild (stream by stream)."""

from hypothesis import given, settings
from hypothesis import strategies as st

from treemail.projections.views import PROJECTIONS, fold_event, tree_summaries
from treemail.domain import events as ev

SESSIONS = ["s0", "s1", "s2", "s3"]
ROOT = "s0"


def registered(session_id: str) -> ev.SessionRegistered:
    return ev.SessionRegistered(
        session_id=session_id, root_session_id=ROOT, parent_session_id=None if session_id == ROOT else ROOT,
        agent_type="a", description="", handle=f"a_{session_id}", rules=[], send_message_tool=True, status="running",
    )


@st.composite
def histories(draw):
    """Per-session streams of plausible events, and one interleaving of them (the feed order)."""
    streams: dict[str, list[ev.Event]] = {s: [registered(s)] for s in SESSIONS}
    pending: dict[str, list[ev.ProducerMessageAccepted]] = {s: [] for s in SESSIONS}
    done: dict[str, list[ev.ProducerMessageAccepted]] = {s: [] for s in SESSIONS}
    order: list[str] = list(SESSIONS)
    for n in range(draw(st.integers(0, 60))):
        session = draw(st.sampled_from(SESSIONS))
        step = draw(st.sampled_from(["accept", "accept", "done", "restore", "wake", "run", "close", "unknown"]))
        if step == "accept":
            sender = draw(st.sampled_from(SESSIONS))
            # Notices (settlement, returned) are treemail's words: never counted as agent mail.
            owner = draw(st.sampled_from(["agent", "agent", "plugin", "settlement", "returned"]))
            event = ev.ProducerMessageAccepted(
                message_id=f"m{n}", producer_id="p", owner=owner,
                sender_session_id=sender if owner == "agent" else None, body="b", mode="steer",
            )
            pending[session].append(event)
        elif step == "done" and pending[session]:
            accepted = pending[session].pop(draw(st.integers(0, len(pending[session]) - 1)))
            cls = draw(st.sampled_from([ev.ProducerMessageConsumed, ev.ProducerMessageDiscarded]))
            event = cls(message_id=accepted.message_id, owner=accepted.owner,
                        sender_session_id=accepted.sender_session_id)
            done[session].append(accepted)
        elif step == "restore" and done[session]:
            # A revert undid a consumption: the message is pending again.
            accepted = done[session].pop(draw(st.integers(0, len(done[session]) - 1)))
            event = ev.ProducerMessageRestored(message_id=accepted.message_id, owner=accepted.owner,
                                               sender_session_id=accepted.sender_session_id, mode="steer",
                                               accepted_seq=1)
            pending[session].append(accepted)
        elif step == "wake":
            event = ev.SessionWakeRequested(message_id=None)
        elif step == "run":
            event = ev.SessionRunStarted(run_id=f"r{n}")
        elif step == "close":
            event = ev.SessionClosing(stop_reason="aborted")
        else:
            event = None  # a type this version does not know
        streams[session].append(event)
        order.append(session)
    return streams, order


def rebuild(streams):
    views = {name: {} for name in PROJECTIONS}
    for session, events in streams.items():
        for seq, event in enumerate(events, start=1):
            for name, projection in PROJECTIONS.items():
                fold_event(views[name], projection, session, seq, event)
    return views


def live(streams, order, replay_overlap: int):
    """Follow the feed in its interleaved order; re-deliver the first entries to mimic a resumed runner."""
    cursor = {s: 0 for s in streams}
    feed = []
    for session in order:
        cursor[session] += 1
        feed.append((session, cursor[session], streams[session][cursor[session] - 1]))
    views = {name: {} for name in PROJECTIONS}
    for session, seq, event in feed[:replay_overlap] + feed:
        for name, projection in PROJECTIONS.items():
            fold_event(views[name], projection, session, seq, event)
    return views


@settings(max_examples=200, deadline=None)
@given(histories(), st.integers(0, 30))
def test_live_processing_equals_rebuild(history, overlap):
    streams, order = history
    assert live(streams, order, overlap) == rebuild(streams)


@settings(max_examples=100, deadline=None)
@given(histories())
def test_inbox_and_pairs_count_pending_agent_mail_only(history):
    streams, _ = history
    views = rebuild(streams)
    for session, events in streams.items():
        accepted = {e.message_id: e for e in events if isinstance(e, ev.ProducerMessageAccepted) and e.owner == "agent"}
        latest = {e.message_id: e for e in events if isinstance(e, (ev.ProducerMessageConsumed,
                                                                    ev.ProducerMessageDiscarded,
                                                                    ev.ProducerMessageRestored))}
        done = {m for m, e in latest.items() if not isinstance(e, ev.ProducerMessageRestored)}
        pending = [e for m, e in accepted.items() if m not in done]
        assert int(views["inbox"].get(session, 0)) == len(pending)
        for sender in SESSIONS:
            expected = sum(1 for e in pending if e.sender_session_id == sender)
            assert int(views["pairs"].get(f"{sender}>{session}", 0)) == expected


def test_a_session_past_its_disposal_cutoff_is_owed_no_wake():
    streams = {"s1": [registered("s1"), ev.SessionWakeRequested(message_id="m"), ev.SessionClosing()],
               "s2": [registered("s2"), ev.SessionWakeRequested(message_id="n")]}
    owed = {k: v for k, v in rebuild(streams)["wakes"].items() if not k.startswith("seq:")}
    assert owed == {"s2": "n"}


def test_tree_summary_counts_sessions_and_mail():
    streams = {
        "s0": [registered("s0")],
        "s1": [registered("s1"),
               ev.ProducerMessageAccepted(message_id="m", producer_id="p", owner="goal", body="b", mode="queue"),
               ev.ProducerMessageConsumed(message_id="m", owner="goal")],
    }
    summary = tree_summaries(rebuild(streams)["trees"])
    assert summary == {ROOT: {"sessions": 2, "pending": 0, "accepted": 1, "done": 1}}


@settings(max_examples=100, deadline=None)
@given(histories(), st.integers(1, 7))
def test_folding_a_session_in_chunks_equals_folding_it_event_by_event(history, chunk):
    from treemail.projections.views import fold_stream

    streams, _ = history
    by_chunks = {name: {} for name in PROJECTIONS}
    for session, events in streams.items():
        numbered = list(enumerate(events, start=1))
        for start in range(0, len(numbered), chunk):
            for name in PROJECTIONS:
                fold = [(by_chunks[name], PROJECTIONS[name])]
                fold_stream(fold, session, numbered[start:start + chunk])
                fold_stream(fold, session, numbered[start:start + chunk])  # again: no effect
    assert by_chunks == rebuild(streams)


@settings(max_examples=100, deadline=None)
@given(histories(), st.data())
def test_folding_every_view_in_one_pass_from_a_generator_equals_folding_each_view_event_by_event(history, data):
    """The rebuild's fold (``fold_stream``: all views at once, events decoded one at a time) gives the live
    runner's views, also when some views already hold a longer prefix of a session than others."""
    from treemail.projections.views import fold_stream

    streams, _ = history
    views = {name: {} for name in PROJECTIONS}
    for session, events in streams.items():
        numbered = list(enumerate(events, start=1))
        for name in PROJECTIONS:  # each view starts at its own position in this session
            prefix = numbered[:data.draw(st.integers(0, len(numbered)))]
            fold_stream([(views[name], PROJECTIONS[name])], session, prefix)
        fold_stream([(views[name], PROJECTIONS[name]) for name in PROJECTIONS], session, iter(numbered))
    assert views == rebuild(streams)


def one_of_each_event_type() -> list[ev.Event]:
    """A sample of every event type, so a new type cannot be forgotten here (the test below checks)."""
    message = dict(message_id="m", owner="agent", sender_session_id="s1", run_id="r")
    return [
        registered("s1"),
        ev.SessionStatusChanged(status="idle"),
        ev.ProducerRegistered(producer_id="p", owner="agent", sender_session_id="s1"),
        ev.ProducerMessageAccepted(message_id="m", producer_id="p", owner="agent", sender_session_id="s1",
                                   body="b", mode="steer"),
        ev.SessionRunStarted(run_id="r"),
        ev.SessionRunFinished(run_id="r"),
        ev.SessionRunRenewed(run_id="r"),
        ev.RunStepReported(run_id="r", step=2),
        ev.SessionWakeRequested(message_id="m"),
        ev.ProducerMessageAdmitted(**message),
        ev.ProducerMessageClaimed(**message),
        ev.ProducerMessageReleased(**message),
        ev.ProducerMessageConsumed(**message),
        ev.ProducerMessageDiscarded(**message),
        ev.ApprovalRequested(request_id="q", key="k", fingerprint="f", sender_session_id="s1", sender_handle="h",
                             recipient_session_id="s2", recipient_handle="h2", label="sibling", body="b",
                             mode="steer"),
        ev.ApprovalGranted(request_id="q", key="k", scope="tree", label="sibling"),
        ev.ApprovalDenied(request_id="q", key="k"),
        # interrupt_agent, revert and fork, the overlay, delivery as an obligation
        ev.SessionInterruptRequested(interrupt_id="i", run_id="r", sender_session_id="s0", sender_handle="h0"),
        ev.SessionReverted(to_position=1, from_position=3),
        ev.ProducerMessageRestored(**message, mode="steer", accepted_seq=2),
        ev.SessionForked(source_session_id="s2", at_position=1),
        ev.MessageRulesOverlaid(rules=[("sibling", "deny")]),
        ev.ProducerMessageParked(**message, reason="max_attempts"),
        ev.ProducerMessageRetried(**message),
        ev.ProducerMessageStranded(**message, reason="closed_for_good"),
        ev.ProducerMessageSteerFellBack(**message, reason="deadline"),
        ev.MessageSent(message_id="m", recipient_session_id="s2", position=3, recipient_state="running"),
        ev.MessageSettled(message_id="m", recipient_session_id="s2", outcome="consumed"),
        ev.MessageRefused(message_id="m", recipient_session_id="s2", code="send_message:inbox_full"),
        # peer routes and grants
        ev.PeerRouteRegistered(source_kind="session", source="s0", name="advisor"),
        ev.PeerRouteRevoked(source_kind="session", source="s0", name="advisor"),
        ev.PeerGrantSet(source_kind="agent_type", source="planner", send=True, principal="acme"),
        # peer mail as an outbox
        ev.PeerIntentStored(message_id="m", destination_session_id="s2", peer="advisor", principal="acme",
                            body="hi", mode="steer"),
        ev.PeerAttemptStarted(message_id="m", attempt=1),
        ev.PeerAttemptFailed(message_id="m", attempt=1, reason="send_message:inbox_full", retry_at=2.0),
        ev.PeerDeliveryParked(message_id="m", reason="attempts"),
        ev.PeerDeliveryRetried(message_id="m"),
        # disposal, settlement notices, draining, installed tools
        ev.SessionClosing(stop_reason="aborted", closing_text="bye"),
        ev.SessionClosed(),
        ev.SessionResumed(),
        ev.SessionSettled(run_id="r", stop_reason="completed", notice="queued", message_id="m"),
        ev.SessionAnnounced(run_id="r"),
        ev.SessionDrainStarted(by="s1"),
        ev.SessionDrainLifted(by="s1"),
        ev.ToolsInstalled(tools=["inspect_message"]),
        # Whole subtrees.
        ev.SubtreeBroadcastStarted(broadcast_id="b1", run_id="r1", body="hi", recipients=["s2"]),
        ev.SubtreeBroadcastDelivered(broadcast_id="b1", accepted={"s2": "m1"}),
        ev.SubtreeStopStarted(stop_id="x1", how="dispose", order=["s2", "s1"]),
        ev.SessionSealed(stop_id="x1"),
        ev.MessageCancelAnswered(message_id="m", outcome="cancelled"),
    ]


def test_a_projection_changes_only_for_the_event_types_it_declares():
    """Live and rebuilt views fold only declared types: an undeclared type that mattered would differ."""
    from treemail.domain.events import EVENT_TYPES

    samples = one_of_each_event_type()
    assert {type(e) for e in samples} == set(EVENT_TYPES.values()), "add the new event type to the samples"
    for projection in PROJECTIONS.values():
        for event in samples:
            view = {"root:s1": ROOT, "s1": "3", "s1>s1": "3", f"{ROOT}:pending": "3"}
            before = dict(view)
            projection.apply(view, "s1", event)
            if type(event) not in projection.reads:
                assert view == before, f"{projection.name} reads {type(event).__name__} but does not declare it"
