"""What an outside tester found running pager as a newcomer would: several `pager chat` processes on
one session with readers in between, `pager serve` options given as a user might type them."""

import json

import pytest

from typer.testing import CliRunner

from pager.agent import Agent
from pager.cli.app import app
from pager.embed import HashEmbedder
from pager.errors import InputError
from pager.fsck import check
from pager.home import Home
from pager.model import HandlerModel
from pager.offline import OfflineShell
from pager.replay import replay
from pager.trace import TraceWriter, begin

from conftest import say


def test_a_trace_begun_after_another_process_flushed_replays(config, tmp_path):
    """Three `pager chat` processes started at once on one session: one opened the session at 6 turns,
    another flushed 4 more to the store before the first's trace began. The trace's snapshot was read
    from the store (10 turns) while its session held 6 and took the other 4 in at its first message (an
    `append` from another process): replay loaded the 4 twice and `pager replay --check` failed at the
    first turn. The snapshot now holds what the session held when its trace began."""
    a, b = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    sb = b.open("shared")
    say(sb, 6)
    sa = a.open("shared")          # takes b's 6 turns in from b's journal, sealing pages b has not stored
    say(sb, 4, start=100)
    b.close()                      # the other process ends: its turns are in the store
    assert sa.turn_count == 6 and sa.pending.pages
    writer = TraceWriter(tmp_path / "a.jsonl")
    sa.events.listeners.append(writer)
    agent = Agent(sa, HandlerModel(OfflineShell()))
    begin(sa, "pager/offline", agent.budget)
    agent.ask("what does turn 101 say?")
    writer.close()
    run = replay(writer.path, check=True)
    assert run.divergence is None, run.divergence.describe()
    a.close()


def test_a_trace_begun_holding_another_live_processs_unflushed_turns_replays(config, tmp_path):
    """The other way round: the session took in turns another live process had only in its journal, so
    the snapshot read from the store lacked them (0 turns for a session of 4) and replay numbered the
    next turn 1 where the recording had 5."""
    a, b = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    sb = b.open("shared")
    say(sb, 4)
    sa = a.open("shared")          # takes b's turns in from b's journal: b has flushed nothing
    assert sa.turn_count == 4
    writer = TraceWriter(tmp_path / "a.jsonl")
    sa.events.listeners.append(writer)
    agent = Agent(sa, HandlerModel(OfflineShell()))
    begin(sa, "pager/offline", agent.budget)
    say(sb, 2, start=100)
    agent.ask("what does turn 2 say?")
    writer.close()
    run = replay(writer.path, check=True)
    assert run.divergence is None, run.divergence.describe()
    b.close()
    a.close()


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


@pytest.mark.parametrize("message", [{"date": 3}, {"role": 7}, {"ts": "soon"}, {"ts": True}, {"ts": -1.0},
                                     {"ts": float("nan")}, {"ts": 1e20}, {"text": "lone \ud800"},
                                     {"speaker": "b\udc80b"}, {"key": "k\ud800"}])
def test_the_library_refuses_a_message_field_the_journal_could_not_read_back(config, message):
    """The same through the library, a `ts` that is no time (a string was a ValueError from float(),
    NaN was accepted) and a lone surrogate (a UnicodeEncodeError from the journal): InputError naming
    the field, nothing written."""
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("lib")
        with pytest.raises(InputError, match=next(iter(message))):
            s.append_many([{"speaker": "ann", "text": "typed wrong", **message}])
        assert s.turn_count == 0
        import numpy as np

        s.append_many([{"speaker": "ann", "text": "a numpy time is a time", "ts": np.float32(1.7e9)}])   # as before
        assert s.turn_count == 1


@pytest.mark.parametrize("flag, value", [("--max-body", "0"), ("--max-body", "-1"), ("--max-messages", "0"),
                                         ("--max-messages", "-5"), ("--timeout", "0"), ("--timeout", "-1"),
                                         ("--timeout", "nan"), ("--idle", "nan")])
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


def test_keys_on_a_home_that_cannot_be_written_is_one_line(tmp_path):
    """`pager keys create` on a read-only home was a traceback (OSError from the keys' lock file); a home
    under a file is the same failure without needing a read-only mount. One line naming --home now."""
    (tmp_path / "file").write_text("not a folder")
    home = str(tmp_path / "file" / "home")
    for args in (["keys", "create", "--tenant", "acme"], ["keys", "revoke", "3f9c2a7b1d04"]):
        result = CliRunner().invoke(app, ["--home", home, *args])
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.output, result.exception)
        assert "cannot write the keys" in result.output and "--home" in result.output, result.output


def test_serve_on_a_home_it_cannot_open_never_claims_to_serve(tmp_path):
    """`pager serve` on a read-only home said "pager serve on http://…" and then failed to open the
    home: a script waiting for that line connected to a server about to exit. The home opens first."""
    (tmp_path / "file").write_text("not a folder")
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "file" / "home"), "serve", "--port", "0"],
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 1 and "pager home" in result.output, result.output
    assert "pager serve on" not in result.output


SEPARATORS = "a line\u2028a paragraph\u2029a NEL\u0085the end"


