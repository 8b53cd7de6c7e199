"""The OpenAI chat-completions dialect of `pager serve`: requests in, the turn, replies and chunks out.

A client of the proxy keeps sending what any OpenAI client sends: the whole conversation,
every call. pager keeps the conversation itself, so each message carries an idempotency
key, a hash chained over the conversation up to it (role and content of every message
from the first). A message the session already holds is not appended again; an edited
message changes its key and every key after it, so the edited branch is appended as new
turns. System messages are instructions, not conversation: they join the prompt's prefix
and stay out of the chain and out of memory.

The request's last message must be the user's: it is the question the agent loop answers,
with the memory tools run server-side (the client sees their calls in the `pager` field
of the reply). A question the session already answered (a client retrying a call whose
reply it lost) gets the recorded reply, without calling the model again. A question sent alone
that the session holds already is a retry only right after itself; later, the same words are a
new question (`newest_only_key`).

Client-defined tools (`tools`) pass through: the model is offered them with pager's, and
when it calls one the reply carries those calls (`finish_reason: "tool_calls"`), pager's
own calls of that step already run. The client runs its tools and sends the conversation
again with the calls and their results after the question; the agent loop resumes there.
Tool exchanges are scratch, not conversation: they stay out of the chain and of memory.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from .config import name_problem
from .errors import InputError

OFFLINE_NAME = "offline"   # the model name clients use for the offline memory shell
SESSION_HEADER = "x-pager-session"


class RequestError(InputError):
    """A request the server refuses: status and OpenAI error fields with the message."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error", code: str = "",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.type, self.code, self.param = status, type, code or type, param

    def body(self) -> dict:
        return error_body(str(self), self.type, self.code, self.param)


def error_body(message: str, type: str, code: str = "", param: str | None = None) -> dict:
    """The one error shape of the server, OpenAI's: {"error": {message, type, param, code}}."""
    return {"error": {"message": message, "type": type, "param": param, "code": code or type}}


def chain(previous: str, role: str, content: str) -> str:
    """The idempotency key of a message: a hash of the key before it, its role and its content."""
    return hashlib.sha256(f"{previous}\x00{role}\x00{content}".encode()).hexdigest()[:32]


def session_name(raw: object, where: str) -> str:
    """A session name as a client gave it: any text, but bounded, printable and without "/" (a name
    with one could be made over /v1 and never reached over REST, whose routes take one path segment)."""
    if not isinstance(raw, str):
        raise RequestError(f"{where} must be a non-empty session name", param="session")
    problem = name_problem(raw)
    if problem:
        raise RequestError(f"{where} {problem}", param="session")
    return raw


@dataclass
class Message:
    role: str          # user or assistant
    text: str
    speaker: str
    key: str


@dataclass
class ChatRequest:
    model: str                       # as the client named it
    session: str
    system: str                      # the client's system messages, joined
    history: list[Message]           # every non-system message, keyed; the last is the user's question
    stream: bool = False
    include_usage: bool = False
    tools: list[dict] = field(default_factory=list)    # the client's own tools, OpenAI function schemas
    resume: list[dict] = field(default_factory=list)   # the tool exchange after the question, when coming back

    @property
    def question(self) -> Message:
        return self.history[-1]

    @property
    def earlier(self) -> list[Message]:
        return self.history[:-1]


