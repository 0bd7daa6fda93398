"""Counters and histograms an actor keeps for the metrics actor: plain dicts, no locks.

Owned by one actor and touched only by its loop. ``inc`` is one dict update, ``observe`` a
bisect and two; nothing is formatted or named here. Keys are ``(name, labels)``, ``labels`` a
tuple of label values; label names, Prometheus names and help live in one table at the top
layer (``odradek.observe.catalogue``). ``snapshot()`` is the plain-data answer to a
``_metrics`` request. ``BoundedLabels`` keeps a label whose values clients choose (a client id)
to a fixed number of series.
"""
from __future__ import annotations

import bisect
import collections

# Upper bounds (milliseconds) of latency histogram buckets; +Inf is implicit. Kafka's
# request times span tens of microseconds (a PING) to the 60 s cap of a long poll.
BUCKETS_MS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0,
              1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0)


class Metrics:
    """``inc(name, labels, n)`` for counters, ``observe(name, labels, ms)`` for histograms."""

    __slots__ = ("counters", "histograms")

    def __init__(self) -> None:
        self.counters: dict[tuple[str, tuple], float] = {}
        self.histograms: dict[tuple[str, tuple], list] = {}  # [count per bucket..., +Inf, sum]

    def inc(self, name: str, labels: tuple = (), n: float = 1) -> None:
        key = (name, labels)
        counters = self.counters
        counters[key] = counters.get(key, 0) + n

    def observe(self, name: str, labels: tuple, ms: float) -> None:
        key = (name, labels)
        h = self.histograms.get(key)
        if h is None:
            h = self.histograms[key] = [0] * (len(BUCKETS_MS) + 1) + [0.0]
        h[bisect.bisect_left(BUCKETS_MS, ms)] += 1
        h[-1] += ms

    def snapshot(self) -> dict:
        """``{"counters": [[name, labels, value]], "histograms": [[name, labels, buckets, sum]]}``
        with ``buckets`` the per-bucket (not cumulative) counts, +Inf last."""
        return {"counters": [[n, list(labels), v] for (n, labels), v in self.counters.items()],
                "histograms": [[n, list(labels), h[:-1], h[-1]] for (n, labels), h in self.histograms.items()]}


class BoundedLabels:
    """Which values of one counter's label are kept by name: at most ``cap`` at a time,
    whatever clients send (a client id, say). A value is *held* while something that
    carries it is open (``acquire`` / ``release``: a connection); when the names are all
    taken, a new value takes the place of the one left idle longest, whose count moves
    into ``other`` (the series disappears, the sum over the label stays the count). A new
    value finds no place only while ``cap`` values are all held: it counts as ``other``.
    Without an idle release a first-come set would be closed for good after ``cap`` short
    clients, and a long-lived broker would count every later client as ``other``."""

    __slots__ = ("metrics", "name", "cap", "longest", "other", "none", "held", "idle")

    def __init__(self, metrics: Metrics, name: str, cap: int, longest: int,
                 other: str = "(other)", none: str = "(none)") -> None:
        self.metrics, self.name, self.cap, self.longest = metrics, name, cap, longest
        self.other, self.none = other, none
        self.held: dict[str, int] = {}  # value -> holders
        self.idle: collections.OrderedDict[str, None] = collections.OrderedDict()  # no holder, oldest first

    def acquire(self, value: str) -> str:
        """The label a new holder of ``value`` counts under; ``release`` it when done."""
        if not value:
            return self.none
        held = self.held
        if value in held:
            held[value] += 1
            return value
        if value in self.idle:
            del self.idle[value]
        elif len(value) > self.longest:
            return self.other
        elif len(held) + len(self.idle) >= self.cap:
            if not self.idle:
                return self.other
            self._fold(self.idle.popitem(last=False)[0])
        held[value] = 1
        return value

    def release(self, label: str | None) -> None:
        n = self.held.get(label)  # None, ``other`` and ``none`` hold nothing
        if n is None:
            return
        if n > 1:
            self.held[label] = n - 1
        else:
            del self.held[label]
            self.idle[label] = None

    def _fold(self, label: str) -> None:
        n = self.metrics.counters.pop((self.name, (label,)), 0)
        if n:
            self.metrics.inc(self.name, (self.other,), n)
