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
"""

from __future__ import annotations

import functools
import threading
import time
from contextlib import ExitStack, contextmanager
from typing import Callable, Iterator, TypeVar

from .config import Config
from .home import Home
from .session import Session

T = TypeVar("T")


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
    def __init__(self, config: Config, home: Home | None = None) -> None:
        self.config = config
        self.home = home or Home(config)
        self.lock = threading.Lock()
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def session_lock(self, tenant: str, name: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault((tenant, name), threading.Lock())

    @contextmanager
    def using(self, tenant: str | None = None, name: str | None = None) -> Iterator[None]:
        """Hold the session's lock (when one is named), then the engine lock."""
        with ExitStack() as stack:
            if name is not None:
                stack.enter_context(self.session_lock(tenant or "", name))
            stack.enter_context(self.lock)
            yield

    def call(self, fn: Callable[..., T], *args, tenant: str | None = None, name: str | None = None) -> T:
        """Run fn on this thread with the locks held (for code already off the event loop)."""
        with self.using(tenant, name):
            return fn(*args)

    async def run(self, fn: Callable[..., T], *args, tenant: str | None = None, name: str | None = None) -> T:
        """Run fn on a worker thread with the locks held; the event loop stays free."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(functools.partial(self.call, fn, *args, tenant=tenant, name=name))

    # -- under the engine lock ------------------------------------------------------------------------
    def open(self, tenant: str, name: str) -> Session:
        return self.home.open(name, user=tenant)

    def exists(self, tenant: str, name: str) -> bool:
        """Whether the tenant has this session (open here, or with turns in the store)."""
        s = self.home.sessions.get((tenant, name))
        if s is not None and s.turn_count:
            return True
        return self.home.store.turn_count(tenant, name) > 0

    def sessions(self, tenant: str) -> list[dict]:
        """The tenant's sessions with turns and pages; the open ones as this process holds them."""
        found = {r["session"]: r for r in self.home.store.sessions() if r["user"] == tenant}
        for (user, name), s in self.home.sessions.items():
            if user == tenant and s.turn_count:
                found[name] = {"user": user, "session": name, "turns": s.turn_count, "pages": len(s.pages)}
        return [{"session": r["session"], "turns": r["turns"], "pages": r["pages"]} for _, r in sorted(found.items())]

    def close(self) -> None:
        with self.lock:
            self.home.close()
