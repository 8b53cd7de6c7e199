"""What a home keeps on local disk between processes to answer sooner: a session's search index, a
session snapshot for read-only opens, and the listing of sessions. All are optimisations, safe to
delete: each is trusted only while the session's lock counts (or the store's versions) say nothing
was written since, and the next open rebuilds what is missing or stale.
"""

from __future__ import annotations

import gc
import hashlib
import json
import mmap
import os
import pickle
import struct
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .locks import lock_counts, read_counts_path
from .page import Page, Packer
from .errors import StoreError
from .store import SCHEMA_VERSION, LanceStore, PageColumns, Store, is_local
from .tokens import get_tokenizer

if TYPE_CHECKING:
    from .home import Home
    from .search import Index

CACHED_FROM = 1   # pages a session needs before its index is cached at close (was 200: a small session then
# paid LanceDB's import, ~2.5 s, on every `pager search` to save a cache of a few KB); a snapshot is kept
# from the first turn (a session of one open page too), so every read-only command of it skips LanceDB
WHOLE_TURNS = 2_000   # a session of at most this many turns keeps every turn in its snapshot: `pager check`
# and `pager export` then read no LanceDB; a longer one keeps the open tail's turns only (its check and
# export read the store, whose import is then a small part of reading the turns)


class Caches:
    def __init__(self, home: "Home") -> None:
        self.home = home

    def store_key(self) -> str:
        """The store, one spelling per store (a local folder by its real path): `--home h` and `--home
        /abs/h` find the same caches."""
        uri = self.home.config.db_uri
        return os.path.realpath(os.path.expanduser(uri.removeprefix("file://"))) if is_local(uri) else uri

    def index_path(self, s) -> Path:
        h = self.home
        key = f"{self.store_key()}\x00{s.user}\x00{s.name}\x00{h.config.embedder}"
        return h.path / "cache" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.index"

    def cached_index(self, s) -> "tuple[Index, object] | None":
        """The session's index as a previous process left it, with its pages' columns as the store held
        them then (store.PageColumns, read again only from the last of them on), or None. Only this user's
        own files are read (the cache is a pickle, trusted like the journal); a stale or damaged one is
        ignored, and columns written before the store's last migration are not used."""
        path = self.index_path(s)
        try:
            written = path.stat().st_mtime_ns   # before the read: a file replaced meanwhile is newer, not older
            with gc_paused():
                cached = read_mapped(path)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError,
                KeyError, IndexError, struct.error):
            return None   # damaged, or written by a pager that pickled the index otherwise
        from .search import INDEX_FORMAT, Index

        if isinstance(cached, tuple) and len(cached) == 3:   # (the store's schema version, index, columns)
            version, index, columns = cached
            if version != SCHEMA_VERSION or (columns is not None and self.meta_changed(written)):
                columns = None   # the store was migrated since: its pages are read again
        else:
            index, columns = cached, None   # an index cached alone
        # an index of another format (its parts pickled otherwise), or of another vector size (made before the
        # store's vectors were cut, m006), is rebuilt
        ok = isinstance(index, Index) and getattr(index, "format", None) == INDEX_FORMAT and index.dim == s.index.dim
        return (index, columns) if ok else None

    def save_index(self, s) -> None:
        """Write the session's index if it grew since it was loaded, with its pages' columns as the store
        holds them (atomically: temp file, rename)."""
        if (len(s.index) == s.index_saved and not s.index.vocabulary.grew) or len(s.index) < CACHED_FROM:
            return
        path = self.index_path(s)
        try:
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            s.index.vectors()  # stack pending rows so the cache holds one array
            s.index.vocabulary.grew = False
            write_mapped(tmp, (SCHEMA_VERSION, s.index, self.stored_columns(s)))
            os.replace(tmp, path)
            s.index_saved = len(s.index)
        except OSError:
            pass  # a cache is an optimisation; the next open rebuilds

    def stored_columns(self, s):
        """The Arrow columns of the pages the session's index holds, as the store holds them (those it read
        at the open and the store's since), or None: not a LanceDB store, or the store unreadable now."""
        h = self.home
        if s.source is not None or not isinstance(h.store, LanceStore):
            return None
        opened = s.pages.stored
        try:
            columns = h.store.page_columns(s.user, s.name, opened.table if isinstance(opened, PageColumns) else None)
        except StoreError:
            return None
        columns = columns.head(min(len(columns), len(s.index)))
        return columns.table.combine_chunks() if columns.table is not None and len(columns) else None

    def snapshot_path(self, user: str, session: str) -> Path:
        h = self.home
        key = f"{self.store_key()}\x00{user}\x00{session}\x00{h.config.embedder}"
        return h.path / "cache" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.session"

    def save_snapshot(self, s) -> None:
        """Write the session as the store now holds it (called after the closing flush), tagged with
        the session lock's counts: a later read-only open trusts it only while they are unchanged."""
        h = self.home
        if isinstance(s.source, Snapshot):
            return  # opened from one and only looked
        last, generation = h.locks.counts(s)
        if last != s.turn_count or len(s.index) != len(s.pages) or not s.begun:
            return  # turns of other processes not taken in, or nothing to keep
        pages = list(s.pages.values())   # in page order; the stored ones not yet made decoded in batches
        after = pages[-1].spans[-1][0] - 1 if pages else 0
        whole = h.store.turns(s.user, s.name) if s.turn_count <= WHOLE_TURNS else None
        tail = [t for t in whole if t.turn > after] if whole is not None else h.store.turns(s.user, s.name, after=after)
        if (tail[-1].turn if tail else after + 1) != s.turn_count and (tail or s.turn_count):
            return  # the store lacks turns a live process still holds in its journal
        snapshot = Snapshot(generation, last, after, h.store.state(s.user, s.name), pages,
                            h.store.bookmarks(s.user, s.name), tail, h.store.state_changes(s.user, s.name),
                            h.store.facts(s.user, s.name), h.store.summaries(s.user, s.name),
                            saved_turns=whole, dim=s.index.dim,
                            vectors={t: v.astype("float16") for t, v in s.tiers.vectors.items()},
                            counts=tail_counts(s, pages[-1] if pages else None, tail))
        path = self.snapshot_path(s.user, s.name)
        try:
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            with open(tmp, "wb") as fh:
                pickle.dump(snapshot, fh, protocol=5)
            os.replace(tmp, path)
        except OSError:
            pass  # an optimisation; the next open reads the store

    def snapshot(self, user: str, session: str) -> "Snapshot | None":
        h = self.home
        if h.recovered:
            return None  # a dead process's records just reached the store: the snapshot may lack them
        path = self.snapshot_path(user, session)
        try:
            if self.meta_changed(path.stat().st_mtime_ns):
                return None   # migrated since, maybe by a newer pager: the store decides what it holds
            with open(path, "rb") as fh, gc_paused():
                snapshot = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError):
            return None
        if not isinstance(snapshot, Snapshot) or snapshot.format != Snapshot.FORMAT:
            return None
        counts = read_counts_path(h.locks.path(user, session))
        if counts is None or counts[:2] != (snapshot.last_turn, snapshot.generation):
            return None  # something was appended since (or the lock is gone): read the store
        snapshot.fallback = lambda: h.store
        for encoding, counts in snapshot.counts.items():
            if isinstance(counts, dict):   # learned only: the encoding itself loads when a count is unknown
                get_tokenizer(encoding).learn(counts)
        return snapshot

    def meta_changed(self, written_ns: int) -> bool:
        """Whether the store's meta table (its schema version and migrations) changed after a cache was
        written; told from its version files' folder for a local store, without LanceDB."""
        uri = self.home.config.db_uri
        if not is_local(uri):
            return False
        try:
            return (Path(uri.removeprefix("file://")) / "meta.lance" / "_versions").stat().st_mtime_ns > written_ns
        except OSError:
            return False   # no meta table there: nothing migrated it

    def session_rows(self, journals: bool = True, cached: bool = True) -> list[dict]:
        """Every session of the store, per user: its last turn and its pages, counted as `pager inspect`
        counts them (the sealed ones and the open tail page when it holds anything). From the listing
        cache when it is current (no LanceDB), else from the store; with journals, a session whose
        turns a journal holds beyond the store's is opened read-only to count them."""
        h = self.home
        rows = self.listed() if cached else None
        if rows is None:
            rows = {(r["user"], r["session"]): self.with_tail(r) for r in h.store.sessions()}
        if journals:
            latest: dict[tuple[str, str], int] = {}
            for op in h.journal.read_new({}, own=True):
                if op.get("op") == "turn":
                    key = (op["user"], op["session"])
                    latest[key] = max(latest.get(key, 0), op["turn"])
            for key, last in latest.items():
                if key not in rows or last > rows[key]["turns"]:
                    s = h.open(key[1], key[0], read_only=True)
                    rows[key] = {"user": key[0], "session": key[1], "turns": s.turn_count, "pages": s.page_count}
        return [rows[k] for k in sorted(rows)]

    def with_tail(self, row: dict) -> dict:
        """A store row with its open tail page counted: it holds whatever turns follow the last sealed
        page, and the rest of that page's last turn when the turn goes on (read only then)."""
        h = self.home
        user, session, turns, sealed_to = row["user"], row["session"], row["turns"], row.get("sealed_to", 0)
        tail = turns > sealed_to
        if turns and turns == sealed_to:
            pages, _ = h.store.pages(user, session, after=row["pages"] - 1, with_vectors=False)
            turn, _, end = pages[-1].spans[-1] if pages else (0, 0, 0)
            rest = h.store.turns(user, session, after=turn - 1)[:1] if turn else []
            tail = bool(rest) and end < len(rest[0].text)
        return {"user": user, "session": session, "turns": turns, "pages": row["pages"] + tail}

    LISTING_FORMAT = 1

    def listing_path(self) -> Path:
        h = self.home
        return h.path / "cache" / f"{hashlib.sha256(self.store_key().encode()).hexdigest()[:32]}.sessions"

    def listing_kept(self) -> bool:
        """Whether this home keeps a listing cache: for its own store only (another --db may be written
        by other homes, which this one never hears of)."""
        h = self.home
        return h.local == h.path and is_local(h.config.db_uri)

    def listing(self) -> list[dict] | None:
        """The listing cache's rows as written (each with its lock's counts), or None."""
        try:
            data = json.loads(self.listing_path().read_bytes())
        except (OSError, ValueError):
            return None
        ok = isinstance(data, dict) and data.get("format") == self.LISTING_FORMAT
        return data["sessions"] if ok else None

    def listed(self) -> dict | None:
        """The sessions as the listing cache holds them, or None unless it is current: nothing committed
        to the store's turns or pages since the cache was written, and every session lock of the home
        at the counts its row was written with (a lock that moved, or a row's lock gone, means turns
        came since). Its blind spot: sessions another home wrote into this home's own store (given it as
        --db) before this home last closed; homes that share a store should each be given it with --db."""
        h = self.home
        if not self.listing_kept():
            return None
        path, db = self.listing_path(), Path(h.config.db_uri.removeprefix("file://"))
        try:
            written = path.stat().st_mtime_ns
            if any((db / f"{t}.lance" / "_versions").stat().st_mtime_ns > written
                   for t in ("turns", "pages", "state_changes")):
                return None
            listing = self.listing()
            if listing is None:
                return None
            locks = {p.name: lock_counts(p) for p in (h.local / "locks").glob("*.lock")}
            rows = {}
            for r in listing:
                if locks.pop(h.locks.path(r["user"], r["session"]).name, None) != r["counts"]:
                    return None
                rows[(r["user"], r["session"])] = {k: r[k] for k in ("user", "session", "turns", "pages")}
        except (OSError, KeyError, TypeError):
            return None
        return None if any(c is not None for c in locks.values()) else rows

    def save_listing(self, sessions) -> None:
        """Put the sessions' rows in the listing cache (after the closing flush), each with its lock's
        counts. The cache is made from the store when there is none (or a row's lock is gone), so it
        holds every session; a row of a session another process wrote since is stale by its lock, and
        the listing reads the store until that process closes and writes the row again."""
        h = self.home
        if h.read_only or not isinstance(h.loaded_store, LanceStore) or not self.listing_kept():
            return   # nothing written here, or to a store of this process (memory_home) that no other reads
        listing = self.listing()
        if listing is None or any(r["counts"] is not None and lock_counts(h.locks.path(r["user"], r["session"]))
                                  is None for r in listing):
            listing = []
            for r in h.store.sessions():
                counts = lock_counts(h.locks.path(r["user"], r["session"]))
                if counts is None or (counts[0] == r["turns"] and not counts[2]):
                    listing.append({**self.with_tail(r), "counts": counts})
        rows = {(r["user"], r["session"]): r for r in listing}
        for s in sessions:
            counts = lock_counts(h.locks.path(s.user, s.name))
            if s.begun and counts is not None and counts[0] == s.turn_count and not counts[2]:
                rows[s.key()] = {"user": s.user, "session": s.name, "turns": s.turn_count, "pages": s.page_count,
                                 "counts": counts}
        path = self.listing_path()
        try:
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"format": self.LISTING_FORMAT, "sessions": [rows[k] for k in sorted(rows)]},
                                      ensure_ascii=False))
            os.replace(tmp, path)
        except OSError:
            pass  # an optimisation; `pager sessions` reads the store


