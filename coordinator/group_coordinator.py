"""The group coordinator actor: consumer groups and their committed offsets.

Process: ``group_coordinator`` (one per broker), started after the fetch actor and before
the request handlers.
Owns: the ``ConsumerGroup``s (``coordinator.group``, the pure state machine) and the cache
of committed offsets of the groups this broker coordinates: as in Kafka, the coordinator of
group G is the leader of ``__consumer_offsets`` partition ``partition_for(G)``. Their
durable form is that compacted internal topic (records: ``coordinator.offsets``), written
through the log actor hosting each partition like any produce; the coordinator is the only
writer of the partitions it leads.

Ownership follows the metadata snapshot (docs/REPLICATION.md): fetched from the controller
at start (``get_metadata``), pushed by it on every change (``metadata``), polled every
``METADATA_REFRESH``. This broker leads partition p iff ``state[p].leader`` is its
``broker_id``; a snapshot without ``state`` (single-broker mode) makes it the leader of
every partition. Gaining a partition loads it; losing one unloads it (its groups and
offsets leave memory, its held heartbeats are answered NOT_COORDINATOR).

Loading replays a partition from its files read-only (``log.reader.LogReader``, up to the
log end the hosting log actor reports with ``get_bounds``: on a new leader everything it
has becomes committed). At start the partitions led then are loaded before the actor
reports ready, so no request sees a half-loaded coordinator. A partition gained later is
loaded asynchronously: ``get_bounds`` is a request with a callback, the replay runs in
slices between other messages, and requests for its groups are answered
COORDINATOR_LOAD_IN_PROGRESS until it is done. Reading the files directly, not through the
fetch actor, keeps loading independent of the fetch actor. Requests for a group whose
partition another broker leads: NOT_COORDINATOR, naming the partition and its leader.

The topic is created through the controller on the first heartbeat or commit (as Kafka
does), so a broker that never serves a group shows no internal topic; in cluster mode
(``zookeeper.connect`` set) a FIND_COORDINATOR creates it too, as clients only ever reach a
coordinator through one. Its replication factor is ``offsets.topic.replication.factor``
(the controller caps it at the live brokers). If the controller cannot (NOT_CONTROLLER in
cluster mode, or any error) the waiting requests get COORDINATOR_NOT_AVAILABLE and the next
request tries again.

Accepts:
  group_request {api, body, client, peer, metadata_version}  forwarded by a request handler;
        answered straight to the client's processor (``_reply {body}`` or ``_error``):
        CONSUMER_GROUP_HEARTBEAT, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR (key_type 0,
        and 1 for transactional ids: the leader of the id's ``__transaction_state``
        partition, this broker on a single broker), LIST_GROUPS,
        DESCRIBE_GROUPS, CONSUMER_GROUP_DESCRIBE, DELETE_GROUPS, LEAVE_GROUP (administrative
        removal; a classic member's leave), and the classic protocol: JOIN_GROUP, SYNC_GROUP,
        HEARTBEAT (``coordinator.classic_group``; a JoinGroup or SyncGroup that must wait is
        held in ``held_classic`` and answered when the group moves on, SyncGroup answers
        after the group's record is stored)
  metadata {snapshot}  pushed by the controller; replies ``{version}`` (the version it holds)
  txn_offsets_end {producer_id, commit, offsets}  from the transaction coordinator: the
        offsets a committed transaction carried (TXN_OFFSET_COMMIT) are stored; replies
        ``{error_code, message}`` once they are
Sends: ``produce`` to log actors (offsets and group records, acks=-1 with ``timeout_ms`` =
``COMMIT_TIMEOUT_MS``), ``get_bounds`` to log actors (loading), ``list_offsets`` to the
fetch actor (a commit beyond the high watermark is refused), ``get_metadata`` and
``create_topics`` to the controller, ``create_state_topic`` to the transaction coordinator
(a FindCoordinator for a transactional id before ``__transaction_state`` exists), ``status``
to the supervisor (its own advertised address when the snapshot has no port for it yet, for
FindCoordinator).

Durability before answers: a commit is answered once its record is replicated to the ISR
(the log actor answers an acks=-1 produce when the high watermark passes it: at once on one
broker); a heartbeat that changed its group is answered once the group's record is, so a
new coordinator never hands out an epoch an older one had already given to someone else.
A failed write fails the request with a retriable code, as Kafka maps them: leadership lost
(NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, KAFKA_STORAGE_ERROR) -> NOT_COORDINATOR;
NOT_ENOUGH_REPLICAS -> COORDINATOR_NOT_AVAILABLE; REQUEST_TIMED_OUT -> REQUEST_TIMED_OUT for
a commit, COORDINATOR_NOT_AVAILABLE for a heartbeat (``commit_error``, ``group_write_error``).

Classic groups and KIP-848 groups (the ``GroupTable``'s ``classic`` and ``groups``) share one name space:
a group id is one group of one kind. A classic JoinGroup to a KIP-848 group with members is
INCONSISTENT_GROUP_PROTOCOL, a ConsumerGroupHeartbeat to a classic group with members
GROUP_ID_NOT_FOUND (Kafka's answers without online migration); an empty group of one kind
becomes the other. A classic group's record (``{"classic": ClassicGroup.to_record()}`` under
the same ``["g", group]`` key) is written when a generation completes (Stable, with the
assignments) and when the group empties, as Kafka writes its GroupMetadata; a new
coordinator resumes it Stable at that generation, members keep heartbeating.

Heartbeats long-poll: a heartbeat with ``wait_ms`` that brings no news for its member is
held up to ``wait_ms`` (a purgatory, as the fetch actor holds fetches) and answered as soon
as the group changes for that member, so a rebalance takes round trips, not heartbeat
intervals. A newer heartbeat of the same member answers the held one at once.

The actor owns plain objects, each with its own state, handed its collaborators (the
actor's ``Outbox`` of ``coordinator.controller_kit``, the injected ``Clock``, the other
objects it works with) in ``on_start``; each module's opening says what it owns:
  ``group_table``         ``GroupTable`` (groups, committed offsets, emptiness), ``TopicView``
  ``group_leadership``    ``Leadership``: following the metadata, loading gained partitions
                          (``offsets_replay``), unloading lost ones
  ``group_writes``        ``GroupWriter``: appending records through the log actors; write errors
  ``group_purgatory``     ``Purgatory``: the held heartbeats and held classic requests
  ``group_api_consumer``  ``ConsumerApi``: CONSUMER_GROUP_HEARTBEAT
  ``group_api_classic``   ``ClassicApi``: JOIN_GROUP, SYNC_GROUP, HEARTBEAT (the classic protocol)
  ``group_api_offsets``   ``OffsetsApi``: OFFSET_COMMIT, OFFSET_FETCH, a transaction's offsets, expiry
  ``group_api_admin``     ``AdminApi``: FIND_COORDINATOR, LIST/DESCRIBE/DELETE_GROUPS, LEAVE_GROUP
  ``group_requests``      group ids, topic-partition lists (fields: ``core.fields``)
This module keeps the assembly, the topic's creation on first use (``TopicCreation``), the
entry point (``group_request``: queueing, the coordinator check, the dispatch table), the
metadata messages and the tick.
"""
from __future__ import annotations

