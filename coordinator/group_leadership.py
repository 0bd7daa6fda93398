"""The group coordinator's leadership following: which ``__consumer_offsets`` partitions this
broker leads, loading the ones it gains and unloading the ones it loses.

Process: ``group_coordinator`` (a plain object its actor owns, ``coordinator.group_coordinator``).
Owns: the offsets topic's partition count and id, each partition's leader, the partitions
led and loaded here (``owned``: partition -> load token, which a write in flight checks) or
being loaded (``loading``: an ``OffsetsReplay`` each), and the callbacks waiting for every
load to finish.
Collaborators, handed in: the ``TopicView`` (this broker's id), the data directory and the
number of log hosts, the actor's ``Outbox`` (``get_bounds`` requests, timers, the blocking
``call`` at start), ``installed(view, skip)`` (a replayed partition's groups and
offsets: the ``GroupTable``) and ``dropped(partition, mine, why)`` (a partition lost: its
groups leave the table, its held requests are answered NOT_COORDINATOR).
A gained partition is replayed by an ``OffsetsReplay`` (``coordinator.offsets_replay``) from
the bounds its log actor reports, at start before the actor is ready, later in slices between
other messages. ``coordinator_error`` says why a group cannot be served here.
Sends: ``get_bounds`` to log actors.
"""
from __future__ import annotations

import itertools
import logging
import time
from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import GetBounds
from odradek.actors.names import log_host
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.group_table import TopicView
from odradek.coordinator.offsets import led_partitions, offsets_leaders, partition_for
from odradek.coordinator.offsets_replay import OffsetsReplay, bounds_of
from odradek.core.protocol import OFFSETS_TOPIC, ErrorCode, OdradekError

log = logging.getLogger("odradek.groups")

LOAD_RETRY = 0.05  # seconds between get_bounds attempts while the log actor does not lead the partition yet
LOAD_SLICE_BYTES = 4 << 20  # bytes replayed per turn of the loop while loading asynchronously


