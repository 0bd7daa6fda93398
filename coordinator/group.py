"""The consumer-group state machine (KIP-848 style): pure, no I/O, time passed in as ``now``.

Single owner: the group coordinator's ``GroupTable`` (``coordinator.group_table``) holds
every ``ConsumerGroup``; only the coordinator's parts call it (the tests, with a fake clock).

Protocol, in the manner of Kafka's new consumer protocol:

* Members heartbeat their subscription and the partitions they own. ``member_epoch`` 0
  joins, -1 leaves, -2 leaves *temporarily* (static members: the assignment is kept for
  the session timeout); any other value must be the member's current epoch (or the
  previous one, if the member owns nothing it should not: a lost response).
* The **group epoch** moves whenever the membership, a subscription, or the partition
  count of a subscribed topic changes; the assignor then computes the **target
  assignment** at that epoch (``assignment_epoch``).
* Each member is **reconciled** towards its target on its own heartbeats, incrementally:

    ==========================  ===============================================================
    member state                meaning / transition
    ==========================  ===============================================================
    ``stable``                  owns exactly its target at the target epoch
    ``unrevoked_partitions``    told to give up ``pending_revocation``; its epoch stays; it
                                gets nothing new until a heartbeat no longer lists them, and
                                is removed if that takes longer than its rebalance timeout
                                (the client's ``max.poll.interval.ms``)
    ``unreleased_partitions``   at the target epoch, but waiting for partitions another member
                                has not revoked yet; it gets each as soon as it is free
    ==========================  ===============================================================

  A partition is therefore never assigned to two members at once: it is given to its new
  owner only after its old owner reported it released (or was removed). Members whose
  target did not change are never asked to stop anything.
* A member that sends no heartbeat for its session timeout is removed and its partitions
  go to the others. A static member (``instance_id``) that rejoins with epoch 0 replaces
  its previous incarnation, inheriting its assignment without moving anything; the old
  member id is fenced (``FENCED_INSTANCE_ID``).
* Commits are fenced per partition: a commit by member M with epoch E for partition P is
  accepted only if M owns P now and has owned it since an epoch <= E <= M's epoch.

Group states: ``empty`` (no members), ``reconciling`` (some member is not at the target
epoch, or not stable), ``stable``, ``dead`` (deleted).

Errors raise ``GroupError`` (an ``OdradekError``) whose message says whose fault it is.
"""
from __future__ import annotations

import dataclasses
import functools
import uuid
from typing import Callable, Iterable

import re2

from odradek.coordinator import assignors
from odradek.core.protocol import ErrorCode, OdradekError, is_internal_topic

TP = tuple[str, int]

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

STABLE = "stable"
UNREVOKED = "unrevoked_partitions"
UNRELEASED = "unreleased_partitions"

EMPTY, RECONCILING, STABLE_GROUP, DEAD = "empty", "reconciling", "stable", "dead"
MAX_FENCED_IDS = 1000  # replaced static member ids remembered, to answer them FENCED_INSTANCE_ID


# RE2 (google-re2) matches in time linear in the topic name, whatever the pattern: with
# Python's backtracking `re`, a member subscribing to "(a+)+" froze the coordinator on a topic
# "a"*40 + "X" (issue 16, defect 8). Kafka uses RE2/J for KIP-848 subscriptions too, so
# patterns mean the same (no backreferences or lookarounds).
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a member's bad pattern is its error (INVALID_REQUEST), not a broker log line


@functools.lru_cache(maxsize=1024)
def subscription_regex(pattern: str):
    """The compiled subscription pattern (cached: every member's pattern is matched against
    every topic at each assignment); raises ``re2.error`` if it does not compile."""
    return re2.compile(pattern, options=_RE2_OPTIONS)


class GroupError(OdradekError):
    pass


