"""The actor runtime: one actor per process, a mailbox, a poll loop, timers, request/reply.

Process: an actor is one OS process (``actors.launch`` forks or spawns it). Owns one ZeroMQ
context (created after the process starts), one mailbox (a PULL socket bound at
``ipc://<run_dir>/<name>.mbox``), one PUSH socket per peer it sent to, and a single thread whose
loop polls the mailbox, watched file descriptors and a signal wake-up pipe, then runs timers.
Lifecycle: ``on_start()``, then ``_ready`` to the supervisor; each message goes to
``on_<type>(msg)`` (``on_message`` if none; replies to its own ``request()`` to their
callbacks); on ``_stop``, SIGTERM or ``stop()``: ``on_stop()``, then every unanswered request
gets ``_error`` NETWORK_EXCEPTION, every awaited reply fails its callback, sockets close.
Accepts (every actor, the runtime's own): ``_stop``, ``_drain``, ``_ping``, ``_stats``,
``_metrics``, ``_members``, ``_retire``, ``_fence``; sends ``_ready`` and ``_heartbeat`` to the
supervisor.
Invariants: nothing is shared with other processes but files; sending never blocks the loop (a
peer with ``MAILBOX_HWM`` messages queued raises ``MailboxFull`` to the sender) and nothing is
dropped silently; an exception in a handler becomes an ``_error`` reply, never a dead actor;
files and sockets are the user's alone (umask ``PRIVATE_UMASK``, ipc sockets 0600); worker
threads never touch the sockets or state, and hand work to the loop only by ``post(callback)``
(run in order; never after the actor stopped).
"""
from __future__ import annotations

import collections
import ctypes
import heapq
import importlib
import itertools
import logging
import multiprocessing
import os
import resource
import signal
import socket
import sys
import time
import traceback
from typing import Any, Callable, Sequence

import zmq

from odradek.actors.message import ERROR, REPLY, MalformedMessage, Message, decode, encode_header, typed_reply
from odradek.actors.messages import (REPLIES, ActorMetrics, Chained, Done, ErrorReply, Fence, Heartbeat, Name, Pong, Ready,
                                     StartFailed)
from odradek.actors.metrics import Metrics
from odradek.core.protocol import ErrorCode, OdradekError

log = logging.getLogger("odradek.actors")

HEARTBEAT_INTERVAL = 1.0  # seconds between heartbeats an actor sends its supervisor
MAILBOX_HWM = 100_000  # messages queued towards one peer before MailboxFull
LINGER_MS = 500  # how long close() waits to deliver queued messages
MAX_BATCH = 256  # messages handled per wake-up before timers and fds get a turn
PRIVATE_UMASK = 0o077  # files 0600, directories 0700, whatever the operator's umask
PROGRESS_INTERVAL = 1.0  # seconds between two progress reports of long work
# pyzmq's constants are enum flags: ``a | b`` or ``n & zmq.POLLIN`` builds an enum member
# (0.5-0.8 us each); the hot paths (here and the actors' own socket events) use plain ints.
_NOBLOCK = int(zmq.NOBLOCK)
_NOBLOCK_MORE = int(zmq.NOBLOCK | zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)
POLLIN, POLLOUT, POLLERR = int(zmq.POLLIN), int(zmq.POLLOUT), int(zmq.POLLERR)


class MailboxFull(OdradekError):
    code = ErrorCode.REQUEST_TIMED_OUT


def mailbox_address(run_dir: str, name: str) -> str:
    return f"ipc://{os.path.join(run_dir, name)}.mbox"


def mailbox_path(run_dir: str, name: str) -> str:
    return os.path.join(run_dir, name) + ".mbox"


def make_private(path: str) -> None:
    """A socket (or file) just created: readable and writable by this user only."""
    os.chmod(path, 0o600)


