"""What an outside tester found in a first hour with pager: files as exporters write them, settings
carried from one command to another, a replay asked for the wrong thing, and `pager serve` beside
another process of the same home."""

import json

import pytest

from typer.testing import CliRunner

from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.formats import parse_locomo
from pager.home import Home

ENV = {"PAGER_EMBEDDER": "hash"}
runner = CliRunner()


def _ingest(tmp_path, name: str, content: str, *args: str):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    return runner.invoke(app, ["--home", str(tmp_path / "home"), "ingest", str(path), *args], env=ENV)


def _exported(tmp_path, session: str) -> list[dict]:
    result = runner.invoke(app, ["--home", str(tmp_path / "home"), "export", "-s", session], env=ENV)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_an_iso_timestamp_in_date_dates_the_turn_on_its_day(tmp_path):
    """`"date": "2023-05-08T10:00:00Z"`, what nearly every exporter writes, was warned about as naming no
    day ("like '8 May 2023' or 2023-05-08") and the turn dated the day it was imported: the ISO date was
    read only when a word boundary followed the day, and the T of a timestamp is no boundary. A question
    about May 2023 could not find it. It is read now, like `2023-05-08 10:00`."""
    lines = [{"speaker": "ann", "text": "the kickoff is today", "date": "2023-05-08T10:00:00Z"},
             {"speaker": "bob", "text": "and the review", "date": "2023-05-09T16:30:00.123+02:00"}]
    result = _ingest(tmp_path, "stamps.jsonl", "".join(json.dumps(m) + "\n" for m in lines), "-s", "s")
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    from datetime import datetime

    days = [datetime.fromtimestamp(t["ts"]).date().isoformat() for t in _exported(tmp_path, "s")]
    assert days == ["2023-05-08", "2023-05-09"]


@pytest.mark.parametrize("content, command", [
    ('[{"speaker": "ann", "text": "one"}, {"speaker": "bob", "text": "two"}]\n', "jq -c '.[]'"),
    ('[\n  {"speaker": "ann", "text": "one"},\n  {"speaker": "bob", "text": "two"}\n]\n', "jq -c '.[]'"),
    ('{\n  "speaker": "ann",\n  "text": "one"\n}\n', "jq -c ."),
])
def test_a_json_array_or_pretty_printed_file_is_named_with_the_command_that_converts_it(tmp_path, content, command):
    """A conversation saved as one JSON array (what `json.dump(messages)` writes), or pretty-printed, was
    refused with "expected an object like …" or "not JSON (Expecting value); fix that line": the line
    is not what is wrong, and nothing said that ingest reads one object per line. The error now says
    what the file is and the command that converts it, to a file that is not the one it reads."""
    result = _ingest(tmp_path, "conversation.jsonl", content, "-s", "s")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "not JSON lines" in result.output and command in result.output, result.output
    assert "conversation-lines.jsonl" in result.output, result.output   # never `> conversation.jsonl`: that empties it


def test_model_offline_is_the_offline_shell_in_chat_as_in_serve(tmp_path):
    """`pager serve` calls the offline shell `offline` (and takes PAGER_MODEL=offline); with that setting
    exported, or `--model offline`, `pager chat` refused to start: "model 'offline' names no provider
    litellm knows". It is the offline shell in both now."""
    home = ["--home", str(tmp_path)]
    for args, env in (([], {**ENV, "PAGER_MODEL": "offline"}), (["--model", "offline"], ENV)):
        result = runner.invoke(app, [*home, "chat", "-s", "s", *args], input="my locker code is 3141\n/quit\n", env=env)
        assert result.exit_code == 0, result.output
        assert "offline memory shell" in result.output and "pager>" in result.output, result.output


def test_inspect_counts_the_open_page_as_its_json_and_sessions_do(tmp_path):
    """`pager inspect` printed "394 turns, 70 pages on disk" where `inspect --json`, `pager sessions`,
    `pager check` and the chat banner all said 71: the open page, holding the last turns, was left out
    of the one line a newcomer reads first. It says "71 pages (p71 open)" now, as ingest does."""
    lines = "".join(json.dumps({"speaker": "ann", "text": f"note {i} " + "word " * 30}) + "\n" for i in range(12))
    assert _ingest(tmp_path, "notes.jsonl", lines, "-s", "s").exit_code == 0
    home = ["--home", str(tmp_path / "home")]
    shown = json.loads(runner.invoke(app, [*home, "inspect", "-s", "s", "--json"], env=ENV).stdout)
    assert shown["pages"] > 1
    header = runner.invoke(app, [*home, "inspect", "-s", "s"], env=ENV).output.splitlines()[0]
    assert f"{shown['pages']} pages ({shown['tail']} open)" in header, header


