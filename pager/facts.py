"""Facts: short statements a memory model (or its recorded output) made of the conversation.

Each fact names the turns it came from (and so its pages), a subject key and when it became
true. A newer fact on the same subject supersedes the older one, which stays, marked with its
dates: supersession is derived from the facts in order, never stored as an edit, so every
process holding the same facts agrees on it and nothing is deleted. A fact that stops being
true with nothing in its place is ended the same way: by an *end* record on its subject (a fact
with `ends` set, saying when and why), after which the subject has no current value.

Facts reach the prompt in slabs: a slab is one frame of `page_tokens` holding as many facts as
fit (a 25-token fact costs 25 tokens, not a frame), so the frame arithmetic of context assembly
stays exact. Facts are searched with their own small BM25 and the session's embedder.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .search import FixedBM25, Index, similarities, terms

BEFORE = re.compile(r"\b(before|previous(?:ly)?|earlier|used to|formerly|old|originally|changed?)\b", re.I)
SUPERSEDED_WEIGHT = 0.6   # an old value ranks below the current one, unless the question asks what it was


@dataclass(frozen=True)
class Draft:
    """What a producer says: a statement, its subject, the turns it came from; ts: when it became true."""

    subject: str
    text: str
    turns: tuple[int, ...]
    ts: float | None = None
    op: str = "add"      # "add", "update" (supersedes fact number `target`), "invalidate" (ends it)
    target: int = 0      # the fact an update or invalidate is about


@dataclass(frozen=True, slots=True)
class Fact:
    """A fact as held in memory. Its fields are slots, in the object itself: the slabs read a few
    hundred facts' turns and pages per message, one object each, not an object and its dict."""

    n: int
    subject: str
    text: str
    turns: tuple[int, ...]
    pages: tuple[int, ...]
    ts: float          # valid from
    date: str
    source: str        # "recorded", "model", "script"
    ends: bool = False  # an end record: the fact before it on its subject stopped being true, none replaces it
    # its turns as a set, made once: the slabs ask question after question whether they were all told
    turn_set: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "turn_set", frozenset(self.turns))

    @property
    def id(self) -> str:
        return f"f{self.n}"


def fact_record(f: Fact) -> dict:
    """A fact as the journal and the store keep it."""
    return {"n": f.n, "subject": f.subject, "text": f.text, "turns": list(f.turns), "pages": list(f.pages),
            "ts": f.ts, "date": f.date, "source": f.source, "ends": f.ends}


def subject_key(subject: str) -> str:
    return " ".join(str(subject).lower().split())


