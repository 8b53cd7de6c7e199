"""The `pager` command. Heavy imports (LanceDB, litellm, the embedder) happen inside the
commands that need them, so `pager --help` stays instant."""

from __future__ import annotations

import errno
import functools
import json
import os
import shlex
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Optional

import typer

from pager.cli.owners import held_by, where
from pager.errors import InputError, PagerError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    help="Virtual memory for LLM agents: page frames under a token budget, pages on disk, "
    "faults, eviction, and traces you can replay.",
)


def handles_errors(fn):
    """Known failures become one line naming the fix and a non-zero exit, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from rich.console import Console

        Console.on_broken_pipe = _broken_pipe   # rich's own handler exits 1 where the bare echoes exit 141
        try:
            return fn(*args, **kwargs)
        except PagerError as exc:
            typer.echo(f"pager: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            typer.echo("pager: interrupted; everything acknowledged is in the journal", err=True)
            raise typer.Exit(130) from None
        except BrokenPipeError:   # the reader went away (`pager export | head`): stop quietly, as cat and git do
            stdout_gone()
            raise typer.Exit(141) from None
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                raise
            # `pager export > file` on a full disk (the engine's own writes say so as a StoreError): one line
            try:
                sys.stdout.flush()
            except OSError:
                stdout_gone()   # what it holds cannot be written at exit either
            typer.echo(f"pager: a write failed ({exc.strerror or exc}); free space where the output goes, or send "
                       "it elsewhere, and run it again", err=True)
            raise typer.Exit(1) from None

    return wrapper


def _broken_pipe(console) -> None:
    console.quiet = True
    raise BrokenPipeError


def stdout_gone() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what it still holds fails no more
    (the recipe of Python's signal docs, "Note on SIGPIPE")."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):   # a stdout with no descriptor (a test runner's) has nothing to flush there
        pass


def command(*args, **kwargs):
    def register(fn):
        return app.command(*args, **kwargs)(handles_errors(fn))

    return register


def _version(shown: bool) -> None:
    if shown:
        from pager import __version__

        typer.echo(f"pager {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    ctx: typer.Context,
    home: Optional[str] = typer.Option(None, "--home", metavar="<path>", help="data folder (default $PAGER_HOME or ~/.pager)"),
    db: Optional[str] = typer.Option(None, "--db", help="LanceDB URI (default $PAGER_DB or <home>/db); s3://… works"),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_version,
                                 help="print pager's version and exit"),
) -> None:
    ctx.obj = {"home": home, "db": db}


def load_config(ctx: typer.Context, **flags):
    from pager.config import Config

    obj = ctx.obj or {}
    return Config.load(home=obj.get("home"), db=obj.get("db"), **flags)


def open_home(config, read_only: bool = False):
    """The home; commands that only look open it read-only (they write nothing, not even a cache).
    Damage the engine found and skipped is said on stderr, one line each."""
    from pager.home import Home

    return Home(config, read_only=read_only, warn=lambda message: typer.echo(f"pager: warning: {message}", err=True))


def existing_trace(ctx: typer.Context, trace: Path) -> None:
    """Refuse a trace path with nothing there, naming this home's traces folder (--home, PAGER_HOME)."""
    if not trace.exists():

        raise InputError(f"no trace at {trace}; list this home's traces with `ls {load_config(ctx).home / 'traces'}`")


def writable(path: Optional[Path], flag: str) -> None:
    """Refuse an output path that cannot be written, before any work is done for it."""
    import os


    if path is None:
        return
    if path.is_dir():
        example = {"--json": "report.json", "--html": "timeline.html", "--plot": "recall.png"}.get(flag, "out.jsonl")
        raise InputError(f"{flag} {path} is a folder; give a file path in it, e.g. {flag} {path / example}")
    parent = path.parent
    if not parent.is_dir():
        raise InputError(f"{flag} {path}: the folder {parent} does not exist; create it (mkdir -p {parent}) or pick another path")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{flag} {path} is not writable; pick a path you can write")


def fresh_folder(path: Optional[Path], flag: str) -> None:
    """Refuse a bench's --keep folder that already holds something: the bench would build into it,
    mixing its synthetic sessions with what is there and measuring both."""

    if path is None or not path.exists():
        return
    if not path.is_dir():
        raise InputError(f"{flag} {path} is a file; give a new or empty folder")
    if any(path.iterdir()):
        raise InputError(f"{flag} {path} is not empty; a bench builds its own home: give a new or empty folder")


def write_report(path: Path, text: str, flag: str) -> bool:
    """Write a finished report; if the disk refuses now, print it on stdout rather than lose it."""
    try:
        path.write_text(text)
        return True
    except OSError as exc:
        typer.echo(f"pager: could not write {flag} {path} ({exc.strerror or exc}); the report follows on stdout", err=True)
        typer.echo(text)
        return False


def existing(home):
    """The configured session, or one line saying there is none by that name and where to look."""
    s = home.open()
    if not s.begun:
        raise _not_found(home, s.user, s.name)
    return s


def require(home, user: str, session: str) -> None:
    """For commands that read a session without opening it (export, check)."""
    if not home.exists(user, session):
        raise _not_found(home, user, session)


def _not_found(home, user: str, session: str):
    from pager.errors import SessionNotFound

    of_user = f" of user {user!r}" if user else ""
    try:
        rows = home.session_rows()
    except Exception:  # noqa: BLE001 - the message names `pager sessions` all the same
        rows = []
    names = [r["session"] for r in rows if r["user"] == user]
    owners = [r["user"] for r in rows if r["session"] == session and r["user"] != user]
    if owners:   # made under another PAGER_USER (or none): the session is there, the setting differs
        hint = held_by(owners[0])
    elif len(names) == 1:
        hint = f"it holds {names[0]!r}: add --session {shlex.quote(names[0])}"
    elif names:
        shown = ", ".join(repr(n) for n in names[:5]) + (", …" if len(names) > 5 else "")
        hint = f"it holds {len(names)} sessions ({shown}): name one with --session; `pager sessions` lists them"
    else:
        hint = "`pager sessions` lists the sessions there"
    return SessionNotFound(f"no session {session!r}{of_user} in {where(home)}; {hint}")


