"""The page table: one entry per page of a session, resident or not."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from numbers import Integral


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


class PageTable(MutableMapping[int, Entry]):
    """page number → Entry, with a compact snapshot for persistence.

    The pages a session opens with are never-used entries until touched: their sizes are kept as arrays
    (`adopt_stored`) and each Entry is made when first asked for, so an open of 100K pages makes none, and
    a snapshot reads only the entries made (one never made is never used)."""

    STATE_FIELDS = ("resident", "frame", "pinned", "referenced", "last_use", "use_count", "fault_count", "relevance")
    UNUSED = [False, -1, False, False, 0, 0, 0, 0.0]   # a never-used entry's STATE_FIELDS

    def __init__(self) -> None:
        self._entries: dict[int, Entry] = {}
        self._count = 0          # pages 1.._count have entries, made or not
        self._tokens: Sequence[int] = ()
        self._importance: Sequence[float] = ()

    def adopt_stored(self, tokens: Sequence[int], importance: Sequence[float]) -> None:
        """Entries for pages 1..len(tokens), sealed and never used, made when first asked for."""
        assert not self._entries and not self._count, "the stored pages are adopted into an empty table"
        self._count, self._tokens, self._importance = len(tokens), tokens, importance

    def __getitem__(self, n: int) -> Entry:
        entry = self._entries.get(n)
        if entry is None:
            if not (isinstance(n, Integral) and 1 <= n <= self._count):
                raise KeyError(n)
            n = int(n)
            # setdefault: two threads making one entry both get the one kept
            entry = self._entries.setdefault(n, Entry(n, int(self._tokens[n - 1]), importance=float(self._importance[n - 1])))
        return entry

    def __setitem__(self, n: int, entry: Entry) -> None:
        self._entries[n] = entry

    def __delitem__(self, n: int) -> None:
        raise TypeError("pages are never deleted: eviction only changes residency")

    def __contains__(self, n: object) -> bool:
        return (isinstance(n, Integral) and 1 <= int(n) <= self._count) or n in self._entries

    def __len__(self) -> int:
        return self._count + sum(1 for n in self._entries if n > self._count)

    def __iter__(self) -> Iterator[int]:
        yield from range(1, self._count + 1)
        yield from (n for n in self._entries if n > self._count)

    def touched(self) -> list[Entry]:
        """The entries made so far, in page order: every other one is a never-used page's."""
        return [self._entries[n] for n in sorted(self._entries)]

    def resident(self) -> list[Entry]:
        return [e for e in self.touched() if e.resident]

    def snapshot(self, every: bool = False) -> dict:
        """Entries as {n: [fields…]}: those that differ from a never-used page, or `every` one
        (replay needs every one: its pages were all just written, so none is never-used)."""
        def row(e: Entry) -> list:   # the fields of STATE_FIELDS, in its order (a flush snapshots thousands)
            return [e.resident, e.frame, e.pinned, e.referenced, e.last_use, e.use_count, e.fault_count, e.relevance]

        if every:
            made = self._entries
            return {str(n): row(made[n]) if n in made else list(self.UNUSED) for n in self}
        return {str(e.n): row(e) for e in self.touched() if e.resident or e.pinned or e.use_count or e.fault_count}

    def restore(self, rows: dict) -> None:
        """Entries as snapshot gave them (a page the table does not hold is skipped); those of the stored
        pages made here at once, with their fields (a large session's state holds thousands)."""
        entries, count, tokens, importance = self._entries, self._count, self._tokens, self._importance
        width = len(self.STATE_FIELDS)
        for key, values in rows.items():
            n = int(key)
            entry = entries.get(n)
            if entry is None and 1 <= n <= count and len(values) == width:
                resident, frame, pinned, referenced, last_use, use_count, fault_count, relevance = values
                entries[n] = Entry(n, int(tokens[n - 1]), resident, frame, pinned, referenced, last_use, use_count,
                                   fault_count, float(importance[n - 1]), relevance)
            elif entry is not None or 1 <= n <= count:
                entry = self[n]
                for name, value in zip(self.STATE_FIELDS, values):
                    setattr(entry, name, value)
