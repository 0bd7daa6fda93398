"""A failed fsync (EIO) on a partition leader in a cluster (issue 33): its log directory goes
offline, the broker shuts down (its only log directory failed: Kafka halts there too), the
partition's leadership moves to another in-sync replica, and no acknowledged record is lost.

The EIO is injected into the leader's processes by a ``sitecustomize`` on its PYTHONPATH:
once the trigger file exists, ``os.fsync`` of a file of the test's topic raises EIO, as a
failing disk's write-back would."""
from __future__ import annotations

import itertools
import os
import textwrap
import time

import pytest

from odradek import Producer
from odradek.local import LocalCluster
from tests.cluster.fixtures import TEST_SETTINGS
from tests.cluster.test_faults import create_replicated_topic, wait_healed
from tests.cluster.verify import AckedLog, check_logs, read_all

pytestmark = pytest.mark.slow

TOPIC = "eio-topic"

SITE = '''
import errno, os
_trigger = os.environ.get("ODRADEK_TEST_EIO_TRIGGER")
if _trigger:
    _real = os.fsync

    def _fsync(fd):
        if os.path.exists(_trigger):
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                path = ""
            if "/eio-topic-" in path:
                raise OSError(errno.EIO, "Input/output error")
        return _real(fd)
    os.fsync = _fsync
'''

_chroots = itertools.count(1)


def produce(bootstrap: str, acked: AckedLog, prefix: bytes, n: int) -> None:
    with Producer(bootstrap, acks="all", linger_ms=0, request_timeout_ms=15000, delivery_timeout_ms=60000) as p:
        for i in range(n):
            value = b"%s-%d" % (prefix, i)
            acked.track(p.send(TOPIC, value, partition=0), value)
            if i % 20 == 19:
                p.flush(timeout=90)
        p.flush(timeout=90)


def test_a_failed_fsync_takes_the_leaders_log_directory_offline_and_leadership_moves(zookeeper, tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(SITE))
    triggers = {i: str(tmp_path / f"eio-{i}") for i in (1, 2, 3)}
    path = os.environ.get("PYTHONPATH")
    env = {i: {"ODRADEK_TEST_EIO_TRIGGER": t, "PYTHONPATH": str(site) + (os.pathsep + path if path else "")}
           for i, t in triggers.items()}
    cluster = LocalCluster(str(tmp_path / "cluster"), 3, dict(TEST_SETTINGS), zk=zookeeper,
                           chroot=f"/odradek-eio-{os.getpid()}-{next(_chroots)}", broker_env=env)
    try:
        cluster.start()
        cluster.wait_ready()
        create_replicated_topic(cluster, TOPIC, partitions=1)
        acked = AckedLog()
        produce(cluster.bootstrap, acked, b"before", 50)
        assert len(acked) == 50 and not acked.failed
        leader = cluster.leader(TOPIC, 0)
        open(triggers[leader], "w").close()  # the leader's disk fails from now on

        produce(cluster.bootstrap, acked, b"after", 100)  # retried on the new leader
        broker = cluster.broker(leader)
        cluster.wait_for(lambda: broker.proc.poll() is not None, 60, f"broker {leader} to shut down")
        assert broker.proc.returncode == 1
        assert "offline" in broker.stderr_tail(400), broker.stderr_tail(40)
        new = cluster.leader(TOPIC, 0)
        assert new is not None and new != leader
        assert len(acked) == 150, f"{acked.failed} failed"  # every send acknowledged in the end
        problems = check_logs(acked, read_all(cluster.broker(new).bootstrap, TOPIC, [0]))
        assert not problems, problems[:5]
    finally:
        cluster.stop(graceful=False)
