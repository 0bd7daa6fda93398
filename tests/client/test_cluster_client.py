"""The client against several brokers whose leaders move (scripted: tests/client/scripted_broker.py).

Each test scripts one cluster event (a leader moved, a broker died, the controller or the
group coordinator moved, a fenced leader epoch) and checks what Kafka's clients guarantee:
every record's future resolves exactly once, a partition's records land in send order,
a consumer continues from its position (no record skipped or repeated), and requests go to
the broker that leads, controls or coordinates.
"""
from __future__ import annotations

import collections
import time

import pytest

from odradek.core.protocol import ApiKey, ErrorCode
from odradek import Admin, Consumer, Producer, TopicPartition, errors
from odradek.cluster import Cluster

TP = TopicPartition("t", 0)


def _apis(broker, api) -> list:
    return [body for a, body in list(broker.requests) if a == api]


def _send_tracked(p: Producer, topic: str, values: list, partition: int | None = 0) -> tuple[list, collections.Counter]:
    """Send values; count how many times each handle's done-callback runs."""
    calls: collections.Counter = collections.Counter()
    handles = []
    for v in values:
        h = p.send(topic, v, partition=partition)
        h.add_done_callback(lambda h, v=v: calls.update([v]))
        handles.append(h)
    return handles, calls


def _values(n: int, prefix: bytes = b"r") -> list:
    return [prefix + b"-%05d" % i for i in range(n)]


# ---- producer ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_in_flight", [1, 5])
def test_producer_retries_to_the_new_leader_after_not_leader_and_keeps_the_order(scripted_cluster, max_in_flight):
    cl = scripted_cluster({"t": 1})
    b0, b1, _ = cl.brokers.values()
    values = _values(3000)
    with Producer(cl.bootstrap, linger_ms=1, batch_size=2000, retry_backoff_ms=20,
                  max_in_flight=max_in_flight) as p:
        assert p.send("t", b"first", partition=0).result(10).offset == 0
        handles, calls = _send_tracked(p, "t", values[:1500])
        cl.move_leader("t", 0, 1)  # with batches in flight: broker 0 answers NOT_LEADER_OR_FOLLOWER
        more, more_calls = _send_tracked(p, "t", values[1500:])
        p.flush(timeout=30)
    handles += more
    calls += more_calls
    assert all(h.exception() is None for h in handles)
    assert set(calls.values()) == {1} and len(calls) == len(values)  # each future resolved exactly once
    offsets = [h.result().offset for h in handles]
    assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
    assert [r.value for r in cl.records("t", 0)] == [b"first"] + values  # in send order, no gap, no duplicate
    assert _apis(b1, ApiKey.PRODUCE), "nothing was sent to the new leader"


def test_producer_follows_the_leader_when_the_old_one_dies_using_a_broker_learned_from_metadata(scripted_cluster):
    cl = scripted_cluster({"t": 2})
    b0, b1, b2 = cl.brokers.values()
    # The bootstrap list names broker 0 alone: after it dies, metadata must come from 1 or 2.
    with Producer(b0.bootstrap, linger_ms=1, batch_size=500, retry_backoff_ms=20, max_in_flight=5) as p:
        first, calls0 = _send_tracked(p, "t", _values(200, b"a"), partition=None)
        p.flush(timeout=10)
        b0.kill()
        cl.move_leader("t", 0, 1)
        cl.move_leader("t", 1, 2)
        second, calls1 = _send_tracked(p, "t", _values(400, b"b"), partition=None)
        p.flush(timeout=30)
    for h in first + second:
        assert h.exception() is None, h.exception()
    assert set(calls0.values()) == {1} and set(calls1.values()) == {1}
    assert _apis(b1, ApiKey.METADATA) or _apis(b2, ApiKey.METADATA)
    assert _apis(b1, ApiKey.PRODUCE) and _apis(b2, ApiKey.PRODUCE)
    for part in (0, 1):
        got = [r.value for r in cl.records("t", part)]
        sent = [v for h, v in zip(first + second, _values(200, b"a") + _values(400, b"b")) if h.partition == part]
        assert got == sent  # per-partition order across the leader change


