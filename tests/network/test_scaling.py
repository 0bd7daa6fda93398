"""Scaling the handler pool at run time (IncrementalAlterConfigs num.io.threads) under load."""
from __future__ import annotations

from odradek.core.protocol import ApiKey

from tests.network.helpers import PingLoad, actors_of, connect, wait_until


def alter_handlers(broker, count: int) -> None:
    body = {"resources": [{"type": "broker", "name": "0",
                           "configs": [{"name": "num.io.threads", "value": str(count), "op": "set"}]}]}
    with connect(broker) as conn:
        [res] = conn.request(ApiKey.INCREMENTAL_ALTER_CONFIGS, body, timeout=60).body["resources"]
    assert res["error_code"] == 0, res


def running_handlers(broker) -> list[dict]:
    return [a for a in actors_of(broker, "handler") if a["state"] == "running"]


def processed_by_handlers(broker) -> dict[str, int]:
    return {a["name"]: a["processed"] or 0 for a in running_handlers(broker)}


def test_scaling_handlers_one_to_four_to_one_under_load_fails_no_request(start_broker):
    broker = start_broker(num_io_threads=1, num_network_threads=2)
    with PingLoad(broker, threads=4, depth=8) as load:
        wait_until(lambda: load.done > 500, what="load to start")

        alter_handlers(broker, 4)
        assert len(running_handlers(broker)) == 4
        before = processed_by_handlers(broker)
        mark = load.done
        wait_until(lambda: load.done > mark + 3000, what="load on four handlers")
        # Connections were re-pinned onto the new handlers: every one of them did work.
        wait_until(lambda: all(n > before.get(name, 0) for name, n in processed_by_handlers(broker).items()),
                   what="every new handler to serve requests")

        alter_handlers(broker, 1)
        wait_until(lambda: [a["name"] for a in actors_of(broker, "handler")] == ["handler-0"],
                   what="the retired handlers to leave")
        mark = load.done
        wait_until(lambda: load.done > mark + 2000, what="load on one handler again")
    assert load.failures == []
    assert load.done > 5000


def test_scaling_up_and_down_repeatedly_under_load_fails_no_request(start_broker):
    broker = start_broker(num_io_threads=2)
    with PingLoad(broker, threads=3, depth=4) as load:
        for count in (3, 1, 4, 2):
            mark = load.done
            alter_handlers(broker, count)
            wait_until(lambda: len(actors_of(broker, "handler")) == count, what=f"{count} handlers")
            wait_until(lambda: load.done > mark + 500, what="progress")
    assert load.failures == []
