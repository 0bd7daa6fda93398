"""A scripted in-memory broker speaking the client wire protocol, for client unit tests.

It exists for what the real broker cannot be told to do on cue: answer a produce with
NOT_LEADER_OR_FOLLOWER, drop a connection mid-request, hand back a torn fetch answer.
Everything else is tested against real brokers (tests/client/test_e2e*.py).

One thread (``serve``) owns the listening socket and every connection; tests talk to it
only through ``faults`` (a queue of scripted misbehaviours) and the read-only ``logs``.
Implements METADATA, PRODUCE, FETCH (immediate answers, no long poll) and LIST_OFFSETS for
topics given to the constructor. Only 127.0.0.1, ephemeral port; ``close()`` stops it.
"""
from __future__ import annotations

import collections
import select
import socket
import threading

from log import records as fmt
from network import codec
from network.protocol import ApiKey, ErrorCode


class ScriptedBroker:
    def __init__(self, topics: dict[str, int]):
        self.logs: dict[tuple, list] = {(t, p): [] for t, n in topics.items() for p in range(n)}  # [(base, bytes)]
        self.end: dict[tuple, int] = {tp: 0 for tp in self.logs}
        self.topics = topics
        self.faults: collections.deque = collections.deque()  # ("error", code) | ("drop",) | ("drop_after_append",)
        self.requests: list = []  # (api, body) in arrival order
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self.serve, daemon=True)
        self._thread.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        self.listener.close()

    def records(self, topic: str, partition: int) -> list:
        with self.lock:
            chunks = list(self.logs[(topic, partition)])
        return [r for _, data in chunks for r in fmt.decode_batch(data)]

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

    def _handle(self, c: socket.socket, frame: codec.Frame) -> bool:
        h = frame.header
        api, body = h["api"], h["body"]
        self.requests.append((api, body))
        fault = self.faults.popleft() if self.faults and api == ApiKey.PRODUCE else None
        if fault == ("drop",):
            return False
        if api == ApiKey.METADATA:
            reply, frames = self._metadata(body), []
        elif api == ApiKey.PRODUCE:
            reply, frames = self._produce(body, frame.frames, fault), []
            if fault == ("drop_after_append",):
                return False
            if body["acks"] == 0:
                return True
        elif api == ApiKey.FETCH:
            reply, frames = self._fetch(body)
        elif api == ApiKey.LIST_OFFSETS:
            reply, frames = self._list_offsets(body), []
        else:
            reply, frames = {"error_code": int(ErrorCode.INVALID_REQUEST), "error_message": "not scripted"}, []
        c.sendall(b"".join(bytes(b) for b in codec.encode_response(h["corr"], reply, frames)))
        return True

    def _metadata(self, body: dict) -> dict:
        names = body.get("topics") or list(self.topics)
        topics = []
        for name in names:
            if name not in self.topics:
                topics.append({"name": name, "error_code": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                               "error_message": f"topic '{name}' does not exist", "partitions": []})
                continue
            topics.append({"name": name, "error_code": 0, "is_internal": False, "partitions": [
                {"index": i, "leader": 0, "leader_epoch": 0, "replicas": [0], "isr": [0], "error_code": 0}
                for i in range(self.topics[name])]})
        return {"cluster_id": "scripted", "controller_id": 0,
                "brokers": [{"node_id": 0, "host": "127.0.0.1", "port": self.port}], "topics": topics}

    def _produce(self, body: dict, frames: list, fault) -> dict:
        out = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                tp = (t["name"], p["index"])
                if fault and fault[0] == "error":
                    parts.append({"index": p["index"], "error_code": int(fault[1]), "error_message": "scripted"})
                    continue
                data = bytearray(frames[p["frame"]])
                with self.lock:
                    base = self.end[tp]
                    pos = 0
                    for hpos, hdr in fmt.iter_batches(data):
                        fmt.patch_base_offset(data, self.end[tp], pos=hpos)
                        self.logs[tp].append((self.end[tp], bytes(data[hpos:hpos + hdr.size])))
                        self.end[tp] += hdr.record_count
                        pos = hpos + hdr.size
                parts.append({"index": p["index"], "error_code": 0, "base_offset": base,
                              "log_append_time_ms": -1, "log_start_offset": 0})
            out.append({"name": t["name"], "partitions": parts})
        return {"topics": out}

    def _fetch(self, body: dict) -> tuple[dict, list]:
        out, frames = [], []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                tp = (t["name"], p["index"])
                off = p["fetch_offset"]
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

    def _list_offsets(self, body: dict) -> dict:
        out = []
        for t in body["topics"]:
            parts = []
            for p in t["partitions"]:
                tp = (t["name"], p["index"])
                offset = 0 if p["timestamp"] == -2 else self.end[tp]
                parts.append({"index": p["index"], "error_code": 0, "timestamp": -1, "offset": offset})
            out.append({"name": t["name"], "partitions": parts})
        return {"topics": out}
