"""The schema registry actor: Confluent's Schema Registry REST API on a listener of its own.

Process: ``schema_registry`` (one per broker).
Owns: the ``SchemaRegistry`` (``coordinator.schema_registry``, the pure state machine), the
listener ``schema.registry.listener`` (empty: the actor idles) and its HTTP server (waitress;
WSGI application ``coordinator.registry_http``), and the registry's durable form, the
compacted one-partition topic ``_schemas``, created through the controller on the first write.
Accepts: nothing of its own (HTTP threads hand each operation to the loop with ``post()`` and
wait on a future, at most ``ANSWER_TIMEOUT``).
Sends: ``get_metadata`` and ``create_topics`` to the controller; ``get_bounds`` and ``produce``
(acks=-1) to the log actor hosting ``_schemas``-0.
Invariants: the only writer of ``_schemas`` (in a cluster, the registry of the broker leading
``_schemas``-0; the others forward writes to it at the URL it publishes in ZooKeeper, and
follow their own replica for reads: docs/SCHEMAS.md, "Cluster mode"); an append is fenced by
the partition's leader epoch. HTTP threads never touch the registry; writes run one at a time
on the loop (planned, appended, then applied), so no id is handed out twice. Reads are
answered only after the first replay of ``_schemas`` (at start, before the actor is ready).
"""
from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import threading
import time
import urllib.error
import urllib.request

from odradek.actors import http_listener
from odradek.actors.message import Message
from odradek.actors.names import CONTROLLER, log_host
from odradek.actors.messages import (CreateTopics, GetBounds, GetMetadata, LogBounds, PartitionBounds, Produce,
                                     ProducePart)
from odradek.actors.runtime import Actor
from odradek.coordinator.internal_replay import InternalReplay
from odradek.coordinator.offsets import offsets_leaders
from odradek.coordinator.registry_http import MAX_BODY, OFFSET_HEADER, Forward, Gate, make_app
from odradek.coordinator.schema_registry import Plan, RegistryError, SchemaRegistry
from odradek.core.records import encode_batch
from odradek.core.protocol import SCHEMAS_TOPIC, ErrorCode, OdradekError, http_address
from odradek.network.secstore import ZkStore

log = logging.getLogger("odradek.schemas")

