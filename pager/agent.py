"""The agent loop: assemble → call the model → run its tool calls → repeat.

One user message is one `ask`: the message is made durable first, automatic paging runs
with it as the query, then the model is called with the tools until it answers in text or
the step limit is reached. The loop is driven by `message.tool_calls`, never by
finish_reason. Tool calls go through the same fault path as everything else, and every
exchange is an event (a trace listens to them; replay feeds the recorded replies back).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable

from pager.prompts import load, render
from pager.tools import MODEL, Dispatcher

from . import textcalls
from .context import MAP_FLOOR, MESSAGE_OVERHEAD, REPLY_PRIMING, SEPARATOR, build, message_tokens, size_frames
from .errors import BudgetError, ModelError
from .llm import ContextOverflow, local_server
from .model import Model
from .session import Session


@dataclass
class Reply:
    text: str
    steps: int
    tool_calls: list[dict] = field(default_factory=list)
    stopped: bool = False      # the step limit was reached
    error: str = ""            # the model failed; the user's message is still in memory
    client_calls: list[dict] = field(default_factory=list)   # calls of the caller's own tools, for it to run
    truncated: bool = False    # the model stopped at its output limit (the text is what it sent, nothing added)
    unechoed: int = 0          # lines of pager's own prompt the model repeated, left out of the reply (see unecho)


# -- the fixed regions, scaled to the budget -------------------------------------------------------------------
# The full system prompt and tool schemas take ~800 tokens. Under a small budget they would leave
# no frame for a page, so the agent steps down: a short prompt with compact schemas (no argument
# descriptions), then the short prompt and no tools at all (automatic paging alone brings pages in).
# Each tier needs room for its fixed regions, a memory map, its pages, a message and, with tools,
# one tool exchange. A budget that holds the open tail alone replies but can never answer from
# memory, so the bare tier needs two pages (the tail and one to answer from); a tier with tools has
# that second frame in its exchange room until the exchange is made. The smallest budget that
# works is the last tier's need.
MESSAGE_ROOM = 64     # tokens a tier keeps for the user's message
EXCHANGE_ROOM = 256   # tokens a tier with tools keeps for one call and its result (a search of 3 pages)
TIERS = (("full", "system", 2), ("compact", "system_compact", 1), ("bare", "system_compact", 2))


def _compact(schemas: list[dict]) -> list[dict]:
    """The same tools with each description cut to its first sentence and no argument descriptions."""
    out = []
    for schema in schemas:
        fn = dict(schema["function"])
        fn["description"] = fn["description"].split(". ")[0].rstrip(".") + "."
        params = dict(fn["parameters"])
        params["properties"] = {k: {a: b for a, b in v.items() if a != "description"}
                                for k, v in params["properties"].items()}
        fn["parameters"] = params
        out.append({"type": "function", "function": fn})
    return out


def _paging(schemas: list[dict]) -> list[dict]:
    """The paging tools alone: the compact tier has no room for the working state's."""
    from pager.tools.functions import STATE_TOOLS

    optional = {fn.__name__ for fn in STATE_TOOLS}
    return [s for s in schemas if s["function"]["name"] not in optional]


_COUNTED: dict[tuple[object, str], int] = {}   # the fixed texts (prompts, tool schemas) are counted once each


def _count(session: Session, text: str) -> int:
    key = (session.tokenizer, text)
    if key not in _COUNTED:
        if len(_COUNTED) > 512:   # clients' own tools vary: keep the cache small
            _COUNTED.clear()
        _COUNTED[key] = session.tokenizer.count(text)
    return _COUNTED[key]


def _tool_tokens(session: Session, tools: list[dict]) -> int:
    return _count(session, json.dumps(tools, separators=(",", ":"))) if tools else 0


def _fixed(session: Session, prefix: str, tools: list[dict]) -> int:
    """Tokens of the prompt that are not memory and not the message (context.build's arithmetic)."""
    return _count(session, prefix) + _count(session, SEPARATOR) + _tool_tokens(session, tools) \
        + 2 * MESSAGE_OVERHEAD + REPLY_PRIMING


def _map_floor(session: Session) -> int:
    return min(session.home.config.map_reserve, MAP_FLOOR)


