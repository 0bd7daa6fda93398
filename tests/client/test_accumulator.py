"""The producer's record accumulator (odradek/accumulator.py) on its own: batches filled per
partition, closed at batch_size, at linger or on flush, drained in order, back-pressure on
buffer_memory, and the sender's wake-up. The metadata is a real ``Cluster`` that has not asked
any broker yet (so a topic's partitions are whatever count the caller names); time is passed
in explicitly, so nothing here depends on the machine's speed."""
from __future__ import annotations

import pytest

from odradek import errors
from odradek.accumulator import RecordAccumulator
from odradek.cluster import Cluster
from odradek.core import records as fmt
from odradek.producer import encode_rows


def accumulator(**kw) -> RecordAccumulator:
    settings = dict(linger=3600.0, batch_size=1 << 20, buffer_memory=1 << 30, max_block=60.0, delivery_timeout=120.0)
    settings.update(kw)
    acc = RecordAccumulator(Cluster("127.0.0.1:1"), lambda rows, keys, base, top, plain: encode_rows(rows, base, top, None, keys, plain),
                            **settings)
    return acc


@pytest.fixture
def acc():
    a = accumulator(batch_size=100)
    yield a
    a.release()


def test_a_record_needs_the_partition_count_to_open_a_batch_and_then_joins_it(acc):
    assert acc.append("t", 0, b"x", None, (), None, 10) is None  # the fast path: no open batch
    first = acc.append("t", 0, b"x", None, (), None, 10, count=1)
    second = acc.append("t", 0, b"y", None, (), None, 10)
    assert second._batch is first._batch and (first._index, second._index) == (0, 1)


def test_a_batch_closes_at_batch_size_and_is_drained_encoded_in_order(acc):
    handles = [acc.append("t", 0, b"v%d" % i, None, (), None, 40, count=1) for i in range(5)]
    earliest, _, ready = acc.drain(0.0, force=False)
    assert [b.count for b in ready] == [3]  # 120 bytes >= 100: closed by the third record
    assert [r.value for r in fmt.decode_batch(ready[0].data)] == [b"v0", b"v1", b"v2"]
    assert earliest is not None  # the open one (v3, v4) lingers
    _, _, ready = acc.drain(0.0, force=True)
    assert [b.count for b in ready] == [2] and handles[4]._batch is ready[0]
    assert acc.buffered == 200


def test_a_batch_closes_once_its_linger_has_passed_and_not_before():
    acc = accumulator(linger=5.0)
    try:
        h = acc.append("t", 1, b"late", None, (), None, 10, count=2)
        created = h._batch.created
        earliest, _, ready = acc.drain(created + 4.9, force=False)
        assert ready == [] and earliest == pytest.approx(created + 5.0)
        earliest, _, ready = acc.drain(created + 5.0, force=False)
        assert [b.partition for b in ready] == [1] and earliest is None
    finally:
        acc.release()


def test_keyless_records_fill_a_sticky_partition_that_changes_with_each_batch(acc):
    partitions = []
    for _ in range(20):
        for _ in range(3):
            acc.append("t", None, b"v" * 30, None, (), None, 40, count=4)
        _, _, ready = acc.drain(0.0, force=False)
        assert [b.count for b in ready] == [3]
        partitions.append(ready[0].partition)
    assert all(p in range(4) for p in partitions)
    assert all(a != b for a, b in zip(partitions, partitions[1:]))


def test_a_keyed_value_is_kept_bare_beside_its_key_and_a_timestamp_or_headers_make_a_full_row(acc):
    first = acc.append("t", 0, b"plain", None, (), None, 10, count=1)
    acc.append("t", 0, b"keyed", b"k", (), None, 10)
    acc.append("t", 0, b"stamped", None, (("h", b"1"),), 4102444800000, 10)
    acc.append("t", 0, None, b"gone", (), None, 10)  # a tombstone: a full row
    acc.append("t", 0, b"again", b"k2", (), None, 10)
    rows, keys = first._batch.rows, first._batch.keys
    assert [type(r) for r in rows] == [bytes, bytes, tuple, tuple, bytes] and keys == [None, b"k", None, None, b"k2"]
    _, _, (batch,) = acc.drain(0.0, force=True)
    records = list(fmt.decode_batch(batch.data))
    assert [(r.key, r.value) for r in records] == [(None, b"plain"), (b"k", b"keyed"), (None, b"stamped"),
                                                   (b"gone", None), (b"k2", b"again")]
    assert records[2].timestamp == 4102444800000 == batch.max_timestamp()
    assert [r.offset for r in records] == [0, 1, 2, 3, 4]


def test_a_full_buffer_makes_a_new_batch_wait_then_fail_after_max_block():
    acc = accumulator(buffer_memory=50, max_block=0.05)
    try:
        first = acc.append("t", 0, b"x", None, (), None, 60, count=2)
        acc.flush_futures()  # closed: 60 bytes buffered, more than buffer_memory
        with pytest.raises(errors.RequestTimedOutError, match="buffer_memory"):
            acc.append("t", 1, b"y", None, (), None, 10, count=2)
        acc.batch_done(first._batch)  # the sender resolved it: its bytes are free again
        assert acc.buffered == 0
        assert acc.append("t", 1, b"y", None, (), None, 10, count=2) is not None
    finally:
        acc.release()


def test_the_sender_does_not_sleep_when_a_batch_changed_since_it_last_drained(acc):
    _, seen, _ = acc.drain(0.0, force=False)
    acc.append("t", 0, b"x", None, (), None, 10, count=1)  # opens a batch: a change
    acc.sleep([], 0.0, 600.0, seen)  # would sleep ten minutes if the change were missed
    _, seen, _ = acc.drain(0.0, force=False)
    acc.close()  # closing is a change too: the sender goes round once more and sees it
    acc.sleep([], 0.0, 600.0, seen)
    assert acc.closed


