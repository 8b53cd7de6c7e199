"""Failing models never end a session or lose a turn; the dispatcher never raises, whatever it is sent."""

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import say
from pager.agent import Agent
from pager.llm import LiteLLMModel, litellm, register
from pager.offline import Script
from pager.tools import AGENT


@pytest.fixture(scope="module", autouse=True)
def imported():
    litellm()


def _model(replies):
    register("script", Script(replies))
    return LiteLLMModel("pager/script", sleep=lambda s: None, output_tokens=64)


def _call(name, arguments, id="c"):
    return {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize("error", ["Timeout", "RateLimitError", "InternalServerError", "ServiceUnavailableError",
                                   "BadGatewayError", "APIConnectionError"])
def test_transient_provider_errors_are_retried(mem_home, error):
    s = mem_home.open("a")
    lib = litellm()
    exc = getattr(lib, error)(message="boom", llm_provider="pager", model="pager/script")
    reply = Agent(s, _model([exc, exc, {"content": "fine"}])).ask("hello?")
    assert reply.text == "fine" and s.turn_count == 2


def test_a_failing_model_says_so_and_the_session_goes_on(mem_home):
    s = mem_home.open("a")
    lib = litellm()
    down = lib.InternalServerError(message="500", llm_provider="pager", model="pager/script")
    agent = Agent(s, _model([down] * 5 + [{"content": "back"}]))
    first = agent.ask("are you there?")
    assert first.error and "no answer" in first.text
    assert agent.ask("and now?").text == "back"
    assert s.turn_count == 3  # both questions and the one answer


def test_an_endless_tool_loop_stops_at_the_step_limit(mem_home):
    s = mem_home.open("a")
    say(s, 20)
    loop = [{"content": None, "tool_calls": [_call("search", '{"query": "again"}', f"c{i}")]} for i in range(50)]
    reply = Agent(s, _model(loop), max_steps=4).ask("loop")
    assert reply.stopped and reply.steps == 4


def test_unknown_tools_and_broken_json_come_back_as_results(mem_home):
    s = mem_home.open("a")
    say(s, 20)
    replies = [{"content": None, "tool_calls": [_call("rm_rf", "{}", "a"), _call("search", '{"query":', "b"),
                                                _call("search", "null", "c"), _call("page_in", '{"page": null}', "d")]},
               {"content": "ok"}]
    reply = Agent(s, _model(replies)).ask("do odd things")
    results = [c["result"] for c in reply.tool_calls]
    assert reply.text == "ok"
    assert "unknown tool" in results[0] and "not valid JSON" in results[1]
    assert "JSON object" in results[2] and "must be a string" in results[3]


def test_a_reply_cut_at_the_output_limit_says_so(mem_home):
    """Said beside the reply (Reply.truncated; the REPL's note, serve's finish_reason "length"), not
    added to it: the stored turn is what the model sent, as a replay of the trace makes it again."""
    s = mem_home.open("a")
    reply = Agent(s, _model([{"content": "The answer is", "finish_reason": "length"}])).ask("tell me everything")
    assert reply.text == "The answer is" and reply.truncated
    assert s.turn_count == 2 and s.packer.pieces[-1].turn.text == "The answer is"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=60),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(AGENT.names + ["", "nope", "page_in "]),
       arguments=st.one_of(json_values, st.text(max_size=200),
                           st.dictionaries(st.sampled_from(["query", "k", "page", "page_id", "page_ids", "keywords",
                                                            "note", "text", "role", "speaker", "budget", "x"]),
                                           json_values, max_size=4)))
def test_dispatcher_fuzz_never_raises(fuzz_session, name, arguments):
    if not isinstance(arguments, (str, dict)):
        arguments = json.dumps(arguments)  # what arrives over the wire; dicts are passed as a toolkit caller would
    text, ok = AGENT.run(fuzz_session, name, arguments)
    assert isinstance(text, str) and text
    assert isinstance(ok, bool)


@pytest.fixture(scope="module")
def fuzz_session(tmp_path_factory):
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home
    from pager.store import MemoryStore

    home = Home(Config(home=tmp_path_factory.mktemp("fuzz"), embedder="hash", budget=2048), store=MemoryStore(),
                embedder=HashEmbedder(), durable=False)
    s = home.open("fuzz")
    say(s, 80)
    yield s
    home.journal.close(remove=True)
