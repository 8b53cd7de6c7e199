"""Summaries: the shape of a long conversation in a few lines.

Two kinds, each naming the pages (and turns) it covers:

- an **episode** summary: one per episode of the conversation (a day or a session of it, or a
  stretch between two topic shifts), keyed by the episode ("session 3", "e12");
- the **rolling** summary of the whole session: the previous version plus what is new makes the
  next version, which covers p1 up to the newest page summarized.

Every version is kept: a summary with the key of an earlier one is that key's next version, and
the earlier one stays on disk (a durable journal op "summary", then the store's `summaries`
table), so every process holding the same summaries agrees on which version is current.

Producers are callables `(session, pages) -> [Draft]`, as for facts: `Recorded` (a memory
model's recorded output, e.g. LoCoMo's `session_summary`) and `Extractive` (no model: the most
central sentences of an episode, verbatim; no invented text). Summaries reach the prompt in a
region of whole frames (`summary_share` of them), so the frame arithmetic stays exact; the
current rolling summary also goes into the memory map when the map has room for it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from .facts import best_first, held_turns, positive, query_terms
from .search import QUOTE, FixedBM25, piece_kind, similarities, terms

ROLLING = "rolling"
EPISODE = "episode"
KINDS = (ROLLING, EPISODE)


@dataclass(frozen=True)
class Draft:
    """What a producer says: a summary of the turns first..last (inclusive), under a key; the same
    key again makes a new version; ts: when its last turn was said, if the producer knows."""

    kind: str
    key: str
    text: str
    turns: tuple[int, int]
    ts: float | None = None


@dataclass(frozen=True)
class Summary:
    n: int                    # 1, 2, … per session, in the order they were made
    kind: str                 # "rolling" or "episode"
    key: str                  # "rolling", or the episode's key
    version: int              # 1, 2, … per key
    text: str
    pages: tuple[int, int]    # first and last page covered
    turns: tuple[int, int]    # first and last turn covered
    ts: float                 # when the last turn covered was said
    date: str
    source: str               # "recorded", "extractive", "model", "script"

    @property
    def id(self) -> str:
        return f"s{self.n}"

    @property
    def span(self) -> str:
        first, last = self.pages
        return f"p{first}" if first == last else f"p{first}–p{last}"


def summary_record(s: Summary) -> dict:
    """A summary as the journal and the store keep it."""
    return {"n": s.n, "kind": s.kind, "key": s.key, "version": s.version, "text": s.text, "pages": list(s.pages),
            "turns": list(s.turns), "ts": s.ts, "date": s.date, "source": s.source}


def summary_event(s: Summary) -> dict:
    """The record as a trace event's data ("kind" names the event there, so the summary's is "type")."""
    record = summary_record(s)
    record["type"] = record.pop("kind")
    return record


def summary_from(r: dict) -> Summary:
    """From a journal op, a store row or a trace event."""
    kind = r["kind"] if r.get("kind") in KINDS else r["type"]
    pages, turns = r["pages"], r["turns"]
    return Summary(int(r["n"]), kind, r["key"], int(r["version"]), r["text"], (int(pages[0]), int(pages[1])),
                   (int(turns[0]), int(turns[1])), float(r["ts"]), r["date"], r["source"])


class Summaries:
    """Every summary of a session in the order made; the current version of each key."""

    def __init__(self) -> None:
        self.items: list[Summary] = []
        self.current: dict[str, Summary] = {}
        self._terms: list[Counter] = []
        self._vectors: list[np.ndarray] = []
        self._cache: dict = {}
        self._lines: dict[int, tuple[Summary, str]] = {}

    def __len__(self) -> int:
        return len(self.items)

    def next_version(self, key: str) -> int:
        held = self.current.get(key)
        return held.version + 1 if held else 1

    def add(self, summary: Summary, vector: np.ndarray | None = None) -> Summary | None:
        """Keep a summary; returns the version it follows, if any (which stays)."""
        self.items.append(summary)
        older = self.current.get(summary.key)
        self.current[summary.key] = summary
        words = Counter(terms(summary.text))
        self._terms.append(words)
        self._vectors.append(vector if vector is not None else np.zeros(0, dtype=np.float32))
        return older

    @property
    def rolling(self) -> Summary | None:
        return self.current.get(ROLLING)

    def episodes(self) -> list[Summary]:
        """The current version of each episode summary, in conversation order."""
        return sorted((s for s in self.current.values() if s.kind == EPISODE), key=lambda s: (s.turns, s.n))

    def versions(self, key: str) -> list[Summary]:
        return [s for s in self.items if s.key == key]

    def search(self, query: str, query_vector: np.ndarray | None = None, k: int = 20) -> list[tuple[Summary, float]]:
        """Current summaries for the query, best first: BM25 over their text plus vector similarity.
        Older versions are kept and listed, not searched: their text is in the newer one."""
        arrays = self._arrays()
        live = arrays["live"]
        if not live:
            return []
        scores = arrays["bm25"].scores(query_terms(query))
        top = scores.max()
        if top > 0:
            scores /= top
        if query_vector is not None and self._vectors[live[0]].size:
            scores += 0.5 * positive(similarities(arrays["vectors"], query_vector))
        order = best_first(scores, k)
        order = order[scores[order] > 0]
        return [(self.items[live[j]], round(score, 4)) for j, score in zip(order.tolist(), scores[order].tolist())]

    def _arrays(self) -> dict:
        """BM25 over the current summaries and their vectors, rebuilt only when summaries were
        added: a search then costs no loop over the summaries."""
        if self._cache.get("items") != len(self.items):
            live = [i for i, s in enumerate(self.items) if self.current.get(s.key) is s]
            self._cache = {
                "items": len(self.items), "live": live,
                "bm25": FixedBM25([self._terms[i] for i in live]),
                "vectors": np.stack([self._vectors[i] for i in live]) if live and self._vectors[live[0]].size else None,
            }
        return self._cache

    def line(self, s: Summary) -> str:
        """`- s3 (session 2 · p5–p9, 25 May 2023): text` (kept: a summary never changes, and the same
        line's count is looked up question after question by the very string)."""
        held = self._lines.get(s.n)
        if held is None or held[0] is not s:
            label = "so far" if s.kind == ROLLING else s.key
            held = self._lines[s.n] = (s, f"- {s.id} ({label} · {s.span}, {s.date}): {s.text}")
        return held[1]

    def to_json(self) -> list[dict]:
        return [{"id": s.id, "kind": s.kind, "key": s.key, "version": s.version, "current": self.current.get(s.key) is s,
                 "pages": [f"p{s.pages[0]}", f"p{s.pages[1]}"], "turns": list(s.turns), "date": s.date, "ts": s.ts,
                 "source": s.source, "text": s.text} for s in self.items]


# -- producers --------------------------------------------------------------------------------------------


class Recorded:
    """A memory model's recorded episode summaries: (key, text, refs of the episode's turns, e.g.
    LoCoMo's dia_ids), each returned once, when the pages asked about hold the episode's last turn."""

    source = "recorded"

    def __init__(self, episodes: list[tuple[str, str, list[str]]], numbers: dict[str, int]) -> None:
        self.episodes = episodes
        self.numbers = numbers
        self.given: set[int] = set()

    def __call__(self, session, pages: list[int]) -> list[Draft]:
        held = held_turns(session, pages)
        out = []
        when: dict[int, float] | None = None
        for i, (key, text, refs) in enumerate(self.episodes):
            turns = [self.numbers[r] for r in refs if r in self.numbers]
            if i not in self.given and turns and max(turns) in held:
                self.given.add(i)
                when = when if when is not None else {t.turn: t.ts for t in session_turns(session)}
                out.append(Draft(EPISODE, key, text, (min(turns), max(turns)), when.get(max(turns))))
        return out


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def sentences(speaker: str, text: str) -> list[str]:
    """A turn's sentences, each as `Speaker: sentence`, verbatim."""
    return [f"{speaker}: {part.strip()}" for part in _SENTENCE.split(" ".join(text.split())) if len(terms(part)) >= 2]


class Extractive:
    """Summaries with no model, deterministic, no invented text.

    Episodes end where the date changes, where `gap_s` of silence passes, or at a topic shift
    (no word shared between the `window` turns before and after, in an episode of at least
    `min_turns`). A closed episode's summary is its `per_episode` most central sentences
    (cosine to the episode's mean embedding; sentences of `min_words` search terms or more when
    there are enough), verbatim, in conversation order. The rolling
    summary is the previous version's sentences plus the new turns' central ones, the
    `rolling_sentences` most central of them kept, in order."""

    source = "extractive"

    def __init__(self, gap_s: float = 6 * 3600, window: int = 4, min_turns: int = 12, per_episode: int = 3,
                 rolling_sentences: int = 6, min_words: int = 5) -> None:
        self.gap_s, self.window, self.min_turns, self.min_words = gap_s, window, min_turns, min_words
        self.per_episode, self.rolling_sentences = per_episode, rolling_sentences

    def episodes(self, turns: list) -> list[list]:
        """The turns cut into episodes (the last one still open)."""
        cutter = Episodes(self)
        return cutter.feed(turns) + cutter.rest()

    def central(self, session, lines: list[str], k: int, voiced: set[str] | None = None) -> list[str]:
        """k lines near the mean of all and unlike each other (maximal marginal relevance, so a
        summary is not one theme said k times), in their order. Each line once; lines of a few
        words ("Yes, Ana!") only when there are not k longer ones; when `voiced` holds k or more of
        the lines (what people said, not the assistant's replies), only those."""
        lines = list(dict.fromkeys(lines))
        if len(lines) <= k:
            return lines
        if voiced is not None and len(voiced.intersection(lines)) >= k:
            lines = [line for line in lines if line in voiced]
        vectors = session.home.embedder.embed(lines).astype(np.float32)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        relevance = vectors @ vectors.mean(axis=0)
        short = np.array([len(terms(line)) < self.min_words for line in lines])
        if (~short).sum() >= k:
            relevance = np.where(short, -np.inf, relevance)
        chosen: list[int] = []
        nearest = np.full(len(lines), -np.inf, dtype=np.float32)   # each line's likeness to those chosen
        for _ in range(k):
            score = relevance if not chosen else 0.5 * relevance - 0.5 * nearest
            score = np.where(np.isin(np.arange(len(lines)), chosen), -np.inf, score)
            best = int(np.argmax(score))
            chosen.append(best)
            nearest = np.maximum(nearest, vectors @ vectors[best])
        return [lines[i] for i in sorted(chosen)]

    def __call__(self, session, pages: list[int]) -> list[Draft]:
        turns = session_turns(session)
        held = held_turns(session, pages)
        turns = [t for t in turns if t.turn <= max(held, default=0)]
        if not turns:
            return []
        out = self.closed(session, self.episodes(turns)[:-1])   # the last one is still open
        rolling = self.rolling(session, turns, _voiced(turns))
        return out + ([rolling] if rolling else [])

    def closed(self, session, episodes: list[list]) -> list[Draft]:
        """A summary of each closed episode not summarized yet (keyed `e<its first turn>`)."""
        done = {s.key for s in session.summaries.items if s.kind == EPISODE}
        out: list[Draft] = []
        for episode in episodes:
            key = f"e{episode[0].turn}"
            if key in done:
                continue
            lines = [line for t in episode for line in _material(t)]
            picked = self.central(session, lines, self.per_episode, _voiced(episode))
            if picked:
                out.append(Draft(EPISODE, key, " ".join(picked), (episode[0].turn, episode[-1].turn), episode[-1].ts))
        return out

    def after(self, session, closed: list[list], rolling: bool = True) -> list[Draft]:
        """In a live session, once episodes closed: the summary of each not summarized yet and (with
        rolling) the rolling summary's next version, covering the previous one's turns and these
        episodes'."""
        out = self.closed(session, closed)
        turns = [t for episode in closed for t in episode]
        if rolling and turns:
            previous = session.summaries.rolling
            voiced = _voiced(turns) | set(_split_kept(previous.text) if previous else [])
            draft = self.rolling(session, turns, voiced)
            out += [draft] if draft else []
        return out

    def rolling(self, session, turns: list, voiced: set[str]) -> Draft | None:
        """The rolling summary's next version: the previous one's sentences and the central ones of the
        turns it does not cover yet (after it, or before it: episodes summarized later than those after
        them), the most central kept, in conversation order; None when there is nothing new. Its turns
        are the previous version's and the new ones', and they are what its text was made from: a gap
        between them (turns neither covered nor given) is read from the session, never claimed unread."""
        previous = session.summaries.rolling
        low, high = previous.turns if previous else (0, -1)
        new = [t for t in turns if not low <= t.turn <= high]
        if not new:
            return None
        first, last = min(new[0].turn, low if previous else new[0].turn), max(new[-1].turn, high)
        given = {t.turn for t in new} | set(range(low, high + 1))
        if len(given) < last - first + 1:   # a gap: read its turns, so the text holds what the range claims
            new = sorted(new + [t for t in session_turns(session, after=first - 1)
                                if t.turn <= last and t.turn not in given], key=lambda t: t.turn)
        before, after = [t for t in new if t.turn < low], [t for t in new if t.turn > high]
        old = _split_kept(previous.text) if previous else []
        lines = []
        for part in (before, after):
            lines.append(self.central(session, [line for t in part for line in _material(t)],
                                      self.rolling_sentences, _voiced(part)) if part else [])
        kept = self.central(session, lines[0] + old + lines[1], self.rolling_sentences, voiced | _voiced(new))
        if not kept:
            return None
        end = max(new, key=lambda t: t.turn) if new[-1].turn > high else None
        return Draft(ROLLING, ROLLING, SEP.join(kept), (first, last), end.ts if end else previous.ts)


SEP = " · "


class Episodes:
    """Episodes cut as turns arrive, one turn at a time, by the rule of `Extractive` (a new date,
    `gap_s` of silence, or a topic shift): what a live session uses to know that an episode closed
    without cutting the whole conversation again on every turn. A topic shift at a turn can be
    told only once `window` turns follow it, so a cut waits for those; fed the same turns, the
    episodes it closes are those `Extractive.episodes` cuts, the open one aside."""

    def __init__(self, rule: Extractive) -> None:
        self.rule = rule
        self.open: list = []            # the turns of the open episode (and those after an undecided cut)
        self._words: list[set[str]] = []
        self._at = 1                    # the next turn of `open` to decide: does an episode start there?

    def feed(self, turns: list) -> list[list]:
        """Take turns in order; the episodes they closed, oldest first."""
        for t in turns:
            self.open.append(t)
            self._words.append(set(terms(t.text)))
        return self._cut(wait=True)

    def rest(self) -> list[list]:
        """The turns not yet in a closed episode, cut as far as they can be without the turns to come
        (a topic shift that cannot be told yet is taken as none); the last episode is the open one."""
        out = self._cut(wait=False)
        return out + ([self.open] if self.open else [])

    def _cut(self, wait: bool) -> list[list]:
        rule, out = self.rule, []
        while self._at < len(self.open):
            i, t, prev = self._at, self.open[self._at], self.open[self._at - 1]
            if t.date != prev.date or t.ts - prev.ts > rule.gap_s:
                cut = True
            elif i < rule.min_turns:   # i: the length of the episode so far
                cut = False
            elif i + rule.window > len(self.open):
                if wait:
                    break
                cut = False
            else:
                before = set().union(*self._words[i - rule.window : i])
                after = set().union(*self._words[i : i + rule.window])
                cut = bool(before and after) and not before & after
            if cut:
                out.append(self.open[:i])
                self.open, self._words, self._at = self.open[i:], self._words[i:], 1
            else:
                self._at += 1
        return out


def _material(turn) -> list[str]:
    """A turn's sentences as summary material: none of a reply that quotes pages or notes that it is
    the offline shell (piece_kind QUOTE): it repeats what the pages say, or says nothing of the
    conversation."""
    if turn.role == "assistant" and piece_kind(turn.text) == QUOTE:
        return []
    return sentences(turn.speaker, turn.text)


def _voiced(turns: list) -> set[str]:
    """The sentences people said in these turns (not the assistant's)."""
    return {line for t in turns if t.role != "assistant" for line in sentences(t.speaker, t.text)}


def _split_kept(text: str) -> list[str]:
    return [part for part in text.split(SEP) if part.strip()]


def session_turns(session, after: int = 0) -> list:
    """Every turn (after `after`) the session can read whole: the store's, those accepted since the
    last flush, and the open tail's."""
    out = {t.turn: t for t in session.home.store.turns(session.user, session.name, after=after)}
    out.update({t.turn: t for t in session.pending.turns if t.turn > after})
    out.update({p.turn.turn: p.turn for p in session.packer.pieces if p.turn.turn > after})
    return [out[n] for n in sorted(out)]
