"""The disk: where every turn, page, bookmark and page-table snapshot lives.

Two stores keep one contract (tests/test_store_contract.py runs it against both):
`MemoryStore` for tests and benchmarks that need no persistence, and `LanceStore`, the
embedded LanceDB database under PAGER_HOME (or any LanceDB URI, s3:// included).

Writes arrive in batches from the journal, never one row at a time: every LanceDB `add`
is a new version and fragment. Writes are insert-if-absent on their natural keys, so a
batch replayed after a crash, or written by two processes that sealed the same page,
lands once. Every filter is built with lancedb.expr, never by pasting strings.

Everything here is shared by every host that opens the same URI; nothing in this module assumes
the URI is a local folder (is_local guards the two places that look at files: stats and the
sweep of a killed writer's temporary files in pager.home). The `leases` table is born with all
its rows and only ever updated by compare-and-swap (swap_lease), so a lease never races an insert.
"""

from __future__ import annotations

import atexit
import json
import re
import time
import warnings
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Protocol

import numpy as np

from . import lance
from .bookmarks import Bookmark
from .errors import NewerStore, StoreError
from .page import Page, Turn
from .facts import Fact, fact_record
from .state import Change
from .summaries import Summary, summary_from, summary_record

SCHEMA_VERSION = 9  # 2: turns carry an idempotency key; 3: a `leases` table (one writer per session across hosts);
                    # 4: tables of working-state changes and facts; 5: a table of summaries;
                    # 6: vectors of the embedder's size (wordllama 128); 7: facts gain `ends`;
                    # 8: pages gain `piece_tokens` (each piece's count, made when the page was packed);
                    # 9: facts and summaries gain `vector` and `embedder` (their vectors, and what made them)
LEASE_SLOTS = 64      # rows of the leases table; a session's lease lives in the row its name hashes to


def is_local(uri: str) -> bool:
    """Whether a store URI is a folder on this machine (not s3://, gs://, az://, memory://)."""
    return "://" not in uri or uri.startswith("file://")


@dataclass
class Batch:
    """One write: new turns, sealed pages (with one vector per piece), bookmarks, page-table states and
    working-state changes."""

    turns: list[Turn] = field(default_factory=list)
    pages: list[Page] = field(default_factory=list)
    vectors: list[np.ndarray] = field(default_factory=list)
    bookmarks: list[tuple[str, str, Bookmark]] = field(default_factory=list)  # (user, session, bookmark)
    states: dict[tuple[str, str], dict] = field(default_factory=dict)         # (user, session) → snapshot
    changes: list[tuple[str, str, Change]] = field(default_factory=list)      # (user, session, state change)
    facts: list[tuple[str, str, Fact]] = field(default_factory=list)          # (user, session, fact)
    summaries: list[tuple[str, str, Summary]] = field(default_factory=list)   # (user, session, summary)
    # the vectors of facts and summaries: those of this batch's rows, or of rows stored without one (or with
    # another embedder's), written over them; (table, user, session, record, embedder_key(...), vector)
    vectored: list[tuple[str, str, str, Any, str, np.ndarray]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.turns or self.pages or self.bookmarks or self.states or self.changes or self.facts
                    or self.summaries or self.vectored)

    def merged(self, later: "Batch") -> "Batch":
        """This batch followed by a later one (a failed write put back in front of what came since)."""
        return Batch(self.turns + later.turns, self.pages + later.pages, self.vectors + later.vectors,
                     self.bookmarks + later.bookmarks, {**self.states, **later.states}, self.changes + later.changes,
                     self.facts + later.facts, self.summaries + later.summaries, self.vectored + later.vectored)


class Store(Protocol):
    def put(self, batch: Batch, fence: Callable[[], None] | None = None) -> None: ...
    def turns(self, user: str, session: str, after: int = 0) -> list[Turn]: ...
    def turn_count(self, user: str, session: str) -> int: ...
    def keys(self, user: str, session: str) -> dict[str, int]: ...
    def pages(self, user: str, session: str, after: int = 0, with_vectors: bool = True) -> tuple[list[Page], list[np.ndarray]]: ...
    def bookmarks(self, user: str, session: str) -> list[Bookmark]: ...
    def state(self, user: str, session: str) -> dict | None: ...
    def state_changes(self, user: str, session: str, after: int = 0) -> list[Change]: ...
    def facts(self, user: str, session: str, after: int = 0) -> list[Fact]: ...
    def summaries(self, user: str, session: str, after: int = 0) -> list[Summary]: ...
    def tier_vectors(self, table: str, user: str, session: str, embedder: str) -> dict[int, np.ndarray]: ...
    def sessions(self) -> list[dict]: ...   # user, session, turns (the last), pages (sealed), sealed_to (the last turn on one)
    def refresh(self, names: Iterable[str] | None = None) -> None: ...
    def compact(self, keep_seconds: float) -> None: ...
    def stats(self) -> dict: ...


