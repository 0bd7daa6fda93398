"""The console's ACL and user pages (issue 29): those who may Alter the cluster add and delete
ACLs and SCRAM users from /security (CreateAcls, DeleteAcls, AlterUserScramCredentials sent to
the broker as the signed-in user, as Kafka's tools would); others are refused as Kafka
refuses them; every form needs the session's CSRF token; a password is never shown back nor
logged. On the broker of test_console_signin (admin a super user, alice without Alter)."""
from __future__ import annotations

import os
import time

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select
from selenium.webdriver.support.wait import WebDriverWait

from odradek import Admin
from odradek.network import secstore
from odradek.network.authorizer import Acl
from tests.observability.browser import headless_chromium
from tests.observability.test_console_signin import USERS, Http, acl_broker, signed_in  # noqa: F401 (a fixture)

CAROL = "carol-Pa55-w0rd-never-shown"


def wait(browser) -> WebDriverWait:
    """A wait that reads again what a page being replaced (after a form's POST) left stale."""
    return WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,))


def test_only_who_may_alter_the_cluster_changes_acls_and_users_and_only_with_the_csrf_token(acl_broker):
    alice = signed_in(acl_broker, "alice")
    token = alice.csrf()
    acl = {"principal": "User:alice", "host": "*", "resource": "Cluster", "pattern": "Literal",
           "name": "kafka-cluster", "operation": "Alter", "permission": "Allow"}
    status, _, body = alice.call("POST", "/security/acls", {**acl, "csrf": token})
    assert status == 403 and "may not Alter Cluster 'kafka-cluster'" in body
    status, _, body = alice.call("POST", "/security/users", {"user": "mallory", "password": "x" * 12, "csrf": token})
    assert status == 403 and "may not Alter Cluster" in body
    status, _, _ = alice.call("POST", "/security/users/delete", {"user": "admin", "confirm": "admin", "csrf": token})
    assert status == 403
    admin = signed_in(acl_broker, "admin")
    assert admin.call("POST", "/security/acls", acl)[0] == 403  # no CSRF token
    assert admin.call("POST", "/security/users", {"user": "mallory", "password": "x" * 12, "csrf": "guessed"})[0] == 403
    assert admin.call("POST", "/security/acls", {**acl, "csrf": admin.csrf("/security")},
                      origin="http://evil.example")[0] == 403
    data = acl_broker.data_dir
    assert "mallory" not in secstore.Users(data).data()
    assert not [a for a in secstore.Acls(data).data() if a[0] == "User:alice" and a[2] == "Cluster"]
    # bad input: a message a person can act on, nothing stored
    status, headers, _ = admin.call("POST", "/security/acls", {**acl, "principal": "alice", "csrf": admin.csrf("/security")})
    assert status == 303
    body = admin.call("GET", headers["Location"][headers["Location"].index("/security"):])[2]
    assert "ACL not added: principal 'alice' must be of the form User:<name>" in body
    status, headers, _ = admin.call("POST", "/security/users", {"user": "weak", "password": "pw", "iterations": "100",
                                                                "csrf": admin.csrf("/security")})
    body = admin.call("GET", headers["Location"][headers["Location"].index("/security"):])[2]
    assert "User not stored:" in body and "4096" in body and "weak" not in secstore.Users(data).data()
    began = time.monotonic()  # a huge count is refused before any hashing, not hashed for minutes
    status, headers, _ = admin.call("POST", "/security/users", {"user": "slow", "password": "pw",
                                                                "iterations": str(2_000_000_000),
                                                                "csrf": admin.csrf("/security")})
    body = admin.call("GET", headers["Location"][headers["Location"].index("/security"):])[2]
    assert "iterations must be 4096 to 16384" in body and time.monotonic() - began < 10


