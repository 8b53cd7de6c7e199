"""A pager home: the store, the journal, the locks, and the sessions open in this process.

    PAGER_HOME/
      db/         LanceDB tables (or --db / PAGER_DB elsewhere, s3:// included)
      journal/    one segment per live process, fsync'd before a turn is acknowledged;
                  damaged/ keeps recovered segments that had damaged records
      locks/      one file per session: flock for appends, holding "last_turn generation"
      stores/<digest>/journal, locks
                  the same two for each other store this home was used with (--db / PAGER_DB)
      traces/     one JSONL trace per session run and process
      cache/      search indexes and session snapshots; safe to delete

The home is a small registry that wires the rooms together: the write path (pager.write_path:
accept, journal, flush, leases and fencing), recovery of dead processes' journals
(pager.recovery), the session locks (pager.locks) and the local caches (pager.caches); the
sessions themselves (pager.session) are opened and kept here. Pages are sealed from the
gapless, durable turn sequence only (Intake.take), so every process that packs a session seals
the same pages, and the store keeps each once. Ownership: this process's journal segment and the sessions' lock files are local;
what lives in the store is shared. A read-only home (search, inspect, export) writes nothing.

What is local and what is shared, when several hosts use one store (`--db s3://…`): the journal,
the lock files, the caches and the traces are this home's alone (another host never reads them);
turns, pages, bookmarks, page-table states, meta (schema, migrations) and the leases are in the
store. The lock files order the processes of this home; the lease (pager.lease) orders the
homes: a session is written by one home at a time, and a home that just took a session's lease
reads what another home flushed before it numbers a turn.

Journal and locks belong to one store: they say which turns the store is about to hold and the
last turn number it holds. The home's own store (<home>/db) keeps them where they always were, so
an older home works as it did; any other store gets a folder of its own under stores/, named for
the store, so one home used with two stores keeps two independent memories, and a dead process's
journal is recovered only into the store it was written for. Segments an older pager left in
journal/ do not say their store: the first process to find one recovers it, as that pager did.
The caches are keyed by the store's URI already.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .caches import Caches, Snapshot
from .config import Config
from .embed import Embedder, make_embedder
from .errors import ConfigError, StoreError
from .journal import Journal
from .lease import Leases
from .locks import Locks
from .recovery import HOME_TAG, Recovery
from .store import LanceStore, MemoryStore, Store, is_local
from .tokens import Tokenizer, get_tokenizer
from .write_path import Accepted, WritePath, check_new_name

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("pager")

__all__ = ["Home", "memory_home", "check_new_name", "store_folder", "store_uri"]


class Home:
    def __init__(self, config: Config, store: Store | None = None, embedder: Embedder | None = None,
                 tokenizer: Tokenizer | None = None, clock: Callable[[], float] = time.time,
                 durable: bool = True, read_only: bool = False, warn: Callable[[str], None] | None = None,
                 writer=None) -> None:
        self.config = config
        self.clock = clock
        self.path = Path(config.home)
        self.local = store_folder(config)   # the journal and locks of this store (see the module docstring)
        self.read_only = read_only
        self.warnings: list[str] = []
        self._warn = warn or log.warning
        if self.path.exists() and not self.path.is_dir():
            raise StoreError(f"the pager home {self.path} is a file, not a folder; pick a folder with --home "
                             "(or PAGER_HOME)")
        if not read_only:
            try:
                (self.path / "traces").mkdir(parents=True, exist_ok=True)
                for sub in ("journal", "locks"):
                    (self.local / sub).mkdir(parents=True, exist_ok=True)
                if self.local != self.path and not (self.local / "STORE").exists():
                    (self.local / "STORE").write_text(store_uri(config) + "\n")   # for a person: whose folder this is
            except OSError as exc:
                raise StoreError(f"cannot use {self.path} as the pager home ({exc}); pick another with --home") from exc
        self._tokenizer = tokenizer
        self._embedder = embedder
        self._store = store
        self._writer = writer   # the bookmark or memory writer; built from the config when None
        # who makes the writer's calls: None, the thread that sealed the pages (chat, a Toolkit, replay);
        # `pager serve` sets its pager.memory_worker.MemoryWorker, which makes them with no lock held
        self.memory_worker: Any = None
        self._reranker: Any = None   # the search's and the facts' reranker (pager/rerank.py); built from the config when None
        self.mutex = threading.RLock()   # one writer thread at a time in this process
        self.locks = Locks(self.local)
        self.writes = WritePath(self)
        self.recovery = Recovery(self)
        self.caches = Caches(self)
        self.journal = Journal(self.local / "journal", fsync=durable, read_only=read_only, report=self.warn,
                               tag="" if self.local != self.path else HOME_TAG)
        self.sessions: dict[tuple[str, str], "Session"] = {}
        self.closed = False
        self.recovered = 0
        # the lease clock is the wall clock whatever clock the session uses: other hosts compare against it
        self.closing = False
        self.leases = Leases(lambda: self.store, os.path.abspath(self.path), config.lease_s, config.lease_wait_s,
                             warn=self.warn, idle_s=config.lease_idle_s, on_idle=self.writes.release_idle)
        if not read_only:
            self._sweep_tmp()
            try:
                self.recovered = self.recovery.recover()
            except BaseException:
                self._abandon()
                raise

    def _abandon(self) -> None:
        """A home that failed (to open: a store it cannot read, a journal of a newer pager; or in its `with`
        block): its own journal segment stays for the next process if anything was written to it, and goes
        if not (no empty segment left for the next process to take for a dead one's); its leases lapse."""
        self.journal.close(remove=not self.journal.written)
        self.leases.stop()
        self.closed = True

    def warn(self, message: str) -> None:
        """Something a person should know (damage found and skipped); said once, never fatal."""
        if message not in self.warnings:
            self.warnings.append(message)
            self._warn(message)

    # -- lazily built parts (LanceDB and the embedder cost seconds to import) ----------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:   # a quarter second to load: `pager sessions` never needs it
            self._tokenizer = get_tokenizer(self.config.encoding)
        return self._tokenizer

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = make_embedder(self.config.embedder)
        return self._embedder

    @property
    def writer(self):
        """The model that writes bookmarks of sealed pages (the memory model: bookmarks, facts and state
        in one call per batch), or None (offline extraction only)."""
        if self._writer is None and self.config.writer_model:
            from .llm import LiteLLMModel

            if self.config.memory_model:
                from .memory import MemoryWriter

                model = LiteLLMModel(self.config.memory_model, output_tokens=2048, attempts=2, timeout=60.0,
                                     api_base=self.config.api_base)
                # a missing key is one line naming the variable, before anything is accepted
                model.check("drop --memory-model (PAGER_MEMORY_MODEL) for offline memory only")
                self._writer = MemoryWriter(model, self.config.bookmark_batch)
            else:
                from .writer import BookmarkWriter

                model = LiteLLMModel(self.config.bookmark_model, output_tokens=1024, attempts=3,
                                     api_base=self.config.api_base)
                model.check("drop --bookmark-model (PAGER_BOOKMARK_MODEL) for offline keywords only")
                self._writer = BookmarkWriter(model, self.config.bookmark_batch)
        return self._writer

    @property
    def reranker(self):
        """The reranker reordering the search's best pieces and the best facts for each message
        (`Config.reranker`), or None. Its failures, a missing key among them, are `rerank_failed` events
        (pager/rerank.py)."""
        if self._reranker is None and self.config.reranker:
            from .rerank import make_reranker

            self._reranker = make_reranker(self.config.reranker)
        return self._reranker

    @reranker.setter
    def reranker(self, reranker) -> None:
        self._reranker = reranker

    @property
    def store(self) -> Store:
        if self._store is None:
            uri = self.config.db_uri
            if self.read_only and is_local(uri) and not Path(uri.removeprefix("file://")).exists():
                self._store = MemoryStore(self.embedder.dim)  # nothing was ever stored here
            else:
                self._store = LanceStore(uri, self.embedder.dim, read_only=self.read_only, notify=self.warn,
                                         storage_options=self.config.storage_options,
                                         matryoshka=getattr(self.embedder, "matryoshka", False))
                if self._store.pending_migrations:
                    self.warn(f"the store at {uri} lacks migration(s) {', '.join(self._store.pending_migrations)}; "
                              "run `pager migrate` (a command that only looks does not migrate)")
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
            source = self.caches.snapshot(*key) if (read_only or self.read_only) else None
            s = Session(self, key[0], key[1], policy, source=source)
            self.sessions[key] = s
            s.sync()  # turns other live processes hold in their journals, not yet in the store
        elif policy is not None and policy != self.sessions[key].policy.name:
            raise ConfigError(f"session {key[1]!r} is already open with policy {self.sessions[key].policy.name}, not "
                              f"{policy}; switch it with session.set_policy({policy!r}) or open it without policy=")
        return self.sessions[key]

    def unload(self, user: str, session: str) -> None:
        """Close one open session (a server letting go of an idle one): everything it holds written to
        the store, its index cached, its memory let go. The next open loads it again, nothing lost."""
        key = (user, session)
        with self.mutex:
            s = self.sessions.get(key)
            if s is None:
                return
            self.flush()
            self.caches.save_index(s)
            self.caches.save_snapshot(s)
            self.caches.save_listing([s])
            del self.sessions[key]
            mutex = self.locks.mutexes.get(key)
            if mutex is not None and not mutex.locked():   # every user of it holds self.mutex
                del self.locks.mutexes[key]

    def reader(self, user: str, session: str) -> Store | Snapshot:
        """Where a home that only looks reads a session's records: the snapshot the last process left,
        when it is current and holds every turn (no LanceDB to import), else the store."""
        if self.read_only:
            snapshot = self.caches.snapshot(user, session)
            if snapshot is not None and snapshot.saved_turns is not None:
                return snapshot
        return self.store

    def stored(self, user: str, session: str) -> bool:
        """Whether the store holds the session: turns, or a working state set before any turn."""
        store = self.reader(user, session)
        return bool(store.turn_count(user, session) or store.state_changes(user, session))

    def exists(self, user: str, session: str) -> bool:
        """Whether the session holds anything, in the store or in a journal."""
        if self.stored(user, session):
            return True
        return any(op["user"] == user and op["session"] == session for op in self.journal.read_new({}))

    # -- the rooms, as sessions and commands call them ---------------------------------------------------
    def accept(self, groups: dict, origin: str = "input") -> Accepted:
        """Accept messages for one or more sessions as one transaction (WritePath.accept)."""
        return self.writes.accept(groups, origin)

    def journal_op(self, session, op) -> None:
        self.writes.journal_op(session, op)

    def flush(self) -> None:
        self.writes.flush()

    def maybe_flush(self) -> None:
        self.writes.maybe_flush()

    @property
    def flushes(self) -> int:
        return self.writes.flushes

    def recover_dead(self) -> int:
        return self.recovery.recover_dead()

    def recover_waiting(self) -> list[tuple[str, str]]:
        return self.recovery.recover_waiting()

    def withheld(self, key: tuple[str, str]) -> list[str]:
        return self.recovery.withheld(key)

    def waiting(self, key: tuple[str, str]) -> bool:
        return self.recovery.waiting(key)

    def session_lock(self, user: str, session: str):
        return self.locks.hold(user, session)

    def read_counts(self, s) -> tuple[int, int]:
        return self.locks.counts(s)

    def cached_index(self, s):
        return self.caches.cached_index(s)

    def session_rows(self, journals: bool = True, cached: bool = True) -> list[dict]:
        return self.caches.session_rows(journals, cached)

    @property
    def loaded_embedder(self) -> Embedder | None:
        """The embedder if it was built already (it costs seconds to load: nothing builds it only to look)."""
        return self._embedder

    @property
    def loaded_store(self) -> Store | None:
        return self._store

    TMP_AGE_S = 30  # a temporary file older than this belongs to no write in progress (a batch takes < 1 s)

    def _sweep_tmp(self) -> None:
        """Remove temporary files a killed LanceDB writer left under the local store (an object store
        keeps no temporary files: a write is one PUT)."""
        uri = self.config.db_uri
        if not is_local(uri) or not Path(uri.removeprefix("file://")).exists():
            return
        cutoff = time.time() - self.TMP_AGE_S
        for tmp in Path(uri.removeprefix("file://")).glob("*/data/.tmp*"):
            try:
                if tmp.stat().st_mtime < cutoff:
                    shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
            except OSError:
                pass

    def close(self) -> None:
        if self.closed:
            return
        writes = self.writes
        if writes.early is not None:   # idle: accept waits for what it hands over
            if writes.early_pid == os.getpid():
                writes.early.shutdown()
            writes.early = None
        if self.read_only:
            with self.mutex:
                self.closing = True
            self.closed = True
            return
        with self.mutex:
            self.closing = True  # the lease thread gives nothing up from here on: close releases all
        try:
            self.flush()
        except Exception:
            self.journal.close(remove=False)  # everything accepted stays in the journal for the next process
            self.leases.stop()  # and the lease lapses: this home's next process recovers the journal
            self.closed = True
            raise
        # another live process of this home (every one holds a journal segment) shares the leases: they
        # stay, renewed by it for the sessions it writes, lapsing for the others
        others = self.recovery.live_others() if self.leases.held else []
        # records numbered over, or waiting for a lease another home holds, are recovered by the next process
        self.journal.close(remove=not writes.lost and not writes.held_back)
        if others:
            self.leases.stop()
        else:
            self.leases.release()
        for s in self.sessions.values():
            if s.key() not in writes.lost:   # numbered from a past the store no longer holds: cache nothing of it
                self.caches.save_index(s)
                self.caches.save_snapshot(s)
        self.caches.save_listing([s for s in self.sessions.values() if s.key() not in writes.lost])
        self.closed = True

    def __enter__(self) -> "Home":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            # keep the journal: whatever was accepted is replayed by the next process (an empty one goes)
            self._abandon()


def store_uri(config: Config) -> str:
    """The config's store, one spelling per store: a local folder by its real path."""
    uri = config.db_uri
    return os.path.realpath(os.path.expanduser(uri.removeprefix("file://"))) if is_local(uri) else uri


def store_folder(config: Config) -> Path:
    """Where the journal and locks of the config's store live: the home itself for its own store
    (<home>/db, however spelled), else stores/<digest of the store's URI>/."""
    uri = store_uri(config)
    if uri == os.path.realpath(config.home / "db"):
        return config.home
    return config.home / "stores" / hashlib.sha256(uri.encode()).hexdigest()[:16]


def memory_home(config: Config, embedder: Embedder | None = None, **kw) -> Home:
    """A home whose store is in memory and whose journal is not fsync'd (benchmarks, tests)."""
    return Home(config, store=MemoryStore(), embedder=embedder, durable=False, **kw)


