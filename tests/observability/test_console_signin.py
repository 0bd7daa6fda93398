"""The console's sign-in on a broker with SASL users and ACLs on: plain HTTP for the rules
(sign-in, the session cookie, CSRF, what each user sees and may do), one real headless
chromium for the page, and the session's clock without a broker."""
from __future__ import annotations

import html
import http.client
import os
import re
import urllib.parse

import pytest

from odradek import Admin, Consumer
from odradek.group import GroupAdmin
from odradek.types import TopicPartition
from odradek.network import secstore
from odradek.network.authorizer import Acl
from odradek.observe.signin import SESSION_IDLE, SESSION_MAX, SignIn
from tests.conftest import BrokerProcess
from tests.security.fixtures import listeners_of

USERS = {"admin": "admin-secret", "alice": "alice-secret"}
GROUPS = ("alice-listed-1", "alice-listed-2", "payroll-readers")  # alice may Describe the first two


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory):
    """PLAINTEXT and SASL_PLAINTEXT listeners, ACLs on, admin a super user; alice may
    describe, read, create and write the topics starting with 'alice-' and describe the
    groups starting with 'alice-', nothing else (no Describe on the cluster)."""
    data = os.path.abspath(str(tmp_path_factory.mktemp("console-signin")))
    users = secstore.Users(data)
    for name, password in USERS.items():
        users.add(name, password, iterations=4096)
    secstore.Acls(data).add([Acl.make("User:alice", "Topic", "alice-", op, pattern="Prefixed").as_list()
                             for op in ("Describe", "Read", "Create", "Write")] +
                            [Acl.make("User:alice", "Group", "alice-", "Describe", pattern="Prefixed").as_list()])
    broker = BrokerProcess(data, {"listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
                                  "authorizer": True, "super.users": "User:admin",
                                  "sasl.enabled.mechanisms": "SCRAM-SHA-256,PLAIN"})
    broker.start()
    try:
        host, port, _ = listeners_of(broker)["SASL_PLAINTEXT"]
        broker.admin_options = {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                                "sasl_plain_username": "admin", "sasl_plain_password": USERS["admin"]}
        broker.sasl_bootstrap = f"{host}:{port}"
        with Admin(broker.sasl_bootstrap, **broker.admin_options) as admin:
            for topic in ("alice-orders", "secret-payroll"):
                admin.create_topic(topic)
        for group in GROUPS:  # committed offsets make the groups (as admin, who may)
            with Consumer(broker.sasl_bootstrap, group_id=group, **broker.admin_options) as c:
                c.commit({TopicPartition("alice-orders", 0): 0})
        yield broker
    finally:
        broker.discard()  # kill -9: its data is thrown away; a graceful stop takes seconds


class Http:
    """One browser-like client of the console: keeps the session cookie, follows nothing."""

    def __init__(self, base: str):
        parts = urllib.parse.urlsplit(base)
        self.host, self.port = parts.hostname, parts.port
        self.origin = f"http://{parts.netloc}"
        self.cookie = ""

    def call(self, method: str, path: str, form: dict | None = None, origin: str | None = "same"):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        headers = {}
        if self.cookie:
            headers["Cookie"] = self.cookie
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        if origin is not None:
            headers["Origin"] = self.origin if origin == "same" else origin
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            return r.status, r.headers, html.unescape(r.read().decode(errors="replace"))
        finally:
            conn.close()

    def sign_in(self, user: str, password: str):
        status, headers, body = self.call("POST", "/login", {"user": user, "password": password, "next": "/topics"})
        if headers.get("Set-Cookie"):
            self.cookie = headers["Set-Cookie"].split(";", 1)[0]
        return status, headers, body

    def csrf(self, path: str = "/topics") -> str:
        status, _, body = self.call("GET", path)
        assert status == 200, body
        return re.search(r'name="csrf" value="([^"]+)"', body).group(1)


