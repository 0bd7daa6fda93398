"""A leader's ISR changes whose answers were lost (found by the short chaos schedule, which
lost 31 acknowledged writes of ``chaos-2``): leader 2 asked to expand its ISR [1, 2] to
[1, 2, 3]; ZooKeeper applied it, the answer was lost ("no answer from controller to
'alter_isr' within 10s"). The leader's next change, a shrink, replaced the pending expansion,
so its high watermark counted brokers 1 and 2 only and acknowledged records broker 3 never
had. Broker 3, in the ISR ZooKeeper held, was elected, and the others truncated to its log.

Here the leader's side runs in the test's process: a log actor whose requests to the
controller are captured and answered by hand, with a real log on disk."""
from __future__ import annotations

import pytest

from odradek.actors.message import ERROR, REPLY, Message
from odradek.actors.messages import AlterIsr, ErrorReply, FollowersFetched, IsrRecorded
from odradek.actors.metrics import Metrics
from odradek.core.config import LogConfig
from odradek.log.log import Log
from odradek.log.log_actor import LogActor, PartitionLog
from odradek.core.records import encode_batch
from odradek.core.protocol import ErrorCode


class LeaderUnderTest(LogActor):
    """A log actor without a runtime: ``request`` is captured, nothing is sent."""

    def __init__(self, broker_id: int):  # noqa: D107 - the runtime's set-up is not wanted here
        self.name, self.broker_id, self.lag_max_ms = "log-0", broker_id, 30000
        self.logs, self.unopened = {}, {}
        self._dirty, self._closed, self._answers, self._announce_opening = set(), [], [], False
        self._leases = {}
        self.metrics = Metrics()
        self.asked: list[tuple[AlterIsr, object]] = []  # (alter_isr body, callback)
        # Kafka's acknowledgement (log ends, not fsynced ones): these tests are about the ISR;
        # tests/log/test_durable_acks.py runs this leader with log.flush.before.ack
        self.flush_before_ack, self._sync_pool, self._unsynced, self._syncing = False, None, set(), set()

    def request(self, to, body, frames=(), callback=None, timeout=None):
        assert (to, type(body)) == ("controller", AlterIsr)
        self.asked.append((body, callback))

    def send(self, *args, **kwargs):
        pass


@pytest.fixture
def leader(tmp_path):
    """Broker 2 leads t-0 at epoch 2 with ISR [1, 2] (state node version 5), replicas
    [1, 2, 3]; 10 records, which broker 1 has and broker 3 has too (it is catching up)."""
    actor = LeaderUnderTest(2)
    p = PartitionLog("t", 0, "id", Log(str(tmp_path / "t-0"), LogConfig()))
    actor.logs[("t", 0)] = p
    actor._become(p, {"leader": 2, "leader_epoch": 2, "isr": [1, 2], "replicas": [1, 2, 3], "zk_version": 5})
    append(p, 10)
    progress(actor, 1, 10)
    yield actor, p
    p.log.close()


def append(p: PartitionLog, n: int) -> None:
    p.log.append(encode_batch([(None, b"v")] * n), leader_epoch=p.leader_epoch)


def progress(actor: LeaderUnderTest, replica: int, offset: int) -> None:
    actor.on_replica_progress(Message(FollowersFetched.TYPE, fields=FollowersFetched([["t", 0, replica, offset]])))


def answer(actor: LeaderUnderTest, code: int = 0, message: str = "", **fields) -> AlterIsr:
    """Answer the oldest unanswered alter_isr; returns what it asked."""
    asked, callback = actor.asked.pop(0)
    if code:
        callback(Message(ERROR, fields=ErrorReply(code, message, fields.get("held"))))
    else:
        callback(Message(REPLY, fields=IsrRecorded(**fields)))
    return asked


def test_a_later_isr_change_does_not_replace_an_expansion_zookeeper_may_have_applied(leader):
    actor, p = leader
    progress(actor, 3, 10)  # caught up: the leader asks for [1, 2, 3]
    assert answer(actor, ErrorCode.REQUEST_TIMED_OUT, "no answer within 10s").isr == [1, 2, 3]
    actor._alter_isr(p, [2])  # broker 1 fell behind a while: a shrink, answered by nobody either
    answer(actor, ErrorCode.REQUEST_TIMED_OUT, "no answer within 10s")

    append(p, 10)
    progress(actor, 1, 20)  # broker 1 has all 20; broker 3 is still at 10
    assert p.log.high_watermark == 10, "acknowledged past a replica ZooKeeper may hold in the ISR"
    progress(actor, 3, 20)
    assert p.log.high_watermark == 20


def test_a_refused_change_adopts_the_isr_the_node_holds_at_this_leaders_epoch(leader):
    actor, p = leader
    progress(actor, 3, 10)
    answer(actor, ErrorCode.REQUEST_TIMED_OUT, "no answer within 10s")  # it landed: version 6
    actor._alter_isr(p, [2])
    asked = answer(actor, ErrorCode.INVALID_UPDATE_VERSION, "the state node is at version 6",
                   held={"leader": 2, "leader_epoch": 2, "isr": [1, 2, 3], "zk_version": 6})
    assert asked.zk_version == 5
    assert (p.isr, p.zk_version, p.pending_isr) == ([1, 2, 3], 6, [])

    append(p, 10)
    progress(actor, 1, 20)
    assert p.log.high_watermark == 10  # broker 3 is in the ISR the controller elects from
    actor._alter_isr(p, [1, 2])  # and the shrink is written at the version the node is at
    assert answer(actor, zk_version=7).zk_version == 6
    assert (p.isr, p.log.high_watermark) == ([1, 2], 20)


def test_a_change_refused_by_another_leaders_state_keeps_every_pending_change_counting(leader):
    actor, p = leader
    progress(actor, 3, 10)
    answer(actor, ErrorCode.REQUEST_TIMED_OUT, "no answer within 10s")
    actor._alter_isr(p, [2])
    answer(actor, ErrorCode.INVALID_UPDATE_VERSION, "the state node is at version 7",
           held={"leader": 3, "leader_epoch": 3, "isr": [1, 3], "zk_version": 7})
    assert p.isr == [1, 2]  # deposed: the controller's LEADER_AND_ISR will say so

    append(p, 10)
    progress(actor, 1, 20)
    assert p.log.high_watermark == 10
