"""Settlement notices and disposal for `make run`: a child finishing with a settlement notice reaching its
parent, and a send to a disposed session refused, with its unread mail handed back to the sender.

``demo_settlement(host)`` plays it on its own small tree through the real
stack (the workers decide every send); the demo script calls it.
"""

from collections.abc import Callable

from treemail.host import SendContext, Treemail

from .scenarios import expect


async def demo_settlement(host: Treemail, say: Callable[[str], None] = print, first: int = 9) -> None:
    """Scenarios ``first`` and ``first + 1``; each checks its own outcome (``ScenarioFailed`` if not)."""
    settled, disposed_n = str(first), str(first + 1)
    root = await host.register_root("lead", "coordinates the audit", rules={"child": "allow"})
    worker = await host.register_child(root.session_id, "audit", "audits one module", rules={"parent": "allow"},
                                       status="running")
    # One-shot: once disposed, no next incarnation takes mail (a continuable child is resumed by it).
    helper = await host.register_child(root.session_id, "notes", "keeps notes", rules={"parent": "allow"},
                                       status="running", continuable=False)
    await host.start_run(root.session_id, "run-lead")
    for child in (worker, helper):
        await host.start_run(child.session_id, "run-1")
    guidance = await host.permissions.return_guidance(worker.session_id)
    say(f"{root.handle} delegates {worker.handle} and {helper.handle}; {worker.handle}'s first prompt ends with:")
    say(f"    {guidance}")

    say(f"\n{settled}. {worker.handle} finishes; treemail, not the child, tells its parent (a settlement notice)")
    await _send(host, say, root, "run-lead", "c-1", worker.handle, "Audit cache.py and report.")
    for delivery in await host.claim(worker.session_id, "run-1"):
        await host.consume(worker.session_id, delivery.message_id)
    gate = await host.finish_run(worker.session_id, "run-1", "completed", "cache.py: 2 stale-read bugs, patch ready.")
    say(f"  [{worker.handle} finished: stop reason completed; notice {gate} into {root.handle}'s running turn]")
    notices = []
    for delivery in await host.claim(root.session_id, "run-lead"):
        say(f"  [{root.handle} sees at its next model request]")
        say("    " + delivery.text.replace("\n", "\n    "))
        notices += [delivery] if delivery.owner == "settlement" else []
        await host.consume(root.session_id, delivery.message_id)
    expect(len(notices) == 1 and "2 stale-read bugs" in notices[0].text, settled,
           "the parent did not get the child's settlement notice with its closing text")

    say(f"\n{disposed_n}. {helper.handle} is disposed with a message unread; sends after the cutoff are refused")
    await _send(host, say, root, "run-lead", "c-2", helper.handle, "Write the summary.", mode="queue")
    disposed = await host.disposal.dispose(helper.session_id, "aborted")
    say(f"  [{helper.handle} disposed: {len(disposed.returned)} unread message returned; notice {disposed.settlement}]")
    refused = await _send(host, say, root, "run-lead", "c-3", helper.handle, "Are you still there?")
    expect(refused.get("error", {}).get("code") == "send_message:recipient_closing", disposed_n,
           f"a send to the disposed session was not refused as recipient_closing: {refused}")
    for delivery in await host.claim(root.session_id, "run-lead"):
        say(f"  [{root.handle} sees at its next model request]")
        say("    " + delivery.text.replace("\n", "\n    "))
        await host.consume(root.session_id, delivery.message_id)


async def _send(host: Treemail, say, sender, run_id: str, call: str, to: str, body: str, mode: str = "steer") -> dict:
    result = await host.send_message(SendContext(sender.session_id, run_id, call), {"to": to, "body": body, "mode": mode})
    outcome = result["error"]["code"] if "error" in result else f"accepted, recipient {result['recipient_state']}"
    say(f"  {sender.handle} -> {to} ({mode}): {body!r}\n      => {outcome}")
    return result
