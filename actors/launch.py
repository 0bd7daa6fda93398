"""How the supervisor starts actor processes: forked from a preloaded fork server, or spawned.

Runs in the supervisor's process (``Launcher``) and, for ``ActorProcess.run``, in each actor
process before the actor's code. Owns the start method and, with ``forkserver``, the one fork
server of the supervisor's process (multiprocessing's singleton), which imports the actor
classes' modules once (``preload_modules``); every actor is then a ``fork()`` of it.
``spawn`` (``ODRADEK_ACTOR_START=spawn``, or where forkserver or pidfds are missing) starts
each actor as a fresh interpreter.
Invariants (supervisor -> fork server F -> actors):
  * kill -9 of the supervisor leaves no actor: F's "alive" pipe has the supervisor as its only
    writer (``ActorProcess.run`` closes each child's copy), F exits on EOF, every actor gets its
    parent-death SIGTERM (``runtime._prctl_setup``) and also watches the supervisor's sentinel.
  * kill -9 of F: every actor stops and is restarted as after any death; ``ensure_running``
    starts a new server on the next start.
  * the supervisor watches each actor by a pidfd (the exit code still comes from F: 255 when F
    died first); ``Launcher.close`` ends the server: a graceful stop leaves nothing.
A preloaded module must not, at import, start a thread, open a socket or a ZeroMQ context,
configure logging, seed a private ``random.Random`` or cache ``os.getpid()``: every actor
inherits it at fork (and shares the server's hash seed).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from multiprocessing import connection, context as mp_context, forkserver, popen_forkserver, util
from typing import Any, Iterable

log = logging.getLogger("odradek.launch")

METHODS = ("forkserver", "spawn")
METHOD_ENV = "ODRADEK_ACTOR_START"  # forkserver | spawn; unset: forkserver where available
SOCKET_GLOB = "listener-*"  # the fork server's socket file, in ``socket_dir``
UNKNOWN_EXIT = 255  # an actor's exit code when the fork server died before telling it
STATUS_WAIT = 1.0  # seconds to wait for the fork server to report an exit code it owes
SERVER_STOP_WAIT = 5.0  # seconds the fork server gets to leave after its pipe closes


def forkserver_available() -> bool:
    """The fork server needs passing descriptors over a Unix socket and pidfds (Linux 5.3)."""
    if "forkserver" not in multiprocessing.get_all_start_methods() or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def default_method() -> str:
    """``$ODRADEK_ACTOR_START`` if set (an unknown value is logged and ignored), else
    forkserver where available, else spawn."""
    method = os.environ.get(METHOD_ENV, "").strip()
    if method and method not in METHODS:
        log.warning("%s=%r is not one of %s; ignoring it", METHOD_ENV, method, ", ".join(METHODS))
    if method == "spawn" or not forkserver_available():
        return "spawn"
    return "forkserver"


def preload_modules(class_paths: Iterable[str]) -> list[str]:
    """The modules a fork server imports before forking: those of the actor classes
    (``"package.module:Class"``) and the runtime's own."""
    return sorted({path.partition(":")[0] for path in class_paths} | {__name__, "odradek.actors.runtime"})


class _PidfdPopen(popen_forkserver.Popen):
    """The fork server's Popen with a pidfd for a sentinel: readable when the actor itself
    has exited, whoever its parent is by then (see the module's kill paths)."""

    pidfd: int | None = None

    def _launch(self, process_obj) -> None:
        super()._launch(process_obj)
        self.status_fd = self.sentinel  # the server writes the pid, later the exit code
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except OSError:  # already exited and reaped: the status pipe says how
            return
        self.sentinel = self.pidfd
        util.Finalize(self, os.close, (self.pidfd,))

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if self.returncode is not None or self.pidfd is None:
            return super().poll(flag)
        if not connection.wait([self.pidfd], 0 if flag == os.WNOHANG else None):
            return None
        if not connection.wait([self.status_fd], STATUS_WAIT):
            self.returncode = UNKNOWN_EXIT  # the server is alive but does not answer (stopped)
            return self.returncode
        try:
            self.returncode = forkserver.read_signed(self.status_fd)
        except (OSError, EOFError):  # the fork server died first
            self.returncode = UNKNOWN_EXIT
        return self.returncode

    def _send_signal(self, sig: int) -> None:
        if self.returncode is None and self.pidfd is not None:
            try:  # by pidfd: an orphan's pid may be reaped and reused by then
                signal.pidfd_send_signal(self.pidfd, sig)
            except ProcessLookupError:
                pass
            return
        super()._send_signal(sig)


