"""The console's errors (issue 29), in headless chromium and by status code: a topic or group
that does not exist is a 404 page saying so (not a 500 with a traceback in the broker's log);
bad numbers are a 400; the message after a config change is shown whole and unquoted."""
from __future__ import annotations

import html

import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from odradek import Admin
from tests.observability.browser import headless_chromium
from tests.observability.conftest import http_get


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as driver:
        yield driver


@pytest.mark.parametrize("path, says", [
    ("topics/no-such-topic", "topic 'no-such-topic' does not exist"),
    ("topics/no-such-topic/messages", "topic 'no-such-topic' does not exist"),
    ("groups/no-such-group", "group 'no-such-group' does not exist"),
])
def test_a_missing_topic_or_group_is_a_404_page_that_says_so(shared_broker, browser, path, says):
    status, body = http_get(shared_broker.console_url + path)
    assert status == 404, body[-500:]
    browser.get(shared_broker.console_url + path)
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "404" in page and says in page and "Traceback" not in page
    assert "Traceback" not in "".join(shared_broker.stdout_lines[-200:])


def test_a_partition_that_is_not_a_number_is_a_400(shared_broker):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("numbered")
    status, body = http_get(shared_broker.console_url + "topics/numbered/messages?partition=first")
    assert status == 400 and "partition must be a whole number, not 'first'" in html.unescape(body)


def set_config(browser, key: str, value: str) -> str:
    form = browser.find_element(By.CSS_SELECTOR, "form[action$='/configs']")
    form.find_element(By.NAME, "key").send_keys(key)
    form.find_element(By.NAME, "value").send_keys(value)
    form.find_element(By.TAG_NAME, "button").click()
    WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "p.message"))
    return browser.find_element(By.CSS_SELECTOR, "p.message").text


def test_the_message_after_a_config_change_is_whole_and_not_html_quoted(shared_broker, browser):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("configured")
    browser.get(shared_broker.console_url + "topics/configured")
    assert set_config(browser, "retention.ms", "3600000") == "Set retention.ms=3600000"
    with Admin(shared_broker.bootstrap) as admin:
        assert admin.describe_topic("configured").configs["retention.ms"] == "3600000"
    # the page marks the value set on the topic apart from the defaults
    overridden = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
                  for tr in browser.find_elements(By.CSS_SELECTOR, "#configs tr.overridden")]
    assert overridden == [["retention.ms", "3600000", "set on this topic"]]
    browser.get(shared_broker.console_url + "topics/configured")
    shown = set_config(browser, "cleanup.policy", "delete&compact<b>")
    # the broker's own words, after "Could not set cleanup.policy: ", to the end, with its quotes
    assert shown.startswith("Could not set cleanup.policy: [") and "&#039;" not in shown and "&amp;" not in shown
    assert "delete&compact<b>" in shown, shown
