"""Property tests of the assignors: exclusive, complete ownership; balance; minimal movement."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from odradek.coordinator.assignors import range_assign, uniform

TOPICS = ["a", "b", "c"]

members_st = st.dictionaries(st.text("mnopq", min_size=1, max_size=3),
                             st.frozensets(st.sampled_from(TOPICS), min_size=1), min_size=1, max_size=8)
topics_st = st.fixed_dictionaries({t: st.integers(0, 12) for t in TOPICS})


def _check_exclusive_and_complete(out, members, topics):
    seen = {}
    for m, tps in out.items():
        for tp in tps:
            assert tp not in seen, f"{tp} owned by {seen[tp]} and {m}"
            seen[tp] = m
            assert tp[0] in members[m], f"{m} got {tp} without subscribing to {tp[0]}"
            assert 0 <= tp[1] < topics[tp[0]]
    wanted = {(t, p) for t, n in topics.items() if any(t in s for s in members.values()) for p in range(n)}
    assert set(seen) == wanted
    assert set(out) == set(members)


@settings(max_examples=300, deadline=None)
@given(members_st, topics_st)
def test_every_partition_has_exactly_one_owner(members, topics):
    for assign in (uniform, range_assign):
        _check_exclusive_and_complete(assign(members, topics), members, topics)


@settings(max_examples=300, deadline=None)
@given(members_st, topics_st, st.data())
def test_uniform_stays_exclusive_from_any_previous_assignment(members, topics, data):
    # Previous assignments may name members and partitions that are gone, or twice.
    prev = {m: set(data.draw(st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 14)), max_size=10)))
            for m in list(members) + ["gone"]}
    _check_exclusive_and_complete(uniform(members, topics, prev), members, topics)


same_subscription = st.tuples(st.integers(1, 12), st.integers(1, 60))


@settings(max_examples=300, deadline=None)
@given(same_subscription, st.data())
def test_uniform_balances_and_moves_as_few_partitions_as_possible(sizes, data):
    n_members, n_parts = sizes
    names = [f"m{i}" for i in range(n_members)]
    members = {m: frozenset({"a"}) for m in names}
    topics = {"a": n_parts}
    before = uniform(members, topics)
    # A random change of membership: some leave, some join.
    leaving = data.draw(st.sets(st.sampled_from(names), max_size=n_members - 1))
    joining = [f"new{i}" for i in range(data.draw(st.integers(0, 4)))]
    after_members = {m: frozenset({"a"}) for m in names if m not in leaving}
    after_members.update({m: frozenset({"a"}) for m in joining})
    after = uniform(after_members, topics, before)
    _check_exclusive_and_complete(after, after_members, topics)
    counts = [len(v) for v in after.values()]
    assert max(counts) - min(counts) <= 1
    # Minimal movement: a surviving member keeps min(what it had, what it ends with);
    # fewer moves would leave a member above or below the balanced counts.
    moved = sum(len(before[m] - after[m]) for m in after_members if m in before)
    least = sum(max(0, len(before[m]) - len(after[m])) for m in after_members if m in before)
    assert moved == least
    floor = n_parts // len(after_members)
    for m in after_members:
        if m in before and len(before[m]) <= floor:
            assert before[m] <= after[m], f"{m} lost partitions while at or under its fair share"


def test_uniform_adding_a_member_moves_only_what_it_takes():
    members = {f"m{i}": frozenset({"a"}) for i in range(3)}
    before = uniform(members, {"a": 6})
    after = uniform({**members, "m3": frozenset({"a"})}, {"a": 6}, before)
    assert len(after["m3"]) == 1
    moved = sum(len(before[m] - after[m]) for m in members)
    assert moved == 1


def test_uniform_with_different_subscriptions_serves_the_narrow_member():
    members = {"wide": frozenset({"a", "b"}), "narrow": frozenset({"a"})}
    out = uniform(members, {"a": 2, "b": 2})
    assert len(out["narrow"]) >= 1 and len(out["wide"]) >= 1
    assert all(t == "a" for t, _ in out["narrow"])


def test_range_gives_consecutive_ranges_first_members_one_extra():
    out = range_assign({"x": frozenset({"a"}), "y": frozenset({"a"})}, {"a": 5})
    assert out == {"x": {("a", 0), ("a", 1), ("a", 2)}, "y": {("a", 3), ("a", 4)}}
