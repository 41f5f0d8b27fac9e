"""What a run of send decisions stores, byte for byte: the commit script's whole arguments for each.

Sends chained as a worker's batch chains them (each decided on the states the one before left): to an idle
recipient (its wake), to the same one again (no second wake, its pair's next number), to a running one,
a body with non-ASCII text and control characters, a queued send, and a refusal the recipient's append
records. Any change to how the send path builds, folds or encodes its events, snapshots, items and records
(a faster representation of them, say) must leave these bytes as they are, or change the checked-in file on
purpose (``TREEMAIL_UPDATE_GOLDEN=1``) beside a protocol note."""

import json
import os
from pathlib import Path

import pytest

from treemail.adapters.config import ServiceConfig
from treemail.adapters.eventstore import EventStore
from treemail.adapters.statecache import Loaded
from treemail.domain import state as st
from treemail.domain.commands import SendArguments, SendContext, SendMessage
from treemail.domain.commitplan import Idempotency, plan_commit
from treemail.domain.decide import idempotency
from treemail.domain.decide.guards import Found
from treemail.domain.decide.send import Accepted, Refused, SendGiven, decide_send, outcome_of

from .builders import config, registered, run_started, session_record

GOLDEN = Path(__file__).parent / "golden" / "send_bytes.json"
ROOT = "0190a000-0000-7000-8000-0000000000a1"
KIDS = ("0190a000-0000-7000-8000-0000000000b1", "0190a000-0000-7000-8000-0000000000b2")
# (recipient, body, mode): the recipient's index in KIDS.
SENDS = [
    (0, "first message", "steer"),
    (0, "second message, same pair", "steer"),
    (1, "to a running child: é ü 漢字 \u2028 \x01\t\"quoted\" \\ 😀", "steer"),
    (1, "queued for the next run", "queue"),
    (0, "x" * 300, "steer"),  # over the inbox cap below: a refusal recorded with the recipient's append
]


def _form(value):
    """An argument as JSON can hold it: bytes as hex (headers, ids in binary), the rest as they are."""
    return {"hex": value.hex()} if isinstance(value, bytes) else value


def _decisions(monkeypatch) -> list:
    monkeypatch.setattr(os, "urandom", lambda n: b"\x07" * n)  # the etags: fixed, so the bytes are
    root = session_record(ROOT, agent_type="plan")
    kids = [session_record(kid, root=ROOT, parent=ROOT, agent_type="explore") for kid in KIDS]
    records = {r.session_id: r for r in (root, *kids)}
    loaded = {ROOT: Loaded(st.fold([registered(root), run_started()]), 2, "e-root"),
              KIDS[0]: Loaded(st.fold([registered(kids[0], "idle")]), 1, "e-kid0"),
              KIDS[1]: Loaded(st.fold([registered(kids[1], "running")]), 1, "e-kid1")}
    cfg = config(max_pending_per_session=2)
    store = EventStore(None, ServiceConfig())
    out = []
    for n, (kid, body, mode) in enumerate(SENDS):
        recipient, sender = kids[kid], loaded[ROOT]
        command = SendMessage(f"cmd-{n}", SendContext(ROOT, "run-1", f"call-{n}"),
                              SendArguments(recipient.handle, body, mode), "client-1")
        target = loaded[recipient.session_id]
        new_id = f"0190b000-0000-7000-8000-{n:012d}"
        decision = decide_send(command, SendGiven(
            sender=root, sender_state=sender.state, sender_version=sender.version,
            target=Found(recipient, target.state), target_version=target.version, config=cfg,
            new_id=new_id, now=1_733_474_400.125 + n))
        assert isinstance(decision, Accepted | Refused)
        digest = idempotency.key_digest(command.context)
        kept = Idempotency(ROOT, digest, idempotency.record(command.arguments, outcome_of(decision)))
        plan = plan_commit(recipient, target.state, target.version, decision.events, policy=cfg,
                           now=1_733_474_400.125 + n, sources=decision.sources, idempotency=kept,
                           read_draining=False, new_mail=(new_id,),
                           folded=decision.state_after if isinstance(decision, Accepted) else None)
        prepared = store.prepare(plan, target, held=loaded)
        loaded[recipient.session_id] = prepared.loaded
        loaded.update(prepared.sources)
        out.append({"outcome": outcome_of(decision), "keys": prepared.keys,
                    "args": [_form(arg) for arg in prepared.args]})
    assert records  # every session above took part
    return out


def test_the_send_path_stores_the_same_bytes(monkeypatch):
    decided = _decisions(monkeypatch)
    assert [("ok" in d["outcome"]) for d in decided] == [True, True, True, True, False]
    if os.environ.get("TREEMAIL_UPDATE_GOLDEN"):
        GOLDEN.write_text(json.dumps(decided, indent=1, ensure_ascii=False) + "\n")
        pytest.skip("wrote the golden file")
    assert decided == json.loads(GOLDEN.read_text())
