"""The replicated profile's keys: how many replicas must confirm an append, and for how long to wait."""

import pytest

from treemail.adapters.config import load_config
from treemail.adapters.eventstore import EventStore
from treemail.adapters.config import ServiceConfig
from treemail.domain.errors import ConfigError


def test_the_replicated_profile_waits_for_one_replica_for_two_seconds_by_default(tmp_path):
    path = tmp_path / "treemail.toml"
    path.write_text("[service]\nprofile = 'replicated'\n")
    service = load_config(path, environ={}).service
    assert (service.profile, service.min_replicas, service.replica_timeout_ms) == ("replicated", 1, 2000)


def test_the_environment_sets_the_replicas_and_their_timeout():
    service = load_config(environ={"TREEMAIL_SERVICE_PROFILE": "replicated", "TREEMAIL_SERVICE_MIN_REPLICAS": "2",
                                   "TREEMAIL_SERVICE_REPLICA_TIMEOUT_MS": "750"}).service
    assert (service.profile, service.min_replicas, service.replica_timeout_ms) == ("replicated", 2, 750)


@pytest.mark.parametrize("line, key", [("min_replicas = 0", "min_replicas"), ("min_replicas = '1'", "min_replicas"),
                                       ("replica_timeout_ms = 0", "replica_timeout_ms"),
                                       ("profile = 'replicas'", "profile")])
def test_a_wrong_replicated_setting_fails_and_names_its_key(tmp_path, line, key):
    path = tmp_path / "treemail.toml"
    path.write_text(f"[service]\n{line}\n")
    with pytest.raises(ConfigError, match=f"service.{key}"):
        load_config(path, environ={})


def test_an_answer_waits_for_the_replicas_so_no_append_carries_it():
    assert not EventStore(None, ServiceConfig(profile="replicated")).answers_in_commit
