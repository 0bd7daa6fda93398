"""The HTTP proxy's clients: who a request is (``Principals``) and the v2 consumer instances
(``Instances``). Runs on the proxy actor's HTTP threads and its reaper thread; every shared
map is behind a lock, every client object is used by one thread at a time.

Who. Without SASL listeners the proxy is open like the console on loopback: every request
is served by one shared set of clients over the broker's PLAINTEXT (else SSL) listener. With
SASL listeners each request needs HTTP Basic credentials, checked against the user's stored
SCRAM credential by ``network.basic_auth`` (the schema registry's check: RFC 5802's StoredKey
compared in constant time, successes remembered while the stored credential is unchanged, a
failure delayed and logged without the password), and is served by clients that connect as
that user over the broker's SASL_PLAINTEXT (else SASL_SSL) listener, so the broker applies
the user's ACLs to what the proxy does for it, exactly as for any client of that user. A
user's clients are kept at most ``PRINCIPALS_MAX`` at once (the least recently used closed
first) and ``PRINCIPAL_IDLE`` seconds unused; other credentials of a kept user (a new
password) get new clients. The password is recognised by a keyed hash; in clear it is held
only in memory by the user's clients (they need it to connect again), never logged nor
written.

Consumers. A v2 consumer instance is a bundled ``Consumer`` in its group, owned by the
principal that created it (another principal is answered 40403, as for an unknown one); at
most ``INSTANCES_MAX`` live at once (42901 beyond) and one unused ``INSTANCE_IDLE`` seconds
is closed (leaving its group), as Confluent's ``consumer.instance.timeout.ms``.
"""
from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import secrets
import threading
import time
from typing import Any, Callable

from odradek.network import basic_auth, listeners
from odradek.observe.proxy_http import ProxyError
from odradek.types import TopicPartition

log = logging.getLogger("odradek.proxy")

PRINCIPALS_MAX = 32  # users whose clients are kept at once
PRINCIPAL_IDLE = 300.0  # seconds: a user's clients unused this long are closed
INSTANCES_MAX = 100  # v2 consumer instances at once, every principal together
INSTANCE_IDLE = 300.0  # seconds: Confluent's consumer.instance.timeout.ms default
CLIENT_TIMEOUT_MS = 30000
FETCH_MAX_BYTES = 8 << 20  # an instance's fetch answers (the bundled consumer's default, 50 MiB, times 100 instances)
ANONYMOUS = ""


class Principal:
    """One user's (or, without SASL, everyone's) Kafka clients, made on first use."""

    def __init__(self, user: str, address: str, security: dict, digest: bytes, now: float):
        self.user, self.address, self.security, self.digest = user, address, security, digest
        self.used = now
        self._lock = threading.Lock()
        self._producer = self._admin = None

    def producer(self):
        with self._lock:
            if self._producer is None:
                from odradek.producer import Producer
                self._producer = Producer(self.address, client_id="odradek-http-proxy", acks="all", linger_ms=1,
                                          request_timeout_ms=CLIENT_TIMEOUT_MS, delivery_timeout_ms=60000,
                                          max_block_ms=10000, **self.security)
            return self._producer

    def admin(self):
        with self._lock:
            if self._admin is None:
                from odradek.admin import Admin
                self._admin = Admin(self.address, client_id="odradek-http-proxy",
                                    request_timeout_ms=CLIENT_TIMEOUT_MS, **self.security)
            return self._admin

    def consumer(self, group: str, name: str, auto_offset_reset: str, auto_commit: bool):
        from odradek.consumer import Consumer
        return Consumer(self.address, client_id=f"odradek-http-proxy-{name}"[:200], group_id=group,
                        auto_offset_reset=auto_offset_reset, enable_auto_commit=auto_commit,
                        fetch_max_bytes=FETCH_MAX_BYTES, request_timeout_ms=CLIENT_TIMEOUT_MS, **self.security)

    def close(self) -> None:
        with self._lock:
            for client in (self._producer, self._admin):
                if client is not None:
                    try:
                        client.close(5) if client is self._producer else client.close()
                    except Exception:  # closing: nothing more to do for it
                        log.debug("proxy: closing a client of %s failed", self.user or "everyone", exc_info=True)
            self._producer = self._admin = None


