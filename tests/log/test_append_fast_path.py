"""``Log.append``'s one-batch fast path does what the general path does, byte for byte.

The fast path (one sound batch, read-only buffer, leader append) is checked against
``Log._append_general`` (the reference, which every other append still takes): the same
inputs, good and bad, give the same result or the same error, the same files and indexes.
"""
from __future__ import annotations

import os
import random
import struct
import zlib

import pytest
import zmq

from odradek.core.config import LogConfig
from odradek.core import kafka_batch
from odradek.core.errors import OdradekError
from odradek.log.log import Log
from odradek.log.producer_state import InvalidTxnStateError
from odradek.core.records import (APPEND_VIEW, HEADER, MAGIC, TRANSACTIONAL_BIT, BatchHeader, Record, check_header,
                                 encode_batch, validate_batches)
from tests.log.support import Clock


class GeneralOnly(Log):
    """The reference: every append takes the general path."""

    def append(self, batch, leader_epoch=0, assign_offsets=True, crc_checked=False):
        return self._append_general(batch, leader_epoch, assign_offsets, crc_checked)


def _files_of(lg: Log) -> dict:
    out = {}
    for name in sorted(os.listdir(lg.dir)):
        with open(os.path.join(lg.dir, name), "rb") as f:
            out[name] = f.read()
    return out


def _outcome(lg: Log, batch, **kw):
    try:
        info = lg.append(batch, **kw)
    except OdradekError as e:
        return type(e).__name__, str(e)
    return info


def _mutations(rnd: random.Random, good: bytes):
    """Good batches and ones with one header field (or the length, or a byte) wrong."""
    fields = list(HEADER.unpack_from(good))
    yield good
    for _ in range(300):
        f = list(fields)
        i = rnd.randrange(len(f))
        f[i] = rnd.choice([0, 1, -1, 2, 7, 8, 9, 0x20, 0x28, 0x40, MAGIC, 2 ** 31 - 1, -2 ** 31,
                           f[i] + 1, f[i] - 1, len(good) - 12, len(good) - 11, len(good) - 13])
        fmt = HEADER.format[1:][i]
        lo, hi = {"q": (-2 ** 63, 2 ** 63 - 1), "i": (-2 ** 31, 2 ** 31 - 1), "b": (-128, 127),
                  "I": (0, 2 ** 32 - 1), "h": (-2 ** 15, 2 ** 15 - 1)}[fmt]
        f[i] = min(max(f[i], lo), hi)
        out = bytearray(good)
        HEADER.pack_into(out, 0, *f)
        yield bytes(out)
    for cut in (1, 12, 60, 61, len(good) - 1):
        yield good[:cut]
    yield good + b"\0"
    flipped = bytearray(good)
    flipped[-1] ^= 1
    yield bytes(flipped)


@pytest.mark.parametrize("crc_checked", [False, True])
def test_the_fast_path_matches_the_general_path_on_good_and_bad_batches(tmp_path, crc_checked):
    cfg = LogConfig(segment_bytes=8192, index_interval_bytes=300, segment_index_bytes=600,
                    max_message_bytes=3000)
    clock = Clock()
    fast = Log(str(tmp_path / "fast-0"), cfg, now_ms=clock)
    ref = GeneralOnly(str(tmp_path / "ref-0"), cfg, now_ms=clock)
    rnd = random.Random(7)
    tried = accepted = 0
    for n in range(40):
        good = encode_batch([(b"k", os.urandom(rnd.randrange(1, 900)))] * rnd.randrange(1, 4), None,
                            timestamp_ms=clock.now - rnd.randrange(0, 5000))
        for candidate in _mutations(rnd, good) if n < 4 else [good]:
            a = _outcome(fast, candidate, crc_checked=crc_checked, leader_epoch=n)
            b = _outcome(ref, candidate, crc_checked=crc_checked, leader_epoch=n)
            assert a == b, candidate[:61]
            tried += 1
            accepted += not isinstance(a, tuple) or len(a) != 2
        clock.advance(rnd.randrange(0, 3))
    assert accepted > 40 and tried > accepted
    assert len(fast.segments) > 3  # rolls on size and on a full index happened on the way
    assert [s.size for s in fast.segments] == [s.size for s in ref.segments]
    fast.close()
    ref.close()
    assert _files_of(fast) == _files_of(ref)


def test_the_fast_checks_never_accept_what_check_header_refuses():
    """Random headers: whatever the fast path would take, validate_batches takes too."""
    from odradek.log import log as log_module
    view = APPEND_VIEW
    rnd = random.Random(3)
    body = b"x" * 40
    for _ in range(20000):
        f = [rnd.choice([0, 1, -1, rnd.randrange(-2 ** 31, 2 ** 31)]),  # base offset
             len(body) + 49 + rnd.choice([0, 0, 0, 1, -1]),
             rnd.randrange(-5, 5), rnd.choice([MAGIC, MAGIC, 2, 0]), 0,
             rnd.choice([0, 1, 2, 7, 8, 9, 0x20, 0x29, 0x40, -1]),
             rnd.choice([0, 1, 2, -1, 5]), 0, 0, -1, -1, -1, rnd.choice([0, 1, 2, 3, -1])]
        raw = bytearray(HEADER.size + len(body))
        HEADER.pack_into(raw, 0, *f)
        raw[HEADER.size:] = body
        base0, blen, magic, _crc, attributes, delta, _ts, _pid, _epoch, _seq, count = view.unpack_from(raw)
        fast_ok = (blen + 12 == len(raw) and magic == MAGIC and count >= 1 and delta >= count - 1
                   and base0 >= 0 and not attributes & ~log_module.KNOWN_ATTRIBUTE_BITS
                   and attributes & log_module.COMPRESSION_MASK <= log_module.COMPRESSION_LZ4)
        try:
            validate_batches(bytes(raw), verify_crc=False)
            check_header(BatchHeader.read(raw))
            ref_ok = True
        except OdradekError:
            ref_ok = False
        if magic == MAGIC:
            assert fast_ok == ref_ok, f
        else:  # another format (Kafka's magic 2) always takes the general path, which checks it
            assert not fast_ok, f


