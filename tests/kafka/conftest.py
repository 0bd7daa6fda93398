"""Fixtures for the Kafka-compatibility tests: one real broker per module (real Kafka
clients judge it; state is kept apart by topic names), stopped in teardown."""
from __future__ import annotations

import shutil
import uuid

import pytest

from odradek.local import LocalBroker


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory):
    broker = LocalBroker(str(tmp_path_factory.mktemp("kafka-broker")),
                         {"shutdown.timeout.ms": 10000, "message.max.bytes": 1048576}, start_timeout=240).start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def bootstrap(kafka_broker) -> str:
    return kafka_broker.bootstrap


@pytest.fixture
def topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def needs_kcat():
    return pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is installed by bin/test (bin/_env.sh)")
