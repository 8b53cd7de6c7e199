"""`pager bench locomo`: evidence recall inside the assembled context, against baselines.

For each conversation and budget, the whole conversation is ingested (DESIGN.md step 1),
the paging state is checkpointed, and each question starts from that checkpoint: automatic
paging with the question as the message, then context assembly (steps 2 and 3), no model.
A question's recall is the share of its evidence turns whose whole text is inside the
context; all_hit is whether every one is. The budget counts the memory region (map, page
headers, page text) with the named tokenizer. Baselines run in the same loop, same budget,
same tokenizer, rendering turns as `Speaker: text` lines:

- recent: the tail of the conversation that fits;
- bm25:   turns ranked by BM25 (rank-bm25), packed greedily;
- vector: turns ranked by embedding similarity, packed greedily.

With `memory="recorded"` the dataset's own `observation` entries stand in for a memory model's
output: pager takes them as facts (pager.facts, through Session.extract_facts) and shows them in
slabs; bm25 and vector rank them mixed with the turns. Every system then also reports
`coverage`: like recall, but an evidence turn also counts as present when a fact whose source is
that turn is in the context. What counts as a turn present, for recall and coverage alike: its
whole text on a resident page (or across resident pages, for a turn split between them), or an
excerpt of it in a slab (pager.context.Excerpt: an excerpt is only ever a whole turn, so it
counts whole; a turn split across pages is never excerpted). `fact_tokens` is the mean of the tokens facts took. The dataset's
`session_summary` entries are taken as episode summaries (pager.summaries, one per conversation
session, through Session.summarize); `summary_tokens` is the mean of the tokens they took, and
`summary_span` the share of evidence turns inside the turn range of a summary shown (a summary
names its episode, not each turn's words, so coverage does not count it).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import need
from ..config import Config
from ..context import build
from ..embed import make_embedder
from ..facts import Recorded
from ..formats import Conversation, parse_locomo, parse_locomo_observations, parse_locomo_session_summaries
from ..summaries import Recorded as RecordedSummaries
from ..home import memory_home
from ..search import terms
from ..session import Session

HEADLINE = (1, 2, 3, 4)
TARGETS = {2048: 0.90, 8192: 0.97}   # recall the project aims for (cats 1–4), drawn on the plot
SYSTEMS = ("pager", "recent", "bm25", "vector")


@dataclass
class Outcome:
    category: int
    recall: float
    all_hit: bool
    tokens: int
    ms: float
    coverage: float | None = None
    fact_tokens: int = 0
    summary_tokens: int = 0
    summary_span: float = 0.0
    conversation: str = ""
    cpu_ms: float | None = None   # CPU time of the process (pager only): on a shared machine wall time waits for a core
    excerpts: int = 0             # excerpt lines shown (pager with --excerpts)


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    def summary(self) -> dict:
        head = [o for o in self.outcomes if o.category in HEADLINE]
        by_cat = {}
        for cat in sorted({o.category for o in self.outcomes}):
            rows = [o for o in self.outcomes if o.category == cat]
            by_cat[str(cat)] = {"recall": _mean([o.recall for o in rows]), "all_hit": _mean([o.all_hit for o in rows]),
                                "n": len(rows)}
        ms = sorted(o.ms for o in self.outcomes) or [0.0]
        memory: dict[str, float] = {}
        if self.outcomes and self.outcomes[0].coverage is not None:
            memory = {"coverage": _mean([o.coverage or 0.0 for o in head]),
                      "fact_tokens": round(_mean([o.fact_tokens for o in self.outcomes]), 1),
                      "summary_tokens": round(_mean([o.summary_tokens for o in self.outcomes]), 1),
                      "summary_span": _mean([o.summary_span for o in head]),
                      "excerpts": round(_mean([o.excerpts for o in self.outcomes]), 2)}
            for label, row in by_cat.items():
                row["coverage"] = _mean([o.coverage or 0.0 for o in self.outcomes if str(o.category) == label])
        by_conversation = {}   # a change should hold on each conversation, not only on the mean
        for conv in dict.fromkeys(o.conversation for o in head):
            rows = [o for o in head if o.conversation == conv]
            by_conversation[conv] = {"recall": _mean([o.recall for o in rows]), "n": len(rows),
                                     **({"coverage": _mean([o.coverage or 0.0 for o in rows])} if memory else {})}
        return {
            "recall": _mean([o.recall for o in head]),
            **memory,
            "all_hit": _mean([o.all_hit for o in head]),
            "n": len(head),
            "mean_tokens": round(_mean([o.tokens for o in self.outcomes]), 1),
            "p50_ms": round(_percentile(ms, 50), 3),
            "p95_ms": round(_percentile(ms, 95), 3),
            **({"p95_cpu_ms": round(_percentile(sorted(o.cpu_ms or 0.0 for o in self.outcomes), 95), 3)}
               if self.outcomes and self.outcomes[0].cpu_ms is not None else {}),
            "by_category": by_cat,
            "by_conversation": by_conversation,
        }


def _mean(values) -> float:
    values = list(values)
    return round(sum(values) / len(values), 4) if values else 0.0


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    k = (len(sorted_values) - 1) * q / 100
    lo, hi = int(k), min(int(k) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def covered(spans: list[tuple[int, int]], length: int) -> bool:
    """Do the (start, end) character spans cover [0, length) without a gap?"""
    reach = 0
    for start, end in sorted(spans):
        if start > reach:
            return False
        reach = max(reach, end)
    return reach >= length


def turns_in_context(session: Session, pages: list[int]) -> dict[int, list[tuple[int, int]]]:
    """turn number → character spans of it inside the shown pages."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for n in pages:
        if n == session.tail_n:
            for piece in session.packer.pieces:
                spans.setdefault(piece.turn.turn, []).append((piece.start, piece.end))
        else:
            for turn, start, end in session.pages[n].spans:
                spans.setdefault(turn, []).append((start, end))
    return spans


