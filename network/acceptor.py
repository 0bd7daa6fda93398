"""Acceptor: the addresses clients dial. Admission, then hand-off of each connection.

Process: ``acceptor`` (one per broker).
Owns: the listening sockets, one per listener of ``listeners`` (bound in ``on_start``; a
restarted acceptor rebinds ``args["bound_ports"]``), the connection counts per processor, per
IP and per listener, and the broker-wide client quota buckets (``quotas.Ledger``).
Accepts (bodies: ``odradek.actors.messages``):
  conn_closed: one-way, from a processor
  quota_usage: from a processor every ``quotas.SYNC_INTERVAL`` while a quota is in use;
      answered ``Balances`` (network/quotas.py)
and ``_members`` of the processor role from the supervisor.
Sends: each accepted descriptor to the running processor with the fewest connections
(``socket.send_fds`` over ``<run_dir>/<processor>.sock``, with ``<listener> <client ip>`` as
the datagram); ``connections`` to every processor when their set changes or after its own
restart; ``shed_idle`` to processors, busiest first, at ``max.connections`` (``Shed``).
Invariants: never reads a client byte (TLS and SASL are the processor's); accepts nothing until
the counts are rebuilt, so limits hold across its restarts; rates and per-listener limits make
connections wait in the backlog, never refused for it; over ``max.connections.per.ip`` a socket
is closed at once; over its address's ``connection_creation_rate`` held, then closed (KIP-612).
All limits: docs/ARCHITECTURE.md, "Limits and back-pressure".
"""
from __future__ import annotations

import collections
import errno
import logging
import socket

from odradek.actors.message import Message
from odradek.actors.messages import Balances, Connections, ShedIdle
from odradek.actors.runtime import Actor
from odradek.network import listeners as listeners_mod, quotas
from odradek.actors.names import PROCESSOR, socket_path

log = logging.getLogger("odradek.acceptor")

