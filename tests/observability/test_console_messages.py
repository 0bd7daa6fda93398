"""The message browser across partitions (issue 29), in headless chromium: newest first by
default, oldest first on request, paged with a cursor until the first record, timestamps
shown as dates in the reader's zone, a key filter and a single partition still there."""
from __future__ import annotations

import datetime
import re
import time

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from odradek import Admin, Producer
from tests.observability.browser import headless_chromium
from tests.observability.conftest import http_get

BASE = 1_700_000_000_000  # ms: 2023-11-14 22:13:20 UTC
N = 130


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def spread(shared_broker):
    """Record i on partition i % 3 with timestamp BASE + i seconds: the order across
    partitions is known."""
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("spread", partitions=3)
    with Producer(shared_broker.bootstrap) as producer:
        futures = [producer.send("spread", value=b"r%d" % i, key=b"k%d" % i, partition=i % 3,
                                 timestamp_ms=BASE + i * 1000) for i in range(N)]
        for f in futures:
            f.result(30)
    return shared_broker


def shown(browser) -> list[str]:
    return [tr.find_elements(By.TAG_NAME, "td")[4].text for tr in browser.find_elements(By.CSS_SELECTOR, "#records tr")[1:]]


def test_newest_first_across_partitions_paged_to_the_first_record(spread, browser):
    browser.get(spread.console_url + "topics/spread/messages")
    pages = []
    while True:
        pages.append(shown(browser))
        nxt = browser.find_elements(By.ID, "next-page")
        if not nxt:
            break
        nxt[0].click()
        assert len(pages) < 10, "no end to the pages"
    assert [len(p) for p in pages] == [50, 50, 30]
    assert sum(pages, []) == [f"r{i}" for i in reversed(range(N))]


def test_oldest_first_on_request(spread, browser):
    browser.get(spread.console_url + "topics/spread/messages?order=oldest")
    first = shown(browser)
    browser.find_element(By.ID, "next-page").click()
    assert first + shown(browser) == [f"r{i}" for i in range(100)]


def test_timestamps_are_dates_in_the_readers_zone(spread, browser):
    browser.get(spread.console_url + "topics/spread/messages?partition=0&order=oldest")
    cell = browser.find_element(By.CSS_SELECTOR, "#records time.ts")
    local = datetime.datetime.fromtimestamp(BASE / 1000).astimezone()  # the browser runs in this machine's zone
    zone = local.strftime("%z")
    assert cell.text == local.strftime("%Y-%m-%d %H:%M:%S.000 ") + zone[:3] + ":" + zone[3:]
    assert cell.get_attribute("title") == "2023-11-14 22:13:20.000 UTC"


def test_one_partition_a_key_filter_and_a_timestamp_still_work(spread, browser):
    browser.get(spread.console_url + "topics/spread/messages?partition=1&order=oldest")
    assert shown(browser)[:3] == ["r1", "r4", "r7"]
    # a filtered page reads each partition's next 50 offsets (here all 130 records) and shows the matches
    browser.get(spread.console_url + "topics/spread/messages?key=k12")
    assert shown(browser) == [f"r{i}" for i in range(129, 119, -1)] + ["r12"]
    assert not browser.find_elements(By.ID, "next-page")
    browser.get(spread.console_url + "topics/spread/messages?value=r11")  # a value filter the same way
    assert shown(browser) == ["r119", "r118", "r117", "r116", "r115", "r114", "r113", "r112", "r111", "r110", "r11"]
    browser.get(spread.console_url + f"topics/spread/messages?order=oldest&timestamp={BASE + 100_000}")
    assert shown(browser)[:3] == ["r100", "r101", "r102"]


def test_a_partition_that_does_not_exist_is_a_404_and_a_bad_cursor_a_400(spread):
    assert http_get(spread.console_url + "topics/spread/messages?partition=7")[0] == 404
    assert http_get(spread.console_url + "topics/spread/messages?cursor=zero")[0] == 400


def test_a_record_produced_from_the_page_is_shown_first(spread, browser):
    browser.get(spread.console_url + "topics/spread/messages")
    browser.find_element(By.CSS_SELECTOR, "#produce summary").click()
    form = browser.find_element(By.CSS_SELECTOR, "#produce form")
    form.find_element(By.NAME, "key").send_keys("typed-key")
    form.find_element(By.NAME, "value").send_keys('{"typed": true}')
    form.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, "produced"))
    assert re.fullmatch(r"Produced to partition \d at offset \d+", browser.find_element(By.ID, "produced").text)
    first = [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#records tr")[1].find_elements(By.TAG_NAME, "td")]
    assert first[3:5] == ["typed-key", '{"typed": true}']
