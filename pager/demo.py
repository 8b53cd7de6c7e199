"""`pager demo`: the whole engine, offline, on a conversation the project ships.

It ingests nine months of weekly check-ins into a fresh home under a small budget, shows
the frames filling and pages being evicted, then asks questions about facts from months
earlier and shows the pages that hold them faulting back in.
"""

from __future__ import annotations

import shlex
import tempfile
import time
from contextlib import ExitStack
from importlib import resources
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import views
from .config import Config
from .context import build
from .errors import InputError
from .formats import parse_jsonl
from .home import Home


def conversation_path() -> Path:
    return Path(str(resources.files("pager.data").joinpath("demo_conversation.jsonl")))


def run(budget: int = 2048, keep: Path | None = None, console: Console | None = None) -> dict:
    from .data.demo_script import QUESTIONS

    console = console or Console(highlight=False)
    started = time.perf_counter()
    with ExitStack() as stack:
        folder = keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pager-demo-")))
        config = Config(home=folder, budget=budget, session="demo")
        home = stack.enter_context(Home(config))
        session = home.open()
        if session.turn_count:
            raise InputError(f"{folder} already holds the demo's session; give --keep a new folder, or delete that one")
        messages = parse_jsonl(conversation_path(), "demo")["demo"]
        frames = (budget - config.map_reserve) // session.page_tokens
        console.rule("[bold]pager demo[/] · offline · no model, no key")
        console.print(f"A bundled conversation: {len(messages)} turns over {len({m['date'] for m in messages})} weekly "
                      f"check-ins. Budget {budget} tokens → {frames} frames of {session.page_tokens} tokens; "
                      f"everything else lives on disk (LanceDB in {escape(str(folder))}).\n")
        _ingest(session, messages, console)
        results = _ask(session, QUESTIONS, console)
        _report(session, home, results, console)
        _replay(console)
        console.print(f"\nWall time {time.perf_counter() - started:.1f} s.")
        _next(console, keep)
        return {"found": sum(r[2] for r in results), "asked": len(results), **session.stats()}


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
        if i in show:
            line = views.frame_strip(session)
            console.print(f"  week {i + 1:>2} ", line,
                          f" {len(session.pages):>2} pages sealed, {session.counters['evictions']:>2} evicted")
    console.print("  ", views.legend(), "\n")


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
        holder = next((n for n in context.pages if needle in (session.render.body(n) or "")), None)
        quote = ""
        if holder is not None:
            quote = next(line for line in session.render.body(holder).splitlines() if needle in line)
        console.print(f"  [bold]Q:[/] {question}")
        console.print("     faulted in:", ", ".join(faulted) or "none (already resident)",
                      f"· evicted {sum(e.kind == 'evict' for e in events)}")
        console.print("    ", views.frame_strip(session, {int(p[1:]) for p in faulted}))
        if holder is not None:
            console.print(f"     [green]✓[/] p{holder} ({session.render.page_dates(holder)}) is in the prompt: “{quote[:110]}”")
        else:
            console.print(f"     [red]✗[/] the page holding “{needle}” is not resident")
        results.append((question, faulted, holder is not None, quote))
    console.print()
    return results


def _report(session, home: Home, results, console: Console) -> None:
    console.print("[bold]3. Report[/]")
    stats = session.stats()
    home.flush()
    on_disk = home.store.turn_count(session.user, session.name)
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("facts found in the prompt", f"{sum(r[2] for r in results)} / {len(results)}")
    table.add_row("faults / hits / evictions", f"{stats['faults']} / {stats['hits']} / {stats['evictions']}")
    table.add_row("turns accepted / on disk", f"{stats['turns']} / {on_disk} (eviction never drops a page)")
    table.add_row("pages on disk / frames", f"{stats['pages']} / {stats['frames']}")
    console.print(table)


def _replay(console: Console) -> None:
    from . import replay as rp

    trace = Path(str(resources.files("pager.data").joinpath("demo_trace.jsonl")))
    console.print("\n[bold]4. Replay[/] — a bundled trace of this conversation with the offline agent is re-run "
                  "through the live engine and compared event by event, then re-run under each policy:")
    run = rp.replay(trace, check=True)
    verdict = "[green]reproduced exactly[/]" if run.divergence is None else f"[red]{run.divergence.describe()}[/]"
    console.print(f"  {len(run.recorded)} recorded events {verdict}")
    start, _ = rp.load(trace)
    console.print(rp.policy_table([run] + [rp.replay(trace, policy=p) for p in ("lru", "lfu", "scored")],
                                  start["policy"], trace))
