"""The schema registry's REST front: Confluent's Schema Registry API as a WSGI application.

Runs on the registry actor's HTTP threads (waitress). It touches no registry state: it turns
a request into an operation on the ``SchemaRegistry`` (a function of it) and hands it to
``submit(op, write)``, which runs it on the actor's loop and returns the answer (or raises
``RegistryError``). ``write`` operations return a ``schema_registry.Plan`` whose records the
actor stores before the answer is sent.

Authentication and ACLs (``Gate``), once the broker has SASL users: every request needs
HTTP Basic with a user's password, checked against the stored SCRAM credentials
(``network.basic_auth``, the HTTP proxy's check too); without it 401 (40101) with
``WWW-Authenticate``. With ``authorizer`` on, reads (GET, lookup, compatibility checks) need
only an authenticated user; a registration under ``<topic>-key`` or ``<topic>-value`` needs
Write on that topic or Alter on the cluster; every other write (deletes, levels, modes)
needs Alter on the cluster; else 403 (40301). docs/SCHEMAS.md, docs/SECURITY.md.

Bodies: JSON, at most ``MAX_BODY`` bytes; a bad body is 422 with code 42201 (Confluent's
"unprocessable entity") or 400 (not JSON), a larger one 413. Answers are
``application/vnd.schemaregistry.v1+json``; errors ``{"error_code", "message"}``.
"""
from __future__ import annotations

import json
import logging
from typing import Any, Callable
from urllib.parse import parse_qs

from odradek.actors import http_listener
from odradek.coordinator.schema_formats import protobuf_descriptor
from odradek.coordinator.schema_registry import RegistryError, SchemaRegistry
from odradek.network.authorizer import CLUSTER
from odradek.network.basic_auth import BasicAuth, challenge
from odradek.network.guard import Guard

log = logging.getLogger("odradek.schemas")

MAX_BODY = 4 * 1024 * 1024  # bytes of one request body (a schema with its JSON quoting)
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
STATUS = {200: "200 OK", 400: "400 Bad Request", 401: "401 Unauthorized", 403: "403 Forbidden", 404: "404 Not Found", 405: "405 Method Not Allowed",
          409: "409 Conflict", 413: "413 Payload Too Large", 415: "415 Unsupported Media Type",
          422: "422 Unprocessable Entity", 500: "500 Internal Server Error", 504: "504 Gateway Timeout"}
SCHEMA_TYPES = ["JSON", "PROTOBUF", "AVRO"]
REALM = "odradek schema registry"
OFFSET_HEADER = "X-Odradek-Schemas-Offset"  # cluster mode: _schemas-0's offset a write's answer reflects
SUBJECT_SUFFIXES = ("-key", "-value")  # Confluent's TopicNameStrategy: the topic a subject's schema is for

Op = Callable[[SchemaRegistry], Any]


class Forward(Exception):
    """What the loop answers on a broker that does not lead ``_schemas``-0 (cluster mode): the
    request goes to broker ``broker_id``'s registry, whose answer is the client's."""

    def __init__(self, broker_id: int):
        super().__init__(broker_id)
        self.broker_id = broker_id


def _flag(query: dict, name: str) -> bool:
    return (query.get(name) or ["false"])[0].lower() == "true"


