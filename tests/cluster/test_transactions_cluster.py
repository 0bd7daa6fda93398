"""Transactions in cluster mode (issue 12): three brokers on ZooKeeper, one cluster for the
module. ``__transaction_state`` is partitioned and replicated; the coordinator of a
transactional id is the leader of its partition (FindCoordinator key_type 1), and it writes
the markers of partitions other brokers lead with WRITE_TXN_MARKERS, whose sender's identity
(broker id and the epoch of its live registration) the receiver checks. Judged by
confluent-kafka's transactional producer and read_committed / read_uncommitted consumers.
The last test kills the coordinator of an open transaction: it must stay last."""
from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer as KafkaConsumer, KafkaException, Producer as KafkaProducer, TopicPartition

from odradek import Admin
from odradek.cli import main
from odradek.cluster import Connection
from odradek.local import LocalCluster
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from tests.cluster.fixtures import TEST_SETTINGS, as_broker

pytestmark = pytest.mark.slow

PARTITIONS = 3
SETTINGS = {**TEST_SETTINGS, "transaction.state.log.num.partitions": 3,
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": 500}


@pytest.fixture(scope="module")
def txn_cluster(zookeeper, tmp_path_factory):
    c = LocalCluster(str(tmp_path_factory.mktemp("txn-cluster")), 3, SETTINGS, zk=zookeeper,
                     chroot=f"/odradek-test-txn-{uuid.uuid4().hex[:8]}")
    try:
        c.start()
        c.wait_ready()
        yield c
    finally:
        c.stop(graceful=False)


def spread_topic(cluster: LocalCluster) -> tuple[str, dict[int, int]]:
    """A topic of ``PARTITIONS`` partitions, RF 3, and ``{partition: leader}`` once each has one."""
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, PARTITIONS, 3)
    deadline = time.monotonic() + 60
    while True:
        leaders = {p: cluster.leader(topic, p) for p in range(PARTITIONS)}
        if all(v is not None for v in leaders.values()):
            return topic, leaders
        assert time.monotonic() < deadline, f"partitions without a leader: {leaders}"
        time.sleep(0.2)


def coordinator_of(cluster: LocalCluster, txn_id: str, key_type: int = 1) -> int:
    """The broker FindCoordinator names for a transactional id (``key_type`` 1) or a group
    (0), retried while the internal topic is created or elected."""
    deadline = time.monotonic() + 60
    b = next(cluster.broker(i) for i in cluster.ids if cluster.broker(i).running)
    while True:
        c = Connection(b.host, b.port)
        c.connect()
        try:
            return c.request(ApiKey.FIND_COORDINATOR, {"key": txn_id, "key_type": key_type}).header["body"]["node_id"]
        except OdradekError as exc:
            assert exc.retriable and time.monotonic() < deadline, exc
        finally:
            c.close()
        time.sleep(0.3)


def txn_producer(bootstrap: str, txn_id: str) -> KafkaProducer:
    p = KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5,
                       "message.timeout.ms": 60000})
    p.init_transactions(90)
    return p


def read(bootstrap: str, topic: str, isolation: str, expect: int, wait: float = 60) -> list[bytes]:
    """The values of every partition, read until ``expect`` records or the end of each."""
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                       "enable.partition.eof": True, "isolation.level": isolation})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline and not (len(out) >= expect and len(at_end) == PARTITIONS):
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == -191, m.error()  # _PARTITION_EOF
                at_end.add(m.partition())
                continue
            at_end.discard(m.partition())
            out.append(m.value())
    finally:
        c.close()
    return out


def test_a_transaction_across_partitions_led_by_different_brokers_commits_or_aborts_as_a_whole(txn_cluster, capsys):
    topic, leaders = spread_topic(txn_cluster)
    txn_id = f"tx-{uuid.uuid4().hex[:8]}"
    p = txn_producer(txn_cluster.bootstrap, txn_id)
    coordinator = coordinator_of(txn_cluster, txn_id)
    remote = [part for part, leader in leaders.items() if leader != coordinator]
    assert remote, f"every partition is led by the coordinator {coordinator}: {leaders}"
    p.begin_transaction()
    for part in range(PARTITIONS):
        p.produce(topic, value=b"aborted-%d" % part, partition=part)
    p.flush(60)
    p.abort_transaction(60)
    p.begin_transaction()
    for part in range(PARTITIONS):
        for i in range(3):
            p.produce(topic, value=b"committed-%d-%d" % (part, i), partition=part)
    p.commit_transaction(60)

    committed = read(txn_cluster.bootstrap, topic, "read_committed", expect=3 * PARTITIONS)
    assert sorted(committed) == sorted(b"committed-%d-%d" % (part, i) for part in range(PARTITIONS) for i in range(3))
    everything = read(txn_cluster.bootstrap, topic, "read_uncommitted", expect=4 * PARTITIONS)
    assert sorted(everything) == sorted(committed + [b"aborted-%d" % part for part in range(PARTITIONS)])

    # odradek transactions finds the id at its coordinator, whichever broker it asks first
    capsys.readouterr()
    assert main(["transactions", "--bootstrap-server", txn_cluster.bootstrap, "list"]) == 0
    listed = [ln.split("\t") for ln in capsys.readouterr().out.splitlines()[1:]]
    assert [r[1:] for r in listed if r[0] == txn_id][0][0] == str(coordinator)
    assert main(["transactions", "--bootstrap-server", txn_cluster.bootstrap, "describe",
                 "--transactional-id", txn_id]) == 0
    row = capsys.readouterr().out.splitlines()[1].split("\t")
    assert (row[0], row[1], row[4]) == (str(coordinator), txn_id, "CompleteCommit")


