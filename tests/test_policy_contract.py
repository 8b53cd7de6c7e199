"""Behaviours every eviction policy must have, run against each of them."""

import pytest

from pager.frames import Frames
from pager.page_table import Entry, PageTable
from pager.policy import POLICY_CLASSES, Clock, LFU, LRU, Scored, make_policy
from pager.errors import BudgetError, ConfigError

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


def table_with(n):
    table = PageTable()
    for i in range(1, n + 1):
        table[i] = Entry(i, tokens=10)
    return table


@pytest.mark.parametrize("name", sorted(POLICY_CLASSES))
class TestEveryPolicy:
    def test_victim_is_a_candidate(self, name):
        policy = make_policy(name)
        entries = [Entry(i, resident=True, frame=i, last_use=i, use_count=i % 3) for i in range(5)]
        for _ in range(10):
            assert policy.victim(entries, now=20) in entries

    def test_never_evicts_pinned_or_protected(self, name):
        table = table_with(6)
        frames = Frames(3, table, make_policy(name))
        evicted = []

        def evict(e):
            evicted.append(e.n)
            frames.release(e)

        for n in (1, 2, 3):
            frames.place(table[n])
        table[1].pinned = True
        for tick, n in enumerate((4, 5, 6), start=10):
            frames.make_room({3}, tick, evict)
            frames.place(table[n])
            table[n].last_use = tick
        assert 1 not in evicted and 3 not in evicted
        assert table[1].resident and table[3].resident

    def test_no_candidate_is_a_clear_error_not_a_loop(self, name):
        table = table_with(3)
        frames = Frames(2, table, make_policy(name))
        frames.place(table[1])
        frames.place(table[2])
        table[1].pinned = True
        with pytest.raises(BudgetError, match="raise --budget"):
            frames.make_room({2}, 5, frames.release)

    def test_deterministic(self, name):
        def run():
            policy = make_policy(name)
            entries = [Entry(i, resident=True, frame=i, last_use=(i * 7) % 5, use_count=i % 2, referenced=bool(i % 2))
                       for i in range(8)]
            return [policy.victim(entries, now=9).n for _ in range(4)]

        assert run() == run()


def test_lru_takes_least_recent():
    entries = [Entry(1, last_use=5), Entry(2, last_use=2), Entry(3, last_use=9)]
    assert LRU().victim(entries, 10).n == 2


def test_lfu_takes_least_used_then_least_recent():
    entries = [Entry(1, use_count=3, last_use=1), Entry(2, use_count=1, last_use=8), Entry(3, use_count=1, last_use=4)]
    assert LFU().victim(entries, 10).n == 3


def test_clock_gives_referenced_pages_a_second_chance():
    clock = Clock()
    entries = [Entry(n, resident=True, frame=n - 1, referenced=True) for n in (1, 2, 3)]
    entries[1].referenced = False
    assert clock.victim(entries, 0).n == 2
    assert entries[0].referenced is False  # swept past: bit cleared
    assert entries[2].referenced is True   # not reached yet
    # the hand continues after frame 1: page 3 is referenced, so it gets cleared and page 1 (now clear) goes
    assert clock.victim([entries[0], entries[2]], 0).n == 1


def test_clock_and_lru_differ():
    """A page used once long ago but referenced stays under CLOCK; LRU evicts it."""
    entries = [Entry(1, frame=0, last_use=1, referenced=True), Entry(2, frame=1, last_use=5, referenced=False)]
    assert LRU().victim(entries, 6).n == 1
    assert Clock().victim([Entry(1, frame=0, last_use=1, referenced=True), Entry(2, frame=1, last_use=5)], 6).n == 2


def test_scored_keeps_important_relevant_pages():
    fresh_dull = Entry(1, last_use=10, importance=0.0, relevance=0.0)
    older_vital = Entry(2, last_use=8, importance=1.0, relevance=1.0)
    assert Scored().victim([fresh_dull, older_vital], 10).n == 1


def test_unknown_policy_names_the_choices():
    with pytest.raises(ConfigError, match="clock, lru, lfu, scored"):
        make_policy("fifo")


@pytest.mark.parametrize("name", sorted(POLICY_CLASSES))
def test_peek_is_victim_in_turn_on_copies(name):
    """Policy.peek(candidates, now, k) names the pages that victim() called k times (each time among
    the candidates left) would take from copies of the entries and the policy, and changes nothing."""
    import copy
    import random

    for seed in range(300):
        rng = random.Random(seed)
        policy = make_policy(name)
        if isinstance(policy, Clock):
            policy.hand = rng.randrange(12)
        entries = [Entry(i, resident=True, frame=f, last_use=rng.randrange(6), use_count=rng.randrange(3),
                         referenced=rng.random() < 0.6, importance=rng.random(), relevance=rng.choice([0.0, 0.5]))
                   for i, f in enumerate(rng.sample(range(12), rng.randrange(1, 12)), start=1)]
        k = rng.randrange(1, 5)
        twin, copies = copy.deepcopy(policy), [copy.copy(e) for e in entries]
        expected: list[int] = []
        for _ in range(k):
            left = [e for e in copies if e.n not in expected]
            if not left:
                break
            expected.append(twin.victim(left, 7).n)
        before = [copy.copy(e) for e in entries], getattr(policy, "hand", None)
        assert [e.n for e in policy.peek(entries, 7, k)] == expected, seed
        assert (entries, getattr(policy, "hand", None)) == before, seed
