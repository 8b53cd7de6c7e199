"""Turns and pages, and the packer that lays turns onto pages.

Pages are packed: consecutive turns share a page until the next one would not fit, so a
frame is nearly full of conversation instead of one short turn and empty space. A turn
longer than a page spans several. Packing is deterministic (same turns, tokenizer and
page size give the same pages), so any process can rebuild the open tail page from the
turns, and two processes on one session seal identical pages.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from numbers import Integral

from .tokens import ASCII_LETTERS, Tokenizer, last_boundary, tail_start


@dataclass(frozen=True)
class Turn:
    """One message of the conversation, as accepted."""

    session: str
    turn: int            # 1-based position in the session
    speaker: str
    text: str
    role: str = "user"   # user or assistant
    date: str = ""       # human date label, e.g. "8 May 2023"
    ts: float = 0.0      # seconds since the epoch
    ref: str = ""        # id in an imported file, e.g. LoCoMo "D1:3"
    user: str = ""
    key: str = ""        # idempotency key: a message sent again with the same key is not stored twice

    def to_dict(self) -> dict:
        fields = self.__dict__   # a plain dataclass keeps its fields there, in their order
        return {k: fields[k] for k in self.__dataclass_fields__}

    def numbered(self, turn: int) -> "Turn":
        """This turn with another number (dataclasses.replace, without its per-field checks: a
        thousand-turn append numbers a thousand drafts)."""
        return Turn(**{**self.__dict__, "turn": turn})

    def identity(self) -> str:
        """A key for a turn that came with none, as `pager export` writes it: its number and a digest
        of what it says, so importing a session's export back into it adds nothing twice."""
        what = "\x00".join((self.speaker, self.role, self.text, self.date, repr(float(self.ts))))
        return f"turn:{self.turn}:{hashlib.sha256(what.encode()).hexdigest()[:16]}"

    @classmethod
    def from_record(cls, record: dict) -> "Turn":
        """From a journal op or a store row (rows of schema v1 have no key)."""
        return cls(**{k: record[k] for k in cls.__dataclass_fields__ if k in record})


