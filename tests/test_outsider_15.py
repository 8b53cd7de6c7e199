"""What an outside tester found driving serve, MCP and several hosts on one store, each driven the way
the tester did."""

import json
import os
import signal
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from conftest import ENV

runner = CliRunner()

HOLDER = """
import sys
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
home = Home(Config.load(home=sys.argv[1], db=sys.argv[2], lease_s=1.0, budget=2048), embedder=HashEmbedder())
s = home.open("s")
for who, text in (("ann", "From host A: the venue is Lisbon."), ("assistant", "Noted."), ("ann", "The date is May 4")):
    s.append(who, text)
print("holding", flush=True)
sys.stdin.read()
"""


def _killed_holder_numbered_over(tmp_path):
    """Host a acknowledges three turns and is killed with SIGKILL holding the lease; host b, waiting
    for the lease, writes turns 1 and 2 of the same session once it lapses, the second saying what
    host a's turn 2 says. Returns (home a, store)."""
    store, a = str(tmp_path / "store"), tmp_path / "a"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(a), store], env={**os.environ, **ENV},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "holding", child.stderr.read()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    config = Config.load(env=ENV, home=tmp_path / "b", db=store, budget=2048, lease_wait_s=120)
    with Home(config, embedder=HashEmbedder()) as b:
        b.open("s").append("carol", "From host B: catering by Marco.")
        b.open("s").append("assistant", "Noted.")
    return a, store


def test_export_of_a_home_whose_dead_process_was_numbered_over_loses_nothing(tmp_path):
    """Before host a's home wrote again, `pager export` there printed host b's turn 1 in place of host
    a's acknowledged 'From host A: the venue is Lisbon.' (exit 0; the question was simply not in the
    file) and `pager check` said 'turn 1 means two messages' without a fix. Export refuses in one line
    naming the command that recovers the journal; check names it too; after it, every turn is there."""
    a, store = _killed_holder_numbered_over(tmp_path)
    args = ["--home", str(a), "--db", store]
    out = tmp_path / "a.jsonl"
    exported = runner.invoke(app, [*args, "export", "-s", "s", "--out", str(out)], env=ENV)
    assert exported.exit_code != 0 and not out.exists(), exported.output
    assert "pager migrate" in exported.output and "Traceback" not in exported.output
    checked = runner.invoke(app, [*args, "check", "-s", "s"], env=ENV)
    assert checked.exit_code == 1 and "pager migrate" in checked.output, checked.output
    assert runner.invoke(app, [*args, "migrate"], env=ENV).exit_code == 0
    exported = runner.invoke(app, [*args, "export", "-s", "s", "--out", str(out)], env=ENV)
    assert exported.exit_code == 0, exported.output
    texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    # host a's turns after host b's, in the order acknowledged; its 'Noted.' is its own, not host b's
    assert texts == ["From host B: catering by Marco.", "Noted.", "From host A: the venue is Lisbon.", "Noted.",
                     "The date is May 4"]
    assert runner.invoke(app, [*args, "check", "-s", "s"], env=ENV).exit_code == 0


def test_a_session_another_host_is_writing_is_a_conflict_over_http(tmp_path):
    """Two `pager serve` on one store: the second's answer for a session the first holds was 400
    invalid_request_error with code 'LeaseHeld' (a class name), though nothing in the request was
    wrong and the same request succeeds once the lease lapses. It is 409, OpenAI's conflict, which
    OpenAI's clients retry, with a code in OpenAI's style; the session is written once it is free."""
    from test_serve import Running

    store = str(tmp_path / "store")
    holder = Home(Config(home=tmp_path / "a", db=store, embedder="hash", budget=2048), embedder=HashEmbedder())
    holder.open("shared").append("ann", "written on host a")
    b = Running(tmp_path / "b", config=Config(home=tmp_path / "b", db=store, embedder="hash"))
    try:
        ask = {"model": "offline", "messages": [{"role": "user", "content": "written on host b"}]}
        with b.http() as http:
            for path, body in (("/v1/chat/completions", ask), ("/sessions/shared/turns", {"messages": ask["messages"]})):
                refused = http.post(path, json=body, headers={"X-Pager-Session": "shared"})
                assert refused.status_code == 409, refused.text
                error = refused.json()["error"]
                assert error["type"] == "conflict_error" and error["code"] == "lease_held"
                assert holder.leases.holder in error["message"]
            holder.close()   # flushes and gives the lease up
            assert http.post("/v1/chat/completions", json=ask, headers={"X-Pager-Session": "shared"}).status_code == 200
            assert http.get("/sessions/shared").json()["turns"] == 3
    finally:
        b.stop()