class Leadership:
    def __init__(self, meta: TopicView, data_dir: str, log_hosts: int, outbox: Outbox,
                 installed: Callable, dropped: Callable[[int, Callable[[str], bool], str], list]):
        self.meta, self.data_dir, self.log_hosts, self.outbox = meta, data_dir, log_hosts, outbox
        self.installed, self.dropped = installed, dropped
        self.partitions = 0  # of __consumer_offsets; 0: it does not exist (yet)
        self.offsets_topic_id = None
        self.leaders: list[tuple[int, int]] = []  # (leader, leader_epoch) per partition
        self.owned: dict[int, int] = {}  # loaded partitions this broker leads -> load token
        self.loading: dict[int, OffsetsReplay] = {}
        self.tokens = itertools.count(1)
        self.waiting: list = []  # callbacks waiting for every load to finish

    def close(self) -> None:
        for ld in self.loading.values():
            ld.close()

    # ---- loading and unloading partitions ------------------------------------------------
    def host(self, partition: int) -> str:
        return log_host(OFFSETS_TOPIC, partition, self.log_hosts)

    def _load_at_start(self, led: dict[int, int]) -> None:
        """Load the partitions led at start before reporting ready (blocking calls)."""
        by_host: dict[str, list[int]] = {}
        for p in sorted(led):
            by_host.setdefault(self.host(p), []).append(p)
        for host, parts in by_host.items():
            try:
                answer = self.outbox.call(host, GetBounds(), timeout=60.0).fields
            except OdradekError as exc:
                log.warning("%s: no bounds from %s at start (%s); loading in the background", OFFSETS_TOPIC,
                            host, exc.message)
                answer = None
            for p in parts:
                ld = self.loading[p] = OffsetsReplay(p, next(self.tokens), led[p])
                bounds = bounds_of(answer, p)
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
        ld = self.loading[partition] = OffsetsReplay(partition, next(self.tokens), epoch)
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
                                ld.partition, self.host(ld.partition), why)
                self.outbox.later(LOAD_RETRY, lambda: self.loading.get(ld.partition) is ld and self._ask_bounds(ld))
                return
            ld.begin(bounds, self.data_dir)
            self._replay_slice(ld)

        self.outbox.request(self.host(ld.partition), GetBounds(), callback=answered, timeout=60.0)

    def _replay_slice(self, ld: OffsetsReplay) -> None:
        """One slice of an asynchronous load; the next one runs after pending messages."""
        if self.loading.get(ld.partition) is not ld:
            return
        try:
            done = ld.replay_some(LOAD_SLICE_BYTES)
        except (OdradekError, OSError) as exc:
            log.error("loading %s-%d failed (%s); starting over", OFFSETS_TOPIC, ld.partition, exc)
            ld.restart()
            self.outbox.later(1.0, lambda: self.loading.get(ld.partition) is ld and self._ask_bounds(ld))
            return
        if done:
            self._install(ld)
        else:
            self.outbox.later(0, lambda: self._replay_slice(ld))

    def _install(self, ld: OffsetsReplay) -> None:
        """A replayed partition: its groups and offsets join memory; it is served from now."""
        del self.loading[ld.partition]
        view = ld.view
        self.installed(view, ld.skip)
        ld.close()
        self.owned[ld.partition] = ld.token
        log.info("loaded %s-%d: %d groups and %d committed offsets from %d records in %.3f s", OFFSETS_TOPIC,
                 ld.partition, len(view.groups), sum(len(o) for o in view.offsets.values()), ld.records,
                 time.monotonic() - ld.started)
        self._loads_settled()

    def _loads_settled(self) -> None:
        if not self.loading:
            waiting, self.waiting = self.waiting, []
            for entry, fire in waiting:
                entry["timer"].cancel()
                fire()

    def when_loaded(self, then, timeout: float) -> None:
        """Run ``then`` once no partition is loading, or after ``timeout`` seconds."""
        if not self.loading:
            then()
            return
        entry = {"fn": then}

        def fire() -> None:
            fn, entry["fn"] = entry["fn"], None
            if fn is not None:
                fn()
        entry["timer"] = self.outbox.later(timeout, fire)
        self.waiting.append((entry, fire))

    def _unload(self, partition: int, why: str) -> None:
        """This broker stopped leading ``partition``: forget its groups and offsets."""
        ld = self.loading.pop(partition, None)
        if ld is not None:
            ld.close()
        was_owned = self.owned.pop(partition, None) is not None
        n = self.partitions
        gids = self.dropped(partition, lambda gid: partition_for(gid, n) == partition, why)
        if was_owned or ld is not None:
            log.info("unloaded %s-%d (%d groups): %s", OFFSETS_TOPIC, partition, len(gids), why)
        if ld is not None:
            self._loads_settled()

    # ---- following the metadata -----------------------------------------------------------
    def follow(self, snapshot: dict, starting: bool) -> None:
        meta = (snapshot.get("topics") or {}).get(OFFSETS_TOPIC) or {}
        n, topic_id = meta.get("partitions") or 0, meta.get("id")
        if self.partitions and (n != self.partitions or topic_id != self.offsets_topic_id):
            for p in sorted(set(self.owned) | set(self.loading)):
                self._unload(p, f"{OFFSETS_TOPIC} was deleted or recreated")
        broker_id = self.meta.broker_id
        self.partitions, self.offsets_topic_id = n, topic_id
        self.leaders = offsets_leaders(snapshot, broker_id)
        led = led_partitions(snapshot, broker_id)
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

    def coordinator_error(self, gid: str) -> OdradekError | None:
        """Why this broker cannot serve group ``gid`` now (None: it can)."""
        if not self.partitions:
            return None  # no offsets topic yet: no group exists anywhere
        p = partition_for(gid, self.partitions)
        if p in self.owned:
            return None
        broker_id = self.meta.broker_id
        if p in self.loading:
            return OdradekError(f"group '{gid}': {OFFSETS_TOPIC}-{p} is being loaded on broker {broker_id}; "
                                f"retry", ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
        leader, epoch = self.leaders[p] if p < len(self.leaders) else (-1, -1)
        where = f"led by broker {leader} (leader epoch {epoch})" if leader >= 0 else "without a leader"
        return OdradekError(f"broker {broker_id} is not the coordinator of group '{gid}': its partition "
                            f"{OFFSETS_TOPIC}-{p} is {where}; find the coordinator again", ErrorCode.NOT_COORDINATOR)

    def leader_of(self, gid: str) -> tuple[int, int]:
        """``(partition, leader)`` of group ``gid`` (leader -1: none known)."""
        p = partition_for(gid, self.partitions)
        return p, self.leaders[p][0] if p < len(self.leaders) else -1
