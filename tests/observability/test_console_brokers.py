"""The brokers page (issue 29), in headless chromium: each live broker with its replicas,
leaders and under-replicated partitions; in a cluster, a broker that dies leaves the list
and its partitions show under-replicated on the leader's row."""
from __future__ import annotations

import time

import pytest
from selenium.webdriver.common.by import By

from odradek import Admin
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
    broker, address, rack, replicas, leaders, under, disk, note = listed["0"]
    assert address == shared_broker.bootstrap and int(replicas) >= 4 and leaders == replicas and under == "0"
    assert disk != "-" and "controller" in note and "this console's broker" in note


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
        assert all(r[3] == "2" for r in before.values())  # each hosts both partitions' replicas
        cluster.kill(cluster.ids[1])
        deadline = time.monotonic() + 60
        while True:
            browser.get(survivor.console_url + "brokers")
            after = rows(browser)
            if list(after) == [str(survivor_id)] and after[str(survivor_id)][4] == "2" and \
                    after[str(survivor_id)][5] == "2" or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert list(after) == [str(survivor_id)]
    assert after[str(survivor_id)][4:6] == ["2", "2"]  # leads both, both under-replicated
