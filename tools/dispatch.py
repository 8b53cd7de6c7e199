"""Running tool calls: parse, validate, call, and always answer with text.

A malformed call (invalid JSON, a missing or mistyped argument, an unknown tool, a page
that does not exist) is answered with a sentence saying what to do instead; a known
failure of pager (PagerError) likewise. Nothing a model sends can end a session.
"""

from __future__ import annotations

import json
from typing import Callable

from pager.errors import PagerError

from .functions import AGENT_TOOLS, MODEL_TOOLS, Mistake
from .schema import MAX_ARGUMENT_CHARS, params_of, schema_of


class Dispatcher:
    """Tools by name, their schemas, and a call that never raises."""

    def __init__(self, functions: tuple[Callable, ...] = MODEL_TOOLS) -> None:
        self.functions = {fn.__name__: fn for fn in functions}
        self._params = {fn.__name__: params_of(fn) for fn in functions}   # the type walk, once per tool
        self._schemas = [schema_of(fn) for fn in functions]

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def params(self, name: str) -> list:
        """The parameters of tool `name` as the dispatcher checks them (empty for an unknown tool)."""
        return list(self._params.get(name, ()))

    def schemas(self) -> list[dict]:
        return json.loads(json.dumps(self._schemas))

    def call(self, session, name: str, arguments: str | dict | None) -> str:
        return self.run(session, name, arguments)[0]

    def run(self, session, name: str, arguments: str | dict | None) -> tuple[str, bool]:
        """The tool's text and whether it succeeded; a failure's text says what to do instead."""
        fn = self.functions.get(name)
        if fn is None:
            return f"unknown tool {name!r}; the tools are: {', '.join(self.functions)}", False
        try:
            kwargs = self._arguments(fn, arguments)
        except ValueError as exc:
            return f"{name}: {exc}", False
        try:
            return fn(session, **kwargs), True
        except Mistake as exc:
            return str(exc), False
        except PagerError as exc:
            return f"{name}: {exc}", False
        except Exception as exc:  # noqa: BLE001 - the model must get an answer, and the session must go on
            return f"{name} failed inside pager ({type(exc).__name__}: {exc}); try again differently", False

    def _arguments(self, fn: Callable, arguments) -> dict:
        if arguments is None or arguments == "":
            arguments = {}
        if isinstance(arguments, str):
            if len(arguments) > MAX_ARGUMENT_CHARS:
                raise ValueError(f"arguments of {len(arguments):,} characters are too long (limit {MAX_ARGUMENT_CHARS:,})")
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as exc:
                raise ValueError(f"arguments are not valid JSON ({exc.msg} at {exc.pos}); send a JSON object") from None
        if not isinstance(arguments, dict):
            raise ValueError("arguments must be a JSON object of named parameters")
        params = self._params[fn.__name__]
        known = {p.name for p in params}
        unknown = set(arguments) - known
        if unknown:
            raise ValueError(f"unknown argument(s) {', '.join(sorted(unknown))}; expected {', '.join(p.name for p in params)}")
        out = {}
        for p in params:
            if p.name not in arguments:
                if p.required:
                    raise ValueError(f"missing required argument {p.name!r}")
                continue
            out[p.name] = p.kind.coerce(p.name, arguments[p.name])
        return out


MODEL = Dispatcher(MODEL_TOOLS)
AGENT = Dispatcher(AGENT_TOOLS)
