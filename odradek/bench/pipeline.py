"""Spark connector benchmark: batch write and batch read of N fixed-size records.

    python -m odradek.bench.pipeline [--records 1000000] [--size 100] [--values padded|random] [--partitions 2] [--runs 3]
                             [--master local[2]] [--bootstrap-server HOST:PORT]

Without ``--bootstrap-server`` it starts its own broker (``odradek serve`` on 127.0.0.1, an
ephemeral port and a temporary directory) and stops it at the end. Each run:

- **write**: ``spark.range(N)`` turned into ``value`` = N distinct ``--size``-byte binaries in
  the JVM (cached before the runs, so generating them is not timed), written with ``df.write.format("odradek")`` to a fresh topic of ``--partitions``
  partitions (acks=all, lz4): rows/s from the ``save()`` call to its return;
- **read**: the topic of the first write run read with ``spark.read.format("odradek")`` and
  every column materialised by Spark's ``noop`` sink: rows/s from the action to its return
  (planning, fetching, decoding, Arrow to Spark rows).

A small write and read first warm up the Python workers (not timed). Prints each run and the median of the runs; ``--json`` prints the figures as one JSON line.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time

from odradek.local import LocalBroker

class _Broker(LocalBroker):
    """A throwaway broker in a temporary directory, removed with it on ``stop``."""

    def __init__(self):
        super().__init__(tempfile.mkdtemp(prefix="odradek-bench-"))
        self.start()

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)


def _create(bootstrap: str, topic: str, partitions: int) -> None:
    from odradek import Admin
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=partitions)


def run(spark, bootstrap: str, records: int, size: int, partitions: int, runs: int, values: str = "padded") -> dict:
    from pyspark.sql import functions as F
    tag = f"{int(time.time())}"
    ids = spark.range(0, records, 1, numPartitions=partitions)
    if values == "random":  # incompressible: hashes of the id, repeated to the size
        h = F.unhex(F.sha2(F.col("id").cast("string"), 512))
        value = F.substring(F.concat(*[h] * (size // 64 + 1)), 1, size)
    else:  # the id left-padded with 'x' (compresses well, as many real payloads do)
        value = F.lpad(F.col("id").cast("string"), size, "x").cast("binary")
    source = ids.select(value.alias("value")).cache()  # generated once, outside the timings
    source.count()
    _warm_up(spark, bootstrap, partitions, tag)
    writes, reads = [], []
    read_topic = None
    for i in range(runs):
        topic = f"bench-spark-{tag}-{i}"
        _create(bootstrap, topic, partitions)
        t0 = time.perf_counter()
        source.write.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("topic", topic) \
            .mode("append").save()
        dt = time.perf_counter() - t0
        writes.append(records / dt)
        print(f"write run {i + 1}: {records} rows in {dt:.2f}s = {records / dt:,.0f} rows/s", flush=True)
        read_topic = read_topic or topic
    df = spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("subscribe", read_topic)
    n = df.load().count()
    if n != records:
        raise RuntimeError(f"read back {n} rows, wrote {records}")
    for i in range(runs):
        t0 = time.perf_counter()
        df.load().write.format("noop").mode("overwrite").save()
        dt = time.perf_counter() - t0
        reads.append(records / dt)
        print(f"read run {i + 1}: {records} rows in {dt:.2f}s = {records / dt:,.0f} rows/s", flush=True)
    return {"records": records, "size": size, "partitions": partitions, "values": values,
            "write_rows_per_s": statistics.median(writes), "read_rows_per_s": statistics.median(reads),
            "write_runs": writes, "read_runs": reads}


def _warm_up(spark, bootstrap: str, partitions: int, tag: str) -> None:
    """One small write and read first, so Python workers, imports and JIT are not timed."""
    topic = f"bench-spark-{tag}-warm-up"
    _create(bootstrap, topic, partitions)
    spark.range(0, 20000, 1, numPartitions=partitions).selectExpr("cast(id as string) as value") \
        .write.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("topic", topic) \
        .mode("append").save()
    spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic).load() \
        .write.format("noop").mode("overwrite").save()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m odradek.bench.pipeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=100, help="value bytes per record")
    p.add_argument("--partitions", type=int, default=2, help="topic partitions (= Spark tasks)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT", help="use this broker instead of starting one")
    p.add_argument("--values", choices=["padded", "random"], default="padded",
                   help="padded: the id padded with 'x' (compressible); random: hash bytes (incompressible)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    broker = None if args.bootstrap_server else _Broker()
    bootstrap = args.bootstrap_server or broker.bootstrap
    spark = None
    try:
        from odradek.pipeline.session import session
        spark = session(args.master, app="odradek-bench")
        result = run(spark, bootstrap, args.records, args.size, args.partitions, args.runs, args.values)
    finally:
        if spark is not None:
            spark.catalog.clearCache()
            spark.stop()
        if broker is not None:
            broker.stop()
    print(f"median of {args.runs}: write {result['write_rows_per_s']:,.0f} rows/s, "
          f"read {result['read_rows_per_s']:,.0f} rows/s ({args.records} x {args.size} B {args.values}, {args.master}, "
          f"{args.partitions} partitions)")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
