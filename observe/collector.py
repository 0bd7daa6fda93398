"""Turns one gathered snapshot of the broker into Prometheus metric families.

Pure: no I/O, no sockets. ``families(snapshot)`` is called at scrape time by
``BrokerCollector.collect`` (prometheus_client's custom-collector protocol), in the HTTP
server's thread, with the snapshot the metrics actor's loop gathered by message
(``MetricsActor.gather``). Names, types and help come from ``observe.catalogue``.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from odradek.actors.metrics import BUCKETS_MS
from odradek.network.protocol import ApiKey, ErrorCode
from odradek.observe.catalogue import COUNTED, DERIVED, GAUGES, Spec


@dataclasses.dataclass
class Snapshot:
    """What one scrape gathered: the supervisor's ``status``, each actor's ``_metrics``
    answer (by actor name; None if it did not answer in time) and how long it took."""
    status: dict
    answers: dict[str, dict | None]
    seconds: float = 0.0


def _label(name: str, value) -> str:
    if name == "api":
        try:
            return ApiKey(value).name.lower()
        except ValueError:
            return str(value)
    if name == "error":
        try:
            return ErrorCode(value).name
        except ValueError:
            return str(value)
    return str(value)


def _labels(spec: Spec, values) -> list[str]:
    return [_label(n, v) for n, v in zip(spec.labels, values)]


class _Sums:
    """Values of the same metric and labels from several actors, added up."""

    def __init__(self) -> None:
        self.counters: dict[str, dict[tuple, float]] = {}
        self.histograms: dict[str, dict[tuple, list]] = {}
        self.gauges: dict[str, dict[tuple, float]] = {}

    def add(self, answer: dict) -> None:
        for name, labels, value in answer.get("counters") or ():
            d = self.counters.setdefault(name, {})
            d[tuple(labels)] = d.get(tuple(labels), 0) + value
        for name, labels, buckets, total in answer.get("histograms") or ():
            d = self.histograms.setdefault(name, {})
            have = d.get(tuple(labels))
            if have is None:
                d[tuple(labels)] = [list(buckets), total]
            else:
                have[0] = [a + b for a, b in zip(have[0], buckets)]
                have[1] += total
        for name, labels, value in answer.get("gauges") or ():
            d = self.gauges.setdefault(name, {})
            d[tuple(labels)] = d.get(tuple(labels), 0) + value


def families(snap: Snapshot) -> Iterator:
    sums = _Sums()
    for answer in snap.answers.values():
        if answer:
            sums.add(answer)
    yield from _counted(sums)
    yield from _gauges(sums)
    yield _lag(sums)
    yield from _actors(snap)
    answered = GaugeMetricFamily(DERIVED["scrape_answered"].name, DERIVED["scrape_answered"].help,
                                 labels=["actor"])
    for name, answer in sorted(snap.answers.items()):
        answered.add_metric([name], 1 if answer is not None else 0)
    yield answered
    yield GaugeMetricFamily(DERIVED["scrape_duration"].name, DERIVED["scrape_duration"].help, value=snap.seconds)


_LE = [floatToGoString(b / 1000) for b in BUCKETS_MS] + ["+Inf"]


def _counted(sums: _Sums) -> Iterator:
    for key, spec in COUNTED.items():
        if spec.type == "histogram":
            fam = HistogramMetricFamily(spec.name, spec.help, labels=list(spec.labels))
            for labels, (buckets, total_ms) in sorted(sums.histograms.get(key, {}).items(), key=str):
                cumulative, running = [], 0
                for le, n in zip(_LE, buckets):
                    running += n
                    cumulative.append((le, running))
                fam.add_metric(_labels(spec, labels), cumulative, total_ms / 1000)
        else:
            fam = CounterMetricFamily(spec.name, spec.help, labels=list(spec.labels))
            for labels, value in sorted(sums.counters.get(key, {}).items(), key=str):
                fam.add_metric(_labels(spec, labels), value)
        yield fam


def _gauges(sums: _Sums) -> Iterator:
    for key, spec in GAUGES.items():
        fam = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        values = sums.gauges.get(key, {})
        for labels, value in sorted(values.items(), key=str):
            fam.add_metric(_labels(spec, labels), value)
        yield fam
        if spec.total:
            yield GaugeMetricFamily(spec.total, f"Sum of {spec.name}.", value=sum(values.values()))


def _lag(sums: _Sums) -> GaugeMetricFamily:
    spec = DERIVED["lag"]
    fam = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
    hw = sums.gauges.get("high_watermark", {})
    for (group, topic, partition), committed in sorted(sums.gauges.get("committed_offset", {}).items(), key=str):
        end = hw.get((topic, partition))
        if end is not None:
            fam.add_metric([group, topic, str(partition)], max(end - committed, 0))
    return fam


def _actors(snap: Snapshot) -> Iterator:
    rows = snap.status.get("actors") or []

    def family(key: str, value_of: Callable[[dict], float | None]):
        spec = DERIVED[key]
        cls = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
        fam = cls(spec.name, spec.help, labels=list(spec.labels))
        for row in rows:
            value = value_of(row)
            if value is not None:
                fam.add_metric([row["name"], row["role"]], value)
        return fam

    yield family("actor_up", lambda r: 1 if r.get("state") == "running" else 0)
    yield family("actor_restarts", lambda r: r.get("restarts") or 0)
    yield family("actor_messages", lambda r: r.get("processed"))
    yield family("actor_open_requests", lambda r: r.get("open"))
    yield family("actor_backlog", lambda r: r.get("backlog"))
    yield family("actor_rss", lambda r: r.get("rss"))
    yield family("actor_cpu", lambda r: None if r.get("cpu") is None else r["cpu"] / 100)


class BrokerCollector:
    """prometheus_client custom collector: asks the broker at every scrape (``gather``)."""

    def __init__(self, gather: Callable[[], Snapshot]):
        self.gather = gather

    def collect(self) -> Iterator:
        yield from families(self.gather())

    def describe(self) -> list:
        return []  # registering must not trigger a scrape
