"""Cluster state in ZooKeeper: the paths (Kafka's), their JSON, and a partition's state.

Pure data and encoding; the ``controller`` actor (``coordinator.cluster_controller`` and its
broker agent, ``coordinator.broker_agent``) is the only code that talks to ZooKeeper.
docs/REPLICATION.md shows the whole layout.
"""
from __future__ import annotations

import json

BROKERS = "/brokers/ids"                        # ephemeral <id>: {"host", "port"}
TOPICS = "/brokers/topics"                      # <topic>: {"topic_id", "partitions": {"0": [replicas]}}
CONFIGS = "/config/topics"                      # <topic>: {"config": {name: value}}
NOTIFICATIONS = "/isr_change_notification"      # isr_change_<seq>: [[topic, partition], ...]
CONTROLLER = "/controller"                      # ephemeral {"brokerid"}
CONTROLLER_EPOCH = "/controller_epoch"          # "<int>"


def state_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def to_json(data) -> bytes:
    return json.dumps(data, sort_keys=True).encode()


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