@dataclasses.dataclass
class GroupConfig:
    """The broker's group settings (``group.consumer.*``), in milliseconds."""

    session_timeout_ms: int = 45000
    min_session_timeout_ms: int = 1000
    max_session_timeout_ms: int = 600000
    heartbeat_interval_ms: int = 3000
    max_size: int = 1000
    assignors: tuple[str, ...] = ("uniform", "range")

    @property
    def default_assignor(self) -> str:
        return self.assignors[0]


@dataclasses.dataclass
class HeartbeatRequest:
    """A ConsumerGroupHeartbeat body, parsed. ``None`` fields mean "unchanged"."""

    member_id: str = ""
    member_epoch: int = 0
    instance_id: str | None = None
    rebalance_timeout_ms: int | None = None
    session_timeout_ms: int | None = None
    subscribed_topic_names: list | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    owned: list | None = None  # [(topic, partition)]
    client_id: str = ""
    client_host: str = ""


@dataclasses.dataclass
class Member:
    member_id: str
    instance_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: str = STABLE
    subscribed_topic_names: frozenset = frozenset()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    rebalance_timeout_ms: int = 300000
    session_timeout_ms: int = 45000
    assigned: dict = dataclasses.field(default_factory=dict)  # TP -> epoch it was assigned at
    pending_revocation: dict = dataclasses.field(default_factory=dict)  # TP -> epoch assigned at
    session_deadline: float = 0.0
    revocation_deadline: float | None = None
    left_static: bool = False  # a static member that left with epoch -2

    def subscribes(self, topic: str) -> bool:
        if topic in self.subscribed_topic_names:
            return True
        if self.subscribed_topic_regex and not is_internal_topic(topic):
            return subscription_regex(self.subscribed_topic_regex).fullmatch(topic) is not None
        return False

    def owned(self) -> set:
        return set(self.assigned) | set(self.pending_revocation)


