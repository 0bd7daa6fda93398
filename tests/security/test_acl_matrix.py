"""The ACL matrix with each real client (issue 27 item 7): confluent-kafka (librdkafka),
kafka-python, aiokafka, kcat and the bundled client sign in with SASL/SCRAM on one broker
(``authorizer`` on) whose users have exactly what Kafka's documentation says a role needs:

- a consumer in a group: Read on the topic and Read on the group (prefixed, or literal);
- an (idempotent) producer: Write on the topic (Kafka 3's KIP-679: no IdempotentWrite; with
  no Write on any topic, its InitProducerId is refused CLUSTER_AUTHORIZATION_FAILED);
- a transactional producer: Write on the topic and Write on its transactional id.

Each works with each client, and a user missing one of those grants gets the right error:
GROUP_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED or TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
One broker for the module; the ACLs are written to its data directory before it starts.
kcat's librdkafka (2.0.2) repeats its nonce in SCRAM's last message, which the broker
accepts as Kafka does since 3.8.1 (librdkafka#4895): without that, kcat could not sign in."""
from __future__ import annotations

import asyncio
import os
import re
import struct
import subprocess
import threading
import time
import uuid

import pytest

from odradek import Admin, Consumer, Producer
from odradek.local import LocalBroker
from odradek.core import kafka_batch
from odradek.core.records import OFFSET_ATTRIBUTES, OFFSET_CRC, TRANSACTIONAL_BIT, Record, crc_of, encode_batch
from odradek.network import secstore
from odradek.network.client import BrokerConnection
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from tests.security.fixtures import RawKafka, listeners_of, warm_kafka

MECHANISM = "SCRAM-SHA-256"
TOPIC = f"m-{uuid.uuid4().hex[:8]}"
# groups granted by name to 'consumer' (the others by the prefix 'g-'), one per client (each commits)
LITERAL_GROUPS = {c: f"literal-{c}-{uuid.uuid4().hex[:6]}" for c in ("bundled", "confluent-kafka", "kafka-python")}
TIMEOUT = 30.0  # seconds a client gets to succeed or to see its error


def _acl(user, resource, pattern, name, operation):
    return [f"User:{user}", "*", resource, pattern, name, operation, "Allow"]


READ_TOPIC, WRITE_TOPIC = ("Topic", "Prefixed", "m-", "Read"), ("Topic", "Prefixed", "m-", "Write")
READ_GROUPS = ("Group", "Prefixed", "g-", "Read")
GRANTS = {
    "consumer": [READ_TOPIC, READ_GROUPS, *(("Group", "Literal", g, "Read") for g in LITERAL_GROUPS.values())],
    "consumer-without-group": [READ_TOPIC],
    "consumer-without-topic": [READ_GROUPS],
    "producer": [WRITE_TOPIC],
    "producer-without-topic": [("Topic", "Prefixed", "other-", "Write")],
    "producer-without-any-write": [READ_TOPIC],
    "transactional": [WRITE_TOPIC, ("TransactionalId", "Prefixed", "tx-", "Write")],
    "transactional-without-id": [WRITE_TOPIC],
}
PASSWORD = "pw-{}".format


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    data = os.path.abspath(str(tmp_path_factory.mktemp("acl-matrix")))
    users = secstore.Users(data)
    for user in ["admin", *GRANTS]:
        users.add(user, PASSWORD(user), mechanisms=(MECHANISM,), iterations=4096)
    secstore.Acls(data).add([_acl(user, *grant) for user, grants in GRANTS.items() for grant in grants])
    b = LocalBroker(data, {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "authorizer": True, "super.users": "User:admin",
                           "sasl.enabled.mechanisms": MECHANISM, "group.initial.rebalance.delay.ms": 0,
                           "failed.authentication.delay.ms": 50, "shutdown.timeout.ms": 10000},
                    start_timeout=240).start()
    try:
        host, port, _ = listeners_of(b)["SASL_PLAINTEXT"]
        warm_kafka(host, port)
        b.address = f"{host}:{port}"
        with Admin(b.address, **_python_security("admin")) as admin:
            admin.create_topic(TOPIC)
        with Producer(b.address, linger_ms=0, **_python_security("admin")) as p:
            for i in range(3):
                p.send(TOPIC, b"seed-%d" % i).get(timeout=TIMEOUT)
        yield b
    finally:
        b.discard()


