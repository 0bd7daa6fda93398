"""The log actors, fetch actor and controller together, as real processes, spoken to at the
actor level (the client-facing path is tested end to end in tests/client)."""
import os
import threading
import time

import pytest

from odradek.actors.client import MailboxClient
from odradek.actors.message import decode, encode_header, typed_reply
from odradek.actors.supervisor import Supervisor, run_supervisor
from odradek.actors.names import placement
from odradek.actors.messages import (CreateTopics, DeleteTopics, Fetch, GetBounds, ListOffsets, PartitionBounds,
                                     Produce, Response)
from odradek.core.records import decode_batch, encode_batch, iter_batches
from odradek import config as cfg
from odradek.broker import actor_specs


@pytest.fixture
def storage(tmp_path):
    """controller + 2 log actors + fetch actor, run by a supervisor on a thread."""
    c = cfg.load(None, [f"log.dirs={tmp_path}", "num.log.threads=2"])
    sup = Supervisor(cfg.run_dir(c), [s for s in actor_specs(c) if s.role in ("controller", "log", "fetch")])
    t = threading.Thread(target=run_supervisor, args=(sup,))
    t.start()
    deadline = time.monotonic() + 30
    while not sup.ready and t.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    client = MailboxClient(cfg.run_dir(c))
    client.data_dir = str(tmp_path)
    try:
        yield client
    finally:
        client.close()
        sup.stop()
        t.join(30)


def host(topic, p):
    return f"log-{placement(topic, p, 2)}"


def fetch_records(client, topic, partition, offset, max_wait_ms=0):
    r = client.request("fetch", Fetch({"max_wait_ms": max_wait_ms, "topics": [
        {"name": topic, "partitions": [{"index": partition, "fetch_offset": offset}]}]}))
    data = b"".join(open(path, "rb").read()[pos:pos + n] for path, pos, n in r.fields.files)
    part = r.fields.body["topics"][0]["partitions"][0]
    values = [rec.value for p, h in iter_batches(data) for rec in decode_batch(data[p:p + h.size])]
    return part, values


def test_a_created_topic_takes_appends_that_the_fetch_actor_serves_as_file_regions(storage):
    r = storage.request("controller", CreateTopics({"topics": [{"name": "t", "num_partitions": 3}]}))
    assert r.fields.body["topics"][0]["error_code"] == 0
    for i in range(3):
        r = storage.request(host("t", 1), Produce(1, [["t", 1, 0]]),
                            frames=[encode_batch([(None, b"v%d-%d" % (i, j)) for j in range(2)])])
        assert r.fields.body["topics"][0]["partitions"][0]["base_offset"] == 2 * i
    # the fetch actor learns a partition's bounds from its log actor's ``bounds`` message,
    # sent after the append is answered: a fetch at once may see the previous bounds
    deadline = time.monotonic() + 10
    part, values = fetch_records(storage, "t", 1, 2)
    while part["high_watermark"] < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
        part, values = fetch_records(storage, "t", 1, 2)
    assert part["error_code"] == 0 and part["high_watermark"] == 6
    assert values == [b"v1-0", b"v1-1", b"v2-0", b"v2-1"]


def test_a_log_actors_bounds_read_as_partition_bounds_by_name(storage):
    """The log actor builds its bounds as a plain list (the produce path); the fields must be
    PartitionBounds' own, in its order, since the fetch actor and the coordinators read them so."""
    storage.request("controller", CreateTopics({"topics": [{"name": "t", "num_partitions": 1}]}))
    storage.request(host("t", 0), Produce(1, [["t", 0, 0]]),
                    frames=[encode_batch([(None, b"a"), (None, b"b"), (None, b"c")])])
    parts = [PartitionBounds(*p) for p in storage.request(host("t", 0), GetBounds()).fields.parts]
    (part,) = [p for p in parts if p.topic == "t"]
    assert (part.partition, part.log_start_offset, part.log_end_offset, part.high_watermark) == (0, 0, 3, 3)
    assert part.bounds.log_end_offset == 3 and part.leader and part.leader_epoch == 0
    assert part.last_stable_offset == 3
    assert part.high_watermark_floor == 0  # led alone since it was empty: nothing to wait for


