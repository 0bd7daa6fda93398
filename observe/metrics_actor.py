"""The metrics actor: Prometheus metrics, health checks and the web console over HTTP.

Process: ``metrics`` (one per broker, started last, so stopped first).
Owns: the admin listener (``admin.listener``; empty turns the HTTP side off) and its HTTP
server (waitress: a loop and ``HTTP_THREADS`` workers) serving ``/metrics`` (Prometheus text,
``prometheus_client``), ``/health/live``, ``/health/ready`` and the console (``observe.console``
behind ``observe.hostcheck``); the charts' history (``observe.history.Sampler``, a thread).
Accepts: no message of its own (the runtime's). The HTTP threads reach the actor's loop with
``run_run_on_loop(start, timeout)``: ``post()``, then a future awaited at most ``timeout``.
Sends (at scrape time and every ``history.INTERVAL`` for the charts): ``status`` to the
supervisor (the actor table) and ``_metrics`` to every actor running at the previous scrape
and any the new table adds (each answers with its counters, histograms and gauges:
``actors.metrics``).
Invariants: the loop never blocks on HTTP and the HTTP threads never touch its sockets or
state; an actor that does not answer within ``GATHER_TIMEOUT`` is reported missing
(``odradek_scrape_actor_answered 0``). The console talks to the broker as a client (``Admin``,
``Consumer`` over its own listener).
"""
from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time

import psutil

from odradek.actors import http_listener
from odradek.actors.message import Message
from odradek.actors.messages import ScrapeMetrics, Status
from odradek.actors.runtime import Actor
from odradek.core.protocol import ErrorCode, OdradekError, http_address
from odradek.observe.collector import Snapshot
from odradek.observe.history import History, Sampler

log = logging.getLogger("odradek.metrics")

GATHER_TIMEOUT = 0.8  # seconds an actor has to answer a scrape (a scrape must answer within 1 s)
LIVE_TIMEOUT = 2.0  # seconds the loop has to run a posted callback for /health/live
HTTP_THREADS = 8  # requests served at once (a message browser page may take BROWSE_TIMEOUT); more wait
HTTP_SETTINGS = http_listener.http_settings("odradek", 1024 * 1024, HTTP_THREADS)  # forms are small


def admin_address(config: dict) -> tuple[str, int] | None:
    """``admin.listener`` as (host, port); None when empty (off). ``HOST:+N`` is the Kafka
    listener's port plus N (``core.protocol.http_address``)."""
    return http_address(config.get("admin.listener"), config["listeners"])


