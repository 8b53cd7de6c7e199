"""pager for any agent loop: `Toolkit(session=..., home=...)`, its schemas, and `call`.

    from pager.tools import Toolkit

    with Toolkit(session="support-bot") as memory:
        tools = memory.schemas()                       # OpenAI function format
        text = memory.call("search", '{"query": "refund policy"}')

Every call validates its arguments and returns text (an error says what to do instead); it
never raises for a model's mistake. Calls are recorded in the session's trace as
`external_call` inputs, so a toolkit session replays like a chat session. Several processes
(a REPL, an MCP server, a script) may share one home and session: each call first takes in
what the others wrote.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from pager.config import Config
from pager.home import Home
from pager.trace import TraceWriter, begin, new_trace_path

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
        self.config = config or Config.load(home=home, session=session, user=user)
        self.home = Home(self.config)
        self.session = self.home.open()
        self.dispatcher = dispatcher
        self._lock = threading.Lock()
        self._writer = None
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
            problem = unreadable(name, arguments)
            if problem:   # nothing runs, so nothing is recorded: replay has nothing to redo
                return problem, False
            failed = self._writer.error if self._writer else ""
            self.session.emit("external_call", name=name, arguments=arguments if arguments is not None else "")
            text, ok = external(self.session, self.dispatcher, name, arguments)
            if self._writer and self._writer.error and not failed:
                text += f"\n(the trace stopped: {self._writer.error}; memory itself is unaffected)"
            return text, ok

    def close(self) -> None:
        with self._lock:
            if self._writer:
                self.session.emit("session_end", turns=self.session.turn_count, **self.session.counters)
                self._writer.close()
                self._writer = None
            self.home.close()

    def __enter__(self) -> "Toolkit":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
