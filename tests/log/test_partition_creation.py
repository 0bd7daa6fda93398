"""Creating many partitions at once (log/log_actor.py ``_create_durably``, log.files.SyncBatch):
the new partitions' files are written first and made durable together, yet a created topic
is exactly as durable as when each partition was made durable on its own.

The broker records every fsync of its processes (``odradek.chaos.fsync_trace``: one trace
file per process, lines in the order the fsyncs returned), so what reached the disk before
the CreateTopics answer is read, not assumed; a kill -9 right after the answer then checks
that the batch left every partition whole and nothing half-written behind.
"""
from __future__ import annotations

import os

import pytest

from odradek import Admin, Producer
from odradek.errors import MessageTooLargeError
from odradek.log.files import SyncBatch
from odradek.chaos import fsync_trace
from odradek.local import LocalBroker
from tests.log.test_lazy_open import read

TOPIC = "many"
PARTITIONS = 100
SAMPLE = range(0, PARTITIONS, 10)
LIMIT = 4000  # the topic's own max.message.bytes: its configuration reaches the log actors again after a restart


def _traces(trace_dir: str) -> list[list[str]]:
    """Each process's fsynced paths, in the order they returned."""
    out = []
    for name in sorted(os.listdir(trace_dir)):
        with open(os.path.join(trace_dir, name)) as f:
            out.append([line.split(" ", 1)[1] for line in f.read().splitlines() if " " in line])
    return out


