"""What the fault tests check, and the load they run while faults happen.

- ``replica_batches(data_dir, topic, partition, upto)``: ``(base_offset, last_offset, epoch,
  crc)`` of every batch of one replica's log below ``upto``, read from the broker's own
  segment files (``odradek.chaos.replicas``; a torn or zero-filled tail ends the walk).
- ``assert_replicas_identical(cluster, topic, partitions)``: every replica of each partition
  holds the same batches (offsets and CRC) up to the high watermark, and all of them.
- ``AckedLog``: filled from producer futures, only with acknowledged records
  ``(partition, offset) -> value``; ``ConsumedLog``: what consumers received.
- ``check_logs(acked, consumed)``: every acknowledged record consumed at its offset, no
  offset holding two different values.
- ``Workload``: producer threads (acks=all) and a consumer group running in the background.
"""
from __future__ import annotations

import threading
import time

from odradek import Consumer, Producer, TopicPartition
from odradek.chaos.replicas import high_watermarks, replica_batches, replica_problems  # noqa: F401 - re-exported


# ---- replica files (odradek.chaos.replicas: the chaos checker reads them the same way) -------------
def assert_replicas_identical(cluster, topic: str, partitions, upto=None, timeout: float = 30.0) -> dict[int, int]:
    """Every replica of each partition holds byte-identical batches (by offset and CRC) up to
    ``upto`` (an int, ``{partition: offset}``, or None: the high watermark). Retries for
    ``timeout`` seconds (followers catch up asynchronously), then fails listing every
    difference. Returns the offsets compared up to."""
    partitions = list(partitions)
    deadline = time.monotonic() + timeout
    while True:
        problems = []
        try:
            if upto is None:
                bounds = high_watermarks(cluster.bootstrap, topic, partitions)
            elif isinstance(upto, dict):
                bounds = dict(upto)
            else:
                bounds = {p: upto for p in partitions}
            assignment = cluster.topic_assignment(topic) or {}
            for p in partitions:
                replicas = assignment.get(p)
                if not replicas:
                    problems.append(f"{topic}-{p}: no assignment in ZooKeeper")
                    continue
                views = {b: replica_batches(cluster.broker(b).data_dir, topic, p, bounds[p]) for b in replicas}
                reference = cluster.leader(topic, p)
                reference = reference if reference in views else replicas[0]
                problems += [f"{topic}-{p}: {msg}" for msg in replica_problems(views, reference, bounds[p])]
        except Exception as exc:  # noqa: BLE001 - a broker still electing: retried
            problems = [f"could not compare replicas: {exc!r}"]
        if not problems:
            return bounds
        if time.monotonic() > deadline:
            raise AssertionError("replicas differ:\n  " + "\n  ".join(problems))
        time.sleep(0.5)


# ---- what was acknowledged, what was consumed ------------------------------------------------------
class _OffsetLog:
    """``(partition, offset) -> value`` under a lock, noting every offset seen with two values."""

    def __init__(self):
        self.lock = threading.Lock()
        self.records: dict[tuple[int, int], bytes] = {}
        self.conflicts: list[tuple] = []

    def add(self, partition: int, offset: int, value: bytes) -> None:
        with self.lock:
            prev = self.records.setdefault((partition, offset), value)
            if prev != value:
                self.conflicts.append((partition, offset, prev, value))

    def __len__(self) -> int:
        return len(self.records)

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.records)


class AckedLog(_OffsetLog):
    """Acknowledged records only. ``track(future, value)`` after each ``send``: on success the
    record's (partition, offset) gets its value; failures are counted (with their error),
    never entered. Two acknowledgements of one offset with different values are a conflict:
    an acknowledged record was overwritten."""

    def __init__(self):
        super().__init__()
        self.sent = 0
        self.failed: list[tuple[bytes, BaseException]] = []

    def track(self, future, value: bytes) -> None:
        with self.lock:
            self.sent += 1

        def done(handle) -> None:
            exc = handle.exception(0)
            if exc is not None:
                with self.lock:
                    self.failed.append((value, exc))
                return
            md = handle.result(0)
            self.add(md.partition, md.offset, value)

        future.add_done_callback(done)


class ConsumedLog(_OffsetLog):
    """Records consumers received (a record delivered twice after a rebalance is fine; the
    same offset with another value is not)."""


def check_logs(acked: AckedLog, consumed: ConsumedLog) -> list[str]:
    """Problems: acknowledged records not consumed (or consumed with another value at their
    offset), offsets with two values on either side."""
    problems = [f"offset {p}:{o} acknowledged with two values: {a!r} then {b!r}" for p, o, a, b in acked.conflicts]
    problems += [f"offset {p}:{o} consumed with two values: {a!r} and {b!r}" for p, o, a, b in consumed.conflicts]
    got = consumed.snapshot()
    missing = [(k, v) for k, v in sorted(acked.snapshot().items()) if got.get(k) != v]
    for (p, o), v in missing[:20]:
        problems.append(f"acknowledged {v!r} at {p}:{o}, consumed {got.get((p, o))!r}")
    if len(missing) > 20:
        problems.append(f"... {len(missing)} acknowledged records in all not consumed as acknowledged")
    return problems


