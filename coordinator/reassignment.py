"""Changing where partitions live: reassignment (KIP-455), CreatePartitions, and the replica
placement both use (Kafka's rack-unaware and rack-alternating assignments).

Process: ``controller`` (a ``Reassignments`` object, owned by the active controller,
``coordinator.active_controller.ActiveController``, made on election); other brokers relay
the requests to it (``BrokerAgent.relay_to_controller``).
Owns: ``moves`` — the reassignments in progress, ``{(topic, partition): Move}``, mirrored in
ZooKeeper as the topic node's ``adding_replicas`` / ``removing_replicas`` (Kafka's layout), so
a controller elected in the middle of a move reads it back and finishes it.
Accepts (``broker_request`` from a handler, answered to it):
  ALTER_PARTITION_REASSIGNMENTS {topics: [{name, partitions: [{partition_index, replicas}]}]}
        ``replicas`` null cancels the partition's move
  LIST_PARTITION_REASSIGNMENTS {topics: null | [{name, partition_indexes}]}
  CREATE_PARTITIONS {topics: [{name, count, assignments: null | [{broker_ids}]}], validate_only}

A move, as Kafka sequences it (docs/REPLICATION.md, "Reassignment"): with original replicas
O and target T, the partition's replicas become T + (O - T), adding T - O and removing O - T
(written to the topic node), and a new leader epoch tells every replica; the new ones start
following. Once every target replica is in the ISR (the leader's ISR change notifies the
controller; a timer checks too), the leader moves into T if it is outside it, the ISR shrinks
to T, the topic node holds just T, and the removed replicas get STOP_REPLICA with delete.
Cancelling (replicas null) is a move back to O: the added replicas are stopped at once.
A finished move is still listed by ListPartitionReassignments (replicas T, nothing adding or
removing) until its UPDATE_METADATA has reached every live broker (``announcing``), so a
tool that sees a move no longer listed reads the final replica set from any broker.
"""
from __future__ import annotations

import dataclasses
import logging
import random

from odradek.actors.message import Message
from odradek.actors.messages import Response
from odradek.coordinator.topics import check_partition_count
from odradek.coordinator.zk_state import TOPICS, PartitionState, state_path, topic_data
from odradek.core.protocol import ErrorCode, OdradekError

log = logging.getLogger("odradek.controller")

MOVE_CHECK_INTERVAL = 1.0  # seconds between checks of the moves in progress (the ISR notifications are the fast path)


def assign_replicas(brokers: list[int], partitions: int, rf: int, start: int, shift: int,
                    first_partition: int = 0) -> list[list[int]]:
    """Kafka's rack-unaware assignment: partition p's first (preferred) replica is broker
    ``(start + p) mod n``, so leaders go round-robin; followers follow at a distance that
    grows by one each time the leaders wrap around, so replicas of consecutive partitions
    spread over different brokers. ``rf`` <= ``len(brokers)``."""
    n = len(brokers)
    out = []
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        out.append([brokers[first]] + [brokers[_follower_index(first, shift, j, n)] for j in range(rf - 1)])
    return out


def _follower_index(first: int, shift: int, j: int, n: int) -> int:
    return (first + 1 + (shift + j) % (n - 1)) % n


def rack_alternated(racks: dict[int, str]) -> list[int]:
    """Brokers ordered so racks alternate: the first broker of each rack (racks and brokers
    sorted), then the second of each, ... (Kafka's rack-alternated broker list)."""
    by_rack: dict[str, list[int]] = {}
    for b in sorted(racks):
        by_rack.setdefault(racks[b], []).append(b)
    columns = [by_rack[r] for r in sorted(by_rack)]
    return [col[i] for i in range(max(len(c) for c in columns)) for col in columns if i < len(col)]


def assign_replicas_rack_aware(racks: dict[int, str], partitions: int, rf: int, start: int, shift: int,
                               first_partition: int = 0) -> list[list[int]]:
    """Kafka's rack-aware assignment: leaders round-robin over the rack-alternated broker
    list; each follower is the next broker (at the growing shift, as rack-unaware) whose
    rack holds no replica of the partition yet — until every rack has one, after which any
    broker without a replica will do. So with at least ``rf`` racks no two replicas of a
    partition share a rack."""
    brokers = rack_alternated(racks)
    n, n_racks = len(brokers), len(set(racks.values()))
    out = []
    for p in range(first_partition, first_partition + partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start) % n
        replicas = [brokers[first]]
        used_racks, k = {racks[brokers[first]]}, 0
        while len(replicas) < rf:
            b = brokers[_follower_index(first, shift * n_racks, k, n)]
            k += 1
            rack_ok = racks[b] not in used_racks or len(used_racks) == n_racks
            if rack_ok and (b not in replicas or len(replicas) == n):
                replicas.append(b)
                used_racks.add(racks[b])
        out.append(replicas)
    return out


