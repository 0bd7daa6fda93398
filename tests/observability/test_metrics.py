"""/metrics on a real broker: Prometheus' own parser reads it, counters move by what the
test produced and consumed, lag is produced minus committed; the health endpoints."""
from __future__ import annotations

import os
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from odradek import Admin, Consumer, Producer
from odradek.observe.catalogue import GROUP_PARTITION, PARTITION_COLUMNS, all_specs
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from odradek.types import TopicPartition
from tests.observability.conftest import http_get


@pytest.fixture(scope="module")
def shared_broker(module_broker):
    """A broker of this module's own, not the package's (tests/observability/conftest.py):
    its counts (open connections, client ids under a cap, request errors) take in every
    client the broker has seen."""
    return module_broker


def scrape(broker) -> dict:
    """{(sample name, sorted labels): value} of one scrape, parsed by prometheus_client."""
    status, text = http_get(broker.console_url + "metrics")
    assert status == 200
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape_whole(broker, timeout: float = 30) -> dict:
    """A scrape every actor answered: under load one may go without a slow actor's numbers."""
    deadline = time.monotonic() + timeout
    while True:
        samples = scrape(broker)
        if all(v == 1 for (name, _), v in samples.items() if name == "odradek_scrape_actor_answered"):
            return samples
        assert time.monotonic() < deadline, "no scrape in which every actor answered"
        time.sleep(0.2)


def value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, tuple(sorted((k, str(v)) for k, v in labels.items()))), 0.0)


def produce(bootstrap: str, topic: str, partitions: int, n: int, size: int = 50) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions)
    producer = Producer(bootstrap)
    for i in range(n):
        producer.send(topic, value=os.urandom(size), partition=i % partitions)  # incompressible
    producer.flush()
    producer.close()


PER_PARTITION = {s.name for s in [*PARTITION_COLUMNS.values(), *GROUP_PARTITION.values()]}


def test_the_metrics_text_parses_and_names_every_metric_of_the_catalogue(shared_broker):
    status, text = http_get(shared_broker.console_url + "metrics")
    assert status == 200
    names = {fam.name for fam in text_string_to_metric_families(text)}
    # the parser drops a counter's _total from the family name; per-partition series are opt-in
    expected = {s.name for s in all_specs()} - PER_PARTITION
    assert expected <= names, f"missing: {sorted(expected - names)}"
    assert not names & PER_PARTITION, "per-partition series without metrics.partition.level=true"
    samples = scrape(shared_broker)
    assert value(samples, "odradek_active_controller") == 1
    assert value(samples, "odradek_actor_up", actor="log-0", role="log") == 1
    assert value(samples, "odradek_scrape_actor_answered", actor="processor-0") == 1
    # the supervisor samples memory and CPU every second: present from its first sample on
    deadline = time.monotonic() + 10
    while not value(samples, "odradek_actor_resident_memory_bytes", actor="fetch", role="fetch") and \
            time.monotonic() < deadline:
        time.sleep(0.5)
        samples = scrape(shared_broker)
    assert value(samples, "odradek_actor_resident_memory_bytes", actor="fetch", role="fetch") > 2**20


def test_counters_move_by_the_records_produced_and_consumed(shared_broker):
    before = scrape(shared_broker)
    produce(shared_broker.bootstrap, "counted", 2, 300)
    after_produce = scrape(shared_broker)
    assert value(after_produce, "odradek_topic_records_in_total", topic="counted") == 300
    size = value(after_produce, "odradek_topic_log_size_bytes", topic="counted")
    assert value(after_produce, "odradek_topic_partitions", topic="counted") == 2
    assert value(after_produce, "odradek_topic_leaders", topic="counted") == 2
    assert value(after_produce, "odradek_topic_bytes_in_total", topic="counted") == size > 300 * 50
    assert value(after_produce, "odradek_requests_total", api="produce") > value(before, "odradek_requests_total",
                                                                               api="produce")
    assert value(after_produce, "odradek_request_total_time_seconds_count", api="produce") > 0
    assert value(after_produce, "odradek_request_queue_time_seconds_count", api="produce") > 0

    consumer = Consumer(shared_broker.bootstrap, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("counted", 0), TopicPartition("counted", 1)])
    got, deadline = 0, time.monotonic() + 60
    while got < 300 and time.monotonic() < deadline:
        got += len(consumer.poll(500))
    consumer.close()
    assert got == 300
    after_consume = scrape_whole(shared_broker)
    assert value(after_consume, "odradek_topic_bytes_out_total", topic="counted") >= size
    assert value(after_consume, "odradek_topic_records_out_total", topic="counted") == 300
    assert value(after_consume, "odradek_requests_total", api="fetch") > value(before, "odradek_requests_total",
                                                                             api="fetch")


