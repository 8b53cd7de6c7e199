"""`pager mcp`: the tool bundle as an MCP server (official `mcp` SDK, stdio).

The tools are the same typed functions as everywhere else; their schemas are the ones
`pager tools` prints, and every call goes through the same dispatcher, so a bad argument
comes back as a tool error the model can read and the server keeps serving. The memory map
is a resource. Nothing but protocol is written to stdout.
"""

from __future__ import annotations

import inspect
from typing import Any

from .functions import AGENT_TOOLS
from .schema import parse_docstring, schema_of
from .toolkit import Toolkit

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
        return tool.model_copy(update={"parameters": schema_of(fn)["function"]["parameters"]})

    server = MCPServer("pager", log_level="WARNING", instructions=(
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
    from pager.session import settle

    settle()
    try:
        build(toolkit).run("stdio")
    finally:
        toolkit.close()
