"""The source proof (sender identity): what the MAC covers, rotation, and where the keys come from."""

import pytest

from treemail.adapters.config import load_config
from treemail.adapters.proofkeys import ProofConfig, load_keyring
from treemail.domain import events as ev
from treemail.domain import proof
from treemail.domain.errors import ConfigError

K1 = proof.Keyring("k1", {"k1": b"first-secret-of-32-characters-00"})
RECIPIENT = "0190a000-0000-7000-8000-0000000000b1"


def message(**overrides) -> ev.ProducerMessageAccepted:
    fields = dict(
        at=12.5, message_id="m-1", producer_id="agent:s-1", owner="agent", sender_session_id="s-1",
        sender_handle="planner_0000a1a1", body="review cache.py", mode="steer", agent_hop=1, run_id="run-1",
        tool_call_id="call-1", return_address="s-1", principal="acme", peer="advisor", in_reply_to=None,
    )
    return ev.ProducerMessageAccepted(**{**fields, **overrides})


def test_a_signed_message_verifies_for_its_recipient_and_records_its_key_id():
    signed = proof.sign(message(), RECIPIENT, K1)
    assert signed.proof["key_id"] == "k1" and len(signed.proof["mac"]) == 64
    assert proof.verify(signed, RECIPIENT, K1) == "ok"


@pytest.mark.parametrize("field, value", [
    ("body", "review cache.py and pay"), ("sender_session_id", "s-2"), ("sender_handle", "evil_00000000"),
    ("return_address", "s-2"), ("run_id", "run-2"), ("tool_call_id", "call-2"), ("principal", "root"),
    ("peer", "admin"), ("in_reply_to", "m-0"), ("reply", True), ("message_id", "m-2"), ("mode", "queue"),
    ("agent_hop", 0), ("at", 13.0), ("owner", "plugin"), ("blocks", [{"type": "text", "text": "x"}]),
])
def test_altering_any_covered_field_after_signing_is_detected(field, value):
    signed = proof.sign(message(), RECIPIENT, K1)
    assert proof.verify(signed.model_copy(update={field: value}), RECIPIENT, K1) == "mismatch"


def test_a_message_replayed_into_another_recipients_stream_does_not_verify():
    assert proof.verify(proof.sign(message(), RECIPIENT, K1), "another-session", K1) == "mismatch"


def test_a_missing_or_malformed_proof_and_an_unknown_key_are_told_apart():
    assert proof.verify(message(), RECIPIENT, K1) == "missing"
    assert proof.verify(message(proof={"v": 1, "key_id": "k1"}), RECIPIENT, K1) == "missing"
    other = proof.Keyring("k9", {"k9": b"another-secret-of-32-characters!"})
    assert proof.verify(proof.sign(message(), RECIPIENT, other), RECIPIENT, K1) == "unknown_key"


def test_a_proof_forged_with_another_key_under_a_known_key_id_is_a_mismatch():
    forger = proof.Keyring("k1", {"k1": b"guessed-secret-of-32-characters!"})
    assert proof.verify(proof.sign(message(), RECIPIENT, forger), RECIPIENT, K1) == "mismatch"


def test_after_rotation_older_messages_verify_with_their_key_and_new_ones_are_signed_with_the_new_key():
    old = proof.sign(message(), RECIPIENT, K1)
    rotated = proof.Keyring("k2", {"k2": b"second-secret-of-32-characters-0", **K1.keys})
    assert proof.verify(old, RECIPIENT, rotated) == "ok"
    new = proof.sign(message(), RECIPIENT, rotated)
    assert new.proof["key_id"] == "k2" and proof.verify(new, RECIPIENT, rotated) == "ok"
    assert proof.verify(new, RECIPIENT, K1) == "unknown_key"


def test_only_agent_messages_are_signed_and_nothing_without_a_keyring():
    events = [message(), ev.SessionWakeRequested(message_id="m-1"), message(owner="plugin", sender_session_id=None)]
    signed = proof.sign_events(events, RECIPIENT, K1)
    assert [getattr(e, "proof", None) is not None for e in signed] == [True, False, False]
    assert proof.sign_events(events, RECIPIENT, None) == events


def test_the_proof_survives_the_stream_round_trip():
    signed = proof.sign(message(), RECIPIENT, K1)
    stored = ev.decode(*ev.encode(signed))
    assert proof.verify(stored, RECIPIENT, K1) == "ok"


# ---- the keyring: configuration or a secret file, never the streams ------------------------------------------


def test_a_key_file_gives_the_keyring_its_first_key_signing_unless_current_key_names_another(tmp_path):
    path = tmp_path / "proof.keys"
    path.write_text("# rotated 2025-06\nk2 second-secret-of-32-characters-0\nk1 first-secret-of-32-characters-00\n")
    keyring = load_keyring(load_config(environ={"TREEMAIL_PROOF_KEY_FILE": str(path)}).proof)
    assert keyring.current == "k2" and set(keyring.keys) == {"k1", "k2"}
    pinned = load_keyring(ProofConfig(key_file=str(path), current_key="k1"))
    assert pinned.current == "k1"


def test_without_any_key_proofs_are_off():
    assert load_keyring(ProofConfig()) is None


def test_an_inline_secret_never_shows_in_a_printed_configuration():
    config = ProofConfig(keys={"k1": "first-secret-of-32-characters-00"})
    assert "first-secret" not in repr(config) and "first-secret" not in str(config.model_dump())
    assert load_keyring(config).keys["k1"] == b"first-secret-of-32-characters-00"


@pytest.mark.parametrize("config, fragment", [
    (ProofConfig(keys={"k1": "short"}), "at least 16"),
    (ProofConfig(keys={"bad id": "first-secret-of-32-characters-00"}), "key id"),
    (ProofConfig(current_key="k1"), "no key is configured"),
    (ProofConfig(keys={"k1": "first-secret-of-32-characters-00"}, current_key="k2"), "not among"),
    (ProofConfig(key_file="/nonexistent/proof.keys"), "cannot be read"),
])
def test_a_keyring_that_cannot_be_used_fails_at_load_naming_the_problem(config, fragment):
    with pytest.raises(ConfigError, match=fragment):
        load_keyring(config)


def test_a_malformed_key_file_line_is_named(tmp_path):
    path = tmp_path / "proof.keys"
    path.write_text("k1\n")
    with pytest.raises(ConfigError, match="line 1"):
        load_keyring(ProofConfig(key_file=str(path)))
    path.write_bytes(b"k1 \xff\xfe-not-text\n")
    with pytest.raises(ConfigError, match=f"key_file {path} is not UTF-8 text"):
        load_keyring(ProofConfig(key_file=str(path)))