def header_reserve(page_tokens: int) -> int:
    """Tokens kept free on each page for its header.

    20 tokens hold `[p12345 · 28 September 2023]` and, when they fit, a bookmark or two;
    a larger reserve would buy bookmarks in every header at the cost of 10% of every page
    (measured: recall drops), and the memory map lists bookmarks of the pages that matter,
    the ones not resident."""
    return min(20, page_tokens // 5)


@dataclass(frozen=True)
class Page:
    """An immutable run of consecutive conversation, at most page_tokens tokens with its header."""

    session: str
    n: int                                  # 1-based page number in the session
    text: str                               # the body, one line per turn or part of a turn
    tokens: int                             # tokens of the body
    spans: tuple[tuple[int, int, int], ...]  # (turn, start char, end char) held, in order
    lines: tuple[tuple[int, int], ...] = ()  # (start, end) in text of each span's line, speaker included
    speakers: tuple[str, ...] = ()
    date_first: str = ""
    date_last: str = ""
    ts_first: float = 0.0
    ts_last: float = 0.0
    refs: tuple[str, ...] = ()              # imported ids of the turns held
    keywords: tuple[str, ...] = ()          # automatic bookmarks written when sealed
    importance: float = 0.0
    user: str = ""
    # tokens of each piece's text (piece_text) by the packer's tokenizer, -1 where packing did not count it, () for
    # none (pages stored before schema 8); not part of what the page is: two packers seal equal pages with or without
    piece_tokens: tuple[int, ...] = field(default=(), compare=False)

    def piece_count(self, i: int) -> int:
        """Tokens of the i-th piece's text as counted when the page was packed, -1 if not counted."""
        counts = self.piece_tokens
        return counts[i] if i < len(counts) else -1

    @property
    def id(self) -> str:
        return page_id(self.n)

    def piece_text(self, i: int) -> str:
        start, end = self.lines[i]
        return self.text[start:end]

    def piece_speaker(self, i: int) -> str:
        head = self.piece_text(i).split(": ", 1)[0]
        return head.removesuffix(" (cont.)")

    @property
    def turns(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys(t for t, _, _ in self.spans))

    @property
    def first_turn(self) -> int:
        return self.spans[0][0] if self.spans else 0

    @property
    def last_turn(self) -> int:
        return self.spans[-1][0] if self.spans else 0


class Pages(MutableMapping[int, Page]):
    """A session's sealed pages by number, p1..pk: the first `len(stored)` as the store holds them, each
    decoded from its row (store.PageColumns, or a list of Pages) when first touched and kept; those
    sealed since, kept as made. A session of 100K pages opens without making 100K objects.

    Pages are never deleted nor replaced, and a session's pages run without a gap (Session._load keeps
    only the gapless run p1..pk it read), so page n is row n - 1 of what was stored."""

    BATCH = 512   # rows decoded together when the pages are read in order

    def __init__(self, stored=()) -> None:
        self._stored = stored
        self._count = len(stored)
        self._made: dict[int, Page] = {}
        self._sealed = 0   # pages sealed since (numbered past the stored ones): len() counts no dict

    stored = property(lambda self: self._stored, doc="the stored pages as they were read (store.PageColumns, or a list of Pages)")

    def __getitem__(self, n: int) -> Page:
        page = self._made.get(n)
        if page is None:
            if not (isinstance(n, Integral) and 1 <= n <= self._count):
                raise KeyError(n)
            n = int(n)
            page = self._made.setdefault(n, self._decode(n - 1, n)[0])
        return page

    def _decode(self, start: int, stop: int) -> list[Page]:
        stored = self._stored
        return stored.pages(start, stop) if hasattr(stored, "pages") else list(stored[start:stop])

    def __setitem__(self, n: int, page: Page) -> None:
        if n > self._count and n not in self._made:
            self._sealed += 1
        self._made[n] = page

    def __delitem__(self, n: int) -> None:
        raise TypeError("pages are never deleted")

    def __contains__(self, n: object) -> bool:
        return (isinstance(n, Integral) and 1 <= int(n) <= self._count) or n in self._made

    def __len__(self) -> int:
        return self._count + self._sealed

    def __iter__(self) -> Iterator[int]:
        yield from range(1, self._count + 1)
        yield from (n for n in self._made if n > self._count)

    def values(self) -> Iterator[Page]:   # type: ignore[override]
        """Every page in order, decoding the stored ones not yet made BATCH rows at a time."""
        for start in range(0, self._count, self.BATCH):
            stop = min(start + self.BATCH, self._count)
            if any(n not in self._made for n in range(start + 1, stop + 1)):
                for page in self._decode(start, stop):
                    self._made.setdefault(page.n, page)
            yield from (self._made[n] for n in range(start + 1, stop + 1))
        yield from (p for n, p in self._made.items() if n > self._count)

    def items(self) -> Iterator[tuple[int, Page]]:   # type: ignore[override]
        return ((p.n, p) for p in self.values())

    def holding(self, turns: set[int]) -> dict[int, tuple[list[int], float]]:
        """turn → (the pages holding it, in order; the first one's ts_last), for the turns asked about. Of
        the stored pages only those whose run of turns takes one in are read (store.PageColumns.holding)."""
        stored = self._stored
        candidates = stored.holding(turns) if hasattr(stored, "holding") else range(1, self._count + 1)
        out: dict[int, tuple[list[int], float]] = {}
        for n in [*candidates, *(n for n in self._made if n > self._count)]:
            page = self[n]
            for turn, _, _ in page.spans:
                if turn in turns:
                    out.setdefault(turn, ([], page.ts_last))[0].append(n)
        return out

    def decoded(self) -> int:
        """How many stored pages have been made into Page objects."""
        return sum(1 for n in self._made if n <= self._count)


def page_id(n: int) -> str:
    return f"p{n}"


def parse_page_id(text: str) -> int | None:
    """The page number of 'p42' (or '42'); None if text is not a page id."""
    text = text.strip().lower()
    digits = text[1:] if text.startswith("p") else text
    return int(digits) if digits.isascii() and digits.isdigit() and len(digits) < 12 else None   # "²" is a digit too


@dataclass
class _Piece:
    turn: Turn
    start: int
    end: int
    line: str
    tokens: int = -1   # of the line without its date marker (Page.piece_tokens), -1 if not counted


@dataclass
class Packer:
    """Lays turns onto pages; the pieces not yet sealed are the open tail page."""

    session: str
    tokenizer: Tokenizer
    page_tokens: int
    next_n: int = 1
    user: str = ""
    pieces: list[_Piece] = field(default_factory=list)
    body_tokens: int = 0
    _uncounted: bool = False   # a piece was laid without counting the body (a turn split to fit)

    @property
    def capacity(self) -> int:
        # header, its newline and the separator to the next block all fit the frame
        return self.page_tokens - header_reserve(self.page_tokens) - 2

    def add(self, turn: Turn, start: int = 0, line_tokens: int | None = None) -> list[Page]:
        """Append turn (from char start on); return the pages this sealed. line_tokens: the exact count
        of `speaker: text` by this packer's tokenizer, if the caller has it (counted for the whole accepted
        group at once: intake.count_turns); used only where it keeps every count exact."""
        sealed: list[Page] = []
        text = turn.text
        while True:
            # a body longer than capacity × the longest token cannot fit: neither built nor counted (a
            # long turn would be copied and re-counted whole for each of its pages)
            head = self._line(turn, start, "")
            chars = sum(len(p.line) + 1 for p in self.pieces) + len(head) + len(text) - start
            if chars > (self.capacity + 1) * self.tokenizer.longest_token:
                line, tokens = "", self.capacity + 1
            else:
                line = head + text[start:]
                # the caller's count is of "speaker: text", the line unless a date marker leads it
                known = line_tokens if not start and len(head) == len(turn.speaker) + 2 else None
                tokens = self.count_appended(line, known)
            if tokens <= self.capacity:
                # the piece's own count, where packing had it: the caller's (of "speaker: text", the piece's
                # text after any date marker) or, for a page's first piece (never dated), the body's
                own = line_tokens if not start and line_tokens is not None else tokens if not self.pieces else -1
                self.pieces.append(_Piece(turn, start, len(text), line, own))
                self.body_tokens = tokens
                return sealed
            if self.pieces:
                sealed.append(self.seal())
                continue
            end = self._split_point(turn, start)
            self.pieces.append(_Piece(turn, start, end, self._line(turn, start, text[start:end])))
            self._uncounted = True
            sealed.append(self.seal())
            start = end
            if start >= len(text):
                return sealed

    def seal(self) -> Page:
        """Close the open page (it must hold something) and start the next."""
        pieces = self.pieces
        text = "\n".join(p.line for p in pieces)
        turns = [p.turn for p in pieces]
        lines, offset = [], 0
        for p in pieces:
            date_marker = f"({p.turn.date})\n"  # speakers hold no newline, so this is unambiguous
            marker = len(date_marker) if p.turn.date and p.line.startswith(date_marker) else 0
            lines.append((offset + marker, offset + len(p.line)))
            offset += len(p.line) + 1
        page = Page(
            session=self.session,
            n=self.next_n,
            text=text,
            # the body as last counted is this text, unless a split piece was laid since (add's split path)
            tokens=self.body_tokens if self.body_tokens and not self._uncounted else self.tokenizer.count(text),
            spans=tuple((p.turn.turn, p.start, p.end) for p in pieces),
            lines=tuple(lines),
            speakers=tuple(dict.fromkeys(t.speaker for t in turns)),
            date_first=turns[0].date,
            date_last=turns[-1].date,
            ts_first=turns[0].ts,
            ts_last=turns[-1].ts,
            refs=tuple(dict.fromkeys(t.ref for t in turns if t.ref)),
            user=self.user,
            piece_tokens=tuple(p.tokens for p in pieces) if any(p.tokens >= 0 for p in pieces) else (),
        )
        self.pieces = []
        self.body_tokens = 0
        self._uncounted = False
        self.next_n += 1
        return page

    def _line(self, turn: Turn, start: int, chunk: str) -> str:
        marker = ""
        previous = self.pieces[-1].turn if self.pieces else None
        if previous is not None and turn.date and turn.date != previous.date:
            marker = f"({turn.date})\n"
        cont = " (cont.)" if start else ""
        return f"{marker}{turn.speaker}{cont}: {chunk}"

    def _body_with(self, line: str) -> str:
        if not self.pieces:
            return line
        return "\n".join(p.line for p in self.pieces) + "\n" + line

    def count_appended(self, line: str, known: int | None = None) -> int:
        """Exact tokens of the open page's body with line appended (after a newline), recounting only
        the body's end: tiktoken's pre-tokenizer (cl100k, o200k) is a regex, BPE works within each
        pre-token, and no pre-token holds an ASCII letter followed by a space (Tokenizer.count_extended)
        nor a newline followed by a letter (a letter run takes one non-letter in front of it, never a
        newline). So the body counts as body_tokens - count(end) + count(end + "\n" + line), where end
        is the body's last line from its last letter-space boundary (or only its closing punctuation,
        Tokenizer.count_extended's tail_start: the suffix starts with a newline), and when `known` (line's own
        exact count) is given and line starts with an ASCII letter, count(end + "\n") + known stands
        for the last term (the difference count(end + "\n") - count(end) cached by the tokenizer: ends
        repeat). Property-tested against the whole count (tests/test_ingest_path.py)."""
        count = self.tokenizer.count
        if not self.pieces:
            return known if known is not None else count(line)
        last = self.pieces[-1].line
        c = tail_start(last, "\n")   # its closing punctuation, where it can (the few such ends are cached)
        if c < 0:
            c = last_boundary(last)
        if c <= 0 or self._uncounted:
            return count(self._body_with(line))
        end = last[c:]
        if known is not None and line[:1] in ASCII_LETTERS:
            return self.body_tokens + self.tokenizer.delta(end, "\n") + known   # count(end + "\n") - count(end)
        return self.body_tokens - count(end) + count(end + "\n" + line)

    def _split_point(self, turn: Turn, start: int) -> int:
        """The end of the longest piece of turn from start that fits an empty page."""
        text = turn.text
        head = self._line(turn, start, "")
        lo = self.tokenizer.fit_end(text, start, self.capacity, head=head)
        space = text.rfind(" ", start + 1, lo)
        return space + 1 if space > start + (lo - start) // 2 else lo


def date_label(ts: float) -> str:
    """The day a turn or record is dated by when it was sent without a date: "6 Dec 2026"."""
    return time.strftime("%-d %b %Y", time.localtime(ts))
