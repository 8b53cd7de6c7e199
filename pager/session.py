"""One session's virtual memory: the page table, the frames, the open tail, the index.

Every page enters a frame through `fault` and leaves through `_evict`; tools, automatic
paging, pinning and replay all go through those two, so each movement is one event.
Pages are never deleted: eviction only changes residency.
"""

from __future__ import annotations

import numbers
import time
import uuid
from typing import TYPE_CHECKING, Iterable

import numpy as np

from . import bookmarks as bm
from .errors import BudgetError, InputError, KeyReused, PageNotFound, PagerError, StoreError
from .formats import MAX_TS
from .frames import Frames
from .page import Packer, Page, Turn, page_id, parse_page_id
from .page_table import Entry, PageTable
from .policy import make_policy
from .render import Renderer
from .rerank import rerank_pieces
from .search import QUESTION, QUOTE, Hit, Index, echoes, is_weak, label_time, piece_kind, terms
from .facts import Draft, Fact, Facts, fact_record
from .state import Change, State, check as check_state
from .store import Batch, fact_from
from .summaries import (EPISODE, ROLLING, Draft as SummaryDraft, Episodes, Extractive, Summaries, Summary, session_turns,
                        summary_event, summary_from, summary_record)
from .trace import Events

if TYPE_CHECKING:
    from .home import Home

SPEAKER_TOKENS = 16
LIVE_LOOKBACK = 500   # turns a live session reads back, once, for the episodes not summarized yet (pager summarize: all)


def settle() -> None:
    """For long-running processes (the REPL, the MCP server): move what is loaded now out of the
    garbage collector's sight. A loaded session is hundreds of thousands of long-lived objects;
    without this every full collection walks them all, a 20-50 ms pause in the middle of some
    turn. Process-wide, so the library never calls it on its own."""
    import gc

    gc.freeze()