BACKLOG = 1024
REBUILD_TIMEOUT = 2.0  # seconds to wait for processors' counts before accepting anyway
ACCEPTS_PER_WAKEUP = 64
MAX_HELD = 16  # new sockets waiting at max.connections for an idle one to be closed
SHED_TIMEOUT = 1.0  # seconds a processor gets to answer shed_idle
MAX_IP_THROTTLED = 1000  # connections held over their address's creation rate; more are closed at once
UNLIMITED = 2147483647


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
        # per listener (Kafka's listener.name.<name>.max.connections / .max.connection.creation.rate)
        self.listener_max = {l.name: int(config.get(f"listener.name.{l.name.lower()}.max.connections") or UNLIMITED)
                             for l in self.listeners}
        self.listener_rate = {l.name: float(config.get(f"listener.name.{l.name.lower()}.max.connection.creation.rate")
                                            or UNLIMITED) for l in self.listeners}
        self._listener_tokens = {name: [rate, 0.0] for name, rate in self.listener_rate.items()}
        self.per_listener: collections.Counter[str] = collections.Counter()
        self.by_processor_listener: dict[str, collections.Counter[str]] = {}  # processor -> listener -> count
        self._blocked: dict[str, str] = {}  # listener -> why it is not watched ("max", "rate")
        self._watching: set[int] = set()
        self.ip_rates = quotas.IpRates(config, self.args.get("data_dir") or ".")
        self._ip_throttled: dict[int, socket.socket] = {}  # fd -> a socket over its address's rate, closed later
        self.ledger = quotas.Ledger()  # the broker-wide client quota buckets
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
        self.ip_rates.current()  # the quota store (ZooKeeper's in cluster mode) reached now, not on a connection
        self.call_later(REBUILD_TIMEOUT, self._start_accepting)  # if a processor never answers

    def ready_fields(self) -> dict:
        return {"host": self.host, "port": self.port,
                "listeners": {l.name: [l.host, l.port, l.protocol] for l in self.listeners}}

    def on_stop(self) -> None:
        for sock, _name in self.sockets.values():
            if sock.fileno() in self._watching:
                self.unwatch(sock.fileno())
            sock.close()
        for sock in self._feeds.values():
            sock.close()
        for sock in [*self._held.values(), *self._ip_throttled.values()]:
            sock.close()

    def stats(self) -> dict:
        return {"connections": self.total, "ip_throttled_held": len(self._ip_throttled), **self.counters}

    # ---- the broker-wide client quotas (network/quotas.py) ---------------------------------
    def on_quota_usage(self, msg: Message) -> None:
        entries = msg.fields.entries
        self.reply(msg, Balances(self.ledger.charge(entries if isinstance(entries, list) else [], self.clock())))

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
                self.by_processor_listener[name] = collections.Counter()
                self._awaiting.add(name)
                self.request(name, Connections(), callback=lambda reply, n=name: self._rebuilt(n, reply),
                             timeout=REBUILD_TIMEOUT)
        if not self._awaiting:
            self._start_accepting()

    def _forget(self, name: str) -> None:
        counts = self.by_processor.pop(name, collections.Counter())
        self.per_ip.subtract(counts)
        self.total -= sum(counts.values())
        self.per_listener.subtract(self.by_processor_listener.pop(name, collections.Counter()))
        self._unblock_below_max()
        self._awaiting.discard(name)
        feed = self._feeds.pop(name, None)
        if feed is not None:
            feed.close()

    def _rebuilt(self, name: str, reply: Message) -> None:
        self._awaiting.discard(name)
        if name in self.by_processor and not reply.is_error:
            counts = collections.Counter({ip: int(n) for ip, n in (reply.fields.ips or {}).items()})
            old = self.by_processor[name]
            self.per_ip.subtract(old)
            self.per_ip.update(counts)
            self.total += sum(counts.values()) - sum(old.values())
            self.by_processor[name] = counts
            by_listener = collections.Counter({l: int(n) for l, n in (reply.fields.listeners or {}).items()})
            self.per_listener.subtract(self.by_processor_listener.get(name, collections.Counter()))
            self.per_listener.update(by_listener)
            self.by_processor_listener[name] = by_listener
        if not self._awaiting:
            self._start_accepting()

    def on_conn_closed(self, msg: Message) -> None:
        name, ip, listener = msg.fields
        counts = self.by_processor.get(name)
        if counts is None or counts[ip] <= 0:
            return
        counts[ip] -= 1
        self.per_ip[ip] -= 1
        self.total -= 1
        by_listener = self.by_processor_listener.get(name)
        if by_listener is not None and by_listener[listener] > 0:
            by_listener[listener] -= 1
            self.per_listener[listener] -= 1
            self._unblock_below_max()

    # ---- accepting -----------------------------------------------------------------------
    def _start_accepting(self) -> None:
        if not self._accepting and self.sockets:
            self._accepting = True
            self._update_watch()

    def _update_watch(self) -> None:
        """Watch each listening socket while accepting, unless its listener is blocked."""
        for fd, (sock, name) in self.sockets.items():
            want = self._accepting and name not in self._blocked
            if want and fd not in self._watching:
                self._watching.add(fd)
                self.watch(fd, lambda _events, s=sock, n=name: self._on_accept(s, n))
            elif not want and fd in self._watching:
                self._watching.discard(fd)
                self.unwatch(fd)

    def _block(self, listener: str, why: str) -> None:
        self._blocked[listener] = why
        self._update_watch()

    def _unblock(self, listener: str, why: str) -> None:
        if self._blocked.get(listener) == why:
            del self._blocked[listener]
            self._update_watch()

    def _unblock_below_max(self) -> None:
        for name, why in list(self._blocked.items()):
            if why == "max" and self.per_listener[name] < self.listener_max[name]:
                self._unblock(name, "max")

    def _take_token(self) -> bool:
        now = self.clock()
        self._tokens = min(self.creation_rate, self._tokens + (now - self._tokens_at) * self.creation_rate)
        self._tokens_at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        if self._accepting:  # stop watching the listeners until the next token
            self._accepting = False
            self._update_watch()
            self.counters["creation_rate_throttled"] += 1
            self.call_later((1 - self._tokens) / self.creation_rate, self._start_accepting)
        return False

    def _take_listener_token(self, name: str) -> bool:
        """The listener's own creation rate; when empty it is not watched until the next token."""
        rate, bucket = self.listener_rate[name], self._listener_tokens[name]
        if rate >= UNLIMITED:
            return True
        now = self.clock()
        bucket[0] = min(rate, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        if bucket[0] >= 1:
            bucket[0] -= 1
            return True
        self.counters["listener_creation_rate_throttled"] += 1
        self._block(name, "rate")
        self.call_later((1 - bucket[0]) / rate, lambda: self._unblock(name, "rate"))
        return False

    def _on_accept(self, listener: socket.socket, name: str) -> None:
        for _ in range(ACCEPTS_PER_WAKEUP):
            if name in self._blocked or not self._accepting:
                return
            if self.per_listener[name] >= self.listener_max[name]:  # wait for one of its connections to close
                self.counters["listener_max_connections_waits"] += 1
                self._block(name, "max")
                return
            if not self._take_token():
                return
            if not self._take_listener_token(name):
                self._tokens += 1  # the broker-wide token is not spent
                return
            try:
                sock, addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                self._tokens += 1  # nothing was waiting: the tokens are not spent
                if self.listener_rate[name] < UNLIMITED:
                    self._listener_tokens[name][0] += 1
                return
            except OSError as exc:  # EMFILE and friends: let the backlog hold them a moment
                log.error("%s: accept failed: %s", self.name, exc)
                self.counters["accept_errors"] += 1
                return
            throttle = self.ip_rates.delay(addr[0], self.clock())
            if throttle > 0:
                self._throttle_ip(sock, throttle)
            elif self.per_ip[addr[0]] >= self.max_per_ip:
                self.counters["refused_per_ip"] += 1
                sock.close()
            elif self.total >= self.max_connections:
                self._make_room(sock, addr[0], name)
            else:
                with sock:
                    self._admit(sock, addr[0], name)

    def _throttle_ip(self, sock: socket.socket, throttle: float) -> None:
        """Over its address's connection_creation_rate (KIP-612): held unread for the throttle
        time, then closed, so a client that reconnects at once is slowed down."""
        self.counters["refused_ip_creation_rate"] += 1
        if len(self._ip_throttled) >= MAX_IP_THROTTLED:
            sock.close()
            return
        fd = sock.fileno()
        self._ip_throttled[fd] = sock

        def close() -> None:
            if self._ip_throttled.pop(fd, None) is sock:
                sock.close()
        self.call_later(min(throttle, quotas.IP_HOLD_MAX), close)

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
        self.request(name, ShedIdle(), callback=lambda _reply: self._shed_next(sock, ip, listener, rest),
                     timeout=SHED_TIMEOUT)

    def _admit(self, sock: socket.socket, ip: str, listener: str) -> None:
        for name in self._by_load():
            if self._hand_off(name, sock, listener, ip):
                self.by_processor[name][ip] += 1
                self.by_processor_listener[name][listener] += 1
                self.per_listener[listener] += 1
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

    def _hand_off(self, name: str, sock: socket.socket, listener: str, ip: str) -> bool:
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
            socket.send_fds(feed, [f"{listener}\n{ip}".encode()], [sock.fileno()])
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN,):
                feed = self._feeds.pop(name, None)
                if feed is not None:
                    feed.close()
            log.warning("%s: hand-off to %s failed: %s", self.name, name, exc)
            return False
