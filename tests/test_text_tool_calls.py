"""Tool calls a model writes as text: read and run, told back when unreadable, never shown as an answer."""

import json

import pytest

from conftest import say
from pager.agent import CALL_RETRIES, Agent, default_paging
from pager.bench.record import record
from pager.config import Config
from pager.model import HandlerModel
from pager.offline import Script
from pager.replay import replay
from pager.textcalls import looks_like_call, read
from pager.trace import read_trace

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

TOOLS = {"search", "page_in", "page_out", "bookmark", "pin", "unpin", "state_set", "state_unset"}


# -- reading ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, name, arguments", [
    ('<tool_call>\n{"name": "search", "arguments": {"query": "Loom SRE"}}\n</tool_call>', "search", {"query": "Loom SRE"}),
    ('```json\n{"name": "page_in", "arguments": {"page": "p7"}}\n```', "page_in", {"page": "p7"}),
    ('{"name": "search", "parameters": {"query": "team size"}}', "search", {"query": "team size"}),
    ('Let me look that up.\n{"name": "search", "arguments": {"query": "SRE"}}', "search", {"query": "SRE"}),
    ('{"type": "function", "function": {"name": "pin", "arguments": "{\\"page_id\\": \\"p3\\"}"}}', "pin", {"page_id": "p3"}),
    ('```json\n{"name": "state_get", "arguments": {"key": "team"}}\n```', "state_get", {"key": "team"}),
    ('```python\nsearch(query="Loom team", k=3)\n```', "search", {"query": "Loom team", "k": 3}),
    ('<tool_call>{"name": "search", "arguments": {"query": "a"}}', "search", {"query": "a"}),   # the tag left open
    # braces doubled as a template escapes them: Qwen2.5-Coder-1.5B's reply in a recorded benchmark trace
    ('{{"name": "search", "arguments": {"query": "Caroline painting for art show", "k": 1}}}', "search",
     {"query": "Caroline painting for art show", "k": 1}),
    ('```json\n{{"name": "page_in", "arguments": {"page": "p7"}}}\n```', "page_in", {"page": "p7"}),
    ('{{"name": "page_in", "arguments": {"page": "p143"}}}}', "page_in", {"page": "p143"}),   # closed with one more
])
def test_calls_written_as_text_are_read_in_every_form_models_use(text, name, arguments):
    reading = read(text, TOOLS, step=2)
    assert [c["name"] for c in reading.calls] == [name]
    assert json.loads(reading.calls[0]["arguments"]) == arguments
    assert reading.calls[0]["id"] == "text_2_0" and not reading.malformed
    assert "{" not in reading.text and "tool_call" not in reading.text


def test_several_calls_in_one_reply_are_all_read_with_the_prose_kept():
    text = ('I will check two things.\n<tool_call>{"name": "search", "arguments": {"query": "SRE"}}</tool_call>\n'
            '<tool_call>{"name": "page_in", "arguments": {"page": "p2"}}</tool_call>')
    reading = read(text, TOOLS)
    assert [c["name"] for c in reading.calls] == ["search", "page_in"]
    assert [c["id"] for c in reading.calls] == ["text_0_0", "text_0_1"]
    assert reading.text == "I will check two things." and reading.form == "tag"


def test_several_overbraced_calls_one_per_line_are_all_read():
    # the same model's reply to "When did Caroline join a new activist group?" in the benchmark
    text = ('{{"name": "search", "arguments": {"query": "activist group", "k": 1}}}}\n'
            '{{"name": "page_in", "arguments": {"page": "p86"}}}}')
    reading = read(text, TOOLS, step=1)
    assert [(c["name"], json.loads(c["arguments"])) for c in reading.calls] == [
        ("search", {"query": "activist group", "k": 1}), ("page_in", {"page": "p86"})]
    assert not reading.malformed and not reading.text


@pytest.mark.parametrize("text", [
    "Your team has six engineers; the SRE is Priya (p4).",
    '```json\n{"team": "platform", "engineers": 6}\n```',                  # JSON the user asked for
    '{"name": "Maya", "role": "lead"}',                                     # a record with a name in it
    "Use `search` to look things up, e.g. search the word {team}.",
    '```bash\npager search "Loom"\n```',
])
def test_answers_that_only_look_technical_stay_text(text):
    reading = read(text, TOOLS)
    assert not reading.calls and not reading.malformed and reading.text == text
    assert not looks_like_call(text, TOOLS)


