"""The Kafka codec without sockets: bytes in, objects out, round trips."""
from __future__ import annotations

import struct

import msgpack
import pytest

from odradek.actors.messages import Response
from odradek.core import kafka_batch, records
from odradek.core.errors import CorruptRecordError
from odradek.core import codec
from odradek.core.kafka import apis, framing, schema
from odradek.core.kafka.connection import KafkaConnection
from odradek.core.protocol import ApiKey, ErrorCode


def kafka_request(api: int, version: int, corr: int, body: dict, client: bytes = b"test") -> bytes:
    head = struct.pack(">hhih", api, version, corr, len(client)) + client
    if schema.request_header_flexible(api, version):
        head += b"\x00"
    msg = head + schema.encode_request(api, version, body)
    return struct.pack(">i", len(msg)) + msg


def split_response(data: bytes, flexible: bool) -> tuple[int, bytes]:
    size, corr = struct.unpack_from(">ii", data)
    assert size == len(data) - 4
    return corr, data[9 if flexible else 8:]


def test_the_first_bytes_tell_a_kafka_request_from_a_native_frame():
    native = codec.encode_request(ApiKey.METADATA, 0, 7, "c", {})
    assert framing.sniff(b"".join(bytes(b) for b in native)[:9]) == "native"
    assert framing.sniff(kafka_request(18, 3, 1, {})[:9]) == "kafka"
    assert framing.sniff(kafka_request(18, 3, 1, {})[:8]) is None


def test_a_request_split_across_feeds_comes_out_whole_and_once():
    data = kafka_request(3, 12, 5, {"topics": [{"name": "a"}], "allow_auto_topic_creation": False})
    conn = KafkaConnection(1 << 20)
    for i in range(len(data)):
        conn.feed(data[i:i + 1])
        frame = conn.next()
        assert (frame is None) == (i < len(data) - 1)
    assert frame.header["api"] == ApiKey.METADATA and frame.header["corr"] == 5
    assert frame.header["body"] == {"topics": ["a"], "allow_auto_topic_creation": False}
    assert conn.next() is None


def test_an_oversized_request_is_refused_from_its_size_without_buffering_it():
    dec = framing.Decoder(1000)
    dec.feed(struct.pack(">i", 10 ** 9) + b"\x00" * 10)
    with pytest.raises(framing.FrameError) as err:
        dec.next()
    assert err.value.code == ErrorCode.MESSAGE_TOO_LARGE and "socket.request.max.bytes" in str(err.value)


def test_api_versions_lists_exactly_the_registry_in_the_processor():
    conn = KafkaConnection(1 << 20)
    conn.feed(kafka_request(18, 3, 9, {"client_software_name": "x", "client_software_version": "1"}))
    frame = conn.next()
    corr, body = split_response(b"".join(frame.header["answer"]), flexible=False)
    got = schema.decode_response(18, 3, body)
    assert corr == 9 and got["error_code"] == 0
    assert {k["api_key"]: (k["min_version"], k["max_version"]) for k in got["api_keys"]} == \
        {k: (a.min_version, a.max_version) for k, a in apis.REGISTRY.items()}


def test_an_unsupported_api_versions_version_is_answered_at_v0_with_the_list():
    conn = KafkaConnection(1 << 20)
    raw = struct.pack(">hhih", 18, 99, 4, 1) + b"x"
    conn.feed(struct.pack(">i", len(raw)) + raw)
    corr, body = split_response(b"".join(conn.next().header["answer"]), flexible=False)
    got = schema.decode_response(18, 0, body)
    assert corr == 4 and got["error_code"] == ErrorCode.UNSUPPORTED_VERSION and got["api_keys"]


def test_an_unsupported_version_of_a_known_api_gets_unsupported_version():
    newest = apis.REGISTRY[ApiKey.METADATA].max_version + 1
    conn = KafkaConnection(1 << 20)
    conn.feed(kafka_request(3, newest, 3, {"topics": [{"name": "t"}]}))
    corr, body = split_response(b"".join(conn.next().header["answer"]), flexible=True)
    got = schema.decode_response(3, newest, body)
    assert corr == 3 and got["topics"][0]["error_code"] == ErrorCode.UNSUPPORTED_VERSION


