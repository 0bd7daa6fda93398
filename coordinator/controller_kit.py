"""What the two controller actors share, by composition: the single-broker one
(``coordinator.controller.Controller``) and the cluster one
(``coordinator.cluster_controller.ClusterController``, with its ``BrokerAgent`` and, once
elected, its ``ActiveController``).

Process: ``controller`` (plain objects and functions; no actor of its own, no messages).
``BrokerConfigStore`` keeps the broker configs Kafka changes at run time and Odradek does
not implement (each controller actor answers ``get_broker_configs`` / ``set_broker_configs``
from it).
``Outbox`` is the one way the controller's parts (and the transaction coordinator's, in its
process) send messages: the actor's own ``send``,
``request``, ``reply``, ``reply_error``, ``post`` (the thread-safe entry, for kazoo's and
the channel's threads), the running members of a role, a timer, and the chained messages of
``Actor.expect``/``answer_chained``, handed to each part explicitly.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from typing import Any, Callable

from odradek.actors.messages import Done, Metadata
from odradek.actors.names import HANDLER
from odradek.log.files import FileLayer
from odradek.core.protocol import ErrorCode, OdradekError

log = logging.getLogger("odradek.controller")

SEND_TIMEOUT = 30.0  # seconds another broker or a local actor has to answer the controller
ZK_RETRY = 1.0  # seconds before trying again what ZooKeeper did not answer (a read, an election)


@dataclasses.dataclass(frozen=True)
class Outbox:
    send: Callable[..., Any]
    request: Callable[..., Any]
    reply: Callable[..., Any]
    reply_error: Callable[..., Any]
    post: Callable[[Callable[[], Any]], None]
    members: Callable[[str], list]  # role -> the names of its running instances
    later: Callable[[float, Callable[[], Any]], Any]  # the actor's call_later
    # a request's answer or a message sent by another actor on this one's behalf (``then``)
    expect: Callable[..., int] | None = None
    cancel_request: Callable[[int], None] | None = None
    answer_chained: Callable[..., list] | None = None
    answered_elsewhere: Callable[[Any], None] | None = None
    call: Callable[..., Any] | None = None  # a blocking request (only while starting)

    @classmethod
    def of(cls, actor) -> Outbox:
        return cls(actor.send, actor.request, actor.reply, actor.reply_error, actor.post,
                   lambda role: actor.members.get(role, []), actor.call_later, actor.expect, actor.cancel_request,
                   actor.answer_chained, actor.answered_elsewhere, actor.call)


class HandlerRoster:
    """A handler that joined after its own ``get_metadata`` may have missed a push: every new
    one is sent the current ``snapshot()``."""

    def __init__(self, outbox: Outbox, snapshot: Callable[[], dict], timeout: float):
        self.outbox, self.snapshot, self.timeout = outbox, snapshot, timeout
        self.known: set[str] = set()

    def on_members(self, role: str, members: list[str]) -> None:
        if role == HANDLER:
            snapshot = Metadata(self.snapshot())
            for name in set(members) - self.known:
                self.outbox.request(name, snapshot, timeout=self.timeout)
            self.known = set(members)


class BrokerConfigStore:
    """This broker's run-time values of Kafka's dynamic broker configs that Odradek accepts
    without implementing them (``odradek.kafka_configs.DYNAMIC``; the handler checks each one
    as Kafka does before it gets here): ``<log.dirs>/meta/broker_configs.json``, replaced
    atomically, so DescribeConfigs reports them after a restart too, as Kafka keeps its
    dynamic configs. ``values``: ``{name: value as text}``."""

    def __init__(self, data_dir: str):
        self.path = os.path.join(data_dir, "meta", "broker_configs.json")
        self.values: dict[str, str] = {}
        try:
            with open(self.path) as f:
                self.values = {str(k): str(v) for k, v in json.load(f).get("configs", {}).items()}
        except FileNotFoundError:
            pass
        except (OSError, ValueError, AttributeError) as exc:
            log.warning("%s unreadable (%s): the broker's run-time configs start empty", self.path, exc)

    def apply(self, changes: dict) -> None:
        """``{name: value, or None to remove it}``; KAFKA_STORAGE_ERROR if it cannot be
        written (nothing changed then)."""
        new = {**self.values, **{k: str(v) for k, v in changes.items() if v is not None}}
        for name in [k for k, v in changes.items() if v is None]:
            new.pop(name, None)
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            FileLayer().write_file_atomically(self.path, json.dumps({"configs": new}, indent=1,
                                                                    sort_keys=True).encode())
        except OSError as exc:
            raise OdradekError(f"could not write {self.path}: {exc.strerror or exc}; nothing was changed",
                               ErrorCode.KAFKA_STORAGE_ERROR) from None
        self.values = new
        for name, value in changes.items():
            log.warning("broker config %r %s at run time: accepted as Kafka does, but it has no effect in Odradek",
                        name, "removed" if value is None else f"set to {value!r}")

    def answer_set(self, msg, outbox: Outbox) -> None:
        """``set_broker_configs`` (``SetBrokerConfigs``): answered ``Done`` once written, else its error."""
        try:
            self.apply(dict(msg.fields.configs or {}))
        except OdradekError as exc:
            outbox.reply_error(msg, exc.code, exc.message)
            return
        outbox.reply(msg, Done())


def remove_deleted_dirs(data_dir: str) -> None:
    """Partition directories of deleted topics that a crash left behind."""
    for name in os.listdir(data_dir):
        if name.endswith("-delete") and os.path.isdir(os.path.join(data_dir, name)):
            log.info("removing %s, left over from a deleted topic", name)
            shutil.rmtree(os.path.join(data_dir, name), ignore_errors=True)


def all_then(steps: list[Callable[[Callable], None]], done: Callable) -> None:
    """Run ``steps`` (each takes a completion callback) in parallel, then ``done``."""
    pending = {"n": len(steps)}
    if not steps:
        done()
        return

    def one() -> None:
        pending["n"] -= 1
        if pending["n"] == 0:
            done()
    for step in steps:
        step(one)