def test_records_out_count_what_a_kafka_consumer_was_served_from_its_fetch_offset(shared_broker):
    from confluent_kafka import Consumer as KafkaConsumer, TopicPartition as KafkaTopicPartition
    produce(shared_broker.bootstrap, "served", 1, 200)
    consumer = KafkaConsumer({"bootstrap.servers": shared_broker.bootstrap, "group.id": "served-reader",
                              "enable.auto.commit": False, "client.id": "obs-served"})
    try:
        consumer.assign([KafkaTopicPartition("served", 0, 30)])  # counted from 30, not from its batch's start
        got, deadline = [], time.monotonic() + 60
        while len(got) < 170 and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got.append(msg.offset())
    finally:
        consumer.close()
    assert got == list(range(30, 200))
    assert value(scrape_whole(shared_broker), "odradek_topic_records_out_total", topic="served") == 170


def lag_setup(bootstrap: str, topic: str, group: str) -> None:
    """100 records on two partitions (50 each); the group commits 20 and 45."""
    produce(bootstrap, topic, 2, 100)
    consumer = Consumer(bootstrap, group_id=group, enable_auto_commit=False)
    consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
    consumer.commit({TopicPartition(topic, 0): 20, TopicPartition(topic, 1): 45})
    consumer.close()


def test_a_groups_lag_per_topic_is_what_was_produced_minus_what_it_committed(shared_broker):
    lag_setup(shared_broker.bootstrap, "lagging", "lag-group")
    samples = scrape(shared_broker)
    assert value(samples, "odradek_consumer_group_topic_lag", group="lag-group", topic="lagging") == \
        (50 - 20) + (50 - 45)


def test_per_partition_series_when_asked_for_and_their_sums_per_topic(start_broker):
    broker = start_broker(metrics_partition_level=True)
    lag_setup(broker.bootstrap, "lagging", "lag-group")
    samples = scrape(broker)
    for partition, committed in ((0, 20), (1, 45)):
        produced = value(samples, "odradek_high_watermark", topic="lagging", partition=partition)
        assert produced == 50
        assert value(samples, "odradek_log_end_offset", topic="lagging", partition=partition) == 50
        assert value(samples, "odradek_partition_leader", topic="lagging", partition=partition) == 1
        assert value(samples, "odradek_consumer_group_committed_offset", group="lag-group", topic="lagging",
                     partition=partition) == committed
        assert value(samples, "odradek_consumer_group_lag", group="lag-group", topic="lagging",
                     partition=partition) == produced - committed
    assert value(samples, "odradek_topic_log_size_bytes", topic="lagging") == sum(
        value(samples, "odradek_log_size_bytes", topic="lagging", partition=p) for p in (0, 1)) > 100 * 50
    assert value(samples, "odradek_consumer_group_topic_lag", group="lag-group", topic="lagging") == 35
    assert value(samples, "odradek_leaders") == value(samples, "odradek_partitions") >= 2
    names = {name for name, _ in samples}
    assert {s.name for s in PARTITION_COLUMNS.values()} <= names


def test_request_level_errors_are_counted_per_api_and_code(shared_broker):
    before = scrape(shared_broker)
    host, port = shared_broker.bootstrap.split(":")
    with BrokerConnection(host, int(port)) as conn:
        for _ in range(3):
            with pytest.raises(OdradekError) as caught:
                conn.request(ApiKey.METADATA, {}, version=99)
            assert caught.value.code == ErrorCode.UNSUPPORTED_VERSION
    after = scrape(shared_broker)
    labels = dict(api="metadata", error="UNSUPPORTED_VERSION")
    assert value(after, "odradek_request_errors_total", **labels) - \
        value(before, "odradek_request_errors_total", **labels) == 3


def test_live_and_ready_answer_200_on_a_running_broker(shared_broker):
    status, body = http_get(shared_broker.console_url + "health/live")
    assert status == 200 and '"live": true' in body
    status, body = http_get(shared_broker.console_url + "health/ready")
    assert status == 200 and '"ready": true' in body


def test_an_empty_admin_listener_turns_http_off(start_broker):
    broker = start_broker(admin_listener="")
    assert broker.console_url is None
    assert all("console" not in line for line in broker.stdout_lines)


def test_made_up_api_keys_share_one_label_so_a_client_cannot_grow_the_metrics(shared_broker):
    host, port = shared_broker.bootstrap.split(":")
    with BrokerConnection(host, int(port)) as conn:
        for api in range(5000, 5020):
            with pytest.raises(OdradekError):
                conn.request(api, {})
    samples = scrape(shared_broker)
    apis = {dict(labels).get("api") for name, labels in samples if name == "odradek_requests_total"}
    assert not any(a.isdigit() and int(a) >= 5000 for a in apis), apis
    assert value(samples, "odradek_requests_total", api="-1") >= 20


