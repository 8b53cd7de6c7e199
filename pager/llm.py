"""Model calls through litellm (`LiteLLMModel`), imported once, lazily, and quietly.

The agent loop depends only on pager.model.Model; pager's own models (the offline memory
shell, scripted replies) run in process as pager.model.HandlerModel, without litellm.

`import litellm` costs seconds and, unconfigured, fetches a price map from the network and
prints to stdout (which would corrupt an MCP stdio stream). So it is imported only when a
real model is called, with the local price map and debug output off, optionally in a
background thread while the REPL waits for the first message; the offline shell never
imports it. pager's own models are also registered as litellm custom providers, so that
code calling litellm directly (the README's agent loop, with `pager/offline`) reaches them.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .errors import ConfigError, ModelError

DEFAULT_WINDOW = 128_000  # context window assumed for models litellm does not know
LOCAL_TIMEOUT = 900.0     # seconds a model served on this machine may take for one reply (2 cores: ~60 s per 2K prompt)
OFFLINE = "pager/offline"

_lock = threading.Lock()
_module = None
_providers: dict[str, object] = {}


def litellm():
    """The litellm module, imported once with the network price fetch and stdout chatter off."""
    global _module
    with _lock:
        if _module is None:
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            import litellm as module

            for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy", "litellm"):
                logging.getLogger(name).setLevel(logging.WARNING)
            module.suppress_debug_info = True
            module.set_verbose = False
            module.telemetry = False
            module.custom_provider_map = [{"provider": "pager", "custom_handler": _router_class()()}]
            _module = module
    return _module


def preload() -> threading.Thread:
    """Start importing litellm in the background (the REPL does this while the user types)."""
    thread = threading.Thread(target=litellm, daemon=True)
    thread.start()
    return thread


def register(name: str, handler) -> None:
    """Serve model `pager/<name>` with handler(messages, tools) -> dict reply (see offline.py)."""
    _providers[name] = handler


def _router_class():
    from litellm import CustomLLM, ModelResponse

    class Router(CustomLLM):
        def completion(self, model, messages, *args, optional_params=None, **kwargs):
            name = model.split("/", 1)[-1]
            handler = _providers.get(name)
            if handler is None:
                raise ConfigError(f"no pager model {name!r}; use pager/offline or set --model to a provider's model")
            tools = (optional_params or {}).get("tools") or []
            reply = handler(messages, tools)
            finish = reply.pop("finish_reason", None) or ("tool_calls" if reply.get("tool_calls") else "stop")
            return ModelResponse(model=model, choices=[{"message": {"role": "assistant", **reply}, "finish_reason": finish}])

    return Router


# the key variable of the providers most models named on the command line come from, by the model
# name's start: the same variable litellm's validate_environment asks for
KEYS = (("gpt-", "OPENAI_API_KEY"), ("chatgpt-", "OPENAI_API_KEY"), ("o1", "OPENAI_API_KEY"), ("o3", "OPENAI_API_KEY"),
        ("o4-", "OPENAI_API_KEY"), ("claude-", "ANTHROPIC_API_KEY"), ("anthropic/", "ANTHROPIC_API_KEY"),
        ("mistral/", "MISTRAL_API_KEY"), ("groq/", "GROQ_API_KEY"),
        ("deepseek/", "DEEPSEEK_API_KEY"), ("openrouter/", "OPENROUTER_API_KEY"))


def known_key(model: str) -> str:
    """The key variable a model of a well-known provider needs ("" when the name does not say)."""
    return next((key for start, key in KEYS if model.startswith(start)), "")


def local_server(api_base: str) -> bool:
    """Whether the model's server is on this machine (loopback): a model run on its CPU, slow per step."""
    from urllib.parse import urlsplit

    host = (urlsplit(api_base if "://" in api_base else f"http://{api_base}").hostname or "").lower()
    return host in ("localhost", "::1") or host.startswith("127.")


