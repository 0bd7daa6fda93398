"""Benchmarks shaped like Kafka's perf tools: ``odradek perf produce | consume | e2e``.

Each runs the workload against Odradek, then (when ``redis-server`` is on PATH and the
``redis`` package is importable; neither is a dependency of Odradek) the same workload
against Redis Streams on a redis-server it starts itself on 127.0.0.1 (ephemeral port,
``appendonly yes``, ``appendfsync no``: a log in the page cache, like Odradek's acks=1
without flush), and prints the ratio. ``--no-redis`` skips that part.

    odradek perf produce --topic perf --num-records 2000000 --record-size 100 --throughput -1 \\
        --producer-props acks=1 linger.ms=5 compression.type=lz4
    odradek perf consume --topic perf --messages 2000000
    odradek perf e2e --topic perf-e2e --num-records 10000 --throughput 1000

Threads and processes: ``produce`` and ``consume`` run in this process (the Producer adds
its sender thread). ``e2e`` produces here and consumes in a child process, so the two
sides do not share a GIL; latency is send() to receipt, measured with CLOCK_MONOTONIC
(shared by all processes of the host) stamped into each value's first 8 bytes.

Latency in ``produce`` is sampled: every ``--latency-sample``-th record (default 100) gets
a completion callback; each such sample is send() to acknowledgement of that record.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

_STAMP = struct.Struct(">q")
REPORT_INTERVAL_MS = 5000


# ---- statistics -------------------------------------------------------------------------------
class Stats:
    """Counts, bytes and latency samples; prints Kafka-style progress and summary lines.
    Thread-safe for ``sample`` (callbacks on the sender thread) via the GIL's atomic appends."""

    def __init__(self, report_ms: int = REPORT_INTERVAL_MS, out=None):
        self.start = self.window_start = time.monotonic()
        self.report_every = report_ms / 1000
        self.count = self.bytes = 0
        self.window_count = self.window_bytes = 0
        self.latencies: list[float] = []  # ms
        self.window_lat: list[float] = []
        self._out = out

    @property
    def out(self):
        return self._out or sys.stdout

    def sample(self, latency_ms: float) -> None:
        self.latencies.append(latency_ms)
        self.window_lat.append(latency_ms)

    def progress(self, count: int, nbytes: int, unit: str = "records sent", latency: bool = True) -> None:
        now = time.monotonic()
        if now - self.window_start < self.report_every:
            return
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
        lat = sorted(self.latencies)
        pct = {p: percentile(lat, p) for p in (50, 95, 99, 99.9)}
        result = {"records": count, "seconds": elapsed, "records_per_sec": count / elapsed if elapsed else 0.0,
                  "mb_per_sec": nbytes / elapsed / 2**20 if elapsed else 0.0,
                  "avg_latency_ms": sum(lat) / len(lat) if lat else 0.0, "max_latency_ms": lat[-1] if lat else 0.0,
                  "p50_ms": pct[50], "p95_ms": pct[95], "p99_ms": pct[99], "p99_9_ms": pct[99.9],
                  "latency_samples": len(lat)}
        tail = (f", {result['avg_latency_ms']:.2f} ms avg latency, {result['max_latency_ms']:.2f} ms max latency, "
                f"{pct[50]:.2f} ms 50th, {pct[95]:.2f} ms 95th, {pct[99]:.2f} ms 99th, {pct[99.9]:.2f} ms 99.9th"
                if latency else "")
        print(f"{count} {unit}, {result['records_per_sec']:.1f} records/sec ({result['mb_per_sec']:.2f} MB/sec)"
              f"{tail}.", file=self.out, flush=True)
        return result


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
             "client.id": ("client_id", str), "delivery.timeout.ms": ("delivery_timeout_ms", int)}
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


def _payload(size: int) -> bytes:
    """Like Kafka's perf tool: one random payload of uppercase letters, reused."""
    import random
    rnd = random.Random(42)
    return bytes(rnd.randrange(65, 91) for _ in range(size))


