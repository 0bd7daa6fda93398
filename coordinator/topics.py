"""Topic metadata: names, partition counts, per-topic config overrides, and placement.

Pure state plus one durable file. Single writer: only the controller actor holds a
``TopicRegistry`` and changes it; everyone else receives copies by message. The file
(``<log.dirs>/meta/topics.json``) is replaced atomically: temp file, fsync, rename, fsync of
the directory, so a crash leaves either the old or the new metadata, never a mix. Beside it
a reserve (``topics.json.reserve``, preallocated, at least twice the file) is given up when
the disk is full, so that a change that frees space (a deletion, the undoing of a creation
whose partitions could not be opened) can still be saved; a creation or an alter on a full
disk is refused, and the reserve is taken again on a later save.

Topic names follow Kafka's rule: 1 to 249 characters of ``[a-zA-Z0-9._-]``, not ``.`` or
``..``. The internal topics (``core.protocol.INTERNAL_TOPICS``) are created here too, at
their coordinators' request; clients cannot delete or alter them, nor create them otherwise
(the handlers refuse).
"""
from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import time
import uuid

from odradek.core.config import LogConfig
from odradek.core.errors import InvalidConfigError
from odradek.log.files import FileLayer
from odradek.core.protocol import ErrorCode, OdradekError, check_topic_name  # noqa: F401 (re-exported)

log = logging.getLogger("odradek.controller")

RESERVE_MIN = 64 << 10  # bytes kept for the metadata's own rewrites on a full disk (at least 2x the file)
MAX_PARTITIONS = 10000
FILE_VERSION = 1


def check_partition_count(name: str, have: int, count) -> None:
    """CreatePartitions' new count (standalone and cluster alike): more than the ``have``
    partitions (none can be removed), at most MAX_PARTITIONS, else INVALID_PARTITIONS."""
    if not isinstance(count, int) or isinstance(count, bool) or count <= have:
        raise OdradekError(f"topic '{name}' has {have} partitions; the new count ({count!r}) must be larger "
                           f"(partitions cannot be removed)", ErrorCode.INVALID_PARTITIONS)
    if count > MAX_PARTITIONS:
        raise OdradekError(f"{count} partitions is more than the limit of {MAX_PARTITIONS}",
                           ErrorCode.INVALID_PARTITIONS)