def _need(session: Session, tier: tuple[str, str, int], dispatcher: Dispatcher) -> tuple[int, str, list[dict]]:
    name, prompt, pages = tier
    prefix = load(prompt).strip()
    tools = [] if name == "bare" else dispatcher.schemas() if name == "full" else _compact(_paging(dispatcher.schemas()))
    need = _fixed(session, prefix, tools) + _map_floor(session) + pages * session.page_tokens + MESSAGE_ROOM \
        + (EXCHANGE_ROOM if tools else 0)
    return need, prefix, tools


def minimum_budget(session: Session, dispatcher: Dispatcher = MODEL) -> int:
    """The smallest budget under which a message can be sent and answered."""
    return _need(session, TIERS[-1], dispatcher)[0]


def fixed_regions(session: Session, dispatcher: Dispatcher, budget: int,
                  tools: bool = True) -> tuple[str, str, list[dict]]:
    """(tier, system prompt, tool schemas): the richest tier the budget holds (without tools: the bare one)."""
    for tier in TIERS if tools else TIERS[-1:]:
        need, prefix, schemas = _need(session, tier, dispatcher)
        if budget >= need:
            return tier[0], prefix, schemas
    raise BudgetError(f"a budget of {budget:,} tokens cannot hold a prompt, the open page and one page of memory "
                      f"of {session.page_tokens} tokens and a message; raise --budget to at least {need:,}")


# -- who pages: the model through tools too, or pager alone ----------------------------------------------------
# A model on this machine's CPU takes about a minute per step over a 2K prompt (Qwen2.5 1.5B, 2 cores), and
# a small model offered tools mostly writes calls as text, to tools that do not exist; automatic paging has
# already faulted in what the message's words find. So a model served from loopback, from a local runtime,
# or named as 3B parameters or fewer, answers from automatic paging alone unless told otherwise
# (BENCHMARKS.md, "Answers from a local model", measures both modes).
LOCAL_PROVIDERS = ("ollama/", "ollama_chat/", "llamafile/", "lm_studio/", "llama_cpp/", "hosted_vllm/")
SMALL_MODEL = re.compile(r"(?<![\d.])(0\.\d+|[1-3](\.\d+)?)b(?![a-z])", re.I)   # 0.5b, 1.5B, 3b
PAGING = {"tools": "automatic paging and the paging tools", "automatic": "automatic paging only (no tools)"}
CALL_RETRIES = 2   # replies per message holding tool calls pager cannot run, answered with a note, before it gives up


def default_paging(model: str, api_base: str = "") -> str:
    """"tools" or "automatic" for a model, when the setting is auto (see above)."""
    if not model or model.startswith("pager/"):
        return "tools"
    small = model.startswith(LOCAL_PROVIDERS) or bool(api_base and local_server(api_base)) \
        or bool(SMALL_MODEL.search(model.rsplit("/", 1)[-1]))
    return "automatic" if small else "tools"


# -- echoes of pager's own text in a reply ------------------------------------------------------------------------
# Some models repeat their prompt: the system prompt, the memory map, page headers, tool results. Stored as
# the reply, that text would come back as a page whose lines look like pager's own (a second, stale memory
# map), and reach the user as the answer. A run of reply lines that are all lines pager sent this message
# (blank and very short lines aside) is cut when it holds two of pager's own lines (the system prompt's, the
# map's, a page header), or one among three: a model quoting turns or what a tool found, or citing a header,
# keeps its quote.
_HEADER = re.compile(r"^\[(p\d+ · .*|[a-z][a-z ]*)\]$")
SHORT = 8   # characters: lines this short ("-", "Yes.") neither make nor break a run


def unecho(text: str, sent: str, own: set[str]) -> tuple[str, int]:
    """The reply without the runs of lines it repeats from what pager sent, and how many lines were cut."""
    known = {line.strip() for line in sent.splitlines() if len(line.strip()) >= SHORT}
    lines = text.splitlines()
    keep = [True] * len(lines)
    i = 0
    while i < len(lines):
        j, said, ours = i, 0, 0
        while j < len(lines) and (len(lines[j].strip()) < SHORT or lines[j].strip() in known):
            line = lines[j].strip()
            if len(line) >= SHORT:
                said += 1
                ours += line in own or bool(_HEADER.match(line))
            j += 1
        if ours >= 2 or (ours and said >= 3):   # short lines at either end are the reply's own
            start, end = i, j
            while len(lines[start].strip()) < SHORT:
                start += 1
            while len(lines[end - 1].strip()) < SHORT:
                end -= 1
            keep[start:end] = [False] * (end - start)
        i = max(j, i + 1)
    cut = sum(1 for k, line in zip(keep, lines) if not k and line.strip())
    if not cut:
        return text, 0
    return re.sub(r"\n{3,}", "\n\n", "\n".join(line for k, line in zip(keep, lines) if k)).strip(), cut