def test_a_bookmark_or_pin_refused_for_the_lease_changes_nothing(tmp_path):
    """`pager mcp` on a host whose session another host was writing: `bookmark` came back refused
    (the lease), yet `context` then showed the page with the refused keyword, and the server's exit
    tried to write it ('pager: session … is being written by …' on stderr). A refused bookmark or pin
    leaves memory as it was, and closing writes nothing of it."""
    from pager.errors import LeaseHeld

    store = str(tmp_path / "store")

    def config(name: str) -> Config:
        return Config(home=tmp_path / name, db=store, embedder="hash", budget=2048)

    holder = Home(config("a"), embedder=HashEmbedder())
    holder.open("s").append("ann", "the venue is Lisbon")
    holder.flush()
    b = Home(config("b"), embedder=HashEmbedder())
    s = b.open("s")
    for refused in (lambda: s.bookmark(["p1"], ["refusedword"]), lambda: s.pin(1)):
        with pytest.raises(LeaseHeld):
            refused()
    assert "refusedword" not in s.directory.keywords(1) and not s.table[1].pinned
    b.close()   # nothing of the refused calls is left to write
    holder.close()
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert all("refusedword" not in mark.keywords for mark in reader.store.bookmarks("", "s"))


def test_a_writer_that_waited_for_the_lease_is_told_it_waited(tmp_path):
    """`PAGER_LEASE_WAIT_S=2 pager ingest …` waited 2 s, then said '… or set PAGER_LEASE_WAIT_S to wait
    for it', the setting it had just used. It says how long it waited and to raise the setting."""
    from pager.errors import LeaseHeld

    store = str(tmp_path / "store")
    holder = Home(Config(home=tmp_path / "a", db=store, embedder="hash", budget=2048), embedder=HashEmbedder())
    holder.open("s").append("ann", "on host a")
    waited = Home(Config(home=tmp_path / "b", db=store, embedder="hash", budget=2048, lease_wait_s=0.3),
                  embedder=HashEmbedder())
    with pytest.raises(LeaseHeld) as refused:
        waited.open("s").append("bob", "on host b")
    assert "waited 0.3 s" in str(refused.value) and "raise PAGER_LEASE_WAIT_S" in str(refused.value)
    assert holder.leases.holder in str(refused.value)
    holder.close()
    waited.close()


def test_search_counts_the_open_page_it_lists(tmp_path):
    """`pager ingest notes.jsonl -s planning` said '3 turns on 1 page (p1 open)', then `pager search`
    titled its table "'room for planning' in session 'planning' (0 pages)" above the row of p1."""
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"speaker": who, "text": text}) + "\n" for who, text in [
        ("alice", "The planning meeting moved to Thursday."), ("bob", "I will book room Orion for it.")]))
    args = ["--home", str(tmp_path / "h")]
    assert runner.invoke(app, [*args, "ingest", str(notes), "-s", "planning"], env=ENV).exit_code == 0
    found = runner.invoke(app, [*args, "search", "room Orion", "-s", "planning"], env=ENV)
    assert found.exit_code == 0 and "p1" in found.output, found.output
    assert "(1 page)" in found.output, found.output


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
