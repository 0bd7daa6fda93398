"""The group coordinator's held requests: KIP-848 heartbeats long-polling for news of their
member (``held``), classic JoinGroup/SyncGroup requests waiting for their group to move on
(``held_classic``).

Runs in the ``group_coordinator`` process, as part of ``GroupCoordinator`` (a mixin). A held
heartbeat is answered when its group changes for that member (``_wake_held``, called from
``_changed`` after every operation on a group), when the member sends a newer one
(``_release_held``), or at its ``wait_ms`` deadline; answers that carry a changed group wait
for its record (``_after_write``). The same purgatory idea as the fetch actor's long polls.
"""
from __future__ import annotations

from odradek.actors.message import Message
from odradek.coordinator.group import ConsumerGroup, GroupError, tps_of
from odradek.coordinator.group_requests import wall_ms
from odradek.network.protocol import ErrorCode

class Held:
    """A heartbeat held in purgatory."""

    __slots__ = ("msg", "timer", "epoch", "owned")

    def __init__(self, msg: Message, timer, epoch: int, owned: set):
        self.msg, self.timer, self.epoch, self.owned = msg, timer, epoch, owned


class Purgatory:
    """The group coordinator's held requests (a mixin of ``GroupCoordinator``)."""

    def _release_held(self, gid: str, member_id: str) -> None:
        """A member's newer heartbeat supersedes its held one: answer that one now."""
        if member_id and (gid, member_id) in self.held:
            self._answer_held((gid, member_id))

    def _answer_held(self, key: tuple[str, str]) -> None:
        held = self.held.pop(key, None)
        if held is None:
            return
        held.timer.cancel()
        g = self.groups.get(key[0])
        resp = g.refresh(key[1], self._now()) if g is not None else None
        if resp is None:
            self.reply(held.msg, {"body": {"error_code": int(ErrorCode.UNKNOWN_MEMBER_ID),
                                           "error_message": f"member {key[1]} was removed from group '{key[0]}'"}})
            return
        self._after_write(g, lambda: self.reply(held.msg, {"body": {"error_code": 0, **self._with_ids(resp)}}),
                          held.msg)

    def _wake_held(self, g: ConsumerGroup) -> None:
        """The group changed: answer each held heartbeat whose member has news."""
        now = self._now()
        for key in [k for k in self.held if k[0] == g.group_id]:
            held = self.held[key]
            resp = g.refresh(key[1], now)
            if resp is None or resp["member_epoch"] != held.epoch or tps_of(resp["assignment"]) != held.owned:
                self._answer_held(key)

    def _changed(self, g: ConsumerGroup) -> None:
        """After any operation on ``g``: wake held heartbeats, note emptiness."""
        if not g.changed:
            return
        if not g.members:
            self.empty_since.setdefault(g.group_id, wall_ms())
        else:
            self.empty_since.pop(g.group_id, None)
        self._wake_held(g)

    def _hold_classic(self, key: tuple[str, str, str], msg: Message) -> None:
        old = self.held_classic.pop(key, None)
        if old is not None:  # the member asked again: its older request is superseded
            self.reply(old, {"body": self._classic_error(GroupError(
                "superseded by a newer request of the same member", ErrorCode.REBALANCE_IN_PROGRESS), key[2])})
        self.held_classic[key] = msg
