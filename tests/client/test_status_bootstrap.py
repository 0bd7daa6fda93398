"""`odradek status --bootstrap-server H:P` (issue 16, defect 15): with several brokers on one
machine, status reports the one listening at that address, found through the ``log.dirs`` /
``run.dir`` it reports, not whichever run directory the local config points at."""
from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def status(cwd, *args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "odradek", "status", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd, env=env)


def test_status_reports_the_broker_at_the_bootstrap_address_among_several(start_broker, tmp_path):
    first, second = start_broker(), start_broker()
    for b in (second, first):
        proc = status(tmp_path, "--bootstrap-server", b.bootstrap)
        assert proc.returncode == 0, proc.stderr
        head = proc.stdout.splitlines()[0]
        assert f"({b.bootstrap})" in head and os.path.abspath(b.data_dir) in head, head
        assert "processor-0" in proc.stdout


def test_status_of_an_address_where_no_broker_listens_is_one_clear_line(tmp_path):
    import socket
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = status(tmp_path, "--bootstrap-server", f"127.0.0.1:{port}")
    assert proc.returncode == 1
    assert f"127.0.0.1:{port}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
