"""The pipelined commit (docs/TRANSACTIONS.md, "The commit path"): the bundled producer writes
EndTxn right behind a transaction's last batches, naming each partition's last sequence
still unacknowledged (``expect``), and the coordinator commits only once those partitions'
log actors confirm the batches are written and replicated. Checked against a real broker:
EndTxn really leaves before the produce answers, every record is read once, a check that
cannot hold leaves the transaction open and the commit falls back to the usual order, and a
fenced producer is still fenced."""
from __future__ import annotations

import contextlib
import time

import pytest

from odradek import Producer
from odradek.cluster import Cluster, Connection
from odradek.coordinator.txn_pipeline import TXN_CHECK_WAIT_MS
from odradek.errors import ProducerFencedError
from odradek.log.log_actor import TXN_HOLD
from odradek.core.protocol import ApiKey, ErrorCode
from odradek.transactions import describe
from tests.client.test_txn_commit_path import new_topic, read_committed


@pytest.fixture
def wire(monkeypatch):
    """Every EndTxn a connection writes and every EndTxn or produce answer it reads, in order:
    ``(time, "sent" | "answer", api, body of a sent one, error code of an answer or None)``."""
    seen: list = []
    original = Connection.send

    def send(self, api, body, frames=(), callback=None, **kw):
        if api not in (ApiKey.END_TXN, ApiKey.PRODUCE) or callback is None:
            return original(self, api, body, frames, callback, **kw)
        if api == ApiKey.END_TXN:
            seen.append((time.monotonic(), "sent", api, body, None))

        def answered(frame, err, _cb=callback, _api=api):
            seen.append((time.monotonic(), "answer", _api, None, None if err is None else err.code))
            return _cb(frame, err)
        return original(self, api, body, frames, answered, **kw)

    monkeypatch.setattr(Connection, "send", send)
    return seen


def test_end_txn_leaves_before_the_produce_answers_and_every_record_is_read_once(shared_broker, wire):
    """Without the pipelined commit, EndTxn is sent only once every produce answer came. (The
    producer's first transaction opens its connection to the coordinator: it commits the
    usual way.)"""
    topic = new_topic(shared_broker.bootstrap)
    with warmed_producer(shared_broker.bootstrap, f"pipe-{topic}", topic, b"first") as p:
        wire.clear()
        for t in range(20):
            p.begin_transaction()
            for i in range(300):
                p.send(topic, b"%d-%d" % (t, i))
            wire.append((time.monotonic(), "commit", None, None, None))
            p.commit_transaction(30)
    commits = 0
    for n, event in enumerate(wire):
        if event[1] != "commit":
            continue
        following = wire[n + 1:]
        following = following[:next((k for k, e in enumerate(following) if e[1] == "commit"), len(following))]
        ends = [e for e in following if e[1] == "sent"]
        produce_answers = [e for e in following if e[1] == "answer" and e[2] == ApiKey.PRODUCE]
        assert len(ends) == 1 and ends[0][3].get("expect") == [[topic, 0, ends[0][3]["expect"][0][2]]], ends
        assert produce_answers and ends[0][0] < produce_answers[-1][0], \
            "EndTxn was written only after the transaction's last produce answer"
        commits += 1
    assert commits == 20
    # sequences: the first record has 0, then 300 records a transaction
    expected = [e[3]["expect"][0][2] for e in wire if e[1] == "sent"]
    assert expected == [300 * (n + 1) for n in range(20)]
    values = read_committed(shared_broker.bootstrap, topic, 6001)
    assert values == [b"first"] + [b"%d-%d" % (t, i) for t in range(20) for i in range(300)]


@contextlib.contextmanager
def warmed_producer(bootstrap: str, txn_id: str, topic: str, first: bytes):
    """A transactional producer past its first transaction (``first`` committed the usual
    way: that one opens its connection to the coordinator, which the pipelined commit uses)."""
    with Producer(bootstrap, transactional_id=txn_id, linger_ms=200) as p:
        p.init_transactions(30)
        p.begin_transaction()
        p.send(topic, first)
        p.commit_transaction(30)
        yield p


