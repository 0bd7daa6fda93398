"""Quotas: a producer over its byte rate is throttled to within 10% of it and loses nothing
(real broker; the quota set with ``odradek configs --entity-type clients`` while it runs)."""
from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from odradek import Admin, Consumer, Producer
from odradek.local import LocalBroker
from odradek.types import TopicPartition

RATE = 200_000  # bytes/s
RECORDS, SIZE = 1200, 1000


@pytest.fixture(scope="module")
def quota_broker(tmp_path_factory):
    broker = LocalBroker(str(tmp_path_factory.mktemp("quota-broker")), {"shutdown.timeout.ms": 10000},
                         start_timeout=240).start()
    try:
        yield broker
    finally:
        broker.stop()


def test_a_producer_over_its_byte_rate_is_throttled_to_within_ten_percent_and_loses_nothing(quota_broker):
    out = subprocess.run([sys.executable, "-m", "odradek", "configs", "--set", f"log.dirs={quota_broker.data_dir}",
                          "--entity-type", "clients", "--entity-name", "slow-producer", "--alter",
                          "--add-config", f"producer_byte_rate={RATE}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    with Admin(quota_broker.bootstrap) as admin:
        admin.create_topic(topic)
    time.sleep(0.5)  # processors re-read the quotas within 0.2 s
    with Producer(quota_broker.bootstrap, client_id="slow-producer", linger_ms=5, batch_size=16384,
                  compression=None) as p:
        began = time.monotonic()
        futures = [p.send(topic, b"%06d" % i + bytes(SIZE - 6)) for i in range(RECORDS)]
        offsets = [f.get(60).offset for f in futures]
        elapsed = time.monotonic() - began
    rate = RECORDS * SIZE / elapsed
    assert RATE * 0.9 <= rate <= RATE * 1.1, f"{rate:.0f} B/s against a quota of {RATE}"
    assert offsets == list(range(RECORDS))
    with Consumer(quota_broker.bootstrap, auto_offset_reset="earliest") as c:  # no quota on this client
        c.assign([TopicPartition(topic, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < RECORDS and time.monotonic() < deadline:
            got += [r.value[:6] for r in c.poll(500)]
    assert got == [b"%06d" % i for i in range(RECORDS)]
