"""A reranker's second opinion on what a message is about (`Config.reranker`, off by default).

pager ranks the pieces of its pages (a turn each) by words, meaning, speakers and dates
(`search.Index`), and facts by their own match and their turn's piece (`context.rank_facts`). On
LoCoMo the evidence it misses at small budgets ranks 20th–99th because neither its words nor its
meaning are near the question's ("What outdoor activities does John enjoy?" → "John started
surfing five years ago"). A cross-encoder, reading the question and the text together, is what
finds those. An oracle putting the evidence first bounds what reordering can gain (BENCHMARKS.md,
"What a reranker could gain"); no reranker can be had offline here, so pager calls one the user
runs: any litellm rerank model (Cohere, Voyage, Jina, Together, or a local server: `infinity/…`,
`hosted_vllm/…`, their address in litellm's `INFINITY_API_BASE`, `HOSTED_VLLM_API_BASE`).

Two places, each with its own number of candidates (0 turns one off):
- **pieces** (`rerank_pieces`): the page search's best pieces, reordered before pages are chosen
  from them. The reranker's order takes over the scores those pieces had, best first, so every
  later step (pages, facts ranked by their turn's piece, excerpts) reads it, and the scores keep
  their scale (thresholds such as `autopage_min_score` mean what they did).
- **facts** (`rerank_facts`): the best-ranked facts, reordered before the slabs are packed.

Only orders change: the candidates, the split of frames and the packing are as without it, and the
budget holds. Each answer is a `pieces_reranked` or `facts_reranked` event naming what was asked
about and the order given, so `pager replay --check` reproduces a session without calling the
reranker (`Recorded`). A reranker that fails, or answers with something that is no order of the
candidates, is a `rerank_failed` event and pager's own order stands: never a failed turn.
"""

from __future__ import annotations

import logging
from typing import Protocol, Sequence

import numpy as np

RECENT = 32   # answers kept per session: an agent's later steps and its search tool ask the same message again


class Reranker(Protocol):
    name: str

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """A relevance score for each document, higher is more relevant (one per document)."""
        ...


class LiteLLMReranker:
    """A litellm rerank model; its answer's results give (index, relevance_score) pairs."""

    def __init__(self, model: str, timeout: float = 30.0) -> None:
        self.name, self.timeout = model, timeout
        logger = logging.getLogger("LiteLLM")   # its rerank logs each failure; pager says it once, as an event
        if not any(isinstance(f, _Said) for f in logger.filters):
            logger.addFilter(_Said())

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        from .llm import litellm

        answer = litellm().rerank(model=self.name, query=query, documents=list(documents), top_n=len(documents),
                                   return_documents=False, timeout=self.timeout)
        out = [float("-inf")] * len(documents)
        for result in answer.results or []:
            index = result["index"]
            if not isinstance(index, int) or not 0 <= index < len(documents):
                raise ValueError(f"the reranker answered index {index!r} for {len(documents)} documents")
            out[index] = float(result["relevance_score"])
        return out


class _Said(logging.Filter):
    """Drops litellm's own line for a failed rerank: the failure is a `rerank_failed` event, shown once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Error in rerank")


class RerankError(Exception):
    """A reranker's failure, as the trace recorded it."""


# what each stage is called in its events, and the field naming its candidates
STAGES = {"pieces": ("pieces_reranked", "pieces"), "facts": ("facts_reranked", "facts")}


def _key(value):
    """A candidate as a dict key: a fact's number, or a piece's [page, position] from JSON as a tuple."""
    return tuple(value) if isinstance(value, list) else value


def _said(key):
    """A candidate as an event says it (JSON has no tuples): _key's inverse."""
    return list(key) if isinstance(key, tuple) else key


class Recorded:
    """The answers a trace recorded, by (stage, message, candidates): replay calls no reranker."""

    def __init__(self, name: str, events: list[dict]) -> None:
        self.name = name
        self.answers: dict[tuple, tuple[str, object]] = {}
        kinds = {kind: stage for stage, (kind, _) in STAGES.items()}
        for e in events:
            stage = kinds.get(e["kind"]) or (e.get("stage") if e["kind"] == "rerank_failed" else None)
            if stage not in STAGES:
                continue
            key = (stage, e.get("message", ""), tuple(_key(c) for c in e.get(STAGES[stage][1], ())))
            if e["kind"] == "rerank_failed":
                self.answers[key] = ("error", e.get("error", ""))
            else:
                self.answers[key] = ("order", [_key(c) for c in e["order"]])

    def order(self, stage: str, message: str, keys: tuple) -> list:
        kind, answer = self.answers.get((stage, message, keys), ("error", "the trace recorded no reranker answer"))
        if kind == "error":
            raise RerankError(str(answer))
        return list(answer)  # type: ignore[call-overload]


