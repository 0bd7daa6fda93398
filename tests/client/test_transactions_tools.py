"""``odradek transactions`` (like kafka-transactions.sh) against a real broker: list and
describe transactional ids, describe a partition's producers, find a hanging transaction (a
transactional batch no coordinator knows about) without flagging a transaction its
coordinator has open, and abort it; and the same admin APIs (ListTransactions,
DescribeTransactions, DescribeProducers) on the Kafka listener, encoded from Kafka's schemas."""
from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest

from odradek import Admin, Producer
from odradek.cli import main
from odradek.cluster import Connection
from odradek.local import LocalBroker
from odradek.core import records as fmt
from odradek.core.records import encode_batch
from odradek.core.kafka import schema
from odradek.core.protocol import ApiKey, ErrorCode


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = LocalBroker(str(tmp_path_factory.mktemp("txn-tools")), {"shutdown.timeout.ms": 10000},
                    start_timeout=240).start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def topic(broker) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(name, partitions=2)
    return name


def run(capsys, broker, *argv) -> tuple[int, list[list[str]], str]:
    """``odradek transactions ...``: (exit code, tab-separated rows after the header, stderr)."""
    code = main(["transactions", "--bootstrap-server", broker.bootstrap, *argv])
    out, err = capsys.readouterr()
    lines = [line.split("\t") for line in out.splitlines()]
    return code, lines[1:], err


def hanging_batch(broker, topic: str, partition: int) -> int:
    """A transactional batch of a producer id no transactional id owns (its coordinator never
    heard of it, as after a lost AddPartitionsToTxn): nothing will ever end it. Its offset."""
    c = Connection(broker.host, broker.port)
    c.connect()
    try:
        pid = c.request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                                  "producer_id": -1, "producer_epoch": -1}).header["body"]["producer_id"]
        batch = bytearray(encode_batch([(None, b"stuck")], compression=None, producer_id=pid, producer_epoch=0,
                                       base_sequence=0))
        batch[fmt.OFFSET_ATTRIBUTES + 1] |= fmt.TRANSACTIONAL_BIT
        struct.pack_into(">I", batch, fmt.OFFSET_CRC, fmt.crc_of(batch, 0, len(batch)))
        body = {"acks": -1, "timeout_ms": 5000, "transactional_id": "never-initialised",  # a name, unchecked then
                "topics": [{"name": topic, "partitions": [{"index": partition, "frame": 0}]}]}
        answer = c.request(ApiKey.PRODUCE, body, [bytes(batch)]).header["body"]["topics"][0]["partitions"][0]
        assert answer["error_code"] == 0, answer
        return answer["base_offset"]
    finally:
        c.close()


def test_list_and_describe_show_a_committed_transactional_id(broker, topic, capsys):
    txn_id = f"app-{topic}"
    with Producer(broker.bootstrap, transactional_id=txn_id) as p:
        p.init_transactions(30)
        p.begin_transaction()
        p.send(topic, b"x", partition=1)
        p.commit_transaction(30)
    code, rows, _ = run(capsys, broker, "list")
    assert code == 0
    assert [txn_id, "0"] == [r for r in rows if r[0] == txn_id][0][:2]
    assert [r for r in rows if r[0] == txn_id][0][3] == "CompleteCommit"
    code, rows, _ = run(capsys, broker, "describe", "--transactional-id", txn_id)
    assert code == 0 and len(rows) == 1
    coordinator, tid, pid, epoch, state = rows[0][:5]
    assert (coordinator, tid, state) == ("0", txn_id, "CompleteCommit") and int(pid) > 0 and epoch == "0"
    assert rows[0][8] == f"{topic}-1"


def test_describe_of_an_unknown_transactional_id_says_it_is_not_found(broker, capsys):
    code, _, err = run(capsys, broker, "describe", "--transactional-id", "never-seen")
    assert code == 1 and "TRANSACTIONAL_ID_NOT_FOUND" in err and "never-seen" in err


