"""What a leader keeps of each follower (``log.log_actor.Follower``): its log end and when it was
last caught up, by Kafka's rule (caught up as of a fetch that reached the leader's log end, or
as of the previous fetch when this one reached the end the leader had then)."""
from __future__ import annotations

from odradek.log.log_actor import Follower


def test_a_new_follower_has_an_unknown_log_end_and_counts_as_caught_up_from_the_start():
    f = Follower(now_ms=1000)
    assert f.log_end_offset == -1 and f.caught_up_ms == 1000


def test_a_fetch_at_the_leaders_log_end_is_caught_up_now():
    f = Follower(now_ms=0)
    f.fetched(offset=50, leader_end=50, now_ms=700)
    assert f.caught_up_ms == 700 and f.log_end_offset == 50


def test_a_fetch_behind_that_reached_the_previous_end_is_caught_up_as_of_the_previous_fetch():
    f = Follower(now_ms=0)
    f.fetched(offset=10, leader_end=20, now_ms=100)  # behind: the leader was at 20
    f.fetched(offset=20, leader_end=35, now_ms=200)  # has what the leader had at 100
    assert f.caught_up_ms == 100


def test_a_follower_that_never_reaches_the_leaders_end_stays_behind():
    f = Follower(now_ms=0)
    f.fetched(offset=10, leader_end=100, now_ms=100)
    f.fetched(offset=20, leader_end=200, now_ms=200)
    f.fetched(offset=30, leader_end=300, now_ms=300)
    assert f.caught_up_ms == 0  # so replica.lag.time.max.ms after 0 it leaves the ISR
