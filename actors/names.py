"""Who is where and what they tell each other: every actor's address, the log actor hosting a
partition, a partition's directory, a processor's socket, and the typed parts of messages.

Pure (standard library only), layer 2, so every role spells an address and a message the same
way without importing another role's code. An address is a ``ChildSpec`` role
(odradek/broker.py); a pool's members are ``pool_member(role, i)``: ``log-0``, ``handler-2``.
Message parts are NamedTuples; msgpack sends a tuple as an array, so a receiver gets a list of
the same fields in the same order. Invariant: on the produce/fetch path senders build plain
tuples in that order instead of calling the constructor. The path:

    handler -> log-<i>   produce {acks, timeout_ms, parts: [ProducePart], errors: [PartError]}
                         + one frame per ProducePart (answered to the client's processor);
                         delete_records {parts: [DeleteRecordsPart]},
                         offset_for_leader_epoch {parts: [EpochQuery]}
    handler -> fetch     fetch {body}, list_offsets {body} (answered to the processor)
    log-<i> -> fetch     bounds {parts: [PartitionBounds], closed, host} (one-way after appends;
                         a request when partitions open or close)
    fetch -> log-<i>     get_bounds (answered {parts: [PartitionBounds], host});
                         replica_progress {parts: [ReplicaProgress]} (one-way)
    controller -> fetch  throttle {rate, parts: [ThrottledReplica]}
    txn_coordinator -> log-<i>
                         write_markers {markers: [TxnMarker]}, txn_check {parts: [TxnCheck],
                         wait_ms} (both answered {parts: [PartOutcome]}); txn_added {parts:
                         [TxnAdded]} (one-way, chained)

``chain_sent``: a produce or write_markers may carry ``then: [Chained]``, messages the log
actor sends for its sender once every partition was written.
"""
from __future__ import annotations

import os
import zlib
from typing import NamedTuple

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


# ---- message parts -------------------------------------------------------------------------
class ProducePart(NamedTuple):
    """One partition of a produce: ``frame`` indexes the message's frames (its record batch)."""

    topic: str
    partition: int
    frame: int


class PartError(NamedTuple):
    """A partition the handler refused before any log actor saw it."""

    topic: str
    partition: int
    code: int
    message: str


class DeleteRecordsPart(NamedTuple):
    topic: str
    partition: int
    offset: int


class EpochQuery(NamedTuple):
    """OffsetForLeaderEpoch of one partition: where ``leader_epoch`` ended."""

    topic: str
    partition: int
    current_leader_epoch: int
    leader_epoch: int


class LogBounds(NamedTuple):
    """What the writer tells readers: offsets and the trusted extent of the active segment."""

    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    active_base_offset: int
    active_size: int
    generation: int  # changes whenever the set of segment files changes


class PartitionBounds(NamedTuple):
    """A partition as its log actor last saw it: its ``LogBounds`` (fields 2 to 7), the leader
    epoch, whether this broker leads it, its replica set, its last stable offset, and (leading)
    the log end its leader epoch began at, which the high watermark must reach before "latest"
    is answered (``log.log_actor.PartitionLog.high_watermark_floor``)."""

    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    active_base_offset: int
    active_size: int
    generation: int
    leader_epoch: int
    leader: bool
    replicas: list = ()
    last_stable_offset: int | None = None  # None: the high watermark
    high_watermark_floor: int = -1  # -1: following, or nothing to wait for

    @property
    def bounds(self) -> LogBounds:
        return LogBounds(*self[2:8])


class ReplicaProgress(NamedTuple):
    """A follower (``replica``, its broker id) fetched from ``offset``: its log end, of which
    ``fsynced`` is on its disk (left out when the fetch did not say: the whole log end)."""

    topic: str
    partition: int
    replica: int
    offset: int
    fsynced: int | None = None


class ThrottledReplica(NamedTuple):
    topic: str
    partition: int
    replica: int


# The transaction coordinator's parts (docs/TRANSACTIONS.md, "The commit path"): not on the
# per-record path, so a receiver rebuilds each entry with ``T._make`` (which refuses a wrong
# number of fields) and reads it by name.
class TxnMarker(NamedTuple):
    """A commit or abort marker for one partition: ``write_markers {markers: [TxnMarker]}``
    (coordinator -> log actor) and WRITE_TXN_MARKERS' ``markers`` (broker -> broker)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int


class TxnAdded(NamedTuple):
    """The coordinator stored ``topic-partition`` in the producer's open transaction:
    ``txn_added {parts: [TxnAdded]}`` (one-way, coordinator -> log actor, chained)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int


class TxnCheck(NamedTuple):
    """Are the producer's batches through ``last_seq`` written and replicated here, in its
    open transaction? ``txn_check {parts: [TxnCheck], wait_ms}`` (coordinator -> log actor)."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    last_seq: int


class PartOutcome(NamedTuple):
    """A log actor's answer for one partition of ``write_markers`` or ``txn_check``
    (``{parts: [PartOutcome]}``): ``code`` 0 and ``message`` "" when it was done."""

    topic: str
    partition: int
    code: int
    message: str


class Chained(NamedTuple):
    """A message a log actor sends on its requester's behalf (``reply_to``: the requester)
    once the produce or write_markers carrying it (``then: [Chained]``) is written
    (``chain_sent``): ``corr`` is the requester's correlation id for the answer it expects,
    or of its own requester's request when ``type`` is the runtime's reply
    (``Actor.answer_chained``)."""

    to: str
    type: str
    fields: dict
    corr: int


def chain_sent(answer: dict) -> bool:
    """Whether a log actor's answer to a produce or write_markers carrying ``then`` means it
    sent those chained messages: every partition written (a write_markers answer is ``{parts:
    [PartOutcome]}``, at least one; a produce's, Kafka's ``{body}``)."""
    try:
        if "parts" in answer:
            return bool(answer["parts"]) and all(PartOutcome._make(part).code == 0 for part in answer["parts"])
        return all(part["error_code"] == 0 for topic in answer["body"]["topics"] for part in topic["partitions"])
    except (KeyError, TypeError, IndexError):
        return False