def test_a_connection_lost_mid_request_is_retried_at_the_new_leader_in_order(scripted_cluster):
    cl = scripted_cluster({"t": 1})
    b0, b1, _ = cl.brokers.values()
    with Producer(cl.bootstrap, linger_ms=0, retry_backoff_ms=20, max_in_flight=1) as p:
        assert p.send("t", b"0", partition=0).result(10).offset == 0
        b0.faults.append(("drop",))  # the next produce never gets an answer (nothing appended)
        cl.move_leader("t", 0, 1)
        handles, calls = _send_tracked(p, "t", [b"1", b"2", b"3"])
        p.flush(timeout=10)
    assert [h.result().offset for h in handles] == [1, 2, 3]
    assert set(calls.values()) == {1}
    assert [r.value for r in cl.records("t", 0)] == [b"0", b"1", b"2", b"3"]


@pytest.mark.parametrize("code", [ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                                  ErrorCode.REQUEST_TIMED_OUT, ErrorCode.LEADER_NOT_AVAILABLE,
                                  ErrorCode.UNKNOWN_TOPIC_OR_PARTITION])
def test_acks_all_retries_retriable_errors_until_delivered(scripted_cluster, code):
    cl = scripted_cluster({"t": 1})
    b0 = cl.brokers[0]
    b0.faults.extend([("error", code)] * 3)
    with Producer(cl.bootstrap, acks="all", linger_ms=0, retry_backoff_ms=10) as p:
        assert p.acks == -1
        assert p.send("t", b"v", partition=0).result(10).offset == 0
        assert p.metrics()["retries"] == 3
    assert all(body["acks"] == -1 for body in _apis(b0, ApiKey.PRODUCE))
    assert all(body["timeout_ms"] < 30000 for body in _apis(b0, ApiKey.PRODUCE))  # answered before we give up


def test_the_default_is_acks_all():
    assert Producer.__init__.__kwdefaults__["acks"] == "all"


def test_a_partition_without_a_leader_waits_without_hammering_metadata(scripted_cluster):
    cl = scripted_cluster({"t": 1}, brokers=2)
    b0, b1 = cl.brokers.values()
    with Producer(cl.bootstrap, linger_ms=0, retry_backoff_ms=100) as p:
        p.partitions_for("t")
        cl.move_leader("t", 0, -1)  # an election in progress
        before = len(_apis(b0, ApiKey.METADATA)) + len(_apis(b1, ApiKey.METADATA))
        h = p.send("t", b"v", partition=0)
        time.sleep(1.0)
        during = len(_apis(b0, ApiKey.METADATA)) + len(_apis(b1, ApiKey.METADATA)) - before
        assert not h.done()
        cl.move_leader("t", 0, 1)
        assert h.result(10).offset == 0
    assert 2 <= during <= 15, during  # about one refresh per retry_backoff_ms, not a busy loop


# ---- consumer ---------------------------------------------------------------------------------------
def _fill(cl, n: int, partition: int = 0) -> list:
    values = _values(n, b"c")
    with Producer(cl.bootstrap, linger_ms=0, batch_size=300) as p:
        for v in values:
            p.send("t", v, partition=partition)
        p.flush(10)
    return values


def _read(c: Consumer, n: int, timeout: float = 20.0) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += c.poll(timeout_ms=50, max_records=n - len(out))
    return out


def test_consumer_continues_from_its_position_after_fenced_leader_epoch(scripted_cluster):
    cl = scripted_cluster({"t": 1})
    b0, b1, _ = cl.brokers.values()
    cl.move_leader("t", 0, 1)  # epoch 1 at broker 1
    values = _fill(cl, 300)
    with Consumer(cl.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=20, max_partition_fetch_bytes=1000,
                  fetch_max_wait_ms=10) as c:
        c.assign([TP])
        got = _read(c, 100)
        cl.move_leader("t", 0, 1)  # same leader, epoch 2: the consumer's epoch 1 is fenced
        got += _read(c, 200)
        assert c.position(TP) == 300
    assert [r.value for r in got] == values and [r.offset for r in got] == list(range(300))
    answers = [p.get("current_leader_epoch") for body in _apis(b1, ApiKey.FETCH)
               for t in body["topics"] for p in t["partitions"]]
    assert 1 in answers and 2 in answers and set(answers) <= {1, 2}
    assert not _apis(b0, ApiKey.FETCH)


