"""The scripted delegation tree `treemail demo` plays through the real stack.

A toy engine runs scripted agents, but every send, claim, wake and
acknowledgement goes through treemail. Each scenario checks its own outcome
and stops the demo with the reason when it did not happen, so a transcript
never claims what the stack did not do; when the configuration makes a
scenario impossible (the hop guard off), it says so instead of pretending.
"""

import asyncio
from dataclasses import dataclass, field

from treemail.adapters import keys
from treemail.adapters.viewstore import load_view
from treemail.host import SendContext, Treemail
from treemail.projections.render import history_row
from treemail.projections.views import tree_summaries

from .demo_settlement import demo_settlement
from .scenarios import ScenarioFailed, expect



def say(line: str = "") -> None:
    print(line, flush=True)


@dataclass
class Story:
    """What the script leaves for the reader to try next."""

    handles: dict[str, str] = field(default_factory=dict)
    approval_id: str | None = None
    waiting_send: asyncio.Task | None = None
    # Set when the demo stops: the waiting send is then answered engine_shutdown, which is not news.
    closing: bool = False


class ScriptedEngine:
    def __init__(self, host: Treemail) -> None:
        self.host = host
        self.calls = 0
        self.runs: dict[str, str] = {}
        self.steps: dict[str, int] = {}

    def ctx(self, session) -> SendContext:
        self.calls += 1
        return SendContext(session.session_id, self.runs.get(session.session_id, "no-run"), f"call-{self.calls}")

    async def start(self, session) -> None:
        self.runs[session.session_id] = f"run-{session.handle}-{self.calls}"
        await self.host.start_run(session.session_id, self.runs[session.session_id])

    async def finish(self, session, status: str = "idle") -> None:
        await self.host.finish_run(session.session_id, self.runs.pop(session.session_id))
        if status != "idle":
            await self.host.set_status(session.session_id, status)
        say(f"  [{session.handle} is {status}]")

    async def send(self, sender, to: str, body: str, mode: str = "steer", quiet=lambda: False) -> dict:
        result = await self.host.send_message(self.ctx(sender), {"to": to, "body": body, "mode": mode})
        if quiet():
            return result
        outcome = result["error"]["code"] if "error" in result else f"accepted, recipient {result['recipient_state']}"
        say(f"  {sender.handle} -> {to} ({mode}): {body!r}\n      => {outcome}")
        return result

    async def boundary(self, session) -> int:
        """A safe model-request boundary: claim, show, consume. Returns how many messages it saw.

        Each boundary is the run's next step, reported with the claim and the consume (the mailbox
        timeline shows what each step saw); tokens are the toy engine's estimate, four characters each."""
        run_id = self.runs[session.session_id]
        self.steps[run_id] = step = self.steps.get(run_id, 0) + 1
        deliveries = await self.host.claim(session.session_id, run_id, step=step)
        for delivery in deliveries:
            say(f"  [{session.handle} sees at its next model request]")
            say("    " + delivery.text.replace("\n", "\n    "))
            await self.host.consume(session.session_id, delivery.message_id, step=step,
                                    tokens=len(delivery.text) // 4)
        return len(deliveries)

    async def serve_one_wake(self, by_id: dict) -> bool:
        for wake in await self.host.wakes("demo-runner", block_ms=5000):
            session = by_id[wake.session_id]
            self.runs[session.session_id] = f"run-{session.handle}-{self.calls}"
            if await self.host.wake_run(wake, self.runs[session.session_id]):
                say(f"  [wake: {session.handle} starts a new run with its mail as input]")
                return True
        return False


async def play(host: Treemail, hop_guard: str | None, story: Story, server, partitions: int) -> Story:
    """``hop_guard``: None when the workers stop storms, else why scenario 5 cannot be shown. ``server``: a
    connection for what the demo reads below the host API (the projection views), over ``partitions``."""
    engine = ScriptedEngine(host)
    root = await host.register_root("planner", "splits the task", rules={"child": "allow"})
    await engine.start(root)
    peers = {"parent": "allow", "sibling": "allow"}
    a = await host.register_child(root.session_id, "explore", "reads the code", rules=peers)
    b = await host.register_child(root.session_id, "review", "reviews changes", rules=peers)
    by_id = {s.session_id: s for s in (root, a, b)}
    story.handles = {"root": root.handle, "explore": a.handle}
    say(f"{root.handle} delegates {a.handle} and {b.handle}")
    await engine.start(a)
    await engine.start(b)

    say("\n1. a child reports mid-run; the parent sees it at its next boundary (steer)")
    sent = await engine.send(a, root.handle, "Found it: the cache is never invalidated.")
    expect(sent.get("recipient_state") == "running", "1", f"the running parent should take it, got {sent}")
    expect(await engine.boundary(root) == 1, "1", "the parent saw nothing at its boundary")

    say("\n2. the parent queues a follow-up; it waits for the child's next turn")
    sent = await engine.send(root, a.handle, "When you are done, write the fix up as a patch.", mode="queue")
    expect("message_id" in sent, "2", f"the follow-up was refused: {sent}")
    expect(await engine.boundary(a) == 0, "2", "queued mail reached the current run")
    await engine.finish(a)
    expect(await engine.serve_one_wake(by_id), "2", "no wake for the idle child with mail")
    expect(await engine.boundary(a) == 1, "2", "the new run did not get the follow-up")

    say("\n3. the parent introduces the siblings; they talk directly")
    await engine.send(root, b.handle, f"{a.handle} has a patch for you to review.")
    expect(await engine.boundary(b) == 1, "3", "the introduction did not arrive")
    sent = await engine.send(b, a.handle, "Send me the patch, please.")
    expect("message_id" in sent, "3", f"a sibling could not write to a sibling: {sent}")
    expect(await engine.boundary(a) == 1, "3", "the sibling's message did not arrive")

    say("\n4. a finished child is woken by mail")
    await engine.finish(a, status="finished")
    sent = await engine.send(root, a.handle, "One more thing: add a test for the fix.")
    expect(sent.get("recipient_state") == "waking_finished", "4", f"expected a wake, got {sent}")
    expect(await engine.serve_one_wake(by_id), "4", "the finished child was not woken")
    expect(await engine.boundary(a) == 1, "4", "the woken run did not get the mail")

    await _storm(engine, a, b, hop_guard)

    say("\n6. the recipient's durable history (`treemail history` prints the same rows)")
    for seq, event in await host.history(a.session_id):
        say(f"  {history_row(seq, event)}")

    say("\n7. a send under an `ask` rule waits for a person")
    c = await host.register_child(root.session_id, "writer", "drafts the release note", rules={"parent": "ask"})
    await engine.start(c)
    request = "May I publish the release note? It lists the three fixes and thanks the two new contributors by name."
    story.waiting_send = asyncio.create_task(engine.send(c, root.handle, request, quiet=lambda: story.closing))
    story.approval_id = await _approval_appears(host, story.waiting_send, c.handle)
    say(f"  {c.handle} -> {root.handle}: waiting for a person, request {story.approval_id}")

    say("\n8. the projection worker's view of the tree (`treemail trees`)")
    summary = await _tree_summary(server, keys.partition_of(root.session_id, partitions), root.session_id,
                                  sessions=4)
    say(f"  {root.session_id}: {summary['sessions']} sessions, {summary['accepted']} messages accepted, "
        f"{summary['done']} done, {summary['pending']} pending")

    await demo_settlement(host, say, first=9)  # its own small tree: how a child's life ends (settlement, disposal)
    return story


async def _storm(engine: ScriptedEngine, a, b, hop_guard: str | None) -> None:
    say("\n5. two agents start a ping-pong storm; the hop guard stops it")
    if hop_guard is not None and hop_guard.startswith("off:"):
        say(f"  skipped: {hop_guard[4:]}")
        return
    if hop_guard is not None:
        say(f"  note: {hop_guard}, so the storm may run on")
    sender, receiver = a, b
    for turn in range(10):
        result = await engine.send(sender, receiver.handle, f"ping {turn}, your turn")
        if "error" in result:
            expect(result["error"]["code"] == "send_message:max_hops_exceeded", "5", f"unexpected {result}")
            return
        await engine.boundary(receiver)
        sender, receiver = receiver, sender
    expect(hop_guard is not None, "5", "ten turns and the hop guard never stopped the storm")
    say("  not stopped: other workers decided these sends (see the note above)")


async def _approval_appears(host: Treemail, send: asyncio.Task, sender: str, timeout_s: float = 15.0) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        waiting = [r for r in await host.permissions.pending_approvals() if r["sender_handle"] == sender]
        if waiting:
            return waiting[0]["request_id"]
        expect(not send.done(), "7", f"the send did not wait for a person: {send.done() and send.result()}")
        await asyncio.sleep(0.05)
    raise ScenarioFailed("scenario 7: no approval request appeared")


async def _tree_summary(server, partition: int, root_id: str, sessions: int, timeout_s: float = 15.0) -> dict:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    summary: dict = {}
    while loop.time() < deadline:
        view, _ = await load_view(server, partition, "trees")
        summary = tree_summaries(view).get(root_id, {})
        if summary.get("sessions") == sessions:
            return summary
        await asyncio.sleep(0.1)
    raise ScenarioFailed(f"scenario 8: the projection worker did not show the tree's {sessions} sessions "
                         f"within {timeout_s:g} s (it shows {summary or 'nothing'})")
