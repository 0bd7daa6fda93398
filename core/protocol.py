"""Protocol constants: API keys and error codes. Pure, importable everywhere.

The closed sets of names and numbers (docs/PROTOCOL.md), Kafka's where the meaning is the same,
and the one parser of listener addresses (``PLAINTEXT://host:port``) the config, acceptor and
handlers share. Invariant: imports nothing of the project.
"""
from __future__ import annotations

import enum
import re
from urllib.parse import urlsplit


class ApiKey(enum.IntEnum):
    """Request types a client may send. Kafka's numbers; Odradek-only APIs start at 1000."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    LEADER_AND_ISR = 4
    STOP_REPLICA = 5
    UPDATE_METADATA = 6
    CONTROLLED_SHUTDOWN = 7
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    WRITE_TXN_MARKERS = 27
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    DESCRIBE_LOG_DIRS = 35
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    OFFSET_DELETE = 47
    ELECT_LEADERS = 43
    INCREMENTAL_ALTER_CONFIGS = 44
    ALTER_PARTITION_REASSIGNMENTS = 45
    LIST_PARTITION_REASSIGNMENTS = 46
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    # Odradek-only: a no-op round trip through the whole chain (processor, handler), used
    # by `odradek perf ping` to measure the request path itself.
    PING = 1000
    # Odradek-only: an inter-broker connection proves it is a broker of this cluster (an HMAC,
    # keyed from the cluster's shared secret, over a nonce the processor chose); answered by
    # the processor, never a handler (docs/SECURITY.md, "Inter-broker requests").
    BROKER_PROOF = 1001


# The APIs handlers pass on to the transaction and the group coordinator (each answers the
# processor itself); network/processor.py fails those in flight when that coordinator dies.
TXN_APIS = (ApiKey.INIT_PRODUCER_ID, ApiKey.ADD_PARTITIONS_TO_TXN, ApiKey.ADD_OFFSETS_TO_TXN, ApiKey.END_TXN,
            ApiKey.TXN_OFFSET_COMMIT, ApiKey.WRITE_TXN_MARKERS, ApiKey.LIST_TRANSACTIONS,
            ApiKey.DESCRIBE_TRANSACTIONS, ApiKey.DESCRIBE_PRODUCERS)
GROUP_APIS = (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.FIND_COORDINATOR,
              ApiKey.LIST_GROUPS, ApiKey.DESCRIBE_GROUPS, ApiKey.CONSUMER_GROUP_DESCRIBE, ApiKey.DELETE_GROUPS,
              ApiKey.LEAVE_GROUP, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.OFFSET_DELETE)
FETCH_ACTOR_APIS = (ApiKey.FETCH, ApiKey.LIST_OFFSETS)  # ... and to the fetch actor

# Internal topics: the broker's own state, written only by the coordinators that own them
# (through their log actors, never through a handler). Handlers refuse every client write,
# delete and alter of them (INVALID_TOPIC_EXCEPTION, as Kafka does); this is the one place
# that names them.
OFFSETS_TOPIC = "__consumer_offsets"  # the group coordinator's groups and committed offsets
TXN_STATE_TOPIC = "__transaction_state"  # the transaction coordinator's transactions
SCHEMAS_TOPIC = "_schemas"  # the schema registry's subjects, versions and settings (Confluent's name)
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TXN_STATE_TOPIC, SCHEMAS_TOPIC})


def is_internal_topic(name) -> bool:
    """True for a topic only the broker may write, delete or alter."""
    return isinstance(name, str) and name in INTERNAL_TOPICS


class ErrorCode(enum.IntEnum):
    """The closed set of errors. Each member carries a one-line meaning and whether a client
    may retry the same request (``retriable``). Kafka's numbers and meanings."""

    def __new__(cls, value: int, retriable: bool, meaning: str):
        obj = int.__new__(cls, value)
        obj._value_ = value
        obj.retriable = retriable
        obj.meaning = meaning
        return obj

    UNKNOWN_SERVER_ERROR = (-1, False, "The server experienced an unexpected error when processing the request.")
    NONE = (0, False, "No error.")
    OFFSET_OUT_OF_RANGE = (1, False, "The requested offset is not within the range of offsets maintained by the server.")
    CORRUPT_MESSAGE = (2, True, "The record batch failed its CRC check, has an invalid size or fields, or is otherwise corrupt.")
    UNKNOWN_TOPIC_OR_PARTITION = (3, True, "This server does not host this topic-partition.")
    INVALID_FETCH_SIZE = (4, False, "The requested fetch size is invalid.")
    LEADER_NOT_AVAILABLE = (5, True, "There is no leader for this topic-partition as we are in the middle of a leadership election.")
    NOT_LEADER_OR_FOLLOWER = (6, True, "This broker is not the leader (or not a replica) of the topic-partition.")
    REQUEST_TIMED_OUT = (7, True, "The request timed out.")
    BROKER_NOT_AVAILABLE = (8, False, "The broker is not available.")
    REPLICA_NOT_AVAILABLE = (9, True, "The replica is not available for the requested topic-partition.")
    MESSAGE_TOO_LARGE = (10, False, "The request included a record batch larger than the max message size the server will accept.")
    STALE_CONTROLLER_EPOCH = (11, False, "The controller moved to another broker.")
    OFFSET_METADATA_TOO_LARGE = (12, False, "The metadata field of the offset request was too large.")
    NETWORK_EXCEPTION = (13, True, "The server disconnected before a response was received.")
    COORDINATOR_LOAD_IN_PROGRESS = (14, True, "The coordinator is loading and hence can't process requests.")
    COORDINATOR_NOT_AVAILABLE = (15, True, "The coordinator is not available.")
    NOT_COORDINATOR = (16, True, "This is not the correct coordinator.")
    INVALID_TOPIC_EXCEPTION = (17, False, "The request attempted to perform an operation on an invalid topic.")
    RECORD_LIST_TOO_LARGE = (18, False, "The request included a batch list larger than the configured segment size.")
    NOT_ENOUGH_REPLICAS = (19, True, "Messages are rejected since there are fewer in-sync replicas than required.")
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = (20, True, "Messages are written to the log, but to fewer in-sync replicas than required.")
    INVALID_REQUIRED_ACKS = (21, False, "Produce request specified an invalid value for required acks (must be 0, 1 or -1/all).")
    ILLEGAL_GENERATION = (22, False, "Specified group generation id is not valid.")
    INCONSISTENT_GROUP_PROTOCOL = (23, False, "The group member's supported protocols are incompatible with those of existing members or first group member tried to join with empty protocol type or empty protocol list.")
    INVALID_GROUP_ID = (24, False, "The configured groupId is invalid.")
    UNKNOWN_MEMBER_ID = (25, False, "The coordinator is not aware of this member.")
    INVALID_SESSION_TIMEOUT = (26, False, "The session timeout is not within the range allowed by the broker.")
    REBALANCE_IN_PROGRESS = (27, False, "The group is rebalancing, so a rejoin is needed.")
    INVALID_COMMIT_OFFSET_SIZE = (28, False, "The committing offset data size is not valid.")
    TOPIC_AUTHORIZATION_FAILED = (29, False, "Topic authorization failed.")
    GROUP_AUTHORIZATION_FAILED = (30, False, "Group authorization failed.")
    CLUSTER_AUTHORIZATION_FAILED = (31, False, "Cluster authorization failed.")
    INVALID_TIMESTAMP = (32, False, "The timestamp of the message is out of acceptable range.")
    UNSUPPORTED_SASL_MECHANISM = (33, False, "The broker does not support the requested SASL mechanism.")
    ILLEGAL_SASL_STATE = (34, False, "Request is not valid given the current SASL state.")
    UNSUPPORTED_VERSION = (35, False, "The version of API is not supported.")
    TOPIC_ALREADY_EXISTS = (36, False, "Topic with this name already exists.")
    INVALID_PARTITIONS = (37, False, "Number of partitions is below 1.")
    INVALID_REPLICATION_FACTOR = (38, False, "Replication factor is below 1 or larger than the number of available brokers.")
    INVALID_REPLICA_ASSIGNMENT = (39, False, "Replica assignment is invalid.")
    INVALID_CONFIG = (40, False, "Configuration is invalid.")
    NOT_CONTROLLER = (41, True, "This is not the correct controller for this cluster.")
    INVALID_REQUEST = (42, False, "This most likely occurs because of a request being malformed by the client library or the message was sent to an incompatible broker.")
    POLICY_VIOLATION = (44, False, "Request parameters do not satisfy the configured policy.")
    OUT_OF_ORDER_SEQUENCE_NUMBER = (45, False, "The broker received an out of order sequence number.")
    DUPLICATE_SEQUENCE_NUMBER = (46, False, "The broker received a duplicate sequence number.")
    INVALID_PRODUCER_EPOCH = (47, False, "Producer attempted to produce with an old epoch.")
    INVALID_TXN_STATE = (48, False, "The producer attempted a transactional operation in an invalid state.")
    INVALID_PRODUCER_ID_MAPPING = (49, False, "The producer attempted to use a producer id which is not currently assigned to its transactional id.")
    INVALID_TRANSACTION_TIMEOUT = (50, False, "The transaction timeout is larger than the maximum value allowed by the broker (as configured by transaction.max.timeout.ms).")
    CONCURRENT_TRANSACTIONS = (51, True, "The producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing.")
    TRANSACTION_COORDINATOR_FENCED = (52, False, "Indicates that the transaction coordinator sending a WriteTxnMarker is no longer the current coordinator for a given producer.")
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = (53, False, "Transactional Id authorization failed.")
    SECURITY_DISABLED = (54, False, "Security features are disabled.")
    OPERATION_NOT_ATTEMPTED = (55, False, "The broker did not attempt to execute this operation. This may happen for batched RPCs where some operations in the batch failed, causing the broker to respond without trying the rest.")
    KAFKA_STORAGE_ERROR = (56, True, "Disk error when trying to access log file on the disk.")
    LOG_DIR_NOT_FOUND = (57, False, "The user-specified log directory is not found in the broker config.")
    SASL_AUTHENTICATION_FAILED = (58, False, "SASL Authentication failed.")
    UNKNOWN_PRODUCER_ID = (59, False, "The broker could not locate the producer metadata associated with the producer id.")
    NON_EMPTY_GROUP = (68, False, "The group is not empty.")
    GROUP_ID_NOT_FOUND = (69, False, "The group id does not exist.")
    FENCED_LEADER_EPOCH = (74, True, "The leader epoch in the request is older than the epoch on the broker.")
    UNKNOWN_LEADER_EPOCH = (75, True, "The leader epoch in the request is newer than the epoch on the broker.")
    UNSUPPORTED_COMPRESSION_TYPE = (76, False, "The requesting client does not support the compression type of given partition.")
    STALE_BROKER_EPOCH = (77, False, "Broker epoch has changed.")
    OFFSET_NOT_AVAILABLE = (78, True, "The leader high watermark has not caught up from a recent leader election so the offsets cannot be guaranteed to be monotonically increasing.")
    MEMBER_ID_REQUIRED = (79, False, "The group member needs to have a valid member id before actually entering a consumer group.")
    PREFERRED_LEADER_NOT_AVAILABLE = (80, True, "The preferred leader was not available.")
    GROUP_MAX_SIZE_REACHED = (81, False, "The consumer group has reached its max size.")
    FENCED_INSTANCE_ID = (82, False, "The broker rejected this static consumer since another consumer with the same group.instance.id has registered with a different member.id.")
    ELIGIBLE_LEADERS_NOT_AVAILABLE = (83, False, "Eligible topic partition leaders are not available.")
    ELECTION_NOT_NEEDED = (84, False, "Leader election not needed for topic partition.")
    NO_REASSIGNMENT_IN_PROGRESS = (85, False, "No partition reassignment is in progress.")
    GROUP_SUBSCRIBED_TO_TOPIC = (86, False, "The consumer group is actively subscribed to the topic")
    INVALID_RECORD = (87, False, "This record has failed the validation on broker and hence will be rejected.")
    THROTTLING_QUOTA_EXCEEDED = (89, True, "There is a throttling quota violation.")
    PRODUCER_FENCED = (90, False, "There is a newer producer with the same transactionalId which fences the current one.")
    RESOURCE_NOT_FOUND = (91, False, "A request illegally referred to a resource that does not exist.")
    DUPLICATE_RESOURCE = (92, False, "A request illegally referred to the same resource twice.")
    UNACCEPTABLE_CREDENTIAL = (93, False, "Requested credential would not meet criteria for acceptability.")
    INVALID_UPDATE_VERSION = (95, False, "The given update version was invalid.")
    UNKNOWN_TOPIC_ID = (100, True, "This server does not host this topic ID.")
    TRANSACTIONAL_ID_NOT_FOUND = (105, False, "The transactionalId could not be found.")
    FENCED_MEMBER_EPOCH = (110, False, "The member epoch is fenced by the group coordinator. The member must abandon all its partitions and rejoin.")
    UNRELEASED_INSTANCE_ID = (111, False, "The instance ID is still used by another member in the consumer group.")
    UNSUPPORTED_ASSIGNOR = (112, False, "The assignor or its version range is not supported by the consumer group.")
    STALE_MEMBER_EPOCH = (113, False, "The member epoch is stale. The member must retry after receiving its updated member epoch via the ConsumerGroupHeartbeat API.")

    @classmethod
    def of(cls, value: int) -> "ErrorCode":
        """The member for a number; an unknown number maps to UNKNOWN_SERVER_ERROR."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN_SERVER_ERROR


class OdradekError(Exception):
    """An error with a protocol code and a message a person can act on.

    Raised in the process where it happens and turned into ``(code, message)`` at every
    process boundary: exceptions never cross one.
    """

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str = "", code: ErrorCode | None = None):
        if code is not None:
            self.code = ErrorCode(code)
        super().__init__(message or self.code.meaning)

    @property
    def message(self) -> str:
        return self.args[0] if self.args else self.code.meaning

    @property
    def retriable(self) -> bool:
        return self.code.retriable

    def __str__(self) -> str:
        return f"[{self.code.name}] {self.message}"


def http_address(value: str | None, listeners: str) -> tuple[str, int] | None:
    """An HTTP listener setting (``admin.listener``, ``schema.registry.listener``) as (host,
    port); None when empty (off). ``HOST:+N`` is the first Kafka listener's port (of
    ``listeners``) plus N (0 stays 0: an ephemeral port, as in tests; so does a sum over 65535)."""
    value = (value or "").strip()
    if not value:
        return None
    host, _, port = value.rpartition(":")
    if port.startswith("+"):
        kafka_port = parse_listener(listeners)[1]
        port = kafka_port + int(port[1:]) if kafka_port else 0
        return host, (port if port <= 65535 else 0)
    return host, int(port)


def parse_listener(value: str) -> tuple[str, int]:
    """``PLAINTEXT://127.0.0.1:9092`` (or ``host:port``) -> ``("127.0.0.1", 9092)``: the first
    listener's address (every listener, with its security protocol: network/listeners.py)."""
    first = value.split(",")[0].strip()
    if "://" not in first:
        first = "PLAINTEXT://" + first
    parts = urlsplit("tcp://" + first.partition("://")[2])  # a URL scheme may not hold '_' (SASL_SSL)
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{value!r} has no valid port") from None
    if not parts.hostname or port is None:
        raise ValueError(f"{value!r} is not of the form NAME://host:port")
    return parts.hostname, port


