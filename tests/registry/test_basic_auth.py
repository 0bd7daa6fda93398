"""network/basic_auth.py: HTTP Basic checked against the stored SCRAM credentials (shared by
the schema registry and the HTTP proxy)."""
from __future__ import annotations

import base64
import logging

from odradek.core import sasl
from odradek.network import basic_auth, secstore


def _header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_parse():
    assert basic_auth.parse(_header("alice", "pa:ss")) == ("alice", "pa:ss")  # the first colon splits
    assert basic_auth.parse("basic " + base64.b64encode(b"bob:").decode()) == ("bob", "")
    for bad in (None, "", "Bearer abc", "Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode(),
                "Basic " + base64.b64encode(b":pw").decode(), "Basic " + base64.b64encode(b"\xff:x").decode(),
                "Basic " + "A" * 5000):
        assert basic_auth.parse(bad) is None, bad


def test_verify_against_stored_credential(tmp_path, caplog):
    users = secstore.Users(str(tmp_path))
    users.add("alice", "s3cret", mechanisms=("SCRAM-SHA-256",))
    users.add("bob", "hunter2")
    auth = basic_auth.BasicAuth({"failed.authentication.delay.ms": 0}, str(tmp_path))
    assert auth.required()
    assert auth.verify("alice", "s3cret") and auth.verify("bob", "hunter2")
    assert auth.verify("alice", "s3cret")  # the cached path
    assert not auth.verify("alice", "wrong") and not auth.verify("carol", "s3cret")
    # a changed password: the old one no longer passes, although it was cached
    users.set_credential("alice", "SCRAM-SHA-256", sasl.scram_credential("SCRAM-SHA-256", "new-one"))
    assert _eventually(lambda: auth.verify("alice", "new-one"))  # re-read within secstore.CHECK_INTERVAL
    assert not auth.verify("alice", "s3cret")
    with caplog.at_level(logging.WARNING, logger="odradek.audit"):
        assert auth.principal(_header("bob", "hunter2"), "127.0.0.1", "test") == "User:bob"
        assert auth.principal(_header("bob", "not-it"), "127.0.0.1", "test") is None
        assert auth.principal(None, "127.0.0.1", "test") is None
    assert "authentication as 'bob' from 127.0.0.1 failed" in caplog.text
    assert "not-it" not in caplog.text and "hunter2" not in caplog.text


def test_not_required_without_users(tmp_path):
    assert not basic_auth.BasicAuth({}, str(tmp_path)).required()


def _eventually(check, timeout: float = 2.0) -> bool:
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return False