def signed_in(broker, user: str) -> Http:
    client = Http(broker.console_url)
    status, _, body = client.sign_in(user, USERS[user])
    assert status == 303 and client.cookie, body
    return client


def test_with_users_every_page_asks_for_a_sign_in_but_metrics_and_health_do_not(acl_broker):
    client = Http(acl_broker.console_url)
    for path in ("/", "/topics", "/groups", "/charts"):
        status, headers, _ = client.call("GET", path)
        assert status == 303 and headers["Location"].endswith("/login?next=" + urllib.parse.quote(path))
    assert client.call("GET", "/api/totals")[0] == 401
    assert client.call("GET", "/login")[0] == 200
    for path in ("/metrics", "/health/live", "/health/ready"):
        assert client.call("GET", path)[0] == 200


def test_a_wrong_password_gets_no_session_and_is_audited_without_the_password(acl_broker):
    client = Http(acl_broker.console_url)
    status, headers, body = client.sign_in("alice", "not-alices-password")
    assert status == 401 and "Set-Cookie" not in headers and "Wrong user name or password" in body
    status, headers, _ = client.sign_in("nobody", "whatever-it-is")
    assert status == 401 and "Set-Cookie" not in headers
    with open(acl_broker.stderr_path, errors="replace") as f:
        log = f.read()
    assert "sign-in as 'alice'" in log and "failed" in log
    assert "not-alices-password" not in log and "whatever-it-is" not in log


def test_the_session_cookie_is_httponly_samesite_strict_expiring_and_random(acl_broker):
    cookies = []
    for _ in range(2):
        client = Http(acl_broker.console_url)
        status, headers, _ = client.sign_in("alice", USERS["alice"])
        assert status == 303
        cookie = headers["Set-Cookie"]
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower() and f"Max-Age={SESSION_MAX}" in cookie
        cookies.append(client.cookie)
    first, second = (c.split("=", 1)[1] for c in cookies)
    assert first != second and len(first) >= 40 and USERS["alice"] not in first


def test_a_user_sees_only_the_topics_and_groups_its_acls_let_it_describe(acl_broker):
    alice = signed_in(acl_broker, "alice")
    status, _, body = alice.call("GET", "/topics")
    assert status == 200 and "alice-orders" in body and "secret-payroll" not in body
    assert "signed in as <b>alice</b>" in body
    for path in ("/topics/secret-payroll", "/topics/secret-payroll/messages", "/groups/other-group", "/"):
        status, _, body = alice.call("GET", path)
        assert status == 403 and "User:alice may not" in body, path
    assert alice.call("GET", "/topics/alice-orders")[0] == 200
    status, _, body = alice.call("GET", "/api/history")  # sums over every topic: not without Describe on the cluster
    assert status == 200 and '"samples": []' in body and "needs Describe on the cluster" in body
    assert alice.call("GET", "/topics/alice-orders/messages")[0] == 200
    admin = signed_in(acl_broker, "admin")
    status, _, body = admin.call("GET", "/topics")
    assert status == 200 and "alice-orders" in body and "secret-payroll" in body
    assert admin.call("GET", "/")[0] == 200
    # the ACL and user page: Describe on the cluster; names and mechanisms, never a credential
    status, _, body = alice.call("GET", "/security")
    assert status == 403 and "User:alice may not Describe Cluster" in body
    status, _, body = admin.call("GET", "/security")
    assert status == 200 and "<td>User:alice</td>" in body and "<td>Prefixed</td>" in body and "alice-" in body
    assert "<td>alice</td>" in body and "SCRAM-SHA-256 (4096 iterations)" in body and USERS["alice"] not in body
    users = secstore.Users(acl_broker.data_dir).data()
    assert not any(str(c.get("salt")) in body for creds in users.values() for c in creds.values())
    status, _, body = admin.call("GET", "/security?q=describe")
    assert status == 200 and "<td>Read</td>" not in body and "<td>Describe</td>" in body


