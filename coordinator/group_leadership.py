"""The group coordinator's leadership following: which ``__consumer_offsets`` partitions this
broker leads, loading the ones it gains and unloading the ones it loses.

Runs in the ``group_coordinator`` process, as part of ``GroupCoordinator`` (a mixin of it: it
reads and writes the state ``GroupCoordinator.on_start`` sets up). Ownership follows the
controller's metadata snapshot (``on_metadata``, ``get_metadata``); a gained partition is
replayed by an ``OffsetsReplay`` (``coordinator.offsets_replay``) from the bounds its log actor
reports (``get_bounds``), at start before the actor is ready, later in slices between other
messages; a lost one takes its groups, offsets and held requests with it (answered
NOT_COORDINATOR). ``_coordinator_error`` says why a group cannot be served here.
Sends: ``get_bounds`` to log actors, ``get_metadata`` to the controller.
"""
from __future__ import annotations

import logging
import time

from odradek.actors.message import Message
from odradek.actors.names import CONTROLLER, log_host
from odradek.coordinator.classic_group import ClassicGroup
from odradek.coordinator.group import ConsumerGroup
from odradek.coordinator.group_requests import wall_ms
from odradek.coordinator.offsets import led_partitions, offsets_leaders, partition_for
from odradek.coordinator.offsets_replay import OffsetsReplay, bounds_of
from odradek.network.kafka.groups import kafka_topic_id
from odradek.network.protocol import OFFSETS_TOPIC, ErrorCode, OdradekError

log = logging.getLogger("odradek.groups")

LOAD_RETRY = 0.05  # seconds between get_bounds attempts while the log actor does not lead the partition yet
LOAD_SLICE_BYTES = 4 << 20  # bytes replayed per turn of the loop while loading asynchronously


