"""Keyword bookmarks: keyword(s) + short note → page ids.

Written automatically when a page is sealed (offline extraction below), by eviction when
a page has none, and by the model through the `bookmark` tool. The extraction favours what
a later question names: people and places (capitalised runs), dates, code identifiers, CJK
terms and rare long words; numbers come after every word, at most two a page (a question names
the locker, not its code), and a page with numbers and few other keywords takes its shorter words
before them (on LoCoMo, whose pages hold few numbers, recall is unchanged: 0.8627 at 2,048 tokens);
a multi-word name also answers to its head word ("Alpha module" → "alpha").
"""

from __future__ import annotations

import re
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable, Sequence

import numpy as np

STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being
    below between both but by can could did do does doing done down during each else even ever every few
    for from further get gets getting got had has have having he her here hers herself him himself his how
    i if in into is it its itself just let like lot lots made make many may me might more most much must
    my myself no nor not now of off oh ok okay on once only or other our ours ourselves out over own pretty
    quite really same see seem she should so some such sure than that thats the their theirs them themselves
    then there these they thing things think this those though through to too under until up us very was
    way we well were what when where which while who whom why will with would yeah yes yet you your yours
    yourself yourselves hey hi hello thanks thank great good nice wow cool awesome glad know going want
    something anything everything one ones still always never maybe sometimes im ive youre dont didnt
    doesnt cant wont isnt arent wasnt theyre weve youve ill id hes shes lets gonna kinda sorta
    yesterday today tomorrow last next week weeks month months year years day days time times""".split()
)

# Words that start sentences or are always capitalised without naming anything; and discourse fillers,
# which name nothing wherever they stand ("Actually, …", "it was seriously good"): long, so the rare-word
# rule took them. Only extraction reads this list (STOPWORDS would also drop them from search's terms).
NOT_NAMES = frozenset(
    "i im i'm ive i've id i'd ill i'll the a an and but so oh hey hi yes no wow thanks thank what when where "
    "why how who which that this these those it its my our your his her their we you they he she there here "
    "if then also just well yeah okay ok sure great good nice cool awesome congrats congratulations "
    "actually basically honestly literally seriously obviously apparently "
    "monday tuesday wednesday thursday friday saturday sunday".split()
)

MONTHS = (
    "january february march april may june july august september october november december "
    "jan feb mar apr jun jul aug sep sept oct nov dec"
).split()

# A run of capitalised words. It starts at its capital (which the regex engine looks for first), the
# lookbehind standing for the word boundary before it ("\b[A-Z][\w'’-]*…", tests/test_ingest_path.py).
_NAME_RUN = re.compile(r"[A-Z](?<!\w[A-Z])[\w'’-]*(?:\s+(?:of\s+|de\s+|the\s+)?(?:[A-Z][\w'’-]*|[A-Z]{2,}|\d+))*")
_IDENT = re.compile(r"`([^`\n]{2,40})`|\b([A-Za-z_][\w]*(?:[._][\w]+)+|[a-z]+[A-Z]\w*|[A-Z][a-z]+[A-Z]\w*)\b")
# a number starts at its "$" or first digit, each checked for a word or "." before it (so the engine looks for
# those first): the matches of "(?<![\w.])\$?\d[\d,.]*…" (tests/test_ingest_path.py)
_NUMBER = re.compile(r"(?:\$(?<![\w.]\$)\d|\d(?<![\w.]\d))[\d,.]*"
                     r"(?:\s?(?:%|k|m|am|pm|kg|km|mi|miles|hours?|minutes?|years?|days?))?(?![\w.])")
# A date: "9 May 2023", "May 9th, 2023", "2023-05-09". Months match by their first three letters (the
# letters after them are taken by [a-z]* either way, so the matches are those of the full names listed),
# and the lookahead skips at once the words that cannot start one: a third of the cost of extract() before.
_MONTH = r"(?:j(?:an|u[nl])|feb|ma[ry]|a(?:pr|ug)|sep|oct|nov|dec)"
_DATE = re.compile(
    r"\b(?=[\dadfjmnos])(?:\d{1,2}\s+" + _MONTH + r"[a-z]*,?\s+\d{4}\b|" + _MONTH
    + r"[a-z]*\s+\d{1,2}(?:st|nd|rd|th)?,?\s+\d{4}\b|\d{4}-\d{2}-\d{2}\b)",
    re.IGNORECASE,
)
# what every date holds: its day's last digit then the month and four digits of its year ("9 May 2023"), or
# the ordinal's letters (at most two, each a word character whatever the case) and the year ("9th, 2023"), or
# an ISO date's first five characters ("2023-0"). It starts at a digit, which the regex engine looks for
# first: a page without it (a number, a day and a month, no year) skips _DATE's scan, which stops at every word
_DATE_CORE = re.compile(r"\d(?:(?:\s+\w+|\w{0,2}),?\s+\d{4}|\d{3}-\d)")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]{2,}")
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]{6,}")
_SHORT_WORD = re.compile(r"(?<![\w'’-])[A-Za-z]{5,6}(?![\w'’-])")
_BARE_NUMBER = re.compile(r"\$?\d")
NUMBERS = 2   # the most numbers among a page's automatic keywords, after its words
# what every identifier match needs (a dotted or underscored word, or a lower-case letter before a
# capital), so a page without one skips _IDENT's slower scan; each pattern starts at the rarer
# character, which the regex engine looks for first
_IDENT_DOT = re.compile(r"[._](?<=\w[._])(?=\w)")
_IDENT_CAMEL = re.compile(r"[A-Z](?<=[a-z][A-Z])")
_DATE_MARKER = re.compile(r"^\([^()]*\)$")  # the packer's "(9 May 2023)" line where the date changes


@lru_cache(maxsize=65_536)
def normalize(keyword: str) -> str:
    """The lookup form of a keyword: lower case, single spaces, no surrounding punctuation."""
    return " ".join(re.sub(r"[^\w\s.#+/-]", " ", keyword.lower()).split()).strip(" .-/")


def is_number(keyword: str) -> bool:
    """Whether a keyword is a number ("214", "$18,400", "6am"), not a word or a date."""
    return bool(_BARE_NUMBER.match(keyword)) and _DATE.fullmatch(keyword) is None


def is_filler(keyword: str) -> bool:
    """Whether extract() took a keyword as a shorter word to fill a page with few others ("hotel"): only
    that rule yields a lower-case word of five or six letters (names keep their capital, other words
    are longer). A page's importance does not count these."""
    return 5 <= len(keyword) <= 6 and keyword.isalpha() and keyword.islower()


