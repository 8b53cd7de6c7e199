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

The one write path (`Home.accept`): under the locks of the sessions written (taken in a fixed
order), each session first takes in everything other processes made durable (their journal
segments, then the store), numbers the new turns after the durable last turn, and the whole
group is written to the journal as one frame and fsync'd; only then are the locks advanced and
the turns packed onto pages. Pages are sealed from the gapless, durable turn sequence only
(Session._take), so every process that packs a session seals the same pages, and the store keeps
each once. Ownership: this process's journal segment and the sessions' lock files are local;
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

import fcntl
import gc
import hashlib
import json
import logging
import os
import pickle
import shutil
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from .config import Config, name_problem
from .embed import Embedder, make_embedder
from .errors import ConfigError, InputError, LeaseHeld, LeaseLapsed, NewerStore, StoreError
from .journal import Journal, read_segment
from .lease import Leases
from .recovery import follow
from .page import Turn
from .store import SCHEMA_VERSION, Batch, LanceStore, MemoryStore, Store, is_local
from .tokens import Tokenizer, get_tokenizer

if TYPE_CHECKING:
    from .session import Session

log = logging.getLogger("pager")


CACHED_FROM = 1   # pages a session needs before its index and snapshot are cached at close (was 200: a
# small session then paid LanceDB's import, ~2.5 s, on every `pager search` to save a cache of a few KB)


@dataclass
class SessionLock:
    """A session's lock file, held with flock by the one process appending to it: "last_turn
    generation [pending]". last_turn is the durable last turn; generation counts journal ops,
    so a reader knows when to look at the journals again; "pending" is written before a journal
    write and cleared after it, so the next holder knows a holder died in between and scans."""

    path: Path
    fd: int
    last_turn: int = 0
    generation: int = 0
    dirty: bool = False
    owner: int = 0
    depth: int = 0

    def intend(self) -> None:
        self._write(self.last_turn, self.generation, True)

    def advance(self, last_turn: int, ops: int) -> None:
        self._write(max(self.last_turn, last_turn), self.generation + ops, False)

    def _write(self, last: int, generation: int, dirty: bool) -> None:
        data = f"{last} {generation}{' pending' if dirty else ''}\n".encode()
        os.pwrite(self.fd, data.ljust(48), 0)
        self.last_turn, self.generation, self.dirty = last, generation, dirty


@dataclass
class Kept:
    """A dead process's journal segment under recovery: its sessions, those still waiting for this
    home to take their lease, and where it goes when done."""
    keys: frozenset
    waiting: set
    damaged: bool
    journal: Journal


