"""The group coordinator actor: consumer groups (KIP-848 and classic) and their committed offsets.

Process: ``group_coordinator`` (one per broker).
Owns: the groups and committed offsets of the ``__consumer_offsets`` partitions this broker
leads (group G's is ``partition_for(G)``; a single broker leads them all), through plain
objects handed the actor's ``Outbox`` and ``Clock`` in ``on_start``, each module's header
saying what it owns: ``GroupTable`` (group_table), ``Leadership`` (group_leadership),
``GroupWriter`` (group_writes), ``Purgatory`` (group_purgatory) and one object per API family
(group_api_consumer, _classic, _offsets, _admin). Here: the assembly, the entry point, the
metadata, and ``TopicCreation`` (the topic created through the controller on the first
heartbeat, join, sync or commit, or a cluster's FIND_COORDINATOR; requests wait meanwhile).
Accepts:
  group_request {api, body, client, peer, metadata_version}  from a request handler: the group
      APIs (FIND_COORDINATOR, CONSUMER_GROUP_HEARTBEAT, JOIN_GROUP, SYNC_GROUP, HEARTBEAT,
      LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH, LIST_GROUPS, DESCRIBE_GROUPS,
      CONSUMER_GROUP_DESCRIBE, DELETE_GROUPS), answered straight to the client's processor
  metadata {snapshot}  pushed by the controller; replies {version}
  txn_offsets_end {producer_id, commit, offsets}  from a transaction coordinator; replies
      {error_code, message} once the committed transaction's offsets are stored
Sends: ``produce`` (acks=-1) and ``get_bounds`` to log actors, ``list_offsets`` to the fetch
actor, ``get_metadata`` and ``create_topics`` to the controller, ``create_state_topic`` to the
transaction coordinator, ``status`` to the supervisor.
Invariants: the only writer of the partitions it leads; an answer that depends on a record
goes out once the ISR has it; requests for a partition being loaded get
COORDINATOR_LOAD_IN_PROGRESS, for one led elsewhere NOT_COORDINATOR (naming the leader).
"""
from __future__ import annotations

import logging
from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import CreateTopics, GetMetadata, MetadataVersion
from odradek.actors.names import CONTROLLER
from odradek.actors.runtime import Actor
from odradek.coordinator.classic_group import ClassicConfig
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.group import GroupConfig
from odradek.coordinator.group_api_admin import AdminApi
from odradek.coordinator.group_api_classic import ClassicApi
from odradek.coordinator.group_api_consumer import ConsumerApi
from odradek.coordinator.group_api_offsets import OffsetsApi
from odradek.coordinator.group_leadership import Leadership
from odradek.coordinator.group_purgatory import Purgatory
from odradek.coordinator.group_requests import group_id, wall_ms
from odradek.coordinator.group_table import Clock, GroupTable, TopicView
from odradek.coordinator.group_writes import GroupWriter
from odradek.core.fields import BadRequest
from odradek.core.protocol import OFFSETS_TOPIC, ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.groups")

TICK_INTERVAL = 0.05  # seconds between session/rebalance deadline checks
METADATA_REFRESH = 2.0  # seconds between topic-metadata refreshes (also on a newer version hint)
CREATED_WAIT = 10.0  # seconds requests queued for the topic's creation wait for its partitions to load
# need __consumer_offsets to exist
WRITERS = (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.OFFSET_COMMIT, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP)
BY_GROUP = (ApiKey.CONSUMER_GROUP_HEARTBEAT, ApiKey.OFFSET_COMMIT, ApiKey.OFFSET_FETCH, ApiKey.LEAVE_GROUP,
            ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP, ApiKey.HEARTBEAT, ApiKey.OFFSET_DELETE)
CLASSIC_MARGIN_MS = 2000  # a held JoinGroup/SyncGroup is answered this long before the processor's request.timeout.ms


