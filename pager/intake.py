"""How turns reach a session's pages: checked, numbered, packed, sealed and embedded.

Messages are checked and normalized (`draft`), numbered after the durable last turn under the
session's lock (`number`, which also answers a retried idempotency key with the turn that holds it),
then taken in order with no gap (`take`): a turn ahead of a gap waits for it. Packing seals pages;
each sealed page gets its keywords and importance, and the pages sealed since are embedded in one
batch (`embed_pending`) and indexed.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Iterable

import numpy as np

from . import bookmarks as bm
from .errors import InputError, KeyReused
from .formats import MAX_TS
from .page import Page, Turn, date_label
from .search import QUOTE, label_time, piece_kind

if TYPE_CHECKING:
    from .session import Session

SPEAKER_TOKENS = 16


class Intake:
    def __init__(self, session: "Session") -> None:
        self.session = session
        self.speakers: dict[str, str] = {}   # speaker as sent → as kept (fit to SPEAKER_TOKENS)
        self.waiting: dict[int, tuple[Turn, bool]] = {}  # turns known ahead of a gap, and whether ours
        self.keys: dict[str, int] = {}      # idempotency key → turn, for the turns taken in
        self._keys_loaded = False
        self.counted: dict[int, tuple] = {}   # turn → (the turn, its line's tokens, its text's tokens): count_turns
        self.unembedded: list[Page] = []
        self.embedded_early: dict[str, np.ndarray] = {}   # turn text → its vector, made while the journal synced
        self.embedding_early: list = []   # (the embedding thread's future, the texts of ours it embeds), not yet taken

    # -- checking and numbering -------------------------------------------------------------------------
    def draft(self, m: dict) -> Turn:
        """A message checked and normalized, not yet numbered; InputError names what is wrong."""
        s = self.session
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
            ts = (label_time(str(m["date"])) if m.get("date") else None) or s.clock()
        ts = float(ts)
        speaker = str(m.get("speaker") or m.get("role") or "user")
        if speaker not in self.speakers:   # a conversation has few speakers: fit each once
            if len(self.speakers) > 10_000:
                self.speakers.clear()
            self.speakers[speaker] = s.tokenizer.fit(" ".join(speaker.split()), SPEAKER_TOKENS)
        speaker = self.speakers[speaker]
        return Turn(s.name, 0, speaker or "user", text, m.get("role") or "user", m.get("date") or date_label(ts),
                    ts, str(m.get("ref") or ""), s.user, str(m.get("key") or ""))

    def number(self, drafts: list[Turn], last_turn: int) -> tuple[list[Turn], list[Turn]]:
        """(the turns to write, one turn per draft): numbered after the durable last turn, under the
        session's lock after sync; a draft whose key the session holds gets its turn, not a new one."""
        if any(d.key for d in drafts):
            self._load_keys()
        self._recognise_exported([d.key for d in drafts if d.key.startswith("turn:") and d.key not in self.keys])
        base = max(last_turn, self.session.turn_count, max(self.waiting, default=0))
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
        s = self.session
        turns = {t.turn: t for t in s.home.store.turns(s.user, s.name, after=after)}
        for op in s.home.journal.read_new({}, own=True):
            if op["op"] == "turn" and (op["user"], op["session"]) == (s.user, s.name) and op["turn"] > after:
                turns.setdefault(op["turn"], Turn.from_record(op))
        return turns

    def _load_keys(self) -> None:
        if not self._keys_loaded:
            s = self.session
            s.home.store.refresh()
            for key, turn in s.home.store.keys(s.user, s.name).items():
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

    # -- onto pages ---------------------------------------------------------------------------------------
    def take_accepted(self, turns: list[Turn], origin: str) -> None:
        """Turns this process just made durable: to the store at the next flush, onto pages now."""
        s = self.session
        s.pending.turns += turns
        s.paging.in_use = set()
        line = s.packer.tokenizer
        self.counted = count_turns(turns, line, s.tokenizer if s.events.listeners else None,
                                   (s.packer.capacity + 1) * line.longest_token)
        self.take(turns, announce=origin if origin == "input" else None, own=True)
        self.counted = {}   # counts of turns left waiting behind a gap are made again
        self.embed_pending()

    def receive(self, records: list[dict]) -> list[Turn]:
        """Turns another process appended, as a trace recorded them (replay): numbered after ours."""
        s = self.session
        turns = [Turn(s.name, s.turn_count + i + 1, r["speaker"], r["text"], r.get("role", "user"),
                      r.get("date", ""), r.get("ts", 0.0), r.get("ref", ""), s.user) for i, r in enumerate(records)]
        self.take(turns, announce="other process")
        self.embed_pending()
        return turns

    def take(self, turns: Iterable[Turn], announce: str | None = None, own: bool = False) -> list[Turn]:
        """The only way turns reach pages: in order, with no gap. A turn ahead of a gap waits for it."""
        s = self.session
        for t in turns:
            if t.turn > s.turn_count:
                self.waiting.setdefault(t.turn, (t, own))
            if t.key:
                self.keys.setdefault(t.key, t.turn)
        ready: list[tuple[Turn, bool]] = []
        n = s.turn_count + 1
        while n in self.waiting:
            ready.append(self.waiting.pop(n))
            n += 1
        if announce and ready:   # the records only for a listener: an event nobody hears is numbered, not made
            s.emit("append", origin=announce, turns=[_turn_record(t) for t, _ in ready] if s.events.listeners else [])
        if ready:
            s.calls.feed([t for t, _ in ready])
        for t, mine in ready:
            start, s.next_start = s.next_start, 0
            self._pack(t, start, mine)
        return [t for t, _ in ready]

    def skip_missing(self, last: int) -> None:
        """Turns up to `last` are durable somewhere every process can read; any still missing after
        the journals and the store were read were lost to damage: say so once, and go on without them."""
        s = self.session
        while s.turn_count < last:
            n = s.turn_count + 1
            if n not in self.waiting:
                s.home.warn(f"turn {n} of session {s.name!r} is in no journal and not in the store "
                            "(a damaged journal record); it is skipped")
                s.emit("turn_missing", turn=n)
                s.turn_count, s.next_start = n, 0
            self.take(())

    def _pack(self, turn: Turn, start: int, own: bool) -> None:
        s = self.session
        s.turn_count = max(s.turn_count, turn.turn)
        if start >= len(turn.text):
            return  # the last sealed page ended exactly at this turn's end
        counted = self._counts(turn) if self.counted else None
        tokens = 0   # an event nobody listens to is numbered, not made: its count would go unread
        if s.events.listeners:
            tokens = counted[2] if counted and counted[2] is not None else s.tokenizer.count(turn.text)
        s.emit("turn", turn=turn.turn, speaker=turn.speaker, role=turn.role, date=turn.date, tokens=tokens,
               ref=turn.ref)
        for page in s.packer.add(turn, start, counted[1] if counted else None):
            self._seal(page)
            if own:
                s.calls.sealed(page.n)
        s.paging.writing(s.tail_n).tokens = s.packer.body_tokens

    def _counts(self, turn: Turn) -> tuple | None:
        """This turn's counts, if they were made for this very turn (take_accepted): (turn, tokens of
        `speaker: text` or None, tokens of the text or None)."""
        counted = self.counted.pop(turn.turn, None)
        return counted if counted is not None and counted[0] is turn else None

    def _seal(self, page: Page) -> None:
        s = self.session
        own = own_text(page)
        words_first = s.home.config.words_first
        keywords = tuple(bm.extract(own, words_first=words_first))
        named = tuple(k for k in keywords if not bm.is_filler(k)) if words_first else keywords
        page = Page(**{**page.__dict__, "keywords": keywords, "importance": _importance(own, named)})   # replace(), unchecked
        s.pages[page.n] = page
        self.unembedded.append(page)
        s.directory.add(keywords, [page.n])
        entry = s.paging.writing(page.n)
        entry.tokens, entry.importance = page.tokens, page.importance
        s.paging.tick += 1
        s.paging.use(entry)
        s.emit("page_sealed", page=page.id, tokens=page.tokens, turns=list(page.turns), keywords=list(keywords))

    def embed_pending(self) -> None:
        """Embed newly sealed pages in one batch and index them."""
        s = self.session
        while self.embedding_early:   # the embedding thread's vectors for turns this process accepted (WritePath.embed_early)
            future, accepted = self.embedding_early.pop(0)
            made = early_vectors(future)
            self.embedded_early.update((t, made[t]) for t in accepted if t in made)
        pages = self.unembedded
        if not pages:
            return
        texts = [p.piece_text(i).split(": ", 1)[-1] for p in pages for i in range(len(p.spans))]
        early = self.embedded_early   # the texts of turns embedded while the journal synced (WritePath.embed_early)
        known = {t: early[t] for t in texts if t in early}
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:
            known.update(zip(missing, s.home.embedder.embed(missing)))
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
            s.index.add(page, piece_vectors)
            s.pending.pages.append(page)
            s.pending.vectors.append(piece_vectors)
        self.unembedded = []


def early_vectors(early) -> dict:
    """What WritePath.embed_early made, once it is done ({} if embedding failed: the pages are then
    embedded as usual, and that embedding reports the failure)."""
    try:
        return early.result()
    except Exception:  # noqa: BLE001 - the usual path embeds again and raises there
        return {}


def count_turns(turns: list[Turn], line, text, longest: int) -> dict[int, tuple]:
    """turn → (the turn, tokens of its `speaker: text` by tokenizer `line`, of its text by `text` if
    given): the counts Intake._pack asks for, made for a group of accepted turns at once. A text longer
    than `longest` characters cannot fit a page whole: its line is not counted."""
    return {t.turn: (t, line.count(f"{t.speaker}: {t.text}") if len(t.text) <= longest else None,
                     text.count(t.text) if text is not None else None) for t in turns}


def _turn_record(t: Turn) -> dict:
    return {"speaker": t.speaker, "text": t.text, "role": t.role, "date": t.date, "ts": t.ts, "ref": t.ref}


def own_text(page: Page) -> str:
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