def place_replicas(live, racks_of: dict[int, str | None], partitions: int, rf: int,
                   first_partition: int = 0) -> list[list[int]]:
    """Placement of new partitions over the ``live`` brokers: rack-aware when every live broker
    has a ``broker.rack`` (Kafka refuses a mix; we fall back to rack-unaware and say so)."""
    brokers = sorted(live)
    n = len(brokers)
    if rf > n:
        raise OdradekError(f"replication factor {rf} is larger than the {n} live broker(s) {brokers}",
                           ErrorCode.INVALID_REPLICATION_FACTOR)
    start, shift = random.randrange(n), random.randrange(n)
    racks = {b: racks_of.get(b) for b in brokers}
    if any(racks.values()):
        if all(racks.values()):
            return assign_replicas_rack_aware(racks, partitions, rf, start, shift, first_partition)
        log.warning("only some brokers have broker.rack (%s): placing replicas without racks", racks)
    return assign_replicas(brokers, partitions, rf, start, shift, first_partition)


def check_target(live, tp: tuple, target) -> None:
    """A replica list asked for ``tp`` (a move, an explicit assignment): distinct ``live`` brokers."""
    if not isinstance(target, list) or not target or not all(isinstance(r, int) and not isinstance(r, bool)
                                                             for r in target):
        raise OdradekError(f"{tp[0]}-{tp[1]}: replicas must be a non-empty list of broker ids, got {target!r}",
                           ErrorCode.INVALID_REPLICA_ASSIGNMENT)
    if len(set(target)) != len(target):
        raise OdradekError(f"{tp[0]}-{tp[1]}: replicas {target} name a broker twice",
                           ErrorCode.INVALID_REPLICA_ASSIGNMENT)
    unknown = [r for r in target if r not in live]
    if unknown:
        raise OdradekError(f"{tp[0]}-{tp[1]}: brokers {unknown} are not registered (live: {sorted(live)})",
                           ErrorCode.INVALID_REPLICA_ASSIGNMENT)


@dataclasses.dataclass
class Move:
    target: list[int]
    adding: list[int]
    removing: list[int]

    @property
    def origin(self) -> list[int]:
        """The replicas before the move (what a cancellation returns to)."""
        return [r for r in self.target if r not in self.adding] + self.removing


