"""`pager serve` with clients nobody here wrote: the official openai client, the mcp SDK's
streamable HTTP client, curl. Each server runs in this process on a free loopback port and
is stopped after; the model is the offline memory shell or a scripted one, never a network."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import stat
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from pager.config import Config
from pager.engine import Engine
from pager.errors import ConfigError
from pager.keys import KeyRing
from pager.serve import Limits, Server, check_host

README = Path(__file__).resolve().parents[1] / "README.md"
SERVE_PAGE = Path(__file__).resolve().parents[1] / "docs" / "serve.md"


class Running:
    """A server on a free loopback port, in a thread; `stop` waits for it to close its home."""

    def __init__(self, home: Path, limits: Limits = Limits(), config: Config | None = None, **engine) -> None:
        import uvicorn

        self.config = config or Config(home=home, embedder="hash")
        self.keys = KeyRing(home)
        self.server = Server(Engine(self.config, **engine), self.keys, limits)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.uvicorn = uvicorn.Server(uvicorn.Config(self.server.app(), host="127.0.0.1", port=self.port,
                                                     log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)
        self.thread.start()
        while not self.uvicorn.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.port}"

    def http(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def openai(self, key: str = "unused"):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0)

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """No keys: the local user's namespace, loopback only."""
    running = Running(tmp_path_factory.mktemp("serve-open"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    """Two tenants with a key each."""
    home = tmp_path_factory.mktemp("serve-keyed")
    ring = KeyRing(home)
    _, key_a = ring.create("acme")
    _, key_b = ring.create("bravo")
    running = Running(home)
    running.key_a, running.key_b = key_a, key_b
    yield running
    running.stop()


def turns_of(running: Running, session: str, key: str | None = None) -> int:
    with running.http(key) as http:
        return http.get(f"/sessions/{session}").json()["turns"]


# -- the openai client -------------------------------------------------------------------------------
def test_openai_create_remembers_and_runs_the_memory_tools_server_side(open_server):
    client = open_server.openai()
    first = client.chat.completions.create(model="offline", user="kitchen",
                                           messages=[{"role": "user", "content": "My cat is called Miso."}])
    assert first.choices[0].message.role == "assistant"
    assert "in memory" in first.choices[0].message.content
    assert first.usage.prompt_tokens > 0
    asked = client.chat.completions.create(model="offline", user="kitchen", messages=[
        {"role": "user", "content": "What is my cat called?"}])
    assert "Miso" in asked.choices[0].message.content
    calls = asked.model_extra["pager"]["tool_calls"]
    assert calls and calls[0]["name"] == "search"   # the offline shell searched its memory, server-side
    assert asked.model_extra["pager"]["session"] == "kitchen"


def test_openai_stream_delivers_the_same_reply_in_chunks(open_server):
    client = open_server.openai()
    client.chat.completions.create(model="offline", user="stream",
                                   messages=[{"role": "user", "content": "The boiler code is 4417."}])
    stream = client.chat.completions.create(model="offline", user="stream", stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "What is the boiler code?"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "4417" in text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens > 0
    assert turns_of(open_server, "stream") == 4


WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def _weather_bot() -> list[dict]:
    """Register model pager/weather-bot: it searches pager's memory for the city (a memory tool, run by
    the server), then calls the client's `weather` tool, then answers from the tool's result."""
    from pager.llm import register

    seen: list[dict] = []

    def handler(messages, tools):
        seen.append({"tools": [t["function"]["name"] for t in tools], "messages": messages})
        results = [m for m in messages if m.get("role") == "tool"]
        if not results:
            return {"content": None, "tool_calls": [
                {"id": "call_s", "type": "function", "function": {"name": "search", "arguments": '{"query": "city"}'}}]}
        if not any(m.get("tool_call_id") == "call_w" for m in results):
            return {"content": None, "tool_calls": [
                {"id": "call_w", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lyon"}'}}]}
        weather = next(m["content"] for m in results if m.get("tool_call_id") == "call_w")
        return {"content": f"In Lyon it is {weather}."}

    register("weather-bot", handler)
    return seen


def test_client_tools_pass_through_and_memory_tools_stay_server_side(open_server):
    seen = _weather_bot()
    client = open_server.openai()
    client.chat.completions.create(model="offline", user="tools", messages=[{"role": "user", "content": "I live in Lyon."}])
    history = [{"role": "user", "content": "What is the weather where I live?"}]
    first = client.chat.completions.create(model="pager/weather-bot", user="tools", messages=history, tools=[WEATHER])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
        ("weather", {"city": "Lyon"})]   # pager's search ran on the server: the client sees only its own tool
    assert [c["name"] for c in first.model_extra["pager"]["tool_calls"]] == ["search"]
    assert {"weather", "search"} <= set(seen[0]["tools"])
    history += [choice.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "sunny, 24 C"}]
    second = client.chat.completions.create(model="pager/weather-bot", user="tools", messages=history, tools=[WEATHER])
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "In Lyon it is sunny, 24 C."
    assert second.model_extra["pager"]["appended"] == 1   # the reply; the question was kept by the first call
    with open_server.http() as http:
        turns = http.get("/sessions/tools/turns").json()["turns"]
    assert [t["content"] for t in turns[-2:]] == ["What is the weather where I live?", "In Lyon it is sunny, 24 C."]
    # streamed, the calls come as a delta with finish_reason tool_calls
    stream = client.chat.completions.create(model="pager/weather-bot", user="tools-stream", stream=True, tools=[WEATHER],
                                            messages=[{"role": "user", "content": "And the weather today?"}])
    chunks = list(stream)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "weather")]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_client_tools_are_checked(open_server):
    import openai

    clash = {"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as info:
        open_server.openai().chat.completions.create(model="offline", tools=[clash],
                                                     messages=[{"role": "user", "content": "hi"}])
    assert info.value.body["param"] == "tools[0]" and "rename" in info.value.body["message"]
    with open_server.http() as http:
        unanswered = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]}]
        r = http.post("/v1/chat/completions", json={"model": "offline", "tools": [WEATHER], "messages": unanswered})
        assert r.status_code == 400 and "c1" in r.json()["error"]["message"]


