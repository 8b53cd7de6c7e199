"""`pager chat`: the REPL. prompt_toolkit when interactive, plain lines when piped.

Every model step prints the tools it called and the pages that moved; slash commands show
the frame map, the page table, search results, bookmarks and counters.
"""

from __future__ import annotations

import sys
from typing import Callable, Iterator, TextIO

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from pager import views
from pager.agent import Agent
from pager.config import POLICIES, Config
from pager.errors import PagerError
from pager.home import Home, check_new_name
from pager.llm import OFFLINE, LiteLLMModel, check_known_key, preload
from pager.model import HandlerModel, Model
from pager.offline import OfflineShell
from pager.proxy import OFFLINE_NAME
from pager.session import Session, settle
from pager.trace import Event, TraceWriter, begin, end, new_trace_path

HELP = """commands:
  /frames          the frame map: which page is in which frame, tokens, flags
  /pages           the page table
  /search QUERY    ranked pages with their scores
  /bookmarks       bookmarks by page
  /stats           faults, evictions, hit rate, tokens per turn
  /policy NAME     switch eviction policy (clock, lru, lfu, scored)
  /pin ID, /unpin ID
  /state [KEY]     the working state (always in the prompt); with a key, every value it had
  /facts [QUERY]   the facts memory holds, superseded ones with their dates; with a query, those for it
  /summaries [KEY] the episode and rolling summaries; with a key, every version it had
  /help, /quit"""


def trace_path(home: Home, session: Session):
    return new_trace_path(home.path, session.user, session.name, "chat")


