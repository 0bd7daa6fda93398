"""The HTTP proxy's REST front: Confluent REST Proxy's v3 produce and v2 consumers as a WSGI
application (docs/SCHEMAS.md, "HTTP proxy", lists what is served and what is not).

Runs on the proxy actor's HTTP threads (waitress, ``actors.http_listener``). Owns nothing: a
request is authenticated by ``Principals`` (HTTP Basic against the SCRAM credentials when
the broker has SASL listeners), then served with that principal's Kafka clients (the bundled
``Producer``, ``Admin`` and, for v2 consumer instances, ``Consumer``; ``observe.proxy_clients``),
which talk to this broker like any client, as that user: its ACLs apply where the broker
applies them.

Bodies: JSON, at most ``MAX_BODY`` bytes (413 beyond). Errors are Confluent's bodies
``{"error_code", "message"}``: 40001 a malformed body, 40101 no or wrong credentials, 40301
refused by the ACLs, 40401 unknown topic, 40402 unknown partition, 40403 unknown consumer
instance, 40601 a consumer's format not the one asked, 40902 a consumer instance name taken,
42201 a value that is not of its schema, 42901 too many consumer instances, 50002/50003 the
broker's error (50003: worth a retry).

Values (v3 ``key``/``value``: ``{"type", "data"}``): BINARY (base64), JSON, STRING, and
schema-registry types AVRO, JSONSCHEMA and PROTOBUF, named by ``schema_id``, by ``subject`` (with
``schema_version``, default latest) or by neither (the topic's ``<topic>-value`` /
``<topic>-key`` subject, Confluent's TopicNameStrategy): encoded in the registry's wire
format (a zero byte, the schema id in 4 bytes big endian, the Avro binary or the JSON text).
"""
from __future__ import annotations

import base64
import binascii
import datetime
import io
import json
import logging
import struct
from typing import Any
from urllib.parse import parse_qs

from odradek.actors import http_listener
from odradek.network.basic_auth import challenge
from odradek.core.protocol import ErrorCode, OdradekError
from odradek.types import TopicPartition

log = logging.getLogger("odradek.proxy")

MAX_BODY = 4 * 1024 * 1024  # bytes of one request body (Confluent's REST proxy takes a few MiB too)
V2 = "application/vnd.kafka.v2+json"
STATUS = {200: "200 OK", 204: "204 No Content", 400: "400 Bad Request", 401: "401 Unauthorized",
          403: "403 Forbidden", 404: "404 Not Found", 405: "405 Method Not Allowed", 406: "406 Not Acceptable",
          409: "409 Conflict", 413: "413 Payload Too Large", 422: "422 Unprocessable Entity",
          429: "429 Too Many Requests", 500: "500 Internal Server Error", 503: "503 Service Unavailable"}
REFUSED = frozenset({ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                     ErrorCode.CLUSTER_AUTHORIZATION_FAILED, ErrorCode.SASL_AUTHENTICATION_FAILED})
TOO_LARGE = frozenset({ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE})
SIMPLE_TYPES = ("BINARY", "JSON", "STRING")
SCHEMA_TYPES = {"AVRO": "AVRO", "JSONSCHEMA": "JSON", "PROTOBUF": "PROTOBUF"}  # ours -> the registry's schemaType
MAGIC = b"\0"


class ProxyError(Exception):
    """An answer other than success: HTTP status, Confluent's error code, a message."""

    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def broker_error(exc: OdradekError, topic: str | None = None) -> ProxyError:
    """The proxy's answer to a broker error."""
    code = exc.code
    if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:  # a partition is checked before (40402)
        return ProxyError(404, 40401, f"Topic {topic!r} not found: {exc.message}" if topic else exc.message)
    if code in REFUSED:
        return ProxyError(403, 40301, f"Not authorized: {exc.message}")
    if code in TOO_LARGE:
        return ProxyError(422, 42201, exc.message)
    return ProxyError(500, 50003 if code.retriable else 50002, f"{code.name}: {exc.message}")


