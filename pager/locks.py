"""The session locks of one home: a lock file per session, flock between processes, a mutex between
threads, re-entrant in a thread.

A lock file holds "last_turn generation [pending]": the durable last turn, a count of the journal
ops written (a reader knows when to look at the journals again), and "pending" from before a journal
write until after it, so the next holder knows a holder died in between. The lock files order the
processes of one home; leases (pager.lease) order the homes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from .errors import StoreError


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


class Locks:
    def __init__(self, local: Path) -> None:
        self.local = local   # the folder of this store's journal and locks (home.store_folder)
        self.held: dict[tuple[str, str], SessionLock] = {}
        self.mutexes: dict[tuple[str, str], threading.Lock] = {}

    def path(self, user: str, session: str) -> Path:
        digest = hashlib.sha256(f"{user}\x00{session}".encode()).hexdigest()[:32]
        return self.local / "locks" / f"{digest}.lock"

    @contextmanager
    def hold(self, user: str, session: str) -> Iterator[SessionLock]:
        """The session's lock: flock between processes, a mutex between threads, re-entrant in a thread."""
        key = (user, session)
        held = self.held.get(key)
        if held is not None and held.owner == threading.get_ident():
            held.depth += 1
            try:
                yield held
            finally:
                held.depth -= 1
            return
        with self.mutexes.setdefault(key, threading.Lock()):
            path = self.path(user, session)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise StoreError(f"cannot lock {path} ({exc}); check permissions on --home") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                lock = SessionLock(path, fd, *read_counts(os.pread(fd, 64, 0)), owner=threading.get_ident())
                self.held[key] = lock
                try:
                    yield lock
                finally:
                    del self.held[key]
            finally:
                os.close(fd)  # closing releases the flock

    def counts(self, s) -> tuple[int, int]:
        """(durable last turn, generation) as the session's lock file says now, without locking."""
        counts = read_counts_path(self.path(s.user, s.name))
        return counts[:2] if counts else (0, 0)


def read_counts(data: bytes) -> tuple[int, int, bool]:
    parts = data.split()
    try:
        return int(parts[0]), int(parts[1]), b"pending" in parts[2:]
    except (IndexError, ValueError):
        return 0, 0, False


def read_counts_path(path: Path) -> tuple[int, int, bool] | None:
    try:
        return read_counts(path.read_bytes())
    except OSError:
        return None


def lock_counts(path: Path) -> list | None:
    """A session lock's counts as the listing cache keeps them; None for no lock, or one never advanced."""
    counts = read_counts_path(path)
    return None if counts is None or not any(counts) else [counts[0], counts[1], counts[2]]