def test_the_sender_encodes_lingering_batches_without_the_lock_and_keeps_each_partitions_order():
    """Encoding under the lock kept callers waiting while the sender closed lingering batches
    (keyed records over many partitions close most batches by linger). A batch a caller fills
    meanwhile still comes after the lingering one of its partition."""
    held = []
    acc = RecordAccumulator(Cluster("127.0.0.1:1"), lambda rows, keys, base, top, plain: (held.append(acc.lock.locked()),
                                                                                     encode_rows(rows, base, top, None, keys, plain))[1],
                            linger=5.0, batch_size=100, buffer_memory=1 << 30, max_block=60.0, delivery_timeout=120.0)
    try:
        first = acc.append("t", 0, b"a", None, (), None, 10, count=1)
        acc.append("t", 1, b"b", None, (), None, 10, count=2)
        _, _, ready = acc.drain(first._batch.created + 60.0, force=False)  # both linger out: the sender's
        assert held == [False, False] and [b.partition for b in ready] == [0, 1]
        assert [r.value for r in fmt.decode_batch(ready[0].data)] == [b"a"]
        acc.append("t", 0, b"c", None, (), None, 60, count=1)
        acc.append("t", 0, b"d", None, (), None, 60)  # filled by the caller: encoded by it, lock held
        assert held[-1] is True
        _, _, ready = acc.drain(first._batch.created + 5.0, force=False)
        assert [[r.value for r in fmt.decode_batch(b.data)] for b in ready] == [[b"c", b"d"]]
    finally:
        acc.release()


def test_a_partitions_slot_follows_its_open_batch_for_keyed_records(acc):
    """``append_keyed`` (send's keyed fast path) joins the partition's open batch through its
    slot, and declines once that batch closed, until a new one opens."""
    first = acc.append("t", 1, b"a", b"k", (), None, 10, count=2)
    slot = acc.slot("t", 1)
    assert slot is acc.slot("t", 1) and slot.batch is first._batch
    second = acc.append_keyed(slot, b"b", b"k2", 10)
    assert second._batch is first._batch and second._index == 1
    assert acc.append_keyed(acc.slot("t", 0), b"c", b"k3", 10) is None  # partition 0 has no open batch
    acc.append_keyed(slot, b"big", b"k", 100)  # 120 bytes >= 100: closes the batch
    assert slot.batch is None and acc.append_keyed(slot, b"d", b"k", 10) is None
    third = acc.append("t", 1, b"e", b"k", (), None, 10, count=2)
    assert slot.batch is third._batch is not first._batch
    _, _, ready = acc.drain(0.0, force=True)
    assert [[(r.key, r.value) for r in fmt.decode_batch(b.data)] for b in ready] == \
        [[(b"k", b"a"), (b"k2", b"b"), (b"k", b"big")], [(b"k", b"e")]]


@pytest.mark.parametrize("order", [("keyless", "keyed"), ("keyed", "keyless"), ("keyed", "row"), ("row", "keyed"),
                                   ("keyed", "slot"), ("keyless", "slot"), ("keyed", "keyed")])
def test_a_batch_mixing_keyed_keyless_values_and_full_rows_encodes_each_record(order):
    """A batch of values with bytes keys only is encoded without a look at its rows
    (``Batch.plain``, pack_rows' scans skipped); a keyless value, a full row or a keyed value
    after keyless ones makes the batch one that pack_rows checks. Each record must decode as sent."""
    acc = accumulator()
    try:
        sent = []
        slot = acc.slot("t", 0)
        for i in range(4):
            for kind in order:
                value, key = b"v%d-%s" % (i, kind.encode()), b"k%d" % i
                if kind == "keyless":
                    h, key = acc.append("t", 0, value, None, (), None, 10, count=1), None
                elif kind == "keyed":
                    h = acc.append("t", 0, value, key, (), None, 10, count=1)
                elif kind == "slot":
                    h = acc.append_keyed(slot, value, key, 10) or acc.append("t", 0, value, key, (), None, 10, count=1)
                else:
                    h = acc.append("t", 0, value, key, (("h", b"1"),), None, 10, count=1)
                sent.append((h._index, key, value))
        expect_plain = set(order) in ({"keyed"}, {"keyed", "slot"})
        assert h._batch.plain is expect_plain
        _, _, ready = acc.drain(0.0, force=True)
        assert [(r.offset, r.key, r.value) for r in fmt.decode_batch(ready[0].data)] == sent
    finally:
        acc.release()


def test_flush_collects_futures_while_the_sender_resolves_batches_without_the_lock():
    """``batch_done`` (the sender thread) discards from the unresolved batches without the lock;
    ``flush`` must not iterate that set while it shrinks (CI caught "Set changed size during
    iteration" under retries). Thread switches are forced every microsecond so the overlap that
    a busy machine produces by chance happens on every run."""
    import sys
    import threading

    acc = accumulator(batch_size=1)
    old = sys.getswitchinterval()
    try:
        for round_ in range(20):
            for p in range(500):
                acc.append("t", p, b"x", None, (), None, 1, count=500)
            _, _, ready = acc.drain(0.0, force=True)
            assert len(ready) == 500
            go = threading.Event()

            def resolve():
                go.wait()
                for b in ready:
                    acc.batch_done(b)

            sender = threading.Thread(target=resolve)
            sender.start()
            sys.setswitchinterval(1e-6)
            go.set()
            try:
                while sender.is_alive():
                    acc.flush_futures()
            finally:
                sys.setswitchinterval(old)
                sender.join()
            assert acc.flush_futures() == []
    finally:
        sys.setswitchinterval(old)
        acc.release()
