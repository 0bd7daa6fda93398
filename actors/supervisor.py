"""The generic supervisor: starts a tree of actors from a spec, watches and restarts them.

Process: the broker's main process (``odradek serve``), as an actor whose mailbox is also the
control endpoint. It knows no broker role: the spec (``ChildSpec``: role, class, count, start
order, watchers), assembled by odradek/broker.py, names them.
Owns: the children (their processes, states, restart counts, last heartbeat) and the
``Launcher``.
Accepts:
  status: from ``odradek status`` and the handlers; answered with the actor table
  scale {role, count}: from a handler (the dynamic ``num.io.threads``): grow or shrink a pool
  shutdown {fatal?}: from the control endpoint, or one-way from an actor that cannot go on
  _ready / _heartbeat / _start_failed: from the children (the runtime sends them)
Sends: ``_members`` to a role's watchers when its running set changes, ``_retire`` to pool
members leaving, ``_drain`` (specs with ``drain``) then ``_stop`` at shutdown.
Invariants: groups start in spec order, each once the previous reported ``_ready``
(``start_timeout``); a death is seen at once (sentinels in the poll loop) and restarted
one-for-one with backoff; more than ``max_restarts`` in ``restart_window`` stops the whole
tree (exit code 1); a child silent for ``liveness_timeout`` is killed, unless the supervisor
itself was not running meanwhile; scaling down fails no request (watchers re-route and
``_fence``); a stop leaves no process and no socket file.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import logging
import multiprocessing
import os
import signal
import stat
import time
from typing import Any, Callable

import psutil

from odradek.actors.launch import SOCKET_GLOB, Launcher
from odradek.actors.message import Message
from odradek.actors.messages import BrokerStatus, Drain, Heartbeat, Members, Pid, Retire, Scaled, Stop
from odradek.actors.names import SUPERVISOR, pool_member
from odradek.actors.runtime import Actor, actor_main
from odradek.core.protocol import ErrorCode, OdradekError

log = logging.getLogger("odradek.supervisor")

SAMPLE_INTERVAL = 1.0  # seconds between psutil samples of the children
STALL_FACTOR = 5  # samples this many intervals apart: the supervisor itself was not running
PIDFILE = "supervisor.pid"


@dataclasses.dataclass
class ChildSpec:
    """One role in the tree: ``count`` instances named ``<role>-<i>`` for a ``pool`` (always
    true of a scalable role), else a single instance named ``<role>``."""

    role: str
    cls: str  # "package.module:Class"
    count: int = 1
    args: dict = dataclasses.field(default_factory=dict)
    watchers: tuple[str, ...] = ()  # roles told about this role's membership
    scalable: bool = False
    min_count: int = 1
    max_count: int = 64
    pool: bool = False
    drain: bool = False  # asked to ``_drain`` (and answer) before anything is stopped

    def __post_init__(self) -> None:
        if self.count > 1 or self.scalable:
            self.pool = True

    def instance_name(self, i: int) -> str:
        return pool_member(self.role, i) if self.pool else self.role


@dataclasses.dataclass
class RestartPolicy:
    max_restarts: int = 5
    restart_window: float = 60.0
    backoff_initial: float = 0.1
    backoff_max: float = 5.0
    start_timeout: float = 30.0
    shutdown_timeout: float = 30.0
    liveness_timeout: float = 30.0
    memory_limit_bytes: int = 0  # 0: no limit


class Child:
    """The supervisor's record of one actor process."""

    def __init__(self, name: str, spec: ChildSpec):
        self.name = name
        self.spec = spec
        self.process: multiprocessing.process.BaseProcess | None = None
        self.state = "new"  # new, starting, running, restarting, retiring, stopping, stopped
        self.restarts = 0
        self.restart_times: collections.deque[float] = collections.deque()
        self.last_exit: int | None = None
        self.last_error = ""  # why its last start failed, as it said
        self.last_heartbeat = 0.0
        self.heartbeat: Heartbeat | None = None
        self.sample: dict = {}
        self.ready_info: dict = {}
        self.ps: psutil.Process | None = None
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