class ActorProcess(mp_context.ForkServerProcess):
    """multiprocessing's Process, started by the fork server, watched by pidfd."""

    @staticmethod
    def _Popen(process_obj):
        return _PidfdPopen(process_obj)

    def run(self) -> None:
        leave_fork_server()
        super().run()


class _ForkServerContext(mp_context.ForkServerContext):
    Process = ActorProcess


def leave_fork_server() -> None:
    """In a child of the fork server: close our copy of the server's "alive" pipe, so that
    the supervisor holds the only one and its death ends the server (and, by the parent-
    death signal, us). A no-op anywhere else (the supervisor's own copy is never touched:
    only a fork server's child has inherited descriptors and no server pid)."""
    server = forkserver._forkserver  # multiprocessing's private singleton: no public API
    if server._inherited_fds is None or server._forkserver_pid is not None:
        return
    fd, server._forkserver_alive_fd = server._forkserver_alive_fd, None
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


class Launcher:
    """Starts actor processes by one method: ``Process(target=, args=, name=)`` is
    multiprocessing's API (``start``, ``pid``, ``sentinel``, ``exitcode``, ``kill``, ``join``)."""

    _lock = threading.Lock()
    _users = 0  # launchers in this process on the shared fork server

    def __init__(self, class_paths: Iterable[str], method: str | None = None, socket_dir: str | None = None):
        self.method = method or default_method()
        self.socket_dir = socket_dir  # where the fork server's socket goes (default: a /tmp/pymp-* dir)
        if self.method not in METHODS:
            raise ValueError(f"actor start method {self.method!r}: expected one of {', '.join(METHODS)}")
        self.preload = preload_modules(class_paths)
        self._ctx: Any = None
        self._using = False
        self._use(self.method)

    def _use(self, method: str) -> None:
        self.method = method
        if method == "forkserver":
            self._ctx = _ForkServerContext()
            self._ctx.set_forkserver_preload(self.preload)
            with Launcher._lock:
                Launcher._users += 1
            self._using = True
        else:
            self._ctx = multiprocessing.get_context("spawn")

    def Process(self, **kwargs):  # noqa: N802 - multiprocessing's name
        return self._ctx.Process(**kwargs)

    def start_server(self) -> None:
        """Start the fork server now (it imports while the caller goes on), if not running."""
        if self.method == "forkserver":
            if self.socket_dir:
                # multiprocessing puts the server's socket in its per-process temp dir, a
                # /tmp/pymp-* left behind by every kill -9; the supervisor's private run
                # directory is cleared at the next start instead (``SOCKET_GLOB``).
                multiprocessing.current_process()._config["tempdir"] = self.socket_dir
            forkserver.ensure_running()

    def fall_back_to_spawn(self, why: str) -> None:
        """The fork server failed (a preloaded module that raises at import kills it): spawn
        every actor from now on."""
        log.error("the fork server could not start an actor (%s); spawning actors from now on", why)
        self.close()
        self._use("spawn")

    @property
    def server_pid(self) -> int | None:
        if self.method != "forkserver":
            return None
        return forkserver._forkserver._forkserver_pid

    def close(self) -> None:
        """Stop using the fork server; the last launcher of the process stops it."""
        if not self._using:
            return
        self._using = False
        with Launcher._lock:
            Launcher._users -= 1
            if Launcher._users == 0:
                stop_fork_server()


def stop_fork_server() -> None:
    """Close the supervisor's end of the alive pipe (the server then leaves on its own),
    wait for the server's pid, SIGKILL it if it lingers, remove its socket file."""
    server = forkserver._forkserver
    with server._lock:
        pid, fd, address = server._forkserver_pid, server._forkserver_alive_fd, server._forkserver_address
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None
    if fd is not None:
        os.close(fd)
    if pid is not None:
        deadline = time.monotonic() + SERVER_STOP_WAIT
        while True:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            if time.monotonic() > deadline:
                log.warning("the fork server (pid %d) did not leave; killing it", pid)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                break
            time.sleep(0.01)
    if address and not util.is_abstract_socket_namespace(address):
        try:
            os.unlink(address)
        except OSError:
            pass
