"""The translation table between Kafka requests and the broker's internal requests. Pure.

One ``Api`` per Kafka key (``register``): the versions served, and
``to_internal(version, request) -> (body, frames)``: the Kafka body (kio's field names) becomes
the internal body of the same API (docs/PROTOCOL.md) plus payload frames;
``from_internal(version, request, reply, payload)``: the internal answer (``reply``, an
``actors.messages.Response``: its ``body``) becomes the Kafka
response (a dict ``schema`` encodes, or ready buffers);
``error(version, request, code, message)``: the response when the whole request failed (the
code on every partition, or at the top level).
``internal`` names the internal key when it differs; ``local`` answers in the processor without
a handler (ApiVersions). The other families register themselves on import (end of this module).
Invariant: ApiVersions advertises exactly this table.
"""
from __future__ import annotations

import dataclasses
import importlib
import struct
from typing import Callable

from odradek.core import kafka_batch, records
from odradek.core.errors import CorruptRecordError, RecordTooLargeError
from odradek.core.kafka import schema
from odradek.core.kafka.framing import FrameError, read_uvarint, skip_tagged, uvarint
from odradek.core.protocol import ApiKey, ErrorCode


@dataclasses.dataclass(frozen=True)
class Api:
    key: int
    min_version: int
    max_version: int
    to_internal: Callable | None = None
    from_internal: Callable | None = None
    error: Callable | None = None
    internal: int | None = None
    local: Callable | None = None  # (version, request) -> response dict, no handler involved
    answers: Callable | None = None  # (version, request) -> False if no response is due (acks=0)
    decode: Callable | None = None  # (version, body view) -> request dict; else kio's reader (schema)


REGISTRY: dict[int, Api] = {}


def register(api: Api) -> Api:
    """Add an API to the table ApiVersions advertises. Without a decoder of its own, an API
    is served (and advertised) from the first version kio has a schema for: Kafka 4 removed
    the oldest versions of some APIs (CreateTopics v0-1, DeleteTopics v0, DescribeConfigs
    v0), and a request no schema reads could only be refused."""
    if api.decode is None:
        first = next((v for v in range(api.min_version, api.max_version + 1) if schema.known(api.key, v)), None)
        if first is None:
            raise ValueError(f"kio has no schema for API {api.key} v{api.min_version}..v{api.max_version}")
        api = dataclasses.replace(api, min_version=first)
    REGISTRY[api.key] = api
    return api


def top_level_error(version: int, request: dict, code: int, message: str) -> dict:
    """The default error response: the code at the top level (schema fills the rest)."""
    return {"error_code": code, "error_message": message}


# ---- helpers shared by the partitioned APIs -------------------------------------------------

def _per_partition(request: dict, topics_key: str, name_key: str, parts_key: str, index_key: str,
                   out_topics: str, out_name: str, out_parts: str, out_index: str, entry: dict) -> dict:
    return {out_topics: [{out_name: t[name_key], out_parts: [{out_index: p[index_key], **entry}
                                                              for p in t[parts_key]]}
                         for t in request[topics_key]]}


# ---- ApiVersions (18): answered by the processor from this table ------------------------------

def api_versions(version: int, request: dict) -> dict:
    keys = [{"api_key": k, "min_version": a.min_version, "max_version": a.max_version}
            for k, a in sorted(REGISTRY.items())]
    return {"error_code": 0, "api_keys": keys}


register(Api(ApiKey.API_VERSIONS, 0, 3, local=api_versions))


# ---- Metadata (3) -------------------------------------------------------------------------------

OPERATIONS_NOT_ASKED = -2147483648  # Kafka's INT32_MIN: authorized operations not asked for

def metadata_to_internal(version: int, request: dict) -> tuple[dict, list]:
    body = {"allow_auto_topic_creation": bool(request.get("allow_auto_topic_creation", True))}
    # null: every topic (internally: no "topics"); a topic asked for by id alone (v10+, as a
    # KIP-848 consumer does for its assignment): every topic, filtered by id on the way back
    if request.get("topics") is not None and not _by_id(request):
        body["topics"] = [t["name"] for t in request["topics"] if t.get("name") is not None]
    for asked in ("include_topic_authorized_operations", "include_cluster_authorized_operations"):  # v8+, v8-10
        if request.get(asked):
            body[asked] = True
    return body, []


