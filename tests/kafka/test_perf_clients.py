"""`odradek perf produce|consume --client confluent` against a real broker: the benchmark of
issue 11 runs the same workload through confluent-kafka, with librdkafka's own defaults
unless told, and can give both clients requests of the same shape (one batch each) so the
broker's CPU per batch compares like with like."""
from __future__ import annotations

import json

import pytest
from confluent_kafka import KafkaException

from odradek import perf


def _summary(capsys) -> dict:
    return json.loads(capsys.readouterr().out.splitlines()[-1])


def test_librdkafka_keeps_its_own_batch_size_unless_told_and_never_gets_the_bundled_request_size():
    assert "batch.size" not in perf.confluent_props({"acks": "1"})  # librdkafka's 1,000,000 bytes
    props = perf.confluent_props({"batch.size": "65536", "max.request.size": "1000", "linger.ms": "5"})
    assert props["batch.size"] == "65536" and props["linger.ms"] == "5"
    assert "max.request.size" not in props and "message.max.bytes" not in props


def test_both_clients_can_send_one_batch_per_request_for_a_cpu_per_batch_comparison(kafka_broker, topic, capsys):
    code = perf.produce_main(["--bootstrap-server", kafka_broker.bootstrap, "--topic", topic, "--num-records",
                              "20000", "--record-size", "100", "--reporting-interval", "0", "--no-redis", "--json",
                              "--client", "odradek,confluent", "--broker-pid", str(kafka_broker.pid),
                              "--producer-props", "acks=1", "linger.ms=5", "compression.type=lz4",
                              "batch.size=16384", "max.request.size=1000"])
    assert code == 0
    summary = _summary(capsys)
    for client in ("odradek", "confluent"):
        s = summary[client]
        assert s["records_per_sec"] > 0 and s["broker_cpu_s"] > 0, s
        assert s["batches"] == s["requests"], f"{client}: {s['batches']} batches in {s['requests']} requests"
        assert s["batches"] >= 20000 * 100 // 16384, s  # batch.size held: at most ~16 KiB of records a batch


def test_confluent_consume_takes_librdkafka_properties_and_reads_every_record(kafka_broker, topic, capsys):
    code = perf.consume_main(["--bootstrap-server", kafka_broker.bootstrap, "--topic", topic, "--messages", "30000",
                              "--record-size", "100", "--reporting-interval", "0", "--no-redis", "--json",
                              "--client", "confluent", "--consumer-props", "fetch.wait.max.ms=50",
                              "queued.max.messages.kbytes=1024"])
    assert code == 0
    out = capsys.readouterr().out
    assert "giving up" not in out
    s = json.loads(out.splitlines()[-1])["confluent"]
    assert s["records_per_sec"] > 0 and len(s["first_record_s"]) == 1, s
    with pytest.raises(KafkaException, match="no.such.property"):  # the properties reach librdkafka
        perf.consume_main(["--bootstrap-server", kafka_broker.bootstrap, "--topic", topic, "--messages", "10",
                           "--no-redis", "--client", "confluent", "--consumer-props", "no.such.property=1"])
