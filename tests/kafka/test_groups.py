"""Consumer groups through the Kafka protocol, judged by real clients: confluent-kafka
(librdkafka), kafka-python, aiokafka and kcat against one broker of this module.

The broker's group settings are lowered so rebalances take seconds: the initial rebalance
delay (Kafka's 3 s) to 200 ms, the shortest session timeout a member may ask for to 1 s.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import uuid

import pytest
from confluent_kafka import Consumer as KafkaConsumer, KafkaError, Producer as KafkaProducer, TopicPartition
from confluent_kafka.admin import AdminClient

from odradek.local import LocalBroker

GROUP_SETTINGS = {"group.initial.rebalance.delay.ms": 200, "group.min.session.timeout.ms": 1000,
                  "shutdown.timeout.ms": 10000}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    b = LocalBroker(str(tmp_path_factory.mktemp("kafka-groups")), GROUP_SETTINGS, start_timeout=240).start()
    try:
        yield b
    finally:
        b.discard()  # kill -9: its data is thrown away


@pytest.fixture
def bootstrap(broker) -> str:
    return broker.bootstrap


@pytest.fixture
def group() -> str:
    return f"g-{uuid.uuid4().hex[:10]}"


def make_topic(bootstrap: str, partitions: int = 1) -> str:
    """A new topic (through the bundled Admin: CreateTopics on the Kafka listener is another change's)."""
    from odradek import Admin
    name = f"t-{uuid.uuid4().hex[:10]}"
    with Admin(bootstrap) as admin:
        admin.create_topic(name, partitions)
    return name


def produce(bootstrap: str, topic: str, values: list, partition: int | None = None, spread: int = 0) -> None:
    """``values`` to ``partition``, or round-robin over partitions 0..spread-1, or where librdkafka's
    partitioner puts them (which, on a loaded machine, can be one partition for all of them)."""
    p = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i, v in enumerate(values):
        if spread:
            p.produce(topic, value=v, partition=i % spread)
        elif partition is None:
            p.produce(topic, value=v)
        else:
            p.produce(topic, value=v, partition=partition)
    assert p.flush(120) == 0


def consumer(bootstrap: str, group: str, **extra) -> KafkaConsumer:
    """A confluent-kafka consumer (an ``extra`` value None removes that setting)."""
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, **extra}
    return KafkaConsumer({k: v for k, v in conf.items() if v is not None})


def poll_values(c: KafkaConsumer, count: int, wait: float = 60) -> list:
    out, deadline = [], time.monotonic() + wait
    while len(out) < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        out.append(m.value())
    return out


# ---- the consumer protocol's bytes (no broker) --------------------------------------------------

def test_consumer_protocol_assignment_and_subscription_round_trip_and_garbage_decodes_to_nothing():
    from odradek.core.kafka.groups import (decode_assignment, decode_subscription, encode_assignment,
                                              encode_subscription)
    entries = [{"topic": "orders", "partitions": [0, 2]}, {"topic": "é", "partitions": []}]
    assert decode_assignment(encode_assignment(entries)) == entries
    assert decode_subscription(encode_subscription(["a", "b"])) == ["a", "b"]
    for garbage in (b"", b"\x00", b"\x00\x00\x7f\xff\xff\xff", b"\x00\x00\x00\x00\x00\x01\x00\x09ab"):
        assert decode_assignment(garbage) == [] and decode_subscription(garbage) == []


def test_every_group_api_a_kafka_client_sends_is_advertised_by_api_versions():
    from odradek.core.kafka.apis import REGISTRY, api_versions
    advertised = {k["api_key"]: (k["min_version"], k["max_version"]) for k in api_versions(3, {})["api_keys"]}
    # the versions librdkafka 2.x, kafka-python 3.x and aiokafka negotiate fall inside these ranges
    wanted = {8: (2, 9), 9: (1, 9), 10: (0, 5), 11: (0, 9), 12: (0, 4), 13: (0, 5), 14: (0, 5), 15: (0, 5),
              16: (0, 5), 42: (0, 2), 68: (0, 1), 69: (0, 1)}
    assert {k: advertised[k] for k in wanted} == wanted
    assert set(advertised) == set(REGISTRY)


