"""MCP over streamable HTTP at /mcp: the server `pager mcp` builds (tools/mcp_server.py), with
each request acting on its own tenant and session.

The MCP server is built once over a stand-in for the Toolkit that looks up, at each call,
the tenant (from the bearer key) and the session (the `X-Pager-Session` header or the
`session` query parameter, else the configured default) of the HTTP request being served.
They travel in a context variable: the SDK runs each request of its stateless mode in a
task started from the request, and sync tools on worker threads, and both copy the
caller's context. Stateless mode also means no MCP session state to lose or to share
between tenants.
"""

from __future__ import annotations

import contextvars
from contextlib import asynccontextmanager

from .proxy import SESSION_HEADER, RequestError, session_name

_where: contextvars.ContextVar[tuple[str, str]] = contextvars.ContextVar("pager_mcp_request")


class RequestToolkit:
    """What tools/mcp_server.build uses of a Toolkit (run, _lock, session, config), per request."""

    def __init__(self, engine) -> None:
        from pager.tools.dispatch import AGENT

        self.engine, self.config, self.dispatcher = engine, engine.config, AGENT

    def run(self, name: str, arguments) -> tuple[str, bool]:
        from pager.tools.toolkit import external

        tenant, session = _where.get()

        def call():
            s = self.engine.open(tenant, session, trace=True)
            s.emit("external_call", name=name, arguments=arguments if arguments is not None else "")
            return external(s, self.dispatcher, name, arguments)

        return self.engine.call(call, tenant=tenant, name=session)

    @property
    def _lock(self):
        tenant, session = _where.get()
        return self.engine.using(tenant, session)

    @property
    def session(self):
        """The request's session; read it inside `with self._lock`."""
        tenant, session = _where.get()
        return self.engine.open(tenant, session)


def mount(server, tenant_of, refusal):
    """(the /mcp route, the lifespan that runs the SDK's session manager). tenant_of and refusal are
    the server's (pager.serve): a request to /mcp is authorized and refused as any other."""
    from starlette.routing import Route

    from pager.tools.mcp_server import build

    mcp = build(RequestToolkit(server.engine))
    host = server.host if server.host not in ("0.0.0.0", "::") else "0.0.0.0"
    mcp.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True, host=host,
                            max_request_body_size=server.limits.body_bytes)
    manager = mcp.session_manager

    class Endpoint:  # an ASGI app, not a request handler: the SDK answers on the raw connection
        async def __call__(self, scope, receive, send):
            await endpoint(scope, receive, send)

    async def endpoint(scope, receive, send):
        from starlette.requests import Request

        request = Request(scope, receive)
        try:
            tenant = tenant_of(request, server.keys, server.config.user)
            raw = request.headers.get(SESSION_HEADER) or request.query_params.get("session")
            session = session_name(raw, "the session") if raw is not None else server.config.session
        except RequestError as exc:
            await refusal(exc)(scope, receive, send)
            return
        token = _where.set((tenant, session))
        try:
            await manager.handle_request(scope, receive, send)
        finally:
            _where.reset(token)

    @asynccontextmanager
    async def lifespan():
        async with manager.run():
            yield

    return Route("/mcp", endpoint=Endpoint(), methods=["GET", "POST", "DELETE"]), lifespan
