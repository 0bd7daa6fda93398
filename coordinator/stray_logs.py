"""Stray partition logs: directories of partitions this broker no longer hosts — moved away or
deleted while it was down, so it never got the STOP_REPLICA — removed after a delay (the
idea of KIP-858).

Process: ``controller`` (a ``StrayLogs`` object is owned by
``coordinator.cluster_controller.ClusterController``, next to the broker agent).
Owns: ``since`` {(topic, partition) of a directory: when it was first seen stray}.
Every ``STRAY_CHECK_INTERVAL`` it compares the partition directories in ``log.dirs`` with the
last UPDATE_METADATA (every topic, every partition's replicas) and the partitions it hosts. A
directory is stray when its topic is unknown or this broker is not among its partition's
replicas; one stray at every check for ``log.stray.delete.delay.ms`` is closed and deleted
by the log actor it belongs to (``assign {close: [.., delete]}``, as STOP_REPLICA does). No
check runs before the first UPDATE_METADATA from a controller, and a directory that stops
being stray (a new replica, a topic re-created) is forgotten, so only a lasting mismatch
removes data.
"""
from __future__ import annotations

import logging
import os
import re
import time
from typing import Any, Callable

from odradek.actors.messages import Assign
from odradek.actors.names import log_host

log = logging.getLogger("odradek.controller")

STRAY_CHECK_INTERVAL = 1.0  # seconds
PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")


def stray_dirs(names, topics: dict, hosted, broker_id: int) -> list[tuple[str, int]]:
    """(topic, partition) of the directory ``names`` that the metadata ``topics`` does not
    give this broker (pure)."""
    out = []
    for name in names:
        m = PARTITION_DIR.match(name)
        if not m:
            continue
        tp = (m.group(1), int(m.group(2)))
        if tp in hosted:
            continue
        meta = topics.get(tp[0])
        state = (meta or {}).get("state") or []
        if meta is None or tp[1] >= len(state) or broker_id not in (state[tp[1]].get("replicas") or []):
            out.append(tp)
    return out


class StrayLogs:
    """The stray-log cleanup of one broker, owned by the cluster's controller actor:
    ``data_dir`` (the broker's log.dirs), ``broker_id``, ``delay`` (seconds a directory must
    stay stray, ``log.stray.delete.delay.ms``), ``log_hosts`` (how many log actor processes)
    and ``request`` (the actor's, to ask a log actor to delete)."""

    def __init__(self, data_dir: str, broker_id: int, delay: float, log_hosts: int, request: Callable[..., Any]):
        self.data_dir, self.broker_id, self.delay = data_dir, broker_id, delay
        self.log_hosts, self.request = log_hosts, request
        self.since: dict[tuple[str, int], float] = {}  # stray directory -> when first seen stray

    def check(self, metadata: dict, hosted) -> None:
        """One check against ``metadata`` (the last UPDATE_METADATA) and the ``hosted``
        partitions; every ``STRAY_CHECK_INTERVAL``."""
        if metadata.get("version", -1) < 0 or metadata.get("controller_id", -1) < 0:
            return  # no complete picture of the cluster yet
        try:
            names = [n for n in os.listdir(self.data_dir) if os.path.isdir(os.path.join(self.data_dir, n))]
        except OSError:
            return
        stray = set(stray_dirs(names, metadata.get("topics") or {}, hosted, self.broker_id))
        now = time.monotonic()
        self.since = {tp: self.since.get(tp, now) for tp in stray}
        for tp, since in list(self.since.items()):
            if now - since >= self.delay:
                del self.since[tp]
                log.warning("%s-%d: this broker holds no replica of it (moved or deleted while it was away) "
                            "for %.0fs: removing its directory", tp[0], tp[1], self.delay)
                self.request(log_host(tp[0], tp[1], self.log_hosts),
                             Assign(close=[{"topic": tp[0], "partition": tp[1], "topic_id": "", "delete": True}]),
                             timeout=30.0)