class MemoryStore:
    """Dictionaries in this process; the reference implementation of the contract."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim
        self._turns: dict[tuple[str, str], dict[int, Turn]] = {}
        self._pages: dict[tuple[str, str], dict[int, tuple[Page, np.ndarray]]] = {}
        self._bookmarks: dict[tuple[str, str], dict[str, Bookmark]] = {}
        self._states: dict[tuple[str, str], dict] = {}
        self._changes: dict[tuple[str, str], dict[int, Change]] = {}
        self._facts: dict[tuple[str, str], dict[int, Fact]] = {}
        self._summaries: dict[tuple[str, str], dict[int, Summary]] = {}
        self._tier_vectors: dict[tuple[str, str, str, int], tuple[str, np.ndarray]] = {}   # (table, user, session, n)
        self.writes = 0

    def put(self, batch: Batch, fence: Callable[[], None] | None = None) -> None:
        self.writes += 1   # one process's alone: no lease to fence
        for t in batch.turns:
            self._turns.setdefault((t.user, t.session), {}).setdefault(t.turn, t)
        for page, vector in zip(batch.pages, batch.vectors):
            self._pages.setdefault((page.user, page.session), {}).setdefault(page.n, (page, vector))
        for user, session, b in batch.bookmarks:
            self._bookmarks.setdefault((user, session), {}).setdefault(b.uid, b)
        self._states.update({k: json.loads(json.dumps(v)) for k, v in batch.states.items()})
        for user, session, c in batch.changes:
            self._changes.setdefault((user, session), {}).setdefault(c.seq, c)
        for user, session, f in batch.facts:
            self._facts.setdefault((user, session), {}).setdefault(f.n, f)
        for user, session, x in batch.summaries:
            self._summaries.setdefault((user, session), {}).setdefault(x.n, x)
        for table, user, session, record, key, vector in batch.vectored:
            self._tier_vectors[(table, user, session, record.n)] = (key, np.asarray(vector, dtype=np.float16))

    def turns(self, user: str, session: str, after: int = 0) -> list[Turn]:
        rows = self._turns.get((user, session), {})
        return [rows[k] for k in sorted(rows) if k > after]

    def turn_count(self, user: str, session: str) -> int:
        return max(self._turns.get((user, session), {}), default=0)

    def keys(self, user: str, session: str) -> dict[str, int]:
        return {t.key: t.turn for t in self._turns.get((user, session), {}).values() if t.key}

    def pages(self, user: str, session: str, after: int = 0, with_vectors: bool = True) -> tuple[list[Page], list[np.ndarray]]:
        rows = self._pages.get((user, session), {})
        keys = [k for k in sorted(rows) if k > after]
        return [rows[k][0] for k in keys], [rows[k][1] for k in keys]

    def bookmarks(self, user: str, session: str) -> list[Bookmark]:
        return sorted(self._bookmarks.get((user, session), {}).values(), key=lambda b: (b.ts, b.uid))

    def state(self, user: str, session: str) -> dict | None:
        return self._states.get((user, session))

    def state_changes(self, user: str, session: str, after: int = 0) -> list[Change]:
        rows = self._changes.get((user, session), {})
        return [rows[k] for k in sorted(rows) if k > after]

    def facts(self, user: str, session: str, after: int = 0) -> list[Fact]:
        rows = self._facts.get((user, session), {})
        return [rows[k] for k in sorted(rows) if k > after]

    def summaries(self, user: str, session: str, after: int = 0) -> list[Summary]:
        rows = self._summaries.get((user, session), {})
        return [rows[k] for k in sorted(rows) if k > after]

    def tier_vectors(self, table: str, user: str, session: str, embedder: str) -> dict[int, np.ndarray]:
        return {n: v.astype(np.float32) for (t, u, s, n), (key, v) in self._tier_vectors.items()
                if (t, u, s) == (table, user, session) and key == embedder}

    def sessions(self) -> list[dict]:
        keys = set(self._turns) | set(self._pages) | set(self._changes)   # a session may hold only a working state
        return [
            {"user": u, "session": s, "turns": self.turn_count(u, s), "pages": len(self._pages.get((u, s), {})),
             "sealed_to": max((p.last_turn for p, _ in self._pages.get((u, s), {}).values()), default=0)}
            for u, s in sorted(keys)
        ]

    def refresh(self, names: Iterable[str] | None = None) -> None:
        pass

    def compact(self, keep_seconds: float) -> None:
        pass

    def stats(self) -> dict:
        return {"files": 0, "versions": self.writes, "bytes": 0}


def _turn_row(t: Turn) -> dict:
    return t.to_dict()


def _page_vectors(pieces: np.ndarray) -> dict:
    """A page's stored vectors: its pieces (float16) and their normalised mean (the page's vector).
    The mean stays a float32 array: Arrow takes it as the column's float32 values, as it took the
    list of the same values, at a third of the cost (tests/test_ingest_path.py)."""
    pieces = np.asarray(pieces, dtype=np.float32)
    mean = pieces.mean(axis=0)
    mean /= np.linalg.norm(mean) or 1.0
    return {"vector": mean, "pieces": pieces.astype(np.float16).tobytes()}


def _page_row(p: Page, pieces: np.ndarray) -> dict:
    return {
        "user": p.user, "session": p.session, "n": p.n, "text": p.text, "tokens": p.tokens,
        "first_turn": p.first_turn, "last_turn": p.last_turn,
        "spans": json.dumps([[*span, *line] for span, line in zip(p.spans, p.lines)]),
        "speakers": list(p.speakers), "date_first": p.date_first, "date_last": p.date_last,
        "ts_first": p.ts_first, "ts_last": p.ts_last, "refs": list(p.refs), "keywords": list(p.keywords),
        "importance": float(p.importance), "piece_tokens": list(p.piece_tokens) or None, **_page_vectors(pieces),
    }


def _page_from(row: dict) -> Page:
    spans = json.loads(row["spans"])
    return Page(
        session=row["session"], n=int(row["n"]), text=row["text"], tokens=int(row["tokens"]),
        spans=tuple(tuple(s[:3]) for s in spans), lines=tuple(tuple(s[3:5]) for s in spans),
        speakers=tuple(row["speakers"] or ()),
        date_first=row["date_first"], date_last=row["date_last"], ts_first=row["ts_first"],
        ts_last=row["ts_last"], refs=tuple(row["refs"] or ()), keywords=tuple(row["keywords"] or ()),
        importance=float(row["importance"]), user=row["user"], piece_tokens=tuple(row.get("piece_tokens") or ()),
    )


class PageColumns:
    """A session's stored pages as Arrow columns, in page order: the page table's sizes read as arrays, and
    each Page decoded from its row only when asked for (`pages`, or one row by its index). Immutable, as the
    pages are: read once at the open, it holds what the store held then (pages sealed later are the session's)."""

    def __init__(self, user: str, session: str, table) -> None:
        self.user, self.session, self.table = user, session, table
        self.n = table.column("n").to_numpy() if table is not None else np.zeros(0, dtype=np.int64)
        self._columns: dict | None = None   # each column as one Arrow array, for rows read one at a time

    def __len__(self) -> int:
        return len(self.n)

    def tokens(self) -> np.ndarray:
        return self.table.column("tokens").to_numpy() if len(self) else np.zeros(0, dtype=np.int64)

    def importance(self) -> np.ndarray:
        return self.table.column("importance").to_numpy() if len(self) else np.zeros(0)

    def holding(self, turns: Iterable[int]) -> list[int]:
        """The pages whose run of turns (first_turn..last_turn) takes in one of these turns, in order: those
        that may hold one (Pages.holding reads their spans)."""
        if not len(self):
            return []
        first, last = self.table.column("first_turn").to_numpy(), self.table.column("last_turn").to_numpy()
        found: set[int] = set()
        for t in turns:
            found.update(self.n[int(np.searchsorted(last, t, "left")):int(np.searchsorted(first, t, "right"))].tolist())
        return sorted(found)

    def of_page(self, n: int) -> list[str]:
        """Page n's automatic keywords (bookmarks.PageKeywords)."""
        return self.table.column("keywords")[n - 1].as_py() or []

    def postings(self) -> list[tuple[str, np.ndarray]]:
        """Each automatic keyword and the pages it is one of, in page order (bookmarks.PageKeywords)."""
        if not len(self):
            return []
        import pyarrow.compute as pc

        column = _one_chunk(self.table.column("keywords"))
        rows = pc.list_parent_indices(column).to_numpy()
        words = pc.list_flatten(column).dictionary_encode()
        codes = words.indices.to_numpy()
        if len(words.dictionary) < 2**16:   # a stable sort of 16-bit keys is a radix sort
            codes = codes.astype(np.uint16)
        order = np.argsort(codes, kind="stable")   # each keyword's rows stay in page order
        bounds = np.searchsorted(codes[order], np.arange(len(words.dictionary) + 1))
        pages = self.n[rows[order]]
        return [(word, pages[bounds[i]:bounds[i + 1]]) for i, word in enumerate(words.dictionary.to_pylist())]

    def __getitem__(self, i: int) -> Page:
        """The page of row i (from the end if negative), as Index.fits reads a list of pages."""
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.pages(i, i + 1)[0]

    def pages(self, start: int, stop: int) -> list[Page]:
        """Rows start..stop-1 as Pages, decoded together (one row by its values: half the cost)."""
        if stop - start == 1:
            if self._columns is None:   # a chunked column finds a row as fast as one chunk does: none copied
                self._columns = {name: self.table.column(name) for name in self.table.column_names}
            row = {name: column[start].as_py() for name, column in self._columns.items()}
            return [_page_from({**row, "user": self.user, "session": self.session})]
        rows = self.table.slice(start, stop - start).to_pylist()
        return [_page_from({**r, "user": self.user, "session": self.session}) for r in rows]

    def head(self, k: int) -> "PageColumns":
        """The first k rows."""
        return self if k >= len(self) else PageColumns(self.user, self.session, self.table.slice(0, k))


def _in_page_order(table):
    """Rows read from the pages table in one chunk and in page order, a page written twice kept once (its
    last row, as LanceStore.pages keeps it)."""
    table = table.combine_chunks()
    n = table.column("n").to_numpy()
    if len(n) > 1 and not (n[1:] > n[:-1]).all():   # rows not in page order, or a page twice
        order = np.argsort(n, kind="stable")
        ordered = n[order]
        last = np.append(ordered[1:] != ordered[:-1], True)
        table = table.take(order[last])
    return table


def _one_chunk(column):
    """A column as one Arrow array: its only chunk as it is, or its chunks copied into one."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


class LanceStore:
    """LanceDB tables `turns`, `pages`, `bookmarks`, `states`, `state_changes` and `meta` under one URI."""

    def __init__(self, uri: str, dim: int = 256, read_consistency_s: float | None = None, read_only: bool = False,
                 notify=None, storage_options: dict[str, str] | None = None, matryoshka: bool = False) -> None:
        lancedb = lance.lancedb()

        self.uri = uri
        self.dim = dim
        self.matryoshka = matryoshka  # the embedder's vectors are the leading dims of its bigger ones (m006)
        self.read_only = read_only
        self.notify = notify or (lambda message: None)
        self.pending_migrations: list[str] = []
        self._meta_checked = -1   # the meta table's version when check_not_newer last read it
        try:
            kwargs: dict = {"storage_options": storage_options} if storage_options else {}
            if read_consistency_s is not None:
                from datetime import timedelta

                kwargs["read_consistency_interval"] = timedelta(seconds=read_consistency_s)
            self.db: Any = lancedb.connect(uri, **kwargs)
        except Exception as exc:  # noqa: BLE001 - LanceDB raises plain OSError/ValueError/RuntimeError
            raise StoreError(f"cannot open the store at {uri}: {_open_failure(exc)}; {_settings_hint(uri)}") from exc
        self._tables: dict = {}
        self.closed = False
        _opened(self)
        try:
            self._open_or_create()
        except StoreError:
            raise
        except (OSError, RuntimeError, ValueError) as exc:
            # an unreachable endpoint, a missing bucket or refused credentials surface here, on first use
            raise StoreError(f"cannot open the store at {uri}: {_open_failure(exc)}; {_settings_hint(uri)}") from exc

    def _unavailable(self, exc: Exception) -> StoreError:
        return StoreError(f"the store at {self.uri} does not answer ({_open_failure(exc)}); nothing accepted is lost: "
                          "it stays in the journal and is written when the store answers again")

    def close(self) -> None:
        """Let go of LanceDB's handles (the open tables and the connection: LanceDB's sync API has no
        close, so dropping the last reference is what frees their native objects). Idempotent; the
        store is not used after. Also done for every store still open when the interpreter exits:
        dropped later, during finalization, LanceDB's native threads may still need the interpreter
        and abort the process ("PyGILState_Release: thread state must be current"), as seen after a
        write a full disk refused (tests/reliability/test_bad_input.py, about one run in 17)."""
        if self.closed:
            return
        self.closed = True
        self._tables.clear()
        self.db = None

    # -- schema ---------------------------------------------------------------------------------
    def _schemas(self) -> dict:
        import pyarrow as pa

        s, i, f = pa.string(), pa.int64(), pa.float64()
        return {
            "turns": pa.schema([("user", s), ("session", s), ("turn", i), ("speaker", s), ("text", s),
                                ("role", s), ("date", s), ("ts", f), ("ref", s), ("key", s)]),
            "pages": pa.schema([("user", s), ("session", s), ("n", i), ("text", s), ("tokens", i),
                                ("first_turn", i), ("last_turn", i), ("spans", s), ("speakers", pa.list_(s)),
                                ("date_first", s), ("date_last", s), ("ts_first", f), ("ts_last", f),
                                ("refs", pa.list_(s)), ("keywords", pa.list_(s)), ("importance", f),
                                ("vector", pa.list_(pa.float32(), self.dim)), ("pieces", pa.binary()),
                                ("piece_tokens", pa.list_(pa.int32()))]),
            "bookmarks": pa.schema([("user", s), ("session", s), ("uid", s), ("keywords", pa.list_(s)),
                                    ("pages", pa.list_(i)), ("note", s), ("source", s), ("ts", f)]),
            "states": pa.schema([("user", s), ("session", s), ("state", s), ("ts", f)]),
            "state_changes": pa.schema([("user", s), ("session", s), ("seq", i), ("key", s), ("value", s),
                                        ("unset", pa.bool_()), ("page", i), ("turn", i), ("ts", f), ("source", s)]),
            "facts": pa.schema([("user", s), ("session", s), ("n", i), ("subject", s), ("text", s),
                                ("turns", pa.list_(i)), ("pages", pa.list_(i)), ("ts", f), ("date", s), ("source", s),
                                ("ends", pa.bool_()), ("vector", pa.binary()), ("embedder", s)]),
            "summaries": pa.schema([("user", s), ("session", s), ("n", i), ("kind", s), ("key", s), ("version", i),
                                    ("text", s), ("pages", pa.list_(i)), ("turns", pa.list_(i)), ("ts", f),
                                    ("date", s), ("source", s), ("vector", pa.binary()), ("embedder", s)]),
            "meta": pa.schema([("key", s), ("value", s)]),
        }

    def _open_or_create(self) -> None:
        listed = set(self._table_names())
        existing = self._open_made(listed)
        fresh = not existing
        if fresh and not self.read_only:
            self._create_meta()
        meta = self._meta() if "meta" in self._tables else {}
        for name, schema in self._schemas().items():
            if name in self._tables:
                continue
            if self.read_only or (name in ADDED_BY_MIGRATION and f"migration:{ADDED_BY_MIGRATION[name]}" not in meta):
                continue  # nothing was ever written to it: reads answer empty (or its migration makes it)
            self._create(name, schema)
        if "leases" not in self._tables and not self.read_only and (fresh or "migration:m003_leases" in meta):
            self._create_leases()   # made at once by a process that found the store being made
        if "meta" in self._tables:
            self._check(meta)
            self._meta_checked = self._tables["meta"].version   # what check_not_newer need not read again
        if not self.read_only:   # a process creating this store at the same time may have made more since we listed
            self._open_made(set(self._table_names()) - listed)

    MAKING_WAIT_S = 10.0   # how long a table's folder may show before its first version (another process making it)

    def _open_made(self, names: set[str]) -> set[str]:
        """Open the tables of pager's among names that were made; return their names. A folder whose first
        version never comes within MAKING_WAIT_S was left by a process that died making the table (a
        SIGKILL during `pager migrate` or a new store's first command): it holds nothing, and it is made
        again where it would be made for a store that lacks it (LanceDB makes a table over such a folder;
        over one whose first version did come, the make fails and the table is opened)."""
        made = set()
        for name in sorted(names & {*self._schemas(), "leases"}):
            try:
                self._tables[name] = self._open(name, self.MAKING_WAIT_S)
            except (OSError, ValueError, RuntimeError) as exc:
                if unreachable(exc):
                    raise
                again = "a command that writes makes it again" if self.read_only else "it is made again"
                self.notify(f"the table {name!r} of the store at {self.uri} was left half-made by a process that "
                            f"died making it; {again}")
                continue
            made.add(name)
        return made

    def _create(self, name: str, schema) -> None:
        try:
            self._tables[name] = self.db.create_table(name, schema=schema)
        except (OSError, ValueError, RuntimeError):
            # another process created it first
            self._tables[name] = self._open(name)

    def _create_meta(self) -> None:
        """A new store's meta table is made first and born with its rows (the schema, the vector size and
        every migration as "new store") in one commit. A process opening the store while this one makes
        it (two processes started on a new home) then finds it versioned and makes the tables still
        missing itself, instead of taking a store of no version for one of release 0.1 and running
        every migration on it, each with a notice."""
        import pyarrow as pa

        values = {"schema": str(SCHEMA_VERSION), "dim": str(self.dim),
                  **{f"migration:{m.__name__}": "new store" for m in MIGRATIONS}}
        data = pa.Table.from_pylist([{"key": k, "value": v} for k, v in values.items()], schema=self._schemas()["meta"])
        try:
            self._tables["meta"] = self.db.create_table("meta", data=data)
        except (OSError, ValueError, RuntimeError):
            self._tables["meta"] = self._open("meta")  # another process created it first

    def _meta(self, latest: bool = False) -> dict[str, str]:
        if latest:
            self._tables["meta"].checkout_latest()
        return {r["key"]: r["value"] for r in self._tables["meta"].search().limit(None).to_list()}

    def _check(self, meta: dict[str, str]) -> None:
        """Refuse a store this pager cannot read (newer schema, other vector size); bring an older
        one forward by the named migrations it lacks. A store of release 0.1 has no meta rows."""
        version = int(meta.get("schema", 1))
        if too_new(meta):
            raise NewerStore(f"the store at {self.uri} has schema v{version}, newer than this pager "
                             f"(v{SCHEMA_VERSION}); upgrade pager (pip install -U pager)")
        missing = [m for m in MIGRATIONS if f"migration:{m.__name__}" not in meta]
        # the pages table's vectors are the truth; meta's "dim" may be a record a killed migrate left behind
        stored = self.stored_dim() if "pages" in self._tables else int(meta.get("dim") or self.dim)
        if stored != self.dim:
            cut = self.matryoshka and stored > self.dim and "m006_vector_dims" in {m.__name__ for m in missing}
            if not cut:
                raise StoreError(f"the store at {self.uri} holds {stored}-dim vectors, the embedder makes {self.dim}; "
                                 f"set PAGER_EMBEDDER to the embedder it was made with ({embedders_of(stored)}; "
                                 "in Python, Config(embedder=...), or Config.load(...), which reads PAGER_EMBEDDER), "
                                 "or use a new --home")
            if self.read_only:
                raise StoreError(f"the store at {self.uri} holds {stored}-dim vectors, the embedder makes {self.dim}; "
                                 "run `pager migrate` to cut them (or any command that writes)")
        if self.read_only:
            self.pending_migrations = [m.__name__ for m in missing]
            return
        schema = str(max(version, SCHEMA_VERSION))   # never down: a newer pager's store it declared usable stays its
        for step in missing:
            if step is not missing[0] and f"migration:{step.__name__}" in self._meta(latest=True):
                continue   # another process (host) applied it meanwhile, and recorded it: applied once
            step(self)
            done = {f"migration:{step.__name__}": time.strftime("%Y-%m-%d %H:%M:%S"), "dim": str(self.stored_dim())}
            if step is missing[-1]:
                done["schema"] = schema
            self._set_meta(done)   # one commit: a kill cannot leave a step recorded and the store's numbers not
            self.notify(f"the store at {self.uri} was migrated: {step.__name__} ({(step.__doc__ or '').strip()})")
        if not missing and (meta.get("schema") != schema or meta.get("dim") != str(self.stored_dim())):
            # what a migrate killed before that commit went in (an older pager's two commits) left behind
            self._set_meta({"schema": schema, "dim": str(self.stored_dim())})

    def check_not_newer(self, latest: bool = True) -> None:
        """Refuse to write a store that a newer pager migrated since this process opened it (a host upgraded
        while this one still runs the older release): the rows this pager writes may be ones the newer
        schema cannot read, or lack what it needs. Reads the meta table only when its version moved; with
        latest=False, at the version the caller's refresh() found (a flush's: no request of its own, so
        nothing of a lease's time goes to it)."""
        from lancedb.expr import col

        table = self._tables.get("meta")
        if table is None:
            return
        try:
            if latest:
                table.checkout_latest()
            if table.version == self._meta_checked:
                return   # meta unchanged since the last check
            rows = table.search().where(col("key").isin(["schema", "compatible_from"])).limit(None).to_list()
        except (OSError, RuntimeError, ValueError) as exc:
            if unreachable(exc):
                raise self._unavailable(exc) from exc
            raise StoreError(f"cannot read the schema of the store at {self.uri}: {_first_line(exc)}") from exc
        meta = {r["key"]: r["value"] for r in rows}
        version = too_new(meta)
        if version:
            raise NewerStore(f"the store at {self.uri} was migrated to schema v{version} by a newer pager while this "
                             f"process ran (it writes v{SCHEMA_VERSION}); nothing accepted is lost: it stays in this "
                             "home's journal; upgrade pager on this host (pip install -U pager) and restart this "
                             "process, which then stores it")
        self._meta_checked = table.version

    def stored_dim(self) -> int:
        """The size of the page vectors the store holds (its `pages` table's vector column)."""
        if "pages" not in self._tables:
            return self.dim
        return self._tables["pages"].schema.field("vector").type.list_size

    def _set_meta(self, values: dict[str, str]) -> None:
        import pyarrow as pa

        data = pa.Table.from_pylist([{"key": k, "value": v} for k, v in values.items()], schema=self._schemas()["meta"])
        table = self._tables["meta"]
        self._retry(lambda: table.merge_insert("key").when_matched_update_all().when_not_matched_insert_all()
                    .execute(data), table=table)

    def _open(self, name: str, wait_s: float = 10.0):
        """Open a table another process may be creating right now: its folder shows before its first
        version is committed, and until then opening it says "not found"."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.db.open_table(name)
            except (OSError, ValueError, RuntimeError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _table_names(self) -> list[str]:
        result = self.db.list_tables()
        return list(getattr(result, "tables", result))

    # -- writes ---------------------------------------------------------------------------------
    def put(self, batch: Batch, fence: Callable[[], None] | None = None) -> None:
        """Append what is new. Callers hold the sessions' locks (pager.home), so checking which keys
        exist and then appending cannot race another local writer; a plain append is one new fragment,
        where a merge would join against the whole table. fence() is called before each commit and
        raises to stop the write (a writer whose lease ran out: WritePath.fence)."""
        fence = fence or (lambda: None)
        if self.read_only:
            raise StoreError(f"the store at {self.uri} was opened read-only; nothing can be written")
        self.check_not_newer(latest=False)   # callers refresh() first (Home.flush, recovery)
        # the page table first: a reader that sees a session's turns also sees how its pages are cut
        if batch.states:
            import pyarrow as pa

            now = time.time()
            rows = [{"user": u, "session": s, "state": json.dumps(v), "ts": now} for (u, s), v in batch.states.items()]
            data = pa.Table.from_pylist(rows, schema=self._schemas()["states"])
            table = self._tables["states"]
            fence()
            self._retry(lambda: table.merge_insert(["user", "session"]).when_matched_update_all()
                        .when_not_matched_insert_all().execute(data), table=table)
        if batch.turns:
            self._append_new("turns", "turn", [_turn_row(t) for t in batch.turns], fence)
        if batch.pages:
            self._append_new("pages", "n", [_page_row(p, v) for p, v in zip(batch.pages, batch.vectors)], fence)
        if batch.bookmarks:
            self._append_new("bookmarks", "uid", [
                {"user": u, "session": s, "uid": b.uid, "keywords": list(b.keywords), "pages": list(b.pages),
                 "note": b.note, "source": b.source, "ts": b.ts} for u, s, b in batch.bookmarks], fence)
        if batch.changes:
            self._append_new("state_changes", "seq", [{"user": u, "session": s, **asdict(c)} for u, s, c in batch.changes],
                             fence)
        vectors = {(t, u, s, r.n): (key, v) for t, u, s, r, key, v in batch.vectored}
        if batch.facts:
            self._append_new("facts", "n", [_tier_row("facts", u, s, f, vectors) for u, s, f in batch.facts], fence)
        if batch.summaries:
            self._append_new("summaries", "n", [_tier_row("summaries", u, s, x, vectors)
                                                for u, s, x in batch.summaries], fence)
        written = {("facts", u, s, f.n) for u, s, f in batch.facts} | {("summaries", u, s, x.n) for u, s, x in batch.summaries}
        stored = [entry for entry in batch.vectored if (entry[0], entry[1], entry[2], entry[3].n) not in written]
        if stored:   # rows stored before, given their vectors now (stored before m009, or by another embedder)
            self._write_vectors(stored, fence)

    def _write_vectors(self, entries: list, fence: Callable[[], None]) -> None:
        """Stored facts' and summaries' vectors, written over their rows (each row whole: the same record,
        its vector and embedder added), one merge per table; a row not in the store is not made here."""
        import pyarrow as pa

        for table in ("facts", "summaries"):
            rows = list({(u, s, r.n): _tier_row(table, u, s, r, {(table, u, s, r.n): (key, v)})
                         for t, u, s, r, key, v in entries if t == table}.values())   # the latest of each row
            if not rows or table not in self._tables or "vector" not in self._tables[table].schema.names:
                continue
            data = pa.Table.from_pylist(rows, schema=self._schemas()[table])
            target = self._tables[table]
            fence()
            self._retry(lambda target=target, data=data: target.merge_insert(["user", "session", "n"])
                        .when_matched_update_all().execute(data), table=target)

    def _append_new(self, name: str, key: str, rows: list[dict], fence: Callable[[], None] = lambda: None) -> None:
        import pyarrow as pa
        from lancedb.expr import col, lit

        groups: dict[tuple[str, str], list] = {}
        for row in rows:
            groups.setdefault((row["user"], row["session"]), []).append(row[key])
        existing: set[tuple] = set()
        for (user, session), keys in groups.items():
            if isinstance(keys[0], str):
                extra = None
            else:
                extra = (col(key) >= lit(min(keys))) & (col(key) <= lit(max(keys)))
            existing |= {(user, session, r[key]) for r in self._rows(name, user, session, extra, columns=[key])}
        fresh = [r for r in rows if (r["user"], r["session"], r[key]) not in existing]
        unique = list({(r["user"], r["session"], r[key]): r for r in fresh}.values())
        if unique:
            data = pa.Table.from_pylist(unique, schema=self._schemas()[name])
            fence()   # after the reads: a stall in them counts
            self._retry(lambda: self._tables[name].add(data), table=self._tables[name])

    @staticmethod
    def _retry(write, attempts: int = 8, table=None) -> None:
        """Commit conflicts between processes are retried with backoff; other failures name the fix.
        A conflict no rebase settles (an update against a version another process overwrote: two
        processes creating a new store on an object store, the second create commits as an overwrite)
        is retried against the table's latest version."""
        for attempt in range(attempts):
            try:
                if attempt and table is not None:
                    table.checkout_latest()
                write()
                return
            except (OSError, RuntimeError) as exc:   # lance commit conflicts surface as RuntimeError
                text = str(exc)
                if unreachable(exc):   # LanceDB retried it already
                    raise StoreError(f"the store does not answer ({_open_failure(exc)}); nothing accepted is lost: "
                                     "it stays in the journal and is written when the store answers again") from exc
                if re.search(r"Append with different schema|fields did not match", text):   # not a conflict: no retry
                    missing = re.search(r"missing=\[[^\]]*\]", text)
                    raise StoreError(f"the store's table {getattr(table, 'name', '')!r} no longer has the columns this "
                                     f"pager writes ({missing.group(0) if missing else _first_line(exc)}): a newer pager "
                                     "migrated it; upgrade pager on this host (pip install -U pager) and restart this "
                                     "process; nothing accepted is lost: it stays in the journal") from exc
                if re.search(r"No space|Read-only|Permission", text):
                    raise StoreError(f"the store refused a write ({_first_line(exc)}); free disk space or fix "
                                     "permissions, nothing accepted is lost: it stays in the journal") from exc
                if attempt == attempts - 1:
                    raise StoreError(f"the store write failed after {attempts} tries: {_first_line(exc)}") from exc
            time.sleep(0.02 * 2**attempt)

    # -- reads ----------------------------------------------------------------------------------
    def _where(self, user: str, session: str):
        from lancedb.expr import col, lit

        return (col("user") == lit(user)) & (col("session") == lit(session))

    def _rows(self, name: str, user: str, session: str, extra=None, columns=None) -> list[dict]:
        if name not in self._tables:
            return []  # a read-only open of a store that never had this table
        return self._read(name, user, session, extra, columns, lambda query: query.to_list())

    def _read(self, name: str, user: str, session: str, extra, columns, fetch):
        """One filtered read of a table, as fetch(query) returns it (rows or an Arrow table)."""
        where = self._where(user, session)
        if extra is not None:
            where = where & extra
        for attempt in range(3):
            query = self._tables[name].search().where(where)
            if columns:
                query = query.select(columns)
            try:
                return fetch(query.limit(None))
            except (OSError, RuntimeError, ValueError) as exc:
                if unreachable(exc):
                    raise self._unavailable(exc) from exc
                # another process compacted away the version this handle was reading: move to the latest
                if attempt == 2:
                    raise
                self.refresh()
        raise AssertionError("unreachable")

    def turns(self, user: str, session: str, after: int = 0) -> list[Turn]:
        from lancedb.expr import col, lit

        rows = self._rows("turns", user, session, col("turn") > lit(after))
        return sorted((Turn.from_record(r) for r in rows), key=lambda t: t.turn)

    def turn_count(self, user: str, session: str) -> int:
        rows = self._rows("turns", user, session, columns=["turn"])
        return max((r["turn"] for r in rows), default=0)

    def keys(self, user: str, session: str) -> dict[str, int]:
        from lancedb.expr import col, lit

        rows = self._rows("turns", user, session, col("key") != lit(""), columns=["key", "turn"])
        return {r["key"]: r["turn"] for r in rows}

    PAGE_COLUMNS = ["user", "session", "n", "text", "tokens", "spans", "speakers", "date_first", "date_last",
                    "ts_first", "ts_last", "refs", "keywords", "importance"]

    def pages(self, user: str, session: str, after: int = 0, with_vectors: bool = True) -> tuple[list[Page], list[np.ndarray]]:
        from lancedb.expr import col, lit

        columns = self.PAGE_COLUMNS + (["pieces"] if with_vectors else [])
        if "pages" in self._tables and "piece_tokens" in self._tables["pages"].schema.names:   # none before m008: counted when shown
            columns.append("piece_tokens")
        # a page written twice (two machines sealing it at once) is the same page: keep one
        rows = sorted({r["n"]: r for r in self._rows("pages", user, session, col("n") > lit(after), columns)}.values(),
                      key=lambda r: r["n"])
        vectors = ([np.frombuffer(r["pieces"], dtype=np.float16).astype(np.float32).reshape(-1, self.dim) for r in rows]
                   if with_vectors else [])
        return [_page_from(r) for r in rows], vectors

    def page_columns(self, user: str, session: str, known=None) -> "PageColumns":
        """The session's pages as Arrow columns, none decoded (the open of a large session: a Page is made
        when first touched, Session.pages); without their vectors, in page order, a page written twice kept once.

        `known` is the columns of p1..pk as this store gave them before (the index cache keeps them): then
        only pages pk on are read, pk compared with the store's whole. Pages are only ever added, so the
        store's p1..pk are those; known is not used when its columns or its last page differ."""
        from lancedb.expr import col, lit

        columns = [c for c in self.PAGE_COLUMNS if c not in ("user", "session")] + ["first_turn", "last_turn"]
        if "pages" not in self._tables:
            return PageColumns(user, session, None)
        if "piece_tokens" in self._tables["pages"].schema.names:
            columns.append("piece_tokens")
        k = known.num_rows if known is not None and known.column_names == columns else 0
        if k and known.column("n")[k - 1].as_py() == k:
            tail = _in_page_order(self._read("pages", user, session, col("n") >= lit(k), columns,
                                             lambda query: query.to_arrow()))
            if tail.num_rows and tail.schema.equals(known.schema) and tail.slice(0, 1).equals(known.slice(k - 1, 1)):
                import pyarrow as pa

                return PageColumns(user, session, pa.concat_tables([known.slice(0, k - 1), tail]))
        table = self._read("pages", user, session, None, columns, lambda query: query.to_arrow())
        return PageColumns(user, session, _in_page_order(table))

    def bookmarks(self, user: str, session: str) -> list[Bookmark]:
        rows = self._rows("bookmarks", user, session)
        return sorted((Bookmark(tuple(r["keywords"]), tuple(r["pages"]), r["note"], r["source"], r["uid"], r["ts"])
                       for r in rows), key=lambda b: (b.ts, b.uid))

    def state(self, user: str, session: str) -> dict | None:
        rows = self._rows("states", user, session)
        return json.loads(max(rows, key=lambda r: r["ts"])["state"]) if rows else None

    def state_changes(self, user: str, session: str, after: int = 0) -> list[Change]:
        from lancedb.expr import col, lit

        rows = self._rows("state_changes", user, session, col("seq") > lit(after))
        return sorted({r["seq"]: Change.from_record(r) for r in rows}.values(), key=lambda c: c.seq)

    def facts(self, user: str, session: str, after: int = 0) -> list[Fact]:
        from lancedb.expr import col, lit

        rows = self._rows("facts", user, session, col("n") > lit(after))
        return sorted({r["n"]: fact_from(r) for r in rows}.values(), key=lambda f: f.n)

    def summaries(self, user: str, session: str, after: int = 0) -> list[Summary]:
        from lancedb.expr import col, lit

        rows = self._rows("summaries", user, session, col("n") > lit(after))
        return sorted({r["n"]: summary_from(r) for r in rows}.values(), key=lambda x: x.n)

    def tier_vectors(self, table: str, user: str, session: str, embedder: str) -> dict[int, np.ndarray]:
        """The vectors stored with a session's facts or summaries (table) by this embedder (embedder_key),
        by record number; rows of none (stored before m009) or of another embedder's are left out."""
        from lancedb.expr import col, lit

        if table not in self._tables or "vector" not in self._tables[table].schema.names:
            return {}
        rows = self._rows(table, user, session, col("embedder") == lit(embedder), columns=["n", "vector"])
        return {int(r["n"]): np.frombuffer(r["vector"], dtype=np.float16).astype(np.float32) for r in rows if r["vector"]}

    def sessions(self) -> list[dict]:
        if "turns" not in self._tables or "pages" not in self._tables:
            return []
        # grouped by Arrow: one row per session reaches Python, not one per turn and page
        turns = (self._tables["turns"].search().select(["user", "session", "turn"]).limit(None).to_arrow()
                 .group_by(["user", "session"]).aggregate([("turn", "max")]).to_pylist())
        pages = (self._tables["pages"].search().select(["user", "session", "n", "last_turn"]).limit(None).to_arrow()
                 .group_by(["user", "session"]).aggregate([("n", "count"), ("last_turn", "max")]).to_pylist())
        out: dict[tuple[str, str], dict] = {}
        for r in turns:
            out[(r["user"], r["session"])] = {"user": r["user"], "session": r["session"], "turns": r["turn_max"],
                                              "pages": 0, "sealed_to": 0}
        for r in pages:
            d = out.setdefault((r["user"], r["session"]), {"user": r["user"], "session": r["session"], "turns": 0})
            d["pages"], d["sealed_to"] = r["n_count"], r["last_turn_max"]
        if "state_changes" in self._tables:   # a session may hold only a working state, set before any turn
            for r in (self._tables["state_changes"].search().select(["user", "session"]).limit(None).to_arrow()
                      .group_by(["user", "session"]).aggregate([]).to_pylist()):
                out.setdefault((r["user"], r["session"]), {"user": r["user"], "session": r["session"], "turns": 0,
                                                           "pages": 0, "sealed_to": 0})
        return [out[k] for k in sorted(out)]

    # -- upkeep ---------------------------------------------------------------------------------
    def refresh(self, names: Iterable[str] | None = None) -> None:
        """See other processes' writes (in the tables named, or all)."""
        try:
            for name, table in self._tables.items():
                if names is None or name in names:
                    table.checkout_latest()
        except (OSError, RuntimeError, ValueError) as exc:
            raise self._unavailable(exc) from exc

    def compact(self, keep_seconds: float) -> None:
        """Merge small fragments, drop versions older than keep_seconds, keep the session indexes current."""
        from datetime import timedelta

        self._ensure_indexes()
        for table in self._tables.values():
            try:
                with warnings.catch_warnings():  # a zero age is a deliberate setting (tests, single-process)
                    warnings.simplefilter("ignore", UserWarning)
                    table.optimize(cleanup_older_than=timedelta(seconds=keep_seconds))
            except (OSError, RuntimeError, ValueError):
                pass  # a concurrent writer won the race; the next compaction tries again

    INDEX_MIN_ROWS = 20_000  # below this a filtered scan of the session column is as fast as the index

    def _ensure_indexes(self) -> None:
        """A BTREE index on `session` for the big tables, so opening one session reads only its rows."""
        from lancedb.index import BTree

        for name in ("pages", "turns"):
            table = self._tables[name]
            try:
                if table.count_rows() < self.INDEX_MIN_ROWS:
                    continue
                if not any(list(getattr(i, "columns", [])) == ["session"] for i in table.list_indices()):
                    table.create_index("session", config=BTree())
            except (OSError, RuntimeError, ValueError):
                pass  # another process is indexing; optimize() keeps an existing index current

    def stats(self) -> dict:
        """Files and bytes on a local disk (every file, manifests included); on an object store, the
        data fragments and bytes LanceDB reports."""
        files = versions = size = 0
        for table in self._tables.values():
            versions += len(table.list_versions())
            if not is_local(self.uri):
                stats = table.stats()
                files += stats["fragment_stats"]["num_fragments"]
                size += stats["total_bytes"]
        if is_local(self.uri):
            from pathlib import Path

            for path in Path(self.uri.removeprefix("file://")).rglob("*"):
                if path.is_file():
                    files += 1
                    size += path.stat().st_size
        return {"files": files, "versions": versions, "bytes": size}

    # -- leases: one writer per session across hosts (pager.lease decides; this is the storage) ----------
    def _create_leases(self) -> None:
        """The leases table is born with all its rows, in one commit: a lease is then always an update
        of an existing row, which LanceDB's commit conflict check makes a compare-and-swap."""
        import pyarrow as pa

        schema = pa.schema([("slot", pa.int64()), ("rev", pa.int64()), ("body", pa.string())])
        rows = pa.Table.from_pylist([{"slot": n, "rev": 0, "body": "{}"} for n in range(LEASE_SLOTS)], schema=schema)
        try:
            self._tables["leases"] = self.db.create_table("leases", data=rows)
        except (OSError, ValueError, RuntimeError):
            self._tables["leases"] = self._open("leases")  # another process created it first

    @staticmethod
    def _lease_slot(user: str, session: str) -> int:
        import hashlib

        return int.from_bytes(hashlib.sha256(f"{user}\x00{session}".encode()).digest()[:4], "big") % LEASE_SLOTS

    def _lease_row(self, slot: int) -> tuple[int, dict]:
        from lancedb.expr import col, lit

        table = self._tables["leases"]
        try:
            table.checkout_latest()
            rows = table.search().where(col("slot") == lit(slot)).limit(1).to_list()
        except (OSError, RuntimeError, ValueError) as exc:
            raise self._unavailable(exc) from exc
        return (rows[0]["rev"], json.loads(rows[0]["body"])) if rows else (0, {})

    def _leases_table(self) -> bool:
        """Is the leases table open? A store another process was creating when this one opened it gets
        the table last: a writer opens it once it is there (waiting for its first commit), so a lease
        is never taken for absent."""
        if "leases" not in self._tables and not self.read_only and "leases" in self._table_names():
            self._tables["leases"] = self._open("leases")
        return "leases" in self._tables

    def lease(self, user: str, session: str) -> dict | None:
        """The session's lease entry ({holder, home, expires, seen}) as the store holds it, or None."""
        if not self._leases_table():
            return None
        return self._lease_row(self._lease_slot(user, session))[1].get(f"{user}\x00{session}")

    def swap_lease(self, user: str, session: str, change) -> dict | None:
        """Apply change(entry or None) → (new entry or None, result) to the session's lease as one
        compare-and-swap on its slot's revision, retried until no other writer got in between.
        Returns the result of the change that was committed."""
        return self.swap_leases([(user, session)], change)[(user, session)]

    def swap_leases(self, keys: list[tuple[str, str]], change) -> dict:
        """swap_lease for several sessions of one slot in one compare-and-swap (a home renewing all
        the leases it holds pays one commit per slot, not one per session)."""
        import pyarrow as pa

        if not self._leases_table():
            raise StoreError(f"the store at {self.uri} has no leases table; run `pager migrate`")
        slots = {self._lease_slot(u, s) for u, s in keys}
        assert len(slots) == 1, "one slot per swap"
        slot = slots.pop()
        table = self._tables["leases"]
        schema = table.schema
        last: Exception | None = None
        for _ in range(50):
            rev, body = self._lease_row(slot)
            changed, results = dict(body), {}
            for user, session in keys:
                key = f"{user}\x00{session}"
                entry, results[(user, session)] = change(body.get(key))
                if entry is None:
                    changed.pop(key, None)
                else:
                    changed[key] = entry
            if changed == body:
                return results  # nothing to write
            data = pa.Table.from_pylist([{"slot": slot, "rev": rev + 1, "body": json.dumps(changed, sort_keys=True)}],
                                        schema=schema)
            try:
                # rev is an int of ours, not user text: the one filter here that is a string
                done = table.merge_insert("slot").when_matched_update_all(where=f"target.rev = {int(rev)}").execute(data)
            except (OSError, RuntimeError) as exc:  # a conflict LanceDB's own retries did not settle
                if unreachable(exc):
                    raise self._unavailable(exc) from exc
                if re.search(r"No space|Read-only|Permission", str(exc)):   # no retry mends it: say the fix
                    raise StoreError(f"could not update the lease of session {', '.join(repr(s) for _, s in keys)} "
                                     f"({_first_line(exc)}); free disk space or fix permissions, and try again") from exc
                last = exc
                time.sleep(0.01)
                continue
            if done.num_updated_rows == 1:
                return results
        names = ", ".join(repr(s) for _, s in keys)
        raise StoreError(f"could not update the lease of session {names} ({last or 'too many writers at once'}); "
                         "try again")


