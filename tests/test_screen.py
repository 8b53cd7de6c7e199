"""The vector screen of large sessions (pager/screen.py, search.Index.SCREEN_FROM): sign codes that count
differing signs, candidates chosen with their ties, a screened search that finds the exact top hit of
planted queries, every piece scored exactly below the threshold, and a screen that follows appended
pieces and the index cache as an index built afresh would have it."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from pager.bench.scale import _bulk_session
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.screen import Screen
from pager.search import similarities
from pager.store import MemoryStore


@pytest.mark.parametrize("dim", [128, 100, 384])
def test_distances_count_the_dimensions_whose_sign_differs(dim):
    rng = np.random.default_rng(dim)
    vectors = rng.standard_normal((500, dim)).astype(np.float32)
    vectors[:, :3] = 0.0   # zero is not > 0: the same bit as a negative value
    screen = Screen(dim)
    for part in (vectors[:7], vectors[:300], vectors):   # grown in parts, as pages are indexed
        screen.extend(part)
    query = rng.standard_normal(dim).astype(np.float32)
    want = ((vectors > 0) != (query > 0)).sum(axis=1)
    assert len(screen) == 500
    assert np.array_equal(screen.distances(query).astype(np.int64), want)
    again = pickle.loads(pickle.dumps(screen))
    assert again._codes.shape == (screen.words, 500) and np.array_equal(again.distances(query), screen.distances(query))


def test_nearest_keeps_every_row_at_the_cut_distance():
    screen = Screen(64)
    distance = np.array([5, 1, 3, 3, 3, 0, 9, 3], dtype=np.uint8)
    assert screen.nearest(distance, 2).tolist() == [1, 5]
    assert screen.nearest(distance, 3).tolist() == [1, 2, 3, 4, 5, 7]   # the four rows at distance 3 together
    assert screen.nearest(distance, 8).tolist() == list(range(8))


class Planted:
    """HashEmbedder, except for the planted queries, whose vectors are given."""

    name = "planted"

    def __init__(self, dim: int, planted: dict[str, np.ndarray]) -> None:
        self.dim, self.planted, self.words = dim, planted, HashEmbedder(dim)

    def embed(self, texts):
        return np.stack([self.planted[t] if t in self.planted else self.words.embed([t])[0] for t in texts])


def large_session(tmp_path, pages: int):
    """A session of `pages` pages with random unit piece vectors (128 dims), its index screened from 1,000
    pieces, with 64 candidates by sign and 64 by words."""
    config = Config(home=tmp_path / "home", page_tokens=128, embedder="hash")
    store, embedder = MemoryStore(dim=128), HashEmbedder(128)
    home = Home(config, store=store, embedder=embedder, durable=False)
    _bulk_session(store, home.tokenizer, config.user, config.session, pages, config.page_tokens, seed=11)
    session = home.open()
    index = session.index
    index.SCREEN_FROM, index.SCREEN_NEAREST, index.SCREEN_WORDS = 1000, 64, 64
    return home, session


def search(index, session, query, embedder, k=8, depth=None, weights=None):
    hits = index.search(query, embedder, session.directory, k, {session.tail_n}, 1.69e9, None, weights, depth)
    return [(h.n, h.score, h.piece) for h in hits]


def test_a_screened_search_finds_the_exact_top_hit_of_planted_queries(tmp_path):
    home, session = large_session(tmp_path, 1500)
    try:
        index = session.index
        vectors = index.vectors()
        assert len(vectors) > 3000, "a session several times the threshold"
        rng = np.random.default_rng(5)
        targets = rng.choice(len(vectors), 20, replace=False).tolist()
        planted = {}
        for i, piece in enumerate(targets):   # near one piece: its own vector, a little moved
            v = vectors[piece] + 0.15 * rng.standard_normal(128).astype(np.float32) / np.sqrt(128)
            planted[f"qqzx{i} about that"] = (v / np.linalg.norm(v)).astype(np.float32)
        embedder = Planted(128, planted)
        exact = copy.deepcopy(index)
        exact.SCREEN_FROM = 10**9
        for (query, v), piece in zip(planted.items(), targets):
            for depth in (None, 30):   # shallow, and deep (feedback)
                got, want = search(index, session, query, embedder, depth=depth), search(exact, session, query, embedder, depth=depth)
                assert got[0][::2] == want[0][::2], query   # the page and its piece (the neighbours' scores are estimates)
                assert got[0][0] == index.piece_page[piece] and got[0][2] == piece, query
            scored = index._memo[1][3]
            assert scored[piece] == pytest.approx(float(vectors[piece] @ v), abs=1e-6)   # scored exactly
        assert len(index.screen) == len(vectors)
        assert not hasattr(exact, "screen") or exact.screen is None or len(exact.screen) == 0
    finally:
        home.close()


def test_below_the_threshold_every_piece_is_scored_exactly(tmp_path):
    home, session = large_session(tmp_path, 600)
    try:
        index = session.index
        pieces = len(index.piece_page)
        index.SCREEN_FROM = pieces + 1
        embedder = session.home.embedder
        query = "what did Maya say about the budget and the review?"
        weighted, bm25, named, vector = index._matched(query, embedder)
        qv = embedder.embed([query.replace("Maya", " ") if "maya" in index.speakers else query])[0]
        assert np.array_equal(vector, np.maximum(similarities(index.vectors(), qv), 0.0))
        assert index._memo[2] is None and getattr(index, "screen", None) is None
        below = [search(index, session, query, embedder, k, depth) for k, depth in ((8, None), (40, 40))]
        index.SCREEN_FROM = pieces   # at the threshold the screen takes over
        index._memo = None
        screened = [search(index, session, query, embedder, k, depth) for k, depth in ((8, None), (40, 40))]
        assert index._memo[2] is not None and len(index.screen) == pieces
        index.SCREEN_FROM = 10**9
        index._memo = None
        assert [search(index, session, query, embedder, k, depth) for k, depth in ((8, None), (40, 40))] == below
        assert screened[0][0][0] == below[0][0][0]   # the best page of this query is found either way
    finally:
        home.close()


def test_the_screen_follows_appended_pieces_and_the_index_cache(tmp_path):
    """A screen kept in the cached index and grown with the pieces appended since scores as one made
    afresh from all the vectors does: the same hits and piece scores."""
    home, session = large_session(tmp_path, 500)
    try:
        index = session.index
        embedder = session.home.embedder
        queries = ["what did Sam say about the garden?", "tell me about the budget review", "coffee and the trip"]
        for q in queries:
            search(index, session, q, embedder)
        rows = len(index.screen)
        cached = pickle.loads(pickle.dumps(index))   # as Caches.save_index writes it and a later process reads it
        assert len(cached.screen) == rows == len(cached.vectors())
        session.index = cached
        session.append_many([{"speaker": "Sam", "text": f"the garden needs water on day {i}, and the budget "
                              f"review moved to Friday {i}"} for i in range(300)])
        grown = session.index
        assert grown is cached and len(grown.vectors()) > rows
        fresh = copy.deepcopy(grown)
        fresh.screen = None
        for q in queries + ["when was the budget review moved?"]:
            for k, depth in ((8, None), (40, 40)):
                assert search(grown, session, q, embedder, k, depth) == search(fresh, session, q, embedder, k, depth), q
                assert np.array_equal(grown.scored, fresh.scored), q
        assert len(grown.screen) == len(grown.vectors())
    finally:
        home.close()
