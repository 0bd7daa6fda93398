"""A Hypothesis state machine: random appends, reads, rolls, retention, truncations, compactions
and reopen-after-crash against a simple in-memory model of the log."""
from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from odradek.log.cleaner import clean
from odradek.core.config import LogConfig
from odradek.log.log import Log
from odradek.core.records import BatchHeader, decode_batch, encode_batch, iter_batches
from tests.log.support import Clock, log_records

CFG = LogConfig(segment_bytes=1200, index_interval_bytes=200, segment_index_bytes=120,
                cleanup_policy="compact,delete", min_cleanable_dirty_ratio=0.0,
                delete_retention_ms=10**12, retention_ms=-1, file_delete_delay_ms=0)


class ModelBatch:
    def __init__(self, records, size):
        self.records = records  # [(offset, key, value, ts)]
        self.size = size

    @property
    def base(self):
        return self.records[0][0]

    @property
    def last(self):
        return self.records[-1][0]


class LogMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="odradek-model-")
        self.dir = os.path.join(self.tmp, "t-0")
        self.clock = Clock()
        self.lg = Log(self.dir, CFG, now_ms=self.clock)
        self.batches: list[ModelBatch] = []
        self.leo = 0
        self.lso = 0

    def teardown(self):
        self.lg.abandon()
        shutil.rmtree(self.tmp)

    # -- rules
    @rule(count=st.integers(1, 8), keyspace=st.integers(1, 8), vsize=st.integers(0, 120),
          tomb=st.booleans(), data=st.data())
    def append(self, count, keyspace, vsize, tomb, data):
        for _ in range(count):
            n = data.draw(st.integers(1, 6))
            keys = data.draw(st.lists(st.integers(0, keyspace - 1), min_size=n, max_size=n))
            self._append(keys, vsize, tomb)

    def _append(self, keys, vsize, tomb):
        n = len(keys)
        ts = self.clock.now
        recs = [(b"k%d" % k, None if (tomb and i == 0) else b"v%d-" % self.leo + b"x" * vsize)
                for i, k in enumerate(keys)]
        info = self.lg.append(encode_batch(recs, timestamp_ms=ts))
        assert info.base_offset == self.leo
        self.batches.append(ModelBatch([(self.leo + i, k, v, ts) for i, (k, v) in enumerate(recs)], info.size))
        self.leo += n
        self.clock.advance(7)

    @rule(data=st.data(), max_bytes=st.integers(1, 3000))
    def read(self, data, max_bytes):
        if self.leo == self.lso:
            return
        offset = data.draw(st.integers(self.lso, self.leo - 1))
        raw = self.lg.fetch(offset, max_bytes)
        got = []
        for pos, h in iter_batches(raw):
            got += [(r.offset, r.key, r.value, r.timestamp)
                    for r in decode_batch(memoryview(raw)[pos:pos + h.size])]
        expect = [r for b in self.batches for r in b.records if r[0] >= got[0][0]] if got else []
        if not got:  # only possible when nothing is left at or after offset
            assert not [r for b in self.batches for r in b.records if r[0] >= offset]
            return
        first = BatchHeader.read(raw)
        assert first.base_offset <= max(offset, first.base_offset) and first.last_offset >= offset
        assert got == expect[:len(got)]

    @rule()
    def roll(self):
        self.lg.roll()

    @rule(data=st.data())
    def delete_records(self, data):
        self.lg.high_watermark = self.leo
        x = data.draw(st.integers(self.lso, self.leo))
        self.lg.delete_records_before(x)
        self.lso = x

    @rule(limit=st.integers(0, 5000))
    def retention(self, limit):
        import dataclasses
        self.lg.config = dataclasses.replace(CFG, retention_bytes=limit)
        self.lg.apply_retention()
        self.lg.config = CFG
        assert self.lg.log_start_offset >= self.lso
        self.lso = self.lg.log_start_offset
        self._drop_below_first_segment()

    @rule(data=st.data())
    def truncate(self, data):
        x = data.draw(st.one_of(st.integers(max(0, self.leo - 15), self.leo), st.integers(0, self.leo)))
        if x >= self.leo:
            self.lg.truncate_to(x)
            return
        first_base = self.lg.segments[0].base_offset
        self.lg.truncate_to(x)
        if x <= self.lso or x <= first_base:
            self.batches, self.leo, self.lso = [], x, x
            return
        removed = [b for b in self.batches if b.last >= x]
        self.batches = [b for b in self.batches if b.last < x]
        self.leo = min(x, removed[0].base) if removed else x
        if self.leo < self.lso:  # the cut went below the log start: the log restarts empty there
            self.batches, self.leo = [], self.lso

    @rule()
    def compact(self):
        active_base = self.lg.active_segment.base_offset
        closed = [b for b in self.batches if b.base < active_base]
        latest = {}
        for b in closed:
            for r in b.records:
                latest[r[1]] = r[0]
        self.lg.high_watermark = self.lg.log_end_offset  # all replicated: the cleaner stops at the LSO
        clean(self.lg, force=True)
        out = []
        for b in self.batches:
            if b.base < active_base:
                keep = [r for r in b.records if latest[r[1]] == r[0]]
                if keep:
                    out.append(ModelBatch(keep, None))
            else:
                out.append(b)
        self.batches = out

    @rule(cut=st.floats(0, 1), clean_close=st.booleans())
    def reopen(self, cut, clean_close):
        if clean_close:
            self.lg.close()
        else:
            self._crash(cut)
        self.lg = Log(self.dir, CFG, now_ms=self.clock)
        assert self.lg.recovery_report.clean == clean_close
        active_base = self.lg.active_segment.base_offset
        self.leo = max(self.batches[-1].last + 1 if self.batches else 0, active_base)
        if self.leo < self.lso:  # lost everything up to the durable log start
            self.batches, self.leo = [], self.lso

    def _crash(self, cut):
        """Drop the log without closing; maybe cut unflushed bytes of the active segment."""
        lg = self.lg
        seg = lg.active_segment
        rp = lg.recovery_point
        active = [b for b in self.batches if b.base >= seg.base_offset]
        lg.abandon()
        if not active or rp >= self.leo or any(b.size is None for b in active):
            return
        positions, pos = [], 0
        for b in active:
            positions.append(pos)
            pos += b.size
        flushed = sum(b.size for b in active if b.last < rp)
        at = flushed + int(cut * (pos - flushed))
        os.truncate(seg.log_path, at)
        self.batches = [b for b in self.batches
                        if b.base < seg.base_offset or positions[active.index(b)] + b.size <= at]

    def _drop_below_first_segment(self):
        first = self.lg.segments[0].base_offset
        self.batches = [b for b in self.batches if b.base >= first]

    # -- invariants
    @invariant()
    def offsets_agree(self):
        assert self.lg.log_end_offset == self.leo
        assert self.lg.log_start_offset == self.lso
        assert self.lso <= self.lg.high_watermark <= self.leo

    @invariant()
    def every_record_agrees(self):
        got = [(r.offset, r.key, r.value, r.timestamp) for r in log_records(self.lg)]
        want = [r for b in self.batches for r in b.records if r[0] >= self.lso]
        assert got == want


LogMachine.TestCase.settings = settings(max_examples=120, stateful_step_count=50, deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
test_the_log_agrees_with_a_simple_model = LogMachine.TestCase
