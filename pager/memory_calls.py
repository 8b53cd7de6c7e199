"""What a session owes its bookmark or memory model, and the calls that pay it.

Pages this process seals are owed a name (keywords, a note; with a memory model also facts and
state), a batch per call; episodes that close (a new date, a silence, a topic shift:
`summaries.Episodes`) are owed a summary. The calls are made after a reply, never per turn, and
every failure is an event: its pages stay owed (first in line, tried again once another page
seals, or by the next process to open the session, which reads them from the stored page table),
and the turns stay. `pager serve` hands the calls to its memory worker, on a thread of its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import PagerError
from .page import Turn, page_id
from .summaries import EPISODE, ROLLING, Episodes, Extractive, Summary, session_turns

if TYPE_CHECKING:
    from .session import Session

LIVE_LOOKBACK = 500   # turns a live session reads back, once, for the episodes not summarized yet (pager summarize: all)


class MemoryCalls:
    def __init__(self, session: "Session") -> None:
        self.session = session
        self.unwritten: list[int] = []      # sealed pages the bookmark model has not named yet (stored: take_pending)
        self.naming: list[int] = []         # pages of a call of it under way (pager serve's memory worker)
        self.episodes_owed: list[list[Turn]] = []   # closed episodes the memory model's next call summarizes
        self.retry_at = 0                   # after a failed call: no other until this page is the open tail
        self.inherited = False              # owes pages it did not seal (a restart, a crash): name them soon
        self.writer_error = ""              # the bookmark model's last failure, if any
        self.episodes: Episodes | None = None   # live summaries: episodes cut as turns arrive (made on first use)
        self.closed: list[list[Turn]] = []      # episodes closed since the last reply, not summarized yet
        self.backlog: list[list[Turn]] = []     # episodes closed before the first live use, not summarized yet

    @property
    def writer(self):
        return self.session.home.writer

    def feed(self, turns: list[Turn]) -> None:
        """Turns just taken in, in order: the episodes they close (once live summaries began)."""
        if self.episodes is not None:
            self.closed += self.episodes.feed(turns)

    def sealed(self, n: int) -> None:
        """A page this process sealed: owed a name when the session has a bookmark or memory model."""
        if self.session.home.config.writer_model:
            self.unwritten.append(n)

    def owe(self, pages: list[int], inherited: bool) -> None:
        """Pages sealed by another process, maybe never named (a restart, a crash): named, at least once."""
        if self.session.home.config.writer_model:
            pages = [n for n in pages if n not in self.unwritten]
            self.unwritten += pages
            self.inherited = self.inherited or (inherited and bool(pages))

    def write_memory(self) -> None:
        """What a live session (chat, the agent loop, serve) does after each reply: the bookmark or
        memory model's call for a full batch of sealed pages, and, when an episode closed since the last
        reply (a new date, `gap_s` of silence, a topic shift: `summaries.Episodes`), that episode's
        summary and the rolling summary's next version. With a memory model the summaries ride on its
        call (the batch is sent at once, with the episodes); whatever it did not write (it failed, or
        left one out) the extractive producer writes. No model call per turn, and every failure is an
        event: the turns stay. Replay feeds the recorded `summaries_written` back and makes none. On
        first use, the episodes that had closed before (`closed_episodes`) get theirs extractively."""
        closed = self.closed_episodes()
        backlog, self.backlog = self.backlog, []
        writer = self.writer
        if closed and writer is not None and writer.memory:
            if backlog:   # closed before this chat: extractive, so the model's call stays one batch's size
                self._summarize_closed(backlog, [])
            self.write_bookmarks(force=True, episodes=closed)   # the call's answer, or the extractive producer
        else:
            self.write_bookmarks()
            if backlog + closed:
                self._summarize_closed(backlog + closed, [])

    def closed_episodes(self) -> list[list[Turn]]:
        """The episodes that closed since this was last asked (none when `live_summaries` is off).

        The first call reads the session's last LIVE_LOOKBACK turns back, once: every episode among
        them that closed before it (but the last, which the message that began this chat may have
        closed) and that has no summary yet, or lies outside the rolling summary, is the backlog
        (`backlog`), which `write_memory` summarizes extractively, with no model call, and the rolling
        summary then covers from the session's first turn. The bound keeps a chat's first reply cheap
        in a huge session: episodes further back than that are left to `pager summarize` (which reads
        every turn), and the rolling summary covers from the first whole episode read."""
        s = self.session
        if not s.home.config.live_summaries:
            return []
        if self.episodes is None:
            after = max(0, s.turn_count - LIVE_LOOKBACK)
            self.episodes = Episodes(Extractive())
            closed = self.episodes.feed(session_turns(s, after=after))
            if after:   # the first episode read may have begun before the turns read: not whole
                closed = closed[1:]
            done = {x.key for x in s.summaries.current.values() if x.kind == EPISODE}
            rolling = s.summaries.rolling
            covered = rolling.turns if rolling else (0, -1)
            wanted = [e for e in closed if f"e{e[0].turn}" not in done
                      or not covered[0] <= e[0].turn <= e[-1].turn <= covered[1]]
            self.backlog = [e for e in wanted if e is not closed[-1]]
            self.closed = [e for e in wanted if e is closed[-1]]
        closed, self.closed = self.closed, []
        return closed

    def _summarize_closed(self, closed: list[list[Turn]], made: list[Summary]) -> None:
        """The extractive producer's summaries of the closed episodes (and the rolling version) that
        `made` (the memory model's, if any) does not hold; a failure is a `memory_error` event."""
        s = self.session
        written = {x.key for x in made}
        if ROLLING in written and all(f"e{e[0].turn}" in written for e in closed):
            return   # the memory model wrote them all
        producer = Extractive()
        try:   # an episode the model summarized is skipped: it is in the session's summaries already
            drafts = producer.after(s, closed, rolling=ROLLING not in written)
        except Exception as exc:  # noqa: BLE001 - the embedder failed; summaries only ever add
            s.memory_error = " ".join(str(exc).split())[:300] or type(exc).__name__
            s.emit("memory_error", pages=[], error=s.memory_error)
            return
        if drafts:
            s.add_summaries(drafts, producer.source)

    def write_bookmarks(self, force: bool = False, episodes: list[list[Turn]] | None = None) -> list:
        """Have the bookmark model (or the memory model, which also writes facts and state in the same
        call) name the pages sealed since it last did, a batch per call (all batches with force, else
        only full ones). Returns the bookmarks it wrote (writer.Written). A failing model is an event
        (`writer_error`, or `memory_error` for the memory model), never an exception: its batch stays
        unwritten, tried again once another page seals (or by the next process to open the session),
        and every turn stays. `episodes` (closed ones, `write_memory`): the memory model's last call of
        these also asks for their summaries, one call even with no page to name.

        With a memory worker (`Home.memory_worker`, which `pager serve` runs) the calls are its to make,
        on its own thread with no lock held while the model answers: this only hands the work over."""
        s, writer = self.session, self.writer
        if writer is None:
            return []
        if episodes and writer.memory:
            self.episodes_owed += episodes
        if s.home.memory_worker is not None:
            if self.due(force):
                s.home.memory_worker.want(s, force)
            return []
        written: list = []
        while self.due(force):
            call = self.call()
            if call is None:
                break
            try:
                reply = writer.model.complete(call.messages, [])
            except Exception as exc:  # noqa: BLE001 - any provider failure; the writer only ever adds
                self.failed(call, exc)
                break
            written += self.answered(call, reply)
        return written

    def due(self, force: bool = False) -> bool:
        """Whether the bookmark or memory model has a call to make: closed episodes to summarize, a full
        batch of unwritten pages, or any with force; after a failed call, not before another page seals."""
        writer = self.writer
        if writer is None:
            return False
        if self.episodes_owed and writer.memory:
            return True
        if not self.unwritten or self.session.tail_n < self.retry_at:
            return False
        return force or len(self.unwritten) >= writer.batch

    def call(self):
        """The next call of the bookmark or memory model (writer.Call): a batch of unwritten pages, now
        `naming`, and with the last batch the episodes owed; its prompt made now, from the session as it
        is. None if making it failed (a `writer_error` or `memory_error`, as a failed call is)."""
        s, writer = self.session, self.writer
        batch, self.unwritten = self.unwritten[: writer.batch], self.unwritten[writer.batch :]
        episodes = None
        if writer.memory and not self.unwritten and self.episodes_owed:
            episodes, self.episodes_owed = self.episodes_owed, []
        self.naming += batch
        pages = [s.pages[n] for n in batch]
        try:
            return writer.ask(pages, s, episodes)
        except Exception as exc:  # noqa: BLE001 - the embedder failed (similar facts); as a failed call
            from .writer import Call

            self.failed(Call(pages, episodes), exc)
            return None

    def answered(self, call, reply) -> list:
        """Keep the model's answer to a call, as any answer is kept (apply_written, apply_memory; the
        extractive summaries of the episodes it left out). Returns the bookmarks it wrote."""
        s, writer = self.session, self.writer
        batch = [p.n for p in call.pages]
        self.naming = [n for n in self.naming if n not in batch]
        try:
            answer = writer.read(call, reply, s)
        except Exception as exc:  # noqa: BLE001 - reading it needs the facts' state; as a failed call
            self.naming += batch
            self.failed(call, exc)
            return []
        made = len(s.summaries)
        marks = answer.marks if writer.memory else answer
        try:
            self.apply_written(marks)
            if writer.memory:
                self.apply_memory(answer, batch)
        except PagerError as exc:   # the store or the lease refused a write: as a failed call, the pages still owed
            self.failed(call, exc)
            return []
        if call.episodes:
            self._summarize_closed(call.episodes, s.summaries.items[made:])
        return marks

    def failed(self, call, exc: Exception) -> None:
        """A call that failed: an event, its pages unwritten again (first, for the next call, once another
        page seals), and the episodes it was to summarize summarized by the extractive producer."""
        s = self.session
        batch = [p.n for p in call.pages]
        error = " ".join(str(exc).split())[:300] or type(exc).__name__
        if self.writer.memory:
            s.memory_error = error
            s.emit("memory_error", pages=[page_id(n) for n in batch], error=error)
        else:
            self.writer_error = error
            s.emit("writer_error", pages=[page_id(n) for n in batch], error=error)
        self.naming = [n for n in self.naming if n not in batch]
        self.unwritten = batch + [n for n in self.unwritten if n not in batch]
        self.retry_at = s.tail_n + 1
        episodes, self.episodes_owed = (call.episodes or []) + self.episodes_owed, []
        if episodes:
            self._summarize_closed(episodes, [])

    def write_rest(self) -> None:
        """Have the bookmark or memory model name the pages this process sealed since its last full batch
        (fewer than a batch): what a session does before it is let go (the end of `pager chat`, a
        Toolkit's close; your own loop over `Agent`, before its trace ends and the home closes, which
        calls no model). Pages it could not name stay unwritten in the stored session, and the next
        process to open it names them. A write the store or the lease refuses is said once and is an
        event, like a failing model: the turns are durable and stay."""
        s = self.session
        if not self.unwritten or self.writer is None:
            return
        pages = list(self.unwritten)
        try:
            self.write_bookmarks(force=True)
        except PagerError as exc:
            error = " ".join(str(exc).split())[:300]
            kind = "memory_error" if self.writer.memory else "writer_error"
            s.emit(kind, pages=[page_id(n) for n in pages], error=error)
            s.home.warn(f"the pages {', '.join(page_id(n) for n in pages)} of session {s.name!r} were not given "
                        f"to {s.home.config.writer_model}: {error}; they keep their offline keywords")

    def apply_written(self, marks) -> None:
        """Keep a bookmark writer's answer as durable bookmarks; replay feeds the recorded answer here."""
        s = self.session
        s.emit("bookmarks_written", marks=[{"page": page_id(m.page), "keywords": list(m.keywords), "note": m.note}
                                           for m in marks])
        for m in marks:
            if m.page in s.pages:
                s.add_bookmark(tuple(m.keywords), (m.page,), m.note, source="writer")

    def apply_memory(self, answer, pages: list[int]) -> None:
        """Keep a memory model's answer (memory.Answer): what it got wrong is one `memory_rejected`
        event, its facts are kept (add, update, invalidate) and its state changes made."""
        s = self.session
        if answer.rejected:
            s.emit("memory_rejected", pages=[page_id(n) for n in pages], rejected=list(answer.rejected))
        if answer.facts:
            s.add_facts(answer.facts, "model")
        if answer.state:
            s.apply_state(answer.state)
        if answer.summaries:
            s.add_summaries(answer.summaries, "model")
