"""20,000 partitions on one broker, killed -9 and restarted (issue 18, "4. Partitions").

The issue's figure: one broker holds 20,000 partitions (20 topics of 1,000, two log actors of
10,000 each) without running out of descriptors (open segment files are a bounded cache,
``log.files``), and after a kill -9 it is ready and serves every acknowledged record while
its partitions are still being opened in the background; a produce to a partition not yet
opened waits for it. Creating them takes most of the time (~7 s per 1,000 on a loaded
2-core machine: new partitions are made durable together, ``log.files.SyncBatch``). Default
segment settings: a partition costs ~8 KiB of disk. Time to ready is measured, not asserted
here: ``python -m odradek.bench.restart`` (docs/BENCHMARKS.md).
"""
from __future__ import annotations

import time

import psutil
import pytest

from odradek import Admin, Producer
from odradek.local import LocalBroker
from odradek.log.files import ACTIVE_SEGMENTS_PER_PROCESS, OPEN_FILES_PER_PROCESS
from tests.log.test_lazy_open import opening, read

TOPICS = 20
PER_TOPIC = 1000
OPEN_WITHIN_S = 600  # a bound, not a goal: every partition opened in the background after the restart
SAMPLE_EVERY = 50  # one record in every 50th partition: 400 partitions
# what one log actor may hold open: its descriptor cache and its active segments (three each);
# unbounded, 10,000 partitions a log actor held 30,000 (EMFILE)
FD_BOUND = OPEN_FILES_PER_PROCESS + 3 * ACTIVE_SEGMENTS_PER_PROCESS + 256


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_broker_with_20000_partitions_killed_9_is_ready_and_keeps_every_acknowledged_record(tmp_path):
    data = str(tmp_path / "data")
    names = [f"scale-{i}" for i in range(TOPICS)]
    sample = [(t, p) for t in names for p in range(0, PER_TOPIC, SAMPLE_EVERY)]
    first = LocalBroker(data, {"shutdown.timeout.ms": 10000}, start_timeout=120.0).start()
    try:
        with Admin(first.bootstrap, request_timeout_ms=600000) as admin:
            for name in names:
                admin.create_topic(name, partitions=PER_TOPIC)
        with Producer(first.bootstrap, acks=-1, linger_ms=5) as p:
            handles = {(t, n): p.send(t, b"%s-%d" % (t.encode(), n), partition=n) for t, n in sample}
            p.flush(timeout=120)
        acked = {(t, n): (h.result(timeout=60).offset, b"%s-%d" % (t.encode(), n)) for (t, n), h in handles.items()}
    finally:
        first.kill()
    broker = LocalBroker(data, {"shutdown.timeout.ms": 10000}, start_timeout=120.0).start()
    try:
        # served while the background opening may still be going: every acknowledged record
        for name in names:
            got = read(broker.bootstrap, name, [n for t, n in sample if t == name])
            for (t, n), (offset, value) in acked.items():
                if t == name:
                    assert got.get((n, offset)) == value, f"{t}-{n}: acknowledged offset {offset} not read back"
        with Producer(broker.bootstrap, acks=-1) as p:  # a partition that held nothing takes a write
            m = p.send(names[-1], b"after", partition=PER_TOPIC - 1).result(timeout=60)
        assert m.offset == 0
        deadline = time.monotonic() + OPEN_WITHIN_S
        while left := opening(broker):
            assert time.monotonic() < deadline, f"{len(left)} partitions still not open, e.g. {sorted(left)[:5]}"
            time.sleep(1.0)
        for actor in broker.status()["actors"]:  # every partition open: descriptors stay bounded
            if actor["role"] == "log":
                fds = psutil.Process(actor["pid"]).num_fds()
                assert fds <= FD_BOUND, f"{actor['name']} holds {fds} descriptors for {TOPICS * PER_TOPIC // 2} partitions"
    finally:
        broker.discard()
