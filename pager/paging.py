"""The paging core: the page table, the frames and the eviction policy of one session, and no I/O.

Every page enters a frame through `fault` and leaves through `evict`; tools, automatic paging,
pinning and replay all go through those two, so each movement is one event. Pages are never
deleted: eviction only changes residency. What the core cannot know it is handed: the open tail
page's number (it moves as pages seal), where events go, and what to do with a page as it leaves
(the session bookmarks a page that has no keyword yet, so it can be found again).
"""

from __future__ import annotations

from typing import Callable, Iterable

from .errors import BudgetError, PageNotFound
from .frames import Frames
from .page import page_id
from .page_table import Entry, PageTable
from .policy import Policy, make_policy


class Paging:
    def __init__(self, frames: int, policy: Policy, emit: Callable, tail: Callable[[], int],
                 evicted: Callable[[Entry], None] = lambda entry: None) -> None:
        self.table = PageTable()
        self.policy = policy
        self.frames = Frames(frames, self.table, policy)
        self.emit, self.tail, self.evicted = emit, tail, evicted
        self.tick = 0
        self.counters = {"faults": 0, "hits": 0, "evictions": 0}   # since the session began: kept in its page table
        self.in_use: set[int] = set()   # pages referenced for the current message; evicted last

    def fault(self, n: int, reason: str, protect: Iterable[int] = ()) -> bool:
        """Reference page n: load it into a frame if it is not resident. True if that was a fault."""
        entry = self.table.get(n)
        if entry is None:
            raise PageNotFound(f"page p{n} does not exist; this session has pages p1..p{self.tail()}")
        self.tick += 1
        if entry.resident:
            self.use(entry)
            self.counters["hits"] += 1
            self.emit("hit", page=page_id(n), reason=reason)
            return False
        slot = self.frames.free_slot()
        if slot is None:   # (automatic paging made room for its whole batch already)
            self.frames.make_room({self.tail(), n, *protect}, self.tick, self.evict, keep=self.in_use)
        self.frames.place(entry, slot)
        entry.fault_count += 1
        self.use(entry)
        self.counters["faults"] += 1
        self.emit("fault", page=page_id(n), frame=entry.frame, reason=reason, tokens=entry.tokens)
        return True

    def use(self, entry: Entry) -> None:
        self.in_use.add(entry.n)
        entry.last_use = self.tick
        entry.use_count += 1
        entry.referenced = True
        self.policy.touch(entry, self.tick)

    def evict(self, entry: Entry, reason: str = "policy") -> None:
        frame = entry.frame
        self.frames.release(entry)
        self.counters["evictions"] += 1
        self.emit("evict", page=entry.id, frame=frame, reason=reason, policy=self.policy.name)
        self.evicted(entry)

    def make_room(self, wanted: Iterable[int], free: int) -> None:
        """One eviction for a whole batch of pages to come (automatic paging): the policy sees every
        candidate once."""
        self.frames.make_room({self.tail(), *wanted}, self.tick, self.evict, free=free, keep=self.in_use)

    def writing(self, n: int) -> Entry:
        """The entry of a page being written (the tail, or a page a long turn filled): always resident."""
        entry = self.table.get(n) or self.table.setdefault(n, Entry(n))
        if not entry.resident:
            self.frames.make_room({n}, self.tick, self.evict)
            self.frames.place(entry)
        return entry

    def adopt(self, n: int, tokens: int, importance: float) -> Entry:
        """A sealed page's entry, made or updated (a page the session loads or seals)."""
        entry = self.table.get(n) or Entry(n)
        entry.tokens, entry.importance = tokens, importance
        self.table[n] = entry
        return entry

    def adopt_stored(self, tokens, importance) -> None:
        """The entries of the pages a session opens with, p1..pk (their sizes as arrays), none used yet."""
        self.table.adopt_stored(tokens, importance)

    def page_out(self, n: int) -> None:
        entry = self.table[n]
        if n == self.tail():
            raise BudgetError(f"p{n} is the open tail page and stays resident")
        if entry.pinned:
            raise BudgetError(f"p{n} is pinned; unpin it first")
        if entry.resident:
            self.evict(entry, reason="page_out")

    def check_pin(self, n: int) -> None:
        """BudgetError if pinning page n would leave no frame free (the tail and one free frame stay)."""
        pinned = self.pinned_count()
        if not self.table[n].pinned and pinned + 3 > self.frames.count:
            raise BudgetError(f"pinning p{n} would leave no frame free ({self.frames.count} frames, {pinned} pinned); "
                              "unpin a page or raise --budget")

    def pinned_count(self) -> int:
        """Pinned pages are always resident, so the frames are enough to count them."""
        return sum(1 for n in self.frames.slots if n is not None and self.table[n].pinned)

    def set_policy(self, name: str, quiet: bool = False) -> None:
        """Switch the eviction policy; the page table (use counts, referenced bits) carries over."""
        self.policy = make_policy(name)
        self.frames.policy = self.policy
        if not quiet:
            self.emit("policy", policy=self.policy.name)

    def resize(self, count: int) -> None:
        """Set the number of frames (the context budget changed); evicts by policy when shrinking."""
        pinned = self.pinned_count()
        if count < pinned + 1:
            raise BudgetError(
                f"the budget leaves {count} frame(s) but {pinned} pinned page(s) and the tail need {pinned + 1}; "
                "raise --budget or unpin pages"
            )
        if count != self.frames.count:
            before = self.frames.count
            self.frames.resize(count, {self.tail()}, self.tick, self.evict, keep=self.in_use)
            self.emit("resize", frames=count, was=before)

    def resident(self) -> list[int]:
        return sorted(n for n in self.frames.slots if n is not None)

    def restore(self, state: dict) -> None:
        """Take the page table a process stored (its resident pages placed again, in new frames if
        the count changed)."""
        self.tick = int(state.get("tick", 0))
        self.counters.update(state.get("counters", {}))
        self.table.restore(state.get("table", {}))
        self.place_resident()

    def place_resident(self) -> None:
        """Put restored resident pages back in frames (new frame numbers if the count changed)."""
        tail_n = self.tail()
        made = self.table.touched()   # an entry never made is not resident
        resident = sorted((e for e in made if e.resident and e.n != tail_n), key=lambda e: (-e.pinned, -e.last_use))
        for e in made:
            e.resident, e.frame = False, -1
        self.frames.slots = [None] * self.frames.count
        tail = self.table.setdefault(tail_n, Entry(tail_n))
        self.frames.place(tail)
        for e in resident:
            if self.frames.free_slot() is None:
                break
            self.frames.place(e)

    def state(self, every: bool = True) -> dict:
        """The page table, frame slots, CLOCK hand and counters (Session.paging_state adds how pages are cut)."""
        return {"table": self.table.snapshot(every), "slots": list(self.frames.slots), "tick": self.tick,
                "counters": dict(self.counters), "policy": self.policy.name, "hand": getattr(self.policy, "hand", 0)}

    def load(self, state: dict) -> None:
        """Return to a paging state exactly (pages themselves are untouched)."""
        self.in_use = set()
        self.table.restore(state["table"])
        self.frames.slots = list(state["slots"])
        self.tick, self.counters = state["tick"], dict(state["counters"])
        self.set_policy(state["policy"], quiet=True)
        if hasattr(self.policy, "hand"):
            self.policy.hand = state["hand"]

    def stats(self) -> dict:
        c = self.counters
        uses = c["faults"] + c["hits"]
        return {**c, "hit_rate": round(c["hits"] / uses, 3) if uses else 0.0, "frames": self.frames.count,
                "used": self.frames.used()}
