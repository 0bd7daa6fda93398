"""The schema registry in cluster mode (three brokers on one ZooKeeper): every broker serves
it, the registry of the broker leading _schemas-0 writes, the others forward writes to it and
follow _schemas from their own replica for reads. Judged by raw HTTP and by confluent-kafka's
SchemaRegistryClient pointed at a broker that does not lead; then the leader is killed and
registrations go on, through the other brokers, with ids never handed out before."""
from __future__ import annotations

import json
import time

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from odradek.core.protocol import SCHEMAS_TOPIC
from tests.registry.client import http

VISIBLE_WITHIN = 5.0  # seconds: a registration reaches every broker's registry (docs/SCHEMAS.md says why)


def avro(name: str, extra: int = 0) -> str:
    fields = [{"name": "id", "type": "long"}] + [{"name": f"f{i}", "type": ["null", "long"], "default": None}
                                                   for i in range(extra)]
    return json.dumps({"type": "record", "name": name, "fields": fields})


def register(url: str, subject: str, schema: str, timeout: float = 60.0) -> int:
    """The id the registry at ``url`` answers, retried while the cluster moves (50003/50001)."""
    end = time.monotonic() + timeout
    while True:
        status, answer, _ = http(url, "POST", f"/subjects/{subject}/versions", {"schema": schema})
        if status == 200:
            return answer["id"]
        assert status >= 500 and time.monotonic() < end, (status, answer)
        time.sleep(0.5)


def seen_after(url: str, sid: int, timeout: float) -> float:
    """Seconds until the registry at ``url`` answers schema ``sid``."""
    start = time.monotonic()
    while http(url, "GET", f"/schemas/ids/{sid}")[0] != 200:
        assert time.monotonic() - start < timeout, f"schema {sid} not visible at {url} after {timeout}s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_every_broker_serves_one_writes_and_ids_stay_unique_when_the_leader_dies(make_cluster):
    cluster = make_cluster(3)
    urls = {i: cluster.broker(i).schema_registry_url for i in cluster.ids}
    assert all(urls.values()), urls
    first = register(urls[1], "orders-value", avro("Order"))
    leader = cluster.leader(SCHEMAS_TOPIC, 0)
    assert leader in urls
    assert sorted(cluster.topic_assignment(SCHEMAS_TOPIC)[0]) == [1, 2, 3]  # replicated to every broker
    for i in (2, 3):
        print(f"registered on broker 1, visible on broker {i} after {seen_after(urls[i], first, VISIBLE_WITHIN):.3f}s")
        status, answer, _ = http(urls[i], "GET", "/subjects/orders-value/versions/latest")
        assert status == 200 and answer["id"] == first and answer["version"] == 1

    # confluent-kafka's client at a broker that does not lead registers (forwarded to the leader)
    follower = next(i for i in urls if i != leader)
    client = SchemaRegistryClient({"url": urls[follower]})
    second = client.register_schema("payments-value", Schema(avro("Payment"), "AVRO"))
    third = client.register_schema("orders-value", Schema(avro("Order", 1), "AVRO"))
    assert len({first, second, third}) == 3
    assert client.get_latest_version("orders-value").version == 2
    for i in urls:
        seen_after(urls[i], third, VISIBLE_WITHIN)
    # an incompatible schema is refused by the leader, and the answer comes back through the follower
    status, answer, _ = http(urls[follower], "POST", "/subjects/orders-value/versions",
                             {"schema": json.dumps({"type": "record", "name": "Order",
                                                    "fields": [{"name": "id", "type": "string"}]})})
    assert (status, answer["error_code"]) == (409, 409), answer

    # the leader dies: the others go on registering, with ids nobody had
    cluster.kill(leader)
    survivors = [i for i in urls if i != leader]
    before = {first, second, third}
    new = [register(urls[survivors[0]], f"after-{n}-value", avro(f"After{n}")) for n in range(2)]
    new.append(register(urls[survivors[1]], "after-2-value", avro("After2")))
    assert len(set(new)) == 3 and not set(new) & before, (before, new)
    for i in survivors:
        for sid in before | set(new):
            seen_after(urls[i], sid, 30.0)
    # and the old subjects are all still there, with their versions, on both
    for i in survivors:
        assert http(urls[i], "GET", "/subjects/orders-value/versions")[1] == [1, 2]


def test_a_write_forwarded_to_the_leader_carries_the_users_credentials(make_cluster):
    """With SASL users (in ZooKeeper, the same for every broker), the broker a client talks to
    checks its credentials, and the leader checks them again on the forwarded write."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    from odradek.network import secstore

    cluster = make_cluster(2)
    urls = {i: cluster.broker(i).schema_registry_url for i in cluster.ids}
    users = secstore.Users("", {"zookeeper.connect": cluster.zookeeper_connect})
    try:
        users.add("alice", "alice-pw", iterations=4096)
    finally:
        users.store.close()
    authed = {i: SchemaRegistryClient({"url": u, "basic.auth.user.info": "alice:alice-pw"}) for i, u in urls.items()}
    end = time.monotonic() + 30
    while http(urls[1], "GET", "/subjects")[0] != 401:  # the users reach every broker through a ZooKeeper watch
        assert time.monotonic() < end
        time.sleep(0.2)
    first = authed[1].register_schema("auth-value", Schema(avro("Auth"), "AVRO"))  # creates _schemas
    follower = next(i for i in urls if i != cluster.leader(SCHEMAS_TOPIC, 0))
    second = authed[follower].register_schema("auth-value", Schema(avro("Auth", 1), "AVRO"))
    assert second != first and authed[follower].get_latest_version("auth-value").schema_id == second
    with pytest.raises(SchemaRegistryError) as err:
        SchemaRegistryClient({"url": urls[follower], "basic.auth.user.info": "alice:wrong"}).register_schema(
            "auth-value", Schema(avro("Auth", 2), "AVRO"))
    assert err.value.http_status_code == 401 and err.value.error_code == 40101


def test_a_broker_hosting_no_replica_forwards_reads_and_writes(make_cluster):
    """Four brokers, three replicas of _schemas-0: the fourth has no replica to follow and
    sends every request to the leader's registry."""
    cluster = make_cluster(4)
    urls = {i: cluster.broker(i).schema_registry_url for i in cluster.ids}
    first = register(urls[1], "far-value", avro("Far"))
    replicas = cluster.topic_assignment(SCHEMAS_TOPIC)[0]
    assert len(replicas) == 3
    outside = next(i for i in urls if i not in replicas)
    status, answer, _ = http(urls[outside], "GET", f"/schemas/ids/{first}")
    assert status == 200 and json.loads(answer["schema"]) == json.loads(avro("Far")), answer
    second = register(urls[outside], "far-value", avro("Far", 1))
    assert second != first
    assert http(urls[outside], "GET", "/subjects/far-value/versions")[1] == [1, 2]
