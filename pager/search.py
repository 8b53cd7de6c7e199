"""Hybrid search over one session's pages: BM25, vectors, bookmarks, speakers and dates, fused.

The unit of evidence is a *piece*: one turn (or part of one) as laid on a page. A page
scores as its best piece, plus a little of its neighbours' scores (what read-ahead brings in).
Measured on the LoCoMo development split (BENCHMARKS.md), each of these choices pays:

- pieces instead of whole pages: a page with one answering turn is not diluted by the rest;
- a piece is indexed with the terms of the piece before it: answers often reply to a question;
- Porter2 stemming ("camped" meets "camping"), and query words expanded to the session's
  own vocabulary by embedding similarity ("pets" finds "cat");
- a piece spoken by a person the query names counts a little more;
- a page counts a little more when its episode (the day it was said) holds other good pages:
  the evidence for a question clusters in the conversations where the topic came up;
- importance (names, numbers, decisions, allergies on the page) breaks near-ties; recency is
  off by default (`recency_weight`): the frames and the eviction policy already keep what is
  recent, and on LoCoMo, where questions reach back uniformly, it costs recall;
- a piece with a sentence saying a value changed ("Update: the launch moved to April 10", "is now",
  "no longer") puts its page just above an earlier page it updates, one holding the same words of
  the query as that sentence (`supersedes`): BM25 prefers the shorter first statement, and the old
  value would be paged in and answered. Asked what it was "before" (or "used to", "earlier"), the
  earlier statement ranks above its update instead. On LoCoMo no question pairs two such pieces;
- a hit whose page holds no word of the query, near it by meaning only, is weak (`is_weak`): the
  ranking is the same, the search CLI and tool say so;
- a deep search (many pages wanted, as when a large budget is filled) widens the query with
  terms of its own best pieces (pseudo-relevance feedback) and leans more on the vector
  signal: with dozens of frames to fill, breadth pays; with a handful, precision does, so
  shallow searches stay literal.

The index lives in memory, one per open session, and grows a page at a time (rank-bm25
cannot add documents, so BM25 here is a small incremental inverted index). LanceDB holds
the same text and vectors; the index is rebuilt from it when a session opens. Every hit
carries its per-signal scores so a ranking can be explained.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
import time
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import lru_cache

import numpy as np

from .bookmarks import MONTHS, STOPWORDS, Directory
from .page import Page
from .screen import Screen

_TOKEN = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
# _TOKEN's matches in ASCII text, where its CJK branch and "’" cannot match: one branch starting at a character
# class, which the regex engine looks for first (a fifth quicker)
_ASCII_TOKEN = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
_WORD = re.compile(r"[a-z][a-z'’-]{2,}")
# ASCII characters other than a-z and 0-9 as spaces: in ASCII text without "'", _TOKEN's matches are the maximal
# runs of a-z and 0-9, which str.split then finds at twice the regex's speed (tests/test_ingest_path.py)
_SPACES = str.maketrans({c: " " for c in map(chr, range(128)) if not ("a" <= c <= "z" or "0" <= c <= "9")})


def _tokens(low: str, ascii: bool) -> list[str]:
    """_TOKEN.findall(low): the tokens of a lower-cased text (`ascii`: low.isascii())."""
    if not ascii:
        return _TOKEN.findall(low)
    return low.translate(_SPACES).split() if "'" not in low else _ASCII_TOKEN.findall(low)


@lru_cache(maxsize=1)
def _stemmer():
    """snowballstemmer's English stemmer, imported alone: the package's `__init__` imports the
    stemmers of 30 languages (a fifth of a cold `pager search`'s work beyond its imports)."""
    from .deferred import defer

    defer("snowballstemmer")
    from snowballstemmer.english_stemmer import EnglishStemmer

    return EnglishStemmer()


@lru_cache(maxsize=200_000)
def stem(word: str) -> str:
    return _stemmer().stemWord(word) if word.isascii() and word.isalpha() else word


def terms(text: str) -> list[str]:
    """BM25 terms: lower-cased, stemmed words without stopwords; CJK as character bigrams."""
    ascii = text.isascii()
    return _terms(_tokens(text.lower(), ascii), ascii)


def _terms(tokens: list[str], ascii: bool) -> list[str]:
    """The BM25 terms of a text's tokens (_TOKEN's matches in its lower case)."""
    if ascii:   # no CJK characters: every token is a word (the loop below, without its bigrams)
        return [term for term in map(_term, tokens) if term is not None]
    out: list[str] = []
    cjk: list[str] = []
    for tok in tokens + [""]:
        if len(tok) == 1 and ord(tok) > 0x3000:
            cjk.append(tok)
            continue
        if cjk:
            out.extend(cjk if len(cjk) == 1 else [a + b for a, b in zip(cjk, cjk[1:])])
            cjk = []
        if not tok:
            continue
        term = _term(tok)
        if term is not None:
            out.append(term)
    return out


def _vocabulary_words(low: str, tokens: list[str]) -> list[str]:
    """_WORD.findall(low), taken from low's tokens (_TOKEN's matches) when they hold it. Without "-", "'"
    and "’" a word is a longest run of three or more letters a-z, and so is a token of letters; a token
    of letters and digits holds runs of letters that are no token, and one of those ends the shortcut."""
    if "-" in low or "'" in low or "’" in low:
        return _WORD.findall(low)
    words = []
    for tok in tokens:
        if tok.isalpha():
            if len(tok) > 2:
                words.append(tok)
        elif not tok.isdigit():
            return _WORD.findall(low)
    return words


@lru_cache(maxsize=200_000)
def _term(tok: str) -> str | None:
    """A token's BM25 term (None for none): its possessive and stopwords dropped, stemmed."""
    tok = tok.replace("’", "'")
    if tok.endswith("'s"):
        tok = tok[:-2]
    if tok in STOPWORDS or (len(tok) < 2 and not tok.isdigit()):
        return None
    return stem(tok)


# -- echoes: pieces that repeat the query or quote another page ----------------------------------------------
# A chat stores its own questions and replies. Asked twice, the first asking matches the question
# better than the page holding the answer does, and a reply that quoted a page matches as well as
# the page itself: echoes of the query. They keep ECHO of their score, so the page that holds
# the answer ranks first and the echo stays findable.
ECHO = 0.2
PLAIN, QUESTION, QUOTE = 0, 1, 2
_QUOTES_PAGE = re.compile(r"(?:^|: |\. |\b[Aa]lso )[Ff]rom p\d+(?: \([^()\n]*\))?: “")
SHELL_NOTE = "(offline memory shell"   # the offline shell's replies that quote nothing say so
# a request for what memory holds, asked without a question mark: "Tell me about the offsite" (after a speaker)
_ASKS = re.compile(r"^(?:[^:\n]{1,40}: )?(?:tell me about|what about)\b", re.I)


def piece_kind(text: str) -> int:
    """QUOTE for a reply that quotes pages (the offline shell's answers, "From p5 (…): “…”") or
    notes that it is the shell; QUESTION for a question, or a request as "Tell me about X"; PLAIN otherwise."""
    # every match of _QUOTES_PAGE holds "rom p": a text without it skips the regex's scan of every position
    if ("rom p" in text and _QUOTES_PAGE.search(text)) or SHELL_NOTE in text:
        return QUOTE
    return QUESTION if "?" in text or ("bout" in text and _ASKS.match(text)) else PLAIN


def echoes(words, query_words, names=frozenset()) -> bool:
    """Does a question with these terms say little beyond the query (names of speakers aside)?
    A paraphrase one word apart echoes too: "Does anyone have a peanut allergy?" echoes
    "Who is allergic to peanuts?". Terms compare by their first six letters, so "allergic"
    echoes "allergy"."""
    own, wanted = {w[:6] for w in set(words) - names}, {w[:6] for w in set(query_words) - names}
    if not own or not wanted:
        return False
    shared = len(own & wanted)
    return (shared >= 0.8 * len(own) and shared >= 0.8 * len(wanted)) or (shared >= 2 and len(own ^ wanted) <= 1)


# -- updates: a later statement that changes a value --------------------------------------------------------
# Said in plain text, an update names the subject again and says that its value changed: "Update: …",
# "moved to", "pushed back to", "is now", "no longer", "instead of". A bare "now", "actually" or "changed"
# is left out: in conversation they are mostly talk ("for a while now", "it changed my life"); on the LoCoMo
# development split 128 turns held one of those words, and 8 one of these cues.
UPDATE_CUE = re.compile(
    r"^(?:[^:\n]{1,40}: )?(?:update|updated|correction|change of plans?)\b"
    r"|\b(?:moved|changed|switched|shifted|postponed|rescheduled|delayed|raised|lowered|increased|reduced|upped|"
    r"bumped|cut)\b[^.;:!?\n]{0,40}?\b(?:to|until)\b"
    r"|\b(?:pushed back|brought forward|postponed|rescheduled|called off|cancell?ed|no longer|instead of|anymore)\b"
    r"|\b(?:is|are|was|'s|’s|has been|have been) now\b"
    r"|\bnow (?:is|are|lives?|works?|takes?|costs?|starts?|begins?|ends?|due)\b", re.I)
# a question about an earlier value: the statement an update replaced ranks above the update instead
ASKS_BEFORE = re.compile(r"\b(?:before|previous(?:ly)?|earlier|used to|formerly|originally)\b", re.I)


def about(words: int) -> int:
    """How many of a query's words (names aside) a statement holds to be about what the query asks: all
    of two, all but one of three or more. A long question names many things, and a statement holding a
    few of them is not about the same value as another that holds a few."""
    return words - 1 if words >= 3 else words


_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_APOSTROPHE = re.compile("['’]")


# every match of UPDATE_CUE holds one of these words whole: a text whose tokens hold none has no cue, and is
# not searched with the regex (~25 µs a piece, a tenth of a turn's ingest; tests/test_updates.py)
CUE_WORDS = frozenset("update updated correction change moved changed switched shifted postponed rescheduled delayed "
                      "raised lowered increased reduced upped bumped cut pushed brought called cancelled canceled "
                      "longer instead anymore now".split())


def _cue_word(text: str, tokens: list[str]) -> bool:
    """Does a token hold one of CUE_WORDS, whole or on either side of an apostrophe ("now's", and
    "the'cancelled", where the regex sees a word boundary)?"""
    if not CUE_WORDS.isdisjoint(tokens):
        return True
    return ("'" in text or "’" in text) and not CUE_WORDS.isdisjoint(
        part for t in tokens for part in _APOSTROPHE.split(t))


def update_terms(text: str, tokens: list[str] | None = None) -> tuple[str, ...]:
    """The terms of the sentences of a text that say something changed (UPDATE_CUE), () if none: what the
    update is about. "My tournament got pushed back, so I tried out some cooking. Look at this coconut ice
    cream!" updates the tournament, not the ice cream. tokens: the text's lower-cased tokens, if made."""
    if tokens is None:
        low = text.lower()
        tokens = _tokens(low, low.isascii())
    if not _cue_word(text, tokens) or UPDATE_CUE.search(text) is None:
        return ()
    return tuple(t for sentence in _SENTENCE.split(text) if UPDATE_CUE.search(sentence) for t in terms(sentence))


class Hit:
    """One ranked page and why: the fused score and each signal's share.

    A search explains its hits only when asked (`signals`, read by the trace's search event, the
    CLI and the search tool): automatic paging reads the scores alone, and building ~50 hits'
    explanations was a tenth of its search. The explanation is made from the search's own arrays,
    so it is the same whenever it is read."""

    __slots__ = ("n", "score", "piece", "_signals", "_explain")

    def __init__(self, n: int, score: float, signals: dict[str, float] | None = None, piece: int = -1,
                 explain: Callable[[], dict[str, float]] | None = None) -> None:
        self.n, self.score, self.piece = n, score, piece   # piece: index of the best piece on the page
        self._signals = signals if signals is not None or explain is not None else {}
        self._explain = explain

    @property
    def signals(self) -> dict[str, float]:
        if self._signals is None:
            self._signals = self._explain() if self._explain is not None else {}
            self._explain = None
        return self._signals

    @signals.setter
    def signals(self, value: dict[str, float]) -> None:
        self._signals, self._explain = value, None

    @property
    def id(self) -> str:
        return f"p{self.n}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Hit):
            return NotImplemented
        return (self.n, self.score, self.signals, self.piece) == (other.n, other.score, other.signals, other.piece)

    __hash__ = None  # type: ignore[assignment]   # mutable, as the dataclass it was

    def __repr__(self) -> str:
        return f"Hit(n={self.n!r}, score={self.score!r}, signals={self.signals!r}, piece={self.piece!r})"


class _TermIds(dict):
    """Term → id, a term not yet held given the next id (and added to `words`, the terms by id)."""

    def __init__(self, words: list[str]) -> None:
        super().__init__(zip(words, range(len(words))))
        self.words = words

    def __missing__(self, word: str) -> int:
        i = self[word] = len(self.words)
        self.words.append(word)
        return i


class TermLists:
    """A tuple of terms for each piece, kept as one array of term ids and each piece's end in it, the
    terms once each: a session's index cache holds three arrays and its distinct terms, not a tuple
    per piece (~236K tuples to unpickle at 100K pages, a fifth of the session's open). Reads a piece's
    terms as the tuple it was given. Appends are kept as tuples (`added`, as cheap as a list's append:
    a piece is indexed with every turn) and put in the arrays when pickled."""

    __slots__ = ("words", "ids", "terms", "ends", "added")

    def __init__(self) -> None:
        self.words: list[str] = []                # term id → term
        self.ids: _TermIds | None = None          # term → id, made when first needed
        self.terms: array[int] = array("i")       # the term ids of the pieces before `added`, in order
        self.ends: array[int] = array("q")        # piece → where its ids end in `terms`
        self.added: list[tuple[str, ...]] = []    # the terms of each piece after those

    def append(self, words: list[str] | tuple[str, ...]) -> None:
        self.added.append(tuple(words))

    def pack(self) -> None:
        """Put the added pieces' terms in the arrays."""
        if not self.added:
            return
        ids = self.ids
        if ids is None:
            ids = self.ids = _TermIds(self.words)
        terms, ends = self.terms, self.ends
        for words in self.added:
            terms.extend(map(ids.__getitem__, words))
            ends.append(len(terms))
        self.added = []

    def __len__(self) -> int:
        return len(self.ends) + len(self.added)

    def __getitem__(self, piece: int) -> tuple[str, ...]:
        packed = len(self.ends)
        if piece < 0:
            piece += packed + len(self.added)
        if piece >= packed:
            return self.added[piece - packed]
        start = self.ends[piece - 1] if piece > 0 else 0   # IndexError below 0, as a list's
        return tuple(map(self.words.__getitem__, self.terms[start: self.ends[piece]]))

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def counts(self, start: int = 0) -> np.ndarray:
        """How many terms each piece from `start` on holds."""
        packed = len(self.ends)
        out = np.fromiter(map(len, self.added[max(0, start - packed):]), dtype=np.int64)
        if start < packed:
            ends = np.frombuffer(self.ends, dtype=np.int64)[start:]
            out = np.concatenate([np.diff(ends, prepend=self.ends[start - 1] if start > 0 else 0), out])
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (TermLists, list)):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> tuple:
        self.pack()
        return self.words, self.terms, self.ends   # the term → id map is made again when next needed

    def __setstate__(self, state: tuple) -> None:
        self.words, self.terms, self.ends = state
        self.ids, self.added = None, []


