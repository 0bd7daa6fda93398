"""``odradek perf ping``: the request path's latency and throughput, measured from outside.

Runs in the caller's process (plus, for the throughput phase, client worker processes it
spawns). Talks to a running broker over TCP only, with PING (an Odradek-only API that the
handler answers with its body and frames): client -> processor -> handler -> processor ->
client, the whole chain a request takes.

Phases:
  latency      1 connection, 1 request in flight: p50/p90/p99/p99.9 round trip
  throughput   ``--connections`` connections (one per client process) each keeping
               ``--depth`` requests in flight, for ``--seconds``: requests/s; repeated
               for each handler count in ``--handlers`` (set with IncrementalAlterConfigs
               num.io.threads, restored afterwards)

    python -m odradek.bench.ping --bootstrap-server 127.0.0.1:9092 --handlers 1,2,4
"""
from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time

from odradek.network.client import BrokerConnection, parse_bootstrap
from odradek.core.protocol import ApiKey


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="odradek perf ping", description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-server", required=True, help="host:port of the broker")
    p.add_argument("--requests", type=int, default=20000, help="latency phase: requests (default 20000)")
    p.add_argument("--warmup", type=int, default=2000, help="latency phase: unmeasured requests first")
    p.add_argument("--payload", type=int, default=0, help="bytes of payload frame per request (default 0)")
    p.add_argument("--connections", type=int, default=4, help="throughput phase: connections (default 4)")
    p.add_argument("--depth", type=int, default=64, help="throughput phase: requests in flight per connection")
    p.add_argument("--seconds", type=float, default=5.0, help="throughput phase: duration per run (default 5)")
    p.add_argument("--handlers", default="", help="comma-separated handler counts to run the throughput "
                   "phase with, e.g. 1,2,4 (default: the broker's current pool)")
    p.add_argument("--skip-latency", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    return p.parse_args(argv)


def progress(text: str) -> None:
    sys.stderr.write(f"\r{text:<78}")
    sys.stderr.flush()


# ---- latency ----------------------------------------------------------------------------
def measure_latency(host: str, port: int, requests: int, warmup: int, payload: int) -> list[float]:
    """Round trips in microseconds, one request in flight."""
    frames = [b"x" * payload] if payload else ()
    conn = BrokerConnection(host, port, client_id="perf-latency")
    clock = time.perf_counter
    samples = []
    try:
        for _ in range(warmup):
            conn.request(ApiKey.PING, {}, frames)
        last = clock()
        for i in range(requests):
            t0 = clock()
            conn.request(ApiKey.PING, {}, frames)
            samples.append((clock() - t0) * 1e6)
            if t0 - last > 0.5:
                last = t0
                progress(f"latency: {i}/{requests} requests, p50 so far {statistics.median(samples):.0f} us")
    finally:
        conn.close()
    return samples


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


# ---- throughput -------------------------------------------------------------------------
def _worker(host: str, port: int, depth: int, payload: int, start_at: float, stop_at: float, out) -> None:
    """One client process: one connection keeping ``depth`` PINGs in flight."""
    conn = BrokerConnection(host, port, client_id="perf-throughput")
    frames = [b"x" * payload] if payload else ()
    done = errors = 0
    try:
        conn.request(ApiKey.PING, {})
        while time.time() < start_at:
            time.sleep(0.001)
        window = [conn.send(ApiKey.PING, {}, frames) for _ in range(depth)] if payload else \
            conn.send_many([(ApiKey.PING, {})] * depth)
        while True:
            for corr in window:
                try:
                    conn.receive(corr)
                    done += 1
                except Exception:  # noqa: BLE001 - counted and reported
                    errors += 1
            if time.time() >= stop_at:
                break
            window = [conn.send(ApiKey.PING, {}, frames) for _ in range(depth)] if payload else \
                conn.send_many([(ApiKey.PING, {})] * depth)
    finally:
        conn.close()
        out.put((done, errors))


def measure_throughput(host: str, port: int, connections: int, depth: int, seconds: float,
                       payload: int) -> tuple[float, int]:
    mp = multiprocessing.get_context("spawn")
    out = mp.Queue()
    start_at = time.time() + 1.0 + 0.05 * connections  # let every worker start and connect
    stop_at = start_at + seconds
    procs = [mp.Process(target=_worker, args=(host, port, depth, payload, start_at, stop_at, out))
             for _ in range(connections)]
    for p in procs:
        p.start()
    while time.time() < stop_at:
        time.sleep(0.25)
        left = stop_at - time.time()
        progress(f"throughput: {connections} connections x {depth} in flight, {max(0.0, left):.1f}s left")
    results = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(10)
    done = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    return done / seconds, errors


def set_handlers(host: str, port: int, count: int) -> None:
    body = {"resources": [{"type": "broker", "name": "",
                           "configs": [{"name": "num.io.threads", "value": str(count), "op": "set"}]}]}
    with BrokerConnection(host, port, client_id="perf-admin") as conn:
        [res] = conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, body, timeout=60).body["resources"]
    if res["error_code"]:
        raise SystemExit(f"could not set num.io.threads={count}: {res['error_message']}")


def current_handlers(host: str, port: int) -> int | None:
    """The broker's handler pool size, or None if it does not report one."""
    body = {"resources": [{"type": "broker", "name": "", "configs": ["num.io.threads"]}]}
    with BrokerConnection(host, port, client_id="perf-admin") as conn:
        [res] = conn.request(ApiKey.DESCRIBE_CONFIGS, body).body["resources"]
    values = [c["value"] for c in res.get("configs", []) if c["name"] == "num.io.threads"]
    return int(values[0]) if values else None


# ---- main -------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    host, port = parse_bootstrap(args.bootstrap_server)[0]
    rows = []
    if not args.skip_latency:
        samples = measure_latency(host, port, args.requests, args.warmup, args.payload)
        rows.append(("latency, 1 connection, 1 in flight",
                     f"p50 {percentile(samples, 50):.0f} us  p90 {percentile(samples, 90):.0f} us  "
                     f"p99 {percentile(samples, 99):.0f} us  p99.9 {percentile(samples, 99.9):.0f} us  "
                     f"({len(samples)} requests)"))
    if not args.skip_throughput:
        original = current_handlers(host, port)
        counts = [int(c) for c in args.handlers.split(",") if c.strip()] or [original]
        if original is None and counts != [None]:
            raise SystemExit("this broker does not report num.io.threads; run without --handlers")
        try:
            for count in counts:
                if count != current_handlers(host, port):
                    set_handlers(host, port, count)
                rate, errors = measure_throughput(host, port, args.connections, args.depth, args.seconds,
                                                  args.payload)
                rows.append((f"throughput, {count or '?'} handler(s), {args.connections} conn x {args.depth} in flight",
                             f"{rate:,.0f} requests/s" + (f"  ({errors} errors)" if errors else "")))
        finally:
            if original is not None and current_handlers(host, port) != original:
                set_handlers(host, port, original)
    progress("")
    sys.stderr.write("\r")
    width = max(len(r[0]) for r in rows) if rows else 0
    print(f"PING round trips through client -> processor -> handler -> processor -> client "
          f"({args.payload} B payload)")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