def _ensure_topic(bootstrap: str, topic: str, partitions: int) -> int:
    from odradek.admin import Admin
    from odradek.errors import TopicAlreadyExistsError
    with Admin(bootstrap) as admin:
        if topic not in admin.list_topics():
            try:
                admin.create_topic(topic, partitions)
                print(f"Created topic {topic} with {partitions} partitions.", flush=True)
            except TopicAlreadyExistsError:
                pass
        admin._cluster.refresh([topic])
        return len(admin._cluster.partitions(topic) or ())


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
    ap.add_argument("--reporting-interval", type=int, default=REPORT_INTERVAL_MS, help="ms between progress lines")
    ap.add_argument("--no-redis", action="store_true", help="skip the Redis Streams comparison")
    ap.add_argument("--json", action="store_true", help="print the summaries as one JSON line at the end")
    args = ap.parse_args(argv)
    props = {"acks": "1", "linger.ms": "5", "compression.type": "lz4", **_props(args.producer_props)}
    _ensure_topic(args.bootstrap_server, args.topic, args.partitions)
    print(f"odradek: {args.num_records} records of {args.record_size} bytes to '{args.topic}', "
          f"{' '.join(f'{k}={v}' for k, v in props.items())}", flush=True)
    ours = run_produce(args.bootstrap_server, args.topic, args.num_records, args.record_size, args.throughput,
                       producer_kwargs(props), args.latency_sample, args.reporting_interval)
    theirs = None
    if not args.no_redis:
        theirs = _with_redis(lambda r: redis_produce(r, args.num_records, args.record_size, args.throughput,
                                                     args.latency_sample, args.reporting_interval))
        _compare(ours, theirs, "throughput")
    if args.json:
        print(json.dumps({"odradek": ours, "redis": theirs}))
    return 0 if ours["errors"] == 0 else 1


def run_produce(bootstrap: str, topic: str, n: int, size: int, rate: float, kwargs: dict,
                sample_every: int = 100, report_ms: int = REPORT_INTERVAL_MS) -> dict:
    from odradek.producer import Producer
    value = _payload(size)
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
        start = monotonic()
        i = 0
        while i < n:
            chunk = min(n, i + sample_every)
            t0 = monotonic()
            h = send(topic, value)
            h.add_done_callback(lambda h, t0=t0: on_done(h, t0))
            for _ in range(i + 1, chunk):
                send(topic, value)
            i = chunk
            throttle.wait(i)
            stats.progress(i, i * size)
        producer.flush()
        elapsed = monotonic() - start
    result = stats.summary(n, n * size, elapsed)
    result["errors"] = len(errors)
    if errors:
        print(f"{len(errors)} sampled records failed; first: {errors[0]}", flush=True)
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
    ap.add_argument("--max-poll-records", type=int, default=500, help="records per poll (Kafka's default)")
    ap.add_argument("--timeout", type=int, default=60000, help="ms without a record before giving up")
    ap.add_argument("--reporting-interval", type=int, default=REPORT_INTERVAL_MS)
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    count = _ensure_topic(args.bootstrap_server, args.topic, args.partitions)
    _prefill(args.bootstrap_server, args.topic, count, args.messages, args.record_size)
    ours = run_consume(args.bootstrap_server, args.topic, count, args.messages, args.fetch_size,
                       args.max_poll_records, args.timeout, args.reporting_interval)
    theirs = None
    if not args.no_redis:
        theirs = _with_redis(lambda r: redis_consume(r, args.messages, args.record_size, args.reporting_interval))
        _compare(ours, theirs, "throughput")
    if args.json:
        print(json.dumps({"odradek": ours, "redis": theirs}))
    return 0 if ours["records"] >= args.messages else 1


def _prefill(bootstrap: str, topic: str, partitions: int, n: int, size: int) -> None:
    from odradek.consumer import Consumer
    from odradek.producer import Producer
    from odradek.types import TopicPartition
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    with Consumer(bootstrap) as c:
        have = sum(c.end_offsets(tps).values()) - sum(c.beginning_offsets(tps).values())
    if have >= n:
        return
    print(f"Prefilling '{topic}' with {n - have} records of {size} bytes (not timed).", flush=True)
    value = _payload(size)
    with Producer(bootstrap, acks=1, linger_ms=5) as p:
        for _ in range(n - have):
            p.send(topic, value)