class StepPrinter:
    """Prints, as they happen, the tool calls of each model step and the pages that moved."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.faulted: list[str] = []
        self.evicted: list[str] = []
        self.totals: list[int] = []
        self.start: dict[str, int] = {}   # the session's counters when the chat began
        self.trace_failed = False

    def __call__(self, event: Event) -> None:
        kind, d = event.kind, event.data
        if kind == "fault":
            self.faulted.append(d["page"])
        elif kind == "evict":
            self.evicted.append(d["page"])
        elif kind in ("pin", "unpin"):
            self.console.print(f"  [magenta]{kind}ned {escape(str(d['page']))}[/]", highlight=False)
        elif kind == "model_request":
            self.totals.append(d["tokens"]["total"])
            excerpts = f", {len(d['excerpts'])} excerpt(s) of turns {', '.join(map(str, d['excerpts'][:6]))}" if d.get("excerpts") else ""
            self._flush(f"step {d['step']}: {d['tokens']['total']} tokens, {len(d['pages'])} pages in {d['frames']} frames"
                        + excerpts)
        elif kind == "tool_call":
            args = _readable(d["arguments"])
            args = args if len(args) < 90 else args[:89] + "…"
            self.console.print(f"  [cyan]↳ {escape(d['name'])}[/]({escape(args)})", highlight=False)
        elif kind == "bookmarks_written" and d["marks"]:
            named = ", ".join(f"{m['page']} ({', '.join(m['keywords'][:3])})" for m in d["marks"][:4])
            more = f" (+{len(d['marks']) - 4})" if len(d["marks"]) > 4 else ""
            self.console.print(f"  [blue]bookmark model:[/] {escape(named)}{more}", highlight=False)
        elif kind == "facts_written" and d["facts"] and d["source"] == "model":
            said = "; ".join(f"{f.get('op', 'add')} {'f' + str(f['target']) if f.get('target') else f['subject']}: "
                             f"{f['text']}" for f in d["facts"][:3])
            more = f" (+{len(d['facts']) - 3})" if len(d["facts"]) > 3 else ""
            self.console.print(f"  [blue]memory model:[/] {escape(said)}{more}", highlight=False)
        elif kind == "state" and d["source"] == "memory":
            change = f"unset {d['key']}" if d["unset"] else f"{d['key']} = {d['value']}"
            self.console.print(f"  [blue]memory model, state:[/] {escape(change)}", highlight=False)
        elif kind == "memory_rejected":
            self.console.print(f"  [dim]memory model: {len(d['rejected'])} item(s) left out "
                               f"({escape(d['rejected'][0])})[/]", highlight=False)
        elif kind == "facts_reranked":
            self.console.print(f"  [blue]reranker:[/] {len(d['order'])} facts reordered, f{d['order'][0]} first",
                               highlight=False)
        elif kind == "pieces_reranked":
            page, place = d["order"][0]
            self.console.print(f"  [blue]reranker:[/] the search's {len(d['order'])} best pieces reordered, p{page}'s "
                               f"piece {place + 1} first", highlight=False)
        elif kind in ("model_error", "step_limit", "overflow", "notice", "writer_error", "memory_error",
                      "rerank_failed"):
            self.console.print(f"  [red]{kind}[/]: {escape(str(d.get('error') or d.get('text') or d))}", highlight=False)

    def _flush(self, head: str) -> None:
        moved = ""
        if self.faulted:
            moved += f" · [yellow]faulted {_list(self.faulted)}[/]"
        if self.evicted:
            moved += f" · evicted {_list(self.evicted)}"
        self.console.print(f"  [dim]{head}[/]{moved}", highlight=False)
        self.faulted, self.evicted = [], []


def stats_line(session: Session, printer: StepPrinter) -> str:
    """Counters of this chat: each fault, hit and eviction is one event of its trace, so `trace show`
    and the HTML timeline count the same (the session's lifetime counters are in `pager inspect`)."""
    st = session.stats()
    since = {k: st[k] - printer.start.get(k, 0) for k in ("faults", "hits", "evictions")}
    uses = since["faults"] + since["hits"]
    per_turn = sum(printer.totals) / len(printer.totals) if printer.totals else 0
    return (f"this chat: faults {since['faults']} · evictions {since['evictions']} · hits {since['hits']} · hit rate "
            f"{since['hits'] / uses if uses else 0:.0%} · session: {st['turns']} turns on {_pages(session)} · frames "
            f"{st['used']}/{st['frames']} · " + (f"{per_turn:.0f} prompt tokens per model call" if printer.totals
                                                  else "no model call yet"))


_CONTROL = {c: None for c in range(32) if c not in (9, 10)} | {127: None} | {c: None for c in range(128, 160)}


def printable(text: str) -> str:
    """A reply as the terminal should show it: without control characters (an escape sequence typed in
    a message, quoted back, would otherwise recolour or move the terminal's cursor)."""
    return text.translate(_CONTROL)


def _pages(session: Session) -> str:
    """The session's pages as /pages lists them: the sealed ones and the open one ("4 turns, 0 pages"
    was said of a session whose p1 /pages listed)."""
    n = len(session.pages) + (1 if session.packer.pieces else 0)
    return f"{n} page{'s' if n != 1 else ''}"


def _readable(arguments: str) -> str:
    """A tool call's JSON arguments with their letters as written (`¿Cuál`, not `\\u00bfCu\\u00e1l`)."""
    import json

    try:
        return json.dumps(json.loads(arguments), ensure_ascii=False)
    except ValueError:
        return arguments   # a model's malformed arguments are shown as they came


def _list(pages: list[str], shown: int = 6) -> str:
    more = len(pages) - shown
    return " ".join(pages[:shown]) + (f" (+{more})" if more > 0 else "")


def lines_from(stream: TextIO, interactive: bool, home: Home) -> Iterator[str]:
    if interactive:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory

        prompt: PromptSession[str] = PromptSession(history=FileHistory(str(home.path / "chat_history")))
        while True:
            try:
                yield prompt.prompt("you> ")
            except EOFError:
                return
    else:
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")   # invalid UTF-8 shows as �, it does not end the chat
        for line in stream:
            # a stream opened with surrogateescape (the C locale) hands invalid bytes over as lone surrogates
            yield line.rstrip("\n").encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def run(config: Config, stream: TextIO | None = None, console: Console | None = None,
        interactive: bool | None = None, home_factory: Callable[[Config], Home] = Home, new: bool = False) -> None:
    """The REPL on config's session; a name that only another user of the store holds is refused unless new."""
    stream = stream or sys.stdin   # looked up per call: a test runner swaps sys.stdin after import
    console = console or Console(highlight=False)
    interactive = stream.isatty() if interactive is None else interactive
    # 'offline' is what `pager serve` calls the shell: PAGER_MODEL=offline set for it means the shell here too
    model_name = OFFLINE if config.model in (None, "", OFFLINE_NAME) else config.model
    if model_name != OFFLINE:
        check_known_key(model_name)   # before the import below, which the check after it waits for
    loading = preload() if model_name != OFFLINE else None   # the offline shell needs no litellm
    with home_factory(config) as home:
        session = home.open()
        check_new_name(session)   # a name a new session may not have is refused now, not at the first message
        if not session.turn_count and not new:
            from pager.cli.owners import refuse_held_elsewhere

            refuse_held_elsewhere(home, session.user, session.name)
        settle()
        if loading:
            loading.join()
        model: Model
        if model_name == OFFLINE:
            model = HandlerModel(OfflineShell(), OFFLINE, output_tokens=config.output_tokens)
        else:
            remote = LiteLLMModel(model_name, output_tokens=config.output_tokens, api_base=config.api_base)
            remote.check()
            model = remote
        home.writer  # noqa: B018 - the bookmark (or memory) model's key is checked up front too
        agent = Agent(session, model, speaker=config.user or "user")
        # a chat that cannot start (no key, a budget too small) leaves no trace: there is nothing to replay
        writer = TraceWriter(trace_path(home, session), note=f"pager chat session {session.name!r}")
        session.events.listeners.append(writer)
        printer = StepPrinter(console)
        session.events.listeners.append(printer)
        try:
            printer.start = dict(session.counters)   # /stats counts this chat, as its trace does
            begin(session, model_name, agent.budget)
            _banner(console, session, config, model_name, writer.path, agent.budget, agent.tier, agent.paging)
            for line in lines_from(stream, interactive, home):
                line = line.strip()
                if not line:
                    continue
                if not interactive:
                    console.print(f"[bold]you>[/] {escape(line)}", highlight=False)
                if line.startswith("/"):
                    session.emit("command", line=line)
                    if _command(line, session, printer, console) == "quit":
                        break
                    continue
                try:
                    reply = agent.ask(line)
                except PagerError as exc:  # e.g. a message larger than the budget: refused, nothing accepted
                    console.print(f"[red]{escape(str(exc))}[/]", highlight=False)
                    continue
                console.print(f"[bold green]pager>[/] {escape(printable(reply.text))}", highlight=False)
                for note in reply_notes(reply, agent.model.output_tokens):   # said here, not stored as the reply
                    console.print(f"  [dim]({note})[/]", highlight=False)
                if writer.error and not printer.trace_failed:   # said once; the chat goes on, its memory is intact
                    printer.trace_failed = True
                    console.print(f"[red]the trace stopped[/]: {escape(writer.error)}; memory itself is unaffected",
                                  highlight=False)
            session.write_rest()   # the last pages, fewer than a batch
        finally:
            end(session)
            writer.close()


def _banner(console: Console, session: Session, config: Config, model_name: str, trace, budget: int,
            tier: str = "full", paging: str = "tools") -> None:
    console.rule(Text(f"pager chat · session {session.name!r}"))
    if model_name == OFFLINE:
        console.print("[yellow]No LLM configured[/]: this is the offline memory shell. It searches, pages in and "
                      "quotes your memory; it does not think. Set --model or PAGER_MODEL for a real model.")
    else:
        console.print(f"model {escape(model_name)}", highlight=False)
    state = f"resumed with {session.turn_count} turns on {_pages(session)}" if session.turn_count else "new session"
    lowered = f" (lowered from {config.budget} to fit the model)" if budget < config.budget else ""
    console.print(Text(f"{state} · budget {budget} tokens{lowered} · {session.page_tokens}-token pages · "
                       f"policy {session.policy.name} · trace {trace}"))
    if paging == "automatic":
        why = "as set" if config.paging == "automatic" else "the default for a local or small model"
        console.print(f"paging: automatic only, no tools ({why}); pager faults in what each message needs; "
                      "--paging tools offers the model the paging tools too", highlight=False)
    elif tier != "full":
        console.print(f"a small budget: the short system prompt{', no tools' if tier == 'bare' else ', compact tools'}; "
                      "automatic paging still brings in what each message needs", highlight=False)
    console.print("type a message, or /help\n")


def _command(line: str, session: Session, printer: StepPrinter, console: Console) -> str | None:
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    try:
        if name in ("/quit", "/exit", "/q"):
            return "quit"
        if name == "/help":
            console.print(HELP)
        elif name == "/frames":
            console.print(views.frame_strip(session))
            console.print(views.legend())
            console.print(views.frame_table(session))
        elif name == "/pages":
            console.print(views.page_table(session))
        elif name == "/bookmarks":
            console.print(views.bookmark_table(session))
        elif name == "/search":
            if not arg:
                console.print("usage: /search QUERY")
                return None
            table = views.table(f"search {arg!r}", ("page", "score", "signals", "best piece"))
            hits = session.search(arg, k=8)
            weak = session.weak(arg, hits)
            for hit, faint in zip(hits, weak):
                table.add_row(hit.id + (" *" if session.table[hit.n].resident else ""), f"{hit.score:.2f}",
                              ("weak " if faint else "") + " ".join(f"{k}={v:.2f}" for k, v in hit.signals.items()),
                              Text(session.render.snippet(hit, 100)))
            if hits and all(weak):
                console.print(Text(f"no page matches {arg!r} by its words; the nearest by meaning, below, are weak"))
            console.print(table)
        elif name == "/stats":
            console.print(stats_line(session, printer))
        elif name == "/policy":
            if not arg:   # replay does the same with it: nothing
                console.print(f"policy {session.policy.name}; /policy NAME switches to one of {', '.join(POLICIES)}")
                return None
            session.set_policy(arg)
            console.print(f"policy {session.policy.name}")
        elif name == "/state":
            if arg and not session.state.history(arg):   # as REST's 404 says: one line, and the keys there are
                keys = sorted(session.state.current)
                console.print(f"the state has no key {arg!r}; " + (f"its keys: {', '.join(keys)}" if keys else
                              "it is empty (say \"my KEY is VALUE\" to set one)"), highlight=False, markup=False)
                return None
            console.print(views.state_table(session, arg))
        elif name == "/facts":
            console.print(views.facts_table(session, arg))
        elif name == "/summaries":
            by_id = next((x.key for x in session.summaries.items if x.id == arg), None) if arg else None
            if arg and not session.summaries.versions(arg) and by_id is None:   # as /state says it
                keys = sorted(session.summaries.current, key=lambda k: k != "rolling")   # the rolling one first
                console.print(f"no summary has the key {arg!r}; " + (
                    f"the keys are {', '.join(keys[:8])}{' …' if len(keys) > 8 else ''} (/summaries lists them, an "
                    "id like s1 works too)" if keys else "there are none yet (`pager summarize` writes them)"),
                    highlight=False, markup=False)
                return None
            console.print(views.summaries_table(session, by_id or arg))
        elif name in ("/pin", "/unpin"):
            if not arg:
                console.print(f"usage: {name} PAGE, a page id like p5 (/pages lists them)")
                return None
            n = session.resolve(arg)
            session.pin(n) if name == "/pin" else session.unpin(n)   # the step printer says it, from the event
        else:
            console.print(f"unknown command {escape(name)}; /help lists them", highlight=False)
    except PagerError as exc:
        console.print(f"[red]{escape(str(exc))}[/]", highlight=False)
    return None


def reply_notes(reply, output_tokens: int) -> list[str]:
    """What the REPL says about a reply beyond its text: cut at the output limit, pager's prompt repeated, empty."""
    notes = []
    if reply.unechoed:
        notes.append(f"left out {reply.unechoed} line(s) of pager's own prompt the model repeated; the trace keeps them")
    if reply.truncated:
        notes.append(f"the model's reply was cut at its output limit of {output_tokens} tokens")
    if not (reply.text.strip() or reply.error):
        notes.append("the model sent no text; nothing was stored for it")
    return notes
