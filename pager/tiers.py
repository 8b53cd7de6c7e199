"""The memory tiers of a session: the working state, facts and summaries, as one mechanism.

Each tier is a list of records numbered 1, 2, … in the order they were made, none deleted (a new
value, a fact's update, a summary's next version each follow the record they replace). Every
process applies a tier's records in number order, so all agree: a record made here is numbered
under the session's lock after those other processes made, journaled first, then kept; a record
another process made (from its journal, the store, or a recorded trace) waits for any gap before
it to fill (the store fills gaps, as when a journal segment was flushed and removed before this
process read it). A tier declares only what differs (`Kind`): its journal op, how the store
returns its records, what is embedded, and its events.

A fact's or summary's vector is stored with it (store schema 9), tagged with the embedder that made it
(embed.embedder_key): an open takes the stored vectors of its embedder and embeds only the rest, which
a writing open then writes back over their rows (those stored before m009, or by another embedder).
A record a dead process journaled and never stored is embedded when it is adopted, and stored with its
vector.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .embed import embedder_key
from .errors import InputError
from .facts import Draft, Fact, Facts, fact_record
from .page import date_label, page_id
from .state import Change, State, check as check_state
from .store import fact_from
from .summaries import Draft as SummaryDraft, Summaries, Summary, summary_event, summary_from, summary_record

if TYPE_CHECKING:
    from .session import Session


@dataclass(frozen=True)
class Kind:
    """What one tier declares."""
    op: str                                    # the journal op, and the event of a record made here
    pending: str                               # the store batch's list of this tier's new records
    stored: str                                # the store's method for the records after a number (and its table)
    to_op: Callable[[Any], dict]
    from_op: Callable[[dict], Any]
    made: Callable[[Any, Any], dict]           # (a record made here, the one it follows) → its event's data
    taken: Callable[[Any], dict]               # another process's record → its input event's data
    text: Callable[[Any], str] | None = None   # what is embedded to find it by meaning (None: not embedded)


STATE = Kind("state", "changes", "state_changes", Change.to_op, Change.from_record,
             made=lambda c, older: c.event(), taken=lambda c: {**c.event(), "ts_set": c.ts})
FACT = Kind("fact", "facts", "facts", lambda f: {"op": "fact", **fact_record(f)}, fact_from,
            made=lambda f, older: {"fact": f.id, "subject": f.subject, "pages": [page_id(p) for p in f.pages],
                                   "turns": list(f.turns), "supersedes": older.id if older else "",
                                   **({"ends": True} if f.ends else {})},
            taken=fact_record, text=lambda f: f.text)
SUMMARY = Kind("summary", "summaries", "summaries", lambda x: {"op": "summary", **summary_record(x)}, summary_from,
               made=lambda x, older: {"summary": x.id, "type": x.kind, "key": x.key, "version": x.version,
                                      "pages": [page_id(p) for p in x.pages], "turns": list(x.turns),
                                      "follows": older.id if older else ""},
               taken=summary_event, text=lambda x: x.text)


def number(record) -> int:
    return record.seq if isinstance(record, Change) else record.n


class Tier:
    """One tier's records in a session: kept in number order, from here or from other processes."""

    def __init__(self, session: "Session", kind: Kind, records: State | Facts | Summaries) -> None:
        self.session, self.kind, self.records = session, kind, records
        self.waiting: dict[int, Any] = {}   # records of other processes ahead of a gap

    def keep(self, records: list, event: str, stored: dict[int, np.ndarray] | None = None) -> None:
        """Hold records that are next in order. event: the kind's op (made here), "in" (another
        process's, an input event replay feeds back) or "" (loaded: no event); stored: vectors the
        store holds for some of them, by number."""
        if not records:
            return
        s, kind = self.session, self.kind
        vectors: Any = [None] * len(records)
        if kind.text is not None:
            vectors = s.tiers.embedded([kind.text(r) for r in records], [(stored or {}).get(number(r)) for r in records])
        for record, vector in zip(records, vectors):
            older = self.records.add(record, vector)
            if event == kind.op:
                s.emit(kind.op, **kind.made(record, older))
            elif event:
                s.emit(f"{kind.op}_in", **kind.taken(record))
            if event and kind.text is not None:
                self.count_line(record, older)

    def count_line(self, record, older) -> None:
        """Count a new fact's or summary's line as the slabs and the summaries block will sum it (and the
        line of the fact it supersedes, which now says so): when it is written, not in the first question
        that ranks it. A memory model writes a few at a time; a question ranks hundreds, ~20 of them new
        (BENCHMARKS.md, "The memory tiers' cost"). Loaded records are counted as questions rank them."""
        render, records = self.session.render, self.records
        assert isinstance(records, (Facts, Summaries))   # the tiers whose records are embedded
        render.count_block_line(records.line(record))
        if older is not None and self.kind is FACT:
            render.count_block_line(records.line(older))

    def take(self, records: list, store: bool = False, event: str = "in", refreshed: bool = False) -> None:
        """Records other processes made, in number order; with store (or while a gap remains), the
        store's records after the last one held too (refreshed: the store was just brought up to date)."""
        for r in records:
            if number(r) > len(self.records):
                self.waiting.setdefault(number(r), r)
        ready = self._ready([])
        if store or self.waiting:
            s = self.session
            if not refreshed:
                s.home.store.refresh()
            for r in getattr(s.home.store, self.kind.stored)(s.user, s.name, after=len(self.records) + len(ready)):
                self.waiting.setdefault(number(r), r)
            ready = self._ready(ready)
        self.keep(ready, event)

    def _ready(self, ready: list) -> list:
        while len(self.records) + len(ready) + 1 in self.waiting:
            ready.append(self.waiting.pop(len(self.records) + len(ready) + 1))
        return ready

    def write(self, build: Callable[[list], None], made: list) -> list:
        """Make records durable and keep them: `build(made)` numbers them under the session's lock, after
        taking in what other processes made (called again when the lease ran out meanwhile: Home.journal_op)."""
        s = self.session

        def ops() -> list[dict]:
            made.clear()
            self.take([], store=True)
            build(made)
            return [self.kind.to_op(r) for r in made]

        s.home.journal_op(s, ops)
        getattr(s.pending, self.kind.pending).extend((s.user, s.name, r) for r in made)
        self.keep(made, self.kind.op)
        s.tiers.store_vectors(self.kind, made)
        return made

    def adopt(self, ops: list[dict]) -> None:
        """A dead process's records (recovery): ours to store now, and taken in (state changes as input events)."""
        s = self.session
        records = [self.kind.from_op(op) for op in ops if op["op"] == self.kind.op]
        getattr(s.pending, self.kind.pending).extend((s.user, s.name, r) for r in records)
        if records or self.kind is STATE:
            self.take(records, event="in" if self.kind is STATE else "")
        s.tiers.store_vectors(self.kind, records)   # accepted into the journal, never stored: stored with its vector


