"""Command line client tools, mirroring Kafka's: ``topics``, ``produce``, ``consume``, ``dump-log``,
``groups``.

Registered by ``odradek.cli`` through ``add_parsers``; each command runs in the CLI's one
thread (the Producer it creates owns its sender thread until the command returns).

    odradek topics --create --topic orders --partitions 3 --config retention.ms=86400000
    odradek topics --list | --describe [--topic T] | --delete --topic T | --alter --topic T --config k=v
    printf 'k1:v1\\nk2:v2\\n' | odradek produce orders --key-separator :
    odradek consume orders --from-beginning --max-messages 10 --property print.key=true
    odradek dump-log /var/lib/odradek/orders-0           # or one .log/.index/.timeindex/.snapshot/.txnindex file
    odradek groups --list | --describe G [--isolation read_committed] | --delete G
    odradek groups --reset-offsets G --topic orders --to-earliest|--to-latest|--to-datetime T|--shift-by N [--execute]

Errors print one line naming the problem (the CLI adds the error code) and exit 1.
"""
from __future__ import annotations

import mmap
import os
import struct
import sys
import time

from odradek import client_properties
from odradek.core.protocol import ErrorCode, OdradekError

_bootstrap_of = None  # set by add_parsers: args -> "host:port"
DUMPED = (".log", ".index", ".timeindex", ".snapshot", ".txnindex")  # what dump-log reads in a directory
TIMEOUT_MS = 5000  # how long a command waits for an unreachable broker before its one-line error