# ---- request bodies ----------------------------------------------------------------------------
def read_body(environ: dict) -> Any:
    """The request's JSON body (None when empty); 413 41301 past MAX_BODY, 400 40001 if not JSON."""
    def refuse(status: int, why: str) -> ProxyError:
        if status == 413:
            return ProxyError(413, 41301, why)
        return ProxyError(400, 40001, f"{why} (one JSON object a request: streamed produce is not supported)")
    return http_listener.read_json(environ, MAX_BODY, refuse)


def _b64(text: Any, what: str) -> bytes:
    if not isinstance(text, str):
        raise ProxyError(400, 40001, f"{what} must be a base64 string")
    try:
        return base64.b64decode(text.encode(), validate=True)
    except (binascii.Error, ValueError):
        raise ProxyError(400, 40001, f"{what} is not valid base64") from None


def parse_timestamp(value: Any) -> int | None:
    """v3's ``timestamp`` (ISO 8601, Confluent's form) as milliseconds since the epoch."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProxyError(400, 40001, "timestamp must be an ISO 8601 date-time string (2026-11-28T22:00:00Z)")
    try:
        when = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ProxyError(400, 40001, f"timestamp {value[:64]!r} is not an ISO 8601 date-time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return int(when.timestamp() * 1000)


def format_timestamp(ms: int) -> str:
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def parse_headers(value: Any) -> list | None:
    """v3's ``headers``: ``[{"name": str, "value": base64 | null}]`` as (name, bytes) pairs."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(h, dict) and isinstance(h.get("name"), str) for h in value):
        raise ProxyError(400, 40001, 'headers must be a list of {"name": string, "value": base64 string}')
    return [(h["name"], None if h.get("value") is None else _b64(h["value"], f"header {h['name'][:64]!r}"))
            for h in value]


class Encoder:
    """Turns v3's ``key``/``value`` objects into bytes. ``schema(kind, ref)`` fetches a schema
    from the registry: ``kind`` "id" (``ref`` the id) or "subject" (``ref`` (subject, version));
    it returns ``{"id", "schema", "schemaType"}`` or raises ProxyError."""

    def __init__(self, schema):
        self.schema = schema

    def encode(self, part: Any, topic: str, which: str) -> tuple[bytes | None, str | None]:
        """``(bytes or None, the type named in the answer)``; ``which`` is "key" or "value"."""
        if part is None:
            return None, None
        if not isinstance(part, dict):
            raise ProxyError(400, 40001, f'{which} must be an object {{"type": ..., "data": ...}}')
        kind = part.get("type")
        kind = kind.upper() if isinstance(kind, str) else kind
        data = part.get("data")
        by_schema = any(part.get(k) is not None for k in ("schema_id", "subject", "schema_version"))
        if kind in SIMPLE_TYPES and not by_schema:
            if data is None:
                return None, kind
            if kind == "BINARY":
                return _b64(data, f"{which}.data"), kind
            if kind == "STRING":
                if not isinstance(data, str):
                    raise ProxyError(400, 40001, f"{which}.data must be a string for type STRING")
                return data.encode("utf-8"), kind
            return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode(), kind
        if kind is None and not by_schema:
            raise ProxyError(400, 40001, f"{which}.type is missing: one of BINARY, JSON, STRING, AVRO, JSONSCHEMA, "
                                         f"PROTOBUF")
        if kind is not None and kind not in SCHEMA_TYPES:
            raise ProxyError(400, 40001, f"{which}.type {kind!r} is not one of BINARY, JSON, STRING, AVRO, "
                                         f"JSONSCHEMA, PROTOBUF")
        if part.get("schema") is not None:
            raise ProxyError(400, 40001, f"{which}.schema (a raw schema) is not supported: register it with the "
                                         f"schema registry and name it by schema_id or subject")
        found = self._schema(part, topic, which)
        actual = found.get("schemaType") or "AVRO"
        if kind is not None and SCHEMA_TYPES[kind] != actual:
            raise ProxyError(400, 40001, f"{which}.type is {kind} but schema {found['id']} is {actual}")
        return MAGIC + struct.pack(">I", int(found["id"])) + _serialize(actual, found, data, which), \
            {"JSON": "JSONSCHEMA"}.get(actual, actual)

    def _schema(self, part: dict, topic: str, which: str) -> dict:
        if part.get("schema_id") is not None:
            if not isinstance(part["schema_id"], int) or part["schema_id"] < 0:
                raise ProxyError(400, 40001, f"{which}.schema_id must be a non-negative integer")
            return self.schema("id", part["schema_id"])
        subject = part.get("subject") if part.get("subject") is not None else f"{topic}-{which}"
        version = part.get("schema_version")
        if not isinstance(subject, str) or not (version is None or isinstance(version, int)):
            raise ProxyError(400, 40001, f"{which}.subject must be a string and {which}.schema_version an integer")
        return self.schema("subject", (subject, "latest" if version is None else str(version)))


