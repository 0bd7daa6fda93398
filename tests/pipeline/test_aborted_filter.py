"""The read_committed rule both readers share (``odradek.consumer.AbortedTransactions``, used by
the bundled Consumer and by the Spark connector's fetcher): headers only, no broker."""
from __future__ import annotations

from odradek.consumer import AbortedTransactions
from odradek.core.records import CONTROL_BIT, MAGIC, TRANSACTIONAL_BIT, BatchHeader

A, B = 1000, 2000  # producer ids


def batch(base: int, n: int, pid: int = -1, control: bool = False) -> BatchHeader:
    attrs = (TRANSACTIONAL_BIT if pid >= 0 else 0) | (CONTROL_BIT if control else 0)
    return BatchHeader(base, 100, 0, MAGIC, 0, attrs, n - 1, 0, 0, pid, 0 if pid >= 0 else -1, 0, n)


def kept(log: list, *answers: list) -> list:
    """Base offsets of the batches kept when ``log`` is read in answers, each answer
    ``(aborted_transactions, first batch index, end index)``."""
    f = AbortedTransactions()
    out = []
    for aborted, lo, hi in answers:
        f.add(aborted)
        out += [h.base_offset for h in log[lo:hi] if not f.skips(h)]
    return out


# 0 plain; 1-2 A aborted, interleaved with B committed at 2; A's abort marker 4; B's commit 5; A again 6
LOG = [batch(0, 1), batch(1, 1, A), batch(2, 1, B), batch(3, 1, A), batch(4, 1, A, control=True),
       batch(5, 1, B, control=True), batch(6, 1, A)]


def test_an_aborted_producer_is_skipped_from_its_first_offset_to_its_marker_and_others_kept():
    assert kept(LOG, ([{"producer_id": A, "first_offset": 1}], 0, len(LOG))) == [0, 2, 6]


def test_without_aborted_ranges_only_control_batches_are_dropped():
    assert kept(LOG, ([], 0, len(LOG))) == [0, 1, 2, 3, 6]


def test_a_read_that_starts_inside_an_aborted_transaction_still_skips_its_rest():
    """The broker names the aborted transactions overlapping the fetched range, also those that
    began before it (a task whose range starts mid-transaction)."""
    assert kept(LOG, ([{"producer_id": A, "first_offset": 1}], 3, len(LOG))) == [6]


def test_ranges_repeated_across_answers_are_counted_once_and_end_at_the_marker():
    aborted = [{"producer_id": A, "first_offset": 1}]
    assert kept(LOG, (aborted, 0, 3), (aborted, 3, 5), ([], 5, len(LOG))) == [0, 2, 6]
