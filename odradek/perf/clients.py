"""Benchmarks shaped like Kafka's perf tools: ``odradek perf produce | consume | e2e |
replicated | failover | scrape`` (docs/BENCHMARKS.md has the figures and their commands).

    odradek perf produce --local --client odradek,confluent --runs 3 --num-records 2000000
    odradek perf consume --topic perf --messages 2000000
    odradek perf e2e --topic perf-e2e --num-records 10000 --throughput 1000
    odradek perf replicated --runs 3 --cpu       # acks=all / acks=1 / RF 1 on a 3-broker local cluster
    odradek perf failover --session-timeout-ms 6000 3000 --runs 5

``produce`` and ``consume`` run here (the Producer adds its sender thread); ``--client``
picks the bundled client or confluent-kafka on the Kafka protocol (a comma list runs them
interleaved, ``--runs`` each, medians); ``--local`` starts a broker of their own; they report
the broker's CPU (psutil over its process tree) per batch and per record, and, unless
``--no-redis``, the same workload against Redis Streams on a redis-server they start
(``appendfsync no``: a log in the page cache). ``e2e`` consumes in a child process (no shared
GIL); its latency is send() to receipt, from a CLOCK_MONOTONIC stamp in each value's first 8
bytes. ``produce``'s latency is sampled: every ``--latency-sample``-th record, send() to
acknowledgement. ``replicated`` and ``failover`` start their own ZooKeeper and brokers on
127.0.0.1 (``odradek.local.LocalCluster``, data in a temporary directory) and stop them in a
``finally``; ``replicated --bootstrap-server`` uses a running cluster instead.
"""
from __future__ import annotations

import argparse
import json
import os
import importlib.util
import itertools
import shutil
import struct
import subprocess
import sys
import tempfile
import time

from odradek.bench.peers import PeerServer

_STAMP = struct.Struct(">q")
REPORT_INTERVAL_MS = 5000
TICK_SECONDS = 1.0  # one point of the timeline (and of the live line) per second


# ---- statistics -------------------------------------------------------------------------------
class Stats:
    """Counts, bytes and latency samples; prints Kafka-style progress and summary lines, a
    live line rewritten every second when the output is a terminal (records/s, MB/s,
    latency so far), and keeps a per-second ``timeline`` for ``--plot``.
    Thread-safe for ``sample`` (callbacks on the sender thread) via the GIL's atomic appends."""

    def __init__(self, report_ms: int = REPORT_INTERVAL_MS, out=None, live: bool | None = None):
        self.start = self.window_start = self.tick_start = time.monotonic()
        self.report_every = report_ms / 1000
        self.count = self.bytes = 0
        self.window_count = self.window_bytes = 0
        self.tick_count = self.tick_bytes = 0
        self.latencies: list[float] = []  # ms
        self.window_lat: list[float] = []
        self.tick_lat: list[float] = []
        # (seconds since start, records/s, MB/s, p50 ms, p99 ms) per TICK_SECONDS
        self.timeline: list[tuple[float, float, float, float, float]] = []
        self._out = out
        self.live = self.out.isatty() if live is None else live
        self._live_shown = False

    @property
    def out(self):
        return self._out or sys.stdout

    def sample(self, latency_ms: float) -> None:
        self.latencies.append(latency_ms)
        self.window_lat.append(latency_ms)
        self.tick_lat.append(latency_ms)

    def tick(self, count: int, nbytes: int, now: float) -> None:
        """Once a second: a timeline point, and the live line on a terminal."""
        if now - self.tick_start < TICK_SECONDS:
            return
        elapsed = now - self.tick_start
        lat, self.tick_lat = sorted(self.tick_lat), []
        point = (now - self.start, (count - self.tick_count) / elapsed, (nbytes - self.tick_bytes) / elapsed / 2**20,
                 percentile(lat, 50), percentile(lat, 99))
        self.timeline.append(point)
        self.tick_start, self.tick_count, self.tick_bytes = now, count, nbytes
        if self.live:
            so_far = sorted(self.latencies)
            tail = (f", latency so far p50 {percentile(so_far, 50):.1f} ms p99 {percentile(so_far, 99):.1f} ms"
                    if so_far else "")
            print(f"\r\033[K{count} records, {point[1]:.0f} records/s, {point[2]:.2f} MB/s{tail}",
                  end="", file=self.out, flush=True)
            self._live_shown = True

    def _end_live_line(self) -> None:
        if self._live_shown:
            print("\r\033[K", end="", file=self.out, flush=True)
            self._live_shown = False

    def progress(self, count: int, nbytes: int, unit: str = "records sent", latency: bool = True) -> None:
        now = time.monotonic()
        self.tick(count, nbytes, now)
        if now - self.window_start < self.report_every:
            return
        self._end_live_line()
        elapsed = now - self.window_start
        n, b = count - self.window_count, nbytes - self.window_bytes
        lat = self.window_lat
        self.window_lat = []
        avg = sum(lat) / len(lat) if lat else 0.0
        mx = max(lat) if lat else 0.0
        tail = f", {avg:.1f} ms avg latency, {mx:.1f} ms max latency" if latency else ""
        print(f"{n} {unit}, {n / elapsed:.1f} records/sec ({b / elapsed / 2**20:.2f} MB/sec){tail}.",
              file=self.out, flush=True)
        self.window_start, self.window_count, self.window_bytes = now, count, nbytes

    def summary(self, count: int, nbytes: int, elapsed: float, unit: str = "records sent",
                latency: bool = True) -> dict:
        self._end_live_line()
        lat = sorted(self.latencies)
        pct = {p: percentile(lat, p) for p in (50, 95, 99, 99.9)}
        result = {"records": count, "seconds": elapsed, "records_per_sec": count / elapsed if elapsed else 0.0,
                  "mb_per_sec": nbytes / elapsed / 2**20 if elapsed else 0.0,
                  "avg_latency_ms": sum(lat) / len(lat) if lat else 0.0, "max_latency_ms": lat[-1] if lat else 0.0,
                  "p50_ms": pct[50], "p95_ms": pct[95], "p99_ms": pct[99], "p99_9_ms": pct[99.9],
                  "latency_samples": len(lat), "timeline": self.timeline}
        tail = (f", {result['avg_latency_ms']:.2f} ms avg latency, {result['max_latency_ms']:.2f} ms max latency, "
                f"{pct[50]:.2f} ms 50th, {pct[95]:.2f} ms 95th, {pct[99]:.2f} ms 99th, {pct[99.9]:.2f} ms 99.9th"
                if latency else "")
        print(f"{count} {unit}, {result['records_per_sec']:.1f} records/sec ({result['mb_per_sec']:.2f} MB/sec)"
              f"{tail}.", file=self.out, flush=True)
        return result


def _plot_file(value: str) -> str:
    """argparse type of ``--plot``: refused before the run, not after it."""
    from odradek.plot import check_path
    try:
        return check_path(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def write_plot(path: str, title: str, result: dict, latency: bool = True) -> None:
    """``--plot FILE``: throughput over time, latency over time and its percentiles."""
    from odradek import plot
    t = [p[0] for p in result["timeline"]]
    panels = [plot.Panel("records/s", [plot.Line("records/s", t, [p[1] for p in result["timeline"]])]),
              plot.Panel("MB/s", [plot.Line("MB/s", t, [p[2] for p in result["timeline"]])])]
    bars = None
    if latency:
        panels.append(plot.Panel("latency ms", [plot.Line("p50", t, [p[3] for p in result["timeline"]]),
                                                plot.Line("p99", t, [p[4] for p in result["timeline"]])]))
        bars = ("latency ms", ["p50", "p95", "p99", "p99.9", "max"],
                [result["p50_ms"], result["p95_ms"], result["p99_ms"], result["p99_9_ms"], result["max_latency_ms"]])
    try:
        plot.figure(path, title, panels, bars)
    except plot.PlotUnavailable as exc:
        print(f"no plot: {exc}", file=sys.stderr, flush=True)
        return
    print(f"Plot written to {path}", flush=True)


def percentile(sorted_values: list, p: float) -> float:
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, int(len(sorted_values) * p / 100))
    return sorted_values[i]


class Throttle:
    """Kafka's ThroughputThrottler: sleep when ahead of ``rate`` records/s (-1: no limit)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.start = time.monotonic()

    def wait(self, sent: int) -> None:
        if self.rate <= 0:
            return
        ahead = sent / self.rate - (time.monotonic() - self.start)
        if ahead > 0.0005:
            time.sleep(ahead)


def _props(items: list[str]) -> dict:
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"perf: expected key=value, got {item!r}")
        out[k.strip()] = v.strip()
    return out


def producer_kwargs(props: dict) -> dict:
    """Kafka producer property names -> Producer keyword arguments."""
    names = {"acks": ("acks", str), "linger.ms": ("linger_ms", float), "batch.size": ("batch_size", int),
             "compression.type": ("compression", str), "retries": ("retries", int),
             "retry.backoff.ms": ("retry_backoff_ms", int), "request.timeout.ms": ("request_timeout_ms", int),
             "max.in.flight.requests.per.connection": ("max_in_flight", int),
             "buffer.memory": ("buffer_memory", int), "max.request.size": ("max_request_size", int),
             "client.id": ("client_id", str), "delivery.timeout.ms": ("delivery_timeout_ms", int),
             "enable.idempotence": ("enable_idempotence", lambda v: v.lower() == "true")}
    out = {}
    for k, v in props.items():
        if k not in names:
            raise SystemExit(f"perf: unknown producer property {k!r} (known: {', '.join(sorted(names))})")
        name, kind = names[k]
        out[name] = kind(v)
    if "acks" in out and out["acks"] != "all":
        out["acks"] = int(out["acks"])
    if out.get("compression") == "none":
        out["compression"] = None
    return out


def random_payload(size: int) -> bytes:
    """Like Kafka's perf tool: one random payload of uppercase letters, reused."""
    import random
    rnd = random.Random(42)
    return bytes(rnd.randrange(65, 91) for _ in range(size))


def _ensure_topic(bootstrap: str, topic: str, partitions: int, like: str | None = None) -> int:
    """Create ``topic`` unless it exists: laid out as ``like`` if that exists (a peer client's own
    topic beside the user's: the same partitions, replication factor and min.insync.replicas,
    so both clients are measured against the same replication), else with ``partitions`` and
    the broker's default replication factor. Returns its partition count."""
    from odradek.admin import Admin
    from odradek.errors import TopicAlreadyExistsError
    # 10,000 partitions take minutes to create on a loaded machine: the default 30 s timeout failed
    with Admin(bootstrap, request_timeout_ms=max(60000, 60 * partitions)) as admin:
        existing = admin.list_topics()
        if topic not in existing:
            replication, config = -1, {}
            if like is not None and like in existing:
                model = admin.describe_topic(like)
                partitions, replication = len(model.partitions), len(model.partitions[0].replicas)
                config = {k: v for k, v in model.configs.items() if k == "min.insync.replicas"}
            try:
                admin.create_topic(topic, partitions, replication_factor=replication, config=config)
                print(f"Created topic {topic} with {partitions} partitions"
                      f"{f', laid out as {like}' if like in existing else ''}.", flush=True)
            except TopicAlreadyExistsError:  # a retried request, or another client: wait for it below
                pass
        # a creation still under way (a retried request answered "already exists") is not in
        # the metadata yet: wait until it is (the 10,000-partition run found no topic)
        deadline = time.monotonic() + admin.request_timeout_ms / 1000
        while True:
            admin._cluster.refresh([topic])
            found = len(admin._cluster.partitions(topic) or ())
            if found or time.monotonic() > deadline:
                return found
            time.sleep(1.0)


