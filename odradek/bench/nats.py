"""NATS JetStream as a peer in ``odradek perf e2e``: the same stamped records, published to a
JetStream stream (file storage) and read by a push consumer in another process.

Used only when Debian's ``nats-server`` and the ``nats-py`` package (the ``bench`` extra) are
installed; ``available()`` says why not otherwise. The server runs on 127.0.0.1 with an
ephemeral port and a temporary store, and is stopped afterwards.

nats-py is asyncio-only: the sender runs its event loop on a thread of its own and ``send``
schedules a publish there without waiting for JetStream's ack (as ``Producer.send`` returns a
future); ``close`` waits for every ack.
"""
from __future__ import annotations

import asyncio
import json
import importlib.util
import shutil
import threading
import time

from odradek.bench.peers import PeerServer

STREAM, SUBJECT = "perf-e2e", "perf.e2e"


def available() -> str | None:
    """None if NATS can be used, else why not."""
    if shutil.which("nats-server") is None:
        return "nats-server is not installed (Debian's nats-server package)"
    if importlib.util.find_spec("nats") is None:
        return "the nats-py package is not installed (the bench extra: pip install -e '.[bench]')"
    return None


class NatsServer(PeerServer):
    """A nats-server with JetStream on 127.0.0.1, an ephemeral port and a temporary store."""

    name = "nats-server"

    def command(self) -> list[str]:
        return ["nats-server", "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", self.dir]


async def _stream(port: int):
    import nats
    nc = await nats.connect(f"nats://127.0.0.1:{port}")
    js = nc.jetstream()
    await js.add_stream(name=STREAM, subjects=[SUBJECT])
    return nc, js


def sender(port: int):
    """``(send, close)`` for ``perf._e2e``: send(value) publishes without waiting for the ack."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="perf-nats", daemon=True)
    thread.start()
    nc, js = asyncio.run_coroutine_threadsafe(_stream(port), loop).result(10)
    pending: list = []

    def send(value: bytes) -> None:
        pending.append(asyncio.run_coroutine_threadsafe(js.publish(SUBJECT, value), loop))

    def close() -> None:
        for f in pending:
            f.result(30)
        asyncio.run_coroutine_threadsafe(nc.drain(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return send, close


def child(port: int, n: int, unpack) -> list[float]:
    """The consumer side (a child process): prints "ready" once subscribed, returns the latencies
    (ms) of the n records it received. ``unpack`` reads the send time (monotonic ns) of a value."""
    lat: list[float] = []

    async def run() -> None:
        from nats.js.api import DeliverPolicy
        nc, js = await _stream(port)
        done = asyncio.Event()

        async def on_message(msg) -> None:
            lat.append((time.monotonic_ns() - unpack(msg.data)[0]) / 1e6)
            if len(lat) >= n:
                done.set()

        # an ordered consumer: no per-message acks (like a Kafka consumer), flow-controlled by the server
        await js.subscribe(SUBJECT, cb=on_message, deliver_policy=DeliverPolicy.NEW, ordered_consumer=True)
        print("ready", flush=True)
        await done.wait()
        await nc.drain()

    asyncio.run(run())
    return lat[:n]


def main_child(argv: list[str], unpack) -> int:
    """``perf e2e_child nats PORT N``: print the latencies as JSON."""
    print(json.dumps(child(int(argv[1]), int(argv[-1]), unpack)), flush=True)
    return 0