def extract(text: str, limit: int = 6, words_first: bool = True) -> list[str]:
    """Offline keywords of a page, best first: names, dates, identifiers, CJK, rare words, then (words_first,
    on a page with numbers) shorter words, and numbers last, at most NUMBERS of them: a bookmark is what a question names, and
    questions name things, not the numbers said about them ("what is my locker code?"); search finds
    the numbers by their text. words_first=False: numbers among the names, as traces recorded before
    this replay (their sealed pages' keywords are compared)."""
    body = "\n".join(_strip_speaker(line) for line in text.splitlines() if not _DATE_MARKER.match(line))
    scored: dict[str, float] = defaultdict(float)
    display: dict[str, str] = {}

    def add(keyword: str, weight: float) -> None:
        key = normalize(keyword)
        if len(key) < 2 or key in STOPWORDS or key in NOT_NAMES:
            return
        scored[key] += weight
        display.setdefault(key, keyword.strip())

    for match in _DATE.finditer(body) if _may_hold_date(body) else ():
        add(match.group(0), 4.0)
    for match in _NAME_RUN.finditer(body):
        phrase = _trim_name(match.group(0))
        if phrase:
            add(phrase, 3.0 + 0.5 * phrase.count(" "))
    for match in _IDENT.finditer(body) if _may_hold_identifier(body) else ():
        add(match.group(1) or match.group(2), 3.0)
    for match in _CJK.finditer(body) if not body.isascii() else ():
        run = match.group(0)
        add(run if len(run) <= 8 else run[:8], 2.5)
    numbers: set[str] = set()
    for match in _NUMBER.finditer(body):
        number = match.group(0).strip()
        if words_first:
            number = number.rstrip(",.")   # "gate 12, the hotel": the comma is the sentence's
        if sum(map(str.isdecimal, number)) >= 2 or not number.isdigit():   # two digits (\d is isdecimal)
            # words_first: the longer number first ("3141" before "12"), every number below every word
            add(number, 0.3 + 0.01 * min(sum(map(str.isdecimal, number)), 9) if words_first else 2.0)
            numbers.add(normalize(number))
    words = Counter(w.lower() for w in _WORD.findall(body))
    for word, count in words.items():
        if word in STOPWORDS:
            continue
        if word.isalpha():   # a word of ASCII letters is its own lookup form (add() without normalize)
            if word not in NOT_NAMES:
                scored[word] += 0.6 + 0.4 * min(count, 3) + 0.05 * len(word)
                display.setdefault(word, word)
        else:
            add(word, 0.6 + 0.4 * min(count, 3) + 0.05 * len(word))
    if words_first and numbers and len(scored) - len(numbers) < limit:   # the shorter words before the numbers
        for word, count in Counter(w.lower() for w in _SHORT_WORD.findall(body)).items():
            if word not in STOPWORDS and word not in NOT_NAMES:
                scored[word] += 0.4 + 0.1 * min(count, 3) + 0.05 * len(word)
                display.setdefault(word, word)
    ranked = sorted(scored, key=lambda k: (-scored[k], k))
    chosen: list[str] = []
    covered = ""   # the chosen, lower-cased, each after a NUL: no key holds one (normalize), so none spans two
    left = NUMBERS if words_first else limit
    for key in ranked:
        if key in covered:
            continue  # already covered by a longer phrase
        if key in numbers and scored[key] < 1.0:   # a number of its own, not part of a name or a date
            if not left:
                continue
            left -= 1
        chosen.append(display[key])
        covered += "\x00" + chosen[-1].lower()
        if len(chosen) == limit:
            break
    return chosen


