"""The group coordinator's held requests: KIP-848 heartbeats long-polling for news of their
member (``held``), classic JoinGroup/SyncGroup requests waiting for their group to move on
(``held_classic``).

Process: ``group_coordinator`` (a plain object its actor owns, ``coordinator.group_coordinator``).
Owns the held requests. Collaborators, handed in: the ``GroupTable`` (the groups), the
``GroupWriter`` (answers that carry a changed group wait for its record), the ``TopicView``
(topic ids in answers), the actor's ``Outbox`` (answers, timers) and the ``Clock``.
A held heartbeat is answered when its group changes for that member (``wake``, called from
``changed`` after every operation on a group), when the member sends a newer one
(``release``), or at its ``wait_ms`` deadline. The same purgatory idea as the fetch actor's
long polls.
"""
from __future__ import annotations

from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import Response
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.group import ConsumerGroup, GroupError, tps_of
from odradek.coordinator.group_requests import classic_error
from odradek.coordinator.group_table import Clock, GroupTable, TopicView
from odradek.coordinator.group_writes import GroupWriter
from odradek.core.protocol import ErrorCode


class Held:
    """A heartbeat held in purgatory."""

    __slots__ = ("msg", "timer", "epoch", "owned")

    def __init__(self, msg: Message, timer, epoch: int, owned: set):
        self.msg, self.timer, self.epoch, self.owned = msg, timer, epoch, owned


class Purgatory:
    def __init__(self, table: GroupTable, writer: GroupWriter, meta: TopicView, outbox: Outbox, clock: Clock):
        self.table, self.writer, self.meta, self.outbox, self.clock = table, writer, meta, outbox, clock
        self.held: dict[tuple[str, str], Held] = {}
        self.held_classic: dict[tuple[str, str, str], Message] = {}  # (group, "join"|"sync", member) -> request

    def close(self) -> None:
        for held in list(self.held.values()):
            held.timer.cancel()
        self.held.clear()
        self.held_classic.clear()

    # ---- KIP-848 heartbeats ----------------------------------------------------------------------
    def hold(self, key: tuple[str, str], msg: Message, wait_ms: int, epoch: int, owned: set) -> None:
        timer = self.outbox.later(wait_ms / 1000, lambda: self.answer(key))
        self.held[key] = Held(msg, timer, epoch, owned)

    def release(self, gid: str, member_id: str) -> None:
        """A member's newer heartbeat supersedes its held one: answer that one now."""
        if member_id and (gid, member_id) in self.held:
            self.answer((gid, member_id))

    def answer(self, key: tuple[str, str]) -> None:
        held = self.held.pop(key, None)
        if held is None:
            return
        held.timer.cancel()
        g = self.table.groups.get(key[0])
        resp = g.refresh(key[1], self.clock.now()) if g is not None else None
        if resp is None:
            self.outbox.reply(held.msg, Response({"error_code": int(ErrorCode.UNKNOWN_MEMBER_ID),
                                                  "error_message": f"member {key[1]} was removed from group "
                                                                   f"'{key[0]}'"}))
            return
        self.writer.after_write(g, lambda: self.outbox.reply(held.msg, Response({"error_code": 0,
                                                                                          **self.meta.with_ids(resp)})),
                                held.msg)

    def wake(self, g: ConsumerGroup) -> None:
        """The group changed: answer each held heartbeat whose member has news."""
        now = self.clock.now()
        for key in [k for k in self.held if k[0] == g.group_id]:
            held = self.held[key]
            resp = g.refresh(key[1], now)
            if resp is None or resp["member_epoch"] != held.epoch or tps_of(resp["assignment"]) != held.owned:
                self.answer(key)

    def changed(self, g: ConsumerGroup) -> None:
        """After any operation on ``g``: wake held heartbeats, note emptiness."""
        if not g.changed:
            return
        self.table.note_members(g.group_id, bool(g.members), self.clock.wall())
        self.wake(g)

    # ---- classic JoinGroup / SyncGroup -----------------------------------------------------------
    def hold_classic(self, key: tuple[str, str, str], msg: Message) -> None:
        old = self.held_classic.pop(key, None)
        if old is not None:  # the member asked again: its older request is superseded
            self.outbox.reply(old, Response(classic_error(GroupError(
                "superseded by a newer request of the same member", ErrorCode.REBALANCE_IN_PROGRESS), key[2])))
        self.held_classic[key] = msg

    def take_classic(self, key: tuple[str, str, str]) -> Message | None:
        return self.held_classic.pop(key, None)

    # ---- a partition lost ---------------------------------------------------------------------------
    def drop(self, mine: Callable[[str], bool], why: str) -> None:
        """The groups for which ``mine(gid)`` moved to another broker: what is held for them
        is answered NOT_COORDINATOR (``why`` names the partition and the reason)."""
        for key in [k for k in self.held if mine(k[0])]:
            held = self.held.pop(key)
            held.timer.cancel()
            self.outbox.reply_error(held.msg, ErrorCode.NOT_COORDINATOR, f"group '{key[0]}' moved: {why}")
        for key in [k for k in self.held_classic if mine(k[0])]:
            self.outbox.reply_error(self.held_classic.pop(key), ErrorCode.NOT_COORDINATOR,
                                    f"group '{key[0]}' moved: {why}")
