"""The one write path of a home: nothing acknowledged is lost.

`accept`: under the locks of the sessions written (taken in a fixed order), each session first
takes in everything other processes made durable (their journal segments, then the store),
numbers the new turns after the durable last turn, and the whole group is written to the journal
as one frame and fsync'd; only then are the locks advanced and the turns packed onto pages.
`journal_op` does the same for one other record (a bookmark, a pin, a state change, facts).
`flush` writes what the sessions hold to the store in one batch and starts a new journal segment.

Several homes may write one store: a session is written by one home at a time, under its lease
(pager.lease). A write numbered under a lease that ran out before it reached the journal is
numbered again (`lease_lapsed`); a flush checks the lease before each commit (`fence`) and after
it compares what the store holds with what it wrote (`verify_written`); records another home
numbered over are kept in the journal for the next process of this home (`check_not_lost`).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from .config import name_problem
from .errors import InputError, LeaseHeld, LeaseLapsed, NewerStore, StoreError
from .journal import read_segment
from .locks import SessionLock
from .store import Batch

if TYPE_CHECKING:
    from .home import Home


class WritePath:
    def __init__(self, home: "Home") -> None:
        self.home = home
        self.early: Any = None            # the thread that embeds while the journal syncs (embed_early)
        self.early_pid = 0
        self.lost: set[tuple[str, str]] = set()   # sessions whose unflushed records another home numbered over
        self.held_back: set[tuple[str, str]] = set()   # sessions whose records wait for a lease another home took
        self.newer = ""   # why writes are refused: a newer pager migrated the store under this process (flush)
        self.flushes = 0

    def accept(self, groups: dict, origin: str = "input") -> "Accepted":
        """Accept messages for one or more sessions ({Session: [message, …]}) as one transaction: every
        message of every session durable in one journal frame, or none. Returns {Session: [Turn, …]},
        one turn per message (a message whose key the session already holds gets that turn back)."""
        h = self.home
        if h.read_only:
            raise StoreError("this home was opened read-only; open it without read_only to write")
        self.check_open()
        for s in groups:
            check_new_name(s)
        drafts = {s: [s.draft(m) for m in messages] for s, messages in groups.items()}  # refuse before taking
        order = sorted(drafts, key=lambda s: s.key())
        with h.mutex:
            with ExitStack() as stack:
                locks = {s: stack.enter_context(h.locks.hold(s.user, s.name)) for s in order}
                for _ in range(self.PLAN_TRIES):   # planned again under a lease taken again (lease_lapsed)
                    plans = {}
                    for s in order:
                        self.lease(s, locks[s])
                        s.sync(locks[s])
                        plans[s] = s.number(drafts[s], locks[s].last_turn)
                    written = [s for s in order if plans[s][0]]
                    if not self.lease_lapsed(written):
                        break
                else:
                    self.refuse_lapsed(written)
                ops: list[dict] = []
                for s in written:
                    locks[s].intend()
                    if not s.settled:  # the session's first transaction fixes how its pages are cut
                        ops.append({**s.settings(), "user": s.user, "session": s.name})
                    ops += [{"op": "turn", **t.to_dict()} for t in plans[s][0]]
                early = self.embed_early([t for s in written for t in plans[s][0]])
                try:
                    h.journal.append(ops)
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

    def check_open(self) -> None:
        """Refuse a write after close: the journal and the leases were let go of, and a write would open a
        journal again behind the close (accepted, and left for the next process to find)."""
        h = self.home
        if h.closed:
            raise StoreError(f"this home ({h.path}) was closed (close() or the end of its `with` block); open a "
                             "new pager.Home(config) to write")
        if self.newer:
            raise NewerStore(self.newer)

    EARLY = 8   # turns in an accepted group from which their text is embedded while the journal syncs

    def embed_early(self, turns: list):
        """The turns' texts embedded on another thread while this one waits for the journal's fsync
        (which releases the GIL): most of them are pieces of pages about to be sealed, and
        Intake.embed_pending takes their vectors from here instead of embedding them again (the
        same vectors: an embedder embeds each text on its own). Only when the append waits for an
        fsync (not inside Journal.deferred), with an embedder already loaded, and a group large
        enough to pay for the hand-over; else None. The embedding thread does nothing else: token counts
        release the interpreter's lock for each turn, and queued before the embedding they kept it
        from starting until the packing they were for was done (BENCHMARKS.md, "Cost against a plain vector store")."""
        h = self.home
        if not h.journal.syncs_on_append() or h.loaded_embedder is None or len(turns) < self.EARLY:
            return None
        texts = list(dict.fromkeys(t.text for t in turns))
        embedder = h.loaded_embedder
        return self.embedding_thread().submit(lambda: dict(zip(texts, embedder.embed(texts))))

    def embedding_thread(self):
        """The embedding thread (made on first use; a forked child has none and makes its own)."""
        if self.early is None or self.early_pid != os.getpid():
            from concurrent.futures import ThreadPoolExecutor

            self.early = ThreadPoolExecutor(1, thread_name_prefix="pager-embed")
            self.early_pid = os.getpid()
        return self.early

    def journal_op(self, session, op) -> None:
        """Make one non-turn op (a bookmark, a pin, a state change) durable for a session. A callable
        builds the op under the lock after the session took in what other processes wrote (a state
        change is numbered after theirs); it returns None when there is nothing to write, or a list of
        ops to write in one frame (a batch of facts)."""
        h = self.home
        self.check_open()
        check_new_name(session)
        with h.mutex, h.locks.hold(session.user, session.name) as lock:
            for _ in range(self.PLAN_TRIES):   # built again under a lease taken again (lease_lapsed)
                self.lease(session, lock)
                built = op
                if callable(op):
                    session.sync(lock)
                    built = op()
                    if not built:
                        return
                if not self.lease_lapsed([session]):
                    break
            else:
                self.refuse_lapsed([session])
            ops = built if isinstance(built, list) else [built]
            synced = session.generation == lock.generation   # it has read every op of the others
            lock.intend()
            try:
                h.journal.append([{**o, "user": session.user, "session": session.name} for o in ops])
            finally:
                lock.advance(lock.last_turn, len(ops))
            if synced:   # its own ops are no one else's to read (Session.sync counts those it reads)
                session.generation = lock.generation

    def lease(self, s, lock: SessionLock) -> None:
        """Hold the session's lease (pager.lease) before writing it; when it was just taken, another home
        may have written the session since this one last did: take in what the store holds. A dead
        process's ops of the session that waited for the lease are recovered now, before a new turn is
        numbered (after them)."""
        h = self.home
        if h.leases.ensure(s.user, s.name) or s.key() in self.lost:
            self.check_not_lost(s)
            s.catch_up()
        if h.recovery.kept and h.recovery.waiting(s.key()):
            h.recovery.recover_kept(s, lock)

    PLAN_TRIES = 3   # numberings of one write under a lease taken again before it is refused (lease_lapsed)

    def lease_lapsed(self, sessions) -> bool:
        """Whether a lease ran out between the lease check and the journal write (a claim or a catch-up the
        store answered slowly, a stall): records numbered under it may clash with another home's, which
        may have taken the session meanwhile. Nothing is written yet: the caller takes the lease again
        (and what another home wrote meanwhile) and numbers again, or refuses (refuse_lapsed)."""
        h = self.home
        return h.leases.applies() and any(h.leases.left(s.user, s.name) <= 0 for s in sessions)

    def refuse_lapsed(self, sessions) -> None:
        h = self.home
        for s in sessions:
            if h.leases.left(s.user, s.name) <= 0:
                raise LeaseLapsed(f"session {s.name!r}: this home's lease ran out before the message was written "
                                  f"(the store took longer than PAGER_LEASE_S, {h.config.lease_s:g} s, to answer); "
                                  "nothing of it was accepted: send it again, or raise PAGER_LEASE_S for a slow store")

    def check_not_lost(self, s) -> None:
        """This home just took a session's lease it had held before it lapsed (a stall, a network cut
        off from the store): another home may have written the session meanwhile, numbering its own
        records over the ones this process acknowledged and had not yet flushed. If the store says so,
        those stay in this process's journal segment, which is kept when it closes, and the next
        process of this home recovers them after the last ones, as a dead process's (a flush would have
        lost them: the store keeps the first record of a number). Writes of the session are refused
        until then: this process numbered it from a past the store no longer holds."""
        h = self.home
        key = s.key()
        if key not in self.lost:
            own = h.journal.path
            ops = [op for op in read_segment(own).ops if (op["user"], op["session"]) == key] if own else []
            if not ops:
                return
            h.store.refresh()
            if not h.recovery.contradicted(key, ops):
                return
            self.lost.add(key)
        raise StoreError(f"session {s.name!r}: this home's lease lapsed while it held acknowledged records not yet in "
                         "the store, and another home has since written the session at their numbers; they are "
                         "kept in this process's journal and stored after the last ones when this home opens it "
                         "next: restart this process (or run `pager migrate` once it has exited)")

    def maybe_flush(self) -> None:
        """Flush when the journal holds enough; a store that refuses is reported, not fatal: the
        records stay in the journal and the next flush (or the next process) writes them."""
        h = self.home
        if h.journal.written < h.config.flush_turns:
            return
        try:
            self.flush()
            h.recovery.recover_dead()
        except StoreError as exc:
            for s in h.sessions.values():
                s.emit("store_error", error=str(exc))

    def flush(self) -> None:
        """Write every open session's pending turns, pages, bookmarks and page table in one batch,
        then start a new journal segment: everything in the old one is in the store."""
        h = self.home
        if h.read_only:
            return
        with h.mutex:
            for attempt in range(1, self.PLAN_TRIES + 1):
                parts = {s: s.take_pending() for s in h.sessions.values()}
                try:
                    wrote = self.write_parts(parts)
                    break
                except Exception as exc:
                    # kept for the next try (the journal has them too, but its segment goes at the next
                    # flush that succeeds): a lease check the store could not answer loses nothing either
                    for s, part in parts.items():
                        s.pending = part.merged(s.pending)
                    if isinstance(exc, NewerStore):
                        self.newer = str(exc)   # no flush of this process can succeed: take nothing more in
                    if not isinstance(exc, LeaseLapsed) or attempt == self.PLAN_TRIES:
                        raise
                    # the fence stopped it: _write_parts takes the lease again (or finds another home took it,
                    # and holds the session's records back); what went in before the fence is not written twice
            if wrote:
                self.flushes += 1
                if self.flushes % h.config.compact_every == 0:
                    h.store.compact(h.config.keep_versions_s)
            if h.journal.written and not self.lost and not self.held_back:
                h.journal.rotate()

    def write_parts(self, parts: dict) -> bool:
        """The flush's write of the parts sessions gave up (flush): those a lease allows, in one batch;
        whether there was one. A part left to another home (or kept in the journal for the next process)
        leaves `parts`."""
        h = self.home
        for s, part in list(parts.items()):
            lost = s.key() in self.lost
            if not lost and (part.turns or part.bookmarks) and h.leases.applies():
                # held since they were accepted; refused if it lapsed. Renewed now, so the store write
                # has a whole lease to finish in before another home could take it over (and number over
                # what is being written), not what was left of one renewed up to lease_s/3 ago
                try:
                    fresh = h.leases.ensure(s.user, s.name, touch=False, trust_s=0.0)
                except LeaseHeld as exc:
                    # lost while the store was away: another home writes it now. Its records wait in the
                    # memory and the journal (kept) until the lease is this home's again; the other
                    # sessions are flushed meanwhile (a refusal here stopped every session's flush)
                    self.held_back.add(s.key())
                    h.warn(f"the acknowledged records of session {s.name!r} not yet in the store wait in this "
                              f"home's journal until it holds the session's lease again: {exc}")
                    s.pending = part.merged(s.pending)
                    del parts[s]
                    continue
                self.held_back.discard(s.key())
                if fresh:
                    try:
                        self.check_not_lost(s)
                    except StoreError as exc:
                        h.warn(str(exc))
                        lost = True
            if lost:   # kept in the journal for the next process of this home (check_not_lost)
                s.pending = part.merged(s.pending)
                del parts[s]
            elif part and h.leases.applies() and (s.user, s.name) not in h.leases.held:
                try:  # pages sealed from what another home wrote: written by whoever holds the lease
                    h.leases.ensure(s.user, s.name, wait=False, touch=False)
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
            batch.vectored += part.vectored
            batch.states.update(part.states)
        if batch:
            # Writers of one session take turns, and each writes against the latest version, so two
            # processes that sealed the same page (packing is deterministic) store it once.
            with ExitStack() as locks:
                for s in sorted(h.sessions.values(), key=lambda s: (s.user, s.name)):
                    locks.enter_context(h.locks.hold(s.user, s.name))
                h.store.refresh()
                if h.leases.applies():
                    h.store.put(batch, fence=lambda: self.fence(parts))
                    self.verify_written(parts)
                else:
                    h.store.put(batch)
        return bool(batch)

    def fence(self, parts: dict) -> None:
        """Called by the store before each commit of a flush: refuse it once a lease of the sessions
        written has run out by this home's clock (another home may have taken it since). The store has
        no fencing token: a write that lands after the lease lapsed (the store away, this process stalled
        between its lease check and the commit) may land beside another home's turns at the same
        numbers, or in their place. Not closed: a commit sent in time that the network holds past the
        lapse (see verify_written for what is caught of it). No margin: on a store slower than a third
        of the lease, a margin refused every flush."""
        h = self.home
        for s in [s for s, part in parts.items() if part]:
            left = h.leases.left(s.user, s.name)
            if left <= 0:
                raise LeaseLapsed(f"session {s.name!r}: this home's lease ran out while its flush was under way "
                                  f"(the store took longer than PAGER_LEASE_S, {h.config.lease_s:g} s, to answer); "
                                  "nothing accepted is lost: it stays in the journal and is written when the lease is "
                                  "held again; raise PAGER_LEASE_S for a slow store")

    def verify_written(self, parts: dict) -> None:
        """After a flush: the store holds this home's turns at their numbers. Another home's may hold them
        instead (a stale writer's landed first and this one's were taken for written, or this one's was
        the stale write): the session's records are then kept in the journal as numbered over
        (check_not_lost), for the next process to store after the last ones, not dropped."""
        h = self.home
        for s, part in parts.items():
            key = s.key()
            ops = [{"op": "turn", **t.to_dict()} for t in part.turns if (t.user, t.session) == key]
            if ops and key not in self.lost and h.recovery.contradicted(key, ops):
                self.lost.add(key)
                h.warn(f"session {s.name!r}: another home stored its own turns at numbers this home's flush "
                          "also wrote (a write that outlasted its lease); this home's acknowledged records are kept "
                          "in its journal and stored after the last ones when this home opens it next: restart "
                          "this process (or run `pager migrate` once it has exited)")

    def release_idle(self, keys: list[tuple[str, str]]) -> None:
        """Give up the leases of sessions this home has not written for lease_idle_s (called by the lease
        thread): flush first, so everything accepted is in the store for the next holder. Skipped while
        a write is under way (then the session is not idle) and while another live process of this home
        shares the leases (its journal may hold turns of the session not yet in the store)."""
        h = self.home
        if not h.mutex.acquire(blocking=False):
            return
        try:
            if h.closing:
                return
            h.recovery.recover_dead()   # a dead process's segment would count as a live one below, for good
            if h.recovery.live_others():
                return
            self.flush()
            idle = set(h.leases.idle())  # under the mutex nothing was written since: still idle
            h.leases.give_up([key for key in keys if key in idle])
        finally:
            h.mutex.release()


def _vectors(early) -> dict:
    """What WritePath.embed_early made, once it is done ({} if nothing; the session embeds as usual then)."""
    from .intake import early_vectors

    return {} if early is None else early_vectors(early)


class Accepted(dict):
    """Home.accept's answer: {Session: [Turn, …]}, and in `new` how many of each were new."""

    def __init__(self, turns: dict, new: dict) -> None:
        super().__init__(turns)
        self.new = new


def check_new_name(session) -> None:
    """Refuse the first write of a new session whose name could not be reached at /sessions/{name}
    (a turn, a state change, a bookmark: any of them makes the session), before anything is taken."""
    if not session.settled and session.turn_count == 0 and (problem := name_problem(session.name)):
        raise InputError(f"session name {session.name[:60]!r} {problem}")
