"""`odradek serve`, `status` and `configs` as a user runs them, on real brokers."""
import os
import signal
import subprocess
import sys
import threading
import time

import psutil

from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, OdradekError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def odradek(broker, *args, timeout=60):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "odradek", *args, *broker.set_args], capture_output=True,
                          text=True, timeout=timeout, cwd=broker.data_dir, env=env)


def alive(pids):
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def test_status_prints_the_actor_tree_with_every_role(shared_broker):
    broker = shared_broker  # only read: the module's broker
    proc = odradek(broker, "status")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"({broker.bootstrap})" in lines[0] and "supervisor pid" in lines[0]
    assert lines[1].split()[:4] == ["ACTOR", "ROLE", "PID", "STATE"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    for name in ("controller", "log-0", "log-1", "fetch", "handler-0", "handler-1", "processor-0",
                 "processor-1", "acceptor"):
        assert name in rows, f"{name} missing from status:\n{proc.stdout}"
        assert rows[name][3] == "running" and psutil.pid_exists(int(rows[name][2]))


def test_status_json_carries_each_actors_own_stats(shared_broker):
    """``odradek status --json`` has each actor's stats from its heartbeat; a log actor's
    counts its group commits on its loop and on its threads (an acks=1 produce waits for the
    leader's fsync, so some log actor has run one)."""
    import json

    from odradek import Admin, Producer
    broker = shared_broker
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("status-stats", partitions=1)
    with Producer(broker.bootstrap, acks=1) as p:
        p.send("status-stats", b"v").result(30)
    deadline = time.monotonic() + 30
    while True:
        proc = odradek(broker, "status", "--json")
        assert proc.returncode == 0, proc.stderr
        actors = json.loads(proc.stdout)["actors"]
        logs = [a["stats"] for a in actors if a["role"] == "log"]
        if sum(s.get("syncs", {}).get("threads", 0) + s.get("syncs", {}).get("inline", 0) for s in logs) >= 1:
            break
        assert time.monotonic() < deadline, f"no group commit in the log actors' stats: {logs}"
        time.sleep(0.5)
    assert all(isinstance(a["stats"], dict) for a in actors)
    assert all("appends" in s for s in logs)


def test_configs_alter_resizes_the_handler_pool_and_describe_shows_it(broker):
    proc = odradek(broker, "configs", "--bootstrap-server", broker.bootstrap, "--alter", "num.io.threads=3")
    assert proc.returncode == 0 and "Completed updating config for broker 0" in proc.stdout, proc.stderr
    assert sorted(a["name"] for a in broker.status()["actors"] if a["role"] == "handler") == \
        ["handler-0", "handler-1", "handler-2"]
    proc = odradek(broker, "configs", "--bootstrap-server", broker.bootstrap, "--describe")
    assert "num.io.threads=3 (dynamic)" in proc.stdout
    proc = odradek(broker, "configs", "--bootstrap-server", broker.bootstrap, "--alter", "num.network.threads=3")
    assert proc.returncode == 1 and "not a dynamic broker config" in proc.stderr


def test_sigterm_under_load_exits_0_and_leaves_no_process_and_no_socket_file(broker):
    pids = [broker.pid] + [c.pid for c in broker.children()]
    assert len(pids) >= 10
    stop, answered, refused = threading.Event(), [0], []

    def load():
        conn = BrokerConnection(broker.host, broker.port, client_id="load", connect_timeout_ms=300)
        try:
            while not stop.is_set():
                try:
                    conn.request(ApiKey.PING, {"n": answered[0]}, [b"x" * 512])
                    answered[0] += 1
                except OdradekError as exc:  # the broker is going away: a clean refusal
                    refused.append(exc)
                    time.sleep(0.01)
        finally:
            conn.close()

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(1.0)
    try:
        code = broker.terminate(timeout=30)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert code == 0, broker.stderr_tail()
    assert answered[0] > 100
    assert alive(pids) == []
    leftovers = [f for f in os.listdir(broker.run_dir) if f.endswith((".mbox", ".sock", ".pid"))] \
        if os.path.isdir(broker.run_dir) else []
    assert leftovers == []


def test_kill_9_of_the_supervisor_takes_every_actor_with_it_and_a_restart_works(start_broker, tmp_path):
    data = str(tmp_path / "data")
    first = start_broker(data)
    children = [c.pid for c in first.children()]
    os.kill(first.pid, signal.SIGKILL)
    first.proc.wait(10)
    deadline = time.monotonic() + 10
    while alive(children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert alive(children) == [], "actors outlived their supervisor"
    second = start_broker(data)  # same data and run directory: stale sockets are cleared
    conn = BrokerConnection(second.host, second.port)
    try:
        assert conn.request(ApiKey.PING, {"again": True}).body == {"again": True}
    finally:
        conn.close()


def test_a_second_broker_on_the_same_data_directory_is_refused(shared_broker):
    broker = shared_broker  # the refused one never starts: the module's broker will do
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.run([sys.executable, "-m", "odradek", "serve", *broker.set_args], capture_output=True,
                          text=True, timeout=60, env=env)
    assert proc.returncode == 1 and "another broker" in proc.stderr


def test_a_cluster_broker_that_cannot_reach_zookeeper_exits_1_saying_so_and_never_says_ready(tmp_path):
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.run([sys.executable, "-m", "odradek", "serve", "--set", "listeners=PLAINTEXT://127.0.0.1:0",
                           "--set", f"log.dirs={tmp_path / 'data'}", "--set", f"zookeeper.connect=127.0.0.1:{port}",
                           "--set", "zookeeper.connection.timeout.ms=300", "--set", "supervisor.max.restarts=1"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 1
    assert "odradek ready" not in proc.stdout
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("odradek: controller died") and f"cannot reach ZooKeeper at '127.0.0.1:{port}'" in last
