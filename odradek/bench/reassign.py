"""``odradek perf reassign``: the time to move a partition's data to a new broker, unthrottled
and throttled, and what a producer gets during the move against before it.

Starts its own ZooKeeper and two brokers on 127.0.0.1 (``LocalCluster``), creates topic
``reassign-bench`` (``--partitions``, replication factor 2, on brokers 1 and 2), fills it with
``--bytes`` of records, then for each throttle (``--throttles``, bytes/s; 0: none) adds a
new broker and moves every partition's replica on the oldest broker to it (the whole
``--bytes`` copied to the new broker), timing from AlterPartitionReassignments to the moves'
end (every new replica in the ISR, the old ones removed). An acks=all producer of 1 kB
records runs on the same topic throughout, as fast as it is acknowledged; its throughput in
the ``--window`` seconds before each move and over the move itself is reported. One JSON line per
move, then a summary. Figures are this machine's: run it on a quiet one, several times.

    odradek perf reassign --bytes 1073741824 --throttles 0,50000000
"""
from __future__ import annotations

import argparse
import json
import threading
import time

TOPIC = "reassign-bench"


class _Producer:
    """acks=all records of ``size`` bytes, as fast as they are acknowledged; counts bytes acked."""

    def __init__(self, bootstrap: str, size: int):
        from odradek.producer import Producer
        from odradek.perf import random_payload
        self.acked = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.payload = random_payload(size)
        self.producer = Producer(bootstrap, acks="all", linger_ms=5, batch_size=262144, compression=None)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _count(self, future) -> None:
        if future.exception(0) is None:
            with self.lock:
                self.acked += len(self.payload)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.producer.send(TOPIC, self.payload).add_done_callback(self._count)
            except Exception:  # noqa: BLE001 - buffer full: back off a little
                time.sleep(0.01)

    def sample(self) -> tuple[float, int]:
        with self.lock:
            return time.monotonic(), self.acked

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.producer.close(timeout=10)


def _rate(a: tuple[float, int], b: tuple[float, int]) -> float:
    return (b[1] - a[1]) / max(b[0] - a[0], 1e-9)


def _fill(bootstrap: str, total: int, size: int) -> None:
    from odradek.producer import Producer
    from odradek.perf import random_payload
    payload = random_payload(size)
    with Producer(bootstrap, acks=1, linger_ms=20, batch_size=1048576, compression=None) as producer:  # bytes on disk = --bytes
        for _ in range(total // size):
            producer.send(TOPIC, payload)
        producer.flush(600)


def _moved(cluster, plan: dict) -> bool:
    node = cluster._json(f"/brokers/topics/{TOPIC}")
    if node.get("adding_replicas") or node.get("removing_replicas"):
        return False
    return all(node["partitions"][str(p)] == r and sorted(cluster.isr(TOPIC, p)) == sorted(r)
               for p, r in plan.items())


def _move(cluster, bootstrap: str, throttle: int, window: float, producer: _Producer) -> dict:
    from odradek.admin import Admin
    from odradek.reassign import THROTTLED_REPLICAS, THROTTLES, throttled_replicas
    from odradek.types import TopicPartition
    new = cluster.add()
    assignment = cluster.topic_assignment(TOPIC)
    oldest = min(b for r in assignment.values() for b in r)
    plan = {p: [new if b == oldest else b for b in r] for p, r in assignment.items()}
    before = producer.sample()
    time.sleep(window)
    start = producer.sample()
    with Admin(bootstrap) as admin:
        if throttle:
            for b in cluster.ids:
                admin.alter_configs(str(b), set={n: throttle for n in THROTTLES}, resource_type="broker")
            moves = {TopicPartition(TOPIC, p): r for p, r in plan.items()}
            now = {TopicPartition(TOPIC, p): r for p, r in assignment.items()}
            for topic, lists in throttled_replicas(moves, now).items():  # which replicas the rates hold
                admin.alter_configs(topic, set=lists)
        errors = admin.alter_partition_reassignments({TopicPartition(TOPIC, p): r for p, r in plan.items()})
        if any(errors.values()):
            raise SystemExit(f"perf: the move was refused: {errors}")
        cluster.wait_for(lambda: _moved(cluster, plan), 3600, "the move", interval=0.05)
        end = producer.sample()
        moved = _replicated_bytes(cluster, new)
        if throttle:
            for b in cluster.ids:
                admin.alter_configs(str(b), delete=THROTTLES, resource_type="broker")
            admin.alter_configs(TOPIC, delete=THROTTLED_REPLICAS)
    seconds = end[0] - start[0]
    return {"throttle_bytes_per_s": throttle or None, "from_broker": oldest, "to_broker": new,
            "moved_bytes": moved, "move_seconds": round(seconds, 2),
            "moved_mb_per_s": round(moved / seconds / 1e6, 1),
            "producer_mb_per_s_before": round(_rate(before, start) / 1e6, 2),
            "producer_mb_per_s_during": round(_rate(start, end) / 1e6, 2)}


def _replicated_bytes(cluster, broker: int) -> int:
    """Bytes the broker's replica fetcher has appended (all of it the move's, on a new broker)."""
    from odradek.actors.client import MailboxClient
    from odradek.actors.messages import Stats
    with MailboxClient(cluster.broker(broker).run_dir) as client:
        return client.request("replica_fetcher", Stats(), timeout=10.0).fields.stats.get("replicated_bytes", 0)


def main(argv: list[str]) -> int:
    from odradek.perf import create_replicated, local_cluster, stop_cluster
    ap = argparse.ArgumentParser(prog="odradek perf reassign", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bytes", type=int, default=1 << 30, help="data in the topic before the moves (default 1 GiB)")
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--record-size", type=int, default=10000)
    ap.add_argument("--throttles", default="0,50000000", help="bytes/s per move, comma-separated; 0: unthrottled")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of producer throughput before each move")
    ap.add_argument("--keep", metavar="DIR", help="run the cluster in DIR and keep it")
    args = ap.parse_args(argv)
    throttles = [int(t) for t in args.throttles.split(",")]
    cluster, base = local_cluster(2, {"replica.lag.time.max.ms": 10000}, args.keep)
    results = []
    try:
        create_replicated(cluster.bootstrap, TOPIC, args.partitions, 2, 1)
        t0 = time.monotonic()
        _fill(cluster.bootstrap, args.bytes, args.record_size)
        print(json.dumps({"filled_bytes": args.bytes, "fill_seconds": round(time.monotonic() - t0, 2)}), flush=True)
        producer = _Producer(cluster.bootstrap, 1000)
        try:
            for throttle in throttles:
                results.append(_move(cluster, cluster.bootstrap, throttle, args.window, producer))
                print(json.dumps(results[-1]), flush=True)
        finally:
            producer.close()
    finally:
        stop_cluster(cluster, base, bool(args.keep))
    for r in results:
        what = f"at {r['throttle_bytes_per_s'] / 1e6:g} MB/s" if r["throttle_bytes_per_s"] else "unthrottled"
        print(f"move of {r['moved_bytes'] / 2**30:.2f} GiB {what}: {r['move_seconds']} s "
              f"({r['moved_mb_per_s']} MB/s); producer "
              f"{r['producer_mb_per_s_before']} MB/s before, {r['producer_mb_per_s_during']} MB/s during")
    return 0
