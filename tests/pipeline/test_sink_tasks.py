"""One write task of the streaming sink, driven directly (no Spark: the task's identity is
given as Spark gives it, query id, micro-batch id and task number), against a real broker.

A task that fails part-way must leave nothing that a read_committed consumer sees and must
not record its micro-batch as done, so Spark's retry writes every row once; a task of a
micro-batch already written (a re-run) writes nothing."""
from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from odradek import Consumer, TopicPartition
from odradek.pipeline import options as opt
from odradek.pipeline.sink import WriteCommit, write_task
from tests.pipeline.support import create


def rows(lo: int, hi: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"value": [b"row-%d" % i for i in range(lo, hi)]})


def read_committed(bootstrap: str, topic: str) -> list[bytes]:
    with Consumer(bootstrap, isolation_level="read_committed", auto_offset_reset="earliest") as c:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        end = c.end_offsets([tp])[tp]
        out: list[bytes] = []
        while c.position(tp) < end:
            out += [r.value for r in c.poll(500)]
    return out


def test_a_task_that_fails_part_way_leaves_nothing_committed_and_its_retry_writes_every_row_once(mod_broker):
    topic = f"sink-{uuid.uuid4().hex[:8]}"
    create(mod_broker.bootstrap, topic)
    o = opt.WriteOptions(mod_broker.bootstrap, topic)
    query = uuid.uuid4().hex

    def failing():
        yield rows(0, 50)
        raise RuntimeError("the executor lost its disk")

    with pytest.raises(RuntimeError):
        write_task(o, WriteCommit(0, 0, 7, query), failing())
    assert read_committed(mod_broker.bootstrap, topic) == []

    retry = write_task(o, WriteCommit(0, 1, 7, query), iter([rows(0, 50), rows(50, 80)]))
    assert retry.rows == 80 and not retry.skipped
    rerun = write_task(o, WriteCommit(0, 2, 7, query), iter([rows(0, 50), rows(50, 80)]))
    assert rerun.skipped and rerun.rows == 0
    assert read_committed(mod_broker.bootstrap, topic) == [b"row-%d" % i for i in range(80)]
