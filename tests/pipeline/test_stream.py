"""Streaming reads and writes, the example pipeline, and a broker restart under a running query.

One SparkSession and one broker for the module. Sinks are idempotent by construction: a
``foreachBatch`` that stores rows by (topic, partition, offset), so a test can tell a lost
record (missing key) from a re-delivered one (``deliveries`` counts every arrival).
"""
from __future__ import annotations

import json
import os
import threading
import time

import pytest

from odradek import Admin, TopicPartition
from odradek.pipeline import clicks
from tests.pipeline.support import Transactions, create, produce


class Collect:
    """An idempotent sink: rows keyed by (topic, partition, offset); counts every delivery."""

    def __init__(self):
        self.rows: dict = {}
        self.deliveries = 0
        self.batches: list[int] = []  # rows per non-empty micro-batch
        self.lock = threading.Lock()

    def __call__(self, df, batch_id: int) -> None:
        got = df.select("topic", "partition", "offset", "value").collect()
        with self.lock:
            if got:
                self.batches.append(len(got))
            for r in got:
                self.deliveries += 1
                self.rows[(r.topic, r.partition, r.offset)] = None if r.value is None else bytes(r.value)


def stream(spark, bootstrap: str, sink: Collect, checkpoint: str, available_now: bool = True, **options):
    r = spark.readStream.format("odradek").option("kafka.bootstrap.servers", bootstrap)
    for k, v in options.items():
        r = r.option(k, v)
    w = r.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="200 milliseconds")
    return w.start()


def run_available_now(spark, bootstrap, sink, checkpoint, **options) -> None:
    q = stream(spark, bootstrap, sink, checkpoint, **options)
    try:
        q.awaitTermination(120)
        assert not q.isActive, "an availableNow query did not finish within 120 s"
        assert q.exception() is None
    finally:
        q.stop()


def keys(produced, topic):
    return {(topic, p[0], p[1]) for p in produced}


def test_available_now_reads_all_then_after_a_restart_only_the_new_data(spark, mod_broker, topic_name, tmp_path):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=3)
    first = produce(bs, topic_name, 300, partitions=3)
    sink = Collect()
    ckpt = str(tmp_path / "ckpt")
    run_available_now(spark, bs, sink, ckpt, subscribe=topic_name, startingOffsets="earliest")
    assert set(sink.rows) == keys(first, topic_name) and sink.deliveries == 300

    second = produce(bs, topic_name, 200, partitions=3, start=300)
    again = Collect()
    run_available_now(spark, bs, again, ckpt, subscribe=topic_name, startingOffsets="earliest")
    assert set(again.rows) == keys(second, topic_name) and again.deliveries == 200
    offsets_log = sorted(os.listdir(os.path.join(ckpt, "offsets")), key=lambda n: int(n) if n.isdigit() else -1)
    with open(os.path.join(ckpt, "offsets", offsets_log[-1])) as f:
        last = f.read().splitlines()[-1]
    assert json.loads(last) == {topic_name: {"0": 167, "1": 167, "2": 166}}
    assert last == json.dumps(json.loads(last), sort_keys=True), \
        "checkpointed offsets are sorted JSON with string partition ids"


def test_max_offsets_per_trigger_caps_every_micro_batch(spark, mod_broker, topic_name, tmp_path):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=2)
    produced = produce(bs, topic_name, 250, partitions=2)
    sink = Collect()
    run_available_now(spark, bs, sink, str(tmp_path / "ckpt"), subscribe=topic_name,
                      startingOffsets="earliest", maxOffsetsPerTrigger="60")
    assert set(sink.rows) == keys(produced, topic_name) and sink.deliveries == 250
    assert max(sink.batches) <= 60 and len(sink.batches) >= 5


def test_a_new_topic_matching_the_pattern_is_picked_up_from_its_beginning(spark, mod_broker, topic_name, tmp_path):
    bs = mod_broker.bootstrap
    create(bs, f"{topic_name}.one")
    one = produce(bs, f"{topic_name}.one", 40)
    sink = Collect()
    ckpt = str(tmp_path / "ckpt")
    pattern = topic_name + r"\..*"
    run_available_now(spark, bs, sink, ckpt, subscribePattern=pattern, startingOffsets="earliest")
    create(bs, f"{topic_name}.two", partitions=2)
    two = produce(bs, f"{topic_name}.two", 30, partitions=2)
    more = produce(bs, f"{topic_name}.one", 5, start=40)
    run_available_now(spark, bs, sink, ckpt, subscribePattern=pattern, startingOffsets="earliest")
    assert set(sink.rows) == keys(one + more, f"{topic_name}.one") | keys(two, f"{topic_name}.two")
    assert sink.deliveries == 75


