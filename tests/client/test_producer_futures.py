"""send() handles and what the broker's answers do to them (scripted broker: exact answers)."""
from __future__ import annotations

import concurrent.futures
import threading

import pytest

from odradek.core.protocol import ApiKey, ErrorCode
from odradek import Producer, RecordMetadata, errors


def test_a_handle_has_the_future_interface_and_resolves_to_record_metadata(scripted):
    broker = scripted({"t": 1})
    with Producer(broker.bootstrap, linger_ms=1) as p:
        first, second = p.send("t", b"a", timestamp_ms=1234), p.send("t", b"b")
        called = threading.Event()
        seen = []
        second.add_done_callback(lambda h: (seen.append(h), called.set()))
        meta = second.result(timeout=10)
        assert called.wait(10) and seen == [second]
        assert isinstance(meta, RecordMetadata) and (meta.topic, meta.partition, meta.offset) == ("t", 0, 1)
        assert first.result(10) == RecordMetadata("t", 0, 0, 1234)
        assert first.done() and first.exception() is None and not first.cancel() and not first.cancelled()


def test_offsets_of_consecutive_batches_follow_the_broker_base_offset(scripted):
    broker = scripted({"t": 1})
    with Producer(broker.bootstrap, linger_ms=0, batch_size=300) as p:
        handles = [p.send("t", b"%03d" % i + b"x" * 90) for i in range(50)]
        p.flush()
    assert [h.result().offset for h in handles] == list(range(50))
    assert [r.value[:3] for r in broker.records("t", 0)] == [b"%03d" % i for i in range(50)]


def test_a_non_retriable_broker_error_fails_the_handle_with_its_error_class(scripted):
    broker = scripted({"t": 1})
    broker.faults.append(("error", ErrorCode.MESSAGE_TOO_LARGE))
    with Producer(broker.bootstrap, linger_ms=0) as p:
        h = p.send("t", b"v")
        with pytest.raises(errors.MessageTooLargeError) as exc:
            h.result(10)
        assert exc.value.code == ErrorCode.MESSAGE_TOO_LARGE and "t-0" in str(exc.value)
        assert isinstance(h.exception(), errors.MessageTooLargeError)


def test_a_retriable_error_is_retried_after_a_metadata_refresh_and_then_succeeds(scripted):
    broker = scripted({"t": 1})
    broker.faults.extend([("error", ErrorCode.NOT_LEADER_OR_FOLLOWER)] * 2)
    with Producer(broker.bootstrap, linger_ms=0, retry_backoff_ms=10) as p:
        assert p.send("t", b"v").result(10).offset == 0
        assert p.metrics()["retries"] == 2
    metadata_requests = [api for api, _ in broker.requests if api == ApiKey.METADATA]
    assert len(metadata_requests) >= 2  # the first lookup, and at least one refresh
    assert [r.value for r in broker.records("t", 0)] == [b"v"]


def test_retries_stop_at_the_retries_limit(scripted):
    broker = scripted({"t": 1})
    broker.faults.extend([("error", ErrorCode.NOT_ENOUGH_REPLICAS)] * 3)
    with Producer(broker.bootstrap, linger_ms=0, retries=1, retry_backoff_ms=1) as p:
        with pytest.raises(errors.NotEnoughReplicasError):
            p.send("t", b"v").result(10)


def test_a_connection_lost_after_the_append_is_retried_and_the_duplicate_is_visible(scripted):
    broker = scripted({"t": 1})
    broker.faults.append(("drop_after_append",))
    with Producer(broker.bootstrap, linger_ms=0, retry_backoff_ms=10, enable_idempotence=False) as p:
        meta = p.send("t", b"v").result(10)
    assert meta.offset == 1  # the first append's answer was lost; the retry is acknowledged
    assert [r.value for r in broker.records("t", 0)] == [b"v", b"v"]


