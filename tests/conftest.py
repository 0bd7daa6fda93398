"""Shared fixtures: real brokers on 127.0.0.1 with ephemeral ports and temporary directories.

``broker`` starts one ``odradek serve`` per test; ``start_broker(**settings)`` starts as many
as a test needs, each with its own settings (``num_io_threads=4`` becomes
``--set num.io.threads=4``). ``shared_broker`` is one broker shared by a module's tests that
keep apart by topic (and group) names and never stop, kill or reconfigure it. Every broker
is killed in teardown, even when the test fails (SIGKILL of the supervisor and of every
actor, then nothing is left): its data is thrown away, and a graceful stop takes seconds
that no test looks at (a test of the graceful path calls ``terminate()`` itself).
"""
from __future__ import annotations

import collections
import os
import subprocess

import pytest

# Fixtures that tests of several packages share, each defined once: ZooKeeper and clusters
# (``zookeeper``, ``make_cluster``, ``shared_cluster``), certificates and a secure broker
# (``certs``, ``secure_broker``). A test anywhere uses them by name, with no import.
pytest_plugins = ["tests.cluster.fixtures", "tests.security.fixtures"]

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
        b.discard()


@pytest.fixture
def broker(start_broker) -> BrokerProcess:
    return start_broker()


def running_broker(tmp_path_factory, name: str):
    """A generator for a fixture of any scope: one broker with the tests' defaults, started,
    yielded and killed (``yield from running_broker(tmp_path_factory, "my-broker")``)."""
    b = BrokerProcess(str(tmp_path_factory.mktemp(name)), {})
    b.start()
    try:
        yield b
    finally:
        b.discard()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory) -> BrokerProcess:
    yield from running_broker(tmp_path_factory, "shared-broker")


@pytest.fixture(scope="module")
def _module_cluster():
    """The slot of a module's shared cluster (``shared_cluster`` in tests/cluster/fixtures.py,
    which fills it; ``make_cluster`` empties it). Here, so every module that imports the
    cluster fixtures finds it; the cluster is killed at the module's end."""
    held: dict = {"cluster": None}
    yield held
    if held["cluster"] is not None:
        held["cluster"].stop(graceful=False)


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MiB tmpfs (needs mount rights: root in a container that allows it)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    yield str(mnt)
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


# ---- broker logs in a failure's report --------------------------------------------------
LOG_TAIL_LINES = 60
LOG_FILES_MAX = 4


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report carries the tail of each broker's stderr written during it (a
    CI run keeps nothing else: a flaky cluster test was once left with no log to read)."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "setup":
        item._odradek_began = call.start  # a broker started in setup logs before the call
    if not report.failed or call.when == "teardown":
        return
    factory = getattr(item.config, "_tmp_path_factory", None)
    if factory is None:
        return
    began = getattr(item, "_odradek_began", call.start) - 1
    try:
        paths = [p for p in factory.getbasetemp().rglob("broker.stderr") if p.stat().st_mtime >= began]
    except OSError:
        return
    for path in sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True)[:LOG_FILES_MAX]:
        with open(path, errors="replace") as f:
            tail = "".join(collections.deque(f, LOG_TAIL_LINES))
        report.sections.append((f"broker log {path.parent.name} (last {LOG_TAIL_LINES} lines)", tail))