@command()
def sessions(
    ctx: typer.Context,
    json_out: bool = typer.Option(False, "--json", help="one JSON object for scripts"),
) -> None:
    """The sessions in the home, per user, with their turns and pages."""
    config = load_config(ctx)
    with open_home(config, read_only=True) as home:
        rows = home.session_rows()
        if json_out:
            typer.echo(json.dumps({"home": str(home.path), "sessions": rows}, ensure_ascii=False))
            return
        if not rows:
            typer.echo(f"no sessions in {where(home)}; `pager ingest FILE` or `pager chat` starts one")
            return
        from rich.console import Console
        from rich.text import Text

        from pager.views import table as fitted

        table = fitted(f"sessions in {where(home)}", ("user", "session", "turns", "pages"), right=("turns", "pages"))
        for r in rows:
            table.add_row(Text(r["user"] or "(none)"), Text(r["session"]), str(r["turns"]), str(r["pages"]))
        Console().print(table)
        typer.echo("open one with --session NAME (and PAGER_USER=NAME for a named user)")


@command()
def ingest(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="conversation file ('-': standard input)"),
    format: str = typer.Option("jsonl", "--format", "-f", help="jsonl or locomo"),
    session: Optional[str] = typer.Option(None, "--session", "-s", help="session to append to (jsonl default: 'default'; locomo: one session per sample unless given)"),
    page_tokens: Optional[int] = typer.Option(None, "--page-tokens", help="page size for new sessions"),
    bookmark_model: Optional[str] = typer.Option(None, "--bookmark-model", help="litellm model that writes bookmarks of sealed pages (or $PAGER_BOOKMARK_MODEL); none: offline keywords only"),
    memory_model: Optional[str] = typer.Option(None, "--memory-model", help="litellm model that writes bookmarks, facts and working-state changes of sealed pages, one call per batch (or $PAGER_MEMORY_MODEL); none: offline memory only"),
) -> None:
    """Import a conversation file into memory (all or nothing)."""
    import time

    from pager.formats import parse_jsonl, parse_locomo

    config = load_config(ctx, page_tokens=page_tokens, bookmark_model=bookmark_model, memory_model=memory_model)
    if session == "":   # refused as chat refuses it, not taken for "no --session" (which is 'default')
        raise InputError("--session '' is empty; give the session a name, or leave --session out for "
                         f"{config.session!r}")
    if format == "jsonl":
        groups = parse_jsonl(file, session or config.session, warn=lambda m: typer.echo(f"pager: warning: {m}", err=True))
    elif format == "locomo":
        conversations = parse_locomo(file, warn=lambda m: typer.echo(f"pager: warning: {m}", err=True))
        if session and len(conversations) > 1:
            groups = {f"{session}-{c.sample_id}": c.messages for c in conversations}
        else:
            groups = {(session or c.sample_id): c.messages for c in conversations}
    else:
        raise InputError(f"unknown format {format!r}; use --format jsonl or --format locomo")
    from pager.formats import carry_dates, keyed

    started = time.perf_counter()
    with open_home(config) as home:
        home.writer  # noqa: B018 - with --bookmark-model or --memory-model, a missing key stops here, before any turn is accepted
        sessions = {name: home.open(name) for name in groups}
        # one transaction for the whole file: every line of every session durable at once, or none;
        # keyed by line, so running the same file again adds nothing twice; an undated line then takes the
        # day of the dated line before it (keys come from the file's own fields: older imports keep theirs)
        accepted = home.accept({sessions[name]: carry_dates(keyed(messages)) for name, messages in groups.items()})
        added = 0
        for name, s in sessions.items():
            added += accepted.new[s]
            known = len(groups[name]) - accepted.new[s]
            pages = len(s.pages) + (1 if s.packer.pieces else 0)   # the open page too, as chat and check count
            typer.echo(f"{name}: {_many(accepted.new[s], 'new turn')}" + (f", {known} already held" if known else "") +
                       f" → {_many(s.turn_count, 'turn')} on {_many(pages, 'page')}"
                       + (f" (p{s.tail_n} open)" if s.packer.pieces else ""))
            if config.writer_model:
                _write_bookmarks(s)
    typer.echo(_ingested(sum(len(m) for m in groups.values()), added, len(groups), time.perf_counter() - started))


def _ingested(total: int, added: int, sessions: int, elapsed: float) -> str:
    """The last line of `pager ingest`: what the file added, all of it, part of it or nothing."""
    into = _many(sessions, "session")
    if not added:
        return (f"nothing new: the {_many(total, 'line')} were already held in {into}, so nothing was added "
                f"({elapsed:.2f}s)") if total != 1 else f"nothing new: the line was already held ({elapsed:.2f}s)"
    # a rate over under a second or a handful of lines says more about start-up than about ingest
    rate = f" ({added / elapsed:,.0f} lines/s)" if elapsed >= 1 and added >= 10 else ""
    lines = _many(total, "line") if added == total else f"{added} new {'line' if added == 1 else 'lines'} of {total} ({total - added} already held)"
    return f"ingested {lines} into {into} in {elapsed:.2f}s{rate}"


def _write_bookmarks(s) -> None:
    """Have the bookmark (or memory) model name the pages this ingest sealed."""
    config = s.home.config
    model, pages, facts, changes = config.writer_model, len(s.unwritten), len(s.facts), s.state.seq
    what = "bookmarks, facts and state" if config.memory_model else "bookmarks"
    typer.echo(f"  asking {model} for {what} of {pages} pages …", err=True)
    named = len(s.write_bookmarks(force=True))
    error = s.memory_error if config.memory_model else s.writer_error
    if error:
        typer.echo(f"  the model failed after naming {named} of {pages} pages ({error}); the "
                   "others keep their offline keywords", err=True)
    typer.echo(f"  {named} pages bookmarked by {model}" + (f", {len(s.facts) - facts} facts written, "
                                                         f"{s.state.seq - changes} state changes" if config.memory_model else ""))


