"""A group consumer in its own process, for tests/client/test_groups*.py and the benchmark.

    python -m tests.client.test_groups_worker BOOTSTRAP GROUP TOPIC OUT [--instance ID]
        [--session-ms N] [--heartbeat-ms N] [--commit-ms N]

Subscribes to TOPIC in GROUP and consumes until SIGTERM (then closes: a final commit and a
leave). It appends one line per event to OUT, flushed at once, so a test can read the
timeline even after a kill -9; times are ``time.monotonic()`` (one clock for every process
of the machine):

    S <t> <pid>                          started
    A <t> <p,p,...>                      partitions assigned (after on_assign)
    V <t> <p,p,...> <lost 0|1>           partitions revoked (in on_revoke, before release)
    R <t> <partition> <first> <last>     records first..last of a partition returned by a poll
    E <t> <message>                      an error from poll
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bootstrap")
    ap.add_argument("group")
    ap.add_argument("topic")
    ap.add_argument("out")
    ap.add_argument("--instance")
    ap.add_argument("--session-ms", type=int, default=None)
    ap.add_argument("--heartbeat-ms", type=int, default=3000)
    ap.add_argument("--commit-ms", type=int, default=200)
    args = ap.parse_args(argv)

    from odradek import Consumer

    out = open(args.out, "a", buffering=1)

    def emit(line: str) -> None:
        out.write(f"{line}\n")

    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__("now", True))
    emit(f"S {time.monotonic():.6f} {os.getpid()}")
    consumer = Consumer(args.bootstrap, group_id=args.group, group_instance_id=args.instance,
                        auto_offset_reset="earliest", enable_auto_commit=True,
                        auto_commit_interval_ms=args.commit_ms, session_timeout_ms=args.session_ms,
                        heartbeat_interval_ms=args.heartbeat_ms, fetch_max_wait_ms=100)

    def assigned(tps):
        emit(f"A {time.monotonic():.6f} {','.join(str(tp.partition) for tp in sorted(tps))}")

    def revoked(tps, lost=False):
        emit(f"V {time.monotonic():.6f} {','.join(str(tp.partition) for tp in sorted(tps))} {int(lost)}")

    consumer.subscribe([args.topic], on_assign=assigned, on_revoke=revoked)
    try:
        while not stop["now"]:
            try:
                records = consumer.poll(100)
            except Exception as exc:  # keep going: the test reads the error from the file
                emit(f"E {time.monotonic():.6f} {type(exc).__name__}: {exc}")
                time.sleep(0.1)
                continue
            if not records:
                continue
            now = time.monotonic()
            first: dict[int, int] = {}
            last: dict[int, int] = {}
            for r in records:
                first.setdefault(r.partition, r.offset)
                last[r.partition] = r.offset
            out.write("".join(f"R {now:.6f} {p} {first[p]} {last[p]}\n" for p in first))
    finally:
        consumer.close()
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
