"""Who is where: every actor's address, the log actor hosting a
partition, a partition's directory, and a processor's socket.

Pure (standard library only), layer 2, so every role spells an address and a message the same
way without importing another role's code. An address is a ``ChildSpec`` role
(odradek/broker.py); a pool's members are ``pool_member(role, i)``: ``log-0``, ``handler-2``.
The messages themselves are declared in ``actors.messages``.
"""
from __future__ import annotations

import os
import zlib

SUPERVISOR = "supervisor"
CONTROLLER = "controller"  # the standalone controller, or in a cluster the broker agent + controller
LOG = "log"  # the pool of log actors; a partition's host is ``log_host(topic, partition, hosts)``
FETCH_ACTOR = "fetch"
REPLICA_FETCHER = "replica_fetcher"
GROUP_COORDINATOR = "group_coordinator"
TXN_COORDINATOR = "txn_coordinator"
HANDLER = "handler"
PROCESSOR = "processor"
ACCEPTOR = "acceptor"
METRICS = "metrics"
SCHEMA_REGISTRY = "schema_registry"
HTTP_PROXY = "http_proxy"


def pool_member(role: str, index: int) -> str:
    """The address of member ``index`` of a pool (``log-0``)."""
    return f"{role}-{index}"


def placement(topic: str, partition: int, hosts: int) -> int:
    """Which log-actor process hosts a partition: stable across runs and processes;
    consecutive partitions of a topic land on consecutive hosts."""
    return (zlib.crc32(topic.encode()) + partition) % hosts


def log_host_name(index: int) -> str:
    """The address of log actor ``index``."""
    return pool_member(LOG, index)


def log_host(topic: str, partition: int, hosts: int) -> str:
    """The address of the log actor that hosts a partition, of ``hosts`` log actors."""
    return pool_member(LOG, placement(topic, partition, hosts))


def partition_dir(data_dir: str, topic: str, partition: int) -> str:
    """A partition's directory under the broker's data directory: ``<topic>-<partition>``."""
    return os.path.join(data_dir, f"{topic}-{partition}")


def socket_path(run_dir: str, name: str) -> str:
    """The Unix socket a processor receives connections on (the acceptor hands them over)."""
    return os.path.join(run_dir, name) + ".sock"
