"""Compaction: latest value per key, tombstones, lag and dirty ratio, crash-safe swaps."""
from __future__ import annotations

import os
import shutil

import pytest

from odradek.core import kafka_batch
from odradek.log import cleaner
from odradek.core.config import LogConfig
from odradek.log.log import Log
from odradek.core.records import (TRANSACTIONAL_BIT, BatchHeader, Record, decode_batch, encode_batch,
                                 encode_records)
from tests.log.support import Clock, Crash, FaultyFiles, log_records

CFG = LogConfig(segment_bytes=1024, index_interval_bytes=128, segment_index_bytes=240,
                cleanup_policy="compact", min_cleanable_dirty_ratio=0.0, delete_retention_ms=10_000)


def clean(lg, force=False):
    """A pass over a log whose every record is replicated (the cleaner stops at the last
    stable offset, which the high watermark bounds)."""
    lg.high_watermark = lg.log_end_offset
    return cleaner.clean(lg, force)


def fill(lg, clock, rounds=6, keys=5, tombstone=None):
    """Write ``rounds`` values for each of ``keys`` keys, one small batch per two records."""
    for r in range(rounds):
        for k in range(0, keys, 2):
            recs = [(b"key%d" % j, None if (tombstone == j and r == rounds - 1) else b"v%d-%d" % (j, r))
                    for j in (k, k + 1) if j < keys]
            lg.append(encode_batch(recs, timestamp_ms=clock.now))
        clock.advance(10)


def latest_by_key(records):
    out = {}
    for r in records:
        out[r.key] = r
    return out


def test_compaction_keeps_the_latest_value_per_key_and_every_offset(tmp_path):
    clock = Clock()
    lg = Log(str(tmp_path / "t-0"), CFG, now_ms=clock)
    fill(lg, clock)
    before = log_records(lg)
    active_base = lg.active_segment.base_offset
    result = clean(lg)
    after = log_records(lg)
    assert result.cleaned and result.records_removed > 0
    assert len(after) < len(before)
    assert {r.offset: r for r in before}.keys() >= {r.offset for r in after}
    for r in after:  # every surviving record is unchanged, at its original offset
        assert r in before
    closed = [r for r in before if r.offset < active_base]
    latest_closed = {r.offset for r in latest_by_key(closed).values()}
    assert {r.offset for r in after if r.offset < active_base} == latest_closed
    assert [r for r in after if r.offset >= active_base] == [r for r in before if r.offset >= active_base]
    assert latest_by_key(after) == latest_by_key(before)
    assert lg.append(encode_batch([(b"key0", b"new")])).base_offset == before[-1].offset + 1
    lg.close()
    again = Log(str(tmp_path / "t-0"), CFG, now_ms=clock)
    assert log_records(again) == after + [log_records(again)[-1]]
    again.abandon()


def test_tombstones_survive_until_delete_retention_then_go(tmp_path):
    clock = Clock()
    lg = Log(str(tmp_path / "t-0"), CFG, now_ms=clock)
    fill(lg, clock, rounds=4, tombstone=1)
    for i in range(12):  # push the tombstone into a closed segment
        lg.append(encode_batch([(b"other%d" % i, b"x" * 40)], timestamp_ms=clock.now))
    clean(lg)
    assert any(r.key == b"key1" and r.value is None for r in log_records(lg))
    clock.advance(20_000)
    clean(lg, force=True)
    assert not any(r.key == b"key1" for r in log_records(lg))


def test_min_compaction_lag_keeps_young_segments_dirty(tmp_path):
    clock = Clock()
    lg = Log(str(tmp_path / "t-0"), LogConfig(**{**CFG.__dict__, "min_compaction_lag_ms": 1000}), now_ms=clock)
    fill(lg, clock)
    assert not clean(lg).cleaned
    clock.advance(1000)
    assert clean(lg).cleaned


def test_dirty_ratio_below_the_minimum_skips_the_pass(tmp_path):
    clock = Clock()
    cfg = LogConfig(**{**CFG.__dict__, "min_cleanable_dirty_ratio": 0.5})
    lg = Log(str(tmp_path / "t-0"), cfg, now_ms=clock)
    fill(lg, clock)
    assert clean(lg).cleaned  # everything is dirty at first
    fill(lg, clock, rounds=1)  # a little new dirt against a clean head
    result = clean(lg)
    assert not result.cleaned and "dirty ratio" in result.reason


def test_delete_only_policy_does_not_compact(tmp_path):
    lg = Log(str(tmp_path / "t-0"), LogConfig(**{**CFG.__dict__, "cleanup_policy": "delete"}))
    fill(lg, Clock())
    assert not clean(lg).cleaned


