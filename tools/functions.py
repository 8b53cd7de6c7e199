"""The tools a model uses to page its own memory. Each is a typed function whose docstring
is written for the model; its schema is derived (tools/schema.py). Every tool returns text:
a mistake of the model comes back as text it can act on, never as an exception.

The first parameter is the session, injected by the dispatcher.
"""

from __future__ import annotations

from typing import Literal

from pager.errors import PagerError
from pager.page import parse_page_id
from pager.session import Session

SNIPPET_CHARS = 160


class Mistake(Exception):
    """A call the model should make differently; its message says how (returned as a failed tool result)."""


def _ids(session: Session, ns) -> str:
    return ", ".join(f"p{n}" for n in ns)


def search(session: Session, query: str, k: int = 5) -> str:
    """Search all of this conversation's memory, resident or on disk. Returns page ids with
    their date, bookmarks and a one-line snippet of the best match, not whole pages; call
    page_in with an id to read a page.

    Args:
        query: words, names, numbers or dates to look for
        k: how many pages to return (1-20)
    """
    if k < 1:
        raise Mistake(f"search needs k of 1 or more (it was {k}); k is how many pages to return, up to 20")
    k = min(k, 20)
    hits = session.search(query, k=k)
    history = _state_history(session, query)
    if not hits:
        return "\n".join(history + [f"no page matches {query!r}; try other words or a bookmark keyword from the memory map"])
    weak = session.weak(query, hits)
    if all(weak):
        head = (f"no page matches {query!r} by its words. The {len(hits)} nearest by meaning, weak (read one before "
                "relying on it, or try other words, a name, a date or a bookmark keyword):")
    else:
        head = f"{len(hits)} page(s) for {query!r}" + (f" ({sum(weak)} weak: no word of the query, near by meaning only)"
                                                      if any(weak) else "") + ":"
    lines = history + [head]
    for hit, faint in zip(hits, weak):
        where = "resident" if session.table[hit.n].resident else "on disk"
        marks = ", ".join(session.directory.keywords(hit.n)[:4])
        lines.append(f"- p{hit.n} ({session.render.page_dates(hit.n)}, {where}, score {hit.score:.2f}{', weak' if faint else ''}"
                     f"{', bookmarks: ' + marks if marks else ''}): {session.render.snippet(hit, SNIPPET_CHARS)}")
    return "\n".join(lines)


def _state_history(session: Session, query: str, keys: int = 3) -> list[str]:
    """Keys of the working state the query names, with their earlier values: `state home city: Berlin
    (since p12); before: Paris (p3, change 1)`."""
    out: list[str] = []
    for key in dict.fromkeys(c.key for c in session.state.find(query)):
        changes = session.state.history(key)
        now = session.state.current.get(key)
        earlier = [c for c in changes if c is not now and not c.unset][::-1]
        line = f"state {key}: " + (f"{now.value} (since p{now.page})" if now else "not set now")
        if earlier:
            line += "; before: " + ", ".join(f"{c.value} (p{c.page}, change {c.seq})" for c in earlier[:3])
        out.append(line)
        if len(out) == keys:
            break
    return out


def page_in(session: Session, page: str) -> str:
    """Load a page into memory so its full text is in your context from the next step on.
    Give a page id such as "p42", or a bookmark keyword from the memory map (the best
    matching page for that keyword is loaded).

    Args:
        page: a page id like "p42", or a bookmark keyword
    """
    target = page.strip()
    if not target:
        raise Mistake("page_in needs a page id like 'p42' or a bookmark keyword")
    try:
        numbers = [session.resolve(target)]
    except PagerError as exc:
        if parse_page_id(target) is not None:
            raise Mistake(f"{exc}; call search to find the right page") from None
        found = sorted(session.directory.lookup(target), reverse=True)
        if not found:
            hits = session.search(target, k=1, record=False)
            if not hits:
                raise Mistake(f"no page is called or bookmarked {target!r}; call search first to find page ids") from None
            found = [hits[0].n]
        numbers = found[:3]
    moved = []
    for n in numbers:
        if n == session.tail_n:
            moved.append(f"p{n} is the current page and always resident")
            continue
        session.table[n].relevance = max(session.table[n].relevance, 10.0)  # asked for by name: kept longest
        faulted = session.fault(n, "tool")
        moved.append(f"p{n} {'paged in' if faulted else 'was already resident'}")
    return "; ".join(moved) + ". Its text is in your context from the next step."


def page_out(session: Session, page_id: str) -> str:
    """Evict a page you no longer need, freeing its frame. Nothing is lost: it stays on disk
    with its bookmarks and can be paged in again.

    Args:
        page_id: the page to evict, like "p42"
    """
    n = session.resolve(page_id)
    if not session.table[n].resident:
        return f"p{n} is not resident; nothing to do"
    session.page_out(n)
    return f"p{n} paged out; {session.frames.count - session.frames.used()} frame(s) free"


def bookmark(session: Session, page_ids: list[str], keywords: list[str], note: str = "") -> str:
    """Bookmark pages under keywords so they can be found again by keyword (page_in or
    search), with an optional short note saying why they matter.

    Args:
        page_ids: the pages, like ["p12", "p13"]
        keywords: one or more keywords or short phrases
        note: why these pages matter, in a few words
    """
    if not page_ids:
        raise Mistake("bookmark needs at least one page id")
    mark = session.bookmark(page_ids, keywords, note[:500])
    return f"bookmarked {_ids(session, mark.pages)} as {', '.join(mark.keywords)}"


