"""A produce that carries ``then`` messages (the transaction coordinator's PREPARE record and
the transaction's markers): the log actor passes them on, on the requester's behalf, only
once the produce succeeded; the requester's ``expect``-ed answers then arrive as if it had
sent them. In process, with the actors' messaging stubbed: no broker."""
from __future__ import annotations

import msgpack

from odradek.actors.message import Message
from odradek.actors.messages import (Chained, PartOutcomes, Produce, Response, TxnMarker, TxnOffsetsEnd, TxnRequest,
                                     WriteMarkers)
from odradek.actors.runtime import Actor
from odradek.core.protocol import ApiKey
from odradek.log.log_actor import LogActor

MARKERS = Chained("log-1", WriteMarkers.TYPE, WriteMarkers([TxnMarker("t", 0, 7, 0, True, 0)]), 41)
OFFSETS = Chained("group_coordinator", TxnOffsetsEnd.TYPE, TxnOffsetsEnd(7, {}, True), 42)


def wire(value):
    """``value`` as a receiver gets it: through msgpack (bodies and parts become arrays)."""
    return msgpack.unpackb(msgpack.packb(value))


def log_actor():
    actor = LogActor("log-0", "/nonexistent", {}, None)
    sent, replies = [], []
    actor._transmit = lambda to, type_, fields, frames, corr, reply_to: sent.append(
        (to, type_, fields, corr, reply_to))
    actor.reply = lambda msg, fields: replies.append((msg, fields))
    actor._answers = []
    actor._dirty, actor._closed, actor._announce_opening = set(), [], False
    return actor, sent, replies


def produce(then) -> Message:
    return Message(Produce.TYPE, 9, "txn_coordinator", Produce(-1, [["__transaction_state", 0, 0]], then=wire(then)))


def answer(code: int) -> Response:
    return Response({"topics": [{"name": "__transaction_state", "partitions": [
        {"index": 0, "error_code": code, "base_offset": 5 if code == 0 else -1}]}]})


def test_the_chained_messages_go_once_the_record_is_written_answered_to_the_requester():
    actor, sent, replies = log_actor()
    msg = produce([MARKERS, OFFSETS])
    actor._answers.append((msg, answer(0)))
    actor.after_batch()
    assert replies == [(msg, answer(0))]  # the produce's own answer first
    assert sent == [("log-1", WriteMarkers.TYPE, wire(MARKERS.fields), 41, "txn_coordinator"),
                    ("group_coordinator", TxnOffsetsEnd.TYPE, wire(OFFSETS.fields), 42, "txn_coordinator")]
    assert WriteMarkers._make(sent[0][2]).markers == [list(MARKERS.fields.markers[0])]  # as the receiver decodes it


def test_nothing_chained_goes_when_the_record_was_not_written():
    actor, sent, replies = log_actor()
    actor._answers.append((produce([MARKERS]), answer(6)))  # NOT_LEADER_OR_FOLLOWER
    actor.after_batch()
    assert len(replies) == 1 and sent == []


def test_a_malformed_chained_message_is_dropped_and_the_others_go():
    actor, sent, _replies = log_actor()
    actor._answers.append((produce([["log-1", WriteMarkers.TYPE, "not a body", 1], MARKERS]), answer(0)))
    actor.after_batch()
    assert [s[3] for s in sent] == [41]


def test_an_expected_answer_completes_like_a_requested_one_and_a_cancelled_one_is_ignored():
    actor = Actor("txn_coordinator", "/nonexistent")
    timers = []
    actor.call_later = lambda delay, callback: timers.append(delay) or _Timer()
    got = []
    corr = actor.expect(got.append, "log-1", WriteMarkers.TYPE, 30.0)
    gone = actor.expect(got.append, "log-1", WriteMarkers.TYPE, 30.0)
    actor.cancel_request(gone)
    actor._complete(corr, Message("_reply", corr, None, wire(PartOutcomes([]))))
    actor._complete(gone, Message("_reply", gone, None, wire(PartOutcomes([]))))
    assert [m.fields for m in got] == [PartOutcomes([])] and timers == [30.0, 30.0]  # typed as write_markers' answer


def test_written_markers_send_the_end_txn_answer_they_carry_and_failed_ones_do_not():
    """write_markers with ``then``: the EndTxn answer the coordinator chained (one hop less)
    goes to the processor only if every marker was written; else the coordinator answers."""
    end_answer = Chained("processor-0", "_reply", Response({"error_code": 0}), 77)
    for parts, expected in (([["t", 0, 0, ""], ["t", 1, 0, ""]], [("processor-0", "_reply", wire(end_answer.fields),
                                                                   77, "txn_coordinator")]),
                            ([["t", 0, 0, ""], ["t", 1, 7, "timed out"]], []), ([], [])):
        actor, sent, replies = log_actor()
        msg = Message(WriteMarkers.TYPE, 9, "txn_coordinator",
                      WriteMarkers._make(wire(MARKERS.fields._replace(then=[end_answer]))))
        actor._answers.append((msg, PartOutcomes(parts)))
        actor.after_batch()
        assert replies == [(msg, PartOutcomes(parts))] and sent == expected


def test_the_coordinator_hands_its_answer_to_the_chain_and_forgets_it_only_once_sent():
    actor = Actor("txn_coordinator", "/nonexistent")
    msg = Message(TxnRequest.TYPE, 5, "processor-1", TxnRequest(ApiKey.END_TXN, {}))
    actor._unanswered[("processor-1", 5)] = TxnRequest.TYPE
    assert actor.answer_chained(msg, Response({"error_code": 0})) == Chained("processor-1", "_reply",
                                                                              Response({"error_code": 0}), 5)
    assert ("processor-1", 5) in actor._unanswered  # not sent yet: still ours to answer
    actor.answered_elsewhere(msg)
    assert actor._unanswered == {}


class _Timer:
    def cancel(self) -> None:
        pass
