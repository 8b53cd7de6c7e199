"""pager for any agent loop: `Toolkit(session=..., home=...)`, its schemas, and `call`.

    from pager import Toolkit

    with Toolkit(session="support-bot") as memory:
        tools = memory.schemas()                       # OpenAI function format
        text = memory.call("search", '{"query": "refund policy"}')   # what a model sent
        memory.remember("Refunds take 5 days.", role="assistant")    # your own code, typed

`call` validates its arguments and returns text (an error says what to do instead); it
never raises for a model's mistake. The typed methods (`remember`, `search`, `context`,
`page_in`, …) are for your own code: the same tools through the same dispatcher, checks and
trace events as `call`, but a refused call raises ToolError with the same text. Calls are recorded in the session's trace as
`external_call` inputs, so a toolkit session replays like a chat session. Several processes
(a REPL, an MCP server, a script) may share one home and session: each call first takes in
what the others wrote.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Literal

from pager.config import Config
from pager.errors import ConfigError, PagerError, ToolError
from pager.home import Home, check_new_name
from pager.trace import TraceWriter, begin, end, new_trace_path

from .dispatch import AGENT, MAX_ARGUMENT_CHARS, Dispatcher


def unreadable(name, arguments) -> str:
    """Why a call cannot even be read, so it is neither run nor recorded; '' when it can (the
    dispatcher then explains anything else: bad JSON, a wrong type, an unknown tool)."""
    try:
        if isinstance(arguments, str) and len(arguments) <= MAX_ARGUMENT_CHARS:
            try:
                json.loads(arguments)
            except ValueError:
                pass
        json.dumps([name, arguments], ensure_ascii=False).encode("utf-8")
    except RecursionError:
        return f"{name}: the arguments are nested too deeply to read; send a flat JSON object"
    except UnicodeEncodeError:
        return (f"{name}: the arguments hold a lone surrogate, which is not valid Unicode; "
                "send the text as UTF-8")
    except (TypeError, ValueError) as exc:
        return f"{name}: arguments must be JSON values ({exc}); send a JSON object"
    return ""


def external(session, dispatcher: Dispatcher, name: str, arguments) -> tuple[str, bool]:
    """Run a tool call that came from outside the agent loop, with its result in the trace."""
    session.sync()
    text, ok = dispatcher.run(session, name, arguments)
    session.emit("tool_result", step=0, id="", name=name, result=text)
    return text, ok


class Toolkit:
    def __init__(self, session: str | None = None, home: str | Path | None = None, user: str | None = None,
                 config: Config | None = None, dispatcher: Dispatcher = AGENT, trace: bool = True) -> None:
        if config is not None:
            _check_agrees(config, session=session, home=home, user=user)
        self.config = config or Config.load(home=home, session=session, user=user)
        self.home = Home(self.config)
        self.session = self.home.open()
        try:   # a name a new session may not have is refused now, not at its first write
            check_new_name(self.session)
        except PagerError:
            self.home.close()
            raise
        self.dispatcher = dispatcher
        self._lock = threading.Lock()
        self._writer = None
        self._closed = False
        if trace:
            path = new_trace_path(self.home.path, self.session.user, self.session.name, "toolkit")
            self._writer = TraceWriter(path, note=f"toolkit session {self.session.name!r}: tool calls from another agent")
            self.session.events.listeners.append(self._writer)
            begin(self.session, "external", self.config.budget)

    def schemas(self, format: str = "openai") -> list[dict]:
        """The tool schemas; only the OpenAI function format (which litellm and most SDKs take)."""
        if format != "openai":
            raise ValueError(f"unknown schema format {format!r}; use 'openai'")
        return self.dispatcher.schemas()

    @property
    def names(self) -> list[str]:
        return self.dispatcher.names

    def call(self, name: str, arguments: str | dict | None = None) -> str:
        return self.run(name, arguments)[0]

    def run(self, name: str, arguments: str | dict | None = None) -> tuple[str, bool]:
        """(text, ok): for servers that mark failed calls as errors."""
        with self._lock:
            if self._closed:   # its home let go of the journal and the store: a call now would open them again behind it
                raise PagerError(f"this Toolkit for session {self.session.name!r} is closed (close() or the end of its "
                                 "`with` block); make a new pager.Toolkit(...) to go on")
            problem = unreadable(name, arguments)
            if problem:   # nothing runs, so nothing is recorded: replay has nothing to redo
                return problem, False
            failed = self._writer.error if self._writer else ""
            self.session.emit("external_call", name=name, arguments=arguments if arguments is not None else "")
            text, ok = external(self.session, self.dispatcher, name, arguments)
            if self._writer and self._writer.error and not failed:
                text += f"\n(the trace stopped: {self._writer.error}; memory itself is unaffected)"
            return text, ok

    # -- typed calls for your own code: the same path as `call`; a refusal raises ToolError -------------------
    def remember(self, text: str, role: Literal["user", "assistant"] = "user", speaker: str = "") -> str:
        """Append a message to memory, durable before this returns."""
        return self._typed("remember", text=text, role=role, speaker=speaker)

    def search(self, query: str, k: int = 5) -> str:
        """Up to k pages matching query, resident or on disk: ids, dates, bookmarks, a snippet each."""
        return self._typed("search", query=query, k=k)

    def context(self, query: str = "", budget: int = 4096) -> str:
        """The memory block for your own prompt (memory map and resident pages), paged for query, within budget tokens."""
        return self._typed("context", query=query, budget=budget)

    def page_in(self, page: str) -> str:
        """Load a page (an id like "p42", or a bookmark keyword) into memory."""
        return self._typed("page_in", page=page)

    def page_out(self, page_id: str) -> str:
        """Evict a page; it stays on disk with its bookmarks."""
        return self._typed("page_out", page_id=page_id)

    def bookmark(self, page_ids: list[str], keywords: list[str], note: str = "") -> str:
        """Bookmark pages under keywords, with an optional note."""
        return self._typed("bookmark", page_ids=page_ids, keywords=keywords, note=note)

    def pin(self, page_id: str) -> str:
        """Keep a page resident until unpinned."""
        return self._typed("pin", page_id=page_id)

    def unpin(self, page_id: str) -> str:
        """Let a pinned page be evicted again."""
        return self._typed("unpin", page_id=page_id)

    def state_set(self, key: str, value: str) -> str:
        """Set one key of the working state (the old value stays in its history)."""
        return self._typed("state_set", key=key, value=value)

    def state_unset(self, key: str) -> str:
        """Remove one key from the working state (its history stays)."""
        return self._typed("state_unset", key=key)

    def facts(self, query: str = "", k: int = 10) -> str:
        """The facts for query (the newest without one), superseded ones marked with their dates."""
        return self._typed("facts", query=query, k=k)

    def summaries(self, query: str = "", k: int = 5) -> str:
        """The rolling summary and the latest episode summaries, or the episodes for query."""
        return self._typed("summaries", query=query, k=k)

    def _typed(self, name: str, **arguments) -> str:
        """Run as `call` would with the arguments a caller wrote (defaults left out, so the trace is the same)."""
        defaults = {p.name: p.default for p in self.dispatcher.params(name) if not p.required}
        sent = {k: v for k, v in arguments.items()
                if k not in defaults or v != defaults[k] or type(v) is not type(defaults[k])}
        text, ok = self.run(name, sent)
        if not ok:
            raise ToolError(text)
        return text

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self.session.write_rest()   # the pages sealed since the model's last full batch, in this trace
            if self._writer:
                end(self.session)
                self._writer.close()
                self._writer = None
            self.home.close()

    def __enter__(self) -> "Toolkit":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_agrees(config: Config, **given) -> None:
    """A setting given both as an argument and in config must say the same thing; never drop one silently."""
    for name, value in given.items():
        if value is None:
            continue
        have = getattr(config, name)
        same = Path(value).expanduser() == have if name == "home" else value == have
        if not same:
            raise ConfigError(f"Toolkit got {name}={str(value)!r} and a config with {name}={str(have)!r}; "
                              f"pass one of them, e.g. config=dataclasses.replace(config, {name}=...)")
