"""`pager demo`: the whole engine, offline, on a conversation the project ships.

It ingests nine months of weekly check-ins into a fresh home under a small budget, shows
the frames filling and pages being evicted, then asks questions about facts from months
earlier and shows the pages that hold them faulting back in. Then the memory tiers: the
facts a memory model would write (recorded by the project for this conversation, so no model
is called), one superseded when its value changed, and the working state the offline shell
keeps when Maya states a value, and the summaries written offline (one per episode, and a
rolling one).
"""

from __future__ import annotations

import shlex
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.text import Text
from rich.markup import escape
from rich.table import Table

from . import views
from .config import Config
from .context import build, size_frames
from .errors import InputError
from .formats import parse_jsonl
from .home import Home


def conversation_path() -> Path:
    return Path(str(resources.files("pager.data").joinpath("demo_conversation.jsonl")))


def recorded_memory():
    """The demo's recorded memory model: facts the project wrote for its conversation (demo_memory.jsonl)."""
    import json

    from .facts import Recorded

    path = Path(str(resources.files("pager.data").joinpath("demo_memory.jsonl")))
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    refs = {str(t) for row in rows for t in row["turns"]}
    return Recorded([(r["subject"], r["text"], [str(t) for t in r["turns"]]) for r in rows], {r: int(r) for r in refs})


def run(budget: int = 2048, keep: Path | None = None, console: Console | None = None) -> dict:
    from .data.demo_script import QUESTIONS

    console = console or Console(highlight=False)
    started = time.perf_counter()
    if keep is not None and keep.exists() and not keep.is_dir():
        raise InputError(f"--keep {keep} is a file; give a folder for the demo's home (made if missing)")
    if keep is not None and keep.is_dir() and not is_home(keep) and (held := sorted(p.name for p in keep.iterdir())):
        raise InputError(f"--keep {keep} holds other files ({', '.join(held[:3])}{', …' if len(held) > 3 else ''}) and "
                         "is not a pager home; give a new or empty folder for the demo's home (made if missing)")
    with ExitStack() as stack:
        folder = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pager-demo-")))
        config = Config(home=folder, budget=budget, session="demo")
        home = stack.enter_context(Home(config))
        session = home.open()
        if session.turn_count:
            raise InputError(f"{folder} already holds the demo's session; give --keep a new folder, or delete that one")
        messages = parse_jsonl(conversation_path(), "demo")["demo"]
        frames, reserve, _ = size_frames(session, chat=False)   # the budget's frames: every count of frames printed
        console.rule("[bold]pager demo[/] · offline · no model, no key")
        console.print(f"A bundled conversation: {len(messages)} turns over {len({m['date'] for m in messages})} weekly "
                      f"check-ins. Budget {budget} tokens, less {reserve} for the memory map → {frames} frames of "
                      f"{session.page_tokens} tokens; everything else lives on disk (LanceDB in {escape(str(folder))}).\n")
        paging: dict[str, tuple[int, int, int]] = {}
        with _counted(session, paging, "ingest"):
            _ingest(session, messages, console)
        sealed = len(session.pages)
        with _counted(session, paging, "questions"):
            results = _ask(session, QUESTIONS, console)
        with _counted(session, paging, "memory tiers"):
            tiers = _tiers(session, console)
        _report(session, home, results, console, Numbers(frames, len(messages), sealed, paging))
        _replay(console, frames, paging)
        console.print(f"\nWall time {time.perf_counter() - started:.1f} s.")
        _next(console, keep)
        return {"found": sum(r[2] for r in results), "asked": len(results), **tiers, **session.stats()}


PAGING = ("faults", "hits", "evictions")


@dataclass(frozen=True)
class Numbers:
    """The figures the demo states first, which its report counts again: one definition each."""

    frames: int                                  # the budget's frames (budget less the memory map, in pages)
    turns: int                                   # the bundled conversation's turns
    sealed: int                                  # pages sealed by its ingest (section 1)
    paging: dict[str, tuple[int, int, int]]      # section → (faults, hits, evictions) the session counted in it


