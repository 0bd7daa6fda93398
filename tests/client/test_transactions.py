"""Transactions with the bundled clients against a real broker: Producer(transactional_id=...)
and Consumer(isolation_level=...): aborted records, control records, zombie fencing, the
coordinator's timeout, and a consume-transform-produce loop killed -9 before its commit
(issue 12)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest

from odradek import Admin, Consumer, Producer, TopicPartition
from odradek.errors import ProducerFencedError
from odradek.local import LocalBroker

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = LocalBroker(str(tmp_path_factory.mktemp("txn-client")),
                    {"shutdown.timeout.ms": 10000,
                     "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200}, start_timeout=240).start()
    try:
        yield b
    finally:
        b.discard()  # kill -9: its data is thrown away


@pytest.fixture
def topic(broker) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(name, partitions=1)
    return name


def read_all(bootstrap: str, topic: str, isolation: str, settle: float = 1.5) -> list:
    """Every record the consumer hands out until nothing new came for ``settle`` seconds."""
    out = []
    with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation) as c:
        c.assign([TopicPartition(topic, 0)])
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < settle:
            got = c.poll(200)
            if got:
                out += got
                quiet_since = time.monotonic()
    return out


def test_aborted_records_reach_read_uncommitted_only_and_control_records_reach_nobody(broker, topic):
    with Producer(broker.bootstrap, transactional_id=f"app-{topic}") as p:
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(3):
            p.send(topic, b"c%d" % i)
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(3):
            p.send(topic, b"a%d" % i)
        p.abort_transaction(30)
        p.begin_transaction()
        p.send(topic, b"last")
        p.commit_transaction(30)
    committed = read_all(broker.bootstrap, topic, "read_committed")
    assert [r.value for r in committed] == [b"c0", b"c1", b"c2", b"last"]
    everything = read_all(broker.bootstrap, topic, "read_uncommitted")
    assert [r.value for r in everything] == [b"c0", b"c1", b"c2", b"a0", b"a1", b"a2", b"last"]
    # offsets 3 and 7 are the markers: handed to nobody, in either mode
    assert [r.offset for r in everything] == [0, 1, 2, 4, 5, 6, 8]


def test_send_outside_a_transaction_is_refused_saying_what_to_call(broker, topic):
    with Producer(broker.bootstrap, transactional_id=f"app-{topic}") as p:
        with pytest.raises(ValueError, match="init_transactions"):
            p.send(topic, b"x")
        p.init_transactions(30)
        with pytest.raises(ValueError, match="begin_transaction"):
            p.send(topic, b"x")


def test_a_zombie_producer_is_fenced_and_must_stop(broker, topic):
    zombie = Producer(broker.bootstrap, transactional_id=f"app-{topic}")
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.send(topic, b"zombie")
    zombie.flush(30)
    with Producer(broker.bootstrap, transactional_id=f"app-{topic}") as fresh:
        fresh.init_transactions(30)  # aborts the zombie's transaction, bumps the epoch
        with pytest.raises(ProducerFencedError):
            zombie.commit_transaction(30)
        with pytest.raises(ProducerFencedError):
            zombie.begin_transaction()  # fatal: every later call says so
        fresh.begin_transaction()
        fresh.send(topic, b"fresh")
        fresh.commit_transaction(30)
    zombie.close(5)
    assert [r.value for r in read_all(broker.bootstrap, topic, "read_committed")] == [b"fresh"]


def test_a_transaction_open_past_its_timeout_is_aborted_and_its_producer_fenced(broker, topic):
    p = Producer(broker.bootstrap, transactional_id=f"app-{topic}", transaction_timeout_ms=1000)
    p.init_transactions(30)
    p.begin_transaction()
    p.send(topic, b"forgotten")
    p.flush(30)
    time.sleep(2.5)
    with pytest.raises(ProducerFencedError):
        p.commit_transaction(30)
    p.close(5)
    assert read_all(broker.bootstrap, topic, "read_committed") == []
    assert [r.value for r in read_all(broker.bootstrap, topic, "read_uncommitted")] == [b"forgotten"]


def test_a_consume_transform_produce_loop_killed_before_its_commit_emits_every_input_once(broker, topic):
    src, dst, total = topic, f"{topic}-out", 60
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(dst, partitions=1)
    with Producer(broker.bootstrap) as p:
        for i in range(total):
            p.send(src, b"in-%03d" % i, partition=0)
    args = [sys.executable, "-m", "tests.client.txn_loop", broker.bootstrap, src, dst, f"g-{topic}",
            f"loop-{topic}", str(total)]
    killed = subprocess.run(args + ["3"], cwd=ROOT, timeout=120, capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    rest = subprocess.run(args, cwd=ROOT, timeout=120, capture_output=True)
    assert rest.returncode == 0, rest.stderr.decode()[-2000:]
    out = [r.value for r in read_all(broker.bootstrap, dst, "read_committed")]
    assert out == [b"IN-%03d" % i for i in range(total)]
    dirty = [r.value for r in read_all(broker.bootstrap, dst, "read_uncommitted")]
    assert len(dirty) > total  # the killed transaction's output is in the log, aborted


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_transaction_with_offsets_survives_a_broker_kill_before_its_commit(tmp_path):
    port = free_port()  # the restarted broker listens where the producer's connections went
    b = LocalBroker(str(tmp_path / "b"), {"shutdown.timeout.ms": 10000, "listeners": f"PLAINTEXT://127.0.0.1:{port}"},
                    start_timeout=240).start()
    try:
        with Admin(b.bootstrap) as admin:
            admin.create_topic("src", partitions=1)
            admin.create_topic("dst", partitions=1)
        with Consumer(b.bootstrap, group_id="g-kill", enable_auto_commit=False) as c, \
                Producer(b.bootstrap, transactional_id="app-kill") as p:
            p.init_transactions(30)
            p.begin_transaction()
            p.send("dst", b"out", partition=0)
            p.send_offsets_to_transaction({TopicPartition("src", 0): 5}, c.group_metadata(), 30)
            p.flush(30)
            b.kill()  # -9 between send_offsets_to_transaction and the commit
            b.start()
            p.commit_transaction(60)  # the coordinator reloaded the open transaction, offsets included
            assert c.committed(TopicPartition("src", 0)) == 5
        assert [r.value for r in read_all(b.bootstrap, "dst", "read_committed")] == [b"out"]
    finally:
        b.discard()  # kill -9: its data is thrown away


def test_the_end_offset_of_a_read_committed_consumer_is_the_last_stable_offset(broker, topic):
    with Producer(broker.bootstrap) as plain:
        plain.send(topic, b"before").result(10)
    p = Producer(broker.bootstrap, transactional_id=f"app-{topic}")
    p.init_transactions(30)
    p.begin_transaction()
    p.send(topic, b"open")
    p.flush(30)
    tp = TopicPartition(topic, 0)
    with Consumer(broker.bootstrap, isolation_level="read_committed") as c:
        assert c.end_offsets([tp]) == {tp: 1}
    with Consumer(broker.bootstrap) as c:
        assert c.end_offsets([tp]) == {tp: 2}
    p.commit_transaction(30)
    p.close(5)
    with Consumer(broker.bootstrap, isolation_level="read_committed") as c:
        assert c.end_offsets([tp]) == {tp: 3}


def test_a_partition_joins_the_transaction_when_its_first_batch_opens_before_the_batch_is_sent(broker, topic):
    """AddPartitionsToTxn goes while the batch fills (issue 12's commit path): the
    coordinator has the partition in the transaction although the batch, lingering for a
    minute, has not been sent; the commit then makes the records visible."""
    from odradek.cluster import Cluster
    from odradek.transactions import describe
    txn_id = f"early-{topic}"
    with Producer(broker.bootstrap, transactional_id=txn_id, linger_ms=60000) as p:
        p.init_transactions(30)
        p.begin_transaction()
        handle = p.send(topic, b"early")
        cluster = Cluster(broker.bootstrap, "test-describe")
        try:
            deadline = time.monotonic() + 30
            while True:
                _, state = describe(cluster, txn_id)
                if state["transaction_state"] == "Ongoing":
                    break
                assert time.monotonic() < deadline, f"the partition was not added while the batch lingered: {state}"
                time.sleep(0.1)
        finally:
            cluster.close()
        assert state["topics"] == [{"topic": topic, "partitions": [0]}]
        assert not handle.done()  # still lingering: the partition was added before its batch went
        p.commit_transaction(30)
        assert handle.done() and handle.exception() is None
    assert [r.value for r in read_all(broker.bootstrap, topic, "read_committed")] == [b"early"]
