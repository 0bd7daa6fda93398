"""The HTTP side of the metrics actor: /metrics, /health/*, and the web console (bottle).

Runs on the metrics actor's HTTP server threads. It reaches the broker two ways, never
through the actor's sockets: ``actor.gather()`` / ``actor.status()`` / ``actor.live()``
(handed to the actor's loop, answered by message), and the broker's own Kafka listener as
a client (``Admin``, ``GroupAdmin``, ``Consumer``), like any operator tool.
Owns: the pages (docs/OBSERVABILITY.md, "Web console", lists them): cluster and actor tree,
security (ACLs, users), brokers, topics and their messages (``observe.browse``; a record
can be produced from its form), groups
(lag, offset reset, delete), charts (``observe.history``), sign-in.
Invariants: nothing in a page loads from the internet (``observe/static`` serves the
stylesheet and the chart script); a broker's error answer is a page with its status (404 for
a missing topic or group), never a traceback; internal topics are never deleted nor
written. When the admin listener is reachable beyond loopback or the broker has SASL users
(``observe.signin``),
every page but ``/metrics``, ``/health/*`` and ``/static/*`` needs a signed-in session, every
POST its CSRF token, and each page and action what the user's ACLs allow; a signed-in user's
requests to the broker go as that user (SASL) when the broker has a SASL listener, so the
broker's own authorizer applies too. A POST from another origin is refused, signed in or not.
"""
from __future__ import annotations

import base64
import datetime
import gzip
import json
import logging
import os
import threading
from typing import NamedTuple
from urllib.parse import quote, urlencode

import bottle
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from odradek.cli import fmt_bytes
from odradek.network import authorizer as az
from odradek.network import listeners as listeners_mod
from odradek.core import sasl
from odradek.network import secstore
from odradek.core.protocol import ErrorCode, OdradekError, is_internal_topic
from odradek.observe import console_schemas
from odradek.observe.browse import browse, parse_cursor
from odradek.observe.catalogue import PARTITION_COLUMNS
from odradek.observe.collector import BrokerCollector, group_numbers
from odradek.observe.history import INTERVAL, totals
from odradek.observe.signin import COOKIE, SESSION_MAX, SignIn, same_origin

log = logging.getLogger("odradek.console")

HERE = os.path.dirname(os.path.abspath(__file__))
VIEWS = os.path.join(HERE, "views")
STATIC = os.path.join(HERE, "static")
GZIP_LEVEL = 1  # /metrics compressed when asked: level 1 is ~6x smaller text for a few ms (Prometheus asks)


class Clients:
    """The console's Kafka clients of its own broker, made on first use (the address is
    known once the broker is ready) and shared by the HTTP threads (they are thread-safe).
    The shared ones connect to a PLAINTEXT listener, else to an SSL one with the broker's own
    TLS settings (``network.listeners.own_client``); a signed-in session's own (``own``) connect as its user
    with ``security`` (SASL, over TLS on SASL_SSL)."""

    def __init__(self, actor, bootstrap: str | None = None, security: dict | None = None):
        self.actor = actor
        self._lock = threading.Lock()
        self._admin = self._groups = None
        self.bootstrap = bootstrap
        self.security = security or {}
        self.own = security is not None

    def _address(self) -> str:
        if self.bootstrap is None:
            sup = self.actor.status()["supervisor"]
            if not sup.get("address"):
                raise bottle.HTTPError(503, "the broker is still starting")
            found = listeners_mod.own_client(self.actor.config, sup.get("listeners") or {})
            if found is None:
                raise bottle.HTTPError(503, "The broker has only SASL listeners: sign in (the console then "
                                            "connects as you).")
            self.bootstrap, self.security = found
        return self.bootstrap

    def admin(self):
        with self._lock:
            if self._admin is None:
                from odradek.admin import Admin
                address = self._address()
                self._admin = Admin(address, client_id="odradek-console", request_timeout_ms=10000, **self.security)
            return self._admin

    def groups(self):
        with self._lock:
            if self._groups is None:
                from odradek.group import GroupAdmin
                address = self._address()
                self._groups = GroupAdmin(address, client_id="odradek-console", request_timeout_ms=10000,
                                          **self.security)
            return self._groups

    def consumer(self):
        from odradek.consumer import Consumer
        address = self._address()
        return Consumer(address, client_id="odradek-console", enable_auto_commit=False,
                        auto_offset_reset="earliest", request_timeout_ms=10000, **self.security)

    def producer(self):
        """A producer for one record from the page (acks=all, no retries past the timeout)."""
        from odradek.producer import Producer
        return Producer(self._address(), client_id="odradek-console", acks="all", request_timeout_ms=10000,
                        **self.security)

    def close(self) -> None:
        with self._lock:
            for client in (self._admin, self._groups):
                if client is not None:
                    try:
                        client.close()
                    except Exception:  # closing a client of a session that ended: nothing to do
                        pass
            self._admin = self._groups = None


