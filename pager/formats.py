"""Importers: files of conversation → messages for Session.append_many.

A file is parsed and checked whole before anything is accepted, so a bad line leaves
nothing half-imported; errors name the file, the line and the fix.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable

from .errors import InputError

MAX_TEXT_CHARS = 1_000_000


STDIN = "-"   # the file name that means standard input (`… | pager ingest - -s NAME`)


def read_text(path: Path) -> str:
    path = Path(path)
    try:
        data = sys.stdin.buffer.read() if str(path) == STDIN else path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"no file at {path}; check the path") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a folder; give a file") from None
    try:
        return data.decode("utf-8-sig")   # a byte-order mark some editors write is dropped
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(f"{path}:{line}: not valid UTF-8 (byte {exc.start}); re-save the file as UTF-8") from None


# "ts" is seconds since the epoch, up to the last second of year 9999 (what dates can show)
MAX_TS = 253402300799.0
_LINE_END = re.compile(r"\r\n|\r|\n")


def json_lines(text: str) -> list[str]:
    """The lines of a JSONL text, as str.splitlines gives them but for the line ends JSON keeps raw inside
    a string (U+2028, U+2029, U+0085: text pasted from the web or a word processor): only \n and \r end
    a line here, and those JSON always escapes."""
    lines = _LINE_END.split(text)
    if lines and not lines[-1]:
        lines.pop()
    return lines


def parse_jsonl(path: Path, session: str, warn: Callable[[str], None] | None = None) -> dict[str, list[dict]]:
    """One JSON object per line: {"speaker" or "role", "text" or "content", optional "date", "ts", "session"}.
    warn, if given, hears of lines whose date names no day pager reads (they are dated when imported)."""
    text = read_text(path)
    path = Path("<stdin>") if str(path) == STDIN else path   # as errors name it
    undated: list[tuple[int, str]] = []
    bots: list[tuple[int, str]] = []
    try:
        groups = _parse_jsonl(path, text, session, undated, bots)
    except InputError as exc:
        if _looks_like_locomo(text):
            raise InputError(f"{exc}; the file looks like LoCoMo JSON: add --format locomo") from None
        if shape := _one_document(text):
            raise InputError(f"{path} is {shape}, not JSON lines (one message object per line); convert it: "
                             f"{_convert(path, shape)}; nothing was imported") from None
        raise
    if warn:
        _warn_unread_dates(path, undated, warn)
        if bots:
            number, speaker = bots[0]
            warn(f"{path}:{number}: speaker {speaker[:40]!r} has no \"role\", so it is taken as the assistant's "
                 f"({len(bots)} line{'s' if len(bots) > 1 else ''} like it); if a person said "
                 f"{'them' if len(bots) > 1 else 'it'}, add \"role\": \"user\" to {'those lines' if len(bots) > 1 else 'that line'}")
    return groups


def _warn_unread_dates(path: Path, undated: list[tuple[int, str]], warn: Callable[[str], None]) -> None:
    """One line for every "date" without "ts" (`undated`: line number, date) that names no day (label_time):
    such a line is dated the day it is imported, while its header shows the date as written, so a question
    about that date cannot find it."""
    from .search import label_time

    unread = [(number, date) for number, date in undated if label_time(date) is None]
    if unread:
        number, date = unread[0]
        warn(f"{path}:{number}: date {date[:40]!r} names no day pager reads (like '8 May 2023' or 2023-05-08); "
             f"{len(unread)} line{'s' if len(unread) > 1 else ''} like it {'are' if len(unread) > 1 else 'is'} dated "
             "the day imported: fix the dates, or give each a \"ts\" (seconds since the epoch)")


def _convert(path: Path, shape: str) -> str:
    """The jq command that puts the messages of a file of this shape (_one_document) one per line."""
    jq = "jq -c '.[]'" if shape.startswith("one JSON array") else "jq -c ."
    if str(path) == "<stdin>":
        return f"pipe it through {jq}"
    out = path.with_name(f"{path.stem}{'-lines' if path.suffix == '.jsonl' else ''}.jsonl")
    return f"{jq} {shlex.quote(str(path))} > {shlex.quote(str(out))}"


def _one_document(text: str) -> str:
    """What the whole text is when it is one JSON array, or one object over several lines, of messages
    ("" otherwise): a file saved by a JSON exporter or pretty-printed, which JSONL reads line by line."""
    try:
        data = json.loads(text)
    except ValueError:
        return ""
    if isinstance(data, list) and data and all(isinstance(m, dict) for m in data):
        return "one JSON array of objects"
    if isinstance(data, dict) and len(json_lines(text.strip())) > 1:
        return "one JSON object spread over several lines"
    return ""


def _looks_like_locomo(text: str) -> bool:
    try:
        data = json.loads(text)
    except ValueError:
        return False
    first = data[0] if isinstance(data, list) and data else data
    return isinstance(first, dict) and ("conversation" in first or "qa" in first)


ASSISTANTS = {"assistant", "bot", "chatbot", "ai", "ai assistant", "chatgpt", "gpt", "claude", "gemini", "copilot",
              "llm", "model"}
WRITTEN_ROLE = "role_in_file"   # a line taken as the assistant's keeps the role it had (none: user) for its key


def assistant_name(speaker: str) -> bool:
    """Whether a speaker's name says it is an assistant, not a person: "Bot", "Assistant", "ChatGPT", "gpt-4o"."""
    name = speaker.strip().lower()
    return name in ASSISTANTS or name.startswith(("gpt-", "claude-", "gemini-"))


