"""`pager serve`: memory over HTTP, in one ASGI process (Starlette and uvicorn, which the mcp
SDK already brings).

    POST /v1/chat/completions   OpenAI-compatible, streaming or not (pager/proxy.py)
    GET  /v1/models             `offline` (the memory shell) and the configured model
    POST /mcp                   the `pager mcp` tools and memory map, over streamable HTTP
    GET  /sessions              the tenant's sessions
    GET  /sessions/{name}       `pager inspect --json` of one
    GET  /sessions/{name}/search?q=…&k=…
    GET  /sessions/{name}/turns?after=N&limit=M
    POST /sessions/{name}/turns {"messages": [{"role", "content"}]}
    GET  /sessions/{name}/state             the working state; PUT/DELETE …/state/{key} set and unset a key
    GET  /sessions/{name}/facts?q=…         the facts, every version (a memory tier is a GET of its name)
    GET  /sessions/{name}/summaries?q=…     the summaries, every version
    GET  /healthz

Each session's traffic is traced as `pager chat`'s is (PAGER_HOME/traces, `pager replay`), one
trace per time the session is open here; sessions idle for --idle seconds, or beyond
--max-open, are closed (written to the store) and reopen on their next request.

Every path but /healthz needs `Authorization: Bearer <key>` once a key exists (`pager keys
create`); a key reaches only its tenant's sessions (the tenant is the engine's user
namespace). With no key the server serves the local user's namespace and binds to loopback
only. Errors have one JSON shape everywhere, OpenAI's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import math
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import quote

from .config import Config
from .engine import Engine
from .errors import BudgetError, ConfigError, InputError, LeaseHeld, ModelError, PagerError, StoreError
from .fsck import durable_turns
from .keys import KeyRing, is_key
from .llm import LiteLLMModel, unservable
from .proxy import (OFFLINE_NAME, SESSION_HEADER, ChatRequest, RequestError, chunk, completion, completion_id,
                    error_body, finish_reason, load_models, parse, pieces, session_name, take_turn, too_much_text,
                    tool_calls, warm)

log = logging.getLogger("pager.serve")
LOOPBACK = ("127.0.0.1", "localhost", "::1")
KEEPALIVE_S = 10.0   # an SSE comment this often while a streamed turn waits for its model


@dataclass(frozen=True)
class Limits:
    body_bytes: int = 4 * 1024 * 1024   # a request body larger than this is refused with 413
    messages: int = 2048                # messages in one chat request
    model_timeout: float = 120.0        # seconds the proxy waits for a turn before answering 504
    search_k: int = 50                  # the most pages a REST search returns
    list_rows: int = 1000               # the most rows a REST listing (turns, facts) returns
    append_chars: int = 200_000         # characters of new turns one request may append (413 above): a turn's
                                        # pages are made under the engine lock, ~0.25 s for this many


def check_host(host: str, keys: KeyRing) -> None:
    """Without keys, only loopback: anyone who can reach the port could read the memory."""
    if keys or _loopback(host):
        return
    raise ConfigError(f"refusing to serve on {host} without keys: anyone on the network could read the memory; "
                      "create one with `pager keys create --tenant NAME` (or serve on 127.0.0.1)")


def _loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)   # ::ffff:127.0.0.1, as a dual-stack socket reports an IPv4 peer
    return address.is_loopback or bool(mapped and mapped.is_loopback)


def _local_name(host: str) -> bool:
    """A Host header naming loopback: 127.0.0.1:8765, localhost, [::1]:8765."""
    name = host[1:].split("]", 1)[0] if host.startswith("[") else host.split(":", 1)[0]
    return _loopback(name)


def _local_origin(origin: str | None) -> bool:
    if origin is None:
        return True
    from urllib.parse import urlsplit

    return _loopback(urlsplit(origin).hostname or "")


# -- the pieces of a request ---------------------------------------------------------------------
def _error(status: int, message: str, type: str, code: str = "", param: str | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse(error_body(message, type, code, param), status_code=status)


def _failure(exc: PagerError) -> tuple[int, str, str]:
    """Status, type and code of a known failure. Another host writing the session is no fault of the
    request: a conflict (409, which OpenAI's clients retry), the same request succeeds once it is free;
    so is a store that does not answer (503, retried too).
    A message the budget cannot hold is OpenAI's `context_length_exceeded`."""
    if isinstance(exc, LeaseHeld):
        return 409, "conflict_error", "lease_held"
    if isinstance(exc, BudgetError):   # OpenAI's code for a prompt over the window, which clients act on
        return 400, "invalid_request_error", "context_length_exceeded"
    if isinstance(exc, StoreError):   # the server's store (down, full, read-only): no fault of the request
        return 503, "api_error", "store_unavailable"
    return 400, "invalid_request_error", type(exc).__name__


def _refusal(exc: RequestError):
    from starlette.responses import JSONResponse

    return JSONResponse(exc.body(), status_code=exc.status)


async def _json(request, limit: int) -> object:
    """The body as JSON, refusing oversized (413) or malformed (400) bodies before reading them whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise _too_large(limit)
    numbers = _Numbers()
    try:
        value = json.loads(body, parse_int=numbers.whole, parse_float=numbers.real, parse_constant=numbers.constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"the body is not valid JSON ({exc})", code="invalid_json") from None
    except RecursionError:
        raise RequestError("the body's JSON is nested too deeply to read; send flatter JSON", code="invalid_json") from None
    if numbers.found:
        _refuse_number(value, "")
    return value


class _Number:
    """A number of a body that no route can take, kept in its place until the body is read so that the
    refusal names where it is."""

    def __init__(self, text: str, problem: str) -> None:
        self.text, self.problem = text, problem


class _Numbers:
    """json.loads' readers of numbers for a request body: an integer beyond 64 bits (Python's int()
    refuses one of more than 4,300 digits, which was a 500), a float beyond a double (1e400) and NaN or
    Infinity, which JSON does not have, each become a _Number; anything else is read as json.loads reads it."""

    LIMIT = 2**63

    def __init__(self) -> None:
        self.found = False

    def _bad(self, text: str, problem: str) -> _Number:
        self.found = True
        return _Number(text, problem)

    def whole(self, text: str):
        if len(text.lstrip("-")) <= 19 and -self.LIMIT <= (value := int(text)) < self.LIMIT:
            return value
        return self._bad(text, "an integer beyond 64 bits")

    def real(self, text: str):
        value = float(text)
        return value if math.isfinite(value) else self._bad(text, "beyond what a 64-bit float holds")

    def constant(self, text: str):
        return self._bad(text, "which JSON does not have")


def _refuse_number(value: object, where: str) -> None:
    """Raise naming the first _Number in the value by its path (`messages[0].max_tokens`)."""
    if isinstance(value, _Number):
        digits = len(value.text.lstrip("-"))
        text = value.text if len(value.text) <= 24 else f"{value.text[:20]}… ({digits:,} digits)"
        raise RequestError(f"{where or 'the body'} is {text}, {value.problem}; send a whole number from "
                           f"{-_Numbers.LIMIT:,} to {_Numbers.LIMIT - 1:,} or a finite decimal (or the value as a "
                           "string)", param=where or None, code="invalid_number")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_number(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _refuse_number(item, f"{where}[{i}]")


def _too_large(limit: int) -> RequestError:
    return RequestError(f"the body is over the limit of {limit:,} bytes; send less (pager keeps the conversation, "
                        "so only new messages are needed)", 413, code="request_too_large")


def tenant_of(request, keys: KeyRing, default: str) -> str:
    """The tenant of the request's bearer key; with no keys configured, the local user, and only for
    requests from loopback, addressed to loopback (a web page the user visits could otherwise reach the
    memory by DNS rebinding, or write to it with a simple cross-origin POST). The peer is checked as well
    as the Host header, which the client writes: a server bound beyond loopback whose last key was
    revoked answers no one else. A pager key sent to a server with none is refused, not ignored: it was
    revoked (or made in another home), and its requests must not reach the local user's sessions."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not keys:
        peer = request.client.host if request.client else "127.0.0.1"
        if (not _loopback(peer) or not _local_name(request.headers.get("host", ""))
                or not _local_origin(request.headers.get("origin"))):
            raise RequestError("without keys this server answers only requests from and addressed to loopback with "
                               "no foreign Origin; create a key with `pager keys create --tenant NAME`", 403,
                               "permission_error", "not_local")
        if scheme.lower() == "bearer" and is_key(token.strip()):
            raise RequestError("this key is not valid here: the server has no keys (it was revoked, or made in "
                               "another home); make one with `pager keys create --tenant NAME`", 401,
                               "authentication_error", "invalid_api_key")
        return default
    tenant = keys.verify(token.strip()) if scheme.lower() == "bearer" else None
    if tenant is None:
        raise RequestError("missing or invalid API key; send `Authorization: Bearer <key>` with a key from "
                           "`pager keys create --tenant NAME`", 401, "authentication_error", "invalid_api_key")
    return tenant


