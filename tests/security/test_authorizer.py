"""network/authorizer.py without a broker: Kafka's rules (deny wins, All, implied Describe,
prefixed and wildcard patterns, super users, allow.everyone.if.no.acl.found) and its speed
with 1,000 ACLs."""
from __future__ import annotations

import time

import pytest

from odradek.network.authorizer import Acl, Authorizer, Filter, requirements
from odradek.core.protocol import ApiKey

A = "User:alice"


def test_no_acl_means_denied_unless_allow_everyone_if_no_acl_found():
    assert not Authorizer().authorize(A, "1.2.3.4", "Read", "Topic", "t")
    assert Authorizer(allow_if_no_acl=True).authorize(A, "1.2.3.4", "Read", "Topic", "t")


def test_an_allow_grants_its_operation_and_the_describe_it_implies_but_not_others():
    auth = Authorizer([Acl.make(A, "Topic", "t", "Read")])
    assert auth.authorize(A, "h", "Read", "Topic", "t") and auth.authorize(A, "h", "Describe", "Topic", "t")
    assert not auth.authorize(A, "h", "Write", "Topic", "t")
    assert not auth.authorize("User:bob", "h", "Read", "Topic", "t")


def test_deny_beats_allow():
    auth = Authorizer([Acl.make("User:*", "Topic", "*", "All"), Acl.make(A, "Topic", "secret", "Read", "Deny")])
    assert not auth.authorize(A, "h", "Read", "Topic", "secret")
    assert auth.authorize(A, "h", "Read", "Topic", "open") and auth.authorize("User:bob", "h", "Read", "Topic", "secret")


def test_prefixed_patterns_match_names_that_start_with_them():
    auth = Authorizer([Acl.make(A, "Topic", "orders-", "Write", pattern="PREFIXED")])
    assert auth.authorize(A, "h", "Write", "Topic", "orders-eu")
    assert not auth.authorize(A, "h", "Write", "Topic", "order")


def test_super_users_may_do_everything_and_hosts_narrow_an_acl():
    auth = Authorizer([Acl.make(A, "Group", "g", "Read", host="10.0.0.1")], super_users=["User:admin"])
    assert auth.authorize("User:admin", "h", "Alter", "Cluster", "kafka-cluster")
    assert auth.authorize(A, "10.0.0.1", "Read", "Group", "g") and not auth.authorize(A, "10.0.0.2", "Read", "Group", "g")


def test_bad_acls_are_refused_with_a_message():
    with pytest.raises(ValueError, match="operation"):
        Acl.make(A, "Topic", "t", "Munch")
    with pytest.raises(ValueError, match="principal"):
        Acl.make("alice", "Topic", "t", "Read")


def test_filters_match_literal_any_and_the_acls_that_apply():
    acls = [Acl.make(A, "Topic", "t", "Read"), Acl.make(A, "Topic", "t-", "Read", pattern="Prefixed")]
    assert [a for a in acls if Filter(resource="Topic", pattern="Match", name="t-1").matches(a)] == [acls[1]]
    assert len([a for a in acls if Filter(principal=A).matches(a)]) == 2


def test_the_api_table_asks_what_kafka_asks():
    assert requirements(ApiKey.PRODUCE, {"topics": [{"name": "t"}]}) == [("Write", "Topic", "t")]
    assert requirements(ApiKey.FETCH, {"replica_id": 2, "topics": [{"name": "t"}]})[0][0] == "ClusterAction"
    assert ("Read", "Group", "g") in requirements(ApiKey.OFFSET_COMMIT, {"group_id": "g", "topics": []})
    assert requirements(ApiKey.CREATE_ACLS, {}) == [("Alter", "Cluster", "kafka-cluster")]


def test_the_transaction_apis_need_write_on_their_transactional_id_and_an_idempotent_producer_nothing_more():
    """The bundled producer is idempotent by default: its InitProducerId must not need Alter on
    the cluster (what an API missing from the table needs), or every producer with Write on
    its topic is refused: IdempotentWrite on the cluster, or Write on some topic (KIP-679,
    ``test_an_idempotent_producer_needs_write_on_some_topic``)."""
    assert requirements(ApiKey.INIT_PRODUCER_ID, {"transactional_id": None}) == [
        ("IdempotentWrite", "Cluster", "kafka-cluster")]
    assert requirements(ApiKey.INIT_PRODUCER_ID, {"transactional_id": "tx"}) == [("Write", "TransactionalId", "tx")]
    assert requirements(ApiKey.ADD_PARTITIONS_TO_TXN, {"transactional_id": "tx", "topics": [{"name": "t"}]}) == [
        ("Write", "TransactionalId", "tx"), ("Write", "Topic", "t")]
    assert requirements(ApiKey.ADD_OFFSETS_TO_TXN, {"transactional_id": "tx", "group_id": "g"}) == [
        ("Write", "TransactionalId", "tx"), ("Read", "Group", "g")]
    assert requirements(ApiKey.END_TXN, {"transactional_id": "tx"}) == [("Write", "TransactionalId", "tx")]
    assert requirements(ApiKey.TXN_OFFSET_COMMIT, {"transactional_id": "tx", "group_id": "g",
                                                   "topics": [{"name": "t"}]}) == [
        ("Write", "TransactionalId", "tx"), ("Read", "Group", "g"), ("Read", "Topic", "t")]
    assert requirements(ApiKey.FIND_COORDINATOR, {"key": "tx", "key_type": 1}) == [("Describe", "TransactionalId", "tx")]
    assert requirements(ApiKey.FIND_COORDINATOR, {"keys": ["g1", "g2"], "key_type": 0}) == [
        ("Describe", "Group", "g1"), ("Describe", "Group", "g2")]


