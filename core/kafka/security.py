"""Kafka's security APIs. Pure, no I/O.

SaslHandshake (17) and SaslAuthenticate (36) are answered by the processor that owns the
connection, through ``sasl_answer`` and the connection's ``sasl.Session``; registered here so
ApiVersions lists them. After SaslHandshake v0 the tokens come raw (size-prefixed, no header;
``framing.RAW_SASL``) and ``raw_sasl_answer`` answers them raw. DescribeAcls (29), CreateAcls
(30) and DeleteAcls (31) are translated to the internal requests the handlers serve and back.
"""
from __future__ import annotations

from odradek.core import sasl
from odradek.core.kafka import schema
from odradek.core.kafka.apis import Api, register, top_level_error
from odradek.core.protocol import ApiKey, ErrorCode

SASL_APIS = (ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE)

register(Api(ApiKey.SASL_HANDSHAKE, 0, 1))
register(Api(ApiKey.SASL_AUTHENTICATE, 0, 2))


def sasl_answer(session: sasl.Session | None, api: int, version: int, request: dict) -> tuple[dict, str | None]:
    """The response body of a SaslHandshake or SaslAuthenticate, and, when authentication
    failed, why (the processor answers after failed.authentication.delay.ms and closes)."""
    if api == ApiKey.SASL_HANDSHAKE:
        mechanisms = session.enabled if session is not None else []
        if session is None:
            return {"error_code": int(ErrorCode.ILLEGAL_SASL_STATE), "mechanisms": mechanisms}, \
                "SaslHandshake on a listener without SASL"
        problem = session.handshake(request.get("mechanism") or "")
        if problem is not None:
            return {"error_code": int(ErrorCode[problem[0]]), "mechanisms": mechanisms}, problem[1]
        return {"error_code": 0, "mechanisms": mechanisms}, None
    if session is None:
        return _auth_error(ErrorCode.ILLEGAL_SASL_STATE, "SaslAuthenticate on a listener without SASL")
    try:
        token = session.authenticate(bytes(request.get("auth_bytes") or b""))
    except sasl.IllegalState as exc:
        return _auth_error(ErrorCode.ILLEGAL_SASL_STATE, str(exc))
    except sasl.AuthenticationFailed as exc:
        return _auth_error(ErrorCode.SASL_AUTHENTICATION_FAILED, str(exc))
    return {"error_code": 0, "error_message": None, "auth_bytes": token, "session_lifetime": 0}, None


def raw_sasl_answer(session: sasl.Session | None, token: bytes) -> tuple[list, str | None]:
    """A raw token's answer after SaslHandshake v0: the server's token, size-prefixed (empty
    for PLAIN's success, as Kafka sends it), or nothing and why when it failed (the
    processor closes the connection after failed.authentication.delay.ms, as Kafka does)."""
    if session is None:
        return [], "a raw SASL token on a listener without SASL"
    try:
        out = session.authenticate(token)
    except (sasl.IllegalState, sasl.AuthenticationFailed) as exc:
        return [], str(exc)
    return [len(out).to_bytes(4, "big") + out], None


def _auth_error(code: ErrorCode, message: str) -> tuple[dict, str]:
    return {"error_code": int(code), "error_message": message, "auth_bytes": b"", "session_lifetime": 0}, message


# ---- DescribeAcls (29), CreateAcls (30), DeleteAcls (31): the internal bodies keep Kafka's names ----------

def _same(version: int, request: dict) -> tuple[dict, list]:
    return dict(request), []


def _body(version: int, request: dict, reply, payload: list) -> dict:
    return reply.body or {}


def _create_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"results": [{"error_code": code, "error_message": message} for _ in request.get("creations") or ()]}


def _delete_error(version: int, request: dict, code: int, message: str) -> dict:
    return {"filter_results": [{"error_code": code, "error_message": message, "matching_acls": []}
                               for _ in request.get("filters") or ()]}


register(Api(ApiKey.DESCRIBE_ACLS, 1, 3, _same, _body, top_level_error))
register(Api(ApiKey.CREATE_ACLS, 1, 3, _same, _body, _create_error))
register(Api(ApiKey.DELETE_ACLS, 1, 3, _same, _body, _delete_error))


def encode(api: int, version: int, body: dict) -> bytes:
    return schema.encode_response(api, version, body)


__all__ = ["SASL_APIS", "sasl_answer", "raw_sasl_answer", "encode", "top_level_error"]