@command()
def inspect(
    ctx: typer.Context,
    session: Optional[str] = typer.Option(None, "--session", "-s"),
    json_out: bool = typer.Option(False, "--json", help="one JSON object for scripts"),
    pages: int = typer.Option(40, "--pages", min=0, help="page-table rows to show"),
) -> None:
    """Page table, frames and bookmarks of a session."""
    import json

    config = load_config(ctx, session=session)
    with open_home(config, read_only=True) as home:
        s = existing(home)
        if json_out:
            from pager.views import inspect_json

            typer.echo(json.dumps(inspect_json(s), ensure_ascii=False))
            return
        from rich.console import Console
        from rich.text import Text

        from pager import views

        console = Console()
        st = s.stats()
        count = s.page_count   # the open page too, as --json, sessions, chat and check count
        console.print(Text(f"session {s.name!r}: {st['turns']} turns, {_many(count, 'page')}"
                           + (f" (p{s.tail_n} open)" if s.packer.pieces else "") + f", {st['frames']} frames, "
                           f"policy {s.policy.name}, {st['faults']} faults, {st['evictions']} evictions"))
        console.print(views.frame_strip(s))
        console.print(views.legend())
        console.print(views.frame_table(s))
        console.print(views.page_table(s, pages))
        console.print(views.bookmark_table(s, 20))


@command()
def chat(
    ctx: typer.Context,
    session: Optional[str] = typer.Option(None, "--session", "-s", help="resume or start this session"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="any litellm model string (or $PAGER_MODEL); none or 'offline': the offline memory shell"),
    budget: Optional[int] = typer.Option(None, "--budget", help="tokens of the whole prompt (default 8192)"),
    policy: Optional[str] = typer.Option(None, "--policy", help="clock, lru, lfu or scored"),
    bookmark_model: Optional[str] = typer.Option(None, "--bookmark-model", help="litellm model that writes bookmarks of sealed pages (or $PAGER_BOOKMARK_MODEL); none: offline keywords only"),
    memory_model: Optional[str] = typer.Option(None, "--memory-model", help="litellm model that writes bookmarks, facts and working-state changes of sealed pages, one call per batch (or $PAGER_MEMORY_MODEL); none: offline memory only"),
    new: bool = typer.Option(False, "--new", help="start the session even if another PAGER_USER of the store has one by that name"),
    paging: Optional[str] = typer.Option(None, "--paging", help="tools: the model pages through tools too; automatic: pager pages alone (small or slow models); auto (default): by the model (or $PAGER_PAGING)"),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="URL of the model's server, e.g. http://127.0.0.1:8080/v1 for a local llama.cpp server (or $PAGER_API_BASE)"),
) -> None:
    """Talk to an agent whose memory is paged: the REPL."""
    from pager.cli.chat import run

    run(load_config(ctx, session=session, model=model, budget=budget, policy=policy, bookmark_model=bookmark_model,
                    memory_model=memory_model, paging=paging, api_base=api_base), new=new)


@command()
def tools(format: str = typer.Option("openai", "--format", help="schema format: openai")) -> None:
    """Print the tool schemas offered to models (OpenAI function format)."""
    import json

    from pager.tools import AGENT

    if format != "openai":
        raise InputError(f"unknown format {format!r}; only --format openai is supported")
    typer.echo(json.dumps(AGENT.schemas(), indent=2))


@command()
def mcp(
    ctx: typer.Context,
    session: Optional[str] = typer.Option(None, "--session", "-s", help="the session the tools act on"),
) -> None:
    """Serve the tools over MCP on stdio (for desktop agents and other MCP clients)."""
    from pager.tools.mcp_server import serve
    from pager.tools.toolkit import Toolkit

    serve(Toolkit(config=load_config(ctx, session=session)))


@command()
def demo(
    ctx: typer.Context,
    budget: int = typer.Option(2048, "--budget", help="prompt budget for the demo"),
    keep: Optional[Path] = typer.Option(None, "--keep", help="use this folder as the home and keep it"),
) -> None:
    """The main job, offline: a bundled conversation, the live engine, and a report."""
    from pager.demo import run

    run(budget=budget, keep=keep)


@command()
def search(
    ctx: typer.Context,
    query: str = typer.Argument(..., help="what to look for"),
    session: Optional[str] = typer.Option(None, "--session", "-s"),
    k: int = typer.Option(8, "-k", help="how many pages"),
    json_out: bool = typer.Option(False, "--json", help="one JSON object for scripts"),
) -> None:
    """Ranked pages for a query, then the facts, summaries and state it names, each marked with its kind.

    Pages come with each signal's score and their bookmarks; superseded facts with their dates. A page
    holding no word of the query, near it by meaning only, is marked weak ("weak": true in --json)."""
    import json

    if not query.strip():

        raise InputError("give words to search for, e.g. pager search 'peanut allergy'")
    if k < 1:

        raise InputError(f"-k {k}: ask for 1 page or more")
    config = load_config(ctx, session=session)
    with open_home(config, read_only=True) as home:
        s = existing(home)
        from pager.views import page_hits, tier_hits

        reranked: list = []   # with PAGER_RERANKER: whether it answered, and if not, why
        s.events.listeners.append(lambda e: reranked.append(e) if e.kind in ("pieces_reranked", "rerank_failed") else None)
        rows = page_hits(s, query, k)
        tiers = tier_hits(s, query, k)
        said = ({"reranker": {"model": config.reranker, "error": next((e.data["error"] for e in reranked
                                                                      if e.kind == "rerank_failed"), "")}}
                if config.reranker and reranked else {})
        if json_out:
            typer.echo(json.dumps({"session": s.name, "query": query, "results": rows, "tiers": tiers, **said},
                                  ensure_ascii=False))
            return
        from rich.console import Console
        from rich.text import Text

        from pager.views import table as fitted

        pages = len(s.pages) + (1 if s.packer.pieces else 0)   # the open page too: it is listed like the others
        table = fitted(f"{query!r} in session {s.name!r} ({_many(pages, 'page')})",
                       ("page", "score", "signals", "date", "bookmarks", "best piece"))
        for r in rows:
            signals = ("weak " if r["weak"] else "") + " ".join(f"{k}={v:.2f}" for k, v in r["signals"].items())
            table.add_row(r["page"] + (" *" if r["resident"] else ""), f"{r['score']:.3f}", signals, r["date"],
                          Text(", ".join(r["bookmarks"])), Text(r["snippet"]))
        console = Console()
        if said and said["reranker"]["error"]:
            console.print(Text(f"the reranker {config.reranker} failed ({said['reranker']['error']}); the pages are in "
                               "pager's own order. Fix it, or unset PAGER_RERANKER", style="red"))
        elif said:
            console.print(Text(f"pages reordered by the reranker {config.reranker}", style="dim"))
        if not rows or all(r["weak"] for r in rows):
            console.print(Text(f"no page of session {s.name!r} matches {query!r}" + (
                " by its words; the nearest by meaning, below, are weak" if rows else "")
                + ". Try other words, a name or a date, or a bookmark keyword from `pager inspect`."))
        if rows:
            console.print(table)
        if tiers:
            other = fitted("in the memory tiers", ("kind", "id", "score", "pages", "when", "text"))
            for r in tiers:
                when = r.get("date", "")
                if r["kind"] == "fact" and r["superseded"]:
                    when = f"{r['date']} → {r['valid_to']} (superseded by {r['superseded_by']})"
                elif r["kind"] == "state":
                    when = "current" if r["current"] else "earlier value"
                score = ("weak " if r.get("weak") else "") + (f"{r['score']:.3f}" if "score" in r else "")
                other.add_row(r["kind"], r["id"], score, ",".join(r["pages"][:3]), when, Text(r["text"]))
            console.print(other)