class TopicCreation:
    """``__consumer_offsets`` created through the controller on the first request that needs
    it (as Kafka does): a broker that never serves a group lists no internal topic. Requests
    arriving meanwhile wait in ``queued`` and run, in order, once it exists and its partitions
    led here are loaded (``creating`` until then). Collaborators: the config, the
    ``TopicView`` (the live brokers), the ``Leadership`` (the topic known, loads settled), the
    actor's ``Outbox``, ``refresh(then)`` (the actor's metadata poll) and ``dispatch(msg)``."""

    def __init__(self, config, meta: TopicView, leadership: Leadership, outbox: Outbox, refresh: Callable,
                 dispatch: Callable[[Message], None]):
        self.config, self.meta, self.leadership, self.outbox = config, meta, leadership, outbox
        self.refresh, self.dispatch = refresh, dispatch
        self.queued: list[Message] = []
        self.creating = False

    def ensure(self) -> None:
        if not self.creating:
            self.create()

    def create(self, replication_factor: int | None = None) -> None:
        n = self.config["offsets.topic.num.partitions"]
        rf = replication_factor or self.config["offsets.topic.replication.factor"]
        self.creating = True

        def created(reply: Message) -> None:
            result = {} if reply.is_error else reply.fields.body["topics"][0]
            code = reply.error_code if reply.is_error else result.get("error_code")
            why = reply.error_message if reply.is_error else result.get("error_message")
            fallback = max(1, len(self.meta.snapshot.get("brokers") or {}))
            if code == ErrorCode.INVALID_REPLICATION_FACTOR and rf > fallback:
                # A controller that refuses instead of capping: ask for what the cluster has.
                log.info("%s: replication factor %d refused (%s); asking for %d", OFFSETS_TOPIC, rf, why, fallback)
                self.create(fallback)
                return
            if code not in (0, ErrorCode.TOPIC_ALREADY_EXISTS):
                if code == ErrorCode.NOT_CONTROLLER:
                    why = f"the active controller is another broker and could not be reached ({why})"
                log.log(logging.INFO if code == ErrorCode.NOT_CONTROLLER else logging.ERROR,
                        "cannot create %s: %s", OFFSETS_TOPIC, why)
                self.run_queued(f"cannot create {OFFSETS_TOPIC} yet: {why}; retry")
                return
            log.info("created %s (%d partitions, replication factor %d)", OFFSETS_TOPIC, n, rf)
            self.refresh(then=lambda: self.leadership.when_loaded(self.run_queued, CREATED_WAIT))

        self.outbox.request(CONTROLLER, CreateTopics({"topics": [{
            "name": OFFSETS_TOPIC, "num_partitions": n, "replication_factor": rf,
            "configs": {"cleanup.policy": "compact", "segment.bytes": self.config["offsets.topic.segment.bytes"]}}]}),
            callback=created, timeout=60.0)

    def run_queued(self, why: str = f"{OFFSETS_TOPIC} was created but is not in this broker's metadata "
                                      f"yet; retry") -> None:
        """The creation is over: run what waited for it; writers fail (``why``) if the topic
        is still unknown here."""
        self.creating = False
        queued, self.queued = self.queued, []
        for msg in queued:
            if not self.leadership.partitions and msg.fields.api in WRITERS:
                self.outbox.reply_error(msg, ErrorCode.COORDINATOR_NOT_AVAILABLE, why)
            else:
                self.dispatch(msg)


