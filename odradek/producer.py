"""Producer: batches records per partition and sends them from a background thread
(docs/CLIENT.md, "Producer", says what each setting does and how).

    with Producer("127.0.0.1:9092", acks=1, linger_ms=5) as p:
        handle = p.send("orders", b"value", key=b"customer-42")
        print(handle.result(timeout=10))      # RecordMetadata(topic, partition, offset, timestamp)

Threads: the callers' (``send``, ``flush``, ``close``; any number may share one producer), one
sender thread, started by the constructor, that owns every broker connection, and for a
transactional producer the *adder* thread. Between them the record accumulator
(``odradek/accumulator.py``) holds the batches under its lock; whichever thread closes a batch
encodes it; only the sender thread writes requests, reads answers and resolves futures (so
``add_done_callback`` functions run on it).
Owns: the API (``Producer``) and the hot path (``send``: a record to its partition's open
batch, a ``FutureRecordMetadata`` back); ``producer_encoding`` has the partitioner and a
batch's bytes, ``producer_sender`` the sender and idempotence, ``producer_txn`` transactions.
Invariants: a partition's records land in ``send`` order through every retry; with
idempotence (on by default) each is stored once whatever the retries; a transactional
producer never bumps its epoch itself, and once fenced (PRODUCER_FENCED,
INVALID_PRODUCER_EPOCH) raises ``ProducerFencedError`` on every later call; ``send`` blocks
(at most ``max_block_ms``) only for a topic's first metadata and when ``buffer_memory`` is full.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Optional

from odradek.accumulator import FutureRecordMetadata, RecordAccumulator
from odradek.network.clientauth import ClientSecurity
from odradek.core.protocol import ErrorCode
from odradek.cluster import Cluster
from odradek.errors import error_for
# murmur2, pack_rows and TransactionAbortableError are re-exported: odradek.producer's public names
from odradek.producer_encoding import CODECS, encode_rows, murmur2, pack_rows, partition_for_key  # noqa: F401
from odradek.producer_sender import _Sender
from odradek.producer_txn import TransactionAbortableError, _Transactions  # noqa: F401


RECORD_OVERHEAD = 8  # bytes counted per record besides key and value (msgpack row framing)
KEY_MEMO = 65536  # keys per topic whose partition the producer remembers (then it starts over)
ACK_TIMEOUT_MARGIN_MS = 1000  # the broker's acks=all wait ends this much before our request timeout


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
        # Requests of one partition in flight at once. Without idempotence one, which keeps the
        # partition's order through every retry (nothing sent after a refused request can
        # overtake it). With it, as many as the connection allows (at most 5, as in Kafka): the
        # leader refuses a batch whose sequence does not follow the last it wrote, so a request
        # after a refused one cannot overtake it, and retries go one at a time (``_send_to``).
        self.max_in_flight_per_partition = max_in_flight if self.idempotent else 1
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
            self._cluster,
            lambda rows, keys, base_ts, max_ts, plain: encode_rows(rows, base_ts, max_ts, compression, keys, plain),
            linger=self.linger, batch_size=batch_size, buffer_memory=buffer_memory, max_block=self.max_block,
            delivery_timeout=self.delivery_timeout)
        self._append = self._acc.append  # bound once: send() calls it per record
        self._append_keyed = self._acc.append_keyed
        # topic -> {key: the accumulator's slot of its partition}: the keyed fast path's memo
        # of murmur2, KEY_MEMO keys each, computed for the partition count in _key_counts. A
        # metadata answer that changes a topic's count (or drops it) drops its memo at once
        # (``_drop_stale_keys``, a Cluster.on_topics hook), so send() checks nothing more.
        self._key_slots: dict[str, dict] = {}
        self._key_counts: dict[str, int] = {}
        self._cluster.on_topics.append(self._drop_stale_keys)
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
        keyed: a key seen before, ``_key_slots``, straight to its partition's slot) goes to the
        accumulator if its batch is open; everything else is checked, given its partition and
        then appended the same way."""
        if partition is None and headers is None and timestamp_ms is None and value.__class__ is bytes:
            if key is None:
                handle = self._append(topic, None, value, None, (), None, len(value) + RECORD_OVERHEAD)
                if handle is not None:
                    return handle
            elif key.__class__ is bytes:
                slots = self._key_slots.get(topic)
                if slots is not None:
                    slot = slots.get(key)
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
        """``partition_for_key``, remembered for the fast path in ``send`` (``_key_slots``)."""
        partition = partition_for_key(key, count)
        slots = self._key_slots.get(topic)
        if slots is None or self._key_counts.get(topic) != count or len(slots) >= KEY_MEMO:
            self._key_counts[topic] = count
            slots = self._key_slots[topic] = {}
        slots[key] = self._acc.slot(topic, partition)
        # A metadata answer merged on the sender's thread since ``count`` was read: its hook
        # ran before or after the line above; this check covers the first case.
        if len(self._cluster.partitions(topic) or ()) != count:
            self._key_slots.pop(topic, None)
        return partition

    def _drop_stale_keys(self, topics: dict) -> None:
        """Cluster.on_topics: drop the memo of a topic whose partition count changed or that
        the metadata no longer names (a count change moves keys: murmur2 mod the count)."""
        for topic in list(self._key_slots):  # list(): one C call, while send() may add a topic
            meta = topics.get(topic)
            if meta is None or meta.error_code or len(meta.partitions) != self._key_counts.get(topic):
                self._key_slots.pop(topic, None)

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