# Topic names, as Kafka allows them: checked where topics are created (the controller) and
# where a Metadata request would create one (the handler answers INVALID_TOPIC_EXCEPTION).
LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")  # always fullmatch: "$" would let "abc\n" through
MAX_TOPIC_NAME_LENGTH = 249


def check_topic_name(name) -> None:
    """Raise INVALID_TOPIC_EXCEPTION with the reason, or return."""
    if not isinstance(name, str) or not name:
        raise OdradekError("topic name must be a non-empty string", ErrorCode.INVALID_TOPIC_EXCEPTION)
    if name in (".", ".."):
        raise OdradekError(f"topic name cannot be '{name}'", ErrorCode.INVALID_TOPIC_EXCEPTION)
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise OdradekError(f"topic name is {len(name)} characters; the limit is {MAX_TOPIC_NAME_LENGTH}",
                           ErrorCode.INVALID_TOPIC_EXCEPTION)
    if not LEGAL_TOPIC_NAME.fullmatch(name):
        bad = sorted({c for c in name if not LEGAL_TOPIC_NAME.fullmatch(c)})
        raise OdradekError(f"topic name '{name}' contains {''.join(bad)!r}: only ASCII letters, digits, "
                           f"'.', '_' and '-' are allowed", ErrorCode.INVALID_TOPIC_EXCEPTION)