class Reassignments:
    """The moves in progress, owned by the active controller (``coordinator.active_controller``),
    which is handed in as ``controller``: the partition state it owns (``registry``,
    ``assignment``, ``states``, ``live``, ``epoch``) and the steps it takes (``write_states``,
    ``announce``, ``commit_or_raise``, ...). ``zk``: its kazoo client; ``outbox``: the actor's
way to answer (``controller_kit.Outbox``)."""

    def __init__(self, controller, zk, outbox):
        self.ctl, self.zk, self.outbox = controller, zk, outbox
        self.moves: dict[tuple[str, int], Move] = {}
        self.announcing: dict = {}  # {(topic, partition): replicas}: moves done whose UPDATE_METADATA is under way

    # ---- the topic node ----------------------------------------------------------------------
    def write_topic(self, name: str, changes: dict[int, tuple[list[int], Move | None]],
                    new_states: dict[int, PartitionState] | None = None) -> None:
        """Record new replica lists (and moves) of ``name``'s partitions in its topic node, with
        the state nodes of new partitions (CreatePartitions) in the same fenced transaction."""
        topic = self.ctl.registry.get(name)
        replicas = list(self.ctl.assignment[name])
        moves = {p: m for (t, p), m in self.moves.items() if t == name}
        for p, (r, move) in changes.items():
            if p == len(replicas):
                replicas.append(r)
            else:
                replicas[p] = r
            moves.pop(p, None)
            if move is not None:
                moves[p] = move
        t = self.zk.transaction()
        t.check("/controller_epoch", self.ctl.epoch_zk_version)
        t.set_data(f"{TOPICS}/{name}", topic_data(topic.topic_id, topic.created_ms, replicas,
                                                 {p: m.adding for p, m in moves.items()},
                                                 {p: m.removing for p, m in moves.items()}))
        for p, st in (new_states or {}).items():
            t.create(f"{TOPICS}/{name}/partitions/{p}")
            t.create(state_path(name, p), st.data())
        self.ctl.commit_or_raise(t, f"the replicas of '{name}'")
        self.ctl.assignment[name] = replicas
        for p, (_, move) in changes.items():
            self.moves.pop((name, p), None)
            if move is not None:
                self.moves[(name, p)] = move
        for p, st in (new_states or {}).items():
            st.zk_version = 0
            self.ctl.states[(name, p)] = st

    def load(self, name: str, replicas: list[list[int]], adding: dict, removing: dict) -> None:
        """A new controller's view of ``name``'s moves in progress, from its topic node."""
        for p in set(adding) | set(removing):
            target = [r for r in replicas[p] if r not in removing.get(p, [])]
            self.moves[(name, p)] = Move(target, adding.get(p, []), removing.get(p, []))
            log.info("%s-%d: resuming the move to %s", name, p, target)

    # ---- AlterPartitionReassignments ---------------------------------------------------------
    def alter_moves(self, msg: Message, body: dict) -> None:
        self.ctl.refresh_live_brokers()
        responses, changed, stops = [], [], {}
        topics = body.get("topics")
        if not isinstance(topics, list):
            self.outbox.reply(msg, Response({"error_code": int(ErrorCode.INVALID_REQUEST), "responses": [],
                                             "error_message": "'topics' must be a list of {name, partitions}"}))
            return
        for t in topics:
            name = t.get("name") if isinstance(t, dict) else None
            parts = []
            for p in (t.get("partitions") or []) if isinstance(t, dict) else []:
                index = p.get("partition_index") if isinstance(p, dict) else None
                try:
                    dropped = self._start_move((name, index), p.get("replicas") if isinstance(p, dict) else None)
                    changed.append((name, index))
                    for b in dropped:
                        stops.setdefault(b, []).append((name, index))
                    parts.append({"partition_index": index, "error_code": 0, "error_message": None})
                except OdradekError as exc:
                    parts.append({"partition_index": index, "error_code": int(exc.code), "error_message": exc.message})
            responses.append({"name": name, "partitions": parts})
        answer = lambda: self.outbox.reply(msg, Response({"error_code": 0, "error_message": None,  # noqa: E731
                                                          "responses": responses}))
        self.ctl.announce(changed, stops, lambda: (answer(), self.complete()))

    def _start_move(self, tp: tuple, target) -> list[int]:
        """Begin (or replace, or cancel: ``target`` None) the move of one partition; returns the
        brokers whose replicas leave at once (ones an earlier move had added)."""
        if tp not in self.ctl.states:
            raise OdradekError(f"{tp[0]}-{tp[1]}: no such partition", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        move, current = self.moves.get(tp), self.ctl.replicas(tp)
        origin = move.origin if move else list(current)
        if target is None:
            if move is None:
                raise OdradekError(f"{tp[0]}-{tp[1]}: no reassignment in progress to cancel",
                                   ErrorCode.NO_REASSIGNMENT_IN_PROGRESS)
            target = origin
        check_target(self.ctl.live, tp, target)
        adding = [r for r in target if r not in origin]
        removing = [r for r in origin if r not in target]
        full = target + removing
        dropped = [r for r in current if r not in full]
        new = Move(list(target), adding, removing) if adding or removing or dropped else None
        self.write_topic(tp[0], {tp[1]: (full, new)})
        st = self.ctl.states[tp]
        isr = [r for r in st.isr if r in full]
        leader = st.leader if st.leader in full else self.ctl.choose_leader(tp, [r for r in isr if r in self.ctl.live])
        self.ctl.write_states({tp: (-1 if leader is None else leader, isr or st.isr)})
        log.info("%s-%d: %s %s -> %s (adding %s, removing %s)", tp[0], tp[1],
                 "cancelling the move," if target == origin and move else "moving", origin, target, adding, removing)
        return dropped

    # ---- completing moves ------------------------------------------------------------------------
    def complete(self) -> None:
        """Finish every move whose target replicas are all in the ISR (called after ISR
        changes, after new moves, and on a timer)."""
        if not self.ctl.active:
            return
        for tp, move in list(self.moves.items()):
            st = self.ctl.states.get(tp)
            if st is None:
                self.moves.pop(tp, None)
            elif all(r in st.isr for r in move.target):
                try:
                    self._finish_move(tp, move)
                except OdradekError as exc:
                    log.warning("%s-%d: move not finished yet: %s", tp[0], tp[1], exc.message)

    def _finish_move(self, tp: tuple, move: Move) -> None:
        st = self.ctl.states[tp]
        leader = st.leader
        if leader not in move.target or leader not in self.ctl.live:
            leader = next((r for r in move.target if r in st.isr and r in self.ctl.live), None)
            if leader is None:
                return  # no target replica is alive: wait
        if not self.ctl.write_states({tp: (leader, [r for r in st.isr if r in move.target])}):
            return
        self.write_topic(tp[0], {tp[1]: (list(move.target), None)})
        topic = self.ctl.registry.topics.get(tp[0])
        if topic is not None:
            topic.replication_factor = len(self.ctl.assignment[tp[0]][0])
        log.info("%s-%d: move done: replicas %s, leader %d (removed %s)", tp[0], tp[1], move.target, leader,
                 move.removing)
        self.announcing[tp] = list(move.target)
        self.ctl.announce([tp], {b: [tp] for b in move.removing}, lambda: self.announcing.pop(tp, None))

    # ---- ListPartitionReassignments --------------------------------------------------------------
    def list_moves(self, msg: Message, body: dict) -> None:
        wanted = body.get("topics")
        if wanted is not None and not isinstance(wanted, list):
            why = "'topics' must be null or a list of {name, partition_indexes}"
            self.outbox.reply(msg, Response({"error_code": int(ErrorCode.INVALID_REQUEST), "topics": [],
                                             "error_message": why}))
            return
        asked = None if wanted is None else {(w.get("name"), p) for w in wanted if isinstance(w, dict)
                                             for p in w.get("partition_indexes") or []}
        listed = {tp: (self.ctl.replicas(tp), m.adding, m.removing) for tp, m in self.moves.items()}
        listed.update({tp: (r, [], []) for tp, r in self.announcing.items() if tp not in self.moves})
        topics: dict[str, list] = {}
        for (name, p), (replicas, adding, removing) in sorted(listed.items()):
            if asked is None or (name, p) in asked:
                topics.setdefault(name, []).append({"partition_index": p, "replicas": replicas,
                                                    "adding_replicas": adding, "removing_replicas": removing})
        self.outbox.reply(msg, Response({"error_code": 0, "error_message": None,
                                         "topics": [{"name": n, "partitions": ps} for n, ps in topics.items()]}))

    # ---- CreatePartitions -------------------------------------------------------------------------
    def create_partitions(self, msg: Message, body: dict) -> None:
        self.ctl.refresh_live_brokers()
        validate_only = bool(body.get("validate_only"))
        results, grown = [], []
        for req in body.get("topics") or []:
            name = req.get("name") if isinstance(req, dict) else None
            try:
                if not isinstance(req, dict):
                    raise OdradekError("each topic must be a map {name, count, assignments}", ErrorCode.INVALID_REQUEST)
                placed = self._placement_of_new(name, req.get("count"), req.get("assignments"))
                if not validate_only:
                    grown += self._add_partitions(name, placed)
                results.append({"name": name, "error_code": 0, "error_message": None})
            except OdradekError as exc:
                results.append({"name": name, "error_code": int(exc.code), "error_message": exc.message})
        self.ctl.announce(grown, {}, lambda: self.outbox.reply(msg, Response({"results": results})))

    def _placement_of_new(self, name, count, assignments) -> list[list[int]]:
        topic = self.ctl.registry.get(name)
        have = topic.partitions
        check_partition_count(name, have, count)
        rf = len(self.ctl.assignment[name][0])
        if assignments is None:
            return self.ctl.place(count - have, rf, first_partition=have)
        if not isinstance(assignments, list) or len(assignments) != count - have:
            raise OdradekError(f"topic '{name}': {count - have} new partitions need as many assignments, got "
                               f"{assignments!r}", ErrorCode.INVALID_REPLICA_ASSIGNMENT)
        placed = []
        for i, a in enumerate(assignments):
            replicas = a.get("broker_ids") if isinstance(a, dict) else a
            check_target(self.ctl.live, (name, have + i), replicas)
            if len(replicas) != rf:
                raise OdradekError(f"{name}-{have + i}: {len(replicas)} replicas, but the topic's replication factor "
                                   f"is {rf}", ErrorCode.INVALID_REPLICA_ASSIGNMENT)
            placed.append(replicas)
        return placed

    def _add_partitions(self, name: str, placed: list[list[int]]) -> list[tuple[str, int]]:
        have = self.ctl.registry.get(name).partitions
        states = {}
        for i, replicas in enumerate(placed):
            live = [r for r in replicas if r in self.ctl.live]
            states[have + i] = PartitionState(live[0] if live else -1, 0, live, self.ctl.epoch, 0)
        self.write_topic(name, {p: (placed[p - have], None) for p in states}, states)
        self.ctl.registry.topics[name].partitions = have + len(placed)
        self.ctl.registry.version += 1
        log.info("%s: %d -> %d partitions, new replicas %s", name, have, have + len(placed), placed)
        return [(name, p) for p in states]
