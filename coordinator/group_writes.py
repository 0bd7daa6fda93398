"""The group coordinator's writes: group records and committed offsets appended to the group's
``__consumer_offsets`` partition through its log actor (``produce`` acks=-1, answered once the
ISR has the batch), and how a failed write maps to the request's error.

Process: ``group_coordinator`` (a plain object its actor owns, ``coordinator.group_coordinator``);
no state of its own. Collaborators, handed in: the ``Leadership`` (the partition of a group,
whether it is still led and loaded here: its load token), the ``GroupTable`` (the group's
emptiness, stored with its record), the ``TopicView`` (this broker's id), the actor's
``Outbox`` and ``refresh()`` (a write refused for leadership asks the controller again).
Sends: ``produce`` (``Produce``, acks -1) + the batch to a log actor.
"""
from __future__ import annotations

import logging

from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import Produce, ProducePart
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.group import ConsumerGroup
from odradek.coordinator.group_leadership import Leadership
from odradek.coordinator.group_table import GroupTable, TopicView
from odradek.coordinator.offsets import group_record, partition_for
from odradek.core.records import encode_batch
from odradek.core.protocol import OFFSETS_TOPIC, ErrorCode

log = logging.getLogger("odradek.groups")

COMMIT_TIMEOUT_MS = 5000  # Kafka's offsets.commit.timeout.ms: an acks=-1 write waits this long for the ISR
WRITE_TIMEOUT = 30.0  # seconds before an unanswered produce counts as failed (the log actor's own limit is above)

# Write errors meaning "this broker no longer leads the partition".
LEADERSHIP_LOST = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH,
                             ErrorCode.KAFKA_STORAGE_ERROR, ErrorCode.NOT_COORDINATOR})
NO_QUORUM = frozenset({ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                       ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
TOO_LARGE = frozenset({ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE})


def commit_error(code: int) -> ErrorCode:
    """A failed write of committed offsets -> the commit's error (Kafka's storeOffsets)."""
    code = ErrorCode.of(code)
    if code in LEADERSHIP_LOST:
        return ErrorCode.NOT_COORDINATOR
    if code in NO_QUORUM:
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if code == ErrorCode.REQUEST_TIMED_OUT:
        return ErrorCode.REQUEST_TIMED_OUT
    if code in TOO_LARGE:
        return ErrorCode.INVALID_COMMIT_OFFSET_SIZE
    return ErrorCode.COORDINATOR_NOT_AVAILABLE


def group_write_error(code: int) -> ErrorCode:
    """A failed write of a group record -> the heartbeat's error (KIP-848's coordinator:
    leadership lost is NOT_COORDINATOR, anything else COORDINATOR_NOT_AVAILABLE)."""
    return ErrorCode.NOT_COORDINATOR if ErrorCode.of(code) in LEADERSHIP_LOST else ErrorCode.COORDINATOR_NOT_AVAILABLE


class GroupWriter:
    def __init__(self, leadership: Leadership, table: GroupTable, meta: TopicView, outbox: Outbox,
                 refresh: Callable[[], None]):
        self.leadership, self.table, self.meta, self.outbox, self.refresh = leadership, table, meta, outbox, refresh

    def after_write(self, g: ConsumerGroup, then, msg: Message | None = None) -> None:
        """Append the group's record if it changed, then run ``then`` (answers wait for it).
        If the write fails, ``msg`` (the request waiting for it) gets the retriable error
        instead (the member retries with the epoch it had, which the group accepts), and the
        group stays marked changed so that its next operation writes the record again."""
        if not g.changed:
            then()
            return
        g.changed = False
        state = None if g.deleted else g.to_record()
        key, value = group_record(g.group_id, state, self.table.empty_since.get(g.group_id))

        def done(code: int, error: str) -> None:
            if not code:
                then()
                return
            log.warning("group %s: its record was not written: %s", g.group_id, error)
            if self.table.groups.get(g.group_id) is g:
                g.changed = True
            if msg is None:
                then()
            else:
                self.outbox.reply_error(msg, group_write_error(code), f"group '{g.group_id}': its new state was "
                                                                      f"not stored ({error}); retry")

        self.append(g.group_id, [(key, value)], done)

    # ---- writing records ---------------------------------------------------------------------------
    def append(self, gid: str, recs: list, done) -> None:
        """Append ``[(key, value)]`` to the group's partition with acks=-1; ``done(0, "")``
        once the ISR has it, else ``done(error_code, message)`` with the write's own code
        (callers map it: ``commit_error``, ``group_write_error``). A partition unloaded
        while the write was in flight answers NOT_COORDINATOR: its state here is gone."""
        leadership = self.leadership
        if not leadership.partitions:
            done(int(ErrorCode.COORDINATOR_NOT_AVAILABLE), f"{OFFSETS_TOPIC} does not exist")
            return
        partition = partition_for(gid, leadership.partitions)
        token = leadership.owned.get(partition)
        if token is None:
            done(int(ErrorCode.NOT_COORDINATOR), f"broker {self.meta.broker_id} does not lead "
                                                 f"{OFFSETS_TOPIC}-{partition}")
            return
        batch = encode_batch(recs)

        def answered(reply: Message) -> None:
            if leadership.owned.get(partition) != token:
                done(int(ErrorCode.NOT_COORDINATOR), f"broker {self.meta.broker_id} stopped leading "
                                                     f"{OFFSETS_TOPIC}-{partition} during the write")
                return
            if reply.is_error:
                code, why = reply.error_code or int(ErrorCode.UNKNOWN_SERVER_ERROR), reply.error_message
            else:
                try:
                    p = reply.fields.body["topics"][0]["partitions"][0]
                    code, why = p.get("error_code") or 0, p.get("error_message") or ""
                except (KeyError, IndexError, TypeError):
                    code, why = int(ErrorCode.UNKNOWN_SERVER_ERROR), "malformed answer from the log actor"
            if code:
                why = f"{OFFSETS_TOPIC}-{partition}: {ErrorCode.of(code).name}" + (f": {why}" if why else "")
                if ErrorCode.of(code) in LEADERSHIP_LOST:
                    self.refresh()  # learn the new leader; the push may be on its way too
            done(code, why)

        self.outbox.request(leadership.host(partition),
                            Produce(-1, [ProducePart(OFFSETS_TOPIC, partition, 0)], COMMIT_TIMEOUT_MS),
                            frames=[batch], callback=answered, timeout=WRITE_TIMEOUT)
