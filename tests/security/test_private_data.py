"""The data directory and the security files are the broker's user's alone (issue 27 item 5),
and SASL tells no prober who exists (item 8).

Item 5: under umask 000, ``odradek users --add`` (the first step of docs/SECURITY.md) made
``log.dirs`` 0777, so another local user could swap ``security/`` for their own users.json
and sign in as the super user. Each command that creates or reads the data directory is run
here under umask 000 and the modes checked; a broker refuses to start (one line, the reason)
on a security file others may write or a security directory another user owns, and a
running broker refuses to re-read one (keeping what it had). The tests run as root, so
"another user" is ``nobody`` (``os.chown``).

Item 8: SCRAM answered an unknown user at once with an error and a known one with its salt;
now both get a salt (a stable one for the unknown) and fail at the proof alike. PLAIN is
opt-in (``sasl.enabled.mechanisms``), and the log warns when it is on without TLS."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time

import pytest

from odradek import Admin
from odradek.local import LocalBroker
from odradek.core import sasl
from odradek.network import secstore
from odradek.network.clientauth import ClientSecurity
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError
from tests.security.fixtures import listeners_of

NOBODY = pwd.getpwnam("nobody").pw_uid


def odradek(*args: str, umask: int = 0o000, stdin: str | None = None, timeout: float = 120):
    """One command in a child whose umask is ``umask`` (000: everything it creates is
    world-writable unless it says otherwise)."""
    return subprocess.run([sys.executable, "-m", "odradek", *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=lambda: os.umask(umask))


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def private_tree(root) -> dict:
    """Every path under ``root`` (itself included) whose mode lets group or others in."""
    out = {}
    for directory, dirs, files in os.walk(root):
        for p in [directory] + [os.path.join(directory, f) for f in files]:
            if os.path.exists(p) and mode(p) & 0o077:
                out[p] = oct(mode(p))
    return out


# ---- the commands, under umask 000 -----------------------------------------------------------------

def test_users_add_under_umask_000_makes_the_data_directory_and_its_files_private(tmp_path):
    data = tmp_path / "new" / "data"  # its parent is missing too
    out = odradek("users", "--set", f"log.dirs={data}", "--add", "admin", "--password-stdin", stdin="pw\n")
    assert out.returncode == 0, out.stderr
    assert mode(tmp_path / "new") == 0o700 and mode(data) == 0o700 and mode(data / "security") == 0o700
    assert sorted(os.listdir(data / "security")) == ["users.json", "users.json.lock"]
    assert private_tree(data) == {}
    out = odradek("users", "--set", f"log.dirs={data}", "--list")
    assert out.returncode == 0 and "admin: SCRAM-SHA-256" in out.stdout


def test_acls_and_quotas_under_umask_000_narrow_an_open_data_directory(tmp_path):
    data = tmp_path / "data"
    os.mkdir(data)
    os.chmod(data, 0o777)  # as the unfixed `users --add` left it
    out = odradek("acls", "--set", f"log.dirs={data}", "--add", "--allow-principal", "User:alice",
                  "--operation", "Read", "--topic", "t")
    assert out.returncode == 0, out.stderr
    out = odradek("configs", "--set", f"log.dirs={data}", "--entity-type", "users", "--entity-name", "alice",
                  "--alter", "--add-config", "producer_byte_rate=1000")
    assert out.returncode == 0, out.stderr
    assert {"acls.json", "quotas.json"} <= set(os.listdir(data / "security"))
    assert private_tree(data) == {}


def test_users_refuses_a_security_directory_another_user_owns(tmp_path):
    data = tmp_path / "data"
    os.makedirs(data / "security", mode=0o700)
    os.chown(data / "security", NOBODY, NOBODY)
    out = odradek("users", "--set", f"log.dirs={data}", "--add", "admin", "--password-stdin", stdin="pw\n")
    assert out.returncode == 1 and f"belongs to uid {NOBODY}" in out.stderr, out.stderr
    assert not os.path.exists(data / "security" / "users.json")


def test_a_store_refuses_an_untrusted_file_keeps_what_it_had_and_reads_it_once_it_is_fixed(tmp_path):
    users = secstore.Users(str(tmp_path / "data"))
    users.add("alice", "pw", iterations=4096)
    assert users.lookup("alice", "SCRAM-SHA-256") is not None
    with open(users.path) as f:
        planted = json.load(f)
    planted["mallory"] = planted["alice"]
    with open(users.path, "w") as f:  # others may write it: whatever it says now is nobody's word
        json.dump(planted, f)
    os.chmod(users.path, 0o666)
    later = time.monotonic() + 1
    assert users.data(later).get("mallory") is None and users.lookup("alice", "SCRAM-SHA-256") is not None
    os.chmod(users.path, 0o600)  # the operator checked it and fixed its mode: read again
    assert users.data(later + 1).get("mallory") is not None


# ---- the broker's start ------------------------------------------------------------------------------

def _serve_refuses(data) -> str:
    out = odradek("serve", "--set", f"log.dirs={data}", "--set", "listeners=PLAINTEXT://127.0.0.1:0", timeout=60)
    assert out.returncode == 1, f"the broker started: {out.stdout[-500:]} {out.stderr[-500:]}"
    assert "odradek ready" not in out.stdout
    return out.stderr.strip().splitlines()[-1]


def _with_user(tmp_path):
    data = tmp_path / "data"
    out = odradek("users", "--set", f"log.dirs={data}", "--add", "admin", "--password-stdin", stdin="pw\n", umask=0o022)
    assert out.returncode == 0, out.stderr
    return data


def test_a_broker_refuses_to_start_on_a_users_file_others_may_write(tmp_path):
    data = _with_user(tmp_path)
    os.chmod(data / "security" / "users.json", 0o666)
    line = _serve_refuses(data)
    assert line.startswith("odradek: refusing to start: ") and "users.json has mode 0666" in line, line


def test_a_broker_refuses_to_start_on_a_security_directory_another_user_owns(tmp_path):
    data = _with_user(tmp_path)
    os.chown(data / "security", NOBODY, NOBODY)
    line = _serve_refuses(data)
    assert line.startswith("odradek: refusing to start: ") and f"belongs to uid {NOBODY}" in line, line


def test_a_broker_refuses_to_start_on_a_data_directory_another_user_owns(tmp_path):
    data = _with_user(tmp_path)
    os.chown(data, NOBODY, NOBODY)
    line = _serve_refuses(data)
    assert line.startswith("odradek: ") and f"belongs to uid {NOBODY}" in line, line


# ---- a running broker, started under umask 000 ---------------------------------------------------

USERS = {"admin": "admin-pw", "alice": "alice-pw"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    data = str(tmp_path_factory.mktemp("private-broker") / "data")
    for user, password in USERS.items():
        out = odradek("users", "--set", f"log.dirs={data}", "--add", user, "--password-stdin", "--iterations", "4096",
                      stdin=password + "\n")
        assert out.returncode == 0, out.stderr
    os.chmod(data, 0o777)  # as an earlier command under umask 000 left it: the broker narrows it
    old = os.umask(0o000)  # the broker inherits it
    try:
        # one processor: every sign-in reads the users through it (a processor that never read
        # them meets the swapped file first and keeps nothing: refused all the same)
        b = LocalBroker(data, {"listeners": "SASL_PLAINTEXT://127.0.0.1:0", "failed.authentication.delay.ms": 50,
                               "num.network.threads": 1, "shutdown.timeout.ms": 10000}, start_timeout=240).start()
    finally:
        os.umask(old)
    try:
        host, port, _ = listeners_of(b)["SASL_PLAINTEXT"]
        b.address = (host, port)
        yield b
    finally:
        b.discard()


def _sign_in(broker, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> list:
    with Admin("%s:%d" % broker.address, security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
               sasl_plain_username=user, sasl_plain_password=password, request_timeout_ms=10000) as admin:
        return admin.list_topics()


def test_a_broker_under_umask_000_keeps_its_data_directory_private(broker):
    _sign_in(broker, "admin", USERS["admin"])  # something was written (the server's secret, say)
    assert mode(broker.data_dir) == 0o700
    assert private_tree(broker.data_dir) == {}


def test_a_running_broker_refuses_a_swapped_security_directory_and_keeps_its_users(broker):
    security = os.path.join(broker.data_dir, "security")
    planted = os.path.join(broker.data_dir, "planted")
    os.makedirs(planted)
    with open(os.path.join(planted, "users.json"), "w") as f:
        json.dump({"mallory": {"SCRAM-SHA-256": sasl.scram_credential("SCRAM-SHA-256", "mallory-pw", 4096)},
                   "admin": {"SCRAM-SHA-256": sasl.scram_credential("SCRAM-SHA-256", "mallory-pw", 4096)}}, f)
    for p in (planted, os.path.join(planted, "users.json")):
        os.chown(p, NOBODY, NOBODY)
    os.rename(security, security + ".mine")
    os.rename(planted, security)
    try:
        time.sleep(secstore.CHECK_INTERVAL * 3)
        for user in ("mallory", "admin"):
            with pytest.raises(OdradekError) as info:
                _sign_in(broker, user, "mallory-pw")
            assert info.value.code == ErrorCode.SASL_AUTHENTICATION_FAILED
        assert _sign_in(broker, "alice", USERS["alice"]) is not None  # what was read before stays
        assert "refusing to read" in broker.stderr_tail()
    finally:
        shutil.rmtree(security)
        os.rename(security + ".mine", security)


# ---- SASL tells no prober who exists; PLAIN is opt-in ---------------------------------------------

def _scram_first(broker, user: str, mechanism: str = "SCRAM-SHA-256") -> tuple[dict, bytes]:
    """A raw SCRAM exchange up to the server's first message: its attributes and the final
    message a client with a wrong password would send."""
    sock = socket.create_connection(broker.address, timeout=10)
    try:
        ClientSecurity._call(sock, 1, ApiKey.SASL_HANDSHAKE, {"mechanism": mechanism})
        client = sasl.ScramClient(mechanism, user, "a-guess")
        first = ClientSecurity._call(sock, 2, ApiKey.SASL_AUTHENTICATE, {"auth_bytes": client.first()})["auth_bytes"]
        final = client.final(first)
        try:
            ClientSecurity._call(sock, 3, ApiKey.SASL_AUTHENTICATE, {"auth_bytes": final})
            error = None
        except OdradekError as exc:
            error = (exc.code, str(exc).replace(user, "USER"))
        return sasl._attrs(bytes(first).decode()), error
    finally:
        sock.close()


def test_scram_answers_an_unknown_user_as_a_known_one(broker):
    known, known_error = _scram_first(broker, "alice")
    unknown, unknown_error = _scram_first(broker, "nobody-here")
    again, _ = _scram_first(broker, "nobody-here")
    assert unknown["s"] == again["s"], "the salt of an unknown user changes between tries"
    assert unknown["i"] == known["i"] == "4096", "the iteration count gives the unknown user away"
    assert len(unknown["s"]) == len(known["s"])
    assert known_error == unknown_error and known_error[0] == ErrorCode.SASL_AUTHENTICATION_FAILED


def test_plain_is_not_offered_by_default(broker):
    with pytest.raises(OdradekError) as info:
        _sign_in(broker, "alice", USERS["alice"], mechanism="PLAIN")
    assert info.value.code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert "SASL PLAIN is enabled" not in broker.stderr_tail()


def test_plain_enabled_without_tls_is_warned_about_at_start(tmp_path):
    err = tmp_path / "stderr"
    with open(err, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "odradek", "serve", "--set", f"log.dirs={tmp_path / 'data'}",
                                 "--set", "listeners=SASL_PLAINTEXT://127.0.0.1:0",
                                 "--set", "sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256"],
                                stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while "SASL PLAIN" not in err.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    assert "WARNING" in err.read_text() and \
        "SASL PLAIN is enabled on listener SASL_PLAINTEXT (SASL_PLAINTEXT): passwords cross the network in clear" \
        in err.read_text(), err.read_text()[-1000:]
