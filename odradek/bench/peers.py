"""The peers' servers that ``odradek perf`` measures beside Odradek in the same run (Redis
Streams, NATS JetStream): each in a temporary directory of its own, on 127.0.0.1 and an
ephemeral port, stopped (and its directory removed) afterwards."""
from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time

START_TIMEOUT = 10.0  # seconds a peer's server has to answer its probe


class PeerServer:
    """Subclasses say how to start the server (``command``) and how to know it serves
    (``probe``; by default: its port accepts a connection)."""

    name = "server"

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix=f"odradek-perf-{self.name}-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.probe():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.05)

    def command(self) -> list[str]:
        raise NotImplementedError

    def probe(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
