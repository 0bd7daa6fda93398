"""The transaction coordinator's marker writer: a prepared transaction's commit or abort
markers written to its partitions, then the transaction completed and its EndTxn answered.

Process: ``txn_coordinator`` (a plain object its actor owns, ``coordinator.txn_coordinator``).
Owns: the ids whose markers are in flight (``in_flight``), the EndTxn requests answered once
their markers land (``waiting_end``), one ``MarkerPeer`` per other broker (a worker thread
and its connection), the cache of live brokers' registration epochs (``broker_epochs``).
Collaborators, handed in: the broker's ``TxnSite``, the ``TxnStateLog`` (the transactions,
the snapshot whose leaders say where markers go, the records), the actor's ``Outbox``, the
wall ``clock`` (ms), the inter-broker listener's ``security`` and ``released(txn_id)`` (the
markers of an id are no longer in flight: the requests parked for it go on).
Sends: ``write_markers`` to the log actors hosting the transaction's partitions led here
(acks=all), ``txn_offsets_end`` to the group coordinator, WRITE_TXN_MARKERS (TCP) to the
leaders of the others, retried every ``MARKER_RETRY`` until each leader accepted;
``get_broker_epochs`` to the controller.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

from odradek.actors.message import REPLY, Message
from odradek.actors.names import CONTROLLER, GROUP_COORDINATOR, log_host
from odradek.actors.messages import (Chained, GetBrokerEpochs, OffsetsStored, PartOutcome, Response, TxnMarker,
                                     TxnOffsetsEnd, WriteMarkers, chain_sent)
from odradek.coordinator.controller_kit import Outbox
from odradek.coordinator.offsets import offsets_leaders, partition_for
from odradek.coordinator.transaction import COMPLETE, PREPARING, Transaction, TxnState
from odradek.coordinator.txn_state_log import TxnSite, TxnStateLog, topic_leaders
from odradek.network.client import BrokerConnection
from odradek.core.protocol import OFFSETS_TOPIC, TXN_STATE_TOPIC, ApiKey, ErrorCode, OdradekError

log = logging.getLogger("odradek.txn")

MARKER_TIMEOUT = 30.0  # seconds a log actor (or another broker) has to write markers before the coordinator retries
MARKER_RETRY = 0.5
# markers are answered once replicated to the ISR (as Kafka appends them with acks=all), before
# the coordinator's own request timeout
MARKERS_TIMEOUT_MS = int((MARKER_TIMEOUT - 5) * 1000)
CONNECT_TIMEOUT_MS = 1000
STOP_JOIN_TIMEOUT_MS = 3000
DELETED_AFTER_MS = 1000  # a partition missing from a snapshot this much newer than the transaction: deleted


class MarkerPeer:
    """One other broker: a worker thread with its own blocking ``BrokerConnection`` sends
    WRITE_TXN_MARKERS (and forwarded TXN_OFFSET_COMMITs) one at a time and posts each
    outcome, ``done(body, error)``, to the actor's loop (threads never touch the actor's
    sockets)."""

    def __init__(self, broker: int, host: str, port: int, client_id: str, post: Callable, security=None):
        """``security``: the inter-broker listener's TLS/SASL (``ClientSecurity.inter_broker``),
        None for PLAINTEXT: ``host:port`` is the other broker's inter-broker listener."""
        self.broker, self.address = broker, (host, int(port))
        self._post = post
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.conn = BrokerConnection(host, int(port), client_id=client_id, connect_timeout_ms=CONNECT_TIMEOUT_MS,
                                     reconnect_backoff_ms=50, reconnect_backoff_max_ms=500, security=security)
        self.thread = threading.Thread(target=self._run, name=f"txn-markers-{broker}", daemon=True)
        self.thread.start()

    def submit(self, body: dict, timeout: float, done: Callable, api: int = ApiKey.WRITE_TXN_MARKERS) -> None:
        self._jobs.put((api, body, timeout, done))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            api, body, timeout, done = job
            try:
                outcome = (self.conn.request(api, body, timeout=timeout).body, None)
            except OdradekError as exc:
                outcome = (None, exc)
            except Exception as exc:  # noqa: BLE001 - a socket oddity: report it, keep the thread
                outcome = (None, OdradekError(f"{type(exc).__name__}: {exc}", ErrorCode.NETWORK_EXCEPTION))
            self._post(lambda done=done, outcome=outcome: done(*outcome))

    def close(self) -> None:
        self._jobs.put(None)
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001 - best effort at shutdown
            pass


