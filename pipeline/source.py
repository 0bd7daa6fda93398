"""The ``odradek`` Spark data source: batch and streaming reads, batch and streaming writes.

Where each piece runs (PySpark 4.x Python data sources):

- ``OdradekDataSource`` and the readers' planning methods (``partitions``; for streams
  ``initialOffset``, ``latestOffset``, ``commit``) run in a Python worker on the **driver**.
  A stream reader lives as long as its query (Spark never calls its ``stop()``), so it holds
  no connection between calls; ``initialOffset`` is called more than once, so its answer is
  computed once and cached.
- ``read(partition)`` runs in an **executor** task, on a pickled copy of the reader: one
  ``RangeFetcher`` per task, whose connection to the partition's leader opens on first use.
- Writers: see ``pipeline.sink``.

Offsets (the checkpoint's JSON) are Spark's Kafka shape, ``{"topic": {"0": 42}}`` with
string partition ids and sorted keys at both levels, because Spark compares offsets as JSON
strings: the same position must always serialize the same way.

Isolation: with ``kafka.isolation.level=read_committed`` every "latest" the planner asks for
is the last stable offset, so a batch read ends before the first open transaction and a
stream never advances past one (its rows come in a later micro-batch, once committed);
executors drop aborted transactions' records and control batches (``pipeline.broker``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow

from odradek.pipeline import options as opt
from odradek.pipeline.broker import DataLoss, Planner, RangeFetcher
from odradek.pipeline.columns import ddl, to_arrow

log = logging.getLogger("odradek.pipeline")

TP = tuple  # (topic, partition)


@dataclass
class OffsetRange(InputPartition):
    """One task's work: offsets ``[start, end)`` of one partition, and where its leader is."""

    topic: str
    partition: int
    start: int
    end: int
    leader: tuple | None = None  # (host, port), or None: ask the bootstrap servers

    @property
    def size(self) -> int:
        return self.end - self.start


class OdradekDataSource(DataSource):
    """``spark.read.format("odradek")``: Spark's Kafka source contract on Odradek topics."""

    @classmethod
    def name(cls) -> str:
        return "odradek"

    def schema(self) -> str:
        return ddl(str(self.options.get("includeHeaders", "false")).strip().lower() == "true")

    def reader(self, schema) -> "BatchReader":
        return BatchReader(opt.batch_read_options(self.options))

    def streamReader(self, schema) -> "StreamReader":
        return StreamReader(opt.stream_read_options(self.options))

    def writer(self, schema, overwrite: bool):
        from odradek.pipeline.sink import BatchWriter
        return BatchWriter(opt.write_options(self.options, schema.fieldNames()), schema)

    def streamWriter(self, schema, overwrite: bool):
        from odradek.pipeline.sink import StreamWriter
        return StreamWriter(opt.write_options(self.options, schema.fieldNames()), schema)


# ---- planning (driver) ------------------------------------------------------------------------
def _planner(o: opt.ReadOptions) -> Planner:
    return Planner(o.bootstrap, o.offset_retries, o.offset_retry_interval_ms, o.read_committed)


def _topic_partitions(o: opt.ReadOptions, meta: dict, strict: bool) -> list[TP]:
    """The partitions the subscription names that exist now. ``strict``: an unknown topic or
    partition is an error naming the option (per failOnDataLoss for subscribe)."""
    sub = o.subscription
    topics = meta["topics"]
    if sub.kind == "subscribePattern":
        return sorted((t, p) for t, ps in topics.items() if sub.matches(t) for p in ps)
    if sub.kind == "assign":
        missing = [f"{t}-{p}" for t, p in sub.partitions if p not in topics.get(t, ())]
        if missing and strict:
            raise opt.OptionError(f"option assign names partitions that do not exist: {', '.join(missing)}")
        return [tp for tp in sub.partitions if tp[1] in topics.get(tp[0], ())]
    missing = [t for t in sub.topics if t not in topics]
    if missing and strict and o.fail_on_data_loss:
        raise opt.OptionError(f"option subscribe names unknown topic(s) {', '.join(missing)} "
                              f"(failOnDataLoss is true; set it to false to read nothing from them)")
    return sorted((t, p) for t in sub.topics for p in topics.get(t, ()))