@pytest.mark.parametrize("tools", [False, True], ids=["no tools of its own", "tools of its own"])
def test_tool_choice_is_auto_or_none_as_the_serve_page_says(tools):
    """docs/serve.md: "`tool_choice` may be `auto` or `none`". Without tools of the client's own, any
    other value was taken silently; with them, the refusal said only 'auto' was supported."""
    from pager.proxy import RequestError, parse

    mine = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]
    body = {"model": "offline", "messages": [{"role": "user", "content": "hi"}], **({"tools": mine} if tools else {})}
    for choice in ("auto", "none"):
        parse({**body, "tool_choice": choice}, None, "default", 2048)
    for choice in ("required", {"type": "function", "function": {"name": "weather"}}):
        with pytest.raises(RequestError) as refused:
            parse({**body, "tool_choice": choice}, None, "default", 2048)
        assert refused.value.param == "tool_choice" and "'auto' or 'none'" in str(refused.value)


def counting_model(name: str) -> list[int]:
    """Register model pager/NAME answering "answer number N" for its N-th call; the list of its calls."""
    from pager.llm import register

    calls: list[int] = []

    def counting(messages, tools):
        calls.append(1)
        return {"content": f"answer number {len(calls)}"}

    register(name, counting)
    return calls


def test_a_retried_question_gets_the_recorded_reply_without_the_model(open_server):
    """A client that lost a reply and sends the same conversation again gets the reply pager recorded:
    the model is not called again and nothing is stored twice."""
    calls = counting_model("counting")
    client = open_server.openai()
    history = [{"role": "user", "content": "Pick a number."}]
    first = client.chat.completions.create(model="pager/counting", user="retry", messages=history)
    again = client.chat.completions.create(model="pager/counting", user="retry", messages=history)
    assert again.choices[0].message.content == first.choices[0].message.content == "answer number 1"
    assert len(calls) == 1 and again.model_extra["pager"]["recorded"] is True
    assert again.model_extra["pager"]["appended"] == 0 and turns_of(open_server, "retry") == 2
    # the same words later in the conversation are a new question (its key chains over the reply)
    history += [{"role": "assistant", "content": "answer number 1"}, {"role": "user", "content": "Pick a number."}]
    third = client.chat.completions.create(model="pager/counting", user="retry", messages=history)
    assert third.choices[0].message.content == "answer number 2" and turns_of(open_server, "retry") == 4


def test_a_client_sending_only_its_newest_message_asks_again_after_memory_changed(open_server):
    """A client that lets pager keep the conversation sends each message alone. The same question
    asked after the answer changed is a new question (the offline shell quotes the new page), kept as
    a turn; sent again right after its reply (a lost reply), it is the recorded one."""
    counting_model("counting-alone")
    client = open_server.openai()

    def ask(text, model="offline"):
        return client.chat.completions.create(model=model, user="alone", messages=[{"role": "user", "content": text}])

    ask("Where is the offsite?")
    ask("The offsite is in Porto.")
    again = ask("Where is the offsite?")
    assert again.model_extra["pager"]["recorded"] is False and "Porto" in again.choices[0].message.content
    assert turns_of(open_server, "alone") == 6
    retry = ask("Where is the offsite?")   # right after its reply: the client lost it
    assert retry.model_extra["pager"]["recorded"] is True and retry.choices[0].message.content == again.choices[0].message.content
    assert turns_of(open_server, "alone") == 6
    first = ask("Pick a number.", "pager/counting-alone")
    ask("Something else.")
    later = ask("Pick a number.", "pager/counting-alone")
    assert (first.choices[0].message.content, later.choices[0].message.content) == ("answer number 1", "answer number 2")
    assert turns_of(open_server, "alone") == 12


def test_a_client_sending_a_window_of_its_newest_messages_stores_each_once(open_server):
    """The server's limit on messages asks a client to send the newest part of the conversation. Keyed
    from the window's first message, the window's messages were new keys: stored a second time."""
    client = open_server.openai()
    history: list[dict] = []
    for line in ["I live in Lyon.", "My sister is Ines.", "Where do I live?", "Who is my sister?"]:
        history.append({"role": "user", "content": line})
        window = history[-3:]
        reply = client.chat.completions.create(model="offline", user="window", messages=window)
        assert reply.model_extra["pager"]["appended"] == 2, window   # the question and its reply, no more
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    assert turns_of(open_server, "window") == 8   # four questions, four replies: nothing twice
    with open_server.http() as http:
        texts = [t["content"] for t in http.get("/sessions/window/turns").json()["turns"]]
    assert texts == [m["content"] for m in history]
    retry = client.chat.completions.create(model="offline", user="window", messages=history[-4:-1])
    assert retry.model_extra["pager"]["recorded"] is True and turns_of(open_server, "window") == 8
    assert "Ines" in history[-1]["content"]


def test_a_question_whose_model_failed_is_answered_on_retry_and_kept_once(open_server):
    from pager.llm import register

    state = {"fail": True}

    def flaky(messages, tools):
        if state["fail"]:
            raise RuntimeError("provider down")
        return {"content": "back up"}

    register("flaky", flaky)
    body = {"model": "pager/flaky", "user": "flaky", "messages": [{"role": "user", "content": "Are you there?"}]}
    with open_server.http() as http:
        assert http.post("/v1/chat/completions", json=body).status_code == 502
        state["fail"] = False
        r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "back up"
    assert r.json()["pager"]["recorded"] is False and turns_of(open_server, "flaky") == 2


def test_models_lists_offline(open_server):
    assert "offline" in [m.id for m in open_server.openai().models.list()]


def test_resending_the_whole_history_does_not_duplicate_turns(open_server):
    client = open_server.openai()
    history: list[dict] = [{"role": "system", "content": "Be brief."}]
    for i, line in enumerate(["I live in Lyon.", "My sister is Ines.", "Where do I live?", "Who is my sister?"]):
        history.append({"role": "user", "content": line})
        reply = client.chat.completions.create(model="offline", messages=history,
                                               extra_headers={"X-Pager-Session": "resend"})
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
        assert reply.model_extra["pager"]["appended"] == 2, f"round {i} appended more than its question and reply"
    assert turns_of(open_server, "resend") == 8   # the system message is a prompt, not a turn
    assert "Lyon" in history[6]["content"] and "Ines" in history[8]["content"]
    edited = history[:3] + [{"role": "user", "content": "Actually I live in Nantes."}]
    client.chat.completions.create(model="offline", messages=edited, extra_headers={"X-Pager-Session": "resend"})
    assert turns_of(open_server, "resend") == 10  # an edited branch is new conversation: kept, after the rest


