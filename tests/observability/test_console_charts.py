"""The charts (issue 29), in headless chromium: the metrics actor keeps a history (a sample
every 10 s, an hour of them), so a page opened now draws the past, on axes with a local time
scale and labelled values."""
from __future__ import annotations

import json
import re
import time

from selenium.webdriver.common.by import By
from selenium.webdriver.support.wait import WebDriverWait

from odradek import Admin, Producer
from tests.observability.browser import headless_chromium
from tests.observability.conftest import http_get


def test_a_chart_opened_now_shows_the_history_on_axes(shared_broker):
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("charted")
    deadline = time.monotonic() + 60
    with Producer(shared_broker.bootstrap) as producer:
        # records in while the sampler takes at least three samples, the last after some of
        # them (on the package's broker, up since its first module, the samples may be there)
        while True:
            for _ in range(20):
                producer.send("charted", value=b"x" * 500).result(30)
            history = json.loads(http_get(shared_broker.console_url + "api/history")[1])
            samples = history["samples"]
            if len(samples) >= 3 and samples[-1]["records_in"] > samples[0]["records_in"] or \
                    time.monotonic() > deadline:
                break
            time.sleep(1)
    assert history["interval"] == 10 and len(samples) >= 3, history
    assert samples[-1]["records_in"] > samples[0]["records_in"]
    assert all(b["time"] - a["time"] > 5 for a, b in zip(samples, samples[1:]))  # every 10 s, not per request
    opened = time.time()
    with headless_chromium() as browser:
        browser.get(shared_broker.console_url + "charts")
        records = WebDriverWait(browser, 20).until(
            lambda d: d.find_element(By.ID, "records") if d.find_element(By.ID, "records").get_attribute("data-points")
            else None)
        # the history's rates are drawn, from before the page was opened
        assert int(records.get_attribute("data-points")) >= 2 * (len(samples) - 1)
        assert float(records.get_attribute("data-since")) <= samples[0]["time"] < opened
        x_ticks = records.get_attribute("data-x-ticks").split()
        y_ticks = records.get_attribute("data-y-ticks").split()
        # drawn by the vendored uPlot, loaded from this broker (no other script, nothing remote)
        assert records.find_elements(By.CSS_SELECTOR, ".uplot canvas")
        assert browser.execute_script("return typeof uPlot") == "function"
        scripts = [e.get_attribute("src") for e in browser.find_elements(By.TAG_NAME, "script")]
        assert scripts == [shared_broker.console_url + "static/vendor/uPlot.iife.min.js",
                           shared_broker.console_url + "static/charts.js"]
        assert browser.execute_script(
            "return performance.getEntriesByType('resource').every(r => r.name.startsWith(location.origin))")
    # a young history spans the least window, 5 minutes: a tick every minute
    assert len(x_ticks) >= 4 and all(re.fullmatch(r"\d\d:\d\d", t) for t in x_ticks), x_ticks
    assert y_ticks[0] == "0" and len(y_ticks) >= 2 and "e" not in "".join(y_ticks)  # no e-notation


def test_the_vendored_chart_library_is_served_with_its_licence(shared_broker):
    status, script = http_get(shared_broker.console_url + "static/vendor/uPlot.iife.min.js")
    assert status == 200 and script.startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    status, readme = http_get(shared_broker.console_url + "static/vendor/README.md")
    assert status == 200 and "1.6.32" in readme and "MIT" in readme
    status, licence = http_get(shared_broker.console_url + "static/vendor/uPlot.LICENSE")
    assert status == 200 and licence.startswith("The MIT License (MIT)")