def parse(body: object, header_session: str | None, default_session: str, max_messages: int) -> ChatRequest:
    """Validate a chat-completions body; RequestError says what to change."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise RequestError("`model` is required: 'offline' for the memory shell, or a litellm model", param="model")
    if body.get("functions") or body.get("function_call"):
        raise RequestError("`functions` is the deprecated form; send `tools`", param="functions",
                           code="unsupported_parameter")
    _tool_choice(body.get("tool_choice"))
    tools = _tools(body.get("tools"), body.get("tool_choice"))
    if body.get("n") not in (None, 1):
        raise RequestError("only n=1 is supported", param="n", code="unsupported_parameter")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("`messages` must be a non-empty array", param="messages")
    if len(messages) > max_messages:
        raise RequestError(f"{len(messages)} messages is over the limit of {max_messages}; send the newest part of "
                           "the conversation (pager keeps the rest)", param="messages", code="too_many_messages")
    if header_session is not None:
        session = session_name(header_session, "the X-Pager-Session header")
    elif body.get("user") is not None:
        session = session_name(body.get("user"), "`user`")
    else:
        session = default_session
    system: list[str] = []
    history: list[Message] = []
    exchange: list[dict] = []   # tool calls and results since the last user message
    key = ""
    for i, m in enumerate(messages):
        role, text = _message(m, i)
        if role in ("system", "developer"):
            system.append(text)
        elif role == "tool" or m.get("tool_calls"):
            exchange.append(_exchange(m, role, text, i))
        elif text.strip():   # an empty assistant turn holds nothing to remember
            if role == "assistant":
                exchange = []
            key = chain(key, role, text)
            speaker = m.get("name") if isinstance(m.get("name"), str) and m.get("name").strip() else role
            history.append(Message(role, text, speaker, key))
            if role == "user":
                exchange = []
    if not history or history[-1].role != "user":
        raise RequestError("the last message must be the user's (role 'user') with some text, or the results of "
                           "the tool calls the reply before asked for", param="messages")
    if exchange:
        _check_exchange(exchange)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"`stream` must be true or false, not {json.dumps(stream)[:40]}", param="stream",
                           code="invalid_type")
    options = body.get("stream_options") or {}
    return ChatRequest(model.strip(), session, "\n\n".join(system), history, bool(stream),
                       bool(isinstance(options, dict) and options.get("include_usage")), tools, exchange)


def _tools(raw: object, choice: object) -> list[dict]:
    """The client's function tools, checked: none may take the name of one of pager's memory tools."""
    from pager.tools import MODEL

    if raw is None:
        return []
    if not isinstance(raw, list):
        raise RequestError("`tools` must be an array of function tools", param="tools")
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) and t.get("type") == "function" else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(fn, dict) or not isinstance(name, str) or not name:
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": …}}}}",
                               param=f"tools[{i}]")
        if name in MODEL.functions:
            raise RequestError(f"tool {name!r} has the name of one of pager's memory tools ({', '.join(MODEL.names)}); "
                               "rename yours", param=f"tools[{i}]")
        out.append({"type": "function", "function": {k: fn[k] for k in ("name", "description", "parameters", "strict")
                                                     if k in fn}})
    return [] if choice == "none" else out


def _tool_choice(choice: object) -> None:
    """'auto' or 'none' (your tools left out), with tools of your own or without: pager's stay callable."""
    if choice not in (None, "auto", "none"):
        raise RequestError(f"tool_choice may be 'auto' or 'none', not {json.dumps(choice)}: pager's memory tools "
                           "must stay callable", param="tool_choice", code="unsupported_parameter")


def _exchange(m: dict, role: str, text: str, i: int) -> dict:
    """A tool call message or a tool result, in the shape the model is sent."""
    where = f"messages[{i}]"
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise RequestError(f"{where} needs the `tool_call_id` it answers", param=f"{where}.tool_call_id")
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    if role != "assistant" or not isinstance(m.get("tool_calls"), list):
        raise RequestError(f"{where}: only an assistant message carries tool calls", param=where)
    calls = []
    for c in m["tool_calls"]:
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(c.get("id"), str) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}.tool_calls: each needs an id and a function name", param=f"{where}.tool_calls")
        arguments = fn.get("arguments") if isinstance(fn.get("arguments"), str) else json.dumps(fn.get("arguments") or {})
        calls.append({"id": c["id"], "type": "function", "function": {"name": fn["name"], "arguments": arguments}})
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


def _check_exchange(exchange: list[dict]) -> None:
    """After the question: calls, each answered by a result, ending in results."""
    asked = {c["id"] for m in exchange if m["role"] == "assistant" for c in m["tool_calls"]}
    answered = {m["tool_call_id"] for m in exchange if m["role"] == "tool"}
    if exchange[-1]["role"] != "tool" or asked != answered:
        missing = ", ".join(sorted(asked - answered)) or "none"
        raise RequestError(f"after the question, each tool call needs its result (role 'tool' with its "
                           f"tool_call_id), and the last message must be one; unanswered: {missing}", param="messages")


