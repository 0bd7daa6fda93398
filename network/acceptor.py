"""Acceptor: the addresses clients dial. Admission, then hand-off of each connection.

Runs in its own process (actor ``acceptor``, one per broker). It owns the listening TCP
sockets, one per listener of ``listeners`` (network/listeners.py; bound in ``on_start``;
their addresses are reported in ``ready_fields`` and a restarted acceptor rebinds
``args["bound_ports"]``) and the connection counts per processor and per IP.

For each accepted connection: admission (``max.connections.per.ip``: over it the socket is
closed at once and counted; at ``max.connections`` the new socket is held while processors,
busiest first, are asked to ``shed_idle`` (close their least recently used idle connection,
as Kafka does); the first that did makes room, and if none had one the new socket is closed),
then the file descriptor is passed
with ``socket.send_fds`` over the Unix socket ``<run_dir>/<processor>.sock`` to the running
processor with the fewest connections (one that fails is skipped), with the listener's name
as the datagram (the processor applies its security protocol), and our copy is closed.
No client byte is ever read here (TLS and SASL happen in the processor).

Messages it accepts: ``_members`` for the processor role (from the supervisor);
``conn_closed {processor, ip}`` (one-way, from processors). It asks each processor for
``connections`` when the processor set changes or after its own restart, and starts
accepting only when the counts are rebuilt, so limits hold across its restarts; it asks
processors to ``shed_idle`` at ``max.connections`` (replies ``{closed: bool}``; a processor
sends its ``conn_closed`` before that reply, so the count is already down when it arrives).
"""
from __future__ import annotations

import collections
import errno
import logging
import socket

from odradek.actors.message import Message
from odradek.actors.runtime import Actor
from odradek.network import listeners as listeners_mod
from odradek.actors.names import PROCESSOR, socket_path

log = logging.getLogger("odradek.acceptor")

BACKLOG = 1024
REBUILD_TIMEOUT = 2.0  # seconds to wait for processors' counts before accepting anyway
ACCEPTS_PER_WAKEUP = 64
MAX_HELD = 16  # new sockets waiting at max.connections for an idle one to be closed
SHED_TIMEOUT = 1.0  # seconds a processor gets to answer shed_idle


