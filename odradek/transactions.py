"""``odradek transactions``: inspect transactions and abort hanging ones, like kafka-transactions.sh.

Runs in the CLI's thread, through ``odradek.cluster.Cluster`` (blocking requests to chosen
brokers): ListTransactions (66) to every broker (each lists the ids it coordinates),
FindCoordinator key_type 1 then DescribeTransactions (65) at the id's coordinator,
DescribeProducers (61) at a partition's leader, and, for ``abort``, WRITE_TXN_MARKERS (27)
at the leader as an operator (``broker_id`` -1: abort markers only; ClusterAction when the
broker has ``authorizer`` on).

    odradek transactions list
    odradek transactions describe --transactional-id T
    odradek transactions describe-producers --topic orders --partition 0
    odradek transactions find-hanging --topic orders [--partition 0] [--max-transaction-timeout 15]
    odradek transactions abort --topic orders --partition 0 --start-offset 42

A transaction is *hanging* on a partition (KIP-664) when the partition has a producer's
transaction open for longer than ``--max-transaction-timeout`` minutes (the brokers'
``transaction.max.timeout.ms``, 15 by default) that no coordinator has as an open
transaction including that partition: nothing will ever end it, and read_committed
consumers of the partition wait at its first offset. ``abort`` ends it with an abort marker
(its records become invisible to read_committed consumers).

Output is tab-separated with a header line, as Kafka's tool prints it. Errors print one line
naming the problem and exit 1.
"""
from __future__ import annotations

import sys
import time

from odradek import client_properties
from odradek.actors.messages import TxnMarker
from odradek.cluster import Cluster
from odradek.network.clientauth import ClientSecurity
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

TIMEOUT_MS = 10000
OPEN_STATES = ("Ongoing", "PrepareCommit", "PrepareAbort")


def add_parser(sub, config_args, bootstrap) -> None:
    p = sub.add_parser("transactions", help="list, describe, find hanging and abort transactions "
                                            "(like kafka-transactions.sh)")
    config_args(p)
    p.add_argument("--bootstrap-server", metavar="HOST:PORT")
    client_properties.add_arguments(p)
    cmds = p.add_subparsers(dest="txn_command", required=True)
    cmds.add_parser("list", help="every transactional id, from every broker's coordinator")
    d = cmds.add_parser("describe", help="one transactional id's state, from its coordinator")
    d.add_argument("--transactional-id", required=True)
    d = cmds.add_parser("describe-producers", help="a partition's active producers, from its leader")
    d.add_argument("--topic", required=True)
    d.add_argument("--partition", type=int, required=True)
    d = cmds.add_parser("find-hanging", help="transactions open on partitions that no coordinator will end")
    d.add_argument("--topic", required=True)
    d.add_argument("--partition", type=int, help="one partition (default: every partition of the topic)")
    d.add_argument("--max-transaction-timeout", type=int, default=15, metavar="MINUTES",
                   help="open longer than this is suspect (default 15: transaction.max.timeout.ms)")
    d = cmds.add_parser("abort", help="write an abort marker for the transaction open at --start-offset")
    d.add_argument("--topic", required=True)
    d.add_argument("--partition", type=int, required=True)
    d.add_argument("--start-offset", type=int, required=True,
                   help="the first offset of the open transaction (describe-producers, find-hanging)")
    p.set_defaults(func=lambda args: run(args, bootstrap(args)))


def run(args, bootstrap: str, out=None) -> int:
    out = out or sys.stdout
    cluster = Cluster(bootstrap, "odradek-transactions", request_timeout_ms=TIMEOUT_MS,
                      security=ClientSecurity.from_options(client_properties.options_of(args)))
    try:
        cluster.refresh([args.topic] if getattr(args, "topic", None) else [])
        command = {"list": cmd_list, "describe": cmd_describe, "describe-producers": cmd_describe_producers,
                   "find-hanging": cmd_find_hanging, "abort": cmd_abort}[args.txn_command]
        return command(cluster, args, out)
    finally:
        cluster.close()


def _table(out, header: list[str], rows: list[list]) -> None:
    out.write("\t".join(header) + "\n")
    for row in rows:
        out.write("\t".join(str(v) for v in row) + "\n")


def list_all(cluster: Cluster, producer_ids: list[int] | None = None) -> list[tuple[int, dict]]:
    """``[(coordinator, {transactional_id, producer_id, transaction_state})]`` from every broker."""
    found = []
    for node in sorted(cluster.brokers):
        body = cluster.request_node(node, ApiKey.LIST_TRANSACTIONS, {
            "state_filters": [], "producer_id_filters": producer_ids or [], "duration_filter": -1}).header["body"]
        found += [(node, s) for s in body.get("transaction_states") or ()]
    return found


def cmd_list(cluster: Cluster, args, out) -> int:
    _table(out, ["TransactionalId", "Coordinator", "ProducerId", "TransactionState"],
           [[s["transactional_id"], node, s["producer_id"], s["transaction_state"]]
            for node, s in sorted(list_all(cluster), key=lambda x: x[1]["transactional_id"])])
    return 0


def describe(cluster: Cluster, txn_id: str) -> tuple[int, dict]:
    """``(coordinator, state)`` of ``txn_id``; raises the coordinator's error."""
    coordinator = cluster.request(ApiKey.FIND_COORDINATOR, {"key": txn_id, "key_type": 1}).header["body"]["node_id"]
    if cluster.address(coordinator) is None:
        cluster.refresh([])
    body = cluster.request_node(coordinator, ApiKey.DESCRIBE_TRANSACTIONS, {"transactional_ids": [txn_id]}).header["body"]
    state = body["transaction_states"][0]
    if state.get("error_code"):
        raise OdradekError(state.get("error_message") or ErrorCode.of(state["error_code"]).meaning,
                           ErrorCode.of(state["error_code"]))
    return coordinator, state


