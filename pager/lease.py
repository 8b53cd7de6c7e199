"""Leases: one writer per session across hosts that share a store.

What is local and what lives in the store. Several hosts may run pager against one store
(`--db s3://…`), each with its own home. What a home keeps is its own: the journal (acknowledged
turns not yet flushed), the lock files (which serialize the processes of that one home), the
caches (index pickles, session snapshots) and the traces. What lives in the store is shared:
turns, pages, bookmarks, page-table states, the schema and migrations (`meta`) and the leases.

A lease is the right to write one session. It belongs to a home (host + home folder), so the
processes of one home share it (they already take turns through the lock files and read each
other's journals), and it names the process that last renewed it: `host:pid:home`. It is an
entry {holder, home, expires, seen} in the store's `leases` table, changed only by a
compare-and-swap on its row (LanceStore.swap_lease), so two hosts claiming at once cannot both
win. A home takes the lease before it writes a session (Home.accept, journal_op, flush,
recover) and a background thread renews it every lease_s/3 while it is in use. A lease is held
while the session is being written, not while it is open: once the home has not written the
session for idle_s (PAGER_LEASE_IDLE_S), the thread has the home flush (WritePath.release_idle, on a
thread of its own: the lease is renewed while the flush takes as long as the store does) and
gives the lease up, so a chat left open on one host does not keep the others from writing.
The next write takes it again and, since another home may have written meanwhile, reads what the
store holds before it numbers a turn. Close releases every lease after the closing flush, when
everything the home accepted is in the store. Another home is
refused with one line naming the holder, or waits up to lease_wait_s. A holder killed with
SIGKILL stops renewing: its lease lapses lease_s after it was last seen, and its journal is
recovered by its own home (once it can take the lease again): by a live process of that home at
its next flush or idle round (Home.recover_dead), else on restart.

Expiry compares the claimant's clock with the holder's: hosts need clocks that agree to well
within lease_s (NTP does).

The store's writes carry no fencing token, so a home fences itself by its own clock: nothing is
acknowledged (WritePath.lease_lapsed) and no flush commits (WritePath.fence) once its lease has run out,
and after a flush it checks that the store holds its turns at their numbers (WritePath.verify_written).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any, Callable

from .errors import LeaseHeld, PagerError

log = logging.getLogger("pager")


class Leases:
    """The leases this home holds, taken on demand and renewed in the background."""

    POLL_S = 0.1  # how often a waiting writer looks again: a hand-over costs about half of it, plus one read

    def __init__(self, store: Callable[[], object], home: str, lease_s: float, wait_s: float,
                 clock: Callable[[], float] = time.time, warn: Callable[[str], None] = log.warning,
                 idle_s: float = 0.0, on_idle: Callable[[list[tuple[str, str]]], None] | None = None) -> None:
        host = socket.gethostname()
        self.home = f"{host}:{home}"
        self.holder = f"{host}:{os.getpid()}:{home}"
        self.lease_s = lease_s
        self.wait_s = wait_s
        self.clock = clock
        self._store = store
        self._warn = warn
        self.held: dict[tuple[str, str], float] = {}   # (user, session) → when it was last renewed
        self.used: dict[tuple[str, str], float] = {}   # (user, session) → when this home last wrote it
        self.idle_s = idle_s                           # 0: held until the home closes
        self._on_idle = on_idle
        self._mutex = threading.Lock()
        self._round = threading.Lock()   # a renewal round; release waits for it, so nothing is re-taken after
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._idling: threading.Thread | None = None   # giving idle leases up (the home flushes first)

    def _swap(self, user: str, session: str, change):
        store = self._store()
        swap = getattr(store, "swap_lease", None)
        return None if swap is None else swap(user, session, change)

    def applies(self) -> bool:
        """Whether the store keeps leases (a store in memory is one process's alone)."""
        return hasattr(self._store(), "swap_lease")

    def _claim(self, user: str, session: str, now: float) -> tuple[dict | None, bool]:
        """Take or renew the lease, to expire lease_s after `now`: (None when it is ours now, else the
        other holder's entry; whether it was not this home's before, so another home may have written)."""

        def change(entry):
            if entry is None or entry["home"] == self.home or entry["expires"] < now:
                taken = entry is None or entry["home"] != self.home
                return {"holder": self.holder, "home": self.home, "expires": now + self.lease_s, "seen": now}, (None, taken)
            return entry, (entry, False)

        return self._swap(user, session, change) or (None, False)

    def ensure(self, user: str, session: str, wait: bool = True, touch: bool = True,
               trust_s: float | None = None) -> bool:
        """Hold the session's lease before writing it. Returns True when it was just taken (another
        home may have written the session since: read the store). Raises LeaseHeld when another home
        holds it and does not let go within lease_wait_s (or at once when wait is False). touch says
        the session is being written (the idle clock starts again); a flush does not touch. A lease
        renewed less than trust_s ago (lease_s/3 unless given) is not asked for again."""
        key = (user, session)
        if not self.applies():
            return False
        with self._mutex:
            if touch or key not in self.used:
                self.used[key] = self.clock()
            renewed = self.held.get(key)
        if renewed is not None and self.clock() - renewed < (self.lease_s / 3 if trust_s is None else trust_s):
            return False
        deadline = self.clock() + (self.wait_s if wait else 0)
        while True:
            # the lease runs from before the claim, not from when its commit came back (a slow store
            # took part of it): held counts from the same instant, so this home never trusts a lease
            # after the expiry other homes read
            now = self.clock()
            other, taken = self._claim(user, session, now)
            if other is None:
                with self._mutex:
                    # taken: it had lapsed and gone (another home may have held it and written meanwhile),
                    # though the renewal thread had not yet said so
                    fresh = key not in self.held or taken
                    self.held[key] = now
                self._start()
                return fresh
            with self._mutex:
                self.held.pop(key, None)  # lost it while stalled longer than the expiry
            left = deadline - self.clock()
            if left <= 0:
                raise LeaseHeld(self.refusal(session, other, self.wait_s if wait else 0.0))
            time.sleep(min(left, self.POLL_S))

    def left(self, user: str, session: str) -> float:
        """Seconds this home's lease of the session has left by its own clock (0 when it holds none)."""
        with self._mutex:
            renewed = self.held.get((user, session))
        return 0.0 if renewed is None else renewed + self.lease_s - self.clock()

    def refusal(self, session: str, entry: dict, waited: float = 0.0) -> str:
        now = self.clock()
        wait = (f"raise PAGER_LEASE_WAIT_S to wait longer (waited {waited:g} s)" if waited
                else "set PAGER_LEASE_WAIT_S to wait for it")
        return (f"session {session!r} is being written by {entry['holder']} (last seen {max(0.0, now - entry['seen']):.0f} s "
                f"ago); wait until it goes idle or closes, or its lease lapses in {max(0.0, entry['expires'] - now):.0f} s, "
                f"or {wait}")

    def release(self) -> None:
        """Give up every lease held (the home's closing flush put everything it accepted in the store)."""
        self._stop.set()
        with self._round, self._mutex:
            keys = list(self.held)
        for user, session in keys:
            try:
                self._swap(user, session, lambda e: (None if e and e["home"] == self.home else e, None))
            except PagerError as exc:
                self._warn(f"could not release the lease of session {session!r} ({exc}); it lapses in "
                           f"{self.lease_s:.0f} s")
            with self._mutex:
                self.held.pop((user, session), None)
                self.used.pop((user, session), None)

    def idle(self) -> list[tuple[str, str]]:
        """The leases held that this home has not used for idle_s (none when idle_s is 0)."""
        if not self.idle_s:
            return []
        now = self.clock()
        with self._mutex:
            return [key for key in self.held if now - self.used.get(key, now) >= self.idle_s]

    def give_up(self, keys: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """Release the leases of idle sessions whose writes are all in the store (the caller flushed,
        holding the home's write mutex, so nothing was written since). Returns the keys released."""
        given = []
        with self._round:   # between renewal rounds: a round never takes back a lease given up
            for user, session in keys:
                try:
                    self._swap(user, session, lambda e: (None if e and e["home"] == self.home else e, None))
                except PagerError as exc:
                    self._warn(f"could not give up the idle lease of session {session!r} ({exc}); trying again later")
                    continue
                with self._mutex:
                    self.held.pop((user, session), None)
                    self.used.pop((user, session), None)
                given.append((user, session))
        return given

    def stop(self) -> None:
        """Stop renewing without releasing (a crash path: the journal is kept, the lease lapses)."""
        self._stop.set()

    def _start(self) -> None:
        if self._thread is None and not self._stop.is_set():
            self._thread = threading.Thread(target=self._renew, name="pager-lease", daemon=True)
            self._thread.start()

    def _renew(self) -> None:
        every = self.lease_s / 3
        while not self._stop.wait(min(every, self.idle_s / 4) if self.idle_s else every):
            with self._round:
                if self._stop.is_set():
                    continue
                idle = self.idle()
                if idle and self._on_idle is not None and not (self._idling and self._idling.is_alive()):
                    # the home flushes before it gives a lease up, which takes as long as the store does: on a
                    # thread of its own, so this one goes on renewing. Were the lease to lapse under the flush,
                    # another home could take it and number over the turns being flushed.
                    self._idling = threading.Thread(target=self._give_up_idle, args=(idle,), name="pager-idle",
                                                    daemon=True)
                    self._idling.start()
                with self._mutex:
                    due = any(self.clock() - renewed >= 0.9 * every for renewed in self.held.values())
                if due:
                    self._renew_all()

    def _give_up_idle(self, idle: list[tuple[str, str]]) -> None:
        assert self._on_idle is not None
        try:
            self._on_idle(idle)
        except Exception as exc:  # noqa: BLE001 - kept, renewed, tried again next round
            self._warn(f"could not give up idle leases ({exc}); they stay held and renewed")

    def _renew_all(self) -> None:
        """Renew every lease held, one compare-and-swap per slot of the leases table."""
        store: Any = self._store()   # a LanceStore: only a store that keeps leases gets this far
        if getattr(store, "closed", False):
            return   # the process is exiting (or the home let go of the store): nothing to renew with
        with self._mutex:
            keys = list(self.held)
        slots: dict[int, list[tuple[str, str]]] = {}
        for key in keys:
            slots.setdefault(store._lease_slot(*key), []).append(key)
        for group in slots.values():
            now = self.clock()

            def change(entry, now=now):
                if entry is not None and entry["home"] == self.home:
                    return {"holder": self.holder, "home": self.home, "expires": now + self.lease_s, "seen": now}, None
                # gone (it lapsed, and another home may have held it since): lost, not renewed, so the next
                # write takes it as new and reads what the store holds first
                return entry, entry or {"holder": "no one (it had lapsed)"}

            try:
                results = store.swap_leases(group, change)
            except Exception as exc:  # noqa: BLE001 - a store hiccup: the next round tries again
                self._warn(f"could not renew the leases of sessions {', '.join(repr(s) for _, s in group)}: {exc}")
                continue
            for (user, session), other in results.items():
                with self._mutex:
                    if other is None and (user, session) in self.held:
                        self.held[(user, session)] = now   # when the renewed lease's time began (see ensure)
                    elif other is not None:
                        self.held.pop((user, session), None)
                if other is not None:
                    self._warn(f"lost the lease of session {session!r} to {other['holder']}; "
                               "the next write waits for it or is refused")
