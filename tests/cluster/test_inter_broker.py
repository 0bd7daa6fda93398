"""Only a broker may send the inter-broker APIs (issue 27, third wave: "never trust what a
client claims about itself").

LEADER_AND_ISR, STOP_REPLICA and UPDATE_METADATA used to be served to any client that sent a
high enough ``controller_epoch`` (it could delete replicas, internal topics included, and make
the real controller's requests look stale); a Fetch or OffsetForLeaderEpoch with a broker's
``replica_id`` and the broker epoch (the czxid of its registration, which anyone who can list
ZooKeeper, or guess a zxid, knows) moved the ISR and the high watermark; WRITE_TXN_MARKERS
likewise. Now a connection is a broker only once it proved it (BROKER_PROOF: an HMAC, keyed
from the cluster's secret, over the processor's nonce); anyone else gets
CLUSTER_AUTHORIZATION_FAILED and nothing changes. docs/SECURITY.md, "Inter-broker requests".
"""
from __future__ import annotations

import os
import pytest

from odradek.network.client import BrokerConnection
from odradek.core.protocol import OFFSETS_TOPIC, ApiKey, ErrorCode, OdradekError
from tests.cluster.fixtures import as_broker
from tests.cluster.test_faults import create_replicated_topic, wait_healed
from tests.cluster.test_replica_claims import produce, stays
from tests.cluster.verify import AckedLog, check_logs, read_all

pytestmark = pytest.mark.slow

HUGE_EPOCH = 2 ** 31 - 1


def connect(cluster, broker: int, proven: int | None = None, secret=None) -> BrokerConnection:
    """A connection to ``broker``: a plain client's, or one that proves it is broker ``proven``
    (with the cluster's secret, or ``secret``)."""
    b = cluster.broker(broker)
    security = None if proven is None else as_broker(cluster, proven, secret)
    return BrokerConnection(b.host, b.port, client_id="claimer", request_timeout_ms=10000, security=security)


def answer_code(conn: BrokerConnection, api: int, body: dict) -> ErrorCode:
    """The top-level error of one request (0: served; for a Fetch, the partition's)."""
    try:
        answer = conn.request(api, body, timeout=10).body
    except OdradekError as exc:
        return exc.code
    if api == ApiKey.FETCH and not answer.get("error_code"):
        return ErrorCode.of(answer["topics"][0]["partitions"][0]["error_code"])
    return ErrorCode.of(answer.get("error_code") or 0)


def fetch_body(replica: int, topic: str, offset: int, **extra) -> dict:
    return {"replica_id": replica, "max_wait_ms": 0, "min_bytes": 1, **extra,
            "topics": [{"name": topic, "partitions": [{"index": 0, "fetch_offset": offset,
                                                        "current_leader_epoch": -1}]}]}


def partition_dirs(cluster, topic: str) -> list[int]:
    """The brokers that have a directory for ``topic``'s partition 0."""
    return [b for b in cluster.ids
            if os.path.isdir(os.path.join(cluster.broker(b).data_dir, f"{topic}-0"))]


def test_a_client_cannot_send_controller_requests_even_with_a_huge_controller_epoch(shared_cluster):
    cluster, topic = shared_cluster, "ib-controller"
    create_replicated_topic(cluster, topic, partitions=1)
    acked = AckedLog()
    produce(cluster.bootstrap, acked, b"before", 20, topic)
    state = cluster.partition_state(topic, 0)
    follower = next(b for b in state["isr"] if b != state["leader"])
    assert sorted(partition_dirs(cluster, topic)) == cluster.ids
    controller = cluster.controller_id()

    parts = [{"topic": topic, "partition": 0, "topic_id": ""}, {"topic": OFFSETS_TOPIC, "partition": 0, "topic_id": ""}]
    with connect(cluster, follower) as conn:
        answers = {
            "STOP_REPLICA": answer_code(conn, ApiKey.STOP_REPLICA, {
                "controller_id": controller, "controller_epoch": HUGE_EPOCH, "delete": True, "partitions": parts}),
            "LEADER_AND_ISR": answer_code(conn, ApiKey.LEADER_AND_ISR, {
                "controller_id": controller, "controller_epoch": HUGE_EPOCH, "brokers": [],
                "partitions": [{"topic": topic, "partition": 0, "topic_id": "", "leader": follower,
                                "leader_epoch": HUGE_EPOCH, "isr": [follower], "replicas": [follower],
                                "zk_version": 0, "config": {}}]}),
            "UPDATE_METADATA": answer_code(conn, ApiKey.UPDATE_METADATA, {
                "controller_id": controller, "controller_epoch": HUGE_EPOCH, "version": 2 ** 62,
                "brokers": {}, "topics": {}}),
            "CONTROLLED_SHUTDOWN": answer_code(conn, ApiKey.CONTROLLED_SHUTDOWN, {"broker_id": follower}),
        }
    assert answers == {name: ErrorCode.CLUSTER_AUTHORIZATION_FAILED for name in answers}

    # nothing changed: the replicas are on disk, the ISR whole, the metadata served
    stays(cluster, "the ISR is whole", lambda: sorted(cluster.isr(topic, 0)) == cluster.ids, 3.0)
    assert sorted(partition_dirs(cluster, topic)) == cluster.ids
    assert topic in {t["name"] for t in cluster.metadata(follower, [topic])["topics"] if not t["error_code"]}
    # ... and the real controller's requests are not stale there: a new topic gets its replicas
    create_replicated_topic(cluster, "ib-controller-after", partitions=1)
    produce(cluster.bootstrap, acked, b"after", 20, topic)
    assert not check_logs(acked, read_all(cluster.bootstrap, topic, [0]))


