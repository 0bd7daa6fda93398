"""Shared fixtures: real brokers on 127.0.0.1 with ephemeral ports and temporary directories.

``broker`` starts one ``odradek serve`` per test; ``start_broker(**settings)`` starts as many
as a test needs, each with its own settings (``num_io_threads=4`` becomes
``--set num.io.threads=4``). Every broker is stopped in teardown, even when the test fails:
SIGTERM, then SIGKILL of its whole process group.
"""
from __future__ import annotations

import os

import pytest

from odradek.local import LocalBroker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BrokerProcess(LocalBroker):
    """``odradek.local.LocalBroker`` with the tests' defaults: a short shutdown timeout."""

    def __init__(self, data_dir: str, settings: dict):
        super().__init__(data_dir, {"shutdown.timeout.ms": 10000, **settings})


@pytest.fixture
def start_broker(tmp_path_factory):
    brokers: list[BrokerProcess] = []

    def start(data_dir: str | None = None, **settings) -> BrokerProcess:
        data_dir = data_dir or str(tmp_path_factory.mktemp("broker"))
        settings = {k.replace("_", "."): v for k, v in settings.items()}
        b = BrokerProcess(data_dir, settings)
        brokers.append(b)
        return b.start()

    yield start
    for b in brokers:
        b.stop()


@pytest.fixture
def broker(start_broker) -> BrokerProcess:
    return start_broker()