@pytest.mark.parametrize("text", [
    '<tool_call>{"name": "search", "arguments": {"query": "SRE"}</tool_call>',     # a brace short
    '```json\n{"name": "search", "arguments": {"query": "SRE"\n```',
    '{"name": "page_in", "arguments": {"page": "p2"',
    "<tool_call>search for the SRE</tool_call>",
])
def test_call_syntax_that_cannot_be_read_is_malformed_not_an_answer(text):
    reading = read(text, TOOLS)
    assert not reading.calls and reading.malformed
    assert looks_like_call(text, TOOLS)


# -- the agent loop ---------------------------------------------------------------------------------------------
def scripted(*replies):
    script = Script([{"content": r} if isinstance(r, str) else r for r in replies])
    return script, HandlerModel(script, name="pager/script")


def holder(s, word):
    return next(n for n, p in s.pages.items() if word in p.text)


def seed(s):
    say(s, 3)
    s.append("maya", "For context: I lead the platform team at Loom. Six engineers, one SRE called Priya.")
    say(s, 60, start=3)


def test_a_call_in_tags_runs_as_a_tool_call_and_the_answer_is_clean(mem_home):
    s = mem_home.open("a")
    seed(s)
    seen = []
    s.events.listeners.append(lambda e: seen.append(e))
    script, model = scripted('<tool_call>\n{"name": "search", "arguments": {"query": "SRE Priya Loom"}}\n</tool_call>',
                             "Six engineers; the SRE is Priya.")
    reply = Agent(s, model, paging="tools").ask("Who is the SRE on my team?")
    assert reply.text == "Six engineers; the SRE is Priya." and reply.steps == 2 and not reply.error
    assert [c["name"] for c in reply.tool_calls] == ["search"] and f"p{holder(s, 'Priya')}" in reply.tool_calls[0]["result"]
    read_event = next(e for e in seen if e.kind == "calls_in_text")
    assert read_event.data["form"] == "tag" and read_event.data["calls"][0]["id"] == "text_1_0"
    # the model sees its call as a call and the result as the tool's, as if it had sent it through the API
    assert script.seen[1][-2]["tool_calls"][0]["function"]["name"] == "search"
    assert script.seen[1][-1]["role"] == "tool" and script.seen[1][-1]["tool_call_id"] == "text_1_0"
    stored = "\n".join([*(p.text for p in s.pages.values()), *(piece.line for piece in s.packer.pieces)])
    assert "Six engineers; the SRE is Priya." in stored and "tool_call" not in stored


def test_an_unknown_tool_written_as_text_is_answered_with_the_tools_there_are(mem_home):
    s = mem_home.open("a")
    seed(s)
    script, model = scripted('```json\n{"name": "state_get", "arguments": {"key": "team"}}\n```', "Six engineers.")
    reply = Agent(s, model, paging="tools").ask("How many engineers are on my team?")
    result = reply.tool_calls[0]["result"]
    assert "unknown tool 'state_get'" in result and "search" in result and "page_in" in result
    assert reply.text == "Six engineers."


def test_a_call_repeated_within_a_message_runs_once_and_the_model_is_told_to_answer(mem_home):
    # Qwen2.5-Coder-1.5B in the benchmark: page_in of the same page, step after step, until the step limit
    s = mem_home.open("a")
    seed(s)
    call = '{"name": "page_in", "arguments": "{\\"page\\": \\"p1\\"}"}'
    script, model = scripted(call, '{"name": "page_in", "arguments": {"page":  "p1"}}', "Six engineers.")
    faults = []
    s.events.listeners.append(lambda e: faults.append(e) if e.kind == "fault" and e.data["reason"] == "tool" else None)
    reply = Agent(s, model, paging="tools").ask("How many engineers are on my team?")
    first, second = (c["result"] for c in reply.tool_calls)
    assert "called with these arguments at step 1" in second and first in second and "Answer the message now" in second
    assert len(faults) <= 1 and reply.text == "Six engineers." and reply.steps == 3


def test_unreadable_call_is_retried_with_a_note_and_never_reaches_the_user(mem_home):
    s = mem_home.open("a")
    seed(s)
    broken = '<tool_call>{"name": "search", "arguments": {"query": "SRE"}</tool_call>'
    script, model = scripted(broken, "The SRE is Priya.")
    reply = Agent(s, model, paging="tools").ask("Who is the SRE?")
    assert reply.text == "The SRE is Priya." and reply.steps == 2
    note = script.seen[1][-1]
    assert note["role"] == "user" and "could not run the tool call" in note["content"] and "search" in note["content"]
    assert script.seen[1][-2] == {"role": "assistant", "content": broken}


