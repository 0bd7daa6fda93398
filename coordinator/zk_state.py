"""Cluster state in ZooKeeper: the paths (Kafka's), their JSON, and a partition's state.

Pure data and encoding; the ``controller`` actor (``coordinator.cluster_controller`` and its
broker agent, ``coordinator.broker_agent``) is the only code that talks to ZooKeeper.
docs/REPLICATION.md shows the whole layout.
"""
from __future__ import annotations

import json

BROKERS = "/brokers/ids"                        # ephemeral <id>: {"host", "port"}
TOPICS = "/brokers/topics"                      # <topic>: {"topic_id", "partitions": {"0": [replicas]},
                                                #   "adding_replicas"/"removing_replicas": {"0": [...]} (KIP-455)
CONFIGS = "/config/topics"                      # <topic>: {"config": {name: value}}
BROKER_CONFIGS = "/config/brokers"              # <id>: {"config": {"leader.replication.throttled.rate": ...}}
NOTIFICATIONS = "/isr_change_notification"      # isr_change_<seq>: [[topic, partition], ...]
CONTROLLER = "/controller"                      # ephemeral {"brokerid"}
CONTROLLER_EPOCH = "/controller_epoch"          # "<int>"


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def to_json(data) -> bytes:
    return json.dumps(data, sort_keys=True).encode()


def topic_data(topic_id: str, created_ms: int, replicas: list[list[int]], adding: dict[int, list[int]],
               removing: dict[int, list[int]]) -> bytes:
    """The topic node as Kafka (2.4+) writes it: during a reassignment ``partitions`` holds
    every replica of the move (target and original), and ``adding_replicas`` /
    ``removing_replicas`` say which are which, so a new controller can resume the move."""
    return to_json({"topic_id": topic_id, "created_ms": created_ms, "version": 2,
                    "partitions": {str(p): r for p, r in enumerate(replicas)},
                    "adding_replicas": {str(p): r for p, r in adding.items() if r},
                    "removing_replicas": {str(p): r for p, r in removing.items() if r}})


def parse_topic(raw: bytes) -> tuple[dict, list[list[int]], dict[int, list[int]], dict[int, list[int]]]:
    """-> (the node's JSON, replicas per partition, adding and removing replicas by partition)."""
    d = json.loads(raw)
    replicas = [d["partitions"][str(i)] for i in range(len(d["partitions"]))]
    adding = {int(p): r for p, r in (d.get("adding_replicas") or {}).items()}
    removing = {int(p): r for p, r in (d.get("removing_replicas") or {}).items()}
    return d, replicas, adding, removing


class PartitionState:
    """``/brokers/topics/<t>/partitions/<p>/state``, with the node's version (``zk_version``)
    for conditional writes."""
    __slots__ = ("leader", "leader_epoch", "isr", "controller_epoch", "zk_version")

    def __init__(self, leader: int, leader_epoch: int, isr: list[int], controller_epoch: int, zk_version: int = -1):
        self.leader, self.leader_epoch, self.isr = leader, leader_epoch, list(isr)
        self.controller_epoch, self.zk_version = controller_epoch, zk_version

    def data(self) -> bytes:
        return to_json({"leader": self.leader, "leader_epoch": self.leader_epoch, "isr": self.isr,
                        "controller_epoch": self.controller_epoch, "version": 1})

    @classmethod
    def parse(cls, raw: bytes, zk_version: int) -> "PartitionState":
        d = json.loads(raw)
        return cls(d["leader"], d["leader_epoch"], d["isr"], d.get("controller_epoch", 0), zk_version)
