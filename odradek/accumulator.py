"""The producer's record accumulator (Kafka's RecordAccumulator): the batches between ``send``
and the sender thread.

Runs in the client's process, shared by the producer's caller threads (``append``, ``flush``,
``close``) and its sender thread (``drain``, ``sleep``, ``batch_done``), under one lock. It
owns the per-partition batches being filled (one open batch per partition, a *sticky* one per
topic for keyless records), their readiness (``batch_size`` bytes, ``linger_ms`` age, a
flush), the closed and encoded batches waiting for the sender, the ``buffer_memory``
back-pressure on callers, and the wake-up pipe with which a caller tells a sleeping sender
that something changed. It is handed the metadata (``odradek.cluster.Cluster``, for the
sticky partition's choice) and the batch encoder; it opens no connection and sends nothing.
A transactional producer sets ``on_open(topic, partition)``, called (lock held) when a batch
opens, so the partition is added to the transaction while the batch fills.

    acc = RecordAccumulator(cluster, encode, linger=0.005, batch_size=65536, ...)
    handle = acc.append("orders", None, b"value", None, (), None, size, count)   # caller
    earliest, seen, ready = acc.drain(time.monotonic(), force=False)          # sender
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import random
import threading
import time
from typing import Callable

from odradek.errors import error_for
from odradek.core.protocol import ErrorCode
from odradek.network.connection import wait_any
from odradek.types import RecordMetadata

SPACE_RECHECK = 0.01  # seconds between checks of a caller blocked on buffer_memory
_now_ms = lambda: int(time.time() * 1000)  # noqa: E731


class Batch:
    """Records of one partition sent together; one Future for all of them."""

    __slots__ = ("topic", "partition", "rows", "keys", "size", "created", "base_ts", "stamps", "plain",
                 "future", "data", "count", "attempts", "retry_at", "deadline", "stamp", "unwritten")

    def __init__(self, topic: str, partition: int, now: float, delivery_timeout: float):
        self.topic = topic
        self.partition = partition
        self.rows: list = []  # a value alone (no headers, the batch's timestamp) or a full row tuple
        self.keys: list | None = None  # once a value alone has a key: each row's (None for the others)
        self.plain = True  # rows are values alone and keys, if any, all bytes (pack_rows need not look)
        self.size = 0
        self.created = now
        self.base_ts = _now_ms()
        self.stamps: dict | None = None  # index -> explicit timestamp (rare)
        self.future: concurrent.futures.Future = concurrent.futures.Future()
        self.data: bytes | None = None
        self.count = 0
        self.attempts = 0
        self.retry_at = 0.0
        self.deadline = now + delivery_timeout
        self.stamp: tuple | None = None  # idempotence: (producer id, epoch, base sequence) once sent
        self.unwritten = False  # idempotence: its last attempt was refused for its sequence, nothing written

    def max_timestamp(self) -> int:
        """The largest record timestamp (the broker's time index uses it)."""
        stamps = self.stamps
        if not stamps:
            return self.base_ts
        top = max(stamps.values())
        return top if len(stamps) == self.count else max(top, self.base_ts)

    def timestamp(self, index: int) -> int:
        if self.stamps and index in self.stamps:
            return self.stamps[index]
        return self.base_ts


class Slot:
    """One partition's open batch (None while it has none), kept current by the accumulator:
    the keyed fast path finds a key's partition and its batch in one lookup."""

    __slots__ = ("batch",)

    def __init__(self, batch: Batch | None):
        self.batch = batch


class FutureRecordMetadata:
    """The handle ``send`` returns: the ``concurrent.futures.Future`` interface for one record,
    over its batch's future. ``result()`` gives ``RecordMetadata``. Thread-safe."""

    __slots__ = ("_batch", "_index")  # set by append(); no __init__: it would double send()'s cost

    def _metadata(self, value) -> RecordMetadata:
        base, append_time = value
        b = self._batch
        ts = append_time if append_time is not None and append_time >= 0 else b.timestamp(self._index)
        return RecordMetadata(b.topic, b.partition, base + self._index if base >= 0 else -1, ts)

    def result(self, timeout: float | None = None) -> RecordMetadata:
        """Wait for the acknowledgement; raises the broker's error, or ``TimeoutError``."""
        return self._metadata(self._batch.future.result(timeout))

    get = result  # kafka-python's name

    def exception(self, timeout: float | None = None) -> BaseException | None:
        return self._batch.future.exception(timeout)

    def done(self) -> bool:
        return self._batch.future.done()

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        """Records cannot be taken back once sent to the producer: always False."""
        return False

    def running(self) -> bool:
        return not self._batch.future.done()

    def add_done_callback(self, fn) -> None:
        """``fn(handle)`` once the record is acknowledged or failed (on the sender thread, or
        at once if already done); like ``Future.add_done_callback``."""
        self._batch.future.add_done_callback(lambda _f: fn(self))

    @property
    def topic(self) -> str:
        return self._batch.topic

    @property
    def partition(self) -> int:
        return self._batch.partition

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<FutureRecordMetadata {self.topic}-{self.partition}#{self._index} {state}>"


class RecordAccumulator:
    """The batches of one producer (see the module doc). ``encode(rows, keys, base_ts, max_ts, plain)``
    makes a closed batch's bytes (``producer.encode_rows``); ``cluster`` answers ``partitions(topic)``."""

    def __init__(self, cluster, encode: Callable[[list, list | None, int, int, bool], bytes], *, linger: float,
                 batch_size: int, buffer_memory: int, max_block: float, delivery_timeout: float):
        self.cluster = cluster
        self.encode = encode
        self.linger = linger
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self.max_block = max_block
        self.delivery_timeout = delivery_timeout
        self.lock = threading.Lock()
        self._acquire, self._release = self.lock.acquire, self.lock.release  # the hot path's
        self._space = threading.Condition(self.lock)  # buffer_memory back-pressure
        self._sticky: dict[str, Batch] = {}  # topic -> open batch of its sticky partition
        self._open: dict[tuple, Batch] = {}  # (topic, partition) -> open batch
        self._last_sticky: dict[str, int] = {}  # topic -> its previous sticky partition
        self._slots: dict[tuple, Slot] = {}  # (topic, partition) -> its slot, once a keyed record asked
        self._ready: collections.deque = collections.deque()  # closed and encoded, for the sender
        self._incomplete: set = set()  # batches whose future is not done (the sender discards)
        self._queued = 0  # bytes closed into batches (callers, under the lock)
        self._freed = 0  # bytes of resolved batches (the sender alone writes it: no lock)
        self._space_waiters = 0  # callers blocked on buffer_memory
        self.closed = False
        self._sender_sleeping = False
        self._sender_wake_at = float("inf")  # when the sleeping sender wakes anyway; inf while awake
        self._sender_awaits_answer = False  # it sleeps with requests in flight
        self._changes = 0  # bumped by every _wake_sender call
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # called with the lock held when a batch opens (a transactional producer adds the partition
        # to its transaction meanwhile); it must not block or take this lock
        self.on_open: Callable[[str, int], None] | None = None

    @property
    def buffered(self) -> int:
        """Bytes closed into batches and not yet resolved."""
        return self._queued - self._freed

    # ---- callers ----------------------------------------------------------------------------------
    def append(self, topic: str, partition: int | None, value, key, headers, timestamp_ms, size: int,
               count: int = 0) -> FutureRecordMetadata | None:
        """Add one record to the open batch of its partition (``partition`` None: the topic's
        sticky batch) and close the batch once it holds ``batch_size`` bytes. With ``count``
        0 (the caller has not looked at the metadata) it returns None when there is no open
        batch; with the topic's partition ``count`` it opens one (blocking up to
        ``max_block`` on ``buffer_memory``)."""
        self._acquire()  # not ``with``: 80 ns a record less (its __exit__ call costs as much as the lock)
        try:
            if partition is None:
                batch = self._sticky.get(topic)
                if batch is None:
                    if not count:
                        return None
                    batch = self._sticky[topic] = self._new_sticky_batch(topic, count)
            else:
                batch = self._open.get((topic, partition))
                if batch is None:
                    if not count:
                        return None
                    batch = self._new_batch(topic, partition)
            rows = batch.rows
            index = len(rows)
            keys = batch.keys
            if timestamp_ms is None and not headers and value.__class__ is bytes:  # pack_rows' fast path
                rows.append(value)  # no tuple per record: its key, if any, goes in keys
                if key is not None:
                    if keys is None:
                        keys = batch.keys = [None] * index
                        if index:
                            batch.plain = False
                    keys.append(key)
                elif keys is not None:
                    keys.append(None)
                    batch.plain = False
            else:
                batch.plain = False
                if timestamp_ms is None:
                    rows.append((index, 0, key, value, headers))
                else:
                    if batch.stamps is None:
                        batch.stamps = {}
                    batch.stamps[index] = timestamp_ms
                    rows.append((index, timestamp_ms - batch.base_ts, key, value, headers))
                if keys is not None:
                    keys.append(None)  # the row carries its key
            batch.size += size
            if batch.size >= self.batch_size:
                self._close_batch(batch)
        finally:
            self._release()
        handle = FutureRecordMetadata()
        handle._batch = batch
        handle._index = index
        return handle

    def append_keyed(self, slot: Slot, value: bytes, key: bytes, size: int) -> FutureRecordMetadata | None:
        """``append`` of a keyed value (no headers, no timestamp) to the open batch of the
        partition whose slot this is; None when that partition has none. Its last lines are
        ``append``'s, inlined on purpose: a shared helper costs a call per record (~50 ns, a
        tenth of a record's cost in ``send``)."""
        self._acquire()
        try:
            batch = slot.batch
            if batch is None:
                return None
            rows = batch.rows
            index = len(rows)
            rows.append(value)
            keys = batch.keys
            if keys is None:
                keys = batch.keys = [None] * index
                if index:
                    batch.plain = False
            keys.append(key)
            batch.size += size
            if batch.size >= self.batch_size:
                self._close_batch(batch)
        finally:
            self._release()
        handle = FutureRecordMetadata()
        handle._batch = batch
        handle._index = index
        return handle

    def slot(self, topic: str, partition: int) -> Slot:
        """The slot of a partition (``append_keyed``), made on first use."""
        with self.lock:
            slot = self._slots.get((topic, partition))
            if slot is None:
                slot = self._slots[(topic, partition)] = Slot(self._open.get((topic, partition)))
            return slot

    def flush_futures(self) -> list:
        """Close every open batch (linger or not); the futures of every unresolved batch. The set
        is copied in one C call first: the sender's ``batch_done`` shrinks it without the lock,
        and a Python loop over it can be switched out mid-iteration."""
        with self.lock:
            self._close_lingering(time.monotonic(), force=True)
            return [b.future for b in list(self._incomplete)]

    def drained(self) -> bool:
        """No batch open, none closed and not yet taken by the sender (``drain``)."""
        with self.lock:
            return not self._ready and not self._open

    def close(self) -> None:
        """No new batches: a caller blocked on ``buffer_memory`` gives up; the sender wakes."""
        with self.lock:
            self.closed = True
            self._space.notify_all()
            self._wake_sender()

    def wake(self) -> None:
        """Wake the sender whatever it waits for."""
        os.write(self._wake_w, b"x")

    def release(self) -> None:
        """Close the wake-up pipe (after the sender thread ended)."""
        os.close(self._wake_r)
        os.close(self._wake_w)

    # ---- batches (all under the lock) ----------------------------------------------------------------
    def _new_sticky_batch(self, topic: str, count: int) -> Batch:
        """A batch on a random partition that has a leader, avoiding the last sticky one."""
        parts = self.cluster.partitions(topic) or ()
        live = [p.partition for p in parts if p.leader >= 0] or list(range(count))
        previous = self._last_sticky.get(topic)
        if len(live) > 1 and previous in live:
            live.remove(previous)
        partition = self._last_sticky[topic] = random.choice(live)
        batch = self._open.get((topic, partition))
        return batch if batch is not None else self._new_batch(topic, partition)

    def _new_batch(self, topic: str, partition: int) -> Batch:
        deadline = time.monotonic() + self.max_block
        while self._queued - self._freed >= self.buffer_memory and not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise error_for(ErrorCode.REQUEST_TIMED_OUT,
                                f"buffer_memory ({self.buffer_memory} bytes) stayed full for "
                                f"max_block_ms: the brokers are not keeping up, or are unreachable")
            self._space_waiters += 1
            self._space.wait(min(left, SPACE_RECHECK))  # the sender notifies without the lock: recheck
            self._space_waiters -= 1
        now = time.monotonic()
        batch = Batch(topic, partition, now, self.delivery_timeout)
        self._open[(topic, partition)] = batch
        slot = self._slots.get((topic, partition))
        if slot is not None:
            slot.batch = batch
        if self.on_open is not None:
            self.on_open(topic, partition)
        self._incomplete.add(batch)
        if now + self.linger < self._sender_wake_at:  # else the sender wakes in time anyway
            self._wake_sender()
        return batch

    def _close_batch(self, batch: Batch, encode: bool = True) -> None:
        """Take a batch out of the open ones and queue it for the sender, lock held, so batches
        are queued in order. A caller that closes a batch (it filled it, or ``flush``) encodes
        it here: the sender thread is left with I/O alone and does not need the GIL back from a
        busy caller for every batch. The sender closing lingering batches (``encode`` False)
        encodes them in ``drain`` after the lock is released: encoding under the lock kept
        callers waiting for it (keyed records over 30 partitions close most batches by linger;
        ``append`` spent a quarter of its time waiting for this lock)."""
        tp = (batch.topic, batch.partition)
        del self._open[tp]
        slot = self._slots.get(tp)
        if slot is not None:
            slot.batch = None
        if self._sticky.get(batch.topic) is batch:
            del self._sticky[batch.topic]
        self._queued += batch.size
        batch.count = len(batch.rows)
        if encode and not self._encode(batch, locked=True):
            return
        self._ready.append(batch)
        self._wake_sender(unless_answer_due=True)

    def _encode(self, batch: Batch, locked: bool) -> bool:
        """Encode a closed batch's rows into ``batch.data``; False (its future failed, its bytes
        freed) if that raised. ``locked``: the caller holds the lock (else the batch is the
        sender's alone, and only the failure's bookkeeping takes the lock)."""
        rows, keys, batch.rows, batch.keys = batch.rows, batch.keys, None, None
        try:
            batch.data = self.encode(rows, keys, batch.base_ts, batch.max_timestamp(), batch.plain)
            return True
        except Exception as exc:  # a bug, not bad input (send() checked it): fail these records only
            batch.future.set_exception(error_for(ErrorCode.UNKNOWN_SERVER_ERROR, f"cannot encode a batch: {exc!r}"))
            if locked:
                self._forget(batch)
            else:
                with self.lock:
                    self._forget(batch)
            return False

    def _forget(self, batch: Batch) -> None:
        self._incomplete.discard(batch)
        self._queued -= batch.size

    def _close_lingering(self, now: float, force: bool, encode: bool = True) -> float | None:
        """Close open batches older than linger (all if ``force``); returns the earliest
        remaining linger deadline. Called by the sender and by flush, with the lock held."""
        earliest = None
        for batch in list(self._open.values()):
            due = batch.created + self.linger
            if force or due <= now:
                self._close_batch(batch, encode)
            elif earliest is None or due < earliest:
                earliest = due
        return earliest

    def _wake_sender(self, unless_answer_due: bool = False) -> None:
        """Tell the sender something changed (a batch opened or closed). Called with the lock
        held. The counter closes the gap between the sender's last look and its sleep: it
        does not sleep if the counter moved since it computed its deadline.

        ``unless_answer_due``: a sender sleeping on requests in flight wakes at their answer
        and sends what is ready then; not waking it early saves a GIL round trip per batch
        under load (the waker loses the GIL to the woken thread for up to 5 ms)."""
        self._changes += 1
        if self._sender_sleeping and not (unless_answer_due and self._sender_awaits_answer):
            self._sender_sleeping = False
            try:
                os.write(self._wake_w, b"x")
            except (BlockingIOError, OSError):
                pass

    # ---- the sender thread -------------------------------------------------------------------------
    def drain(self, now: float, force: bool) -> tuple[float | None, int, list]:
        """Close the batches whose linger has passed (all if ``force``) and take the closed
        ones: ``(earliest remaining linger deadline, change count seen, batches)``; the
        change count is ``sleep``'s ``seen``."""
        with self.lock:
            earliest = self._close_lingering(now, force, encode=False)
            seen = self._changes
            ready = list(self._ready)
            self._ready.clear()
        if any(b.data is None for b in ready):  # closed by linger just now: encoded here, unlocked
            ready = [b for b in ready if b.data is not None or self._encode(b, locked=False)]
        return earliest, seen, ready

    def sleep(self, conns: list, now: float, timeout: float, seen: int) -> None:
        """Wait on the connections up to ``timeout`` (``wait_any``), or less: a caller who opens
        or closes a batch wakes the sender, and it does not sleep at all if that happened
        since ``drain`` returned ``seen``. ``now``: when ``timeout`` was computed."""
        self._sender_wake_at = now + timeout
        self._sender_awaits_answer = any(c.in_flight for c in conns)
        self._sender_sleeping = True
        if self._changes != seen or timeout == 0.0:
            self._sender_sleeping = False
            timeout = 0.0
        woke = wait_any(conns, timeout, self._wake_r)
        self._sender_sleeping = False
        self._sender_wake_at = float("inf")
        if woke:
            try:
                os.read(self._wake_r, 4096)
            except BlockingIOError:
                pass

    def batch_done(self, batch: Batch) -> None:
        """The sender resolved a batch: free its bytes. Lock-free (set.discard is atomic and
        only the sender writes ``_freed``); the lock is taken only to wake a blocked caller."""
        self._incomplete.discard(batch)
        self._freed += batch.size
        if self._space_waiters:
            with self.lock:
                self._space.notify_all()

    def incomplete(self) -> list:
        """Every batch whose future is not done (for failing them all)."""
        with self.lock:
            return list(self._incomplete)
