"""The controller's channel to other brokers: one sender thread per broker (Kafka's
ControllerChannelManager).

Runs inside the ``controller`` actor's process. Each destination broker gets a worker thread
owning one blocking ``network.client.BrokerConnection``; requests to a broker are sent in
order, one at a time. Answers go back to the actor's loop through ``post`` (the only
thread-safe entry point of an actor), as ``callback(body, None)`` or ``callback(None, why)``.
Threads never touch the actor's ZeroMQ sockets. Connections go to the brokers' inter-broker
listener, with its TLS and SASL (``inter.broker.listener.name``, docs/SECURITY.md). A broker that cannot be reached is retried
with a short backoff until the request's own deadline; a broker removed from the channel
fails its queued requests. One attempt waits at most ``attempt_timeout``
(``controller.socket.timeout.ms``) for its answer: a connection that went silent (a
partition that swallowed the request, a middlebox that forgot the connection) is closed and
the request sent again on a new one, rather than waiting out the whole deadline on a
connection that will never answer; the requests are idempotent (same controller epoch).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable

from odradek.network.client import BrokerConnection
from odradek.core.protocol import OdradekError

log = logging.getLogger("odradek.controller.channel")

RETRY_BACKOFF = 0.2  # seconds between attempts to reach a broker
CONNECT_TIMEOUT_MS = 1000
Callback = Callable[[Any, Any], None]


class _Sender:
    def __init__(self, broker_id: int, host: str, port: int, post: Callable, client_id: str, security=None,
                 attempt_timeout: float = 30.0):
        self.broker_id, self.address = broker_id, (host, port)
        self.post, self.client_id, self.security = post, client_id, security
        self.attempt_timeout = attempt_timeout
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self.run, name=f"controller-to-{broker_id}", daemon=True)
        self.thread.start()

    def run(self) -> None:
        conn = None
        while True:
            item = self.queue.get()
            if item is None:
                break
            api, body, callback, deadline = item
            answer, why = None, "not sent"
            while time.monotonic() < deadline:
                try:
                    wait = max(min(deadline - time.monotonic(), self.attempt_timeout), 0.1)
                    if conn is None:
                        conn = BrokerConnection(*self.address, client_id=self.client_id,
                                                request_timeout_ms=int(wait * 1000),
                                                connect_timeout_ms=CONNECT_TIMEOUT_MS, security=self.security)
                    answer = conn.request(api, body, timeout=wait).body
                    why = None
                    break
                except (OSError, OdradekError) as exc:
                    why = f"broker {self.broker_id} at {self.address[0]}:{self.address[1]}: {exc}"
                    if conn is not None:
                        conn.close()
                        conn = None
                    if self.queue.qsize() and self._stopping():
                        break
                    time.sleep(RETRY_BACKOFF)
            self.post(lambda cb=callback, a=answer, w=why: cb(a, w))
        if conn is not None:
            conn.close()

    def _stopping(self) -> bool:
        with self.queue.mutex:
            return any(i is None for i in self.queue.queue)

    def stop(self) -> None:
        self.queue.put(None)


class ControllerChannel:
    def __init__(self, post: Callable, client_id: str, security=None, attempt_timeout: float = 30.0):
        """``security``: a ``network.clientauth.ClientSecurity`` for the inter-broker
        listener (``ClientSecurity.inter_broker(config)``), None for PLAINTEXT;
        ``attempt_timeout``: seconds one attempt waits for its answer."""
        self.post, self.client_id, self.security = post, client_id, security
        self.attempt_timeout = attempt_timeout
        self.senders: dict[int, _Sender] = {}

    def set_brokers(self, brokers: dict[int, tuple[str, int]]) -> None:
        """The live brokers: senders for new ones (or moved ones), none for gone ones."""
        for broker_id in list(self.senders):
            s = self.senders[broker_id]
            if broker_id not in brokers or s.address != tuple(brokers[broker_id]):
                s.stop()
                del self.senders[broker_id]
        for broker_id, (host, port) in brokers.items():
            if broker_id not in self.senders:
                self.senders[broker_id] = _Sender(broker_id, host, port, self.post, self.client_id, self.security,
                                                  self.attempt_timeout)

    def send(self, broker_id: int, api: int, body: dict, callback: Callback, timeout: float = 30.0) -> None:
        sender = self.senders.get(broker_id)
        if sender is None:
            callback(None, f"broker {broker_id} is not alive")
            return
        sender.queue.put((api, body, callback, time.monotonic() + timeout))

    def close(self) -> None:
        for s in self.senders.values():
            s.stop()
        for s in self.senders.values():
            s.thread.join(timeout=2.0)
        self.senders.clear()