@lru_cache(maxsize=65_536)
def aliases(keyword: str) -> frozenset[str]:
    """Cheap alternative lookup forms: the keyword itself, its head name, its parts of a compound.
    Cached: opening a session re-adds every page's keywords, and keywords repeat."""
    key = normalize(keyword)
    out = {key}
    parts = key.split()
    if len(parts) > 1:
        out.add(parts[0])
        out.add(parts[-1])
    if "_" in key or "." in key:
        out.update(p for p in re.split(r"[._]", key) if len(p) > 2)
    out |= {singular(a) for a in out}
    return frozenset(a for a in out if a and a not in STOPWORDS)


def singular(phrase: str) -> str:
    """The phrase with its last word made singular the cheap English way ("dogs" → "dog",
    "martial arts" → "martial art", "stories" → "story"), so "books" finds a "book" bookmark."""
    head, _, last = phrase.rpartition(" ")
    if len(last) > 3 and last.isalpha() and last.endswith("s") and not last.endswith(("ss", "us", "is")):
        if last.endswith("ies"):
            last = last[:-3] + "y"
        elif last.endswith(("ches", "shes", "xes", "zes", "sses")):
            last = last[:-2]
        else:
            last = last[:-1]
    return f"{head} {last}" if head else last


def _may_hold_date(body: str) -> bool:
    return _DATE_CORE.search(body) is not None


def _may_hold_identifier(body: str) -> bool:
    return "`" in body or _IDENT_DOT.search(body) is not None or _IDENT_CAMEL.search(body) is not None


def _strip_speaker(line: str) -> str:
    head, sep, rest = line.partition(": ")
    return rest if sep and len(head) <= 40 else line


