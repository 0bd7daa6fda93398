"""Processor: owns a share of the client connections (``num.network.threads`` of them).

Process: ``processor-<i>``. Owns the client sockets the acceptor hands it (``recv_fds`` on
``<run_dir>/<name>.sock``; non-blocking, in its poll loop), each with its decoder (native or
Kafka, told apart by the first bytes), TLS, SASL state, write queue and response slots, and the
pinning of each connection to one handler; its share of the client quotas (network/quotas.py).
Accepts (bodies: ``odradek.actors.messages``):
  connections: from the acceptor after its restart; answered ``ProcessorConnections``
  shed_idle: from the acceptor at ``max.connections``: close the least recently used idle
      connection; answered ``Shed`` (after its ``conn_closed``)
and the runtime's ``_members`` (handlers: re-pin; the fetch actor and coordinators: fail what
was forwarded there when one restarts); ``Response`` (+ frames) / ``_error`` answer its requests.
Sends: ``request`` (``Request``) + frames to the connection's pinned handler; ``conn_closed``
(one-way) and ``quota_usage`` to the acceptor.
Answers ApiVersions, SASL and BROKER_PROOF itself.
Invariants: a connection's answers are written in request order; when the actor holding its
requests dies (its handler, or the fetch actor or a coordinator a handler forwarded them to:
``FORWARDED_TO``) they fail at once, retriable, and late answers are ignored; back-pressure is
always "stop reading", never growth, within the limits of docs/ARCHITECTURE.md "Limits and
back-pressure"; writes never block; file regions go by ``os.sendfile`` except over TLS; before
authentication a SASL connection is served only ApiVersions and the SASL APIs
(docs/SECURITY.md).
"""
from __future__ import annotations

import collections
import functools
import importlib
import logging
import math
import os
import socket
import ssl
import struct
import time
from typing import Any, Callable

from odradek.actors.message import ERROR, Message
from odradek.actors.messages import (Balances, ConnClosed, ErrorReply, ProcessorConnections, QuotaUsage, Request,
                                     Response, Shed)
from odradek.actors.metrics import BoundedLabels
from odradek.actors.names import ACCEPTOR, FETCH_ACTOR, GROUP_COORDINATOR, HANDLER, TXN_COORDINATOR, socket_path
from odradek.actors.runtime import POLLERR, POLLIN, POLLOUT, Actor, MailboxFull, make_private
from odradek.core import kafka_batch, records
from odradek.core import codec, sasl
from odradek.network import listeners as listeners_mod, quotas, secstore, tls
from odradek.core.kafka import framing as kafka_framing
from odradek.core.protocol import FETCH_ACTOR_APIS, GROUP_APIS, TXN_APIS, ApiKey, ErrorCode

log = logging.getLogger("odradek.processor")

RECV_SIZE = 256 * 1024  # bytes asked of one recv()
IOV_MAX = 512  # buffers per sendmsg()
RESUME_FRACTION = 0.9  # reading resumes when in-flight falls below this share of the cap
SWEEP_INTERVAL_MAX = 1.0  # seconds between idle/timeout sweeps (less when the limits are small)
STOP_DRAIN_SECONDS = 2.0  # how long a stopping processor waits for in-flight answers
DIED_CODE = ErrorCode.NETWORK_EXCEPTION
# The APIs a handler forwards to another actor that then answers the processor itself, by
# that actor's role: when it dies (or comes back), those in flight fail at once with the
# code given (retriable; on COORDINATOR_NOT_AVAILABLE Kafka's clients and the bundled one
# look the coordinator up again) instead of at request.timeout.ms (``_forwarded_to_changed``).
FORWARDED_TO = {
    FETCH_ACTOR: (frozenset(FETCH_ACTOR_APIS), DIED_CODE,
                  "the fetch actor restarted while serving this request; ask again"),
    TXN_COORDINATOR: (frozenset(TXN_APIS), ErrorCode.COORDINATOR_NOT_AVAILABLE,
                      "the transaction coordinator restarted while serving this request; its outcome is unknown: "
                      "retry"),
    GROUP_COORDINATOR: (frozenset(GROUP_APIS), ErrorCode.COORDINATOR_NOT_AVAILABLE,
                        "the group coordinator restarted while serving this request; retry"),
}
DEFAULT_REQUEST_BYTES = 104857600  # queued.max.request.bytes
DEFAULT_SASL_MAX_RECEIVE = 524288  # sasl.server.max.receive.size: a frame before authentication, at most
PIPELINE_MAX = 100  # requests of one connection awaiting their answers before it is not read
PAUSED_PIPELINE = 2  # at queued.max.requests, a connection with fewer awaiting their answers is still read
ANSWER_BYTES_MAX = 8 << 20  # unread answer bytes of one connection before it is not read
CLIENT_IDS_MAX = 100  # client ids counted by name at a time; the others count as "(other)"
CLIENT_ID_LABEL_MAX = 100  # a longer client id counts as "(other)" too
CLIENT_ID_KEPT = 256  # characters of a client id a connection keeps for its log lines


_NO_BODY = Response({})  # a _reply without a body


class Slot:
    """A request's place in its connection's answer order: ``bufs``, its answer's buffers once
    known (None until then). A request sent on (not answered here) also has its metrics label
    ``api`` (None otherwise), when it ``arrived`` and was ``answered`` (its timings), its Kafka
    context (None: native) and ``no_quota`` (a proven broker's, or failed by the broker)."""

    __slots__ = ("corr", "bufs", "api", "arrived", "answered", "kafka", "no_quota")

    def __init__(self, corr: int, bufs: list | None = None, api: int | None = None, arrived: float = 0.0,
                 kafka: tuple | None = None, no_quota: bool = False):
        self.corr, self.bufs, self.api, self.arrived, self.answered = corr, bufs, api, arrived, 0.0
        self.kafka, self.no_quota = kafka, no_quota


def _client_throttles(slot: Slot) -> bool:
    """Whether the client waits out an answer's ``throttle_time_ms`` itself (KIP-219: Kafka's
    Produce v6+ and Fetch v8+), so the answer may go at once; older Kafka versions and the
    native protocol (whose bundled client does not wait) get the answer held back instead."""
    ctx = slot.kafka
    return ctx is not None and ctx[1] >= (6 if slot.api == ApiKey.PRODUCE else 8)


def _nbytes(buf: Any) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)
ANONYMOUS = "User:ANONYMOUS"
SASL_APIS = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)
ANSWERED_HERE = (*SASL_APIS, ApiKey.BROKER_PROOF)  # native requests the processor answers itself
BEFORE_AUTH = (ApiKey.API_VERSIONS, *SASL_APIS)  # all a SASL connection may send before it authenticates
TLS_CHUNK = 256 * 1024  # bytes per SSL write (a TLS record stream, no sendmsg)
KNOWN_APIS = frozenset(int(k) for k in ApiKey)  # metric labels: a client's made-up key counts as -1
_KAFKA_HEAD = records.LENGTH_AND_MAGIC  # a stored batch's batch_length and magic (either format)
HEADER_WINDOW = 4096  # bytes read at a time while checking a Kafka fetch's batch headers


def _read_regions(files) -> list:
    """The bytes of a reply's file regions (a Kafka fetch: native batches must be converted,
    so no sendfile); a region cut short (segment deleted meanwhile) is zero-filled, as the
    native path pads it, and the conversion drops it."""
    out = []
    for path, position, length in files or ():
        try:
            with open(path, "rb") as f:
                out.append(os.pread(f.fileno(), int(length), int(position)).ljust(int(length), b"\0"))
        except OSError as exc:
            log.warning("cannot read %s for a Kafka fetch: %s", path, exc)
            out.append(bytes(int(length)))
    return out


