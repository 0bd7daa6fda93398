"""The controller actor (single-broker mode): the one writer of topic metadata.

Process: ``controller`` (one per broker, started first). Cluster mode runs
``coordinator.cluster_controller.ClusterController`` instead; what the two share is in
``coordinator.controller_kit``, used by each, not inherited.
Owns: the ``TopicRegistry`` (``<log.dirs>/meta/topics.json``) and the run-time broker configs
(``controller_kit.BrokerConfigStore``). Its snapshot has the cluster's shape
(docs/REPLICATION.md): this broker leads every partition at leader epoch 0, ISR itself.
Accepts:
  get_metadata                 -> the metadata snapshot
  get_assignment {host}        -> {open: [{topic, partition, topic_id}], configs}: the
                                  partitions a log actor process hosts
  create_topics {body}         from a handler; answered to the client's processor
  delete_topics {body}         likewise
  alter_topic_configs {body}   likewise (IncrementalAlterConfigs' topic resources)
  get_broker_configs           -> {configs: {name: value}}
  set_broker_configs {configs} from a handler (AlterConfigs on the broker); Done once written
  broker_request {api, body}   CREATE_PARTITIONS; ELECT_LEADERS and the reassignment APIs
                               (nothing to elect or move on one broker)
Sends: ``metadata {snapshot}`` to every running request handler and (one-way) the group
coordinator, ``assign {open, close, configure}`` to the log actor processes hosting the
partitions a change touches.
Invariant: a change is answered only after every handler and log actor acknowledged it, so a
client that created a topic can produce to it at once.
"""
from __future__ import annotations

import logging
import os
from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import Assign, Assigned, Assignment, BrokerConfigs, Metadata, Response
from odradek.actors.names import GROUP_COORDINATOR, HANDLER, log_host
from odradek.actors.runtime import Actor
from odradek.coordinator.controller_kit import BrokerConfigStore, HandlerRoster, Outbox, remove_deleted_dirs
from odradek.coordinator.topics import TopicRegistry
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.controller")

PUSH_TIMEOUT = 30.0  # seconds a handler or log actor has to acknowledge a change, plus:
# seconds more per partition a log actor opens or closes in it (each is a few fsyncs: 20-200 ms on
# a loaded machine; 1,000-partition topics timed out at 30 s, were undone while still opening, and
# the client's retry was told TOPIC_ALREADY_EXISTS for a topic that then disappeared)
PUSH_TIMEOUT_PER_PARTITION = 0.25


