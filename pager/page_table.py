"""The page table: one entry per page of a session, resident or not."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Entry:
    """What the pager knows of one page at run time."""

    n: int
    tokens: int = 0
    resident: bool = False
    frame: int = -1
    pinned: bool = False
    referenced: bool = False   # CLOCK's second-chance bit, set on every use
    last_use: int = 0          # logical tick of the last use (replays are deterministic)
    use_count: int = 0
    fault_count: int = 0
    importance: float = 0.0    # set when sealed: how much the page holds that matters later
    relevance: float = 0.0     # fused search score at its last automatic use

    @property
    def id(self) -> str:
        return f"p{self.n}"


class PageTable(dict[int, Entry]):
    """page number → Entry, with a compact snapshot for persistence."""

    STATE_FIELDS = ("resident", "frame", "pinned", "referenced", "last_use", "use_count", "fault_count", "relevance")

    def resident(self) -> list[Entry]:
        return sorted((e for e in self.values() if e.resident), key=lambda e: e.n)

    def snapshot(self, every: bool = False) -> dict:
        """Entries as {n: [fields…]}: those that differ from a never-used page, or `every` one
        (replay needs every one: its pages were all just written, so none is never-used)."""
        # the fields of STATE_FIELDS, in its order, read directly (a flush snapshots thousands of entries)
        return {str(e.n): [e.resident, e.frame, e.pinned, e.referenced, e.last_use, e.use_count, e.fault_count,
                           e.relevance] for e in self.values()
                if every or e.resident or e.pinned or e.use_count or e.fault_count}

    def restore(self, rows: dict) -> None:
        for key, values in rows.items():
            entry = self.get(int(key))
            if entry is not None:
                for name, value in zip(self.STATE_FIELDS, values):
                    setattr(entry, name, value)