@command()
def summarize(
    ctx: typer.Context,
    session: Optional[str] = typer.Option(None, "--session", "-s"),
) -> None:
    """Summarize a session offline, no model: its closed episodes and a new rolling summary version.

    An episode ends at a new day, a long silence or a topic shift; its summary is its most central
    sentences, verbatim."""
    from pager.summaries import Extractive

    config = load_config(ctx, session=session)
    with open_home(config) as home:
        s = existing(home)
        made = s.summarize(Extractive())
        for x in made:
            typer.echo(f"{x.id} {x.kind} {x.key!r} v{x.version} ({x.span}, {x.date}): {x.text[:160]}")
        typer.echo(f"{len(made)} new summaries; {len(s.summaries)} in all"
                   + (f" (the producer failed: {s.memory_error})" if s.memory_error else ""))


@command()
def export(
    ctx: typer.Context,
    session: Optional[str] = typer.Option(None, "--session", "-s", help="the session to export"),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="file to write (default: stdout)"),
) -> None:
    """Every turn of a session as JSONL that `pager ingest` reads back."""
    from pager.export import export_turns

    writable(out, "--out")
    config = load_config(ctx, session=session)
    with open_home(config, read_only=True) as home:
        require(home, config.user, config.session)
        count = export_turns(home, config.user, config.session, out or sys.stdout)
    if out:
        typer.echo(f"{count} turns of session {config.session!r} written to {out}", err=True)


@command()
def check(
    ctx: typer.Context,
    session: Optional[str] = typer.Option(None, "--session", "-s", help="the session to check"),
) -> None:
    """fsck for memory: every turn numbered once, on exactly one page or the open tail (read-only).

    With no --session (nor PAGER_SESSION), every session of the home, of every user."""
    import os

    from pager.fsck import check as run_check

    config = load_config(ctx, session=session)
    every = session is None and not os.environ.get("PAGER_SESSION")
    with open_home(config, read_only=True) as home:
        if every:
            targets = [(r["user"], r["session"]) for r in home.session_rows(cached=False)]
            if not targets:
                typer.echo(f"no sessions in {where(home)}: nothing to check")
                return
        else:
            require(home, config.user, config.session)
            targets = [(config.user, config.session)]
        reports = [(user, run_check(home, user, name)) for user, name in targets]
    for user, report in reports:
        # the open tail is a page (DESIGN.md: "the session's open tail page"), counted as `pager inspect` does
        pages = report.pages + (1 if report.tail_turns else 0)
        tail = f" (the last the open tail, {_many(report.tail_turns, 'turn')})" if report.tail_turns else ""
        if report.journal_turns:   # not on any stored page yet: counted apart, not as one long open tail
            tail += (f", and {_many(report.journal_turns, 'turn')} only in this home's journal (a live process "
                     "flushes them; a dead one's go to the store with the next command that writes here, "
                     "such as `pager migrate`)")
        of_user = f" of user {user!r}" if every and user else ""
        typer.echo(f"session {report.session!r}{of_user}: {_many(report.turns, 'turn')}, {_many(pages, 'page')}{tail}: "
                   + ("ok" if report.ok else "PROBLEMS"))
        for problem in report.problems:
            typer.echo(f"  {problem}")
    if not all(report.ok for _, report in reports):
        raise typer.Exit(1)


@command()
def migrate(ctx: typer.Context) -> None:
    """Bring the store forward by the named migrations it lacks, one line each.

    Opening a home for writing does the same; commands that only look report what is pending."""
    from pager.home import Home
    from pager.store import MIGRATIONS, SCHEMA_VERSION

    config = load_config(ctx)
    if not _store_made(config):   # a typo in --home or --db: opening it for writing would make an empty store
        raise InputError(f"no pager store at {config.db_uri}: nothing to migrate; check --home (PAGER_HOME) "
                         "or --db (PAGER_DB), or make it with any pager ingest or pager chat")
    notes: list[str] = []
    with Home(config, warn=notes.append) as home:
        _ = home.store  # opening it for writing applies what is missing
    for note in notes:
        typer.echo(note)
    if not any("was migrated" in note for note in notes):
        typer.echo(f"the store at {config.db_uri} is up to date: schema v{SCHEMA_VERSION}, "
                   f"migrations {', '.join(m.__name__ for m in MIGRATIONS)}")


