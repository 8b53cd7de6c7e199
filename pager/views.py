"""Pictures of a session for people: the frame map, the page table, the bookmarks."""

from __future__ import annotations

from collections.abc import Iterable, Set

from rich.table import Table
from rich.text import Text

from .context import message_vector
from .search import terms
from .session import Session


def table(title: str | Text, headers: Iterable[str], right: Iterable[str] = (), **options) -> Table:
    """A table that fits the terminal (its width, or COLUMNS, 80 when piped): no rules between columns,
    and no header cut ("resid…") or wrapped onto two lines; the cells wrap instead, the widest first."""
    from rich import box

    title = title if isinstance(title, Text) else Text(title)
    out = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                padding=(0, 1, 0, 0), min_width=len(title.plain), **options)   # a title is not wrapped to a narrow table
    right = set(right)
    for header in headers:
        out.add_column(header, justify="right" if header in right else "left", min_width=len(header), overflow="fold")
    return out


# each frame's state as a mark after its page id as well as a colour, so that the strip reads without colour
MARKS = (("tail", "+", "black on cyan"), ("pinned", "!", "white on magenta"), ("just faulted", "^", "black on yellow"),
         ("referenced", "'", "black on green"))


def frame_strip(session: Session, fresh: Set[int] = frozenset()) -> Text:
    """One cell per frame: p12 with its state's mark and colour (tail, pinned, just faulted, referenced; none:
    resident), · when free. Cells are as wide as the widest, so that fifteen fit 80 columns."""
    cells: list[tuple[str, str]] = []
    for n in session.frames.slots:
        if n is None:
            cells.append(("·", "dim"))
            continue
        entry = session.table[n]
        state = ("tail" if n == session.tail_n else "pinned" if entry.pinned else "just faulted" if n in fresh
                 else "referenced" if entry.referenced else "")
        mark, style = next(((m, st) for name, m, st in MARKS if name == state), ("", "black on white"))
        cells.append((f"p{n}{mark}", style))
    width = max((len(text) for text, _ in cells), default=1)
    out = Text()
    for text, style in cells:
        out.append(f"{text:<{width}}", style=style)
        out.append(" ")
    return out


def legend() -> Text:
    """What the strip's marks and colours say."""
    parts: list = ["frames: "]
    for name, mark, style in MARKS:
        parts += [(f"p9{mark}", style), f" {name} "]
    return Text.assemble(*parts, ("p9", "black on white"), " resident ", ("·", "dim"), " free")


def frame_table(session: Session) -> Table:
    """Which page is in which frame, its tokens as a bar, its flags and bookmarks."""
    table = views_table(f"frames of session {session.name!r} ({session.frames.used()}/{session.frames.count} used, "
                        f"{session.page_tokens} tokens each)", ("frame", "page", "tokens", "fill", "flags", "date",
                                                               "bookmarks"), right=("frame", "tokens"))
    cap = session.page_tokens
    slots = session.frames.slots
    for slot, n in enumerate(slots):
        if n is None:   # a run of free frames is one row: a one-page session has sixty
            if slot == 0 or slots[slot - 1] is not None:
                end = next((i for i in range(slot, len(slots)) if slots[i] is not None), len(slots)) - 1
                table.add_row(str(slot) if end == slot else f"{slot}–{end}", "·", "", "", "free", "", "", style="dim")
            continue
        e = session.table[n]
        tokens = session.packer.body_tokens if n == session.tail_n else e.tokens
        filled = round(10 * tokens / cap)
        flags = " ".join(f for f, on in (("tail", n == session.tail_n), ("pinned", e.pinned), ("ref", e.referenced)) if on)
        table.add_row(str(slot), f"p{n}", str(tokens), "█" * filled + "░" * (10 - filled), flags,
                      session.render.page_dates(n), Text(", ".join(session.directory.keywords(n)[:4])))
    return table


REGIONS = (("prefix", "prefix"), ("map", "memory map"), ("state", "state"), ("summaries", "summaries"),
           ("facts", "facts and excerpts"), ("pages", "pages"), ("message", "message"),
           ("scratch", "tool schemas and exchanges"))


def region_tokens(tokens: dict, budget: int) -> str:
    """A context's tokens per region (a model_request's `tokens`), every region it has, so that they add
    up to the total: what is left is the chat framing of the messages."""
    parts = [(label, tokens[key]) for key, label in REGIONS if tokens.get(key)]
    framing = tokens["total"] - sum(n for _, n in parts)
    return ("tokens: " + " · ".join(f"{label} {n}" for label, n in parts)
            + (f" · message framing {framing}" if framing else "") + f" · total {tokens['total']} of {budget}")


def page_table(session: Session, limit: int = 40) -> Table:
    """The page table: resident pages first, then the most used on disk."""
    entries = sorted(session.table.values(), key=lambda e: (not e.resident, -e.use_count, -e.n))[:limit]
    table = views_table(f"page table ({len(session.table)} pages, showing {len(entries)})",
                        ("page", "resident", "frame", "pinned", "ref", "last use", "uses", "faults", "tokens", "date"))
    for e in sorted(entries, key=lambda e: e.n):
        table.add_row(f"p{e.n}", "yes" if e.resident else "", str(e.frame) if e.resident else "",
                      "yes" if e.pinned else "", "1" if e.referenced else "", str(e.last_use), str(e.use_count),
                      str(e.fault_count), str(e.tokens), session.render.page_dates(e.n) if e.n in session.pages else "")
    return table


def bookmark_table(session: Session, limit: int = 40) -> Table:
    table = views_table("bookmarks", ("page", "keywords", "notes"))
    for n in sorted(session.directory.by_page, reverse=True)[:limit]:
        table.add_row(f"p{n}", Text(", ".join(session.directory.keywords(n))), Text("; ".join(session.directory.notes.get(n, []))))
    return table


