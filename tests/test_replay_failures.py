"""A trace replays exactly when the model failed in it (a provider's 502, an unreachable server, a
prompt over the window) and when the model's window cut the budget: replay serves each recorded
failure as that failure, in order with the replies, and starts from the frames the recording had."""

import json

import pytest

from conftest import say
from pager.agent import Agent
from pager.embed import HashEmbedder
from pager.home import Home
from pager.llm import LiteLLMModel, litellm, register
from pager.model import HandlerModel
from pager.offline import OfflineShell, Script
from pager.replay import replay
from pager.store import MemoryStore
from pager.trace import TraceWriter, begin


@pytest.fixture(scope="module", autouse=True)
def imported():
    litellm()   # import once for the module (seconds)


def _record(config, path, model, messages, turns=40):
    """A chat through the real Agent and Home, traced as `pager chat` traces it."""
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("t")
    writer = TraceWriter(path, note="a test's recording")
    s.events.listeners.append(writer)
    agent = Agent(s, model)
    begin(s, model.name, agent.budget)   # a new session: no snapshot, its frames are the budget's
    say(s, turns)
    replies = [agent.ask(m) for m in messages]
    writer.close()
    home.journal.close(remove=True)
    return replies, [json.loads(line) for line in open(path)]


def _call(name, arguments, id="c"):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _error(name, message):
    return getattr(litellm(), name)(message=message, llm_provider="pager", model="pager/script")


def test_a_trace_with_provider_failures_replays_exactly(config, tmp_path):
    """A 502 that outlasts the retries after a tool call, one the retries get past, a prompt over the
    window (the agent shrinks its budget and asks again), a refused key: each replays as recorded."""
    bad = _error("BadGatewayError", "502 Bad Gateway")
    register("script", Script([
        {"content": None, "tool_calls": [_call("search", '{"query": "turn 3"}')]}, *[bad] * 5,
        bad, bad, {"content": "back again"},
        _error("ContextWindowExceededError", "this model's maximum context length is 1000 tokens"),
        {"content": "shorter now"},
        _error("AuthenticationError", "invalid api key"),
        {"content": "the last word"},
    ]))
    model = LiteLLMModel("pager/script", sleep=lambda s: None)
    replies, events = _record(config, tmp_path / "t.jsonl", model,
                              ["what does turn 3 say?", "are you there?", "a long one", "and the key?", "bye"])
    assert [bool(r.error) for r in replies] == [True, False, False, True, False]
    kinds = [e["kind"] for e in events]
    assert kinds.count("model_error") == 2 and kinds.count("overflow") == 1
    assert "still failing after 5 tries" in next(e["error"] for e in events if e["kind"] == "model_error")

    run = replay(tmp_path / "t.jsonl", check=True)
    assert run.divergence is None, run.divergence.describe()
    assert [e["error"] for e in run.events if e["kind"] == "model_error"] == \
        [e["error"] for e in events if e["kind"] == "model_error"]


def test_a_trace_that_ends_on_an_unreachable_server_replays_exactly(config, tmp_path):
    register("script", Script([_error("APIConnectionError", "connection refused")] * 5))
    model = LiteLLMModel("pager/script", sleep=lambda s: None)
    replies, events = _record(config, tmp_path / "t.jsonl", model, ["hello?"])
    assert replies[0].error and events[-1]["kind"] == "model_error"
    run = replay(tmp_path / "t.jsonl", check=True)
    assert run.divergence is None, run.divergence.describe()


class Small(HandlerModel):
    """The offline shell behind a window smaller than the configured budget (a local model's)."""

    def __init__(self, window: int) -> None:
        super().__init__(OfflineShell(), "ollama/small", output_tokens=256)
        self._window = window

    def window(self) -> int:
        return self._window


def test_a_trace_whose_budget_the_window_cut_replays_exactly(config, tmp_path):
    model = Small(window=1536 + 256)   # the budget is 2048: the agent's is cut to 1536
    _, events = _record(config, tmp_path / "t.jsonl", model, ["what does turn 3 say?", "and turn 30?"])
    start = next(e for e in events if e["kind"] == "session_start")
    assert start["budget"] == 1536 < config.budget
    assert any(e["kind"] == "resize" for e in events)
    run = replay(tmp_path / "t.jsonl", check=True)
    assert run.divergence is None, run.divergence.describe()
    assert run.start_frames == (config.budget - config.map_reserve) // config.page_tokens
