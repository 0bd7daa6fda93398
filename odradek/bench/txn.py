"""``odradek perf txn``: what transactions cost (docs/BENCHMARKS.md, "Exactly-once").

A transactional producer's throughput (records/s) and its commits' latency (p50, p99). Runs
in the command's process; with no ``--bootstrap-server`` it starts one broker of its own
(odradek.local.LocalBroker: 127.0.0.1, an ephemeral port, a temporary directory).

Each run writes ``--num-records`` records of ``--record-size`` bytes to a fresh topic of
``--partitions`` partitions, in transactions of ``--commit-every`` records (begin, produce,
commit, timed from the call to ``commit_transaction`` to its return), and, with
``--baseline``, the same records through the same client idempotent but without
transactions (acks=all), alternating, so the two compare within one run. ``--client``:
``confluent`` (confluent-kafka on the Kafka protocol, librdkafka's transactional producer)
or ``odradek`` (the bundled producer), a comma list for both.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid

from odradek import Admin, Producer
from odradek.local import LocalBroker
from odradek.perf import percentile


def _run_confluent(bootstrap: str, topic: str, n: int, size: int, every: int, transactional: bool) -> dict:
    from confluent_kafka import Producer as KafkaProducer
    props = {"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "lz4", "batch.size": 65536,
             "queue.buffering.max.messages": 1000000, "queue.buffering.max.kbytes": 1048576,
             "enable.idempotence": True, "acks": "all"}
    if transactional:
        props["transactional.id"] = f"bench-{uuid.uuid4().hex[:8]}"
    p = KafkaProducer(props)
    value = b"x" * size
    produce, poll = p.produce, p.poll

    def send_n(k: int) -> None:
        for i in range(k):
            while True:
                try:
                    produce(topic, value)
                    break
                except BufferError:  # librdkafka's queue is full: serve it
                    poll(0.01)
            if i % 1000 == 999:
                poll(0)
    return _warm_then_loop(p, send_n, n, every, transactional)


def _run_bundled(bootstrap: str, topic: str, n: int, size: int, every: int, transactional: bool) -> dict:
    p = Producer(bootstrap, acks="all", linger_ms=5,
                 transactional_id=f"bench-{uuid.uuid4().hex[:8]}" if transactional else None)
    value = b"x" * size
    send = p.send

    def send_n(k: int) -> None:  # the bundled producer blocks when its buffer is full
        for _ in range(k):
            send(topic, value)
    try:
        return _warm_then_loop(p, send_n, n, every, transactional)
    finally:
        p.close()


def _warm_then_loop(p, send_n, n: int, every: int, transactional: bool) -> dict:
    """One record first (metadata, connections, the producer id: outside the timing), then
    the timed loop. ``p`` has the transactional methods both clients share; ``send_n(k)``
    sends ``k`` records (each client's own loop: the harness's per-record cost is the same
    small part of both, not a wrapper call per record)."""
    if transactional:
        p.init_transactions(60)
        p.begin_transaction()
        send_n(1)
        p.commit_transaction(60)
    else:
        send_n(1)
        p.flush(60)
    return _loop(n, every, transactional, send_n, p.begin_transaction, lambda: p.commit_transaction(60),
                 lambda: p.flush(60))


def _loop(n: int, every: int, transactional: bool, send_n, begin, commit, flush) -> dict:
    """``n`` sends in transactions of ``every`` (or plain, then one flush at the end)."""
    commits: list[float] = []
    start = time.perf_counter()
    sent = 0
    while sent < n:
        k = min(every, n - sent)
        if transactional:
            begin()
        send_n(k)
        sent += k
        if transactional:
            t0 = time.perf_counter()
            commit()
            commits.append((time.perf_counter() - t0) * 1000)
    if not transactional:
        flush()
    elapsed = time.perf_counter() - start
    commits.sort()
    return {"records_per_s": n / elapsed, "seconds": elapsed, "commits": len(commits),
            "commit_p50_ms": percentile(commits, 50), "commit_p99_ms": percentile(commits, 99)}


RUNNERS = {"confluent": _run_confluent, "odradek": _run_bundled}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="odradek perf txn", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap-server", help="a running broker (default: start one)")
    ap.add_argument("--client", default="confluent", help="confluent, odradek, or both: confluent,odradek")
    ap.add_argument("--num-records", type=int, default=500000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--commit-every", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--baseline", action="store_true", help="also the same records idempotent, no transactions")
    ap.add_argument("--json", action="store_true", help="one JSON line per run")
    args = ap.parse_args(argv)
    clients = [c.strip() for c in args.client.split(",") if c.strip()]
    unknown = [c for c in clients if c not in RUNNERS]
    if unknown:
        ap.error(f"--client: unknown {', '.join(unknown)} (confluent, odradek)")
    base = broker = None
    bootstrap = args.bootstrap_server
    if not bootstrap:
        base = tempfile.mkdtemp(prefix="odradek-txnbench-")
        broker = LocalBroker(base, start_timeout=120).start()
        bootstrap = broker.bootstrap
    results: dict = {}
    try:
        for run in range(args.runs):
            for client in clients:
                for transactional in ((True, False) if args.baseline else (True,)):
                    topic = f"txn-bench-{uuid.uuid4().hex[:8]}"
                    with Admin(bootstrap) as admin:
                        admin.create_topic(topic, args.partitions)
                    r = RUNNERS[client](bootstrap, topic, args.num_records, args.record_size, args.commit_every,
                                        transactional)
                    label = f"{client} {'transactional' if transactional else 'idempotent'}"
                    results.setdefault(label, []).append(r)
                    if args.json:
                        print(json.dumps({"run": run, "client": client, "transactional": transactional, **r}),
                              flush=True)
                    else:
                        extra = (f", commit p50 {r['commit_p50_ms']:.2f} ms p99 {r['commit_p99_ms']:.2f} ms"
                                 if transactional else "")
                        print(f"run {run + 1} {label:26s} {r['records_per_s']:10,.0f} records/s{extra}", flush=True)
        for label, runs in results.items():
            rates = [r["records_per_s"] for r in runs]
            line = (f"{label:26s} median {statistics.median(rates):10,.0f} records/s "
                    f"(runs {', '.join(f'{x:,.0f}' for x in rates)})")
            if "transactional" in label:
                line += (f"; commit p50 {statistics.median(r['commit_p50_ms'] for r in runs):.2f} ms, "
                         f"p99 {statistics.median(r['commit_p99_ms'] for r in runs):.2f} ms (medians of runs)")
            print(line, flush=True)
    finally:
        if broker is not None:
            broker.stop()
        if base is not None:
            shutil.rmtree(base, ignore_errors=True)
    return 0