def _user_clients(actor, user: str, password: str) -> Clients | None:
    """Clients acting as ``user`` over the broker's SASL_PLAINTEXT listener, else its SASL_SSL
    one, or None if it has neither (the shared clients serve the session; the console's own
    checks still apply)."""
    found = listeners_mod.own_client(actor.config, actor.status()["supervisor"].get("listeners") or {}, user, password)
    return None if found is None else Clients(actor, *found)


def render(value: bytes | None, fmt: str) -> str:
    """A key or value as the browser shows it: text, JSON pretty-printed, or hex."""
    if value is None:
        return "(null)"
    if fmt == "hex":
        return value.hex(" ")
    text = value.decode("utf-8", errors="replace")
    if fmt == "json":
        try:
            return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        except ValueError:
            return text
    return text


def accepts_gzip(header: str) -> bool:
    """True if an ``Accept-Encoding`` header accepts gzip (``gzip``, ``*``; not ``q=0``)."""
    for item in header.split(","):
        coding, _, params = item.strip().partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            if q.startswith("q="):
                try:
                    return float(q[2:]) > 0
                except ValueError:
                    return False
            return True
    return False


ACL_COLUMNS = ("principal", "host", "resource", "pattern", "name", "operation", "permission")  # secstore.Acls rows
ACL_CHOICES = {"resource": ("Topic", "Group", "Cluster", "TransactionalId"), "pattern": ("Literal", "Prefixed"),
               "operation": tuple(op for op in az.OPERATIONS if op != "Any"), "permission": ("Allow", "Deny")}
RESET_TARGETS = {"earliest": "earliest", "latest": "latest", "timestamp": "datetime", "shift": "shift",
                 "offset": "offset"}  # the page's words -> GroupAdmin.reset_offsets' (the CLI's --to-*)
NOT_FOUND = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.GROUP_ID_NOT_FOUND})
REFUSED = frozenset({ErrorCode.TOPIC_AUTHORIZATION_FAILED, ErrorCode.GROUP_AUTHORIZATION_FAILED,
                     ErrorCode.CLUSTER_AUTHORIZATION_FAILED})


def broker_error(exc: OdradekError) -> bottle.HTTPError:
    """The HTTP answer to a page whose broker request failed: 404 for a topic or group that
    does not exist, 403 for what the broker's ACLs refused, 503 for what may pass (the broker
    busy or moving), else 502 (the broker refused the console's request), each with the
    broker's message."""
    if exc.code in NOT_FOUND:
        return bottle.HTTPError(404, f"Not found: {exc.message}")
    if exc.code in REFUSED:
        return bottle.HTTPError(403, f"The broker refused: {exc.message}")
    log.warning("console: %s %s: the broker answered %s", bottle.request.method, bottle.request.path, exc)
    return bottle.HTTPError(503 if exc.code.retriable else 502, f"The broker answered: {exc.message}")


def number(value: str | None, what: str, default: int) -> int:
    """An integer from a form or a query (``default`` when empty), else 400 naming ``what``."""
    if value is None or not value.strip():
        return default
    try:
        return int(value)
    except ValueError:
        raise bottle.HTTPError(400, f"{what} must be a whole number, not {value[:100]!r}") from None


OPEN_PATHS = ("/metrics", "/health/", "/static/", "/login")  # served without a session