def test_a_user_without_describe_on_the_cluster_lists_exactly_the_groups_it_may_describe(acl_broker):
    from confluent_kafka.admin import AdminClient
    from tests.security.fixtures import warm_kafka
    host, port = acl_broker.sasl_bootstrap.split(":")
    warm_kafka(host, int(port))
    seen = {}
    for user in ("alice", "admin"):
        kafka_admin = AdminClient({"bootstrap.servers": acl_broker.sasl_bootstrap, "security.protocol": "SASL_PLAINTEXT",
                                   "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user,
                                   "sasl.password": USERS[user]})
        listed = kafka_admin.list_consumer_groups(request_timeout=30).result()
        assert not listed.errors, listed.errors
        seen[user] = {g.group_id for g in listed.valid} & set(GROUPS)
        with GroupAdmin(acl_broker.sasl_bootstrap, **{**acl_broker.admin_options, "sasl_plain_username": user,
                                                      "sasl_plain_password": USERS[user]}) as native:
            assert {g["group_id"] for g in native.list()} & set(GROUPS) == seen[user], "the native protocol"
    assert seen == {"alice": {"alice-listed-1", "alice-listed-2"}, "admin": set(GROUPS)}
    alice = signed_in(acl_broker, "alice")
    status, _, body = alice.call("GET", "/groups")
    assert status == 200, body
    assert "alice-listed-1" in body and "alice-listed-2" in body and "payroll-readers" not in body
    status, _, body = signed_in(acl_broker, "admin").call("GET", "/groups")
    assert status == 200 and all(g in body for g in GROUPS)


def test_a_post_needs_the_sessions_csrf_token_and_the_consoles_own_origin(acl_broker):
    alice = signed_in(acl_broker, "alice")
    token = alice.csrf()
    form = {"name": "alice-csrf", "partitions": "1", "replication_factor": "1"}
    assert alice.call("POST", "/topics", form)[0] == 403  # no token
    assert alice.call("POST", "/topics", {**form, "csrf": "guessed"})[0] == 403
    assert alice.call("POST", "/topics", {**form, "csrf": token}, origin="http://evil.example")[0] == 403
    assert alice.call("POST", "/topics", {**form, "csrf": signed_in(acl_broker, "alice").csrf()})[0] == 403, \
        "another session's token"
    with Admin(acl_broker.sasl_bootstrap, **acl_broker.admin_options) as admin:
        assert "alice-csrf" not in admin.list_topics()
        status, headers, _ = alice.call("POST", "/topics", {**form, "csrf": token})
        assert status == 303 and headers["Location"].endswith("/topics/alice-csrf")
        assert "alice-csrf" in admin.list_topics()
    # a form from another site is refused even where no sign-in is needed
    assert Http(acl_broker.console_url).call("POST", "/login", {"user": "alice", "password": USERS["alice"]},
                                             origin="http://evil.example")[0] == 403


def test_the_acls_decide_the_consoles_actions_too(acl_broker):
    alice = signed_in(acl_broker, "alice")
    token = alice.csrf()
    status, _, body = alice.call("POST", "/topics", {"name": "payroll-2", "partitions": "1", "csrf": token})
    assert status == 403 and "may not Create Topic 'payroll-2'" in body
    status, _, body = alice.call("POST", "/topics/alice-orders/delete", {"confirm": "alice-orders", "csrf": token})
    assert status == 403 and "may not Delete Topic 'alice-orders'" in body
    status, _, _ = alice.call("POST", "/topics/alice-orders/configs", {"key": "retention.ms", "value": "1000",
                                                                       "csrf": token})
    assert status == 403
    status, _, body = alice.call("POST", "/topics/secret-payroll/produce", {"value": "x", "csrf": token})
    assert status == 403 and "may not Write Topic 'secret-payroll'" in body
    # alice may Describe the group alice-listed-1, not Read (reset offsets) nor Delete it
    status, _, body = alice.call("POST", "/groups/alice-listed-1/reset", {"to": "earliest", "csrf": token})
    assert status == 403 and "may not Read Group 'alice-listed-1'" in body
    status, _, body = alice.call("POST", "/groups/alice-listed-1/delete", {"confirm": "alice-listed-1", "csrf": token})
    assert status == 403 and "may not Delete Group 'alice-listed-1'" in body
    with Admin(acl_broker.sasl_bootstrap, **acl_broker.admin_options) as admin:
        assert "alice-orders" in admin.list_topics() and "payroll-2" not in admin.list_topics()
    with GroupAdmin(acl_broker.sasl_bootstrap, **acl_broker.admin_options) as groups:
        assert "alice-listed-1" in {g["group_id"] for g in groups.list()}


