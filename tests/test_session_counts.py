"""The turns and pages a session is said to hold are the same in every command: the open page is
counted with the sealed ones by ingest, inspect, search, check, `pager sessions` and `GET /sessions`;
`pager sessions` reads them from the home's cache while nothing changed (without importing LanceDB) and
sees every later write."""

import json
import os
import subprocess
import sys

from typer.testing import CliRunner

from pager.cli.app import app
from pager.embed import HashEmbedder
from pager.home import Home

from conftest import DEMO, ENV, hash_config, ingest_file, ingest_lines, listed_sessions


runner = CliRunner()


def test_ingest_counts_the_open_page_as_chat_and_check_do(tmp_path):
    """`pager ingest` of three lines said "3 turns, 0 pages", while chat says "on 1 page" and /pages lists
    p1: where did my turns go?"""
    (tmp_path / "a.jsonl").write_text('{"speaker": "Ann", "text": "hello"}\n{"speaker": "Bob", "text": "hi"}\n')
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(tmp_path / "a.jsonl"), "-s", "a"], env=ENV)
    assert "a: 2 new turns → 2 turns on 1 page (p1 open)" in result.output, result.output


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


def _inspected(home, session: str) -> tuple[int, int]:
    result = runner.invoke(app, ["--home", str(home), "inspect", "-s", session, "--json"], env=ENV)
    body = json.loads(result.output)
    return body["turns"], body["pages"]


def _cache_files(home):
    return list((home / "cache").glob("*.sessions"))


def test_sessions_counts_the_open_page_as_inspect_does(tmp_path):
    """`pager sessions` showed 0 pages for a session whose two turns were on its open tail page, and one
    page fewer than `pager inspect` for every other: it counted sealed pages only. Pages are counted as
    inspect counts them, the open page with them, from the listing cache and from the store alike (a
    last turn longer than a page ends on a sealed page and goes on on the open one)."""
    home = tmp_path / "h"
    ingest_lines(home, "tiny", [{"speaker": "ann", "text": "hello there"}, {"speaker": "bob", "text": "hi"}])
    runner.invoke(app, ["--home", str(home), "ingest", str(DEMO), "-s", "maya"], env=ENV)
    ingest_lines(home, "long", [{"speaker": "ann", "text": "short one"},
                           {"speaker": "bob", "text": " ".join(f"word{i}" for i in range(400))}])
    expected = {name: _inspected(home, name) for name in ("tiny", "maya", "long")}
    assert expected["tiny"] == (2, 1) and expected["maya"] == (390, 70) and expected["long"][1] > 2
    assert _cache_files(home)
    assert listed_sessions(home) == expected            # from the listing cache
    for cache in _cache_files(home):
        cache.unlink()
    assert listed_sessions(home) == expected            # from the store


def test_sessions_answers_from_the_home_without_lancedb_and_sees_every_later_write(tmp_path):
    """`pager sessions` took ~4 s: it imported LanceDB to list two sessions. While nothing was written
    since the last process closed, the listing comes from the home's cache and the lock files; a turn
    a live process holds, a session another home wrote into this store, and a deleted cache are all
    seen (from the store, then)."""
    home = tmp_path / "h"
    ingest_lines(home, "a", [{"speaker": "ann", "text": "the venue is Lisbon"}])
    ingest_lines(home, "b", [{"speaker": "bob", "text": "the date is May 4"}])
    listing = ("import json, sys\nfrom pager.cli.app import app\ntry:\n    app(['--home', sys.argv[1], 'sessions', "
               "'--json'])\nexcept SystemExit:\n    pass\nprint(json.dumps('lancedb' in sys.modules))\n")

    def listed_alone() -> tuple[dict, bool]:
        out = subprocess.run([sys.executable, "-c", listing, str(home)], capture_output=True, text=True,
                             env={**os.environ, **ENV}, check=True).stdout.splitlines()
        rows = {r["session"]: (r["turns"], r["pages"]) for r in json.loads(out[0])["sessions"]}
        return rows, json.loads(out[1])

    assert listed_alone() == ({"a": (1, 1), "b": (1, 1)}, False)
    live = Home(hash_config(home), embedder=HashEmbedder())      # a chat still open: its turn is in the journal
    live.open("a").append("ann", "and the caterer is Marco")
    assert listed_alone()[0] == {"a": (2, 1), "b": (1, 1)}
    live.close()
    assert listed_alone() == ({"a": (2, 1), "b": (1, 1)}, False)
    with Home(hash_config(tmp_path / "other", db=str(home / "db")), embedder=HashEmbedder()) as other:
        other.open("c").append("cy", "written by another home into this store")
    assert listed_alone()[0] == {"a": (2, 1), "b": (1, 1), "c": (1, 1)}
    for cache in _cache_files(home):
        cache.unlink()
    assert listed_alone()[0] == {"a": (2, 1), "b": (1, 1), "c": (1, 1)}


def test_serve_lists_sessions_with_the_open_page(tmp_path):
    """`GET /sessions` counted sealed pages only, for sessions open in the server and the others alike."""
    from test_serve import Running

    ingest_lines(tmp_path, "closed", [{"speaker": "ann", "text": "hello there"}])
    running = Running(tmp_path)
    try:
        with running.http() as http:
            http.post("/sessions/open/turns", json={"messages": [{"role": "user", "content": "hi"}]})
            rows = {r["session"]: (r["turns"], r["pages"]) for r in http.get("/sessions").json()["data"]}
            assert rows == {"closed": (1, 1), "open": (1, 1)}
            assert http.get("/sessions/open").json()["pages"] == 1
    finally:
        running.stop()


def test_inspect_counts_the_open_page_as_its_json_and_sessions_do(tmp_path):
    """`pager inspect` printed "394 turns, 70 pages on disk" where `inspect --json`, `pager sessions`,
    `pager check` and the chat banner all said 71: the open page, holding the last turns, was left out
    of the one line a newcomer reads first. It says "71 pages (p71 open)" now, as ingest does."""
    lines = "".join(json.dumps({"speaker": "ann", "text": f"note {i} " + "word " * 30}) + "\n" for i in range(12))
    assert ingest_file(tmp_path, "notes.jsonl", lines, "-s", "s").exit_code == 0
    home = ["--home", str(tmp_path / "home")]
    shown = json.loads(runner.invoke(app, [*home, "inspect", "-s", "s", "--json"], env=ENV).stdout)
    assert shown["pages"] > 1
    header = runner.invoke(app, [*home, "inspect", "-s", "s"], env=ENV).output.splitlines()[0]
    assert f"{shown['pages']} pages ({shown['tail']} open)" in header, header


def test_check_of_a_one_page_session_says_one_page(tmp_path):
    """`pager check` said "1 turns, 1 pages (the last the open tail, 1 turn(s))"."""
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"speaker": "Maya", "text": "hello there"}) + "\n")
    home = ["--home", str(tmp_path / "h")]
    assert runner.invoke(app, [*home, "ingest", str(data), "-s", "x"]).exit_code == 0
    result = runner.invoke(app, [*home, "check", "-s", "x"])
    assert result.exit_code == 0, result.output
    assert "session 'x': 1 turn, 1 page (the last the open tail, 1 turn): ok" in result.output
