"""Batch reads and writes through Spark against a real broker (one SparkSession for the module)."""
from __future__ import annotations

import json

import pytest

from odradek import Admin, TopicPartition
from tests.pipeline.support import BASE_TS, Transactions, create, produce, reader, rows


def test_a_batch_read_returns_exactly_what_was_produced(spark, mod_broker, topic_name):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=3)
    produced = produce(bs, topic_name, 600, partitions=3)
    df = reader(spark, bs, subscribe=topic_name, includeHeaders="true").load()
    assert [(f.name, f.dataType.simpleString()) for f in df.schema.fields] == [
        ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"), ("offset", "bigint"),
        ("timestamp", "timestamp"), ("timestampType", "int"),
        ("headers", "array<struct<key:string,value:binary>>")]
    assert rows(df) == produced
    assert {r.topic for r in df.select("topic").distinct().collect()} == {topic_name}
    assert {r.timestampType for r in df.select("timestampType").distinct().collect()} == {0}


def test_without_include_headers_there_is_no_headers_column_and_bootstrap_servers_also_works(
        spark, mod_broker, topic_name):
    create(mod_broker.bootstrap, topic_name)
    produced = produce(mod_broker.bootstrap, topic_name, 50)
    df = (spark.read.format("odradek").option("bootstrap.servers", mod_broker.bootstrap)
          .option("subscribe", topic_name).load())
    assert "headers" not in df.columns
    assert rows(df, headers=False) == [p[:4] + ((),) + p[5:] for p in produced]


def test_starting_and_ending_offsets_select_the_range(spark, mod_broker, topic_name):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=2)
    produced = produce(bs, topic_name, 200, partitions=2)
    start = json.dumps({topic_name: {"0": 10, "1": -2}})
    end = json.dumps({topic_name: {"0": 50, "1": -1}})
    got = rows(reader(spark, bs, subscribe=topic_name, startingOffsets=start, endingOffsets=end,
                      includeHeaders="true").load())
    assert got == [p for p in produced if (p[0] == 0 and 10 <= p[1] < 50) or p[0] == 1]


def test_assign_reads_only_the_named_partitions(spark, mod_broker, topic_name):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=3)
    produced = produce(bs, topic_name, 90, partitions=3)
    got = rows(reader(spark, bs, assign=json.dumps({topic_name: [2]}), includeHeaders="true").load())
    assert got == [p for p in produced if p[0] == 2]


def test_subscribe_pattern_reads_every_matching_topic(spark, mod_broker, topic_name):
    bs = mod_broker.bootstrap
    for suffix in ("a", "b"):
        create(bs, f"{topic_name}.{suffix}")
        produce(bs, f"{topic_name}.{suffix}", 10)
    df = reader(spark, bs, subscribePattern=topic_name.replace(".", r"\.") + r"\.[ab]").load()
    assert sorted(r.topic for r in df.select("topic").distinct().collect()) == [f"{topic_name}.a", f"{topic_name}.b"]
    assert df.count() == 20


def test_timestamps_select_the_range(spark, mod_broker, topic_name):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=2)
    produced = produce(bs, topic_name, 100, partitions=2)  # record i at BASE_TS + i s
    lo, hi = BASE_TS + 20_000, BASE_TS + 60_000
    got = rows(reader(spark, bs, subscribe=topic_name, startingTimestamp=str(lo), endingTimestamp=str(hi),
                      includeHeaders="true").load())
    assert got == [p for p in produced if lo <= p[5] < hi]
    by_part = json.dumps({topic_name: {"0": lo, "1": hi}})
    got = rows(reader(spark, bs, subscribe=topic_name, startingOffsetsByTimestamp=by_part,
                      includeHeaders="true").load())
    assert got == [p for p in produced if (p[0] == 0 and p[5] >= lo) or (p[0] == 1 and p[5] >= hi)]


def test_min_partitions_splits_ranges_and_still_returns_every_record_once(spark, mod_broker, topic_name):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=2)
    produced = produce(bs, topic_name, 1000, partitions=2)
    df = reader(spark, bs, subscribe=topic_name, minPartitions="7", includeHeaders="true").load()
    assert df.rdd.getNumPartitions() >= 7
    assert rows(df) == produced