def context_spans(session: Session, ctx, lengths: dict[int, int]) -> dict[int, list[tuple[int, int]]]:
    """turn number → character spans of it inside the context: on the shown pages, and whole for each
    turn shown as an excerpt (an excerpt line is only ever a whole turn)."""
    spans = turns_in_context(session, ctx.pages)
    for t in ctx.excerpts:
        spans.setdefault(t, []).append((0, lengths[t]))
    return spans


def score(evidence: list[int], lengths: dict[int, int], inside: Callable[[int], list[tuple[int, int]]]) -> tuple[float, bool]:
    hits = [covered(inside(t), lengths[t]) for t in evidence]
    return (sum(hits) / len(hits), all(hits)) if hits else (0.0, False)


# -- baselines -----------------------------------------------------------------------------------------
class Baselines:
    """Turn-level systems over one conversation, packed into the same budget."""

    def __init__(self, session: Session, conv: Conversation, turn_numbers: list[int],
                 facts: list[tuple[str, tuple[int, ...]]] | None = None) -> None:
        BM25Okapi = need("rank_bm25", "the BM25 baseline (or --no-baselines)").BM25Okapi

        self.tokenizer = session.tokenizer
        self.numbers = turn_numbers
        self.lines = [f"{m['speaker']}: {m['text']}" for m in conv.messages]
        self.turn_items = len(self.lines)
        facts = facts or []
        self.sources = [(t,) for t in turn_numbers] + [turns for _, turns in facts]  # the turns each item holds
        self.lines += [f"- {text}" for text, _ in facts]
        self.costs = [self.tokenizer.count(line) for line in self.lines]
        self.bm25 = BM25Okapi([terms(line) or ["∅"] for line in self.lines])
        self.embedder = session.home.embedder
        self.vectors = self.embedder.embed(self.lines)

    def rank(self, system: str, question: str) -> list[int]:
        if system == "recent":
            return list(range(self.turn_items - 1, -1, -1))
        if system == "bm25":
            scores = self.bm25.get_scores(terms(question) or ["∅"])
        else:
            scores = self.vectors @ self.embedder.embed([question])[0]
        return list(np.argsort(-np.asarray(scores), kind="stable"))

    def pack(self, order: list[int], budget: int) -> tuple[list[int], int]:
        """Greedy: take turns in rank order while they fit; render in conversation order."""
        chosen: list[int] = []
        used = 0
        for i in order:
            cost = self.costs[i] + (1 if chosen else 0)
            if used + cost <= budget:
                chosen.append(i)
                used += cost
        chosen.sort()
        text = "\n".join(self.lines[i] for i in chosen)
        tokens = self.tokenizer.count(text)
        while tokens > budget and chosen:  # the newline estimate was off: drop the last-ranked turn
            chosen.remove(next(i for i in reversed(order) if i in chosen))
            text = "\n".join(self.lines[i] for i in chosen)
            tokens = self.tokenizer.count(text)
        return chosen, tokens