def check_known_key(model: str, otherwise: str = "run without --model for the offline memory shell") -> None:
    """Fail in one line when a well-known provider's key is missing: said before litellm's import
    (seconds), as its validate_environment would say it after."""
    key = known_key(model)
    if key and not os.environ.get(key):
        raise ModelError(f"model {model} needs {key} in the environment; set it, or {otherwise}")


UNROUTABLE = ("names no provider litellm knows; give it as provider/model (openai/gpt-4o-mini, "
              "anthropic/claude-sonnet-4-20250514, ollama/llama3)")


def routable(model: str) -> bool:
    """Whether litellm can tell which provider serves this model name (pager's own `pager/…` can)."""
    if model.startswith("pager/"):
        return True
    module = litellm()
    try:
        module.get_llm_provider(model)
    except module.exceptions.BadRequestError:
        return False
    except Exception:  # noqa: BLE001 - litellm failed otherwise: let the first call say what is wrong
        return True
    return True


def unservable(model: str) -> str:
    """Why no call of this model can work here, told without importing litellm (seconds): a provider's
    key missing from the environment, or a name no provider litellm knows, read from the provider list
    and model map litellm ships as files. "" when these cannot tell: litellm's own check then decides.
    Never stricter than that check (tests/test_serve_startup.py holds them to it)."""
    if model.startswith("pager/"):
        return ""
    key = known_key(model) or ("OPENAI_API_KEY" if model.startswith("openai/") else "")
    if key and not os.environ.get(key):
        return f"needs {key} in the environment; set it"
    known = shipped_names()
    if known is None:
        return ""
    providers, models = known
    head, slash, _ = model.partition("/")
    if model in models or (slash and head in providers) or (not slash and (":" in model or known_key(model)
                                                                           or "claude" in model.lower())):
        return ""   # a mapped model, a provider's, a fine-tune's ft:… name, or a family litellm routes by its name
    return UNROUTABLE


@functools.lru_cache(maxsize=1)
def shipped_names() -> tuple[frozenset[str], frozenset[str]] | None:
    """litellm's provider names (its LlmProviders enum, read as text) and the models of its bundled model
    map, or None if its files are not where this litellm keeps them."""
    import importlib.util
    import json
    import re
    from pathlib import Path

    spec = importlib.util.find_spec("litellm")   # finds the package without running it
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    try:
        source = (folder / "types" / "utils.py").read_text(encoding="utf-8")
        body = source.split("class LlmProviders(", 1)[1].split("\nclass ", 1)[0]
        mapped = json.loads((folder / "model_prices_and_context_window_backup.json").read_bytes())
    except (OSError, IndexError, ValueError):
        return None
    providers = set(re.findall(r'^    [A-Z0-9_]+ = "([^"]+)"', body, re.M))
    providers |= {v["litellm_provider"] for v in mapped.values() if isinstance(v, dict) and v.get("litellm_provider")}
    return (frozenset(providers), frozenset(mapped)) if providers else None


@dataclass
class ModelReply:
    text: str
    tool_calls: list[dict] = field(default_factory=list)   # [{"id", "name", "arguments"}]
    usage: dict = field(default_factory=dict)
    retries: int = 0
    truncated: bool = False    # the provider stopped at the output limit


class ContextOverflow(Exception):
    """The provider said the prompt is longer than the model's window."""


