"""The group coordinator's offsets APIs: OFFSET_COMMIT, OFFSET_FETCH, a committed transaction's
offsets (``txn_offsets_end``), and their expiry (``offsets.retention.minutes``).

Process: ``group_coordinator`` (a plain object its actor owns, ``coordinator.group_coordinator``).
Owns the count of commits stored and the offsets' settings (``offsets.retention.minutes``,
``offset.metadata.max.bytes``). Collaborators, handed in: the ``GroupTable`` (the committed
offsets), the ``TopicView`` (which partitions exist), the ``Leadership`` (whether a group is
coordinated here), the ``GroupWriter``, ``create_topic()`` (the actor's creation of
``__consumer_offsets``, for a transaction's offsets arriving before it exists), the actor's
``Outbox`` and the ``Clock``.
Serves ``txn_offsets_end {producer_id, commit, offsets}`` from the transaction coordinator
(the actor's ``on_txn_offsets_end``). Sends ``list_offsets`` to the fetch actor (a commit
beyond the high watermark is refused) and writes through the ``GroupWriter``.
"""
from __future__ import annotations

import logging

from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import ListOffsets, OffsetsStored, Response
from odradek.actors.names import FETCH_ACTOR
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.group import GroupError
from odradek.coordinator.group_leadership import Leadership
from odradek.coordinator.group_requests import group_id
from odradek.coordinator.group_table import Clock, GroupTable, TopicView
from odradek.coordinator.group_writes import WRITE_TIMEOUT, GroupWriter, commit_error
from odradek.coordinator.offsets import Committed, group_record, offset_record
from odradek.coordinator.offsets import expired as expired_offsets
from odradek.log.reader import LATEST_TIMESTAMP
from odradek.core.fields import BadRequest, field
from odradek.core.protocol import OFFSETS_TOPIC, ErrorCode, OdradekError

log = logging.getLogger("odradek.groups")


