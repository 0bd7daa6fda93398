"""A replication throttle: a byte rate that a set of replicas' traffic must keep to on average.

Pure and clock-driven (the caller passes ``now``, in seconds); ``Quota`` is used by the
follower side (``log.replica_fetcher``, ``follower.replication.throttled.rate``) and the leader
side (``log.fetch_actor``, ``leader.replication.throttled.rate``). Traffic is measured after the
fact, as Kafka's replication quota does: a fetch may take the budget below zero, and throttled
replicas then wait until the rate has paid it back.
Invariant: over any few seconds the bytes moved stay within about one fetch of rate x time,
plus at most ``BURST_SECONDS`` of the rate saved up while idle.
"""
from __future__ import annotations

UNLIMITED = 2 ** 63 - 1  # Kafka's default for the throttled rates (Long.MAX_VALUE): no throttle
BURST_SECONDS = 1.0  # at most this many seconds' worth of unused rate is saved up


class Quota:
    __slots__ = ("rate", "budget", "updated")

    def __init__(self, rate: int = UNLIMITED, now: float = 0.0):
        self.rate, self.budget, self.updated = int(rate), 0.0, now

    @property
    def limited(self) -> bool:
        return 0 < self.rate < UNLIMITED

    def set_rate(self, rate: int, now: float) -> None:
        self._refill(now)
        self.rate = int(rate)
        self.budget = min(self.budget, self.rate * BURST_SECONDS)

    def owe(self, seconds: float) -> None:
        """Start in debt, as if the last ``seconds`` had been spent at the rate: a restarted
        actor lost its predecessor's debt (a fetch may take the budget below zero), and
        starting from nothing served that fetch's bytes again for free."""
        if self.limited:
            self.budget = min(self.budget, -self.rate * seconds)

    def _refill(self, now: float) -> None:
        if self.limited:
            self.budget = min(self.budget + (now - self.updated) * self.rate, self.rate * BURST_SECONDS)
        self.updated = now

    def allows(self, now: float) -> bool:
        """May throttled traffic go now?"""
        self._refill(now)
        return not self.limited or self.budget > 0

    def record(self, size: int, now: float) -> None:
        self._refill(now)
        if self.limited:
            self.budget -= size

    def wait(self, now: float) -> float:
        """Seconds until throttled traffic may go again (0: now)."""
        self._refill(now)
        return 0.0 if not self.limited or self.budget > 0 else (-self.budget + 1) / self.rate
