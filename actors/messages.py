"""Every message actors send each other, declared once: its type, its body's fields, the body
of its answer.

Pure (standard library only), layer 2. A body is a NamedTuple registered under its message type
by ``@message("type", reply=Answer)``; on the wire it is a msgpack array of its fields in order
(``actors.message``), and the receiver's runtime rebuilds the same class from the array
(refusing a wrong number of fields, as ``Body._make`` would), so a handler reads ``msg.fields.acks``
by name. The answer's class is known to the requester's runtime from the type it asked, and
``_error`` answers are ``ErrorReply``. Parts inside a body (``ProducePart``, ``TxnMarker``) are
NamedTuples too: they arrive as lists of the same fields; the per-record path unpacks them
(``for topic, partition, frame in body.parts``) and other receivers rebuild them with
``T._make``. Senders on the produce/fetch path may build a body with ``tuple.__new__(T, ...)``
(no Python frame).

Types starting with ``_`` belong to the runtime (``actors.runtime``). A test's own actor declares
its test-only messages the same way, in its own module.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

BODIES: dict[str, type] = {}  # message type -> its body's class
REPLIES: dict[str, type] = {}  # request type -> its answer's body class (absent: no fields)


def message(type_: str, reply: type | None = None) -> Callable[[type], type]:
    """Register a body class as message ``type_`` (``cls.TYPE``), answered by ``reply``."""
    def register(cls: type) -> type:
        known = BODIES.setdefault(type_, cls)
        if known is not cls and (known.__qualname__, known._fields) != (cls.__qualname__, cls._fields):
            # (the same class twice is a module run as __main__ and imported too: the last one wins)
            raise ValueError(f"message type {type_!r} declared twice: {known.__qualname__}, {cls.__qualname__}")
        BODIES[type_] = cls
        cls.TYPE = type_
        if reply is not None:
            REPLIES[type_] = reply
        return cls
    return register


# ---- the runtime's own (actors.runtime, actors.supervisor) -----------------------------------
class ErrorReply(NamedTuple):
    """``_error``: a request failed; ``code`` is ``core.protocol.ErrorCode``. ``detail``: what a
    requester that asked may act on (an ISR change refused: the state the node holds)."""

    code: int
    message: str
    detail: Any = None


message("_error")(ErrorReply)


class Name(NamedTuple):
    """An answer that only says who answered (``_stop``, ``_members``, ``_retire``)."""

    name: str


class Done(NamedTuple):
    """An answer with nothing to say but that it is done."""


class Pong(NamedTuple):
    name: str
    pid: int


class Heartbeat(NamedTuple):
    """Once a second to the supervisor, and the answer to ``_stats``: the runtime's counters
    and the actor's own (``Actor.stats``: ``backlog``, ...)."""

    name: str
    pid: int
    processed: int
    open: int
    waiting: int
    progress: str
    stats: dict


class ActorMetrics(NamedTuple):
    """The answer to ``_metrics``: ``Metrics.snapshot()`` and ``Actor.metric_gauges()``."""

    name: str
    snapshot: dict
    gauges: list


@message("_stop", reply=Name)
class Stop(NamedTuple):
    """From the supervisor (or a test): stop; every request still open gets NETWORK_EXCEPTION."""


@message("_drain", reply=Done)
class Drain(NamedTuple):
    """From the supervisor before it stops the tree: finish what needs the others running."""


@message("_ping", reply=Pong)
class Ping(NamedTuple):
    """Are you there (tests, start-up waits)."""


@message("_stats", reply=Heartbeat)
class Stats(NamedTuple):
    """Your counters now, as the next heartbeat would carry them (tests, tools)."""


@message("_metrics", reply=ActorMetrics)
class ScrapeMetrics(NamedTuple):
    """From the metrics actor at scrape time: your counters, histograms and gauges."""


@message("_members", reply=Name)
class Members(NamedTuple):
    """The running members of a role; ``retired``: those leaving the pool on purpose."""

    role: str
    members: list
    retired: list = []


