"""The sender sleeps while its waiting batches wait for an answer (issue 16).

A partition sends one request at a time (``max_in_flight_per_partition``); its later batches
wait in the sender's retry list until the answer comes. The sender computed its sleep from
their retry times, which were already past (never set, or set for an earlier attempt), so it
did not sleep at all: it spun through the list until the answer came. In the short chaos
schedule the runner's two producers took most of a core while a leader did not answer,
starving the fault proxy on the same interpreter (every broker's ZooKeeper and replication
links go through it); on any slow acks=all produce it burned the client's CPU.

White-box: the sender's loop is driven by hand, against a scripted broker
(tests/client/scripted_broker.py) that takes the first PRODUCE and never answers it.
"""
from __future__ import annotations

import time

from odradek.accumulator import RecordAccumulator
from odradek.cluster import Cluster
from odradek.core.protocol import ApiKey
from odradek.producer import encode_rows
from odradek.producer_sender import _Sender
from tests.client.test_sender_order import three_batches


def test_batches_waiting_for_their_partitions_answer_do_not_make_the_sender_spin(scripted):
    broker = scripted({"t": 1})
    broker.faults.append(("silent",))
    metadata = Cluster(broker.bootstrap, retry_backoff_ms=50, request_timeout_ms=5000)
    metadata.refresh(["t"])
    acc = RecordAccumulator(metadata, lambda rows, keys, base, top, plain: encode_rows(rows, base, top, None, keys, plain), linger=3600.0,
                            batch_size=1 << 20, buffer_memory=1 << 30, max_block=10.0, delivery_timeout=120.0)
    sender = _Sender(acc, metadata, acks=-1, ack_timeout_ms=4000, idempotent=False, retries=100, retry_backoff=0.05,
                     max_in_flight=5, max_in_flight_per_partition=1, max_request_size=1 << 20,
                     request_timeout_ms=5000, client_id="wait-test")
    try:
        (first, second, third), _ = three_batches(acc)
        first.retry_at = time.monotonic() + 0.2  # it goes after a backoff
        sender.retry = [first, second, third]
        sender._send_ready()
        assert sender.retry == [first, second, third]
        sleeps: list[float] = []
        acc.sleep = lambda conns, now, timeout, seen: sleeps.append(timeout)
        sender._wait(None, acc._changes)
        assert 0.1 < sleeps[-1] <= 0.2  # the backoff: the others wait behind it, they do not shorten it

        time.sleep(0.2)
        sender._send_ready()  # the first goes, all in one request; the broker never answers it
        deadline = time.monotonic() + 10
        while not any(api == ApiKey.PRODUCE for api, _ in broker.requests) and time.monotonic() < deadline:
            for c in sender.conns.values():
                c.flush()
            time.sleep(0.01)
        acc.append("t", 0, b"fourth", None, (), None, 10, count=1)
        (fourth,) = acc.drain(time.monotonic(), force=True)[2]
        sender.retry.append(fourth)
        sender._send_ready()  # fourth waits for the partition's answer: nothing to do until it comes
        assert fourth in sender.retry and sender.in_flight.get(("t", 0)) is not None
        sender._wait(None, acc._changes)
        assert sleeps[-1] > 0.5, "the sender spins while a batch waits for its partition's answer"
    finally:
        for c in sender.conns.values():
            c.close()
        metadata.close()
        acc.release()
