"""Fixtures for the Spark connector tests: one broker per module, one local SparkSession for them all.

Spark takes about ten seconds to start, so the package's modules share one session (``spark``,
package-scoped, stopped after the last test of tests/pipeline) and each module one broker (``mod_broker``, a
``RestartableBroker`` on a fixed 127.0.0.1 port so a test can stop and restart it and the
clients find it again). Tests give their topics unique names (``topic_name``). Everything
started here is stopped in teardown, even when a test fails. The whole directory is skipped
when pyspark, pyarrow or java is missing.
"""
from __future__ import annotations

import itertools
import os
import shutil
import socket

import pytest

from tests.conftest import BrokerProcess

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("java is needed for the Spark tests", allow_module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RestartableBroker(BrokerProcess):
    """A broker on a fixed port and data directory, so a restarted one is found where the
    running queries' executors look for it."""

    def __init__(self, data_dir: str, **settings):
        self.fixed_port = free_port()
        super().__init__(data_dir, {"listeners": f"PLAINTEXT://127.0.0.1:{self.fixed_port}", **settings})

    @property
    def bootstrap(self) -> str:  # also while restarting
        return f"127.0.0.1:{self.fixed_port}"

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="module")
def mod_broker(tmp_path_factory):
    b = RestartableBroker(str(tmp_path_factory.mktemp("broker")))
    try:
        yield b.start()
    finally:
        b.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


@pytest.fixture(scope="package")
def spark():
    from odradek.pipeline.session import session
    s = session("local[2]", app="odradek-tests", conf={"spark.sql.shuffle.partitions": "2"})
    try:
        yield s
    finally:
        s.stop()


_names = itertools.count()


@pytest.fixture
def topic_name(request):
    """A topic name unique to the test (the module's broker is shared)."""
    base = request.node.name.replace("[", "-").replace("]", "").replace("test_", "")[:60]
    return f"{base}-{next(_names)}"
