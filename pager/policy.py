"""Eviction policies: which resident page gives up its frame.

A policy is told of every use (`touch`) and asked for a victim among the candidates the
frame table offers (never pinned pages, never the open tail). Policies do no I/O and
read nothing but the page-table entries, so a replay under another policy is exact.

CLOCK is the default: it approximates LRU with one bit per frame, so a page that was used
once long ago and a page used again since are told apart without a sorted structure, and
in traces of agent sessions (bursty re-reads of the same few pages) it stays near LRU
while costing O(1) per use.
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Protocol, Sequence

from .page_table import Entry


class Policy(Protocol):
    name: str

    def touch(self, entry: Entry, now: int) -> None: ...

    def victim(self, candidates: Sequence[Entry], now: int) -> Entry: ...

    def victims(self, candidates: Sequence[Entry], now: int, k: int) -> list[Entry]: ...

    def peek(self, candidates: Sequence[Entry], now: int, k: int) -> list[Entry]:
        """The pages victim() would pick in turn, each time among the candidates left, changing nothing."""
        ...


class _Ranked:
    """A policy that orders candidates by a key: the k victims are the k smallest."""

    def key(self, entry: Entry, now: int):
        raise NotImplementedError

    def touch(self, entry: Entry, now: int) -> None:
        pass

    def victim(self, candidates: Sequence[Entry], now: int) -> Entry:
        return min(candidates, key=lambda e: self.key(e, now))

    def victims(self, candidates: Sequence[Entry], now: int, k: int) -> list[Entry]:
        return sorted(candidates, key=lambda e: self.key(e, now))[:k]

    def peek(self, candidates: Sequence[Entry], now: int, k: int) -> list[Entry]:
        return self.victims(candidates, now, k)   # keys end in the page number: the k smallest, in order


class LRU(_Ranked):
    """Least recently used."""

    name = "lru"

    def key(self, e: Entry, now: int):
        return (e.last_use, e.n)


class LFU(_Ranked):
    """Least frequently used; the least recent among equals."""

    name = "lfu"

    def key(self, e: Entry, now: int):
        return (e.use_count, e.last_use, e.n)


_FRAME = attrgetter("frame")


class Clock:
    """Second chance: the hand sweeps frames, clearing referenced bits, and takes the first clear one."""

    name = "clock"

    def __init__(self) -> None:
        self.hand = 0

    def touch(self, entry: Entry, now: int) -> None:
        pass  # the referenced bit is set by the page table on every use

    def victim(self, candidates: Sequence[Entry], now: int) -> Entry:
        return self.victims(candidates, now, 1)[0]

    def victims(self, candidates: Sequence[Entry], now: int, k: int) -> list[Entry]:
        """One sweep of the hand that takes k pages, clearing the bits it passes."""
        ring = sorted(candidates, key=_FRAME)
        k = min(k, len(ring))
        start = next((i for i, e in enumerate(ring) if e.frame >= self.hand), 0)
        taken: list[Entry] = []
        chosen: set[int] = set()
        step = 0
        while len(taken) < k:
            entry = ring[(start + step) % len(ring)]
            step += 1
            if entry.n in chosen:
                continue
            if entry.referenced:
                entry.referenced = False
                continue
            taken.append(entry)
            chosen.add(entry.n)
            self.hand = entry.frame + 1
        return taken

    def peek(self, candidates: Sequence[Entry], now: int, k: int) -> list[Entry]:
        """victim() k times, as on copies of the entries and the hand: the bits it would clear are
        remembered instead (the memory map's pressure notice asks this every turn)."""
        ring = sorted(candidates, key=lambda e: e.frame)
        hand, cleared, taken, chosen = self.hand, set(), [], set()
        for _ in range(min(k, len(ring))):
            left = [e for e in ring if e.n not in chosen]
            at = next((i for i, e in enumerate(left) if e.frame >= hand), 0)
            while True:
                entry = left[at % len(left)]
                at += 1
                if entry.referenced and entry.n not in cleared:
                    cleared.add(entry.n)
                    continue
                taken.append(entry)
                chosen.add(entry.n)
                hand = entry.frame + 1
                break
        return taken


class Scored(_Ranked):
    """Evicts the lowest recency × importance × relevance.

    recency halves every `half_life` ticks since last use; importance (what the page holds:
    names, numbers, decisions) and relevance (its last search score) each count from a floor
    so that a page scoring zero on one signal is still ordered by the others.
    """

    name = "scored"

    def __init__(self, half_life: float = 32.0) -> None:
        self.half_life = half_life

    def score(self, entry: Entry, now: int) -> float:
        recency = math.exp2(-(now - entry.last_use) / self.half_life)
        return recency * (0.5 + entry.importance) * (0.25 + entry.relevance)

    def key(self, e: Entry, now: int):
        return (self.score(e, now), e.last_use, e.n)


POLICY_CLASSES = {cls.name: cls for cls in (Clock, LRU, LFU, Scored)}


def make_policy(name: str) -> Policy:
    from .errors import ConfigError

    try:
        return POLICY_CLASSES[name]()
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(POLICY_CLASSES)}") from None