def test_a_client_claiming_to_be_a_follower_neither_moves_the_isr_nor_reads_past_the_high_watermark(
        shared_cluster):
    """The follower's replica fetcher is stopped, so it leaves the ISR. A client that sends
    the follower's ``replica_id`` and its broker epoch (read from ZooKeeper, as anyone who
    reaches it can) used to be taken for it: its fetch at the leader's log end put the
    follower back in the ISR, so acks=all writes were acknowledged with one copy."""
    cluster, topic = shared_cluster, "ib-follower"
    create_replicated_topic(cluster, topic, partitions=1)
    acked = AckedLog()
    produce(cluster.bootstrap, acked, b"before", 20, topic)
    state = cluster.partition_state(topic, 0)
    leader = state["leader"]
    follower = next(b for b in state["isr"] if b != leader)
    fetcher = cluster.broker(follower).actor_process("replica_fetcher")
    fetcher.suspend()
    try:
        cluster.wait_for(lambda: follower not in cluster.isr(topic, 0), 20, f"follower {follower} out of the ISR")
        epoch = cluster.kazoo.exists(f"/brokers/ids/{follower}").czxid
        with connect(cluster, leader) as conn:
            fetched = answer_code(conn, ApiKey.FETCH, fetch_body(follower, topic, 20, broker_epoch=epoch))
            epochs = answer_code(conn, ApiKey.OFFSET_FOR_LEADER_EPOCH, {"replica_id": follower, "topics": [
                {"name": topic, "partitions": [{"index": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]})
            as_consumer = answer_code(conn, ApiKey.FETCH, fetch_body(-1, topic, 0))
        assert (fetched, epochs) == (ErrorCode.CLUSTER_AUTHORIZATION_FAILED,) * 2
        assert as_consumer == ErrorCode.NONE  # a consumer's fetch is served as before
        stays(cluster, f"follower {follower} stays out of the ISR", lambda: follower not in cluster.isr(topic, 0), 3.0)
    finally:
        fetcher.resume()
    wait_healed(cluster, topic, partitions=1)
    assert not check_logs(acked, read_all(cluster.bootstrap, topic, [0]))


def test_a_proof_needs_the_clusters_secret_and_binds_the_connection_to_one_broker(shared_cluster):
    cluster, topic = shared_cluster, "ib-proof"
    create_replicated_topic(cluster, topic, partitions=1)
    state = cluster.partition_state(topic, 0)
    leader = state["leader"]
    follower, other = [b for b in cluster.ids if b != leader][:2]

    class Wrong:
        @staticmethod
        def get() -> bytes:
            return b"\0" * 32
    with pytest.raises(OdradekError) as refused:
        connect(cluster, leader, proven=follower, secret=Wrong()).connect()
    assert refused.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED

    epoch = cluster.kazoo.exists(f"/brokers/ids/{other}").czxid
    with connect(cluster, leader, proven=follower) as conn:  # proven as the follower ...
        # ... it fetches as the follower, and not as another broker
        assert answer_code(conn, ApiKey.FETCH, fetch_body(follower, topic, 0, broker_epoch=cluster.kazoo.exists(
            f"/brokers/ids/{follower}").czxid)) == ErrorCode.NONE
        assert answer_code(conn, ApiKey.FETCH, fetch_body(other, topic, 0, broker_epoch=epoch)) == \
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        assert answer_code(conn, ApiKey.UPDATE_METADATA, {"controller_id": other, "controller_epoch": HUGE_EPOCH,
                                                          "brokers": {}, "topics": {}}) == \
            ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    wait_healed(cluster, topic, partitions=1)