# ---- produce ----------------------------------------------------------------------------------
def produce_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="odradek perf produce", description="producer throughput (like "
                                 "kafka-producer-perf-test)")
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--num-records", type=int, required=True)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--throughput", type=float, default=-1, help="records/s cap; -1 for none")
    ap.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--partitions", type=int, default=1, help="partitions if the topic must be created")
    ap.add_argument("--latency-sample", type=int, default=100, help="time every Nth record's acknowledgement")
    ap.add_argument("--keys", type=int, default=0, help="keyed records, cycling through this many distinct keys "
                    "(0: keyless, the default)")
    ap.add_argument("--reporting-interval", type=int, default=REPORT_INTERVAL_MS, help="ms between progress lines")
    ap.add_argument("--no-redis", action="store_true", help="skip the Redis Streams comparison")
    ap.add_argument("--json", action="store_true", help="print the summaries as one JSON line at the end")
    ap.add_argument("--plot", metavar="FILE", type=_plot_file, help="write throughput and latency over time to FILE (.png or .svg)")
    ap.add_argument("--connections", type=int, default=0, help="N bundled producers (one connection each) "
                    "sharing --num-records, spread over --client-processes; records/s summed (0: one producer "
                    "in this process). With --local the broker admits them all (max.connections and "
                    "max.connections.per.ip raised); a running broker needs those settings itself")
    ap.add_argument("--client-processes", type=int, default=4, help="client processes of --connections")
    _client_args(ap)
    args = ap.parse_args(argv)
    props = {"acks": "1", "linger.ms": "5", "compression.type": "lz4", **_props(args.producer_props)}
    clients = _clients(args.client)
    if args.connections and (clients != ["odradek"] or args.keys or args.plot or args.throughput > 0):
        raise SystemExit("perf: --connections runs the bundled client only, keyless, with no --throughput or --plot")
    if args.connections or clients != ["odradek"] or args.runs > 1 or args.local or args.broker_pid:
        return _side_by_side(args, clients, "produce", props)
    _ensure_topic(args.bootstrap_server, args.topic, args.partitions)
    print(f"odradek: {args.num_records} records of {args.record_size} bytes to '{args.topic}'"
          f"{f', {args.keys} keys' if args.keys else ''}, "
          f"{' '.join(f'{k}={v}' for k, v in props.items())}", flush=True)
    ours = run_produce(args.bootstrap_server, args.topic, args.num_records, args.record_size, args.throughput,
                       producer_kwargs(props), args.latency_sample, args.reporting_interval, keys=args.keys)
    if args.plot:
        write_plot(args.plot, f"perf produce: {args.num_records} x {args.record_size} B to {args.topic}", ours)
    theirs = None
    if not args.no_redis:
        theirs = with_redis(lambda r: redis_produce(r, args.num_records, args.record_size, args.throughput,
                                                     args.latency_sample, args.reporting_interval))
        _compare(ours, theirs, "throughput")
    if args.json:
        print(json.dumps({"odradek": ours, "redis": theirs}))
    return 0 if ours["errors"] == 0 else 1


def _keys(count: int) -> list[bytes] | None:
    """The distinct keys a keyed run cycles through (``--keys``), or None for keyless."""
    return [b"key-%06d" % k for k in range(count)] if count > 0 else None


def run_produce(bootstrap: str, topic: str, n: int, size: int, rate: float, kwargs: dict,
                sample_every: int = 100, report_ms: int = REPORT_INTERVAL_MS, started=None, stopped=None,
                keys: int = 0) -> dict:
    from odradek.producer import Producer
    value = random_payload(size)
    key_list = _keys(keys)
    key_cycle = itertools.cycle(key_list or [None])
    stats = Stats(report_ms)
    errors = []
    throttle = Throttle(rate)
    sample_every = max(1, sample_every)
    monotonic = time.monotonic

    def on_done(handle, t0):
        exc = handle.exception()
        if exc is not None:
            errors.append(exc)
        else:
            stats.sample((monotonic() - t0) * 1000)

    with Producer(bootstrap, **kwargs) as producer:
        send = producer.send
        send(topic, value).result(30)  # metadata and connection outside the timing
        if started:
            started()
        start = monotonic()
        i = 0
        while i < n:
            chunk = min(n, i + sample_every)
            t0 = monotonic()
            if key_list is None:
                h = send(topic, value)
                for _ in range(i + 1, chunk):
                    send(topic, value)
            else:  # the loop's own cost as the keyless one's: an iterator, no index arithmetic
                h = send(topic, value, next(key_cycle))
                for key in itertools.islice(key_cycle, chunk - i - 1):
                    send(topic, value, key)
            h.add_done_callback(lambda h, t0=t0: on_done(h, t0))
            i = chunk
            throttle.wait(i)
            stats.progress(i, i * size)
        producer.flush()
        elapsed = monotonic() - start
        if stopped:
            stopped()
        counted = producer.metrics()
    result = stats.summary(n, n * size, elapsed)
    result["errors"] = len(errors)
    result["batches"], result["requests"] = counted["batches"], counted["requests"]
    if errors:
        print(f"{len(errors)} sampled records failed; first: {errors[0]}", flush=True)
    return result


def _connections_child(bootstrap: str, topic: str, n: int, size: int, kwargs: dict, producers: int,
                       sample_every: int, ready, go, out) -> None:
    """One client process of ``--connections``: ``producers`` bundled Producers (one
    connection each to a single broker), ``n`` records dealt round robin in runs of
    ``sample_every`` per producer; waits for ``go`` once every producer is connected."""
    from odradek.producer import Producer
    value = random_payload(size)
    latencies: list[float] = []
    errors: list = []
    monotonic = time.monotonic
    clients: list = []
    told = False
    try:
        clients = [Producer(bootstrap, **kwargs) for _ in range(producers)]
        for h in [c.send(topic, value) for c in clients]:  # metadata and connections outside the timing
            h.result(300)
        ready.put(os.getpid())
        told = True
        go.wait()
        start = monotonic()
        i, k = 0, 0
        while i < n:
            chunk = min(n, i + sample_every)
            send = clients[k].send
            k = (k + 1) % producers
            t0 = monotonic()
            h = send(topic, value)
            for _ in range(i + 1, chunk):
                send(topic, value)
            h.add_done_callback(lambda h, t0=t0: errors.append(h.exception()) if h.exception() is not None
                                else latencies.append((monotonic() - t0) * 1000))
            i = chunk
        for c in clients:
            c.flush()
        end = monotonic()
        batches = requests = 0
        for c in clients:
            m = c.metrics()
            batches, requests = batches + m["batches"], requests + m["requests"]
        out.put({"start": start, "end": end, "records": n, "latencies": latencies, "errors": len(errors),
                 "first_error": str(errors[0]) if errors else None, "batches": batches, "requests": requests})
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the run
        (out if told else ready).put({"failed": f"{type(exc).__name__}: {exc}"})
    finally:
        for c in clients:
            c.close()