def cmd_describe(cluster: Cluster, args, out) -> int:
    coordinator, s = describe(cluster, args.transactional_id)
    started = s["transaction_start_time_ms"]
    duration = int(time.time() * 1000) - started if started >= 0 and s["transaction_state"] in OPEN_STATES else None
    partitions = ",".join(f"{t['topic']}-{p}" for t in s["topics"] for p in t["partitions"])
    _table(out, ["CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                 "TransactionTimeoutMs", "CurrentTransactionStartTimeMs", "TransactionDurationMs", "TopicPartitions"],
           [[coordinator, s["transactional_id"], s["producer_id"], s["producer_epoch"], s["transaction_state"],
             s["transaction_timeout_ms"], started if started >= 0 else "None",
             duration if duration is not None else "None", partitions]])
    return 0


def producers(cluster: Cluster, topic: str, partition: int) -> tuple[int, list[dict]]:
    """``(leader, active producers)`` of a partition, from its leader."""
    parts = cluster.partitions(topic)
    if parts is None or not 0 <= partition < len(parts):
        raise OdradekError(f"{topic}-{partition} does not exist", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    leader = cluster.leader(topic, partition)
    body = cluster.request_node(leader, ApiKey.DESCRIBE_PRODUCERS, {
        "topics": [{"name": topic, "partition_indexes": [partition]}]}).header["body"]
    p = body["topics"][0]["partitions"][0]
    if p.get("error_code"):
        raise OdradekError(p.get("error_message") or ErrorCode.of(p["error_code"]).meaning,
                           ErrorCode.of(p["error_code"]))
    return leader, p["active_producers"]


def cmd_describe_producers(cluster: Cluster, args, out) -> int:
    _, active = producers(cluster, args.topic, args.partition)
    _table(out, ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch", "LastSequence", "LastTimestamp",
                 "CurrentTransactionStartOffset"],
           [[a["producer_id"], a["producer_epoch"], a["coordinator_epoch"], a["last_sequence"], a["last_timestamp"],
             a["current_txn_start_offset"] if a["current_txn_start_offset"] >= 0 else "None"] for a in active])
    return 0


def find_hanging(cluster: Cluster, topic: str, partitions: list[int], max_timeout_ms: int) -> list[list]:
    """``[[topic, partition, producer_id, epoch, start_offset, last_timestamp, minutes]]`` of
    the transactions open longer than ``max_timeout_ms`` that no coordinator has open on
    that partition."""
    now = int(time.time() * 1000)
    suspects = []
    for p in partitions:
        _, active = producers(cluster, topic, p)
        suspects += [(p, a) for a in active
                     if a["current_txn_start_offset"] >= 0 and now - a["last_timestamp"] > max_timeout_ms]
    if not suspects:
        return []
    open_here: set[tuple[int, int]] = set()  # (producer id, partition) a coordinator has open
    for _node, s in list_all(cluster, sorted({a["producer_id"] for _, a in suspects})):
        if s["transaction_state"] not in OPEN_STATES:
            continue
        try:
            _, state = describe(cluster, s["transactional_id"])
        except OdradekError:
            continue
        for t in state["topics"]:
            if t["topic"] == topic:
                open_here.update((state["producer_id"], q) for q in t["partitions"])
    return [[topic, p, a["producer_id"], a["producer_epoch"], a["current_txn_start_offset"], a["last_timestamp"],
             (now - a["last_timestamp"]) // 60000]
            for p, a in suspects if (a["producer_id"], p) not in open_here]


def cmd_find_hanging(cluster: Cluster, args, out) -> int:
    parts = cluster.partitions(args.topic)
    if parts is None:
        raise OdradekError(f"topic {args.topic!r} does not exist", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    wanted = [args.partition] if args.partition is not None else list(range(len(parts)))
    _table(out, ["Topic", "Partition", "ProducerId", "ProducerEpoch", "StartOffset", "LastTimestamp", "Duration(min)"],
           find_hanging(cluster, args.topic, wanted, args.max_transaction_timeout * 60000))
    return 0


def cmd_abort(cluster: Cluster, args, out) -> int:
    leader, active = producers(cluster, args.topic, args.partition)
    match = [a for a in active if a["current_txn_start_offset"] == args.start_offset]
    if not match:
        raise OdradekError(f"no transaction is open at offset {args.start_offset} of {args.topic}-{args.partition} "
                           f"(describe-producers lists the open ones)", ErrorCode.INVALID_TXN_STATE)
    a = match[0]
    marker = TxnMarker(args.topic, args.partition, a["producer_id"], a["producer_epoch"], False, 0)
    body = cluster.request_node(leader, ApiKey.WRITE_TXN_MARKERS, {
        "broker_id": -1, "broker_epoch": -1, "producer_id": a["producer_id"], "commit": False, "offsets": {},
        "markers": [marker]}).header["body"]
    for topic, partition, code, message in body.get("parts") or ():
        if code:
            raise OdradekError(f"{topic}-{partition}: {message}", ErrorCode.of(code))
    out.write(f"aborted the transaction of producer {a['producer_id']} (epoch {a['producer_epoch']}) open at offset "
              f"{args.start_offset} of {args.topic}-{args.partition}\n")
    return 0