def _leaders(meta: dict) -> dict:
    brokers = meta["brokers"]
    return {tp: tuple(brokers[node]) for tp, node in meta["leaders"].items() if node in brokers}


def resolve(planner: Planner, spec: opt.OffsetSpec, tps: list[TP], o: opt.ReadOptions, ending: bool,
            latest: dict | None = None) -> dict:
    """``{tp: offset}`` for a starting or ending spec over ``tps`` (-2/-1 and timestamps resolved)."""
    if not tps:
        return {}
    latest = latest if latest is not None else planner.list_offsets(tps, opt.LATEST)
    if spec.kind == "earliest":
        return planner.list_offsets(tps, opt.EARLIEST)
    if spec.kind == "latest":
        return dict(latest)
    if spec.kind == "offsets":
        default = opt.LATEST if ending else opt.EARLIEST
        wanted = {tp: spec.per.get(tp, default) for tp in tps}
        earliest_tps = [tp for tp, v in wanted.items() if v == opt.EARLIEST]
        earliest = planner.list_offsets(earliest_tps, opt.EARLIEST) if earliest_tps else {}
        out = {}
        for tp, v in wanted.items():
            out[tp] = earliest[tp] if v == opt.EARLIEST else latest[tp] if v == opt.LATEST else v
            if out[tp] > latest[tp] and ending:
                what = "last stable offset (read_committed)" if o.read_committed else "latest offset"
                raise opt.OptionError(f"option {spec.option}: {tp[0]}-{tp[1]} offset {v} is beyond the {what} "
                                      f"{latest[tp]}")
        return out
    stamps = {tp: spec.ts for tp in tps} if spec.kind == "timestamp" else \
        {tp: spec.per[tp] for tp in tps if tp in spec.per}
    found = planner.list_offsets(list(stamps), stamps) if stamps else {}
    out = {}
    for tp in tps:
        if tp not in stamps:  # per-partition times that skip a partition: earliest / latest
            out[tp] = latest[tp] if ending else planner.list_offsets([tp], opt.EARLIEST)[tp]
        elif found[tp] >= 0:
            out[tp] = found[tp]
        elif ending or o.by_timestamp_strategy == "latest":
            out[tp] = latest[tp]
        else:
            raise opt.OptionError(f"option {spec.option}: {tp[0]}-{tp[1]} has no record at or after "
                                  f"{stamps[tp]} ms (set startingOffsetsByTimestampStrategy=latest to start at "
                                  f"the end instead)")
    return out


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None) -> list[OffsetRange]:
    """Split ranges so there are at least ``min_partitions`` tasks (large ranges split first, in
    proportion to their size) and none holds more than ``max_records`` offsets. Every offset
    stays in exactly one range."""
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    out = []
    for r in ranges:
        parts = 1
        if min_partitions and len(ranges) < min_partitions and total:
            parts = max(1, round(r.size * min_partitions / total))
        if max_records:
            parts = max(parts, -(-r.size // max_records))
        parts = min(parts, r.size)
        step, extra = divmod(r.size, parts)
        lo = r.start
        for i in range(parts):
            hi = lo + step + (1 if i < extra else 0)
            out.append(OffsetRange(r.topic, r.partition, lo, hi, r.leader))
            lo = hi
    if min_partitions and 0 < len(out) < min_partitions:  # rounding left us short: halve the largest
        while len(out) < min_partitions:
            big = max(out, key=lambda x: x.size)
            if big.size < 2:
                break
            mid = big.start + big.size // 2
            i = out.index(big)
            out[i:i + 1] = [OffsetRange(big.topic, big.partition, big.start, mid, big.leader),
                            OffsetRange(big.topic, big.partition, mid, big.end, big.leader)]
    return out


class _Reader:
    """What batch and stream readers share: reading one ``OffsetRange`` on an executor."""

    def __init__(self, o: opt.ReadOptions):
        self.o = o

    def read(self, part: OffsetRange) -> Iterator:
        o = self.o
        fetcher = RangeFetcher(o.bootstrap, part.leader, part.topic, part.partition, o.fetch_bytes,
                               o.poll_timeout_ms, o.fail_on_data_loss, o.read_committed)
        try:
            for batches, view, pos in fetcher.fetch(part.start, part.end):  # pos: after any skipped gap
                rb = to_arrow(view, batches, part.topic, part.partition, pos, part.end, o.include_headers)
                if rb is not None:
                    yield rb
        except DataLoss as exc:
            raise RuntimeError(f"data loss: {exc}") from None
        finally:
            fetcher.close()


class BatchReader(_Reader, DataSourceReader):
    def partitions(self) -> list[OffsetRange]:
        o = self.o
        planner = _planner(o)
        meta = planner.metadata(None if o.subscription.kind == "subscribePattern" else
                                sorted({t for t, _ in o.subscription.partitions} or set(o.subscription.topics)))
        tps = _topic_partitions(o, meta, strict=True)
        latest = planner.list_offsets(tps, opt.LATEST)
        starts = resolve(planner, o.starting, tps, o, ending=False, latest=latest)
        ends = resolve(planner, o.ending, tps, o, ending=True, latest=latest)
        leaders = _leaders(meta)
        ranges = []
        for tp in tps:
            s, e = starts[tp], ends[tp]
            if s > e:
                raise opt.OptionError(f"options {o.starting.option}/{o.ending.option}: {tp[0]}-{tp[1]} starts at "
                                      f"{s}, after its end {e}")
            ranges.append(OffsetRange(tp[0], tp[1], s, e, leaders.get(tp)))
        out = split_ranges(ranges, o.min_partitions, o.max_records_per_partition)
        return out or [OffsetRange("", 0, 0, 0)]  # Spark wants at least one partition

    def read(self, part: OffsetRange) -> Iterator:
        if part.size <= 0:
            return iter(())
        return super().read(part)


# ---- streaming --------------------------------------------------------------------------------
def to_json_offsets(offsets: dict) -> dict:
    """``{(topic, p): offset}`` -> ``{"topic": {"p": offset}}``, keys sorted at both levels
    (partition ids sorted as numbers), so equal positions always serialize alike."""
    out: dict = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(off)
    return {t: out[t] for t in sorted(out)}


def from_json_offsets(offsets: dict) -> dict:
    return {(t, int(p)): int(off) for t, parts in (offsets or {}).items() for p, off in parts.items()}


class StreamReader(_Reader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reads: each batch is the offsets between two positions of every partition."""

    def __init__(self, o: opt.ReadOptions):
        super().__init__(o)
        self._initial: dict | None = None
        self._target: dict | None = None  # Trigger.AvailableNow: the latest offsets when it started

    def __getstate__(self) -> dict:  # executors need only the options
        return {"o": self.o, "_initial": None, "_target": None}

    def _meta_and_tps(self, planner: Planner, strict: bool):
        sub = self.o.subscription
        topics = None if sub.kind == "subscribePattern" else sorted(
            {t for t, _ in sub.partitions} or set(sub.topics))
        meta = planner.metadata(topics)
        return meta, _topic_partitions(self.o, meta, strict)

    def initialOffset(self) -> dict:
        if self._initial is None:
            planner = _planner(self.o)
            _, tps = self._meta_and_tps(planner, strict=True)
            self._initial = to_json_offsets(resolve(planner, self.o.starting, tps, self.o, ending=False))
        return self._initial

    def prepareForTriggerAvailableNow(self) -> None:
        planner = _planner(self.o)
        _, tps = self._meta_and_tps(planner, strict=False)
        self._target = planner.list_offsets(tps, opt.LATEST)
        log.info("availableNow: reading up to %s", to_json_offsets(self._target))

    def getDefaultReadLimit(self):
        n = self.o.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict, limit) -> dict:
        planner = _planner(self.o)
        begin = from_json_offsets(start)
        _, tps = self._meta_and_tps(planner, strict=False)
        self._check_vanished(begin, tps)
        latest = planner.list_offsets(tps, opt.LATEST)
        if self._target is not None:  # AvailableNow: nothing that arrived after it started
            latest = {tp: min(off, self._target.get(tp, begin.get(tp, 0))) for tp, off in latest.items()
                      if tp in self._target or tp in begin}
        new = [tp for tp in latest if tp not in begin]
        if new:
            begin.update(planner.list_offsets(new, opt.EARLIEST))
        behind = {tp: off for tp, off in latest.items() if off < begin[tp]}
        if behind and self.o.read_committed:  # a position past an open transaction (given in
            # startingOffsets, or checkpointed read_uncommitted) waits there if the log reaches it
            ends = Planner(self.o.bootstrap, self.o.offset_retries,
                           self.o.offset_retry_interval_ms).list_offsets(sorted(behind), opt.LATEST)
            behind = {tp: off for tp, off in behind.items() if ends[tp] < begin[tp]}
        for tp, off in latest.items():
            if off < begin[tp]:
                if tp in behind:
                    self._lost(f"{tp[0]}-{tp[1]}: the latest offset {off} is below the position {begin[tp]} "
                               f"(the partition was truncated or recreated)")
                latest[tp] = begin[tp]
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        end = dict(from_json_offsets(start))  # keep partitions that vanished, as they were
        end.update(latest)
        return to_json_offsets(end)

    def _check_vanished(self, begin: dict, tps: list) -> None:
        gone = sorted(set(begin) - set(tps))
        if gone:
            self._lost("partitions " + ", ".join(f"{t}-{p}" for t, p in gone) + " no longer exist")

    def _lost(self, what: str) -> None:
        if self.o.fail_on_data_loss:
            raise RuntimeError(f"data loss: {what} (failOnDataLoss is true; set it to false to continue)")
        log.warning("possible data loss: %s; continuing (failOnDataLoss=false)", what)

    def reportLatestOffset(self):
        return None

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        begin, stop = from_json_offsets(start), from_json_offsets(end)
        new = [tp for tp in stop if tp not in begin]
        planner = None
        if new:  # partitions that appeared within this batch: from their beginning
            planner = _planner(self.o)
            begin.update(planner.list_offsets(new, opt.EARLIEST))
        ranges = []
        for tp, e in sorted(stop.items()):
            s = begin[tp]
            if e < s:
                self._lost(f"{tp[0]}-{tp[1]}: batch end {e} is below its start {s}")
                continue
            ranges.append(OffsetRange(tp[0], tp[1], s, e, None))
        if any(r.size for r in ranges):
            leaders = _leaders((planner or _planner(self.o)).metadata(sorted({r.topic for r in ranges})))
            for r in ranges:
                r.leader = leaders.get((r.topic, r.partition))
        return split_ranges(ranges, self.o.min_partitions, self.o.max_records_per_partition)

    def commit(self, end: dict) -> None:
        log.debug("committed %s", end)


def rate_limit(begin: dict, latest: dict, max_rows: int) -> dict:
    """Admission control: at most ``max_rows`` offsets in all, shared in proportion to each
    partition's backlog (Spark's Kafka rule), every partition with a backlog advancing at
    least one offset when the budget allows."""
    lag = {tp: max(0, latest[tp] - begin.get(tp, latest[tp])) for tp in latest}
    total = sum(lag.values())
    if total <= max_rows:
        return dict(latest)
    out = {}
    budget = max_rows
    for tp in sorted(lag):
        share = lag[tp] * max_rows // total
        if share == 0 and lag[tp] and budget > 0:
            share = 1
        share = min(share, budget, lag[tp])
        budget -= share
        out[tp] = begin.get(tp, latest[tp]) + share
    return out
