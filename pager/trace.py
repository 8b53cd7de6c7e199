"""Events and traces: every paging decision and model exchange, in order, on disk.

An Event is frozen and versioned. A session hands each one to its listeners: the trace
writer (JSONL, flushed per event so a crashed session still leaves a readable trace), the
REPL's display, counters. Replay (pager.replay) re-runs a trace and compares the
normalized stream event by event.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .errors import InputError
from .facts import fact_record
from .formats import json_lines
from .summaries import summary_record

TRACE_VERSION = 1


@dataclass(frozen=True)
class Event:
    seq: int
    kind: str
    data: dict = field(default_factory=dict)
    ts: float = 0.0

    def to_dict(self) -> dict:
        return {"v": TRACE_VERSION, "seq": self.seq, "kind": self.kind, "ts": round(self.ts, 6), **self.data}


Listener = Callable[[Event], None]


class Events:
    """Numbers events and fans them out to listeners."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.seq = 0
        self.listeners: list[Listener] = []

    def emit(self, kind: str, **data) -> Event | None:
        self.seq += 1
        if not self.listeners:  # nobody records this run (benchmarks, replays of other policies)
            return None
        event = Event(self.seq, kind, data, self.clock())
        for listener in list(self.listeners):
            listener(event)
        return event

    def emit_with(self, kind: str, data: Callable[[], dict]) -> Event | None:
        """emit(kind, **data()), with data made only when someone listens."""
        if not self.listeners:
            self.seq += 1
            return None
        return self.emit(kind, **data())


class TraceWriter:
    """Appends events to a JSONL file, one line each, flushed as written.

    A trace is a record, not the memory: when the disk refuses a line (full, gone), writing
    stops, `error` says why, and the session goes on (its turns are in the journal)."""

    def __init__(self, path: Path, note: str = "", flush_each: bool = True) -> None:
        self.path = Path(path)
        self.flush_each = flush_each   # False: the owner calls flush() (a server, once per request)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a", encoding="utf-8")
        self.error = ""
        if note and self.path.stat().st_size == 0:
            self._write({"v": TRACE_VERSION, "seq": 0, "kind": "note", "text": note})

    def __call__(self, event: Event) -> None:
        self._write(event.to_dict())

    def _write(self, obj: dict) -> None:
        if self.error:
            return
        try:
            line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
            line.encode("utf-8")
        except UnicodeEncodeError:   # a lone surrogate: escaped, it is still valid JSON and reads back the same
            line = json.dumps(obj, separators=(",", ":"))
        try:
            self._fh.write(line + "\n")
            if self.flush_each:
                self._fh.flush()
        except OSError as exc:
            self.error = f"{exc.strerror or exc} writing {self.path}"
            try:
                self._fh.close()
            except OSError:
                pass

    def flush(self) -> None:
        if self.error or self._fh.closed:
            return
        try:
            self._fh.flush()
        except OSError as exc:
            self.error = f"{exc.strerror or exc} writing {self.path}"

    def close(self) -> None:
        if not self._fh.closed:
            try:
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError as exc:
                self.error = self.error or f"{exc.strerror or exc} writing {self.path}"
            finally:
                try:
                    self._fh.close()
                except OSError:
                    pass


def new_trace_path(home: Path, user: str, session: str, kind: str) -> Path:
    """A trace file of its own for one run of one session in one process: named for the session
    (sanitized, with a digest of the exact user and session so names that sanitize alike differ),
    the run's kind, the second and the process id, and created here so no other run can take it."""
    folder = Path(home) / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^\w.-]+", "_", session).lstrip(".")[:60] or "session"   # never a dot file, nor '..'
    digest = hashlib.sha256(f"{user}\x00{session}".encode()).hexdigest()[:8]
    stem = f"{safe}-{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{digest}-{os.getpid()}"
    for attempt in range(1000):
        path = folder / f"{stem}{f'-{attempt}' if attempt else ''}.jsonl"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            return path
        except FileExistsError:
            continue
    raise InputError(f"cannot name a new trace in {folder}; remove old traces there")


