from __future__ import annotations

import pytest

from odradek.core.config import LogConfig
from odradek.log.log import Log
from tests.log.support import Clock, FaultyFiles


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def files():
    return FaultyFiles()


@pytest.fixture
def small_config():
    """Tiny segments and indexes so a few appends roll, index and fill things."""
    return LogConfig(segment_bytes=2048, index_interval_bytes=256, segment_index_bytes=240,
                     file_delete_delay_ms=1000)


@pytest.fixture
def open_log(tmp_path, clock, files, small_config):
    """``open_log(**overrides)`` opens (or reopens) the log at tmp_path/topic-0."""
    opened = []

    def make(config=None, **kw):
        lg = Log(str(tmp_path / "topic-0"), config or small_config, now_ms=clock, files=files, **kw)
        opened.append(lg)
        return lg

    yield make
    for lg in opened:
        lg.abandon()