@dataclass
class Snapshot:
    """A session as the store held it when a process closed it: a read-only open answers from this
    (a store of one session) and reads anything else (turns appended later) from the real store."""
    FORMAT = (3, SCHEMA_VERSION)   # bump the first with this class, the second moves with the store's records
    generation: int
    last_turn: int
    after: int                 # tail holds the turns after this one
    saved_state: dict | None
    saved_pages: list
    saved_bookmarks: list
    tail: list
    saved_changes: list = field(default_factory=list)   # the working state's changes
    saved_facts: list = field(default_factory=list)
    saved_summaries: list = field(default_factory=list)
    saved_turns: list | None = None   # every turn, for a session of at most WHOLE_TURNS; else None
    dim: int = 0                      # the index's vector size: a read-only open needs no embedder to know it
    vectors: dict = field(default_factory=dict)   # the facts' and summaries' texts → their vectors (float16)
    counts: dict = field(default_factory=dict)    # encoding → the counts packing the tail again makes (tail_counts)
    format: tuple = FORMAT
    fallback: Callable[[], Store] | None = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "fallback"}

    def state(self, user: str, session: str) -> dict | None:
        return self.saved_state

    def pages(self, user: str, session: str, after: int = 0, with_vectors: bool = True):
        if with_vectors and not self.saved_pages:
            return [], []   # nothing sealed: no vectors to read
        if with_vectors:  # the index cache did not fit: vectors come from the store
            return self._store().pages(user, session, after, with_vectors)
        return [p for p in self.saved_pages if p.n > after], []

    def bookmarks(self, user: str, session: str) -> list:
        return list(self.saved_bookmarks)

    def state_changes(self, user: str, session: str, after: int = 0) -> list:
        return [c for c in self.saved_changes if c.seq > after]

    def facts(self, user: str, session: str, after: int = 0) -> list:
        return [f for f in self.saved_facts if f.n > after]

    def summaries(self, user: str, session: str, after: int = 0) -> list:
        return [x for x in self.saved_summaries if x.n > after]

    def turn_count(self, user: str, session: str) -> int:
        return self.last_turn

    def turns(self, user: str, session: str, after: int = 0) -> list:
        if self.saved_turns is not None:
            return [t for t in self.saved_turns if t.turn > after]
        if after != self.after:  # only the open tail page's turns were kept
            return self._store().turns(user, session, after)
        return list(self.tail)

    def refresh(self) -> None:
        self._store().refresh()

    def _store(self) -> Store:
        assert self.fallback is not None, "a snapshot is read through Caches.snapshot, which sets its fallback"
        return self.fallback()


