"""What the agent loop needs of a model, and nothing more.

A model takes the messages and the tool schemas and returns a ModelReply (text and tool calls).
It also says how many input tokens it takes (`window`) and how many it keeps for its reply
(`output_tokens`). LiteLLMModel (any provider), ReplayModel (a trace's recorded replies) and a
handler such as the offline shell wrapped in HandlerModel all satisfy it; so can a test's own.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from .llm import DEFAULT_WINDOW, ModelReply

Handler = Callable[[list[dict], list[dict]], dict]   # (messages, tools) -> {"content", "tool_calls"}


@runtime_checkable
class Model(Protocol):
    """A model the agent loop can call. `complete` raises ModelError for a failure retries did not fix,
    and ContextOverflow when the prompt is longer than the window."""

    name: str
    output_tokens: int

    def window(self) -> int:
        """Input tokens the model takes."""
        ...

    def complete(self, messages: list[dict], tools: list[dict]) -> ModelReply:
        """One reply to messages, which may call tools."""
        ...


class HandlerModel:
    """A handler called in process, without litellm: the offline shell, scripted replies."""

    def __init__(self, handler: Handler, name: str = "pager/offline", output_tokens: int = 1024) -> None:
        self.handler, self.name, self.output_tokens = handler, name, output_tokens

    def window(self) -> int:
        return DEFAULT_WINDOW

    def complete(self, messages: list[dict], tools: list[dict]) -> ModelReply:
        reply = self.handler(messages, tools)
        calls = [{"id": c.get("id") or f"call_{i}", "name": c["function"]["name"],
                  "arguments": c["function"].get("arguments") or ""}
                 for i, c in enumerate(reply.get("tool_calls") or [])]
        return ModelReply(reply.get("content") or "", calls, truncated=reply.get("finish_reason") == "length")