def test_a_used_key_with_other_words_is_a_400_naming_it(open_server):
    with open_server.http() as http:
        sent = {"messages": [{"role": "user", "content": "My locker is 12.", "key": "m1"}]}
        assert http.post("/sessions/keys/turns", json=sent).status_code == 201
        assert http.post("/sessions/keys/turns", json=sent).status_code == 201   # a retry
        reused = http.post("/sessions/keys/turns", json={"messages": [{"role": "user", "content": "Locker 40.", "key": "m1"}]})
        assert reused.status_code == 400 and reused.json()["error"]["code"] == "KeyReused"
        assert "a new message needs a new key" in reused.json()["error"]["message"]
    assert turns_of(open_server, "keys") == 1


def test_header_wins_over_user_field(open_server):
    client = open_server.openai()
    client.chat.completions.create(model="offline", user="by-user", extra_headers={"X-Pager-Session": "by-header"},
                                   messages=[{"role": "user", "content": "hello there"}])
    with open_server.http() as http:
        names = [r["session"] for r in http.get("/sessions").json()["data"]]
    assert "by-header" in names and "by-user" not in names


# -- failures: never a lost turn -------------------------------------------------------------------------
def test_a_failing_model_is_502_and_the_message_is_kept(open_server):
    from pager.llm import register

    def broken(messages, tools):
        raise RuntimeError("provider exploded")

    register("broken", broken)
    with open_server.http() as http:
        r = http.post("/v1/chat/completions", json={"model": "pager/broken", "user": "fails", "messages": [
            {"role": "user", "content": "Remember the gate code 9931."}]})
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "model_error"
        hits = http.get("/sessions/fails/search", params={"q": "gate code"}).json()["results"]
    assert turns_of(open_server, "fails") == 1
    assert "9931" in hits[0]["snippet"]


def test_a_model_name_no_provider_answers_to_is_404_and_stores_nothing(open_server):
    """A client's `"model": "nosuchmodel-xyz"` was a 502 "the model failed: … LLM Provider NOT provided",
    its message stored in a session; no call of that name can ever work: OpenAI's 404 model_not_found."""
    with open_server.http() as http:
        r = http.post("/v1/chat/completions", json={"model": "nosuchmodel-xyz", "user": "unroutable", "messages": [
            {"role": "user", "content": "hello"}]})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "model_not_found" and "provider/model" in r.json()["error"]["message"]
        assert http.get("/sessions/unroutable").status_code == 404


def test_a_message_over_the_budget_is_openais_context_length_exceeded_and_stores_nothing(open_server):
    """A message the budget cannot hold was a 400 with code "BudgetError" (a class name): OpenAI's clients
    know `context_length_exceeded`, and trim or split on it."""
    with open_server.http() as http:
        r = http.post("/v1/chat/completions", json={"model": "offline", "user": "too-long", "messages": [
            {"role": "user", "content": "lorem ipsum dolor " * 4000}]})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "context_length_exceeded"
        assert "raise --budget" in error["message"]
        assert http.get("/sessions/too-long").status_code == 404


def _blocked_model(name: str, answer: str) -> tuple[threading.Event, threading.Event]:
    """Register model pager/NAME, which says it was called and answers only once released."""
    from pager.llm import register

    release, called = threading.Event(), threading.Event()

    def handler(messages, tools):
        called.set()
        release.wait(30)
        return {"content": answer}

    register(name, handler)
    return release, called


def test_a_slow_model_is_504_and_its_reply_is_recorded_when_it_comes(open_server):
    release, called = _blocked_model("slow", "late but here")
    server = open_server.server
    server.limits = replace(server.limits, model_timeout=0.2)
    try:
        with open_server.http() as http:
            r = http.post("/v1/chat/completions", json={"model": "pager/slow", "user": "slow", "messages": [
                {"role": "user", "content": "Take your time."}]})
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
        assert called.wait(30)  # the turn goes on after the 504 (on a slow machine it may reach the model only now)
    finally:
        server.limits = replace(server.limits, model_timeout=120)
        release.set()
    # the turn holds the session's lock until the reply is recorded: the next request waits for it
    with open_server.http() as http:
        r = http.post("/sessions/slow/turns", json={"messages": [{"role": "user", "content": "after"}]})
    assert r.json()["turns"] == [3]


def test_limits_and_malformed_requests(tmp_path):
    running = Running(tmp_path, Limits(body_bytes=2048, messages=3))
    try:
        with running.http() as http:
            big = {"model": "offline", "messages": [{"role": "user", "content": "x" * 4096}]}
            r = http.post("/v1/chat/completions", json=big)
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
            chunked = http.post("/sessions/s/turns", content=iter([b'{"messages": [', b" " * 4096, b"]}"]))
            assert chunked.status_code == 413   # no Content-Length: counted as it arrives
            r = http.post("/v1/chat/completions", content=b'{"model": "offline", "messages": [',
                          headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
            many = {"model": "offline", "messages": [{"role": "user", "content": "hi"}] * 4}
            r = http.post("/v1/chat/completions", json=many)
            assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_messages"
            for bad in ({"messages": [{"role": "user", "content": "hi"}]},
                        {"model": "offline", "messages": [{"role": "assistant", "content": "hi"}]},
                        {"model": "offline", "messages": [{"role": "tool", "content": "hi"}]},
                        {"model": "offline", "messages": "hi"}, [1, 2]):
                r = http.post("/v1/chat/completions", json=bad)
                assert r.status_code == 400, bad
                assert set(r.json()["error"]) == {"message", "type", "param", "code"}
            assert http.get("/nowhere").json()["error"]["type"] == "not_found_error"
            assert http.get("/healthz").json() == {"status": "ok", "keys": False}
    finally:
        running.stop()


# -- tenants ---------------------------------------------------------------------------------------------
HOSTILE = ["secret", "secret ", "../secret", "..%2Fsecret", "secret' OR user = 'acme", "SECRET", "sécret",
           "*", "default"]


def test_missing_or_invalid_keys_get_401_and_learn_nothing(keyed):
    with keyed.http(keyed.key_a) as a:
        assert a.post("/sessions/secret/turns", json={"messages": [{"content": "acme's plan: merge in May"}]}).status_code == 201
    forged = keyed.key_a[:-4] + "AAAA"
    answers = set()
    for key in (None, "nonsense", forged, "pgr_000000000000_" + "x" * 43):
        with keyed.http(key) as http:
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/sessions"),
                                 ("GET", "/sessions/secret"), ("GET", "/sessions/absent"),
                                 ("GET", "/sessions/secret/search?q=plan"), ("POST", "/sessions/secret/turns"),
                                 ("GET", "/sessions/secret/turns"),
                                 ("POST", "/mcp")):
                r = http.request(method, path, json={"messages": [{"role": "user", "content": "hi"}], "model": "offline"})
                assert r.status_code == 401, (key, path)
                answers.add(r.text)
    assert len(answers) == 1   # the same answer whether the session exists or not
    assert keyed.http().get("/healthz").status_code == 200