def tail_counts(s, last: Page | None, tail: list) -> dict[str, dict[str, int]]:
    """The counts an open from the snapshot makes when it packs the open page's turns again, by the
    session's packing encoding: the tail packed here as that open packs it (from where the last
    sealed page ends, Session._load), each count kept. Given them, a read-only open loads no encoding."""
    tokenizer = s.packer.tokenizer
    recorder = tokenizer.recorder()
    packer = Packer(s.name, recorder, s.page_tokens, next_n=(last.n + 1) if last else 1, user=s.user)
    start = last.spans[-1][2] if last else 0
    for turn in tail:
        if start < len(turn.text):
            packer.add(turn, start)
        start = 0
    return {tokenizer.name: recorder.seen}


MAPPED = b"pager mapped pickle 1\n"   # a cache file whose arrays are read in place (read_mapped)


def write_mapped(path: Path, obj) -> None:
    """obj pickled with its large buffers (numpy arrays, Arrow columns) out of band, written after the
    pickle each at a multiple of 64 bytes, so that read_mapped maps them rather than copying them."""
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    sizes = [b.raw().nbytes for b in buffers]
    head = MAPPED + struct.pack(f"<QQ{len(sizes)}Q", len(data), len(sizes), *sizes)
    parts: list[bytes | memoryview] = [head, data, *(b.raw() for b in buffers)]
    with open(path, "wb") as fh:
        for part in parts:
            fh.write(b"\0" * (-fh.tell() % 64))
            fh.write(part)


def read_mapped(path: Path):
    """What write_mapped wrote, its buffers mapped copy-on-write (an array is read from the file's pages
    as it is used, and writable without writing the file); a plain pickle (an earlier cache) read whole."""
    with open(path, "rb") as fh:
        if fh.read(len(MAPPED)) != MAPPED:
            fh.seek(0)
            return pickle.load(fh)
        length, count = struct.unpack("<QQ", fh.read(16))
        if count > 1 << 20:
            raise ValueError(f"{path} is damaged")
        sizes = struct.unpack(f"<{count}Q", fh.read(8 * count))
        view = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY))
    start = -(-(len(MAPPED) + 16 + 8 * count) // 64) * 64
    data, at = view[start:start + length], start + length
    buffers = []
    for size in sizes:
        at += -at % 64
        buffers.append(view[at:at + size])
        at += size
    if at > len(view):
        raise EOFError(f"{path} is cut short")
    return pickle.loads(data, buffers=buffers)


@contextmanager
def gc_paused():
    """Unpickling a large index allocates ~10^5 containers; the cyclic collector would walk the
    growing heap again and again while it does (it found nothing to free: nothing is garbage yet)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
