"""The console answers only to its own host names (issue 27 item 6): a DNS-rebinding page,
whose host name resolves to the console's 127.0.0.1, can neither read nor drive it."""
from __future__ import annotations

import contextlib
import urllib.request
from urllib.parse import urlsplit

import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.support.wait import WebDriverWait

from odradek import Admin
from odradek.observe.hostcheck import HostCheck, known_names, split_host
from tests.observability.browser import headless_chromium

REBIND = "rebind.attacker.test"  # resolved to 127.0.0.1 by the browser, as a rebinding DNS server would


def request(url: str, host: str | None = None, data: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data)
    if host is not None:
        req.add_unredirected_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_rebinding_page_in_a_browser_can_neither_create_nor_delete_a_topic(shared_broker):
    port = urlsplit(shared_broker.console_url).port
    with Admin(shared_broker.bootstrap) as admin:
        admin.create_topic("rebind-victim")
    post = """const [path, body, done] = arguments;
        fetch(path, {method: 'POST', body: new URLSearchParams(body)})
            .then(r => r.text().then(t => done([r.status, t])), e => done([0, String(e)]));"""
    with headless_chromium(f"--host-resolver-rules=MAP {REBIND} 127.0.0.1") as browser:
        browser.set_script_timeout(30)
        browser.get(f"http://{REBIND}:{port}/topics")  # the attacker's page, now served from 127.0.0.1
        # The text can be shown after get() returns (a CI run under load read an empty <pre>).
        with contextlib.suppress(TimeoutException):  # then the assertion below shows the page
            WebDriverWait(browser, 20).until(lambda b: "421" in b.page_source)
        page = browser.page_source
        created = browser.execute_async_script(post, "/topics", {"name": "rebound", "partitions": "1"})
        deleted = browser.execute_async_script(post, "/topics/rebind-victim/delete", {"confirm": "rebind-victim"})
    with Admin(shared_broker.bootstrap) as admin:
        names = admin.list_topics()
    assert "rebound" not in names and "rebind-victim" in names
    assert created[0] == 421 and deleted[0] == 421, (created, deleted)
    assert "does not answer to the host name" in created[1] and "421" in page and REBIND in page, page


@pytest.mark.parametrize("path", ["metrics", "health/live", "topics", "static/console.css", "no-such-page"])
def test_every_path_refuses_a_foreign_host_name(shared_broker, path):
    status, body = request(shared_broker.console_url + path, host=f"{REBIND}:1234")
    assert status == 421 and "DNS-rebinding" in body


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "console.localhost", "[::1]"])
def test_its_own_names_are_served(shared_broker, host):
    port = urlsplit(shared_broker.console_url).port
    status, _ = request(shared_broker.console_url + "health/live", host=f"{host}:{port}")
    assert status == 200


def test_host_names_accepted_are_the_configured_ones_and_loopback():
    check = HostCheck(None, known_names({"listeners": "PLAINTEXT://kafka1.internal:9092",
                                         "advertised.listeners": "PLAINTEXT://kafka.example.com:9092"},
                                        "console.example.com"))
    for good in ("console.example.com", "kafka1.internal", "kafka.example.com", "10.1.2.3", "::1", "localhost"):
        assert check.allowed(good), good
    for bad in ("evil.example", "console.example.com.evil.example", "localhost.evil.example", ""):
        assert not check.allowed(bad), bad
    assert split_host("Console.Example.COM:10092") == "console.example.com"
    assert split_host("[::1]:10092") == "::1" and split_host("::1") == "::1"
    import socket
    assert socket.gethostname().lower() in known_names({}, "0.0.0.0")  # bound everywhere: this machine's name
    assert socket.gethostname().lower() not in known_names({}, "127.0.0.1") or socket.gethostname() == "localhost"