def test_write_then_read_round_trips_every_row(spark, mod_broker, topic_name):
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType, StructField, StructType)
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=3)
    schema = StructType([
        StructField("key", StringType()), StructField("value", BinaryType()),
        StructField("partition", IntegerType()),
        StructField("headers", ArrayType(StructType([StructField("key", StringType()),
                                                     StructField("value", BinaryType())])))])
    data = [(None if i % 5 == 0 else f"k{i}", f"v{i}".encode(), 2 if i % 4 == 0 else None,
             [("i", str(i).encode())] if i % 2 else []) for i in range(3000)]
    spark.createDataFrame(data, schema).repartition(3).write.format("odradek") \
        .option("kafka.bootstrap.servers", bs).option("topic", topic_name).mode("append").save()
    back = reader(spark, bs, subscribe=topic_name, includeHeaders="true").load().collect()
    assert len(back) == len(data)
    got = sorted(((None if r.key is None else bytes(r.key).decode(), bytes(r.value),
                   [(h.key, bytes(h.value)) for h in r.headers]) for r in back), key=lambda t: t[1])
    assert got == sorted(((k, v, h) for k, v, _p, h in data), key=lambda t: t[1])
    pinned = {bytes(r.value) for r in back if r.partition == 2}
    assert all(f"v{i}".encode() in pinned for i in range(0, 3000, 4))
    # a key always lands on one partition (the bundled producer's key hash)
    by_key = {}
    for r in back:
        if r.key is not None:
            by_key.setdefault(bytes(r.key), set()).add(r.partition)
    assert all(len(ps) == 1 for ps in by_key.values())


def test_a_plain_value_column_of_strings_is_written_with_a_topic_column(spark, mod_broker, topic_name):
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=2)
    df = spark.range(500).selectExpr("cast(id as string) as value", f"'{topic_name}' as topic")
    df.write.format("odradek").option("kafka.bootstrap.servers", bs).mode("append").save()
    got = reader(spark, bs, subscribe=topic_name).load()
    assert sorted(int(bytes(r.value)) for r in got.select("value").collect()) == list(range(500))


def test_failon_data_loss_false_skips_deleted_records_and_true_fails(spark, mod_broker, topic_name):
    bs = mod_broker.bootstrap
    create(bs, topic_name)
    produced = produce(bs, topic_name, 100)
    # plan while the records exist, delete some, then run: the executor finds them gone
    df_lenient = reader(spark, bs, subscribe=topic_name, failOnDataLoss="false",
                        startingOffsets=json.dumps({topic_name: {"0": 0}})).load()
    df_strict = reader(spark, bs, subscribe=topic_name,
                       startingOffsets=json.dumps({topic_name: {"0": 0}})).load()
    with Admin(bs) as admin:
        admin.delete_records({TopicPartition(topic_name, 0): 40})
    got = rows(df_lenient, headers=False)
    assert [r[1] for r in got] == [p[1] for p in produced if p[1] >= 40]
    with pytest.raises(Exception, match="failOnDataLoss"):
        df_strict.collect()


def offsets_and_values(df) -> list[tuple]:
    return sorted((r.offset, bytes(r.value)) for r in df.select("offset", "value").collect())


def test_read_committed_returns_committed_and_plain_records_only_and_stops_before_the_open_transaction(
        spark, mod_broker, topic_name):
    """Offsets stay the log's: gaps where the markers (6, 10) and the aborted records (7-9)
    are. Split into tasks of two offsets, some tasks start inside the aborted transaction or
    on a marker and still drop exactly what they should."""
    bs = mod_broker.bootstrap
    t = Transactions(bs, topic_name)
    try:
        for split in ({}, {"maxRecordsPerPartition": "2"}):
            df = reader(spark, bs, subscribe=topic_name, **{"kafka.isolation.level": "read_committed"}, **split).load()
            got = offsets_and_values(df)
            assert [o for o, _ in got] == Transactions.COMMITTED, split
            assert [v for _, v in got] == [b"plain0", b"plain1", b"plain2", b"committed0", b"committed1",
                                           b"committed2", b"plain3", b"plain4"]
        everything = offsets_and_values(reader(spark, bs, subscribe=topic_name).load())
        assert [o for o, _ in everything] == sorted(Transactions.DATA)  # no control batch, the rest all there
        assert everything == offsets_and_values(reader(spark, bs, subscribe=topic_name,
                                                       isolationLevel="read_uncommitted").load())
        t.commit_open()
        df = reader(spark, bs, subscribe=topic_name, isolationLevel="read_committed").load()
        assert [o for o, _ in offsets_and_values(df)] == Transactions.COMMITTED + Transactions.OPEN
    finally:
        t.close()