def test_in_a_real_browser_an_admin_adds_and_deletes_an_acl_and_a_user(acl_broker):
    data = acl_broker.data_dir
    with headless_chromium() as browser:
        browser.get(acl_broker.console_url + "security")
        form = wait(browser).until(lambda d: d.find_elements(By.ID, "sign-in"))[0]
        form.find_element(By.NAME, "user").send_keys("admin")
        form.find_element(By.NAME, "password").send_keys(USERS["admin"])
        form.find_element(By.TAG_NAME, "button").click()
        add = wait(browser).until(lambda d: d.find_elements(By.ID, "add-acl"))[0]
        add.find_element(By.NAME, "principal").send_keys("User:carol")
        for field, choice in (("operation", "Describe"), ("resource", "Topic"), ("pattern", "Prefixed")):
            Select(add.find_element(By.NAME, field)).select_by_visible_text(choice)
        add.find_element(By.NAME, "name").send_keys("carol-")
        add.find_element(By.TAG_NAME, "button").click()
        wait(browser).until(lambda d: "Added ACL: User:carol Allow Describe on Topic:PREFIXED:carol-"
                                         in d.find_element(By.ID, "security-message").text)
        assert ["User:carol", "*", "Topic", "Prefixed", "carol-", "Describe", "Allow"] in \
            [list(a) for a in secstore.Acls(data).data()]
        rows = [r for r in browser.find_elements(By.CSS_SELECTOR, "#acls tr") if "User:carol" in r.text]
        assert len(rows) == 1
        # a user: the password typed once, stored as a SCRAM credential, never shown back
        user = browser.find_element(By.ID, "add-user")
        user.find_element(By.NAME, "user").send_keys("carol")
        user.find_element(By.NAME, "password").send_keys(CAROL)
        assert user.find_element(By.NAME, "password").get_attribute("type") == "password"
        user.find_element(By.TAG_NAME, "button").click()
        wait(browser).until(lambda d: "Stored user carol (SCRAM-SHA-256, SCRAM-SHA-512, 8192 iterations)"
                                         in d.find_element(By.ID, "security-message").text)
        assert CAROL not in browser.page_source and CAROL not in browser.current_url
        assert "carol" in browser.find_element(By.ID, "users").text
        assert {m for m, _ in secstore.Users(data).describe()["carol"]} == {"SCRAM-SHA-256", "SCRAM-SHA-512"}
        # carol can now sign in to the broker with that password, and sees what her ACL allows
        with Admin(acl_broker.sasl_bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-256",
                   sasl_plain_username="carol", sasl_plain_password=CAROL) as carol:
            assert carol.list_topics() == []  # Describe on carol-* only, and there are none
        carol_console = Http(acl_broker.console_url)
        assert carol_console.sign_in("carol", CAROL)[0] == 303
        # delete the ACL from its row, then the user (its name typed again)
        row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#acls tr") if "User:carol" in r.text)
        row.find_element(By.TAG_NAME, "button").click()
        wait(browser).until(lambda d: "Removed 1 ACL(s): User:carol Allow Describe"
                                         in d.find_element(By.ID, "security-message").text)
        assert not [a for a in secstore.Acls(data).data() if a[0] == "User:carol"]
        row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#users tr") if r.text.startswith("carol"))
        row.find_element(By.TAG_NAME, "button").click()
        wait(browser).until(lambda d: "User not deleted: type the user's name (carol)"
                                         in d.find_element(By.ID, "security-message").text)
        row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#users tr") if r.text.startswith("carol"))
        row.find_element(By.NAME, "confirm").send_keys("carol")
        row.find_element(By.TAG_NAME, "button").click()
        wait(browser).until(lambda d: "Deleted user carol." in d.find_element(By.ID, "security-message").text)
        assert "carol" not in secstore.Users(data).data()
    assert Http(acl_broker.console_url).sign_in("carol", CAROL)[0] == 401
    for name in os.listdir(data):  # the broker's own output: the password is nowhere in it
        path = os.path.join(data, name)
        if os.path.isfile(path) and name.startswith("broker."):
            with open(path, errors="replace") as f:
                assert CAROL not in f.read(), name
