"""A new leader never answers "latest" below a record its predecessor acknowledged (KIP-207).

Found by a fresh-clone CI run of tests/cluster/test_reassignment.py: the controller moved
leadership to the preferred replica (every 5 s in the tests' settings) while the test read
its high watermarks; the new leader's was still the one it had learned as a follower, one
record short, so a fresh reader stopped before the last acknowledged record ("acknowledged
b'p1-739' at 1:476, consumed None"). A follower learns the high watermark one fetch late;
until its own followers have fetched from it, a new leader's is behind what was acknowledged.
Kafka answers ListOffsets "latest" with OFFSET_NOT_AVAILABLE (retriable) until the high
watermark reaches the offset its leader epoch began at; so does Odradek now.

In process: a log actor without a runtime (tests/log/test_isr_changes.py's) and a fetch actor
whose messaging is stubbed, reading the same log on disk."""
from __future__ import annotations

import pytest

from odradek.core.config import LogConfig
from odradek.log.fetch_actor import FetchActor
from odradek.log.log import Log
from odradek.log.log_actor import PartitionLog
from odradek.core.records import encode_batch
from odradek.core.kafka.apis import list_offsets_from_internal
from odradek.core.protocol import ErrorCode
from odradek.actors.messages import Response
from tests.log.test_isr_changes import LeaderUnderTest, progress

LATEST, EARLIEST = -1, -2


def fetch_actor(data_dir: str) -> FetchActor:
    actor = FetchActor("fetch", data_dir, {"config": {}, "data_dir": data_dir}, None)
    actor.request = lambda *a, **k: None
    actor.call_later = lambda delay, callback: None
    actor.on_start()
    return actor


@pytest.fixture
def follower_becoming_leader(tmp_path):
    """Broker 2 follows t-0 (leader 1, epoch 1, ISR [1, 2]): it has 10 records and, as a
    follower learns it one fetch late, the high watermark 7. The fetch actor reads the same
    directory."""
    logs = LeaderUnderTest(2)
    p = PartitionLog("t", 0, "id", Log(str(tmp_path / "t-0"), LogConfig()))
    logs.logs[("t", 0)] = p
    logs._become(p, {"leader": 1, "leader_epoch": 1, "isr": [1, 2], "replicas": [1, 2]})
    p.log.append(encode_batch([(None, b"v")] * 10), leader_epoch=1)
    p.log.high_watermark = 7
    fetch = fetch_actor(str(tmp_path))
    yield logs, p, fetch
    p.log.close()
    fetch.on_stop()


def push_bounds(logs: LeaderUnderTest, p: PartitionLog, fetch: FetchActor) -> None:
    fetch._apply([logs._bounds(p)], [], logs.name)


def test_a_new_leader_answers_latest_only_once_its_high_watermark_reached_its_epochs_start(follower_becoming_leader):
    logs, p, fetch = follower_becoming_leader
    logs._become(p, {"leader": 2, "leader_epoch": 2, "isr": [1, 2], "replicas": [1, 2]})
    assert (p.log.high_watermark, p.high_watermark_floor) == (7, 10)
    push_bounds(logs, p, fetch)
    latest = fetch._offset_for("t", 0, LATEST)
    assert latest["error_code"] == ErrorCode.OFFSET_NOT_AVAILABLE and latest["offset"] == -1, \
        f"a new leader answered 'latest' {latest['offset']} below records acknowledged at its predecessor"
    assert "high watermark 7 has not reached 10" in latest["error_message"]
    assert fetch._offset_for("t", 0, EARLIEST) == {"index": 0, "error_code": 0, "timestamp": -1, "offset": 0}
    # the group coordinator's check of a commit: consumers may have read up to the floor
    assert fetch._offset_for("t", 0, LATEST, readable=True) == {"index": 0, "error_code": 0, "timestamp": -1,
                                                                  "offset": 10}
    progress(logs, 1, 10)  # the follower fetched from the new leader: the high watermark catches up
    push_bounds(logs, p, fetch)
    assert p.log.high_watermark == 10
    assert fetch._offset_for("t", 0, LATEST) == {"index": 0, "error_code": 0, "timestamp": -1, "offset": 10}


def test_a_log_actor_reopening_a_partition_it_leads_holds_latest_until_the_followers_confirm(follower_becoming_leader):
    """A restarted log actor reads the high watermark of its last checkpoint, which may trail
    what its predecessor acknowledged: the same floor, at the log end it reopened with."""
    logs, p, fetch = follower_becoming_leader
    reopened = PartitionLog("t", 0, "id", p.log)  # what a restarted log actor holds: no role yet
    logs.logs[("t", 0)] = reopened
    logs._become(reopened, {"leader": 2, "leader_epoch": 2, "isr": [1, 2], "replicas": [1, 2]})
    push_bounds(logs, reopened, fetch)
    assert fetch._offset_for("t", 0, LATEST)["error_code"] == ErrorCode.OFFSET_NOT_AVAILABLE


def test_a_leader_alone_in_its_isr_and_a_follower_have_nothing_to_wait_for(follower_becoming_leader):
    logs, p, fetch = follower_becoming_leader
    assert p.high_watermark_floor == -1  # following
    logs._become(p, {"leader": 2, "leader_epoch": 2, "isr": [2], "replicas": [1, 2]})
    push_bounds(logs, p, fetch)
    assert p.log.high_watermark == 10
    assert fetch._offset_for("t", 0, LATEST)["offset"] == 10


@pytest.mark.parametrize("version, code", [(4, ErrorCode.LEADER_NOT_AVAILABLE), (5, ErrorCode.OFFSET_NOT_AVAILABLE)])
def test_kafka_clients_before_list_offsets_v5_get_leader_not_available_instead(version, code):
    reply = Response({"topics": [{"name": "t", "partitions": [
        {"index": 0, "error_code": int(ErrorCode.OFFSET_NOT_AVAILABLE), "offset": -1}]}]})
    (part,) = list_offsets_from_internal(version, {}, reply, [])["topics"][0]["partitions"]
    assert part["error_code"] == code