def add_parsers(sub, config_args, bootstrap) -> None:
    global _bootstrap_of
    _bootstrap_of = bootstrap

    p = sub.add_parser("topics", help="create, list, describe, alter or delete topics (like kafka-topics)")
    # --config is Kafka's topic-config flag here, so the broker config file is --broker-config.
    p.add_argument("--broker-config", dest="config", metavar="FILE",
                   help="broker TOML config (to find the default --bootstrap-server)")
    p.add_argument("--set", metavar="KEY=VALUE", action="append", default=[], help="broker config override")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    client_properties.add_arguments(p)
    g = p.add_mutually_exclusive_group(required=True)
    for action in ("create", "list", "describe", "delete", "alter"):
        g.add_argument(f"--{action}", action="store_true")
    p.add_argument("--topic", help="topic name; --list, --describe, --alter, --delete: a regular expression "
                                   "(the whole name), as Kafka's")
    p.add_argument("--partitions", type=int, help="partition count (create; default: the broker's num.partitions)")
    p.add_argument("--replication-factor", type=int, help="replicas per partition (create)")
    p.add_argument("--config", dest="topic_config", action="append", default=[], metavar="KEY=VALUE",
                   help="topic config (create, alter); repeatable")
    p.add_argument("--delete-config", action="append", default=[], metavar="KEY",
                   help="config to return to its default (alter); repeatable")
    p.add_argument("--if-not-exists", action="store_true", help="create: no error if the topic exists")
    p.add_argument("--if-exists", action="store_true", help="alter, delete, describe: no error if no topic matches")
    p.add_argument("--exclude-internal", action="store_true",
                   help="list, describe: leave out the internal topics (__consumer_offsets, __transaction_state)")
    p.add_argument("--under-replicated-partitions", action="store_true",
                   help="describe: only partitions whose in-sync replicas are fewer than their replicas")
    p.set_defaults(func=cmd_topics)

    p = sub.add_parser("produce", help="send lines of stdin as records (like kafka-console-producer)")
    config_args(p)
    p.add_argument("topic", nargs="?", help="the topic (or --topic)")
    p.add_argument("--topic", dest="topic_option", metavar="TOPIC", help="the topic, as Kafka's tool takes it")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    client_properties.add_arguments(p, producer=True)
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="parse.key=true, key.separator=SEP (default tab)")
    p.add_argument("--key-separator", metavar="SEP", help="shorthand for parse.key=true key.separator=SEP")
    p.add_argument("--partition", type=int, help="send every record to this partition")
    p.add_argument("--acks", default="1", choices=["0", "1", "all", "-1"])
    p.add_argument("--linger-ms", type=float, default=5)
    p.add_argument("--compression-codec", "--compression", dest="compression", default="lz4",
                   choices=["none", "gzip", "snappy", "lz4", "zstd"],
                   help="the batches' codec (gzip, snappy, zstd: written as Kafka's magic-2 batches)")
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("consume", help="print records to stdout (like kafka-console-consumer)")
    config_args(p)
    p.add_argument("topic", nargs="?", help="the topic (or --topic)")
    p.add_argument("--topic", dest="topic_option", metavar="TOPIC", help="the topic, as Kafka's tool takes it")
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    client_properties.add_arguments(p, consumer=True)
    p.add_argument("--group", help="consume in this consumer group (its committed offsets; commits as it goes)")
    p.add_argument("--isolation-level", choices=("read_uncommitted", "read_committed"), default="read_uncommitted",
                   help="read_committed: only committed transactions' records")
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset (default: latest)")
    p.add_argument("--partition", type=int, help="read only this partition")
    p.add_argument("--offset", default=None,
                   help="with --partition: an offset, 'earliest' or 'latest' (default latest)")
    p.add_argument("--max-messages", type=int, help="exit after this many records")
    p.add_argument("--timeout-ms", type=int, help="exit when no record arrives for this long")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="print.key, print.offset, print.partition, print.timestamp, print.headers (true/false), "
                        "key.separator")
    p.set_defaults(func=cmd_consume)

    p = sub.add_parser("dump-log", help="print the batches and records of segment files (like kafka-dump-log)")
    p.add_argument("paths", nargs="+", metavar="DIR|FILE",
                   help="a partition directory, or .log / .index / .timeindex / .snapshot / .txnindex files")
    p.add_argument("--batches-only", action="store_true", help="print batch headers without their records")
    p.add_argument("--max-bytes", type=int, default=0, help="print at most this many bytes of each key/value")
    p.set_defaults(func=cmd_dump_log)

    p = sub.add_parser("groups", help="list, describe (with lag), reset offsets of, or delete consumer groups "
                                      "(like kafka-consumer-groups)")
    config_args(p)
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    client_properties.add_arguments(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--list", action="store_true")
    g.add_argument("--describe", nargs="?", const="", metavar="GROUP")
    g.add_argument("--reset-offsets", nargs="?", const="", metavar="GROUP")
    g.add_argument("--delete", nargs="?", const="", metavar="GROUP")
    g.add_argument("--delete-offsets", nargs="?", const="", metavar="GROUP",
                   help="delete the group's committed offsets of --topic T[:P,P...] (the group must not "
                        "subscribe to it)")
    p.add_argument("--group", help="the group (instead of naming it after the action)")
    p.add_argument("--all-groups", action="store_true", help="describe, reset, delete: every group")
    p.add_argument("--members", action="store_true", help="describe: the members only (Kafka's --members)")
    p.add_argument("--state", nargs="?", const="", metavar="STATES",
                   help="describe: the group's state line only; list: only groups in these states "
                        "(comma-separated, e.g. Stable,Empty)")
    p.add_argument("--isolation", choices=("read_uncommitted", "read_committed"), default="read_uncommitted",
                   help="describe: measure LAG to the LOG-END-OFFSET (read_uncommitted, Kafka's tool) or to the "
                        "LAST-STABLE-OFFSET (read_committed: what a read_committed consumer can reach; open "
                        "transactions do not count)")
    p.add_argument("--topic", action="append", default=[], help="reset: a topic (repeatable; default: every "
                                                                  "topic the group has committed offsets for), "
                                                                  "T or T:P,P (those partitions)")
    to = p.add_mutually_exclusive_group()
    to.add_argument("--to-earliest", action="store_true")
    to.add_argument("--to-latest", action="store_true")
    to.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:MM:SS[.mmm][+HH:MM]")
    to.add_argument("--shift-by", type=int, metavar="N")
    to.add_argument("--to-offset", type=int, metavar="N", help="the same offset on every partition")
    to.add_argument("--to-current", action="store_true", help="the committed offsets (the log end where none)")
    to.add_argument("--by-duration", metavar="PnDTnHnMnS", help="the offsets of this long ago (ISO-8601 duration)")
    p.add_argument("--execute", action="store_true", help="reset: apply (without it, only show the plan)")
    p.set_defaults(func=cmd_groups)

    p = sub.add_parser("leader-election", help="move partitions' leadership back to their preferred (first) "
                                               "replica (like kafka-leader-election --election-type preferred)")
    config_args(p)
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    client_properties.add_arguments(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--all-topic-partitions", action="store_true")
    which.add_argument("--topic")
    p.add_argument("--partition", type=int, action="append", help="with --topic (repeatable; default: all)")
    p.set_defaults(func=cmd_leader_election)


def _one_line_errors(command):
    """Turn the client's argument errors (ValueError/TypeError) into the CLI's one-line error."""
    import functools

    @functools.wraps(command)
    def run(args) -> int:
        try:
            return command(args)
        except (ValueError, TypeError) as exc:
            raise OdradekError(str(exc), ErrorCode.INVALID_REQUEST) from None
    return run


def _properties(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise OdradekError(f"--property expects key=value, got {item!r}", ErrorCode.INVALID_CONFIG)
        out[key.strip()] = value
    return out


def _true(props: dict, key: str) -> bool:
    return props.get(key, "false").strip().lower() in ("true", "1", "yes")


def _configs(items: list[str]) -> dict:
    out = {}
    for item in items:
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                raise OdradekError(f"--config expects key=value, got {pair!r}", ErrorCode.INVALID_CONFIG)
            out[key.strip()] = value.strip()
    return out


# ---- status: which local broker ----------------------------------------------------------------
def run_dir_of(bootstrap: str) -> str:
    """The run directory of the broker listening at ``bootstrap`` (on this machine: its
    supervisor's mailbox is a local socket), from the ``log.dirs`` and ``run.dir`` it reports
    (DESCRIBE_CONFIGS). A relative path is the broker's own: resolved against the working
    directory of the process listening on that port."""
    from odradek import config as cfg
    from odradek.network.client import BrokerConnection, parse_bootstrap
    from odradek.core.protocol import ApiKey
    host, port = parse_bootstrap(bootstrap)[0]
    with BrokerConnection(host, port, client_id="odradek-status", request_timeout_ms=TIMEOUT_MS,
                          connect_timeout_ms=TIMEOUT_MS) as conn:
        resp = conn.request(ApiKey.DESCRIBE_CONFIGS, {"resources": [{"type": "broker", "name": "",
                                                                     "configs": ["log.dirs", "run.dir"]}]})
    found = {}
    for res in resp.body.get("resources", []):
        if res.get("error_code"):
            raise OdradekError(f"the broker at {bootstrap} would not describe its configs: "
                               f"{res.get('error_message')}", res["error_code"])
        found.update({c["name"]: c["value"] for c in res.get("configs", []) if c["name"] in ("log.dirs", "run.dir")})
    if "log.dirs" not in found:
        raise OdradekError(f"the broker at {bootstrap} did not report its log.dirs", ErrorCode.UNKNOWN_SERVER_ERROR)
    cwd = _listener_cwd(port)
    return cfg.run_dir({name: os.path.join(cwd, value) if value and not os.path.isabs(value) else value
                        for name, value in found.items()})


def _listener_cwd(port: int) -> str:
    """The working directory of this user's process listening on ``port`` (ours if none is seen)."""
    import psutil
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return psutil.Process(conn.pid).cwd()
            except psutil.Error:
                break
    return os.getcwd()


def check_status_address(status: dict, bootstrap: str) -> None:
    """The supervisor found must be the one listening at ``bootstrap``."""
    from odradek.network.client import parse_bootstrap
    address = status.get("supervisor", {}).get("address")
    if address and parse_bootstrap(address)[0][1] != parse_bootstrap(bootstrap)[0][1]:
        raise OdradekError(f"the run directory the broker at {bootstrap} reports belongs to the broker at "
                           f"{address}: two brokers share log.dirs/run.dir?", ErrorCode.INVALID_CONFIG)


# ---- topics -----------------------------------------------------------------------------------
@_one_line_errors
def cmd_topics(args) -> int:
    from odradek.admin import Admin
    from odradek.errors import TopicAlreadyExistsError
    with Admin(_bootstrap_of(args), client_id="odradek-topics", request_timeout_ms=TIMEOUT_MS,
               **client_properties.options_of(args)) as admin:
        if args.list:
            for name in _matching(admin, args):
                print(name)
            return 0
        if args.describe:
            racks = {b: r for b, r in admin.broker_racks().items() if r}
            names = _matching(admin, args)
            if args.topic and not names and not args.if_exists:
                raise OdradekError(f"topic '{args.topic}' does not exist (--if-exists: no error)",
                                   ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            for name in names:
                d = admin.describe_topic(name)
                if args.under_replicated_partitions:
                    for p in d.partitions:
                        if len(p.isr) < len(p.replicas):
                            _print_partition(d.name, p, racks)
                    continue
                overrides = {c.name: c.value for c in admin.describe_configs(name) if c.source == "topic"}
                _print_description(d, overrides, racks)
            return 0
        if args.create:
            topic = _need_topic(args)
            try:
                made = admin.create_topic(topic, -1 if args.partitions is None else args.partitions,
                                          -1 if args.replication_factor is None else args.replication_factor,
                                          _configs(args.topic_config))
            except TopicAlreadyExistsError:
                if args.if_not_exists:
                    return 0
                raise
            print(f"Created topic {topic} with {made['num_partitions']} partitions.")
            return 0
        _need_topic(args)
        topics = _matching(admin, args)
        if not topics and not args.if_exists:
            raise OdradekError(f"topic '{args.topic}' does not exist (--if-exists: no error)",
                               ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        for topic in topics:
            if args.delete:
                admin.delete_topic(topic)
                print(f"Deleted topic {topic}.")
                continue
            if args.partitions is not None:  # CreatePartitions: Kafka's tool only grows a topic
                admin.create_partitions(topic, args.partitions)
                print(f"Topic {topic} now has {args.partitions} partitions.")
            if args.topic_config or args.delete_config:
                admin.alter_configs(topic, set=_configs(args.topic_config), delete=args.delete_config)
                print(f"Completed updating config for topic {topic}.")
            elif args.partitions is None:
                raise OdradekError("--alter needs --partitions N or --config/--delete-config", ErrorCode.INVALID_REQUEST)
    return 0


def _matching(admin, args) -> list[str]:
    """The topics ``--topic`` names: a regular expression matched against whole names (Kafka's
    tool), every topic without it; internal ones unless ``--exclude-internal``."""
    import re
    names = admin.list_topics(include_internal=not args.exclude_internal)
    if not args.topic:
        return names
    if args.topic in names:
        return [args.topic]
    try:
        pattern = re.compile(args.topic)
    except re.error as exc:
        raise OdradekError(f"--topic {args.topic!r} is not a regular expression: {exc}", ErrorCode.INVALID_REQUEST)
    return [n for n in names if pattern.fullmatch(n)]


def _need_topic(args) -> str:
    if not args.topic:
        raise OdradekError("--topic is required for --create, --delete and --alter", ErrorCode.INVALID_REQUEST)
    return args.topic


def _print_description(d, overrides: dict, racks: dict | None = None) -> None:
    """kafka-topics --describe: the topic's overrides (not every default), then a line per
    partition (with its replicas' racks when the brokers have ``broker.rack``)."""
    configs = ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    rf = len(d.partitions[0].replicas) if d.partitions else 0
    print(f"Topic: {d.name}\tPartitionCount: {len(d.partitions)}\tReplicationFactor: {rf}\tConfigs: {configs}")
    for p in d.partitions:
        _print_partition(d.name, p, racks)


def _print_partition(topic: str, p, racks: dict | None) -> None:
    print(f"\tTopic: {topic}\tPartition: {p.partition}\tLeader: {p.leader}\t"
          f"Replicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}"
          + (f"\tRacks: {','.join(str(racks.get(r)) for r in p.replicas)}" if racks else ""))


# ---- produce ----------------------------------------------------------------------------------
@_one_line_errors
def cmd_produce(args) -> int:
    from odradek.producer import Producer
    props = _properties(args.property)
    separator = args.key_separator
    if separator is None and _true(props, "parse.key"):
        separator = props.get("key.separator", "\t")
    sep = separator.encode() if separator is not None else None
    handles = []
    failed: list = []
    topic = _topic_of(args)
    security, given = client_properties.args_properties(args)  # --producer.config/--producer-property: Kafka's names
    compression = given.get("compression.type", args.compression)
    with Producer(_bootstrap_of(args), acks=given.get("acks", args.acks),
                  linger_ms=float(given.get("linger.ms", args.linger_ms)),
                  batch_size=int(given.get("batch.size", 65536)), client_id=given.get("client.id", "odradek-produce"),
                  max_block_ms=TIMEOUT_MS, compression=None if compression in ("none", "") else compression,
                  **security) as producer:
        for lineno, line in enumerate(sys.stdin.buffer, 1):
            line = line.rstrip(b"\r\n")
            key = None
            if sep is not None:
                key, found, value = line.partition(sep)
                if not found:
                    raise OdradekError(f"line {lineno} has no key separator {separator!r}", ErrorCode.INVALID_RECORD)
            else:
                value = line
            handles.append(producer.send(topic, value, key=key, partition=args.partition))
            if len(handles) >= 10000:
                _collect(handles, failed)
        producer.flush()
        _collect(handles, failed)
    if failed:
        raise failed[0]
    return 0


def _collect(handles: list, failed: list) -> None:
    for h in handles:
        exc = h.exception()
        if exc is not None and not failed:
            failed.append(exc)
    handles.clear()


# ---- consume ----------------------------------------------------------------------------------
@_one_line_errors
def cmd_consume(args) -> int:
    from odradek.consumer import Consumer
    from odradek.types import TopicPartition
    props = _properties(args.property)
    if args.offset is not None and args.partition is None:
        raise OdradekError("--offset needs --partition", ErrorCode.INVALID_REQUEST)
    show = {k: _true(props, f"print.{k}") for k in ("timestamp", "partition", "offset", "headers", "key")}
    key_sep = props.get("key.separator", "\t").encode()
    out = sys.stdout.buffer
    count = 0
    topic = _topic_of(args)
    if args.group and (args.partition is not None or args.offset is not None):
        raise OdradekError("--group consumes what the group assigns: not with --partition/--offset",
                           ErrorCode.INVALID_REQUEST)
    security, given = client_properties.args_properties(args)
    group = args.group or given.get("group.id")
    with Consumer(_bootstrap_of(args), auto_offset_reset="earliest" if args.from_beginning else
                  given.get("auto.offset.reset", "latest"), client_id=given.get("client.id", "odradek-consume"),
                  request_timeout_ms=TIMEOUT_MS, group_id=group,
                  isolation_level=given.get("isolation.level", args.isolation_level), **security) as consumer:
        if group:
            consumer.subscribe([topic])
        else:
            if args.partition is not None:
                tps = [TopicPartition(topic, args.partition)]
            else:
                tps = [TopicPartition(topic, p) for p in _partitions(consumer, topic)]
            consumer.assign(tps)
            if args.offset is not None:
                _seek(consumer, tps[0], args.offset)
        idle_since = time.monotonic()
        try:
            while args.max_messages is None or count < args.max_messages:
                left = None if args.max_messages is None else args.max_messages - count
                records = consumer.poll(timeout_ms=200, max_records=left)
                if not records:
                    if args.timeout_ms is not None and (time.monotonic() - idle_since) * 1000 >= args.timeout_ms:
                        break
                    continue
                idle_since = time.monotonic()
                for r in records:
                    out.write(_format(r, show, key_sep))
                out.flush()
                count += len(records)
        except KeyboardInterrupt:
            pass
    print(f"Processed a total of {count} messages", file=sys.stderr)
    return 0


def _topic_of(args) -> str:
    """The topic named as Kafka's tools take it (``--topic``) or as a positional argument."""
    if args.topic and args.topic_option and args.topic != args.topic_option:
        raise OdradekError(f"two topics given: {args.topic!r} and --topic {args.topic_option!r}",
                           ErrorCode.INVALID_REQUEST)
    topic = args.topic_option or args.topic
    if not topic:
        raise OdradekError("name the topic: --topic TOPIC", ErrorCode.INVALID_REQUEST)
    return topic


def _partitions(consumer, topic: str) -> list:
    from odradek.errors import error_for
    body = consumer._cluster.refresh([topic])
    t = next((t for t in body.get("topics", []) if t["name"] == topic), None)
    if t is None or t.get("error_code"):
        raise error_for((t or {}).get("error_code") or ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        (t or {}).get("error_message") or f"topic '{topic}' does not exist")
    return sorted(p["index"] for p in t["partitions"])


def _seek(consumer, tp, offset: str) -> None:
    if offset == "earliest":
        consumer.seek_to_beginning(tp)
    elif offset == "latest":
        consumer.seek_to_end(tp)
    else:
        try:
            value = int(offset)
        except ValueError:
            raise OdradekError(f"--offset must be a number, 'earliest' or 'latest', got {offset!r}",
                               ErrorCode.INVALID_REQUEST) from None
        if value < 0:
            raise OdradekError(f"--offset must not be negative, got {value}", ErrorCode.OFFSET_OUT_OF_RANGE)
        consumer.seek(tp, value)


def _format(r, show: dict, sep: bytes) -> bytes:
    parts = []
    if show["timestamp"]:
        parts.append(b"CreateTime:%d" % r.timestamp)
    if show["partition"]:
        parts.append(b"Partition:%d" % r.partition)
    if show["offset"]:
        parts.append(b"Offset:%d" % r.offset)
    if show["headers"]:
        parts.append(b",".join(k.encode() + b":" + (v or b"") for k, v in r.headers) or b"NO_HEADERS")
    if show["key"]:
        parts.append(r.key if r.key is not None else b"null")
    parts.append(r.value if r.value is not None else b"null")
    return sep.join(parts) + b"\n"


# ---- groups -----------------------------------------------------------------------------------
@_one_line_errors
def cmd_groups(args) -> int:
    from odradek.group import GroupAdmin
    with GroupAdmin(_bootstrap_of(args), request_timeout_ms=TIMEOUT_MS, **client_properties.options_of(args)) as admin:
        if args.list:
            states = {s.strip().lower() for s in (args.state or "").split(",") if s.strip()}
            for g in admin.list():
                if not states or str(g["group_state"]).lower() in states:
                    print(f"{g['group_id']}\t{g['group_state']}")
            return 0
        group = next((v for v in (args.describe, args.reset_offsets, args.delete, args.delete_offsets) if v),
                     None) or args.group
        if args.all_groups:
            groups = [g["group_id"] for g in admin.list()]
        elif group:
            groups = [group]
        else:
            raise OdradekError("name the group: --describe GROUP (or --group GROUP, or --all-groups)",
                               ErrorCode.INVALID_REQUEST)
        for group in groups:
            if args.describe is not None:
                d = admin.describe(group, args.isolation)
                if args.state is not None:
                    _print_group_state(d)
                elif args.members:
                    _print_members(d)
                else:
                    _print_group(d)
            elif args.delete is not None:
                admin.delete(group)
                print(f"Deleted group {group}.")
            elif args.delete_offsets is not None:
                _delete_offsets(admin, group, args.topic)
            else:
                to, value = _reset_target(args)
                plan = admin.reset_offsets(group, args.topic or None, to=to, value=value, execute=args.execute)
                print(f"{'GROUP':<20} {'TOPIC':<20} {'PARTITION':>9} {'OLD-OFFSET':>10} {'NEW-OFFSET':>10}")
                for tp, (old, new) in plan.items():
                    print(f"{group:<20} {tp.topic:<20} {tp.partition:>9} {'-' if old is None else old:>10} {new:>10}")
                if not args.execute:
                    print("(dry run: add --execute to apply)")
    return 0


def _delete_offsets(admin, group: str, topics: list[str]) -> None:
    """kafka-consumer-groups --delete-offsets: ``--topic T`` (every partition) or ``T:0,2``."""
    from odradek.group import parse_topics
    from odradek.types import TopicPartition
    if not topics:
        raise OdradekError("--delete-offsets needs --topic T or T:P,P", ErrorCode.INVALID_REQUEST)
    tps = []
    for name, indexes in parse_topics(topics).items():
        if not indexes:
            admin.cluster.refresh([name])
            indexes = [p.partition for p in admin.cluster.partitions(name) or ()]
            if not indexes:
                raise OdradekError(f"topic '{name}' does not exist", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        tps += [TopicPartition(name, i) for i in indexes]
    failed = 0
    print(f"{'TOPIC':<30} {'PARTITION':>9}  STATUS")
    for tp, err in sorted(admin.delete_offsets(group, tps).items()):
        failed += err is not None
        print(f"{tp.topic:<30} {tp.partition:>9}  {'Successful' if err is None else 'Error: ' + err.code.name}")
    if failed:
        raise OdradekError(f"{failed} partition(s) kept their offsets (GROUP_SUBSCRIBED_TO_TOPIC: a member "
                           f"subscribes to the topic)", ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)


def _print_group_state(d: dict) -> None:
    """kafka-consumer-groups --describe --state."""
    print(f"{'GROUP':<24} {'ASSIGNMENT-STRATEGY':<20} {'STATE':<20} {'#MEMBERS':>8}")
    print(f"{d['group_id']:<24} {d.get('assignor_name') or '-':<20} {d['group_state']:<20} {len(d['members']):>8}")


def _print_members(d: dict) -> None:
    """kafka-consumer-groups --describe --members."""
    print(f"{'GROUP':<24} {'CONSUMER-ID':<40} {'HOST':<16} {'CLIENT-ID':<20} {'#PARTITIONS':>11}")
    for m in d["members"]:
        count = sum(len(a["partitions"]) for a in m["assignment"])
        print(f"{d['group_id']:<24} {m['member_id']:<40} {m['client_host'] or '-':<16} {m['client_id'] or '-':<20} "
              f"{count:>11}")


def _reset_target(args) -> tuple[str, object]:
    if args.to_earliest:
        return "earliest", None
    if args.to_latest:
        return "latest", None
    if args.shift_by is not None:
        return "shift", args.shift_by
    if args.to_offset is not None:
        return "offset", args.to_offset
    if args.to_current:
        return "current", None
    if args.by_duration:
        return "datetime", int(time.time() * 1000) - _duration_ms(args.by_duration)
    if args.to_datetime:
        import datetime
        try:
            when = datetime.datetime.fromisoformat(args.to_datetime)
        except ValueError:
            raise OdradekError(f"--to-datetime {args.to_datetime!r} is not an ISO date-time", ErrorCode.INVALID_REQUEST)
        if when.tzinfo is None:
            when = when.astimezone()  # local time, as Kafka's tool
        return "datetime", int(when.timestamp() * 1000)
    raise OdradekError("--reset-offsets needs --to-earliest, --to-latest, --to-datetime, --by-duration, --shift-by, "
                       "--to-offset or --to-current", ErrorCode.INVALID_REQUEST)


def _duration_ms(text: str) -> int:
    """An ISO-8601 duration as Kafka's --by-duration takes it (``PnDTnHnMnS``, e.g. PT1H30M)."""
    import re
    m = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", text.strip().upper())
    if not m or not any(m.groups()) or text.strip().upper().endswith("T"):
        raise OdradekError(f"--by-duration {text!r} is not an ISO-8601 duration such as PT1H or P1DT12H",
                           ErrorCode.INVALID_REQUEST)
    days, hours, minutes, seconds = (float(g or 0) for g in m.groups())
    return int((((days * 24 + hours) * 60 + minutes) * 60 + seconds) * 1000)


def _print_group(d: dict) -> None:
    dash = lambda v: "-" if v is None else v  # noqa: E731
    print(f"GROUP {d['group_id']}  state {d['group_state']}  epoch {d['group_epoch']}  "
          f"assignor {d['assignor_name'] or '-'}  members {len(d['members'])}")
    print(f"LAG is measured to the {'LAST-STABLE-OFFSET (read_committed)' if d['lag_to'] == 'last_stable' else 'LOG-END-OFFSET (read_uncommitted)'}"
          f"; --isolation {'read_uncommitted' if d['lag_to'] == 'last_stable' else 'read_committed'} for the other")
    print()
    print(f"{'TOPIC':<20} {'PARTITION':>9} {'CURRENT-OFFSET':>14} {'LOG-END-OFFSET':>14} {'LAG':>8} "
          f"{'LAST-STABLE-OFFSET':>18}  MEMBER")
    for r in d["partitions"]:
        print(f"{r['topic']:<20} {r['partition']:>9} {dash(r['committed']):>14} {dash(r['log_end']):>14} "
              f"{dash(r['lag']):>8} {dash(r['last_stable']):>18}  {dash(r['member_id'])}")
    if d["members"]:
        print()
        print(f"{'MEMBER':<34} {'INSTANCE':<12} {'HOST':<16} {'CLIENT':<18} {'EPOCH':>5}  ASSIGNMENT")
        for m in d["members"]:
            parts = ",".join(f"{a['topic']}-{p}" for a in m["assignment"] for p in a["partitions"])
            print(f"{m['member_id']:<34} {dash(m['instance_id']):<12} {m['client_host'] or '-':<16} "
                  f"{m['client_id'] or '-':<18} {m['member_epoch']:>5}  {parts or '-'}")


# ---- dump-log ---------------------------------------------------------------------------------
@_one_line_errors
def cmd_dump_log(args) -> int:
    files = []
    for path in args.paths:
        if os.path.isdir(path):
            names = sorted(n for n in os.listdir(path) if n.endswith(DUMPED))
            files += [os.path.join(path, n) for n in names]
        elif os.path.isfile(path):
            files.append(path)
        else:
            raise OdradekError(f"{path}: no such file or directory", ErrorCode.LOG_DIR_NOT_FOUND)
    out = sys.stdout
    for path in files:
        out.write(f"Dumping {path}\n")
        if path.endswith(".log"):
            dump_segment(path, out, records=not args.batches_only, max_bytes=args.max_bytes)
        elif path.endswith(".timeindex"):
            dump_index(path, out, time_index=True)
        elif path.endswith(".index"):
            dump_index(path, out, time_index=False)
        elif path.endswith(".snapshot"):
            dump_producer_snapshot(path, out)
        elif path.endswith(".txnindex"):
            dump_txn_index(path, out)
        else:
            out.write("  (not a segment file: skipped)\n")
    return 0


def _base_offset(path: str) -> int:
    stem = os.path.basename(path).split(".")[0]
    return int(stem) if stem.isdigit() else 0


def dump_segment(path: str, out, records: bool = True, max_bytes: int = 0) -> None:
    """Print each batch of a segment (and its records); a torn or zero-filled tail is reported,
    not fatal."""
    from odradek.core import records as fmt
    out.write(f"Log starting offset: {_base_offset(path)}\n")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            pos = 0
            while pos < size:
                problem = _batch_problem(buf, pos, size)
                if problem:
                    zeros = not any(buf[pos:min(size, pos + 4096)])
                    what = "zero-filled" if zeros else "invalid"
                    out.write(f"Found {size - pos} {what} bytes at position {pos} ({problem})\n")
                    return
                h = fmt.BatchHeader.read(buf, pos)
                crc_ok = fmt.crc_of(buf, pos, h.size) == h.crc
                codec = _codec_name(h)
                ts_type = "LogAppendTime" if h.log_append_time else "CreateTime"
                out.write(f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} "
                          f"baseSequence: {h.base_sequence} producerId: {h.producer_id} "
                          f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
                          f"isTransactional: {str(bool(h.attributes & fmt.TRANSACTIONAL_BIT)).lower()} "
                          f"isControl: {str(h.is_control).lower()} position: {pos} {ts_type}: {h.max_timestamp} "
                          f"size: {h.size} magic: {h.magic} compresscodec: {codec} crc: {h.crc} "
                          f"isValid: {str(crc_ok).lower()}\n")
                if records and crc_ok:
                    _dump_records(buf[pos:pos + h.size], out, max_bytes, control=h.is_control)
                pos += h.size


def _codec_name(h) -> str:
    """A batch's compression as Kafka's dump-log names it, for native and magic-2 batches."""
    from odradek.core import kafka_batch
    from odradek.core import records as fmt
    if h.magic == kafka_batch.MAGIC:
        return kafka_batch.CODECS[h.attributes & kafka_batch.COMPRESSION_MASK].upper()
    return "LZ4" if h.compression == fmt.COMPRESSION_LZ4 else "NONE"


def _batch_problem(buf, pos: int, size: int) -> str | None:
    from odradek.core import records as fmt
    if size - pos < fmt.HEADER_SIZE:
        return "partial batch header"
    h = fmt.BatchHeader.read(buf, pos)
    try:
        fmt.check_header(h, f"batch at position {pos}")
    except OdradekError as exc:
        return exc.message
    if pos + h.size > size:
        return f"batch of {h.size} bytes runs past the end of the file"
    return None


def _dump_records(data: bytes, out, max_bytes: int, control: bool = False) -> None:
    from odradek.core import records as fmt
    try:
        recs = fmt.decode_batch(data)
    except OdradekError as exc:
        out.write(f"| records do not decode: {exc.message}\n")
        return
    for r in recs:
        if control:  # a transaction marker (docs/FORMAT.md): its producer id and epoch are the batch's
            out.write(f"| offset: {r.offset} CreateTime: {r.timestamp} keySize: {_len(r.key)} "
                      f"valueSize: {_len(r.value)} {_marker(r.key, r.value)}\n")
            continue
        keys = ",".join(k for k, _ in r.headers)
        out.write(f"| offset: {r.offset} CreateTime: {r.timestamp} keySize: {_len(r.key)} valueSize: {_len(r.value)} "
                  f"headerKeys: [{keys}] key: {_show(r.key, max_bytes)} payload: {_show(r.value, max_bytes)}\n")


def _marker(key, value) -> str:
    """A control record as Kafka's dump-log prints it: ``endTxnMarker: COMMIT coordinatorEpoch: 0``."""
    if key is None or len(key) < 4:
        return "controlType: unknown (key too short)"
    version, kind = struct.unpack_from(">hh", key)
    if kind not in (0, 1):
        return f"controlType: {kind} (not a transaction marker)"
    epoch = struct.unpack_from(">hi", value)[1] if value is not None and len(value) >= 6 else "unknown"
    return f"endTxnMarker: {'COMMIT' if kind == 1 else 'ABORT'} coordinatorEpoch: {epoch}"


def dump_producer_snapshot(path: str, out) -> None:
    """A ``.snapshot`` file (docs/FORMAT.md): each producer's epoch, last timestamp, open
    transaction and last batches, as Kafka's dump-log prints its producer snapshots."""
    from odradek.log.producer_state import decode_snapshot
    with open(path, "rb") as f:
        data = f.read()
    try:
        producers = decode_snapshot(data)
    except ValueError as exc:
        out.write(f"not a producer snapshot: {exc}\n")
        return
    if not producers:
        out.write("(no producers)\n")
    for pid, e in sorted(producers.items()):
        first = e.txn_first_offset if e.txn_first_offset >= 0 else "None"
        out.write(f"producerId: {pid} producerEpoch: {e.epoch} coordinatorEpoch: -1 currentTxnFirstOffset: {first} "
                  f"lastTimestamp: {e.last_timestamp} batches: {len(e.batches)}\n")
        for b in e.batches:
            out.write(f"| firstSequence: {b.first_seq} lastSequence: {b.last_seq} firstOffset: {b.first_offset} "
                      f"lastOffset: {b.last_offset}\n")


def dump_txn_index(path: str, out) -> None:
    """The aborted-transactions index (``aborted.txnindex``, Kafka's 34-byte entries)."""
    from odradek.log import txn_index
    with open(path, "rb") as f:
        data = f.read()
    usable = len(data) - len(data) % txn_index.ENTRY.size
    for pos in range(0, usable, txn_index.ENTRY.size):
        version, pid, first, last, lso = txn_index.ENTRY.unpack_from(data, pos)
        out.write(f"version: {version} producerId: {pid} firstOffset: {first} lastOffset: {last} "
                  f"lastStableOffset: {lso}\n")
    if usable == 0:
        out.write("(no entries)\n")
    if usable != len(data):
        out.write(f"Found {len(data) - usable} bytes of a torn last entry\n")


def _len(b) -> int:
    return -1 if b is None else len(b)


def _show(b, max_bytes: int) -> str:
    if b is None:
        return "null"
    if max_bytes and len(b) > max_bytes:
        b = b[:max_bytes]
    return b.decode("utf-8", errors="backslashreplace")


def dump_index(path: str, out, time_index: bool) -> None:
    from odradek.log import index
    base = _base_offset(path)
    entry = index.TIME_ENTRY if time_index else index.OFFSET_ENTRY
    with open(path, "rb") as f:
        data = f.read()
    count = 0
    for i in range(len(data) // entry.size):
        a, b = entry.unpack_from(data, i * entry.size)
        if (a, b) == (0, 0):
            break  # the zero fill of a preallocated index ends its entries
        if time_index:
            out.write(f"timestamp: {a} offset: {base + b}\n")
        else:
            out.write(f"offset: {base + a} position: {b}\n")
        count += 1
    if count == 0:
        out.write("(no entries)\n")


# ---- leader-election ---------------------------------------------------------------------------
@_one_line_errors
def cmd_leader_election(args) -> int:
    from odradek.admin import Admin
    from odradek.types import TopicPartition
    with Admin(_bootstrap_of(args), client_id="odradek-leader-election", request_timeout_ms=TIMEOUT_MS,
               **client_properties.options_of(args)) as admin:
        wanted = None
        if args.topic:
            parts = args.partition or [p.partition for p in admin.describe_topic(args.topic).partitions]
            wanted = [TopicPartition(args.topic, p) for p in parts]
        failed = 0
        for tp, err in sorted(admin.elect_leaders(wanted).items()):
            if err is None:
                print(f"Successfully completed leader election (PREFERRED) for {tp.topic}-{tp.partition}")
            elif err.code == ErrorCode.ELECTION_NOT_NEEDED:
                print(f"Valid replica already elected for {tp.topic}-{tp.partition}")
            else:
                failed += 1
                print(f"Error completing leader election (PREFERRED) for {tp.topic}-{tp.partition}: {err.message}")
        return 1 if failed else 0
