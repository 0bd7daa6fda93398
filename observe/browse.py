"""The console's message browser: one page of a topic's records, across its partitions,
newest or oldest first, with a cursor for the next page.

Runs on the metrics actor's HTTP threads (``observe.console`` calls ``browse``) with a
``Consumer`` of its own broker, assigned by hand (no group, nothing committed). Owns
nothing between requests: a page's position is all in its cursor, ``partition:offset``
pairs in the URL (``0:120,1:98``), the exclusive upper bound of each partition for the
newest-first order (the next page is older), the lower bound for oldest first.

How a page is made: each partition's window is the ``page`` offsets next to its bound (so a
page reads at most ``page`` records of each partition), read one partition at a time (one
partition's fetch in memory at once); then the windows are merged by timestamp, newest (or
oldest) first, taking from the end of each partition's window in turn, so what a page
shows of a partition is always a contiguous run of offsets and the cursor moves past it.
A key or value filter keeps the records whose key (value) contains it; the cursor moves past
every record merged, shown or not.
"""
from __future__ import annotations

import time
from typing import NamedTuple

from odradek.core.protocol import OdradekError
from odradek.types import TopicPartition

PAGE = 50  # records on a page, and the most read from one partition for it
BROWSE_TIMEOUT = 3.0  # seconds a page may spend reading


class Page(NamedTuple):
    records: list  # ConsumerRecords, in the order shown
    cursor: str  # the next page's bounds ('' when there is nothing further)
    error: str  # why the page is short ('' when it is not)


def parse_cursor(text: str) -> dict[int, int]:
    """``"0:120,1:98"`` -> ``{0: 120, 1: 98}``; ValueError when malformed."""
    out = {}
    for item in filter(None, (text or "").split(",")):
        partition, sep, offset = item.partition(":")
        if not sep:
            raise ValueError(f"cursor item {item[:40]!r} is not partition:offset")
        out[int(partition)] = int(offset)
    return out


def format_cursor(bounds: dict[int, int]) -> str:
    return ",".join(f"{p}:{o}" for p, o in sorted(bounds.items()))


def browse(consumer, topic: str, partitions: list[int], *, newest: bool = True, cursor: dict | None = None,
           offset: int | None = None, timestamp: int | None = None, key: str = "", value: str = "", page: int = PAGE,
           timeout: float = BROWSE_TIMEOUT) -> Page:
    """One page of ``topic``'s ``partitions``. Without a cursor it starts at the newest
    records (``newest``) or the oldest, or at ``offset`` (each partition), or at
    ``timestamp`` (ms: the first record at or after it, oldest first; the last before it,
    newest first)."""
    tps = {p: TopicPartition(topic, p) for p in partitions}
    consumer.assign(list(tps.values()))
    begin = consumer.beginning_offsets(list(tps.values()))
    end = consumer.end_offsets(list(tps.values()))
    first = {p: begin[tp] for p, tp in tps.items()}
    last = {p: end[tp] for p, tp in tps.items()}  # exclusive
    if cursor:
        bound = {p: cursor.get(p, last[p] if newest else first[p]) for p in tps}
    elif offset is not None:
        bound = {p: offset + 1 if newest else offset for p in tps}
    elif timestamp is not None:
        found = consumer.offsets_for_times({tp: timestamp + (1 if newest else 0) for tp in tps.values()})
        bound = {p: found.get(tp, -1) if found.get(tp, -1) >= 0 else last[p] for p, tp in tps.items()}
    else:
        bound = dict(last if newest else first)
    bound = {p: min(max(o, first[p]), last[p]) for p, o in bound.items()}
    windows = {p: (max(first[p], bound[p] - page), bound[p]) if newest else (bound[p], min(last[p], bound[p] + page))
               for p in tps}
    deadline = time.monotonic() + timeout
    runs, whole, error = {}, set(), ""
    for p, (lo, hi) in windows.items():
        if lo >= hi:
            continue
        runs[p], complete, problem = read(consumer, tps[p], lo, hi, deadline)
        if complete:
            whole.add(p)
        else:
            error = problem or f"the page took longer than {timeout:g}s to read: some records are missing"
    shown, moved, left = merge(runs, newest, page, key, value)
    next_bound = dict(bound)
    for p in whole - left:  # every record of its window merged: past the window (its gaps too)
        next_bound[p] = windows[p][0] if newest else windows[p][1]
    for p in left:
        if p in moved:
            next_bound[p] = moved[p] if newest else moved[p] + 1
    more = any(next_bound[p] > first[p] for p in tps) if newest else any(next_bound[p] < last[p] for p in tps)
    return Page(shown, format_cursor(next_bound) if more else "", error)


def read(consumer, tp: TopicPartition, lo: int, hi: int, deadline: float) -> tuple[list, bool, str]:
    """The records of ``tp`` in offsets [lo, hi) (records compaction removed and transaction
    markers are simply not there), whether all were read before the deadline, and why not
    when a batch could not be read (a corrupt batch, or one that inflates beyond the bound:
    the records before it are shown, the page says so)."""
    consumer.assign([tp])
    consumer.seek(tp, lo)
    out = []
    try:
        while consumer.position(tp) < hi and time.monotonic() < deadline:
            for r in consumer.poll(timeout_ms=200, max_records=hi - lo):
                if lo <= r.offset < hi:
                    out.append(r)
    except OdradekError as exc:
        if exc.code.retriable:
            raise
        return out, False, f"partition {tp.partition} cannot be read past offset {consumer.position(tp)}: {exc.message}"
    return out, consumer.position(tp) >= hi, ""


def merge(runs: dict[int, list], newest: bool, page: int, key: str = "",
          value: str = "") -> tuple[list, dict[int, int], set]:
    """Up to ``page`` records whose key contains ``key`` and value ``value``, by timestamp
    (newest or oldest first), each partition's run taken from its end (newest) or start
    (oldest) only; the last offset taken from each partition; the partitions with records not
    taken."""
    heads = {p: (len(run) - 1 if newest else 0) for p, run in runs.items() if run}
    shown, moved, wanted, within = [], {}, key.encode(), value.encode()
    while heads and len(shown) < page:
        pick = (max if newest else min)(heads, key=lambda p: (runs[p][heads[p]].timestamp, -p if newest else p))
        r = runs[pick][heads[pick]]
        moved[pick] = r.offset
        if (not wanted or wanted in (r.key or b"")) and (not within or within in (r.value or b"")):
            shown.append(r)
        heads[pick] += -1 if newest else 1
        if not 0 <= heads[pick] < len(runs[pick]):
            del heads[pick]
    return shown, moved, set(heads)
