"""Partitions per log actor: ``python -m odradek.bench.placement [--partitions 10,1000,5000]
[--threads 1,2,4] [--dir PATH] [--batches N]``.

How many partitions a log-actor process can host, and what ``num.log.threads`` buys, on a
real broker: for each (partitions P, log threads N) it starts ``odradek serve`` on
127.0.0.1 (port 0) over a fresh data directory, and measures

- create: seconds to create P partitions (topics of at most 1,000 partitions, one
  CreateTopics each), and the data directory's disk usage afterwards (allocated blocks);
- memory and files: RSS and USS (psutil, unique pages) of every log actor, and open file
  descriptors of the log actors and of the fetch actor (which reads every partition);
- produce: ``--batches`` batches of 16 records x 100 B (uncompressed, ~2 KiB), sent
  round-robin over all P partitions, 50 partitions per Produce request (acks=1), 8 requests
  in flight on one connection (``network.client.BrokerConnection``); records/s and MB/s;
- restart: SIGTERM and time to exit, then time from ``odradek serve`` to "ready" with the
  P partitions on disk (clean start), then the same after SIGKILL of every process of the
  broker, one by one (unclean start: recovery of every partition);
- the memory of one log-actor process with no partition (USS), to extrapolate "a process
  per partition".

Each configuration runs ``--repeat`` times (default 3), each time on a fresh broker and
data directory; the table shows the median of every column.

Every process it starts is stopped by PID before it moves on (and on Ctrl-C). A tool, run
by hand; the table goes to docs/BENCHMARKS.md ("Partitions per log actor").
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import psutil

from odradek.core.records import encode_batch
from odradek.local import LocalBroker

MiB = 1 << 20
TOPIC_MAX = 1000


class Broker(LocalBroker):
    """A broker for one configuration, timed: ``start`` and ``stop`` return seconds."""

    def __init__(self, data_dir: str, threads: int, extra: list[str], start_timeout: float = 600.0):
        settings = {"num.log.threads": threads, "log.level": "WARNING",
                    "actor.start.timeout.ms": int(start_timeout * 1000)}
        settings.update(s.split("=", 1) for s in extra)
        super().__init__(data_dir, settings, start_timeout=start_timeout)

    def start(self) -> float:
        super().start()
        return self.started_s

    def status(self) -> list[dict]:
        return super().status(timeout=30.0)["actors"]

    def stop(self, timeout: float = 300.0) -> float:
        """SIGTERM the supervisor (it stops its tree); seconds until everything exited."""
        t = time.perf_counter()
        super().stop(timeout)
        return time.perf_counter() - t


def _disk_bytes(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def _topics(partitions: int) -> list[tuple[str, int]]:
    out, left, i = [], partitions, 0
    while left:
        n = min(left, TOPIC_MAX)
        out.append((f"place-{i}", n))
        left -= n
        i += 1
    return out


def _memory(broker: Broker) -> dict:
    rows = broker.status()
    logs = [r for r in rows if r["role"] == "log"]
    fetch = [r for r in rows if r["role"] == "fetch"]
    out = {"log_rss": 0, "log_uss": 0, "log_fds": 0, "fetch_fds": 0, "fetch_uss": 0}
    for r in logs:
        p = psutil.Process(r["pid"])
        m = p.memory_full_info()
        out["log_rss"] += m.rss
        out["log_uss"] += m.uss
        out["log_fds"] += p.num_fds()
    for r in fetch:
        p = psutil.Process(r["pid"])
        out["fetch_fds"] += p.num_fds()
        out["fetch_uss"] += p.memory_full_info().uss
    out["log_uss_max"] = max(psutil.Process(r["pid"]).memory_full_info().uss for r in logs)
    return out


def _produce(port: int, topics: list[tuple[str, int]], batches: int, per_request: int = 50,
             depth: int = 8) -> dict:
    from odradek.network.client import BrokerConnection
    from odradek.core.protocol import ApiKey
    batch = encode_batch([(None, os.urandom(100)) for _ in range(16)], None)
    parts = [(t, p) for t, n in topics for p in range(n)]
    conn = BrokerConnection("127.0.0.1", port, client_id="placement-bench", request_timeout_ms=120000)
    requests = []
    i = 0
    while i < batches:
        chunk = [parts[(i + k) % len(parts)] for k in range(min(per_request, batches - i))]
        by_topic: dict[str, list] = {}
        for k, (t, p) in enumerate(chunk):
            by_topic.setdefault(t, []).append({"index": p, "frame": k})
        requests.append(({"acks": 1, "timeout_ms": 60000,
                          "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]},
                         [batch] * len(chunk)))
        i += len(chunk)
    errors = 0
    inflight = []
    t = time.perf_counter()
    for body, frames in requests:
        inflight.append(conn.send(ApiKey.PRODUCE, body, frames))
        if len(inflight) >= depth:
            errors += _errors(conn.receive(inflight.pop(0)))
    for c in inflight:
        errors += _errors(conn.receive(c))
    seconds = time.perf_counter() - t
    conn.close()
    return {"records_s": batches * 16 / seconds, "MBps": batches * len(batch) / seconds / 1e6,
            "errors": errors, "seconds": seconds}


def _errors(resp) -> int:
    return sum(1 for t in resp.body.get("topics", []) for p in t.get("partitions", []) if p.get("error_code"))


def run_one(root: str, partitions: int, threads: int, batches: int, extra: list[str]) -> dict:
    from odradek import Admin
    data = tempfile.mkdtemp(prefix=f"p{partitions}-n{threads}-", dir=root)
    broker = Broker(data, threads, extra)
    res = {"partitions": partitions, "threads": threads}
    try:
        res["first_start_s"] = broker.start()
        empty = _memory(broker)
        res["empty_log_uss"] = empty["log_uss"] / threads
        topics = _topics(partitions)
        t = time.perf_counter()
        with Admin(f"127.0.0.1:{broker.port}", request_timeout_ms=600000) as admin:
            for name, n in topics:
                admin.create_topic(name, partitions=n)
        res["create_s"] = time.perf_counter() - t
        res["disk"] = _disk_bytes(data)
        res.update(_produce(broker.port, topics, batches))
        res.update(_memory(broker))
        res["stop_s"] = broker.stop()
        res["restart_s"] = broker.start()
        mem = _memory(broker)
        res["restart_log_uss"] = mem["log_uss"]
        broker.kill()
        res["unclean_restart_s"] = broker.start()
        broker.stop()
    finally:
        broker.kill()
        shutil.rmtree(data, ignore_errors=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m odradek.bench.placement", description=__doc__.split("\n")[0])
    p.add_argument("--partitions", default="10,1000,5000")
    p.add_argument("--threads", default="1,2,4")
    p.add_argument("--batches", type=int, default=20000, help="batches produced per configuration")
    p.add_argument("--dir", default=None, help="where the data directories go (default: a temp dir)")
    p.add_argument("--set", action="append", default=[], help="extra broker setting key=value")
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration; medians are printed")
    a = p.parse_args(argv)
    root = tempfile.mkdtemp(prefix="odradek-placement-", dir=a.dir)
    rows = []
    try:
        for partitions in [int(x) for x in a.partitions.split(",")]:
            for threads in [int(x) for x in a.threads.split(",")]:
                runs = []
                for _ in range(a.repeat):
                    runs.append(run_one(root, partitions, threads, a.batches, a.set))
                    print(runs[-1], file=sys.stderr, flush=True)
                rows.append({k: statistics.median(r[k] for r in runs) for k in runs[0]})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"medians of {a.repeat} runs per row")
    print("| partitions | log threads | create | disk | log actors RSS (USS) | USS per log actor | fds: log actors / fetch | "
          "produce records/s (MB/s) | stop | clean start | unclean start |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['partitions']} | {r['threads']} | {r['create_s']:.1f} s | {r['disk'] / MiB:.0f} MiB | "
              f"{r['log_rss'] / MiB:.0f} ({r['log_uss'] / MiB:.0f}) MiB | "
              f"{r['log_uss'] / r['threads'] / MiB:.0f} MiB (max {r['log_uss_max'] / MiB:.0f}) | "
              f"{r['log_fds']:.0f} / {r['fetch_fds']:.0f} | {r['records_s']:,.0f} ({r['MBps']:.1f}){' ERR' if r['errors'] else ''} | "
              f"{r['stop_s']:.1f} s | {r['restart_s']:.1f} s | {r['unclean_restart_s']:.1f} s |")
    one = statistics.median(r["empty_log_uss"] for r in rows)
    print(f"\nUSS of one log-actor process hosting no partition: median {one / MiB:.1f} MiB; a process per "
          "partition would cost " + ", ".join(f"{n:,} x that = {n * one / (1 << 30):.1f} GiB"
                                              for n in sorted({r['partitions'] for r in rows})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
