"""The Kafka listener's transaction family, served by the transaction coordinator actor. Pure.

InitProducerId (22), AddPartitionsToTxn (24), AddOffsetsToTxn (25), EndTxn (26),
TxnOffsetCommit (28), and kafka-transactions.sh's DescribeProducers (61), DescribeTransactions
(65), ListTransactions (66). Registered in ``core.kafka.apis`` on import; each becomes the
native API of the same key (docs/PROTOCOL.md).
"""
from __future__ import annotations

from odradek.core.kafka.apis import Api, register
from odradek.core.protocol import ApiKey


# ---- InitProducerId (22) ---------------------------------------------------------------------------

def init_producer_id_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"transactional_id": request.get("transactional_id"),
            "transaction_timeout_ms": request.get("transaction_timeout", 60000),  # kio: ms, as an int
            "producer_id": request.get("producer_id", -1),
            "producer_epoch": request.get("producer_epoch", -1)}, []


def init_producer_id_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"error_code": body.get("error_code", 0), "producer_id": body.get("producer_id", -1),
            "producer_epoch": body.get("producer_epoch", -1)}


def init_producer_id_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "producer_id": -1, "producer_epoch": -1}


register(Api(ApiKey.INIT_PRODUCER_ID, 0, 4, init_producer_id_to_internal, init_producer_id_from_internal,
             init_producer_id_error))


# ---- AddPartitionsToTxn (24), v0-3 (v4+ is the brokers' batched form, KIP-890) -----------------

def add_partitions_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"transactional_id": request.get("v3_and_below_transactional_id"),
            "producer_id": request.get("v3_and_below_producer_id"),
            "producer_epoch": request.get("v3_and_below_producer_epoch"),
            "topics": [{"name": t["name"], "partitions": list(t["partitions"])}
                       for t in request.get("v3_and_below_topics") or ()]}, []


def add_partitions_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"results_by_topic_v3_and_below": [{"name": t["name"], "results_by_partition": t["results"]}
                                              for t in body.get("results") or ()]}


def add_partitions_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"results_by_topic_v3_and_below": [
        {"name": t["name"], "results_by_partition": [{"partition_index": p, "partition_error_code": code}
                                                     for p in t["partitions"]]}
        for t in request.get("v3_and_below_topics") or ()]}


register(Api(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 3, add_partitions_to_internal,
             add_partitions_from_internal, add_partitions_error))


# ---- AddOffsetsToTxn (25), EndTxn (26): the same fields both ways -------------------------------

def _same_fields(*names):
    def to_internal(version: int, request: dict) -> tuple[dict, list]:
        return {n: request.get(n) for n in names}, []
    return to_internal


def error_code_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"error_code": (reply.body or {}).get("error_code", 0)}


def error_code_only(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code}


register(Api(ApiKey.ADD_OFFSETS_TO_TXN, 0, 3,
             _same_fields("transactional_id", "producer_id", "producer_epoch", "group_id"),
             error_code_from_internal, error_code_only))
register(Api(ApiKey.END_TXN, 0, 3, _same_fields("transactional_id", "producer_id", "producer_epoch", "committed"),
             error_code_from_internal, error_code_only))


# ---- TxnOffsetCommit (28), served by the group coordinator ---------------------------------------

def txn_offset_commit_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"transactional_id": request.get("transactional_id"), "group_id": request.get("group_id"),
            "producer_id": request.get("producer_id"), "producer_epoch": request.get("producer_epoch"),
            "topics": [{"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "committed_offset": p["committed_offset"],
                 "committed_leader_epoch": p.get("committed_leader_epoch", -1),
                 "committed_metadata": p.get("committed_metadata")} for p in t["partitions"]]}
                for t in request.get("topics") or ()]}, []


def txn_offset_commit_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [
        {"partition_index": p["partition_index"], "error_code": p.get("error_code", 0)} for p in t["partitions"]]}
        for t in (reply.body or {}).get("topics") or ()]}


def txn_offset_commit_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": code}
                                                          for p in t["partitions"]]}
                       for t in request.get("topics") or ()]}


register(Api(ApiKey.TXN_OFFSET_COMMIT, 0, 3, txn_offset_commit_to_internal, txn_offset_commit_from_internal,
             txn_offset_commit_error))


# ---- DescribeProducers (61), DescribeTransactions (65), ListTransactions (66): the admin APIs ---
# (kafka-transactions.sh; KIP-664). The internal bodies use Kafka's field names, times in ms.

def describe_producers_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"topics": [{"name": t["name"], "partition_indexes": list(t["partition_indexes"])}
                       for t in request.get("topics") or ()]}, []


def describe_producers_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"topics": (reply.body or {}).get("topics") or []}


def describe_producers_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [
        {"partition_index": p, "error_code": code, "error_message": message, "active_producers": []}
        for p in t["partition_indexes"]]} for t in request.get("topics") or ()]}


register(Api(ApiKey.DESCRIBE_PRODUCERS, 0, 0, describe_producers_to_internal, describe_producers_from_internal,
             describe_producers_error))


def describe_transactions_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    return {"transaction_states": [
        {"error_code": s["error_code"], "transactional_id": s["transactional_id"],
         "transaction_state": s["transaction_state"], "transaction_timeout": s["transaction_timeout_ms"],
         # an id in error gets Kafka's schema defaults (0), as Kafka's broker answers it
         "transaction_start_time": s["transaction_start_time_ms"] if not s["error_code"] else 0,
         "producer_id": s["producer_id"],
         "producer_epoch": s["producer_epoch"], "topics": s["topics"]}
        for s in (reply.body or {}).get("transaction_states") or ()]}


def describe_transactions_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"transaction_states": [{"error_code": code, "transactional_id": t, "transaction_state": "",
                                    "transaction_timeout": 0, "transaction_start_time": 0, "producer_id": -1,
                                    "producer_epoch": -1, "topics": []}
                                   for t in request.get("transactional_ids") or ()]}


register(Api(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0, _same_fields("transactional_ids"),
             describe_transactions_from_internal, describe_transactions_error))


def list_transactions_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"state_filters": list(request.get("state_filters") or ()),
            "producer_id_filters": list(request.get("producer_id_filters") or ()),
            "duration_filter": request.get("duration_filter", -1) if version >= 1 else -1}, []


def list_transactions_from_internal(version: int, request: dict, reply, payload: list) -> dict:
    body = reply.body or {}
    return {"error_code": body.get("error_code", 0), "unknown_state_filters": body.get("unknown_state_filters") or [],
            "transaction_states": body.get("transaction_states") or []}


def list_transactions_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"error_code": code, "unknown_state_filters": [], "transaction_states": []}


register(Api(ApiKey.LIST_TRANSACTIONS, 0, 1, list_transactions_to_internal, list_transactions_from_internal,
             list_transactions_error))