class ShutdownRequested(Exception):
    pass


class Supervisor(Actor):
    def __init__(self, run_dir: str, children: list[ChildSpec], policy: RestartPolicy | None = None,
                 on_ready: Callable[["Supervisor"], Any] | None = None, info: dict | None = None,
                 log_level: str = "INFO", start_method: str | None = None):
        super().__init__(SUPERVISOR, run_dir, {}, None)
        self.specs = children
        self.policy = policy or RestartPolicy()
        self.on_ready = on_ready
        self.info = info or {}
        self.log_level = log_level
        self.children: dict[str, Child] = {}
        # "forkserver" or "spawn"; None: $ODRADEK_ACTOR_START, else forkserver where available
        self.start_method = start_method
        self.launcher: Launcher | None = None  # made at start: a fork server is a process
        self.exit_code = 0
        self.fatal: str | None = None
        self.ready = False
        self._last_sample = 0.0  # clock of the last liveness check (set when the tree is up)
        self._scaling: dict[str, Any] = {}

    # ---- start -------------------------------------------------------------------------
    stop_signals = (signal.SIGTERM, signal.SIGINT)

    def on_start(self) -> None:
        self.launcher = Launcher([spec.cls for spec in self.specs], self.start_method, socket_dir=self.run_dir)
        self.launcher.start_server()  # before the first group: it imports the actor modules once
        log.info("actors start by %s", self.launcher.method)
        for spec in self.specs:
            names = [spec.instance_name(i) for i in range(spec.count)]
            for name in names:
                self.children[name] = Child(name, spec)
                self._spawn(self.children[name])
            self._await_ready(names, self.policy.start_timeout)
            for name in names:
                self._announce(self.children[name])
        self._last_sample = self.clock()
        self.call_every(SAMPLE_INTERVAL, self._sample)
        self.ready = True
        log.info("actor tree started: %s", ", ".join(self.children))
        if self.on_ready:
            self.on_ready(self)

    def _spawn(self, child: Child) -> None:
        spec = {"name": child.name, "cls": child.spec.cls, "run_dir": self.run_dir,
                "args": child.spec.args, "supervisor": self.name, "log_level": self.log_level,
                "rejoining": self.ready}
        proc = self._start_process(spec)
        child.process = proc
        child.state = "starting"
        child.started_at = time.time()
        child.last_heartbeat = self.clock()
        try:
            child.ps = psutil.Process(proc.pid)
            child.ps.cpu_percent(None)
        except psutil.Error:
            child.ps = None
        self.watch(proc.sentinel, lambda _ev, c=child, p=proc: self._on_exit(c, p))

    def _start_process(self, spec: dict):
        """Start one actor process. The fork server failing (it died mid-request, or a module
        it preloads kills it at import) is tried once more, with a new server if it died;
        failing again, every actor is spawned from then on."""
        for attempt in (1, 2):
            proc = self.launcher.Process(target=actor_main, args=(spec,), name=f"odradek-{spec['name']}")
            try:
                proc.start()
                return proc
            except (OSError, EOFError) as exc:
                if self.launcher.method != "forkserver":
                    raise
                why = f"{type(exc).__name__}: {exc}"
                if attempt == 1:
                    log.warning("the fork server could not start %s (%s); trying again", spec["name"], why)
                else:
                    self.launcher.fall_back_to_spawn(why)
        proc = self.launcher.Process(target=actor_main, args=(spec,), name=f"odradek-{spec['name']}")
        proc.start()
        return proc

    def _await_ready(self, names: list[str], timeout: float) -> None:
        """Block (running the mailbox) until every named child reported ready."""
        deadline = self.clock() + timeout
        # A child that died while starting is respawned ("restarting") and must still report
        # ready: it does not count as started (its restarts are bounded by the policy).
        while any(self.children[n].state in ("starting", "restarting") for n in names):
            if self._stopping:
                raise ShutdownRequested()
            if self.fatal:
                raise OdradekError(self.fatal, ErrorCode.BROKER_NOT_AVAILABLE)
            if self.clock() > deadline:
                late = [n for n in names if self.children[n].state == "starting"]
                raise OdradekError(f"actors did not report ready within {timeout:g}s: {', '.join(late)}",
                                   ErrorCode.BROKER_NOT_AVAILABLE)
            for sock, ev in self._poller.poll(100):
                if sock is self.mailbox:
                    self._drain_mailbox()
                else:
                    cb = self._watched.get(sock)
                    if cb is not None:
                        cb(ev)
            self._run_timers()

    # ---- messages from children ------------------------------------------------------
    def on__start_failed(self, msg: Message) -> None:
        failed = msg.fields
        child = self.children.get(failed.name)
        if child is not None and child.pid == failed.pid:
            child.last_error = str(failed.error or "")
            log.error("%s could not start: %s", child.name, child.last_error)

    def on__ready(self, msg: Message) -> None:
        ready = msg.fields
        child = self.children.get(ready.name)
        if child is None or child.pid != ready.pid:
            return
        child.state = "running" if child.state in ("starting", "restarting") else child.state
        child.last_heartbeat = self.clock()
        child.ready_info = ready.info
        log.info("%s ready (pid %d)", child.name, child.pid)
        if self.ready:
            self._announce(child)

    def on__heartbeat(self, msg: Message) -> None:
        beat = msg.fields
        child = self.children.get(beat.name)
        if child is not None and child.pid == beat.pid:
            child.heartbeat = beat
            child.last_heartbeat = self.clock()

    def _announce(self, child: Child) -> None:
        """Tell watchers about the role's new membership; tell a new watcher what it watches."""
        self._broadcast_members(child.spec)
        for spec in self.specs:
            if child.spec.role in spec.watchers:
                self._send_quiet(child.name, self._members_of(spec))

    def _members_of(self, spec: ChildSpec, retired: list | None = None) -> Members:
        members = [c.name for c in self.children.values() if c.spec is spec and c.state == "running"]
        return Members(spec.role, members, retired or [])

    def _broadcast_members(self, spec: ChildSpec) -> None:
        members = self._members_of(spec)
        for watcher in self._running_of(spec.watchers):
            self._send_quiet(watcher.name, members)

    def _running_of(self, roles) -> list[Child]:
        return [c for c in self.children.values() if c.spec.role in roles and c.state == "running"]

    def _send_quiet(self, to: str, body) -> None:
        try:
            self.send(to, body)
        except OdradekError as exc:
            log.warning("could not tell %s about %s: %s", to, body.TYPE, exc)

    # ---- deaths and restarts ---------------------------------------------------------
    def _on_exit(self, child: Child, proc) -> None:
        self.unwatch(proc.sentinel)
        proc.join(0.1)
        if proc is not child.process:
            return
        child.last_exit = proc.exitcode
        if child.state in ("stopping", "retiring"):
            retired = child.state == "retiring"
            child.state = "stopped"
            if retired:
                self._forget_retired(child)
            return
        was_running = child.state == "running"
        child.state = "restarting"
        if was_running:
            self._broadcast_members(child.spec)
        now = self.clock()
        child.restart_times.append(now)
        while child.restart_times and child.restart_times[0] < now - self.policy.restart_window:
            child.restart_times.popleft()
        if len(child.restart_times) > self.policy.max_restarts:
            self.fatal = (f"{child.name} died {len(child.restart_times)} times within "
                          f"{self.policy.restart_window:g}s (last exit code {proc.exitcode}"
                          f"{'; it said: ' + child.last_error if child.last_error else ''}); "
                          f"shutting the broker down")
            log.critical(self.fatal)
            self.exit_code = 1
            self.stop()
            return
        backoff = min(self.policy.backoff_max,
                      self.policy.backoff_initial * (2 ** (len(child.restart_times) - 1)))
        log.warning("%s (pid %s) exited with code %s; restarting in %.2fs", child.name, proc.pid,
                    proc.exitcode, backoff)
        self.call_later(backoff, lambda: self._restart(child))

    def _restart(self, child: Child) -> None:
        if self._stopping or child.state != "restarting":
            return
        child.restarts += 1
        self._spawn(child)
        child.state = "restarting"

    def _sample(self) -> None:
        now = self.clock()
        stalled = now - self._last_sample
        self._last_sample = now
        if stalled > max(STALL_FACTOR * SAMPLE_INTERVAL, self.policy.liveness_timeout / 2):
            # We ourselves did not run (the whole broker was SIGSTOPped, a VM froze, the machine
            # starved us): the children's silence is ours too, not proof they hang. Give each a
            # full liveness window again rather than kill every actor of the broker at once.
            log.warning("the supervisor did not run for %.1fs (stopped or starved); not judging the "
                        "actors' heartbeats from before that", stalled)
            for child in self.children.values():
                child.last_heartbeat = max(child.last_heartbeat, now)
        for child in self.children.values():
            if child.ps is None or child.state not in ("running", "starting", "restarting"):
                continue
            try:
                with child.ps.oneshot():
                    child.sample = {"rss": child.ps.memory_info().rss,
                                    "cpu": child.ps.cpu_percent(None),
                                    "fds": child.ps.num_fds()}
            except psutil.Error:
                continue
            limit = self.policy.memory_limit_bytes
            if limit and child.sample["rss"] > limit:
                log.error("%s uses %d bytes of memory (limit %d); restarting it", child.name,
                          child.sample["rss"], limit)
                self._kill(child)
            elif child.state == "running" and now - child.last_heartbeat > self.policy.liveness_timeout:
                log.error("%s sent no heartbeat for %.1fs; restarting it", child.name,
                          now - child.last_heartbeat)
                self._kill(child)

    def _kill(self, child: Child) -> None:
        try:
            os.kill(child.pid, signal.SIGKILL)
        except (ProcessLookupError, TypeError):
            pass

    # ---- control endpoint ------------------------------------------------------------
    def on_status(self, msg: Message) -> None:
        self.reply(msg, self.status())

    def status(self) -> BrokerStatus:
        rows = []
        for child in self.children.values():
            hb, sample = child.heartbeat, child.sample
            rows.append({"name": child.name, "role": child.spec.role, "pid": child.pid,
                         "state": child.state, "restarts": child.restarts,
                         "last_exit": child.last_exit,
                         "rss": sample.get("rss"), "cpu": sample.get("cpu"), "fds": sample.get("fds"),
                         "processed": hb and hb.processed, "open": hb and hb.open,
                         "backlog": hb.stats.get("backlog", 0) if hb else 0, "progress": hb.progress if hb else "",
                         "stats": hb.stats if hb else {},
                         "uptime": round(time.time() - child.started_at, 1) if child.started_at else None})
        launcher = self.launcher
        return BrokerStatus({"pid": os.getpid(), "state": "running" if self.ready else "starting",
                             "actor_start": launcher.method if launcher else None,
                             "fork_server": launcher.server_pid if launcher else None, **self.info},
                            [r for r in rows if r["state"] != "stopped"])

    def on_shutdown(self, msg: Message) -> None:
        """From the control endpoint, or one-way from an actor that cannot go on (``fatal``:
        why, e.g. a log actor whose log directory failed): then logged, and the exit code 1."""
        fatal = msg.fields.fatal
        if fatal and self.fatal is None:
            self.fatal, self.exit_code = f"{fatal}; shutting the broker down", 1
            log.critical(self.fatal)
        self.reply(msg, Pid(os.getpid()))
        self.stop()

    def on_scale(self, msg: Message) -> None:
        role, count = msg.fields
        spec = next((s for s in self.specs if s.role == role), None)
        if spec is None or not spec.scalable:
            scalable = [s.role for s in self.specs if s.scalable]
            raise OdradekError(f"role '{role}' cannot be scaled; scalable roles: {', '.join(scalable)}",
                               ErrorCode.INVALID_CONFIG)
        if not isinstance(count, int) or isinstance(count, bool) or not spec.min_count <= count <= spec.max_count:
            raise OdradekError(f"{role} count must be an integer from {spec.min_count} to {spec.max_count}, "
                               f"got {count!r}", ErrorCode.INVALID_CONFIG)
        if role in self._scaling:
            raise OdradekError(f"a change of the {role} pool is already in progress", ErrorCode.REBALANCE_IN_PROGRESS)
        current = [c for c in self.children.values() if c.spec is spec and c.state not in ("stopped", "retiring")]
        if count > len(current):
            self._scale_up(spec, count, msg)
        elif count < len(current):
            self._scale_down(spec, current, count, msg)
        else:
            self.reply(msg, Scaled(role, count))

    def _scale_up(self, spec: ChildSpec, count: int, msg: Message) -> None:
        used = {c.name for c in self.children.values()}
        new = []
        i = 0
        have = len([c for c in self.children.values() if c.spec is spec and c.state not in ("stopped", "retiring")])
        while have + len(new) < count:
            name = spec.instance_name(i)
            if name not in used:
                self.children[name] = Child(name, spec)
                self._spawn(self.children[name])
                new.append(name)
            i += 1
        spec.count = count
        self._scaling[spec.role] = {"msg": msg, "new": new}
        self.call_later(0.01, lambda: self._check_scale_up(spec))

    def _check_scale_up(self, spec: ChildSpec) -> None:
        job = self._scaling.get(spec.role)
        if job is None:
            return
        if all(self.children[n].state != "starting" for n in job["new"]):
            del self._scaling[spec.role]
            self.reply(job["msg"], Scaled(spec.role, spec.count, added=job["new"]))
        else:
            self.call_later(0.01, lambda: self._check_scale_up(spec))

    def _scale_down(self, spec: ChildSpec, current: list[Child], count: int, msg: Message) -> None:
        current.sort(key=lambda c: int(c.name.rsplit("-", 1)[-1]))
        leaving = current[count:]
        for child in leaving:
            child.state = "retiring"
        spec.count = count
        members = self._members_of(spec, retired=[c.name for c in leaving])
        watchers = self._running_of(spec.watchers)
        job = {"msg": msg, "leaving": [c.name for c in leaving], "acks": set(w.name for w in watchers)}
        self._scaling[spec.role] = job

        def retire_all() -> None:
            # The pool is switched: no watcher routes to the leaving ones any more. They
            # finish what they hold and exit on their own; the change is answered now.
            fences = [w.name for w in watchers]
            for child in leaving:
                self._send_quiet(child.name, Retire(fences, 10.0))
            del self._scaling[spec.role]
            self.reply(msg, Scaled(spec.role, count, removed=job["leaving"]))

        if not watchers:
            retire_all()
        for watcher in watchers:
            def acked(reply: Message, w=watcher.name) -> None:
                job["acks"].discard(w)
                if not job["acks"]:
                    retire_all()
            self.request(watcher.name, members, callback=acked, timeout=10.0)

    def _forget_retired(self, child: Child) -> None:
        if self.children.get(child.name) is child:
            del self.children[child.name]

    # ---- stop --------------------------------------------------------------------------
    def on_stop(self) -> None:
        deadline = time.monotonic() + self.policy.shutdown_timeout
        for child in [c for c in self.children.values() if c.spec.drain and c.alive()]:
            # a drain phase while the whole tree still runs (a cluster broker hands its
            # partitions' leadership away); up to half the shutdown time
            try:
                self.call(child.name, Drain(), timeout=max(0.1, self.policy.shutdown_timeout / 2))
            except OdradekError as exc:
                log.warning("%s did not drain: %s", child.name, exc.message)
        for spec in reversed(self.specs):
            group = [c for c in self.children.values() if c.spec is spec and c.alive()]
            for child in group:
                child.state = "stopping"
                self._send_quiet(child.name, Stop())
            for child in group:
                left = max(0.0, deadline - time.monotonic())
                child.process.join(left)
                if child.process.is_alive():
                    log.error("%s did not stop in time; killing it", child.name)
                    child.process.kill()
                    child.process.join(1.0)
                child.state = "stopped"
        for child in self.children.values():  # restarting ones never got spawned again
            if child.process is not None and child.process.is_alive():
                child.process.kill()
                child.process.join(1.0)
        if self.launcher is not None:
            self.launcher.close()
        clear_run_dir(self.run_dir, keep_pidfile=False)
        log.info("actor tree stopped")