def test_the_append_view_reads_the_same_fields_as_the_header():
    from odradek.log import log as log_module
    good = encode_batch([(b"k", b"v")] * 3, None, timestamp_ms=12345, producer_id=9,
                        base_sequence=4, producer_epoch=2, partition_leader_epoch=6)
    h = BatchHeader.read(good)
    assert APPEND_VIEW.size == HEADER.size
    assert APPEND_VIEW.unpack_from(good) == (
        h.base_offset, h.batch_length, h.magic, h.crc, h.attributes, h.last_offset_delta,
        h.max_timestamp, h.producer_id, h.producer_epoch, h.base_sequence, h.record_count)
    assert struct.unpack(">qii", good[:16]) == (h.base_offset, h.batch_length, h.partition_leader_epoch)


@pytest.mark.parametrize("kind", ["bytes", "memoryview", "zmq.Frame"])
def test_read_only_buffers_take_the_fast_path_and_are_not_modified(tmp_path, monkeypatch, kind):
    lg = Log(str(tmp_path / "t-0"), LogConfig())
    general = []
    real = Log._append_general
    monkeypatch.setattr(Log, "_append_general", lambda self, *a: general.append(a) or real(self, *a))
    data = encode_batch([(b"k", b"v")] * 2, None)
    lg.append(data)
    buf = {"bytes": lambda: data, "memoryview": lambda: memoryview(data),
           "zmq.Frame": lambda: zmq.Frame(data)}[kind]()
    info = lg.append(buf, leader_epoch=3, crc_checked=True)
    assert general == [] and info.base_offset == 2 and info.size == len(data)
    assert bytes(memoryview(buf)) == data  # untouched
    stored = lg.fetch(2, 1 << 20)
    h = BatchHeader.read(stored)
    assert (h.base_offset, h.partition_leader_epoch) == (2, 3) and stored[16:] == data[16:]
    lg.append(bytearray(data))  # writable: patched in place by the general path
    assert len(general) == 1
    lg.abandon()


def _kafka_batch(rnd: random.Random, now: int, count: int, **kw) -> bytes:
    records = [Record(i, now - rnd.randrange(0, 5000), b"k", os.urandom(rnd.randrange(1, 900)), [])
               for i in range(count)]
    return kafka_batch.encode(records, base_offset=0, first_timestamp=min(r.timestamp for r in records),
                              max_timestamp=max(r.timestamp for r in records), **kw)


@pytest.mark.parametrize("crc_checked", [False, True])
def test_kafka_batches_give_the_same_results_and_files_as_the_general_path(tmp_path, crc_checked):
    cfg = LogConfig(segment_bytes=8192, index_interval_bytes=300, segment_index_bytes=600,
                    max_message_bytes=3000)
    clock = Clock()
    fast = Log(str(tmp_path / "fast-0"), cfg, now_ms=clock)
    ref = GeneralOnly(str(tmp_path / "ref-0"), cfg, now_ms=clock)
    rnd = random.Random(11)
    tried = accepted = 0
    for n in range(40):
        good = _kafka_batch(rnd, clock.now, rnd.randrange(1, 4))
        for candidate in _mutations(rnd, good) if n < 4 else [good]:
            a = _outcome(fast, candidate, crc_checked=crc_checked, leader_epoch=n)
            b = _outcome(ref, candidate, crc_checked=crc_checked, leader_epoch=n)
            assert a == b, candidate[:61]
            tried += 1
            accepted += not isinstance(a, tuple) or len(a) != 2
        clock.advance(rnd.randrange(0, 3))
    assert accepted > 40 and tried > accepted
    assert len(fast.segments) > 3
    fast.close()
    ref.close()
    assert _files_of(fast) == _files_of(ref)


@pytest.mark.parametrize("magic", ["native", "kafka"])
def test_a_transactional_batch_without_a_producer_id_is_refused_whatever_the_buffer(tmp_path, magic):
    """Seen accepted by the one-batch path before the append path was made one (a read-only
    native batch with the transactional bit and producer id -1 was written)."""
    lg = Log(str(tmp_path / "t-0"), LogConfig())
    if magic == "kafka":
        data = _kafka_batch(random.Random(1), 1000, 2, attributes=TRANSACTIONAL_BIT)
    else:
        raw = bytearray(encode_batch([(b"k", b"v")] * 2, None))
        fields = list(HEADER.unpack_from(raw))
        fields[5] |= TRANSACTIONAL_BIT
        HEADER.pack_into(raw, 0, *fields)
        struct.pack_into(">I", raw, 17, zlib.crc32(raw[21:]))
        data = bytes(raw)
    assert BatchHeader.read(data).producer_id == -1
    for buf in (data, bytearray(data), zmq.Frame(data)):
        with pytest.raises(InvalidTxnStateError):
            lg.append(buf)
    assert lg.log_end_offset == 0 and lg.size == 0
    lg.abandon()
