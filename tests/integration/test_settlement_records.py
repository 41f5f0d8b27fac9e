"""A sender's records of its mail being processed, written in the same step as the processing: under
the sender's etag, while its own sends race to the same stream, so its per-source capacity stays exact."""

import asyncio
import collections

import pytest

from treemail.domain import events as ev
from treemail.domain.state import fold
from treemail.host import SendContext

from .conftest import live, running_stack

pytestmark = pytest.mark.cluster

CAPACITY = 6
MESSAGING = {"max_outstanding_per_source": CAPACITY, "max_inflight_per_pair": 0, "max_pending_per_session": 1000}


def code(result):
    return result.get("error", {}).get("code") or "ok"


def of_type(history, cls):
    return [e for _, e in history if isinstance(e, cls)]


async def test_settlements_racing_the_senders_own_sends_keep_its_capacity_exact(redis_url):
    async with running_stack(redis_url, workers=2, **MESSAGING) as host:
        root = await host.register_root("planner", "plans", rules={"child": "allow"}, status="running")
        kids = [await host.register_child(root.session_id, "explore", "reads", rules={"parent": "allow"},
                                          status="idle") for _ in range(CAPACITY)]
        await live(host, root)
        calls = iter(range(1000))

        async def send(kid):
            context = SendContext(root.session_id, "run-1", f"call-{next(calls)}")
            return code(await host.send_message(context, {"to": kid.handle, "body": "x", "mode": "queue"}))

        first = [await send(kid) for kid in kids]
        assert first == ["ok"] * CAPACITY and await send(kids[0]) == "send_message:source_capacity"
        await live(host, *kids)  # each run takes its pending message

        async def process(kid):
            [delivery] = await host.claim(kid.session_id, "run-1")
            await host.consume(kid.session_id, delivery.message_id)

        # Every settlement and every new send writes on the root's stream at once.
        racing = await asyncio.gather(*(process(kid) for kid in kids), *(send(kid) for kid in kids))
        during = collections.Counter(racing[CAPACITY:])
        assert set(during) <= {"ok", "send_message:source_capacity"}

        history = await host.history(root.session_id)
        sent, settled = of_type(history, ev.MessageSent), of_type(history, ev.MessageSettled)
        assert len(sent) == CAPACITY + during["ok"]
        assert sorted(s.outcome for s in settled) == ["consumed"] * CAPACITY
        assert {s.message_id for s in settled} <= {s.message_id for s in sent}
        outstanding = fold([e for _, e in history]).outstanding
        assert outstanding == during["ok"]
        # Exactly the free slots are left: no settlement was lost, none counted twice.
        after = [await send(kids[n % CAPACITY]) for n in range(CAPACITY - outstanding + 1)]
        assert after == ["ok"] * (CAPACITY - outstanding) + ["send_message:source_capacity"]