def test_replay_check_under_another_policy_is_refused_not_ignored(tmp_path):
    """`pager replay TRACE --check --policy lru` printed "ok: 887 recorded events reproduced exactly" for
    a trace recorded under CLOCK: --check ignored --policy (and took any name, `--policy bogus` too),
    so it looked as if LRU made the same decisions. The recorded policy is accepted; another is refused,
    naming the command that compares it."""
    trace = "traces/clock_vs_lru.jsonl"
    home = ["--home", str(tmp_path)]
    for policy in ("lru", "all", "bogus"):
        result = runner.invoke(app, [*home, "replay", trace, "--check", "--policy", policy], env=ENV)
        assert result.exit_code == 2 and "reproduced" not in result.output, (policy, result.output)
    result = runner.invoke(app, [*home, "replay", trace, "--check", "--policy", "lru"], env=ENV)
    assert "clock" in result.output and f"pager replay {trace} --policy lru" in result.output, result.output
    result = runner.invoke(app, [*home, "replay", trace, "--check", "--policy", "clock"], env=ENV)
    assert result.exit_code == 0 and "reproduced exactly" in result.output, result.output


@pytest.mark.parametrize("args", [["ingest", "x.jsonl", "--format", "csv"], ["tools", "--format", "xml"],
                                  ["replay", "traces/clock_vs_lru.jsonl", "--policy", "bogus"]])
def test_an_unknown_option_value_exits_2_like_every_other(tmp_path, args):
    """`ingest --format csv`, `tools --format xml` and `replay --policy bogus` exited 1, the code of a
    failure, where every other value an option cannot take (`--policy` of chat, `-k 0`, `--budget abc`)
    exits 2, the code of a usage error that a script can tell apart."""
    (tmp_path / "x.jsonl").write_text('{"speaker": "ann", "text": "hi"}\n')
    args = [str(tmp_path / a) if a == "x.jsonl" else a for a in args]
    result = runner.invoke(app, ["--home", str(tmp_path / "home"), *args], env=ENV)
    assert result.exit_code == 2 and "unknown" in result.output, result.output


def _locomo(qa=None, **conversation) -> str:
    conv = {"speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "My dog is called Coco."}]} | conversation
    return json.dumps([{"sample_id": "c1", "conversation": conv, "qa": qa or []}])


@pytest.mark.parametrize("qa, named", [
    ([{"question": "q", "category": "multi-hop", "evidence": ["D1:1"]}], '"category"'),
    (["What is Ann's dog called?"], "is not an object"),
    ([{"question": "q", "category": 1, "evidence": "D1:1"}], '"evidence"'),
])
def test_a_locomo_question_of_the_wrong_shape_is_named_not_a_traceback(tmp_path, qa, named):
    """`pager ingest --format locomo` of a file whose `qa` held a category in words, a question as a bare
    string, or evidence as one string printed a Python traceback (ValueError, AttributeError), or
    silently dropped the evidence; ingest does not even use the questions. Each is one line naming the
    sample and the question now, and nothing is imported."""
    result = _ingest(tmp_path, "locomo.json", _locomo(qa), "--format", "locomo")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    assert "c1 qa 1" in result.output and named in result.output, result.output


def test_a_locomo_session_without_a_date_is_not_dated_1970(tmp_path):
    """A LoCoMo session with no (or an unreadable) `session_N_date_time` gave its turns the timestamp 0:
    `pager export` showed them on 1 January 1970 and a date question could never reach them. They are
    dated as an undated JSONL line is now (the turns before them, else the day imported), with a warning
    naming the session."""
    content = _locomo(session_2=[{"speaker": "Bob", "dia_id": "D2:1", "text": "Coco learned to sit."}])
    result = _ingest(tmp_path, "locomo.json", content, "--format", "locomo")
    assert result.exit_code == 0 and "session_2_date_time" in result.output, result.output
    assert all(t["ts"] > 86_400 and "1970" not in t["date"] for t in _exported(tmp_path, "c1"))
    (conversation,) = parse_locomo(tmp_path / "locomo.json")
    assert [m.get("ts") for m in conversation.messages][1:] == [None]


def test_serve_readers_show_the_turns_another_live_process_of_the_home_holds(tmp_path):
    """A `pager chat` (or second server) on the same home as `pager serve`, same session: its turns are in
    its journal until a batch is flushed. `GET /sessions/s/turns` read only the store and listed 2 of 4
    turns while its `total_turns` said 4; once the server had the session open, `GET /sessions/s` and
    the state tier kept the counts and values of when it opened it. Readers now take in what the other
    process made durable first, as `pager inspect` does, and list the turns its journal holds."""
    from test_serve import Running

    running = Running(tmp_path, config=Config(home=tmp_path, embedder="hash"))
    other = Home(Config(home=tmp_path, embedder="hash"), embedder=HashEmbedder())
    try:
        with running.http() as http:
            assert http.post("/sessions/s/turns", json={"messages": [{"content": "from serve"}]}).status_code == 201
            assert http.get("/sessions/s").json()["turns"] == 1   # the server holds the session open now
            s = other.open("s")
            s.append("ann", "from the other process")
            s.append("ann", "and its second turn")
            s.set_state("city", "Lisbon")
            assert http.get("/sessions/s").json()["turns"] == 3
            listed = http.get("/sessions/s/turns").json()
            assert listed["total_turns"] == 3, listed
            assert [t["content"] for t in listed["turns"]] == ["from serve", "from the other process", "and its second turn"]
            assert [t["content"] for t in http.get("/sessions/s/turns?after=2").json()["turns"]] == ["and its second turn"]
            assert http.get("/sessions/s/state").json()["state"]["city"]["value"] == "Lisbon"
    finally:
        running.stop()
        other.close()


def test_sessions_names_the_store_when_db_puts_it_elsewhere(tmp_path):
    """After `pager --db s3://memory/team ingest …`, `pager --db s3://memory/team sessions` titled its table
    "sessions in ~/.pager" and a mistyped name said "no session 'x' in ~/.pager": the sessions listed
    are the store's, and the home holds the sessions of its own store too. With --db (PAGER_DB) the
    store is named beside the home."""
    db = tmp_path / "elsewhere"
    home = ["--home", str(tmp_path / "home"), "--db", str(db)]
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "hello there"}\n')
    assert runner.invoke(app, [*home, "ingest", str(tmp_path / "one.jsonl"), "-s", "team"], env=ENV).exit_code == 0
    listed = runner.invoke(app, [*home, "sessions"], env=ENV)
    assert f"(store{db})" in "".join(listed.output.split()), listed.output   # the table's title wraps
    missing = runner.invoke(app, [*home, "search", "hello", "-s", "nope"], env=ENV)
    assert missing.exit_code == 1 and f"(store {db})" in missing.output, missing.output
    plain = runner.invoke(app, ["--home", str(tmp_path / "home"), "sessions"], env=ENV)
    assert "(store" not in plain.output, plain.output


