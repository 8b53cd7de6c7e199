"""A pager home: the store, the journal, the locks, and the sessions open in this process.

    PAGER_HOME/
      db/         LanceDB tables (or --db / PAGER_DB elsewhere, s3:// included)
      journal/    one segment per live process; fsync'd before a turn is acknowledged
      locks/      one file per session: flock for appends, holding "last_turn generation"
      traces/     one JSONL trace per session run

The journal and locks are local: several processes on one machine may share a session
(turn numbers are assigned under the session's lock, and each process reads the others'
journal segments). Processes on different machines may share the store for different
sessions.
"""

from __future__ import annotations

import fcntl
import gc
import hashlib
import os
import pickle
import shutil
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from .config import Config
from .embed import Embedder, make_embedder
from .errors import ConfigError, StoreError
from .journal import Journal
from .page import Turn
from .store import SCHEMA_VERSION, Batch, LanceStore, MemoryStore, Store
from .tokens import Tokenizer, get_tokenizer

if TYPE_CHECKING:
    from .session import Session


@dataclass
class SessionLock:
    path: Path
    fd: int
    last_turn: int = 0
    generation: int = 0

    def advance(self, last_turn: int, ops: int) -> None:
        self.last_turn, self.generation = last_turn, self.generation + ops
        data = f"{self.last_turn} {self.generation}\n".encode()
        os.pwrite(self.fd, data.ljust(40), 0)


def _read_counts(data: bytes) -> tuple[int, int]:
    parts = data.split()
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return 0, 0