def _by_id(request: dict) -> set:
    """The topic ids a Metadata request asks for without a name."""
    return {t["topic_id"] for t in request.get("topics") or () if t.get("name") is None
            and t.get("topic_id") is not None and t["topic_id"].int != 0}


def metadata_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    ids = _by_id(request)
    names = {t.get("name") for t in request.get("topics") or ()} if ids else None
    topics = []
    for t in body.get("topics") or ():
        if ids and t["name"] not in names and _uuid(t.get("topic_id")) not in ids:
            continue
        parts = [{"error_code": p.get("error_code", 0), "partition_index": p["index"], "leader_id": p["leader"],
                  "leader_epoch": p.get("leader_epoch", -1), "replica_nodes": p.get("replicas") or [],
                  "isr_nodes": p.get("isr") or []} for p in t.get("partitions") or ()]
        topics.append({"error_code": t.get("error_code", 0), "name": t["name"], "topic_id": _uuid(t.get("topic_id")),
                       "is_internal": bool(t.get("is_internal")), "partitions": parts,
                       "topic_authorized_operations": t.get("authorized_operations", OPERATIONS_NOT_ASKED)})
    return {"brokers": body.get("brokers") or [], "cluster_id": body.get("cluster_id"),
            "controller_id": body.get("controller_id", -1), "topics": topics,
            "cluster_authorized_operations": body.get("cluster_authorized_operations", OPERATIONS_NOT_ASKED)}


def _uuid(value):
    import uuid
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            return uuid.uuid5(uuid.NAMESPACE_OID, value)
    return value if value is not None else uuid.UUID(int=0)


def metadata_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"topics": [{"error_code": code, "name": t.get("name")} for t in request.get("topics") or ()]}


register(Api(ApiKey.METADATA, 1, 12, metadata_to_internal, metadata_from_internal, metadata_error))


# ---- Produce (0) ----------------------------------------------------------------------------------

def produce_to_internal(version: int, request: dict) -> tuple[dict, list]:
    frames, topics = [], []
    for t in request["topic_data"]:
        parts = []
        for p in t["partition_data"]:
            parts.append({"index": p["index"], "frame": len(frames)})
            frames.append(p["records"] or b"")
        topics.append({"name": t["name"], "partitions": parts})
    body = {"acks": request["acks"], "timeout_ms": request["timeout"], "topics": topics}
    if request.get("transactional_id") is not None:  # v3+: what transactional batches need Write on
        body["transactional_id"] = request["transactional_id"]
    return body, frames


def decode_produce(version: int, view: memoryview) -> dict:
    """A Produce request body v3..v9, read by hand: the records stay slices of the request
    (no copy), and no entity-to-dict walk (kio's reader plus ``schema.to_dict`` were most of
    the processor's decoding time for a 64 KiB produce). Same dict as ``schema.decode_request``."""
    flex = version >= 9
    try:
        at = skip_tagged(view, 0) if flex else 0  # the request header's tagged fields
        transactional_id, at = _read_string(view, at, flex)
        acks, timeout = _I16.unpack_from(view, at)[0], _I32.unpack_from(view, at + 2)[0]
        n, at = _read_len(view, at + 6, flex)
        topics = []
        for _ in range(n):
            name, at = _read_string(view, at, flex)
            m, at = _read_len(view, at, flex)
            parts = []
            for _ in range(m):
                index = _I32.unpack_from(view, at)[0]
                size, at = _read_len(view, at + 4, flex)
                if size >= 0 and at + size > len(view):
                    raise FrameError(f"records of partition {index} run past the request")
                parts.append({"index": index, "records": view[at:at + size] if size >= 0 else None})
                at = at + max(size, 0)
                at = skip_tagged(view, at) if flex else at
            topics.append({"name": name, "partition_data": parts})
            at = skip_tagged(view, at) if flex else at
    except struct.error as exc:
        raise FrameError(f"ProduceRequest v{version} does not decode: {exc}") from None
    if name_missing := [t for t in topics if t["name"] is None]:
        raise FrameError(f"ProduceRequest v{version} has {len(name_missing)} topic(s) without a name")
    return {"transactional_id": transactional_id, "acks": acks, "timeout": timeout, "topic_data": topics}


