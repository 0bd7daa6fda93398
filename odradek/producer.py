"""Producer: batches records per partition and sends them from a background thread.

Threads: the caller's (``send``, ``flush``, ``close``; any number of caller threads may
share one producer) and one **sender thread** started by the constructor, which owns
every broker connection (a transactional producer has a third, below). Between them the record accumulator (``odradek/accumulator.py``,
Kafka's RecordAccumulator) holds the open and closed batches under its lock; whichever
thread closes a batch encodes it, and the sender thread (``_Sender``, handed the
accumulator, the metadata and its settings) alone writes requests, reads answers and
resolves futures.

    with Producer("127.0.0.1:9092", acks=1, linger_ms=5) as p:
        handle = p.send("orders", b"value", key=b"customer-42")
        print(handle.result(timeout=10))      # RecordMetadata(topic, partition, offset, timestamp)

Life of a record:
1. ``send`` appends the value alone (a record without headers or timestamp: no object per
   record; its key, if any, in the batch's list of keys) or a row ``(index, ts_delta, key,
   value, headers)`` to the open batch of its partition; ``pack_rows`` turns the lists into
   the record-batch format's msgpack at C speed. A key seen before finds its partition's
   open batch in one lookup (``_key_memo``: key -> the accumulator's slot of the partition).
   It returns a ``FutureRecordMetadata``, a two-slot handle
   (batch, index) over the batch's one ``concurrent.futures.Future``.
2. A batch closes when it reaches ``batch_size`` bytes (counted as key + value lengths plus
   a small per-record overhead), when it is ``linger_ms`` old, or on ``flush``.
3. The thread that closes a batch encodes it (msgpack + lz4 + CRC, ``log.records``
   layout). The sender groups closed batches by leader into PRODUCE requests of at most
   ``max_request_size`` bytes (several partitions, and several batches of a partition, per
   request) and pipelines up to ``max_in_flight`` requests per broker.
4. The answer resolves each batch's future with its base offset; a retriable error (or a
   lost connection) requeues the batch after ``retry_backoff_ms``, at most ``retries``
   times and never past ``delivery_timeout_ms``; a leader or topic error also refreshes
   metadata first. Other errors fail the batch's future with the broker's error class.

Partitioning: a record with a ``partition`` goes there; with a key, to
``(murmur2(key) & 0x7fffffff) % partitions``, Kafka's default partitioner (stable across
processes, runs and machines, and the partition a Kafka producer picks for the same key);
without either, to the topic's *sticky*
partition, a random one kept until its batch closes, so keyless records fill whole batches.

Ordering: records of a partition land in ``send`` order, through every retry. Up to
``max_in_flight`` requests are in flight per broker, but at most one per partition
(``max_in_flight_per_partition``; a request carries as many of the partition's closed
batches as fit in ``max_request_size``), so a request refused with a retriable error has no
later batch of its partition in flight to overtake it; a batch waiting for a retry holds
back the later batches of its partition, and a partition with a request in flight to one
broker sends nothing to another (its new leader) until it is answered. Unlike Kafka without
idempotence, ``max_in_flight`` > 1 does not reorder.

Idempotence (``enable_idempotence``, on by default as in Kafka's producer since 3.0): the
sender asks a broker for a producer id (InitProducerId) before its first request and stamps
each batch, when it is first sent, with the producer id, epoch and the partition's next
sequence number (header fields covered by the CRC: it is recomputed, no record is touched).
A retried batch keeps its stamp, so the partition's leader recognises a retry of a batch it
already appended (an answer lost, a connection cut, a leader that failed over) and answers
with the original offsets instead of appending it twice. A retried batch goes alone in its
request for its partition, first attempts may share one. OUT_OF_ORDER_SEQUENCE_NUMBER,
UNKNOWN_PRODUCER_ID (the partition forgot the producer) and INVALID_PRODUCER_ID_MAPPING
refuse a batch without writing it. If an earlier batch of the partition is unresolved, the
refused one is simply sent again after it. Otherwise the partition no longer follows the
producer's sequence and the producer bumps its epoch (KIP-360; a new producer id when the
epoch is exhausted or refused). Each partition moves to the new epoch once none of its
batches is in doubt (a batch in doubt is sent again with its own stamp: if it was written it
is recognised, not written twice); then its sequence restarts at 0 and its unwritten batches
are stamped anew. The refused partition sends nothing new until then; the others go on.
At most 32 batches of a partition are stamped from its oldest unresolved one on (the leader
recognises a retry among a producer's last 32). Kafka's constraints hold: idempotence needs acks=all, retries > 0 and
``max_in_flight`` <= 5; set explicitly with anything else it is an error, left at the
default (None) it is then simply off.

Transactions (``transactional_id``; docs/TRANSACTIONS.md): ``init_transactions`` gets the
transactional id's producer id and epoch from the coordinator (fencing older instances);
``send`` works only between ``begin_transaction`` and ``commit_transaction`` /
``abort_transaction``; when a partition's first batch of the transaction opens, a third
thread (the *adder*) adds the partition to the transaction (AddPartitionsToTxn; partitions
opened meanwhile go in one request) while the batch fills; the sender sends the partition's
batches once the coordinator stored it (Kafka's producer adds partitions at ``send`` as
well), or, when the partition's leader is the coordinator's broker, before the answer,
marked ``txn_unverified``: the leader appends them only once the coordinator told it the
partition is stored. Batches carry the transactional bit. The caller's thread sends
AddOffsetsToTxn/TxnOffsetCommit. A commit does not wait for the produce answers before it
ends the transaction: the sender writes EndTxn right behind the transaction's last batches,
naming each partition's last sequence not yet acknowledged (``expect``), and the
coordinator commits once those partitions' log actors confirm the batches are written and
replicated (one round trip less a transaction; docs/TRANSACTIONS.md). Where that cannot
be checked (a partition led by another broker than the coordinator) or is refused, the
commit falls back to Kafka's order: a flush, then EndTxn once no AddPartitionsToTxn is in
flight. An abort always takes that order. A fenced
producer (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH) is fatal: every later call raises
``ProducerFencedError``; a failed record makes ``commit_transaction`` raise
``TransactionAbortableError``. A transactional producer never bumps its epoch itself.

Timestamps: a record sent without ``timestamp_ms`` carries the time its batch was opened
(one clock read per batch instead of per record; at most ``linger_ms`` earlier than the
``send`` call while the sender keeps up). ``timestamp_ms`` sets it exactly.

``send`` blocks (up to ``max_block_ms``) only to learn a topic's partitions the first time
and when ``buffer_memory`` bytes are waiting to be sent (back-pressure).
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import struct
import threading
import time
import zlib
from operator import add
from typing import Optional

import cramjam
import msgpack

from odradek.accumulator import Batch, FutureRecordMetadata, RecordAccumulator
from odradek.log import kafka_batch
from odradek.log import records as fmt
from odradek.log.producer_state import last_sequence
from odradek.network.clientauth import ClientSecurity
from odradek.network.protocol import ApiKey, ErrorCode, OdradekError
from odradek.cluster import NETWORK_ERRORS, STALE_METADATA, Cluster, Connection
from odradek.errors import error_for
from odradek.group import TRANSACTION_KEY, Coordinator

log = logging.getLogger("odradek.producer")

IDLE_WAIT = 1.0  # seconds the sender sleeps with nothing to do (any change wakes it)
RECORD_OVERHEAD = 8  # bytes counted per record besides key and value (msgpack row framing)
_packb = msgpack.Packer(use_bin_type=True).pack
_HEADER_PACK = fmt.HEADER.pack_into
_CRC_PACK = struct.Struct(">I").pack_into
_STAMP_PACK = fmt.PRODUCER_FIELDS.pack_into  # producerId, producerEpoch, baseSequence
OFFSET_PRODUCER_ID = fmt.OFFSET_PRODUCER_ID  # then producerEpoch and baseSequence (docs/FORMAT.md)
MAX_EPOCH = 32767
# Refusals that wrote nothing and that a new producer epoch (or id) and sequence cure (KIP-360).
SEQUENCE_RESETS = (ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, ErrorCode.UNKNOWN_PRODUCER_ID,
                   ErrorCode.INVALID_PRODUCER_ID_MAPPING)
_crc32 = zlib.crc32

LEADER_ERRORS = STALE_METADATA  # retried after a metadata refresh (the leader may have moved)
KEY_MEMO = 65536  # keys per topic whose partition the producer remembers (then it starts over)
ACK_TIMEOUT_MARGIN_MS = 1000  # the broker's acks=all wait ends this much before our request timeout
# Idempotence: batches of a partition stamped from its oldest unresolved one on. An Odradek
# leader recognises a retry among a producer's last 32 batches (log.producer_state.
# MAX_CACHED_BATCHES; Kafka keeps 5), so up to 32 closed batches of a partition go in its one
# request in flight instead of one request, and one round trip, each. With 5 the requests of
# a fast producer carried a third of the batches they do without idempotence: 21% of the
# throughput; with 16, 11%; with 32, 3% (docs/BENCHMARKS.md, "Exactly-once").
MAX_STAMPED = 32


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 of the key bytes (Utils.murmur2), as an unsigned 32-bit value."""
    m, n = 0x5BD1E995, len(key)
    h = (0x9747B28C ^ n) & 0xFFFFFFFF
    end = n & ~3
    for (k,) in struct.iter_unpack("<I", key[:end]):
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        h = ((h * m) & 0xFFFFFFFF) ^ ((k * m) & 0xFFFFFFFF)
    extra = n & 3
    if extra == 3:
        h ^= key[end + 2] << 16
    if extra >= 2:
        h ^= key[end + 1] << 8
    if extra >= 1:
        h = ((h ^ key[end]) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition of a keyed record: Kafka's default partitioner, so a Kafka producer and
    this one put a key on the same partition."""
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


# Codecs the native batch format does not have (it compresses with lz4 blocks): a batch
# compressed with one of them is written as Kafka's magic-2 batch (``log.kafka_batch``, what a
# Kafka producer sends; the broker stores and serves both kinds, docs/FORMAT.md).
KAFKA_CODECS = ("gzip", "snappy", "zstd")
CODECS = (None, "lz4", *KAFKA_CODECS)


def encode_rows(rows: list, base_ts: int, max_ts: int, compression: Optional[str], keys: list | None = None) -> bytes:
    """One record batch (``log.records`` layout, base offset 0) from ``rows``: each item is
    either a value (bytes: a record with no headers and the batch's timestamp; its key is
    ``keys[i]``, or None when ``keys`` is None) or a full row ``(offset_delta,
    timestamp_delta, key, value, headers)``; offset deltas are the positions 0..n-1.
    ``KAFKA_CODECS``: a magic-2 batch instead."""
    if compression in KAFKA_CODECS:
        return kafka_batch.encode([fmt.Record(i, base_ts, None if keys is None else keys[i], r, [])
                                   if isinstance(r, (bytes, bytearray, memoryview))
                                   else fmt.Record(r[0], base_ts + r[1], r[2], r[3], r[4] or [])
                                   for i, r in enumerate(rows)],
                                  base_offset=0, first_timestamp=base_ts, max_timestamp=max_ts, compression=compression)
    n = len(rows)
    payload = pack_rows(rows, keys)
    attributes = 0
    if compression == "lz4":
        payload = cramjam.lz4.compress_block(payload)  # lz4 block, little-endian u32 size first
        attributes = fmt.COMPRESSION_LZ4
    out = bytearray(fmt.HEADER_SIZE + len(payload))
    _HEADER_PACK(out, 0, 0, len(out) - fmt.LOG_OVERHEAD, -1, fmt.MAGIC, 0, attributes, n - 1,
                 base_ts, max_ts, -1, -1, -1, n)
    out[fmt.HEADER_SIZE:] = payload
    _CRC_PACK(out, fmt.OFFSET_CRC, _crc32(memoryview(out)[fmt.CRC_START:]))
    return bytes(out)


def pack_rows(rows: list, keys: list | None = None) -> bytes:
    """The msgpack array of rows, byte for byte what ``msgpack.packb`` makes of the full rows
    (``keys``, when given, holds the key of each plain value; see ``encode_rows``).

    A batch of plain values (the common case) is assembled with slice assignments and one
    ``join`` from cached byte strings: no Python code and no object per record. That is why
    ``send`` can queue a bare value (and its key, in ``keys``) instead of a row tuple. When
    every value has the same length (the usual benchmark and a common workload), each
    value's framing is one cached string: "end of the previous row + this row's position,
    timestamp, key and bin header"; keyed values the same, with the key between."""
    n = len(rows)
    types = set(map(type, rows))
    if keys is not None:
        if types == _ONLY_BYTES and None not in keys:
            return _pack_keyed(rows, keys)
        rows = [(i, 0, k, r, ()) if r.__class__ is bytes else r for i, (r, k) in enumerate(zip(rows, keys))]
        types = _ONLY_TUPLES
    if types != _ONLY_BYTES:
        if types == _ONLY_TUPLES:  # full rows only: msgpack packs them as they are
            return _packb(rows)
        return _packb([(i, 0, None, r, ()) if r.__class__ is bytes else r for i, r in enumerate(rows)])
    parts = [None] * (2 * n)
    parts[1::2] = rows
    lengths = set(map(len, rows))
    if len(lengths) == 1:
        parts[0::2] = _framing_for(lengths.pop(), n)[:n]
    else:
        heads = [None] * (2 * n)
        heads[0::2] = _row_prefixes(n)
        heads[1::2] = map(_BIN_HEADER.__getitem__, map(len, rows))
        parts[0::2] = map(b"".join, zip(heads[0::2], heads[1::2]))
        parts[2::2] = map(b"\x90".__add__, parts[2::2])
    return _array_header(n) + b"".join(parts) + b"\x90"


def _pack_keyed(rows: list, keys: list) -> bytes:
    """``pack_rows`` of plain values with a key each (bytes): four strings per record, (end
    of the previous row + position, timestamp, key's bin header), key, value's bin header,
    value, the first and third cached when the keys, or the values, have one length."""
    n = len(rows)
    parts = [None] * (4 * n)
    parts[1::4] = keys
    parts[3::4] = rows
    key_lengths = set(map(len, keys))
    if len(key_lengths) == 1:
        parts[0::4] = _framing_for(key_lengths.pop(), n, keyed=True)[:n]
    else:
        parts[0::4] = map(add, _framing_for(None, n, keyed=True)[:n], map(_BIN_HEADER.__getitem__, map(len, keys)))
    lengths = set(map(len, rows))
    if len(lengths) == 1:
        parts[2::4] = [_BIN_HEADER[lengths.pop()]] * n
    else:
        parts[2::4] = map(_BIN_HEADER.__getitem__, map(len, rows))
    return _array_header(n) + b"".join(parts) + b"\x90"


def _row_prefixes(n: int) -> list:
    """Position i -> fixarray(5), i, timestamp delta 0, key nil (grown on demand)."""
    if len(_ROW_PREFIX) < n:
        _ROW_PREFIX.extend(b"\x95" + _packb(i) + b"\x00\xc0" for i in range(len(_ROW_PREFIX), n))
    return _ROW_PREFIX[:n]


def _framing_for(length: int | None, n: int, keyed: bool = False) -> list:
    """Position i -> (end of row i-1) + row i's prefix + the bin header of a ``length``-byte
    value (none for None). ``keyed``: the prefix stops before the key (its header follows)
    instead of ending with a nil key."""
    framing = _FRAMING.get((keyed, length))
    if framing is None or len(framing) < n:
        if len(_FRAMING) >= 64:
            _FRAMING.clear()
        head = b"" if length is None else _BIN_HEADER[length]
        framing = [(p[:-1] if keyed else p) + head for p in _row_prefixes(max(n, 256))]
        framing[1:] = [b"\x90" + f for f in framing[1:]]
        _FRAMING[(keyed, length)] = framing
    return framing


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x90 | n,))
    return b"\xdc" + n.to_bytes(2, "big") if n < 65536 else b"\xdd" + n.to_bytes(4, "big")


