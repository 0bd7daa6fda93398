"""The broker agent: the half of a cluster broker's ``controller`` actor that applies what the
active controller decides (every broker runs it, the controller's own broker included).

Process: ``controller`` (a ``BrokerAgent`` object of the actor
``coordinator.cluster_controller.ClusterController``, which hands it its collaborators and
dispatches to it; no messages of its own).
Owns: this broker's view of the cluster (the last UPDATE_METADATA: ``snapshot_data``), the
last LEADER_AND_ISR entry of each partition it hosts (``hosted``: a restarted log actor gets
its partitions and roles back from it), the highest controller epoch seen, the broker epoch
of every live broker (``broker_epochs``: the czxid of its ``/brokers/ids/<id>``, watched in
ZooKeeper) and the replication throttles (``coordinator.throttles``).
Serves, for the actor: LEADER_AND_ISR, UPDATE_METADATA and STOP_REPLICA (``handle_request``),
``alter_isr`` from a leading log actor (a conditional write of the partition's state node,
then an ISR change notification), ``get_metadata``, ``get_assignment``,
``get_broker_epochs``, ``set_throttle_rates``, the controlled shutdown, and the relay of
controller requests to the active controller's broker.
Sends: LEADER_AND_ISR -> ``become`` to the log actors, then ``follow``/``unfollow`` to the
replica fetcher; UPDATE_METADATA -> ``metadata`` to every handler and the group coordinator,
``assign {configure}`` to log actors whose topic configs changed; STOP_REPLICA -> ``unfollow``,
``assign {close}``; ``broker_epochs {epochs}`` to the fetch actor (only a live broker fetches
as a replica) and the replica fetcher (which proves this broker's own with it).
Invariant: a request of an older controller epoch than the highest seen is refused
STALE_CONTROLLER_EPOCH.
"""
from __future__ import annotations

import logging
from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import (Assign, Become, BrokerEpochs, Follow, FollowPart, IsrRecorded, Metadata, Response,
                                     Unfollow)
from odradek.actors.names import FETCH_ACTOR, GROUP_COORDINATOR, HANDLER, REPLICA_FETCHER, log_host
from odradek.coordinator.controller_kit import SEND_TIMEOUT, ZK_RETRY, Outbox, all_then
from odradek.coordinator.throttles import Throttles
from odradek.coordinator.zk_state import BROKERS, NOTIFICATIONS, PartitionState, state_path, to_json
from odradek.core.protocol import ApiKey, ErrorCode

log = logging.getLogger("odradek.controller")


