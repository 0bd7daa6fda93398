"""A scripted partition leader for the replica fetcher's tests: the client test broker
(tests/client/scripted_broker.py) taught the leader's side of replication.

Adds, per partition: a leader epoch, the epoch cache (each epoch's start offset, from the
batches' ``partitionLeaderEpoch``), a log start; answers OFFSET_FOR_LEADER_EPOCH and follower
FETCHes (``replica_id`` >= 0: read to the log end, ``current_leader_epoch`` checked: older is
FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH; OFFSET_OUT_OF_RANGE outside [log start, end]).
A fetch finding no data waits a little (``max_wait_ms``, at most ``park_ms``, 20 ms: one
thread serves every connection) instead of spinning its client. A progress report
(``progress_only``) is recorded in ``reports`` and answered with no data. ``fail_next``
queues a per-partition error for the next FETCH of that partition. Tests change the log only through ``append``,
``set_epoch`` and ``delete_before``, under ``lock``.
"""
from __future__ import annotations

import os
import time

from odradek.core import records as fmt
from odradek.core import codec
from odradek.core.protocol import ApiKey, ErrorCode
from tests.client.scripted_broker import ScriptedBroker


class LeaderStub(ScriptedBroker):
    def __init__(self, topics: dict[str, int], epoch: int = 0):
        self.epoch = {(t, p): epoch for t, n in topics.items() for p in range(n)}
        self.start = {(t, p): 0 for t, n in topics.items() for p in range(n)}
        self.fail: dict[tuple, list] = {}
        self.refuse_epochs: dict[tuple, ErrorCode] = {}  # OFFSET_FOR_LEADER_EPOCH answers this while set
        self.fetches: list = []  # [(topic, partition, fetch_offset, current_leader_epoch, replica_id)]
        self.fsynced: list = []  # [(topic, partition, fetch_offset, fsynced_offset)] as each fetch said
        self.reports: list = []  # the same, as each progress report (``progress_only`` FETCH) said
        self.park_ms = 20  # the longest a fetch finding no data waits (this one thread serves all)
        super().__init__(topics)

    # ---- the test's side -------------------------------------------------------------------------
    def append(self, topic: str, partition: int, n: int = 2) -> int:
        """Append ``n`` records as the leader at its current epoch; returns the base offset."""
        tp = (topic, partition)
        with self.lock:
            base = self.end[tp]
            data = fmt.encode_batch([(None, b"v%d" % (base + i)) for i in range(n)], base_offset=base,
                                    partition_leader_epoch=self.epoch[tp])
            self.logs[tp].append((base, data))
            self.end[tp] += n
        return base

    def set_epoch(self, topic: str, partition: int, epoch: int) -> None:
        with self.lock:
            self.epoch[(topic, partition)] = epoch

    def delete_before(self, topic: str, partition: int, offset: int) -> None:
        with self.lock:
            tp = (topic, partition)
            self.logs[tp] = [(b, d) for b, d in self.logs[tp] if b + fmt.BatchHeader.read(d).record_count > offset]
            self.start[tp] = offset

    def fail_next(self, topic: str, partition: int, code: ErrorCode) -> None:
        with self.lock:
            self.fail.setdefault((topic, partition), []).append(code)

    def end_offset_for_epoch(self, tp, wanted: int) -> tuple[int, int]:
        """The largest epoch <= ``wanted`` in the log and where it ended (KIP-279)."""
        starts: list[tuple[int, int]] = []  # (epoch, start offset), epochs increasing
        for base, d in self.logs[tp]:
            e = fmt.BatchHeader.read(d).partition_leader_epoch
            if not starts or starts[-1][0] != e:
                starts.append((e, base))
        if wanted == self.epoch[tp] and (not starts or starts[-1][0] <= wanted):
            return wanted, self.end[tp]
        found = [(e, i) for i, (e, _) in enumerate(starts) if e <= wanted]
        if not found:
            return -1, -1
        e, i = found[-1]
        return e, starts[i + 1][1] if i + 1 < len(starts) else self.end[tp]

    # ---- the wire --------------------------------------------------------------------------------
    def _handle(self, c, frame: codec.Frame) -> bool:
        api, body = frame.header["api"], frame.header["body"]
        if api == ApiKey.BROKER_PROOF:  # a real leader checks the HMAC (tests/cluster/test_inter_broker.py)
            reply, frames = ({"nonce": os.urandom(32)} if "proof" not in body else
                             {"error_code": 0, "broker_id": body["broker_id"]}), []
        elif api == ApiKey.OFFSET_FOR_LEADER_EPOCH:
            reply, frames = self._epochs(body), []
        elif api == ApiKey.FETCH and body.get("replica_id", -1) >= 0:
            reply, frames = self._replica_fetch(body)
        else:
            return super()._handle(c, frame)
        self.requests.append((api, body))
        c.sendall(b"".join(bytes(b) for b in codec.encode_response(frame.header["corr"], reply, frames)))
        return True

    def _epoch_problem(self, tp, current) -> ErrorCode | None:
        if current is None or current < 0 or current == self.epoch[tp]:
            return None
        return ErrorCode.FENCED_LEADER_EPOCH if current < self.epoch[tp] else ErrorCode.UNKNOWN_LEADER_EPOCH

    def _epochs(self, body: dict) -> dict:
        out = []
        with self.lock:
            for t in body["topics"]:
                parts = []
                for p in t["partitions"]:
                    tp = (t["name"], p["index"])
                    problem = self.refuse_epochs.get(tp) or self._epoch_problem(tp, p.get("current_leader_epoch"))
                    if problem is not None:
                        parts.append({"index": p["index"], "error_code": int(problem), "leader_epoch": -1,
                                      "end_offset": -1})
                        continue
                    epoch, end = self.end_offset_for_epoch(tp, p["leader_epoch"])
                    parts.append({"index": p["index"], "error_code": 0, "leader_epoch": epoch, "end_offset": end})
                out.append({"name": t["name"], "partitions": parts})
        return {"topics": out}

    def _replica_fetch(self, body: dict) -> tuple[dict, list]:
        if body.get("progress_only"):  # a follower's progress report: recorded, answered with no data
            with self.lock:
                for t in body["topics"]:
                    for p in t["partitions"]:
                        self.reports.append((t["name"], p["index"], p["fetch_offset"], p.get("fsynced_offset")))
            return {"error_code": 0, "topics": []}, []
        deadline = time.monotonic() + min(body.get("max_wait_ms", 0), self.park_ms) / 1000
        while True:
            reply, blob = self._replica_read(body)
            if blob or any(p["error_code"] for t in reply["topics"] for p in t["partitions"]) \
                    or time.monotonic() >= deadline:
                return reply, [blob]
            time.sleep(0.002)

    def _replica_read(self, body: dict) -> tuple[dict, bytes]:
        out, blobs = [], []
        with self.lock:
            for t in body["topics"]:
                parts = []
                for p in t["partitions"]:
                    tp = (t["name"], p["index"])
                    off = p["fetch_offset"]
                    self.fetches.append((tp[0], tp[1], off, p.get("current_leader_epoch"), body["replica_id"]))
                    self.fsynced.append((tp[0], tp[1], off, p.get("fsynced_offset")))
                    entry = {"index": p["index"], "error_code": 0, "high_watermark": self.end[tp],
                             "log_start_offset": self.start[tp], "records_size": 0}
                    parts.append(entry)
                    problem = self._epoch_problem(tp, p.get("current_leader_epoch"))
                    if problem is None and self.fail.get(tp):
                        problem = self.fail[tp].pop(0)
                    if problem is None and not self.start[tp] <= off <= self.end[tp]:
                        problem = ErrorCode.OFFSET_OUT_OF_RANGE
                    if problem is not None:
                        entry.update(error_code=int(problem), error_message="scripted")
                        continue
                    size, chunks = 0, []
                    for base, d in self.logs[tp]:
                        if base + fmt.BatchHeader.read(d).record_count <= off:
                            continue
                        if size and size + len(d) > p["partition_max_bytes"]:
                            break
                        chunks.append(d)
                        size += len(d)
                    blobs.append(b"".join(chunks))
                    entry["records_size"] = size
                out.append({"name": t["name"], "partitions": parts})
        return {"error_code": 0, "topics": out}, b"".join(blobs)
