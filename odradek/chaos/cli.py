"""``odradek chaos``: a local cluster under faults, then the anomaly report (docs/RELIABILITY.md).

    odradek chaos [--time 600] [--seed N] [--faults kill-leader,partition-zk,...] [--out DIR]
    odradek chaos --power-cut [--time 20] [--flush-messages 1]   every broker loses power at once
    odradek chaos ... --ack-before-fsync      Kafka's acknowledgement (log.flush.before.ack=false)

Exit status 0 when no lost write, inconsistent offset or replica divergence was found, 2
otherwise (duplicates, failed sends and the rest are reported, not judged).
"""
from __future__ import annotations

import os

from odradek.chaos.nemesis import FAULTS

JUDGED = ("lost", "inconsistent_offsets", "replica_divergence")


def add_parser(sub) -> None:
    p = sub.add_parser("chaos", help="run a local cluster under faults and report Jepsen's queue anomalies")
    p.add_argument("--time", type=float, default=600.0, help="seconds of faults (default 600)")
    p.add_argument("--seed", type=int, default=None, help="the schedule's random seed (default: from the clock)")
    p.add_argument("--faults", default=None,
                   help=f"comma-separated, from: {', '.join(FAULTS)} (default: all but clock-jump, "
                        f"which needs Debian's libfaketime)")
    p.add_argument("--fault-duration", type=float, default=10.0, help="seconds each fault lasts")
    p.add_argument("--gap", type=float, default=8.0, help="seconds of calm between faults")
    p.add_argument("--combine", type=float, default=0.3, help="probability of a second fault at once")
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--rate", type=float, default=100.0, help="records/s per producer (2 producers)")
    p.add_argument("--flush-messages", type=int, default=None, help="the topic's flush.messages (1: fsync per append)")
    p.add_argument("--ack-before-fsync", action="store_true",
                   help="brokers acknowledge before fsync, as Kafka does (log.flush.before.ack=false); the "
                        "default fsyncs every acknowledged record on each in-sync replica first")
    p.add_argument("--out", default="chaos-report", help="directory for report.json, report.txt, chaos.png, history")
    p.add_argument("--keep", action="store_true", help="keep the brokers' data directory")
    p.add_argument("--power-cut", action="store_true",
                   help="instead of the battery: produce for --time seconds as fast as the producers go, then "
                        "every broker loses its unfsynced writes at once; prints the throughput and what "
                        "acknowledged writes were lost (chaos.powercut)")
    p.set_defaults(func=cmd_chaos)


def cmd_chaos(args) -> int:
    import time
    from odradek.chaos.runner import ChaosOptions, run
    from odradek.core.protocol import OdradekError
    from odradek.local import zookeeper_missing
    missing = zookeeper_missing()
    if missing:
        raise OdradekError(missing)
    if args.power_cut:
        import json
        from odradek.chaos.powercut import power_cut
        result = power_cut(args.time, args.flush_messages, args.brokers, args.partitions,
                           seed=args.seed or 0, log=lambda text: None,
                           settings={"log.flush.before.ack": False} if args.ack_before_fsync else None)
        print(json.dumps(result, indent=1))
        # a loss is the measurement with Kafka's acknowledgement, a failure with the default
        return 2 if result["replica_divergence"] or (result["lost"] and not args.ack_before_fsync) else 0
    faults = [f.strip() for f in args.faults.split(",")] if args.faults else ChaosOptions().faults
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise OdradekError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    seed = args.seed if args.seed is not None else int(time.time())
    opts = ChaosOptions(duration=args.time, seed=seed, brokers=args.brokers, partitions=args.partitions,
                        rate=args.rate, faults=faults, fault_duration=args.fault_duration, gap=args.gap,
                        combine=args.combine, out_dir=os.path.abspath(args.out), keep=args.keep,
                        flush_messages=args.flush_messages, ack_before_fsync=args.ack_before_fsync)
    result = run(opts)
    print(f"report: {result['paths']['text']}" + (f", plot: {result['paths']['plot']}" if result["paths"]["plot"]
                                                   else " (no plot: pip install 'odradek[plot]')"))
    bad = {k: result["anomalies"][k]["count"] for k in JUDGED if result["anomalies"][k]["count"]}
    if bad or not result["healed"]:
        print(f"chaos: FAILED (seed {seed}): {bad or 'the cluster did not heal'}")
        return 2
    return 0
