"""What a dead process's other ops become when another home numbered over its turns.

A process that dies holding a session's lease leaves acknowledged ops in its journal: turns, and
state changes, facts, summaries, bookmarks and pins. Once the lease lapses another home may write
the session and give its own turns, state changes, facts and summaries the numbers the dead
process had given its own. Recovery (Recovery.recover_ops) keeps the dead process's turns after the
session's last turn (Recovery.renumber_lost); this module makes the rest of its ops follow them:

- what an op refers to follows the turns it referred to: a state change's turn and the page it
  came from, a fact's turns and pages, a summary's first and last turn and page, and the pages of
  a bookmark or a pin. A page number is mapped through the turns that page held when the dead
  process wrote the op: its pages are packed again from its own turns (packing is deterministic,
  and both processes packed the same turns up to the first one numbered over).
- a state change, fact or summary whose number the store holds for another record moves after the
  store's last, with every later one of its kind, in the order acknowledged (as its turns do); a
  summary moved also takes the next version of its key. One the store already holds (a recovery
  cut short stored it) is not stored twice.

A summary whose turns ran from before the first turn numbered over to after it covers, once
renumbered, the other home's turns in between too: a summary covers a range of turns.
"""

from __future__ import annotations

from typing import Any, Callable

from .page import Packer, Turn
from .summaries import EPISODE

Numbers = dict[int, int]   # a dead turn's number → its number once recovered


def follow(s, ops: list[dict], numbers: Numbers, first: int, store) -> list[dict]:
    """The dead process's ops of session s (as journaled) but its turns and settings: referring to the
    turns as recovered, and numbered after the store's records where the store holds others at their
    numbers. Call after the dead turns were taken in (s holds their pages); `numbers` (a dead turn's
    number → its number now) and `first` (the first turn numbered over) as Recovery.renumber_lost made them."""
    rest = [op for op in ops if op["op"] not in ("turn", "settings")]
    if rest and any(old != new for old, new in numbers.items()):
        rest = _refer(s, ops, rest, numbers, first, store)
    if not any(op["op"] in ("state", "fact", "summary") for op in rest):
        return rest
    ops = rest
    store.refresh()
    user, name = s.user, s.name
    ops = _renumber(ops, "state", "seq", [(c.seq, c) for c in store.state_changes(user, name)],
                    lambda op, c: (op["key"], op["value"], op["unset"], float(op["ts"]), op["source"])
                    == (c.key, c.value, c.unset, c.ts, c.source))
    ops = _renumber(ops, "fact", "n", [(f.n, f) for f in store.facts(user, name)],
                    lambda op, f: (op["subject"], op["text"], float(op["ts"]), op["source"], bool(op.get("ends", False)))
                    == (f.subject, f.text, f.ts, f.source, f.ends))
    summaries = store.summaries(user, name)
    return _renumber(ops, "summary", "n", [(x.n, x) for x in summaries],
                     lambda op, x: (op["kind"], op["key"], op["text"], float(op["ts"]), op["source"])
                     == (x.kind, x.key, x.text, x.ts, x.source), _versions(summaries))


def _renumber(ops: list[dict], kind: str, field: str, stored: list[tuple[int, Any]],
              same: Callable[[dict, Any], bool], versions: dict[str, int] | None = None) -> list[dict]:
    """Ops of one kind whose numbers the store holds for other records: the first such one and every
    later one of the kind go after the store's last (but for those filling numbers the store skipped),
    in order; those the store holds already are dropped. Other ops are kept as they are, in place."""
    held = dict(stored)
    mine = sorted((op for op in ops if op["op"] == kind), key=lambda op: op[field])
    lost = [op[field] for op in mine if op[field] in held and not same(op, held[op[field]])]
    if not lost:
        return ops
    first, last = min(lost), max(held)
    if versions is not None:   # a summary's version counts the versions of its key kept before it
        for op in mine:
            if op[field] < first:
                versions[op["key"]] = max(versions.get(op["key"], 0), op["version"])
    base = last
    moved: dict[int, dict | None] = {}
    for op in mine:
        number = op[field]
        if number < first or (number < last and number not in held):
            continue   # before the first clash, or a number the store skipped: kept at its number
        if any(same(op, record) for n, record in stored if n >= first):
            moved[id(op)] = None   # stored already (a recovery cut short): once
            continue
        base += 1
        new = {**op, field: base}
        if versions is not None:
            new["version"] = versions[op["key"]] = versions.get(op["key"], 0) + 1
        moved[id(op)] = new
    out = [moved[id(op)] if id(op) in moved else op for op in ops]
    return [op for op in out if op is not None]