@message("_retire", reply=Name)
class Retire(NamedTuple):
    """Leave the pool once each sender in ``fences`` sent its ``_fence`` (``timeout`` s at most)."""

    fences: list
    timeout: float = 10.0


@message("_fence")
class Fence(NamedTuple):
    """One-way: ``sender``'s last message to an actor leaving its pool."""

    sender: str


message("_heartbeat")(Heartbeat)


@message("_ready")
class Ready(NamedTuple):
    """One-way to the supervisor once ``on_start`` returned; ``info``: ``Actor.ready_fields``."""

    name: str
    pid: int
    info: dict


@message("_start_failed")
class StartFailed(NamedTuple):
    """One-way to the supervisor when ``on_start`` raised: ``error`` is what the operator reads."""

    name: str
    pid: int
    error: str


# ---- the supervisor's control endpoint (odradek status, the handler pool's scaling) -----------
class BrokerStatus(NamedTuple):
    """The actor tree: the supervisor's facts and a row per running actor (``odradek status``)."""

    supervisor: dict
    actors: list


@message("status", reply=BrokerStatus)
class Status(NamedTuple):
    """To the supervisor: the actor tree (``odradek status``, the handler, the console)."""


class Pid(NamedTuple):
    pid: int


@message("shutdown", reply=Pid)
class Shutdown(NamedTuple):
    """Stop the broker; ``fatal``: why an actor cannot go on (exit code 1), None if asked to."""

    fatal: str | None = None


class Scaled(NamedTuple):
    role: str
    count: int
    added: list = []
    removed: list = []


@message("scale", reply=Scaled)
class Scale(NamedTuple):
    """Resize a scalable pool (the handlers) to ``count`` members."""

    role: str
    count: int


# ---- the request path: processors, handlers, log actors, the fetch actor, the acceptor ----------
class Response(NamedTuple):
    """The answer to a client's ``request``, sent to its processor by whichever actor served it (a
    handler, or the actor it forwarded the request to: a log actor, the fetch actor, a coordinator,
    the controller): Kafka's response ``body``, the payload frames beside it, ``files`` regions
    ``[path, position, length]`` the processor sends after the frames (``os.sendfile``), and
    ``remote_ms`` how long a purgatory held it (the processor's remote-time histogram)."""

    body: dict
    files: list = []
    remote_ms: float = 0.0


@message("request", reply=Response)
class Request(NamedTuple):
    """A client's request, from the processor to the handler its connection is pinned to (the Kafka
    request's payload as frames): its API key and version, client id, connection id and peer, the
    decoded ``body``, when the processor sent it (``t``), who the connection authenticated as, its
    listener and, for a connection that proved it is a broker, that broker's id."""

    api: int
    v: int
    client: str | None
    conn: int
    peer: str
    body: dict
    t: float
    principal: str | None
    listener: str
    broker: int | None


@message("produce", reply=Response)
class Produce(NamedTuple):
    """Append batches (``parts``: [ProducePart], indexing the frames): from a handler (forwarded,
    so the log actor answers the processor, or gathered by the handler), a coordinator or the
    schema registry for its internal topic (acks 0: one-way). ``errors``: [PartError] the handler
    refused, answered with the rest; ``txn_unverified``: docs/TRANSACTIONS.md; ``then``:
    [Chained] sent once every partition is written (``chain_sent``)."""

    acks: int
    parts: list
    timeout_ms: int = 30000
    errors: list = []
    txn_unverified: bool = False
    then: list = []


@message("fetch", reply=Response)
class Fetch(NamedTuple):
    """A Fetch (Kafka's internal ``body``), from a handler to the fetch actor."""

    body: dict


@message("list_offsets", reply=Response)
class ListOffsets(NamedTuple):
    """A ListOffsets, from a handler (forwarded) or the group coordinator (``readable``: "latest"
    is the highest offset a consumer may have read) to the fetch actor."""

    body: dict
    readable: bool = False


