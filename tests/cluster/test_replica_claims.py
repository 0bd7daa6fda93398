"""Who may fetch as a replica (issue 16, defect 1): a FETCH's ``replica_id`` is a claim that
the leader checks before it believes it.

With brokers 1 and 2 dead, one forged FETCH (``replica_id`` of a dead broker, ``fetch_offset``
2^62) used to put that broker back in the ISR: an acks=all produce was then acknowledged with
one real copy, and electing the forged "replica" lost it. Now a replica fetch must carry the
broker epoch of a live registration (the czxid of ``/brokers/ids/<id>``), only a member of the
replica set may fetch as a replica, and an offset beyond the leader's log end never counts as
progress (so never puts anyone in the ISR).
"""
from __future__ import annotations

import time

import pytest

from odradek import Producer
from odradek.errors import NotEnoughReplicasError
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from tests.cluster.fixtures import as_broker
from tests.cluster.test_faults import create_replicated_topic, wait_healed
from tests.cluster.verify import AckedLog, check_logs, read_all

pytestmark = pytest.mark.slow

TOPIC = "claims"
FUTURE = 2 ** 62


def produce(address: str, acked: AckedLog, prefix: bytes, n: int, topic: str = TOPIC, **settings) -> list:
    with Producer(address, acks="all", **settings) as producer:
        futures = []
        for i in range(n):
            value = b"%s-%d" % (prefix, i)
            futures.append(producer.send(topic, value, partition=0))
            acked.track(futures[-1], value)
        producer.flush(timeout=60)
    return futures


def forged_fetch(cluster, address: str, replica_id: int, fetch_offset: int, topic: str = TOPIC,
                 **extra) -> ErrorCode:
    """One FETCH as ``replica_id``, over a connection that proved it is that broker (with the
    cluster's secret: a client cannot, tests/cluster/test_inter_broker.py), so what is tested
    here is the leader's next check, the broker epoch; the top-level or the partition's error
    code (0: served)."""
    host, port = address.rsplit(":", 1)
    body = {"replica_id": replica_id, "max_wait_ms": 0, "min_bytes": 1, **extra,
            "topics": [{"name": topic, "partitions": [{"index": 0, "fetch_offset": fetch_offset,
                                                        "current_leader_epoch": -1}]}]}
    # proven as that broker: only a broker gets this far
    with BrokerConnection(host, int(port), client_id="forger", security=as_broker(cluster, replica_id)) as conn:
        try:
            answer = conn.request(ApiKey.FETCH, body, timeout=10)
        except OdradekError as exc:
            return exc.code
    return ErrorCode.of(answer.body["topics"][0]["partitions"][0]["error_code"])


