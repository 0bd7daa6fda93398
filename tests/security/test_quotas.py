"""Quotas: a producer over its byte rate is throttled to within 10% of it and loses nothing
(real broker; the quota set with ``odradek configs --entity-type clients`` while it runs)."""
from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest

from odradek import Admin, Consumer, Producer
from odradek.local import LocalBroker
from odradek.types import TopicPartition
from odradek.actors.messages import Connections, ScrapeMetrics

RATE = 200_000  # bytes/s
RECORDS, SIZE = 1200, 1000


@pytest.fixture(scope="module")
def quota_broker(tmp_path_factory):
    broker = LocalBroker(str(tmp_path_factory.mktemp("quota-broker")), {"shutdown.timeout.ms": 10000},
                         start_timeout=240).start()
    try:
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


def test_a_producer_over_its_byte_rate_is_throttled_to_within_ten_percent_and_loses_nothing(quota_broker):
    out = subprocess.run([sys.executable, "-m", "odradek", "configs", "--set", f"log.dirs={quota_broker.data_dir}",
                          "--entity-type", "clients", "--entity-name", "slow-producer", "--alter",
                          "--add-config", f"producer_byte_rate={RATE}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    topic = f"quota-{uuid.uuid4().hex[:8]}"
    with Admin(quota_broker.bootstrap) as admin:
        admin.create_topic(topic)
    time.sleep(0.5)  # processors re-read the quotas within 0.2 s
    with Producer(quota_broker.bootstrap, client_id="slow-producer", linger_ms=5, batch_size=16384,
                  compression=None) as p:
        began = time.monotonic()
        futures = [p.send(topic, b"%06d" % i + bytes(SIZE - 6)) for i in range(RECORDS)]
        offsets = [f.get(60).offset for f in futures]
        elapsed = time.monotonic() - began
    rate = RECORDS * SIZE / elapsed
    assert RATE * 0.9 <= rate <= RATE * 1.1, f"{rate:.0f} B/s against a quota of {RATE}"
    assert offsets == list(range(RECORDS))
    with Consumer(quota_broker.bootstrap, auto_offset_reset="earliest") as c:  # no quota on this client
        c.assign([TopicPartition(topic, 0)])
        got = []
        deadline = time.monotonic() + 30
        while len(got) < RECORDS and time.monotonic() < deadline:
            got += [r.value[:6] for r in c.poll(500)]
    assert got == [b"%06d" % i for i in range(RECORDS)]


def _set_quota(broker, entity: str, key: str, rate: int) -> None:
    out = subprocess.run([sys.executable, "-m", "odradek", "configs", "--set", f"log.dirs={broker.data_dir}",
                          "--entity-type", "clients", "--entity-name", entity, "--alter",
                          "--add-config", f"{key}={rate}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def _throttle_max(client) -> float:
    """kafka-python's largest throttle_time_ms read from the broker's answers (its metrics)."""
    return max((v for group in client.metrics().values() for k, v in group.items()
                if k == "throttle-time-max" and v == v), default=0.0)  # NaN (no sample) left out


def test_a_throttled_kafka_client_reads_the_throttle_time_in_its_produce_and_fetch_answers(quota_broker):
    """KIP-219: the answer goes at once with ``throttle_time_ms``, then the connection is muted."""
    import kafka
    _set_quota(quota_broker, "kp-throttled", "producer_byte_rate", 20_000)
    _set_quota(quota_broker, "kp-throttled", "consumer_byte_rate", 20_000)
    topic = f"throttled-{uuid.uuid4().hex[:8]}"
    with Admin(quota_broker.bootstrap) as admin:
        admin.create_topic(topic)
    time.sleep(0.5)  # processors re-read the quotas within 0.2 s
    producer = kafka.KafkaProducer(bootstrap_servers=quota_broker.bootstrap, client_id="kp-throttled",
                                   linger_ms=5, request_timeout_ms=60000)
    try:
        futures = [producer.send(topic, bytes(1000), partition=0) for _ in range(30)]  # 30 kB: 1.5 s of quota
        offsets = [f.get(60).offset for f in futures]
        assert offsets == list(range(30))
        assert _throttle_max(producer) > 0, "no Produce answer carried a throttle time"
    finally:
        producer.close()
    consumer = kafka.KafkaConsumer(bootstrap_servers=quota_broker.bootstrap, client_id="kp-throttled",
                                   auto_offset_reset="earliest", enable_auto_commit=False, group_id=None)
    try:
        consumer.assign([kafka.TopicPartition(topic, 0)])
        got, deadline = 0, time.monotonic() + 60
        while got < 30 and time.monotonic() < deadline:
            got += sum(len(rs) for rs in consumer.poll(500).values())
        assert got == 30
        assert _throttle_max(consumer) > 0, "no Fetch answer carried a throttle time"
    finally:
        consumer.close()


def test_a_throttled_native_produce_answer_carries_the_throttle_time(quota_broker):
    from odradek.core.records import encode_batch
    from odradek.network.client import BrokerConnection
    from odradek.core.protocol import ApiKey
    _set_quota(quota_broker, "native-throttled", "producer_byte_rate", 10_000)
    topic = f"throttled-native-{uuid.uuid4().hex[:8]}"
    with Admin(quota_broker.bootstrap) as admin:
        admin.create_topic(topic)
    time.sleep(0.5)
    batch = encode_batch([(None, bytes(4000))], compression=None)  # twice a 2 kB burst
    throttles = []
    with BrokerConnection(quota_broker.host, quota_broker.port, client_id="native-throttled") as conn:
        for _ in range(3):
            body = conn.request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 5000, "topics": [
                {"name": topic, "partitions": [{"index": 0, "frame": 0}]}]}, [batch]).body
            assert body["topics"][0]["partitions"][0]["error_code"] == 0, body
            throttles.append(body.get("throttle_time_ms", 0))
    assert max(throttles) > 0, throttles


def _connections_per_processor(broker) -> dict[str, int]:
    """Each processor's open connections, asked of it now (its ``connections`` message)."""
    from odradek.actors.client import MailboxClient
    with MailboxClient(broker.run_dir) as client:
        return {name: sum(client.request(name, Connections(), timeout=10).fields.ips.values())
                for name in ("processor-0", "processor-1")}


def _steady_counts(broker) -> dict[str, int]:
    """The per-processor counts once two readings 0.3 s apart agree (earlier tests' clients gone)."""
    last = _connections_per_processor(broker)
    for _ in range(50):
        time.sleep(0.3)
        now = _connections_per_processor(broker)
        if now == last:
            return now
        last = now
    return last


def test_two_connections_of_one_client_on_two_processors_share_one_quota_and_lose_nothing(quota_broker):
    """One broker-wide quota per (user, client id): the processors report their usage to the
    acceptor, which holds the buckets. Without it each processor gave the client its rate, so
    two connections got twice the quota."""
    import threading
    from odradek.core.records import encode_batch
    from odradek.network.client import BrokerConnection
    from odradek.core.protocol import ApiKey
    rate, size, per_conn = 200_000, 5000, 100
    _set_quota(quota_broker, "two-processors", "producer_byte_rate", rate)
    topic = f"shared-quota-{uuid.uuid4().hex[:8]}"
    with Admin(quota_broker.bootstrap) as admin:
        admin.create_topic(topic)
    time.sleep(0.5)  # processors re-read the quotas within 0.2 s
    opened, by_processor = [], {}
    try:
        # the acceptor hands each new connection to the processor with the fewest: open them
        # until one has landed on each (an extra one, idle, only evens the counts out)
        for _ in range(6):
            before = _steady_counts(quota_broker)
            conn = BrokerConnection(quota_broker.host, quota_broker.port, client_id="two-processors",
                                    request_timeout_ms=60000)
            opened.append(conn)
            conn.request(ApiKey.API_VERSIONS, {})
            after = _connections_per_processor(quota_broker)
            landed = [n for n in after if after[n] > before[n]]
            if len(landed) == 1:
                by_processor.setdefault(landed[0], conn)
            if len(by_processor) == 2:
                break
        assert len(by_processor) == 2, "no two connections landed on different processors"
        conns = list(by_processor.values())
        offsets: list[int] = []
        errors: list[BaseException] = []

        def produce(conn) -> None:
            try:
                for i in range(per_conn):
                    body = conn.request(ApiKey.PRODUCE, {"acks": 1, "timeout_ms": 30000, "topics": [
                        {"name": topic, "partitions": [{"index": 0, "frame": 0}]}]},
                        [encode_batch([(None, bytes(size))], compression=None)]).body
                    part = body["topics"][0]["partitions"][0]
                    assert part["error_code"] == 0, body
                    offsets.append(part["base_offset"])
            except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=produce, args=(c,)) for c in conns]
        began = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        elapsed = time.monotonic() - began
    finally:
        for c in opened:
            c.close()
    assert not errors, errors
    assert sorted(offsets) == list(range(2 * per_conn))  # nothing lost, nothing twice
    measured = 2 * per_conn * size / elapsed
    # the quota is the ceiling (each processor alone gave ~2x); a loaded machine may be slower
    assert rate * 0.7 <= measured <= rate * 1.1, f"{measured:.0f} B/s against a quota of {rate}"


