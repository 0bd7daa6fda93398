"""Watching: a log actor tells the fetch actor of appends only to the partitions it watches
(a lease the fetch actor asks for when it serves a partition, renewed while it does). A
transactional producer's ``__transaction_state`` records and a topic nobody reads cost no
message per append any more; a fetch of a partition not watched waits for its fresh bounds.
In process, with the actors' messaging stubbed: no broker."""
from __future__ import annotations

import time

from odradek.actors.message import ERROR, REPLY, Message
from odradek.actors.messages import Done, ErrorReply, Watch
from odradek.log.fetch_actor import WATCH_LEASE, FetchActor
from odradek.log.log_actor import LogActor

KEY = ("orders", 0)


class Msg:
    def __init__(self, fields, reply_to: str | None = None):
        self.fields, self.reply_to, self.is_error = fields, reply_to, False


def log_actor():
    actor = LogActor("log-0", "/nonexistent", {}, None)
    actor.logs, actor.unopened = {KEY: object()}, {}
    actor._partition = lambda key: actor.logs.get(key)
    actor._dirty, actor._closed, actor._answers, actor._announce_opening = set(), [], [], False
    actor._leases = {}
    return actor


def test_an_append_to_a_partition_nobody_watches_tells_the_fetch_actor_nothing():
    actor = log_actor()
    actor._data_changed(KEY)
    assert actor._dirty == set()


def test_a_watched_partition_is_told_at_once_and_again_after_every_append_until_the_lease_ends():
    actor = log_actor()
    watch = Msg(Watch([list(KEY)], 0.2), reply_to="fetch")
    actor.on_watch(watch)
    assert actor._dirty == {KEY}  # its bounds go before the answer, on the same pipe
    assert actor._answers == [(watch, Done())]
    actor._dirty.clear()
    actor._data_changed(KEY)
    assert actor._dirty == {KEY}
    actor._dirty.clear()
    time.sleep(0.25)
    actor._data_changed(KEY)
    assert actor._dirty == set()


def fetch_actor(tmp_path):
    actor = FetchActor("fetch", str(tmp_path), {"config": {}, "data_dir": str(tmp_path)}, None)
    actor.on_start()
    asked, sent, served = [], [], []
    actor.request = lambda to, body, frames=(), callback=None, timeout=None: asked.append(
        (to, body, callback))
    actor.send = lambda to, body, frames=(), corr=0, reply_to=None: sent.append((to, body))
    actor.roles[KEY] = (0, True, "log-1", (0,))
    return actor, asked, sent, served


def test_a_fetch_of_a_partition_not_watched_waits_for_the_watch_then_is_served(tmp_path):
    actor, asked, _sent, served = fetch_actor(tmp_path)
    msg = object()
    assert actor._fresh_first(msg, [KEY], served.append) is True
    (to, body, callback), = asked
    assert (to, body) == ("log-1", Watch([list(KEY)], WATCH_LEASE))
    assert served == []
    callback(Message(REPLY, 1, None, Done()))
    assert served == [msg]
    assert actor._fresh_first(msg, [KEY], served.append) is False  # watched now: served at once
    assert len(asked) == 1


def test_a_lease_with_less_than_half_left_is_renewed_without_waiting(tmp_path):
    actor, asked, sent, _served = fetch_actor(tmp_path)
    actor.watch_until[KEY] = time.monotonic() + WATCH_LEASE / 2 - 5
    assert actor._fresh_first(object(), [KEY], lambda m: None) is False
    assert asked == [] and sent == [("log-1", Watch([list(KEY)], WATCH_LEASE))]
    assert actor.watch_until[KEY] > time.monotonic() + WATCH_LEASE / 2
    sent.clear()
    assert actor._fresh_first(object(), [KEY], lambda m: None) is False
    assert sent == []


def test_a_failed_watch_serves_what_is_known_and_asks_again_later(tmp_path):
    actor, asked, _sent, served = fetch_actor(tmp_path)
    actor._fresh_first("m", [KEY], served.append)
    asked[0][2](Message(ERROR, 1, None, ErrorReply(7, "timed out")))
    assert served == ["m"]
    assert 0 < actor.watch_until[KEY] - time.monotonic() <= 1.0


def test_a_restarted_log_actor_watches_nothing_so_every_lease_is_forgotten(tmp_path):
    actor, _asked, _sent, _served = fetch_actor(tmp_path)
    actor.watch_until[KEY] = time.monotonic() + WATCH_LEASE
    actor.on_members("log", ["log-0", "log-1"], [])
    assert actor.watch_until == {}