def _message(m: object, i: int) -> tuple[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise RequestError(f"{where} must be an object with `role` and `content`", param=where)
    role = m.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise RequestError(f"{where}.role {role!r} is not supported", param=f"{where}.role")
    if m.get("function_call"):
        raise RequestError(f"{where} carries `function_call`, the deprecated form; send `tool_calls`", param=where)
    content = m.get("content")
    if content is None:
        return role, ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}.content: only text parts are supported", param=f"{where}.content")
            parts.append(part["text"])
        text = "\n".join(parts)
    else:
        raise RequestError(f"{where}.content must be a string or an array of text parts", param=f"{where}.content")
    if "\x00" in text:
        raise RequestError(f"{where}.content contains a NUL character", param=f"{where}.content")
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise RequestError(f"{where}.content holds a lone surrogate, which is not valid Unicode; send valid UTF-8",
                               param=f"{where}.content") from None
    return role, text


# -- the turn ---------------------------------------------------------------------------------------
def load_models() -> None:
    """Import litellm (seconds): once, before the first turn of a model other than the offline shell."""
    from .llm import litellm, register
    from .offline import OfflineShell

    litellm()
    register("offline", OfflineShell())   # `pager/offline` through litellm too


def make_model(req: ChatRequest, body: dict, default_output: int, timeout: float, api_base: str = ""):
    """The model the request names: the offline shell in process (no litellm), else litellm's."""
    from .llm import OFFLINE, LiteLLMModel
    from .model import HandlerModel
    from .offline import OfflineShell

    output = body.get("max_completion_tokens") or body.get("max_tokens") or default_output
    output = max(16, min(int(output), 32_768)) if isinstance(output, int) else default_output
    if req.model == OFFLINE_NAME:
        return HandlerModel(OfflineShell(), OFFLINE, output_tokens=output)
    return LiteLLMModel(req.model, output_tokens=output, attempts=2, timeout=timeout, api_base=api_base)


def recorded_reply(s, question: str) -> str | None:
    """The reply the session recorded to the question with this key, if it was answered: an assistant
    turn after it whose key chains from it (a client retrying a call whose reply it lost)."""
    turn = s.held(question)
    if turn is None:
        return None
    s.home.flush()  # the turns after it may still be in the journal only
    for t in s.home.store.turns(s.user, s.name, after=turn)[:64]:
        if t.role == "assistant" and t.key == chain(question, "assistant", t.text):
            return t.text
    return None


def newest_only_key(s, question: Message) -> str:
    """The key of a question sent alone (a client sending the whole conversation sends its first message
    so; a client that lets pager keep the conversation sends every message so). Its key from an empty
    conversation, unless the session holds that key already: then the same words right after themselves
    are a retry (with the model's reply after them: that reply, recorded; without one: asked again, kept
    once), and anywhere else a new question, keyed after the session's last turn. Keyed from the empty
    conversation every time, a question asked again after memory changed got its first answer back."""
    if s.held(question.key) is None:
        return question.key
    from .summaries import session_turns

    last = session_turns(s, after=max(0, s.turn_count - 2))
    asked = [t for t in last if t.role == "user" and t.text == question.text and t.key]
    if asked and (asked[-1] is last[-1] or (len(last) == 2 and asked[-1] is last[0] and last[1].role == "assistant")):
        return asked[-1].key
    return chain(last[-1].key if last and last[-1].key else f"turn {s.turn_count}", "user", question.text)


def rekey_window(s, history: list[Message]) -> None:
    """A client that sends only its newest messages (a window: the server's limit on messages asks for
    it) starts its history inside the conversation, so each key, chained from the window's first
    message, is new, and the window would be stored again. When the messages before the question are
    the session's latest turns (the same roles and texts, in order, ending at most two turns before
    the last: a retry comes after the reply), they take those turns' keys and the question chains
    from them. Otherwise the history is a conversation of its own and keeps its keys."""
    from .summaries import session_turns

    earlier = history[:-1]
    n = len(earlier)
    if n > s.turn_count:
        return
    last = session_turns(s, after=max(0, s.turn_count - n - 2))
    for end in range(len(last), n - 1, -1):
        run = last[end - n:end]
        if all(t.key and t.role == m.role and t.text == m.text for t, m in zip(run, earlier)):
            for t, m in zip(run, earlier):
                m.key = t.key
            history[-1].key = chain(run[-1].key, history[-1].role, history[-1].text)
            return


