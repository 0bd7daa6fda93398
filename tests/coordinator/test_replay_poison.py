"""Issue 27, item 1: a record a coordinator cannot read in its internal topic is logged
(topic, partition, offset, why) and skipped, never fatal. The files of ``__consumer_offsets``
and ``__transaction_state`` are poisoned directly (no client can write them any more: see
tests/security/test_internal_topics.py) with well-framed batches the log accepts but the
coordinators cannot read; the broker restarts ready, every group keeps its committed offsets,
and the transactional ids their state. Before the fix the group coordinator's replay raised
on the first of them and the broker never became ready."""
from __future__ import annotations

import os

import msgpack
from confluent_kafka import Consumer as CKConsumer
from confluent_kafka import Producer as CKProducer
from confluent_kafka import TopicPartition as CKTopicPartition

from odradek import Admin
from odradek.actors.names import partition_dir
from odradek.coordinator.offsets import partition_for
from odradek.core.records import HEADER_SIZE, OFFSET_CRC, BatchHeader, crc_of, encode_batch
from odradek.core.protocol import OFFSETS_TOPIC, TXN_STATE_TOPIC
from tests.security.test_internal_topics import commit, committed, topic_with_records

GROUPS = [f"group-{i}" for i in range(12)]


def _undecodable(base_offset: int, epoch: int) -> bytes:
    """A batch with a sound header and CRC whose records are not msgpack."""
    batch = bytearray(encode_batch([(b"k" * 8, b"v" * 32)], compression=None, base_offset=base_offset,
                                   partition_leader_epoch=epoch))
    batch[HEADER_SIZE:] = b"\xc1" * (len(batch) - HEADER_SIZE)
    batch[OFFSET_CRC:OFFSET_CRC + 4] = crc_of(batch, 0, len(batch)).to_bytes(4, "big")
    return bytes(batch)


def _append_poison(directory: str, records: list) -> int:
    """Append, at the end of the partition's active segment, one batch per record and an
    undecodable batch (the log's own recovery accepts them: their framing and CRCs are
    sound). Returns the offset of the first."""
    active = os.path.join(directory, max(n for n in os.listdir(directory) if n.endswith(".log")))
    with open(active, "r+b") as f:
        data = f.read()
        pos, next_offset, epoch = 0, int(os.path.basename(active)[:20]), 0
        while pos + HEADER_SIZE <= len(data):
            h = BatchHeader.read(data, pos)
            if h.batch_length <= 0:
                break
            pos, next_offset, epoch = pos + h.size, h.next_offset, h.partition_leader_epoch
        first = next_offset
        f.seek(pos)
        f.truncate()
        for record in records:
            f.write(encode_batch([record], compression=None, base_offset=next_offset, partition_leader_epoch=epoch))
            next_offset += 1
        f.write(_undecodable(next_offset, epoch))
    return first


def test_unreadable_records_in_the_internal_topics_are_skipped_and_the_broker_restarts_ready(start_broker,
                                                                                              tmp_path):
    data = str(tmp_path / "data")
    broker = start_broker(data)
    topic_with_records(broker.bootstrap, "data", 20)
    for i, group in enumerate(GROUPS):
        commit(broker.bootstrap, group, "data", i + 1)
    txn = CKProducer({"bootstrap.servers": broker.bootstrap, "transactional.id": "poisoned-txn"})
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce("data", b"in a transaction", partition=0)
    txn.commit_transaction(30)
    # What a hostile client can still get into the internal topics: a transaction naming their
    # partitions (its records refused, its abort marker written to __transaction_state), and a
    # commit under an odd group id with 4,000 characters of metadata.
    hostile = CKProducer({"bootstrap.servers": broker.bootstrap, "transactional.id": "hostile-txn"})
    hostile.init_transactions(30)
    hostile.begin_transaction()
    hostile.produce(TXN_STATE_TOPIC, b"forged", partition=0)
    hostile.produce(OFFSETS_TOPIC, b"forged", partition=0)
    hostile.flush(30)
    hostile.abort_transaction(30)
    c = CKConsumer({"bootstrap.servers": broker.bootstrap, "group.id": "odd/group;id:x", "enable.auto.commit": False})
    c.commit(offsets=[CKTopicPartition("data", 0, 2, metadata="m" * 4000)], asynchronous=False)
    c.close()
    with Admin(broker.bootstrap) as admin:
        partitions = len(admin.describe_topic(OFFSETS_TOPIC).partitions)
    broker.stop()

    victim = GROUPS[0]
    target = partition_for(victim, partitions)
    key = msgpack.packb(["o", victim, "data", 0])
    poisoned_at = _append_poison(partition_dir(data, OFFSETS_TOPIC, target), [
        (b"\xc1 not msgpack", b"\xc1"),  # a key that is not msgpack
        (key, msgpack.packb("not a map")),  # the victim's commit, unreadable
        (key, msgpack.packb({"offset": "7"})),  # an offset that is not a number
        (msgpack.packb(["o", [victim], "data", 0]), msgpack.packb({"offset": 3})),  # a key of the wrong shape
        (msgpack.packb(["g", victim]), msgpack.packb({"group": {"classic": 5}})),  # a group it cannot rebuild
        (msgpack.packb(["g", "ghost"]), msgpack.packb({"group": {"members": "x"}, "empty_since_ms": "soon"})),
    ])
    _append_poison(partition_dir(data, TXN_STATE_TOPIC, 0), [
        (b"poisoned-txn", b"\xc1 not msgpack"),
        (b"poisoned-txn", msgpack.packb({"pid": 1, "epoch": 0, "timeout_ms": 1, "updated_ms": 0, "state": 0,
                                         "partitions": [], "groups": [], "started_ms": 0, "offsets": [1]})),
        (b"\xff\xfe", msgpack.packb({"pid": "x"})),
    ])

    broker = start_broker(data)  # raises unless the broker becomes ready
    log = open(broker.stderr_path, errors="replace").read()
    assert f"{OFFSETS_TOPIC}-{target}: offset {poisoned_at} cannot be read, skipped" in log, broker.stderr_tail()
    assert f"{TXN_STATE_TOPIC}-0: offset" in log, broker.stderr_tail()
    for i, group in enumerate(GROUPS):  # the victim's last good commit too
        assert committed(broker.bootstrap, group, "data") == i + 1, group
    assert committed(broker.bootstrap, "odd/group;id:x", "data") == 2
    commit(broker.bootstrap, victim, "data", 15)  # the coordinator serves the poisoned partition
    assert committed(broker.bootstrap, victim, "data") == 15
    txn = CKProducer({"bootstrap.servers": broker.bootstrap, "transactional.id": "poisoned-txn"})
    txn.init_transactions(30)  # its state was read back (a new epoch of the same id)
    txn.begin_transaction()
    txn.produce("data", b"again", partition=0)
    txn.commit_transaction(30)
