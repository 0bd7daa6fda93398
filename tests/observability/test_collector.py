"""The pure half: actors' plain-dict counters and the collector that turns them into
Prometheus families, without a broker."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from odradek.actors.metrics import BUCKETS_MS, BoundedLabels, Metrics
from odradek.core.protocol import ApiKey, ErrorCode
from odradek.observe.collector import BrokerCollector, Snapshot


def parsed(snapshot: Snapshot, partition_level: bool = False) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(lambda: snapshot, partition_level))
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_an_observation_lands_in_the_first_bucket_at_or_above_it():
    m = Metrics()
    m.observe("request_total_ms", (0,), 0.3)
    m.observe("request_total_ms", (0,), 0.5)
    m.observe("request_total_ms", (0,), 99999)
    (_, labels, buckets, total), = m.snapshot()["histograms"]
    assert buckets[BUCKETS_MS.index(0.5)] == 2 and buckets[-1] == 1 and total == 0.3 + 0.5 + 99999


def test_counters_of_several_actors_are_added_and_histograms_exported_in_seconds():
    a, b = Metrics(), Metrics()
    a.inc("requests", (int(ApiKey.PRODUCE),), 2)
    b.inc("requests", (int(ApiKey.PRODUCE),), 3)
    a.inc("errors", (int(ApiKey.FETCH), int(ErrorCode.OFFSET_OUT_OF_RANGE)))
    a.observe("request_total_ms", (int(ApiKey.PRODUCE),), 2.0)
    b.observe("request_total_ms", (int(ApiKey.PRODUCE),), 4.0)
    snap = Snapshot({"actors": []}, {"processor-0": {**a.snapshot(), "gauges": []},
                                     "processor-1": {**b.snapshot(), "gauges": []}})
    s = parsed(snap)
    assert s[("odradek_requests_total", (("api", "produce"),))] == 5
    assert s[("odradek_request_errors_total", (("api", "fetch"), ("error", "OFFSET_OUT_OF_RANGE")))] == 1
    assert s[("odradek_request_total_time_seconds_count", (("api", "produce"),))] == 2
    assert abs(s[("odradek_request_total_time_seconds_sum", (("api", "produce"),))] - 0.006) < 1e-9
    assert s[("odradek_request_total_time_seconds_bucket", (("api", "produce"), ("le", "0.0025")))] == 1
    assert s[("odradek_request_total_time_seconds_bucket", (("api", "produce"), ("le", "0.005")))] == 2


def row(hw: int, size: int = 0, leading: int = 1, under_replicated: int = 0) -> list:
    """A log actor's partition row (observe.catalogue.PARTITION_COLUMNS order)."""
    return [size, 1, hw, 0, hw, leading, under_replicated, 0]


LOG_ROWS = [["partition", ["t", 0], row(100, size=1000, under_replicated=1)],
            ["partition", ["t", 1], row(7, size=500, under_replicated=1)],
            ["partition", ["u", 0], row(3, size=1, leading=0)]]
GROUP_GAUGES = [["committed_offset", ["g", "t", 0], 40], ["committed_offset", ["g", "t", 1], 7],
                ["committed_offset", ["g", "elsewhere", 0], 3], ["group_members", ["g", "stable"], 2]]


def test_lag_is_the_high_watermark_minus_the_committed_offset_and_totals_add_up():
    snap = Snapshot({"actors": []}, {"log-0": {"gauges": LOG_ROWS[:2]}, "log-1": {"gauges": LOG_ROWS[2:]},
                                     "group_coordinator": {"gauges": GROUP_GAUGES}, "fetch": None})
    s = parsed(snap, partition_level=True)
    assert s[("odradek_consumer_group_lag", (("group", "g"), ("partition", "0"), ("topic", "t")))] == 60
    assert s[("odradek_consumer_group_lag", (("group", "g"), ("partition", "1"), ("topic", "t")))] == 0
    # a partition this broker does not host has no known end: no lag is invented for it
    assert not any(k[0] == "odradek_consumer_group_lag" and ("topic", "elsewhere") in k[1] for k in s)
    assert s[("odradek_consumer_group_topic_lag", (("group", "g"), ("topic", "t")))] == 60
    assert s[("odradek_log_size_bytes", (("partition", "1"), ("topic", "t")))] == 500
    assert s[("odradek_under_replicated_partitions", ())] == 2
    assert s[("odradek_leaders", ())] == 2
    assert s[("odradek_partitions", ())] == 3
    assert s[("odradek_consumer_group_members", (("group", "g"), ("state", "stable")))] == 2
    assert s[("odradek_scrape_actor_answered", (("actor", "fetch"),))] == 0


