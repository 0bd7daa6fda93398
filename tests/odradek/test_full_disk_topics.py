"""Issue 27, item 8: topics on a full disk (single broker; a real 16 MiB tmpfs, as
tests/odradek/test_storage_defects.py). A creation whose metadata still fits but whose
partitions do not is refused at once, and nothing is left of it (before: undoing it needed
the metadata file rewritten, which the full disk refused, so the controller never answered;
the client waited 30 s, its retry was told TOPIC_ALREADY_EXISTS, and the topic stayed with no
working log until a restart). A topic can be deleted while the disk is full (before: the
metadata could not be rewritten, KAFKA_STORAGE_ERROR, and a partition's close wrote a
checkpoint first)."""
from __future__ import annotations

import os
import time

import pytest

from odradek import Admin, OdradekError
from odradek.core.protocol import ErrorCode
from tests.odradek.test_storage_defects import fill, produce


def test_a_topic_whose_partitions_do_not_fit_is_refused_at_once_and_leaves_nothing(start_broker, small_disk):
    broker = start_broker(os.path.join(small_disk, "data"))
    filler = fill(small_disk)
    os.truncate(filler, os.path.getsize(filler) - 8192)  # room for the metadata file, not for partitions
    with Admin(broker.bootstrap, request_timeout_ms=60000) as admin:
        started = time.monotonic()
        with pytest.raises(OdradekError) as err:
            admin.create_topic("no-room", partitions=2)
        assert time.monotonic() - started < 10, "the creation was not answered promptly"
        assert err.value.code == ErrorCode.KAFKA_STORAGE_ERROR and "not created" in err.value.message, err.value
        assert "no-room" not in admin.list_topics()
        os.unlink(filler)
        admin.create_topic("no-room", partitions=2)
    assert produce(broker.bootstrap, "no-room", [b"x"])[0].offset == 0


def test_a_topic_can_be_deleted_while_the_disk_is_full(start_broker, small_disk):
    data = os.path.join(small_disk, "data")
    broker = start_broker(data)
    with Admin(broker.bootstrap) as admin:
        admin.create_topic("doomed", partitions=2)
    produce(broker.bootstrap, "doomed", [b"x" * 1000] * 10)
    filler = fill(small_disk)
    with Admin(broker.bootstrap) as admin:
        admin.delete_topic("doomed")
        assert "doomed" not in admin.list_topics()
    assert not [d for d in os.listdir(data) if d.startswith("doomed")], os.listdir(data)
    os.unlink(filler)
    broker.stop()
    broker = start_broker(data)
    with Admin(broker.bootstrap) as admin:
        assert "doomed" not in admin.list_topics()
