"""The query side's shortcuts (the speaker signal by lookup, the quotes demoted by their cached
positions, each piece's term shares and each word's idf kept for feedback, the neighbour scores without
concatenation) change no result: on seeded sessions of many speakers, questions, quoting replies and
bookmarks, every search (shallow and deep, with exclusions and boosts) returns the hits, scores,
explanations and per-piece scores that the implementation before them (kept below, verbatim) returns."""

from __future__ import annotations

import copy
import math
import random
import time
from collections import Counter

import numpy as np
import pytest

from pager.bookmarks import Directory
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.search import ECHO, QUESTION, QUOTE, Hit, Index, date_range, echoes, stem, terms, top_k
from pager.store import MemoryStore

NAMES = "Maya Sam Priya Jonas Petra Ines Lee Bo".split()
WORDS = ("budget review deploy launch contract garden coffee trip marathon concert doctor flight hotel "
         "museum river dinner kids dog school report dashboard metrics cache index allergy peanut").split()


class FullIndex(Index):
    """The query side as it was before the shortcuts."""

    def search(self, query: str, embedder, directory: Directory, k: int = 8, exclude=frozenset(),
               now: float | None = None, boosts: dict[int, float] | None = None,
               weights: dict[str, float] | None = None, depth: int | None = None) -> list[Hit]:
        """The k best pages not in exclude, each as its best piece plus a share of its neighbours;
        weights override WEIGHTS for this search; depth: the pages the caller will use, if fewer than k."""
        self.scored = None
        if not self.piece_page or not query.strip():
            return []
        signals: dict[str, np.ndarray] = {}
        query_terms = terms(query)
        weighted, signals["bm25"], named, signals["vector"] = self._matched(query, embedder)
        deep = (k if depth is None else depth) >= self.DEEP
        weights = self.WEIGHTS | (self.DEEP_WEIGHTS if deep else {}) | (weights or {})
        arrays = self._arrays()
        if named:
            ids = [self.speaker_ids[s] for s in named if s in self.speaker_ids]
            signals["speaker"] = np.isin(arrays["speaker"], ids).astype(np.float32)
        span = date_range(query, now if now is not None else time.time())
        if span:
            ts = arrays["ts"]
            signals["date"] = ((ts >= span[0]) & (ts < span[1])).astype(np.float32)
        if weights["recency"] > 0:   # half as recent every RECENCY_HALF_LIFE pages back
            signals["recency"] = np.exp2((arrays["page"] - self._last_page) / self.RECENCY_HALF_LIFE)
        if weights["importance"] > 0:
            signals["importance"] = arrays["importance"]
        fused = self._demote(self._fuse(signals, weights), query_terms)
        if deep:
            added = self._feedback(fused, weighted)
            if added:
                signals["bm25"] = signals["bm25"] + self.bm25.scores(added)   # BM25 adds up over terms
                fused = self._demote(self._fuse(signals, weights), query_terms)
        self.scored = fused   # every piece's score for this query: facts rank by the pieces they came from
        return self._pages(fused, signals, directory.matches(query), k, exclude, boosts or {}, weights)

    def _demote(self, fused: np.ndarray, query_terms: list[str], pool: int = 64) -> np.ndarray:
        """Echoes keep ECHO of their score: every quoting reply, and those of the best pieces that
        are questions saying little beyond this query."""
        kind = self._arrays()["kind"]
        self._cache["echoed"] = set()   # for this search's explanation (see _pages)
        if self._cache["quotes"]:
            fused = np.where(kind == QUOTE, fused * ECHO, fused).astype(fused.dtype)
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

    def _feedback(self, fused: np.ndarray, weighted: dict[str, float]) -> dict[str, float]:
        """Terms to add to the query: frequent in its best pieces, rare in the session (RM3-style)."""
        reads, count, weight = self.FEEDBACK
        n = len(self.bm25)
        self._arrays()
        names = self._cache.get("speaker_stems")
        if names is None:
            names = self._cache["speaker_stems"] = {stem(s) for s in self.speakers}
        scores: Counter = Counter()
        best = top_k(fused, reads)
        for piece in best.tolist():
            words = self.piece_terms[piece]
            if not words or fused[piece] <= 0:
                continue
            for word, tf in Counter(words).items():
                if word in weighted or word in names:
                    continue
                df = self.bm25.df(word)
                if df > 1:   # a word of one piece only cannot lead to another
                    scores[word] += tf / len(words) * float(fused[piece]) * math.log(1 + (n - df + 0.5) / (df + 0.5))
        chosen = scores.most_common(count)
        return {word: weight * value / chosen[0][1] for word, value in chosen} if chosen else {}

    def _pages(self, fused, signals, bookmark_hits, k, exclude, boosts, weights) -> list[Hit]:
        arrays = self._arrays()
        numbers, starts = arrays["numbers"], arrays["starts"]
        best = self._page_best(fused, arrays)
        ends = np.append(starts[1:], len(fused))
        episode = self._episodes(best, weights["episode"])
        best = best + episode
        around = np.maximum(np.append(best[1:], 0.0), np.insert(best[:-1], 0, 0.0))
        score = best + weights["neighbour"] * around
        position = arrays["position"]
        marks = self._marks(bookmark_hits, numbers)   # per page, as score is
        top_mark = self._top_mark(bookmark_hits)
        if top_mark > 0:
            marked = marks > 0
            score[marked] = (score[marked].astype(np.float64) + weights["bookmark"] * marks[marked] / top_mark
                             ).astype(score.dtype)
        for n, value in boosts.items():
            if n in position:
                score[position[n]] += value
        for n in exclude:
            if n in position:
                score[position[n]] = -np.inf
        k = min(k, len(numbers))
        if k <= 0:
            return []
        top_pages = top_k(score, k)
        top_pages = top_pages[np.isfinite(score[top_pages])]
        # the first best piece of each page; then every signal read at those pieces at once
        pieces = [start + int(fused[start:end].argmax()) for start, end in zip(starts[top_pages].tolist(), ends[top_pages].tolist())]
        names = list(signals)
        values = np.stack([signals[name][pieces] for name in names], axis=1).tolist() if pieces else []
        kinds, echoed = arrays["kind"][pieces].tolist(), arrays["echoed"]
        hits = []
        for j, (n, total, shared, marked) in enumerate(zip(numbers[top_pages].tolist(), score[top_pages].tolist(),
                                                           episode[top_pages].tolist(), marks[top_pages].tolist())):
            piece = pieces[j]
            parts = {name: round(v, 4) for name, v in zip(names, values[j]) if v > 0}
            if kinds[j] == QUOTE or piece in echoed:
                parts["echo"] = ECHO
            if shared > 0:
                parts["episode"] = round(shared, 4)
            if marked > 0:
                parts["bookmark"] = round(marked, 4)
            if n in boosts:
                parts["boost"] = round(boosts[n], 4)
            hits.append(Hit(n, round(total, 4), parts, piece))
        hits.sort(key=lambda h: (-h.score, -h.n))
        return hits