@lru_cache(maxsize=65_536)
def _trim_name(phrase: str) -> str:
    words = phrase.strip("'’-").split()
    while words and words[0].lower().strip("'’") in NOT_NAMES:
        words.pop(0)
    while words and words[-1].lower() in ("of", "de", "the"):
        words.pop()
    return " ".join(words)


@dataclass
class Bookmark:
    """Keywords and a note that point at pages."""

    keywords: tuple[str, ...]
    pages: tuple[int, ...]
    note: str = ""
    source: str = "auto"   # auto (sealed or evicted), model (the bookmark tool), writer (bookmark model), user
    uid: str = ""
    ts: float = 0.0

    def to_dict(self) -> dict:
        return {"keywords": list(self.keywords), "pages": list(self.pages), "note": self.note,
                "source": self.source, "uid": self.uid, "ts": self.ts}

    @classmethod
    def from_dict(cls, d: dict) -> "Bookmark":
        return cls(tuple(d["keywords"]), tuple(int(p) for p in d["pages"]), d.get("note", ""),
                   d.get("source", "auto"), d.get("uid", ""), float(d.get("ts", 0.0)))


class PageKeywords:
    """The automatic keywords of pages p1..pk, in page order (a list of each page's); what a directory
    opens with. store.PageColumns keeps the same two reads over its Arrow column."""

    def __init__(self, keywords: Sequence[Sequence[str] | None]) -> None:
        self.rows = keywords

    def __len__(self) -> int:
        return len(self.rows)

    def of_page(self, n: int) -> Sequence[str]:
        return self.rows[n - 1] or ()

    def postings(self) -> Iterable[tuple[str, Sequence[int]]]:
        """Each keyword and the pages it is one of, in page order."""
        out: dict[str, list[int]] = {}
        for n, keywords in enumerate(self.rows, 1):
            for keyword in keywords or ():
                out.setdefault(keyword, []).append(n)
        return out.items()


