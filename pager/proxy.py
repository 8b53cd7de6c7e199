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
of the reply). Client-defined tools are refused: the proxy cannot run them.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field

from .errors import InputError

OFFLINE_NAME = "offline"   # the model name clients use for the offline memory shell
SESSION_HEADER = "x-pager-session"
MAX_NAME = 200


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
    """A session name as a client gave it: any text, but bounded and printable."""
    if not isinstance(raw, str) or not raw.strip():
        raise RequestError(f"{where} must be a non-empty session name")
    if len(raw) > MAX_NAME or any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise RequestError(f"{where} must be at most {MAX_NAME} printable characters")
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
    extra: dict = field(default_factory=dict)

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
    if body.get("tools") or body.get("functions"):
        raise RequestError("client-defined tools are not supported: pager runs its memory tools server-side; "
                           "drop `tools`", param="tools", code="unsupported_parameter")
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
    key = ""
    for i, m in enumerate(messages):
        role, text = _message(m, i)
        if role in ("system", "developer"):
            system.append(text)
            continue
        if not text.strip():
            continue  # an empty assistant turn holds nothing to remember
        key = chain(key, role, text)
        speaker = m.get("name") if isinstance(m.get("name"), str) and m.get("name").strip() else role
        history.append(Message(role, text, speaker, key))
    if not history or history[-1].role != "user":
        raise RequestError("the last message must be the user's (role 'user') with some text", param="messages")
    options = body.get("stream_options") or {}
    return ChatRequest(model.strip(), session, "\n\n".join(system), history, bool(body.get("stream")),
                       bool(isinstance(options, dict) and options.get("include_usage")))


def _message(m: object, i: int) -> tuple[str, str]:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise RequestError(f"{where} must be an object with `role` and `content`", param=where)
    role = m.get("role")
    if role not in ("system", "developer", "user", "assistant"):
        hint = "; pager runs its own tools, so tool results never come from the client" if role in ("tool", "function") else ""
        raise RequestError(f"{where}.role {role!r} is not supported{hint}", param=f"{where}.role")
    if m.get("tool_calls") or m.get("function_call"):
        raise RequestError(f"{where} carries tool calls; client-defined tools are not supported", param=where)
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
    return role, text


# -- the turn ---------------------------------------------------------------------------------------
def load_models() -> None:
    """Import litellm (seconds) and register the offline shell: once, before the first turn."""
    from .llm import litellm, register
    from .offline import OfflineShell

    litellm()
    register("offline", OfflineShell())


def take_turn(engine, tenant: str, req: ChatRequest, body: dict, timeout: float, queued: float) -> dict:
    """One chat turn, on a worker thread with the session's lock and the engine lock held
    (`queued`: the perf_counter when the request asked for them)."""
    from .agent import Agent
    from .engine import Unlocked
    from .llm import OFFLINE, LiteLLMModel

    started = time.perf_counter()
    s = engine.open(tenant, req.session)
    earlier = [dict(speaker=m.speaker, text=m.text, role=m.role, key=m.key) for m in req.earlier]
    before = s.turn_count
    if earlier:
        s.append_many(earlier)
    name = OFFLINE if req.model == OFFLINE_NAME else req.model
    output = body.get("max_completion_tokens") or body.get("max_tokens") or engine.config.output_tokens
    output = max(16, min(int(output), 32_768)) if isinstance(output, int) else engine.config.output_tokens
    model = LiteLLMModel(name, output_tokens=output, attempts=2, timeout=timeout)
    unlocked = Unlocked(model, engine.lock)
    agent = Agent(s, unlocked, speaker=req.question.speaker)
    if req.system:
        agent.prefix = f"{agent.prefix}\n\n{req.system}"
    seen = {"faulted": [], "tokens": 0}

    def listen(event):
        if event.kind == "fault":
            seen["faulted"].append(event.data["page"])
        elif event.kind == "model_request":
            seen["tokens"] = event.data["tokens"]["total"]

    s.events.listeners.append(listen)
    try:
        key = req.question.key
        reply = agent.ask(req.question.text, key=key, reply_key=lambda text: chain(key, "assistant", text))
    finally:
        s.events.listeners.remove(listen)
    completion_tokens = s.tokenizer.count(reply.text)
    model_ms, relock_ms = unlocked.seconds * 1000, unlocked.waited * 1000
    engine_ms = (time.perf_counter() - started) * 1000 - model_ms - relock_ms
    wait_ms = (started - queued) * 1000 + relock_ms
    return {"reply": reply, "appended": s.turn_count - before, "faulted": seen["faulted"], "turns": s.turn_count,
            "timing": {"engine_ms": round(engine_ms, 2), "model_ms": round(model_ms, 2),
                       "wait_ms": round(wait_ms, 2)},
            "usage": {"prompt_tokens": seen["tokens"], "completion_tokens": completion_tokens,
                      "total_tokens": seen["tokens"] + completion_tokens}}


# -- replies ----------------------------------------------------------------------------------------
def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def completion(cid: str, model: str, text: str, usage: dict, info: dict) -> dict:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": usage, "pager": info}


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
