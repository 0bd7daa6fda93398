"""The idempotent producer against a real broker: producer ids, retries recognised, refusals,
and a numbered stream through kill -9 of actors and of the whole broker (issue 12)."""
from __future__ import annotations

import collections
import os
import random
import signal
import socket
import threading
import time

import pytest

from odradek import Admin, Consumer, Producer, TopicPartition
from odradek.cluster import Connection
from odradek.errors import error_for
from odradek.core.records import encode_batch
from odradek.core.protocol import ApiKey, ErrorCode
from odradek.producer_sender import MAX_STAMPED

PARTITIONS = 3
SETTINGS = {"supervisor_max_restarts": 10000}


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    from tests.conftest import BrokerProcess
    b = BrokerProcess(str(tmp_path_factory.mktemp("idem")), {})
    b.start()
    with Admin(b.bootstrap) as admin:
        admin.create_topic("idem", partitions=1)
    yield b
    b.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


def init_producer_id(conn: Connection) -> tuple[int, int]:
    body = conn.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                                  "producer_id": -1, "producer_epoch": -1}).header["body"]
    assert body["error_code"] == 0
    return body["producer_id"], body["producer_epoch"]


def produce(conn: Connection, batch: bytes, topic: str = "idem") -> dict:
    body = {"acks": -1, "timeout_ms": 5000, "topics": [{"name": topic, "partitions": [{"index": 0, "frame": 0}]}]}
    return conn.request(ApiKey.PRODUCE, body, [batch]).header["body"]["topics"][0]["partitions"][0]


def stamped(pid: int, seq: int, n: int = 2, epoch: int = 0) -> bytes:
    return encode_batch([(None, b"s%d" % (seq + i)) for i in range(n)], producer_id=pid, producer_epoch=epoch,
                        base_sequence=seq)


@pytest.fixture
def conn(shared_broker):
    c = Connection(shared_broker.host, shared_broker.port)
    c.connect()
    yield c
    c.close()


def test_init_producer_id_hands_out_a_different_id_each_time(conn):
    ids = {init_producer_id(conn)[0] for _ in range(5)}
    assert len(ids) == 5 and all(i > 0 for i in ids)


def test_a_retried_batch_is_answered_with_its_original_offset_and_stored_once(conn):
    pid, epoch = init_producer_id(conn)
    first = produce(conn, stamped(pid, 0))
    again = produce(conn, stamped(pid, 0))
    assert first["error_code"] == again["error_code"] == 0 and again["base_offset"] == first["base_offset"]
    nxt = produce(conn, stamped(pid, 2))
    assert nxt["error_code"] == 0 and nxt["base_offset"] == first["base_offset"] + 2