def _serialize(schema_type: str, found: dict, data: Any, which: str) -> bytes:
    if schema_type == "AVRO":
        import fastavro
        try:
            parsed = fastavro.parse_schema(json.loads(found["schema"]))
            out = io.BytesIO()
            fastavro.schemaless_writer(out, parsed, data)
            return out.getvalue()
        except (ValueError, TypeError, KeyError, AttributeError, fastavro.schema.SchemaParseException) as exc:
            raise ProxyError(422, 42201, f"{which}.data does not match Avro schema {found['id']}: {exc}") from None
    if schema_type == "JSON":
        import jsonschema
        try:
            jsonschema.validate(data, json.loads(found["schema"]))
        except jsonschema.ValidationError as exc:
            raise ProxyError(422, 42201, f"{which}.data does not match JSON schema {found['id']}: "
                                         f"{exc.message}") from None
        except (ValueError, jsonschema.SchemaError) as exc:
            raise ProxyError(422, 42201, f"schema {found['id']} cannot be used: {exc}") from None
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    if schema_type == "PROTOBUF":
        return _protobuf(found, data, which)
    raise ProxyError(400, 40001, f"{which}: {schema_type} schemas are not encoded by this proxy (AVRO, "
                                 f"JSONSCHEMA and PROTOBUF are); send the serialized bytes as BINARY")