def read_trace(path: Path) -> Iterator[dict]:
    """The events of a trace file; a torn last line is skipped, a damaged middle names its line."""
    path = Path(path)
    try:
        lines = json_lines(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"no trace at {path}; list traces with `ls ~/.pager/traces`") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a folder; give one trace file in it (`ls {path}`)") from None
    except PermissionError:
        raise InputError(f"cannot read {path}: permission denied") from None
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not UTF-8 text ({exc}); is it a trace?") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                return  # a write cut short by a crash
            raise InputError(f"{path}:{number}: not a JSON line; fix or delete that line") from None
        if isinstance(obj, dict) and "kind" not in obj and ("text" in obj or "content" in obj):
            raise InputError(f"{path}:{number} is a line of conversation, not a trace event: `pager ingest {path}` "
                             "imports it; replay takes a trace from a home's traces/ folder")
        if not isinstance(obj, dict) or "kind" not in obj:
            raise InputError(f"{path}:{number}: an event needs a 'kind'; fix or delete that line")
        if not isinstance(obj.get("v", TRACE_VERSION), int) or not isinstance(obj["kind"], str):
            raise InputError(f"{path}:{number}: an event's 'v' is a number and its 'kind' a name; fix or delete that line")
        if obj.get("v", TRACE_VERSION) > TRACE_VERSION:
            raise InputError(f"{path}:{number}: trace v{obj['v']} is newer than this pager; upgrade pager")
        yield obj


def begin(session, model: str, budget: int, agent_per_message: bool = False) -> None:
    """Open a session's trace: its settings, and for a resumed session the turns and paging
    state it starts from, so that replay needs nothing but the trace. budget is the agent's (the
    configured one, which sized the frames, cut to the model's window); agent_per_message says that
    each message has an Agent of its own (a server's), not one for the whole session (a chat's)."""
    cfg = session.home.config
    per_message = {"agent_per_message": True} if agent_per_message else {}
    session.traced = dict(session.counters)
    session.emit("session_start", session=session.name, user=session.user, model=model, budget=budget, **per_message,
                 page_tokens=session.page_tokens, policy=session.policy.name, tokenizer=session.tokenizer.name,
                 embedder=cfg.embedder, embedder_dim=session.home.embedder.dim, resumed_turns=session.turn_count,
                 config={"budget": cfg.budget, "map_tokens": cfg.map_reserve, "autopage_share": cfg.autopage_share,
                         "readahead": cfg.readahead, "max_steps": cfg.max_steps, "output_tokens": cfg.output_tokens,
                         "recency_weight": cfg.recency_weight, "summary_share": cfg.summary_share,
                         "supersede": cfg.supersede, "supersede_tail": cfg.supersede_tail, "words_first": cfg.words_first,
                         "weak_similarity": cfg.weak_similarity,
                         "fill": cfg.fill, "fact_dates": cfg.fact_dates,
                         # what decides paging and the prompt beside them (traces before these were recorded: defaults)
                         "autopage_min_score": cfg.autopage_min_score, "pressure": cfg.pressure,
                         "state_share": cfg.state_share, "fact_share": cfg.fact_share, "excerpt_slabs": cfg.excerpt_slabs,
                         **({"reranker": cfg.reranker, "rerank_pieces": cfg.rerank_pieces,
                             "rerank_facts": cfg.rerank_facts} if cfg.reranker else {})})
    if session.turn_count:
        from .fsck import durable_turns

        session.home.flush()
        # what the session holds, no more and no less: turns it took in from a live process's journal are
        # in no store yet, and another process may have stored more since it synced, which come in as an
        # `append` at its next sync (replay would load them twice)
        turns = [t for t in durable_turns(session.home, session.user, session.name) if t.turn <= session.turn_count]
        known = session.directory.uids
        stored = [m for m in session.home.store.bookmarks(session.user, session.name) if m.uid in known or not m.uid]
        held = {m.uid for m in stored}   # and those taken in from a live process's journal, in no store yet
        stored += [m for m in session._marks_in if m.uid not in held]
        session.emit("snapshot", turns=[{"speaker": t.speaker, "text": t.text, "role": t.role, "date": t.date,
                                         "ts": t.ts, "ref": t.ref, **({"key": t.key} if t.key else {})}
                                        for t in turns], state=session.paging_state(),
                     bookmarks=[m.to_dict() for m in stored],
                     page_keywords=True,
                     changes=[asdict(c) for c in session.state.changes],
                     facts=[fact_record(f) for f in session.facts.items],
                     summaries=[summary_record(x) for x in session.summaries.items])


def end(session) -> None:
    """Close a session's trace: its turns, and the faults, hits and evictions of this trace, as many as its
    events (the session's own counters run on across runs and processes, in its stored page table)."""
    session.emit("session_end", turns=session.turn_count,
                 **{k: n - session.traced.get(k, 0) for k, n in session.counters.items()})
