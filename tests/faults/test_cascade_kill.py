"""Faults: a host process killed (-9) in the middle of a cascading stop of a deep and wide subtree, while another
process registers children under its sessions and sends them mail. After the stop is run again, no session is
left open under a closed one, every registration was either refused ``lifecycle:parent_stopped`` or stopped
with the subtree, and every message accepted in the subtree ended (consumed, or discarded with its reason)."""

import asyncio
import collections
import random
import signal

import pytest

from tests.integration.conftest import running_stack
from treemail.domain import events as ev
from treemail.domain.errors import LifecycleError
from treemail.host import SendContext

from .hostkill import run_host

RULES = {"*": "allow"}
FANOUT = (3, 3, 2)  # 3 + 9 + 18 sessions below the lead
# Before which append the stopping host dies: at the start of the seals, among them, and (None) among the
# disposals: past one seal per session the subtree has when it starts, with room for the children that join
# while it starts (one registration every 0.1 s), and well before its end (each disposal appends at least twice).
KILL_BEFORE = (3, 25, None)
LATE_ROOM = 40


async def build(tm, lead) -> dict[str, str]:
    """The lead's subtree, each session with its parent; each continuable and idle."""
    parents: dict[str, str] = {}
    level = [lead.session_id]
    for width in FANOUT:
        below = []
        for parent in level:
            for _ in range(width):
                child = await tm.register_child(parent, "worker", "works", rules=RULES, status="idle")
                parents[child.session_id] = parent
                below.append(child.session_id)
        level = below
    return parents


async def one_trial(tm, url: str, appends: int | None, rng: random.Random) -> collections.Counter:
    lead = await tm.register_root("lead", "leads", rules=RULES, status="running")
    await tm.start_run(lead.session_id, "run-1")
    parents = await build(tm, lead)
    late: dict[str, str] = {}  # registered during the stop: session -> parent
    refused = collections.Counter()
    sent = []
    stopping = asyncio.Event()

    async def register_and_send() -> None:
        """Another process's work under the subtree: new children under its deepest sessions, and mail."""
        n = 0
        while not stopping.is_set():
            parent = rng.choice(list(parents))
            try:
                child = await tm.register_child(parent, "late", "joins late", rules=RULES, status="idle")
                late[child.session_id] = parent
            except LifecycleError as error:
                refused[error.code] += 1
            to = rng.choice(list(parents) + list(late))
            result = await tm.send_message(SendContext(lead.session_id, "run-1", f"call-{n}"),
                                           {"to": to, "body": f"#{n}", "mode": "queue"})
            sent.append(result)
            n += 1
            await asyncio.sleep(0.1)

    work = asyncio.create_task(register_and_send())
    await asyncio.sleep(0.3)  # some late children before the stop starts
    if appends is None:
        appends = 1 + 1 + len(parents) + len(late) + LATE_ROOM  # the stop's record, then a seal each
    died = await run_host(url, "stop", lead.session_id, "stop-1", appends) == -signal.SIGKILL
    # Where the cascade was cut: sessions sealed, and closed, when the host died.
    cut = collections.Counter()
    known = [lead.session_id, *parents, *late]
    for session in known:
        names = {type(e).__name__ for _, e in await tm.history(session)}
        cut.update(sealed="SessionSealed" in names, closed="SessionClosed" in names)
    await asyncio.sleep(0.2)  # and more while the cut stop stands
    # The restart: the same stop again, which completes it (sealing what joined since).
    await tm.disposal.stop_subtree(lead.session_id, "dispose", idempotency_key="stop-1")
    stopping.set()
    await work

    everyone = {lead.session_id: None, **parents, **late}
    states = {}
    for session, parent in everyone.items():
        history = [e for _, e in await tm.history(session)]
        names = [type(e).__name__ for e in history]
        states[session] = names
        assert "SessionSealed" in names and "SessionClosed" in names, (session, names[-6:])
        assert "SessionResumed" not in names[names.index("SessionSealed"):], session
        # Every message accepted for it ended: consumed, or discarded with its reason (returned or set aside).
        accepted = {e.message_id for e in history if isinstance(e, ev.ProducerMessageAccepted)}
        ended = {e.message_id: e for e in history
                 if isinstance(e, ev.ProducerMessageConsumed | ev.ProducerMessageDiscarded)}
        assert accepted <= set(ended), (session, accepted - set(ended))
        assert all(e.reason for e in ended.values() if isinstance(e, ev.ProducerMessageDiscarded))
    # A refused registration refused for the one reason, and sends to the stopped subtree refused as closed.
    assert set(refused) <= {"lifecycle:parent_stopped"}, refused
    codes = collections.Counter("ok" if "message_id" in r else r["error"]["code"] for r in sent)
    # (the lead is in the subtree: once the stop reached it, its own sends are refused as a closing sender's,
    # then as from a run the close ended)
    assert set(codes) <= {"ok", "send_message:recipient_closing", "send_message:sender_closing",
                          "send_message:sender_not_live"}, codes
    return collections.Counter(died=died, late=len(late), refused=refused["lifecycle:parent_stopped"],
                               sessions=len(everyone), accepted=codes["ok"],
                               cut_among_seals=0 < cut["sealed"] < len(known),
                               cut_among_disposals=0 < cut["closed"] < len(known))


@pytest.mark.slow
@pytest.mark.expected_duration_s(25)
async def test_kill_9_mid_cascade_leaves_no_child_open_under_a_stopped_parent(redis_url):
    rng = random.Random(20261206)
    totals = collections.Counter()
    async with running_stack(redis_url, workers=2, max_inflight_per_pair=0) as tm:
        for appends in KILL_BEFORE:
            totals += await one_trial(tm, redis_url, appends, rng)
    print(f"\nkill -9 mid-cascade: {dict(totals)}")
    assert totals["died"] == len(KILL_BEFORE)  # each stopping host died part-way
    assert totals["late"] > 0 and totals["refused"] > 0  # registrations joined before the seal, and were refused after
    assert totals["cut_among_seals"] and totals["cut_among_disposals"]  # the kills cut the cascade part-way