class LiteLLMModel:
    """One model string, with retries for transient provider errors."""

    def __init__(self, name: str, output_tokens: int = 1024, attempts: int = 5, backoff: float = 1.0,
                 sleep: Callable[[float], None] = time.sleep, timeout: float = 120.0, api_base: str = "",
                 temperature: float | None = None) -> None:
        self.name = name
        self.temperature = temperature   # None: the provider's default
        self.output_tokens = output_tokens
        self.attempts, self.backoff, self.sleep, self.timeout = attempts, backoff, sleep, timeout
        self.api_base = api_base
        if api_base and local_server(api_base):   # a model on this machine: a step over a long prompt takes minutes
            self.timeout = max(timeout, LOCAL_TIMEOUT)

    @property
    def offline(self) -> bool:
        return self.name.startswith("pager/")

    def check(self, otherwise: str = "run without --model for the offline memory shell") -> None:
        """Fail early, in one line, when the provider's key is missing; `otherwise` is the way out."""
        if self.offline:
            return
        check_known_key(self.name, otherwise)
        if self.api_base and self.name.startswith("openai/"):
            return   # a server of the user's own (llama.cpp, vLLM): any key it was given is the key
        if not routable(self.name):   # every call would fail the same way: say so once, now
            raise ModelError(f"model {self.name!r} {UNROUTABLE}, or {otherwise}")
        try:
            env = litellm().validate_environment(model=self.name)
        except Exception:  # noqa: BLE001 - an unknown provider: let the first call say what is wrong
            return
        missing = env.get("missing_keys") or []
        if missing:
            raise ModelError(f"model {self.name} needs {', '.join(missing)} in the environment; set it, or {otherwise}")

    def window(self) -> int:
        """The model's input window; a default for models litellm does not know."""
        if self.offline:
            return DEFAULT_WINDOW
        try:
            info = litellm().get_model_info(self.name)
            return int(info.get("max_input_tokens") or info.get("max_tokens") or DEFAULT_WINDOW)
        except Exception:  # noqa: BLE001 - ModelNotMappedError and friends
            return DEFAULT_WINDOW

    def complete(self, messages: list[dict], tools: list[dict]) -> ModelReply:
        lib = litellm()
        transient = (lib.RateLimitError, lib.Timeout, lib.APIConnectionError, lib.InternalServerError,
                     lib.ServiceUnavailableError, lib.BadGatewayError)
        for attempt in range(self.attempts):
            try:
                # max_retries=0: pager's tries are the only ones (the provider's SDK retried each of them twice more)
                response = lib.completion(model=self.name, messages=messages, tools=tools or None,
                                          max_tokens=self.output_tokens, timeout=self.timeout, max_retries=0,
                                          **({"api_base": self.api_base} if self.api_base else {}),
                                          **({"temperature": self.temperature} if self.temperature is not None else {}))
                return _reply(response, attempt)
            except lib.ContextWindowExceededError as exc:
                raise ContextOverflow(str(exc)) from exc
            except lib.AuthenticationError as exc:
                raise ModelError(f"{self.name}: the provider refused the API key ({_short(exc)}); check the key "
                                 "variable for this provider") from exc
            except lib.NotFoundError as exc:
                raise ModelError(f"{self.name}: model not found ({_short(exc)}); check --model") from exc
            except transient as exc:
                if attempt == self.attempts - 1:
                    raise ModelError(f"{self.name}: still failing after {self.attempts} tries ({_short(exc)}); "
                                     "try again later") from exc
                self.sleep(self.backoff * 2**attempt)
            except lib.BadRequestError as exc:
                raise ModelError(f"{self.name}: the provider rejected the request ({_short(exc)})") from exc
        raise AssertionError("unreachable")


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) < 200 else text[:199] + "…"


def _reply(response, retries: int) -> ModelReply:
    message = response.choices[0].message
    calls = []
    for i, call in enumerate(getattr(message, "tool_calls", None) or []):
        calls.append({"id": call.id or f"call_{i}", "name": call.function.name,
                      "arguments": call.function.arguments or ""})
    usage = getattr(response, "usage", None)
    usage = {"prompt": getattr(usage, "prompt_tokens", 0), "completion": getattr(usage, "completion_tokens", 0)} if usage else {}
    truncated = getattr(response.choices[0], "finish_reason", "") == "length"
    return ModelReply(message.content or "", calls, usage, retries, truncated)
