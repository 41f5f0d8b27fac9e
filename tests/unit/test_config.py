"""Configuration: defaults from DESIGN.md, strict keys, environment overrides."""

import pytest

from treemail.adapters.config import MessagingConfig, load_config
from treemail.domain.errors import ConfigError

DESIGN_DEFAULTS = {
    "enabled": True,
    "max_hops": 0,
    "max_body_bytes": 32768,
    "max_pending_per_session": 32,
    "max_inflight_per_pair": 4,
}


def write(tmp_path, text: str | bytes):
    path = tmp_path / "treemail.toml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_defaults_equal_the_design_table():
    messaging = load_config(environ={}).messaging
    assert {key: getattr(messaging, key) for key in DESIGN_DEFAULTS} == DESIGN_DEFAULTS
    assert MessagingConfig() == messaging


def test_a_file_sets_values(tmp_path):
    path = write(tmp_path, "[messaging]\nmax_hops = 3\nenabled = false\n[service]\nprofile = 'durable'\n")
    config = load_config(path, environ={})
    assert config.messaging.max_hops == 3 and config.messaging.enabled is False
    assert config.service.profile == "durable"
    assert config.messaging.max_body_bytes == 32768


def test_the_config_path_may_come_from_the_environment(tmp_path):
    path = write(tmp_path, "[messaging]\nmax_hops = 2\n")
    assert load_config(environ={"TREEMAIL_CONFIG": str(path)}).messaging.max_hops == 2


@pytest.mark.parametrize("table", ["messaging", "service"])
def test_an_unknown_key_fails_naming_the_key(tmp_path, table):
    path = write(tmp_path, f"[{table}]\nmax_hopz = 3\n")
    with pytest.raises(ConfigError, match="max_hopz"):
        load_config(path, environ={})


def test_an_unknown_table_fails(tmp_path):
    with pytest.raises(ConfigError, match="mesaging"):
        load_config(write(tmp_path, "[mesaging]\nenabled = false\n"), environ={})


def test_an_invalid_value_fails_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match="max_body_bytes"):
        load_config(write(tmp_path, "[messaging]\nmax_body_bytes = -1\n"), environ={})


def test_invalid_toml_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[messaging\nenabled = ="), environ={})


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.toml", environ={})


def test_environment_overrides_the_file(tmp_path):
    path = write(tmp_path, "[messaging]\nmax_hops = 3\nmax_inflight_per_pair = 2\n")
    config = load_config(
        path,
        environ={
            "TREEMAIL_MESSAGING_MAX_HOPS": "7",
            "TREEMAIL_MESSAGING_ENABLED": "false",
            "TREEMAIL_SERVICE_PROFILE": "durable",
            "REDIS_URL": "redis://example:6379/0",
        },
    )
    assert config.messaging.max_hops == 7
    assert config.messaging.enabled is False
    assert config.messaging.max_inflight_per_pair == 2  # untouched keys keep the file's value
    assert config.service.profile == "durable"
    assert config.service.redis_url == "redis://example:6379/0"


def test_an_unknown_environment_key_fails_naming_it():
    with pytest.raises(ConfigError, match="max_hopz"):
        load_config(environ={"TREEMAIL_MESSAGING_MAX_HOPZ": "1"})


def test_an_invalid_environment_value_is_a_config_error():
    with pytest.raises(ConfigError, match="max_hops"):
        load_config(environ={"TREEMAIL_MESSAGING_MAX_HOPS": "many"})


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path):
    # TOML is UTF-8 by definition, whatever the machine's locale.
    with pytest.raises(ConfigError, match="TOML"):
        load_config(write(tmp_path, b"[messaging]\nmax_hops = 1 # \xff\xfe\n"), environ={})


def test_a_utf8_file_reads_the_same_under_any_locale(tmp_path):
    path = write(tmp_path, "# réglages — messagerie\n[messaging]\nmax_hops = 2\n")
    assert load_config(path, environ={}).messaging.max_hops == 2


def test_a_directory_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        load_config(tmp_path, environ={})


def test_a_table_that_is_not_a_table_is_a_config_error_even_with_overrides(tmp_path):
    path = write(tmp_path, "messaging = 5\n")
    with pytest.raises(ConfigError, match="messaging"):
        load_config(path, environ={})
    with pytest.raises(ConfigError, match="messaging"):
        load_config(path, environ={"TREEMAIL_MESSAGING_MAX_HOPS": "1"})


def test_commands_are_routed_by_tree_unless_told_by_sender_and_nothing_else():
    assert load_config(environ={}).service.route_commands_by == "tree"
    by_sender = load_config(environ={"TREEMAIL_SERVICE_ROUTE_COMMANDS_BY": "sender"})
    assert by_sender.service.route_commands_by == "sender"
    with pytest.raises(ConfigError, match="route_commands_by"):
        load_config(environ={"TREEMAIL_SERVICE_ROUTE_COMMANDS_BY": "recipient"})
