"""Client benchmarks behind ``odradek perf`` (docs/BENCHMARKS.md): not part of the broker.

``clients`` holds produce, consume, e2e, replicated, failover and scrape (each an
``*_main(argv)``, named in ``odradek/cli.py``'s ``PERF_TESTS``); ``console`` the console's
page-load times. The names below are the surface ``odradek/bench/``, the console benchmark and
the tests use; anything else in these modules is private to them.
"""
from odradek.perf.clients import (
    Stats, confluent_props, consume_main, create_replicated, e2e_main, failover_main, loadavg,
    local_cluster, percentile, producer_kwargs, produce_main, random_payload, redis_available,
    replicated_main, scrape_main, stop_cluster, with_redis,
)

__all__ = [
    "Stats", "confluent_props", "consume_main", "create_replicated", "e2e_main", "failover_main",
    "loadavg", "local_cluster", "percentile", "producer_kwargs", "produce_main", "random_payload",
    "redis_available", "replicated_main", "scrape_main", "stop_cluster", "with_redis",
]