# ---- consuming by group, committing, resuming ---------------------------------------------------

def test_confluent_consumer_group_commits_and_a_new_consumer_resumes_from_the_commit(bootstrap, group):
    topic = make_topic(bootstrap, 3)
    # every partition gets records, so each has a position to commit (an empty one has none)
    produce(bootstrap, topic, [b"a%d" % i for i in range(60)], spread=3)
    c = consumer(bootstrap, group)
    c.subscribe([topic])
    first = poll_values(c, 60)
    assert sorted(first) == sorted(b"a%d" % i for i in range(60))
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    assert sum(tp.offset for tp in committed) == 60
    c.close()
    produce(bootstrap, topic, [b"b%d" % i for i in range(30)])
    c = consumer(bootstrap, group)
    c.subscribe([topic])
    try:
        second = poll_values(c, 30)
        assert sorted(second) == sorted(b"b%d" % i for i in range(30))
        assert c.poll(1.0) is None  # nothing before the commit came again
    finally:
        c.close()


def test_kafka_python_consumer_group_commits_and_resumes(bootstrap, group):
    import kafka
    topic = make_topic(bootstrap, 2)
    produce(bootstrap, topic, [b"k%d" % i for i in range(40)])

    def run(count: int) -> list:
        c = kafka.KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=False, consumer_timeout_ms=20000)
        got = []
        for m in c:
            got.append(m.value)
            if len(got) == count:
                break
        c.commit()
        c.close()
        return got

    assert sorted(run(40)) == sorted(b"k%d" % i for i in range(40))
    produce(bootstrap, topic, [b"l%d" % i for i in range(10)])
    assert sorted(run(10)) == sorted(b"l%d" % i for i in range(10))


def test_kcat_consumes_as_a_group_and_resumes_from_its_commits(bootstrap, group, kcat):
    topic = make_topic(bootstrap, 2)
    produce(bootstrap, topic, [b"c%d" % i for i in range(20)])

    def run() -> list:
        out = subprocess.run([kcat, "-b", bootstrap, "-G", group, "-X", "auto.offset.reset=earliest", "-e", "-J",
                              "-X", "session.timeout.ms=6000", topic],
                             capture_output=True, timeout=120, check=True)
        return [json.loads(line)["payload"] for line in out.stdout.splitlines() if line.startswith(b"{")]

    assert sorted(run()) == sorted(f"c{i}" for i in range(20))
    produce(bootstrap, topic, [b"d%d" % i for i in range(6)])
    assert sorted(run()) == sorted(f"d{i}" for i in range(6))


def test_aiokafka_consumer_group_consumes_commits_and_resumes(bootstrap, group):
    from aiokafka import AIOKafkaConsumer
    topic = make_topic(bootstrap, 2)
    produce(bootstrap, topic, [b"x%d" % i for i in range(30)])

    async def run(count: int) -> list:
        c = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, session_timeout_ms=6000, heartbeat_interval_ms=1000)
        await c.start()
        got = []
        try:
            async with asyncio.timeout(60):
                while len(got) < count:
                    batch = await c.getmany(timeout_ms=500)
                    got += [m.value for ms in batch.values() for m in ms]
            await c.commit()
        finally:
            await c.stop()
        return got

    assert sorted(asyncio.run(run(30))) == sorted(b"x%d" % i for i in range(30))
    produce(bootstrap, topic, [b"y%d" % i for i in range(5)])
    assert sorted(asyncio.run(run(5))) == sorted(b"y%d" % i for i in range(5))


# ---- rebalances --------------------------------------------------------------------------------

MEMBER = textwrap.dedent("""
    import sys, time
    from confluent_kafka import Consumer
    bootstrap, group, topic = sys.argv[1:4]
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 4000, "heartbeat.interval.ms": 500})
    c.subscribe([topic], on_assign=lambda c, ps: print("ASSIGN", ",".join(str(p.partition) for p in ps), flush=True))
    while True:
        m = c.poll(0.2)
        if m is None or m.error():
            continue
        print("GOT", m.partition(), m.offset(), m.value().decode(), flush=True)
        c.commit(message=m, asynchronous=False)
""")