class ConsumerGroup:
    """One group's membership, target assignment and reconciliation. See the module doc."""

    def __init__(self, group_id: str, config: GroupConfig | None = None,
                 new_member_id: Callable[[], str] = lambda: uuid.uuid4().hex):
        self.group_id = group_id
        self.config = config or GroupConfig()
        self.new_member_id = new_member_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.members: dict[str, Member] = {}
        self.static: dict[str, str] = {}  # instance id -> member id
        self.target: dict[str, set] = {}  # member id -> partitions, at assignment_epoch
        self.owners: dict[TP, str] = {}  # partition -> member that owns it (assigned or revoking)
        self.fenced_ids: dict[str, str] = {}  # replaced member id -> its instance id
        self.subscribed_sig: tuple = ()
        self.assignor_name = self.config.default_assignor
        self.deleted = False
        self.changed = False  # set by every durable change; the coordinator clears it

    # ---- reads --------------------------------------------------------------------------
    @property
    def state(self) -> str:
        if self.deleted:
            return DEAD
        if not self.members:
            return EMPTY
        for m in self.members.values():
            if m.state != STABLE or m.member_epoch != self.assignment_epoch:
                return RECONCILING
        return STABLE_GROUP

    def subscribed_topics(self, topics: dict[str, int]) -> dict[str, int]:
        """Existing topics some member subscribes to, with their partition counts."""
        out = {}
        for t, n in topics.items():
            if any(m.subscribes(t) for m in self.members.values()):
                out[t] = n
        return out

    # ---- the heartbeat --------------------------------------------------------------------
    def heartbeat(self, req: HeartbeatRequest, now: float, topics: dict[str, int]) -> dict:
        """Apply one ConsumerGroupHeartbeat; return the response body (without error).
        A bad request raises before anything changes."""
        self._validate(req)
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req, now, topics)
        if req.member_epoch == JOIN_EPOCH:
            member = self._join(req, now)
        else:
            member = self._known(req)
            self._check_epoch(member, req)
        self._update(member, req, now)
        self.maybe_rebalance(topics)
        owned = None if req.owned is None else {(t, p) for t, p in req.owned}
        self._reconcile(member, now, owned)
        return self.response(member)

    def _validate(self, req: HeartbeatRequest) -> None:
        if req.session_timeout_ms is not None:
            lo, hi = self.config.min_session_timeout_ms, self.config.max_session_timeout_ms
            if not lo <= req.session_timeout_ms <= hi:
                raise GroupError(f"session_timeout_ms {req.session_timeout_ms} is outside [{lo}, {hi}] "
                                 f"(group.consumer.min/max.session.timeout.ms)", ErrorCode.INVALID_SESSION_TIMEOUT)
        if req.rebalance_timeout_ms is not None and req.rebalance_timeout_ms < 1:
            raise GroupError(f"rebalance_timeout_ms must be >= 1, got {req.rebalance_timeout_ms}",
                             ErrorCode.INVALID_REQUEST)
        if req.server_assignor is not None and req.server_assignor not in self.config.assignors:
            raise GroupError(f"assignor {req.server_assignor!r} is not one of "
                             f"{', '.join(self.config.assignors)}", ErrorCode.UNSUPPORTED_ASSIGNOR)
        if req.subscribed_topic_regex:
            try:
                subscription_regex(req.subscribed_topic_regex)
            except re2.error as exc:
                raise GroupError(f"subscribed_topic_regex {req.subscribed_topic_regex!r} does not compile: {exc}",
                                 ErrorCode.INVALID_REQUEST) from None
        if req.member_epoch == JOIN_EPOCH and not req.subscribed_topic_names and not req.subscribed_topic_regex:
            raise GroupError("a joining member must subscribe to topic names or a regex (client error)",
                             ErrorCode.INVALID_REQUEST)
        if req.member_epoch < STATIC_LEAVE_EPOCH:
            raise GroupError(f"member_epoch {req.member_epoch} is invalid (-2, -1, 0 or a member's epoch)",
                             ErrorCode.INVALID_REQUEST)

    def response(self, m: Member) -> dict:
        interval = self.config.heartbeat_interval_ms
        return {"member_id": m.member_id, "member_epoch": m.member_epoch,
                "heartbeat_interval_ms": interval,
                "assignment": _tp_list(m.assigned), "state": m.state}

    def refresh(self, member_id: str, now: float) -> dict | None:
        """Re-reconcile a member between its heartbeats (the coordinator answers a parked
        heartbeat with this when the group changed). None if the member is gone."""
        m = self.members.get(member_id)
        if m is None:
            return None
        self._reconcile(m, now, None)
        return self.response(m)

    def _join(self, req: HeartbeatRequest, now: float) -> Member:
        if req.instance_id is not None and req.instance_id in self.static:
            return self._replace_static(req)
        if req.member_id and req.member_id in self.members:
            # A fenced member rejoining: it abandoned its partitions; start it afresh.
            self._remove(self.members[req.member_id])
        if len(self.members) >= self.config.max_size:
            raise GroupError(f"group '{self.group_id}' has {len(self.members)} members, the most "
                             f"group.max.size allows", ErrorCode.GROUP_MAX_SIZE_REACHED)
        member = Member(req.member_id or self.new_member_id(), instance_id=req.instance_id)
        self.members[member.member_id] = member
        if req.instance_id is not None:
            self.static[req.instance_id] = member.member_id
        self.changed = True  # the epoch moves in _update, with the new subscription
        return member

    def _replace_static(self, req: HeartbeatRequest) -> Member:
        """A static member's new incarnation takes over the old one's assignment as is."""
        old = self.members.pop(self.static[req.instance_id])
        new = dataclasses.replace(old, member_id=self.new_member_id(), left_static=False,
                                  assigned=dict(old.assigned), pending_revocation={})
        # The new process owns nothing yet; what the old one was revoking is released.
        for tp in old.pending_revocation:
            self.owners.pop(tp, None)
        for tp in new.assigned:
            self.owners[tp] = new.member_id
        self.members[new.member_id] = new
        self.static[req.instance_id] = new.member_id
        if old.member_id in self.target:
            self.target[new.member_id] = self.target.pop(old.member_id)
        self.fenced_ids[old.member_id] = req.instance_id
        while len(self.fenced_ids) > MAX_FENCED_IDS:
            self.fenced_ids.pop(next(iter(self.fenced_ids)))
        new.state = UNRELEASED if old.state == UNREVOKED else old.state
        new.revocation_deadline = None
        self.changed = True
        return new

    def _known(self, req: HeartbeatRequest) -> Member:
        member = self.members.get(req.member_id)
        if member is None:
            if req.member_id in self.fenced_ids:
                raise GroupError(f"member {req.member_id} was replaced by a newer incarnation of static "
                                 f"member '{self.fenced_ids[req.member_id]}'", ErrorCode.FENCED_INSTANCE_ID)
            raise GroupError(f"member {req.member_id!r} is not in group '{self.group_id}' (it left, timed out "
                             f"or the group was deleted); rejoin with epoch 0", ErrorCode.UNKNOWN_MEMBER_ID)
        if member.left_static:
            raise GroupError(f"static member '{member.instance_id}' left; rejoin with epoch 0",
                             ErrorCode.UNKNOWN_MEMBER_ID)
        return member

    def _check_epoch(self, m: Member, req: HeartbeatRequest) -> None:
        owned = None if req.owned is None else {(t, p) for t, p in req.owned}
        if req.member_epoch == m.member_epoch:
            if owned is not None and not owned <= m.owned():
                raise GroupError(f"member {m.member_id} claims partitions it was not given "
                                 f"({_fmt(owned - m.owned())}); it must give up all and rejoin",
                                 ErrorCode.FENCED_MEMBER_EPOCH)
            return
        if req.member_epoch == m.previous_member_epoch and owned is not None and owned <= set(m.assigned):
            return  # our last answer was lost; the member is behind but owns nothing wrong
        raise GroupError(f"member {m.member_id} sent epoch {req.member_epoch}, its epoch is {m.member_epoch}: "
                         f"it must give up its partitions and rejoin", ErrorCode.FENCED_MEMBER_EPOCH)

    def _update(self, m: Member, req: HeartbeatRequest, now: float) -> None:
        if req.session_timeout_ms is not None:
            m.session_timeout_ms = req.session_timeout_ms
        elif m.member_epoch == 0 and not m.assigned:
            m.session_timeout_ms = self.config.session_timeout_ms
        if req.rebalance_timeout_ms is not None:
            m.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.server_assignor is not None:
            m.server_assignor = req.server_assignor
        m.client_id = req.client_id or m.client_id
        m.client_host = req.client_host or m.client_host
        if req.subscribed_topic_names is not None:
            names = frozenset(req.subscribed_topic_names)
            if names != m.subscribed_topic_names:
                m.subscribed_topic_names = names
                self.group_epoch += 1
                self.changed = True
        if req.subscribed_topic_regex is not None:
            regex = req.subscribed_topic_regex or None
            if regex != m.subscribed_topic_regex:
                m.subscribed_topic_regex = regex
                self.group_epoch += 1
                self.changed = True
        m.session_deadline = now + m.session_timeout_ms

    def _leave(self, req: HeartbeatRequest, now: float, topics: dict[str, int]) -> dict:
        m = self.members.get(req.member_id)
        if m is None and req.instance_id is not None and req.instance_id in self.static:
            m = self.members.get(self.static[req.instance_id])
        if m is None:
            raise GroupError(f"member {req.member_id!r} is not in group '{self.group_id}'",
                             ErrorCode.UNKNOWN_MEMBER_ID)
        if req.member_epoch == STATIC_LEAVE_EPOCH:
            if m.instance_id is None:
                raise GroupError("epoch -2 (temporary leave) is for static members: set group_instance_id",
                                 ErrorCode.INVALID_REQUEST)
            # Keep its assignment for a session timeout: a restart in time gets it back.
            m.left_static = True
            m.session_deadline = now + m.session_timeout_ms
            self.changed = True
        else:
            self._remove(m)
            self.maybe_rebalance(topics)
        return {"member_id": m.member_id, "member_epoch": req.member_epoch,
                "heartbeat_interval_ms": 0, "assignment": None, "state": "left"}

    # ---- time -----------------------------------------------------------------------------
    def expire(self, now: float, topics: dict[str, int]) -> list[tuple[str, str]]:
        """Remove members whose session ran out, or that did not revoke within their
        rebalance timeout. Returns ``[(member_id, why)]``."""
        gone = []
        for m in list(self.members.values()):
            if now >= m.session_deadline:
                gone.append((m.member_id, f"no heartbeat for {m.session_timeout_ms} ms (session timeout)"))
            elif m.revocation_deadline is not None and now >= m.revocation_deadline:
                gone.append((m.member_id, f"did not revoke {_fmt(m.pending_revocation)} within "
                                          f"{m.rebalance_timeout_ms} ms (rebalance timeout)"))
            else:
                continue
            self._remove(m)
        if gone:
            self.maybe_rebalance(topics)
        return gone

    def next_deadline(self) -> float | None:
        times = [m.session_deadline for m in self.members.values()]
        times += [m.revocation_deadline for m in self.members.values() if m.revocation_deadline is not None]
        return min(times) if times else None

    # ---- membership changes ------------------------------------------------------------------
    def _remove(self, m: Member) -> None:
        self.members.pop(m.member_id, None)
        if m.instance_id is not None and self.static.get(m.instance_id) == m.member_id:
            del self.static[m.instance_id]
        for tp in m.owned():
            if self.owners.get(tp) == m.member_id:
                del self.owners[tp]
        self.target.pop(m.member_id, None)
        self.group_epoch += 1
        self.changed = True

    def remove_member(self, member_id: str, topics: dict[str, int]) -> None:
        """Administrative removal (LeaveGroup from a tool)."""
        m = self.members.get(member_id)
        if m is None:
            raise GroupError(f"member {member_id!r} is not in group '{self.group_id}'", ErrorCode.UNKNOWN_MEMBER_ID)
        self._remove(m)
        self.maybe_rebalance(topics)

    def maybe_rebalance(self, topics: dict[str, int]) -> bool:
        """Bump the epoch if a subscribed topic appeared, vanished or grew; recompute the
        target if the epoch moved. True if a new target was computed."""
        sig = tuple(sorted(self.subscribed_topics(topics).items()))
        if sig != self.subscribed_sig:
            self.subscribed_sig = sig
            if self.members and self.group_epoch == self.assignment_epoch:  # else it moved already
                self.group_epoch += 1
                self.changed = True
        if self.group_epoch == self.assignment_epoch:
            return False
        subs = {m.member_id: frozenset(t for t, _ in sig if m.subscribes(t)) for m in self.members.values()}
        self.assignor_name = self._pick_assignor()
        assign = assignors.ASSIGNORS[self.assignor_name]
        self.target = assign(subs, dict(sig), self.target)
        self.assignment_epoch = self.group_epoch
        self.changed = True
        return True

    def _pick_assignor(self) -> str:
        wanted = [m.server_assignor for m in self.members.values() if m.server_assignor]
        if not wanted:
            return self.config.default_assignor
        return max(sorted(set(wanted)), key=wanted.count)

    # ---- reconciliation (one member towards its target) ----------------------------------------
    def _reconcile(self, m: Member, now: float, owned: set | None) -> None:
        before = (m.member_epoch, m.state, dict(m.assigned), dict(m.pending_revocation))
        if owned is not None and m.pending_revocation:
            for tp in [tp for tp in m.pending_revocation if tp not in owned]:
                del m.pending_revocation[tp]  # released by the member
                if self.owners.get(tp) == m.member_id:
                    del self.owners[tp]
        if m.pending_revocation:
            m.state = UNREVOKED
        elif m.state == STABLE and m.member_epoch == self.assignment_epoch:
            pass
        else:
            self._next_assignment(m, now)
        if m.state != UNREVOKED:
            m.revocation_deadline = None
        if before != (m.member_epoch, m.state, m.assigned, m.pending_revocation):
            self.changed = True

    def _next_assignment(self, m: Member, now: float) -> None:
        target = self.target.get(m.member_id, set())
        revoke = [tp for tp in m.assigned if tp not in target]
        if revoke:
            # Revocation first: the member keeps its epoch and gets nothing new until it
            # reports these released.
            for tp in revoke:
                m.pending_revocation[tp] = m.assigned.pop(tp)
            m.state = UNREVOKED
            m.revocation_deadline = now + m.rebalance_timeout_ms
            return
        new_epoch = self.assignment_epoch
        unreleased = False
        for tp in sorted(target):
            if tp in m.assigned:
                continue
            owner = self.owners.get(tp)
            if owner is None or owner == m.member_id:
                m.assigned[tp] = new_epoch
                self.owners[tp] = m.member_id
            else:
                unreleased = True
        if m.member_epoch != new_epoch:
            m.previous_member_epoch = m.member_epoch
            m.member_epoch = new_epoch
        m.state = UNRELEASED if unreleased else STABLE

    # ---- commits ----------------------------------------------------------------------------
    def check_commit(self, member_id: str, member_epoch: int, tps: Iterable[TP]) -> dict[TP, GroupError]:
        """Validate a commit. Raises for a request-level problem (unknown member, stale epoch,
        a simple commit to an active group); returns per-partition problems (not owned)."""
        if member_epoch < 0 and not member_id:
            if self.members:
                raise GroupError(f"group '{self.group_id}' has {len(self.members)} active members: only they "
                                 f"may commit (with their member id and epoch)", ErrorCode.UNKNOWN_MEMBER_ID)
            return {}
        m = self.members.get(member_id)
        if m is None:
            if member_id in self.fenced_ids:
                raise GroupError(f"member {member_id} was replaced by a newer incarnation of static member "
                                 f"'{self.fenced_ids[member_id]}': commit refused", ErrorCode.FENCED_INSTANCE_ID)
            raise GroupError(f"member {member_id!r} is not in group '{self.group_id}' (it left or timed out): "
                             f"commit refused", ErrorCode.UNKNOWN_MEMBER_ID)
        if member_epoch > m.member_epoch:
            raise GroupError(f"member {member_id} committed with epoch {member_epoch}, newer than its epoch "
                             f"{m.member_epoch}", ErrorCode.STALE_MEMBER_EPOCH)
        problems = {}
        for tp in tps:
            since = m.assigned.get(tp, m.pending_revocation.get(tp))
            if since is None:
                problems[tp] = GroupError(f"{tp[0]}-{tp[1]} is not assigned to member {member_id} "
                                          f"(epoch {m.member_epoch}): commit refused", ErrorCode.STALE_MEMBER_EPOCH)
            elif member_epoch < since:
                problems[tp] = GroupError(f"{tp[0]}-{tp[1]} was assigned to member {member_id} at epoch {since}; "
                                          f"a commit with epoch {member_epoch} is stale", ErrorCode.STALE_MEMBER_EPOCH)
        return problems

    # ---- description and persistence ----------------------------------------------------------
    def describe(self) -> dict:
        return {"group_id": self.group_id, "group_state": self.state, "group_epoch": self.group_epoch,
                "assignment_epoch": self.assignment_epoch, "assignor_name": self.assignor_name,
                "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
                             "client_host": m.client_host, "member_epoch": m.member_epoch, "state": m.state,
                             "subscribed_topic_names": sorted(m.subscribed_topic_names),
                             "subscribed_topic_regex": m.subscribed_topic_regex,
                             "assignment": _tp_list(m.assigned),
                             "pending_revocation": _tp_list(m.pending_revocation),
                             "target_assignment": _tp_list(self.target.get(m.member_id, ())),
                             "left": m.left_static}
                            for m in self.members.values()]}

    def to_record(self) -> dict:
        """Everything needed to resume after a coordinator restart (msgpack-able)."""
        return {"group_epoch": self.group_epoch, "assignment_epoch": self.assignment_epoch,
                "assignor": self.assignor_name, "sig": [list(x) for x in self.subscribed_sig],
                "target": {k: _tp_list(v) for k, v in self.target.items()},
                "members": [{"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
                             "client_host": m.client_host, "member_epoch": m.member_epoch,
                             "previous_member_epoch": m.previous_member_epoch, "state": m.state,
                             "topics": sorted(m.subscribed_topic_names), "regex": m.subscribed_topic_regex,
                             "assignor": m.server_assignor, "rebalance_timeout_ms": m.rebalance_timeout_ms,
                             "session_timeout_ms": m.session_timeout_ms, "left_static": m.left_static,
                             "assigned": [[t, p, e] for (t, p), e in m.assigned.items()],
                             "pending": [[t, p, e] for (t, p), e in m.pending_revocation.items()]}
                            for m in self.members.values()]}

    @classmethod
    def from_record(cls, group_id: str, rec: dict, now: float, config: GroupConfig | None = None,
                    new_member_id: Callable[[], str] = lambda: uuid.uuid4().hex) -> "ConsumerGroup":
        """Resume a group; every member gets a fresh session (the coordinator was away)."""
        g = cls(group_id, config, new_member_id)
        g.group_epoch, g.assignment_epoch = rec["group_epoch"], rec["assignment_epoch"]
        g.assignor_name = rec.get("assignor") or g.config.default_assignor
        g.subscribed_sig = tuple((t, n) for t, n in rec.get("sig") or ())
        g.target = {k: tps_of(v) for k, v in (rec.get("target") or {}).items()}
        for d in rec.get("members") or ():
            m = Member(d["member_id"], instance_id=d.get("instance_id"), client_id=d.get("client_id", ""),
                       client_host=d.get("client_host", ""), member_epoch=d["member_epoch"],
                       previous_member_epoch=d.get("previous_member_epoch", -1), state=d.get("state", STABLE),
                       subscribed_topic_names=frozenset(d.get("topics") or ()),
                       subscribed_topic_regex=d.get("regex"), server_assignor=d.get("assignor"),
                       rebalance_timeout_ms=d.get("rebalance_timeout_ms", 300000),
                       session_timeout_ms=d.get("session_timeout_ms", g.config.session_timeout_ms),
                       left_static=d.get("left_static", False),
                       assigned={(t, p): e for t, p, e in d.get("assigned") or ()},
                       pending_revocation={(t, p): e for t, p, e in d.get("pending") or ()})
            m.session_deadline = now + m.session_timeout_ms
            if m.pending_revocation:
                m.revocation_deadline = now + m.rebalance_timeout_ms
            g.members[m.member_id] = m
            if m.instance_id is not None:
                g.static[m.instance_id] = m.member_id
            for tp in m.owned():
                g.owners[tp] = m.member_id
        return g


def _tp_list(tps) -> list:
    """``[(t, p), ...]`` -> ``[{"topic": t, "partitions": [p, ...]}, ...]`` sorted."""
    by_topic: dict[str, list] = {}
    for t, p in sorted(tps):
        by_topic.setdefault(t, []).append(p)
    return [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]


def tps_of(entries) -> set:
    """The inverse of ``_tp_list``."""
    return {(e["topic"], p) for e in entries or () for p in e["partitions"]}


def _fmt(tps) -> str:
    return ", ".join(f"{t}-{p}" for t, p in sorted(tps)) or "nothing"
