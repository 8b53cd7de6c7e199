"""The memory model: one call per sealed batch of pages returns their bookmarks AND the memory
operations they call for (facts to add, update or invalidate; working-state keys to set or unset).

It is the bookmark writer widened, not a second model call: the prompt shows the pages (each line
with its turn number), the *current* facts most similar to them, with ids (the update decision
is made against those, as the best fact stores make it), and the working state. The answer is
data, not trusted: `parse` keeps what is valid (a JSON object found inside code fences or before
trailing text; items of the wrong type, unknown fact ids, turns not on these pages, overlong text
are left out) and says what it left out in `rejected`, which the session records as one event.
A model that fails or times out raises; the session turns that into a `memory_error` event.

When episodes of the conversation closed (a live session, `Session.write_memory`), the same call
also asks for each one's summary and the rolling summary's next version (prompts/memory_summaries.txt):
still one call, made once per closed episode at most, never per turn.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from pager.prompts import render

from .errors import InputError
from .facts import Draft, Fact, Facts
from .model import Model, ModelReply
from .page import Page
from .search import terms
from .state import check as check_state
from .summaries import EPISODE, ROLLING, Draft as SummaryDraft
from .writer import Call, Written, marks_from

SIMILAR = 8            # current facts shown to the model per batch
MAX_FACT_CHARS = 300
MAX_SUBJECT_CHARS = 60
MAX_SUMMARY_CHARS = 1500      # an episode summary; the rolling one may be twice as long
MAX_EPISODE_LINES = 120       # turns of closed episodes shown besides the batch's pages
OPS = {"add", "update", "invalidate", "none"}
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)
_FACT_ID = re.compile(r"^\s*f?(\d+)\s*$", re.I)
_TURN_ID = re.compile(r"^\s*t?(\d+)\s*$", re.I)


@dataclass
class Answer:
    """What a memory model said about a batch, the valid part only."""

    marks: list[Written] = field(default_factory=list)
    facts: list[Draft] = field(default_factory=list)
    state: list[tuple[str, str | None]] = field(default_factory=list)   # (key, value); None unsets
    rejected: list[str] = field(default_factory=list)                   # what was left out, and why
    summaries: list[SummaryDraft] = field(default_factory=list)         # of the episodes asked about


@dataclass(frozen=True)
class Asked:
    """The summaries a call asks for: each closed episode's (key → first turn, last turn, ts of
    the last), and the rolling summary's next version over turns first..last."""

    episodes: dict[str, tuple[int, int, float]]
    rolling: tuple[int, int, float]


class MemoryWriter:
    """Asks `model` for bookmarks, facts and state changes of up to `batch` pages per call."""

    memory = True

    def __init__(self, model: Model, batch: int = 8, similar: int = SIMILAR) -> None:
        self.model, self.batch, self.similar = model, batch, similar

    def write(self, pages: list[Page], session, episodes: list[list] | None = None) -> Answer:
        """The model's answer for pages, in one call; raises when the model fails. With `episodes`
        (closed ones, each a list of turns) the call also asks for their summaries and the rolling one."""
        call = self.ask(pages, session, episodes)
        return self.read(call, self.model.complete(call.messages, []), session)

    def ask(self, pages: list[Page], session, episodes: list[list] | None = None) -> Call:
        """The call for pages: its prompt shows them, the current facts most like them and the state."""
        shown = similar_facts(session, pages, self.similar) if pages else []
        prompt = render("memory_writer", pages=listing(pages) or "(no new pages)", state=_state_lines(session),
                        facts="\n".join(f"- {f.id} [{f.subject}] ({f.date}): {f.text}" for f in shown) or "(none yet)")
        asked = None
        if episodes:
            asked, section = ask_summaries(session, pages, episodes)
            prompt += "\n" + section
        return Call(pages, episodes, [{"role": "user", "content": prompt}], asked)

    def read(self, call: Call, reply: ModelReply, session) -> Answer:
        """The valid part of the model's answer, against the facts current now (an update may name
        only those)."""
        current = {f.n: f.text for f in session.facts.items if f.n in _current(session.facts)}
        answer = parse(reply.text, call.pages, current, call.asked if isinstance(call.asked, Asked) else None)
        if reply.truncated:   # say why the JSON is cut, and what to change
            answer.rejected.append(f"the answer was cut at the memory model's output limit of "
                                   f"{self.model.output_tokens} tokens: fewer pages per call answer in less "
                                   f"(PAGER_BOOKMARK_BATCH, now {self.batch})")
        return answer