def txn_state(bootstrap: str, txn_id: str) -> str:
    cluster = Cluster(bootstrap, "test-describe")
    try:
        return describe(cluster, txn_id)[1].get("transaction_state")
    finally:
        cluster.close()


@pytest.fixture
def lying_expect(wire, monkeypatch):
    """EndTxn's ``expect`` names one sequence past what was sent (after ``wire`` records it)."""
    original = Connection.send

    def lying(self, api, body, frames=(), callback=None, **kw):
        if api == ApiKey.END_TXN and body.get("expect"):
            body = {**body, "expect": [[t, p, s + 1] for t, p, s in body["expect"]]}
        return original(self, api, body, frames, callback, **kw)

    monkeypatch.setattr(Connection, "send", lying)


def test_a_check_that_cannot_hold_leaves_the_transaction_open_and_the_commit_falls_back(shared_broker, wire, lying_expect):
    """EndTxn names a sequence one past what was sent: the partition's log actor never sees
    it, the coordinator answers CONCURRENT_TRANSACTIONS after its wait, the transaction is
    still open meanwhile, and the producer commits it the usual way once its records are
    acknowledged: each record read once."""
    topic = new_topic(shared_broker.bootstrap)
    txn_id = f"lie-{topic}"
    with warmed_producer(shared_broker.bootstrap, txn_id, topic, b"first") as p:
        wire.clear()
        p.begin_transaction()
        for i in range(100):
            p.send(topic, b"%d" % i)
        started = time.monotonic()
        p.commit_transaction(30)
        took = time.monotonic() - started
        states = [txn_state(shared_broker.bootstrap, txn_id)]
    ends = [(e[1], e[3], e[4]) for e in wire if e[2] == ApiKey.END_TXN]
    assert [e[0] for e in ends] == ["sent", "answer", "sent", "answer"], ends
    assert "expect" in ends[0][1] and ends[1][2] == ErrorCode.CONCURRENT_TRANSACTIONS
    assert "expect" not in ends[2][1] and ends[3][2] is None
    assert took >= TXN_CHECK_WAIT_MS / 1000 * 0.9
    assert states == ["CompleteCommit"]
    assert read_committed(shared_broker.bootstrap, topic, 101) == [b"first"] + [b"%d" % i for i in range(100)]


def test_a_refused_check_writes_nothing_and_the_transaction_can_still_be_aborted(shared_broker, lying_expect):
    """A refused check leaves the transaction open, nothing of it committed: an abort then
    aborts it, and read_committed never sees its records."""
    from odradek.consumer import Consumer
    from odradek.types import TopicPartition
    topic = new_topic(shared_broker.bootstrap)
    txn_id = f"refused-{topic}"
    with warmed_producer(shared_broker.bootstrap, txn_id, topic, b"kept") as p:
        p.begin_transaction()
        for i in range(10):
            p.send(topic, b"dropped-%d" % i)
        assert p._txn._commit_pipelined(30) is False  # refused: not committed
        p.abort_transaction(30)
        assert txn_state(shared_broker.bootstrap, txn_id) == "CompleteAbort"
    assert read_committed(shared_broker.bootstrap, topic, 1) == [b"kept"]
    with Consumer(shared_broker.bootstrap, auto_offset_reset="earliest") as c:  # read_uncommitted: all of it
        c.assign([TopicPartition(topic, 0)])
        seen, deadline = [], time.monotonic() + 20
        while len(seen) < 11 and time.monotonic() < deadline:
            seen += [r.value for r in c.poll(200)]
    assert seen == [b"kept"] + [b"dropped-%d" % i for i in range(10)]


def test_a_fenced_producer_is_fenced_by_its_pipelined_commit(shared_broker):
    topic = new_topic(shared_broker.bootstrap)
    txn_id = f"zombie-{topic}"
    with warmed_producer(shared_broker.bootstrap, txn_id, topic, b"zombie-0") as zombie:
        zombie.begin_transaction()
        for i in range(50):
            zombie.send(topic, b"zombie-%d" % (i + 1))
        with Producer(shared_broker.bootstrap, transactional_id=txn_id) as successor:
            successor.init_transactions(30)  # fences the zombie, aborts its open transaction
            with pytest.raises(ProducerFencedError):
                zombie.commit_transaction(30)
            successor.begin_transaction()
            successor.send(topic, b"successor")
            successor.commit_transaction(30)
    assert read_committed(shared_broker.bootstrap, topic, 2) == [b"zombie-0", b"successor"]


