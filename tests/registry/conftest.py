"""One broker (with its schema registry) shared by the registry's modules that use
``shared_broker``: started once for the package, kept until its last module ends. Their tests
keep apart by subject and topic names of their own (uuid-tagged) and none stops, restarts or
sets the global compatibility level; a test that needs a registry of its own (a restart, the
whole list of subjects, a cluster) starts one (``broker``, ``make_cluster``)."""
from __future__ import annotations

import pytest

from tests.conftest import running_broker


@pytest.fixture(scope="package")
def shared_broker(tmp_path_factory):
    yield from running_broker(tmp_path_factory, "registry-broker")