class Directory:
    """A session's bookmarks, indexed by every alias of every keyword.

    A directory opens with its pages' own keywords (`opened`): the keywords of page n are read from them
    when first asked for, and the alias index is made from each distinct keyword's pages when first read,
    not page by page (a large session's are 10^5 pages of them). Bookmarks added before that wait behind
    the pages' keywords, so the index read is the one adding every page's keywords, then each bookmark,
    would make."""

    def __init__(self) -> None:
        self._by_page: dict[int, list[str]] = {}   # the pages whose keywords were read or changed
        self.notes: dict[int, list[str]] = {}
        self._index: dict[str, set[int]] = {}
        self.uids: set[str] = set()
        self._arrays: dict[str, np.ndarray] = {}
        self._own: PageKeywords | None = None      # the pages' own keywords (pages 1..len)
        self._unplaced = False                      # the alias index does not hold them yet
        self._waiting: list[tuple] = []             # (keywords, pages) added meanwhile, in order
        self._every = False                         # _by_page holds every page's keywords
        self._placing = threading.Lock()

    @classmethod
    def of(cls, marks: Iterable["Bookmark"], pages: Iterable = ()) -> "Directory":
        """The directory a session opens with: its pages' own keywords, in page order, then its stored
        bookmarks in their order (pages: p1..pk, each with its keywords)."""
        return cls.opened(marks, PageKeywords([page.keywords for page in pages]))

    @classmethod
    def opened(cls, marks: Iterable["Bookmark"], own) -> "Directory":
        """`of`, the pages' own keywords given as PageKeywords (or store.PageColumns)."""
        directory = cls()
        directory._own, directory._unplaced = own, True
        for mark in marks:
            directory.add(mark.keywords, mark.pages, mark.note, mark.uid, first=mark.source != "auto")
        return directory

    @property
    def by_page(self) -> dict[int, list[str]]:
        """page → its keywords, every page (reads every page's own keywords)."""
        if not self._every:
            self._every = True
            made = self._by_page
            every = {n: made[n] if n in made else self._read(n) for n in range(1, len(self._own or ()) + 1)}
            self._by_page = {**every, **made}
        return self._by_page

    @property
    def index(self) -> dict[str, set[int]]:
        if self._unplaced:
            with self._placing:   # a reader thread and the writer may both be first
                if self._unplaced:
                    self._place()
        return self._index

    def _read(self, n: int) -> list[str]:
        own = self._own
        return list(dict.fromkeys(own.of_page(n))) if own is not None and 1 <= n <= len(own) else []

    def _keywords_of(self, n: int) -> list[str]:
        """Page n's keywords, held to be changed."""
        have = self._by_page.get(n)
        if have is None:
            have = self._by_page[n] = self._read(n)
        return have

    def _place(self) -> None:
        """Every page's own keywords into the alias index, each alias's pages inserted in page order as
        page-by-page adds insert them, then what was added meanwhile."""
        parts: dict[str, list] = {}
        for keyword, pages in self._own.postings() if self._own is not None else ():
            for alias in aliases(keyword):
                parts.setdefault(alias, []).append(pages)
        index = self._index
        for alias, held in parts.items():
            ordered = np.asarray(held[0]) if len(held) == 1 else np.sort(np.concatenate(held))   # in page order
            once = np.ones(len(ordered), dtype=bool)
            once[1:] = ordered[1:] != ordered[:-1]   # a page holding the keyword twice, or two of the alias's
            index[alias] = set(ordered[once].tolist())
        for keywords, numbers in self._waiting:
            self._index_add(keywords, numbers)
        self._waiting, self._unplaced = [], False

    def add(self, keywords: tuple[str, ...] | list[str], pages: tuple[int, ...] | list[int], note: str = "",
            uid: str = "", first: bool = False) -> None:
        """Point keywords at pages; `first` puts them ahead of a page's automatic keywords."""
        if uid:
            if uid in self.uids:
                return
            self.uids.add(uid)
        for n in pages:
            have = self._keywords_of(n)
            if first:
                self._by_page[n] = list(dict.fromkeys([*keywords, *have]))
            else:
                have.extend(k for k in keywords if k not in have)
            if note:
                self.notes.setdefault(n, []).append(note)
        if self._unplaced:
            with self._placing:
                if self._unplaced:
                    self._waiting.append((keywords, pages))
                    return
        self._index_add(keywords, pages)

    def _index_add(self, keywords, pages) -> None:
        index = self._index
        for keyword in keywords:
            for alias in aliases(keyword):
                index.setdefault(alias, set()).update(pages)

    def lookup(self, keyword: str) -> set[int]:
        key = normalize(keyword)
        found = set(self.index.get(key, ()))
        if not found:
            for alias in aliases(key):
                found |= self.index.get(alias, set())
        return found

    def keywords(self, n: int) -> list[str]:
        have = self._by_page.get(n)
        return have if have is not None else self._read(n)

    def matches(self, query: str, longest: int = 4) -> tuple[np.ndarray, np.ndarray]:
        """Pages whose keywords occur in the query, weighted by how specific the keyword is: (pages,
        weights), a page once per keyword it matched (their weights add up).

        The query's word n-grams are looked up, so the cost follows the query, not the directory;
        each keyword's pages are kept as an array, so a common one costs no loop over its pages."""
        words = normalize(query).split()
        grams = {" ".join(words[i : i + n]) for n in range(1, longest + 1) for i in range(len(words) - n + 1)}
        grams |= {singular(g) for g in grams}
        pages, weights = [], []
        for alias in sorted(grams):
            found = self.index.get(alias)
            if not found or len(alias) < 3:
                continue
            cached = self._arrays.get(alias)
            if cached is None or len(cached) != len(found):   # a keyword's pages only ever grow
                cached = self._arrays[alias] = np.fromiter(found, dtype=np.int64, count=len(found))
            pages.append(cached)
            weights.append(np.full(len(cached), (1.0 + alias.count(" ")) / max(1.0, len(found) ** 0.5)))
        if not pages:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        return np.concatenate(pages), np.concatenate(weights)