# -- vectors kept on disk across runs ---------------------------------------------------------------------
class VectorCache:
    """An embedder's vectors kept in a file by the hash of the embedder's name and the text
    (`--vector-cache FILE`): a second run over the same conversations embeds only what it had not.
    With minilm the encoder is most of a run's cost: on the development split a rerun took a quarter
    of the first run's CPU (BENCHMARKS.md, "A sentence encoder offline"), so a change to the search
    is measured on both halves of the split in minutes. The vectors are the embedder's own, stored
    as float32: a cached run reports what a fresh one does."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.vectors: dict[bytes, np.ndarray] = {}
        self.added = 0
        if self.path.is_file():
            try:
                with np.load(self.path) as held:
                    self.vectors = {row.tobytes(): vector for row, vector in zip(held["keys"], held["vectors"])}
            except (OSError, ValueError, KeyError) as exc:
                from ..errors import InputError

                raise InputError(f"--vector-cache {self.path} is not a vector cache ({exc}); remove it or name "
                                 "another file") from None

    @staticmethod
    def key(name: str, text: str) -> bytes:
        import hashlib

        return hashlib.blake2b(f"{name}\0{text}".encode(), digest_size=16).digest()

    def wrap(self, embedder) -> Callable[[], None]:
        """Route embedder.embed through the cache; returns what puts the embedder back as it was."""
        embed, name, vectors = embedder.embed, embedder.name, self.vectors

        def cached(texts):
            keys = [self.key(name, t) for t in texts]
            missing = list(dict.fromkeys(k for k in keys if k not in vectors))
            if missing:
                where = {k: t for k, t in zip(keys, texts)}
                for k, v in zip(missing, embed([where[k] for k in missing])):
                    vectors[k] = np.asarray(v, dtype=np.float32)
                self.added += len(missing)
            if not keys:
                return embed(texts)
            return np.stack([vectors[k] for k in keys])

        own = embedder.__dict__.get("embed")   # an embed set on the instance itself, given back as it was

        def restore() -> None:
            if own is None:
                embedder.__dict__.pop("embed", None)
            else:
                embedder.embed = own

        embedder.embed = cached
        return restore

    def save(self) -> None:
        if not self.added:
            return
        keys = list(self.vectors)
        temporary = self.path.with_name(self.path.name + ".part.npz")
        np.savez(temporary, keys=np.frombuffer(b"".join(keys), dtype=np.uint8).reshape(len(keys), 16),
                 vectors=np.stack([self.vectors[k] for k in keys]))
        temporary.replace(self.path)


# -- the run --------------------------------------------------------------------------------------------
ORACLE = "oracle"   # --reranker oracle: the bench's own reranker, knowing each question's evidence


class Oracle:
    """An upper bound on any reranker: the pieces and facts holding one of the question's evidence turns
    first, the rest after, each in pager's order. It reads the answer key, so it measures what
    reordering the candidates could gain, never pager's recall; the report names it."""

    name = ORACLE

    def __init__(self, session) -> None:
        self.session, self.evidence = session, set[int]()
        self._turns: tuple[int, int, dict[str, set[int]]] = (-1, -1, {})

    def scores(self, query: str, documents) -> list[float]:
        turns = self.turns()
        return [1.0 if turns.get(text, set()) & self.evidence else 0.0 for text in documents]

    def turns(self) -> dict[str, set[int]]:
        """A text as the reranker is told it (a fact's, a piece's with its spaces made single) → its turns."""
        s = self.session
        if self._turns[:2] != (len(s.pages), len(s.facts)):
            turns: dict[str, set[int]] = {}
            for page in s.pages.values():
                for i, (turn, _, _) in enumerate(page.spans):
                    turns.setdefault(" ".join(page.piece_text(i).split()), set()).add(turn)
            for f in s.facts.items:
                turns.setdefault(f.text, set()).update(f.turns)
            self._turns = (len(s.pages), len(s.facts), turns)
        return self._turns[2]


