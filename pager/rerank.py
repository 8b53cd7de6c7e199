"""A reranker's second opinion on which facts a message is about (`Config.reranker`, off by default).

pager ranks facts by their own match and by the page search's weight of the turn they came from
(`context.rank_facts`); on LoCoMo the evidence facts it misses at small budgets rank 20th–99th
because neither their words nor their turns' words are near the question's ("What outdoor
activities does John enjoy?" → "John started surfing five years ago"). A cross-encoder reading
the question and the fact together is what finds those. An oracle reordering the first
`rerank_candidates` facts (evidence first) bounds what one can gain (BENCHMARKS.md, "Coverage,
seventh round"); no reranker's weights can be had offline here, so pager calls one the user runs:
any litellm rerank model (Cohere, Voyage, Jina, Together, or a local server: `infinity/…`,
`hosted_vllm/…` with an api_base).

Only the order of the first candidates changes; the set of candidates, the split of frames and
the packing are as without it. Each answer is a `facts_reranked` event naming the facts asked
about and the order given, so `pager replay --check` reproduces a session without calling the
reranker (`Recorded`). A reranker that fails, or answers with something that is no order of the
candidates, is a `rerank_failed` event and the facts keep pager's own order: never a failed turn.
"""

from __future__ import annotations

from typing import Protocol, Sequence

RECENT = 32   # answers kept per session: an agent's later steps re-assemble the same message's context


class Reranker(Protocol):
    name: str

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """A relevance score for each document, higher is more relevant (one per document)."""
        ...


class LiteLLMReranker:
    """A litellm rerank model; its answer's results give (index, relevance_score) pairs."""

    def __init__(self, model: str, timeout: float = 30.0) -> None:
        self.name, self.timeout = model, timeout

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


class Recorded:
    """The answers a trace recorded, by (message, the facts asked about): replay calls no reranker."""

    def __init__(self, name: str, events: list[dict]) -> None:
        self.name = name
        self.answers: dict[tuple, tuple[str, list[int] | str]] = {}
        for e in events:
            key = (e.get("message", ""), tuple(e.get("facts", ())))
            if e["kind"] == "facts_reranked":
                self.answers[key] = ("order", list(e["order"]))
            elif e["kind"] == "rerank_failed":
                self.answers[key] = ("error", e.get("error", ""))

    def order(self, message: str, numbers: tuple[int, ...]) -> list[int]:
        kind, answer = self.answers.get((message, numbers), ("error", "the trace recorded no reranker answer"))
        if kind == "error":
            raise RerankError(str(answer))
        return list(answer)  # type: ignore[arg-type]


class RerankError(Exception):
    """A reranker's failure, as the trace recorded it."""


def rerank_facts(session, message: str, ranked: list[tuple]) -> list[tuple]:
    """`ranked` (best first) with its first `rerank_candidates` in the reranker's order; unchanged when
    no reranker is set, or when it fails (a `rerank_failed` event)."""
    reranker = session.home.reranker
    head = ranked[:session.home.config.rerank_candidates]
    if reranker is None or len(head) < 2:
        return ranked
    numbers = tuple(f.n for f, _, _ in head)
    recent = session.__dict__.setdefault("_reranked", {})
    order = recent.get((message, numbers))
    if order is None:
        try:
            order = ask(reranker, message, head, numbers)
        except Exception as exc:  # noqa: BLE001 - any failure of the reranker is an event, never a failed turn
            session.emit("rerank_failed", model=reranker.name, message=message, facts=list(numbers),
                         error=_error(exc))
            return ranked
        session.emit("facts_reranked", model=reranker.name, message=message, facts=list(numbers), order=order)
        if len(recent) >= RECENT:
            recent.pop(next(iter(recent)))
        recent[(message, numbers)] = order
    by_number = {item[0].n: item for item in head}
    return [by_number[n] for n in order] + ranked[len(head):]


def ask(reranker, message: str, head: list[tuple], numbers: tuple[int, ...]) -> list[int]:
    """The candidates' numbers in the reranker's order: best score first, ties (and facts it gave no
    score) in pager's order. A recorded reranker gives the order itself."""
    if isinstance(reranker, Recorded):
        order = reranker.order(message, numbers)
        if sorted(order) != sorted(numbers):
            raise RerankError("the recorded order is not an order of these facts")
        return order
    scores = reranker.scores(message, [f.text for f, _, _ in head])
    if len(scores) != len(head):
        raise ValueError(f"the reranker gave {len(scores)} scores for {len(head)} facts")
    values = [float(s) if s == s else float("-inf") for s in scores]   # a NaN would unsettle the sort
    places = sorted(range(len(head)), key=lambda i: (-values[i], i))
    return [numbers[i] for i in places]


def _error(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def make_reranker(name: str):
    """The reranker a setting names: empty for none, else a litellm rerank model."""
    return LiteLLMReranker(name) if name else None
