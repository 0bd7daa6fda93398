"""The web console's sign-in and its ACLs (docs/SECURITY.md, "The web console").

Runs on the metrics actor's HTTP server threads (``observe.console`` asks it); owns the
console's sessions, in this process's memory only. Sends and accepts no message: it reads
the broker's SCRAM credentials and ACLs where the processors and handlers read them
(``network.secstore``, through ``network.guard.Guard``: a file under ``log.dirs`` or
ZooKeeper in cluster mode), so a user added or an ACL changed applies to the console as it
does to clients.

When: the console asks for a user name and password when the admin listener is reachable
from beyond loopback, or as soon as the broker has SASL users. The password is checked
against the user's stored SCRAM credential (the password itself is never stored nor
logged); a failed check waits ``failed.authentication.delay.ms``, as a failed SASL
authentication does, and is logged as an ``audit:`` line without the password.

A session is a random 256-bit token in a cookie that is HttpOnly and SameSite=Strict; it
ends ``SESSION_IDLE`` seconds after its last use, ``SESSION_MAX`` after the sign-in, or at
sign-out; at most ``SESSIONS_MAX`` are kept (the oldest ends first). Every POST must carry
the session's own CSRF token (a form field; compared in constant time) and must not come
from another origin (``Origin``/``Referer``), which also covers the sign-in form itself.

ACLs: the signed-in user is the principal ``User:<name>``; with ``authorizer`` on, each page
and action needs what the same request would need from a Kafka client (``may``), and
lists show only the topics and groups the user may Describe.
"""
from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import threading
import time
from urllib.parse import urlsplit

from odradek.network import secstore
from odradek.network.basic_auth import BasicAuth
from odradek.network.guard import Guard

log = logging.getLogger("odradek.console")

COOKIE = "odradek_session"
SESSION_IDLE = 3600  # seconds: a session unused this long ends
SESSION_MAX = 12 * 3600  # seconds: and every session ends this long after its sign-in
SESSIONS_MAX = 1000  # sessions kept at once; a new one ends the oldest


def loopback(host: str) -> bool:
    """True if ``host`` (the admin listener's address) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Session:
    __slots__ = ("token", "user", "csrf", "began", "used", "clients", "basic")

    def __init__(self, user: str, clients, now: float, basic: str | None = None):
        self.token = secrets.token_urlsafe(32)
        self.csrf = secrets.token_urlsafe(32)
        self.user = user
        self.began = self.used = now
        self.clients = clients  # the console's broker clients acting as this user (or shared ones)
        self.basic = basic  # HTTP Basic as this user, for the broker's other HTTP listeners (the registry)

    @property
    def principal(self) -> str:
        return f"User:{self.user}"


class SignIn:
    def __init__(self, config: dict, data_dir: str, host: str, clock=time.monotonic):
        self.users = secstore.Users(data_dir, config)
        self.acls = secstore.Acls(data_dir, config)  # read for the console's ACL page
        self.guard = Guard(config, data_dir)
        self.beyond_loopback = not loopback(host)
        self.delay = config.get("failed.authentication.delay.ms", 100) / 1000
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.basic = BasicAuth(config, data_dir, self.users)  # the broker's HTTP listeners' one password check

    def required(self) -> bool:
        return self.beyond_loopback or bool(self.users.data())

    def check(self, user: str, password: str) -> bool:
        """True if ``password`` is ``user``'s (against the stored SCRAM credential; an unknown
        user takes as long as a wrong password)."""
        return self.basic.verify(user, password)

    def failed(self, user: str, peer: str) -> None:
        log.warning("audit: console: sign-in as %r from %s failed (wrong user name or password)", user[:256], peer)
        time.sleep(self.delay)

    def begin(self, user: str, clients, basic: str | None = None) -> Session:
        now = self.clock()
        session = Session(user, clients, now, basic)
        with self._lock:
            self._expire(now)
            while len(self._sessions) >= SESSIONS_MAX:
                self._drop(next(iter(self._sessions)))  # dicts keep insertion order: the oldest
            self._sessions[session.token] = session
        log.info("console: %s signed in", session.principal)
        return session

    def find(self, token: str | None) -> Session | None:
        """The live session of a cookie's token (its last use now), or None."""
        if not token:
            return None
        now = self.clock()
        with self._lock:
            session = self._sessions.get(token)
            if session is None:
                return None
            if now - session.used > SESSION_IDLE or now - session.began > SESSION_MAX:
                self._drop(token)
                return None
            session.used = now
            return session

    def end(self, token: str) -> None:
        with self._lock:
            self._drop(token)

    def _expire(self, now: float) -> None:
        for token in [t for t, s in self._sessions.items()
                      if now - s.used > SESSION_IDLE or now - s.began > SESSION_MAX]:
            self._drop(token)

    def _drop(self, token: str) -> None:
        session = self._sessions.pop(token, None)
        if session is not None and session.clients is not None and getattr(session.clients, "own", False):
            session.clients.close()

    # ---- what a session may do -------------------------------------------------------
    def may(self, session: Session | None, operation: str, resource: str, name: str, host: str) -> bool:
        """Whether the signed-in user may ``operation`` the resource, as the broker's handlers
        decide it (always, with ``authorizer`` off or no sign-in)."""
        if session is None or not self.guard.enabled:
            return True
        return self.guard.authorizer().authorize(session.principal, host, operation, resource, name)

    @staticmethod
    def csrf_ok(session: Session | None, given: str) -> bool:
        return session is not None and hmac.compare_digest(session.csrf.encode(), (given or "").encode())


def same_origin(headers, host: str) -> bool:
    """False if the request says it comes from another origin than ``host`` (the Host header):
    a browser sends ``Origin`` (or at least ``Referer``) with a form's POST."""
    source = headers.get("Origin") or headers.get("Referer")
    if source is None:
        return True  # not a browser's cross-site form: the CSRF token still decides
    if source == "null":
        return False
    return urlsplit(source).netloc == host
