"""The cluster controller keeps telling a live broker what it did not acknowledge (Kafka's
controller retries a request to a live broker until it is delivered).

Found by ``odradek chaos --time 120 --seed 7 --faults pause-leader,partition-brokers,partition-oneway``:
a LEADER_AND_ISR making broker 1 the leader of chaos-1 was sent while broker 1 was cut off
from the other brokers (its ZooKeeper session alive); the channel gave up at its 30 s
deadline, nothing sent it again, and broker 1 never learned it led chaos-1. For a minute the
partition had a leader in ZooKeeper that answered NOT_LEADER_OR_FOLLOWER to everyone, and
446 sends expired. Here the channel is a stand-in that drops what it is told to (the
controller's own collaborator, not a client), so the rule is checked exactly."""
from __future__ import annotations

from odradek.coordinator.active_controller import ActiveController
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.zk_state import PartitionState
from odradek.core.protocol import ApiKey


class DroppingChannel:
    """Answers every request with "no answer" while ``dropping``, else with success."""

    def __init__(self):
        self.dropping = True
        self.sent: list[tuple[int, int, dict]] = []

    def send(self, broker, api, body, callback, timeout=30.0):
        self.sent.append((broker, api, body))
        callback(None, f"broker {broker}: no response within {timeout}s") if self.dropping else callback({}, None)


def controller() -> tuple[ActiveController, DroppingChannel, list]:
    posted: list = []
    outbox = Outbox(send=None, request=None, reply=None, reply_error=None, post=posted.append,
                    members=lambda role: [], later=lambda delay, fn: None)
    channel = DroppingChannel()
    c = ActiveController(2, 1, 0, {"num.partitions": 1, "default.replication.factor": 1,
                                   "log.segment.bytes.min": 1024}, {}, "PLAINTEXT", None, channel, outbox,
                         lambda: None)
    c.registry.max_replication = 3
    c.registry.create("t", 2, 2)
    c.assignment["t"] = [[1, 2], [2, 1]]
    c.states[("t", 0)] = PartitionState(1, 1, [1, 2], 1)
    c.states[("t", 1)] = PartitionState(2, 1, [2, 1], 1)
    c.live = {1: ("127.0.0.1", 1), 2: ("127.0.0.1", 2)}
    return c, channel, posted


def run(posted: list) -> None:
    while posted:
        posted.pop(0)()


def leader_and_isr_to(channel: DroppingChannel, broker: int) -> list[dict]:
    return [p for b, api, body in channel.sent if b == broker and api == ApiKey.LEADER_AND_ISR
            for p in body["partitions"]]


def test_a_leader_and_isr_a_live_broker_did_not_answer_is_sent_again_with_the_current_state():
    c, channel, posted = controller()
    c.send_leader_and_isr(1, [("t", 0)])
    c.send_leader_and_isr(1, [("t", 1)])  # a second failure joins the first: one resend
    assert len(posted) == 1
    c.states[("t", 0)] = PartitionState(2, 2, [2], 1)  # meanwhile the leadership moved again
    channel.dropping = False
    run(posted)
    resent = leader_and_isr_to(channel, 1)[2:]
    assert [(p["topic"], p["partition"], p["leader"], p["leader_epoch"]) for p in resent] == \
        [("t", 0, 2, 2), ("t", 1, 2, 1)]
    assert not posted and not c.unsent_leader_and_isr


def test_it_keeps_trying_while_the_broker_is_live_and_stops_when_it_leaves_or_this_controller_resigns():
    c, channel, posted = controller()
    c.send_leader_and_isr(1, [("t", 0)])
    for _ in range(3):  # each attempt fails again (the channel's own deadline paces them)
        posted.pop(0)()
    assert len(leader_and_isr_to(channel, 1)) == 4 and len(posted) == 1
    del c.live[1]  # the broker left: the pending attempt sends nothing, none follows
    run(posted)
    assert len(leader_and_isr_to(channel, 1)) == 4 and not posted
    c.live[1] = ("127.0.0.1", 1)
    c.active = False  # another broker is the controller now: its failures are not retried here
    c.send_leader_and_isr(1, [("t", 0)])
    assert not posted


def test_an_update_metadata_a_live_broker_did_not_answer_is_sent_again():
    c, channel, posted = controller()
    c.send_update_metadata()
    assert len(posted) == 2  # neither broker answered: one resend each
    channel.dropping = False
    run(posted)
    assert sorted(b for b, api, _ in channel.sent if api == ApiKey.UPDATE_METADATA) == [1, 1, 2, 2]
    assert not posted and not c.unsent_metadata
