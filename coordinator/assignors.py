"""Server-side partition assignors: ``uniform`` (sticky) and ``range``.

Pure functions, no I/O, no state: the group state machine (``coordinator.group``) calls one
to compute a group's *target* assignment whenever the group epoch moves. Importable anywhere.

Both take the same arguments:

  members     ``{member_id: frozenset of subscribed topic names}``
  topics      ``{topic: partition count}`` (topics that exist; others are ignored)
  current     ``{member_id: set of (topic, partition)}``, the previous target assignment
              (``uniform`` keeps as much of it as balance allows; ``range`` ignores it)

and return ``{member_id: set of (topic, partition)}`` with an entry for every member.

Invariants (property-tested in tests/coordinator/test_assignors.py): every partition of a
subscribed, existing topic has exactly one owner, and that owner subscribes to its topic.
``uniform`` also balances (when every member subscribes to the same topics, counts differ
by at most one) and is sticky: a partition moves only off a member holding more than its
fair share, so the number of moved partitions is the least any balanced result needs.
"""
from __future__ import annotations

import zlib
from typing import Callable

TP = tuple[str, int]
Assignment = dict[str, set[TP]]


def uniform(members: dict[str, frozenset], topics: dict[str, int], current: Assignment | None = None) -> Assignment:
    """Sticky and balanced. Keep every valid current ownership, give orphaned partitions to
    the least-loaded eligible member, then move partitions from the most to the least
    loaded eligible member while their counts differ by two or more."""
    current = current or {}
    out: Assignment = {m: set() for m in members}
    owner: dict[TP, str] = {}
    # 1. Keep what is still valid (subscribed, existing, not claimed twice).
    for m in sorted(members):
        for tp in sorted(current.get(m, ())):
            t, p = tp
            if t in members[m] and 0 <= p < topics.get(t, 0) and tp not in owner:
                owner[tp] = m
                out[m].add(tp)
    # 2. Orphans go to the least-loaded member that subscribes; the partitions with the
    #    fewest candidates are placed first, so a narrow subscription is not starved.
    eligible: dict[str, list[str]] = {}
    for t in topics:
        ms = sorted(m for m in members if t in members[m])
        if ms:
            eligible[t] = ms
    orphans = [(t, p) for t in sorted(eligible) for p in range(topics[t]) if (t, p) not in owner]
    orphans.sort(key=lambda tp: (len(eligible[tp[0]]), tp))
    for tp in orphans:
        m = min(eligible[tp[0]], key=lambda x: (len(out[x]), _tiebreak(x, tp)))
        out[m].add(tp)
        owner[tp] = m
    # 3. Balance: move one partition at a time from a member with the most to an eligible
    #    member with at least two fewer. Each move lowers the sum of squared counts, so
    #    this ends; with identical subscriptions it ends at counts differing by <= 1.
    _balance(out, members)
    return out


def _balance(out: Assignment, members: dict[str, frozenset]) -> None:
    while True:
        moved = False
        for donor in sorted(out, key=lambda m: (-len(out[m]), m)):
            n = len(out[donor])
            # Prefer a receiver with the fewest partitions.
            for receiver in sorted(out, key=lambda m: (len(out[m]), m)):
                if len(out[receiver]) > n - 2:
                    break
                movable = sorted(tp for tp in out[donor] if tp[0] in members[receiver])
                if movable:
                    tp = movable[-1]  # the highest partition of the last topic: deterministic
                    out[donor].discard(tp)
                    out[receiver].add(tp)
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return


def _tiebreak(member: str, tp: TP) -> int:
    """Spread equal-load choices by a stable hash rather than always the first name."""
    return zlib.crc32(f"{member}/{tp[0]}/{tp[1]}".encode())


def range_assign(members: dict[str, frozenset], topics: dict[str, int], current: Assignment | None = None) -> Assignment:
    """Kafka's range: per topic, the sorted subscribers get consecutive ranges of
    partitions, the first ``n % k`` one extra. Not sticky; co-partitioned topics line up."""
    out: Assignment = {m: set() for m in members}
    for t in sorted(topics):
        ms = sorted(m for m in members if t in members[m])
        if not ms:
            continue
        n, k = topics[t], len(ms)
        base, extra = divmod(n, k)
        start = 0
        for i, m in enumerate(ms):
            size = base + (1 if i < extra else 0)
            out[m].update((t, p) for p in range(start, start + size))
            start += size
    return out


ASSIGNORS: dict[str, Callable[..., Assignment]] = {"uniform": uniform, "range": range_assign}
DEFAULT = "uniform"
