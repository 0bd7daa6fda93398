"""The Kafka listener's transaction family: InitProducerId (22).

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
            "transaction_timeout_ms": request.get("transaction_timeout_ms", 60000),
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