class Acceptor(Actor):
    def __init__(self, name, run_dir, args=None, supervisor=None, **kw):
        super().__init__(name, run_dir, args, supervisor, **kw)
        config = self.args.get("config", {})
        bound = self.args.get("bound_ports") or {}
        self.listeners = [l._replace(port=int(bound.get(l.name) or l.port))
                          for l in listeners_mod.of_config(config)]
        self.host, self.port = self.listeners[0].host, self.listeners[0].port
        self.max_connections = int(config.get("max.connections", 1000))
        self.max_per_ip = int(config.get("max.connections.per.ip", 1000))
        # max.connection.creation.rate: a token bucket (one second's worth); when empty, the
        # listening sockets are not watched (new connections wait in the kernel's backlog)
        self.creation_rate = float(config.get("max.connection.creation.rate", 2147483647))
        self._tokens, self._tokens_at = self.creation_rate, 0.0
        self.sockets: dict[int, tuple[socket.socket, str]] = {}  # fd -> (listening socket, listener name)
        self.by_processor: dict[str, collections.Counter[str]] = {}  # processor -> ip -> count
        self.per_ip: collections.Counter[str] = collections.Counter()
        self.total = 0
        self._feeds: dict[str, socket.socket] = {}
        self._awaiting: set[str] = set()
        self._accepting = False
        self._held: dict[int, socket.socket] = {}  # fd -> a new socket waiting for room
        self.counters = collections.Counter()

    # ---- lifecycle ---------------------------------------------------------------------
    def on_start(self) -> None:
        for i, l in enumerate(self.listeners):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((l.host, l.port))
            sock.listen(BACKLOG)
            sock.setblocking(False)
            self.sockets[sock.fileno()] = (sock, l.name)
            self.listeners[i] = l._replace(host=sock.getsockname()[0], port=sock.getsockname()[1])
        self.host, self.port = self.listeners[0].host, self.listeners[0].port
        self.call_later(REBUILD_TIMEOUT, self._start_accepting)  # if a processor never answers

    def ready_fields(self) -> dict:
        return {"host": self.host, "port": self.port,
                "listeners": {l.name: [l.host, l.port, l.protocol] for l in self.listeners}}

    def on_stop(self) -> None:
        for sock, _name in self.sockets.values():
            if self._accepting:
                self.unwatch(sock.fileno())
            sock.close()
        for sock in self._feeds.values():
            sock.close()
        for sock in self._held.values():
            sock.close()

    def stats(self) -> dict:
        return {"connections": self.total, **self.counters}

    # ---- counts ------------------------------------------------------------------------
    def on_members(self, role: str, members: list[str], retired: list[str]) -> None:
        if role != PROCESSOR:
            return
        for name in list(self.by_processor):
            if name not in members:  # died: its connections died with it
                self._forget(name)
        for name in members:
            if name not in self.by_processor:
                self.by_processor[name] = collections.Counter()
                self._awaiting.add(name)
                self.request(name, "connections", callback=lambda reply, n=name: self._rebuilt(n, reply),
                             timeout=REBUILD_TIMEOUT)
        if not self._awaiting:
            self._start_accepting()

    def _forget(self, name: str) -> None:
        counts = self.by_processor.pop(name, collections.Counter())
        self.per_ip.subtract(counts)
        self.total -= sum(counts.values())
        self._awaiting.discard(name)
        feed = self._feeds.pop(name, None)
        if feed is not None:
            feed.close()

    def _rebuilt(self, name: str, reply: Message) -> None:
        self._awaiting.discard(name)
        if name in self.by_processor and not reply.is_error:
            counts = collections.Counter({ip: int(n) for ip, n in (reply.get("ips") or {}).items()})
            old = self.by_processor[name]
            self.per_ip.subtract(old)
            self.per_ip.update(counts)
            self.total += sum(counts.values()) - sum(old.values())
            self.by_processor[name] = counts
        if not self._awaiting:
            self._start_accepting()

    def on_conn_closed(self, msg: Message) -> None:
        name, ip = msg.get("processor"), msg.get("ip")
        counts = self.by_processor.get(name)
        if counts is None or counts[ip] <= 0:
            return
        counts[ip] -= 1
        self.per_ip[ip] -= 1
        self.total -= 1

    # ---- accepting -----------------------------------------------------------------------
    def _start_accepting(self) -> None:
        if not self._accepting and self.sockets:
            self._accepting = True
            for fd, (sock, name) in self.sockets.items():
                self.watch(fd, lambda _events, s=sock, n=name: self._on_accept(s, n))

    def _take_token(self) -> bool:
        now = self.clock()
        self._tokens = min(self.creation_rate, self._tokens + (now - self._tokens_at) * self.creation_rate)
        self._tokens_at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        if self._accepting:  # stop watching the listeners until the next token
            self._accepting = False
            for fd in self.sockets:
                self.unwatch(fd)
            self.counters["creation_rate_throttled"] += 1
            self.call_later((1 - self._tokens) / self.creation_rate, self._start_accepting)
        return False

    def _on_accept(self, listener: socket.socket, name: str) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):
            if not self._take_token():
                return
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                self._tokens += 1  # nothing was waiting: the token is not spent
                return
            except OSError as exc:  # EMFILE and friends: let the backlog hold them a moment
                log.error("%s: accept failed: %s", self.name, exc)
                self.counters["accept_errors"] += 1
                return
            if self.per_ip[addr[0]] >= self.max_per_ip:
                self.counters["refused_per_ip"] += 1
                sock.close()
            elif self.total >= self.max_connections:
                self._make_room(sock, addr[0], name)
            else:
                with sock:
                    self._admit(sock, addr[0], name)

    # ---- at max.connections: the least recently used idle connection makes room --------
    def _make_room(self, sock: socket.socket, ip: str, listener: str) -> None:
        if len(self._held) >= MAX_HELD:
            self.counters["refused_max_connections"] += 1
            sock.close()
            return
        self._held[sock.fileno()] = sock
        self._shed_next(sock, ip, listener, sorted(self._by_load(), key=lambda n: -sum(self.by_processor[n].values())))

    def _shed_next(self, sock: socket.socket, ip: str, listener: str, processors: list[str]) -> None:
        """Ask the next processor to close an idle connection; admit when one did."""
        if sock.fileno() < 0:  # closed: we are stopping
            return
        if self.total < self.max_connections or not processors:
            self._held.pop(sock.fileno(), None)
            with sock:
                if self.total < self.max_connections and self.per_ip[ip] < self.max_per_ip:
                    self._admit(sock, ip, listener)
                else:
                    self.counters["refused_max_connections"] += 1
            return
        name, rest = processors[0], processors[1:]
        self.request(name, "shed_idle", callback=lambda _reply: self._shed_next(sock, ip, listener, rest),
                     timeout=SHED_TIMEOUT)

    def _admit(self, sock: socket.socket, ip: str, listener: str) -> None:
        for name in self._by_load():
            if self._hand_off(name, sock, listener):
                self.by_processor[name][ip] += 1
                self.per_ip[ip] += 1
                self.total += 1
                self.counters["accepted"] += 1
                return
        self.counters["handoff_failed"] += 1
        log.error("%s: no processor took a connection from %s; closing it", self.name, ip)

    def _by_load(self) -> list[str]:
        running = self.members.get(PROCESSOR, [])
        return sorted((n for n in running if n in self.by_processor),
                      key=lambda n: sum(self.by_processor[n].values()))

    def _hand_off(self, name: str, sock: socket.socket, listener: str) -> bool:
        try:
            feed = self._feeds.get(name)
            if feed is None:
                feed = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                feed.settimeout(0.5)
                try:
                    feed.connect(socket_path(self.run_dir, name))
                except OSError:
                    feed.close()
                    raise
                feed.setblocking(False)
                self._feeds[name] = feed
            socket.send_fds(feed, [listener.encode()], [sock.fileno()])
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN,):
                feed = self._feeds.pop(name, None)
                if feed is not None:
                    feed.close()
            log.warning("%s: hand-off to %s failed: %s", self.name, name, exc)
            return False