def evaluate(conv: Conversation, budget: int, config: Config, tallies: dict[str, Tally], baselines: bool,
             on_question: Callable[[], None] = lambda: None, written: dict | None = None,
             errors: list[str] | None = None, recorded: list | None = None, episodes: list | None = None,
             rerank_errors: list[str] | None = None) -> None:
    """One conversation at one budget. With a bookmark model, its bookmarks are written once per
    conversation (pages do not depend on the budget) and kept in `written` for the other budgets;
    the model's failures go to `errors`."""
    written = {} if written is None else written
    with tempfile.TemporaryDirectory(prefix="pager-bench-") as folder:
        home = memory_home(config.with_(home=Path(folder), budget=budget, session=conv.sample_id))
        session = home.open()
        oracle = Oracle(session) if config.reranker == ORACLE else None
        if oracle is not None:
            home.reranker = oracle
        if rerank_errors is not None:   # a failing reranker leaves pager's order: the report says how often
            failed = rerank_errors

            def note(e) -> None:
                if e.kind == "rerank_failed":
                    failed.append(e.data["error"])

            session.events.listeners.append(note)
        turns = session.append_many(conv.messages)
        if config.bookmark_model:
            if conv.sample_id in written:
                session.apply_written(written[conv.sample_id])
            else:
                written[conv.sample_id] = session.write_bookmarks(force=True)
                if session.writer_error and errors is not None:
                    errors.append(f"{conv.sample_id}: {session.writer_error}")
        number = {t.ref: t.turn for t in turns}
        lengths = {t.turn: len(t.text) for t in turns}
        facts = session.extract_facts(Recorded(recorded, number)) if recorded is not None else []
        if episodes:
            session.summarize(RecordedSummaries(episodes, number))
        checkpoint = session.paging_state()
        base = Baselines(session, conv, [t.turn for t in turns], [(f.text, f.turns) for f in facts]) if baselines else None
        for q in conv.questions:
            evidence = [number[r] for r in q.evidence if r in number]
            if not evidence:
                on_question()
                continue
            session.load_paging_state(checkpoint)
            if oracle is not None:
                oracle.evidence = set(evidence)
            started, cpu = time.perf_counter(), time.process_time()
            ctx = build(session, q.question, budget=budget, chat=False)
            ms, cpu = (time.perf_counter() - started) * 1000, (time.process_time() - cpu) * 1000
            spans = context_spans(session, ctx, lengths)
            recall, all_hit = score(evidence, lengths, lambda t: spans.get(t, []))  # noqa: B023 - called at once
            outcome = Outcome(q.category, recall, all_hit, ctx.tokens["memory"], ms, conversation=conv.sample_id,
                              cpu_ms=cpu, excerpts=len(ctx.excerpts))
            if recorded is not None:
                told = {t for n in ctx.facts for t in session.facts.items[n - 1].turns}
                outcome.coverage = score(evidence, lengths, lambda t: [(0, lengths[t])] if t in told  # noqa: B023
                                         else spans.get(t, []))[0]  # noqa: B023
                outcome.fact_tokens = ctx.tokens["facts"]
                outcome.summary_tokens = ctx.tokens.get("summaries", 0)
                ranges = [session.summaries.items[n - 1].turns for n in ctx.summaries]
                outcome.summary_span = sum(any(a <= t <= b for a, b in ranges) for t in evidence) / len(evidence)
            tallies["pager"].outcomes.append(outcome)
            if base is not None:
                for system in ("recent", "bm25", "vector"):
                    started = time.perf_counter()
                    chosen, tokens = base.pack(base.rank(system, q.question), budget)
                    ms = (time.perf_counter() - started) * 1000
                    inside = {base.numbers[i] for i in chosen if i < base.turn_items}
                    recall, all_hit = score(evidence, lengths,
                                            lambda t: [(0, lengths[t])] if t in inside else [])  # noqa: B023
                    outcome = Outcome(q.category, recall, all_hit, tokens, ms, conversation=conv.sample_id)
                    if recorded is not None:
                        told = {t for i in chosen for t in base.sources[i]}
                        outcome.coverage = score(evidence, lengths,
                                                 lambda t: [(0, lengths[t])] if t in told else [])[0]  # noqa: B023
                        outcome.fact_tokens = sum(base.costs[i] for i in chosen if i >= base.turn_items)
                    tallies[system].outcomes.append(outcome)
            on_question()
        home.journal.close(remove=True)


