"""Per-log configuration: Kafka's topic-level settings, names and defaults.

Pure (no I/O). ``LogConfig`` is a frozen dataclass: a log holds one and a config change
builds a new one (``dataclasses.replace``). Each field's docs key is Kafka's topic-level name
(``LogConfig.KEYS``); ``from_properties`` parses a ``{name: value}`` dict (values may be
strings, as they come from TOML ``--set`` overrides) and raises ``InvalidConfigError``
(INVALID_CONFIG) naming the key at fault.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from odradek.log.errors import InvalidConfigError

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1


def _key(name: str, minimum: int | float | None = None, maximum: int | float | None = None,
         choices: tuple | None = None, pattern: str | None = None, form: str | None = None):
    return {"key": name, "min": minimum, "max": maximum, "choices": choices, "pattern": pattern, "form": form}


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
                raise InvalidConfigError(f"unknown log config key {key!r}")
            values[f.name] = _parse(key, f, raw)
        cfg = dataclasses.replace(base or cls(), **values)
        cfg.check()
        return cfg

    def check(self) -> None:
        """Raise ``InvalidConfigError`` for the first out-of-range setting."""
        for f in dataclasses.fields(self):
            _check_range(f.metadata, getattr(self, f.name))


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