@message("bounds", reply=Done)
class Bounds(NamedTuple):
    """A log actor (``host``) to the fetch actor, one-way after appends (a request when partitions
    open or close): ``parts`` [PartitionBounds] changed, ``closed`` [[topic, partition]], and
    once at start the partitions still ``opening``. Also the answer to ``get_bounds``."""

    parts: list
    closed: list
    host: str
    opening: list = []


@message("get_bounds", reply=Bounds)
class GetBounds(NamedTuple):
    """Every open partition's bounds from a log actor (``only``: these [[topic, partition]]):
    from the fetch actor when it (re)starts, the coordinators and the schema registry."""

    only: list | None = None


@message("replica_progress")
class FollowersFetched(NamedTuple):
    """One-way, the fetch actor to a leader's log actor: followers fetched (``parts``:
    [ReplicaProgress])."""

    parts: list


@message("delete_records", reply=Response)
class DeleteRecords(NamedTuple):
    """A handler to a log actor: ``parts`` [DeleteRecordsPart] it hosts."""

    parts: list


@message("offset_for_leader_epoch", reply=Response)
class OffsetForLeaderEpoch(NamedTuple):
    """A handler to a log actor: ``parts`` [EpochQuery] it hosts."""

    parts: list


class ProducerState(NamedTuple):
    """A producer id's state in a partition (a row of ``PartitionProducers.producers``)."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_start_offset: int


class PartitionProducers(NamedTuple):
    """One partition of a ``describe_producers`` answer: ``code`` 0, or why it has no rows."""

    topic: str | None
    partition: int | None
    code: int
    message: str
    producers: list  # [ProducerState]


class Producers(NamedTuple):
    parts: list  # [PartitionProducers]


@message("describe_producers", reply=Producers)
class DescribeProducers(NamedTuple):
    """The transaction coordinator to a log actor: the producers of ``parts`` [[topic, partition]]."""

    parts: list


class LogDirParts(NamedTuple):
    """The answer to ``describe_log_dirs``: ``parts`` [[topic, partition, size, offset lag]]."""

    parts: list


@message("describe_log_dirs", reply=LogDirParts)
class DescribeLogDirs(NamedTuple):
    """A handler to every log actor: its partitions of ``topics`` [[topic, [partition]]] (None: all)."""

    topics: list | None = None


@message("watch", reply=Done)
class Watch(NamedTuple):
    """The fetch actor to a log actor: tell me ``parts``' [[topic, partition]] appends (``bounds``)
    for ``seconds`` (a lease); one-way to renew one, a request to wait for the bounds."""

    parts: list
    seconds: float


class ProcessorConnections(NamedTuple):
    """A processor's open connections, per client IP and per listener."""

    processor: str
    ips: dict
    listeners: dict


@message("connections", reply=ProcessorConnections)
class Connections(NamedTuple):
    """The acceptor to a processor after its (the acceptor's) restart or a new processor."""


class Shed(NamedTuple):
    closed: bool


@message("shed_idle", reply=Shed)
class ShedIdle(NamedTuple):
    """The acceptor at ``max.connections`` to a processor: close your least recently used idle
    connection (answered after its ``conn_closed``)."""


class Balances(NamedTuple):
    """The broker-wide quota buckets' balances (network/quotas.py ``Ledger.charge``)."""

    balances: list


@message("quota_usage", reply=Balances)
class QuotaUsage(NamedTuple):
    """A processor to the acceptor: its quota usage since its last report."""

    entries: list


@message("conn_closed")
class ConnClosed(NamedTuple):
    """One-way, a processor to the acceptor: a connection from ``ip`` on ``listener`` closed."""

    processor: str
    ip: str
    listener: str


# ---- the controller, the broker agent and replication --------------------------------------
class MetadataVersion(NamedTuple):
    """A handler's answer to ``metadata``: the version it holds now."""

    version: int


