"""Time to ready after a kill -9 with many partitions: ``python -m odradek.bench.restart``.

Runs in the benchmark's own process; starts ``odradek serve`` (``odradek.local.LocalBroker``,
127.0.0.1, port 0) with the Python it runs under, so the same command run with another
checkout's interpreter measures that code on the same data ("before" and "after").

    python -m odradek.bench.restart prepare --dir D --partitions 20000
        creates the partitions (topics of up to 1,000), writes one 16-record batch to each
        (``bench.placement``'s produce), then kills every process of the broker with SIGKILL
        (``LocalBroker.kill``): every partition is left needing recovery.
    python -m odradek.bench.restart measure --dir D --repeat 3
        ``--repeat`` times: start on D and time "ready" (the supervisor's ready line, what a
        client or an orchestrator waits for), then, when the log actors say which partitions
        they still have to open (``opening`` in their ``get_bounds`` answer: lazy opening),
        the time until none is left; then SIGKILL again, so each run starts unclean.
        Prints each run and the medians.

Every process it starts is stopped by PID (``LocalBroker.kill``/``discard``). A tool, run by
hand; the figures go to docs/BENCHMARKS.md ("Latency, keyed produce, partitions", 4.).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from odradek.bench.placement import _produce, _topics
from odradek.local import LocalBroker

SETTINGS = {"log.level": "WARNING", "actor.start.timeout.ms": 1800000}


def _broker(data_dir: str, extra: list[str]) -> LocalBroker:
    settings = dict(SETTINGS)
    settings.update(s.split("=", 1) for s in extra)
    return LocalBroker(data_dir, settings, start_timeout=1800.0)


def _still_opening(broker: LocalBroker) -> int:
    """Partitions the log actors have still to open (their ``get_bounds`` answers' ``opening``)."""
    from odradek.actors.client import MailboxClient
    from odradek.actors.messages import GetBounds
    names = [a["name"] for a in broker.status(timeout=30.0)["actors"] if a["role"] == "log"]
    with MailboxClient(broker.run_dir) as client:
        return sum(len(client.request(name, GetBounds(), timeout=600.0).fields.opening) for name in names)


def prepare(data_dir: str, partitions: int, extra: list[str]) -> None:
    from odradek import Admin
    from odradek.errors import TopicAlreadyExistsError
    broker = _broker(data_dir, extra)
    try:
        broker.start()
        topics = _topics(partitions)
        t = time.perf_counter()
        with Admin(broker.bootstrap, request_timeout_ms=1800000) as admin:
            for name, n in topics:
                try:
                    admin.create_topic(name, partitions=n)
                except TopicAlreadyExistsError:  # a retried creation, or a second prepare on D
                    pass
        print(f"created {partitions} partitions in {time.perf_counter() - t:.1f} s", flush=True)
        res = _produce(broker.port, topics, partitions)
        print(f"one batch to each: {res['errors']} errors, {res['seconds']:.1f} s", flush=True)
        broker.kill()
    finally:
        broker.discard()


def measure(data_dir: str, repeat: int, extra: list[str], wait_open: bool = True) -> dict:
    ready, opened = [], []
    for i in range(repeat):
        broker = _broker(data_dir, extra)
        try:
            broker.start()
            ready.append(broker.started_s)
            print(f"run {i + 1}: ready {ready[-1]:.2f} s", flush=True)
            t = time.perf_counter()
            left = None
            while wait_open and (left := _still_opening(broker)):
                time.sleep(1.0)
            if left is not None:
                opened.append(broker.started_s + time.perf_counter() - t)
                print(f"run {i + 1}: every partition open {opened[-1]:.1f} s after the start", flush=True)
            broker.kill()
        finally:
            broker.discard()
    out = {"ready_s": statistics.median(ready), "ready_runs": ready}
    if opened:
        out.update(open_s=statistics.median(opened), open_runs=opened)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m odradek.bench.restart", description=__doc__.split("\n")[0])
    p.add_argument("phase", choices=["prepare", "measure"])
    p.add_argument("--dir", required=True, help="the broker's data directory (kept between phases)")
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--set", action="append", default=[], help="extra broker setting key=value")
    p.add_argument("--no-wait-open", action="store_true", help="measure: do not wait for every partition to open")
    a = p.parse_args(argv)
    if a.phase == "prepare":
        prepare(a.dir, a.partitions, a.set)
    else:
        res = measure(a.dir, a.repeat, a.set, wait_open=not a.no_wait_open)
        print(f"median of {a.repeat}: ready {res['ready_s']:.2f} s "
              f"({' / '.join(f'{x:.2f}' for x in res['ready_runs'])})" +
              (f"; every partition open {res['open_s']:.1f} s "
               f"({' / '.join(f'{x:.1f}' for x in res['open_runs'])})" if "open_s" in res else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
