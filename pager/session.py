"""One session's virtual memory: the door users hold, over rooms that each own one concept.

- `paging.Paging`: the page table, the frames and the eviction policy, with no I/O (every page
  enters a frame through `fault` and leaves through `evict`);
- `intake.Intake`: turns checked, numbered, packed onto pages, sealed and embedded;
- `tiers.Tiers`: the working state, facts and summaries, one versioned-record mechanism;
- `memory_calls.MemoryCalls`: what the bookmark or memory model is owed, and its calls;
- `retrieval.Retrieval`: search and automatic paging.

The session itself loads what the store holds, takes in what other processes wrote (`sync`,
`follow`, `adopt`), makes bookmarks and pins, and says what its home should write (`take_pending`).
Pages are never deleted: eviction only changes residency.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Iterable, cast

import numpy as np

from . import bookmarks as bm
from .errors import InputError, PageNotFound, StoreError
from .intake import Intake, own_text
from .memory_calls import MemoryCalls
from .page import Packer, Page, Pages, Turn, page_id, parse_page_id
from .page_table import Entry
from .paging import Paging
from .policy import make_policy
from .render import Renderer
from .retrieval import Retrieval
from .search import Index
from .state import Change
from .store import Batch, LanceStore, PageColumns
from .tiers import Tiers
from .trace import Events

if TYPE_CHECKING:
    from .home import Home


def settle() -> None:
    """For long-running processes (the REPL, the MCP server): move what is loaded now out of the
    garbage collector's sight. A loaded session is hundreds of thousands of long-lived objects;
    without this every full collection walks them all, a 20-50 ms pause in the middle of some
    turn. Process-wide, so the library never calls it on its own."""
    import gc

    gc.freeze()


FOLLOWED = ("turns", "states", "bookmarks", "state_changes", "facts", "summaries")   # what Session.follow reads


class Session:
    def __init__(self, home: "Home", user: str, name: str, policy: str | None = None, source=None) -> None:
        cfg = home.config
        self.home, self.user, self.name = home, user, name
        self.source = source  # where the session loads from: a snapshot for read-only opens, else the store
        self.tokenizer = home.tokenizer
        self.clock = home.clock
        self.events = Events(home.clock)
        state = (source or home.store).state(user, name) or {}
        # how pages are cut is the session's, not the process's: every process that packs the session must
        # seal the same pages, whatever model (and tokenizer) it talks to. Fixed by the first transaction
        # (a `settings` op in its journal frame), then kept in the stored state.
        self.page_tokens = int(state.get("page_tokens", cfg.page_tokens))
        self.settled = "page_tokens" in state
        self.pages: Pages = Pages()
        self.directory = bm.Directory()
        # a snapshot knows its vectors' size: a read-only open that embeds nothing loads no embedder
        self.index = Index(getattr(source, "dim", 0) or home.embedder.dim)
        self.packer = Packer(name, self._pack_tokenizer(state.get("encoding")), self.page_tokens, user=user)
        # a policy asked for (an argument, --policy, PAGER_POLICY) wins over the one the session last ran
        self.paging = Paging(max(1, (cfg.budget - cfg.map_reserve) // self.page_tokens),
                             make_policy(policy or cfg.policy or state.get("policy") or "clock"),
                             self.emit, lambda: self.tail_n, self._evicted)
        self.turn_count = 0                 # every turn up to this one is on a page or the open tail
        self.next_start = 0                 # where turn turn_count + 1 resumes (a page may end inside it)
        self.generation = -1                # journal ops of other processes taken in, as the lock counts them
        self.traced = dict(self.counters)   # the counters when its trace began (trace.begin; session_end counts from them)
        self.pending = Batch()
        self.journal_offsets: dict[str, int] = {}
        self._marks_in: list[bm.Bookmark] = []   # bookmarks other processes made, taken in since the open
        self.memory_error = ""          # the memory model's last failure, if any
        self.intake = Intake(self)
        self.tiers = Tiers(self)
        self.state, self.facts, self.summaries = self.tiers.state, self.tiers.facts, self.tiers.summaries
        self.calls = MemoryCalls(self)
        self.retrieval = Retrieval(self)
        self.render = Renderer(self)
        self._state_stored: dict | None = None   # the page table as last written to the store
        self._load(state)
        if source is not None:  # a snapshot holds what the store holds: nothing to write back unless it changes
            self._state_stored = self.paging_state(every=False)

    def _pack_tokenizer(self, encoding: str | None):
        if not encoding or encoding == self.tokenizer.name:
            return self.tokenizer
        from .tokens import get_tokenizer

        return get_tokenizer(encoding)

    def settings(self) -> dict:
        """How this session's pages are cut: the op the first transaction writes."""
        return {"op": "settings", "page_tokens": self.page_tokens, "encoding": self.packer.tokenizer.name}

    def settle(self, page_tokens: int, encoding: str) -> None:
        """Adopt the session's settings as its first transaction fixed them (before any turn is packed)."""
        if self.settled:
            return
        if self.turn_count or self.packer.pieces:
            raise StoreError(f"session {self.name!r} was packed before its settings arrived; run `pager check`")
        self.page_tokens = self.packer.page_tokens = int(page_tokens)
        self.packer.tokenizer = self._pack_tokenizer(encoding)
        self.settled = True

    # -- identity -----------------------------------------------------------------------------------
    @property
    def tail_n(self) -> int:
        return self.packer.next_n

    @property
    def page_count(self) -> int:
        """The session's pages: the sealed ones, and the open tail page when it holds anything."""
        return len(self.pages) + (1 if self.packer.pieces else 0)

    @property
    def begun(self) -> bool:
        """Whether the session holds anything: a turn, or a working state set before any turn."""
        return bool(self.turn_count or self.state.changes)

    def key(self) -> tuple[str, str]:
        return (self.user, self.name)

    def emit(self, kind: str, **data):
        return self.events.emit(kind, **data)

    # -- the rooms' state, as users of a session read it ------------------------------------------------
    table = property(lambda self: self.paging.table)
    frames = property(lambda self: self.paging.frames)
    policy = property(lambda self: self.paging.policy)
    tick = property(lambda self: self.paging.tick, lambda self, v: setattr(self.paging, "tick", v))
    counters = property(lambda self: self.paging.counters, lambda self, v: setattr(self.paging, "counters", v))
    in_use = property(lambda self: self.paging.in_use, lambda self, v: setattr(self.paging, "in_use", v))
    keys = property(lambda self: self.intake.keys)
    embedding_early = property(lambda self: self.intake.embedding_early)
    unwritten = property(lambda self: self.calls.unwritten, lambda self, v: setattr(self.calls, "unwritten", v))
    naming = property(lambda self: self.calls.naming)
    inherited = property(lambda self: self.calls.inherited, lambda self, v: setattr(self.calls, "inherited", v))
    writer_error = property(lambda self: self.calls.writer_error)

    # -- loading ------------------------------------------------------------------------------------
    def _load(self, state: dict) -> None:
        store = self.source or self.home.store
        cached, known = self.home.cached_index(self) or (None, None)
        stored = self._stored_pages(store, known) if cached is not None else None
        self.index_saved = -1  # the cache on disk is behind this index until it is written
        if cached is not None and stored is not None and cached.fits(cast(list, stored)):
            self.index = cached
            if known is not None or not isinstance(store, LanceStore):   # else written again, with the columns
                self.index_saved = len(cached)
        else:   # no cache, or one made of other pages: the pages and their vectors, indexed here
            pages, vectors = store.pages(self.user, self.name)
            k = next((i for i, p in enumerate(pages) if p.n != i + 1), len(pages))
            stored = pages[:k]
            for page, vector in zip(stored, vectors[:k]):
                self.index.add(page, vector)
        self.pages = Pages(stored)
        self.paging.adopt_stored(*self._sizes(stored))
        self.directory = bm.Directory.opened(store.bookmarks(self.user, self.name), self._keywords_of(stored))
        count = len(stored)
        self.packer.next_n = count + 1
        if count:  # the packer resumes where the last sealed page ended, maybe inside a turn
            turn, _, end = self.pages[count].spans[-1]
            self.turn_count, self.next_start = turn - 1, end
        resealed = self.tail_n
        self.intake.take(store.turns(self.user, self.name, after=self.turn_count))
        self.tiers.load(store)
        # owed when the last process let the session go (kept by a process with no model too, for the next
        # that has one), or sealed again here: pages a process killed before its flush had sealed (its turns
        # recovered, its pages not), maybe named, maybe not: named again, at least once
        owed = {n for n in state.get("unwritten", ()) if n in self.pages}
        if self.home.config.writer_model:
            owed |= set(range(resealed, self.tail_n))
            self.calls.inherited = bool(owed)
        self.calls.unwritten = sorted(owed)
        self.paging.restore(state)

    def _stored_pages(self, store, known=None) -> "PageColumns | list[Page]":
        """The gapless run p1..pk of the pages the store holds, undecoded where the store keeps columns
        (only that run is trusted: anything after a hole is sealed again from the turns); `known`, the
        columns the index cache kept, spares reading those pages again."""
        if isinstance(store, LanceStore):
            columns = store.page_columns(self.user, self.name, known)
            holes = np.flatnonzero(columns.n != np.arange(1, len(columns) + 1))
            return columns.head(int(holes[0]) if len(holes) else len(columns))
        pages, _ = store.pages(self.user, self.name, with_vectors=False)
        return pages[:next((i for i, p in enumerate(pages) if p.n != i + 1), len(pages))]

    @staticmethod
    def _sizes(stored: "PageColumns | list[Page]") -> tuple:
        if isinstance(stored, PageColumns):
            return stored.tokens(), stored.importance()
        return [p.tokens for p in stored], [p.importance for p in stored]

    @staticmethod
    def _keywords_of(stored: "PageColumns | list[Page]"):
        return stored if isinstance(stored, PageColumns) else bm.PageKeywords([p.keywords for p in stored])

    # -- turns in -------------------------------------------------------------------------------------
    def append(self, speaker: str, text: str, role: str = "user", date: str = "", ts: float | None = None,
               ref: str = "", origin: str = "input", key: str = "") -> Turn:
        """Accept one message: durable in the journal before this returns, then packed onto pages."""
        message = dict(speaker=speaker, text=text, role=role, date=date, ts=ts, ref=ref, key=key)
        return self.append_many([message], origin)[0]

    def append_many(self, messages: Iterable[dict], origin: str = "input") -> list[Turn]:
        """Accept messages as one group commit (one fsync); all or none are accepted (Home.accept).

        A message may carry a "key": one whose key the session already holds is not stored again,
        and the turn that holds it is returned; with other words than that turn's, the whole group is
        refused (KeyReused). origin "input" (files, the API, another agent) is
        recorded in the trace as an `append` event that replay feeds back; "agent" and "tool" turns
        are regenerated by replay."""
        return self.home.accept({self: list(messages)}, origin)[self]

    def draft(self, m: dict) -> Turn:
        return self.intake.draft(m)

    def number(self, drafts: list[Turn], last_turn: int) -> tuple[list[Turn], list[Turn]]:
        return self.intake.number(drafts, last_turn)

    def held(self, key: str) -> int | None:
        return self.intake.held(key)

    def take_accepted(self, turns: list[Turn], origin: str) -> None:
        self.intake.take_accepted(turns, origin)

    def receive(self, records: list[dict]) -> list[Turn]:
        return self.intake.receive(records)

    # -- other processes ------------------------------------------------------------------------------
    def sync(self, lock=None) -> None:
        """Take in what other processes made durable since we last looked: their journal segments
        first, then the store for what was flushed out of segments we had not read. The counts are
        read before the journals, so every turn up to `last` is in one or the other."""
        if lock is not None:
            last, generation, dirty = lock.last_turn, lock.generation, lock.dirty
        else:
            (last, generation), dirty = self.home.read_counts(self), False
        if generation == self.generation and not dirty and self.turn_count >= last:
            return
        ops = [op for op in self.home.journal.read_new(self.journal_offsets, skip=self.home.withheld(self.key()))
               if op["user"] == self.user and op["session"] == self.name]
        for op in ops:
            if op["op"] == "settings":
                self.settle(op["page_tokens"], op["encoding"])
        read = sum(op["op"] != "settings" for op in ops)
        turns = [Turn.from_record(op) for op in ops if op["op"] == "turn"]
        self.intake.take(turns, announce="other process")
        last = max([last] + [t.turn for t in turns])
        refreshed = self.turn_count < last
        if refreshed:
            self.home.store.refresh()
            self._settle_stored()
            read += len(self.intake.take(self.home.store.turns(self.user, self.name, after=self.turn_count),
                                   announce="other process"))
            if not self.home.waiting(self.key()):   # else the lock counts a dead process's turns, still to recover
                self.intake.skip_missing(last)
        # the lock counts every op written; fewer read here means some (a state change, a fact, …) were
        # flushed out of segments this process had not read (their process closed meanwhile): the store has them
        missed = self.generation >= 0 and generation - self.generation > read
        self._take_marks([bm.Bookmark.from_dict(op) for op in ops if op["op"] == "bookmark"])
        self.tiers.take_journal(ops)
        if missed:
            self._take_stored_tiers(refreshed)
        self.intake.embed_pending()
        self.generation = generation

    def _take_marks(self, marks: list[bm.Bookmark]) -> None:
        """Bookmarks other processes made (from their journals, the store, or a dead process's segment),
        placed as their maker and every process opening the session from the store place them (a model's
        or a user's ahead of a page's own keywords), each new one an input event replay feeds back."""
        for mark in marks:
            if mark.uid and mark.uid in self.directory.uids:
                continue
            self.directory.add(mark.keywords, mark.pages, mark.note, mark.uid, first=mark.source != "auto")
            self._marks_in.append(mark)
            self.emit("bookmark_in", **mark.to_dict())

    def _settle_stored(self) -> None:
        """Before the first turns read from the store: the settings another home stored with them, when
        it made the session after this process opened it."""
        if not self.settled and not self.turn_count:
            state = self.home.store.state(self.user, self.name) or {}
            if "page_tokens" in state:
                self.settle(state["page_tokens"], state.get("encoding") or self.packer.tokenizer.name)

    def catch_up(self) -> None:
        """Take in what another home flushed to the store (this home just took the session's lease)."""
        self.home.store.refresh()
        self._settle_stored()
        self.intake.take(self.home.store.turns(self.user, self.name, after=self.turn_count), announce="other process")
        self.intake.embed_pending()

    def follow(self) -> None:
        """A reader's catch-up on a session another home may be writing: its turns, bookmarks, state
        changes, facts and summaries flushed to the store since. The lock files this home's processes
        share say nothing of other homes, so `sync` alone would show the session as it was when opened here.
        The tables read are brought to their latest versions once (on an object store each is a listing)."""
        store = self.home.store
        store.refresh(FOLLOWED)
        self._settle_stored()
        self.intake.take(store.turns(self.user, self.name, after=self.turn_count), announce="other process")
        self.intake.embed_pending()
        self._take_stored_tiers(refreshed=True)

    def _take_stored_tiers(self, refreshed: bool = False) -> None:
        """The bookmarks, state changes, facts and summaries other processes flushed to the store that this
        one has not taken in (their journal segments went before it read them, or another home wrote them)."""
        store = self.home.store
        if not refreshed:
            store.refresh()
        # known ones are skipped by uid (a bookmark of release 0.1 has none: read at open)
        self._take_marks([mark for mark in store.bookmarks(self.user, self.name) if mark.uid])
        self.tiers.take_stored()

    def adopt(self, ops: list[dict]) -> int:
        """A dead process's journal ops for this session (recovery): its turns, bookmarks and pins are
        ours to write to the store now. Returns the turns it held."""
        for op in ops:
            if op["op"] == "settings":
                self.settle(op["page_tokens"], op["encoding"])
        turns = [Turn.from_record(op) for op in ops if op["op"] == "turn"]
        self.pending.turns += turns  # the store keeps each turn once, whoever writes it
        sealed = self.tail_n
        self.intake.take(turns)
        # sealed by the dead process, maybe never named: at least once
        self.calls.owe([n for n in range(sealed, self.tail_n) if n in self.pages], inherited=True)
        marks = [bm.Bookmark.from_dict(op) for op in ops if op["op"] == "bookmark"]
        self.pending.bookmarks += [(self.user, self.name, mark) for mark in marks]
        self._take_marks(marks)
        for op in ops:
            if op["op"] == "pin" and op["page"] in self.table:
                self.table[op["page"]].pinned = op["pinned"]
        self.tiers.adopt(ops)   # kept once, whoever writes them
        self.intake.embed_pending()
        return len(turns)

    # -- the fault path -------------------------------------------------------------------------------
    def resolve(self, ref: str | int) -> int:
        """A page number from 'p42', '42' or 42; PageNotFound names what exists."""
        n = ref if isinstance(ref, int) else parse_page_id(str(ref))
        if n is None or n not in self.table:
            last = self.tail_n
            raise PageNotFound(f"page {ref!r} does not exist; this session has pages p1..p{last}")
        return n

    def fault(self, n: int, reason: str, protect: Iterable[int] = ()) -> bool:
        """Reference page n: load it into a frame if it is not resident. True if that was a fault."""
        return self.paging.fault(n, reason, protect)

    def _evicted(self, entry: Entry) -> None:
        """A page left its frame: one with no keyword gets an automatic bookmark, so it can be found again."""
        if not self.directory.keywords(entry.n) and entry.n in self.pages:
            own = own_text(self.pages[entry.n])
            words = bm.extract(own, words_first=self.home.config.words_first) or own.split(": ", 1)[-1].split()[:3]
            if words:
                self.add_bookmark(tuple(words), (entry.n,), "", "auto")

    def page_out(self, n: int) -> None:
        self.paging.page_out(n)

    def pin(self, n: int) -> None:
        if n == self.tail_n and not self.packer.pieces:   # nothing to keep resident (and, in a session with no
            # turns, no page table is stored: the pin would be lost at close)
            raise PageNotFound(f"p{n} holds nothing yet (the open page, no turn on it): add what should stay "
                               "resident first, then pin the page that holds it")
        self.paging.check_pin(n)
        self.fault(n, "pin")
        self._journal_op({"op": "pin", "page": n, "pinned": True})  # first: a write refused (the lease) changes nothing
        self.table[n].pinned = True
        self.emit("pin", page=page_id(n))

    def unpin(self, n: int) -> None:
        self._journal_op({"op": "pin", "page": n, "pinned": False})
        self.table[n].pinned = False
        self.emit("unpin", page=page_id(n))

    def set_policy(self, name: str, quiet: bool = False) -> None:
        self.paging.set_policy(name, quiet)

    def pinned_count(self) -> int:
        return self.paging.pinned_count()

    def resize(self, count: int) -> None:
        self.paging.resize(count)

    # -- bookmarks ------------------------------------------------------------------------------------
    def bookmark(self, pages: Iterable[int | str], keywords: Iterable[str], note: str = "", source: str = "model") -> bm.Bookmark:
        numbers = tuple(self.resolve(p) for p in pages)
        words = tuple(k.strip() for k in keywords if k and k.strip())
        if not words:
            raise InputError("a bookmark needs at least one keyword")
        return self.add_bookmark(words, numbers, note.strip(), source)

    def add_bookmark(self, keywords: tuple[str, ...], pages: tuple[int, ...], note: str, source: str) -> bm.Bookmark:
        """A bookmark of checked keywords on existing pages: journaled (but an automatic one, derived from
        the page text), placed in the directory, stored at the next flush."""
        mark = bm.Bookmark(keywords, pages, note, source, uuid.uuid4().hex[:12], self.clock())
        if source != "auto":  # automatic ones are derived from the page text: no fsync on the eviction path
            self._journal_op({"op": "bookmark", **mark.to_dict()})   # first: a write refused changes nothing
        self.directory.add(keywords, pages, note, mark.uid, first=source != "auto")
        self.pending.bookmarks.append((self.user, self.name, mark))
        self.emit("bookmark", pages=[page_id(p) for p in pages], keywords=list(keywords), note=note, source=source)
        return mark

    def _journal_op(self, record: dict) -> None:
        self.home.journal_op(self, record)

    # -- the memory tiers (tiers.Tiers) and the model's calls (memory_calls.MemoryCalls) ------------------
    def set_state(self, key: str, value: str | None, source: str = "model") -> Change | None:
        return self.tiers.set_state(key, value, source)

    def apply_state(self, changes: list[tuple[str, str | None]]) -> None:
        self.tiers.apply_state(changes)

    def extract_facts(self, producer, pages: list[int] | None = None) -> list:
        """Ask a producer (a memory model, or its recorded output) for facts of pages (tiers.Tiers.produce)."""
        return self.tiers.produce(producer, pages, self.add_facts)

    def add_facts(self, drafts: list, source: str) -> list:
        return self.tiers.add_facts(drafts, source)

    def summarize(self, producer, pages: list[int] | None = None) -> list:
        """Ask a producer for episode and rolling summaries of pages (tiers.Tiers.produce)."""
        return self.tiers.produce(producer, pages, self.add_summaries)

    def add_summaries(self, drafts: list, source: str) -> list:
        return self.tiers.add_summaries(drafts, source)

    def turn_pages(self, wanted: set[int]) -> dict[int, tuple[list[int], float]]:
        return self.tiers.turn_pages(wanted)

    def write_memory(self) -> None:
        self.calls.write_memory()

    def closed_episodes(self) -> list[list[Turn]]:
        return self.calls.closed_episodes()

    def write_bookmarks(self, force: bool = False, episodes: list[list[Turn]] | None = None) -> list:
        return self.calls.write_bookmarks(force, episodes)

    def writer_due(self, force: bool = False) -> bool:
        return self.calls.due(force)

    def writer_call(self):
        return self.calls.call()

    def writer_answered(self, call, reply) -> list:
        return self.calls.answered(call, reply)

    def writer_failed(self, call, exc: Exception) -> None:
        self.calls.failed(call, exc)

    def write_rest(self) -> None:
        self.calls.write_rest()

    def apply_written(self, marks) -> None:
        self.calls.apply_written(marks)

    def apply_memory(self, answer, pages: list[int]) -> None:
        self.calls.apply_memory(answer, pages)

    # -- search and automatic paging (retrieval.Retrieval) ----------------------------------------------
    def search(self, query: str, k: int = 8, exclude: Iterable[int] = (), boosts: dict[int, float] | None = None,
               record: bool = True, tail: bool = True, depth: int | None = None) -> list:
        return self.retrieval.search(query, k, exclude, boosts, record, tail, depth)

    def weak(self, query: str, hits: list) -> list[bool]:
        return self.retrieval.weak(query, hits)

    def autopage_room(self, frames: int | None = None, share: float | None = None) -> int:
        return self.retrieval.autopage_room(frames, share)

    def paging_plan(self, hits: list, room: int) -> list[int]:
        return self.retrieval.paging_plan(hits, room)

    def autopage(self, query: str, share: float | None = None, min_score: float | None = None,
                 hits: list | None = None) -> list:
        return self.retrieval.autopage(query, share, min_score, hits)

    # -- views ----------------------------------------------------------------------------------------
    def resident(self) -> list[int]:
        return self.paging.resident()

    def paging_state(self, every: bool = True) -> dict:
        """The page table, frame slots, CLOCK hand and counters, and how pages are cut: the one
        representation of the paging state. Replay resumes from it and the benchmark returns to it
        (every entry); the store keeps it for the next process (only the used entries)."""
        return {"page_tokens": self.page_tokens, "encoding": self.packer.tokenizer.name, **self.paging.state(every)}

    def load_paging_state(self, state: dict) -> None:
        """Return to a paging state exactly (pages themselves are untouched)."""
        self.paging.load(state)

    def stats(self) -> dict:
        p = self.paging.stats()
        return {**{k: p[k] for k in ("faults", "hits", "evictions", "hit_rate")}, "pages": len(self.pages),
                "turns": self.turn_count, "frames": p["frames"], "used": p["used"]}

    def take_pending(self) -> Batch:
        self.intake.embed_pending()
        batch, self.pending = self.pending, Batch()
        if not self.settled and not self.turn_count:
            return batch   # opened, never written: storing its page table would make the session (and settle it)
        state = self.paging_state(every=False)
        owed = sorted(self.calls.naming + self.calls.unwritten)
        if owed:   # the pages the writer still owes, a call's under way among them: the next open names them
            state["unwritten"] = owed
        if state != self._state_stored:  # an unchanged page table is not written again
            batch.states[self.key()] = state
            self._state_stored = state
        return batch
