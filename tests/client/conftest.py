"""Fixtures for client tests: the scripted broker (tests/client/scripted_broker.py), stopped
after each test. Real brokers come from tests/conftest.py (``broker``, ``start_broker``)."""
from __future__ import annotations

import pytest

from tests.client.scripted_broker import ScriptedBroker


@pytest.fixture
def scripted():
    brokers = []

    def start(topics: dict[str, int]) -> ScriptedBroker:
        b = ScriptedBroker(topics)
        brokers.append(b)
        return b

    yield start
    for b in brokers:
        b.close()