def test_signing_out_ends_the_session(acl_broker):
    alice = signed_in(acl_broker, "alice")
    status, _, _ = alice.call("POST", "/logout", {"csrf": alice.csrf()})
    assert status == 303
    assert alice.call("GET", "/topics")[0] == 303  # the old cookie leads to the sign-in page again


def test_a_session_ends_after_its_idle_time_and_at_its_maximum_age(tmp_path):
    now = [1000.0]
    signin = SignIn({}, str(tmp_path), "127.0.0.1", clock=lambda: now[0])
    assert not signin.required(), "loopback and no users: the console stays open"
    idle = signin.begin("alice", None)
    now[0] += SESSION_IDLE - 1
    assert signin.find(idle.token) is idle  # used: its idle time starts again
    now[0] += SESSION_IDLE - 1
    assert signin.find(idle.token) is idle
    now[0] += SESSION_IDLE + 1
    assert signin.find(idle.token) is None
    busy = signin.begin("alice", None)
    while now[0] - busy.began < SESSION_MAX - SESSION_IDLE:
        now[0] += SESSION_IDLE / 2
        assert signin.find(busy.token) is busy
    now[0] = busy.began + SESSION_MAX + 1
    assert signin.find(busy.token) is None
    assert SignIn({}, str(tmp_path), "0.0.0.0").required(), "reachable beyond loopback: sign-in always"


def test_in_a_real_browser_a_user_signs_in_and_sees_and_creates_only_its_topics(acl_broker):
    from selenium.webdriver.common.by import By
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.wait import WebDriverWait
    from tests.observability.browser import headless_chromium
    with headless_chromium() as browser:
        browser.get(acl_broker.console_url + "topics")
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "sign-in"))
        form = browser.find_element(By.ID, "sign-in")
        form.find_element(By.NAME, "user").send_keys("alice")
        form.find_element(By.NAME, "password").send_keys(USERS["alice"])
        form.find_element(By.TAG_NAME, "button").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "topics"))
        assert browser.find_element(By.TAG_NAME, "h1").text == "Topics"
        assert "signed in as alice" in browser.find_element(By.ID, "signed-in").text
        listed = browser.find_element(By.ID, "topics").text
        assert "alice-orders" in listed and "secret-payroll" not in listed
        assert browser.get_cookie("odradek_session")["httpOnly"] is True
        create = browser.find_element(By.ID, "create-topic")
        create.find_element(By.NAME, "name").send_keys("alice-from-the-browser")
        create.find_element(By.TAG_NAME, "button").click()
        # the heading read while the page is being replaced goes stale: read it again
        WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: d.find_element(By.TAG_NAME, "h1").text == "Topic alice-from-the-browser")
        with Admin(acl_broker.sasl_bootstrap, **acl_broker.admin_options) as admin:
            assert len(admin.describe_topic("alice-from-the-browser").partitions) == 1
        browser.find_element(By.ID, "signed-in").find_element(By.TAG_NAME, "button").click()
        WebDriverWait(browser, 30).until(lambda d: d.find_elements(By.ID, "sign-in"))