class Member:
    def __init__(self, bootstrap: str, group: str, topic: str, path: str):
        self.out = open(path, "w+")
        self.proc = subprocess.Popen([sys.executable, "-c", MEMBER, bootstrap, group, topic], stdout=self.out,
                                     stderr=subprocess.DEVNULL)

    def lines(self) -> list[str]:
        """The complete lines printed so far (a line being written is read on the next call)."""
        with open(self.out.name) as f:
            text = f.read()
        return text[:text.rfind("\n") + 1].splitlines()

    def values(self) -> set:
        return {line.split()[3] for line in self.lines() if line.startswith("GOT ")}

    def assigned(self) -> set:
        last = [line for line in self.lines() if line.startswith("ASSIGN")]
        return {int(p) for p in last[-1].split()[1].split(",")} if last and len(last[-1].split()) > 1 else set()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)
        self.out.close()


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.slow
def test_three_members_share_partitions_and_survive_one_killed_by_sigkill(bootstrap, group, tmp_path):
    topic = make_topic(bootstrap, 6)
    members = [Member(bootstrap, group, topic, str(tmp_path / f"m{i}.out")) for i in range(3)]
    try:
        wait_for(lambda: sorted(p for m in members for p in m.assigned()) == list(range(6))
                 and all(m.assigned() for m in members), 90, "the 6 partitions spread over 3 members")
        produce(bootstrap, topic, [f"r{i}".encode() for i in range(300)])
        wait_for(lambda: len(set().union(*(m.values() for m in members))) == 300, 60, "300 records consumed")
        victim = members.pop(0)
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.stop()
        killed_at = time.monotonic()
        produce(bootstrap, topic, [f"s{i}".encode() for i in range(300)])
        wait_for(lambda: sorted(p for m in members for p in m.assigned()) == list(range(6)), 60,
                 "the survivors to take over every partition after the session timeout")
        assert time.monotonic() - killed_at >= 3  # not before the session timeout (4 s) less a margin
        wanted = {f"r{i}" for i in range(300)} | {f"s{i}" for i in range(300)}
        got = lambda: set().union(victim.values(), *(m.values() for m in members))  # noqa: E731
        wait_for(lambda: got() >= wanted, 60, "every record consumed, none stuck")
    finally:
        for m in members:
            m.stop()


def test_a_static_member_that_restarts_rejoins_without_a_rebalance(bootstrap, group):
    from odradek.group import GroupAdmin
    topic = make_topic(bootstrap, 2)
    revoked = []
    a = consumer(bootstrap, group, **{"group.instance.id": "static-a"})
    a.subscribe([topic], on_revoke=lambda c, ps: revoked.append(ps))
    b = consumer(bootstrap, group, **{"group.instance.id": "static-b"})
    b.subscribe([topic])
    with GroupAdmin(bootstrap) as admin:
        def settled():
            a.poll(0.1)
            b.poll(0.1)
            d = admin.describe(group)
            return d["group_state"] == "Stable" and len(d["members"]) == 2 and \
                all(m["assignment"] for m in d["members"])
        wait_for(settled, 60, "two static members with a partition each")
        before = admin.describe(group)
        b.close()  # a static member does not leave the group on close
        b = consumer(bootstrap, group, **{"group.instance.id": "static-b"})
        b.subscribe([topic])
        produce(bootstrap, topic, [b"after"], partition=0)
        produce(bootstrap, topic, [b"after"], partition=1)
        got = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            for c in (a, b):
                m = c.poll(0.2)
                if m is not None and not m.error():
                    got.append(m.value())
        after = admin.describe(group)
    try:
        assert got == [b"after", b"after"]
        assert after["group_epoch"] == before["group_epoch"]  # the same generation: no rebalance
        assert revoked == []
        ids = {m["instance_id"]: m["member_id"] for m in after["members"]}
        old = {m["instance_id"]: m["member_id"] for m in before["members"]}
        assert ids["static-a"] == old["static-a"] and ids["static-b"] != old["static-b"]
    finally:
        a.close()
        b.close()