def too_much_text(texts: list[str], limit: int | None, indexed: bool = True) -> None:
    """Refuse (413) new turns holding more than `limit` characters in all: their pages are made under the
    engine lock, which cannot be let go halfway through a turn, so every other session would wait.
    indexed: texts[i] is the body's messages[i], and a message over the limit alone is named."""
    total = sum(map(len, texts))
    if limit is None or total <= limit:
        return
    why = f"over the limit of {limit:,} characters of new turns in one request (their pages are made while the " \
          "server's other sessions wait)"
    fix = f"requests of at most {limit:,} characters each, or raise `pager serve --max-append-chars`"
    longest = max(range(len(texts)), key=lambda i: len(texts[i]))
    if len(texts[longest]) > limit:
        where = f"messages[{longest}]" if indexed else "a message"
        raise RequestError(f"{where} holds {len(texts[longest]):,} characters, {why}; split it into several "
                           f"messages sent in {fix}", 413, code="too_much_text",
                           param=f"messages[{longest}]" if indexed else "messages")
    raise RequestError(f"the new turns hold {total:,} characters, {why}; send them in several {fix}", 413,
                       code="too_much_text", param="messages")


def take_turn(engine, tenant: str, req: ChatRequest, body: dict, timeout: float, queued: float,
              on_ask: Callable[[], None] | None = None, append_chars: int | None = None) -> dict:
    """One chat turn, on a worker thread with the session's lock and the engine lock held
    (`queued`: the perf_counter when the request asked for them). `on_ask` is called when the model
    is first asked: whatever refuses the turn (the lease, the budget, more new text than
    `append_chars`) has not by then."""
    from .agent import Agent, Reply
    from .engine import Unlocked

    started = time.perf_counter()
    s = engine.open(tenant, req.session)
    s.sync()
    if req.earlier and s.held(req.earlier[0].key) is None:
        rekey_window(s, req.history)
    key = req.question.key if req.earlier or req.resume else newest_only_key(s, req.question)
    if not req.resume and (text := recorded_reply(s, key)) is not None:
        return {"reply": Reply(text, 0), "appended": 0, "faulted": [], "turns": s.turn_count, "recorded": True,
                "timing": {"engine_ms": round((time.perf_counter() - started) * 1000, 2), "model_ms": 0.0,
                           "wait_ms": round((started - queued) * 1000, 2)},
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}
    # what the session holds already is not appended again, so it does not count
    too_much_text([m.text for m in req.earlier if s.held(m.key) is None]
                  + ([req.question.text] if s.held(key) is None else []), append_chars, indexed=False)
    model = make_model(req, body, engine.config.output_tokens, timeout, engine.config.api_base)
    unlocked = Unlocked(model, engine.lock)
    agent = Agent(s, unlocked, speaker=req.question.speaker)
    engine.trace(s, req.model, agent.budget)
    before = s.turn_count
    earlier = [dict(speaker=m.speaker, text=m.text, role=m.role, key=m.key) for m in req.earlier]
    seen = {"faulted": [], "tokens": 0, "others": 0}

    def listen(event):
        if event.kind == "append" and event.data.get("origin") == "other process":
            seen["others"] += len(event.data["turns"])   # taken in from another home (its lease), not appended here
        elif event.kind == "fault":
            seen["faulted"].append(event.data["page"])
        elif event.kind == "model_request":
            seen["tokens"] = event.data["tokens"]["total"]
            if on_ask is not None:
                on_ask()

    s.events.listeners.append(listen)
    try:
        # the messages and the reply are acknowledged together, by the response: one fsync for all, after
        # the reply (the question is written before the model is called, so a crash of this process loses
        # nothing, and a failing model still leaves it durable before the 502)
        with s.home.journal.deferred():
            if earlier:
                s.append_many(earlier)
            reply = agent.ask(req.question.text, key=key, reply_key=lambda text: chain(key, "assistant", text),
                              instructions=req.system, tools=req.tools, resume=req.resume)
    finally:
        s.events.listeners.remove(listen)
    completion_tokens = s.tokenizer.count(reply.text)
    model_ms, relock_ms = unlocked.seconds * 1000, unlocked.waited * 1000
    engine_ms = (time.perf_counter() - started) * 1000 - model_ms - relock_ms
    wait_ms = (started - queued) * 1000 + relock_ms
    return {"reply": reply, "appended": s.turn_count - before - seen["others"], "faulted": seen["faulted"], "turns": s.turn_count,
            "timing": {"engine_ms": round(engine_ms, 2), "model_ms": round(model_ms, 2),
                       "wait_ms": round(wait_ms, 2)},
            "usage": {"prompt_tokens": seen["tokens"], "completion_tokens": completion_tokens,
                      "total_tokens": seen["tokens"] + completion_tokens}}