class GroupCoordinator(Actor):
    # ---- start -------------------------------------------------------------------------
    def on_start(self) -> None:
        config = self.args["config"]
        group_config = GroupConfig(
            session_timeout_ms=config["group.consumer.session.timeout.ms"],
            min_session_timeout_ms=config["group.consumer.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.consumer.max.session.timeout.ms"],
            heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
            max_size=config["group.max.size"],
            assignors=tuple(a.strip() for a in config["group.consumer.assignors"].split(",") if a.strip()))
        classic_config = ClassicConfig(
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"],
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            max_size=config["group.max.size"],
            join_wait_cap_ms=max(1000, config["request.timeout.ms"] - CLASSIC_MARGIN_MS),
            max_metadata_bytes=config["group.classic.max.metadata.bytes"])
        self.assemble(config, group_config, classic_config, Outbox.of(self),
                      Clock(now=lambda: self.clock() * 1000, wall=wall_ms))
        self._adopt(self.call(CONTROLLER, GetMetadata(), timeout=60.0).fields.snapshot, starting=True)
        self.call_every(TICK_INTERVAL, self._tick)
        self.call_every(METADATA_REFRESH, self._refresh_metadata)
        self.call_every(config["offsets.retention.check.interval.ms"] / 1000, self.offsets.expire)

    def assemble(self, config, group_config: GroupConfig, classic_config: ClassicConfig, outbox: Outbox,
                 clock: Clock) -> None:
        """Make the parts and hand each its collaborators."""
        self.times = clock
        self.table = table = GroupTable(group_config, classic_config)
        self.meta = meta = TopicView(int(self.args.get("broker_id", config["broker.id"])))
        self.leadership = leadership = Leadership(
            meta, self.args["data_dir"], int(self.args.get("log_hosts", config["num.log.threads"])), outbox,
            installed=lambda view, skip: table.install(view, clock.now(), clock.wall(), skip),
            dropped=self._dropped)
        self.writer = writer = GroupWriter(leadership, table, meta, outbox, self._refresh_metadata)
        self.purgatory = purgatory = Purgatory(table, writer, meta, outbox, clock)
        self.creation = creation = TopicCreation(config, meta, leadership, outbox, self._refresh_metadata,
                                                 self._dispatch_group)
        self.consumer = ConsumerApi(table, purgatory, writer, meta, outbox, clock)
        self.classic = ClassicApi(table, purgatory, writer, outbox, clock)
        self.offsets = OffsetsApi(table, meta, leadership, writer, creation.ensure, outbox, clock,
                                  config["offsets.retention.minutes"] * 60_000, config["offset.metadata.max.bytes"])
        self.admin = AdminApi(table, meta, leadership, writer, purgatory, self.classic, creation.ensure, outbox,
                              config, self.supervisor)
        self.handlers = {
            ApiKey.CONSUMER_GROUP_HEARTBEAT: self.consumer.heartbeat,
            ApiKey.OFFSET_COMMIT: self.offsets.offset_commit,
            ApiKey.OFFSET_FETCH: self.offsets.offset_fetch,
            ApiKey.FIND_COORDINATOR: self.admin.find_coordinator,
            ApiKey.LIST_GROUPS: self.admin.list_groups,
            ApiKey.DESCRIBE_GROUPS: self.admin.describe_groups,
            ApiKey.CONSUMER_GROUP_DESCRIBE: self.admin.describe_groups,
            ApiKey.DELETE_GROUPS: self.admin.delete_groups,
            ApiKey.OFFSET_DELETE: self.admin.delete_offsets,
            ApiKey.LEAVE_GROUP: self.admin.leave_group,
            ApiKey.JOIN_GROUP: self.classic.join_group,
            ApiKey.SYNC_GROUP: self.classic.sync_group,
            ApiKey.HEARTBEAT: self.classic.classic_heartbeat,
        }

    def _dropped(self, partition: int, mine: Callable[[str], bool], why: str) -> list[str]:
        """``partition`` is no longer led here: what is held for its groups is answered
        NOT_COORDINATOR and they leave the table (returns their ids)."""
        self.purgatory.drop(mine, f"this broker no longer leads {OFFSETS_TOPIC}-{partition} ({why})")
        return self.table.drop(mine)

    def on_stop(self) -> None:
        self.purgatory.close()
        self.leadership.close()

    def stats(self) -> dict:
        return {"groups": len(self.table.groups) + len(self.table.classic), "members": self.table.members(),
                "commits": self.offsets.commits, "heartbeats": self.consumer.heartbeats + self.classic.heartbeats,
                "held": len(self.purgatory.held), "partitions_led": len(self.leadership.owned),
                "partitions_loading": len(self.leadership.loading), "metadata_version": self.meta.version}

    def metric_gauges(self) -> list:
        """Each group's state and size, and every committed offset (the metrics actor
        subtracts them from the high watermarks for the lag); read at scrape time."""
        table = self.table
        out = [["group_members", [gid, g.state], len(g.members)]
               for gid, g in (*table.groups.items(), *table.classic.items())]
        for gid, offsets in table.offsets.items():
            out += [["committed_offset", [gid, topic, partition], c.offset]
                    for (topic, partition), c in offsets.items()]
        return out

    # ---- the entry point --------------------------------------------------------------------
    def on_group_request(self, msg: Message) -> None:
        version = msg.fields.metadata_version
        if isinstance(version, int) and version > self.meta.version:
            self._refresh_metadata()
        creation = self.creation
        if creation.creating or (not self.leadership.partitions and msg.fields.api in WRITERS):
            creation.queued.append(msg)  # in order, behind the creation of the topic
            creation.ensure()
            return
        self._dispatch_group(msg)

    def _dispatch_group(self, msg: Message) -> None:
        try:
            self._serve(msg)
        except OdradekError as exc:
            self.reply_error(msg, exc.code, exc.message)

    def _serve(self, msg: Message) -> None:
        api, body = msg.fields.api, msg.fields.body
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a map")
        method = self.handlers.get(api)
        if method is None:
            raise BadRequest(f"the group coordinator does not serve API {api!r}")
        if api in BY_GROUP and not (api == ApiKey.OFFSET_FETCH and "groups" in body):
            error = self.leadership.coordinator_error(group_id(body))
            if error is not None:
                raise error
        method(msg, body)

    def on_txn_offsets_end(self, msg: Message) -> None:
        """From the transaction coordinator: a committed transaction's offsets (``OffsetsApi``)."""
        self.offsets.txn_offsets_end(msg)

    # ---- metadata ---------------------------------------------------------------------------
    def on_metadata(self, msg: Message) -> None:
        """The controller's push: adopt the snapshot (a newer version than ours) at once."""
        self._adopt_and_react(msg.fields.snapshot)
        self.reply(msg, MetadataVersion(self.meta.version))

    def _adopt(self, snapshot: dict, starting: bool = False) -> bool:
        """Take a snapshot unless it is older than ours; True if topics changed."""
        changed = self.meta.adopt(snapshot)
        if changed is None:
            return False
        self.leadership.follow(snapshot, starting)
        return changed

    def _adopt_and_react(self, snapshot: dict) -> None:
        if self._adopt(snapshot):
            for g in list(self.table.groups.values()):
                if g.members and g.maybe_rebalance(self.meta.topics):
                    self.purgatory.changed(g)

    def _refresh_metadata(self, then=None) -> None:
        def adopt(reply: Message) -> None:
            if not reply.is_error:
                self._adopt_and_react(reply.fields.snapshot)
            if then is not None:
                then()
        self.request(CONTROLLER, GetMetadata(), callback=adopt, timeout=10.0)

    # ---- the tick -----------------------------------------------------------------------------
    def _tick(self) -> None:
        now = self.times.now()
        for g in list(self.table.groups.values()):
            deadline = g.next_deadline()
            if deadline is None or deadline > now:
                continue
            for member_id, why in g.expire(now, self.meta.topics):
                log.info("group %s: removed member %s: %s", g.group_id, member_id, why)
                self.purgatory.answer((g.group_id, member_id))
            self.purgatory.changed(g)
            self.writer.after_write(g, lambda: None)
        for cg in list(self.table.classic.values()):
            deadline = cg.next_deadline()
            if deadline is None or deadline > now:
                continue
            for member_id, why in cg.expire(now):
                log.info("group %s: removed member %s: %s", cg.group_id, member_id, why)
            self.classic.changed(cg)
            self.classic.drop_if_unused(cg.group_id)  # only member ids handed out, never used: forgotten
