"""Context assembly: what the model sees, never a token over the budget.

Order (DESIGN.md step 3): the static prefix (system prompt, tool schemas: byte-stable across
turns, so provider prompt caches hit), the memory map, the working state, the episode summaries,
the fact slabs (and, with `excerpt_slabs`, excerpt slabs: whole turns of pages on disk), the
resident pages in conversation order each under its header, then the current message. The
budget goes first to the message, then to the state (up to `state_share` of what is left, always
leaving one frame), then to the frames. Frames are whole, so what the assembled context leaves
over (the map's unused reserve, the remainder past the last frame, pages short of a frame: on
LoCoMo a quarter of 1,024 tokens) shows, with `Config.fill`, more facts and then whole turns of
pages on disk, in blocks after the slabs that take no frame (`fill`).

Token accounting follows the chat format: each message costs its content plus
MESSAGE_OVERHEAD, and a reply is primed with REPLY_PRIMING. The frames are sized from what
is left after the fixed regions and the memory-map reserve; each page block (header, body
and separator) fits one frame by construction, and the whole is counted once more at the
end. If that final count were ever over, blocks would be dropped from view (and reported)
rather than send an over-budget prompt.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from pager.prompts import render

from .errors import BudgetError
from .page import page_id
from .rerank import rerank_facts
from .search import date_range, top_k
from .session import Session
from .tokens import least_tokens

MESSAGE_OVERHEAD = 4
REPLY_PRIMING = 3
SEPARATOR = "\n\n"


@dataclass
class Context:
    prefix: str
    memory: str                      # memory map + page blocks: what the benchmark budget counts
    message: str
    pages: list[int]                 # page numbers shown, in conversation order
    tokens: dict[str, int]           # per region, and "total"
    frames: int
    budget: int
    dropped: list[int] = field(default_factory=list)
    facts: list[int] = field(default_factory=list)   # fact numbers shown, in slab order
    summaries: list[int] = field(default_factory=list)   # summary numbers shown, in rank order
    excerpts: list[int] = field(default_factory=list)    # turn numbers shown whole as excerpt lines in slabs
    filled: int = 0   # of the fact and excerpt blocks, how many at their end are the leftover's (Config.fill), not frames

    @property
    def system(self) -> str:
        return self.prefix + SEPARATOR + self.memory if self.prefix else self.memory

    @property
    def digest(self) -> str:
        return hashlib.sha256((self.system + "\x00" + self.message).encode()).hexdigest()[:16]

    def messages(self) -> list[dict]:
        out = [{"role": "system", "content": self.system}]
        if self.message:
            out.append({"role": "user", "content": self.message})
        return out


def message_tokens(session: Session, messages: list[dict]) -> int:
    """Tokens of chat messages (content, tool calls) by the same accounting as the context."""
    import json

    total = 0
    for m in messages:
        total += MESSAGE_OVERHEAD + session.tokenizer.count(m.get("content") or "")
        if m.get("tool_calls"):
            total += session.tokenizer.count(json.dumps(m["tool_calls"], separators=(",", ":")))
    return total


MAP_FLOOR = 48   # the least of the memory map kept when a small budget gives the map's room to a second frame


def size_frames(session: Session, message: str = "", prefix: str = "", scratch_tokens: int = 0,
                budget: int | None = None, chat: bool = True) -> tuple[int, int, int]:
    """(frames, memory-map reserve, tokens before memory) for a budget, without touching the session.

    The map gives up its room, down to MAP_FLOOR, so that a small budget holds a page besides the
    open tail: with the tail alone in view nothing could be answered from memory."""
    cfg = session.home.config
    budget = budget or cfg.budget
    count = session.render.line_tokens   # the prefix is the same turn after turn: its count is cached
    fixed = 0
    if chat:
        fixed = (count(prefix) + count(SEPARATOR) if prefix else 0) + MESSAGE_OVERHEAD + REPLY_PRIMING
        fixed += (session.render.message_tokens(message) + MESSAGE_OVERHEAD if message else 0) + scratch_tokens
    memory_budget = budget - fixed
    floor = min(cfg.map_reserve, MAP_FLOOR)
    two_frames = memory_budget - 2 * session.page_tokens
    if two_frames >= floor:
        map_reserve = min(cfg.map_reserve, two_frames)
    else:
        map_reserve = min(cfg.map_reserve, max(0, memory_budget - session.page_tokens))
    state = render_state(session, state_cap(session, memory_budget, map_reserve, 2 if two_frames >= floor else 1))
    state_tokens = session.render.line_tokens(state + SEPARATOR) if state else 0   # the same block turn after turn
    return (memory_budget - map_reserve - state_tokens) // session.page_tokens, map_reserve, fixed


def state_cap(session: Session, memory_budget: int, map_reserve: int, frames: int) -> int:
    """Tokens the working state may take: its share of memory, never the frames the budget must keep."""
    room = memory_budget - map_reserve - frames * session.page_tokens
    return max(0, min(int(memory_budget * session.home.config.state_share), room))


def build(session: Session, message: str = "", prefix: str = "", scratch_tokens: int = 0, budget: int | None = None,
          autopage: bool = True, chat: bool = True, hide_turn: int = 0) -> Context:
    """Size the frames, page in what the message needs, and assemble the context.

    chat=False counts only the memory region against the budget (the benchmark's definition).
    """
    cfg = session.home.config
    budget = budget or cfg.budget
    count = session.tokenizer.count
    frames, map_reserve, fixed = size_frames(session, message, prefix, scratch_tokens, budget, chat)
    memory_budget = budget - fixed
    keep = 2 if memory_budget - 2 * session.page_tokens >= min(cfg.map_reserve, MAP_FLOOR) else 1
    state = render_state(session, state_cap(session, memory_budget, map_reserve, keep))  # as size_frames counted it
    if frames < 1:
        raise BudgetError(
            f"the prompt needs {fixed:,} tokens before memory (message of {count(message):,}), leaving "
            f"{max(memory_budget, 0):,} of the budget of {budget:,} for a page of {session.page_tokens}; "
            f"raise --budget to at least {fixed + session.page_tokens + cfg.map_reserve:,}"
        )
    summaries, summary_frames, summary_tokens = "", 0, 0
    shown_summaries: list[int] = []
    if frames >= 3:
        room = min(int(frames * cfg.summary_share), frames - 2 - session.pinned_count())
        summaries, shown_summaries, summary_tokens = pack_summaries(session, message, room)
        summary_frames = -(-summary_tokens // session.page_tokens)
    packed: list[list[tuple]] = []
    counts: list[int] = []   # each slab's tokens, counted while packing
    ranked: list[tuple] = []
    if frames - summary_frames >= 3 and session.facts and message.strip():
        packed, counts, hits, ranked = page_with_facts(session, message, frames - summary_frames, autopage)
        searched = True
    else:
        session.resize(frames - summary_frames)
        searched = autopage and bool(message.strip()) and session.autopage_room() > 0   # autopage searches then
        hits = session.autopage(message) if autopage and message else []
    texts = [slab_text(slab) for slab in packed]
    known = dict(zip(texts, counts))
    if summaries:
        known[summaries] = summary_tokens
    filled: list[list[tuple]] = []

    def leftover(room: int, pages: list[int]) -> list[tuple[str, int]]:
        """The blocks of what the assembled regions leave over (`fill`), each with its tokens."""
        filled[:] = fill(session, ranked, packed, pages, room, hide_turn)
        return [(slab_text(block), slab_tokens(session, block)) for block in filled]

    ctx = assemble(session, message, prefix, budget, map_reserve, hits, hide_turn, chat, scratch_tokens,
                   state, texts, summaries, known, leftover if cfg.fill and searched else None)
    packed += filled
    ctx.filled = len(filled)
    ctx.facts = [f.n for slab in packed if not of_excerpts(slab) for f, _ in slab]
    ctx.excerpts = [x.turn for slab in packed if of_excerpts(slab) for x, _ in slab]
    ctx.summaries = shown_summaries
    return ctx


def fixed_pages(session: Session) -> set[int]:
    """The pages no split or fill may place elsewhere: the open tail and the pinned pages."""
    return {session.tail_n} | {n for n in session.frames.slots if n is not None and session.table[n].pinned}


def page_with_facts(session: Session, message: str, frames: int,
                    autopage: bool) -> tuple[list[list[tuple]], list[int], list, list[tuple]]:
    """Split the frames between slabs and pages, and fill both from one search.

    The search scores every piece of every page for the message. A fact is ranked by its own match
    and by the score of the piece it came from (the page search's many signals, read at the turn). An
    excerpt is one whole turn no fact tells, of a page not resident, as a line naming its page
    (`page_in` brings the rest): ~30 tokens instead of a frame. How many slabs of each: the frames
    go, one at a time, to whichever shows more of the message's evidence per token, the next page of
    the search, the best fact or the best excerpt of a turn not shown already (`split`); fact slabs
    take at most `fact_share` of the frames, excerpt slabs at most `excerpt_slabs` (0 by default: on
    LoCoMo they did not pay, BENCHMARKS.md, "Evidence coverage with the memory tiers"). Pages are then
    faulted once, those holding what the fact slabs will not tell first (`beside_facts`); the fact
    slabs are filled with the best facts whose pages are not resident, the excerpt slabs with the
    excerpts the split chose, then the next best, of pages not resident. Returns the slabs, their
    tokens, the hits paged from, and the facts ranked (the leftover's facts are the next of them, `fill`)."""
    cfg = session.home.config
    most = max(0, min(int(frames * cfg.fact_share), frames - 2 - session.pinned_count()))
    room = max(session.autopage_room(frames), 1)
    # the fact search first: the page search's sweep over every piece leaves its arrays out of the caches
    matches = fact_matches(session, message) if session.facts and message.strip() else None
    hits = session.search(message, k=room, tail=False, depth=session.autopage_room(frames - most), record=autopage)
    weights = piece_weights(session)
    turn_weights(session, weights).load(h.n for h in hits)   # the pages split values and beside_facts orders
    ranked = rerank_facts(session, message, rank_facts(session, message, weights, matches))
    fixed = fixed_pages(session)
    above = [h for h in hits if h.score >= cfg.autopage_min_score] if autopage else []
    most_excerpts = min(cfg.excerpt_slabs, most)
    excerpts = rank_excerpts(session, weights, fixed, {h.n for h in above}) if most_excerpts else []
    fact_slabs, excerpt_slabs, chosen = split(session, above, ranked, weights, frames - len(fixed), most, fixed,
                                              excerpts, most_excerpts)
    session.resize(frames - fact_slabs - excerpt_slabs)
    every = [(f, line) for f, line, _ in ranked]
    unfaulted = None   # the slabs as slab_turns packs them, before any page is chosen
    if autopage:
        unfaulted = counted_slabs(session, breadth_first(every), fact_slabs) if fact_slabs > 0 else []
        session.autopage(message, hits=beside_facts(session, hits, weights, told_by(unfaulted)))
    resident = set(session.resident())
    kept = [item for item in every if not (item[0].pages and resident.issuperset(item[0].pages))]
    # no fact left out for its pages: the slabs are those packed before the pages were chosen
    packed = unfaulted if unfaulted is not None and len(kept) == len(every) else \
        counted_slabs(session, breadth_first(kept), fact_slabs)
    told = told_by(packed)
    lines = [item for item in itertools.chain(chosen, ((x, line) for x, line, _ in excerpts))
             if item[0].page not in resident and item[0].turn not in told]
    packed += counted_slabs(session, list(dict.fromkeys(lines)), excerpt_slabs, EXCERPTS_TITLE)
    return [slab for slab, _ in packed], [tokens for _, tokens in packed], (hits if autopage else []), ranked


MIN_FILL = 8          # the fewest tokens left over worth a block (its title, a separator and a short line)
FILL_EXCERPTS = 256   # the best-scored pieces looked at for excerpts in the leftover (a whole budget's worth)
FILL_SCAN = 5         # characters of excerpt lines looked at per token of room: a little more than fits
FILL_MIN_WEIGHT = 0.2  # the least weight (a share of the best piece's) of a turn shown in the leftover


def fill(session: Session, ranked: list[tuple], packed: list[list[tuple]], pages: list[int], room: int,
         hide_turn: int = 0) -> list[list[tuple]]:
    """Blocks for the `room` tokens the assembled context leaves over: the frames are whole, so the
    map's unused reserve, the remainder of the budget past the last frame, and the pages and slabs
    short of a frame are otherwise sent empty (a quarter of 1,024 tokens on LoCoMo, BENCHMARKS.md,
    "Evidence coverage with the memory tiers"). First the facts ranked after those the slabs hold, breadth first from
    the turns already shown; then, in what is still left, whole turns (excerpts) of the best-scored
    pieces on pages not shown that no fact tells, down to FILL_MIN_WEIGHT (on LoCoMo the floor
    changes no score; it keeps a question about little from being sent a budget of noise). Neither
    block repeats a turn on a shown page."""
    if room < MIN_FILL:
        return []
    shown = set(pages)
    held = {f.n for block in packed if not of_excerpts(block) for f, _ in block}
    told = {x.turn for block in packed if of_excerpts(block) for x, _ in block}
    told.update(t for block in packed if not of_excerpts(block) for f, _ in block for t in f.turns)
    told |= {t for n in shown if n in session.pages for t, _, _ in session.pages[n].spans}
    rest = [(f, line) for f, line, _ in ranked if f.n not in held and not (f.pages and shown.issuperset(f.pages))]
    out = pack_slabs(session, breadth_first(rest, told), 1, limit=room)
    if out:
        room -= slab_tokens(session, out[0])
        told |= {t for f, _ in out[0] for t in f.turns}
    if room >= MIN_FILL:
        fixed = fixed_pages(session)
        lines, chars = [], 0
        for x, line, _ in excerpts_by_weight(session, piece_weights(session), fixed | shown, None, FILL_EXCERPTS,
                                             FILL_MIN_WEIGHT):
            if x.turn not in told and x.turn != hide_turn:
                lines.append((x, line))
                chars += len(line)
                if chars > FILL_SCAN * room:
                    break   # enough to choose from: each line looked at is counted with the tokenizer
        out += pack_slabs(session, lines, 1, EXCERPTS_TITLE, limit=room)
    return out


TOLD_SHARE = 0.5   # of its weight a turn the fact slabs will tell keeps when pages are chosen (beside_facts)


def slab_turns(session: Session, ranked: list[tuple], slabs: int) -> set[int]:
    """The turns the fact slabs would tell were no page resident: the best facts packed as they will be
    (breadth first, first fit), before any page is chosen. Facts of the pages then faulted are left
    out of the slabs, which leaves more room, so these turns are told all the same."""
    if slabs <= 0:
        return set()
    return told_by(counted_slabs(session, breadth_first([(f, line) for f, line, _ in ranked]), slabs))


def told_by(slabs: list[tuple[list[tuple], int]]) -> set[int]:
    """The turns the facts tell in these slabs (each with its tokens, counted_slabs)."""
    return {t for slab, _ in slabs for f, _ in slab for t in f.turns}


def beside_facts(session: Session, hits: list, weights, told: set[int]) -> list:
    """The hits in the order to page them in: each page by its search score, scaled by how much of its
    best piece's weight is left once the turns the fact slabs will tell keep only TOLD_SHARE of theirs.

    A page whose best turn a fact will tell anyway shows that turn twice; a page whose evidence no
    fact tells shows what the slabs cannot. The order decides which pages are faulted when the frames
    left for pages are fewer than the hits (the split gave frames to slabs): those beside the facts
    go first. A told turn keeps half its weight, not none: its page still holds the turns around it
    (the question a fact's turn answers, say), and with none the pages gave up those turns for the
    same coverage (BENCHMARKS.md, "Evidence coverage with the memory tiers")."""
    if not told or not len(weights):
        return hits
    ranked = []
    page_turns = turn_weights(session, weights)
    for i, hit in enumerate(hits):
        turns = page_turns(hit.n)
        best = max(turns.values(), default=0.0)
        if best > 0:
            kept = best if turns.keys().isdisjoint(told) else \
                max([weight * TOLD_SHARE if turn in told else weight for turn, weight in turns.items()])
            ranked.append((-(hit.score * kept / best), i))
        else:
            ranked.append((-hit.score, i))
    return [hits[i] for _, i in sorted(ranked)]


class TurnWeights:
    """The weight of each turn on a page: the most of its pieces' weights (piece_weights; 0 for a piece
    the search did not score), read once per search. split values the pages by it and beside_facts
    orders them by it, most often the same pages: `load` reads the weights of many pages at once."""

    def __init__(self, session: Session, weights) -> None:
        self.session, self.weights = session, weights
        self.key = (len(session.index.piece_page), len(session.pages))
        self.read: dict[int, dict[int, float]] = {}

    def __call__(self, n: int) -> dict[int, float]:
        out = self.read.get(n)
        if out is None:
            self.load([n])
            out = self.read[n]
        return out

    def load(self, pages: Iterable[int]) -> None:
        """Read the turns' weights of the pages not read yet, in one array op."""
        read, held_pages, page_pieces = self.read, self.session.pages, self.session.index.page_pieces
        wanted, spans, ids = [], [], []
        for n in dict.fromkeys(pages):   # each page and its pieces looked up once (both are Python mappings)
            if n in read:
                continue
            try:
                on_page = held_pages[n].spans
            except KeyError:
                on_page = ()
            try:
                pieces = page_pieces[n]
            except KeyError:
                pieces = range(0)
            wanted.append(n)
            spans.append(on_page)
            ids.append(pieces[: len(on_page)])
        if not wanted:
            return
        every = list(itertools.chain.from_iterable(ids))
        count = len(self.weights)
        weights = self.weights[every].tolist() if every and max(every) < count else \
            [float(self.weights[piece]) if piece < count else 0.0 for piece in every]
        at = 0
        for n, on_page, held in zip(wanted, spans, ids):
            out = read[n] = {}
            for (t, _, _), weight in zip(on_page, weights[at: at + len(held)]):   # a turn's most, never below 0
                most = out.get(t)
                if most is None:
                    out[t] = weight if weight > 0.0 else 0.0
                elif weight > most:
                    out[t] = weight
            at += len(held)


def turn_weights(session: Session, weights) -> TurnWeights:
    """The session's TurnWeights for these weights (kept while the search, the pieces and the pages are the same)."""
    held = _TURN_WEIGHTS.get(session)
    if held is None or held.weights is not weights or held.key != (len(session.index.piece_page), len(session.pages)):
        held = _TURN_WEIGHTS[session] = TurnWeights(session, weights)
    return held


_TURN_WEIGHTS: "weakref.WeakKeyDictionary[Session, TurnWeights]" = weakref.WeakKeyDictionary()


def breadth_first(facts: list[tuple], told: set[int] | frozenset[int] = frozenset()) -> list[tuple]:
    """Facts in rank order, those telling a turn no fact before them (nor `told`) told first, then the
    others: a second fact of the same turn is shown only when the slabs have room left for it (on
    LoCoMo, coverage +0.001 to +0.002: up on 10 of the 24 conversation × budget cells, down on 1)."""
    told = set(told)
    first, again = [], []
    known, tell = told.issuperset, told.update
    for item in facts:
        turns = item[0].turn_set
        if turns and known(turns):
            again.append(item)
        else:
            first.append(item)
            tell(turns)
    return first + again


def told_turns(session: Session) -> set[int]:
    """The turns some fact came from (rebuilt when facts were added)."""
    if not session.facts:
        return set()   # not cached: a session without facts keeps the cache of the facts it had
    cached = _TOLD.get(session)
    if cached is None or cached[0] != len(session.facts):
        cached = _TOLD[session] = (len(session.facts), {t for f in session.facts.items for t in f.turns})
    return cached[1]


_TOLD: "weakref.WeakKeyDictionary[Session, tuple]" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Excerpt:
    """One turn's whole text from a page, shown in a slab: `- p4 · 8 May 2023 · Caroline: text`."""

    turn: int
    page: int

    @property
    def id(self) -> str:
        return page_id(self.page)


MOST_EXCERPTS = 64   # the best-scored pieces looked at for excerpts (a 128-token slab holds about three)


def rank_excerpts(session: Session, weights, fixed: set[int], found: set[int] | None,
                  most: int = 0, least: float = 0.0) -> list[tuple]:
    """(excerpt, its line, its weight) for the `most` (MOST_EXCERPTS) best-scored pieces, of weight
    `least` or more, that are a whole turn no fact tells (a fact says it in fewer tokens), on a page
    the search found (`found`: its pages above the threshold; a page the search ranks high is
    evidence more often than a lone well-scored piece elsewhere; None: any page) and not in `fixed`
    (the open tail, pinned pages), best first."""
    return list(excerpts_by_weight(session, weights, fixed, found, most, least))


def excerpts_by_weight(session: Session, weights, fixed: set[int], found: set[int] | None,
                       most: int = 0, least: float = 0.0) -> Iterator[tuple]:
    """rank_excerpts, one at a time: a caller that has enough stops the lines being made."""
    if weights is None or not len(weights):
        return
    m = min(most or MOST_EXCERPTS, len(weights))
    if least > 0:   # the pieces above the floor first: a scan, where a partition of every piece costs ~1 ms at 100K pages
        top = np.flatnonzero(weights >= least)
        if len(top) > m:
            top = top[np.argpartition(-weights[top], m - 1)[:m]]
    else:
        top = top_k(weights, m)   # the pieces argpartition(-weights, m - 1)[:m] chooses, by a scan of group maxima
    told = told_turns(session)
    cache = excerpt_cache(session)
    pages = session.index.pages_of(top)
    keep = (weights[top] > 0) & (weights[top] >= least) & ~np.isin(pages, list(fixed))   # one pass, not piece by piece
    if found is not None:
        keep &= np.isin(pages, list(found))
    top, pages = top[keep], pages[keep]
    order = np.lexsort((top, -weights[top]))   # best first, ties by piece
    for piece, n in zip(top[order].tolist(), pages[order].tolist()):
        if n not in session.pages:
            continue
        i = session.index.page_pieces[n].index(piece)
        held = cache[(n, i)] if (n, i) in cache else excerpt_line(session, n, i)
        if held is not None and held[0].turn not in told:
            yield held[0], held[1], float(weights[piece])


def excerpt_cache(session: Session) -> dict[tuple[int, int], tuple[Excerpt, str] | None]:
    """(page, piece) → excerpt_line's answer, for this session (looked up once per call of
    excerpts_by_weight: a weak dictionary's setdefault makes a weak reference each time)."""
    cache = _EXCERPTS.get(session)
    if cache is None:
        cache = _EXCERPTS[session] = {}
    return cache


def excerpt_line(session: Session, n: int, i: int) -> tuple[Excerpt, str] | None:
    """The excerpt of the i-th piece of page n and its line, or None when the piece is not a whole turn
    (a long turn split across pages: its excerpt would be part of what was said)."""
    cache = excerpt_cache(session)
    key = (n, i)
    if key in cache:
        return cache[key]
    page = session.pages[n]
    turn, start, _ = page.spans[i]
    after = session.pages.get(n + 1)
    split_on = start > 0 or (i == len(page.spans) - 1 and after is not None and after.spans
                             and after.spans[0][0] == turn)
    held = None
    if not split_on:
        date = piece_date(page, i)
        raw = page.piece_text(i)
        text = " ".join(raw.split())
        line = f"- {page_id(n)}{' · ' + date if date else ''} · {text}"
        held = (Excerpt(turn, n), line)
        # its count, from the piece's stored one (no tokenizer call where that is exact)
        session.render.excerpt_counted(line, n, date, text, page.piece_count(i) if text == raw else -1)
    cache[key] = held
    return held


def piece_date(page, i: int) -> str:
    """The date of the i-th piece of a page: the last date marker at or before its line, else the page's first."""
    for j in range(i, -1, -1):
        start = page.lines[j][0]
        offset = page.lines[j - 1][1] + 1 if j else 0
        marker = page.text[offset:start]
        if marker.startswith("(") and marker.endswith(")\n"):
            return marker[1:-2]
    return page.date_first


_EXCERPTS: "weakref.WeakKeyDictionary[Session, dict]" = weakref.WeakKeyDictionary()


SUMMARIES_TITLE = "[summaries · episodes of the conversation and the pages they cover]"


def pack_summaries(session: Session, message: str, frames: int) -> tuple[str, list[int], int]:
    """(block, summary numbers, its tokens with the separator after it): the episode summaries the
    message is about, best first, in at most `frames` whole frames (block and separator counted
    exactly). A summary longer than the room left is cut to it when it is the first; later ones that
    do not fit are passed over."""
    if frames <= 0 or not message.strip() or not any(s.kind == "episode" for s in session.summaries.current.values()):
        return "", [], 0
    count, capacity = session.tokenizer.count, frames * session.page_tokens
    cost = session.render.line_tokens
    vector = message_vector(session, message)
    lines: list[str] = []
    shown: list[int] = []
    used = cost(SUMMARIES_TITLE + "\n")   # the block so far, each line with its newline
    for s, _ in session.summaries.search(message, vector):
        if s.kind != "episode":
            continue   # the rolling summary has its place in the memory map
        line = session.summaries.line(s)
        # the block's count as the sum of its lines' cached counts: a line starts with "- ", so no
        # pre-token runs across a newline into it (as a page's body after its header, render.py); the
        # whole block is counted once more below. A line whose newline and separator are a token each
        # costs its share with either (Renderer.line_share)
        share = session.render.line_share(line)
        if used + (share or cost(line + SEPARATOR)) > capacity:
            if lines:
                continue
            line = session.tokenizer.fit(line, capacity - count(SUMMARIES_TITLE + "\n" + SEPARATOR))
            while line and count("\n".join([SUMMARIES_TITLE, line]) + SEPARATOR) > capacity:
                line = line[:-1]   # a merge at the joins may cost a token more than the parts
            if len(line) < 16:
                return "", [], 0
            share = 0   # a line cut to the room: counted as it is
        lines.append(line)
        shown.append(s.n)
        used += share or cost(line + "\n")
    tokens = block_tokens(session, SUMMARIES_TITLE, lines)
    while lines and tokens > capacity:   # by construction this does not happen
        lines.pop()
        shown.pop()
        tokens = block_tokens(session, SUMMARIES_TITLE, lines)
    if not lines:
        return "", [], 0
    return "\n".join([SUMMARIES_TITLE, *lines]), shown, tokens



def piece_weights(session: Session):
    """The last search's score of every piece, as a share of the best: how likely it is the evidence."""
    scored = session.index.scored
    if scored is None or not len(scored):
        return np.zeros(0, dtype=np.float32)
    held = _WEIGHTS.get(session)
    if held is not None and held[0] is scored:   # asked again for the same search (the split, the leftover): read only
        return held[1]
    top = float(scored.max())
    weights = scored / top if top > 0 else np.zeros_like(scored)
    weights.flags.writeable = False
    _WEIGHTS[session] = (scored, weights)
    return weights


_WEIGHTS: "weakref.WeakKeyDictionary[Session, tuple]" = weakref.WeakKeyDictionary()


def fact_pieces(session: Session, fact) -> tuple[int, ...]:
    """The indexed pieces holding a fact's turns (none while they are on the open tail)."""
    cache = _FACT_PIECES.setdefault(session, {})
    pieces = cache.get(fact.n)
    if pieces is None:
        found, indexed = [], True
        for p in fact.pages:
            ids = session.index.page_pieces.get(p)
            if ids is None:
                indexed = False   # the tail: not yet a piece; asked again once it is sealed and indexed
                continue
            found += [ids[i] for i, (t, _, _) in enumerate(session.pages[p].spans) if t in fact.turns]
        pieces = tuple(found)
        if indexed:
            cache[fact.n] = pieces
    return pieces


_FACT_PIECES: "weakref.WeakKeyDictionary[Session, dict[int, tuple[int, ...]]]" = weakref.WeakKeyDictionary()


def rank_facts(session: Session, message: str, weights=None, matches: tuple | None = None) -> list[tuple]:
    """(fact, its line, its weight) for the facts the message is about, best first: by the fact's own
    match (with the date signal of the page search when the message names a date and `fact_dates` is
    on) and by the weight of the piece it came from, each a share of the best. A fact the search
    found through its turn counts even when its own words miss the message (a paraphrase). The
    weight is the piece's alone: the split compares it with the weights of pieces on pages.

    The candidates are the facts the fact search ranks highest and those of the best-weighted pieces;
    the weights of all facts are read from one array op (`fact_weights`), not fact by fact. `matches`:
    the fact search's answer (fact_matches), when it was made already."""
    if not session.facts or not message.strip():
        return []
    items = session.facts.items
    own, scores = matches or fact_matches(session, message)
    best = scores[0] if scores and scores[0] > 0 else 1.0
    matched = np.zeros(len(items), dtype=np.float64)
    matched[own] = np.array(scores, dtype=np.float64) / best   # each score / best, as one at a time
    candidate = np.zeros(len(items), dtype=bool)
    candidate[own] = True
    weighted = weights is not None and len(weights)
    if weighted:
        owner, pieces, _, _ = _fact_index(session)
        m = min(MOST_FACTS, len(weights))
        if len(pieces):   # the facts of the m best pieces (argpartition's choice at a tie, top_k)
            best_pieces = np.zeros(len(weights), dtype=bool)
            best_pieces[top_k(weights, m)] = True
            candidate[owner[best_pieces[pieces]]] = True
    # the order is by total, then fact number: which candidate came first does not matter
    places = np.flatnonzero(candidate)
    numbers = fact_numbers(session)[places]
    weight = (fact_weights(session, weights)[places] if weighted
              else np.zeros(len(places), dtype=np.float32))
    total = matched[places] + weight.astype(np.float64)   # the same sums as float(matched) + float(weight), one at a time
    order = np.lexsort((numbers, -total))[:MOST_FACTS]   # best first, ties by fact number
    lines = fact_lines(session)
    read = weight.tolist()
    at = places.tolist()
    out = []
    for i in order.tolist():
        f = items[at[i]]
        line = lines.get(f.n)
        if line is None:
            line = lines[f.n] = session.facts.line(f)
        out.append((f, line, read[i]))
    return RankedFacts(out, numbers[order], weight[order].astype(np.float64))


class RankedFacts(list):
    """rank_facts's answer, (fact, its line, its weight) best first, with the facts' numbers and weights
    as arrays in the same order: split reads them there, not from each fact (200 objects the page
    search's sweep has left out of the caches)."""

    def __init__(self, items: list[tuple], numbers: np.ndarray, weights: np.ndarray) -> None:
        super().__init__(items)
        self.numbers, self.weights = numbers, weights


def line_costs(session: Session, ranked: RankedFacts) -> np.ndarray:
    """Each ranked fact's cost in a fact slab, its line's tokens and one for its newline: counted once
    per line and kept, by fact number, as long as fact_lines keeps the lines."""
    lines = fact_lines(session)
    numbers = ranked.numbers
    size = int(numbers.max()) + 1 if len(numbers) else 1
    held = _COSTS.get(session)
    if held is None or held[0] is not lines:
        held = _COSTS[session] = (lines, np.zeros(size, dtype=np.int64))   # 0: not counted yet
    if len(held[1]) < size:
        held = _COSTS[session] = (lines, np.concatenate([held[1], np.zeros(size - len(held[1]), dtype=np.int64)]))
    kept = held[1]
    costs = kept[numbers]
    for i in np.flatnonzero(costs == 0).tolist():
        costs[i] = kept[numbers[i]] = session.render.line_tokens(ranked[i][1]) + 1
    return costs


_COSTS: "weakref.WeakKeyDictionary[Session, tuple[dict, np.ndarray]]" = weakref.WeakKeyDictionary()


def fact_matches(session: Session, message: str) -> tuple[np.ndarray, list[float]]:
    """The fact search's answer for the message (Facts.scored: the facts' places and their scores)."""
    span = date_range(message, session.clock()) if session.home.config.fact_dates else None
    return session.facts.scored(message, message_vector(session, message), k=MOST_FACTS, span=span,
                                vector_weight=getattr(session.home.embedder, "fact_vector_weight", 0.5))


def fact_numbers(session: Session) -> np.ndarray:
    """Each fact's number, by its place in session.facts.items (rebuilt when facts were added)."""
    cached = _NUMBERS.get(session)
    if cached is None or cached[0] != len(session.facts):
        cached = _NUMBERS[session] = (len(session.facts), np.array([f.n for f in session.facts.items], dtype=np.int64))
    return cached[1]


_NUMBERS: "weakref.WeakKeyDictionary[Session, tuple[int, np.ndarray]]" = weakref.WeakKeyDictionary()


def fact_weights(session: Session, weights) -> np.ndarray:
    """Every fact's weight (by its place in session.facts.items): the most weight of the pieces it
    came from, 0 for none."""
    pairs = _fact_index(session)
    out = np.zeros(len(session.facts), dtype=np.float32)
    if len(pairs.pieces):   # the pairs come fact by fact: each fact's most is one reduction of its run
        out[pairs.run_owner] = np.maximum.reduceat(weights[pairs.pieces], pairs.runs)
    return out


class FactPieces(NamedTuple):
    """Each (fact, piece it came from) pair, fact by fact: the fact's index and the piece; and each
    fact's run of pairs, where it starts and whose it is."""

    owner: np.ndarray
    pieces: np.ndarray
    runs: np.ndarray
    run_owner: np.ndarray


def _fact_index(session: Session) -> FactPieces:
    """The session's FactPieces, rebuilt when facts or pieces were added."""
    key = (len(session.facts), len(session.index.piece_page))
    cached = _PIECE_FACTS.get(session)
    if cached is None or cached[0] != key:
        owner: list[int] = []
        pieces: list[int] = []
        for i, f in enumerate(session.facts.items):
            for p in fact_pieces(session, f):
                owner.append(i)
                pieces.append(p)
        owners = np.array(owner, dtype=np.int64)
        runs = np.flatnonzero(np.r_[True, owners[1:] != owners[:-1]]) if owner else np.zeros(0, dtype=np.int64)
        cached = _PIECE_FACTS[session] = (key, FactPieces(owners, np.array(pieces, dtype=np.int64), runs, owners[runs]))
    return cached[1]


def fact_lines(session: Session) -> dict[int, str]:
    """fact number → its line in a slab, kept until a fact is added (a newer one may change an older line)."""
    cache = _LINES.get(session)
    if cache is None or cache[0] != len(session.facts):
        cache = _LINES[session] = (len(session.facts), {})
    return cache[1]


_LINES: "weakref.WeakKeyDictionary[Session, tuple[int, dict[int, str]]]" = weakref.WeakKeyDictionary()
_PIECE_FACTS: "weakref.WeakKeyDictionary[Session, tuple]" = weakref.WeakKeyDictionary()


MOST_FACTS = 200   # facts ranked for the slabs (a 128-token slab holds about four)


def split(session: Session, pages: list, ranked: list[tuple], weights, frames: int, most: int,
          fixed: set[int], excerpts: Sequence[tuple] = (), most_excerpts: int = 0) -> tuple[int, int, list[tuple]]:
    """(fact slabs, at most `most`; excerpt slabs, at most `most_excerpts`; the excerpts chosen, in
    order): how `frames` are split, greedy by evidence per token.

    Each turn counts once, with the weight of its piece; a page offers the turns on it not yet shown,
    for a frame; a fact offers its turns, an excerpt its one turn, for its line's tokens. Pages are
    taken in the search's order, facts and excerpts best offer first, until the frames are spent. A
    turn shown once is worth nothing again: no line repeats a page or another line."""
    import heapq

    if most <= 0 or not (ranked or excerpts):
        return 0, 0, []
    count, limit = session.render.line_tokens, session.page_tokens   # the titles' counts, cached
    room = {False: limit - count(FACTS_TITLE + SEPARATOR), True: limit - count(EXCERPTS_TITLE + SEPARATOR)}
    cap = {False: most, True: most_excerpts}
    shown: set[int] = {t for n in fixed if n in session.pages for t, _, _ in session.pages[n].spans}
    shown |= {piece.turn.turn for piece in session.packer.pieces} if session.tail_n in fixed else set()

    page_turns = turn_weights(session, weights)
    if most_excerpts <= 0:   # facts alone offer lines (the default): one kind, its offers sorted once
        if isinstance(ranked, RankedFacts) and len(ranked.weights) == len(ranked):
            worth, costs = ranked.weights, line_costs(session, ranked)
        else:
            worth = np.array([weight for _, _, weight in ranked], dtype=np.float64)
            costs = np.array([session.render.line_tokens(line) + 1 for _, line, _ in ranked], dtype=np.int64)
        offered = np.flatnonzero(worth > 0)
        order = offered[np.lexsort((offered, -worth[offered] / costs[offered]))]   # best value per token, then rank
        return _split_facts(ranked, order.tolist(), worth.tolist(), costs.tolist(), pages, page_turns, shown,
                            frames, most, room[False], limit)
    offers: list[tuple] = []   # (-value per token, rank, turns, weight, cost, item or None): a heap; offers only fall as turns are shown
    # (a fact's turns as a set, made once: the loop asks of each offer whether they were all shown)
    known, counted = session.render.known_lines(), session.render.line_tokens
    for rank, (fact, line, weight) in enumerate(ranked):
        if weight > 0 and not fact.turn_set <= shown:
            cost = known.get(line)
            cost = (counted(line) if cost is None else cost) + 1
            offers.append((-weight / cost, rank, fact.turn_set, weight, cost, None))
    for rank, (excerpt, line, weight) in enumerate(excerpts, len(ranked)):
        if excerpt.turn not in shown:
            cost = session.render.line_tokens(line) + 1
            offers.append((-weight / cost, rank, frozenset((excerpt.turn,)), weight, cost, (excerpt, line)))
    heapq.heapify(offers)
    taken_pages, next_page = 0, 0
    tokens = {False: 0, True: 0}   # of fact lines, of excerpt lines
    slabs = {False: 0, True: 0}
    chosen: list[tuple] = []
    stale, page_value = True, 0.0
    turns_on_page: dict[int, float] = {}
    while taken_pages + slabs[False] + slabs[True] < frames:
        if stale:   # the next page's value changes only when it is taken or a line shows a turn on it
            page_value, turns_on_page = _page_offer(pages, next_page, page_turns, shown, limit)
            stale = False
        best = None
        while offers:   # the best offer still standing (a line whose turns were shown meanwhile drops)
            _, rank, turns, weight, cost, item = offers[0]
            kind = item is not None
            needed = -(-(tokens[kind] + cost) // room[kind])
            if turns <= shown or needed > cap[kind] or taken_pages + slabs[not kind] + needed > frames:
                heapq.heappop(offers)
                continue
            best = (weight / cost, turns, cost, item)
            break
        if best and best[0] > page_value:
            heapq.heappop(offers)
            line = best[3]
            kind = line is not None
            tokens[kind] += best[2]
            slabs[kind] = -(-tokens[kind] // room[kind])
            shown.update(best[1])
            stale = not turns_on_page.keys().isdisjoint(best[1])
            if line is not None:
                chosen.append(line)
        elif next_page < len(pages) and page_value > 0:
            taken_pages += 1
            next_page += 1
            shown.update(turns_on_page)
            stale = True
        else:
            break
    return slabs[False], slabs[True], chosen


def _page_offer(pages: list, next_page: int, page_turns: Callable[[int], dict[int, float]], shown: set[int],
                limit: int) -> tuple[float, dict[int, float]]:
    """What the next page in the search's order offers split: the weight of its turns not yet shown
    per token of a frame, and its turns; nothing past the last page."""
    if next_page >= len(pages):
        return 0.0, {}
    turns_on_page = page_turns(pages[next_page].n)
    return sum(w for t, w in turns_on_page.items() if t not in shown) / limit, turns_on_page


def _split_facts(ranked: list[tuple], order: list[int], worth: list[float], costs: list[int], pages: list,
                 page_turns: Callable[[int], dict[int, float]], shown: set[int], frames: int, most: int, room: int,
                 limit: int) -> tuple[int, int, list[tuple]]:
    """split's greedy loop when only facts offer lines, `room` a fact slab's tokens for lines. The facts
    are offered in `order` (by value per token, then rank: no two tie), each fact's weight and cost
    at its rank. Nothing is offered again once passed, so this is the heap's order read from a list,
    and a fact whose turns were all shown drops when it comes up (shown only grows)."""
    at, end = 0, len(order)
    taken_pages, next_page, tokens, slabs = 0, 0, 0, 0
    stale, page_value = True, 0.0
    turns_on_page: dict[int, float] = {}
    while taken_pages + slabs < frames:
        if stale:   # the next page's value changes only when it is taken or a line shows a turn on it
            page_value, turns_on_page = _page_offer(pages, next_page, page_turns, shown, limit)
            stale = False
        best = -1
        while at < end:   # the best offer still standing
            rank = order[at]
            needed = -(-(tokens + costs[rank]) // room)
            if needed > most or taken_pages + needed > frames or ranked[rank][0].turn_set <= shown:
                at += 1
                continue
            best = rank
            break
        if best >= 0 and worth[best] / costs[best] > page_value:
            at += 1
            tokens += costs[best]
            slabs = -(-tokens // room)
            turns = ranked[best][0].turn_set
            shown.update(turns)
            stale = not turns_on_page.keys().isdisjoint(turns)
        elif next_page < len(pages) and page_value > 0:
            taken_pages += 1
            next_page += 1
            shown.update(turns_on_page)
            stale = True
        else:
            break
    return slabs, 0, []


FACTS_TITLE = "[facts]"
EXCERPTS_TITLE = "[excerpts of pages on disk]"


def message_vector(session: Session, message: str):
    """The message's vector as the facts and summaries are searched with, float16-rounded as theirs are
    stored: the page search's (search.Index.query_vector: the speakers it names left out, embedded once
    per message), or, for an embedder that reads names as part of a sentence (`whole_message`), the
    whole message's."""
    embedder = session.home.embedder
    vector = embedder.embed([message])[0] if getattr(embedder, "whole_message", False) else \
        session.index.query_vector(message, embedder)
    return vector.astype("float16").astype("float32")


def of_excerpts(slab: list[tuple]) -> bool:
    """Whether a slab holds excerpts (a slab is packed from facts or from excerpts, never both)."""
    return bool(slab) and isinstance(slab[0][0], Excerpt)


def slab_title(slab: list[tuple]) -> str:
    return EXCERPTS_TITLE if of_excerpts(slab) else FACTS_TITLE


def slab_text(slab: list[tuple]) -> str:
    return "\n".join([slab_title(slab)] + [line for _, line in slab])


def block_tokens(session: Session, title: str, lines: list[str]) -> int:
    """Exact tokens of a block of lines under its title, with the separator after it, from cached
    per-line counts (Renderer.list_tokens): a slab or the summaries block costs the tokenizer only
    for lines it has not seen."""
    return session.render.list_tokens(title, lines, SEPARATOR)


def slab_tokens(session: Session, slab: list[tuple]) -> int:
    return block_tokens(session, slab_title(slab), [line for _, line in slab])


def pack_slabs(session: Session, ranked: list[tuple], slabs: int, title: str = FACTS_TITLE,
               limit: int = 0) -> list[list[tuple]]:
    """Facts (or excerpts) in order, first fit into at most `slabs` frames of page_tokens each, or of
    `limit` tokens (block and separator counted exactly); the empty slabs are not returned."""
    return [slab for slab, _ in counted_slabs(session, ranked, slabs, title, limit)]


def counted_slabs(session: Session, ranked: list[tuple], slabs: int, title: str = FACTS_TITLE,
                  limit: int = 0) -> list[tuple[list[tuple], int]]:
    """pack_slabs, each slab with its exact tokens (separator included), as its check counted them."""
    limit = limit or session.page_tokens
    bins: list[list[tuple]] = [[] for _ in range(slabs)]
    free = [limit - session.render.line_tokens(title + SEPARATOR)] * slabs   # what each bin can still take
    # most[b]: the most any of bins 0..b can take (never falling with b), so the first bin a line fits is
    # bisect_left(most, cost) and the most any bin can take is most[-1]
    most = list(itertools.accumulate(free, max))
    room = most[-1] if slabs else 0   # a line costing more is passed over
    costs, shares = session.render.known_lines(), session.render.known_shares()
    summed = [0] * slabs   # each bin's lines' shares (Renderer.line_share), -1 once a line has none
    for item in ranked:
        if room < 2:
            break   # no line costs less than a token and its newline
        share = shares.get(item[1])
        if share:   # its tokens and one for its newline: the cost below
            cost = share
        else:
            known = costs.get(item[1])
            if known is None:
                if item[1].count(" ") + 1 >= room and least_tokens(item[1]) >= room:   # (the bound is at most that)
                    continue   # it cannot fit: passed over, as its count would pass it over, without counting it
                known = session.render.line_tokens(item[1])
            cost = known + 1
        if cost > room:
            continue
        b = bisect.bisect_left(most, cost)   # first fit
        bins[b].append(item)
        free[b] -= cost
        summed[b] = summed[b] + cost if share and summed[b] >= 0 else -1
        for j in range(b, slabs):   # most[j] falls only as far as the bins up to j allow
            held = max(most[j - 1], free[j]) if j else free[j]
            if held == most[j]:
                break
            most[j] = held
        room = most[-1]
    out = []
    head = session.render.head_tokens(title, SEPARATOR)
    for slab, shared in zip(bins, summed):
        # a slab of lines with shares is counted as list_tokens sums it; any other, counted again: the
        # per-line estimate may be off by a merge at the newline
        tokens = (head + shared if shared >= 0 else slab_tokens(session, slab)) if slab else 0
        while tokens > limit:
            slab.pop()
            tokens = slab_tokens(session, slab) if slab else 0
        if slab:
            out.append((slab, tokens))
    return out


def assemble(session: Session, message: str, prefix: str, budget: int, map_reserve: int,
             hits=(), hide_turn: int = 0, chat: bool = True, scratch_tokens: int = 0, state: str = "",
             slabs: list[str] | None = None, summaries: str = "", known: dict[str, int] | None = None,
             leftover: Callable[[int, list[int]], list[tuple[str, int]]] | None = None) -> Context:
    """Render the regions and count them exactly.

    Counting is done per segment and summed: `map + SEP`, then each `block + SEP` (the last block too). A
    block always starts with "[" and a separator is "\n\n", and in the tiktoken encodings pager uses
    a pre-token never runs from newlines into a following "[" or "#" (the property test recounts the
    whole prompt to hold this), so the sum is the exact count of the joined text while each block's
    count is computed once per page, not once per turn. `known`: blocks already counted exactly (with
    the separator), as the fact slabs and the summaries are while they are packed. `leftover(room,
    pages shown)`: blocks (each with its exact tokens) for the tokens the regions leave under the
    budget, placed after the slabs.
    """
    shown: list[int] = []
    # the state, the summaries, then fact slabs: never dropped
    blocks: list[str] = ([state] if state else []) + ([summaries] if summaries else []) + list(slabs or [])
    known = known or {}
    costs: list[int] = [known[block] if block in known else session.render.line_tokens(block + SEPARATOR)
                        for block in blocks]   # the state block is the same turn after turn: its count is cached
    fixed = len(blocks)
    for n in session.resident():
        made = session.render.block(n, SEPARATOR, hide_turn)
        if made is None:
            continue
        shown.append(n)
        blocks.append(made[0])
        costs.append(made[1])
    memory_map = render_map(session, map_reserve, [h.n for h in hits])
    counted = session.render.line_tokens   # as size_frames counted them
    prefix_tokens = counted(prefix) if prefix else 0
    message_part = (session.render.message_tokens(message) + MESSAGE_OVERHEAD) if message else 0

    map_tokens = session.render.count_map(memory_map)   # render_map has just counted it, most often

    def memory_tokens() -> int:
        if not blocks:
            return map_tokens
        return session.tokenizer.count_extended(memory_map, map_tokens, SEPARATOR) + sum(costs)

    def total(memory: int) -> int:
        if not chat:
            return memory
        system = counted(prefix + SEPARATOR) + memory if prefix else memory
        return MESSAGE_OVERHEAD + system + message_part + REPLY_PRIMING + scratch_tokens

    memory = memory_tokens()
    used = total(memory)
    if leftover is not None and used < budget:
        more = leftover(budget - used, list(shown))
        blocks[fixed:fixed] = [block for block, _ in more]
        costs[fixed:fixed] = [cost for _, cost in more]
        fixed += len(more)
        memory = memory_tokens()
        used = total(memory)
    dropped: list[int] = []
    while used > budget and shown:
        # by construction this does not happen; if it ever does, show less rather than overflow
        victim = min(range(len(shown)), key=lambda i: session.table[shown[i]].last_use)
        dropped.append(shown.pop(victim))
        blocks.pop(fixed + victim)
        costs.pop(fixed + victim)
        memory = memory_tokens()
        used = total(memory)
    text = memory_map + SEPARATOR + SEPARATOR.join(blocks) + SEPARATOR if blocks else memory_map
    ctx = Context(prefix, text, message, shown, {}, session.frames.count, budget, dropped)
    state_tokens = costs[0] if state else 0
    summary_tokens = costs[1 if state else 0] if summaries else 0
    fact_tokens = sum(costs[bool(state) + bool(summaries) : fixed])
    ctx.tokens = {"prefix": prefix_tokens, "map": map_tokens, "state": state_tokens, "facts": fact_tokens,
                  **({"summaries": summary_tokens} if summaries else {}),   # traces before summaries lack the key
                  "pages": memory - map_tokens - state_tokens - fact_tokens - summary_tokens, "memory": memory,
                  "message": message_part and message_part - MESSAGE_OVERHEAD, "scratch": scratch_tokens,
                  "total": used}
    return ctx


def render_state(session: Session, cap: int) -> str:
    """The working state block, at most `cap` tokens with the separator after it: the newest keys
    are kept when not all fit, and a last line says how many older ones are left out. "" if empty."""
    state = session.state
    if not state.current or cap <= 0:
        return ""
    count = session.tokenizer.count
    title = render("state").strip()
    lines = state.lines(lambda c: session.render.page_dates(c.page) if c.page in session.table else "")
    key = (cap, title, tuple(lines))
    cached = session.render.state_block
    if cached and cached[0] == key:   # sizing and assembly both ask, turn after turn, for the same block
        return cached[1]
    block = _fit_state(count, title, lines, cap)
    session.render.state_block = (key, block)
    return block


def _fit_state(count, title: str, lines: list[str], cap: int) -> str:
    """The state block of these lines within cap tokens (render_state)."""

    def text(kept: list[str]) -> str:
        left = len(lines) - len(kept)
        more = [f"- ({left} older key{'s' if left > 1 else ''} not shown; search finds them)"] if left else []
        return "\n".join([title, *kept, *more])

    kept = list(lines)
    while kept and count(text(kept) + SEPARATOR) > cap:
        kept.pop(0)  # the oldest set goes first
    block = text(kept)
    return block if count(block + SEPARATOR) <= cap else ""


def render_map(session: Session, reserve: int, focus: list[int]) -> str:
    """The memory map, cut to `reserve` tokens: usage, pressure, and bookmarks of pages on disk."""
    cfg = session.home.config
    count = session.render.line_tokens   # the map's head is the same text turn after turn: its counts are cached
    used, frames = session.frames.used(), session.frames.count
    pressure = used / frames if frames else 1.0
    notice = ""
    if pressure >= cfg.pressure and frames > 2:
        upcoming = next_victims(session, 2)
        if upcoming:
            notice = render("pressure", policy=session.policy.name, next=", ".join(f"p{n}" for n in upcoming))
    resident = session.resident()
    head = render("memory_map", used=used, frames=frames, pressure=round(100 * pressure), pages=len(session.pages),
                  turns=session.turn_count).rstrip("\n")
    if count(head) > reserve:
        return session.tokenizer.fit(head, reserve)
    # the map is "\n".join([head, *parts]): counted as the sum of its lines' cached counts
    # (Renderer.list_tokens, exact as each line starts clean), so only a line new to it is counted
    parts: list[str] = []

    def tokens(*more: str, end: str = "") -> int:
        return session.render.list_tokens(head, [*parts, *more], end)
    if notice and tokens(notice) <= reserve:
        parts.append(notice.rstrip("\n"))
    rolling = rolling_line(session, reserve - tokens(end="\n"))
    if rolling and tokens(rolling[1:]) <= reserve:
        parts.append(rolling[1:])
    title = "bookmarks of pages on disk (page_in an id or keyword):"
    if tokens(title) + 12 <= reserve:
        parts.append(title)
    else:
        return "\n".join([head, *parts])
    resident_set = set(resident)
    order = [n for n in focus if n not in resident_set]
    first = set(order)
    recent = (n for n in session.render.newest_first() if n not in resident_set and n not in first)
    lines: list[str] = []
    budget = reserve - tokens()
    for n in itertools.chain(order, recent):
        keywords = session.directory.keywords(n)
        if not keywords:
            continue
        date = session.pages[n].date_first
        line = f"- p{n}{' (' + date + ')' if date else ''}: {', '.join(keywords[:5])}"
        cost = session.render.line_tokens(line) + 1
        if cost > budget:
            break
        lines.append(line)
        budget -= cost
    total = tokens(*lines)
    while lines and total > reserve:
        lines.pop()
        total = tokens(*lines)
    full = "\n".join([head, *parts, *lines])
    session.render.map_counted(full, total)   # for assembly, which counts the map too
    return full


def next_victims(session: Session, k: int) -> list[int]:
    """The pages the policy would evict next (Policy.peek: nothing is changed)."""
    table, tail = session.table, session.tail_n
    candidates = [table[n] for n in session.frames.slots if n is not None and n != tail and not table[n].pinned]
    return [e.n for e in session.policy.peek(candidates, session.tick, k)]


ROLLING_MIN = 48   # the least room in the memory map worth a rolling summary


def rolling_line(session: Session, room: int) -> str:
    """"\\n" and the current rolling summary, in at most half the map's room left (the bookmarks keep
    the rest); "" when there is none or the map is too small for it."""
    rolling = session.summaries.rolling
    if rolling is None or room < 2 * ROLLING_MIN:
        return ""
    text = f"so far ({rolling.id}, {rolling.span}): {rolling.text}"
    held = session.render.rolling_line
    if not held or held[0] != text:   # the map asks for the same line turn after turn, in a few sizes
        held = session.render.rolling_line = (text, {})
    if room // 2 not in held[1]:
        line = session.tokenizer.fit(text, room // 2)
        while line and session.tokenizer.count("\n" + line) > room // 2:
            line = line[:-1]
        held[1][room // 2] = "\n" + line if line else ""
    return held[1][room // 2]