class Principals:
    """Authenticates requests and hands out each principal's clients (module docstring)."""

    def __init__(self, config: dict, auth, status: Callable[[], dict], clock=time.monotonic):
        self.config = config
        self.auth = auth  # network.basic_auth.BasicAuth
        self.status = status  # the supervisor's info (the bound listeners), asked on the actor's loop
        self.clock = clock
        self.sasl = any(l.sasl for l in listeners.of_config(config))
        self._key = secrets.token_bytes(32)  # tells a user's passwords apart without keeping them
        self._lock = threading.Lock()
        self._kept: collections.OrderedDict[str, Principal] = collections.OrderedDict()

    def of(self, environ: dict) -> Principal:
        """The principal of a request; ProxyError 401 40101 without valid credentials."""
        if not self.sasl:
            return self._get(ANONYMOUS, None, b"")
        header = environ.get("HTTP_AUTHORIZATION")
        given = basic_auth.parse(header)
        if given is None or self.auth.principal(header, environ.get("REMOTE_ADDR") or "?", "http proxy") is None:
            raise ProxyError(401, 40101, "Unauthorized: this proxy needs the HTTP Basic credentials of a SCRAM user "
                                         "of the broker (curl -u user:password)" if given is None else
                                         "Unauthorized: wrong user name or password")
        user, password = given
        digest = hmac.new(self._key, f"{user}\0{password}".encode("utf-8", "surrogatepass"), hashlib.sha256).digest()
        return self._get(user, password, digest)

    def _get(self, user: str, password: str | None, digest: bytes) -> Principal:
        """The kept clients of ``user`` with these credentials, else new ones."""
        with self._lock:
            p = self._kept.get(user)
            if p is not None and hmac.compare_digest(p.digest, digest):
                p.used = self.clock()
                self._kept.move_to_end(user)
                return p
        fresh = Principal(user, *self._connection(user, password), digest, self.clock())
        with self._lock:
            old = self._kept.get(user)
            if old is not None and hmac.compare_digest(old.digest, digest):
                return old  # another request of the user made it meanwhile (``fresh`` has no client yet)
            self._kept.pop(user, None)
            self._kept[user] = fresh
            dropped = [old] if old is not None else []
            while len(self._kept) > PRINCIPALS_MAX:
                dropped.append(self._kept.popitem(last=False)[1])
        for d in dropped:
            d.close()
        return fresh

    def _connection(self, user: str, password: str | None) -> tuple[str, dict]:
        """Where and how a principal's clients connect: as ``user`` over a SASL listener, or
        (no SASL) over PLAINTEXT, else SSL with the broker's own TLS settings."""
        sup = self.status()
        if not sup.get("address"):
            raise ProxyError(503, 50003, "the broker is still starting; retry")
        found = listeners.own_client(self.config, sup.get("listeners") or {}, user if password is not None else None,
                                     password)
        if found is None:
            raise ProxyError(503, 50003, "the broker has no PLAINTEXT or SSL listener for the proxy" if password is None
                             else "the broker has no SASL listener for the proxy's users")
        return found

    def expire(self) -> None:
        now = self.clock()
        with self._lock:
            idle = [u for u, p in self._kept.items() if now - p.used > PRINCIPAL_IDLE]
            dropped = [self._kept.pop(u) for u in idle]
        for p in dropped:
            p.close()

    def close(self) -> None:
        with self._lock:
            dropped, self._kept = list(self._kept.values()), collections.OrderedDict()
        for p in dropped:
            p.close()

    def __len__(self) -> int:
        return len(self._kept)


