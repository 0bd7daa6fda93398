"""SASL mechanisms, server and client sides: PLAIN (RFC 4616) and SCRAM-SHA-256/512 (RFC 5802,
RFC 7677) as Kafka speaks them. Pure: credentials come through a lookup function
(network/secstore.py keeps them on disk).

Server side: ``server(mechanism, lookup, fake)`` returns an object whose ``step(token)``
consumes the client's token and returns the server's; ``done`` and ``user`` tell the outcome; a
failure raises ``AuthenticationFailed``. Brokers prove membership of the cluster with
``broker_key``, ``broker_proof``, ``check_broker_proof`` (an HMAC over the processor's nonce,
keyed from the cluster's shared secret).
Invariants: credentials are never kept in clear (``scram_credential``: Kafka's salted
StoredKey/ServerKey; a PLAIN password is checked by deriving its StoredKey, in constant time);
no error message carries a secret; an unknown user is answered as a known one (RFC 5802
section 9: ``fake_credential``, the same salt each try), so it fails at the same step and in
the same time as a wrong password.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from typing import Callable

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_ENABLED = "SCRAM-SHA-256,SCRAM-SHA-512"  # PLAIN is opt-in: it sends the password itself
SCRAM = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 16384  # Kafka's bound for a credential set through AlterUserScramCredentials (KIP-554)
DEFAULT_ITERATIONS = 8192
MAX_TOKEN = 8192  # longest client token accepted (Kafka's defaults are smaller than that in practice)

Lookup = Callable[[str, str], "dict | None"]  # (user, mechanism) -> credential or None
Fake = Callable[[str, str], dict]  # (user, mechanism) -> a credential for a user that does not exist


BROKER_NONCE_BYTES = 32


def broker_key(secret: bytes) -> bytes:
    """The key brokers prove themselves with: derived from the server's secret (which also
    derives the fake SCRAM credentials), never the secret itself."""
    return hmac.new(secret, b"odradek inter-broker key v1", "sha256").digest()


def broker_proof(key: bytes, nonce: bytes, broker_id: int) -> bytes:
    """What broker ``broker_id`` answers to the processor's ``nonce``."""
    return hmac.new(key, b"odradek broker proof\0%d\0" % broker_id + nonce, "sha256").digest()


def check_broker_proof(key: bytes, nonce: bytes, broker_id: int, proof) -> bool:
    """Whether ``proof`` is broker ``broker_id``'s answer to ``nonce`` (constant-time compare)."""
    return isinstance(proof, bytes) and hmac.compare_digest(broker_proof(key, nonce, broker_id), proof)


class AuthenticationFailed(Exception):
    """The client gave a wrong, unknown or malformed credential. The message is safe to
    send and log (no password, no proof)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode(), validate=True)


def _keys(digest: str, password: str, salt: bytes, iterations: int) -> tuple[bytes, bytes, bytes]:
    """(ClientKey, StoredKey, ServerKey) of a password."""
    return _salted_keys(digest, hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations))


def _salted_keys(digest: str, salted: bytes) -> tuple[bytes, bytes, bytes]:
    """(ClientKey, StoredKey, ServerKey) of a SaltedPassword (RFC 5802)."""
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    return client_key, hashlib.new(digest, client_key).digest(), server_key


def scram_credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                     salt: bytes | None = None) -> dict:
    """The stored form of a password for one SCRAM mechanism (what Kafka keeps in ZooKeeper)."""
    if mechanism not in SCRAM:
        raise ValueError(f"{mechanism!r} is not a SCRAM mechanism ({', '.join(SCRAM)})")
    if iterations < MIN_ITERATIONS:
        raise ValueError(f"iterations must be at least {MIN_ITERATIONS}, got {iterations}")
    salt = salt or os.urandom(32)
    digest = SCRAM[mechanism]
    return salted_credential(mechanism, hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, iterations),
                             salt, iterations)


def salted_credential(mechanism: str, salted_password: bytes, salt: bytes, iterations: int) -> dict:
    """The stored form from a SaltedPassword a client computed (KIP-554's
    AlterUserScramCredentials: the password itself never reaches the broker)."""
    if mechanism not in SCRAM:
        raise ValueError(f"{mechanism!r} is not a SCRAM mechanism ({', '.join(SCRAM)})")
    _ck, stored, server = _salted_keys(SCRAM[mechanism], salted_password)
    return {"salt": _b64(salt), "iterations": iterations, "stored_key": _b64(stored), "server_key": _b64(server)}


def fake_credential(secret: bytes, user: str, mechanism: str, iterations: int = DEFAULT_ITERATIONS) -> dict:
    """What a user that does not exist is answered with: salt and keys derived from the server's
    ``secret`` and the name (stable, unlike a random one a prober could compare across tries);
    no password derives the keys (that would take a preimage of the hash)."""
    digest = SCRAM[mechanism]

    def derive(label: str) -> bytes:
        return hmac.new(secret, f"{label}\0{mechanism}\0{user}".encode("utf-8", "replace"), digest).digest()
    return {"salt": _b64(derive("salt")[:32]), "iterations": iterations, "stored_key": _b64(derive("stored")),
            "server_key": _b64(derive("server"))}


def check_password(credential: dict, mechanism: str, password: str) -> bool:
    """True if ``password`` derives ``credential``'s StoredKey (constant-time comparison)."""
    _ck, stored, _sk = _keys(SCRAM[mechanism], password, _unb64(credential["salt"]), int(credential["iterations"]))
    return hmac.compare_digest(stored, _unb64(credential["stored_key"]))


