"""``odradek reassign``: move partitions between brokers, like kafka-reassign-partitions.

Runs in the CLI's thread, through ``odradek.admin.Admin`` (AlterPartitionReassignments,
ListPartitionReassignments, IncrementalAlterConfigs of the brokers' throttle rates).

    odradek reassign --generate --topic orders --broker-list 2,3,4 [--replication-factor 2]
    odradek reassign --execute --reassignment-json-file plan.json [--throttle 50000000]
    odradek reassign --verify [--reassignment-json-file plan.json]   # removes the throttles when done
                                                                     # (no file: every move in progress)
    odradek reassign --cancel --reassignment-json-file plan.json
    odradek reassign --list
    odradek reassign --decommission 1 [--throttle 50000000]         # everything off broker 1

The plan is Kafka's JSON, ``{"version": 1, "partitions": [{"topic", "partition", "replicas"}]}``.
``--generate`` places each topic as topic creation does (Kafka's assignment over the given
brokers, rack-alternating when they all have ``broker.rack``) and prints the current
assignment (keep it: executing it rolls back) and the proposal. ``--throttle`` (bytes/s)
sets both replication throttled rates on every live broker and, as Kafka's tool, the moved
topics' throttled replica lists (leader: each moving partition's current replicas; follower:
those being added), so the rate holds only the move's traffic. ``--verify`` removes the lists
once the plan's moves are done and the rates once nothing is moving; ``--cancel`` does both
(as Kafka's without ``--preserve-throttles``). A move is listed by the controller until every
broker's metadata shows its end, so what ``--verify`` then reads is final. The moves run in
the controller (docs/REPLICATION.md).
"""
from __future__ import annotations

import json
import random
import sys

from odradek import client_properties
from odradek.coordinator.reassignment import assign_replicas, assign_replicas_rack_aware
from odradek.core.protocol import ErrorCode, OdradekError
from odradek.types import TopicPartition

THROTTLES = ("leader.replication.throttled.rate", "follower.replication.throttled.rate")
THROTTLED_REPLICAS = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")
TIMEOUT_MS = 10000


def add_parser(sub, config_args, bootstrap) -> None:
    p = sub.add_parser("reassign", help="move partitions between brokers, change replication factors, "
                                        "decommission a broker (like kafka-reassign-partitions)")
    config_args(p)
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    client_properties.add_arguments(p)
    g = p.add_mutually_exclusive_group(required=True)
    for action in ("generate", "execute", "verify", "cancel", "list"):
        g.add_argument(f"--{action}", action="store_true")
    g.add_argument("--decommission", type=int, metavar="BROKER", help="move every replica off this broker")
    p.add_argument("--reassignment-json-file", metavar="FILE", help="the plan (execute, verify, cancel)")
    p.add_argument("--topic", action="append", default=[], help="generate: a topic to place (repeatable)")
    p.add_argument("--topics-to-move-json-file", metavar="FILE", help='generate: {"topics": [{"topic": T}]}')
    p.add_argument("--broker-list", metavar="IDS", help="generate: the brokers to place on, e.g. 2,3,4")
    p.add_argument("--replication-factor", type=int, help="generate: a new replication factor")
    p.add_argument("--throttle", type=int, metavar="BYTES_PER_S", help="execute, decommission: replication throttle")
    p.set_defaults(func=lambda args: run(args, bootstrap(args)))


# ---- plans (pure) --------------------------------------------------------------------------------
def plan_json(assignment: dict) -> str:
    return json.dumps({"version": 1, "partitions": [{"topic": tp.topic, "partition": tp.partition,
                                                     "replicas": list(r)} for tp, r in sorted(assignment.items())]})