def route(method: str, parts: list[str], query: dict, body: Any) -> tuple[Op, bool]:
    """``(op, write)`` for a request; raises RegistryError for an unknown one."""
    deleted, permanent = _flag(query, "deleted"), _flag(query, "permanent")
    n = len(parts)
    head = parts[0] if parts else ""
    if method == "GET":
        if n == 0:
            return (lambda r: {}), False
        if parts == ["subjects"]:
            return (lambda r: r.subject_names(deleted)), False
        if head == "subjects" and n == 3 and parts[2] == "versions":
            return (lambda r: r.versions(parts[1], deleted)), False
        if head == "subjects" and n == 4 and parts[2] == "versions":
            return (lambda r: r.get(parts[1], parts[3], deleted).body()), False
        if head == "subjects" and n == 5 and parts[2] == "versions" and parts[4] == "schema":
            return (lambda r: json.loads(r.get(parts[1], parts[3], deleted).schema)), False
        if head == "schemas" and n == 3 and parts[1] == "ids":
            return (lambda r: r.schema(parts[2])), False
        if head == "schemas" and n == 4 and parts[1] == "ids" and parts[3] == "schema":
            return (lambda r: json.loads(r.schema(parts[2])["schema"])), False
        if head == "schemas" and n == 4 and parts[1] == "ids" and parts[3] == "versions":
            return (lambda r: r.id_versions(parts[2])), False
        if parts == ["schemas", "types"]:
            return (lambda r: SCHEMA_TYPES), False
        if head == "config" and n <= 2:
            subject = parts[1] if n == 2 else None
            default = _flag(query, "defaultToGlobal") or subject is None
            return (lambda r: _level(r, subject, default)), False
        if head == "mode" and n <= 2:
            subject = parts[1] if n == 2 else None
            return (lambda r: {"mode": r.mode(subject)}), False
    elif method == "POST":
        if head == "subjects" and n == 3 and parts[2] == "versions":
            return (lambda r: r.register(parts[1], body)), True
        if head == "subjects" and n == 2:
            return (lambda r: r.lookup(parts[1], body, deleted)), False
        if head == "compatibility" and n in (4, 5) and parts[1] == "subjects" and parts[3] == "versions":
            version = parts[4] if n == 5 else None  # None: the versions the subject's level names
            verbose = _flag(query, "verbose")
            return (lambda r: _compatible(r.check(parts[2], body, version), verbose)), False
    elif method == "PUT":
        if head == "config" and n <= 2:
            return (lambda r: r.set_level(parts[1] if n == 2 else None, body)), True
        if head == "mode" and n <= 2:
            return (lambda r: r.set_mode(parts[1] if n == 2 else None, body)), True
    elif method == "DELETE":
        if head == "subjects" and n == 2:
            return (lambda r: r.delete_subject(parts[1], permanent)), True
        if head == "subjects" and n == 4 and parts[2] == "versions":
            return (lambda r: r.delete_version(parts[1], parts[3], permanent)), True
        if head == "config" and n == 2:
            return (lambda r: r.delete_level(parts[1])), True
    raise RegistryError(404, 404, f"no such endpoint: {method} /{'/'.join(parts)} (docs/SCHEMAS.md lists them)")


