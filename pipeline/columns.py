"""Fetched record batches -> Arrow record batches in the schema of Spark's Kafka source.

Runs in an executor's Python worker, called by the reader's ``read()`` once per fetch answer.
Pure apart from pyarrow; no state. One Arrow batch per fetch answer (a few thousand to tens of
thousands of rows): per-record work is C iterators (``zip``, ``map``) over what
``msgpack.unpackb`` returns; offsets and timestamps become Arrow arrays without a Python loop
where the batch allows (consecutive offsets, one timestamp per LogAppendTime batch).

The Arrow types match the declared schema exactly (Spark refuses anything else): binary key and
value, string topic, int32 partition, int64 offset, timestamp[us, UTC], int32 timestampType,
and ``list<struct<key: string, value: binary>>`` headers when ``includeHeaders`` is set.
"""
from __future__ import annotations

import itertools
from operator import add

import lz4.block
import msgpack
import pyarrow as pa
import pyarrow.compute as pc

from log import records as fmt
from network.protocol import ErrorCode, OdradekError
from pipeline.broker import check_crc

SCHEMA_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, timestamp TIMESTAMP, "
              "timestampType INT")
HEADERS_DDL = "headers ARRAY<STRUCT<key: STRING, value: BINARY>>"

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
TS_TYPE = pa.timestamp("us", tz="UTC")
_FIELDS = [pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
           pa.field("partition", pa.int32()), pa.field("offset", pa.int64()), pa.field("timestamp", TS_TYPE),
           pa.field("timestampType", pa.int32())]
ARROW_SCHEMA = pa.schema(_FIELDS)
ARROW_SCHEMA_HEADERS = pa.schema(_FIELDS + [pa.field("headers", HEADER_TYPE)])

_unpackb = msgpack.unpackb
_repeat = itertools.repeat


def ddl(include_headers: bool) -> str:
    return SCHEMA_DDL + (", " + HEADERS_DDL if include_headers else "")


def arrow_schema(include_headers: bool) -> pa.Schema:
    return ARROW_SCHEMA_HEADERS if include_headers else ARROW_SCHEMA


def to_arrow(view, batches: list, topic: str, partition: int, lo: int, hi: int, include_headers: bool,
             verify_crc: bool = True) -> pa.RecordBatch | None:
    """The records with offsets in ``[lo, hi)`` of ``batches`` (``[(position, BatchHeader)]`` in
    ``view``) as one Arrow batch; None if there are none. Control batches are skipped."""
    offsets: list = []
    stamps: list = []
    kinds: list = []  # (row count, timestampType) runs
    keys: list = []
    values: list = []
    headers: list = []
    name = f"{topic}-{partition}"
    for pos, h in batches:
        if h.next_offset <= lo or h.base_offset >= hi or h.attributes & fmt.CONTROL_BIT:
            continue
        if verify_crc:
            check_crc(view, pos, h, name)
        n = h.record_count
        try:
            data = view[pos + fmt.HEADER_SIZE:pos + h.size]
            if h.attributes & fmt.COMPRESSION_MASK:
                data = lz4.block.decompress(data)
            rows = _unpackb(data, use_list=False, raw=False)
            if len(rows) != n:
                raise ValueError(f"{len(rows)} records, header says {n}")
            ods, tds, ks, vs, hs = zip(*rows)
        except Exception as exc:  # lz4, msgpack and shape errors all mean a corrupt batch
            raise OdradekError(f"{name}: batch at offset {h.base_offset} does not decode "
                               f"({type(exc).__name__}: {exc})", ErrorCode.CORRUPT_MESSAGE) from None
        base = h.base_offset
        consecutive = h.last_offset_delta == n - 1
        offs = range(base, base + n) if consecutive else list(map(add, _repeat(base, n), ods))
        if h.attributes & fmt.TIMESTAMP_TYPE_BIT:
            ts, kind = _repeat(h.max_timestamp, n), 1
        else:
            ts, kind = map(add, _repeat(h.first_timestamp, n), tds), 0
        if base >= lo and h.next_offset <= hi:  # the whole batch (the common case)
            offsets.extend(offs)
            stamps.extend(ts)
            keys.extend(ks)
            values.extend(vs)
            if include_headers:
                headers.extend(hs)
            kinds.append((n, kind))
            continue
        keep = [i for i, o in enumerate(offs) if lo <= o < hi]
        ts = list(ts)
        offsets.extend(offs[i] for i in keep)
        stamps.extend(ts[i] for i in keep)
        keys.extend(ks[i] for i in keep)
        values.extend(vs[i] for i in keep)
        if include_headers:
            headers.extend(hs[i] for i in keep)
        kinds.append((len(keep), kind))
    n = len(offsets)
    if n == 0:
        return None
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        pa.array(_repeat(topic, n), pa.string(), size=n),
        pa.array(_repeat(partition, n), pa.int32(), size=n),
        pa.array(offsets, pa.int64()),
        pc.multiply(pa.array(stamps, pa.int64()), 1000).cast(TS_TYPE),
        _timestamp_types(kinds, n),
    ]
    if include_headers:
        columns.append(headers_array(headers))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


def _timestamp_types(kinds: list, n: int) -> pa.Array:
    if all(k == 0 for _, k in kinds):
        return pa.array(_repeat(0, n), pa.int32(), size=n)
    return pa.array(itertools.chain.from_iterable(_repeat(k, c) for c, k in kinds), pa.int32(), size=n)


def headers_array(headers: list) -> pa.Array:
    """Per-record ``((key, value), ...)`` -> ``list<struct<key, value>>`` (never null: empty
    lists for records without headers, as Spark's Kafka source returns them)."""
    n = len(headers)
    lengths = list(map(len, headers))
    ends = list(itertools.accumulate(lengths, initial=0))
    flat = list(itertools.chain.from_iterable(headers))
    if flat:
        hkeys, hvalues = zip(*flat)
    else:
        hkeys = hvalues = ()
    struct = pa.StructArray.from_arrays([pa.array(hkeys, pa.string()), pa.array(hvalues, pa.binary())],
                                        fields=list(HEADER_TYPE.value_type))
    assert len(ends) == n + 1
    return pa.ListArray.from_arrays(pa.array(ends, pa.int32()), struct, type=HEADER_TYPE)
