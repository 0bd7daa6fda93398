"""``odradek perf hop``: the cost of one hop between two actor processes.

Runs two actors, each in its own spawned process, in a temporary run directory: a
``Driver`` that measures and an ``Echo`` peer. Nothing else of the broker is involved, so
the figures are the runtime's own (msgpack header, ZeroMQ PUSH/PULL over ipc://, the poll
loop's dispatch).

  latency      request/reply, one in flight: round trip; one hop = half of it
  messages/s   one-way messages with a payload, the driver keeping the peer's mailbox fed;
               the peer acknowledges every quarter of the driver's window (credit), so
               nothing is dropped and the sender never runs ahead unboundedly
  bytes/s      the same stream's payload bytes per second

for 100 B and 64 KiB payloads by default.

    python -m odradek.bench.hop [--sizes 100,65536] [--seconds 3]

Accepts (``Echo``):
  hop_ping (Ping) + payload frame: answered with the same frames
  hop_data (Data) + payload frame: counted; with ``ack`` answered ``Credit`` to that actor
Accepts (``Driver``):
  hop_credit (Credit)  from the echo: how many ``hop_data`` messages it has counted
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time

from typing import NamedTuple

from odradek.actors.messages import message
from odradek.actors.runtime import Actor, MailboxFull


@message("hop_ping")
class Ping(NamedTuple):
    """The driver to the echo actor: answered with no body and the same frames."""


@message("hop_data")
class Data(NamedTuple):
    """One-way; every ``ack``-th names the driver, which the echo actor then sends ``Credit``."""

    ack: str | None = None


@message("hop_credit")
class Credit(NamedTuple):
    count: int


_DATA = Data()  # built once: the stream sends hundreds of thousands


class Echo(Actor):
    """Answers ``Ping`` with its frames; counts ``Data`` and acknowledges every ``ack`` of them."""

    def on_start(self) -> None:
        self.count = 0

    def on_hop_ping(self, msg) -> None:
        self.reply(msg, None, msg.frames)

    def on_hop_data(self, msg) -> None:
        self.count += 1
        if msg.fields.ack:
            self.send(msg.fields.ack, Credit(self.count))


class Driver(Actor):
    """Measures against ``echo``; puts its results on ``args['out']`` and stops."""

    def on_start(self) -> None:
        self.peer = self.args["peer"]
        self.out = self.args["out"]
        self.plan = list(self.args["sizes"])
        self.results: dict = {}
        self.base = 0  # data messages the peer counted in earlier runs (its count is cumulative)
        self.call_later(0.2, self._next)

    def _next(self) -> None:
        if not self.plan:
            self.out.put(self.results)
            self.stop()
            return
        self.size = self.plan.pop(0)
        self.payload = os.urandom(self.size)
        self.samples: list[float] = []
        self.remaining = self.args["requests"] + self.args["warmup"]
        self._ping()

    # latency: one request in flight
    def _ping(self) -> None:
        self.t0 = time.perf_counter()
        self.request(self.peer, Ping(), frames=[self.payload], callback=self._pong, timeout=10)

    def _pong(self, reply) -> None:
        elapsed = time.perf_counter() - self.t0
        self.remaining -= 1
        if self.remaining < self.args["requests"]:
            self.samples.append(elapsed * 1e6)
        if self.remaining > 0:
            self._ping()
        else:
            self.results[self.size] = {"rtt_p50_us": statistics.median(self.samples),
                                       "rtt_p99_us": sorted(self.samples)[int(len(self.samples) * 0.99)]}
            self._stream()

    # throughput: one-way messages with credit
    def _stream(self) -> None:
        self.sent = 0
        self.acked = 0
        self.window = max(64, min(4096, (64 << 20) // max(1, self.size)))
        self.ack_every = max(1, self.window // 4)
        self.started = time.perf_counter()
        self.deadline = self.started + self.args["seconds"]
        self._fill()

    def _fill(self) -> None:
        acked = Data(self.name)
        while self.sent - self.acked < self.window and time.perf_counter() < self.deadline:
            self.sent += 1
            try:
                self.send(self.peer, acked if self.sent % self.ack_every == 0 else _DATA, [self.payload])
            except MailboxFull:
                self.sent -= 1
                break
        if time.perf_counter() >= self.deadline and self.acked >= self.sent - self.sent % self.ack_every:
            self._finish()

    def on_hop_credit(self, msg) -> None:
        self.acked = msg.fields.count - self.base
        self._fill()

    def _finish(self) -> None:
        seconds = time.perf_counter() - self.started
        done = self.acked
        self.results[self.size].update({"messages_per_s": done / seconds,
                                        "bytes_per_s": done * self.size / seconds})
        self.base += self.sent  # FIFO: the peer counts all of them before any of the next run
        self.call_later(0, self._next)


def _run(cls: str, name: str, run_dir: str, args: dict) -> None:
    from odradek.actors.runtime import import_object
    actor = import_object(cls)(name, run_dir, args)
    actor.run()


def measure(sizes: list[int], seconds: float, requests: int, warmup: int) -> dict:
    mp = multiprocessing.get_context("spawn")
    run_dir = tempfile.mkdtemp(prefix="odr-hop-", dir="/tmp")
    out = mp.Queue()
    echo = mp.Process(target=_run, args=("odradek.bench.hop:Echo", "echo", run_dir, {}))
    driver = mp.Process(target=_run, args=("odradek.bench.hop:Driver", "driver", run_dir,
                                           {"peer": "echo", "out": out, "sizes": sizes, "seconds": seconds,
                                            "requests": requests, "warmup": warmup}))
    echo.start()
    driver.start()
    try:
        budget = len(sizes) * (seconds + 30) + 30
        results = out.get(timeout=budget)
    finally:
        driver.join(5)
        echo.terminate()
        echo.join(5)
        for p in (driver, echo):
            if p.is_alive():
                p.kill()
        shutil.rmtree(run_dir, ignore_errors=True)
    return results


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="odradek perf hop", description="The cost of one hop between two actors.")
    p.add_argument("--sizes", default="100,65536", help="payload sizes in bytes (default 100,65536)")
    p.add_argument("--seconds", type=float, default=3.0, help="throughput run per size (default 3)")
    p.add_argument("--requests", type=int, default=10000, help="latency samples per size (default 10000)")
    p.add_argument("--warmup", type=int, default=1000)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    sys.stderr.write(f"measuring {len(sizes)} payload sizes, about {len(sizes) * (args.seconds + 2):.0f}s...\n")
    results = measure(sizes, args.seconds, args.requests, args.warmup)
    print("one actor hop (two processes, ZeroMQ PUSH/PULL over ipc://, msgpack header + raw frame)")
    print(f"  {'payload':>9}  {'rtt p50':>9}  {'hop p50':>9}  {'rtt p99':>9}  {'messages/s':>11}  {'bytes/s':>12}")
    for size in sizes:
        r = results[size]
        print(f"  {size:>7} B  {r['rtt_p50_us']:>6.0f} us  {r['rtt_p50_us'] / 2:>6.0f} us  "
              f"{r['rtt_p99_us']:>6.0f} us  {r['messages_per_s']:>11,.0f}  {human_bytes(r['bytes_per_s']) + '/s':>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