class Tiers:
    """The session's three tiers, and how each is written."""

    def __init__(self, session: "Session") -> None:
        self.session = session
        self.state, self.facts, self.summaries = State(), Facts(), Summaries()
        self.tiers = {STATE.op: Tier(session, STATE, self.state), FACT.op: Tier(session, FACT, self.facts),
                      SUMMARY.op: Tier(session, SUMMARY, self.summaries)}
        self.vectors: dict[str, np.ndarray] = {}   # each record's text → its vector (views of the tiers' own rows)

    def embedded(self, texts: list[str], given: list | None = None) -> np.ndarray:
        """The texts' vectors, at the store's precision (float16): those given (stored with the records),
        those of the snapshot the session opened from, those this process holds; only the rest are
        embedded, in one call (an open that finds them all loads no embedder)."""
        known = getattr(self.session.source, "vectors", None) or {}
        out: list[Any] = [g if g is not None else known.get(t, self.vectors.get(t))
                          for t, g in zip(texts, given or [None] * len(texts))]
        missing = list(dict.fromkeys(t for t, v in zip(texts, out) if v is None))
        if missing:
            made = dict(zip(missing, self.session.home.embedder.embed(missing).astype(np.float16).astype(np.float32)))
            out = [v if v is not None else made[t] for t, v in zip(texts, out)]
        vectors = np.stack(out).astype(np.float32, copy=False)
        self.vectors.update(zip(texts, vectors))
        return vectors

    def store_vectors(self, kind: Kind, records: list) -> None:
        """Write records' vectors to the store with the next flush (with their rows, or over rows stored
        without them); the vectors are this process's already (embedded when the records were kept)."""
        s = self.session
        if kind.text is None or not records or s.home.read_only:
            return
        vectors = self.embedded([kind.text(r) for r in records])
        key = embedder_key(s.home.embedder)
        s.pending.vectored.extend((kind.stored, s.user, s.name, r, key, v) for r, v in zip(records, vectors))

    def __getitem__(self, op: str) -> Tier:
        return self.tiers[op]

    def load(self, store) -> None:
        """The tiers as the store (or the snapshot) holds them. Facts and summaries take the vectors stored
        with them; those without (stored before m009, or by another embedder) are embedded here, and a
        writing open stores them (once: the next open finds them)."""
        s = self.session
        self.state.take(store.state_changes(s.user, s.name))   # one after a gap (a damaged store) waits
        for kind in (FACT, SUMMARY):
            records = getattr(store, kind.stored)(s.user, s.name)
            from_store = s.source is None and bool(records)
            stored = s.home.store.tier_vectors(kind.stored, s.user, s.name, embedder_key(s.home.embedder)) if from_store else {}
            self.tiers[kind.op].keep(records, "", stored)
            if from_store:
                self.store_vectors(kind, [r for r in records if number(r) not in stored])

    def take_journal(self, ops: list[dict]) -> None:
        """Other processes' records from their journals."""
        for tier in self.tiers.values():
            records = [tier.kind.from_op(op) for op in ops if op["op"] == tier.kind.op]
            if records or tier.kind is STATE:
                tier.take(records)

    def take_stored(self) -> None:
        """Every record other processes flushed to the store that this one has not taken in (the store is
        up to date)."""
        for tier in self.tiers.values():
            tier.take([], store=True, refreshed=True)

    def adopt(self, ops: list[dict]) -> None:
        for tier in self.tiers.values():
            tier.adopt(ops)

    # -- the working state ------------------------------------------------------------------------------
    def set_state(self, key: str, value: str | None, source: str = "model") -> Change | None:
        """Set one key of the working state (value None: unset it), durable before this returns and
        numbered after every change other processes made. None if nothing changes (the value it has,
        or an unset of a key that is not set). InputError names what is wrong with key or value."""
        key, value = check_state(key, value)
        s = self.session

        def build(made: list) -> None:
            held = self.state.current.get(key)
            if (held.value if held else "") != value:
                made.append(Change(self.state.seq + 1, key, value, not value, s.tail_n, s.turn_count, s.clock(), source))

        made = self.tiers[STATE.op].write(build, [])
        return made[0] if made else None

    def apply_state(self, changes: list[tuple[str, str | None]]) -> None:
        """A memory model's state changes, (key, value) or (key, None) to unset; replay feeds the
        recorded ones here. One that no longer applies (an unset of a key not set) changes nothing."""
        self.session.emit("state_written", changes=[{"key": k, "value": v} if v is not None else {"key": k, "unset": True}
                                                    for k, v in changes])
        for key, value in changes:
            try:
                self.set_state(key, value, source="memory")
            except InputError:  # checked when parsed; a recorded answer from an older pager may not be
                continue

    # -- facts and summaries ----------------------------------------------------------------------------
    def produce(self, producer, pages: list[int] | None, add: Callable[[list, str], list]) -> list:
        """Ask a producer (a memory model, its recorded output, or the extractive one) for records of pages
        (all sealed pages and the tail if none are named). A failing producer is an event and
        `memory_error`, never an exception: the turns are already durable and stay."""
        s = self.session
        pages = sorted(s.pages) + [s.tail_n] if pages is None else pages
        try:
            drafts = list(producer(s, pages))
        except Exception as exc:  # noqa: BLE001 - any provider failure; the tiers only ever add
            s.memory_error = " ".join(str(exc).split())[:300]
            s.emit("memory_error", pages=[page_id(n) for n in pages[:50]], error=s.memory_error)
            return []
        return add(drafts, getattr(producer, "source", "model"))

    def add_facts(self, drafts: list[Draft], source: str) -> list[Fact]:
        """Keep a producer's answer as facts (replay feeds the recorded answer here): each placed on the
        pages of its turns, dated by its last turn unless it says when it became true."""
        s = self.session
        s.emit("facts_written", source=source, facts=[{"subject": d.subject, "text": d.text, "turns": list(d.turns),
                                                       **({"ts": d.ts} if d.ts is not None else {}),
                                                       **({"op": d.op, "target": d.target} if d.op != "add" else {})}
                                                      for d in drafts])
        turn_pages = self.turn_pages({t for d in drafts for t in d.turns})
        drafts = [d for d in drafts if d.text.strip()]

        def build(made: list) -> None:
            for d in drafts:
                turns = tuple(t for t in d.turns if t in turn_pages)
                when = d.ts if d.ts is not None else max((turn_pages[t][1] for t in turns), default=s.clock())
                subject, ends = d.subject, False
                if d.op in ("update", "invalidate"):  # on the subject of the fact it replaces or ends, after it
                    target = self.facts.get(d.target) or next((f for f in made if f.n == d.target), None)
                    if target is None:
                        continue
                    subject, ends, when = target.subject, d.op == "invalidate", max(when, target.ts)
                pages = tuple(sorted({p for t in turns for p in turn_pages[t][0]}))
                made.append(Fact(len(self.facts) + len(made) + 1, subject, " ".join(d.text.split()), turns, pages,
                                 when, date_label(when), source, ends))

        return self.tiers[FACT.op].write(build, []) if drafts else []

    def add_summaries(self, drafts: list[SummaryDraft], source: str) -> list[Summary]:
        """Keep a producer's answer as summaries (replay feeds the recorded answer here): each covers
        the pages of its first to its last turn, dated by its last turn; a key held already gets its
        next version, and the older one stays."""
        self.session.emit("summaries_written", source=source, summaries=[
            {"kind": d.kind, "key": d.key, "text": d.text, "turns": list(d.turns), **({"ts": d.ts} if d.ts is not None else {})}
            for d in drafts])
        drafts = [d for d in drafts if d.text.strip() and d.kind in ("rolling", "episode")]
        turn_pages = self.turn_pages({t for d in drafts for t in d.turns})

        def build(made: list) -> None:
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

        return self.tiers[SUMMARY.op].write(build, []) if drafts else []

    def turn_pages(self, wanted: set[int]) -> dict[int, tuple[list[int], float]]:
        """turn → (the pages holding it, its timestamp), for the turns asked about."""
        s = self.session
        out = s.pages.holding(wanted)
        for piece in s.packer.pieces:
            if piece.turn.turn in wanted:
                out.setdefault(piece.turn.turn, ([], piece.turn.ts))[0].append(s.tail_n)
        return out