@dataclasses.dataclass
class Topic:
    name: str
    topic_id: str
    partitions: int
    replication_factor: int
    configs: dict  # overrides only, by topic-level name
    created_ms: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class TopicRegistry:
    """The set of topics. Every mutation bumps ``version`` and is saved before it returns."""

    def __init__(self, path: str | None, defaults: dict, default_partitions: int = 1, default_replication: int = 1,
                 max_replication: int = 1, now_ms=lambda: int(time.time() * 1000), min_segment_bytes: int = 14):
        self.path = path
        self.min_segment_bytes = min_segment_bytes  # the broker's log.segment.bytes.min
        self.defaults = defaults  # topic-level defaults from the broker config
        self.default_partitions = default_partitions
        self.default_replication = default_replication
        self.max_replication = max_replication
        self.now_ms = now_ms
        self.topics: dict[str, Topic] = {}
        self.version = 0
        self._load()

    # ---- persistence ---------------------------------------------------------------
    def _load(self) -> None:
        if self.path is None:  # cluster mode: ZooKeeper is the store, the controller fills this
            return
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._keep_reserve(0)
            return
        except (OSError, ValueError) as exc:
            raise OdradekError(f"topic metadata {self.path} is unreadable ({exc}); restore it from a backup "
                               f"or move it away to start with no topics", ErrorCode.KAFKA_STORAGE_ERROR) from None
        self.version = int(data.get("version", 0))
        for t in data.get("topics", []):
            self.topics[t["name"]] = Topic(**t)
        self._keep_reserve(os.path.getsize(self.path))

    def _commit(self, undo, frees_space: bool = False) -> None:
        """Bump the version and save; if the save fails (a full disk), ``undo()`` the change
        in memory and refuse it with KAFKA_STORAGE_ERROR: memory never runs ahead of the file.
        A change that ``frees_space`` may use the reserve."""
        self.version += 1
        try:
            self._save(frees_space)
        except OSError as exc:
            self.version -= 1
            undo()
            raise OdradekError(f"could not write the topic metadata {self.path}: {exc.strerror or exc}; "
                               f"nothing was changed", ErrorCode.KAFKA_STORAGE_ERROR) from None

    def _save(self, frees_space: bool = False) -> None:
        if self.path is None:
            return
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        data = json.dumps({"format": FILE_VERSION, "version": self.version,
                           "topics": [t.to_dict() for t in self.topics.values()]}, indent=1, sort_keys=True).encode()
        try:
            FileLayer().write_file_atomically(self.path, data)
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not frees_space or not self._give_up_reserve():
                raise
            log.warning("%s: the disk is full; the reserve beside it was given up for this change", self.path)
            FileLayer().write_file_atomically(self.path, data)
        self._keep_reserve(len(data))

    def _keep_reserve(self, size: int) -> None:
        """Preallocate the reserve to at least twice the file (best effort: a full disk leaves
        it smaller until a later save)."""
        want, path = max(RESERVE_MIN, 2 * size), self.path + ".reserve"
        try:
            if os.path.exists(path) and os.path.getsize(path) >= want:
                return
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, want)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("%s: cannot keep %d bytes in reserve (%s); a deletion on a full disk may fail",
                        path, want, exc.strerror or exc)

    def _give_up_reserve(self) -> bool:
        try:
            os.unlink(self.path + ".reserve")
            return True
        except FileNotFoundError:
            return False

    # ---- reads -----------------------------------------------------------------------
    def get(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            raise OdradekError(f"topic '{name}' does not exist", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return topic

    def log_config(self, name: str) -> LogConfig:
        return LogConfig.from_properties({**self.defaults, **self.get(name).configs})

    def effective_configs(self, name: str) -> list[dict]:
        """Every topic-level setting with its value and where it comes from."""
        topic = self.get(name)
        out = []
        for key, value in LogConfig.from_properties({**self.defaults, **topic.configs}).to_properties().items():
            source = "topic" if key in topic.configs else "default"
            out.append({"name": key, "value": str(value), "source": source, "read_only": False})
        return out

    # ---- changes ---------------------------------------------------------------------
    def validate_create(self, name, partitions, replication_factor, configs) -> tuple[int, int, dict]:
        check_topic_name(name)
        if name in self.topics:
            raise OdradekError(f"topic '{name}' already exists", ErrorCode.TOPIC_ALREADY_EXISTS)
        if partitions in (None, -1):
            partitions = self.default_partitions
        if not isinstance(partitions, int) or isinstance(partitions, bool) or not 1 <= partitions <= MAX_PARTITIONS:
            raise OdradekError(f"number of partitions must be from 1 to {MAX_PARTITIONS}, got {partitions!r}",
                               ErrorCode.INVALID_PARTITIONS)
        if replication_factor in (None, -1):
            replication_factor = self.default_replication
        if not isinstance(replication_factor, int) or isinstance(replication_factor, bool) or \
                not 1 <= replication_factor <= self.max_replication:
            raise OdradekError(f"replication factor must be from 1 to {self.max_replication} (the number of "
                               f"brokers), got {replication_factor!r}", ErrorCode.INVALID_REPLICATION_FACTOR)
        configs = self._checked_configs(configs or {})
        return partitions, replication_factor, configs

    def _checked_configs(self, configs: dict) -> dict:
        if not isinstance(configs, dict):
            raise OdradekError("configs must be a map of name to value", ErrorCode.INVALID_CONFIG)
        try:
            parsed = LogConfig.normalized({**self.defaults, **configs})  # Kafka's unimplemented ones kept too
        except InvalidConfigError as exc:
            raise OdradekError(exc.message, ErrorCode.INVALID_CONFIG) from None
        if "segment.bytes" in configs and parsed["segment.bytes"] < self.min_segment_bytes:
            raise OdradekError(f"segment.bytes {parsed['segment.bytes']} is below the minimum {self.min_segment_bytes} "
                               f"(log.segment.bytes.min): each segment costs files and descriptors",
                               ErrorCode.INVALID_CONFIG)
        return {k: parsed[k] for k in configs}

    def create(self, name, partitions=None, replication_factor=None, configs=None) -> Topic:
        partitions, replication_factor, configs = self.validate_create(name, partitions, replication_factor, configs)
        topic = Topic(name, uuid.uuid4().hex, partitions, replication_factor, configs, self.now_ms())
        self.topics[name] = topic
        self._commit(lambda: self.topics.pop(name))
        return topic

    def delete(self, name: str) -> Topic:
        """Remove ``name`` (saved even on a full disk, with the reserve: it frees space)."""
        topic = self.get(name)
        del self.topics[name]
        self._commit(lambda: self.topics.__setitem__(name, topic), frees_space=True)
        return topic

    def alter_configs(self, name: str, ops: list) -> Topic:
        """``ops``: ``[{"name", "value", "op": "set"|"delete"}]``, applied all or nothing."""
        topic = self.get(name)
        configs = dict(topic.configs)
        for op in ops:
            if not isinstance(op, dict) or not isinstance(op.get("name"), str):
                raise OdradekError("each config change needs a name", ErrorCode.INVALID_REQUEST)
            kind = op.get("op", "set")
            if kind == "set":
                configs[op["name"]] = op.get("value")
            elif kind == "delete":
                configs.pop(op["name"], None)
            else:
                raise OdradekError(f"config operation must be 'set' or 'delete', got {kind!r}",
                                   ErrorCode.INVALID_REQUEST)
        old, topic.configs = topic.configs, self._checked_configs(configs)
        self._commit(lambda: setattr(topic, "configs", old))
        return topic

    def add_partitions(self, name: str, count, assignments, broker_id: int, validate_only: bool) -> tuple[int, int]:
        """One broker's CreatePartitions: grow ``name`` to ``count`` partitions (each new one on
        ``broker_id``; an explicit assignment must say so). Returns (before, after)."""
        topic = self.get(name)
        have = topic.partitions
        check_partition_count(name, have, count)
        if assignments is not None:
            wanted = [a.get("broker_ids") if isinstance(a, dict) else a for a in assignments] \
                if isinstance(assignments, list) else None
            if wanted is None or len(wanted) != count - have or any(list(w or ()) != [broker_id] for w in wanted):
                raise OdradekError(f"topic '{name}': each of the {count - have} new partitions must be assigned "
                                   f"[{broker_id}] (the only broker), got {assignments!r}",
                                   ErrorCode.INVALID_REPLICA_ASSIGNMENT)
        if not validate_only:
            topic.partitions = count
            self._commit(lambda: setattr(topic, "partitions", have))
        return have, count

    def snapshot(self) -> dict:
        """What handlers cache: plain data, one message."""
        return {"version": self.version,
                "topics": {n: {"id": t.topic_id, "partitions": t.partitions,
                               "replication_factor": t.replication_factor, "configs": t.configs}
                           for n, t in self.topics.items()},
                "defaults": self.defaults}
