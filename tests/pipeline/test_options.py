"""Option parsing, range splitting, admission control and Arrow building: no Spark, no broker."""
from __future__ import annotations

import pytest

from odradek.core.records import encode_records, Record
from odradek.pipeline import options as opt
from odradek.consumer import split_batches as split
from odradek.pipeline.columns import ARROW_SCHEMA, ARROW_SCHEMA_HEADERS, to_arrow
from odradek.pipeline.source import OffsetRange, from_json_offsets, rate_limit, split_ranges, to_json_offsets

BS = {"kafka.bootstrap.servers": "127.0.0.1:9092"}


def test_both_spellings_of_bootstrap_servers_are_accepted_and_a_disagreement_is_named():
    assert opt.batch_read_options({"bootstrap.servers": "h:1", "subscribe": "t"}).bootstrap == "h:1"
    assert opt.batch_read_options({"Kafka.Bootstrap.Servers": "h:1", "subscribe": "t"}).bootstrap == "h:1"
    with pytest.raises(opt.OptionError, match="disagree"):
        opt.batch_read_options({"bootstrap.servers": "h:1", "kafka.bootstrap.servers": "h:2", "subscribe": "t"})


def test_offsets_json_and_timestamps_are_parsed_with_spark_precedence():
    o = opt.batch_read_options({**BS, "subscribe": "a,b", "startingOffsets": '{"a": {"0": 5, "1": -2}}',
                                "endingTimestamp": "1000", "endingOffsets": "latest"})
    assert o.subscription.topics == ("a", "b")
    assert o.starting.kind == "offsets" and o.starting.per == {("a", 0): 5, ("a", 1): -2}
    assert o.ending.kind == "timestamp" and o.ending.ts == 1000
    s = opt.stream_read_options({**BS, "subscribePattern": "a.*", "maxOffsetsPerTrigger": "10"})
    assert s.starting.kind == "latest" and s.max_offsets_per_trigger == 10


