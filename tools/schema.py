"""Tool parameters from typed Python functions: a tool is written once, as a function.

One walker (`kind_of`) reads a parameter's type hint once and yields both its JSON schema
(what the model is shown) and its coercion (what the dispatcher accepts), so the two cannot
disagree: every call the schema allows is accepted, and a refusal says what to send instead.
The docstring's first paragraph is the tool's description (written for the model); an
`Args:` section gives each parameter's description. A parameter with a default is optional.
"""

from __future__ import annotations

import inspect
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, get_args, get_origin, get_type_hints

MAX_ARGUMENT_CHARS = 100_000

_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


@dataclass(frozen=True)
class Kind:
    """A parameter type: its JSON schema, and `coerce(name, value)` that accepts what the schema allows
    (plus what a model plausibly meant, "5" for 5) and raises ValueError naming the fix otherwise."""

    schema: dict
    coerce: Callable[[str, Any], Any]
    label: str      # for messages: "a string", "one of 'a', 'b'"


def kind_of(hint) -> Kind:
    """The Kind of a type hint; TypeError for a type no JSON schema describes (a programmer's mistake)."""
    origin = get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return _union(get_args(hint))
    if origin in (list, typing.List):
        (item,) = get_args(hint) or (str,)
        return _list(kind_of(item))
    if origin is typing.Literal:
        return _literal(get_args(hint))
    if hint in _SCALARS:
        return _SCALARS[hint]
    raise TypeError(f"no JSON schema for {hint!r}; use str, int, float, bool, Literal, list[...] or X | None")


def _string(name: str, value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string, got {_show(value)}")
    if len(value) > MAX_ARGUMENT_CHARS:
        raise ValueError(f"{name} of {len(value):,} characters is too long (limit {MAX_ARGUMENT_CHARS:,}); "
                         "split it into several calls")
    if "\x00" in value:
        raise ValueError(f"{name} contains a NUL character")
    return value


def _integer(name: str, value):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit() and value.isascii():   # "²" is a digit too
        return int(value)
    raise ValueError(f"{name} must be a whole number, got {_show(value)}")


def _number(name: str, value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"{name} must be a number like 0.5, got {_show(value)}") from None
    else:
        raise ValueError(f"{name} must be a number like 0.5, got {_show(value)}")
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {_show(value)}")
    return number


def _boolean(name: str, value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError(f"{name} must be true or false, got {_show(value)}")


def _null(name: str, value):
    if value is None:
        return None
    raise ValueError(f"{name} must be null, got {_show(value)}")


_SCALARS = {
    str: Kind({"type": "string"}, _string, "a string"),
    int: Kind({"type": "integer"}, _integer, "a whole number"),
    float: Kind({"type": "number"}, _number, "a number"),
    bool: Kind({"type": "boolean"}, _boolean, "true or false"),
    type(None): Kind({"type": "null"}, _null, "null"),
}


def _literal(values: tuple) -> Kind:
    kinds = {type(v) for v in values}
    if not kinds <= set(_JSON):
        raise TypeError(f"Literal values must be str, int, float, bool or None, not {values!r}")
    schema: dict = {"enum": list(values)}
    if len(kinds) == 1:
        schema = {"type": _JSON[kinds.pop()], **schema}
    label = "one of " + ", ".join(repr(v) for v in values)

    def coerce(name: str, value):
        for v in values:   # "2" for 2 when 2 is allowed; True is not 1
            if value == v and type(value) is type(v) or (isinstance(value, str) and not isinstance(v, str)
                                                         and value.strip() == str(v)):
                return v
        raise ValueError(f"{name} must be {label}, got {_show(value)}")

    return Kind(schema, coerce, label)


def _union(options: tuple) -> Kind:
    kinds = [kind_of(a) for a in options if a is not type(None)]
    nullable = len(kinds) < len(options)
    if len(kinds) == 1 and not nullable:
        return kinds[0]
    if nullable:
        kinds.append(_SCALARS[type(None)])
    schemas = [k.schema for k in kinds]
    if all(set(s) == {"type"} for s in schemas):
        schema: dict = {"type": [s["type"] for s in schemas]}
    elif nullable and len(kinds) == 2 and "enum" in schemas[0]:
        schema = {**schemas[0], "enum": [*schemas[0]["enum"], None]}
        if "type" in schema:
            schema["type"] = [schema["type"], "null"]
    else:
        schema = {"anyOf": schemas}
    label = " or ".join(k.label for k in kinds)

    def coerce(name: str, value):
        if value is None and nullable:
            return None
        for kind in kinds:   # exact matches first: "5" stays a string where a string is allowed
            if _exact(kind, value):
                return kind.coerce(name, value)
        for kind in kinds:
            try:
                return kind.coerce(name, value)
            except ValueError:
                continue
        raise ValueError(f"{name} must be {label}, got {_show(value)}")

    return Kind(schema, coerce, label)


def _exact(kind: Kind, value) -> bool:
    t = kind.schema.get("type")
    if "enum" in kind.schema:
        return value in kind.schema["enum"]
    return {"string": isinstance(value, str), "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, (int, float)) and not isinstance(value, bool),
            "boolean": isinstance(value, bool), "array": isinstance(value, list),
            "null": value is None}.get(t, False) if isinstance(t, str) else False


_PLURALS = {"a string": "strings", "a whole number": "whole numbers", "a number": "numbers",
            "true or false": "true/false values"}


def _list(item: Kind) -> Kind:
    label = "a list of " + _PLURALS.get(item.label, f"values that are {item.label}")   # not "a list of a strings"

    def coerce(name: str, value):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]   # "p3" for ["p3"]
        if not isinstance(value, list):
            raise ValueError(f"{name} must be {label}, got {_show(value)}")
        return [item.coerce(name, v) for v in value]

    return Kind({"type": "array", "items": item.schema}, coerce, label)


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


@dataclass(frozen=True)
class Param:
    name: str
    kind: Kind
    required: bool
    default: Any = None


def params_of(fn: Callable, skip: int = 1) -> list[Param]:
    """The parameters a caller passes (the first `skip` are injected), each with its Kind."""
    hints = get_type_hints(fn)
    out = []
    for p in list(inspect.signature(fn).parameters.values())[skip:]:
        try:
            kind = kind_of(hints[p.name])
        except (TypeError, KeyError) as exc:
            raise TypeError(f"tool {fn.__name__}, parameter {p.name}: {exc}") from None
        required = p.default is inspect.Parameter.empty
        out.append(Param(p.name, kind, required, None if required else p.default))
    return out


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
    properties, required = {}, []
    for p in params_of(fn, skip):
        prop = dict(p.kind.schema)
        if p.name in docs:
            prop["description"] = docs[p.name]
        if p.required:
            required.append(p.name)
        else:
            prop["default"] = p.default
        properties[p.name] = prop
    return {
        "type": "function",
        "function": {
            "name": fn.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required,
                           "additionalProperties": False},
        },
    }
