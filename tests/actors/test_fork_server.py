"""Actors forked from the preloaded fork server (``odradek.actors.launch``): every kill path
leaves nothing behind, and the supervisor still restarts what dies."""
import os
import signal
import time

import psutil
import pytest

from odradek.actors.launch import forkserver_available, preload_modules
from odradek.actors.supervisor import ChildSpec
from odradek.local import LocalBroker, free_port_is
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey
from odradek.actors.messages import Status
from tests.actors.echo import EchoThis

from tests.actors.test_runtime import ECHO, run_tree

pytestmark = pytest.mark.skipif(not forkserver_available(), reason="no fork server (or no pidfd) here")


@pytest.fixture(autouse=True)
def _default_start_method(monkeypatch):
    monkeypatch.delenv("ODRADEK_ACTOR_START", raising=False)  # the fork server, unless a test says


def running(procs):
    """Those of ``procs`` still running (a zombie waiting for a reaper has let go of everything)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_gone(procs, timeout=10.0):
    """Wait for ``procs`` to leave; SIGKILL and name those still there after ``timeout`` (so
    a failing test does not leave them holding the port, or the broker's stdout pipe that
    ``LocalBroker``'s teardown would wait on)."""
    deadline = time.monotonic() + timeout
    while running(procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [(p.pid, _describe(p)) for p in running(procs)]
    for p in running(procs):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return left


def _describe(p):
    try:
        return " ".join(p.cmdline())[:120] or p.name()
    except psutil.Error:
        return "?"


def wait_for(pred, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = pred()
            if value:
                return value
        except Exception:  # noqa: BLE001 - not there yet
            pass
        time.sleep(0.1)
    return None


def ping(b, n):
    conn = BrokerConnection(b.host, b.port, connect_timeout_ms=1000)
    try:
        return conn.request(ApiKey.PING, {"n": n}).body == {"n": n}
    finally:
        conn.close()


@pytest.fixture
def local_broker(tmp_path):
    b = LocalBroker(str(tmp_path / "data"), {"shutdown.timeout.ms": 10000})
    yield b
    b.discard()


def test_the_preload_list_is_the_modules_of_the_supervisors_actor_classes():
    specs = [ChildSpec("a", "tests.actors.echo:Echo"), ChildSpec("b", "odradek.log.log_actor:LogActor", count=2)]
    assert preload_modules(s.cls for s in specs) == ["odradek.actors.launch", "odradek.actors.runtime",
                                                     "odradek.log.log_actor", "tests.actors.echo"]


def _pipes(pid, skip_stdio=True):
    """The pipe inodes ``pid`` holds open (not its stdin/stdout/stderr, shared by the whole tree)."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        if skip_stdio and int(fd) <= 2:
            continue
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("pipe:"):
            out.add(target)
    return out


def test_no_actor_holds_a_pipe_of_the_fork_server_so_only_the_supervisor_keeps_it_alive(tree):
    """The fork server lives while its "alive" pipe has a writer; multiprocessing gives each
    child a copy. Were one left in an actor, a kill -9 of the supervisor would leave the server
    and every actor running (what failed before)."""
    t = tree([ECHO])
    sup = t.client.request("supervisor", Status()).fields.supervisor
    assert sup["actor_start"] == "forkserver"
    server = sup["fork_server"]
    assert psutil.Process(server).ppid() == t.proc.pid
    server_pipes = _pipes(server)
    assert server_pipes & _pipes(t.proc.pid), "the supervisor holds the alive pipe's write end"
    for name, actor in t.status().items():
        assert psutil.Process(actor["pid"]).ppid() == server, f"{name} was not forked by the fork server"
        assert not _pipes(actor["pid"]) & server_pipes, f"{name} shares a pipe with the fork server"


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_kill_9_of_the_supervisor_ends_the_fork_server_and_every_actor_and_frees_the_port(local_broker, method):
    local_broker.env["ODRADEK_ACTOR_START"] = method
    b = local_broker.start()
    sup = b.status()["supervisor"]
    assert sup["actor_start"] == method
    everyone = b.children()
    assert len(everyone) >= 10
    if method == "forkserver":
        assert sup["fork_server"] in [p.pid for p in everyone]
    os.kill(b.pid, signal.SIGKILL)
    b.proc.wait(10)
    assert wait_gone(everyone, 10) == [], "processes outlived their supervisor"
    assert free_port_is(b.port)
    b.start()  # the same data and run directory: what the dead one left is cleared
    assert ping(b, 1)


def test_kill_9_of_the_fork_server_restarts_its_actors_and_a_later_kill_is_restarted_too(local_broker):
    b = local_broker.start()
    status = b.status()
    server = psutil.Process(status["supervisor"]["fork_server"])
    before = {a["name"]: a["pid"] for a in status["actors"]}
    old = [psutil.Process(pid) for pid in before.values()]
    server.kill()
    # The actors get their parent-death SIGTERM and stop; the supervisor restarts each once
    # it has really exited (no two of a name at once), from a new fork server.
    assert wait_gone(old, 20) == [], "actors outlived the fork server"

    def all_back():
        now = b.status()
        actors = {a["name"]: a for a in now["actors"]}
        return (set(actors) == set(before) and all(a["state"] == "running" for a in actors.values())
                and now["supervisor"]["fork_server"] not in (None, server.pid) and now)

    now = wait_for(all_back, 60)
    assert now, b.status()
    assert all(a["pid"] != before[a["name"]] and a["restarts"] == 1 for a in now["actors"])
    assert psutil.Process(now["supervisor"]["fork_server"]).ppid() == b.pid
    assert wait_for(lambda: ping(b, 2), 30)

    victim = b.actor("handler-0")
    os.kill(victim["pid"], signal.SIGKILL)
    again = wait_for(lambda: (a := b.actor("handler-0"))["restarts"] == 2 and a["state"] == "running" and a, 30)
    assert again and again["pid"] != victim["pid"]
    assert psutil.Process(again["pid"]).ppid() == now["supervisor"]["fork_server"]
    assert wait_for(lambda: ping(b, 3), 30)


def test_an_actor_still_stopping_when_the_fork_server_died_is_not_replaced_before_it_exits(tree):
    """The fork server's status pipe ends with the server; the actor it forked may still be
    stopping (closing files). Its successor must not start (bind its mailbox, its port, open
    its files) until it has exited."""
    t = tree([{"role": "slow", "cls": "tests.actors.echo:SlowStop", "args": {"stop_seconds": 3.0}}])
    server = t.client.request("supervisor", Status()).fields.supervisor["fork_server"]
    old = psutil.Process(t.status()["slow"]["pid"])
    os.kill(server, signal.SIGKILL)
    while running([old]):
        assert t.status()["slow"]["pid"] == old.pid, "a successor started while the actor was still stopping"
        time.sleep(0.1)
    assert t.wait_for(lambda: t.status()["slow"]["state"] == "running" and t.status()["slow"]["pid"] != old.pid)
    assert t.client.request("slow", EchoThis()).fields.by == "slow"


def test_a_graceful_stop_leaves_no_process_and_no_socket_file(local_broker):
    b = local_broker.start()
    everyone = [psutil.Process(b.pid)] + b.children()
    assert b.terminate(30) == 0, b.stderr_tail()
    assert wait_gone(everyone, 10) == []
    assert free_port_is(b.port)
    assert [f for f in os.listdir(b.run_dir) if not f.startswith("broker.")] == []


def test_pause_and_resume_of_the_whole_broker_including_the_fork_server_restarts_nobody(local_broker):
    b = local_broker.start()
    before = {a["name"]: a["pid"] for a in b.status()["actors"]}
    server = b.status()["supervisor"]["fork_server"]
    b.pause()
    assert server in [p.pid for p in b.paused]
    time.sleep(1.5)
    b.resume()
    assert wait_for(lambda: ping(b, 4), 30)
    after = b.status()
    assert {a["name"]: a["pid"] for a in after["actors"]} == before
    assert after["supervisor"]["fork_server"] == server


def test_spawn_remains_available_as_the_start_method(tree, monkeypatch):
    monkeypatch.setenv("ODRADEK_ACTOR_START", "spawn")
    t = tree([ECHO])
    sup = t.client.request("supervisor", Status()).fields.supervisor
    assert sup["actor_start"] == "spawn" and sup["fork_server"] is None
    before = t.status()["echo-0"]
    assert psutil.Process(before["pid"]).ppid() == t.proc.pid
    os.kill(before["pid"], signal.SIGKILL)
    assert t.wait_for(lambda: t.status()["echo-0"]["restarts"] == 1 and t.status()["echo-0"]["state"] == "running")
    assert t.client.request("echo-0", EchoThis()).fields.by == "echo-0"


def test_a_module_that_kills_the_fork_server_at_import_falls_back_to_spawn_and_is_named(tmp_path):
    """The fork server imports every actor module first; one raising anything but ImportError
    kills it. The supervisor then spawns, and the broken actor fails as it would have."""
    proc = run_tree([ECHO, {"role": "broken", "cls": "tests.actors.broken:Broken"}], tmp_path / "run",
                    {"max_restarts": 1, "restart_window": 30, "backoff_initial": 0.01})
    assert proc.returncode == 1
    assert "spawning actors from now on" in proc.stderr
    assert "broken died 2 times" in proc.stderr and "broken at import, on purpose" in proc.stderr
