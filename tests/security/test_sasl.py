"""core/sasl.py without sockets: SCRAM-SHA-256/512 (RFC 5802/7677) and PLAIN, server and
client sides, against each other and against RFC 7677's published example."""
from __future__ import annotations

import base64
import hmac

import pytest

from odradek.core import sasl


def _lookup(creds: dict):
    return lambda user, mechanism: creds.get((user, mechanism))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_scram_client_with_the_right_password_authenticates_and_verifies_the_server(mechanism):
    creds = {("alice", mechanism): sasl.scram_credential(mechanism, "s3cret", 4096)}
    server, client = sasl.ScramServer(mechanism, _lookup(creds)), sasl.ScramClient(mechanism, "alice", "s3cret")
    final = client.final(server.step(client.first()))
    client.verify(server.step(final))
    assert server.done and server.user == "alice"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_scram_client_with_a_wrong_password_is_refused(mechanism):
    creds = {("alice", mechanism): sasl.scram_credential(mechanism, "s3cret", 4096)}
    server, client = sasl.ScramServer(mechanism, _lookup(creds)), sasl.ScramClient(mechanism, "alice", "guess")
    final = client.final(server.step(client.first()))
    with pytest.raises(sasl.AuthenticationFailed, match="invalid credentials") as info:
        server.step(final)
    assert "guess" not in str(info.value) and not server.done


def _fake(secret: bytes = b"s" * 32):
    return lambda user, mechanism: sasl.fake_credential(secret, user, mechanism, 4096)


def _server_first(server, user: str, mechanism: str) -> tuple[dict, bytes]:
    client = sasl.ScramClient(mechanism, user, "guess")
    first = server.step(client.first())
    return sasl._attrs(first.decode()), client.final(first)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_an_unknown_scram_user_is_answered_as_a_known_one_and_fails_at_the_proof(mechanism):
    """RFC 5802 section 9 (issue 27 item 8): a prober must not tell who exists. An unknown
    user gets a salt and an iteration count like a known one (the same at every try: a fresh
    random salt each time would give it away), and fails at the last step with the message
    of a wrong password."""
    creds = {("alice", mechanism): sasl.scram_credential(mechanism, "s3cret", 4096)}
    errors, shapes = {}, {}
    for user in ("alice", "nobody"):
        for _try in range(2):
            server = sasl.ScramServer(mechanism, _lookup(creds), fake=_fake())
            attrs, final = _server_first(server, user, mechanism)
            shapes.setdefault(user, set()).add((attrs["s"], attrs["i"]))
            with pytest.raises(sasl.AuthenticationFailed) as info:
                server.step(final)
            errors[user] = str(info.value).replace(user, "USER")
    assert len(shapes["nobody"]) == 1, "the fake salt changed between two tries"
    (salt, iterations), = shapes["nobody"]
    (known_salt, known_iterations), = shapes["alice"]
    assert iterations == known_iterations and len(base64.b64decode(salt)) == len(base64.b64decode(known_salt))
    assert errors["nobody"] == errors["alice"]
    assert sasl.fake_credential(b"t" * 32, "nobody", mechanism)["salt"] != salt, "not derived from the secret"


def test_without_a_fake_an_unknown_scram_user_is_refused_at_the_first_message():
    server = sasl.ScramServer("SCRAM-SHA-256", _lookup({}))
    with pytest.raises(sasl.AuthenticationFailed, match="invalid credentials"):
        server.step(sasl.ScramClient("SCRAM-SHA-256", "nobody", "x").first())


def test_the_server_matches_rfc_7677s_example_exchange():
    """RFC 7677 section 3: user 'user', password 'pencil', 4096 iterations."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = sasl.scram_credential("SCRAM-SHA-256", "pencil", 4096, salt)
    server = sasl.ScramServer("SCRAM-SHA-256", _lookup({("user", "SCRAM-SHA-256"): cred}))
    first = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").decode()
    assert first.startswith("r=rOprNGfwEbeRWgbNEkqO") and ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096" in first
    # Replay the RFC's server nonce to check the proof and signature arithmetic.
    server._server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    server._combined = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    final = server.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.done


def test_plain_checks_the_password_against_the_stored_scram_key():
    creds = {("bob", "SCRAM-SHA-512"): sasl.scram_credential("SCRAM-SHA-512", "pw", 4096)}
    ok = sasl.PlainServer(_lookup(creds))
    assert ok.step(sasl.plain_token("bob", "pw")) == b"" and ok.user == "bob"
    with pytest.raises(sasl.AuthenticationFailed):
        sasl.PlainServer(_lookup(creds)).step(sasl.plain_token("bob", "nope"))
    with pytest.raises(sasl.AuthenticationFailed):
        sasl.PlainServer(_lookup(creds)).step(sasl.plain_token("eve", "pw"))


def test_stored_credentials_hold_no_password_and_at_least_4096_iterations():
    cred = sasl.scram_credential("SCRAM-SHA-256", "hunter2")
    assert set(cred) == {"salt", "iterations", "stored_key", "server_key"} and cred["iterations"] >= 4096
    assert "hunter2" not in repr(cred)
    with pytest.raises(ValueError):
        sasl.scram_credential("SCRAM-SHA-256", "x", iterations=1000)


def test_a_session_refuses_an_unknown_mechanism_and_authenticate_before_handshake():
    session = sasl.Session(["SCRAM-SHA-256"], _lookup({}))
    with pytest.raises(sasl.IllegalState):
        session.authenticate(b"x")
    assert session.handshake("GSSAPI")[0] == "UNSUPPORTED_SASL_MECHANISM"
    assert session.handshake("SCRAM-SHA-256") is None


def test_librdkafkas_repeated_nonce_is_accepted_in_that_form_only():
    """librdkafka before 2.6.1 (kcat's 2.0.2) sends its nonce again before the combined one in
    client-final (librdkafka#4895); Kafka accepts that since 3.8.1, and so does the broker.
    Any other nonce is still refused (RFC 5802: it must carry this exchange's)."""
    mechanism, creds = "SCRAM-SHA-256", {}
    creds[("alice", mechanism)] = sasl.scram_credential(mechanism, "pw", 4096)

    def exchange(nonce_of) -> bool:
        server = sasl.ScramServer(mechanism, _lookup(creds))
        bare = "n=alice,r=clientnonce"
        first = server.step(f"n,,{bare}".encode()).decode()
        attrs = sasl._attrs(first)
        client_key, stored, _ = sasl._keys("sha256", "pw", base64.b64decode(attrs["s"]), int(attrs["i"]))
        without_proof = f"c=biws,r={nonce_of('clientnonce', attrs['r'])}"
        signature = hmac.new(stored, f"{bare},{first},{without_proof}".encode(), "sha256").digest()
        proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
        server.step(f"{without_proof},p={proof}".encode())
        return server.done

    assert exchange(lambda client, combined: combined)
    assert exchange(lambda client, combined: client + combined)
    for wrong in (lambda client, combined: "x" + combined, lambda client, combined: client):
        with pytest.raises(sasl.AuthenticationFailed, match="nonce"):
            exchange(wrong)
