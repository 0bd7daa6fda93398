"""The classic consumer-group protocol (JoinGroup / SyncGroup / Heartbeat / LeaveGroup):
a pure state machine, no I/O, time passed in as ``now`` (ms).

Single owner: the group coordinator's ``GroupTable`` (``coordinator.group_table``) holds
every ``ClassicGroup``; only the coordinator's parts call it (the tests, with a fake clock).
A JoinGroup or SyncGroup that must wait is *held*: the method returns ``None`` and the answer
appears later in ``outbox`` as ``(kind, member_id, body)``, kind ``"join"`` or ``"sync"``,
which the coordinator drains after every call (``take_outbox``). ``changed`` is set whenever
the durable state moved (a generation completed, the group emptied, a static member was
replaced): the coordinator writes the group's record before it sends the sync answers.

Group states and transitions (Kafka's GroupMetadata)::

    =====================  =====================================================  ======================
    state                  event                                                  next state
    =====================  =====================================================  ======================
    Empty                  a member joins                                         PreparingRebalance
    PreparingRebalance     every member rejoined (after the initial delay for a   CompletingRebalance
                           group that was empty), or the join deadline passed
                           (members that did not rejoin are removed)
    PreparingRebalance     the join completes with no member left                 Empty (generation + 1)
    CompletingRebalance    the leader's SyncGroup brings the assignments          Stable
    CompletingRebalance    a member joins, leaves, changes its protocols, or a    PreparingRebalance
                           member's session expires, or the sync deadline passes
    Stable                 a member joins, leaves, or changes its protocols; the  PreparingRebalance
                           leader rejoins; a member's session expires
    any                    the group is deleted                                   Dead
    =====================  =====================================================  ======================

Rules, as Kafka's classic coordinator applies them:

* A JoinGroup without a member id gets one. From JoinGroup v4 on it is answered
  MEMBER_ID_REQUIRED with that id (the member is *pending* until it joins again with it, or
  its session timeout passes); before v4 the member joins at once.
* A rebalance completes when every member has rejoined, or at the join deadline: the
  largest rebalance timeout of the members, capped at ``join_wait_cap_ms`` (the broker's
  ``request.timeout.ms`` less a margin, so that a held JoinGroup is answered before the
  processor times it out). A group that was Empty waits ``initial_rebalance_delay_ms``
  first, extended by each new member up to the rebalance timeout
  (``group.initial.rebalance.delay.ms``).
* The protocol chosen is one every member supports, by votes (each member votes for the
  first of its protocols that all support); the leader (the old one if still a member, else
  the first to join) gets every member's metadata for it; the others get none.
* SyncGroup of the leader carries the assignments (client-side assignment); every member's
  SyncGroup is answered with its own once the leader's arrived. A member whose SyncGroup
  does not come by the sync deadline is removed and the group rebalances.
* Heartbeat: UNKNOWN_MEMBER_ID (not a member, or the group is empty), FENCED_INSTANCE_ID
  (a newer incarnation of the static member), ILLEGAL_GENERATION (another generation),
  REBALANCE_IN_PROGRESS (PreparingRebalance: rejoin), else none. A member silent for its
  session timeout is removed (not while its JoinGroup or SyncGroup is held).
* Static membership (``group_instance_id``): a JoinGroup without a member id but with a known
  instance id replaces the old member (new member id; the old one is fenced with
  FENCED_INSTANCE_ID). If the group is Stable and the protocols are unchanged, there is no
  rebalance: the new member gets the current generation and, on SyncGroup, the old
  member's assignment. A static member that did not rejoin by the join deadline stays until
  its session timeout.
* Commits (``check_commit``): a simple commit (generation < 0, no member id) only to an
  Empty group; else UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, ILLEGAL_GENERATION, and
  REBALANCE_IN_PROGRESS while CompletingRebalance.

Errors raise ``GroupError`` whose message says whose fault it is.
"""
from __future__ import annotations

import dataclasses
import uuid
from typing import Callable

from odradek.coordinator.group import GroupError
from odradek.core.protocol import ErrorCode