def private_dir(path: str, what: str = "data directory") -> None:
    """Make ``path`` this user's alone whatever the umask: create it (and its missing parents)
    with mode 0700; narrow an existing one of this user's to 0700 (saying so if others could
    write to it: whatever they put there belongs to them, which the security store refuses);
    refuse one that is not a directory or belongs to another user (OdradekError)."""
    path = os.path.abspath(path)
    missing = []
    at = path
    while not os.path.lexists(at):
        missing.append(at)
        at = os.path.dirname(at)
    for p in reversed(missing):
        try:
            os.mkdir(p, 0o700)
        except FileExistsError:  # another command made it meanwhile: checked below
            continue
        os.chmod(p, 0o700)  # mkdir's mode was narrowed by the umask only, never widened
    st = os.stat(path)
    if not os.path.isdir(path):
        raise OdradekError(f"{what} {path} exists and is not a directory", ErrorCode.INVALID_CONFIG)
    if st.st_uid != os.geteuid():
        raise OdradekError(f"{what} {path} belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()}); "
                           f"run as its owner, or give log.dirs a directory of your own", ErrorCode.INVALID_CONFIG)
    mode = st.st_mode & 0o777
    if mode != 0o700:
        if mode & 0o022:
            log.warning("%s %s had mode %04o (others could write to it); narrowing it to 0700", what, path, mode)
        os.chmod(path, 0o700)


def import_object(path: str) -> Any:
    """``"package.module:Name"`` -> the object."""
    module, _, attr = path.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


