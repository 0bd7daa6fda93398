"""Cluster mode: SCRAM users managed through Kafka's API (KIP-554) live in ZooKeeper, where
`odradek users --set zookeeper.connect=...` keeps them: one added through one broker is
described by every broker (real ZooKeeper and brokers, tests/cluster fixtures; kafka-python
sends each request to the broker named)."""
from __future__ import annotations

import time
import uuid

import pytest
from kafka import KafkaAdminClient
from kafka.admin import UserScramCredentialDeletion, UserScramCredentialUpsertion

from odradek.network import secstore


def described(admin: KafkaAdminClient, user: str, present: bool) -> dict:
    """The user's description once a change reached this broker (ZooKeeper's watch pushes it
    to every broker's handlers; a few hundred ms at most here)."""
    deadline = time.monotonic() + 10
    while True:
        seen = admin.describe_user_scram_credentials([user])[user]
        if (seen["error"] is None) == present or time.monotonic() > deadline:
            return seen
        time.sleep(0.2)


@pytest.mark.slow
def test_a_user_altered_through_one_broker_is_in_zookeeper_and_described_by_every_broker(make_cluster):
    cluster = make_cluster(brokers=2)
    user = f"zk-{uuid.uuid4().hex[:6]}"
    admins = {i: KafkaAdminClient(bootstrap_servers=cluster.broker(i).bootstrap, request_timeout_ms=60000)
              for i in sorted(cluster.brokers)}
    try:
        first, second = sorted(admins)
        assert admins[first].alter_user_scram_credentials(
            [UserScramCredentialUpsertion(user, "SCRAM-SHA-256", "pw", iterations=4096)]) == {user: None}
        stored = secstore.Users("", {"zookeeper.connect": cluster.zookeeper_connect})
        try:
            assert stored.describe()[user] == [("SCRAM-SHA-256", 4096)]  # what `odradek users --list` prints
        finally:
            stored.store.close()
        seen = described(admins[second], user, present=True)
        assert [(int(c["mechanism"]), c["iterations"]) for c in seen["credential_infos"]] == [(1, 4096)]
        assert admins[second].alter_user_scram_credentials(
            [UserScramCredentialDeletion(user, "SCRAM-SHA-256")]) == {user: None}
        assert described(admins[first], user, present=False)["error"]  # gone everywhere
    finally:
        for a in admins.values():
            a.close()