def state_table(session: Session, key: str = "") -> Table:
    """The working state (key, value, page, change), or with a key every value it had, unsets too."""
    changes = session.state.history(key) if key else sorted(session.state.current.values(), key=lambda c: c.key)
    title = f"state {key!r}: every change" if key else f"state: {len(changes)} key(s), {len(session.state.changes)} change(s)"
    table = views_table(title, ("key", "value", "page", "turn", "change", "by"))
    for c in changes:
        table.add_row(c.key, "(unset)" if c.unset else c.value, f"p{c.page}", str(c.turn), str(c.seq), c.source)
    return table


def facts_table(session: Session, query: str = "") -> Table:
    """Every fact (or those for a query, best first), superseded ones marked with their dates."""
    facts = [f for f, _ in session.facts.search(query)] if query else list(session.facts.items)
    title = (f"facts for {query!r}: {len(facts)}" if query else
             f"facts: {len(facts)}, {sum(1 for f in facts if session.facts.superseded_by(f))} superseded")
    table = views_table(title, ("id", "subject", "fact", "valid", "pages", "source"))
    for f in facts:
        later = session.facts.superseded_by(f)
        valid = f"{f.date} → {later.date} (superseded by {later.id})" if later else f"since {f.date}"
        table.add_row(f.id, Text(f.subject), Text(f.text), valid, ",".join(f"p{p}" for p in f.pages[:3]), f.source)
    return table


def summaries_table(session: Session, key: str = "") -> Table:
    """The current summary of each episode and the rolling one, or with a key every version it had."""
    items = session.summaries.versions(key) if key else [x for x in session.summaries.items
                                                           if session.summaries.current.get(x.key) is x]
    title = (f"summary {key!r}: every version" if key else
             f"summaries: {len(items)} current, {len(session.summaries)} version(s) in all")
    table = views_table(title, ("id", "kind", "key", "v", "pages", "date", "summary"))
    for x in items:
        table.add_row(x.id, x.kind, Text(x.key), str(x.version), x.span, x.date, Text(x.text))
    return table


def page_hits(session: Session, query: str, k: int = 8) -> list[dict]:
    """The pages a search finds, as `pager search --json` and the REST search give them: each with its score,
    signals, date, residency, bookmarks, best piece, and `weak` (no word of the query on it, near it by
    meaning only: Session.weak)."""
    hits = session.search(query, k=k, record=False)
    return [{"kind": "page", "page": h.id, "score": h.score, "signals": h.signals, "date": session.render.page_dates(h.n),
             "resident": session.table[h.n].resident, "bookmarks": session.directory.keywords(h.n)[:5],
             "snippet": session.render.snippet(h), "weak": weak}
            for h, weak in zip(hits, session.weak(query, hits))]


def tier_hits(session: Session, query: str, k: int = 8) -> list[dict]:
    """What a search finds besides pages, each row marked with its kind: facts (superseded ones
    with their dates), current summaries (with the pages they cover), and working-state changes."""
    rows: list[dict] = []
    vector = message_vector(session, query) if session.facts.items or session.summaries.items else None
    floor, wanted = session.home.config.weak_similarity, set(terms(query))

    def weak(text: str, score: float) -> bool:
        """As a page is (Session.weak): no word of the query in it, and near it by meaning only below the floor
        (a fact's or summary's score without a word of the query is half its similarity)."""
        return floor > 0 and not wanted & set(terms(text)) and score < 0.5 * floor

    for f, score in session.facts.search(query, vector, k=k):
        later = session.facts.superseded_by(f)
        rows.append({"kind": "fact", "id": f.id, "score": score, "text": f.text, "subject": f.subject,
                     "pages": [f"p{p}" for p in f.pages], "date": f.date, "superseded": later is not None,
                     "valid_to": later.date if later else None, "superseded_by": later.id if later else None,
                     "weak": weak(f.text, score)})
    for x, score in session.summaries.search(query, vector, k=k):
        rows.append({"kind": "summary", "id": x.id, "score": score, "text": x.text, "key": x.key, "type": x.kind,
                     "version": x.version, "pages": [f"p{x.pages[0]}", f"p{x.pages[1]}"], "date": x.date,
                     "weak": weak(x.text, score)})
    for c in session.state.find(query)[:k]:
        now = session.state.current.get(c.key)
        rows.append({"kind": "state", "id": f"change {c.seq}", "key": c.key, "text": "(unset)" if c.unset else c.value,
                     "pages": [f"p{c.page}"], "current": now is c})
    return rows


def inspect_json(session: Session) -> dict:
    """The state scripts check: DESIGN.md's `pager inspect --json`."""
    return {
        "session": session.name,
        "user": session.user,
        "turns": session.turn_count,
        "pages": session.page_count,
        "page_tokens": session.page_tokens,
        "frames": session.frames.count,
        "used": session.frames.used(),
        "resident": [f"p{n}" for n in session.resident()],
        "pinned": [f"p{n}" for n, e in sorted(session.table.items()) if e.pinned],
        "tail": f"p{session.tail_n}",
        "policy": session.policy.name,
        "bookmarks": {f"p{n}": kws for n, kws in sorted(session.directory.by_page.items())},
        "faults": session.counters["faults"],
        "evictions": session.counters["evictions"],
        "hits": session.counters["hits"],
        "state": session.state.to_json(),
        "facts": session.facts.to_json(),
        "summaries": session.summaries.to_json(),
    }


views_table = table   # the name inside this module, whose functions have tables called `table`
