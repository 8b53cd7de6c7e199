"""fsck for memory: check, from outside the engine, that a session holds what it acknowledged.

Reads what every process can read (the store and every journal segment) and checks the write
path's invariants: turns are numbered 1..N with no gap and no number used twice; a turn in the
store and in a journal is the same turn; the stored pages run p1..pk with no gap, and their
pieces, laid end to end, are exactly the turn sequence from turn 1 on, so every turn is on
exactly one page or, after the last page, in the open tail. `pager check` runs it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .page import Turn


@dataclass
class Report:
    session: str
    turns: int = 0
    pages: int = 0
    tail_turns: int = 0      # stored after the last sealed page
    journal_turns: int = 0   # held by a journal of the home only: not in the store yet
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


NUMBERED_OVER = ("; if a process of this home died holding the second, another home has since numbered over it: "
                 "any command that writes from this home (`pager migrate`) recovers it, kept after the last turn")


NEWER = ("a journal of this home holds records of journal v{}, written by a newer pager, which this one cannot "
         "read (they may be turns of this session): run the newer pager on this home once, and it stores them")


def durable_turns(home, user: str, session: str, problems: list[str] | None = None, after: int = 0,
                  journal_only: set[int] | None = None) -> list[Turn]:
    """Every turn of the session (after turn `after`) the store or a journal holds, by number (one each);
    the numbers only a journal holds are added to `journal_only`."""
    problems = [] if problems is None else problems
    store = home.reader(user, session)   # a read-only home: the session's snapshot when it is current
    if store is home.loaded_store:
        store.refresh()
    by_number: dict[int, Turn] = {}
    for t in store.turns(user, session, after=after):
        if t.turn in by_number and by_number[t.turn].text != t.text:
            problems.append(f"turn {t.turn} is stored twice with different texts")
        by_number.setdefault(t.turn, t)
    for op in home.journal.read_new({}, own=True):
        if op["op"] != "turn" or (op["user"], op["session"]) != (user, session):
            continue
        t = Turn.from_record(op)
        if t.turn <= after:
            continue
        known = by_number.setdefault(t.turn, t)
        if known is t and journal_only is not None:
            journal_only.add(t.turn)
        if (known.text, known.speaker) != (t.text, t.speaker):
            problems.append(f"turn {t.turn} means two messages: {_short(known.text)!r} and {_short(t.text)!r}"
                            f"{NUMBERED_OVER}")
    return [by_number[n] for n in sorted(by_number)]


def check(home, user: str, session: str) -> Report:
    report = Report(session)
    problems = report.problems
    unflushed: set[int] = set()
    turns = durable_turns(home, user, session, problems, journal_only=unflushed)
    if home.journal.newer:
        problems.append(NEWER.format(home.journal.newer))
    report.turns = len(turns)
    numbers = [t.turn for t in turns]
    if numbers != list(range(1, len(turns) + 1)):
        missing = sorted(set(range(1, (max(numbers) if numbers else 0) + 1)) - set(numbers))
        problems.append(f"turn numbers have gaps: {missing[:10]}")
    by_number = {t.turn: t for t in turns}
    pages, _ = home.reader(user, session).pages(user, session, with_vectors=False)
    report.pages = len(pages)
    if [p.n for p in pages] != list(range(1, len(pages) + 1)):
        problems.append(f"pages are not p1..p{len(pages)}: {[p.n for p in pages][:20]}")
    expect_turn, expect_start = 1, 0
    for page in pages:
        for i, (turn, start, end) in enumerate(page.spans):
            t = by_number.get(turn)
            if t is None:
                problems.append(f"{page.id} holds turn {turn}, which no journal or store holds")
                return report
            if (turn, start) != (expect_turn, expect_start):
                problems.append(f"{page.id} piece {i} is turn {turn} from char {start}; expected turn {expect_turn} "
                                f"from char {expect_start} (a turn on two pages, or on none)")
                return report
            if not page.piece_text(i).endswith(t.text[start:end]):
                problems.append(f"{page.id} piece {i} does not hold turn {turn}'s text [{start}:{end}]")
            expect_turn, expect_start = (turn, end) if end < len(t.text) else (turn + 1, 0)
    # a process flushes its journal's turns in batches, and a dead one's wait for the next process that writes
    report.journal_turns = len(unflushed)
    report.tail_turns = max(0, len(turns) - expect_turn + 1 - report.journal_turns)
    return report


def acknowledged(home, user: str, session: str, acked: list[tuple[int, str]]) -> list[str]:
    """Problems with turns a caller was told were accepted: each must be stored once, with its text."""
    turns = durable_turns(home, user, session)
    texts: dict[str, list[int]] = {}
    for t in turns:
        texts.setdefault(t.text, []).append(t.turn)
    problems = []
    for number, text in acked:
        held = texts.get(text, [])
        if not held:
            problems.append(f"turn {number} ({_short(text)!r}) was acknowledged and is lost")
        elif len(held) > 1:
            problems.append(f"{_short(text)!r} is stored {len(held)} times: turns {held}")
        elif number not in held:
            problems.append(f"{_short(text)!r} was acknowledged as turn {number} but is turn {held}")
    return problems


def _short(text: str) -> str:
    return text if len(text) < 60 else text[:57] + "..."