def prepare_run_dir(run_dir: str) -> None:
    """Claim the run directory for this supervisor: make sure it is private
    (``claim_private_dir``), refuse if a live supervisor holds it, else clear what a killed
    one left (socket files, pid file)."""
    claim_private_dir(run_dir)
    pidfile = os.path.join(run_dir, PIDFILE)
    try:
        with open(pidfile) as f:
            pid = int(f.read().strip() or 0)
    except (FileNotFoundError, ValueError):
        pid = 0
    if pid and pid != os.getpid() and psutil.pid_exists(pid):
        try:
            alive = psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            alive = False
        if alive:
            raise OdradekError(f"another broker (pid {pid}) is running with run directory {run_dir}; "
                               f"stop it first or use another log.dirs", ErrorCode.BROKER_NOT_AVAILABLE)
    clear_run_dir(run_dir, keep_pidfile=False)
    tmp = pidfile + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600), "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, pidfile)


def claim_private_dir(path: str) -> None:
    """Create ``path`` with mode 0700, or accept an existing one only if it is a real
    directory (not a symlink) owned by this user that nobody else can write to; one that is
    merely readable by others is narrowed to 0700 (nothing can have been planted in it).
    Anything else is refused: whoever owns or can write it could replace our sockets and
    intercept the broker's messages (a name in the shared /tmp can be taken first)."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # mkdir's mode was narrowed by the umask, maybe below 0700
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    fix = "remove it, or set run.dir to a directory of your own"
    if not stat.S_ISDIR(st.st_mode):
        raise OdradekError(f"run directory {path} exists and is not a directory (a symlink or file "
                           f"someone may have planted); {fix}", ErrorCode.BROKER_NOT_AVAILABLE)
    if st.st_uid != os.geteuid():
        raise OdradekError(f"run directory {path} belongs to uid {st.st_uid}, not to this broker's user "
                           f"(uid {os.geteuid()}): its owner could intercept the broker's sockets; {fix}",
                           ErrorCode.BROKER_NOT_AVAILABLE)
    if st.st_mode & 0o022:
        raise OdradekError(f"run directory {path} has mode {stat.S_IMODE(st.st_mode):04o}: others may write "
                           f"to it and replace the broker's sockets; it must be 0700 ({fix}, or chmod 700 it)",
                           ErrorCode.BROKER_NOT_AVAILABLE)
    if stat.S_IMODE(st.st_mode) != 0o700:
        log.warning("run directory %s had mode %04o; narrowing it to 0700", path, stat.S_IMODE(st.st_mode))
        os.chmod(path, 0o700)


def clear_run_dir(run_dir: str, keep_pidfile: bool = True) -> None:
    for path in (glob.glob(os.path.join(run_dir, "*.mbox")) + glob.glob(os.path.join(run_dir, "*.sock"))
                 + glob.glob(os.path.join(run_dir, SOCKET_GLOB))):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if not keep_pidfile:
        try:
            os.unlink(os.path.join(run_dir, PIDFILE))
        except FileNotFoundError:
            pass


def run_supervisor(sup: Supervisor) -> int:
    """Run the tree in this process until it stops; returns the process exit code."""
    prepare_run_dir(sup.run_dir)
    try:
        sup.run()
    except ShutdownRequested:
        pass
    except OdradekError as exc:
        log.critical("start-up failed: %s", exc.message)
        sup.exit_code = 1
    return sup.exit_code
