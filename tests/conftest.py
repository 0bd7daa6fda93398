"""Shared fixtures: real brokers on 127.0.0.1 with ephemeral ports and temporary directories.

``broker`` starts one ``odradek serve`` per test; ``start_broker(**settings)`` starts as many
as a test needs, each with its own settings (``num_io_threads=4`` becomes
``--set num.io.threads=4``). Every broker is stopped in teardown, even when the test fails:
SIGTERM, then SIGKILL of its whole process group.
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
import pytest

READY = re.compile(r"odradek ready on (\S+):(\d+) \(broker (\d+)\)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BrokerProcess:
    """One ``odradek serve`` subprocess."""

    def __init__(self, data_dir: str, settings: dict, start_timeout: float = 60.0):
        self.data_dir = data_dir
        self.settings = {"listeners": "PLAINTEXT://127.0.0.1:0", "log.dirs": data_dir,
                         "shutdown.timeout.ms": 10000, **settings}
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.host = self.port = None
        self.stdout_lines: list[str] = []
        self.stderr_path = os.path.join(data_dir, "broker.stderr")
        self.exit_code: int | None = None

    @property
    def set_args(self) -> list[str]:
        out = []
        for k, v in self.settings.items():
            out += ["--set", f"{k}={v}"]
        return out

    def start(self) -> "BrokerProcess":
        os.makedirs(self.data_dir, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "odradek", "serve", *self.set_args],
                                     stdout=subprocess.PIPE, stderr=self._stderr, cwd=self.data_dir,
                                     env=env, start_new_session=True, text=True)
        ready = threading.Event()

        def pump() -> None:
            for line in self.proc.stdout:
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
        """SIGTERM and wait: the graceful path a test may want to check."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.exit_code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.exit_code = None
        return self.exit_code

    def stop(self) -> None:
        """Whatever state it is in, leave no process behind."""
        if self.proc is None:
            return
        kids = self.children()
        if self.proc.poll() is None:
            self.terminate()
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
        if self.proc.stdout:
            self.proc.stdout.close()
        self._stderr.close()


@pytest.fixture
def start_broker(tmp_path_factory):
    brokers: list[BrokerProcess] = []

    def start(data_dir: str | None = None, **settings) -> BrokerProcess:
        data_dir = data_dir or str(tmp_path_factory.mktemp("broker"))
        settings = {k.replace("_", "."): v for k, v in settings.items()}
        b = BrokerProcess(data_dir, settings)
        brokers.append(b)
        return b.start()

    yield start
    for b in brokers:
        b.stop()


@pytest.fixture
def broker(start_broker) -> BrokerProcess:
    return start_broker()