def parse_plan(text: str) -> dict[TopicPartition, list[int]]:
    try:
        d = json.loads(text)
        plan = {TopicPartition(p["topic"], int(p["partition"])): [int(r) for r in p["replicas"]]
                for p in d["partitions"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise OdradekError(f"the reassignment JSON is not {{\"partitions\": [{{\"topic\", \"partition\", "
                           f"\"replicas\"}}]}}: {exc!r}", ErrorCode.INVALID_REQUEST) from None
    if not plan:
        raise OdradekError("the reassignment JSON lists no partitions", ErrorCode.INVALID_REQUEST)
    return plan


def generate(current: dict, brokers: list[int], racks: dict, rf: int | None = None,
             rng: random.Random | None = None) -> dict[TopicPartition, list[int]]:
    """A placement of every partition of ``current``'s topics over ``brokers``, per topic as at
    creation (random start, rack-aware when every broker has a rack); ``rf`` changes the
    replication factor."""
    rng = rng or random.Random()
    brokers = sorted(brokers)
    out = {}
    for topic in sorted({tp.topic for tp in current}):
        parts = sorted(tp.partition for tp in current if tp.topic == topic)
        want = rf or len(current[TopicPartition(topic, parts[0])])
        if want > len(brokers):
            raise OdradekError(f"topic '{topic}': replication factor {want} needs at least {want} brokers, "
                               f"got {brokers}", ErrorCode.INVALID_REPLICATION_FACTOR)
        start, shift = rng.randrange(len(brokers)), rng.randrange(len(brokers))
        if all(racks.get(b) for b in brokers):
            placed = assign_replicas_rack_aware({b: racks[b] for b in brokers}, len(parts), want, start, shift)
        else:
            placed = assign_replicas(brokers, len(parts), want, start, shift)
        out.update({TopicPartition(topic, p): r for p, r in zip(parts, placed)})
    return out


def decommission(current: dict, broker: int, live: list[int], racks: dict) -> dict[TopicPartition, list[int]]:
    """Moves that take ``broker`` out of every replica set: each of its replicas goes to the
    least loaded broker not already holding the partition (on a rack the partition does not
    use yet, where racks allow); the other replicas keep their order, so the preferred leader
    is one already in sync. Only the partitions that change."""
    others = [b for b in live if b != broker]
    load = {b: 0 for b in others}
    for replicas in current.values():
        for r in replicas:
            if r in load:
                load[r] += 1
    out = {}
    for tp, replicas in sorted(current.items()):
        if broker not in replicas:
            continue
        kept = [r for r in replicas if r != broker]
        candidates = [b for b in others if b not in kept]
        if not candidates:
            raise OdradekError(f"{tp.topic}-{tp.partition} has {len(replicas)} replicas and no other broker can "
                               f"take broker {broker}'s (live: {live})", ErrorCode.INVALID_REPLICATION_FACTOR)
        used = {racks.get(r) for r in kept}
        new = min(candidates, key=lambda b: (racks.get(b) in used and bool(racks.get(b)), load[b], b))
        load[new] += 1
        out[tp] = kept + [new]
    return out


def throttled_replicas(plan: dict, current: dict) -> dict[str, dict[str, str]]:
    """The topic configs that throttle ``plan``'s moves, as Kafka's tool sets them: per topic,
    ``leader.replication.throttled.replicas`` names each moving partition's current replicas
    (``partition:broker``) and ``follower.replication.throttled.replicas`` its new ones."""
    out: dict[str, dict[str, list]] = {}
    for tp, target in sorted(plan.items()):
        now = current.get(tp, [])
        if sorted(now) == sorted(target):
            continue
        lists = out.setdefault(tp.topic, {k: [] for k in THROTTLED_REPLICAS})
        lists[THROTTLED_REPLICAS[0]] += [f"{tp.partition}:{b}" for b in now]
        lists[THROTTLED_REPLICAS[1]] += [f"{tp.partition}:{b}" for b in target if b not in now]
    return {t: {k: ",".join(v) for k, v in lists.items()} for t, lists in out.items()}


# ---- the command -----------------------------------------------------------------------------------
def run(args, bootstrap: str) -> int:
    from odradek.admin import Admin
    with Admin(bootstrap, client_id="odradek-reassign", request_timeout_ms=TIMEOUT_MS,
               **client_properties.options_of(args)) as admin:
        if args.list:
            return _list(admin)
        if args.generate:
            return _generate(admin, args)
        if args.decommission is not None:
            current = current_assignment(admin, admin.list_topics(include_internal=True))
            plan = decommission(current, args.decommission, sorted(admin.broker_racks()), admin.broker_racks())
            if not plan:
                print(f"Broker {args.decommission} holds no replicas.")
                return 0
            return _execute(admin, plan, args.throttle)
        if args.verify and not args.reassignment_json_file:
            return _verify(admin, {})  # every move in progress (a --decommission's, say)
        plan = parse_plan(_read(args.reassignment_json_file, "--reassignment-json-file"))
        if args.execute:
            return _execute(admin, plan, args.throttle)
        if args.cancel:
            return _cancel(admin, plan)
        return _verify(admin, plan)


def _read(path: str | None, flag: str) -> str:
    if not path:
        raise OdradekError(f"{flag} is required here", ErrorCode.INVALID_REQUEST)
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        raise OdradekError(f"cannot read {flag} {path}: {exc.strerror}", ErrorCode.INVALID_REQUEST) from None


def current_assignment(admin, topics) -> dict[TopicPartition, list[int]]:
    return {TopicPartition(t, p.partition): list(p.replicas) for t in topics
            for p in admin.describe_topic(t).partitions}


def _generate(admin, args) -> int:
    topics = list(args.topic)
    if args.topics_to_move_json_file:
        try:
            topics += [t["topic"] for t in json.loads(_read(args.topics_to_move_json_file,
                                                             "--topics-to-move-json-file"))["topics"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise OdradekError(f'--topics-to-move-json-file must be {{"topics": [{{"topic": T}}]}}: {exc!r}',
                               ErrorCode.INVALID_REQUEST) from None
    if not topics or not args.broker_list:
        raise OdradekError("--generate needs --topic (or --topics-to-move-json-file) and --broker-list",
                           ErrorCode.INVALID_REQUEST)
    try:
        brokers = [int(b) for b in args.broker_list.split(",")]
    except ValueError:
        raise OdradekError(f"--broker-list must be comma-separated broker ids, got {args.broker_list!r}",
                           ErrorCode.INVALID_REQUEST) from None
    current = current_assignment(admin, topics)
    print(f"Current partition replica assignment\n{plan_json(current)}\n")
    print(f"Proposed partition reassignment configuration\n"
          f"{plan_json(generate(current, brokers, admin.broker_racks(), args.replication_factor))}")
    return 0


def _execute(admin, plan: dict, throttle: int | None) -> int:
    current = current_assignment(admin, sorted({tp.topic for tp in plan}))
    missing = [tp for tp in plan if tp not in current]
    if missing:
        raise OdradekError(f"no such partitions: {', '.join(f'{t}-{p}' for t, p in missing)}",
                           ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    print("Current partition replica assignment\n\n" + plan_json({tp: current[tp] for tp in plan}) +
          "\n\nSave this to use as the --reassignment-json-file option during rollback")
    if throttle is not None:
        _set_throttles(admin, throttle)
        for topic, lists in throttled_replicas(plan, current).items():
            admin.alter_configs(topic, set=lists)
        print(f"Throttle limit set to {throttle} B/s on brokers {','.join(map(str, sorted(admin.broker_racks())))}"
              f" for the replicas moved; run --verify when the move is done to remove it")
    errors = admin.alter_partition_reassignments(plan)
    return _report(errors, "started partition reassignments")


def _cancel(admin, plan: dict) -> int:
    status = _report(admin.alter_partition_reassignments({tp: None for tp in plan}),
                     "cancelled partition reassignments")
    _clear_topic_throttles(admin, sorted({tp.topic for tp in plan}))
    if not set(admin.list_partition_reassignments()) - set(plan):  # (the cancelled ones end at once)
        _clear_throttles(admin)
    return status


def _report(errors: dict, done: str) -> int:
    ok = sorted(tp for tp, e in errors.items() if e is None)
    if ok:
        print(f"Successfully {done} for {','.join(f'{t}-{p}' for t, p in ok)}")
    for (t, p), e in sorted((tp, e) for tp, e in errors.items() if e is not None):
        print(f"Error for partition {t}-{p}: {e.message} ({e.code.name})", file=sys.stderr)
    return 1 if len(ok) < len(errors) else 0


def _verify(admin, plan: dict) -> int:
    moving = admin.list_partition_reassignments()
    current = current_assignment(admin, sorted({tp.topic for tp in plan}))
    status = 0
    print("Status of partition reassignment:")
    for tp in sorted(set(moving) - set(plan)):
        print(f"Reassignment of partition {tp.topic}-{tp.partition} is still in progress.")
    for tp, target in sorted(plan.items()):
        if tp in moving:
            print(f"Reassignment of partition {tp.topic}-{tp.partition} is still in progress.")
        elif current.get(tp) == target:
            print(f"Reassignment of partition {tp.topic}-{tp.partition} is completed.")
        else:
            status = 1
            print(f"There is no active reassignment of partition {tp.topic}-{tp.partition}, but replica set is "
                  f"{current.get(tp)} rather than {target}.")
    if plan and not set(plan) & set(moving):
        _clear_topic_throttles(admin, sorted({tp.topic for tp in plan}))
    if not moving:
        if not plan:  # every move is done: no topic needs its lists
            _clear_topic_throttles(admin, admin.list_topics(include_internal=True), only_set=True)
        _clear_throttles(admin)
    return status


def _list(admin) -> int:
    moving = admin.list_partition_reassignments()
    if not moving:
        print("No partition reassignments found.")
    for tp, m in sorted(moving.items()):
        print(f"{tp.topic}-{tp.partition}: replicas: {m['replicas']}. adding: {m['adding_replicas']}. "
              f"removing: {m['removing_replicas']}.")
    return 0


def _set_throttles(admin, rate: int) -> None:
    if rate < 1:
        raise OdradekError(f"--throttle must be a positive number of bytes per second, got {rate}",
                           ErrorCode.INVALID_CONFIG)
    for b in sorted(admin.broker_racks()):
        admin.alter_configs(str(b), set={name: rate for name in THROTTLES}, resource_type="broker")


def _clear_throttles(admin) -> None:
    brokers = sorted(admin.broker_racks())
    for b in brokers:
        admin.alter_configs(str(b), delete=THROTTLES, resource_type="broker")
    print(f"Clearing broker-level throttles on brokers {','.join(map(str, brokers))}")


def _clear_topic_throttles(admin, topics: list[str], only_set: bool = False) -> None:
    """Remove the throttled replica lists of ``topics`` (``only_set``: of those that have one)."""
    if only_set:
        topics = [t for t in topics if any(c.source == "topic" for c in admin.describe_configs(t, THROTTLED_REPLICAS))]
    for t in topics:
        admin.alter_configs(t, delete=THROTTLED_REPLICAS)
    if topics:
        print(f"Clearing topic-level throttles on topics {','.join(topics)}")
