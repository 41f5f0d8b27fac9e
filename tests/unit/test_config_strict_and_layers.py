"""Configuration, the [messaging] table: strict TOML types, environment parsed as the key's type, layered files."""

import pytest

from treemail.adapters.config import load_config, load_effective, show_config
from treemail.domain.errors import ConfigError


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---- "every key takes only its own TOML type" ------------------------------------------------


@pytest.mark.parametrize(
    "line, key",
    [
        ('max_body_bytes = "32768"', "max_body_bytes"),
        ('enabled = "false"', "enabled"),
        ("enabled = 1", "enabled"),
        ("max_hops = 2.0", "max_hops"),
        ("max_inflight_per_pair = true", "max_inflight_per_pair"),
        ("max_pending_per_session = 3.5", "max_pending_per_session"),
    ],
)
def test_messaging_keys_take_only_their_own_toml_type_and_fail_at_load_naming_the_key(tmp_path, line, key):
    path = write(tmp_path, "t.toml", f"[messaging]\n{line}\n")
    with pytest.raises(ConfigError, match=f"`messaging.{key}`") as caught:
        load_config(path, environ={})
    assert str(path) in str(caught.value)


@pytest.mark.parametrize(
    "line, key",
    [('partitions = "16"', "partitions"), ('cluster = "true"', "cluster"), ("cluster = 0", "cluster"),
     ("batch_size = 10.0", "batch_size"), ("decision_timeout_s = true", "decision_timeout_s"),
     ("redis_url = 6379", "redis_url"), ("profile = 1", "profile")],
)
def test_service_keys_take_only_their_own_toml_type(tmp_path, line, key):
    with pytest.raises(ConfigError, match=f"`service.{key}`"):
        load_config(write(tmp_path, "t.toml", f"[service]\n{line}\n"), environ={})


def test_an_integer_is_a_valid_float(tmp_path):
    path = write(tmp_path, "t.toml", "[service]\ndecision_timeout_s = 30\n")
    assert load_config(path, environ={}).service.decision_timeout_s == 30.0


@pytest.mark.parametrize(
    "variable, value",
    [("TREEMAIL_MESSAGING_ENABLED", "1"), ("TREEMAIL_MESSAGING_ENABLED", "yes"),
     ("TREEMAIL_MESSAGING_MAX_HOPS", "2.0"), ("TREEMAIL_MESSAGING_MAX_BODY_BYTES", "true"),
     ("TREEMAIL_MESSAGING_MAX_INFLIGHT_PER_PAIR", "four"), ("TREEMAIL_SERVICE_CLUSTER", "on"),
     ("TREEMAIL_SERVICE_DECISION_TIMEOUT_S", "false")],
)
def test_environment_overrides_are_parsed_as_the_keys_type_and_fail_naming_the_variable(variable, value):
    with pytest.raises(ConfigError, match=variable):
        load_config(environ={variable: value})


def test_environment_overrides_of_the_right_type_load():
    config = load_config(environ={
        "TREEMAIL_MESSAGING_ENABLED": "false", "TREEMAIL_MESSAGING_MAX_HOPS": "-1",
        "TREEMAIL_MESSAGING_MAX_BODY_BYTES": "32_768", "TREEMAIL_SERVICE_DECISION_TIMEOUT_S": "2.5",
        "TREEMAIL_SERVICE_CLUSTER": "true", "TREEMAIL_SERVICE_PROFILE": "durable", "REDIS_URL": "redis://h:1/0",
    })
    assert (config.messaging.enabled, config.messaging.max_hops, config.messaging.max_body_bytes) == (False, -1, 32768)
    assert (config.service.decision_timeout_s, config.service.cluster, config.service.profile) == (2.5, True, "durable")
    assert config.service.redis_url == "redis://h:1/0"


# ---- layered files: "a [messaging] table in a higher layer replaces the lower table whole" ------


def test_a_table_in_a_higher_layer_replaces_the_lower_table_whole(tmp_path):
    system = write(tmp_path, "system.toml", "[messaging]\nmax_hops = 3\nmax_body_bytes = 100\n[service]\nbatch_size = 7\n")
    user = write(tmp_path, "user.toml", "[messaging]\nenabled = false\n")
    config = load_config(paths=[system, user], environ={})
    assert config.messaging.enabled is False
    # omitted keys take the built-in defaults, not the lower layer's values
    assert (config.messaging.max_hops, config.messaging.max_body_bytes) == (0, 32768)
    # a table the higher layer does not have stays the lower layer's
    assert config.service.batch_size == 7


