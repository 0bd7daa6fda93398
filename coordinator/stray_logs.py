"""Stray partition logs: directories of partitions this broker no longer hosts — moved away or
deleted while it was down, so it never got the STOP_REPLICA — removed after a delay (the
idea of KIP-858).

Process: ``controller`` (``StrayLogsMixin`` is mixed into
``coordinator.cluster_controller.ClusterController``, next to the broker agent).
Owns: ``stray_since`` {directory name: when it was first seen stray}.
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


class StrayLogsMixin:
    """Expects ``args`` (data_dir), ``config``, ``broker_id``, ``snapshot_data``, ``hosted``,
    ``log_hosts`` and the actor's ``request``."""

    stray_since: dict

    def _check_stray_logs(self) -> None:
        if self.snapshot_data.get("version", -1) < 0 or self.snapshot_data.get("controller_id", -1) < 0:
            return  # no complete picture of the cluster yet
        data_dir = self.args["data_dir"]
        try:
            names = [n for n in os.listdir(data_dir) if os.path.isdir(os.path.join(data_dir, n))]
        except OSError:
            return
        stray = set(stray_dirs(names, self.snapshot_data.get("topics") or {}, self.hosted, self.broker_id))
        now = time.monotonic()
        self.stray_since = {tp: self.stray_since.get(tp, now) for tp in stray}
        delay = self.config.get("log.stray.delete.delay.ms", 300000) / 1000
        for tp, since in list(self.stray_since.items()):
            if now - since >= delay:
                del self.stray_since[tp]
                log.warning("%s-%d: this broker holds no replica of it (moved or deleted while it was away) "
                            "for %.0fs: removing its directory", tp[0], tp[1], delay)
                self.request(log_host(tp[0], tp[1], self.log_hosts), "assign",
                             {"close": [{"topic": tp[0], "partition": tp[1], "topic_id": "", "delete": True}]},
                             timeout=30.0)