def test_a_model_that_keeps_writing_broken_calls_gets_an_error_not_its_syntax_shown(mem_home):
    s = mem_home.open("a")
    seed(s)
    turns = s.turn_count
    broken = '{"name": "search", "arguments": {"query": "SRE"'
    script, model = scripted(*[broken] * (CALL_RETRIES + 3))
    reply = Agent(s, model, paging="tools").ask("Who is the SRE?")
    assert reply.error and reply.steps == CALL_RETRIES + 1 and len(script.seen) == CALL_RETRIES + 1
    assert "{" not in reply.text and "tool calls as text" in reply.text
    assert s.turn_count == turns + 1, "the question is kept; no reply is stored"


def test_automatic_paging_offers_no_tools_and_still_pages_in_the_answer(mem_home):
    s = mem_home.open("a")
    seed(s)
    tools_sent = []
    script = Script([{"content": '{"name": "search", "arguments": {"query": "SRE"}}'}, {"content": "Priya."}])

    def handler(messages, tools):
        tools_sent.append(tools)
        return script(messages, tools)

    agent = Agent(s, HandlerModel(handler, name="pager/script"), paging="automatic")
    assert agent.tier == "bare" and agent.tools == []
    reply = agent.ask("Who is the SRE on the platform team at Loom?")
    assert reply.text == "Priya." and tools_sent == [[], []]
    assert s.table[holder(s, "Priya")].resident, "automatic paging faulted the answer's page in"
    assert "no tools" in script.seen[1][-1]["content"]


@pytest.mark.parametrize("model, api_base, paging", [
    ("openai/qwen", "http://127.0.0.1:8765/v1", "automatic"),
    ("openai/qwen", "http://localhost:8080/v1", "automatic"),
    ("openai/gpt-4o-mini", "", "tools"),
    ("gpt-4o-mini", "", "tools"),
    ("anthropic/claude-3-5-sonnet-20241022", "", "tools"),
    ("ollama/llama3.1", "", "automatic"),
    ("openrouter/qwen/qwen2.5-1.5b-instruct", "", "automatic"),
    ("groq/llama-3.1-70b-versatile", "", "tools"),
    ("together_ai/meta-llama/Llama-2-13b-chat-hf", "", "tools"),
    ("gemini/gemma-2b", "", "automatic"),
    ("pager/offline", "", "tools"),
])
def test_the_paging_default_follows_where_and_how_large_the_model_is(model, api_base, paging):
    assert default_paging(model, api_base) == paging


def test_paging_setting_is_read_and_checked(tmp_path):
    assert Config.load(env={"PAGER_PAGING": "automatic"}, home=tmp_path).paging == "automatic"
    local = Config.load(env={"OPENAI_API_BASE": "http://127.0.0.1:9/v1"}, home=tmp_path, model="openai/qwen")
    assert local.api_base == "http://127.0.0.1:9/v1"
    with pytest.raises(Exception, match="unknown paging 'sometimes'; choose tools"):
        Config(home=tmp_path, paging="sometimes")


def test_recoveries_replay_exactly(tmp_path):
    messages = [{"speaker": "maya" if i % 2 else "assistant",
                 "text": "For context: Six engineers, one SRE called Priya." if i == 7 else f"turn {i} about w{i} and v{i}"}
                for i in range(90)]
    script = Script([{"content": '<tool_call>{"name": "search", "arguments": {"query": "SRE Priya"}}</tool_call>'},
                     {"content": "Priya."},
                     {"content": '```json\n{"name": "search", "arguments": {"query": "SRE"\n```'},
                     {"content": "Six."}])
    out = tmp_path / "recovery.jsonl"
    config = Config(home=tmp_path / "h", session="r", budget=2048, embedder="hash", paging="tools")
    record(out, messages, ["Who is the SRE?", "How many engineers?"], config, "text tool calls, scripted",
           model=HandlerModel(script, name="pager/script"))
    kinds = [e["kind"] for e in read_trace(out)]
    assert "calls_in_text" in kinds and "reply_unread" in kinds
    run = replay(out, check=True)
    assert run.divergence is None, run.divergence.describe()
