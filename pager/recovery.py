"""Recovery: the journal segments of this home's processes that died, written into the store.

A segment goes only after its ops are in the store; one with damaged records is set aside. The
sessions of a segment whose lease another home holds wait (`kept`) and are recovered when this
home takes their lease, before it numbers a turn of theirs (WritePath.lease), or as soon as the
lease is free (`recover_waiting`, for a long-running process). A dead process's turns that another
home numbered over while its lease had lapsed are kept after the session's last turn
(`renumber_lost`), and its other ops follow them (pager.renumber).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import LeaseHeld
from .journal import Journal, read_segment
from .locks import SessionLock
from .page import Turn
from .renumber import follow
from .store import Batch

if TYPE_CHECKING:
    from .home import Home

HOME_TAG = "-home"   # in the names of the home's own store's segments: one without it predates stores/


@dataclass
class Kept:
    """A dead process's journal segment under recovery: its sessions, those still waiting for this
    home to take their lease, and where it goes when done."""
    keys: frozenset
    waiting: set
    damaged: bool
    journal: Journal


class Recovery:
    def __init__(self, home: "Home") -> None:
        self.home = home
        self.kept: dict[Path, Kept] = {}   # dead processes' segments being recovered (recover)
        self.clashes: dict[tuple, tuple[int, bool]] = {}   # (session, segment) → (its size, numbered over?)

    def recover_dead(self) -> int:
        """Recover the journal segments of this home's processes that died while this one runs (a
        `pager ingest` killed beside a `pager serve`), as the next process to start would (recover):
        their turns reach the store now, not at that start, and the leases this process holds can be
        given up when idle, which waits while another process's segment is there (release_idle).
        Open sessions first take in what the segments hold (sync), with the events a replay reads;
        recovery's adoption is idempotent (turns and state changes, facts and summaries by number,
        bookmarks by uid), so it writes only what the store lacks. Returns the segments recovered."""
        h = self.home
        if h.read_only or h.closing:
            return 0
        with h.mutex:
            # one waiting for another home's lease is recovered when this home next writes its session (lease)
            dead = [path for path in h.journal.dead() if path not in self.kept]
            if not dead:
                return 0
            for s in list(h.sessions.values()):
                s.sync()
            # a session another home writes is recovered when this home next writes it
            self.recover(live=frozenset(h.sessions), wait=False)
            gone = [path.name for path in dead if not path.exists()]
            if gone:
                h.warn(f"recovered the journal {', '.join(gone)} of a process of this home that died: "
                          "everything it acknowledged is in the store")
            return len(gone)

    def recover_waiting(self) -> list[tuple[str, str]]:
        """Recover the dead processes' records that wait for another home's lease (recover) as soon as
        that lease is free, not at this home's next write of the session, which may never come: until
        then no host sees them, this one neither. The lease is taken only to store them and given back
        at once, so the home that writes the session is kept waiting for no longer than that. Called
        now and then by a long-running process (pager serve). Returns the sessions recovered."""
        h = self.home
        if h.read_only or h.closing or not self.kept or not h.mutex.acquire(blocking=False):
            return []
        done = []
        try:
            for user, session in sorted({key for kept in self.kept.values() for key in kept.waiting}):
                if (user, session) in h.leases.held:
                    continue   # written here since: its write recovered them, or will
                try:
                    h.leases.ensure(user, session, wait=False, touch=False)
                except LeaseHeld:
                    continue   # still written elsewhere: tried again next time
                with h.locks.hold(user, session) as lock:
                    s = h.open(session, user)
                    s.sync(lock)
                    self.recover_kept(s, lock)
                done.append((user, session))
            if done:
                h.writes.flush()
                h.leases.give_up(done)
        finally:
            h.mutex.release()
        return done

    def live_others(self) -> list[Path]:
        """The segments of other live processes of this home (a dead process's kept one is no sharer)."""
        h = self.home
        return [path for path in h.journal.segments() if path not in self.kept]

    def recover(self, live: frozenset = frozenset(), wait: bool = True) -> int:
        """Write journal segments left by dead processes into the store; returns turns recovered.
        A segment goes only after its ops are in the store; one with damaged records is set aside.
        The sessions of a segment whose lease another home holds wait in self.kept (for up to
        lease_wait_s first when `wait`), and are recovered when this home takes their lease (lease),
        before it numbers a turn of theirs. `live`: sessions this process has open, whose page
        table is its own (recover_dead): the dead process's pins are not applied to it."""
        h = self.home
        count = 0
        with h.mutex:  # the mutex before any session lock, as everywhere
            for path, ops, damaged in h.journal.orphans():
                count += self.recover_segment(path, ops, damaged, h.journal, live, wait)
            if h.local != h.path:  # an older pager kept every store's journal in <home>/journal
                older = Journal(h.path / "journal", h.journal.fsync, report=h.warn, lazy=True)
                for path, ops, damaged in older.orphans(untagged=HOME_TAG):
                    h.warn(f"the journal {path.name} of a dead process of an older pager, which did not record "
                              f"its store, is recovered into {h.config.db_uri}")
                    count += self.recover_segment(path, ops, damaged, older, live, wait)
        return count

    def recover_segment(self, path: Path, ops: list[dict], damaged: bool, journal: Journal, live: frozenset,
                         wait: bool) -> int:
        h = self.home
        keys = {(op["user"], op["session"]) for op in ops}
        self.kept[path] = Kept(frozenset(keys), set(keys), damaged, journal)
        count = 0
        for user, session in sorted(keys):
            try:
                fresh = h.leases.ensure(user, session, wait=wait)
            except LeaseHeld as exc:
                h.warn(f"the journal {path.name} of a dead process holds turns of session {session!r}, which "
                          f"another home is writing; they are recovered when this home next writes it: {exc}")
                continue
            with h.locks.hold(user, session) as lock:
                s = h.open(session, user)   # its sync does not read the segment (withheld)
                s.sync(lock)
                if fresh:
                    s.catch_up()
                count += self.recover_ops(s, lock, [op for op in ops if (op["user"], op["session"]) == (user, session)
                                                     and not (op["op"] == "pin" and (user, session) in live)])
        self.recovered(path)
        return count

    def recover_ops(self, s, lock: "SessionLock", ops: list[dict]) -> int:
        """A dead process's ops of one session into the session (and so to the store at the next
        flush), under its lock and lease; returns the turns among them."""
        h = self.home
        mine, moved, numbers, first = self.renumber_lost(s, ops)
        if moved:
            h.store.refresh()
            h.store.put(Batch(turns=[Turn.from_record(op) for op in moved]))
            s.catch_up()
        before = s.turn_count   # turns up to here are stored already (a restart before recovered them)
        s.adopt([op for op in mine if op["op"] in ("settings", "turn")])
        count = len(moved) + sum(1 for op in mine if op["op"] == "turn" and op["turn"] > before)
        # its state changes, facts, summaries, bookmarks and pins follow its turns (pager.recovery)
        s.adopt(follow(s, ops, numbers, first, h.store))
        last = max((op["turn"] for op in mine + moved if op["op"] == "turn"), default=0)
        lock.advance(last, 1)  # a dead writer may have died before it advanced the lock
        self.key_done(s.key())
        return count

    def key_done(self, key: tuple[str, str]) -> None:
        for kept in self.kept.values():
            kept.waiting.discard(key)

    def recovered(self, path: Path) -> None:
        """The segment's sessions recovered so far are flushed; the segment goes once all of them are."""
        h = self.home
        h.writes.flush()
        kept = self.kept[path]
        if kept.waiting:
            return
        del self.kept[path]
        if kept.damaged:
            kept.journal.set_aside(path)
        else:
            path.unlink(missing_ok=True)

    def withheld(self, key: tuple[str, str]) -> list[str]:
        """Dead processes' segments holding ops of the session that recovery writes (or will): the
        session's sync does not read them, or it would take their turns at numbers another home may
        have given other turns. A read-only home recovers nothing: it withholds the segments whose
        ops of the session the store contradicts (numbered_over)."""
        h = self.home
        if h.read_only:
            return self.numbered_over(key)
        return [path.name for path, kept in self.kept.items() if key in kept.keys]

    def waiting(self, key: tuple[str, str]) -> bool:
        """Whether a dead process's ops of the session wait for this home to take its lease: until
        then the lock's last turn counts turns that are in no readable journal, not lost ones."""
        h = self.home
        if h.read_only:
            return bool(self.numbered_over(key))
        return any(key in kept.waiting for kept in self.kept.values())

    def numbered_over(self, key: tuple[str, str]) -> list[str]:
        """The journal segments holding a turn (or a state change, fact or summary) of the session at a
        number the store holds for another one: a dead process's, numbered over by another home while
        its lease had lapsed. This home's next writer recovers them after the session's last records
        (Recovery.renumber_lost, pager.recovery); until then a reader shows none of their ops of the
        session, as the writer does, rather than some of them at numbers they will not keep."""
        h = self.home
        names = []
        for path in h.journal.segments(own=True):
            try:
                size = path.stat().st_size
            except OSError:
                continue
            cached = self.clashes.get((key, path.name))
            if cached is None or cached[0] != size:
                ops = [op for op in read_segment(path).ops if (op["user"], op["session"]) == key]
                cached = self.clashes[(key, path.name)] = (size, self.contradicted(key, ops))
            if cached[1]:
                names.append(path.name)
        if names:
            h.warn(f"the journal {', '.join(names)} of a dead process holds acknowledged records of session "
                      f"{key[1]!r} at numbers another home has since given its own; they are not shown until this "
                      "home writes the session again (`pager migrate` does), which keeps them after the last ones")
        return names

    def contradicted(self, key: tuple[str, str], ops: list[dict]) -> bool:
        """Whether the store holds other records at the numbers of these ops (turns, state changes,
        facts, summaries)."""
        h = self.home
        user, session = key
        turns = {op["turn"]: op for op in ops if op["op"] == "turn"}
        if turns:
            for t in h.store.turns(user, session, after=min(turns) - 1):
                op = turns.get(t.turn)
                if op is not None and (op["speaker"], op["text"]) != (t.speaker, t.text):
                    return True
        for kind, number, stored, same in (
                ("state", "seq", lambda: [(c.seq, (c.key, c.value, c.ts)) for c in h.store.state_changes(user, session)],
                 lambda op: (op["key"], op["value"], float(op["ts"]))),
                ("fact", "n", lambda: [(f.n, (f.text, f.ts)) for f in h.store.facts(user, session)],
                 lambda op: (op["text"], float(op["ts"]))),
                ("summary", "n", lambda: [(x.n, (x.text, x.ts)) for x in h.store.summaries(user, session)],
                 lambda op: (op["text"], float(op["ts"])))):
            mine = {op[number]: same(op) for op in ops if op["op"] == kind}
            if mine and any(n in mine and mine[n] != held for n, held in stored()):
                return True
        return False

    def recover_kept(self, s, lock: "SessionLock") -> None:
        """Recover the dead processes' ops of a session this home just took the lease of."""
        h = self.home
        s.catch_up()   # the lease may have been taken without it (a flush of sealed pages)
        for path in [path for path, kept in self.kept.items() if s.key() in kept.waiting]:
            try:
                ops = read_segment(path, 0, final=True).ops
            except FileNotFoundError:   # another process of this home recovered all of it
                del self.kept[path]
                continue
            count = self.recover_ops(s, lock, [op for op in ops if (op["user"], op["session"]) == s.key()])
            h.warn(f"{count} turns of session {s.name!r} that the dead process of journal {path.name} "
                      "acknowledged are recovered now that this home writes the session")
            self.recovered(path)

    def renumber_lost(self, s, ops: list[dict]) -> tuple[list[dict], list[dict], dict[int, int], int]:
        """A dead process's turns that another home numbered over while the lease had lapsed (the same
        numbers hold other turns in the store) are kept after the session's last turn: the first lost
        one and every later one, in the order the dead process acknowledged them (moving only the lost
        ones put a question after its own answer), but for those filling numbers the store skipped.
        Returns (the ops to adopt as they are, the turn ops moved, renumbered, the number each of the
        dead turns from the first lost one on has now, that first lost turn)."""
        h = self.home
        clash = [op for op in ops if op["op"] == "turn" and op["turn"] <= s.turn_count]
        if not clash:
            return ops, [], {}, 0
        stored = {t.turn: t for t in h.store.turns(s.user, s.name, after=min(op["turn"] for op in clash) - 1)}

        def held(op: dict) -> bool:  # the store holds this very turn at its number (not one that says the same)
            t = stored.get(op["turn"])
            return t is not None and (t.text, t.speaker, t.ts) == (op["text"], op["speaker"], op.get("ts", t.ts))

        lost = [op for op in clash if op["turn"] in stored and not held(op)]
        if not lost:
            return ops, [], {}, 0
        first = min(op["turn"] for op in lost)
        known = h.store.keys(s.user, s.name)
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
            h.warn(f"{len(lost)} turns of session {s.name!r} from a dead process were numbered over by another "
                      f"home while their lease had lapsed; its turns from turn {first} on are kept after the last "
                      f"one, in the order acknowledged, as turns {last + 1}-{base}")
        return [op for op in ops if id(op) not in gone], moved, numbers, first