# ---- a batch sent before its partition's AddPartitionsToTxn was answered (``txn_unverified``) ----
def _txn_batch(pid: int, epoch: int, seq: int, values: list) -> bytes:
    import zlib
    from odradek.core import records as fmt
    data = bytearray(fmt.encode_batch([(None, v) for v in values], producer_id=pid, producer_epoch=epoch,
                                      base_sequence=seq))
    data[fmt.OFFSET_ATTRIBUTES + 1] |= fmt.TRANSACTIONAL_BIT
    data[fmt.OFFSET_CRC:fmt.OFFSET_CRC + 4] = zlib.crc32(bytes(data[fmt.CRC_START:])).to_bytes(4, "big")
    return bytes(data)


def _produce(conn: Connection, topic: str, batch: bytes, unverified: bool, txn_id: str) -> dict:
    body = {"acks": -1, "timeout_ms": 10000, "transactional_id": txn_id,
            "topics": [{"name": topic, "partitions": [{"index": 0, "frame": 0}]}]}
    if unverified:
        body["txn_unverified"] = True
    return conn.request(ApiKey.PRODUCE, body, [batch], timeout=15).header["body"]["topics"][0]["partitions"][0]


def test_a_batch_sent_before_its_partition_joined_the_transaction_is_appended_only_once_it_has(shared_broker):
    """Never a hanging transaction: a transactional batch marked ``txn_unverified`` whose
    partition the coordinator has not stored in the producer's transaction is not appended
    (refused, retriable, after the hold); once AddPartitionsToTxn stored it, the same batch is
    appended. Without the hold it would be written at once, in a transaction no marker would
    ever close."""
    topic = new_topic(shared_broker.bootstrap)
    txn_id = f"held-{topic}"
    cluster = Cluster(shared_broker.bootstrap, "test-held")
    try:
        coordinator = cluster.request(ApiKey.FIND_COORDINATOR, {"key": txn_id, "key_type": 1}).header["body"]
        conn = Connection(coordinator["host"], coordinator["port"])
        conn.connect()
        init = conn.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": txn_id, "transaction_timeout_ms": 60000,
                                                      "producer_id": -1, "producer_epoch": -1}).header["body"]
        pid, epoch = init["producer_id"], init["producer_epoch"]
        batch = _txn_batch(pid, epoch, 0, [b"a", b"b"])
        started = time.monotonic()
        refused = _produce(conn, topic, batch, unverified=True, txn_id=txn_id)
        held_for = time.monotonic() - started
        assert refused["error_code"] == ErrorCode.CONCURRENT_TRANSACTIONS, refused
        assert held_for >= TXN_HOLD * 0.9  # it waited for the coordinator's word, then gave up
        end = cluster.request(ApiKey.LIST_OFFSETS, {"isolation_level": 0, "topics": [
            {"name": topic, "partitions": [{"index": 0, "timestamp": -1}]}]}).header["body"]
        assert end["topics"][0]["partitions"][0]["offset"] == 0, "the held batch was written"
        added = conn.request(ApiKey.ADD_PARTITIONS_TO_TXN, {"transactional_id": txn_id, "producer_id": pid,
                                                            "producer_epoch": epoch,
                                                            "topics": [{"name": topic, "partitions": [0]}]})
        assert added.header["body"]["results"][0]["results"][0]["partition_error_code"] == 0
        started = time.monotonic()
        written = _produce(conn, topic, batch, unverified=True, txn_id=txn_id)
        assert written["error_code"] == 0 and written["base_offset"] == 0, written
        assert time.monotonic() - started < TXN_HOLD / 2  # the word came with the stored partition: no wait
        ended = conn.request(ApiKey.END_TXN, {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch,
                                              "committed": True}).header["body"]
        assert ended["error_code"] == 0
        conn.close()
    finally:
        cluster.close()
    assert read_committed(shared_broker.bootstrap, topic, 2) == [b"a", b"b"]