def run_produce_connections(bootstrap: str, topic: str, n: int, size: int, kwargs: dict, connections: int,
                            processes: int, sample_every: int = 100, started=None, stopped=None) -> dict:
    """``--connections N``: N bundled producers, each its own connection, spread over
    ``processes`` client processes (one Python process cannot drive more than ~1 core);
    every producer connects and learns the metadata before the common start; records/s is
    all records over the start to the last process's final flush. Latency samples (every
    ``sample_every``-th record) are merged."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    processes = max(1, min(processes, connections))
    ready, out, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    shares = [connections // processes + (1 if i < connections % processes else 0) for i in range(processes)]
    procs = [ctx.Process(target=_connections_child, daemon=True,
                         args=(bootstrap, topic, n * share // connections, size, kwargs, share,
                               max(1, sample_every), ready, go, out)) for share in shares]
    for p in procs:
        p.start()
    results = []
    try:
        for _ in procs:
            said = ready.get(timeout=900)
            if isinstance(said, dict):
                raise SystemExit(f"perf: a client process failed: {said['failed']}")
        if started:
            started()
        t_go = time.monotonic()
        go.set()
        results = [out.get(timeout=3600) for _ in procs]
        if stopped:
            stopped()
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    failed = [r["failed"] for r in results if "failed" in r]
    if failed:
        raise SystemExit(f"perf: a client process failed: {failed[0]}")
    total = sum(r["records"] for r in results)
    elapsed = max(r["end"] for r in results) - t_go
    lat = sorted(x for r in results for x in r["latencies"])
    errors = sum(r["errors"] for r in results)
    result = {"records": total, "seconds": elapsed, "records_per_sec": total / elapsed if elapsed else 0.0,
              "mb_per_sec": total * size / elapsed / 2**20 if elapsed else 0.0,
              "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "latency_samples": len(lat),
              "errors": errors, "batches": sum(r["batches"] for r in results),
              "requests": sum(r["requests"] for r in results), "timeline": []}
    print(f"{total} records sent over {connections} connections from {processes} processes, "
          f"{result['records_per_sec']:.1f} records/sec ({result['mb_per_sec']:.2f} MB/sec), "
          f"{result['p50_ms']:.2f} ms 50th, {result['p99_ms']:.2f} ms 99th.", flush=True)
    if errors:
        print(f"{errors} sampled records failed; first: "
              f"{next(r['first_error'] for r in results if r['first_error'])}", flush=True)
    return result


# ---- consume ----------------------------------------------------------------------------------
def consume_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="odradek perf consume", description="consumer throughput (like "
                                 "kafka-consumer-perf-test)")
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--messages", type=int, required=True)
    ap.add_argument("--record-size", type=int, default=100, help="size of prefilled records")
    ap.add_argument("--partitions", type=int, default=1, help="partitions if the topic must be created")
    ap.add_argument("--fetch-size", type=int, default=1 << 20, help="max_partition_fetch_bytes")
    ap.add_argument("--keys", type=int, default=0, help="prefill keyed records, cycling through this many distinct "
                    "keys (0: keyless); a topic already holding --messages records is read as it is")
    ap.add_argument("--max-poll-records", type=int, default=500, help="records per poll (Kafka's default)")
    ap.add_argument("--consumer-props", nargs="*", default=[], metavar="KEY=VALUE",
                    help="librdkafka consumer properties for --client confluent (over perf's)")
    ap.add_argument("--timeout", type=int, default=60000, help="ms without a record before giving up")
    ap.add_argument("--reporting-interval", type=int, default=REPORT_INTERVAL_MS)
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plot", metavar="FILE", type=_plot_file, help="write throughput over time to FILE (.png or .svg)")
    _client_args(ap)
    args = ap.parse_args(argv)
    clients = _clients(args.client)
    if clients != ["odradek"] or args.runs > 1 or args.local or args.broker_pid:
        return _side_by_side(args, clients, "consume", {})
    count = _ensure_topic(args.bootstrap_server, args.topic, args.partitions)
    _prefill(args.bootstrap_server, args.topic, count, args.messages, args.record_size, args.keys)
    ours = run_consume(args.bootstrap_server, args.topic, count, args.messages, args.fetch_size,
                       args.max_poll_records, args.timeout, args.reporting_interval)
    if args.plot:
        write_plot(args.plot, f"perf consume: {args.messages} records of {args.topic}", ours, latency=False)
    theirs = None
    if not args.no_redis:
        theirs = with_redis(lambda r: redis_consume(r, args.messages, args.record_size, args.reporting_interval))
        _compare(ours, theirs, "throughput")
    if args.json:
        print(json.dumps({"odradek": ours, "redis": theirs}))
    return 0 if ours["records"] >= args.messages else 1


def _prefill(bootstrap: str, topic: str, partitions: int, n: int, size: int, keys: int = 0) -> None:
    from odradek.consumer import Consumer
    from odradek.producer import Producer
    from odradek.types import TopicPartition
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap) as c:
        have = sum(c.end_offsets(tps).values()) - sum(c.beginning_offsets(tps).values())
    if have >= n:
        return
    print(f"Prefilling '{topic}' with {n - have} records of {size} bytes{f', {keys} keys' if keys else ''} "
          f"(not timed).", flush=True)
    value = random_payload(size)
    key_list = _keys(keys)
    with Producer(bootstrap, acks=1, linger_ms=5) as p:
        for i in range(n - have):
            p.send(topic, value, key=key_list[i % keys] if keys else None)


class _ConsumeClock:
    """The throughput of a consume run, timed from the first records received to the last
    (the first batch not counted: it took no measured time), as kafka-consumer-perf-test
    leaves a group's join out: a client's start-up is not its throughput. librdkafka spends
    ~0.6 s between ``assign`` and its first fetch (its group state machine's timer, then
    ListOffsets), where the bundled consumer resolves its positions before the clock starts;
    timed from ``assign``, a 1,000,000-record run measured that start-up as much as the
    reading. The start-up is reported on its own (``first_record_s``)."""

    def __init__(self):
        self.start = time.monotonic()
        self.first: tuple | None = None  # (time, records, bytes) once the first batch is counted
        self.last = self.start

    def received(self, now: float, count: int, nbytes: int) -> None:
        """After each batch is counted (``count``, ``nbytes``: the totals so far)."""
        if self.first is None:
            self.first = (now, count, nbytes)
        self.last = now

    def timed(self, count: int, nbytes: int) -> tuple[int, int, float]:
        """(records, bytes, seconds) after the first batch."""
        if self.first is None:
            return 0, 0, 0.0
        at, n0, b0 = self.first
        return count - n0, nbytes - b0, self.last - at

    def summary(self, stats: "Stats", count: int, nbytes: int) -> dict:
        timed, timed_bytes, elapsed = self.timed(count, nbytes)
        result = stats.summary(timed, timed_bytes, elapsed, "records consumed after the first batch", latency=False)
        result["first_record_s"] = (self.first[0] - self.start) if self.first else None
        result["records"] = count
        if self.first:
            print(f"first records {result['first_record_s']:.2f} s after the start", flush=True)
        return result


def run_consume(bootstrap: str, topic: str, partitions: int, n: int, fetch_size: int, max_poll: int,
                timeout_ms: int, report_ms: int = REPORT_INTERVAL_MS, started=None, stopped=None) -> dict:
    from odradek.consumer import Consumer
    from odradek.types import TopicPartition
    stats = Stats(report_ms)
    count = nbytes = 0
    with Consumer(bootstrap, auto_offset_reset="earliest", max_partition_fetch_bytes=fetch_size,
                  max_poll_records=max_poll) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        for tp in c.assignment():
            c.position(tp)
        if started:
            started()
        clock = _ConsumeClock()
        last = clock.start
        print("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec", flush=True)
        while count < n:
            records = c.poll(timeout_ms=100, max_records=min(max_poll, n - count))
            now = time.monotonic()
            if not records:
                if now - last > timeout_ms / 1000:
                    print(f"no record for {timeout_ms} ms after {count}: giving up", flush=True)
                    break
                continue
            last = now
            count += len(records)
            nbytes += len(records) * len(records[0].value or b"")  # one size per run: values are equal
            clock.received(now, count, nbytes)
            stats.progress(count, nbytes, "records consumed", latency=False)
        if stopped:
            stopped()
    timed, timed_bytes, elapsed = clock.timed(count, nbytes)
    mb = timed_bytes / 2**20
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(time.time() - elapsed))}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}, {mb:.4f}, {mb / elapsed:.4f}, {timed}, {timed / elapsed:.4f}",
          flush=True)
    return clock.summary(stats, count, nbytes)


# ---- Kafka clients: the same workloads through confluent-kafka -----------------------------------
CLIENTS = ("odradek", "confluent")


def _client_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--client", default="odradek", help="odradek (the bundled client) or confluent "
                    "(confluent-kafka, Kafka protocol); a comma list runs them side by side")
    ap.add_argument("--runs", type=int, default=1, help="runs of each client (interleaved); medians reported")
    ap.add_argument("--local", action="store_true", help="start a broker of our own for the run (temp dir)")
    ap.add_argument("--broker-pid", type=int, help="sample this broker's CPU (its process tree) per run")


def _clients(value: str) -> list[str]:
    out = [c.strip() for c in value.split(",") if c.strip()]
    for c in out:
        if c not in CLIENTS:
            raise SystemExit(f"perf: unknown client {c!r} (one of {', '.join(CLIENTS)})")
    return out


class _BrokerCpu:
    """CPU seconds (user + system) of a broker's process tree between ``start`` and ``stop``."""

    def __init__(self, pid: int):
        import psutil
        self.root = psutil.Process(pid)

    def _total(self) -> float:
        import psutil
        total = 0.0
        for p in [self.root] + self.root.children(recursive=True):
            try:
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.NoSuchProcess:
                pass
        return total

    def start(self) -> None:
        self.before = self._total()

    def stop(self) -> float:
        return self._total() - self.before


def confluent_props(props: dict) -> dict:
    """Kafka producer properties for librdkafka (the same names). Nothing is changed from
    librdkafka's defaults but its local queue (a million records, 1 GiB, so ``produce`` does
    not block on it): ``batch.size`` stays librdkafka's 1,000,000 bytes unless given.
    ``max.request.size`` is the bundled producer's alone and is left out: librdkafka sends one
    batch per partition and request whatever it is told. So to compare the broker's CPU per
    batch like with like, give both clients the same ``batch.size`` and the bundled one a
    ``max.request.size`` smaller than a batch (one batch per request, as librdkafka sends)."""
    out = {"queue.buffering.max.messages": 1000000, "queue.buffering.max.kbytes": 1048576, **props}
    out.pop("max.request.size", None)
    return out


def run_confluent_produce(bootstrap: str, topic: str, n: int, size: int, rate: float, props: dict,
                          sample_every: int = 100, report_ms: int = REPORT_INTERVAL_MS, started=None,
                          stopped=None, keys: int = 0) -> dict:
    """``run_produce`` through confluent-kafka: the same records, acks, codec and keys."""
    from confluent_kafka import Producer as KafkaProducer
    value = random_payload(size)
    key_cycle = itertools.cycle(_keys(keys) or [None])
    stats = Stats(report_ms)
    errors: list = []
    throttle = Throttle(rate)
    sample_every = max(1, sample_every)
    monotonic = time.monotonic
    counts = {"Produce": 0}

    def on_stats(text: str) -> None:
        brokers = json.loads(text).get("brokers") or {}
        counts["Produce"] = sum((b.get("req") or {}).get("Produce", 0) for b in brokers.values())

    producer = KafkaProducer({"bootstrap.servers": bootstrap, **confluent_props(props),
                              "statistics.interval.ms": 1000, "stats_cb": on_stats})

    def on_done(err, _msg, t0):
        if err is not None:
            errors.append(err)
        else:
            stats.sample((monotonic() - t0) * 1000)

    produce, poll = producer.produce, producer.poll
    produce(topic, value)
    producer.flush(30)  # metadata and connection outside the timing
    warm = counts["Produce"]
    if started:
        started()
    start = monotonic()
    i = 0
    while i < n:
        chunk = min(n, i + sample_every)
        t0 = monotonic()
        for j in range(i, chunk):
            key = next(key_cycle)
            while True:
                try:
                    if j == i:
                        produce(topic, value, key, on_delivery=lambda e, m, t0=t0: on_done(e, m, t0))
                    else:
                        produce(topic, value, key)
                    break
                except BufferError:  # the local queue is full: let librdkafka send
                    poll(0.005)
        i = chunk
        poll(0)
        throttle.wait(i)
        stats.progress(i, i * size)
    producer.flush(120)
    elapsed = monotonic() - start
    if stopped:
        stopped()
    time.sleep(1.2)  # one more statistics callback: the request count after the flush
    poll(0)
    result = stats.summary(n, n * size, elapsed)
    result["errors"] = len(errors)
    result["batches"] = result["requests"] = max(0, counts["Produce"] - warm)  # one batch a request
    if errors:
        print(f"{len(errors)} sampled records failed; first: {errors[0]}", flush=True)
    return result


def _prefill_confluent(bootstrap: str, topic: str, partitions: int, n: int, size: int, keys: int = 0) -> None:
    from confluent_kafka import Consumer as KafkaConsumer, Producer as KafkaProducer, TopicPartition as KTP
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "perf-prefill", "enable.auto.commit": False})
    try:
        have = 0
        for p in range(partitions):
            low, high = c.get_watermark_offsets(KTP(topic, p), timeout=30)
            have += high - low
    finally:
        c.close()
    if have >= n:
        return
    print(f"Prefilling '{topic}' with {n - have} records of {size} bytes through confluent-kafka (not timed).",
          flush=True)
    value = random_payload(size)
    key_list = _keys(keys)
    p = KafkaProducer({"bootstrap.servers": bootstrap, **confluent_props({"acks": "1", "linger.ms": 5,
                                                                          "compression.type": "lz4"})})
    for i in range(n - have):
        while True:
            try:
                p.produce(topic, value, key=key_list[i % keys] if keys else None)
                break
            except BufferError:
                p.poll(0.005)
    p.flush(120)


