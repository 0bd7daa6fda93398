"""A TCP fault proxy: the network between brokers, between a broker and ZooKeeper, and
between clients and a broker, made breakable.

Runs in the chaos runner's process, on one asyncio loop in a thread of its own. Owns its
listening sockets (127.0.0.1 only) and every connection through them. Each ``Link`` listens on
one port and forwards to one target (a callable: a restarted broker may listen elsewhere).
A connection's *source* is learned from its first request: Odradek's request header carries
the client id, and brokers use ``odradek-replica-<id>`` (replica fetcher), ``controller-<id>``
(the controller's channel) and ``broker-<id>`` (the relay to the controller); anything else
is ``"client"``. On a ZooKeeper link the source is the link's own broker (``owner``).

Faults are rules on a link: ``set_rule(link, source, mode)`` where ``source`` is a broker id,
``"client"`` or ``"*"`` and ``mode`` one of

- ``"ok"``: forward;
- ``("delay", seconds)``: forward each chunk after the delay (order kept);
- ``"drop"``: reset the matching connections now and every new one at once;
- ``"blackhole"``: keep the connections, forward nothing either way (a silent network);
- ``"in"`` / ``"out"``: one-way: only source -> target (``"in"``) or target -> source
  (``"out"``) bytes pass; the other direction is swallowed.

``heal()`` clears every rule and resets every connection that swallowed bytes meanwhile: its
stream has a hole a real network would not leave (TCP retransmits, or the connection dies),
and its receiver would wait for a frame that never completes. Byte counts per link are kept
for the report.
"""
from __future__ import annotations

import asyncio
import re
import threading
from typing import Callable

# the client id in the msgpack request header: "client" then a str (fixstr or str8)
_SOURCE = re.compile(rb"\xa6client[\xa0-\xbf\xd9].?(?:odradek-replica|controller|broker)-(\d+)", re.S)
_CHUNK = 65536


def source_of(first_bytes: bytes) -> int | str:
    """The broker id a connection comes from, or ``"client"`` (see the module's docstring)."""
    m = _SOURCE.search(first_bytes[:512])
    return int(m.group(1)) if m else "client"


class Link:
    """One listening port of the proxy and what it forwards to."""

    def __init__(self, name: str, target: Callable[[], tuple[str, int]], owner: int | None = None):
        self.name, self.target, self.owner = name, target, owner
        self.port: int | None = None
        self.rules: dict = {}  # source (broker id, "client", "*") -> mode
        self.conns: set = set()
        self.bytes = 0
        self.server = None

    def mode(self, source) -> object:
        if self.owner is not None:
            source = self.owner
        return self.rules.get(source, self.rules.get("*", "ok"))


class _Conn:
    def __init__(self, link: Link, reader, writer):
        self.link, self.reader, self.writer = link, reader, writer
        self.source: int | str = link.owner if link.owner is not None else "client"
        self.known = link.owner is not None
        self.up = None  # (reader, writer) of the target
        self.tasks: list = []
        self.swallowed = False  # bytes discarded by a blackhole or one-way rule

    def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        for w in (self.writer, self.up[1] if self.up else None):
            if w is not None:
                try:
                    w.transport.abort()  # an RST, as a dead network path would end it
                except Exception:  # noqa: BLE001
                    pass
        self.link.conns.discard(self)


class FaultProxy:
    """The links of one chaos run: ``add(name, target)`` -> port; rules; ``close()``."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.links: dict[str, Link] = {}
        self.thread = threading.Thread(target=self.loop.run_forever, name="fault-proxy", daemon=True)
        self.thread.start()

    def _call(self, coro_or_fn, *args, timeout: float = 10.0):
        if asyncio.iscoroutinefunction(coro_or_fn):
            return asyncio.run_coroutine_threadsafe(coro_or_fn(*args), self.loop).result(timeout)

        async def run():
            return coro_or_fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def add(self, name: str, target: Callable[[], tuple[str, int]], owner: int | None = None) -> int:
        """A new link listening on 127.0.0.1 (a free port); its port."""
        link = Link(name, target, owner)

        async def start():
            link.server = await asyncio.start_server(lambda r, w: self._serve(link, r, w), "127.0.0.1", 0)
            link.port = link.server.sockets[0].getsockname()[1]
        self._call(start)
        self.links[name] = link
        return link.port

    def set_rule(self, name: str, source, mode) -> None:
        def apply():
            link = self.links[name]
            link.rules[source] = mode
            if mode == "drop":
                for c in list(link.conns):
                    if source == "*" or c.source == source or link.owner is not None:
                        c.close()
        self._call(apply)

    def heal(self) -> None:
        def clear():
            for link in self.links.values():
                link.rules.clear()
                for c in [c for c in link.conns if c.swallowed]:
                    c.close()
        self._call(clear)

    def bytes_forwarded(self) -> dict[str, int]:
        return {n: link.bytes for n, link in self.links.items()}

    def close(self) -> None:
        async def shut():
            for link in self.links.values():
                link.server.close()
                for c in list(link.conns):
                    c.close()
        try:
            self._call(shut)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)

    # ---- the loop's side -------------------------------------------------------------------
    async def _serve(self, link: Link, reader, writer) -> None:
        conn = _Conn(link, reader, writer)
        if link.mode(conn.source) == "drop":
            conn.close()
            return
        try:
            conn.up = await asyncio.wait_for(asyncio.open_connection(*link.target()), 5)
        except Exception:  # noqa: BLE001 - the target is down or not known yet
            conn.close()  # the target is down: the client sees a reset, as it would directly
            return
        link.conns.add(conn)
        conn.tasks = [asyncio.ensure_future(self._pump(conn, reader, conn.up[1], "in")),
                      asyncio.ensure_future(self._pump(conn, conn.up[0], writer, "out"))]

    async def _pump(self, conn: _Conn, reader, writer, direction: str) -> None:
        link = conn.link
        try:
            while True:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                if direction == "in" and not conn.known:
                    conn.source, conn.known = source_of(data), True
                mode = link.mode(conn.source)
                if mode == "drop":
                    break
                if mode == "blackhole" or (mode in ("in", "out") and mode != direction):
                    conn.swallowed = True
                    continue
                if isinstance(mode, tuple) and mode[0] == "delay":
                    await asyncio.sleep(mode[1])
                link.bytes += len(data)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError, ConnectionError):
            pass
        finally:
            conn.close()