def _parse_jsonl(path: Path, content: str, session: str, undated: list | None = None,
                 bots: list | None = None) -> dict[str, list[dict]]:
    """The file's messages by session; `undated` gets (line number, date) of each line with a date and no ts,
    `bots` (line number, speaker) of each line with no role taken as the assistant's by its speaker's name."""
    out: dict[str, list[dict]] = {}
    for number, line in enumerate(json_lines(content), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if not out and not line.lstrip().startswith(("{", "[", '"')):   # the first line plain text: a text file
                raise InputError(f"{where}: not JSON; pager ingest reads JSONL, one object per line like "
                                 '{"speaker": "Ann", "text": "…", "date": "8 May 2023"} (or a LoCoMo file with '
                                 "--format locomo): convert the file; nothing was imported") from None
            raise InputError(f"{where}: not JSON ({exc.msg}); fix that line, nothing was imported") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected an object like {{\"speaker\": …, \"text\": …}}; nothing was imported")
        text = obj.get("text", obj.get("content"))
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{where}: needs a non-empty \"text\" (or \"content\"); nothing was imported")
        if "\x00" in text or len(text) > MAX_TEXT_CHARS:
            raise InputError(f"{where}: text has a NUL character or exceeds {MAX_TEXT_CHARS:,} characters; nothing was imported")
        speaker = obj.get("speaker") or obj.get("role") or "user"
        message: dict[str, str | float] = {"speaker": str(speaker), "text": text, "role": str(obj.get("role") or "user"),
                   "date": str(obj.get("date") or ""), "ref": str(obj.get("id") or obj.get("ref") or "")}
        if not obj.get("role") and assistant_name(str(speaker)):
            message["role"], message[WRITTEN_ROLE] = "assistant", "user"
            if bots is not None:
                bots.append((number, str(speaker)))
        if obj.get("key") is not None:
            if not isinstance(obj["key"], str) or not obj["key"] or len(obj["key"]) > 200:
                raise InputError(f"{where}: \"key\" must be a non-empty string of at most 200 characters; "
                                 "nothing was imported")
            message["key"] = obj["key"]
        if obj.get("ts") is not None:
            try:
                ts = float(obj["ts"])
            except (TypeError, ValueError, OverflowError):
                ts = math.nan
            if isinstance(obj["ts"], bool) or not 0 <= ts <= MAX_TS:   # NaN fails this too
                raise InputError(f"{where}: \"ts\" must be seconds since the epoch, a number from 0 to "
                                 f"{MAX_TS:.0f} (year 9999), not {str(obj['ts'])[:40]}; nothing was imported")
            message["ts"] = ts
        elif message["date"] and undated is not None:
            undated.append((number, message["date"]))
        out.setdefault(str(obj.get("session") or session), []).append(message)
    if not out:
        raise InputError(f"{path} holds no messages; expected JSON lines with \"speaker\" and \"text\"")
    return out


def keyed(messages: list[dict]) -> list[dict]:
    """Messages with an idempotency key each, so importing a file again adds nothing twice: a line
    is known by its position among the file's lines for its session and by what it says. A line's
    own "key" wins."""
    out = []
    for i, m in enumerate(messages):
        if m.get("key"):
            out.append({k: v for k, v in m.items() if k != WRITTEN_ROLE})
            continue
        m = dict(m)
        written = {**m, "role": m.pop(WRITTEN_ROLE)} if WRITTEN_ROLE in m else m   # the file's own fields
        what = "\x00".join(str(written.get(k, "")) for k in ("speaker", "role", "text", "date", "ts", "ref"))
        out.append({**m, "key": "line:" + hashlib.sha256(f"{i}\x00{what}".encode()).hexdigest()[:24]})
    return out


def carry_dates(messages: list[dict]) -> list[dict]:
    """Undated lines among dated ones take the day of the dated line before them (the lines before the
    first dated one, its day): a note pasted into a dated log happened that day, not on the day it was
    imported. Its "date" and "ts" are those of that line. A file with no date at all is left as it is
    (its lines are dated when they are imported). Applied after `keyed`: a line's key is made from the
    file's own fields, so files imported before this keep their keys and are not imported twice."""
    dated = [i for i, m in enumerate(messages) if m.get("date") or m.get("ts") is not None]
    if not dated or len(dated) == len(messages):
        return messages
    out, source = [], messages[dated[0]]
    for m in messages:
        if m.get("date") or m.get("ts") is not None:
            source = m
            out.append(m)
        else:
            out.append({**m, **{k: source[k] for k in ("date", "ts") if source.get(k) not in (None, "")}})
    return out


# -- LoCoMo ----------------------------------------------------------------------------------------------
_LOCOMO_DATE = re.compile(r"(\d{1,2}):(\d{2})\s*(am|pm)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", re.I)
_EVIDENCE = re.compile(r"D:?(\d+):0*(\d+)")


def parse_locomo_date(text: str) -> tuple[str, float]:
    """'1:56 pm on 8 May, 2023' → ('8 May 2023', epoch seconds)."""
    m = _LOCOMO_DATE.search(text or "")
    if not m:
        return (text or "").strip(), 0.0
    hour, minute, half, day, month, year = m.groups()
    hour = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    try:
        when = datetime.strptime(f"{day} {month[:3]} {year} {hour}:{minute}", "%d %b %Y %H:%M")
    except ValueError:
        return (text or "").strip(), 0.0
    return f"{int(day)} {when.strftime('%B')} {year}", time.mktime(when.timetuple())


@dataclass
class Question:
    question: str
    category: int
    evidence: list[str]
    answer: str = ""


@dataclass
class Conversation:
    sample_id: str
    messages: list[dict] = field(default_factory=list)   # ready for Session.append_many
    questions: list[Question] = field(default_factory=list)

    @property
    def texts(self) -> dict[str, str]:
        """dia_id → the turn text as indexed (caption included)."""
        return {m["ref"]: m["text"] for m in self.messages}


def turn_text(turn: dict) -> str:
    text = str(turn.get("text") or "")
    caption = turn.get("blip_caption")
    return f"{text} [shares {caption}]" if caption else text


def normalize_evidence(raw: list, known: set[str]) -> list[str]:
    """Evidence ids as D{session}:{turn}, malformed ones repaired, unknown ones dropped."""
    out: list[str] = []
    for item in raw or []:
        for piece in re.split(r"[;\s]+", str(item)):
            m = _EVIDENCE.search(piece)
            if m:
                ref = f"D{int(m.group(1))}:{int(m.group(2))}"
                if ref in known and ref not in out:
                    out.append(ref)
    return out


def parse_locomo(path: Path, warn: Callable[[str], None] | None = None) -> list[Conversation]:
    """The samples of a LoCoMo file, checked whole. warn, if given, hears of sessions whose date_time
    names no day (their turns are dated as undated JSONL lines are: carry_dates, or when imported)."""
    text = read_text(path)
    path = Path("<stdin>") if str(path) == STDIN else path   # as errors name it
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and exc.lineno > 1:   # one JSON value per line: a JSONL file
            raise InputError(f"{path} holds one JSON object per line (JSONL), not a LoCoMo file: import it "
                             "without --format locomo") from None
        raise InputError(f"{path}:{exc.lineno}: not JSON ({exc.msg}); is this a LoCoMo file?") from None
    samples = data if isinstance(data, list) else [data]
    conversations, undated = [], []
    for i, sample in enumerate(samples):
        if not isinstance(sample, dict) or not isinstance(sample.get("conversation"), dict):
            raise InputError(f"{path}: sample {i} has no \"conversation\" object; is this a LoCoMo file?")
        conv = sample["conversation"]
        out = Conversation(str(sample.get("sample_id") or f"sample-{i}"))
        numbers = sorted(int(k.split("_")[1]) for k in conv if re.fullmatch(r"session_\d+", k))
        for n in numbers:
            date, ts = parse_locomo_date(str(conv.get(f"session_{n}_date_time", "")))
            for j, turn in enumerate(conv[f"session_{n}"] or []):
                if not isinstance(turn, dict) or not turn_text(turn).strip():
                    raise InputError(f"{path}: {out.sample_id} session_{n} turn {j + 1} has no text; nothing was imported")
                out.messages.append({"speaker": str(turn.get("speaker") or "?"), "text": turn_text(turn), "date": date,
                                     "ref": str(turn.get("dia_id") or f"D{n}:{j + 1}"), "role": "user",
                                     **({"ts": ts + j} if ts else {})})   # no day read: dated when imported, not 1970
            if not ts and conv[f"session_{n}"]:
                undated.append(f"{out.sample_id} session_{n}")
        out.questions = _questions(path, out, sample.get("qa") or [])
        conversations.append(out)
    if warn and undated:
        warn(f"{path}: {undated[0]} has no session_{undated[0].rsplit('_', 1)[1]}_date_time pager reads (like "
             f"'1:56 pm on 8 May, 2023'); {len(undated)} session{'s' if len(undated) > 1 else ''} like it "
             f"take{'' if len(undated) > 1 else 's'} the date of the turns before, or the day imported")
    return conversations


def _questions(path: Path, conversation: Conversation, qas: list) -> list[Question]:
    """A sample's `qa` entries, each checked: a wrong shape is named, not a traceback."""
    known = {m["ref"] for m in conversation.messages}
    out = []
    for q, qa in enumerate(qas if isinstance(qas, list) else [qas], 1):
        where = f"{path}: {conversation.sample_id} qa {q}"
        if not isinstance(qa, dict):
            raise InputError(f"{where} is not an object like {{\"question\": …, \"category\": 1, \"evidence\": "
                             "[\"D1:3\"]}; nothing was imported")
        category, evidence = qa.get("category", 0), qa.get("evidence")
        if isinstance(category, bool) or not isinstance(category, (int, str)) or not str(category).strip().isdigit():
            raise InputError(f"{where}: \"category\" must be a whole number (LoCoMo's 1 to 5), not "
                             f"{str(category)[:40]!r}; nothing was imported")
        if evidence is not None and not isinstance(evidence, list):
            raise InputError(f"{where}: \"evidence\" must be a list of dialogue ids like [\"D1:3\"], not "
                             f"{str(evidence)[:40]!r}; nothing was imported")
        answer = qa.get("answer", qa.get("adversarial_answer", ""))
        out.append(Question(str(qa.get("question", "")), int(category), normalize_evidence(evidence or [], known),
                            str(answer)))
    return out


def parse_locomo_observations(path: Path) -> dict[str, list[tuple[str, str, list[str]]]]:
    """sample_id → the dataset's `observation` facts as (subject, text, evidence refs): a memory model's
    recorded output (gpt-3.5-turbo wrote them). Each fact is its own subject: the data says nothing
    of which fact updates which."""
    data = json.loads(read_text(path))
    out: dict[str, list[tuple[str, str, list[str]]]] = {}
    for i, sample in enumerate(data if isinstance(data, list) else [data]):
        sid = str(sample.get("sample_id") or f"sample-{i}")
        known = {str(t.get("dia_id")) for k, v in (sample.get("conversation") or {}).items()
                 if re.fullmatch(r"session_\d+", k) for t in v or [] if isinstance(t, dict)}
        facts = out.setdefault(sid, [])
        observations = sample.get("observation") or {}
        for key in sorted(observations, key=lambda k: int(re.sub(r"\D", "", k) or 0)):
            for speaker, items in (observations[key] or {}).items():
                for item in items or []:
                    if not isinstance(item, list) or len(item) < 2 or not str(item[0]).strip():
                        continue
                    raw = item[1] if isinstance(item[1], list) else [item[1]]
                    refs = normalize_evidence(raw, known)
                    if refs:
                        facts.append((f"{speaker} · {refs[0]} · {len(facts) + 1}", str(item[0]), refs))
    return out


def parse_locomo_session_summaries(path: Path) -> dict[str, list[tuple[str, str, list[str]]]]:
    """sample_id → the dataset's `session_summary` entries as episodes (key, text, refs of the turns of
    that session): a memory model's recorded output, one episode summary per conversation session."""
    data = json.loads(read_text(path))
    out: dict[str, list[tuple[str, str, list[str]]]] = {}
    for i, sample in enumerate(data if isinstance(data, list) else [data]):
        sid = str(sample.get("sample_id") or f"sample-{i}")
        conv = sample.get("conversation") or {}
        episodes = out.setdefault(sid, [])
        summaries = sample.get("session_summary") or {}
        for key in sorted(summaries, key=lambda k: int(re.sub(r"\D", "", k) or 0)):
            number = re.sub(r"\D", "", key)
            text = summaries[key]
            turns = conv.get(f"session_{number}") or []
            refs = [str(t.get("dia_id") or f"D{number}:{j + 1}") for j, t in enumerate(turns) if isinstance(t, dict)]
            if isinstance(text, str) and text.strip() and refs:
                episodes.append((f"session {number}", text.strip(), refs))
    return out
