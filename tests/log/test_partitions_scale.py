"""Many partitions on one broker, killed -9 and restarted (issue 18, "4. Partitions").

The issue's figure is 20,000 partitions. Creating them costs 10-50 s per 1,000 on the
suite's loaded 2-core machine (three fsyncs per partition: docs/BENCHMARKS.md, issue 18),
so 20,000 would take 4-15 minutes before the test even starts: it is measured with
``python -m odradek.bench.restart`` instead (the figures are in BENCHMARKS.md), and this
test runs the same path at 2,000 partitions (two topics of 1,000), the most that stays
within ~2 minutes here. Default segment settings: a partition costs ~8 KiB of disk.
"""
from __future__ import annotations

import pytest

from odradek import Admin, Producer
from odradek.local import LocalBroker
from tests.log.test_lazy_open import opening, read, wait_until_all_open

TOPICS = 2
PER_TOPIC = 1000
SAMPLE_EVERY = 25  # one record in every 25th partition: 80 partitions


@pytest.mark.slow
def test_a_broker_with_2000_partitions_killed_9_is_ready_and_keeps_every_acknowledged_record(tmp_path):
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
        wait_until_all_open(broker)
        assert not opening(broker)
    finally:
        broker.discard()
