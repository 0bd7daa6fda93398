"""The topic registry: Kafka's naming rule, validation, persistence, config overrides."""
import json
import os

import pytest

from odradek.actors.names import placement
from odradek.coordinator.topics import TopicRegistry, check_topic_name
from odradek.core.protocol import ErrorCode, OdradekError

DEFAULTS = {"retention.ms": 604800000, "segment.bytes": 1073741824}


def registry(tmp_path, **kw):
    return TopicRegistry(str(tmp_path / "meta" / "topics.json"), DEFAULTS, **kw)


@pytest.mark.parametrize("name", ["a", "orders.v1", "A_b-c.9", "x" * 249, "__consumer_offsets"])
def test_legal_topic_names_are_accepted(name):
    check_topic_name(name)


@pytest.mark.parametrize("name, words", [
    ("", "non-empty"), (".", "cannot be '.'"), ("..", "cannot be '..'"), ("x" * 250, "limit is 249"),
    ("a b", "' '"), ("é", "'é'"), ("a/b", "'/'"), (None, "non-empty"),
])
def test_illegal_topic_names_are_refused_with_the_reason(name, words):
    with pytest.raises(OdradekError) as err:
        check_topic_name(name)
    assert err.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION and words in err.value.message


def test_created_topics_survive_a_reload_with_their_overrides(tmp_path):
    r = registry(tmp_path, default_partitions=3)
    t = r.create("orders", configs={"retention.ms": "1000"})
    assert t.partitions == 3 and t.configs == {"retention.ms": 1000}
    again = registry(tmp_path)
    assert again.get("orders").topic_id == t.topic_id and again.version == r.version == 1
    assert again.log_config("orders").retention_ms == 1000
    assert again.log_config("orders").segment_bytes == 1073741824


@pytest.mark.parametrize("kwargs, code", [
    ({"partitions": 0}, ErrorCode.INVALID_PARTITIONS),
    ({"partitions": "3"}, ErrorCode.INVALID_PARTITIONS),
    ({"replication_factor": 3}, ErrorCode.INVALID_REPLICATION_FACTOR),
    ({"configs": {"retention.mss": 1}}, ErrorCode.INVALID_CONFIG),
    ({"configs": {"cleanup.policy": "shred"}}, ErrorCode.INVALID_CONFIG),
])
def test_invalid_creates_are_refused_and_change_nothing(tmp_path, kwargs, code):
    r = registry(tmp_path)
    with pytest.raises(OdradekError) as err:
        r.create("t", **kwargs)
    assert err.value.code == code
    assert r.topics == {} and r.version == 0 and not os.path.exists(r.path)


def test_creating_an_existing_topic_is_refused(tmp_path):
    r = registry(tmp_path)
    r.create("t")
    with pytest.raises(OdradekError) as err:
        r.create("t")
    assert err.value.code == ErrorCode.TOPIC_ALREADY_EXISTS


def test_alter_configs_is_all_or_nothing_and_delete_restores_the_default(tmp_path):
    r = registry(tmp_path)
    r.create("t", configs={"retention.ms": 5000})
    with pytest.raises(OdradekError):
        r.alter_configs("t", [{"name": "segment.bytes", "value": "2048"}, {"name": "retention.ms", "value": "x"}])
    assert r.get("t").configs == {"retention.ms": 5000}
    r.alter_configs("t", [{"name": "retention.ms", "op": "delete"}, {"name": "cleanup.policy", "value": "compact"}])
    assert r.get("t").configs == {"cleanup.policy": "compact"}
    assert {c["name"]: c["source"] for c in r.effective_configs("t")}["cleanup.policy"] == "topic"


def test_deleting_an_unknown_topic_says_so(tmp_path):
    with pytest.raises(OdradekError) as err:
        registry(tmp_path).delete("ghost")
    assert err.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and "ghost" in err.value.message


def test_a_corrupt_metadata_file_stops_start_up_with_a_clear_message(tmp_path):
    path = tmp_path / "meta" / "topics.json"
    path.parent.mkdir()
    path.write_text("{not json")
    with pytest.raises(OdradekError) as err:
        registry(tmp_path)
    assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR and "unreadable" in err.value.message


def test_the_metadata_file_is_replaced_atomically(tmp_path):
    r = registry(tmp_path)
    r.create("a")
    r.create("b")
    assert not os.path.exists(r.path + ".tmp")
    assert {t["name"] for t in json.load(open(r.path))["topics"]} == {"a", "b"}


def test_placement_is_stable_and_spreads_a_topics_partitions():
    hosts = [placement("orders", p, 4) for p in range(8)]
    assert hosts == [placement("orders", p, 4) for p in range(8)]
    assert sorted(set(hosts)) == [0, 1, 2, 3]


@pytest.mark.parametrize("name", ["abc\n", "abc\r\n", "\nabc", "a\nb"])
def test_a_name_with_a_newline_anywhere_is_refused(name):
    with pytest.raises(OdradekError) as err:
        check_topic_name(name)
    assert err.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION and "\\n" in err.value.message


def test_a_metadata_write_that_fails_changes_nothing_and_says_storage_error(tmp_path):
    r = registry(tmp_path)
    r.create("kept")
    r._save = lambda *_: (_ for _ in ()).throw(OSError(28, "No space left on device"))
    for change in (lambda: r.create("new"), lambda: r.delete("kept"),
                   lambda: r.alter_configs("kept", [{"name": "retention.ms", "value": "5"}])):
        with pytest.raises(OdradekError) as err:
            change()
        assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR and "nothing was changed" in err.value.message
    assert set(r.topics) == {"kept"} and r.get("kept").configs == {} and r.version == 1


def test_a_segment_size_below_the_brokers_minimum_is_refused_naming_the_setting(tmp_path):
    r = registry(tmp_path, min_segment_bytes=1 << 20)
    for change in (lambda: r.create("tiny", configs={"segment.bytes": "71"}),
                   lambda: r.alter_configs("kept", [{"name": "segment.bytes", "value": "71"}])):
        if "kept" not in r.topics:
            r.create("kept")
        with pytest.raises(OdradekError) as err:
            change()
        assert err.value.code == ErrorCode.INVALID_CONFIG and "log.segment.bytes.min" in err.value.message
    assert r.create("ok", configs={"segment.bytes": str(1 << 20)}).configs == {"segment.bytes": 1 << 20}
