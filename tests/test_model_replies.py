"""Replies the way real models send them, through litellm against an OpenAI-compatible server of the
test's own on 127.0.0.1 (`pager chat --model`, `pager serve`, the README's agent loop): a reply cut at
the output limit, one repeating pager's prompt or quoting a search result, tool results outgrowing the
budget, a reply with no text, a failing provider asked once per try."""

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.config import Config

from conftest import ROOT


runner = CliRunner()


class FakeOpenAI:
    """`/v1/chat/completions` answering with the scripted replies in order (then a plain one), or a
    scripted status; every request body is kept in `bodies`."""

    def __init__(self) -> None:
        self.script: list[dict] = []
        self.bodies: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                fake.bodies.append(body)
                message, finish, *status = fake.script.pop(0) if fake.script else ({"content": "fine"}, "stop")
                if status:   # a failure: (None, None, 500)
                    data = json.dumps({"error": {"message": "overloaded", "type": "server_error"}}).encode()
                    self.send_response(status[0])
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                data = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "fake",
                                   "choices": [{"index": 0, "finish_reason": finish,
                                                "message": {"role": "assistant", **message}}],
                                   "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def fake(monkeypatch):
    from pager.llm import litellm

    litellm()   # imported as pager imports it: the local price map, no network
    server = FakeOpenAI()
    for name in ("OPENAI_API_BASE", "OPENAI_BASE_URL"):
        monkeypatch.setenv(name, server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("PAGER_EMBEDDER", "hash")
    yield server
    server.server.shutdown()


def test_a_reply_cut_at_the_output_limit_replays_and_is_stored_as_the_model_sent_it(tmp_path, fake):
    """`finish_reason: "length"`: the REPL stored the reply with " [reply cut at the output limit of 1024
    tokens]" added, and the trace did not say the reply was cut, so `pager replay --check` stored it without
    and diverged at that turn. The stored turn is the model's text now; the REPL says it was cut, the trace
    records `truncated`, and the replay reproduces it."""
    fake.script = [({"content": "Sailing is"}, "length")]
    home = str(tmp_path / "h")
    said = runner.invoke(app, ["--home", home, "chat", "--model", "openai/fake", "--budget", "2048"],
                         input="Tell me about sailing.\n")
    assert said.exit_code == 0, said.output
    assert "cut at its output limit of 1024 tokens" in said.output
    assert _texts(tmp_path / "h", "default") == ["Tell me about sailing.", "Sailing is"]
    trace = next((tmp_path / "h" / "traces").glob("*.jsonl"))
    replayed = runner.invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--check"])
    assert replayed.exit_code == 0, replayed.output


def test_serve_answers_a_cut_reply_with_finish_reason_length(tmp_path, fake):
    """Through `pager serve` a cut reply came back as `finish_reason: "stop"` with pager's note appended to
    the content, so an OpenAI client could not tell that it should continue; it is "length" now, the
    content what the model sent, streamed or not."""
    from test_serve import Running

    running = Running(tmp_path, config=Config(home=tmp_path, embedder="hash", budget=2048))
    try:
        client = running.openai()
        fake.script = [({"content": "The first half"}, "length")]
        reply = client.chat.completions.create(model="openai/fake", user="cut",
                                               messages=[{"role": "user", "content": "Say a lot."}])
        assert reply.choices[0].finish_reason == "length" and reply.choices[0].message.content == "The first half"
        fake.script = [({"content": "More of it"}, "length")]
        chunks = list(client.chat.completions.create(model="openai/fake", user="cut", stream=True,
                                                     messages=[{"role": "user", "content": "Say more."}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "More of it"
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    finally:
        running.stop()


def _session(tmp_path, budget=2048):
    from pager.home import Home

    home = Home(Config(home=tmp_path / "h", embedder="hash", budget=budget))
    session = home.open("s")
    for i in range(40):
        session.append("Ada", f"Note {i}: the sailing trip to Oslo on the ferry, invoice number {i * 7}, kayak and fjord.")
    return home, session


def test_many_tool_calls_whose_results_outgrow_the_budget_go_back_to_the_model_as_a_note(tmp_path):
    """A model calling `search` ten times at once with k=50: the results of that one exchange did not fit a
    2,048-token budget, and the turn failed ("the prompt no longer fits the budget … raise --budget") though
    the mistake was the model's. The largest results become a note the model can act on (a `tool_result_cut`
    event; the whole result stays in the trace), every prompt keeps to the budget, and the turn answers."""
    from pager.agent import Agent
    from pager.model import HandlerModel

    sent: list[list[dict]] = []
    calls = [{"id": f"c{i}", "function": {"name": "search", "arguments": json.dumps({"query": "sailing Oslo", "k": 50})}}
             for i in range(10)]

    def model(messages, tools):
        sent.append(messages)
        return {"tool_calls": calls} if len(sent) == 1 else {"content": "You sailed to Oslo."}

    home, session = _session(tmp_path)
    try:
        kinds: list[str] = []
        session.events.listeners.append(lambda e: kinds.append(e.kind))
        requests: list[int] = []
        session.events.listeners.append(lambda e: requests.append(e.data["tokens"]["total"])
                                        if e.kind == "model_request" else None)
        reply = Agent(session, HandlerModel(model, name="scripted")).ask("Where did I sail?")
        assert reply.error == "" and reply.text == "You sailed to Oslo."
        assert "tool_result_cut" in kinds and max(requests) <= 2048
        notes = [m["content"] for m in sent[1] if m["role"] == "tool" and "did not fit the prompt" in m["content"]]
        assert notes and "call search again on its own" in notes[0]
    finally:
        home.close()


def test_a_reply_repeating_pagers_prompt_is_answered_and_stored_without_it(tmp_path):
    """A model that repeats its system prompt, memory map and tool results before its answer: the whole
    echo reached the user as the answer and was stored as the reply, so later prompts held a page with a
    second, stale "## Memory map" and pager's instructions as conversation. Those lines are left out of the
    answer and the stored turn (a `reply_unechoed` event; `model_reply` keeps the whole text); a reply that
    quotes a turn keeps it."""
    from pager.agent import Agent
    from pager.model import HandlerModel

    def model(messages, tools):
        if not any(m["role"] == "tool" for m in messages):
            return {"tool_calls": [{"id": "c1", "function": {"name": "search", "arguments": '{"query": "sailing"}'}}]}
        echo = "\n".join(m["content"] for m in messages if m["role"] in ("system", "tool"))
        return {"content": echo + "\n\nYou like sailing.\nuser: Note 3: the sailing trip to Oslo on the ferry, "
                           "invoice number 21, kayak and fjord."}

    home, session = _session(tmp_path)
    try:
        replies: list[str] = []
        session.events.listeners.append(lambda e: replies.append(e.data["text"]) if e.kind == "model_reply" else None)
        reply = Agent(session, HandlerModel(model, name="scripted")).ask("What do I like?")
        assert reply.text.startswith("You like sailing.") and "Note 3: the sailing trip" in reply.text
        assert "Memory map" not in reply.text and "paged memory" not in reply.text and reply.unechoed > 10
        assert "## Memory map" in replies[-1]   # the trace keeps what the model sent
    finally:
        home.close()
    assert _texts(tmp_path / "h", "s")[-1] == reply.text


def _texts(home: Path, session: str) -> list[str]:
    exported = runner.invoke(app, ["--home", str(home), "export", "--session", session], env={"PAGER_EMBEDDER": "hash"})
    assert exported.exit_code == 0, exported.output
    return [json.loads(line)["text"] for line in exported.output.splitlines()]


def test_the_readme_agent_loop_survives_a_reply_with_no_text(tmp_path, fake, monkeypatch):
    """The README's litellm loop called `memory.remember(reply.content, role="assistant")`, and a reply with
    `content: null` and no tool calls (or an empty one) raised ToolError out of the user's loop. The loop
    returns "" for it now and stores nothing for it."""
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## Tool bundle and MCP\n.*?```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.setenv("PAGER_HOME", str(tmp_path / "h"))
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    ask, memory = namespace["ask"], namespace["memory"]
    try:
        fake.script = [({"content": None}, "stop"), ({"content": ""}, "stop"), ({"content": "Hello, Ada."}, "stop")]
        assert ask("My name is Ada.", model="openai/fake") == ""
        assert ask("Are you there?", model="openai/fake") == ""
        assert ask("Hello?", model="openai/fake") == "Hello, Ada."
    finally:
        memory.close()
    assert _texts(tmp_path / "h", "my-agent") == ["My name is Ada.", "Are you there?", "Hello?", "Hello, Ada."]


def test_a_reply_quoting_two_lines_of_a_search_result_keeps_them(tmp_path):
    """A model answering with two lines of a search result, as found, is answering, not echoing pager's
    prompt: it keeps its quote (the answer was cut to its first line). Only the prompt, the memory map and
    page headers start a cut; a tool result's lines only lengthen one."""
    from pager.agent import Agent
    from pager.model import HandlerModel

    quoted: list[str] = []

    def model(messages, tools):
        results = [m["content"] for m in messages if m["role"] == "tool"]
        if not results:
            return {"tool_calls": [{"id": "c1", "function": {"name": "search", "arguments": '{"query": "sailing"}'}}]}
        quoted.extend(line for line in results[0].splitlines() if line.startswith("- p"))
        return {"content": "Here is what I found:\n" + "\n".join(quoted[:2])}

    home, session = _session(tmp_path)
    try:
        reply = Agent(session, HandlerModel(model, name="scripted")).ask("What did I say about sailing?")
    finally:
        home.close()
    assert len(quoted) >= 2, "the search result lists pages to quote"
    assert reply.unechoed == 0 and reply.text == "Here is what I found:\n" + "\n".join(quoted[:2])


def test_a_failing_provider_is_asked_once_per_try_of_pagers(fake):
    """litellm's OpenAI client retried each 500 twice on its own, under pager's tries: 2 tries were 6
    requests, 5 up to 15. pager's tries are the only ones now."""
    from pager.errors import ModelError
    from pager.llm import LiteLLMModel

    fake.script = [(None, None, 500)] * 3 + [({"content": "back"}, "stop")]
    model = LiteLLMModel("openai/fake", attempts=2, backoff=0, sleep=lambda s: None)
    with pytest.raises(ModelError, match="still failing after 2 tries"):
        model.complete([{"role": "user", "content": "hi"}], [])
    assert len(fake.bodies) == 2
    assert model.complete([{"role": "user", "content": "hi"}], []).text == "back"   # one 500, then the reply
    assert len(fake.bodies) == 4
