"""The bundled client's side of a secure listener: TLS and SASL on a freshly connected socket.

Runs in the client's process (under network/connection.py: Producer, Consumer, Admin, the
command line, the broker's own inter-broker connections). Options carry kafka-python's names
(``security_protocol``, ``sasl_mechanism``, ``sasl_plain_username``, ``sasl_plain_password``,
``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``, ``ssl_check_hostname``). ``secure(sock,
host)`` runs, blocking, the TLS handshake, the native SASL exchange and, for a broker's own
connections (``inter_broker``), BROKER_PROOF, and returns the socket to use.
Invariant: the password is kept only in this object, never logged or put in an error.
"""
from __future__ import annotations

import socket
import ssl
from typing import Any

from odradek.core import codec, sasl
from odradek.network import tls
from odradek.network.listeners import PROTOCOLS
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

OPTIONS = ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_cafile",
           "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")


class ClientSecurity:
    def __init__(self, security_protocol: str = "PLAINTEXT", sasl_mechanism: str = "PLAIN",
                 sasl_plain_username: str | None = None, sasl_plain_password: str | None = None,
                 ssl_cafile: str | None = None, ssl_certfile: str | None = None, ssl_keyfile: str | None = None,
                 ssl_check_hostname: bool = True):
        protocol = (security_protocol or "PLAINTEXT").upper()
        if protocol not in PROTOCOLS:
            raise OdradekError(f"security_protocol {security_protocol!r} is not one of {', '.join(PROTOCOLS)}",
                               ErrorCode.INVALID_CONFIG)
        self.protocol = protocol
        self.mechanism = (sasl_mechanism or "PLAIN").upper()
        if "SASL" in protocol:
            if self.mechanism not in sasl.MECHANISMS:
                raise OdradekError(f"sasl_mechanism {sasl_mechanism!r} is not one of {', '.join(sasl.MECHANISMS)}",
                                   ErrorCode.INVALID_CONFIG)
            if not sasl_plain_username or sasl_plain_password is None:
                raise OdradekError(f"{protocol} needs sasl_plain_username and sasl_plain_password",
                                   ErrorCode.INVALID_CONFIG)
        self.user, self._password = sasl_plain_username, sasl_plain_password
        self.broker: tuple[int, Any] | None = None  # (broker id, secstore.ServerSecret): proven on connect
        self.context = tls.client_context(ssl_cafile, ssl_certfile, ssl_keyfile, ssl_check_hostname) \
            if protocol in ("SSL", "SASL_SSL") else None

    def __repr__(self) -> str:  # never the password
        return f"ClientSecurity({self.protocol}, {self.mechanism if 'SASL' in self.protocol else '-'}, user={self.user!r})"

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> "ClientSecurity | None":
        """None for plain PLAINTEXT (nothing to do), else the security the options ask for."""
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise TypeError(f"unexpected option(s) {', '.join(unknown)}; security options are {', '.join(OPTIONS)}")
        given = {k: v for k, v in options.items() if v is not None}
        if not given or (given.get("security_protocol", "PLAINTEXT").upper() == "PLAINTEXT"):
            return None
        return cls(**given)

    @classmethod
    def inter_broker(cls, config: dict, broker_id: int, data_dir: str) -> "ClientSecurity":
        """How this broker reaches the others (replica fetcher, controller channel, transaction
        markers): the protocol of ``inter.broker.listener.name``,
        ``sasl.mechanism.inter.broker.protocol`` as ``sasl.inter.broker.username`` with the
        password read from ``sasl.inter.broker.password.file``, over TLS the broker's own
        certificate (for listeners that ask for one) checked against ``ssl.cafile``; then, on
        every listener, the proof that it is broker ``broker_id`` of this cluster, from the
        cluster's secret (``secstore.ServerSecret``: ZooKeeper's in cluster mode)."""
        from odradek.network import listeners, secstore
        listener = listeners.inter_broker(config)
        options: dict[str, Any] = {"security_protocol": listener.protocol}
        if listener.sasl:
            path = config.get("sasl.inter.broker.password.file") or ""
            try:
                with open(path, encoding="utf-8") as f:
                    password = f.read().rstrip("\r\n")
            except OSError as exc:
                raise OdradekError(f"cannot read sasl.inter.broker.password.file {path!r}: {exc.strerror}",
                                   ErrorCode.INVALID_CONFIG) from None
            options.update(sasl_mechanism=config.get("sasl.mechanism.inter.broker.protocol") or "SCRAM-SHA-512",
                           sasl_plain_username=config.get("sasl.inter.broker.username"), sasl_plain_password=password)
        if listener.tls:
            options.update(ssl_cafile=config.get("ssl.cafile") or None, ssl_certfile=config.get("ssl.certfile") or None,
                           ssl_keyfile=config.get("ssl.keyfile") or None)
        security = cls(**options)
        security.broker = (int(broker_id), secstore.ServerSecret(data_dir, config))
        return security

    def secure(self, sock: socket.socket, host: str, timeout: float = 10.0) -> socket.socket:
        """TLS, then SASL, then a broker's proof, blocking, on a connected socket; OdradekError
        when refused."""
        sock.settimeout(timeout)
        try:
            if self.context is not None:
                sock = TlsSocket(self.context.wrap_socket(sock, server_hostname=host))
            if "SASL" in self.protocol:
                self._sasl(sock)
            if self.broker is not None:
                self._prove(sock)
        except OdradekError:
            sock.close()
            raise
        except (OSError, ValueError) as exc:
            sock.close()
            raise OdradekError(f"cannot secure the connection to {host} ({self.protocol}): {exc}",
                               ErrorCode.SASL_AUTHENTICATION_FAILED if "SASL" in self.protocol
                               else ErrorCode.NETWORK_EXCEPTION) from None
        return sock

    def _sasl(self, sock: socket.socket) -> None:
        corr = iter(range(1, 100))
        self._call(sock, next(corr), ApiKey.SASL_HANDSHAKE, {"mechanism": self.mechanism}, self._client_id)
        if self.mechanism == "PLAIN":
            self._call(sock, next(corr), ApiKey.SASL_AUTHENTICATE,
                       {"auth_bytes": sasl.plain_token(self.user, self._password)}, self._client_id)
            return
        client = sasl.ScramClient(self.mechanism, self.user, self._password)
        first = self._call(sock, next(corr), ApiKey.SASL_AUTHENTICATE, {"auth_bytes": client.first()},
                           self._client_id)
        final = self._call(sock, next(corr), ApiKey.SASL_AUTHENTICATE,
                           {"auth_bytes": client.final(first.get("auth_bytes") or b"")}, self._client_id)
        try:
            client.verify(final.get("auth_bytes") or b"")
        except sasl.AuthenticationFailed as exc:
            raise OdradekError(str(exc), ErrorCode.SASL_AUTHENTICATION_FAILED) from None

    def _prove(self, sock: socket.socket) -> None:
        """BROKER_PROOF: ask the processor for a nonce, answer it with our key (docs/SECURITY.md)."""
        broker_id, secret = self.broker
        try:
            key = sasl.broker_key(secret.get())
        except Exception as exc:  # noqa: BLE001 - ZooKeeper or the file unreadable: this attempt fails, retried
            raise OdradekError(f"cannot read the cluster's secret to prove this broker: {exc!r}",
                               ErrorCode.NETWORK_EXCEPTION) from None
        nonce = self._call(sock, 1, ApiKey.BROKER_PROOF, {"broker_id": broker_id}, self._client_id).get("nonce")
        if not isinstance(nonce, bytes) or len(nonce) < sasl.BROKER_NONCE_BYTES:
            raise OdradekError("the broker sent no nonce to prove ourselves against",
                               ErrorCode.CLUSTER_AUTHORIZATION_FAILED)
        self._call(sock, 2, ApiKey.BROKER_PROOF, {"broker_id": broker_id,
                                                  "proof": sasl.broker_proof(key, nonce, broker_id)}, self._client_id)

    @property
    def _client_id(self) -> str:
        # A broker's own connection says whose it is from its first byte on, as its later
        # requests do (``broker-<id>``: what the chaos battery's fault proxy reads to tell
        # one broker's links from another's and from clients').
        return "odradek-auth" if self.broker is None else f"broker-{self.broker[0]}"

    @staticmethod
    def _call(sock: socket.socket, corr: int, api: int, body: dict, client_id: str = "odradek-auth") -> dict:
        sock.sendall(b"".join(bytes(b) for b in codec.encode_request(api, 0, corr, client_id, body)))
        decoder = codec.Decoder(1 << 20, codec.RESPONSE_FIELDS)
        while True:
            frame = decoder.next()
            if frame is not None:
                break
            data = sock.recv(65536)
            if not data:
                raise OdradekError("the broker closed the connection during authentication",
                                   ErrorCode.SASL_AUTHENTICATION_FAILED)
            decoder.feed(data)
        body = frame.header.get("body") or {}
        if body.get("error_code"):
            raise OdradekError(body.get("error_message") or "refused", ErrorCode.of(body["error_code"]))
        return body


