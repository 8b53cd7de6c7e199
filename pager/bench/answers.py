"""`pager bench answers`: LoCoMo questions answered by a real model, end to end, from each system's context.

`pager bench locomo` asks whether the evidence is inside the prompt; this asks whether the model then
answers. Each question goes to one model (any litellm model; on this machine, a local one behind an
OpenAI-compatible server) with the context each system assembles under the same prompt budget, and
the answer is scored against the dataset's with LoCoMo's own token F1 (task_eval/evaluation.py) and a
containment score. Systems:

- pager:       the agent loop with automatic paging only (no tools offered): the question faults in
               what its words find, the model answers from the assembled prompt (a reply holding call
               syntax is sent back with a note, within the same `tool_steps`);
- pager-tools: the same loop with the paging tools offered too (search, page_in, …), up to
               `tool_steps` model calls; tool calls written as text are read and run (pager.textcalls);
- recent:      the newest turns that fit, oldest first;
- bm25:        turns ranked by BM25 against the question, packed greedily, in conversation order.

The budget is the whole prompt each system sends, counted with pager's tokenizer: for pager the
agent's budget (system prompt, memory, message, tool schemas), for a baseline its system prompt,
the turns it packed (each `[date] Speaker: text`, so dated questions can be answered), the question
and the chat framing. Every question starts from a fresh home holding the whole conversation, so
no question sees another's turns. The questions are cats 1–4 of each chosen conversation in an
order fixed by a hash of the conversation and question (the same sample on every machine, tuned to
none), the first `per_conversation` of them.

Answers are kept in a JSONL file as they come (`cache`): a run cut short reports what it has, and
the same command goes on where it stopped. A model call takes about a minute over a 2K prompt on
this machine's CPU (Qwen2.5 1.5B, 2 cores), so a run is sized in questions, not conversations.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from . import need
from .locomo import HEADLINE, Baselines, context_spans, score
from ..agent import Agent
from ..config import Config
from ..context import MESSAGE_OVERHEAD, REPLY_PRIMING
from ..formats import Conversation, Question, parse_locomo
from ..home import memory_home
from ..model import Model
from ..prompts import load
from ..textcalls import looks_like_call
from ..tools import MODEL
from ..trace import TraceWriter, begin, end

SYSTEMS = ("pager", "pager-tools", "recent", "bm25")
PAGING = {"pager": "automatic", "pager-tools": "tools"}
DATED = " Use the dates of the conversation to answer with an approximate date."   # LoCoMo's hint for cat 2


# -- LoCoMo's scoring (task_eval/evaluation.py), and containment -------------------------------------------
def normalize(text: str) -> str:
    """LoCoMo's normalize_answer: commas dropped, lower case, punctuation and articles out, single spaces."""
    text = str(text).replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    return " ".join(re.sub(r"\b(a|an|the|and)\b", " ", text).split())


_stemmer = None


def _stems(text: str) -> list[str]:
    global _stemmer
    if _stemmer is None:
        _stemmer = need("nltk.stem", "LoCoMo's answer F1 (its Porter stemmer)").PorterStemmer()
    return [_stemmer.stem(word) for word in normalize(text).split()]


def token_f1(prediction: str, truth: str) -> float:
    said, wanted = _stems(prediction), _stems(truth)
    same = sum((Counter(said) & Counter(wanted)).values())
    if not same:
        return 0.0
    precision, recall = same / len(said), same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def _parts(answer: str, category: int) -> list[str]:
    """The answers a prediction is scored against: cat 1 (multi-hop) lists them with commas; cat 3 keeps
    the first of its `;` alternatives."""
    if category == 1:
        return [part.strip() for part in answer.split(",") if part.strip()] or [answer]
    return [answer.split(";")[0].strip() if category == 3 else answer]


def answer_f1(prediction: str, answer: str, category: int) -> float:
    """LoCoMo's F1 for cats 1–4: cat 1 is the mean over its answers of the best over the prediction's
    comma-separated parts; the others are one token F1."""
    if category == 1:
        said = [part.strip() for part in prediction.split(",")]
        return sum(max(token_f1(p, a) for p in said) for a in _parts(answer, 1)) / len(_parts(answer, 1))
    return token_f1(prediction, _parts(answer, category)[0])