def test_deleted_records_fail_the_stream_or_are_skipped_per_fail_on_data_loss(spark, mod_broker, topic_name,
                                                                                tmp_path):
    bs = mod_broker.bootstrap
    create(bs, topic_name)
    produce(bs, topic_name, 50)
    strict, lenient = Collect(), Collect()
    run_available_now(spark, bs, strict, str(tmp_path / "strict"), subscribe=topic_name, startingOffsets="earliest")
    run_available_now(spark, bs, lenient, str(tmp_path / "lenient"), subscribe=topic_name,
                      startingOffsets="earliest", failOnDataLoss="false")
    later = produce(bs, topic_name, 100, start=50)  # offsets 50..149
    with Admin(bs) as admin:
        admin.delete_records({TopicPartition(topic_name, 0): 120})
    q = stream(spark, bs, Collect(), str(tmp_path / "strict"), subscribe=topic_name)
    try:
        with pytest.raises(Exception, match="failOnDataLoss"):
            q.awaitTermination(120)
    finally:
        q.stop()
    lenient.rows.clear()
    run_available_now(spark, bs, lenient, str(tmp_path / "lenient"), subscribe=topic_name, failOnDataLoss="false")
    assert sorted(k[2] for k in lenient.rows) == [p[1] for p in later if p[1] >= 120]


def test_a_read_committed_stream_waits_at_an_open_transaction_and_reads_it_once_committed(
        spark, mod_broker, topic_name, tmp_path):
    """A micro-batch ends at the last stable offset: the open transaction's rows (and the plain
    records after it) come in a later run, after the commit, each once; aborted records and
    markers never come."""
    bs = mod_broker.bootstrap
    t = Transactions(bs, topic_name)
    try:
        sink, ckpt = Collect(), str(tmp_path / "ckpt")
        opts = {"subscribe": topic_name, "startingOffsets": "earliest", "kafka.isolation.level": "read_committed"}
        run_available_now(spark, bs, sink, ckpt, **opts)
        assert sorted(o for _, _, o in sink.rows) == Transactions.COMMITTED
        # a stream told to start past the open transaction (offset 16) waits there, no data loss
        late, late_ckpt = Collect(), str(tmp_path / "late")
        late_opts = {**opts, "startingOffsets": json.dumps({topic_name: {"0": 16}})}
        run_available_now(spark, bs, late, late_ckpt, **late_opts)
        assert late.rows == {}
        t.commit_open()
        run_available_now(spark, bs, sink, ckpt, **opts)
        assert sorted(o for _, _, o in sink.rows) == Transactions.COMMITTED + Transactions.OPEN
        assert sink.deliveries == len(sink.rows)
        assert sink.rows[(topic_name, 0, 13)] == b"open0"
        run_available_now(spark, bs, late, late_ckpt, **late_opts)
        assert sorted(late.rows) == [(topic_name, 0, 16), (topic_name, 0, 17)]
    finally:
        t.close()


def test_a_stream_on_an_unknown_topic_names_the_option(spark, mod_broker, topic_name, tmp_path):
    with pytest.raises(Exception, match="subscribe.*failOnDataLoss|failOnDataLoss.*subscribe"):
        q = stream(spark, mod_broker.bootstrap, Collect(), str(tmp_path / "c"), subscribe=f"missing-{topic_name}")
        try:
            q.awaitTermination(60)
            if q.exception():
                raise q.exception()
        finally:
            q.stop()


def test_a_streaming_write_copies_every_record_and_stamps_the_micro_batch(spark, mod_broker, topic_name, tmp_path):
    bs = mod_broker.bootstrap
    src, dst = f"{topic_name}.in", f"{topic_name}.out"
    create(bs, src, partitions=2)
    create(bs, dst, partitions=2)
    produced = produce(bs, src, 400, partitions=2)
    q = (spark.readStream.format("odradek").option("kafka.bootstrap.servers", bs).option("subscribe", src)
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "150").load()
         .selectExpr("key", "value")
         .writeStream.format("odradek").option("kafka.bootstrap.servers", bs).option("topic", dst)
         .option("batchIdHeader", "spark.batch")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    try:
        q.awaitTermination(120)
        assert q.exception() is None
        query_id = q.id
    finally:
        q.stop()
    out = (spark.read.format("odradek").option("kafka.bootstrap.servers", bs).option("subscribe", dst)
           .option("includeHeaders", "true").load().collect())
    order = lambda kv: (kv[0] or b"", kv[1] or b"")  # noqa: E731
    assert sorted(((None if r.key is None else bytes(r.key), None if r.value is None else bytes(r.value))
                   for r in out), key=order) == sorted(((p[2], p[3]) for p in produced), key=order)
    stamps = {dict((h.key, bytes(h.value)) for h in r.headers)["spark.batch"].decode() for r in out}
    assert {s.split(":")[0] for s in stamps} == {str(query_id)}
    assert len(stamps) >= 3  # 400 records at most 150 per micro-batch