def test_offsets_sent_to_a_transaction_reach_a_group_coordinated_by_another_broker_on_commit_only(txn_cluster):
    topic, _ = spread_topic(txn_cluster)
    txn_id = f"tx-{uuid.uuid4().hex[:8]}"
    p = txn_producer(txn_cluster.bootstrap, txn_id)
    coordinator = coordinator_of(txn_cluster, txn_id)
    group = next(g for g in (f"g-{uuid.uuid4().hex[:8]}" for _ in range(200))
                 if coordinator_of(txn_cluster, g, key_type=0) != coordinator)
    c = KafkaConsumer({"bootstrap.servers": txn_cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        for offset, commit in ((3, False), (5, True)):
            p.begin_transaction()
            p.produce(topic, value=b"out-%d" % offset, partition=0)
            p.send_offsets_to_transaction([TopicPartition(topic, 1, offset)], c.consumer_group_metadata(), 60)
            if commit:
                p.commit_transaction(60)
            else:
                p.abort_transaction(60)
                assert c.committed([TopicPartition(topic, 1)], timeout=30)[0].offset < 0  # nothing stored
        assert c.committed([TopicPartition(topic, 1)], timeout=30)[0].offset == 5
    finally:
        c.close()


def test_the_bundled_transactional_producer_talks_to_its_coordinator_and_the_groups(txn_cluster):
    """Its transaction requests go to the id's coordinator (not any broker) and its
    TxnOffsetCommit to the group's coordinator, each on a broker other than the first one in
    the bootstrap list; before, it asked any broker and InitProducerId was refused
    NOT_COORDINATOR."""
    from odradek import Producer
    topic, _ = spread_topic(txn_cluster)
    first = txn_cluster.ids[0]
    txn_id = next(t for t in (f"tx-{uuid.uuid4().hex[:8]}" for _ in range(200)) if coordinator_of(txn_cluster, t) != first)
    group = next(g for g in (f"g-{uuid.uuid4().hex[:8]}" for _ in range(200))
                 if coordinator_of(txn_cluster, g, key_type=0) not in (first, coordinator_of(txn_cluster, txn_id)))
    first_broker = txn_cluster.broker(first)
    with Producer(f"{first_broker.host}:{first_broker.port}", transactional_id=txn_id, request_timeout_ms=10000) as p:
        p.init_transactions(60)
        p.begin_transaction()
        for part in range(PARTITIONS):
            p.send(topic, b"bundled-%d" % part, partition=part)
        p.send_offsets_to_transaction({TopicPartition(topic, 1): 7}, group, 60)
        p.commit_transaction(60)
    assert sorted(read(txn_cluster.bootstrap, topic, "read_committed", expect=PARTITIONS)) == \
        sorted(b"bundled-%d" % part for part in range(PARTITIONS))
    c = KafkaConsumer({"bootstrap.servers": txn_cluster.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        assert c.committed([TopicPartition(topic, 1)], timeout=30)[0].offset == 7
    finally:
        c.close()


def test_markers_from_a_broker_that_is_not_who_it_claims_are_refused(txn_cluster):
    topic, leaders = spread_topic(txn_cluster)
    victim = leaders[0]
    claimed = next(b for b in txn_cluster.ids if b != victim)
    b = txn_cluster.broker(victim)
    body = {"broker_id": claimed, "broker_epoch": txn_cluster.kazoo.exists(f"/brokers/ids/{claimed}").czxid,
            "producer_id": 1 << 24, "commit": True, "markers": [[topic, 0, 1 << 24, 0, True, 0]], "offsets": {}}
    c = Connection(b.host, b.port)  # a client, even with the claimed broker's live epoch
    c.connect()
    try:
        with pytest.raises(OdradekError) as refused:
            c.request(ApiKey.WRITE_TXN_MARKERS, body)
    finally:
        c.close()
    assert refused.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    # a connection proved as that broker, with a wrong epoch
    with BrokerConnection(b.host, b.port, security=as_broker(txn_cluster, claimed)) as proven:
        with pytest.raises(OdradekError) as refused:
            proven.request(ApiKey.WRITE_TXN_MARKERS, {**body, "broker_epoch": 12345})
    assert refused.value.code == ErrorCode.STALE_BROKER_EPOCH
    assert f"broker {claimed}" in refused.value.message
    assert read(txn_cluster.bootstrap, topic, "read_uncommitted", expect=0, wait=20) == []


def transaction_state(cluster: LocalCluster, broker: int, txn_id: str) -> str | None:
    """DescribeTransactions of ``txn_id`` asked of ``broker``: its state, None if it does not
    coordinate it (now)."""
    b = cluster.broker(broker)
    c = Connection(b.host, b.port)
    c.connect()
    try:
        (state,) = c.request(ApiKey.DESCRIBE_TRANSACTIONS,
                             {"transactional_ids": [txn_id]}).header["body"]["transaction_states"]
    finally:
        c.close()
    return state["transaction_state"] if state["error_code"] == 0 else None


def test_a_commit_whose_coordinator_dies_before_its_markers_are_written_is_finished_by_its_successor(
        txn_cluster):
    """The coordinator is killed -9 while it holds PrepareCommit and a marker cannot be written
    (the only replica of one partition is frozen): the broker that takes over its
    ``__transaction_state`` partition must write the missing markers, and every record of the
    transaction is read exactly once by read_committed. The killed broker is restarted, so the
    module's cluster stays whole for the last test."""
    spread, _ = spread_topic(txn_cluster)
    txn_id = f"tx-{uuid.uuid4().hex[:8]}"
    coordinator = coordinator_of(txn_cluster, txn_id)
    single = f"s-{uuid.uuid4().hex[:8]}"  # RF 1: a frozen leader's partition cannot move
    with Admin(txn_cluster.bootstrap) as admin:
        admin.create_topic(single, 3, 1, config={"min.insync.replicas": 1})
    leaders = txn_cluster.wait_for(
        lambda: (lambda ls: ls if all(v is not None for v in ls.values()) else None)(
            {p: txn_cluster.leader(single, p) for p in range(3)}), 60, "leaders of the RF 1 topic")
    held = next((p for p, b in leaders.items() if b != coordinator), None)
    if held is None:
        pytest.skip(f"every partition of {single} landed on the coordinator {coordinator}")
    frozen = leaders[held]

    p = txn_producer(txn_cluster.bootstrap, txn_id)
    p.begin_transaction()
    values = [b"spread-%d" % part for part in range(PARTITIONS)] + [b"held"]
    for part in range(PARTITIONS):
        p.produce(spread, value=values[part], partition=part)
    p.produce(single, value=b"held", partition=held)
    p.flush(60)
    outcome: dict = {}

    def commit() -> None:
        deadline = time.monotonic() + 150
        while True:  # confluent-kafka: a retriable commit error is retried by calling commit again
            try:
                p.commit_transaction(60)
                outcome["ok"] = True
                return
            except KafkaException as exc:
                if not exc.args[0].retriable() or time.monotonic() > deadline:
                    outcome["error"] = exc
                    return

    txn_cluster.pause(frozen)
    committer = threading.Thread(target=commit, daemon=True)
    try:
        committer.start()
        txn_cluster.wait_for(lambda: transaction_state(txn_cluster, coordinator, txn_id) == "PrepareCommit", 60,
                             "the coordinator to hold PrepareCommit")
        txn_cluster.kill(coordinator)
    finally:
        txn_cluster.resume(frozen)
    committer.join(180)
    assert outcome.get("ok"), outcome
    got = read(txn_cluster.bootstrap, spread, "read_committed", expect=PARTITIONS)
    assert sorted(got) == sorted(values[:PARTITIONS])
    c = KafkaConsumer({"bootstrap.servers": txn_cluster.bootstrap, "group.id": "unused",
                       "enable.auto.commit": False, "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(single, held, 0)])
        m = c.poll(60)
        assert m is not None and m.error() is None and m.value() == b"held"
    finally:
        c.close()
    txn_cluster.restart(coordinator)
    txn_cluster.wait_ready(60)


def test_the_successor_of_a_killed_coordinator_aborts_its_open_transaction(txn_cluster):
    """Last in the module: it kills a broker (the coordinator of the transactional id)."""
    topic, _ = spread_topic(txn_cluster)
    txn_id = f"tx-{uuid.uuid4().hex[:8]}"
    p = txn_producer(txn_cluster.bootstrap, txn_id)
    p.begin_transaction()
    p.produce(topic, value=b"before", partition=0)
    p.commit_transaction(60)
    p.begin_transaction()
    for part in range(PARTITIONS):
        p.produce(topic, value=b"open-%d" % part, partition=part)
    p.flush(60)  # written (acks=all) to every partition, and left open
    coordinator = coordinator_of(txn_cluster, txn_id)
    txn_cluster.kill(coordinator)

    successor = txn_producer(txn_cluster.bootstrap, txn_id)  # retries until the new coordinator loaded the id
    deadline = time.monotonic() + 30  # the broker asked may learn the new leader a moment later
    while coordinator_of(txn_cluster, txn_id) == coordinator:
        assert time.monotonic() < deadline, f"FindCoordinator still names the killed broker {coordinator}"
        time.sleep(0.3)
    successor.begin_transaction()
    for part in range(PARTITIONS):
        successor.produce(topic, value=b"after-%d" % part, partition=part)
    successor.commit_transaction(60)

    committed = read(txn_cluster.bootstrap, topic, "read_committed", expect=1 + PARTITIONS)
    assert sorted(committed) == sorted([b"before"] + [b"after-%d" % part for part in range(PARTITIONS)])