def too_new(meta: dict[str, str]) -> int:
    """The store's schema when it is newer than this pager can use, else 0. A newer release whose migrations
    leave the store usable by older pagers (a column they may leave empty, as m008 was for v7) records in
    meta `compatible_from`, the oldest schema whose pagers may still read and write it; without that, a
    newer schema is refused, to open and to write (a host still on the older release during an upgrade)."""
    version = int(meta.get("schema") or 1)
    oldest = meta.get("compatible_from")
    oldest_ok = int(oldest) if oldest and str(oldest).isdigit() else version
    return version if version > SCHEMA_VERSION and oldest_ok > SCHEMA_VERSION else 0


def embedders_of(dim: int) -> str:
    """The PAGER_EMBEDDER settings that make vectors of this size: what a store of that size was made with."""
    named = {128: "PAGER_EMBEDDER=wordllama, the default", 256: "PAGER_EMBEDDER=hash or wordllama:256",
             64: "PAGER_EMBEDDER=wordllama:64", 384: "PAGER_EMBEDDER=minilm"}
    return named.get(dim, f"a litellm embedding model of {dim} dimensions")


def table_names(uri: str, storage_options: dict[str, str] | None = None) -> list[str]:
    """The tables at a store URI, listed without opening one (so without checking its schema or vector
    size against an embedder): whether a store is there at all, for `pager migrate`."""
    lancedb = lance.lancedb()

    kwargs: dict = {"storage_options": storage_options} if storage_options else {}
    try:
        result = lancedb.connect(uri, **kwargs).list_tables()
        return list(getattr(result, "tables", result))
    except Exception as exc:  # noqa: BLE001 - LanceDB raises plain OSError/ValueError/RuntimeError
        raise StoreError(f"cannot open the store at {uri}: {_open_failure(exc)}; {_settings_hint(uri)}") from exc


