"""``odradek perf console``: how long the console's pages take on a broker with many topics
and groups, against the goal of every page under 200 ms (``GOAL_MS``; docs/BENCHMARKS.md,
"Console page loads").

Starts its own broker (127.0.0.1, ephemeral ports, a temp dir, stopped in a ``finally``),
creates ``--topics`` topics (one partition each) and ``--groups`` groups (each with offsets
committed on two topics, behind the log end: they have lag), waits one history sample, then
loads each page ``--runs`` times, in turn (topics, groups, a topic, a group, its messages,
brokers, security, charts, /metrics), over one HTTP connection per request as a browser's
first visit would, after one warm-up load each. Prints each page's median and p95 in ms,
its size, and whether it meets the goal. The timing is the server's whole answer as the
client sees it (connect, request, the page's broker requests, rendering, the body read).

    odradek perf console                       # 1,000 topics, 100 groups, 20 loads a page
    odradek perf console --topics 200 --runs 5 --json
"""
from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.parse

from odradek.perf import loadavg, percentile

GOAL_MS = 200.0


def pages(topic: str, group: str) -> list[tuple[str, str]]:
    return [("topics", "/topics"), ("groups", "/groups"), ("a topic", f"/topics/{topic}"),
            ("a group", f"/groups/{group}"), ("messages", f"/topics/{topic}/messages"), ("brokers", "/brokers"),
            ("security", "/security"), ("charts", "/charts"), ("metrics", "/metrics")]


def load(base: str, path: str) -> tuple[float, int]:
    """(seconds, bytes) of one GET on a new connection; raises unless 200."""
    parts = urllib.parse.urlsplit(base)
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        body = r.read()
    finally:
        conn.close()
    elapsed = time.perf_counter() - t0
    if r.status != 200:
        raise RuntimeError(f"GET {path}: HTTP {r.status}: {body[:200]!r}")
    return elapsed, len(body)


def populate(bootstrap: str, topics: int, groups: int) -> tuple[str, str]:
    """``topics`` topics of one partition, 10 records in each of the first ``groups`` * 2,
    and ``groups`` groups each committed at offset 5 on two of them; a topic and a group to
    open."""
    from odradek import Admin, Consumer, Producer
    from odradek.types import TopicPartition
    names = [f"perf-console-{i:05d}" for i in range(topics)]
    with Admin(bootstrap, request_timeout_ms=60000) as admin:
        for name in names:
            admin.create_topic(name)
    used = names[:min(len(names), 2 * groups)]
    with Producer(bootstrap, linger_ms=5) as producer:
        for name in used:
            for i in range(10):
                producer.send(name, value=b"record %d of %s" % (i, name.encode()))
        producer.flush()
    for g in range(groups):
        consumer = Consumer(bootstrap, group_id=f"perf-console-group-{g:03d}", enable_auto_commit=False)
        try:
            consumer.commit({TopicPartition(used[(2 * g + k) % len(used)], 0): 5 for k in (0, 1)})
        finally:
            consumer.close()
    return names[0], "perf-console-group-000"


def measure(base: str, topic: str, group: str, runs: int) -> list[dict]:
    todo = pages(topic, group)
    for _, path in todo:  # warm-up: the console's clients connect, templates compile
        load(base, path)
    times: dict[str, list[float]] = {name: [] for name, _ in todo}
    sizes: dict[str, int] = {}
    for _ in range(runs):  # in turn, so a slow moment of the machine spreads over every page
        for name, path in todo:
            elapsed, size = load(base, path)
            times[name].append(elapsed * 1000)
            sizes[name] = size
    out = []
    for name, path in todo:
        ordered = sorted(times[name])
        out.append({"page": name, "path": path, "median_ms": round(statistics.median(ordered), 1),
                    "p95_ms": round(percentile(ordered, 95), 1), "max_ms": round(ordered[-1], 1),
                    "bytes": sizes[name], "meets_goal": percentile(ordered, 95) < GOAL_MS})
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="odradek perf console", description="console page-load times")
    ap.add_argument("--topics", type=int, default=1000)
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--runs", type=int, default=20, help="loads of each page (after one warm-up load)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.topics < 2 or args.groups < 1:
        ap.error("--topics must be at least 2 and --groups at least 1")
    from odradek.local import LocalBroker
    data = tempfile.mkdtemp(prefix="odradek-perf-console-")
    broker = LocalBroker(data, {"listeners": "PLAINTEXT://127.0.0.1:0"}, start_timeout=300)
    try:
        broker.start()
        t0 = time.monotonic()
        print(f"creating {args.topics} topics and {args.groups} groups on {broker.bootstrap} ...", file=sys.stderr)
        topic, group = populate(broker.bootstrap, args.topics, args.groups)
        setup_s = time.monotonic() - t0
        time.sleep(11)  # one history sample (every 10 s) for the charts' first load
        result = {"topics": args.topics, "groups": args.groups, "runs": args.runs, "setup_s": round(setup_s, 1),
                  "loadavg_before": loadavg(), "pages": measure(broker.console_url, topic, group, args.runs),
                  "loadavg_after": loadavg()}
    finally:
        broker.stop()
        shutil.rmtree(data, ignore_errors=True)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"console page loads: {args.topics} topics, {args.groups} groups, {args.runs} loads a page "
          f"(set-up {result['setup_s']} s; load average {result['loadavg_before']} -> {result['loadavg_after']})")
    print(f"{'page':<10} {'path':<40} {'median ms':>10} {'p95 ms':>8} {'max ms':>8} {'bytes':>9}  goal < {GOAL_MS:.0f} ms")
    for p in result["pages"]:
        print(f"{p['page']:<10} {p['path'][:40]:<40} {p['median_ms']:>10} {p['p95_ms']:>8} {p['max_ms']:>8} "
              f"{p['bytes']:>9}  {'met' if p['meets_goal'] else 'NOT met'}")
    return 0
