"""The console's lists as an operator needs them (issue 29), in headless chromium: topics
with size and record count, searchable, internal topics hidden by default and never
deletable (no button, and the server refuses); groups with members, lag and topics,
searchable."""
from __future__ import annotations

import os
import threading
import time

import pytest
from selenium.webdriver.common.by import By

from odradek import Admin, Consumer, Producer
from odradek.core.protocol import OFFSETS_TOPIC
from odradek.types import TopicPartition
from tests.observability.browser import headless_chromium
from tests.observability.conftest import http_get


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def data(shared_broker):
    """Two topics with records, a group with committed offsets (which makes the offsets topic)."""
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("list-orders", partitions=2)
        admin.create_topic("list-payments", partitions=1)
    with Producer(shared_broker.bootstrap) as producer:
        for i in range(40):
            producer.send("list-orders", value=os.urandom(200), partition=i % 2).result(30)
        producer.send("list-payments", value=b"p", partition=0).result(30)
    consumer = Consumer(shared_broker.bootstrap, group_id="list-billing", enable_auto_commit=False)
    consumer.assign([TopicPartition("list-orders", 0), TopicPartition("list-orders", 1)])
    consumer.commit({TopicPartition("list-orders", 0): 5, TopicPartition("list-orders", 1): 20})
    consumer.close()
    return shared_broker


def rows(browser, table: str) -> dict[str, dict[str, str]]:
    heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, f"#{table} th")]
    out = {}
    for tr in browser.find_elements(By.CSS_SELECTOR, f"#{table} tr")[1:]:
        cells = [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        out[cells[0]] = dict(zip(heads, cells))
    return out


def test_the_topic_list_shows_size_and_records_and_hides_internal_topics(data, browser):
    browser.get(data.console_url + "topics")
    topics = rows(browser, "topics")
    assert topics["list-orders"]["records"] == "40" and topics["list-payments"]["records"] == "1"
    size = topics["list-orders"]["size"]
    assert size.endswith("KiB") and float(size.split()[0]) > 40 * 200 / 1024, size  # 40 incompressible records of 200 bytes
    assert OFFSETS_TOPIC not in topics
    assert "internal topic" in browser.find_element(By.ID, "hidden-internal").text
    browser.find_element(By.LINK_TEXT, "show").click()
    shown = rows(browser, "topics")
    assert shown[OFFSETS_TOPIC]["internal"] == "yes" and "kept by the broker" in shown[OFFSETS_TOPIC][""]
    row = browser.find_element(By.XPATH, f"//tr[td/a[text()='{OFFSETS_TOPIC}']]")
    assert not row.find_elements(By.TAG_NAME, "button")  # no delete button for it
    assert row.find_elements(By.TAG_NAME, "td")[0].text == OFFSETS_TOPIC


def test_the_server_refuses_to_delete_an_internal_topic(data):
    import urllib.request
    req = urllib.request.Request(data.console_url + f"topics/{OFFSETS_TOPIC}/delete",
                                 data=f"confirm={OFFSETS_TOPIC}".encode())
    try:
        urllib.request.urlopen(req, timeout=10)
        status = 200
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode()
    assert status == 403 and "internal topic" in body
    with Admin(data.bootstrap) as admin:
        assert OFFSETS_TOPIC in admin.list_topics(include_internal=True)


def test_the_topic_search_keeps_the_matching_names(data, browser):
    browser.get(data.console_url + "topics")
    box = browser.find_element(By.CSS_SELECTOR, "#search-topics input[name=q]")
    box.send_keys("PAY")
    box.submit()
    assert list(rows(browser, "topics")) == ["list-payments"]
    browser.get(data.console_url + "topics?q=nothing-like-it")
    assert rows(browser, "topics") == {} and "No topic matches" in browser.page_source


def test_the_group_list_shows_members_lag_and_topics(data, browser):
    stop = threading.Event()

    def member():  # a live member of another group, polling until the test is done
        c = Consumer(data.bootstrap, group_id="list-live", auto_offset_reset="earliest", enable_auto_commit=False)
        c.subscribe(["list-payments"])
        while not stop.is_set():
            if c.poll(200):
                c.commit()
        c.close()
    t = threading.Thread(target=member, daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            browser.get(data.console_url + "groups")
            groups = rows(browser, "groups")
            live = groups.get("list-live", {})
            if (live.get("members"), live.get("topics")) == ("1", "list-payments") or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert groups["list-live"]["members"] == "1" and groups["list-live"]["topics"] == "list-payments"
        billing = groups["list-billing"]
        assert (billing["lag"], billing["members"], billing["topics"]) == ("15", "0", "list-orders")  # (20 - 5) + (20 - 20)
        browser.get(data.console_url + "groups?q=BILL")
        assert list(rows(browser, "groups")) == ["list-billing"]
    finally:
        stop.set()
        t.join(30)