def _read_counts(data: bytes) -> tuple[int, int, bool]:
    parts = data.split()
    try:
        return int(parts[0]), int(parts[1]), b"pending" in parts[2:]
    except (IndexError, ValueError):
        return 0, 0, False


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
        self._mutex = threading.RLock()   # one writer thread at a time in this process
        self._early: Any = None           # the thread that embeds while the journal syncs (_embed_early)
        self._early_pid = 0
        self._held: dict[tuple[str, str], SessionLock] = {}
        self._kept: dict[Path, Kept] = {}   # dead processes' segments being recovered (recover)
        self._clashes: dict[tuple, tuple[int, bool]] = {}   # (session, segment) → (its size, numbered over?)
        self._lost: set[tuple[str, str]] = set()   # sessions whose unflushed records another home numbered over
        self._held_back: set[tuple[str, str]] = set()   # sessions whose records wait for a lease another home took
        self._newer = ""   # why writes are refused: a newer pager migrated the store under this process (flush)
        self._lock_mutexes: dict[tuple[str, str], threading.Lock] = {}
        self.journal = Journal(self.local / "journal", fsync=durable, read_only=read_only, report=self.warn,
                               tag="" if self.local != self.path else HOME_TAG)
        self.sessions: dict[tuple[str, str], "Session"] = {}
        self.flushes = 0
        self._closed = False
        self.recovered = 0
        # the lease clock is the wall clock whatever clock the session uses: other hosts compare against it
        self._closing = False
        self.leases = Leases(lambda: self.store, os.path.abspath(self.path), config.lease_s, config.lease_wait_s,
                             warn=self.warn, idle_s=config.lease_idle_s, on_idle=self._release_idle)
        if not read_only:
            self._sweep_tmp()
            try:
                self.recovered = self.recover()
            except BaseException:
                self._abandon()
                raise

    def _abandon(self) -> None:
        """A home that failed (to open: a store it cannot read, a journal of a newer pager; or in its `with`
        block): its own journal segment stays for the next process if anything was written to it, and goes
        if not (no empty segment left for the next process to take for a dead one's); its leases lapse."""
        self.journal.close(remove=not self.journal.written)
        self.leases.stop()
        self._closed = True

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
            source = self._snapshot(*key) if (read_only or self.read_only) else None
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
        with self._mutex:
            s = self.sessions.get(key)
            if s is None:
                return
            self.flush()
            self.save_index(s)
            self.save_snapshot(s)
            self.save_listing([s])
            del self.sessions[key]
            mutex = self._lock_mutexes.get(key)
            if mutex is not None and not mutex.locked():   # every user of it holds self._mutex
                del self._lock_mutexes[key]

    def stored(self, user: str, session: str) -> bool:
        """Whether the store holds the session: turns, or a working state set before any turn."""
        return bool(self.store.turn_count(user, session) or self.store.state_changes(user, session))

    def exists(self, user: str, session: str) -> bool:
        """Whether the session holds anything, in the store or in a journal."""
        if self.stored(user, session):
            return True
        return any(op["user"] == user and op["session"] == session for op in self.journal.read_new({}))

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

        # an index of another vector size (made before the store's vectors were cut, m006) is rebuilt
        return index if isinstance(index, Index) and index.dim == self.embedder.dim else None

    def save_index(self, s) -> None:
        """Write the session's index if it grew since it was loaded (atomically: temp file, rename)."""
        if (len(s.index) == s.index_saved and not s.index.vocabulary.grew) or len(s.index) < CACHED_FROM:
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
        last, generation = self.read_counts(s)
        if last != s.turn_count or len(s.index) != len(s.pages) or len(s.pages) < CACHED_FROM:
            return  # turns of other processes not taken in, or an index not worth caching
        pages = [s.pages[n] for n in sorted(s.pages)]
        after = pages[-1].spans[-1][0] - 1
        tail = self.store.turns(s.user, s.name, after=after)
        if (tail[-1].turn if tail else after + 1) != s.turn_count:
            return  # the store lacks turns a live process still holds in its journal
        snapshot = Snapshot(generation, last, after, self.store.state(s.user, s.name), pages,
                            self.store.bookmarks(s.user, s.name), tail, self.store.state_changes(s.user, s.name),
                            self.store.facts(s.user, s.name), self.store.summaries(s.user, s.name))
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
        counts = _read_counts_path(self._lock_path(user, session))
        if counts is None or counts[:2] != (snapshot.last_turn, snapshot.generation):
            return None  # something was appended since (or the lock is gone): read the store
        snapshot.fallback = lambda: self.store
        return snapshot

    # -- the session listing (`pager sessions`) -----------------------------------------------------------
    def session_rows(self, journals: bool = True, cached: bool = True) -> list[dict]:
        """Every session of the store, per user: its last turn and its pages, counted as `pager inspect`
        counts them (the sealed ones and the open tail page when it holds anything). From the listing
        cache when it is current (no LanceDB), else from the store; with journals, a session whose
        turns a journal holds beyond the store's is opened read-only to count them."""
        rows = self._listed() if cached else None
        if rows is None:
            rows = {(r["user"], r["session"]): self._with_tail(r) for r in self.store.sessions()}
        if journals:
            latest: dict[tuple[str, str], int] = {}
            for op in self.journal.read_new({}, own=True):
                if op.get("op") == "turn":
                    key = (op["user"], op["session"])
                    latest[key] = max(latest.get(key, 0), op["turn"])
            for key, last in latest.items():
                if key not in rows or last > rows[key]["turns"]:
                    s = self.open(key[1], key[0], read_only=True)
                    rows[key] = {"user": key[0], "session": key[1], "turns": s.turn_count, "pages": s.page_count}
        return [rows[k] for k in sorted(rows)]

    def _with_tail(self, row: dict) -> dict:
        """A store row with its open tail page counted: it holds whatever turns follow the last sealed
        page, and the rest of that page's last turn when the turn goes on (read only then)."""
        user, session, turns, sealed_to = row["user"], row["session"], row["turns"], row.get("sealed_to", 0)
        tail = turns > sealed_to
        if turns and turns == sealed_to:
            pages, _ = self.store.pages(user, session, after=row["pages"] - 1, with_vectors=False)
            turn, _, end = pages[-1].spans[-1] if pages else (0, 0, 0)
            rest = self.store.turns(user, session, after=turn - 1)[:1] if turn else []
            tail = bool(rest) and end < len(rest[0].text)
        return {"user": user, "session": session, "turns": turns, "pages": row["pages"] + tail}

    LISTING_FORMAT = 1

    def _listing_path(self) -> Path:
        return self.path / "cache" / f"{hashlib.sha256(self.config.db_uri.encode()).hexdigest()[:32]}.sessions"

    def _listing_kept(self) -> bool:
        """Whether this home keeps a listing cache: for its own store only (another --db may be written
        by other homes, which this one never hears of)."""
        return self.local == self.path and is_local(self.config.db_uri)

    def _listing(self) -> list[dict] | None:
        """The listing cache's rows as written (each with its lock's counts), or None."""
        try:
            data = json.loads(self._listing_path().read_bytes())
        except (OSError, ValueError):
            return None
        ok = isinstance(data, dict) and data.get("format") == self.LISTING_FORMAT
        return data["sessions"] if ok else None

    def _listed(self) -> dict | None:
        """The sessions as the listing cache holds them, or None unless it is current: nothing committed
        to the store's turns or pages since the cache was written, and every session lock of the home
        at the counts its row was written with (a lock that moved, or a row's lock gone, means turns
        came since). Its blind spot: sessions another home wrote into this home's own store (given it as
        --db) before this home last closed; homes that share a store should each be given it with --db."""
        if not self._listing_kept():
            return None
        path, db = self._listing_path(), Path(self.config.db_uri.removeprefix("file://"))
        try:
            written = path.stat().st_mtime_ns
            if any((db / f"{t}.lance" / "_versions").stat().st_mtime_ns > written
                   for t in ("turns", "pages", "state_changes")):
                return None
            listing = self._listing()
            if listing is None:
                return None
            locks = {p.name: _lock_counts(p) for p in (self.local / "locks").glob("*.lock")}
            rows = {}
            for r in listing:
                if locks.pop(self._lock_path(r["user"], r["session"]).name, None) != r["counts"]:
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
        if self.read_only or not isinstance(self._store, LanceStore) or not self._listing_kept():
            return   # nothing written here, or to a store of this process (memory_home) that no other reads
        listing = self._listing()
        if listing is None or any(r["counts"] is not None and _lock_counts(self._lock_path(r["user"], r["session"]))
                                  is None for r in listing):
            listing = []
            for r in self.store.sessions():
                counts = _lock_counts(self._lock_path(r["user"], r["session"]))
                if counts is None or (counts[0] == r["turns"] and not counts[2]):
                    listing.append({**self._with_tail(r), "counts": counts})
        rows = {(r["user"], r["session"]): r for r in listing}
        for s in sessions:
            counts = _lock_counts(self._lock_path(s.user, s.name))
            if s.begun and counts is not None and counts[0] == s.turn_count and not counts[2]:
                rows[s.key()] = {"user": s.user, "session": s.name, "turns": s.turn_count, "pages": s.page_count,
                                 "counts": counts}
        path = self._listing_path()
        try:
            path.parent.mkdir(exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"format": self.LISTING_FORMAT, "sessions": [rows[k] for k in sorted(rows)]},
                                      ensure_ascii=False))
            os.replace(tmp, path)
        except OSError:
            pass  # an optimisation; `pager sessions` reads the store

    # -- the one write path ------------------------------------------------------------------------------
    def accept(self, groups: dict, origin: str = "input") -> "Accepted":
        """Accept messages for one or more sessions ({Session: [message, …]}) as one transaction: every
        message of every session durable in one journal frame, or none. Returns {Session: [Turn, …]},
        one turn per message (a message whose key the session already holds gets that turn back)."""
        if self.read_only:
            raise StoreError("this home was opened read-only; open it without read_only to write")
        self._check_open()
        for s in groups:
            check_new_name(s)
        drafts = {s: [s.draft(m) for m in messages] for s, messages in groups.items()}  # refuse before taking
        order = sorted(drafts, key=lambda s: s.key())
        with self._mutex:
            with ExitStack() as stack:
                locks = {s: stack.enter_context(self.session_lock(s.user, s.name)) for s in order}
                for _ in range(self.PLAN_TRIES):   # planned again under a lease taken again (_lease_lapsed)
                    plans = {}
                    for s in order:
                        self._lease(s, locks[s])
                        s.sync(locks[s])
                        plans[s] = s.number(drafts[s], locks[s].last_turn)
                    written = [s for s in order if plans[s][0]]
                    if not self._lease_lapsed(written):
                        break
                else:
                    self._refuse_lapsed(written)
                ops: list[dict] = []
                for s in written:
                    locks[s].intend()
                    if not s.settled:  # the session's first transaction fixes how its pages are cut
                        ops.append({**s.settings(), "user": s.user, "session": s.name})
                    ops += [{"op": "turn", **t.to_dict()} for t in plans[s][0]]
                early = self._embed_early([t for s in written for t in plans[s][0]])
                try:
                    self.journal.append(ops)
                except BaseException:
                    for s in written:
                        locks[s].advance(locks[s].last_turn, 0)  # nothing was written: clean again
                    _vectors(early)   # wait for the embedding thread: nothing of this group stays anywhere
                    raise
                for s in written:
                    locks[s].advance(plans[s][0][-1].turn, len(plans[s][0]))
                    s.generation = locks[s].generation
                    s.settled = True
            # durable and numbered: the locks are free for others while this process packs; the embedding thread
            # may still be embedding, and each session waits for its vectors only when it embeds its
            # sealed pages, after packing (the embedder's native code runs beside the packing)
            for s in written:
                if early is not None:
                    s.embedding_early.append((early, [t.text for t in plans[s][0]]))
            for s in order:
                s.take_accepted(plans[s][0], origin)
            self.maybe_flush()
        return Accepted({s: plans[s][1] for s in order}, new={s: len(plans[s][0]) for s in order})

    def _check_open(self) -> None:
        """Refuse a write after close: the journal and the leases were let go of, and a write would open a
        journal again behind the close (accepted, and left for the next process to find)."""
        if self._closed:
            raise StoreError(f"this home ({self.path}) was closed (close() or the end of its `with` block); open a "
                             "new pager.Home(config) to write")
        if self._newer:
            raise NewerStore(self._newer)

    EARLY = 8   # turns in an accepted group from which their text is embedded while the journal syncs

    def _embed_early(self, turns: list):
        """The turns' texts embedded on another thread while this one waits for the journal's fsync
        (which releases the GIL): most of them are pieces of pages about to be sealed, and
        Session._embed_pending takes their vectors from here instead of embedding them again (the
        same vectors: an embedder embeds each text on its own). Only when the append waits for an
        fsync (not inside Journal.deferred), with an embedder already loaded, and a group large
        enough to pay for the hand-over; else None. The embedding thread does nothing else: token counts
        release the interpreter's lock for each turn, and queued before the embedding they kept it
        from starting until the packing they were for was done (BENCHMARKS.md, "Cost against a plain vector store")."""
        if not self.journal.syncs_on_append() or self._embedder is None or len(turns) < self.EARLY:
            return None
        texts = list(dict.fromkeys(t.text for t in turns))
        embedder = self._embedder
        return self._helper().submit(lambda: dict(zip(texts, embedder.embed(texts))))

    def _helper(self):
        """The embedding thread (made on first use; a forked child has none and makes its own)."""
        if self._early is None or self._early_pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            self._early = ThreadPoolExecutor(1, thread_name_prefix="pager-embed")
            self._early_pid = os.getpid()
        return self._early

    def journal_op(self, session, op) -> None:
        """Make one non-turn op (a bookmark, a pin, a state change) durable for a session. A callable
        builds the op under the lock after the session took in what other processes wrote (a state
        change is numbered after theirs); it returns None when there is nothing to write, or a list of
        ops to write in one frame (a batch of facts)."""
        self._check_open()
        check_new_name(session)
        with self._mutex, self.session_lock(session.user, session.name) as lock:
            for _ in range(self.PLAN_TRIES):   # built again under a lease taken again (_lease_lapsed)
                self._lease(session, lock)
                built = op
                if callable(op):
                    session.sync(lock)
                    built = op()
                    if not built:
                        return
                if not self._lease_lapsed([session]):
                    break
            else:
                self._refuse_lapsed([session])
            ops = built if isinstance(built, list) else [built]
            synced = session.generation == lock.generation   # it has read every op of the others
            lock.intend()
            try:
                self.journal.append([{**o, "user": session.user, "session": session.name} for o in ops])
            finally:
                lock.advance(lock.last_turn, len(ops))
            if synced:   # its own ops are no one else's to read (Session.sync counts those it reads)
                session.generation = lock.generation

    def _lease(self, s, lock: SessionLock) -> None:
        """Hold the session's lease (pager.lease) before writing it; when it was just taken, another home
        may have written the session since this one last did: take in what the store holds. A dead
        process's ops of the session that waited for the lease are recovered now, before a new turn is
        numbered (after them)."""
        if self.leases.ensure(s.user, s.name) or s.key() in self._lost:
            self._check_not_lost(s)
            s.catch_up()
        if self._kept and self.waiting(s.key()):
            self._recover_kept(s, lock)

    PLAN_TRIES = 3   # numberings of one write under a lease taken again before it is refused (_lease_lapsed)

    def _lease_lapsed(self, sessions) -> bool:
        """Whether a lease ran out between the lease check and the journal write (a claim or a catch-up the
        store answered slowly, a stall): records numbered under it may clash with another home's, which
        may have taken the session meanwhile. Nothing is written yet: the caller takes the lease again
        (and what another home wrote meanwhile) and numbers again, or refuses (_refuse_lapsed)."""
        return self.leases.applies() and any(self.leases.left(s.user, s.name) <= 0 for s in sessions)

    def _refuse_lapsed(self, sessions) -> None:
        for s in sessions:
            if self.leases.left(s.user, s.name) <= 0:
                raise LeaseLapsed(f"session {s.name!r}: this home's lease ran out before the message was written "
                                  f"(the store took longer than PAGER_LEASE_S, {self.config.lease_s:g} s, to answer); "
                                  "nothing of it was accepted: send it again, or raise PAGER_LEASE_S for a slow store")

    def _check_not_lost(self, s) -> None:
        """This home just took a session's lease it had held before it lapsed (a stall, a network cut
        off from the store): another home may have written the session meanwhile, numbering its own
        records over the ones this process acknowledged and had not yet flushed. If the store says so,
        those stay in this process's journal segment, which is kept when it closes, and the next
        process of this home recovers them after the last ones, as a dead process's (a flush would have
        lost them: the store keeps the first record of a number). Writes of the session are refused
        until then: this process numbered it from a past the store no longer holds."""
        key = s.key()
        if key not in self._lost:
            own = self.journal.path
            ops = [op for op in read_segment(own).ops if (op["user"], op["session"]) == key] if own else []
            if not ops:
                return
            self.store.refresh()
            if not self._contradicted(key, ops):
                return
            self._lost.add(key)
        raise StoreError(f"session {s.name!r}: this home's lease lapsed while it held acknowledged records not yet in "
                         "the store, and another home has since written the session at their numbers; they are "
                         "kept in this process's journal and stored after the last ones when this home opens it "
                         "next: restart this process (or run `pager migrate` once it has exited)")

    # -- locks ------------------------------------------------------------------------------------------
    def _lock_path(self, user: str, session: str) -> Path:
        digest = hashlib.sha256(f"{user}\x00{session}".encode()).hexdigest()[:32]
        return self.local / "locks" / f"{digest}.lock"

    @contextmanager
    def session_lock(self, user: str, session: str) -> Iterator[SessionLock]:
        """The session's lock: flock between processes, a mutex between threads, re-entrant in a thread."""
        key = (user, session)
        held = self._held.get(key)
        if held is not None and held.owner == threading.get_ident():
            held.depth += 1
            try:
                yield held
            finally:
                held.depth -= 1
            return
        with self._lock_mutexes.setdefault(key, threading.Lock()):
            path = self._lock_path(user, session)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise StoreError(f"cannot lock {path} ({exc}); check permissions on --home") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                lock = SessionLock(path, fd, *_read_counts(os.pread(fd, 64, 0)), owner=threading.get_ident())
                self._held[key] = lock
                try:
                    yield lock
                finally:
                    del self._held[key]
            finally:
                os.close(fd)  # closing releases the flock

    def read_counts(self, s) -> tuple[int, int]:
        """(durable last turn, generation) as the session's lock file says now, without locking."""
        counts = _read_counts_path(self._lock_path(s.user, s.name))
        return counts[:2] if counts else (0, 0)

    # -- durability -----------------------------------------------------------------------------------
    def maybe_flush(self) -> None:
        """Flush when the journal holds enough; a store that refuses is reported, not fatal: the
        records stay in the journal and the next flush (or the next process) writes them."""
        if self.journal.written < self.config.flush_turns:
            return
        try:
            self.flush()
            self.recover_dead()
        except StoreError as exc:
            for s in self.sessions.values():
                s.emit("store_error", error=str(exc))

    def recover_dead(self) -> int:
        """Recover the journal segments of this home's processes that died while this one runs (a
        `pager ingest` killed beside a `pager serve`), as the next process to start would (recover):
        their turns reach the store now, not at that start, and the leases this process holds can be
        given up when idle, which waits while another process's segment is there (_release_idle).
        Open sessions first take in what the segments hold (sync), with the events a replay reads;
        recovery's adoption is idempotent (turns and state changes, facts and summaries by number,
        bookmarks by uid), so it writes only what the store lacks. Returns the segments recovered."""
        if self.read_only or self._closing:
            return 0
        with self._mutex:
            # one waiting for another home's lease is recovered when this home next writes its session (_lease)
            dead = [path for path in self.journal.dead() if path not in self._kept]
            if not dead:
                return 0
            for s in list(self.sessions.values()):
                s.sync()
            # a session another home writes is recovered when this home next writes it
            self.recover(live=frozenset(self.sessions), wait=False)
            gone = [path.name for path in dead if not path.exists()]
            if gone:
                self.warn(f"recovered the journal {', '.join(gone)} of a process of this home that died: "
                          "everything it acknowledged is in the store")
            return len(gone)

    def flush(self) -> None:
        """Write every open session's pending turns, pages, bookmarks and page table in one batch,
        then start a new journal segment: everything in the old one is in the store."""
        if self.read_only:
            return
        with self._mutex:
            for attempt in range(1, self.PLAN_TRIES + 1):
                parts = {s: s.take_pending() for s in self.sessions.values()}
                try:
                    wrote = self._write_parts(parts)
                    break
                except Exception as exc:
                    # kept for the next try (the journal has them too, but its segment goes at the next
                    # flush that succeeds): a lease check the store could not answer loses nothing either
                    for s, part in parts.items():
                        s.pending = part.merged(s.pending)
                    if isinstance(exc, NewerStore):
                        self._newer = str(exc)   # no flush of this process can succeed: take nothing more in
                    if not isinstance(exc, LeaseLapsed) or attempt == self.PLAN_TRIES:
                        raise
                    # the fence stopped it: _write_parts takes the lease again (or finds another home took it,
                    # and holds the session's records back); what went in before the fence is not written twice
            if wrote:
                self.flushes += 1
                if self.flushes % self.config.compact_every == 0:
                    self.store.compact(self.config.keep_versions_s)
            if self.journal.written and not self._lost and not self._held_back:
                self.journal.rotate()

    def _write_parts(self, parts: dict) -> bool:
        """The flush's write of the parts sessions gave up (flush): those a lease allows, in one batch;
        whether there was one. A part left to another home (or kept in the journal for the next process)
        leaves `parts`."""
        for s, part in list(parts.items()):
            lost = s.key() in self._lost
            if not lost and (part.turns or part.bookmarks) and self.leases.applies():
                # held since they were accepted; refused if it lapsed. Renewed now, so the store write
                # has a whole lease to finish in before another home could take it over (and number over
                # what is being written), not what was left of one renewed up to lease_s/3 ago
                try:
                    fresh = self.leases.ensure(s.user, s.name, touch=False, trust_s=0.0)
                except LeaseHeld as exc:
                    # lost while the store was away: another home writes it now. Its records wait in the
                    # memory and the journal (kept) until the lease is this home's again; the other
                    # sessions are flushed meanwhile (a refusal here stopped every session's flush)
                    self._held_back.add(s.key())
                    self.warn(f"the acknowledged records of session {s.name!r} not yet in the store wait in this "
                              f"home's journal until it holds the session's lease again: {exc}")
                    s.pending = part.merged(s.pending)
                    del parts[s]
                    continue
                self._held_back.discard(s.key())
                if fresh:
                    try:
                        self._check_not_lost(s)
                    except StoreError as exc:
                        self.warn(str(exc))
                        lost = True
            if lost:   # kept in the journal for the next process of this home (_check_not_lost)
                s.pending = part.merged(s.pending)
                del parts[s]
            elif part and self.leases.applies() and (s.user, s.name) not in self.leases.held:
                try:  # pages sealed from what another home wrote: written by whoever holds the lease
                    self.leases.ensure(s.user, s.name, wait=False, touch=False)
                except LeaseHeld:
                    del parts[s]
        batch = Batch()
        for part in parts.values():
            batch.turns += part.turns
            batch.pages += part.pages
            batch.vectors += part.vectors
            batch.bookmarks += part.bookmarks
            batch.changes += part.changes
            batch.facts += part.facts
            batch.summaries += part.summaries
            batch.states.update(part.states)
        if batch:
            # Writers of one session take turns, and each writes against the latest version, so two
            # processes that sealed the same page (packing is deterministic) store it once.
            with ExitStack() as locks:
                for s in sorted(self.sessions.values(), key=lambda s: (s.user, s.name)):
                    locks.enter_context(self.session_lock(s.user, s.name))
                self.store.refresh()
                if self.leases.applies():
                    self.store.put(batch, fence=lambda: self._fence(parts))
                    self._verify_written(parts)
                else:
                    self.store.put(batch)
        return bool(batch)

    def _fence(self, parts: dict) -> None:
        """Called by the store before each commit of a flush: refuse it once a lease of the sessions
        written has run out by this home's clock (another home may have taken it since). The store has
        no fencing token: a write that lands after the lease lapsed (the store away, this process stalled
        between its lease check and the commit) may land beside another home's turns at the same
        numbers, or in their place. Not closed: a commit sent in time that the network holds past the
        lapse (see _verify_written for what is caught of it). No margin: on a store slower than a third
        of the lease, a margin refused every flush."""
        for s in [s for s, part in parts.items() if part]:
            left = self.leases.left(s.user, s.name)
            if left <= 0:
                raise LeaseLapsed(f"session {s.name!r}: this home's lease ran out while its flush was under way "
                                  f"(the store took longer than PAGER_LEASE_S, {self.config.lease_s:g} s, to answer); "
                                  "nothing accepted is lost: it stays in the journal and is written when the lease is "
                                  "held again; raise PAGER_LEASE_S for a slow store")

    def _verify_written(self, parts: dict) -> None:
        """After a flush: the store holds this home's turns at their numbers. Another home's may hold them
        instead (a stale writer's landed first and this one's were taken for written, or this one's was
        the stale write): the session's records are then kept in the journal as numbered over
        (_check_not_lost), for the next process to store after the last ones, not dropped."""
        for s, part in parts.items():
            key = s.key()
            ops = [{"op": "turn", **t.to_dict()} for t in part.turns if (t.user, t.session) == key]
            if ops and key not in self._lost and self._contradicted(key, ops):
                self._lost.add(key)
                self.warn(f"session {s.name!r}: another home stored its own turns at numbers this home's flush "
                          "also wrote (a write that outlasted its lease); this home's acknowledged records are kept "
                          "in its journal and stored after the last ones when this home opens it next: restart "
                          "this process (or run `pager migrate` once it has exited)")

    def _release_idle(self, keys: list[tuple[str, str]]) -> None:
        """Give up the leases of sessions this home has not written for lease_idle_s (called by the lease
        thread): flush first, so everything accepted is in the store for the next holder. Skipped while
        a write is under way (then the session is not idle) and while another live process of this home
        shares the leases (its journal may hold turns of the session not yet in the store)."""
        if not self._mutex.acquire(blocking=False):
            return
        try:
            if self._closing:
                return
            self.recover_dead()   # a dead process's segment would count as a live one below, for good
            if self._live_others():
                return
            self.flush()
            idle = set(self.leases.idle())  # under the mutex nothing was written since: still idle
            self.leases.give_up([key for key in keys if key in idle])
        finally:
            self._mutex.release()

    def recover_waiting(self) -> list[tuple[str, str]]:
        """Recover the dead processes' records that wait for another home's lease (recover) as soon as
        that lease is free, not at this home's next write of the session, which may never come: until
        then no host sees them, this one neither. The lease is taken only to store them and given back
        at once, so the home that writes the session is kept waiting for no longer than that. Called
        now and then by a long-running process (pager serve). Returns the sessions recovered."""
        if self.read_only or self._closing or not self._kept or not self._mutex.acquire(blocking=False):
            return []
        done = []
        try:
            for user, session in sorted({key for kept in self._kept.values() for key in kept.waiting}):
                if (user, session) in self.leases.held:
                    continue   # written here since: its write recovered them, or will
                try:
                    self.leases.ensure(user, session, wait=False, touch=False)
                except LeaseHeld:
                    continue   # still written elsewhere: tried again next time
                with self.session_lock(user, session) as lock:
                    s = self.open(session, user)
                    s.sync(lock)
                    self._recover_kept(s, lock)
                done.append((user, session))
            if done:
                self.flush()
                self.leases.give_up(done)
        finally:
            self._mutex.release()
        return done

    def _live_others(self) -> list[Path]:
        """The segments of other live processes of this home (a dead process's kept one is no sharer)."""
        return [path for path in self.journal.segments() if path not in self._kept]

    def recover(self, live: frozenset = frozenset(), wait: bool = True) -> int:
        """Write journal segments left by dead processes into the store; returns turns recovered.
        A segment goes only after its ops are in the store; one with damaged records is set aside.
        The sessions of a segment whose lease another home holds wait in self._kept (for up to
        lease_wait_s first when `wait`), and are recovered when this home takes their lease (_lease),
        before it numbers a turn of theirs. `live`: sessions this process has open, whose page
        table is its own (recover_dead): the dead process's pins are not applied to it."""
        count = 0
        with self._mutex:  # the mutex before any session lock, as everywhere
            for path, ops, damaged in self.journal.orphans():
                count += self._recover_segment(path, ops, damaged, self.journal, live, wait)
            if self.local != self.path:  # an older pager kept every store's journal in <home>/journal
                older = Journal(self.path / "journal", self.journal.fsync, report=self.warn, lazy=True)
                for path, ops, damaged in older.orphans(untagged=HOME_TAG):
                    self.warn(f"the journal {path.name} of a dead process of an older pager, which did not record "
                              f"its store, is recovered into {self.config.db_uri}")
                    count += self._recover_segment(path, ops, damaged, older, live, wait)
        return count

    def _recover_segment(self, path: Path, ops: list[dict], damaged: bool, journal: Journal, live: frozenset,
                         wait: bool) -> int:
        keys = {(op["user"], op["session"]) for op in ops}
        self._kept[path] = Kept(frozenset(keys), set(keys), damaged, journal)
        count = 0
        for user, session in sorted(keys):
            try:
                fresh = self.leases.ensure(user, session, wait=wait)
            except LeaseHeld as exc:
                self.warn(f"the journal {path.name} of a dead process holds turns of session {session!r}, which "
                          f"another home is writing; they are recovered when this home next writes it: {exc}")
                continue
            with self.session_lock(user, session) as lock:
                s = self.open(session, user)   # its sync does not read the segment (withheld)
                s.sync(lock)
                if fresh:
                    s.catch_up()
                count += self._recover_ops(s, lock, [op for op in ops if (op["user"], op["session"]) == (user, session)
                                                     and not (op["op"] == "pin" and (user, session) in live)])
        self._recovered(path)
        return count

    def _recover_ops(self, s, lock: "SessionLock", ops: list[dict]) -> int:
        """A dead process's ops of one session into the session (and so to the store at the next
        flush), under its lock and lease; returns the turns among them."""
        mine, moved, numbers, first = self._renumber_lost(s, ops)
        if moved:
            self.store.refresh()
            self.store.put(Batch(turns=[Turn.from_record(op) for op in moved]))
            s.catch_up()
        before = s.turn_count   # turns up to here are stored already (a restart before recovered them)
        s.adopt([op for op in mine if op["op"] in ("settings", "turn")])
        count = len(moved) + sum(1 for op in mine if op["op"] == "turn" and op["turn"] > before)
        # its state changes, facts, summaries, bookmarks and pins follow its turns (pager.recovery)
        s.adopt(follow(s, ops, numbers, first, self.store))
        last = max((op["turn"] for op in mine + moved if op["op"] == "turn"), default=0)
        lock.advance(last, 1)  # a dead writer may have died before it advanced the lock
        self._kept_key_done(s.key())
        return count

    def _kept_key_done(self, key: tuple[str, str]) -> None:
        for kept in self._kept.values():
            kept.waiting.discard(key)

    def _recovered(self, path: Path) -> None:
        """The segment's sessions recovered so far are flushed; the segment goes once all of them are."""
        self.flush()
        kept = self._kept[path]
        if kept.waiting:
            return
        del self._kept[path]
        if kept.damaged:
            kept.journal.set_aside(path)
        else:
            path.unlink(missing_ok=True)

    def withheld(self, key: tuple[str, str]) -> list[str]:
        """Dead processes' segments holding ops of the session that recovery writes (or will): the
        session's sync does not read them, or it would take their turns at numbers another home may
        have given other turns. A read-only home recovers nothing: it withholds the segments whose
        ops of the session the store contradicts (numbered_over)."""
        if self.read_only:
            return self.numbered_over(key)
        return [path.name for path, kept in self._kept.items() if key in kept.keys]

    def waiting(self, key: tuple[str, str]) -> bool:
        """Whether a dead process's ops of the session wait for this home to take its lease: until
        then the lock's last turn counts turns that are in no readable journal, not lost ones."""
        if self.read_only:
            return bool(self.numbered_over(key))
        return any(key in kept.waiting for kept in self._kept.values())

    def numbered_over(self, key: tuple[str, str]) -> list[str]:
        """The journal segments holding a turn (or a state change, fact or summary) of the session at a
        number the store holds for another one: a dead process's, numbered over by another home while
        its lease had lapsed. This home's next writer recovers them after the session's last records
        (Home._renumber_lost, pager.recovery); until then a reader shows none of their ops of the
        session, as the writer does, rather than some of them at numbers they will not keep."""
        names = []
        for path in self.journal.segments(own=True):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            cached = self._clashes.get((key, path.name))
            if cached is None or cached[0] != size:
                ops = [op for op in read_segment(path).ops if (op["user"], op["session"]) == key]
                cached = self._clashes[(key, path.name)] = (size, self._contradicted(key, ops))
            if cached[1]:
                names.append(path.name)
        if names:
            self.warn(f"the journal {', '.join(names)} of a dead process holds acknowledged records of session "
                      f"{key[1]!r} at numbers another home has since given its own; they are not shown until this "
                      "home writes the session again (`pager migrate` does), which keeps them after the last ones")
        return names

    def _contradicted(self, key: tuple[str, str], ops: list[dict]) -> bool:
        """Whether the store holds other records at the numbers of these ops (turns, state changes,
        facts, summaries)."""
        user, session = key
        turns = {op["turn"]: op for op in ops if op["op"] == "turn"}
        if turns:
            for t in self.store.turns(user, session, after=min(turns) - 1):
                op = turns.get(t.turn)
                if op is not None and (op["speaker"], op["text"]) != (t.speaker, t.text):
                    return True
        for kind, number, stored, same in (
                ("state", "seq", lambda: [(c.seq, (c.key, c.value, c.ts)) for c in self.store.state_changes(user, session)],
                 lambda op: (op["key"], op["value"], float(op["ts"]))),
                ("fact", "n", lambda: [(f.n, (f.text, f.ts)) for f in self.store.facts(user, session)],
                 lambda op: (op["text"], float(op["ts"]))),
                ("summary", "n", lambda: [(x.n, (x.text, x.ts)) for x in self.store.summaries(user, session)],
                 lambda op: (op["text"], float(op["ts"])))):
            mine = {op[number]: same(op) for op in ops if op["op"] == kind}
            if mine and any(n in mine and mine[n] != held for n, held in stored()):
                return True
        return False

    def _recover_kept(self, s, lock: "SessionLock") -> None:
        """Recover the dead processes' ops of a session this home just took the lease of."""
        s.catch_up()   # the lease may have been taken without it (a flush of sealed pages)
        for path in [path for path, kept in self._kept.items() if s.key() in kept.waiting]:
            try:
                ops = read_segment(path, 0, final=True).ops
            except FileNotFoundError:   # another process of this home recovered all of it
                del self._kept[path]
                continue
            count = self._recover_ops(s, lock, [op for op in ops if (op["user"], op["session"]) == s.key()])
            self.warn(f"{count} turns of session {s.name!r} that the dead process of journal {path.name} "
                      "acknowledged are recovered now that this home writes the session")
            self._recovered(path)

    def _renumber_lost(self, s, ops: list[dict]) -> tuple[list[dict], list[dict], dict[int, int], int]:
        """A dead process's turns that another home numbered over while the lease had lapsed (the same
        numbers hold other turns in the store) are kept after the session's last turn: the first lost
        one and every later one, in the order the dead process acknowledged them (moving only the lost
        ones put a question after its own answer), but for those filling numbers the store skipped.
        Returns (the ops to adopt as they are, the turn ops moved, renumbered, the number each of the
        dead turns from the first lost one on has now, that first lost turn)."""
        clash = [op for op in ops if op["op"] == "turn" and op["turn"] <= s.turn_count]
        if not clash:
            return ops, [], {}, 0
        stored = {t.turn: t for t in self.store.turns(s.user, s.name, after=min(op["turn"] for op in clash) - 1)}

        def held(op: dict) -> bool:  # the store holds this very turn at its number (not one that says the same)
            t = stored.get(op["turn"])
            return t is not None and (t.text, t.speaker, t.ts) == (op["text"], op["speaker"], op.get("ts", t.ts))

        lost = [op for op in clash if op["turn"] in stored and not held(op)]
        if not lost:
            return ops, [], {}, 0
        first = min(op["turn"] for op in lost)
        known = self.store.keys(s.user, s.name)
        # a recovery cut short may already have stored some of them after the last turn: not twice
        kept = {(t.speaker, t.text, t.ts): t.turn for t in stored.values()}
        base = last = max(stored)

        def hole(op: dict) -> bool:  # a number the store skipped: the turn that made it skip fills it
            return op["turn"] < last and op["turn"] not in stored

        moved, gone, numbers = [], set(), {}
        for op in sorted((op for op in ops if op["op"] == "turn" and op["turn"] >= first), key=lambda op: op["turn"]):
            numbers[op["turn"]] = op["turn"]
            if hole(op):
                continue
            gone.add(id(op))
            same = (op["speaker"], op["text"], op.get("ts", 0.0))
            if held(op) or (op.get("key") and op["key"] in known) or same in kept:
                # stored already (the other home took this very message in): it is stored once
                numbers[op["turn"]] = op["turn"] if held(op) else known.get(op.get("key") or "", kept.get(same, 0))
                continue
            base += 1
            moved.append({**op, "turn": base})
            numbers[op["turn"]] = base
        if moved:
            self.warn(f"{len(lost)} turns of session {s.name!r} from a dead process were numbered over by another "
                      f"home while their lease had lapsed; its turns from turn {first} on are kept after the last "
                      f"one, in the order acknowledged, as turns {last + 1}-{base}")
        return [op for op in ops if id(op) not in gone], moved, numbers, first

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
        if self._closed:
            return
        if self._early is not None:   # idle: accept waits for what it hands over
            if self._early_pid == os.getpid():
                self._early.shutdown()
            self._early = None
        if self.read_only:
            with self._mutex:
                self._closing = True
            self._closed = True
            return
        with self._mutex:
            self._closing = True  # the lease thread gives nothing up from here on: close releases all
        try:
            self.flush()
        except Exception:
            self.journal.close(remove=False)  # everything accepted stays in the journal for the next process
            self.leases.stop()  # and the lease lapses: this home's next process recovers the journal
            self._closed = True
            raise
        # another live process of this home (every one holds a journal segment) shares the leases: they
        # stay, renewed by it for the sessions it writes, lapsing for the others
        others = self._live_others() if self.leases.held else []
        # records numbered over, or waiting for a lease another home holds, are recovered by the next process
        self.journal.close(remove=not self._lost and not self._held_back)
        if others:
            self.leases.stop()
        else:
            self.leases.release()
        for s in self.sessions.values():
            if s.key() not in self._lost:   # numbered from a past the store no longer holds: cache nothing of it
                self.save_index(s)
                self.save_snapshot(s)
        self.save_listing([s for s in self.sessions.values() if s.key() not in self._lost])
        self._closed = True

    def __enter__(self) -> "Home":
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.close()
        else:
            # keep the journal: whatever was accepted is replayed by the next process (an empty one goes)
            self._abandon()


