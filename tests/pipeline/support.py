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


class Transactions:
    """One partition holding, in this order: 3 plain records (offsets 0-2), a committed
    transaction (3-5, its marker 6), an aborted one (7-9, marker 10), 2 plain records
    (11-12), a transaction left open (13-15) and 2 plain records after it (16-17).

    ``commit_open()`` ends the open transaction (its marker at 18); ``close()`` aborts it if
    still open. Values name what they are: ``plain0``, ``committed0``, ``aborted0``, ``open0``.
    """

    COMMITTED = [0, 1, 2, 3, 4, 5, 11, 12]  # what read_committed returns while the last is open
    OPEN = [13, 14, 15, 16, 17]  # what it returns more once that transaction is committed
    DATA = COMMITTED + [7, 8, 9] + OPEN  # every data record: read_uncommitted (no markers)

    def __init__(self, bootstrap: str, topic: str):
        from odradek import Producer
        create(bootstrap, topic)
        self.bootstrap, self.topic = bootstrap, topic
        offsets = []
        with Producer(bootstrap, acks="all") as plain:
            offsets += [plain.send(topic, b"plain%d" % i, partition=0).result(30).offset for i in range(3)]
        self.txn = Producer(bootstrap, transactional_id=f"spark-test-{topic}", transaction_timeout_ms=600_000)
        self.txn.init_transactions(30)
        for outcome in ("committed", "aborted"):
            self.txn.begin_transaction()
            handles = [self.txn.send(topic, b"%s%d" % (outcome.encode(), i), partition=0) for i in range(3)]
            self.txn.flush(30)
            offsets += [h.result(30).offset for h in handles]
            (self.txn.commit_transaction if outcome == "committed" else self.txn.abort_transaction)(30)
        with Producer(bootstrap, acks="all") as plain:
            offsets += [plain.send(topic, b"plain%d" % i, partition=0).result(30).offset for i in (3, 4)]
            self.txn.begin_transaction()
            handles = [self.txn.send(topic, b"open%d" % i, partition=0) for i in range(3)]
            self.txn.flush(30)
            offsets += [h.result(30).offset for h in handles]
            offsets += [plain.send(topic, b"plain%d" % i, partition=0).result(30).offset for i in (5, 6)]
        assert offsets == [0, 1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17], offsets
        self.open = True

    def commit_open(self) -> None:
        self.txn.commit_transaction(30)
        self.open = False

    def close(self) -> None:
        try:
            if self.open:
                self.txn.abort_transaction(30)
        finally:
            self.txn.close(5)