def _many(n: int, word: str) -> str:
    """'1 page', '2 pages'."""
    return f"{n} {word}{'s' if n != 1 else ''}"


def _store_made(config) -> bool:
    """Whether the configured store holds pager's tables, looked at without making anything."""
    from pager.store import is_local, table_names

    if is_local(config.db_uri):
        folder = Path(config.db_uri.removeprefix("file://"))
        return (folder / "meta.lance").is_dir() or (folder / "turns.lance").is_dir()
    return bool(table_names(config.db_uri, config.storage_options or None))


@command()
def replay(
    ctx: typer.Context,
    trace: Path = typer.Argument(..., help="a trace (JSONL) written by pager chat, the toolkit or pager bench trace"),
    check: bool = typer.Option(False, "--check", help="compare with the recording; exit 1 at the first divergence"),
    policy: Optional[str] = typer.Option(None, "--policy", help="replay under another policy, or 'all' to compare"),
) -> None:
    """Re-run a session from its trace; compare with the recording or try other eviction policies."""
    from rich.console import Console

    from pager import replay as rp
    from pager.config import POLICIES

    console = Console(highlight=False)
    existing_trace(ctx, trace)
    if policy not in (None, "all") and policy not in POLICIES:
        raise InputError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)} or all")
    if check and policy is not None and (used := rp.recorded_policies(trace)[0]) != [policy]:
        raise InputError(f"--check reproduces the recording under the policy it ran with "
                         f"({' → '.join(used)}), not {policy}; to compare "
                         f"{'every policy' if policy == 'all' else policy} with it, drop --check: "
                         f"pager replay {trace} --policy {policy}")
    if check:
        run = rp.replay(trace, check=True)
        if run.divergence:
            typer.echo(run.divergence.describe())
            raise typer.Exit(1)
        console.print(f"ok: {len(run.recorded)} recorded events reproduced exactly "
                      f"({run.faults} faults, {run.count('evict')} evictions, {len(run.digests)} model calls)")
        if run.cut:
            console.print("the trace ends without session_end: the run was cut short (killed, still running, or a "
                          "Toolkit never closed)"
                          + (f"; the replay went on for {run.beyond} event(s) of its last message, which the "
                             "recording does not hold and were not compared" if run.beyond else ""))
        return
    start, _ = rp.load(trace)
    names = list(POLICIES) if policy == "all" else [policy or start["policy"]]
    console.print(rp.policy_table(rp.policy_runs(trace, names), trace))


trace_app = typer.Typer(no_args_is_help=True, help="Look inside a trace.")
app.add_typer(trace_app, name="trace")


@trace_app.command("show")
@handles_errors
def trace_show(
    ctx: typer.Context,
    trace: Path = typer.Argument(..., help="a trace (JSONL)"),
    step: Optional[int] = typer.Option(None, "--step", min=1, help="show the context of the N-th model call (from 1)"),
    html: Optional[Path] = typer.Option(None, "--html", help="write a self-contained HTML timeline here"),
) -> None:
    """The context window as the model saw it, or a timeline of faults and evictions."""
    from rich.console import Console
    from rich.text import Text

    from pager import replay as rp
    from pager import views

    console = Console(highlight=False)
    existing_trace(ctx, trace)
    if html and step is not None:   # the timeline has every call, as columns; one call's context is for the terminal
        raise InputError(f"--step and --html are two views: --step {step} prints one call's context here, --html the "
                         f"timeline of every call (call {step} is its column {step}); give one of them")
    writable(html, "--html")
    if html:
        from pager.timeline import write

        timeline = write(trace, html)
        console.print(Text(f"wrote {html}: {len(timeline.columns)} model calls, {len(timeline.pages)} pages"))
        return
    if step is None:
        console.print(rp.summary(trace))
        return
    shown = []

    def at(i, ctx, session, events):
        if i == step:
            console.rule(Text(f"model call {i} of {trace.name}"))
            if where := rp.position(events):
                console.print(Text(where))
            console.print(views.frame_strip(session))
            console.print(views.frame_table(session))
            console.print(views.region_tokens(ctx.tokens, ctx.budget))
            head, _, pages = ctx.memory.partition("\n\n[p")
            console.rule("memory map" + (", then state, summaries, facts and excerpts" if "\n\n[" in head else ""))
            console.print(head, markup=False)
            console.rule("pages in the context, in conversation order")
            console.print(", ".join(f"p{n}" for n in ctx.pages) or "none")
            if pages:   # as the model read them
                console.print("\n[p" + pages.rstrip("\n"), markup=False)
            console.rule("message")
            console.print(ctx.message, markup=False)
            shown.append(i)
            raise rp.Stop

    rp.replay(trace, on_context=at)
    if not shown:
        calls = sum(1 for e in rp.load(trace)[1] if e["kind"] == "model_request")
        raise PagerError(f"{trace} has {calls} model calls" + (f"; give --step 1 to {calls}" if calls else "")
                         + f" (`pager trace show {trace}` sums it up)")


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: recall on LoCoMo, cost at scale, start-up.")
app.add_typer(bench_app, name="bench")