def test_consumer_moves_to_the_new_leader_when_the_old_one_dies(scripted_cluster):
    cl = scripted_cluster({"t": 1})
    b0, b1, b2 = cl.brokers.values()
    values = _fill(cl, 300)
    with Consumer(b0.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=20, max_partition_fetch_bytes=1000,
                  fetch_max_wait_ms=10) as c:
        c.assign([TP])
        got = _read(c, 120)
        b0.kill()  # the connection drops; broker 0 is gone for good
        cl.move_leader("t", 0, 2)
        got += _read(c, 180)
    assert [r.offset for r in got] == list(range(300)) and [r.value for r in got] == values
    epochs = {p["current_leader_epoch"] for body in _apis(b2, ApiKey.FETCH)
              for t in body["topics"] for p in t["partitions"]}
    assert epochs == {1}


def test_consumer_retries_the_same_broker_after_unknown_leader_epoch(scripted_cluster):
    cl = scripted_cluster({"t": 1}, brokers=2)
    b0 = cl.brokers[0]
    values = _fill(cl, 50)
    b0.faults.extend([("error", ErrorCode.UNKNOWN_LEADER_EPOCH, ApiKey.FETCH)] * 2)
    with Consumer(cl.bootstrap, auto_offset_reset="earliest", retry_backoff_ms=20, fetch_max_wait_ms=10) as c:
        c.assign([TP])
        got = _read(c, 50)
    assert [r.value for r in got] == values


def test_fetches_are_grouped_by_leader_and_carry_each_partitions_leader_epoch(scripted_cluster):
    cl = scripted_cluster({"t": 4})
    cl.move_leader("t", 1, 1)
    cl.move_leader("t", 2, 2)
    cl.move_leader("t", 3, 2)
    cl.move_leader("t", 3, 2)  # epoch 2
    with Consumer(cl.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=10) as c:
        c.assign([TopicPartition("t", i) for i in range(4)])
        for _ in range(5):
            c.poll(timeout_ms=20)
    seen = {}
    for node, b in cl.brokers.items():
        for body in _apis(b, ApiKey.FETCH):
            assert body["replica_id"] == -1
            for t in body["topics"]:
                for p in t["partitions"]:
                    seen.setdefault(p["index"], set()).add((node, p["current_leader_epoch"]))
        for body in _apis(b, ApiKey.LIST_OFFSETS):
            for t in body["topics"]:
                for p in t["partitions"]:
                    assert cl.leaders[("t", p["index"])] == [node, p["current_leader_epoch"]]
    assert seen == {0: {(0, 0)}, 1: {(1, 1)}, 2: {(2, 1)}, 3: {(2, 2)}}


def test_offset_out_of_range_on_the_new_leader_applies_auto_offset_reset(scripted_cluster):
    cl = scripted_cluster({"t": 1}, brokers=2)
    _fill(cl, 10)
    with Consumer(cl.bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=10, retry_backoff_ms=20) as c:
        c.assign([TP])
        c.seek(TP, 50)  # beyond the log end
        got = _read(c, 10)
    assert [r.offset for r in got] == list(range(10))


# ---- metadata ---------------------------------------------------------------------------------------
def test_metadata_falls_back_to_another_broker_when_the_bootstrap_one_is_dead(scripted_cluster):
    cl = scripted_cluster({"t": 1})
    b0, b1, b2 = cl.brokers.values()
    cluster = Cluster(f"{b0.bootstrap},{b1.bootstrap}", retry_backoff_ms=10)
    try:
        b0.kill()
        assert cluster.refresh(["t"])["brokers"]
        assert cluster.leader("t", 0) == 0
        # Learned brokers count too: with both bootstrap brokers dead, broker 2 answers.
        b1.kill()
        cl.move_leader("t", 0, 2)
        cluster.refresh(["t"])
        assert cluster.leader("t", 0) == 2 and _apis(b2, ApiKey.METADATA)
    finally:
        cluster.close()


def test_metadata_never_goes_back_to_an_older_leader_epoch(scripted_cluster):
    cl = scripted_cluster({"t": 1}, brokers=2)
    b0, b1 = cl.brokers.values()
    cluster = Cluster(b0.bootstrap)
    try:
        cl.move_leader("t", 0, 1)
        cluster.refresh(["t"])
        assert (cluster.leader("t", 0), cluster.leader_epoch("t", 0)) == (1, 1)
        cl.metadata_lag[0] = {("t", 0): [0, 0]}  # broker 0 has not heard of the election
        cluster.refresh(["t"])
        assert (cluster.leader("t", 0), cluster.leader_epoch("t", 0)) == (1, 1)
    finally:
        cluster.close()


