"""Fixtures of the network edge's tests, on top of the shared ``broker``/``start_broker``."""
from __future__ import annotations

import pytest

from tests.conftest import BrokerProcess


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    """One broker for a module's read-only tests (each start costs a few seconds)."""
    broker = BrokerProcess(str(tmp_path_factory.mktemp("shared-broker")), {})
    try:
        yield broker.start()
    finally:
        broker.stop()
