"""A leader's ISR write whose answer was lost (found by `odradek chaos --seed 11 --faults
clock-jump,kill-leader`): ZooKeeper applied [1] -> [1, 2], the leader got ConnectionLoss,
kept its old version, and every later ISR change failed with BadVersion for good (462 times
in 3 minutes; 1,066 sends failed with NOT_ENOUGH_REPLICAS). The write now reads the node back
after a failure and adopts it when it already holds what the leader meant to write."""
from __future__ import annotations

import os
import threading

from odradek.coordinator.broker_agent import write_isr
from odradek.coordinator.zk_state import PartitionState


def _write(zk, path: str, st: PartitionState, version: int) -> tuple:
    done, out = threading.Event(), []
    write_isr(zk, path, st, version, lambda *result: (out.append(result), done.set()))
    assert done.wait(10), "write_isr never answered"
    return out[0]


def test_an_isr_write_already_applied_by_zookeeper_is_adopted_not_refused_forever(zookeeper):
    zk = zookeeper.client("")
    path = f"/isr-write-{os.getpid()}/state"
    try:
        zk.create(path, PartitionState(1, 4, [1], 3).data(), makepath=True)  # version 0
        expanded = PartitionState(1, 4, [1, 2], 3)
        zk.set(path, expanded.data(), version=0)  # applied; the leader never heard (version 1)
        assert _write(zk, path, expanded, 0)[:3] == (1, None, False)  # the leader's retry, version 0

        shrunk = PartitionState(1, 4, [1], 3)
        assert _write(zk, path, shrunk, 1)[:3] == (2, None, False)  # and it goes on changing the ISR
    finally:
        zk.delete(os.path.dirname(path), recursive=True)
        zk.stop()
        zk.close()


def test_an_isr_write_that_lost_to_another_change_is_refused_with_what_the_node_holds(zookeeper):
    zk = zookeeper.client("")
    path = f"/isr-lost-{os.getpid()}/state"
    try:
        zk.create(path, PartitionState(1, 4, [1, 2, 3], 3).data(), makepath=True)
        zk.set(path, PartitionState(2, 5, [2, 3], 4).data(), version=0)  # the controller moved the leader
        version, why, unknown, held = _write(zk, path, PartitionState(1, 4, [1, 2], 3), 0)
        assert version is None and not unknown
        assert "leader 2, epoch 5, ISR [2, 3]" in why
        assert (held.leader, held.leader_epoch, held.isr, held.zk_version) == (2, 5, [2, 3], 1)  # for the leader
        raw, stat = zk.get(path)
        assert PartitionState.parse(raw, stat.version).leader == 2  # nothing written over it
    finally:
        zk.delete(os.path.dirname(path), recursive=True)
        zk.stop()
        zk.close()
