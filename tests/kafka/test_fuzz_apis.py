"""A generated fuzz test over every Kafka API and version the broker advertises (issue 27,
"Beyond the list").

Request bodies are drawn by Hypothesis from kio's types (generated from Kafka's own JSON
schemas): valid-shaped, with hostile values (empty, null and 32 KiB strings; the names of
the internal topics; unknown topics; negative, zero and extreme integers; empty and
1,000-element arrays). Each goes to one real broker over a real TCP connection, followed on
the same connection by an ApiVersions probe. The property:

* the request gets a Kafka response that decodes, with no UNKNOWN_SERVER_ERROR anywhere in
  it, and the probe after it is answered (the connection keeps serving);
* the broker logs no traceback (an exception answered with an error code is still a bug);
* raw-byte mutations of valid requests (truncated, bit-flipped) get an answer or a clean
  close within a bound, never a hang;
* afterwards every actor is running with no restart, and a real client (confluent-kafka)
  still produces and consumes.

Reproducible: Hypothesis runs derandomized with ``FUZZ_EXAMPLES`` examples per API and
version (default 4, about a minute in all); ``ODRADEK_FUZZ_EXAMPLES=200`` runs longer.
Versions kio has no schema for (Kafka 4 removed them) are fuzzed by the raw mutations only.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import random
import socket
import struct
import time
import typing
import uuid

import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from odradek.local import LocalBroker
from odradek.core.kafka import apis, framing, schema
from odradek.core.protocol import ApiKey, OFFSETS_TOPIC, TXN_STATE_TOPIC

FUZZ_EXAMPLES = int(os.environ.get("ODRADEK_FUZZ_EXAMPLES", "4"))
# Shrinking a failure takes minutes of round trips: only in a longer run
PHASES = [Phase.explicit, Phase.generate] + ([Phase.shrink] if FUZZ_EXAMPLES > 4 else [])
ANSWER_TIMEOUT_S = 20.0  # a request (and the probe after it) answered or closed within this
KNOWN_TOPIC = "fuzz-known"
UNKNOWN_TOPIC = "fuzz-unknown-topic"
HUGE = 32767  # the longest string a non-flexible version can carry (i16 length)
LONG = 1000  # a long array
PROBE_CORR = 0x7FFF0000
SASL_APIS = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)

# Every (api, version) the broker advertises (ApiVersions answers exactly this table; the
# first test checks that against the running broker).
ADVERTISED = [(k, v) for k, a in sorted(apis.REGISTRY.items()) for v in range(a.min_version, a.max_version + 1)]
SCHEMA_KNOWN = [(k, v) for k, v in ADVERTISED if schema.known(k, v)]

NAMES = ["", OFFSETS_TOPIC, TXN_STATE_TOPIC, KNOWN_TOPIC, UNKNOWN_TOPIC, ".", "..", "a/b", "nul\x00byte",
         "ünï-cødé", " ", "-", "x" * 250]


@pytest.fixture(scope="module")
def fuzz_broker(tmp_path_factory):
    broker = LocalBroker(str(tmp_path_factory.mktemp("fuzz-broker")),
                         {"shutdown.timeout.ms": 10000, "group.initial.rebalance.delay.ms": 0,
                          "num.partitions": 4}, start_timeout=240).start()
    try:
        _admin_create(broker.bootstrap, KNOWN_TOPIC)
        broker.log_seen = 0
        yield broker
    finally:
        broker.discard()


def _admin_create(bootstrap: str, topic: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)


# ---- strategies from kio's types ---------------------------------------------------------------

def _bounds(cls) -> tuple[int, int]:
    return getattr(cls, "__low__"), getattr(cls, "__high__")


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({0, 1, -1, low, high, low + 1, high - 1, 2 ** 31 - 1, -(2 ** 31)} & set(range(low, high + 1))
                   if high - low < 2 ** 20 else
                   {v for v in (0, 1, -1, low, high, low + 1, high - 1, 2 ** 31 - 1, -(2 ** 31), 2 ** 31)
                    if low <= v <= high})
    return st.one_of(st.sampled_from(edges), st.integers(low, high))


class _Huge(str):
    """A 32 KiB string that prints short (in a failing example)."""

    def __repr__(self) -> str:
        return f"'a' * {len(self)}"


class _HugeBytes(bytes):
    def __repr__(self) -> str:
        return f"b'\\xff' * {len(self)}"


def _strings(nullable: bool, big: bool) -> st.SearchStrategy:
    options = [st.sampled_from(NAMES), st.text(max_size=12)]
    if big:
        options.append(st.just(_Huge("a" * HUGE)))
    if nullable:
        options.append(st.none())
    return st.one_of(options)


def _bytes(nullable: bool, big: bool) -> st.SearchStrategy:
    options = [st.just(b""), st.binary(max_size=64)]
    if big:
        options.append(st.just(_HugeBytes(b"\xff" * 100_000)))
    if nullable:
        options.append(st.none())
    return st.one_of(options)


def _leaf(kafka_type: str | None, inner, nullable: bool, big: bool) -> st.SearchStrategy:
    if kafka_type == "string":
        return _strings(nullable, big)
    if kafka_type in ("bytes", "records"):
        return _bytes(nullable, big)
    if kafka_type == "bool":
        return st.booleans()
    if kafka_type == "uuid":
        s = st.one_of(st.just(uuid.UUID(int=0)), st.uuids())
        return st.one_of(st.none(), s) if nullable else s
    if kafka_type == "float64":
        return st.floats(allow_nan=True, allow_infinity=True)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        # milliseconds (schema.from_dict makes the timedelta). kio reads an i64 duration as a
        # timedelta of microseconds: beyond 2**63 us (292,000 years) it cannot, and the
        # request is refused as malformed (a known limit, see docs/RELIABILITY.md)
        return _ints(-(2 ** 31), 2 ** 31 - 1) if kafka_type == "timedelta_i32" else _ints(-(2 ** 53), 2 ** 53)
    if kafka_type == "datetime_i64":
        return _ints(-1, 253402300799000)
    if kafka_type == "error_code":
        return _ints(-1, 200)
    if kafka_type and kafka_type.startswith(("int", "uint")):
        return _ints(*_bounds(inner))
    raise AssertionError(f"no strategy for kio's kafka_type {kafka_type!r} ({inner})")


@functools.cache
def body_strategy(cls, big: bool = True) -> st.SearchStrategy[dict]:
    """Hostile values for every field of a kio entity, as the dict ``schema.from_dict`` takes.
    ``big``: strings may be 32 KiB and arrays 1,000 long (elements of a long array are small,
    so a request stays within a few MiB)."""
    fields = {}
    for f, hint in schema._fields(cls):
        inner, nullable = schema._strip_optional(hint)
        kafka_type = f.metadata.get("kafka_type")
        if typing.get_origin(inner) is tuple:
            item = typing.get_args(inner)[0]
            elem = body_strategy(item, big) if dataclasses.is_dataclass(item) else _leaf(kafka_type, item, False, big)
            options = [st.just([]), st.lists(elem, min_size=1, max_size=3)]
            if big:
                small = body_strategy(item, False) if dataclasses.is_dataclass(item) \
                    else _leaf(kafka_type, item, False, False)
                options.append(small.map(lambda x: [x] * LONG))
            if nullable:
                options.append(st.none())
            fields[f.name] = st.one_of(options)
        elif dataclasses.is_dataclass(inner):
            s = body_strategy(inner, big)
            fields[f.name] = st.one_of(st.none(), s) if nullable else s
        else:
            fields[f.name] = _leaf(kafka_type, inner, nullable, big)
    return st.fixed_dictionaries(fields)


def bounded_waits(api: int, body: dict) -> dict:
    """Requests whose answer Kafka may legitimately hold (a Fetch waits up to max_wait for
    min_bytes; a JoinGroup for the group's other members) keep that wait short, so a
    missing answer means a hang, not a patient broker."""
    if api == ApiKey.FETCH:
        body["max_wait"] = min(body["max_wait"], 100)
    elif api == ApiKey.JOIN_GROUP and body["group_id"]:
        body["group_id"] = f"fuzz-{uuid.uuid4().hex[:12]}"  # a fresh group: nobody to wait for
    return body


# ---- the wire ----------------------------------------------------------------------------------

def request_bytes(api: int, version: int, corr: int, body: bytes, client: str | None = "fuzz") -> bytes:
    cid = b"\xff\xff" if client is None else struct.pack(">h", len(client)) + client.encode()
    head = struct.pack(">hhi", api, version, corr) + cid
    if schema.request_header_flexible(api, version):
        head += b"\x00"
    return struct.pack(">i", len(head) + len(body)) + head + body


def probe_bytes() -> bytes:
    return request_bytes(ApiKey.API_VERSIONS, 0, PROBE_CORR, b"")


def exchange(bootstrap: str, data: bytes) -> tuple[list[tuple[int, bytes]], bool]:
    """Send ``data`` then the probe; read responses until the probe's answer (True) or a
    close (False). A hang fails the test."""
    host, port = bootstrap.rsplit(":", 1)
    frames: list[tuple[int, bytes]] = []
    with socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S) as s:
        try:
            s.sendall(data + probe_bytes())
        except (BrokenPipeError, ConnectionResetError):
            return frames, False
        buf = b""
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while True:
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                size = struct.unpack_from(">i", buf)[0]
                corr = struct.unpack_from(">i", buf, 4)[0]
                frames.append((corr, buf[8:4 + size]))
                buf = buf[4 + size:]
                if corr == PROBE_CORR:
                    return frames, True
            if time.monotonic() > deadline:
                raise AssertionError(f"no answer and no close within {ANSWER_TIMEOUT_S} s "
                                     f"(answers so far: {[c for c, _ in frames]})")
            try:
                chunk = s.recv(1 << 20)
            except socket.timeout:
                continue
            except ConnectionResetError:
                return frames, False
            if not chunk:
                return frames, False
            buf += chunk


def unknown_server_errors(value, path: str = "") -> list[str]:
    """Where a decoded response holds UNKNOWN_SERVER_ERROR (-1) as an error code."""
    found = []
    if isinstance(value, dict):
        for k, v in value.items():
            if k.endswith("error_code") and v == -1:
                found.append(f"{path}.{k} (message: {value.get('error_message')!r})")
            else:
                found += unknown_server_errors(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += unknown_server_errors(v, f"{path}[{i}]")
    return found


def new_log(broker: LocalBroker) -> tuple[list[str], list[str]]:
    """What the broker logged since the last call: errors (tracebacks included) and the
    reasons it gave for closing connections."""
    with open(broker.stderr_path, "rb") as f:
        f.seek(broker.log_seen)
        text = f.read().decode("utf-8", "replace")
        broker.log_seen = f.tell()
    problems, closes, keep = [], [], False
    for line in text.splitlines():
        if line[:4].isdigit():  # a new log record
            keep = " ERROR " in line or " CRITICAL " in line or "Traceback" in line
            if "bad request" in line or "clos" in line:
                closes.append(line[:600])
        elif line.startswith("--- Logging error ---"):  # logging's own report of a bad log call
            keep = True
        if keep or "Traceback" in line:
            problems.append(line[:600])
    return problems, closes


def describe(api: int, version: int) -> str:
    try:
        return f"{ApiKey(api).name} v{version}"
    except ValueError:
        return f"API {api} v{version}"


def _summary(body) -> str:
    text = repr(body)
    return text if len(text) < 1500 else text[:1500] + f"... ({len(text)} chars)"


# ---- the tests ---------------------------------------------------------------------------------

def test_the_broker_started_without_an_error(fuzz_broker):
    """Run first: what the broker logged while starting is not charged to the first request
    fuzzed (a logging error at start showed up as PRODUCE v3's)."""
    problems, _ = new_log(fuzz_broker)
    assert not problems, "the broker logged while starting:\n" + "\n".join(problems)


def test_the_broker_advertises_what_the_fuzzer_covers(fuzz_broker):
    frames, alive = exchange(fuzz_broker.bootstrap, request_bytes(
        ApiKey.API_VERSIONS, 3, 1, schema.encode_request(18, 3, {"client_software_name": "fuzz",
                                                                 "client_software_version": "1"})))
    assert alive
    answer = schema.decode_response(18, 3, frames[0][1])
    advertised = [(k["api_key"], v) for k in answer["api_keys"] for v in range(k["min_version"], k["max_version"] + 1)]
    assert sorted(advertised) == ADVERTISED


def _params(pairs):
    return [pytest.param(k, v, id=describe(k, v)) for k, v in pairs]


def assert_answered(broker: LocalBroker, api: int, version: int, body: dict) -> None:
    """The property, for one request body."""
    data = request_bytes(api, version, 1, schema.encode_request(api, version, body))
    frames, alive = exchange(broker.bootstrap, data)
    problems, closes = new_log(broker)
    assert not problems, f"{describe(api, version)}: the broker logged\n" + "\n".join(problems) + \
        f"\nfor the body {_summary(body)}"
    answered = [b for c, b in frames if c == 1]
    no_answer_due = api == ApiKey.PRODUCE and body["acks"] == 0
    # a failed SASL exchange is answered, then the connection closes (as Kafka's does)
    assert alive or (api in SASL_APIS and answered), \
        f"{describe(api, version)}: the connection was closed ({closes}) for the body {_summary(body)}"
    assert len(answered) == (0 if no_answer_due else 1), \
        f"{describe(api, version)}: {len(answered)} answers for the body {_summary(body)}"
    for raw in answered:
        if schema.response_header_flexible(api, version):
            raw = raw[framing.skip_tagged(memoryview(raw), 0):]
        decoded = schema.decode_response(api, version, raw)
        bad = unknown_server_errors(decoded)
        assert not bad, f"{describe(api, version)}: UNKNOWN_SERVER_ERROR at {bad} for the body {_summary(body)}"


@pytest.mark.parametrize("api,version", _params(SCHEMA_KNOWN))
def test_hostile_bodies_get_a_kafka_answer(fuzz_broker, api, version):
    @settings(max_examples=FUZZ_EXAMPLES, derandomize=True, database=None, deadline=None,
              suppress_health_check=list(HealthCheck), print_blob=False, phases=PHASES)
    @given(body=body_strategy(schema.request_class(api, version)))
    def check(body):
        assert_answered(fuzz_broker, api, version, bounded_waits(api, body))

    check()


# ---- what the fuzzer found (each also a fixed example, so it is checked on every run) --------------

@pytest.mark.parametrize("version", [0, 1])
def test_a_heartbeat_owning_the_zero_topic_id_is_answered(fuzz_broker, version):
    """kio reads the all-zero topic id as None: ConsumerGroupHeartbeat's translation took its
    .hex and closed the connection as malformed (core/kafka/groups.py)."""
    assert_answered(fuzz_broker, ApiKey.CONSUMER_GROUP_HEARTBEAT, version, {
        "group_id": f"fuzz-{uuid.uuid4().hex[:8]}", "member_id": uuid.uuid4().hex, "member_epoch": 0,
        "rebalance_timeout": 1000, "subscribed_topic_names": [KNOWN_TOPIC],
        "topic_partitions": [{"topic_id": uuid.UUID(int=0), "partitions": [0]}]})


@pytest.mark.parametrize("api,version,body", [
    (ApiKey.CREATE_ACLS, 1, {"creations": [{"resource_type": -127, "resource_name": "a" * HUGE,
                                            "resource_pattern_type": 0, "principal": "a" * HUGE,
                                            "host": "a" * HUGE, "operation": -127, "permission_type": 0}]}),
    (ApiKey.CREATE_TOPICS, 4, {"topics": [{"name": "a" * HUGE, "num_partitions": 1, "replication_factor": 1}],
                               "timeout": 1000}),
], ids=["CREATE_ACLS v1", "CREATE_TOPICS v4"])
def test_an_error_message_echoing_a_32k_name_still_encodes(fuzz_broker, api, version, body):
    """A non-flexible version's strings have an i16 length: an error message that quotes a
    client's 32 KiB name did not fit, the answer failed to encode ("String is too long for
    legacy string format"), and the client got UNKNOWN_SERVER_ERROR; the message is cut."""
    assert_answered(fuzz_broker, api, version, body)


def _valid_request(api: int, version: int) -> bytes:
    """A valid request body: every field at its schema default or zero, topics named."""
    if not schema.known(api, version):
        return b""
    return schema.encode_request(api, version, {})


@pytest.mark.parametrize("api,version", _params(ADVERTISED))
def test_mutated_bytes_get_an_answer_or_a_close(fuzz_broker, api, version):
    rng = random.Random(f"{api}/{version}")  # a fixed seed per API and version
    base = _valid_request(api, version)
    for i in range(max(FUZZ_EXAMPLES, 4)):
        body = bytearray(base + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 16))))
        if i % 2 == 0 and body:
            del body[rng.randrange(len(body)):]  # truncated
        else:
            for _ in range(rng.randrange(1, 9)):  # bit flips (in the header too)
                if body:
                    body[rng.randrange(len(body))] ^= 1 << rng.randrange(8)
        data = bytearray(request_bytes(api, version, 1, bytes(body)))
        if i % 4 == 3:
            data[4 + rng.randrange(8)] ^= 1 << rng.randrange(8)  # the api key, version or correlation id
        frames, _ = exchange(fuzz_broker.bootstrap, bytes(data))
        problems, _ = new_log(fuzz_broker)
        assert not problems, f"{describe(api, version)}: the broker logged\n" + "\n".join(problems) + \
            f"\nfor the request bytes {bytes(data)[:400].hex()}"


