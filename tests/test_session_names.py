"""Which session a command means: a name no session may have is refused before anything is written
(chat, ingest, the Toolkit, `pager mcp`), and opening a session writes nothing; a command given no
session, or one held under another user or in another store, names the session or the setting that
opens it."""

import json

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import InputError
from pager.home import Home

from conftest import ENV, ingest_lines


runner = CliRunner()


def _home(path, **kw) -> Home:
    return Home(Config(home=path, budget=2048, embedder="hash", **kw), embedder=HashEmbedder())


def test_a_session_opened_and_left_unwritten_is_not_made(tmp_path):
    """`printf 'hi\\n' | pager chat -s x/y` was refused at its message, yet the chat's close stored the
    page table of the session it had opened; the next `pager chat -s x/y` found the session settled and
    took the name docs/serve.md says is refused. Opening writes nothing: the name is still refused, and
    how pages are cut is fixed by the first transaction, not by a process that only looked."""
    with _home(tmp_path / "h", page_tokens=64) as home:
        home.open("x/y")
        home.open("fresh")
    with _home(tmp_path / "h") as home:
        with pytest.raises(InputError, match='must not contain "/"'):
            home.open("x/y").append("user", "hi")
        fresh = home.open("fresh")
        fresh.append("user", "hello")
        assert fresh.page_tokens == 128


def test_chat_twice_on_a_bad_name_is_refused_both_times(tmp_path):
    home = str(tmp_path / "h")
    for _ in range(2):
        result = runner.invoke(app, ["--home", home, "chat", "--session", "x/y"], input="hi\n", env=ENV)
        assert 'must not contain "/"' in result.output and result.exit_code == 2, result.output
        assert "you>" not in result.output   # refused before the REPL, not at the first message
    listed = runner.invoke(app, ["--home", home, "sessions", "--json"], env=ENV)
    assert '"x/y"' not in listed.output


def test_a_toolkit_or_mcp_server_on_a_name_no_session_may_have_is_refused_at_start(tmp_path):
    """`pager mcp --session a/b` served its tools and refused the name only at the first write."""
    from pager.errors import InputError
    from pager.tools.toolkit import Toolkit

    home = tmp_path / "h"
    with pytest.raises(InputError, match="a/b"):
        Toolkit(config=Config(home=home, session="a/b", embedder="hash"))
    result = CliRunner().invoke(app, ["--home", str(home), "mcp", "--session", "a/b"], env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code != 0 and "a/b" in result.output and "Traceback" not in result.output
    with Toolkit(config=Config(home=home, session="fine", embedder="hash")) as kit:   # a good name opens as before
        assert kit.session.name == "fine"


def test_a_command_without_a_session_names_the_ones_the_home_holds(tmp_path):
    """After `pager demo --keep DIR`, `pager --home DIR search …` looked for the session "default" and
    said only that `pager sessions` lists what is there: it now names the session to add."""
    home = tmp_path / "h"
    ingest_lines(home, "demo", [{"speaker": "ann", "text": "I have a peanut allergy."}])
    result = runner.invoke(app, ["--home", str(home), "search", "peanut allergy"], env=ENV)
    assert result.exit_code != 0 and "it holds 'demo': add --session demo" in result.output, result.output
    ingest_lines(home, "other one", [{"speaker": "ann", "text": "Another session."}])
    result = runner.invoke(app, ["--home", str(home), "search", "peanut allergy"], env=ENV)
    assert "it holds 2 sessions ('demo', 'other one'): name one with --session" in result.output, result.output


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


def _sessions(home) -> list[tuple[str, str]]:
    result = runner.invoke(app, ["--home", str(home), "sessions", "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    return sorted((r["user"], r["session"]) for r in json.loads(result.stdout)["sessions"])


def test_chat_under_the_wrong_user_is_refused_naming_whose_the_session_is(tmp_path):
    """`PAGER_USER=alice pager ingest notes.jsonl -s notes`, then in a shell without the setting `pager chat
    -s notes`: the banner said "new session", and the first message started an empty session beside
    alice's. It is refused now (exit 2), naming alice and the setting; --new starts one all the same."""
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "the boat leaves at nine"}\n')
    home = ["--home", str(tmp_path / "home")]
    made = runner.invoke(app, [*home, "ingest", str(tmp_path / "one.jsonl"), "-s", "notes"], env={**ENV, "PAGER_USER": "alice"})
    assert made.exit_code == 0, made.output
    refused = runner.invoke(app, [*home, "chat", "-s", "notes"], input="when does the boat leave?\n", env=ENV)
    assert refused.exit_code == 2, refused.output
    assert "PAGER_USER=alice" in refused.output and "--new" in refused.output and "pager chat ·" not in refused.output
    assert _sessions(tmp_path / "home") == [("alice", "notes")]   # nothing was started
    started = runner.invoke(app, [*home, "chat", "-s", "notes", "--new"], input="hello\n", env=ENV)
    assert started.exit_code == 0 and "new session" in started.output, started.output
    assert _sessions(tmp_path / "home") == [("", "notes"), ("alice", "notes")]
    fresh = runner.invoke(app, [*home, "chat", "-s", "other"], input="hello\n", env=ENV)   # a name no one holds
    assert fresh.exit_code == 0 and "new session" in fresh.output, fresh.output


def test_ingest_refuses_an_empty_session_name_as_chat_does(tmp_path):
    """`pager ingest notes.jsonl -s "$NAME"` with NAME unset imported into 'default' and said so in passing,
    where `pager chat -s ""` refuses the name and `pager search -s ""` looks for a session ''. It is
    refused now, and nothing is imported."""
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "hello there"}\n')
    result = runner.invoke(app, ["--home", str(tmp_path / "home"), "ingest", str(tmp_path / "one.jsonl"), "-s", ""], env=ENV)
    assert result.exit_code == 2 and "--session '' is empty" in result.output, result.output
    assert _sessions(tmp_path / "home") == []