def _group(client: str) -> str:
    return f"g-{client}-{uuid.uuid4().hex[:6]}"


# ---- each client, as a consumer in a group, an idempotent producer, a transactional producer -------
# Each returns "OK" or the Kafka error name the client reported.

def _python_security(user):
    """The bundled client's, kafka-python's and aiokafka's options (the same names)."""
    return {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": MECHANISM, "sasl_plain_username": user,
            "sasl_plain_password": PASSWORD(user)}


class Bundled:
    @staticmethod
    def consume(address, user, group):
        try:
            with Consumer(address, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False,
                          **_python_security(user)) as c:
                c.subscribe([TOPIC])
                deadline = time.monotonic() + TIMEOUT
                while time.monotonic() < deadline:
                    if c.poll(500):
                        c.commit()
                        return "OK"
                return "no record"
        except OdradekError as exc:
            return exc.code.name

    @staticmethod
    def produce(address, user, transactional_id=None):
        try:
            with Producer(address, linger_ms=0, enable_idempotence=True, transactional_id=transactional_id,
                          delivery_timeout_ms=int(TIMEOUT * 1000), max_block_ms=int(TIMEOUT * 1000),
                          **_python_security(user)) as p:
                if transactional_id:
                    p.init_transactions()
                    p.begin_transaction()
                p.send(TOPIC, b"bundled").get(timeout=TIMEOUT)
                if transactional_id:
                    p.commit_transaction()
            return "OK"
        except OdradekError as exc:
            return exc.code.name


def _librdkafka_security(user):
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": MECHANISM, "sasl.username": user,
            "sasl.password": PASSWORD(user)}


class Confluent:
    @staticmethod
    def consume(address, user, group):
        import confluent_kafka
        c = confluent_kafka.Consumer({"bootstrap.servers": address, "group.id": group, "auto.offset.reset": "earliest",
                                      "enable.auto.commit": False, **_librdkafka_security(user)})
        try:
            c.subscribe([TOPIC])
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                msg = c.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        continue
                    return msg.error().name()
                c.commit(asynchronous=False)
                return "OK"
            return "no record"
        except confluent_kafka.KafkaException as exc:
            return exc.args[0].name()
        finally:
            c.close()

    @staticmethod
    def produce(address, user, transactional_id=None):
        import confluent_kafka
        conf = {"bootstrap.servers": address, "enable.idempotence": True, "message.timeout.ms": int(TIMEOUT * 1000),
                **_librdkafka_security(user)}
        if transactional_id:
            conf["transactional.id"] = transactional_id
        p = confluent_kafka.Producer(conf)
        out = []
        try:
            if transactional_id:
                p.init_transactions(TIMEOUT)
                p.begin_transaction()
            p.produce(TOPIC, b"librdkafka", on_delivery=lambda err, msg: out.append(err))
            p.flush(TIMEOUT)
            if out and out[0] is not None:
                return out[0].name()
            if transactional_id:
                p.commit_transaction(TIMEOUT)
            return "OK" if out else "no delivery report"
        except (confluent_kafka.KafkaException, SystemError) as exc:
            # a fatal error (an idempotent producer refused its producer id) is raised by
            # produce(), chained under a SystemError when it came while a callback ran
            while not isinstance(exc, confluent_kafka.KafkaException) and exc.__context__ is not None:
                exc = exc.__context__
            return exc.args[0].name() if isinstance(exc, confluent_kafka.KafkaException) else repr(exc)
        finally:
            p.purge()
            del p  # the traceback holds this frame: without this the producer outlives the test, retrying


