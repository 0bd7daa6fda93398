"""``odradek chaos --power-cut``: power lost by every broker at once (so by the last in-sync
replicas of every partition), and what acknowledged writes it costs, with a topic's
``flush.messages`` as given (docs/RELIABILITY.md, "Power loss of the last in-sync replica").

Runs in the caller's process, like ``chaos.runner``, and owns what it starts: a ZooKeeper and
a ``LocalCluster`` whose brokers record every fsync (``chaos.fsync_trace``). The run: create
the topic (RF = brokers, ``min.insync.replicas=2``, ``flush.messages``) -> the chaos producers
(acks=all, unique integers) as fast as they go for ``seconds`` (their acknowledgements per
second are the throughput figure) -> kill -9 of every broker -> each broker's segments cut
to what it had fsynced, plus a torn write -> every broker restarted -> the producers'
unfinished sends finish -> a fresh reader reads every partition up to its high watermark
-> ``lost``: acknowledged values absent from it (and those acknowledged before the cut);
``replicas_holding_all_acked``: per partition, the replicas whose files kept every record
acknowledged before the cut (read right after the cut, before any restart); with the default
``log.flush.before.ack`` at least ``min.insync.replicas`` (2) of them.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
import time

from odradek.chaos import fsync_trace
from odradek.chaos.nemesis import power_cut_all
from odradek.chaos.replicas import high_watermarks, replica_batches
from odradek.chaos.runner import CLUSTER_SETTINGS, ChaosOptions, compare_replicas, create_topic, wait_healed
from odradek.chaos.workload import History, Workload, read_everything


def power_cut(seconds: float = 20.0, flush_messages: int | None = None, brokers: int = 3, partitions: int = 3,
              producers: int = 2, seed: int = 0, work_dir: str | None = None, log=print,
              settings: dict | None = None) -> dict:
    """``settings``: broker settings over the battery's (``{"log.flush.before.ack": False}``
    for Kafka's acknowledgement)."""
    from odradek.local import LocalCluster, LocalZooKeeper
    work = work_dir or tempfile.mkdtemp(prefix="odradek-powercut-")
    rng = random.Random(seed)
    zk = cluster = load = None
    try:
        zk = LocalZooKeeper(os.path.join(work, "zookeeper")).start()
        traces = {i: os.path.join(work, f"fsyncs-{i}") for i in range(1, brokers + 1)}
        cluster = LocalCluster(work, brokers, {**CLUSTER_SETTINGS, **(settings or {})}, zk=zk, chroot="/odradek", start_timeout=180,
                               broker_env={i: fsync_trace.env(d) for i, d in traces.items()})
        log(f"power cut: {brokers} brokers in {work}, flush.messages={flush_messages or 'default'}, "
            f"settings {settings or {}}")
        cluster.start()
        cluster.wait_ready(60)
        topic = "powercut"
        create_topic(cluster.bootstrap, topic, ChaosOptions(brokers=brokers, partitions=partitions,
                                                            flush_messages=flush_messages))
        wait_healed(cluster, topic, partitions, 60)
        history = History()
        load = Workload(cluster.bootstrap, topic, partitions, history, producers, consumers=0, rate=1e6).start()
        time.sleep(2)  # connected, metadata known: then the measured stretch
        t0, acked0 = time.monotonic(), _acked(history)
        time.sleep(seconds)
        elapsed, acked = time.monotonic() - t0, _acked(history)
        cut = power_cut_all(cluster, traces, rng)  # the power goes: every broker at once
        load._stop_producing.set()  # no new sends; the unfinished ones finish after the restart
        cut_at = history.now()
        acks = [e for e in history.snapshot() if e["type"] == "ack"]
        before_cut = {e["value"] for e in acks}
        # what each replica kept of what was acknowledged: the end of its surviving batches
        # against the end of the acknowledged records, per partition (an in-sync replica below
        # it would mean the cut took something below the high watermark there)
        acked_end = {q: max([e["offset"] + 1 for e in acks if e["partition"] == q], default=0)
                     for q in range(partitions)}
        kept = {q: {i: _end(replica_batches(cluster.broker(i).data_dir, topic, q)) for i in cluster.ids}
                for q in range(partitions)}
        log(f"power cut at {cut_at:.1f}s: {len(before_cut)} acknowledged; bytes cut per broker "
            f"{ {i: sum(n for _, n in c) for i, c in cut.items()} }")
        for i in cluster.ids:
            cluster.restart(i)
        wait_healed(cluster, topic, partitions, 180)
        load.stop_producers()
        ends = high_watermarks(cluster.bootstrap, topic, range(partitions))
        final = {v for _, _, v in read_everything(cluster.bootstrap, topic, partitions, ends)}
        divergence = compare_replicas(cluster, topic, partitions, ends)
        events = history.snapshot()
        all_acked = {e["value"] for e in events if e["type"] == "ack"}
        result = {
            "flush_messages": flush_messages, "settings": settings or {}, "seed": seed,
            "seconds": round(elapsed, 1),
            "acked_per_s": round((acked - acked0) / elapsed, 1),
            "acked_before_cut": len(before_cut), "acked": len(all_acked),
            "lost": len(all_acked - final), "lost_acked_before_cut": len(before_cut - final),
            "failed": sum(1 for e in events if e["type"] == "fail"),
            "bytes_cut": {i: sum(n for _, n in c) for i, c in cut.items()},
            "files_cut": {i: len(c) for i, c in cut.items()},
            "high_watermarks": ends,
            "replica_divergence": len(divergence), "divergence_examples": divergence[:5],
            "acknowledged_end": acked_end, "kept_after_cut": kept,
            # replicas per partition that kept every acknowledged record through the cut
            "replicas_holding_all_acked": {q: sum(1 for end in kept[q].values() if end >= acked_end[q])
                                           for q in range(partitions)},
        }
        log(f"power cut: {result}")
        return result
    finally:
        if load is not None:
            load.stop()
        if cluster is not None:
            cluster.stop(graceful=False)
        if zk is not None:
            zk.stop()
        if not work_dir:
            shutil.rmtree(work, ignore_errors=True)


def _end(batches: list) -> int:
    return batches[-1][1] + 1 if batches else 0


def _acked(history: History) -> int:
    return sum(1 for e in history.snapshot() if e["type"] == "ack")