def run(data: Path, budgets: list[int], config: Config | None = None, limit_conversations: int | None = None,
        limit_questions: int | None = None, baselines: bool = True, progress: bool = True, memory: str = "",
        vector_cache: Path | None = None) -> dict:
    """The report of pager and the baselines at each budget. vector_cache: a file keeping the embedder's
    vectors across runs (VectorCache)."""
    config = config or Config(embedder="wordllama")
    if vector_cache is None:
        return _run(data, budgets, config, limit_conversations, limit_questions, baselines, progress, memory)
    cache = VectorCache(vector_cache)
    restore = cache.wrap(make_embedder(config.embedder))
    try:
        return _run(data, budgets, config, limit_conversations, limit_questions, baselines, progress, memory)
    finally:
        restore()
        cache.save()


def _run(data: Path, budgets: list[int], config: Config, limit_conversations: int | None,
         limit_questions: int | None, baselines: bool, progress: bool, memory: str) -> dict:
    conversations = parse_locomo(data)[:limit_conversations]
    if memory == "recorded":   # the dataset's own observations, or a memory model's (bench/producer.py)
        observations = parse_locomo_observations(data)
    else:
        from .producer import read

        observations = read(Path(memory)) if memory else {}
    episodes = parse_locomo_session_summaries(data) if memory else {}
    if limit_questions:
        for conv in conversations:
            conv.questions = conv.questions[:limit_questions]
    make_embedder(config.embedder)  # load once, outside the timings
    total = sum(len(c.questions) for c in conversations) * len(budgets)
    results = []
    written: dict = {}   # the bookmark model's answers per conversation, reused across budgets
    errors: list[str] = []
    rerank_errors: list[str] = []
    bar = _progress(progress)
    with bar:
        task = bar.add_task("questions", total=total)
        for budget in budgets:
            tallies = {name: Tally() for name in SYSTEMS}
            for conv in conversations:
                bar.update(task, description=f"budget {budget} · {conv.sample_id}")
                evaluate(conv, budget, config, tallies, baselines, lambda: bar.advance(task), written, errors,
                         observations.get(conv.sample_id, []) if memory else None,
                         episodes.get(conv.sample_id, []), rerank_errors)
            summaries = {name: t.summary() for name, t in tallies.items() if t.outcomes}
            results.append({"budget": budget, "pager": summaries.pop("pager"), "baselines": summaries})
    return {
        "dataset": Path(data).name,
        "tokenizer": config.encoding,
        "page_tokens": config.page_tokens,
        "policy": config.policy or "clock",
        "embedder": config.embedder,
        "fill": config.fill,
        **({"memory": memory if memory == "recorded" else Path(memory).name, "fact_share": config.fact_share, "summary_share": config.summary_share,
            "excerpt_slabs": config.excerpt_slabs} if memory else {}),
        **({"reranker": config.reranker, "rerank_pieces": config.rerank_pieces, "rerank_facts": config.rerank_facts,
            "reranker_failures": len(rerank_errors), "reranker_error": rerank_errors[0] if rerank_errors else ""}
           if config.reranker else {}),
        **({"bookmark_model": config.bookmark_model, "bookmark_model_errors": errors}
           if config.bookmark_model else {}),
        "conversations": [c.sample_id for c in conversations],
        "results": results,
    }


