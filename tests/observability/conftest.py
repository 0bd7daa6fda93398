"""One broker shared by the console's modules (its start is the slow part on a loaded machine):
``shared_broker`` is started once for the package and kept until its last module ends (each
test uses topics and groups of its own, named apart across the modules, so they do not see
each other's numbers; none stops, kills or reconfigures it). A module whose checks count
what the whole broker saw (metrics: connections, client ids under a cap) overrides
``shared_broker`` with ``module_broker``, a broker of its own."""
from __future__ import annotations

import urllib.request

import pytest

from tests.conftest import running_broker


@pytest.fixture(scope="package")
def shared_broker(tmp_path_factory):
    yield from running_broker(tmp_path_factory, "obs-broker")


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory):
    yield from running_broker(tmp_path_factory, "obs-module-broker")


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """(status, body) of a GET; error statuses are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
