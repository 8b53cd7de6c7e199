"""Bookmarks written by a model: when one is configured, it names what a page is about.

Offline extraction (bookmarks.extract) finds the words a page uses; it cannot know that a
page about "Coco, my new puppy" answers "what pets does Maria have?". A model can, so with
`bookmark_model` set, sealed pages are sent to it in batches and its keywords become
bookmarks (source "writer") next to the automatic ones. The model's answer is data, not
trusted: unknown page ids, non-strings, overlong keywords and anything that is not JSON are
dropped, and a failing model leaves the pages with their offline keywords.

A call is three steps, `ask` (the prompt, from the pages and the session), the model's `complete`
and `read` (the valid part of its answer), so that `pager serve` can call the model with no lock
held and do the other two under the session's lock (pager/memory_worker.py); `write` is the three
in a row.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from pager.prompts import render

from .model import Model, ModelReply
from .page import Page

MAX_KEYWORDS = 8
MAX_KEYWORD_CHARS = 40
MAX_NOTE_CHARS = 120
_OBJECT = re.compile(r"\{.*\}", re.S)


@dataclass(frozen=True)
class Written:
    page: int
    keywords: tuple[str, ...]
    note: str


@dataclass
class Call:
    """One call of a bookmark or memory model, asked and not yet answered: the pages of its batch, the
    closed episodes whose summaries it asks for (the memory model's), its prompt, and what reading the
    answer needs besides (`memory.Asked`, the summaries asked for)."""

    pages: list[Page]
    episodes: list[list] | None = None
    messages: list[dict] = field(default_factory=list)
    asked: object = None


class BookmarkWriter:
    """Asks `model` for keywords of up to `batch` pages per call."""

    memory = False   # names pages only (pager.memory.MemoryWriter also writes facts and state)

    def __init__(self, model: Model, batch: int = 8) -> None:
        self.model, self.batch = model, batch

    def write(self, pages: list[Page]) -> list[Written]:
        """Keywords for pages, in one model call; raises ModelError when the model fails."""
        call = self.ask(pages)
        return self.read(call, self.model.complete(call.messages, []))

    def ask(self, pages: list[Page], session=None, episodes: list[list] | None = None) -> Call:
        """The call for pages: its prompt (a bookmark writer reads nothing of the session)."""
        listing = "\n\n".join(f"[{p.id} · {p.date_first}]\n{p.text}" if p.date_first else f"[{p.id}]\n{p.text}"
                              for p in pages)
        return Call(pages, None, [{"role": "user", "content": render("bookmark_writer", pages=listing)}])

    def read(self, call: Call, reply: ModelReply, session=None) -> list[Written]:
        """The valid part of the model's answer to the call."""
        return parse(reply.text, {p.id: p.n for p in call.pages})


def parse(text: str, wanted: dict[str, int]) -> list[Written]:
    """The valid part of a writer's answer: keywords for the pages asked about, nothing else."""
    match = _OBJECT.search(text or "")
    if not match:
        return []
    try:
        data = json.loads(match.group(0))
    except json.JSONDecodeError:
        return []
    return marks_from(data, wanted)


def marks_from(data, wanted: dict[str, int], rejected: list[str] | None = None) -> list[Written]:
    """Bookmarks from a decoded answer {page id: {"keywords": [...], "note": "..."}}; what is not
    usable is skipped, and said in `rejected` when given."""
    if not isinstance(data, dict):
        return []
    out = []
    for key, value in data.items():
        n = wanted.get(str(key).strip().lower())
        if n is None or not isinstance(value, dict):
            if rejected is not None:
                rejected.append(f"bookmarks[{str(key)[:20]!r}]: " + ("not a page shown" if n is None else "not an object"))
            continue
        raw = value.get("keywords")
        if isinstance(raw, str):
            raw = raw.split(",")
        if not isinstance(raw, list):
            if rejected is not None:
                rejected.append(f"bookmarks[{key!r}]: no list of keywords")
            continue
        keywords = []
        for k in raw:
            if isinstance(k, str) and (k := " ".join(k.split())) and len(k) <= MAX_KEYWORD_CHARS and k not in keywords:
                keywords.append(k)
        note = value.get("note")
        note = " ".join(note.split())[:MAX_NOTE_CHARS] if isinstance(note, str) else ""
        if keywords:
            out.append(Written(n, tuple(keywords[:MAX_KEYWORDS]), note))
    return sorted(out, key=lambda w: w.page)