def ask_summaries(session, pages: list[Page], episodes: list[list]) -> tuple[Asked, str]:
    """What to ask about closed episodes, and the prompt's section asking it: the episodes' turns
    that the batch's pages do not show (at most MAX_EPISODE_LINES, evenly spread), the previous
    rolling summary."""
    held = {turn for p in pages for turn, _, _ in p.spans}
    previous = session.summaries.rolling
    first = min(previous.turns[0], episodes[0][0].turn) if previous else episodes[0][0].turn   # what it was told
    last = episodes[-1][-1]
    asked = Asked({f"e{e[0].turn}": (e[0].turn, e[-1].turn, e[-1].ts) for e in episodes}, (first, last.turn, last.ts))
    earlier = [t for e in episodes for t in e if t.turn not in held]
    if len(earlier) > MAX_EPISODE_LINES:
        step = len(earlier) / MAX_EPISODE_LINES
        earlier = [earlier[int(i * step)] for i in range(MAX_EPISODE_LINES)]
    lines = [f"- t{t.turn} {t.speaker}: {' '.join(t.text.split())[:300]}" for t in earlier]
    section = render("memory_summaries", episodes=", ".join(f"{key} (t{a}–t{b})" for key, (a, b, _) in asked.episodes.items()),
                     rolling=previous.text if previous else "(none yet)", earlier="\n".join(lines) or "(none)")
    return asked, section


def listing(pages: list[Page]) -> str:
    """Each page under its id and date, one line per turn (or part of one) led by its turn number."""
    out = []
    for p in pages:
        head = f"[{p.id} · {p.date_first}]" if p.date_first else f"[{p.id}]"
        out.append("\n".join([head] + [f"(t{turn}) {p.piece_text(i)}" for i, (turn, _, _) in enumerate(p.spans)]))
    return "\n\n".join(out)


def similar_facts(session, pages: list[Page], k: int) -> list[Fact]:
    """The current facts nearest to any of the pages, best first, at most k."""
    if not len(session.facts):
        return []
    vectors = session.home.embedder.embed([p.text for p in pages]).astype(np.float16).astype(np.float32)
    ranked: dict[int, tuple[int, Fact]] = {}
    for page, vector in zip(pages, vectors):
        for rank, fact in enumerate(session.facts.similar(page.text, vector, k)):
            if fact.n not in ranked or rank < ranked[fact.n][0]:
                ranked[fact.n] = (rank, fact)
    return [f for _, f in sorted(ranked.values(), key=lambda x: (x[0], x[1].n))][:k]


def _current(facts: Facts) -> set[int]:
    return {f.n for f in facts.items if not f.ends and facts.superseded_by(f) is None}


def _state_lines(session) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in session.state.values().items()) or "(empty)"


def decode(text: str):
    """The first JSON object of a reply: inside a code fence or not, with any text before or after it."""
    text = text or ""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for candidate in candidates:
        start = candidate.find("{")
        while start != -1:
            try:
                value, _ = decoder.raw_decode(candidate, start)
                if isinstance(value, dict):
                    return value
            except json.JSONDecodeError:
                pass
            start = candidate.find("{", start + 1)
    return None


def parse(text: str, pages: list[Page], known: dict[int, str], asked: Asked | None = None) -> Answer:
    """The valid part of a memory model's answer for these pages; `known`: the facts (number → text)
    an update or invalidate may name, the current ones; `asked`: the summaries asked for, if any."""
    answer = Answer()
    data = decode(text)
    if data is None:
        answer.rejected.append("the answer holds no JSON object: " + (" ".join((text or "").split())[:80] or "(empty)"))
        return answer
    marks = data.get("bookmarks", {})
    if not isinstance(marks, dict):
        answer.rejected.append(f"bookmarks: a {type(marks).__name__}, not an object keyed by page id")
    answer.marks = marks_from(marks, {p.id: p.n for p in pages}, answer.rejected)
    turns = {turn: p.piece_text(i).split(": ", 1)[-1] for p in pages for i, (turn, _, _) in enumerate(p.spans)}
    facts = data.get("facts", [])
    if not isinstance(facts, list):
        answer.rejected.append(f"facts: a {type(facts).__name__}, not a list")
        facts = []
    for i, item in enumerate(facts):
        draft = _fact(item, turns, known, answer.rejected, f"facts[{i}]")
        if draft is not None:
            answer.facts.append(draft)
    answer.state = _state(data.get("state", []), answer.rejected)
    if asked is not None:
        answer.summaries = _summaries(data.get("summaries"), asked, answer.rejected)
    return answer