def server(mechanism: str, lookup: Lookup, fake: Fake | None = None):
    if mechanism == "PLAIN":
        return PlainServer(lookup, fake)
    if mechanism in SCRAM:
        return ScramServer(mechanism, lookup, fake=fake)
    raise ValueError(f"unsupported SASL mechanism {mechanism!r}")


class PlainServer:
    """RFC 4616: one token ``authzid NUL authcid NUL passwd``; the empty response on success."""

    mechanism = "PLAIN"

    def __init__(self, lookup: Lookup, fake: Fake | None = None):
        self.lookup, self.fake = lookup, fake
        self.done = False
        self.user: str | None = None

    def step(self, token: bytes) -> bytes:
        if self.done:
            raise AuthenticationFailed("PLAIN takes one token; the exchange is over")
        parts = bytes(token).split(b"\0")
        if len(parts) != 3 or len(token) > MAX_TOKEN:
            raise AuthenticationFailed("a PLAIN token is 'authzid NUL user NUL password'")
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        if authzid and authzid != user:
            raise AuthenticationFailed(f"user '{user}' may not act as '{authzid}'")
        for mechanism in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
            cred = self.lookup(user, mechanism)
            if cred is not None:
                if not check_password(cred, mechanism, password):
                    break
                self.done, self.user = True, user
                return b""
        else:
            if self.fake is not None:  # no such user: spend the time a check takes all the same
                check_password(self.fake(user, "SCRAM-SHA-512"), "SCRAM-SHA-512", password)
        raise AuthenticationFailed(f"authentication failed for user '{user}': invalid credentials")


def _attrs(message: str) -> dict[str, str]:
    out = {}
    for item in message.split(","):
        key, sep, value = item.partition("=")
        if sep and len(key) == 1:
            out.setdefault(key, value)
    return out


def _saslname(name: str) -> str:
    """RFC 5802 5.1: '=2C' is ',' and '=3D' is '='; any other '=' is malformed."""
    if "=" in name.replace("=2C", "").replace("=3D", ""):
        raise AuthenticationFailed("malformed user name in SCRAM's client-first message")
    return name.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """RFC 5802 server, two rounds: client-first -> server-first (nonce, salt, iterations);
    client-final (proof) -> server-final (signature). Channel binding is not offered
    (gs2 header 'n' or 'y'), as Kafka."""

    def __init__(self, mechanism: str, lookup: Lookup, nonce: bytes | None = None, fake: Fake | None = None):
        self.mechanism = mechanism
        self.digest = SCRAM[mechanism]
        self.lookup, self.fake = lookup, fake
        self.done = False
        self.user: str | None = None
        self._nonce = nonce
        self._state = "first"

    def step(self, token: bytes) -> bytes:
        if len(token) > MAX_TOKEN:
            raise AuthenticationFailed(f"SCRAM message of {len(token)} bytes is too long")
        try:
            text = bytes(token).decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("SCRAM messages are UTF-8") from None
        if self._state == "first":
            return self._first(text)
        if self._state == "final":
            return self._final(text)
        raise AuthenticationFailed("the SCRAM exchange is over")

    def _first(self, text: str) -> bytes:
        gs2, sep, rest = text.partition(",")
        authzid, sep2, bare = rest.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y"):
            raise AuthenticationFailed("SCRAM client-first must start 'n,,' (channel binding is not supported)")
        attrs = _attrs(bare)
        if "n" not in attrs or "r" not in attrs or not attrs["r"]:
            raise AuthenticationFailed("SCRAM client-first needs n=<user> and r=<nonce>")
        user = _saslname(attrs["n"])
        if authzid and _saslname(authzid[2:] if authzid.startswith("a=") else authzid) != user:
            raise AuthenticationFailed(f"user '{user}' may not act as another user")
        cred = self.lookup(user, self.mechanism)
        if cred is None and self.fake is not None:
            cred = self.fake(user, self.mechanism)  # fails at the proof, as a wrong password does
        if cred is None:
            raise AuthenticationFailed(f"authentication failed for user '{user}': invalid credentials")
        self.user, self._cred = user, cred
        nonce = attrs["r"] + _b64(self._nonce or os.urandom(24)).rstrip("=")
        self._server_first = f"r={nonce},s={cred['salt']},i={int(cred['iterations'])}"
        self._client_first_bare, self._combined = bare, nonce
        # librdkafka before 2.6.1 (kcat's, Debian's) sends its own nonce again before the
        # combined one (librdkafka#4895); Kafka accepts that since 3.8.1 (the nonce ends
        # with this exchange's), and so does this server, in that exact form only
        self._client_nonce = attrs["r"]
        self._state = "final"
        return self._server_first.encode()

    def _final(self, text: str) -> bytes:
        self._state = "over"
        without_proof, sep, proof = text.rpartition(",p=")
        attrs = _attrs(without_proof)
        if not sep or attrs.get("r") not in (self._combined, self._client_nonce + self._combined) or "c" not in attrs:
            raise AuthenticationFailed("SCRAM client-final does not carry this exchange's nonce and a proof")
        auth = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        stored = _unb64(self._cred["stored_key"])
        signature = hmac.new(stored, auth, self.digest).digest()
        try:
            client_key = bytes(a ^ b for a, b in zip(_unb64(proof), signature, strict=True))
        except (ValueError, TypeError):
            raise AuthenticationFailed(f"authentication failed for user '{self.user}': malformed proof") from None
        if not hmac.compare_digest(hashlib.new(self.digest, client_key).digest(), stored):
            raise AuthenticationFailed(f"authentication failed for user '{self.user}': invalid credentials")
        self.done = True
        server_sig = hmac.new(_unb64(self._cred["server_key"]), auth, self.digest).digest()
        return f"v={_b64(server_sig)}".encode()