def reordered(session, stage: str, message: str, keys: tuple, texts: Sequence[str]) -> list | None:
    """The candidates' keys in the reranker's order, or None: no reranker, fewer than two candidates, or
    it failed (a `rerank_failed` event). An answer is asked once per stage, message and candidates."""
    reranker = session.home.reranker
    if reranker is None or len(keys) < 2:
        return None
    recent = session.__dict__.setdefault("_reranked", {})
    order = recent.get((stage, message, keys))
    if order is not None:
        return order
    kind, field = STAGES[stage]
    said = [_said(k) for k in keys]
    try:
        order = _ask(reranker, stage, message, keys, texts)
    except Exception as exc:  # noqa: BLE001 - any failure of the reranker is an event, never a failed turn
        session.emit("rerank_failed", model=reranker.name, stage=stage, message=message, **{field: said},
                     error=_error(exc))
        return None
    session.emit(kind, model=reranker.name, message=message, **{field: said},
                 order=[_said(k) for k in order])
    if len(recent) >= RECENT:
        recent.pop(next(iter(recent)))
    recent[(stage, message, keys)] = order
    return order


def _ask(reranker, stage: str, message: str, keys: tuple, texts: Sequence[str]) -> list:
    """Best score first; ties, and candidates the reranker gave no score, in pager's order. A recorded
    reranker gives the order itself."""
    if isinstance(reranker, Recorded):
        order = reranker.order(stage, message, keys)
        if sorted(order) != sorted(keys):
            raise RerankError("the recorded order is not an order of these candidates")
        return order
    scores = reranker.scores(message, list(texts))
    if len(scores) != len(keys):
        raise ValueError(f"the reranker gave {len(scores)} scores for {len(keys)} {stage}")
    values = [float(s) if s == s else float("-inf") for s in scores]   # a NaN would unsettle the sort
    return [keys[i] for i in sorted(range(len(keys)), key=lambda i: (-values[i], i))]


def rerank_pieces(session, message: str, fused: np.ndarray) -> np.ndarray:
    """The page search's scores with its best `rerank_pieces` pieces reordered: the reranker's first
    takes the best score among them, its second the next, and so on. A piece is named by its page and
    its place there (stable across processes and replays, where piece numbers are this index's)."""
    m = min(session.home.config.rerank_pieces, len(fused))
    if m < 2 or session.home.reranker is None:
        return fused
    top = np.argpartition(-fused, m - 1)[:m]
    top = top[np.lexsort((top, -fused[top]))]          # best first, ties by piece number
    top = top[fused[top] > 0]
    index = session.index
    places = []
    for p in top.tolist():
        n = index.piece_page[p]
        places.append((n, index.page_pieces[n].index(p)))
    keys = tuple(places)
    order = reordered(session, "pieces", message, keys,
                      [" ".join(session.pages[n].piece_text(i).split()) for n, i in keys])
    if order is None:
        return fused
    at = dict(zip(keys, top.tolist()))
    out = fused.copy()
    out[[at[k] for k in order]] = fused[top]
    return out


def rerank_facts(session, message: str, ranked: list[tuple]) -> list[tuple]:
    """`ranked` (best first) with its first `rerank_facts` in the reranker's order."""
    if session.home.reranker is None:
        return ranked
    head = ranked[:session.home.config.rerank_facts]
    order = reordered(session, "facts", message, tuple(f.n for f, _, _ in head), [f.text for f, _, _ in head])
    if order is None:
        return ranked
    by_number = {item[0].n: item for item in head}
    return [by_number[n] for n in order] + ranked[len(head):]


def _error(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def make_reranker(name: str):
    """The reranker a setting names: empty for none, else a litellm rerank model."""
    return LiteLLMReranker(name) if name else None
