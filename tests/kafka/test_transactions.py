"""Kafka transactions against one broker, judged by confluent-kafka (librdkafka): its
transactional producer (FindCoordinator key_type 1, InitProducerId with a transactional id,
AddPartitionsToTxn, EndTxn) and its read_committed / read_uncommitted consumers (the last
stable offset, the aborted-transactions list of a fetch, control batches skipped)."""
from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer as KafkaConsumer, KafkaException, Producer as KafkaProducer, TopicPartition

from odradek import Admin
from odradek.local import LocalBroker


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    """This module's broker sweeps timed-out transactions every 200 ms (not every 10 s)."""
    broker = LocalBroker(str(tmp_path_factory.mktemp("txn-broker")),
                         {"shutdown.timeout.ms": 10000,
                          "transaction.abort.timed.out.transaction.cleanup.interval.ms": 200},
                         start_timeout=240).start()
    try:
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away


def read(bootstrap: str, topic: str, isolation: str, wait: float = 30, expect: int | None = None) -> list[bytes]:
    """Every record of partition 0 the consumer hands out, up to the end it sees."""
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
                       "enable.partition.eof": True, "isolation.level": isolation})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + wait
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                if m.error().code() == -191:  # _PARTITION_EOF
                    if expect is None or len(out) >= expect:
                        break
                    continue
                raise AssertionError(m.error())
            out.append(m.value())
    finally:
        c.close()
    return out


def txn_producer(bootstrap: str, txn_id: str, **extra) -> KafkaProducer:
    p = KafkaProducer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, **extra})
    p.init_transactions(30)
    return p


@pytest.fixture
def txn_topic(bootstrap, topic):
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=1)
    return topic


def test_committed_records_are_read_and_aborted_ones_only_by_read_uncommitted(bootstrap, txn_topic):
    p = txn_producer(bootstrap, f"app-{txn_topic}")
    p.begin_transaction()
    for i in range(5):
        p.produce(txn_topic, value=b"c1-%d" % i, partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    for i in range(5):
        p.produce(txn_topic, value=b"ab-%d" % i, partition=0)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(3):
        p.produce(txn_topic, value=b"c2-%d" % i, partition=0)
    p.commit_transaction(30)
    committed = [b"c1-%d" % i for i in range(5)] + [b"c2-%d" % i for i in range(3)]
    assert read(bootstrap, txn_topic, "read_committed", expect=8) == committed
    assert read(bootstrap, txn_topic, "read_uncommitted", expect=13) == \
        committed[:5] + [b"ab-%d" % i for i in range(5)] + committed[5:]


def test_an_open_transaction_is_invisible_to_read_committed_until_it_commits(bootstrap, txn_topic):
    p = txn_producer(bootstrap, f"app-{txn_topic}")
    p.begin_transaction()
    p.produce(txn_topic, value=b"open", partition=0)
    p.flush(30)
    assert read(bootstrap, txn_topic, "read_committed", wait=3) == []
    assert read(bootstrap, txn_topic, "read_uncommitted", expect=1) == [b"open"]
    p.commit_transaction(30)
    assert read(bootstrap, txn_topic, "read_committed", expect=1) == [b"open"]


def test_a_zombie_producer_with_an_older_epoch_is_fenced(bootstrap, txn_topic):
    txn_id = f"app-{txn_topic}"
    zombie = txn_producer(bootstrap, txn_id)
    zombie.begin_transaction()
    zombie.produce(txn_topic, value=b"zombie", partition=0)
    zombie.flush(30)
    fresh = txn_producer(bootstrap, txn_id)  # aborts the zombie's open transaction, bumps the epoch
    with pytest.raises(KafkaException) as e:
        zombie.commit_transaction(30)
    assert e.value.args[0].fatal() or e.value.args[0].txn_requires_abort(), e.value.args[0]
    fresh.begin_transaction()
    fresh.produce(txn_topic, value=b"fresh", partition=0)
    fresh.commit_transaction(30)
    assert read(bootstrap, txn_topic, "read_committed", expect=1) == [b"fresh"]


def test_a_transaction_left_open_past_its_timeout_is_aborted_by_the_coordinator(bootstrap, txn_topic):
    p = txn_producer(bootstrap, f"app-{txn_topic}", **{"transaction.timeout.ms": 2000})
    p.begin_transaction()
    p.produce(txn_topic, value=b"forgotten", partition=0)
    p.flush(30)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:  # the coordinator's sweep writes the abort marker: the LSO moves on
        c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "unused", "isolation.level": "read_committed"})
        low, high = c.get_watermark_offsets(TopicPartition(txn_topic, 0), timeout=10)
        c.close()
        if high >= 2:
            break
        time.sleep(0.5)
    assert read(bootstrap, txn_topic, "read_committed", wait=3) == []
    assert read(bootstrap, txn_topic, "read_uncommitted", expect=1) == [b"forgotten"]
    with pytest.raises(KafkaException):
        p.commit_transaction(10)


