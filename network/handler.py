"""RequestHandler: stateless API logic (``num.io.threads`` of them run, as a scalable pool).

Runs in its own process (actor ``handler-<i>``). It owns nothing but its configuration:
any handler can answer any request, so the pool can grow, shrink and restart freely.

Messages it accepts: ``request {api, v, client, conn, peer, body}`` + payload frames, from
a processor. It answers the processor (``reply_to``) with ``_reply {body}`` + frames, or
``_error {code, message}``; a later API may instead forward the request to the actor that
owns the data (that actor then answers the processor). It sends ``scale`` and ``status``
requests to the supervisor for the dynamic broker config ``num.io.threads``, answering the
client from the callback: nothing here blocks.

Dispatch is one flat table, ``API -> method``; each method parses the body, acts, replies.
A body of the wrong shape gets INVALID_REQUEST naming the field; the handler survives
anything a client sends (the runtime turns an unexpected exception into an
UNKNOWN_SERVER_ERROR reply and keeps serving).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from actors.message import Message
from actors.runtime import Actor
from network.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.handler")

# API -> (min version, max version). ApiVersions reports exactly this table.
SUPPORTED: dict[ApiKey, tuple[int, int]] = {
    ApiKey.METADATA: (0, 0),
    ApiKey.API_VERSIONS: (0, 0),
    ApiKey.DESCRIBE_CONFIGS: (0, 0),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (0, 0),
    ApiKey.PING: (0, 0),
}

# Broker configs that IncrementalAlterConfigs may change at run time.
DYNAMIC_CONFIGS = {"num.io.threads"}
SCALE_TIMEOUT = 60.0  # seconds the supervisor has to add or retire handlers


class BadRequest(OdradekError):
    code = ErrorCode.INVALID_REQUEST


def field(body: dict, name: str, kind: type | tuple, default: Any = ...) -> Any:
    """``body[name]`` checked against ``kind``; a missing optional field gives ``default``."""
    if name not in body or body[name] is None:
        if default is ...:
            raise BadRequest(f"missing field '{name}'")
        return default
    value = body[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRequest(f"field '{name}' must be {names}, got {type(value).__name__}")
    return value


class RequestHandler(Actor):
    def __init__(self, name, run_dir, args=None, supervisor=None, **kw):
        super().__init__(name, run_dir, args, supervisor, **kw)
        self.config: dict = dict(self.args.get("config", {}))
        self.broker_id = int(self.args.get("broker_id", self.config.get("broker.id", 0)))
        self.advertised = _advertised(self.config)
        self.dispatch: dict[int, Callable[[Message, dict], None]] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.PING: self.ping,
            ApiKey.DESCRIBE_CONFIGS: self.describe_configs,
            ApiKey.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
        }

    # ---- the one entry point -------------------------------------------------------------
    def on_request(self, msg: Message) -> None:
        fields = msg.fields or {}
        api, version, body = fields.get("api"), fields.get("v", 0), fields.get("body")
        method = self.dispatch.get(api)
        if method is None:
            raise OdradekError(f"unknown API key {api!r}", ErrorCode.INVALID_REQUEST)
        low, high = SUPPORTED[api]
        if not isinstance(version, int) or not low <= version <= high:
            raise OdradekError(f"{ApiKey(api).name} (key {api}) supports versions {low} to {high}, "
                               f"got {version!r}", ErrorCode.UNSUPPORTED_VERSION)
        if not isinstance(body, dict):
            raise BadRequest(f"{ApiKey(api).name}: the request body must be a map")
        method(msg, body)

    # ---- APIs ----------------------------------------------------------------------------
    def ping(self, msg: Message, body: dict) -> None:
        self.reply(msg, {"body": body}, msg.frames)

    def api_versions(self, msg: Message, body: dict) -> None:
        apis = [{"api_key": int(k), "name": k.name, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in SUPPORTED.items()]
        self.reply(msg, {"body": {"error_code": 0, "api_keys": apis}})

    def metadata(self, msg: Message, body: dict) -> None:
        requested = field(body, "topics", list, None)
        topics = []
        for name in requested or []:
            if not isinstance(name, str):
                raise BadRequest(f"field 'topics' must be a list of strings, got {type(name).__name__}")
            topics.append({"name": name, "error_code": int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                           "error_message": f"topic '{name}' does not exist", "partitions": []})
        if self.advertised[1] == 0:  # listening on an ephemeral port: learn it once
            self._ask_status(lambda status: self._learn_address(status) or self._metadata(msg, topics))
        else:
            self._metadata(msg, topics)

    def _metadata(self, msg: Message, topics: list) -> None:
        host, port = self.advertised
        self.reply(msg, {"body": {
            "cluster_id": self.config.get("cluster.id", "odradek"),
            "controller_id": self.broker_id,
            "brokers": [{"node_id": self.broker_id, "host": host, "port": port}],
            "topics": topics,
        }})

    def describe_configs(self, msg: Message, body: dict) -> None:
        resources = self._broker_resources(body)

        def answer(status: Message) -> None:
            live = self._handler_count(status)
            out = []
            for res, problem in resources:
                if problem:
                    out.append(problem)
                    continue
                wanted = res.get("configs")
                names = sorted(self.config) if not wanted else [
                    c["name"] if isinstance(c, dict) else c for c in wanted]
                configs = []
                for name in names:
                    if name not in self.config:
                        continue
                    value = live if name == "num.io.threads" and live else self.config[name]
                    configs.append({"name": name, "value": str(value), "dynamic": name in DYNAMIC_CONFIGS})
                out.append({"type": "broker", "name": res["name"], "error_code": 0, "error_message": "",
                            "configs": configs})
            self.reply(msg, {"body": {"resources": out}})

        self._ask_status(answer)

    def incremental_alter_configs(self, msg: Message, body: dict) -> None:
        resources = self._broker_resources(body)
        results, scale_to = [], None
        for res, problem in resources:
            if problem:
                results.append(problem)
                continue
            try:
                scale_to = self._check_alter(res.get("configs") or []) or scale_to
            except OdradekError as exc:
                results.append(_resource_error(res["name"], exc.code, exc.message))
                continue
            results.append({"type": "broker", "name": res["name"], "error_code": 0, "error_message": ""})
        if scale_to is None:
            self.reply(msg, {"body": {"resources": results}})
            return

        def scaled(reply: Message) -> None:
            for r in results:
                if r["error_code"] == 0 and reply.is_error:
                    r["error_code"], r["error_message"] = reply.error_code, reply.error_message
            self.reply(msg, {"body": {"resources": results}})

        self.request(self.supervisor, "scale", {"role": "handler", "count": scale_to}, callback=scaled,
                     timeout=SCALE_TIMEOUT)

    # ---- helpers ---------------------------------------------------------------------------
    def _broker_resources(self, body: dict) -> list[tuple[dict, dict | None]]:
        """The request's resources, each with None or its per-resource error."""
        out = []
        for res in field(body, "resources", list):
            if not isinstance(res, dict):
                raise BadRequest("field 'resources' must be a list of maps")
            name = str(res.get("name", ""))
            if res.get("type") != "broker":
                out.append((res, _resource_error(name, ErrorCode.INVALID_REQUEST,
                                                 f"resource type {res.get('type')!r} is not supported "
                                                 f"(only 'broker')")))
            elif name not in ("", str(self.broker_id)):
                out.append((res, _resource_error(name, ErrorCode.INVALID_REQUEST,
                                                 f"this is broker {self.broker_id}, not {name!r}")))
            else:
                out.append(({**res, "name": str(self.broker_id)}, None))
        return out

    def _check_alter(self, configs: list) -> int | None:
        """Validate a resource's changes; the new handler count, if any. Raises INVALID_CONFIG."""
        count = None
        for c in configs:
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise BadRequest("each config must be a map with a 'name'")
            name, value, op = c["name"], c.get("value"), c.get("op", "set")
            if name not in DYNAMIC_CONFIGS:
                raise OdradekError(f"'{name}' is not a dynamic broker config (dynamic: "
                                   f"{', '.join(sorted(DYNAMIC_CONFIGS))})", ErrorCode.INVALID_CONFIG)
            if op != "set":
                raise OdradekError(f"operation {op!r} on '{name}' is not supported (only 'set')",
                                   ErrorCode.INVALID_CONFIG)
            try:
                count = int(str(value).strip())
            except ValueError:
                raise OdradekError(f"'{name}' must be an integer, got {value!r}", ErrorCode.INVALID_CONFIG) from None
            if not 1 <= count <= 64:
                raise OdradekError(f"'{name}' must be from 1 to 64, got {count}", ErrorCode.INVALID_CONFIG)
        return count

    def _ask_status(self, callback: Callable[[Message], None]) -> None:
        """The supervisor's status (live pool size, bound address), without blocking."""
        if self.supervisor:
            self.request(self.supervisor, "status", callback=callback, timeout=5.0)
        else:
            callback(Message("_error", 0, None, {"code": -1, "message": "no supervisor"}))

    def _learn_address(self, status: Message) -> None:
        address = (status.fields or {}).get("supervisor", {}).get("address") if not status.is_error else None
        if address and self.advertised[1] == 0:
            host, _, port = str(address).rpartition(":")
            if not self.config.get("advertised.listeners"):
                self.advertised = (host, int(port))
            else:
                self.advertised = (self.advertised[0], int(port))

    @staticmethod
    def _handler_count(status: Message) -> int | None:
        if status.is_error:
            return None
        actors = (status.fields or {}).get("actors") or []
        return sum(1 for a in actors if a.get("role") == "handler" and a.get("state") not in ("retiring", "stopped"))


def _resource_error(name: str, code: int, message: str) -> dict:
    return {"type": "broker", "name": name, "error_code": int(code), "error_message": message}


def _advertised(config: dict) -> tuple[str, int]:
    from network.acceptor import parse_listener
    listener = config.get("advertised.listeners") or config.get("listeners") or "PLAINTEXT://127.0.0.1:9092"
    return parse_listener(listener)