def test_treemail_config_names_several_layers_separated_by_colons(tmp_path):
    low = write(tmp_path, "low.toml", "[messaging]\nmax_hops = 3\n")
    high = write(tmp_path, "high.toml", "[messaging]\nmax_hops = 5\n")
    assert load_config(environ={"TREEMAIL_CONFIG": f"{low}:{high}"}).messaging.max_hops == 5
    assert load_config(environ={"TREEMAIL_CONFIG": f"{high}:{low}"}).messaging.max_hops == 3


def test_default_layers_are_system_user_and_workspace_files_each_skipped_when_absent(tmp_path, monkeypatch):
    home = tmp_path / "xdg"
    (home / "treemail").mkdir(parents=True)
    write(home / "treemail", "treemail.toml", "[messaging]\nmax_hops = 4\n[service]\nbatch_size = 9\n")
    workspace = tmp_path / "work"
    workspace.mkdir()
    write(workspace, "treemail.toml", "[messaging]\nmax_hops = 6\n")
    monkeypatch.chdir(workspace)
    effective = load_effective(environ={"XDG_CONFIG_HOME": str(home)})
    assert effective.config.messaging.max_hops == 6 and effective.config.service.batch_size == 9
    assert effective.table_sources["messaging"].startswith("workspace config file")
    assert effective.table_sources["service"].startswith("user config file")
    assert effective.searched[0].startswith("system config file /etc/treemail/treemail.toml")


def test_every_layer_must_be_valid_even_one_a_higher_layer_replaces(tmp_path):
    broken = write(tmp_path, "low.toml", "[messaging]\nmax_hopz = 3\n")
    fine = write(tmp_path, "high.toml", "[messaging]\nmax_hops = 1\n")
    with pytest.raises(ConfigError, match="max_hopz"):
        load_config(paths=[broken, fine], environ={})


def test_a_named_layer_that_is_missing_fails(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(paths=[tmp_path / "absent.toml"], environ={})


def test_environment_overrides_apply_key_by_key_on_top_of_the_layers(tmp_path):
    user = write(tmp_path, "user.toml", "[messaging]\nmax_hops = 3\nmax_inflight_per_pair = 2\n")
    config = load_config(paths=[user], environ={"TREEMAIL_MESSAGING_MAX_HOPS": "8"})
    assert (config.messaging.max_hops, config.messaging.max_inflight_per_pair) == (8, 2)


def test_config_show_prints_the_configuration_in_force_and_where_each_table_came_from(tmp_path):
    low = write(tmp_path, "low.toml", '[service]\nredis_url = "redis://:hunter2@h:6379/0"\n')
    high = write(tmp_path, "high.toml", "[messaging]\nenabled = false\n")
    text = show_config(paths=[low, high], environ={"TREEMAIL_MESSAGING_MAX_HOPS": "2"})
    assert f"[messaging]  # from config file {high}" in text
    assert f"[service]  # from config file {low}" in text
    assert "enabled = false" in text and "max_body_bytes = 32768" in text
    assert "max_hops = 2  # environment TREEMAIL_MESSAGING_MAX_HOPS" in text
    assert "hunter2" not in text and 'redis_url = "redis://:***@h:6379/0"' in text
    import tomllib

    assert tomllib.loads(text)["messaging"]["enabled"] is False  # what it prints is TOML


# ---- the [proof] table from the environment: "TREEMAIL_PROOF_<KEY>" --------------------------


def test_the_proof_keyring_can_be_set_from_the_environment_and_config_show_masks_it():
    from treemail.adapters.proofkeys import load_keyring

    environ = {"TREEMAIL_PROOF_KEYS": '{"2025-06": "0123456789abcdef0123", "2025-01": "fedcba9876543210fedc"}',
               "TREEMAIL_PROOF_CURRENT_KEY": "2025-06"}
    keyring = load_keyring(load_config(environ=environ).proof)
    assert keyring.current == "2025-06"
    assert keyring.keys == {"2025-06": b"0123456789abcdef0123", "2025-01": b"fedcba9876543210fedc"}
    text = show_config(environ=environ)
    assert "0123456789abcdef0123" not in text
    assert 'current_key = "2025-06"  # environment TREEMAIL_PROOF_CURRENT_KEY' in text
    assert 'keys = { "2025-06" = "***", "2025-01" = "***" }  # environment TREEMAIL_PROOF_KEYS' in text


def test_a_proof_key_file_can_be_named_by_the_environment(tmp_path):
    assert load_config(environ={"TREEMAIL_PROOF_KEY_FILE": str(tmp_path / "k")}).proof.key_file == str(tmp_path / "k")


@pytest.mark.parametrize("value", ["nope", '["2025-06"]', '{"2025-06": 7}'])
def test_proof_keys_from_the_environment_that_are_not_a_json_object_of_secrets_fail_naming_the_variable(value):
    with pytest.raises(ConfigError, match="TREEMAIL_PROOF_KEYS"):
        load_config(environ={"TREEMAIL_PROOF_KEYS": value})
