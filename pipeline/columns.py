"""Fetched record batches -> Arrow record batches in the schema of Spark's Kafka source.

Runs in an executor's Python worker, called by the reader's ``read()`` once per fetch answer.
Pure apart from pyarrow; no state. One Arrow batch per fetch answer (a few thousand to tens of
thousands of rows): per-record work is C iterators (``map`` with ``itemgetter``) over the tuples
``msgpack.unpackb`` returns (a Kafka client's magic-2 batch is decoded into the same tuples); offsets, timestamps and timestampType go into ``array.array``
buffers that Arrow wraps without copying item by item, and the constant topic and partition
columns are zero-copy slices of cached arrays.

The Arrow types match the declared schema exactly (Spark refuses anything else): binary key and
value, string topic, int32 partition, int64 offset, timestamp[us, UTC], int32 timestampType,
and ``list<struct<key: string, value: binary>>`` headers when ``includeHeaders`` is set.
"""
from __future__ import annotations

import array
import itertools
from operator import add, itemgetter

import msgpack
import pyarrow as pa
import pyarrow.compute as pc

from odradek.core import inflate, kafka_batch
from odradek.core import records as fmt
from odradek.core.protocol import ErrorCode, OdradekError
from odradek.pipeline.broker import check_crc

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
    offsets = array.array("q")
    stamps = array.array("q")
    kinds = array.array("i")  # timestampType per record, filled only once a LogAppendTime batch shows up
    keys: list = []
    values: list = []
    headers: list = []
    name = f"{topic}-{partition}"
    for pos, h in batches:
        if h.next_offset <= lo or h.base_offset >= hi or h.attributes & fmt.CONTROL_BIT:
            continue
        if verify_crc:
            check_crc(view, pos, h, name)
        rows = _rows(view, pos, h, name)
        base = h.base_offset
        n = h.record_count
        if h.last_offset_delta == n - 1:  # consecutive offsets: positions are offsets
            if base < lo or h.next_offset > hi:
                rows = rows[max(0, lo - base):hi - base]
                base = max(base, lo)
            offsets.extend(range(base, base + len(rows)))
        else:  # gaps (a compacted batch): offsets from the deltas
            if base < lo or h.next_offset > hi:
                rows = tuple(r for r in rows if lo <= base + r[0] < hi)
            offsets.extend(map(add, _repeat(base, len(rows)), map(_delta, rows)))
        n = len(rows)
        if h.attributes & fmt.TIMESTAMP_TYPE_BIT:
            stamps.extend(_repeat(h.max_timestamp, n))
            if not kinds:
                kinds.extend(_repeat(0, len(offsets) - n))
            kinds.extend(_repeat(1, n))
        else:
            stamps.extend(map(add, _repeat(h.first_timestamp, n), map(_ts_delta, rows)))
            if kinds:
                kinds.extend(_repeat(0, n))
        keys.extend(map(_key, rows))
        values.extend(map(_value, rows))
        if include_headers:
            headers.extend(map(_headers, rows))
    n = len(offsets)
    if n == 0:
        return None
    columns = [
        pa.array(keys, pa.binary()),
        pa.array(values, pa.binary()),
        _constant_string(topic, n),
        _constant_int32(partition, n),
        _from_array(pa.int64(), offsets),
        pc.multiply(_from_array(pa.int64(), stamps), 1000).cast(TS_TYPE),
        _from_array(pa.int32(), kinds) if kinds else _constant_int32(0, n),
    ]
    if include_headers:
        columns.append(headers_array(headers))
    return pa.RecordBatch.from_arrays(columns, schema=arrow_schema(include_headers))


_delta, _ts_delta, _key, _value, _headers = (itemgetter(i) for i in range(5))


def _row(base: int, first_ts: int):
    """A ``kafka_batch.decode`` record type building native rows relative to the batch."""
    def row(offset, ts, key, value, headers):
        return offset - base, ts - first_ts, key, value, tuple(map(tuple, headers))
    return row


def _rows(view, pos: int, h, name: str) -> tuple:
    """The batch's records as msgpack decodes them: ``(offset delta, ts delta, key, value, headers)``.
    A Kafka client's magic-2 batch is decoded by ``core/kafka_batch.py`` into the same rows."""
    try:
        if h.magic == kafka_batch.MAGIC:
            return tuple(kafka_batch.decode(view[pos:pos + h.size], h, _row(h.base_offset, h.first_timestamp)))
        data = view[pos + fmt.HEADER_SIZE:pos + h.size]
        if h.attributes & fmt.COMPRESSION_MASK:  # inflated within the bound (core/inflate.py)
            data = inflate.inflate(inflate.LZ4_BLOCK, data)
        rows = _unpackb(data, use_list=False, raw=False)
        if type(rows) is not tuple or len(rows) != h.record_count or len(rows[0]) != 5:
            raise ValueError(f"not {h.record_count} records of 5 fields")
        return rows
    except OdradekError as exc:  # beyond the bound, or not lz4
        raise OdradekError(f"{name}: batch at offset {h.base_offset}: {exc.message}", exc.code) from None
    except Exception as exc:  # msgpack and shape errors mean a corrupt batch
        raise OdradekError(f"{name}: batch at offset {h.base_offset} does not decode "
                           f"({type(exc).__name__}: {exc})", ErrorCode.CORRUPT_MESSAGE) from None


def _from_array(typ: pa.DataType, values: array.array) -> pa.Array:
    """An Arrow array over an ``array.array``'s buffer (no per-item conversion)."""
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


_CONSTANTS: dict = {}  # (kind, value) -> an Arrow array at least as long as any asked for


def _constant(key, n: int, build) -> pa.Array:
    arr = _CONSTANTS.get(key)
    if arr is None or len(arr) < n:
        if len(_CONSTANTS) > 256:
            _CONSTANTS.clear()
        arr = _CONSTANTS[key] = build(max(n, 65536))
    return arr.slice(0, n)  # zero-copy


def _constant_string(value: str, n: int) -> pa.Array:
    def build(m: int) -> pa.Array:
        raw = value.encode()
        ends = array.array("i", range(0, (m + 1) * len(raw), len(raw)))
        return pa.Array.from_buffers(pa.string(), m, [None, pa.py_buffer(ends), pa.py_buffer(raw * m)])
    return _constant(("s", value), n, build)


def _constant_int32(value: int, n: int) -> pa.Array:
    return _constant(("i", value), n, lambda m: _from_array(pa.int32(), array.array("i", [value]) * m))


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
