"""The active controller: what the one broker holding ``/controller`` does as the controller of
the cluster. Made by the cluster's controller actor (``coordinator.cluster_controller``) when
it wins the election, dropped when it loses it (session lost, or fenced by a newer epoch).

Process: ``controller`` (a plain object inside the actor; no mailbox of its own).
Handed: ``broker_id``, ``epoch`` and ``epoch_zk_version`` (what the election wrote to
``/controller_epoch``; every write is a transaction that checks that version, so a deposed
controller cannot write), ``config`` and ``topic_defaults``, ``inter_broker_name`` (the
listener other brokers are reached on), ``zk`` (the actor's kazoo client), ``channel`` (the
actor's ``ControllerChannel`` to every broker), ``outbox`` (``controller_kit.Outbox``: how it
answers handlers and comes back to the actor's loop from kazoo's threads) and ``resign``
(the actor's, called when a fenced write shows another controller).
Owns partition state: the topic registry (from ZooKeeper), the assignment of replicas, each
partition's (leader, epoch, ISR), the live brokers, and the moves in progress
(``coordinator.reassignment.Reassignments``). It elects leaders when brokers die or return,
takes the ISR notifications of leaders, rebalances preferred leaders, answers
ELECT_LEADERS, CONTROLLED_SHUTDOWN and the topic changes a handler sends to the actor
(create_topics / delete_topics / alter_topic_configs), and sends LEADER_AND_ISR,
UPDATE_METADATA and STOP_REPLICA to the brokers over ``channel``. Paths and JSON:
``coordinator.zk_state``; messages: docs/REPLICATION.md.
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Callable

from odradek.actors.message import Message
from odradek.actors.messages import Response
from odradek.coordinator.controller_kit import SEND_TIMEOUT, ZK_RETRY, Outbox, all_then
from odradek.coordinator.reassignment import Reassignments, check_target, place_replicas
from odradek.coordinator.topics import Topic, TopicRegistry
from odradek.coordinator.zk_state import (BROKERS, CONFIGS, NOTIFICATIONS, TOPICS, PartitionState, parse_topic,
                                          state_path, to_json, topic_data)
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError, is_internal_topic

log = logging.getLogger("odradek.controller")

WRITE_RETRIES = 5


class ActiveController:
    def __init__(self, broker_id: int, epoch: int, epoch_zk_version: int, config, topic_defaults: dict,
                 inter_broker_name: str, zk, channel, outbox: Outbox, resign: Callable[[], None]):
        self.broker_id, self.epoch, self.epoch_zk_version = broker_id, epoch, epoch_zk_version
        self.config, self.topic_defaults, self.inter_broker_name = config, topic_defaults, inter_broker_name
        self.zk, self.channel, self.outbox, self.resign = zk, channel, outbox, resign
        self.active = True  # False once fenced: late watch events and timers do nothing
        self.registry = TopicRegistry(None, topic_defaults, default_partitions=config["num.partitions"],
                                      default_replication=config["default.replication.factor"], max_replication=1,
                                      min_segment_bytes=config["log.segment.bytes.min"])
        self.live: dict[int, tuple[str, int]] = {}  # live broker -> its inter-broker listener's address
        self.endpoints: dict[int, dict[str, list]] = {}  # live broker -> listener name -> [host, port]
        self.live_epochs: dict[int, int] = {}  # broker id -> czxid of its registration
        self.racks: dict[int, str | None] = {}  # live broker -> its broker.rack
        self.assignment: dict[str, list[list[int]]] = {}
        self.states: dict[tuple[str, int], PartitionState] = {}
        self.metadata_counter = 0
        self.shutting_down: set[int] = set()  # brokers in a controlled shutdown: never elected
        # what a live broker did not acknowledge (no answer within the channel's deadline: a
        # network partition, a paused broker) and is sent again, coalesced: Kafka's controller
        # retries a request to a live broker until it is delivered, else a broker the
        # partition cut off never learns it leads a partition (nobody serves it)
        self.unsent_leader_and_isr: dict[int, set] = {}
        self.unsent_metadata: set[int] = set()
        self.reassignments = Reassignments(self, zk, outbox)

    def offline_partitions(self) -> int:
        return sum(1 for s in self.states.values() if s.leader < 0)

    def place(self, partitions: int, rf: int, first_partition: int = 0) -> list[list[int]]:
        """Replicas for new partitions over the live brokers (``reassignment.place_replicas``)."""
        return place_replicas(self.live, self.racks, partitions, rf, first_partition)

    def commit_or_raise(self, t, what: str) -> list:
        """Commit a controller transaction; OdradekError (NOT_CONTROLLER if fenced, else
        UNKNOWN_SERVER_ERROR naming ``what``) unless every operation in it succeeded."""
        result = self._fenced_commit(t)
        if result is None:
            raise OdradekError("this broker stopped being the controller; retry", ErrorCode.NOT_CONTROLLER)
        failed = [r for r in result if isinstance(r, Exception)]
        if failed:
            raise OdradekError(f"cannot record {what} in ZooKeeper: {failed[0]!r}", ErrorCode.UNKNOWN_SERVER_ERROR)
        return result

    def _fenced(self) -> None:
        """Another broker is the controller now: this object stops acting (its watches end at
        their next event) and the actor drops it."""
        self.active = False
        self.resign()

    def _fenced_commit(self, t) -> list | None:
        """Commit a transaction whose first operation checks our controller epoch. None when
        that check failed: another broker is the controller now, and this one resigns. (Any
        other failing operation fails the whole transaction too, but only the check's result
        is a BadVersionError in the first place; the others come back RolledBackError.)"""
        from kazoo.exceptions import BadVersionError
        result = t.commit()
        if isinstance(result[0], BadVersionError):
            log.error("controller epoch %d is stale (a newer controller wrote /controller_epoch): resigning",
                      self.epoch)
            self._fenced()
            return None
        return result

    # ---- the controller: loading and watching --------------------------------------------------
    def load(self) -> None:
        """A new controller reads everything back, elects leaders where needed and tells every
        broker the whole state (LEADER_AND_ISR for its replicas, UPDATE_METADATA). A topic
        whose nodes are malformed is skipped; ZooKeeper not answering (``KazooException``)
        fails the whole load: a controller that skipped a topic for it would manage the
        cluster without it (the caller resigns and stands again)."""
        from kazoo.exceptions import NoNodeError
        for name in self.zk.get_children(TOPICS):
            try:
                raw, _ = self.zk.get(f"{TOPICS}/{name}")
                d, parts, adding, removing = parse_topic(raw)
                configs = {}
                if self.zk.exists(f"{CONFIGS}/{name}"):
                    configs = json.loads(self.zk.get(f"{CONFIGS}/{name}")[0]).get("config", {})
                self.registry.topics[name] = Topic(name, d["topic_id"], len(parts), len(parts[0]), configs,
                                                   d.get("created_ms", 0))
                self.assignment[name] = parts
                self.reassignments.load(name, parts, adding, removing)
                for p in range(len(parts)):
                    raw, stat = self.zk.get(state_path(name, p))
                    self.states[(name, p)] = PartitionState.parse(raw, stat.version)
            except (NoNodeError, ValueError, KeyError, IndexError, TypeError) as exc:
                log.error("topic %s in ZooKeeper is unreadable, skipped: %r", name, exc)
        self.registry.version = 0
        self.live, self.live_epochs = {}, {}
        self.zk.ChildrenWatch(BROKERS, self._watch_brokers)
        self.zk.ChildrenWatch(NOTIFICATIONS, self._watch_notifications)

    def _watch_brokers(self, children) -> bool:
        if not self.active:
            return False
        self.outbox.post(lambda: self._brokers_changed(children))
        return True

    def _watch_notifications(self, children) -> bool:
        if not self.active:
            return False
        if children:
            self.outbox.post(lambda: self._isr_changes(children))
        return True

    def _brokers_changed(self, children) -> None:
        """``children``: the ids under /brokers/ids. Each registration is read; one that
        vanished meanwhile (or is malformed) is a broker gone. ZooKeeper not answering is not
        knowing: the live set is kept as it was and read again shortly, since taking the
        brokers whose registration could not be read for dead would move their leaderships
        and empty ISRs (every partition offline if no read answered)."""
        from kazoo.exceptions import NoNodeError
        if not self.active:
            return
        live, epochs, endpoints = {}, {}, {}
        for child in children:
            try:
                raw, stat = self.zk.get(f"{BROKERS}/{child}")
                d = json.loads(raw)
                endpoints[int(child)] = registered_endpoints(d)
                # reached on our inter-broker listener's name (all brokers use the same names)
                live[int(child)] = tuple(endpoints[int(child)].get(self.inter_broker_name) or (d["host"], d["port"]))
                self.racks[int(child)] = d.get("rack")
                epochs[int(child)] = stat.czxid  # the broker epoch (KIP-380): new with each registration
            except (NoNodeError, ValueError, KeyError, TypeError) as exc:  # vanished meanwhile, or malformed
                log.info("broker %s: %r", child, exc)
            except Exception as exc:  # noqa: BLE001 - ZooKeeper did not answer: nothing is known
                log.warning("cannot read the registration of broker %s (%r): the live brokers stay %s, "
                            "read again in %gs", child, exc, sorted(self.live), ZK_RETRY)
                self.outbox.later(ZK_RETRY, lambda: self.refresh_live_brokers(reread=True))
                return
        gone, joined = set(self.live) - set(live), set(live) - set(self.live)
        # A broker that left and registered again between two looks (the watch saw both
        # changes at once) has a new epoch: it restarted and must be told everything again.
        bounced = {b for b in live if b in self.live_epochs and self.live_epochs[b] != epochs.get(b)}
        if bounced:
            log.info("brokers %s registered again (new broker epochs)", sorted(bounced))
        joined |= bounced
        self.live_epochs = epochs
        self.shutting_down -= gone | joined
        first = not self.live
        self.live = live
        self.endpoints = endpoints
        self.registry.max_replication = max(len(live), 1)
        self.channel.set_brokers(live)
        if gone:
            log.info("brokers %s left the cluster", sorted(gone))
        if joined:
            log.info("brokers %s joined the cluster", sorted(joined))
        changed = self._elect_where_needed(gone)
        everyone = first or bool(changed)
        for b in (live if first else joined):
            self.send_leader_and_isr(b, [tp for tp in self.states if b in self.replicas(tp)])
        for tp in changed:
            for b in self.replicas(tp):
                if b in live and (first or b not in joined):
                    self.send_leader_and_isr(b, [tp])
        if everyone or joined or gone:
            self.send_update_metadata()

    def refresh_live_brokers(self, reread: bool = False) -> None:
        """Catch up with ``/brokers/ids`` now, not when the watch's event arrives: a topic
        created just after brokers joined must see them all. ``reread``: read every
        registration even if the ids are the same, after a break in our connection to
        ZooKeeper (the session kept): kazoo's ChildrenWatch then re-reads the children but
        calls nobody when the ids are the same, so a broker that registered again meanwhile
        (a new broker epoch, which ``_brokers_changed`` compares) would never be told its
        partitions."""
        if not self.active:
            return
        try:
            children = self.zk.get_children(BROKERS)
        except Exception:  # noqa: BLE001 - ZooKeeper did not answer: read again shortly
            self.outbox.later(ZK_RETRY, lambda: self.refresh_live_brokers(reread=True))
            return
        if reread or {int(c) for c in children} != set(self.live):
            self._brokers_changed(children)

    def replicas(self, tp: tuple[str, int]) -> list[int]:
        return self.assignment[tp[0]][tp[1]]

    def _elect_where_needed(self, gone: set[int]) -> list[tuple[str, int]]:
        """New leaders for partitions whose leader is not alive; dead brokers leave ISRs."""
        changes = {}
        for tp, st in self.states.items():
            isr_live = [r for r in st.isr if r in self.live]
            if st.leader in self.live and len(isr_live) == len(st.isr):
                continue
            if st.leader in self.live:
                changes[tp] = (st.leader, isr_live)  # a follower died: it leaves the ISR
                continue
            new = self.choose_leader(tp, isr_live)
            if new is None:
                if st.leader != -1:
                    log.error("%s-%d: no live in-sync replica (ISR %s): offline", tp[0], tp[1], st.isr)
                    changes[tp] = (-1, st.isr)  # keep the last ISR: one of them may come back
                continue
            changes[tp] = (new, isr_live if new in isr_live else [new])
        return self.write_states(changes)

    def choose_leader(self, tp: tuple[str, int], isr_live: list[int]) -> int | None:
        for r in self.replicas(tp):
            if r in isr_live and r not in self.shutting_down:
                return r
        if self.registry.log_config(tp[0]).unclean_leader_election_enable:
            for r in self.replicas(tp):
                if r in self.live:
                    log.warning("%s-%d: unclean election of broker %d (out of sync)", tp[0], tp[1], r)
                    return r
        return None

    def write_states(self, changes: dict) -> list[tuple[str, int]]:
        """Write new (leader, ISR) states, each with its leader epoch bumped, fenced by our
        controller epoch. A state a leader changed meanwhile is re-read and recomputed."""
        from kazoo.exceptions import BadVersionError, NoNodeError
        written = []
        for tp, (leader, isr) in changes.items():
            for _ in range(WRITE_RETRIES):
                st = self.states[tp]
                new = PartitionState(leader, st.leader_epoch + 1, isr, self.epoch)
                t = self.zk.transaction()
                t.check("/controller_epoch", self.epoch_zk_version)
                t.set_data(state_path(*tp), new.data(), version=st.zk_version)
                result = self._fenced_commit(t)
                if result is None:
                    return written
                if isinstance(result[1], BadVersionError):
                    raw, stat = self.zk.get(state_path(*tp))
                    self.states[tp] = fresh = PartitionState.parse(raw, stat.version)
                    again = self._recheck(tp, leader, isr, fresh)
                    if again is None:
                        break
                    leader, isr = again
                    continue
                if isinstance(result[1], (Exception, NoNodeError)):
                    log.error("%s-%d: state write failed: %s", tp[0], tp[1], result[1])
                    break
                new.zk_version = result[1].version
                self.states[tp] = new
                written.append(tp)
                log.info("%s-%d: leader %d, epoch %d, ISR %s", tp[0], tp[1], leader, new.leader_epoch, isr)
                break
        return written

    def _recheck(self, tp: tuple[str, int], leader: int, isr: list[int],
                 fresh: PartitionState) -> tuple[int, list[int]] | None:
        """A change computed from a state its leader changed meanwhile (an ISR it shrank or
        grew, found by the conditional write failing), checked against the ``fresh`` state as
        Kafka's controller re-runs an election that lost such a race: it never names a leader
        or an ISR member the fresh ISR left out (an out-of-sync leader would truncate away
        acknowledged records). A leader that fell out of the ISR meanwhile is chosen again
        from the fresh ISR (None: nothing to change, the fresh leader is alive and leads)."""
        live_isr = [r for r in fresh.isr if r in self.live]
        unclean = self.registry.topics.get(tp[0]) is not None and \
            self.registry.log_config(tp[0]).unclean_leader_election_enable
        if leader == -1:
            return -1, list(fresh.isr)  # offline: the ISR its leader last recorded (one may come back)
        if leader == fresh.leader:
            return leader, live_isr or isr  # the same leader: the fresh ISR's live part
        if leader in fresh.isr or unclean:
            return leader, [r for r in isr if r in fresh.isr] or [leader]
        if fresh.leader in self.live and fresh.leader not in self.shutting_down:
            log.info("%s-%d: broker %d left the ISR meanwhile (now %s): broker %d keeps leading", tp[0], tp[1],
                     leader, fresh.isr, fresh.leader)
            return None
        new = self.choose_leader(tp, live_isr)
        log.info("%s-%d: broker %d left the ISR meanwhile (now %s): choosing again: %s", tp[0], tp[1], leader,
                 fresh.isr, "offline" if new is None else f"broker {new}")
        return (-1, fresh.isr) if new is None else (new, live_isr if new in live_isr else [new])

    def _isr_changes(self, children) -> None:
        """Leaders changed ISRs: re-read those states and tell every broker."""
        if not self.active:
            return
        touched = set()
        for child in children:
            path = f"{NOTIFICATIONS}/{child}"
            try:
                for topic, partition in json.loads(self.zk.get(path)[0]):
                    touched.add((topic, partition))
                self.zk.delete(path)
            except Exception:  # noqa: BLE001 - another controller took it, or it is gone
                continue
        for tp in touched:
            if tp in self.states:
                raw, stat = self.zk.get(state_path(*tp))
                self.states[tp] = PartitionState.parse(raw, stat.version)
        if touched:
            self.send_update_metadata()
        if touched & set(self.reassignments.moves):
            self.reassignments.complete()

    def rebalance_preferred_leaders(self) -> None:
        if not self.active:
            return
        changes = {}
        for tp, st in self.states.items():
            preferred = self.replicas(tp)[0]
            if st.leader != preferred and preferred in self.live and preferred in st.isr \
                    and preferred not in self.shutting_down:
                changes[tp] = (preferred, st.isr)
        self._apply_leader_changes(changes)

    def _apply_leader_changes(self, changes: dict) -> list:
        written = self.write_states(changes)
        for tp in written:
            for b in self.replicas(tp):
                if b in self.live:
                    self.send_leader_and_isr(b, [tp])
        if written:
            self.send_update_metadata()
        return written

    # ---- the controller: requests to brokers ----------------------------------------------------
    def _partition_entry_full(self, tp: tuple[str, int]) -> dict:
        st = self.states[tp]
        t = self.registry.get(tp[0])
        return {"topic": tp[0], "partition": tp[1], "topic_id": t.topic_id, "leader": st.leader,
                "leader_epoch": st.leader_epoch, "isr": st.isr, "replicas": self.replicas(tp),
                "adding_replicas": self.reassignments.moves[tp].adding if tp in self.reassignments.moves else [],
                "removing_replicas": self.reassignments.moves[tp].removing if tp in self.reassignments.moves else [],
                "zk_version": st.zk_version, "config": self.registry.log_config(tp[0]).to_properties()}

    def send_leader_and_isr(self, broker: int, tps: list, done: Callable | None = None,
                             failed: list | None = None) -> None:
        """``failed``, if given, collects ``(topic, partition, broker, error_code)`` of the
        replicas the broker could not open (a full disk), or of all when it did not answer."""
        if not tps:
            if done:
                done()
            return
        body = {"controller_id": self.broker_id, "controller_epoch": self.epoch,
                "partitions": [self._partition_entry_full(tp) for tp in tps],
                "brokers": [{"node_id": b, "host": h, "port": p} for b, (h, p) in self.live.items()]}

        def answered(resp, why) -> None:
            if why:
                log.warning("LEADER_AND_ISR to broker %d: %s", broker, why)
                self._send_again(broker, tps)
            if failed is not None:
                if why:
                    failed.extend((t, p, broker, int(ErrorCode.REQUEST_TIMED_OUT)) for t, p in tps)
                for e in (resp or {}).get("partitions") or ():
                    if e.get("error_code"):
                        failed.append((e["topic"], e["partition"], broker, int(e["error_code"])))
            if done:
                done()
        self.channel.send(broker, ApiKey.LEADER_AND_ISR, body, answered, timeout=SEND_TIMEOUT)

    def _metadata_body(self) -> dict:
        self.metadata_counter += 1
        topics = {}
        for name, t in self.registry.topics.items():
            state = []
            for p in range(t.partitions):
                st = self.states[(name, p)]
                state.append({"leader": st.leader if st.leader in self.live else -1, "leader_epoch": st.leader_epoch,
                              "isr": st.isr, "replicas": self.replicas((name, p))})
            topics[name] = {"id": t.topic_id, "partitions": t.partitions, "replication_factor": t.replication_factor,
                            "configs": t.configs, "state": state}
        return {"controller_id": self.broker_id, "controller_epoch": self.epoch,
                "version": (self.epoch << 32) + self.metadata_counter,
                "brokers": {str(b): [h, p] for b, (h, p) in self.live.items()}, "topics": topics,
                "endpoints": {str(b): self.endpoints.get(b) or {} for b in self.live},  # per listener name
                "racks": {str(b): self.racks.get(b) for b in self.live if self.racks.get(b)}}

    def send_update_metadata(self, done: Callable | None = None) -> None:
        """UPDATE_METADATA to every live broker; ``done`` once each answered (or failed)."""
        body = self._metadata_body()

        all_then([lambda d, b=b: self._update_metadata_of(b, body, d) for b in list(self.live)], done or (lambda: None))

    def _update_metadata_of(self, broker: int, body: dict, finished: Callable[[], None] = lambda: None) -> None:
        def answered(_resp, why) -> None:
            if why:
                log.warning("UPDATE_METADATA to broker %d: %s", broker, why)
                self._send_again(broker, None)
            finished()
        self.channel.send(broker, ApiKey.UPDATE_METADATA, body, answered, timeout=SEND_TIMEOUT)

    def _send_again(self, broker: int, tps: list | None) -> None:
        """A LEADER_AND_ISR for ``tps`` (or, with None, an UPDATE_METADATA) that ``broker`` did
        not answer: while it stays live and this is the controller, it is sent again with the
        partitions' *current* state (one request at a time per broker: failures meanwhile
        join it). The channel itself retries until its deadline, so a broker that stays
        unreachable gets one attempt per deadline."""
        if not self.active or broker not in self.live:
            return
        first = broker not in self.unsent_leader_and_isr and broker not in self.unsent_metadata
        if tps is None:
            self.unsent_metadata.add(broker)
        else:
            self.unsent_leader_and_isr.setdefault(broker, set()).update(tps)
        if first:
            self.outbox.post(lambda: self._resend(broker))

    def _resend(self, broker: int) -> None:
        tps = self.unsent_leader_and_isr.pop(broker, set())
        metadata = broker in self.unsent_metadata
        self.unsent_metadata.discard(broker)
        if not self.active or broker not in self.live:
            return
        tps = sorted(tp for tp in tps if tp in self.states and broker in self.replicas(tp))
        log.info("sending broker %d again what it did not acknowledge: %s%s", broker,
                 f"LEADER_AND_ISR for {len(tps)} partition(s)" if tps else "",
                 (" and " if tps and metadata else "") + ("UPDATE_METADATA" if metadata else ""))
        self.send_leader_and_isr(broker, tps)
        if metadata:
            self._update_metadata_of(broker, self._metadata_body())

    # ---- announcing -----------------------------------------------------------------------------
    def announce(self, tps: list, stops: dict[int, list], done: Callable[[], None], failed: list | None = None) -> None:
        """LEADER_AND_ISR to the live replicas of ``tps`` (the replicas they could not open go
        to ``failed``, if given), STOP_REPLICA (delete) to the replicas in ``stops``
        ({broker: [tp]}), then UPDATE_METADATA to everyone, then ``done``."""
        per_broker: dict[int, list] = {}
        for tp in tps:
            for b in self.replicas(tp):
                if b in self.live:
                    per_broker.setdefault(b, []).append(tp)
        steps = [lambda d, b=b, t=t: self.send_leader_and_isr(b, t, d, failed) for b, t in per_broker.items()]
        steps += [lambda d, b=b, t=t: self._send_stop_replica(b, t, d) for b, t in stops.items() if b in self.live]
        all_then(steps, lambda: self.send_update_metadata(done))

    def _send_stop_replica(self, broker: int, tps: list, done: Callable[[], None]) -> None:
        parts = [{"topic": t, "partition": p, "topic_id": self.registry.topics[t].topic_id}
                 for t, p in tps if t in self.registry.topics]
        self.channel.send(broker, ApiKey.STOP_REPLICA, {"controller_id": self.broker_id, "controller_epoch": self.epoch,
                                                        "delete": True, "partitions": parts},
                          lambda _r, why: (why and log.warning("STOP_REPLICA to broker %d: %s", broker, why), done()),
                          SEND_TIMEOUT)

    # ---- topic changes (from a handler) --------------------------------------------------------
    def create_topics(self, msg: Message) -> None:
        body = msg.fields.body or {}
        validate_only = bool(body.get("validate_only"))
        results, created = [], []
        self.refresh_live_brokers()
        for req in body.get("topics") or []:
            name = req.get("name") if isinstance(req, dict) else None
            try:
                if not isinstance(req, dict):
                    raise OdradekError("each topic must be a map", ErrorCode.INVALID_REQUEST)
                rf = req.get("replication_factor")
                if is_internal_topic(name) and isinstance(rf, int):
                    rf = max(1, min(rf, len(self.live)))  # capped at the live brokers
                parts, rf, configs = self.registry.validate_create(name, req.get("num_partitions"), rf,
                                                                   req.get("configs"))
                placed = req.get("assignments")  # an explicit assignment (Kafka's CreateTopics), else placed here
                for p, replicas in enumerate(placed or ()):
                    check_target(self.live, (name, p), replicas)
                if not validate_only:
                    self._create_in_zookeeper(name, parts, rf, configs, placed or None)
                    created.append(name)
                results.append({"name": name, "error_code": 0, "num_partitions": parts, "replication_factor": rf})
            except OdradekError as exc:
                results.append({"name": name, "error_code": int(exc.code), "error_message": exc.message})
        answer = lambda: self.outbox.reply(msg, Response({"topics": results}))  # noqa: E731
        if not created:
            answer()
            return
        tps = [(n, p) for n in created for p in range(self.registry.topics[n].partitions)]
        failed: list = []
        self.announce(tps, {}, lambda: self._settle_created(created, failed, results, answer), failed=failed)

    def _settle_created(self, created: list[str], failed: list, results: list, answer: Callable[[], None]) -> None:
        """New topics some of whose replicas could not be opened (a full disk; issue 16,
        defect 4): a partition keeps the replicas that opened (its leader among them, its
        ISR just them: the others stay offline until their broker is told again, at its
        restart or the next change); a topic with a partition none of whose replicas
        opened is deleted again and refused with the replicas' error. Never a topic
        answered as created with a partition that has no leader."""
        bad: dict[tuple, dict[int, int]] = {}
        for t, p, b, code in failed:
            if t in created and (t, p) in self.states:
                bad.setdefault((t, p), {})[b] = code
        if not bad:
            answer()
            return
        undo: dict[str, tuple] = {}
        changes = {}
        for tp, codes in sorted(bad.items()):
            st = self.states[tp]
            ok = [r for r in st.isr if r not in codes and r in self.live]
            if not ok:
                code = next(iter(codes.values()))
                undo.setdefault(tp[0], (code, f"no replica of partition {tp[1]} could be created (brokers "
                                              f"{sorted(codes)}: {ErrorCode(code).name})"))
            else:
                changes[tp] = (st.leader if st.leader in ok else ok[0], ok)
                log.warning("%s-%d: replicas on brokers %s could not be created (%s); leader %d, ISR %s",
                            tp[0], tp[1], sorted(codes), [ErrorCode(c).name for c in codes.values()],
                            changes[tp][0], ok)
        written = self.write_states({tp: c for tp, c in changes.items() if tp[0] not in undo})
        stops: dict[int, list] = {}
        for name, (code, why) in undo.items():
            try:
                for b, parts in self._delete_in_zookeeper(name).items():
                    stops.setdefault(b, []).extend(parts)
            except OdradekError as exc:
                why += f"; and undoing it failed: {exc.message}"
            log.error("creating topic %s failed, undone: %s", name, why)
            for result in results:
                if result.get("name") == name:
                    result.clear()
                    result.update(name=name, error_code=code, error_message=f"topic '{name}' was not created: {why}")
        self.announce(written, {}, lambda: self._stop_deleted(stops, answer))

    def _stop_deleted(self, stops: dict[int, list], done: Callable[[], None]) -> None:
        """STOP_REPLICA (delete) to the live brokers of deleted topics' replicas (``{broker:
        [{topic, partition, topic_id}]}`` from ``_delete_in_zookeeper``), then ``done``."""
        def stop(d, b, parts) -> None:
            self.channel.send(b, ApiKey.STOP_REPLICA, {"controller_id": self.broker_id, "controller_epoch": self.epoch,
                                                       "delete": True, "partitions": parts},
                              lambda _r, _w: d(), SEND_TIMEOUT)
        all_then([lambda d, b=b, t=t: stop(d, b, t) for b, t in stops.items() if b in self.live], done)

    def _create_in_zookeeper(self, name: str, partitions: int, rf: int, configs: dict,
                             assignment: list | None = None) -> None:
        assignment = assignment or self.place(partitions, rf)
        topic = Topic(name, uuid.uuid4().hex, partitions, rf, configs, int(time.time() * 1000))
        t = self.zk.transaction()
        t.check("/controller_epoch", self.epoch_zk_version)
        t.create(f"{TOPICS}/{name}", topic_data(topic.topic_id, topic.created_ms, assignment, {}, {}))
        t.create(f"{CONFIGS}/{name}", to_json({"version": 1, "config": configs}))
        t.create(f"{TOPICS}/{name}/partitions")
        states = []
        for p, replicas in enumerate(assignment):
            live = [r for r in replicas if r in self.live]
            st = PartitionState(live[0] if live else -1, 0, live, self.epoch, 0)
            states.append(st)
            t.create(f"{TOPICS}/{name}/partitions/{p}")
            t.create(state_path(name, p), st.data())
        self.commit_or_raise(t, f"topic '{name}'")
        self.registry.topics[name] = topic
        self.registry.version += 1
        self.assignment[name] = assignment
        for p, st in enumerate(states):
            self.states[(name, p)] = st
        log.info("created topic %s: %d partitions, replicas %s", name, partitions, assignment)

    def _delete_in_zookeeper(self, name: str) -> dict[int, list[dict]]:
        """Delete topic ``name``'s nodes (one fenced transaction) and forget it; returns the
        STOP_REPLICA entries its replicas need, ``{broker: [{topic, partition, topic_id}]}``."""
        topic = self.registry.get(name)
        t = self.zk.transaction()
        t.check("/controller_epoch", self.epoch_zk_version)
        for p in range(topic.partitions):
            t.delete(state_path(name, p))
            t.delete(f"{TOPICS}/{name}/partitions/{p}")
        t.delete(f"{TOPICS}/{name}/partitions")
        t.delete(f"{TOPICS}/{name}")
        t.delete(f"{CONFIGS}/{name}")
        result = self._fenced_commit(t)
        if result is None:
            raise OdradekError("this broker stopped being the controller; retry", ErrorCode.NOT_CONTROLLER)
        if any(isinstance(r, Exception) for r in result):
            raise OdradekError(f"cannot delete '{name}' in ZooKeeper: {result}", ErrorCode.UNKNOWN_SERVER_ERROR)
        stops: dict[int, list[dict]] = {}
        for p in range(topic.partitions):
            for b in self.replicas((name, p)):
                stops.setdefault(b, []).append({"topic": name, "partition": p, "topic_id": topic.topic_id})
            self.states.pop((name, p), None)
            self.reassignments.moves.pop((name, p), None)
        del self.registry.topics[name]
        self.assignment.pop(name, None)
        return stops

    def delete_topics(self, msg: Message) -> None:
        body = msg.fields.body or {}
        results, stops = [], {}
        for name in body.get("topics") or []:
            try:
                if not isinstance(name, str):
                    raise OdradekError("topic names must be strings", ErrorCode.INVALID_REQUEST)
                for b, parts in self._delete_in_zookeeper(name).items():
                    stops.setdefault(b, []).extend(parts)
                log.info("deleted topic %s", name)
                results.append({"name": name, "error_code": 0})
            except OdradekError as exc:
                results.append({"name": name, "error_code": int(exc.code), "error_message": exc.message})
        answer = lambda: self.outbox.reply(msg, Response({"topics": results}))  # noqa: E731
        self.send_update_metadata(lambda: self._stop_deleted(stops, answer))

    def alter_topic_configs(self, msg: Message) -> None:
        body = msg.fields.body or {}
        validate_only = bool(body.get("validate_only"))
        results = []
        for res in body.get("resources") or []:
            name = res.get("name") if isinstance(res, dict) else None
            try:
                topic = self.registry.get(name)
                changed = dict(topic.configs)
                for c in res.get("configs") or []:
                    if c.get("op", "set") == "delete":
                        changed.pop(c["name"], None)
                    else:
                        changed[c["name"]] = c.get("value")
                checked = self.registry._checked_configs(changed)
                if not validate_only:
                    t = self.zk.transaction()
                    t.check("/controller_epoch", self.epoch_zk_version)
                    t.set_data(f"{CONFIGS}/{name}", to_json({"version": 1, "config": checked}))
                    result = self._fenced_commit(t)
                    if result is None:
                        raise OdradekError("this broker stopped being the controller; retry", ErrorCode.NOT_CONTROLLER)
                    if any(isinstance(r, Exception) for r in result):
                        raise OdradekError(f"cannot record the change in ZooKeeper: {result}",
                                           ErrorCode.UNKNOWN_SERVER_ERROR)
                    topic.configs = checked
                results.append({"type": "topic", "name": name, "error_code": 0})
            except (OdradekError, KeyError, TypeError, AttributeError) as exc:
                code = exc.code if isinstance(exc, OdradekError) else ErrorCode.INVALID_REQUEST
                text = exc.message if isinstance(exc, OdradekError) else f"malformed config change: {exc}"
                results.append({"type": "topic", "name": name, "error_code": int(code), "error_message": text})
        self.send_update_metadata(lambda: self.outbox.reply(msg, Response({"resources": results})))

    # ---- controlled shutdown -------------------------------------------------------------------
    def controlled_shutdown(self, msg: Message, body: dict) -> None:
        if not self.active:
            self.outbox.reply(msg, Response({"error_code": int(ErrorCode.NOT_CONTROLLER),
                                             "error_message": f"broker {self.broker_id} is not the controller"}))
            return
        broker = body.get("broker_id")
        if broker not in self.live:
            self.outbox.reply(msg, Response({"error_code": int(ErrorCode.BROKER_NOT_AVAILABLE),
                                             "error_message": f"broker {broker!r} is not registered"}))
            return
        self.move_leadership_away(broker, lambda remaining: self.outbox.reply(msg, Response({
            "error_code": 0, "remaining_partitions": [{"topic": t, "partition": p} for t, p in remaining]})))

    def move_leadership_away(self, broker: int, done: Callable[[list], None]) -> None:
        """New leaders for what ``broker`` leads, and it leaves every ISR; ``done(remaining)``
        once the replicas were told (remaining: partitions with no other in-sync replica)."""
        self.shutting_down.add(broker)
        changes, remaining = {}, []
        for tp, st in self.states.items():
            if broker not in self.replicas(tp):
                continue
            others = [r for r in st.isr if r != broker and r in self.live]
            if st.leader == broker:
                new = self.choose_leader(tp, others)
                if new is None:
                    remaining.append(tp)
                else:
                    changes[tp] = (new, others)
            elif broker in st.isr and others:
                changes[tp] = (st.leader, others)
        written = self.write_states(changes)
        per_broker: dict[int, list] = {}
        for tp in written:
            for b in self.replicas(tp):
                if b in self.live:
                    per_broker.setdefault(b, []).append(tp)
        log.info("controlled shutdown of broker %d: %d partitions changed, %d could not move", broker,
                 len(written), len(remaining))
        steps = [lambda d, b=b, t=t: self.send_leader_and_isr(b, t, d) for b, t in per_broker.items()]
        all_then(steps, lambda: self.send_update_metadata(lambda: done(remaining)))

    def elect_leaders(self, msg: Message, body: dict) -> None:
        """ELECT_LEADERS (preferred): move each partition's leadership to its first replica."""
        wanted = body.get("topic_partitions")  # null: every partition (Kafka's); [] none
        tps = [tp for tp in self.states] if wanted is None else [
            (t["topic"], p) for t in wanted for p in t.get("partitions") or []]
        results, changes = [], {}
        for tp in tps:
            st = self.states.get(tp)
            entry = {"topic": tp[0], "partition": tp[1], "error_code": 0}
            if st is None:
                entry.update(error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), error_message="no such partition")
            elif st.leader == self.replicas(tp)[0]:
                entry.update(error_code=int(ErrorCode.ELECTION_NOT_NEEDED), error_message="already led by it")
            elif self.replicas(tp)[0] not in self.live or self.replicas(tp)[0] not in st.isr:
                entry.update(error_code=int(ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE),
                             error_message=f"preferred replica {self.replicas(tp)[0]} is not alive and in sync")
            else:
                changes[tp] = (self.replicas(tp)[0], st.isr)
            results.append(entry)
        self._apply_leader_changes(changes)
        self.outbox.reply(msg, Response({"error_code": 0, "partitions": results}))


def registered_endpoints(registration: dict) -> dict[str, list]:
    """Listener name -> [host, port] of a ``/brokers/ids/<id>`` node's ``endpoints``
    (``NAME://host:port``, as Kafka writes them); {} for a registration without them."""
    out = {}
    for url in registration.get("endpoints") or ():
        name, sep, rest = str(url).partition("://")
        host, _, port = rest.rpartition(":")
        if sep and host and port.isdigit():
            out[name.upper()] = [host.strip("[]"), int(port)]
    return out
