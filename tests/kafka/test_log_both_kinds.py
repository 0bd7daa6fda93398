"""The log's readers handle both kinds of batch: compaction, the time index, dump-log."""
from __future__ import annotations

import os
import subprocess
import sys

from odradek.core import kafka_batch
from odradek.log.cleaner import clean
from odradek.core.config import LogConfig
from odradek.log.log import Log
from odradek.core.records import Record, encode_batch
from tests.log.support import Clock, log_records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = LogConfig(segment_bytes=1024, index_interval_bytes=128, segment_index_bytes=240,
                cleanup_policy="compact", min_cleanable_dirty_ratio=0.0, delete_retention_ms=10_000)


def kafka_batch_of(rows, ts: int, codec: str = "zstd") -> bytes:
    recs = [Record(i, ts, k, v, []) for i, (k, v) in enumerate(rows)]
    return kafka_batch.encode(recs, base_offset=0, first_timestamp=ts, max_timestamp=ts, compression=codec)


def fill_mixed(lg, clock, rounds=6):
    for r in range(rounds):
        rows = [(b"key%d" % j, b"v%d-%d" % (j, r)) for j in range(3)]
        batch = kafka_batch_of(rows, clock.now) if r % 2 else encode_batch(rows, timestamp_ms=clock.now)
        lg.append(batch)
        clock.advance(10)


def test_compaction_keeps_the_latest_value_per_key_across_native_and_magic_2_batches(tmp_path):
    clock = Clock()
    lg = Log(str(tmp_path / "t-0"), CFG, now_ms=clock)
    fill_mixed(lg, clock, rounds=30)
    before = log_records(lg)
    active_base = lg.active_segment.base_offset
    lg.high_watermark = lg.log_end_offset
    assert clean(lg).records_removed > 0
    after = log_records(lg)
    for r in after:
        assert r in before
    closed = [r for r in before if r.offset < active_base]
    latest = {}
    for r in closed:
        latest[r.key] = r.offset
    assert {r.offset for r in after if r.offset < active_base} == set(latest.values())
    lg.abandon()


def test_the_time_index_finds_records_in_magic_2_batches(tmp_path):
    clock = Clock()
    lg = Log(str(tmp_path / "t-0"), CFG, now_ms=clock)
    fill_mixed(lg, clock, rounds=20)
    records = log_records(lg)
    for r in records[1::7]:
        target = r.timestamp - 5
        assert lg.offset_for_time(target).offset == min(x.offset for x in records if x.timestamp >= target)
    lg.abandon()


def test_dump_log_names_a_magic_2_batch_its_codec_and_prints_its_records(tmp_path):
    part = tmp_path / "t-0"
    part.mkdir()
    (part / "00000000000000000000.log").write_bytes(kafka_batch_of([(b"k1", b"hello")], 5, "snappy"))
    out = subprocess.run([sys.executable, "-m", "odradek", "dump-log", str(part)], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert out.returncode == 0, out.stderr
    assert "magic: 2 compresscodec: SNAPPY" in out.stdout and "isValid: true" in out.stdout
    assert "payload: hello" in out.stdout
