"""Issue 27, item 8: the admin APIs the handler passes on to the controller or the log actors
read their bodies as given, so a body of the wrong shape used to end in an actor's TypeError or
AttributeError, answered UNKNOWN_SERVER_ERROR (ElectLeaders first among them). Now the handler
answers INVALID_REQUEST naming the field, and the well-formed requests, Kafka's null topic list
of ElectLeaders (elect every partition) included, are served as before."""
from __future__ import annotations

import pytest
from confluent_kafka import ElectionType
from confluent_kafka import TopicPartition as CKTopicPartition
from confluent_kafka.admin import AdminClient

from odradek import Admin
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

BAD_BODIES = [
    (ApiKey.ELECT_LEADERS, {"topic_partitions": "all"}, "topic_partitions"),
    (ApiKey.ELECT_LEADERS, {"topic_partitions": [7]}, "topic_partitions[0]"),
    (ApiKey.ELECT_LEADERS, {"topic_partitions": [{"topic": "t", "partitions": "0"}]},
     "topic_partitions[0].partitions"),
    (ApiKey.ALTER_PARTITION_REASSIGNMENTS, {"topics": "t"}, "topics"),
    (ApiKey.ALTER_PARTITION_REASSIGNMENTS, {"topics": [{"name": "t", "partitions": 5}]},
     "topics[0].partitions"),
    (ApiKey.ALTER_PARTITION_REASSIGNMENTS, {"topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "replicas": 3}]}]}, "topics[0].partitions[0].replicas"),
    (ApiKey.LIST_PARTITION_REASSIGNMENTS, {"topics": [{"name": "t", "partition_indexes": 1}]},
     "topics[0].partition_indexes"),
    (ApiKey.DELETE_RECORDS, {"topics": [{"name": "t", "partitions": 5}]}, "topics[0].partitions"),
    (ApiKey.DELETE_RECORDS, {"topics": [{"name": ["t"], "partitions": []}]}, "topics[0].name"),
    (ApiKey.OFFSET_FOR_LEADER_EPOCH, {"topics": [{"name": "t", "partitions": 5}]},
     "topics[0].partitions"),
    (ApiKey.INCREMENTAL_ALTER_CONFIGS, {"resources": [{"type": "topic", "name": "t", "configs": 3}]},
     "resources[0].configs"),
    (ApiKey.CREATE_PARTITIONS, {"topics": [{"name": "t", "count": "9"}]}, "topics[0].count"),
]


@pytest.mark.parametrize("api,body,where", BAD_BODIES, ids=[f"{a.name}-{i}" for i, (a, _b, _w) in
                                                            enumerate(BAD_BODIES)])
def test_an_admin_body_of_the_wrong_shape_gets_invalid_request_naming_the_field(shared_broker, api, body, where):
    conn = BrokerConnection(shared_broker.host, shared_broker.port)
    try:
        with pytest.raises(OdradekError) as err:
            conn.request(api, body, timeout=15)
        assert err.value.code == ErrorCode.INVALID_REQUEST and f"'{where}'" in err.value.message, err.value
        assert conn.request(ApiKey.PING, {}).body == {}  # the connection is still served
    finally:
        conn.close()


def test_elect_leaders_with_an_empty_body_or_kafkas_null_list_elects_every_partition(shared_broker):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("elect-all", partitions=2)
    conn = BrokerConnection(shared_broker.host, shared_broker.port)
    try:
        for body in ({}, {"topic_partitions": None}):
            answer = conn.request(ApiKey.ELECT_LEADERS, body, timeout=15).body
            mine = {(p["topic"], p["partition"]): p["error_code"] for p in answer["partitions"]}
            assert mine[("elect-all", 0)] == mine[("elect-all", 1)] == ErrorCode.ELECTION_NOT_NEEDED, answer
        assert conn.request(ApiKey.ELECT_LEADERS, {"topic_partitions": []}, timeout=15).body["partitions"] == []
    finally:
        conn.close()
    ka = AdminClient({"bootstrap.servers": shared_broker.bootstrap})
    done = ka.elect_leaders(ElectionType.PREFERRED, None).result(30)  # Kafka's null: every partition
    assert CKTopicPartition("elect-all", 0) in done and CKTopicPartition("elect-all", 1) in done, done
