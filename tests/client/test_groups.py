"""Consumer groups end to end: real brokers, consumers in separate processes
(tests/client/test_groups_worker.py), a producer running throughout.

Checked from the workers' timelines: each partition has one owner at any time; a join moves
only what the new member takes while the others keep consuming; kill -9 of a member moves
its partitions within the session timeout; a static member's restart moves nothing; kill -9
of the coordinator loses no commit; and no produced record goes unconsumed (at-least-once),
record by record.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from odradek.core.protocol import ApiKey
from odradek import Consumer, Producer, TopicPartition
from tests.conftest import ROOT
from tests.network.helpers import actor, connect, kill9, wait_until


@pytest.fixture
def broker(shared_broker):
    """The module's broker (tests/conftest.py's ``shared_broker``): each test has a topic and
    a group of its own; the one that kills an actor of the broker takes ``own_broker``."""
    return shared_broker


@pytest.fixture
def own_broker(start_broker):
    return start_broker()


class Worker:
    def __init__(self, broker, path: str, group: str = "g", topic: str = "t", instance: str | None = None,
                 session_ms: int | None = None, heartbeat_ms: int = 3000):
        self.path = path
        cmd = [sys.executable, "-m", "tests.client.test_groups_worker", broker.bootstrap, group, topic, path,
               "--heartbeat-ms", str(heartbeat_ms)]
        if instance:
            cmd += ["--instance", instance]
        if session_ms:
            cmd += ["--session-ms", str(session_ms)]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=open(path + ".stderr", "ab"))
        self.killed_at: float | None = None

    def events(self) -> list[list[str]]:
        try:
            with open(self.path) as f:
                return [line.split() for line in f if line.endswith("\n")]
        except FileNotFoundError:
            return []

    def owned(self) -> set[int]:
        """Partitions owned after the last event (nothing once killed)."""
        if self.killed_at is not None:
            return set()
        owned: set[int] = set()
        for e in self.events():
            if e[0] == "A" and e[2:]:
                owned |= {int(p) for p in e[2].split(",") if p}
            elif e[0] == "V" and len(e) > 2:
                owned -= {int(p) for p in e[2].split(",") if p}
        return owned

    def kill(self) -> None:
        self.killed_at = time.monotonic()
        kill9(self.proc.pid)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@pytest.fixture
def workers():
    started: list[Worker] = []
    yield started
    for w in started:
        if w.proc.poll() is None:
            w.proc.kill()
            w.proc.wait(5)


class Load:
    """A producer thread sending numbered records to every partition until stopped."""

    def __init__(self, broker, topic: str, partitions: int, rate: int = 2000):
        self.topic, self.partitions, self.rate = topic, partitions, rate
        self.acked: dict[int, int] = {}  # partition -> highest acknowledged offset
        self.producer = Producer(broker.bootstrap, linger_ms=5, acks=1)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            futures = [self.producer.send(self.topic, value=b"%d" % (i + k), partition=(i + k) % self.partitions)
                       for k in range(self.rate // 20)]
            i += len(futures)
            self.producer.flush()
            for f in futures:
                md = f.get(30)
                self.acked[md.partition] = max(self.acked.get(md.partition, -1), md.offset)
            time.sleep(0.05)

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self.thread.join(60)
        self.producer.close()
        return dict(self.acked)


def create_topic(broker, name: str, partitions: int) -> None:
    with connect(broker) as c:
        c.request(ApiKey.CREATE_TOPICS, {"topics": [{"name": name, "num_partitions": partitions}]})


def consumed(ws: list[Worker]) -> dict[int, list[tuple[int, int]]]:
    ranges: dict[int, list[tuple[int, int]]] = {}
    for w in ws:
        for e in w.events():
            if e[0] == "R":
                ranges.setdefault(int(e[2]), []).append((int(e[3]), int(e[4])))
    return ranges


def missing(ws: list[Worker], acked: dict[int, int]) -> dict[int, list[int]]:
    """Acknowledged offsets no worker returned: must be empty (at-least-once)."""
    ranges = consumed(ws)
    out = {}
    for p, last in acked.items():
        seen = bytearray(last + 1)
        for a, b in ranges.get(p, ()):
            seen[a:min(b, last) + 1] = b"\x01" * (min(b, last) + 1 - a) if a <= last else b""
        gaps = [o for o in range(last + 1) if not seen[o]]
        if gaps:
            out[p] = gaps[:10]
    return out


def all_consumed(ws, acked) -> bool:
    return not missing(ws, acked)


def ownership_intervals(ws: list[Worker]) -> dict[int, list[tuple[float, float, str]]]:
    """partition -> [(from, to, worker)]: from its A event to its V event, or the kill."""
    out: dict[int, list] = {}
    end = time.monotonic() + 1e6
    for w in ws:
        since: dict[int, float] = {}
        for e in w.events():
            if e[0] == "A" and e[2:]:
                for p in e[2].split(","):
                    if p:
                        since[int(p)] = float(e[1])
            elif e[0] == "V" and len(e) > 2:
                for p in e[2].split(","):
                    if p and int(p) in since:
                        out.setdefault(int(p), []).append((since.pop(int(p)), float(e[1]), w.path))
        for p, t in since.items():
            out.setdefault(p, []).append((t, w.killed_at if w.killed_at is not None else end, w.path))
    return out


def every_record_consumed_by_one_owner_at_a_time(ws: list[Worker], acked) -> None:
    wait_until(lambda: all_consumed(ws, acked), what="every record to be consumed")
    assert_one_owner_at_a_time(ws)


def assert_one_owner_at_a_time(ws: list[Worker]) -> None:
    for p, intervals in ownership_intervals(ws).items():
        intervals.sort()
        for (a0, a1, wa), (b0, b1, wb) in zip(intervals, intervals[1:]):
            assert a1 <= b0, f"partition {p} owned by {wa} until {a1:.3f} and by {wb} from {b0:.3f}"


def group_description(broker, group: str = "g") -> dict:
    with connect(broker) as c:
        return c.request(ApiKey.DESCRIBE_GROUPS, {"group_ids": [group]}).body["groups"][0]


def stable_with(broker, n_members: int, group: str = "g") -> bool:
    d = group_description(broker, group)
    return d.get("group_state") == "stable" and len(d.get("members", ())) == n_members


def test_a_join_moves_only_what_the_new_member_takes_while_the_others_keep_consuming(broker, workers, tmp_path):
    topic, group = "join", "join-group"
    create_topic(broker, topic, 6)
    load = Load(broker, topic, 6)
    try:
        w1 = Worker(broker, str(tmp_path / "w1"), group, topic)
        workers.append(w1)
        wait_until(lambda: len(w1.owned()) == 6, what="w1 to own everything")
        w2 = Worker(broker, str(tmp_path / "w2"), group, topic)
        workers.append(w2)
        wait_until(lambda: stable_with(broker, 2, group) and len(w2.owned()) == 3, what="w1 and w2 to settle")
        before = {w.path: w.owned() for w in (w1, w2)}
        t_join = time.monotonic()
        w3 = Worker(broker, str(tmp_path / "w3"), group, topic)
        workers.append(w3)
        wait_until(lambda: stable_with(broker, 3, group) and len(w3.owned()) == 2, what="w3 to take its share")
        t_done = time.monotonic()
        # Only what w3 took moved; each old member kept the rest.
        after = {w.path: w.owned() for w in (w1, w2)}
        moved = sum(len(before[p] - after[p]) for p in before)
        assert moved == 2 and all(after[p] <= before[p] for p in before)
        # The partitions that stayed were consumed during the change (never paused).
        time.sleep(0.5)
        kept = {p for w in (w1, w2) for p in after[w.path]}
        during = {int(e[2]) for w in (w1, w2) for e in w.events()
                  if e[0] == "R" and t_join <= float(e[1]) <= t_done + 0.5 and int(e[2]) in kept}
        assert during, "members that kept their partitions stopped consuming during the join"
    finally:
        acked = load.stop()
    every_record_consumed_by_one_owner_at_a_time(workers, acked)
    for w in workers:
        w.stop()


def test_kill_9_of_a_member_moves_its_partitions_within_the_session_timeout(broker, workers, tmp_path):
    topic, group = "member-kill", "member-kill-group"
    create_topic(broker, topic, 4)
    load = Load(broker, topic, 4)
    try:
        w1 = Worker(broker, str(tmp_path / "w1"), group, topic, session_ms=3000)
        w2 = Worker(broker, str(tmp_path / "w2"), group, topic, session_ms=3000)
        workers += [w1, w2]
        wait_until(lambda: stable_with(broker, 2, group) and len(w1.owned()) == 2 and len(w2.owned()) == 2,
                   what="two members to settle")
        time.sleep(0.5)
        w2.kill()
        wait_until(lambda: len(w1.owned()) == 4, what="the killed member's partitions to move")
        took = max(float(e[1]) for e in w1.events() if e[0] == "A") - w2.killed_at
        assert took < 3.0 + 10, f"moved after {took:.1f} s"
        time.sleep(0.5)
    finally:
        acked = load.stop()
    # Consumption resumed from the killed member's last commit: nothing is missing.
    every_record_consumed_by_one_owner_at_a_time(workers, acked)
    w1.stop()


def test_a_static_member_restarting_within_its_session_timeout_moves_nothing(broker, workers, tmp_path):
    topic, group = "static", "static-group"
    create_topic(broker, topic, 4)
    load = Load(broker, topic, 4)
    try:
        w1 = Worker(broker, str(tmp_path / "w1"), group, topic, instance="a", session_ms=20000)
        w2 = Worker(broker, str(tmp_path / "w2"), group, topic, instance="b", session_ms=20000)
        workers += [w1, w2]
        wait_until(lambda: stable_with(broker, 2, group) and len(w1.owned()) == 2 and len(w2.owned()) == 2,
                   what="two static members to settle")
        epoch, mine = group_description(broker, group)["group_epoch"], w1.owned()
        w2_events = len([e for e in w2.events() if e[0] in "AV"])
        w1.kill()
        w1b = Worker(broker, str(tmp_path / "w1b"), group, topic, instance="a", session_ms=20000)
        workers.append(w1b)
        wait_until(lambda: w1b.owned() == mine, what="the restarted member to get its partitions back")
        assert group_description(broker, group)["group_epoch"] == epoch
        assert len([e for e in w2.events() if e[0] in "AV"]) == w2_events, "the other member saw a rebalance"
    finally:
        acked = load.stop()
    every_record_consumed_by_one_owner_at_a_time(workers, acked)
    for w in workers:
        w.stop()


def test_kill_9_of_the_coordinator_loses_no_commit(own_broker, workers, tmp_path):
    broker = own_broker  # kill -9 of one of its actors: a broker of this test's own
    create_topic(broker, "t", 4)
    load = Load(broker, "t", 4)
    try:
        w1 = Worker(broker, str(tmp_path / "w1"), session_ms=12000)
        w2 = Worker(broker, str(tmp_path / "w2"), session_ms=12000)
        workers += [w1, w2]
        wait_until(lambda: stable_with(broker, 2) and len(w1.owned()) == 2 and len(w2.owned()) == 2,
                   what="two members to settle")
        epoch = group_description(broker)["group_epoch"]
        time.sleep(1.0)
        with Consumer(broker.bootstrap, group_id="g") as c:
            before = {tp: c.committed(tp) for tp in [TopicPartition("t", p) for p in range(4)]}
        pid = actor(broker, "group_coordinator")["pid"]
        t_kill = time.monotonic()
        kill9(pid)
        wait_until(lambda: actor(broker, "group_coordinator")["pid"] != pid
                   and actor(broker, "group_coordinator")["state"] == "running", what="the coordinator restart")
        with Consumer(broker.bootstrap, group_id="g") as c:
            after = {tp: c.committed(tp) for tp in before}
        assert all(before[tp] is not None and after[tp] >= before[tp] for tp in before), (before, after)
        # The members reconnect within their session timeout: the group resumes as it was.
        time.sleep(12.0)
        assert group_description(broker)["group_epoch"] == epoch
        assert not [e for w in (w1, w2) for e in w.events() if e[0] in "AV" and float(e[1]) > t_kill], \
            "partitions moved after the coordinator restarted"
    finally:
        acked = load.stop()
    every_record_consumed_by_one_owner_at_a_time(workers, acked)
    for w in workers:
        w.stop()


def test_stress_20_consumers_on_60_partitions_joining_and_leaving_at_random(broker, workers, tmp_path):
    topic, group = "stress", "stress-group"
    create_topic(broker, topic, 60)
    load = Load(broker, topic, 60, rate=3000)
    rng = random.Random(5)
    live: list[Worker] = []
    n = 0
    try:
        for _ in range(20):
            n += 1
            w = Worker(broker, str(tmp_path / f"w{n}"), group, topic, session_ms=5000)
            workers.append(w)
            live.append(w)
        wait_until(lambda: stable_with(broker, 20, group), timeout=120, what="20 members to settle")
        for _ in range(12):
            action = rng.choice(["join", "leave", "kill"])
            if action == "join" or len(live) < 5:
                n += 1
                w = Worker(broker, str(tmp_path / f"w{n}"), group, topic, session_ms=5000)
                workers.append(w)
                live.append(w)
            elif action == "leave":
                w = live.pop(rng.randrange(len(live)))
                w.stop()
            else:
                w = live.pop(rng.randrange(len(live)))
                w.kill()
            time.sleep(rng.uniform(0.1, 1.5))
        wait_until(lambda: stable_with(broker, len(live), group), timeout=120, what="the group to settle")
        # The coordinator counts a partition given when it answers; the worker logs it once
        # its poll has applied the answer: wait for that too.
        wait_until(lambda: sorted(p for w in live for p in w.owned()) == list(range(60)), timeout=60,
                   what="every partition to have exactly one owner")
        counts = [len(w.owned()) for w in live]
        assert max(counts) - min(counts) <= 1
    finally:
        acked = load.stop()
    wait_until(lambda: all_consumed(workers, acked), timeout=120, what="every record to be consumed")
    assert_one_owner_at_a_time(workers)
    for w in live:
        w.stop()


def _poll_until(consumers, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(50)
        if predicate():
            return
    raise AssertionError("timed out")


def test_a_member_that_stops_polling_gives_its_partitions_up_and_rejoins_when_it_polls_again(broker):
    topic, group = "stops-polling", "stops-polling-group"
    create_topic(broker, topic, 4)
    revoked = []
    with Consumer(broker.bootstrap, group_id=group, max_poll_interval_ms=1500) as slow, \
            Consumer(broker.bootstrap, group_id=group) as busy:
        slow.subscribe([topic], on_revoke=lambda tps, lost=False: revoked.append((set(tps), lost)))
        busy.subscribe([topic])
        _poll_until([slow, busy], lambda: len(slow.assignment()) == 2 and len(busy.assignment()) == 2)
        # slow stops polling: after max_poll_interval_ms its heartbeat thread leaves the group.
        deadline = time.monotonic() + 30
        while len(busy.assignment()) != 4 and time.monotonic() < deadline:
            busy.poll(100)
        assert len(busy.assignment()) == 4
        _poll_until([slow, busy], lambda: len(slow.assignment()) == 2 and len(busy.assignment()) == 2)
        assert any(lost and len(tps) == 2 for tps, lost in revoked)  # lost, not handed over


def test_pattern_subscription_commit_async_and_committed(broker):
    group = "pattern-group"
    create_topic(broker, "orders-eu", 1)
    create_topic(broker, "orders-us", 1)
    create_topic(broker, "other", 1)
    with Producer(broker.bootstrap, linger_ms=0) as p:
        for t in ("orders-eu", "orders-us", "other"):
            p.send(t, value=b"x", partition=0)
        p.flush()
    done = threading.Event()
    with Consumer(broker.bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.subscribe(pattern=r"orders-.*")
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += c.poll(100)
        assert {r.topic for r in got} == {"orders-eu", "orders-us"}
        assert c.assignment() == {TopicPartition("orders-eu", 0), TopicPartition("orders-us", 0)}
        assert c.committed(TopicPartition("orders-eu", 0)) is None
        result = {}
        c.commit_async(callback=lambda offsets, err: (result.update(offsets=offsets, err=err), done.set()))
        assert done.wait(30) and result["err"] is None
        assert c.committed(TopicPartition("orders-eu", 0)) == 1
        with pytest.raises(Exception) as e:
            c.commit({TopicPartition("other", 0): 1})  # not assigned to this member
        assert "not assigned" in str(e.value)