def _kafka_regions(files) -> list | None:
    """A Kafka fetch's file regions as ``FileRegion``s to send with ``os.sendfile``, when every
    batch in them is magic 2 and whole (written by a Kafka producer: nothing to convert); None
    when one is not (a native batch, a region cut short, a header that does not add up): the
    copy path (``_read_regions``, then ``as_kafka_records``) converts or drops it. Only the
    batch headers are read (``_whole_magic_2``), never the records."""
    regions = []
    for path, position, length in files or ():
        position, length = int(position), int(length)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            if not _whole_magic_2(fd, position, position + length):
                return None
        except OSError:
            return None
        finally:
            os.close(fd)
        regions.append(FileRegion(str(path), position, length))
    return regions


def _whole_magic_2(fd: int, pos: int, end: int) -> bool:
    """Whether bytes ``pos`` .. ``end`` of the file are whole magic-2 batches, end to end. Both
    formats put ``batch_length`` at byte 8 and the magic at byte 16 of a batch; the headers are
    read a window at a time (one pread covers many small batches; a large batch costs one)."""
    head, least = _KAFKA_HEAD, _KAFKA_HEAD.size
    while pos < end:
        buf = os.pread(fd, min(HEADER_WINDOW, end - pos), pos)
        at, last = 0, len(buf) - least  # headers starting at or before ``last`` are in the window
        while at <= last:
            batch_length, magic = head.unpack_from(buf, at)
            if magic != kafka_batch.MAGIC or batch_length < records.MIN_BATCH_LENGTH:
                return False
            at += records.LOG_OVERHEAD + batch_length
        if at == 0:  # not even one header left: a region cut short
            return False
        pos += at
    return pos == end


class FileRegion:
    """A response piece sent with ``os.sendfile``: ``length`` bytes of ``path`` from
    ``position``. Short or missing files are padded with zeros to the promised length."""

    __slots__ = ("path", "position", "left", "fd", "padding")

    def __init__(self, path: str, position: int, length: int):
        self.path, self.position, self.left = path, position, length
        self.fd: int | None = None
        self.padding = False

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Connection:
    """One client connection: its socket, decoder, pinned handler, slots and write queue.
    Owned by one processor; never shared."""

    __slots__ = ("id", "sock", "fd", "peer", "ip", "decoder", "handler", "slots", "at_handler", "wq",
                 "events", "callback", "last_active", "repin", "closing", "closed", "requests",
                 "reserved", "starved", "started", "wq_bytes", "sniff", "kafka", "listener", "tls",
                 "handshaking", "principal", "sasl", "client", "client_label", "muted", "auth_by", "broker",
                 "broker_nonce")

    def __init__(self, conn_id: int, sock: socket.socket, peer: tuple, max_size: int, now: float):
        self.id = conn_id
        self.sock = sock
        self.fd = sock.fileno()
        self.ip = peer[0]
        self.peer = f"{peer[0]}:{peer[1]}"
        self.decoder = codec.Decoder(max_size)
        self.handler: str | None = None
        self.slots: collections.deque[Slot] = collections.deque()  # in request order
        self.at_handler = 0  # requests out at the pinned handler
        self.wq: collections.deque[Any] = collections.deque()  # buffers and FileRegions to write
        self.events = 0
        self.callback = None
        self.last_active = now
        self.repin = False  # waiting for at_handler == 0 to move to another handler
        self.closing = False  # write what is due, then close
        self.closed = False
        self.requests = 0
        self.reserved = 0  # bytes received and not yet handed on, charged to queued.max.request.bytes
        self.starved = False  # waiting for the processor's byte budget; not read meanwhile
        self.started: float | None = None  # when the request being read began to arrive
        self.wq_bytes = 0  # answer bytes in wq (file regions aside)
        # Protocol: decided on the first bytes (``_sniff``); ``kafka`` holds a Kafka
        # connection's state, None for a native one (``decoder`` is then codec.Decoder).
        self.sniff: bytearray | None = bytearray()
        self.kafka = None  # core.kafka.connection.KafkaConnection
        self.listener = "PLAINTEXT"
        self.tls = False  # the socket is an ssl.SSLSocket (no sendmsg, no sendfile)
        self.handshaking = False  # TLS handshake under way
        self.principal: str | None = ANONYMOUS  # None until a SASL connection authenticates
        self.sasl: sasl.Session | None = None
        self.client = ""  # the client id of its last request (log lines, metrics, quotas)
        self.client_label: str | None = None  # what its requests count under (Processor._client_labels)
        self.muted = 0.0  # throttled by a quota (KIP-219): not read or dispatched until this clock time
        self.auth_by: float | None = None  # on a SASL listener: closed if not authenticated by this clock time
        self.broker: int | None = None  # the broker id this connection proved (BROKER_PROOF), else None
        self.broker_nonce: bytes | None = None  # the nonce it was given to prove itself against

    def who(self) -> str:
        """The peer and, once a request said it, the client id: what a log line names."""
        return f"{self.peer} (client '{self.client}')" if self.client else self.peer

    def idle(self) -> bool:
        """Nothing in flight, nothing to write, nothing half received."""
        return not self.slots and not self.wq and not self.decoder.buffered and not self.closing


class InFlight:
    """A request sent to a handler and not yet answered."""

    __slots__ = ("conn", "slot", "handler", "sent", "corr", "done", "reserved")

    def __init__(self, conn: Connection, slot: Slot, handler: str, sent: float, reserved: int):
        self.conn, self.slot, self.handler, self.sent = conn, slot, handler, sent
        self.corr = 0
        self.done = False
        self.reserved = reserved  # the request's bytes, charged to the budget until it is answered