class PagePieces(Mapping):
    """Page number → the range of its pieces' ids (a page's pieces are indexed one after another), kept as
    two arrays, the page numbers in order and where each page's pieces end, where a dict of lists is an
    object per page to unpickle (a tenth of a 100K-page session's index cache)."""

    __slots__ = ("numbers", "ends")

    def __init__(self) -> None:
        self.numbers: array[int] = array("q")
        self.ends: array[int] = array("q")

    def add(self, n: int, pieces: int) -> None:
        """Page n, after every page held, with the next `pieces` piece ids."""
        assert not self.numbers or n > self.numbers[-1], "pages are indexed in order"
        self.numbers.append(n)
        self.ends.append((self.ends[-1] if self.ends else 0) + pieces)

    def _at(self, n: int) -> int:
        numbers = self.numbers
        if not numbers:
            return -1
        at = n - numbers[0]   # page numbers are dense in a session: a page's place is its offset
        if not (0 <= at < len(numbers) and numbers[at] == n):
            at = bisect_left(numbers, n)
            if at == len(numbers) or numbers[at] != n:
                return -1
        return at

    def __getitem__(self, n: int) -> range:
        try:
            at = self._at(operator.index(n))
        except TypeError:
            at = -1
        if at < 0:
            raise KeyError(n)
        return range(self.ends[at - 1] if at else 0, self.ends[at])

    def __contains__(self, n: object) -> bool:
        try:
            return self._at(operator.index(n)) >= 0   # type: ignore[arg-type]
        except TypeError:
            return False

    def __len__(self) -> int:
        return len(self.numbers)

    def __iter__(self):
        return iter(self.numbers)

    def __getstate__(self) -> tuple:
        return self.numbers, self.ends

    def __setstate__(self, state: tuple) -> None:
        self.numbers, self.ends = state


