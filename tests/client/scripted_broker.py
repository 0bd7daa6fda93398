"""A scripted in-memory broker speaking the client wire protocol, for client unit tests.

It exists for what the real broker cannot be told to do on cue: answer a produce with
NOT_LEADER_OR_FOLLOWER, drop a connection mid-request, hand back a torn fetch answer, move a
partition's leader between two requests. Everything else is tested against real brokers
(tests/client/test_e2e*.py).

One thread per broker (``serve``) owns its listening socket and connections; tests talk to
it only through ``faults`` (a queue of scripted misbehaviours), the read-only ``logs`` and
``requests``, and, for several brokers, the shared ``ScriptedCluster`` (leaders, leader
epochs, controller, group coordinator). Implements METADATA, PRODUCE, FETCH (immediate
answers, no long poll), LIST_OFFSETS, CREATE_TOPICS, FIND_COORDINATOR, a one-member
CONSUMER_GROUP_HEARTBEAT, OFFSET_COMMIT and OFFSET_FETCH. Only 127.0.0.1, ephemeral ports;
``close()`` stops a broker (``kill()`` too: its port then refuses connections).

Faults (``broker.faults``, consumed in order by the first request they match):
``("error", code)`` / ``("drop",)`` / ``("drop_after_append",)`` / ``("silent",)`` (appended,
never answered: the connection stays open) apply to the next PRODUCE;
``("error", code, api)`` answers the next request of ``api`` with ``code`` (per partition
for PRODUCE/FETCH/LIST_OFFSETS/OFFSET_COMMIT, per topic for CREATE_TOPICS, top-level
otherwise); ``("drop", api)`` closes the connection on the next request of ``api``.

An idempotent producer's batches are checked as a leader does (simplified): a batch repeating
one the producer wrote is answered with its offset and not written again; one that does not
follow the producer's last sequence (or, in a new epoch, does not start at 0) is refused
OUT_OF_ORDER_SEQUENCE_NUMBER, the first batch of a producer the partition does not know with
a sequence other than 0 UNKNOWN_PRODUCER_ID; nothing of a refused partition's frame is written.

Leadership is checked as a replicated broker does: PRODUCE, FETCH and LIST_OFFSETS for a
partition this broker does not lead get NOT_LEADER_OR_FOLLOWER; a ``current_leader_epoch``
older than the partition's is FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH.
The log of a partition is shared by all brokers (what followers would have replicated).
"""
from __future__ import annotations

import collections
import select
import socket
import threading

from odradek.core import records as fmt
from odradek.core import codec
from odradek.core.protocol import ApiKey, ErrorCode

NOT_LEADER = int(ErrorCode.NOT_LEADER_OR_FOLLOWER)


class ScriptedCluster:
    """The view every broker of a scripted cluster shares: topics, the partitions' logs,
    leaders and leader epochs, the controller and the group coordinator. Tests change it
    between requests (``move_leader``, ``controller``, ``coordinator``)."""

    def __init__(self, topics: dict[str, int]):
        self.lock = threading.Lock()
        self.topics = dict(topics)
        self.logs: dict[tuple, list] = {(t, p): [] for t, n in topics.items() for p in range(n)}  # [(base, bytes)]
        self.end: dict[tuple, int] = {tp: 0 for tp in self.logs}
        self.leaders: dict[tuple, list] = {tp: [0, 0] for tp in self.logs}  # tp -> [node, leader_epoch]
        self.brokers: dict[int, "ScriptedBroker"] = {}
        self.controller = 0
        self.coordinator = 0
        self.committed: dict[tuple, int] = {}  # (group, topic, partition) -> offset
        self.metadata_lag: dict[int, dict] = {}  # node -> {tp: [leader, epoch]} it answers instead (stale)
        # (tp, producer id) -> [epoch, last sequence written, {(first, last sequence): base offset}]
        self.producers: dict[tuple, list] = {}

    def start(self, n: int) -> list["ScriptedBroker"]:
        return [ScriptedBroker(self.topics, cluster=self, node_id=i) for i in range(n)]

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def move_leader(self, topic: str, partition: int, node: int) -> int:
        """Elect ``node`` (-1: none); the leader epoch is bumped. Returns the new epoch."""
        with self.lock:
            entry = self.leaders[(topic, partition)]
            entry[0] = node
            entry[1] += 1
            return entry[1]

    def create(self, name: str, partitions: int) -> None:
        with self.lock:
            self.topics[name] = partitions
            live = sorted(self.brokers)
            for p in range(partitions):
                tp = (name, p)
                self.logs[tp], self.end[tp] = [], 0
                self.leaders[tp] = [live[p % len(live)], 0]

    def records(self, topic: str, partition: int) -> list:
        with self.lock:
            chunks = list(self.logs[(topic, partition)])
        return [r for _, data in chunks for r in fmt.decode_batch(data)]

    def close(self) -> None:
        for b in list(self.brokers.values()):
            b.close()


