"""Turns one gathered snapshot of the broker into Prometheus metric families and text.

Pure: no I/O, no sockets. Runs in the metrics actor's process, on the HTTP server's thread
of a scrape, with the snapshot the actor's loop gathered by message
(``MetricsActor.gather``). Names, types and help come from ``observe.catalogue``.

``BrokerCollector`` is a ``prometheus_client`` custom collector (``collect()`` yields
families, so ``generate_latest`` and any registry can use it); ``/metrics`` is written by
``BrokerCollector.exposition()``, the same text byte for byte (a test compares them) made
cheaper where a broker with many partitions makes it big:

* by default (``metrics.partition.level=false``) per-partition numbers are summed per
  topic (and a group's lag per group and topic), as kafka-exporter's ``_sum`` series: a
  10,000-partition broker answers with a few hundred samples;
* the big families are pre-rendered (``Prerendered``): the per-partition series (when on),
  the counters and the latency histograms (22 lines per API: most of a small broker's
  scrape). One formatted line per sample from a label string cached between scrapes (a
  partition's ``partition="3",topic="t"`` does not change), instead of
  ``prometheus_client``'s per-sample label validation and escaping (docs/BENCHMARKS.md,
  "Metrics and console"). The other families (gauges, the actor table) go through
  ``generate_latest``.
"""
from __future__ import annotations

import dataclasses
import functools
import platform
from importlib.metadata import PackageNotFoundError, version
from typing import Callable, Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from odradek.actors.metrics import BUCKETS_MS
from odradek.core.protocol import ApiKey, ErrorCode
from odradek.observe.catalogue import COUNTED, DERIVED, GAUGES, GROUP_PARTITION, PARTITION_COLUMNS, Spec

_COLUMNS = list(PARTITION_COLUMNS)  # the log actor's row order
_HW = _COLUMNS.index("high_watermark")


@dataclasses.dataclass
class Snapshot:
    """What one scrape gathered: the supervisor's ``status``, each actor's ``_metrics``
    answer (by actor name; None if it did not answer in time) and how long it took."""
    status: dict
    answers: dict[str, dict | None]
    seconds: float = 0.0
    processes: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    """actor name -> (CPU seconds, start time) of its process, read where /proc can be read
    (``MetricsActor.gather``)."""


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


def _number(v) -> str:
    """``floatToGoString`` (what ``generate_latest`` writes), with a fast path for the
    small integers nearly every gauge is."""
    if type(v) is int and -1_000_000_000_000_000 < v < 1_000_000:
        return f"{v}.0"
    return floatToGoString(v)