def test_produce_becomes_the_internal_request_with_one_payload_frame_per_partition():
    batch = kafka_batch.encode([records.Record(0, 1000, b"k", b"v", [])], base_offset=0,
                               first_timestamp=1000, max_timestamp=1000)
    conn = KafkaConnection(1 << 20)
    conn.feed(kafka_request(0, 9, 2, {"transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch}, {"index": 1, "records": batch}]}]}))
    frame = conn.next()
    assert frame.header["body"] == {"acks": -1, "timeout_ms": 5000, "topics": [
        {"name": "t", "partitions": [{"index": 0, "frame": 0}, {"index": 1, "frame": 1}]}]}
    assert [bytes(f) for f in frame.frames] == [batch, batch]
    msgpack.packb({k: v for k, v in frame.header.items() if k != "kafka"})  # what goes to the handler packs
    out = conn.answer(frame.header["kafka"], 2, "_reply", Response({"topics": [{"name": "t", "partitions": [
        {"index": 0, "error_code": 0, "base_offset": 41, "log_append_time_ms": -1, "log_start_offset": 0},
        {"index": 1, "error_code": 10, "error_message": "too large"}]}]}), [])
    corr, body = split_response(b"".join(out), flexible=True)
    parts = schema.decode_response(0, 9, body)["responses"][0]["partition_responses"]
    assert corr == 2 and parts[0]["base_offset"] == 41 and parts[1]["error_code"] == 10


def test_a_produce_with_acks_0_expects_no_answer():
    conn = KafkaConnection(1 << 20)
    conn.feed(kafka_request(0, 7, 2, {"transactional_id": None, "acks": 0, "timeout": 5000, "topic_data": []}))
    assert "kafka" not in conn.next().header


def test_a_request_that_does_not_decode_closes_the_connection():
    conn = KafkaConnection(1 << 20)
    raw = struct.pack(">hhih", 3, 9, 1, 1) + b"x" + b"\x00\xff\xff\xff\xff\xff"
    conn.feed(struct.pack(">i", len(raw)) + raw)
    with pytest.raises(codec.FrameError):
        conn.next()


@pytest.mark.parametrize("compression", sorted(kafka_batch.CODECS.values()))
def test_a_magic_2_batch_round_trips_under_every_codec_and_validates_with_crc32c(compression):
    rows = [records.Record(100 + i, 5000 + i, b"k%d" % i if i % 2 else None, b"v" * i, [["h", b"%d" % i]])
            for i in range(50)]
    batch = bytearray(kafka_batch.encode(rows, base_offset=100, first_timestamp=5000, max_timestamp=5049,
                                         compression=compression))
    h = records.validate_batches(batch)[0]
    assert h.magic == 2 and h.record_count == 50
    records.patch_base_offset(batch, 7, 3)  # not covered by the CRC, as in the native format
    assert records.decode_batch(batch)[0].offset == 7
    batch[-1] ^= 1
    with pytest.raises(CorruptRecordError, match="CRC-32C"):
        records.validate_batches(batch)


def test_a_native_batch_is_handed_to_a_kafka_reader_as_magic_2_with_the_same_records():
    native = bytearray(records.encode_batch([(b"k", b"v", [("h", b"x")]), (None, b"w")], timestamp_ms=1234))
    records.patch_base_offset(native, 40)
    kafka = apis.as_kafka_records(memoryview(bytes(native) + b"\x00" * 30))  # a zero-padded tail is dropped
    h = records.validate_batches(kafka)[0]
    assert h.magic == 2 and h.base_offset == 40
    assert records.decode_batch(kafka) == records.decode_batch(native)


def test_a_fetch_response_carries_each_partitions_records_in_body_order():
    batch = kafka_batch.encode([records.Record(0, 1, b"k", b"v", [])], base_offset=0, first_timestamp=1,
                               max_timestamp=1)
    reply = Response({"error_code": 0, "topics": [{"name": "t", "partitions": [
        {"index": 0, "error_code": 0, "high_watermark": 1, "last_stable_offset": 1, "log_start_offset": 0,
         "records_size": len(batch)},
        {"index": 1, "error_code": 1, "records_size": 0}]}]})
    for version in (4, 11, 12):
        request = schema.decode_request(1, version, memoryview(
            (b"\x00" if version >= 12 else b"") + schema.encode_request(1, version, {"topics": []})))
        body = b"".join(bytes(b) for b in apis.fetch_from_internal(version, request, reply, [batch]))
        got = schema.decode_response(1, version, body)
        parts = got["responses"][0]["partitions"]
        assert bytes(parts[0]["records"]) == batch and parts[0]["high_watermark"] == 1
        assert parts[1]["error_code"] == 1 and not parts[1]["records"]


@pytest.mark.parametrize("version", range(3, 10))
def test_the_hand_written_produce_response_is_byte_for_byte_kios(version):
    parts = [{"index": 0, "error_code": 0, "base_offset": 42, "log_append_time_ms": -1, "log_start_offset": 7,
              "error_message": None},
             {"index": 3, "error_code": int(ErrorCode.MESSAGE_TOO_LARGE), "base_offset": -1,
              "log_append_time_ms": 1700000000000, "log_start_offset": -1, "error_message": "too big: 2 MB"}]
    body = {"responses": [{"name": name, "partition_responses": [
        {"index": p["index"], "error_code": p["error_code"], "base_offset": p["base_offset"],
         "log_append_time": None if p["log_append_time_ms"] < 0 else p["log_append_time_ms"],
         "log_start_offset": p["log_start_offset"], "error_message": p["error_message"]} for p in parts]}
        for name in ("orders", "événements")]}
    got = b"".join(apis.encode_produce(version, [("orders", parts), ("événements", parts)]))
    assert got == schema.encode_response(ApiKey.PRODUCE, version, body)
    decoded = schema.decode_response(ApiKey.PRODUCE, version, got)
    assert [p["base_offset"] for t in decoded["responses"] for p in t["partition_responses"]] == [42, -1, 42, -1]


@pytest.mark.parametrize("version", range(3, 10))
def test_the_hand_written_produce_reader_reads_what_kio_reads(version):
    body = {"transactional_id": None, "acks": -1, "timeout": 1500, "topic_data": [
        {"name": "orders", "partition_data": [{"index": 0, "records": b"\x01" * 70}, {"index": 4, "records": None}]},
        {"name": "événements", "partition_data": [{"index": 2, "records": b""}]}]}
    raw = schema.encode_request(ApiKey.PRODUCE, version, body)
    head = b"\x00" if version >= 9 else b""  # the flexible request header's tagged fields
    got = apis.decode_produce(version, memoryview(head + raw))
    want = schema.decode_request(ApiKey.PRODUCE, version, memoryview(head + raw))
    normal = lambda d: {**d, "topic_data": [{**t, "partition_data": [  # noqa: E731
        {**p, "records": None if p["records"] is None else bytes(p["records"])} for p in t["partition_data"]]}
        for t in d["topic_data"]]}
    assert normal(got) == normal(want)
    with pytest.raises(framing.FrameError):
        apis.decode_produce(version, memoryview(head + raw[:-5]))


def test_only_file_regions_of_whole_magic_2_batches_are_sent_by_sendfile(tmp_path):
    from odradek.network.processor import HEADER_WINDOW, _kafka_regions
    rec = [records.Record(i, 1700000000000, None, b"v" * 100, []) for i in range(3)]
    small = kafka_batch.encode(rec, base_offset=0, first_timestamp=1700000000000, max_timestamp=1700000000000)
    big = kafka_batch.encode([records.Record(0, 1700000000000, None, b"x" * (3 * HEADER_WINDOW), [])],
                             base_offset=3, first_timestamp=1700000000000, max_timestamp=1700000000000,
                             compression="none")
    native = records.encode_batch([(None, b"v")] * 3, timestamp_ms=1700000000000)
    kafka_only, mixed = tmp_path / "kafka.log", tmp_path / "mixed.log"
    kafka_only.write_bytes(small * 40 + big + small)  # many batches in a window, one over several
    mixed.write_bytes(small + native + small)
    n = kafka_only.stat().st_size
    regions = _kafka_regions([[str(kafka_only), 0, n], [str(kafka_only), len(small), len(small) * 2]])
    assert [(r.path, r.position, r.left) for r in regions] == \
        [(str(kafka_only), 0, n), (str(kafka_only), len(small), len(small) * 2)]
    assert _kafka_regions([[str(mixed), 0, mixed.stat().st_size]]) is None  # a native batch: converted
    assert _kafka_regions([[str(mixed), 0, len(small)]]) is not None  # the part before it is not
    assert _kafka_regions([[str(kafka_only), 0, n - 1]]) is None  # a batch cut short
    assert _kafka_regions([[str(kafka_only), 0, n + 100]]) is None  # the file is shorter than the region
    assert _kafka_regions([[str(tmp_path / "gone.log"), 0, 10]]) is None  # deleted meanwhile
