"""What `pager serve` checks before it stores or serves: a field of the wrong type, a lone surrogate,
JSON nested too deep, a turn key that is no short string, a `stream` that is no boolean, the state of a
session with no turns, a model it has no key for (each a 4xx naming what to change, nothing stored); at
start, limits that would refuse every request and a home it cannot open; and it listens before it says
it serves."""

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.embed import HashEmbedder
from pager.fsck import check
from pager.home import Home


def test_stream_must_be_a_boolean(tmp_path):
    """`"stream": "yes"` was taken as true; OpenAI answers 400 naming the field."""
    from test_serve import Running

    running = Running(tmp_path)
    try:
        with running.http() as http:
            for value in ("yes", 1, "false", {}):
                r = http.post("/v1/chat/completions", json={"model": "offline", "stream": value, "user": "s",
                                                            "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 400, r.text
                error = r.json()["error"]
                assert error["type"] == "invalid_request_error" and error["param"] == "stream"
                assert "true or false" in error["message"]
            assert http.get("/sessions").json()["data"] == []   # nothing stored
            ok = http.post("/v1/chat/completions", json={"model": "offline", "stream": False, "user": "s",
                                                         "messages": [{"role": "user", "content": "hi"}]})
            assert ok.status_code == 200
    finally:
        running.stop()


@pytest.mark.parametrize("field, value", [("date", 3), ("date", ["8 May 2023"]), ("role", 1)])
def test_a_turn_posted_with_a_field_of_the_wrong_type_is_refused_not_acknowledged_and_lost(tmp_path, field, value):
    """`POST /sessions/s/turns` with `"date": 3` answered 201 with its turn number; the journal frame
    held an int date, so every flush of the server's home failed from then on (a 500 for any request
    that flushes, every session's turns kept from the store), and at the next start recovery skipped
    the record as damaged: an acknowledged turn lost, a gap in the numbers. Refused now with 400
    naming the field, before anything is written; the server goes on storing."""
    from test_serve import Running

    running = Running(tmp_path)
    try:
        with running.http() as http:
            assert http.post("/sessions/s/turns", json={"messages": [{"content": "before"}]}).status_code == 201
            bad = {"content": "the wrong type", "role": "user", field: value}
            refused = http.post("/sessions/s/turns", json={"messages": [bad]})
            assert refused.status_code == 400 and field in refused.json()["error"]["message"], refused.text
            assert http.post("/sessions/s/turns", json={"messages": [{"content": "after"}]}).json()["turns"] == [2]
            listed = http.get("/sessions/s/turns")
            assert listed.status_code == 200, listed.text
            assert [t["content"] for t in listed.json()["turns"]] == ["before", "after"]
    finally:
        running.stop()
    with Home(running.config, embedder=HashEmbedder()) as home:   # the next start: nothing skipped, no gap
        report = check(home, "", "s")
        assert report.ok and report.turns == 2, report.problems


def test_a_lone_surrogate_or_json_nested_too_deep_is_a_400_not_a_500(tmp_path):
    """JSON may spell a lone surrogate ("\\ud800") that no UTF-8 file can hold: `POST /sessions/s/turns`
    and the chat completions answered 500 (the journal frame, or the conversation's key, could not be
    encoded), as did a 200 KB body of nested arrays (json's RecursionError). Each is a 400 saying what
    to change; nothing is stored and the session goes on."""
    from test_serve import Running

    running = Running(tmp_path)
    lone = '"lone \\ud800 surrogate"'
    chat = '{"model": "offline", "messages": [{"role": "user", "content": %s}]}'
    try:
        with running.http() as http:
            sent = [http.post("/sessions/s/turns", content='{"messages": [{"role": "user", "content": %s}]}' % lone),
                    http.post("/sessions/s/turns", content='{"messages": [{"content": "x", "speaker": %s}]}' % lone),
                    http.post("/v1/chat/completions", content=chat % lone, headers={"X-Pager-Session": "s"}),
                    http.post("/v1/chat/completions", content='{"model": "offline", "messages": %s}' % ("[" * 50_000 + "]" * 50_000)),
                    http.post("/sessions/s/turns", content='{"messages": %s}' % ("[" * 50_000 + "]" * 50_000))]
            for answer in sent:
                assert answer.status_code == 400, answer.text
                assert "surrogate" in answer.text or "nested" in answer.text, answer.text
            assert http.post("/sessions/s/turns", json={"messages": [{"content": "after"}]}).json()["turns"] == [1]
    finally:
        running.stop()


@pytest.mark.parametrize("flag, value", [("--max-body", "0"), ("--max-body", "-1"), ("--max-messages", "0"),
                                         ("--max-messages", "-5"), ("--timeout", "0"), ("--timeout", "-1"),
                                         ("--timeout", "nan"), ("--idle", "nan"), ("--max-append-chars", "0")])
def test_serve_limits_that_would_refuse_every_request_are_refused_at_start(tmp_path, monkeypatch, flag, value):
    """`pager serve --max-body 0` (or -1) died with a traceback from the MCP library; --max-messages 0
    served, then refused every chat request, --timeout 0 answered every turn 504. Each is one line at
    start naming the flag, and nothing listens."""
    import pager.serve

    def listens(*args, **kwargs):
        raise AssertionError("pager serve started")

    monkeypatch.setattr(pager.serve, "serve", listens)   # were the limits taken, the test ends here, not serving
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "serve", "--port", "0", flag, value],
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit) and flag in result.output, (result.output, result.exception)