def containment(prediction: str, answer: str, category: int) -> float:
    """The share of the answer's parts whose normalized words appear, in order and whole, in the
    normalized prediction (a long but right answer scores 1 where F1 punishes its length)."""
    said = f" {normalize(prediction)} "
    parts = [normalize(p) for p in _parts(answer, category)]
    return sum(bool(p) and f" {p} " in said for p in parts) / len(parts)


# -- the questions -------------------------------------------------------------------------------------------
def sample(conversations: list[Conversation], per_conversation: int) -> list[tuple[Conversation, Question]]:
    """The first per_conversation cats 1–4 questions (with evidence in the conversation) of each, in hash order."""
    chosen = []
    for conv in conversations:
        refs = {m["ref"] for m in conv.messages}
        usable = [q for q in conv.questions if q.category in HEADLINE and q.answer and set(q.evidence) & refs]
        usable.sort(key=lambda q: hashlib.sha256(f"{conv.sample_id}\n{q.question}".encode()).hexdigest())
        chosen += [(conv, q) for q in usable[:per_conversation]]
    return chosen


@dataclass
class Answer:
    system: str
    budget: int
    conversation: str
    category: int
    question: str
    answer: str
    output: str = ""
    f1: float = 0.0
    contains: float = 0.0
    recall: float = 0.0        # the share of the evidence turns whole inside the first prompt
    steps: int = 1             # model calls
    tool_calls: int = 0        # pager's tools run (written as tool calls or as text)
    calls_in_text: int = 0     # replies whose tool calls were written as text, read and run
    unread: int = 0            # replies holding call syntax pager could not run, sent back with a note
    raw_call: bool = False     # the answer shown still holds tool-call syntax (a target: never)
    error: str = ""            # the model failed; the turn was kept, no answer
    crashed: str = ""          # an exception escaped the loop (a target: never)
    prompt_tokens: int = 0     # of the first model call, counted by pager's tokenizer
    seconds: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.system}|{self.budget}|{self.conversation}|{self.question}"


def _message(q: Question) -> str:
    return q.question + (DATED if q.category == 2 else "")


# -- each system's answer --------------------------------------------------------------------------------
def _pager(conv: Conversation, q: Question, system: str, budget: int, config: Config, model: Model,
           tool_steps: int, traces: Path | None) -> Answer:
    out = Answer(system, budget, conv.sample_id, q.category, q.question, q.answer)
    with tempfile.TemporaryDirectory(prefix="pager-answers-") as folder:
        home = memory_home(config.with_(home=Path(folder), budget=budget, session=conv.sample_id))
        session = home.open()
        turns = session.append_many(conv.messages)
        number = {t.ref: t.turn for t in turns}
        lengths = {t.turn: len(t.text) for t in turns}
        evidence = [number[r] for r in q.evidence if r in number]
        kinds: Counter[str] = Counter()
        requests: list[int] = []
        def heard(e) -> None:
            kinds.update([e.kind])
            if e.kind == "model_request":
                requests.append(e.data["tokens"]["total"])

        session.events.listeners.append(heard)
        writer = None
        if traces is not None:
            name = f"{conv.sample_id}_{budget}_{system}_{hashlib.sha256(q.question.encode()).hexdigest()[:8]}.jsonl"
            writer = TraceWriter(traces / name, note=f"pager bench answers: {system} at {budget} tokens, "
                                                     f"{conv.sample_id}: {q.question}")
            session.events.listeners.append(writer)
        agent = Agent(session, model, paging=PAGING[system], max_steps=tool_steps)
        first: list = []
        agent.on_context = lambda ctx: first.append(ctx) if not first else None
        if writer is not None:
            begin(session, model.name, agent.budget)
        reply = agent.ask(_message(q), instructions=load("answer_short").strip())
        if writer is not None:
            end(session)
            writer.close()
        if first and evidence:
            spans = context_spans(session, first[0], lengths)
            out.recall = score(evidence, lengths, lambda t: spans.get(t, []))[0]
        out.output = reply.text if not reply.error else ""
        out.error, out.steps = reply.error, reply.steps
        out.tool_calls, out.calls_in_text, out.unread = kinds["tool_call"], kinds["calls_in_text"], kinds["reply_unread"]
        out.prompt_tokens = requests[0] if requests else 0
        home.journal.close(remove=True)
    return out


