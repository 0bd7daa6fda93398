"""The active controller when ZooKeeper does not answer a read of a broker's registration.

The controller actor's blocking ZooKeeper calls give up now (``coordinator/zk_client.py``)
instead of holding its loop. ``_brokers_changed`` took any failed read of
``/brokers/ids/<id>`` for a registration that vanished: with ZooKeeper silent, every live
broker would have been taken for dead, its leaderships moved and every partition without a
live ISR member put offline. A silent ZooKeeper is not a dead broker: the live set is kept
and read again shortly. Here ZooKeeper is a stand-in that is silent while told to (the
controller's own collaborator), so the rule is checked exactly."""
from __future__ import annotations

import json
import types

from kazoo.exceptions import BadVersionError, ConnectionLoss, NoNodeError, RolledBackError

from odradek.coordinator.active_controller import ActiveController
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.zk_state import BROKERS, PartitionState
from tests.coordinator.test_controller_resend import DroppingChannel


class SilentZooKeeper:
    """Registrations of brokers 1 and 2; every call raises ConnectionLoss while ``silent``."""

    def __init__(self):
        self.silent = False
        self.registered = {1: 101, 2: 102}  # id -> czxid (the broker epoch)

    def _answer(self):
        if self.silent:
            raise ConnectionLoss()

    def get_children(self, path):
        self._answer()
        return [str(b) for b in self.registered]

    def get(self, path):
        self._answer()
        broker = int(path.rsplit("/", 1)[1])
        if not path.startswith(BROKERS) or broker not in self.registered:
            raise NoNodeError()
        data = {"host": "127.0.0.1", "port": 9000 + broker, "endpoints": [f"PLAINTEXT://127.0.0.1:{9000 + broker}"]}
        return json.dumps(data).encode(), types.SimpleNamespace(czxid=self.registered[broker], version=0)

    def ChildrenWatch(self, path, fn):  # noqa: N802 - kazoo's name
        pass

    def transaction(self):
        self._answer()
        raise AssertionError("the controller wrote partition states: it took live brokers for dead")


class Channel(DroppingChannel):
    def __init__(self):
        super().__init__()
        self.dropping = False

    def set_brokers(self, brokers) -> None:
        pass


def controller():
    later: list = []
    zk = SilentZooKeeper()
    outbox = Outbox(send=None, request=None, reply=None, reply_error=None, post=lambda fn: fn(),
                    members=lambda role: [], later=lambda delay, fn: later.append(fn))
    c = ActiveController(2, 1, 0, {"num.partitions": 1, "default.replication.factor": 1,
                                   "log.segment.bytes.min": 1024}, {}, "PLAINTEXT", zk, Channel(), outbox,
                         lambda: None)
    c.registry.max_replication = 3
    c.registry.create("t", 1, 2)
    c.assignment["t"] = [[1, 2]]
    c.states[("t", 0)] = PartitionState(1, 1, [1, 2], 1)
    c.live = {1: ("127.0.0.1", 9001), 2: ("127.0.0.1", 9002)}
    c.live_epochs = {1: 101, 2: 102}
    return c, zk, later


def test_a_registration_zookeeper_does_not_answer_for_keeps_the_live_brokers_and_is_read_again():
    c, zk, later = controller()
    zk.silent = True
    c._brokers_changed(["1", "2"])
    assert sorted(c.live) == [1, 2]  # nobody taken for dead
    assert c.states[("t", 0)].leader == 1 and c.states[("t", 0)].isr == [1, 2]
    assert len(later) == 1  # read again shortly

    zk.silent = False
    zk.registered[2] = 202  # meanwhile broker 2 registered again (a restart): it is read again
    later.pop()()
    assert sorted(c.live) == [1, 2] and c.live_epochs == {1: 101, 2: 202}


def test_a_registration_that_vanished_is_a_broker_gone():
    c, zk, later = controller()
    c.states[("t", 0)] = PartitionState(2, 1, [2], 1)  # broker 1 follows, out of the ISR: no election
    del zk.registered[1]
    c._brokers_changed(["1", "2"])
    assert sorted(c.live) == [2] and not later


def test_a_new_controller_that_cannot_read_a_topic_fails_its_load_instead_of_ruling_without_it():
    """``load`` skipped any topic it could not read: one ZooKeeper did not answer for was then
    unknown to the controller (metadata without it, no elections for it) until the next
    controller. Now only a malformed topic is skipped; ZooKeeper's silence fails the load and
    the controller actor resigns and stands again (``cluster_controller._elect``)."""
    import pytest

    from odradek.coordinator.zk_state import TOPICS

    class TopicsUnread(SilentZooKeeper):
        def get_children(self, path):
            return ["t"] if path == TOPICS else super().get_children(path)

        def get(self, path):
            if path.startswith(TOPICS):
                raise ConnectionLoss()
            return super().get(path)

    c, _, _ = controller()
    c.zk = TopicsUnread()
    c.registry.topics.clear()
    with pytest.raises(ConnectionLoss):
        c.load()