def pin(session: Session, page_id: str) -> str:
    """Keep a page resident until unpinned: for core facts (a name, an allergy, a deadline).
    Pinned pages use frames, so pin sparingly.

    Args:
        page_id: the page to pin, like "p3"
    """
    n = session.resolve(page_id)
    session.pin(n)
    return f"p{n} pinned; {session.pinned_count()} page(s) pinned of {session.frames.count} frames"


def unpin(session: Session, page_id: str) -> str:
    """Let a pinned page be evicted again when memory is needed.

    Args:
        page_id: the page to unpin, like "p3"
    """
    n = session.resolve(page_id)
    if not session.table[n].pinned:
        return f"p{n} was not pinned"
    session.unpin(n)
    return f"p{n} unpinned"


def state_set(session: Session, key: str, value: str) -> str:
    """Keep a current fact in the working state, which is always in your context. For what
    stays true until changed (a city, a deadline, a dose); a new value replaces the old one,
    which stays in memory.

    Args:
        key: a short name, like "home city"
        value: the current value, like "Berlin"
    """
    change = session.set_state(key, value)
    if change is None:
        return f"state {key!r} already is {value!r}; nothing changed"
    return f"state {change.key!r} set to {change.value!r} (change {change.seq}, from p{change.page})"


def state_unset(session: Session, key: str) -> str:
    """Remove a key from the working state. Its history stays in memory.

    Args:
        key: the key, as the state shows it
    """
    change = session.set_state(key, None)
    if change is None:
        keys = ", ".join(session.state.current) or "none"
        raise Mistake(f"state has no key {key!r}; the keys are: {keys}")
    return f"state {change.key!r} unset (change {change.seq})"


def remember(session: Session, text: str, role: Literal["user", "assistant"] = "user", speaker: str = "") -> str:
    """Append a message to memory (durable before this returns). For agents that keep their
    own conversation and use pager as its memory.

    Args:
        text: the message
        role: "user" or "assistant"
        speaker: a name to show instead of the role
    """
    turn = session.append(speaker or role, text, role=role, origin="tool")
    session.write_bookmarks()   # a call to the bookmark model, if one is set, once a batch of pages has sealed
    return f"remembered as turn {turn.turn} on p{session.tail_n}"


def context(session: Session, query: str = "", budget: int = 4096) -> str:
    """The memory block for your own prompt: the memory map and the resident pages, paged
    for the query and never longer than budget tokens.

    Args:
        query: what the next step is about (pages it needs are paged in first); may be empty
        budget: the most tokens the block may take (room for a memory map and two pages at least; at most 200000)
    """
    from pager.context import MAP_FLOOR, build

    smallest = 2 * session.page_tokens + MAP_FLOOR   # a map, the open page and one page of memory
    if budget < smallest:
        raise Mistake(f"a budget of {budget} tokens cannot hold a memory map, the open page and one page of "
                      f"{session.page_tokens} tokens; give budget={smallest} or more")
    ctx = build(session, message=query, budget=min(budget, 200_000), chat=False)
    return ctx.memory


def facts(session: Session, query: str = "", k: int = 10) -> str:
    """Read the facts memory holds: short dated statements, each with the pages it came from.
    An old value stays, marked superseded with its dates. With a query, the facts for it, best
    first; without one, the newest.

    Args:
        query: words to look for; empty for the newest facts
        k: how many facts to return (1-50)
    """
    if k < 1:
        raise Mistake(f"facts needs k of 1 or more (it was {k}); k is how many facts to return, up to 50")
    k = min(k, 50)
    if not session.facts.items:
        return "no facts yet: memory holds pages only (search them)"
    if query.strip():
        vector = session.home.embedder.embed([query])[0].astype("float16").astype("float32")
        found = [f for f, _ in session.facts.search(query, vector, k=k)]
        if not found:
            return f"no fact matches {query!r}; try other words, or search the pages"
    else:
        found = session.facts.items[-k:][::-1]
    return "\n".join([f"{len(found)} fact(s){' for ' + repr(query) if query.strip() else ', newest first'}:"]
                     + [session.facts.line(f) for f in found])


def summaries(session: Session, query: str = "", k: int = 5) -> str:
    """Read the summaries memory holds: the rolling summary of the whole conversation and one
    per episode (a day, a session, a topic), each naming the pages it covers (page_in them for
    the full text). With a query, the episodes for it, best first.

    Args:
        query: words to look for; empty for the rolling summary and the latest episodes
        k: how many episode summaries to return (1-20)
    """
    if k < 1:
        raise Mistake(f"summaries needs k of 1 or more (it was {k}); k is how many to return, up to 20")
    k = min(k, 20)
    held = session.summaries
    if not held.items:
        return "no summaries yet: memory holds pages only (search them)"
    lines: list[str] = []
    if query.strip():
        vector = session.home.embedder.embed([query])[0].astype("float16").astype("float32")
        found = [x for x, _ in held.search(query, vector) if x.kind == "episode"][:k]
        if not found:
            return f"no summary matches {query!r}; try other words, or search the pages"
        lines.append(f"{len(found)} episode summary(ies) for {query!r}:")
    else:
        if held.rolling:
            lines.append(f"rolling summary, version {held.rolling.version}:")
            lines.append(held.line(held.rolling))
        found = held.episodes()[-k:]
        if found:
            lines.append(f"the last {len(found)} episode(s):")
    return "\n".join(lines + [held.line(x) for x in found])


STATE_TOOLS = (state_set, state_unset)   # left out of the compact tier of a small budget (pager.agent)
MODEL_TOOLS = (search, page_in, page_out, bookmark, pin, unpin) + STATE_TOOLS
AGENT_TOOLS = MODEL_TOOLS + (remember, context, facts, summaries)