class Controller(Actor):
    def on_start(self) -> None:
        config = self.args["config"]
        self.broker_id = int(self.args.get("broker_id", config.get("broker.id", 0)))
        self.log_hosts = self.args["log_hosts"]
        self.registry = TopicRegistry(
            os.path.join(self.args["data_dir"], "meta", "topics.json"), self.args["topic_defaults"],
            default_partitions=config["num.partitions"], default_replication=config["default.replication.factor"],
            max_replication=1, min_segment_bytes=config["log.segment.bytes.min"])
        remove_deleted_dirs(self.args["data_dir"])
        self.roster = HandlerRoster(Outbox.of(self), self.snapshot, PUSH_TIMEOUT)
        self.broker_configs = BrokerConfigStore(self.args["data_dir"])

    def stats(self) -> dict:
        return {"topics": len(self.registry.topics), "metadata_version": self.registry.version}

    def metric_gauges(self) -> list:
        """One broker is its own controller; none of its partitions can lack a leader."""
        return [["active_controller", [], 1], ["offline_partitions", [], 0]]

    # ---- reads -----------------------------------------------------------------------
    def on_members(self, role: str, members: list[str], retired: list[str]) -> None:
        self.roster.on_members(role, members)

    def on_get_metadata(self, msg: Message) -> None:
        self.reply(msg, Metadata(self.snapshot()))

    def snapshot(self) -> dict:
        """The metadata snapshot (docs/REPLICATION.md): one broker leading everything."""
        snap = self.registry.snapshot()
        me = self.broker_id
        state = {"leader": me, "leader_epoch": 0, "isr": [me], "replicas": [me]}
        for meta in snap["topics"].values():
            meta["state"] = [state] * meta["partitions"]
        snap.update(broker_id=me, controller_id=me, brokers={str(me): ["", 0]})  # handlers know their address
        return snap

    def on_get_assignment(self, msg: Message) -> None:
        """Each topic's configuration once (``configs``), not in every partition's entry: at
        10,000 partitions per log actor, one ``to_properties()`` per entry cost the
        controller ~0.7 s per log actor and made each answer ~5.6 MB (docs/BENCHMARKS.md,
        issue 18, "4. Partitions")."""
        host = msg.fields.host
        entries: list[dict] = []
        configs: dict[str, dict] = {}
        for t in self.registry.topics.values():
            mine = [p for p in range(t.partitions) if self._host_of(t.name, p) == host]
            if mine:
                configs[t.name] = self.registry.log_config(t.name).to_properties()
                entries += [{"topic": t.name, "partition": p, "topic_id": t.topic_id} for p in mine]
        self.reply(msg, Assignment(entries, configs))

    def _host_of(self, topic: str, partition: int) -> str:
        return log_host(topic, partition, self.log_hosts)

    def _partition_entry(self, topic: str, partition: int) -> dict:
        t = self.registry.get(topic)
        return {"topic": topic, "partition": partition, "topic_id": t.topic_id,
                "config": self.registry.log_config(topic).to_properties()}

    # ---- changes -----------------------------------------------------------------------
    def on_create_topics(self, msg: Message) -> None:
        body = msg.fields.body or {}
        validate_only = bool(body.get("validate_only"))
        opened = []

        def create(req: dict) -> dict:
            name = req.get("name")
            if any(list(a) != [self.broker_id] for a in req.get("assignments") or ()):
                raise OdradekError(f"topic '{name}': an explicit assignment here can only name broker "
                                   f"{self.broker_id} (the only broker), got {req['assignments']}",
                                   ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            if validate_only:
                parts, rf, _ = self.registry.validate_create(name, req.get("num_partitions"),
                                                             req.get("replication_factor"), req.get("configs"))
            else:
                topic = self.registry.create(name, req.get("num_partitions"), req.get("replication_factor"),
                                             req.get("configs"))
                parts, rf = topic.partitions, topic.replication_factor
                opened.extend((name, p) for p in range(parts))
                log.info("created topic %s (%d partitions, configs %s)", name, parts, topic.configs)
            return {"num_partitions": parts, "replication_factor": rf}

        results = _each_topic(body, "each topic must be a map", create)
        self._push(open_=opened, done=lambda failed: self._undo_failed_creations(
            failed, results, lambda: self.reply(msg, Response({"topics": results}))))

    def _undo_failed_creations(self, failed: list, results: list, done: Callable[[], None]) -> None:
        """A topic with a partition that could not be created (a full disk) is refused with
        that partition's error and removed again, files and metadata: never a topic
        without a leader."""
        problems = _first_failure(failed)
        closed = []
        for result in results:
            name = result["name"]
            if result["error_code"] or name not in problems:
                continue
            code, text = problems[name]
            try:
                topic = self.registry.delete(name)
            except OdradekError as exc:  # answered all the same: a client is never left waiting
                text += f"; and it could not be removed from the metadata: {exc.message} (delete it)"
            else:
                closed += [(name, p, topic.topic_id) for p in range(topic.partitions)]
            log.error("creating topic %s failed, undone: %s", name, text)
            result.clear()
            result.update(name=name, error_code=code, error_message=f"topic '{name}' was not created: {text}")
        self._push(close=closed, done=lambda _failed: done())

    def on_delete_topics(self, msg: Message) -> None:
        body = msg.fields.body or {}
        results, closed = [], []
        for name in body.get("topics") or []:
            try:
                if not isinstance(name, str):
                    raise OdradekError("topic names must be strings", ErrorCode.INVALID_REQUEST)
                topic = self.registry.delete(name)
                closed += [(name, p, topic.topic_id) for p in range(topic.partitions)]
                log.info("deleted topic %s", name)
                results.append({"name": name, "error_code": 0})
            except OdradekError as exc:
                results.append({"name": name, "error_code": int(exc.code), "error_message": exc.message})
        self._push(close=closed, done=lambda failed: self._report_failed_deletions(failed, results, msg))

    def _report_failed_deletions(self, failed: list, results: list, msg: Message) -> None:
        """A deletion whose files could not be removed is not reported as done. The topic is
        gone from the metadata; its leftover directory is thrown away when the broker opens a
        partition of that name again (another topic id) and ``-delete`` leftovers at start."""
        problems = _first_failure(failed)
        for result in results:
            if not result["error_code"] and result["name"] in problems:
                code, text = problems[result["name"]]
                result.update(error_code=code, error_message=f"topic '{result['name']}' was removed from the "
                                                             f"metadata but not all of its files: {text}")
        self.reply(msg, Response({"topics": results}))

    def on_alter_topic_configs(self, msg: Message) -> None:
        body = msg.fields.body or {}
        validate_only = bool(body.get("validate_only"))
        results, changed = [], []
        for res in body.get("resources") or []:
            name = res.get("name") if isinstance(res, dict) else None
            try:
                if not isinstance(res, dict):
                    raise OdradekError("each resource must be a map", ErrorCode.INVALID_REQUEST)
                if validate_only:
                    topic = self.registry.get(name)
                    self.registry._checked_configs({**topic.configs, **{c["name"]: c.get("value")
                                                                        for c in res.get("configs") or []}})
                else:
                    topic = self.registry.alter_configs(name, res.get("configs") or [])
                    changed += [(name, p) for p in range(topic.partitions)]
                    log.info("altered configs of topic %s: %s", name, topic.configs)
                results.append({"type": "topic", "name": name, "error_code": 0})
            except (OdradekError, KeyError, TypeError) as exc:
                code = exc.code if isinstance(exc, OdradekError) else ErrorCode.INVALID_REQUEST
                text = exc.message if isinstance(exc, OdradekError) else f"malformed config change: {exc}"
                results.append({"type": "topic", "name": name, "error_code": int(code), "error_message": text})
        self._push(configure=changed, done=lambda _failed: self.reply(msg, Response({"resources": results})))

    def on_get_broker_configs(self, msg: Message) -> None:
        self.reply(msg, BrokerConfigs(self.broker_configs.values))

    def on_set_broker_configs(self, msg: Message) -> None:
        self.broker_configs.answer_set(msg, Outbox.of(self))

    def on_broker_request(self, msg: Message) -> None:
        """The controller APIs, as one broker answers them (cluster mode: ClusterController's)."""
        api, body = msg.fields.api, msg.fields.body or {}
        if api == ApiKey.CREATE_PARTITIONS:
            self._create_partitions(msg, body)
        elif api == ApiKey.ELECT_LEADERS:
            tps = body.get("topic_partitions")
            named = [(t.name, p) for t in self.registry.topics.values() for p in range(t.partitions)] \
                if tps is None else [(t.get("topic"), p) for t in tps for p in t.get("partitions") or ()]
            self.reply(msg, Response({"error_code": 0, "partitions": [
                {"topic": t, "partition": p, "error_code": int(ErrorCode.ELECTION_NOT_NEEDED),
                 "error_message": f"broker {self.broker_id} already leads {t}-{p}: it is the only broker"}
                for t, p in named]}))
        elif api == ApiKey.LIST_PARTITION_REASSIGNMENTS:
            self.reply(msg, Response({"error_code": 0, "topics": []}))
        elif api == ApiKey.ALTER_PARTITION_REASSIGNMENTS:
            self.reply(msg, Response({"error_code": 0, "responses": [
                {"name": t.get("name"), "partitions": [self._reassign_one(t.get("name"), p)
                                                       for p in t.get("partitions") or ()]}
                for t in body.get("topics") or ()]}))
        else:
            self.reply_error(msg, ErrorCode.INVALID_REQUEST, f"API {api} is not a controller request here "
                                                             f"(one broker, no cluster)")

    def _reassign_one(self, topic: str, p: dict) -> dict:
        index, replicas = p.get("partition_index"), p.get("replicas")
        entry = {"partition_index": index, "error_code": 0, "error_message": None}
        t = self.registry.topics.get(topic)
        if t is None or not isinstance(index, int) or not 0 <= index < t.partitions:
            entry.update(error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                         error_message=f"{topic}-{index} does not exist")
        elif replicas is None:
            entry.update(error_code=int(ErrorCode.NO_REASSIGNMENT_IN_PROGRESS),
                         error_message=f"{topic}-{index} is not being moved")
        elif list(replicas) != [self.broker_id]:
            entry.update(error_code=int(ErrorCode.INVALID_REPLICA_ASSIGNMENT),
                         error_message=f"{replicas} names brokers that are not registered: this single broker "
                                       f"is {self.broker_id}")
        return entry  # onto the replicas it has: nothing to move, done at once (as Kafka)

    def _create_partitions(self, msg: Message, body: dict) -> None:
        validate_only = bool(body.get("validate_only"))
        opened = []

        def add(req: dict) -> dict:
            name = req.get("name")
            have, count = self.registry.add_partitions(name, req.get("count"), req.get("assignments"),
                                                       self.broker_id, validate_only)
            if not validate_only:
                opened.extend((name, p) for p in range(have, count))
                log.info("topic %s: %d -> %d partitions", name, have, count)
            return {"error_message": None}

        results = _each_topic(body, "each topic must be a map {name, count, assignments}", add)
        self._push(open_=opened, done=lambda _failed: self.reply(msg, Response({"results": results})))

    # ---- pushing changes -------------------------------------------------------------
    def _push(self, done: Callable[[list], None], open_=(), close=(), configure=()) -> None:
        """Tell log hosts and handlers, then call ``done(failed)`` with the partitions a log
        host could not change (``[[topic, partition, error code, message]]``). Opening: log
        hosts first, so no handler routes to a partition before it is open. Closing: handlers
        first, so none routes to a partition being closed."""
        per_host: dict[str, Assign] = {}

        def add(topic: str, p: int, kind: str, entry: dict) -> None:
            host = self._host_of(topic, p)
            change = per_host.get(host) or Assign([], [], [])
            getattr(change, kind).append(entry)
            per_host[host] = change
        for topic, p in open_:
            add(topic, p, "open", self._partition_entry(topic, p))
        for topic, p, topic_id in close:
            add(topic, p, "close", {"topic": topic, "partition": p, "topic_id": topic_id})
        for topic, p in configure:
            add(topic, p, "configure", self._partition_entry(topic, p))
        failed: list = []
        if not per_host:
            done(failed)
            return
        hosts = list(per_host.items())
        snapshot = Metadata(self.snapshot())
        handlers = [(h, snapshot) for h in self.members.get(HANDLER, [])]
        self.send(GROUP_COORDINATOR, snapshot)
        phases = [handlers, hosts] if close else [hosts, handlers]
        self._in_phases(phases, failed, lambda: done(failed))

    def _in_phases(self, phases: list[list[tuple[str, Assign | Metadata]]], failed: list,
                   done: Callable[[], None]) -> None:
        if not phases:
            done()
            return
        targets, rest = phases[0], phases[1:]
        if not targets:
            self._in_phases(rest, failed, done)
            return
        pending = {"n": len(targets)}

        def acked(reply: Message, to: str, body: Assign | Metadata) -> None:
            if reply.is_error:
                log.error("%s did not apply a metadata change: %s", to, reply.error_message)
                if type(body) is Assign:
                    failed.extend([e["topic"], e["partition"], int(ErrorCode.KAFKA_STORAGE_ERROR),
                                   f"{to} did not apply the change: {reply.error_message}"]
                                  for e in body.open + body.close)
            elif type(reply.fields) is Assigned:
                failed.extend(reply.fields.failed)
            pending["n"] -= 1
            if pending["n"] == 0:
                self._in_phases(rest, failed, done)

        for to, body in targets:
            changes = len(body.open) + len(body.close) if type(body) is Assign else 0
            self.request(to, body, callback=lambda r, to=to, b=body: acked(r, to, b),
                         timeout=PUSH_TIMEOUT + PUSH_TIMEOUT_PER_PARTITION * changes)


def _each_topic(body: dict, shape: str, change: Callable[[dict], dict]) -> list[dict]:
    """Apply ``change(request) -> result fields`` to each topic of a request, on its own: a
    topic whose change raises OdradekError gets that error, the others go on."""
    results = []
    for req in body.get("topics") or []:
        name = req.get("name") if isinstance(req, dict) else None
        try:
            if not isinstance(req, dict):
                raise OdradekError(shape, ErrorCode.INVALID_REQUEST)
            results.append({"name": name, "error_code": 0, **change(req)})
        except OdradekError as exc:
            results.append({"name": name, "error_code": int(exc.code), "error_message": exc.message})
    return results


def _first_failure(failed: list) -> dict[str, tuple[int, str]]:
    """Topic name -> (error code, message) of its first failed partition."""
    out: dict[str, tuple[int, str]] = {}
    for topic, partition, code, text in failed:
        out.setdefault(topic, (int(code), f"partition {partition}: {text}"))
    return out
