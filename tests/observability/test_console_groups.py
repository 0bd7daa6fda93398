"""Group operations in the console (issue 29), in headless chromium: resetting a group's
offsets shows a dry run first and commits only on "Apply"; an active group is not reset;
deleting a group needs its name typed again."""
from __future__ import annotations

import threading

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from selenium.webdriver.support.wait import WebDriverWait

from odradek import Admin, Consumer, Producer
from odradek.group import GroupAdmin
from odradek.types import TopicPartition
from tests.observability.browser import headless_chromium


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        yield driver


def committed_group(bootstrap: str, group: str, topic: str, offsets: dict[int, int], records: int = 30) -> None:
    with Admin(bootstrap) as admin:
        admin.create_topic(topic, partitions=len(offsets))
    with Producer(bootstrap) as producer:
        for i in range(records):
            producer.send(topic, value=b"%d" % i, partition=i % len(offsets)).result(30)
    consumer = Consumer(bootstrap, group_id=group, enable_auto_commit=False)
    consumer.assign([TopicPartition(topic, p) for p in offsets])
    consumer.commit({TopicPartition(topic, p): o for p, o in offsets.items()})
    consumer.close()


def committed(bootstrap: str, group: str) -> dict:
    with GroupAdmin(bootstrap) as admin:
        return {(tp.topic, tp.partition): o for tp, o in admin.committed(group).items()}


def wait_for(browser, element_id: str):
    return WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_elements(By.ID, element_id))[0]


def test_a_reset_shows_a_dry_run_and_commits_only_when_applied(shared_broker, browser):
    committed_group(shared_broker.bootstrap, "resettable", "reset-topic", {0: 3, 1: 7})  # 15 records each
    browser.get(shared_broker.console_url + "groups/resettable")
    form = browser.find_element(By.ID, "reset")
    Select(form.find_element(By.NAME, "to")).select_by_visible_text("latest")
    form.find_element(By.TAG_NAME, "button").click()
    table = wait_for(browser, "preview")
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in table.find_elements(By.TAG_NAME, "tr")[1:]]
    assert rows == [["reset-topic", "0", "3", "15"], ["reset-topic", "1", "7", "15"]]
    assert "Dry run" in browser.find_element(By.ID, "group-message").text
    assert committed(shared_broker.bootstrap, "resettable") == {("reset-topic", 0): 3, ("reset-topic", 1): 7}
    browser.find_element(By.CSS_SELECTOR, "#apply-reset button").click()
    WebDriverWait(browser, 20).until(lambda d: "Reset 2 partition(s) to latest: 2 moved" in d.page_source)
    assert committed(shared_broker.bootstrap, "resettable") == {("reset-topic", 0): 15, ("reset-topic", 1): 15}
    lag = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#lag td.lag")]
    assert lag == ["0", "0"]


def test_a_shift_reset_and_an_active_group_refused(shared_broker, browser):
    committed_group(shared_broker.bootstrap, "shifted", "shift-topic", {0: 10})
    browser.get(shared_broker.console_url + "groups/shifted")
    form = browser.find_element(By.ID, "reset")
    Select(form.find_element(By.NAME, "to")).select_by_visible_text("shift")
    form.find_element(By.NAME, "value").send_keys("-4")
    form.find_element(By.TAG_NAME, "button").click()
    wait_for(browser, "apply-reset").find_element(By.TAG_NAME, "button").click()
    WebDriverWait(browser, 20).until(lambda d: "Reset 1 partition(s) to shift" in d.page_source)
    assert committed(shared_broker.bootstrap, "shifted") == {("shift-topic", 0): 6}
    stop, joined = threading.Event(), threading.Event()

    def member():
        c = Consumer(shared_broker.bootstrap, group_id="shifted", enable_auto_commit=False)
        c.subscribe(["shift-topic"])
        while not stop.is_set():
            c.poll(100)
            if c.assignment():
                joined.set()
        c.close()
    t = threading.Thread(target=member, daemon=True)
    t.start()
    try:
        assert joined.wait(60)
        browser.get(shared_broker.console_url + "groups/shifted")
        form = browser.find_element(By.ID, "reset")
        Select(form.find_element(By.NAME, "to")).select_by_visible_text("earliest")
        form.find_element(By.TAG_NAME, "button").click()
        message = wait_for(browser, "group-message").text
        assert message.startswith("Not reset:") and "active members" in message
    finally:
        stop.set()
        t.join(30)
    assert committed(shared_broker.bootstrap, "shifted") == {("shift-topic", 0): 6}


def test_a_reset_to_an_offset_of_one_partition_is_clamped_to_its_log(shared_broker, browser):
    """To offset N on one partition (the CLI's --topic T:P --to-offset N): past the log end the
    dry run shows the log end and says so; only that partition moves. Then one offset for
    every partition of the topic."""
    committed_group(shared_broker.bootstrap, "to-offset", "offset-topic", {0: 3, 1: 7})  # 15 records each
    browser.get(shared_broker.console_url + "groups/to-offset")
    form = browser.find_element(By.ID, "reset")
    Select(form.find_element(By.NAME, "topic")).select_by_visible_text("offset-topic")
    form.find_element(By.NAME, "partition").send_keys("1")
    Select(form.find_element(By.NAME, "to")).select_by_visible_text("offset")
    form.find_element(By.NAME, "value").send_keys("100")
    form.find_element(By.TAG_NAME, "button").click()
    table = wait_for(browser, "preview")
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")] for tr in table.find_elements(By.TAG_NAME, "tr")[1:]]
    assert rows == [["offset-topic", "1", "7", "15"]]
    assert "1 partition(s) do not hold offset 100" in browser.find_element(By.ID, "group-message").text
    browser.find_element(By.CSS_SELECTOR, "#apply-reset button").click()
    WebDriverWait(browser, 20).until(lambda d: "Reset 1 partition(s) to offset: 1 moved" in d.page_source)
    assert committed(shared_broker.bootstrap, "to-offset") == {("offset-topic", 0): 3, ("offset-topic", 1): 15}
    form = browser.find_element(By.ID, "reset")
    Select(form.find_element(By.NAME, "topic")).select_by_visible_text("offset-topic")
    Select(form.find_element(By.NAME, "to")).select_by_visible_text("offset")
    form.find_element(By.NAME, "value").send_keys("5")
    form.find_element(By.TAG_NAME, "button").click()
    wait_for(browser, "apply-reset").find_element(By.TAG_NAME, "button").click()
    WebDriverWait(browser, 20).until(lambda d: "Reset 2 partition(s) to offset: 2 moved" in d.page_source)
    assert committed(shared_broker.bootstrap, "to-offset") == {("offset-topic", 0): 5, ("offset-topic", 1): 5}


def test_deleting_a_group_needs_its_name_typed_again(shared_broker, browser):
    committed_group(shared_broker.bootstrap, "deletable", "deletable-topic", {0: 1})
    browser.get(shared_broker.console_url + "groups/deletable")
    browser.find_element(By.CSS_SELECTOR, "#delete-group button").click()
    WebDriverWait(browser, 20).until(lambda d: "Not deleted: type the group's name" in d.page_source)
    assert committed(shared_broker.bootstrap, "deletable")
    form = browser.find_element(By.ID, "delete-group")
    form.find_element(By.NAME, "confirm").send_keys("deletable")
    form.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(browser, 20).until(lambda d: "Deleted group deletable" in d.page_source)
    with GroupAdmin(shared_broker.bootstrap) as admin:
        assert "deletable" not in [g["group_id"] for g in admin.list()]
