"""The transactional producer's commit path (issue 12's 300,000 records/s goal): the caller's
thread writes a partition's AddPartitionsToTxn itself when the partition's first batch
opens, so the coordinator stores it while the caller is still sending; the coordinator
defers a finished transaction's COMPLETE record until the id's next record replaces it.
Each is checked against a real broker, and so are their failure paths: a lost coordinator
connection (the request goes again the usual way) and a coordinator killed before the
COMPLETE record (the markers are written again, the records are read once)."""
from __future__ import annotations

import multiprocessing
import sys
import time
import types
import uuid

import pytest

from odradek import Admin, Consumer, Producer, TopicPartition
from odradek.cluster import Cluster
from odradek.local import LocalBroker
from odradek.transactions import describe
from tests.client.test_transactions import free_port

STATE_TOPIC = "__transaction_state"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = LocalBroker(str(tmp_path_factory.mktemp("txn-path")), {"shutdown.timeout.ms": 10000},
                    start_timeout=240).start()
    try:
        yield b
    finally:
        b.discard()


def new_topic(bootstrap: str) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    with Admin(bootstrap) as admin:
        admin.create_topic(name, partitions=1)
    return name


def read_committed(bootstrap: str, topic: str, expect: int, timeout: float = 30) -> list:
    out = []
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level="read_committed") as c:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out += c.poll(200)
            if len(out) >= expect:
                end = time.monotonic() + 1.0  # and nothing more comes
                while time.monotonic() < end:
                    out += c.poll(200)
                break
    return [r.value for r in out]


def _watch_state(bootstrap: str, txn_id: str, started, result) -> None:
    """In another process (the test's own holds the GIL): when the coordinator first has the
    transaction Ongoing, as a wall-clock time."""
    cluster = Cluster(bootstrap, "test-watch")
    started.set()
    deadline = time.time() + 20
    try:
        while time.time() < deadline:
            _, state = describe(cluster, txn_id)
            if state.get("transaction_state") == "Ongoing":
                result.value = time.time()
                return
            time.sleep(0.01)
    finally:
        cluster.close()


def test_the_partition_is_added_while_the_callers_thread_still_holds_the_gil(broker):
    """Before, the adder thread sent AddPartitionsToTxn only once the caller released the GIL
    (after its sends, at the commit): a caller busy for a second added the partition a
    second late. Now the caller's ``send`` writes it."""
    topic = new_topic(broker.bootstrap)
    txn_id = f"gil-{topic}"
    ctx = multiprocessing.get_context("spawn")
    started, seen = ctx.Event(), ctx.Value("d", 0.0)
    with Producer(broker.bootstrap, transactional_id=txn_id, linger_ms=60000) as p:
        p.init_transactions(30)
        p.begin_transaction()  # a first transaction: the adder's own connection to the coordinator
        p.send(topic, b"first")
        p.commit_transaction(30)
        watcher = ctx.Process(target=_watch_state, args=(broker.bootstrap, txn_id, started, seen))
        watcher.start()
        try:
            assert started.wait(30)
            time.sleep(0.5)
            switch = sys.getswitchinterval()
            sys.setswitchinterval(30.0)  # no other thread of ours runs until this one blocks
            try:
                p.begin_transaction()
                sent_at = time.time()
                p.send(topic, b"second")
                while time.time() < sent_at + 1.5:  # busy, holding the GIL
                    pass
            finally:
                sys.setswitchinterval(switch)
            watcher.join(30)
        finally:
            if watcher.is_alive():
                watcher.kill()
        assert seen.value, "the watcher never saw the transaction Ongoing"
        assert seen.value - sent_at < 1.0, f"the partition was added {seen.value - sent_at:.2f} s after send()"
        p.commit_transaction(30)
    assert read_committed(broker.bootstrap, topic, 2) == [b"first", b"second"]


def test_a_lost_coordinator_connection_sends_the_partition_again_the_usual_way(tmp_path):
    """The broker is killed -9 and restarted between two transactions: the caller writes the
    second one's AddPartitionsToTxn into a dead connection; the adder sends it again (finding
    the coordinator, retrying while it loads) and the commit goes through, each record once."""
    port = free_port()
    b = LocalBroker(str(tmp_path / "b"), {"shutdown.timeout.ms": 10000, "listeners": f"PLAINTEXT://127.0.0.1:{port}"},
                    start_timeout=240).start()
    try:
        topic = new_topic(b.bootstrap)
        with Producer(b.bootstrap, transactional_id=f"lost-{topic}") as p:
            p.init_transactions(30)
            for i in range(3):
                p.begin_transaction()
                p.send(topic, b"before-%d" % i)
                p.commit_transaction(30)
            b.kill()
            b.start()
            p.begin_transaction()
            p.send(topic, b"after")
            p.commit_transaction(60)
        assert read_committed(b.bootstrap, topic, 4) == [b"before-0", b"before-1", b"before-2", b"after"]
    finally:
        b.discard()


