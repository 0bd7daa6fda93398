"""The HTTP side of the metrics actor: /metrics, /health/*, and the web console (bottle).

Runs on the metrics actor's HTTP server threads. It reaches the broker two ways, never
through the actor's sockets: ``actor.gather()`` / ``actor.status()`` / ``actor.live()``
(handed to the actor's loop, answered by message), and the broker's own Kafka listener as
a client (``Admin``, ``GroupAdmin``, ``Consumer``), like any operator tool. Nothing in a
page loads from the internet: the stylesheet and the chart script are served from
``observe/static``.

Pages: ``/`` cluster and actor tree; ``/topics`` (create; delete with the name typed again);
``/topics/<t>`` partitions, leaders, ISR, sizes, configs (alter); ``/topics/<t>/messages``
the message browser (partition, from an offset or a timestamp, text / JSON / hex, key
filter); ``/groups`` and ``/groups/<g>`` members, assignments, lag per partition;
``/charts`` live throughput and lag (``/api/totals`` polled by the page).
Security (SASL sign-in, ACLs) is a later issue: today the console is open to whoever can
reach the admin listener, which is why it defaults to 127.0.0.1.
"""
from __future__ import annotations

import json
import os
import threading
import time

import bottle
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from odradek.observe.catalogue import PARTITION_COLUMNS
from odradek.observe.collector import BrokerCollector, families

HERE = os.path.dirname(os.path.abspath(__file__))
VIEWS = os.path.join(HERE, "views")
STATIC = os.path.join(HERE, "static")
BROWSE_LIMIT = 100  # records shown by the message browser at most
BROWSE_TIMEOUT = 3.0  # seconds the browser polls for records


class Clients:
    """The console's Kafka clients of its own broker, made on first use (the address is
    known once the broker is ready) and shared by the HTTP threads (they are thread-safe)."""

    def __init__(self, actor):
        self.actor = actor
        self._lock = threading.Lock()
        self._admin = self._groups = None
        self.bootstrap: str | None = None

    def _address(self) -> str:
        if self.bootstrap is None:
            address = self.actor.status()["supervisor"].get("address")
            if not address:
                raise bottle.HTTPError(503, "the broker is still starting")
            self.bootstrap = address
        return self.bootstrap

    def admin(self):
        with self._lock:
            if self._admin is None:
                from odradek.admin import Admin
                self._admin = Admin(self._address(), client_id="odradek-console", request_timeout_ms=10000)
            return self._admin

    def groups(self):
        with self._lock:
            if self._groups is None:
                from odradek.group import GroupAdmin
                self._groups = GroupAdmin(self._address(), client_id="odradek-console", request_timeout_ms=10000)
            return self._groups

    def consumer(self):
        from odradek.consumer import Consumer
        return Consumer(self._address(), client_id="odradek-console", enable_auto_commit=False,
                        auto_offset_reset="earliest", request_timeout_ms=10000)


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


