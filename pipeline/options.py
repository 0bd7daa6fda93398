"""The connector's options: names, defaults and validation, shaped after Spark's Kafka source.

Pure (no I/O, no Spark import): runs on the driver when a query is planned, and is unit-tested
without a broker. Spark hands a data source its options in a case-insensitive map, so every
lookup here is by lower-cased name; messages name the option as the user spells it in Spark's
documentation (``startingOffsets``), so a failed query says which option to fix.

Offsets in options and in the checkpoint use Spark's Kafka JSON: ``{"topic": {"0": 23}}``
with ``-2`` for earliest and ``-1`` for latest; ``assign`` is ``{"topic": [0, 1]}``.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Mapping

EARLIEST = -2
LATEST = -1

DEFAULT_FETCH_BYTES = 4 << 20
DEFAULT_POLL_TIMEOUT_MS = 120_000  # Spark's kafkaConsumer.pollTimeoutMs default (spark.network.timeout)


class OptionError(ValueError):
    """A missing, contradictory or malformed option: the user's to fix (the message names it)."""


@dataclass(frozen=True)
class Subscription:
    """Which topics a query reads: exactly one of ``subscribe``, ``subscribePattern``, ``assign``."""

    kind: str  # "subscribe" | "subscribePattern" | "assign"
    topics: tuple = ()  # subscribe: the names
    pattern: str | None = None  # subscribePattern: a regex matched against whole topic names
    partitions: tuple = ()  # assign: ((topic, partition), ...)

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.partitions)


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends: ``earliest``/``latest``, per-partition offsets, or times.

    ``kind`` is "earliest", "latest", "offsets" (``per`` maps (topic, partition) -> offset, -2/-1
    allowed), "timestamp" (``ts`` for every partition) or "timestamps" (``per`` maps
    (topic, partition) -> time in ms).
    """

    kind: str
    option: str  # the option it came from, for messages
    per: dict = field(default_factory=dict)
    ts: int | None = None


@dataclass(frozen=True)
class ReadOptions:
    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec | None  # None for a stream
    include_headers: bool = False
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    by_timestamp_strategy: str = "error"  # startingOffsetsByTimestampStrategy: "error" | "latest"
    fetch_bytes: int = DEFAULT_FETCH_BYTES
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    offset_retries: int = 3
    offset_retry_interval_ms: int = 1000
    read_committed: bool = False  # kafka.isolation.level=read_committed


@dataclass(frozen=True)
class WriteOptions:
    bootstrap: str
    topic: str | None  # the ``topic`` option; else each row's ``topic`` column
    acks: int = -1
    compression: str | None = "lz4"
    batch_records: int = 16384
    batch_bytes: int = 1 << 20
    max_in_flight: int = 5
    retry_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    batch_id_header: str | None = None  # streaming: stamp "<queryId>:<batchId>" under this header
    exactly_once: bool = True  # streaming: each task's rows in one transaction, a re-run skipped
    transactional_id_prefix: str = "odradek-sink-"
    transaction_timeout_ms: int = 300_000


def _lower(options: Mapping[str, str]) -> dict:
    return {str(k).lower(): v for k, v in dict(options).items() if v is not None}


def bootstrap_servers(opts: dict) -> str:
    """``kafka.bootstrap.servers`` (Spark's Kafka spelling) or ``bootstrap.servers``."""
    a, b = opts.get("kafka.bootstrap.servers"), opts.get("bootstrap.servers")
    if a and b and a != b:
        raise OptionError(f"kafka.bootstrap.servers ({a!r}) and bootstrap.servers ({b!r}) disagree: give one")
    value = a or b
    if not value or not str(value).strip():
        raise OptionError("option kafka.bootstrap.servers (or bootstrap.servers) is required, e.g. "
                          "'127.0.0.1:9092'")
    for item in str(value).split(","):
        host, sep, port = item.strip().split("://")[-1].rpartition(":")
        if not sep or not port.isdigit():
            raise OptionError(f"kafka.bootstrap.servers: {item.strip()!r} is not host:port")
    return str(value)


ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def read_committed(opts: dict) -> bool:
    """``kafka.isolation.level`` (the Kafka consumer's setting, as Spark's Kafka source passes
    it through) or ``isolationLevel``: ``read_uncommitted`` (the default, as Kafka's consumer
    and Spark's Kafka source) or ``read_committed``."""
    a, b = opts.get("kafka.isolation.level"), opts.get("isolationlevel")
    if a is not None and b is not None and str(a).strip().lower() != str(b).strip().lower():
        raise OptionError(f"kafka.isolation.level ({a!r}) and isolationLevel ({b!r}) disagree: give one")
    name = "kafka.isolation.level" if a is not None else "isolationLevel"
    value = str(a if a is not None else b if b is not None else "read_uncommitted").strip().lower()
    if value not in ISOLATION_LEVELS:
        raise OptionError(f"option {name} must be read_uncommitted or read_committed, "
                          f"got {a if a is not None else b!r}")
    return value == "read_committed"


def _bool(opts: dict, name: str, default: bool) -> bool:
    v = opts.get(name.lower())
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise OptionError(f"option {name} must be true or false, got {v!r}")


def _int(opts: dict, name: str, default: int | None, minimum: int | None = None) -> int | None:
    v = opts.get(name.lower())
    if v is None:
        return default
    try:
        n = int(str(v).strip())
    except ValueError:
        raise OptionError(f"option {name} must be an integer, got {v!r}") from None
    if minimum is not None and n < minimum:
        raise OptionError(f"option {name} must be >= {minimum}, got {n}")
    return n


def _json(name: str, text: str):
    try:
        return json.loads(text)
    except ValueError as exc:
        raise OptionError(f"option {name} is not valid JSON ({exc.msg}): {text!r}") from None


def subscription(opts: dict) -> Subscription:
    given = [n for n in ("subscribe", "subscribePattern", "assign") if opts.get(n.lower()) not in (None, "")]
    if len(given) != 1:
        what = "none was given" if not given else f"got {' and '.join(given)}"
        raise OptionError(f"exactly one of the options subscribe, subscribePattern, assign is required ({what})")
    kind = given[0]
    raw = str(opts[kind.lower()])
    if kind == "subscribe":
        topics = tuple(t.strip() for t in raw.split(",") if t.strip())
        if not topics:
            raise OptionError("option subscribe names no topic")
        return Subscription(kind, topics=topics)
    if kind == "subscribePattern":
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError(f"option subscribePattern is not a valid regular expression: {exc}") from None
        return Subscription(kind, pattern=raw)
    parsed = _json("assign", raw)
    if not isinstance(parsed, dict) or not parsed or not all(
            isinstance(v, list) and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in v)
            for v in parsed.values()):
        raise OptionError(f"option assign must be JSON like {{\"topicA\": [0, 1]}}, got {raw!r}")
    parts = tuple(sorted((t, p) for t, ps in parsed.items() for p in ps))
    if not parts:
        raise OptionError("option assign names no partition")
    return Subscription(kind, partitions=parts)


