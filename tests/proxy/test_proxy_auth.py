"""The HTTP proxy on a broker with SASL listeners and the authorizer on: HTTP Basic checked
against the SCRAM credentials, and each user's ACLs applied to what the proxy does for it
(its clients connect as that user). ACLs are set with ``odradek acls`` as a super user."""
from __future__ import annotations

import json
import time

import pytest
import requests

from tests.security.test_acls import USERS, acl_broker, topics  # noqa: F401 (its broker, users and ACLs)

V2 = "application/vnd.kafka.v2+json"


@pytest.fixture(scope="module")
def secured(acl_broker):
    """tests/security/test_acls.py's broker (PLAINTEXT and SASL_PLAINTEXT, authorizer on)."""
    return acl_broker


@pytest.fixture(scope="module")
def topic(topics) -> str:
    """That module's ACLs: alice may Write and Read ``a-*`` (and Read the group alice-group),
    bob only Read ``a-*``."""
    return topics["a"]


def produce(broker, topic: str, auth, value) -> requests.Response:
    return requests.post(f"{broker.http_proxy_url}/v3/clusters/odradek/topics/{topic}/records", auth=auth,
                         json={"value": {"type": "JSON", "data": value}}, timeout=60)


def test_requests_without_valid_credentials_are_refused(secured, topic):
    url = f"{secured.http_proxy_url}/v3/clusters"
    answers = {"none": requests.get(url, timeout=30), "wrong password": requests.get(url, auth=("alice", "nope"),
                                                                                   timeout=30),
               "unknown user": requests.get(url, auth=("mallory", "x"), timeout=30),
               "not basic": requests.get(url, headers={"Authorization": "Bearer abc"}, timeout=30)}
    for what, answer in answers.items():
        assert (answer.status_code, answer.json()["error_code"]) == (401, 40101), what
        assert answer.headers["WWW-Authenticate"].startswith("Basic"), what
        assert "alice-pw" not in answer.text and "nope" not in answer.text
    assert requests.get(url, auth=("alice", USERS["alice"]), timeout=30).status_code == 200
    assert produce(secured, topic, ("alice", "nope"), 1).status_code == 401


def test_each_user_gets_its_own_acls(secured, topic):
    allowed = produce(secured, topic, ("alice", USERS["alice"]), {"by": "alice"})
    assert allowed.status_code == 200, allowed.text
    refused = produce(secured, topic, ("bob", USERS["bob"]), {"by": "bob"})
    assert (refused.status_code, refused.json()["error_code"]) == (403, 40301), refused.text
    unseen = requests.get(f"{secured.http_proxy_url}/v3/clusters/odradek/topics/{topic}", auth=("mallory", "x"),
                          timeout=30)
    assert unseen.status_code == 401


def v2(broker, method: str, path: str, auth, body=None, fmt: str = "json") -> requests.Response:
    return requests.request(method, broker.http_proxy_url + path, auth=auth, timeout=60,
                            data=None if body is None else json.dumps(body),
                            headers={"Content-Type": V2, "Accept": f"application/vnd.kafka.{fmt}.v2+json"})


def test_consumer_instances_belong_to_their_user_and_its_group_acls(secured, topic):
    alice, bob = ("alice", USERS["alice"]), ("bob", USERS["bob"])
    assert produce(secured, topic, alice, {"n": 1}).status_code == 200
    created = v2(secured, "POST", "/consumers/alice-group", alice, {"name": "a1", "format": "json",
                                                                 "auto.offset.reset": "earliest"})
    assert created.status_code == 200, created.text
    base = "/consumers/alice-group/instances/a1"
    assert v2(secured, "POST", f"{base}/subscription", alice, {"topics": [topic]}).status_code == 204
    foreign = v2(secured, "GET", f"{base}/records", bob)
    assert (foreign.status_code, foreign.json()["error_code"]) == (404, 40403)
    got: list = []
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        answer = v2(secured, "GET", f"{base}/records?timeout=1000", alice)
        assert answer.status_code == 200, answer.text
        got = answer.json()
    assert {"n": 1} in [r["value"] for r in got]
    assert v2(secured, "DELETE", base, alice).status_code == 204
    # bob may read the topic but not the group: the broker refuses his group, as for any client of his
    assert v2(secured, "POST", "/consumers/bob-g", bob, {"name": "b1", "auto.offset.reset": "earliest"}).status_code \
        == 200
    assert v2(secured, "POST", "/consumers/bob-g/instances/b1/subscription", bob, {"topics": [topic]}).status_code \
        in (204, 403)
    refused = None
    deadline = time.monotonic() + 60
    while refused is None and time.monotonic() < deadline:
        answer = v2(secured, "GET", "/consumers/bob-g/instances/b1/records?timeout=1000", bob, fmt="binary")
        if answer.status_code != 200:
            refused = answer
        else:
            assert answer.json() == []
    assert refused is not None and (refused.status_code, refused.json()["error_code"]) == (403, 40301), \
        refused and refused.text
    assert v2(secured, "DELETE", "/consumers/bob-g/instances/b1", bob).status_code == 204