def seeded_session(tmp_path, seed: int):
    rng = random.Random(seed)
    cfg = Config(home=tmp_path / f"s{seed}", page_tokens=rng.choice([48, 96, 160]), embedder="hash")
    home = Home(cfg, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("exact")
    turns = []
    for i in range(rng.randint(150, 400)):
        text = " ".join(rng.choice(WORDS[: rng.randint(6, len(WORDS))]) for _ in range(rng.randint(1, 25)))
        shape = rng.random()
        if shape < 0.2:
            text += "?"
        elif shape < 0.3:
            text = f"From p{rng.randint(1, 40)}: “{text}”"      # a reply quoting a page
        elif shape < 0.35:
            text = f"on {rng.randint(1, 28)} May 2023 " + text
        turns.append({"speaker": rng.choice(NAMES[: rng.randint(1, len(NAMES))]), "text": text,
                      "ts": 1.68e9 + i * rng.choice([60, 3600, 86400])})
    s.append_many(turns)
    for _ in range(rng.randint(0, 6)):
        s.bookmark([rng.choice(list(s.pages))], rng.sample(WORDS, 2))
    return s, rng


def hits_of(index, s, query, k, exclude, boosts, depth):
    hits = index.search(query, s.home.embedder, s.directory, k, exclude, 1.69e9, boosts, None, depth)
    return [(h.n, h.score, sorted(h.signals.items()), h.piece) for h in hits], index.scored


@pytest.mark.parametrize("seed", range(12))
def test_search_matches_the_full_implementation(tmp_path, seed):
    s, rng = seeded_session(tmp_path, seed)
    s.sync()
    fast = s.index
    full = copy.deepcopy(fast)
    full.__class__ = FullIndex
    pages = sorted(fast.page_pieces)
    assert len(fast.piece_page) > 50, "a session of some size"
    for q in range(25):
        who = rng.choice(NAMES).lower() if rng.random() < 0.6 else ""
        query = " ".join([f"what did {who} say about" if who else "tell me about", *rng.sample(WORDS, rng.randint(1, 4))])
        query += rng.choice(["?", " in May 2023?", " last week", ""])
        k = rng.choice([3, 8, 24, 60])
        depth = rng.choice([None, 4, 30])
        exclude = set(rng.sample(pages, min(len(pages), rng.randint(0, 5))))
        boosts = {n: rng.random() for n in rng.sample(pages, min(len(pages), rng.randint(0, 3)))}
        got, scored = hits_of(fast, s, query, k, exclude, boosts, depth)
        want, scored_full = hits_of(full, s, query, k, exclude, boosts, depth)
        assert got == want, f"seed {seed}, query {q}: {query!r}"
        assert scored.dtype == scored_full.dtype and np.array_equal(scored, scored_full), f"seed {seed}, query {q}"
        assert fast._cache["echoed"] == full._cache["echoed"], f"seed {seed}, query {q}"


@pytest.mark.parametrize("seed", range(20))
def test_first_best_piece_is_argmaxs(seed):
    """Each page's first piece holding its best score, as argmax over the page's pieces finds it: ties
    (few distinct values), pages of one piece, and pages whose best score is NaN."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, rng.integers(1, 300))
    starts = np.cumsum(lengths) - lengths
    fused = rng.integers(0, 4, int(lengths.sum())).astype(np.float32)
    if seed % 4 == 0:
        fused[rng.integers(0, len(fused), 3)] = np.nan
    ends = starts + lengths
    maxima = np.maximum.reduceat(fused, starts)
    chosen = rng.permutation(len(starts))[: rng.integers(1, len(starts) + 1)]
    want = [s + int(fused[s:e].argmax()) for s, e in zip(starts[chosen].tolist(), ends[chosen].tolist())]
    assert Index._first_best(fused, starts[chosen], ends[chosen], maxima[chosen]) == want, f"seed {seed}"


def same_searches(a, b, s, rng, queries: int = 20) -> None:
    """Two indexes of the same pages answer every search alike: hits, scores, explanations, per-piece scores."""
    assert list(a.piece_terms) == list(b.piece_terms) and list(a.piece_update) == list(b.piece_update)
    assert dict(a.page_pieces) == dict(b.page_pieces) and a.piece_page == b.piece_page
    pages = sorted(a.page_pieces)
    for _ in range(queries):
        who = rng.choice(NAMES).lower() if rng.random() < 0.5 else ""
        query = " ".join([f"what did {who} say about" if who else "tell me about", *rng.sample(WORDS, rng.randint(1, 4))])
        query += rng.choice(["?", " in May 2023?", " before?", ""])
        k, depth = rng.choice([3, 8, 24, 60]), rng.choice([None, 4, 30])
        exclude = set(rng.sample(pages, min(len(pages), rng.randint(0, 3))))
        got, scored = hits_of(b, s, query, k, exclude, {}, depth)
        want, scored_a = hits_of(a, s, query, k, exclude, {}, depth)
        assert got == want, query
        assert scored.dtype == scored_a.dtype and np.array_equal(scored, scored_a), query


@pytest.mark.parametrize("seed", range(4))
def test_an_index_read_from_its_cache_searches_as_the_one_saved(tmp_path, seed):
    """The index cache (Index pickled: per-piece arrays, each piece's terms as ids, every word's postings
    in one array) read back answers every search as the index it was made from; so it does when both are
    given the pages sealed since, and when the grown one is saved and read again (the postings it was read
    with and those added since put in one array)."""
    import pickle

    s, rng = seeded_session(tmp_path, seed)
    s.sync()
    saved = s.index
    hits_of(saved, s, "tell me about the budget", 8, set(), {}, None)   # a search made the per-piece arrays first
    read = pickle.loads(pickle.dumps(saved, protocol=5))
    same_searches(saved, read, s, rng)
    before = len(read)
    for i in range(rng.randint(40, 120)):   # more turns, updates among them, sealed into pages of both indexes
        text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 20)))
        if rng.random() < 0.15:
            text = f"Update: the {rng.choice(WORDS)} moved to {rng.randint(1, 28)} June"
        s.append(rng.choice(NAMES), text, ts=1.7e9 + i * 3600)
    s.sync()
    vectors = saved.vectors()
    for n in saved.page_pieces:
        if n not in read.page_pieces:
            read.add(s.pages[n], vectors[saved.page_pieces[n]])
    assert len(read) == len(saved) > before
    same_searches(saved, read, s, rng)
    again = pickle.loads(pickle.dumps(read, protocol=5))
    assert again.bm25.postings == {} and again.bm25._stored is not None
    same_searches(saved, again, s, rng)


def test_the_index_cache_holds_no_object_per_piece(tmp_path):
    """An index's pickle (the index cache) grows by buffers as pieces are added, not by objects: its
    opcodes barely grow when a session of the same words holds three times the pieces, searched first
    (which makes per-page arrays and maps, not kept)."""
    import pickle
    import pickletools

    home = Home(Config(home=tmp_path, page_tokens=48, embedder="hash"), store=MemoryStore(), embedder=HashEmbedder(),
                durable=False)
    s = home.open("cache")

    def opcodes() -> tuple[int, int]:
        s.sync()
        hits_of(s.index, s, "what did maya say about the budget?", 8, set(), {}, None)
        return len(s.index.piece_page), sum(1 for _ in pickletools.genops(pickle.dumps(s.index, protocol=5)))

    for rounds in range(3):
        for i in range(100):
            s.append(NAMES[i % 4], f"{WORDS[i % 20]} and {WORDS[(3 * i) % 20]} on the {WORDS[(7 * i) % 20]}?"
                     if i % 3 else f"From p{i % 9 + 1}: “{WORDS[i % 20]}” said {WORDS[(5 * i) % 20]}")
        if rounds == 0:
            pieces, ops = opcodes()
    more_pieces, more_ops = opcodes()
    assert more_pieces > 2.5 * pieces > 200
    assert more_ops - ops < 0.05 * (more_pieces - pieces), (ops, more_ops)
