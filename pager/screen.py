"""A large session's vector screen: one sign bit per dimension of every piece vector.

An exact vector search reads every piece's float32 vector for each question: 121 MB at 236K pieces
(a 100K-page session), the largest single cost of a question there, more than a whole question
at 10K pages. The screen holds the sign of each dimension instead, 32 times fewer bytes (16 bytes a
piece at 128 dims), and counts for every piece the dimensions whose sign differs from the query's
(Hamming distance, `numpy.bitwise_count`): vectors whose signs agree point the same way.

`scores` then reads exact vectors only for the candidates: the pieces nearest by sign, and those
the caller names (search.Index names the best by BM25: a piece that matches the query's words
ranks high whatever its vector, and its vector score must be right) and a fixed sample of rows.
Every other piece gets an estimate from its distance, the mean exact score of the pieces scored
at that distance: fusion scales each signal to its best and adds them, and
a piece scored 0 where its vector is as near as most would drop below pieces it ties with.

Each row's code is its vector's alone and the sample is fixed by the row count, so the screen is a
pure function of the vectors: it grows by encoding the rows added since it was last read, and every
process that reads the same pieces finds the same scores. The candidates by sign are every row at
or below the distance at which their count is reached, ties included, so none is chosen by its
position.
"""

from __future__ import annotations

import numpy as np

SAMPLE = 1024   # rows scored exactly, every rows // SAMPLE-th, so that every distance has scores to estimate from


class Screen:
    """Sign bits of piece vectors, in 64-bit words stored word by word (each word of every row in a row)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.words = (dim + 63) // 64
        self.rows = 0
        self._codes = np.zeros((self.words, 0), dtype=np.uint64)   # spare capacity past `rows`

    def __len__(self) -> int:
        return self.rows

    def __getstate__(self) -> dict:
        """Pickled (inside the index cache) with the rows in use only."""
        state = dict(self.__dict__)
        state["_codes"] = np.ascontiguousarray(self._codes[:, : self.rows])
        return state

    def encode(self, vectors: np.ndarray) -> np.ndarray:
        """The codes of these rows: (words, rows) uint64, bit j of a row set where dimension j is > 0."""
        bits = np.packbits(np.asarray(vectors) > 0, axis=1)
        padded = np.zeros((len(bits), self.words * 8), dtype=np.uint8)
        padded[:, : bits.shape[1]] = bits
        return np.ascontiguousarray(padded.view(np.uint64).T)

    def extend(self, vectors: np.ndarray) -> None:
        """Take in the rows of `vectors` past those encoded (vectors only grow: the rows so far stay)."""
        total = len(vectors)
        if total <= self.rows:
            return
        codes = self.encode(vectors[self.rows: total])
        if total > self._codes.shape[1]:   # grown by half, as the index's vectors are
            spare = np.zeros((self.words, max(1024, total * 3 // 2)), dtype=np.uint64)
            spare[:, : self.rows] = self._codes[:, : self.rows]
            self._codes = spare
        self._codes[:, self.rows: total] = codes
        self.rows = total

    def distances(self, query: np.ndarray) -> np.ndarray:
        """Each row's count of dimensions whose sign differs from the query's."""
        code = self.encode(np.asarray(query).reshape(1, -1))[:, 0]
        dtype = np.uint8 if self.words * 64 <= 255 else np.uint16
        out = np.zeros(self.rows, dtype=dtype)
        scratch = np.empty(self.rows, dtype=np.uint64)
        for w in range(self.words):
            np.bitwise_xor(self._codes[w, : self.rows], code[w], out=scratch)
            np.add(out, np.bitwise_count(scratch), out=out, casting="unsafe")
        return out

    def cut(self, distance: np.ndarray, count: int) -> int:
        """The least distance at or below which `count` rows lie (every row's, if there are fewer)."""
        return int(np.searchsorted(np.cumsum(np.bincount(distance, minlength=self.words * 64 + 1)), count))

    def nearest(self, distance: np.ndarray, count: int) -> np.ndarray:
        """The rows (ascending) of least distance: at least `count` of them (every row if there are fewer),
        all rows at the distance where the count is reached included."""
        return np.flatnonzero(distance <= self.cut(distance, count))

    def scores(self, vectors: np.ndarray, query: np.ndarray, nearest: int,
               also: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(every row's score, which rows were scored exactly): vectors @ query for the `nearest` rows nearest
        by sign, the rows `also` names and a fixed sample, every other row the estimate for its distance.
        `vectors`: the rows this screen has encoded."""
        distance = self.distances(query)
        chosen = distance <= self.cut(distance, nearest)   # a mask, not a union of sorted sets: one pass
        chosen[:: max(1, self.rows // SAMPLE)] = True
        if also is not None:
            chosen[also] = True
        exact = np.flatnonzero(chosen)
        scored = np.einsum("ij,j->i", np.take(vectors, exact, axis=0), query)   # take: a quarter quicker than [exact]
        out = self.estimate(distance, distance[exact], scored)
        out[exact] = scored
        return out, chosen

    def estimate(self, distance: np.ndarray, known: np.ndarray, values: np.ndarray) -> np.ndarray:
        """Each row's estimated score: the mean of `values` at its distance (`known`: theirs), interpolated
        between the distances that have one."""
        bins = self.words * 64 + 1
        count = np.bincount(known, minlength=bins)
        have = np.flatnonzero(count)
        mean = np.bincount(known, weights=values, minlength=bins)[have] / count[have]
        return np.take(np.interp(np.arange(bins), have, mean).astype(np.float32), distance)
