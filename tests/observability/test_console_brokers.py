"""The brokers page (issue 29), in headless chromium: each live broker with its replicas,
leaders and under-replicated partitions; in a cluster, a broker that dies leaves the list
and its partitions show under-replicated on the leader's row."""
from __future__ import annotations

import os
import re
import time

import pytest
from selenium.webdriver.common.by import By

from odradek import Admin, Producer
from tests.observability.browser import headless_chromium


def rows(browser) -> dict[str, list[str]]:
    return {cells[0]: cells for cells in ([td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                                          for tr in browser.find_elements(By.CSS_SELECTOR, "#brokers tr")[1:])}


def test_one_broker_is_listed_with_its_partitions_and_disk(shared_broker):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("brokered", partitions=4)
    with headless_chromium() as browser:
        browser.get(shared_broker.console_url + "brokers")
        listed = rows(browser)
    assert list(listed) == ["0"]
    broker, address, rack, listeners, replicas, leaders, under, logs, free, note = listed["0"]
    assert address == shared_broker.bootstrap and int(replicas) >= 4 and leaders == replicas and under == "0"
    assert listeners == f"PLAINTEXT {shared_broker.bootstrap}"  # bound, not the configured port 0
    assert re.fullmatch(r"[\d.]+ (B|KiB|MiB)", logs), logs
    assert re.fullmatch(r"[\d.]+ [KMGT]iB of [\d.]+ [KMGT]iB", free), free
    assert "controller" in note and "this console's broker" in note


@pytest.mark.slow
def test_a_dead_broker_leaves_the_list_and_its_partitions_are_under_replicated(make_cluster):
    cluster = make_cluster(brokers=2)
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("twice", partitions=2, replication_factor=2)
    cluster.wait_for(lambda: all(len(cluster.isr("twice", p)) == 2 for p in (0, 1)), 30, "both ISRs full")
    survivor_id = cluster.ids[0]
    survivor = cluster.brokers[survivor_id]
    with headless_chromium() as browser:
        browser.get(survivor.console_url + "brokers")
        before = rows(browser)
        assert sorted(before) == sorted(str(i) for i in cluster.ids)
        assert all(r[4] == "2" for r in before.values())  # each hosts both partitions' replicas
        cluster.kill(cluster.ids[1])
        deadline = time.monotonic() + 60
        while True:
            browser.get(survivor.console_url + "brokers")
            after = rows(browser)
            if list(after) == [str(survivor_id)] and after[str(survivor_id)][5] == "2" and \
                    after[str(survivor_id)][6] == "2" or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert list(after) == [str(survivor_id)]
    assert after[str(survivor_id)][5:7] == ["2", "2"]  # leads both, both under-replicated


@pytest.mark.slow
def test_three_brokers_with_racks_listeners_disk_and_under_replicated_partitions(make_cluster):
    """In a 3-broker cluster each broker's row has its rack, its listeners (as it registered
    them: the addresses clients reach it at), its replicas and leaders, and its disk from its
    own DescribeLogDirs; when one dies, the survivors' rows count the partitions it left
    under-replicated."""
    cluster = make_cluster(brokers=3, broker_settings={i: {"broker.rack": f"rack-{i}"} for i in (1, 2, 3)})
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic("thrice", partitions=3, replication_factor=3)
    cluster.wait_for(lambda: all(len(cluster.isr("thrice", p)) == 3 for p in range(3)), 30, "every ISR full")
    with Producer(cluster.bootstrap, acks="all") as producer:
        for i in range(300):
            producer.send("thrice", value=os.urandom(1000), partition=i % 3)  # incompressible
        producer.flush()
    first, dead = cluster.ids[0], cluster.ids[-1]
    with headless_chromium() as browser:
        browser.get(cluster.brokers[first].console_url + "brokers")
        listed = rows(browser)
        assert sorted(listed) == sorted(str(i) for i in cluster.ids)
        for i in cluster.ids:
            _, address, rack, listeners, replicas, leaders, under, logs, free, note = listed[str(i)]
            assert address == cluster.brokers[i].bootstrap and rack == f"rack-{i}"
            assert listeners == f"PLAINTEXT {cluster.brokers[i].bootstrap}"
            assert replicas == "3" and under == "0"
            assert re.fullmatch(r"[\d.]+ KiB", logs) and float(logs.split()[0]) >= 290, logs  # 3 x 100 records of 1 KB
            assert " of " in free
        assert sum(int(r[5]) for r in listed.values()) == 3
        assert sum("controller" in r[9] for r in listed.values()) == 1
        assert "this console's broker" in listed[str(first)][9]
        cluster.kill(dead)
        deadline = time.monotonic() + 60
        while True:
            browser.get(cluster.brokers[first].console_url + "brokers")
            after = rows(browser)
            if sorted(after) == sorted(str(i) for i in cluster.ids if i != dead) and \
                    sum(int(r[6]) for r in after.values()) == 3 or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert str(dead) not in after
    assert sum(int(r[5]) for r in after.values()) == 3 and sum(int(r[6]) for r in after.values()) == 3