def test_serve_takes_connections_once_it_says_it_serves():
    """`pager serve` printed "pager serve on http://…" when its port was bound but not listening; a
    script that waited for that line and connected was refused (ECONNREFUSED, 3 of 3 tries here) for
    the second or so the home took to open. The socket listens before the line: a client connecting
    then waits in the backlog."""
    import socket

    from pager.serve import listen

    sock = listen("127.0.0.1", 0)
    try:
        with socket.create_connection(sock.getsockname(), timeout=30):
            pass
    finally:
        sock.close()


def test_serve_on_a_home_it_cannot_open_never_claims_to_serve(tmp_path):
    """`pager serve` on a read-only home said "pager serve on http://…" and then failed to open the
    home: a script waiting for that line connected to a server about to exit. The home opens first."""
    (tmp_path / "file").write_text("not a folder")
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "file" / "home"), "serve", "--port", "0"],
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 1 and "pager home" in result.output, result.output
    assert "pager serve on" not in result.output


def test_a_turn_key_that_is_not_a_short_string_is_refused_not_ignored_or_cut(tmp_path):
    """`POST /sessions/s/turns` ignored a key that was not a string (`"key": 5`, an id straight from a
    database) and cut a longer one to 128 characters: the retry of the first was stored twice, and of
    two messages whose keys shared their first 128 characters the second was answered with the first's
    turn and never stored. A key is what `pager ingest` takes: a non-empty string of at most 200
    characters; anything else is a 400 and nothing is stored."""
    from test_serve import Running

    running = Running(tmp_path)
    long = "conversation-" + "7" * 120
    try:
        with running.http() as http:
            for key in (5, "", long + "-a" + "x" * 70):
                refused = http.post("/sessions/s/turns", json={"messages": [{"content": "keyed", "key": key}]})
                assert refused.status_code == 400 and "key" in refused.json()["error"]["message"], refused.text
            first = http.post("/sessions/s/turns", json={"messages": [{"content": "one", "key": long + "-1"}]})
            second = http.post("/sessions/s/turns", json={"messages": [{"content": "two", "key": long + "-2"}]})
            assert (first.json()["turns"], second.json()["turns"]) == ([1], [2]), (first.text, second.text)
            again = http.post("/sessions/s/turns", json={"messages": [{"content": "two", "key": long + "-2"}]})
            assert again.json()["turns"] == [2] and again.json()["total_turns"] == 2, again.text
    finally:
        running.stop()