def _level(r: SchemaRegistry, subject: str | None, default_to_global: bool) -> dict:
    if subject is not None and subject not in r.levels and not default_to_global:
        raise RegistryError(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")
    return {"compatibilityLevel": r.level(subject)}


def _compatible(why: list[str], verbose: bool) -> dict:
    return {"is_compatible": not why, **({"messages": why} if verbose else {})}


class Gate:
    """Who may do what on the registry (the module's docstring): ``authenticate`` raises 401,
    ``authorize`` 403."""

    def __init__(self, config: dict, data_dir: str):
        self.auth, self.guard = BasicAuth(config, data_dir), Guard(config, data_dir)

    def authenticate(self, environ: dict) -> str | None:
        """The request's principal (None: no authentication asked for)."""
        if not self.auth.required():
            return None
        principal = self.auth.principal(environ.get("HTTP_AUTHORIZATION"), environ.get("REMOTE_ADDR") or "",
                                        "schema registry")
        if principal is None:
            raise RegistryError(401, 40101, "Unauthorized: HTTP Basic with a user name and password of the "
                                            "broker's SCRAM users is required")
        return principal

    def authorize(self, principal: str | None, host: str, method: str, parts: list[str], write: bool) -> None:
        if principal is None or not write or not self.guard.enabled:
            return
        az = self.guard.authorizer()
        if az.authorize(principal, host, "Alter", "Cluster", CLUSTER):
            return
        if method == "POST" and len(parts) == 3 and parts[0] == "subjects":
            topic = next((parts[1][:-len(s)] for s in SUBJECT_SUFFIXES if parts[1].endswith(s)), None)
            if topic and az.authorize(principal, host, "Write", "Topic", topic):
                return
            raise RegistryError(403, 40301, f"{principal} may not register schemas under '{parts[1]}': it needs "
                                            f"Write on the topic the subject names (<topic>-key, <topic>-value) "
                                            f"or Alter on the cluster")
        raise RegistryError(403, 40301, f"{principal} may not {method} /{'/'.join(parts)}: it needs Alter on "
                                        f"the cluster")


def make_app(submit: Callable[[Op, bool], Any], gate: Gate | None = None, forward=None,
             position: Callable[[], int] | None = None):
    """The WSGI application; ``submit(op, write)`` runs ``op`` on the actor's loop; ``gate``
    authenticates and authorizes each request first; ``forward(broker_id, environ, body)``
    sends it to another broker's registry when the loop answers ``Forward`` (its status and
    answer); ``position()``, the offset of ``_schemas``-0 the state has reached, is sent with
    the answer to a write (``OFFSET_HEADER``: a forwarding broker waits until it has it too)."""

    def app(environ, start_response):
        extra: list = []
        try:
            status, answer = _serve(environ, submit, gate, forward, position, extra)
        except RegistryError as exc:
            status, answer = exc.status, {"error_code": exc.code, "message": exc.message}
        except Exception:  # a bug here, not the client's fault: say so, keep serving
            log.exception("schema registry: %s %s failed", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
            status, answer = 500, {"error_code": 50001, "message": "internal error of the registry (logged)"}
        data = json.dumps(answer).encode()
        headers = [("Content-Type", CONTENT_TYPE), ("Content-Length", str(len(data)))] + extra
        start_response(STATUS.get(status, f"{status} Error"), headers + ([challenge(REALM)] if status == 401 else []))
        return [data]

    return app


def _serve(environ: dict, submit, gate: Gate | None, forward, position, extra: list) -> tuple[int, Any]:
    method = environ.get("REQUEST_METHOD", "GET")
    parts = [p for p in (environ.get("PATH_INFO") or "/").split("/") if p]
    query = parse_qs(environ.get("QUERY_STRING") or "")
    # authenticated before the body is read or the route known: a stranger learns nothing
    principal = gate.authenticate(environ) if gate is not None else None
    body = _body(environ) if method in ("POST", "PUT") else None
    op, write = route(method, parts, query, body)
    if gate is not None:
        gate.authorize(principal, environ.get("REMOTE_ADDR") or "", method, parts, write)
    try:
        answer = submit(op, write)
        if method == "GET" and (query.get("format") or [""])[0] == "serialized":  # here, not on the loop
            answer = _serialized(answer)
        if write and position is not None:
            extra.append((OFFSET_HEADER, str(position())))
        return 200, answer
    except Forward as to:
        if forward is None:
            raise RegistryError(500, 50003, "this registry cannot forward requests") from None
        return forward(to.broker_id, environ, body)


def _serialized(answer: Any) -> Any:
    """A Protobuf schema registered as .proto text, answered as the base64 serialized
    ``FileDescriptorProto`` ``?format=serialized`` asks for (as it is when it cannot be built)."""
    if isinstance(answer, dict) and answer.get("schemaType") == "PROTOBUF" and isinstance(answer.get("schema"), str):
        try:
            built = protobuf_descriptor(answer["schema"])
        except Exception:  # noqa: BLE001 - the stored text parsed once; answer it as stored rather than fail
            log.exception("schema registry: cannot build the descriptor of a stored Protobuf schema")
            built = None
        if built is not None:
            return {**answer, "schema": built}
    return answer


def _body(environ: dict) -> Any:
    body = http_listener.read_json(environ, MAX_BODY, lambda status, why: RegistryError(status, status, why))
    return {} if body is None else body