@pytest.mark.parametrize("api,version", [(ApiKey.CREATE_TOPICS, 0), (ApiKey.DELETE_TOPICS, 0),
                                         (ApiKey.DESCRIBE_CONFIGS, 0)])
def test_a_version_no_schema_reads_is_refused_at_once(fuzz_broker, api, version):
    """Kafka 4 removed these versions and kio has no schema for them: the broker does not
    advertise them, and a client that sends one anyway is refused (UNSUPPORTED_VERSION, the
    connection closes), not left waiting while the processor logs an exception."""
    assert not schema.known(api, version)
    assert not apis.REGISTRY[api].min_version <= version <= apis.REGISTRY[api].max_version
    began = time.monotonic()
    frames, alive = exchange(fuzz_broker.bootstrap, request_bytes(api, version, 1, b"\x00\x00\x00\x00"))
    assert not alive and not [c for c, _ in frames if c == 1]
    assert time.monotonic() - began < 5
    problems, closes = new_log(fuzz_broker)
    assert not problems
    assert any("UNSUPPORTED_VERSION" in line for line in closes), closes


def test_after_the_fuzzing_every_actor_lives_and_clients_still_work(fuzz_broker):
    status = fuzz_broker.status()
    restarted = {a["name"]: a["restarts"] for a in status["actors"] if a["restarts"]}
    not_running = {a["name"]: a["state"] for a in status["actors"] if a["state"] != "running"}
    assert not restarted and not not_running, f"restarted: {restarted}; not running: {not_running}"
    from confluent_kafka import Consumer, Producer
    topic = f"fuzz-after-{uuid.uuid4().hex[:8]}"
    _admin_create(fuzz_broker.bootstrap, topic)
    p = Producer({"bootstrap.servers": fuzz_broker.bootstrap})
    for i in range(10):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": fuzz_broker.bootstrap, "group.id": f"g-{topic}",
                  "auto.offset.reset": "earliest"})
    try:
        c.subscribe([topic])
        got, deadline = [], time.monotonic() + 60
        while len(got) < 10 and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is not None and not m.error():
                got.append(m.value())
        assert sorted(got) == sorted(b"v%d" % i for i in range(10))
    finally:
        c.close()