import logging
from typing import Callable

from odradek.actors.message import Message
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
            result = {} if reply.is_error else reply.fields["body"]["topics"][0]
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

        self.outbox.request(CONTROLLER, "create_topics", {"body": {"topics": [{
            "name": OFFSETS_TOPIC, "num_partitions": n, "replication_factor": rf,
            "configs": {"cleanup.policy": "compact", "segment.bytes": self.config["offsets.topic.segment.bytes"]}}]}},
            callback=created, timeout=60.0)

    def run_queued(self, why: str = f"{OFFSETS_TOPIC} was created but is not in this broker's metadata "
                                      f"yet; retry") -> None:
        """The creation is over: run what waited for it; writers fail (``why``) if the topic
        is still unknown here."""
        self.creating = False
        queued, self.queued = self.queued, []
        for msg in queued:
            if not self.leadership.partitions and msg.get("api") in WRITERS:
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
        self._adopt(self.call(CONTROLLER, "get_metadata", timeout=60.0).fields, starting=True)
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
        version = msg.get("metadata_version")
        if isinstance(version, int) and version > self.meta.version:
            self._refresh_metadata()
        creation = self.creation
        if creation.creating or (not self.leadership.partitions and msg.get("api") in WRITERS):
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
        api, body = msg.get("api"), msg.get("body")
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
        self._adopt_and_react(msg.fields or {})
        self.reply(msg, {"version": self.meta.version})

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
                self._adopt_and_react(reply.fields)
            if then is not None:
                then()
        self.request(CONTROLLER, "get_metadata", callback=adopt, timeout=10.0)

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