def test_an_add_partitions_answer_that_comes_after_its_transaction_ended_adds_nothing_to_the_next(broker):
    """An abort gives up waiting for an AddPartitionsToTxn after its timeout; that request's
    answer, read once the next transaction began, must not count the partition as added to
    it: its records would be written without the coordinator knowing them (no marker, a last
    stable offset stuck). The answer is put where the sender reads it, marked with the
    previous transaction; the partition is then added again, and the commit is read."""
    topic = new_topic(broker.bootstrap)
    tp = (topic, 0)
    with Producer(broker.bootstrap, transactional_id=f"stale-{topic}") as p:
        p.init_transactions(30)
        p.begin_transaction()
        p.send(topic, b"first")
        p.commit_transaction(30)
        p.begin_transaction()
        tx = p._txn
        ok = types.SimpleNamespace(header={"body": {"results": [
            {"name": topic, "results": [{"partition_index": 0, "partition_error_code": 0}]}]}})
        with tx._lock:
            tx.adding.add(tp)
            tx._early = ([tp], [(ok, None)], time.monotonic() + 30, tx.generation - 1)
        p._acc.wake()  # the sender takes it
        deadline = time.monotonic() + 10
        while tx._early is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tx._early is None
        assert tp not in tx.partitions and tp not in tx.adding
        p.send(topic, b"second")
        p.commit_transaction(30)
    assert read_committed(broker.bootstrap, topic, 2) == [b"first", b"second"]


def state_log_end(bootstrap: str) -> int:
    tp = TopicPartition(STATE_TOPIC, 0)
    with Consumer(bootstrap) as c:
        return c.end_offsets([tp])[tp]


def test_a_finished_transactions_complete_record_waits_for_the_next_transaction_to_replace_it(broker):
    """Two records a transaction (Ongoing, PrepareCommit) while the producer commits again
    within a second: the next transaction's record replaces the CompleteCommit one. The last
    transaction's CompleteCommit is written a second later."""
    topic = new_topic(broker.bootstrap)
    txn_id = f"defer-{topic}"
    with Producer(broker.bootstrap, transactional_id=txn_id) as p:
        p.init_transactions(30)
        time.sleep(1.5)  # nothing of an earlier test's transactions still deferred
        before = state_log_end(broker.bootstrap)
        for i in range(20):
            p.begin_transaction()
            p.send(topic, b"%d" % i)
            p.commit_transaction(30)
        written = state_log_end(broker.bootstrap) - before
        assert written == 40, f"{written} records for 20 transactions (3 each before: 60)"
        cluster = Cluster(broker.bootstrap, "test-describe")
        try:
            assert describe(cluster, txn_id)[1]["transaction_state"] == "CompleteCommit"
            deadline = time.monotonic() + 10
            while state_log_end(broker.bootstrap) - before < 41:
                assert time.monotonic() < deadline, "the last CompleteCommit record was never written"
                time.sleep(0.1)
        finally:
            cluster.close()
    assert read_committed(broker.bootstrap, topic, 20) == [b"%d" % i for i in range(20)]


def test_a_coordinator_killed_before_the_complete_record_writes_the_markers_again(tmp_path):
    """kill -9 right after a commit returned (its CompleteCommit record still deferred): the
    restarted coordinator loads PrepareCommit, writes the markers again and completes; the
    producer's next transaction goes through and every record is read exactly once."""
    port = free_port()
    b = LocalBroker(str(tmp_path / "b"), {"shutdown.timeout.ms": 10000, "listeners": f"PLAINTEXT://127.0.0.1:{port}"},
                    start_timeout=240).start()
    try:
        topic = new_topic(b.bootstrap)
        txn_id = f"killed-{topic}"
        with Producer(b.bootstrap, transactional_id=txn_id) as p:
            p.init_transactions(30)
            p.begin_transaction()
            p.send(topic, b"one")
            p.commit_transaction(30)
            b.kill()
            b.start()
            cluster = Cluster(b.bootstrap, "test-describe")
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        state = describe(cluster, txn_id)[1]["transaction_state"]
                    except Exception:  # noqa: BLE001 - the coordinator still loading
                        state = None
                    if state == "CompleteCommit":
                        break
                    assert time.monotonic() < deadline, f"the reloaded transaction stays {state}"
                    time.sleep(0.2)
            finally:
                cluster.close()
            p.begin_transaction()
            p.send(topic, b"two")
            p.commit_transaction(60)
        assert read_committed(b.bootstrap, topic, 2) == [b"one", b"two"]
    finally:
        b.discard()


def test_perf_txn_commits_every_1000_records_with_each_client_and_reports_commit_latency(broker, capsys):
    """``odradek perf txn`` (the goal's benchmark): each client's own send loop, the
    transactional and the idempotent run of the same records, one JSON line each."""
    import json

    from odradek.bench import txn
    assert txn.main(["--bootstrap-server", broker.bootstrap, "--client", "odradek,confluent", "--num-records", "3000",
                     "--runs", "1", "--baseline", "--json"]) == 0
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert sorted((r["client"], r["transactional"]) for r in runs) == [
        ("confluent", False), ("confluent", True), ("odradek", False), ("odradek", True)]
    for r in runs:
        assert r["records_per_s"] > 0
        assert r["commits"] == (3 if r["transactional"] else 0)
        if r["transactional"]:
            assert 0 < r["commit_p50_ms"] <= r["commit_p99_ms"]
