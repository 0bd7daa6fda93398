"""Replica files as a reader outside the broker sees them, read-only.

``replica_batches(data_dir, topic, partition, upto)`` walks one replica's segment files and
returns ``(base_offset, last_offset, partition_leader_epoch, crc)`` per batch below ``upto``
(a torn or zero-filled tail ends the walk, as recovery would). ``replica_problems(views,
reference, upto)`` compares replicas by those four fields. ``high_watermarks`` asks the
cluster (ListOffsets latest). Used by the chaos checker (divergence below the high
watermark) and by the cluster tests (tests/cluster/verify.py).
"""
from __future__ import annotations

import logging
import os
import time

from odradek import Admin, TopicPartition
from odradek.cluster import NETWORK_ERRORS
from odradek.core.protocol import OdradekError
from odradek.core.records import CorruptRecordError, iter_batches
from odradek.log.segment import SEGMENT_RE

log = logging.getLogger("odradek.chaos")


def partition_dir(data_dir: str, topic: str, partition: int) -> str:
    return os.path.join(data_dir, f"{topic}-{partition}")


def segment_bases(directory: str) -> list[int]:
    """Base offsets of the ``.log`` segments in a partition directory, ascending ([] if none)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for m in map(SEGMENT_RE.fullmatch, names)
                  if m and m.group(2) == "log" and not m.group(3))


def replica_batches(data_dir: str, topic: str, partition: int, upto: int | None = None) -> list[tuple]:
    """``[(base_offset, last_offset, epoch, crc)]`` of the replica's batches with
    ``base_offset < upto`` (all when ``upto`` is None), in log order. Missing directory: ``[]``."""
    directory = partition_dir(data_dir, topic, partition)
    out: list[tuple] = []
    for base in segment_bases(directory):
        try:
            with open(os.path.join(directory, f"{base:020d}.log"), "rb") as f:
                buf = f.read()
        except FileNotFoundError:  # deleted by retention or a truncation while we listed
            continue
        try:
            for _, h in iter_batches(buf):
                if upto is not None and h.base_offset >= upto:
                    return out
                out.append((h.base_offset, h.last_offset, h.partition_leader_epoch, h.crc))
        except CorruptRecordError:
            pass  # a torn or preallocated tail: the rest of this segment is not log
    return out


def high_watermarks(bootstrap: str, topic: str, partitions, timeout: float = 120.0) -> dict[int, int]:
    """``{partition: high watermark}`` as consumers see it (ListOffsets latest, from the leader).
    Retriable failures are retried until ``timeout``: a broker restarted by the heal is
    registered (and leads) before its actors answer on a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with Admin(bootstrap, request_timeout_ms=10000) as admin:
                ends = admin.list_offsets([TopicPartition(topic, p) for p in partitions])
            return {tp.partition: off for tp, off in ends.items()}
        except OdradekError as exc:
            if not (exc.retriable or exc.code in NETWORK_ERRORS) or time.monotonic() >= deadline:
                raise
            log.info("chaos: high watermarks not read yet (%s); retrying", exc)
            time.sleep(1.0)


def replica_problems(views: dict[int, list], reference: int, upto: int) -> list[str]:
    """What differs between replicas' batch lists (``{broker_id: batches}``) below ``upto``."""
    problems = []
    ref = views[reference]
    for broker_id, batches in sorted(views.items()):
        end = batches[-1][1] + 1 if batches else 0
        if upto > 0 and end < upto:
            problems.append(f"replica {broker_id} ends at offset {end}, below the high watermark {upto}")
        for (a, b) in zip(batches, batches[1:]):
            if b[0] != a[1] + 1:
                problems.append(f"replica {broker_id}: gap or overlap between batch {a[:2]} and {b[:2]}")
                break
        if broker_id == reference:
            continue
        for mine, theirs in zip(batches, ref):
            if mine != theirs:
                problems.append(f"replica {broker_id} differs from replica {reference}: batch "
                                f"(base, last, epoch, crc) {mine} vs {theirs}")
                break
        else:
            if len(batches) != len(ref) and end >= upto and (ref[-1][1] + 1 if ref else 0) >= upto:
                problems.append(f"replica {broker_id} has {len(batches)} batches below {upto}, "
                                f"replica {reference} {len(ref)}")
    return problems