def stays(cluster, what, condition, seconds: float = 2.0) -> None:
    """``condition()`` holds for ``seconds`` (replica.lag.time.max.ms is 2 s here: an ISR
    change a forged fetch caused would be recorded well within it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert condition(), what
        time.sleep(0.1)


def test_a_forged_fetch_as_a_dead_broker_neither_restores_it_to_the_isr_nor_loses_acknowledged_records(
        shared_cluster):
    cluster, topic = shared_cluster, "claims-dead"
    create_replicated_topic(cluster, topic, partitions=1)
    acked = AckedLog()
    produce(cluster.bootstrap, acked, b"before", 50, topic)
    assert len(acked) == 50 and not acked.failed

    leader = cluster.leader(topic, 0)
    dead = [b for b in cluster.ids if b != leader]
    for b in dead:
        cluster.kill(b)
    cluster.wait_for(lambda: cluster.isr(topic, 0) == [leader], 30, f"broker {leader} alone in the ISR")
    address = cluster.broker(leader).bootstrap

    answers = [forged_fetch(cluster, address, dead[0], offset, topic) for offset in (FUTURE, 50)]  # future, and the log end
    stays(cluster, f"the ISR is still [{leader}] after forged fetches", lambda: cluster.isr(topic, 0) == [leader])

    # acks=all is refused with one in-sync replica, not acknowledged with one copy
    refused = produce(address, acked, b"one-copy", 5, topic, retries=0, request_timeout_ms=10000)
    for f in refused:
        assert isinstance(f.exception(timeout=30), NotEnoughReplicasError), f.exception(timeout=0)

    # The forged broker must not be elected with less than the leader has: lose the leader,
    # bring the others back, then the leader; every acknowledged record is still there.
    cluster.kill(leader)
    for b in dead:
        cluster.restart(b)
    cluster.restart(leader)
    wait_healed(cluster, topic, partitions=1)
    fresh = read_all(cluster.bootstrap, topic, [0])
    problems = check_logs(acked, fresh)
    assert not problems, "\n  ".join(problems)
    assert answers == [ErrorCode.STALE_BROKER_EPOCH] * 2  # and the forger was told why


def test_a_live_brokers_progress_counts_only_with_its_broker_epoch_and_within_the_leaders_log(shared_cluster):
    """The follower is alive and registered but its replica fetcher is stopped, so it leaves
    the ISR; a fetch as that broker without its broker epoch is refused, and one *with* it
    (the czxid read from ZooKeeper) but from a future offset is answered OFFSET_OUT_OF_RANGE
    and does not bring it back. Its own fetcher, resumed, does."""
    cluster, topic = shared_cluster, "claims-live"
    create_replicated_topic(cluster, topic, partitions=1)
    acked = AckedLog()
    produce(cluster.bootstrap, acked, b"before", 20, topic)
    state = cluster.partition_state(topic, 0)
    follower = next(b for b in state["isr"] if b != state["leader"])
    address = cluster.broker(state["leader"]).bootstrap
    fetcher = cluster.broker(follower).actor_process("replica_fetcher")
    fetcher.suspend()
    try:
        cluster.wait_for(lambda: follower not in cluster.isr(topic, 0), 20, f"follower {follower} out of the ISR")
        produce(cluster.bootstrap, acked, b"meanwhile", 20, topic)
        epoch = cluster.kazoo.exists(f"/brokers/ids/{follower}").czxid
        assert forged_fetch(cluster, address, follower, FUTURE, topic) == ErrorCode.STALE_BROKER_EPOCH
        assert forged_fetch(cluster, address, follower, FUTURE, topic, broker_epoch=epoch + 1) == \
            ErrorCode.STALE_BROKER_EPOCH
        assert forged_fetch(cluster, address, follower, FUTURE, topic, broker_epoch=epoch) == \
            ErrorCode.OFFSET_OUT_OF_RANGE
        stays(cluster, f"follower {follower} stays out of the ISR", lambda: follower not in cluster.isr(topic, 0))
    finally:
        fetcher.resume()
    wait_healed(cluster, topic, partitions=1)
    problems = check_logs(acked, read_all(cluster.bootstrap, topic, [0]))
    assert not problems, "\n  ".join(problems)


def test_a_broker_outside_the_replica_set_may_not_fetch_as_a_replica(shared_cluster):
    cluster, topic = shared_cluster, "claims-outsider"
    from odradek import Admin
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=1)
    cluster.wait_for(lambda: cluster.leader(topic, 0) is not None, 30, "a leader")
    leader = cluster.leader(topic, 0)
    outsider = next(b for b in cluster.ids if b != leader)
    epoch = cluster.kazoo.exists(f"/brokers/ids/{outsider}").czxid
    address = cluster.broker(leader).bootstrap
    cluster.wait_for(lambda: forged_fetch(cluster, address, outsider, 0, topic, broker_epoch=epoch)
                     != ErrorCode.STALE_BROKER_EPOCH,
                     10, "the leader knows the outsider's broker epoch")
    assert forged_fetch(cluster, address, outsider, 0, topic, broker_epoch=epoch) == ErrorCode.REPLICA_NOT_AVAILABLE