def _protobuf(found: dict, data: Any, which: str) -> bytes:
    """``data`` (the JSON form of a message, as protobuf's json_format reads it) as the schema's
    first message type, after its message indexes (a single 0: the first message, as
    Confluent's serializer writes them). The schema is the serialized descriptor
    confluent-kafka registers, or .proto text (read by the registry's own parser)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
    from google.protobuf.message import DecodeError

    from odradek.coordinator.schema_formats import protobuf_descriptor

    text = found["schema"]
    try:
        serialized = protobuf_descriptor(text) or text
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(serialized, validate=True))
        if fdp.dependency or not fdp.message_type:
            raise ValueError("it imports other files or declares no message")
        pool = descriptor_pool.DescriptorPool()
        pool.Add(fdp)
        cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(
            ".".join(filter(None, (fdp.package, fdp.message_type[0].name)))))
    except (ValueError, TypeError, KeyError, DecodeError, binascii.Error) as exc:
        raise ProxyError(422, 42201, f"schema {found['id']} cannot be used to encode {which}.data: {exc}") from None
    try:
        message = json_format.ParseDict(data, cls())
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise ProxyError(422, 42201, f"{which}.data does not match Protobuf schema {found['id']}: {exc}") from None
    return b"\x00" + message.SerializeToString()


# ---- v2 consumer answers -----------------------------------------------------------------------
FORMATS = ("binary", "json")


def accepted_format(accept: str) -> str | None:
    """The embedded format an ``Accept`` header asks for (``application/vnd.kafka.json.v2+json``),
    None when it names none (the instance's own)."""
    for item in (accept or "").split(","):
        media = item.split(";")[0].strip().lower()
        if media.startswith("application/vnd.kafka.") and media.endswith(".v2+json"):
            fmt = media[len("application/vnd.kafka."):-len(".v2+json")]
            if fmt:
                return fmt
    return None


def v2_record(record, fmt: str) -> dict:
    if fmt == "binary":
        key = None if record.key is None else base64.b64encode(record.key).decode()
        value = None if record.value is None else base64.b64encode(record.value).decode()
    else:
        key, value = _json_of(record.key), _json_of(record.value)
    return {"topic": record.topic, "key": key, "value": value, "partition": record.partition,
            "offset": record.offset}


def _json_of(data: bytes | None) -> Any:
    """A key or value for a json instance: its JSON, else (not JSON) its text as a string
    (invalid UTF-8 replaced), so one such record never jams the instance; binary reads bytes."""
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return data.decode("utf-8", errors="replace")


def respond(start_response, status: int, answer: Any, content_type: str, extra: tuple = ()) -> list:
    data = b"" if answer is None else json.dumps(answer).encode()
    headers = [("Content-Type", content_type), ("Content-Length", str(len(data))), *extra]
    start_response(STATUS.get(status, f"{status} Error"), headers)
    return [data]
def committed_offsets(instance, body: Any) -> dict:
    """``{tp: offset to commit}`` for v2's POST offsets: the body's offsets (each the last
    record consumed, so the next one is committed, as Confluent's proxy does) or, without
    a body, what was handed out."""
    if body is None or (isinstance(body, dict) and not body.get("offsets")):
        return dict(instance.handed)
    offsets = body.get("offsets") if isinstance(body, dict) else None
    if not isinstance(offsets, list) or not all(
            isinstance(o, dict) and isinstance(o.get("topic"), str) and isinstance(o.get("partition"), int)
            and isinstance(o.get("offset"), int) and o["offset"] >= 0 for o in offsets):
        raise ProxyError(422, 42202, 'offsets must be a list of {"topic": string, "partition": int, "offset": int}')
    return {TopicPartition(o["topic"], o["partition"]): o["offset"] + 1 for o in offsets}


def check_broker(call: Callable[[], Any], topic: str | None = None) -> Any:
    """``call()``, a broker error turned into the proxy's answer."""
    try:
        return call()
    except OdradekError as exc:
        raise broker_error(exc, topic) from None
    except TimeoutError as exc:
        raise ProxyError(500, 50003, f"{ErrorCode.REQUEST_TIMED_OUT.name}: {exc}") from None


# ---- routes ------------------------------------------------------------------------------------
POLL_TIMEOUT_MS = 1000  # a v2 records request waits this long for records unless it says (timeout=)
MAX_POLL_TIMEOUT_MS = 30000
MAX_ANSWER_BYTES = 8 * 1024 * 1024  # keys and values in one records answer, at most (max_bytes= lowers it)
PRODUCE_TIMEOUT = 65.0  # seconds a produce waits for its acknowledgement (the producer's delivery timeout + 5)
INSTANCE_BUSY_TIMEOUT = 30.0  # seconds a request waits for another on the same consumer instance


def make_app(principals, instances, cluster_id: str, schema):
    """The WSGI application. ``principals``/``instances``: ``observe.proxy_clients``;
    ``schema(kind, ref, authorization)``: a schema from the registry (``Encoder``)."""

    def app(environ, start_response):
        content_type = V2 if (environ.get("PATH_INFO") or "").startswith(("/consumers", "/topics")) \
            else "application/json"
        extra: tuple = ()
        try:
            status, answer = _serve(environ, principals, instances, cluster_id, schema)
        except ProxyError as exc:
            status, answer = exc.status, {"error_code": exc.code, "message": exc.message}
            if exc.status == 401:
                extra = (challenge("odradek http proxy"),)
        except Exception:  # a bug here, not the client's fault: say so, keep serving
            log.exception("http proxy: %s %s failed", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
            status, answer = 500, {"error_code": 50001, "message": "internal error of the proxy (logged)"}
        return respond(start_response, status, answer, content_type, extra)

    return app


def _serve(environ: dict, principals, instances, cluster_id: str, schema) -> tuple[int, Any]:
    method = environ.get("REQUEST_METHOD", "GET")
    parts = [p for p in (environ.get("PATH_INFO") or "/").split("/") if p]
    principal = principals.of(environ)
    body = read_body(environ) if method in ("POST", "PUT") else None
    base = f"{environ.get('wsgi.url_scheme', 'http')}://{environ.get('HTTP_HOST') or 'localhost'}"
    n = len(parts)
    if parts[:2] == ["v3", "clusters"]:
        if n == 2 and method == "GET":
            return 200, {"kind": "KafkaClusterList", "metadata": {"self": f"{base}/v3/clusters", "next": None},
                         "data": [_cluster(base, cluster_id)]}
        if n >= 3 and parts[2] != cluster_id:
            raise ProxyError(404, 40401, f"Cluster {parts[2]!r} not found: this broker's cluster is {cluster_id!r} "
                                         f"(GET /v3/clusters)")
        if n == 3 and method == "GET":
            return 200, _cluster(base, cluster_id)
        if n == 4 and parts[3] == "topics" and method == "GET":
            admin = principal.admin()
            names = check_broker(admin.list_topics)
            return 200, {"kind": "KafkaTopicList", "metadata": {"self": f"{base}/v3/clusters/{cluster_id}/topics",
                                                                "next": None},
                         "data": [_topic(base, cluster_id, check_broker(lambda t=t: admin.describe_topic(t, False), t))
                                  for t in names]}
        if n == 5 and parts[3] == "topics" and method == "GET":
            topic = parts[4]
            return 200, _topic(base, cluster_id, check_broker(lambda: principal.admin().describe_topic(topic, False),
                                                              topic))
        if n == 6 and parts[3] == "topics" and parts[5] == "records" and method == "POST":
            return 200, _produce(principal, cluster_id, parts[4], body, Encoder(
                lambda kind, ref: schema(kind, ref, environ.get("HTTP_AUTHORIZATION"))))
    elif parts == ["topics"] and method == "GET":
        return 200, check_broker(principal.admin().list_topics)
    elif parts[:1] == ["consumers"] and n >= 2:
        group = parts[1]
        if n == 2 and method == "POST":
            instance = instances.create(principal, group, body)
            return 200, {"instance_id": instance.name,
                         "base_uri": f"{base}/consumers/{group}/instances/{instance.name}"}
        if n >= 4 and parts[2] == "instances":
            name, rest = parts[3], parts[4:]
            if not rest and method == "DELETE":
                instances.delete(principal, group, name)
                return 204, None
            if rest == ["subscription"]:
                return _subscription(instances.get(principal, group, name), method, body)
            if rest == ["records"] and method == "GET":
                return 200, _records(instances.get(principal, group, name), environ)
            if rest == ["offsets"] and method == "POST":
                instance = instances.get(principal, group, name)
                offsets = committed_offsets(instance, body)
                with _busy(instance):
                    if offsets:
                        check_broker(lambda: instance.consumer.commit(offsets))
                return 200, None
    raise ProxyError(404, 404, f"no such endpoint: {method} /{'/'.join(parts)} (docs/SCHEMAS.md, \"HTTP proxy\", "
                               f"lists them)")


def _cluster(base: str, cluster_id: str) -> dict:
    me = f"{base}/v3/clusters/{cluster_id}"
    return {"kind": "KafkaCluster", "metadata": {"self": me, "resource_name": f"crn:///kafka={cluster_id}"},
            "cluster_id": cluster_id, "topics": {"related": f"{me}/topics"}}


def _topic(base: str, cluster_id: str, d) -> dict:
    me = f"{base}/v3/clusters/{cluster_id}/topics/{d.name}"
    return {"kind": "KafkaTopic", "metadata": {"self": me, "resource_name": f"crn:///kafka={cluster_id}/topic={d.name}"},
            "cluster_id": cluster_id, "topic_name": d.name, "is_internal": d.is_internal,
            "replication_factor": len(d.partitions[0].replicas) if d.partitions else 0,
            "partitions_count": len(d.partitions), "partitions": {"related": f"{me}/partitions"}}


def _produce(principal, cluster_id: str, topic: str, body: Any, encoder: Encoder) -> dict:
    if not isinstance(body, dict):
        raise ProxyError(400, 40001, 'the body must be one JSON object {"key": ..., "value": ..., ...}')
    partition = body.get("partition_id")
    if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool) or partition < 0):
        raise ProxyError(400, 40001, "partition_id must be a non-negative integer")
    key, key_type = encoder.encode(body.get("key"), topic, "key")
    value, value_type = encoder.encode(body.get("value"), topic, "value")
    headers, timestamp = parse_headers(body.get("headers")), parse_timestamp(body.get("timestamp"))
    described = check_broker(lambda: principal.admin().describe_topic(topic, False), topic)
    if partition is not None and partition >= len(described.partitions):
        raise ProxyError(404, 40402, f"Partition {partition} of topic {topic!r} not found (it has "
                                     f"{len(described.partitions)})")
    producer = principal.producer()
    sent = check_broker(lambda: producer.send(topic, value, key=key, partition=partition, headers=headers,
                                              timestamp_ms=timestamp).result(PRODUCE_TIMEOUT), topic)
    return {"error_code": 200, "cluster_id": cluster_id, "topic_name": topic, "partition_id": sent.partition,
            "offset": sent.offset, "timestamp": format_timestamp(sent.timestamp),
            "key": None if key_type is None else {"type": key_type, "size": len(key or b"")},
            "value": None if value_type is None else {"type": value_type, "size": len(value or b"")}}