@contextmanager
def _counted(session, into: dict, section: str) -> Iterator[None]:
    """The session's own counters over one section of the demo, so that the report's figures add up."""
    before = [session.counters[k] for k in PAGING]
    yield
    into[section] = tuple(session.counters[k] - b for k, b in zip(PAGING, before))


def is_home(folder: Path) -> bool:
    """Whether a folder is a pager home: any writing command makes its traces folder and a journal (under
    stores/ for a store that --db put elsewhere)."""
    return (folder / "traces").is_dir() and ((folder / "journal").is_dir() or (folder / "stores").is_dir())


def _next(console: Console, keep: Path | None) -> None:
    """Where to go from here: commands that find data, never an empty session."""
    if keep:
        home = f"--home {shlex.quote(str(keep))}"
        console.print(f"The demo's home is kept in {keep}. Next, on it: `pager {home} chat --session demo` "
                      f"(ask it about the Lisbon offsite), `pager {home} inspect --session demo`, "
                      f"`pager {home} search 'peanut allergy' --session demo`.", highlight=False, soft_wrap=True, markup=False)
    else:
        console.print("The demo's home was a temporary folder, now removed. To keep it and go on with it: "
                      "`pager demo --keep DIR`, then `pager --home DIR chat --session demo`.", highlight=False, soft_wrap=True, markup=False)
    console.print("With your own conversation: `pager ingest FILE --session NAME`, then `pager chat --session NAME`; "
                  "`pager sessions` lists what a home holds, `pager --help` everything else.", highlight=False, soft_wrap=True, markup=False)


def _ingest(session, messages: list[dict], console: Console) -> None:
    console.print("[bold]1. Ingest[/] — each week's turns are appended (journal first, then pages); "
                  "when the frames are full the policy evicts:")
    by_date: dict[str, list[dict]] = {}
    for m in messages:
        by_date.setdefault(m["date"], []).append(m)
    weeks = list(by_date.items())
    show = {0, 1, 2, 3, 5, 8, 12, 18, 24, len(weeks) - 1}
    for i, (_date, chunk) in enumerate(weeks):
        session.append_many(chunk)
        if i in show:   # the counts, then the frames on a line of their own: fifteen fit 80 columns
            sealed = len(session.pages)
            console.print(f"  week {i + 1:>2}: {sealed} page{'s' if sealed != 1 else ''} sealed, "
                          f"{session.counters['evictions']} evicted")
            console.print("    ", views.frame_strip(session))
    console.print(Text("  ").append_text(views.legend()))   # 80 columns, as the strips
    console.print()


def _ask(session, questions, console: Console) -> list[tuple[str, list[str], bool, str]]:
    console.print("[bold]2. Ask[/] — months later, each question is the query for automatic paging "
                  "(bookmarks + BM25 + vectors); the pages it needs fault back in:")
    results = []
    for question, needle in questions:
        events: list = []
        session.events.listeners.append(events.append)
        context = build(session, question, chat=False)
        session.events.listeners.remove(events.append)
        faulted = [e.data["page"] for e in events if e.kind == "fault"]
        hits = sum(e.kind == "hit" for e in events)
        holder = next((n for n in context.pages if needle in (session.render.body(n) or "")), None)
        quote = ""
        if holder is not None:
            quote = next(line for line in session.render.body(holder).splitlines() if needle in line)
        console.print(f"  [bold]Q:[/] {question}")
        console.print("     faulted in:", ", ".join(faulted) or "none",
                      f"· {hits} hits (wanted, already resident) · evicted {sum(e.kind == 'evict' for e in events)}")
        console.print("    ", views.frame_strip(session, {int(p[1:]) for p in faulted}))
        if holder is not None:
            console.print(f"     [green]✓[/] p{holder} ({session.render.page_dates(holder)}) is in the prompt: “{quote[:110]}”")
        else:
            console.print(f"     [red]✗[/] the page holding “{needle}” is not resident")
        results.append((question, faulted, holder is not None, quote))
    console.print()
    return results


