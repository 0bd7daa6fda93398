"""The actor runtime, with real actor processes and a real supervisor tree."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

from typing import NamedTuple

import psutil
import pytest

from odradek.actors.client import MailboxClient
from odradek.actors.message import Message, decode, encode_header, MalformedMessage
from odradek.actors.runtime import Actor
from odradek.core.protocol import ErrorCode, OdradekError
from odradek.actors.messages import Produce, Scale, Status, Stop
from tests.actors.echo import Boom, Echoed, EchoThis, Hold, RelayThis


class Undeclared(NamedTuple):
    """A message no actor declares (and so none handles)."""


Undeclared.TYPE = "no-such-type"

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_tree(children, run_dir, policy=None) -> subprocess.CompletedProcess:
    """A supervisor tree in a subprocess, run until it exits by itself (within 60 s)."""
    spec = json.dumps({"children": children, "policy": policy or {}})
    return subprocess.run([sys.executable, "-m", "tests.actors.tree", spec, str(run_dir)], cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=60)


class Tree:
    """A supervisor tree in a subprocess; always stopped in teardown."""

    def __init__(self, run_dir, children, policy=None):
        spec = json.dumps({"children": children, "policy": policy or {}})
        env = dict(os.environ, PYTHONPATH=ROOT)
        self.run_dir = run_dir
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.actors.tree", spec, run_dir], cwd=ROOT,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.stop()
            raise RuntimeError("tree did not start: " + self.proc.stderr.read()[-2000:])
        self.client = MailboxClient(run_dir)

    def status(self):
        return {a["name"]: a for a in self.client.request("supervisor", Status()).fields.actors}

    def wait_for(self, pred, timeout=15.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            time.sleep(0.05)
        return False

    def stop(self):
        kids = []
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        for k in kids:
            try:
                k.kill()
            except psutil.NoSuchProcess:
                pass
        if hasattr(self, "client"):
            self.client.close()
        return self.proc.returncode


ECHO = {"role": "echo", "cls": "tests.actors.echo:Echo", "count": 2, "scalable": True}


def test_message_header_round_trips_and_garbage_is_refused():
    raw = encode_header(Produce.TYPE, 7, "processor-0", Produce(1, [["t", 0, 0]]))
    msg = decode([raw, b"payload"])
    assert msg == Message(Produce.TYPE, 7, "processor-0", Produce(1, [["t", 0, 0]]), [b"payload"])
    assert type(msg.fields) is Produce
    for bad in (b"", b"\xc1", encode_header("x")[:-1], b"\x93\x01\x02\x03"):
        with pytest.raises(MalformedMessage):
            decode([bad])


def test_request_gets_the_reply_with_payload_frames_intact(tree):
    t = tree([ECHO])
    payload = os.urandom(200_000)
    reply = t.client.request("echo-0", EchoThis({"x": [1, 2]}), frames=[payload, b"second"])
    assert reply.fields == Echoed({"x": [1, 2]}, "echo-0") and type(reply.fields) is Echoed
    assert [bytes(f) for f in reply.frames] == [payload, b"second"]


def test_unknown_message_and_handler_bug_get_error_replies_and_the_actor_keeps_serving(tree):
    t = tree([ECHO])
    with pytest.raises(OdradekError) as err:
        t.client.request("echo-0", Undeclared())
    assert err.value.code == ErrorCode.INVALID_REQUEST and "no-such-type" in err.value.message
    with pytest.raises(OdradekError) as err:
        t.client.request("echo-0", Boom())
    assert err.value.code == ErrorCode.UNKNOWN_SERVER_ERROR and "ValueError: boom" in err.value.message
    assert t.client.request("echo-0", EchoThis("here")).fields.by == "echo-0"


def test_pending_requests_get_an_error_when_the_actor_stops(tree):
    t = tree([ECHO])
    # Hold a request in echo-1 from a second client, then stop echo-1 through the runtime.
    holder = MailboxClient(t.run_dir)
    try:
        from odradek.actors.message import encode_header as enc
        holder._peer("echo-1").send_multipart([enc(Hold.TYPE, 99, holder.name, Hold())])
        time.sleep(0.2)
        t.client.request("echo-1", Stop())
        assert holder.inbox.poll(5000), "the held request was never answered"
        answer = decode(holder.inbox.recv_multipart())
        assert answer.is_error and answer.corr == 99
        assert answer.error_code == ErrorCode.NETWORK_EXCEPTION and "stopping" in answer.error_message
        assert ErrorCode.of(answer.error_code).retriable  # a produce it held is retried, not failed
    finally:
        holder.close()


def test_request_to_a_silent_actor_times_out_with_a_clear_error(tree):
    t = tree([ECHO])
    with pytest.raises(OdradekError) as err:
        t.client.request("nobody-here", EchoThis(), timeout=0.3)
    assert err.value.code == ErrorCode.REQUEST_TIMED_OUT and "nobody-here" in err.value.message


def test_a_killed_child_is_restarted_and_status_shows_the_restart(tree):
    t = tree([ECHO])
    before = t.status()["echo-0"]
    os.kill(before["pid"], signal.SIGKILL)
    assert t.wait_for(lambda: t.status()["echo-0"]["restarts"] == 1 and t.status()["echo-0"]["state"] == "running")
    after = t.status()["echo-0"]
    assert after["pid"] != before["pid"] and after["last_exit"] == -signal.SIGKILL
    assert t.client.request("echo-0", EchoThis()).fields.by == "echo-0"


def test_a_child_that_keeps_dying_shuts_the_tree_down_naming_it(tmp_path):
    proc = run_tree([ECHO, {"role": "crasher", "cls": "tests.actors.echo:Crasher"}], tmp_path / "run",
                    {"max_restarts": 2, "restart_window": 30, "backoff_initial": 0.01})
    assert proc.returncode == 1
    assert "crasher died 3 times" in proc.stderr
    assert not [f for f in os.listdir(tmp_path / "run") if f.endswith(".mbox")]


def test_sigterm_stops_every_child_and_leaves_no_socket_file(tree):
    t = tree([ECHO, {"role": "relay", "cls": "tests.actors.echo:Relay"}])
    pids = [a["pid"] for a in t.status().values()]
    assert t.stop() == 0
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert os.listdir(t.run_dir) == []


def test_a_second_supervisor_on_the_same_run_dir_is_refused(tree, tmp_path):
    t = tree([ECHO])
    proc = run_tree([ECHO], t.run_dir)
    assert proc.returncode != 0 and "another broker" in proc.stderr
    assert t.client.request("echo-0", EchoThis()).fields.by == "echo-0"


def test_stale_sockets_of_a_killed_tree_are_cleared_at_start(tree, tmp_path):
    run_dir = tmp_path / "stale"
    run_dir.mkdir()
    (run_dir / "echo-0.mbox").write_text("")
    (run_dir / "supervisor.pid").write_text("999999")
    t = Tree(str(run_dir), [ECHO])
    try:
        assert t.client.request("echo-0", EchoThis()).fields.by == "echo-0"
    finally:
        t.stop()


def test_scaling_a_pool_up_and_down_fails_no_request(tree):
    relay = {"role": "relay", "cls": "tests.actors.echo:Relay"}
    t = tree([dict(ECHO, count=1, watchers=["relay"]), relay])
    errors, done = [], threading.Event()
    counts = {"ok": 0}

    def load():
        with MailboxClient(t.run_dir) as c:
            while not done.is_set():
                try:
                    c.request("relay", RelayThis(counts["ok"]), timeout=10)
                    counts["ok"] += 1
                except OdradekError as exc:
                    errors.append(exc)

    def relay_knows_its_members() -> bool:  # the relay learns them just after it reports ready
        try:
            t.client.request("relay", RelayThis(-1), timeout=5)
            return True
        except OdradekError:
            return False

    assert t.wait_for(relay_knows_its_members)
    th = threading.Thread(target=load)
    th.start()
    try:
        for n in (4, 1, 3, 1):
            time.sleep(0.3)
            reply = t.client.request("supervisor", Scale("echo", n), timeout=30)
            assert reply.fields.count == n
            assert t.wait_for(lambda: len([a for a in t.status().values() if a["role"] == "echo"]) == n)
        time.sleep(0.3)
    finally:
        done.set()
        th.join(30)
    assert errors == [] and counts["ok"] > 50


def test_scaling_a_role_that_cannot_scale_or_to_a_bad_count_is_refused(tree):
    t = tree([ECHO, {"role": "relay", "cls": "tests.actors.echo:Relay"}])
    with pytest.raises(OdradekError) as err:
        t.client.request("supervisor", Scale("relay", 2))
    assert err.value.code == ErrorCode.INVALID_CONFIG and "echo" in err.value.message
    with pytest.raises(OdradekError) as err:
        t.client.request("supervisor", Scale("echo", 0))
    assert "from 1 to 64" in err.value.message


class Ticker(Actor):
    def on_start(self):
        self.ticks = []
        self.call_every(0.01, lambda: self.ticks.append(self.clock()))
        self.once = self.call_later(0.05, lambda: self.ticks.append("once"))
        self.cancelled = self.call_later(0.02, lambda: self.ticks.append("cancelled"))
        self.cancelled.cancel()
        self.call_later(0.2, self.stop)


def test_timers_fire_in_order_and_cancelled_ones_do_not(tmp_path):
    actor = Ticker("ticker", str(tmp_path))
    actor.run()
    numbers = [t for t in actor.ticks if t != "once"]
    assert "once" in actor.ticks and "cancelled" not in actor.ticks
    assert len(numbers) >= 5 and numbers == sorted(numbers)
    assert os.listdir(tmp_path) == []


class Poster(Actor):
    """A worker thread posts callbacks; they must run on the loop, in order, woken at once
    (no timer is pending, so without the self-pipe the loop would sleep)."""

    def on_start(self):
        self.ran = []  # (i, thread ident)
        self.loop_thread = threading.get_ident()
        self.call_later(5.0, self.stop)  # if posts never woke the loop: fail, not hang
        self.worker = threading.Thread(target=self._work)
        self.worker.start()

    def _work(self):
        for i in range(200):
            self.post(lambda i=i: self.ran.append((i, threading.get_ident())))
            if i % 50 == 0:
                time.sleep(0.02)  # let the loop go back to sleep between bursts
        self.post(lambda: 1 / 0)  # a failing callback is logged; the others still run
        self.post(self.stop)


def test_post_runs_callbacks_from_another_thread_on_the_loop_in_order(tmp_path):
    actor = Poster("poster", str(tmp_path))
    actor.post(lambda: actor.ran.append(("early", threading.get_ident())))  # before run(): kept
    started = time.monotonic()
    actor.run()
    actor.worker.join(5)
    assert time.monotonic() - started < 2.0
    assert [i for i, _ in actor.ran] == ["early", *range(200)]
    assert {ident for _, ident in actor.ran} == {actor.loop_thread}
    assert actor._post_w is None  # the self-pipe is closed on stop ...
    actor.post(lambda: None)  # ... and a late post is harmless
    assert os.listdir(tmp_path) == []


def test_a_child_that_stops_answering_is_killed_after_the_liveness_timeout_and_restarted(tree):
    t = tree([ECHO], {"liveness_timeout": 2.0})
    before = t.status()["echo-0"]
    os.kill(before["pid"], signal.SIGSTOP)  # alive, silent: no heartbeat
    assert t.wait_for(lambda: t.status()["echo-0"]["restarts"] == 1 and t.status()["echo-0"]["state"] == "running")
    assert t.status()["echo-0"]["pid"] != before["pid"]


def test_a_whole_tree_frozen_past_the_liveness_timeout_and_resumed_restarts_nobody(tree):
    """SIGSTOP of the supervisor and every child (a frozen VM, the chaos tool's pause-leader),
    longer than the liveness timeout: on SIGCONT the supervisor must not take its own pause
    for every child's silence (it killed every actor of the broker at once)."""
    t = tree([ECHO], {"liveness_timeout": 2.0})
    before = t.status()
    procs = [psutil.Process(t.proc.pid)] + [psutil.Process(a["pid"]) for a in before.values()]
    for p in procs:  # the supervisor first, so it does not see its children stop
        p.send_signal(signal.SIGSTOP)
    time.sleep(5)
    for p in reversed(procs):
        p.send_signal(signal.SIGCONT)
    time.sleep(4)  # two liveness timeouts: a wrong kill would have happened
    after = t.status()
    assert {n: a["restarts"] for n, a in after.items()} == {n: 0 for n in before}
    assert [t.client.request(n, EchoThis()).fields.by for n in sorted(before)] == sorted(before)
