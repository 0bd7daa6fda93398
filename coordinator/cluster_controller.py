"""The controller actor in cluster mode: this broker's ZooKeeper session, its broker agent and,
on the one broker that wins the election, the controller of the cluster.

Process: ``controller`` (one per broker, started first, as in single-broker mode).
Owns: the kazoo client (its threads hand every watch and answer to this actor's loop through
``Actor.post``), this broker's registration ``/brokers/ids/<id>`` (made once it is ready and
its address known), its candidacy for ``/controller``, the controller channel
(``coordinator.channel``) and the relay to the active controller's broker, and, by
composition, objects handed their collaborators (the kazoo client, a channel, the config, an
``Outbox`` of ``coordinator.controller_kit``): ``agent`` (``coordinator.broker_agent``, every
broker: applies the controller's decisions here, owns the replication throttles),
``controller`` (``coordinator.active_controller``, only while this broker is the elected
controller, else None), ``stray_logs`` and ``roster``.
Accepts:
  get_metadata, get_assignment, get_broker_epochs, alter_isr, set_throttle_rates
        -> the agent (``coordinator.broker_agent`` says what each does)
  get_broker_configs, set_broker_configs {configs}   the run-time broker configs, as in
        single-broker mode (``controller_kit.BrokerConfigStore``)
  broker_request {api, body}   LEADER_AND_ISR, UPDATE_METADATA, STOP_REPLICA -> the agent;
        ELECT_LEADERS, CONTROLLED_SHUTDOWN, CREATE_PARTITIONS, ALTER/LIST_PARTITION_REASSIGNMENTS
        -> the active controller, or relayed to its broker
  create_topics, delete_topics, alter_topic_configs {body}   from a handler: the active
        controller, or relayed to its broker over TCP
Sends: what the agent and the active controller send (their headers); ``status`` to the
supervisor (this broker's address, for its registration).
The runtime's ``_drain`` (from the supervisor on SIGTERM) runs the agent's controlled shutdown.
"""
from __future__ import annotations

import json
import logging
import time

from odradek.actors.message import Message
from odradek.actors.messages import Assignment, BrokerConfigs, BrokerEpochs, Done, Metadata, Response, Status
from odradek.actors.runtime import Actor
from odradek.coordinator.active_controller import WRITE_RETRIES, ActiveController
from odradek.coordinator.broker_agent import BrokerAgent
from odradek.coordinator.channel import ControllerChannel
from odradek.coordinator.controller_kit import (SEND_TIMEOUT, ZK_RETRY, BrokerConfigStore, HandlerRoster, Outbox,
                                               remove_deleted_dirs)
from odradek.coordinator.reassignment import MOVE_CHECK_INTERVAL
from odradek.coordinator.stray_logs import STRAY_CHECK_INTERVAL, StrayLogs
from odradek.coordinator.zk_client import bounded_client
from odradek.coordinator.zk_state import BROKERS, CONFIGS, NOTIFICATIONS, TOPICS, to_json
from odradek.network import listeners as listeners_mod
from odradek.network.clientauth import ClientSecurity
from odradek.core.protocol import ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.controller")

REGISTER_RETRY = 0.5  # seconds between attempts to register (an old session's node may linger)


