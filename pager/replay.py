"""Replay a trace: feed its inputs and recorded model replies back, recompute everything else.

Inputs are the events nothing inside pager decides: `session_start` (settings), `snapshot`
(a resumed session's turns and paging state), `append` (turns from files, the API or another
process), `user` (a message to the agent loop), `command` (a REPL slash command) and
`external_call` (a tool call from another agent). Model replies are fed back in order.
Everything else (faults, evictions, searches, assembled-context digests, tool results) is
recomputed by the engine and, with `check`, compared event by event with the recording.

The page-use reference string of a run also gives Belady's optimal fault count (OPT/MIN):
at every eviction, drop the page whose next use is farthest away.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from .bookmarks import Bookmark, Directory
from .config import Config
from .embed import trace_embedder
from .errors import InputError, PagerError
from .home import Home
from .page import parse_page_id
from .facts import Draft
from .state import Change
from .store import MemoryStore, fact_from
from .summaries import Draft as SummaryDraft, summary_from
from .rerank import Recorded
from .trace import Event, read_trace
from .writer import Written

# what a recording fed in (input, other processes, model answers that are not replies); replay feeds
# these back and recomputes everything else
INPUTS = {"session_start", "snapshot", "append", "user", "command", "external_call", "bookmarks_written",
          "writer_error", "state_in", "facts_written", "memory_error", "fact_in", "state_written",
          "memory_rejected", "summaries_written", "summary_in", "bookmark_in"}
IGNORED = {"note", "session_start", "session_end"}
VOLATILE = {"ts", "seq", "v", "retries"}


def normalize(event: dict) -> dict:
    return {k: v for k, v in event.items() if k not in VOLATILE}


@dataclass
class Divergence:
    index: int               # position in the recorded stream (events that replay compares)
    seq: int                 # the recorded event's sequence number
    step: str                # where in the session: "message 3, model step 2"
    expected: dict
    actual: dict | None

    def describe(self) -> str:
        def show(e):
            return "nothing (the replay ended)" if e is None else _brief(e)
        if self.seq < 0:   # the replay made more than the recording holds
            return (f"diverged after the recording's last event ({self.step}): the replay went on with\n"
                    f"  replayed: {show(self.actual)}")
        differs = "" if self.actual is None else f"\n  differs in {_difference(normalize(self.expected), normalize(self.actual))}"
        return (f"diverged at {self.step} (recorded event #{self.seq}):\n"
                f"  expected: {show(self.expected)}\n  replayed: {show(self.actual)}{differs}")


def _difference(expected, actual, path: str = "") -> str:
    """The first place two events differ, as a person would look for it: `results[1].page: recorded 'p8',
    replayed 'p4'` (the events themselves are cut to a line each)."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        for key in [*expected, *(k for k in actual if k not in expected)]:
            if expected.get(key, _ABSENT) != actual.get(key, _ABSENT):
                return _difference(expected.get(key, _ABSENT), actual.get(key, _ABSENT), f"{path}.{key}" if path else key)
    if isinstance(expected, list) and isinstance(actual, list):
        for k, (a, b) in enumerate(zip(expected, actual)):
            if a != b:
                return _difference(a, b, f"{path}[{k}]")
        if len(expected) != len(actual):
            return f"{path}: recorded {len(expected)} items, replayed {len(actual)}"

    def show(value) -> str:
        return "nothing" if value is _ABSENT else _brief_value(value)
    return f"{path or 'the event'}: recorded {show(expected)}, replayed {show(actual)}"


_ABSENT = object()