@message("metadata", reply=MetadataVersion)
class Metadata(NamedTuple):
    """The controller's topic metadata, pushed to every handler (a request) and the group
    coordinator (one-way) whenever it changes; also the answer to ``get_metadata``.
    ``snapshot``: ``{version, topics, brokers, controller_id, defaults, ...}`` (docs/REPLICATION.md)."""

    snapshot: dict


@message("get_metadata", reply=Metadata)
class GetMetadata(NamedTuple):
    """From a handler, a coordinator or the schema registry (at start, or to catch up)."""


class Assignment(NamedTuple):
    """The partitions a log actor hosts: ``open``, their entries (``{topic, partition, topic_id,
    config?}``; in a cluster the last LEADER_AND_ISR entry, with ``role``), and single-broker
    ``configs``, each topic's configuration once."""

    open: list
    configs: dict = {}


@message("get_assignment", reply=Assignment)
class GetAssignment(NamedTuple):
    """From a log actor as it starts: what ``host`` (its name) hosts."""

    host: str


class BrokerEpochs(NamedTuple):
    """``epochs``: ``{broker id as text: czxid of its /brokers/ids registration}``, the live brokers'."""

    epochs: dict


message("broker_epochs", reply=Done)(BrokerEpochs)  # pushed by the broker agent to the fetchers


@message("get_broker_epochs", reply=BrokerEpochs)
class GetBrokerEpochs(NamedTuple):
    """From the fetch actor, the replica fetcher and the transaction markers' sender."""


@message("create_topics", reply=Response)
class CreateTopics(NamedTuple):
    """CreateTopics' ``body`` to the controller: forwarded by a handler (answered to the client's
    processor), or asked by a handler (auto-creation), a coordinator or the schema registry."""

    body: dict


@message("delete_topics", reply=Response)
class DeleteTopics(NamedTuple):
    """DeleteTopics' ``body`` (``{topics}``), from a handler to the controller."""

    body: dict


@message("alter_topic_configs", reply=Response)
class AlterTopicConfigs(NamedTuple):
    """IncrementalAlterConfigs' topic resources (``{resources, validate_only}``), from a handler."""

    body: dict


@message("broker_request", reply=Response)
class BrokerRequest(NamedTuple):
    """A controller API (LEADER_AND_ISR, UPDATE_METADATA, STOP_REPLICA, CONTROLLED_SHUTDOWN,
    ELECT_LEADERS, CREATE_PARTITIONS, the reassignment APIs) forwarded by a handler."""

    api: int
    body: dict


class BrokerConfigs(NamedTuple):
    configs: dict  # {name: value as text}


@message("get_broker_configs", reply=BrokerConfigs)
class GetBrokerConfigs(NamedTuple):
    """From a handler (DescribeConfigs): the broker configs set at run time."""


@message("set_broker_configs", reply=Done)
class SetBrokerConfigs(NamedTuple):
    """From a handler (AlterConfigs on the broker): ``{name: value, or None to remove it}``."""

    configs: dict


@message("set_throttle_rates", reply=Done)
class SetThrottleRates(NamedTuple):
    """From a handler: the replication throttle rates, ``{name: bytes/s or None}``."""

    rates: dict


class IsrRecorded(NamedTuple):
    """``alter_isr`` written: the partition state node's new version."""

    zk_version: int


@message("alter_isr", reply=IsrRecorded)
class AlterIsr(NamedTuple):
    """From a leading log actor: record ``isr`` if the state node is still at ``zk_version``
    (refused with ``ErrorReply.detail`` ``{leader, leader_epoch, isr, zk_version}``, what it holds)."""

    topic: str
    partition: int
    leader_epoch: int
    isr: list
    zk_version: int = -1


@message("throttle", reply=Done)
class Throttle(NamedTuple):
    """From the broker agent: the throttled ``rate`` (bytes/s) and ``parts`` it applies to: to the
    fetch actor ``[ThrottledReplica]`` (leader side), to the replica fetcher ``[[topic,
    partition]]`` (follower side)."""

    rate: int
    parts: list


