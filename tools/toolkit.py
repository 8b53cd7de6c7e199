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

import threading
from pathlib import Path

from pager.config import Config
from pager.home import Home
from pager.trace import TraceWriter, begin, new_trace_path

from .dispatch import AGENT, Dispatcher


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
            self.session.emit("external_call", name=name, arguments=arguments if arguments is not None else "")
            return external(self.session, self.dispatcher, name, arguments)

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