# ---- bad input: the message names the option ---------------------------------------------
@pytest.mark.parametrize("options, named", [
    ({"subscribe": "x", "assign": '{"x": [0]}'}, "subscribe, subscribePattern, assign"),
    ({}, "subscribe, subscribePattern, assign"),
    ({"subscribe": "x", "startingOffsets": "latest"}, "startingOffsets"),
    ({"subscribe": "x", "endingOffsets": "earliest"}, "endingOffsets"),
    ({"subscribe": "x", "startingOffsets": "{not json"}, "startingOffsets"),
    ({"assign": "[0, 1]"}, "assign"),
    ({"subscribe": "x", "minPartitions": "zero"}, "minPartitions"),
    ({"subscribe": "x", "maxOffsetsPerTrigger": "10"}, "maxOffsetsPerTrigger"),
])
def test_bad_options_fail_with_a_message_naming_the_option(spark, mod_broker, options, named):
    with pytest.raises(Exception, match=named):
        reader(spark, mod_broker.bootstrap, **options).load().collect()


def test_missing_bootstrap_servers_is_named(spark):
    with pytest.raises(Exception, match="kafka.bootstrap.servers"):
        spark.read.format("odradek").option("subscribe", "x").load().collect()


def test_an_unknown_topic_fails_with_fail_on_data_loss_and_reads_nothing_without(spark, mod_broker, topic_name):
    with pytest.raises(Exception, match="subscribe.*no-such-topic|no-such-topic.*failOnDataLoss"):
        reader(spark, mod_broker.bootstrap, subscribe=f"no-such-topic-{topic_name}").load().collect()
    df = reader(spark, mod_broker.bootstrap, subscribe=f"no-such-topic-{topic_name}", failOnDataLoss="false").load()
    assert df.count() == 0


def test_writing_without_a_topic_names_the_option(spark, mod_broker):
    df = spark.range(3).selectExpr("cast(id as string) as value")
    with pytest.raises(Exception, match="option topic"):
        df.write.format("odradek").option("kafka.bootstrap.servers", mod_broker.bootstrap).mode("append").save()


@pytest.mark.parametrize("codec", ["none", "gzip", "zstd"])
def test_records_a_kafka_client_produced_are_read(spark, mod_broker, topic_name, codec):
    # Kafka clients write magic-2 batches (CRC-32C, varint records); the reader decoded only
    # the native format: the read failed on the batch's CRC, then on its records.
    confluent_kafka = pytest.importorskip("confluent_kafka")
    bs = mod_broker.bootstrap
    create(bs, topic_name, partitions=2)
    p = confluent_kafka.Producer({"bootstrap.servers": bs, "compression.codec": codec, "linger.ms": 5})
    want = []
    for i in range(300):
        key = None if i % 7 == 0 else f"k{i}".encode()
        hdrs = [("n", str(i).encode())] if i % 3 == 0 else []
        p.produce(topic_name, value=f"value-{i}".encode(), key=key, partition=i % 2, headers=hdrs or None,
                  timestamp=BASE_TS + i)
        want.append((i % 2, key, f"value-{i}".encode(), tuple(hdrs), BASE_TS + i))
    assert p.flush(30) == 0
    got = rows(reader(spark, bs, subscribe=topic_name, includeHeaders="true").load())
    assert sorted(((r[0], r[2], r[3], r[4], r[5]) for r in got), key=lambda w: w[4]) == want
    for part in (0, 1):
        assert [r[1] for r in got if r[0] == part] == list(range(150))
