"""An election that lost a race with the partition's leader (found reading the code).

The controller elects from the ISR it holds; its write of the new state is conditional on the
state node's version. When the old leader had changed the ISR meanwhile (taken a lagging
follower out, and the controller had not yet read the notification), the write fails with
BadVersion and the controller re-reads the node. It then wrote its old choice again with the
fresh version: a leader the fresh ISR had left out, out of sync, which truncates away records
the old leader acknowledged with the ISR it really had. Kafka's controller runs such an
election again on the fresh state; so does ``ActiveController._recheck`` now. ZooKeeper is a
stand-in holding the partition's state node with versions (the controller's collaborator,
``NodeStore``)."""
from __future__ import annotations

from odradek.coordinator.zk_state import PartitionState, state_path
from tests.coordinator.test_controller_zookeeper_silence import NodeStore, controller


def last_state(c) -> PartitionState:
    """The last partition state the controller wrote."""
    path, data = [w for w in c.zk.written if w[0] == state_path("t", 0)][-1]
    return PartitionState.parse(data, c.zk.nodes[path][1])


def raced(fresh_isr: list[int], live: list[int]):
    """A controller that last read t-0 as leader 1, ISR [1, 2, 3] (version 7), while leader 1
    has since written ``fresh_isr`` (version 8); ``live``: the brokers it knows alive."""
    c, _, _ = controller()
    c.assignment["t"] = [[1, 2, 3]]
    c.states[("t", 0)] = PartitionState(1, 4, [1, 2, 3], 1, zk_version=7)
    fresh = PartitionState(1, 4, fresh_isr, 1)
    c.zk = NodeStore({"/controller_epoch": (b"1", 0), state_path("t", 0): (fresh.data(), 8)})
    c.epoch_zk_version = 0
    c.live = {b: ("127.0.0.1", 9000 + b) for b in live}
    return c


def test_an_election_whose_choice_left_the_isr_meanwhile_chooses_again_from_the_fresh_isr():
    c = raced([1, 3], live=[2, 3])  # leader 1 took broker 2 out of the ISR, then died
    written = c.write_states({("t", 0): (2, [2, 3])})  # chosen from the old ISR: broker 2
    assert written == [("t", 0)]
    final = last_state(c)
    assert (final.leader, final.isr) == (3, [3]), f"wrote leader {final.leader} with ISR {final.isr}"
    assert final.leader_epoch == 5


def test_a_change_that_lost_the_race_never_puts_back_a_replica_the_leader_took_out():
    c = raced([1, 2], live=[1, 2, 3])  # leader 1 took broker 3 out meanwhile
    c.write_states({("t", 0): (2, [1, 2, 3])})  # a preferred-leader move computed from the old ISR
    final = last_state(c)
    assert final.leader == 2 and 3 not in final.isr, f"wrote leader {final.leader} with ISR {final.isr}"


def test_a_partition_put_offline_after_the_race_keeps_the_fresh_isr_not_the_old_one():
    """Offline (no live in-sync replica) keeps the ISR so that one of them may lead when it
    comes back; after a lost race it must be the fresh ISR: the old one still named broker 2,
    which the leader had taken out, and 2 coming back first would have been elected."""
    c = raced([1, 3], live=[])
    c.write_states({("t", 0): (-1, [1, 2, 3])})
    final = last_state(c)
    assert (final.leader, final.isr) == (-1, [1, 3])