def _tiers(session, console: Console) -> dict:
    """Facts from the recorded memory model, one superseded; state the offline shell parses; and a
    question about the value before. A row per tier, so a tier that arrives later adds its own."""
    from .agent import Agent
    from .data.demo_script import BEFORE, STATEMENTS
    from .model import HandlerModel
    from .offline import OfflineShell
    from .summaries import Extractive

    console.print("[bold]3. Memory tiers[/] — facts a memory model would write (recorded by the project for this "
                  "conversation: no model is called), and the working state the offline shell keeps:")
    facts = session.extract_facts(recorded_memory())
    old = [f for f in facts if session.facts.superseded_by(f) is not None]
    console.print(f"  [bold]facts[/]      {len(facts)} written from the pages, {len(old)} superseded "
                  "(kept, with the date it stopped being true):")
    for f in old[:1]:
        for line in (session.facts.line(f), session.facts.line(session.facts.superseded_by(f))):
            console.print(f"     {escape(line)}", highlight=False)
    agent = Agent(session, HandlerModel(OfflineShell()), speaker="Maya")
    for text in STATEMENTS:
        reply = agent.ask(text)
        console.print(f"  [bold]Maya:[/] {escape(text)}  [dim]→ {escape(', '.join(c['name'] for c in reply.tool_calls))}[/]",
                      highlight=False)
    for key, change in session.state.current.items():
        before = [c.value for c in session.state.history(key)[:-1]]
        console.print(f"  [bold]state[/]      {escape(key)}: {escape(change.value)} (p{change.page})"
                      + (f" · before: {escape(', '.join(before))}" if before else ""), highlight=False)
    question, needle = BEFORE
    context = build(session, question, chat=False)
    fact = next(f for f in session.facts.items if needle in f.text)
    holder = next((n for n in context.pages if needle in (session.render.body(n) or "")), None)
    console.print(f"  [bold]Q:[/] {escape(question)}")
    if fact.n in context.facts:
        console.print(f"     [green]✓[/] the superseded fact is in the prompt: {escape(session.facts.line(fact))}",
                      highlight=False)
    elif holder is not None:   # its page is in view, so the fact gives its frame share to others
        later = session.facts.superseded_by(fact)
        console.print(f"     [green]✓[/] p{holder} ({session.render.page_dates(holder)}) is in the prompt with the old "
                      f"value, which {fact.id} marks superseded by {later.id} on {later.date}", highlight=False)
    else:
        console.print(f"     [red]✗[/] neither {fact.id} nor its page is in the prompt")
    answer = fact if fact.n in context.facts or holder is not None else None
    made = session.summarize(Extractive())   # offline: the central sentences of each closed episode, verbatim
    episodes, rolling = session.summaries.episodes(), session.summaries.rolling
    console.print(f"  [bold]summaries[/]  {len(episodes)} episodes (a check-in, or a shift of topic) and a rolling "
                  f"summary of the whole session ({rolling.span if rolling else 'none yet'}), written offline: "
                  "the most central sentences, verbatim; the episode of the team's change:", highlight=False)
    changed = session.facts.superseded_by(old[0]) if old else None
    page = changed.pages[0] if changed and changed.pages else 0
    episode = next((e for e in episodes if e.pages[0] <= page <= e.pages[1]), None)
    if episode is not None:
        line = session.summaries.line(episode)
        console.print(f"     {escape(line if len(line) <= 160 else line[:159] + '…')}", highlight=False)
    console.print()
    return {"facts": len(facts), "superseded": len(old), "state": session.state.values(), "before": answer is not None,
            "summaries": len(made)}


