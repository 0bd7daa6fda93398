"""The example pipeline: click events -> per-minute counts per page, in a topic and a Parquet table.

    odradek pipeline run clicks [--master local[2] | spark://host:7077] [--events 20000]

Three parts, each usable on its own:

- ``produce_events``: synthetic clicks as JSON (``{"user", "page", "ts"}``, ``ts`` in ms and
  also the record's timestamp) produced to ``clicks`` with the bundled ``Producer``, keyed by
  user. Deterministic for a seed, so a test can recompute the expected counts.
- ``start_query``: the Structured Streaming job. It reads ``clicks`` with the ``odradek``
  source, parses the JSON, and counts clicks per page per one-minute event-time window with a
  watermark (``--watermark``, default 1 minute: later events are dropped, and a window is
  emitted once, when the watermark passes its end: output mode append). Each micro-batch
  goes to two sinks through ``foreachBatch``:
    * the Parquet table ``<output>/counts``, one directory per micro-batch
      (``batch=<id>``) written with mode overwrite, so a micro-batch that Spark runs again
      after a crash replaces its own output instead of adding to it: exactly once;
    * the topic ``clicks-per-minute``: key ``page|window start``, JSON value; a marker file
      per micro-batch (``<output>/topic-commits/<id>``) skips a re-run batch whose records were
      already acknowledged (a crash between the write and the marker can still repeat a batch
      in the topic: consumers keep the latest record per key).
  The checkpoint (``<output>/checkpoint``) holds the source offsets and the window state, so a
  stopped and restarted job resumes where it stopped: no minute lost, none counted twice.
- ``expected_counts``: the same counts computed directly from the events (for the tests).
"""
from __future__ import annotations

import json
import os
import random
from datetime import datetime, timezone

CLICKS = "clicks"
COUNTS = "clicks-per-minute"
PAGES = ("/", "/home", "/search", "/product", "/cart", "/checkout", "/about", "/help")
MINUTE_MS = 60_000


def make_events(n: int, start_ms: int, minutes: int, seed: int = 7, users: int = 500) -> list[dict]:
    """``n`` click events spread over ``minutes`` minutes from ``start_ms``, in time order with a
    little jitter (well within the watermark)."""
    rng = random.Random(seed)
    span = minutes * MINUTE_MS
    out = []
    for i in range(n):
        ts = start_ms + (i * span) // n + rng.randint(0, 2000)
        out.append({"user": f"u{rng.randrange(users)}", "page": rng.choice(PAGES), "ts": min(ts, start_ms + span - 1)})
    return out


def produce_events(bootstrap: str, events: list[dict], topic: str = CLICKS) -> None:
    from odradek import Producer
    with Producer(bootstrap, acks="all", linger_ms=5) as p:
        for e in events:
            p.send(topic, json.dumps(e, separators=(",", ":")).encode(), key=e["user"].encode(),
                   timestamp_ms=e["ts"])
        p.flush()


def ensure_topics(bootstrap: str, partitions: int = 4) -> None:
    from odradek import Admin
    from odradek.errors import TopicAlreadyExistsError
    with Admin(bootstrap) as admin:
        for name, parts in ((CLICKS, partitions), (COUNTS, 1)):
            try:
                admin.create_topic(name, partitions=parts)
            except TopicAlreadyExistsError:
                pass


def expected_counts(events: list[dict], watermark_ms: int = MINUTE_MS) -> dict:
    """``{(window start ms, page): count}`` for the windows the watermark has closed once all
    ``events`` are in: those ending at or before ``max(ts) - watermark``."""
    if not events:
        return {}
    horizon = max(e["ts"] for e in events) - watermark_ms
    counts: dict = {}
    for e in events:
        w = e["ts"] - e["ts"] % MINUTE_MS
        counts[(w, e["page"])] = counts.get((w, e["page"]), 0) + 1
    return {k: v for k, v in counts.items() if k[0] + MINUTE_MS <= horizon}


def start_query(spark, bootstrap: str, output: str, watermark: str = "1 minute", available_now: bool = True,
                trigger_seconds: float = 5.0, max_offsets_per_trigger: int | None = None):
    """Start the streaming job; returns the ``StreamingQuery``."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("user", StringType()), StructField("page", StringType()),
                         StructField("ts", LongType())])
    reader = (spark.readStream.format("odradek")
              .option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", CLICKS)
              .option("startingOffsets", "earliest"))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    clicks = (reader.load()
              .select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
              .select("e.page", (F.col("e.ts") / 1000).cast("timestamp").alias("event_time")))
    counts = (clicks.withWatermark("event_time", watermark)
              .groupBy(F.window("event_time", "1 minute"), "page").count()
              .select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"),
                      "page", "count"))
    sink = _Sinks(bootstrap, output)
    writer = (counts.writeStream.outputMode("append").foreachBatch(sink)
              .option("checkpointLocation", os.path.join(output, "checkpoint"))
              .queryName("clicks-per-minute"))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(
        processingTime=f"{trigger_seconds} seconds")
    return writer.start()


class _Sinks:
    """``foreachBatch`` body: the micro-batch's closed windows to Parquet and to the topic."""

    def __init__(self, bootstrap: str, output: str):
        self.bootstrap, self.output = bootstrap, output

    def __call__(self, df, batch_id: int) -> None:
        from pyspark.sql import functions as F
        df = df.persist()
        try:
            path = os.path.join(self.output, "counts", f"batch={batch_id}")
            df.write.mode("overwrite").parquet(path)
            marker = os.path.join(self.output, "topic-commits", str(batch_id))
            if _exists(df.sparkSession, marker):
                return  # a re-run of a batch whose records the topic already has
            out = df.select(
                F.concat_ws("|", "page", F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'")).alias("key"),
                F.to_json(F.struct(F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start"),
                                   F.date_format("window_end", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_end"),
                                   "page", "count")).alias("value"))
            (out.write.format("odradek").option("kafka.bootstrap.servers", self.bootstrap)
             .option("topic", COUNTS).mode("append").save())
            _touch(df.sparkSession, marker)
        finally:
            df.unpersist()


def _hadoop_path(spark, path: str):
    """``path`` on Spark's file system (local, HDFS, S3...), so the markers live with the table."""
    jpath = spark._jvm.org.apache.hadoop.fs.Path(path)
    return jpath.getFileSystem(spark._jsc.hadoopConfiguration()), jpath


def _exists(spark, path: str) -> bool:
    fs, jpath = _hadoop_path(spark, path)
    return bool(fs.exists(jpath))


def _touch(spark, path: str) -> None:
    fs, jpath = _hadoop_path(spark, path)
    fs.create(jpath, True).close()


def read_table(spark, output: str) -> dict:
    """The Parquet table as ``{(window start ms, page): count}`` (a duplicate key would be a bug:
    it raises)."""
    path = os.path.join(output, "counts")
    if not _exists(spark, path):
        return {}
    out: dict = {}
    for r in spark.read.parquet(path).collect():
        key = (int(r.window_start.replace(tzinfo=timezone.utc).timestamp() * 1000), r.page)
        if key in out:
            raise AssertionError(f"window {key} appears twice in the table")
        out[key] = r["count"]
    return out


def read_topic(spark, bootstrap: str) -> dict:
    """The ``clicks-per-minute`` topic as ``{(window start ms, page): count}``, latest per key."""
    rows = (spark.read.format("odradek").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", COUNTS).load().orderBy("partition", "offset").collect())
    out = {}
    for r in rows:
        v = json.loads(r.value)
        start = datetime.strptime(v["window_start"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
        out[(int(start.timestamp() * 1000), v["page"])] = v["count"]
    return out