def _canonical(arguments: str) -> str:
    """A call's arguments, the same for the same JSON however spaced (unreadable: as sent)."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


class Agent:
    def __init__(self, session: Session, model: Model, dispatcher: Dispatcher = MODEL,
                 max_steps: int | None = None, speaker: str = "user", paging: str | None = None) -> None:
        cfg = session.home.config
        self.session, self.model, self.dispatcher = session, model, dispatcher
        self.max_steps = max_steps or cfg.max_steps
        self.speaker = speaker
        window = model.window() - model.output_tokens
        self.budget = min(cfg.budget, window) if window > 0 else cfg.budget
        self.paging = paging or (cfg.paging if cfg.paging != "auto" else default_paging(cfg.model or model.name,
                                                                                         cfg.api_base))
        self._regions(self.budget)
        self.on_context = lambda ctx: None   # replay and `trace show` look at each assembled context
        self._ts = 0.0
        self._reply_key: Callable[[str], str] | None = None
        self._instructions = ""
        self._client_tools: list[dict] = []
        self._shortened: set[int] = set()   # this message's tool results already cut to a note (by id())

    def _regions(self, budget: int) -> None:
        self.tier, self.prefix, self.tools = fixed_regions(self.session, self.dispatcher, budget,
                                                           tools=self.paging == "tools")
        self.tool_tokens = _tool_tokens(self.session, self.tools)

    def use_paging(self, paging: str) -> None:
        """Page through tools too ("tools") or automatically only ("automatic"), from the next message on."""
        if paging not in PAGING:
            raise ValueError(f"unknown paging {paging!r}; choose one of {', '.join(PAGING)}")
        if paging != self.paging:
            self.paging = paging
            self._regions(self.budget)

    def ask(self, text: str, key: str = "", reply_key: Callable[[str], str] | None = None, instructions: str = "",
            tools: list[dict] | None = None, resume: list[dict] | None = None) -> Reply:
        """Answer one message. For callers that send their own conversation (the HTTP proxy): key (and
        reply_key(reply text)) are idempotency keys for the turns, so a turn already held is not added
        again; instructions join the system prompt; tools are the caller's own, offered to the model
        with pager's, and a reply calling one ends the loop with `client_calls` for the caller to run;
        resume is that exchange (the calls and their results) when the caller comes back with them.
        Each is recorded in the `user` event when given, so replay asks the same."""
        s = self.session
        self._instructions, self._client_tools = instructions, list(tools or [])
        self._check_fits(text)
        ts = s.clock()
        extra = {k: v for k, v in (("key", key), ("instructions", instructions), ("tools", self._client_tools),
                                   ("resume", list(resume or [])),
                                   ("paging", "" if self.paging == "tools" else self.paging)) if v}
        s.emit("user", text=text, ts=ts, speaker=self.speaker, **extra)
        turn = s.append(self.speaker, text, role="user", ts=ts, origin="agent", key=key)
        self.last_turn = turn.turn  # the turn that holds the user's message, once it is durable
        self._ts, self._reply_key = ts, reply_key
        scratch: list[dict] = list(resume or [])
        self._shortened = set()
        calls: list[dict] = []
        budget = self.budget
        step = unread = 0
        done_calls: dict[tuple[str, str], tuple[int, str]] = {}   # this message's calls, run once each
        while step < self.max_steps:
            step += 1
            try:
                ctx = self._build(text, scratch, budget, step, turn.turn)
            except BudgetError as exc:
                return self._fail(step, calls, f"the prompt no longer fits the budget ({exc})")
            s.emit("model_request", step=step, digest=ctx.digest, tokens=ctx.tokens, frames=ctx.frames,
                   pages=[f"p{n}" for n in ctx.pages],
                   **({"excerpts": ctx.excerpts} if ctx.excerpts else {}))   # turns shown whole in excerpt slabs
            self.on_context(ctx)
            try:
                reply = self.model.complete(ctx.messages() + scratch, self.tools + self._client_tools)
            except ContextOverflow as exc:
                budget = int(budget * 0.75)
                s.emit("overflow", step=step, budget=budget, error=str(exc)[:300])
                if budget < minimum_budget(s, self.dispatcher):
                    return self._fail(step, calls, "the model's window is too small even for one page and a message")
                # the fixed regions shrink with the budget, as they would have at this budget from the start
                self._regions(budget)
                step -= 1
                continue
            except ModelError as exc:
                return self._fail(step, calls, str(exc))
            s.emit("model_reply", step=step, text=reply.text, tool_calls=reply.tool_calls, retries=reply.retries,
                   **({"truncated": True} if reply.truncated else {}))   # replay cuts it as the model did
            said, asked = reply.text, reply.tool_calls
            if not asked:
                reading = textcalls.read(reply.text, self._offered(), step)
                if reading.calls and (self.tools or self._client_tools):   # written as text, run as sent: the trace says which
                    s.emit("calls_in_text", step=step, form=reading.form, calls=reading.calls)
                    said, asked = reading.text, reading.calls
                elif reading.calls or reading.malformed:   # never shown as an answer: the model is told why
                    reason = reading.malformed or "tools are off"
                    s.emit("reply_unread", step=step, reason=reason, form=reading.form, retry=unread < CALL_RETRIES)
                    if unread >= CALL_RETRIES:
                        return self._fail(step, calls, f"the model wrote tool calls as text {unread + 1} times instead "
                                                       "of answering (the trace holds them); ask again, or use a "
                                                       "larger model")
                    unread += 1
                    scratch += [{"role": "assistant", "content": reply.text},
                                {"role": "user", "content": self._unread_note(reason)}]
                    continue
            if not asked:
                text_out, cut = self._unecho(reply.text, ctx, scratch, step)
                done = self._finish(text_out, step, calls)
                done.truncated, done.unechoed = reply.truncated, cut
                return done
            scratch.append({"role": "assistant", "content": said or None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in asked]})
            theirs = [c for c in asked if c["name"] not in self.dispatcher.functions
                      and c["name"] in self._client_names()]
            for call in asked:
                if call in theirs:
                    continue
                s.emit("tool_call", step=step, id=call["id"], name=call["name"], arguments=call["arguments"])
                again = (call["name"], _canonical(call["arguments"]))
                if again in done_calls:   # a small model repeats a call that is done: say so, run nothing
                    was, said_then = done_calls[again]
                    result = render("call_repeated", tool=call["name"], step=was, result=said_then).strip()
                else:
                    result = self.dispatcher.call(s, call["name"], call["arguments"])
                    done_calls[again] = (step, result)
                s.emit("tool_result", step=step, id=call["id"], name=call["name"], result=result)
                scratch.append({"role": "tool", "tool_call_id": call["id"], "content": result})
                calls.append({**call, "result": result})
            if theirs:   # pager's own calls of this step are done; the caller runs its own and comes back
                s.emit("client_calls", step=step, calls=[{"id": c["id"], "name": c["name"]} for c in theirs])
                self.session.write_memory()
                return Reply(said, step, calls, client_calls=theirs)
        s.emit("step_limit", steps=self.max_steps)
        text = (f"(stopped after {self.max_steps} model calls without a final answer; "
                "raise max_steps or ask more narrowly)")
        stopped = self._finish(text, step, calls)
        stopped.stopped = True
        return stopped

    def _unecho(self, text: str, ctx, scratch: list[dict], step: int) -> tuple[str, int]:
        """The reply without pager's own text it repeats (unecho); the whole reply stays in `model_reply`."""
        results = [m["content"] or "" for m in scratch if m["role"] == "tool"]
        # pager's own lines: the prompt and the map. A tool result's lines only lengthen a run: a model may
        # answer by quoting what it found; page headers count through _HEADER.
        own = {line.strip() for part in [self.prefix, ctx.memory.split(SEPARATOR, 1)[0]]
               for line in part.splitlines() if line.strip()}
        kept, cut = unecho(text, "\n".join([ctx.system, *results]), own)
        if cut:
            self.session.emit("reply_unechoed", step=step, lines=cut)
        return kept, cut

    def _offered(self) -> set[str]:
        """The tool names of this message: pager's and the caller's (a text call may name either)."""
        return {t["function"]["name"] for t in self.tools} | self._client_names() | set(self.dispatcher.functions)

    def _unread_note(self, reason: str) -> str:
        if not self.tools and not self._client_tools:
            return load("no_tools").strip()
        names = [t["function"]["name"] for t in self.tools] + sorted(self._client_names())
        return render("call_unread", reason=reason, tools=", ".join(names)).strip()

    def _client_names(self) -> set[str]:
        return {t.get("function", {}).get("name") for t in self._client_tools}

    @property
    def system(self) -> str:
        """The system prompt of this message: the tier's, then the caller's instructions."""
        return f"{self.prefix}\n\n{self._instructions}" if self._instructions else self.prefix

    def _build(self, text: str, scratch: list[dict], budget: int, step: int, hide: int):
        """Assemble; when this message's tool exchanges outgrow the budget, drop the oldest of them
        (their pages stay resident, their results stay in the trace) rather than fail."""
        s = self.session
        prefix = self.system
        while True:
            cut = next((i for i, m in enumerate(scratch[1:], 1) if m["role"] == "assistant"), None)
            scratch_tokens = self.tool_tokens + _tool_tokens(s, self._client_tools) + message_tokens(s, scratch)
            if cut is not None and size_frames(s, text, prefix, scratch_tokens, budget)[0] < self._held(s):
                # an older exchange gives way before a page this message is using (its result is
                # in the trace; what it paged in stays resident)
                s.emit("scratch_trimmed", step=step, dropped=cut)
                del scratch[:cut]
                continue
            try:
                return build(s, text, prefix, scratch_tokens, budget, autopage=step == 1, hide_turn=hide)
            except BudgetError:
                if cut is None:
                    if not self._shorten(scratch, step):
                        raise
                    continue
                s.emit("scratch_trimmed", step=step, dropped=cut)
                del scratch[:cut]

    def _shorten(self, scratch: list[dict], step: int) -> bool:
        """One exchange alone outgrew the budget (a model calling many tools at once): its largest tool
        result becomes a note saying so, which the model can act on; the whole result is in the trace."""
        s = self.session
        names = {c["id"]: c["function"]["name"] for m in scratch if m["role"] == "assistant"
                 for c in m.get("tool_calls") or []}
        sizes = {i: s.tokenizer.count(m["content"] or "") for i, m in enumerate(scratch)
                 if m["role"] == "tool" and id(m) not in self._shortened}
        for i in sorted(sizes, key=lambda i: -sizes[i]):
            name = names.get(scratch[i]["tool_call_id"], "the tool")
            note = (f"(this result of {sizes[i]:,} tokens did not fit the prompt beside the others; call {name} "
                    "again on its own, or ask for less)")
            if s.tokenizer.count(note) < sizes[i]:
                s.emit("tool_result_cut", step=step, id=scratch[i]["tool_call_id"], name=name, tokens=sizes[i])
                scratch[i] = {**scratch[i], "content": note}   # a new message: the caller's own (resume) stay as sent
                self._shortened.add(id(scratch[i]))
                return True
        return False

    @staticmethod
    def _held(s: Session) -> int:
        """Frames holding what this message uses: the open tail, pinned pages, pages it referenced."""
        return sum(1 for n in s.frames.slots
                   if n is not None and (n == s.tail_n or n in s.in_use or s.table[n].pinned))

    def _check_fits(self, text: str) -> None:
        """Refuse, before accepting it, a message the prompt could never hold with even one page."""
        s = self.session
        room = self.budget - _fixed(s, self.system, self.tools + self._client_tools) - _map_floor(s) - s.page_tokens
        size = s.tokenizer.count(text)
        if size > room:
            raise BudgetError(f"message of {size:,} tokens exceeds the {max(room, 0):,} the budget of {self.budget:,} "
                              "leaves for a message; raise --budget, send it in parts, or `pager ingest` it as a file")

    def _finish(self, text: str, steps: int, calls: list[dict]) -> Reply:
        if text.strip():
            key = self._reply_key(text) if self._reply_key else ""
            self.session.append("assistant", text, role="assistant", ts=self._ts, origin="agent", key=key)
        self.session.write_memory()   # the bookmark model's batch; summaries of episodes that closed
        return Reply(text, steps, calls)

    def _fail(self, step: int, calls: list[dict], error: str) -> Reply:
        self.session.emit("model_error", step=step, error=error)
        return Reply(f"(no answer: {error}; your message is saved)", step, calls, error=error)