def test_a_broker_killed_and_restarted_keeps_the_transaction_state_and_the_last_stable_offset(tmp_path):
    broker = LocalBroker(str(tmp_path / "broker"), {"shutdown.timeout.ms": 10000}, start_timeout=240).start()
    try:
        with Admin(broker.bootstrap) as admin:
            admin.create_topic("kept", partitions=1)
        p = txn_producer(broker.bootstrap, "app-kept")
        p.begin_transaction()
        for i in range(3):
            p.produce("kept", value=b"c%d" % i, partition=0)
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(2):
            p.produce("kept", value=b"open%d" % i, partition=0)
        p.flush(30)
        broker.kill()  # -9: no clean close, the log tail is recovered
        broker.start()
        committed = [b"c0", b"c1", b"c2"]
        assert read(broker.bootstrap, "kept", "read_committed", wait=5) == committed  # the LSO still holds
        assert read(broker.bootstrap, "kept", "read_uncommitted", expect=5) == committed + [b"open0", b"open1"]
        again = txn_producer(broker.bootstrap, "app-kept")  # the coordinator remembers: aborts the open one
        again.begin_transaction()
        again.produce("kept", value=b"after", partition=0)
        again.commit_transaction(30)
        assert read(broker.bootstrap, "kept", "read_committed", expect=4) == committed + [b"after"]
    finally:
        broker.discard()  # kill -9: its data is thrown away


def test_offsets_sent_to_an_aborted_transaction_are_not_committed_and_to_a_committed_one_are(bootstrap, txn_topic):
    group = f"g-{txn_topic}"
    out = f"{txn_topic}-out"
    with Admin(bootstrap) as admin:
        admin.create_topic(out, partitions=1)
    src = KafkaProducer({"bootstrap.servers": bootstrap})
    for i in range(4):
        src.produce(txn_topic, value=b"in%d" % i, partition=0)
    src.flush(30)
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                       "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.assign([TopicPartition(txn_topic, 0)])
    p = txn_producer(bootstrap, f"app-{txn_topic}")
    try:
        for commit, offset in ((False, 2), (True, 4)):
            p.begin_transaction()
            p.produce(out, value=b"out-%d" % offset, partition=0)
            p.send_offsets_to_transaction([TopicPartition(txn_topic, 0, offset)], c.consumer_group_metadata(), 30)
            if commit:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
            committed = c.committed([TopicPartition(txn_topic, 0)], timeout=30)[0].offset
            assert committed == (4 if commit else -1001), (commit, committed)  # -1001: none committed
    finally:
        c.close()
    assert read(bootstrap, out, "read_committed", expect=1) == [b"out-4"]


def test_kafka_python_transactional_producer_and_its_read_committed_consumer(bootstrap, txn_topic):
    from kafka import KafkaConsumer as KpConsumer, KafkaProducer as KpProducer, TopicPartition as KpTopicPartition
    p = KpProducer(bootstrap_servers=bootstrap, transactional_id=f"kp-{txn_topic}")
    p.init_transactions()
    p.begin_transaction()
    p.send(txn_topic, b"c1", partition=0)
    p.commit_transaction()
    p.begin_transaction()
    p.send(txn_topic, b"a1", partition=0)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    p.send(txn_topic, b"c2", partition=0)
    p.commit_transaction()
    p.close()
    seen = {}
    for isolation in ("read_committed", "read_uncommitted"):
        c = KpConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, auto_offset_reset="earliest",
                       consumer_timeout_ms=3000)
        c.assign([KpTopicPartition(txn_topic, 0)])
        seen[isolation] = [m.value for m in c]
        c.close()
    assert seen == {"read_committed": [b"c1", b"c2"], "read_uncommitted": [b"c1", b"a1", b"c2"]}


def test_an_aborted_transaction_of_the_bundled_producer_is_skipped_by_confluent_kafka_read_committed(
        bootstrap, txn_topic):
    from odradek import Producer
    with Producer(bootstrap, transactional_id=f"bundled-{txn_topic}") as p:  # native batches
        p.init_transactions(30)
        p.begin_transaction()
        p.send(txn_topic, b"aborted")
        p.abort_transaction(30)
        p.begin_transaction()
        p.send(txn_topic, b"kept")
        p.commit_transaction(30)
    assert read(bootstrap, txn_topic, "read_committed", expect=1) == [b"kept"]
    assert read(bootstrap, txn_topic, "read_uncommitted", expect=2) == [b"aborted", b"kept"]


def test_the_bundled_read_committed_consumer_skips_confluent_kafkas_aborted_transaction(bootstrap, txn_topic):
    from odradek import Consumer, TopicPartition as Tp
    p = txn_producer(bootstrap, f"app-{txn_topic}")
    p.begin_transaction()
    p.produce(txn_topic, value=b"aborted", partition=0)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce(txn_topic, value=b"kept", partition=0)
    p.commit_transaction(30)
    seen = {}
    for isolation in ("read_committed", "read_uncommitted"):
        with Consumer(bootstrap, auto_offset_reset="earliest", isolation_level=isolation) as c:
            c.assign([Tp(txn_topic, 0)])
            got, deadline = [], time.monotonic() + 10
            while time.monotonic() < deadline and len(got) < (1 if isolation == "read_committed" else 2):
                got += [r.value for r in c.poll(200)]
            got += [r.value for r in c.poll(500)]
            seen[isolation] = got
    assert seen == {"read_committed": [b"kept"], "read_uncommitted": [b"aborted", b"kept"]}