def run_confluent_consume(bootstrap: str, topic: str, partitions: int, n: int, fetch_size: int, timeout_ms: int,
                          report_ms: int = REPORT_INTERVAL_MS, started=None, stopped=None,
                          props: dict | None = None) -> dict:
    """``run_consume`` through confluent-kafka: assigned partitions from the beginning;
    ``props``: librdkafka consumer properties over perf's (``--consumer-props``)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer as KafkaConsumer, TopicPartition as KTP
    stats = Stats(report_ms)
    count = nbytes = 0
    # The local queue holds up to a million records; fetch.queue.backoff.ms 0: librdkafka (2.4+)
    # otherwise stops fetching a partition for 1 s whenever that queue is past a threshold
    # (queued.max.messages.kbytes, 64 MiB: ~600,000 records of 100 B), which a reader that
    # drains 10,000 at a time hits again and again (1.0 vs 1.3-1.6 M records/s, docs/BENCHMARKS.md).
    c = KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": "perf-unused", "enable.auto.commit": False,
                       "max.partition.fetch.bytes": fetch_size, "fetch.max.bytes": max(fetch_size, 52428800),
                       "queued.min.messages": 1000000, "fetch.queue.backoff.ms": 0, **(props or {})})
    try:
        c.assign([KTP(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        if started:
            started()
        clock = _ConsumeClock()
        last = clock.start
        while count < n:
            msgs = c.consume(num_messages=min(10000, n - count), timeout=0.1)
            now = time.monotonic()
            if not msgs:
                if now - last > timeout_ms / 1000:
                    print(f"no record for {timeout_ms} ms after {count}: giving up", flush=True)
                    break
                continue
            last = now
            for m in msgs:
                if m.error() is not None:
                    raise SystemExit(f"perf: the consumer failed: {m.error()}")
            count += len(msgs)
            nbytes += len(msgs) * len(msgs[0].value() or b"")  # one size per run: values are equal
            clock.received(now, count, nbytes)
            stats.progress(count, nbytes, "records consumed", latency=False)
        if stopped:
            stopped()
    finally:
        c.close()
    return clock.summary(stats, count, nbytes)


def _side_by_side(args, clients: list[str], what: str, props: dict) -> int:
    """Each client ``--runs`` times, interleaved, on one broker (``--local``: started here);
    the broker's CPU per run when its pid is known; a table of medians."""
    broker, base = None, None
    bootstrap, pid = args.bootstrap_server, args.broker_pid
    if args.local:
        from odradek.local import LocalBroker
        base = tempfile.mkdtemp(prefix="odradek-perf-")
        # --connections: all from 127.0.0.1, past the broker's max.connections.per.ip (500) and
        # max.connections (1,000) defaults, which would reset the extra ones (a producer may
        # hold two: its bootstrap connection and its leader's)
        limits = 2 * getattr(args, "connections", 0) + 100
        settings = {"max.connections.per.ip": limits, "max.connections": limits} if limits > 500 else {}
        broker = LocalBroker(base, settings, start_timeout=240).start()
        bootstrap, pid = broker.bootstrap, broker.pid
        print(f"perf: a broker of our own on {bootstrap} (pid {pid}, data in {base})", flush=True)
    results: dict[str, list] = {c: [] for c in clients}
    try:
        for c in clients:  # one topic per client, written by that client's producer (its own batch format)
            topic = args.topic if c == "odradek" else f"{args.topic}-{c}"
            _ensure_topic(bootstrap, topic, args.partitions, like=None if c == "odradek" else args.topic)
            if what == "consume":
                n = args.messages
                (_prefill if c == "odradek" else _prefill_confluent)(bootstrap, topic, args.partitions, n,
                                                                     args.record_size, args.keys)
        for run in range(args.runs):
            for c in clients:
                topic = args.topic if c == "odradek" else f"{args.topic}-{c}"
                print(f"--- {what} run {run + 1}/{args.runs}, client {c}, topic {topic}", flush=True)
                # the broker's CPU over the timed part only: connections made and metadata known
                # before, the clients' closing after
                cpu = _BrokerCpu(pid) if pid else None
                spent: list = []
                started, stopped = (cpu.start, lambda: spent.append(cpu.stop())) if cpu else (None, None)
                if what == "produce":
                    if c == "odradek" and getattr(args, "connections", 0):
                        r = run_produce_connections(bootstrap, topic, args.num_records, args.record_size,
                                                    producer_kwargs(props), args.connections,
                                                    args.client_processes, args.latency_sample, started, stopped)
                    elif c == "odradek":
                        r = run_produce(bootstrap, topic, args.num_records, args.record_size, args.throughput,
                                        producer_kwargs(props), args.latency_sample, args.reporting_interval, started,
                                        stopped, keys=args.keys)
                    else:
                        r = run_confluent_produce(bootstrap, topic, args.num_records, args.record_size,
                                                  args.throughput, props, args.latency_sample,
                                                  args.reporting_interval, started, stopped, keys=args.keys)
                elif c == "odradek":
                    r = run_consume(bootstrap, topic, args.partitions, args.messages, args.fetch_size,
                                    args.max_poll_records, args.timeout, args.reporting_interval, started, stopped)
                else:
                    r = run_confluent_consume(bootstrap, topic, args.partitions, args.messages, args.fetch_size,
                                              args.timeout, args.reporting_interval, started, stopped,
                                              _props(args.consumer_props))
                if spent:
                    r["broker_cpu_s"] = spent[0]
                results[c].append(r)
    finally:
        if broker is not None:
            broker.stop()
            shutil.rmtree(base, ignore_errors=True)
    print(f"\n{what}: medians of {args.runs} run(s) per client, one broker, load average {loadavg()}")
    print("client     records/s    MB/s   p50 ms  p99 ms  batches  records/batch  broker cpu s  "
          "cpu ms/batch  cpu us/record")
    summary = {}
    for c, runs in results.items():
        med = {k: _median([r[k] for r in runs if r.get(k) is not None]) if any(r.get(k) is not None for r in runs)
               else None for k in ("records_per_sec", "mb_per_sec", "p50_ms", "p99_ms", "batches", "requests",
                                   "broker_cpu_s")}
        records = runs[0].get("records") or args.num_records if what == "produce" else args.messages
        per_batch = (med["broker_cpu_s"] * 1000 / med["batches"]) if med["broker_cpu_s"] and med["batches"] else None
        per_record = (med["broker_cpu_s"] * 1e6 / records) if med["broker_cpu_s"] else None
        per_request = (med["broker_cpu_s"] * 1000 / med["requests"]) if med["broker_cpu_s"] and med["requests"] \
            else None
        summary[c] = {**med, "cpu_ms_per_batch": per_batch, "cpu_ms_per_request": per_request,
                      "cpu_us_per_record": per_record, "runs": [r.get("records_per_sec") for r in runs]}
        def f(v, spec: str, width: int = 0) -> str:
            return ("-" if v is None or (what == "consume" and spec == "p") else format(v, spec)).rjust(width)
        print(f"{c:<10} {f(med['records_per_sec'], ',.0f', 10)} {f(med['mb_per_sec'], '.1f', 7)} "
              f"{f(med['p50_ms'], 'p' if what == 'consume' else '.1f', 8)} "
              f"{f(med['p99_ms'], 'p' if what == 'consume' else '.1f', 7)} {f(med['batches'], ',.0f', 8)} "
              f"{f(records / med['batches'] if med['batches'] else None, ',.0f', 14)} "
              f"{f(med['broker_cpu_s'], '.2f', 13)} {f(per_batch, '.3f', 13)} {f(per_record, '.2f', 14)}")
        print(f"           records/s of each run: {', '.join(f(v, ',.0f') for v in summary[c]['runs'])}")
        if what == "consume":
            firsts = [r.get("first_record_s") for r in runs]
            summary[c]["first_record_s"] = firsts
            print(f"           first records after (s, start-up, not in records/s): "
                  f"{', '.join(f(v, '.2f') for v in firsts)}")
        if med["requests"]:
            print(f"           produce requests: {f(med['requests'], ',.0f')} "
                  f"({f(med['batches'] / med['requests'], '.1f')} batches each), "
                  f"broker cpu {f(per_request, '.3f')} ms per request")
    if args.json:
        print(json.dumps(summary))
    return 0