# ---- KIP-848: group.protocol=consumer -----------------------------------------------------------------

def test_confluent_consumer_protocol_kip848_consumes_commits_and_resumes(bootstrap, group):
    topic = make_topic(bootstrap, 2)
    produce(bootstrap, topic, [b"n%d" % i for i in range(40)])
    c = consumer(bootstrap, group, **{"group.protocol": "consumer", "session.timeout.ms": None})
    c.subscribe([topic])
    assert sorted(poll_values(c, 40)) == sorted(b"n%d" % i for i in range(40))
    c.commit(asynchronous=False)
    c.close()
    produce(bootstrap, topic, [b"o%d" % i for i in range(8)])
    c = consumer(bootstrap, group, **{"group.protocol": "consumer", "session.timeout.ms": None})
    c.subscribe([topic])
    try:
        assert sorted(poll_values(c, 8)) == sorted(b"o%d" % i for i in range(8))
        admin = AdminClient({"bootstrap.servers": bootstrap})
        d = admin.describe_consumer_groups([group], request_timeout=30)[group].result()
        assert len(d.members) == 1
        assert sorted(tp.partition for tp in d.members[0].assignment.topic_partitions) == [0, 1]
    finally:
        c.close()


def test_a_bundled_consumer_and_a_kip848_confluent_consumer_share_one_group(bootstrap, group):
    from odradek import Consumer
    topic = make_topic(bootstrap, 4)
    ours = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest")
    ours.subscribe([topic])
    theirs = consumer(bootstrap, group, **{"group.protocol": "consumer", "session.timeout.ms": None})
    theirs.subscribe([topic])
    try:
        def split():
            ours.poll(timeout_ms=100)
            theirs.poll(0.1)
            mine = {tp.partition for tp in ours.assignment()}
            other = {tp.partition for tp in theirs.assignment()}
            return len(mine) == 2 and len(other) == 2 and mine | other == {0, 1, 2, 3}
        wait_for(split, 60, "4 partitions shared 2 and 2 between the two kinds of client")
        produce(bootstrap, topic, [b"m%d" % i for i in range(80)])
        got: list = []
        deadline = time.monotonic() + 60
        while len(got) < 80 and time.monotonic() < deadline:
            got += [r.value for r in ours.poll(timeout_ms=100)]
            m = theirs.poll(0.1)
            if m is not None and not m.error():
                got.append(m.value())
        assert sorted(got) == sorted(b"m%d" % i for i in range(80))  # each record once, by one of them
    finally:
        ours.close()
        theirs.close()


# ---- a coordinator restart -------------------------------------------------------------------------

@pytest.mark.slow
def test_a_classic_group_survives_its_coordinators_restart_without_a_rebalance(tmp_path):
    """The group's record (generation, leader, members, assignments) is reloaded: the members
    go on heartbeating in their generation; the committed offsets are there."""
    b = LocalBroker(str(tmp_path / "broker"), GROUP_SETTINGS, start_timeout=240).start()
    group = f"g-{uuid.uuid4().hex[:10]}"
    c = None
    try:
        bootstrap = b.bootstrap
        # A new broker's first Kafka connections can wait seconds on a loaded machine: let them
        # be made before anything here is timed.
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=120)
        topic = make_topic(bootstrap, 2)
        revoked = []
        c = consumer(bootstrap, group)
        c.subscribe([topic], on_revoke=lambda cons, ps: revoked.append(ps))
        produce(bootstrap, topic, [b"p%d" % i for i in range(20)], spread=2)
        assert len(poll_values(c, 20)) == 20
        c.commit(asynchronous=False)
        old_pid = b.actor("group_coordinator")["pid"]
        b.actor_process("group_coordinator").kill()
        wait_for(lambda: b.actor("group_coordinator")["pid"] not in (None, 0, old_pid), 60,
                 "the supervisor to restart the group coordinator")
        produce(bootstrap, topic, [b"q%d" % i for i in range(10)])
        got = poll_values(c, 10)
        deadline = time.monotonic() + 8  # heartbeats go on (every 3 s) without a rebalance
        while time.monotonic() < deadline:
            c.poll(0.2)
        assert revoked == [] and len(c.assignment()) == 2
        assert sorted(got) == sorted(b"q%d" % i for i in range(10))
        c.commit(asynchronous=False)  # accepted: the same member and generation
        assert sum(tp.offset for tp in c.committed([TopicPartition(topic, p) for p in range(2)], timeout=10)) == 30
    finally:
        if c is not None:
            c.close()
        b.discard()