def test_by_default_partitions_are_summed_per_topic_and_no_partition_series_is_exported():
    snap = Snapshot({"actors": []}, {"log-0": {"gauges": LOG_ROWS}, "group_coordinator": {"gauges": GROUP_GAUGES}})
    s = parsed(snap)
    assert not any(("partition", "0") in labels for _, labels in s), "a per-partition series by default"
    assert s[("odradek_topic_log_size_bytes", (("topic", "t"),))] == 1500
    assert s[("odradek_topic_partitions", (("topic", "t"),))] == 2
    assert s[("odradek_topic_leaders", (("topic", "u"),))] == 0
    assert s[("odradek_topic_under_replicated_partitions", (("topic", "t"),))] == 2
    assert s[("odradek_consumer_group_topic_lag", (("group", "g"), ("topic", "t")))] == 60
    assert s[("odradek_leaders", ())] == 2


@pytest.mark.parametrize("partition_level", [False, True])
def test_the_served_text_is_what_prometheus_clients_writer_makes_of_the_same_families(partition_level):
    odd = [["partition", ['we"ird\\top\nic', 0], row(5)]]  # not a legal topic name: escaping still holds
    odd.append(["partition", ["big", 1], [10**6, 999_999, -1, 0, 2**40, 1, 0, 0]])  # around the fast path's edges
    groups = [*GROUP_GAUGES, ["committed_offset", ['g "x"\n', 'we"ird\\top\nic', 0], 2]]
    m = Metrics()
    m.inc("requests", (int(ApiKey.PRODUCE),), 2**60)
    m.inc("client_requests", ('a "quoted"\\client\n',), 3)
    for ms in (0.01, 4.0, 1e9):
        m.observe("request_total_ms", (int(ApiKey.FETCH),), ms)
        m.observe("request_remote_ms", (12345,), ms)  # an API key without a name
    snap = Snapshot({"actors": [{"name": "log-0", "role": "log", "state": "running", "rss": 10**9}]},
                    {"log-0": {"gauges": LOG_ROWS + odd}, "group_coordinator": {"gauges": groups},
                     "p": {**m.snapshot(), "gauges": [["connections", ["PLAINTEXT"], 2]]}})
    collector = BrokerCollector(lambda: snap, partition_level)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    expected = generate_latest(registry)
    assert collector.exposition() == expected
    assert collector.exposition() == expected  # and again, from the label strings it cached
    assert ('odradek_consumer_group_lag{group="g \\"x\\"\\n"' in expected.decode()) == partition_level


def test_per_partition_lines_kept_between_scrapes_follow_each_partitions_new_values():
    rows = [["partition", ["t", 0], row(100, size=1000)], ["partition", ["t", 1], row(7, size=500)],
            ["partition", ["u", 0], row(3, size=1, leading=0)]]
    snap = Snapshot({"actors": []}, {"log-0": {"gauges": rows}})
    collector = BrokerCollector(lambda: snap, True)

    def fresh() -> bytes:  # what prometheus_client writes of the same families, nothing kept
        registry = CollectorRegistry(auto_describe=False)
        registry.register(BrokerCollector(lambda: snap, True))
        return generate_latest(registry)
    assert collector.exposition() == fresh()
    rows[1] = ["partition", ["t", 1], row(8, size=612)]  # one partition moved on, one went, one came
    del rows[2]
    rows.append(["partition", ["v", 4], row(1, size=2.5, under_replicated=1)])
    text = collector.exposition()
    assert text == fresh()
    assert b'odradek_high_watermark{partition="1",topic="t"} 8.0\n' in text and b'topic="u"' not in text
    assert b'odradek_log_size_bytes{partition="4",topic="v"} 2.5\n' in text
    assert b'odradek_log_size_bytes{partition="0",topic="t"} 1000.0\n' in text


def test_the_actor_table_becomes_per_actor_metrics():
    status = {"actors": [{"name": "log-0", "role": "log", "state": "running", "restarts": 2, "processed": 10,
                          "open": 1, "backlog": 0, "rss": 1000, "cpu": 50.0}]}
    s = parsed(Snapshot(status, {}))
    key = (("actor", "log-0"), ("role", "log"))
    assert s[("odradek_actor_restarts_total", key)] == 2
    assert s[("odradek_actor_messages_total", key)] == 10
    assert s[("odradek_actor_cpu_ratio", key)] == 0.5
    assert s[("odradek_actor_up", key)] == 1


def test_bounded_labels_keep_held_values_by_name_and_give_the_oldest_idle_ones_place():
    m = Metrics()
    labels = BoundedLabels(m, "client_requests", cap=2, longest=5)

    def count(value: str) -> str:
        label = labels.acquire(value)
        m.inc("client_requests", (label,))
        return label
    assert count("") == "(none)" and count("toolong") == "(other)"
    a, b = count("a"), count("b")
    assert (a, b) == ("a", "b")
    assert count("c") == "(other)", "both places held: a third value has none"
    labels.release(a)
    labels.release(b)
    assert count("a") == "a", "an idle value that comes back keeps its place and its count"
    assert count("c") == "c", "the idle value b made room"
    counters = {values[0]: v for (_, values), v in m.counters.items()}
    assert counters == {"(none)": 1, "(other)": 1 + 1 + 1, "a": 2, "c": 1}, "b's count moved into (other)"
    labels.release("(other)")
    labels.release(None)  # hold nothing: no error, no place taken
    assert count("d") == "(other)"