def _settings_hint(uri: str) -> str:
    if uri.startswith("gs://"):   # LanceDB reads Google's and Azure's settings from the environment itself
        return "check --db / PAGER_DB, and GOOGLE_SERVICE_ACCOUNT or GOOGLE_APPLICATION_CREDENTIALS for gs://"
    if uri.startswith(("az://", "abfs://")):
        return "check --db / PAGER_DB, and AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY for az://"
    hint = "check --db / PAGER_DB (and PAGER_S3_ENDPOINT, PAGER_S3_REGION, AWS_* for s3://)"
    if uri.startswith("s3+ddb://"):
        hint += (", and for s3+ddb:// PAGER_DYNAMODB_ENDPOINT and the DynamoDB table named by ddbTableName, made with "
                 "hash key base_uri (string) and range key version (number)")
    return hint


def _open_failure(exc: Exception) -> str:
    """What went wrong opening a store, in words, for the failures object storage has (LanceDB's own text
    is a nested Rust debug dump that buries them)."""
    import re

    text = str(exc)
    bucket = re.search(r"<BucketName>([^<]+)</BucketName>", text)
    if "NoSuchBucket" in text:
        return f"the bucket {bucket.group(1) if bucket else ''!r} does not exist (create it or name another)"
    if unreachable(exc):
        where = re.search(r"uri: Some\((\w+://[^/)]+)", text) or re.search(r"(https?://[^/\s?]+)", text)
        return f"the endpoint {where.group(1) if where else ''} cannot be reached".replace("  ", " ")
    if "Failed to resolve region" in text:   # no region set, and AWS could not be asked for the bucket's
        return ("no region is set and the bucket's could not be looked up (set PAGER_S3_REGION or AWS_REGION, and "
                "PAGER_S3_ENDPOINT for a server that is not AWS)")
    if re.search(r"AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|status: 403", text):
        return "the credentials were refused (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
    return _first_line(exc)


