"""The disposal cutoff under real concurrency: many senders race a disposal across worker processes,
with and without a worker killed by SIGKILL; every send ends in exactly one of the two allowed ways.

Accepted before the cutoff: then consumed by the recipient, or returned to its
sender as a notice (discarded on the recipient with the notice's id). Refused
after it: ``send_message:recipient_closing``, and no trace in the recipient's
mail. Never a third way.
"""

import asyncio
import collections
import os
import re
import signal

import pytest

from treemail.domain.errors import LifecycleError
from treemail.host import SendContext, Treemail

from .conftest import make_config, worker_processes

pytestmark = pytest.mark.cluster

SENDERS = 8
SENDS_EACH = 25
MESSAGING = {"max_pending_per_session": 100000, "max_inflight_per_pair": 0}


async def race(url: str, kill: bool = False):
    config = make_config(url, **MESSAGING)
    async with worker_processes(url, 3, **MESSAGING) as pool:
        host = await Treemail.connect(config, url)
        try:
            root = await host.register_root("planner", "x", rules={"child": "allow"})
            await host.start_run(root.session_id, "run-root")
            # One-shot: no next incarnation takes a send that loses the race (a continuable target's does).
            target = await host.register_child(root.session_id, "target", "disposed mid-race", status="running",
                                               continuable=False)
            await host.start_run(target.session_id, "run-t")
            peers = []
            for _ in range(SENDERS):
                peer = await host.register_child(root.session_id, "sender", "x", rules={"sibling": "allow"},
                                                 status="running")
                await host.start_run(peer.session_id, "run-1")
                peers.append(peer)
            results: dict[tuple[str, int], dict] = {}
            answered_at_dispose = []
            closed = asyncio.Event()

            async def sender(peer):
                # Each sender goes on past its SENDS_EACH until it has met the cutoff itself, so the disposal
                # lands among the sends however long it takes on a busy machine (bounded, should it never land).
                for n in range(SENDS_EACH * 40):
                    ctx = SendContext(peer.session_id, "run-1", f"call-{n}")
                    result = results[(peer.session_id, n)] = await host.send_message(
                        ctx, {"to": target.handle, "body": f"{peer.handle} #{n}"}
                    )
                    if n >= SENDS_EACH - 1 and "error" in result:
                        return
                    # Paced, so that the disposal lands among the sends however fast the workers decide.
                    await asyncio.sleep(0.01)

            async def recipient():
                """The target's host claims and acknowledges at its boundaries until the cutoff stops it."""
                while not closed.is_set():
                    try:
                        for delivery in await host.claim(target.session_id, "run-t"):
                            await host.consume(target.session_id, delivery.message_id)
                    except LifecycleError:
                        return
                    await asyncio.sleep(0.002)

            async def disposer():
                while len(results) < SENDERS * SENDS_EACH // 3:
                    await asyncio.sleep(0.001)
                answered_at_dispose.append(len(results))
                if kill:
                    os.kill(pool[0].pid, signal.SIGKILL)
                disposed = await host.disposal.dispose(target.session_id, "aborted")
                closed.set()
                return disposed

            *_, disposed = await asyncio.gather(*(sender(p) for p in peers), recipient(), disposer())
            histories = {s.session_id: await host.history(s.session_id) for s in (target, *peers)}
        finally:
            await host.close()
        if kill:
            assert pool[0].poll() == -9
    assert answered_at_dispose[0] < SENDERS * SENDS_EACH  # the disposal raced sends still in flight
    return target, peers, results, disposed, histories


def account(target, peers, results, disposed, histories):
    """Every send ends in exactly one of: consumed, returned as a notice, refused after the cutoff."""
    codes = collections.Counter(r.get("error", {}).get("code", "ok") for r in results.values())
    assert set(codes) <= {"ok", "send_message:recipient_closing"}, codes
    assert codes["ok"] and codes["send_message:recipient_closing"], codes

    events = [e for _, e in histories[target.session_id]]
    names = [type(e).__name__ for e in events]
    cutoff = names.index("SessionClosing")
    accepted = {e.message_id: e for e in events if type(e).__name__ == "ProducerMessageAccepted"}
    assert "ProducerMessageAccepted" not in names[cutoff:]
    assert names[names.index("SessionClosed") + 1:] == ["SessionSettled"]  # closed; then its parent was told
    ok_ids = {r["message_id"] for r in results.values() if "message_id" in r}
    assert ok_ids == set(accepted)  # accepted exactly when the sender was told so, once per tool call

    consumed = {e.message_id for e in events if type(e).__name__ == "ProducerMessageConsumed"}
    discarded = {e.message_id: e.reason for e in events if type(e).__name__ == "ProducerMessageDiscarded"}
    assert not consumed & set(discarded) and consumed | set(discarded) == ok_ids
    assert set(disposed.returned) == set(discarded)

    notices = {}
    for peer in peers:
        for _, e in histories[peer.session_id]:
            if type(e).__name__ == "ProducerMessageAccepted" and e.owner == "returned":
                notices[e.message_id] = (peer.session_id, e.body)
    for message_id, reason in discarded.items():
        [notice_id] = re.findall(r"returned to its sender as notice (\S+)$", reason)
        owner, body = notices.pop(notice_id)
        original = accepted[message_id]
        assert owner == original.sender_session_id and body.endswith(f"Your message was:\n\n{original.body}")
    assert notices == {}  # no notice for a message that was delivered or refused
    return codes


async def test_many_senders_racing_a_disposal_every_send_accounted_for(redis_url):
    codes = account(*await race(redis_url))
    assert codes["send_message:recipient_closing"] >= SENDERS  # every sender met the cutoff


@pytest.mark.slow
async def test_kill_9_of_a_worker_during_a_disposal_loses_no_send(redis_url):
    codes = account(*await race(redis_url, kill=True))
    assert codes["send_message:recipient_closing"] >= SENDERS  # every sender met the cutoff
