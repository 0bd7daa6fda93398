"""The replication throttle's quota (log.throttle.Quota), on a fake clock."""
from __future__ import annotations

from odradek.log.throttle import UNLIMITED, Quota


def test_an_unlimited_quota_never_holds_traffic():
    q = Quota(UNLIMITED, now=0.0)
    q.record(10 ** 12, 0.0)
    assert q.allows(0.0) and q.wait(0.0) == 0.0


def test_traffic_over_the_rate_waits_until_the_rate_has_paid_it_back():
    q = Quota(1000, now=0.0)
    assert not q.allows(0.0)  # nothing saved up yet
    assert q.allows(0.5)
    q.record(5000, 0.5)  # one big fetch: 4500 bytes over
    assert not q.allows(0.5)
    assert abs(q.wait(0.5) - 4.501) < 0.01
    assert not q.allows(4.9) and q.allows(5.1)


def test_bytes_moved_over_time_stay_within_one_fetch_of_the_rate():
    q, moved, t, fetch = Quota(100_000, now=0.0), 0, 0.0, 30_000
    while t < 20.0:
        if q.allows(t):
            q.record(fetch, t)
            moved += fetch
        t += 0.01
    assert abs(moved - 20 * 100_000) <= fetch + 100_000  # the 1 s burst allowance, and one fetch


def test_unused_rate_is_saved_up_for_one_second_only():
    q = Quota(1000, now=0.0)
    q.record(1500, 100.0)  # 100 s idle: only 1000 bytes of budget were kept
    assert not q.allows(100.0)


def test_lowering_the_rate_caps_what_was_saved_up():
    q = Quota(1_000_000, now=0.0)
    assert q.allows(1.0)
    q.set_rate(1000, 1.0)
    q.record(1500, 1.0)
    assert not q.allows(1.0)
