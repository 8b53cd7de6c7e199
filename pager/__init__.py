"""pager: virtual memory for LLM agents.

    import pager

    with pager.Home(pager.Config(home="~/.pager", budget=8192)) as home:
        session = home.open("work")
        session.append("Maya", "We chose Yjs over OT for the sync engine.")
        context = pager.build(session, "what did we choose for sync?")

    with pager.Toolkit(session="my-agent") as memory:   # the tools, for your own agent loop
        memory.remember("The vault code is 7731.")
        memory.search("vault code", k=3)

`import pager` stays cheap: the names below load their modules on first use, and nothing here
imports litellm or lancedb (they load only on the paths that call a model or open the store).
"""

from __future__ import annotations

import os
from importlib import import_module
from typing import TYPE_CHECKING, Any

from .config import Config
from .errors import (BudgetError, ConfigError, InputError, ModelError, PageNotFound, PagerError, StoreError,
                     ToolError)

# Imported from a clone's source tree with no editable install (python started in the clone's root after
# `pip install .`: the working folder comes first on sys.path), pager.tools, pager.cli and pager.prompts
# are the top-level folders tools/, cli/ and prompts/, as pyproject's package-dir maps them when installed.
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not os.path.isdir(os.path.join(__path__[0], "prompts")) and os.path.isfile(os.path.join(_root, "pyproject.toml")) \
        and os.path.isfile(os.path.join(_root, "prompts", "__init__.py")):
    __path__.append(_root)

if TYPE_CHECKING:
    from .agent import Agent, Reply
    from .context import Context, build
    from .home import Home
    from .llm import LiteLLMModel, ModelReply
    from .model import HandlerModel, Model
    from .offline import OfflineShell
    from .session import Session
    from .tools import Toolkit

# public name -> the module that defines it, imported when the name is first used
_LAZY = {
    "Home": "pager.home", "Session": "pager.session", "build": "pager.context", "Context": "pager.context",
    "Toolkit": "pager.tools", "Agent": "pager.agent", "Reply": "pager.agent", "Model": "pager.model",
    "HandlerModel": "pager.model", "ModelReply": "pager.llm", "LiteLLMModel": "pager.llm",
    "OfflineShell": "pager.offline",   # HandlerModel(OfflineShell()): the README's model that needs no key
}

__all__ = ["BudgetError", "Config", "ConfigError", "InputError", "ModelError", "PageNotFound", "PagerError",
           "StoreError", "ToolError", "__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value   # once loaded, an ordinary attribute
        return value
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("pager")
        except PackageNotFoundError:   # a source tree that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'pager' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