class BrokerAgent:
    """Every cluster broker's side of the controller, owned by its controller actor. Handed:
    ``broker_id``, ``config`` (the broker config), ``log_hosts`` (how many log actor
    processes), ``topic_defaults`` (topic-level config defaults), ``zk`` (the actor's started
    kazoo client), ``relay`` (a ``ControllerChannel`` to the active controller's broker) and
    ``outbox`` (``controller_kit.Outbox``: the actor's way to send). Owns the replication
    ``throttles`` (``coordinator.throttles``)."""

    def __init__(self, broker_id: int, config, log_hosts: int, topic_defaults: dict, zk, relay, outbox: Outbox):
        self.broker_id, self.config, self.log_hosts, self.topic_defaults = broker_id, config, log_hosts, topic_defaults
        self.zk, self.relay, self.outbox = zk, relay, outbox
        self.seen_controller_epoch = -1
        self.snapshot_data: dict = {"version": -1, "topics": {}, "brokers": {}, "controller_id": -1}
        self.hosted: dict[tuple[str, int], dict] = {}  # the last LEADER_AND_ISR entry of each hosted partition
        self.leader_addresses: dict[str, list] = {}
        self.broker_epochs: dict[str, int] | None = None  # None until watched (the first controller request)
        self.throttles = Throttles(broker_id, config, zk, outbox.request)

    def snapshot(self) -> dict:
        snap = dict(self.snapshot_data)
        snap.update(defaults=self.topic_defaults, broker_id=self.broker_id)
        return snap

    def assignment_of(self, host: str) -> list[dict]:
        """A restarted log actor gets back the partitions (and roles) it had."""
        return [e for (t, p), e in self.hosted.items() if log_host(t, p, self.log_hosts) == host]

    def on_members(self, role: str, members: list[str]) -> None:
        if role == REPLICA_FETCHER and members:
            self._tell_fetcher(list(self.hosted.values()))
            self.tell_throttles(force=True, only=REPLICA_FETCHER)
        elif role == FETCH_ACTOR and members:  # (re)started: it knows no throttle yet
            self.tell_throttles(force=True, only=FETCH_ACTOR)

    def tell_throttles(self, force: bool = False, only: str | None = None) -> None:
        self.throttles.tell(self.hosted, self.snapshot_data.get("topics") or {}, force, only)

    def set_throttle_rates(self, rates: dict) -> None:
        self.throttles.set_rates(rates)
        self.tell_throttles()

    # ---- broker epochs (KIP-903: who may fetch as a replica) --------------------------------
    def _watch_broker_epochs(self) -> None:
        """Watch ``/brokers/ids`` (once; kazoo keeps the watch across reconnections)."""
        if self.broker_epochs is not None:
            return
        self.broker_epochs = {}
        self.zk.ChildrenWatch(BROKERS,
                              lambda children: self.outbox.post(lambda: self._read_broker_epochs(children)))

    def refresh_broker_epochs(self) -> None:
        """Read them again now: the watch reports a change of the children only, so a broker
        that re-registered between two looks (same ids, a new czxid) is seen here, at the
        UPDATE_METADATA the controller sends when a broker (re)joins, and when our connection
        to ZooKeeper comes back in the same session (kazoo's watch then re-reads the ids and
        calls nobody if they are the same). Nothing before the watch is set."""
        if self.broker_epochs is None:
            return
        try:
            children = self.zk.get_children(BROKERS)
        except Exception as exc:  # noqa: BLE001 - ZooKeeper did not answer: read again shortly
            log.warning("cannot list the registered brokers: %r", exc)
            self.outbox.later(ZK_RETRY, self.refresh_broker_epochs)
            return
        self._read_broker_epochs(children)

    def _read_broker_epochs(self, children) -> None:
        """The broker epochs (czxid of each registration) the fetch actor checks replica
        fetches against. ZooKeeper not answering is not a broker gone: the epochs stay as
        they were (dropping one would refuse that broker's replica fetches,
        STALE_BROKER_EPOCH) and are read again shortly."""
        epochs = {}
        for child in children:
            try:
                stat = self.zk.exists(f"{BROKERS}/{child}")
            except Exception as exc:  # noqa: BLE001 - ZooKeeper did not answer: nothing is known
                log.warning("cannot read the registration of broker %s (%r): broker epochs kept, read again in %gs",
                            child, exc, ZK_RETRY)
                self.outbox.later(ZK_RETRY, self.refresh_broker_epochs)
                return
            if stat is not None:
                epochs[str(child)] = stat.czxid
        if epochs != self.broker_epochs:
            self.broker_epochs = epochs
            for role in (FETCH_ACTOR, REPLICA_FETCHER):
                self.outbox.request(role, BrokerEpochs(epochs), timeout=SEND_TIMEOUT)

    def handle_request(self, msg: Message, api: int, body: dict) -> None:
        """LEADER_AND_ISR, UPDATE_METADATA or STOP_REPLICA from the controller (via a handler)."""
        epoch = body.get("controller_epoch", -1)
        if not isinstance(epoch, int) or epoch < self.seen_controller_epoch:
            self.outbox.reply(msg, Response({"error_code": int(ErrorCode.STALE_CONTROLLER_EPOCH),
                                             "error_message": f"controller epoch {epoch} is older than "
                                                              f"{self.seen_controller_epoch}"}))
            return
        self.seen_controller_epoch = epoch
        if api == ApiKey.LEADER_AND_ISR:
            self._leader_and_isr(msg, body)
        elif api == ApiKey.UPDATE_METADATA:
            self._update_metadata(msg, body)
        elif api == ApiKey.STOP_REPLICA:
            self._stop_replica(msg, body)
        else:
            self.outbox.reply_error(msg, ErrorCode.INVALID_REQUEST, f"API {api} is not a controller request")

    def _leader_and_isr(self, msg: Message, body: dict) -> None:
        self._watch_broker_epochs()
        for b in body.get("brokers") or []:
            self.leader_addresses[str(b["node_id"])] = [b["host"], b["port"]]
        per_host: dict[str, list] = {}
        entries = []
        for e in body.get("partitions") or []:
            entry = dict(e, role="leader" if e["leader"] == self.broker_id else "follower")
            entries.append(entry)
            per_host.setdefault(log_host(e["topic"], e["partition"], self.log_hosts), []).append(entry)
        results = []

        def step(done, host, parts) -> None:
            def became(reply: Message) -> None:
                if reply.is_error:
                    results.extend({"topic": e["topic"], "partition": e["partition"],
                                    "error_code": reply.error_code} for e in parts)
                else:
                    for topic, partition, code in reply.fields.parts:
                        results.append({"topic": topic, "partition": partition, "error_code": code})
                        if code == 0:
                            self.hosted[(topic, partition)] = next(
                                e for e in parts if e["topic"] == topic and e["partition"] == partition)
                done()
            self.outbox.request(host, Become(parts), callback=became, timeout=SEND_TIMEOUT)

        def finished() -> None:
            self._tell_fetcher([self.hosted[(e["topic"], e["partition"])] for e in entries
                                if (e["topic"], e["partition"]) in self.hosted])
            self.tell_throttles()
            self.outbox.reply(msg, Response({"error_code": 0, "partitions": results}))
        all_then([lambda d, h=h, ps=ps: step(d, h, ps) for h, ps in per_host.items()], finished)

    def _tell_fetcher(self, entries: list[dict]) -> None:
        follow = [FollowPart(e["topic"], e["partition"], e["leader"], e["leader_epoch"]) for e in entries
                  if e["leader"] != self.broker_id and e["leader"] >= 0]
        unfollow = [[e["topic"], e["partition"]] for e in entries
                    if e["leader"] == self.broker_id or e["leader"] < 0]
        if follow:
            self.outbox.request(REPLICA_FETCHER, Follow(follow, self.leader_addresses), timeout=SEND_TIMEOUT)
        if unfollow:
            self.outbox.request(REPLICA_FETCHER, Unfollow(unfollow), timeout=SEND_TIMEOUT)

    def _update_metadata(self, msg: Message, body: dict) -> None:
        self._watch_broker_epochs()
        self.refresh_broker_epochs()
        old_topics = self.snapshot_data.get("topics", {})
        self.snapshot_data = {"version": body.get("version", 0), "topics": body.get("topics") or {},
                              "brokers": body.get("brokers") or {}, "controller_id": body.get("controller_id", -1),
                              "racks": body.get("racks") or {},
                              "endpoints": body.get("endpoints") or {}}  # each broker's address per listener
        for node, address in self.snapshot_data["brokers"].items():
            self.leader_addresses[node] = address
        # topic config changes reach the log actors hosting their partitions
        per_host: dict[str, list] = {}
        for (topic, partition), entry in self.hosted.items():
            meta = self.snapshot_data["topics"].get(topic)
            if meta is not None and meta.get("configs") != (old_topics.get(topic) or {}).get("configs"):
                config = self.topic_defaults | meta["configs"]
                from odradek.core.config import LogConfig
                entry["config"] = LogConfig.from_properties(config).to_properties()
                per_host.setdefault(log_host(topic, partition, self.log_hosts), []).append(entry)
        for host, parts in per_host.items():
            self.outbox.request(host, Assign(configure=parts), timeout=SEND_TIMEOUT)
        self.tell_throttles()  # a topic's throttled replica lists may have changed
        snapshot = Metadata(self.snapshot())
        self.outbox.send(GROUP_COORDINATOR, snapshot)
        handlers = self.outbox.members(HANDLER)
        steps = [lambda d, h=h: self.outbox.request(h, snapshot, callback=lambda _r: d(),
                                                    timeout=SEND_TIMEOUT) for h in handlers]
        all_then(steps, lambda: self.outbox.reply(msg, Response({"error_code": 0})))

    def _stop_replica(self, msg: Message, body: dict) -> None:
        per_host: dict[str, list] = {}
        gone = []
        for e in body.get("partitions") or []:
            self.hosted.pop((e["topic"], e["partition"]), None)
            gone.append([e["topic"], e["partition"]])
            per_host.setdefault(log_host(e["topic"], e["partition"], self.log_hosts), []).append(
                {"topic": e["topic"], "partition": e["partition"], "topic_id": e.get("topic_id", ""),
                 "delete": bool(body.get("delete"))})
        if gone:
            self.outbox.request(REPLICA_FETCHER, Unfollow(gone), timeout=SEND_TIMEOUT)
            self.tell_throttles()
        steps = [lambda d, h=h, ps=ps: self.outbox.request(h, Assign(close=ps), callback=lambda _r: d(),
                                                           timeout=SEND_TIMEOUT) for h, ps in per_host.items()]
        all_then(steps, lambda: self.outbox.reply(msg, Response({"error_code": 0})))

    def alter_isr(self, msg: Message) -> None:
        """A leader's ISR change: written only if the state node is still at the version the
        leader knows (a deposed leader's write fails), then announced to the controller. An
        unknown outcome (REQUEST_TIMED_OUT: the connection to ZooKeeper failed) is retried by
        the leader, whose retry finds its own earlier write (``write_isr``'s read-back). A
        refusal (INVALID_UPDATE_VERSION) carries what the node holds (``held``: leader,
        leader_epoch, isr, zk_version), so a leader whose earlier change landed unheard learns
        the ISR the controller would elect from."""
        ask = msg.fields
        topic, partition = ask.topic, ask.partition
        st = PartitionState(self.broker_id, ask.leader_epoch, ask.isr, self.seen_controller_epoch)

        def written(version, problem, unknown, held) -> None:
            if problem is not None:
                why = f"{topic}-{partition}: ISR not changed: {problem}"
                code = ErrorCode.REQUEST_TIMED_OUT if unknown else ErrorCode.INVALID_UPDATE_VERSION
                detail = None if held is None else {
                    "leader": held.leader, "leader_epoch": held.leader_epoch, "isr": list(held.isr),
                    "zk_version": held.zk_version}
                self.outbox.post(lambda: self.outbox.reply_error(msg, code, why, detail))
                return
            self.zk.create_async(f"{NOTIFICATIONS}/isr_change_", to_json([[topic, partition]]), sequence=True)
            self.outbox.post(lambda: self.outbox.reply(msg, IsrRecorded(version)))
        write_isr(self.zk, state_path(topic, partition), st, ask.zk_version, written)

    def stop_following(self) -> None:
        """Controlled shutdown: this broker's replicas stop following their leaders."""
        if self.hosted:
            self.outbox.request(REPLICA_FETCHER, Unfollow([list(tp) for tp in self.hosted]), timeout=SEND_TIMEOUT)

    def ask_controlled_shutdown(self, done: Callable[[], None]) -> bool:
        """Ask the active controller (on another broker) to move this broker's leaderships
        away; ``done()`` once it answered or failed. False when no controller is known."""
        def answered(resp, why) -> None:
            if why:
                log.warning("controlled shutdown: %s", why)
            else:
                log.info("controlled shutdown: the controller moved our leaderships (%s left)",
                         len(resp.get("remaining_partitions") or []))
            done()
        return self.to_controller(ApiKey.CONTROLLED_SHUTDOWN, {"broker_id": self.broker_id}, answered,
                                  SEND_TIMEOUT / 2)

    def relay_to_controller(self, msg: Message, api: int) -> None:
        """Not the controller: send a handler's request on to its broker and relay the answer."""
        def relayed(resp, why) -> None:
            if why:
                self.outbox.reply_error(msg, ErrorCode.NOT_CONTROLLER, f"the controller did not answer: {why}")
            else:
                self.outbox.reply(msg, Response(resp))
        if not self.to_controller(api, msg.fields.body or {}, relayed, SEND_TIMEOUT):
            self.outbox.reply_error(msg, ErrorCode.NOT_CONTROLLER, "no controller is known yet; retry")

    def to_controller(self, api: int, body: dict, callback, timeout: float) -> bool:
        """Send a request to the active controller's broker (``relay``, a channel of one);
        False when no controller is known yet."""
        controller = self.snapshot_data.get("controller_id", -1)
        address = self.snapshot_data.get("brokers", {}).get(str(controller))
        if controller < 0 or not address:
            return False
        self.relay.set_brokers({controller: tuple(address)})
        self.relay.send(controller, api, body, callback, timeout=timeout)
        return True


