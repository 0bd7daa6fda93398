"""A produce that carries ``then`` messages (the transaction coordinator's PREPARE record and
the transaction's markers): the log actor passes them on, on the requester's behalf, only
once the produce succeeded; the requester's ``expect``-ed answers then arrive as if it had
sent them. In process, with the actors' messaging stubbed: no broker."""
from __future__ import annotations

from odradek.actors.message import Message
from odradek.actors.messages import Produce, Response
from odradek.actors.runtime import Actor
from odradek.log.log_actor import LogActor

MARKERS = ["log-1", "write_markers", {"markers": [["t", 0, 7, 0, True, 0]], "acks": -1}, 41]
OFFSETS = ["group_coordinator", "txn_offsets_end", {"producer_id": 7, "offsets": {}, "commit": True}, 42]


def log_actor():
    actor = LogActor("log-0", "/nonexistent", {}, None)
    sent, replies = [], []
    actor._transmit = lambda to, type_, fields, frames, corr, reply_to: sent.append((to, type_, fields, corr, reply_to))
    actor.reply = lambda msg, fields: replies.append((msg, fields))
    actor._answers = []
    actor._dirty, actor._closed, actor._announce_opening = set(), [], False
    return actor, sent, replies


def produce(then) -> Message:
    return Message(Produce.TYPE, 9, "txn_coordinator", Produce(-1, [["__transaction_state", 0, 0]], then=then))


def answer(code: int) -> Response:
    return Response({"topics": [{"name": "__transaction_state", "partitions": [
        {"index": 0, "error_code": code, "base_offset": 5 if code == 0 else -1}]}]})


def test_the_chained_messages_go_once_the_record_is_written_answered_to_the_requester():
    actor, sent, replies = log_actor()
    msg = produce([MARKERS, OFFSETS])
    actor._answers.append((msg, answer(0)))
    actor.after_batch()
    assert replies == [(msg, answer(0))]  # the produce's own answer first
    assert sent == [("log-1", "write_markers", MARKERS[2], 41, "txn_coordinator"),
                    ("group_coordinator", "txn_offsets_end", OFFSETS[2], 42, "txn_coordinator")]


def test_nothing_chained_goes_when_the_record_was_not_written():
    actor, sent, replies = log_actor()
    actor._answers.append((produce([MARKERS]), answer(6)))  # NOT_LEADER_OR_FOLLOWER
    actor.after_batch()
    assert len(replies) == 1 and sent == []


def test_a_malformed_chained_message_is_dropped_and_the_others_go():
    actor, sent, _replies = log_actor()
    actor._answers.append((produce([["log-1", "write_markers", "not a dict", 1], MARKERS]), answer(0)))
    actor.after_batch()
    assert [s[3] for s in sent] == [41]


def test_an_expected_answer_completes_like_a_requested_one_and_a_cancelled_one_is_ignored():
    actor = Actor("txn_coordinator", "/nonexistent")
    timers = []
    actor.call_later = lambda delay, callback: timers.append(delay) or _Timer()
    got = []
    corr = actor.expect(got.append, "log-1", "write_markers", 30.0)
    gone = actor.expect(got.append, "log-1", "write_markers", 30.0)
    actor.cancel_request(gone)
    reply = Message("_reply", corr, None, {"parts": []})
    actor._complete(corr, reply)
    actor._complete(gone, Message("_reply", gone, None, {"parts": []}))
    assert got == [reply] and timers == [30.0, 30.0]


def test_written_markers_send_the_end_txn_answer_they_carry_and_failed_ones_do_not():
    """write_markers with ``then``: the EndTxn answer the coordinator chained (one hop less)
    goes to the processor only if every marker was written; else the coordinator answers."""
    end_answer = ["processor-0", "_reply", {"body": {"error_code": 0}}, 77]
    for parts, expected in (([["t", 0, 0, ""], ["t", 1, 0, ""]], [("processor-0", "_reply", end_answer[2], 77,
                                                                   "txn_coordinator")]),
                            ([["t", 0, 0, ""], ["t", 1, 7, "timed out"]], []), ([], [])):
        actor, sent, replies = log_actor()
        msg = Message("write_markers", 9, "txn_coordinator", {**MARKERS[2], "then": [end_answer]})
        actor._answers.append((msg, {"parts": parts}))
        actor.after_batch()
        assert replies == [(msg, {"parts": parts})] and sent == expected


def test_the_coordinator_hands_its_answer_to_the_chain_and_forgets_it_only_once_sent():
    actor = Actor("txn_coordinator", "/nonexistent")
    msg = Message("txn_request", 5, "processor-1", {})
    actor._unanswered[("processor-1", 5)] = "txn_request"
    assert actor.answer_chained(msg, {"body": {"error_code": 0}}) == ["processor-1", "_reply",
                                                                      {"body": {"error_code": 0}}, 5]
    assert ("processor-1", 5) in actor._unanswered  # not sent yet: still ours to answer
    actor.answered_elsewhere(msg)
    assert actor._unanswered == {}


class _Timer:
    def cancel(self) -> None:
        pass
