"""Hybrid search over one session's pages: bookmarks, BM25 and vectors, fused.

The index lives in memory, one per open session, and grows a page at a time as pages are
sealed (rank-bm25 cannot add documents, so BM25 is a small incremental inverted index
here). LanceDB holds the same text and vectors on disk; the index is rebuilt from it when a
session opens. Every hit carries its per-signal scores so a ranking can be explained.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .bookmarks import STOPWORDS, Directory

_TOKEN = re.compile(r"[a-z0-9]+(?:['’][a-z]+)?|[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def terms(text: str) -> list[str]:
    """BM25 terms: lower-cased words without stopwords, light plural folding, CJK bigrams."""
    raw = _TOKEN.findall(text.lower())
    out: list[str] = []
    cjk_run: list[str] = []
    for tok in raw + [""]:
        if len(tok) == 1 and ord(tok) > 0x3000:
            cjk_run.append(tok)
            continue
        if cjk_run:
            out.extend(cjk_run if len(cjk_run) == 1 else [a + b for a, b in zip(cjk_run, cjk_run[1:])])
            cjk_run = []
        if not tok:
            continue
        tok = tok.replace("’", "'")
        if tok.endswith("'s"):
            tok = tok[:-2]
        if tok in STOPWORDS or len(tok) < 2 and not tok.isdigit():
            continue
        out.append(_stem(tok))
    return out


def _stem(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@dataclass
class Hit:
    """One ranked page and why."""

    n: int
    score: float
    signals: dict[str, float] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"p{self.n}"


class BM25:
    """Okapi BM25 over an index that takes new documents without a rebuild."""

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.postings: dict[str, dict[int, int]] = {}
        self.lengths: dict[int, int] = {}
        self.total = 0

    def add(self, doc: int, words: list[str]) -> None:
        if doc in self.lengths:
            return
        self.lengths[doc] = len(words)
        self.total += len(words)
        for word, tf in Counter(words).items():
            self.postings.setdefault(word, {})[doc] = tf

    def scores(self, query: list[str]) -> dict[int, float]:
        n = len(self.lengths)
        if not n:
            return {}
        avg = self.total / n
        out: dict[int, float] = {}
        for word in set(query):
            posting = self.postings.get(word)
            if not posting:
                continue
            idf = math.log(1 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            for doc, tf in posting.items():
                norm = tf + self.k1 * (1 - self.b + self.b * self.lengths[doc] / avg)
                out[doc] = out.get(doc, 0.0) + idf * tf * (self.k1 + 1) / norm
        return out


class Index:
    """Pages of one session: BM25 terms, vectors and bookmarks, searched together."""

    WEIGHTS = {"bookmark": 0.25, "bm25": 0.45, "vector": 0.30}

    def __init__(self, dim: int) -> None:
        self.bm25 = BM25()
        self.dim = dim
        self.numbers: list[int] = []
        self._rows: dict[int, int] = {}
        self._vectors = np.zeros((0, dim), dtype=np.float32)
        self._pending: list[np.ndarray] = []

    def __len__(self) -> int:
        return len(self.numbers)

    def add(self, n: int, text: str, vector: np.ndarray) -> None:
        if n in self._rows:
            return
        self._rows[n] = len(self.numbers)
        self.numbers.append(n)
        self.bm25.add(n, terms(text))
        self._pending.append(np.asarray(vector, dtype=np.float32).reshape(1, self.dim))

    def vectors(self) -> np.ndarray:
        if self._pending:
            self._vectors = np.vstack([self._vectors, *self._pending])
            self._pending = []
        return self._vectors

    def vector_of(self, n: int) -> np.ndarray:
        return self.vectors()[self._rows[n]]

    def search(
        self,
        query: str,
        query_vector: np.ndarray | None,
        directory: Directory,
        k: int = 8,
        exclude: set[int] | frozenset[int] = frozenset(),
        boosts: dict[int, float] | None = None,
    ) -> list[Hit]:
        """The k best pages not in exclude, by weighted, max-normalised signals."""
        signals: dict[str, dict[int, float]] = {
            "bookmark": directory.matches(query),
            "bm25": self.bm25.scores(terms(query)),
        }
        if query_vector is not None and len(self.numbers):
            sims = self.vectors() @ np.asarray(query_vector, dtype=np.float32)
            signals["vector"] = {n: float(s) for n, s in zip(self.numbers, sims) if s > 0}
        fused: dict[int, Hit] = {}
        for name, values in signals.items():
            values = {n: v for n, v in values.items() if n not in exclude and n in self._rows}
            top = max(values.values(), default=0.0)
            if top <= 0:
                continue
            for n, value in values.items():
                hit = fused.setdefault(n, Hit(n, 0.0))
                hit.signals[name] = round(value, 4)
                hit.score += self.WEIGHTS[name] * value / top
        for n, extra in (boosts or {}).items():
            if n in fused:
                fused[n].signals["boost"] = round(extra, 4)
                fused[n].score += extra
        ranked = sorted(fused.values(), key=lambda h: (-h.score, -h.n))
        for hit in ranked:
            hit.score = round(hit.score, 4)
        return ranked[:k]
