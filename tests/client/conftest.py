"""Fixtures for client tests: the scripted broker and scripted clusters
(tests/client/scripted_broker.py), stopped after each test. Real brokers come from tests/conftest.py (``broker``, ``start_broker``)."""
from __future__ import annotations

import pytest

from tests.client.scripted_broker import ScriptedBroker, ScriptedCluster


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


@pytest.fixture
def scripted_cluster():
    """``start(topics, brokers=3)`` -> a ``ScriptedCluster`` of that many scripted brokers
    (node ids 0..n-1; broker 0 leads every partition, controls and coordinates at first)."""
    clusters = []

    def start(topics: dict[str, int], brokers: int = 3) -> ScriptedCluster:
        c = ScriptedCluster(topics)
        c.start(brokers)
        clusters.append(c)
        return c

    yield start
    for c in clusters:
        c.close()