def test_a_gap_in_the_sequence_is_refused_out_of_order(conn):
    pid, _ = init_producer_id(conn)
    assert produce(conn, stamped(pid, 0))["error_code"] == 0
    r = produce(conn, stamped(pid, 5))
    assert r["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER and "does not follow" in r["error_message"]


def test_a_producer_id_the_broker_never_handed_out_is_refused(conn):
    pid, _ = init_producer_id(conn)
    for forged in (pid + 1, pid ^ (1 << 40), 12345):
        r = produce(conn, stamped(forged, 0))
        assert r["error_code"] == ErrorCode.INVALID_PRODUCER_ID_MAPPING, forged
        assert "not handed out" in r["error_message"]


def test_the_bundled_producer_is_idempotent_by_default_and_off_when_acks_is_1(shared_broker):
    with Producer(shared_broker.bootstrap, linger_ms=1) as p:
        assert p.idempotent
        p.send("idem", b"one").result(10)
        assert p.metrics()["producer_id"] > 0
    with Producer(shared_broker.bootstrap, acks=1) as p:
        assert not p.idempotent
    with pytest.raises(ValueError, match="acks"):
        Producer(shared_broker.bootstrap, acks=1, enable_idempotence=True)


def test_a_retry_after_a_lost_answer_is_not_stored_twice(shared_broker):
    """The producer's batch is appended, then its connection dies before the answer: the
    retry carries the same sequence and the broker answers with the first offset."""
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("lost-answer", partitions=1)
    with Producer(shared_broker.bootstrap, linger_ms=0, retry_backoff_ms=20, request_timeout_ms=2000) as p:
        p.send("lost-answer", b"warm-up").result(10)
        sender = p._sender
        original = sender._on_response

        def lose_first_answer(layout, frame, err, node, _done=[]):
            if not _done and err is None:  # the broker appended: pretend the connection died
                _done.append(1)
                from odradek.errors import error_for
                err = error_for(ErrorCode.NETWORK_EXCEPTION, "answer lost (test)")
                frame = None
            return original(layout, frame, err, node)

        sender._on_response = lose_first_answer
        m = p.send("lost-answer", b"only-once").result(10)
        assert p.metrics()["retries"] >= 1
    values = read_all(shared_broker.bootstrap, "lost-answer", 1)
    assert [v for v in values[0]] == [b"warm-up", b"only-once"] and m.offset == 1


def test_batches_piled_up_behind_a_request_go_together_and_a_lost_answer_to_them_stores_nothing_twice(shared_broker):
    """A partition has one request in flight; the batches closed meanwhile (up to the
    MAX_STAMPED a leader recognises a retry among) go in its next request together instead of one request
    each. The first such request's answer is lost: its batches are retried alone and
    recognised, so every record is stored once, in order."""
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("piled", partitions=1)
    with Producer(shared_broker.bootstrap, linger_ms=60000, batch_size=2000, retry_backoff_ms=20,
                  request_timeout_ms=5000) as p:
        sender = p._sender
        original = sender._on_response
        per_request = []

        def lose_first_shared_answer(layout, frame, err, node, _done=[]):
            n = sum(len(bs) for _, bs in layout)
            per_request.append(n)
            if not _done and err is None and n > 1:  # appended: pretend the connection died
                _done.append(1)
                from odradek.errors import error_for
                err = error_for(ErrorCode.NETWORK_EXCEPTION, "answer lost (test)")
                frame = None
            return original(layout, frame, err, node)

        sender._on_response = lose_first_shared_answer
        values = [b"%05d" % i + b"x" * 95 for i in range(2000)]  # ~19 records a batch: ~100 batches
        for v in values:
            p.send("piled", v)
        p.flush(60)
        assert max(per_request) > 1 and max(per_request) <= MAX_STAMPED, per_request
        assert p.metrics()["retries"] >= 1
    assert read_all(shared_broker.bootstrap, "piled", 1)[0] == values


def test_several_requests_of_a_partition_in_flight_stay_in_order_and_once_when_the_connection_is_cut(shared_broker):
    """Idempotence lets a partition have several requests in flight (up to max_in_flight, as
    Kafka's producer: issue 33, an acks=all round trip now holds fsyncs). Three times, once a
    request is answered while a later one of its partition is in flight, the answers are held
    back until three are (the broker appended all three), then the producer's socket is shut
    down and the three are lost: each
    batch is retried in sequence order, one request at a time, and the leader recognises the
    written ones by their sequence. Every record is stored once, in send order.
    Fails without the change (one request a partition at a time): ``most in flight 1``."""
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("cut", partitions=1)
    # a batch a request (uncompressed ~2 KB batches): the MAX_STAMPED batches a partition may
    # have in flight span many requests
    with Producer(shared_broker.bootstrap, linger_ms=0, batch_size=2000, max_request_size=2500, compression=None,
                  retry_backoff_ms=20, request_timeout_ms=5000) as p:
        p.send("cut", b"warm-up").result(10)
        sender = p._sender
        original = sender._on_response
        held, most, cuts, settling = [], [0], [], [False]

        def lose_three_in_flight(layout, frame, err, node):
            busy = sender.in_flight.get(("cut", 0))
            most[0] = max(most[0], busy.requests if busy is not None else 0)
            if settling[0]:  # the answers (or failures) of what was in flight at the cut go through
                original(layout, frame, err, node)
                settling[0] = ("cut", 0) in sender.in_flight
                return
            if len(cuts) < 3 and err is None and (held or busy.requests > 1) and \
                    not any(b.attempts > 1 for _, bs in layout for b in bs):
                held.append(layout)  # answered; the producer has not heard yet: still in flight
                if len(held) < 3:
                    return
                cuts.append(len(held))
                sender.conns[node].sock.shutdown(socket.SHUT_RDWR)  # a real cut: later requests fail too
                lost = error_for(ErrorCode.NETWORK_EXCEPTION, "connection cut (test)")
                for earlier in held:
                    original(earlier, None, lost, node)
                held.clear()
                settling[0] = ("cut", 0) in sender.in_flight
                return
            return original(layout, frame, err, node)

        sender._on_response = lose_three_in_flight
        values = [b"%05d" % i + b"x" * 95 for i in range(4000)]  # ~19 records a batch
        handles = [p.send("cut", v) for v in values]
        p.flush(60)
        assert most[0] > 1, f"most in flight {most[0]}"
        assert len(cuts) == 3 and p.metrics()["retries"] >= 9
        assert all(h.exception() is None for h in handles) and p.metrics()["sequence_resets"] == 0
        assert [h.result().offset for h in handles] == list(range(1, len(values) + 1))
    assert read_all(shared_broker.bootstrap, "cut", 1)[0] == [b"warm-up"] + values


def test_a_batch_whose_answers_keep_getting_lost_is_recognised_after_later_batches_are_written(shared_broker):
    """The partition's leader recognises a retry among the last batches it wrote of a
    producer (MAX_CACHED_BATCHES). A batch whose answers are lost again and again while later
    batches of its partition go on being written must not fall out of that window: the
    producer stamps no more than MAX_STAMPED from its oldest unresolved one on. Before, with 5, the 6th later batch pushed
    it out, its retry was refused OUT_OF_ORDER_SEQUENCE_NUMBER, the producer bumped its epoch
    and wrote it a second time."""
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("in-doubt", partitions=1)
    with Producer(shared_broker.bootstrap, linger_ms=0, batch_size=1, retry_backoff_ms=20,
                  request_timeout_ms=2000) as p:
        p.send("in-doubt", b"warm-up").result(10)
        sender = p._sender
        original = sender._on_response
        lost = []

        def lose_the_targets_answers(layout, frame, err, node):
            target = any(b.data is not None and b"target" in bytes(b.data) for _, bs in layout for b in bs)
            if target and err is None and len(lost) < 4:  # written, but the producer never hears it
                lost.append(1)
                from odradek.errors import error_for
                err, frame = error_for(ErrorCode.NETWORK_EXCEPTION, "answer lost (test)"), None
            return original(layout, frame, err, node)

        sender._on_response = lose_the_targets_answers
        values = [b"target"] + [b"later-%02d" % i for i in range(2 * MAX_STAMPED + 10)]
        handles = [p.send("in-doubt", v) for v in values]
        p.flush(30)
        assert len(lost) == 4 and all(h.exception() is None for h in handles)
        assert p.metrics()["sequence_resets"] == 0
    stored = read_all(shared_broker.bootstrap, "in-doubt", 1)[0]
    assert stored == [b"warm-up"] + values


def test_a_partition_that_forgot_the_producer_moves_to_a_new_epoch_without_waiting_for_the_others(start_broker):
    """Partition 1 forgets the producer (producer.id.expiration.ms) while partition 0 has a
    batch in doubt (its answers lost). Partition 1's refused batch is stamped with a new epoch
    and written at once; partition 0 keeps its old epoch until its batch is resolved, and that
    batch is recognised, not written twice. Before, the bump waited for every partition to
    have nothing in doubt and held every new batch meanwhile: the chaos battery's producers
    stalled until their sends timed out (44,892 of 68,248)."""
    import threading as _threading
    broker = start_broker(producer_id_expiration_ms=1500, log_retention_check_interval_ms=200)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("switch", partitions=2)
    lose = _threading.Event()
    with Producer(broker.bootstrap, linger_ms=0, retry_backoff_ms=20, request_timeout_ms=3000) as p:
        p.send("switch", b"p1-first", partition=1).result(10)
        deadline = time.monotonic() + 4  # partition 0 stays busy, partition 1 idles past the expiration
        while time.monotonic() < deadline:
            p.send("switch", b"p0-keepalive", partition=0).result(10)
            time.sleep(0.2)
        sender = p._sender
        original = sender._on_response

        def lose_partition_0s_answers(layout, frame, err, node):
            if lose.is_set() and err is None:  # written, but the producer is told the answer was lost
                for t in frame.header["body"].get("topics", []):
                    for part in t.get("partitions", []):
                        if part["index"] == 0 and not part.get("error_code"):
                            part["error_code"] = int(ErrorCode.NETWORK_EXCEPTION)
            return original(layout, frame, err, node)

        sender._on_response = lose_partition_0s_answers
        lose.set()
        in_doubt = p.send("switch", b"p0-in-doubt", partition=0)
        time.sleep(0.5)
        assert not in_doubt.done()
        after = p.send("switch", b"p1-after-expiry", partition=1)
        assert after.result(10).offset == 1  # written while partition 0 is still in doubt
        assert not in_doubt.done() and p.metrics()["sequence_resets"] == 1
        lose.clear()
        in_doubt.result(10)
    stored = read_all(broker.bootstrap, "switch", 2)
    assert stored[1] == [b"p1-first", b"p1-after-expiry"]
    assert stored[0].count(b"p0-in-doubt") == 1 and stored[0][-1] == b"p0-in-doubt"


def read_all(bootstrap: str, topic: str, partitions: int) -> dict[int, list]:
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    out: dict[int, list] = collections.defaultdict(list)
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign(tps)
        ends = c.end_offsets(tps)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(c.position(tp) < ends[tp] for tp in tps):
            for r in c.poll(timeout_ms=200):
                out[r.partition].append(r.value)
    return out


def numbered_stream(bootstrap: str, topic: str, n: int, seconds: float) -> list:
    """Send value i to partition i % PARTITIONS, paced over ``seconds``; the handles."""
    handles = []
    with Producer(bootstrap, linger_ms=2, batch_size=4096, retry_backoff_ms=50, request_timeout_ms=3000,
                  delivery_timeout_ms=120000, max_block_ms=60000) as p:
        assert p.idempotent
        start = time.monotonic()
        for i in range(n):
            handles.append(p.send(topic, b"%08d" % i, partition=i % PARTITIONS))
            if i % 250 == 0:
                ahead = start + seconds * i / n - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        p.flush(timeout=150)
    return handles


def check_exactly_once(bootstrap: str, topic: str, n: int, handles: list) -> None:
    failed = [h for h in handles if h.exception() is not None]
    assert not failed, f"{len(failed)} records failed: {failed[0].exception()!r}"
    stored = read_all(bootstrap, topic, PARTITIONS)
    for p in range(PARTITIONS):
        expected = [b"%08d" % i for i in range(p, n, PARTITIONS)]
        got = stored[p]
        dups = sum(c - 1 for c in collections.Counter(got).values() if c > 1)
        assert dups == 0, f"partition {p}: {dups} records stored twice"
        assert got == expected, f"partition {p}: {len(got)} stored, {len(expected)} sent; order or gap differs"
    for i, h in enumerate(handles):
        m = h.result()
        assert m.partition == i % PARTITIONS and m.offset == i // PARTITIONS, (i, m)


@pytest.mark.slow
def test_a_numbered_stream_is_stored_exactly_once_in_order_while_actors_are_killed(start_broker):
    broker = start_broker(**SETTINGS)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("numbered", partitions=PARTITIONS)
    n, seconds = 30000, 8.0
    stop, killed = threading.Event(), []

    def killer() -> None:
        rnd = random.Random(12)
        until = time.monotonic() + seconds
        while not stop.wait(rnd.uniform(0.2, 0.5)) and time.monotonic() < until:
            try:
                actors = [a for a in broker.status()["actors"] if a.get("pid") and a["state"] == "running"
                          and a["name"].rsplit("-", 1)[0] in ("processor", "handler", "log")]
            except Exception:  # the supervisor is busy restarting: next tick
                continue
            if actors:
                victim = rnd.choice(actors)
                try:
                    os.kill(victim["pid"], signal.SIGKILL)
                    killed.append(victim["name"])
                except ProcessLookupError:
                    pass

    t = threading.Thread(target=killer)
    t.start()
    try:
        handles = numbered_stream(broker.bootstrap, "numbered", n, seconds)
    finally:
        stop.set()
        t.join(30)
    print(f"\nkilled {len(killed)}: {collections.Counter(k.rsplit('-', 1)[0] for k in killed)}")
    assert any(k.startswith("log") for k in killed) and len(killed) >= 5
    check_exactly_once(broker.bootstrap, "numbered", n, handles)


@pytest.mark.slow
def test_a_broker_killed_and_restarted_mid_stream_keeps_the_producer_state(start_broker, tmp_path):
    data = str(tmp_path / "data")
    first = start_broker(data_dir=data, **SETTINGS)
    port = first.port
    with Admin(first.bootstrap) as admin:
        admin.create_topic("restart", partitions=PARTITIONS)
    # a batch appended before the crash, retried after it, must still be known as a duplicate
    c = Connection(first.host, port)
    c.connect()
    pid, _ = init_producer_id(c)
    before = produce(c, stamped(pid, 0), "restart")
    c.close()
    restarted = []
    n, seconds = 20000, 6.0

    def crash_and_restart() -> None:
        time.sleep(seconds / 3)
        first.kill()
        restarted.append(start_broker(data_dir=data, listeners=f"PLAINTEXT://127.0.0.1:{port}", **SETTINGS))

    t = threading.Thread(target=crash_and_restart)
    t.start()
    try:
        with Admin(first.bootstrap) as admin:
            admin.create_topic("restart-stream", partitions=PARTITIONS)
        handles = numbered_stream(first.bootstrap, "restart-stream", n, seconds)
    finally:
        t.join(90)
    assert restarted, "the broker did not come back"
    c = Connection(first.host, port)
    c.connect()
    try:
        again = produce(c, stamped(pid, 0), "restart")
        assert again["error_code"] == 0 and again["base_offset"] == before["base_offset"]
        assert produce(c, stamped(pid, 3), "restart")["error_code"] == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    finally:
        c.close()
    check_exactly_once(restarted[0].bootstrap, "restart-stream", n, handles)


def test_a_producer_the_partition_forgot_bumps_its_epoch_and_goes_on_without_loss(start_broker):
    """producer.id.expiration.ms passes between two sends: the partition answers the second
    batch UNKNOWN_PRODUCER_ID; the producer bumps its epoch, restarts at sequence 0 and the
    record is stored once (KIP-360)."""
    broker = start_broker(producer_id_expiration_ms=500, log_retention_check_interval_ms=100)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("forgotten", partitions=1)
    with Producer(broker.bootstrap, linger_ms=0, retry_backoff_ms=20) as p:
        p.send("forgotten", b"before").result(10)
        epoch = p.metrics()["producer_epoch"]
        time.sleep(1.5)  # the broker forgets the idle producer
        m = p.send("forgotten", b"after").result(10)
        assert p.metrics()["sequence_resets"] == 1 and p.metrics()["producer_epoch"] == epoch + 1
        assert p.send("forgotten", b"again").result(10).offset == m.offset + 1
    assert read_all(broker.bootstrap, "forgotten", 1)[0] == [b"before", b"after", b"again"]


def test_init_producer_id_with_a_transactional_id_keeps_the_id_and_bumps_the_epoch(conn):
    ask = {"transactional_id": "app-1", "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1}
    first = conn.request(ApiKey.INIT_PRODUCER_ID, ask).header["body"]
    again = conn.request(ApiKey.INIT_PRODUCER_ID, ask).header["body"]
    assert again["producer_id"] == first["producer_id"] and again["producer_epoch"] == first["producer_epoch"] + 1


def test_init_producer_id_refuses_a_timeout_over_the_broker_maximum(conn):
    from odradek.core.protocol import OdradekError
    with pytest.raises(OdradekError) as e:
        conn.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": "app-2", "transaction_timeout_ms": 10 ** 9,
                                               "producer_id": -1, "producer_epoch": -1})
    assert e.value.code == ErrorCode.INVALID_TRANSACTION_TIMEOUT and "transaction.max.timeout.ms" in e.value.message


def test_a_broker_that_refuses_init_producer_id_fails_the_records_at_once_saying_why(scripted):
    broker = scripted({"t": 1})
    broker.faults.append(("error", ErrorCode.UNSUPPORTED_VERSION, ApiKey.INIT_PRODUCER_ID))
    with Producer(broker.bootstrap, linger_ms=0, delivery_timeout_ms=60000) as p:
        started = time.monotonic()
        exc = p.send("t", b"x").exception(timeout=20)
        assert exc is not None and "enable_idempotence=False" in str(exc) and time.monotonic() - started < 10
    assert not [api for api, _ in broker.requests if api == ApiKey.PRODUCE]


def test_a_coordinator_not_available_answer_is_retried_until_an_id_comes(scripted):
    broker = scripted({"t": 1})
    broker.faults.extend([("error", ErrorCode.COORDINATOR_NOT_AVAILABLE, ApiKey.INIT_PRODUCER_ID)] * 2)
    with Producer(broker.bootstrap, linger_ms=0, retry_backoff_ms=20) as p:
        assert p.send("t", b"x").result(20).offset == 0
        assert p.metrics()["producer_id"] >= 1000