def test_find_hanging_flags_an_unowned_open_transaction_not_one_its_coordinator_has_open_and_abort_ends_it(
        broker, topic, capsys):
    stuck_at = hanging_batch(broker, topic, 0)
    with Producer(broker.bootstrap, transactional_id=f"open-{topic}") as p:
        p.init_transactions(30)
        p.begin_transaction()
        p.send(topic, b"open", partition=0)
        p.flush(30)  # open, and known to its coordinator
        time.sleep(0.05)  # both older than the 0-minute threshold below
        code, rows, _ = run(capsys, broker, "describe-producers", "--topic", topic, "--partition", "0")
        assert code == 0
        assert sorted(r[5] for r in rows) == sorted([str(stuck_at), str(stuck_at + 1)])

        code, rows, _ = run(capsys, broker, "find-hanging", "--topic", topic, "--max-transaction-timeout", "0")
        assert code == 0
        assert [(r[0], r[1], r[4]) for r in rows] == [(topic, "0", str(stuck_at))]

        code, _, err = run(capsys, broker, "abort", "--topic", topic, "--partition", "0", "--start-offset", "999")
        assert code == 1 and "no transaction is open at offset 999" in err
        code, _, _ = run(capsys, broker, "abort", "--topic", topic, "--partition", "0", "--start-offset",
                         str(stuck_at))
        assert code == 0
        code, rows, _ = run(capsys, broker, "find-hanging", "--topic", topic, "--max-transaction-timeout", "0")
        assert rows == []
        p.commit_transaction(30)
    code, rows, _ = run(capsys, broker, "describe-producers", "--topic", topic, "--partition", "0")
    assert [r[5] for r in rows] == ["None", "None"]  # nothing open: the last stable offset moves on


def kafka_call(broker, api: int, version: int, body: dict) -> dict:
    """One request on the Kafka listener, encoded and decoded with Kafka's schemas (kio)."""
    client = b"test"
    head = struct.pack(">hhih", api, version, 7, len(client)) + client
    if schema.request_header_flexible(api, version):
        head += b"\x00"
    msg = head + schema.encode_request(api, version, body)
    with socket.create_connection((broker.host, broker.port), timeout=10) as s:
        s.sendall(struct.pack(">i", len(msg)) + msg)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
            chunk = s.recv(65536)
            assert chunk, "connection closed"
            data += chunk
    skip = 9 if schema.response_header_flexible(api, version) else 8
    return schema.decode_response(api, version, data[skip:])


def test_the_kafka_listener_serves_list_and_describe_transactions_and_describe_producers(broker, topic):
    txn_id = f"kafka-{topic}"
    with Producer(broker.bootstrap, transactional_id=txn_id) as p:
        p.init_transactions(30)
        p.begin_transaction()
        p.send(topic, b"k", partition=0)
        p.flush(30)
        listed = kafka_call(broker, ApiKey.LIST_TRANSACTIONS, 1, {"state_filters": ["Ongoing", "Nonsense"],
                                                                   "producer_id_filters": [], "duration_filter": -1})
        assert listed["error_code"] == 0 and listed["unknown_state_filters"] == ["Nonsense"]
        mine = [s for s in listed["transaction_states"] if s["transactional_id"] == txn_id]
        assert len(mine) == 1 and mine[0]["transaction_state"] == "Ongoing"
        described = kafka_call(broker, ApiKey.DESCRIBE_TRANSACTIONS, 0,
                               {"transactional_ids": [txn_id, "never-seen"]})["transaction_states"]
        assert described[0]["error_code"] == 0 and described[0]["producer_id"] == mine[0]["producer_id"]
        assert [(t["topic"], list(t["partitions"])) for t in described[0]["topics"]] == [(topic, [0])]
        assert described[1]["error_code"] == ErrorCode.TRANSACTIONAL_ID_NOT_FOUND
        producers = kafka_call(broker, ApiKey.DESCRIBE_PRODUCERS, 0,
                               {"topics": [{"name": topic, "partition_indexes": [0]}]})
        part = producers["topics"][0]["partitions"][0]
        assert part["error_code"] == 0
        assert [(a["producer_id"], a["current_txn_start_offset"]) for a in part["active_producers"]] == \
            [(mine[0]["producer_id"], 0)]
        p.commit_transaction(30)