def test_the_mcp_server_says_its_version():
    """`pager mcp` (and /mcp of `pager serve`) answered `initialize` with `"serverInfo": {"name": "pager",
    "version": ""}`: an MCP client shows and logs the server it talks to by that version."""
    from pager import __version__
    from pager.tools import Toolkit
    from pager.tools.mcp_server import build

    server = build(Toolkit.__new__(Toolkit))
    assert __version__ and server.version == __version__


def test_a_session_of_another_user_is_named_with_the_setting_that_opens_it(tmp_path):
    """`PAGER_USER=alice pager ingest notes.jsonl -s notes`, then in a new shell `pager search … -s notes`:
    "no session 'notes' in ~/.pager; `pager sessions` lists the sessions there", though the session
    was there, under user alice. The message now says whose it is and the setting that opens it."""
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "hello there"}\n')
    home = ["--home", str(tmp_path / "home")]
    made = runner.invoke(app, [*home, "ingest", str(tmp_path / "one.jsonl"), "-s", "notes"], env={**ENV, "PAGER_USER": "alice"})
    assert made.exit_code == 0, made.output
    missing = runner.invoke(app, [*home, "search", "hello", "-s", "notes"], env=ENV)
    assert missing.exit_code == 1 and "PAGER_USER=alice" in missing.output, missing.output
    assert runner.invoke(app, [*home, "ingest", str(tmp_path / "one.jsonl"), "-s", "plain"], env=ENV).exit_code == 0
    missing = runner.invoke(app, [*home, "export", "-s", "plain"], env={**ENV, "PAGER_USER": "alice"})
    assert missing.exit_code == 1 and "unset PAGER_USER" in missing.output, missing.output


def test_the_offline_shell_the_readme_names_for_the_agent_loop_is_a_public_name(tmp_path):
    """The README's Python section says `HandlerModel(OfflineShell())` satisfies `pager.Model`, so
    `pager.Agent(session, model).ask("…")` runs with no key; `pager.HandlerModel` was there, but
    `pager.OfflineShell` was an AttributeError and nothing said where it lives."""
    import pager

    with pager.Home(Config(home=tmp_path, embedder="hash")) as home:
        session = home.open("work")
        agent = pager.Agent(session, pager.HandlerModel(pager.OfflineShell()))
        agent.ask("My locker code is 3141.")
        assert "3141" in agent.ask("What is my locker code?").text
    assert "OfflineShell" in pager.__all__
