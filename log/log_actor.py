"""The log actor: the single writer of a set of partition logs.

Process: ``log-<i>`` (``num.log.threads`` of them). Each partition is placed on exactly one
by a stable hash (``coordinator.topics.placement``); within the process every partition is
an independent ``Log`` and appends to it are serialized by this actor's one loop, which is
what "a log actor per partition" means here without a process per partition (a process
costs ~25 MiB; thousands of partitions must not cost thousands of processes).
Owns: the ``Log`` objects of its partitions (segments, indexes, checkpoints).
Accepts:
  produce {acks, parts: [[topic, partition, frame]], errors}  + batch frames
        from a handler, which has checked every batch's CRC (this actor checks sizes and
        header fields); answered straight to the client's processor (no hop back)
  delete_records {parts: [[topic, partition, offset]]}
  assign {open, close, configure}  from the controller
  get_bounds                        from the fetch actor (after it restarts)
Tells the fetch actor, once per batch of messages, the new ``LogBounds`` of every partition
that changed (``bounds``): that is how long-poll fetches learn that data arrived.
Timers: retention (``log.retention.check.interval.ms``), flush (``flush.ms``), checkpoints,
compaction (``log.cleaner.backoff.ms``).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import time

from actors.message import Message
from actors.runtime import Actor, MailboxFull
from log import cleaner
from log.config import LogConfig
from log.log import Log
from network.protocol import ErrorCode, OdradekError

log = logging.getLogger("odradek.log")

CLOSE_THREADS = 16  # logs closed at once on stop (each close is mostly fsync)
FETCH_ACTOR = "fetch"
CONTROLLER = "controller"


def partition_dir(data_dir: str, topic: str, partition: int) -> str:
    return os.path.join(data_dir, f"{topic}-{partition}")


class PartitionLog:
    __slots__ = ("topic", "partition", "topic_id", "log")

    def __init__(self, topic: str, partition: int, topic_id: str, log_: Log):
        self.topic, self.partition, self.topic_id, self.log = topic, partition, topic_id, log_


class LogActor(Actor):
    def on_start(self) -> None:
        self.data_dir = self.args["data_dir"]
        config = self.args["config"]
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._dirty: set[tuple[str, int]] = set()
        self._closed: list[tuple[str, int]] = []
        self._answers: list[tuple[Message, dict]] = []
        self.appends = 0
        assignment = self.call(CONTROLLER, "get_assignment", {"host": self.name}, timeout=60.0)
        for entry in assignment.get("open", []):
            self._open_partition(entry)
        self._dirty.update(self.logs)
        self.after_batch()
        self.call_every(config["log.retention.check.interval.ms"] / 1000, self._retention)
        self.call_every(config["log.flush.scheduler.interval.ms"] / 1000, self._flush)
        self.call_every(config["log.flush.offset.checkpoint.interval.ms"] / 1000, self._checkpoint)
        self.call_every(config["log.cleaner.backoff.ms"] / 1000, self._clean)

    def on_stop(self) -> None:
        """Close every log cleanly (flush, checkpoints, clean-shutdown marker). Closing is
        mostly fsync, which releases the GIL: thousands of partitions close in parallel
        threads within ``shutdown.timeout.ms`` instead of one after another."""
        def close(p: PartitionLog) -> None:
            try:
                p.log.close()
            except OdradekError as exc:
                log.error("closing %s-%d: %s", p.topic, p.partition, exc.message)

        with concurrent.futures.ThreadPoolExecutor(max_workers=CLOSE_THREADS) as pool:
            list(pool.map(close, self.logs.values()))

    def stats(self) -> dict:
        return {"partitions": len(self.logs), "appends": self.appends}

    # ---- produce -----------------------------------------------------------------------
    def on_produce(self, msg: Message) -> None:
        fields, frames = msg.fields, msg.frames
        results: dict[str, list] = {}
        for topic, partition, code, message in fields.get("errors") or ():
            results.setdefault(topic, []).append({"index": partition, "error_code": code, "error_message": message,
                                                  "base_offset": -1, "log_append_time_ms": -1,
                                                  "log_start_offset": -1})
        for topic, partition, frame in fields["parts"]:
            results.setdefault(topic, []).append(self._append(topic, partition, frames[frame]))
        if msg.reply_to:  # acks=0 produces come one-way: nobody waits for an answer
            # Answered in after_batch, once the fetch actor has been told of the new data:
            # a client that got its acknowledgement can read its record at once.
            self._answers.append((msg, {"body": {"topics": [{"name": t, "partitions": ps}
                                                            for t, ps in results.items()]}}))

    def _append(self, topic: str, partition: int, batch) -> dict:
        p = self.logs.get((topic, partition))
        if p is None:
            return _error(partition, ErrorCode.NOT_LEADER_OR_FOLLOWER,
                          f"{topic}-{partition} is not hosted by {self.name} (moved or being deleted); "
                          f"refresh metadata and retry")
        try:
            info = p.log.append(batch, crc_checked=True)  # the handler checked the CRC
        except OdradekError as exc:
            return _error(partition, exc.code, f"{topic}-{partition}: {exc.message}")
        p.log.high_watermark = p.log.log_end_offset  # one replica: committed once appended
        self._dirty.add((topic, partition))
        self.appends += 1
        append_time = info.append_time_ms if p.log.config.log_append_time else -1
        return {"index": partition, "error_code": 0, "base_offset": info.base_offset,
                "log_append_time_ms": append_time, "log_start_offset": info.log_start_offset}

    def on_delete_records(self, msg: Message) -> None:
        out: dict[str, list] = {}
        for topic, partition, offset in msg.get("parts") or ():
            p = self.logs.get((topic, partition))
            entry = {"index": partition, "low_watermark": -1, "error_code": 0}
            try:
                if p is None:
                    raise OdradekError(f"{topic}-{partition} is not hosted here", ErrorCode.NOT_LEADER_OR_FOLLOWER)
                if offset == -1:
                    offset = p.log.high_watermark
                if not isinstance(offset, int) or offset < 0 or offset > p.log.high_watermark:
                    raise OdradekError(f"offset {offset} is outside [0, {p.log.high_watermark}] (the high "
                                       f"watermark)", ErrorCode.OFFSET_OUT_OF_RANGE)
                entry["low_watermark"] = p.log.delete_records_before(offset)
                self._dirty.add((topic, partition))
            except OdradekError as exc:
                entry.update(error_code=int(exc.code), error_message=exc.message)
            out.setdefault(topic, []).append(entry)
        self.reply(msg, {"body": {"topics": [{"name": t, "partitions": ps} for t, ps in out.items()]}})

    # ---- assignment from the controller -------------------------------------------------
    def on_assign(self, msg: Message) -> None:
        for entry in msg.get("open") or ():
            self._open_partition(entry)
        for entry in msg.get("configure") or ():
            p = self.logs.get((entry["topic"], entry["partition"]))
            if p is not None:
                p.log.config = LogConfig.from_properties(entry["config"])
        for entry in msg.get("close") or ():
            self._close_and_delete(entry["topic"], entry["partition"], entry["topic_id"])
        # The fetch actor learns of the change before the controller does, so a client that
        # created a topic can fetch from it at once. If the fetch actor is down, it asks
        # every log actor for bounds when it is back; acknowledge anyway.
        self.request(FETCH_ACTOR, "bounds", self._take_changes(), timeout=5.0,
                     callback=lambda _r: self.reply(msg, {"partitions": len(self.logs)}))

    def _open_partition(self, entry: dict) -> None:
        key = (entry["topic"], entry["partition"])
        if key in self.logs:
            return
        directory = partition_dir(self.data_dir, *key)
        os.makedirs(directory, exist_ok=True)
        the_log = Log(directory, LogConfig.from_properties(entry["config"]))
        report = the_log.recovery_report
        if getattr(report, "dropped_bytes", 0):
            log.warning("%s-%d recovered: %s", key[0], key[1], report.summary())
        the_log.high_watermark = the_log.log_end_offset
        self.logs[key] = PartitionLog(key[0], key[1], entry.get("topic_id", ""), the_log)
        self._dirty.add(key)

    def _close_and_delete(self, topic: str, partition: int, topic_id: str) -> None:
        p = self.logs.pop((topic, partition), None)
        if p is not None:
            p.log.close()
        self._dirty.discard((topic, partition))
        self._closed.append((topic, partition))
        directory = partition_dir(self.data_dir, topic, partition)
        if os.path.isdir(directory):
            doomed = f"{directory}.{topic_id or int(time.time())}-delete"
            os.rename(directory, doomed)  # the name is free at once for a new topic
            shutil.rmtree(doomed, ignore_errors=True)

    # ---- the fetch actor ---------------------------------------------------------------
    def on_get_bounds(self, msg: Message) -> None:
        self.reply(msg, {"parts": [[t, p, *pl.log.bounds()] for (t, p), pl in self.logs.items()]})

    def _take_changes(self) -> dict:
        parts = [[t, p, *self.logs[(t, p)].log.bounds()] for (t, p) in self._dirty if (t, p) in self.logs]
        closed, self._closed = self._closed, []
        self._dirty.clear()
        return {"parts": parts, "closed": closed, "host": self.name}

    def after_batch(self) -> None:
        if self._dirty or self._closed:
            dirty, closed = set(self._dirty), list(self._closed)
            try:
                self.send(FETCH_ACTOR, "bounds", self._take_changes())
            except MailboxFull:
                self._dirty, self._closed = dirty, closed  # the next batch tries again
        answers, self._answers = self._answers, []
        for msg, fields in answers:
            self.reply(msg, fields)

    # ---- timers ------------------------------------------------------------------------
    def _each(self, what: str, fn, changes_bounds: bool = True) -> None:
        """Run ``fn(log)`` on every log; a truthy result (when ``changes_bounds``) means the
        log's bounds changed and the fetch actor must hear of it."""
        for key, p in list(self.logs.items()):
            try:
                if fn(p.log) and changes_bounds:
                    self._dirty.add(key)
            except OdradekError as exc:
                log.error("%s of %s-%d failed: %s", what, key[0], key[1], exc.message)
        self.after_batch()

    def _retention(self) -> None:
        self._each("retention", lambda lg: (lg.apply_retention() or 0) + (lg.delete_expired_files() or 0))

    def _flush(self) -> None:
        self._each("flush", Log.maybe_flush, changes_bounds=False)

    def _checkpoint(self) -> None:
        self._each("checkpoint", Log.checkpoint, changes_bounds=False)

    def _clean(self) -> None:
        self._each("compaction", lambda lg: lg.config.compact and cleaner.clean(lg).cleaned)


def _error(partition: int, code: int, message: str) -> dict:
    return {"index": partition, "error_code": int(code), "error_message": message,
            "base_offset": -1, "log_append_time_ms": -1, "log_start_offset": -1}