# ---- administration ------------------------------------------------------------------------------

def stable_group(bootstrap: str, group: str, topic: str) -> KafkaConsumer:
    c = consumer(bootstrap, group)
    c.subscribe([topic])
    produce(bootstrap, topic, [b"v%d" % i for i in range(10)])
    assert len(poll_values(c, 10)) == 10
    c.commit(asynchronous=False)
    return c


def test_admin_clients_list_describe_and_delete_classic_groups(bootstrap, group):
    import kafka.admin
    topic = make_topic(bootstrap, 1)
    c = stable_group(bootstrap, group, topic)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    kp = kafka.admin.KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        listed = admin.list_consumer_groups(request_timeout=30).result()
        assert group in {g.group_id for g in listed.valid}
        d = admin.describe_consumer_groups([group], request_timeout=30)[group].result()
        assert str(d.state).endswith("STABLE") and d.partition_assignor == "range"
        assert [tp.topic for m in d.members for tp in m.assignment.topic_partitions] == [topic]
        assert {"group_id": group, "protocol_type": "consumer", "group_state": "Stable", "group_type": "Classic"} \
            in kp.list_groups()
        kd = kp.describe_groups([group])[group]
        assert (kd["group_state"], kd["protocol_type"], kd["protocol_data"]) == ("Stable", "consumer", "range")
        assert kd["members"][0]["member_assignment"]["assigned_partitions"] == [{"topic": topic, "partitions": [0]}]
        assert kp.list_group_offsets({group: None})[group][kafka.TopicPartition(topic, 0)].offset == 10
        refused = admin.delete_consumer_groups([group], request_timeout=30)[group]
        with pytest.raises(Exception) as e:
            refused.result()
        assert e.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
        c.close()
        c = None
        assert kp.delete_groups([group]) == {group: "OK"}
        assert group not in {g.group_id for g in admin.list_consumer_groups(request_timeout=30).result().valid}
    finally:
        if c is not None:
            c.close()
        kp.close()


def test_odradek_groups_describe_shows_the_lag_of_a_classic_group(bootstrap, group):
    topic = make_topic(bootstrap, 1)
    c = stable_group(bootstrap, group, topic)
    try:
        produce(bootstrap, topic, [b"more"] * 7)
        out = subprocess.run([sys.executable, "-m", "odradek", "groups", "--bootstrap-server", bootstrap,
                              "--describe", group], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        row = next(line.split() for line in out.stdout.splitlines() if line.startswith(topic))
        assert row[1:5] == ["0", "10", "17", "7"]  # partition, committed, log end, lag
        listing = subprocess.run([sys.executable, "-m", "odradek", "groups", "--bootstrap-server", bootstrap,
                                  "--list"], capture_output=True, text=True, timeout=60)
        assert f"{group}\tStable" in listing.stdout
    finally:
        c.close()


# ---- one group, one kind -------------------------------------------------------------------------

def test_a_bundled_kip848_member_cannot_join_a_classic_group_with_members(bootstrap, group):
    from odradek import Consumer
    from odradek.group import GroupAdmin
    topic = make_topic(bootstrap, 1)
    c = stable_group(bootstrap, group, topic)
    ours = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest")
    try:
        ours.subscribe([topic])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            assert ours.poll(timeout_ms=200) == {} or not ours.assignment()
            c.poll(0.1)
        assert not ours.assignment()  # refused (GROUP_ID_NOT_FOUND), as Kafka without online migration
        with GroupAdmin(bootstrap) as admin:
            d = admin.describe(group)
        assert (d["group_type"], d["group_state"], len(d["members"])) == ("classic", "Stable", 1)
    finally:
        ours.close()
        c.close()


def test_a_classic_join_to_a_kip848_group_with_members_is_inconsistent_group_protocol(bootstrap, group):
    from odradek import Consumer
    from odradek.core.kafka import schema
    topic = make_topic(bootstrap, 1)
    ours = Consumer(bootstrap, group_id=group, auto_offset_reset="earliest")
    try:
        ours.subscribe([topic])
        deadline = time.monotonic() + 30
        while not ours.assignment() and time.monotonic() < deadline:
            ours.poll(timeout_ms=200)
        assert ours.assignment()
        join = schema.encode_request(11, 5, {
            "group_id": group, "session_timeout": 6000, "rebalance_timeout": 6000, "member_id": "",
            "group_instance_id": None, "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": b""}]})
        answer = kafka_request(bootstrap, 11, 5, join)
        assert schema.decode_response(11, 5, answer[8:])["error_code"] == KafkaError.INCONSISTENT_GROUP_PROTOCOL
    finally:
        ours.close()