@bench_app.command("locomo")
@handles_errors
def bench_locomo(
    data: Path = typer.Option(..., "--data", help="LoCoMo JSON (e.g. ../shared/data/locomo/locomo_dev.json)"),
    budget: list[int] = typer.Option([1024, 2048, 4096, 8192], "--budget", help="memory budgets, repeatable"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the report here"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="draw recall against budget to this PNG"),
    page_tokens: Optional[int] = typer.Option(None, "--page-tokens"),
    policy: Optional[str] = typer.Option(None, "--policy"),
    conversations: Optional[int] = typer.Option(None, "--conversations", min=1, help="only the first N conversations"),
    questions: Optional[int] = typer.Option(None, "--questions", min=1, help="only the first N questions of each"),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines"),
    bookmark_model: Optional[str] = typer.Option(None, "--bookmark-model", help="litellm model that writes bookmarks of each conversation's pages before the questions (needs its key; one call per 8 pages)"),
    memory: str = typer.Option("", "--memory", help="recorded: the dataset's observations as facts; or a file of a memory model's facts (`pager bench producer`); reports coverage"),
    excerpts: Optional[int] = typer.Option(None, "--excerpts", help="with --memory: frames of excerpts (whole turns no fact tells) beside the fact slabs; default 0"),
    reranker: Optional[str] = typer.Option(None, "--reranker", help="litellm rerank model reordering the search's best pieces and facts per question (or $PAGER_RERANKER); oracle: the question's evidence first, an upper bound"),
    rerank_pieces: Optional[int] = typer.Option(None, "--rerank-pieces", help="with --reranker: the search's best pieces it reorders; default 100, 0: none"),
    rerank_facts: Optional[int] = typer.Option(None, "--rerank-facts", help="with --reranker: the best-ranked facts it reorders; default 60, 0: none"),
    vector_cache: Optional[Path] = typer.Option(None, "--vector-cache", help="keep the embedder's vectors in this file across runs: a rerun embeds only texts it has not (minilm: minutes saved)"),
) -> None:
    """Evidence recall of automatic paging under each budget, against recent/bm25/vector baselines."""
    import json

    from rich.console import Console

    from pager.bench import locomo, need
    from pager.config import Config

    if baselines:   # before the run, not after it
        need("rank_bm25", "the BM25 baseline (or --no-baselines)")
    if plot:
        need("matplotlib", "--plot")
    writable(json_path, "--json")
    writable(plot, "--plot")
    config = Config.load(page_tokens=page_tokens, policy=policy, bookmark_model=bookmark_model, excerpt_slabs=excerpts,
                         reranker=reranker, rerank_pieces=rerank_pieces, rerank_facts=rerank_facts)
    if memory not in ("", "recorded") and not Path(memory).is_file():
        raise InputError(f"--memory {memory!r} is neither recorded nor a producer file; use --memory recorded, a file "
                         "`pager bench producer` wrote, or leave it out")
    if vector_cache is not None:
        writable(vector_cache, "--vector-cache")
    report = locomo.run(data, sorted(set(budget)), config, conversations, questions, baselines, memory=memory,
                        vector_cache=vector_cache)
    console = Console()
    for table in locomo.table(report):
        console.print(table)
    for error in report.get("bookmark_model_errors", []):
        console.print(f"[red]bookmark model failed[/] ({error}); those pages kept their offline keywords")
    if report.get("reranker_failures"):
        console.print(f"[red]the reranker failed {report['reranker_failures']:,} times[/] (a question asks it for its "
                      f"pieces and its facts; first: {report['reranker_error']}); there pager's own order stood")
    if json_path and write_report(json_path, json.dumps(report, indent=1) + "\n", "--json"):
        console.print(f"wrote {json_path}")
    if plot:
        locomo.plot(report, plot)
        console.print(f"wrote {plot}")


@bench_app.command("answers")
@handles_errors
def bench_answers(
    data: Path = typer.Option(..., "--data", help="LoCoMo JSON (e.g. ../shared/data/locomo/locomo_dev.json)"),
    model: str = typer.Option(..., "--model", help="litellm model that answers, e.g. openai/qwen with --api-base for a local server"),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="URL of the model's server (or $PAGER_API_BASE)"),
    budget: list[int] = typer.Option([2048, 1024], "--budget", help="prompt budgets, repeatable"),
    systems: str = typer.Option(",".join(("pager", "pager-tools", "recent", "bm25")), "--systems",
                                help="comma-separated: pager, pager-tools, recent, bm25"),
    sample_ids: str = typer.Option("conv-26,conv-30", "--conversations", help="comma-separated sample ids"),
    questions: int = typer.Option(6, "--questions", min=1, help="cats 1-4 questions per conversation (a fixed hash order)"),
    tools_budget: list[int] = typer.Option([], "--tools-budget", help="budgets at which pager-tools runs (default: every --budget)"),
    tool_steps: int = typer.Option(4, "--tool-steps", min=1, help="model calls a question may take"),
    tools_questions: Optional[int] = typer.Option(None, "--tools-questions", min=1, help="pager-tools asks only the first N questions of the sample (default all)"),
    output_tokens: int = typer.Option(96, "--output-tokens", min=8, help="the longest answer, in tokens"),
    cache: Optional[Path] = typer.Option(None, "--cache", help="JSONL of answers: kept as they come, a rerun goes on from it"),
    traces: Optional[Path] = typer.Option(None, "--traces", help="write each pager question's trace into this folder"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the report here"),
) -> None:
    """LoCoMo questions answered by a real model from each system's context under one budget; LoCoMo's F1."""
    from rich.console import Console

    from pager.bench import answers, need
    from pager.config import Config
    from pager.llm import LiteLLMModel

    need("rank_bm25", "the BM25 baseline")
    need("nltk", "LoCoMo's answer F1 (its Porter stemmer)")
    asked = [s.strip() for s in systems.split(",") if s.strip()]
    if not asked or (unknown := sorted(set(asked) - set(answers.SYSTEMS))):
        raise InputError(f"--systems {systems!r}: unknown {', '.join(unknown) or 'none given'}; "
                         f"choose from {', '.join(answers.SYSTEMS)}")
    writable(json_path, "--json")
    writable(cache, "--cache")
    config = Config.load(api_base=api_base)
    remote = LiteLLMModel(model, output_tokens=output_tokens, api_base=config.api_base, temperature=0.0, attempts=2)
    remote.check("give --model a model you can reach")
    console = Console(stderr=True)

    def said(a, i: int, n: int) -> None:
        mark = "crashed: " + a.crashed if a.crashed else "no answer: " + a.error if a.error else a.output
        console.print(f"[{i}/{n}] {a.system} {a.budget} {a.conversation} cat {a.category} F1 {a.f1:.2f} "
                      f"{a.seconds:.0f}s · {a.question[:60]} → {' '.join(mark.split())[:80]}", highlight=False)

    report = answers.run(data, remote, budget, asked, [c.strip() for c in sample_ids.split(",") if c.strip()],
                         questions, tool_steps, tools_budget or None, config, cache, traces, said, tools_questions)
    Console().print(answers.table(report))
    if json_path and write_report(json_path, json.dumps(report, indent=1) + "\n", "--json"):
        Console().print(f"wrote {json_path}")


@bench_app.command("producer")
@handles_errors
def bench_producer(
    data: Path = typer.Option(..., "--data", help="LoCoMo JSON"),
    memory_model: str = typer.Option(..., "--memory-model", help="litellm model that writes the facts"),
    out: Path = typer.Option(..., "--out", help="the producer file to write (JSON)"),
    sample_ids: str = typer.Option("conv-26", "--conversations", help="comma-separated sample ids"),
    api_base: Optional[str] = typer.Option(None, "--api-base", help="URL of the model's server (or $PAGER_API_BASE)"),
) -> None:
    """A memory model's facts over LoCoMo conversations, once, for `pager bench locomo --memory FILE`."""
    from rich.console import Console

    from pager.bench import producer
    from pager.config import Config

    writable(out, "--out")
    config = Config.load(memory_model=memory_model, api_base=api_base)
    console = Console(stderr=True)
    try:
        report = producer.write(data, [c.strip() for c in sample_ids.split(",") if c.strip()], config, out,
                                lambda line: console.print(line, highlight=False))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    for sid, c in report["conversations"].items():
        console.print(f"{sid}: {len(c['facts'])} facts from {c['calls']} calls ({c['failed_calls']} failed, "
                      f"{c['rejected_items']} items rejected) over {c['pages']} pages in {c['seconds']:.0f} s")
    console.print(f"wrote {out}")


@bench_app.command("scale")
@handles_errors
def bench_scale(
    ctx: typer.Context,
    pages: Optional[int] = typer.Option(None, "--pages", help="pages in the home, across many sessions and users"),
    session_pages: Optional[str] = typer.Option(None, "--session-pages", metavar="N,M",
                                                help="instead, one session of each of these sizes (pages, "
                                                     "comma-separated, e.g. 10000,100000): how its costs grow"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the report here"),
    keep: Optional[Path] = typer.Option(None, "--keep", help="build the home in this folder and keep it"),
) -> None:
    """Cost at scale: ingest, paging per turn, search, cold start, memory, disk, LanceDB files; or one session as it grows."""
    from rich.console import Console

    from pager.bench import scale

    if (pages is None) == (session_pages is None):
        raise PagerError("give --pages N (a home of many sessions) or --session-pages N,M (one session of each size)")
    sizes = _session_sizes(session_pages) if session_pages is not None else []
    if pages is not None and pages < 1000:
        raise PagerError("--pages must be at least 1000")
    writable(json_path, "--json")
    fresh_folder(keep, "--keep")
    if pages is not None:
        report = scale.main(pages, None, keep, (ctx.obj or {}).get("db"))
    else:
        from pager.bench import growth

        report = growth.main(sizes, keep)
    if json_path:
        write_report(json_path, json.dumps(report, indent=1) + "\n", "--json")
    Console().print_json(json.dumps(report))


def _session_sizes(text: str) -> list[int]:
    """--session-pages as sizes: at least two, each 1,000 pages or more."""
    try:
        sizes = sorted({int(part.replace("_", "")) for part in text.split(",") if part.strip()})
    except ValueError:
        raise PagerError(f"--session-pages takes page counts separated by commas (10000,100000), not {text!r}") from None
    if len(sizes) < 2 or sizes[0] < 1000:
        raise PagerError("--session-pages needs two sizes or more, each at least 1000 (10000,100000)")
    return sizes


@bench_app.command("serve")
@handles_errors
def bench_serve(
    clients: int = typer.Option(32, "--clients", min=1, help="clients with a session each"),
    shared: int = typer.Option(8, "--shared", min=0, help="more clients, all on one shared session"),
    turns: int = typer.Option(50, "--turns", min=1, help="chat calls per client"),
    alone_turns: int = typer.Option(10, "--alone-turns", min=1, help="calls per session afterwards, one at a time"),
    earlier: int = typer.Option(0, "--earlier", min=0, help="turns written to each session before the run (about 2 per page)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the report here"),
    keep: Optional[Path] = typer.Option(None, "--keep", help="use this folder as the server's home and keep it"),
    memory_delay: float = typer.Option(0.0, "--memory-delay", min=0.0, max=50.0,
                                       help="run the load again with a memory model taking this many seconds per "
                                            "call, and compare the chat calls' latency (0: not)"),
) -> None:
    """Load on `pager serve` over loopback (offline model): nothing lost or duplicated, order kept, latency, and with --memory-delay beside a slow memory model."""
    from rich.console import Console

    from pager.bench import serve

    writable(json_path, "--json")
    fresh_folder(keep, "--keep")
    report = serve.main(clients, shared, turns, alone_turns, keep, earlier, memory_delay)
    if json_path:
        write_report(json_path, json.dumps(report, indent=1) + "\n", "--json")
    Console().print_json(json.dumps(report))
    if report["problems"] or report["load"]["failed"] or report.get("memory", {}).get("load", {}).get("failed"):
        raise typer.Exit(1)


@bench_app.command("startup")
@handles_errors
def bench_startup(
    repeat: int = typer.Option(5, "--repeat", min=1, help="runs of each command (the median is reported)"),
    with_serve: bool = typer.Option(True, "--serve/--no-serve", help="also time `pager serve`: ready, first and hundredth chat, refusals"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the report here"),
    keep: Optional[Path] = typer.Option(None, "--keep", help="build the homes in this folder and keep them"),
) -> None:
    """Start-up: each command's wall and CPU seconds on a small session, as ratios to `pager --help`; serve's first answers."""
    from rich.console import Console

    from pager.bench import startup

    writable(json_path, "--json")
    fresh_folder(keep, "--keep")
    report = startup.main(repeat, keep, with_serve)
    if json_path:
        write_report(json_path, json.dumps(report, indent=1) + "\n", "--json")
    Console().print_json(json.dumps(report))


@bench_app.command("trace")
@handles_errors
def bench_trace(
    data: Path = typer.Option(..., "--data", help="LoCoMo JSON"),
    conversation: str = typer.Option(..., "--conversation", help="sample id, e.g. conv-26"),
    out: Path = typer.Option(..., "--out", help="where to write the trace"),
    budget: int = typer.Option(4096, "--budget"),
    questions: Optional[int] = typer.Option(None, "--questions", min=1, help="only the first N questions"),
) -> None:
    """Record a trace: one LoCoMo conversation ingested, then its questions asked to the offline agent."""
    from pager.bench.record import record
    from pager.config import Config
    from pager.formats import parse_locomo

    writable(out, "--out")
    found = {c.sample_id: c for c in parse_locomo(data)}
    if conversation not in found:
        raise PagerError(f"no conversation {conversation!r} in {data}; it has {', '.join(found)}")
    conv = found[conversation]
    asked = [q.question for q in conv.questions if q.category in (1, 2, 3, 4)][:questions]
    counters = record(out, conv.messages, asked, Config.load(budget=budget, session=conversation),
                      f"LoCoMo {conversation}: {len(conv.messages)} turns ingested, {len(asked)} questions asked to "
                      "the offline memory shell (no LLM)")
    typer.echo(f"wrote {out}: {len(asked)} questions, {counters['faults']} faults, {counters['evictions']} evictions")


@command()
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="address to bind; anything but loopback needs a key (`pager keys create`)"),
    port: int = typer.Option(8765, "--port", min=0, max=65535, help="TCP port (0-65535)"),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="litellm model listed by /v1/models (or $PAGER_MODEL); clients pick per request, 'offline' always works"),
    budget: Optional[int] = typer.Option(None, "--budget", help="tokens of the whole prompt (default 8192)"),
    max_body: int = typer.Option(4 * 1024 * 1024, "--max-body", help="largest request body in bytes (413 above)"),
    max_messages: int = typer.Option(2048, "--max-messages", help="most messages in one request"),
    max_append: int = typer.Option(200_000, "--max-append-chars", help="most characters of new turns in one request (413 above: a turn's pages are made while other sessions wait)"),
    timeout: float = typer.Option(120.0, "--timeout", help="seconds to wait for a turn before answering 504 (the turn is still recorded)"),
    idle: float = typer.Option(600.0, "--idle", help="seconds after which an unused session is closed (written to the store; it reopens on its next request)"),
    max_open: int = typer.Option(256, "--max-open", help="most sessions open at once; beyond, the least recently used is closed"),
) -> None:
    """Serve memory over HTTP: OpenAI-compatible /v1/chat/completions, /mcp, REST, /healthz."""
    from pager.serve import Limits, serve as run

    if not idle > 0 or max_open < 1:   # "not above", so that nan is refused too
        raise PagerError("--idle must be above 0 seconds and --max-open at least 1")
    if max_body < 1 or max_messages < 1 or max_append < 1 or not timeout > 0:
        raise PagerError("--max-body, --max-messages and --max-append-chars must be at least 1 and --timeout above "
                         "0 seconds (the defaults: --max-body 4194304 --max-messages 2048 --max-append-chars 200000 "
                         "--timeout 120)")
    config = load_config(ctx, model=model, budget=budget)

    def listening(bound: int) -> None:
        where = f"home {config.home}" + (f", store {config.db}" if config.db else "")   # a store of its own: named
        typer.echo(f"pager serve on http://{host}:{bound} ({where}); Ctrl-C stops", err=True)

    run(config, host, port, Limits(body_bytes=max_body, messages=max_messages, model_timeout=timeout,
                                     append_chars=max_append),
        max_open=max_open, idle_s=idle, on_listening=listening)