class Home:
    def __init__(self, config: Config, store: Store | None = None, embedder: Embedder | None = None,
                 tokenizer: Tokenizer | None = None, clock: Callable[[], float] = time.time,
                 durable: bool = True) -> None:
        self.config = config
        self.clock = clock
        self.path = Path(config.home)
        try:
            for sub in ("journal", "locks", "traces"):
                (self.path / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot use {self.path} as the pager home ({exc}); pick another with --home") from exc
        self.tokenizer = tokenizer or get_tokenizer(config.encoding)
        self._embedder = embedder
        self._store = store
        self._writer = None
        self.journal = Journal(self.path / "journal", fsync=durable)
        self.sessions: dict[tuple[str, str], "Session"] = {}
        self.flushes = 0
        self._closed = False
        self._sweep_tmp()
        self.recovered = self.recover()

    # -- lazily built parts (LanceDB and the embedder cost seconds to import) ----------------------------
    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = make_embedder(self.config.embedder)
        return self._embedder

    @property
    def writer(self):
        """The model that writes bookmarks of sealed pages, or None (offline extraction only)."""
        if self._writer is None and self.config.bookmark_model:
            from .llm import LiteLLMModel
            from .writer import BookmarkWriter

            model = LiteLLMModel(self.config.bookmark_model, output_tokens=1024, attempts=3)
            # a missing key is one line naming the variable, before anything is accepted
            model.check("drop --bookmark-model (PAGER_BOOKMARK_MODEL) for offline keywords only")
            self._writer = BookmarkWriter(model, self.config.bookmark_batch)
        return self._writer

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = LanceStore(self.config.db_uri, self.embedder.dim)
        return self._store

    # -- sessions -------------------------------------------------------------------------------------
    def open(self, session: str | None = None, user: str | None = None, policy: str | None = None,
             read_only: bool = False) -> "Session":
        """The session, loaded once per home. read_only (commands that only look: search, inspect)
        may open it from the snapshot the last process left, without touching the store, when
        nothing was appended since; anything it lacks it still reads from the store."""
        from .session import Session

        key = (self.config.user if user is None else user, self.config.session if session is None else session)
        if key not in self.sessions:
            source = self._snapshot(*key) if read_only else None
            s = Session(self, key[0], key[1], policy, source=source)
            self.sessions[key] = s
            s.sync()  # turns other live processes hold in their journals, not yet in the store
        elif policy is not None and policy != self.sessions[key].policy.name:
            raise ConfigError(f"session {key[1]!r} is already open with policy {self.sessions[key].policy.name}, not "
                              f"{policy}; switch it with session.set_policy({policy!r}) or open it without policy=")
        return self.sessions[key]

    # -- the index cache: a session's search index, kept on local disk between processes -------------------
    def _cache_path(self, s) -> Path:
        key = f"{self.config.db_uri}\x00{s.user}\x00{s.name}\x00{self.config.embedder}"
        return self.path / "cache" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.index"

    def cached_index(self, s):
        """The session's index as a previous process left it, or None. Only this user's own files are
        read (the cache is a pickle, trusted like the journal); a stale or damaged one is ignored."""
        path = self._cache_path(s)
        try:
            with open(path, "rb") as fh, _gc_paused():
                index = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError):
            return None
        from .search import Index

        return index if isinstance(index, Index) else None

    def save_index(self, s) -> None:
        """Write the session's index if it grew since it was loaded (atomically: temp file, rename)."""
        if (len(s.index) == s.index_saved and not s.index.vocabulary.grew) or len(s.index) < 200:
            return
        path = self._cache_path(s)
        try:
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            s.index.vectors()  # stack pending rows so the cache holds one array
            s.index.vocabulary.grew = False
            with open(tmp, "wb") as fh:
                pickle.dump(s.index, fh, protocol=5)
            os.replace(tmp, path)
            s.index_saved = len(s.index)
        except OSError:
            pass  # a cache is an optimisation; the next open rebuilds

    # -- the session snapshot: what a session held when a process closed it, for read-only opens ---------
    def _snapshot_path(self, user: str, session: str) -> Path:
        key = f"{self.config.db_uri}\x00{user}\x00{session}\x00{self.config.embedder}"
        return self.path / "cache" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.session"

    def save_snapshot(self, s) -> None:
        """Write the session as the store now holds it (called after the closing flush), tagged with
        the session lock's counts: a later read-only open trusts it only while they are unchanged."""
        if isinstance(s.source, Snapshot):
            return  # opened from one and only looked
        last, generation = self._read_lock(s)
        if last != s.turn_count or len(s.index) != len(s.pages) or len(s.pages) < 200:
            return  # turns of other processes not taken in, or an index not worth caching
        pages = [s.pages[n] for n in sorted(s.pages)]
        after = pages[-1].spans[-1][0] - 1
        tail = self.store.turns(s.user, s.name, after=after)
        if (tail[-1].turn if tail else after + 1) != s.turn_count:
            return  # the store lacks turns a live process still holds in its journal
        snapshot = Snapshot(generation, last, after, self.store.state(s.user, s.name), pages,
                            self.store.bookmarks(s.user, s.name), tail)
        path = self._snapshot_path(s.user, s.name)
        try:
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            with open(tmp, "wb") as fh:
                pickle.dump(snapshot, fh, protocol=5)
            os.replace(tmp, path)
        except OSError:
            pass  # an optimisation; the next open reads the store

    def _snapshot(self, user: str, session: str) -> "Snapshot | None":
        if self.recovered:
            return None  # a dead process's records just reached the store: the snapshot may lack them
        try:
            with open(self._snapshot_path(user, session), "rb") as fh, _gc_paused():
                snapshot = pickle.load(fh)
        except (OSError, EOFError, pickle.UnpicklingError, AttributeError, ImportError, ValueError, TypeError):
            return None
        if not isinstance(snapshot, Snapshot) or snapshot.format != Snapshot.FORMAT:
            return None
        if _read_counts_path(self._lock_path(user, session)) != (snapshot.last_turn, snapshot.generation):
            return None  # something was appended since (or the lock is gone): read the store
        snapshot.fallback = lambda: self.store
        return snapshot

    def _lock_path(self, user: str, session: str) -> Path:
        digest = hashlib.sha256(f"{user}\x00{session}".encode()).hexdigest()[:32]
        return self.path / "locks" / f"{digest}.lock"

    @contextmanager
    def session_lock(self, s) -> Iterator[SessionLock]:
        path = self._lock_path(s.user, s.name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            last, gen = _read_counts(os.pread(fd, 64, 0))
            yield SessionLock(path, fd, last, gen)
        finally:
            os.close(fd)  # closing releases the flock

    def read_generation(self, s) -> int:
        return self._read_lock(s)[1]

    def read_last_turn(self, s) -> int:
        return self._read_lock(s)[0]

    def _read_lock(self, s) -> tuple[int, int]:
        return _read_counts_path(self._lock_path(s.user, s.name)) or (0, 0)

    # -- durability -----------------------------------------------------------------------------------
    def journal_append(self, records: list[dict]) -> None:
        self.journal.append(records)

    def maybe_flush(self) -> None:
        """Flush when the journal holds enough; a store that refuses is reported, not fatal: the
        records stay in the journal and the next flush (or the next process) writes them."""
        if self.journal.written < self.config.flush_turns:
            return
        try:
            self.flush()
        except StoreError as exc:
            for s in self.sessions.values():
                s.emit("store_error", error=str(exc))

    def flush(self) -> None:
        """Write every open session's pending turns, pages, bookmarks and page table in one batch."""
        parts = {s: s.take_pending() for s in self.sessions.values()}
        batch = Batch()
        for part in parts.values():
            batch.turns += part.turns
            batch.pages += part.pages
            batch.vectors += part.vectors
            batch.bookmarks += part.bookmarks
            batch.states.update(part.states)
        if not batch:
            return
        try:
            # Writers of one session take turns, and each writes against the latest version, so two
            # processes that sealed the same page (packing is deterministic) store it once.
            with ExitStack() as locks:
                for s in sorted(self.sessions.values(), key=lambda s: (s.user, s.name)):
                    locks.enter_context(self.session_lock(s))
                self.store.refresh()
                self.store.put(batch)
        except Exception:
            for s, part in parts.items():  # keep them for the next try; the journal still has them too
                s.pending = part.merged(s.pending)
            raise
        self.journal.rotate()
        self.flushes += 1
        if self.flushes % self.config.compact_every == 0:
            self.store.compact(self.config.keep_versions_s)

    def recover(self) -> int:
        """Replay journal segments left by dead processes into the store; returns records recovered."""
        count = 0
        for _path, records in self.journal.orphans():
            by_session: dict[tuple[str, str], list[dict]] = {}
            for r in records:
                by_session.setdefault((r.get("user", ""), r.get("session", "")), []).append(r)
            for (user, session), rows in by_session.items():
                count += self._recover_session(user, session, rows)
            self.flush()
        return count

    def _recover_session(self, user: str, session: str, rows: list[dict]) -> int:
        from .bookmarks import Bookmark

        s = self.open(session, user)
        recovered = 0
        for r in sorted((r for r in rows if r.get("op") == "turn"), key=lambda r: r["turn"]):
            if r["turn"] > s.turn_count:
                t = Turn(**{k: r[k] for k in Turn.__dataclass_fields__})
                s._pack(t, 0, own=True)
                recovered += 1
            elif r["turn"] > 0:
                # already packed from the store or another segment, but maybe never written there
                s.pending.turns.append(Turn(**{k: r[k] for k in Turn.__dataclass_fields__}))
        for r in rows:
            if r.get("op") == "bookmark":
                mark = Bookmark.from_dict(r)
                s.directory.add(mark.keywords, mark.pages, mark.note, mark.uid)
                s.pending.bookmarks.append((user, session, mark))
            elif r.get("op") == "pin" and r["page"] in s.table:
                s.table[r["page"]].pinned = bool(r["pinned"])
        s._embed_pending()
        return recovered

    TMP_AGE_S = 30  # a temporary file older than this belongs to no write in progress (a batch takes < 1 s)

    def _sweep_tmp(self) -> None:
        """Remove temporary files a killed LanceDB writer left under the local store."""
        uri = self.config.db_uri
        if "://" in uri or not Path(uri).exists():
            return
        cutoff = time.time() - self.TMP_AGE_S
        for tmp in Path(uri).glob("*/data/.tmp*"):
            try:
                if tmp.stat().st_mtime < cutoff:
                    shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
            except OSError:
                pass

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        except Exception:
            self.journal.close(remove=False)  # everything accepted stays in the journal for the next process
            self._closed = True
            raise
        self.journal.close(remove=True)
        for s in self.sessions.values():
            self.save_index(s)
            self.save_snapshot(s)
        self._closed = True

    def __enter__(self) -> "Home":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            # keep the journal: whatever was accepted is replayed by the next process
            self.journal.close(remove=False)
            self._closed = True


def _read_counts_path(path: Path) -> tuple[int, int] | None:
    try:
        return _read_counts(path.read_bytes())
    except FileNotFoundError:
        return None


@dataclass
class Snapshot:
    """A session as the store held it when a process closed it: a read-only open answers from this
    (a store of one session) and reads anything else (turns appended later) from the real store."""

    FORMAT = (1, SCHEMA_VERSION)   # bump the first with this class, the second moves with the store's records
    generation: int
    last_turn: int
    after: int                 # tail holds the turns after this one
    saved_state: dict | None
    saved_pages: list
    saved_bookmarks: list
    tail: list
    format: tuple = FORMAT
    fallback: Callable[[], Store] | None = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "fallback"}

    def state(self, user: str, session: str) -> dict | None:
        return self.saved_state

    def pages(self, user: str, session: str, after: int = 0, with_vectors: bool = True):
        if with_vectors:  # the index cache did not fit: vectors come from the store
            return self.fallback().pages(user, session, after, with_vectors)
        return [p for p in self.saved_pages if p.n > after], []

    def bookmarks(self, user: str, session: str) -> list:
        return list(self.saved_bookmarks)

    def turns(self, user: str, session: str, after: int = 0) -> list:
        if after != self.after:  # only the open tail page's turns were kept
            return self.fallback().turns(user, session, after)
        return list(self.tail)

    def refresh(self) -> None:
        self.fallback().refresh()


@contextmanager
def _gc_paused():
    """Unpickling a large index allocates ~10^5 containers; the cyclic collector would walk the
    growing heap again and again while it does (it found nothing to free: nothing is garbage yet)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def memory_home(config: Config, embedder: Embedder | None = None, **kw) -> Home:
    """A home whose store is in memory and whose journal is not fsync'd (benchmarks, tests)."""
    return Home(config, store=MemoryStore(), embedder=embedder, durable=False, **kw)
