"""Finding pages for a query, and automatic paging: the pages a message needs, faulted in before
the model sees it.

`search` ranks the session's indexed pages (search.Index fuses the vector, keyword and bookmark
signals) and matches the open tail page, which is not indexed until it seals, by its words.
`autopage` faults the best hits above a threshold, then their neighbours (read-ahead), within a
share of the frames, in one eviction for the whole batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from .rerank import rerank_pieces
from .search import QUESTION, QUOTE, Hit, echoes, is_weak, piece_kind, terms

if TYPE_CHECKING:
    from .session import Session


class Retrieval:
    def __init__(self, session: "Session") -> None:
        self.session = session

    def search(self, query: str, k: int = 8, exclude: Iterable[int] = (), boosts: dict[int, float] | None = None,
               record: bool = True, tail: bool = True, depth: int | None = None) -> list[Hit]:
        """Ranked pages for the query; the open tail page (not indexed until sealed) is matched by its words.
        depth: how many of the k hits will be paged in, when fewer (a search is deep or not by that)."""
        s = self.session
        s.sync()
        cfg = s.home.config
        weights = ({"recency": cfg.recency_weight} if cfg.recency_weight else {}) | ({} if cfg.supersede else {"update": 0.0})
        rerank = (lambda fused: rerank_pieces(s, query, fused)) if s.home.reranker is not None else None
        hits = s.index.search(query, s.home.embedder, s.directory, k, set(exclude) | {s.tail_n},
                              s.clock(), boosts, weights or None, depth, rerank)
        if tail and (hit := self._tail_hit(query)):
            if cfg.supersede_tail:   # an update on the open page ranks above what it updates, as a sealed one does
                hit = s.index.over_tail(query, hits, hit, [p.line for p in s.packer.pieces],
                                        {p.turn.speaker.lower() for p in s.packer.pieces})
            hits = sorted(hits + [hit], key=lambda h: (-h.score, -h.n))[:k]
        if record:   # the hits' explanations are made only for a listener (automatic paging reads scores alone)
            s.events.emit_with("search", lambda: {"query": query, "results": [
                {"page": h.id, "score": h.score, **h.signals} for h in hits]})
        return hits

    def weak(self, query: str, hits: list[Hit]) -> list[bool]:
        """Which hits are weak (search.is_weak): no word of the query on the page, and near it by meaning only
        below `weak_similarity` (0: none is). The search CLI, the REST search and the search tool say so."""
        s = self.session
        floor = s.home.config.weak_similarity
        if floor <= 0:
            return [False] * len(hits)
        wanted = set(terms(query))
        return [is_weak(h, h.n != s.tail_n and s.index.holds(h.n, wanted), floor) for h in hits]

    def _tail_hit(self, query: str) -> Hit | None:
        s = self.session
        query_terms = terms(query)
        wanted = set(query_terms)
        names = {t for speaker in s.index.speakers | {piece.turn.speaker.lower() for piece in s.packer.pieces}
                 for t in terms(speaker)}
        best, where = 0, -1
        for i, piece in enumerate(s.packer.pieces):
            have = terms(piece.line)
            kind = piece_kind(piece.line)
            if kind == QUOTE or (kind == QUESTION and echoes(have, query_terms, names)):
                continue   # an echo of the query is not what it asks for
            overlap = len(wanted & set(have))
            if overlap > best:
                best, where = overlap, i
        if not best:
            return None
        return Hit(s.tail_n, round(best / len(wanted), 4), {"tail": best}, piece=-1 - where)

    def autopage_room(self, frames: int | None = None, share: float | None = None) -> int:
        """How many pages automatic paging may fault into `frames` frames (the current count if None)."""
        s = self.session
        frames = s.frames.count if frames is None else frames
        share = s.home.config.autopage_share if share is None else share
        return min(int(frames * share), frames - 1 - s.paging.pinned_count())

    def paging_plan(self, hits: list[Hit], room: int) -> list[int]:
        """The pages automatic paging faults for these hits (best first, each above the threshold),
        then their neighbours (read-ahead) while they fit the room."""
        s = self.session
        chosen = [h.n for h in hits[:room]]
        taken = set(chosen)
        readahead = s.home.config.readahead
        for hit in hits[:room]:
            for d in range(1, readahead + 1):
                for n in (hit.n - d, hit.n + d):
                    if len(chosen) < room and n in s.pages and n not in taken:
                        chosen.append(n)
                        taken.add(n)
        return chosen

    def autopage(self, query: str, share: float | None = None, min_score: float | None = None,
                 hits: list[Hit] | None = None) -> list[Hit]:
        """Fault in the pages the query needs, with read-ahead, within a share of the frames. `hits`:
        this query's search, already made (with at least the room's number of hits), to page from."""
        s = self.session
        min_score = s.home.config.autopage_min_score if min_score is None else min_score
        room = self.autopage_room(share=share)
        if room <= 0 or not query.strip():
            return []
        if hits is None:
            hits = s.search(query, k=room, tail=False)
        hits = [h for h in hits[:room] if h.score >= min_score]
        chosen = self.paging_plan(hits, room)
        for hit in hits:
            s.table[hit.n].relevance = hit.score
        missing = sum(1 for n in chosen if not s.table[n].resident)
        s.paging.make_room(chosen, missing)   # one eviction for the whole batch: the policy sees every candidate once
        for i, n in enumerate(chosen):
            s.fault(n, "auto" if i < len(hits) else "readahead", protect=chosen)
        return hits