class Leadership:
    """The group coordinator's leadership following (a mixin of ``GroupCoordinator``)."""

    # ---- loading and unloading partitions ------------------------------------------------
    def _host(self, partition: int) -> str:
        return log_host(OFFSETS_TOPIC, partition, self.log_hosts)

    def _load_at_start(self, led: dict[int, int]) -> None:
        """Load the partitions led at start before reporting ready (blocking calls)."""
        by_host: dict[str, list[int]] = {}
        for p in sorted(led):
            by_host.setdefault(self._host(p), []).append(p)
        for host, parts in by_host.items():
            try:
                fields = self.call(host, "get_bounds", timeout=60.0).fields
            except OdradekError as exc:
                log.warning("%s: no bounds from %s at start (%s); loading in the background", OFFSETS_TOPIC,
                            host, exc.message)
                fields = {}
            for p in parts:
                ld = self.loading[p] = OffsetsReplay(p, next(self._tokens), led[p])
                bounds = bounds_of(fields, p)
                if bounds is None:
                    self._ask_bounds(ld)
                    continue
                try:
                    ld.begin(bounds, self.data_dir)
                    while not ld.replay_some(None):
                        pass
                except (OdradekError, OSError) as exc:  # the files changed under the reader: again, in the background
                    log.error("loading %s-%d at start failed (%s); loading in the background", OFFSETS_TOPIC, p, exc)
                    ld.restart()
                    self._ask_bounds(ld)
                    continue
                self._install(ld)

    def _start_load(self, partition: int, epoch: int) -> None:
        ld = self.loading[partition] = OffsetsReplay(partition, next(self._tokens), epoch)
        log.info("loading %s-%d (leader epoch %d)", OFFSETS_TOPIC, partition, epoch)
        self._ask_bounds(ld)

    def _ask_bounds(self, ld: OffsetsReplay) -> None:
        def answered(reply: Message) -> None:
            if self.loading.get(ld.partition) is not ld:
                return  # unloaded meanwhile
            bounds = None if reply.is_error else bounds_of(reply.fields, ld.partition)
            if bounds is None:
                ld.attempts += 1
                if ld.attempts % 200 == 20:  # quiet for the first second (a topic being opened)
                    why = reply.error_message if reply.is_error else "not in its bounds, or not as leader"
                    log.warning("loading %s-%d: %s does not lead it yet (%s); retrying", OFFSETS_TOPIC,
                                ld.partition, self._host(ld.partition), why)
                self.call_later(LOAD_RETRY, lambda: self.loading.get(ld.partition) is ld and self._ask_bounds(ld))
                return
            ld.begin(bounds, self.data_dir)
            self._replay_slice(ld)

        self.request(self._host(ld.partition), "get_bounds", callback=answered, timeout=60.0)

    def _replay_slice(self, ld: OffsetsReplay) -> None:
        """One slice of an asynchronous load; the next one runs after pending messages."""
        if self.loading.get(ld.partition) is not ld:
            return
        try:
            done = ld.replay_some(LOAD_SLICE_BYTES)
        except (OdradekError, OSError) as exc:
            log.error("loading %s-%d failed (%s); starting over", OFFSETS_TOPIC, ld.partition, exc)
            ld.restart()
            self.call_later(1.0, lambda: self.loading.get(ld.partition) is ld and self._ask_bounds(ld))
            return
        if done:
            self._install(ld)
        else:
            self.call_later(0, lambda: self._replay_slice(ld))

    def _install(self, ld: OffsetsReplay) -> None:
        """A replayed partition: its groups and offsets join memory; it is served from now."""
        del self.loading[ld.partition]
        now, wall, view = self._now(), wall_ms(), ld.view
        self.offsets.update(view.offsets)
        for gid, rec in view.groups.items():
            empty_since = rec.get("empty_since_ms")
            try:
                if type(empty_since) not in (int, type(None)):
                    raise ValueError(f"empty_since_ms {empty_since!r} is not a time")
                if "classic" in rec["group"]:
                    group = ClassicGroup.from_record(gid, rec["group"]["classic"], now, self.classic_config)
                else:
                    group = ConsumerGroup.from_record(gid, rec["group"], now, self.group_config)
            except Exception as exc:  # a record this coordinator cannot rebuild (issue 27): not fatal
                ld.skip(view.group_at.get(gid, -1), f"group '{gid}' cannot be rebuilt from its record "
                                                    f"({type(exc).__name__}: {exc}); it starts empty, its "
                                                    f"committed offsets are kept")
                continue
            (self.classic if isinstance(group, ClassicGroup) else self.groups)[gid] = group
            if empty_since is not None:
                self.empty_since[gid] = empty_since
        ld.close()
        for gid in view.offsets:
            self.empty_since.setdefault(gid, wall)
        self.owned[ld.partition] = ld.token
        log.info("loaded %s-%d: %d groups and %d committed offsets from %d records in %.3f s", OFFSETS_TOPIC,
                 ld.partition, len(view.groups), sum(len(o) for o in view.offsets.values()), ld.records,
                 time.monotonic() - ld.started)
        self._loads_settled()

    def _loads_settled(self) -> None:
        if not self.loading:
            waiting, self._on_loaded = self._on_loaded, []
            for entry, fire in waiting:
                entry["timer"].cancel()
                fire()

    def _unload(self, partition: int, why: str) -> None:
        """This broker stopped leading ``partition``: forget its groups and offsets."""
        ld = self.loading.pop(partition, None)
        if ld is not None:
            ld.close()
        was_owned = self.owned.pop(partition, None) is not None
        n = self.partitions
        mine = lambda gid: partition_for(gid, n) == partition  # noqa: E731
        for key in [k for k in self.held if mine(k[0])]:
            held = self.held.pop(key)
            held.timer.cancel()
            self.reply_error(held.msg, ErrorCode.NOT_COORDINATOR,
                             f"group '{key[0]}' moved: this broker no longer leads {OFFSETS_TOPIC}-{partition} ({why})")
        for key in [k for k in self.held_classic if mine(k[0])]:
            self.reply_error(self.held_classic.pop(key), ErrorCode.NOT_COORDINATOR,
                             f"group '{key[0]}' moved: this broker no longer leads {OFFSETS_TOPIC}-{partition} ({why})")
        gids = [gid for gid in set(self.groups) | set(self.classic) | set(self.offsets) | set(self.empty_since)
                if mine(gid)]
        for gid in gids:
            self.groups.pop(gid, None)
            self.classic.pop(gid, None)
            self.offsets.pop(gid, None)
            self.empty_since.pop(gid, None)
        if was_owned or ld is not None:
            log.info("unloaded %s-%d (%d groups): %s", OFFSETS_TOPIC, partition, len(gids), why)
        if ld is not None:
            self._loads_settled()

    # ---- metadata -------------------------------------------------------------------------
    def on_metadata(self, msg: Message) -> None:
        """The controller's push: adopt the snapshot (a newer version than ours) at once."""
        self._adopt_and_react(msg.fields or {})
        self.reply(msg, {"version": self.metadata_version})

    def _adopt(self, snapshot: dict, starting: bool = False) -> bool:
        """Take a snapshot unless it is older than ours; True if topics changed."""
        version = snapshot.get("version", -1)
        if not isinstance(version, int) or version < self.metadata_version:
            return False
        self.metadata_version = version
        self.snapshot = snapshot
        if isinstance(snapshot.get("broker_id"), int):
            self.broker_id = snapshot["broker_id"]
        before = self.topics
        self.topics = {n: t["partitions"] for n, t in (snapshot.get("topics") or {}).items()}
        self.topic_ids = {n: kafka_topic_id(t.get("id")) for n, t in (snapshot.get("topics") or {}).items()}
        self.topic_names = {i: n for n, i in self.topic_ids.items()}
        self._follow_leadership(snapshot, starting)
        return self.topics != before

    def _follow_leadership(self, snapshot: dict, starting: bool) -> None:
        meta = (snapshot.get("topics") or {}).get(OFFSETS_TOPIC) or {}
        n, topic_id = meta.get("partitions") or 0, meta.get("id")
        if self.partitions and (n != self.partitions or topic_id != self.offsets_topic_id):
            for p in sorted(set(self.owned) | set(self.loading)):
                self._unload(p, f"{OFFSETS_TOPIC} was deleted or recreated")
        self.partitions, self.offsets_topic_id = n, topic_id
        self.leaders = offsets_leaders(snapshot, self.broker_id)
        led = led_partitions(snapshot, self.broker_id)
        for p in sorted(set(self.owned) | set(self.loading)):
            if p not in led:
                self._unload(p, f"broker {self.leaders[p][0]} leads it now (leader epoch {self.leaders[p][1]})")
        for p in self.owned:
            led.pop(p, None)  # still led: a newer leader epoch alone (an ISR change) needs no reload
        for p in self.loading:
            led.pop(p, None)
        if starting:
            self._load_at_start(led)
        else:
            for p, epoch in sorted(led.items()):
                self._start_load(p, epoch)

    def _adopt_and_react(self, snapshot: dict) -> None:
        if self._adopt(snapshot):
            for g in list(self.groups.values()):
                if g.members and g.maybe_rebalance(self.topics):
                    self._changed(g)

    def _refresh_metadata(self, then=None) -> None:
        def adopt(reply: Message) -> None:
            if not reply.is_error:
                self._adopt_and_react(reply.fields)
            if then is not None:
                then()
        self.request(CONTROLLER, "get_metadata", callback=adopt, timeout=10.0)

    def _coordinator_error(self, gid: str) -> OdradekError | None:
        """Why this broker cannot serve group ``gid`` now (None: it can)."""
        if not self.partitions:
            return None  # no offsets topic yet: no group exists anywhere
        p = partition_for(gid, self.partitions)
        if p in self.owned:
            return None
        if p in self.loading:
            return OdradekError(f"group '{gid}': {OFFSETS_TOPIC}-{p} is being loaded on broker {self.broker_id}; "
                                f"retry", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        leader, epoch = self.leaders[p] if p < len(self.leaders) else (-1, -1)
        where = f"led by broker {leader} (leader epoch {epoch})" if leader >= 0 else "without a leader"
        return OdradekError(f"broker {self.broker_id} is not the coordinator of group '{gid}': its partition "
                            f"{OFFSETS_TOPIC}-{p} is {where}; find the coordinator again", ErrorCode.NOT_COORDINATOR)