def _kafka_error_name(exc) -> str:
    """The Kafka error name of a kafka-python/aiokafka error; kafka-python wraps a code its
    transaction manager does not expect in a plain KafkaError ('... [Error 31] ...')."""
    import kafka.errors
    found = re.search(r"\[Error (\d+)\]", str(exc))
    if type(exc).__name__ == "KafkaError" and found:
        return kafka.errors.for_code(int(found.group(1))).message
    return getattr(exc, "message", None) or type(exc).__name__


class KafkaPython:
    @staticmethod
    def consume(address, user, group):
        import kafka
        import kafka.errors
        c = kafka.KafkaConsumer(TOPIC, bootstrap_servers=address, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=False, **_python_security(user))
        try:
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                if any(c.poll(timeout_ms=500).values()):
                    c.commit()
                    return "OK"
                # kafka-python logs a topic its Metadata answer refused ("not authorized for this
                # client") and keeps polling; what the broker answered is kept here
                if TOPIC in c._client.cluster.unauthorized_topics:
                    return "TOPIC_AUTHORIZATION_FAILED"
            return "no record"
        except kafka.errors.KafkaError as exc:
            return _kafka_error_name(exc)
        finally:
            c.close()

    @staticmethod
    def produce(address, user, transactional_id=None):
        import kafka
        import kafka.errors
        try:
            p = kafka.KafkaProducer(bootstrap_servers=address, enable_idempotence=True, acks="all",
                                    transactional_id=transactional_id, max_block_ms=int(TIMEOUT * 1000),
                                    **_python_security(user))
        except kafka.errors.KafkaError as exc:
            return _kafka_error_name(exc)
        try:
            if transactional_id:
                p.init_transactions()
                p.begin_transaction()
            p.send(TOPIC, b"kafka-python").get(timeout=TIMEOUT)
            if transactional_id:
                p.commit_transaction()
            return "OK"
        except kafka.errors.KafkaError as exc:
            return _kafka_error_name(exc)
        finally:
            p.close(timeout=5)


class AioKafka:
    @staticmethod
    def consume(address, user, group):
        import aiokafka
        import aiokafka.errors

        async def run():
            c = aiokafka.AIOKafkaConsumer(TOPIC, bootstrap_servers=address, group_id=group,
                                          auto_offset_reset="earliest", enable_auto_commit=False,
                                          **_python_security(user))
            await c.start()
            try:
                await asyncio.wait_for(c.getone(), TIMEOUT)
                await c.commit()
                return "OK"
            finally:
                await c.stop()
        try:
            return asyncio.run(run())
        except aiokafka.errors.KafkaError as exc:
            return _kafka_error_name(exc)
        except asyncio.TimeoutError:
            return "no record"

    @staticmethod
    def produce(address, user, transactional_id=None):
        import aiokafka
        import aiokafka.errors

        async def run():
            p = aiokafka.AIOKafkaProducer(bootstrap_servers=address, enable_idempotence=True,
                                          transactional_id=transactional_id, request_timeout_ms=int(TIMEOUT * 1000),
                                          **_python_security(user))
            await p.start()
            try:
                if transactional_id:
                    async with p.transaction():
                        await p.send_and_wait(TOPIC, b"aiokafka")
                else:
                    await p.send_and_wait(TOPIC, b"aiokafka")
                return "OK"
            finally:
                await p.stop()
        try:
            return asyncio.run(asyncio.wait_for(run(), TIMEOUT))
        except aiokafka.errors.KafkaError as exc:
            return _kafka_error_name(exc)
        except asyncio.TimeoutError:
            return "timed out"