def test_a_model_the_server_has_no_key_for_is_refused_naming_the_key(tmp_path, monkeypatch):
    """`"model": "openai/gpt-4o-mini"` (a provider/model name as the README's examples write one) on a server
    without OPENAI_API_KEY stored the message, tried litellm twice and answered 502 "the model failed …
    try again later": no later try could work. `pager chat --model` says at start which key is
    missing; the server now says the same, 404 model_not_found, before anything is stored."""
    from test_serve import Running

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    running = Running(tmp_path)
    try:
        with running.http() as http:
            r = http.post("/v1/chat/completions", headers={"X-Pager-Session": "k"}, json={
                "model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "remember 77"}]})
            assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found", r.text
            assert "OPENAI_API_KEY" in r.json()["error"]["message"] and "offline" in r.json()["error"]["message"]
            assert http.get("/sessions/k").status_code == 404   # nothing stored
    finally:
        running.stop()


def test_rest_state_of_a_session_without_turns_is_404_not_set_then_unreadable(tmp_path):
    """`PUT /sessions/new/state/k` on a session with no turns answered 200 "state 'k' set", and then `GET
    /sessions/new/state` (and `GET /sessions/new`, `GET /sessions`) said "no session 'new'". A session
    begins with a turn, as every reader counts it: the PUT (and DELETE) is a 404 naming how to start one,
    and once it has a turn the state is set and read back."""
    from test_serve import Running

    running = Running(tmp_path)
    try:
        with running.http() as http:
            for refused in (http.put("/sessions/fresh/state/gym", json={"value": "Tuesdays"}),
                            http.delete("/sessions/fresh/state/gym")):
                assert refused.status_code == 404, refused.text
                error = refused.json()["error"]
                assert error["code"] == "session_not_found" and "POST /sessions/fresh/turns" in error["message"]
            assert http.get("/sessions/fresh/state").status_code == 404
            assert http.post("/sessions/fresh/turns", json={"messages": [{"content": "hello"}]}).status_code == 201
            assert http.put("/sessions/fresh/state/gym", json={"value": "Tuesdays"}).status_code == 200
            assert http.get("/sessions/fresh/state").json()["state"]["gym"]["value"] == "Tuesdays"
    finally:
        running.stop()


NUMBERS = [("9" * 5000, "5,000 digits"), (str(2**64 + 1), str(2**64 + 1)), (str(-2**63 - 1), str(-2**63 - 1)),
           ("1e400", "1e400"), ("NaN", "NaN")]


@pytest.mark.parametrize("number, shown", NUMBERS, ids=["5000 digits", "2**64+1", "-2**63-1", "1e400", "NaN"])
def test_a_number_no_route_can_take_anywhere_in_a_body_is_a_400_naming_where_it_is(tmp_path, number, shown):
    """An integer of more than 4,300 digits anywhere in a JSON body (a field nobody reads included) was a
    500 with a traceback in the log, on every route with a body: Python's int() refuses to read it. An
    integer beyond 64 bits, a float beyond a double (1e400) or NaN, which JSON does not have, is now a
    400 naming where it is and the range to send, before anything is stored; the server goes on."""
    from test_serve import Running

    running = Running(tmp_path)
    chat = '{"model": "offline", "messages": [{"role": "user", "content": "my bike lock is 2718"}], "max_tokens": %s}'
    sent = [("POST", "/v1/chat/completions", chat % number, "max_tokens"),
            ("POST", "/sessions/s/turns", '{"messages": [{"content": "the gym opens at 7", "x": %s}]}' % number,
             "messages[0].x"),
            ("PUT", "/sessions/s/state/gym", '{"value": "Tuesdays", "weeks": [1, %s]}' % number, "weeks[1]")]
    try:
        with running.http() as http:
            assert http.post("/sessions/s/turns", json={"messages": [{"content": "before"}]}).status_code == 201
            for method, path, body, where in sent:
                r = http.request(method, path, content=body, headers={"Content-Type": "application/json",
                                                                      "X-Pager-Session": "s"})
                assert r.status_code == 400, (path, r.status_code, r.text)
                error = r.json()["error"]
                assert error["code"] == "invalid_number" and error["param"] == where, error
                assert shown in error["message"] and "send a whole number from" in error["message"], error
            listed = http.get("/sessions/s/turns").json()
            assert [t["content"] for t in listed["turns"]] == ["before"]   # nothing stored
            assert http.get("/sessions/s/state").json()["state"] == {}
            ok = http.post("/v1/chat/completions", headers={"X-Pager-Session": "s"}, json={
                "model": "offline", "max_tokens": 2**62, "messages": [{"role": "user", "content": "my bike lock is 2718"}]})
            assert ok.status_code == 200, ok.text   # within 64 bits, as before
    finally:
        running.stop()


def test_a_request_of_more_text_than_one_request_may_append_is_a_413_naming_the_limit_and_the_fix(tmp_path):
    """One 3.9 MB turn through `POST /sessions/s/turns` made 7,988 pages, holding the home's engine lock
    (every other session of the server waiting) for 16 s. Making a turn's pages cannot let go of that
    lock halfway (a flush of the home would find half a turn), so the server refuses a request whose new
    turns hold more than `--max-append-chars` characters (200,000 by default, a fraction of a second of
    pages), with 413 naming the limit and the fix: the same text in several messages over several
    requests, all stored. The refusal waits for no lock: it is answered while the engine is held."""
    from test_serve import Running

    running = Running(tmp_path)
    limit = running.server.limits.append_chars
    document = ("The quarterly review covers the sync engine, the outage and the offsite. " * 60_000)[:3_900_000]
    try:
        with running.http() as http:
            assert http.post("/sessions/doc/turns", json={"messages": [{"content": "before"}]}).status_code == 201
            with running.server.engine.lock:   # as if another session's long turn held the engine
                r = http.post("/sessions/doc/turns", json={"messages": [{"content": document}]}, timeout=30)
            assert r.status_code == 413, r.text
            error = r.json()["error"]
            assert error["code"] == "too_much_text" and error["param"] == "messages[0]", error
            assert f"{limit:,}" in error["message"] and "3,900,000" in error["message"]
            assert "split" in error["message"] and "--max-append-chars" in error["message"]
            many = [{"content": "x" * 1000 + str(i)} for i in range(limit // 1000 + 1)]
            r = http.post("/sessions/doc/turns", json={"messages": many})
            assert r.status_code == 413 and "several requests" in r.json()["error"]["message"], r.text
            chat = http.post("/v1/chat/completions", headers={"X-Pager-Session": "doc"}, json={
                "model": "offline", "messages": [{"role": "user", "content": document[:limit]},
                                                 {"role": "assistant", "content": "noted"},
                                                 {"role": "user", "content": "what did the review cover?"}]})
            assert chat.status_code == 413 and chat.json()["error"]["code"] == "too_much_text", chat.text
            assert [t["content"] for t in http.get("/sessions/doc/turns").json()["turns"]] == ["before"]
            part = limit // 2
            for start in range(0, 3 * part, part):   # what the message asks for: parts, each request under the limit
                r = http.post("/sessions/doc/turns", json={"messages": [{"content": document[start:start + part]}]})
                assert r.status_code == 201, r.text
            stored = [t["content"] for t in http.get("/sessions/doc/turns").json()["turns"]]
            assert stored[1:] == [document[s:s + part] for s in range(0, 3 * part, part)]
    finally:
        running.stop()