def _log(request, status: int, facts: dict, started: float) -> None:
    log.info("%s %s %d session=%s tokens=%s faulted=%s latency_ms=%.1f", request.method, request.url.path, status,
             facts.get("session", "-"), facts.get("tokens", "-"), facts.get("faulted", "-"),
             (time.perf_counter() - started) * 1000)


class Server:
    """The routes, over one Engine."""

    def __init__(self, engine: Engine, keys: KeyRing, limits: Limits = Limits(), host: str = "127.0.0.1") -> None:
        self.engine, self.keys, self.limits, self.host = engine, keys, limits, host
        self.config = engine.config
        self._models_ready = False
        self._pending: set[asyncio.Task] = set()

    # -- plumbing -------------------------------------------------------------------------------------
    def app(self):
        from starlette.applications import Starlette
        from starlette.routing import Route

        from .serve_mcp import mount

        mcp_route, mcp_lifespan = mount(self, tenant_of, _refusal)

        @asynccontextmanager
        async def lifespan(app):
            async with mcp_lifespan():
                idler = asyncio.ensure_future(self._close_idle())
                try:
                    yield
                finally:
                    idler.cancel()
                    if self._pending:  # turns still running after a 504: let them finish and be recorded
                        await asyncio.gather(*self._pending, return_exceptions=True)
                    import anyio.to_thread

                    await anyio.to_thread.run_sync(self.engine.close)

        routes = [
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/v1/models", self.guarded(self.models), methods=["GET"]),
            Route("/v1/chat/completions", self.guarded(self.chat), methods=["POST"]),
            Route("/sessions", self.guarded(self.list_sessions), methods=["GET"]),
            Route("/sessions/{name}", self.guarded(self.inspect), methods=["GET"]),
            Route("/sessions/{name}/search", self.guarded(self.search), methods=["GET"]),
            Route("/sessions/{name}/turns", self.guarded(self.append), methods=["POST"]),
            Route("/sessions/{name}/turns", self.guarded(self.turns), methods=["GET"]),
            Route("/sessions/{name}/state/{key:path}", self.guarded(self.set_state), methods=["PUT", "DELETE"]),
            Route("/sessions/{name}/{tier}", self.guarded(self.tier), methods=["GET"]),
            mcp_route,
        ]
        app = Starlette(routes=routes, lifespan=lifespan,
                        exception_handlers={404: self._not_found, 405: self._not_allowed})
        return app

    async def _close_idle(self) -> None:
        """Close idle sessions now and then, when no request comes to do it (each request does too)."""
        every = max(1.0, min(self.engine.idle_s / 4, 60.0))
        while True:
            await asyncio.sleep(every)
            try:
                await self.engine.run(self.engine.trim)
            except Exception:  # noqa: BLE001 - logged; the next round tries again
                log.exception("closing idle sessions failed")

    async def _not_found(self, request, exc):
        return _error(404, f"no route {request.url.path}; see the README's Serve section", "not_found_error")

    async def _not_allowed(self, request, exc):
        return _error(405, f"{request.method} is not allowed on {request.url.path}", "invalid_request_error",
                      "method_not_allowed")

    def guarded(self, handler):
        """Authenticate first (nothing about sessions is looked at before), then map known failures
        to the error shape; each request is logged with what it cost."""

        async def endpoint(request):
            started = time.perf_counter()
            facts: dict = {}
            try:
                tenant = tenant_of(request, self.keys, self.config.user)
                response = await handler(request, tenant, facts)
            except RequestError as exc:
                response = _refusal(exc)
            except PagerError as exc:
                status, kind, code = _failure(exc)
                response = _error(status, str(exc), kind, code)
            except Exception:  # a bug: logged whole, answered in the error shape
                log.exception("%s %s failed", request.method, request.url.path)
                response = _error(500, "internal error; the server log has the details", "server_error")
            if facts.get("streaming"):  # logged when the stream ends
                facts["log"] = lambda: _log(request, response.status_code, facts, started)
            else:
                _log(request, response.status_code, facts, started)
            return response

        return endpoint

    # -- routes ---------------------------------------------------------------------------------------
    async def healthz(self, request):
        from starlette.responses import JSONResponse

        return JSONResponse({"status": "ok", "keys": bool(self.keys)})

    async def models(self, request, tenant: str, facts: dict):
        from starlette.responses import JSONResponse

        names = [OFFLINE_NAME] + ([self.config.model] if self.config.model else [])
        return JSONResponse({"object": "list", "data": [
            {"id": n, "object": "model", "created": 0, "owned_by": "pager"} for n in names]})

    async def list_sessions(self, request, tenant: str, facts: dict):
        from starlette.responses import JSONResponse

        rows = await self.engine.run(self.engine.sessions, tenant)
        return JSONResponse({"object": "list", "data": rows})

    async def inspect(self, request, tenant: str, facts: dict):
        from starlette.responses import JSONResponse

        from .views import inspect_json

        name = facts["session"] = session_name(request.path_params["name"], "the session name")
        body = await self.engine.run(self._existing, tenant, name, inspect_json)
        body.pop("user", None)  # the tenant namespace is the key's business, not the body's
        return JSONResponse(body)

    async def search(self, request, tenant: str, facts: dict):
        from starlette.responses import JSONResponse

        from pager.tools.schema import kind_of

        name = facts["session"] = session_name(request.path_params["name"], "the session name")
        query = request.query_params.get("q", "")
        if not query.strip():
            raise RequestError("search needs a query: ?q=words", param="q")
        raw_k = request.query_params.get("k", "8")
        try:   # as the tools read k ("²" and "①" are digits to str.isdigit, and int() refuses them)
            k = kind_of(int).coerce("k", raw_k)
        except ValueError:
            k = 0
        if not 1 <= k <= self.limits.search_k:
            raise RequestError(f"k={raw_k!r}: k is how many pages, a whole number from 1 to {self.limits.search_k}",
                               param="k")

        def run(s):
            from .views import page_hits, tier_hits

            return page_hits(s, query, k), tier_hits(s, query, k)

        rows, tiers = await self.engine.run(self._existing, tenant, name, run)
        return JSONResponse({"session": name, "query": query, "results": rows, "tiers": tiers})

    async def turns(self, request, tenant: str, facts: dict):
        """The session's turns after `after`, at most `limit` (1000), oldest first."""
        from starlette.responses import JSONResponse

        name = facts["session"] = session_name(request.path_params["name"], "the session name")
        try:
            after = max(0, int(request.query_params.get("after", 0)))
            limit = max(1, min(int(request.query_params.get("limit", 100)), 1000))
        except ValueError:
            raise RequestError("after and limit must be numbers", param="after") from None

        def run(s):
            self.engine.home.flush()  # turns live in the journal until a batch reaches the store
            # and other live processes of the home hold theirs in their journals: read those too
            rows = [t for t in durable_turns(self.engine.home, tenant, name, after=after) if t.turn <= s.turn_count]
            rows = rows[:limit]
            return {"session": name, "total_turns": s.turn_count, "turns": [
                {"turn": t.turn, "role": t.role, "speaker": t.speaker, "content": t.text, "date": t.date} for t in rows]}

        return JSONResponse(await self.engine.run(self._existing, tenant, name, run))

    # -- the memory tiers: GET /sessions/{name}/{tier} -----------------------------------------------------
    # A tier is a reader of the session: (session, query parameters) -> the body's fields. Every tier has
    # the same route, the same tenant check and 404, and the same error shape; a new tier (summaries) is
    # its reader and one entry in TIERS.
    def tier_state(self, s, params) -> dict:
        key = params.get("key", "")
        if key:   # every value the key had, unsets too
            from .state import normal_key

            return {"key": normal_key(key), "history": [
                {"value": c.value, "unset": c.unset, "page": f"p{c.page}", "turn": c.turn, "ts": c.ts, "change": c.seq,
                 "source": c.source} for c in s.state.history(key)]}
        return {"state": s.state.to_json(), "changes": len(s.state.changes)}

    def tier_facts(self, s, params) -> dict:
        query = params.get("q", "").strip()
        rows = s.facts.to_json()
        if query:
            order = {f.id: i for i, (f, _) in enumerate(s.facts.search(query, k=self.limits.list_rows))}
            rows = sorted((r for r in rows if r["id"] in order), key=lambda r: order[r["id"]])
        if params.get("current") in ("1", "true"):
            rows = [r for r in rows if r["superseded_by"] is None]
        return {"facts": rows[: self.limits.list_rows], "total": len(rows)}

    def tier_summaries(self, s, params) -> dict:
        rows = s.summaries.to_json()
        query = params.get("q", "").strip()
        if query:
            order = {x.id: i for i, (x, _) in enumerate(s.summaries.search(query, k=self.limits.list_rows))}
            rows = sorted((r for r in rows if r["id"] in order), key=lambda r: order[r["id"]])
        if params.get("current") in ("1", "true"):
            rows = [r for r in rows if r["current"]]
        return {"summaries": rows[: self.limits.list_rows], "total": len(rows)}

    TIERS = {"state": tier_state, "facts": tier_facts, "summaries": tier_summaries}

    async def tier(self, request, tenant: str, facts: dict):
        from starlette.responses import JSONResponse

        name = facts["session"] = session_name(request.path_params["name"], "the session name")
        tier = request.path_params["tier"]
        reader = self.TIERS.get(tier)
        if reader is None:
            raise RequestError(f"no route {request.url.path}; a session has {', '.join(['turns', 'search', *self.TIERS])}",
                               404, "not_found_error", "not_found_error")
        params = dict(request.query_params)
        body = await self.engine.run(self._existing, tenant, name, lambda s: reader(self, s, params),
                                     tenant=tenant, name=name)
        return JSONResponse({"session": name, "object": tier, **body})

    async def set_state(self, request, tenant: str, facts: dict):
        """PUT {"value": "…"} sets a key of the working state, DELETE unsets it; both durable before the
        answer, and recorded in the session's trace as a tool call from outside (replayable)."""
        from starlette.responses import JSONResponse

        from pager.tools import AGENT
        from pager.tools.toolkit import external

        from .state import check

        name = facts["session"] = session_name(request.path_params["name"], "the session name")
        raw_key = request.path_params["key"]
        if request.method == "PUT":
            body = await _json(request, self.limits.body_bytes)
            value = body.get("value") if isinstance(body, dict) else None
            if not isinstance(value, str):
                got = "no value" if value is None else f"a {type(value).__name__}"
                raise RequestError(f'the value must be a string (got {got}): send {{"value": "…"}}, e.g. '
                                   '{"value": "5"}', param="value")
        try:
            key, _ = check(raw_key, None)
        except InputError as exc:
            raise RequestError(str(exc), param="key") from None
        if request.method == "PUT":
            try:
                key, value = check(raw_key, value)
            except InputError as exc:
                raise RequestError(str(exc), param="value") from None
            tool, arguments = "state_set", {"key": key, "value": value}
        else:
            tool, arguments = "state_unset", {"key": key}

        def run():
            if not self.engine.exists(tenant, name):   # GET …/state would not find it: a session begins with a turn
                raise RequestError(f"no session {name!r}; a session begins with its first turn: POST /sessions/"
                                   f"{quote(name, safe='')}/turns (or a chat completion), then set its state",
                                   404, "not_found_error", "session_not_found")
            self.engine.open(tenant, name, trace=True)
            s = self.engine.read(tenant, name)   # what other processes and homes set since: the key may be theirs
            if tool == "state_unset" and key not in s.state.current:
                raise RequestError(f"the state has no key {key!r}", 404, "not_found_error", "state_key_not_found")
            s.emit("external_call", name=tool, arguments=arguments)
            text, ok = external(s, AGENT, tool, arguments)
            if not ok:
                raise RequestError(text, param="key")
            return {"session": name, "object": "state", "key": key, "result": text, "state": s.state.to_json()}

        return JSONResponse(await self.engine.run(run, tenant=tenant, name=name))

    def _existing(self, tenant: str, name: str, fn):
        """fn(session) for a session the tenant has; the same 404 whether it exists elsewhere or not."""
        if not self.engine.exists(tenant, name):
            raise RequestError(f"no session {name!r}", 404, "not_found_error", "session_not_found")
        return fn(self.engine.read(tenant, name))   # what other processes made durable since, as `pager inspect` shows it

    async def append(self, request, tenant: str, facts: dict):
        from starlette.responses import JSONResponse

        name = facts["session"] = session_name(request.path_params["name"], "the session name")
        body = await _json(request, self.limits.body_bytes)
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            raise RequestError('the body must be {"messages": [{"role": "user", "content": "…"}, …]}', param="messages")
        if len(messages) > self.limits.messages:
            raise RequestError(f"{len(messages)} messages is over the limit of {self.limits.messages}; send them in "
                               "parts", param="messages", code="too_many_messages")
        drafts = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role", "user") not in ("user", "assistant"):
                raise RequestError(f"messages[{i}] needs role 'user' or 'assistant' and content", param=f"messages[{i}]")
            text = m.get("content", m.get("text"))
            if not isinstance(text, str):
                raise RequestError(f"messages[{i}].content must be a string", param=f"messages[{i}].content")
            draft = {"text": text, "role": m.get("role", "user"), "speaker": m.get("speaker") or m.get("name") or "",
                     "date": m.get("date") or "", "ref": m.get("ref") or ""}
            if m.get("key") is not None:   # as `pager ingest` reads a line's key: cut or ignored, a retry would store twice
                if not isinstance(m["key"], str) or not m["key"] or len(m["key"]) > 200:
                    raise RequestError(f"messages[{i}].key must be a non-empty string of at most 200 characters",
                                       param=f"messages[{i}].key")
                draft["key"] = m["key"]
            drafts.append(draft)
        too_much_text([d["text"] for d in drafts], self.limits.append_chars)

        def run():
            s = self.engine.open(tenant, name, trace=True)
            turns = s.append_many(drafts)
            return {"session": name, "turns": [t.turn for t in turns], "total_turns": s.turn_count,
                    "pages": len(s.pages) + (1 if s.packer.pieces else 0)}

        result = await self.engine.run(run, tenant=tenant, name=name)
        return JSONResponse(result, status_code=201)

    # -- the proxy ------------------------------------------------------------------------------------
    async def chat(self, request, tenant: str, facts: dict):
        body = await _json(request, self.limits.body_bytes)
        req = parse(body, request.headers.get(SESSION_HEADER), self.config.session, self.limits.messages)
        facts["session"] = req.session
        cid = completion_id()
        if req.model != OFFLINE_NAME and (why := unservable(req.model)):   # told without litellm's import (seconds)
            raise RequestError(f"model {req.model!r} {why}, or use model 'offline'", 404, code="model_not_found",
                               param="model")
        if not self._models_ready and req.model != OFFLINE_NAME:
            await asyncio.to_thread(load_models)  # litellm's import takes seconds: once, off the loop
            self._models_ready = True
        if req.model != OFFLINE_NAME:
            try:   # no provider, or no key for it where the server runs: no call of it can work, nothing is stored
                LiteLLMModel(req.model).check("use model 'offline'")
            except ModelError as exc:
                raise RequestError(str(exc), 404, code="model_not_found", param="model") from None
        loop, begun = asyncio.get_running_loop(), asyncio.Event()
        turn = self.engine.run(take_turn, self.engine, tenant, req, body, self.limits.model_timeout, time.perf_counter(),
                               lambda: loop.call_soon_threadsafe(begun.set), self.limits.append_chars,
                               tenant=tenant, name=req.session)
        task = asyncio.ensure_future(turn)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        if req.stream:
            # a refused turn (another host's lease, a message the budget cannot hold) is answered with its
            # status, as unstreamed: the stream's 200 goes out once the model is asked (or the turn is done)
            asking = asyncio.ensure_future(begun.wait())
            await asyncio.wait([task, asking], timeout=self.limits.model_timeout, return_when=asyncio.FIRST_COMPLETED)
            asking.cancel()
            if task.done() and task.exception() is not None:
                task.result()   # raises: the error shape and status of any request
            if not task.done() and not begun.is_set():
                await asyncio.to_thread(self.engine.home.journal.sync)
                return self._timeout()
            facts["streaming"] = True
            return self._stream(cid, req, task, facts)
        try:
            outcome = await asyncio.wait_for(asyncio.shield(task), self.limits.model_timeout)
        except asyncio.TimeoutError:
            await asyncio.to_thread(self.engine.home.journal.sync)   # "your message is saved": on disk now
            return self._timeout()
        return self._answer(cid, req, outcome, facts)

    def _info(self, req: ChatRequest, outcome: dict) -> dict:
        reply = outcome["reply"]
        return {"session": req.session, "turns": outcome["turns"], "appended": outcome["appended"],
                "recorded": outcome.get("recorded", False),
                "steps": reply.steps, "faulted": outcome["faulted"], **outcome["timing"],
                "tool_calls": [{"name": c["name"], "arguments": c["arguments"]} for c in reply.tool_calls]}

    def _answer(self, cid: str, req: ChatRequest, outcome: dict, facts: dict):
        from starlette.responses import JSONResponse

        facts.update(tokens=outcome["usage"]["prompt_tokens"], faulted=len(outcome["faulted"]))
        reply = outcome["reply"]
        if reply.error:
            return _error(502, f"the model failed: {reply.error}; your message is saved in session {req.session!r}",
                          "api_error", "model_error")
        return JSONResponse(completion(cid, req.model, reply.text, outcome["usage"], self._info(req, outcome),
                                       reply.client_calls, finish_reason(reply)))

    def _timeout(self):
        return _error(504, f"the model gave no answer within {self.limits.model_timeout:g} s; your message is saved "
                      "and the reply will be recorded when it comes", "timeout_error", "model_timeout")

    def _stream(self, cid: str, req: ChatRequest, task: asyncio.Future, facts: dict):
        """SSE: the role at once (so the client knows the server took the turn), the reply when the agent
        loop is done (the model's own tokens are not streamed through the loop), then [DONE]."""
        from starlette.responses import StreamingResponse

        async def events():
            try:
                async for event in answer():
                    yield event
            finally:
                if "log" in facts:
                    facts["log"]()

        async def answer():
            yield chunk(cid, req.model, {"role": "assistant", "content": ""})
            deadline = time.monotonic() + self.limits.model_timeout
            while not task.done() and time.monotonic() < deadline:
                await asyncio.wait([task], timeout=min(KEEPALIVE_S, max(0.0, deadline - time.monotonic())))
                if not task.done():
                    yield ": waiting for the model\n\n"   # an SSE comment: keeps proxies from closing the stream
            if not task.done():
                await asyncio.to_thread(self.engine.home.journal.sync)
                yield f"data: {json.dumps(self._timeout_body())}\n\n"
                return
            try:
                outcome = task.result()
            except PagerError as exc:
                yield f"data: {json.dumps(error_body(str(exc), *_failure(exc)[1:]))}\n\n"
                return
            facts.update(tokens=outcome["usage"]["prompt_tokens"], faulted=len(outcome["faulted"]))
            reply = outcome["reply"]
            if reply.error:
                body = error_body(f"the model failed: {reply.error}; your message is saved", "api_error", "model_error")
                yield f"data: {json.dumps(body)}\n\n"
                return
            for piece in pieces(reply.text):
                yield chunk(cid, req.model, {"content": piece})
            if reply.client_calls:
                yield chunk(cid, req.model, {"tool_calls": tool_calls(reply.client_calls, indexed=True)})
            yield chunk(cid, req.model, {}, finish_reason(reply), pager=self._info(req, outcome))
            if req.include_usage:
                body = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": req.model,
                        "choices": [], "usage": outcome["usage"]}
                yield f"data: {json.dumps(body)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _timeout_body(self) -> dict:
        return error_body(f"the model gave no answer within {self.limits.model_timeout:g} s; your message is saved",
                          "timeout_error", "model_timeout")