class Timer:
    """A handle on a scheduled callback; ``cancel()`` makes it a no-op."""

    __slots__ = ("deadline", "callback", "interval", "cancelled")

    def __init__(self, deadline: float, callback: Callable[[], Any], interval: float | None):
        self.deadline = deadline
        self.callback = callback
        self.interval = interval
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Actor:
    """Base class of every actor. Subclasses implement ``on_start``, ``on_stop`` and
    ``on_<type>(msg)`` handlers, and use ``send``, ``request``, ``reply``, ``forward``,
    ``call_later``/``call_every`` and ``watch``/``unwatch``.

    ``args`` is the dict given in the actor's spec (plain data: it crossed a process
    boundary by pickling). ``clock`` is injectable for tests (monotonic seconds).
    """

    stop_signals: tuple[int, ...] = (signal.SIGTERM,)
    # True when the supervisor respawned this actor after the broker was up (a restart), not at
    # the broker's start: a dependency out of reach is then waited for, not a reason to fail.
    rejoining = False

    def __init__(self, name: str, run_dir: str, args: dict | None = None, supervisor: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.run_dir = run_dir
        self.args = args or {}
        self.supervisor = supervisor
        self.clock = clock
        self.ctx: zmq.Context | None = None
        self.mailbox: zmq.Socket | None = None
        self._peers: dict[str, zmq.Socket] = {}
        self._poller = zmq.Poller()
        self._watched: dict[int, Callable[[int], Any]] = {}
        self._timers: list[tuple[float, int, Timer]] = []
        self._timer_seq = itertools.count()
        self._corr = itertools.count(1)
        # requests sent, not yet answered: corr -> (callback, timeout timer, the answer's class)
        self._waiting: dict[int, tuple[Callable[[Message], Any], Timer | None, type | None]] = {}
        self._unanswered: dict[tuple[str, int], str] = {}  # requests received, not yet answered
        self._stopping = False
        self._running = False
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self.retiring = False
        self._fences_expected: set[str] = set()
        self._fences_seen: set[str] = set()
        self.processed = 0
        self.metrics = Metrics()  # counters and histograms for the metrics actor (``_metrics``)
        self.progress = ""  # long work under way (recovery at start), shown by ``status``
        self._progress_at = clock()  # work shorter than PROGRESS_INTERVAL reports nothing
        self.started_at = time.time()
        self.members: dict[str, list[str]] = {}
        self._early: list = []  # messages that arrived during a blocking call()
        self._posted: collections.deque = collections.deque()  # callbacks from other threads
        self._post_r: socket.socket | None = None
        self._post_w: socket.socket | None = None

    # ---- lifecycle hooks for subclasses -------------------------------------------------
    def on_start(self) -> None:
        """Open resources. Runs before the actor reports ready."""

    def on_stop(self) -> None:
        """Release resources. Pending requests are failed by the runtime afterwards."""

    def on_message(self, msg: Message) -> None:
        """Messages with no ``on_<type>`` handler. Default: error reply for requests."""
        if msg.reply_to:
            self.reply_error(msg, ErrorCode.INVALID_REQUEST, f"{self.name} does not handle '{msg.type}'")
        else:
            log.warning("%s: dropping unexpected one-way message %r", self.name, msg.type)

    def after_batch(self) -> None:
        """Runs once per wake-up after a batch of messages: coalesce notifications here
        (one message per batch instead of one per message)."""

    def stats(self) -> dict:
        """Extra numbers for ``odradek status`` (the heartbeat's ``stats``)."""
        return {}

    def metric_gauges(self) -> list:
        """Values read at scrape time, not counted: ``[[name, [label values], value], ...]``
        (log sizes, group states, ...). Computed only when the metrics actor asks."""
        return []

    def report_progress(self, text: str, done: bool = False) -> None:
        """Long work that holds the loop (recovering partitions at start): say how far it
        is, in the log and in ``odradek status`` (a heartbeat carries it, even before the
        actor is ready), at most once per PROGRESS_INTERVAL, the first time after that
        long. ``done`` logs ``text`` and clears the progress, if any was shown."""
        now = self.clock()
        if (done and not self.progress) or (not done and now - self._progress_at < PROGRESS_INTERVAL):
            return
        self._progress_at = now
        self.progress = "" if done else text
        log.info("%s: %s", self.name, text)
        self._heartbeat()

    def ready_fields(self) -> dict:
        """Extra facts reported with ``_ready`` (a listener's bound address, ...)."""
        return {}

    def on_members(self, role: str, members: list[str], retired: list[str]) -> None:
        """The running instances of a watched role changed. ``self.members[role]`` is
        already updated; override to re-route. ``retired`` names instances leaving the pool
        on purpose (the others that vanished died). Must stop sending to names not in
        ``members`` before it returns: the runtime then fences the retired ones."""

    # ---- sending ---------------------------------------------------------------------
    def _peer(self, name: str) -> zmq.Socket:
        sock = self._peers.get(name)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, MAILBOX_HWM)
            sock.setsockopt(zmq.LINGER, LINGER_MS)
            sock.connect(mailbox_address(self.run_dir, name))
            self._peers[name] = sock
        return sock

    def send(self, to: str, body: Any, frames: Sequence[Any] = (), corr: int = 0,
             reply_to: str | None = None) -> None:
        """One-way message to the actor named ``to``: ``body`` is a message of actors.messages.
        Raises MailboxFull, never blocks."""
        self._transmit(to, body.TYPE, body, frames, corr, reply_to)

    def _transmit(self, to: str, type_: str, fields: Any, frames: Sequence[Any], corr: int,
                  reply_to: str | None) -> None:
        sock = self._peers.get(to) or self._peer(to)
        header = encode_header(type_, corr, reply_to, fields)
        try:
            # The header by a plain send (0.5 us; send_multipart's per-part checks cost 1.3 us
            # more); then the payload frames zero-copy. ZeroMQ refuses a message at its first
            # part or takes it whole, so only the header's send can raise zmq.Again.
            if frames:
                sock.send(header, _NOBLOCK_MORE)
                sock.send_multipart(frames, flags=_NOBLOCK, copy=False)
            else:
                sock.send(header, _NOBLOCK)
        except zmq.Again:
            raise MailboxFull(f"mailbox of {to} is full ({MAILBOX_HWM} messages queued)") from None

    def request(self, to: str, body: Any, frames: Sequence[Any] = (),
                callback: Callable[[Message], Any] | None = None, timeout: float | None = 30.0) -> int:
        """Send a request (``body`` as for ``send``); ``callback(reply)`` runs on the ``_reply``
        (its body of the request's answer class, ``REPLIES``) or ``_error`` answer, or with a
        REQUEST_TIMED_OUT ``_error`` after ``timeout`` seconds. Returns the corr. If the peer's
        queue is full the callback runs at once, before this returns, with a REQUEST_TIMED_OUT
        error."""
        type_ = body.TYPE
        corr = self.expect(callback or _ignore, to, type_, timeout)
        try:
            self._transmit(to, type_, body, frames, corr, self.name)
        except MailboxFull as exc:
            self._complete(corr, Message(ERROR, corr, None, ErrorReply(exc.code, exc.message)))
        return corr

    def expect(self, callback: Callable[[Message], Any], to: str, type_: str, timeout: float | None = 30.0) -> int:
        """A request another actor sends on our behalf (a message chained to one of ours, sent
        once that one succeeded): ``callback(reply)`` as for ``request``, REQUEST_TIMED_OUT
        after ``timeout`` if it never comes. Returns the corr to chain it with;
        ``cancel_request`` forgets it if it will not be sent."""
        corr = next(self._corr)
        timer = None
        if timeout is not None:
            timer = self.call_later(timeout, lambda: self._expire(corr, to, type_, timeout))
        self._waiting[corr] = (callback, timer, REPLIES.get(type_))
        return corr

    def _expire(self, corr: int, to: str, type_: str, timeout: float) -> None:
        if corr in self._waiting:
            self._complete(corr, Message(ERROR, corr, None, ErrorReply(
                ErrorCode.REQUEST_TIMED_OUT, f"no answer from {to} to '{type_}' within {timeout:g}s")))

    def _complete(self, corr: int, reply: Message) -> None:
        callback, timer, cls = self._waiting.pop(corr, _NOT_WAITING)
        if timer is not None:
            timer.cancel()
        if callback is not None:
            if cls is not None:
                try:
                    reply = typed_reply(reply, cls)
                except MalformedMessage as exc:
                    log.error("%s: %s", self.name, exc)
                    reply = Message(ERROR, corr, None, ErrorReply(ErrorCode.UNKNOWN_SERVER_ERROR, str(exc)))
            callback(reply)

    def cancel_request(self, corr: int) -> None:
        """Forget a request: a late answer to it is ignored."""
        _, timer, _ = self._waiting.pop(corr, _NOT_WAITING)
        if timer is not None:
            timer.cancel()

    def reply(self, msg: Message, fields: Any = None, frames: Sequence[Any] = ()) -> None:
        """Answer a request with ``_reply``: ``fields`` is a body of the request's answer class
        (``actors.messages.REPLIES``). A one-way message is answered by nothing."""
        if not msg.reply_to:
            return
        self._unanswered.pop((msg.reply_to, msg.corr), None)
        self._send_answer(msg.reply_to, REPLY, msg.corr, fields, frames)

    def reply_error(self, msg: Message, code: int, message: str, detail: Any = None) -> None:
        """Answer with ``_error``; ``detail`` rides along for a requester that reads it."""
        if not msg.reply_to:
            return
        self._unanswered.pop((msg.reply_to, msg.corr), None)
        self._send_answer(msg.reply_to, ERROR, msg.corr, ErrorReply(int(code), message, detail), ())

    def reply_to(self, reply_to: str, corr: int, fields: Any = None, frames: Sequence[Any] = ()) -> None:
        """Answer a request held elsewhere (a purgatory): by its reply address and corr."""
        self._unanswered.pop((reply_to, corr), None)
        self._send_answer(reply_to, REPLY, corr, fields, frames)

    def reply_error_to(self, reply_to: str, corr: int, code: int, message: str) -> None:
        self._unanswered.pop((reply_to, corr), None)
        self._send_answer(reply_to, ERROR, corr, ErrorReply(int(code), message), ())

    def _send_answer(self, to: str, type_: str, corr: int, fields, frames) -> None:
        try:
            self._transmit(to, type_, fields, frames, corr, None)
        except MailboxFull:
            log.error("%s: could not answer %s (corr %d): its mailbox is full", self.name, to, corr)

    def answer_chained(self, msg: Message, fields: Any = None) -> Chained:
        """``msg``'s answer as a chained message for another actor to send on our behalf once
        it did its part (a log actor, once a record is stored): one hop less than that actor
        answering us and us answering. Call ``answered_elsewhere(msg)`` once it is sent, or
        answer ``msg`` as usual if it is not."""
        return Chained(msg.reply_to, REPLY, fields, msg.corr)

    def send_chained(self, chained: Chained, reply_to: str) -> None:
        """Send a message chained to one we were asked for, on ``reply_to``'s behalf (its body
        as it came, already the wire's array). Raises MailboxFull."""
        self._transmit(chained.to, chained.type, chained.fields, (), chained.corr, reply_to)

    def answered_elsewhere(self, msg: Message) -> None:
        """``msg`` was answered by another actor on our behalf: it is no longer open here."""
        self._unanswered.pop((msg.reply_to, msg.corr), None)

    def forward(self, msg: Message, to: str, body: Any = None, frames: Sequence[Any] | None = None) -> None:
        """Pass a request on as ``body`` (itself, if None): the next actor answers the original
        requester directly."""
        if msg.reply_to:
            self._unanswered.pop((msg.reply_to, msg.corr), None)
        type_, body = (msg.type, msg.fields) if body is None else (body.TYPE, body)
        self._transmit(to, type_, body, msg.frames if frames is None else frames, msg.corr, msg.reply_to)

    def call(self, to: str, body: Any, frames: Sequence[Any] = (), timeout: float = 10.0) -> Message:
        """Blocking request (``body`` as for ``send``), for ``on_start`` only (fetching the
        state an actor needs before it reports ready). Other messages arriving meanwhile are
        kept and handled once the loop runs. Raises OdradekError on an ``_error`` answer or
        timeout."""
        type_ = body.TYPE
        corr = next(self._corr)
        self._transmit(to, type_, body, frames, corr, self.name)
        return await_reply(self.mailbox, corr, timeout, f"{self.name}: no answer from {to} to '{type_}'",
                           keep=self._early.append, answer=REPLIES.get(type_))

    def hold(self, msg: Message) -> None:
        """Nothing to do: a received request stays open until answered or forwarded.
        Exists to make purgatory code read plainly."""

    # ---- timers and file descriptors -------------------------------------------------
    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        timer = Timer(self.clock() + delay, callback, None)
        heapq.heappush(self._timers, (timer.deadline, next(self._timer_seq), timer))
        return timer

    def call_every(self, interval: float, callback: Callable[[], Any]) -> Timer:
        timer = Timer(self.clock() + interval, callback, interval)
        heapq.heappush(self._timers, (timer.deadline, next(self._timer_seq), timer))
        return timer

    def watch(self, fd: int, callback: Callable[[int], Any], events: int = zmq.POLLIN) -> None:
        """Call ``callback(events)`` when the raw fd (or zmq socket) is ready."""
        key = fd if isinstance(fd, int) else fd
        self._watched[key] = callback
        self._poller.register(fd, events)

    def unwatch(self, fd: int) -> None:
        if self._watched.pop(fd, None) is not None:
            try:
                self._poller.unregister(fd)
            except KeyError:
                pass

    def post(self, callback: Callable[[], Any]) -> None:
        """Run ``callback()`` on the actor's loop, soon. The one method safe to call from
        another thread (a deque append and a byte written to the self-pipe)."""
        self._posted.append(callback)
        wake = self._post_w
        if wake is not None:
            try:
                wake.send(b"x")
            except OSError:  # pipe full: a wake-up is pending anyway; closed: stopping
                pass

    def _open_post_pipe(self) -> None:
        self._post_r, self._post_w = socket.socketpair()
        self._post_r.setblocking(False)
        self._post_w.setblocking(False)
        self.watch(self._post_r.fileno(), self._run_posted)
        if self._posted:
            self.post(_nothing)

    def _run_posted(self, _events: int) -> None:
        try:
            while self._post_r.recv(4096):  # drain first: a later post() wakes us again
                pass
        except BlockingIOError:
            pass
        for _ in range(len(self._posted)):  # only those queued now: no starving the mailbox
            self._guarded(self._posted.popleft())

    # ---- the loop ----------------------------------------------------------------------
    def _bind(self) -> None:
        path = mailbox_path(self.run_dir, self.name)
        if os.path.exists(path):  # a stale socket of a killed predecessor
            os.unlink(path)
        self.mailbox = self.ctx.socket(zmq.PULL)
        self.mailbox.setsockopt(zmq.RCVHWM, MAILBOX_HWM)
        self.mailbox.setsockopt(zmq.LINGER, 0)
        self.mailbox.bind(mailbox_address(self.run_dir, self.name))
        make_private(path)
        self._poller.register(self.mailbox, zmq.POLLIN)

    def _install_signal_wakeup(self) -> None:
        import threading
        if threading.current_thread() is not threading.main_thread():
            return  # an actor run on a thread (tests) is stopped with stop(), not signals
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        self._poller.register(self._wake_r.fileno(), zmq.POLLIN)
        for signum in self.stop_signals:
            signal.signal(signum, lambda *_: self.stop())

    def stop(self) -> None:
        """Ask the loop to finish after the current message. Safe from a signal handler
        or another thread (it only sets a flag and pokes the wake-up pipe)."""
        self._stopping = True
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass

    def run(self, ready: Callable[[], Any] | None = None) -> None:
        """Start, run until stopped, stop. The calling process becomes this actor."""
        self.ctx = zmq.Context()
        self._bind()
        self._install_signal_wakeup()
        self._open_post_pipe()
        try:
            try:
                self.on_start()
            except Exception as exc:
                if self.supervisor:  # say why, so a broker that cannot start can tell its operator
                    why = exc.message if isinstance(exc, OdradekError) else f"{type(exc).__name__}: {exc}"
                    self.send(self.supervisor, StartFailed(self.name, os.getpid(), why))
                raise
            if self.supervisor:
                self.send(self.supervisor, Ready(self.name, os.getpid(), self.ready_fields()))
                self.call_every(HEARTBEAT_INTERVAL, self._heartbeat)
            if ready:
                ready()
            self._running = True
            early, self._early = self._early, []
            for frames in early:
                self._dispatch(frames)
            self._loop()
        finally:
            self._running = False
            self._shutdown()

    def _loop(self) -> None:
        poller = self._poller
        mailbox = self.mailbox
        while not self._stopping:
            events = poller.poll(self._poll_timeout_ms())
            for sock, ev in events:
                if sock is mailbox:
                    self._drain_mailbox()
                    self._guarded(self.after_batch)
                elif self._wake_r is not None and sock == self._wake_r.fileno():
                    try:
                        self._wake_r.recv(512)
                    except BlockingIOError:
                        pass
                else:
                    cb = self._watched.get(sock)
                    if cb is not None:
                        self._guarded(cb, ev)
                if self._stopping:
                    break
            self._run_timers()

    def _poll_timeout_ms(self) -> int:
        if not self._timers:
            return 1000
        delay = self._timers[0][0] - self.clock()
        return max(0, min(1000, int(delay * 1000) + 1)) if delay > 0 else 0

    def _drain_mailbox(self) -> None:
        # A wake-up at low rates brings one message: after it, ZMQ_EVENTS says whether another
        # waits (1.3 us), so the wake-up does not end on a failed recv (pyzmq raises zmq.Again
        # for it: 4.5 us of CPU). When more wait, they are read until one recv fails: one
        # zmq.Again per batch is cheaper than a check per message (docs/ARCHITECTURE.md).
        mailbox = self.mailbox
        recv = mailbox.recv_multipart
        for n in range(MAX_BATCH):
            try:
                frames = recv(flags=_NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._dispatch(frames)
            if self._stopping or (n == 0 and not mailbox.getsockopt(_EVENTS) & POLLIN):
                return

    def _dispatch(self, frames) -> None:
        try:
            msg = decode(frames)
        except MalformedMessage as exc:
            log.error("%s: dropping a malformed message: %s", self.name, exc)
            return
        self.processed += 1
        if msg.type == REPLY or msg.type == ERROR:
            if msg.corr in self._waiting:
                self._guarded(self._complete, msg.corr, msg)
            return
        if msg.reply_to:
            self._unanswered[(msg.reply_to, msg.corr)] = msg.type
        handler = getattr(self, "on_" + msg.type, None) if not msg.type.startswith("__") else None
        try:
            if handler is None:
                self.on_message(msg)
            else:
                handler(msg)
        except OdradekError as exc:
            self.reply_error(msg, exc.code, exc.message)
        except Exception as exc:  # a bug here: answer, log, keep serving
            log.error("%s: error handling %r:\n%s", self.name, msg.type, traceback.format_exc())
            self.reply_error(msg, ErrorCode.UNKNOWN_SERVER_ERROR,
                             f"{self.name} failed on '{msg.type}': {type(exc).__name__}: {exc}")

    def _guarded(self, fn: Callable, *args) -> None:
        try:
            fn(*args)
        except Exception:
            log.error("%s: error in callback %s:\n%s", self.name, getattr(fn, "__name__", fn),
                      traceback.format_exc())

    def _run_timers(self) -> None:
        now = self.clock()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, timer = heapq.heappop(timers)
            if timer.cancelled:
                continue
            if timer.interval is not None:
                timer.deadline = max(timer.deadline + timer.interval, now)
                heapq.heappush(timers, (timer.deadline, next(self._timer_seq), timer))
            self._guarded(timer.callback)

    # ---- runtime messages ------------------------------------------------------------
    def _heartbeat(self) -> None:
        if self.supervisor:
            try:
                self.send(self.supervisor, self.heartbeat_fields())
            except MailboxFull:
                pass

    def heartbeat_fields(self) -> Heartbeat:
        return Heartbeat(self.name, os.getpid(), self.processed, len(self._unanswered), len(self._waiting),
                         self.progress, self.stats())

    def on__stop(self, msg: Message) -> None:
        self.reply(msg, Name(self.name))
        self.stop()

    def on__drain(self, msg: Message) -> None:
        """The supervisor is about to stop the tree (specs with ``drain``): finish what must
        happen while every other actor still runs, then answer. Default: nothing to do."""
        self.reply(msg, Done())

    def on__ping(self, msg: Message) -> None:
        self.reply(msg, Pong(self.name, os.getpid()))

    def on__stats(self, msg: Message) -> None:
        self.reply(msg, self.heartbeat_fields())

    def on__metrics(self, msg: Message) -> None:
        """From the metrics actor at scrape time: this actor's counters, histograms, gauges."""
        self.reply(msg, ActorMetrics(self.name, self.metrics.snapshot(), self.metric_gauges()))

    def on__members(self, msg: Message) -> None:
        """From the supervisor: the running members of a role this actor watches. Names in
        ``retired`` are leaving the pool: after re-routing, send each a ``_fence`` (our last
        message to it), then acknowledge."""
        role, members, retired = msg.fields
        self.members[role] = members
        self.on_members(role, members, retired)
        for name in retired:
            try:
                self.send(name, Fence(self.name))
            except MailboxFull:
                log.error("%s: could not fence %s: mailbox full", self.name, name)
        self.reply(msg, Name(self.name))

    def on__retire(self, msg: Message) -> None:
        """Leave a pool without failing a request: wait for a ``_fence`` from each sender
        named in ``fences`` (each sends it after its last message to us) and for our own
        open and outstanding requests to finish, then stop (``timeout`` caps the wait)."""
        self.retiring = True
        self._fences_expected = set(msg.fields.fences) - self._fences_seen
        self.reply(msg, Name(self.name))
        self.call_later(msg.fields.timeout, self.stop)
        self._leave_check = self.call_every(0.01, self._maybe_leave)

    def on__fence(self, msg: Message) -> None:
        sender = msg.fields.sender
        self._fences_seen.add(sender)
        self._fences_expected.discard(sender)

    def _maybe_leave(self) -> None:
        if self.retiring and not self._fences_expected and not self._unanswered and not self._waiting:
            self.stop()

    # ---- stop ------------------------------------------------------------------------
    def _shutdown(self) -> None:
        try:
            self.on_stop()
        except Exception:
            log.error("%s: error in on_stop:\n%s", self.name, traceback.format_exc())
        # Requests still in the mailbox, and ones we hold, get an error instead of silence.
        if self.mailbox is not None:
            while True:
                try:
                    frames = self.mailbox.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    msg = decode(frames)
                except MalformedMessage:
                    continue
                if msg.reply_to and not msg.is_reply:
                    self._unanswered[(msg.reply_to, msg.corr)] = msg.type
        # A retriable code (as if the connection had closed): a request this actor did not
        # finish (a produce, say) may be done again elsewhere; the client must not give up.
        for (reply_to, corr), type_ in list(self._unanswered.items()):
            self.reply_error_to(reply_to, corr, ErrorCode.NETWORK_EXCEPTION,
                                f"{self.name} is stopping; '{type_}' was not completed, retry")
        for corr in list(self._waiting):
            self._complete(corr, Message(ERROR, corr, None, ErrorReply(
                ErrorCode.BROKER_NOT_AVAILABLE, f"{self.name} stopped before an answer arrived")))
        path = mailbox_path(self.run_dir, self.name)
        for sock in self._peers.values():
            sock.close(linger=LINGER_MS)
        if self.mailbox is not None:
            self.mailbox.close(linger=0)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        post_r, post_w, self._post_r, self._post_w = self._post_r, self._post_w, None, None
        for sock in (post_r, post_w):
            if sock is not None:
                sock.close()
        if self._wake_r is not None:
            signal.set_wakeup_fd(-1)
            self._wake_r.close()
            self._wake_w.close()
        self.ctx.term()


def _ignore(_msg: Message) -> None:
    pass


_NOT_WAITING = (None, None, None)


def _nothing() -> None:
    pass


def await_reply(sock: zmq.Socket, corr: int, timeout: float, what: str,
                keep: Callable[[Any], Any] | None = None, answer: type | None = None) -> Message:
    """Block on ``sock`` until the answer to ``corr`` arrives (for code outside an actor's
    loop: ``Actor.call`` at start-up, ``MailboxClient``), its body of class ``answer``. Other
    messages go to ``keep`` (raw frames) or are dropped (late answers to requests that timed
    out). Raises OdradekError on an ``_error`` answer or an answer that does not fit
    ``answer``, REQUEST_TIMED_OUT after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(int(left * 1000) + 1):
            if time.monotonic() >= deadline:
                raise OdradekError(f"{what} within {timeout:g}s", ErrorCode.REQUEST_TIMED_OUT)
            continue
        frames = sock.recv_multipart(copy=False)
        try:
            msg = decode(frames)
        except MalformedMessage:
            continue
        if msg.corr == corr and msg.is_reply:
            if msg.is_error:
                raise OdradekError(msg.error_message, ErrorCode.of(msg.error_code))
            try:
                return typed_reply(msg, answer)
            except MalformedMessage as exc:
                raise OdradekError(f"{what}: {exc}", ErrorCode.UNKNOWN_SERVER_ERROR) from None
        if keep is not None:
            keep(frames)


PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def _prctl_setup(name: str) -> None:
    """Ask Linux to SIGTERM us if our parent dies (even by kill -9): the supervisor under
    ``spawn``; under the fork server that server, which leaves when the supervisor dies
    (``actors.launch``): no orphans either way; and
    name the process ``od:<actor>`` for ps -o comm, top and htop (15 bytes at most)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(f"od:{name}".encode()[:15]))
    except OSError:
        pass


