"""The agent loop through litellm: the offline shell, scripted replies, failures that never crash."""


import pytest

from conftest import say
from pager.agent import Agent
from pager.llm import LiteLLMModel, litellm, register
from pager.offline import OfflineShell, Script

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


@pytest.fixture(scope="module", autouse=True)
def providers():
    litellm()  # import once for the module (seconds)
    register("offline", OfflineShell())


def scripted(replies, **kw):
    script = Script(replies)
    register("script", script)
    return script, LiteLLMModel("pager/script", sleep=lambda s: None, **kw)


def call(name, arguments, id="c1"):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_offline_shell_pages_back_a_fact_from_turn_3_after_40_turns(mem_home):
    s = mem_home.open("a")
    say(s, 2)
    s.append("maya", "My daughter Ines is allergic to shellfish, keep that in mind for the party.")
    say(s, 60, start=3)
    holder = next(n for n, p in s.pages.items() if "shellfish" in p.text)
    assert not s.table[holder].resident, "evicted by the later turns"
    agent = Agent(s, LiteLLMModel("pager/offline"))
    reply = agent.ask("What is Ines allergic to?")
    assert "shellfish" in reply.text and f"p{holder}" in reply.text
    assert [c["name"] for c in reply.tool_calls][0] == "search"
    assert s.table[holder].resident
    assert s.turn_count == 63 + 2  # the question and the answer are in memory too


def test_offline_shell_acknowledges_statements_without_tools(mem_home):
    s = mem_home.open("a")
    reply = Agent(s, LiteLLMModel("pager/offline")).ask("I moved the standup to 9:30.")
    assert reply.steps == 1 and not reply.tool_calls and "offline memory shell" in reply.text


def test_scripted_tool_calls_page_in_and_bookmark(mem_home):
    s = mem_home.open("a")
    say(s, 80)
    script, model = scripted([
        {"content": None, "tool_calls": [call("page_in", '{"page": "p2"}')]},
        {"content": None, "tool_calls": [call("bookmark", '{"page_ids": ["p2"], "keywords": ["early talk"], "note": "start"}', "c2")]},
        {"content": "done"},
    ])
    reply = Agent(s, model).ask("look at the start")
    assert reply.text == "done" and reply.steps == 3
    assert s.table[2].resident and s.directory.lookup("early talk") == {2}
    assert "[p2 · " in script.seen[1][0]["content"], "the paged-in page is in the next prompt"
    assert script.seen[1][-1] == {"role": "tool", "tool_call_id": "c1", "content": reply.tool_calls[0]["result"]}


@pytest.mark.parametrize("name, arguments, expect", [
    ("page_in", '{"page": "p999"}', "does not exist"),
    ("page_in", "{not json", "not valid JSON"),
    ("page_out", '{"page_id": 12, "extra": 1}', "unknown argument"),
    ("bookmark", '{"page_ids": ["p1"]}', "missing required argument 'keywords'"),
    ("search", '{"query": "x", "k": "many"}', "whole number"),
    ("format_disk", "{}", "unknown tool"),
    ("pin", '{"page_id": "p1"}' * 2, "not valid JSON (Extra data"),   # two objects run together
])
def test_malformed_tool_calls_come_back_as_text(mem_home, name, arguments, expect):
    s = mem_home.open("a")
    say(s, 60)
    _, model = scripted([{"content": None, "tool_calls": [call(name, arguments)]}, {"content": "recovered"}])
    reply = Agent(s, model).ask("do something odd")
    assert reply.text == "recovered"
    assert expect in reply.tool_calls[0]["result"]


def test_rate_limit_is_retried(mem_home):
    s = mem_home.open("a")
    lib = litellm()
    _, model = scripted([lib.RateLimitError("slow down", llm_provider="pager", model="pager/script"),
                         lib.RateLimitError("slow down", llm_provider="pager", model="pager/script"),
                         {"content": "finally"}])
    events = []
    s.events.listeners.append(events.append)
    reply = Agent(s, model).ask("hello?")
    assert reply.text == "finally"
    assert next(e for e in events if e.kind == "model_reply").data["retries"] == 2


def test_persistent_provider_failure_keeps_the_message(mem_home):
    s = mem_home.open("a")
    lib = litellm()
    _, model = scripted([lib.ServiceUnavailableError("down", llm_provider="pager", model="pager/script")] * 5)
    reply = Agent(s, model).ask("are you there?")
    assert reply.error and "try again later" in reply.error
    assert s.turn_count == 1  # the user's message is in memory


def test_context_overflow_shrinks_the_frames_and_retries(mem_home):
    s = mem_home.open("a")
    say(s, 100)
    lib = litellm()
    script, model = scripted([lib.ContextWindowExceededError("too long", model="pager/script", llm_provider="pager"),
                              {"content": "fits now"}])
    events = []
    s.events.listeners.append(events.append)
    reply = Agent(s, model).ask("summarise")
    assert reply.text == "fits now"
    requests = [e.data for e in events if e.kind == "model_request"]
    assert len(requests) == 2
    first, second = requests[0], requests[1]   # fewer frames, or the smaller tier of fixed regions (both shrink it)
    assert second["frames"] < first["frames"] or second["tokens"]["prefix"] < first["tokens"]["prefix"]
    assert second["tokens"]["total"] <= 0.75 * 2048
    assert any(e.kind == "overflow" for e in events)


def test_step_limit_holds(mem_home):
    s = mem_home.open("a")
    say(s, 30)
    _, model = scripted([{"content": None, "tool_calls": [call("search", '{"query": "turn"}', f"c{i}")]} for i in range(20)])
    reply = Agent(s, model, max_steps=3).ask("loop forever")
    assert reply.stopped and reply.steps == 3 and len(reply.tool_calls) == 3
    assert "stopped after 3 model calls" in reply.text


def test_missing_api_key_is_one_clear_line(monkeypatch):
    from pager.errors import ModelError

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        LiteLLMModel("gpt-4o-mini").check()


def test_unknown_model_gets_a_default_window():
    assert LiteLLMModel("someprovider/unknown-model-9").window() == 128_000