def test_a_key_reaches_only_its_tenant(keyed):
    with keyed.http(keyed.key_a) as a:
        assert a.post("/sessions/secret/turns", json={"messages": [{"content": "acme's password is tulip77"}]}).status_code == 201
        before = a.get("/sessions/secret").json()["turns"]
    with keyed.http(keyed.key_b) as b:
        assert "secret" not in [r["session"] for r in b.get("/sessions").json()["data"]]
        for name in HOSTILE:
            assert b.get("/sessions/" + name).status_code in (404, 400), name
            r = b.get(f"/sessions/{name}/search", params={"q": "password"})
            assert r.status_code in (404, 400) and "tulip77" not in r.text
            r = b.get(f"/sessions/{name}/turns")
            assert r.status_code in (404, 400) and "tulip77" not in r.text
        # writing under the same name makes bravo's own session; acme's is untouched
        assert b.post("/sessions/secret/turns", json={"messages": [{"content": "bravo was here"}]}).status_code == 201
        r = b.get("/sessions/secret/search", params={"q": "acme password"})
        assert r.status_code == 200 and "tulip77" not in r.text
        for name in HOSTILE:
            if "/" in name:   # refused on /v1 as no REST route could reach it (test_hostile_session_names_…)
                import openai

                with pytest.raises(openai.BadRequestError):
                    keyed.openai(keyed.key_b).chat.completions.create(
                        model="offline", user=name, messages=[{"role": "user", "content": "What is the password?"}])
                continue
            reply = keyed.openai(keyed.key_b).chat.completions.create(
                model="offline", user=name, messages=[{"role": "user", "content": "What is the password?"}])
            assert "tulip77" not in reply.choices[0].message.content
            if name.isascii() and name == name.strip():  # a header value is trimmed ASCII
                reply = keyed.openai(keyed.key_b).chat.completions.create(
                    model="offline", extra_headers={"X-Pager-Session": name},
                    messages=[{"role": "user", "content": "Do you remember acme's password?"}])
                assert "tulip77" not in reply.choices[0].message.content
        for via_query in (False, True):
            _, _, found, memory = asyncio.run(_mcp(keyed.url, keyed.key_b, "secret", None, "acme password", via_query))
            assert "tulip77" not in found and "tulip77" not in memory
    with keyed.http(keyed.key_a) as a:
        assert a.get("/sessions/secret").json()["turns"] == before
        found = a.get("/sessions/secret/search", params={"q": "bravo was here"}).json()["results"]
        assert not any("bravo" in r["snippet"] for r in found)
        assert a.get("/sessions/secret").json().get("user") is None
        assert "tulip77" in a.get("/sessions/secret/turns").text


