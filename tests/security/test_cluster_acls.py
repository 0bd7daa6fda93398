"""Cluster mode: ACLs live in ZooKeeper, so one added through one broker is enforced by every
broker (real ZooKeeper and brokers, tests/cluster fixtures)."""
from __future__ import annotations

import time
import uuid

import pytest

from odradek.network.client import BrokerConnection, parse_bootstrap
from odradek.core.protocol import ApiKey, ErrorCode


def _conn(broker) -> BrokerConnection:
    host, port = parse_bootstrap(broker.bootstrap)[0]
    return BrokerConnection(host, port, client_id="acl-test")


def _produce_denied(broker, topic: str) -> bool:
    """Kafka answers per partition: TOPIC_AUTHORIZATION_FAILED when denied (the topic need not exist)."""
    with _conn(broker) as conn:
        body = conn.request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 5000, "topics": [
            {"name": topic, "partitions": [{"index": 0, "frame": 0}]}]}, [b""]).body
    return body["topics"][0]["partitions"][0]["error_code"] == ErrorCode.TOPIC_AUTHORIZATION_FAILED


@pytest.mark.slow
def test_an_acl_added_on_one_broker_is_enforced_on_all(make_cluster):
    cluster = make_cluster(brokers=3, authorizer=True, allow_everyone_if_no_acl_found=True)
    topic = f"guarded-{uuid.uuid4().hex[:6]}"
    brokers = [cluster.broker(i) for i in sorted(cluster.brokers)]
    assert not any(_produce_denied(b, topic) for b in brokers)  # no ACL on it yet: open to all
    with _conn(brokers[0]) as conn:
        reply = conn.request(ApiKey.CREATE_ACLS, {"creations": [{
            "principal": "User:ANONYMOUS", "host": "*", "resource_type": "Topic", "resource_name": topic,
            "resource_pattern_type": "Literal", "operation": "Write", "permission_type": "Deny"}]}).body
    assert reply["results"][0]["error_code"] == 0
    deadline = time.monotonic() + 10
    while not all(_produce_denied(b, topic) for b in brokers):
        assert time.monotonic() < deadline, "an ACL added on broker 1 is not enforced on every broker"
        time.sleep(0.3)
    with _conn(brokers[-1]) as conn:
        listed = conn.request(ApiKey.DESCRIBE_ACLS, {"resource_type_filter": 1, "pattern_type_filter": 1,
                                                     "operation": 1, "permission_type": 1}).body
    assert [r["resource_name"] for r in listed["resources"]] == [topic]