class Assigned(NamedTuple):
    """A log actor's answer to ``assign``: how many partitions it holds open, and the changes that
    ``failed``: ``[[topic, partition, error code, message]]``."""

    partitions: int
    failed: list = []


@message("assign", reply=Assigned)
class Assign(NamedTuple):
    """From the controller to a log actor: partitions to ``open``, ``close`` (``{topic, partition,
    topic_id, delete?}``) and ``configure`` (``{topic, partition, config}``)."""

    open: list = []
    close: list = []
    configure: list = []


class Became(NamedTuple):
    """A log actor's answer to ``become``: ``[[topic, partition, error code]]``."""

    parts: list


@message("become", reply=Became)
class Become(NamedTuple):
    """LEADER_AND_ISR's partition entries for one log actor (Kafka's, with ``role``): lead or follow."""

    parts: list


class FollowPart(NamedTuple):
    topic: str
    partition: int
    leader: int
    leader_epoch: int


@message("follow", reply=Done)
class Follow(NamedTuple):
    """From the broker agent to the replica fetcher: ``parts`` [FollowPart] to fetch from their
    leaders, whose addresses are ``brokers`` ``{id as text: [host, port]}``."""

    parts: list
    brokers: dict


@message("unfollow", reply=Done)
class Unfollow(NamedTuple):
    """From the broker agent: stop fetching ``parts`` ``[[topic, partition]]``."""

    parts: list


class FsyncedEnd(NamedTuple):
    topic: str
    partition: int
    offset: int  # the follower's log below it is on its disk


@message("fsynced")
class Fsynced(NamedTuple):
    """One-way, from a log actor to the replica fetcher: followed partitions' group commits
    ended (``parts`` [FsyncedEnd])."""

    parts: list


class FollowerStatePart(NamedTuple):
    topic: str
    partition: int
    code: int
    latest_epoch: int
    log_end_offset: int


class FollowerStates(NamedTuple):
    parts: list  # [FollowerStatePart]


@message("follower_state", reply=FollowerStates)
class FollowerState(NamedTuple):
    """From the replica fetcher before it truncates: each of ``parts`` ``[[topic, partition]]``'s
    latest leader epoch and log end."""

    parts: list


class ReplicaEnd(NamedTuple):
    """A follower's log after ``truncate``, ``truncate_fully`` or ``replicate``: its log end and
    how much of it is on its disk (``fsynced_offset``, what the fetcher tells the leader)."""

    topic: str
    partition: int
    code: int
    log_end_offset: int
    fsynced_offset: int


class ReplicaEnds(NamedTuple):
    parts: list  # [ReplicaEnd]


class TruncatePart(NamedTuple):
    """KIP-279: the leader said ``leader_epoch`` ended at ``end_offset`` (-1, -1: it was not asked)."""

    topic: str
    partition: int
    leader_epoch: int
    end_offset: int


@message("truncate", reply=ReplicaEnds)
class Truncate(NamedTuple):
    """From the replica fetcher: cut each partition's log where its leader's epoch ended."""

    parts: list  # [TruncatePart]


class TruncateFullyPart(NamedTuple):
    """Start empty at ``offset``, the leader's log start (we are below it)."""

    topic: str
    partition: int
    offset: int


@message("truncate_fully", reply=ReplicaEnds)
class TruncateFully(NamedTuple):
    """From the replica fetcher: empty each partition's log and start it at the leader's log start."""

    parts: list  # [TruncateFullyPart]


class ReplicatePart(NamedTuple):
    """One partition of a FETCH answer for a follower's log actor: ``frame`` indexes the
    message's frames (its batches; -1: none, only watermarks), with the leader's epoch, high
    watermark and log start."""

    topic: str
    partition: int
    frame: int
    leader_epoch: int
    high_watermark: int
    log_start_offset: int


@message("replicate", reply=ReplicaEnds)
class Replicate(NamedTuple):
    """From the replica fetcher: append the leader's batches (frames) as a follower."""

    parts: list  # [ReplicatePart]