TLS_CHUNK = 256 * 1024


class TlsSocket:
    """An ``ssl.SSLSocket`` that the clients' socket code can use unchanged: ``sendmsg``
    (which SSLSocket refuses) writes the buffers' first TLS_CHUNK bytes, and a write that
    would block is offered the same bytes again, as OpenSSL requires; a read that would
    block raises BlockingIOError like a plain socket's, and a read returns the decrypted
    bytes OpenSSL holds (poll() cannot see them) with those the kernel had."""

    def __init__(self, sock: ssl.SSLSocket):
        self._sock = sock
        self._retry: bytes | None = None

    def sendmsg(self, bufs) -> int:
        data = self._retry
        if data is None:
            parts, size = [], 0
            for b in bufs:
                parts.append(b)
                size += len(b) if not isinstance(b, memoryview) else b.nbytes
                if size >= TLS_CHUNK:
                    break
            data = b"".join(bytes(p) for p in parts)[:TLS_CHUNK]
        try:
            sent = self._sock.send(data)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError):
            self._retry = data
            raise BlockingIOError("TLS write would block") from None
        self._retry = None
        return sent

    def recv(self, n: int) -> bytes:
        try:
            data = self._sock.recv(n)
            while data and len(data) < n and self._sock.pending():
                data += self._sock.recv(min(n - len(data), self._sock.pending()))
            return data
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise BlockingIOError("TLS read would block") from None

    def __getattr__(self, name: str):
        return getattr(self._sock, name)