def _brief_value(value, width: int = 80) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _brief(event: dict, width: int = 300) -> str:
    import json

    text = json.dumps(normalize(event), ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


@dataclass
class Run:
    """The outcome of one replay."""

    policy: str
    events: list[dict] = field(default_factory=list)
    recorded: list[dict] = field(default_factory=list)
    divergence: Divergence | None = None
    counters: dict = field(default_factory=dict)
    digests: list[str] = field(default_factory=list)
    recorded_digests: list[str] = field(default_factory=list)
    frames: list[int] = field(default_factory=list)
    start_frames: int = 0                                   # frames when the trace begins
    start_resident: set[int] = field(default_factory=set)   # pages resident then (the tail aside)
    cut: bool = False        # the recording has no session_end: a crash (or a trim) ended it, maybe mid-message
    beyond: int = 0          # of a cut recording: events the replay made after its last one (not compared)

    def count(self, kind: str) -> int:
        return sum(1 for e in self.events if e["kind"] == kind)

    @property
    def faults(self) -> int:
        return self.count("fault")

    def opt(self) -> int:
        """Belady's optimal fault count on this run's reference string, from the same start."""
        return opt_faults(self.references(), self.start_frames, self.start_resident)

    @property
    def changed_contexts(self) -> int:
        pairs = zip(self.digests, self.recorded_digests)
        return sum(a != b for a, b in pairs) + abs(len(self.digests) - len(self.recorded_digests))

    @property
    def hit_rate(self) -> float:
        uses = self.faults + self.count("hit")
        return self.count("hit") / uses if uses else 0.0

    def references(self) -> list[tuple]:
        return reference_string(self.events)


class ReplayModel:
    """Serves what each recorded model call came to, in order: its reply, or its failure raised again
    (a `model_error` as ModelError, an `overflow` as ContextOverflow, with the recorded text), so the
    agent fails, shrinks its budget and asks again as it did. Its window is the recording's budget
    (`window`) plus its output tokens: the agent cuts the configured budget to what it had."""

    name = "pager/replay"
    output_tokens = 1024
    offline = True

    def __init__(self, outcomes: list[dict], window: int = 10**9) -> None:
        self.outcomes = list(outcomes)
        self.position = 0
        self._window = window

    def window(self) -> int:
        return self._window + self.output_tokens

    def check(self) -> None:
        pass

    def complete(self, messages, tools):
        from .llm import ContextOverflow, ModelError, ModelReply

        if self.position >= len(self.outcomes):
            raise ModelError("the trace has no more recorded model replies")
        outcome = self.outcomes[self.position]
        self.position += 1
        if outcome["kind"] == "model_error":
            raise ModelError(outcome["error"])
        if outcome["kind"] == "overflow":
            raise ContextOverflow(outcome["error"])
        return ModelReply(outcome.get("text", ""), outcome.get("tool_calls", []), truncated=outcome.get("truncated", False))


def model_outcomes(recorded: list[dict]) -> list[dict]:
    """What each of the recording's model calls came to: a `model_reply`, an `overflow`, or a
    `model_error` right after its `model_request` (the agent's other failures, a prompt that no
    longer fits, are recorded without a call)."""
    out: list[dict] = []
    before: dict = {}
    for event in recorded:
        if event["kind"] in INPUTS:
            continue
        if event["kind"] in ("model_reply", "overflow") or (
                event["kind"] == "model_error" and before.get("kind") == "model_request"
                and before.get("step") == event.get("step")):
            out.append(event)
        before = event
    return out


# the fields replay reads from each input, with their types: a trace edited by hand that lacks one is refused
# naming the event, not met with a traceback
FIELDS: dict[str, dict[str, type]] = {"session_start": {"budget": int, "page_tokens": int, "policy": str}, "snapshot": {"turns": list, "state": dict},
          "append": {"turns": list}, "user": {"text": str}, "command": {"line": str}, "external_call": {"name": str}}
TYPES: dict[type, str] = {int: "a whole number", str: "text", list: "a list", dict: "an object"}


def load(path: Path) -> tuple[dict, list[dict]]:
    events = list(read_trace(path))
    start = next((e for e in events if e["kind"] == "session_start"), None)
    if start is None:
        raise InputError(f"{path} has no session_start event; it is not a pager session trace")
    for event in events:
        for name, kind in FIELDS.get(event["kind"], {}).items():
            value = event.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                said = "has no" if name not in event else f"holds {type(value).__name__} {str(value)[:40]!r} as its"
                raise InputError(f"{path}: the {event['kind']} event #{event.get('seq', '?')} {said} {name!r} "
                                 f"({TYPES[kind]}); fix that line, or replay the trace as it was written")
    return start, events


def config_from(start: dict, home: Path, policy: str | None) -> Config:
    extra = start.get("config", {})
    # the session's frames are sized from the configured budget; the agent cut it to the model's
    # window (start["budget"], ReplayModel.window). Traces before the configured one was recorded: equal.
    return Config(home=home, session=start.get("session", "replay"), user=start.get("user", ""),
                  budget=extra.get("budget", start["budget"]), page_tokens=start["page_tokens"], policy=policy or start["policy"],
                  tokenizer=start.get("tokenizer", ""), embedder=trace_embedder(start.get("embedder", "wordllama"), start.get("embedder_dim")),
                  map_tokens=extra.get("map_tokens", 0), autopage_share=extra.get("autopage_share", 0.9),
                  readahead=extra.get("readahead", 1), max_steps=extra.get("max_steps", 8),
                  output_tokens=extra.get("output_tokens", 1024), recency_weight=extra.get("recency_weight", 0.0),
                  # traces recorded before updates ranked first, or weak hits were left out: as they ran
                  supersede=extra.get("supersede", False), weak_similarity=extra.get("weak_similarity", 0.0),
                  supersede_tail=extra.get("supersede_tail", False),   # nor did an update on the open page
                  words_first=extra.get("words_first", False),   # and numbers were keywords among the words
                  live_summaries=False,   # the recorded `summaries_written` are fed back; replay makes none
                  fill=extra.get("fill", False),   # traces before the leftover was filled assembled without it
                  fact_dates=extra.get("fact_dates", False),   # nor did facts have the date signal before it was recorded
                  # the reranker's answers are fed back (replay); how many candidates it had decides what is asked
                  rerank_pieces=extra.get("rerank_pieces", Config.rerank_pieces),
                  rerank_facts=extra.get("rerank_facts", Config.rerank_facts),
                  **{name: extra[name] for name in ("summary_share", "autopage_min_score", "pressure", "state_share",
                                                    "fact_share", "excerpt_slabs") if name in extra})


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Stop(Exception):
    """Raised by an on_context callback to end a replay early (`trace show --step N`)."""


def replay(path: Path, policy: str | None = None, check: bool = False,
           on_context: Callable[[int, object, object, list[dict]], None] | None = None) -> Run:
    """Re-run the trace in a fresh in-memory home; with check, stop at the first divergence.

    on_context(i, context, session, events) sees the i-th assembled context (1-based) as the model
    would, with the replayed events so far; it may raise Stop to end the replay there."""
    from pager.tools import MODEL

    from .agent import Agent

    start, recorded_all = load(path)
    recorded = [e for e in recorded_all if e["kind"] not in IGNORED and e.get("seq", 0) > start.get("seq", 0)]
    if start.get("resumed_turns") and not any(e["kind"] == "snapshot" for e in recorded):
        raise InputError(f"{path} resumed a session of {start['resumed_turns']} turns, but its `snapshot` line (those "
                         "turns and the paging state, the line after session_start) is missing; replay starts from "
                         "it: put it back, or replay the trace as it was written")
    compare = _comparable(recorded)
    run = Run(policy or start["policy"], recorded=compare,
              cut=not any(e["kind"] == "session_end" and e.get("seq", 0) > start.get("seq", 0) for e in recorded_all))
    run.recorded_digests = [e["digest"] for e in recorded if e["kind"] == "model_request"]
    clock = _Clock()
    with tempfile.TemporaryDirectory(prefix="pager-replay-") as folder:
        config = config_from(start, Path(folder), policy)
        home = Home(config, store=MemoryStore(), clock=clock, durable=False)
        if start.get("config", {}).get("reranker"):   # its recorded answers, by message: replay calls no reranker
            home.reranker = Recorded(start["config"]["reranker"], recorded)
        session = home.open()
        live: list[dict] = []
        listening = [True]
        checker = _Compare(compare, live, run.cut, recorded)

        def listen(e: Event) -> None:
            if listening[0]:
                live.append({"kind": e.kind, "seq": e.seq, **e.data})

        session.events.listeners.append(listen)
        model = ReplayModel(model_outcomes(recorded), window=start["budget"])
        requests = 0

        def context_seen(ctx) -> None:
            nonlocal requests
            requests += 1
            if run.cut and requests > len(run.recorded_digests):
                raise Stop   # past where a cut recording ends: this call was never made
            run.digests.append(ctx.digest)
            run.frames.append(ctx.frames)
            if on_context:
                on_context(requests, ctx, session, live)

        agents: list[Agent] = []

        def agent_factory(speaker: str) -> Agent:
            """The agent for the next message: a chat's one agent, or a new one per message as a server
            makes them (an overflow's smaller tier then lasts for that message only)."""
            if not agents or start.get("agent_per_message"):
                agents[:] = [Agent(session, model, MODEL, speaker=speaker, paging="tools")]
                agents[0].on_context = context_seen
            return agents[0]

        try:
            _feed(recorded, session, agent_factory, checker, run, check, policy, clock, listening)
        except Stop:
            pass
        run.events = live
        run.counters = dict(session.counters)
        if check and run.divergence is None:
            run.divergence = checker.first_divergence(final=True)
        run.beyond = max(0, len(checker.comparable()) - len(compare)) if run.cut else 0
        home.journal.close(remove=True)
    return run


def _feed(recorded, session, agent_factory, checker, run, check, policy, clock, listening) -> None:
    from pager.tools import AGENT
    from pager.tools.toolkit import external

    started = False
    at = [0]
    early = _Early(recorded, session, checker, at)
    for i, event in enumerate(recorded):
        kind = event["kind"]
        at[0] = i
        if kind not in INPUTS or i in early.fed:
            continue
        if not started and kind != "snapshot":
            started = True
            run.start_frames = session.frames.count
            run.start_resident = {n for n in session.frames.slots if n is not None and n != session.tail_n}
        clock.now = event.get("ts", clock.now)
        if kind == "snapshot":
            listening[0] = False  # the recording loaded these from disk before its trace began
            _resume(session, event, policy)
            listening[0] = True
        elif _from_other(event):   # another process's turns, summary, fact or state, taken in by sync
            if kind == "append":
                session.in_use = set()
            _take_other(session, event)
        elif kind == "append":
            session.append_many([dict(t) for t in event["turns"]])
        elif kind == "user":
            agent = agent_factory(event.get("speaker", "user"))
            agent.speaker = event.get("speaker", agent.speaker)   # a server's clients may name themselves
            agent.use_paging(event.get("paging") or "tools")   # as the recording's agent paged (tools: not said)
            agent.ask(event["text"], key=event.get("key", ""), instructions=event.get("instructions", ""),
                      tools=event.get("tools"), resume=event.get("resume"))
        elif kind == "command":
            _command(session, event["line"], keep_policy=policy is not None)
        elif kind == "external_call":
            external(session, AGENT, event["name"], event["arguments"])
        elif kind == "facts_written":   # the memory model's recorded answer; replay calls no model
            session.add_facts([Draft(f["subject"], f["text"], tuple(f["turns"]), f.get("ts"), f.get("op", "add"),
                                     f.get("target", 0)) for f in event["facts"]], event["source"])
        elif kind == "state_written":   # the memory model's recorded state changes
            session.apply_state([(c["key"], None if c.get("unset") else c["value"]) for c in event["changes"]])
        elif kind == "summaries_written":   # a summary producer's recorded answer; replay calls no producer
            session.add_summaries([SummaryDraft(x["kind"], x["key"], x["text"], tuple(x["turns"]), x.get("ts"))
                                   for x in event["summaries"]], event["source"])
        elif kind == "bookmarks_written":   # the bookmark model's recorded answer; replay calls no model
            session.apply_written([Written(n, tuple(m["keywords"]), m.get("note", ""))
                                   for m in event["marks"] if (n := parse_page_id(m["page"])) is not None])
        if check:
            run.divergence = checker.first_divergence()
            if run.divergence:
                return


OTHERS = {"summary_in", "fact_in", "state_in", "bookmark_in"}   # with an `append` whose origin is not "input"


def _from_other(event: dict) -> bool:
    return event["kind"] in OTHERS or (event["kind"] == "append" and event.get("origin") != "input")


def _take_other(session, event: dict) -> None:
    """Feed what another process wrote, as the recording's sync took it in."""
    kind = event["kind"]
    if kind == "append":
        session.receive([dict(t) for t in event["turns"]])
    elif kind == "summary_in":
        session.tiers["summary"].keep([summary_from(event)], "")
    elif kind == "fact_in":
        session.tiers["fact"].keep([fact_from(event)], "")
    elif kind == "state_in":
        session.state.take([_change(event)])
    elif kind == "bookmark_in":
        session._take_marks([Bookmark.from_dict(event)])


class _Early:
    """What other processes wrote while a recorded input was being handled (a message answered, a
    producer's summaries written): the recording's sync took it in inside that work (before the
    user's turn, between model steps, before its own summaries were numbered), so replay feeds it
    from the session's own sync at the same point of the event stream, not after the work."""

    def __init__(self, recorded: list[dict], session, checker: "_Compare", at: list[int]) -> None:
        self.recorded, self.checker, self.at = recorded, checker, at
        self.fed: set[int] = set()
        self.before: list[int] = []
        seen = 0   # comparable events recorded before each event
        for event in recorded:
            self.before.append(seen)
            seen += event["kind"] not in INPUTS - {"append", "user"}
        self.session, self.sync = session, session.sync
        session.sync = self

    def __call__(self, *args, **kwargs) -> None:
        self.sync(*args, **kwargs)
        if self.recorded[self.at[0]]["kind"] == "snapshot":   # loaded before the recording's trace began
            return
        for j in range(self.at[0] + 1, len(self.recorded)):
            event, produced = self.recorded[j], len(self.checker.comparable())
            if self.before[j] > produced:
                return   # recorded after an event replay has not made yet
            if j in self.fed:
                continue
            if not _from_other(event):
                if event["kind"] in INPUTS:
                    return   # the next input of the recording's own: not ours to feed here
                continue
            self.fed.add(j)
            _take_other(self.session, event)


def _resume(session, event: dict, policy: str | None) -> None:
    session.in_use = set()
    turns = event["turns"]
    state = event["state"]
    if "encoding" in state:  # pages were cut as the recorded session cut them, whatever its model
        session.settle(state["page_tokens"], state["encoding"])
    if turns:
        session.append_many([dict(t) for t in turns], origin="snapshot")
    state = dict(event["state"])
    if policy:  # a what-if replay keeps its own policy (and CLOCK starts its hand at frame 0)
        state.update(policy=policy, hand=0)
    session.load_paging_state(state)
    if "bookmarks" in event:   # the recording's directory, not the one loading the turns at this budget made
        # as the recording's open made it: its pages' keywords, then the stored bookmarks (traces
        # recorded before `page_keywords` opened with the bookmarks alone, and replay as they ran)
        pages = [session.pages[n] for n in sorted(session.pages)] if event.get("page_keywords") else []
        session.directory = Directory.of(map(Bookmark.from_dict, event["bookmarks"]), pages)
    session.state.take([Change.from_record(c) for c in event.get("changes", [])])
    session.tiers["fact"].keep([fact_from(f) for f in event.get("facts", [])], "")
    session.tiers["summary"].keep([summary_from(x) for x in event.get("summaries", [])], "")


def _change(event: dict) -> Change:
    return Change.from_record({**event, "seq": event["change"], "page": parse_page_id(event["page"]),
                               "ts": event["ts_set"]})


def _command(session, line: str, keep_policy: bool) -> None:
    """What a chat's slash command did to the session; a mistyped one did nothing there (chat
    printed the error and went on), so it does nothing here."""
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    try:
        if name == "/search" and arg:
            session.search(arg, k=8)
        elif name == "/policy" and not keep_policy:
            session.set_policy(arg)
        elif name in ("/pin", "/unpin"):
            n = session.resolve(arg)
            session.pin(n) if name == "/pin" else session.unpin(n)
    except PagerError:
        pass


def _comparable(events: Iterable[dict]) -> list[dict]:
    """What replay recomputes, plus the appends and messages that mark where it is."""
    return [e for e in events if e["kind"] not in INPUTS - {"append", "user"}]


class _Compare:
    """The replayed stream against the recording, as it grows: each replayed event is sorted out and
    compared once (rescanning the whole stream after every input made a replay of thousands of
    messages take minutes). cut: the recording ends without session_end, so what the replay makes
    after its last event was not recorded, and is no divergence."""

    def __init__(self, recorded: list[dict], live: list[dict], cut: bool = False, events: list[dict] | None = None) -> None:
        self.recorded, self.live, self.cut = recorded, live, cut
        self.events = recorded if events is None else events   # every recorded event, inputs too: to say where
        self.at = {id(e): j for j, e in enumerate(self.events)}
        self.replayed: list[dict] = []
        self.scanned = 0    # events of live sorted into replayed
        self.matched = 0    # events of replayed equal to the recording's

    def comparable(self) -> list[dict]:
        self.replayed += _comparable(self.live[self.scanned:])
        self.scanned = len(self.live)
        return self.replayed

    def first_divergence(self, final: bool = False) -> Divergence | None:
        replayed, recorded = self.comparable(), self.recorded
        for i in range(self.matched, len(replayed)):
            actual = replayed[i]
            if i >= len(recorded):
                if self.cut:
                    return None
                return Divergence(i, -1, self.where(len(recorded) - 1) if recorded else "the start",
                                  {"kind": "(no more events recorded)"}, actual)
            if normalize(recorded[i]) != normalize(actual):
                return Divergence(i, recorded[i].get("seq", -1), self.where(i), recorded[i], actual)
            self.matched = i + 1
        if final and len(replayed) < len(recorded):
            i = len(replayed)
            return Divergence(i, recorded[i].get("seq", -1), self.where(i), recorded[i], None)
        return None

    def where(self, i: int) -> str:
        return _where(self.events, self.at[id(self.recorded[i])], i)


def _where(events: list[dict], j: int, i: int) -> str:
    """Where the recording's j-th event (the i-th compared) happened, by the input it followed: a message
    and its model step, an append, a tool call from another agent, a slash command."""
    last = next((k for k in range(j, -1, -1) if events[k]["kind"] in ("user", "external_call", "command")
                 or (events[k]["kind"] == "append" and not _from_other(events[k]))), None)
    if last is None:
        return f"event {i + 1}, before the first input"
    event, before = events[last], events[: last + 1]
    if event["kind"] == "append":
        appends = [e for e in before if e["kind"] == "append" and not _from_other(e)]
        turns = sum(len(e["turns"]) for e in appends)
        return f"event {i + 1}, while appending turns {turns - len(event['turns']) + 1}–{turns} (append {len(appends)})"
    if event["kind"] == "external_call":
        calls = sum(e["kind"] == "external_call" for e in before)
        arguments = event.get("arguments")
        said = arguments if isinstance(arguments, str) else _brief_value(arguments)
        return f"event {i + 1}: external call {calls} ({event['name']} {said[:80]})"
    if event["kind"] == "command":
        return f"event {i + 1}: after the command {event['line']!r}"
    messages = sum(e["kind"] == "user" for e in before)
    step = max([e.get("step", 0) for e in events[last: j + 1] if e["kind"] == "model_request"], default=0)
    when = f"model step {step}" if step else "automatic paging, before the first model call"
    return f"event {i + 1}: message {messages} ({event['text'][:60]!r}), {when}"


def position(events: list[dict]) -> str:
    """Where a replay is, for a person looking for a message: "message 59 (turn 507), model step 2", from
    the events replayed so far, the call's own `model_request` the last of them."""
    users = [i for i, e in enumerate(events) if e["kind"] == "user"]
    if not users:
        return ""
    since = events[users[-1]:]
    turn = next((e["turn"] for e in since if e["kind"] == "turn"), None)
    step = next((e["step"] for e in reversed(since) if e["kind"] == "model_request"), 1)
    return f"message {len(users)}" + (f" (turn {turn})" if turn else "") + f", model step {step}: {events[users[-1]]['text'][:60]!r}"


# -- Belady's optimum -----------------------------------------------------------------------------------------
def reference_string(events: list[dict]) -> list[tuple]:
    """The page uses and frame changes of a run: ("use", n), ("seal", n), ("frames", k), ("pin"|"unpin"|"out", n)."""
    out: list[tuple] = []
    for e in events:
        kind = e["kind"]
        if kind in ("fault", "hit"):
            out.append(("use", int(e["page"][1:])))
        elif kind == "page_sealed":
            out.append(("seal", int(e["page"][1:])))
        elif kind == "resize":
            out.append(("frames", e["frames"]))
        elif kind in ("pin", "unpin"):
            out.append((kind, int(e["page"][1:])))
        elif kind == "evict" and e.get("reason") == "page_out":
            out.append(("out", int(e["page"][1:])))
        elif kind == "model_request":
            out.append(("assemble", 0))
    return out


def opt_faults(references: list[tuple], frames: int, resident: Iterable[int] = ()) -> int:
    """Faults of the optimal offline policy on the reference string (the open tail keeps a frame),
    starting with `resident` in memory.

    The pages used for one assembled context must be in memory together, so a page used since
    the last assembly is not a candidate; otherwise the page used farthest in the future goes."""
    uses: dict[int, list[int]] = {}
    for i, (op, n) in enumerate(references):
        if op in ("use", "seal"):
            uses.setdefault(n, []).append(i)
    pointer = {n: 0 for n in uses}

    def next_use(n: int, i: int) -> float:
        positions = uses.get(n, [])
        k = pointer.get(n, 0)
        while k < len(positions) and positions[k] <= i:
            k += 1
        pointer[n] = k
        return positions[k] if k < len(positions) else float("inf")

    resident = set(resident)
    pinned: set[int] = set()
    in_use: set[int] = set()
    faults = 0

    def shrink(capacity: int, i: int) -> None:
        while len(resident) > max(capacity, len(pinned)):
            free = [n for n in resident if n not in pinned and n not in in_use]
            if not free:  # as the engine does: when everything is in use, the context shrinks
                free = [n for n in resident if n not in pinned]
            if not free:
                return
            resident.discard(max(free, key=lambda n: (next_use(n, i), n)))

    capacity = frames - 1  # one frame is always the open tail
    for i, (op, n) in enumerate(references):
        if op == "frames":
            capacity = n - 1
            shrink(capacity, i)
        elif op == "seal":  # the tail becomes an ordinary page and needs a frame of its own
            resident.add(n)
            shrink(capacity, i)
        elif op == "use":
            in_use.add(n)
            if n not in resident:
                faults += 1
                resident.add(n)
                shrink(capacity, i)
        elif op == "assemble":
            in_use.clear()
        elif op == "pin":
            pinned.add(n)
        elif op == "unpin":
            pinned.discard(n)
        elif op == "out":
            resident.discard(n)
    return faults


def recorded_policies(path: Path) -> tuple[list[str], list[str]]:
    """(every policy the recorded run used, in order; those in force while it called the model).
    A chat can switch with `/policy`: the policy the session started with is then not the one its
    questions were answered under."""
    start, events = load(path)
    used = [start["policy"]]
    asked: list[str] = []
    for e in events:
        if e.get("seq", 0) <= start.get("seq", 0):
            continue
        now = e.get("policy") if e["kind"] == "policy" else None
        if now and now != used[-1]:
            used.append(now)
        if e["kind"] == "model_request" and used[-1] not in asked:
            asked.append(used[-1])
    return used, asked or used[-1:]


def policy_runs(path: Path, names: Iterable[str]) -> list[Run]:
    """A replay under each policy named. The recorded policy, when the run never switched, is replayed as
    it ran (from its CLOCK hand), not as a what-if that restarts the hand: its row is the recording."""
    used, _ = recorded_policies(path)
    return [replay(path, policy=None if used == [name] else name) for name in names]


def policy_table(runs: list[Run], path: Path):
    """Faults, evictions, hit rate and changed contexts per policy, each against OPT. The recorded
    policy (the one in force while the run called the model; several if it switched) is starred."""
    from .views import table as fitted

    used, starred = recorded_policies(path)
    title = f"{Path(path).name}: replay under each policy (* recorded)"
    if len(used) > 1:
        title = (f"{Path(path).name}: replay under each policy (* in force when recorded: the run switched "
                 f"{' → '.join(used)}" + (", so no single policy reproduces it)" if len(starred) > 1 else ")"))
    headers = ("policy", "faults", "evictions", "hit rate", "contexts changed", "OPT faults", "faults / OPT")
    table = fitted(title, headers, right=headers[1:],
                   caption="OPT: Belady's optimum on the same page uses and frames; 0 means a clairvoyant "
                           "policy would not fault at all", caption_justify="left")
    best = min(r.faults for r in runs)
    for run in runs:
        opt = run.opt()
        table.add_row(run.policy + ("*" if run.policy in starred else ""), str(run.faults),
                      str(run.count("evict")), f"{run.hit_rate:.1%}", f"{run.changed_contexts}/{len(run.digests)}",
                      str(opt), f"{run.faults / opt:.3f}" if opt else "–", style="bold" if run.faults == best else None)
    return table


def summary(path: Path):
    """What a trace holds, without replaying it."""
    from collections import Counter

    from rich.table import Table
    from rich.text import Text

    start, events = load(path)
    kinds = Counter(e["kind"] for e in events)
    table = Table(title=Text(Path(path).name), title_justify="left", show_header=False)
    table.add_row("session", Text(f"{start.get('session')!r} · model {start.get('model')} · budget {start.get('budget')} · "
                                  f"{start.get('page_tokens')}-token pages · policy {start.get('policy')}"))
    table.add_row("messages", f"{kinds['user']} to the agent · {kinds['model_request']} model calls · "
                  f"{kinds['tool_call']} tool calls")
    table.add_row("paging", f"{kinds['fault']} faults · {kinds['hit']} hits · {kinds['evict']} evictions · "
                  f"{kinds['page_sealed']} pages sealed · {kinds['pin']} pins")
    if not kinds["session_end"]:
        table.add_row("end", "none recorded: the run was cut short (killed, still running, or a Toolkit never "
                      "closed); replay compares what the trace holds")
    table.add_row("next", Text(f"pager trace show {path} --step 1 · pager replay {path} --policy all"))
    return table
