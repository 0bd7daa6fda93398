"""Admin: topics and configs, one blocking request per call (like kafka-python's admin client).

Runs in the caller's thread; starts no thread. Thread-safe: every request goes through the
``Cluster``'s lock and private connection.

    with Admin("127.0.0.1:9092") as admin:
        admin.create_topic("orders", partitions=3, config={"retention.ms": "86400000"})
        print(admin.describe_topic("orders"))

Failures raise the ``odradek.errors`` class for the broker's code (``TopicAlreadyExistsError``,
``UnknownTopicOrPartitionError``, ``InvalidTopicError``, ...) with the broker's message,
prefixed by what was being done.
"""
from __future__ import annotations

from typing import Iterable

from network.protocol import ApiKey, ErrorCode
from odradek.cluster import Cluster
from odradek.errors import check, error_for
from odradek.types import ConfigEntry, PartitionMetadata, TopicDescription, TopicPartition

DEFAULT_TIMEOUT_MS = 30000


class Admin:
    def __init__(self, bootstrap_servers="127.0.0.1:9092", client_id: str = "odradek-admin",
                 request_timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.request_timeout_ms = request_timeout_ms
        self._cluster = Cluster(bootstrap_servers, client_id, request_timeout_ms)

    def __enter__(self) -> "Admin":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._cluster.close()

    def _call(self, api: ApiKey, body: dict) -> dict:
        return self._cluster.request(api, body).header["body"]

    # ---- topics ----------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: dict | None = None, validate_only: bool = False) -> dict:
        """Create a topic; ``partitions=-1`` / ``replication_factor=-1`` take the broker's
        defaults. Returns ``{"name", "num_partitions", "replication_factor"}``."""
        body = {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": replication_factor,
                            "configs": {str(k): str(v) for k, v in (config or {}).items()}}],
                "timeout_ms": self.request_timeout_ms, "validate_only": validate_only}
        result = self._one(self._call(ApiKey.CREATE_TOPICS, body)["topics"], name, f"create topic '{name}'")
        return {"name": name, "num_partitions": result.get("num_partitions", partitions),
                "replication_factor": result.get("replication_factor", replication_factor)}

    def delete_topic(self, name: str) -> None:
        body = {"topics": [name], "timeout_ms": self.request_timeout_ms}
        self._one(self._call(ApiKey.DELETE_TOPICS, body)["topics"], name, f"delete topic '{name}'")

    def list_topics(self, include_internal: bool = False) -> list[str]:
        """Names of the topics, sorted."""
        body = self._cluster.refresh(None)
        return sorted(t["name"] for t in body.get("topics", [])
                      if not t.get("error_code") and (include_internal or not t.get("is_internal")))

    def describe_topic(self, name: str) -> TopicDescription:
        """Partitions (leader, replicas, ISR) and the topic's configs."""
        body = self._cluster.refresh([name])
        topic = next((t for t in body.get("topics", []) if t["name"] == name), None)
        if topic is None:
            raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"describe topic '{name}': not in the answer")
        check(topic.get("error_code"), topic.get("error_message"), f"describe topic '{name}'")
        parts = tuple(PartitionMetadata(name, p.partition, p.leader, p.leader_epoch, p.replicas, p.isr, p.error_code)
                      for p in self._cluster.partitions(name) or ())
        configs = {c.name: c.value for c in self.describe_configs(name)}
        return TopicDescription(name, bool(topic.get("is_internal", False)), parts, configs)

    # ---- configs ---------------------------------------------------------------------------
    def describe_configs(self, name: str, keys: Iterable[str] | None = None,
                         resource_type: str = "topic") -> list[ConfigEntry]:
        """Configs of a topic (or, with ``resource_type="broker"``, a broker id as a string)."""
        body = {"resources": [{"type": resource_type, "name": str(name), "keys": list(keys) if keys else None}]}
        res = self._one(self._call(ApiKey.DESCRIBE_CONFIGS, body)["resources"], str(name),
                        f"describe configs of {resource_type} '{name}'")
        return [ConfigEntry(c["name"], c.get("value"), c.get("source", "unknown"), bool(c.get("read_only", False)))
                for c in res.get("configs", [])]

    def alter_configs(self, name: str, set: dict | None = None, delete: Iterable[str] = (),
                      resource_type: str = "topic") -> None:
        """Incrementally set and delete configs (``delete`` falls back to the default)."""
        configs = [{"name": k, "value": str(v), "op": "set"} for k, v in (set or {}).items()]
        configs += [{"name": k, "value": None, "op": "delete"} for k in delete]
        if not configs:
            raise ValueError("alter_configs: nothing to set or delete")
        body = {"resources": [{"type": resource_type, "name": str(name), "configs": configs}]}
        self._one(self._call(ApiKey.INCREMENTAL_ALTER_CONFIGS, body)["resources"], str(name),
                  f"alter configs of {resource_type} '{name}'")

    # ---- records ---------------------------------------------------------------------------
    def delete_records(self, offsets: dict) -> dict:
        """Delete records below the given offsets: ``{TopicPartition: offset}`` -> the new
        low watermark of each partition (``{TopicPartition: low_watermark}``)."""
        body = {"topics": _by_topic((tp, {"offset": offset}) for tp, offset in offsets.items()),
                "timeout_ms": self.request_timeout_ms}
        out = {}
        for t in self._call(ApiKey.DELETE_RECORDS, body)["topics"]:
            for p in t["partitions"]:
                tp = TopicPartition(t["name"], p["index"])
                check(p.get("error_code"), p.get("error_message"), f"delete records of {tp.topic}-{tp.partition}")
                out[tp] = p.get("low_watermark", -1)
        return out

    def list_offsets(self, partitions: Iterable[TopicPartition], timestamp: int = -1) -> dict:
        """``{TopicPartition: offset}`` for ``timestamp`` -1 (latest), -2 (earliest) or a time in
        ms (the first offset with a timestamp at or after it; -1 if none)."""
        body = {"topics": _by_topic((tp, {"timestamp": timestamp}) for tp in partitions)}
        out = {}
        for t in self._call(ApiKey.LIST_OFFSETS, body)["topics"]:
            for p in t["partitions"]:
                tp = TopicPartition(t["name"], p["index"])
                check(p.get("error_code"), p.get("error_message"), f"list offsets of {tp.topic}-{tp.partition}")
                out[tp] = p.get("offset", -1)
        return out

    @staticmethod
    def _one(items: list, name: str, doing: str) -> dict:
        item = next((i for i in items if i.get("name") == name), None)
        if item is None:
            raise error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"{doing}: the broker's answer does not mention it")
        check(item.get("error_code"), item.get("error_message"), doing)
        return item


def _by_topic(entries) -> list[dict]:
    """``[(TopicPartition, fields)]`` -> the request's ``topics`` list, partitions grouped by topic."""
    by_topic: dict[str, list] = {}
    for tp, fields in entries:
        by_topic.setdefault(tp.topic, []).append({"index": tp.partition, **fields})
    return [{"name": t, "partitions": ps} for t, ps in by_topic.items()]
