"""Fixtures for the Kafka-compatibility tests: one real broker for the whole tests/kafka
package (real Kafka clients judge it; state is kept apart by topic and group names; modules
that need other settings start their own), killed in teardown."""
from __future__ import annotations

import shutil
import uuid

import pytest

from odradek.local import LocalBroker


@pytest.fixture(scope="package")
def kafka_broker(tmp_path_factory):
    broker = LocalBroker(str(tmp_path_factory.mktemp("kafka-broker")),
                         {"shutdown.timeout.ms": 10000, "message.max.bytes": 1048576}, start_timeout=240).start()
    try:
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away


@pytest.fixture
def bootstrap(kafka_broker) -> str:
    return kafka_broker.bootstrap


@pytest.fixture
def topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def kcat() -> str:
    """kcat's path; a test that needs it fails, saying how to get it, rather than skipping."""
    path = shutil.which("kcat")
    if path is None:
        pytest.fail("kcat is not installed: bin/test installs it (ensure_kcat in bin/_env.sh), "
                    "or run `apt-get install kcat`", pytrace=False)
    return path
