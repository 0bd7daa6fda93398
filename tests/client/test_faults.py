"""Faults: kill -9 of actors, and of the whole broker, while records are produced and consumed.

Afterwards every acknowledged record must be present and intact at the offset it was
acknowledged with. Retries after a lost answer may write a record twice (no idempotent
producer yet): duplicates are allowed, counted, and reported in the test output.
"""
from __future__ import annotations

import collections
import os
import random
import signal
import threading
import time

from odradek import Admin, Consumer, Producer, TopicPartition

RECORDS = 40000
RUN_SECONDS = 8.0  # the produce run is paced over this long, so the faults hit it many times
PARTITIONS = 3
SETTINGS = {"supervisor_max_restarts": 10000}


def produce_tracked(bootstrap: str, topic: str, n: int) -> tuple[dict, int]:
    """Send n numbered records through faults; {(partition, offset): value} of the
    acknowledged ones, and how many failed for good."""
    handles = []
    with Producer(bootstrap, linger_ms=2, batch_size=8192, retry_backoff_ms=50, request_timeout_ms=3000,
                  delivery_timeout_ms=120000, max_block_ms=60000) as p:
        start = time.monotonic()
        for i in range(n):
            handles.append((b"rec-%08d" % i, p.send(topic, b"rec-%08d" % i)))
            if i % 500 == 0:
                ahead = start + RUN_SECONDS * i / n - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
        p.flush(timeout=150)
    acked, failed = {}, 0
    for value, h in handles:
        if h.exception() is not None:
            failed += 1
            continue
        m = h.result()
        acked[(m.partition, m.offset)] = value
    return acked, failed


def read_everything(bootstrap: str, topic: str, at_least: int) -> list:
    tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as c:
        c.assign(tps)
        ends = c.end_offsets(tps)
        out = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (len(out) < at_least or any(c.position(tp) < ends[tp] for tp in tps)):
            out += c.poll(timeout_ms=200)
    return out


def check(acked: dict, failed: int, records: list, what: str) -> None:
    at = {(r.partition, r.offset): r.value for r in records}
    missing = [k for k in acked if k not in at]
    wrong = [k for k, v in acked.items() if k in at and at[k] != v]
    counts = collections.Counter(r.value for r in records)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    print(f"\n{what}: {len(acked)} acknowledged, {failed} failed for good, {len(records)} read, "
          f"{duplicates} duplicates from retries")
    assert not missing, f"{len(missing)} acknowledged records are missing, e.g. {missing[:5]}"
    assert not wrong, f"{len(wrong)} acknowledged offsets hold another value, e.g. {wrong[:5]}"
    assert len(acked) > RECORDS // 2  # the run did real work through the faults


def test_acknowledged_records_survive_kill_9_of_random_actors(start_broker):
    broker = start_broker(**SETTINGS)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("faults", partitions=PARTITIONS)
    stop = threading.Event()
    killed = []

    def killer() -> None:
        rnd = random.Random(4)
        until = time.monotonic() + RUN_SECONDS  # then the run finishes without faults
        while not stop.wait(rnd.uniform(0.2, 0.5)) and time.monotonic() < until:
            try:
                actors = [a for a in broker.status()["actors"] if a.get("pid") and a["state"] == "running"]
            except Exception:  # the supervisor is busy restarting: try again at the next tick
                continue
            if actors:
                victim = rnd.choice(actors)
                try:
                    os.kill(victim["pid"], signal.SIGKILL)
                    killed.append(victim["name"])
                except ProcessLookupError:
                    pass

    consumed = []

    def consume_meanwhile() -> None:
        tps = [TopicPartition("faults", p) for p in range(PARTITIONS)]
        with Consumer(broker.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                      request_timeout_ms=3000) as c:
            c.assign(tps)
            while not stop.is_set():
                try:
                    consumed.extend(c.poll(timeout_ms=200))
                except Exception as exc:  # reported, not fatal: the final read is the check
                    consumed.append(exc)

    threads = [threading.Thread(target=killer), threading.Thread(target=consume_meanwhile)]
    for t in threads:
        t.start()
    try:
        acked, failed = produce_tracked(broker.bootstrap, "faults", RECORDS)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    print(f"\nkilled {len(killed)} actors: {collections.Counter(n.rsplit('-', 1)[0] for n in killed)}; "
          f"the concurrent consumer read {sum(1 for r in consumed if not isinstance(r, Exception))} records")
    assert killed
    check(acked, failed, read_everything(broker.bootstrap, "faults", len(acked)), "kill -9 of actors")


def test_acknowledged_records_survive_kill_9_of_the_whole_broker_and_a_restart(start_broker, tmp_path):
    data = str(tmp_path / "data")
    first = start_broker(data_dir=data, **SETTINGS)
    port = first.port
    with Admin(first.bootstrap) as admin:
        admin.create_topic("crash", partitions=PARTITIONS)
    restarted = []

    def crash_and_restart() -> None:
        time.sleep(RUN_SECONDS / 3)
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
        restarted.append(start_broker(data_dir=data, listeners=f"PLAINTEXT://127.0.0.1:{port}", **SETTINGS))

    t = threading.Thread(target=crash_and_restart)
    t.start()
    try:
        acked, failed = produce_tracked(first.bootstrap, "crash", RECORDS)
    finally:
        t.join(90)
    assert restarted, "the broker did not come back"
    check(acked, failed, read_everything(restarted[0].bootstrap, "crash", len(acked)), "kill -9 of the broker")