def test_dump_log_shows_markers_producer_snapshots_and_the_aborted_transactions_index(tmp_path, capsys):
    from odradek.core import kafka_batch
    from odradek.core.config import LogConfig
    from odradek.log.log import Log
    from odradek.core.records import Record

    def txn_batch(pid: int, seq: int) -> bytes:
        recs = [Record(i, 1_700_000_000_000, None, b"v%d" % (seq + i), []) for i in range(2)]
        return kafka_batch.encode(recs, base_offset=0, first_timestamp=1_700_000_000_000,
                                  max_timestamp=1_700_000_000_000, attributes=kafka_batch.TRANSACTIONAL_BIT,
                                  producer_id=pid, producer_epoch=3, base_sequence=seq)

    part = tmp_path / "t-0"
    lg = Log(str(part), LogConfig())
    lg.append(txn_batch(7000, 0))                            # 0..1
    lg.append_marker(7000, 3, commit=False, coordinator_epoch=5)  # 2
    lg.append(txn_batch(8000, 0))                            # 3..4
    lg.append_marker(8000, 3, commit=True, coordinator_epoch=5)   # 5
    lg.append(txn_batch(9000, 0))                            # 6..7, left open
    lg.close()  # writes the producer snapshot

    assert main(["dump-log", str(part)]) == 0
    out = capsys.readouterr().out.splitlines()
    batches = [ln for ln in out if ln.startswith("baseOffset:")]
    assert "producerId: 7000 producerEpoch: 3" in batches[1] and "isControl: true" in batches[1]
    assert "isTransactional: true" in batches[0] and "isControl: false" in batches[0]
    assert "baseSequence: 0 producerId: 7000 producerEpoch: 3" in batches[0]  # the producer's sequence too
    assert "baseSequence: 0 producerId: 9000" in batches[4]
    markers = [ln for ln in out if "endTxnMarker" in ln]
    assert [m.split(" CreateTime")[0] for m in markers] == ["| offset: 2", "| offset: 5"]
    assert markers[0].endswith("endTxnMarker: ABORT coordinatorEpoch: 5")
    assert markers[1].endswith("endTxnMarker: COMMIT coordinatorEpoch: 5")
    assert any(ln.startswith("version: 0 producerId: 7000 firstOffset: 0 lastOffset: 2 lastStableOffset: ")
               for ln in out)
    snapshot = out[out.index(next(ln for ln in out if ln.endswith(".snapshot"))):]
    assert any(ln.startswith("producerId: 9000 producerEpoch: 3") and "currentTxnFirstOffset: 6" in ln
               for ln in snapshot)
    assert any(ln.startswith("producerId: 8000") and "currentTxnFirstOffset: None" in ln for ln in snapshot)
    assert "| firstSequence: 0 lastSequence: 1 firstOffset: 6 lastOffset: 7" in snapshot


def test_groups_describe_measures_lag_to_the_last_stable_offset_for_read_committed(broker, topic, capsys):
    from odradek.group import GroupAdmin
    group = f"g-{topic}"
    with GroupAdmin(broker.bootstrap) as admin:
        admin.reset_offsets(group, [topic], to="earliest", execute=True)  # committed offset 0
    with Producer(broker.bootstrap, transactional_id=f"lag-{topic}") as p:
        p.init_transactions(30)
        p.begin_transaction()
        for i in range(3):
            p.send(topic, b"c%d" % i, partition=0)  # 0..2, then the marker at 3
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(2):
            p.send(topic, b"open%d" % i, partition=0)  # 4..5, open: the last stable offset stays at 4
        p.flush(30)

        def row(isolation: str) -> tuple[str, list[str]]:
            assert main(["groups", "--bootstrap-server", broker.bootstrap, "--describe", group,
                         "--isolation", isolation]) == 0
            out = capsys.readouterr().out.splitlines()
            said = next(ln for ln in out if ln.startswith("LAG is measured to the"))
            return said, next(ln.split() for ln in out if ln.startswith(topic) and ln.split()[1] == "0")

        said, cols = row("read_uncommitted")
        assert "LOG-END-OFFSET" in said.split(";")[0]
        assert cols[1:6] == ["0", "0", "6", "6", "4"]  # partition, current, log end, lag, last stable
        said, cols = row("read_committed")
        assert "LAST-STABLE-OFFSET" in said.split(";")[0]
        assert cols[1:6] == ["0", "0", "6", "4", "4"]  # lag 4: the open transaction's records do not count
        p.commit_transaction(30)
    with GroupAdmin(broker.bootstrap) as admin:
        d = admin.describe(group, "read_committed")
    assert d["lag_to"] == "last_stable"
    assert [(r["log_end"], r["last_stable"], r["lag"]) for r in d["partitions"] if r["partition"] == 0] == [(7, 7, 7)]