EMPTY, PREPARING, COMPLETING, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
PROTOCOL_TYPE = "consumer"
MAX_PROTOCOLS = 64  # protocols (assignors) one member may offer
MAX_FENCED_IDS = 1000  # replaced static member ids remembered, to answer them FENCED_INSTANCE_ID


@dataclasses.dataclass
class ClassicConfig:
    """The broker's settings for classic groups, in milliseconds."""

    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1800000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_size: int = 1000  # group.max.size
    join_wait_cap_ms: int = 28000  # request.timeout.ms less a margin: held requests beat the processor
    max_metadata_bytes: int = 1 << 20  # one member's protocol metadata, or its assignment


@dataclasses.dataclass
class JoinRequest:
    member_id: str = ""
    instance_id: str | None = None
    session_timeout_ms: int = 45000
    rebalance_timeout_ms: int = -1  # -1: v0, the session timeout
    protocol_type: str = PROTOCOL_TYPE
    protocols: list = dataclasses.field(default_factory=list)  # [(name, metadata bytes)]
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # JoinGroup v4+


@dataclasses.dataclass
class ClassicMember:
    member_id: str
    instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    session_timeout_ms: int = 45000
    rebalance_timeout_ms: int = 300000
    protocol_type: str = PROTOCOL_TYPE
    protocols: list = dataclasses.field(default_factory=list)  # [(name, metadata)]
    assignment: bytes = b""
    awaiting_join: bool = False
    awaiting_sync: bool = False
    session_deadline: float = 0.0

    def metadata(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""


class ClassicGroup:
    """One classic group. See the module doc."""

    kind = "classic"

    def __init__(self, group_id: str, config: ClassicConfig | None = None,
                 new_member_id: Callable[[str], str] = lambda prefix: f"{prefix}-{uuid.uuid4()}"):
        self.group_id = group_id
        self.config = config or ClassicConfig()
        self.new_member_id = new_member_id
        self.state = EMPTY
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, ClassicMember] = {}
        self.pending: dict[str, float] = {}  # member ids handed out by MEMBER_ID_REQUIRED -> deadline
        self.static: dict[str, str] = {}  # instance id -> member id
        self.fenced_ids: dict[str, str] = {}  # replaced member id -> instance id
        self.join_deadline: float | None = None
        self.join_started: float = 0.0
        self.initial_delay = False  # the current rebalance started from Empty: wait for the delay
        self.sync_deadline: float | None = None
        self.outbox: list[tuple[str, str, dict]] = []
        self.changed = False
        self.deleted = False

    # ---- reads ----------------------------------------------------------------------------
    def take_outbox(self) -> list[tuple[str, str, dict]]:
        out, self.outbox = self.outbox, []
        return out

    def _candidates(self) -> set:
        """Protocols every member supports."""
        sets = [{n for n, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def _supports(self, req: JoinRequest) -> bool:
        names = {n for n, _ in req.protocols}
        if not self.members:
            return bool(req.protocol_type) and bool(names)
        return req.protocol_type == self.protocol_type and bool(names & self._candidates())

    # ---- JoinGroup ------------------------------------------------------------------------
    def join(self, req: JoinRequest, now: float) -> tuple[str, dict | None]:
        """Apply a JoinGroup: ``(member_id, body)`` if answered now, ``(member_id, None)``
        if held (its answer comes through the outbox)."""
        self._validate_join(req)
        if self.state == DEAD:
            raise GroupError(f"group '{self.group_id}' was deleted; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if not req.member_id:
            return self._join_unknown(req, now)
        return self._join_known(req, now)

    def _validate_join(self, req: JoinRequest) -> None:
        lo, hi = self.config.min_session_timeout_ms, self.config.max_session_timeout_ms
        if not lo <= req.session_timeout_ms <= hi:
            raise GroupError(f"session_timeout_ms {req.session_timeout_ms} is outside [{lo}, {hi}] "
                             f"(group.min/max.session.timeout.ms)", ErrorCode.INVALID_SESSION_TIMEOUT)
        if not req.protocol_type or not req.protocols:
            raise GroupError("a JoinGroup must name a protocol type and at least one protocol (client error)",
                             ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        if len(req.protocols) > MAX_PROTOCOLS:
            raise GroupError(f"{len(req.protocols)} protocols offered; at most {MAX_PROTOCOLS}",
                             ErrorCode.INVALID_REQUEST)
        size = sum(len(meta) for _, meta in req.protocols)
        if size > self.config.max_metadata_bytes:
            raise GroupError(f"the member's protocol metadata is {size} bytes; at most "
                             f"{self.config.max_metadata_bytes}", ErrorCode.INVALID_REQUEST)

    def _join_unknown(self, req: JoinRequest, now: float) -> tuple[str, dict | None]:
        if req.instance_id is not None and req.instance_id in self.static:
            return self._replace_static(req, now)
        if not self._supports(req):
            raise self._inconsistent(req)
        if len(self.members) + len(self.pending) >= self.config.max_size:
            raise GroupError(f"group '{self.group_id}' has {self.config.max_size} members (group.max.size)",
                             ErrorCode.GROUP_MAX_SIZE_REACHED)
        member_id = self.new_member_id(req.instance_id or req.client_id or "member")
        if req.require_known_member_id and req.instance_id is None:
            self.pending[member_id] = now + req.session_timeout_ms
            return member_id, self._error(ErrorCode.MEMBER_ID_REQUIRED, member_id)
        self._add(member_id, req, now)
        return member_id, None

    def _join_known(self, req: JoinRequest, now: float) -> tuple[str, dict | None]:
        if req.member_id in self.pending:
            if not self._supports(req):
                raise self._inconsistent(req)
            del self.pending[req.member_id]
            self._add(req.member_id, req, now)
            return req.member_id, None
        m = self._member(req.member_id, req.instance_id)
        if not self._supports(req):
            raise self._inconsistent(req)
        m.session_deadline = now + m.session_timeout_ms
        same = m.protocols == list(req.protocols)
        if self.state == PREPARING:
            self._update(m, req)
            m.awaiting_join = True
            self._maybe_complete_join(now)
            return m.member_id, None
        if self.state == COMPLETING and same:
            return m.member_id, self._join_body(m)  # it missed its answer: the same one again
        if self.state == STABLE and same and m.member_id != self.leader_id:
            return m.member_id, self._join_body(m)
        self._update(m, req)
        m.awaiting_join = True
        self._prepare(now, f"member {m.member_id} rejoined")
        self._maybe_complete_join(now)
        return m.member_id, None

    def _replace_static(self, req: JoinRequest, now: float) -> tuple[str, dict | None]:
        old = self.members[self.static[req.instance_id]]
        new_id = self.new_member_id(req.instance_id)
        same = old.protocols == list(req.protocols)
        self._fence(old.member_id, req.instance_id)
        for kind, waiting in (("join", old.awaiting_join), ("sync", old.awaiting_sync)):
            if waiting:
                self.outbox.append((kind, old.member_id, self._error(
                    ErrorCode.FENCED_INSTANCE_ID, old.member_id,
                    f"a newer member with group.instance.id '{req.instance_id}' took its place")))
        del self.members[old.member_id]
        m = dataclasses.replace(old, member_id=new_id, client_id=req.client_id, client_host=req.client_host,
                                session_timeout_ms=req.session_timeout_ms,
                                rebalance_timeout_ms=self._rebalance_timeout(req), awaiting_join=False,
                                awaiting_sync=False, session_deadline=now + req.session_timeout_ms)
        self.members[new_id] = m
        self.static[req.instance_id] = new_id
        if self.leader_id == old.member_id:
            self.leader_id = new_id
        self.changed = True
        if self.state == STABLE and same:
            return new_id, self._join_body(m, skip_assignment=new_id == self.leader_id)
        self._update(m, req)
        m.awaiting_join = True
        if self.state != PREPARING:
            self._prepare(now, f"static member {req.instance_id} rejoined with other protocols")
        self._maybe_complete_join(now)
        return new_id, None

    def _fence(self, member_id: str, instance_id: str) -> None:
        self.fenced_ids[member_id] = instance_id
        while len(self.fenced_ids) > MAX_FENCED_IDS:
            del self.fenced_ids[next(iter(self.fenced_ids))]

    def _rebalance_timeout(self, req: JoinRequest) -> int:
        return req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0 else req.session_timeout_ms

    def _add(self, member_id: str, req: JoinRequest, now: float) -> None:
        m = ClassicMember(member_id, instance_id=req.instance_id, client_id=req.client_id,
                          client_host=req.client_host, session_timeout_ms=req.session_timeout_ms,
                          rebalance_timeout_ms=self._rebalance_timeout(req), protocol_type=req.protocol_type,
                          protocols=list(req.protocols), awaiting_join=True,
                          session_deadline=now + req.session_timeout_ms)
        if not self.members:
            self.protocol_type = req.protocol_type
        self.members[member_id] = m
        if req.instance_id is not None:
            self.static[req.instance_id] = member_id
        if self.leader_id is None:
            self.leader_id = member_id
        if self.state == PREPARING and self.initial_delay:  # a new member extends the initial delay
            self.join_deadline = min(now + self.config.initial_rebalance_delay_ms,
                                     self.join_started + self._max_rebalance_timeout())
        else:
            self._prepare(now, f"member {member_id} joined")
        self._maybe_complete_join(now)

    @staticmethod
    def _update(m: ClassicMember, req: JoinRequest) -> None:
        m.protocols = list(req.protocols)
        m.session_timeout_ms = req.session_timeout_ms
        m.rebalance_timeout_ms = req.rebalance_timeout_ms if req.rebalance_timeout_ms > 0 else req.session_timeout_ms
        m.client_id, m.client_host = req.client_id or m.client_id, req.client_host or m.client_host

    def _max_rebalance_timeout(self) -> int:
        most = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        return min(most, self.config.join_wait_cap_ms)

    def _prepare(self, now: float, why: str) -> None:
        """Start a rebalance (nothing to do if one is under way)."""
        if self.state == PREPARING:
            return
        if self.state == COMPLETING:  # the syncs of the abandoned generation rejoin
            for m in self.members.values():
                m.assignment = b""
                if m.awaiting_sync:
                    m.awaiting_sync = False
                    self.outbox.append(("sync", m.member_id, self._error(
                        ErrorCode.REBALANCE_IN_PROGRESS, m.member_id, f"the group is rebalancing ({why}); rejoin")))
        self.initial_delay = self.state == EMPTY
        self.state = PREPARING
        self.sync_deadline = None
        self.join_started = now
        if self.initial_delay:
            self.join_deadline = now + min(self.config.initial_rebalance_delay_ms, self._max_rebalance_timeout())
        else:
            self.join_deadline = now + self._max_rebalance_timeout()

    def _maybe_complete_join(self, now: float) -> None:
        if self.state != PREPARING:
            return
        everyone = all(m.awaiting_join for m in self.members.values()) and not self.pending
        due = self.join_deadline is not None and now >= self.join_deadline
        if due or (everyone and not self.initial_delay):
            self._complete_join(now)

    def _complete_join(self, now: float) -> None:
        for m in [m for m in self.members.values() if not m.awaiting_join and m.instance_id is None]:
            self._remove(m)  # did not rejoin in time
        self.generation_id += 1
        self.join_deadline = None
        self.initial_delay = False
        if not self.members:
            # the protocol type stays, as Kafka's: an Empty group that had consumers is listed as a
            # consumer group, not a simple one (ListGroups' protocol_type)
            self.state, self.protocol_name, self.leader_id = EMPTY, None, None
            self.changed = True
            return
        if self.leader_id not in self.members or not self.members[self.leader_id].awaiting_join:
            joined = [mid for mid, m in self.members.items() if m.awaiting_join]
            self.leader_id = joined[0] if joined else next(iter(self.members))
        self.protocol_name = self._select_protocol()
        self.state = COMPLETING
        self.sync_deadline = now + self._max_rebalance_timeout()
        for m in self.members.values():
            m.assignment = b""
            m.session_deadline = now + m.session_timeout_ms
            if m.awaiting_join:
                m.awaiting_join = False
                self.outbox.append(("join", m.member_id, self._join_body(m)))

    def _select_protocol(self) -> str:
        candidates = self._candidates()
        votes: dict[str, int] = {}
        order: list[str] = []
        for m in self.members.values():
            vote = next(n for n, _ in m.protocols if n in candidates)
            votes[vote] = votes.get(vote, 0) + 1
            if vote not in order:
                order.append(vote)
        return max(order, key=lambda n: votes[n])  # ties: the first voted for

    def _join_body(self, m: ClassicMember, skip_assignment: bool = False) -> dict:
        leader = m.member_id == self.leader_id
        members = [{"member_id": x.member_id, "group_instance_id": x.instance_id,
                    "metadata": x.metadata(self.protocol_name)} for x in self.members.values()] if leader else []
        return {"error_code": 0, "generation_id": self.generation_id, "protocol_type": self.protocol_type,
                "protocol_name": self.protocol_name, "leader": self.leader_id, "skip_assignment": skip_assignment,
                "member_id": m.member_id, "members": members}

    def _error(self, code: ErrorCode, member_id: str = "", message: str = "") -> dict:
        return {"error_code": int(code), "error_message": message or code.meaning, "generation_id": -1,
                "member_id": member_id, "leader": "", "members": []}

    def _inconsistent(self, req: JoinRequest) -> GroupError:
        offered = ", ".join(n for n, _ in req.protocols) or "none"
        if req.protocol_type != self.protocol_type and self.members:
            why = f"protocol type {req.protocol_type!r} differs from the group's {self.protocol_type!r}"
        else:
            why = f"none of its protocols ({offered}) is supported by every member " \
                  f"({', '.join(sorted(self._candidates())) or 'none'})"
        return GroupError(f"group '{self.group_id}': {why}", ErrorCode.INCONSISTENT_GROUP_PROTOCOL)

    def _member(self, member_id: str, instance_id: str | None) -> ClassicMember:
        """The member, or why it is not one (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID)."""
        if member_id in self.fenced_ids or (instance_id is not None and instance_id in self.static
                                            and self.static[instance_id] != member_id):
            raise GroupError(f"member {member_id} was replaced by a newer member with group.instance.id "
                             f"'{instance_id or self.fenced_ids.get(member_id)}'", ErrorCode.FENCED_INSTANCE_ID)
        m = self.members.get(member_id)
        if m is None:
            raise GroupError(f"member {member_id!r} is not in group '{self.group_id}' (it left, timed out or "
                             f"never joined): join again", ErrorCode.UNKNOWN_MEMBER_ID)
        return m

    # ---- SyncGroup --------------------------------------------------------------------------
    def sync(self, member_id: str, generation_id: int, instance_id: str | None, assignments: dict | None,
             now: float, protocol_type: str | None = None, protocol_name: str | None = None) -> dict | None:
        """Apply a SyncGroup: the body if answered now, None if held (outbox, after the
        group's record is stored: ``changed``)."""
        if self.state == DEAD:
            raise GroupError(f"group '{self.group_id}' was deleted; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        m = self._member(member_id, instance_id)
        if generation_id != self.generation_id:
            raise GroupError(f"generation {generation_id} is not the group's ({self.generation_id}): rejoin",
                             ErrorCode.ILLEGAL_GENERATION)
        if (protocol_type and protocol_type != self.protocol_type) or \
                (protocol_name and protocol_name != self.protocol_name):
            raise GroupError(f"protocol {protocol_type}/{protocol_name} is not the group's "
                             f"{self.protocol_type}/{self.protocol_name}", ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        m.session_deadline = now + m.session_timeout_ms
        if self.state == PREPARING:
            raise GroupError(f"group '{self.group_id}' is rebalancing: rejoin", ErrorCode.REBALANCE_IN_PROGRESS)
        if self.state == STABLE:
            return self._sync_body(m)
        if self.state != COMPLETING:
            raise GroupError(f"group '{self.group_id}' is {self.state}", ErrorCode.UNKNOWN_MEMBER_ID)
        m.awaiting_sync = True
        if member_id == self.leader_id and assignments is not None:
            for x in self.members.values():
                x.assignment = assignments.get(x.member_id, b"")
            self.state = STABLE
            self.sync_deadline = None
            self.changed = True
            for x in self.members.values():
                if x.awaiting_sync:
                    x.awaiting_sync = False
                    self.outbox.append(("sync", x.member_id, self._sync_body(x)))
        return None

    def _sync_body(self, m: ClassicMember) -> dict:
        return {"error_code": 0, "protocol_type": self.protocol_type, "protocol_name": self.protocol_name,
                "assignment": m.assignment}

    # ---- Heartbeat, LeaveGroup, expiry --------------------------------------------------------
    def heartbeat(self, member_id: str, generation_id: int, instance_id: str | None, now: float) -> None:
        """Raise what the member must do (rebalance, rejoin, stop); return if all is well."""
        if self.state == DEAD:
            raise GroupError(f"group '{self.group_id}' was deleted; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if self.state == EMPTY:
            raise GroupError(f"group '{self.group_id}' has no members: join again", ErrorCode.UNKNOWN_MEMBER_ID)
        m = self._member(member_id, instance_id)
        if generation_id != self.generation_id:
            raise GroupError(f"generation {generation_id} is not the group's ({self.generation_id}): rejoin",
                             ErrorCode.ILLEGAL_GENERATION)
        m.session_deadline = now + m.session_timeout_ms
        if self.state == PREPARING:
            raise GroupError(f"group '{self.group_id}' is rebalancing: rejoin", ErrorCode.REBALANCE_IN_PROGRESS)

    def leave(self, member_id: str, instance_id: str | None, now: float) -> str:
        """Remove one member (by member id, or by instance id if the member id is empty);
        returns its member id."""
        if not member_id and instance_id is not None:
            member_id = self.static.get(instance_id, "")
            if not member_id:
                raise GroupError(f"no member has group.instance.id '{instance_id}'", ErrorCode.UNKNOWN_MEMBER_ID)
        if member_id in self.pending:
            del self.pending[member_id]
            self._maybe_complete_join(now)
            return member_id
        m = self._member(member_id, instance_id)
        self._remove(m)
        self._membership_changed(now, f"member {member_id} left")
        return member_id

    def _membership_changed(self, now: float, why: str) -> None:
        if self.state in (STABLE, COMPLETING):
            self._prepare(now, why)
        elif self.state == EMPTY:
            return
        self._maybe_complete_join(now)

    def _remove(self, m: ClassicMember) -> None:
        del self.members[m.member_id]
        if m.instance_id is not None and self.static.get(m.instance_id) == m.member_id:
            del self.static[m.instance_id]
        for kind, waiting in (("join", m.awaiting_join), ("sync", m.awaiting_sync)):
            if waiting:
                self.outbox.append((kind, m.member_id, self._error(
                    ErrorCode.UNKNOWN_MEMBER_ID, m.member_id, f"member {m.member_id} was removed from the group")))
        m.awaiting_join = m.awaiting_sync = False
        if self.leader_id == m.member_id:
            self.leader_id = next(iter(self.members), None)

    def next_deadline(self) -> float | None:
        times = [m.session_deadline for m in self.members.values()] + list(self.pending.values())
        times += [t for t in (self.join_deadline, self.sync_deadline) if t is not None]
        return min(times, default=None)

    def expire(self, now: float) -> list[tuple[str, str]]:
        """Apply every deadline that passed: ``[(member_id, why)]`` removed."""
        out = []
        for mid, deadline in list(self.pending.items()):
            if deadline <= now:
                del self.pending[mid]
        for m in list(self.members.values()):
            if m.session_deadline <= now and not m.awaiting_join and not m.awaiting_sync:
                self._remove(m)
                out.append((m.member_id, f"no heartbeat within its session timeout ({m.session_timeout_ms} ms)"))
        if self.state == COMPLETING and self.sync_deadline is not None and now >= self.sync_deadline:
            for m in [m for m in self.members.values() if not m.awaiting_sync]:
                self._remove(m)
                out.append((m.member_id, "no SyncGroup within the rebalance timeout"))
            self.sync_deadline = None
            if self.state == COMPLETING:
                self._prepare(now, "members did not sync")
        elif out:
            self._membership_changed(now, out[0][1])
        self._maybe_complete_join(now)
        return out

    # ---- offsets --------------------------------------------------------------------------------
    def check_commit(self, member_id: str, generation_id: int, instance_id: str | None) -> None:
        """Raise if this commit must be refused (Kafka's classic rules)."""
        if self.state == DEAD:
            raise GroupError(f"group '{self.group_id}' was deleted; retry", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if generation_id < 0 and not member_id:
            if self.state == EMPTY:
                return
            raise GroupError(f"group '{self.group_id}' has members: a commit must name a member and its "
                             f"generation", ErrorCode.UNKNOWN_MEMBER_ID)
        m = self._member(member_id, instance_id)
        if generation_id != self.generation_id:
            raise GroupError(f"generation {generation_id} of member {m.member_id} is not the group's "
                             f"({self.generation_id}): commit refused, rejoin", ErrorCode.ILLEGAL_GENERATION)
        if self.state == COMPLETING:
            raise GroupError(f"group '{self.group_id}' is completing a rebalance: commit after the SyncGroup",
                             ErrorCode.REBALANCE_IN_PROGRESS)

    # ---- description and persistence --------------------------------------------------------
    def describe(self) -> dict:
        return {"group_id": self.group_id, "group_state": self.state, "protocol_type": self.protocol_type or "",
                "protocol_data": self.protocol_name or "", "generation_id": self.generation_id,
                "leader": self.leader_id or "",
                "members": [{"member_id": m.member_id, "group_instance_id": m.instance_id, "client_id": m.client_id,
                             "client_host": m.client_host, "member_metadata": m.metadata(self.protocol_name or ""),
                             "member_assignment": m.assignment} for m in self.members.values()]}

    def to_record(self) -> dict:
        """What Kafka's GroupMetadata record holds: enough to resume after a coordinator move."""
        return {"generation_id": self.generation_id, "protocol_type": self.protocol_type,
                "protocol_name": self.protocol_name, "leader": self.leader_id,
                "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
                             "client_host": m.client_host, "session_timeout_ms": m.session_timeout_ms,
                             "rebalance_timeout_ms": m.rebalance_timeout_ms,
                             "protocols": [[n, meta] for n, meta in m.protocols], "assignment": m.assignment}
                            for m in self.members.values()] if self.state == STABLE else []}

    @classmethod
    def from_record(cls, group_id: str, rec: dict, now: float, config: ClassicConfig | None = None) -> "ClassicGroup":
        """Resume: Stable with the stored generation if it had members (each gets a fresh
        session: the coordinator was away), else Empty."""
        g = cls(group_id, config)
        g.generation_id = rec.get("generation_id", 0)
        for d in rec.get("members") or ():
            m = ClassicMember(d["member_id"], instance_id=d.get("instance_id"), client_id=d.get("client_id", ""),
                              client_host=d.get("client_host", ""), session_timeout_ms=d["session_timeout_ms"],
                              rebalance_timeout_ms=d["rebalance_timeout_ms"],
                              protocol_type=rec.get("protocol_type") or PROTOCOL_TYPE,
                              protocols=[(n, bytes(meta)) for n, meta in d.get("protocols") or ()],
                              assignment=bytes(d.get("assignment") or b""),
                              session_deadline=now + d["session_timeout_ms"])
            g.members[m.member_id] = m
            if m.instance_id is not None:
                g.static[m.instance_id] = m.member_id
        g.protocol_type = rec.get("protocol_type")
        if g.members:
            g.state = STABLE
            g.protocol_name, g.leader_id = rec.get("protocol_name"), rec.get("leader")
        return g