WARM_MESSAGE = "Warm up: the first request should cost what the hundredth does. What was decided?"


def warm(engine) -> float:
    """Pay, before `pager serve` says it is ready, what its first chat call would: LanceDB's import and the
    store's tables read once, the tokenizer, the embedder, the model names litellm ships (which a refusal
    reads), and one offline chat turn through take_turn on a home of its own (a temporary folder, a store
    in memory), thrown away after: nothing of it reaches the engine's home. The store's writes are not
    warmed: they come in batches (the flush), paid by whichever call brings one, never only the first. A model other than the offline
    shell is not warmed (litellm's import, seconds, is paid by the first call naming one). Returns the
    seconds it took."""
    import dataclasses
    import tempfile
    from pathlib import Path

    from .engine import Engine
    from .home import Home
    from .llm import shipped_names
    from .store import MemoryStore

    started = time.perf_counter()
    home, config = engine.home, engine.config
    for read in (home.store.state, home.store.bookmarks, home.store.turns):
        read(config.user, "")   # no session has the empty name: the tables' first reads, nothing found
    home.store.pages(config.user, "", with_vectors=True)
    shipped_names()
    with tempfile.TemporaryDirectory(prefix="pager-warm-") as folder:
        scratch_config = dataclasses.replace(config, home=Path(folder), db="", bookmark_model="", memory_model="")
        scratch = Engine(scratch_config, Home(scratch_config, store=MemoryStore(home.embedder.dim), embedder=home.embedder,
                                              tokenizer=home.tokenizer, durable=False), traces=False)
        try:
            request = parse({"model": OFFLINE_NAME, "messages": [{"role": "user", "content": WARM_MESSAGE}]},
                            None, "warm", 8)
            scratch.call(take_turn, scratch, config.user, request, {}, 60.0, time.perf_counter(),
                         tenant=config.user, name="warm")
        finally:
            scratch.close()
    return time.perf_counter() - started


# -- replies ----------------------------------------------------------------------------------------
def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def finish_reason(reply) -> str:
    """OpenAI's finish_reason for an agent's reply: its client's tool calls, the output limit, or a stop."""
    return "tool_calls" if reply.client_calls else "length" if reply.truncated else "stop"


def completion(cid: str, model: str, text: str, usage: dict, info: dict, calls: list[dict] | None = None,
               finish: str = "") -> dict:
    message: dict = {"role": "assistant", "content": text}
    if calls:
        message = {"role": "assistant", "content": text or None, "tool_calls": tool_calls(calls)}
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish or ("tool_calls" if calls else "stop")}],
            "usage": usage, "pager": info}


def tool_calls(calls: list[dict], indexed: bool = False) -> list[dict]:
    """The calls of the client's tools in OpenAI's shape (with an index in a streamed delta)."""
    return [{**({"index": i} if indexed else {}), "id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}} for i, c in enumerate(calls)]


def chunk(cid: str, model: str, delta: dict, finish: str | None = None, **extra) -> str:
    body = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def pieces(text: str, size: int = 48) -> list[str]:
    """The reply cut at word boundaries into chunks of about `size` characters, for streaming."""
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            space = text.rfind(" ", start + 1, end + 1)
            end = space + 1 if space > start else end
        out.append(text[start:end])
        start = end
    return out