class ScriptedBroker:
    def __init__(self, topics: dict[str, int], cluster: ScriptedCluster | None = None, node_id: int = 0):
        self.cluster = cluster if cluster is not None else ScriptedCluster(topics)
        self.node_id = node_id
        self.logs = self.cluster.logs
        self.end = self.cluster.end
        self.topics = self.cluster.topics
        self.lock = self.cluster.lock
        self.faults: collections.deque = collections.deque()  # see the module docstring
        self.requests: list = []  # (api, body) in arrival order
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.alive = True
        self.cluster.brokers[node_id] = self
        self._stop = False
        self._thread = threading.Thread(target=self.serve, daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop: every connection is closed and the port refuses new ones (a dead broker)."""
        if self._stop:
            return
        self._stop = True
        self.alive = False
        self._thread.join(5)
        self.listener.close()

    kill = close

    def records(self, topic: str, partition: int) -> list:
        return self.cluster.records(topic, partition)

    # ---- the loop -------------------------------------------------------------------------------
    def serve(self) -> None:
        conns: dict[int, tuple] = {}
        while not self._stop:
            fds = [self.listener] + [c for c, _ in conns.values()]
            readable, _, _ = select.select(fds, [], [], 0.05)
            for s in readable:
                if s is self.listener:
                    c, _ = s.accept()
                    conns[c.fileno()] = (c, codec.Decoder())
                    continue
                c, dec = conns[s.fileno()]
                try:
                    data = c.recv(1 << 20)
                except OSError:
                    data = b""
                if not data:
                    del conns[c.fileno()]
                    c.close()
                    continue
                dec.feed(data)
                while (frame := dec.next()) is not None:
                    if not self._handle(c, frame):
                        del conns[c.fileno()]
                        c.close()
                        break
        for c, _ in conns.values():
            c.close()

    def _fault_for(self, api: int):
        """The first queued fault that applies to this request (taken off the queue)."""
        for i, f in enumerate(self.faults):
            target = f[2] if f[0] == "error" and len(f) > 2 else f[1] if f[0] == "drop" and len(f) > 1 \
                else ApiKey.PRODUCE
            if target == api:
                del self.faults[i]
                return f
        return None

    def _handle(self, c: socket.socket, frame: codec.Frame) -> bool:
        h = frame.header
        api, body = h["api"], h["body"]
        self.requests.append((api, body))
        fault = self._fault_for(api) if self.faults else None
        if fault is not None and fault[0] == "drop":
            return False
        code = int(fault[1]) if fault is not None and fault[0] == "error" else 0
        frames = []
        if api == ApiKey.METADATA:
            reply = self._metadata(body)
        elif api == ApiKey.PRODUCE:
            reply = self._produce(body, frame.frames, code)
            if fault == ("drop_after_append",):
                return False
            if fault == ("silent",):
                return True
            if body["acks"] == 0:
                return True
        elif api == ApiKey.FETCH:
            reply, frames = self._fetch(body, code)
        elif api == ApiKey.LIST_OFFSETS:
            reply = self._list_offsets(body, code)
        elif api == ApiKey.CREATE_TOPICS:
            reply = self._create_topics(body, code)
        elif api == ApiKey.OFFSET_COMMIT:
            reply = self._offset_commit(body, code)
        elif api == ApiKey.OFFSET_FETCH:
            reply = self._offset_fetch(body, code)
        elif code:
            reply = {"error_code": code, "error_message": "scripted"}
        elif api == ApiKey.FIND_COORDINATOR:
            node = self.cluster.coordinator
            b = self.cluster.brokers[node]
            reply = {"error_code": 0, "node_id": node, "host": "127.0.0.1", "port": b.port, "key": body.get("key")}
        elif api == ApiKey.CONSUMER_GROUP_HEARTBEAT:
            reply = self._heartbeat(body)
        elif api == ApiKey.INIT_PRODUCER_ID:  # an idempotent producer's id (its sequences: _check_sequences)
            reply = {"error_code": 0, "producer_id": 1000 + len(self.requests), "producer_epoch": 0}
        else:
            reply = {"error_code": int(ErrorCode.INVALID_REQUEST), "error_message": "not scripted"}
        c.sendall(b"".join(bytes(b) for b in codec.encode_response(h["corr"], reply, frames)))
        return True

    # ---- leadership ------------------------------------------------------------------------------
    def _leader_problem(self, tp: tuple, epoch=-1) -> tuple[int, str] | None:
        if tp not in self.cluster.leaders:
            return int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), f"{tp[0]}-{tp[1]} does not exist"
        leader, leader_epoch = self.cluster.leaders[tp]
        if leader != self.node_id:
            return NOT_LEADER, f"broker {self.node_id} is not the leader of {tp[0]}-{tp[1]} (broker {leader} is)"
        if epoch is not None and epoch >= 0 and epoch != leader_epoch:
            code = ErrorCode.FENCED_LEADER_EPOCH if epoch < leader_epoch else ErrorCode.UNKNOWN_LEADER_EPOCH
            return int(code), f"leader epoch {epoch} requested, the leader is at {leader_epoch}"
        return None

    def _metadata(self, body: dict) -> dict:
        cl = self.cluster
        names = body.get("topics")
        names = list(self.topics) if names is None else names
        lag = cl.metadata_lag.get(self.node_id, {})
        topics = []
        for name in names:
            if name not in self.topics:
                topics.append({"name": name, "error_code": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                               "error_message": f"topic '{name}' does not exist", "partitions": []})
                continue
            parts = []
            for i in range(self.topics[name]):
                leader, epoch = lag.get((name, i)) or cl.leaders[(name, i)]
                parts.append({"index": i, "leader": leader, "leader_epoch": epoch, "replicas": sorted(cl.brokers),
                              "isr": sorted(cl.brokers),
                              "error_code": 0 if leader >= 0 else int(ErrorCode.LEADER_NOT_AVAILABLE)})
            topics.append({"name": name, "error_code": 0, "is_internal": False, "topic_id": f"id-{name}",
                           "partitions": parts})
        return {"cluster_id": "scripted", "controller_id": cl.controller,
                "brokers": [{"node_id": n, "host": "127.0.0.1", "port": b.port}
                            for n, b in sorted(cl.brokers.items()) if b.alive],
                "topics": topics}

    def _produce(self, body: dict, frames: list, code: int) -> dict:
        out = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                tp = (t["name"], p["index"])
                problem = (code, "scripted") if code else self._leader_problem(tp, None)
                if problem:
                    parts.append({"index": p["index"], "error_code": problem[0], "error_message": problem[1]})
                    continue
                data = bytearray(frames[p["frame"]])
                with self.lock:
                    base = self.end[tp]
                    refused = self._check_sequences(tp, data)
                    if refused:
                        parts.append({"index": p["index"], "error_code": refused, "error_message": "scripted sequence"})
                        continue
                    for hpos, hdr in fmt.iter_batches(data):
                        seen = self._written_before(tp, hdr)
                        if seen is not None:  # a retry of a batch written before: its offset, not written again
                            base = seen if hpos == 0 else base
                            continue
                        fmt.patch_base_offset(data, self.end[tp], pos=hpos)
                        self.logs[tp].append((self.end[tp], bytes(data[hpos:hpos + hdr.size])))
                        self._remember(tp, hdr, self.end[tp])
                        self.end[tp] += hdr.record_count
                parts.append({"index": p["index"], "error_code": 0, "base_offset": base,
                              "log_append_time_ms": -1, "log_start_offset": 0})
            out.append({"name": t["name"], "partitions": parts})
        return {"topics": out}

    # ---- idempotence: the leader's sequence check (log/producer_state.py, simplified) ------------------
    def _written_before(self, tp: tuple, hdr) -> int | None:
        """The base offset of this producer's batch with these sequences, if written already."""
        entry = self.cluster.producers.get((tp, hdr.producer_id)) if hdr.producer_id >= 0 else None
        if entry is None or entry[0] != hdr.producer_epoch:
            return None
        return entry[2].get((hdr.base_sequence, hdr.base_sequence + hdr.last_offset_delta))

    def _check_sequences(self, tp: tuple, data: bytearray) -> int:
        """OUT_OF_ORDER_SEQUENCE_NUMBER (nothing of the frame written) when a batch of a known
        producer neither repeats one of its written batches nor follows its last sequence, as
        a real leader refuses it; 0 otherwise. Lock held."""
        expected: dict = {}
        for _, hdr in fmt.iter_batches(data):
            if hdr.producer_id < 0 or self._written_before(tp, hdr) is not None:
                continue
            entry = self.cluster.producers.get((tp, hdr.producer_id))
            last = expected.get(hdr.producer_id, -1 if entry is None or entry[0] != hdr.producer_epoch else entry[1])
            if hdr.base_sequence != last + 1:
                return int(ErrorCode.UNKNOWN_PRODUCER_ID if entry is None and hdr.producer_id not in expected
                           else ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER)
            expected[hdr.producer_id] = hdr.base_sequence + hdr.last_offset_delta
        return 0

    def _remember(self, tp: tuple, hdr, offset: int) -> None:
        if hdr.producer_id < 0:
            return
        entry = self.cluster.producers.get((tp, hdr.producer_id))
        if entry is None or entry[0] != hdr.producer_epoch:
            entry = self.cluster.producers[(tp, hdr.producer_id)] = [hdr.producer_epoch, -1, {}]
        entry[1] = hdr.base_sequence + hdr.last_offset_delta
        entry[2][(hdr.base_sequence, entry[1])] = offset

    def _fetch(self, body: dict, code: int) -> tuple[dict, list]:
        out, frames = [], []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                tp = (t["name"], p["index"])
                off = p["fetch_offset"]
                problem = (code, "scripted") if code else self._leader_problem(tp, p.get("current_leader_epoch", -1))
                if problem:
                    parts.append({"index": p["index"], "error_code": problem[0], "error_message": problem[1],
                                  "high_watermark": -1, "records_size": 0})
                    continue
                with self.lock:
                    end = self.end[tp]
                    chunks = [d for base, d in self.logs[tp] if base + fmt.BatchHeader.read(d).record_count > off]
                if off > end:
                    parts.append({"index": p["index"], "error_code": int(ErrorCode.OFFSET_OUT_OF_RANGE),
                                  "high_watermark": end, "records_size": 0})
                    continue
                data, size = [], 0
                for d in chunks:
                    if size and size + len(d) > p["partition_max_bytes"]:
                        break
                    data.append(d)
                    size += len(d)
                blob = b"".join(data)
                frames.append(blob)
                parts.append({"index": p["index"], "error_code": 0, "high_watermark": end,
                              "last_stable_offset": end, "log_start_offset": 0, "records_size": len(blob)})
            out.append({"name": t["name"], "partitions": parts})
        return {"error_code": 0, "topics": out}, [b"".join(frames)]

    def _list_offsets(self, body: dict, code: int) -> dict:
        out = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                tp = (t["name"], p["index"])
                problem = (code, "scripted") if code else self._leader_problem(tp, p.get("current_leader_epoch", -1))
                if problem:
                    parts.append({"index": p["index"], "error_code": problem[0], "error_message": problem[1]})
                    continue
                offset = 0 if p["timestamp"] == -2 else self.end[tp]
                parts.append({"index": p["index"], "error_code": 0, "timestamp": -1, "offset": offset})
            out.append({"name": t["name"], "partitions": parts})
        return {"topics": out}

    # ---- controller and group coordinator ----------------------------------------------------------
    def _create_topics(self, body: dict, code: int) -> dict:
        out = []
        for t in body["topics"]:
            if not code and self.cluster.controller != self.node_id:
                code = int(ErrorCode.NOT_CONTROLLER)
            if code:
                out.append({"name": t["name"], "error_code": code, "error_message": "scripted"})
            elif t["name"] in self.topics:
                out.append({"name": t["name"], "error_code": int(ErrorCode.TOPIC_ALREADY_EXISTS),
                            "error_message": f"topic '{t['name']}' already exists"})
            else:
                n = t["num_partitions"] if t["num_partitions"] > 0 else 1
                self.cluster.create(t["name"], n)
                out.append({"name": t["name"], "error_code": 0, "num_partitions": n,
                            "replication_factor": len(self.cluster.brokers)})
        return {"topics": out}

    def _not_coordinator(self, code: int) -> int:
        if code:
            return code
        return int(ErrorCode.NOT_COORDINATOR) if self.cluster.coordinator != self.node_id else 0

    def _heartbeat(self, body: dict) -> dict:
        if self.cluster.coordinator != self.node_id:
            return {"error_code": int(ErrorCode.NOT_COORDINATOR), "error_message": "not the coordinator"}
        topics = body.get("subscribed_topic_names") or []
        if body["member_epoch"] < 0:
            return {"error_code": 0, "member_id": body["member_id"], "member_epoch": body["member_epoch"],
                    "heartbeat_interval_ms": 100, "assignment": [], "state": "stable"}
        return {"error_code": 0, "member_id": body["member_id"] or "member-1", "member_epoch": 1,
                "heartbeat_interval_ms": 100, "state": "stable",
                "assignment": [{"topic": t, "partitions": list(range(self.topics[t]))}
                               for t in sorted(topics) if t in self.topics]}

    def _offset_commit(self, body: dict, code: int) -> dict:
        code = self._not_coordinator(code)
        out = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                if not code:
                    self.cluster.committed[(body["group_id"], t["name"], p["partition_index"])] = p["committed_offset"]
                parts.append({"partition_index": p["partition_index"], "error_code": code})
            out.append({"name": t["name"], "partitions": parts})
        return {"topics": out}

    def _offset_fetch(self, body: dict, code: int) -> dict:
        code = self._not_coordinator(code)
        if code:
            return {"error_code": code, "error_message": "scripted"}
        out = []
        for t in body.get("topics") or []:
            out.append({"name": t["name"], "partitions": [
                {"partition_index": i, "error_code": 0,
                 "committed_offset": self.cluster.committed.get((body["group_id"], t["name"], i), -1)}
                for i in t["partition_indexes"]]})
        return {"topics": out}
