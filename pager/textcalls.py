"""Tool calls a model wrote as text instead of sending through the API.

Small local models, and chat templates a server does not parse back, answer a tool request
with the call in the reply's text: Qwen/Hermes `<tool_call>{…}</tool_call>` tags, a JSON code
block, or a bare JSON object. Shown to the user that is noise, and the call never runs. `read`
finds such calls and returns them in the API's shape, with the text around them; the agent
then runs them as if they had come as tool calls. Text that looks like a call but cannot be
read (a tag around broken JSON, a code block naming a tool with an unclosed brace) is
`malformed`: the agent asks the model again, and never shows it to the user.

Only what is plainly a call is taken: an object naming a tool (`name`, `function`, or `tool`)
with its arguments (`arguments`, `parameters`, `args`, `input`), or naming one of the tools the
model was offered. JSON the user asked for (a config, a record) stays text. Reading depends on
the reply's text alone, so a replay recovers exactly what the recording did.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

NAME_KEYS = ("name", "function", "tool", "tool_name")
ARGUMENT_KEYS = ("arguments", "parameters", "args", "input", "params")

_TAG = re.compile(r"<(tool_call|function_call|tools?)>\s*(.*?)\s*(?:</\1>|$)", re.S | re.I)
_FENCE = re.compile(r"```[ \t]*([A-Za-z_]*)[ \t]*\n?(.*?)(?:```|$)", re.S)
# `name(args)` written as code, one call on its own line: the Python form some models use
_PYCALL = re.compile(r"^\s*([a-z_][a-z0-9_]*)\((.*)\)\s*$", re.S)


@dataclass
class Reading:
    """What a reply's text held: the calls in it, the text without them, and what could not be read."""

    calls: list[dict] = field(default_factory=list)   # [{"id", "name", "arguments"}] as ModelReply has them
    text: str = ""                                     # the reply with the calls' syntax taken out
    form: str = ""                                     # "tag", "code block", "json": how the calls were written
    malformed: str = ""                                # why a call-like part could not be read ("" when none)


def read(text: str, tools: set[str], step: int = 0) -> Reading:
    """The tool calls written in `text`; `tools` are the names the model was offered."""
    if not text or not any(mark in text for mark in ("{", "<tool", "<function", "```")):
        return Reading(text=text)
    for form, finder in (("tag", _tags), ("code block", _fences), ("json", _bare)):
        found, rest, malformed = finder(text, tools)
        if found or malformed:
            calls = [{"id": f"text_{step}_{i}", "name": name, "arguments": arguments}
                     for i, (name, arguments) in enumerate(found)]
            return Reading(calls, _tidy(rest), form, "" if found else malformed)
    return Reading(text=text)


def looks_like_call(text: str, tools: set[str]) -> bool:
    """Whether text still carries tool-call syntax (what must never be shown as an answer)."""
    reading = read(text, tools)
    return bool(reading.calls or reading.malformed)


def _tags(text: str, tools: set[str]):
    found, malformed = [], ""
    spans = []
    for match in _TAG.finditer(text):
        spans.append(match.span())
        objects = _objects(match.group(2))
        if objects is None:
            malformed = malformed or f"the {match.group(1)} tag does not hold valid JSON"
            continue
        for obj in objects:
            call = _call(obj, tools, loose=True)
            if call is None:
                malformed = malformed or f"the {match.group(1)} tag holds JSON that names no tool"
            else:
                found.append(call)
    return found, _cut(text, spans), malformed


def _fences(text: str, tools: set[str]):
    found, malformed = [], ""
    spans = []
    for match in _FENCE.finditer(text):
        lang, body = match.group(1).lower(), match.group(2).strip()
        if lang not in ("", "json", "tool_call", "tool_code", "python", "tool", "function"):
            continue
        objects = _objects(body)
        if objects is None:
            py = _python_call(body, tools)
            if py is not None:
                found.append(py)
                spans.append(match.span())
            elif _names_tool(body, tools) or lang.startswith("tool"):
                malformed = malformed or "the code block looks like a tool call but is not valid JSON"
                spans.append(match.span())
            continue
        calls = [_call(obj, tools, loose=lang.startswith("tool")) for obj in objects]
        if calls and all(c is not None for c in calls):
            found.extend(c for c in calls if c is not None)
            spans.append(match.span())
    return found, _cut(text, spans), malformed