@pytest.mark.parametrize("extra, named", [
    ({"subscribe": "a", "subscribePattern": "a"}, "subscribe, subscribePattern, assign"),
    ({"assign": '{"a": [0]}', "startingOffsets": '{"b": {"0": 1}}'}, "startingOffsets"),
    ({"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, "startingOffsets"),
    ({"subscribe": "a", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
    ({"subscribePattern": "("}, "subscribePattern"),
    ({"subscribe": "a", "startingOffsetsByTimestampStrategy": "skip"}, "startingOffsetsByTimestampStrategy"),
])
def test_bad_batch_options_are_named(extra, named):
    with pytest.raises(opt.OptionError, match=named):
        opt.batch_read_options({**BS, **extra})


def test_isolation_level_takes_kafkas_option_name_or_isolation_level_and_defaults_to_read_uncommitted():
    assert not opt.batch_read_options({**BS, "subscribe": "a"}).read_committed
    assert opt.batch_read_options({**BS, "subscribe": "a", "kafka.isolation.level": "read_committed"}).read_committed
    assert opt.stream_read_options({**BS, "subscribe": "a", "isolationLevel": "READ_COMMITTED"}).read_committed
    assert not opt.stream_read_options({**BS, "subscribe": "a", "kafka.isolation.level": "read_uncommitted",
                                        "isolationLevel": "read_uncommitted"}).read_committed
    with pytest.raises(opt.OptionError, match="kafka.isolation.level .*read_uncommitted or read_committed"):
        opt.batch_read_options({**BS, "subscribe": "a", "kafka.isolation.level": "serializable"})
    with pytest.raises(opt.OptionError, match="disagree"):
        opt.batch_read_options({**BS, "subscribe": "a", "kafka.isolation.level": "read_committed",
                                "isolationLevel": "read_uncommitted"})


def test_a_stream_refuses_ending_options():
    with pytest.raises(opt.OptionError, match="endingOffsets"):
        opt.stream_read_options({**BS, "subscribe": "a", "endingOffsets": "latest"})


def test_write_options_need_a_value_column_and_a_topic():
    assert opt.write_options({**BS, "topic": "t"}, ["value"]).acks == -1
    with pytest.raises(opt.OptionError, match="'value' column"):
        opt.write_options({**BS, "topic": "t"}, ["key"])
    with pytest.raises(opt.OptionError, match="option topic"):
        opt.write_options(BS, ["value"])
    with pytest.raises(opt.OptionError, match="offset"):
        opt.write_options({**BS, "topic": "t"}, ["value", "offset"])
    with pytest.raises(opt.OptionError, match="kafka.acks"):
        opt.write_options({**BS, "topic": "t", "kafka.acks": "2"}, ["value"])


def test_split_ranges_covers_every_offset_exactly_once():
    ranges = [OffsetRange("t", 0, 0, 1000), OffsetRange("t", 1, 10, 20), OffsetRange("t", 2, 5, 5)]
    for min_parts, max_records in ((None, None), (7, None), (3, 100), (50, None), (None, 7)):
        out = split_ranges(ranges, min_parts, max_records)
        covered = sorted((r.partition, o) for r in out for o in range(r.start, r.end))
        assert covered == sorted([(0, o) for o in range(1000)] + [(1, o) for o in range(10, 20)])
        if min_parts:
            assert len(out) >= min(min_parts, 1010)
        if max_records:
            assert max(r.size for r in out) <= max_records


def test_rate_limit_shares_the_budget_by_backlog_and_never_overshoots():
    begin = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 1000, ("t", 1): 200, ("t", 2): 51}
    end = rate_limit(begin, latest, 100)
    assert sum(end[tp] - begin[tp] for tp in begin) <= 100
    assert all(begin[tp] < end[tp] <= latest[tp] for tp in begin)
    assert rate_limit(begin, latest, 10_000) == latest


def test_offsets_serialize_sorted_with_string_partition_ids():
    offsets = {("b", 10): 1, ("b", 2): 2, ("a", 0): 3}
    as_json = to_json_offsets(offsets)
    assert list(as_json) == ["a", "b"] and list(as_json["b"]) == ["2", "10"]
    assert from_json_offsets(as_json) == offsets


def _batch(records, log_append_time=False):
    return encode_records(records, log_append_time=log_append_time)


def test_to_arrow_trims_to_the_range_and_matches_the_schema_exactly():
    recs = [Record(o, 1000 + o, None if o % 2 else b"k%d" % o, b"v%d" % o, [["h", b"%d" % o]] if o % 3 == 0 else [])
            for o in range(10, 20)]
    gapped = [Record(o, 5000, b"k", b"g%d" % o, []) for o in (20, 23, 27)]
    buf = _batch(recs) + _batch(gapped, log_append_time=True) + b"\0" * 70  # a zero-padded tail
    batches, why = split(memoryview(buf), 0, len(buf))
    assert len(batches) == 2 and why == "zero padding"
    rb = to_arrow(memoryview(buf), batches, "t", 3, 12, 24, include_headers=True)
    assert rb.schema == ARROW_SCHEMA_HEADERS
    got = rb.to_pydict()
    assert got["offset"] == [12, 13, 14, 15, 16, 17, 18, 19, 20, 23]
    assert got["value"][:2] == [b"v12", b"v13"] and got["value"][-1] == b"g23"
    assert got["key"][:2] == [b"k12", None]
    assert got["partition"] == [3] * 10 and got["topic"] == ["t"] * 10
    assert got["timestampType"] == [0] * 8 + [1, 1]
    assert got["headers"][:4] == [[{"key": "h", "value": b"12"}], [], [], [{"key": "h", "value": b"15"}]]
    assert rb.column(5).cast("int64").to_pylist()[0] == (1000 + 12) * 1000
    plain = to_arrow(memoryview(buf), batches, "t", 3, 0, 100, include_headers=False)
    assert plain.schema == ARROW_SCHEMA and plain.num_rows == 13
    assert to_arrow(memoryview(buf), batches, "t", 3, 30, 40, include_headers=False) is None
