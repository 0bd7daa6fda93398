"""The wire codec, without I/O: bytes in, frames out, and back."""
from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from odradek.core import codec
from odradek.core.protocol import ApiKey, ErrorCode


def wire(bufs) -> bytes:
    return b"".join(bytes(b) for b in bufs)


def request(corr=7, body=None, frames=(), api=ApiKey.PING) -> bytes:
    return wire(codec.encode_request(api, 0, corr, "tester", body if body is not None else {"k": "v"}, frames))


def raw_frame(header_bytes: bytes, payload: bytes = b"") -> bytes:
    return struct.pack(">II", 4 + len(header_bytes) + len(payload), len(header_bytes)) + header_bytes + payload


def test_a_request_round_trips_with_its_payload_frames():
    data = request(corr=42, body={"topic": "t", "n": [1, 2]}, frames=[b"abc", b"", b"x" * 1000])
    [frame] = codec.decode_all(data)
    assert frame.header["api"] == ApiKey.PING and frame.header["client"] == "tester"
    assert frame.corr == 42 and frame.body == {"topic": "t", "n": [1, 2]}
    assert [bytes(f) for f in frame.frames] == [b"abc", b"", b"x" * 1000]


def test_a_response_round_trips_including_file_region_lengths():
    bufs = codec.encode_response(9, {"ok": True}, [b"head"], extra_lens=[5])
    data = wire(bufs) + b"FILE!"
    [frame] = codec.decode_all(data, fields=codec.RESPONSE_FIELDS)
    assert frame.corr == 9 and frame.body == {"ok": True}
    assert [bytes(f) for f in frame.frames] == [b"head", b"FILE!"]


def test_an_error_response_carries_code_and_message():
    [frame] = codec.decode_all(wire(codec.encode_error(3, ErrorCode.INVALID_REQUEST, "bad")),
                               fields=codec.RESPONSE_FIELDS)
    assert frame.body == {"error_code": 42, "error_message": "bad"}


def test_payload_frames_are_views_of_the_received_bytes_not_copies():
    data = request(frames=[b"p" * 100])
    dec = codec.Decoder()
    dec.feed(data)
    frame = dec.next()
    assert isinstance(frame.frames[0], memoryview)
    assert frame.frames[0].obj is data


def test_feeding_at_every_split_point_yields_the_same_frames():
    data = request(corr=1, frames=[b"one"]) + request(corr=2, body={}, frames=[b"two", b"2"]) + request(corr=3)
    for split in range(len(data) + 1):
        dec = codec.Decoder()
        out = []
        for chunk in (data[:split], data[split:]):
            dec.feed(chunk)
            while (f := dec.next()) is not None:
                out.append((f.corr, [bytes(x) for x in f.frames]))
        assert out == [(1, [b"one"]), (2, [b"two", b"2"]), (3, [])], split
        assert dec.buffered == 0


def test_feeding_one_byte_at_a_time_yields_every_frame():
    data = b"".join(request(corr=i, frames=[bytes([i]) * i]) for i in range(20))
    dec = codec.Decoder()
    got = []
    for i in range(len(data)):
        dec.feed(data[i:i + 1])
        while (f := dec.next()) is not None:
            got.append(f.corr)
    assert got == list(range(20))


def test_a_big_frame_split_over_many_chunks_is_assembled_once():
    payload = bytes(range(256)) * 2000  # 512 000 bytes
    data = request(corr=5, frames=[payload]) + request(corr=6)
    dec = codec.Decoder()
    got = []
    for i in range(0, len(data), 7000):
        dec.feed(data[i:i + 7000])
        while (f := dec.next()) is not None:
            got.append((f.corr, bytes(f.frames[0]) if f.frames else b""))
    assert got == [(5, payload), (6, b"")]


@settings(max_examples=200, deadline=None)
@given(bodies=st.lists(st.dictionaries(st.text(max_size=5), st.integers(-(2 ** 63), 2 ** 64 - 1) | st.text(max_size=10), max_size=4),
                       min_size=1, max_size=5),
       payloads=st.lists(st.binary(max_size=300), max_size=3),
       cuts=st.lists(st.integers(min_value=1, max_value=200), max_size=20))
def test_any_requests_cut_anywhere_decode_to_what_was_encoded(bodies, payloads, cuts):
    data = b"".join(request(corr=i, body=b, frames=payloads) for i, b in enumerate(bodies))
    dec = codec.Decoder()
    got, at = [], 0
    for n in cuts + [len(data)]:
        dec.feed(data[at:at + n])
        at += n
        while (f := dec.next()) is not None:
            got.append((f.corr, f.body, [bytes(x) for x in f.frames]))
    assert got == [(i, b, payloads) for i, b in enumerate(bodies)]


def test_garbage_raises_a_clear_error_and_the_decoder_stays_failed():
    dec = codec.Decoder()
    dec.feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(codec.FrameError) as err:
        dec.next()
    assert "frame" in err.value.message and err.value.corr is None
    with pytest.raises(codec.FrameError):
        dec.next()


def test_a_size_smaller_than_its_header_length_is_refused():
    with pytest.raises(codec.FrameError, match="bad frame prefix"):
        codec.decode_all(struct.pack(">II", 10, 50) + b"x" * 10)