class ClusterController(Actor):
    # ---- start and stop ------------------------------------------------------------------
    def on_start(self) -> None:
        from kazoo.retry import KazooRetry
        config = self.args["config"]
        self.config = config
        self.broker_id = int(self.args.get("broker_id", config["broker.id"]))
        remove_deleted_dirs(self.args["data_dir"])
        self.broker_configs = BrokerConfigStore(self.args["data_dir"])
        self.registered = False
        self.address: tuple[str, int] | None = None
        self.own_endpoints: dict[str, tuple[str, int]] = {}
        self.controller: ActiveController | None = None  # while this broker is the controller
        self.agent: BrokerAgent | None = None  # once ZooKeeper answered
        self.outbox = Outbox.of(self)
        security = ClientSecurity.inter_broker(config, self.broker_id, self.args["data_dir"])  # TLS/SASL, broker proof
        # controller -> brokers: idempotent requests, sent again when a connection goes silent
        self.channel = ControllerChannel(self.post, f"controller-{self.broker_id}", security,
                                         config["controller.socket.timeout.ms"] / 1000)
        # this broker -> the controller: a relayed CreateTopics sent twice would answer "exists"
        self.relay = ControllerChannel(self.post, f"broker-{self.broker_id}", security)
        hosts, _, chroot = config["zookeeper.connect"].partition("/")
        # a blocking call gives up (ConnectionLoss) within the session timeout and well within
        # the supervisor's liveness timeout (``coordinator.zk_client``)
        session_s = config["zookeeper.session.timeout.ms"] / 1000
        self.zk = bounded_client(hosts, session_s, min(session_s, config["supervisor.liveness.timeout.ms"] / 3000),
                                 connection_retry=KazooRetry(max_tries=-1, max_delay=1.0))
        self.zk.add_listener(lambda state: self.post(lambda: self._zk_state(state)))
        self._connect_zookeeper()
        if chroot:
            self.zk.ensure_path("/" + chroot)
            self.zk.chroot = "/" + chroot
        for path in (BROKERS, TOPICS, CONFIGS, NOTIFICATIONS):
            self.zk.ensure_path(path)
        self.agent = BrokerAgent(self.broker_id, config, self.args["log_hosts"], self.args["topic_defaults"],
                                 self.zk, self.relay, self.outbox)
        self.agent.throttles.load()
        self.roster = HandlerRoster(self.outbox, self.agent.snapshot, SEND_TIMEOUT)
        self.stray_logs = StrayLogs(self.args["data_dir"], self.broker_id,
                                    config.get("log.stray.delete.delay.ms", 300000) / 1000, self.args["log_hosts"],
                                    self.request)
        self.call_every(REGISTER_RETRY, self._maybe_register)
        self.call_every(MOVE_CHECK_INTERVAL, lambda: self.controller and self.controller.reassignments.complete())
        self.call_every(STRAY_CHECK_INTERVAL,
                        lambda: self.stray_logs.check(self.agent.snapshot_data, self.agent.hosted))
        if config["auto.leader.rebalance.enable"]:
            self.call_every(config["leader.imbalance.check.interval.seconds"],
                            lambda: self.controller and self.controller.rebalance_preferred_leaders())

    def _connect_zookeeper(self) -> None:
        """Start the session. At the broker's start ZooKeeper out of reach is fatal (as Kafka's
        broker: the operator sees why it did not start); when this actor is restarted in a
        running broker it waits for ZooKeeper instead, as long as it takes, since dying again
        would count against the supervisor's restart limit and stop the whole broker."""
        timeout_ms = self.config["zookeeper.connection.timeout.ms"]
        attempt = 0
        while True:
            try:
                self.zk.start(timeout=timeout_ms / 1000)
                return
            except Exception as exc:  # noqa: BLE001 - kazoo's timeout or a bad host string
                why = (f"cannot reach ZooKeeper at {self.config['zookeeper.connect']!r} within "
                       f"zookeeper.connection.timeout.ms={timeout_ms} ({exc}); is it running?")
                if not self.rejoining or self._stopping:
                    self.zk.close()
                    raise OdradekError(why, ErrorCode.BROKER_NOT_AVAILABLE) from None
                attempt += 1
                self.report_progress(f"{why} (restarted controller actor: trying again, attempt {attempt})")
                if attempt == 1:
                    log.warning("%s; restarted controller actor: trying again until it answers", why)
                time.sleep(min(attempt, 5))

    def on_stop(self) -> None:
        self.channel.close()
        self.relay.close()
        try:
            self.zk.stop()
            self.zk.close()
        except Exception as exc:  # noqa: BLE001 - stopping anyway
            log.warning("closing the ZooKeeper session: %s", exc)

    def stats(self) -> dict:
        c, agent = self.controller, self.agent
        if agent is None:  # still waiting for ZooKeeper in on_start (a heartbeat carries progress)
            return {"registered": False}
        return {"topics": len(c.registry.topics) if c else len(agent.snapshot_data["topics"]),
                "active_controller": c is not None, "controller_epoch": c.epoch if c else agent.seen_controller_epoch,
                "live_brokers": sorted(c.live) if c else None,
                "registered": self.registered, "hosted_partitions": len(agent.hosted),
                "offline_partitions": c.offline_partitions() if c else None}

    def metric_gauges(self) -> list:
        """Kafka's ActiveControllerCount and OfflinePartitionsCount (the latter counted by
        the active controller only, as in Kafka)."""
        c = self.controller
        return [["active_controller", [], int(c is not None)],
                ["offline_partitions", [], c.offline_partitions() if c else 0]]

    # ---- the broker agent's messages -----------------------------------------------------------
    def on_members(self, role: str, members: list[str], retired: list[str]) -> None:
        self.roster.on_members(role, members)
        self.agent.on_members(role, members)

    def on_get_metadata(self, msg: Message) -> None:
        self.reply(msg, Metadata(self.agent.snapshot()))

    def on_get_assignment(self, msg: Message) -> None:
        self.reply(msg, Assignment(self.agent.assignment_of(msg.fields.host)))

    def on_get_broker_epochs(self, msg: Message) -> None:
        """From the fetch actor and the replica fetcher when they start; later changes are pushed."""
        self.reply(msg, BrokerEpochs(self.agent.broker_epochs or {}))

    def on_alter_isr(self, msg: Message) -> None:
        self.agent.alter_isr(msg)

    def on_set_throttle_rates(self, msg: Message) -> None:
        """From a handler (IncrementalAlterConfigs on the broker): ``coordinator.throttles``."""
        self.agent.set_throttle_rates(msg.fields.rates or {})
        self.reply(msg, Done())

    def on_get_broker_configs(self, msg: Message) -> None:
        self.reply(msg, BrokerConfigs(self.broker_configs.values))

    def on_set_broker_configs(self, msg: Message) -> None:
        self.broker_configs.answer_set(msg, self.outbox)

    def on__drain(self, msg: Message) -> None:
        """SIGTERM: before the broker's actors stop, stop following and ask the controller to
        move this broker's leaderships away and take it out of the ISRs (Kafka's controlled
        shutdown), so producers and consumers move on at once instead of after a timeout."""
        if not (self.registered and self.config.get("controlled.shutdown.enable", True)):
            self.reply(msg, Done())
            return
        self.agent.stop_following()
        if self.controller is not None:
            self.controller.move_leadership_away(self.broker_id, lambda _remaining: self.reply(msg, Done()))
            return
        if not self.agent.ask_controlled_shutdown(lambda: self.reply(msg, Done())):
            self.reply(msg, Done())

    # ---- requests for the controller (here, or relayed to its broker) ---------------------------
    def _active_or_relay(self, msg: Message, api: int) -> ActiveController | None:
        """The active controller if this broker is it; else the request is relayed to the
        controller's broker (answered from there) and None."""
        if self.controller is None:
            self.agent.relay_to_controller(msg, api)
        return self.controller

    def on_broker_request(self, msg: Message) -> None:
        api, body = msg.fields.api, msg.fields.body or {}
        if api == ApiKey.CONTROLLED_SHUTDOWN:
            if self.controller is None:
                self.reply(msg, Response({"error_code": int(ErrorCode.NOT_CONTROLLER),
                                          "error_message": f"broker {self.broker_id} is not the controller"}))
            else:
                self.controller.controlled_shutdown(msg, body)
            return
        if api in (ApiKey.ELECT_LEADERS, ApiKey.CREATE_PARTITIONS, ApiKey.ALTER_PARTITION_REASSIGNMENTS,
                   ApiKey.LIST_PARTITION_REASSIGNMENTS):
            c = self._active_or_relay(msg, api)
            if c is None:
                return
            if api == ApiKey.ELECT_LEADERS:
                c.elect_leaders(msg, body)
            elif api == ApiKey.CREATE_PARTITIONS:
                c.reassignments.create_partitions(msg, body)
            elif api == ApiKey.ALTER_PARTITION_REASSIGNMENTS:
                c.reassignments.alter_moves(msg, body)
            else:
                c.reassignments.list_moves(msg, body)
            return
        self.agent.handle_request(msg, api, body)

    def on_create_topics(self, msg: Message) -> None:
        c = self._active_or_relay(msg, ApiKey.CREATE_TOPICS)
        if c is not None:
            c.create_topics(msg)

    def on_delete_topics(self, msg: Message) -> None:
        c = self._active_or_relay(msg, ApiKey.DELETE_TOPICS)
        if c is not None:
            c.delete_topics(msg)

    def on_alter_topic_configs(self, msg: Message) -> None:
        c = self._active_or_relay(msg, ApiKey.INCREMENTAL_ALTER_CONFIGS)
        if c is not None:
            c.alter_topic_configs(msg)

    # ---- session, registration, election ----------------------------------------------------
    def _zk_state(self, state: str) -> None:
        if state == "LOST":
            log.warning("ZooKeeper session lost: this broker is no longer registered%s",
                        " and resigns as controller" if self.controller is not None else "")
            self.registered = False
            self._resign()
        elif state == "CONNECTED" and not self.registered:
            self._maybe_register()
        elif state == "CONNECTED" and self.agent is not None:
            # back in the same session after a break: what the watches on /brokers/ids missed
            # (a broker that registered again meanwhile; ``ActiveController.refresh_live_brokers``)
            self.agent.refresh_broker_epochs()
            if self.controller is not None:
                self.controller.refresh_live_brokers(reread=True)

    def _maybe_register(self) -> None:
        """Register once this broker is ready (its listener's address known), then stand for
        election. Retried: a crashed predecessor's node lingers until its session expires."""
        if self.registered:
            return
        if self.address is None:
            self._ask_address()
            return
        from kazoo.exceptions import NodeExistsError
        host, port = self.address
        listeners = listeners_mod.of_config(self.config)
        try:
            self.zk.create(f"{BROKERS}/{self.broker_id}", to_json({
                "host": host, "port": port, "version": 4, "rack": self.config.get("broker.rack") or None,
                # Kafka's registration: every listener's advertised address, and its protocol
                "endpoints": [f"{name}://{h}:{p}" for name, (h, p) in self.own_endpoints.items()],
                "listener_security_protocol_map": {l.name: l.protocol for l in listeners},
                "timestamp": int(time.time() * 1000)}), ephemeral=True)
        except NodeExistsError:
            log.info("broker id %d is still registered by an earlier session; waiting for it to expire",
                     self.broker_id)
            return
        except Exception as exc:  # noqa: BLE001 - ZooKeeper unreachable: the timer retries
            log.warning("cannot register in ZooKeeper: %s", exc)
            return
        self.registered = True
        log.info("broker %d registered at %s", self.broker_id,
                 ", ".join(f"{name}://{h}:{p}" for name, (h, p) in self.own_endpoints.items()))
        self.zk.DataWatch("/controller", lambda data, stat: self.post(self._elect) or None)

    def _ask_address(self) -> None:
        """Every listener's advertised address (``advertised.listeners``, else the bound one;
        an advertised port 0 is the bound port: a proxy in front of the listener), from the
        supervisor once the acceptor has bound them; ``address`` is the inter-broker one's."""
        def learned(status: Message) -> None:
            sup = status.fields.supervisor if not status.is_error else {}
            bound = sup.get("listeners") or {}
            if not bound or self.address is not None:
                return
            endpoints = {}
            for name, (host, port) in listeners_mod.advertised(self.config).items():
                b_host, _, b_port = str(bound.get(name, "")).rpartition(":")
                if not b_port:
                    return  # not bound yet
                endpoints[name] = (host if self.config.get("advertised.listeners") else b_host, port or int(b_port))
            self.own_endpoints = endpoints
            self.address = endpoints[listeners_mod.inter_broker(self.config).name]
            self._maybe_register()
        if self.supervisor:
            self.request(self.supervisor, Status(), callback=learned, timeout=5.0)

    def _elect(self) -> None:
        """Stand for election: create ``/controller`` and bump ``/controller_epoch`` in one
        transaction (so nobody ever sees the new controller with the old epoch)."""
        if not self.registered or self.controller is not None:
            return
        from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
        me = to_json({"brokerid": self.broker_id, "version": 1, "timestamp": int(time.time() * 1000)})
        for _ in range(WRITE_RETRIES):
            try:
                if self.zk.exists("/controller"):
                    return
                try:
                    raw, stat = self.zk.get("/controller_epoch")
                    epoch, version = int(raw) + 1, stat.version
                except NoNodeError:
                    epoch, version = 1, -1
                t = self.zk.transaction()
                t.create("/controller", me, ephemeral=True)
                if version < 0:
                    t.create("/controller_epoch", b"1")
                else:
                    t.set_data("/controller_epoch", str(epoch).encode(), version=version)
                results = t.commit()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper unreachable: tried again shortly
                self._stand_again(f"controller election failed: {exc!r}")
                return
            if isinstance(results[0], NodeExistsError):
                return  # someone else won
            if isinstance(results[1], (BadVersionError, NodeExistsError)):
                continue  # another candidate moved the epoch meanwhile: try again
            if any(isinstance(r, Exception) for r in results):
                self._stand_again(f"controller election failed: {results}")
                return
            log.info("broker %d is the controller (epoch %d)", self.broker_id, epoch)
            self.controller = ActiveController(
                self.broker_id, epoch, 0 if version < 0 else results[1].version, self.config,
                self.args["topic_defaults"], listeners_mod.inter_broker(self.config).name, self.zk, self.channel,
                self.outbox, self._resign)
            try:
                self.controller.load()
            except Exception as exc:  # noqa: BLE001 - ZooKeeper did not answer: a partial view must not rule
                self._resign()
                self._stand_again(f"the new controller could not read the cluster's state ({exc!r}); resigned")
            return

    def _stand_again(self, why: str) -> None:
        """An election ZooKeeper did not answer is tried again, not left to the watch: back in
        the same session, kazoo's watch of /controller calls nobody when the node is as it was
        (absent), and nobody would stand."""
        log.warning("%s; standing again in %gs", why, ZK_RETRY)
        self.call_later(ZK_RETRY, self._elect)

    def _resign(self) -> None:
        """No longer the controller (session lost, or fenced): its object is dropped."""
        if self.controller is not None:
            log.warning("broker %d is no longer the controller", self.broker_id)
            self.controller.active = False
            self.controller = None
        self.channel.set_brokers({})
        try:  # if /controller still names us (a session that survived), let an election happen
            raw, _ = self.zk.get("/controller")
            if json.loads(raw).get("brokerid") == self.broker_id:
                self.zk.delete("/controller")
        except Exception:  # noqa: BLE001 - gone already, or ZooKeeper unreachable
            pass