def test_a_decision_with_a_thousand_acls_takes_microseconds():
    acls = [Acl.make(f"User:u{i}", "Topic", f"topic-{i}", "Write") for i in range(900)]
    acls += [Acl.make(f"User:u{i}", "Topic", f"p{i}-", "Read", pattern="Prefixed") for i in range(100)]
    auth = Authorizer(acls)
    began = time.perf_counter()
    for i in range(10000):
        auth.authorize("User:u7", "h", "Write", "Topic", f"topic-{i % 900}")
    per_call = (time.perf_counter() - began) / 10000
    assert auth.authorize("User:u7", "h", "Write", "Topic", "topic-7")
    assert per_call < 50e-6, per_call


def test_an_idempotent_producer_needs_write_on_some_topic():
    """Kafka 3's InitProducerId without a transactional id (KIP-679): IdempotentWrite on the
    cluster, or Write on any topic (authorizeByResourceType): an Allow of Write (or All) on a
    literal name or a prefix that no Deny of the principal covers."""
    def acl(principal, pattern, name, operation="Write", permission="Allow"):
        return Acl.make(principal, "Topic", name, operation, permission, pattern)
    auth = Authorizer([acl("User:a", "Prefixed", "orders-"), acl("User:b", "Literal", "t", "Read"),
                       acl("User:c", "Literal", "t", "All"), acl("User:d", "Prefixed", "x-"),
                       acl("User:d", "Prefixed", "x", permission="Deny"), acl("User:e", "Literal", "t"),
                       acl("User:e", "Literal", "*", permission="Deny"), acl("User:*", "Literal", "w", "Read")],
                      super_users=["User:admin"])
    assert auth.authorize_any("User:a", "1.2.3.4", "Write", "Topic")
    assert not auth.authorize_any("User:b", "1.2.3.4", "Write", "Topic")  # Read is not Write
    assert auth.authorize_any("User:c", "1.2.3.4", "Write", "Topic")  # All is
    assert not auth.authorize_any("User:d", "1.2.3.4", "Write", "Topic")  # its Deny prefix covers its Allow
    assert not auth.authorize_any("User:e", "1.2.3.4", "Write", "Topic")  # Deny on every topic
    assert not auth.authorize_any("User:nobody", "1.2.3.4", "Write", "Topic")
    assert auth.authorize_any("User:admin", "1.2.3.4", "Write", "Topic")
    assert Authorizer([], allow_if_no_acl=True).authorize_any("User:x", "h", "Write", "Topic")


def test_inter_broker_apis_need_a_proven_broker_or_with_the_authorizer_on_cluster_action(tmp_path):
    """network/guard.py's check_inter_broker (docs/SECURITY.md, "Inter-broker requests"):
    with the authorizer off only a connection proved as the broker the request names; with it
    on, also a principal granted ClusterAction (Kafka's rule), never another one."""
    from odradek.network.guard import Guard
    from odradek.core.protocol import ErrorCode, OdradekError

    from odradek.actors.messages import Request

    def refused(guard, fields, api, body):
        request = Request(api, 0, None, 1, "127.0.0.1:1", body, 0.0, fields.get("principal"), "PLAINTEXT",
                          fields.get("broker"))
        try:
            guard.check_inter_broker(request, api, body)
        except OdradekError as exc:
            assert exc.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
            return True
        return False
    stop = {"controller_id": 2, "controller_epoch": 1 << 30, "delete": True, "partitions": []}
    replica = {"replica_id": 2, "topics": []}
    off = Guard({}, str(tmp_path / "off"))
    on = Guard({"authorizer": True, "super.users": "User:broker"}, str(tmp_path / "on"))
    for guard in (off, on):
        assert refused(guard, {"principal": A}, ApiKey.STOP_REPLICA, stop)
        assert refused(guard, {"principal": A}, ApiKey.FETCH, replica)
        assert refused(guard, {"principal": A}, ApiKey.OFFSET_FOR_LEADER_EPOCH, {**replica, "replica_id": True})
        assert refused(guard, {"broker": 1}, ApiKey.STOP_REPLICA, stop)  # broker 1 speaking for broker 2
        assert not refused(guard, {"broker": 2}, ApiKey.STOP_REPLICA, stop)
        assert not refused(guard, {"broker": 2}, ApiKey.FETCH, replica)
        assert not refused(guard, {"principal": A}, ApiKey.FETCH, {"replica_id": -1, "topics": []})  # a consumer
        assert not refused(guard, {"principal": A}, ApiKey.WRITE_TXN_MARKERS, {"broker_id": -1})  # operator abort
    assert refused(off, {"principal": "User:broker"}, ApiKey.UPDATE_METADATA, {"controller_id": 2})
    assert not refused(on, {"principal": "User:broker"}, ApiKey.UPDATE_METADATA, {"controller_id": 2})