class _BinHeaders(dict):
    """length -> msgpack bin header (cached; values of one size share one entry)."""

    def __missing__(self, n: int) -> bytes:
        h = b"\xc4" + bytes((n,)) if n < 256 else b"\xc5" + n.to_bytes(2, "big") if n < 65536 \
            else b"\xc6" + n.to_bytes(4, "big")
        self[n] = h
        return h


_ONLY_BYTES = {bytes}
_ONLY_TUPLES = {tuple}
_ROW_PREFIX: list = []
_FRAMING: dict = {}  # (keyed, key or value length) -> framing strings by position (at most 64 kept)
_BIN_HEADER = _BinHeaders()


class Producer:
    """Sends records to topics. See the module docstring for threads, batching, partitioning."""

    def __init__(self, bootstrap_servers="127.0.0.1:9092", *, acks="all", linger_ms: float = 5,
                 batch_size: int = 65536, compression: Optional[str] = "lz4", retries: int = 2147483647,
                 retry_backoff_ms: int = 100, max_in_flight: int = 5, request_timeout_ms: int = 30000,
                 delivery_timeout_ms: int = 120000, max_block_ms: int = 60000, buffer_memory: int = 32 << 20,
                 max_request_size: int = 1 << 20, client_id: str = "odradek-producer",
                 metadata_max_age_ms: int = 300000, compression_type: Optional[str] = None,
                 enable_idempotence: Optional[bool] = None, transactional_id: Optional[str] = None,
                 transaction_timeout_ms: int = 60000, **security):
        if compression_type is not None:  # kafka-python's spelling
            compression = compression_type
        if compression in ("none", ""):
            compression = None
        if compression not in CODECS:
            raise ValueError(f"compression {compression!r} is not supported (use 'lz4', 'gzip', 'snappy', 'zstd' "
                             f"or None)")
        if isinstance(acks, str) and acks.lstrip("-").isdigit():
            acks = int(acks)
        self.acks = -1 if acks in ("all", -1) else acks
        if self.acks not in (0, 1, -1):
            raise ValueError(f"acks must be 0, 1 or 'all' (-1), got {acks!r}")
        if batch_size < 1 or max_in_flight < 1 or retries < 0:
            raise ValueError("batch_size and max_in_flight must be >= 1 and retries >= 0")
        conflicts = [why for bad, why in ((self.acks != -1, f"acks={acks!r} (it needs acks='all')"),
                                          (retries == 0, "retries=0 (it needs retries > 0)"),
                                          (max_in_flight > 5, f"max_in_flight={max_in_flight} (it needs <= 5)"))
                     if bad]
        if (enable_idempotence or transactional_id is not None) and conflicts:
            raise ValueError(f"enable_idempotence=True conflicts with {', '.join(conflicts)}")
        if transactional_id is not None and (enable_idempotence is False or not transactional_id):
            raise ValueError("transactional_id needs idempotence (do not pass enable_idempotence=False) and must "
                             "be a non-empty string")
        self.idempotent = enable_idempotence is not False and not conflicts
        self.compression = compression
        self.linger = linger_ms / 1000
        self.batch_size = batch_size
        self.retries = retries
        self.retry_backoff = retry_backoff_ms / 1000
        self.max_in_flight = max_in_flight
        # Requests of one partition in flight at once. One keeps the partition's order through
        # every retry (nothing sent after a refused request can overtake it), with or without
        # idempotence; the sequence numbers then also make a retry recognisable.
        self.max_in_flight_per_partition = 1
        self.request_timeout_ms = request_timeout_ms
        self.delivery_timeout = delivery_timeout_ms / 1000
        self.max_block = max_block_ms / 1000
        self.buffer_memory = buffer_memory
        self.max_request_size = max_request_size
        self.client_id = client_id
        self.metadata_max_age = metadata_max_age_ms / 1000
        self._cluster = Cluster(bootstrap_servers, client_id, request_timeout_ms, retry_backoff_ms,
                                metadata_max_age_ms, ClientSecurity.from_options(security))  # TLS/SASL options
        # How long the leader may hold an acks=all produce: answered (REQUEST_TIMED_OUT, retried on
        # the same connection) a little before we would give up on the connection.
        self.ack_timeout_ms = max(request_timeout_ms // 2, request_timeout_ms - ACK_TIMEOUT_MARGIN_MS)

        # The batches between send() and the sender thread (odradek/accumulator.py)
        compression = self.compression
        self._acc = RecordAccumulator(
            self._cluster, lambda rows, keys, base_ts, max_ts: encode_rows(rows, base_ts, max_ts, compression, keys),
            linger=self.linger, batch_size=batch_size, buffer_memory=buffer_memory, max_block=self.max_block,
            delivery_timeout=self.delivery_timeout)
        self._append = self._acc.append  # bound once: send() calls it per record
        self._append_keyed = self._acc.append_keyed
        # topic -> (the metadata snapshot ``Cluster.topics`` the partitions were computed from,
        # {key: the accumulator's slot of its partition}, the topic's TopicMetadata): the keyed
        # fast path's memo of murmur2, valid while that snapshot is current (every refresh
        # replaces it, so a partition count change is seen at once; a refresh that kept the
        # topic's TopicMetadata keeps the keys), KEY_MEMO keys each
        self._key_memo: dict[str, tuple] = {}
        self._sender = _Sender(self._acc, self._cluster, acks=self.acks, ack_timeout_ms=self.ack_timeout_ms,
                               idempotent=self.idempotent, retries=retries, retry_backoff=self.retry_backoff,
                               max_in_flight=max_in_flight,
                               max_in_flight_per_partition=self.max_in_flight_per_partition,
                               max_request_size=max_request_size, request_timeout_ms=request_timeout_ms,
                               client_id=client_id)
        self._txn = None if transactional_id is None else _Transactions(self, transactional_id, transaction_timeout_ms)
        self._sender.txn = self._txn
        if self._txn is not None:
            self._acc.on_open = self._txn.partition_opened
        self._thread = threading.Thread(target=self._sender.run, name=f"odradek-sender-{client_id}", daemon=True)
        self._thread.start()

    # ---- the hot path ---------------------------------------------------------------------------
    def send(self, topic: str, value: Optional[bytes], key: Optional[bytes] = None, partition: Optional[int] = None,
             headers=None, timestamp_ms: Optional[int] = None) -> FutureRecordMetadata:
        """Queue one record; returns a future of its ``RecordMetadata``.

        One path: a record of bytes with neither partition, headers nor timestamp whose
        partition is known without a look at the metadata (keyless: the topic's sticky batch;
        keyed: a key seen before, ``_key_memo``, straight to its partition's slot) goes to the
        accumulator if its batch is open; everything else is checked, given its partition and
        then appended the same way."""
        if partition is None and headers is None and timestamp_ms is None and value.__class__ is bytes:
            if key is None:
                handle = self._append(topic, None, value, None, (), None, len(value) + RECORD_OVERHEAD)
                if handle is not None:
                    return handle
            elif key.__class__ is bytes:
                memo = self._key_memo.get(topic)
                if memo is not None and memo[0] is self._cluster.topics:
                    slot = memo[1].get(key)
                    if slot is not None:
                        handle = self._append_keyed(slot, value, key, len(value) + len(key) + RECORD_OVERHEAD)
                        if handle is not None:
                            return handle
        if self._txn is not None:
            self._txn.check_sendable()
        value, key, headers = _check_record(value, key, headers, timestamp_ms)
        if self._acc.closed:
            raise RuntimeError("send() on a closed producer")
        count = self._partition_count(topic)
        if partition is not None:
            if not isinstance(partition, int) or not 0 <= partition < count:
                raise error_for(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                f"topic '{topic}' has partitions 0..{count - 1}; partition {partition!r} does not exist")
        elif key is not None:
            partition = self._partition_of_key(topic, key, count)
        size = len(value or b"") + len(key or b"") + RECORD_OVERHEAD
        return self._append(topic, partition, value, key, headers, timestamp_ms, size, count)

    def _partition_of_key(self, topic: str, key: bytes, count: int) -> int:
        """``partition_for_key``, remembered for the fast path in ``send`` (see ``_key_memo``)."""
        partition = partition_for_key(key, count)
        topics = self._cluster.topics
        meta = topics.get(topic)
        if meta is not None and len(meta.partitions) == count:
            memo = self._key_memo.get(topic)
            if memo is None or memo[2] is not meta or len(memo[1]) >= KEY_MEMO:
                memo = self._key_memo[topic] = (topics, {}, meta)
            elif memo[0] is not topics:  # a refresh that kept this topic's metadata: the keys stay
                memo = self._key_memo[topic] = (topics, memo[1], meta)
            memo[1][key] = self._acc.slot(topic, partition)
        return partition

    # ---- batches (all under _lock) -------------------------------------------------------------
    def _partition_count(self, topic: str) -> int:
        parts = self._cluster.partitions(topic)
        if parts:
            return len(parts)
        deadline = time.monotonic() + self.max_block
        while True:
            body = self._cluster.refresh([topic], timeout=max(0.1, deadline - time.monotonic()))
            t = next((t for t in body.get("topics", []) if t["name"] == topic), None)
            if t is not None and not t.get("error_code") and t.get("partitions"):
                return len(t["partitions"])
            code = t.get("error_code") if t else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            message = (t or {}).get("error_message") or f"topic '{topic}' is not in the metadata"
            if not ErrorCode.of(code).retriable or code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION \
                    and time.monotonic() + self.retry_backoff >= deadline:
                raise error_for(code, f"send to '{topic}': {message}")
            if time.monotonic() + self.retry_backoff >= deadline:
                raise error_for(ErrorCode.REQUEST_TIMED_OUT,
                                f"send to '{topic}': no partitions after max_block_ms ({message})")
            time.sleep(self.retry_backoff)

    def partitions_for(self, topic: str) -> set:
        """The partition numbers of a topic (fetching metadata if needed)."""
        return set(range(self._partition_count(topic)))

    # ---- flush / close -------------------------------------------------------------------------
    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued so far (ignoring linger) and wait until each record is
        acknowledged or failed. Raises ``TimeoutError`` if that takes longer than ``timeout``."""
        pending = self._acc.flush_futures()
        done, not_done = concurrent.futures.wait(pending, timeout)
        if not_done:
            raise TimeoutError(f"flush: {len(not_done)} batches still unacknowledged after {timeout}s")

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop the sender thread. Records still unsent after ``timeout`` seconds
        fail with REQUEST_TIMED_OUT. Idempotent."""
        if self._acc.closed:
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            self.flush(timeout)
        except TimeoutError:
            pass
        self._acc.close()
        self._sender.stop(deadline)
        self._acc.wake()
        self._thread.join()
        if self._txn is not None:  # after the sender: it reads the early AddPartitionsToTxn's answer
            self._txn.close()
        self._acc.release()
        self._cluster.close()

    def __enter__(self) -> "Producer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- transactions (``transactional_id``; the shapes of confluent-kafka and kafka-python) ------
    def _transactions(self) -> "_Transactions":
        if self._txn is None:
            raise ValueError("this producer has no transactional_id")
        return self._txn

    def init_transactions(self, timeout: float | None = None) -> None:
        """Register the ``transactional_id``: the coordinator aborts a transaction an earlier
        instance left open and fences every earlier instance (their next call raises
        ``ProducerFencedError``). Call once, before ``begin_transaction``."""
        self._transactions().init(timeout)

    def begin_transaction(self) -> None:
        self._transactions().begin()

    def send_offsets_to_transaction(self, offsets, group_metadata, timeout: float | None = None) -> None:
        """Commit a consumer group's ``offsets`` ({TopicPartition: next offset} or a list of
        TopicPartitions with offsets) as part of the transaction: they become the group's
        committed offsets if, and only if, the transaction commits."""
        self._transactions().send_offsets(offsets, group_metadata, timeout)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush, then commit: every record sent since ``begin_transaction`` becomes visible
        to read_committed consumers at once, or none does. A record that failed makes the
        transaction abortable: this raises ``TransactionAbortableError`` and the caller
        must ``abort_transaction()``."""
        self._transactions().end(True, timeout)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Drop the transaction: its records stay in the log, marked aborted (read_committed
        consumers skip them)."""
        self._transactions().end(False, timeout)

    def metrics(self) -> dict:
        s = self._sender
        return {"requests": s.requests, "batches": s.batches, "retries": s.retried,
                "buffered_bytes": self._acc.buffered, "producer_id": s.idem.producer_id,
                "producer_epoch": s.idem.epoch, "sequence_resets": s.idem.resets}


def _check_record(value, key, headers, timestamp_ms):
    for name, v in (("value", value), ("key", key)):
        if v is not None and not isinstance(v, bytes):
            if isinstance(v, (bytearray, memoryview)):
                v = bytes(v)
            else:
                raise TypeError(f"{name} must be bytes or None, got {type(v).__name__} "
                                f"(encode it first, e.g. {name}.encode())")
            if name == "value":
                value = v
            else:
                key = v
    if headers:
        try:
            headers = tuple((str(k), bytes(v) if v is not None else None) for k, v in headers)
        except (TypeError, ValueError):
            raise TypeError("headers must be a sequence of (str, bytes) pairs") from None
    else:
        headers = ()
    if timestamp_ms is not None and (not isinstance(timestamp_ms, int) or timestamp_ms < 0):
        raise ValueError(f"timestamp_ms must be a non-negative int (ms since the epoch), got {timestamp_ms!r}")
    return value, key, headers


class TransactionAbortableError(OdradekError):
    """The transaction cannot commit (a record of it failed, or the coordinator refused an
    operation for a reason that only concerns this transaction): ``abort_transaction()``,
    then begin a new one. Its ``code`` is the error that caused it."""


# Kafka's fatal transactional errors: the producer must be closed (a newer instance took over).
TXN_FATAL = (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.INVALID_PRODUCER_ID_MAPPING,
             ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, ErrorCode.INVALID_TRANSACTION_TIMEOUT)


class _PipelinedEnd:
    """A commit whose EndTxn the sender writes behind the transaction's last batches (see the
    module doc). The caller waits for ``ready``: set by the sender once it wrote EndTxn on
    ``conn`` (the caller then owns that connection and reads the answer into ``answers``) or
    decided against it (``fallback`` says why: the usual commit follows)."""
    __slots__ = ("generation", "ready", "conn", "fallback", "answers")

    def __init__(self, generation: int):
        self.generation = generation
        self.ready = threading.Event()
        self.conn: Connection | None = None
        self.fallback = ""
        self.answers: list = []


class _Transactions:
    """A transactional producer's state (Kafka's TransactionManager, simplified): READY ->
    IN_TRANSACTION -> READY, or FATAL for good. The caller's thread talks to the
    coordinator (blocking requests); the adder thread (``_add_loop``) adds each partition
    to the transaction when its first batch opens, and the sender holds the partition's
    batches until then (``add_state``; ``may_go_unverified`` for the exception), and ends a
    commit itself right behind the last batches (``send_end``). Requests go to the
    transactional id's coordinator (FIND_COORDINATOR key_type 1: the leader of its
    ``__transaction_state`` partition), TxnOffsetCommit to the group's coordinator, as
    Kafka's producer does; both are found again when they move."""

    def __init__(self, producer: "Producer", txn_id: str, timeout_ms: int):
        self.p, self.txn_id, self.timeout_ms = producer, txn_id, timeout_ms
        timeout = producer.request_timeout_ms / 1000
        self.coordinator = Coordinator(producer._cluster, txn_id, timeout, key_type=TRANSACTION_KEY)
        self.group_coordinators: dict[str, Coordinator] = {}
        self.state = "UNINITIALIZED"
        self.fatal: OdradekError | None = None
        self.abortable: OdradekError | None = None
        # The current transaction's partitions (under _lock): added (the coordinator stored them),
        # being added (AddPartitionsToTxn in flight, ``_adder``), refused (their batches fail).
        self.partitions: set = set()
        self.adding: set = set()
        self.add_errors: dict = {}
        self._to_add: list = []  # asked for, not yet in a request
        # Transactions begun: an AddPartitionsToTxn answered after its transaction ended (an
        # abort that gave up waiting for it) adds nothing to the next one.
        self.generation = 0
        # The early path: the caller's thread writes a partition's AddPartitionsToTxn itself
        # when the adder is idle (the adder, woken while the caller holds the GIL, would send
        # it only when the caller blocks: after the transaction's sends), and the sender reads
        # its answer (``settle_early``) when it next looks for batches to send: at the flush,
        # one thread wakes where two did. ``_add_conn``, the adder's own connection to the
        # coordinator, is touched by one thread at a time: the caller only to write while
        # nothing is being added, the sender while ``_early`` is set, the adder otherwise.
        self._add_conn: Connection | None = None
        self._early: tuple | None = None  # (partitions, answers, deadline, generation): the caller's, for the sender
        self.offsets_sent = False  # send_offsets_to_transaction() in the current transaction
        self._end: _PipelinedEnd | None = None  # a commit the sender is to end (``send_end``)
        self._lock = threading.Lock()
        self._add_changed = threading.Condition(self._lock)
        self._closing = False
        self._adder = threading.Thread(target=self._add_loop, name=f"odradek-txn-{txn_id}", daemon=True)
        self._adder.start()

    # ---- errors -------------------------------------------------------------------------------
    def _raise_if_fatal(self) -> None:
        if self.fatal is not None:
            raise self.fatal

    def _classify(self, exc: OdradekError, what: str) -> OdradekError:
        if exc.code in TXN_FATAL:
            fatal = error_for(ErrorCode.PRODUCER_FENCED if exc.code == ErrorCode.INVALID_PRODUCER_EPOCH else exc.code,
                              f"transactional id {self.txn_id!r}: {what}: {exc.message}; this producer is fenced "
                              f"(another instance with the same transactional_id took over, or its transaction "
                              f"timed out): close it")
            self.fatal = fatal
            self.state = "FATAL"
            return fatal
        return exc

    def record_failed(self, err: BaseException) -> None:
        """A batch of the transaction failed (sender thread): the transaction must abort."""
        if isinstance(err, OdradekError) and err.code in TXN_FATAL:
            self._classify(err, "a produce was refused")
        elif self.abortable is None:
            self.abortable = TransactionAbortableError(f"a record of the transaction failed ({err}); "
                                                       f"abort_transaction() and retry",
                                                       getattr(err, "code", ErrorCode.UNKNOWN_SERVER_ERROR))

    def not_ready_error(self) -> OdradekError:
        return self.fatal or TransactionAbortableError("send() outside a transaction: call init_transactions() "
                                                       "and begin_transaction() first", ErrorCode.INVALID_TXN_STATE)

    def check_sendable(self) -> None:
        self._raise_if_fatal()
        if self.state != "IN_TRANSACTION":
            raise ValueError(f"send() needs an open transaction (state {self.state}): call "
                             f"{'init_transactions()' if self.state == 'UNINITIALIZED' else 'begin_transaction()'} first")

    # ---- requests to the coordinator ---------------------------------------------------------
    def _request(self, api: int, body: dict, what: str, timeout: float | None, item_codes=None,
                 group_id: str | None = None) -> dict:
        """Blocking, to the transaction's coordinator (or ``group_id``'s), retrying retriable
        answers (CONCURRENT_TRANSACTIONS while markers are written, a coordinator loading,
        restarting or moved) until ``timeout``."""
        deadline = time.monotonic() + (self.p.request_timeout_ms / 1000 if timeout is None else timeout)
        backoff = self.p.retry_backoff
        coordinator = self.coordinator
        if group_id is not None:
            coordinator = self.group_coordinators.get(group_id)
            if coordinator is None:
                coordinator = self.group_coordinators[group_id] = Coordinator(self.p._cluster, group_id,
                                                                              self.coordinator.timeout)

        def codes_of(answer: dict) -> list:
            return [answer.get("error_code", 0)] + list(item_codes(answer) if item_codes else ())

        while True:
            try:
                left = max(deadline - time.monotonic(), 0.1)
                answer = coordinator.request(api, body, timeout=left, item_codes=codes_of) or {}
                codes = codes_of(answer)
                code = next((c for c in codes if c), 0)
                if not code:
                    return answer
                exc = error_for(code, answer.get("error_message") or ErrorCode.of(code).meaning)
            except OdradekError as e:
                exc = e
            if not (exc.retriable or exc.code in NETWORK_ERRORS) or time.monotonic() + backoff >= deadline:
                raise self._classify(exc, what)
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    def _ids(self) -> dict:
        s = self.p._sender
        return {"transactional_id": self.txn_id, "producer_id": s.idem.producer_id, "producer_epoch": s.idem.epoch}

    def init(self, timeout: float | None) -> None:
        self._raise_if_fatal()
        if self.state != "UNINITIALIZED":
            raise ValueError(f"init_transactions() was called already (state {self.state})")
        body = self._request(ApiKey.INIT_PRODUCER_ID, {"transactional_id": self.txn_id,
                                                       "transaction_timeout_ms": self.timeout_ms,
                                                       "producer_id": -1, "producer_epoch": -1},
                             "InitProducerId", timeout)
        s = self.p._sender
        s.idem.producer_id, s.idem.epoch = body["producer_id"], body["producer_epoch"]  # before any batch: no race
        s.idem.next_seq.clear()
        self.state = "READY"

    def begin(self) -> None:
        self._raise_if_fatal()
        if self.state != "READY":
            raise ValueError(f"begin_transaction() in state {self.state}"
                             + (": call init_transactions() first" if self.state == "UNINITIALIZED" else
                                ": commit or abort the open transaction first"))
        with self._lock:
            self.partitions = set()
            self.add_errors = {}
            self.generation += 1
        self.abortable = None
        self.offsets_sent = False
        self.state = "IN_TRANSACTION"

    # ---- AddPartitionsToTxn, while the partition's first batch fills --------------------------
    def partition_opened(self, topic: str, partition: int) -> None:
        """A batch opened (a caller's thread, the accumulator's lock held): the partition is
        added to the transaction now, while the batch fills, instead of by the sender before
        it sends the batch (one round trip off each transaction). With nothing else being
        added, this thread writes the request itself (the sender takes its answer); else the
        adder thread sends it. The sender sends none of the partition's batches before the
        coordinator stored it."""
        tp = (topic, partition)
        if tp in self.partitions:
            return
        with self._lock:
            if self._asked(tp):
                return
            conn = self._add_conn
            if not self.adding and self._early is None and conn is not None and conn.connected:
                answers: list = []
                try:
                    conn.send(ApiKey.ADD_PARTITIONS_TO_TXN, self._add_body([tp]),
                              callback=lambda frame, err: answers.append((frame, err)))
                except OdradekError:
                    pass  # the adder sends it its usual way
                else:
                    self.adding.add(tp)  # not in _to_add: the adder is not woken for nothing
                    self._early = ([tp], answers, time.monotonic() + self.p.request_timeout_ms / 1000,
                                   self.generation)
                    return
            self._want(tp)

    def _asked(self, tp: tuple) -> bool:
        """Lock held: ``tp`` is added, being added or refused."""
        return tp in self.partitions or tp in self.adding or tp in self.add_errors

    def _want(self, tp: tuple) -> None:
        """Lock held: ask for ``tp`` unless it is added, being added or refused."""
        if self._asked(tp):
            return
        self.adding.add(tp)
        self._to_add.append(tp)
        self._add_changed.notify_all()

    def add_state(self, tp: tuple):
        """Sender thread, for a batch about to be sent: True if its partition is in the
        transaction, None while it is being added (the batch waits; the sender is woken when
        the answer comes), or the error that refused it (the batch fails)."""
        if tp in self.partitions:
            return True
        with self._lock:
            if tp in self.partitions:
                return True
            if tp in self.add_errors:
                return self.add_errors[tp]
            self._want(tp)  # a batch opened before a refusal was forgotten (begin) or none asked yet
            return None

    def _add_body(self, tps: list) -> dict:
        topics: dict[str, list] = {}
        for topic, partition in tps:
            topics.setdefault(topic, []).append(partition)
        return {**self._ids(), "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}

    @staticmethod
    def _add_codes(answer: dict) -> list:
        return [r["partition_error_code"] for t in answer.get("results") or () for r in t["results"]]

    def may_go_unverified(self, tp: tuple, cluster: Cluster) -> bool:
        """Sender thread: may a batch of ``tp`` go before the answer to the AddPartitionsToTxn
        the caller wrote for it? Yes if that request is out and the partition's leader is the
        coordinator's broker: the batch goes marked ``txn_unverified``, and the leader appends
        it only once the coordinator told it the partition is stored in the transaction (one
        round trip off a transaction's commit; docs/TRANSACTIONS.md)."""
        early = self._early
        return early is not None and tp in early[0] and self._led_by_coordinator(tp, cluster)

    def _led_by_coordinator(self, tp: tuple, cluster: Cluster) -> bool:
        """Is ``tp``'s leader the broker the coordinator connection goes to (connected)?"""
        conn = self._add_conn
        return conn is not None and conn.connected and cluster.address(cluster.leader(*tp)) == (conn.host, conn.port)

    def early_conn(self) -> Connection | None:
        """Sender thread: the connection whose answer it waits for besides its own (the
        early AddPartitionsToTxn's), or None (also while a pipelined commit's caller reads it)."""
        end = self._end
        return self._add_conn if self._early is not None and (end is None or end.conn is None) else None

    def settle_early(self, reader: bool = False) -> None:
        """Sender thread (or ``reader``: a pipelined commit's caller, who owns the connection
        then): take the answer to the AddPartitionsToTxn the caller wrote, if it
        came (read without blocking) or will never come (the connection lost, or no answer
        within request_timeout_ms). Added, the partitions' batches may go; refused, they are
        asked again the usual way, by the adder (``_request`` retries, follows a coordinator
        that moved, and records a refusal that stands)."""
        early = self._early
        if early is None:
            return
        end = self._end
        if end is not None and end.conn is not None and not reader:
            return  # a pipelined commit's caller reads the connection now, and settles this answer
        tps, answers, deadline, generation = early
        conn = self._add_conn
        if not answers and conn.connected:
            conn.read()
        if not answers:
            if conn.connected and time.monotonic() < deadline:
                return
            conn.close("AddPartitionsToTxn unanswered")  # fails it: its callback records why
        frame, err = answers[0]
        added = err is None and not any(self._add_codes(frame.header["body"]))
        with self._lock:
            self._early = None
            if generation != self.generation:
                self.adding.difference_update(tps)  # its transaction ended: the sender asks anew if need be
            elif added:
                self.partitions.update(tps)
                self.adding.difference_update(tps)
            else:
                self._to_add[:0] = tps  # still in ``adding``: asked once
            self._add_changed.notify_all()  # the adder (partitions asked meanwhile), _adds_settled

    def _connect_adder(self) -> None:
        """Adder thread, after an AddPartitionsToTxn succeeded: its own connection to the
        coordinator (again, if the coordinator moved or the connection dropped)."""
        address = self.coordinator.address
        conn = self._add_conn
        if address is None or (conn is not None and conn.connected and (conn.host, conn.port) == address):
            return
        if conn is not None:
            conn.close("the transaction coordinator moved")
        conn = Connection(address[0], address[1], self.p._cluster.client_id, self.p.request_timeout_ms,
                          security=self.p._cluster.security)
        try:
            conn.connect()
        except OdradekError:
            conn = None
        with self._lock:
            self._add_conn = conn

    def _add_loop(self) -> None:
        """The adder thread: AddPartitionsToTxn for the partitions asked for (all those asked
        meanwhile in one request, once the caller's early one is answered: one at a time),
        then wakes the sender."""
        while True:
            with self._lock:
                while (not self._to_add or self._early is not None) and not self._closing:
                    self._add_changed.wait()
                if self._closing:
                    return
                new, self._to_add = sorted(set(self._to_add)), []
                generation = self.generation
            error = None
            try:
                self._request(ApiKey.ADD_PARTITIONS_TO_TXN, self._add_body(new), "AddPartitionsToTxn", None,
                              self._add_codes)
                self._connect_adder()
            except OdradekError as exc:
                error = exc
            except Exception as exc:  # noqa: BLE001 - a bug must fail the batches, not hang them
                log.exception("AddPartitionsToTxn failed")
                error = error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"AddPartitionsToTxn failed: {exc!r}")
            with self._lock:
                if generation != self.generation:
                    pass  # its transaction ended meanwhile: the sender asks anew if need be
                elif error is None:
                    self.partitions.update(new)
                else:
                    self.add_errors.update((tp, error) for tp in new)
                self.adding.difference_update(new)
                self._add_changed.notify_all()
            self.p._acc.wake()  # the sender sends (or fails) the batches that waited

    def _adds_settled(self, timeout: float | None) -> None:
        """Wait until no AddPartitionsToTxn is in flight (its batches are resolved by then,
        unless one failed on its own): EndTxn must not overtake one."""
        deadline = time.monotonic() + (self.p.request_timeout_ms / 1000 if timeout is None else timeout)
        with self._lock:
            while self.adding:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"AddPartitionsToTxn of {sorted(self.adding)} unanswered after {timeout}s")
                self._add_changed.wait(left)

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._add_changed.notify_all()
        self._adder.join(1.0)  # idle, it returns at once; one stuck in a retry must not hold close()
        if self._add_conn is not None:
            self._add_conn.close()

    def send_offsets(self, offsets, group_metadata, timeout: float | None) -> None:
        self._raise_if_fatal()
        if self.state != "IN_TRANSACTION":
            raise ValueError(f"send_offsets_to_transaction() needs an open transaction (state {self.state})")
        group_id = getattr(group_metadata, "group_id", group_metadata)
        if not isinstance(group_id, str) or not group_id:
            raise ValueError("group_metadata must be consumer.group_metadata() (or a group id)")
        if isinstance(offsets, dict):
            pairs = [(tp.topic, tp.partition, off if isinstance(off, int) else off.offset) for tp, off in offsets.items()]
        else:
            pairs = [(tp.topic, tp.partition, tp.offset) for tp in offsets]
        self._request(ApiKey.ADD_OFFSETS_TO_TXN, {**self._ids(), "group_id": group_id}, "AddOffsetsToTxn", timeout)
        self.offsets_sent = True
        topics: dict[str, list] = {}
        for topic, partition, offset in pairs:
            topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset})
        self._request(ApiKey.TXN_OFFSET_COMMIT, {**self._ids(), "group_id": group_id,
                                                 "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]},
                      "TxnOffsetCommit", timeout,
                      lambda a: [p["error_code"] for t in a.get("topics") or () for p in t["partitions"]],
                      group_id=group_id)

    def end(self, commit: bool, timeout: float | None) -> None:
        self._raise_if_fatal()
        what = "commit_transaction()" if commit else "abort_transaction()"
        if self.state != "IN_TRANSACTION":
            raise ValueError(f"{what} without an open transaction (state {self.state})")
        if commit and self.abortable is None and self._commit_pipelined(timeout):
            self.state = "READY"
            return
        try:
            self.p.flush(timeout)
        except TimeoutError:
            if commit:
                raise
        try:
            self._adds_settled(timeout)
        except TimeoutError:
            if commit:
                raise
        self._raise_if_fatal()  # a batch refused as fenced
        if commit and self.abortable is not None:
            raise self.abortable
        with self._lock:
            touched = bool(self.partitions) or self.offsets_sent
        if touched:  # a transaction that wrote nothing has nothing to end at the coordinator
            self._request(ApiKey.END_TXN, {**self._ids(), "committed": commit}, "EndTxn", timeout)
        self.state = "READY"

    # ---- the pipelined commit ----------------------------------------------------------------
    def _commit_pipelined(self, timeout: float | None) -> bool:
        """Commit with EndTxn written by the sender right behind the last batches (see the
        module doc). True once committed; False if the usual commit must follow (nothing
        sent that needs checking, no connection to the coordinator, a partition led
        elsewhere, or the coordinator could not confirm the records: it then left the
        transaction open). Raises a fatal error as the usual path does."""
        with self._lock:
            conn = self._add_conn
            if not (self.partitions or self.adding) or conn is None or not conn.connected or self._end is not None:
                return False
        deadline = time.monotonic() + (self.p.request_timeout_ms / 1000 if timeout is None else timeout)
        pending = self.p._acc.flush_futures()
        with self._lock:
            end = self._end = _PipelinedEnd(self.generation)
        self.p._acc.wake()
        try:
            if not end.ready.wait(max(0.0, deadline - time.monotonic())) or end.conn is None:
                log.debug("transactional id %r: committing in Kafka's order: %s", self.txn_id,
                          end.fallback or "EndTxn not written in time")
                return False
            conn = end.conn
            while not end.answers and conn.connected and time.monotonic() < deadline:
                conn.poll(min(deadline - time.monotonic(), 1.0))
            self.settle_early(reader=True)  # its answer came first, on the same connection
        finally:
            with self._lock:
                self._end = None
        if not end.answers:
            return False  # connection lost, or no answer: the usual EndTxn finds out (a retried commit is answered)
        frame, err = end.answers[0]
        if err is not None:
            if err.code in TXN_FATAL:
                raise self._classify(err, "EndTxn")
            log.debug("transactional id %r: commit with the batches in flight refused (%s); committing again "
                      "after their acknowledgements", self.txn_id, err)
            return False
        # The coordinator committed: every batch is written and replicated. Their answers are
        # on their way; flush() semantics: return once every record is resolved.
        done, not_done = concurrent.futures.wait(pending, max(0.0, deadline - time.monotonic()))
        failed = [f for f in done if f.exception() is not None]
        if failed:
            log.warning("transactional id %r committed (the coordinator found every batch written), yet %d batch(es) "
                        "reported a failure: %s", self.txn_id, len(failed), failed[0].exception())
        if not_done:
            raise TimeoutError(f"commit_transaction: committed, but {len(not_done)} batches still unacknowledged "
                               f"after {timeout}s")
        return True

    def send_end(self, sender: "_Sender") -> None:
        """Sender thread, after sending, while a pipelined commit waits: once every batch of
        the transaction was sent at least once (and its partitions were added), write EndTxn
        on the coordinator connection with each partition's last sequence still unacknowledged,
        and hand the connection to the caller; or decide for the usual commit."""
        end = self._end
        if end is None or end.ready.is_set():
            return
        if end.generation != self.generation:
            end.fallback = "the transaction ended"
            end.ready.set()
            return
        early = self._early
        if self.adding.difference(early[0] if early is not None else ()):
            return  # the adder's AddPartitionsToTxn (another connection) must be answered before EndTxn
        # The caller's own AddPartitionsToTxn may be in flight: it went on the connection EndTxn
        # takes, so the coordinator handles it first.
        if any(b.stamp is None for b in sender.retry) or not sender.acc.drained():
            return  # batches not sent yet (limits, backoff, closed just now): asked again on the next turn
        idem, cluster = sender.idem, sender.cluster
        current = (idem.producer_id, idem.epoch)
        expect = []
        for (topic, partition), window in idem.window.items():
            if not window or all(b.future.done() for b in window):
                continue
            last = window[-1]
            pid, epoch, seq = last.stamp
            if (pid, epoch) != current:
                end.fallback = f"{topic}-{partition} is switching producer epoch"
                break
            if not self._led_by_coordinator((topic, partition), cluster):
                end.fallback = f"{topic}-{partition} is not led by the coordinator's broker (or no connection to it)"
                break
            expect.append([topic, partition, last_sequence(seq, last.count - 1)])
        if not end.fallback and not expect:
            end.fallback = "every batch is acknowledged already"
        if not end.fallback:
            conn = self._add_conn
            try:
                conn.send(ApiKey.END_TXN, {**self._ids(), "committed": True, "expect": expect},
                          callback=lambda frame, err: end.answers.append((frame, err)))
                end.conn = conn
            except OdradekError as exc:
                end.fallback = f"EndTxn not sent: {exc}"
        end.ready.set()


class _Idempotence:
    """The idempotent producer's state, owned by the sender (its thread only): the producer id
    and epoch, and per partition its next sequence, its window of stamped batches, the
    (id, epoch) they carry and whether its leader refused its sequence (see the module doc)."""

    def __init__(self):
        # the producer id and epoch in use, each partition's next sequence
        self.producer_id, self.epoch = -1, 0
        self.next_seq: dict[tuple, int] = {}
        # each partition's window: the batches stamped with its id and epoch (``stamp_of``) from
        # its oldest unresolved one on (resolved ones behind it stay until it is resolved). The
        # partition's leader recognises a retry among the last batches it wrote of a producer
        # (log.producer_state.MAX_CACHED_BATCHES), so a window never holds more than MAX_STAMPED
        # (no more than those): a batch in doubt is always recognised if it was written.
        self.window: dict[tuple, collections.deque] = {}
        # the (producer id, epoch) a partition's window is stamped with: the current one, or an
        # older one until the partition has no batch in doubt (Kafka's producer switches each
        # partition to a bumped epoch only with nothing in flight there)
        self.stamp_of: dict[tuple, tuple] = {}
        # partitions whose leader refused their sequence: nothing new is stamped for them until
        # they switch to the current epoch (``switch_settled``)
        self.broken: set = set()
        self.resets = 0
        self.init_error: OdradekError | None = None  # InitProducerId refused for good

    def stamp(self, b: Batch, transactional: bool) -> None:
        """Give a batch about to be sent for the first time (or after a reset) the producer id,
        epoch and its partition's next sequence; the CRC covers them and is redone."""
        tp = (b.topic, b.partition)
        window = self.window.get(tp)
        if window is None:
            window = self.window[tp] = collections.deque()
        ident = self.stamp_of.get(tp)
        current = (self.producer_id, self.epoch)
        if ident != current and not window:  # nothing in doubt here: the partition takes the current epoch
            ident = self.stamp_of[tp] = current
            self.next_seq[tp] = 0
        pid, epoch = ident
        seq = self.next_seq.get(tp, 0)
        self.next_seq[tp] = (seq + b.count) & 0x7FFFFFFF  # Kafka's wrap after 2**31 - 1
        data = b.data if isinstance(b.data, bytearray) else bytearray(b.data)
        _STAMP_PACK(data, OFFSET_PRODUCER_ID, pid, epoch, seq)
        if transactional:
            data[fmt.OFFSET_ATTRIBUTES + 1] |= fmt.TRANSACTIONAL_BIT
        _CRC_PACK(data, fmt.OFFSET_CRC, kafka_batch.crc_of(data, 0, len(data)) if data[fmt.OFFSET_MAGIC] ==
                  kafka_batch.MAGIC else _crc32(memoryview(data)[fmt.CRC_START:]))  # CRC-32C for magic 2
        b.data = data
        b.stamp = (pid, epoch, seq)
        window.append(b)

    def switch_settled(self) -> None:
        """Move each refused partition to the current epoch once none of its batches is in
        doubt: a batch whose fate is unknown (answer lost) is first sent again with its own
        stamp, so the partition answers with the offsets it wrote or writes it once; were it
        stamped anew, a batch already written would be written a second time. Then the
        partition's sequence restarts at 0 and its unwritten batches are stamped anew (KIP-360).
        Other partitions go on meanwhile, each switching when it next has nothing in doubt."""
        now = time.monotonic()
        for tp in list(self.broken):
            window = self.window.get(tp, ())
            if any(not (b.unwritten or b.future.done()) for b in window):
                continue
            for b in window:
                if not b.future.done():
                    b.stamp, b.unwritten, b.retry_at = None, False, now
            self.window.pop(tp, None)
            self.stamp_of.pop(tp, None)
            self.broken.discard(tp)

    def waits_for_switch(self, b: Batch) -> bool:
        """A refused partition sends only its batches in doubt until it switches: new ones and
        refused ones wait for the new epoch (a batch in doubt behind a refused one is sent
        anyway: the partition refuses it, or recognises it if it was written)."""
        return (b.stamp is None or b.unwritten) and (b.topic, b.partition) in self.broken

    def earlier_unresolved(self, b: Batch) -> bool:
        """Is a batch stamped before ``b`` (same partition, same epoch) still unresolved?"""
        for x in self.window.get((b.topic, b.partition), ()):
            if x is b:
                return False
            if not x.future.done():
                return True
        return False

    def resolved(self, b: Batch) -> None:
        """A stamped batch is acknowledged or failed: its partition's window moves past the
        resolved batches at its head."""
        window = self.window.get((b.topic, b.partition))
        while window and window[0].future.done():
            window.popleft()

    def refused(self, b: Batch, code: int, message: str, retry_backoff: float) -> None:
        """A batch refused for its sequence (``SEQUENCE_RESETS``: nothing was written). If an
        earlier batch of its partition is still unresolved, that one decides: this one is sent
        again with the same stamp after it. If none is, the partition's leader no longer follows
        this producer's sequence (it lost or expired the producer's state, or an earlier batch
        failed for good): a new epoch is needed (a new id when the epoch is exhausted or the id
        refused). Sets the batch's ``retry_at``; the sender requeues it."""
        b.unwritten = True
        tp = (b.topic, b.partition)
        if self.earlier_unresolved(b):
            b.retry_at = time.monotonic() + retry_backoff  # after the earlier one
        else:
            if tp not in self.broken:
                log.info("%s on %s-%d (%s): the partition moves to a new producer epoch once none of its "
                         "batches is in doubt", ErrorCode.of(code).name, b.topic, b.partition, message)
                self.broken.add(tp)
                if b.stamp[:2] == (self.producer_id, self.epoch):  # else the producer has bumped already
                    self.resets += 1
                    if code == ErrorCode.INVALID_PRODUCER_ID_MAPPING or self.epoch >= MAX_EPOCH:
                        self.producer_id, self.epoch = -1, 0  # InitProducerId before the next stamp
                    else:
                        self.epoch += 1
                    log.info("producer epoch bumped to %d (id %d)", self.epoch, self.producer_id)
            b.retry_at = time.monotonic()


class _Sender:
    """The sender thread's state and loop: everything here runs on that thread only. It takes
    closed batches from the accumulator (``drain``), sends them to their leaders through the
    connections it opens from the metadata (``cluster``), and resolves their futures; a
    transactional producer's ``txn`` (``_Transactions``) is set after construction."""

    def __init__(self, accumulator: RecordAccumulator, cluster: Cluster, *, acks: int, ack_timeout_ms: int,
                 idempotent: bool, retries: int, retry_backoff: float, max_in_flight: int,
                 max_in_flight_per_partition: int, max_request_size: int, request_timeout_ms: int, client_id: str):
        self.acc, self.cluster = accumulator, cluster
        self.txn: _Transactions | None = None
        self.acks, self.ack_timeout_ms, self.idempotent = acks, ack_timeout_ms, idempotent
        self.retries, self.retry_backoff = retries, retry_backoff
        self.max_in_flight, self.max_in_flight_per_partition = max_in_flight, max_in_flight_per_partition
        self.max_request_size, self.request_timeout_ms, self.client_id = max_request_size, request_timeout_ms, client_id
        self.conns: dict[int, Connection] = {}
        self.retry: list[Batch] = []  # encoded batches waiting to be sent (again)
        self.stopping = False
        self.stop_deadline: float | None = None
        self.metadata_wanted = False
        self.in_flight: dict[tuple, list] = {}  # (topic, partition) -> [node, batches, requests in flight]
        self.requests = self.batches = self.retried = 0
        self.idem = _Idempotence()  # the idempotent producer's per-partition state

    def stop(self, deadline: float | None) -> None:
        """Finish what is queued, giving up at ``deadline`` (monotonic; None: no limit)."""
        self.stop_deadline = deadline
        self.stopping = True

    def run(self) -> None:
        try:
            while True:
                earliest, seen, ready = self.acc.drain(time.monotonic(), force=self.stopping)
                self.retry.extend(ready)
                cluster = self.cluster
                if (self.metadata_wanted or cluster.stale()) and not cluster.refresh_due():
                    self._refresh_metadata()
                txn = self.txn
                if txn is not None:
                    txn.settle_early()
                self._send_ready()
                if txn is not None and txn._end is not None:
                    txn.send_end(self)
                if self.stopping:
                    if not self.retry and not any(c.in_flight for c in self.conns.values()):
                        break
                    if self.stop_deadline is not None and time.monotonic() > self.stop_deadline:
                        break
                self._wait(earliest, seen)
        except Exception as exc:  # a bug here must not leave callers waiting forever
            log.exception("producer sender thread failed")
            self._fail_everything(error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"producer sender thread failed: {exc!r}"))
        finally:
            for c in self.conns.values():
                c.close("producer closed")
            self._fail_everything(error_for(ErrorCode.REQUEST_TIMED_OUT, "producer closed before the record was sent"))

    def _wait(self, earliest: float | None, seen: int) -> None:
        """Sleep until an answer arrives, a linger or retry deadline passes, or a caller
        opens or closes a batch (the wake pipe)."""
        now = time.monotonic()
        timeout = IDLE_WAIT if earliest is None else max(0.0, earliest - now)
        if self.retry:
            # only a batch whose backoff is still running has a time to wake for: one due
            # already that ``_send_ready`` kept waits for an answer (its partition's, or room in
            # a connection's window), which wakes ``wait_any``; counting it was a busy loop
            adding = self.txn.adding if self.txn is not None else ()
            due = [b.retry_at for b in self.retry if b.retry_at > now
                   and not (self.idem.broken and self.idem.waits_for_switch(b)) and (b.topic, b.partition) not in adding]
            if due:
                timeout = min(timeout, max(0.0, min(due) - now))
        if self.metadata_wanted:
            timeout = min(timeout, self.cluster.refresh_due(now))
        conns = list(self.conns.values())
        early = self.txn.early_conn() if self.txn is not None else None
        if early is not None:
            conns.append(early)  # its answer lets the partition's batches go
        self.acc.sleep(conns, now, timeout, seen)

    # ---- sending ------------------------------------------------------------------------------------
    def _send_ready(self) -> None:
        """Group the sendable batches by leader into requests (in order), respecting
        max_in_flight, max_request_size and retry backoff.

        Per-partition order: the batches are in creation order (one open batch per partition
        at a time), and a batch that must wait (backoff, no leader) holds back every later
        batch of its partition; a partition with batches still in flight to another broker
        (its old leader) waits for their answers before anything goes to the new leader."""
        if not self.retry:
            return
        idem = self.idem
        if idem.broken:
            idem.switch_settled()
        broken = idem.broken  # their batches in doubt go (with their own stamp), nothing else
        txn = self.txn
        now = time.monotonic()
        cluster = self.cluster
        in_flight = self.in_flight
        pending, self.retry = self.retry, []  # callbacks fired while sending may requeue into self.retry
        waiting, by_node = [], {}
        held: set = set()  # partitions whose earlier batch waits
        for batch in pending:
            if now > batch.deadline:
                self._fail(batch, error_for(ErrorCode.REQUEST_TIMED_OUT,
                                            f"{batch.topic}-{batch.partition}: not acknowledged within "
                                            f"delivery_timeout_ms ({batch.attempts} attempts)"))
                continue
            tp = (batch.topic, batch.partition)
            if broken and idem.waits_for_switch(batch):
                waiting.append(batch)  # its partition's later batches in doubt may still go
                continue
            if txn is not None and tp not in txn.partitions:
                added = txn.add_state(tp)
                if added is None and txn.may_go_unverified(tp, cluster):
                    added = True  # the partition's leader holds it until the coordinator stored the partition
                if added is None:  # AddPartitionsToTxn in flight: the adder wakes us
                    held.add(tp)
                    waiting.append(batch)
                    continue
                if added is not True:
                    self._fail(batch, added)
                    continue
            leader = cluster.leader(batch.topic, batch.partition)
            if leader < 0:
                self.metadata_wanted = True
                batch.retry_at = max(batch.retry_at, now + self.retry_backoff)
            if batch.retry_at > now or tp in held:
                held.add(tp)
                waiting.append(batch)
                continue
            busy = in_flight.get(tp)
            if busy is not None and busy[0] != leader:
                held.add(tp)
                waiting.append(batch)
                continue
            by_node.setdefault(leader, []).append(batch)
        held_here = len(waiting)
        for node, batches in by_node.items():
            waiting.extend(self._send_to(node, batches))
        if self.retry:
            waiting.extend(self.retry)
        if self.retry or (held_here and len(waiting) > held_here):
            # Back in creation order: batches that went to ``_send_to`` but stayed (no connection,
            # limits) come after later batches of their partition that waited here (a retry time
            # a moment later). Out of order, an unstamped batch came before its partition's
            # stamped one in doubt, waited for room in the window that one holds, and held it
            # back: the partition sent nothing until delivery_timeout_ms (issue 16).
            waiting.sort(key=lambda b: b.created)
        self.retry = waiting

    def _send_to(self, node: int, batches: list) -> list:
        """Send batches to one broker in requests (up to ``max_in_flight`` of them, each at
        most ``max_request_size``); returns those that must wait. A partition with
        ``max_in_flight_per_partition`` requests in flight sends nothing more until one is
        answered, and a batch that does not fit holds back its partition's later ones."""
        conn = self._conn(node)
        if conn is None:
            retry_at = time.monotonic() + self.retry_backoff  # one time for all: they stay together
            for b in batches:
                b.retry_at = retry_at
            self.metadata_wanted = True
            return batches
        idempotent = self.idempotent
        if idempotent and self.idem.producer_id < 0 and self.txn is not None:
            for b in batches:  # a transactional producer's id comes from init_transactions() only
                self._fail(b, self.txn.not_ready_error())
            return []
        if idempotent and self.idem.producer_id < 0 and not self._init_producer_id():
            if self.idem.init_error is not None:  # the broker will never give an id: say so now
                for b in batches:
                    self._fail(b, self.idem.init_error)
                return []
            retry_at = time.monotonic() + self.retry_backoff
            for b in batches:
                b.retry_at = retry_at
            return batches
        limit, in_flight = self.max_in_flight_per_partition, self.in_flight
        window = self.idem.window
        while batches and conn.in_flight < self.max_in_flight:
            group, rest, size, held = [], [], 0, set()
            retried: dict = {}  # idempotence: tp -> whether its batches here include a retry
            fresh: dict = {}  # idempotence: tp -> batches here to be stamped (they join its window)
            for b in batches:
                tp = (b.topic, b.partition)
                busy = in_flight.get(tp)
                if tp in held or (busy is not None and busy[2] >= limit) or \
                        (group and size + len(b.data) > self.max_request_size) or \
                        (idempotent and tp in retried and (retried[tp] or b.attempts)) or \
                        (idempotent and b.stamp is None and len(window.get(tp, ())) + fresh.get(tp, 0) >= MAX_STAMPED):
                    held.add(tp)  # a retried batch goes alone: the broker knows a retry by its one batch
                    rest.append(b)
                    continue
                if idempotent:
                    retried[tp] = b.attempts > 0
                    if b.stamp is None:
                        fresh[tp] = fresh.get(tp, 0) + 1
                group.append(b)
                size += len(b.data)
            if not group:
                break
            self._send_request(conn, node, group)
            batches = rest
        return batches

    def _conn(self, node: int) -> Connection | None:
        return self.cluster.connect(self.conns, node, self.client_id, self.request_timeout_ms, log)

    def _send_request(self, conn: Connection, node: int, group: list) -> None:
        """One PRODUCE request: a frame per partition holding its batches concatenated."""
        frames, topics, layout = [], {}, []
        by_tp: dict[tuple, list] = {}
        for b in group:
            by_tp.setdefault((b.topic, b.partition), []).append(b)
            if self.idempotent and b.stamp is None:
                self.idem.stamp(b, self.txn is not None)
        for (topic, partition), bs in by_tp.items():
            topics.setdefault(topic, []).append({"index": partition, "frame": len(frames)})
            frames.append(bs[0].data if len(bs) == 1 else b"".join(b.data for b in bs))
            layout.append(((topic, partition), bs))
        body = {"acks": self.acks, "timeout_ms": self.ack_timeout_ms,
                "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
        txn = self.txn
        if txn is not None:
            body["transactional_id"] = txn.txn_id  # what the broker checks Write on (docs/SECURITY.md)
            if any(tp not in txn.partitions for tp, _ in layout):
                body["txn_unverified"] = True  # sent before AddPartitionsToTxn's answer (may_go_unverified)
        for b in group:
            b.attempts += 1
            b.unwritten = False
        in_flight = self.in_flight
        for tp, bs in layout:
            busy = in_flight.get(tp)
            if busy is None:
                in_flight[tp] = [node, len(bs), 1]
            else:
                busy[1] += len(bs)
                busy[2] += 1
        self.requests += 1
        self.batches += len(group)
        if self.acks == 0:
            conn.send(ApiKey.PRODUCE, body, frames, lambda frame, err: self._on_unacked(layout, err),
                      expect_response=False)
        else:
            conn.send(ApiKey.PRODUCE, body, frames, lambda frame, err: self._on_response(layout, frame, err, node))

    # ---- idempotence ----------------------------------------------------------------------------------
    def _init_producer_id(self) -> bool:
        """Ask any broker for a producer id (blocking the sender briefly, once per id)."""
        try:
            frame = self.cluster.request(ApiKey.INIT_PRODUCER_ID, {
                "transactional_id": None, "transaction_timeout_ms": 60000, "producer_id": -1, "producer_epoch": -1},
                timeout=self.request_timeout_ms / 1000)
        except OdradekError as exc:
            code, message = exc.code, exc.message
        else:
            body = frame.header.get("body") or {}
            code, message = body.get("error_code", 0), body.get("error_message") or ""
            if not code:
                self.idem.producer_id, self.idem.epoch = body["producer_id"], body["producer_epoch"]
                self.idem.init_error = None
                log.debug("producer id %d epoch %d", self.idem.producer_id, self.idem.epoch)
                return True
        if ErrorCode.of(code).retriable or code in NETWORK_ERRORS:
            log.info("InitProducerId failed (%s: %s); retrying after backoff", ErrorCode.of(code).name, message)
            return False
        self.idem.init_error = error_for(code, f"the broker refused InitProducerId, which the idempotent producer needs "
                                          f"({message or ErrorCode.of(code).meaning}); an older broker? "
                                          f"Pass enable_idempotence=False to send without it")
        return False

    def _refused_unwritten(self, b: Batch, code: int, message: str) -> bool:
        """A batch refused for its sequence (``SEQUENCE_RESETS``: nothing was written): sent
        again, after an earlier unresolved batch of its partition or with the partition moved
        to a new epoch (``_Idempotence.refused``). False if the batch may not be retried any
        more, or the producer is transactional (its epoch is the coordinator's: the
        transaction must abort)."""
        if b.attempts > self.retries or time.monotonic() + self.retry_backoff >= b.deadline:
            return False
        if self.txn is not None:
            return False
        self.idem.refused(b, code, message, self.retry_backoff)
        self.retried += 1
        self.retry.append(b)
        self.retry.sort(key=lambda x: x.created)
        return True

    # ---- answers ----------------------------------------------------------------------------------
    def _landed(self, layout: list) -> None:
        """A request's answer (or failure) arrived: its batches are no longer in flight."""
        in_flight = self.in_flight
        for tp, bs in layout:
            busy = in_flight.get(tp)
            if busy is not None:
                busy[1] -= len(bs)
                busy[2] -= 1
                if busy[2] <= 0:
                    del in_flight[tp]

    def _on_unacked(self, layout: list, err: OdradekError | None) -> None:
        self._landed(layout)
        for _, bs in layout:
            for b in bs:
                if err is None:
                    self._succeed(b, -1, None)
                else:
                    self._retry_or_fail(b, err)

    def _on_response(self, layout: list, frame, err: OdradekError | None, node: int) -> None:
        self._landed(layout)
        if err is not None:  # the whole request failed (connection lost, error body)
            if err.code in NETWORK_ERRORS:  # dead or silent (paused): ask the others for metadata first
                self.cluster.node_failed(node)
            for _, bs in layout:
                for b in bs:
                    self._retry_or_fail(b, err)
            return
        results = {}
        for t in frame.header["body"].get("topics", []):
            for part in t.get("partitions", []):
                results[(t["name"], part["index"])] = part
        for tp, bs in layout:
            part = results.get(tp)
            code = part.get("error_code", 0) if part is not None else ErrorCode.UNKNOWN_SERVER_ERROR
            if code:
                message = (part or {}).get("error_message") or ErrorCode.of(code).meaning
                e = error_for(code, f"produce to {tp[0]}-{tp[1]}: {message}")
                for b in bs:
                    if not (self.idempotent and code in SEQUENCE_RESETS and self._refused_unwritten(b, code, message)):
                        self._retry_or_fail(b, e)
                continue
            base = part.get("base_offset", -1)
            append_time = part.get("log_append_time_ms", -1)
            for b in bs:
                self._succeed(b, base, append_time)
                if base >= 0:
                    base += b.count

    def _retry_or_fail(self, batch: Batch, err: OdradekError) -> None:
        now = time.monotonic()
        if err.retriable and batch.attempts <= self.retries and now + self.retry_backoff < batch.deadline:
            if err.code in LEADER_ERRORS:
                self.metadata_wanted = True
            batch.retry_at = now + self.retry_backoff
            self.retried += 1
            self.retry.append(batch)
            self.retry.sort(key=lambda b: b.created)  # keep each partition's batches in order
            return
        self._fail(batch, err)

    def _succeed(self, batch: Batch, base: int, append_time) -> None:
        if batch.future.done():  # resolved once: a late answer for a failed batch changes nothing
            return
        batch.data = None  # handles may live on; the bytes need not
        batch.future.set_result((base, append_time))
        if batch.stamp is not None:
            self.idem.resolved(batch)
        self.acc.batch_done(batch)

    def _fail(self, batch: Batch, err: BaseException) -> None:
        if batch.future.done():
            return
        if self.txn is not None:
            self.txn.record_failed(err)
        batch.data = None
        batch.future.set_exception(err)
        if batch.stamp is not None:
            self.idem.resolved(batch)
        self.acc.batch_done(batch)

    def _fail_everything(self, err: OdradekError) -> None:
        for b in self.acc.incomplete():
            self._fail(b, err)
        self.retry = []

    def _refresh_metadata(self) -> None:
        """Ask any live broker (see ``Cluster``); refreshes stay ``retry_backoff_ms`` apart."""
        self.metadata_wanted = False
        cluster = self.cluster
        topics = sorted({b.topic for b in self.retry} | set(cluster.topics))
        if not topics:
            cluster.updated_at = time.monotonic()
            return
        try:
            cluster.refresh(topics, timeout=self.request_timeout_ms / 1000)
        except OdradekError as exc:
            log.info("metadata refresh failed (%s); retrying after backoff", exc)
            cluster.updated_at = time.monotonic()  # the periodic refresh waits; retries don't
            self.metadata_wanted = True
            retry_at = time.monotonic() + self.retry_backoff
            for b in self.retry:
                b.retry_at = max(b.retry_at, retry_at)
