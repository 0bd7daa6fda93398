"""The controller actor's kazoo client, whose blocking calls give up.

Process: ``controller`` (the cluster controller actor's one ZooKeeper client).
Invariant: every blocking call (``get``, ``exists``, ``create``, a transaction's ``commit``...)
waits at most ``request_timeout`` seconds, then raises kazoo's ``ConnectionLoss``, which every
caller treats as "ZooKeeper unreachable: not known, retried later", so an unreachable
ZooKeeper never holds the actor's loop past ``supervisor.liveness.timeout.ms``. Calls given
an explicit timeout and the asynchronous API are kazoo's, unchanged.
"""
from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.handlers.threading import AsyncResult, KazooTimeoutError, SequentialThreadingHandler


class _BoundedResult(AsyncResult):
    def get(self, block=True, timeout=None):
        if not block or timeout is not None:
            return super().get(block, timeout)
        try:
            return super().get(True, self._handler.request_timeout)
        except KazooTimeoutError:
            raise ConnectionLoss(f"no answer from ZooKeeper within {self._handler.request_timeout:g}s") from None


class _BoundedHandler(SequentialThreadingHandler):
    def __init__(self, request_timeout: float):
        super().__init__()
        self.request_timeout = request_timeout

    def async_result(self):
        return _BoundedResult(self)


def bounded_client(hosts: str, session_timeout: float, request_timeout: float, **kwargs) -> KazooClient:
    """A kazoo client whose blocking calls raise ConnectionLoss after ``request_timeout`` s."""
    return KazooClient(hosts=hosts, timeout=session_timeout, handler=_BoundedHandler(request_timeout), **kwargs)