def client_counts(samples: dict) -> dict:
    return {dict(labels)["client_id"]: v for (name, labels), v in samples.items()
            if name == "odradek_client_requests_total"}


def test_client_ids_past_the_cap_of_open_connections_fold_into_other_and_closed_ones_make_room(shared_broker):
    host, port = shared_broker.bootstrap.split(":")
    n = 260  # over two processors' caps of 100 ids each, all held by connections open at once
    open_before = value(scrape_whole(shared_broker), "odradek_connections", listener="PLAINTEXT")
    conns = [BrokerConnection(host, int(port), client_id=f"obs-many-{i}") for i in range(n)]
    try:
        for conn in conns:
            with pytest.raises(OdradekError):
                conn.request(ApiKey.METADATA, {}, version=99)
        counted = client_counts(scrape_whole(shared_broker))
    finally:
        for conn in conns:
            conn.close()
    named = [c for c in counted if c.startswith("obs-many-")]
    assert 0 < len(named) <= 200 and all(counted[c] == 1 for c in named)
    assert counted["(other)"] >= n - len(named)
    assert len(counted) <= 2 * 100 + 2, "the number of client_id labels is not bounded"
    # closed, their ids make room: a new client is counted by name, the sum over ids is kept
    deadline = time.monotonic() + 30
    while value(scrape_whole(shared_broker), "odradek_connections", listener="PLAINTEXT") > open_before:
        assert time.monotonic() < deadline, "the processors did not see the connections close"
        time.sleep(0.2)
    before = sum(client_counts(scrape_whole(shared_broker)).values())
    with BrokerConnection(host, int(port), client_id="obs-after-many") as conn:
        with pytest.raises(OdradekError):
            conn.request(ApiKey.METADATA, {}, version=99)
    after = client_counts(scrape_whole(shared_broker))
    assert after.get("obs-after-many") == 1
    assert sum(after.values()) == before + 1, "an evicted id's count was lost, not folded into (other)"


def test_a_long_poll_fetch_shows_its_wait_as_remote_time(shared_broker):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("remote-wait", partitions=1)
    before = scrape(shared_broker)
    host, port = shared_broker.bootstrap.split(":")
    body = {"max_wait_ms": 400, "min_bytes": 1,
            "topics": [{"name": "remote-wait", "partitions": [{"index": 0, "fetch_offset": 0,
                                                                "partition_max_bytes": 1024}]}]}
    with BrokerConnection(host, int(port)) as conn:
        for _ in range(2):
            conn.request(ApiKey.FETCH, body)  # nothing to read: each waits max_wait_ms in the fetch actor
    after = scrape(shared_broker)

    def moved(name: str) -> float:
        return value(after, name, api="fetch") - value(before, name, api="fetch")
    assert moved("odradek_request_remote_time_seconds_sum") >= 2 * 0.35
    assert moved("odradek_request_remote_time_seconds_count") >= 2
    # a request no purgatory held counts with 0 remote time
    assert value(after, "odradek_request_remote_time_seconds_bucket", api="metadata", le="5e-05") == \
        value(after, "odradek_request_remote_time_seconds_count", api="metadata") > 0


def test_the_processors_log_line_about_a_bad_request_names_the_client_id(shared_broker):
    import socket
    import struct
    from odradek.core import codec
    host, port = shared_broker.bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"".join(codec.encode_request(ApiKey.METADATA, 0, 1, "obs-who-am-i", {})))
        sock.recv(65536)  # its answer: the request was dispatched, the client id known
        sock.sendall(struct.pack(">II", 1 << 30, 8) + b"\xc1" * 8)  # announces 1 GiB: refused, logged
        sock.recv(65536)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with open(shared_broker.stderr_path, errors="replace") as f:
            lines = [line for line in f if "sent a bad request" in line and "obs-who-am-i" in line]
        if lines:
            break
        time.sleep(0.2)
    assert lines and "client 'obs-who-am-i'" in lines[0] and "MESSAGE_TOO_LARGE" in lines[0]


def test_a_kafka_clients_client_id_is_counted_under_its_name(shared_broker):
    from confluent_kafka import Producer as KafkaProducer
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("from-kafka-client", partitions=1)
    producer = KafkaProducer({"bootstrap.servers": shared_broker.bootstrap, "client.id": "obs-confluent"})
    producer.produce("from-kafka-client", value=b"hello")
    assert producer.flush(30) == 0
    # ApiVersions is answered by the processor itself; Metadata and Produce reach a handler.
    # Scraped until both show: under load a scrape may go without a slow processor's answer.
    deadline = time.monotonic() + 20
    while value(scrape(shared_broker), "odradek_client_requests_total", client_id="obs-confluent") < 2:
        assert time.monotonic() < deadline, "the confluent-kafka client's requests were not counted under its id"
        time.sleep(0.5)
