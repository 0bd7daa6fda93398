"""Retention, compaction and config changes acting on live topics of a real broker (one for
the module, with the fast retention and cleaner settings below; each test has its own topic)."""
import time

import pytest

from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey
from odradek import Admin, Consumer, Producer, TopicPartition
from tests.conftest import BrokerProcess

FAST = {"log_retention_check_interval_ms": 100, "log_segment_delete_delay_ms": 0, "log_cleaner_backoff_ms": 100,
        "log_segment_bytes_min": 1024}  # the test-only way to small segments


@pytest.fixture(scope="module")
def fast_broker(tmp_path_factory):
    b = BrokerProcess(str(tmp_path_factory.mktemp("live-topics")), {k.replace("_", "."): v for k, v in FAST.items()})
    b.start()
    try:
        yield b
    finally:
        b.discard()


def wait_for(pred, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def produce(bootstrap, topic, records, **kw):
    with Producer(bootstrap, linger_ms=0, batch_size=4096, max_request_size=32768, compression=None, **kw) as p:
        handles = [p.send(topic, value, key=key) for key, value in records]
        p.flush()
        return [h.result(10) for h in handles]


def fetch_error(broker, topic, offset):
    conn = BrokerConnection(broker.host, broker.port)
    try:
        body = conn.request(ApiKey.FETCH, {"max_wait_ms": 0, "topics": [
            {"name": topic, "partitions": [{"index": 0, "fetch_offset": offset}]}]}).body
        return body["topics"][0]["partitions"][0]["error_code"]
    finally:
        conn.close()


def test_retention_by_bytes_deletes_old_segments_and_their_offsets_go_out_of_range(fast_broker):
    broker = fast_broker
    tp = TopicPartition("r", 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("r", config={"segment.bytes": 65536, "retention.bytes": 131072})
        produce(broker.bootstrap, "r", [(None, b"x" * 100)] * 3000)
        start = wait_for(lambda: admin.list_offsets([tp], -2)[tp], what="the log start to advance")
        assert admin.list_offsets([tp], -1)[tp] == 3000
    assert fetch_error(broker, "r", 0) == 1  # OFFSET_OUT_OF_RANGE
    assert fetch_error(broker, "r", start) == 0
    with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
        c.assign([tp])
        got = []
        wait_for(lambda: got.extend(c.poll(timeout_ms=200)) or (got and got[-1].offset == 2999), what="the tail")
        assert got[0].offset >= start and [r.offset for r in got] == list(range(got[0].offset, 3000))


def test_altering_retention_of_a_live_topic_takes_effect_without_a_restart(fast_broker):
    broker = fast_broker
    tp = TopicPartition("a", 0)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("a", config={"segment.bytes": 65536})
        produce(broker.bootstrap, "a", [(None, b"y" * 100)] * 2000)
        time.sleep(0.5)
        assert admin.list_offsets([tp], -2)[tp] == 0  # no limit yet: nothing deleted
        admin.alter_configs("a", set={"retention.bytes": 65536})
        assert {c.name: c.value for c in admin.describe_configs("a")}["retention.bytes"] == "65536"
        wait_for(lambda: admin.list_offsets([tp], -2)[tp] > 0, what="retention to apply the new limit")
        with pytest.raises(Exception) as err:
            admin.alter_configs("a", set={"retention.bytes": "lots"})
        assert "retention.bytes" in str(err.value)


def test_compaction_keeps_the_latest_value_of_each_key_on_a_live_topic(fast_broker):
    broker = fast_broker
    tp = TopicPartition("c", 0)
    keys = [b"k%d" % i for i in range(10)]
    records = [(k, b"%s=v%d" % (k, n)) for n in range(300) for k in keys]
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("c", config={"cleanup.policy": "compact", "segment.bytes": 40000,
                                        "min.cleanable.dirty.ratio": 0.01})
    produce(broker.bootstrap, "c", records)

    def read_all():
        with Consumer(broker.bootstrap, auto_offset_reset="earliest") as c:
            c.assign([tp])
            out = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and (not out or out[-1].offset < len(records) - 1):
                out.extend(c.poll(timeout_ms=200))
            return out

    compacted = wait_for(lambda: (lambda rs: rs if len(rs) < len(records) else None)(read_all()),
                         what="the cleaner to compact closed segments")
    offsets = [r.offset for r in compacted]
    assert offsets == sorted(set(offsets)) and offsets[-1] == len(records) - 1  # offsets kept, gaps allowed
    latest = {k: v for k, v in records}
    assert {r.key: r.value for r in compacted} == latest  # the last value of every key survives


def test_describe_configs_of_a_broker_answers_only_the_keys_asked_for(fast_broker):
    # Admin.describe_configs(keys=...) on a broker answered every config: the handler read the
    # names only from the Kafka codec's field ('configs'), not the bundled Admin's ('keys').
    with Admin(fast_broker.bootstrap) as admin:
        broker = admin.describe_configs("0", keys=["log.retention.check.interval.ms"], resource_type="broker")
        assert [(c.name, c.value) for c in broker] == [("log.retention.check.interval.ms", "100")]
        admin.create_topic("keys", config={"retention.ms": 7200000})
        topic = admin.describe_configs("keys", keys=["retention.ms"])
        assert [(c.name, c.value) for c in topic] == [("retention.ms", "7200000")]
        assert len(admin.describe_configs("0", resource_type="broker")) > 100  # no keys: every config