HOME_TAG = "-home"   # in the names of the home's own store's segments: one without it predates stores/


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


def _vectors(early) -> dict:
    """What Home._embed_early made, once it is done ({} if nothing; Session embeds as usual then)."""
    from .session import _early_vectors

    return {} if early is None else _early_vectors(early)


class Accepted(dict):
    """Home.accept's answer: {Session: [Turn, …]}, and in `new` how many of each were new."""

    def __init__(self, turns: dict, new: dict) -> None:
        super().__init__(turns)
        self.new = new


def _read_counts_path(path: Path) -> tuple[int, int, bool] | None:
    try:
        return _read_counts(path.read_bytes())
    except OSError:
        return None


def _lock_counts(path: Path) -> list | None:
    """A session lock's counts as the listing cache keeps them; None for no lock, or one never advanced."""
    counts = _read_counts_path(path)
    return None if counts is None or not any(counts) else [counts[0], counts[1], counts[2]]


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
    saved_changes: list = field(default_factory=list)   # the working state's changes
    saved_facts: list = field(default_factory=list)
    saved_summaries: list = field(default_factory=list)
    format: tuple = FORMAT
    fallback: Callable[[], Store] | None = None

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "fallback"}

    def state(self, user: str, session: str) -> dict | None:
        return self.saved_state

    def pages(self, user: str, session: str, after: int = 0, with_vectors: bool = True):
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

    def turns(self, user: str, session: str, after: int = 0) -> list:
        if after != self.after:  # only the open tail page's turns were kept
            return self._store().turns(user, session, after)
        return list(self.tail)

    def refresh(self) -> None:
        self._store().refresh()

    def _store(self) -> Store:
        assert self.fallback is not None, "a snapshot is read through Home._snapshot, which sets its fallback"
        return self.fallback()


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


def check_new_name(session) -> None:
    """Refuse the first write of a new session whose name could not be reached at /sessions/{name}
    (a turn, a state change, a bookmark: any of them makes the session), before anything is taken."""
    if not session.settled and session.turn_count == 0 and (problem := name_problem(session.name)):
        raise InputError(f"session name {session.name[:60]!r} {problem}")