def _read_len(view, at: int, flex: bool) -> tuple[int, int]:
    """An array or bytes length (-1: null)."""
    if flex:
        n, at = read_uvarint(view, at)
        return n - 1, at
    return _I32.unpack_from(view, at)[0], at + 4


def _read_string(view, at: int, flex: bool) -> tuple[str | None, int]:
    if flex:
        n, at = read_uvarint(view, at)
        n -= 1
    else:
        n, at = _I16.unpack_from(view, at)[0], at + 2
    if n < 0:
        return None, at
    if at + n > len(view):
        raise FrameError("a string runs past the request")
    return bytes(view[at:at + n]).decode("utf-8", "replace"), at + n


def produce_from_internal(version: int, request: dict, reply, payload: list) -> list:
    body = reply.body or {}
    return encode_produce(version, [(t["name"], t["partitions"]) for t in body.get("topics") or ()],
                          body.get("throttle_time_ms", 0))  # a quota's throttle (KIP-219), else 0


def produce_error(version: int, request: dict, code: int, message: str) -> list:
    return encode_produce(version, [(t["name"], [{"index": p["index"], "error_code": code, "error_message": message}
                                                 for p in t["partition_data"]]) for t in request["topic_data"]])


def encode_produce(version: int, topics: list, throttle_ms: int = 0) -> list:
    """Produce response v3..v9 (v9 flexible), written by hand as Fetch's is: one per produce
    request, so kio's generic writer (a third of the processor's time per Kafka produce) is
    not on this path. ``topics``: ``[(name, [internal partition entries])]``. Bytes equal
    to kio's (tests/kafka/test_codec.py)."""
    flex = version >= 9
    out = [_array_len(len(topics), flex)]
    for name, parts in topics:
        out.append(_string(name, flex))
        out.append(_array_len(len(parts), flex))
        for p in parts:
            append_time = p.get("log_append_time_ms", -1)
            fixed = _I32.pack(p["index"]) + _I16.pack(p.get("error_code", 0)) + \
                _I64.pack(p.get("base_offset", -1)) + _I64.pack(-1 if append_time is None else append_time)
            if version >= 5:
                fixed += _I64.pack(p.get("log_start_offset", -1))
            if version >= 8:  # record_errors (KIP-467: which records of the batch were refused), error_message
                fixed += _record_errors(p.get("record_errors") or (), flex) + \
                    _nullable_string(p.get("error_message"), flex)
            out.append(fixed + b"\x00" if flex else fixed)
        if flex:
            out.append(b"\x00")
    out.append(_I32.pack(throttle_ms) + b"\x00" if flex else _I32.pack(throttle_ms))  # throttle_time_ms (+ tagged fields)
    return [b"".join(out)]


def _record_errors(errors, flex: bool) -> bytes:
    """ProduceResponse's RecordErrors: [batch_index int32, batch_index_error_message nullable string]."""
    out = [_array_len(len(errors), flex)]
    for index, message in errors:
        out.append(_I32.pack(index) + _nullable_string(message, flex) + (b"\x00" if flex else b""))
    return b"".join(out)


register(Api(ApiKey.PRODUCE, 3, 9, produce_to_internal, produce_from_internal, produce_error,
             answers=lambda version, request: request.get("acks") != 0, decode=decode_produce))


# ---- Fetch (1) ------------------------------------------------------------------------------------
# Incremental fetch sessions (KIP-227) are declined: every answer carries session id 0, which
# tells the client that no session was created and that it sends full fetches (valid Kafka).
# The response is written here, not through kio, so record bytes are never copied twice.

FETCH_SESSION_ID_NOT_FOUND = 70


def fetch_to_internal(version: int, request: dict) -> tuple[dict, list]:
    topics = [{"name": t["topic"], "partitions": [
        {"index": p["partition"], "fetch_offset": p["fetch_offset"], "partition_max_bytes": p["partition_max_bytes"],
         "current_leader_epoch": p.get("current_leader_epoch", -1)} for p in t["partitions"]]}
        for t in request["topics"]]
    return {"replica_id": -1, "max_wait_ms": request["max_wait"], "min_bytes": request["min_bytes"],
            "max_bytes": request.get("max_bytes", 52428800), "isolation_level": request.get("isolation_level", 0),
            "topics": topics}, []