def make_app(actor) -> bottle.Bottle:
    app = bottle.Bottle()
    clients = Clients(actor)
    collector = BrokerCollector(actor.gather, bool(actor.config.get("metrics.partition.level", False)))
    view = _viewer()

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
    def totals():
        """What the live charts plot: cumulative counters (the page takes rates) and lag."""
        snap = actor.gather()
        out = {"time": time.time(), "bytes_in": 0, "records_in": 0, "bytes_out": 0, "records_out": 0, "lag": {}}
        for fam in families(snap):
            for s in fam.samples:
                if s.name == "odradek_topic_bytes_in_total":
                    out["bytes_in"] += s.value
                elif s.name == "odradek_topic_records_in_total":
                    out["records_in"] += s.value
                elif s.name == "odradek_topic_bytes_out_total":
                    out["bytes_out"] += s.value
                elif s.name == "odradek_topic_records_out_total":
                    out["records_out"] += s.value
                elif s.name == "odradek_consumer_group_topic_lag":
                    g = s.labels["group"]
                    out["lag"][g] = out["lag"].get(g, 0) + s.value
        return out

    @app.get("/static/<path:path>")
    def static(path):
        return bottle.static_file(path, root=STATIC)

    # ---- pages ------------------------------------------------------------------------
    @app.get("/")
    def overview():
        status = actor.status()
        return view("overview", title="Cluster", status=status)

    @app.get("/topics")
    def topics():
        admin = clients.admin()
        names = admin.list_topics(include_internal=True)
        described = [admin.describe_topic(n) for n in sorted(names)]
        return view("topics", title="Topics", topics=described, message=bottle.request.query.get("msg", ""))

    @app.post("/topics")
    def create_topic():
        form = bottle.request.forms
        name = form.get("name", "").strip()
        try:
            clients.admin().create_topic(name, partitions=int(form.get("partitions") or 1),
                                         replication_factor=int(form.get("replication_factor") or 1))
        except Exception as exc:
            return view("topics", title="Topics", topics=_described(clients), message=f"Could not create {name!r}: {exc}")
        bottle.redirect(f"/topics/{name}")

    @app.post("/topics/<name>/delete")
    def delete_topic(name):
        if bottle.request.forms.get("confirm") != name:
            return view("topics", title="Topics", topics=_described(clients),
                        message=f"Not deleted: type the topic's name ({name}) to confirm.")
        clients.admin().delete_topic(name)
        bottle.redirect(f"/topics?msg=Deleted+{name}")

    @app.get("/topics/<name>")
    def topic(name):
        admin = clients.admin()
        d = admin.describe_topic(name)
        sizes = _partition_gauges(actor.gather(), name)
        return view("topic", title=f"Topic {name}", topic=d, sizes=sizes,
                    message=bottle.request.query.get("msg", ""))

    @app.post("/topics/<name>/configs")
    def alter(name):
        key, value = bottle.request.forms.get("key", "").strip(), bottle.request.forms.get("value", "")
        try:
            clients.admin().alter_configs(name, set={key: value})
            msg = f"Set {key}={value}"
        except Exception as exc:
            msg = f"Could not set {key}: {exc}"
        bottle.redirect(f"/topics/{name}?msg={bottle.html_quote(msg)}")

    @app.get("/topics/<name>/messages")
    def messages(name):
        q = bottle.request.query
        partition = int(q.get("partition") or 0)
        fmt = q.get("format") or "text"
        key_filter = q.get("key", "")
        records, error = _browse(clients, name, partition, q.get("offset", ""), q.get("timestamp", ""), key_filter)
        return view("messages", title=f"Messages of {name}", topic=name, partition=partition,
                    offset=q.get("offset", ""), timestamp=q.get("timestamp", ""), fmt=fmt, key=key_filter,
                    records=records, error=error, render=render,
                    partitions=len(clients.admin().describe_topic(name).partitions))

    @app.get("/groups")
    def groups():
        return view("groups", title="Consumer groups", groups=clients.groups().list())

    @app.get("/groups/<group>")
    def group(group):
        return view("group", title=f"Group {group}", group=clients.groups().describe(group))

    @app.get("/charts")
    def charts():
        return view("charts", title="Live charts")

    return app


def _viewer():
    """``view(name, **kw)``: render ``observe/views/<name>.tpl`` inside the layout."""
    lookup = [VIEWS]

    def view(name: str, **kw) -> str:
        return bottle.template(name, template_lookup=lookup, **kw)
    return view


def _described(clients: Clients) -> list:
    admin = clients.admin()
    return [admin.describe_topic(n) for n in sorted(admin.list_topics(include_internal=True))]


def _partition_gauges(snap, topic: str) -> dict:
    """partition -> {log_size, log_segments, log_end_offset, high_watermark, ...} of
    ``topic``, from the log actors' partition rows (whatever ``metrics.partition.level`` says)."""
    out: dict[int, dict] = {}
    for answer in snap.answers.values():
        for name, labels, value in (answer or {}).get("gauges") or ():
            if name == "partition" and labels[0] == topic:
                out[labels[1]] = dict(zip(PARTITION_COLUMNS, value))
    return out


def _browse(clients: Clients, topic: str, partition: int, offset: str, timestamp: str, key_filter: str):
    """Up to BROWSE_LIMIT records of one partition from an offset (default: the start) or
    a timestamp (ms), keeping those whose key contains ``key_filter``."""
    from odradek.types import TopicPartition
    tp = TopicPartition(topic, partition)
    consumer = clients.consumer()
    try:
        consumer.assign([tp])
        if timestamp.strip():
            start = consumer.offsets_for_times({tp: int(timestamp)}).get(tp, -1)
            if start < 0:
                return [], f"no record at or after timestamp {timestamp}"
        elif offset.strip():
            start = int(offset)
        else:
            start = consumer.beginning_offsets([tp])[tp]
        consumer.seek(tp, start)
        out, deadline = [], time.monotonic() + BROWSE_TIMEOUT
        end = consumer.end_offsets([tp])[tp]
        while len(out) < BROWSE_LIMIT and time.monotonic() < deadline and consumer.position(tp) < end:
            for r in consumer.poll(timeout_ms=200, max_records=BROWSE_LIMIT):
                if not key_filter or key_filter.encode() in (r.key or b""):
                    out.append(r)
        return out[:BROWSE_LIMIT], ""
    except ValueError as exc:
        return [], f"bad offset or timestamp: {exc}"
    except Exception as exc:
        return [], str(exc)
    finally:
        consumer.close()
