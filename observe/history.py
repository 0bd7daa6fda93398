"""The charts' history: what the console's charts plot, sampled by the metrics actor so that
a page opened now shows the last hour.

Runs in the metrics actor's process: ``Sampler`` is a thread of its own that gathers the
broker's metrics (``MetricsActor.gather``, as a scrape does, by message through the actor's
loop) every ``INTERVAL`` seconds and keeps ``KEEP`` samples (an hour) in memory; the HTTP
threads read them (``History.samples``). Nothing is written to disk: a restarted broker
starts a new history. Bounded: at most ``KEEP`` samples of four numbers and the lag of at
most ``MAX_GROUPS`` groups (the largest lags).

A sample is ``totals(...)`` of one gathered snapshot: the cumulative bytes and records in
and out summed over the topics (the page takes rates between samples) and the lag per
group, the same numbers ``/api/totals`` gives a live page.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable

from odradek.observe.collector import families

log = logging.getLogger("odradek.metrics")

INTERVAL = 10.0  # seconds between samples
KEEP = 360  # samples kept: one hour
MAX_GROUPS = 50  # groups whose lag a history sample keeps (the largest)

_COUNTERS = {"odradek_topic_bytes_in_total": "bytes_in", "odradek_topic_records_in_total": "records_in",
             "odradek_topic_bytes_out_total": "bytes_out", "odradek_topic_records_out_total": "records_out"}


def totals(snap, shown_topic: Callable[[str], bool] = lambda _: True,
           shown_group: Callable[[str], bool] = lambda _: True) -> dict:
    """Cumulative bytes and records in and out over the topics ``shown_topic`` allows, and the
    lag of each group ``shown_group`` allows, at the snapshot's time."""
    out = {"time": time.time(), "bytes_in": 0, "records_in": 0, "bytes_out": 0, "records_out": 0, "lag": {}}
    for fam in families(snap):
        for s in fam.samples:
            key = _COUNTERS.get(s.name)
            if key is not None and shown_topic(s.labels["topic"]):
                out[key] += s.value
            elif s.name == "odradek_consumer_group_topic_lag" and shown_topic(s.labels["topic"]) \
                    and shown_group(s.labels["group"]):
                g = s.labels["group"]
                out["lag"][g] = out["lag"].get(g, 0) + s.value
    return out


class History:
    """The last ``KEEP`` samples, oldest first; thread-safe (one writer, HTTP readers)."""

    def __init__(self, keep: int = KEEP):
        self._samples: collections.deque = collections.deque(maxlen=keep)
        self._lock = threading.Lock()

    def add(self, sample: dict) -> None:
        lag = sample["lag"]
        if len(lag) > MAX_GROUPS:
            sample = {**sample, "lag": dict(sorted(lag.items(), key=lambda kv: -kv[1])[:MAX_GROUPS])}
        with self._lock:
            self._samples.append(sample)

    def samples(self) -> list[dict]:
        with self._lock:
            return list(self._samples)


class Sampler(threading.Thread):
    """Adds ``totals(gather())`` to ``history`` every ``interval`` seconds until stopped; a
    gather that fails (the broker busy) is skipped, never retried early."""

    def __init__(self, gather: Callable, history: History, interval: float = INTERVAL):
        super().__init__(name="metrics-history", daemon=True)
        self.gather, self.history, self.interval = gather, history, interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.history.add(totals(self.gather()))
            except Exception as exc:  # a slow or restarting broker: this sample is missing, not the charts
                log.debug("history sample skipped: %s", exc)

    def stop(self) -> None:
        self.stopped.set()
