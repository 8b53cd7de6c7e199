"""Models that need no network: the offline memory shell, and scripted replies for tests.

The offline shell is not a pretend LLM. It is a deterministic responder that uses the same
tools a model would: when a message refers back to earlier things it calls `search`, then
`page_in` for the best page on disk, then answers by quoting the most relevant line of a
resident page with its page id and date. A plain statement of a current fact ("my city is
Berlin", "deadline: 21 March"; pager.state.parse_statements) is kept in the working state with
`state_set`. Anything else is acknowledged and remembered.
"""

from __future__ import annotations

import json
import re
from collections import deque

from .search import PLAIN, QUESTION, QUOTE, SHELL_NOTE, about, echoes, piece_kind, terms, update_terms
from .state import parse_statements

BACK_REFERENCE = re.compile(
    r"\?|\b(do you remember|remind me|tell me about|recall|earlier|last (?:time|week|month|year)|ago|previous|did (?:i|we|you)|"
    r"what (?:did|was|were|is|are)|when (?:did|was|is)|who (?:is|was)|where (?:did|is|was)|which|how (?:much|many))\b",
    re.I,
)
_BLOCK = re.compile(r"^\[(p\d+)(?: · ([^·\]]+))?[^\]]*\]\n((?:(?!\n\[p\d+).)*)", re.S | re.M)
_RESULT = re.compile(r"^- (p\d+) \([^,]*, (resident|on disk)", re.M)
_RESULT_LINE = re.compile(r"^- (p\d+) \([^,]*, (resident|on disk)(?:, score [\d.]+(, weak)?)?[^\n]*?\): ([^\n]*)$", re.M)
_BEFORE = re.compile(r"\b(before|previous(?:ly)?|earlier|used to|old|changed?)\b", re.I)
_EARLIER = re.compile(r"\b(before|previous(?:ly)?|earlier|used to)\b", re.I)   # asks for an earlier value
_HISTORY = re.compile(r"^state [^\n]*; before: [^\n]*", re.M)
_FACT = re.compile(r"^- (f\d+) \(([^)]*)\): ([^\n]+)$", re.M)
_STATE = re.compile(r"^\[state\b[^\n]*\n((?:- [^\n]*(?:\n|$))*)", re.M)
# a question about the working state as a whole ("what is in the working state?", "show me your state")
_WHOLE_STATE = re.compile(r"\b(?:what(?:'s| is)? (?:in|on) (?:the |your |my )?(?:working )?state|"
                          r"(?:show|list|read)(?: me)? (?:the |your |my )?(?:working )?state|working state)\b", re.I)