_UNREACHABLE = re.compile(r"ConnectionRefused|Connection refused|Connection reset|tcp connect error|dns error|"
                          r"kind: Connect\b|timed out|error sending request|connection closed|Broken pipe")


def unreachable(exc: Exception) -> bool:
    """Whether LanceDB's error says the store did not answer (down, refused, reset, timed out), after
    its own retries, rather than that it refused what was asked (a commit conflict, a missing table)."""
    return bool(_UNREACHABLE.search(str(exc)))


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__


# Named, ordered steps (after simonw/llm): each applied name is recorded in the `meta` table and
# only the missing ones run when a store is opened (or by `pager migrate`). Each step checks what
# exists before it changes anything, so two processes migrating at once do no harm.
MIGRATIONS: list = []
migration = MIGRATIONS.append


@migration
def m002_turn_keys(store: LanceStore) -> None:
    """turns gain an idempotency key column"""
    table = store._tables["turns"]
    if "key" not in table.schema.names:
        try:
            table.add_columns({"key": "CAST('' AS STRING)"})
        except (OSError, RuntimeError, ValueError):
            table.checkout_latest()
            if "key" not in table.schema.names:  # not another process's migration: a real failure
                raise


@migration
def m003_leases(store: LanceStore) -> None:
    """a leases table: one writer per session across hosts sharing the store"""
    if "leases" not in store._tables:
        store._create_leases()


