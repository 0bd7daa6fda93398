"""Per-partition order through retries with several requests in flight (issue 16, defect 20;
issue 33).

``max_in_flight`` requests may be in flight per connection. Without idempotence at most one
per partition (a request carries as many of the partition's batches as fit): when a request
is refused with a retriable error (NOT_ENOUGH_REPLICAS while a follower catches up, say), no
later batch of its partition has been sent, so nothing can overtake the retried one. Without
that, the request after the refused one was appended first and the records landed out of
send order. With idempotence (the default) up to ``max_in_flight`` per partition, as in
Kafka: the leader refuses the later requests' batches (their sequence does not follow what
it wrote), and the producer sends them again after the refused one, in sequence order.
Scripted broker (tests/client/scripted_broker.py, which checks sequences as a leader does):
the real one cannot refuse on cue.
"""
from __future__ import annotations

import pytest

from odradek import Producer
from odradek.core.protocol import ApiKey, ErrorCode

RETRIABLE = [ErrorCode.NOT_ENOUGH_REPLICAS, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
             ErrorCode.REQUEST_TIMED_OUT, ErrorCode.NOT_LEADER_OR_FOLLOWER]


@pytest.mark.parametrize("idempotent", [True, False])
@pytest.mark.parametrize("code", RETRIABLE)
def test_records_land_in_send_order_when_requests_in_flight_are_refused_and_retried(scripted, code, idempotent):
    broker = scripted({"t": 2})
    values = [b"r-%05d" % i for i in range(4000)]
    # small batches and requests: many requests of each partition would be in flight at once
    with Producer(broker.bootstrap, linger_ms=0, batch_size=400, max_request_size=500, max_in_flight=5,
                  retry_backoff_ms=5, compression=None, enable_idempotence=idempotent) as p:
        assert p.max_in_flight_per_partition == (5 if idempotent else 1)
        p.partitions_for("t")
        handles = []
        for i, v in enumerate(values):
            if i % 500 == 250:
                broker.faults.extend([("error", code)] * 2)
            handles.append(p.send("t", v, partition=i % 2))
        p.flush(timeout=60)
    assert all(h.exception() is None for h in handles)
    assert p.metrics()["retries"] >= 8  # the faults were met
    for part in (0, 1):
        assert [r.value for r in broker.records("t", part)] == values[part::2]  # send order, no gap, no duplicate
    produces = [body for api, body in broker.requests if api == ApiKey.PRODUCE]
    assert len(produces) > len(values) // 200  # batches went in many requests, pipelined

