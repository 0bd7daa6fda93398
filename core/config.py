"""Per-log configuration: Kafka's topic-level settings, names and defaults. Pure, no I/O.

``LogConfig`` is a frozen dataclass: a log holds one and a config change builds a new one
(``dataclasses.replace``). ``LogConfig.KEYS`` maps each field to Kafka's topic-level name;
``from_properties`` parses a ``{name: value}`` dict (values may be strings) and raises
``InvalidConfigError`` (INVALID_CONFIG) naming the key at fault.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field

from odradek.core.errors import InvalidConfigError

log = logging.getLogger("odradek.config")

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1


def _key(name: str, minimum: int | float | None = None, maximum: int | float | None = None,
         choices: tuple | None = None, pattern: str | None = None, form: str | None = None):
    return {"key": name, "min": minimum, "max": maximum, "choices": choices, "pattern": pattern, "form": form}


# Every topic-level config of Kafka 3.0 to 3.9 (Kafka's generated docs, topic_config.html):
# name -> (type, minimum, maximum, choices, one more value allowed outside the range). The
# ones LogConfig has no field for are accepted as Kafka accepts them: checked against this,
# stored with the topic, reported by DescribeConfigs, and without effect here (``accepted``
# logs a warning naming them); DEPRECATED_TOPIC_CONFIGS are Kafka's deprecated ones.
KAFKA_TOPIC_CONFIGS = {
    'cleanup.policy': ('list', None, None, ('compact', 'delete'), None),
    'compression.gzip.level': ('int', 1, 9, None, -1),
    'compression.lz4.level': ('int', 1, 17, None, None),
    'compression.type': ('string', None, None, ('uncompressed', 'zstd', 'lz4', 'snappy', 'gzip', 'producer'), None),
    'compression.zstd.level': ('int', -131072, 22, None, None),
    'delete.retention.ms': ('long', 0, None, None, None),
    'file.delete.delay.ms': ('long', 0, None, None, None),
    'flush.messages': ('long', 1, None, None, None),
    'flush.ms': ('long', 0, None, None, None),
    'follower.replication.throttled.replicas': ('list', None, None, None, None),
    'index.interval.bytes': ('int', 0, None, None, None),
    'leader.replication.throttled.replicas': ('list', None, None, None, None),
    'local.retention.bytes': ('long', -2, None, None, None),
    'local.retention.ms': ('long', -2, None, None, None),
    'max.compaction.lag.ms': ('long', 1, None, None, None),
    'max.message.bytes': ('int', 0, None, None, None),
    'message.downconversion.enable': ('boolean', None, None, None, None),
    'message.format.version': ('string', None, None, None, None),
    'message.timestamp.after.max.ms': ('long', 0, None, None, None),
    'message.timestamp.before.max.ms': ('long', 0, None, None, None),
    'message.timestamp.difference.max.ms': ('long', 0, None, None, None),
    'message.timestamp.type': ('string', None, None, ('CreateTime', 'LogAppendTime'), None),
    'min.cleanable.dirty.ratio': ('double', 0.0, 1.0, None, None),
    'min.compaction.lag.ms': ('long', 0, None, None, None),
    'min.insync.replicas': ('int', 1, None, None, None),
    'preallocate': ('boolean', None, None, None, None),
    'remote.log.copy.disable': ('boolean', None, None, None, None),
    'remote.log.delete.on.disable': ('boolean', None, None, None, None),
    'remote.storage.enable': ('boolean', None, None, None, None),
    'retention.bytes': ('long', None, None, None, None),
    'retention.ms': ('long', -1, None, None, None),
    'segment.bytes': ('int', 14, None, None, None),
    'segment.index.bytes': ('int', 4, None, None, None),
    'segment.jitter.ms': ('long', 0, None, None, None),
    'segment.ms': ('long', 1, None, None, None),
    'unclean.leader.election.enable': ('boolean', None, None, None, None),
}
DEPRECATED_TOPIC_CONFIGS = frozenset({"message.format.version", "message.timestamp.difference.max.ms"})

# Kafka's throttled replica lists: "*" (every replica), or partition:broker pairs, comma-separated
THROTTLED_REPLICAS = r"\*|(\d+:\d+(,\d+:\d+)*)?"


@dataclass(frozen=True)
class LogConfig:
    """Settings of one partition log (Kafka's topic-level names in ``KEYS``)."""

    segment_bytes: int = field(default=1 << 30, metadata=_key("segment.bytes", 14, INT_MAX))
    segment_ms: int = field(default=604_800_000, metadata=_key("segment.ms", 1))
    segment_index_bytes: int = field(default=10 << 20, metadata=_key("segment.index.bytes", 12, INT_MAX))
    index_interval_bytes: int = field(default=4096, metadata=_key("index.interval.bytes", 0, INT_MAX))
    retention_ms: int = field(default=604_800_000, metadata=_key("retention.ms", -1))
    retention_bytes: int = field(default=-1, metadata=_key("retention.bytes", -1))
    max_message_bytes: int = field(default=1_048_588, metadata=_key("max.message.bytes", 61, INT_MAX))
    flush_messages: int = field(default=LONG_MAX, metadata=_key("flush.messages", 1))
    flush_ms: int = field(default=LONG_MAX, metadata=_key("flush.ms", 0))
    cleanup_policy: str = field(default="delete", metadata=_key(
        "cleanup.policy", choices=("delete", "compact", "compact,delete", "delete,compact")))
    delete_retention_ms: int = field(default=86_400_000, metadata=_key("delete.retention.ms", 0))
    min_compaction_lag_ms: int = field(default=0, metadata=_key("min.compaction.lag.ms", 0))
    min_cleanable_dirty_ratio: float = field(default=0.5, metadata=_key("min.cleanable.dirty.ratio", 0.0, 1.0))
    file_delete_delay_ms: int = field(default=60_000, metadata=_key("file.delete.delay.ms", 0))
    message_timestamp_type: str = field(default="CreateTime", metadata=_key(
        "message.timestamp.type", choices=("CreateTime", "LogAppendTime")))
    # Replication (cluster mode): read by the partition's leader and by the controller.
    min_insync_replicas: int = field(default=1, metadata=_key("min.insync.replicas", 1, 1000))
    unclean_leader_election_enable: bool = field(default=False, metadata=_key("unclean.leader.election.enable"))
    # Replication throttles (read by each broker's agent, coordinator.throttles): the replicas
    # of this topic whose replication traffic is throttled, on the leader side (what a leader
    # serves them) and the follower side (what they fetch as followers).
    leader_replication_throttled_replicas: str = field(default="", metadata=_key(
        "leader.replication.throttled.replicas", pattern=THROTTLED_REPLICAS, form="'*' or partition:broker,..."))
    follower_replication_throttled_replicas: str = field(default="", metadata=_key(
        "follower.replication.throttled.replicas", pattern=THROTTLED_REPLICAS, form="'*' or partition:broker,..."))

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def max_index_entries(self) -> int:
        return self.segment_index_bytes // 12  # both index files fit (8- and 12-byte entries)

    def to_properties(self) -> dict:
        """``{kafka.name: value}`` for every setting."""
        return {f.metadata["key"]: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_properties(cls, props: dict, base: "LogConfig | None" = None) -> "LogConfig":
        """Parse Kafka-named settings over ``base`` (default: Kafka's defaults).

        Unknown keys, unparsable values and out-of-range values raise ``InvalidConfigError``
        naming the key.
        """
        by_key = {f.metadata["key"]: f for f in dataclasses.fields(cls)}
        values = {}
        for key, raw in props.items():
            f = by_key.get(key)
            if f is None:
                kafka_value(key, raw, KAFKA_TOPIC_CONFIGS, "log config key")  # Kafka's, without effect here
                continue
            values[f.name] = _parse(key, f, raw)
        cfg = dataclasses.replace(base or cls(), **values)
        cfg.check()
        return cfg

    @classmethod
    def normalized(cls, props: dict) -> dict:
        """Every setting of ``props`` over the defaults, checked, as stored with a topic:
        ``to_properties()`` plus Kafka's topic configs that LogConfig does not implement
        (as Kafka spells their values; each one named in a warning)."""
        out = cls.from_properties(props).to_properties()
        for key, raw in props.items():
            if key not in out:
                out[key] = kafka_value(key, raw, KAFKA_TOPIC_CONFIGS, "log config key")
                log.warning("topic config %r = %r is accepted as Kafka does%s, but has no effect in Odradek", key,
                            out[key], " (deprecated in Kafka)" if key in DEPRECATED_TOPIC_CONFIGS else "")
        return out

    def check(self) -> None:
        """Raise ``InvalidConfigError`` for the first out-of-range setting."""
        for f in dataclasses.fields(self):
            _check_range(f.metadata, getattr(self, f.name))


def kafka_value(key: str, raw, table: dict, what: str = "config") -> str:
    """``raw`` checked as Kafka checks config ``key`` (its ``table`` entry: type, range,
    choices), as a string; InvalidConfigError for an unknown key or a bad value."""
    spec = table.get(key)
    if spec is None:
        raise InvalidConfigError(f"unknown {what} {key!r}")
    kind, low, high, choices, also = spec
    text = ("true" if raw else "false") if isinstance(raw, bool) else str(raw).strip()
    try:
        if kind == "boolean":
            if text.lower() not in ("true", "false"):
                raise ValueError(raw)
            return text.lower()
        if kind in ("int", "long", "short", "double"):
            value = float(text) if kind == "double" else int(text)
            if value != also and ((low is not None and value < low) or (high is not None and value > high)):
                bounds = f"from {low}" + (f" to {high}" if high is not None else "") + \
                    (f" (or {also})" if also is not None else "")
                raise InvalidConfigError(f"{key}: {raw!r} is not {bounds}")
            return text
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{key}: {raw!r} is not a valid {kind}") from None
    items = [v.strip() for v in text.split(",")] if kind == "list" else [text]
    if choices is not None and any(v not in choices for v in items if v or kind != "list"):
        raise InvalidConfigError(f"{key}: {raw!r} is not {'a list of ' if kind == 'list' else ''}"
                                 f"{', '.join(choices)}")
    return text


def _parse(key: str, f: dataclasses.Field, raw):
    kind = f.type if isinstance(f.type, type) else {"int": int, "float": float, "str": str, "bool": bool}[f.type]
    try:
        if kind is bool:
            text = str(raw).strip().lower()
            if text not in ("true", "false"):
                raise ValueError(raw)
            value = text == "true"
        elif kind is int:
            if isinstance(raw, bool) or isinstance(raw, float):
                raise ValueError(raw)
            value = int(str(raw).strip())
        elif kind is float:
            if isinstance(raw, bool):
                raise ValueError(raw)
            value = float(raw)
        else:
            value = str(raw).strip().replace(" ", "")
    except (TypeError, ValueError):
        raise InvalidConfigError(f"{key}: {raw!r} is not a valid {kind.__name__}") from None
    _check_range(f.metadata, value)
    return value


def _check_range(meta: dict, value) -> None:
    key = meta["key"]
    if meta["pattern"] is not None and not re.fullmatch(meta["pattern"], value):
        raise InvalidConfigError(f"{key}: {value!r} is not {meta['form']}")
    if meta["choices"] is not None and value not in meta["choices"]:
        raise InvalidConfigError(f"{key}: {value!r} is not one of {', '.join(meta['choices'])}")
    if meta["min"] is not None and value < meta["min"]:
        raise InvalidConfigError(f"{key}: {value!r} is below the minimum {meta['min']}")
    if meta["max"] is not None and value > meta["max"]:
        raise InvalidConfigError(f"{key}: {value!r} is above the maximum {meta['max']}")
