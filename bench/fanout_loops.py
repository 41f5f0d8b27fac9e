"""Phase 10: loop detection on a wide fan-out/fan-in tree, and on a real ping-pong.

A parent hands a task to each of its children; every child reports to the parent, round after round, and
the parent answers each report with the same acknowledgement (the loop rule must not mistake a report
with new figures answered by a fixed acknowledgement for a loop). Each recipient claims and consumes
its mail before it answers, as an engine would, so every answer joins the chain of the task. The figure
that matters is the number of false refusals (``send_message:loop_detected`` on mail with new content):
it should be 0. Then two children acknowledge each other with near-duplicates until they are stopped:
the messages it took, and the notices their parent got (one).
"""

import time

from treemail.host import SendContext, Treemail

from .common import Workers, bench_config, flush, percentile

CHILDREN = 100
LOOP = "send_message:loop_detected"


class _Talk:
    def __init__(self, host: Treemail) -> None:
        self.host = host
        self.calls = 0

    async def send(self, sender, recipient, body: str) -> dict:
        """``sender`` sends from its run; ``recipient`` claims and consumes it in its own."""
        self.calls += 1
        outcome = await self.host.send_message(
            SendContext(sender.session_id, f"run-{sender.session_id}", f"call-{self.calls}"),
            {"to": recipient.handle, "body": body})
        if "message_id" in outcome:
            for delivery in await self.host.claim(recipient.session_id, f"run-{recipient.session_id}"):
                await self.host.consume(recipient.session_id, delivery.message_id)
        return outcome


async def phase_fanout_loops(url: str, rounds: int, log) -> dict:
    await flush(url)
    workers = Workers(url)
    host = await Treemail.connect(bench_config(url), url)
    try:
        workers.start(2)
        talk = _Talk(host)
        root = await host.register_root("planner", "bench", rules={"*": "allow"})
        await host.start_run(root.session_id, f"run-{root.session_id}")
        children = []
        for i in range(CHILDREN):
            child = await host.register_child(root.session_id, "shard", f"shard {i}", rules={"*": "allow"})
            await host.start_run(child.session_id, f"run-{child.session_id}")
            children.append(child)
            await talk.send(root, child, f"Count the rows of shard {i} and report after each batch.")
        sends = refusals = other_errors = 0
        timings: list[float] = []
        for round_ in range(rounds):
            for i, child in enumerate(children):
                for sender, recipient, body in (
                        (child, root, f"shard {i}, batch {round_}: {1000 * i + 37 * round_ + 11} rows, "
                                      f"{round_ * 3 + i % 7} malformed"),
                        (root, child, "Thanks, continue with the next batch.")):
                    started = time.perf_counter()
                    outcome = await talk.send(sender, recipient, body)
                    timings.append(time.perf_counter() - started)
                    sends += 1
                    code = outcome.get("error", {}).get("code")
                    refusals += code == LOOP
                    other_errors += code is not None and code != LOOP
        # A real loop: two children acknowledge each other until they are stopped.
        a, b = children[0], children[1]
        await talk.send(a, b, "Can you confirm the shard boundaries?")
        messages = 0
        for _ in range(20):
            messages += 1
            sent = await talk.send(b, a, "Confirmed, thanks!")
            if sent.get("error", {}).get("code") == LOOP:
                break
            messages += 1
            sent = await talk.send(a, b, "Thanks, confirmed!")
            if sent.get("error", {}).get("code") == LOOP:
                break
        notices = [e for _, e in await host.history(root.session_id)
                   if type(e).__name__ == "ProducerMessageAccepted" and e.owner == "loop"]
        workers.check_alive()
    finally:
        await host.close()
        workers.stop()
    out = {"children": CHILDREN, "rounds": rounds, "sends": sends, "false_refusals": refusals,
           "other_errors": other_errors, "p50_ms": percentile(timings, 50) * 1000,
           "p99_ms": percentile(timings, 99) * 1000, "loop_stopped_after_messages": messages,
           "ancestor_notices": len(notices)}
    log(f"  {sends:,} sends over {CHILDREN} children x {rounds} rounds: {refusals} false refusals, "
        f"{other_errors} other errors; a ping-pong stopped after {messages} messages, {len(notices)} notice(s)")
    return out