class _Turns:
    """One conversation's baselines, built once and asked per question."""

    def __init__(self, conv: Conversation, config: Config) -> None:
        self.folder = tempfile.TemporaryDirectory(prefix="pager-answers-")
        self.home = memory_home(config.with_(home=Path(self.folder.name), session=conv.sample_id))
        self.session = self.home.open()
        turns = self.session.append_many(conv.messages)
        self.number = {t.ref: t.turn for t in turns}
        self.lengths = {t.turn: len(t.text) for t in turns}
        dated = [dict(m, text=f"[{m.get('date', '')}] {m['text']}") if m.get("date") else m for m in conv.messages]
        self.baselines = Baselines(self.session, Conversation(conv.sample_id, dated), [t.turn for t in turns])

    def close(self) -> None:
        self.home.journal.close(remove=True)
        self.folder.cleanup()

    def answer(self, conv: Conversation, q: Question, system: str, budget: int, model: Model) -> Answer:
        out = Answer(system, budget, conv.sample_id, q.category, q.question, q.answer)
        base, count = self.baselines, self.session.tokenizer.count
        message = _message(q)
        head = load("answer_from_turns").strip()
        instructions = load("answer_short").strip()
        fixed = count(f"{head}\n\n\n\n{instructions}") + count(message) + 2 * MESSAGE_OVERHEAD + REPLY_PRIMING
        chosen, _ = base.pack(base.rank(system, message), max(0, budget - fixed))
        system_prompt = f"{head}\n\n" + "\n".join(base.lines[i] for i in chosen) + f"\n\n{instructions}"
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": message}]
        out.prompt_tokens = count(system_prompt) + count(message) + 2 * MESSAGE_OVERHEAD + REPLY_PRIMING
        inside = {base.numbers[i] for i in chosen}
        evidence = [self.number[r] for r in q.evidence if r in self.number]
        out.recall = score(evidence, self.lengths, lambda t: [(0, self.lengths[t])] if t in inside else [])[0]
        try:
            out.output = model.complete(messages, []).text
        except Exception as exc:  # noqa: BLE001 - the model failed (pager.errors.ModelError and the like)
            out.error = " ".join(str(exc).split())[:300]
        return out


# -- the run --------------------------------------------------------------------------------------------------
def _scored(out: Answer, tools: set[str]) -> Answer:
    out.f1 = answer_f1(out.output, out.answer, out.category) if out.output else 0.0
    out.contains = containment(out.output, out.answer, out.category) if out.output else 0.0
    out.raw_call = bool(out.output) and looks_like_call(out.output, tools)
    return out


def _cached(path: Path | None) -> dict[str, Answer]:
    if path is None or not path.exists():
        return {}
    done = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            answer = Answer(**json.loads(line))
        except (ValueError, TypeError):
            continue   # a torn last line of a run cut short
        done[answer.key] = answer
    return done