def _report(session, home: Home, results, console: Console, numbers: Numbers) -> None:
    from .data.demo_script import STATEMENTS

    console.print("[bold]4. Report[/]")
    stats = session.stats()
    home.flush()
    on_disk = home.store.turn_count(session.user, session.name)
    added = stats["turns"] - numbers.turns   # section 3's: Maya's statements and the shell's replies
    rest = numbers.frames - stats["frames"]
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("facts found in the prompt", f"{sum(r[2] for r in results)} / {len(results)} (section 2's questions)")
    table.add_row("turns accepted / on disk", f"{stats['turns']} / {on_disk}: the conversation's {numbers.turns} and "
                  f"section 3's {added} (Maya's {len(STATEMENTS)} statements, the shell's {added - len(STATEMENTS)} replies); "
                  "eviction never drops a page")
    table.add_row("pages sealed", f"{stats['pages']} ({numbers.sealed} in section 1, {stats['pages'] - numbers.sealed} "
                  f"in section 3), and p{session.tail_n} the open tail")
    table.add_row("frames", f"{numbers.frames} of {session.page_tokens} tokens; {stats['frames']} hold pages now"
                  + (f", {rest} section 3's tiers (state, summaries, fact slabs)" if rest else ""))
    table.add_row("faults / hits / evictions", f"{stats['faults']} / {stats['hits']} / {stats['evictions']}, all of "
                  "this session:")
    for i, (name, counted) in enumerate(numbers.paging.items(), 1):
        table.add_row(f"  {i}. {name}", " / ".join(map(str, counted)))
    console.print(table)


def _replay(console: Console, frames: int, paging: dict[str, tuple[int, int, int]]) -> None:
    """The bundled trace, replayed; its figures are told apart from the demo's own (`paging`, by section)."""
    from . import replay as rp

    ingest_evictions, questions = paging["ingest"][2], paging["questions"]
    trace = Path(str(resources.files("pager.data").joinpath("demo_trace.jsonl")))
    console.print("\n[bold]5. Replay[/] — a bundled trace, another run than sections 1–4: the same conversation and "
                  "six questions, asked through the agent loop as `pager chat` asks them (the offline shell answering), "
                  "re-run through the live engine and compared event by event, then under each policy:")
    run = rp.replay(trace, check=True)
    verdict = "[green]reproduced exactly[/]" if run.divergence is None else f"[red]{run.divergence.describe()}[/]"
    first = next((i for i, e in enumerate(run.events) if e["kind"] == "user"), len(run.events))
    ingesting = sum(e["kind"] == "evict" for e in run.events[:first])
    asked = sum(e["kind"] == "fault" for e in run.events[first:])
    console.print(f"  {len(run.recorded)} recorded events {verdict}: {run.faults} faults / {run.count('hit')} hits / "
                  f"{run.count('evict')} evictions, {ingesting} of them while ingesting"
                  + (" as in section 1" if ingesting == ingest_evictions else f" (section 1: {ingest_evictions})"))
    runs = [run] + [rp.replay(trace, policy=p) for p in ("lru", "lfu", "scored")]
    console.print(rp.policy_table(runs, trace))
    held = sorted(set(run.frames), reverse=True)
    other = "" if run.start_frames == frames else f"recorded under another budget, of {run.start_frames} frames, "
    console.print(f"  These count the recorded chat, not this demo's session (section 4): section 2 paged for each "
                  f"question with all {frames} frames and no model, faulting {questions[0]} times; in the chat, {other}"
                  f"the system prompt, the tool schemas and the tool exchange share the budget, so "
                  f"{', then '.join(map(str, held))} of the {run.start_frames} frames hold pages, and its six questions "
                  f"fault {asked} times.", highlight=False)
    if len({r.faults for r in runs}) == 1 and not any(r.count("hit") for r in runs):
        # a table of equal rows reads as a broken comparison: say why they are equal
        console.print(f"  Under every policy each page a question needs is out of the frames by then, so all fault the "
                      f"same {run.faults} times (no hits); they differ in the pages they keep (contexts changed), and a "
                      f"clairvoyant policy would fault {run.opt()} times. `pager replay TRACE --policy all` compares "
                      "them on a trace of your own.", highlight=False)
