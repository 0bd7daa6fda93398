"""The perf tools' output and options (small runs on the scripted broker; the numbers come
from `odradek perf` on a real broker, see docs/BENCHMARKS.md)."""
from __future__ import annotations

import re

from odradek import perf

SUMMARY = re.compile(r"^(\d+) records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), [\d.]+ ms avg latency, "
                     r"[\d.]+ ms max latency, [\d.]+ ms 50th, [\d.]+ ms 95th, [\d.]+ ms 99th, [\d.]+ ms 99.9th\.$")


def test_produce_prints_kafka_style_progress_and_a_summary_with_percentiles(scripted, capsys):
    broker = scripted({"perf": 2})
    code = perf.produce_main(["--bootstrap-server", broker.bootstrap, "--topic", "perf", "--num-records", "5000",
                              "--record-size", "50", "--reporting-interval", "0", "--no-redis",
                              "--producer-props", "acks=1", "linger.ms=1", "batch.size=2000"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    assert SUMMARY.match(lines[-1]) and lines[-1].startswith("5000 records sent")
    assert any(re.match(r"^\d+ records sent, .* ms max latency\.$", ln) for ln in lines[:-1])
    assert sum(len(broker.records("perf", p)) for p in range(2)) == 5001  # and the warm-up record


def test_produce_with_keys_cycles_through_them_in_order_and_each_lands_on_its_partition(scripted, capsys):
    """``perf produce --keys N``: record i carries key i mod N (the keyed produce row of
    docs/BENCHMARKS.md, issue 30), hashed to its partition as Kafka's partitioner does."""
    from odradek.producer import partition_for_key
    broker = scripted({"keyed": 3})
    code = perf.produce_main(["--bootstrap-server", broker.bootstrap, "--topic", "keyed", "--num-records", "1000",
                              "--keys", "7", "--record-size", "50", "--reporting-interval", "0", "--no-redis",
                              "--producer-props", "acks=1", "linger.ms=1"])
    assert code == 0 and "7 keys" in capsys.readouterr().out
    keyed = {p: [r.key for r in broker.records("keyed", p) if r.key is not None] for p in range(3)}
    assert sum(map(len, keyed.values())) == 1000
    assert all(partition_for_key(k, 3) == p for p, ks in keyed.items() for k in ks)
    counts = {k: sum(ks.count(k) for ks in keyed.values()) for k in {b"key-%06d" % i for i in range(7)}}
    assert sorted(counts.values()) == [142] * 1 + [143] * 6  # 1000 = 7 * 142 + 6: keys 0..5 once more


def test_produce_over_several_connections_deals_the_records_across_producers_in_client_processes(scripted, capsys):
    broker = scripted({"conns": 3})
    code = perf.produce_main(["--bootstrap-server", broker.bootstrap, "--topic", "conns", "--num-records", "2000",
                              "--record-size", "50", "--connections", "4", "--client-processes", "2",
                              "--producer-props", "acks=1", "linger.ms=1"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"^2000 records sent over 4 connections from 2 processes, [\d.]+ records/sec", out, re.M), out
    assert sum(len(broker.records("conns", p)) for p in range(3)) == 2004  # and each producer's warm-up record


def test_e2e_measures_send_to_receipt_in_a_child_consumer(scripted, capsys):
    broker = scripted({"lat": 1})
    code = perf.e2e_main(["--bootstrap-server", broker.bootstrap, "--topic", "lat", "--num-records", "200",
                          "--throughput", "2000", "--no-redis", "--no-nats"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0 and out[-1].startswith("200 records received") and "99.9th" in out[-1]


def test_unknown_producer_properties_are_refused_by_name():
    try:
        perf.producer_kwargs({"acks": "1", "lingr.ms": "5"})
    except SystemExit as exc:
        assert "lingr.ms" in str(exc)
    else:
        raise AssertionError("no error")
    assert perf.producer_kwargs({"acks": "all", "compression.type": "none", "linger.ms": "2"}) == \
        {"acks": "all", "compression": None, "linger_ms": 2.0}


def test_the_redis_comparison_is_skipped_with_a_reason_when_redis_server_is_missing(monkeypatch, capsys):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert "redis-server" in perf.redis_available()
    assert perf.with_redis(lambda r: 1 / 0) is None
    assert "Redis Streams comparison skipped: redis-server is not installed" in capsys.readouterr().out


def test_percentiles_pick_the_sample_at_or_above_the_rank():
    values = list(range(1, 1001))
    assert [perf.percentile(values, p) for p in (50, 99, 99.9)] == [501, 991, 1000]
    assert perf.percentile([], 99) == 0.0


def test_consume_times_from_the_first_records_and_reports_the_start_up_apart(scripted, capsys):
    """A client's start-up (librdkafka's is ~0.6 s from assign to its first fetch) is not its
    throughput: records/s counts from the first batch received, the start-up is printed on
    its own, as kafka-consumer-perf-test leaves a group's join out."""
    broker = scripted({"cons": 1})
    code = perf.consume_main(["--bootstrap-server", broker.bootstrap, "--topic", "cons", "--messages", "3000",
                              "--record-size", "50", "--max-poll-records", "100", "--reporting-interval", "0",
                              "--no-redis", "--json"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    result = __import__("json").loads(lines[-1])["odradek"]
    assert result["records"] == 3000 and result["records_per_sec"] > 0 and result["first_record_s"] >= 0
    assert any(re.match(r"^\d+ records consumed after the first batch, [\d.]+ records/sec", ln) for ln in lines)
    assert any(re.match(r"^first records [\d.]+ s after the start$", ln) for ln in lines)


def test_consume_with_keys_prefills_a_keyed_topic_then_reads_it(scripted, capsys):
    """``perf consume --keys N`` writes keyed records (N distinct keys, murmur2 over the
    partitions) before it reads them: the keyed consume row of docs/BENCHMARKS.md (issue 30)."""
    broker = scripted({"keyed": 3})
    code = perf.consume_main(["--bootstrap-server", broker.bootstrap, "--topic", "keyed", "--partitions", "3",
                              "--messages", "3000", "--keys", "7", "--record-size", "50", "--reporting-interval",
                              "0", "--no-redis"])
    assert code == 0 and "7 keys" in capsys.readouterr().out
    written = [r for p in range(3) for r in broker.records("keyed", p)]
    assert len(written) == 3000 and {r.key for r in written} == {b"key-%06d" % k for k in range(7)}
    assert all(len(broker.records("keyed", p)) > 0 for p in range(3))