def test_a_topic_of_100_partitions_is_on_disk_before_its_creation_is_answered_and_whole_after_a_kill_9(tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    data_real = os.path.realpath(data)
    traces = str(tmp_path / "fsyncs")
    first = LocalBroker(data, {"shutdown.timeout.ms": 10000}, start_timeout=120.0, env=fsync_trace.env(traces))
    first.start()
    try:
        with Admin(first.bootstrap, request_timeout_ms=300000) as admin:
            admin.create_topic(TOPIC, partitions=PARTITIONS, config={"max.message.bytes": str(LIMIT)})
        # the answer came: read what each process had fsynced by then
        dirs = {os.path.join(data_real, f"{TOPIC}-{p}"): p for p in range(PARTITIONS)}
        seen: set[int] = set()
        for lines in _traces(traces):
            at = {path: i for i, path in enumerate(lines)}  # the last fsync of each path
            mine = [d for d in dirs if d in at]
            if not mine:
                continue
            for d in mine:
                seen.add(dirs[d])
                for name in ("partition.metadata", "leader-epoch-checkpoint"):
                    written = [i for i, path in enumerate(lines) if path in (os.path.join(d, name),
                                                                              os.path.join(d, name + ".tmp"))]
                    assert written, f"{d}/{name} was never fsynced before the creation was answered"
                    assert max(written) < at[d], f"{d} was fsynced before its {name}: the rename may be lost"
            assert data_real in at, "the data directory (the new partition directories' entries) was never fsynced"
            assert at[data_real] > max(at[d] for d in mine), \
                "the data directory was fsynced before a new partition directory was made"
        assert seen == set(dirs.values()), f"partitions never fsynced: {sorted(set(dirs.values()) - seen)[:10]}"
    finally:
        first.kill()
    left = [os.path.join(r, n) for r, _, names in os.walk(data) for n in names if n.endswith(".tmp")]
    assert not left, f"temp files left behind by the creation: {left[:5]}"
    ids = set()
    for p in range(PARTITIONS):
        with open(os.path.join(data, f"{TOPIC}-{p}", "partition.metadata")) as f:
            ids.add(f.read())
    assert len(ids) == 1 and "topic_id: " in ids.pop()
    broker = LocalBroker(data, {"shutdown.timeout.ms": 10000}, start_timeout=120.0).start()
    try:
        with Producer(broker.bootstrap, acks=-1, linger_ms=5) as p:
            handles = {n: p.send(TOPIC, b"after-%d" % n, partition=n) for n in SAMPLE}
            p.flush(timeout=60)
        offsets = {n: h.result(timeout=60).offset for n, h in handles.items()}
        assert set(offsets.values()) == {0}, offsets
        got = read(broker.bootstrap, TOPIC, list(SAMPLE))
        assert got == {(n, 0): b"after-%d" % n for n in SAMPLE}
        with Producer(broker.bootstrap, acks=1, compression=None, retries=0) as p:
            with pytest.raises(MessageTooLargeError):
                p.send(TOPIC, b"x" * (2 * LIMIT), partition=PARTITIONS - 1).result(timeout=60)
    finally:
        broker.discard()


class _Recorded(SyncBatch):
    """A SyncBatch that notes each fsync and rename it really does, in order."""

    def __init__(self):
        super().__init__(threads=4)
        self.done: list[tuple[str, str]] = []

    def fsync_path(self, path):
        super().fsync_path(path)
        self.done.append(("file", path))

    def rename(self, src, dst):
        super().rename(src, dst)
        self.done.append(("rename", dst))

    def fsync_dir(self, path):
        super().fsync_dir(path)
        if not self.deferring:
            self.done.append(("dir", path))


def test_a_sync_batch_fsyncs_each_file_then_renames_it_then_fsyncs_each_directory_once_and_their_parent(tmp_path):
    batch = _Recorded()
    dirs = [str(tmp_path / f"t-{i}") for i in range(5)]
    for d in dirs:
        os.makedirs(d)
        for name in ("partition.metadata", "leader-epoch-checkpoint"):
            batch.write_file_atomically(os.path.join(d, name), b"first")
            batch.write_file_atomically(os.path.join(d, name), d.encode())  # written twice: one file
        batch.fsync_dir(d)
        batch.fsync_dir(d)
        assert not os.path.exists(os.path.join(d, "partition.metadata")), "in place before commit"
    assert batch.done == []
    batch.commit()
    kinds = [k for k, _ in batch.done]
    assert kinds == ["file"] * 10 + ["rename"] * 10 + ["dir"] * 6
    synced_dirs = [p for k, p in batch.done if k == "dir"]  # each phase's order is its threads'
    assert sorted(synced_dirs[:-1]) == sorted(dirs) and synced_dirs[-1] == str(tmp_path)  # the parent last
    for d in dirs:
        assert sorted(os.listdir(d)) == ["leader-epoch-checkpoint", "partition.metadata"]
        with open(os.path.join(d, "partition.metadata"), "rb") as f:
            assert f.read() == d.encode()
    batch.fsync_dir(dirs[0])  # after the commit: a plain FileLayer again
    assert batch.done[-1] == ("dir", dirs[0])


def test_a_sync_batch_reports_its_progress_as_the_fsyncs_complete(tmp_path):
    batch = SyncBatch(threads=2)
    for i in range(3):
        d = tmp_path / f"t-{i}"
        d.mkdir()
        batch.write_file_atomically(str(d / "partition.metadata"), b"x")
        batch.fsync_dir(str(d))
    seen = []
    batch.commit(lambda done, of: seen.append((done, of)))
    assert seen == [(n, 7) for n in range(1, 8)]  # 3 files, 3 directories, their parent


def test_a_creation_that_holds_the_log_actors_longer_than_the_liveness_timeout_is_answered_and_kills_nothing(tmp_path):
    """The log actors create a topic's partitions in one callback: 5,000 each held them past
    the supervisor's liveness timeout (30 s) under load, they were killed -9 and restarted, and
    the creation was never answered. The creation reports its progress, which is a heartbeat.
    Here the timeout is 3 s and each log actor creates 1,000 partitions (3-20 s on this
    machine): seen failing before (log actors killed for silence, the creation failed)."""
    broker = LocalBroker(str(tmp_path / "data"), {"supervisor.liveness.timeout.ms": 3000},
                         start_timeout=120.0).start()
    try:
        with Admin(broker.bootstrap, request_timeout_ms=300000) as admin:
            admin.create_topic("slow", partitions=2000)
        restarted = {a["name"]: a["restarts"] for a in broker.status()["actors"] if a["restarts"]}
        assert restarted == {}, restarted
        with Producer(broker.bootstrap, acks=-1) as p:  # both log actors' partitions take a write
            assert [p.send("slow", b"x", partition=n).result(timeout=60).offset for n in (0, 1999)] == [0, 0]
    finally:
        broker.discard()