def raise_fd_limit() -> None:
    """Let this process open as many files as the hard limit allows (a log actor holds
    several descriptors per partition; a processor one per connection)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):
        pass


def actor_main(spec: dict) -> None:
    """Entry point of an actor process (forked from the fork server, or spawned). ``spec`` is
    plain data: ``{"name", "cls": "module:Class", "run_dir", "args", "supervisor",
    "log_level", "rejoining"}``."""
    _prctl_setup(spec["name"])
    os.umask(PRIVATE_UMASK)
    raise_fd_limit()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the supervisor's to handle
    logging.basicConfig(level=spec.get("log_level", "INFO"), stream=sys.stderr,
                        format=f"%(asctime)s %(levelname)s [{spec['name']}] %(message)s")
    parent = os.getppid()
    cls = import_object(spec["cls"])
    actor = cls(spec["name"], spec["run_dir"], spec.get("args") or {}, spec.get("supervisor"))
    actor.rejoining = bool(spec.get("rejoining"))
    if spec.get("supervisor"):
        # Belt and braces for the parent-death signal: notice a new parent within a second,
        # and the supervisor's death at once by the pipe only it holds open (multiprocessing's
        # parent sentinel): under the fork server our parent is the server, not the supervisor.
        actor.call_every(1.0, lambda: os.getppid() != parent and actor.stop())
        supervisor = multiprocessing.parent_process()
        if supervisor is not None and supervisor.sentinel is not None:
            actor.watch(supervisor.sentinel, lambda _ev: actor.stop())
    try:
        actor.run()
    except KeyboardInterrupt:
        pass