def test_a_torn_batch_and_a_partition_of_another_host_are_refused_and_nothing_is_written(storage):
    # (CRCs are checked by the request handlers, before a batch reaches its log actor: see
    # tests/client for a corrupt batch sent over the wire.)
    storage.request("controller", CreateTopics({"topics": [{"name": "t", "num_partitions": 2}]}))
    good = encode_batch([(None, b"ok")])
    bad = good[:-3]
    other = 1 - placement("t", 0, 2)
    r = storage.request(host("t", 0), Produce(1, [["t", 0, 0]]), frames=[bytes(bad)])
    assert r.fields.body["topics"][0]["partitions"][0]["error_code"] == 2  # CORRUPT_MESSAGE
    r = storage.request(f"log-{other}", Produce(1, [["t", 0, 0]]), frames=[good])
    assert r.fields.body["topics"][0]["partitions"][0]["error_code"] == 6  # NOT_LEADER_OR_FOLLOWER
    part, values = fetch_records(storage, "t", 0, 0)
    assert part["high_watermark"] == 0 and values == []


def test_a_long_poll_fetch_is_answered_when_data_arrives_not_at_its_deadline(storage):
    storage.request("controller", CreateTopics({"topics": [{"name": "t"}]}))
    storage._peer("fetch").send_multipart([encode_header(Fetch.TYPE, 77, storage.name, Fetch({
        "max_wait_ms": 20000, "topics": [{"name": "t", "partitions": [{"index": 0, "fetch_offset": 0}]}]}))])
    assert not storage.inbox.poll(300), "answered before any data existed"
    started = time.monotonic()
    storage.send(host("t", 0), Produce(0, [["t", 0, 0]]), frames=[encode_batch([(None, b"x")])])
    assert storage.inbox.poll(10000)
    reply = typed_reply(decode(storage.inbox.recv_multipart()), Response)
    assert reply.corr == 77 and reply.fields.body["topics"][0]["partitions"][0]["records_size"] > 0
    assert time.monotonic() - started < 10  # far inside max_wait_ms: it was the data that woke it


def test_list_offsets_and_out_of_range_fetches(storage):
    storage.request("controller", CreateTopics({"topics": [{"name": "t"}]}))
    storage.request(host("t", 0), Produce(1, [["t", 0, 0]]),
                    frames=[encode_batch([(None, b"a"), (None, b"b")], timestamp_ms=1_000)])
    r = storage.request("fetch", ListOffsets({"topics": [{"name": "t", "partitions": [
        {"index": 0, "timestamp": -1}, {"index": 0, "timestamp": -2}, {"index": 0, "timestamp": 500},
        {"index": 0, "timestamp": 5_000}, {"index": 9, "timestamp": -1}]}]}))
    offsets = [(p["error_code"], p["offset"]) for p in r.fields.body["topics"][0]["partitions"]]
    assert offsets == [(0, 2), (0, 0), (0, 0), (0, -1), (3, -1)]
    for bad in (-1, 3):
        part, _ = fetch_records(storage, "t", 0, bad)
        assert part["error_code"] == 1 and str(bad) in part["error_message"]  # OFFSET_OUT_OF_RANGE


def test_deleting_a_topic_removes_its_directories_and_frees_the_name(storage):
    storage.request("controller", CreateTopics({"topics": [{"name": "t", "num_partitions": 2}]}))
    storage.request(host("t", 0), Produce(1, [["t", 0, 0]]), frames=[encode_batch([(None, b"old")])])
    r = storage.request("controller", DeleteTopics({"topics": ["t"]}))
    assert r.fields.body["topics"] == [{"name": "t", "error_code": 0}]
    assert not [d for d in os.listdir(storage.data_dir) if d.startswith("t-")]
    storage.request("controller", CreateTopics({"topics": [{"name": "t", "num_partitions": 2}]}))
    part, values = fetch_records(storage, "t", 0, 0)
    assert part["error_code"] == 0 and part["high_watermark"] == 0 and values == []