class OfflineShell:
    """handler(messages, tools) → reply dict, as registered with pager.llm.register."""

    def __call__(self, messages: list[dict], tools: list[dict]) -> dict:
        question = _last_user(messages)
        exchanges = _this_turn(messages)
        names = {t["function"]["name"] for t in tools}
        statements = parse_statements(question)
        if not exchanges and statements and "state_set" in names:
            return {"content": None, "tool_calls": [_tool_call("state_set", {"key": k, "value": v}, f"call_1_state_{i}")
                                                    for i, (k, v) in enumerate(statements)]}
        if exchanges and all(name == "state_set" for name, _ in exchanges):
            return {"content": "Noted, and kept in the working state: " + "; ".join(r for _, r in exchanges)
                    + f" {SHELL_NOTE})"}   # marked as the shell's own, so no later answer quotes it back
        if not exchanges and _WHOLE_STATE.search(question):
            return {"content": whole_state(messages[0].get("content") or "")}
        if not exchanges and BACK_REFERENCE.search(question) and "search" in names:
            return _call("search", {"query": question, "k": 3}, 1)
        if len(exchanges) == 1 and exchanges[0][0] == "search" and _BEFORE.search(question):
            earlier = _HISTORY.search(exchanges[0][1])
            if earlier:  # the working state keeps every value a key had
                return {"content": f"From the state's history: {earlier.group(0)}"}
        if len(exchanges) == 1 and exchanges[0][0] == "search" and "page_in" in names:
            wanted = _worth_reading(exchanges[0][1], question)
            if wanted:
                return _call("page_in", {"page": wanted}, 2)
        if not exchanges and not BACK_REFERENCE.search(question):
            return {"content": "Noted — it's in memory. (offline memory shell: no LLM configured; "
                               "set --model or PAGER_MODEL for real answers)"}
        ranked = [pid for pid, _ in _RESULT.findall(exchanges[0][1])] if exchanges else []
        return {"content": self.answer(question, messages[0].get("content") or "", ranked)}

    def answer(self, question: str, system: str, ranked: list[str] = ()) -> str:
        """Quote the best-matching line of the resident pages, and a runner-up from another page."""
        asked = terms(question)
        wanted = set(asked)
        scored = []
        for body in _STATE.findall(system):  # the current values: ahead of a page saying the same words
            for line in body.strip().splitlines():
                key, _, value = line[2:].partition(": ")
                if line.startswith("- (") or not _asks_for(wanted, key, value):
                    continue
                scored.append((len(wanted & set(terms(line))) + 0.5, "the state", "", line[2:].strip()))
        past = bool(_BEFORE.search(question))
        for fact, when, text in _FACT.findall(system):   # facts the context shows: short statements of their own
            changed = "superseded by" in when or "ended by" in when
            if changed and not past:
                continue   # a value that changed answers only a question about the past, and comes first there
            have = set(terms(text))
            overlap = len(wanted & have)
            if overlap:
                scored.append((overlap / (1 + 0.05 * len(have)) + (0.3 if changed else 0.1), f"fact {fact}", when,
                               text.strip()))
        lines = []   # (score, page, date, line, the query words it holds, those its sentences of change hold), in order
        for page, date, body in _BLOCK.findall(system):
            bonus = 0.25 if page in ranked[:3] else 0.0  # pages the search ranked first
            for line in body.strip().splitlines():
                words = terms(line)
                kind = piece_kind(line)
                if kind == QUOTE or (kind == QUESTION and echoes(words, asked, _speaker_terms(line))):
                    continue   # its own earlier replies, and the question asked before, are not answers
                have = set(words)
                overlap = wanted & have
                if overlap:
                    weight = 0.5 if kind == QUESTION else 1.0   # a statement answers better than a question
                    said = wanted.intersection(update_terms(line)) if kind == PLAIN else set()
                    lines.append((weight * len(overlap) / (1 + 0.05 * len(have)) + bonus, page, date.strip(),
                                  line.strip(), overlap - _speaker_terms(line), said - _speaker_terms(line)))
        updated = _updated(lines, len(wanted))
        if past:   # what was it before: an updated line above every line that updates it
            for earlier, later in sorted(updated, reverse=True):
                if lines[earlier][0] <= lines[later][0]:
                    lines[earlier] = (lines[later][0] + 0.01, *lines[earlier][1:])
        old = {earlier for earlier, _ in updated} if not past else set()
        scored += [(score, page, date, line) for i, (score, page, date, line, _, _) in enumerate(lines) if i not in old]
        if not scored:
            return "I find nothing about that in memory. (offline memory shell: no LLM configured)"
        scored.sort(key=lambda x: -x[0])
        best = scored[0]
        quotes = [best]
        runner = None if best[1] == "the state" else (  # the current value needs no older quote beside it
            next((x for x in scored[1:] if x[1] != best[1] and x[0] >= 0.6 * best[0]
                  and piece_kind(x[3]) != QUESTION), None))   # a question asked before is no second answer
        if runner:
            quotes.append(runner)
        text = " Also ".join(f"from {p}{' (' + d + ')' if d else ''}: “{line}”" for _, p, d, line in quotes)
        if best[1] == "the state" and _EARLIER.search(question):
            # asked what it was before, and the state's history had nothing earlier (the search said no "before")
            text += ", its only value: the working state holds no earlier value for it"
        return text[0].upper() + text[1:]