def _progress(enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=not enabled, transient=True)


def table(report: dict):
    """The result as a rich table: recall (all-hit) per system and budget, then pager by category."""
    from rich.table import Table

    t = Table(title=f"LoCoMo evidence recall, cats 1–4 ({report['dataset']}, {report['tokenizer']})", title_justify="left")
    t.add_column("budget", justify="right")
    for name in SYSTEMS:
        t.add_column(name, justify="right")
    t.add_column("pager − best", justify="right")
    t.add_column("pager p95 ms (cpu)", justify="right")
    for row in report["results"]:
        cells = [str(row["budget"]), f"{row['pager']['recall']:.3f} ({row['pager']['all_hit']:.2f})"]
        best = 0.0
        for name in SYSTEMS[1:]:
            b = row["baselines"].get(name)
            cells.append(f"{b['recall']:.3f} ({b['all_hit']:.2f})" if b else "–")
            best = max(best, b["recall"] if b else 0.0)
        cells.append(f"{row['pager']['recall'] - best:+.3f}" if row["baselines"] else "–")
        cpu = row["pager"].get("p95_cpu_ms")
        cells.append(f"{row['pager']['p95_ms']:.1f}" + (f" ({cpu:.1f})" if cpu is not None else ""))
        t.add_row(*cells)
    cats = Table(title="by category (recall) — 1 multi-hop · 2 temporal · 3 open-domain · 4 single-hop · 5 adversarial",
                 title_justify="left")
    cats.add_column("budget", justify="right")
    cats.add_column("system")
    for c in ("1", "2", "3", "4", "5"):
        cats.add_column(f"cat {c}", justify="right")
    for row in report["results"]:
        for name in SYSTEMS:
            summary = row["pager"] if name == "pager" else row["baselines"].get(name)
            if summary:
                cells = [f"{summary['by_category'].get(c, {}).get('recall', 0):.3f}" for c in ("1", "2", "3", "4", "5")]
                cats.add_row(str(row["budget"]), name, *cells)
    return t, cats


def plot(report: dict, out: Path) -> None:
    """Recall against budget, pager and baselines, to a PNG."""
    import logging

    matplotlib = need("matplotlib", "a plot")
    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib.pyplot as plt

    budgets = [r["budget"] for r in report["results"]]
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for name, style in zip(SYSTEMS, ("o-", "s--", "^--", "v--")):
        ys = [(r["pager"] if name == "pager" else r["baselines"].get(name, {})).get("recall") for r in report["results"]]
        if all(y is not None for y in ys):
            ax.plot(budgets, ys, style, label=name, linewidth=2.5 if name == "pager" else 1.2)
    targets = [(b, TARGETS[b]) for b in budgets if b in TARGETS]
    if targets:
        ax.plot(*zip(*targets), "k*", markersize=11, label="target (issue 3)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [str(b) for b in budgets])
    ax.set_xlabel("memory budget (tokens)")
    ax.set_ylabel("evidence recall, LoCoMo cats 1–4")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(0.01, 0.36))
    ax.set_title(f"{report['dataset']}: recall vs budget")
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
