"""Replication throttles, the broker side: which replicas a reassignment is adding here, and
the rates their traffic must keep to.

Process: ``controller`` (``ThrottleMixin`` is mixed into
``coordinator.cluster_controller.ClusterController``, next to the broker agent).
Owns: this broker's throttle rates, ``leader.replication.throttled.rate`` and
``follower.replication.throttled.rate`` (bytes/s): the broker config, overridden at run time
by IncrementalAlterConfigs on the broker (``odradek reassign --execute --throttle``), which
is kept where Kafka keeps it, ``/config/brokers/<id>``, so it outlives a restart.
Accepts:
  set_throttle_rates {rates: {name: bytes/s or null}}   from a handler (null: back to the
        broker config); answered ``{}`` once recorded in ZooKeeper
Sends ``throttle`` to the replica fetcher (the partitions whose new replica this broker is:
their fetches share the follower rate) and to the fetch actor (the new replicas of
partitions led here: what they fetch shares the leader rate) whenever LEADER_AND_ISR,
STOP_REPLICA or a rate changes. The throttled replicas are exactly the ``adding_replicas``
of the moves in progress (what kafka-reassign-partitions puts in a topic's
``*.replication.throttled.replicas`` lists), so a throttle touches only a move's traffic
and ends with it.
"""
from __future__ import annotations

import json
import logging

from odradek.actors.message import Message
from odradek.coordinator.zk_state import BROKER_CONFIGS, to_json
from odradek.log.throttle import UNLIMITED

log = logging.getLogger("odradek.controller")

RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")


class ThrottleMixin:
    """Expects ``broker_id``, ``config``, ``zk``, ``hosted`` and the actor's ``request``."""

    throttle_overrides: dict

    def _load_throttle_rates(self) -> None:
        self.throttle_overrides = {}
        try:
            raw, _ = self.zk.get(f"{BROKER_CONFIGS}/{self.broker_id}")
            self.throttle_overrides = {k: int(v) for k, v in json.loads(raw).get("config", {}).items() if k in RATES}
        except Exception:  # noqa: BLE001 - no node: the broker config applies
            pass

    def throttle_rate(self, name: str) -> int:
        return int(self.throttle_overrides.get(name) or self.config.get(name) or UNLIMITED)

    def on_set_throttle_rates(self, msg: Message) -> None:
        for name, value in (msg.get("rates") or {}).items():
            if name in RATES:
                if value is None:
                    self.throttle_overrides.pop(name, None)
                else:
                    self.throttle_overrides[name] = int(value)
        path = f"{BROKER_CONFIGS}/{self.broker_id}"
        data = to_json({"version": 1, "config": {k: str(v) for k, v in self.throttle_overrides.items()}})
        try:
            self.zk.ensure_path(BROKER_CONFIGS)
            if self.zk.exists(path):
                self.zk.set(path, data)
            else:
                self.zk.create(path, data)
        except Exception as exc:  # noqa: BLE001 - applied anyway; lost on restart
            log.warning("throttle rates not recorded in ZooKeeper (they apply until a restart): %s", exc)
        log.info("replication throttle rates now %s", {n: self.throttle_rate(n) for n in RATES})
        self._tell_throttles()
        self.reply(msg, {})

    def _tell_throttles(self, force: bool = False) -> None:
        """Tell the replica fetcher and the fetch actor what is throttled now (when it changed,
        or ``force``: one of them restarted)."""
        follower, leader = [], []
        for (topic, partition), e in self.hosted.items():
            adding = e.get("adding_replicas") or []
            if e.get("leader") == self.broker_id:
                leader += [[topic, partition, r] for r in adding]
            elif self.broker_id in adding:
                follower.append([topic, partition])
        now = (self.throttle_rate(RATES[0]), self.throttle_rate(RATES[1]), sorted(leader), sorted(follower))
        if now == getattr(self, "_told_throttles", None) and not force:
            return
        self._told_throttles = now
        self.request("replica_fetcher", "throttle", {"rate": self.throttle_rate(RATES[1]), "parts": follower},
                     timeout=30.0)
        self.request("fetch", "throttle", {"rate": self.throttle_rate(RATES[0]), "parts": leader}, timeout=30.0)
