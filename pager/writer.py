"""Bookmarks written by a model: when one is configured, it names what a page is about.

Offline extraction (bookmarks.extract) finds the words a page uses; it cannot know that a
page about "Coco, my new puppy" answers "what pets does Maria have?". A model can, so with
`bookmark_model` set, sealed pages are sent to it in batches and its keywords become
bookmarks (source "writer") next to the automatic ones. The model's answer is data, not
trusted: unknown page ids, non-strings, overlong keywords and anything that is not JSON are
dropped, and a failing model leaves the pages with their offline keywords.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pager.prompts import render

from .model import Model
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


class BookmarkWriter:
    """Asks `model` for keywords of up to `batch` pages per call."""

    memory = False   # names pages only (pager.memory.MemoryWriter also writes facts and state)

    def __init__(self, model: Model, batch: int = 8) -> None:
        self.model, self.batch = model, batch

    def write(self, pages: list[Page]) -> list[Written]:
        """Keywords for pages, in one model call; raises ModelError when the model fails."""
        listing = "\n\n".join(f"[{p.id} · {p.date_first}]\n{p.text}" if p.date_first else f"[{p.id}]\n{p.text}"
                              for p in pages)
        prompt = render("bookmark_writer", pages=listing)
        reply = self.model.complete([{"role": "user", "content": prompt}], [])
        return parse(reply.text, {p.id: p.n for p in pages})


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
