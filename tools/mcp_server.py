"""`pager mcp`: the tool bundle as an MCP server (official `mcp` SDK, stdio).

The tools are the same typed functions as everywhere else; their schemas are the ones
`pager tools` prints, and every call goes through the same dispatcher, so a bad argument
comes back as a tool error the model can read and the server keeps serving. The memory map
is a resource. Nothing but protocol is written to stdout.
"""

from __future__ import annotations

import inspect
import json
import re
from typing import Any

from .functions import AGENT_TOOLS
from .schema import parse_docstring, schema_of
from .toolkit import Toolkit, unreadable

MEMORY_MAP = "pager://memory-map"


def build(toolkit: Toolkit):
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp.server.mcpserver.tools import Tool

    def wrap(fn):
        params = list(inspect.signature(fn).parameters.values())[1:]

        def call(**kwargs: Any) -> str:
            text, ok = toolkit.run(fn.__name__, {k: v for k, v in kwargs.items() if v is not None})
            if not ok:
                raise ToolError(text)
            return text

        # every argument passes through untouched: the dispatcher validates and explains
        call.__signature__ = inspect.Signature(
            [inspect.Parameter(p.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Any) for p in params],
            return_annotation=str)
        call.__annotations__ = {p.name: Any for p in params} | {"return": str}
        call.__name__ = fn.__name__
        tool = Tool.from_function(call, name=fn.__name__, description=parse_docstring(fn)[0])
        return Strict.model_construct(**dict(tool.model_copy(update={"parameters": schema_of(fn)["function"]["parameters"]})))

    class Strict(Tool):
        """The SDK drops arguments its signature does not name; the Python API refuses them, and so does this."""

        async def run(self, arguments, context, convert_result=False):
            if UNREADABLE in (arguments or {}):
                raise ToolError(str(arguments[UNREADABLE]))
            unnamed = set(arguments or {}) - set(self.parameters.get("properties", {}))
            if unnamed or None in (arguments or {}).values():
                # the signature drops what it does not name and takes a null for an absent argument (a
                # required one was "missing"): the dispatcher reads them as sent, as the Python API does
                import anyio

                text, ok = await anyio.to_thread.run_sync(toolkit.run, self.name, arguments)
                if not ok:
                    raise ToolError(text)
                return self.fn_metadata.convert_result(text) if convert_result else text
            return await super().run(arguments, context, convert_result)

    from pager import __version__

    server = MCPServer("pager", version=__version__, log_level="WARNING", instructions=(
        "Paged memory for this conversation. Use `remember` to append turns, `search` and `page_in` to find and "
        "load earlier pages, `context` for a memory block to put in your own prompt, and read "
        f"{MEMORY_MAP} for frames and bookmarks."), tools=[wrap(fn) for fn in AGENT_TOOLS])

    @server.resource(MEMORY_MAP, name="memory map", mime_type="text/plain",
                     description="frames in use, pressure and the bookmarks of pages on disk")
    def memory_map() -> str:
        from pager.context import render_map

        with toolkit._lock:
            toolkit.session.sync()
            return render_map(toolkit.session, toolkit.config.map_reserve, [])

    return server


def serve(toolkit: Toolkit) -> None:
    """Serve on stdin/stdout until the client closes the stream."""
    import anyio

    from pager.session import settle

    settle()
    try:
        anyio.run(_serve_stdio, build(toolkit))
    finally:
        toolkit.close()


async def _serve_stdio(server) -> None:
    """MCPServer.run("stdio"), reading stdin through `answerable` (the SDK drops, without a reply,
    a line it cannot parse: a lone surrogate, nesting too deep for its parser)."""
    from mcp.server.stdio import stdio_server

    async with stdio_server(stdin=_Answerable(_stdin_lines())) as (read, write):  # type: ignore[arg-type]  # duck-typed
        low = server._lowlevel_server
        await low.run(read, write, low.create_initialization_options())


async def _stdin_lines():
    """stdin's lines. A terminal or a pipe is waited on by the event loop, so Ctrl-C cancels the wait at
    once: anyio.wrap_file read each line in a worker thread that a cancel waits for and the exit joins,
    and Ctrl-C did nothing until the next line or Ctrl-D came. What the loop cannot wait on (a regular
    file, /dev/null) never blocks, and is read as before."""
    import codecs
    import io
    import os
    import selectors
    import sys

    import anyio

    fd = sys.stdin.fileno()
    try:
        with selectors.DefaultSelector() as probe:
            probe.register(fd, selectors.EVENT_READ)
    except (OSError, ValueError):   # epoll refuses regular files
        async for line in anyio.wrap_file(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")):
            yield line
        return
    decoder, pending = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    while True:
        await anyio.wait_readable(fd)
        chunk = os.read(fd, 1 << 16)   # readable: this does not block
        pending += decoder.decode(chunk, final=not chunk)
        *lines, pending = pending.split("\n")
        for line in lines:
            yield line + "\n"
        if not chunk:
            if pending:
                yield pending
            return


class _Answerable:
    def __init__(self, lines) -> None:
        self.lines = lines.__aiter__()

    def __aiter__(self):
        return self

    async def __anext__(self) -> str:
        return answerable(await self.lines.__anext__())


UNREADABLE = "pager:unreadable"   # an argument no schema has: the tool answers its text as an error
_ID = re.compile(r'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')
_CALL = re.compile(r'"method"\s*:\s*"tools/call"')
_NAME = re.compile(r'"name"\s*:\s*"([A-Za-z_][\w-]*)"')


def answerable(line: str) -> str:
    """The line, or for a tools/call the SDK could not parse, a call of the same id that the tool
    answers with what was wrong, so the client gets a reply."""
    import mcp_types

    try:
        mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)
        return line
    except Exception:  # noqa: BLE001 - whatever the SDK's parser refuses
        pass
    ident, name = _ID.search(line), _NAME.search(line)
    if not (ident and _CALL.search(line)):
        return line   # not a tool call we can answer; the SDK handles it as it does
    try:
        params = json.loads(line)["params"]
        problem = unreadable(params["name"], params.get("arguments")) or "the request is not valid MCP"
    except RecursionError:
        problem = "the arguments are nested too deeply to read; send a flat JSON object"
    except (ValueError, KeyError, TypeError):
        problem = "the request could not be read as JSON"
    return json.dumps({"jsonrpc": "2.0", "id": json.loads(ident.group(1)), "method": "tools/call",
                       "params": {"name": name.group(1) if name else "?", "arguments": {UNREADABLE: problem}}})
