"""The engine behind `pager serve`: one Home shared by every request, and who may touch it when.

A Home and its sessions are not thread-safe (a flush takes every open session's pending
writes; the journal is one file), and the server runs engine work on worker threads so the
event loop never waits on LanceDB, the tokenizer or the embedder. Two locks keep that safe:

- a lock per session, held for a whole turn (the user's message, the agent loop, the reply),
  so turns of one session stay in order and a reply follows its question;
- the engine lock, held by whichever thread is inside the Home. It is let go only while a
  model is being called (`Unlocked`), so other sessions proceed while a provider thinks.

The order is always session lock, then engine lock; a thread holding the engine lock never
waits for a session lock, so the two cannot deadlock.

The bookmark or memory model is called by the engine's memory worker (pager/memory_worker.py), which
takes both locks only to make a call's prompt and to keep its answer, and neither while the model
answers: a reply hands its session's sealed pages over and is sent.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator, TypeVar

from .config import Config
from .home import Home
from .memory_worker import MemoryWorker
from .session import Session
from .trace import TraceWriter, begin, end, new_trace_path

T = TypeVar("T")
log = logging.getLogger("pager.serve")


class Unlocked:
    """A model whose calls let go of the engine lock (the thread still holds its session's lock)."""

    def __init__(self, model, lock: threading.Lock) -> None:
        self.model, self.lock = model, lock
        self.seconds = 0.0   # spent in the model, for the request log and the `pager` field of a reply
        self.waited = 0.0    # spent taking the engine lock back after the model answered

    def __getattr__(self, name: str):
        return getattr(self.model, name)

    def complete(self, messages: list[dict], tools: list[dict]):
        self.lock.release()
        started = time.perf_counter()
        try:
            return self.model.complete(messages, tools)
        finally:
            answered = time.perf_counter()
            self.seconds += answered - started
            self.lock.acquire()
            self.waited += time.perf_counter() - answered


class Engine:
    """One Home for every request: the locks, the sessions open in it and their traces.

    Sessions are opened on demand and closed again when idle (`idle_s`) or when more than
    `max_open` are open (the least recently used first), so memory does not grow with the
    sessions a server has seen. Closing flushes the session to the store and ends its trace;
    the next request opens it again from the store, with nothing lost. A session a request
    is using (its lock held or waited for) is never closed. The clock is injectable so tests
    can move time instead of waiting for it."""

    def __init__(self, config: Config, home: Home | None = None, max_open: int = 256, idle_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic, traces: bool = True) -> None:
        self.config = config
        self.home = home or Home(config)
        self.lock = threading.Lock()
        self.max_open, self.idle_s, self.clock, self.traces = max(1, max_open), idle_s, clock, traces
        self._locks: dict[tuple[str, str], list] = {}   # (tenant, name) → [lock, requests using it]
        self._locks_guard = threading.Lock()
        self._used: OrderedDict[tuple[str, str], float] = OrderedDict()   # open sessions, least recent first
        self._traces: dict[tuple[str, str], tuple[TraceWriter, int]] = {}  # a session's trace and its budget
        self.closed = 0   # sessions closed so far (idle or over max_open)
        self.memory = MemoryWorker(self)   # the bookmark or memory model's calls, off the request path
        self.home.memory_worker = self.memory

    @contextmanager
    def session_lock(self, tenant: str, name: str) -> Iterator[None]:
        """The session's lock; forgotten when no request uses it, so the locks do not pile up either."""
        key = (tenant, name)
        with self._locks_guard:
            entry = self._locks.setdefault(key, [threading.Lock(), 0])
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._locks_guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._locks[key]

    def busy(self, tenant: str, name: str) -> bool:
        """Whether a request holds or waits for the session's lock, or the memory worker has it in hand."""
        with self._locks_guard:
            if (tenant, name) in self._locks:
                return True
        return self.memory.holds(tenant, name)

    @contextmanager
    def using(self, tenant: str | None = None, name: str | None = None) -> Iterator[None]:
        """Hold the session's lock (when one is named), then the engine lock."""
        with ExitStack() as stack:
            if name is not None:
                stack.enter_context(self.session_lock(tenant or "", name))
            stack.enter_context(self.lock)
            yield

    def call(self, fn: Callable[..., T], *args, tenant: str | None = None, name: str | None = None) -> T:
        """Run fn on this thread with the locks held (for code already off the event loop); then close
        what is idle or over the limit."""
        with self.using(tenant, name):
            try:
                return fn(*args)
            finally:
                if name is not None:
                    self.flush_trace(tenant or "", name)
                try:
                    self.trim()
                except Exception:  # noqa: BLE001 - the request's own work is done; closing is tried again next time
                    log.exception("closing idle sessions failed; they stay open")

    async def run(self, fn: Callable[..., T], *args, tenant: str | None = None, name: str | None = None) -> T:
        """Run fn on a worker thread with the locks held; the event loop stays free."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(functools.partial(self.call, fn, *args, tenant=tenant, name=name))

    # -- under the engine lock ------------------------------------------------------------------------
    def flush_trace(self, tenant: str, name: str) -> None:
        """Write the session's events so far to its trace: one write per request, not one per event."""
        held = self._traces.get((tenant, name))
        if held is not None:
            held[0].flush()

    def open(self, tenant: str, name: str, trace: bool = False) -> Session:
        """The session, opened if it is not (trace: a request that writes it wants its trace running).
        Pages the stored session still owes the memory model (a restart, a failed call) go to it now."""
        s = self.home.open(name, user=tenant)
        if s.inherited:
            s.inherited = False
            if s.writer_due(force=True):
                self.memory.want(s, force=True)
        self._used[(tenant, name)] = self.clock()
        self._used.move_to_end((tenant, name))
        if trace and (tenant, name) not in self._traces:
            self.trace(s, "external", self.config.budget)
        return s

    def trace(self, s: Session, model: str, budget: int) -> None:
        """Keep a trace of the session running, as `pager chat` does: one file per time the session is
        open in this process (pager.trace.new_trace_path), replayable with `pager replay`. A turn at
        another budget (a model with a smaller window) starts a new trace, since a trace has one."""
        if not self.traces:
            return
        key = s.key()
        held = self._traces.get(key)
        if held is not None and (held[1] == budget or model == "external"):
            return
        if held is not None:
            self._end_trace(s)
        writer = TraceWriter(new_trace_path(self.home.path, s.user, s.name, "serve"),
                             note=f"pager serve session {s.name!r}", flush_each=False)
        s.events.listeners.append(writer)
        self._traces[key] = (writer, budget)
        begin(s, model, budget, agent_per_message=True)   # take_turn makes an Agent per message

    def _end_trace(self, s: Session) -> None:
        writer, _ = self._traces.pop(s.key(), (None, 0))
        if writer is None:
            return
        end(s)
        s.events.listeners.remove(writer)
        writer.close()

    def trim(self) -> list[tuple[str, str]]:
        """Close the sessions idle for idle_s, then the least recently used while more than max_open are
        open; a session a request is using stays. Returns the (tenant, name) closed."""
        now = self.clock()
        closing = [key for key, used in self._used.items() if now - used >= self.idle_s and not self.busy(*key)]
        over = len(self._used) - len(closing) - self.max_open
        for key in self._used:
            if over <= 0:
                break
            if key not in closing and not self.busy(*key):
                closing.append(key)
                over -= 1
        for key in closing:
            self.close_session(*key)
        self.home.recover_waiting()   # a dead process's turns that waited for another home's lease
        return closing

    def close_session(self, tenant: str, name: str) -> None:
        """End the session's trace, write what it holds to the store and let it go from memory. One that
        owes the memory model pages (fewer than a batch) is handed to the memory worker first, and closed
        by a later trim once the model named them (or failed to: they stay owed in the store)."""
        s = self.home.sessions.get((tenant, name))
        if s is not None and s.writer_due(force=True):
            self.memory.want(s, force=True)
            return
        if s is not None:
            self._end_trace(s)
            self.home.unload(tenant, name)   # if the store refuses, the session stays open (and listed)
            self.closed += 1
        self._used.pop((tenant, name), None)

    def exists(self, tenant: str, name: str) -> bool:
        """Whether the tenant has this session (open here, or in the store, other homes' too): turns, or a
        working state set before any turn, as `GET /sessions` lists it."""
        s = self.home.sessions.get((tenant, name))
        if s is not None and s.begun:
            return True
        self._look_again()
        return self.home.stored(tenant, name)

    def read(self, tenant: str, name: str) -> Session:
        """The session for a reader, with what other processes of this home made durable since and, unless
        this home is writing it (it holds the lease), what other homes flushed to the store."""
        s = self.open(tenant, name)
        s.sync()
        if self.home.leases.applies() and s.key() not in self.home.leases.held:
            s.follow()
        return s

    def sessions(self, tenant: str) -> list[dict]:
        """The tenant's sessions with turns and pages; the open ones as this process holds them, unless
        the store (other homes) holds more."""
        self._look_again()
        found = {r["session"]: r for r in self.home.session_rows(journals=False) if r["user"] == tenant}
        for (user, name), s in self.home.sessions.items():
            if user == tenant and s.begun and s.turn_count >= found.get(name, {}).get("turns", 0):
                found[name] = {"user": user, "session": name, "turns": s.turn_count, "pages": s.page_count}
        return [{"session": r["session"], "turns": r["turns"], "pages": r["pages"]} for _, r in sorted(found.items())]

    def _look_again(self) -> None:
        """See what other homes sharing the store flushed since this process last looked (LanceDB's tables
        stay at the version they were read at until asked)."""
        if self.home.leases.applies():
            self.home.store.refresh()

    def close(self) -> None:
        """Stop the memory worker without waiting for its model (what it still owes stays owed in the
        stored sessions, named when each is next opened), end the traces and close the home."""
        self.memory.stop()
        with self.lock:
            for key in list(self._traces):
                s = self.home.sessions.get(key)
                if s is not None:
                    self._end_trace(s)
            self.home.close()