def run_consume(bootstrap: str, topic: str, partitions: int, n: int, fetch_size: int, max_poll: int,
                timeout_ms: int, report_ms: int = REPORT_INTERVAL_MS) -> dict:
    from odradek.consumer import Consumer
    from odradek.types import TopicPartition
    stats = Stats(report_ms)
    count = nbytes = 0
    with Consumer(bootstrap, auto_offset_reset="earliest", max_partition_fetch_bytes=fetch_size,
                  max_poll_records=max_poll) as c:
        c.assign([TopicPartition(topic, p) for p in range(partitions)])
        for tp in c.assignment():
            c.position(tp)
        start = last = time.monotonic()
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
            stats.progress(count, nbytes, "records consumed", latency=False)
        elapsed = time.monotonic() - start
    mb = nbytes / 2**20
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(time.time() - elapsed))}, "
          f"{time.strftime('%Y-%m-%d %H:%M:%S')}, {mb:.4f}, {mb / elapsed:.4f}, {count}, {count / elapsed:.4f}",
          flush=True)
    return stats.summary(count, nbytes, elapsed, "records consumed", latency=False)


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
        theirs = _with_redis(lambda r: _e2e(["redis", str(r.port)], args.num_records, args.throughput,
                                            args.record_size, lambda: _redis_sender(r.port)))
        _compare(ours, theirs, "latency")
    if args.json:
        print(json.dumps({"odradek": ours, "redis": theirs}))
    return 0 if ours["records"] == args.num_records else 1


def _odradek_sender(bootstrap: str, topic: str, kwargs: dict):
    from odradek.producer import Producer
    producer = Producer(bootstrap, **kwargs)
    return (lambda value: producer.send(topic, value)), producer.close


def _e2e(child_args: list[str], n: int, rate: float, size: int, make_sender) -> dict:
    """Start the consumer child, wait until it is reading, send n stamped records at ``rate``,
    collect the child's latencies."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [_root(), os.environ.get("PYTHONPATH")])))
    child = subprocess.Popen([sys.executable, "-c", "import sys; from odradek.perf import e2e_child; "
                              "sys.exit(e2e_child(sys.argv[1:]))", *child_args, str(n)],
                             stdout=subprocess.PIPE, text=True, env=env)
    try:
        if child.stdout.readline().strip() != "ready":
            raise SystemExit("perf e2e: the consumer process did not start")
        send, close = make_sender()
        filler = _payload(size - _STAMP.size)
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


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- Redis Streams, for comparison -------------------------------------------------------------
class RedisServer:
    """A redis-server started for one benchmark on 127.0.0.1 with an ephemeral port."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="odradek-perf-redis-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(["redis-server", "--bind", "127.0.0.1", "--port", str(self.port),
                                      "--dir", self.dir, "--save", "", "--appendonly", "yes",
                                      "--appendfsync", "no", "--protected-mode", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis
        self.client = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_available() -> str | None:
    """None if Redis can be used, else why not."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis Python package is not installed (pip install redis)"
    return None


def _with_redis(run):
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
    value = _payload(size)
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
    value = _payload(size)
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


def _compare(ours: dict, theirs: dict | None, what: str) -> None:
    if not theirs:
        return
    if what == "throughput":
        ratio = ours["records_per_sec"] / theirs["records_per_sec"] if theirs["records_per_sec"] else float("inf")
        print(f"\nodradek / redis throughput: {ratio:.2f}x ({ours['records_per_sec']:.0f} vs "
              f"{theirs['records_per_sec']:.0f} records/sec)", flush=True)
    else:
        for key in ("p50_ms", "p99_ms"):
            ratio = theirs[key] / ours[key] if ours[key] else float("inf")
            print(f"{key[:-3]} latency: odradek {ours[key]:.3f} ms, redis {theirs[key]:.3f} ms "
                  f"(redis / odradek = {ratio:.2f}x)", flush=True)