# tables a store made by an older release gains by a named step (leases too: m003_leases)
ADDED_BY_MIGRATION = {"state_changes": "m004_memory_tiers", "facts": "m004_memory_tiers", "summaries": "m005_summaries"}


@migration
def m004_memory_tiers(store: LanceStore) -> None:
    """tables for the working state's changes and for facts"""
    for name in ("state_changes", "facts"):
        if name not in store._tables:
            store._create(name, store._schemas()[name])


@migration
def m005_summaries(store: LanceStore) -> None:
    """a table for episode and rolling summaries"""
    if "summaries" not in store._tables:
        store._create("summaries", store._schemas()["summaries"])


@migration
def m006_vector_dims(store: LanceStore) -> None:
    """page vectors at the embedder's size (a store of 256-dim wordllama vectors is cut to 128, no re-embedding)"""
    import pyarrow as pa

    table = store._tables["pages"]
    table.checkout_latest()
    stored = store.stored_dim()
    if stored == store.dim:
        return  # a store made at this size, or another process cut it first
    if not store.matryoshka or stored < store.dim:
        raise StoreError(f"the store at {store.uri} holds {stored}-dim vectors, the embedder makes {store.dim}; "
                         f"set PAGER_EMBEDDER to the embedder it was made with ({embedders_of(stored)}), "
                         "or use a new --home")
    schema = store._schemas()["pages"]
    read = table.version
    batches = [_cut_rows(batch.to_pylist(), stored, store.dim, schema) for batch in table.search().limit(None).to_batches(4096)]
    data = pa.concat_tables(batches) if batches else schema.empty_table()
    # one overwrite: a reader sees the old version or the new one, never a mix
    store._tables["pages"] = made = store.db.create_table("pages", data=data, schema=schema, mode="overwrite")
    _pages_written_meanwhile(store, made, read, {(r["user"], r["session"], r["n"]) for r in data.select(
        ["user", "session", "n"]).to_pylist()})


