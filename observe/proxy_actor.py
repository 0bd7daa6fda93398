"""The HTTP proxy actor: Confluent REST Proxy's v3 produce and v2 consumers on a listener of its
own (docs/SCHEMAS.md, "HTTP proxy").

Process: ``http_proxy`` (one per broker).
Owns: the listener ``http.proxy.listener`` (empty: the actor idles) and its HTTP server
(``actors.http_listener``: waitress; WSGI application ``observe.proxy_http``), the principals'
Kafka clients and v2 consumer instances (``observe.proxy_clients``), and a reaper thread that
closes idle ones every ``REAP_INTERVAL`` seconds.
Accepts: nothing of its own.
Sends: ``status`` to the supervisor (the bound listeners, the registry's address), handed to the
loop with ``post()`` and awaited at most ``STATUS_TIMEOUT``.
Invariants: HTTP threads never touch the actor's sockets; they talk to this broker with the
bundled clients over its own listeners, so SASL and ACLs apply as to any client, and read
schemas from the registry over HTTP with the request's own ``Authorization``.
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request

from odradek.actors import http_listener
from odradek.actors.message import Message
from odradek.actors.messages import Status
from odradek.actors.runtime import Actor
from odradek.network.basic_auth import BasicAuth
from odradek.core.protocol import http_address
from odradek.observe.proxy_clients import Instances, Principals
from odradek.observe.proxy_http import MAX_BODY, ProxyError, make_app

log = logging.getLogger("odradek.proxy")

STATUS_TIMEOUT = 5.0  # seconds an HTTP thread waits for the supervisor's status through the loop
REAP_INTERVAL = 5.0  # seconds between two looks for idle consumer instances and users
REGISTRY_TIMEOUT = 10.0  # seconds a schema look-up at the registry may take
SCHEMAS_CACHED = 1000  # schemas by id kept (an id's schema never changes)
# 16 workers: a v2 records request may hold one for its timeout. waitress refuses (413, its own
# text) a body past MAX_BODY + 1 MiB before the application sees it; the application refuses
# one past MAX_BODY with Confluent's error body.
HTTP_SETTINGS = http_listener.http_settings("odradek-http-proxy", MAX_BODY + (1 << 20), threads=16)


class HttpProxyActor(Actor):
    # ---- start -------------------------------------------------------------------------
    def on_start(self) -> None:
        self.config = self.args["config"]
        self.server = None
        self.host = self.port = None
        self.principals = self.instances = None
        self._reaper_stop = threading.Event()
        self._schemas: collections.OrderedDict = collections.OrderedDict()
        self._schemas_lock = threading.Lock()
        self._sup_info: dict | None = None
        address = http_address(self.config.get("http.proxy.listener"), self.config["listeners"])
        if address is None:
            log.info("http.proxy.listener is empty: no HTTP proxy")
            return
        self.principals = Principals(self.config, BasicAuth(self.config, self.args["data_dir"]),
                                     self._supervisor_info)
        self.instances = Instances()
        app = make_app(self.principals, self.instances, self.config.get("cluster.id", "odradek"), self._schema)
        try:
            self.server, self.host, self.port = http_listener.serve(app, address, HTTP_SETTINGS, "http-proxy")
        except OSError as exc:  # the broker serves Kafka clients all the same; say why there is no proxy
            log.error("http.proxy.listener %s:%d cannot be bound (%s): no HTTP proxy; set it to a free address, "
                      "or empty to turn it off", *address, exc.strerror or exc)
            return
        threading.Thread(target=self._reap, name="http-proxy-reaper", daemon=True).start()
        log.info("HTTP proxy on http://%s:%d/ (%s)", self.host, self.port,
                 "HTTP Basic as a SCRAM user" if self.principals.sasl else "open: no SASL listener")

    def on_stop(self) -> None:
        self._reaper_stop.set()
        http_listener.stop(self.server)
        for owner in (self.instances, self.principals):
            if owner is not None:
                owner.close()

    def ready_fields(self) -> dict:
        return {"proxy_host": self.host, "proxy_port": self.port}

    def stats(self) -> dict:
        return {"consumer_instances": len(self.instances or ()), "principals": len(self.principals or ())}

    def _reap(self) -> None:
        while not self._reaper_stop.wait(REAP_INTERVAL):
            try:
                self.instances.expire()
                self.principals.expire()
            except Exception:  # a bug: logged, the next round tries again
                log.exception("http proxy: closing idle clients failed")

    # ---- called from HTTP threads ----------------------------------------------------------
    def _supervisor_info(self) -> dict:
        """The supervisor's info (bound listeners, the registry's URL), asked on the loop
        once the broker is ready, then kept (the ports stay: a restarted acceptor rebinds them)."""
        if self._sup_info is not None:
            return self._sup_info
        future: concurrent.futures.Future = concurrent.futures.Future()

        def answered(reply: Message) -> None:
            if not future.done():
                future.set_result({} if reply.is_error else reply.fields.supervisor)

        self.post(lambda: self.request(self.supervisor, Status(), callback=answered, timeout=STATUS_TIMEOUT))
        try:
            info = future.result(STATUS_TIMEOUT + 1)
        except concurrent.futures.TimeoutError:
            raise ProxyError(503, 50003, "the broker did not say where its listeners are in time; retry") from None
        if info.get("address"):
            self._sup_info = info
        return info

    def _schema(self, kind: str, ref, authorization: str | None) -> dict:
        """A schema from the registry: by id (kept) or by (subject, version)."""
        if kind == "id":
            with self._schemas_lock:
                found = self._schemas.get(ref)
            if found is not None:
                return found
            path = f"/schemas/ids/{int(ref)}"
        else:
            subject, version = ref
            path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions/{urllib.parse.quote(version, safe='')}"
        found = self._registry_get(path, authorization)
        if kind == "id":
            found = {**found, "id": int(ref)}
            with self._schemas_lock:
                self._schemas[int(ref)] = found
                while len(self._schemas) > SCHEMAS_CACHED:
                    self._schemas.popitem(last=False)
        return found

    def _registry_get(self, path: str, authorization: str | None) -> dict:
        url = self._supervisor_info().get("schema_registry")
        if not url:
            raise ProxyError(400, 40001, "this broker serves no schema registry (schema.registry.listener): "
                                         "send schema-encoded values as BINARY")
        headers = {"Accept": "application/vnd.schemaregistry.v1+json"}
        if authorization:
            headers["Authorization"] = authorization  # the registry checks the same user
        try:
            with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers),
                                        timeout=REGISTRY_TIMEOUT) as resp:
                return json.loads(resp.read(MAX_BODY))
        except urllib.error.HTTPError as exc:  # the registry's own status and code (40401 subject, 40403 schema)
            try:
                answer = json.loads(exc.read(64 * 1024))
                code, why = int(answer.get("error_code")), answer.get("message")
            except (ValueError, TypeError, AttributeError):
                code, why = exc.code * 100, exc.reason
            raise ProxyError(exc.code, code, f"the schema registry answered: {why}") from None
        except (OSError, ValueError) as exc:
            raise ProxyError(500, 50003, f"the schema registry cannot be read: {exc}") from None
