"""The web console in a real headless chromium: pages load, a topic created in the page
exists in the broker, the message browser shows a record the test produced, a group's lag
appears."""
from __future__ import annotations

import os

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from odradek import Admin, Consumer, Producer
from odradek.types import TopicPartition
from tests.observability.browser import headless_chromium


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        yield driver


def text_of(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def test_every_main_page_loads(shared_broker, browser):
    base = shared_broker.console_url
    for path, title in (("", "Cluster"), ("topics", "Topics"), ("groups", "Consumer groups"), ("charts", "Live charts")):
        browser.get(base + path)
        assert browser.find_element(By.TAG_NAME, "h1").text == title
    browser.get(base)
    actors = text_of(browser, "actors")
    assert "log-0" in actors and "acceptor" in actors and "metrics" in actors and "running" in actors


def test_a_topic_created_in_the_page_exists_in_the_broker(shared_broker, browser):
    browser.get(shared_broker.console_url + "topics")
    form = browser.find_element(By.ID, "create-topic")
    form.find_element(By.NAME, "name").send_keys("made-in-the-browser")
    partitions = form.find_element(By.NAME, "partitions")
    partitions.clear()
    partitions.send_keys("3")
    form.find_element(By.TAG_NAME, "button").click()
    # the click returns as the next page starts loading: the old page's h1 may still be found,
    # then go stale (CI saw StaleElementReferenceException); wait for the topic's page itself
    WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(By.TAG_NAME, "h1").text == "Topic made-in-the-browser")
    with Admin(shared_broker.bootstrap) as admin:
        assert len(admin.describe_topic("made-in-the-browser").partitions) == 3


def test_deleting_a_topic_needs_its_name_typed_again(shared_broker, browser):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("to-delete")
    browser.get(shared_broker.console_url + "topics")
    row = browser.find_element(By.XPATH, "//tr[td/a[text()='to-delete']]")
    row.find_element(By.TAG_NAME, "button").click()  # nothing typed
    # the click returns as the form's page starts loading (page_source was '' once): wait for it
    WebDriverWait(browser, 20).until(lambda d: "Not deleted" in d.page_source)
    with Admin(shared_broker.bootstrap) as admin:
        assert "to-delete" in admin.list_topics()
    row = browser.find_element(By.XPATH, "//tr[td/a[text()='to-delete']]")
    row.find_element(By.NAME, "confirm").send_keys("to-delete")
    row.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(browser, 20).until(lambda d: "Deleted to-delete" in d.page_source)  # the redirect after it
    with Admin(shared_broker.bootstrap) as admin:
        assert "to-delete" not in admin.list_topics()


def test_the_message_browser_shows_a_record_the_test_produced(shared_broker, browser):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("browsed", partitions=1)
    with Producer(shared_broker.bootstrap) as producer:
        producer.send("browsed", value=b"not this one", key=b"other", partition=0).result(30)
        producer.send("browsed", value=b'{"order": 42, "item": "tea"}', key=b"order-42", partition=0).result(30)
    browser.get(shared_broker.console_url + "topics/browsed/messages?partition=0&format=json&key=order-42")
    records = text_of(browser, "records")
    assert "order-42" in records and '"item": "tea"' in records and "not this one" not in records
    browser.get(shared_broker.console_url + "topics/browsed/messages?partition=0&format=hex&offset=1")
    assert b"order-42".hex(" ") in text_of(browser, "records")


def test_the_topic_page_shows_each_partitions_offsets_size_and_segments(shared_broker, browser):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("sized", partitions=2)
    with Producer(shared_broker.bootstrap) as producer:
        for i in range(3):
            producer.send("sized", value=os.urandom(100), partition=1).result(30)  # incompressible
    browser.get(shared_broker.console_url + "topics/sized")
    rows = [[c.text for c in r.find_elements(By.TAG_NAME, "td")]
            for r in browser.find_elements(By.CSS_SELECTOR, "#partitions tr")[1:]]
    by_partition = {r[0]: r for r in rows}
    # partition, leader, replicas, ISR, start, high watermark, end, size, segments
    assert by_partition["0"][4:] == ["0", "0", "0", "0", "1"]
    start, hw, end, size, segments = by_partition["1"][4:]
    assert (start, hw, end, segments) == ("0", "3", "3", "1") and int(size) > 300


def test_a_groups_lag_appears_on_its_page(shared_broker, browser):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("lagged", partitions=1)
    with Producer(shared_broker.bootstrap) as producer:
        for i in range(30):
            producer.send("lagged", value=b"%d" % i, partition=0)
    consumer = Consumer(shared_broker.bootstrap, group_id="browser-group", enable_auto_commit=False)
    consumer.assign([TopicPartition("lagged", 0)])
    consumer.commit({TopicPartition("lagged", 0): 12})
    consumer.close()
    browser.get(shared_broker.console_url + "groups")
    browser.find_element(By.LINK_TEXT, "browser-group").click()
    # the click returns as the group's page starts loading: wait for its lag table
    WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "#lag td.lag"))
    lag_cells = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#lag td.lag")]
    assert lag_cells == ["18"]
