"""Replication throttles, the broker side: which replicas a reassignment is adding here, and
the rates their traffic must keep to.

Process: ``controller`` (a ``Throttles`` object owned by the broker agent,
``coordinator.broker_agent.BrokerAgent``; no messages of its own).
Owns: this broker's ``leader.replication.throttled.rate`` and
``follower.replication.throttled.rate`` (bytes/s): the broker config, overridden at run time by
``set_throttle_rates {rates: {name: bytes/s or null}}`` (IncrementalAlterConfigs on the broker,
through the actor: ``set_rates``), written where Kafka keeps them, ``/config/brokers/<id>``, so
they outlive a restart (if ZooKeeper cannot be reached they apply until a restart).
Sends ``throttle`` to the replica fetcher (the partitions followed here whose replica here is
throttled: their fetches share the follower rate) and to the fetch actor (the replicas of
partitions led here whose fetches are throttled: they share the leader rate) whenever
LEADER_AND_ISR, UPDATE_METADATA (a topic's configs), STOP_REPLICA or a rate changes, and in
full whenever either of them (re)starts.
Which replicas are throttled is Kafka's rule, from each topic's
``leader.replication.throttled.replicas`` and ``follower.replication.throttled.replicas``
(``*`` or ``partition:broker,...``): partition p's replicas outside the ISR, on the leader side
when ``p:<this broker>`` (or ``*``) is in the leader list; this broker's replica of p, on the
follower side, when it is in the follower list and outside the ISR. The ISR is the one of
p's last LEADER_AND_ISR.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Callable

from odradek.actors.names import FETCH_ACTOR, REPLICA_FETCHER
from odradek.actors.messages import Throttle, ThrottledReplica
from odradek.coordinator.zk_state import BROKER_CONFIGS, to_json
from odradek.log.throttle import UNLIMITED

log = logging.getLogger("odradek.controller")

RATES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")


class Throttles:
    """This broker's replication throttles, owned by its broker agent: ``broker_id`` and
    ``config`` (the broker config's rates), ``zk`` (a started kazoo client, where run-time
    rates are kept) and ``request`` (the actor's, to tell the replica fetcher and the fetch
    actor)."""

    def __init__(self, broker_id: int, config, zk, request: Callable[..., Any]):
        self.broker_id, self.config, self.zk, self.request = broker_id, config, zk, request
        self.overrides: dict[str, int] = {}
        self._told = None  # what the fetchers were told last

    def load(self) -> None:
        """The rates recorded at run time (``/config/brokers/<id>``), if any."""
        self.overrides = {}
        try:
            raw, _ = self.zk.get(f"{BROKER_CONFIGS}/{self.broker_id}")
            self.overrides = {k: int(v) for k, v in json.loads(raw).get("config", {}).items() if k in RATES}
        except Exception:  # noqa: BLE001 - no node: the broker config applies
            pass

    def rate(self, name: str) -> int:
        return int(self.overrides.get(name) or self.config.get(name) or UNLIMITED)

    def set_rates(self, rates: dict) -> None:
        """``set_throttle_rates``: record the new rates (null: back to the broker config)."""
        for name, value in rates.items():
            if name in RATES:
                if value is None:
                    self.overrides.pop(name, None)
                else:
                    self.overrides[name] = int(value)
        path = f"{BROKER_CONFIGS}/{self.broker_id}"
        data = to_json({"version": 1, "config": {k: str(v) for k, v in self.overrides.items()}})
        try:
            self.zk.ensure_path(BROKER_CONFIGS)
            if self.zk.exists(path):
                self.zk.set(path, data)
            else:
                self.zk.create(path, data)
        except Exception as exc:  # noqa: BLE001 - applied anyway; lost on restart
            log.warning("throttle rates not recorded in ZooKeeper (they apply until a restart): %s", exc)
        log.info("replication throttle rates now %s", {n: self.rate(n) for n in RATES})

    def _throttled_here(self, topics: dict, topic: str, partition: int, which: str) -> bool:
        """Is ``topic``'s ``<which>.replication.throttled.replicas`` (in ``topics``, the last
        UPDATE_METADATA's) naming partition ``partition`` on this broker?"""
        configs = (topics.get(topic) or {}).get("configs") or {}
        listed = throttled_replicas(configs.get(f"{which}.replication.throttled.replicas", ""))
        return listed is None or (partition, self.broker_id) in listed

    def tell(self, hosted: dict, topics: dict, force: bool = False, only: str | None = None) -> None:
        """Tell the replica fetcher and the fetch actor what is throttled now, given the
        ``hosted`` partitions' last LEADER_AND_ISR entries and the metadata's ``topics``
        (when it changed, or ``force``: one of them (``only``, if given) restarted)."""
        follower, leader = [], []
        for (topic, partition), e in hosted.items():
            isr = e.get("isr") or []
            if e.get("leader") == self.broker_id:
                if self._throttled_here(topics, topic, partition, "leader"):
                    leader += [ThrottledReplica(topic, partition, r) for r in e.get("replicas") or [] if r not in isr]
            elif self.broker_id not in isr and self._throttled_here(topics, topic, partition, "follower"):
                follower.append([topic, partition])
        now = (self.rate(RATES[0]), self.rate(RATES[1]), sorted(leader), sorted(follower))
        if now == self._told and not force:
            return
        self._told = now
        if only in (None, REPLICA_FETCHER):
            self.request(REPLICA_FETCHER, Throttle(self.rate(RATES[1]), follower), timeout=30.0)
        if only in (None, FETCH_ACTOR):
            self.request(FETCH_ACTOR, Throttle(self.rate(RATES[0]), leader), timeout=30.0)


def throttled_replicas(text: str) -> set[tuple[int, int]] | None:
    """A ``*.replication.throttled.replicas`` value (already checked by ``LogConfig``) as
    ``{(partition, broker)}``; None for ``*`` (every replica)."""
    text = str(text or "").replace(" ", "")
    if text == "*":
        return None
    return {(int(p), int(b)) for p, b in (pair.split(":") for pair in text.split(",") if pair)}
