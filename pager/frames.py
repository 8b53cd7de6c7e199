"""The frame table: fixed-size slots of the prompt, and the loop that evicts until a page fits."""

from __future__ import annotations

from typing import Callable, Collection

from .errors import BudgetError
from .page_table import Entry, PageTable
from .policy import Policy


class Frames:
    """`count` slots of page_tokens tokens; each holds one page number or None."""

    def __init__(self, count: int, table: PageTable, policy: Policy):
        self.slots: list[int | None] = [None] * count
        self.table = table
        self.policy = policy

    @property
    def count(self) -> int:
        return len(self.slots)

    def used(self) -> int:
        return len(self.slots) - self.slots.count(None)

    def free_slot(self) -> int | None:
        try:
            return self.slots.index(None)
        except ValueError:
            return None

    def place(self, entry: Entry, slot: int | None = None) -> int:
        """Put the page in `slot`, which must be the first free one (the caller just found it), or find it."""
        slot = self.free_slot() if slot is None else slot
        assert slot is not None and self.slots[slot] is None, "make_room before place"
        self.slots[slot] = entry.n
        entry.resident, entry.frame = True, slot
        return slot

    def release(self, entry: Entry) -> None:
        if entry.resident and 0 <= entry.frame < len(self.slots) and self.slots[entry.frame] == entry.n:
            self.slots[entry.frame] = None
        entry.resident, entry.frame, entry.referenced = False, -1, False

    def candidates(self, protect: Collection[int], keep: Collection[int] = ()) -> list[Entry]:
        return [
            self.table[n]
            for n in self.slots
            if n is not None and n not in protect and n not in keep and not self.table[n].pinned
        ]

    def make_room(self, protect: Collection[int], now: int, evict: Callable[[Entry], None], free: int = 1,
                  keep: Collection[int] = ()) -> None:
        """Evict by policy until `free` slots are empty; protected and pinned pages stay, and pages
        in `keep` (those the current message is using) go only when nothing else can."""
        missing = free - self.slots.count(None)
        if missing <= 0:
            return
        # `keep` is read, not copied: a session asked many questions without a turn between them (a
        # benchmark) holds thousands of pages in use
        victims = self.policy.victims(self.candidates(protect, keep), now, missing)
        if len(victims) < missing and keep:
            # among pages the current message uses, the least relevant go first
            taken = {e.n for e in victims}
            in_use = [e for e in self.candidates(protect) if e.n not in taken]
            victims += sorted(in_use, key=lambda e: (e.relevance, e.last_use, e.n))[: missing - len(victims)]
        if len(victims) < missing:
            raise BudgetError(
                f"all {self.used()} frames hold pinned or in-use pages, so nothing can be paged in; "
                "raise --budget, unpin a page, or lower page_tokens"
            )
        for victim in victims:
            evict(victim)

    def resize(self, count: int, protect: Collection[int], now: int, evict: Callable[[Entry], None],
               keep: Collection[int] = ()) -> None:
        """Grow or shrink to `count` slots, evicting by policy when the resident set no longer fits."""
        if count < 1:
            raise BudgetError("the budget leaves no frame for pages; raise --budget or lower page_tokens")
        if count < self.count:
            self.make_room(protect, now, evict, free=self.count - count, keep=keep)
            keep = [n for n in self.slots if n is not None]
            self.slots = [None] * count
            # pages above the new top move down into free slots; their frame numbers change
            for n in keep:
                entry = self.table[n]
                if entry.frame < count:
                    self.slots[entry.frame] = n
            for n in keep:
                entry = self.table[n]
                if entry.frame >= count:
                    slot = self.free_slot()
                    assert slot is not None, "make_room freed a slot for every page kept"
                    self.slots[slot] = n
                    entry.frame = slot
        else:
            self.slots.extend([None] * (count - self.count))
