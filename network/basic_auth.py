"""HTTP Basic authentication against the broker's SCRAM credentials, for the HTTP listeners other
than the console (the schema registry, the HTTP proxy): every HTTP front accepts the same users
and passwords as the Kafka listeners (docs/SECURITY.md).

Runs in the HTTP server threads of the actor serving the listener; no message. Credentials come
from ``network.secstore`` as the processors read them, so a change applies at the next request.
``BasicAuth.verify`` derives the StoredKey (RFC 5802) and compares in constant time
(``sasl.check_password``), SCRAM-SHA-512's credential first, then SCRAM-SHA-256's.
Invariants: an unknown user costs the same time (a decoy credential is checked); a success is
remembered (at most ``CACHE_SIZE``) under a keyed hash of user, password and StoredKey, so a
changed or deleted credential is checked again; a failure waits
``failed.authentication.delay.ms`` and is logged ``audit:`` with the user, never the password.
"""
from __future__ import annotations

import base64
import binascii
import collections
import hashlib
import hmac
import logging
import secrets
import threading
import time

from odradek.core import sasl
from odradek.network import secstore

log = logging.getLogger("odradek.audit")

MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")  # a user's first one that exists is checked
CACHE_SIZE = 1024  # successful (user, password) checks remembered
MAX_HEADER = 4096  # characters of an Authorization header read


def challenge(realm: str) -> tuple[str, str]:
    """The ``WWW-Authenticate`` header of a 401 answer."""
    return "WWW-Authenticate", f'Basic realm="{realm}", charset="UTF-8"'


def parse(header: str | None) -> tuple[str, str] | None:
    """``(user, password)`` of an ``Authorization: Basic`` header, or None if there is none or
    it is malformed."""
    if not header or len(header) > MAX_HEADER:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        text = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    user, sep, password = text.partition(":")
    return (user, password) if sep and user else None


class BasicAuth:
    def __init__(self, config: dict, data_dir: str, users: secstore.Users | None = None):
        self.users = users or secstore.Users(data_dir, config)
        self.delay = config.get("failed.authentication.delay.ms", 100) / 1000
        self._key = secrets.token_bytes(32)  # the cache's keys mean nothing outside this process
        self._decoy = sasl.scram_credential("SCRAM-SHA-512", secrets.token_hex(16))
        self._cache: collections.OrderedDict[bytes, str] = collections.OrderedDict()
        self._lock = threading.Lock()

    def required(self) -> bool:
        """Authentication is asked for as soon as the broker has SASL users."""
        return bool(self.users.data())

    def verify(self, user: str, password: str) -> bool:
        """True if ``password`` is ``user``'s, checked against the stored SCRAM credential."""
        for mechanism in MECHANISMS:
            credential = self.users.lookup(user, mechanism)
            if credential:
                break
        else:
            sasl.check_password(self._decoy, "SCRAM-SHA-512", password)  # the time a real check takes
            return False
        key = hmac.new(self._key, f"{mechanism}\0{user}\0{password}".encode("utf-8", "surrogatepass"),
                       hashlib.sha256).digest()
        stored = credential["stored_key"]
        with self._lock:
            if self._cache.get(key) == stored:
                self._cache.move_to_end(key)
                return True
        if not sasl.check_password(credential, mechanism, password):
            return False
        with self._lock:
            self._cache[key] = stored
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return True

    def principal(self, header: str | None, peer: str, what: str) -> str | None:
        """``User:<name>`` for a request's ``Authorization`` header whose password checks, else
        None (a failure with credentials is logged and delayed; ``what`` names the listener)."""
        given = parse(header)
        if given is None:
            return None
        user, password = given
        if self.verify(user, password):
            return f"User:{user}"
        log.warning("audit: %s: authentication as %r from %s failed (wrong user name or password)",
                    what, user[:256], peer)
        time.sleep(self.delay)
        return None