def fetch_from_internal(version: int, request: dict, reply, payload: list) -> list:
    """``payload``: the records as bytes (converted here), or, when the processor found only
    whole magic-2 batches in the file regions, the regions themselves (objects with ``left``,
    their length), which go into the response as they are, to be sent with ``os.sendfile``."""
    body = reply.body or {}
    if payload and all(hasattr(b, "left") for b in payload):
        regions = iter(payload)
        topics = [(t["name"], [(p, _regions_of(regions, p.get("records_size", 0))) for p in t["partitions"]])
                  for t in body.get("topics") or ()]
    else:
        data = b"".join(payload) if len(payload) != 1 else payload[0]
        at, topics = 0, []
        for t in body.get("topics") or ():
            parts = []
            for p in t["partitions"]:
                n = p.get("records_size", 0)
                parts.append((p, as_kafka_records(memoryview(data)[at:at + n])))
                at += n
            topics.append((t["name"], parts))
    return encode_fetch(version, body.get("error_code", 0), topics, body.get("throttle_time_ms", 0))


def _regions_of(regions, size: int) -> list:
    """The next file regions, ``size`` bytes of them: one partition's records (the fetch actor
    lists a partition's regions in a row, ``records_size`` their total length)."""
    out, n = [], 0
    while n < size:
        region = next(regions, None)
        if region is None:
            break
        out.append(region)
        n += region.left
    if n != size:
        raise ValueError(f"file regions of {n} bytes for a partition's {size}")
    return out


def fetch_error(version: int, request: dict, code: int, message: str) -> list:
    topics = [(t["topic"], [({"index": p["partition"], "error_code": code}, b"") for p in t["partitions"]])
              for t in request["topics"]]
    return encode_fetch(version, 0, topics)


def as_kafka_records(view: memoryview) -> bytes | memoryview:
    """A partition's stored batches as a Kafka consumer reads them: magic-2 batches as they
    are, native batches converted; a partial last batch is dropped (the client asks again)."""
    pos, out, plain = 0, [], True
    n = len(view)
    while n - pos >= records.HEADER_SIZE:
        h = records.BatchHeader.read(view, pos)
        end = pos + h.size
        if h.batch_length < records.MIN_BATCH_LENGTH or end > n:
            break
        if h.magic == kafka_batch.MAGIC:
            out.append(view[pos:end])
        else:
            plain = False
            try:
                batch = view[pos:end]
                out.append(kafka_batch.from_native(batch, h, records.decode_batch(batch, verify_crc=False)))
            except (CorruptRecordError, RecordTooLargeError):  # unreadable, or beyond the inflate bound
                break
        pos = end
    if plain:
        return view[:pos]
    return b"".join(out)


_I16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")


def encode_fetch(version: int, error_code: int, topics: list, throttle_ms: int = 0) -> list:
    """Fetch response v4..v12 (v12 flexible: compact arrays and strings, tagged fields). A
    partition's records: bytes, or a list of file regions (``left`` bytes each) that the
    processor sends with ``os.sendfile`` in their place."""
    flex = version >= 12
    out = [_I32.pack(throttle_ms)]  # throttle_time_ms (a quota's, KIP-219)
    if version >= 7:
        out.append(_I16.pack(error_code) + _I32.pack(0))  # error_code, session_id 0: no session
    out.append(_array_len(len(topics), flex))
    for name, parts in topics:
        out.append(_string(name, flex))
        out.append(_array_len(len(parts), flex))
        for p, data in parts:
            fixed = _I32.pack(p["index"]) + _I16.pack(p.get("error_code", 0)) + \
                _I64.pack(p.get("high_watermark", -1)) + _I64.pack(p.get("last_stable_offset", -1))
            if version >= 5:
                fixed += _I64.pack(p.get("log_start_offset", -1))
            aborted = p.get("aborted_transactions") or ()  # read_committed: the aborted ranges read
            fixed += _array_len(len(aborted), flex)
            for a in aborted:
                fixed += _I64.pack(a["producer_id"]) + _I64.pack(a["first_offset"]) + (b"\x00" if flex else b"")
            if version >= 11:
                fixed += _I32.pack(-1)  # preferred_read_replica
            if isinstance(data, list):  # file regions (sendfile)
                size = sum(r.left for r in data)
                fixed += uvarint(size + 1) if flex else _I32.pack(size)
                out.append(fixed)
                out.extend(data)
            else:
                fixed += uvarint(len(data) + 1) if flex else _I32.pack(len(data))
                out.append(fixed)
                if len(data):
                    out.append(data)
            if flex:
                out.append(b"\x00")
        if flex:
            out.append(b"\x00")
    if flex:
        out.append(b"\x00")
    return out