# ---- end to end -------------------------------------------------------------------------------
def e2e_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="odradek perf e2e", description="end-to-end latency at a fixed rate: "
                                 "producer send() to consumer receipt (consumer in a child process)")
    ap.add_argument("--bootstrap-server", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--num-records", type=int, default=10000)
    ap.add_argument("--throughput", type=float, default=1000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--no-nats", action="store_true", help="skip the NATS JetStream comparison")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.record_size < _STAMP.size:
        raise SystemExit(f"perf e2e: --record-size must be at least {_STAMP.size}")
    props = {"acks": "1", "linger.ms": "0", "compression.type": "lz4", **_props(args.producer_props)}
    _ensure_topic(args.bootstrap_server, args.topic, 1)
    print(f"odradek: {args.num_records} records at {args.throughput:g}/s, {args.record_size} bytes, "
          f"{' '.join(f'{k}={v}' for k, v in props.items())}", flush=True)
    ours = _e2e(["odradek", args.bootstrap_server, args.topic], args.num_records, args.throughput,
                args.record_size, lambda: _odradek_sender(args.bootstrap_server, args.topic, producer_kwargs(props)))
    theirs = None
    if not args.no_redis:
        theirs = with_redis(lambda r: _e2e(["redis", str(r.port)], args.num_records, args.throughput,
                                            args.record_size, lambda: _redis_sender(r.port)))
        _compare(ours, theirs, "latency")
    nats = None if args.no_nats else _e2e_nats(args.num_records, args.throughput, args.record_size)
    if nats is not None:
        _compare(ours, nats, "latency", "NATS JetStream")
    if args.json:
        print(json.dumps({"odradek": ours, "redis": theirs, "nats": nats}))
    return 0 if ours["records"] == args.num_records else 1


def _e2e_nats(n: int, rate: float, size: int) -> dict | None:
    """The same e2e workload on NATS JetStream (odradek/bench/nats.py), when it is installed."""
    from odradek.bench import nats
    why = nats.available()
    if why:
        print(f"\nNATS JetStream comparison skipped: {why}.", flush=True)
        return None
    server = nats.NatsServer()
    try:
        print(f"\nnats: the same workload on NATS JetStream (nats-server -js on 127.0.0.1:{server.port})", flush=True)
        return _e2e(["nats", str(server.port)], n, rate, size, lambda: nats.sender(server.port))
    finally:
        server.stop()


def _odradek_sender(bootstrap: str, topic: str, kwargs: dict):
    from odradek.producer import Producer
    producer = Producer(bootstrap, **kwargs)
    return (lambda value: producer.send(topic, value)), producer.close


def _e2e(child_args: list[str], n: int, rate: float, size: int, make_sender) -> dict:
    """Start the consumer child, wait until it is reading, send n stamped records at ``rate``,
    collect the child's latencies."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; from odradek.perf.clients import e2e_child; "
                              "sys.exit(e2e_child(sys.argv[1:]))", *child_args, str(n)],
                             stdout=subprocess.PIPE, text=True)
    try:
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("perf e2e: the consumer process did not start")
        send, close = make_sender()
        filler = random_payload(size - _STAMP.size)
        throttle = Throttle(rate)
        monotonic_ns = time.monotonic_ns
        start = time.monotonic()
        for i in range(n):
            send(_STAMP.pack(monotonic_ns()) + filler)
            throttle.wait(i + 1)
        close()
        out, _ = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    elapsed = time.monotonic() - start
    stats = Stats()
    stats.latencies = json.loads(out)
    return stats.summary(len(stats.latencies), len(stats.latencies) * size, elapsed, "records received")


def e2e_child(argv: list[str]) -> int:
    """The consumer side of ``e2e`` (a child process): prints "ready", then the latencies (ms,
    JSON) of the n records it received."""
    kind, n = argv[0], int(argv[-1])
    if kind == "nats":
        from odradek.bench import nats
        return nats.main_child(argv, _STAMP.unpack_from)
    lat: list[float] = []
    monotonic_ns = time.monotonic_ns
    unpack = _STAMP.unpack_from
    if kind == "odradek":
        from odradek.consumer import Consumer
        from odradek.types import TopicPartition
        with Consumer(argv[1], auto_offset_reset="latest", fetch_max_wait_ms=500) as c:
            tp = TopicPartition(argv[2], 0)
            c.assign([tp])
            c.position(tp)
            print("ready", flush=True)
            while len(lat) < n:
                for r in c.poll(timeout_ms=1000):
                    lat.append((monotonic_ns() - unpack(r.value)[0]) / 1e6)
    else:
        import redis
        r = redis.Redis(host="127.0.0.1", port=int(argv[1]))
        r.xgroup_create("perf-e2e", "g", id="$", mkstream=True)
        print("ready", flush=True)
        while len(lat) < n:
            for _stream, entries in r.xreadgroup("g", "c", {"perf-e2e": ">"}, count=1000, block=1000) or ():
                now = monotonic_ns()
                for _id, fields in entries:
                    lat.append((now - unpack(fields[b"v"])[0]) / 1e6)
    print(json.dumps(lat[:n]), flush=True)
    return 0


# ---- Redis Streams, for comparison -------------------------------------------------------------
class RedisServer(PeerServer):
    """A redis-server started for one benchmark on 127.0.0.1 with an ephemeral port."""

    name = "redis-server"

    def command(self) -> list[str]:
        return ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir, "--save", "",
                "--appendonly", "yes", "--appendfsync", "no", "--protected-mode", "no"]

    def probe(self) -> bool:
        import redis
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            return bool(self.client.ping())
        except redis.ConnectionError:
            return False


def redis_available() -> str | None:
    """None if Redis can be used, else why not."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    if importlib.util.find_spec("redis") is None:
        return "the redis Python package is not installed (pip install redis)"
    return None


def with_redis(run):
    why = redis_available()
    if why:
        print(f"\nRedis Streams comparison skipped: {why}.", flush=True)
        return None
    server = RedisServer()
    try:
        print(f"\nredis: the same workload on Redis Streams (redis-server on 127.0.0.1:{server.port})", flush=True)
        return run(server)
    finally:
        server.stop()


def _redis_sender(port: int):
    import redis
    r = redis.Redis(host="127.0.0.1", port=port)
    return (lambda value: r.xadd("perf-e2e", {"v": value})), r.close


def redis_produce(server: RedisServer, n: int, size: int, rate: float, sample_every: int, report_ms: int,
                  pipeline_size: int = 1000) -> dict:
    """Pipelined XADD; a record's latency is its enqueue to its pipeline's reply."""
    r = server.client
    value = random_payload(size)
    stats = Stats(report_ms)
    throttle = Throttle(rate)
    start = time.monotonic()
    i = 0
    while i < n:
        k = min(pipeline_size, n - i)
        pipe = r.pipeline(transaction=False)
        t0 = time.monotonic()
        for _ in range(k):
            pipe.xadd("perf", {"v": value})
        pipe.execute()
        stats.sample((time.monotonic() - t0) * 1000)
        i += k
        throttle.wait(i)
        stats.progress(i, i * size)
    elapsed = time.monotonic() - start
    return stats.summary(n, n * size, elapsed)


def redis_consume(server: RedisServer, n: int, size: int, report_ms: int, count: int = 10000) -> dict:
    r = server.client
    value = random_payload(size)
    print(f"Prefilling stream with {n} records (not timed).", flush=True)
    for i in range(0, n, 10000):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(10000, n - i)):
            pipe.xadd("perf-c", {"v": value})
        pipe.execute()
    r.xgroup_create("perf-c", "g", id="0")
    stats = Stats(report_ms)
    got = nbytes = 0
    start = time.monotonic()
    while got < n:
        for _stream, entries in r.xreadgroup("g", "c", {"perf-c": ">"}, count=count, block=1000) or ():
            got += len(entries)
            nbytes += sum(len(f[b"v"]) for _id, f in entries)
        stats.progress(got, nbytes, "records consumed", latency=False)
    elapsed = time.monotonic() - start
    return stats.summary(got, nbytes, elapsed, "records consumed", latency=False)


def _compare(ours: dict, theirs: dict | None, what: str, peer: str = "redis") -> None:
    if not theirs:
        return
    if what == "throughput":
        ratio = ours["records_per_sec"] / theirs["records_per_sec"] if theirs["records_per_sec"] else float("inf")
        print(f"\nodradek / {peer} throughput: {ratio:.2f}x ({ours['records_per_sec']:.0f} vs "
              f"{theirs['records_per_sec']:.0f} records/sec)", flush=True)
    else:
        for key in ("p50_ms", "p99_ms"):
            ratio = theirs[key] / ours[key] if ours[key] else float("inf")
            print(f"{key[:-3]} latency: odradek {ours[key]:.3f} ms, {peer} {theirs[key]:.3f} ms "
                  f"({peer} / odradek = {ratio:.2f}x)", flush=True)


# ---- cluster benchmarks: replicated throughput, failover time --------------------------------
# Both start their own LocalCluster (ZooKeeper + brokers on 127.0.0.1, data in a temp dir) and
# stop every process they started in a ``finally``; ``replicated`` can also use a running
# cluster (``--bootstrap-server``).
def _median(values: list[float]) -> float:
    import statistics
    return statistics.median(values) if values else float("nan")


def loadavg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def local_cluster(brokers: int, settings: dict, keep: str | None = None):
    """A started LocalCluster in a temp dir (or ``keep``), ready (a controller known to all)."""
    from odradek.local import LocalCluster, zookeeper_missing
    missing = zookeeper_missing()
    if missing:
        raise SystemExit(f"perf: {missing}")
    base = keep or tempfile.mkdtemp(prefix="odradek-perf-cluster-")
    cluster = LocalCluster(base, brokers, settings)
    try:
        cluster.start()
        cluster.wait_ready(60)
    except BaseException:
        cluster.stop(graceful=False)
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
        raise
    return cluster, base


def stop_cluster(cluster, base: str, keep: bool) -> None:
    try:
        cluster.stop(graceful=False)  # kill -9 of every broker, then our ZooKeeper: the data is thrown away
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)


def create_replicated(bootstrap: str, topic: str, partitions: int, rf: int, min_isr: int,
                       extra: dict | None = None, timeout: float = 60.0) -> None:
    """Create the topic (retrying retriable errors while the cluster settles) and wait until
    every partition has a leader and its full ISR in the brokers' metadata."""
    from odradek.core.protocol import OdradekError
    from odradek.admin import Admin
    config = {"min.insync.replicas": min_isr, **(extra or {})}
    deadline = time.monotonic() + timeout
    with Admin(bootstrap) as admin:
        while True:
            try:
                admin.create_topic(topic, partitions, rf, config=config)
                break
            except OdradekError as exc:
                if not getattr(getattr(exc, "code", None), "retriable", False) or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        while True:
            try:
                desc = admin.describe_topic(topic)
                if len(desc.partitions) == partitions and all(
                        p.leader >= 0 and len(p.isr) == rf for p in desc.partitions):
                    return
            except OdradekError as exc:
                if not getattr(getattr(exc, "code", None), "retriable", False):
                    raise
            if time.monotonic() > deadline:
                raise SystemExit(f"perf: topic {topic} did not get a leader and a full ISR in {timeout:.0f} s")
            time.sleep(0.1)