# ---- v2 consumer instances ------------------------------------------------------------------
class Instance:
    """One v2 consumer instance: its consumer, the records polled but not yet handed out (a
    ``max_bytes`` answer stops early), and the next offset of what was handed out per
    partition (what a commit without a body commits)."""

    def __init__(self, group: str, name: str, owner: str, fmt: str, consumer, now: float):
        self.group, self.name, self.owner, self.format = group, name, owner, fmt
        self.consumer = consumer
        self.lock = threading.Lock()  # one request at a time on an instance
        self.used = now
        self.pending: collections.deque = collections.deque()
        self.handed: dict[TopicPartition, int] = {}
        self.topics: list[str] = []

    def close(self) -> None:
        try:
            self.consumer.close()
        except Exception:  # closing: nothing more to do for it
            log.debug("proxy: closing consumer instance %s/%s failed", self.group, self.name, exc_info=True)


class Instances:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._live: dict[tuple[str, str], Instance] = {}

    def create(self, principal: Principal, group: str, body: Any) -> Instance:
        body = body if body is not None else {}
        if not isinstance(body, dict):
            raise ProxyError(400, 40001, "the body must be a JSON object")
        name = body.get("name") if body.get("name") is not None else f"rest-consumer-{secrets.token_hex(8)}"
        fmt = str(body.get("format") or "binary").lower()
        reset = str(body.get("auto.offset.reset") or "latest").lower()
        auto_commit = str(body.get("auto.commit.enable", "true")).lower() == "true"
        if not isinstance(name, str) or not name or len(name) > 249 or "/" in name:
            raise ProxyError(422, 42204, "name must be a non-empty string of at most 249 characters, without '/'")
        if fmt not in ("binary", "json"):
            raise ProxyError(422, 42204, f"format {fmt!r} is not served: binary or json (an avro instance: read "
                                         f"binary and decode with the registry)")
        if reset not in ("earliest", "latest", "none"):
            raise ProxyError(422, 42204, "auto.offset.reset must be earliest, latest or none")
        key = (group, name)
        with self._lock:
            if key in self._live:
                raise ProxyError(409, 40902, f"Consumer instance {name!r} of group {group!r} already exists")
            if len(self._live) >= INSTANCES_MAX:
                raise ProxyError(429, 42901, f"this proxy already holds {INSTANCES_MAX} consumer instances: delete "
                                             f"unused ones (idle ones end after {INSTANCE_IDLE:g} s)")
            self._live[key] = None  # the name is taken while the consumer is made
        try:
            consumer = principal.consumer(group, name, reset, auto_commit)
        except BaseException:
            with self._lock:
                self._live.pop(key, None)
            raise
        instance = Instance(group, name, principal.user, fmt, consumer, self.clock())
        with self._lock:
            self._live[key] = instance
        log.info("http proxy: consumer instance %s/%s created for %s", group, name, principal.user or "everyone")
        return instance

    def get(self, principal: Principal, group: str, name: str) -> Instance:
        with self._lock:
            instance = self._live.get((group, name))
        if instance is None or instance.owner != principal.user:
            raise ProxyError(404, 40403, f"Consumer instance {name!r} of group {group!r} not found (deleted, never "
                                         f"created, or idle longer than {INSTANCE_IDLE:g} s)")
        instance.used = self.clock()
        return instance

    def delete(self, principal: Principal, group: str, name: str) -> None:
        instance = self.get(principal, group, name)
        with self._lock:
            self._live.pop((group, name), None)
        with instance.lock:
            instance.close()

    def expire(self) -> None:
        now = self.clock()
        with self._lock:
            idle = [k for k, i in self._live.items() if i is not None and now - i.used > INSTANCE_IDLE]
            dropped = [self._live.pop(k) for k in idle]
        for instance in dropped:
            log.info("http proxy: consumer instance %s/%s idle for %g s: closed", instance.group, instance.name,
                     INSTANCE_IDLE)
            with instance.lock:
                instance.close()

    def close(self) -> None:
        with self._lock:
            dropped, self._live = [i for i in self._live.values() if i is not None], {}
        for instance in dropped:
            instance.close()

    def __len__(self) -> int:
        return len(self._live)