def _array_len(n: int, flex: bool) -> bytes:
    return uvarint(n + 1) if flex else _I32.pack(n)


def _string(s: str, flex: bool) -> bytes:
    raw = s.encode()
    return (uvarint(len(raw) + 1) if flex else _I16.pack(len(raw))) + raw


def _nullable_string(s: str | None, flex: bool) -> bytes:
    if s is None:
        return b"\x00" if flex else _I16.pack(-1)
    return _string(s, flex)




register(Api(ApiKey.FETCH, 4, 12, fetch_to_internal, fetch_from_internal, fetch_error))


# ---- ListOffsets (2) ---------------------------------------------------------------------------------

def list_offsets_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"isolation_level": request.get("isolation_level", 0), "topics": [{"name": t["name"], "partitions": [
        {"index": p["partition_index"], "timestamp": p["timestamp"],
         "current_leader_epoch": p.get("current_leader_epoch", -1)} for p in t["partitions"]]}
        for t in request["topics"]]}, []


def list_offsets_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"topics": [{"name": t["name"], "partitions": [
        {"partition_index": p["index"], "error_code": _list_offsets_code(version, p.get("error_code", 0)),
         "timestamp": p.get("timestamp", -1),
         "offset": p.get("offset", -1), "leader_epoch": p.get("leader_epoch", -1)} for p in t["partitions"]]}
        for t in body.get("topics") or ()]}


def _list_offsets_code(version: int, code: int) -> int:
    """OFFSET_NOT_AVAILABLE (a new leader's high watermark still below its epoch's start,
    KIP-207) is an answer of version 5 on; older clients get LEADER_NOT_AVAILABLE, which
    they retry too, as from Kafka's broker."""
    return int(ErrorCode.LEADER_NOT_AVAILABLE) if code == ErrorCode.OFFSET_NOT_AVAILABLE and version < 5 else code


def list_offsets_error(version: int, request: dict, code: int, message: str) -> dict:
    return _per_partition(request, "topics", "name", "partitions", "partition_index", "topics", "name",
                          "partitions", "partition_index", {"error_code": code, "timestamp": -1, "offset": -1})


register(Api(ApiKey.LIST_OFFSETS, 1, 7, list_offsets_to_internal, list_offsets_from_internal,
             list_offsets_error))


# ---- OffsetForLeaderEpoch (23) -------------------------------------------------------------------------

def epoch_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"replica_id": request.get("replica_id", -1), "topics": [{"name": t["topic"], "partitions": [
        {"index": p["partition"], "current_leader_epoch": p.get("current_leader_epoch", -1),
         "leader_epoch": p["leader_epoch"]} for p in t["partitions"]]} for t in request["topics"]]}, []


def epoch_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"topics": [{"topic": t["name"], "partitions": [
        {"partition": p["index"], "error_code": p.get("error_code", 0), "leader_epoch": p.get("leader_epoch", -1),
         "end_offset": p.get("end_offset", -1)} for p in t["partitions"]]} for t in body.get("topics") or ()]}


def epoch_error(version: int, request: dict, code: int, message: str) -> dict:
    return _per_partition(request, "topics", "topic", "partitions", "partition", "topics", "topic",
                          "partitions", "partition", {"error_code": code, "leader_epoch": -1, "end_offset": -1})


register(Api(ApiKey.OFFSET_FOR_LEADER_EPOCH, 2, 4, epoch_to_internal, epoch_from_internal, epoch_error))


# ---- the other families register themselves ---------------------------------------------------------

for _family in ("groups", "admin", "txn", "security"):
    try:
        importlib.import_module(f"odradek.core.kafka.{_family}")
    except ModuleNotFoundError as _exc:
        if _exc.name != f"odradek.core.kafka.{_family}":
            raise
