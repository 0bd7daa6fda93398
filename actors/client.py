"""A blocking mailbox client for code that is not an actor: the command line, tests.

Runs in the caller's process and thread. Owns a private reply mailbox in the run directory
(``client-<pid>-<n>.mbox``); sends requests to actors by name and waits for the answer with a
timeout. Not thread-safe: one client per thread.
"""
from __future__ import annotations

import itertools
import os
from typing import Any, Sequence

import zmq

from odradek.actors.message import Message, encode_header
from odradek.actors.messages import REPLIES
from odradek.actors.runtime import LINGER_MS, await_reply, mailbox_address, mailbox_path, make_private

_seq = itertools.count()


class MailboxClient:
    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.name = f"client-{os.getpid()}-{next(_seq)}"
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.inbox.bind(mailbox_address(run_dir, self.name))
        make_private(mailbox_path(run_dir, self.name))  # no one else may answer in the broker's name
        self._peers: dict[str, zmq.Socket] = {}
        self._corr = itertools.count(1)

    def _peer(self, name: str) -> zmq.Socket:
        sock = self._peers.get(name)
        if sock is None:
            sock = self.ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, LINGER_MS)
            sock.connect(mailbox_address(self.run_dir, name))
            self._peers[name] = sock
        return sock

    def send(self, to: str, body: Any, frames: Sequence[Any] = ()) -> None:
        """One-way ``body``, a message of actors.messages (as ``Actor.send``)."""
        self._peer(to).send_multipart([encode_header(body.TYPE, 0, None, body), *frames], copy=False)

    def request(self, to: str, body: Any, frames: Sequence[Any] = (), timeout: float = 5.0) -> Message:
        """Send and wait for the answer (its body of the request's answer class). Raises
        OdradekError on an ``_error`` reply or on timeout (REQUEST_TIMED_OUT)."""
        type_ = body.TYPE
        corr = next(self._corr)
        self._peer(to).send_multipart([encode_header(type_, corr, self.name, body), *frames], copy=False)
        return await_reply(self.inbox, corr, timeout, f"no answer from {to} to '{type_}'", answer=REPLIES.get(type_))

    def close(self) -> None:
        for sock in self._peers.values():
            sock.close(linger=LINGER_MS)
        self.inbox.close(linger=0)
        try:
            os.unlink(mailbox_path(self.run_dir, self.name))
        except FileNotFoundError:
            pass
        self.ctx.term()

    def __enter__(self) -> "MailboxClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
