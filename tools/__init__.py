"""pager's tool bundle: the same typed functions for the chat loop, other agents and MCP."""

from .dispatch import AGENT, MODEL, Dispatcher
from .functions import AGENT_TOOLS, MODEL_TOOLS
from .schema import schema_of
from .toolkit import Toolkit

__all__ = ["AGENT", "AGENT_TOOLS", "MODEL", "MODEL_TOOLS", "Dispatcher", "Toolkit", "schema_of"]