def run(data: Path, model: Model, budgets: list[int], systems: Iterable[str] = SYSTEMS,
        conversations: list[str] | None = None, per_conversation: int = 6, tool_steps: int = 4,
        tools_budgets: list[int] | None = None, config: Config | None = None, cache: Path | None = None,
        traces: Path | None = None, on_answer: Callable[[Answer, int, int], None] = lambda a, i, n: None,
        tools_questions: int | None = None) -> dict:
    """Ask every sampled question of every system at every budget (pager-tools only at tools_budgets,
    default all, and only the first tools_questions of the sample, default all: a question with tools
    takes several model calls); answers already in cache are kept, not asked again."""
    config = config or Config(embedder="wordllama")
    systems = [s for s in SYSTEMS if s in set(systems)]
    convs = parse_locomo(data)
    if conversations:
        convs = [c for c in convs if c.sample_id in conversations]
    questions = sample(convs, per_conversation)
    tools = {t["function"]["name"] for t in MODEL.schemas()}
    done = _cached(cache)
    if traces is not None:
        traces.mkdir(parents=True, exist_ok=True)
    with_tools = {id(q) for _, q in questions[:tools_questions]}
    plan = [(conv, q, system, budget) for budget in sorted(set(budgets), reverse=True)
            for conv, q in questions for system in systems
            if system != "pager-tools" or (tools_budgets is None or budget in tools_budgets) and id(q) in with_tools]
    answers: list[Answer] = []
    turns: dict[str, _Turns] = {}
    try:
        for i, (conv, q, system, budget) in enumerate(plan):
            key = Answer(system, budget, conv.sample_id, q.category, q.question, q.answer).key
            if key in done:
                answers.append(done[key])
                on_answer(done[key], i + 1, len(plan))
                continue
            started = time.perf_counter()
            try:
                if system in PAGING:
                    out = _pager(conv, q, system, budget, config, model, tool_steps, traces)
                else:
                    if conv.sample_id not in turns:
                        turns[conv.sample_id] = _Turns(conv, config)
                    out = turns[conv.sample_id].answer(conv, q, system, budget, model)
            except Exception as exc:  # noqa: BLE001 - counted, never hidden: a target is none at all
                out = Answer(system, budget, conv.sample_id, q.category, q.question, q.answer,
                             crashed=f"{type(exc).__name__}: {exc}"[:300])
            out.seconds = round(time.perf_counter() - started, 2)
            answers.append(_scored(out, tools))
            if cache is not None:
                with cache.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(asdict(out)) + "\n")
            on_answer(out, i + 1, len(plan))
    finally:
        for t in turns.values():
            t.close()
    return report(answers, model.name, data, questions, config)


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0


def summarize(answers: list[Answer]) -> dict:
    by_category: dict[int, list[Answer]] = {}
    for a in answers:
        by_category.setdefault(a.category, []).append(a)
    return {
        "questions": len(answers),
        "f1": _mean([a.f1 for a in answers]),
        "contains": _mean([a.contains for a in answers]),
        "recall": _mean([a.recall for a in answers]),
        "f1_by_category": {str(c): _mean([a.f1 for a in group]) for c, group in sorted(by_category.items())},
        "raw_call_answers": sum(a.raw_call for a in answers),
        "crashed": sum(bool(a.crashed) for a in answers),
        "no_answer": sum(bool(a.error) for a in answers),
        "model_calls": sum(a.steps for a in answers if not a.crashed),
        "tool_calls": sum(a.tool_calls for a in answers),
        "calls_in_text": sum(a.calls_in_text for a in answers),
        "unread_replies": sum(a.unread for a in answers),
        "prompt_tokens": round(_mean([a.prompt_tokens for a in answers])),
        "seconds_per_question": round(_mean([a.seconds for a in answers]), 1),
    }


def report(answers: list[Answer], model: str, data: Path, questions: list, config: Config) -> dict:
    results = []
    for budget in sorted({a.budget for a in answers}):
        here = [a for a in answers if a.budget == budget]
        results.append({"budget": budget, "systems": {s: summarize([a for a in here if a.system == s])
                                                      for s in SYSTEMS if any(a.system == s for a in here)}})
    return {
        "dataset": Path(data).name,
        "model": model,
        "tokenizer": config.encoding,
        "page_tokens": config.page_tokens,
        "conversations": sorted({c.sample_id for c, _ in questions}),
        "questions": len(questions),
        "categories": dict(sorted(Counter(str(q.category) for _, q in questions).items())),
        "results": results,
        "answers": [asdict(a) for a in answers],
    }


def table(report: dict):
    from rich.table import Table

    out = Table(title=f"answers of {report['model']} · {report['questions']} LoCoMo questions "
                      f"({', '.join(report['conversations'])}; cats {report['categories']})")
    for column in ("budget", "system", "F1", "contains", "recall", "raw calls", "crashed", "no answer",
                   "model calls", "tool calls", "s / question"):
        out.add_column(column, justify="left" if column == "system" else "right")
    for result in report["results"]:
        for system, s in result["systems"].items():
            out.add_row(f"{result['budget']:,}", system, f"{s['f1']:.3f}", f"{s['contains']:.3f}", f"{s['recall']:.3f}",
                        str(s["raw_call_answers"]), str(s["crashed"]), str(s["no_answer"]), str(s["model_calls"]),
                        str(s["tool_calls"]), f"{s['seconds_per_question']:.1f}")
    return out