def test_refreshes_are_retry_backoff_apart():
    cluster = Cluster("127.0.0.1:1", retry_backoff_ms=200)
    cluster.refresh_attempted_at = time.monotonic()
    assert 0.1 < cluster.refresh_due() <= 0.2
    assert cluster.maybe_refresh(["t"]) is False  # not attempted: too soon


# ---- admin ------------------------------------------------------------------------------------------
def test_admin_create_topics_goes_to_the_controller_and_follows_not_controller(scripted_cluster):
    cl = scripted_cluster({"t": 1})
    b0, b1, b2 = cl.brokers.values()
    cl.controller = 2
    with Admin(b0.bootstrap, retry_backoff_ms=10) as admin:
        assert admin.create_topic("new", partitions=3)["num_partitions"] == 3
        assert [b["topics"][0]["name"] for b in _apis(b2, ApiKey.CREATE_TOPICS)] == ["new"]
        assert not _apis(b0, ApiKey.CREATE_TOPICS) and not _apis(b1, ApiKey.CREATE_TOPICS)
        cl.controller = 1  # the controller moved; the client still thinks it is 2
        admin.create_topic("newer", partitions=1)
        assert len(_apis(b2, ApiKey.CREATE_TOPICS)) == 2  # answered NOT_CONTROLLER
        assert [b["topics"][0]["name"] for b in _apis(b1, ApiKey.CREATE_TOPICS)] == ["newer"]
        with pytest.raises(errors.TopicAlreadyExistsError):
            admin.create_topic("newer")
        b1.kill()
        cl.controller = 0  # the controller died: a new one is elected
        admin.create_topic("newest")
        assert [b["topics"][0]["name"] for b in _apis(b0, ApiKey.CREATE_TOPICS)] == ["newest"]


def test_admin_list_offsets_asks_each_leader_and_follows_a_moved_one(scripted_cluster):
    cl = scripted_cluster({"t": 2})
    _fill(cl, 7, partition=1)
    with Admin(cl.bootstrap, retry_backoff_ms=10) as admin:
        assert admin.list_offsets([TopicPartition("t", 0), TopicPartition("t", 1)]) == {
            TopicPartition("t", 0): 0, TopicPartition("t", 1): 7}
        cl.move_leader("t", 1, 2)
        assert admin.list_offsets([TopicPartition("t", 1)]) == {TopicPartition("t", 1): 7}
    assert _apis(cl.brokers[2], ApiKey.LIST_OFFSETS)


# ---- groups -----------------------------------------------------------------------------------------
def test_group_heartbeat_and_commit_find_the_coordinator_again_after_not_coordinator(scripted_cluster):
    cl = scripted_cluster({"t": 1})
    b0, b1, b2 = cl.brokers.values()
    values = _fill(cl, 20)
    with Consumer(cl.bootstrap, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False,
                  heartbeat_interval_ms=100, retry_backoff_ms=20, fetch_max_wait_ms=10) as c:
        c.subscribe(["t"])
        got = _read(c, 10)
        c.commit()
        assert cl.committed[("g", "t", 0)] == 10
        cl.coordinator = 1  # the offsets partition's leader moved: broker 0 answers NOT_COORDINATOR
        deadline = time.monotonic() + 10
        while not _apis(b1, ApiKey.CONSUMER_GROUP_HEARTBEAT) and time.monotonic() < deadline:
            got += c.poll(timeout_ms=50, max_records=20 - len(got))
        assert _apis(b1, ApiKey.CONSUMER_GROUP_HEARTBEAT), "the heartbeat did not follow the coordinator"
        got += _read(c, 20 - len(got))
        cl.coordinator = 2
        c.commit()  # broker 1 answers NOT_COORDINATOR per partition; the commit lands on broker 2
        assert c.committed(TP) == 20
    assert [r.value for r in got] == values
    assert _apis(b1, ApiKey.OFFSET_COMMIT) and _apis(b2, ApiKey.OFFSET_COMMIT)
    assert cl.committed[("g", "t", 0)] == 20