class _ActorCpu:
    """CPU seconds of every process of the cluster's brokers, grouped by actor (``od:<name>``,
    digits folded: handler-0 and handler-1 count as handler-N), between ``start`` and ``stop``."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.before: dict = {}

    def _procs(self):
        import psutil
        for bid, b in self.cluster.brokers.items():
            if not b.running:
                continue
            try:
                procs = [psutil.Process(b.pid)] + b.children()
            except psutil.NoSuchProcess:
                continue
            for p in procs:
                try:
                    t = p.cpu_times()
                    yield (bid, p.pid), p.name(), t.user + t.system
                except psutil.NoSuchProcess:
                    pass

    @staticmethod
    def _client() -> float:
        t = os.times()
        return t.user + t.system

    def start(self) -> None:
        self.t0 = time.monotonic()
        self.before = {key: cpu for key, _name, cpu in self._procs()}
        self.client0 = self._client()

    def stop(self) -> dict:
        import re
        wall = time.monotonic() - self.t0
        by_actor: dict = {}
        for key, name, cpu in self._procs():
            actor = re.sub(r"\d+$", "N", name[3:] if name.startswith("od:") else "supervisor")
            by_actor[actor] = by_actor.get(actor, 0.0) + cpu - self.before.get(key, 0.0)
        by_actor["client (producer process)"] = self._client() - self.client0
        return {"wall_s": wall, "cpu_s": dict(sorted(by_actor.items(), key=lambda kv: -kv[1]))}


def replicated_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="odradek perf replicated",
        description="acks=all producer throughput on a replicated topic (default: a 3-broker LocalCluster on "
                    "127.0.0.1 started and stopped by this command), compared with acks=1 and replication factor 1")
    ap.add_argument("--bootstrap-server", help="use this running cluster instead of starting one")
    ap.add_argument("--brokers", type=int, default=3, help="brokers of the local cluster")
    ap.add_argument("--num-records", type=int, default=1000000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--throughput", type=float, default=-1,
                    help="records/s the producer sends at (-1: as fast as it can); at a fixed rate the p99 "
                         "column is the latency at that load (send() to acknowledgement, every "
                         "--latency-sample-th record)")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--min-insync-replicas", type=int, default=2, help="topic min.insync.replicas (capped at the RF)")
    ap.add_argument("--configs", default="all:3,1:3,all:1",
                    help="comma-separated ACKS:RF runs (default: acks=all RF 3, acks=1 RF 3, acks=all RF 1)")
    ap.add_argument("--runs", type=int, default=3, help="runs of each config (interleaved); medians reported")
    ap.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE",
                    help="on top of linger.ms=5 compression.type=lz4 (acks comes from --configs)")
    ap.add_argument("--broker-props", nargs="*", default=[], metavar="KEY=VALUE",
                    help="settings of the local cluster's brokers (--set)")
    ap.add_argument("--cpu", action="store_true", help="print CPU seconds per actor of the local cluster per run")
    ap.add_argument("--latency-sample", type=int, default=100)
    ap.add_argument("--reporting-interval", type=int, default=REPORT_INTERVAL_MS)
    ap.add_argument("--keep-dir", help="put the local cluster here and keep it (default: a temp dir, removed)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line at the end")
    args = ap.parse_args(argv)
    configs = []
    for item in args.configs.split(","):
        acks, _, rf = item.strip().partition(":")
        if acks not in ("all", "-1", "0", "1") or not rf.isdigit():
            raise SystemExit(f"perf replicated: bad config {item!r} (ACKS:RF, e.g. all:3)")
        configs.append(("all" if acks == "-1" else acks, int(rf)))
    base_props = {"linger.ms": "5", "compression.type": "lz4", **_props(args.producer_props)}
    base_props.pop("acks", None)
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_before = loadavg()
    cluster = base = None
    if args.bootstrap_server:
        bootstrap = args.bootstrap_server
    else:
        cluster, base = local_cluster(args.brokers, _props(args.broker_props), args.keep_dir)
        bootstrap = cluster.bootstrap
    results = {f"acks={a} rf={rf}": {"acks": a, "replication_factor": rf, "runs": [], "cpu": []}
               for a, rf in configs}
    tag = f"{os.getpid()}-{int(time.time())}"
    try:
        rate = "as fast as it can" if args.throughput <= 0 else f"at {args.throughput:,.0f} records/s"
        print(f"odradek perf replicated: {args.num_records} records of {args.record_size} bytes per run, {rate}, "
              f"{args.partitions} partitions, min.insync.replicas {args.min_insync_replicas}, "
              f"{args.runs} run(s) of {', '.join(results)}; cluster {bootstrap}; load average "
              f"{' '.join(map(str, load_before))}", flush=True)
        for run in range(1, args.runs + 1):
            for acks, rf in configs:
                key = f"acks={acks} rf={rf}"
                topic = f"perf-rep-acks{acks}-rf{rf}-{run}-{tag}"
                min_isr = min(args.min_insync_replicas, rf)
                create_replicated(bootstrap, topic, args.partitions, rf, min_isr)
                props = {"acks": acks, **base_props}
                print(f"\nrun {run}, {key} (min.insync.replicas {min_isr}): topic {topic}, "
                      f"{' '.join(f'{k}={v}' for k, v in props.items())}", flush=True)
                cpu = _ActorCpu(cluster) if (cluster is not None and args.cpu) else None
                if cpu:
                    cpu.start()
                r = run_produce(bootstrap, topic, args.num_records, args.record_size, args.throughput,
                                producer_kwargs(props),
                                args.latency_sample, args.reporting_interval)
                if cpu:
                    c = cpu.stop()
                    results[key]["cpu"].append(c)
                    print("CPU seconds by actor (all brokers) over " + f"{c['wall_s']:.1f} s wall: "
                          + ", ".join(f"{k} {v:.2f}" for k, v in c["cpu_s"].items()), flush=True)
                results[key]["runs"].append(r)
    finally:
        if cluster is not None:
            stop_cluster(cluster, base, bool(args.keep_dir))
    errors = 0
    print(f"\nSummary ({args.num_records} x {args.record_size} B per run, {args.partitions} partitions, "
          f"medians of {args.runs} run(s); started {started}, load average before "
          f"{' '.join(map(str, load_before))}, after {' '.join(map(str, loadavg()))}):", flush=True)
    print(f"{'config':<16} {'records/s':>12} {'MB/s':>8} {'p50 ms':>8} {'p99 ms':>8}  runs (records/s)")
    for key, res in results.items():
        runs = res["runs"]
        errors += sum(r["errors"] for r in runs)
        res["median_records_per_sec"] = _median([r["records_per_sec"] for r in runs])
        res["median_mb_per_sec"] = _median([r["mb_per_sec"] for r in runs])
        res["median_p50_ms"] = _median([r["p50_ms"] for r in runs])
        res["median_p99_ms"] = _median([r["p99_ms"] for r in runs])
        print(f"{key:<16} {res['median_records_per_sec']:>12,.0f} {res['median_mb_per_sec']:>8.1f} "
              f"{res['median_p50_ms']:>8.2f} {res['median_p99_ms']:>8.2f}  "
              + " / ".join(f"{r['records_per_sec']:,.0f}" for r in runs), flush=True)
    first = next(iter(results.values()))
    for key, res in list(results.items())[1:]:
        if first["median_records_per_sec"]:
            print(f"{key} / {next(iter(results))}: {res['median_records_per_sec'] / first['median_records_per_sec']:.2f}x",
                  flush=True)
    if args.json:
        print(json.dumps({"started": started, "load_before": load_before, "load_after": loadavg(),
                          "num_records": args.num_records, "record_size": args.record_size,
                          "throughput": args.throughput,
                          "partitions": args.partitions, "min_insync_replicas": args.min_insync_replicas,
                          "results": results}))
    return 0 if errors == 0 else 1


class _FailoverProducer:
    """A producer thread sending acks=all records to one partition at ``rate`` records/s; every
    record's send time and acknowledgement time are kept (monotonic seconds)."""

    def __init__(self, bootstrap: str, topic: str, partition: int, rate: float, size: int, kwargs: dict):
        import threading
        from odradek.producer import Producer
        self.producer = Producer(bootstrap, **kwargs)
        self.topic, self.partition, self.rate = topic, partition, rate
        self.value = random_payload(size)
        self.acks: list = []  # (sent, acked, ok)
        self.sent = 0
        self._stop = threading.Event()
        self.producer.send(topic, self.value, partition=partition).result(30)  # metadata, connection
        self.thread = threading.Thread(target=self._run, name="perf-failover-producer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        monotonic = time.monotonic
        acks = self.acks
        throttle = Throttle(self.rate)
        while not self._stop.is_set():
            t0 = monotonic()
            try:
                h = self.producer.send(self.topic, self.value, partition=self.partition)
            except Exception:  # noqa: BLE001 - buffer full or closed: keep the pace
                acks.append((t0, monotonic(), False))
                time.sleep(0.01)
                continue
            h.add_done_callback(lambda h, t0=t0: acks.append((t0, monotonic(), h.exception() is None)))
            self.sent += 1
            throttle.wait(self.sent)

    def first_ack_sent_after(self, t: float) -> float | None:
        """The earliest acknowledgement of a record whose send() began after ``t``."""
        times = [acked for sent, acked, ok in list(self.acks) if ok and sent >= t]
        return min(times) if times else None

    def close(self) -> None:
        self._stop.set()
        self.thread.join(10)
        try:
            self.producer.close(timeout=30)
        except Exception:  # noqa: BLE001 - teardown
            pass


def failover_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="odradek perf failover",
        description="time from a partition leader's kill -9 to a new leader in ZooKeeper and to the next acks=all "
                    "write acknowledged, on a local cluster (127.0.0.1) started and stopped by this command")
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=3,
                    help="partitions of the topic (leaders spread over the brokers; the victim is one of them)")
    ap.add_argument("--min-insync-replicas", type=int, default=2)
    ap.add_argument("--session-timeout-ms", type=int, nargs="+", default=[6000],
                    help="zookeeper.session.timeout.ms of the brokers; several values: one cluster each")
    ap.add_argument("--runs", type=int, default=5, help="kills per session timeout")
    ap.add_argument("--rate", type=float, default=500, help="records/s the producer sends to the partition")
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--kill-controller", action="store_true",
                    help="kill the controller (leading the partition) instead of a leader that is not the controller")
    ap.add_argument("--producer-props", nargs="*", default=[], metavar="KEY=VALUE",
                    help="on top of acks=all linger.ms=0 compression.type=lz4")
    ap.add_argument("--broker-props", nargs="*", default=[], metavar="KEY=VALUE",
                    help="more settings of the brokers (--set)")
    ap.add_argument("--poll-ms", type=float, default=5,
                    help="how often the brokers' metadata and the producer's acknowledgements are checked")
    ap.add_argument("--timeout", type=float, default=90, help="seconds a run may take after the kill")
    ap.add_argument("--keep-dir", help="put the clusters here (session-<ms>/) and keep them (default: temp, removed)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    props = {"acks": "all", "linger.ms": "0", "compression.type": "lz4", **_props(args.producer_props)}
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    load_before = loadavg()
    print(f"odradek perf failover: {args.brokers} brokers, RF {args.brokers}, min.insync.replicas "
          f"{args.min_insync_replicas}, producer {args.rate:g} records/s to one partition "
          f"({' '.join(f'{k}={v}' for k, v in props.items())}), {args.runs} kill(s) per session timeout; "
          f"load average {' '.join(map(str, load_before))}", flush=True)
    out = {"started": started, "load_before": load_before, "producer_props": props, "sets": []}
    failed = 0
    for session_ms in args.session_timeout_ms:
        settings = {"zookeeper.session.timeout.ms": session_ms,
                    # the restarted broker gets its leadership back before the next run, so
                    # every run starts from the same placement
                    "leader.imbalance.check.interval.seconds": 1, **_props(args.broker_props)}
        print(f"\nzookeeper.session.timeout.ms={session_ms}; broker settings "
              f"{' '.join(f'{k}={v}' for k, v in settings.items())}", flush=True)
        runs, set_failed = _failover_set(args, settings, props)
        failed += set_failed
        out["sets"].append({"session_timeout_ms": session_ms, "settings": settings, "runs": runs,
                            "summary": _failover_summary(runs)})
    out["load_after"] = loadavg()
    print(f"\nSummary (started {started}; load average before {' '.join(map(str, load_before))}, after "
          f"{' '.join(map(str, out['load_after']))}); seconds after the kill -9, median / max of the runs:",
          flush=True)
    head = (f"{'session ms':>10} {'runs':>4} {'registration gone':>18} {'leader in ZK':>14} "
            f"{'metadata on all':>16} {'write acked':>12}")
    print(head)
    for s in out["sets"]:
        m = s["summary"]

        def cell(k, w):
            v = m.get(k)
            return f"{v['median']:.2f} / {v['max']:.2f}".rjust(w) if v else "-".rjust(w)
        print(f"{s['session_timeout_ms']:>10} {len(s['runs']):>4} {cell('gone_s', 18)} {cell('zk_leader_s', 14)} "
              f"{cell('metadata_s', 16)} {cell('acked_s', 12)}")
    print("Breakdown (medians, seconds): detection = registration gone; election = gone -> leader in ZK; "
          "propagation = leader in ZK -> metadata on every live broker; client = metadata -> write acked; "
          "leader->ack = leader in ZK -> write acked")
    for s in out["sets"]:
        m = s["summary"]
        parts = [f"{k} {m[k]['median']:.3f}" for k in ("detection_s", "election_s", "propagation_s", "client_s",
                                                                  "leader_to_ack_s") if m.get(k)]
        print(f"  session {s['session_timeout_ms']} ms: " + ", ".join(parts))
    if args.json:
        print(json.dumps(out))
    return 0 if failed == 0 else 1


def _failover_summary(runs: list[dict]) -> dict:
    out = {}
    for k in ("gone_s", "zk_leader_s", "metadata_s", "acked_s", "detection_s", "election_s", "propagation_s",
              "client_s", "leader_to_ack_s"):
        vals = [r[k] for r in runs if r.get(k) is not None]
        if vals:
            out[k] = {"median": _median(vals), "max": max(vals), "min": min(vals)}
    return out


def _failover_set(args, settings: dict, props: dict) -> tuple[list[dict], int]:
    """One cluster at one session timeout: ``args.runs`` kills of a partition's leader."""
    keep = os.path.join(args.keep_dir, f"session-{settings['zookeeper.session.timeout.ms']}") if args.keep_dir \
        else None
    cluster, base = local_cluster(args.brokers, settings, keep)
    runs: list[dict] = []
    failed = 0
    topic = "perf-failover"
    try:
        min_isr = min(args.min_insync_replicas, args.brokers)
        create_replicated(cluster.bootstrap, topic, args.partitions, args.brokers, min_isr)
        for run in range(1, args.runs + 1):
            try:
                r = _failover_run(cluster, topic, args, props, run)
                runs.append(r)
            except (TimeoutError, RuntimeError) as exc:
                failed += 1
                print(f"run {run}: FAILED: {exc}", flush=True)
    finally:
        stop_cluster(cluster, base, bool(keep))
    return runs, failed


def _settled(cluster, topic: str, partitions: int, replicas: int) -> bool:
    """Every partition has its full ISR and is led by its preferred replica."""
    assignment = cluster.topic_assignment(topic) or {}
    for p in range(partitions):
        state = cluster.partition_state(topic, p)
        if not state or len(state["isr"]) != replicas or state["leader"] != assignment.get(p, [None])[0]:
            return False
    return True


def _leaders_known(cluster, topic: str, partition: int, leader: int, live: list[int]) -> bool:
    for bid in live:
        body = cluster.metadata(bid, [topic], timeout=2)
        t = next((t for t in body.get("topics", []) if t.get("name") == topic), None)
        p = next((p for p in (t or {}).get("partitions", []) if p.get("partition", p.get("index")) == partition),
                 None)
        if p is None or p.get("leader", p.get("leader_id")) != leader:
            return False
    return True


def _watch_zookeeper(cluster, topic: str, partition: int, victim: int) -> dict:
    """ZooKeeper watches (kazoo's event thread stamps them as they arrive, in ZooKeeper's
    order): ``gone`` when the victim's ``/brokers/ids/<id>`` vanishes, ``leader`` (time, state)
    when the partition's state names another leader."""
    events: dict = {}
    zk = cluster.kazoo

    def on_ids(children) -> bool | None:
        if str(victim) not in children:
            events.setdefault("gone", time.monotonic())
            return False  # stop watching
        return None

    def on_state(data, _stat) -> bool | None:
        state = json.loads(data.decode()) if data else None
        if state and state["leader"] not in (victim, -1):
            events.setdefault("leader", (time.monotonic(), state))
            return False
        return None

    zk.ChildrenWatch("/brokers/ids", on_ids)
    zk.DataWatch(f"/brokers/topics/{topic}/partitions/{partition}/state", on_state)
    return events


def _crash(cluster, broker_id: int) -> tuple[float, float]:
    """kill -9 of a broker's supervisor and every actor *at once*: one SIGKILL to its process
    group (actors share the supervisor's; it is a session leader), then to each process of the
    tree in case one left the group. ``LocalBroker.kill`` SIGKILLs the supervisor first and the
    actors one by one after it, so an actor can get its PDEATHSIG SIGTERM first and stop
    cleanly: the controller then closes its ZooKeeper session and the broker is "detected"
    without any session timeout. Returns (monotonic time before the first signal, after the
    last); then reaps through ``LocalCluster.kill``."""
    import signal
    b = cluster.brokers[broker_id]
    procs = [b.pid] + [p.pid for p in b.children()]
    t0 = time.monotonic()
    try:
        os.killpg(b.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in procs:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    t1 = time.monotonic()
    cluster.kill(broker_id)  # waits for every process and closes the pipes
    return t0, t1


def _failover_run(cluster, topic: str, args, props: dict, run: int) -> dict:
    # a fresh, settled start: every broker up, full ISRs, preferred leaders
    cluster.wait_for(lambda: _settled(cluster, topic, args.partitions, args.brokers), 120,
                     "full ISRs and preferred leaders")
    controller = cluster.controller_id()
    candidates = [p for p in range(args.partitions)
                  if (cluster.leader(topic, p) == controller) == bool(args.kill_controller)]
    partition = candidates[0] if candidates else 0
    state = cluster.partition_state(topic, partition)
    victim = state["leader"]
    producer = _FailoverProducer(cluster.bootstrap, topic, partition, args.rate, args.record_size,
                                 producer_kwargs(props))
    try:
        time.sleep(1.0)  # steady state: acknowledgements flowing
        before = sum(1 for _s, _a, ok in list(producer.acks) if ok)
        if not before:
            raise RuntimeError("no acknowledgement before the kill")
        live = [b for b in cluster.ids if b != victim and cluster.brokers[b].running]
        events = _watch_zookeeper(cluster, topic, partition, victim)
        t_kill, t_dead = _crash(cluster, victim)
        res = {"run": run, "victim": victim, "victim_was_controller": victim == controller,
               "partition": partition, "leader_epoch_before": state["leader_epoch"], "kill_s": t_dead - t_kill,
               "reaped_s": time.monotonic() - t_kill,
               "gone_s": None, "zk_leader_s": None, "metadata_s": None, "acked_s": None}
        deadline = t_kill + args.timeout
        poll = args.poll_ms / 1000
        while res["acked_s"] is None or res["metadata_s"] is None or "leader" not in events or "gone" not in events:
            if time.monotonic() > deadline:
                raise TimeoutError(f"after {args.timeout:.0f} s: {res}, ZooKeeper events {events}")
            if "leader" in events and res["metadata_s"] is None:
                try:
                    if _leaders_known(cluster, topic, partition, events["leader"][1]["leader"], live):
                        res["metadata_s"] = time.monotonic() - t_kill
                except Exception:  # noqa: BLE001 - a busy broker: ask again
                    pass
            if res["acked_s"] is None:
                acked = producer.first_ack_sent_after(t_dead)
                if acked is not None:
                    res["acked_s"] = acked - t_kill
            time.sleep(poll)
        res["gone_s"] = events["gone"] - t_kill
        res["zk_leader_s"] = events["leader"][0] - t_kill
        new_leader = res["new_leader"] = events["leader"][1]["leader"]
        res["leader_epoch_after"] = events["leader"][1]["leader_epoch"]
        res["detection_s"] = res["gone_s"]
        res["election_s"] = res["zk_leader_s"] - res["gone_s"]
        res["propagation_s"] = res["metadata_s"] - res["zk_leader_s"]
        res["client_s"] = res["acked_s"] - res["metadata_s"]
        res["leader_to_ack_s"] = res["acked_s"] - res["zk_leader_s"]
        if res["acked_s"] < res["zk_leader_s"]:
            print(f"run {run}: WARNING: a write was acknowledged before ZooKeeper named a new leader", flush=True)
        res["failed_sends"] = sum(1 for _s, _a, ok in list(producer.acks) if not ok)
        print(f"run {run}: killed broker {victim} (leader of {topic}-{partition}"
              f"{', the controller' if res['victim_was_controller'] else ''}; signals sent in {res['kill_s'] * 1000:.1f} ms): "
              f"registration gone +{res['gone_s']:.3f} s, leader {new_leader} in ZooKeeper +{res['zk_leader_s']:.3f} s, "
              f"in every live broker's metadata +{res['metadata_s']:.3f} s, first write sent after the kill "
              f"acknowledged +{res['acked_s']:.3f} s; failed sends {res['failed_sends']}", flush=True)
    finally:
        producer.close()
        if not cluster.brokers[victim].running:
            cluster.restart(victim)  # same data and port; the next run waits for its ISR and leadership
    return res


# ---- scrape: what /metrics costs --------------------------------------------------------------
_SCRAPER = """
import sys, time, urllib.request
url, every = sys.argv[1], float(sys.argv[2])
while True:
    t0 = time.monotonic()
    urllib.request.urlopen(url, timeout=10).read()
    time.sleep(max(0.0, every - (time.monotonic() - t0)))
"""


def _sample(text: str, name: str) -> float:
    """The value of an unlabelled sample in Prometheus text (0 if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def scrape_main(argv: list[str]) -> int:
    """Two figures of docs/OBSERVABILITY.md's goals, each on its own broker (127.0.0.1, temp
    data): (1) produce throughput with and without a Prometheus scrape every second (a
    separate scraper process, runs alternating, medians); (2) scrape time of a broker
    holding ``--partitions`` partitions."""
    ap = argparse.ArgumentParser(prog="odradek perf scrape", description="the cost of /metrics")
    ap.add_argument("--runs", type=int, default=3, help="alternating runs with and without scraping")
    ap.add_argument("--num-records", type=int, default=300000)
    ap.add_argument("--record-size", type=int, default=100)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    ap.add_argument("--partitions", type=int, default=10000, help="partitions of the scrape-time broker; 0 skips")
    ap.add_argument("--scrapes", type=int, default=10)
    ap.add_argument("--skip-cost", action="store_true", help="only the scrape-time part")
    ap.add_argument("--cpu-scrapes", type=int, default=10, help="scrapes per window of the CPU measurement")
    ap.add_argument("--cpu-pairs", type=int, default=3, help="idle/scrape window pairs of the CPU measurement")
    ap.add_argument("--exposition", action="store_true",
                    help="only the collector and text exposition of a --partitions snapshot, in this process")
    ap.add_argument("--partition-level", action="store_true",
                    help="scrape with metrics.partition.level=true (per-partition series; default: per topic)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = {"loadavg_before": loadavg()}
    if args.exposition:
        result["exposition"] = _exposition_time(args.partitions, args.scrapes, args.partition_level)
    elif not args.skip_cost:
        result["cost"] = _scrape_cost(args)
    if args.partitions and not args.exposition:
        result["scrape_time"] = _scrape_time(args)
    result["loadavg_after"] = loadavg()
    if args.json:
        print(json.dumps(result))
    return 0


def _local_broker(settings: dict):
    from odradek.local import LocalBroker
    broker = LocalBroker(tempfile.mkdtemp(prefix="odradek-perf-scrape-"), settings, start_timeout=300)
    return broker.start()


def _broker_cpu(broker) -> dict[str, float]:
    """CPU seconds (user + system) each process of ``broker`` has used so far, by actor name
    (the supervisor's process as ``supervisor``)."""
    import psutil
    procs = {"supervisor": broker.pid, **{a["name"]: a["pid"] for a in broker.status()["actors"] if a.get("pid")}}
    out = {}
    for name, pid in procs.items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return out


def _own_cpu() -> float:
    """CPU seconds this process (the benchmark's producer) has used so far."""
    t = os.times()
    return t.user + t.system


def _cpu_delta(a: dict, b: dict) -> dict[str, float]:
    return {k: b[k] - a[k] for k in b if k in a}


def _scrape_cpu(broker, url: str, scrapes: int, interval: float, pairs: int) -> dict:
    """CPU seconds one scrape costs the broker, from its processes' CPU counters (far less
    noisy on a shared machine than a throughput difference): ``pairs`` times, an idle
    window and a window of ``scrapes`` scrapes ``interval`` apart, of the same length,
    alternating; per pair the difference per scrape; medians over the pairs."""
    import urllib.request
    metrics_actor, others, walls = [], [], []
    for pair in range(pairs):
        windows = {}
        for mode in (("idle", "scrape") if pair % 2 == 0 else ("scrape", "idle")):
            c0 = _broker_cpu(broker)
            began = time.monotonic()
            for k in range(scrapes):
                due = began + (k + 1) * interval
                if mode == "scrape":
                    t0 = time.monotonic()
                    with urllib.request.urlopen(url, timeout=30) as r:
                        r.read()
                    walls.append(time.monotonic() - t0)
                time.sleep(max(0.0, due - time.monotonic()))
            windows[mode] = _cpu_delta(c0, _broker_cpu(broker))
        extra = {k: (windows["scrape"][k] - windows["idle"].get(k, 0.0)) / scrapes for k in windows["scrape"]}
        metrics_actor.append(extra.get("metrics", 0.0))
        others.append(sum(v for k, v in extra.items() if k != "metrics"))
        print(f"pair {pair + 1}: a scrape cost the metrics actor {metrics_actor[-1] * 1000:.1f} ms CPU and the other "
              f"processes {others[-1] * 1000:.1f} ms", flush=True)
    return {"metrics_actor_cpu_s": metrics_actor, "others_cpu_s": others,
            "median_metrics_actor_cpu_s": _median(metrics_actor), "median_others_cpu_s": _median(others),
            "median_wall_s": _median(walls)}


def _scrape_cost(args) -> dict:
    """Produce throughput with and without a scrape every ``--interval`` (runs alternating
    ABBA, so drift in the machine's load falls on both), with the broker's CPU seconds per
    record in each run; then the CPU a scrape costs (``_scrape_cpu``), which says what the
    throughput pairs cannot on a noisy machine: at one scrape per ``--interval``, the share
    of the CPU the benchmark (broker and producer, CPU-bound together on this machine) used
    per second under produce load that scraping takes. The scraper's own CPU (parsing the
    text: Prometheus' work, on another machine in production) is not counted."""
    broker = _local_broker({})
    url = broker.console_url + "metrics"
    rates: dict[str, list[float]] = {"without": [], "with": []}
    cpu_per_s: dict[str, list[float]] = {"without": [], "with": []}
    try:
        kwargs = producer_kwargs({"acks": "1", "linger.ms": "5", "compression.type": "lz4"})
        _ensure_topic(broker.bootstrap, "scrape-cost", 1)
        for run in range(args.runs):
            for mode in (("without", "with") if run % 2 == 0 else ("with", "without")):
                scraper = subprocess.Popen([sys.executable, "-c", _SCRAPER, url, str(args.interval)]) \
                    if mode == "with" else None
                c0, t0, own0 = _broker_cpu(broker), time.monotonic(), _own_cpu()
                try:
                    r = run_produce(broker.bootstrap, "scrape-cost", args.num_records, args.record_size, -1, kwargs,
                                    report_ms=3_600_000)
                finally:
                    if scraper is not None:
                        scraper.kill()
                        scraper.wait()
                used = sum(_cpu_delta(c0, _broker_cpu(broker)).values())
                producer_used = _own_cpu() - own0
                rates[mode].append(r["records_per_sec"])
                cpu_per_s[mode].append((used + producer_used) / (time.monotonic() - t0))
                print(f"run {run + 1} {mode} scraping every {args.interval:g}s: {r['records_per_sec']:.0f} records/s, "
                      f"broker and producer CPU {cpu_per_s[mode][-1]:.2f} cores "
                      f"(broker {used / (time.monotonic() - t0):.2f})", flush=True)
        cpu = _scrape_cpu(broker, url, args.cpu_scrapes, args.interval, args.cpu_pairs)
    finally:
        broker.stop()
        shutil.rmtree(broker.data_dir, ignore_errors=True)
    without, with_ = _median(rates["without"]), _median(rates["with"])
    cost = (without - with_) / without * 100
    per_scrape = cpu["median_metrics_actor_cpu_s"] + cpu["median_others_cpu_s"]
    busy = _median(cpu_per_s["without"])
    share = per_scrape / args.interval / busy * 100 if busy else float("nan")
    print(f"median produce throughput: {without:.0f} records/s without, {with_:.0f} with a scrape every "
          f"{args.interval:g}s: {cost:+.1f}% (goal < 2%; spread without {min(rates['without']):.0f}-"
          f"{max(rates['without']):.0f}, with {min(rates['with']):.0f}-{max(rates['with']):.0f})", flush=True)
    print(f"a scrape costs {cpu['median_metrics_actor_cpu_s'] * 1000:.1f} ms CPU in the metrics actor and "
          f"{cpu['median_others_cpu_s'] * 1000:.1f} ms in the other actors (medians of {args.cpu_pairs} pairs of "
          f"{args.cpu_scrapes} scrapes); at one per {args.interval:g}s that is {share:.2f}% of the "
          f"{busy:.2f} cores the broker and the producer used producing (goal < 2%)", flush=True)
    return {"without": rates["without"], "with": rates["with"], "cost_percent": cost,
            "broker_cores_without": cpu_per_s["without"], "broker_cores_with": cpu_per_s["with"],
            "scrape_cpu": cpu, "cpu_share_percent": share}


def _scrape_time(args) -> dict:
    import urllib.error
    import urllib.request
    from odradek.admin import Admin
    from odradek.errors import TopicAlreadyExistsError
    threads = max(2, args.partitions // 2000)  # ARCHITECTURE.md's rule of thumb for num.log.threads
    broker = _local_broker({"num.log.threads": threads, "actor.start.timeout.ms": 300000,
                            "metrics.partition.level": args.partition_level})
    try:
        began = time.monotonic()
        with Admin(broker.bootstrap, request_timeout_ms=600000) as admin:
            left, i = args.partitions, 0
            while left > 0:
                n = min(left, 1000)  # 2,500 at once made log actors miss heartbeats (load 14)
                try:
                    admin.create_topic(f"scrape-many-{i}", partitions=n)
                except TopicAlreadyExistsError:  # a slow first answer, retried: it was created
                    pass
                left, i = left - n, i + 1
        print(f"{args.partitions} partitions on {threads} log actors created in {time.monotonic() - began:.0f}s",
              flush=True)
        url = broker.console_url + "metrics"
        settle = time.monotonic() + 600  # until every partition is open and scraped
        while time.monotonic() < settle:
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    if _sample(r.read().decode(), "odradek_partitions") >= args.partitions:
                        break
            except OSError:
                pass
            time.sleep(2)
        print(f"every partition open after {time.monotonic() - began:.0f}s", flush=True)
        times, gathers, size, failed, missing = [], [], 0, 0, 0
        for _ in range(args.scrapes):
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(url, timeout=30) as r:
                    body = r.read().decode()
            except urllib.error.HTTPError as exc:  # 503: the broker did not answer in time
                failed += 1
                print(f"scrape failed after {time.monotonic() - t0:.3f}s: {exc.read().decode().strip()}", flush=True)
                continue
            finally:
                times.append(time.monotonic() - t0)
            size = len(body)
            gathers.append(_sample(body, "odradek_scrape_duration_seconds"))
            missing += sum(1 for line in body.splitlines()
                           if line.startswith("odradek_scrape_actor_answered") and line.endswith(" 0.0"))
            time.sleep(0.5)
        cpu = _scrape_cpu(broker, url, args.cpu_scrapes, args.interval, args.cpu_pairs)
    finally:
        broker.stop()
        shutil.rmtree(broker.data_dir, ignore_errors=True)
    level = "per partition" if args.partition_level else "per topic"
    print(f"scrape of {args.partitions} partitions ({level}): median {_median(times):.3f}s, min {min(times):.3f}s, "
          f"max {max(times):.3f}s, {size / 2**20:.2f} MiB of text, {failed} of {args.scrapes} failed, {missing} actor "
          f"answers missing (goal < 1 s); gathering from the actors took a median {_median(gathers):.3f}s of it",
          flush=True)
    return {"partitions": args.partitions, "partition_level": args.partition_level, "times_s": times,
            "median_s": _median(times), "max_s": max(times), "median_gather_s": _median(gathers),
            "bytes": size, "failed": failed,
            "actors_missing": missing, "scrape_cpu": cpu}


def _exposition_time(partitions: int, runs: int, partition_level: bool = False) -> dict:
    """The CPU part of a scrape without a broker: the log actors' rows of ``partitions``
    partitions (over 5 log actors) and one group's committed offset of each, through the
    collector and its text exposition (``BrokerCollector.exposition``, what ``/metrics``
    serves), per topic or, with ``partition_level``, per partition."""
    from odradek.observe.collector import BrokerCollector, Snapshot
    rows = [["partition", [f"t{i // 1000}", i % 1000], [1000 + i, 1, 2000 + i, 0, 2000 + i, 1, 0, 0]]
            for i in range(partitions)]
    committed = [["committed_offset", ["g", f"t{i // 1000}", i % 1000], 1000 + i] for i in range(partitions)]
    answers = {f"log-{j}": {"gauges": rows[j::5]} for j in range(5)}
    answers["group_coordinator"] = {"gauges": committed}
    snap = Snapshot({"actors": []}, answers)
    collector = BrokerCollector(lambda: snap, partition_level)
    times, size = [], 0
    for _ in range(max(1, runs)):
        t0 = time.perf_counter()
        size = len(collector.exposition())
        times.append(time.perf_counter() - t0)
    print(f"exposition of {partitions} partitions ({'per partition' if partition_level else 'per topic'}): "
          f"median {_median(times):.3f}s, max {max(times):.3f}s, {size / 2**20:.2f} MiB of text", flush=True)
    return {"partitions": partitions, "partition_level": partition_level, "times_s": times,
            "median_s": _median(times), "bytes": size}
