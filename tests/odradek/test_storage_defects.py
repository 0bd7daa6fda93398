"""Storage and validation defects found by hostile and careless input (issue 16: 2, 3, 4, 12),
each on a real broker."""
import os
import subprocess
import sys
import time

import pytest

from odradek import Admin, Consumer, Producer, TopicPartition
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError


def produce(bootstrap, topic, values):
    with Producer(bootstrap, linger_ms=0, compression=None) as p:
        handles = [p.send(topic, v) for v in values]
        p.flush()
        return [h.result(10) for h in handles]


def consume_all(bootstrap, topic, count):
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign([TopicPartition(topic, 0)])
        got, deadline = [], time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            got.extend(r.value for r in c.poll(timeout_ms=200))
        return got


def test_a_topic_of_249_characters_can_be_deleted_created_again_and_survives_a_restart(start_broker, tmp_path):
    data = str(tmp_path / "data")
    broker = start_broker(data)
    name = "t" * 249
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(name)
        produce(broker.bootstrap, name, [b"old"])
        admin.delete_topic(name)
        assert name not in admin.list_topics()
        assert not [d for d in os.listdir(data) if d.startswith("ttt")], "the deleted partition's files remain"
        admin.create_topic(name)
        produce(broker.bootstrap, name, [b"new"])
    broker.stop()
    broker = start_broker(data)
    assert consume_all(broker.bootstrap, name, 1) == [b"new"]


def test_a_topic_whose_partition_cannot_be_created_is_refused_and_leaves_nothing_behind(broker):
    blocker = os.path.join(broker.data_dir, "blocked-0")
    with open(blocker, "w") as f:  # a file where the partition directory must go
        f.write("in the way")
    with Admin(broker.bootstrap) as admin:
        with pytest.raises(OdradekError) as err:
            admin.create_topic("blocked")
        assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR and "not created" in str(err.value)
        assert "blocked" not in admin.list_topics()
        os.unlink(blocker)
        admin.create_topic("blocked")
    assert produce(broker.bootstrap, "blocked", [b"x"])[0].offset == 0


def fill(directory):
    """Fill the file system of ``directory``; returns the filler's path."""
    path = os.path.join(directory, "filler")
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass
    return path


def test_a_topic_created_on_a_full_disk_is_refused_and_can_be_created_once_space_returns(start_broker, small_disk):
    broker = start_broker(os.path.join(small_disk, "data"))
    filler = fill(small_disk)
    with Admin(broker.bootstrap) as admin:
        with pytest.raises(OdradekError) as err:
            admin.create_topic("full", partitions=4)
        assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR
        assert "full" not in admin.list_topics()
        os.unlink(filler)
        admin.create_topic("full", partitions=4)
    assert produce(broker.bootstrap, "full", [b"x"])[0].offset == 0


def test_a_fetch_asking_to_wait_2_pow_40_ms_is_answered_empty_at_the_cap(start_broker):
    broker = start_broker(request_timeout_ms=4000)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("idle")
    conn = BrokerConnection(broker.host, broker.port)
    try:
        started = time.monotonic()
        body = conn.request(ApiKey.FETCH, {"max_wait_ms": 1 << 40, "min_bytes": 1 << 40, "topics": [
            {"name": "idle", "partitions": [{"index": 0, "fetch_offset": 0}]}]}).body
        waited = time.monotonic() - started
    finally:
        conn.close()
    assert body.get("error_code", 0) == 0, body
    part = body["topics"][0]["partitions"][0]
    assert part["error_code"] == 0 and part["records_size"] == 0
    assert 1.0 < waited < 4.0


def test_produced_batches_that_lie_about_their_records_are_refused_and_nothing_is_written(broker):
    from tests.log.test_records import THREE, _forged
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("lies")
    forged = {ErrorCode.CORRUPT_MESSAGE: [_forged(THREE, count=100), _forged(THREE, attributes=1)],
              ErrorCode.INVALID_RECORD: [_forged(THREE, attributes=0x20), _forged(THREE, last_delta=2**31 - 1)],
              ErrorCode.INVALID_TIMESTAMP: [_forged(THREE, first_ts=-2**63, max_ts=-2**63)]}
    conn = BrokerConnection(broker.host, broker.port)
    try:
        for code, batches in forged.items():
            for batch in batches:
                body = conn.request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 5000, "topics": [
                    {"name": "lies", "partitions": [{"index": 0, "frame": 0}]}]}, [batch]).body
                assert body["topics"][0]["partitions"][0]["error_code"] == code, body
    finally:
        conn.close()
    with Consumer(broker.bootstrap) as c:
        assert c.end_offsets([TopicPartition("lies", 0)]) == {TopicPartition("lies", 0): 0}


def test_the_broker_raises_its_open_files_limit_to_the_hard_limit_and_status_reports_it(start_broker):
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard <= 256:
        pytest.skip("needs a finite hard limit above 256")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))  # the broker inherits a low soft limit
    try:
        broker = start_broker()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert broker.status()["supervisor"]["open_files_limit"] == [hard, hard]
    out = subprocess.run([sys.executable, "-m", "odradek", "status", *broker.set_args], capture_output=True, text=True)
    assert f"open files limit {hard} (hard {hard})" in out.stdout, out.stdout + out.stderr


def test_a_topic_with_71_byte_segments_is_refused_unless_the_test_setting_allows_it(start_broker):
    strict = start_broker()
    with Admin(strict.bootstrap) as admin:
        with pytest.raises(OdradekError) as err:
            admin.create_topic("tiny", config={"segment.bytes": 71})
        assert err.value.code == ErrorCode.INVALID_CONFIG and "log.segment.bytes.min" in str(err.value)
    lax = start_broker(log_segment_bytes_min=14)
    with Admin(lax.bootstrap) as admin:
        admin.create_topic("tiny", config={"segment.bytes": 71})
    # one record a batch (71 bytes hold one): two sends in flight together may share a batch
    assert [r.offset for v in (b"a", b"b") for r in produce(lax.bootstrap, "tiny", [v])] == [0, 1]
