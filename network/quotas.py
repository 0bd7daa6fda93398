"""Client quotas, as Kafka's: per user and client id, produce and fetch byte rates
(``producer_byte_rate``, ``consumer_byte_rate``; set with ``odradek configs --entity-type
users|clients``). Runs in each processor (network/processor.py), which owns the connections:
nothing is dropped; an answer that takes a principal over its rate carries
``throttle_time_ms``, the time it takes to bring the rate back to the quota, and the
connection is muted (not read) that long; the answer goes at once to clients that wait the
time out themselves (KIP-219), else it is held back that long (Kafka's throttling).

A token bucket per (user, client id, kind) in this processor: it fills at the quota's rate
up to BURST_SECONDS' worth (a short burst, so a measured rate stays close to the quota);
each produce request (its size) or fetch answer (its size) takes from it; a negative
balance is the delay. Produce with acks=0 (no answer to hold) is not throttled. A client's connections on several processors are
each held to the quota (as with Kafka's per-broker quotas). The quotas come from
network/secstore.py, re-read when changed.
"""
from __future__ import annotations

from odradek.network import secstore

KINDS = {"produce": "producer_byte_rate", "fetch": "consumer_byte_rate"}
DEFAULT = "<default>"
MAX_BUCKETS = 100000
BURST_SECONDS = 0.2  # the bucket holds this many seconds of the quota


class Quotas:
    def __init__(self, config: dict, data_dir: str):
        self.store = secstore.Quotas(data_dir, config)
        self._buckets: dict[tuple, list] = {}

    def rate(self, principal: str | None, client: str, kind: str) -> int:
        """The quota in bytes/s, 0 for none: user's, else client id's, else the defaults."""
        data = self.store.data()
        if not data:
            return 0
        key = KINDS[kind]
        user = (principal or "User:ANONYMOUS").partition(":")[2]
        users, clients = data.get("users") or {}, data.get("clients") or {}
        for entry in (users.get(user), clients.get(client), users.get(DEFAULT), clients.get(DEFAULT)):
            if entry and entry.get(key):
                return int(entry[key])
        return 0

    def delay(self, principal: str | None, client: str, kind: str, nbytes: int, now: float) -> float:
        """Seconds to hold this answer (and the connection) back; 0 within the quota."""
        rate = self.rate(principal, client, kind)
        if rate <= 0:
            return 0.0
        key = (principal, client, kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= MAX_BUCKETS:
                self._buckets.clear()
            bucket = self._buckets[key] = [rate * BURST_SECONDS, now]
        bucket[0] = min(rate * BURST_SECONDS, bucket[0] + (now - bucket[1]) * rate) - nbytes
        bucket[1] = now
        return -bucket[0] / rate if bucket[0] < 0 else 0.0