def test_a_client_over_its_request_percentage_is_throttled_and_one_under_it_is_not(quota_broker):
    """KIP-124: request_percentage N is N% of one thread's time; a client over it gets
    throttle_time_ms (kafka-python's throttle-time metric) and loses nothing."""
    import kafka
    _set_quota(quota_broker, "rq-heavy", "request_percentage", 1)  # 10 ms of request time a second
    _set_quota(quota_broker, "rq-light", "request_percentage", 1000)
    topic = f"request-quota-{uuid.uuid4().hex[:8]}"
    with Admin(quota_broker.bootstrap) as admin:
        admin.create_topic(topic)
    time.sleep(0.5)  # processors re-read the quotas within 0.2 s
    for client_id, sends in (("rq-light", 10), ("rq-heavy", 40)):
        producer = kafka.KafkaProducer(bootstrap_servers=quota_broker.bootstrap, client_id=client_id,
                                       linger_ms=0, request_timeout_ms=60000)
        try:
            offsets = []
            for i in range(sends):  # one request at a time, each waited for
                offsets.append(producer.send(topic, b"%s-%d" % (client_id.encode(), i), partition=0).get(60).offset)
                if client_id == "rq-heavy" and _throttle_max(producer) > 0:
                    break
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
            if client_id == "rq-light":
                assert _throttle_max(producer) == 0, "a client under its request percentage was throttled"
            else:
                assert _throttle_max(producer) > 0, f"{len(offsets)} requests at 1% and no throttle time"
        finally:
            producer.close()
    with Consumer(quota_broker.bootstrap, auto_offset_reset="earliest") as c:  # everything was written
        c.assign([TopicPartition(topic, 0)])
        got, deadline = [], time.monotonic() + 30
        while len(got) < len(offsets) + 10 and time.monotonic() < deadline:
            got += [r.value for r in c.poll(500)]
    assert got[:10] == [b"rq-light-%d" % i for i in range(10)]
    assert got[10:] == [b"rq-heavy-%d" % i for i in range(len(offsets))]
    assert _throttled_count(quota_broker, "request") > 0  # odradek_throttle_time_seconds{kind="request"}


