"""A broker in a child process on this machine: start it, learn its address, stop or kill it.

``LocalBroker`` runs ``python -m odradek serve`` with ``--set`` settings (listening on
127.0.0.1, port 0 unless told otherwise), waits for its ``odradek ready on HOST:PORT`` line,
and always leaves nothing behind: ``stop()`` sends SIGTERM and, if the broker does not exit,
SIGKILLs its whole process group and every actor it had. ``kill()`` simulates a crash
(SIGKILL of the supervisor, its fork server and every actor: ``children()`` lists them all). The same object can be started again on
the same data directory. Used by the tests' fixtures and the benchmarks; the thread that
reads the broker's stdout is the only thread it starts.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Callable
import time

import psutil

READY = re.compile(r"odradek ready on (\S+):(\d+) \(broker (\d+)\)")
CONSOLE = re.compile(r"odradek console on (\S+) ")
SCHEMA_REGISTRY = re.compile(r"odradek schema registry on (http://\S+)")
HTTP_PROXY = re.compile(r"odradek http proxy on (http://\S+)")


def _private_opener(path: str, flags: int) -> int:
    """The broker's output files: its user's alone whatever the umask (they carry its audit lines)."""
    return os.open(path, flags, 0o600)


class LocalBroker:
    def __init__(self, data_dir: str, settings: dict | None = None, start_timeout: float = 60.0,
                 detached: bool = False, env: dict | None = None):
        self.data_dir = data_dir
        self.env = dict(env or {})  # added to the broker's environment (e.g. LD_PRELOAD)
        # detached: stdout goes to <data_dir>/broker.stdout instead of a pipe, so the broker
        # outlives this process (``odradek cluster up``); readiness is read from that file.
        self.detached = detached
        self.stdout_path = os.path.join(data_dir, "broker.stdout")
        self.settings = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": data_dir, **(settings or {})}
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.host = self.port = None
        self.stdout_lines: list[str] = []
        self.stderr_path = os.path.join(data_dir, "broker.stderr")
        self.exit_code: int | None = None
        self.paused: list[psutil.Process] = []
        self.started_s: float | None = None  # seconds the last start took
        self._stderr = None

    @property
    def set_args(self) -> list[str]:
        out = []
        for k, v in self.settings.items():
            out += ["--set", f"{k}={v}"]
        return out

    def start(self) -> "LocalBroker":
        """Start and wait for the ready line (``start_timeout``); raises RuntimeError with the
        tail of the broker's stderr if it exits or stays silent."""
        os.makedirs(self.data_dir, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self._stderr = open(self.stderr_path, "ab", opener=_private_opener)
        began = time.perf_counter()
        self.host = self.port = None
        self.paused = []
        ready = threading.Event()
        cmd = [sys.executable, "-m", "odradek", "serve", *self.set_args]
        if self.detached:
            with open(self.stdout_path, "ab", opener=_private_opener) as out:
                seen = out.tell()
                self.proc = subprocess.Popen(cmd, stdout=out, stderr=self._stderr, stdin=subprocess.DEVNULL,
                                             cwd=self.data_dir, env=env, start_new_session=True)
            while not ready.is_set() and not self._ready_in_file(seen):
                if self.proc.poll() is not None or time.perf_counter() - began > self.start_timeout:
                    self.stop()
                    raise RuntimeError(f"broker did not start (exit {self.proc.returncode}):\n{self.stderr_tail()}")
                time.sleep(0.05)
            self.started_s = time.perf_counter() - began
            return self
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr, cwd=self.data_dir,
                                     env=env, start_new_session=True, text=True)
        proc = self.proc

        def pump() -> None:
            for line in proc.stdout:
                self.stdout_lines.append(line)
                m = READY.search(line)
                if m:
                    self.host, self.port = m.group(1), int(m.group(2))
                    ready.set()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + self.start_timeout
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"broker did not start (exit {self.proc.returncode}):\n{self.stderr_tail()}")
        self.started_s = time.perf_counter() - began
        return self

    def _ready_in_file(self, offset: int) -> bool:
        with open(self.stdout_path, errors="replace") as f:
            f.seek(offset)
            for line in f:
                m = READY.search(line)
                if m:
                    self.host, self.port = m.group(1), int(m.group(2))
                    return True
        return False

    @property
    def console_url(self) -> str | None:
        """The admin listener's base URL (metrics, health, console), as the broker printed
        it before its ready line; None if ``admin.listener`` is off."""
        return self._printed(CONSOLE)

    @property
    def schema_registry_url(self) -> str | None:
        """The schema registry's base URL, as the broker printed it before its ready line;
        None if ``schema.registry.listener`` is off."""
        return self._printed(SCHEMA_REGISTRY)

    @property
    def http_proxy_url(self) -> str | None:
        """The HTTP proxy's base URL, as the broker printed it before its ready line; None if
        ``http.proxy.listener`` is off."""
        return self._printed(HTTP_PROXY)

    def _printed(self, pattern: re.Pattern) -> str | None:
        if self.detached:
            with open(self.stdout_path, errors="replace") as f:
                lines = f.readlines()
        else:
            lines = list(self.stdout_lines)
        for line in reversed(lines):
            m = pattern.search(line)
            if m:
                return m.group(1)
        return None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def run_dir(self) -> str:
        from odradek import config as cfg
        return cfg.run_dir(cfg.load(None, [f"{k}={v}" for k, v in self.settings.items()]))

    def status(self, timeout: float = 5.0) -> dict:
        """The supervisor's status (``odradek status --json``)."""
        from odradek.actors.client import MailboxClient
        from odradek.actors.messages import Status
        from odradek.actors.names import SUPERVISOR
        with MailboxClient(self.run_dir) as client:
            return client.request(SUPERVISOR, Status(), timeout=timeout).fields._asdict()

    def actor(self, name: str) -> dict:
        return next(a for a in self.status()["actors"] if a["name"] == name)

    def children(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stderr_tail(self, n: int = 40) -> str:
        try:
            with open(self.stderr_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except FileNotFoundError:
            return ""

    def terminate(self, timeout: float = 20.0) -> int | None:
        """SIGTERM and wait: the graceful path. The exit code, or None if still running."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.exit_code = None
        return self.exit_code

    def kill(self) -> None:
        """A crash: SIGKILL the supervisor and every actor it had, and wait for them."""
        if self.proc is None or self.proc.poll() is not None:
            return
        kids = self.children()
        # Freeze everyone first: an actor that saw its supervisor die first would get its
        # parent-death SIGTERM and stop cleanly (closing its ZooKeeper session, say), which
        # is not a crash.
        for p in [psutil.Process(self.pid), *kids]:
            try:
                p.suspend()
            except psutil.NoSuchProcess:
                pass
        for kid in kids:
            try:
                kid.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.kill()
        self.proc.wait(30)
        psutil.wait_procs(kids, timeout=30)
        self.paused = []
        self._close_pipes()

    def discard(self) -> None:
        """Teardown when the data is thrown away: SIGKILL of the broker's whole process group
        at once (the supervisor and every actor die together, paused or not), then ``stop()``
        for anything that had left the group. A second or two instead of the seconds a
        graceful stop takes; nothing is left running."""
        if self.proc is not None and self.proc.poll() is None:
            kids = self.children()
            _kill_group(self.proc.pid, kids)
            self.proc.wait(30)
            psutil.wait_procs(kids, timeout=30)
            self.paused = []
        self.stop()

    def pause(self) -> None:
        """SIGSTOP the supervisor, then every actor: the whole broker freezes (a long GC pause,
        a hung VM). Its sockets stay open; ZooKeeper sees its session go silent."""
        if not self.running or self.paused:
            return
        procs = [psutil.Process(self.pid)] + self.children()
        for p in procs:  # the supervisor first, so it does not react to stopped actors
            try:
                p.send_signal(signal.SIGSTOP)
            except psutil.NoSuchProcess:
                pass
        self.paused = procs
        deadline = time.monotonic() + 5
        for p in procs:  # signals are asynchronous: return once every process has stopped
            while time.monotonic() < deadline:
                try:
                    if p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                        break
                except psutil.NoSuchProcess:
                    break
                time.sleep(0.01)

    def resume(self) -> None:
        """SIGCONT what ``pause`` stopped: the actors first, then the supervisor."""
        for p in reversed(self.paused):
            try:
                p.send_signal(signal.SIGCONT)
            except psutil.NoSuchProcess:
                pass
        self.paused = []

    def actor_process(self, name: str) -> psutil.Process:
        """The process of one actor (``replica_fetcher``, ``log-0``, ...), from the supervisor's status."""
        pid = self.actor(name)["pid"]
        if not pid:
            raise RuntimeError(f"actor {name} has no process")
        return psutil.Process(pid)

    def stop(self, timeout: float = 20.0) -> None:
        """Whatever state it is in, leave no process behind."""
        if self.proc is None:
            return
        self.resume()  # a stopped process cannot act on SIGTERM
        kids = self.children()
        if self.proc.poll() is None:
            self.terminate(timeout)
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(5)
        for kid in kids:
            try:
                kid.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(kids, timeout=5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout and not self.detached:
            self.proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


# ---- ZooKeeper and a cluster of brokers --------------------------------------------------------
# Debian's `zookeeper` package (bin/_env.sh installs it for bin/test and `odradek cluster`).
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
ZOOKEEPER_CLASSPATH = "/etc/zookeeper/conf:" + ZOOKEEPER_JAR


def zookeeper_missing() -> str | None:
    """Why a local ZooKeeper cannot start here (None when it can)."""
    if not os.environ.get("ODRADEK_ZOOKEEPER_CLASSPATH") and not os.path.exists(ZOOKEEPER_JAR):
        return (f"ZooKeeper is not installed ({ZOOKEEPER_JAR} is missing): `apt-get install zookeeper` "
                f"(bin/test and `bin/odradek cluster` install it), or set ODRADEK_ZOOKEEPER_CLASSPATH")
    if not shutil.which(os.environ.get("JAVA", "java")):
        return "no Java runtime for ZooKeeper: `apt-get install default-jre-headless`"
    return None


def free_port() -> int:
    """A port nobody listens on at this moment (bind port 0, release it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def four_letter(port: int, word: str, timeout: float = 1.0) -> str | None:
    """ZooKeeper's four-letter command (``ruok``, ``srvr``): its answer, None if no answer."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None


def _listens_on(pid: int, port: int) -> bool:
    try:
        p = psutil.Process(pid)
        conns = p.net_connections("tcp") if hasattr(p, "net_connections") else p.connections("tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns)


def _kill_group(pid: int, procs) -> None:
    """SIGKILL process group ``pid`` (a process we started in its own session: group id ==
    pid) and each of ``procs`` (those that may have left the group)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def stop_pid(pid: int, create_time: float | None = None, timeout: float = 20.0, tree: bool = True) -> bool:
    """SIGTERM a process we started (checked by ``create_time`` against pid reuse), then SIGKILL
    it, its process group and, with ``tree``, every descendant still there after ``timeout``.
    True if something was running."""
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1.0:
            return False  # the pid now belongs to someone else
        kids = proc.children(recursive=True) if tree else []
        if proc.status() == psutil.STATUS_STOPPED:
            proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
    except psutil.NoSuchProcess:
        return False
    gone, alive = psutil.wait_procs([proc], timeout=timeout)
    if alive:
        _kill_group(pid, alive)
    leftovers = [k for k in kids if k.is_running()]
    if leftovers:
        psutil.wait_procs(leftovers, timeout=5)
        for k in leftovers:
            try:
                k.kill()
            except psutil.NoSuchProcess:
                pass
    psutil.wait_procs([proc] + leftovers, timeout=10)
    return True


# kazoo warns on every dropped connection; ours drop when a test stops ZooKeeper on purpose.
_KAZOO_LOG = logging.getLogger("odradek.local.kazoo")
_KAZOO_LOG.addHandler(logging.NullHandler())


class LocalZooKeeper:
    """A standalone ZooKeeper server (Java, Debian's package) on 127.0.0.1 in its own session.

    ``port=0`` picks a free port (bind 0, release, retry when the server cannot bind it).
    Its config, snapshots and log live under ``data_dir``; ``stop()`` is SIGTERM then SIGKILL,
    ``kill()`` a crash. ``connect`` is the ``zookeeper.connect`` string."""

    def __init__(self, data_dir: str, port: int = 0, start_timeout: float = 30.0, tick_ms: int = 500,
                 settings: dict | None = None):
        self.data_dir = os.path.abspath(data_dir)
        self.requested_port = port
        self.port: int | None = None
        self.start_timeout = start_timeout
        self.settings = {"tickTime": tick_ms, "minSessionTimeout": 2 * tick_ms, "maxSessionTimeout": 60000,
                         **(settings or {})}
        self.proc: subprocess.Popen | None = None
        self.cfg_path = os.path.join(self.data_dir, "zoo.cfg")
        self.log_path = os.path.join(self.data_dir, "zookeeper.log")

    @property
    def connect(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _write_config(self, port: int) -> None:
        lines = {"dataDir": os.path.join(self.data_dir, "data"), "clientPort": port,
                 "clientPortAddress": "127.0.0.1", "admin.enableServer": "false",
                 "4lw.commands.whitelist": "srvr,ruok", **self.settings}
        with open(self.cfg_path, "w") as f:
            f.writelines(f"{k}={v}\n" for k, v in lines.items())

    def start(self) -> "LocalZooKeeper":
        """Start and wait until it answers ``ruok`` on its port; RuntimeError (with its log) if not."""
        missing = zookeeper_missing()
        if missing:
            raise RuntimeError(missing)
        os.makedirs(os.path.join(self.data_dir, "data"), exist_ok=True)
        classpath = os.environ.get("ODRADEK_ZOOKEEPER_CLASSPATH") or ZOOKEEPER_CLASSPATH
        java = shutil.which(os.environ.get("JAVA", "java"))
        attempts = 1 if self.requested_port else 5
        for _ in range(attempts):
            self.port = self.requested_port or free_port()
            self._write_config(self.port)
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(
                    [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:-UsePerfData", "-Dzookeeper.jmx.log4j.disable=true",
                     "-cp", classpath, "org.apache.zookeeper.server.ZooKeeperServerMain", self.cfg_path],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.data_dir,
                    start_new_session=True)
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                # imok from our own process: another server on a recycled port must not count
                if four_letter(self.port, "ruok", 0.5) == "imok" and _listens_on(self.proc.pid, self.port):
                    return self
                time.sleep(0.05)
            exited = self.proc.poll() is not None
            self.stop()
            if not exited:
                break  # silent, not a port collision: do not retry
        raise RuntimeError(f"ZooKeeper did not start on 127.0.0.1:{self.port}; its log {self.log_path}:\n"
                           f"{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def kill(self) -> None:
        if self.running:
            self.proc.kill()
            self.proc.wait(10)

    def client(self, chroot: str = "", timeout: float = 10.0):
        """A started ``kazoo`` client (the caller stops and closes it)."""
        from kazoo.client import KazooClient
        zk = KazooClient(hosts=self.connect + chroot, timeout=timeout, logger=_KAZOO_LOG)
        zk.start(timeout=timeout)
        return zk


class LocalCluster:
    """A ZooKeeper (its own, or a shared one under a separate chroot) and ``brokers`` brokers
    with ids 1..N, each with its own data directory ``<base_dir>/broker-<id>`` and port.

    ``kill(id)`` crashes a broker (SIGKILL of its tree), ``restart(id)`` starts it again on its
    data and (when still free) its port, ``pause(id)`` / ``resume(id)`` freeze and thaw it;
    ``controller_id()``, ``partition_state()``, ... read ZooKeeper (docs/REPLICATION.md)."""

    def __init__(self, base_dir: str, brokers: int = 3, settings: dict | None = None,
                 zk: LocalZooKeeper | None = None, chroot: str = "/odradek", start_timeout: float = 60.0,
                 detached: bool = False, first_port: int = 0, broker_settings=None, broker_env=None,
                 client_security: dict | None = None):
        self.base_dir = os.path.abspath(base_dir)
        # how ``metadata`` (and so ``wait_ready``) signs in on the brokers' first listener:
        # kafka-python's option names (network/clientauth.py), for clusters with no PLAINTEXT one
        self.client_security = dict(client_security or {})
        # per broker id: extra settings (``{id: {...}}``: broker.rack, or advertised.listeners and
        # zookeeper.connect through a fault proxy) and environment, applied at creation
        self.broker_settings = dict(broker_settings or {})
        self.broker_env = dict(broker_env or {})
        self.count = brokers
        self.settings = dict(settings or {})
        self.zk = zk
        self.own_zk = zk is None
        self.chroot = "/" + chroot.strip("/") if chroot.strip("/") else ""
        self.start_timeout = start_timeout
        self.detached = detached
        self.first_port = first_port  # broker i listens on first_port + i - 1 (0: any free port)
        self.brokers: dict[int, LocalBroker] = {}
        self._kazoo = None
        self.report: Callable[[str], Any] | None = None  # told each step of start (``cluster up``)

    @property
    def ids(self) -> list[int]:
        return sorted(self.brokers)

    @property
    def zookeeper_connect(self) -> str:
        return self.zk.connect + self.chroot

    def broker(self, broker_id: int) -> LocalBroker:
        return self.brokers[broker_id]

    @property
    def bootstrap(self) -> str:
        """``host:port`` of every running broker, comma-separated."""
        return ",".join(b.bootstrap for _, b in sorted(self.brokers.items()) if b.running and b.port)

    def start(self) -> "LocalCluster":
        """ZooKeeper (unless given), the chroot, then every broker (in parallel). On failure
        everything started is stopped and the error raised."""
        try:
            if self.zk is None:
                self.zk = LocalZooKeeper(os.path.join(self.base_dir, "zookeeper")).start()
            elif not self.zk.running:
                self.zk.start()
            self._tell(f"zookeeper up on {self.zk.connect}")
            if self.chroot:
                root = self.zk.client()
                try:
                    root.ensure_path(self.chroot)
                finally:
                    root.stop()
                    root.close()
            for i in range(1, self.count + 1):
                self.brokers[i] = self._new_broker(i)
            self._tell(f"starting {self.count} brokers")
            self._parallel(self._start_broker, self.brokers.items())
        except BaseException:
            self.stop()
            raise
        return self

    def _tell(self, text: str) -> None:
        if self.report is not None:
            self.report(text)

    def _start_broker(self, item: tuple[int, LocalBroker]) -> None:
        broker_id, b = item
        b.start()
        console = f", console {b.console_url}" if b.console_url else ""
        self._tell(f"broker {broker_id} up on {b.bootstrap} in {b.started_s:.1f}s{console}")

    def _new_broker(self, i: int, settings: dict | None = None) -> LocalBroker:
        settings = {"broker.id": i, "zookeeper.connect": self.zookeeper_connect, **self.settings,
                    **self.broker_settings.get(i, {}), **(settings or {})}
        if self.first_port:
            settings["listeners"] = f"PLAINTEXT://127.0.0.1:{self.first_port + i - 1}"
        return LocalBroker(os.path.join(self.base_dir, f"broker-{i}"), settings, self.start_timeout,
                           detached=self.detached, env=self.broker_env.get(i))

    def add(self, settings: dict | None = None) -> int:
        """Start one more broker (the next id, its own data directory) in the running cluster
        and wait until every broker knows it; its id. It holds no partitions until a
        reassignment (``odradek reassign``) or a new topic gives it some."""
        i = max(self.brokers, default=0) + 1
        self.brokers[i] = self._new_broker(i, settings)
        self.count = len(self.brokers)
        self._start_broker((i, self.brokers[i]))
        self.wait_ready(self.start_timeout)
        return i

    @staticmethod
    def _parallel(fn, items) -> None:
        errors: list[BaseException] = []

        def run(item) -> None:
            try:
                fn(item)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(i,)) for i in items]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def stop(self, graceful: bool = True) -> None:
        """Every broker (SIGTERM, or with ``graceful=False`` SIGKILL at once), then our
        ZooKeeper: nothing is left running, whatever the state."""
        self.close_kazoo()
        try:
            self._parallel(lambda b: b.stop() if graceful else b.discard(), list(self.brokers.values()))
        finally:
            if self.own_zk and self.zk is not None:
                self.zk.stop()

    def close_kazoo(self) -> None:
        """Close the ZooKeeper client of the readers below (the next read opens another)."""
        if self._kazoo is not None:
            try:
                self._kazoo.stop()
                self._kazoo.close()
            except Exception:  # noqa: BLE001 - teardown
                pass
            self._kazoo = None

    def kill(self, broker_id: int) -> None:
        """kill -9 of the broker: its supervisor and every actor."""
        self.brokers[broker_id].kill()

    def restart(self, broker_id: int) -> LocalBroker:
        """Stop the broker if it runs (SIGTERM), start it again on its data directory, on its
        previous port when that is free (a new one otherwise)."""
        b = self.brokers[broker_id]
        b.stop()
        port = b.port
        if port:
            b.settings["listeners"] = f"PLAINTEXT://127.0.0.1:{port}"
            try:
                return b.start()
            except RuntimeError:
                if free_port_is(port):
                    raise
        b.settings["listeners"] = "PLAINTEXT://127.0.0.1:0"
        return b.start()

    def pause(self, broker_id: int) -> None:
        """SIGSTOP the broker's supervisor and all its actors."""
        self.brokers[broker_id].pause()

    def resume(self, broker_id: int) -> None:
        self.brokers[broker_id].resume()

    # ---- ZooKeeper state (paths of docs/REPLICATION.md) -------------------------------------
    @property
    def kazoo(self):
        """A kazoo client on the cluster's chroot (started on first use, closed by ``stop``)."""
        if self._kazoo is None:
            self._kazoo = self.zk.client(self.chroot)
        return self._kazoo

    def _json(self, path: str):
        from kazoo.exceptions import NoNodeError
        try:
            data, _ = self.kazoo.get(path)
        except NoNodeError:
            return None
        return json.loads(data.decode()) if data else None

    def controller_id(self) -> int | None:
        """The active controller's broker id (``/controller``), None when there is none."""
        node = self._json("/controller")
        return None if node is None else int(node["brokerid"])

    def registered_brokers(self) -> list[int]:
        """Broker ids with a live registration (``/brokers/ids``)."""
        from kazoo.exceptions import NoNodeError
        try:
            return sorted(int(i) for i in self.kazoo.get_children("/brokers/ids"))
        except NoNodeError:
            return []

    def topic_assignment(self, topic: str) -> dict[int, list[int]] | None:
        """``{partition: replicas}`` of a topic (``/brokers/topics/<topic>``)."""
        node = self._json(f"/brokers/topics/{topic}")
        return None if node is None else {int(p): list(r) for p, r in node["partitions"].items()}

    def partition_state(self, topic: str, partition: int) -> dict | None:
        """``{"leader", "leader_epoch", "isr", "controller_epoch"}`` of a partition, None if absent."""
        return self._json(f"/brokers/topics/{topic}/partitions/{partition}/state")

    def leader(self, topic: str, partition: int) -> int | None:
        state = self.partition_state(topic, partition)
        return None if state is None or state["leader"] < 0 else state["leader"]

    def isr(self, topic: str, partition: int) -> list[int]:
        state = self.partition_state(topic, partition)
        return [] if state is None else list(state["isr"])

    def wait_ready(self, timeout: float = 30.0) -> int:
        """Wait until every running broker is registered in ZooKeeper, a controller is elected,
        and every broker's metadata lists them all with that controller; the controller's id."""
        def ready():
            running = sorted(i for i, b in self.brokers.items() if b.running)
            controller = self.controller_id()
            if self.registered_brokers() != running or controller is None:
                return None
            # the controller has told every broker: each one's metadata lists them all
            for i in running:
                body = self.metadata(i)
                if sorted(b["node_id"] for b in body["brokers"]) != running or body["controller_id"] != controller:
                    return None
            return controller

        return self.wait_for(ready, timeout, "every broker registered, a controller elected and known to all")

    def metadata(self, broker_id: int, topics: list | None = None, timeout: float = 5.0) -> dict:
        """The METADATA answer of one broker (``brokers``, ``controller_id``, ``topics``)."""
        from odradek.network.client import BrokerConnection
        from odradek.core.protocol import ApiKey
        b = self.brokers[broker_id]
        conn = BrokerConnection(b.host, b.port, client_id="odradek-local", request_timeout_ms=int(timeout * 1000),
                                **self.client_security)
        try:
            return conn.request(ApiKey.METADATA, {"topics": topics}).body
        finally:
            conn.close()

    def wait_for(self, predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.1):
        """Poll ``predicate()`` until truthy (returned) or raise TimeoutError naming ``what``."""
        deadline = time.monotonic() + timeout
        last_exc = None
        while True:
            try:
                value = predicate()
                if value:
                    return value
            except Exception as exc:  # noqa: BLE001 - retried until the deadline
                last_exc = exc
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}"
                                   + (f" (last error: {last_exc!r})" if last_exc else ""))
            time.sleep(interval)


def free_port_is(port: int) -> bool:
    """True if nothing listens on 127.0.0.1:port now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False