def test_hostile_session_names_are_refused_or_contained(keyed):
    with keyed.http(keyed.key_b) as b:
        for name in ("x" * 201, "tab\there", "nul\x00"):
            r = b.post("/v1/chat/completions", json={"model": "offline", "user": name,
                                                     "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 400, repr(name)
        r = b.post("/v1/chat/completions", headers={"X-Pager-Session": ""},
                   json={"model": "offline", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400
        # a "/" would make a session no REST route reaches (/sessions/{name} is one segment): refused, rule named
        for how in ({"headers": {"X-Pager-Session": "../../etc/passwd"}}, {"json_user": "org/team"}):
            body = {"model": "offline", "messages": [{"role": "user", "content": "hi"}]}
            if "json_user" in how:
                body["user"] = how["json_user"]
            r = b.post("/v1/chat/completions", headers=how.get("headers", {}), json=body)
            assert r.status_code == 400, how
            error = r.json()["error"]
            assert '"/"' in error["message"] and error["type"] == "invalid_request_error", error
        assert not any("/" in row["session"] for row in b.get("/sessions").json()["data"])
    home = keyed.config.home
    assert not any(p.name.startswith("..") for p in home.rglob("*"))   # names never become paths


def test_revoked_key_is_refused_by_the_running_server(keyed):
    record, key = keyed.keys.create("charlie")
    with keyed.http(key) as http:
        assert http.get("/sessions").status_code == 200
        KeyRing(keyed.config.home).revoke(record.id)   # as `pager keys revoke` does, from another process
        assert http.get("/sessions").status_code == 401


# -- MCP over streamable HTTP ----------------------------------------------------------------------------
async def _mcp(url: str, key: str, session: str, note: str | None, query: str, via_query: bool = False):
    """Through the mcp SDK's streamable HTTP client: (tool names, remember's answer, search's answer, memory map)."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    headers = ({"Authorization": f"Bearer {key}"} if key else {}) | ({} if via_query else {"X-Pager-Session": session})
    endpoint = f"{url}/mcp?{httpx.QueryParams({'session': session})}" if via_query else f"{url}/mcp"
    async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
        async with streamable_http_client(endpoint, http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as client:
                await client.initialize()
                tools = {t.name for t in (await client.list_tools()).tools}
                remembered = (await client.call_tool("remember", {"text": note})).content[0].text if note else ""
                found = (await client.call_tool("search", {"query": query})).content[0].text
                memory = (await client.read_resource("pager://memory-map")).contents[0].text
                return tools, remembered, found, memory


def test_mcp_over_http_lists_calls_and_reads_the_memory_map(keyed):
    def use(key: str, session: str, note: str):
        return asyncio.run(_mcp(keyed.url, key, session, note, "kayak canoe"))

    tools, remembered, found, memory = use(keyed.key_a, "boats", "acme owns a red kayak")
    assert {"search", "page_in", "page_out", "bookmark", "remember", "context"} <= tools
    assert "remembered as turn 1" in remembered
    assert "acme owns a red kayak" in found
    assert "frames" in memory
    _, remembered_b, found_b, _ = use(keyed.key_b, "boats", "bravo owns a blue canoe")
    assert "remembered as turn 1" in remembered_b   # its own session of that name
    assert "bravo owns a blue canoe" in found_b and "acme" not in found_b
    with keyed.http(keyed.key_a) as a:
        assert a.get("/sessions/boats").json()["turns"] == 1


# -- keys and hosts --------------------------------------------------------------------------------------
def test_keys_are_stored_hashed_in_a_private_file(tmp_path):
    ring = KeyRing(tmp_path)
    record, key = ring.create("acme")
    text = (tmp_path / "keys.json").read_text()
    assert key not in text and key.split("_", 2)[-1] not in text   # the secret may hold "_" itself
    assert stat.S_IMODE(os.stat(tmp_path / "keys.json").st_mode) == 0o600
    assert ring.verify(key) == "acme" and KeyRing(tmp_path).verify(key) == "acme"
    assert ring.verify(key + "x") is None and ring.verify("") is None
    assert [r.public()["tenant"] for r in ring.records()] == ["acme"]
    ring.revoke(record.id)
    assert ring.verify(key) is None


def test_no_keys_means_loopback_only(tmp_path):
    from typer.testing import CliRunner

    from pager.cli.app import app

    ring = KeyRing(tmp_path)
    check_host("127.0.0.1", ring)
    with pytest.raises(ConfigError, match="pager keys create --tenant"):
        check_host("0.0.0.0", ring)
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "serve", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "pager keys create" in result.output   # one line, no banner
    assert "pager serve on" not in result.output   # the banner only once the port is bound
    ring.create("acme")
    check_host("0.0.0.0", ring)


def test_a_revoked_last_key_is_refused_not_served_as_the_local_user(tmp_path):
    """`pager keys revoke` of the server's only key left it with no keys, and a client still sending the
    revoked key was then served as the local user: its `POST /sessions/secret/turns` answered 201 and stored
    the turn in the local user's namespace (a session acme never sees), where a revoked key must be a 401.
    A pager key sent to a server that has none is refused now, and nothing is stored."""
    key_id, key = KeyRing(tmp_path).create("acme")
    running = Running(tmp_path)
    try:
        with running.http(key) as http:
            said = {"messages": [{"role": "user", "content": "acme's secret"}]}
            assert http.post("/sessions/secret/turns", json=said).status_code == 201
            KeyRing(tmp_path).revoke(key_id.id)
            refused = http.post("/sessions/secret/turns", json={"messages": [{"content": "sent after the revoke"}]})
            assert refused.status_code == 401, refused.text
            assert refused.json()["error"]["code"] == "invalid_api_key" and "revoked" in refused.json()["error"]["message"]
        with running.http() as http:   # no key: the local user's sessions, which hold nothing
            assert http.get("/sessions").json()["data"] == []
    finally:
        running.stop()


def test_without_keys_a_peer_beyond_loopback_is_refused_whatever_its_host_header_says(tmp_path):
    """A server bound to 0.0.0.0 (allowed while it had keys) whose last key was revoked answered anyone on
    the network who sent `Host: 127.0.0.1`: the header is the client's to write. The peer's address is
    checked too now."""
    from starlette.requests import Request

    from pager.serve import RequestError, tenant_of

    def request(peer: str) -> Request:
        return Request({"type": "http", "method": "GET", "path": "/sessions", "headers": [(b"host", b"127.0.0.1:8765")],
                        "client": (peer, 40000)})

    keys = KeyRing(tmp_path)   # no keys file: no keys
    assert tenant_of(request("127.0.0.1"), keys, "") == ""
    assert tenant_of(request("::ffff:127.0.0.1"), keys, "") == ""
    for peer in ("192.0.2.7", "::ffff:192.0.2.7"):
        with pytest.raises(RequestError) as refused:
            tenant_of(request(peer), keys, "")
        assert refused.value.status == 403 and refused.value.code == "not_local"


# -- the documents' examples, run against a live server ---------------------------------------------------
def _serve_text() -> str:
    """The README's `pager serve` section and the whole of docs/serve.md, where its detail lives."""
    text = README.read_text()
    start = text.index("## `pager serve`")
    end = text.find("\n## ", start + 1)
    return text[start: end if end > 0 else len(text)] + "\n" + SERVE_PAGE.read_text()


def test_the_curl_examples_of_the_readme_and_the_serve_page_run(open_server):
    blocks = re.findall(r"```sh\n(.*?)```", _serve_text(), re.S)
    curls = [b for b in blocks if "curl" in b]
    assert len(curls) >= 2, "the README's Serve section and docs/serve.md each have a curl example"
    for block in curls:
        script = block.replace("http://127.0.0.1:8765", open_server.url)
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert '"chat.completion"' in out.stdout or '"session"' in out.stdout, out.stdout
        assert '"error"' not in out.stdout, out.stdout   # every command of the example worked


def test_the_openai_snippet_of_the_serve_page_runs(open_server):
    blocks = re.findall(r"```python\n(.*?)```", _serve_text(), re.S)
    snippet = next(b for b in blocks if "openai" in b)
    code = snippet.replace("http://127.0.0.1:8765", open_server.url)
    scope: dict = {}
    exec(compile(code, "docs/serve.md", "exec"), scope)   # noqa: S102 - our own docs, run as a user would
    assert "reply" in scope


# -- many clients at once ---------------------------------------------------------------------------------
def test_parallel_sessions_lose_nothing_and_keep_each_clients_order(open_server):
    """Four clients on their own sessions and three on one shared session, all at once, each resending
    its history: every question and reply stored once, each reply right after its question."""
    import openai

    def talk(session: str, me: int, turns: int, errors: list) -> None:
        client = openai.OpenAI(base_url=f"{open_server.url}/v1", api_key="x", max_retries=0)
        history: list[dict] = []
        try:
            for t in range(turns):
                history.append({"role": "user", "content": f"c{me} says number {t}"})
                reply = client.chat.completions.create(model="offline", messages=history,
                                                       extra_headers={"X-Pager-Session": session})
                history.append({"role": "assistant", "content": reply.choices[0].message.content})
        except Exception as exc:  # noqa: BLE001 - reported below with the client that failed
            errors.append(f"c{me}: {exc!r}")

    plan = [(f"par-{c}", c) for c in range(4)] + [("par-shared", 4 + c) for c in range(3)]
    errors: list[str] = []
    threads = [threading.Thread(target=talk, args=(session, me, 5, errors)) for session, me in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    with open_server.http() as http:
        for session in {s for s, _ in plan}:
            turns = http.get(f"/sessions/{session}/turns", params={"limit": 1000}).json()["turns"]
            assert [t["turn"] for t in turns] == list(range(1, len(turns) + 1))
            for me in (m for s, m in plan if s == session):
                mine = [i for i, t in enumerate(turns) if t["role"] == "user" and t["content"].startswith(f"c{me} ")]
                assert [turns[i]["content"] for i in mine] == [f"c{me} says number {t}" for t in range(5)], session
                assert all(turns[i + 1]["role"] == "assistant" for i in mine), session
            owners = sum(1 for s, _ in plan if s == session)
            assert len(turns) == owners * 10, session


def test_each_request_is_logged_with_session_tokens_faults_and_latency(open_server, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="pager.serve")
    open_server.openai().chat.completions.create(model="offline", user="logged",
                                                 messages=[{"role": "user", "content": "log this turn"}])
    line = next(r.getMessage() for r in caplog.records if "session=logged" in r.getMessage())
    assert re.search(r"POST /v1/chat/completions 200 session=logged tokens=\d+ faulted=\d+ latency_ms=[\d.]+", line)


def test_without_keys_only_requests_addressed_to_loopback_are_served(open_server):
    """A web page on another origin (or reaching the port through DNS rebinding) gets nothing."""
    with open_server.http() as http:
        assert http.get("/sessions").status_code == 200
        assert http.get("/sessions", headers={"Host": "evil.example:8765"}).status_code == 403
        r = http.post("/v1/chat/completions", headers={"Origin": "https://evil.example", "Content-Type": "text/plain"},
                      content=json.dumps({"model": "offline", "messages": [{"role": "user", "content": "x"}]}))
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_local"
        assert http.post("/mcp", headers={"Origin": "https://evil.example"}, json={}).status_code == 403


def test_a_slow_streamed_turn_keeps_the_stream_alive_and_ends_in_the_error_shape(open_server, monkeypatch):
    from pager import serve

    release, _ = _blocked_model("slow-stream", "late")
    monkeypatch.setattr(serve, "KEEPALIVE_S", 0.05)
    server = open_server.server
    server.limits = replace(server.limits, model_timeout=0.5)
    try:
        with open_server.http() as http:
            with http.stream("POST", "/v1/chat/completions", json={"model": "pager/slow-stream", "stream": True,
                             "user": "slow-stream", "messages": [{"role": "user", "content": "stream slowly"}]}) as r:
                lines = [line for line in r.iter_lines() if line]
    finally:
        server.limits = replace(server.limits, model_timeout=120)
        release.set()
    assert lines[0].startswith("data: ") and '"role": "assistant"' in lines[0]
    assert ": waiting for the model" in lines
    assert json.loads(lines[-1][len("data: "):])["error"]["code"] == "model_timeout"


def test_keys_created_at_once_are_all_kept(tmp_path):
    made: list[str] = []

    def create(i: int) -> None:
        made.append(KeyRing(tmp_path).create(f"t{i}")[1])

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ring = KeyRing(tmp_path)
    assert len(ring.records()) == 8 and all(ring.verify(key) for key in made)


def test_the_event_loop_stays_free_while_the_engine_works_and_other_sessions_proceed_during_a_model_call(open_server):
    engine = open_server.server.engine
    with engine.lock:   # as if a long LanceDB write held the engine: the loop still answers
        with open_server.http() as http:
            assert http.get("/healthz", timeout=10).status_code == 200
    release, called = _blocked_model("thinking", "done thinking")
    results: dict = {}

    def slow_turn():
        with open_server.http() as http:
            results["slow"] = http.post("/v1/chat/completions", json={"model": "pager/thinking", "user": "thinker",
                                        "messages": [{"role": "user", "content": "think hard"}]})

    worker = threading.Thread(target=slow_turn)
    worker.start()
    try:
        assert called.wait(30)
        # the model holds its session's lock but not the engine: another session's turn completes meanwhile
        reply = open_server.openai().chat.completions.create(model="offline", user="not-waiting",
                                                             messages=[{"role": "user", "content": "quick one"}])
        assert reply.choices[0].message.content and not release.is_set()
    finally:
        release.set()
        worker.join(30)
    assert results["slow"].json()["choices"][0]["message"]["content"] == "done thinking"


# -- traces, idle sessions ---------------------------------------------------------------------------------
def _replays(path: Path) -> None:
    from typer.testing import CliRunner

    from pager.cli.app import app

    result = CliRunner().invoke(app, ["replay", str(path), "--check"])
    assert result.exit_code == 0, f"{path.name}: {result.output}"
    assert result.output.startswith("ok:")


def _traces(home: Path, session: str) -> list[Path]:
    return sorted(p for p in (home / "traces").glob(f"{session}-serve-*.jsonl"))


def test_a_served_conversation_is_traced_and_replays_exactly(tmp_path):
    """Everything a session gets over HTTP (chat turns with a system prompt and resent history, a retry,
    client tools, REST appends and state, MCP tool calls) is in its trace, and `pager replay --check`
    reproduces every event of it."""
    _weather_bot()
    running = Running(tmp_path)
    try:
        client = running.openai()
        history: list[dict] = [{"role": "system", "content": "Answer in one line."}]
        for line in ["I keep my bike in the blue shed.", "The shed code is 4471.", "Where is my bike?",
                     "What is the shed code?"]:
            history.append({"role": "user", "content": line})
            reply = client.chat.completions.create(model="offline", messages=history,
                                                   extra_headers={"X-Pager-Session": "traced"})
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
        client.chat.completions.create(model="offline", messages=history[:-1], extra_headers={"X-Pager-Session": "traced"})
        with running.http() as http:
            assert http.post("/sessions/traced/turns", json={"messages": [{"content": "a note from a script"}]}).status_code == 201
            assert http.put("/sessions/traced/state/home city", json={"value": "Lyon"}).status_code == 200
        asyncio.run(_mcp(running.url, "", "traced", "remember this over mcp", "bike"))
        asked = [{"role": "user", "content": "Weather at the shed?"}]
        first = client.chat.completions.create(model="pager/weather-bot", user="traced", messages=asked, tools=[WEATHER])
        asked += [first.choices[0].message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": "call_w", "content": "rain"}]
        client.chat.completions.create(model="pager/weather-bot", user="traced", messages=asked, tools=[WEATHER])
        client.chat.completions.create(model="offline", user="traced", messages=[{"role": "user", "content": "Where is my bike?"}])
    finally:
        running.stop()
    traces = _traces(tmp_path, "traced")
    assert len(traces) == 1
    kinds = [json.loads(line)["kind"] for line in traces[0].read_text().splitlines()]
    assert {"session_start", "user", "model_request", "append", "external_call", "state", "client_calls",
            "session_end"} <= set(kinds)
    _replays(traces[0])


def test_a_served_turn_the_provider_failed_replays_exactly(tmp_path):
    """A 502 that outlasts the retries answers 502 and is in the trace as a model_error; a prompt over
    the window is asked again at a smaller budget, for that message only (each message has an agent
    of its own). Replay serves each failure again as that failure, in order with the replies."""
    import openai

    from pager.llm import litellm, register
    from pager.offline import Script

    lib = litellm()
    bad = lib.BadGatewayError(message="502 Bad Gateway", llm_provider="pager", model="pager/flaky")
    over = lib.ContextWindowExceededError(message="too long", llm_provider="pager", model="pager/flaky")
    # six overflows cut the budget to 8192 * 0.75**6 = 1458 tokens: the compact prompt and tools
    register("flaky", Script([bad, bad, *[over] * 6, {"content": "shorter"}, {"content": "back again"}]))
    running = Running(tmp_path)
    try:
        client = running.openai()
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model="pager/flaky", user="down", messages=[{"role": "user", "content": "hi?"}])
        assert failed.value.status_code == 502
        for question, answer in (("and now?", "shorter"), ("and again?", "back again")):
            reply = client.chat.completions.create(model="pager/flaky", user="down",
                                                   messages=[{"role": "user", "content": question}])
            assert reply.choices[0].message.content == answer
    finally:
        running.stop()
    traces = _traces(tmp_path, "down")
    events = [json.loads(line) for line in traces[0].read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert len(traces) == 1 and kinds.count("model_error") == 1 and kinds.count("overflow") == 6
    requests = [e["tokens"]["total"] for e in events if e["kind"] == "model_request"]
    assert requests[-1] > requests[-2] + 300, "the message after the overflows has the full prompt and tools again"
    _replays(traces[0])


def test_sessions_beyond_max_open_are_closed_and_reopen_with_nothing_lost(tmp_path):
    running = Running(tmp_path, max_open=2)
    try:
        client = running.openai()
        engine = running.server.engine
        for i in range(6):
            client.chat.completions.create(model="offline", user=f"many-{i}", messages=[
                {"role": "user", "content": f"My locker number is {100 + i}."}])
            assert len(engine.home.sessions) <= 2
        assert engine.closed == 4 and ("", "many-0") not in engine.home.sessions
        assert not engine._locks and len(engine.home.locks.mutexes) <= 2   # nothing kept per session seen
        reply = client.chat.completions.create(model="offline", user="many-0", messages=[
            {"role": "user", "content": "What is my locker number?"}])
        assert "100" in reply.choices[0].message.content
        assert reply.model_extra["pager"]["turns"] == 4   # the two turns before the close are still there
    finally:
        running.stop()
    # each time many-0 was open it left a trace, and each replays
    traces = _traces(tmp_path, "many-0")
    assert len(traces) == 2
    for path in traces:
        _replays(path)


def test_an_idle_session_is_closed_when_its_time_is_up(tmp_path):
    now = [1000.0]
    running = Running(tmp_path, idle_s=60, clock=lambda: now[0])
    try:
        engine = running.server.engine
        client = running.openai()
        client.chat.completions.create(model="offline", user="idle", messages=[{"role": "user", "content": "The gate code is 2718."}])
        now[0] += 59
        with running.http() as http:
            http.get("/sessions")          # any request looks for idle sessions
        assert ("", "idle") in engine.home.sessions
        now[0] += 1
        with running.http() as http:
            assert "idle" in [r["session"] for r in http.get("/sessions").json()["data"]]
        assert ("", "idle") not in engine.home.sessions and engine.closed == 1
        reply = client.chat.completions.create(model="offline", user="idle", messages=[
            {"role": "user", "content": "What is the gate code?"}])
        assert "2718" in reply.choices[0].message.content and reply.model_extra["pager"]["turns"] == 4
    finally:
        running.stop()


# -- the memory tiers over REST ------------------------------------------------------------------------------
def test_rest_search_marks_each_hit_kind_with_the_tiers_and_refuses_a_bad_k(open_server):
    with open_server.http() as http:
        http.post("/sessions/kinds/turns", json={"messages": [{"role": "user", "content": "the locker is by the gym"}]})
        assert http.put("/sessions/kinds/state/locker code", json={"value": "3141"}).status_code == 200
        body = http.get("/sessions/kinds/search", params={"q": "locker"}).json()
        assert body["results"] and {r["kind"] for r in body["results"]} == {"page"}, body
        assert any(t["kind"] == "state" and t["key"] == "locker code" and t["text"] == "3141" for t in body["tiers"])
        for k in ("-5", "0", "100000", "two", "1.5", "²", "①", "9" * 5000):   # "²" and "①" were 500s
            r = http.get("/sessions/kinds/search", params={"q": "locker", "k": k})
            assert r.status_code == 400, k
            assert r.json()["error"]["param"] == "k" and "whole number" in r.json()["error"]["message"]


def test_a_session_holding_only_a_working_state_is_listed_and_read_alike(keyed):
    """A state set through the library before any turn: GET /sessions listed the session (0 turns) while
    GET /sessions/{name}/state answered 404 "no session"; both now see it, and only for its tenant."""
    engine = keyed.server.engine
    engine.call(lambda: engine.open("acme", "prefs").set_state("diet", "vegetarian"), tenant="acme", name="prefs")
    with keyed.http(keyed.key_a) as a, keyed.http(keyed.key_b) as b:
        listed = {r["session"]: r["turns"] for r in a.get("/sessions").json()["data"]}
        assert listed.get("prefs") == 0, listed
        r = a.get("/sessions/prefs/state")
        assert r.status_code == 200 and r.json()["state"]["diet"]["value"] == "vegetarian", r.text
        assert b.get("/sessions/prefs/state").status_code == 404


def test_state_facts_and_summaries_over_rest_reach_only_their_tenant(keyed):
    from pager.facts import Draft

    with keyed.http(keyed.key_a) as a:
        assert a.post("/sessions/tiers/turns", json={"messages": [{"content": "I moved to Porto in May."}]}).status_code == 201
        r = a.put("/sessions/tiers/state/Home City", json={"value": "Porto"})
        assert r.status_code == 200 and r.json()["state"]["home city"]["value"] == "Porto"
        a.put("/sessions/tiers/state/home city", json={"value": "Braga"})
        state = a.get("/sessions/tiers/state").json()
        assert state["object"] == "state" and state["state"]["home city"]["value"] == "Braga"
        history = a.get("/sessions/tiers/state", params={"key": "home city"}).json()["history"]
        assert [h["value"] for h in history] == ["Porto", "Braga"]
        assert a.delete("/sessions/tiers/state/home city").status_code == 200
        assert a.get("/sessions/tiers/state").json()["state"] == {}
        r = a.delete("/sessions/tiers/state/home city")
        assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = a.put("/sessions/tiers/state/city", json={"value": 3})
        assert r.status_code == 400 and "must be a string" in r.json()["error"]["message"], r.text
        assert a.put("/sessions/tiers/state/city", json={"value": "x" * 500}).status_code == 400
        for path, body, param in (("city", {"value": "Lis\u0000bon"}, "value"), ("ci%00ty", {"value": "Lisbon"}, "key")):
            r = a.put(f"/sessions/tiers/state/{path}", json=body)   # named as the field it is in, not always "key"
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
            assert "NUL" in r.json()["error"]["message"] and "state_set" not in r.json()["error"]["message"], r.text
        assert a.get("/sessions/tiers/state").json()["state"] == {}
        engine = keyed.server.engine
        engine.call(lambda: engine.open("acme", "tiers").add_facts(
            [Draft("residence", "The user lives in Porto.", (1,))], "script"), tenant="acme", name="tiers")
        facts = a.get("/sessions/tiers/facts").json()
        assert facts["object"] == "facts" and [f["text"] for f in facts["facts"]] == ["The user lives in Porto."]
        assert a.get("/sessions/tiers/facts", params={"q": "Porto"}).json()["total"] == 1
        assert a.get("/sessions/tiers/facts", params={"q": "bicycle"}).json()["total"] == 0
        from pager.summaries import Draft as SummaryDraft

        for text in ("The user moved to Porto.", "The user moved to Porto, then to Braga."):
            engine.call(lambda text=text: engine.open("acme", "tiers").add_summaries(
                [SummaryDraft("rolling", "rolling", text, (1, 1))], "script"), tenant="acme", name="tiers")
        summaries = a.get("/sessions/tiers/summaries").json()
        assert summaries["object"] == "summaries" and summaries["total"] == 2
        assert [x["text"] for x in a.get("/sessions/tiers/summaries", params={"current": 1}).json()["summaries"]] == [
            "The user moved to Porto, then to Braga."]
        r = a.get("/sessions/tiers/nothing")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    with keyed.http(keyed.key_b) as b:
        for path in ("/sessions/tiers/state", "/sessions/tiers/facts", "/sessions/tiers/summaries",
                     "/sessions/tiers/state?key=home+city"):
            r = b.get(path)
            assert r.status_code == 404 and "Porto" not in r.text, path
        assert b.delete("/sessions/tiers/state/city").status_code == 404
        assert b.put("/sessions/tiers/state/city", json={"value": "Oslo"}).status_code == 404   # bravo has no such session
        assert b.post("/sessions/tiers/turns", json={"messages": [{"content": "hello"}]}).status_code == 201
        assert b.put("/sessions/tiers/state/city", json={"value": "Oslo"}).status_code == 200   # bravo's own session
    with keyed.http(keyed.key_a) as a:
        assert a.get("/sessions/tiers/state").json()["state"] == {}
    with keyed.http("pgr_000000000000_" + "x" * 43) as nobody:
        for method, path in (("GET", "/sessions/tiers/state"), ("GET", "/sessions/tiers/facts"),
                             ("GET", "/sessions/tiers/summaries"),
                             ("PUT", "/sessions/tiers/state/city"), ("DELETE", "/sessions/tiers/state/city")):
            assert nobody.request(method, path, json={"value": "x"}).status_code == 401


def test_a_chat_call_makes_its_messages_and_reply_durable_with_one_fsync(open_server, monkeypatch):
    """The question is written before the model is called and the reply after it; both are acknowledged
    by the response, so one fsync after the reply covers them (and any new earlier messages)."""
    journal = open_server.server.engine.home.journal
    synced: list[int] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    history = [{"role": "user", "content": "One fsync, please."}, {"role": "assistant", "content": "Noted."},
               {"role": "user", "content": "And the reply too."}]
    reply = open_server.openai().chat.completions.create(model="offline", user="one-fsync", messages=history)
    assert reply.model_extra["pager"]["appended"] == 4
    assert synced.count(journal._fd) == 1


def test_a_deferred_frame_is_in_the_segment_before_its_fsync(tmp_path):
    """Inside `deferred` a frame reaches the file at once (a crash of the process loses nothing); the
    fsync comes at the end of the block."""
    from pager.journal import Journal, read_segment

    journal = Journal(tmp_path)
    synced: list[int] = []
    real = os.fsync
    try:
        os.fsync = lambda fd: (synced.append(fd), real(fd))[1]
        with journal.deferred():
            journal.append([{"op": "turn", "user": "", "session": "s", "turn": 1, "speaker": "u", "text": "hi",
                             "role": "user", "date": "", "ts": 0.0, "ref": "", "key": ""}])
            assert [op["text"] for op in read_segment(journal.path, 0).ops] == ["hi"] and not synced
        assert synced == [journal._fd]
    finally:
        os.fsync = real
        journal.close(remove=True)