def test_a_crash_at_any_step_of_the_swap_leaves_the_log_before_or_after(tmp_path):
    clock = Clock()
    template = tmp_path / "template"
    lg = Log(str(template), CFG, now_ms=clock)
    fill(lg, clock)
    lg.flush()
    lg.checkpoint()
    before = log_records(lg)
    lg.abandon()
    expected_after = None
    step, outcomes = 0, set()
    while True:
        d = tmp_path / f"s{step}"
        shutil.copytree(template, d)
        files = FaultyFiles()
        lg = Log(str(d), CFG, now_ms=clock, files=files)
        files.crash_at(step)
        try:
            clean(lg)
            crashed = False
            expected_after = log_records(lg)
        except Crash:
            crashed = True
        lg.abandon()
        again = Log(str(d), CFG, now_ms=clock)
        got = log_records(again)
        if not crashed:
            assert got == expected_after
        else:
            # per segment, either the old or the cleaned version: the union keeps the latest per
            # key, every record is an original one, and nothing beyond the closed head changed
            assert latest_by_key(got) == latest_by_key(before)
            assert all(r in before for r in got)
            outcomes.add(len(got))
        assert not [n for n in os.listdir(d) if n.endswith((".cleaned", ".swap"))]
        end = again.log_end_offset
        assert again.append(encode_batch([(b"k", b"v")])).base_offset == end
        again.abandon()
        shutil.rmtree(d)
        if not crashed:
            break
        step += 1
    assert step > 10 and len(outcomes) >= 2  # crashes landed both before and after a swap


# ----------------------------------------------------------------------------- transactions and formats

PID_A, PID_B = 7000, 8000


def kafka_txn_batch(rows, ts, pid, seq, codec="gzip"):
    recs = [Record(i, ts, k, v, []) for i, (k, v) in enumerate(rows)]
    return kafka_batch.encode(recs, base_offset=0, first_timestamp=ts, max_timestamp=ts, compression=codec,
                              attributes=kafka_batch.TRANSACTIONAL_BIT, producer_id=pid, producer_epoch=0,
                              base_sequence=seq)


def compact(lg, clock, n=12):
    """Plain records under other keys, enough to roll what came before into closed segments;
    then a forced pass."""
    for i in range(n):
        lg.append(encode_batch([(b"filler%d" % i, b"x" * 40)], timestamp_ms=clock.now))
    clock.advance(10)
    return clean(lg, force=True)


@pytest.fixture
def fresh(tmp_path):
    clock = Clock()
    return Log(str(tmp_path / "t-0"), CFG, now_ms=clock), clock


def values_of(lg, key):
    return [r.value for r in log_records(lg) if r.key == key]


def test_an_aborted_transaction_never_displaces_a_committed_value_and_its_records_go(fresh):
    # Kafka's cleaner skips aborted records when it maps keys and removes them. Without that,
    # the committed value was dropped for the aborted one, which read_committed never shows:
    # the key lost its value.
    lg, clock = fresh
    lg.append(kafka_txn_batch([(b"k", b"committed")], clock.now, PID_A, 0))
    lg.append_marker(PID_A, 0, commit=True)
    lg.append(kafka_txn_batch([(b"k", b"aborted")], clock.now, PID_B, 0))
    lg.append_marker(PID_B, 0, commit=False)
    compact(lg, clock)
    assert values_of(lg, b"k") == [b"committed"]


def test_an_open_transaction_is_not_compacted_and_shields_what_it_may_replace(fresh):
    # Kafka's cleaner stops at the last stable offset: an open transaction may still abort, so
    # the value before it must survive.
    lg, clock = fresh
    lg.append(encode_batch([(b"k", b"before")], timestamp_ms=clock.now))
    lg.append(kafka_txn_batch([(b"k", b"undecided")], clock.now, PID_A, 0))
    compact(lg, clock)
    assert values_of(lg, b"k") == [b"before", b"undecided"]
    lg.append_marker(PID_A, 0, commit=False)
    compact(lg, clock)
    assert values_of(lg, b"k") == [b"before"]


def test_a_rewritten_batch_keeps_its_format_codec_flags_and_producer_span(fresh):
    # The rewrite turned a client's transactional magic-2 gzip batch into a native lz4 batch
    # without its transactional bit (read_committed consumers then treated its records as
    # non-transactional), and moved its base offset and sequence.
    lg, clock = fresh
    lg.append(kafka_txn_batch([(b"x", b"1"), (b"y", b"1"), (b"z", b"1")], clock.now, PID_A, 0))
    lg.append_marker(PID_A, 0, commit=True)
    lg.append(encode_batch([(b"x", b"2"), (b"z", b"2")], timestamp_ms=clock.now))
    before = BatchHeader.read(lg.fetch(0, 1 << 20))
    assert compact(lg, clock).records_removed == 2
    data = lg.fetch(0, 1 << 20)
    h = BatchHeader.read(data)
    assert (h.magic, h.compression) == (kafka_batch.MAGIC, 1)  # Kafka's magic 2, gzip
    assert h.attributes & kafka_batch.TRANSACTIONAL_BIT
    assert (h.base_offset, h.last_offset_delta, h.base_sequence, h.producer_id, h.record_count) == \
        (before.base_offset, before.last_offset_delta, before.base_sequence, PID_A, 1)
    assert [(r.offset, r.key) for r in decode_batch(memoryview(data)[:h.size])] == [(1, b"y")]


def test_a_rewritten_native_transactional_batch_keeps_its_transactional_bit(fresh):
    lg, clock = fresh
    rows = [Record(i, clock.now, k, b"1", []) for i, k in enumerate((b"x", b"y"))]
    lg.append(encode_records(rows, producer_id=PID_A, producer_epoch=0, base_sequence=0, transactional=True))
    lg.append_marker(PID_A, 0, commit=True)
    lg.append(encode_batch([(b"x", b"2")], timestamp_ms=clock.now))
    compact(lg, clock)
    h = BatchHeader.read(lg.fetch(0, 1 << 20))
    assert (h.base_offset, h.base_sequence, h.record_count) == (1, 1, 1)
    assert h.attributes & TRANSACTIONAL_BIT