ANSWER_TIMEOUT = 30.0  # seconds an HTTP request waits for the loop (a write: the topic's creation and an fsync)
WRITE_TIMEOUT_MS = 10_000  # an acks=-1 append of registry records waits this long for the ISR
FOLLOW_INTERVAL = 0.2  # seconds between two looks at _schemas-0 of a registry in cluster mode
METADATA_INTERVAL = 2.0  # seconds between two reads of the metadata by a broker hosting no replica of it
REPLICATION = 3  # _schemas' replication factor in cluster mode (fewer brokers: all of them)
LEADER_WAIT = 10.0  # seconds a write waits for _schemas-0 to have a leader (just created, or moving)
ADDRESSES = "/config/odradek-schema-registry"  # ZooKeeper: {broker id: the registry's URL}
FORWARD_TIMEOUT = 25.0  # seconds a forwarded request waits for the leader's registry
REPLAY_WAIT = 5.0  # seconds a forwarded write's answer waits for this broker to replay it
HTTP_SETTINGS = http_listener.http_settings("odradek-schema-registry", MAX_BODY)


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
        self.cluster = bool(self.config.get("zookeeper.connect"))
        self.broker_id = int(self.args.get("broker_id", self.config["broker.id"]))
        self.applied = 0  # cluster mode: the next offset of _schemas-0 to replay
        self.hosted = self.leading = False  # cluster mode: this broker hosts / leads _schemas-0
        self.leader_id = -1
        self.synced = not self.cluster  # replayed once (reads wait for it)
        self._parked: list = []  # reads waiting for the first replay
        self._waiters: list = []  # (offset, done): forwarded writes waiting to be replayed here
        self._following = False
        self._metadata_at = -1e9  # when the controller's metadata was last read (monotonic)
        address = http_address(self.config.get("schema.registry.listener"), self.config["listeners"])
        if address is None:
            log.info("schema.registry.listener is empty: no schema registry")
            return
        if not self.cluster:
            try:
                self._replay_at_start()
            except (OdradekError, OSError) as exc:  # the broker serves Kafka clients all the same; say why not this
                log.error("the schema registry cannot read %s (%s): no schema registry until the broker restarts",
                          SCHEMAS_TOPIC, getattr(exc, "message", exc))
                return
        try:
            self.server, self.host, self.port = http_listener.serve(
                make_app(self.submit, Gate(self.config, self.data_dir), self.forward,
                         (lambda: self.applied) if self.cluster else None),
                address, HTTP_SETTINGS, "schema-registry-http")
        except OSError as exc:  # the broker serves Kafka clients all the same; say why there is no registry
            log.error("schema.registry.listener %s:%d cannot be bound (%s): no schema registry; set it to a free "
                      "address, or empty to turn it off", *address, exc.strerror or exc)
            return
        log.info("schema registry on http://%s:%d/ (%d subjects)", self.host, self.port,
                 len(self.registry.subjects))
        if self.cluster:
            self.addresses = ZkStore(self.config["zookeeper.connect"], ADDRESSES, dict,
                                     self.config.get("zookeeper.connection.timeout.ms", 10000) / 1000)
            threading.Thread(target=self._publish, name="schema-registry-publish", daemon=True).start()
            self.call_every(FOLLOW_INTERVAL, self._follow)

    def _publish(self) -> None:
        """Write this registry's URL under ``ADDRESSES`` (retried until ZooKeeper takes it)."""
        url = f"http://{self.host}:{self.port}"
        while self.server is not None:
            try:
                self.addresses.update(lambda d: d.__setitem__(str(self.broker_id), url))
                return
            except Exception as exc:  # noqa: BLE001 - ZooKeeper unreachable: try again
                log.warning("cannot publish the schema registry's address in ZooKeeper (%s); retrying", exc)
                time.sleep(1.0)

    def _replay_at_start(self) -> None:
        """Read ``_schemas``-0 back into the registry (blocking: before the actor is ready)."""
        snapshot = self.call(CONTROLLER, GetMetadata(), timeout=60.0).fields.snapshot
        self.exists = SCHEMAS_TOPIC in (snapshot.get("topics") or {})
        if not self.exists:
            return
        answer = self.call(self._host(), GetBounds([[SCHEMAS_TOPIC, 0]]), timeout=60.0).fields
        bounds = next((PartitionBounds(*p).bounds for p in answer.parts
                       if p[0] == SCHEMAS_TOPIC and p[1] == 0), None)
        if bounds is None:
            raise OdradekError(f"{SCHEMAS_TOPIC}-0 exists but {self._host()} does not host it",
                               ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        self._replay(bounds)

    def _replay(self, bounds: LogBounds, quiet: bool = False) -> None:
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
        (log.debug if quiet else log.info)("replayed %s-0: %d records, %d subjects, %d schemas", SCHEMAS_TOPIC, records,
                 len(self.registry.subjects), len(self.registry.by_id))

    def _host(self) -> str:
        return log_host(SCHEMAS_TOPIC, 0, self.log_hosts)

    def on_stop(self) -> None:
        http_listener.stop(self.server)
        while self._writes:
            _op, done = self._writes.popleft()
            done(RegistryError(500, 50001, "the schema registry is stopping"))

    def ready_fields(self) -> dict:
        return {"registry_host": self.host, "registry_port": self.port}

    def stats(self) -> dict:
        return {"subjects": len(self.registry.subjects), "schemas": len(self.registry.by_id),
                "writes": self.writes, "skipped_records": self.skipped, "queued_writes": len(self._writes),
                **({"leading": int(self.leading), "replayed_to": self.applied} if self.cluster else {})}

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
    def _read(self, op, done, fresh: bool = False) -> None:
        if not self.synced:
            self._parked.append((op, done))
            return
        if self.cluster and not self.hosted and not fresh and \
                time.monotonic() - self._metadata_at > FOLLOW_INTERVAL:  # created meanwhile? the leader moved?
            self._metadata(lambda: self._read(op, done, fresh=True))
            return
        if self.cluster and self.exists and not self.hosted:
            done(self._forward_to_leader())
            return
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
        if self.cluster:
            if self._writes:
                self._writing = True
                self._cluster_write(time.monotonic() + LEADER_WAIT)
            else:
                self._writing = False
            return
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

    # ---- cluster mode ----------------------------------------------------------------------
    def _cluster_write(self, deadline: float) -> None:
        """The head of the queue: who leads ``_schemas``-0 learnt again (and, leading, the log
        replayed to its end), then ``_route_write``."""
        self._catch_up(True, lambda: self._route_write(deadline), metadata=True)

    def _route_write(self, deadline: float) -> None:
        """``_schemas`` created first if need be; forwarded unless this broker leads
        ``_schemas``-0, else planned, stored, and applied by the replay that follows
        (``_stored_by_leader``)."""
        if not self._writes:
            self._writing = False
        elif self.leading:
            self._plan_as_leader()
        elif self.exists and self.leader_id >= 0 and self.leader_id != self.broker_id:
            self._fail_writes(Forward(self.leader_id))
        elif time.monotonic() > deadline:
            self._fail_writes(RegistryError(500, 50003, f"{SCHEMAS_TOPIC}-0 has no leader (or this broker has "
                                                        f"not opened it yet); retry"))
        elif not self.exists:
            self._create(lambda why: self._fail_writes(RegistryError(500, 50001, why)) if why
                         else self.call_later(0.1, lambda: self._cluster_write(deadline)))
        else:  # no leader yet (just created, or moving), or this broker leads it but has not opened it yet
            self.call_later(0.1, lambda: self._cluster_write(deadline))

    def _plan_as_leader(self) -> None:
        op, done = self._writes.popleft()
        try:
            plan: Plan = op(self.registry)
        except Exception as exc:
            done(exc)
            self._next_write()
            return
        if not plan.records:
            done(plan.answer)
            self._next_write()
            return
        self._store(plan.records, lambda error: self._stored_by_leader(plan, done, error))

    def _stored_by_leader(self, plan: Plan, done, error: str | None) -> None:
        if error:
            done(RegistryError(500, 50001, f"Error while storing the schema: {error}"))
            self._next_write()
            return
        self.writes += 1

        def applied() -> None:
            done(plan.answer)
            self._next_write()
        self._catch_up(True, applied)

    def _fail_writes(self, answer) -> None:
        """Every queued write answered ``answer`` (a Forward, or the error of all of them)."""
        while self._writes:
            self._writes.popleft()[1](answer)
        self._writing = False

    def _forward_to_leader(self):
        if self.leader_id < 0:
            return RegistryError(500, 50003, f"{SCHEMAS_TOPIC}-0 has no leader right now; retry")
        return Forward(self.leader_id)

    def _follow(self) -> None:
        if not self._following:
            self._following = True
            self._catch_up(False, lambda: setattr(self, "_following", False))

    def _catch_up(self, to_log_end: bool, then, metadata: bool = False) -> None:
        """Replay what this broker's replica of ``_schemas``-0 has that was not replayed yet: to
        the high watermark, or (``to_log_end``, the leader before a write) to the log end; then
        ``then()``. Who leads it comes from the controller's metadata, asked first with
        ``metadata`` (a write), or when this broker hosts no replica (at most every
        ``METADATA_INTERVAL``): a follow of a hosted replica costs one filtered ``get_bounds``."""
        def bounds(reply: Message, asked: bool) -> None:
            parts = () if reply.is_error else reply.fields.parts
            p = next((PartitionBounds(*p) for p in parts if p[0] == SCHEMAS_TOPIC and p[1] == 0), None)
            if p is None and not asked and (not self.synced or
                                            time.monotonic() - self._metadata_at >= METADATA_INTERVAL):
                self._metadata(lambda: (self._sync(None, False), then()))
                return
            try:
                self._sync(p, to_log_end)
            except (OdradekError, OSError) as exc:
                log.warning("cannot replay %s-0 (%s); retrying", SCHEMAS_TOPIC, getattr(exc, "message", exc))
            then()

        def ask_bounds(asked: bool) -> None:
            self.request(self._host(), GetBounds([[SCHEMAS_TOPIC, 0]]),
                         callback=lambda reply: bounds(reply, asked), timeout=10.0)

        if metadata:
            self._metadata(lambda: ask_bounds(True))
        else:
            ask_bounds(False)

    def _metadata(self, then) -> None:
        """Learn from the controller whether ``_schemas`` exists and who leads partition 0."""
        def adopt(reply: Message) -> None:
            if not reply.is_error:
                self._metadata_at = time.monotonic()
                leaders = offsets_leaders(reply.fields.snapshot, self.broker_id, SCHEMAS_TOPIC)
                self.exists = bool(leaders)
                self.leader_id = leaders[0][0] if leaders else -1
            then()
        self.request(CONTROLLER, GetMetadata(), callback=adopt, timeout=10.0)

    def _sync(self, p: PartitionBounds | None, to_log_end: bool) -> None:
        if p is None:
            self.hosted = self.leading = False
            if not self.exists and self.applied:  # the topic is gone: so is every schema
                self.registry, self.applied = SchemaRegistry(), 0
        else:
            if (self.leading and not p.leader) or p.log_end_offset < self.applied or \
                    (self.applied and p.log_start_offset > self.applied):
                log.info("%s-0: %s; replaying it from the start", SCHEMAS_TOPIC,
                         "no longer the leader" if self.leading and not p.leader else "truncated or moved")
                self.registry, self.applied = SchemaRegistry(), 0
            self.exists, self.hosted, self.leading = True, True, bool(p.leader)
            if p.leader:
                self.leader_id = self.broker_id
            upto = p.log_end_offset if to_log_end and p.leader else p.high_watermark
            start = max(self.applied, p.log_start_offset)
            if upto > start:
                self._replay(p.bounds._replace(log_start_offset=start, log_end_offset=upto), quiet=start > 0)
                self.applied = upto
        if not self.synced:
            self.synced = True
            parked, self._parked = self._parked, []
            for op, done in parked:
                self._read(op, done)
        if self._waiters:
            reached = [w for w in self._waiters if w[0] <= self.applied or not self.hosted]
            self._waiters = [w for w in self._waiters if w not in reached]
            for _offset, done in reached:
                done(None)

    # ---- called from HTTP threads: a request for the leader --------------------------------------
    def forward(self, broker_id: int, environ: dict, body) -> tuple[int, object]:
        """Send a request to broker ``broker_id``'s registry; its (status, answer)."""
        if environ.get("HTTP_X_ODRADEK_FORWARDED"):  # the leader moved meanwhile: no second hop
            raise RegistryError(500, 50003, f"broker {broker_id} leads {SCHEMAS_TOPIC}-0 now; retry")
        url = (self.addresses.data() or {}).get(str(broker_id))
        if not url:
            raise RegistryError(500, 50003, f"broker {broker_id} leads {SCHEMAS_TOPIC}-0 but has published no "
                                            f"registry address; retry")
        query = environ.get("QUERY_STRING")
        headers = {"Content-Type": "application/json", "X-Odradek-Forwarded": str(self.broker_id)}
        if environ.get("HTTP_AUTHORIZATION"):
            headers["Authorization"] = environ["HTTP_AUTHORIZATION"]
        request = urllib.request.Request(url + (environ.get("PATH_INFO") or "/") + (f"?{query}" if query else ""),
                                         data=None if body is None else json.dumps(body).encode(),
                                         method=environ.get("REQUEST_METHOD", "GET"), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=FORWARD_TIMEOUT) as resp:
                answer = json.loads(resp.read())
                offset = resp.headers.get(OFFSET_HEADER)
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.loads(exc.read())
            except ValueError:
                raise RegistryError(500, 50003, f"broker {broker_id}'s registry answered {exc.code}") from None
        except (OSError, ValueError) as exc:
            raise RegistryError(500, 50003, f"cannot forward the request to broker {broker_id}'s registry "
                                            f"({url}): {exc}; retry") from None
        if offset and offset.isdigit():  # read-your-writes here: wait (a little) until this replica has it
            self._wait_for(int(offset))
        return resp.status, answer

    def _wait_for(self, offset: int) -> None:
        future: concurrent.futures.Future = concurrent.futures.Future()

        waiter = (offset, lambda _r: future.done() or future.set_result(None))

        def wait() -> None:
            if offset <= self.applied or not self.hosted:
                future.set_result(None)
            else:
                self._waiters.append(waiter)
        self.post(wait)
        try:
            future.result(REPLAY_WAIT)
        except concurrent.futures.TimeoutError:
            self.post(lambda: waiter in self._waiters and self._waiters.remove(waiter))
            log.info("%s-0 offset %d not replayed here within %gs: answering all the same", SCHEMAS_TOPIC,
                     offset, REPLAY_WAIT)

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
                p = reply.fields.body["topics"][0]["partitions"][0]
                code, why = p.get("error_code") or 0, p.get("error_message") or ""
            except (KeyError, IndexError, TypeError):
                code, why = int(ErrorCode.UNKNOWN_SERVER_ERROR), "malformed answer from the log actor"
            then(f"{ErrorCode.of(code).name}: {why}" if code else None)

        self.request(self._host(), Produce(-1, [ProducePart(SCHEMAS_TOPIC, 0, 0)], WRITE_TIMEOUT_MS),
                     frames=[encode_batch(records)], callback=answered, timeout=WRITE_TIMEOUT_MS / 1000 + 5)

    def _create(self, then) -> None:
        """Create ``_schemas`` (one partition, compacted) through the controller, as Confluent's
        registry does at its first start; ``then(None)`` once it is in the metadata."""
        def created(reply: Message) -> None:
            result = {} if reply.is_error else reply.fields.body["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            if code not in (0, None, ErrorCode.TOPIC_ALREADY_EXISTS):
                why = reply.error_message if reply.is_error else result.get("error_message")
                log.error("cannot create %s: %s", SCHEMAS_TOPIC, why)
                then(f"cannot create {SCHEMAS_TOPIC}: {why}")
                return
            log.info("created %s", SCHEMAS_TOPIC)
            self.exists = True
            then(None)

        def create(brokers: int) -> None:
            self.request(CONTROLLER, CreateTopics({"topics": [{
                "name": SCHEMAS_TOPIC, "num_partitions": 1, "replication_factor": max(1, min(REPLICATION, brokers)),
                "configs": {"cleanup.policy": "compact"}}]}), callback=created, timeout=60.0)
        if self.cluster:  # as many replicas as there are brokers, up to REPLICATION
            self.request(CONTROLLER, GetMetadata(), timeout=10.0, callback=lambda reply: create(
                1 if reply.is_error else len(reply.fields.snapshot.get("brokers") or ())))
        else:
            create(1)