def test_with_idempotence_the_retry_after_a_lost_answer_is_recognised_and_stored_once(scripted):
    broker = scripted({"t": 1})  # it checks sequences as a leader does
    broker.faults.append(("drop_after_append",))
    with Producer(broker.bootstrap, linger_ms=0, retry_backoff_ms=10) as p:
        meta = p.send("t", b"v").result(10)
        assert p.metrics()["retries"] == 1
    assert meta.offset == 0 and [r.value for r in broker.records("t", 0)] == [b"v"]


def test_acks_0_resolves_with_offset_minus_one_without_waiting_for_an_answer(scripted):
    broker = scripted({"t": 1})
    with Producer(broker.bootstrap, acks=0, linger_ms=0) as p:
        assert p.send("t", b"v").result(10).offset == -1
        p.flush()


def test_acks_outside_0_1_all_are_refused_before_anything_is_sent():
    for acks in (2, -2, "some"):
        with pytest.raises(ValueError):
            Producer("127.0.0.1:1", acks=acks)


def test_flush_waits_for_every_record_and_close_fails_what_cannot_be_sent(scripted):
    broker = scripted({"t": 2})
    p = Producer(broker.bootstrap, linger_ms=60000)
    handles = [p.send("t", b"v", partition=i % 2) for i in range(10)]
    assert not any(h.done() for h in handles)
    p.flush(timeout=10)
    assert all(h.done() and h.exception() is None for h in handles)
    p.close()
    with pytest.raises(RuntimeError):
        p.send("t", b"late", partition=0)


def test_values_and_keys_must_be_bytes(scripted):
    broker = scripted({"t": 1})
    with Producer(broker.bootstrap) as p:
        with pytest.raises(TypeError, match="encode"):
            p.send("t", "text")
        with pytest.raises(TypeError):
            p.send("t", b"v", key=42)


def test_sending_to_an_unknown_topic_raises_its_error_code(scripted):
    broker = scripted({"t": 1})
    with Producer(broker.bootstrap, max_block_ms=300, retry_backoff_ms=50) as p:
        with pytest.raises(errors.UnknownTopicOrPartitionError, match="nope"):
            p.send("nope", b"v")


def test_many_threads_may_share_one_producer(scripted):
    broker = scripted({"t": 1})
    with Producer(broker.bootstrap, linger_ms=1, batch_size=2000) as p:
        def work(n):
            return [p.send("t", b"%d-%d" % (n, i)) for i in range(500)]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            handles = [h for hs in pool.map(work, range(4)) for h in hs]
        p.flush()
    offsets = sorted(h.result().offset for h in handles)
    assert offsets == list(range(2000))
    assert len({r.value for r in broker.records("t", 0)}) == 2000


def test_a_batch_of_explicit_timestamps_carries_their_maximum_not_the_send_time(scripted):
    from odradek.core import records as fmt
    broker = scripted({"t": 1})
    with Producer(broker.bootstrap, linger_ms=60000) as p:
        handles = [p.send("t", b"a", timestamp_ms=3000), p.send("t", b"b", timestamp_ms=1000)]
        p.flush()
    (base, data), = broker.logs[("t", 0)]
    assert fmt.BatchHeader.read(data).max_timestamp == 3000
    assert [r.timestamp for r in fmt.decode_batch(data)] == [3000, 1000]
    assert [h.result().timestamp for h in handles] == [3000, 1000]


def test_a_lone_record_is_sent_at_once_not_when_the_next_one_wakes_the_sender(scripted, monkeypatch):
    import time as _time

    from odradek import producer_sender as producer  # the sender thread and its IDLE_WAIT
    monkeypatch.setattr(producer, "IDLE_WAIT", 60.0)  # a lost wake-up would now cost a minute
    send_ready = producer._Sender._send_ready

    def slow_send_ready(self):  # widen the gap between the sender's last look and its sleep
        send_ready(self)
        _time.sleep(0.005)
    monkeypatch.setattr(producer._Sender, "_send_ready", slow_send_ready)
    broker = scripted({"t": 1})
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for i in range(50):
            assert p.send("t", b"%d" % i).result(timeout=20).offset == i