def _summaries(raw, asked: Asked, rejected: list[str]) -> list[SummaryDraft]:
    """The summaries asked for that the answer gives, valid; what is missing or wrong is said."""
    if not isinstance(raw, dict):
        rejected.append("summaries: " + ("none given" if raw is None else f"a {type(raw).__name__}, not an object"))
        return []
    out: list[SummaryDraft] = []
    episodes = raw.get("episodes")
    episodes = episodes if isinstance(episodes, dict) else {}
    for key, (first, last, ts) in asked.episodes.items():
        text = _summary_text(episodes.get(key), MAX_SUMMARY_CHARS, f"summaries.episodes[{key!r}]", rejected)
        if text:
            out.append(SummaryDraft(EPISODE, key, text, (first, last), ts))
    for key in episodes:
        if key not in asked.episodes:
            rejected.append(f"summaries.episodes[{str(key)[:20]!r}]: not an episode asked about")
    first, last, ts = asked.rolling
    text = _summary_text(raw.get("rolling"), 2 * MAX_SUMMARY_CHARS, "summaries.rolling", rejected)
    if text:
        out.append(SummaryDraft(ROLLING, ROLLING, text, (first, last), ts))
    return out


def _summary_text(value, most: int, where: str, rejected: list[str]) -> str:
    text = " ".join(value.split()) if isinstance(value, str) else ""
    if not text:
        rejected.append(f"{where}: " + ("none given" if value is None else "no text"))
        return ""
    if len(text) > most:
        rejected.append(f"{where}: {len(text)} characters; at most {most}")
        return ""
    return text


def _fact(item, turns: dict[int, str], known: dict[int, str], rejected: list[str], where: str) -> Draft | None:
    if not isinstance(item, dict):
        rejected.append(f"{where}: a {type(item).__name__}, not an object")
        return None
    op = str(item.get("op") or "add").strip().lower()
    if op not in OPS:
        rejected.append(f"{where}: unknown op {op[:20]!r}")
        return None
    if op == "none":
        return None
    text = item.get("text")
    text = " ".join(text.split()) if isinstance(text, str) else ""
    target = 0
    if op in ("update", "invalidate"):
        m = _FACT_ID.match(str(item.get("id", "")))
        if not m or int(m.group(1)) not in known:
            rejected.append(f"{where}: {op.upper()} names {str(item.get('id'))[:20]!r}, not a current fact shown")
            return None
        target = int(m.group(1))
    if not text and op != "invalidate":
        rejected.append(f"{where}: no text")
        return None
    if len(text) > MAX_FACT_CHARS:
        rejected.append(f"{where}: a statement of {len(text)} characters; a fact is at most {MAX_FACT_CHARS}")
        return None
    subject = item.get("subject")
    subject = " ".join(subject.split()) if isinstance(subject, str) else ""
    if op == "add" and not subject:
        rejected.append(f"{where}: ADD without a subject")
        return None
    cited = item.get("turns")
    cited = cited if isinstance(cited, list) else [cited] if cited is not None else []
    held = tuple(dict.fromkeys(int(m.group(1)) for t in cited if (m := _TURN_ID.match(str(t))) and int(m.group(1)) in turns))
    if cited and not held:
        rejected.append(f"{where}: its turns {str(cited)[:30]} are not on these pages")
        return None
    if not held:  # none cited: the turn of these pages that shares the most words with the statement
        words = set(terms(text or known.get(target, "")))
        best = max(turns, key=lambda t: (len(words & set(terms(turns[t]))), -t), default=None)
        if best is None or not words & set(terms(turns[best])):
            rejected.append(f"{where}: names no turn of these pages")
            return None
        held = (best,)
    # an update or invalidate takes the subject of the fact it is about (Session.add_facts)
    return Draft(subject[:MAX_SUBJECT_CHARS], text or "no longer true", held, None, op, target)


def _state(raw, rejected: list[str]) -> list[tuple[str, str | None]]:
    if isinstance(raw, dict):  # {"home city": "Berlin", "order id": null}: a shape models like to give
        raw = [{"op": "unset" if v is None else "set", "key": k, "value": v} for k, v in raw.items()]
    if not isinstance(raw, list):
        rejected.append(f"state: a {type(raw).__name__}, not a list")
        return []
    out: list[tuple[str, str | None]] = []
    for i, item in enumerate(raw):
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            rejected.append(f"state[{i}]: not an object with a key")
            continue
        op = str(item.get("op") or "set").strip().lower()
        value = item.get("value")
        if op not in ("set", "unset") or (op == "set" and not isinstance(value, (str, int, float))):
            rejected.append(f"state[{i}]: " + (f"unknown op {op[:20]!r}" if op not in ("set", "unset") else "set without a value"))
            continue
        try:
            key, checked = check_state(item["key"], None if op == "unset" else str(value))
        except InputError as exc:
            rejected.append(f"state[{i}]: {exc}")
            continue
        out.append((key, checked if op == "set" else None))
    return out