class Facts:
    """Every fact of a session, in the order they were made, with what supersedes what."""

    def __init__(self) -> None:
        self.items: list[Fact] = []
        self._subjects: dict[str, list[Fact]] = {}
        self._terms: list[Counter] = []
        self._vectors: list[np.ndarray] = []
        self._cache: dict = {}
        self._lines: dict[int, str] = {}   # fact number -> its line, while no fact is added

    def __len__(self) -> int:
        return len(self.items)

    def add(self, fact: Fact, vector: np.ndarray | None = None) -> Fact | None:
        """Keep a fact; returns the fact it supersedes, if any (the newest earlier one on its subject)."""
        self.items.append(fact)
        self._lines.clear()   # a new fact may supersede or end one: its line changes
        same = self._subjects.setdefault(subject_key(fact.subject), [])
        same.append(fact)
        same.sort(key=lambda f: (f.ts, f.n))
        words = Counter(terms(fact.text))
        self._terms.append(words)
        self._vectors.append(vector if vector is not None else np.zeros(0, dtype=np.float32))
        i = same.index(fact)
        return same[i - 1] if i > 0 else None

    def superseded_by(self, fact: Fact) -> Fact | None:
        """The record after this fact on its subject: a new value, or an end record; None while current."""
        same = self._subjects[subject_key(fact.subject)]
        i = same.index(fact)
        return same[i + 1] if i + 1 < len(same) else None

    def current(self, subject: str) -> Fact | None:
        """The subject's value now: its newest fact, or None if it was never set or has ended."""
        same = self._subjects.get(subject_key(subject))
        return same[-1] if same and not same[-1].ends else None

    def get(self, n: int) -> Fact | None:
        return self.items[n - 1] if 0 < n <= len(self.items) and self.items[n - 1].n == n else None

    def similar(self, text: str, vector: np.ndarray | None = None, k: int = 8) -> list[Fact]:
        """The current facts nearest to a text, best first: what a memory model decides an update against."""
        out = []
        for fact, _ in self.search(text, vector, k=len(self.items)):
            if not fact.ends and self.superseded_by(fact) is None:
                out.append(fact)
                if len(out) == k:
                    break
        return out

    def history(self, subject: str) -> list[Fact]:
        return list(self._subjects.get(subject_key(subject), []))

    def search(self, query: str, query_vector: np.ndarray | None = None, k: int = 50,
               span: tuple[float, float] | None = None, vector_weight: float = 0.5) -> list[tuple[Fact, float]]:
        """Facts for the query, best first: BM25 over the statements, plus vector similarity, plus, for
        the facts dated inside `span` (the dates the query names, search.date_range), the page search's
        date signal at its weight; superseded facts are kept but rank below the current ones unless the
        query asks for the past."""
        order, scores = self.scored(query, query_vector, k, span, vector_weight)
        return [(self.items[i], score) for i, score in zip(order.tolist(), scores)]

    def scored(self, query: str, query_vector: np.ndarray | None = None, k: int = 50,
               span: tuple[float, float] | None = None, vector_weight: float = 0.5) -> tuple[np.ndarray, list[float]]:
        """search's answer as (the facts' places in items, their scores rounded as search gives them)."""
        if not self.items:
            return np.zeros(0, dtype=np.int64), []
        arrays = self._arrays()
        scores = arrays["bm25"].scores(query_terms(query))
        top = scores.max()
        if top > 0:
            scores /= top
        if query_vector is not None and self._vectors[0].size:
            scores += vector_weight * positive(similarities(arrays["vectors"], query_vector))
        if span is not None:
            scores += Index.WEIGHTS["date"] * ((arrays["ts"] >= span[0]) & (arrays["ts"] < span[1]))
        if not BEFORE.search(query):
            scores[arrays["superseded"]] *= SUPERSEDED_WEIGHT
        order = best_first(scores, k)
        order = order[scores[order] > 0]
        return order, [round(score, 4) for score in scores[order].tolist()]

    def _arrays(self) -> dict:
        """BM25 over the statements, the vectors as one matrix and which facts are superseded, rebuilt
        only when facts were added: a search then costs no loop over the facts."""
        if self._cache.get("facts") != len(self.items):
            position = {id(f): i for i, f in enumerate(self.items)}
            superseded = np.zeros(len(self.items), dtype=bool)
            for same in self._subjects.values():   # every record but the newest on its subject has a successor
                superseded[[position[id(f)] for f in same[:-1]]] = True
            superseded = np.flatnonzero(superseded)   # their places: an index, read faster than a mask
            self._cache = {
                "facts": len(self.items),
                "bm25": FixedBM25(self._terms),
                "vectors": np.stack(self._vectors) if self._vectors and self._vectors[0].size else None,
                "superseded": superseded,
                "ts": np.array([f.ts for f in self.items], dtype=np.float64),
            }
        return self._cache

    def line(self, fact: Fact) -> str:
        """`- f12 (8 May 2023, p4): text`, or with its end and successor when superseded."""
        held = self._lines.get(fact.n)
        if held is None or self.get(fact.n) is not fact:
            held = self._lines[fact.n] = self._line(fact)
        return held

    def _line(self, fact: Fact) -> str:
        later = self.superseded_by(fact)
        when = fact.date + (f" → {later.date}, {'ended' if later.ends else 'superseded'} by {later.id}" if later else "")
        pages = ",".join(f"p{p}" for p in fact.pages[:2])
        text = fact.text
        if fact.ends:
            same = self._subjects[subject_key(fact.subject)]
            before = same[same.index(fact) - 1] if same.index(fact) > 0 else None
            text = f"no longer true{' (' + before.id + ')' if before else ''}: {text}"
        return f"- {fact.id} ({when}{', ' + pages if pages else ''}): {text}"

    def to_json(self) -> list[dict]:
        out = []
        for f in self.items:
            later = self.superseded_by(f)
            out.append({"id": f.id, "subject": f.subject, "text": f.text, "turns": list(f.turns),
                        "pages": [f"p{p}" for p in f.pages], "valid_from": f.ts, "date": f.date,
                        "valid_to": later.ts if later else None,
                        "superseded_by": later.id if later and not later.ends else None,
                        **({"ended_by": later.id} if later and later.ends else {}),
                        **({"ends": True} if f.ends else {}), "source": f.source})
        return out


