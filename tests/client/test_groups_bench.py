"""Benchmark of rebalances: how long a joining member takes to consume, and what the members
that keep their partitions lose meanwhile. Consumers run in their own processes
(tests/client/test_groups_worker.py); a producer thread writes a steady load.

    python -m tests.client.test_groups_bench [--partitions 12] [--members 4] [--rate 4000]
        [--bootstrap-server HOST:PORT]   (default: start a broker in a temporary directory)

Each round adds one member to a settled group of ``k`` members (k = 1 .. members-1) and
reports, from the workers' timelines (one monotonic clock for every process):

  join->assigned   the new member's start (just before subscribe) to its first partitions
  join->consuming  the same start to the first record it returned
  kept rate        records/s the old members returned from the partitions they kept, during
                   the change (start .. assigned + 0.5 s) and in the 2 s before it
  max gap          the longest pause between two polls returning records of one kept
                   partition during the change (the producer writes every 50 ms)

``test_the_benchmark_runs`` runs one small round in the test suite, so the tool keeps working.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from tests.client.test_groups import Load, Worker, create_topic, stable_with
from tests.network.helpers import wait_until


def _owned_at(w: Worker, t: float) -> set[int]:
    owned: set[int] = set()
    for e in w.events():
        if float(e[1]) > t:
            break
        if e[0] == "A" and e[2:]:
            owned |= {int(p) for p in e[2].split(",") if p}
        elif e[0] == "V" and len(e) > 2:
            owned -= {int(p) for p in e[2].split(",") if p}
    return owned


def _records(ws, parts_of, t0: float, t1: float) -> tuple[int, float]:
    """Records returned from each worker's ``parts_of[w]`` in [t0, t1]; the longest gap."""
    total, gap = 0, 0.0
    for w in ws:
        last: dict[int, float] = {}
        for e in w.events():
            if e[0] != "R":
                continue
            t, p = float(e[1]), int(e[2])
            if p not in parts_of[w.path] or not t0 <= t <= t1:
                continue
            total += int(e[4]) - int(e[3]) + 1
            gap = max(gap, t - last.get(p, t0))
            last[p] = t
        for p in parts_of[w.path]:
            gap = max(gap, t1 - last.get(p, t0))
    return total, gap


def run_round(broker, workdir: str, topic: str, k: int, partitions: int, rate: int) -> dict:
    load = Load(broker, topic, partitions, rate=rate)
    ws: list[Worker] = []
    try:
        for i in range(k):
            ws.append(Worker(broker, f"{workdir}/{topic}-w{i}", group=topic, topic=topic))
            wait_until(lambda: stable_with(broker, i + 1, topic), timeout=60, what="the group to settle")
        time.sleep(2.5)
        new = Worker(broker, f"{workdir}/{topic}-new", group=topic, topic=topic)
        wait_until(lambda: any(e[0] == "R" for e in new.events()) and stable_with(broker, k + 1, topic),
                   timeout=60, what="the new member to consume")
        time.sleep(1.0)
        ev = new.events()
        start = float(next(e for e in ev if e[0] == "S")[1])
        assigned = float(next(e for e in ev if e[0] == "A")[1])
        first = float(next(e for e in ev if e[0] == "R")[1])
        end = assigned + 0.5
        kept = {w.path: _owned_at(w, start - 0.01) & _owned_at(w, end) for w in ws}
        n_kept = sum(len(v) for v in kept.values())
        during, gap = _records(ws, kept, start, end)
        before, gap_before = _records(ws, kept, start - 2.0, start)
        ws.append(new)
        return {"members": k, "join_assigned_ms": (assigned - start) * 1000,
                "join_consuming_ms": (first - start) * 1000, "kept_partitions": n_kept,
                "kept_rate_before": before / 2.0, "kept_rate_during": during / (end - start),
                "expected_kept_rate": rate * n_kept / partitions,
                "max_gap_ms": gap * 1000, "max_gap_before_ms": gap_before * 1000}
    finally:
        load.stop()
        for w in ws:
            w.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.client.test_groups_bench")
    ap.add_argument("--partitions", type=int, default=12)
    ap.add_argument("--members", type=int, default=4, help="grow the group from 1 to this many")
    ap.add_argument("--rate", type=int, default=4000, help="records/s produced")
    ap.add_argument("--bootstrap-server")
    args = ap.parse_args(argv)
    from tests.conftest import BrokerProcess
    tmp = tempfile.mkdtemp(prefix="odradek-groups-bench-")
    broker = None
    if args.bootstrap_server:
        host, _, port = args.bootstrap_server.rpartition(":")
        broker = type("B", (), {"host": host, "port": int(port), "bootstrap": args.bootstrap_server})()
    else:
        broker = BrokerProcess(tmp + "/broker", {}).start()
    rows = []
    try:
        for k in range(1, args.members):
            topic = f"bench-{k}-{int(time.time())}"
            create_topic(broker, topic, args.partitions)
            rows.append(run_round(broker, tmp, topic, k, args.partitions, args.rate))
            r = rows[-1]
            print(f"{r['members']}->{r['members'] + 1} members: join->assigned {r['join_assigned_ms']:.0f} ms, "
                  f"join->consuming {r['join_consuming_ms']:.0f} ms; {r['kept_partitions']} kept partitions: "
                  f"{r['kept_rate_before']:.0f} rec/s before, {r['kept_rate_during']:.0f} rec/s during "
                  f"(produced {r['expected_kept_rate']:.0f}), max gap {r['max_gap_ms']:.0f} ms "
                  f"(before: {r['max_gap_before_ms']:.0f} ms)", flush=True)
    finally:
        if hasattr(broker, "stop"):
            broker.stop()
    print(f"median join->consuming {statistics.median(r['join_consuming_ms'] for r in rows):.0f} ms over "
          f"{len(rows)} joins")
    return 0


def test_the_benchmark_runs(broker, tmp_path):
    create_topic(broker, "bench", 4)
    r = run_round(broker, str(tmp_path), "bench", 1, 4, 1000)
    assert r["join_consuming_ms"] > 0 and r["kept_partitions"] == 2 and r["kept_rate_during"] > 0


if __name__ == "__main__":
    sys.exit(main())