def test_a_broker_epoch_zookeeper_does_not_answer_for_is_kept_not_dropped():
    """Each broker agent tells its fetch actor the live brokers' epochs, against which replica
    fetches are checked. A registration whose read failed was left out, so that broker's
    replica fetches were refused (STALE_BROKER_EPOCH) until the next change of /brokers/ids."""
    from odradek.coordinator.broker_agent import BrokerAgent

    class Exists(SilentZooKeeper):
        def exists(self, path):
            self._answer()
            broker = int(path.rsplit("/", 1)[1])
            return types.SimpleNamespace(czxid=self.registered[broker]) if broker in self.registered else None

    told: list = []
    later: list = []
    outbox = Outbox(send=None, request=lambda to, body, **kw: told.append((to, body.epochs)),
                    reply=None, reply_error=None, post=lambda fn: fn(), members=lambda role: [],
                    later=lambda delay, fn: later.append(fn))
    zk = Exists()
    agent = BrokerAgent(3, {}, 2, {}, zk, None, outbox)
    agent.broker_epochs = {}
    agent._read_broker_epochs(["1", "2"])
    assert agent.broker_epochs == {"1": 101, "2": 102} and len(told) == 2  # the fetch actor and the replica fetcher
    zk.silent = True
    agent._read_broker_epochs(["1", "2"])
    assert agent.broker_epochs == {"1": 101, "2": 102} and len(told) == 2 and len(later) == 1
    zk.silent = False
    zk.registered[2] = 202
    later.pop()()
    assert agent.broker_epochs == {"1": 101, "2": 202}


class NodeStore:
    """An in-memory ZooKeeper: nodes by path with versions; a transaction's ``check`` and
    versioned ``set_data`` compare them as ZooKeeper's multi does (the first failing op gets
    BadVersionError, the others RolledBackError); ``written`` lists each (path, data) set.
    ``silent_on`` paths (and all of them while ``silent``) raise ConnectionLoss."""

    def __init__(self, nodes: dict | None = None):
        self.nodes: dict[str, tuple[bytes, int]] = dict(nodes or {})  # path -> (data, version)
        self.silent = False
        self.silent_on: set[str] = set()
        self.written: list[tuple[str, bytes]] = []

    def _answer(self, path: str):
        if self.silent or path in self.silent_on:
            raise ConnectionLoss()

    def exists(self, path):
        self._answer(path)
        return types.SimpleNamespace(version=self.nodes[path][1]) if path in self.nodes else None

    def get(self, path):
        self._answer(path)
        if path not in self.nodes:
            raise NoNodeError()
        data, version = self.nodes[path]
        return data, types.SimpleNamespace(version=version)

    def get_children(self, path):
        self._answer(path)
        return []

    def ChildrenWatch(self, path, fn):  # noqa: N802 - kazoo's name
        pass

    def delete(self, path):
        self._answer(path)
        del self.nodes[path]

    def transaction(self):
        store, ops = self, []

        class Txn:
            def create(self, path, data=b"", ephemeral=False):
                ops.append(("create", path, data, -1))

            def check(self, path, version):
                ops.append(("check", path, None, version))

            def set_data(self, path, data, version=-1):
                ops.append(("set", path, data, version))

            def commit(self):
                for _, path, _, _ in ops:
                    store._answer(path)
                bad = [i for i, (op, path, _, version) in enumerate(ops)
                       if op != "create" and version != -1 and path in store.nodes and version != store.nodes[path][1]]
                if bad:
                    return [BadVersionError() if i == bad[0] else RolledBackError() for i in range(len(ops))]
                results = []
                for op, path, data, _ in ops:
                    if op == "create":
                        store.nodes[path] = (data, 0)
                        results.append(path)
                        continue
                    if op == "set":
                        store.nodes[path] = (data, store.nodes[path][1] + 1)
                        store.written.append((path, data))
                    results.append(types.SimpleNamespace(version=store.nodes[path][1]))
                return results
        return Txn()


def standing(zk: NodeStore):
    """A registered broker's controller actor, without its runtime: timers are captured."""
    from odradek import config as cfg
    from odradek.coordinator.cluster_controller import ClusterController

    actor = ClusterController.__new__(ClusterController)
    actor.broker_id, actor.registered, actor.controller, actor.zk = 1, True, None, zk
    actor.config = cfg.load(None, [])
    actor.args = {"topic_defaults": {}}
    actor.channel = Channel()
    actor.timers = []
    actor.call_later = lambda delay, fn: actor.timers.append(fn)
    actor.outbox = Outbox(send=None, request=None, reply=None, reply_error=None, post=lambda fn: fn(),
                          members=lambda role: [], later=actor.call_later)
    return actor


def test_an_election_zookeeper_did_not_answer_is_stood_again():
    """kazoo's watch of /controller calls nobody when the connection comes back in the same
    session with the node as it was (absent): a broker whose election failed for ZooKeeper's
    silence never stood again, and a cluster whose every candidate failed had no controller."""
    zk = NodeStore()
    actor = standing(zk)
    zk.silent = True
    actor._elect()
    assert actor.controller is None and len(actor.timers) == 1
    zk.silent = False
    actor.timers.pop()()
    assert actor.controller is not None and zk.nodes["/controller_epoch"][0] == b"1"


def test_a_new_controller_whose_load_zookeeper_did_not_answer_resigns_and_stands_again():
    from odradek.coordinator.zk_state import TOPICS
    zk = NodeStore()
    zk.silent_on = {TOPICS}
    actor = standing(zk)
    actor._elect()
    assert actor.controller is None and "/controller" not in zk.nodes  # resigned: others may stand
    assert len(actor.timers) == 1
    zk.silent_on = set()
    actor.timers.pop()()
    assert actor.controller is not None and zk.nodes["/controller_epoch"][0] == b"2"
