"""The schema registry actor: Confluent's Schema Registry REST API on a listener of its own.

Process: ``schema_registry`` (one per broker, started after the acceptor and before the
metrics actor, so stopped just after it).
Owns: the ``SchemaRegistry`` (``coordinator.schema_registry``, the pure state machine), the
listener ``schema.registry.listener`` (empty: the actor idles) and its HTTP server (waitress,
as the metrics actor's), whose WSGI application is ``coordinator.registry_http``.
Durable form: the compacted internal topic ``_schemas`` (one partition), of which this actor
is the only writer, through the log actor hosting it (``produce`` acks=-1). It is created
through the controller on the first write; at start it is replayed from its files
(``coordinator.internal_replay``: a record that cannot be read is logged and skipped) before
the actor reports ready, so the registry answers only once it has every schema.

Threads. HTTP threads never touch the registry: each request is turned into an operation
and handed to the loop with ``post()``, awaited on a future with ``ANSWER_TIMEOUT``. On the
loop, reads are answered at once; writes run one at a time (``_writes``, a queue): planned
against the state, their records appended, then applied and answered, so two concurrent
registrations never hand out one id twice.

Cluster mode is not served yet: with ``zookeeper.connect`` set the actor logs so and idles
(docs/SCHEMAS.md).

Sends: ``get_metadata`` and ``create_topics`` to the controller; ``get_bounds`` and
``produce`` to the log actor hosting ``_schemas``-0. Accepts nothing but the runtime's own
messages.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading

import waitress

from odradek.actors.message import Message
from odradek.actors.names import CONTROLLER, LogBounds, PartitionBounds, ProducePart, log_host
from odradek.actors.runtime import Actor
from odradek.coordinator.internal_replay import InternalReplay
from odradek.coordinator.registry_http import MAX_BODY, Gate, make_app
from odradek.coordinator.schema_registry import Plan, RegistryError, SchemaRegistry
from odradek.log.records import encode_batch
from odradek.network.protocol import SCHEMAS_TOPIC, ErrorCode, OdradekError, http_address

log = logging.getLogger("odradek.schemas")

ANSWER_TIMEOUT = 30.0  # seconds an HTTP request waits for the loop (a write: the topic's creation and an fsync)
WRITE_TIMEOUT_MS = 10_000  # an acks=-1 append of registry records waits this long for the ISR
HTTP_SETTINGS = dict(threads=4, connection_limit=100, channel_timeout=30, max_request_header_size=64 * 1024,
                     max_request_body_size=MAX_BODY, asyncore_use_poll=True, ident="odradek-schema-registry",
                     expose_tracebacks=False)


class SchemaRegistryActor(Actor):
    # ---- start -------------------------------------------------------------------------
    def on_start(self) -> None:
        self.config = self.args["config"]
        self.data_dir = self.args["data_dir"]
        self.log_hosts = int(self.args.get("log_hosts", self.config["num.log.threads"]))
        self.registry = SchemaRegistry()
        self.server = None
        self.host = self.port = None
        self.exists = False  # _schemas is in the controller's metadata
        self._writes: collections.deque = collections.deque()  # (op, done) waiting their turn
        self._writing = False
        self.skipped = self.writes = 0
        address = http_address(self.config.get("schema.registry.listener"), self.config["listeners"])
        if address is None:
            log.info("schema.registry.listener is empty: no schema registry")
            return
        if self.config.get("zookeeper.connect"):
            log.warning("the schema registry is not served in cluster mode yet (docs/SCHEMAS.md)")
            return
        try:
            self._replay_at_start()
        except (OdradekError, OSError) as exc:  # the broker serves Kafka clients all the same; say why not this
            log.error("the schema registry cannot read %s (%s): no schema registry until the broker restarts",
                      SCHEMAS_TOPIC, getattr(exc, "message", exc))
            return
        try:
            server = waitress.create_server(make_app(self.submit, Gate(self.config, self.data_dir)), host=address[0], port=address[1], **HTTP_SETTINGS)
        except OSError as exc:  # the broker serves Kafka clients all the same; say why there is no registry
            log.error("schema.registry.listener %s:%d cannot be bound (%s): no schema registry; set it to a free "
                      "address, or empty to turn it off", *address, exc.strerror or exc)
            return
        self.server = server
        port = getattr(server, "effective_port", None)
        self.host, self.port = address[0], int(port if port is not None else server.effective_listen[0][1])
        threading.Thread(target=server.run, name="schema-registry-http", daemon=True).start()
        log.info("schema registry on http://%s:%d/ (%d subjects)", self.host, self.port,
                 len(self.registry.subjects))

    def _replay_at_start(self) -> None:
        """Read ``_schemas``-0 back into the registry (blocking: before the actor is ready)."""
        snapshot = self.call(CONTROLLER, "get_metadata", timeout=60.0).fields
        self.exists = SCHEMAS_TOPIC in (snapshot.get("topics") or {})
        if not self.exists:
            return
        fields = self.call(self._host(), "get_bounds", timeout=60.0).fields
        bounds = next((PartitionBounds(*p).bounds for p in fields.get("parts") or ()
                       if p[0] == SCHEMAS_TOPIC and p[1] == 0), None)
        if bounds is None:
            raise OdradekError(f"{SCHEMAS_TOPIC}-0 exists but {self._host()} does not host it",
                               ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        self._replay(bounds)

    def _replay(self, bounds: LogBounds) -> None:
        files = InternalReplay(self.data_dir, SCHEMAS_TOPIC, 0, bounds)
        try:
            records = 0
            for r in files.records():
                why = self.registry.apply(r.key, r.value)
                if why:
                    files.skip(r.offset, why)
                records += 1
        finally:
            self.skipped += files.skipped
            files.close()
        log.info("replayed %s-0: %d records, %d subjects, %d schemas", SCHEMAS_TOPIC, records,
                 len(self.registry.subjects), len(self.registry.by_id))

    def _host(self) -> str:
        return log_host(SCHEMAS_TOPIC, 0, self.log_hosts)

    def on_stop(self) -> None:
        if self.server is not None:
            self.server.task_dispatcher.shutdown(timeout=2)
            self.server.close()
        while self._writes:
            _op, done = self._writes.popleft()
            done(RegistryError(500, 50001, "the schema registry is stopping"))

    def ready_fields(self) -> dict:
        return {"registry_host": self.host, "registry_port": self.port}

    def stats(self) -> dict:
        return {"subjects": len(self.registry.subjects), "schemas": len(self.registry.by_id),
                "writes": self.writes, "skipped_records": self.skipped, "queued_writes": len(self._writes)}

    # ---- called from HTTP threads ----------------------------------------------------------
    def submit(self, op, write: bool):
        """Run ``op`` on the loop (``write``: in turn, its records stored first); its answer."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def done(result) -> None:
            if not future.done():
                (future.set_exception if isinstance(result, BaseException) else future.set_result)(result)

        self.post(lambda: self._enqueue(op, done) if write else self._read(op, done))
        try:
            return future.result(ANSWER_TIMEOUT)
        except concurrent.futures.TimeoutError:
            raise RegistryError(504, 50002, f"the registry did not answer within {ANSWER_TIMEOUT:g}s; "
                                            f"retry") from None

    # ---- on the loop ----------------------------------------------------------------------
    def _read(self, op, done) -> None:
        try:
            done(op(self.registry))
        except Exception as exc:  # RegistryError for the client; anything else is a bug, logged by the app
            done(exc)

    def _enqueue(self, op, done) -> None:
        self._writes.append((op, done))
        if not self._writing:
            self._next_write()

    def _next_write(self) -> None:
        """Plan the next queued write against the state now, store its records, apply, answer."""
        while self._writes:
            op, done = self._writes.popleft()
            try:
                plan: Plan = op(self.registry)
            except Exception as exc:
                done(exc)
                continue
            if not plan.records:
                done(plan.answer)
                continue
            self._writing = True
            self._store(plan.records, lambda error, plan=plan, done=done: self._stored(plan, done, error))
            return
        self._writing = False

    def _stored(self, plan: Plan, done, error: str | None) -> None:
        if error:
            done(RegistryError(500, 50001, f"Error while storing the schema: {error}"))
        else:
            self.writes += 1
            for key, value in plan.records:
                why = self.registry.apply(key, value)
                assert why is None, why  # a record this module built
            done(plan.answer)
        self._next_write()

    def _store(self, records: list, then) -> None:
        """Append ``records`` to ``_schemas``-0 (created first if need be); ``then(None)`` once
        the ISR has them, ``then(why)`` if not."""
        if not self.exists:
            self._create(lambda why: then(why) if why else self._store(records, then))
            return

        def answered(reply: Message) -> None:
            if reply.is_error:
                then(f"{ErrorCode.of(reply.error_code).name}: {reply.error_message}")
                return
            try:
                p = reply.fields["body"]["topics"][0]["partitions"][0]
                code, why = p.get("error_code") or 0, p.get("error_message") or ""
            except (KeyError, IndexError, TypeError):
                code, why = int(ErrorCode.UNKNOWN_SERVER_ERROR), "malformed answer from the log actor"
            then(f"{ErrorCode.of(code).name}: {why}" if code else None)

        self.request(self._host(), "produce",
                     {"acks": -1, "timeout_ms": WRITE_TIMEOUT_MS, "parts": [ProducePart(SCHEMAS_TOPIC, 0, 0)]},
                     [encode_batch(records)], callback=answered, timeout=WRITE_TIMEOUT_MS / 1000 + 5)

    def _create(self, then) -> None:
        """Create ``_schemas`` (one partition, compacted) through the controller, as Confluent's
        registry does at its first start; ``then(None)`` once it is in the metadata."""
        def created(reply: Message) -> None:
            result = {} if reply.is_error else reply.fields["body"]["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            if code not in (0, None, ErrorCode.TOPIC_ALREADY_EXISTS):
                why = reply.error_message if reply.is_error else result.get("error_message")
                log.error("cannot create %s: %s", SCHEMAS_TOPIC, why)
                then(f"cannot create {SCHEMAS_TOPIC}: {why}")
                return
            log.info("created %s", SCHEMAS_TOPIC)
            self.exists = True
            then(None)

        self.request(CONTROLLER, "create_topics", {"body": {"topics": [{
            "name": SCHEMAS_TOPIC, "num_partitions": 1, "replication_factor": 1,
            "configs": {"cleanup.policy": "compact"}}]}}, callback=created, timeout=60.0)