class Recorded:
    """A memory model's recorded output: facts with the refs of their source turns (LoCoMo's dia_ids),
    each returned once, when a page holding one of its turns is asked about."""

    source = "recorded"

    def __init__(self, facts: list[tuple[str, str, list[str]]], numbers: dict[str, int]) -> None:
        self.facts = facts        # (subject, text, source refs)
        self.numbers = numbers    # ref → turn number in the session
        self.given: set[int] = set()

    def __call__(self, session, pages: list[int]) -> list[Draft]:
        held = held_turns(session, pages)
        out = []
        for i, (subject, text, refs) in enumerate(self.facts):
            turns = tuple(self.numbers[r] for r in refs if r in self.numbers)
            if i not in self.given and held.intersection(turns):
                self.given.add(i)
                out.append(Draft(subject, text, turns))
        return out


def query_terms(query: str) -> frozenset[str]:
    """The BM25 terms of a query, as a set, kept for the last query: the facts and the summaries are
    searched for the same message."""
    global _QUERY_TERMS
    held = _QUERY_TERMS   # read once: another thread may replace it meanwhile
    if held[0] != query:
        held = _QUERY_TERMS = (query, frozenset(terms(query)))
    return held[1]


_QUERY_TERMS: tuple[str | None, frozenset[str]] = (None, frozenset())


SORTED_WHOLE = 1024   # up to this many scores, one sort costs less than the partition and its steps


def positive(values: np.ndarray) -> np.ndarray:
    """The values with those below 0 made 0, in place (np.clip(values, 0, None), without its wrapper)."""
    return np.maximum(values, 0, out=values)


def best_first(scores: np.ndarray, k: int) -> np.ndarray:
    """`np.argsort(-scores, kind="stable")[:k]` (best first, ties in index order) without sorting
    every score: the k-th best is found by a partition, and only the scores above it and the first
    of those equal to it are sorted."""
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    if k >= len(scores) or len(scores) <= SORTED_WHOLE:
        return np.argsort(-scores, kind="stable")[:k]
    negative = -scores
    kth = np.partition(negative, k - 1)[k - 1]
    better = np.flatnonzero(negative < kth)
    chosen = np.concatenate([better, np.flatnonzero(negative == kth)[: k - len(better)]])
    return chosen[np.argsort(negative[chosen], kind="stable")]


def held_turns(session, pages: list[int]) -> set[int]:
    """The turns the given pages hold (the open tail's pieces for the tail page): what a producer
    may write about when these pages are sealed."""
    held: set[int] = set()
    for n in pages:
        if n == session.tail_n:
            held |= {p.turn.turn for p in session.packer.pieces}
        elif n in session.pages:
            held |= {t for t, _, _ in session.pages[n].spans}
    return held
