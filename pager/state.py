"""The working state: one small key → value document per session, always resident in its own
region of the prompt (a task's slots, a user's profile: city, order id, what is still missing).

It changes one key at a time (set or unset), never rewritten whole, and every change is kept:
a `Change` is a durable journal op ("state") numbered per session under the session's lock, so
every process applies the same changes in the same order, and the document and the history of
each key are a pure function of the changes (the journals, then the store's `state_changes`).
An unset is a change too; nothing is ever deleted.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from .errors import InputError

KEY_CHARS = 60
VALUE_CHARS = 400
TITLE = "[state · the user's current facts, newest value per key; older values are in memory]"


def normal_key(key: str) -> str:
    """'My  Home City' → 'home city': lower case, single spaces, no leading 'my'."""
    key = " ".join(str(key).replace("_", " ").split()).strip(" .:;,!?\"'").lower()
    return re.sub(r"^(?:my|our|the)\s+", "", key)


@dataclass(frozen=True)
class Change:
    """One set (or unset) of one key: what, from which page and turn, when, and who asked."""

    seq: int        # 1, 2, … per session: the order every process applies changes in
    key: str
    value: str      # "" for an unset
    unset: bool
    page: int       # the page the change came from: the open tail page when it was made
    turn: int       # the last turn of the session then
    ts: float
    source: str     # "model" (a tool call), "user" (a slash command), "tool" (another agent)

    def to_op(self) -> dict:
        return {"op": "state", **asdict(self)}

    @classmethod
    def from_record(cls, r: dict) -> "Change":
        return cls(int(r["seq"]), r["key"], r.get("value") or "", bool(r["unset"]), int(r["page"]), int(r["turn"]),
                   float(r["ts"]), r.get("source") or "model")

    def event(self) -> dict:
        return {"key": self.key, "value": self.value, "unset": self.unset, "page": f"p{self.page}",
                "turn": self.turn, "change": self.seq, "source": self.source}


def check(key: str, value: str | None) -> tuple[str, str]:
    """The key normalized and the value trimmed; InputError says what is wrong."""
    for name, text in (("key", key), ("value", value or "")):
        if "\x00" in str(text):
            raise InputError(f"a state {name} contains a NUL character; send it without one")
    k = normal_key(key)
    if not k:
        raise InputError("a state key needs a word or two, like 'home city'")
    if len(k) > KEY_CHARS:
        raise InputError(f"a state key is at most {KEY_CHARS} characters; shorten {k[:30]!r}…")
    if value is None:
        return k, ""
    v = " ".join(str(value).split())
    if not v:
        raise InputError(f"an empty value for {k!r}; use state_unset to remove a key")
    if len(v) > VALUE_CHARS:
        raise InputError(f"a state value is at most {VALUE_CHARS} characters; keep only the fact, not the story")
    return k, v


class State:
    """The document (key → its latest Change) and every change, in order."""

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.current: dict[str, Change] = {}
        self._waiting: dict[int, Change] = {}

    @property
    def seq(self) -> int:
        return self.changes[-1].seq if self.changes else 0

    def __len__(self) -> int:
        return len(self.changes)

    def add(self, change: Change, vector=None) -> Change | None:
        """Apply the next change (numbered seq + 1); returns the change of its key it replaces, if any."""
        older = self.current.get(change.key)
        self.changes.append(change)
        if change.unset:
            self.current.pop(change.key, None)
        else:
            self.current[change.key] = change
        return older

    def take(self, changes) -> list[Change]:
        """Apply changes in seq order; one ahead of a gap waits for it, one already held is ignored."""
        for c in changes:
            if c.seq > self.seq:
                self._waiting.setdefault(c.seq, c)
        applied = []
        while self.seq + 1 in self._waiting:
            c = self._waiting.pop(self.seq + 1)
            self.add(c)
            applied.append(c)
        return applied

    @property
    def gap(self) -> bool:
        return bool(self._waiting)

    def values(self) -> dict[str, str]:
        return {k: c.value for k, c in sorted(self.current.items())}

    def history(self, key: str) -> list[Change]:
        k = normal_key(key)
        return [c for c in self.changes if c.key == k]

    def find(self, query: str) -> list[Change]:
        """Changes whose key or value shares a search term with the query, newest first: the history
        of every key is searchable."""
        from .search import terms

        words = set(terms(query))
        hits = [c for c in self.changes if words & set(terms(f"{c.key} {c.value}"))]
        return sorted(hits, key=lambda c: -c.seq)

    def lines(self, date_of) -> list[str]:
        """One line per key, oldest set first: `- home city: Berlin (p12, 8 May 2023)`."""
        out = []
        for c in sorted(self.current.values(), key=lambda c: c.seq):
            date = date_of(c)
            out.append(f"- {c.key}: {c.value} (p{c.page}{', ' + date if date else ''})")
        return out

    def to_json(self) -> dict:
        return {k: {"value": c.value, "page": f"p{c.page}", "turn": c.turn, "ts": c.ts, "change": c.seq}
                for k, c in sorted(self.current.items())}


# -- what the offline shell may take as a statement of state -------------------------------------------------
_VALUE = r"([^?!\n]{1,120}?)"
_LABELLED = re.compile(r"^\s*(?:set\s+)?([a-z][a-z' -]{0,30}?)\s*:\s+([^?!\n]{1,40}?)\s*$", re.I)  # a short value only
# a word or two of talk before a statement ("actually my city is now Lisbon", "Correction: my dose is 20 mg")
_LEAD = (r"^\s*(?:(?:actually|oh|ok|okay|so|well|also|and|btw|by the way|correction|update|sorry|fyi|no|hey|"
         r"just so you know)\s*[,:;.!-]?\s+)*")
_STATEMENTS = [
    re.compile(_LEAD + r"remember(?: that)?\s*[:,-]?\s*(?:my\s+)?([a-z][\w' -]{0,40}?)\s+(?:is|are|=)\s+" + _VALUE + r"\s*[.!]?\s*$", re.I),
    re.compile(_LEAD + r"my\s+([a-z][\w' -]{0,40}?)\s+(?:is|are)\s+(?:now\s+)?" + _VALUE + r"\s*[.!]?\s*$", re.I),
    _LABELLED,
]
_HEDGES = re.compile(r"\b(not|maybe|might|perhaps|probably|think|thinks|guess|if|was|were|used to|no longer|"
                     r"going to|will be|would|could|should|isn't|aren't|wasn't)\b", re.I)
_NOT_VALUES = re.compile(r"(called|named|going|getting|coming|doing|being|looking|feeling|trying|working|so|too|very)\b",
                         re.I)  # "the boat is called X", "my week is going well": a story, not a value
# "my sister is visiting next week": after "is", an event, not a value ("King Street", "Product: standing desk" stay)
_PROGRESSIVE = re.compile(r"[a-z]+ing\s+\S")
# "Biscuit and she is a beagle", "12 Main St, and I moved in May": the value ends where a clause of its own
# starts (a conjunction and a pronoun); "Simon and Garfunkel" stays whole
_CLAUSE = re.compile(r"\s*,?\s+(?:and|but|so|because)\s+(?:i|i'm|i've|we|you|he|she|it|they|it's|she's|he's|that)\b", re.I)
_NOT_KEYS = {"it", "this", "that", "he", "she", "they", "what", "which", "who", "here", "there", "note", "ps",
             "re", "fwd", "http", "https", "question", "answer", "update", "todo"}


def parse_statements(text: str) -> list[tuple[str, str]]:
    """(key, value) pairs a user plainly stated, one per line: "my X is Y", "remember: X is Y",
    "X: Y". Conservative: a line with a question, a hedge or a negation, a long key or a long
    value states nothing; so does a message of more than a few lines."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if not lines or len(lines) > 6:
        return []
    out: dict[str, str] = {}
    for line in lines:
        if "?" in line or _HEDGES.search(line):
            continue
        for pattern in _STATEMENTS:
            m = pattern.match(line)
            if not m:
                continue
            key, value = normal_key(m.group(1)), _CLAUSE.split(m.group(2), 1)[0].strip().rstrip(".!,;").strip()
            if (not key or key.split()[0] in _NOT_KEYS or len(key.split()) > 4 or not value or len(value.split()) > 12
                    or _NOT_VALUES.match(value) or (_PROGRESSIVE.match(value) and pattern is not _LABELLED)):
                break
            out[key] = value
            break
    return list(out.items())
