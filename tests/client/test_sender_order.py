"""The sender keeps each partition's waiting batches in the order they were created (issue 16).

A partition's batches must leave in creation order: its idempotent sequence numbers are given
in that order, and a batch in doubt (stamped, answer lost) heads its partition's window of
stamped batches (one, ``max_in_flight_per_partition``) until it is resolved. When the sender
could not send some batches (their leader unreachable: connection refused, metadata still
naming the dead broker), it put them back *after* the batches that had waited meanwhile, so a
later batch could come first. Idempotent, that later batch, unstamped, waited for room in the
window, and the batch in doubt that held the window waited behind it: the partition sent
nothing until ``delivery_timeout_ms`` failed them all ("0-1 attempts", the cluster test
``test_a_leader_killed_under_idempotent_producers_leaves_no_duplicate``). It happened after a
leader's kill -9 when the batches' retry times differed by a few microseconds (each backoff
is computed when it is set) and the sender woke between them.

White-box and single-threaded: the sender's loop is driven by hand (no sender thread), so
the order in which the batches wait is set exactly, with a scripted cluster
(tests/client/scripted_broker.py) whose leader is first a dead broker, then a live one.
"""
from __future__ import annotations

import time

from odradek.accumulator import RecordAccumulator
from odradek.cluster import Cluster
from odradek.network.connection import wait_any
from odradek.producer import encode_rows
from odradek.producer_sender import _Sender


def three_batches(acc: RecordAccumulator) -> tuple[list, list]:
    """Three closed batches of partition t-0, created one after another, and their handles."""
    batches, handles = [], []
    for value in (b"first", b"second", b"third"):
        handles.append(acc.append("t", 0, value, None, (), None, 10, count=1))
        _, _, ready = acc.drain(time.monotonic(), force=True)
        batches += ready
    return batches, handles


def test_batches_whose_leader_cannot_be_reached_wait_again_in_the_order_they_were_created(scripted_cluster):
    cl = scripted_cluster({"t": 1}, brokers=2)
    cl.move_leader("t", 0, 1)
    metadata = Cluster(cl.brokers[0].bootstrap, retry_backoff_ms=50, request_timeout_ms=5000)
    metadata.refresh(["t"])
    cl.brokers[1].kill()  # the metadata still names broker 1, whose port now refuses connections
    acc = RecordAccumulator(metadata, lambda rows, keys, base, top, plain: encode_rows(rows, base, top, None, keys, plain), linger=3600.0,
                            batch_size=1 << 20, buffer_memory=1 << 30, max_block=10.0, delivery_timeout=120.0)
    sender = _Sender(acc, metadata, acks=-1, ack_timeout_ms=4000, idempotent=True, retries=100, retry_backoff=0.05,
                     max_in_flight=5, max_in_flight_per_partition=1, max_request_size=1 << 20,
                     request_timeout_ms=5000, client_id="order-test")
    sender.idem.producer_id, sender.idem.epoch = 7, 0
    try:
        (first, second, third), handles = three_batches(acc)
        now = time.monotonic()
        # first: sent once to broker 1, its answer lost (in doubt), due for its retry; second: its
        # retry time set a moment later, not due yet; third: new
        sender.idem.stamp(first, False)
        first.attempts, first.retry_at = 1, now - 1.0
        second.retry_at = now + 3600.0
        sender.retry = [first, second, third]
        sender._send_ready()  # first goes to broker 1: connection refused, it waits again
        assert first.attempts == 1 and not first.future.done()
        assert sender.retry == [first, second, third], [b.rows for b in sender.retry]

        # broker 0 leads now: the batch in doubt goes first, then the others, in order
        cl.move_leader("t", 0, 0)
        metadata.refresh(["t"])
        for b in sender.retry:
            b.retry_at = 0.0
        deadline = time.monotonic() + 30
        while not all(h.done() for h in handles) and time.monotonic() < deadline:
            sender._send_ready()
            wait_any(list(sender.conns.values()), 0.05)
        assert [h.result(0).offset for h in handles] == [0, 1, 2]
        assert [r.value for r in cl.records("t", 0)] == [b"first", b"second", b"third"]
        assert [b.stamp[2] for b in (first, second, third)] == [0, 1, 2]  # sequences in creation order
    finally:
        for c in sender.conns.values():
            c.close()
        metadata.close()
        acc.release()