def _escape(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Prerendered(Metric):
    """A family whose lines are formatted directly: ``rows`` are ``(suffix, label names,
    label values, rendered label string, value)``, the label string in
    ``generate_latest``'s form (names sorted, values escaped, no braces; from a
    ``LabelCache``). Or, for the per-partition families, ``lines`` (the sample lines
    already rendered, from a ``PartitionLines``) and ``make_rows`` (a function giving the
    rows). ``samples`` is built only when something asks for it (a ``prometheus_client``
    registry)."""

    def __init__(self, name: str, documentation: str, typ: str, rows: list | None = None,
                 lines: list[str] | None = None, make_rows: Callable[[], list] | None = None):
        super().__init__(name, documentation, typ)
        self.rows = rows
        self.lines = lines
        self.make_rows = make_rows

    @property
    def samples(self) -> list:
        rows = self.rows if self.rows is not None else self.make_rows()
        return [Sample(self.name + suffix, dict(zip(names, map(str, values))), value)
                for suffix, names, values, _, value in rows]

    @samples.setter
    def samples(self, _value) -> None:  # Metric.__init__ sets an empty list: the rows are the samples
        pass

    def text(self) -> str:
        doc = self.documentation.replace("\\", r"\\").replace("\n", r"\n")
        name = self.name
        head = name + "_total" if self.type == "counter" else name
        if self.lines is not None:
            return f"# HELP {head} {doc}\n# TYPE {head} {self.type}\n" + "".join(self.lines)
        lines = [f"# HELP {head} {doc}\n# TYPE {head} {self.type}\n"]
        lines += [f"{name}{suffix}{{{labels}}} {_number(value)}\n" if labels else f"{name}{suffix} {_number(value)}\n"
                  for suffix, _, _, labels, value in self.rows]
        return "".join(lines)


class PartitionLines:
    """The per-partition series' sample lines, one per column of a log actor's partition
    row (``odradek_log_size_bytes{partition="3",topic="t"} 1024.0``, ...), kept from one
    scrape to the next with the values they show: a partition whose row did not change (most,
    on a broker with many partitions) costs a comparison instead of eight formatted lines.
    Bounded: a scrape keeps only the partitions it saw."""

    NAMES = tuple(spec.name for spec in PARTITION_COLUMNS.values())

    def __init__(self) -> None:
        self.old: dict[tuple, tuple] = {}
        self.new: dict[tuple, tuple] = {}

    def lines(self, labels, values) -> list[str]:
        key = (labels[0], labels[1])
        values = tuple(values)
        hit = self.old.get(key)
        if hit is None or hit[0] != values or len(values) != len(self.NAMES):
            labelstr = f'partition="{_escape(str(labels[1]))}",topic="{_escape(str(labels[0]))}"'
            hit = (values, [f"{name}{{{labelstr}}} {_number(v)}\n" for name, v in zip(self.NAMES, values)])
        self.new[key] = hit
        return hit[1]

    def rotate(self) -> None:
        self.old, self.new = self.new, {}


class LabelCache:
    """Rendered label strings of per-partition series, kept from one scrape to the next
    (bounded: a scrape keeps only the keys it used)."""

    def __init__(self) -> None:
        self.old: dict[tuple, str] = {}
        self.new: dict[tuple, str] = {}

    def get(self, names: tuple[str, ...], values: tuple) -> str:
        key = (names, values)
        s = self.new.get(key)
        if s is None:
            s = self.old.get(key)
            if s is None:
                s = ",".join(f'{n}="{_escape(str(v))}"' for n, v in sorted(zip(names, values)))
            self.new[key] = s
        return s

    def rotate(self) -> None:
        self.old, self.new = self.new, {}


class _Sums:
    """Values of the same metric and labels from several actors, added up; the log
    actors' partition rows kept as they came."""

    def __init__(self) -> None:
        self.counters: dict[str, dict[tuple, float]] = {}
        self.histograms: dict[str, dict[tuple, list]] = {}
        self.gauges: dict[str, dict[tuple, float]] = {}
        self.partitions: list = []  # [[topic, partition], [column values...]]

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
        partitions = self.partitions
        for name, labels, value in answer.get("gauges") or ():
            if name == "partition":
                partitions.append((labels, value))
                continue
            d = self.gauges.setdefault(name, {})
            d[tuple(labels)] = d.get(tuple(labels), 0) + value


def families(snap: Snapshot, partition_level: bool = False, cache: LabelCache | None = None,
             text: PartitionLines | None = None) -> Iterator:
    sums = _Sums()
    for answer in snap.answers.values():
        if answer:
            sums.add(answer)
    cache = cache if cache is not None else LabelCache()
    text = text if text is not None else PartitionLines()
    yield from _counted(sums, cache, _zeros(snap, sums))
    yield from _gauges(sums)
    yield from _partitions(sums, partition_level, cache, text)
    yield from _groups(sums, partition_level, cache)
    yield from _actors(snap)
    answered = GaugeMetricFamily(DERIVED["scrape_answered"].name, DERIVED["scrape_answered"].help,
                                 labels=["actor"])
    for name, answer in sorted(snap.answers.items()):
        answered.add_metric([name], 1 if answer is not None else 0)
    yield answered
    yield GaugeMetricFamily(DERIVED["scrape_duration"].name, DERIVED["scrape_duration"].help, value=snap.seconds)
    info = DERIVED["build_info"]
    yield _one(info, BUILD)
    cache.rotate()


def _build() -> list[str]:
    """``odradek_build_info``'s labels: this package's version and Python's."""
    try:
        mine = version("odradek")
    except PackageNotFoundError:  # run from a checkout that was never installed
        mine = "unknown"
    return [mine, platform.python_version()]


BUILD = _build()


def _one(spec: Spec, labels: list[str]) -> GaugeMetricFamily:
    fam = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
    fam.add_metric(labels, 1)
    return fam


def _zeros(snap: Snapshot, sums: _Sums) -> dict[tuple, list]:
    """Label values whose counters are exported at 0 before they first move (so a dashboard
    shows 0, not "No data"), by the counter's label names: the counters without labels (ISR
    shrinks and expands), every topic hosted here, every listener of the broker."""
    listeners = (snap.status.get("supervisor") or {}).get("listeners") or {}
    return {(): [()], ("topic",): sorted({(labels[0],) for labels, _ in sums.partitions}),
            ("listener",): [(name,) for name in sorted(listeners)]}


_LE = [floatToGoString(b / 1000) for b in BUCKETS_MS] + ["+Inf"]


def _counted(sums: _Sums, cache: "LabelCache", zeros: dict[tuple, list]) -> Iterator:
    """Counters and histograms, pre-rendered (a histogram is 22 lines per API and label
    set: most of a small broker's scrape); a counter at 0 for each of ``zeros``' label
    values it has not counted yet."""
    for key, spec in COUNTED.items():
        names = tuple(spec.labels)
        rows = []
        if spec.type == "histogram":
            with_le = names + ("le",)
            for labels, (buckets, total_ms) in sorted(sums.histograms.get(key, {}).items(), key=str):
                values = tuple(_labels(spec, labels))
                running = 0
                for le, n in zip(_LE, buckets):
                    running += n
                    bucket = values + (le,)
                    rows.append(("_bucket", with_le, bucket, cache.get(with_le, bucket), running))
                labelstr = cache.get(names, values)
                rows.append(("_count", names, values, labelstr, running))
                rows.append(("_sum", names, values, labelstr, total_ms / 1000))
        else:
            counted = sums.counters.get(key, {})
            if names in zeros:
                counted = {**dict.fromkeys(zeros[names], 0), **counted}
            for labels, value in sorted(counted.items(), key=str):
                values = tuple(_labels(spec, labels))
                rows.append(("_total", names, values, cache.get(names, values), value))
        yield Prerendered(spec.name, spec.help, spec.type, rows)


def _gauges(sums: _Sums) -> Iterator:
    for key, spec in GAUGES.items():
        fam = GaugeMetricFamily(spec.name, spec.help, labels=list(spec.labels))
        values = sums.gauges.get(key, {})
        for labels, value in sorted(values.items(), key=str):
            fam.add_metric(_labels(spec, labels), value)
        yield fam
        if spec.total:
            yield GaugeMetricFamily(spec.total, f"Sum of {spec.name}.", value=sum(values.values()))


def _partitions(sums: _Sums, partition_level: bool, cache: LabelCache, text: PartitionLines) -> Iterator:
    """The log actors' rows: per topic sums and broker totals always; the per-partition
    series when asked for."""
    rows = sums.partitions
    width = len(_COLUMNS)
    by_topic: dict[str, list] = {}
    for labels, values in rows:
        by_topic.setdefault(labels[0], []).append(values)
    # per topic: each column's sum (in the rows' order, as a running sum), then the count; a
    # log actor's rows have every column of PARTITION_COLUMNS
    per_topic = {topic: [sum(column) for column in zip(*values)] + [len(values)] for topic, values in by_topic.items()}
    count = DERIVED["partitions"]
    yield GaugeMetricFamily(count.name, count.help, value=len(rows))
    spec = DERIVED["topic_partitions"]
    fam = GaugeMetricFamily(spec.name, spec.help, labels=["topic"])
    for topic in sorted(per_topic):
        fam.add_metric([topic], per_topic[topic][width])
    yield fam
    for i, (key, spec) in enumerate(PARTITION_COLUMNS.items()):
        if spec.per_topic:
            fam = GaugeMetricFamily(spec.per_topic, spec.per_topic_help, labels=["topic"])
            for topic in sorted(per_topic):
                fam.add_metric([topic], per_topic[topic][i])
            yield fam
        if spec.total:
            yield GaugeMetricFamily(spec.total, f"Sum of {spec.name}.", value=sum(a[i] for a in per_topic.values()))
    if partition_level:
        names = ("topic", "partition")
        rendered = [text.lines(labels, values) for labels, values in rows]

        def make_rows(i: int) -> list:
            return [("", names, tuple(labels), cache.get(names, tuple(labels)), values[i]) for labels, values in rows]
        for i, spec in enumerate(PARTITION_COLUMNS.values()):
            yield Prerendered(spec.name, spec.help, "gauge", lines=[r[i] for r in rendered],
                              make_rows=functools.partial(make_rows, i))
        text.rotate()


def _lag(sums: _Sums) -> tuple[list, dict]:
    """Lag where the high watermark is known here: ``[((group, topic, partition), lag)]``
    and ``{(group, topic): lag summed}``."""
    committed = sums.gauges.get("committed_offset", {})
    hw = {(labels[0], labels[1]): values[_HW] for labels, values in sums.partitions} if committed else {}
    lag_rows, per_topic = [], {}
    for (group, topic, partition), offset in committed.items():
        end = hw.get((topic, partition))
        if end is not None:
            lag = max(end - offset, 0)
            lag_rows.append(((group, topic, partition), lag))
            per_topic[(group, topic)] = per_topic.get((group, topic), 0) + lag
    return lag_rows, per_topic


def group_numbers(snap: Snapshot) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
    """The groups' numbers alone, without building every family (the console's group list):
    ``{group: members}`` of the groups this broker coordinates, ``{(group, topic): lag}``
    where the high watermark is known here."""
    sums = _Sums()
    for answer in snap.answers.values():
        if answer:
            sums.add(answer)
    members: dict[str, int] = {}
    for (group, _state), n in sums.gauges.get("group_members", {}).items():
        members[group] = members.get(group, 0) + int(n)
    return members, _lag(sums)[1]


def _groups(sums: _Sums, partition_level: bool, cache: LabelCache) -> Iterator:
    """Committed offsets (per partition: opt-in) and lag, where the high watermark is
    known here: per partition (opt-in) and summed per group and topic (always)."""
    committed = sums.gauges.get("committed_offset", {})
    lag_rows, per_topic = _lag(sums)
    spec = GROUP_PARTITION["lag"]
    fam = GaugeMetricFamily(spec.per_topic, spec.per_topic_help, labels=["group", "topic"])
    for (group, topic), lag in sorted(per_topic.items()):
        fam.add_metric([group, topic], lag)
    yield fam
    if partition_level:
        names = spec.labels
        for spec, rows in ((GROUP_PARTITION["committed_offset"], committed.items()), (spec, lag_rows)):
            yield Prerendered(spec.name, spec.help, "gauge",
                              [("", names, k, cache.get(names, k), v) for k, v in sorted(rows, key=str)])


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
    processes = snap.processes
    yield family("actor_cpu_seconds", lambda r: processes[r["name"]][0] if r["name"] in processes else None)
    yield family("actor_start_time", lambda r: processes[r["name"]][1] if r["name"] in processes else None)
    yield family("actor_open_fds", lambda r: r.get("fds"))


class _Fixed:
    """A 'registry' of given families, for ``generate_latest``."""

    def __init__(self, fams: list):
        self.fams = fams

    def collect(self) -> list:
        return self.fams


def exposition(fams: Iterable) -> bytes:
    """Prometheus text of ``fams``: ``generate_latest``'s output, with ``Prerendered``
    families written by their own ``text()``."""
    out: list[bytes] = []
    plain: list = []
    for fam in fams:
        if isinstance(fam, Prerendered):
            if plain:
                out.append(generate_latest(_Fixed(plain)))
                plain = []
            out.append(fam.text().encode())
        else:
            plain.append(fam)
    if plain:
        out.append(generate_latest(_Fixed(plain)))
    return b"".join(out)


class BrokerCollector:
    """prometheus_client custom collector: asks the broker at every scrape (``gather``)."""

    def __init__(self, gather: Callable[[], Snapshot], partition_level: bool = False):
        self.gather = gather
        self.partition_level = partition_level
        self.cache = LabelCache()
        self.text = PartitionLines()

    def collect(self) -> Iterator:
        yield from families(self.gather(), self.partition_level, self.cache, self.text)

    def exposition(self) -> bytes:
        """One scrape's text (what ``generate_latest`` of a registry holding this collector
        gives, faster)."""
        return exposition(self.collect())

    def describe(self) -> list:
        return []  # registering must not trigger a scrape