def _throttled_count(broker, kind: str) -> int:
    """Answers the processors' throttle_ms histogram counted for ``kind`` (their _metrics)."""
    from odradek.actors.client import MailboxClient
    total = 0
    with MailboxClient(broker.run_dir) as client:
        for name in ("processor-0", "processor-1"):
            for metric, labels, buckets, _sum in client.request(name, ScrapeMetrics(), timeout=10).fields.snapshot["histograms"]:
                if metric == "throttle_ms" and labels == [kind]:
                    total += sum(buckets)
    return total


def test_a_quotas_file_broken_by_hand_keeps_the_quotas_read_before_and_loses_no_answer(start_broker):
    """quotas.json edited into invalid JSON while the broker runs: each processor read it on
    its next answer, json.load raised inside the answer's path, and that answer was never
    written; the connection's later answers queued behind it (answers go out in request
    order), so the producer waited out its delivery timeout. Now the bad file is refused with
    the reason, what was read before stays in force, and every answer goes out."""
    import os
    broker = start_broker()
    path = os.path.join(broker.data_dir, "security", "quotas.json")
    topic = "quota-file"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic)
    with Producer(broker.bootstrap, linger_ms=0, request_timeout_ms=5000, delivery_timeout_ms=12000) as producer:
        producer.send(topic, b"before").result(10)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write('{"clients": {"slow": {"producer_byte_rate": 100}')  # a brace short
        deadline = time.monotonic() + 2  # every processor re-reads it within 0.2 s, on an answer
        sent = 0
        while time.monotonic() < deadline:
            producer.send(topic, b"during %d" % sent).result(15)
            sent += 1
            time.sleep(0.01)
    with open(broker.stderr_path) as f:
        logged = f.read()
    assert "quotas.json" in logged and "stays in force" in logged, logged[-3000:]
    assert "error in callback" not in logged