class _busy:
    """Holds a consumer instance for one request (the bundled consumer is not thread-safe)."""

    def __init__(self, instance):
        self.instance = instance

    def __enter__(self):
        if not self.instance.lock.acquire(timeout=INSTANCE_BUSY_TIMEOUT):
            raise ProxyError(409, 40901, f"consumer instance {self.instance.name!r} is busy with another request")
        return self.instance

    def __exit__(self, *exc):
        self.instance.lock.release()


def _subscription(instance, method: str, body: Any) -> tuple[int, Any]:
    with _busy(instance):
        if method == "GET":
            return 200, {"topics": list(instance.topics)}
        if method == "DELETE":
            check_broker(instance.consumer.unsubscribe)
            instance.topics = []
            instance.pending.clear()
            return 204, None
        if method != "POST":
            raise ProxyError(405, 405, f"{method} is not served on a subscription (GET, POST, DELETE)")
        topics = body.get("topics") if isinstance(body, dict) else None
        pattern = body.get("topic_pattern") if isinstance(body, dict) else None
        if (topics is None) == (pattern is None):
            raise ProxyError(409, 40902, 'subscribe with either "topics" (a list) or "topic_pattern" (a regex)')
        if topics is not None and (not isinstance(topics, list) or not topics or
                                   not all(isinstance(t, str) and t for t in topics)):
            raise ProxyError(422, 42204, "topics must be a non-empty list of topic names")
        if pattern is not None and not isinstance(pattern, str):
            raise ProxyError(422, 42204, "topic_pattern must be a string")
        check_broker(lambda: instance.consumer.subscribe(topics=topics, pattern=pattern))
        instance.topics = list(topics or [])
        instance.pending.clear()
        return 204, None