# ---- bad input -----------------------------------------------------------------------------------

def kafka_request(bootstrap: str, api: int, version: int, body: bytes, corr: int = 1) -> bytes:
    host, port = bootstrap.split(":")
    client = b"bad"
    raw = struct.pack(">hhih", api, version, corr, len(client)) + client + body
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", len(raw)) + raw)
        s.settimeout(10)
        try:
            data = s.recv(1 << 20)
        except (socket.timeout, ConnectionResetError):
            return b""
    return data


def test_garbage_and_huge_group_requests_leave_the_coordinator_serving(broker, bootstrap, group):
    import random
    from odradek.core.kafka import schema
    rng = random.Random(7)
    for i in range(120):
        api = rng.choice([8, 9, 10, 11, 12, 13, 14, 15, 16, 42])
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
        kafka_request(bootstrap, api, rng.randrange(0, 6), body, i)
    huge = schema.encode_request(11, 5, {
        "group_id": group, "session_timeout": 6000, "rebalance_timeout": 6000, "member_id": "",
        "group_instance_id": None, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"x" * (2 << 20)}]})
    answer = kafka_request(bootstrap, 11, 5, huge)
    assert len(answer) > 8
    code = schema.decode_response(11, 5, answer[8:])["error_code"]
    assert code == KafkaError.INVALID_REQUEST
    topic = make_topic(bootstrap, 1)
    c = stable_group(bootstrap, group, topic)  # the coordinator still serves groups
    c.close()
    restarts = {a.get("name"): a.get("restarts", 0) for a in broker.status().get("actors", [])} \
        if isinstance(broker.status().get("actors"), list) else {}
    assert not any(restarts.values()), restarts


# ---- group ids: any non-empty string, as Kafka ----------------------------------------------------------

@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_group_id_with_spaces_and_non_ascii_characters_consumes_and_commits(bootstrap, protocol):
    """Kafka takes any non-empty string as a group id; Odradek took printable ASCII without
    spaces only, and librdkafka's commit for such a group waited 45 s "Waiting for
    coordinator" (FindCoordinator answered INVALID_GROUP_ID, which it retries)."""
    group = f"équipe de nuit {uuid.uuid4().hex[:6]} ☕"
    topic = make_topic(bootstrap)
    produce(bootstrap, topic, [b"a", b"b", b"c"], partition=0)
    extra = {"group.protocol": "consumer", "session.timeout.ms": None} if protocol == "consumer" else {}
    c = consumer(bootstrap, group, **extra)
    try:
        c.subscribe([topic])
        assert poll_values(c, 3) == [b"a", b"b", b"c"]
        began = time.monotonic()
        c.commit(asynchronous=False)
        assert time.monotonic() - began < 10
        assert c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 3
    finally:
        c.close()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=30)
    assert described.group_id == group