# ---- client side (the bundled client) ------------------------------------------------------------

def plain_token(user: str, password: str) -> bytes:
    return b"\0" + user.encode() + b"\0" + password.encode()


class ScramClient:
    """RFC 5802 client: ``first()``, ``final(server_first)``, ``verify(server_final)``."""

    def __init__(self, mechanism: str, user: str, password: str, nonce: bytes | None = None):
        self.digest = SCRAM[mechanism]
        self.user, self.password = user, password
        self._nonce = _b64(nonce or os.urandom(24)).rstrip("=")

    def first(self) -> bytes:
        name = self.user.replace("=", "=3D").replace(",", "=2C")
        self._bare = f"n={name},r={self._nonce}"
        return f"n,,{self._bare}".encode()

    def final(self, server_first: bytes) -> bytes:
        text = bytes(server_first).decode()
        attrs = _attrs(text)
        if not attrs.get("r", "").startswith(self._nonce) or "s" not in attrs or "i" not in attrs:
            raise AuthenticationFailed("the server's SCRAM reply does not continue this exchange")
        iterations = int(attrs["i"])
        if iterations < MIN_ITERATIONS:
            raise AuthenticationFailed(f"the server asks for {iterations} iterations, fewer than {MIN_ITERATIONS}")
        client_key, stored, server_key = _keys(self.digest, self.password, _unb64(attrs["s"]), iterations)
        without_proof = f"c=biws,r={attrs['r']}"
        auth = f"{self._bare},{text},{without_proof}".encode()
        signature = hmac.new(stored, auth, self.digest).digest()
        self._server_sig = hmac.new(server_key, auth, self.digest).digest()
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        return f"{without_proof},p={_b64(proof)}".encode()

    def verify(self, server_final: bytes) -> None:
        attrs = _attrs(bytes(server_final).decode())
        if "e" in attrs:
            raise AuthenticationFailed(f"the server refused: {attrs['e']}")
        if not hmac.compare_digest(_unb64(attrs.get("v", "")), self._server_sig):
            raise AuthenticationFailed("the server's SCRAM signature is wrong: it does not know this password")


# ---- one connection's SASL state (the processor keeps one per connection of a SASL listener) -----

class Session:
    """Handshake (the mechanism), then authenticate steps until done. ``handshake`` returns
    None or an (error name, message) pair; ``authenticate`` returns the server's token and
    raises ``AuthenticationFailed`` (the connection is then answered after
    ``failed.authentication.delay.ms`` and closed) or ``IllegalState``."""

    def __init__(self, enabled: list[str], lookup: Lookup, fake: Fake | None = None):
        self.enabled = [m for m in enabled if m in MECHANISMS]
        self.lookup, self.fake = lookup, fake
        self.server = None
        self.principal: str | None = None  # "User:<name>" once authenticated

    def handshake(self, mechanism: str) -> tuple[str, str] | None:
        if self.server is not None:
            return ("ILLEGAL_SASL_STATE", "SaslHandshake was already done on this connection")
        if mechanism not in self.enabled:
            return ("UNSUPPORTED_SASL_MECHANISM", f"SASL mechanism {mechanism!r} is not enabled here; "
                    f"enabled: {', '.join(self.enabled)} (sasl.enabled.mechanisms)")
        self.server = server(mechanism, self.lookup, self.fake)
        return None

    def authenticate(self, token: bytes) -> bytes:
        if self.server is None or self.principal is not None:
            raise IllegalState("SaslAuthenticate must follow a SaslHandshake, once per connection")
        out = self.server.step(bytes(token))
        if self.server.done:
            self.principal = f"User:{self.server.user}"
        return out


class IllegalState(Exception):
    pass