def listen(host: str, port: int):
    """The listening socket, or one line saying why the address cannot be had."""
    import socket

    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); check --host") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)   # before "pager serve on …" is said: a client that connects then waits, never refused
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port} ({exc.strerror or exc}); pick another --port "
                          "(or stop what holds it) or another --host") from None
    return sock


def serve(config: Config, host: str = "127.0.0.1", port: int = 8765, limits: Limits = Limits(),
          max_open: int = 256, idle_s: float = 600.0, on_listening=None) -> None:
    """Run until interrupted (the CLI's `pager serve`); `on_listening(port)` once the port takes connections
    (they wait in its backlog while the home opens)."""
    import uvicorn

    keys = KeyRing(config.home)
    check_host(host, keys)
    sock = listen(host, port)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:   # the home opens before the server says it serves: one it cannot write is said, not served
        engine = Engine(config, max_open=max_open, idle_s=idle_s)
        engine.home.writer  # noqa: B018 - with a memory or bookmark model, a missing key stops here, not in a worker
        log.info("warmed in %.2f s: the store, the tokenizer, the embedder and an offline turn", warm(engine))
    except BaseException:
        sock.close()
        raise
    if on_listening:
        on_listening(sock.getsockname()[1])
    app = Server(engine, keys, limits, host).app()
    uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on")).run(sockets=[sock])