# kcat prints librdkafka's text for a code ("Broker: Group authorization failed"), or the
# broker's own error message when it gave one ("... is not allowed to Describe Group 'g-1'")
KCAT_ERRORS = {"Group authorization failed": "GROUP_AUTHORIZATION_FAILED",
               "Cluster authorization failed": "CLUSTER_AUTHORIZATION_FAILED",
               "Topic authorization failed": "TOPIC_AUTHORIZATION_FAILED",
               "Transactional Id authorization failed": "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"}
KCAT_MESSAGES = {re.compile(r"is not allowed to \w+ Group '"): "GROUP_AUTHORIZATION_FAILED",
                 re.compile(r"is not allowed to \w+ Topic '"): "TOPIC_AUTHORIZATION_FAILED",
                 re.compile(r"is not allowed to \w+ TransactionalId '"): "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
                 re.compile(r"is not allowed to \w+ Cluster '"): "CLUSTER_AUTHORIZATION_FAILED"}


def _kcat(address, user, *args, stdin=b""):
    """kcat's exit code (None if it was stopped), output and errors. A consumer that sees only
    errors keeps trying: it is stopped at the first error the matrix knows, or at TIMEOUT."""
    cmd = ["kcat", "-b", address, "-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={MECHANISM}",
           "-X", f"sasl.username={user}", "-X", f"sasl.password={PASSWORD(user)}", *args]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(stdin)
    proc.stdin.close()
    err = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.monotonic() + TIMEOUT
    while proc.poll() is None and time.monotonic() < deadline and not _kcat_known(b"".join(err).decode(errors="replace")):
        time.sleep(0.1)
    code = proc.poll()
    if code is None:
        proc.kill()
    proc.wait()
    reader.join(5)
    return code, proc.stdout.read().decode(errors="replace"), b"".join(err).decode(errors="replace")


def _kcat_known(stderr: str) -> bool:
    return not _kcat_error(stderr).startswith("kcat said")


def _kcat_error(stderr: str) -> str:
    for text, name in KCAT_ERRORS.items():
        if text in stderr:
            return name
    for pattern, name in KCAT_MESSAGES.items():
        if pattern.search(stderr):
            return name
    return f"kcat said: {stderr[-300:]!r}"


class Kcat:
    @staticmethod
    def consume(address, user, group):
        code, out, err = _kcat(address, user, "-G", group, "-X", "auto.offset.reset=earliest",
                               "-X", "enable.auto.commit=true", "-c", "1", "-f", "%s\\n", TOPIC)
        if code == 0 and re.search(r"seed-\d", out):
            return "OK"
        return _kcat_error(err)

    @staticmethod
    def produce(address, user, transactional_id=None):
        # kcat 1.7: with transactional.id, all its input in one transaction, committed at its end
        mode = ["-X", f"transactional.id={transactional_id}"] if transactional_id else \
            ["-X", "enable.idempotence=true"]
        code, _out, err = _kcat(address, user, "-P", "-t", TOPIC, "-m", str(int(TIMEOUT)), *mode, stdin=b"kcat\n")
        return "OK" if code == 0 and "ERROR" not in err else _kcat_error(err)


CLIENTS = {"bundled": Bundled, "confluent-kafka": Confluent, "kafka-python": KafkaPython, "aiokafka": AioKafka,
           "kcat": Kcat}

CONSUMERS = [("consumer", "OK"), ("consumer-without-group", "GROUP_AUTHORIZATION_FAILED"),
             ("consumer-without-topic", "TOPIC_AUTHORIZATION_FAILED")]
# Write on some topic is what Kafka 3 asks of an idempotent producer's InitProducerId (KIP-679;
# or IdempotentWrite on the cluster): without any, CLUSTER_AUTHORIZATION_FAILED
PRODUCERS = [("producer", "OK"), ("producer-without-topic", "TOPIC_AUTHORIZATION_FAILED"),
             ("producer-without-any-write", "CLUSTER_AUTHORIZATION_FAILED")]