def test_text_with_unicode_line_separators_survives_export_ingest_and_replay(tmp_path):
    """JSON keeps U+2028, U+2029 and U+0085 raw inside strings (text pasted from a web page or a word
    processor holds them), and pager read JSONL and traces with str.splitlines, which ends a line at
    each: `pager ingest` refused such a file ("not JSON", naming a line that was half of one), so did
    `pager ingest` of pager's own export, and a chat whose message held one left a trace that
    `pager replay` and `pager trace show` refused. Only \\n and \\r end a line now."""
    home = ["--home", str(tmp_path)]
    source = tmp_path / "pasted.jsonl"
    source.write_text(json.dumps({"speaker": "ann", "text": SEPARATORS}, ensure_ascii=False) + "\n", encoding="utf-8")
    run = CliRunner()
    imported = run.invoke(app, [*home, "ingest", str(source), "-s", "notes"], env={"PAGER_EMBEDDER": "hash"})
    assert imported.exit_code == 0, imported.output
    chatted = run.invoke(app, [*home, "chat", "-s", "notes"], input=f"{SEPARATORS} again\n/quit\n",
                         env={"PAGER_EMBEDDER": "hash"})
    assert chatted.exit_code == 0, chatted.output
    out = tmp_path / "notes.jsonl"
    assert run.invoke(app, [*home, "export", "-s", "notes", "--out", str(out)], env={"PAGER_EMBEDDER": "hash"}).exit_code == 0
    assert [json.loads(line)["text"] for line in out.read_text(encoding="utf-8").split("\n") if line][:2] == \
        [SEPARATORS, f"{SEPARATORS} again"]
    again = run.invoke(app, [*home, "ingest", str(out), "-s", "notes"], env={"PAGER_EMBEDDER": "hash"})
    assert again.exit_code == 0 and "0 new turns" in again.output, again.output
    trace = next((tmp_path / "traces").glob("notes-chat-*.jsonl"))
    replayed = run.invoke(app, [*home, "replay", str(trace), "--check"], env={"PAGER_EMBEDDER": "hash"})
    assert replayed.exit_code == 0, replayed.output


@pytest.mark.parametrize("setting", ["PAGER_LEASE_S", "PAGER_LEASE_WAIT_S", "PAGER_LEASE_IDLE_S", "PAGER_RECENCY_WEIGHT"])
def test_a_setting_of_nan_is_refused_like_any_other_non_number(tmp_path, setting):
    """`PAGER_LEASE_S=nan` passed the check that a lease is above 0 (every comparison with NaN is
    false) and `PAGER_RECENCY_WEIGHT=nan` the check that it is not negative: a lease that never lapses
    or is never held, NaN scores. Refused now, naming the setting."""
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "hello there"}\n')
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(tmp_path / "one.jsonl")],
                                env={"PAGER_EMBEDDER": "hash", setting: "nan"})
    assert result.exit_code == 2 and setting in result.output, result.output


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


def test_the_source_tree_imports_whole_without_an_editable_install():
    """The README's quick start is `pip install .` in a clone; a newcomer then runs its Python example
    with python started in the clone's root, where the working folder comes first on sys.path and
    `import pager` is the source tree's pager/, which has no prompts/, tools/ or cli/:
    `pager.build` failed with "No module named 'pager.prompts'". The test's own editable install would
    hide this, so the child drops its finder first."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    code = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
            "import pager, pager.prompts, pager.tools, pager.cli.app, pager.context; "
            "assert pager.__file__.startswith(sys.argv[1]), pager.__file__")
    done = subprocess.run([sys.executable, "-c", code, str(root)], cwd=root, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("args", [["--clients", "0"], ["--turns", "0"], ["--alone-turns", "0"], ["--shared", "-1"],
                                  ["--earlier", "-5"]])
def test_bench_serve_refuses_counts_it_cannot_measure_before_it_runs(tmp_path, monkeypatch, args):
    """`pager bench serve --clients 0` (or --alone-turns 0, or a negative count) ran the whole load and
    then died with ZeroDivisionError computing its ratios. Refused by the option, before anything runs."""
    import pager.bench.serve

    def runs(*a, **kw):
        raise AssertionError("the bench ran")

    monkeypatch.setattr(pager.bench.serve, "main", runs)
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "bench", "serve", *args])
    assert result.exit_code == 2 and args[0] in result.output, result.output


@pytest.mark.parametrize("args", [["locomo", "--conversations", "0"], ["locomo", "--conversations", "-1"],
                                  ["locomo", "--questions", "0"], ["trace", "--conversation", "c1", "--questions", "0"]])
def test_bench_locomo_and_trace_refuse_no_conversations_or_questions(tmp_path, args):
    """`pager bench locomo --conversations 0` (or -1, a slice from the end) died with KeyError 'pager'
    after loading the data; `--questions 0` printed a table of recall 0.000 and all_hit 1.000 over no
    question. Refused by the option."""
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([{"sample_id": "c1", "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "My dog is called Coco."}]},
        "qa": [{"question": "What is Ann's dog called?", "answer": "Coco", "evidence": ["D1:1"], "category": 1}]}]))
    more = ["--out", str(tmp_path / "t.jsonl")] if args[0] == "trace" else ["--no-baselines"]
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "bench", args[0], "--data", str(data), *args[1:], *more],
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 2 and ("--conversations" in result.output or "--questions" in result.output), result.output


def test_a_model_the_server_has_no_key_for_is_refused_naming_the_key(tmp_path, monkeypatch):
    """`"model": "openai/gpt-4o-mini"` (the README's own example of a provider/model name) on a server
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