def _versions(summaries) -> dict[str, int]:
    out: dict[str, int] = {}
    for x in summaries:
        out[x.key] = max(out.get(x.key, 0), x.version)
    return out


def _refer(s, journaled: list[dict], ops: list[dict], numbers: Numbers, first: int, store) -> list[dict]:
    """Turn and page numbers in the ops mapped to where those turns are now (journaled: all the dead
    process's ops of the session, its turns at their old numbers)."""
    def turn(n: int) -> int:
        return numbers.get(n, n)

    dead = _dead_pages(s, journaled, first, store)
    wanted = {turn(t) for held in dead.values() for t in held}
    for op in ops:
        if op["op"] == "state":
            wanted.add(turn(op["turn"]))
        elif op["op"] in ("fact", "summary"):
            wanted |= {turn(t) for t in op["turns"]}
    where = s.turn_pages(wanted)   # turn → (pages holding it now, its time)

    def pages_of(n: int) -> list[int]:
        """Where what page n held (as the dead process packed it) is now."""
        if n not in dead:
            return [n]
        now = sorted({p for t in dead[n] if turn(t) in where for p in where[turn(t)][0]})
        return now or [n]

    out: list[dict] = []
    for op in ops:
        kind = op["op"]
        if kind == "state" and (op["turn"] in numbers or op["page"] in dead):
            t = turn(op["turn"])
            out.append({**op, "turn": t, "page": max(where[t][0]) if t in where else max(pages_of(op["page"]))})
        elif kind == "fact" and (any(t in numbers for t in op["turns"]) or any(p in dead for p in op["pages"])):
            turns = [turn(t) for t in op["turns"]]
            pages = {p for t in turns if t in where for p in where[t][0]} if turns else set()
            out.append({**op, "turns": turns,
                        "pages": sorted(pages or {q for p in op["pages"] for q in pages_of(p)})})
        elif kind == "summary" and (any(t in numbers for t in op["turns"]) or any(p in dead for p in op["pages"])):
            a, b = (turn(t) for t in op["turns"])
            start = min(where[a][0]) if a in where else min(pages_of(op["pages"][0]))
            end = max(where[b][0]) if b in where else max(pages_of(op["pages"][1]))
            # an episode is keyed by its first turn (Session.closed_episodes): the key follows it too
            key = f"e{a}" if op["kind"] == EPISODE and op["key"] == f"e{op['turns'][0]}" else op["key"]
            out.append({**op, "key": key, "turns": [a, b], "pages": [start, end]})
        elif kind == "bookmark" and any(p in dead for p in op["pages"]):
            out.append({**op, "pages": sorted({q for p in op["pages"] for q in pages_of(p)})})
        elif kind == "pin" and op["page"] in dead:
            out += [{**op, "page": q} for q in pages_of(op["page"])]
        else:
            out.append(op)
    return out


def _dead_pages(s, ops: list[dict], first: int, store) -> dict[int, tuple[int, ...]]:
    """page → the turns it held (by their old numbers) as the dead process packed them, for its pages
    from the first one that may differ from the session's (the open tail page included). The pages
    before the one holding turn first - 1 were sealed alike by both: packing starts again after them."""
    turns = {op["turn"]: Turn.from_record(op) for op in ops if op["op"] == "turn"}
    sealed = [s.pages[n] for n in sorted(s.pages)]
    k = next((i for i, p in enumerate(sealed) if p.n != i + 1 or p.last_turn >= first - 1), len(sealed))
    packer = Packer(s.name, s.packer.tokenizer, s.page_tokens, next_n=k + 1, user=s.user)
    n, start = (sealed[k - 1].spans[-1][0], sealed[k - 1].spans[-1][2]) if k else (1, 0)
    shared = {t.turn: t for t in store.turns(s.user, s.name, after=n - 1)} if n < first else {}
    out: dict[int, tuple[int, ...]] = {}
    while True:
        t = (shared.get(n) or turns.get(n)) if n < first else turns.get(n)
        if t is None:
            break
        if start < len(t.text):
            for page in packer.add(t, start):
                out[page.n] = page.turns
        n, start = n + 1, 0
    if packer.pieces:
        out[packer.next_n] = tuple(dict.fromkeys(p.turn.turn for p in packer.pieces))
    return out