def test_truncated_msgpack_in_the_header_is_refused():
    head = msgpack.packb({"api": 1000, "v": 0, "corr": 1, "client": "c", "body": {}, "frames": []})
    with pytest.raises(codec.FrameError, match="undecodable frame header"):
        codec.decode_all(raw_frame(head[:-3]))


def test_a_header_that_is_not_a_map_is_refused():
    with pytest.raises(codec.FrameError, match="must be a map"):
        codec.decode_all(raw_frame(msgpack.packb([1, 2, 3])))


def test_a_header_field_of_the_wrong_type_is_refused_naming_the_field_with_the_corr():
    head = msgpack.packb({"api": "ping", "v": 0, "corr": 11, "client": "c", "body": {}, "frames": []})
    with pytest.raises(codec.FrameError, match="'api'") as err:
        codec.decode_all(raw_frame(head))
    assert err.value.corr == 11


def test_a_missing_header_field_is_refused():
    head = msgpack.packb({"api": 1, "v": 0, "corr": 11, "client": "c", "frames": []})
    with pytest.raises(codec.FrameError, match="'body' must be dict, got missing"):
        codec.decode_all(raw_frame(head))


def test_frame_lengths_that_do_not_add_up_are_refused():
    head = msgpack.packb({"api": 1, "v": 0, "corr": 4, "client": "c", "body": {}, "frames": [3, 3]})
    with pytest.raises(codec.FrameError, match="add up") as err:
        codec.decode_all(raw_frame(head, b"abcd"))
    assert err.value.corr == 4


def test_negative_frame_lengths_are_refused():
    head = msgpack.packb({"api": 1, "v": 0, "corr": 4, "client": "c", "body": {}, "frames": [-1]})
    with pytest.raises(codec.FrameError, match="non-negative"):
        codec.decode_all(raw_frame(head))


def test_an_oversized_frame_is_refused_with_its_corr_before_the_payload_arrives():
    data = request(corr=77, frames=[b"z" * 5000])
    dec = codec.Decoder(max_size=1024)
    dec.feed(data[:60])  # the prefix and the header only
    with pytest.raises(codec.FrameError) as err:
        dec.next()
    assert err.value.code == ErrorCode.MESSAGE_TOO_LARGE and err.value.corr == 77
    assert "socket.request.max.bytes" in err.value.message


def test_an_oversized_frame_waits_only_for_its_header():
    data = request(corr=78, frames=[b"z" * 5000])
    dec = codec.Decoder(max_size=1024)
    dec.feed(data[:10])
    assert dec.next() is None
    dec.feed(data[10:60])
    with pytest.raises(codec.FrameError) as err:
        dec.next()
    assert err.value.corr == 78


def test_a_huge_size_field_is_refused_without_buffering():
    dec = codec.Decoder(max_size=1 << 20)
    dec.feed(struct.pack(">II", 0xFFFFFFF0, 0xFFFFFF00))
    with pytest.raises(codec.FrameError):
        dec.next()


def test_an_empty_header_is_refused():
    with pytest.raises(codec.FrameError, match="header length 0"):
        codec.decode_all(struct.pack(">II", 4, 0))


def test_good_frames_before_garbage_in_the_same_chunk_are_delivered_first():
    dec = codec.Decoder()
    dec.feed(request(corr=1) + request(corr=2) + b"\x00\x00\x00\x02zzzz")
    assert dec.next().corr == 1
    assert dec.next().corr == 2
    with pytest.raises(codec.FrameError):
        dec.next()


def test_a_frame_announcing_100_mb_holds_only_the_bytes_received():
    import tracemalloc
    head = msgpack.packb({"api": int(ApiKey.PING), "v": 0, "corr": 1, "client": "c", "body": {}, "frames": []})
    dec = codec.Decoder(max_size=200 << 20)
    tracemalloc.start()
    try:
        dec.feed(struct.pack(">II", 100 << 20, len(head)) + head + b"x" * 1000)
        assert dec.next() is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"decoder allocated {peak} bytes for 1 KB received"
    assert dec.buffered == 8 + len(head) + 1000
    assert dec.head_size() == 4 + (100 << 20)


def test_the_head_size_is_known_once_the_size_prefix_is_in():
    data = request(corr=3)
    dec = codec.Decoder()
    dec.feed(data[:3])
    assert dec.head_size() is None
    dec.feed(data[3:10])
    assert dec.head_size() == len(data)


def test_a_header_nested_too_deep_is_refused_with_its_corr_and_the_stream_goes_on():
    deep = 0
    for _ in range(1022):
        deep = [deep]
    dec = codec.Decoder()
    dec.feed(request(corr=5, body={"x": deep}) + request(corr=6))
    with pytest.raises(codec.BadRequest) as err:
        dec.next()
    assert err.value.corr == 5 and err.value.code == ErrorCode.INVALID_REQUEST and "nested deeper" in err.value.message
    assert dec.next().corr == 6


def test_a_map_key_that_is_not_a_string_is_refused_with_its_corr_and_the_stream_goes_on():
    dec = codec.Decoder()
    dec.feed(request(corr=5, body={"topics": {1: "a"}}) + request(corr=6))
    with pytest.raises(codec.BadRequest) as err:
        dec.next()
    assert err.value.corr == 5 and err.value.code == ErrorCode.INVALID_REQUEST and "map keys" in err.value.message
    assert dec.next().corr == 6
