"""`pager serve`'s memory model, off the request path: one thread per engine makes its calls.

A real memory model (a local one above all) takes tens of seconds per call. Made where a reply is
recorded, the call held the turn's session lock and the engine lock, so every other session's chat
call and the same user's next turn waited for it. Here a reply only hands the session over
(`Session.write_bookmarks` calls `want`), and the worker takes each call in three steps:

1. under the session's lock and the engine lock, briefly: the next batch of unwritten pages and its
   prompt (`Session.writer_call`; the pages move to `naming`);
2. with no lock: the model's answer;
3. under both locks again, briefly: the answer kept as any answer is (`Session.writer_answered`,
   the same events and journal ops as a call made inline, so `pager replay` feeds them back as
   before), or the failure said (`Session.writer_failed`: an event, the pages unwritten again).

A turn of the session can come between 1 and 3; its events and the answer's never interleave, since
each holds the session's lock. One thread, not one per session: a local model answers one call at a
time anyway, and its calls then never crowd out chat calls for the cores. Sessions take turns, one
call each, so a busy one does not keep the others' pages waiting.

What is owed survives the process: the stored session keeps its unwritten pages, a call's under way
among them (`Session.take_pending`), and the next open names them. So shutdown does not wait for the
model (`stop`): a call under way is abandoned, and its answer, if it comes, is not kept.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import Engine
    from .session import Session

log = logging.getLogger("pager.serve")


class MemoryWorker:
    """The thread that makes the bookmark or memory model's calls for the sessions of one engine."""

    def __init__(self, engine: "Engine") -> None:
        self.engine = engine
        self._wanted: dict[tuple[str, str], bool] = {}   # session → whether every batch is due (force)
        self._working: tuple[str, str] | None = None
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def want(self, s: "Session", force: bool = False) -> None:
        """The session has a call to make (called with its lock held); the thread starts on first use."""
        with self._changed:
            if self._stopped:
                return
            key = s.key()
            self._wanted[key] = self._wanted.get(key, False) or force
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="pager-memory-model", daemon=True)
                self._thread.start()
            self._changed.notify_all()

    def holds(self, tenant: str, name: str) -> bool:
        """Whether the session waits for the worker or is in its hands: it must stay open meanwhile."""
        with self._changed:
            return (tenant, name) in self._wanted or self._working == (tenant, name)

    def idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is wanted or under way; False if still busy after timeout seconds."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._wanted and self._working is None, timeout)

    def stop(self) -> None:
        """Take no more work; a call under way is left to finish alone, and its answer is not kept."""
        with self._changed:
            self._stopped = True
            self._wanted.clear()
            self._changed.notify_all()

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._wanted or self._stopped)
                if self._stopped:
                    self._working = None
                    self._changed.notify_all()
                    return
                key = next(iter(self._wanted))
                force = self._wanted.pop(key)
                self._working = key
            more = False
            try:
                more = self._name(key, force)
            except Exception:  # noqa: BLE001 - a bug; the pages stay unwritten and the next open names them
                log.exception("the memory model's work for session %r failed", key[1])
            finally:
                with self._changed:
                    if more and not self._stopped:   # behind the sessions waiting: one call each in turn
                        self._wanted[key] = self._wanted.get(key, False) or force
                    self._working = None
                    self._changed.notify_all()

    def _name(self, key: tuple[str, str], force: bool) -> bool:
        """One call for the session, if one is due; whether another is due after it."""
        call = self._locked(key, "writer_call") if self._locked(key, "writer_due", force) else None
        if call is None:
            return False
        try:
            reply = self.engine.home.writer.model.complete(call.messages, [])
        except Exception as exc:  # noqa: BLE001 - any provider failure: an event, the pages kept for later
            self._locked(key, "writer_failed", call, exc)
            return False
        self._locked(key, "writer_answered", call, reply)
        return bool(self._locked(key, "writer_due", force))

    def _locked(self, key: tuple[str, str], method: str, *args):
        """The session's `method(*args)` under its lock and the engine lock; None once stopped or if the
        session is no longer open (none is closed while in the worker's hands, but the server may stop)."""
        tenant, name = key
        with self.engine.using(tenant, name):
            s = self.engine.home.sessions.get(key)
            if self._stopped or s is None:
                return None
            try:
                return getattr(s, method)(*args)
            finally:
                self.engine.flush_trace(tenant, name)