def _cut_rows(rows: list[dict], stored: int, dim: int, schema):
    """Page rows of `stored`-dim vectors at `dim` dims, as one Arrow table of the pages schema."""
    import pyarrow as pa

    for row in rows:
        if stored != dim:
            pieces = np.frombuffer(row["pieces"], dtype=np.float16).astype(np.float32).reshape(-1, stored)
            row.update(_page_vectors(_cut(pieces, dim)))
    return pa.Table.from_pylist(rows, schema=schema)


def _pages_written_meanwhile(store: LanceStore, made, read: int, kept: set) -> None:
    """An overwrite does not conflict with the commits it follows: pages another process stored between
    m006's read and its overwrite (a process that migrated the store first and went on writing, both
    started at once) would be gone. They are read from the version before the overwrite and added."""
    before = made.version - 1
    if before <= read:
        return
    old = store.db.open_table("pages")
    old.checkout(before)
    then = old.schema.field("vector").type.list_size
    rows = [r for r in old.search().limit(None).to_list() if (r["user"], r["session"], r["n"]) not in kept]
    if rows:
        made.add(_cut_rows(rows, then, store.dim, made.schema))


def _cut(vectors: np.ndarray, dim: int) -> np.ndarray:
    """Matryoshka truncation: the leading dims, renormalised (what the embedder makes at that size)."""
    head = np.ascontiguousarray(vectors[:, :dim], dtype=np.float32)
    return head / np.maximum(np.linalg.norm(head, axis=1, keepdims=True), 1e-12)