class Processor(Actor):
    def __init__(self, name, run_dir, args=None, supervisor=None, **kw):
        super().__init__(name, run_dir, args, supervisor, **kw)
        config = self.args.get("config", {})
        self.max_request = int(config.get("socket.request.max.bytes", codec.DEFAULT_MAX_FRAME))
        self.idle_timeout = config.get("connections.max.idle.ms", 600000) / 1000
        self.max_inflight = int(config.get("queued.max.requests", 500))
        self.request_timeout = config.get("request.timeout.ms", 30000) / 1000
        self.budget = int(config.get("queued.max.request.bytes", DEFAULT_REQUEST_BYTES))
        self.sasl_max_receive = int(config.get("sasl.server.max.receive.size", DEFAULT_SASL_MAX_RECEIVE))
        self.reserved = 0  # bytes received and not yet answered: of requests being read or at handlers
        self._starved: collections.deque[Connection] = collections.deque()
        self._overdraft: Connection | None = None  # the one connection reading past the budget (its frame's rest)
        self._regrant = False
        self._draining = False  # stopping: no new request goes to a handler
        self.conns: dict[int, Connection] = {}
        self._conn_ids = 0
        self._inflight: dict[int, InFlight] = {}
        self._paused = False
        self._handlers: list[str] = []
        self._forwarded_members: dict[str, list[str]] = {}  # fetch actor, coordinators: as the supervisor last said
        self._pinned: collections.Counter[str] = collections.Counter()
        self._rr = 0
        self._dirty: set[Connection] = set()
        self._flush_timer = None
        self._listener: socket.socket | None = None
        self._feeds: dict[int, socket.socket] = {}
        self.counters = collections.Counter()
        # client ids counted by name: at most CLIENT_IDS_MAX, an idle one making room for a new one
        self._client_labels = BoundedLabels(self.metrics, "client_requests", CLIENT_IDS_MAX, CLIENT_ID_LABEL_MAX)
        self.listeners = {l.name: l for l in listeners_mod.of_config(config)}
        self.tls_context = tls.server_context(config) if any(l.tls for l in self.listeners.values()) else None
        self.mechanisms = [m.strip() for m in config.get("sasl.enabled.mechanisms", sasl.DEFAULT_ENABLED).split(",")]
        self.auth_delay = config.get("failed.authentication.delay.ms", 100) / 1000
        self.users = secstore.Users(self.args.get("data_dir") or ".", config)  # ZooKeeper's in cluster mode
        self._audit_at = collections.defaultdict(float)  # (what, ip) -> last logged, for rate-limiting
        self.quotas = quotas.Quotas(config, self.args.get("data_dir") or ".")
        self._quota_report_out = False  # a usage report awaits the acceptor's answer

    # ---- lifecycle ---------------------------------------------------------------------
    def on_start(self) -> None:
        path = socket_path(self.run_dir, self.name)
        if os.path.exists(path):
            os.unlink(path)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._listener.bind(path)
        make_private(path)  # only the broker's user may hand connections over
        self._listener.listen(16)
        self._listener.setblocking(False)
        self.watch(self._listener.fileno(), self._on_feed_connect)
        sweep = min(SWEEP_INTERVAL_MAX, self.idle_timeout / 4, self.request_timeout / 4)
        self.call_every(max(0.02, sweep), self._sweep)
        self.call_every(quotas.SYNC_INTERVAL, self._sync_quotas)
        # The Kafka codec (kio's types for every API version) loads here, before this processor
        # reports ready, not on its first Kafka connection: that load took 0.2 s of CPU quiet
        # and 4-6 s at load 19, while the processor served nobody and librdkafka's first
        # ApiVersions gave up after 10 s.
        importlib.import_module("odradek.core.kafka.connection")
        importlib.import_module("odradek.core.kafka.security")
        # The quota store (ZooKeeper's in cluster mode) is reached now, not on the first answer:
        # a first read from ZooKeeper blocks this loop until it connects.
        self.quotas.current()

    def on_stop(self) -> None:
        self._drain_before_stop()
        for conn in list(self.conns.values()):
            self._close(conn, "processor stopping")
        for sock in self._feeds.values():
            sock.close()
        if self._listener is not None:
            self._listener.close()
            try:
                os.unlink(socket_path(self.run_dir, self.name))
            except FileNotFoundError:
                pass

    def _drain_before_stop(self) -> None:
        """Give in-flight requests a short while to be answered and written."""
        self._draining = True
        for conn in self.conns.values():
            self._set_events(conn, 0)
        deadline = self.clock() + STOP_DRAIN_SECONDS
        while self._inflight and self.clock() < deadline:
            if self.mailbox.poll(50):
                self._drain_mailbox()
            self._flush_dirty()
        # Retriable, as a closed connection would be: a request not answered here (a produce
        # at a frozen handler, say) may be done again at another broker; the client must not
        # give up (BROKER_NOT_AVAILABLE is final to Kafka's clients and ours).
        for rec in list(self._inflight.values()):
            self._fail(rec, DIED_CODE, f"{self.name} is stopping; the request was not answered, retry")
        self._flush_dirty()

    def metric_gauges(self) -> list:
        count = collections.Counter(c.listener for c in self.conns.values())
        return [["connections", [name], count[name]] for name in self.listeners]

    def stats(self) -> dict:
        return {"connections": len(self.conns), "in_flight": len(self._inflight),
                "backlog": len(self._inflight), "reserved_bytes": self.reserved, **self.counters}

    # ---- receiving connections from the acceptor ----------------------------------------
    def _on_feed_connect(self, _events: int) -> None:
        try:
            sock, _ = self._listener.accept()
        except BlockingIOError:
            return
        sock.setblocking(False)
        self._feeds[sock.fileno()] = sock
        self.watch(sock.fileno(), functools.partial(self._on_feed, sock))

    def _on_feed(self, sock: socket.socket, _events: int) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 64, 16)
        except BlockingIOError:
            return
        except OSError:
            data, fds = b"", []
        if not data and not fds:
            self.unwatch(sock.fileno())
            self._feeds.pop(sock.fileno(), None)
            sock.close()
            return
        # "<listener>\n<ip>" from the acceptor
        name, _, ip = data.decode(errors="replace").partition("\n") if data not in (b"", b"c") else ("", "", "")
        for fd in fds:
            self._adopt(fd, name or next(iter(self.listeners)), ip or "?")

    def _adopt(self, fd: int, listener: str, ip: str = "?") -> None:
        sock = socket.socket(fileno=fd)
        try:
            peer = sock.getpeername()
        except OSError:  # the client left before we got it: the acceptor counted it, uncount it
            sock.close()
            self._tell_acceptor_closed(ip, listener)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        spec = self.listeners.get(listener) or next(iter(self.listeners.values()))
        if spec.tls:
            sock = self.tls_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        self._conn_ids += 1
        conn = Connection(self._conn_ids, sock, peer, self.max_request, self.clock())
        conn.listener, conn.tls, conn.handshaking = spec.name, spec.tls, spec.tls
        if conn.tls:
            conn.started = self.clock()  # the handshake must finish within request.timeout.ms
        if spec.sasl:
            conn.principal = None
            conn.sasl = sasl.Session(self.mechanisms, self.users.lookup, self.users.fake_credential)
            conn.auth_by = self.clock() + self.request_timeout
        conn.callback = functools.partial(self._on_socket, conn)
        self.conns[conn.fd] = conn
        self.counters["accepted"] += 1
        self._pin(conn)
        self._set_events(conn, self._wanted(conn))

    def on_connections(self, msg: Message) -> None:
        ips = collections.Counter(conn.ip for conn in self.conns.values())
        by_listener = collections.Counter(conn.listener for conn in self.conns.values())
        self.reply(msg, ProcessorConnections(self.name, dict(ips), dict(by_listener)))

    def on_shed_idle(self, msg: Message) -> None:
        """The acceptor is at max.connections: make room by closing the least recently used
        idle connection, as Kafka does."""
        idle = [conn for conn in self.conns.values() if conn.idle()]
        if idle:
            self.counters["shed_idle"] += 1
            self._close(min(idle, key=lambda c: c.last_active),
                        "least recently used idle connection, closed to admit a new one at max.connections")
        self.reply(msg, Shed(bool(idle)))

    # ---- socket events -----------------------------------------------------------------
    def _on_socket(self, conn: Connection, events: int) -> None:
        if conn.handshaking:
            self._handshake(conn)
            return
        if events & POLLOUT:
            self._write(conn)
        if events & POLLIN and not conn.closed:
            self._read(conn)
        elif events & POLLERR and not conn.closed:
            self._close(conn, "socket error")

    def _handshake(self, conn: Connection) -> None:
        """One step of a non-blocking TLS handshake; on success the principal is the client
        certificate's subject (mutual TLS) on an SSL listener."""
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._set_events(conn, POLLIN)
            return
        except ssl.SSLWantWriteError:
            self._set_events(conn, POLLOUT)
            return
        except (ssl.SSLError, OSError) as exc:
            self.counters["tls_failed"] += 1
            self.metrics.inc("authentication_failures", (conn.listener,))
            self._audit("tls", conn, f"TLS handshake failed on listener {conn.listener}: {exc}")
            self._close(conn, f"TLS handshake failed: {exc}")
            return
        conn.handshaking = False
        conn.started = None
        self.counters["tls_handshakes"] += 1
        subject = tls.principal(conn.sock.getpeercert())
        if subject and conn.sasl is None:
            conn.principal = subject
            log.info("%s: %s authenticated as %s (TLS client certificate) on listener %s", self.name, conn.peer,
                     subject, conn.listener)
        self._set_events(conn, self._wanted(conn))
        if conn.sock.pending():
            self._read(conn)

    def _audit(self, what: str, conn: Connection, message: str) -> None:
        """Authentication failures: logged with principal and address, at most once a second
        per (kind, address)."""
        now = self.clock()
        key = (what, conn.ip)
        if now - self._audit_at[key] >= 1.0:
            self._audit_at[key] = now
            if len(self._audit_at) > 10000:
                self._audit_at.clear()
            log.warning("audit: %s: %s from %s (principal %s)", self.name, message, conn.peer,
                        conn.principal or "unauthenticated")

    def _read(self, conn: Connection) -> None:
        allowed = self._allowance(conn)
        if allowed <= 0:
            self._starve(conn)
            return
        try:
            data = conn.sock.recv(min(RECV_SIZE, allowed))
            if conn.tls:  # records already decrypted wait in OpenSSL, not in the kernel: poll won't say
                while conn.sock.pending() and len(data) < RECV_SIZE * 4:
                    data += conn.sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except ssl.SSLZeroReturnError:
            self._close(conn, "closed by the client")
            return
        except OSError as exc:
            self._close(conn, f"read failed: {exc}")
            return
        if not data:
            self._close(conn, "closed by the client")
            return
        self.counters["bytes_in"] += len(data)
        if conn.started is None:
            conn.started = self.clock()
        if conn.sniff is not None:
            data = self._sniff(conn, data)
            if data is None:
                return
        conn.decoder.feed(data)
        self._pump(conn)

    def _sniff(self, conn: Connection, data: bytes) -> bytes | None:
        """Tell the protocol from a connection's first bytes (rule: core/kafka/framing.py,
        docs/PROTOCOL.md); the bytes to feed its decoder, or None until enough are known."""
        conn.sniff += data
        kind = kafka_framing.sniff(conn.sniff)
        if kind is None:
            return None
        data, conn.sniff = bytes(conn.sniff), None
        if kind == "kafka":
            # Imported on the first Kafka connection: kio's schemas cost a native-only broker nothing.
            from odradek.core.kafka.connection import KafkaConnection
            conn.kafka = KafkaConnection(self.max_request, conn.peer)
            conn.kafka.intercept = functools.partial(self._kafka_gate, conn)
            conn.decoder = conn.kafka
            self.counters["kafka_connections"] += 1
        return data

    # ---- authentication (SASL), answered here ------------------------------------------
    def _kafka_gate(self, conn: Connection, req) -> codec.Frame | None:
        """A Kafka request before translation: SaslHandshake/SaslAuthenticate answered here;
        anything but ApiVersions before authentication closes the connection (as Kafka)."""
        if req.api == kafka_framing.RAW_SASL:  # a token after SaslHandshake v0, answered raw
            from odradek.core.kafka import security
            bufs, failure = security.raw_sasl_answer(conn.sasl, bytes(req.rest))
            if failure is not None or (conn.sasl is not None and conn.sasl.principal):
                conn.kafka.decoder.raw = False  # done: Kafka requests again (or the connection closes)
            return self._auth_answer(conn, req.corr, bufs, failure)
        if req.api in SASL_APIS:
            from odradek.core.kafka import schema, security
            from odradek.core.kafka.apis import REGISTRY
            api = REGISTRY[req.api]
            if not api.min_version <= req.version <= api.max_version:
                return None  # answered UNSUPPORTED_VERSION by the translation
            body, failure = security.sasl_answer(conn.sasl, req.api, req.version,
                                                 schema.decode_request(req.api, req.version, req.rest))
            bufs = kafka_framing.response(req.corr, schema.response_header_flexible(req.api, req.version),
                                          [schema.encode_response(req.api, req.version, body)])
            if req.api == ApiKey.SASL_HANDSHAKE and req.version == 0 and failure is None:
                conn.kafka.decoder.raw = True  # the tokens come raw from now on
            return self._auth_answer(conn, req.corr, bufs, failure)
        if conn.principal is None and req.api != ApiKey.API_VERSIONS:
            self.counters["unauthenticated_requests"] += 1
            self._audit("authentication", conn, f"API key {req.api} before SASL authentication")
            raise kafka_framing.FrameError(f"API key {req.api} sent before SASL authentication on listener "
                                           f"{conn.listener}", ErrorCode.ILLEGAL_SASL_STATE)
        return None

    def _native_gate(self, conn: Connection, h: dict) -> dict | None:
        """The native equivalent: the answer header for a SASL request, or for a request
        sent before authentication (ILLEGAL_SASL_STATE, then the connection closes)."""
        api, corr = h["api"], h["corr"]
        body = h["body"] if isinstance(h["body"], dict) else {}
        failure = None
        if api == ApiKey.SASL_HANDSHAKE:
            problem = ("ILLEGAL_SASL_STATE", f"listener {conn.listener} has no SASL") if conn.sasl is None \
                else conn.sasl.handshake(str(body.get("mechanism") or ""))
            if problem is None:
                return self._auth_answer(conn, corr, codec.encode_response(corr, {"mechanisms": conn.sasl.enabled}),
                                         None).header
            code, failure = ErrorCode[problem[0]], problem[1]
        elif api == ApiKey.SASL_AUTHENTICATE:
            token = body.get("auth_bytes") or b""
            try:
                if conn.sasl is None:
                    raise sasl.IllegalState(f"listener {conn.listener} has no SASL")
                if not isinstance(token, bytes):
                    raise sasl.AuthenticationFailed("'auth_bytes' must be bytes")
                out = conn.sasl.authenticate(token)
                return self._auth_answer(conn, corr, codec.encode_response(corr, {"auth_bytes": out}), None).header
            except sasl.IllegalState as exc:
                code, failure = ErrorCode.ILLEGAL_SASL_STATE, str(exc)
            except sasl.AuthenticationFailed as exc:
                code, failure = ErrorCode.SASL_AUTHENTICATION_FAILED, str(exc)
        elif conn.principal is None and api != ApiKey.API_VERSIONS:
            code, failure = ErrorCode.ILLEGAL_SASL_STATE, f"authenticate (SaslHandshake, SaslAuthenticate) " \
                                                          f"before other requests on listener {conn.listener}"
        elif api == ApiKey.BROKER_PROOF:
            answer, failure = self._broker_proof(conn, body)
            if failure is None:
                return self._auth_answer(conn, corr, codec.encode_response(corr, answer), None).header
            code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        else:
            return None
        return self._auth_answer(conn, corr, codec.encode_error(corr, code, failure), failure).header

    def _broker_proof(self, conn: Connection, body: dict) -> tuple[dict, str | None]:
        """BROKER_PROOF (docs/SECURITY.md, "Inter-broker requests"): without ``proof``, a fresh
        nonce; with one, the HMAC of the nonce under the cluster's broker key, checked in
        constant time, after which the connection is broker ``broker_id``'s. (answer, failure)."""
        broker_id, proof = body.get("broker_id"), body.get("proof")
        if not isinstance(broker_id, int) or isinstance(broker_id, bool) or broker_id < 0:
            return {}, f"BROKER_PROOF needs the 'broker_id' (>= 0) to prove, got {broker_id!r}"
        if conn.broker is not None:
            return {}, f"this connection already proved it is broker {conn.broker}"
        if proof is None:
            conn.broker_nonce = os.urandom(sasl.BROKER_NONCE_BYTES)
            return {"nonce": conn.broker_nonce}, None
        nonce, conn.broker_nonce = conn.broker_nonce, None  # one try per nonce
        if nonce is None:
            return {}, "BROKER_PROOF with a proof but no nonce asked for first"
        try:
            key = sasl.broker_key(self.users.secret.get())
        except Exception as exc:  # noqa: BLE001 - ZooKeeper unreachable: refused (the broker retries)
            log.warning("%s: cannot read the cluster's secret to check a broker's proof: %r", self.name, exc)
            return {}, "the cluster's secret cannot be read now to check the proof; retry"
        if not sasl.check_broker_proof(key, nonce, broker_id, proof):
            return {}, f"the proof of being broker {broker_id} is wrong: only the brokers of this cluster know its key"
        conn.broker = broker_id
        log.info("%s: %s proved it is broker %d (listener %s)", self.name, conn.peer, broker_id, conn.listener)
        return {"error_code": 0, "broker_id": broker_id}, None

    def _auth_answer(self, conn: Connection, corr: int, bufs: list, failure: str | None) -> codec.Frame:
        if failure is None:
            if conn.sasl is not None and conn.sasl.principal and conn.principal is None:
                conn.principal = conn.sasl.principal
                self.counters["authenticated"] += 1
                log.info("%s: %s authenticated as %s (%s) on listener %s", self.name, conn.peer, conn.principal,
                         conn.sasl.server.mechanism, conn.listener)
            return codec.Frame({"corr": corr, "answer": bufs}, [])
        self.counters["authentication_failed"] += 1
        self.metrics.inc("authentication_failures", (conn.listener,))
        self._audit("authentication", conn, f"authentication failed on listener {conn.listener}: {failure}")
        return codec.Frame({"corr": corr, "answer": bufs, "close": failure}, [])

    def _answer_late(self, conn: Connection, slot: Slot, bufs: list) -> None:
        if not conn.closed:
            slot.bufs = bufs
            self._mark_dirty(conn)

    def _pump(self, conn: Connection) -> None:
        """Send the connection's decoded requests to its handler while it may."""
        decoder = conn.decoder
        while self._can_dispatch(conn):
            if conn.principal is None and self._over_sasl_cap(conn):
                return
            before = decoder.buffered
            try:
                frame = decoder.next()
            except codec.BadRequest as exc:  # read whole: its frame is done with too
                frame = exc
            except codec.FrameError as exc:
                self._reject(conn, exc)
                break
            if frame is None:
                break
            if conn is self._overdraft:
                self._end_overdraft()
            if isinstance(frame, codec.BadRequest):
                self._answer_bad(conn, frame)
                continue
            conn.last_active = conn.started = self.clock()
            self._send_request(conn, frame, before - decoder.buffered)
        if not decoder.buffered:
            conn.started = None
        self._settle(conn)
        self._set_events(conn, self._wanted(conn))

    def _over_sasl_cap(self, conn: Connection) -> bool:
        """Before authentication: a frame announcing more than sasl.server.max.receive.size
        closes the connection at once (as Kafka's SaslServerAuthenticator does), said in the log."""
        size = conn.decoder.head_size()
        if size is None or size - 4 <= self.sasl_max_receive:
            return False
        self.counters["sasl_receive_too_large"] += 1
        self._audit("sasl_receive", conn, f"a frame of {size - 4} bytes before authentication on listener "
                                          f"{conn.listener}, over sasl.server.max.receive.size "
                                          f"({self.sasl_max_receive}); connection closed")
        self._close(conn, "frame over sasl.server.max.receive.size before authentication")
        return True

    def _can_dispatch(self, conn: Connection) -> bool:
        return (conn.handler is not None and not conn.repin and not conn.closing and not self._paused_for(conn)
                and not conn.muted
                and not self._draining and len(conn.slots) < PIPELINE_MAX
                and conn.wq_bytes < ANSWER_BYTES_MAX)

    def _held_back(self, conn: Connection) -> bool:
        """Not read for the processor's reasons (not the client's): its request's deadline
        does not run meanwhile, and restarts when reading does (``_restart_deadline``)."""
        return self._paused_for(conn) or conn.starved or conn.repin or conn.handler is None or conn.muted

    def _paused_for(self, conn: Connection) -> bool:
        """At queued.max.requests: the connections with requests awaiting answers (those making
        the load) are not read; one with fewer than ``PAUSED_PIPELINE`` still is, so a client
        that waits for its answers is never held behind others' pipelined long polls."""
        return self._paused and len(conn.slots) >= PAUSED_PIPELINE

    def _restart_deadline(self, conn: Connection) -> None:
        if conn.started is not None:
            conn.started = self.clock()

    # ---- the byte budget (queued.max.request.bytes) -------------------------------------
    def _allowance(self, conn: Connection) -> int:
        """Bytes ``conn`` may read now: what is left of the budget; when nothing is, the rest
        of its frame if it is in the middle of one and no other connection holds the overdraft
        (it takes it), else 0."""
        if conn is not self._overdraft:
            free = self.budget - self.reserved
            if free > 0:
                return free
            if self._overdraft is not None or not conn.decoder.buffered:
                return 0
            self._overdraft = conn
            self.counters["overdraft"] += 1
        size = conn.decoder.head_size()
        return codec.PREFIX if size is None else max(size - conn.decoder.buffered, 1)

    def _starve(self, conn: Connection) -> None:
        """Nothing left for ``conn`` to read into: it is not read until budget comes back."""
        conn.starved = True
        self._starved.append(conn)
        self.counters["starved"] += 1
        self._set_events(conn, self._wanted(conn))

    def _end_overdraft(self) -> None:
        self._overdraft = None
        if self._starved:
            self._regrant = True
            self._schedule_flush()

    def _settle(self, conn: Connection) -> None:
        """Charge the budget with what ``conn`` holds received and not yet handed on (nothing
        once it is closing: its bytes are dropped with it)."""
        held = 0 if conn.closing or conn.closed else conn.decoder.buffered
        change, conn.reserved = held - conn.reserved, held
        if change > 0:
            self.reserved += change
        else:
            self._release(-change)

    def _release(self, size: int) -> None:
        if size:
            self.reserved -= size
            if self._starved:
                self._regrant = True
                self._schedule_flush()

    def _grant(self) -> None:
        """Budget came back, or the overdraft is free: the connections waiting are watched
        again, and each reads what is left when the poller gets to it (``_allowance``; one
        left with nothing waits again, at the back). With the budget still spent, only the
        first waiting in the middle of a frame, to take the overdraft."""
        self._regrant = False
        if self.reserved >= self.budget:
            if self._overdraft is not None:
                return
            waiting = [c for c in self._starved if not c.closed and c.decoder.buffered][:1]
            for conn in waiting:
                self._starved.remove(conn)
        else:
            waiting, self._starved = list(self._starved), collections.deque()
        for conn in waiting:
            if conn.closed or not conn.starved:
                continue
            conn.starved = False
            self._restart_deadline(conn)  # it waited on us, not the other way round
            self._set_events(conn, self._wanted(conn))
            if conn.tls and conn.sock.pending():  # decrypted already: poll would not say
                self._read(conn)

    def _wanted(self, conn: Connection) -> int:
        events = POLLIN if self._can_dispatch(conn) and not conn.starved else 0
        return events | POLLOUT if conn.wq else events

    def _set_events(self, conn: Connection, events: int) -> None:
        if events == conn.events or conn.closed:
            return
        conn.events = events
        if events:
            self.watch(conn.fd, conn.callback, events)
        else:
            self.unwatch(conn.fd)

    # ---- requests out, answers back ----------------------------------------------------
    def _send_request(self, conn: Connection, frame: codec.Frame, size: int) -> None:
        """Hand a decoded request on (or answer it here); ``size``: its bytes on the wire,
        charged to the budget until it is answered."""
        h = frame.header
        if conn.kafka is None and (conn.principal is None or h["api"] in ANSWERED_HERE):
            h = self._native_gate(conn, h) or h
        if "close" in h:  # authentication failed: answered after failed.authentication.delay.ms, then closed
            slot = Slot(h["corr"])
            conn.slots.append(slot)
            conn.closing = f"authentication failed: {h['close']}"
            self.call_later(self.auth_delay, functools.partial(self._answer_late, conn, slot, h["answer"]))
            return
        if "answer" in h:  # a Kafka request answered without a handler (ApiVersions, ...)
            conn.slots.append(Slot(h["corr"], h["answer"]))
            conn.requests += 1
            self._answered(conn)
            return
        request = tuple.__new__(Request, (h["api"], h["v"], h["client"], conn.id, conn.peer, h["body"], time.time(),
                                          conn.principal, conn.listener, conn.broker))
        api = h["api"] if h["api"] in KNOWN_APIS else -1  # bounded labels, whatever a client sends
        self.metrics.inc("requests", (api,))
        client = h["client"][:CLIENT_ID_KEPT] if isinstance(h["client"], str) else ""
        if client != conn.client or conn.client_label is None:
            self._client_labels.release(conn.client_label)
            conn.client, conn.client_label = client, self._client_labels.acquire(client)
        self.metrics.inc("client_requests", (conn.client_label,))
        if h["api"] == ApiKey.PRODUCE and isinstance(h["body"], dict) and h["body"].get("acks") == 0:
            # Kafka's acks=0: the client waits for nothing, so there is no response slot.
            try:
                self.send(conn.handler, request, frames=frame.frames)
            except MailboxFull:
                self.counters["dropped_acks0"] += 1
            conn.requests += 1
            return
        slot = Slot(h["corr"], None, api, self.clock(), h.get("kafka"),
                    conn.broker is not None)  # no quota: a proven broker's request (or failed here, ``_fail``)
        conn.slots.append(slot)
        conn.requests += 1
        rec = InFlight(conn, slot, conn.handler, self.clock(), size)
        self.reserved += size
        conn.at_handler += 1
        rec.corr = self.request(conn.handler, request, frames=frame.frames,
                                callback=functools.partial(self._on_answer, rec), timeout=None)
        if not rec.done:
            self._inflight[rec.corr] = rec
            if len(self._inflight) >= self.max_inflight:
                self._pause()

    def _on_answer(self, rec: InFlight, reply: Message) -> None:
        if rec.done:
            return  # already failed (handler died, timeout); a late answer is ignored
        rec.done = True
        self._inflight.pop(rec.corr, None)
        self._release(rec.reserved)
        conn = rec.conn
        if rec.handler == conn.handler:
            conn.at_handler -= 1
        slot = rec.slot
        try:
            self._answer(rec, conn, slot, reply)
        except Exception:  # noqa: BLE001 - never leave a connection's later answers queued behind this one
            log.exception("%s: cannot write the answer to %s's request %d (api %s); closing the connection "
                          "(the client retries)", self.name, conn.who(), slot.corr, slot.api)
            self.counters["answer_errors"] += 1
            self._close(conn, "an answer could not be written")
        self._answered(conn)

    def _answer(self, rec: InFlight, conn: Connection, slot: Slot, reply: Message) -> None:
        """Put the answer to ``rec`` in its slot (answers go out in request order): the quota's
        throttle, then the reply encoded for the connection's protocol."""
        corr, slot.answered = slot.corr, self.clock()
        # None: an _error (ErrorReply); a _reply is a Response (the runtime typed it), an empty one if bodiless
        answer = None if reply.type == ERROR else (reply.fields or _NO_BODY)
        # Kafka's remote time: what the answering actor held it in a purgatory (acks=all, long poll)
        self.metrics.observe("request_remote_ms", (slot.api,), 0 if answer is None else answer.remote_ms)
        throttle = 0.0 if slot.no_quota else self._quota_delay(conn, rec, reply, answer)
        if throttle > 0 and slot.api in (ApiKey.PRODUCE, ApiKey.FETCH) and answer is not None:
            # the answer says how long (KIP-219); the connection is muted that long
            answer = answer._replace(body={**answer.body, "throttle_time_ms": math.ceil(throttle * 1000)})
        if answer is None:
            self.metrics.inc("errors", (slot.api, reply.fields.code))
        if conn.kafka is not None:
            slot.bufs = conn.kafka.answer(slot.kafka, corr, reply.type, reply.fields if answer is None else answer,
                                          [] if answer is None else self._kafka_payload(conn, reply, answer.files))
        elif answer is None:
            slot.bufs = codec.encode_error(corr, reply.fields.code, reply.fields.message)
        else:
            slot.bufs = self._response(corr, answer, reply.frames, conn.tls)
        if throttle > 0:
            conn.muted = max(conn.muted, self.clock() + throttle)
            if not _client_throttles(slot) or answer is None:  # no throttle_time_ms to wait out:
                # hold its answer back for the time
                slot.bufs, bufs = None, slot.bufs
                self.call_later(throttle, functools.partial(self._release_throttled, conn, slot, bufs))
            self.call_later(throttle, functools.partial(self._unmute, conn))

    def _kafka_payload(self, conn: Connection, reply: Message, files) -> list:
        """The payload a Kafka answer is written from: the reply's frames and its file regions,
        as ``FileRegion``s (sendfile, as a native fetch) when they hold only whole magic-2
        batches and the socket is not TLS, else as bytes read here (native batches are
        converted, TLS must encrypt them)."""
        if not files:
            return list(reply.frames)
        if not conn.tls and not reply.frames:
            regions = _kafka_regions(files)
            if regions is not None:
                self.counters["kafka_fetch_sendfile"] += 1
                return regions
        self.counters["kafka_fetch_copied"] += 1
        return list(reply.frames) + _read_regions(files)

    def _release_throttled(self, conn: Connection, slot: Slot, bufs: list) -> None:
        if not conn.closed:
            slot.bufs = bufs
            self._answered(conn)

    def _quota_delay(self, conn: Connection, rec: InFlight, reply: Message, answer: Response | None) -> float:
        """Seconds this connection is over its quotas by with this answer, 0 within them
        (network/quotas.py): the byte rate (a produce request's size, a fetch answer's) and
        the request time (from the hand-off to the answer, less what a purgatory held it:
        Kafka's local time, with the wait in the actors' mailboxes). The larger one counts.
        ``answer``: None for an ``_error``."""
        if not self.quotas.current():  # no quota set anywhere (the usual case): nothing to count
            return 0.0
        now = self.clock()
        used = max(0.0, now - rec.sent - (0 if answer is None else answer.remote_ms) / 1000)
        delay = self.quotas.delay(conn.principal, conn.client, "request", used * 1e6, now)
        if delay > 0:
            self.metrics.observe("throttle_ms", ("request",), delay * 1000)
        kind = "request"
        if rec.slot.api in (ApiKey.PRODUCE, ApiKey.FETCH) and answer is not None:
            produce = rec.slot.api == ApiKey.PRODUCE
            nbytes = rec.reserved if produce else (sum(_nbytes(b) for b in reply.frames) +
                                                   sum(int(f[2]) for f in answer.files or ()))
            byte_delay = self.quotas.delay(conn.principal, conn.client, "produce" if produce else "fetch",
                                           nbytes, now)
            if byte_delay > 0:
                self.metrics.observe("throttle_ms", ("produce" if produce else "fetch",), byte_delay * 1000)
            if byte_delay > delay:
                delay, kind = byte_delay, "produce" if produce else "fetch"
        if delay > 0:
            self.counters["throttled"] += 1
            self.counters[f"throttled_{kind}"] += 1
        return delay

    def _sync_quotas(self) -> None:
        """Report the quota usage since the last report to the acceptor, which holds the
        broker-wide buckets (network/quotas.py); one report at a time, none when idle."""
        if self._quota_report_out:
            return
        entries = self.quotas.report()
        if not entries:
            return
        self._quota_report_out = True
        self.request(ACCEPTOR, QuotaUsage(entries), callback=self._quotas_synced, timeout=1.0)

    def _quotas_synced(self, reply: Message) -> None:
        self._quota_report_out = False
        if not reply.is_error:
            self.quotas.synced(reply.fields.balances or [], self.clock())

    def _unmute(self, conn: Connection) -> None:
        """The throttle time is over (the latest of the connection's throttled answers):
        its requests are read and dispatched again."""
        if not conn.muted or conn.closed:
            return
        left = conn.muted - self.clock()
        if left > 0:  # a later throttled answer muted it for longer (or the timer ran early)
            self.call_later(left, functools.partial(self._unmute, conn))
            return
        conn.muted = 0.0
        self._answered(conn)

    def _response(self, corr: int, answer: Response, frames, copy: bool = False) -> list:
        body, files = answer.body or {}, answer.files
        if not files:
            return codec.encode_response(corr, body, frames)
        if copy:  # TLS: the file's bytes must pass through the cipher, so no sendfile
            return codec.encode_response(corr, body, list(frames) + _read_regions(files))
        regions = [FileRegion(str(p), int(pos), int(n)) for p, pos, n in files]
        bufs = codec.encode_response(corr, body, frames, [r.left for r in regions])
        bufs.extend(regions)
        return bufs

    def _answered(self, conn: Connection) -> None:
        """Bookkeeping after a request of ``conn`` was answered or failed."""
        if not conn.closed:
            self._mark_dirty(conn)
        if conn.repin and conn.at_handler == 0:
            self._move(conn)
        if self._paused and len(self._inflight) < self.max_inflight * RESUME_FRACTION:
            self._resume()

    def _fail(self, rec: InFlight, code: ErrorCode, message: str) -> None:
        self.cancel_request(rec.corr)
        rec.slot.no_quota = True  # the broker's failure, not the client's use: no quota is charged for it
        self._on_answer(rec, Message(ERROR, rec.corr, None, ErrorReply(int(code), message)))

    # ---- writing responses in request order --------------------------------------------
    def _mark_dirty(self, conn: Connection) -> None:
        self._dirty.add(conn)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_timer is None:
            self._flush_timer = self.call_later(0, self._flush_dirty)

    def _flush_dirty(self) -> None:
        """Runs once per loop turn after answers arrived: one write per connection; then
        returned budget goes to the connections waiting for it."""
        self._flush_timer = None
        dirty, self._dirty = self._dirty, set()
        for conn in dirty:
            if conn.closed:
                continue
            slots = conn.slots
            while slots and slots[0].bufs is not None:
                slot = slots.popleft()
                conn.wq_bytes += sum(_nbytes(b) for b in slot.bufs if not isinstance(b, FileRegion))
                conn.wq.extend(slot.bufs)
                if slot.api is not None:
                    self._timed(slot)
            self._write(conn)
        if self._regrant:
            self._grant()

    def _timed(self, slot: Slot) -> None:
        """A response leaves its slot for the socket: its total time (arrival here to the
        write) and its response-send part (answer received to the write, Kafka's response
        queue + send), per API."""
        now, api = self.clock(), (slot.api,)
        self.metrics.observe("request_total_ms", api, (now - slot.arrived) * 1000)
        self.metrics.observe("response_send_ms", api, (now - slot.answered) * 1000)

    def _write(self, conn: Connection) -> None:
        wq = conn.wq
        try:
            while wq:
                if isinstance(wq[0], FileRegion):
                    if not self._send_region(conn, wq[0]):
                        break
                    wq.popleft().close()
                    continue
                if conn.tls:
                    sent = self._tls_send(conn)
                else:
                    bufs = []
                    for item in wq:
                        if isinstance(item, FileRegion) or len(bufs) == IOV_MAX:
                            break
                        bufs.append(item)
                    sent = conn.sock.sendmsg(bufs)
                self.counters["bytes_out"] += sent
                conn.wq_bytes -= sent
                if not self._consume(wq, sent):
                    break
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            pass
        except OSError as exc:
            self._close(conn, f"write failed: {exc}")
            return
        conn.last_active = self.clock()
        if not wq and conn.closing and not conn.slots:
            self._close(conn, conn.closing if isinstance(conn.closing, str) else "closing")
            return
        self._pump(conn)  # requests held back while its answers piled up may go on now

    @staticmethod
    def _tls_send(conn: Connection) -> int:
        """One TLS write of the queue's head buffers, up to TLS_CHUNK: all of it or nothing
        (SSLWantWriteError; the same bytes are offered again, as OpenSSL requires)."""
        wq = conn.wq
        head = wq[0]
        if _nbytes(head) >= TLS_CHUNK or len(wq) == 1 or isinstance(wq[1], FileRegion):
            chunk = memoryview(head).cast("B")[:TLS_CHUNK]
        else:
            parts, size = [], 0
            for item in wq:
                if isinstance(item, FileRegion) or size + _nbytes(item) > TLS_CHUNK:
                    break
                parts.append(item)
                size += _nbytes(item)
            chunk = b"".join(parts)
        return conn.sock.send(chunk)

    @staticmethod
    def _consume(wq: collections.deque, sent: int) -> bool:
        """Drop ``sent`` bytes from the head of the queue; False if a buffer was cut short."""
        while wq and not isinstance(wq[0], FileRegion):
            head = wq[0]
            n = _nbytes(head)
            if n <= sent:  # empty frames too, even when nothing was sent
                wq.popleft()
                sent -= n
            elif sent == 0:
                return True
            else:
                wq[0] = memoryview(head).cast("B")[sent:]
                return False
        return True

    def _send_region(self, conn: Connection, region: FileRegion) -> bool:
        """Write a file region with sendfile; True when all of it went out."""
        while region.left:
            if region.fd is None and not region.padding:
                try:
                    region.fd = os.open(region.path, os.O_RDONLY)
                except OSError as exc:
                    self._pad(region, f"cannot open: {exc}")
            if region.padding:
                sent = conn.sock.send(bytes(min(region.left, 65536)))
            else:
                sent = os.sendfile(conn.fd, region.fd, region.position, region.left)
                if sent == 0:
                    self._pad(region, "file is shorter than promised")
                    continue
            region.position += sent
            region.left -= sent
            self.counters["bytes_out"] += sent
        return True

    def _pad(self, region: FileRegion, why: str) -> None:
        log.warning("%s: %s at %s:%d; padding %d bytes with zeros", self.name, why, region.path,
                    region.position, region.left)
        region.close()
        region.padding = True
        self.counters["padded_regions"] += 1

    # ---- refusing and closing ----------------------------------------------------------
    def _reject(self, conn: Connection, exc: codec.FrameError) -> None:
        """A framing error: answer with the correlation id if we have one, then close."""
        self.counters["rejected"] += 1
        log.info("%s: %s sent a bad request (%s): %s", self.name, conn.who(), exc.code.name, exc.message)
        conn.closing = f"bad request: {exc.message}"
        if conn is self._overdraft:
            self._end_overdraft()
        self._settle(conn)
        if exc.corr is not None:
            conn.slots.append(Slot(exc.corr, codec.encode_error(exc.corr, exc.code, exc.message)))
        self._mark_dirty(conn)

    def _answer_bad(self, conn: Connection, exc: codec.BadRequest) -> None:
        """A whole request with an unacceptable header: answer it in its turn; the
        connection goes on."""
        self.counters["rejected"] += 1
        log.info("%s: %s sent a bad request (%s): %s", self.name, conn.who(), exc.code.name, exc.message)
        conn.last_active = self.clock()
        conn.slots.append(Slot(exc.corr, codec.encode_error(exc.corr, exc.code, exc.message)))
        self._mark_dirty(conn)

    def _close(self, conn: Connection, why: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        self.unwatch(conn.fd)
        self.conns.pop(conn.fd, None)
        for item in conn.wq:
            if isinstance(item, FileRegion):
                item.close()
        conn.wq.clear()
        try:
            conn.sock.close()
        except OSError:
            pass
        if conn.handler is not None:
            self._pinned[conn.handler] -= 1
        self._client_labels.release(conn.client_label)
        if conn is self._overdraft:
            self._end_overdraft()
        self._settle(conn)
        if conn.starved:
            self._regrant = True
            self._schedule_flush()
        self.counters["closed"] += 1
        log.debug("%s: closed %s (%s)", self.name, conn.who(), why)
        self._tell_acceptor_closed(conn.ip, conn.listener)

    def _tell_acceptor_closed(self, ip: str, listener: str) -> None:
        try:
            self.send(ACCEPTOR, ConnClosed(self.name, ip, listener))
        except MailboxFull:
            log.warning("%s: could not tell the acceptor a connection from %s closed", self.name, ip)

    def _sweep(self) -> None:
        """Close idle connections and those whose request is not whole within
        request.timeout.ms of its first byte; fail requests older than request.timeout.ms."""
        now = self.clock()
        for conn in list(self.conns.values()):
            if now - conn.last_active > self.idle_timeout and not conn.slots and not conn.wq:
                self.counters["idle_closed"] += 1
                self._close(conn, "idle")
            elif conn.started is not None and not self._held_back(conn) and now - conn.started > self.request_timeout:
                self.counters["slow_request_closed"] += 1
                log.info("%s: %s did not send its request whole within request.timeout.ms; closing",
                         self.name, conn.who())
                self._close(conn, "request not whole within request.timeout.ms")
            elif conn.principal is None and conn.auth_by is not None and now > conn.auth_by and not conn.closing:
                self.counters["unauthenticated_closed"] += 1
                self._audit("authentication", conn, f"not authenticated within request.timeout.ms of connecting "
                                                    f"on listener {conn.listener}; connection closed")
                self._close(conn, "not authenticated within request.timeout.ms")
        expired = [rec for rec in self._inflight.values() if now - rec.sent > self.request_timeout]
        for rec in expired:
            self._fail(rec, ErrorCode.REQUEST_TIMED_OUT,
                       f"no answer from {rec.handler} within request.timeout.ms")

    # ---- back-pressure -----------------------------------------------------------------
    def _pause(self) -> None:
        self._paused = True
        self.counters["paused"] += 1
        for conn in self.conns.values():
            self._set_events(conn, self._wanted(conn))

    def _resume(self) -> None:
        self._paused = False
        for conn in list(self.conns.values()):
            if not conn.closed:
                self._restart_deadline(conn)
                self._pump(conn)

    # ---- handler membership and pinning ------------------------------------------------
    def on_members(self, role: str, members: list[str], retired: list[str]) -> None:
        if role in FORWARDED_TO:
            self._forwarded_to_changed(role, members)
            return
        if role != HANDLER:
            return
        old = self._handlers
        self._handlers = list(members)
        for name in old:
            if name in members:
                continue
            if name in retired:
                self._drain_handler(name)
            else:
                self._handler_died(name)
        for conn in list(self.conns.values()):
            if conn.handler is None and not conn.closed:
                self._pin(conn)
                self._restart_deadline(conn)
                self._pump(conn)
        if any(name not in old for name in members):
            self._rebalance()

    def _forwarded_to_changed(self, role: str, members: list[str]) -> None:
        """The fetch actor or a coordinator died (``members`` empty) or is running again: what
        it held died with it, and what was forwarded to it meanwhile may have been lost, so
        every request in flight that handlers forward there fails now, retriable
        (``FORWARDED_TO``), instead of at request.timeout.ms."""
        known, self._forwarded_members[role] = self._forwarded_members.get(role), list(members)
        if known is None or known == members:
            return  # the first word (nothing lost), or nothing changed
        apis, code, message = FORWARDED_TO[role]
        lost = self._fail_inflight(lambda rec: rec.slot.api in apis, message, code)
        if lost:
            log.warning("%s: %s %s; failed %d requests in flight there", self.name, role,
                        "is back" if members else "died", lost)

    def _fail_inflight(self, lost: Callable[[InFlight], bool], message: str, code: ErrorCode = DIED_CODE) -> int:
        """Fail the requests in flight that ``lost`` picks (an actor holding them died) with
        ``code`` (retriable); their late answers are ignored. How many."""
        recs = [rec for rec in self._inflight.values() if lost(rec)]
        for rec in recs:
            self._fail(rec, code, message)
        return len(recs)

    def _drain_handler(self, name: str) -> None:
        """A retiring handler: finish what it holds, then move its connections."""
        for conn in list(self.conns.values()):
            if conn.handler == name:
                self._mark_move(conn)

    def _handler_died(self, name: str) -> None:
        failed = self._fail_inflight(lambda rec: rec.handler == name,
                                     f"{name} died while handling this request; its outcome is unknown")
        log.warning("%s: %s died; failed its %d in-flight requests", self.name, name, failed)
        for conn in list(self.conns.values()):
            if conn.handler == name:
                self._mark_move(conn)

    def _mark_move(self, conn: Connection) -> None:
        conn.repin = True
        if conn.at_handler == 0:
            self._move(conn)
        else:
            self._set_events(conn, self._wanted(conn))

    def _move(self, conn: Connection) -> None:
        if conn.handler is not None:
            self._pinned[conn.handler] -= 1
            conn.handler = None
        conn.repin = False
        conn.at_handler = 0
        if not conn.closed:
            self._pin(conn)
            self._restart_deadline(conn)
            self._pump(conn)

    def _pin(self, conn: Connection) -> None:
        """Pin to the handler with the fewest connections (round robin among equals)."""
        if not self._handlers:
            return
        n = len(self._handlers)
        self._rr += 1
        best = min(range(n), key=lambda i: (self._pinned[self._handlers[i]], (i - self._rr) % n))
        conn.handler = self._handlers[best]
        self._pinned[conn.handler] += 1

    def _rebalance(self) -> None:
        """New handlers joined: move connections off the busiest so the pool is used."""
        live = [c for c in self.conns.values() if c.handler is not None and not c.repin and not c.closed]
        if not live or not self._handlers:
            return
        target = -(-len(live) // len(self._handlers))
        count = collections.Counter(c.handler for c in live)
        for conn in live:
            if count[conn.handler] > target:
                count[conn.handler] -= 1
                self._mark_move(conn)