def _send_one_by_kafka_client(client: str, bootstrap: str):
    """A send function that returns once its record is acknowledged (or raises), by a real
    Kafka client: each negotiates its own Produce and Metadata versions."""
    if client == "confluent-kafka":
        from confluent_kafka import Producer as CProducer
        producer = CProducer({"bootstrap.servers": bootstrap, "linger.ms": 0, "message.timeout.ms": 12000})

        def send(topic: str, value: bytes) -> None:
            outcome = []
            producer.produce(topic, value, on_delivery=lambda err, _msg: outcome.append(err))
            producer.flush(15)
            assert outcome == [None], outcome
        return send, lambda: producer.flush(5)
    import kafka
    producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, request_timeout_ms=12000)
    return (lambda topic, value: producer.send(topic, value).get(15)), producer.close


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_a_quotas_file_broken_by_hand_loses_no_answer_to_a_kafka_client(start_broker, client):
    """The same hand-broken quotas.json under Kafka's clients: the quota is read on every
    answer whatever the API and version, so their answers must all go out too."""
    import os
    broker = start_broker()
    path = os.path.join(broker.data_dir, "security", "quotas.json")
    topic = "quota-file-kafka"
    with Admin(broker.bootstrap) as admin:
        admin.create_topic(topic)
    send, close = _send_one_by_kafka_client(client, broker.bootstrap)
    try:
        send(topic, b"before")
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write('{"clients": {"slow": {"producer_byte_rate": 100}')  # a brace short
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            send(topic, b"during")
            time.sleep(0.01)
    finally:
        close()
    with open(broker.stderr_path) as f:
        logged = f.read()
    assert "stays in force" in logged and "error in callback" not in logged, logged[-3000:]


def test_quotas_that_cannot_be_read_at_all_turn_throttling_off_for_a_while_and_never_raise(tmp_path, caplog):
    """A first read of ZooKeeper's quotas while it is out of reach (a processor whose session
    expired during an outage: the CI run of 2026-11-29 lost a produce answer to the raw
    SessionExpiredError) and a quotas.json that was never JSON: no quotas, logged, read again
    a second later; the store itself says why (StoreUnreadable), and never stands in with {}."""
    import socket

    from odradek.network import quotas, secstore
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reader = quotas.Quotas({"zookeeper.connect": f"127.0.0.1:{port}/odradek", "zookeeper.connection.timeout.ms": 300},
                           str(tmp_path))
    with pytest.raises(secstore.StoreUnreadable) as err:
        reader.store.data()
    assert err.value.code.retriable and "/config/quotas" in str(err.value)
    assert reader.current() == {} and reader.rate("User:alice", "c", "produce") == 0
    assert "quotas are not applied for now" in caplog.text

    (tmp_path / "security").mkdir(mode=0o700)
    (tmp_path / "security" / "quotas.json").write_text("{not json")
    (tmp_path / "security" / "quotas.json").chmod(0o600)
    local = quotas.Quotas({}, str(tmp_path))
    for _ in range(2):  # every read raises until it is fixed: no silent {}
        with pytest.raises(secstore.StoreUnreadable, match="quotas.json"):
            local.store.data()
    assert local.current() == {}
