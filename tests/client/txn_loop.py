"""A consume-transform-produce loop with the bundled clients, exactly once through
transactions; run as a process by tests/client/test_transactions.py, which kills it.

    python -m tests.client.txn_loop BOOTSTRAP IN OUT GROUP TXN_ID TOTAL [KILL_AT]

Reads IN (partition 0, read_committed, from the group's committed offset), writes each
record's value upper-cased to OUT and commits the consumed offsets in the same transaction,
a few records per transaction; with KILL_AT, sends SIGKILL to itself right after the
KILL_AT-th ``send_offsets_to_transaction`` (before its commit). Exits once the group's
committed offset reaches TOTAL.
"""
from __future__ import annotations

import os
import signal
import sys

from odradek import Consumer, Producer, TopicPartition


def main(bootstrap: str, src: str, dst: str, group: str, txn_id: str, total: int, kill_at: int | None) -> None:
    tp = TopicPartition(src, 0)
    c = Consumer(bootstrap, group_id=group, enable_auto_commit=False, auto_offset_reset="earliest",
                 isolation_level="read_committed")
    c.assign([tp])
    start = c.committed(tp)
    if start is not None:
        c.seek(tp, start)
    p = Producer(bootstrap, transactional_id=txn_id, linger_ms=1)
    p.init_transactions(30)
    done, n = start or 0, 0
    while done < total:
        recs = c.poll(1000, max_records=7)
        if not recs:
            continue
        p.begin_transaction()
        for r in recs:
            p.send(dst, r.value.upper(), partition=0)
        done = recs[-1].offset + 1
        p.send_offsets_to_transaction({tp: done}, c.group_metadata())
        n += 1
        if kill_at is not None and n == kill_at:
            p.flush(30)  # the output is in the log, the offsets are held: only the commit is missing
            os.kill(os.getpid(), signal.SIGKILL)
        p.commit_transaction(30)
    p.close(10)
    c.close()


if __name__ == "__main__":
    a = sys.argv[1:]
    main(a[0], a[1], a[2], a[3], a[4], int(a[5]), int(a[6]) if len(a) > 6 else None)