def make_app(actor) -> bottle.Bottle:
    from odradek.observe.metrics_actor import admin_address
    app = bottle.Bottle()
    shared = Clients(actor)
    collector = BrokerCollector(actor.gather, bool(actor.config.get("metrics.partition.level", False)))
    view = _viewer()
    signin = SignIn(actor.config, actor.args.get("data_dir") or ".", (admin_address(actor.config) or ("",))[0])
    schemas = console_schemas.install(app, actor, view)  # /schemas pages; decodes registry-encoded records

    def gate(callback):
        """Every route: no POST from another origin; with sign-in required, a live session
        (else the sign-in page) and, for a POST, the session's CSRF token."""
        def gated(*args, **kwargs):
            request = bottle.request
            if request.method == "POST" and not same_origin(request.headers, request.get_header("Host", "")):
                raise bottle.HTTPError(403, "Refused: this form was sent from another site (cross-site request).")
            request.environ["odradek.session"] = None
            if not request.path.startswith(OPEN_PATHS) and signin.required():
                session = signin.find(request.get_cookie(COOKIE))
                if session is None:
                    if request.method == "GET" and not request.path.startswith("/api/"):
                        bottle.redirect("/login?next=" + quote(request.fullpath))
                    raise bottle.HTTPError(401, "Sign in first (/login).")
                if request.method == "POST" and not signin.csrf_ok(session, request.forms.get("csrf")):
                    raise bottle.HTTPError(403, "Refused: the form's CSRF token is missing or stale; reload the "
                                                "page and send it again.")
                request.environ["odradek.session"] = session
            try:
                return callback(*args, **kwargs)
            except OdradekError as exc:  # the broker's answer, not a bug here: its status, no traceback
                raise broker_error(exc) from None
        return gated
    app.install(gate)

    def session():
        return bottle.request.environ.get("odradek.session")

    def clients_now() -> Clients:
        s = session()
        return s.clients if s is not None and s.clients is not None else shared

    def may(operation: str, resource: str, name: str) -> bool:
        return signin.may(session(), operation, resource, name, bottle.request.remote_addr or "")

    def need(operation: str, resource: str, name: str) -> None:
        if not may(operation, resource, name):
            principal = session().principal
            raise bottle.HTTPError(403, f"{principal} may not {operation} {resource} '{name}': an ACL must allow "
                                        f"it (odradek acls --add --allow-principal {principal} --operation "
                                        f"{operation} ...).")

    # ---- sign-in ----------------------------------------------------------------------
    @app.get("/login")
    def login_page():
        if not signin.required():
            bottle.redirect("/")
        return view("login", title="Sign in", next=_local(bottle.request.query.get("next")), message="")

    @app.post("/login")
    def login():
        form = bottle.request.forms
        user, password, next_ = form.getunicode("user") or "", form.getunicode("password") or "", \
            _local(form.getunicode("next"))
        if not signin.required():
            bottle.redirect("/")
        if not user or not signin.check(user, password):
            signin.failed(user, bottle.request.remote_addr or "")
            bottle.response.status = 401
            return view("login", title="Sign in", next=next_, message="Wrong user name or password.")
        try:
            own = _user_clients(actor, user, password)
        except Exception as exc:  # the broker did not answer: no session without its clients
            bottle.response.status = 503
            return view("login", title="Sign in", next=next_, message=f"The broker did not answer: {exc}")
        s = signin.begin(user, own, "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode())
        bottle.response.set_cookie(COOKIE, s.token, path="/", httponly=True, samesite="strict", max_age=SESSION_MAX)
        bottle.redirect(next_)

    @app.post("/logout")
    def logout():
        s = session()
        if s is not None:
            signin.end(s.token)
        bottle.response.delete_cookie(COOKIE, path="/")
        bottle.redirect("/login" if signin.required() else "/")

    # ---- machine endpoints ------------------------------------------------------------
    @app.get("/metrics")
    def metrics():
        try:
            text = collector.exposition()
        except Exception as exc:  # the broker did not answer in time: say so, no half page
            bottle.response.status = 503
            bottle.response.content_type = "text/plain; charset=utf-8"
            return f"odradek: metrics not gathered: {exc}\n"
        bottle.response.content_type = CONTENT_TYPE_LATEST
        bottle.response.set_header("Vary", "Accept-Encoding")
        if accepts_gzip(bottle.request.get_header("Accept-Encoding", "")):
            bottle.response.set_header("Content-Encoding", "gzip")
            return gzip.compress(text, compresslevel=GZIP_LEVEL)
        return text

    @app.get("/health/live")
    def live():
        ok = actor.live()
        bottle.response.status = 200 if ok else 503
        return {"live": ok}

    @app.get("/health/ready")
    def ready():
        try:
            status = actor.status()
        except Exception as exc:  # the loop or the supervisor did not answer
            bottle.response.status = 503
            return {"ready": False, "why": f"no answer from the supervisor: {exc}"}
        waiting = [a["name"] for a in status.get("actors", []) if a.get("state") != "running"]
        ok = status["supervisor"].get("state") == "running" and bool(status["supervisor"].get("address")) \
            and not waiting
        bottle.response.status = 200 if ok else 503
        return {"ready": ok, "supervisor": status["supervisor"].get("state"), "not_running": waiting}

    @app.get("/api/totals")
    def api_totals():
        """What the live charts plot: cumulative counters (the page takes rates) and lag, over
        the topics and groups the user may Describe."""
        return totals(actor.gather(), lambda t: may("Describe", "Topic", t), lambda g: may("Describe", "Group", g))

    @app.get("/api/history")
    def api_history():
        """The last hour of the same numbers (``observe.history``), summed over every topic:
        only for those who may Describe the cluster (anyone, with the authorizer off)."""
        if not may("Describe", "Cluster", "kafka-cluster"):
            return {"interval": INTERVAL, "samples": [], "why": "the history sums every topic: it needs Describe "
                                                                "on the cluster"}
        return {"interval": INTERVAL, "samples": actor.history.samples()}

    @app.get("/static/<path:path>")
    def static(path):
        return bottle.static_file(path, root=STATIC)

    # ---- pages ------------------------------------------------------------------------
    @app.get("/")
    def overview():
        need("Describe", "Cluster", "kafka-cluster")
        status = actor.status()
        return view("overview", title="Cluster", status=status)

    @app.get("/brokers")
    def brokers():
        need("Describe", "Cluster", az.CLUSTER)
        admin = clients_now().admin()
        sup = actor.status()["supervisor"]
        rows, controller, offline = _broker_rows(_metadata(admin))
        listeners = _listeners(actor.config, sup)
        for row in rows:
            row["listeners"] = listeners.get(row["id"], [])
            row.update(_disk(admin, row["id"]))
        return view("brokers", title="Brokers", brokers=rows, controller=controller, offline=offline,
                    here=sup.get("broker_id"), size=human_bytes)

    @app.get("/security")
    def security():
        """The ACLs and the SASL users (names and mechanisms, never a credential), read where
        the broker reads them. Describe on the cluster, as DescribeAcls and
        DescribeUserScramCredentials need."""
        need("Describe", "Cluster", "kafka-cluster")
        acls = [dict(zip(ACL_COLUMNS, a)) for a in signin.acls.data(fresh=True)]
        search = (bottle.request.query.getunicode("q") or "").strip().lower()
        if search:
            acls = [a for a in acls if any(search in str(v).lower() for v in a.values())]
        return view("security", title="ACLs and users", acls=acls, users=signin.users.describe(fresh=True),
                    search=search, authorizer=signin.guard.enabled, editable=may("Alter", "Cluster", az.CLUSTER),
                    message=bottle.request.query.getunicode("msg") or "", choices=ACL_CHOICES,
                    mechanisms=tuple(sasl.SCRAM), iterations=sasl.DEFAULT_ITERATIONS)

    def acl_of_form() -> az.Acl:
        f = bottle.request.forms
        return az.Acl.make((f.getunicode("principal") or "").strip(), f.get("resource") or "",
                           (f.getunicode("name") or "").strip(), f.get("operation") or "",
                           f.get("permission") or "", f.get("pattern") or "", (f.getunicode("host") or "").strip())

    def security_done(message: str):
        bottle.redirect("/security?" + urlencode({"msg": message}))

    @app.post("/security/acls")
    def create_acl():
        """One ACL from the page's form, sent as CreateAcls (Alter on the cluster, as Kafka)."""
        need("Alter", "Cluster", az.CLUSTER)
        try:
            acl = acl_of_form()
            if acl.resource == "Cluster" and acl.name != az.CLUSTER:
                raise ValueError(f"the cluster resource is named {az.CLUSTER}")
            clients_now().admin().create_acls([acl])
        except (ValueError, OdradekError) as exc:
            if isinstance(exc, OdradekError) and exc.code in REFUSED:
                raise
            security_done(f"ACL not added: {exc}")
        security_done(f"Added ACL: {acl.principal} {acl.permission} {acl.operation} on "
                      f"{acl.resource}:{acl.pattern.upper()}:{acl.name} from host {acl.host}")

    @app.post("/security/acls/delete")
    def delete_acl():
        """One ACL of the list, removed with DeleteAcls (a filter naming each of its fields)."""
        need("Alter", "Cluster", az.CLUSTER)
        try:
            acl = acl_of_form()
        except ValueError as exc:
            raise bottle.HTTPError(400, f"not an ACL: {exc}") from None
        removed = clients_now().admin().delete_acls([acl])
        security_done(f"Removed {removed} ACL(s): {acl.principal} {acl.permission} {acl.operation} on "
                      f"{acl.resource}:{acl.pattern.upper()}:{acl.name}")

    @app.post("/security/users")
    def upsert_user():
        """A SCRAM user added (or its password changed), sent as AlterUserScramCredentials:
        the console salts and hashes the password (the request carries no password); it is
        never logged nor put back in a page."""
        need("Alter", "Cluster", az.CLUSTER)
        f = bottle.request.forms
        user, password = (f.getunicode("user") or "").strip(), f.getunicode("password") or ""
        chosen = f.get("mechanism") or "both"
        mechanisms = tuple(sasl.SCRAM) if chosen == "both" else (chosen,)
        iterations = number(f.get("iterations"), "iterations", sasl.DEFAULT_ITERATIONS)
        if not user or not password:
            security_done("User not stored: a user name and a password are needed.")
        try:
            clients_now().admin().upsert_scram_user(user, password, mechanisms, iterations)
        except (ValueError, OdradekError) as exc:
            if isinstance(exc, OdradekError) and exc.code in REFUSED:
                raise
            security_done(f"User not stored: {exc}")
        security_done(f"Stored user {user} ({', '.join(mechanisms)}, {iterations} iterations).")

    @app.post("/security/users/delete")
    def delete_user():
        need("Alter", "Cluster", az.CLUSTER)
        user = (bottle.request.forms.getunicode("user") or "").strip()
        mechanisms = [m for m, _ in signin.users.describe(fresh=True).get(user, ())]
        if not mechanisms:
            raise bottle.HTTPError(404, f"Not found: no user '{user[:100]}'")
        if bottle.request.forms.getunicode("confirm") != user:
            security_done(f"User not deleted: type the user's name ({user}) to confirm.")
        clients_now().admin().delete_scram_user(user, mechanisms)
        security_done(f"Deleted user {user}.")

    @app.get("/topics")
    def topics():
        return topics_page(bottle.request.query.getunicode("msg") or "")

    def topics_page(message: str) -> str:
        """The topic list the user may Describe, with sizes and record counts, filtered by the
        query's search (``q``), internal topics only with ``internal=1``."""
        q = bottle.request.query
        search, internal = (q.getunicode("q") or "").strip(), q.get("internal") == "1"
        rows, hidden = _topic_rows(clients_now().admin(), actor.gather(), search, internal,
                                   lambda name: may("Describe", "Topic", name))
        return view("topics", title="Topics", topics=rows, hidden=hidden, search=search, internal=internal,
                    message=message, size=human_bytes, show_internal="/topics?" + urlencode({"internal": 1,
                                                                                              "q": search}))

    @app.post("/topics")
    def create_topic():
        form = bottle.request.forms
        name = form.get("name", "").strip()
        if not (may("Create", "Topic", name) or may("Create", "Cluster", "kafka-cluster")):
            need("Create", "Topic", name)
        try:
            clients_now().admin().create_topic(name, partitions=number(form.get("partitions"), "partitions", 1),
                                               replication_factor=number(form.get("replication_factor"),
                                                                         "replication factor", 1))
        except Exception as exc:
            return topics_page(f"Could not create {name!r}: {exc}")
        bottle.redirect(f"/topics/{quote(name)}")

    @app.post("/topics/<name>/delete")
    def delete_topic(name):
        need("Delete", "Topic", name)
        if is_internal_topic(name):
            raise bottle.HTTPError(403, f"{name} is an internal topic: the broker keeps it (every group's offsets "
                                        f"or every open transaction live there); it cannot be deleted.")
        if bottle.request.forms.get("confirm") != name:
            return topics_page(f"Not deleted: type the topic's name ({name}) to confirm.")
        clients_now().admin().delete_topic(name)
        bottle.redirect(f"/topics?msg={quote(f'Deleted {name}')}")

    @app.get("/topics/<name>")
    def topic(name):
        need("Describe", "Topic", name)
        admin = clients_now().admin()
        d = admin.describe_topic(name, configs=False)
        configs = admin.describe_configs(name) if may("DescribeConfigs", "Topic", name) else []
        sizes = _partition_gauges(actor.gather(), name)
        return view("topic", title=f"Topic {name}", topic=d, sizes=sizes, configs=sorted(configs),
                    message=bottle.request.query.getunicode("msg") or "")

    @app.post("/topics/<name>/configs")
    def alter(name):
        need("AlterConfigs", "Topic", name)
        key, value = bottle.request.forms.get("key", "").strip(), bottle.request.forms.get("value", "")
        try:
            clients_now().admin().alter_configs(name, set={key: value})
            msg = f"Set {key}={value}"
        except Exception as exc:
            msg = f"Could not set {key}: {exc}"
        bottle.redirect(f"/topics/{quote(name)}?msg={quote(msg)}")  # the page escapes it as it shows it

    @app.get("/topics/<name>/messages")
    def messages(name):
        need("Read", "Topic", name)
        clients = clients_now()
        count = len(clients.admin().describe_topic(name, configs=False).partitions)  # a 404 if there is no topic
        q = bottle.request.query
        chosen = q.get("partition") or "all"
        partitions = list(range(count)) if chosen == "all" else [number(chosen, "partition", 0)]
        if not all(0 <= p < count for p in partitions):
            raise bottle.HTTPError(404, f"Not found: topic '{name}' has no partition {chosen} (it has {count})")
        newest = q.get("order", "newest") != "oldest"
        fmt, key, value = q.get("format") or "text", q.getunicode("key") or "", q.getunicode("value") or ""
        try:
            cursor = parse_cursor(q.get("cursor", ""))
        except ValueError as exc:
            raise bottle.HTTPError(400, f"bad cursor: {exc}") from None
        offset, timestamp = q.get("offset", ""), q.get("timestamp", "")
        consumer = clients.consumer()
        try:
            page = browse(consumer, name, partitions, newest=newest, cursor=cursor,
                          offset=number(offset, "offset", None), timestamp=number(timestamp, "timestamp", None),
                          key=key, value=value)
        finally:
            consumer.close()
        here = {k: v for k, v in (("partition", chosen), ("order", "newest" if newest else "oldest"),
                                  ("format", fmt), ("key", key), ("value", value)) if v}
        return view("messages", title=f"Messages of {name}", topic=name, partition=chosen, partitions=count,
                    message=q.getunicode("msg") or "", internal=is_internal_topic(name),
                    newest=newest, offset=offset, timestamp=timestamp, fmt=fmt, key=key, value=value,
                    records=page.records,
                    error=page.error, render=console_schemas.renderer(schemas, render), when=human_time,
                    next_url=f"?{urlencode({**here, 'cursor': page.cursor})}" if page.cursor else "",
                    first_url=f"?{urlencode(here)}")

    @app.post("/topics/<name>/produce")
    def produce(name):
        """One record typed into the message browser's form (Write on the topic, as Produce)."""
        need("Write", "Topic", name)
        if is_internal_topic(name):
            raise bottle.HTTPError(403, f"{name} is an internal topic: only the broker writes it.")
        f = bottle.request.forms
        partition = number(f.get("partition"), "partition", None)
        key = f.getunicode("key") or ""
        with clients_now().producer() as producer:
            meta = producer.send(name, value=(f.getunicode("value") or "").encode(), key=key.encode() if key else None,
                                 partition=partition).result(15)
        bottle.redirect(f"/topics/{quote(name)}/messages?" + urlencode({
            "partition": meta.partition, "msg": f"Produced to partition {meta.partition} at offset {meta.offset}"}))

    @app.get("/groups")
    def groups():
        try:  # ListGroups lists the groups the user may Describe (all with Describe on the cluster)
            listed = clients_now().groups().list()
        except OdradekError as exc:  # the broker refused or did not answer
            raise bottle.HTTPError(503, f"Groups cannot be listed: {exc}") from None
        search = (bottle.request.query.getunicode("q") or "").strip()
        numbers = _group_numbers(actor.gather())
        rows = [{"members": 0 if g.get("group_state", "").lower() in ("empty", "dead") else "-", **g,
                 **numbers.get(g["group_id"], {})} for g in listed
                if may("Describe", "Group", g["group_id"]) and search.lower() in g["group_id"].lower()]
        return view("groups", title="Consumer groups", groups=rows, search=search,
                    message=bottle.request.query.getunicode("msg") or "")

    @app.get("/groups/<group>")
    def group(group):
        need("Describe", "Group", group)
        return group_page(group, bottle.request.query.getunicode("msg") or "")

    def group_page(group: str, message: str, preview: list | None = None, form: dict | None = None) -> str:
        described = clients_now().groups().describe(group)
        topics = sorted({r["topic"] for r in described["partitions"]})
        return view("group", title=f"Group {group}", group=described, topics=topics, message=message,
                    preview=preview, form=form or {})

    @app.post("/groups/<group>/reset")
    def reset(group):
        """Reset a group's committed offsets: first a dry run showing each partition's current
        and new offset, then, from that page's "Apply" form, the same reset executed (the
        group must have no members, as Kafka's tool requires)."""
        need("Read", "Group", group)  # OffsetCommit's ACLs: Read on the group and on each topic
        f = bottle.request.forms
        form = {"topic": f.getunicode("topic") or "", "partition": f.get("partition") or "", "to": f.get("to") or "",
                "value": f.getunicode("value") or ""}
        partition = number(form["partition"], "partition", None)
        if partition is not None and not form["topic"]:
            raise bottle.HTTPError(400, "a partition is a partition of one topic: choose the topic too")
        topics = [form["topic"] if partition is None else f"{form['topic']}:{partition}"] if form["topic"] else None
        to = RESET_TARGETS.get(form["to"])
        if to is None:
            raise bottle.HTTPError(400, f"reset to {form['to'][:40]!r}: one of {', '.join(RESET_TARGETS)}")
        value = number(form["value"], "the timestamp, shift or offset", None) \
            if to in ("datetime", "shift", "offset") else None
        if to in ("datetime", "shift", "offset") and value is None:
            raise bottle.HTTPError(400, f"reset to {form['to']} needs a value (ms since the epoch, +/- records, "
                                        f"or an offset)")
        execute = f.get("execute") == "1"
        admin = clients_now().groups()
        try:
            plan = admin.reset_offsets(group, topics, to=to, value=value, execute=False)
            for name in sorted({tp.topic for tp in plan}):
                need("Read", "Topic", name)
            if execute:
                plan = admin.reset_offsets(group, topics, to=to, value=value, execute=True)
        except (OdradekError, ValueError) as exc:  # an active group, a topic that is not there: say so
            return group_page(group, f"Not reset: {exc}", form=form)
        if execute:
            moved = sum(1 for old, new in plan.values() if old != new)
            bottle.redirect(f"/groups/{quote(group)}?msg=" + quote(f"Reset {len(plan)} partition(s) to "
                                                                   f"{form['to']}: {moved} moved"))
        rows = [(tp.topic, tp.partition, old, new) for tp, (old, new) in plan.items()]
        clamped = sum(1 for *_, new in rows if to == "offset" and new != value)
        note = f" {clamped} partition(s) do not hold offset {value}: their new offset is the log's nearest end " \
               f"(as kafka-consumer-groups --to-offset)." if clamped else ""
        return group_page(group, "Dry run: nothing committed yet. Apply to commit these offsets." + note,
                          preview=rows, form=form)

    @app.post("/groups/<group>/delete")
    def delete_group(group):
        need("Delete", "Group", group)
        if bottle.request.forms.getunicode("confirm") != group:
            return group_page(group, f"Not deleted: type the group's name ({group}) to confirm.")
        try:
            clients_now().groups().delete(group)
        except OdradekError as exc:  # NON_EMPTY_GROUP: its consumers still run
            if exc.code in NOT_FOUND:
                raise
            return group_page(group, f"Not deleted: {exc}")
        bottle.redirect("/groups?msg=" + quote(f"Deleted group {group}"))

    @app.get("/charts")
    def charts():
        return view("charts", title="Live charts")

    return app


def _viewer():
    """``view(name, **kw)``: render ``observe/views/<name>.tpl`` inside the layout, with the
    signed-in user (or None) and the session's CSRF token for its forms."""
    lookup = [VIEWS]

    def view(name: str, **kw) -> str:
        session = bottle.request.environ.get("odradek.session")
        return bottle.template(name, template_lookup=lookup, user=session.user if session else None,
                               csrf=session.csrf if session else "", **kw)
    return view


def _local(path: str | None) -> str:
    """Where to go after signing in: a path of this console only (no open redirect)."""
    return path if path and path.startswith("/") and not path.startswith("//") and "\\" not in path else "/topics"


def _metadata(admin) -> dict:
    """One Metadata request for every topic, its raw body (brokers with racks, each topic's
    partitions with leader, replicas and ISR): ``Admin.describe_topic`` would be one request
    per topic."""
    return admin._cluster.refresh(None)


def _broker_rows(body: dict) -> tuple[list[dict], int | None, int]:
    """Each live broker of a Metadata body with the replicas it hosts, the partitions it leads
    and, of those, the under-replicated ones; the controller's id; partitions without a leader."""
    rows = {b["node_id"]: {"id": b["node_id"], "address": f"{b['host']}:{b['port']}", "rack": b.get("rack"),
                           "replicas": 0, "leaders": 0, "under_replicated": 0} for b in body.get("brokers", [])}
    offline = 0
    for t in body.get("topics", []):
        for p in t.get("partitions") or ():
            for r in p.get("replicas") or ():
                if r in rows:
                    rows[r]["replicas"] += 1
            leader = p.get("leader", -1)
            if leader in rows:
                rows[leader]["leaders"] += 1
                rows[leader]["under_replicated"] += len(p.get("isr") or ()) < len(p.get("replicas") or ())
            else:
                offline += 1
    return sorted(rows.values(), key=lambda r: r["id"]), body.get("controller_id"), offline


def _listeners(config: dict, sup: dict) -> dict[int, list[str]]:
    """broker id -> its listeners (``NAME host:port``): in a cluster, as each broker registered
    them in ZooKeeper (``/brokers/ids/<id>``, the addresses it advertises, what the controller
    hands to clients); on one broker, the addresses its listeners are bound to."""
    if not config.get("zookeeper.connect"):
        return {sup.get("broker_id"): [f"{name} {address}" for name, address in (sup.get("listeners") or {}).items()]}
    from odradek.coordinator.active_controller import registered_endpoints
    zk = secstore.zk_session(config["zookeeper.connect"], config.get("zookeeper.connection.timeout.ms", 10000) / 1000)
    out = {}
    for child in zk.get_children("/brokers/ids"):
        try:
            raw, _ = zk.get(f"/brokers/ids/{child}")
            out[int(child)] = [f"{name} {host}:{port}" for name, (host, port) in
                               sorted(registered_endpoints(json.loads(raw)).items())]
        except Exception as exc:  # a broker gone between the listing and the read, a bad node: shown without
            log.debug("console: broker registration %s: %s", child, exc)
    return out


def _disk(admin, broker: int) -> dict:
    """A broker's disk from DescribeLogDirs: ``logs`` (bytes of the partitions it hosts),
    ``free`` and ``total`` (of its log directories' volumes), or ``disk_error``."""
    try:
        dirs = admin.describe_log_dirs(broker)
    except OdradekError as exc:  # refused, or the broker did not answer: the row says so
        return {"disk_error": str(exc)}
    return {"logs": sum(p.get("partition_size", 0) for d in dirs for t in d.get("topics") or ()
                        for p in t.get("partitions") or ()),
            "free": sum(max(0, d.get("usable_bytes", 0)) for d in dirs),
            "total": sum(max(0, d.get("total_bytes", 0)) for d in dirs)}


class TopicRow(NamedTuple):
    name: str
    partitions: int
    replicas: int
    internal: bool
    size: int | None  # bytes of its partitions hosted on this broker (None: none here)
    records: int | None  # high watermark - log start, summed: offsets, so compacted gaps count


def _topic_rows(admin, snap, search: str, internal: bool, shown) -> tuple[list[TopicRow], int]:
    """The topics ``shown(name)`` allows whose name contains ``search`` (any case), internal
    ones only if ``internal``, from one metadata request (every topic) and the log actors'
    partition rows; and how many internal topics were left out."""
    body = _metadata(admin)
    sums: dict[str, list] = {}
    for answer in snap.answers.values():
        for name, labels, value in (answer or {}).get("gauges") or ():
            if name == "partition":
                row = dict(zip(PARTITION_COLUMNS, value))
                t = sums.setdefault(labels[0], [0, 0])
                t[0] += row["log_size"]
                t[1] += row["high_watermark"] - row["log_start_offset"]
    rows, hidden, search = [], 0, search.lower()
    for t in sorted(body.get("topics", []), key=lambda t: t["name"]):
        name = t["name"]
        if t.get("error_code") or not shown(name) or search not in name.lower():
            continue
        is_internal = bool(t.get("is_internal")) or is_internal_topic(name)
        if is_internal and not internal:
            hidden += 1
            continue
        parts = t.get("partitions") or []
        size, records = sums.get(name, (None, None))
        rows.append(TopicRow(name, len(parts), len(parts[0].get("replicas") or ()) if parts else 0, is_internal,
                             size, records))
    return rows, hidden


def _group_numbers(snap) -> dict[str, dict]:
    """group -> {"members", "lag", "topics"} as this broker knows them (the groups it
    coordinates; lag where it also hosts the partitions: all of them on one broker)."""
    members, lag = group_numbers(snap)
    out: dict[str, dict] = {g: {"members": n} for g, n in members.items()}
    for (group, topic), n in sorted(lag.items()):
        g = out.setdefault(group, {})
        g["lag"] = g.get("lag", 0) + int(n)
        g.setdefault("topics", []).append(topic)
    return out


def human_time(ms: int) -> str:
    """A record's timestamp as the page first shows it (UTC; the page's script then shows it
    in the reader's own zone)."""
    if ms is None or ms < 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] \
        + " UTC"


def human_bytes(n: int | None) -> str:
    return fmt_bytes(n, " ")


def _partition_gauges(snap, topic: str) -> dict:
    """partition -> {log_size, log_segments, log_end_offset, high_watermark, ...} of
    ``topic``, from the log actors' partition rows (whatever ``metrics.partition.level`` says)."""
    out: dict[int, dict] = {}
    for answer in snap.answers.values():
        for name, labels, value in (answer or {}).get("gauges") or ():
            if name == "partition" and labels[0] == topic:
                out[labels[1]] = dict(zip(PARTITION_COLUMNS, value))
    return out
