"""Property-based fuzzing of the model-facing boundary.

Whatever a model (or a broken host) hands over, parse_arguments answers with
SendArguments or the one stable invalid_arguments code, and decide_send on
anything that parsed answers with a Decision: neither ever raises anything else.
"""

import json

from hypothesis import given, settings
from hypothesis import strategies as some

from treemail.producers.tools.send_message import parse_arguments
from treemail.domain.errors import Code, Rejected
from treemail.domain.commands import SendArguments, SendContext
from treemail.domain.commands import SendMessage
from treemail.domain.decide.guards import NoSuchHandle, NoSuchSession
from treemail.domain.decide.send import Accepted, AwaitsApproval, Refused, SendGiven, decide_send
from treemail.domain.records import Peer
from treemail.domain.state import INITIAL

from .builders import accepted, claimed, config, found, registered, run_started, tree

T = tree()

scalars = some.none() | some.booleans() | some.integers() | some.floats() | some.text() | some.binary()
json_like = some.recursive(
    scalars,
    lambda inner: some.lists(inner, max_size=4) | some.dictionaries(some.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
key = some.sampled_from(["to", "body", "mode", "recipient_session_id"]) | some.text(max_size=10)
value = some.sampled_from(["steer", "queue", "explore_1a2b3c4d", ""]) | json_like
argument_dicts = some.dictionaries(key, value, max_size=5)
near_valid = some.fixed_dictionaries(
    {"to": some.text(max_size=40), "body": some.text(max_size=80)},
    optional={"mode": some.sampled_from(["steer", "queue"]) | value},
)
# JSON text can carry what hypothesis' text() never draws: lone surrogates via \u escapes.
escapes = some.sampled_from(["\\ud800", "\\udfff", "\\u0000", "\\u00e9", "\\ud83d\\ude42", "\\\\", '\\"'])
json_texts = some.builds(
    lambda to, body: '{"to": "%s", "body": "%s"}' % (to, body),
    some.lists(escapes | some.sampled_from("ab_1"), max_size=4).map("".join),
    some.lists(escapes | some.sampled_from("xy "), max_size=6).map("".join),
)
anything = (
    argument_dicts
    | near_valid
    | json_like
    | some.text()
    | some.binary()
    | json_texts
    | argument_dicts.map(lambda d: json.dumps(d, default=repr))
)


def parse_or_none(raw) -> SendArguments | None:
    try:
        return parse_arguments(raw)
    except Rejected as rejection:
        # A well-formed call with a blank body is the one parse failure that is not invalid_arguments.
        assert rejection.code in (Code.INVALID_ARGUMENTS, Code.INVALID_BODY)
        if rejection.code is Code.INVALID_BODY:
            assert isinstance(raw, (dict, str, bytes, bytearray))
        return None


@settings(max_examples=300, deadline=None)
@given(anything)
def test_parse_arguments_returns_arguments_or_invalid_arguments(raw):
    parsed = parse_or_none(raw)
    if parsed is not None:
        assert isinstance(parsed.to, str) and parsed.to and parsed.to == parsed.to.strip()
        assert isinstance(parsed.body, str)
        assert parsed.mode in ("steer", "queue")


@settings(max_examples=200, deadline=None)
@given(argument_dicts.map(lambda d: json.dumps(d, default=repr)))
def test_json_text_parses_like_the_object_it_encodes(text):
    try:
        expected = parse_arguments(json.loads(text))
    except Rejected:
        expected = None
    assert parse_or_none(text) == expected


def test_deeply_nested_json_text_is_invalid_arguments_not_a_crash():
    assert parse_or_none("[" * 100_000) is None
    assert parse_or_none('{"to": ' + "[" * 100_000) is None


targets = some.sampled_from(
    [
        found(T.child),
        found(T.sibling, registered(T.sibling, status="idle")),
        found(T.root, registered(T.root), run_started("r"), claimed("x", T.sibling, "r", hop=3)),
        found(T.child, registered(T.child), *(accepted(f"m{i}", T.root) for i in range(4))),
        found(T.stranger),
        NoSuchSession("0190a000-0000-7000-8000-00000000dead"),
        NoSuchHandle("nobody_00000000", [Peer(T.child, "running")]),
    ]
)
senders = some.sampled_from(
    [
        T.root,
        T.child,
        T.with_rules("grandchild", [("sibling", "ask"), ("parent", "deny"), ("*", "allow")]).grandchild,
        None,
    ]
)
configs = some.builds(
    config,
    enabled=some.booleans(),
    max_hops=some.integers(-2, 4),
    max_body_bytes=some.integers(0, 64),
    max_pending_per_session=some.integers(0, 5),
    max_inflight_per_pair=some.integers(0, 5),
)
grants = some.frozensets(some.sampled_from(["parent", "child", "sibling", "*"]))


@settings(max_examples=300, deadline=None)
@given(
    raw=json_texts | near_valid | anything,
    sender=senders,
    target=targets,
    cfg=configs,
    tree_grants=grants,
)
def test_decide_send_on_any_parsed_arguments_returns_a_decision(raw, sender, target, cfg, tree_grants):
    arguments = parse_or_none(raw)
    if arguments is None:
        return
    sender_state = found(sender).state if sender else INITIAL
    command = SendMessage("c", SendContext(sender.session_id if sender else "s", "run-1", "call-1"), arguments, "r")
    given = SendGiven(sender, sender_state, target, cfg, tree_grants=tree_grants, new_id="m-1")
    decision = decide_send(command, given)
    assert isinstance(decision, (Accepted, Refused, AwaitsApproval))
    if isinstance(decision, Accepted):
        for event in decision.events:
            event.model_dump_json()  # what is decided can be stored


@settings(max_examples=200, deadline=None)
@given(raw=json_texts, cfg=configs)
def test_decide_send_on_json_escaped_text_returns_a_decision(raw, cfg):
    """The text path draws escapes (lone surrogates, NUL) that dict strategies never produce."""
    arguments = parse_or_none(raw)
    if arguments is None:
        return
    command = SendMessage("c", SendContext(T.root.session_id, "run-1", "call-1"), arguments, "r")
    given = SendGiven(T.root, found(T.root).state, found(T.child), cfg.model_copy(update={"enabled": True}), new_id="m-1")
    decision = decide_send(command, given)
    assert isinstance(decision, (Accepted, Refused, AwaitsApproval))
    if isinstance(decision, Accepted):
        for event in decision.events:
            event.model_dump_json()