class MarkerWriter:
    def __init__(self, site: TxnSite, state: TxnStateLog, outbox: Outbox, clock: Callable[[], int], security,
                 released: Callable[[str], None], peer: Callable[..., MarkerPeer] = MarkerPeer):
        self.site, self.state, self.outbox, self.clock = site, state, outbox, clock
        self.security, self.released, self.peer = security, released, peer
        self.in_flight: set[str] = set()
        self.waiting_end: dict[str, list[Message]] = {}  # EndTxn requests answered when markers land
        self.peers: dict[int, MarkerPeer] = {}  # other brokers, for WRITE_TXN_MARKERS
        self.broker_epochs: dict[int, int] = {}  # live broker id -> czxid of its registration (cluster mode)
        self.sent_remote = 0
        self.received_remote = 0

    def close(self) -> None:
        for peer in self.peers.values():
            peer.close()
        deadline = self.clock() + STOP_JOIN_TIMEOUT_MS
        for peer in self.peers.values():
            peer.thread.join(max(0.0, (deadline - self.clock()) / 1000))

    # ---- the EndTxn requests waiting for the markers -----------------------------------------
    def wait_end(self, txn_id: str, msg: Message) -> None:
        self.waiting_end.setdefault(txn_id, []).append(msg)

    def fail_end(self, txn_id: str, code: int, why: str) -> None:
        for waiting in self.waiting_end.pop(txn_id, ()):
            self.outbox.reply_error(waiting, code, why)

    def drop(self, txn_id: str, why: str) -> None:
        """``txn_id`` went to another broker: what waits for its markers gets NOT_COORDINATOR."""
        self.in_flight.discard(txn_id)
        self.fail_end(txn_id, ErrorCode.NOT_COORDINATOR, f"transactional id {txn_id!r}: {why}")

    def forget_chained(self, chain: list) -> None:
        """Chained messages that will not be sent: forget the requests among them (an answer
        to our requester carries the requester's correlation id, not one of ours)."""
        for item in map(Chained._make, chain):
            if item.type != REPLY:
                self.outbox.cancel_request(item.corr)

    # ---- writing them ------------------------------------------------------------------------
    def route(self, t: Transaction, commit: bool) -> tuple[dict, dict, list, bool]:
        """Where ``t``'s pending markers go: ``({log host or group coordinator: markers or
        offsets}, {broker: {"markers", "offsets"}}, [partitions with nothing to write],
        some group's offsets have nowhere to go now)``, from the latest snapshot's leaders.
        A partition without a leader now is left pending (retried)."""
        local: dict = {}
        remote: dict[int, dict] = {}
        nothing = []
        unrouted = False
        site, snapshot = self.site, self.state.snapshot
        coordinator_epoch = max(self.state.owned.get(self.state.partition_of(t.txn_id), 0), 0)
        leaders_of: dict[str, dict[int, int]] = {}

        def leader(topic: str, partition: int) -> int | None:
            if topic not in leaders_of:
                leaders_of[topic] = topic_leaders(snapshot, topic)
            return leaders_of[topic].get(partition)  # None: the topic or partition is gone

        for topic, partition in sorted(t.pending_markers):
            if topic == OFFSETS_TOPIC:  # the groups' coordinators store (or, on abort, never see) the offsets
                offsets = {g: t.offsets[g] for g in sorted(t.groups) if t.offsets.get(g)} if commit else {}
                if not offsets:
                    nothing.append((topic, partition))
                    continue
                n = len(offsets_leaders(snapshot, site.broker_id))
                for g, entries in offsets.items():
                    at = leader(OFFSETS_TOPIC, partition_for(g, n)) if n else site.broker_id
                    at = site.broker_id if at is None or not site.cluster_mode else at
                    if at == site.broker_id:
                        local.setdefault(GROUP_COORDINATOR, {})[g] = entries
                    elif at >= 0:
                        remote.setdefault(at, {"markers": [], "offsets": {}})["offsets"][g] = entries
                    else:
                        unrouted = True  # the group's coordinator has no leader now: retried
                continue
            at = leader(topic, partition) if site.cluster_mode else site.broker_id
            if at is None and self.state.snapshot_ms > t.updated_ms + DELETED_AFTER_MS:
                nothing.append((topic, partition))  # deleted: nothing left to mark
            elif at is None:
                self.state.refresh_metadata()  # a topic newer than our snapshot: retried with the next one
            elif at == site.broker_id:
                local.setdefault(log_host(topic, partition, site.log_hosts), []).append(
                    TxnMarker(topic, partition, t.producer_id, t.epoch, commit, coordinator_epoch))
            elif at >= 0:
                remote.setdefault(at, {"markers": [], "offsets": {}})["markers"].append(
                    TxnMarker(topic, partition, t.producer_id, t.epoch, commit, coordinator_epoch))
        return local, remote, nothing, unrouted

    def write(self, t: Transaction, chain: list | None = None, end: Message | None = None) -> bool:
        """Send the pending markers of ``t`` to the log actors hosting its partitions here and
        to the leaders of the others; when all landed the transaction completes and waiting
        EndTxn requests are answered. What failed is retried after ``MARKER_RETRY``.
        With ``chain`` (before the PREPARE record is stored): only if every marker goes to an
        actor of this broker, their messages are put in ``chain`` for the record's log actor
        to send, and True is returned; else nothing is done and False returned. If then the
        markers go to one log actor and ``end`` (the EndTxn request) is all that waits, that
        log actor answers it once they are written (one hop less)."""
        if t.txn_id in self.in_flight or not self.state.current(t) or t.state not in PREPARING:
            return False
        commit = t.state == TxnState.PREPARE_COMMIT
        local, remote, nothing, unrouted = self.route(t, commit)
        if chain is not None and (remote or nothing or unrouted or not local):
            return False
        if nothing:
            self.done(t, nothing)
            if not self.state.current(t) or t.state not in PREPARING:
                return False
        if not local and not remote:
            self.outbox.later(MARKER_RETRY, lambda: self.write(t))  # leaders unknown for now
            return False
        self.in_flight.add(t.txn_id)
        left = {"n": len(local) + len(remote), "written": [], "failed": False,
                "offsets_unrouted": unrouted}

        def parts_done(parts, offsets_ok: bool | None) -> None:
            for topic, partition, code, message in parts:
                if code == 0 or code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                    left["written"].append((topic, partition))
                elif code == ErrorCode.TRANSACTION_COORDINATOR_FENCED:
                    left["failed"] = True  # a newer coordinator owns the id: it goes with our next snapshot
                    log.warning("transaction %r: marker on %s-%s refused, a newer coordinator wrote one (%s)",
                                t.txn_id, topic, partition, message)
                    self.state.refresh_metadata()
                else:
                    left["failed"] = True
                    log.info("transaction %r: marker on %s-%s not written (%s); retrying", t.txn_id, topic,
                             partition, message)
            if offsets_ok is False:
                left["failed"] = True

        def one_done() -> None:
            left["n"] -= 1
            if left["n"]:
                return
            self.in_flight.discard(t.txn_id)
            if self.state.current(t):
                # the offsets' pseudo-partition is done once every group's offsets are stored
                written = [w for w in left["written"] if w[0] != OFFSETS_TOPIC]
                if not left["failed"] and not left["offsets_unrouted"] and (OFFSETS_TOPIC, 0) in t.pending_markers:
                    written.append((OFFSETS_TOPIC, 0))
                self.done(t, written)
                if t.state in PREPARING:
                    self.outbox.later(MARKER_RETRY, lambda: self.write(t))
            self.released(t.txn_id)

        def local_answered(reply: Message) -> None:
            answer = reply.fields
            if reply.is_error:
                left["failed"] = True
                log.info("transaction %r: markers not written: %s", t.txn_id, reply.error_message)
            elif type(answer) is OffsetsStored:  # the group coordinator's answer
                parts_done([], not answer.error_code)
                if answer.error_code:
                    log.info("transaction %r: offsets not stored: %s", t.txn_id, answer.message)
            else:
                if answer_with is not None and chain_sent(answer):  # its log actor answered the EndTxn
                    waiting = self.waiting_end.get(t.txn_id)
                    if waiting is not None and answer_with in waiting:
                        waiting.remove(answer_with)
                        if not waiting:
                            del self.waiting_end[t.txn_id]
                    self.outbox.answered_elsewhere(answer_with)
                parts_done(answer.parts, None)
            one_done()

        answer_with = None  # the EndTxn the markers' log actor answers (then not we)
        if chain is not None and end is not None and len(local) == 1 and GROUP_COORDINATOR not in local \
                and end.reply_to and self.waiting_end.get(t.txn_id) == [end]:
            answer_with = end
        for host, markers in local.items():
            if host == GROUP_COORDINATOR:
                body = TxnOffsetsEnd(t.producer_id, markers, commit)
            else:
                body = WriteMarkers(markers, -1, MARKERS_TIMEOUT_MS, [] if answer_with is None else [
                    self.outbox.answer_chained(answer_with, Response({"error_code": 0}))])
            if chain is None:
                self.outbox.request(host, body, callback=local_answered, timeout=MARKER_TIMEOUT)
            else:
                chain.append(Chained(host, body.TYPE, body, self.outbox.expect(local_answered, host, body.TYPE,
                                                                               MARKER_TIMEOUT)))

        def remote_answered(broker: int, body: dict | None, error: OdradekError | None) -> None:
            if error is not None:
                left["failed"] = True
                log.info("transaction %r: WRITE_TXN_MARKERS to broker %d failed: %s", t.txn_id, broker,
                         error.message)
                if error.code == ErrorCode.STALE_BROKER_EPOCH:
                    self.broker_epochs = {}  # ours may have changed (a new registration): ask again
            else:
                parts_done(body.get("parts") or (), all(code == 0 for _g, code, _m in body.get("groups") or ()))
            one_done()

        for broker, request in remote.items():
            self._send_remote(broker, {"producer_id": t.producer_id, "commit": commit, **request},
                              lambda body, error, b=broker: remote_answered(b, body, error))
        return True

    def done(self, t: Transaction, written) -> None:
        """Markers landed on ``written``; once all have, the transaction is complete, its
        EndTxn requests answered and its COMPLETE record deferred."""
        if not self.state.current(t):
            return
        t = self.state.txns.markers_written(t.txn_id, written, self.clock())
        if t.state in COMPLETE:
            for msg in self.waiting_end.pop(t.txn_id, ()):
                self.outbox.reply(msg, Response({"error_code": 0}))
            log.debug("transaction %r %s", t.txn_id, t.state.value)
            self.state.defer_complete(t)

    # ---- other brokers -------------------------------------------------------------------------
    def broker_peer(self, broker: int, address) -> MarkerPeer:
        peer = self.peers.get(broker)
        if peer is None or peer.address != (address[0], int(address[1])):
            if peer is not None:
                peer.close()
            peer = self.peers[broker] = self.peer(broker, address[0], address[1],
                                                  f"broker-{self.site.broker_id}-txn", self.outbox.post,
                                                  self.security)
        return peer

    def _send_remote(self, broker: int, request: dict, done: Callable) -> None:
        """WRITE_TXN_MARKERS to ``broker`` with this broker's identity (its id and the epoch of
        its live registration, which the receiver checks)."""
        address = (self.state.snapshot.get("brokers") or {}).get(str(broker))
        if not address or not address[1]:
            done(None, OdradekError(f"broker {broker}'s address is not known here", ErrorCode.LEADER_NOT_AVAILABLE))
            return

        def with_epoch(epoch: int | None) -> None:
            if epoch is None:
                done(None, OdradekError(f"broker {self.site.broker_id}'s own registration is not known yet",
                                        ErrorCode.STALE_BROKER_EPOCH))
                return
            peer = self.broker_peer(broker, address)
            self.sent_remote += 1
            peer.submit({"broker_id": self.site.broker_id, "broker_epoch": epoch, **request}, MARKER_TIMEOUT, done)
        self.broker_epoch(self.site.broker_id, with_epoch)

    def broker_epoch(self, broker: int, then: Callable, refresh: bool = False) -> None:
        """``then(epoch)`` of ``broker``'s live registration (None if it has none), from the
        cache or, when missing or ``refresh``, from the broker agent."""
        if broker in self.broker_epochs and not refresh:
            then(self.broker_epochs[broker])
            return

        def learned(reply: Message) -> None:
            if not reply.is_error:
                self.broker_epochs = {int(b): int(e) for b, e in (reply.fields.epochs or {}).items()}
            then(self.broker_epochs.get(broker))
        self.outbox.request(CONTROLLER, GetBrokerEpochs(), callback=learned, timeout=10.0)

    def forward_offsets(self, msg: Message, txn_id: str, body: dict) -> bool:
        """TXN_OFFSET_COMMIT reaches the *group's* coordinator (Kafka clients send it there;
        Kafka keeps the pending offsets with the group), but here the transaction holds them:
        a broker that does not coordinate ``txn_id`` passes the request on to the one that
        does and relays its answer. False if that broker is not known now."""
        snapshot = self.state.snapshot
        leader = topic_leaders(snapshot, TXN_STATE_TOPIC).get(self.state.partition_of(txn_id), -1)
        address = (snapshot.get("brokers") or {}).get(str(leader)) if leader >= 0 else None
        if not self.site.cluster_mode or leader == self.site.broker_id or not address or not address[1]:
            return False

        def done(answer: dict | None, error: OdradekError | None) -> None:
            if error is not None:
                self.outbox.reply_error(msg, error.code, f"broker {leader}, the coordinator of transactional id "
                                                         f"{txn_id!r}: {error.message}")
            else:
                self.outbox.reply(msg, Response(answer))
        self.broker_peer(leader, address).submit(body, MARKER_TIMEOUT, done, api=ApiKey.TXN_OFFSET_COMMIT)
        return True

    # ---- markers from another broker's coordinator (WRITE_TXN_MARKERS) -------------------------
    def receive(self, msg: Message, broker: int, claimed: int, markers: list, offsets: dict, commit: bool,
                producer_id) -> None:
        """Another broker's coordinator writing markers here: its identity (``broker`` and
        the ``claimed`` epoch of its live registration) checked, then the markers written."""
        def checked(known: int | None) -> None:
            if known != claimed or broker == self.site.broker_id:
                self.outbox.reply_error(msg, ErrorCode.STALE_BROKER_EPOCH,
                                        f"broker {broker} with broker_epoch {claimed} is not a live broker of this "
                                        f"cluster (only another broker's transaction coordinator may write markers)")
                return
            self.received_remote += 1
            self.write_here(msg, markers, offsets, commit, producer_id)
        self.broker_epoch(broker, lambda known: checked(known) if known == claimed
                          else self.broker_epoch(broker, checked, refresh=True))

    def write_here(self, msg: Message, markers: list[TxnMarker], offsets: dict, commit: bool, producer_id) -> None:
        """Markers written by the log actors leading their partitions here, and offsets stored
        by this broker's group coordinator; ``msg`` answered with each one's outcome."""
        per_host: dict[str, list] = {}
        for m in markers:
            per_host.setdefault(log_host(m.topic, m.partition, self.site.log_hosts), []).append(m)
        out = {"parts": [], "groups": []}
        left = {"n": len(per_host) + (1 if offsets else 0)}

        def one_done() -> None:
            left["n"] -= 1
            if left["n"] == 0:
                self.outbox.reply(msg, Response({"error_code": 0, **out}))

        def logs_answered(reply: Message, sent: list) -> None:
            if reply.is_error:
                out["parts"] += [PartOutcome(m.topic, m.partition, reply.error_code, reply.error_message) for m in sent]
            else:
                out["parts"] += [list(p) for p in reply.fields.parts]
            one_done()

        def groups_answered(reply: Message) -> None:
            code = reply.error_code if reply.is_error else reply.fields.error_code
            why = reply.error_message if reply.is_error else reply.fields.message
            out["groups"] += [[g, code, why] for g in offsets]
            one_done()

        if not left["n"]:
            self.outbox.reply(msg, Response({"error_code": 0, **out}))
            return
        for host, sent in per_host.items():
            self.outbox.request(host, WriteMarkers(sent, -1, MARKERS_TIMEOUT_MS),
                                callback=lambda reply, sent=sent: logs_answered(reply, sent), timeout=MARKER_TIMEOUT)
        if offsets:
            self.outbox.request(GROUP_COORDINATOR, TxnOffsetsEnd(producer_id, offsets, commit),
                                callback=groups_answered, timeout=MARKER_TIMEOUT)