def whole_state(system: str) -> str:
    """Every key the context's state block shows, with its value, page and date (the block names the
    keys it leaves out, and so does this answer)."""
    lines = [line[2:].strip() for body in _STATE.findall(system) for line in body.strip().splitlines()]
    if not lines:
        return ("The working state is empty: nothing was stated as a value yet (\"my city is Berlin\", "
                "\"deadline: 21 March\"). (offline memory shell: no LLM configured)")
    return ("The working state holds: " + "; ".join(f"“{line}”" for line in lines)
            + f". {SHELL_NOTE}: the state block of this context)")   # marked, so no later answer quotes it back


def _updated(lines: list[tuple], asked: int) -> set[tuple[int, int]]:
    """(earlier, later) line positions where the later line updates the earlier, as search.Index.supersedes
    pairs pieces: the later one says a value changed in a sentence holding the same words of the question as
    the earlier line, all of them but at most one (search.about). An updated line does not answer what a value is now; it answers
    what it was before."""
    least = about(asked)
    out = set()
    for later, (_, _, _, _, _, said) in enumerate(lines):
        if least and len(said) >= least:
            out |= {(i, later) for i, x in enumerate(lines[:later]) if len(x[4] & said) >= least}
    return out


def _asks_for(wanted: set[str], key: str, value: str) -> bool:
    """Whether a question asks for this state key: it names every word of the key ("my dog's name" for
    `dog's name`, not "my cat's name"), or names the value itself."""
    words = set(terms(key))
    return bool(words) and words <= wanted or bool(wanted & set(terms(value)))


def _worth_reading(result: str, question: str) -> str:
    """The page to page in after a search, or "" when none is worth a frame (a weak one is not): the best
    of the first two results that is not an echo (the question asked before, a reply quoting a page), and only
    when it is on disk: if the best is already resident, the answer is in view."""
    asked = terms(question)
    for pid, where, faint, snippet in _RESULT_LINE.findall(result)[:2]:
        if faint:
            return ""   # near by meaning only: no page holds a word of the question
        kind = piece_kind(snippet)
        if kind == QUOTE or (kind == QUESTION and echoes(terms(snippet), asked, _speaker_terms(snippet))):
            continue
        return pid if where == "on disk" else ""
    return ""


def _speaker_terms(line: str) -> set[str]:
    head, sep, _ = line.partition(": ")
    return set(terms(head.removesuffix(" (cont.)"))) if sep else set()


def _last_user(messages: list[dict]) -> str:
    return next((m.get("content") or "" for m in reversed(messages) if m["role"] == "user"), "")


def _this_turn(messages: list[dict]) -> list[tuple[str, str]]:
    """(tool name, result) of the tool calls since the last user message."""
    start = max(i for i, m in enumerate(messages) if m["role"] == "user") if any(m["role"] == "user" for m in messages) else 0
    names: dict[str, str] = {}
    out = []
    for m in messages[start:]:
        for call in m.get("tool_calls") or []:
            names[call["id"]] = call["function"]["name"]
        if m["role"] == "tool":
            out.append((names.get(m.get("tool_call_id"), "?"), m.get("content") or ""))
    return out


def _call(name: str, arguments: dict, step: int) -> dict:
    return {"content": None, "tool_calls": [_tool_call(name, arguments, f"call_{step}_{name}")]}


def _tool_call(name: str, arguments: dict, id: str) -> dict:
    return {"id": id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


class Script:
    """Replies in order, as recorded: each a dict {"content": …, "tool_calls": [...]} or an exception to raise."""

    def __init__(self, replies=()) -> None:
        self.replies = deque(replies)
        self.seen: list[list[dict]] = []

    def __call__(self, messages: list[dict], tools: list[dict]) -> dict:
        self.seen.append(messages)
        if not self.replies:
            return {"content": "(script exhausted)"}
        reply = self.replies.popleft()
        if isinstance(reply, BaseException):
            raise reply
        if callable(reply):
            return reply(messages, tools)
        return reply
