"""Helpers for the connector tests: produce known records, read them back through Spark."""
from __future__ import annotations

from odradek import Admin, Producer

BASE_TS = 1_700_000_000_000  # a fixed time in ms: timestamps are exact, not "now"


def create(bootstrap: str, topic: str, partitions: int = 1) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions)


def produce(bootstrap: str, topic: str, n: int, partitions: int = 1, start: int = 0, headers: bool = True,
            ts0: int = BASE_TS) -> list[tuple]:
    """``n`` records spread over partitions; returns what the broker acknowledged as
    ``(partition, offset, key, value, headers, timestamp_ms)`` tuples, sorted."""
    out = []
    with Producer(bootstrap, acks="all", linger_ms=2) as p:
        handles = []
        for i in range(start, start + n):
            key = None if i % 7 == 0 else f"k{i}".encode()
            value = None if i % 11 == 5 else f"value-{i}".encode() * (1 + i % 3)
            hdrs = [("n", str(i).encode()), ("empty", b"")] if headers and i % 3 == 0 else []
            ts = ts0 + i * 1000
            handles.append((key, value, hdrs, ts, p.send(topic, value, key=key, partition=i % partitions,
                                                         headers=hdrs or None, timestamp_ms=ts)))
        p.flush()
        for key, value, hdrs, ts, h in handles:
            md = h.result(timeout=30)
            out.append((md.partition, md.offset, key, value, tuple(hdrs), ts))
    return sorted(out)


def reader(spark, bootstrap: str, **options):
    r = spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def rows(df, headers: bool = True) -> list[tuple]:
    """A read DataFrame as ``(partition, offset, key, value, headers, timestamp_ms)``, sorted."""
    from pyspark.sql import functions as F
    cols = [df["partition"], df["offset"], df["key"], df["value"],
            df["headers"] if headers else F.lit(None), (F.unix_micros(df["timestamp"]) / 1000).cast("long")]
    out = []
    for r in df.select(*cols).collect():
        hdrs = tuple((h["key"], bytes(h["value"])) for h in r[4]) if headers else ()
        out.append((r[0], r[1], None if r[2] is None else bytes(r[2]), None if r[3] is None else bytes(r[3]),
                    hdrs, r[5]))
    return sorted(out)