TRANSACTIONAL = [("transactional", "OK"), ("transactional-without-id", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED")]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("user,expected", CONSUMERS)
def test_a_consumer_in_a_group(broker, client, user, expected):
    assert CLIENTS[client].consume(broker.address, user, _group(client)) == expected


@pytest.mark.parametrize("client", LITERAL_GROUPS)
def test_a_consumer_whose_group_is_granted_by_its_literal_name(broker, client):
    assert CLIENTS[client].consume(broker.address, "consumer", LITERAL_GROUPS[client]) == "OK"


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("user,expected", PRODUCERS)
def test_an_idempotent_producer(broker, client, user, expected):
    assert CLIENTS[client].produce(broker.address, user) == expected


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("user,expected", TRANSACTIONAL)
def test_a_transactional_producer(broker, client, user, expected):
    assert CLIENTS[client].produce(broker.address, user, f"tx-{client}-{uuid.uuid4().hex[:6]}") == expected


# ---- the Produce itself (issue 27): transactional batches need Write on the request's transactional id --
# A real client's InitProducerId is refused first (above), so these send the Produce raw (RawKafka): a legitimate
# producer id of an id the user may write ('tx-...'), then its transactional batches under an id it may
# not write, or under none. Kafka's handleProduceRequest fails the whole request
# TRANSACTIONAL_ID_AUTHORIZATION_FAILED; before the fix each was appended (error 0).

TXN_DENIED = 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def _txn_batch(pid: int, epoch: int, value: bytes = b"raw") -> bytes:
    now = int(time.time() * 1000)
    return kafka_batch.encode([Record(0, now, None, value, [])], base_offset=0, first_timestamp=now,
                              max_timestamp=now, attributes=kafka_batch.TRANSACTIONAL_BIT, producer_id=pid,
                              producer_epoch=epoch, base_sequence=0)


@pytest.mark.parametrize("version", range(3, 10))
def test_a_kafka_produce_of_transactional_batches_needs_write_on_its_transactional_id(broker, version):
    own, other = f"tx-raw-{uuid.uuid4().hex[:6]}", f"not-mine-{uuid.uuid4().hex[:6]}"
    conn = RawKafka(broker.address, "transactional", PASSWORD("transactional"), MECHANISM)
    try:
        pid, epoch = conn.init_producer_id(own)
        batch = _txn_batch(pid, epoch)
        assert conn.produce(version, other, TOPIC, batch) == [TXN_DENIED], f"v{version} under '{other}'"
        assert conn.produce(version, None, TOPIC, batch) == [TXN_DENIED], f"v{version} under no transactional id"
        # the same batch under its own id, in the transaction as a client does it: written
        added = conn.call(ApiKey.ADD_PARTITIONS_TO_TXN, 3, {
            "v3_and_below_transactional_id": own, "v3_and_below_producer_id": pid,
            "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}]})
        assert [p["partition_error_code"] for t in added["results_by_topic_v3_and_below"]
                for p in t["results_by_partition"]] == [0]
        assert conn.produce(version, own, TOPIC, batch) == [0]
        assert conn.call(ApiKey.END_TXN, 1, {"transactional_id": own, "producer_id": pid, "producer_epoch": epoch,
                                             "committed": False})["error_code"] == 0
    finally:
        conn.close()


def test_add_partitions_to_txn_with_a_topic_not_writable_adds_nothing_and_names_the_topic_at_every_version(broker):
    """Kafka's handleAddPartitionsToTxnRequest: the partitions of a topic the principal may not write
    get TOPIC_AUTHORIZATION_FAILED, the request's others OPERATION_NOT_ATTEMPTED, and none is
    added. Before the fix the whole request was refused, so every partition, the writable one
    too, read TOPIC_AUTHORIZATION_FAILED."""
    denied, not_attempted = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED), int(ErrorCode.OPERATION_NOT_ATTEMPTED)
    other = f"other-{uuid.uuid4().hex[:6]}"  # 'transactional' may write m-* only
    conn = RawKafka(broker.address, "transactional", PASSWORD("transactional"), MECHANISM)
    host, port = broker.address.rsplit(":", 1)
    try:
        for version in range(0, 4):
            txn = f"tx-partly-{version}-{uuid.uuid4().hex[:6]}"
            pid, epoch = conn.init_producer_id(txn)
            r = conn.call(ApiKey.ADD_PARTITIONS_TO_TXN, version, {
                "v3_and_below_transactional_id": txn, "v3_and_below_producer_id": pid,
                "v3_and_below_producer_epoch": epoch,
                "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}, {"name": other, "partitions": [0, 1]}]})
            got = {(t["name"], p["partition_index"]): p["partition_error_code"]
                   for t in r["results_by_topic_v3_and_below"] for p in t["results_by_partition"]}
            assert got == {(TOPIC, 0): not_attempted, (other, 0): denied, (other, 1): denied}, f"v{version}"
            with BrokerConnection(host, int(port), **_python_security("admin")) as admin:
                states = admin.request(ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [txn]}).body
            assert [t for s in states["transaction_states"] for t in s["topics"]] == [], f"v{version}: added"
        # the bundled client's protocol takes the same path
        txn = f"tx-partly-native-{uuid.uuid4().hex[:6]}"
        pid, epoch = conn.init_producer_id(txn)
        with BrokerConnection(host, int(port), **_python_security("transactional")) as native:
            added = native.request(ApiKey.ADD_PARTITIONS_TO_TXN, {
                "transactional_id": txn, "producer_id": pid, "producer_epoch": epoch,
                "topics": [{"name": TOPIC, "partitions": [0]}, {"name": other, "partitions": [0]}]}).body
        assert {t["name"]: [p["partition_error_code"] for p in t["results"]] for t in added["results"]} == {
            TOPIC: [not_attempted], other: [denied]}
    finally:
        conn.close()


def test_a_user_without_write_on_any_transactional_id_cannot_produce_transactional_batches(broker):
    """No InitProducerId of its own: a producer id made up (the check comes before the producer id's)."""
    conn = RawKafka(broker.address, "transactional-without-id", PASSWORD("transactional-without-id"),
                    MECHANISM)
    try:
        batch = _txn_batch(123456, 0)
        assert conn.produce(9, f"tx-{uuid.uuid4().hex[:6]}", TOPIC, batch) == [TXN_DENIED]
        assert conn.produce(3, None, TOPIC, batch) == [TXN_DENIED]
    finally:
        conn.close()


def test_a_native_produce_of_transactional_batches_needs_write_on_its_transactional_id(broker):
    """The bundled client's protocol: its PRODUCE names its ``transactional_id`` (odradek/producer.py)."""
    own, other = f"tx-native-{uuid.uuid4().hex[:6]}", f"not-mine-{uuid.uuid4().hex[:6]}"
    raw = RawKafka(broker.address, "transactional", PASSWORD("transactional"), MECHANISM)
    try:
        pid, epoch = raw.init_producer_id(own)
    finally:
        raw.close()
    host, port = broker.address.rsplit(":", 1)
    data = bytearray(encode_batch([(None, b"native")], compression=None, producer_id=pid, producer_epoch=epoch,
                                  base_sequence=0))
    data[OFFSET_ATTRIBUTES + 1] |= TRANSACTIONAL_BIT
    struct.pack_into(">I", data, OFFSET_CRC, crc_of(data, 0, len(data)))
    body = {"acks": -1, "timeout_ms": 30000, "topics": [{"name": TOPIC, "partitions": [{"index": 0, "frame": 0}]}]}
    with BrokerConnection(host, int(port), **_python_security("transactional")) as conn:
        for txn in (other, None):
            with pytest.raises(OdradekError) as refused:
                conn.request(ApiKey.PRODUCE, {**body, "transactional_id": txn} if txn else body, [bytes(data)])
            assert refused.value.code == ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, refused.value