def wait_consumed(acked: AckedLog, consumed: ConsumedLog, timeout: float = 30.0) -> None:
    """Wait until every acknowledged record was consumed at its offset, then assert that no
    problem is left (the assertion lists them)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = consumed.snapshot()
        if all(got.get(k) == v for k, v in acked.snapshot().items()):
            break
        time.sleep(0.2)
    problems = check_logs(acked, consumed)
    assert not problems, "\n  ".join([f"{len(acked)} acknowledged, {len(consumed)} consumed:"] + problems)


def read_all(bootstrap: str, topic: str, partitions, timeout: float = 30.0) -> ConsumedLog:
    """Every record of the partitions up to their current high watermarks, with a fresh
    consumer (no group): what a new reader sees."""
    out = ConsumedLog()
    ends = high_watermarks(bootstrap, topic, partitions)
    with Consumer(bootstrap, auto_offset_reset="earliest", request_timeout_ms=10000) as c:
        c.assign([TopicPartition(topic, p) for p in partitions])
        deadline = time.monotonic() + timeout
        while any(c.position(TopicPartition(topic, p)) < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise AssertionError(f"read_all: did not reach the high watermarks {ends} in {timeout:.0f}s")
            for r in c.poll(timeout_ms=200):
                out.add(r.partition, r.offset, r.value)
    return out


# ---- the background load ------------------------------------------------------------------------
class Workload:
    """``producers`` threads sending acks=all records (``b"<name>-<seq>"``, no key: sticky
    partitions spread them) at about ``rate`` records/s each, and ``consumers`` members of
    consumer group ``group`` reading the topic; all running until ``stop``.

        with Workload(cluster.bootstrap, "t") as load:
            ...fault...
            load.stop_producers()
            load.wait_consumed()        # every acknowledged record consumed, no offset twice
    """

    def __init__(self, bootstrap: str, topic: str, producers: int = 2, consumers: int = 2, group: str = "checker",
                 rate: float = 200.0, producer_settings: dict | None = None):
        self.bootstrap = bootstrap
        self.topic = topic
        self.acked = AckedLog()
        self.consumed = ConsumedLog()
        self.errors: list[str] = []  # client exceptions seen in the threads (they retry)
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self._interval = 1.0 / rate
        self._producer_settings = {"acks": "all", "linger_ms": 5, "request_timeout_ms": 10000,
                                   "delivery_timeout_ms": 60000, "retry_backoff_ms": 100,
                                   **(producer_settings or {})}
        self._producers = [threading.Thread(target=self._produce, args=(f"p{i}",), daemon=True)
                           for i in range(producers)]
        self._consumers = [threading.Thread(target=self._consume, args=(group, f"c{i}"), daemon=True)
                           for i in range(consumers)]

    def __enter__(self) -> "Workload":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Workload":
        for t in self._consumers + self._producers:
            t.start()
        return self

    def _produce(self, name: str) -> None:
        try:
            producer = Producer(self.bootstrap, client_id=f"workload-{name}", **self._producer_settings)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.errors.append(f"{name}: {exc!r}")
            return
        seq = 0
        try:
            while not self._stop_producing.is_set():
                value = f"{name}-{seq}".encode()
                try:
                    self.acked.track(producer.send(self.topic, value), value)
                    seq += 1
                except Exception as exc:  # noqa: BLE001 - send itself refused (buffer, metadata)
                    self.errors.append(f"{name} send: {exc!r}")
                    time.sleep(0.2)
                time.sleep(self._interval)
            try:
                producer.flush(timeout=90)
            except Exception as exc:  # noqa: BLE001
                self.errors.append(f"{name} flush: {exc!r}")
        finally:
            producer.close(timeout=10)

    def _consume(self, group: str, name: str) -> None:
        try:
            consumer = Consumer(self.bootstrap, group_id=group, client_id=f"workload-{name}",
                                auto_offset_reset="earliest", enable_auto_commit=True, auto_commit_interval_ms=500,
                                session_timeout_ms=6000, heartbeat_interval_ms=500, request_timeout_ms=10000)
            consumer.subscribe([self.topic])
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"{name}: {exc!r}")
            return
        try:
            while not self._stop_consuming.is_set():
                try:
                    for r in consumer.poll(timeout_ms=200):
                        self.consumed.add(r.partition, r.offset, r.value)
                except Exception as exc:  # noqa: BLE001 - a broker going away: keep polling
                    self.errors.append(f"{name} poll: {exc!r}")
                    time.sleep(0.2)
        finally:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001
                pass

    def wait_acked(self, count: int, timeout: float = 30.0) -> None:
        """Wait for ``count`` more acknowledged records than now (the load is flowing)."""
        target = len(self.acked) + count
        deadline = time.monotonic() + timeout
        while len(self.acked) < target:
            if time.monotonic() > deadline:
                raise AssertionError(f"only {len(self.acked)} of {target} records acknowledged in {timeout:.0f}s "
                                     f"(failed: {len(self.acked.failed)}; errors: {self.errors[-3:]})")
            time.sleep(0.05)

    def stop_producers(self, timeout: float = 120.0) -> None:
        """Stop sending; wait for every record in flight to be acknowledged or failed."""
        self._stop_producing.set()
        for t in self._producers:
            t.join(timeout)

    def wait_consumed(self, timeout: float = 30.0) -> None:
        try:
            wait_consumed(self.acked, self.consumed, timeout)
        except AssertionError as exc:
            tail = "\n  ".join(self.errors[-10:])
            raise AssertionError(f"{exc}\nlast client errors ({len(self.errors)} in all):\n  {tail}") from None

    def stop(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for t in self._producers + self._consumers:
            t.join(30)
