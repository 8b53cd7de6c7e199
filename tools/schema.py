"""JSON schemas derived from typed Python functions: a tool is written once, as a function.

The docstring's first paragraph is the tool's description (written for the model); an
`Args:` section gives each parameter's description. Types map to JSON Schema; a parameter
with a default is optional.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Callable, get_args, get_origin, get_type_hints

_JSON = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(hint) -> dict:
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in get_args(hint) if a is not type(None)]
        return _type_schema(options[0]) if len(options) == 1 else {"anyOf": [_type_schema(a) for a in options]}
    if origin in (list, typing.List):
        (item,) = get_args(hint) or (str,)
        return {"type": "array", "items": _type_schema(item)}
    if origin is typing.Literal:
        values = list(get_args(hint))
        return {"type": _JSON[type(values[0])], "enum": values}
    if hint in _JSON:
        return {"type": _JSON[hint]}
    raise TypeError(f"no JSON schema for {hint!r}")


def parse_docstring(fn: Callable) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(fn) or ""
    head, _, rest = doc.partition("\nArgs:\n")
    params: dict[str, str] = {}
    current = None
    for line in rest.splitlines():
        m = re.match(r"\s{0,8}(\w+):\s*(.*)", line)
        if m and not line.startswith(" " * 9):
            current = m.group(1)
            params[current] = m.group(2).strip()
        elif current and line.strip():
            params[current] += " " + line.strip()
    return " ".join(head.split()), params


def schema_of(fn: Callable, skip: int = 1) -> dict:
    """OpenAI function schema of fn; the first `skip` parameters are injected, not shown to the model."""
    description, docs = parse_docstring(fn)
    hints = get_type_hints(fn)
    properties, required = {}, []
    for name, param in list(inspect.signature(fn).parameters.items())[skip:]:
        prop = _type_schema(hints[name])
        if name in docs:
            prop["description"] = docs[name]
        if param.default is inspect.Parameter.empty:
            required.append(name)
        else:
            prop["default"] = param.default
        properties[name] = prop
    return {
        "type": "function",
        "function": {
            "name": fn.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required,
                           "additionalProperties": False},
        },
    }