def _offsets_spec(opts: dict, name: str, default: str) -> OffsetSpec:
    raw = str(opts.get(name.lower(), default)).strip()
    if raw.lower() in ("earliest", "latest"):
        return OffsetSpec(raw.lower(), name)
    parsed = _json(name, raw)
    per = {}
    if isinstance(parsed, dict):
        for topic, parts in parsed.items():
            if not isinstance(parts, dict):
                break
            for p, off in parts.items():
                if not str(p).lstrip("-").isdigit() or not isinstance(off, int) or isinstance(off, bool) or off < -2:
                    raise OptionError(f"option {name}: {topic}/{p}: {off!r} is not an offset (-2 earliest, "
                                      f"-1 latest, or >= 0)")
                per[(topic, int(p))] = off
        else:
            return OffsetSpec("offsets", name, per)
    raise OptionError(f"option {name} must be 'earliest', 'latest' or JSON like {{\"topicA\": {{\"0\": 23}}}}, "
                      f"got {raw!r}")


def _timestamps_spec(opts: dict, name: str) -> OffsetSpec:
    raw = str(opts[name.lower()])
    parsed = _json(name, raw)
    per = {}
    if isinstance(parsed, dict) and all(isinstance(v, dict) for v in parsed.values()):
        for topic, parts in parsed.items():
            for p, ts in parts.items():
                if not str(p).isdigit() or not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                    raise OptionError(f"option {name}: {topic}/{p}: {ts!r} is not a time in ms")
                per[(topic, int(p))] = ts
        return OffsetSpec("timestamps", name, per)
    raise OptionError(f"option {name} must be JSON like {{\"topicA\": {{\"0\": 1700000000000}}}}, got {raw!r}")


def _bound(opts: dict, which: str, default: str) -> OffsetSpec:
    """startingX / endingX: a global timestamp wins over per-partition timestamps, which win
    over offsets (Spark's order of precedence)."""
    ts_name = f"{which}Timestamp"
    if opts.get(ts_name.lower()) is not None:
        ts = _int(opts, ts_name, None, minimum=0)
        return OffsetSpec("timestamp", ts_name, ts=ts)
    if opts.get(f"{which}OffsetsByTimestamp".lower()) is not None:
        return _timestamps_spec(opts, f"{which}OffsetsByTimestamp")
    return _offsets_spec(opts, f"{which}Offsets", default)


def _common(opts: dict) -> dict:
    strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).lower()
    if strategy not in ("error", "latest"):
        raise OptionError(f"option startingOffsetsByTimestampStrategy must be 'error' or 'latest', got {strategy!r}")
    return dict(
        include_headers=_bool(opts, "includeHeaders", False),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        by_timestamp_strategy=strategy,
        fetch_bytes=_int(opts, "fetchMaxBytes", DEFAULT_FETCH_BYTES, minimum=1024),
        poll_timeout_ms=_int(opts, "kafkaConsumer.pollTimeoutMs", DEFAULT_POLL_TIMEOUT_MS, minimum=1),
        offset_retries=_int(opts, "fetchOffset.numRetries", 3, minimum=0),
        offset_retry_interval_ms=_int(opts, "fetchOffset.retryIntervalMs", 1000, minimum=0),
        read_committed=read_committed(opts),
    )