class FixedBM25:
    """Okapi BM25 over documents known all at once (a session's facts, its current summaries: rebuilt when
    one is added). Each word's term for each document holding it is computed when built, in one array
    step over all of them, so a query costs one array add per word it shares with the documents, not a
    handful (both tiers are searched on every message). The scores are those of the terms computed
    word by word, to the bit: the same operations on the same values."""

    def __init__(self, documents: list[Counter]) -> None:
        places: dict[str, int] = {}
        holders: list[list[int]] = []   # per word, the documents holding it, and how often each
        counts: list[list[int]] = []
        for i, words in enumerate(documents):
            for w, tf in words.items():
                k = places.setdefault(w, len(holders))
                if k == len(holders):
                    holders.append([])
                    counts.append([])
                holders[k].append(i)
                counts[k].append(tf)
        self.n, self.places = len(documents), places
        df = [len(h) for h in holders]
        self.bounds = [0, *itertools.accumulate(df)]   # word k's entries are [bounds[k], bounds[k + 1])
        self.documents = np.fromiter(itertools.chain.from_iterable(holders), dtype=np.int64, count=self.bounds[-1])
        tf = np.fromiter(itertools.chain.from_iterable(counts), dtype=np.float64, count=self.bounds[-1])
        lengths = np.array([sum(words.values()) for words in documents], dtype=np.float64)
        avg = (float(lengths.sum()) / self.n if self.n else 1.0) or 1.0
        idf = np.repeat(np.array([math.log(1 + (self.n - d + 0.5) / (d + 0.5)) for d in df], dtype=np.float64), df)
        self.terms = idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths[self.documents] / avg))

    def scores(self, wanted) -> np.ndarray:
        """Every document's score for the query's words."""
        out = np.zeros(self.n, dtype=np.float64)
        for w in wanted:
            k = self.places.get(w)
            if k is not None:
                a, b = self.bounds[k], self.bounds[k + 1]
                out[self.documents[a:b]] += self.terms[a:b]
        return out


class BM25:
    """Okapi BM25 over documents that arrive one at a time; scores are computed with numpy."""

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        # word → (documents, term frequencies) as typed arrays: read into numpy by a copy of their buffer,
        # where a list of ints costs ~50x more (~0.5 ms for a word of 7K pieces: a search after many pages
        # were added made ~30 such conversions). Those added in this process: a loaded index holds the
        # postings it was saved with in `_stored`, and a word's documents are its stored ones, then these
        self.postings: dict[str, tuple[array, array]] = {}
        self.lengths: array[int] = array("i")
        self.total = 0
        # (word → its place, every word's documents one after another, their frequencies, where each
        # word's begin and end): one array each in the index cache, not two per word
        self._stored: tuple[dict[str, int], np.ndarray, np.ndarray, np.ndarray] | None = None
        self._arrays: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}
        self._length_array = np.zeros(0, dtype=np.float32)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getstate__(self) -> dict:
        """Pickled (inside the index cache) without the length norms (they are for the document count of now)
        and the arrays made for searches, every word's postings in one array (`_stored`)."""
        state = {k: v for k, v in self.__dict__.items() if k not in ("_norms", "_norms_for", "_arrays", "_stored")}
        state["postings"] = {}
        state["_length_array"] = np.zeros(0, dtype=np.float32)
        state["stored"] = self._merged()
        return state

    def __setstate__(self, state: dict) -> None:
        stored = state.pop("stored", None)
        self.__dict__.update(state)
        self._arrays = {}
        self._stored = None
        if stored is not None:
            words, docs, tfs, bounds = stored
            self._stored = ({w: i for i, w in enumerate(words)}, docs, tfs, bounds)

    def _merged(self) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
        """(words, documents, frequencies, bounds): word i's postings are documents[bounds[i]:bounds[i + 1]]."""
        stored = self._stored
        if stored is not None and not self.postings:
            return list(stored[0]), stored[1], stored[2], stored[3]
        words = list(stored[0]) if stored is not None else []
        words += [w for w in self.postings if stored is None or w not in stored[0]]
        docs: list[np.ndarray] = []
        tfs: list[np.ndarray] = []
        counts = np.zeros(len(words), dtype=np.int64)
        for i, word in enumerate(words):
            if stored is not None and i < len(stored[0]):
                a, b = stored[3][i], stored[3][i + 1]
                docs.append(stored[1][a:b])
                tfs.append(stored[2][a:b])
            added = self.postings.get(word)
            if added is not None:
                docs.append(np.array(added[0], dtype=np.int32))
                tfs.append(np.array(added[1], dtype=np.float32))
            counts[i] = self.df(word)
        bounds = np.zeros(len(words) + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        return (words, np.concatenate(docs) if docs else np.zeros(0, dtype=np.int32),
                np.concatenate(tfs) if tfs else np.zeros(0, dtype=np.float32), bounds)

    def df(self, word: str) -> int:
        """How many documents hold the word."""
        added = self.postings.get(word)
        count = len(added[0]) if added is not None else 0
        stored = self._stored
        if stored is not None:
            i = stored[0].get(word)
            if i is not None:
                count += int(stored[3][i + 1] - stored[3][i])
        return count

    def add(self, words: list[str]) -> int:
        doc = len(self.lengths)
        self.lengths.append(len(words))
        self.total += len(words)
        postings = self.postings
        for word, tf in Counter(words).items():
            posting = postings.get(word)
            if posting is None:
                posting = postings[word] = (array("i"), array("f"))   # 4-byte documents: a session's pieces are < 2**31
            posting[0].append(doc)
            posting[1].append(tf)
        return doc

    def _posting(self, word: str) -> tuple[np.ndarray, np.ndarray] | None:
        cached = self._arrays.get(word)
        posting = self.postings.get(word)
        if cached is None:
            stored = self._stored
            i = stored[0].get(word) if stored is not None else None
            if i is None and posting is None:
                return None
            if i is not None:
                assert stored is not None
                a, b = stored[3][i], stored[3][i + 1]
                cached = (0, stored[1][a:b].astype(np.int64), stored[2][a:b])   # (of `postings`, docs, tfs)
            else:
                cached = (0, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))
        if posting is not None and cached[0] != len(posting[0]):
            have = cached[0]   # postings only grow: convert the new tail alone
            docs = np.array(posting[0][have:], dtype=np.int64)
            tfs = np.array(posting[1][have:], dtype=np.float32)
            cached = (len(posting[0]), np.concatenate([cached[1], docs]), np.concatenate([cached[2], tfs]))
        self._arrays[word] = cached
        return cached[1], cached[2]

    def scores(self, weighted: dict[str, float]) -> np.ndarray:
        """A score for every document (0 where no query word occurs)."""
        n = len(self.lengths)
        out = np.zeros(n, dtype=np.float32)
        if not n:
            return out
        if len(self._length_array) != n:
            have = len(self._length_array)
            self._length_array = np.concatenate([self._length_array,
                                                 np.array(self.lengths[have:], dtype=np.float32)])
        scale = self.k1 * self.b / (self.total / n)
        if getattr(self, "_norms_for", None) != (n, self.total):   # a word's length norms hold until a document comes
            self._norms, self._norms_for = {}, (n, self.total)
        for word, weight in weighted.items():
            posting = self._posting(word)
            if posting is None:
                continue
            docs, tfs = posting
            idf = weight * math.log(1 + (n - len(docs) + 0.5) / (len(docs) + 0.5))
            norm = self._norms.get(word)
            if norm is None:
                norm = self._norms[word] = tfs + self.k1 * (1 - self.b) + scale * self._length_array[docs]
            out[docs] += idf * tfs * (self.k1 + 1) / norm
        return out