def test_a_long_poll_held_by_a_fetch_actor_killed_9_is_failed_at_once_and_the_consumer_fetches_again(start_broker):
    """A fetch held in the fetch actor's purgatory dies with it. Before, nobody answered it:
    the processor failed it at request.timeout.ms (30 s), and meanwhile the consumer (or a
    follower, whose fetch timeout is replica.lag.time.max.ms: it left the ISR) read nothing.
    Now the processor fails every fetch in flight when the supervisor says the fetch actor
    died (NETWORK_EXCEPTION, retriable) and the consumer fetches again from its successor."""
    broker = start_broker(request_timeout_ms=30000)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("held", partitions=1)
    tp = TopicPartition("held", 0)
    got: list = []
    stop = threading.Event()
    with Consumer(broker.bootstrap, auto_offset_reset="latest", fetch_max_wait_ms=25000,
                  request_timeout_ms=60000) as consumer:
        consumer.assign([tp])
        assert consumer.position(tp) == 0

        def poll() -> None:
            while not stop.is_set() and not got:
                got.extend(consumer.poll(timeout_ms=500))

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        time.sleep(1.0)  # its fetch is in the purgatory now, for up to 25 s
        old = broker.actor_process("fetch").pid
        os.kill(old, signal.SIGKILL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and broker.actor("fetch").get("pid") in (None, 0, old):
            time.sleep(0.1)
        with Producer(broker.bootstrap) as producer:
            producer.send("held", b"after the kill").result(10)
        sent = time.monotonic()
        poller.join(20)
        stop.set()
        waited = time.monotonic() - sent
    assert [r.value for r in got] == [b"after the kill"], "the consumer never read the record sent after the kill"
    assert waited < 10, (f"the record sent after the fetch actor's kill was read {waited:.1f} s later: the consumer's "
                         f"fetch held by the dead actor was not failed, it waited out a timeout")


def _killed_while_held(broker, actor: str, api: int, body: dict, before=None) -> tuple[float, int]:
    """Send ``api`` (held by ``actor``: a JoinGroup in the group coordinator's purgatory, an
    EndTxn its coordinator is completing), kill -9 ``actor`` 0.5 s later, and return how long
    the answer took and its error code."""
    from odradek.cluster import Connection
    from odradek.core.protocol import OdradekError
    conn = Connection(broker.host, broker.port, request_timeout_ms=60000)
    conn.connect()
    try:
        if before is not None:
            before(conn)
        victim = broker.actor_process(actor).pid
        killer = threading.Timer(0.5, lambda: os.kill(victim, signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        try:
            body = conn.request(api, body, timeout=25).header["body"]
            code = body.get("error_code", 0)
        except OdradekError as exc:
            code = exc.code
        killer.join()
        return time.monotonic() - started, code
    finally:
        conn.close()


def test_a_join_group_held_by_a_group_coordinator_killed_9_is_failed_at_once(start_broker):
    """A JoinGroup held in the group coordinator's purgatory (an empty group waits
    group.initial.rebalance.delay.ms for more members) died with it; nobody answered it until
    the request timeout (30 s). Now the processor fails it when the supervisor says the
    coordinator died: COORDINATOR_NOT_AVAILABLE, and the client looks the coordinator up again."""
    from odradek.core.protocol import ApiKey, ErrorCode
    broker = start_broker(request_timeout_ms=30000, group_initial_rebalance_delay_ms=20000)
    join = {"group_id": "held", "member_id": "", "group_instance_id": None, "session_timeout_ms": 30000,
            "rebalance_timeout_ms": 30000, "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]}

    def member_id(conn) -> None:  # the first JoinGroup is answered MEMBER_ID_REQUIRED with one (KIP-394)
        answers: list = []
        conn.send(ApiKey.JOIN_GROUP, join, callback=lambda frame, err: answers.append((frame, err)))
        while not answers:
            conn.poll(1.0)
        assert answers[0][1].code == ErrorCode.MEMBER_ID_REQUIRED
        join["member_id"] = answers[0][0].header["body"]["member_id"]

    took, code = _killed_while_held(broker, "group_coordinator", ApiKey.JOIN_GROUP, join, before=member_id)
    assert code == ErrorCode.COORDINATOR_NOT_AVAILABLE, code
    assert took < 10, f"the JoinGroup held by the killed coordinator was answered {took:.1f} s later"


def test_an_end_txn_held_by_a_transaction_coordinator_killed_9_is_failed_at_once(start_broker):
    """An EndTxn the transaction coordinator holds (here: checking records that never come)
    died with it, unanswered until the request timeout. Now: COORDINATOR_NOT_AVAILABLE at once
    (retriable: the client ends the transaction again at the restarted coordinator)."""
    from odradek.core.protocol import ApiKey, ErrorCode
    broker = start_broker(request_timeout_ms=30000)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("txn-held", partitions=1)
    end = {"transactional_id": "held", "committed": True, "expect": [["txn-held", 0, 99]]}

    def begin(conn) -> None:  # fills in the EndTxn's producer id and epoch
        init = conn.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": "held", "transaction_timeout_ms": 60000,
                                                      "producer_id": -1, "producer_epoch": -1}).header["body"]
        end.update(producer_id=init["producer_id"], producer_epoch=init["producer_epoch"])
        conn.request(ApiKey.ADD_PARTITIONS_TO_TXN, {**end, "topics": [{"name": "txn-held", "partitions": [0]}]})

    took, code = _killed_while_held(broker, "txn_coordinator", ApiKey.END_TXN, end, before=begin)
    assert code == ErrorCode.COORDINATOR_NOT_AVAILABLE, code
    assert took < 1.9, f"the EndTxn held by the killed coordinator was answered {took:.1f} s later"
