"""One broker shared by a module's tests (its start is the slow part on a loaded machine);
each test uses topics and groups of its own, so they do not see each other's numbers."""
from __future__ import annotations

import urllib.request

import pytest

from tests.conftest import BrokerProcess


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    b = BrokerProcess(str(tmp_path_factory.mktemp("obs-broker")), {})
    b.start()
    yield b
    b.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET; error statuses are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