def similarities(matrix: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """matrix @ vector for one query, by einsum's own loop rather than BLAS: a matrix-vector product
    is bound by memory, and BLAS's threads only add their wake-ups (measured 4-5x slower on two busy
    cores, BENCHMARKS.md, "Paging, search and ingest at scale")."""
    return np.einsum("ij,j->i", matrix, vector)


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of the k largest values (every index if k covers them all), largest first and the
    lower index first among equals; when values equal to the k-th largest are left out (a tie at the
    cut), the selection and order argpartition(-values, k - 1)[:k] makes, as before.

    argpartition walks all the values several times (~0.3 ms at 25K pieces on this machine, and a
    search made five such selections). Here the k-th largest of the maxima of small groups is a floor
    for the k-th largest value (k values are at least that), so only the values at or above it, a few
    hundred, are ranked. A group is every `blocks`-th value (values[j::blocks]): their maxima are one
    contiguous pass over the values, where the maxima of runs of neighbours were a reduction per run,
    13x slower. Any grouping gives a floor; the result does not depend on it."""
    n = len(values)
    if k >= n:
        return np.arange(n)
    size = max(4, min(64, n // (4 * k)))
    blocks = n // size
    if k < blocks:
        maxima = values[: blocks * size].reshape(size, blocks).max(axis=0)
        floor = np.partition(maxima, blocks - k)[blocks - k]
        candidates = np.flatnonzero(values >= floor)
        if len(candidates) <= 8 * k + 1024:
            ranked = values[candidates]
            order = np.lexsort((candidates, -ranked))
            if len(order) == k or ranked[order[k]] < ranked[order[k - 1]]:
                return candidates[order[:k]]
            return np.argpartition(-values, k - 1)[:k]   # a tie at the cut
    chosen = np.argpartition(-values, k - 1)[:k]
    ranked = values[chosen]
    if np.count_nonzero(values >= ranked.min()) > k:   # a tie at the cut (or no order: NaN)
        return chosen
    return chosen[np.lexsort((chosen, -ranked))]


class Vocabulary:
    """The session's own words with their embeddings, for query expansion."""

    def __init__(self, dim: int, limit: int = 50_000) -> None:
        self.words: list[str] = []
        self.index: dict[str, int] = {}
        self.dim, self.limit = dim, limit
        self._matrix = np.zeros((0, dim), dtype=np.float32)
        self._pending: list[str] = []
        self.grew = False   # embeddings were added since the index was last saved

    def __getstate__(self) -> dict:
        """Pickled (inside the index cache) without the words embedded for queries: they are this process's."""
        state = dict(self.__dict__)
        state.pop("_outside", None)
        return state

    def add(self, text: str) -> None:
        self.add_words(_WORD.findall(text.lower()))

    def add_words(self, found: list[str]) -> None:
        """Add a text's words (_WORD's matches in its lower case, in order)."""
        for word in set(found):
            if word not in self.index and word not in STOPWORDS and len(self.index) < self.limit:
                self.index[word] = len(self.words)
                self.words.append(word)
                self._pending.append(word)

    def expand(self, words: list[str], embedder, per_word: int = 3, threshold: float = 0.55) -> list[str]:
        if self._pending:
            self._matrix = np.vstack([self._matrix, embedder.embed(self._pending)])
            self._pending = []
            self.grew = True
        if not words or not len(self.words):
            return []
        # a word of the session's own is embedded already: its row is the same vector
        known = [self.index.get(w, -1) for w in words]
        # a word the session never said is embedded once per process: queries repeat their words ("say")
        outside = getattr(self, "_outside", None)
        if outside is None or outside[0] is not embedder or len(outside[1]) > 4096:
            outside = self._outside = (embedder, {})
        unknown = [w for w, row in zip(words, known) if row < 0 and w not in outside[1]]
        if unknown:
            outside[1].update(zip(unknown, embedder.embed(unknown)))
        queried = np.stack([self._matrix[row] if row >= 0 else outside[1][w] for w, row in zip(words, known)])
        sims = [similarities(self._matrix, row) for row in queried]
        out: list[str] = []
        for row in sims:
            for j in np.argpartition(-row, min(per_word, len(row) - 1))[:per_word]:
                if row[j] >= threshold:
                    out.append(self.words[j])
        return out


INDEX_FORMAT = 8  # bump when Index's attributes change: cached indexes of other formats are rebuilt


class Index:
    """The pieces of one session's pages: BM25 with context, vectors, speakers, dates."""

    WEIGHTS = {"bm25": 1.0, "vector": 0.5, "speaker": 0.2, "date": 0.5, "bookmark": 0.3, "neighbour": 0.35,
               "episode": 0.2, "recency": 0.0, "importance": 0.05,
               "update": 1.0}            # a switch, not a weight: 0 turns `supersedes` off (Config.supersede)
    RECENCY_HALF_LIFE = 50       # pages
    DEEP = 24                    # pages wanted from which a search is deep
    DEEP_WEIGHTS = {"vector": 1.0}
    FEEDBACK = (10, 20, 0.5)     # deep searches: pieces read, terms added, weight of the best added term
    EPISODE_TOP = 3              # an episode scores as the sum of its best pages
    EPISODE_POOL = 256           # pages considered for that
    SCREEN_FROM = 50_000         # pieces from which vector scores are screened by sign (pager/screen.py), not all exact
    SCREEN_NEAREST = 2048        # a screened search scores exactly the pieces nearest by sign,
    SCREEN_WORDS = 2048          # and the best by BM25 (_screened_vectors)

    def __init__(self, dim: int) -> None:
        self.format = INDEX_FORMAT
        self.dim = dim
        self.bm25 = BM25()
        self.vocabulary = Vocabulary(dim)
        # per piece, as typed arrays: the index cache unpickles one buffer each, not a Python object per piece
        self.piece_page: array[int] = array("q")        # piece → page number
        self.piece_speaker: array[int] = array("i")     # piece → speaker id (self.speaker_ids)
        self.speaker_ids: dict[str, int] = {}
        self.piece_ts: array[float] = array("d")
        self.piece_terms = TermLists()                  # each piece's own terms, for feedback
        self.piece_importance: array[float] = array("f")   # read as float32 (_arrays)
        self.piece_kind: array[int] = array("b")        # PLAIN, QUESTION or QUOTE
        self.piece_update = TermLists()                 # the terms of its sentences saying a value changed (update_terms)
        self.page_pieces = PagePieces()                 # page number → the range of its pieces
        self.speakers: set[str] = set()
        self._vectors = np.zeros((0, dim), dtype=np.float32)
        self._pending: list[np.ndarray] = []
        self._last_terms: list[str] = []
        self._cache: dict = {}
        self._last_page = 0

    def __len__(self) -> int:
        return len(self.page_pieces)

    def fits(self, pages: list[Page]) -> bool:
        """Was this index built, by this version of the code, from exactly these pages (pages are
        immutable, so count and ends suffice)?"""
        if getattr(self, "format", None) != INDEX_FORMAT:
            return False
        return len(pages) == len(self.page_pieces) and (not pages or (
            pages[0].n in self.page_pieces and self._last_page == pages[-1].n
            and len(self.page_pieces[pages[-1].n]) == len(pages[-1].spans)))

    def add(self, page: Page, piece_vectors: np.ndarray) -> None:
        """Index a sealed page; piece_vectors has one row per span of the page."""
        if page.n in self.page_pieces:
            return
        assert page.n > self._last_page, "pages are indexed in order"
        self._last_page = page.n
        ids = []
        for i in range(len(page.spans)):
            text = page.piece_text(i) if page.lines else page.text
            # one lower case and one token scan for the terms and the vocabulary
            low, ascii = text.lower(), text.isascii()
            found = _tokens(low, ascii)
            words = _terms(found, ascii)
            piece = self.bm25.add(words + self._last_terms)
            self.piece_terms.append(words)
            kind = piece_kind(text)
            if self.piece_kind and self.piece_kind[-1] == QUOTE and text.split(": ", 1)[0].endswith("(cont.)"):
                kind = QUOTE    # the rest of a long quoting reply, continued from the page before
            # the next piece is read with this one's terms (an answer with its question), unless this one
            # is a reply quoting another page: its words belong to that page, not to what follows
            self._last_terms = words if kind != QUOTE else []
            speaker = (page.piece_speaker(i) if page.lines else "").lower()
            self.piece_page.append(page.n)
            self.piece_speaker.append(self.speaker_ids.setdefault(speaker, len(self.speaker_ids)))
            self.piece_ts.append(page.ts_first)
            self.piece_importance.append(page.importance)
            self.piece_kind.append(kind)
            self.piece_update.append(update_terms(text, found) if kind == PLAIN else ())
            self.speakers.add(speaker)
            self.vocabulary.add_words(_vocabulary_words(low, found))
            ids.append(piece)
        self.page_pieces.add(page.n, len(ids))
        self._pending.append(np.asarray(piece_vectors, dtype=np.float32).reshape(len(ids), self.dim))

    def vectors(self) -> np.ndarray:
        """All piece vectors, one row each. New rows go into spare capacity (grown by half when full),
        so a session that seals a page between searches does not copy the whole matrix each time."""
        if self._pending:
            rows, have = sum(len(p) for p in self._pending), len(self._vectors)
            spare = getattr(self, "_spare", None)
            if spare is None or have + rows > len(spare):
                spare = np.empty((max(1024, (have + rows) * 3 // 2), self.dim), dtype=np.float32)
                spare[:have] = self._vectors
                self._spare = spare
            spare[have: have + rows] = np.concatenate(self._pending)
            self._vectors, self._pending = spare[: have + rows], []
        return self._vectors

    def __getstate__(self) -> dict:
        """Pickled (the index cache) without the spare capacity (the rows in use only) and what searches
        made of the per-piece arrays (`_cache`, with a dict of every page: made again at the first search)."""
        vectors = np.ascontiguousarray(self.vectors())  # first: it takes in the pending rows
        state = dict(self.__dict__)
        state.pop("_spare", None)
        state.pop("scored", None)
        state.pop("_memo", None)
        state.pop("_query", None)
        state["_cache"] = {}
        state["_vectors"] = vectors
        return state

    def search(self, query: str, embedder, directory: Directory, k: int = 8, exclude=frozenset(),
               now: float | None = None, boosts: dict[int, float] | None = None,
               weights: dict[str, float] | None = None, depth: int | None = None,
               rerank: Callable[[np.ndarray], np.ndarray] | None = None) -> list[Hit]:
        """The k best pages not in exclude, each as its best piece plus a share of its neighbours;
        weights override WEIGHTS for this search; depth: the pages the caller will use, if fewer than k;
        rerank: the pieces' scores reordered by a reranker (pager/rerank.py), before pages are chosen."""
        self.scored = None
        if not self.piece_page or not query.strip():
            return []
        signals: dict[str, np.ndarray] = {}
        query_terms = terms(query)
        weighted, signals["bm25"], named, signals["vector"] = self._matched(query, embedder)
        deep = (k if depth is None else depth) >= self.DEEP
        weights = self.weights(embedder, deep) | (weights or {})
        arrays = self._arrays()
        if named:
            # a float per speaker id, read at every piece: np.isin's sort, without the sort
            named_ids = np.zeros(len(self.speaker_ids) + 1, dtype=np.float32)
            named_ids[[self.speaker_ids[s] for s in named if s in self.speaker_ids]] = 1.0
            signals["speaker"] = named_ids[arrays["speaker"]]
        span = date_range(query, now if now is not None else time.time())
        if span:
            ts = arrays["ts"]
            signals["date"] = ((ts >= span[0]) & (ts < span[1])).astype(np.float32)
        if weights["recency"] > 0:   # half as recent every RECENCY_HALF_LIFE pages back
            signals["recency"] = np.exp2((arrays["page"] - self._last_page) / self.RECENCY_HALF_LIFE)
        if weights["importance"] > 0:
            signals["importance"] = arrays["importance"]
        parts: dict = {}
        fused = self._demote(self._fuse(signals, weights, parts), query_terms)
        if deep:
            added = self._feedback(fused, weighted)
            if added:
                signals["bm25"] = signals["bm25"] + self.bm25.scores(added)   # BM25 adds up over terms
                signals["vector"] = self._rescreened(signals["vector"], signals["bm25"])
                fused = self._demote(self._fuse(signals, weights, parts), query_terms)
        if rerank is not None:
            fused = rerank(fused)
        self.scored = fused   # every piece's score for this query: facts rank by the pieces they came from
        # (page lifted, page it is put above), in the order applied: the oldest update first, so a second
        # update rises above the first; asked what it was before, the earlier statement above its update
        lifts = sorted(self.supersedes(fused, query_terms)) if weights["update"] > 0 else []
        if lifts and ASKS_BEFORE.search(query):
            lifts = sorted(((earlier, later) for later, earlier in lifts), reverse=True)
        return self._pages(fused, signals, directory.matches(query), k, exclude, boosts or {}, weights, lifts)

    def weights(self, embedder, deep: bool) -> dict[str, float]:
        """The fusion weights for this embedder's vectors: WEIGHTS (DEEP_WEIGHTS over them in a deep search),
        with what the embedder says of its own (`weights`, `deep_weights`: a sentence encoder's vectors
        are a stronger signal than averaged word vectors)."""
        own = self.WEIGHTS | getattr(embedder, "weights", {})
        return own | self.DEEP_WEIGHTS | getattr(embedder, "deep_weights", {}) if deep else own

    def _matched(self, query: str, embedder) -> tuple[dict[str, float], np.ndarray, set[str], np.ndarray]:
        """(the weighted query terms, their BM25 scores, the speakers named, the vector scores): the costly
        part of a search, kept for the last query until a page is added. An agent's search tool often
        asks what automatic paging just asked for the same message (the offline shell always does)."""
        stamp = (query, len(self.piece_page), id(embedder))
        memo = getattr(self, "_memo", None)
        if memo is not None and memo[0] == stamp:
            return memo[1]
        weighted = {t: 1.0 for t in terms(query)}
        words = [x for x in _WORD.findall(query.lower()) if x not in STOPWORDS and x not in self.speakers]
        for extra in self.vocabulary.expand(words, embedder, threshold=getattr(embedder, "expand_threshold", 0.55)):
            weighted.setdefault(stem(extra), 0.5)
        named, qv = self._embedded(query, embedder)
        bm25 = self.bm25.scores(weighted)
        vector, screened = self._vector_scores(qv, bm25)
        found = (weighted, bm25, named, vector)
        self._memo = (stamp, found, screened)
        return found

    def query_vector(self, query: str, embedder) -> np.ndarray:
        """The query's vector as the search scores pieces with: embedded without the speakers it names."""
        return self._embedded(query, embedder)[1]

    def _embedded(self, query: str, embedder) -> tuple[set[str], np.ndarray]:
        """(the speakers the query names, its vector without them), kept for the last query until a page is
        added: names are the speaker signal's job; in an averaged embedding they pull every turn of that
        person closer. The facts and summaries are searched with the same vector (context.message_vector):
        one embedding a message, where a second cost ~0.1-0.3 ms (BENCHMARKS.md, "The memory tiers' cost")."""
        stamp = (query, len(self.piece_page), id(embedder))
        held = getattr(self, "_query", None)
        if held is None or held[0] != stamp:
            named = {s for s in self.speakers if s and re.search(rf"\b{re.escape(s)}\b", query.lower())}
            bare = re.sub("|".join(rf"\b{re.escape(s)}\b" for s in named), " ", query, flags=re.I) if named else query
            held = self._query = (stamp, named, embedder.embed([bare if bare.strip() else query])[0])
        return held[1], held[2]

    def _vector_scores(self, qv: np.ndarray, bm25: np.ndarray) -> tuple[np.ndarray, tuple | None]:
        """(every piece's vector score, clamped at 0; for a screened search (query vector, which pieces were
        scored exactly), else None). Every piece is scored exactly below SCREEN_FROM pieces: every LoCoMo conversation, every
        session of the tests. From there the screen passes on the nearest by sign and the best by BM25, and
        estimates the rest (pager/screen.py): a fifth of the cost at 236K pieces, and most of the same pages
        found (BENCHMARKS.md, "One session: 10K to 100K pages")."""
        vectors = self.vectors()
        if len(vectors) < self.SCREEN_FROM:
            return np.maximum(similarities(vectors, qv), 0.0), None
        screen = getattr(self, "screen", None)
        if screen is None or screen.dim != self.dim or len(screen) > len(vectors):
            screen = self.screen = Screen(self.dim)   # made when a session first reaches SCREEN_FROM; cached after
        screen.extend(vectors)
        scores, exact = screen.scores(vectors, qv, self.SCREEN_NEAREST, self._best_words(bm25))
        return np.maximum(scores, 0.0), (qv, exact)

    def _best_words(self, bm25: np.ndarray) -> np.ndarray:
        """The SCREEN_WORDS pieces of best BM25 score, of those matching a word of the query."""
        best = top_k(bm25, self.SCREEN_WORDS)
        return best[bm25[best] > 0]

    def _rescreened(self, vector: np.ndarray, bm25: np.ndarray) -> np.ndarray:
        """A screened search's vector scores with the best pieces by these BM25 scores (the query widened by
        feedback) scored exactly too; the vector scores as they are for an exact search."""
        memo = getattr(self, "_memo", None)
        screened = memo[2] if memo is not None else None
        if screened is None:
            return vector
        qv, exact = screened
        best = self._best_words(bm25)
        wanted = best[~exact[best]]
        if not len(wanted):
            return vector
        out = vector.copy()   # the memo's scores stay those of the query as asked
        out[wanted] = np.maximum(similarities(self.vectors()[wanted], qv), 0.0)
        return out

    @staticmethod
    def _fuse(signals: dict[str, np.ndarray], weights: dict[str, float], parts: dict | None = None) -> np.ndarray:
        """Each signal scaled to its maximum, weighted and summed in order. `parts` keeps each signal's
        share for a second fusion of the same search, where only BM25 changed (feedback)."""
        fused = np.zeros(len(next(iter(signals.values()))), dtype=np.float32)
        for name, values in signals.items():
            held = parts.get(name) if parts is not None else None
            if held is None or held[0] is not values:
                top = float(values.max())
                held = (values, weights[name] * values / top if top > 0 else None)
                if parts is not None:
                    parts[name] = held
            if held[1] is not None:
                fused += held[1]
        return fused

    def _demote(self, fused: np.ndarray, query_terms: list[str], pool: int = 64) -> np.ndarray:
        """Echoes keep ECHO of their score: every quoting reply, and those of the best pieces that
        are questions saying little beyond this query."""
        kind = self._arrays()["kind"]
        self._cache["echoed"] = set()   # for this search's explanation (see _pages)
        if self._cache["quotes"]:
            quotes = self._cache.get("quote_pieces")
            if quotes is None:   # once per growth of the index, as the other arrays are
                quotes = self._cache["quote_pieces"] = np.flatnonzero(kind == QUOTE)
            fused = fused.copy()
            fused[quotes] *= ECHO
        m = min(pool, len(fused))
        best = top_k(fused, m)
        names = self._cache.get("speaker_terms")   # _arrays() above: the cache is for these pieces, so these speakers
        if names is None:
            names = self._cache["speaker_terms"] = {t for s in self.speakers for t in terms(s)}
        for piece in best.tolist():
            if kind[piece] == QUESTION and fused[piece] > 0 and echoes(self.piece_terms[piece], query_terms, names):
                fused[piece] *= ECHO
                self._cache.setdefault("echoed", set()).add(piece)
        return fused

    def holds(self, n: int, words: set[str]) -> bool:
        """Does page n hold one of these terms in its own text (not only in the piece before it)?"""
        return any(words.intersection(self.piece_terms[p]) for p in self.page_pieces.get(n, ()))

    def supersedes(self, fused: np.ndarray, query_terms: list[str], pool: int = 64) -> list[tuple[int, int]]:
        """(page of an update, page of an earlier statement it updates) among the best pieces: the update
        says a value changed in a sentence (update_terms), both are plain statements on different pages, and
        that sentence and the earlier piece hold the same words of the query (speakers' names aside), all
        of them but at most one (`about`): the two are about what the query asks. The page of the update
        then ranks above the other (_pages)."""
        arrays = self._arrays()
        update, kind = arrays["update"], arrays["kind"]
        best = [p for p in top_k(fused, min(pool, len(fused))).tolist() if fused[p] > 0 and kind[p] == PLAIN]
        if not any(update[p] for p in best):
            return []
        names = self._cache.get("speaker_terms")
        if names is None:
            names = self._cache["speaker_terms"] = {t for s in self.speakers for t in terms(s)}
        wanted = set(query_terms) - names
        least = about(len(wanted))
        matched = {p: wanted.intersection(self.piece_terms[p]) for p in best}
        pairs = []
        for later in sorted(p for p in best if update[p]):
            said = wanted.intersection(self.piece_update[later])   # the query's words in its sentences of change
            if len(said) < least or not least:
                continue
            for earlier in best:
                if (earlier < later and self.piece_page[earlier] != self.piece_page[later]
                        and len(matched[earlier] & said) >= least):
                    pairs.append((self.piece_page[later], self.piece_page[earlier]))
        return pairs

    def over_tail(self, query: str, hits: list[Hit], tail: Hit, lines: list[str], speakers: set[str]) -> Hit:
        """The open page's hit (matched by its words: it is indexed once sealed) put just above the best of
        these hits that one of its lines updates, as `supersedes` puts a sealed update's page, with that line
        its piece; asked what it was before, just below it. `lines`: the open page's pieces, `speakers`:
        theirs. Without an update on the open page about what the query asks, the hit as it was."""
        names = {t for s in self.speakers | speakers for t in terms(s)}
        wanted = set(terms(query)) - names
        least = about(len(wanted))
        if not least:
            return tail
        rivals = [h for h in hits if h.n != tail.n]
        if not rivals:
            return tail
        for i in range(len(lines) - 1, -1, -1):   # the latest update first
            line = lines[i]
            said = wanted.intersection(update_terms(line)) if piece_kind(line) == PLAIN else set()
            if len(said) < least:
                continue
            kind = self._arrays()["kind"]
            rival = next((h for h in rivals if any(kind[p] == PLAIN and len(said.intersection(self.piece_terms[p])) >= least
                                                   for p in self.page_pieces.get(h.n, ()))), None)
            if rival is None:
                continue
            if ASKS_BEFORE.search(query):
                return tail if tail.score < rival.score else Hit(tail.n, round(rival.score - LIFT, 4), tail.signals,
                                                                 tail.piece)
            score = max(tail.score, round(rival.score + LIFT, 4))
            return Hit(tail.n, score, {**tail.signals, "update": round(score - tail.score, 4)}, piece=-1 - i)
        return tail

    def _feedback(self, fused: np.ndarray, weighted: dict[str, float]) -> dict[str, float]:
        """Terms to add to the query: frequent in its best pieces, rare in the session (RM3-style)."""
        reads, count, weight = self.FEEDBACK
        n = len(self.bm25)
        self._arrays()
        names = self._cache.get("speaker_stems")
        if names is None:
            names = self._cache["speaker_stems"] = {stem(s) for s in self.speakers}
        shares = self._cache.setdefault("term_shares", {})   # piece → its terms' tf / length, in first-seen order
        rarity = self._cache.get("rarity")                   # word → its idf, while no piece is added
        if rarity is None or rarity[0] != n:
            rarity = self._cache["rarity"] = (n, {})
        idfs = rarity[1]
        scores: Counter = Counter()
        best = top_k(fused, reads)
        for piece in best.tolist():
            value = float(fused[piece])
            if value <= 0:
                continue
            own = shares.get(piece)
            if own is None:
                words = self.piece_terms[piece]
                own = shares[piece] = [(word, tf / len(words)) for word, tf in Counter(words).items()]
            for word, share in own:
                if word in weighted or word in names:
                    continue
                idf = idfs.get(word)
                if idf is None:
                    df = self.bm25.df(word)
                    # a word of one piece only cannot lead to another
                    idf = idfs[word] = math.log(1 + (n - df + 0.5) / (df + 0.5)) if df > 1 else 0.0
                if idf:
                    scores[word] += share * value * idf
        chosen = scores.most_common(count)
        return {word: weight * value / chosen[0][1] for word, value in chosen} if chosen else {}

    def pages_of(self, pieces: np.ndarray) -> np.ndarray:
        """The page number of each of these pieces, from the cached per-piece array."""
        return self._arrays()["page"][pieces].astype(np.int64)

    def _arrays(self) -> dict[str, np.ndarray]:
        """numpy views of the per-piece and per-page lists, extended only by the pages added since
        (pages are indexed in order, so the arrays so far stay valid: a chat that seals a page every
        other turn does not rebuild ~30K-piece arrays each time)."""
        have, total = self._cache.get("pieces", 0), len(self.piece_page)
        if have == total:
            return self._cache
        old = self._cache if have else None
        # the new pages, in order, and their first pieces: a page's pieces are indexed one after another
        pages = np.array(self.piece_page[have:], dtype=np.int64)
        first = np.flatnonzero(np.diff(pages, prepend=pages[0] - 1)) if len(pages) else np.zeros(0, dtype=np.int64)
        added_numbers, added_starts = pages[first], first + have
        added = added_numbers.tolist()

        def grow(name: str, values: array, dtype) -> np.ndarray:
            tail = np.array(values[have:], dtype=dtype)
            return np.concatenate([old[name], tail]) if old is not None else tail

        position = old["position"] if old is not None else {}
        base = len(position)
        position.update((n, base + i) for i, n in enumerate(added))
        self._cache = {
            "pieces": total,
            "speaker": grow("speaker", self.piece_speaker, np.int32),
            "ts": grow("ts", self.piece_ts, np.float64),
            "importance": grow("importance", self.piece_importance, np.float32),
            "kind": grow("kind", self.piece_kind, np.int8),
            "update": np.concatenate([old["update"], self.piece_update.counts(have) > 0]) if old is not None
            else self.piece_update.counts(have) > 0,
            "quotes": (old is not None and old["quotes"]) or QUOTE in self.piece_kind[have:],
            "page": grow("page", self.piece_page, np.float32),
            "numbers": np.concatenate([old["numbers"], added_numbers]) if old is not None else added_numbers,
            "starts": np.concatenate([old["starts"], added_starts]) if old is not None else added_starts,
            "position": position,
        }
        starts = self._cache["starts"]
        days = np.floor(self._cache["ts"][starts] / 86400) if len(starts) else np.zeros(0)
        self._cache["episode"] = np.unique(days, return_inverse=True)[1].reshape(-1)
        return self._cache

    def _episodes(self, best: np.ndarray, weight: float) -> np.ndarray:
        """Each page's share of its episode's score: the sum of the episode's best few pages,
        scaled so the best episode adds `weight`."""
        episode = self._arrays()["episode"]
        if not len(best) or episode.max() == 0:
            return np.zeros_like(best)      # one episode (or none): nothing to tell apart
        # only the best pages can lift an episode: sorting a few hundred of them is enough
        m = min(len(best), self.EPISODE_POOL)
        pool = top_k(best, m)
        order = pool[np.lexsort((-best[pool], episode[pool]))]   # by episode, best page first
        first = np.searchsorted(episode[order], episode[order], side="left")
        top = order[np.arange(len(order)) - first < self.EPISODE_TOP]
        # the sum, not the mean: an episode with one good page is not a cluster
        sums = np.bincount(episode[top], weights=best[top], minlength=int(episode.max()) + 1)
        if sums.max() <= 0:
            return np.zeros_like(best)
        return (weight * sums / sums.max())[episode].astype(best.dtype)

    def _page_best(self, fused: np.ndarray, arrays: dict) -> np.ndarray:
        """Each page's best piece score: np.maximum.reduceat(fused, starts), by layers instead (the first
        piece of every page, then the second of those pages that have one, ...), as a page holds a few
        pieces: a third of reduceat's time at 25K pieces, and the same maxima."""
        starts = arrays["starts"]
        layers = arrays.get("layers")
        if layers is None:   # made once per growth of the index, as the other arrays are
            lengths = np.diff(np.append(starts, len(fused)))
            deepest = int(lengths.max()) if len(lengths) else 0
            # False: a page of very many short pieces, where reduceat is as quick
            layers = arrays["layers"] = False if deepest > 64 else \
                [(pages, starts[pages] + j) for j in range(1, deepest) for pages in [np.flatnonzero(lengths > j)]]
        if layers is False or not len(starts):
            return np.maximum.reduceat(fused, starts)
        best = fused[starts]
        for pages, pieces in layers:
            best[pages] = np.maximum(best[pages], fused[pieces])
        return best

    @staticmethod
    def _first_best(fused: np.ndarray, starts: np.ndarray, ends: np.ndarray, maxima: np.ndarray) -> list[int]:
        """Each page's first piece holding its best score (fused[start:end].argmax() per page), for all the
        pages at once: every page's pieces in a row, compared with its maximum, the first equal one kept."""
        lengths = ends - starts
        if not len(lengths):
            return []
        at = np.cumsum(lengths) - lengths                     # where each page's pieces begin in the row
        ids = np.arange(int(lengths.sum())) + np.repeat(starts - at, lengths)
        equal = np.flatnonzero(fused[ids] == np.repeat(maxima, lengths))
        page = np.repeat(np.arange(len(lengths)), lengths)[equal]
        first = equal[np.flatnonzero(np.diff(page, prepend=-1))]
        if len(first) != len(lengths):   # a page without its maximum (a NaN score): ask argmax, as before
            return [start + int(fused[start:end].argmax()) for start, end in zip(starts.tolist(), ends.tolist())]
        return ids[first].tolist()

    @staticmethod
    def _marks(bookmark_hits: tuple[np.ndarray, np.ndarray], numbers: np.ndarray) -> np.ndarray:
        """The bookmark matches (Directory.matches) summed per indexed page, in `numbers` order."""
        pages, weights = bookmark_hits
        if len(numbers) and numbers[-1] - numbers[0] == len(numbers) - 1:   # no page missing: a page's place is its offset
            at = pages - numbers[0]
            found = (at >= 0) & (at < len(numbers))
        else:
            at = np.searchsorted(numbers, pages)
            found = at < len(numbers)
            found[found] = numbers[at[found]] == pages[found]
        return np.bincount(at[found], weights=weights[found], minlength=len(numbers))

    @staticmethod
    def _top_mark(bookmark_hits: tuple[np.ndarray, np.ndarray]) -> float:
        """The best page's bookmark match, indexed or not (the open tail may hold bookmarks too)."""
        pages, weights = bookmark_hits
        if not len(pages):
            return 0.0
        if pages.min() >= 0 and pages.max() <= 4 * len(pages) + 100_000:   # page numbers are dense: no sort needed
            return float(np.bincount(pages, weights=weights).max())
        _, page = np.unique(pages, return_inverse=True)
        return float(np.bincount(page.reshape(-1), weights=weights).max())

    def _pages(self, fused, signals, bookmark_hits, k, exclude, boosts, weights, lifts=()) -> list[Hit]:
        arrays = self._arrays()
        numbers, starts = arrays["numbers"], arrays["starts"]
        best = page_max = self._page_best(fused, arrays)
        ends = np.append(starts[1:], len(fused))
        episode = self._episodes(best, weights["episode"])
        best = best + episode
        # the better neighbour's score (in float64, as np.append made it before: the scores stay the same)
        around = np.zeros(len(best), dtype=np.float64)
        around[:-1] = best[1:]
        np.maximum(around[1:], best[:-1], out=around[1:])
        score = best + weights["neighbour"] * around
        position = arrays["position"]
        marks = self._marks(bookmark_hits, numbers)   # per page, as score is
        top_mark = self._top_mark(bookmark_hits)
        if top_mark > 0:   # every page at once: a page without a match adds 0.0, which changes no score (all >= 0)
            score = (score.astype(np.float64) + weights["bookmark"] * marks / top_mark).astype(score.dtype)
        for n, value in boosts.items():
            if n in position:
                score[position[n]] += value
        lifted: dict[int, float] = {}
        for up, over in lifts:
            at, rival = position[up], score[position[over]]
            if score[at] <= rival:
                lifted[up] = lifted.get(up, 0.0) + float(rival - score[at]) + LIFT
                score[at] = rival + LIFT
        for n in exclude:
            if n in position:
                score[position[n]] = -np.inf
        k = min(k, len(numbers))
        if k <= 0:
            return []
        top_pages = top_k(score, k)
        top_pages = top_pages[np.isfinite(score[top_pages])]
        # the first best piece of each page; its explanation is made when first read (Hit.signals)
        pieces = self._first_best(fused, starts[top_pages], ends[top_pages], page_max[top_pages])
        top = numbers[top_pages].tolist()
        explain = _Explanations(signals, top, pieces, arrays, episode[top_pages], marks[top_pages], boosts, lifted)
        hits = [Hit(n, round(total, 4), None, piece, explain.maker(j))
                for j, (n, total, piece) in enumerate(zip(top, score[top_pages].tolist(), pieces))]
        hits.sort(key=lambda h: (-h.score, -h.n))
        return hits


# signals that say a hit matched the query itself: a bookmark, a speaker it names, a date in its span, the open
# tail's words (bm25 is not one: the query is widened to the session's words near its own, and a nonsense
# word has neighbours too)
MATCHED = ("bookmark", "speaker", "date", "tail")


def is_weak(hit: Hit, holds: bool, similarity: float) -> bool:
    """A hit is weak when nothing of the query is on its page (`holds`: a word of it; or a bookmark, speaker
    or date it names) and its best piece is near the query by meaning below `similarity`. A vector search
    always has a nearest page; for "xyzzy plugh" it is no answer."""
    signals = hit.signals
    if holds or any(signals.get(name, 0) > 0 for name in MATCHED):
        return False
    return signals.get("vector", 0.0) < similarity


LIFT = 1e-3   # how far an update's page is put above the page it updates: above it after rounding to 4 places


class _Explanations:
    """The per-signal explanations of one search's hits, all made at once when the first is read:
    each signal's value at the hit's best piece (rounded, those above 0), the echo mark, the page's
    episode share, bookmark match and boost. Holds the search's arrays (none is changed after it)."""

    def __init__(self, signals: dict[str, np.ndarray], numbers: list[int], pieces: list[int], arrays: dict,
                 episode: np.ndarray, marks: np.ndarray, boosts: dict[int, float],
                 lifted: dict[int, float] | None = None) -> None:
        self.signals, self.numbers, self.pieces = dict(signals), numbers, pieces
        self.episode, self.marks = episode, marks
        self.kind, self.echoed = arrays["kind"], arrays["echoed"]   # this search's echoes (a set made per _demote)
        self.boosts, self.lifted = dict(boosts), dict(lifted or {})
        self.made: list[dict[str, float]] | None = None

    def maker(self, j: int) -> Callable[[], dict[str, float]]:
        return lambda: self.all()[j]

    def all(self) -> list[dict[str, float]]:
        if self.made is not None:
            return self.made
        pieces, names = self.pieces, list(self.signals)
        values = np.stack([self.signals[name][pieces] for name in names], axis=1).tolist() if pieces else []
        kinds, echoed = self.kind[pieces].tolist(), self.echoed
        self.made = []
        for j, (shared, marked) in enumerate(zip(self.episode.tolist(), self.marks.tolist())):
            piece = pieces[j]
            parts = {name: round(v, 4) for name, v in zip(names, values[j]) if v > 0}
            if kinds[j] == QUOTE or piece in echoed:
                parts["echo"] = ECHO
            if shared > 0:
                parts["episode"] = round(shared, 4)
            if marked > 0:
                parts["bookmark"] = round(marked, 4)
            if self.numbers[j] in self.boosts:
                parts["boost"] = round(self.boosts[self.numbers[j]], 4)
            if self.numbers[j] in self.lifted:   # ranked above an earlier page it updates (Index.supersedes)
                parts["update"] = round(self.lifted[self.numbers[j]], 4)
            self.made.append(parts)
        return self.made

# -- dates in queries --------------------------------------------------------------------------------------
_MONTH = {m: i + 1 for i, m in enumerate(MONTHS[:12])} | {m[:3]: i + 1 for i, m in enumerate(MONTHS[:12])} | {"sept": 9}
_MONTH_RE = r"(january|february|march|april|may|june|july|august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)"
_DAY_MONTH_YEAR = re.compile(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH_RE}\.?,?\s+(\d{{4}})\b")
_MONTH_DAY_YEAR = re.compile(rf"\b{_MONTH_RE}\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b")
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b")
_ISO_LABEL = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})(?=t\d|\b)")   # a date label may be a timestamp: 2023-05-08T10:00:00Z
_MONTH_YEAR = re.compile(rf"\b{_MONTH_RE}\.?,?\s+(\d{{4}})\b")
_LAST_MONTH_NAME = re.compile(rf"\b(?:last|in|this past)\s+{_MONTH_RE}\b")
_YEAR = re.compile(r"\b(?:in|during|of|since)\s+((?:19|20)\d{2})\b")
_AGO = re.compile(r"\b(\d+|a|one|two|three|four|five|six)\s+(day|week|month|year)s?\s+ago\b")
_WORDS = {"a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def label_time(label: str) -> float | None:
    """Noon of the day a date label names ("5 March 2025", "March 5, 2025", "2025-03-05"), as epoch
    seconds; None if it names no day. Turns imported with a date and no timestamp get this, so
    date queries and episodes follow the conversation's calendar, not the day it was imported."""
    q = label.lower()
    if m := _ISO_LABEL.search(q):
        y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
    elif m := _DAY_MONTH_YEAR.search(q):
        y, mo, d = int(m.group(3)), _MONTH[m.group(2)], int(m.group(1))
    elif m := _MONTH_DAY_YEAR.search(q):
        y, mo, d = int(m.group(3)), _MONTH[m.group(1)], int(m.group(2))
    else:
        return None
    try:
        return datetime(y, mo, d, 12).timestamp()
    except (ValueError, OverflowError):
        return None


def date_range(query: str, now: float) -> tuple[float, float] | None:
    """The time span a query's date expression points at, as epoch seconds [start, end). The last
    answer is kept: the page search and the fact search ask for the same message on the same day."""
    global _LAST_RANGE
    today = datetime.fromtimestamp(now).replace(hour=0, minute=0, second=0, microsecond=0)
    key = (query, today, time.timezone, time.altzone)   # (the spans are read in the local time zone)
    held = _LAST_RANGE   # read once: another thread may replace it meanwhile
    if held[0] != key:
        held = _LAST_RANGE = (key, _date_range(query.lower(), today))
    return held[1]


_LAST_RANGE: tuple[tuple | None, tuple[float, float] | None] = (None, None)


def _date_range(q: str, today: datetime) -> tuple[float, float] | None:
    """date_range of a lower-cased query, today's midnight given."""

    def day(y: int, m: int, d: int, slack: int = 1):
        try:
            start = datetime(y, m, d) - timedelta(days=slack)
        except ValueError:
            return None
        return start.timestamp(), (start + timedelta(days=1 + 2 * slack)).timestamp()

    def month(y: int, m: int):
        start = datetime(y, m, 1)
        end = datetime(y + (m == 12), m % 12 + 1, 1)
        return start.timestamp(), end.timestamp()

    if m := _ISO.search(q):
        return day(int(m.group(1)), int(m.group(2)), int(m.group(3)))
    if m := _DAY_MONTH_YEAR.search(q):
        return day(int(m.group(3)), _MONTH[m.group(2)], int(m.group(1)))
    if m := _MONTH_DAY_YEAR.search(q):
        return day(int(m.group(3)), _MONTH[m.group(1)], int(m.group(2)))
    if m := _MONTH_YEAR.search(q):
        return month(int(m.group(2)), _MONTH[m.group(1)])
    if m := _LAST_MONTH_NAME.search(q):
        wanted = _MONTH[m.group(1)]
        year = today.year if wanted < today.month else today.year - 1
        return month(year, wanted)
    if m := _YEAR.search(q):
        y = int(m.group(1))
        return datetime(y, 1, 1).timestamp(), datetime(y + 1, 1, 1).timestamp()
    if "yesterday" in q:
        start = today - timedelta(days=1)
        return start.timestamp(), today.timestamp()
    if "today" in q:
        return today.timestamp(), (today + timedelta(days=1)).timestamp()
    if m := _AGO.search(q):
        n = _WORDS.get(m.group(1)) or int(m.group(1))
        unit = {"day": 1, "week": 7, "month": 30, "year": 365}[m.group(2)]
        centre = today - timedelta(days=n * unit)
        half = timedelta(days=max(1, unit // 2))
        return (centre - half).timestamp(), (centre + half + timedelta(days=1)).timestamp()
    for phrase, days in (("last week", 7), ("last month", 31), ("last year", 366)):
        if phrase in q:
            return (today - timedelta(days=2 * days)).timestamp(), today.timestamp()
    return None