def _int_query(query: dict, name: str, default: int, most: int) -> int:
    raw = (query.get(name) or [None])[0]
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ProxyError(400, 40001, f"{name} must be an integer") from None
    if value < 0:
        raise ProxyError(400, 40001, f"{name} must not be negative")
    return min(value, most)


def _records(instance, environ: dict) -> list:
    asked = accepted_format(environ.get("HTTP_ACCEPT") or "")
    if asked is not None and asked != instance.format:
        raise ProxyError(406, 40601, f"consumer instance {instance.name!r} reads {instance.format}; ask with "
                                     f"Accept: application/vnd.kafka.{instance.format}.v2+json")
    query = parse_qs(environ.get("QUERY_STRING") or "")
    timeout = _int_query(query, "timeout", POLL_TIMEOUT_MS, MAX_POLL_TIMEOUT_MS)
    max_bytes = _int_query(query, "max_bytes", MAX_ANSWER_BYTES, MAX_ANSWER_BYTES)
    with _busy(instance):
        if not instance.pending:
            polled = check_broker(lambda: instance.consumer.poll(timeout))
            instance.pending.extend(polled)
        out, size = [], 0
        while instance.pending:
            record = instance.pending[0]
            length = len(record.key or b"") + len(record.value or b"")
            if out and size + length > max_bytes:
                break
            out.append(v2_record(record, instance.format))
            instance.pending.popleft()
            size += length
            instance.handed[TopicPartition(record.topic, record.partition)] = record.offset + 1
        return out
