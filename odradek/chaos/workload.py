"""The chaos load and its history: every send, acknowledgement, failure and poll, timed.

Runs as threads of the chaos runner's process (the ``odradek chaos`` command or the test).
``History`` is an append-only list of events under a lock, each a dict with ``t`` (seconds
since the run began) and ``type``:

- ``send`` ``{value}``; ``ack`` ``{value, partition, offset}``; ``fail`` ``{value, error}``;
- ``poll`` ``{reader, mode ("group" | "assign"), generation, records: [[partition, offset, value]]}``
  (``generation`` counts the assignments a group member saw: a rebalance may move a
  member's position back to the committed offset, which is not a non-monotonic poll);
- ``fault`` / ``heal`` ``{name, detail}`` (written by the nemesis);
- ``client_error`` ``{who, error}``.

``Workload`` runs ``producers`` threads sending unique integers (one counter for all, so a
value names one send), acks=all, ``consumers`` members of one group and one reader that
assigns itself every partition from the beginning and never rebalances.
"""
from __future__ import annotations

import itertools
import json
import threading
import time

from odradek import Consumer, Producer, TopicPartition


class History:
    def __init__(self):
        self.began = time.monotonic()
        self.lock = threading.Lock()
        self.events: list[dict] = []

    def now(self) -> float:
        return round(time.monotonic() - self.began, 4)

    def add(self, type_: str, **fields) -> None:
        event = {"t": self.now(), "type": type_, **fields}
        with self.lock:
            self.events.append(event)

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.events)

    def dump(self, path: str) -> None:
        with open(path, "w") as f:
            for e in self.snapshot():
                f.write(json.dumps(e) + "\n")

    @staticmethod
    def load(path: str) -> list[dict]:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]


PRODUCER_SETTINGS = {"acks": "all", "linger_ms": 5, "request_timeout_ms": 10000, "delivery_timeout_ms": 120000,
                     "retry_backoff_ms": 100}
CONSUMER_SETTINGS = {"auto_offset_reset": "earliest", "request_timeout_ms": 10000}


class Workload:
    def __init__(self, bootstrap: str, topic: str, partitions: int, history: History, producers: int = 2,
                 consumers: int = 2, rate: float = 100.0, group: str = "chaos"):
        self.bootstrap, self.topic, self.partitions = bootstrap, topic, partitions
        self.history = history
        self.group = group
        self._values = itertools.count()
        self._values_lock = threading.Lock()
        self._interval = 1.0 / rate
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self._producers = [threading.Thread(target=self._produce, args=(f"p{i}",), daemon=True)
                           for i in range(producers)]
        self._readers = [threading.Thread(target=self._consume, args=(f"c{i}", "group"), daemon=True)
                         for i in range(consumers)]
        self._readers.append(threading.Thread(target=self._consume, args=("reader", "assign"), daemon=True))

    def start(self) -> "Workload":
        for t in self._readers + self._producers:
            t.start()
        return self

    def _next_value(self) -> int:
        with self._values_lock:
            return next(self._values)

    def _error(self, who: str, exc: BaseException) -> None:
        self.history.add("client_error", who=who, error=f"{type(exc).__name__}: {exc}"[:300])

    def _produce(self, name: str) -> None:
        try:
            producer = Producer(self.bootstrap, client_id=f"chaos-{name}", **PRODUCER_SETTINGS)
        except Exception as exc:  # noqa: BLE001 - in the history; the checker reports it
            self._error(name, exc)
            return
        try:
            while not self._stop_producing.is_set():
                value = self._next_value()
                self.history.add("send", value=value)
                try:
                    future = producer.send(self.topic, str(value).encode())
                except Exception as exc:  # noqa: BLE001 - refused before sending (buffer, metadata)
                    self.history.add("fail", value=value, error=f"{type(exc).__name__}: {exc}"[:300])
                    time.sleep(0.2)
                    continue
                future.add_done_callback(lambda f, v=value: self._done(f, v))
                time.sleep(self._interval)
            try:
                producer.flush(timeout=150)
            except Exception as exc:  # noqa: BLE001
                self._error(name, exc)
        finally:
            producer.close(timeout=10)

    def _done(self, future, value: int) -> None:
        exc = future.exception(0)
        if exc is not None:
            self.history.add("fail", value=value, error=f"{type(exc).__name__}: {exc}"[:300])
        else:
            md = future.result(0)
            self.history.add("ack", value=value, partition=md.partition, offset=md.offset)

    def _consume(self, name: str, mode: str) -> None:
        try:
            if mode == "group":
                consumer = Consumer(self.bootstrap, group_id=self.group, client_id=f"chaos-{name}",
                                    enable_auto_commit=True, auto_commit_interval_ms=500, session_timeout_ms=6000,
                                    heartbeat_interval_ms=500, **CONSUMER_SETTINGS)
                consumer.subscribe([self.topic])
            else:
                consumer = Consumer(self.bootstrap, client_id=f"chaos-{name}", **CONSUMER_SETTINGS)
                consumer.assign([TopicPartition(self.topic, p) for p in range(self.partitions)])
        except Exception as exc:  # noqa: BLE001
            self._error(name, exc)
            return
        generation, assignment = 0, None
        try:
            while not self._stop_consuming.is_set():
                try:
                    records = consumer.poll(timeout_ms=200)
                except Exception as exc:  # noqa: BLE001 - a broker going away: keep polling
                    self._error(name, exc)
                    time.sleep(0.2)
                    continue
                now = sorted((tp.partition for tp in consumer.assignment()))
                if now != assignment:
                    generation, assignment = generation + 1, now
                if records:
                    self.history.add("poll", reader=name, mode=mode, generation=generation,
                                     records=[[r.partition, r.offset, int(r.value)] for r in records])
        finally:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001
                pass

    def stop_producers(self, timeout: float = 180.0) -> None:
        """Stop sending; wait until every send in flight is acknowledged or failed."""
        self._stop_producing.set()
        for t in self._producers:
            t.join(timeout)

    def stop(self) -> None:
        self._stop_producing.set()
        self._stop_consuming.set()
        for t in self._producers + self._readers:
            t.join(30)


def read_everything(bootstrap: str, topic: str, partitions: int, ends: dict[int, int], timeout: float = 120.0):
    """``[[partition, offset, value]]`` of every record up to ``ends`` (the high watermarks
    after healing), read by a fresh consumer in assign mode; raises TimeoutError if the
    reader cannot reach them."""
    out = []
    with Consumer(bootstrap, client_id="chaos-final", **CONSUMER_SETTINGS) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while any(c.position(TopicPartition(topic, p)) < ends[p] for p in range(partitions)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the final read did not reach the high watermarks {ends} in {timeout:.0f}s")
            for r in c.poll(timeout_ms=200):
                if r.offset < ends[r.partition]:
                    out.append([r.partition, r.offset, int(r.value)])
    return out
