"""``odradek pipeline run NAME``: run an example pipeline against a broker.

    odradek pipeline run clicks [--master local[2]] [--bootstrap-server HOST:PORT]
                                [--events 20000] [--minutes 10] [--output DIR] [--follow SECONDS]
    python -m pipeline.cli run clicks ...            # the same without the odradek command

Registered by ``odradek.cli`` through ``add_parser(sub, config_args, bootstrap)``. Runs in the
command's one process: it produces the synthetic events (unless ``--events 0``), then runs the
Structured Streaming job with ``Trigger.AvailableNow`` (or, with ``--follow S``, a
processing-time trigger for S seconds), prints the per-minute counts it wrote and exits.
Running it again with the same ``--output`` resumes from the checkpoint.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

PIPELINES = ("clicks",)

_bootstrap_of = None


def add_parser(sub, config_args, bootstrap) -> None:
    """Add ``pipeline`` to the ``odradek`` command line (``sub`` is its subparsers)."""
    global _bootstrap_of
    _bootstrap_of = bootstrap
    p = sub.add_parser("pipeline", help="run an example Spark pipeline (needs the spark extra)")
    if config_args is not None:
        config_args(p)
    _arguments(p)
    p.set_defaults(func=cmd_pipeline)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["run"])
    p.add_argument("name", choices=PIPELINES)
    p.add_argument("--master", default=None,
                   help="Spark master: local[N], local[*], spark://host:port (default: spark-submit's, else local[2])")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    p.add_argument("--events", type=int, default=20000, help="synthetic clicks to produce first (0: none)")
    p.add_argument("--minutes", type=int, default=10, help="event-time span of the produced clicks")
    p.add_argument("--start-ms", type=int, default=None,
                   help="event time of the first click (default: the next whole minute after the last run's)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--partitions", type=int, default=4, help="partitions of 'clicks' when it is created")
    p.add_argument("--output", default="odradek-pipeline-clicks", help="Parquet table, checkpoint and markers")
    p.add_argument("--watermark", default="1 minute")
    p.add_argument("--follow", type=float, metavar="SECONDS",
                   help="keep running with a processing-time trigger for this long instead of availableNow")


def cmd_pipeline(args) -> int:
    bs = args.bootstrap_server or (_bootstrap_of(args) if _bootstrap_of else "127.0.0.1:9092")
    from odradek.pipeline import clicks
    from odradek.pipeline.session import session

    remote = "://" in args.output  # hdfs://, s3a://...: Spark writes there; no local state file
    output = args.output if remote else os.path.abspath(args.output)
    state = None if remote else os.path.join(output, "last-event-ms")
    clicks.ensure_topics(bs, args.partitions)
    if args.events:
        start = args.start_ms if args.start_ms is not None else _next_start(state)
        events = clicks.make_events(args.events, start, args.minutes, seed=args.seed)
        clicks.produce_events(bs, events)
        if state:
            os.makedirs(output, exist_ok=True)
            with open(state, "w") as f:
                f.write(str(max(e["ts"] for e in events)))
        print(f"produced {len(events)} clicks to '{clicks.CLICKS}' ({args.minutes} minutes of event time)")
    spark = session(args.master or _default_master(), app="odradek-clicks")
    try:
        query = clicks.start_query(spark, bs, output, watermark=args.watermark,
                                   available_now=args.follow is None)
        if args.follow is None:
            query.awaitTermination()
        else:
            query.awaitTermination(args.follow)
            query.stop()
        if query.exception():
            raise query.exception()
        table = clicks.read_table(spark, output)
        print(f"{len(table)} (minute, page) counts in {os.path.join(output, 'counts')} and topic "
              f"'{clicks.COUNTS}'")
        for (w, page), n in sorted(table.items())[-8:]:
            print(f"  {time.strftime('%Y-%m-%d %H:%M', time.gmtime(w / 1000))}  {page:<10} {n}")
    finally:
        spark.stop()
    return 0


def _default_master() -> str | None:
    """Under spark-submit (which starts the JVM first and passes its gateway) keep its master."""
    return None if os.environ.get("PYSPARK_GATEWAY_PORT") else "local[2]"


def _next_start(state: str | None) -> int:
    """Continue event time after the previous run's last click (so a rerun adds new minutes)."""
    try:
        if state is None:
            raise FileNotFoundError
        with open(state) as f:
            last = int(f.read().strip())
        return last - last % 60_000 + 60_000
    except (FileNotFoundError, ValueError):
        now = int(time.time() * 1000)
        return now - now % 60_000 - 60 * 60_000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.cli", description="Run an example Spark pipeline.")
    _arguments(parser)
    args = parser.parse_args(argv)
    from odradek.core.protocol import OdradekError
    try:
        return cmd_pipeline(args)
    except OdradekError as exc:
        print(f"odradek: {exc.message} ({exc.code.name})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