def test_a_broker_restart_during_a_streaming_query_is_retried_and_nothing_is_lost(spark, mod_broker, topic_name,
                                                                                  tmp_path):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=2)
    produced = produce(bs, topic_name, 400, partitions=2)
    sink = Collect()
    q = stream(spark, bs, sink, str(tmp_path / "ckpt"), available_now=False, subscribe=topic_name,
               startingOffsets="earliest", maxOffsetsPerTrigger="50")
    try:
        deadline = time.monotonic() + 120
        while len(sink.rows) < 100 and time.monotonic() < deadline and q.isActive:
            time.sleep(0.1)
        mod_broker.restart()  # the query is mid-way: fetches and offset lookups fail, then reconnect
        produced += produce(bs, topic_name, 100, partitions=2, start=400)
        want = keys(produced, topic_name)
        while set(sink.rows) != want and time.monotonic() < deadline and q.isActive:
            time.sleep(0.2)
        assert q.exception() is None, f"the query failed: {q.exception()}"
        assert set(sink.rows) == want
    finally:
        q.stop()


def test_the_example_pipeline_counts_every_minute_once_across_a_restart(spark, mod_broker, tmp_path):
    bs = mod_broker.bootstrap
    clicks.ensure_topics(bs, partitions=3)
    out = str(tmp_path / "clicks")
    start_ms = 1_700_000_040_000 - 1_700_000_040_000 % 60_000
    first = clicks.make_events(3000, start_ms, minutes=5, seed=1)
    clicks.produce_events(bs, first)
    q = clicks.start_query(spark, bs, out, max_offsets_per_trigger=1000)
    q.awaitTermination(180)
    assert q.exception() is None
    assert clicks.read_table(spark, out) == clicks.expected_counts(first)

    second = clicks.make_events(3000, start_ms + 5 * 60_000, minutes=5, seed=2)
    clicks.produce_events(bs, second)
    q = clicks.start_query(spark, bs, out)  # the same checkpoint: a restarted job
    q.awaitTermination(180)
    assert q.exception() is None
    expected = clicks.expected_counts(first + second)
    assert len(expected) >= 8 * 8
    assert clicks.read_table(spark, out) == expected  # raises on a window counted twice
    assert clicks.read_topic(spark, bs) == expected


def read_committed_values(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    """Every value of ``topic`` a read_committed consumer sees, up to the last stable offsets."""
    from odradek import Consumer
    with Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest") as c:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        ends = c.end_offsets(tps)
        out: list[bytes] = []
        deadline = time.monotonic() + 60
        while any(c.position(tp) < ends[tp] for tp in tps):
            assert time.monotonic() < deadline, f"read_committed stopped short of {ends}"
            out += [r.value for r in c.poll(500)]
    return out


def test_a_micro_batch_run_again_after_a_crash_is_written_once_by_the_exactly_once_sink(
        spark, mod_broker, topic_name, tmp_path):
    """A driver that dies after the sink wrote a micro-batch but before Spark's commit log
    recorded it leaves Spark to run that micro-batch again under the same id (done here by
    dropping the newest commit-log entry and restarting the query from its checkpoint).
    The exactly-once sink (the default) finds each task's earlier transaction recorded and
    writes nothing again: read_committed sees every row once. (The at-least-once sink,
    ``exactlyOnce=false``, stores the re-run micro-batch twice.)"""
    bs = mod_broker.bootstrap
    src, dst = f"{topic_name}.in", f"{topic_name}.out"
    create(bs, src, partitions=2)
    create(bs, dst, partitions=2)
    produced = produce(bs, src, 300, partitions=2)
    ckpt = str(tmp_path / "ckpt")

    def run() -> str:
        q = (spark.readStream.format("odradek").option("kafka.bootstrap.servers", bs).option("subscribe", src)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
             .selectExpr("key", "value")
             .writeStream.format("odradek").option("kafka.bootstrap.servers", bs).option("topic", dst)
             .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
            assert not q.isActive and q.exception() is None, q.exception()
            return q.id
        finally:
            q.stop()

    def commit_log() -> list[str]:
        return sorted((n for n in os.listdir(os.path.join(ckpt, "commits")) if n.isdigit()), key=int)

    query_id = run()
    done = commit_log()
    assert len(done) >= 3, done  # 300 rows at most 100 a micro-batch
    for n in done[-1:]:
        for name in (n, f".{n}.crc"):  # the entry and Hadoop's checksum of it
            if os.path.exists(os.path.join(ckpt, "commits", name)):
                os.unlink(os.path.join(ckpt, "commits", name))
    assert run() == query_id
    assert commit_log() == done, "Spark did not run the last micro-batch again"
    got = sorted(v or b"" for v in read_committed_values(bs, dst, 2))
    assert got == sorted(p[3] or b"" for p in produced), f"{len(got)} rows read for {len(produced)} produced"