@migration
def m007_fact_ends(store: LanceStore) -> None:
    """facts gain `ends`: a record that ends the fact before it on its subject, with no new value"""
    table = store._tables["facts"]
    if "ends" not in table.schema.names:
        try:
            table.add_columns({"ends": "CAST(false AS BOOLEAN)"})
        except (OSError, RuntimeError, ValueError):
            table.checkout_latest()
            if "ends" not in table.schema.names:  # not another process's migration: a real failure
                raise


@migration
def m008_piece_tokens(store: LanceStore) -> None:
    """pages gain `piece_tokens`, each piece's count made when the page was packed (empty for older pages: counted when shown)"""
    import pyarrow as pa

    table = store._tables["pages"]
    if "piece_tokens" not in table.schema.names:
        try:
            table.add_columns(pa.field("piece_tokens", pa.list_(pa.int32())))
        except (OSError, RuntimeError, ValueError):
            table.checkout_latest()
            if "piece_tokens" not in table.schema.names:  # not another process's migration: a real failure
                raise


@migration
def m009_tier_vectors(store: LanceStore) -> None:
    """facts and summaries gain `vector` and `embedder` (empty for older rows: embedded at the next writing open, and written back)"""
    import pyarrow as pa

    for name in ("facts", "summaries"):
        table = store._tables.get(name)
        if table is None:
            continue
        for column, kind in (("vector", pa.binary()), ("embedder", pa.string())):
            if column in table.schema.names:
                continue
            try:
                table.add_columns(pa.field(column, kind))
            except (OSError, RuntimeError, ValueError):
                table.checkout_latest()
                if column not in table.schema.names:  # not another process's migration: a real failure
                    raise


def _tier_row(table: str, user: str, session: str, record, vectors: dict) -> dict:
    """A fact's or summary's row, with its vector (float16 bytes) and the embedder that made it when known."""
    key, vector = vectors.get((table, user, session, record.n), ("", None))
    body = fact_record(record) if table == "facts" else summary_record(record)
    return {"user": user, "session": session, **body,
            "vector": np.asarray(vector, dtype=np.float16).tobytes() if vector is not None else None, "embedder": key}


def fact_from(r: dict) -> Fact:
    return Fact(int(r["n"]), r["subject"], r["text"], tuple(r["turns"] or ()), tuple(r["pages"] or ()), float(r["ts"]),
                r["date"], r["source"], bool(r.get("ends") or False))


_OPEN_STORES: weakref.WeakSet = weakref.WeakSet()


def _opened(store: LanceStore) -> None:
    if not _OPEN_STORES:
        atexit.unregister(_close_open_stores)
        atexit.register(_close_open_stores)
    _OPEN_STORES.add(store)


def _close_open_stores() -> None:
    """At exit, while the interpreter is whole: close what is still open (LanceStore.close says why)."""
    for store in list(_OPEN_STORES):
        store.close()
