"""The Kafka listener's transaction family: InitProducerId (22), AddPartitionsToTxn (24),
AddOffsetsToTxn (25), EndTxn (26), TxnOffsetCommit (28, served by the group coordinator).

Pure, no I/O; registers itself in ``network.kafka.apis`` (the families tuple at the end of
that module imports it). The internal request is the native API of the same key
(docs/PROTOCOL.md), served by the transaction coordinator actor.
"""
from __future__ import annotations

from odradek.network.kafka.apis import Api, register
from odradek.network.protocol import ApiKey


# ---- InitProducerId (22) ---------------------------------------------------------------------------

def init_producer_id_to_internal(version: int, request: dict) -> tuple[dict, list]:
    return {"transactional_id": request.get("transactional_id"),
            "transaction_timeout_ms": request.get("transaction_timeout", 60000),  # kio: ms, as an int
            "producer_id": request.get("producer_id", -1),
            "producer_epoch": request.get("producer_epoch", -1)}, []


def init_producer_id_from_internal(version: int, request: dict, reply: dict, payload: list) -> dict:
    body = reply.get("body") or {}
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


def add_partitions_from_internal(version: int, request: dict, reply: dict, payload: list) -> dict:
    body = reply.get("body") or {}
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


def error_code_from_internal(version: int, request: dict, reply: dict, payload: list) -> dict:
    return {"error_code": (reply.get("body") or {}).get("error_code", 0)}


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


def txn_offset_commit_from_internal(version: int, request: dict, reply: dict, payload: list) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [
        {"partition_index": p["partition_index"], "error_code": p.get("error_code", 0)} for p in t["partitions"]]}
        for t in (reply.get("body") or {}).get("topics") or ()]}


def txn_offset_commit_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"topics": [{"name": t["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": code}
                                                          for p in t["partitions"]]}
                       for t in request.get("topics") or ()]}


register(Api(ApiKey.TXN_OFFSET_COMMIT, 0, 3, txn_offset_commit_to_internal, txn_offset_commit_from_internal,
             txn_offset_commit_error))