# ---- the group and transaction coordinators -------------------------------------------------
@message("group_request", reply=Response)
class GroupRequest(NamedTuple):
    """A client's group API request, from its handler to the group coordinator (which answers
    the client's processor, or the handler when it filters the answer: ACLs, listeners): the
    API key, the decoded ``body``, the client id and peer (a classic member's), and the
    handler's metadata version (a newer one makes the coordinator refresh its topics)."""

    api: int
    body: dict
    client: str | None = None
    peer: str | None = None
    metadata_version: int = -1


@message("txn_request", reply=Response)
class TxnRequest(NamedTuple):
    """A client's transaction API request (InitProducerId, the transaction and admin APIs), from
    its handler to the transaction coordinator, which answers the client's processor."""

    api: int
    body: dict


class OffsetsStored(NamedTuple):
    """The group coordinator's answer to ``txn_offsets_end``: 0, or why the offsets are not
    stored (the transaction coordinator retries)."""

    error_code: int
    message: str = ""


@message("txn_offsets_end", reply=OffsetsStored)
class TxnOffsetsEnd(NamedTuple):
    """A transaction ended, from the transaction coordinator to the group coordinator: on
    ``commit`` the ``offsets`` it carried (``{group: [[topic, partition, offset, leader_epoch,
    metadata]]}``, TxnOffsetCommit's) are stored as an OffsetCommit's."""

    producer_id: int
    offsets: dict
    commit: bool


class PartOutcomes(NamedTuple):
    """A log actor's answer to ``write_markers`` and ``txn_check``: a ``PartOutcome`` per
    partition asked."""

    parts: list


@message("write_markers", reply=PartOutcomes)
class WriteMarkers(NamedTuple):
    """Commit or abort markers (``[TxnMarker]``), from the transaction coordinator to the log
    actor leading their partitions; ``acks`` -1: answered once the ISR has them (within
    ``timeout_ms``). ``then``: ``[Chained]`` the log actor sends once every marker is written
    (the EndTxn's answer)."""

    markers: list
    acks: int = -1
    timeout_ms: int = 30000
    then: list = []


@message("txn_check", reply=PartOutcomes)
class TxnChecks(NamedTuple):
    """Before an EndTxn sent ahead of its produce answers commits, from the transaction
    coordinator to the partitions' log actors: is each ``TxnCheck`` written and replicated
    there? Answered within ``wait_ms``."""

    parts: list
    wait_ms: int


@message("txn_added")
class TxnPartsAdded(NamedTuple):
    """One-way, chained by the transaction coordinator to the record storing them: these
    partitions (``[TxnAdded]``) joined their producers' transactions; batches held for that
    word are appended."""

    parts: list


@message("create_state_topic")
class CreateStateTopic(NamedTuple):
    """One-way, from the group coordinator to the transaction coordinator: a FindCoordinator for
    a transactional id came before ``__transaction_state`` exists; create it."""


# ---- parts of messages (moved here from actors/names.py) --------------------------------------
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
    (``chain_sent``): ``fields`` its body (a message of this module: an array once it
    travelled), ``corr`` the requester's correlation id for the answer it expects, or of its
    own requester's request when ``type`` is the runtime's reply (``Actor.answer_chained``)."""

    to: str
    type: str
    fields: Any
    corr: int


def chain_sent(answer: Any) -> bool:
    """Whether a log actor's answer to a produce or write_markers carrying ``then`` means it
    sent those chained messages: every partition written (a write_markers answer is
    ``PartOutcomes``, at least one part; a produce's a ``Response``, Kafka's body)."""
    try:
        if type(answer) is PartOutcomes:
            return bool(answer.parts) and all(PartOutcome._make(part).code == 0 for part in answer.parts)
        return all(part["error_code"] == 0 for topic in answer.body["topics"] for part in topic["partitions"])
    except (KeyError, TypeError, IndexError, AttributeError):
        return False