class OffsetsApi:
    def __init__(self, table: GroupTable, meta: TopicView, leadership: Leadership, writer: GroupWriter,
                 create_topic: Callable[[], None], outbox: Outbox, clock: Clock, retention_ms: int,
                 metadata_max: int):
        self.table, self.meta, self.leadership, self.writer = table, meta, leadership, writer
        self.create_topic, self.outbox, self.clock = create_topic, outbox, clock
        self.retention_ms, self.metadata_max = retention_ms, metadata_max
        self.commits = 0

    # ---- offsets ------------------------------------------------------------------------------
    def offset_commit(self, msg: Message, body: dict) -> None:
        gid = group_id(body)
        member_id = field(body, "member_id", str, "")
        epoch = field(body, "generation_id_or_member_epoch", int, -1)
        topics = field(body, "topics", list)
        results: dict[tuple[str, int], tuple[int, str]] = {}
        wanted: dict[tuple[str, int], Committed] = {}
        now_ms = self.clock.wall()
        for t in topics:
            if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not isinstance(t.get("partitions"), list):
                raise BadRequest("each topic must be a map with 'name' and a list of 'partitions'")
            for p in t["partitions"]:
                if not isinstance(p, dict) or not isinstance(p.get("partition_index"), int):
                    raise BadRequest("each partition must be a map with an integer 'partition_index'")
                tp = (t["name"], p["partition_index"])
                problem = self._offset_problem(tp, p)
                if problem:
                    results[tp] = problem
                else:
                    wanted[tp] = Committed(p["committed_offset"], p.get("committed_leader_epoch", -1) or -1,
                                           p.get("committed_metadata") or "", now_ms)
        g = self.table.groups.get(gid)
        cg = self.table.classic.get(gid)
        try:
            if cg is not None:
                cg.check_commit(member_id, epoch, field(body, "group_instance_id", str, None))
            elif g is None and member_id:
                raise GroupError(f"member {member_id!r} is not in group '{gid}' (the group does not exist): "
                                 f"commit refused", ErrorCode.UNKNOWN_MEMBER_ID)
            problems = g.check_commit(member_id, epoch, list(wanted)) if g is not None and cg is None else {}
        except GroupError as exc:  # the whole commit is refused: said per partition, as Kafka does
            problems = {tp: exc for tp in wanted}
        for tp, err in problems.items():
            results[tp] = (int(err.code), err.message)
            del wanted[tp]
        if not wanted:
            self._reply(msg, results)
            return
        if body.get("any_offset") is True:  # a Kafka client's commit: Kafka takes any offset >= 0
            self._write_commit(msg, gid, wanted, results)
            return
        self._check_high_watermarks(wanted, results, lambda: self._write_commit(msg, gid, wanted, results))

    def _offset_problem(self, tp: tuple[str, int], p: dict) -> tuple[int, str] | None:
        topic, partition = tp
        n = self.meta.topics.get(topic)
        if n is None or not 0 <= partition < n:
            return int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), f"{topic}-{partition} does not exist"
        offset = p.get("committed_offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            return int(ErrorCode.INVALID_REQUEST), f"{topic}-{partition}: committed_offset must be an integer >= 0, " \
                                                   f"got {offset!r}"
        meta = p.get("committed_metadata")
        if meta is not None and not isinstance(meta, str):
            return int(ErrorCode.INVALID_REQUEST), f"{topic}-{partition}: committed_metadata must be a string"
        if meta is not None and len(meta.encode()) > self.metadata_max:
            return int(ErrorCode.OFFSET_METADATA_TOO_LARGE), f"{topic}-{partition}: committed_metadata is " \
                f"{len(meta.encode())} bytes; offset.metadata.max.bytes is {self.metadata_max}"
        le = p.get("committed_leader_epoch", -1)
        if le is not None and (not isinstance(le, int) or isinstance(le, bool)):
            return int(ErrorCode.INVALID_REQUEST), f"{topic}-{partition}: committed_leader_epoch must be an integer"
        return None

    def _check_high_watermarks(self, wanted: dict, results: dict, then) -> None:
        """Refuse offsets beyond a partition's high watermark (what no consumer can have read),
        for the partitions this broker leads (the local fetch actor knows only those)."""
        by_topic: dict[str, list] = {}
        for topic, partition in wanted:
            by_topic.setdefault(topic, []).append({"index": partition, "timestamp": LATEST_TIMESTAMP})
        body = {"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

        def checked(reply: Message) -> None:
            if reply.is_error:
                for tp in list(wanted):
                    results[tp] = (int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                                   f"cannot check the offset against the log: {reply.error_message}")
                    del wanted[tp]
            else:
                for t in reply.fields.body["topics"]:
                    for p in t["partitions"]:
                        tp = (t["name"], p["index"])
                        if tp not in wanted:
                            continue
                        if p.get("error_code") == ErrorCode.NOT_LEADER_OR_FOLLOWER or (
                                p.get("error_code") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                                and tp[1] < self.meta.topics.get(tp[0], 0)):
                            continue  # led by another broker, or hosted elsewhere (cluster mode): not checkable here
                        if p.get("error_code"):
                            results[tp] = (p["error_code"], p.get("error_message") or "")
                            del wanted[tp]
                        elif wanted[tp].offset > p["offset"]:
                            results[tp] = (int(ErrorCode.OFFSET_OUT_OF_RANGE),
                                           f"{tp[0]}-{tp[1]}: offset {wanted[tp].offset} is beyond the high "
                                           f"watermark {p['offset']}: no consumer can have read that far")
                            del wanted[tp]
            then()

        self.outbox.request(FETCH_ACTOR, ListOffsets(body, readable=True), callback=checked,
                            timeout=WRITE_TIMEOUT)

    def _write_commit(self, msg: Message, gid: str, wanted: dict, results: dict) -> None:
        if not wanted:
            self._reply(msg, results)
            return
        recs = [offset_record(gid, t, p, c) for (t, p), c in wanted.items()]

        def done(code: int, error: str) -> None:
            for tp, c in wanted.items():
                if code:
                    results[tp] = (int(commit_error(code)), f"the commit was not stored: {error}")
                else:
                    self.table.offsets.setdefault(gid, {})[tp] = c
                    results[tp] = (0, "")
            if not code:
                self.commits += 1
                if not self.table.has_members(gid):
                    self.table.empty_since.setdefault(gid, self.clock.wall())
            self._reply(msg, results)

        self.writer.append(gid, recs, done)

    # ---- a committed transaction's offsets ------------------------------------------------------
    def txn_offsets_end(self, msg: Message) -> None:
        """From the transaction coordinator (``TxnOffsetsEnd``): the offsets a committed
        transaction carried (TxnOffsetCommit, ``{group: [[topic, partition, offset,
        leader_epoch, metadata]]}``). Stored (acks=all) like an OffsetCommit, then answered
        ``OffsetsStored``; a failure is retried by the transaction coordinator."""
        end = msg.fields
        offsets = end.offsets or {}
        if not end.commit or not offsets:
            self.outbox.reply(msg, OffsetsStored(0))
            return
        if not self.leadership.partitions:
            self.create_topic()
            self.outbox.reply(msg, OffsetsStored(int(ErrorCode.COORDINATOR_NOT_AVAILABLE),
                                                 f"{OFFSETS_TOPIC} is being created"))
            return
        left = {"n": len(offsets), "code": 0, "why": ""}
        now_ms = self.clock.wall()

        def one_done(code: int = 0, why: str = "") -> None:
            if code:
                left["code"], left["why"] = code, why
            left["n"] -= 1
            if left["n"] <= 0:
                self.outbox.reply(msg, OffsetsStored(left["code"], left["why"]))

        for gid, entries in offsets.items():
            wanted = {(str(t), int(p)): Committed(int(o), int(e), str(m or ""), now_ms) for t, p, o, e, m in entries}

            def done(code: int, error: str, gid=gid, wanted=wanted) -> None:
                if not code:
                    self.table.offsets.setdefault(gid, {}).update(wanted)
                    self.commits += 1
                one_done(code, error)
            self.writer.append(gid, [offset_record(gid, t, p, c) for (t, p), c in wanted.items()], done)

    def _reply(self, msg: Message, results: dict) -> None:
        by_topic: dict[str, list] = {}
        for (t, p), (code, message) in sorted(results.items()):
            entry = {"partition_index": p, "error_code": code}
            if code:
                entry["error_message"] = message
            by_topic.setdefault(t, []).append(entry)
        self.outbox.reply(msg, Response({"topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}))

    def offset_fetch(self, msg: Message, body: dict) -> None:
        """One group (``group_id``, ``topics``), or several (``groups``: OffsetFetch v8+)."""
        groups = field(body, "groups", list, None)
        if groups is None:
            self.outbox.reply(msg, Response(self._fetched(group_id(body), field(body, "topics", list, None))))
            return
        out = []
        for entry in groups:
            if not isinstance(entry, dict):
                raise BadRequest("each entry of 'groups' must be a map with 'group_id' and 'topics'")
            try:
                gid = group_id(entry)
                error = self.leadership.coordinator_error(gid)
                if error is not None:
                    raise error
                out.append(self._fetched(gid, field(entry, "topics", list, None)))
            except OdradekError as exc:
                out.append({"group_id": entry.get("group_id"), "error_code": int(exc.code),
                            "error_message": exc.message, "topics": []})
        self.outbox.reply(msg, Response({"groups": out}))

    def _fetched(self, gid: str, topics: list | None) -> dict:
        committed = self.table.offsets.get(gid, {})
        if topics is None:
            wanted = sorted(committed)
        else:
            wanted = []
            for t in topics:
                if not isinstance(t, dict) or not isinstance(t.get("name"), str) or \
                        not isinstance(t.get("partition_indexes"), list):
                    raise BadRequest("each topic must be a map with 'name' and a list of 'partition_indexes'")
                wanted += [(t["name"], p) for p in t["partition_indexes"]]
        by_topic: dict[str, list] = {}
        for tp in wanted:
            c = committed.get(tp)
            by_topic.setdefault(tp[0], []).append({
                "partition_index": tp[1], "committed_offset": c.offset if c else -1,
                "committed_leader_epoch": c.leader_epoch if c else -1, "metadata": c.metadata if c else "",
                "error_code": 0})
        return {"error_code": 0, "group_id": gid, "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]}

    def expire(self, now_ms: int | None = None) -> None:
        """``offsets.retention.minutes``: offsets of a group without members expire."""
        now_ms = self.clock.wall() if now_ms is None else now_ms
        table = self.table
        for gid, committed in list(table.offsets.items()):
            if table.has_members(gid):
                continue
            since = table.empty_since.get(gid, now_ms)
            expired = expired_offsets(committed, since, self.retention_ms, now_ms)
            if not expired:
                continue
            log.info("group %s: %d committed offsets expired (offsets.retention.minutes)", gid, len(expired))
            for tp in expired:
                del committed[tp]
            recs = [offset_record(gid, t, p, None) for t, p in expired]
            if not committed:
                table.forget(gid)
                recs.append(group_record(gid, None))
            self.writer.append(gid, recs, lambda code, error: code and log.error("expiry not stored: %s", error))
