"""Fixtures for the security tests: certificates made here with ``openssl`` (a CA, the
broker's certificate for 127.0.0.1, a client certificate, and a second, unrelated CA), users
written to the data directory before start, and one real broker per module with every kind
of listener. Everything is stopped and removed in teardown."""
from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import time

import pytest

from odradek.local import LocalBroker
from odradek.core import sasl
from odradek.network import secstore
from odradek.core.kafka import framing, schema
from odradek.core.protocol import ApiKey

LISTENER = re.compile(r"odradek listener (\S+) on (\S+):(\d+) \((\S+)\)")


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: str, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d)


def make_cert(d: str, ca: str, name: str, subject: str, ip: str | None = None) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)
    ext = os.path.join(d, f"{name}.ext")
    with open(ext, "w") as f:
        f.write(f"subjectAltName=IP:{ip}\n" if ip else "basicConstraints=CA:FALSE\n")
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.pem", "-extfile", ext, cwd=d)


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict:
    d = str(tmp_path_factory.mktemp("certs"))
    make_ca(d, "ca")
    make_ca(d, "otherca")
    make_cert(d, "ca", "broker", "/CN=127.0.0.1/O=odradek", ip="127.0.0.1")
    make_cert(d, "ca", "alice", "/O=example/CN=alice")
    make_cert(d, "otherca", "mallory", "/CN=mallory")
    return {n: os.path.join(d, n) for n in ("ca", "otherca", "broker", "alice", "mallory")}


def listeners_of(broker: LocalBroker) -> dict[str, tuple[str, int, str]]:
    out = {}
    for line in broker.stdout_lines:
        m = LISTENER.search(line)
        if m:
            out[m.group(1)] = (m.group(2), int(m.group(3)), m.group(4))
    return out


def warm_kafka(host: str, port: int, connections: int = 4, timeout: float = 120.0, context=None) -> None:
    """Open several Kafka connections at once and wait for ApiVersions on each (over TLS with
    an ``ssl`` ``context``; allowed before SASL): a processor imports the Kafka codec (kio's
    schemas) on its first Kafka connection, which takes seconds on this loaded machine,
    longer than librdkafka waits for its first answer."""
    request = b"\x00\x12\x00\x00\x00\x00\x00\x01\x00\x04warm"  # ApiVersions v0, corr 1, client "warm"
    socks = [socket.create_connection((host, port), timeout=timeout) for _ in range(connections)]
    if context is not None:
        socks = [context.wrap_socket(s, server_hostname=host) for s in socks]
    try:
        for s in socks:
            s.sendall(len(request).to_bytes(4, "big") + request)
        for s in socks:
            assert s.recv(4), "no ApiVersions answer while warming up"
    finally:
        for s in socks:
            s.close()


USERS = {"alice": "alice-secret", "bob": "bob-secret", "admin": "admin-secret"}
DELAY_MS = 400


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory, certs):
    data = str(tmp_path_factory.mktemp("secure-broker"))
    users = secstore.Users(os.path.abspath(data))
    for name, password in USERS.items():
        users.add(name, password, iterations=4096)
    settings = {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
        "ssl.certfile": certs["broker"] + ".pem", "ssl.keyfile": certs["broker"] + ".key",
        "ssl.cafile": certs["ca"] + ".pem", "ssl.client.auth": "requested",
        "failed.authentication.delay.ms": DELAY_MS, "shutdown.timeout.ms": 10000,
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",  # PLAIN is opt-in; its tests use it
    }
    broker = LocalBroker(data, settings, start_timeout=240).start()
    try:
        broker.listeners = listeners_of(broker)
        warm_kafka(*broker.listeners["PLAINTEXT"][:2])
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


class RawKafka:
    """A Kafka-protocol connection speaking kio's schemas request by request, signed in with
    SCRAM when given a user (the broker's own SCRAM client): for requests no real client
    sends (transactional batches under another transactional id, internal partitions)."""

    def __init__(self, address: str, user: str | None = None, password: str = "", mechanism: str = "SCRAM-SHA-256",
                 timeout: float = 30.0):
        host, port = address.rsplit(":", 1)
        self.sock, self.corr, self.timeout = socket.create_connection((host, int(port)), timeout=timeout), 0, timeout
        if user is not None:
            assert self.call(ApiKey.SASL_HANDSHAKE, 1, {"mechanism": mechanism})["error_code"] == 0
            scram = sasl.ScramClient(mechanism, user, password)
            first = self.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": scram.first()})
            final = self.call(ApiKey.SASL_AUTHENTICATE, 2, {"auth_bytes": scram.final(bytes(first["auth_bytes"]))})
            assert final["error_code"] == 0, final

    def call(self, api: int, version: int, body: dict) -> dict:
        self.corr += 1
        head = struct.pack(">hhih", api, version, self.corr, 3) + b"raw"
        if schema.request_header_flexible(api, version):
            head += b"\x00"
        data = head + schema.encode_request(api, version, body)
        self.sock.sendall(struct.pack(">i", len(data)) + data)
        answer = self._exactly(struct.unpack(">i", self._exactly(4))[0])
        assert struct.unpack_from(">i", answer)[0] == self.corr
        at = framing.skip_tagged(memoryview(answer), 4) if schema.response_header_flexible(api, version) else 4
        return schema.decode_response(api, version, answer[at:])

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "the broker closed the connection"
            out += chunk
        return out

    def init_producer_id(self, transactional_id: str) -> tuple[int, int]:
        deadline = time.monotonic() + self.timeout
        while True:  # the coordinator may still be loading __transaction_state
            r = self.call(ApiKey.INIT_PRODUCER_ID, 1, {"transactional_id": transactional_id,
                                                       "transaction_timeout": 60000})
            if r["error_code"] == 0 or time.monotonic() > deadline:
                assert r["error_code"] == 0, r
                return r["producer_id"], r["producer_epoch"]
            time.sleep(0.2)

    def produce(self, version: int, transactional_id, topic: str, batch: bytes) -> list[int]:
        """A Produce (acks all) of ``batch`` to partition 0: each partition's error code."""
        r = self.call(ApiKey.PRODUCE, version, {
            "transactional_id": transactional_id, "acks": -1, "timeout": 30000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
        return [p["error_code"] for t in r["responses"] for p in t["partition_responses"]]

    def close(self):
        self.sock.close()