class ProcessTimes:
    """CPU seconds and start time of each actor's process, by pid from the supervisor's
    table (``psutil``; a process object kept while it runs: ``is_running`` compares its start
    time, so a reused pid is not taken for the actor's). HTTP threads of scrapes, one at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._procs: dict[int, psutil.Process] = {}

    def read(self, rows) -> dict[str, tuple[float, float]]:
        out = {}
        with self._lock:
            live = {}
            for row in rows:
                pid = row.get("pid")
                if not pid or row.get("state") != "running":
                    continue
                try:
                    proc = self._procs.get(pid)
                    if proc is None or not proc.is_running():
                        proc = psutil.Process(pid)
                    times = proc.cpu_times()
                    out[row["name"]] = (times.user + times.system, proc.create_time())
                    live[pid] = proc
                except psutil.Error:  # gone since the table was made: no sample this scrape
                    continue
            self._procs = live
        return out


class MetricsActor(Actor):
    def on_start(self) -> None:
        self.config = self.args.get("config", {})
        self.server = None
        self.host = self.port = None
        self._last_status: dict | None = None  # used when the supervisor is too busy to answer a scrape
        self._processes = ProcessTimes()
        self.history = History()  # the charts' last hour, sampled once the HTTP side serves
        self.sampler: Sampler | None = None
        address = admin_address(self.config)
        if address is None:
            log.info("admin.listener is empty: no metrics, health or console over HTTP")
            return
        from odradek.observe.console import make_app  # bottle and templates: only when serving
        from odradek.observe.hostcheck import HostCheck, known_names
        app = HostCheck(make_app(self), known_names(self.config, address[0]))  # no DNS rebinding
        try:
            self.server, self.host, self.port = http_listener.serve(app, address, HTTP_SETTINGS, "admin-http")
        except OSError as exc:  # the broker serves clients all the same; say why there is no console
            log.error("admin.listener %s:%d cannot be bound (%s): no metrics, health or console over HTTP; "
                      "set admin.listener to a free address, or empty to turn it off", *address,
                      exc.strerror or exc)
            return
        self.sampler = Sampler(self.gather, self.history)
        self.sampler.start()
        log.info("metrics, health and console on http://%s:%d/", self.host, self.port)

    def on_stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        http_listener.stop(self.server)

    def ready_fields(self) -> dict:
        return {"admin_host": self.host, "admin_port": self.port}

    # ---- called from HTTP threads: hand the work to the loop, wait with a timeout ---------
    def run_on_loop(self, start, timeout: float):
        """Run ``start(done)`` on the actor's loop; it calls ``done(result)`` (or
        ``done(exception)``) when finished. Returns the result; raises TimeoutError."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def done(result) -> None:
            if not future.done():
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

        self.post(lambda: start(done))
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"the broker did not answer within {timeout:g}s (its actors or this "
                               f"actor's loop are too busy)") from None

    def gather(self, timeout: float = GATHER_TIMEOUT) -> Snapshot:
        """Every actor's metrics and the supervisor's table, gathered by message, and each
        actor's process times (read here, on the HTTP thread: /proc, not the loop)."""
        snap = self.run_on_loop(functools.partial(self._gather, timeout), timeout * 2 + 1.0)
        snap.processes = self._processes.read(snap.status.get("actors") or ())
        return snap

    def status(self, timeout: float = 2.0) -> dict:
        """The supervisor's ``status`` (the actor tree, the broker's address)."""
        return self.run_on_loop(functools.partial(self._ask_status, timeout), timeout + 1.0)

    def live(self) -> bool:
        """True if the loop runs a posted callback within LIVE_TIMEOUT."""
        try:
            return self.run_on_loop(lambda done: done(True), LIVE_TIMEOUT)
        except TimeoutError:
            return False

    # ---- on the loop ------------------------------------------------------------------
    def _ask_status(self, timeout: float, done) -> None:
        def answered(reply: Message) -> None:
            done(OdradekError(reply.error_message, ErrorCode.of(reply.error_code)) if reply.is_error
                 else reply.fields._asdict())
        self.request(self.supervisor, Status(), callback=answered, timeout=timeout)

    def _gather(self, timeout: float, done) -> None:
        """``status`` to the supervisor and ``_metrics`` to the actors running at the last
        scrape, at once (one round trip, not two); an actor the new table adds is asked
        when it comes, one it no longer lists running is left out of the snapshot."""
        began = time.monotonic()
        answers: dict[str, dict | None] = {self.name: {"name": self.name, **self.metrics.snapshot(), "gauges": []}}
        table: list = [None]  # the supervisor's status, once known
        left = [0]

        def running(status: dict) -> list[str]:
            return [r["name"] for r in status.get("actors", [])
                    if r.get("state") == "running" and r["name"] != self.name]

        def finish() -> None:
            if table[0] is None or left[0]:
                return
            now = set(running(table[0])) | {self.name}
            done(Snapshot(table[0], {k: v for k, v in answers.items() if k in now}, time.monotonic() - began))

        def got(name: str, reply: Message) -> None:
            if not reply.is_error:
                answers[name] = {"name": reply.fields.name, **reply.fields.snapshot, "gauges": reply.fields.gauges}
            left[0] -= 1
            finish()

        def ask(names: list[str]) -> None:
            for name in names:
                if name not in answers:
                    answers[name] = None
                    left[0] += 1
                    self.request(name, ScrapeMetrics(), callback=functools.partial(got, name), timeout=timeout)

        def with_status(status) -> None:
            if isinstance(status, BaseException):
                if self._last_status is None:
                    done(status)
                    return
                log.warning("scrape: %s; using the actor table of the previous scrape", status)
                status = self._last_status
            else:
                self._last_status = status
            table[0] = status
            ask(running(status))
            finish()

        if self._last_status is not None:
            ask(running(self._last_status))
        self._ask_status(timeout, with_status)
