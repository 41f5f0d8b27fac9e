"""Phase 4d: typed backpressure. A steady producer faster than its consumer, honouring ``retry_after_ms``.

A parent sends to a running child at a steady pace faster than the child
consumes (one message a step boundary, a boundary every ``consume_every``
seconds). A refused send (``send_message:inbox_full``) is tried again, as a
new tool call, once its ``retry_after_ms`` has passed. Time is the
controllable clock's (``treemail.testing``), so the figures are about the
rule, not the machine: how often a retry made after ``retry_after_ms``
succeeds, how many retries each accepted message cost, and that nothing was
dropped silently (every attempt accepted or refused with a code, every
accepted message consumed).
"""

import random
from dataclasses import dataclass, field

from treemail.adapters.config import Config, MessagingConfig, ServiceConfig
from treemail.host import SendContext
from treemail.testing import TestStack

from .common import flush

PENDING_LIMIT = 4


@dataclass
class Flow:
    attempts: int = 0
    accepted: list[str] = field(default_factory=list)
    refused: list[dict] = field(default_factory=list)  # the structured errors, in order
    silent: int = 0  # an answer with neither a message id nor an error code
    retries: int = 0  # attempts made after a refusal's retry_after_ms
    retries_accepted: int = 0
    consumed: list[str] = field(default_factory=list)
    # Who sent to whom, and the tool call number of each refusal (its body is ``item <number>``).
    sender: str = ""
    to: str = ""
    refused_calls: list[int] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "attempts": self.attempts, "accepted": len(self.accepted), "refused": len(self.refused),
            "silent_drops": self.silent + len(set(self.accepted) - set(self.consumed)),
            "retries": self.retries, "retries_accepted": self.retries_accepted,
            "retry_success": self.retries_accepted / self.retries if self.retries else None,
            "retries_per_accepted": self.retries / len(self.accepted) if self.accepted else None,
            "retry_after_ms": sorted({e["retry_after_ms"] for e in self.refused}),
        }


async def producer_against_consumer(env: TestStack, seconds: float, produce_every: float,
                                    consume_every: float, jitter: float = 0.0) -> Flow:
    """Drive both on ``env``'s clock for ``seconds``, then let the consumer drain what was accepted.
    ``jitter``: each step boundary comes up to this fraction of ``consume_every`` early or late (seeded)."""
    steps = random.Random(7)
    tm = env.tm
    root = await tm.register_root("producer", "sends steadily", rules={"child": "allow"}, status="running")
    await tm.start_run(root.session_id, "run-p")
    child = await tm.register_child(root.session_id, "consumer", "reads slowly", rules={"parent": "allow"},
                                    status="running")
    await tm.start_run(child.session_id, "run-c")
    flow, held = Flow(sender=root.session_id, to=child.handle), []
    start = now = env.clock.now()
    next_send, next_step, retrying, call = now, now + consume_every, False, 0
    while True:
        producing = now - start < seconds
        if not producing and not held and len(flow.consumed) == len(flow.accepted):
            return flow
        if producing and next_send < next_step:  # the consumer goes first at a tie
            call += 1
            flow.attempts += 1
            answer = await tm.send_message(SendContext(root.session_id, "run-p", f"send-{call}"),
                                           {"to": child.handle, "body": f"item {call}"})
            flow.retries += retrying
            if "message_id" in answer:
                flow.accepted.append(answer["message_id"])
                flow.retries_accepted += retrying
                next_send, retrying = now + produce_every, False
            elif "code" in answer.get("error", {}):
                flow.refused.append(answer["error"])
                flow.refused_calls.append(call)
                next_send, retrying = now + answer["error"].get("retry_after_ms", 1000) / 1000, True
            else:
                flow.silent += 1
                next_send, retrying = now + produce_every, False
        else:
            # A step boundary: take what is due, read one message of it.
            held += [d.message_id for d in await tm.claim(child.session_id, "run-c")]
            if held:
                message_id = held.pop(0)
                await tm.consume(child.session_id, message_id)
                flow.consumed.append(message_id)
            next_step += consume_every * (1 + steps.uniform(-jitter, jitter))
        upcoming = min(next_send, next_step) if producing else next_step
        if upcoming > now:
            env.clock.advance(upcoming - now)
            now = upcoming


async def phase_backpressure(url: str, seconds: float, log) -> dict:
    await flush(url)
    config = Config(messaging=MessagingConfig(max_pending_per_session=PENDING_LIMIT, max_inflight_per_pair=0),
                    service=ServiceConfig(redis_url=url, command_streams=1, partitions=4))
    results = {}
    for name, jitter in (("steady", 0.0), ("jittered", 0.6)):
        async with TestStack.start(config=config, url=url) as env:
            flow = await producer_against_consumer(env, seconds, produce_every=0.2, consume_every=0.5, jitter=jitter)
        out = results[name] = flow.summary()
        log(f"  {name} consumer (a boundary every 0.5 s, ±{jitter:.0%}), producer every 0.2 s, {seconds:.0f} s: "
            f"{out['accepted']} accepted, {out['refused']} refused; retries after retry_after_ms succeeded "
            f"{out['retries_accepted']}/{out['retries']}, {out['retries_per_accepted']:.2f} retries per accepted "
            f"message, {out['silent_drops']} silent drops")
    return results