def batch_read_options(options: Mapping[str, str]) -> ReadOptions:
    """Options of ``spark.read.format("odradek")``. Raises ``OptionError`` naming the option."""
    opts = _lower(options)
    bootstrap, sub = bootstrap_servers(opts), subscription(opts)
    starting = _bound(opts, "starting", "earliest")
    ending = _bound(opts, "ending", "latest")
    if starting.kind == "latest" or (starting.kind == "offsets" and LATEST in starting.per.values()):
        raise OptionError("option startingOffsets: 'latest' (-1) is not allowed for a batch query "
                          "(it would read nothing); use a stream, or 'earliest' / offsets")
    if ending.kind == "earliest" or (ending.kind == "offsets" and EARLIEST in ending.per.values()):
        raise OptionError("option endingOffsets: 'earliest' (-2) is not allowed for a batch query")
    for name in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger"):
        if opts.get(name.lower()) is not None:
            raise OptionError(f"option {name} applies to streams only; a batch query reads the whole range")
    _check_assigned(sub, starting)
    _check_assigned(sub, ending)
    return ReadOptions(bootstrap, sub, starting, ending,
                       min_partitions=_int(opts, "minPartitions", None, minimum=1),
                       max_records_per_partition=_int(opts, "maxRecordsPerPartition", None, minimum=1),
                       **_common(opts))


def stream_read_options(options: Mapping[str, str]) -> ReadOptions:
    """Options of ``spark.readStream.format("odradek")``."""
    opts = _lower(options)
    bootstrap, sub = bootstrap_servers(opts), subscription(opts)
    starting = _bound(opts, "starting", "latest")
    for name in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
        if opts.get(name.lower()) is not None:
            raise OptionError(f"option {name} applies to batch queries only; a stream has no end")
    _check_assigned(sub, starting)
    return ReadOptions(bootstrap, sub, starting, None,
                       min_partitions=_int(opts, "minPartitions", None, minimum=1),
                       max_records_per_partition=_int(opts, "maxRecordsPerPartition", None, minimum=1),
                       max_offsets_per_trigger=_int(opts, "maxOffsetsPerTrigger", None, minimum=1),
                       **_common(opts))


def _check_assigned(sub: Subscription, spec: OffsetSpec) -> None:
    """With ``assign``, per-partition offsets must name assigned partitions only (Spark's rule)."""
    if sub.kind == "assign" and spec.kind in ("offsets", "timestamps"):
        extra = sorted(set(spec.per) - set(sub.partitions))
        if extra:
            raise OptionError(f"option {spec.option} names partitions that assign does not: "
                              + ", ".join(f"{t}-{p}" for t, p in extra))


_ACKS = {"0": 0, "1": 1, "-1": -1, "all": -1}


def write_options(options: Mapping[str, str], columns: list[str]) -> WriteOptions:
    """Options of ``df.write.format("odradek")`` given the DataFrame's column names."""
    opts = _lower(options)
    bootstrap = bootstrap_servers(opts)
    names = {c.lower() for c in columns}
    if "value" not in names:
        raise OptionError("the DataFrame to write needs a 'value' column (binary or string); "
                          f"it has {', '.join(columns) or 'none'}")
    unknown = names - {"key", "value", "topic", "partition", "headers"}
    if unknown:
        raise OptionError(f"cannot write column(s) {', '.join(sorted(unknown))}: the columns are value and "
                          "optionally key, topic, partition, headers (select or drop the others)")
    topic = opts.get("topic")
    if topic is None and "topic" not in names:
        raise OptionError("option topic is required when the DataFrame has no 'topic' column")
    acks = _ACKS.get(str(opts.get("kafka.acks", "all")).strip().lower())
    if acks is None:
        raise OptionError(f"option kafka.acks must be 0, 1, -1 or all, got {opts.get('kafka.acks')!r}")
    compression = str(opts.get("kafka.compression.type", "lz4")).lower()
    if compression not in ("lz4", "none"):
        raise OptionError(f"option kafka.compression.type must be lz4 or none, got {compression!r}")
    return WriteOptions(bootstrap, topic, acks=acks, compression=None if compression == "none" else "lz4",
                        batch_records=_int(opts, "batchRecords", 16384, minimum=1),
                        batch_bytes=_int(opts, "batchBytes", 1 << 20, minimum=1024),
                        max_in_flight=_int(opts, "maxInFlight", 5, minimum=1),
                        retry_timeout_ms=_int(opts, "kafkaProducer.retryTimeoutMs", DEFAULT_POLL_TIMEOUT_MS,
                                              minimum=1),
                        batch_id_header=opts.get("batchidheader") or None,
                        exactly_once=_bool(opts, "exactlyOnce", True),
                        transactional_id_prefix=str(opts.get("transactionalidprefix", "odradek-sink-")),
                        transaction_timeout_ms=_int(opts, "kafkaProducer.transactionTimeoutMs", 300_000,
                                                    minimum=1000))
