"""The admin listener's HTTP server (issue 29: a maintained WSGI server, waitress, in place of
wsgiref): slow clients hold no worker, oversized requests are refused before the console
reads them, and the server names itself without a version."""
from __future__ import annotations

import socket
import time
import urllib.request
from urllib.parse import urlsplit

from tests.observability.conftest import http_get


def test_slow_clients_do_not_hold_back_a_scrape(shared_broker):
    url = urlsplit(shared_broker.console_url)
    slow = []
    try:
        for _ in range(40):  # more than the server's workers, each stuck in the middle of its headers
            s = socket.create_connection((url.hostname, url.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            slow.append(s)
        began = time.monotonic()
        status, _ = http_get(shared_broker.console_url + "health/live", timeout=20)
        assert status == 200 and time.monotonic() - began < 5
    finally:
        for s in slow:
            s.close()


def test_a_request_body_over_a_mebibyte_is_refused_unread(shared_broker):
    req = urllib.request.Request(shared_broker.console_url + "topics", data=b"name=" + b"x" * (2 * 2**20),
                                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            status = r.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (ConnectionResetError, BrokenPipeError, urllib.error.URLError):
        status = 413  # refused before the whole body was sent: the server closed the connection
    assert status == 413


def test_the_server_header_names_no_python_server_or_version(shared_broker):
    with urllib.request.urlopen(shared_broker.console_url + "health/live", timeout=10) as r:
        server = r.headers.get("Server")
    assert server == "odradek"
