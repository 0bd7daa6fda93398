"""`odradek cluster add`: one more broker in a running local cluster, registered and recorded."""
from __future__ import annotations

import json
import os

import pytest

from odradek import Admin
from odradek.local import stop_pid
from tests.cluster.test_cluster_up import odradek

pytestmark = pytest.mark.slow


def test_cluster_add_starts_the_next_broker_with_its_own_settings(tmp_path):
    cwd = str(tmp_path)
    state_path = os.path.join(cwd, "odradek-cluster", "cluster.json")
    try:
        up = odradek("cluster", "up", "--brokers", "1", "--set", "shutdown.timeout.ms=10000", cwd=cwd)
        assert up.returncode == 0, up.stderr
        added = odradek("cluster", "add", "--set", "broker.rack=r2", cwd=cwd)
        assert added.returncode == 0, added.stderr
        assert "broker 2 " in added.stderr and "not registered" not in added.stderr
        with open(state_path) as f:
            state = json.load(f)
        assert [b["id"] for b in state["brokers"]] == [1, 2] and added.stdout.strip() == state["bootstrap"]
        assert state["brokers"][1]["settings"]["broker.rack"] == "r2"
        with Admin(state["bootstrap"]) as admin:
            assert admin.broker_racks() == {1: None, 2: "r2"}
        bad = odradek("cluster", "add", "--set", "log.dirs=/tmp/x", cwd=cwd)
        assert bad.returncode == 1 and "log.dirs" in bad.stderr
        assert odradek("cluster", "down", cwd=cwd).returncode == 0
    finally:
        if os.path.exists(state_path):
            with open(state_path) as f:
                state = json.load(f)
            for e in state["brokers"] + [state["zookeeper"]]:
                stop_pid(e["pid"], e["create_time"], timeout=10)
