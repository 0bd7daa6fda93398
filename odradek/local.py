"""A broker in a child process on this machine: start it, learn its address, stop or kill it.

``LocalBroker`` runs ``python -m odradek serve`` with ``--set`` settings (listening on
127.0.0.1, port 0 unless told otherwise), waits for its ``odradek ready on HOST:PORT`` line,
and always leaves nothing behind: ``stop()`` sends SIGTERM and, if the broker does not exit,
SIGKILLs its whole process group and every actor it had. ``kill()`` simulates a crash
(SIGKILL of the supervisor and of every actor). The same object can be started again on
the same data directory. Used by the tests' fixtures and the benchmarks; the thread that
reads the broker's stdout is the only thread it starts.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import psutil

READY = re.compile(r"odradek ready on (\S+):(\d+) \(broker (\d+)\)")
# The checkout this package runs from: on PYTHONPATH for the child, so an uninstalled tree
# (a fresh clone's tests) runs its own code.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LocalBroker:
    def __init__(self, data_dir: str, settings: dict | None = None, start_timeout: float = 60.0):
        self.data_dir = data_dir
        self.settings = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": data_dir, **(settings or {})}
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.host = self.port = None
        self.stdout_lines: list[str] = []
        self.stderr_path = os.path.join(data_dir, "broker.stderr")
        self.exit_code: int | None = None
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
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self._stderr = open(self.stderr_path, "ab")
        began = time.perf_counter()
        self.host = self.port = None
        self.proc = subprocess.Popen([sys.executable, "-m", "odradek", "serve", *self.set_args],
                                     stdout=subprocess.PIPE, stderr=self._stderr, cwd=self.data_dir,
                                     env=env, start_new_session=True, text=True)
        ready = threading.Event()
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

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def run_dir(self) -> str:
        from odradek import config as cfg
        return cfg.run_dir(cfg.load(None, [f"{k}={v}" for k, v in self.settings.items()]))

    def status(self, timeout: float = 5.0) -> dict:
        """The supervisor's status (``odradek status --json``)."""
        from actors.client import MailboxClient
        with MailboxClient(self.run_dir) as client:
            return client.request("supervisor", "status", timeout=timeout).fields

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
        self.proc.kill()
        for kid in kids:
            try:
                kid.kill()
            except psutil.NoSuchProcess:
                pass
        self.proc.wait(30)
        psutil.wait_procs(kids, timeout=30)
        self._close_pipes()

    def stop(self, timeout: float = 20.0) -> None:
        """Whatever state it is in, leave no process behind."""
        if self.proc is None:
            return
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
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None