keys_app = typer.Typer(no_args_is_help=True, help="Bearer keys for `pager serve`, one tenant each.")
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
@handles_errors
def keys_create(ctx: typer.Context, tenant: str = typer.Option(..., "--tenant", "-t", help="the tenant the key reaches")) -> None:
    """Make a key for a tenant; it is printed once and only its hash is kept."""
    from pager.keys import KeyRing

    record, key = KeyRing(load_config(ctx).home).create(tenant)
    typer.echo(key)
    typer.echo(f"key {record.id} for tenant {record.tenant!r}: shown only now, keep it secret", err=True)


@keys_app.command("list")
@handles_errors
def keys_list(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="one JSON array")) -> None:
    """The keys: id, tenant and creation time (never the key)."""
    from pager.keys import KeyRing

    rows = [r.public() for r in KeyRing(load_config(ctx).home).records()]
    if json_out:
        typer.echo(json.dumps(rows))
        return
    for r in rows:
        typer.echo(f"{r['id']}  {r['tenant']}  {r['created']}")
    if not rows:
        typer.echo("no keys: `pager serve` answers on loopback only; `pager keys create --tenant NAME` makes one", err=True)


@keys_app.command("revoke")
@handles_errors
def keys_revoke(ctx: typer.Context, key_id: str = typer.Argument(..., help="the id `pager keys list` shows")) -> None:
    """Revoke a key; a running server refuses it from its next request."""
    from pager.keys import KeyRing

    record = KeyRing(load_config(ctx).home).revoke(key_id)
    typer.echo(f"revoked key {record.id} of tenant {record.tenant!r}")


# Environment variables that set how many threads numpy's BLAS starts when numpy is imported.
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def one_blas_thread(environ: MutableMapping[str, str]) -> None:
    """BLAS on one thread in the `pager` process, unless its user chose a number. OpenBLAS otherwise
    starts a thread per core at numpy's import, and those threads cost every command about a third of
    its CPU and 0.04-0.09 s of its wall while pager's arrays are too small to share out (minilm already runs
    one thread, pager.minilm). Set before anything imports numpy; a program importing pager keeps its own.
    A variable set to an empty string counts as unset, as pager's own settings do."""
    if not any(environ.get(name) for name in BLAS_THREADS):
        environ["OPENBLAS_NUM_THREADS"] = "1"


def main() -> None:
    one_blas_thread(os.environ)
    app()


if __name__ == "__main__":
    main()
