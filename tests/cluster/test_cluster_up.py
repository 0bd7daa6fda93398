"""`odradek cluster up / status / down` end to end, in a temporary directory: processes in
their own sessions that outlive the command, cluster.json, and nothing left after `down`."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import psutil

from odradek import Admin
from odradek.local import stop_pid


def odradek(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "odradek", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=180)


def processes_under(directory: str) -> list[psutil.Process]:
    """Every process whose command line or working directory names the directory."""
    out = []
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            if directory in " ".join(p.info["cmdline"] or []) or (p.info["cwd"] or "").startswith(directory):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def test_up_status_down(tmp_path):
    cwd = str(tmp_path)
    directory = os.path.join(cwd, "odradek-cluster")  # the default --dir, under the working directory
    state_path = os.path.join(directory, "cluster.json")
    try:
        up = odradek("cluster", "up", "--brokers", "3", "--set", "shutdown.timeout.ms=10000", cwd=cwd)
        assert up.returncode == 0, up.stderr
        for broker_id in (1, 2, 3):  # each broker is shown as it comes up, with its console
            assert re.search(rf"broker {broker_id} up on 127\.0\.0\.1:\d+ in [\d.]+s, console http://", up.stderr), \
                up.stderr
        bootstrap = up.stdout.strip()
        with open(state_path) as f:
            state = json.load(f)
        assert bootstrap == state["bootstrap"] and len(bootstrap.split(",")) == 3
        assert [b["id"] for b in state["brokers"]] == [1, 2, 3]
        assert state["zookeeper_connect"].endswith("/odradek")
        pids = [state["zookeeper"]["pid"]] + [b["pid"] for b in state["brokers"]]
        procs = [psutil.Process(pid) for pid in pids]
        for b in state["brokers"]:
            kids = psutil.Process(b["pid"]).children(recursive=True)
            assert kids, "a broker runs actor processes"
            procs += kids
            assert os.getsid(b["pid"]) == b["pid"]  # its own session: survives the command's terminal
            assert b["settings"]["zookeeper.connect"] == state["zookeeper_connect"]
        # every broker answers
        for address in bootstrap.split(","):
            with Admin(address) as admin:
                admin.list_topics()

        status = odradek("cluster", "status", cwd=cwd)
        assert status.returncode == 0, status.stdout + status.stderr
        lines = status.stdout.splitlines()
        assert lines[0].startswith("zookeeper") and " up" in lines[0]
        assert sum(1 for line in lines if line.startswith("broker ") and "  up" in line) == 3, status.stdout

        again = odradek("cluster", "up", cwd=cwd)
        assert again.returncode == 1 and "already running" in again.stderr

        down = odradek("cluster", "down", cwd=cwd)
        assert down.returncode == 0, down.stderr
        gone, alive = psutil.wait_procs(procs, timeout=10)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
        assert not os.path.exists(state_path)
        assert os.path.isdir(os.path.join(directory, "broker-1"))  # data kept
        assert odradek("cluster", "status", cwd=cwd).returncode == 1
        assert odradek("cluster", "down", cwd=cwd).returncode == 1
    finally:
        if os.path.exists(state_path):  # the test failed half-way: leave nothing running
            with open(state_path) as f:
                state = json.load(f)
            for e in state["brokers"] + [state["zookeeper"]]:
                stop_pid(e["pid"], e["create_time"], timeout=10)
    assert processes_under(directory) == []


def test_up_with_a_bad_setting_starts_nothing(tmp_path):
    directory = str(tmp_path / "c")
    result = odradek("cluster", "up", "--dir", directory, "--set", "num.io.threads=zero", cwd=str(tmp_path))
    assert result.returncode == 1 and "num.io.threads" in result.stderr
    result = odradek("cluster", "up", "--dir", directory, "--set", "broker.id=7", cwd=str(tmp_path))
    assert result.returncode == 1 and "broker.id" in result.stderr
    assert not os.path.exists(os.path.join(directory, "cluster.json"))
    assert processes_under(directory) == []