def _bare(text: str, tools: set[str]):
    """A reply that is a JSON object (or list of them), or ends with one after a line of prose."""
    stripped = text.strip()
    start = _json_start(stripped)
    if start < 0:
        return [], text, ""
    body = stripped[start:]
    objects = _objects(body)
    if objects is None:
        py = _python_call(stripped, tools) if start == 0 else None
        if py is not None:
            return [py], "", ""
        if _names_tool(body, tools) and re.search(r'"(name|function|tool)"\s*:', body):
            return [], stripped[:start], "the reply looks like a tool call but is not valid JSON"
        return [], text, ""
    calls = [_call(obj, tools) for obj in objects]
    if calls and all(c is not None for c in calls):
        return [c for c in calls if c is not None], stripped[:start], ""
    return [], text, ""


def _json_start(text: str) -> int:
    """Where a trailing JSON value begins: the whole text, or after the last line of prose."""
    if text[:1] in "{[":
        return 0
    at = text.find("\n{")
    return at + 1 if at >= 0 else -1


def _objects(body: str) -> list[dict] | None:
    """The JSON objects in body (one, a list, or one per line); None when it is not JSON."""
    body = body.strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        value = _overbraced(body)
        if value is None:
            lines = [line for line in body.splitlines() if line.strip()]
            if len(lines) < 2:
                return None
            each = [_one_object(line.strip()) for line in lines]
            value = [v for v in each if v is not None]
            if len(value) < len(each):
                return None
    values = value if isinstance(value, list) else [value]
    if not values or not all(isinstance(v, dict) for v in values):
        return None if not isinstance(value, (dict, list)) else []
    return values


def _one_object(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return _overbraced(line)
    return value if isinstance(value, dict) else None


def _overbraced(body: str) -> dict | None:
    """An object written with its braces doubled, as a template escapes them, and often closed with
    more than it opened (`{{"name": …, "arguments": {…}}}}`): the object inside, or None."""
    if not body.startswith("{{"):
        return None
    try:
        value, end = json.JSONDecoder().raw_decode(body[1:])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) and not body[1 + end:].strip("} \t\n") else None


def _call(obj: dict, tools: set[str], loose: bool = False) -> tuple[str, str] | None:
    """(name, arguments as JSON) when obj is a call; loose (inside a tool_call tag): any named object."""
    if isinstance(obj.get("function"), dict):   # {"type": "function", "function": {"name", "arguments"}}
        obj = obj["function"]
    name = next((obj[k] for k in NAME_KEYS if isinstance(obj.get(k), str) and obj[k].strip()), None)
    if name is None:
        return None
    key = next((k for k in ARGUMENT_KEYS if k in obj), None)
    if key is None and not (loose or name in tools):
        return None
    if not (loose or name in tools or key is not None and len(obj) <= 3):
        return None
    arguments = obj.get(key, {}) if key else {k: v for k, v in obj.items() if k not in NAME_KEYS and k != "type"}
    if isinstance(arguments, str):
        return name.strip(), arguments   # already JSON text (or not: the dispatcher says so)
    return name.strip(), json.dumps(arguments, ensure_ascii=False)


def _python_call(body: str, tools: set[str]) -> tuple[str, str] | None:
    """`search(query="Loom team")` on its own: a call of an offered tool with keyword arguments."""
    match = _PYCALL.match(body)
    if match is None or match.group(1) not in tools:
        return None
    arguments: dict = {}
    for part in re.finditer(r"([a-z_]+)\s*=\s*(\"[^\"]*\"|'[^']*'|-?\d+(?:\.\d+)?|true|false|True|False)", match.group(2)):
        raw = part.group(2)
        value: object = raw[1:-1] if raw[0] in "\"'" else raw.lower() == "true" if raw.lower() in ("true", "false") \
            else float(raw) if "." in raw else int(raw)
        arguments[part.group(1)] = value
    if match.group(2).strip() and not arguments:
        return None
    return match.group(1), json.dumps(arguments, ensure_ascii=False)


def _names_tool(body: str, tools: set[str]) -> bool:
    return any(re.search(rf'["\']?{re.escape(name)}["\']?', body) for name in tools) or "tool_call" in body


def _cut(text: str, spans: list[tuple[int, int]]) -> str:
    out, at = [], 0
    for a, b in spans:
        out.append(text[at:a])
        at = b
    out.append(text[at:])
    return "".join(out)


def _tidy(text: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", text).strip()