def write_isr(zk, path: str, st: PartitionState, version: int, done) -> None:
    """Write ``st`` to the partition's state node if it is still at ``version``; then
    ``done(new_version, None, False)``. A write that fails is not yet a refusal: the node is
    read back, and if it already holds this leader, epoch and ISR (an earlier write that
    ZooKeeper applied but whose answer was lost with the connection, or this same write),
    the change is done at the node's version, as Kafka's leaders check. Otherwise
    ``done(None, why, unknown, held)``: ``unknown`` when ZooKeeper could not be asked (the
    outcome is not known yet), else ``held`` is the node's state (a PartitionState), which a
    leader adopts when it names it at its own epoch (an earlier change of its own landed).
    ``done`` runs on kazoo's thread."""
    def read_back(result) -> None:
        try:
            raw, stat = result.get()
            now = PartitionState.parse(raw, stat.version)
        except Exception as exc:  # noqa: BLE001 - the connection again: nothing is known
            done(None, f"write failed and the state node could not be read back: {exc!r}", True, None)
            return
        if (now.leader, now.leader_epoch, list(now.isr)) == (st.leader, st.leader_epoch, list(st.isr)):
            done(stat.version, None, False, now)
        else:
            done(None, f"the state node is at version {stat.version} with leader {now.leader}, epoch "
                       f"{now.leader_epoch}, ISR {now.isr}", False, now)

    def written(result) -> None:
        try:
            stat = result.get()
        except Exception:  # noqa: BLE001 - BadVersion, connection loss...: look at what is there
            zk.get_async(path).rawlink(read_back)
            return
        done(stat.version, None, False, None)
    zk.set_async(path, st.data(), version=version).rawlink(written)