def date_label(ts: float) -> str:
    return time.strftime("%-d %b %Y", time.localtime(ts))


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
        # a policy asked for (an argument, --policy, PAGER_POLICY) wins over the one the session last ran
        self.policy = make_policy(policy or cfg.policy or state.get("policy") or "clock")
        self.table = PageTable()
        self.pages: dict[int, Page] = {}
        self.directory = bm.Directory()
        self.index = Index(home.embedder.dim)
        self.packer = Packer(name, self._pack_tokenizer(state.get("encoding")), self.page_tokens, user=user)
        self.frames = Frames(max(1, (cfg.budget - cfg.map_reserve) // self.page_tokens), self.table, self.policy)
        self.tick = 0
        self.turn_count = 0                 # every turn up to this one is on a page or the open tail
        self._next_start = 0                # where turn turn_count + 1 resumes (a page may end inside it)
        self._speakers: dict[str, str] = {}   # speaker as sent → as kept (fit to SPEAKER_TOKENS)
        self._waiting: dict[int, tuple[Turn, bool]] = {}  # turns known ahead of a gap, and whether ours
        self.keys: dict[str, int] = {}      # idempotency key → turn, for the turns taken in
        self._keys_loaded = False
        self.generation = -1                # journal ops of other processes taken in, as the lock counts them
        self.counters = {"faults": 0, "hits": 0, "evictions": 0}   # since the session began: kept in its page table
        self.traced = dict(self.counters)   # the counters when its trace began (trace.begin; session_end counts from them)
        self.pending = Batch()
        self.journal_offsets: dict[str, int] = {}
        self._unembedded: list[Page] = []
        self.embedded_early: dict[str, np.ndarray] = {}   # turn text → its vector, made while the journal synced
        self.embedding_early: list = []   # (the embedding thread's future, the texts of ours it embeds), not yet taken
        self._counted: dict[int, tuple] = {}   # turn → (the turn, its line's tokens, its text's tokens): count_turns
        self.unwritten: list[int] = []      # sealed pages the bookmark model has not named yet (stored: take_pending)
        self.naming: list[int] = []         # pages of a call of it under way (pager serve's memory worker)
        self.episodes_owed: list[list[Turn]] = []   # closed episodes the memory model's next call summarizes
        self._retry_at = 0                  # after a failed call: no other until this page is the open tail
        self.inherited = False              # owes pages it did not seal (a restart, a crash): name them soon
        self._marks_in: list[bm.Bookmark] = []   # bookmarks other processes made, taken in since the open
        self.writer_error = ""              # the bookmark model's last failure, if any
        self.render = Renderer(self)
        self.in_use: set[int] = set()   # pages referenced for the current message; evicted last
        self.state = State()            # the working state: key → value, every change kept
        self.facts = Facts()            # facts a memory model made (or its recorded output), none deleted
        self.memory_error = ""          # the memory model's last failure, if any
        self._facts_waiting: dict[int, Fact] = {}
        self.summaries = Summaries()    # episode and rolling summaries, every version kept
        self._summaries_waiting: dict[int, Summary] = {}
        self._episodes: Episodes | None = None   # live summaries: episodes cut as turns arrive (made on first use)
        self._closed: list[list[Turn]] = []      # episodes closed since the last reply, not summarized yet
        self._backlog: list[list[Turn]] = []     # episodes closed before the first live use, not summarized yet
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

    # -- loading ------------------------------------------------------------------------------------
    def _load(self, state: dict) -> None:
        store = self.source or self.home.store
        cached = self.home.cached_index(self)
        pages, vectors = store.pages(self.user, self.name, with_vectors=cached is None)
        # only the gapless run p1..pk is trusted; anything after a hole is sealed again from the turns
        k = next((i for i, p in enumerate(pages) if p.n != i + 1), len(pages))
        pages, vectors = pages[:k], vectors[:k]
        self.index_saved = -1  # the cache on disk is behind this index until it is written
        if cached is not None and cached.fits(pages):
            self.index = cached
            self.index_saved = len(cached)
            for page in pages:
                self._adopt(page)
        else:
            if cached is not None:  # the cache was for other pages: decode the vectors after all
                pages, vectors = store.pages(self.user, self.name)
                pages, vectors = pages[:k], vectors[:k]
            for page, vector in zip(pages, vectors):
                self._index_page(page, vector)
        self.directory = bm.Directory.of(store.bookmarks(self.user, self.name), pages)
        self.packer.next_n = (pages[-1].n + 1) if pages else 1
        if pages:  # the packer resumes where the last sealed page ended, maybe inside a turn
            turn, _, end = pages[-1].spans[-1]
            self.turn_count, self._next_start = turn - 1, end
        resealed = self.tail_n
        self._take(store.turns(self.user, self.name, after=self.turn_count))
        self.state.take(store.state_changes(self.user, self.name))
        self._keep_facts(store.facts(self.user, self.name), event="")
        self._keep_summaries(store.summaries(self.user, self.name), event="")
        # owed when the last process let the session go (kept by a process with no model too, for the next
        # that has one), or sealed again here: pages a process killed before its flush had sealed (its turns
        # recovered, its pages not), maybe named, maybe not: named again, at least once
        owed = {n for n in state.get("unwritten", ()) if n in self.pages}
        if self.home.config.writer_model:
            owed |= set(range(resealed, self.tail_n))
            self.inherited = bool(owed)
        self.unwritten = sorted(owed)
        self.tick = int(state.get("tick", 0))
        self.counters.update(state.get("counters", {}))
        self.table.restore(state.get("table", {}))
        self._rebuild_frames()

    def _rebuild_frames(self) -> None:
        """Put restored resident pages back in frames (new frame numbers if the count changed)."""
        resident = sorted((e for e in self.table.values() if e.resident and e.n != self.tail_n),
                          key=lambda e: (-e.pinned, -e.last_use))
        for e in self.table.values():
            e.resident, e.frame = False, -1
        self.frames.slots = [None] * self.frames.count
        tail = self.table.setdefault(self.tail_n, Entry(self.tail_n))
        self.frames.place(tail)
        for e in resident:
            if self.frames.free_slot() is None:
                break
            self.frames.place(e)

    def _index_page(self, page: Page, vectors: np.ndarray) -> None:
        self.index.add(page, vectors)
        self._adopt(page)

    def _adopt(self, page: Page) -> None:
        self.pages[page.n] = page   # its keywords go into the directory the open makes (Directory.of)
        entry = self.table.get(page.n) or Entry(page.n)
        entry.tokens, entry.importance = page.tokens, page.importance
        self.table[page.n] = entry

    # -- writing ------------------------------------------------------------------------------------
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
        """A message checked and normalized, not yet numbered; InputError names what is wrong."""
        if not isinstance(m, dict):
            raise InputError("a message is an object with a \"text\"; send one")
        text = m.get("text")
        if text is not None and not isinstance(text, str):
            raise InputError(f"a message's text must be a string, not {type(text).__name__} {str(text)[:40]}; "
                             "send it as a string")
        if not isinstance(text, str) or not text.strip():
            raise InputError("an empty message has nothing to remember; send some text")
        if "\x00" in text:
            raise InputError("the message contains a NUL character; remove it and send again")
        for name in ("speaker", "role", "date", "ref", "key"):   # the journal's reader refuses a turn whose fields are not text
            if m.get(name) is not None and not isinstance(m[name], str):
                raise InputError(f"a message's {name!r} must be text, not {type(m[name]).__name__} "
                                 f"{str(m[name])[:40]}; send it as a string")
        for name in ("text", "speaker", "role", "date", "ref", "key"):   # the journal writes UTF-8
            value = m.get(name)
            if isinstance(value, str) and not value.isascii():
                try:
                    value.encode()
                except UnicodeEncodeError as exc:
                    raise InputError(f"the message's {name!r} holds a lone surrogate ({value[exc.start]!a}), which is not "
                                     "valid Unicode; send valid UTF-8") from None
        ts = m.get("ts")
        if ts is not None and (isinstance(ts, bool) or not isinstance(ts, numbers.Real) or not 0 <= float(ts) <= MAX_TS):
            raise InputError(f"a message's 'ts' is seconds since the epoch, a number from 0 to {MAX_TS:.0f} "
                             f"(year 9999), not {str(ts)[:40]}")
        if ts is None:
            ts = (label_time(str(m["date"])) if m.get("date") else None) or self.clock()
        ts = float(ts)
        speaker = str(m.get("speaker") or m.get("role") or "user")
        if speaker not in self._speakers:   # a conversation has few speakers: fit each once
            if len(self._speakers) > 10_000:
                self._speakers.clear()
            self._speakers[speaker] = self.tokenizer.fit(" ".join(speaker.split()), SPEAKER_TOKENS)
        speaker = self._speakers[speaker]
        return Turn(self.name, 0, speaker or "user", text, m.get("role") or "user", m.get("date") or date_label(ts),
                    ts, str(m.get("ref") or ""), self.user, str(m.get("key") or ""))

    def number(self, drafts: list[Turn], last_turn: int) -> tuple[list[Turn], list[Turn]]:
        """(the turns to write, one turn per draft): numbered after the durable last turn, under the
        session's lock after sync; a draft whose key the session holds gets its turn, not a new one."""
        if any(d.key for d in drafts):
            self._load_keys()
        self._recognise_exported([d.key for d in drafts if d.key.startswith("turn:") and d.key not in self.keys])
        base = max(last_turn, self.turn_count, max(self._waiting, default=0))
        new: list[Turn] = []
        out: list[Turn] = []
        batch: dict[str, int] = {}
        repeats: list[Turn] = []
        for d in drafts:
            known = (self.keys.get(d.key) or batch.get(d.key)) if d.key else None
            if known:
                out.append(d.numbered(known))
                repeats.append(out[-1])
                continue
            t = d.numbered(base + len(new) + 1)
            new.append(t)
            out.append(t)
            if d.key:
                batch[d.key] = t.turn
        if repeats:
            self._check_repeats(repeats, {t.turn: t for t in new})
        return new, out

    def _check_repeats(self, repeats: list[Turn], new: dict[int, Turn]) -> None:
        """A key the session holds comes back with the message it was first sent with (a retry); with
        other words it is a new message under a used key, which would be answered with the old turn and
        itself lost: refused, naming the key, before anything of the batch is written."""
        held = {**self._turns_after(min(t.turn for t in repeats) - 1), **new}
        for t in repeats:
            first = held.get(t.turn)
            if first is not None and first.text != t.text:
                raise KeyReused(f"the idempotency key {t.key[:80]!r} was first sent with other words (turn {t.turn}: "
                                 f"{first.text[:40]!r}); a retry sends the same message, a new message needs a new key")

    def _turns_after(self, after: int) -> dict[int, Turn]:
        """This session's turns after a number, durable in the store or only in this home's journal."""
        turns = {t.turn: t for t in self.home.store.turns(self.user, self.name, after=after)}
        for op in self.home.journal.read_new({}, own=True):
            if op["op"] == "turn" and (op["user"], op["session"]) == (self.user, self.name) and op["turn"] > after:
                turns.setdefault(op["turn"], Turn.from_record(op))
        return turns

    def _load_keys(self) -> None:
        if not self._keys_loaded:
            self.home.store.refresh()
            for key, turn in self.home.store.keys(self.user, self.name).items():
                self.keys.setdefault(key, turn)
            self._keys_loaded = True

    def held(self, key: str) -> int | None:
        """The turn that holds an idempotency key, if this session has taken one in with it."""
        self._load_keys()
        return self.keys.get(key)

    def _recognise_exported(self, keys: list[str]) -> None:
        """Keys `pager export` wrote for turns that had none (`Turn.identity`): a key names a turn of
        this session when that turn still says the same; then it is held like any other key."""
        wanted: dict[int, str] = {}
        for key in keys:
            digits = key.split(":")[1]
            if digits.isascii() and digits.isdigit():
                wanted[int(digits)] = key
        if not wanted:
            return
        turns = self._turns_after(min(wanted) - 1)
        for number, key in wanted.items():
            if number in turns and turns[number].identity() == key:
                self.keys[key] = number

    def take_accepted(self, turns: list[Turn], origin: str) -> None:
        """Turns this process just made durable: to the store at the next flush, onto pages now."""
        self.pending.turns += turns
        self.in_use = set()
        line = self.packer.tokenizer
        self._counted = count_turns(turns, line, self.tokenizer if self.events.listeners else None,
                                    (self.packer.capacity + 1) * line.longest_token)
        self._take(turns, announce=origin if origin == "input" else None, own=True)
        self._counted = {}   # counts of turns left waiting behind a gap are made again
        self._embed_pending()

    def receive(self, records: list[dict]) -> list[Turn]:
        """Turns another process appended, as a trace recorded them (replay): numbered after ours."""
        turns = [Turn(self.name, self.turn_count + i + 1, r["speaker"], r["text"], r.get("role", "user"),
                      r.get("date", ""), r.get("ts", 0.0), r.get("ref", ""), self.user) for i, r in enumerate(records)]
        self._take(turns, announce="other process")
        self._embed_pending()
        return turns

    def _take(self, turns: Iterable[Turn], announce: str | None = None, own: bool = False) -> list[Turn]:
        """The only way turns reach pages: in order, with no gap. A turn ahead of a gap waits for it."""
        for t in turns:
            if t.turn > self.turn_count:
                self._waiting.setdefault(t.turn, (t, own))
            if t.key:
                self.keys.setdefault(t.key, t.turn)
        ready: list[tuple[Turn, bool]] = []
        n = self.turn_count + 1
        while n in self._waiting:
            ready.append(self._waiting.pop(n))
            n += 1
        if announce and ready:   # the records only for a listener: an event nobody hears is numbered, not made
            self.emit("append", origin=announce, turns=[_turn_record(t) for t, _ in ready] if self.events.listeners else [])
        if self._episodes is not None and ready:
            self._closed += self._episodes.feed([t for t, _ in ready])
        for t, mine in ready:
            start, self._next_start = self._next_start, 0
            self._pack(t, start, mine)
        return [t for t, _ in ready]

    def _skip_missing(self, last: int) -> None:
        """Turns up to `last` are durable somewhere every process can read; any still missing after
        the journals and the store were read were lost to damage: say so once, and go on without them."""
        while self.turn_count < last:
            n = self.turn_count + 1
            if n not in self._waiting:
                self.home.warn(f"turn {n} of session {self.name!r} is in no journal and not in the store "
                               "(a damaged journal record); it is skipped")
                self.emit("turn_missing", turn=n)
                self.turn_count, self._next_start = n, 0
            self._take(())

    def _pack(self, turn: Turn, start: int, own: bool) -> None:
        self.turn_count = max(self.turn_count, turn.turn)
        if start >= len(turn.text):
            return  # the last sealed page ended exactly at this turn's end
        counted = self._counts(turn) if self._counted else None
        tokens = 0   # an event nobody listens to is numbered, not made: its count would go unread
        if self.events.listeners:
            tokens = counted[2] if counted and counted[2] is not None else self.tokenizer.count(turn.text)
        self.emit("turn", turn=turn.turn, speaker=turn.speaker, role=turn.role, date=turn.date, tokens=tokens,
                  ref=turn.ref)
        for page in self.packer.add(turn, start, counted[1] if counted else None):
            self._seal(page)
            if own and self.home.config.writer_model:
                self.unwritten.append(page.n)
        self._in_frame(self.tail_n).tokens = self.packer.body_tokens

    def _counts(self, turn: Turn) -> tuple | None:
        """This turn's counts, if they were made for this very turn (take_accepted): (turn, tokens of
        `speaker: text` or None, tokens of the text or None)."""
        counted = self._counted.pop(turn.turn, None)
        return counted if counted is not None and counted[0] is turn else None

    def _seal(self, page: Page) -> None:
        own = _own_text(page)
        keywords = tuple(bm.extract(own, words_first=self.home.config.words_first))
        named = tuple(k for k in keywords if not bm.is_filler(k)) if self.home.config.words_first else keywords
        page = Page(**{**page.__dict__, "keywords": keywords, "importance": _importance(own, named)})   # replace(), unchecked
        self.pages[page.n] = page
        self._unembedded.append(page)
        self.directory.add(keywords, [page.n])
        entry = self._in_frame(page.n)
        entry.tokens, entry.importance = page.tokens, page.importance
        self.tick += 1
        self._use(entry)
        self.emit("page_sealed", page=page.id, tokens=page.tokens, turns=list(page.turns), keywords=list(keywords))

    def _in_frame(self, n: int) -> Entry:
        """The entry of a page being written (the tail, or a page a long turn filled): always resident."""
        entry = self.table.get(n) or self.table.setdefault(n, Entry(n))
        if not entry.resident:
            self.frames.make_room({n}, self.tick, self._evict)
            self.frames.place(entry)
        return entry

    def _embed_pending(self) -> None:
        """Embed newly sealed pages in one batch and index them."""
        while self.embedding_early:   # the embedding thread's vectors for turns this process accepted (Home._embed_early)
            future, accepted = self.embedding_early.pop(0)
            made = _early_vectors(future)
            self.embedded_early.update((t, made[t]) for t in accepted if t in made)
        pages = self._unembedded
        if not pages:
            return
        texts = [p.piece_text(i).split(": ", 1)[-1] for p in pages for i in range(len(p.spans))]
        early = self.embedded_early   # the texts of turns embedded while the journal synced (Home._embed_early)
        known = {t: early[t] for t in texts if t in early}
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:
            known.update(zip(missing, self.home.embedder.embed(missing)))
        for t in texts:
            early.pop(t, None)
        if len(early) > 10_000:   # texts of turns split across pages, whose pieces are embedded on their own
            early.clear()
        vectors = np.stack([known[t] for t in texts])
        # the store keeps float16; rounding here makes a session searched from memory and one reloaded from
        # disk rank identically, which replay relies on
        vectors = vectors.astype(np.float16).astype(np.float32)
        row = 0
        for page in pages:
            piece_vectors = vectors[row : row + len(page.spans)]
            row += len(page.spans)
            self.index.add(page, piece_vectors)
            self.pending.pages.append(page)
            self.pending.vectors.append(piece_vectors)
        self._unembedded = []

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
        self._take(turns, announce="other process")
        last = max([last] + [t.turn for t in turns])
        refreshed = self.turn_count < last
        if refreshed:
            self.home.store.refresh()
            self._settle_stored()
            read += len(self._take(self.home.store.turns(self.user, self.name, after=self.turn_count),
                                   announce="other process"))
            if not self.home.waiting(self.key()):   # else the lock counts a dead process's turns, still to recover
                self._skip_missing(last)
        # the lock counts every op written; fewer read here means some (a state change, a fact, …) were
        # flushed out of segments this process had not read (their process closed meanwhile): the store has them
        missed = self.generation >= 0 and generation - self.generation > read
        self._take_marks([bm.Bookmark.from_dict(op) for op in ops if op["op"] == "bookmark"])
        self._take_state([Change.from_record(op) for op in ops if op["op"] == "state"])
        facts = [fact_from(op) for op in ops if op["op"] == "fact"]
        if facts:
            self._take_facts(facts)
        summaries = [summary_from(op) for op in ops if op["op"] == "summary"]
        if summaries:
            self._take_summaries(summaries)
        if missed:
            self._take_stored_tiers(refreshed)
        self._embed_pending()
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
        self._take(self.home.store.turns(self.user, self.name, after=self.turn_count), announce="other process")
        self._embed_pending()

    def follow(self) -> None:
        """A reader's catch-up on a session another home may be writing: its turns, bookmarks, state
        changes, facts and summaries flushed to the store since. The lock files this home's processes
        share say nothing of other homes, so `sync` alone would show the session as it was when opened here.
        The tables read are brought to their latest versions once (on an object store each is a listing)."""
        store = self.home.store
        store.refresh(FOLLOWED)
        self._settle_stored()
        self._take(store.turns(self.user, self.name, after=self.turn_count), announce="other process")
        self._embed_pending()
        self._take_stored_tiers(refreshed=True)

    def _take_stored_tiers(self, refreshed: bool = False) -> None:
        """The bookmarks, state changes, facts and summaries other processes flushed to the store that this
        one has not taken in (their journal segments went before it read them, or another home wrote them)."""
        store = self.home.store
        if not refreshed:
            store.refresh()
        # known ones are skipped by uid (a bookmark of release 0.1 has none: read at open)
        self._take_marks([mark for mark in store.bookmarks(self.user, self.name) if mark.uid])
        self._take_state([], store=True, refreshed=True)
        self._take_facts([], store=True, refreshed=True)
        self._take_summaries([], store=True, refreshed=True)

    def adopt(self, ops: list[dict]) -> int:
        """A dead process's journal ops for this session (recovery): its turns, bookmarks and pins are
        ours to write to the store now. Returns the turns it held."""
        for op in ops:
            if op["op"] == "settings":
                self.settle(op["page_tokens"], op["encoding"])
        turns = [Turn.from_record(op) for op in ops if op["op"] == "turn"]
        self.pending.turns += turns  # the store keeps each turn once, whoever writes it
        sealed = self.tail_n
        self._take(turns)
        if self.home.config.writer_model:   # sealed by the dead process, maybe never named: at least once
            resealed = [n for n in range(sealed, self.tail_n) if n in self.pages and n not in self.unwritten]
            self.unwritten += resealed
            self.inherited = self.inherited or bool(resealed)
        marks = [bm.Bookmark.from_dict(op) for op in ops if op["op"] == "bookmark"]
        self.pending.bookmarks += [(self.user, self.name, mark) for mark in marks]
        self._take_marks(marks)
        for op in ops:
            if op["op"] == "pin" and op["page"] in self.table:
                self.table[op["page"]].pinned = op["pinned"]
        changes = [Change.from_record(op) for op in ops if op["op"] == "state"]
        self.pending.changes += [(self.user, self.name, c) for c in changes]  # kept once, whoever writes it
        self._take_state(changes)
        facts = [fact_from(op) for op in ops if op["op"] == "fact"]
        self.pending.facts += [(self.user, self.name, f) for f in facts]
        if facts:
            self._take_facts(facts, event="")
        summaries = [summary_from(op) for op in ops if op["op"] == "summary"]
        self.pending.summaries += [(self.user, self.name, x) for x in summaries]
        if summaries:
            self._take_summaries(summaries, event="")
        self._embed_pending()
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
        entry = self.table.get(n)
        if entry is None:
            raise PageNotFound(f"page p{n} does not exist; this session has pages p1..p{self.tail_n}")
        self.tick += 1
        if entry.resident:
            self._use(entry)
            self.counters["hits"] += 1
            self.emit("hit", page=page_id(n), reason=reason)
            return False
        slot = self.frames.free_slot()
        if slot is None:   # (automatic paging made room for its whole batch already)
            self.frames.make_room({self.tail_n, n, *protect}, self.tick, self._evict, keep=self.in_use)
        self.frames.place(entry, slot)
        entry.fault_count += 1
        self._use(entry)
        self.counters["faults"] += 1
        self.emit("fault", page=page_id(n), frame=entry.frame, reason=reason, tokens=entry.tokens)
        return True

    def _use(self, entry: Entry) -> None:
        self.in_use.add(entry.n)
        entry.last_use = self.tick
        entry.use_count += 1
        entry.referenced = True
        self.policy.touch(entry, self.tick)

    def _evict(self, entry: Entry, reason: str = "policy") -> None:
        frame = entry.frame
        self.frames.release(entry)
        self.counters["evictions"] += 1
        self.emit("evict", page=entry.id, frame=frame, reason=reason, policy=self.policy.name)
        if not self.directory.keywords(entry.n) and entry.n in self.pages:
            own = _own_text(self.pages[entry.n])
            words = bm.extract(own, words_first=self.home.config.words_first) or own.split(": ", 1)[-1].split()[:3]
            if words:
                self._bookmark(tuple(words), (entry.n,), "", "auto")

    def page_out(self, n: int) -> None:
        entry = self.table[n]
        if n == self.tail_n:
            raise BudgetError(f"p{n} is the open tail page and stays resident")
        if entry.pinned:
            raise BudgetError(f"p{n} is pinned; unpin it first")
        if entry.resident:
            self._evict(entry, reason="page_out")

    def pin(self, n: int) -> None:
        if n == self.tail_n and not self.packer.pieces:   # nothing to keep resident (and, in a session with no
            # turns, no page table is stored: the pin would be lost at close)
            raise PageNotFound(f"p{n} holds nothing yet (the open page, no turn on it): add what should stay "
                               "resident first, then pin the page that holds it")
        pinned = self.pinned_count()
        if not self.table[n].pinned and pinned + 3 > self.frames.count:  # keep the tail and one free frame
            raise BudgetError(f"pinning p{n} would leave no frame free ({self.frames.count} frames, {pinned} pinned); "
                              "unpin a page or raise --budget")
        self.fault(n, "pin")
        self._journal_op({"op": "pin", "page": n, "pinned": True})  # first: a write refused (the lease) changes nothing
        self.table[n].pinned = True
        self.emit("pin", page=page_id(n))

    def unpin(self, n: int) -> None:
        self._journal_op({"op": "pin", "page": n, "pinned": False})
        self.table[n].pinned = False
        self.emit("unpin", page=page_id(n))

    def set_policy(self, name: str, quiet: bool = False) -> None:
        """Switch the eviction policy; the page table (use counts, referenced bits) carries over."""
        self.policy = make_policy(name)
        self.frames.policy = self.policy
        if not quiet:
            self.emit("policy", policy=self.policy.name)

    def pinned_count(self) -> int:
        """Pinned pages are always resident, so the frames are enough to count them."""
        return sum(1 for n in self.frames.slots if n is not None and self.table[n].pinned)

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
            self.frames.resize(count, {self.tail_n}, self.tick, self._evict, keep=self.in_use)
            self.emit("resize", frames=count, was=before)

    # -- bookmarks ------------------------------------------------------------------------------------
    def bookmark(self, pages: Iterable[int | str], keywords: Iterable[str], note: str = "", source: str = "model") -> bm.Bookmark:
        numbers = tuple(self.resolve(p) for p in pages)
        words = tuple(k.strip() for k in keywords if k and k.strip())
        if not words:
            raise InputError("a bookmark needs at least one keyword")
        return self._bookmark(words, numbers, note.strip(), source)

    def _bookmark(self, keywords: tuple[str, ...], pages: tuple[int, ...], note: str, source: str) -> bm.Bookmark:
        mark = bm.Bookmark(keywords, pages, note, source, uuid.uuid4().hex[:12], self.clock())
        if source != "auto":  # automatic ones are derived from the page text: no fsync on the eviction path
            self._journal_op({"op": "bookmark", **mark.to_dict()})   # first: a write refused changes nothing
        self.directory.add(keywords, pages, note, mark.uid, first=source != "auto")
        self.pending.bookmarks.append((self.user, self.name, mark))
        self.emit("bookmark", pages=[page_id(p) for p in pages], keywords=list(keywords), note=note, source=source)
        return mark

    # -- after a reply: the model's batch and the live summaries --------------------------------------------
    def write_memory(self) -> None:
        """What a live session (chat, the agent loop, serve) does after each reply: the bookmark or
        memory model's call for a full batch of sealed pages, and, when an episode closed since the last
        reply (a new date, `gap_s` of silence, a topic shift: `summaries.Episodes`), that episode's
        summary and the rolling summary's next version. With a memory model the summaries ride on its
        call (the batch is sent at once, with the episodes); whatever it did not write (it failed, or
        left one out) the extractive producer writes. No model call per turn, and every failure is an
        event: the turns stay. Replay feeds the recorded `summaries_written` back and makes none. On
        first use, the episodes that had closed before (`closed_episodes`) get theirs extractively."""
        closed = self.closed_episodes()
        backlog, self._backlog = self._backlog, []
        writer = self.home.writer
        if closed and writer is not None and writer.memory:
            if backlog:   # closed before this chat: extractive, so the model's call stays one batch's size
                self._summarize_closed(backlog, [])
            self.write_bookmarks(force=True, episodes=closed)   # the call's answer, or the extractive producer
        else:
            self.write_bookmarks()
            if backlog + closed:
                self._summarize_closed(backlog + closed, [])

    def closed_episodes(self) -> list[list[Turn]]:
        """The episodes that closed since this was last asked (none when `live_summaries` is off).

        The first call reads the session's last LIVE_LOOKBACK turns back, once: every episode among
        them that closed before it (but the last, which the message that began this chat may have
        closed) and that has no summary yet, or lies outside the rolling summary, is the backlog
        (`_backlog`), which `write_memory` summarizes extractively, with no model call, and the rolling
        summary then covers from the session's first turn. The bound keeps a chat's first reply cheap
        in a huge session: episodes further back than that are left to `pager summarize` (which reads
        every turn), and the rolling summary covers from the first whole episode read."""
        if not self.home.config.live_summaries:
            return []
        if self._episodes is None:
            after = max(0, self.turn_count - LIVE_LOOKBACK)
            self._episodes = Episodes(Extractive())
            closed = self._episodes.feed(session_turns(self, after=after))
            if after:   # the first episode read may have begun before the turns read: not whole
                closed = closed[1:]
            done = {x.key for x in self.summaries.current.values() if x.kind == EPISODE}
            rolling = self.summaries.rolling
            covered = rolling.turns if rolling else (0, -1)
            wanted = [e for e in closed if f"e{e[0].turn}" not in done
                      or not covered[0] <= e[0].turn <= e[-1].turn <= covered[1]]
            self._backlog = [e for e in wanted if e is not closed[-1]]
            self._closed = [e for e in wanted if e is closed[-1]]
        closed, self._closed = self._closed, []
        return closed

    def _summarize_closed(self, closed: list[list[Turn]], made: list[Summary]) -> None:
        """The extractive producer's summaries of the closed episodes (and the rolling version) that
        `made` (the memory model's, if any) does not hold; a failure is a `memory_error` event."""
        written = {x.key for x in made}
        if ROLLING in written and all(f"e{e[0].turn}" in written for e in closed):
            return   # the memory model wrote them all
        producer = Extractive()
        try:   # an episode the model summarized is skipped: it is in self.summaries already
            drafts = producer.after(self, closed, rolling=ROLLING not in written)
        except Exception as exc:  # noqa: BLE001 - the embedder failed; summaries only ever add
            self.memory_error = " ".join(str(exc).split())[:300] or type(exc).__name__
            self.emit("memory_error", pages=[], error=self.memory_error)
            return
        if drafts:
            self.add_summaries(drafts, producer.source)

    def write_bookmarks(self, force: bool = False, episodes: list[list[Turn]] | None = None) -> list:
        """Have the bookmark model (or the memory model, which also writes facts and state in the same
        call) name the pages sealed since it last did, a batch per call (all batches with force, else
        only full ones). Returns the bookmarks it wrote (writer.Written). A failing model is an event
        (`writer_error`, or `memory_error` for the memory model), never an exception: its batch stays
        unwritten, tried again once another page seals (or by the next process to open the session),
        and every turn stays. `episodes` (closed ones, `write_memory`): the memory model's last call of
        these also asks for their summaries, one call even with no page to name.

        With a memory worker (`Home.memory_worker`, which `pager serve` runs) the calls are its to make,
        on its own thread with no lock held while the model answers: this only hands the work over."""
        writer = self.home.writer
        if writer is None:
            return []
        if episodes and writer.memory:
            self.episodes_owed += episodes
        if self.home.memory_worker is not None:
            if self.writer_due(force):
                self.home.memory_worker.want(self, force)
            return []
        written: list = []
        while self.writer_due(force):
            call = self.writer_call()
            if call is None:
                break
            try:
                reply = writer.model.complete(call.messages, [])
            except Exception as exc:  # noqa: BLE001 - any provider failure; the writer only ever adds
                self.writer_failed(call, exc)
                break
            written += self.writer_answered(call, reply)
        return written

    def writer_due(self, force: bool = False) -> bool:
        """Whether the bookmark or memory model has a call to make: closed episodes to summarize, a full
        batch of unwritten pages, or any with force; after a failed call, not before another page seals."""
        writer = self.home.writer
        if writer is None:
            return False
        if self.episodes_owed and writer.memory:
            return True
        if not self.unwritten or self.tail_n < self._retry_at:
            return False
        return force or len(self.unwritten) >= writer.batch

    def writer_call(self):
        """The next call of the bookmark or memory model (writer.Call): a batch of unwritten pages, now
        `naming`, and with the last batch the episodes owed; its prompt made now, from the session as it
        is. None if making it failed (a `writer_error` or `memory_error`, as a failed call is)."""
        writer = self.home.writer
        batch, self.unwritten = self.unwritten[: writer.batch], self.unwritten[writer.batch :]
        episodes = None
        if writer.memory and not self.unwritten and self.episodes_owed:
            episodes, self.episodes_owed = self.episodes_owed, []
        self.naming += batch
        pages = [self.pages[n] for n in batch]
        try:
            return writer.ask(pages, self, episodes)
        except Exception as exc:  # noqa: BLE001 - the embedder failed (similar facts); as a failed call
            from .writer import Call

            self.writer_failed(Call(pages, episodes), exc)
            return None

    def writer_answered(self, call, reply) -> list:
        """Keep the model's answer to a call, as any answer is kept (apply_written, apply_memory; the
        extractive summaries of the episodes it left out). Returns the bookmarks it wrote."""
        writer = self.home.writer
        batch = [p.n for p in call.pages]
        self.naming = [n for n in self.naming if n not in batch]
        try:
            answer = writer.read(call, reply, self)
        except Exception as exc:  # noqa: BLE001 - reading it needs the facts' state; as a failed call
            self.naming += batch
            self.writer_failed(call, exc)
            return []
        made = len(self.summaries)
        marks = answer.marks if writer.memory else answer
        try:
            self.apply_written(marks)
            if writer.memory:
                self.apply_memory(answer, batch)
        except PagerError as exc:   # the store or the lease refused a write: as a failed call, the pages still owed
            self.writer_failed(call, exc)
            return []
        if call.episodes:
            self._summarize_closed(call.episodes, self.summaries.items[made:])
        return marks

    def writer_failed(self, call, exc: Exception) -> None:
        """A call that failed: an event, its pages unwritten again (first, for the next call, once another
        page seals), and the episodes it was to summarize summarized by the extractive producer."""
        writer = self.home.writer
        batch = [p.n for p in call.pages]
        error = " ".join(str(exc).split())[:300] or type(exc).__name__
        if writer.memory:
            self.memory_error = error
            self.emit("memory_error", pages=[page_id(n) for n in batch], error=error)
        else:
            self.writer_error = error
            self.emit("writer_error", pages=[page_id(n) for n in batch], error=error)
        self.naming = [n for n in self.naming if n not in batch]
        self.unwritten = batch + [n for n in self.unwritten if n not in batch]
        self._retry_at = self.tail_n + 1
        episodes, self.episodes_owed = (call.episodes or []) + self.episodes_owed, []
        if episodes:
            self._summarize_closed(episodes, [])

    def write_rest(self) -> None:
        """Have the bookmark or memory model name the pages this process sealed since its last full batch
        (fewer than a batch): what a session does before it is let go (the end of `pager chat`, a
        Toolkit's close; your own loop over `Agent`, before its trace ends and the home closes, which
        calls no model). Pages it could not name stay unwritten in the stored session, and the next
        process to open it names them. A write the store or the lease refuses is said once and is an
        event, like a failing model: the turns are durable and stay."""
        if not self.unwritten or self.home.writer is None:
            return
        pages = list(self.unwritten)
        try:
            self.write_bookmarks(force=True)
        except PagerError as exc:
            error = " ".join(str(exc).split())[:300]
            kind = "memory_error" if self.home.writer.memory else "writer_error"
            self.emit(kind, pages=[page_id(n) for n in pages], error=error)
            self.home.warn(f"the pages {', '.join(page_id(n) for n in pages)} of session {self.name!r} were not given "
                           f"to {self.home.config.writer_model}: {error}; they keep their offline keywords")

    def apply_written(self, marks) -> None:
        """Keep a bookmark writer's answer as durable bookmarks; replay feeds the recorded answer here."""
        self.emit("bookmarks_written", marks=[{"page": page_id(m.page), "keywords": list(m.keywords), "note": m.note}
                                              for m in marks])
        for m in marks:
            if m.page in self.pages:
                self._bookmark(tuple(m.keywords), (m.page,), m.note, source="writer")

    def apply_memory(self, answer, pages: list[int]) -> None:
        """Keep a memory model's answer (memory.Answer): what it got wrong is one `memory_rejected`
        event, its facts are kept (add, update, invalidate) and its state changes made."""
        if answer.rejected:
            self.emit("memory_rejected", pages=[page_id(n) for n in pages], rejected=list(answer.rejected))
        if answer.facts:
            self.add_facts(answer.facts, "model")
        if answer.state:
            self.apply_state(answer.state)
        if answer.summaries:
            self.add_summaries(answer.summaries, "model")

    def apply_state(self, changes: list[tuple[str, str | None]]) -> None:
        """A memory model's state changes, (key, value) or (key, None) to unset; replay feeds the
        recorded ones here. One that no longer applies (an unset of a key not set) changes nothing."""
        self.emit("state_written", changes=[{"key": k, "value": v} if v is not None else {"key": k, "unset": True}
                                            for k, v in changes])
        for key, value in changes:
            try:
                self.set_state(key, value, source="memory")
            except InputError:  # checked when parsed; a recorded answer from an older pager may not be
                continue

    def _journal_op(self, record: dict) -> None:
        self.home.journal_op(self, record)

    # -- the working state ------------------------------------------------------------------------------
    def set_state(self, key: str, value: str | None, source: str = "model") -> Change | None:
        """Set one key of the working state (value None: unset it), durable before this returns and
        numbered after every change other processes made. None if nothing changes (the value it has,
        or an unset of a key that is not set). InputError names what is wrong with key or value."""
        key, value = check_state(key, value)
        made: list[Change] = []

        def change() -> dict | None:  # built under the session's lock, after sync
            made.clear()   # built again when the lease ran out meanwhile (Home.journal_op)
            self._take_state([], store=True)
            held = self.state.current.get(key)
            if (held.value if held else "") == value:
                return None
            made.append(Change(self.state.seq + 1, key, value, not value, self.tail_n, self.turn_count,
                               self.clock(), source))
            return made[0].to_op()

        self.home.journal_op(self, change)
        if not made:
            return None
        self.pending.changes.append((self.user, self.name, made[0]))
        self.state.take(made)
        self.emit("state", **made[0].event())
        return made[0]

    def _take_state(self, changes: list[Change], store: bool = False, refreshed: bool = False) -> None:
        """Changes other processes made (from their journals; from the store when one is missing, as
        when its journal segment was flushed and removed before we read it), each an input event."""
        applied = self.state.take(changes)
        if store or self.state.gap:
            if not refreshed:
                self.home.store.refresh()
            applied += self.state.take(self.home.store.state_changes(self.user, self.name, after=self.state.seq))
        for c in applied:
            self.emit("state_in", **c.event(), ts_set=c.ts)

    # -- facts ------------------------------------------------------------------------------------------
    def extract_facts(self, producer, pages: list[int] | None = None) -> list[Fact]:
        """Ask a producer (a memory model, or its recorded output) for facts of pages (all sealed
        pages and the tail if none are named). A failing producer is an event and `memory_error`,
        never an exception: the turns are already durable and stay."""
        pages = sorted(self.pages) + [self.tail_n] if pages is None else pages
        try:
            drafts = list(producer(self, pages))
        except Exception as exc:  # noqa: BLE001 - any provider failure; facts only ever add
            self.memory_error = " ".join(str(exc).split())[:300]
            self.emit("memory_error", pages=[page_id(n) for n in pages[:50]], error=self.memory_error)
            return []
        return self.add_facts(drafts, getattr(producer, "source", "model"))

    def add_facts(self, drafts: list[Draft], source: str) -> list[Fact]:
        """Keep a producer's answer as facts (replay feeds the recorded answer here): each placed on the
        pages of its turns, dated by its last turn unless it says when it became true."""
        self.emit("facts_written", source=source, facts=[{"subject": d.subject, "text": d.text, "turns": list(d.turns),
                                                          **({"ts": d.ts} if d.ts is not None else {}),
                                                          **({"op": d.op, "target": d.target} if d.op != "add" else {})}
                                                         for d in drafts])
        turn_pages = self._turn_pages({t for d in drafts for t in d.turns})
        drafts = [d for d in drafts if d.text.strip()]
        made: list[Fact] = []

        def ops() -> list[dict]:  # numbered under the session's lock, after the facts other processes made
            made.clear()   # built again when the lease ran out meanwhile (Home.journal_op)
            self._take_facts([], store=True)
            for d in drafts:
                turns = tuple(t for t in d.turns if t in turn_pages)
                when = d.ts if d.ts is not None else max((turn_pages[t][1] for t in turns), default=self.clock())
                subject, ends = d.subject, False
                if d.op in ("update", "invalidate"):  # on the subject of the fact it replaces or ends, after it
                    target = self.facts.get(d.target) or next((f for f in made if f.n == d.target), None)
                    if target is None:
                        continue
                    subject, ends, when = target.subject, d.op == "invalidate", max(when, target.ts)
                pages = tuple(sorted({p for t in turns for p in turn_pages[t][0]}))
                made.append(Fact(len(self.facts) + len(made) + 1, subject, " ".join(d.text.split()), turns, pages,
                                 when, date_label(when), source, ends))
            return [{"op": "fact", **fact_record(f)} for f in made]

        if drafts:
            self.home.journal_op(self, ops)
            self.pending.facts += [(self.user, self.name, f) for f in made]
            self._keep_facts(made)
        return made

    def _keep_facts(self, facts: list[Fact], event: str = "fact") -> None:
        if not facts:
            return
        vectors = self.home.embedder.embed([f.text for f in facts]).astype(np.float16).astype(np.float32)
        for fact, vector in zip(facts, vectors):
            older = self.facts.add(fact, vector)
            if event == "fact":
                self.emit("fact", fact=fact.id, subject=fact.subject, pages=[page_id(p) for p in fact.pages],
                          turns=list(fact.turns), supersedes=older.id if older else "",
                          **({"ends": True} if fact.ends else {}))
            elif event:  # another process's fact: an input replay feeds back
                self.emit(event, **fact_record(fact))

    def _take_facts(self, facts: list[Fact], store: bool = False, event: str = "fact_in", refreshed: bool = False) -> None:
        """Facts other processes made, in number order (one ahead of a gap waits; the store fills gaps,
        as when a journal segment was flushed and removed before we read it)."""
        for f in facts:
            if f.n > len(self.facts):
                self._facts_waiting.setdefault(f.n, f)
        if store or self._facts_waiting:
            if not refreshed:
                self.home.store.refresh()
            for f in self.home.store.facts(self.user, self.name, after=len(self.facts)):
                self._facts_waiting.setdefault(f.n, f)
        ready: list[Fact] = []
        while len(self.facts) + len(ready) + 1 in self._facts_waiting:
            ready.append(self._facts_waiting.pop(len(self.facts) + len(ready) + 1))
        self._keep_facts(ready, event)

    # -- summaries --------------------------------------------------------------------------------------
    def summarize(self, producer, pages: list[int] | None = None) -> list[Summary]:
        """Ask a producer (a memory model, its recorded output, or the extractive one) for episode and
        rolling summaries of pages (all sealed pages and the tail if none are named). A failing
        producer is an event and `memory_error`, never an exception: the turns stay."""
        pages = sorted(self.pages) + [self.tail_n] if pages is None else pages
        try:
            drafts = list(producer(self, pages))
        except Exception as exc:  # noqa: BLE001 - any provider failure; summaries only ever add
            self.memory_error = " ".join(str(exc).split())[:300]
            self.emit("memory_error", pages=[page_id(n) for n in pages[:50]], error=self.memory_error)
            return []
        return self.add_summaries(drafts, getattr(producer, "source", "model"))

    def add_summaries(self, drafts: list[SummaryDraft], source: str) -> list[Summary]:
        """Keep a producer's answer as summaries (replay feeds the recorded answer here): each covers
        the pages of its first to its last turn, dated by its last turn; a key held already gets its
        next version, and the older one stays."""
        self.emit("summaries_written", source=source, summaries=[
            {"kind": d.kind, "key": d.key, "text": d.text, "turns": list(d.turns), **({"ts": d.ts} if d.ts is not None else {})}
            for d in drafts])
        drafts = [d for d in drafts if d.text.strip() and d.kind in ("rolling", "episode")]
        turn_pages = self._turn_pages({t for d in drafts for t in d.turns})
        made: list[Summary] = []

        def ops() -> list[dict]:  # numbered under the session's lock, after the summaries other processes made
            made.clear()   # built again when the lease ran out meanwhile (Home.journal_op)
            self._take_summaries([], store=True)
            versions: dict[str, int] = {}
            for d in drafts:
                first, last = min(d.turns), max(d.turns)
                if first not in turn_pages or last not in turn_pages:
                    continue   # turns this session does not hold: nothing to cover
                version = versions.get(d.key) or self.summaries.next_version(d.key)
                versions[d.key] = version + 1
                ts = d.ts if d.ts is not None else turn_pages[last][1]
                made.append(Summary(len(self.summaries) + len(made) + 1, d.kind, " ".join(d.key.split()), version,
                                    " ".join(d.text.split()), (min(turn_pages[first][0]), max(turn_pages[last][0])),
                                    (first, last), ts, date_label(ts), source))
            return [{"op": "summary", **summary_record(x)} for x in made]

        if drafts:
            self.home.journal_op(self, ops)
            self.pending.summaries += [(self.user, self.name, x) for x in made]
            self._keep_summaries(made)
        return made

    def _keep_summaries(self, summaries: list[Summary], event: str = "summary") -> None:
        if not summaries:
            return
        vectors = self.home.embedder.embed([x.text for x in summaries]).astype(np.float16).astype(np.float32)
        for summary, vector in zip(summaries, vectors):
            older = self.summaries.add(summary, vector)
            if event == "summary":
                self.emit("summary", summary=summary.id, type=summary.kind, key=summary.key, version=summary.version,
                          pages=[page_id(p) for p in summary.pages], turns=list(summary.turns),
                          follows=older.id if older else "")
            elif event:  # another process's summary: an input replay feeds back
                self.emit(event, **summary_event(summary))

    def _take_summaries(self, summaries: list[Summary], store: bool = False, event: str = "summary_in",
                        refreshed: bool = False) -> None:
        """Summaries other processes made, in number order (one ahead of a gap waits; the store fills gaps)."""
        for x in summaries:
            if x.n > len(self.summaries):
                self._summaries_waiting.setdefault(x.n, x)
        if store or self._summaries_waiting:
            if not refreshed:
                self.home.store.refresh()
            for x in self.home.store.summaries(self.user, self.name, after=len(self.summaries)):
                self._summaries_waiting.setdefault(x.n, x)
        ready: list[Summary] = []
        while len(self.summaries) + len(ready) + 1 in self._summaries_waiting:
            ready.append(self._summaries_waiting.pop(len(self.summaries) + len(ready) + 1))
        self._keep_summaries(ready, event)

    def _turn_pages(self, wanted: set[int]) -> dict[int, tuple[list[int], float]]:
        """turn → (the pages holding it, its timestamp), for the turns asked about."""
        out: dict[int, tuple[list[int], float]] = {}
        for n, page in self.pages.items():
            for turn, _, _ in page.spans:
                if turn in wanted:
                    out.setdefault(turn, ([], page.ts_last))[0].append(n)
        for piece in self.packer.pieces:
            if piece.turn.turn in wanted:
                out.setdefault(piece.turn.turn, ([], piece.turn.ts))[0].append(self.tail_n)
        return out

    # -- search and automatic paging ----------------------------------------------------------------------
    def search(self, query: str, k: int = 8, exclude: Iterable[int] = (), boosts: dict[int, float] | None = None,
               record: bool = True, tail: bool = True, depth: int | None = None) -> list[Hit]:
        """Ranked pages for the query; the open tail page (not indexed until sealed) is matched by its words.
        depth: how many of the k hits will be paged in, when fewer (a search is deep or not by that)."""
        self.sync()
        cfg = self.home.config
        weights = ({"recency": cfg.recency_weight} if cfg.recency_weight else {}) | ({} if cfg.supersede else {"update": 0.0})
        rerank = (lambda fused: rerank_pieces(self, query, fused)) if self.home.reranker is not None else None
        hits = self.index.search(query, self.home.embedder, self.directory, k, set(exclude) | {self.tail_n},
                                 self.clock(), boosts, weights or None, depth, rerank)
        if tail and (hit := self._tail_hit(query)):
            if cfg.supersede_tail:   # an update on the open page ranks above what it updates, as a sealed one does
                hit = self.index.over_tail(query, hits, hit, [p.line for p in self.packer.pieces],
                                           {p.turn.speaker.lower() for p in self.packer.pieces})
            hits = sorted(hits + [hit], key=lambda h: (-h.score, -h.n))[:k]
        if record:   # the hits' explanations are made only for a listener (automatic paging reads scores alone)
            self.events.emit_with("search", lambda: {"query": query, "results": [
                {"page": h.id, "score": h.score, **h.signals} for h in hits]})
        return hits

    def weak(self, query: str, hits: list[Hit]) -> list[bool]:
        """Which hits are weak (search.is_weak): no word of the query on the page, and near it by meaning only
        below `weak_similarity` (0: none is). The search CLI, the REST search and the search tool say so."""
        floor = self.home.config.weak_similarity
        if floor <= 0:
            return [False] * len(hits)
        wanted = set(terms(query))
        return [is_weak(h, h.n != self.tail_n and self.index.holds(h.n, wanted), floor) for h in hits]

    def _tail_hit(self, query: str) -> Hit | None:
        query_terms = terms(query)
        wanted = set(query_terms)
        names = {t for s in self.index.speakers | {piece.turn.speaker.lower() for piece in self.packer.pieces}
                 for t in terms(s)}
        best, where = 0, -1
        for i, piece in enumerate(self.packer.pieces):
            have = terms(piece.line)
            kind = piece_kind(piece.line)
            if kind == QUOTE or (kind == QUESTION and echoes(have, query_terms, names)):
                continue   # an echo of the query is not what it asks for
            overlap = len(wanted & set(have))
            if overlap > best:
                best, where = overlap, i
        if not best:
            return None
        return Hit(self.tail_n, round(best / len(wanted), 4), {"tail": best}, piece=-1 - where)

    def autopage_room(self, frames: int | None = None, share: float | None = None) -> int:
        """How many pages automatic paging may fault into `frames` frames (the current count if None)."""
        frames = self.frames.count if frames is None else frames
        share = self.home.config.autopage_share if share is None else share
        return min(int(frames * share), frames - 1 - self.pinned_count())

    def paging_plan(self, hits: list[Hit], room: int) -> list[int]:
        """The pages automatic paging faults for these hits (best first, each above the threshold),
        then their neighbours (read-ahead) while they fit the room."""
        chosen = [h.n for h in hits[:room]]
        taken = set(chosen)
        readahead = self.home.config.readahead
        for hit in hits[:room]:
            for d in range(1, readahead + 1):
                for n in (hit.n - d, hit.n + d):
                    if len(chosen) < room and n in self.pages and n not in taken:
                        chosen.append(n)
                        taken.add(n)
        return chosen

    def autopage(self, query: str, share: float | None = None, min_score: float | None = None,
                 hits: list[Hit] | None = None) -> list[Hit]:
        """Fault in the pages the query needs, with read-ahead, within a share of the frames. `hits`:
        this query's search, already made (with at least the room's number of hits), to page from."""
        min_score = self.home.config.autopage_min_score if min_score is None else min_score
        room = self.autopage_room(share=share)
        if room <= 0 or not query.strip():
            return []
        if hits is None:
            hits = self.search(query, k=room, tail=False)
        hits = [h for h in hits[:room] if h.score >= min_score]
        chosen = self.paging_plan(hits, room)
        for hit in hits:
            self.table[hit.n].relevance = hit.score
        missing = sum(1 for n in chosen if not self.table[n].resident)
        # one eviction pass for the whole batch: the policy sees every candidate once
        self.frames.make_room({self.tail_n, *chosen}, self.tick, self._evict, free=missing, keep=self.in_use)
        for i, n in enumerate(chosen):
            self.fault(n, "auto" if i < len(hits) else "readahead", protect=chosen)
        return hits

    # -- views ----------------------------------------------------------------------------------------
    def resident(self) -> list[int]:
        return sorted(n for n in self.frames.slots if n is not None)

    def paging_state(self, every: bool = True) -> dict:
        """The page table, frame slots, CLOCK hand and counters: the one representation of the
        paging state. Replay resumes from it and the benchmark returns to it (every entry); the
        store keeps it for the next process (only the used entries)."""
        return {"page_tokens": self.page_tokens, "encoding": self.packer.tokenizer.name,
                "table": self.table.snapshot(every), "slots": list(self.frames.slots),
                "tick": self.tick, "counters": dict(self.counters), "policy": self.policy.name,
                "hand": getattr(self.policy, "hand", 0)}

    def load_paging_state(self, state: dict) -> None:
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
        return {**c, "hit_rate": round(c["hits"] / uses, 3) if uses else 0.0, "pages": len(self.pages),
                "turns": self.turn_count, "frames": self.frames.count, "used": self.frames.used()}

    def take_pending(self) -> Batch:
        self._embed_pending()
        batch, self.pending = self.pending, Batch()
        if not self.settled and not self.turn_count:
            return batch   # opened, never written: storing its page table would make the session (and settle it)
        state = self.paging_state(every=False)
        owed = sorted(self.naming + self.unwritten)
        if owed:   # the pages the writer still owes, a call's under way among them: the next open names them
            state["unwritten"] = owed
        if state != self._state_stored:  # an unchanged page table is not written again
            batch.states[self.key()] = state
            self._state_stored = state
        return batch


def _early_vectors(early) -> dict:
    """What Home._embed_early made, once it is done ({} if embedding failed: the pages are then
    embedded as usual, and that embedding reports the failure)."""
    try:
        return early.result()
    except Exception:  # noqa: BLE001 - the usual path embeds again and raises there
        return {}


def count_turns(turns: list[Turn], line, text, longest: int) -> dict[int, tuple]:
    """turn → (the turn, tokens of its `speaker: text` by tokenizer `line`, of its text by `text` if
    given): the counts Session._pack asks for, made for a group of accepted turns at once. A text longer
    than `longest` characters cannot fit a page whole: its line is not counted."""
    return {t.turn: (t, line.count(f"{t.speaker}: {t.text}") if len(t.text) <= longest else None,
                     text.count(t.text) if text is not None else None) for t in turns}


def _turn_record(t: Turn) -> dict:
    return {"speaker": t.speaker, "text": t.text, "role": t.role, "date": t.date, "ts": t.ts, "ref": t.ref}


def _own_text(page: Page) -> str:
    """The page's text without the offline shell's replies (its quotes of other pages, its canned
    notes): those would give the page the quoted page's keywords, or the shell's own words."""
    text = page.text
    for i in reversed(range(len(page.lines))):
        if piece_kind(page.piece_text(i)) == QUOTE:
            start, end = page.lines[i]
            text = text[:start] + text[end:]
    return text


def _importance(text: str, keywords: tuple[str, ...]) -> float:
    """0..1: pages with names, numbers, dates and decisions matter more later."""
    signals = len(keywords) / 6
    lowered = text.lower()
    for cue in ("my name", "allerg", "always", "never", "decid", "remember", "birthday", "deadline", "password",
                "favorite", "favourite", "plan", "goal", "promise"):
        if cue in lowered:
            signals += 0.2
    return round(min(1.0, signals), 3)
