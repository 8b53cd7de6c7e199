"""What outside testers found in their first hour (third round): the session listing, a pin on an
empty session, `pager serve`'s streamed requests, and a filler word taken for a keyword. Each is
driven the way the tester did."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import PageNotFound
from pager.home import Home
from conftest import DEMO, ENV

runner = CliRunner()


def _config(home, **kw) -> Config:
    return Config(home=home, embedder="hash", budget=2048, **kw)


def _ingest(home, session: str, lines: list[dict]) -> None:
    text = "".join(json.dumps(line) + "\n" for line in lines)
    result = runner.invoke(app, ["--home", str(home), "ingest", "-", "-s", session], input=text, env=ENV)
    assert result.exit_code == 0, result.output


def _listed(home) -> dict:
    result = runner.invoke(app, ["--home", str(home), "sessions", "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    return {r["session"]: (r["turns"], r["pages"]) for r in json.loads(result.output)["sessions"]}


def _inspected(home, session: str) -> tuple[int, int]:
    result = runner.invoke(app, ["--home", str(home), "inspect", "-s", session, "--json"], env=ENV)
    body = json.loads(result.output)
    return body["turns"], body["pages"]


def _cache_files(home):
    return list((home / "cache").glob("*.sessions"))


# -- 1. pager sessions --------------------------------------------------------------------------------
def test_sessions_counts_the_open_page_as_inspect_does(tmp_path):
    """`pager sessions` showed 0 pages for a session whose two turns were on its open tail page, and one
    page fewer than `pager inspect` for every other: it counted sealed pages only. Pages are counted as
    inspect counts them, the open page with them, from the listing cache and from the store alike (a
    last turn longer than a page ends on a sealed page and goes on on the open one)."""
    home = tmp_path / "h"
    _ingest(home, "tiny", [{"speaker": "ann", "text": "hello there"}, {"speaker": "bob", "text": "hi"}])
    runner.invoke(app, ["--home", str(home), "ingest", str(DEMO), "-s", "maya"], env=ENV)
    _ingest(home, "long", [{"speaker": "ann", "text": "short one"},
                           {"speaker": "bob", "text": " ".join(f"word{i}" for i in range(400))}])
    expected = {name: _inspected(home, name) for name in ("tiny", "maya", "long")}
    assert expected["tiny"] == (2, 1) and expected["maya"] == (390, 70) and expected["long"][1] > 2
    assert _cache_files(home)
    assert _listed(home) == expected            # from the listing cache
    for cache in _cache_files(home):
        cache.unlink()
    assert _listed(home) == expected            # from the store


def test_sessions_answers_from_the_home_without_lancedb_and_sees_every_later_write(tmp_path):
    """`pager sessions` took ~4 s: it imported LanceDB to list two sessions. While nothing was written
    since the last process closed, the listing comes from the home's cache and the lock files; a turn
    a live process holds, a session another home wrote into this store, and a deleted cache are all
    seen (from the store, then)."""
    home = tmp_path / "h"
    _ingest(home, "a", [{"speaker": "ann", "text": "the venue is Lisbon"}])
    _ingest(home, "b", [{"speaker": "bob", "text": "the date is May 4"}])
    listing = ("import json, sys\nfrom pager.cli.app import app\ntry:\n    app(['--home', sys.argv[1], 'sessions', "
               "'--json'])\nexcept SystemExit:\n    pass\nprint(json.dumps('lancedb' in sys.modules))\n")

    def listed_alone() -> tuple[dict, bool]:
        out = subprocess.run([sys.executable, "-c", listing, str(home)], capture_output=True, text=True,
                             env={**os.environ, **ENV}, check=True).stdout.splitlines()
        rows = {r["session"]: (r["turns"], r["pages"]) for r in json.loads(out[0])["sessions"]}
        return rows, json.loads(out[1])

    assert listed_alone() == ({"a": (1, 1), "b": (1, 1)}, False)
    live = Home(_config(home), embedder=HashEmbedder())      # a chat still open: its turn is in the journal
    live.open("a").append("ann", "and the caterer is Marco")
    assert listed_alone()[0] == {"a": (2, 1), "b": (1, 1)}
    live.close()
    assert listed_alone() == ({"a": (2, 1), "b": (1, 1)}, False)
    with Home(_config(tmp_path / "other", db=str(home / "db")), embedder=HashEmbedder()) as other:
        other.open("c").append("cy", "written by another home into this store")
    assert listed_alone()[0] == {"a": (2, 1), "b": (1, 1), "c": (1, 1)}
    for cache in _cache_files(home):
        cache.unlink()
    assert listed_alone()[0] == {"a": (2, 1), "b": (1, 1), "c": (1, 1)}


def test_serve_lists_sessions_with_the_open_page(tmp_path):
    """`GET /sessions` counted sealed pages only, for sessions open in the server and the others alike."""
    from test_serve import Running

    _ingest(tmp_path, "closed", [{"speaker": "ann", "text": "hello there"}])
    running = Running(tmp_path)
    try:
        with running.http() as http:
            http.post("/sessions/open/turns", json={"messages": [{"role": "user", "content": "hi"}]})
            rows = {r["session"]: (r["turns"], r["pages"]) for r in http.get("/sessions").json()["data"]}
            assert rows == {"closed": (1, 1), "open": (1, 1)}
            assert http.get("/sessions/open").json()["pages"] == 1
    finally:
        running.stop()


# -- 2. a pin on an empty session -----------------------------------------------------------------------
def test_a_pin_on_a_session_with_no_turns_is_refused_not_lost(tmp_path):
    """`/pin p1` on a new session said it was pinned, and the pin was gone after a restart: a session with
    no turns stores no page table. Its one page, the open page, holds nothing to keep resident, so the
    pin is refused, saying what to do; pinned once the page holds a turn, it stays pinned."""
    from pager.tools import Toolkit

    config = _config(tmp_path / "h", session="fresh")
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open()
        with pytest.raises(PageNotFound, match="holds nothing yet.*add what should stay resident first"):
            s.pin(1)
        assert not s.table[1].pinned
    with Toolkit(config=config) as memory:
        assert "holds nothing yet" in memory.call("pin", '{"page_id": "p1"}')   # the model is told, as text
    assert _listed(tmp_path / "h") == {}   # nothing was made of it
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open()
        s.append("ann", "My name is Ann and I am allergic to peanuts.")
        s.pin(1)
    with Home(config, embedder=HashEmbedder()) as home:
        assert home.open().table[1].pinned


# -- 3. pager serve: stream ----------------------------------------------------------------------------
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


def test_a_streamed_request_for_a_session_another_host_holds_is_409_before_the_stream(tmp_path):
    """Streamed, a session another host was writing got HTTP 200, the role chunk, then an error event;
    unstreamed it was 409. Streamed it is the same 409 (`conflict_error`, `lease_held`), before any
    event; once the lease is free the same streamed request is answered."""
    from test_serve import Running

    store = str(tmp_path / "store")
    holder = Home(_config(tmp_path / "a", db=store), embedder=HashEmbedder())
    holder.open("shared").append("ann", "written on host a")
    b = Running(tmp_path / "b", config=Config(home=tmp_path / "b", db=store, embedder="hash"))
    ask = {"model": "offline", "stream": True, "messages": [{"role": "user", "content": "written on host b"}]}
    try:
        with b.http() as http:
            with http.stream("POST", "/v1/chat/completions", json=ask, headers={"X-Pager-Session": "shared"}) as r:
                body = r.read()
                assert r.status_code == 409, body
                assert r.headers["content-type"].startswith("application/json")
            error = json.loads(body)["error"]
            assert error["type"] == "conflict_error" and error["code"] == "lease_held"
            holder.close()
            with http.stream("POST", "/v1/chat/completions", json=ask, headers={"X-Pager-Session": "shared"}) as r:
                lines = [line for line in r.iter_lines() if line]
                assert r.status_code == 200
            assert '"role": "assistant"' in lines[0] and lines[-1] == "data: [DONE]"
            assert http.get("/sessions/shared").json()["turns"] == 3
    finally:
        b.stop()


# -- 4. a filler taken for a keyword --------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    "Nate: They're actually competitors in the tournament, and he is allergic to shellfish.",
    "Joanna: Actually I've discovered my favorite icecream place near the harbour.",
    "Gina: Dancing seriously makes me happy, it is important to express yourself.",
])
def test_a_discourse_filler_is_not_a_bookmark_keyword(text):
    """The offline extractor bookmarked pages under "actually" (a long word, so "rare"), which names
    nothing a question asks about, in place of a word of the page."""
    from pager.bookmarks import extract

    keywords = [k.lower() for k in extract(text)]
    assert not {"actually", "actually i've", "seriously"} & set(keywords), keywords
    assert any(word in keywords for word in ("allergic", "icecream", "express")), keywords


def test_a_command_without_a_session_names_the_ones_the_home_holds(tmp_path):
    """After `pager demo --keep DIR`, `pager --home DIR search …` looked for the session "default" and
    said only that `pager sessions` lists what is there: it now names the session to add."""
    home = tmp_path / "h"
    _ingest(home, "demo", [{"speaker": "ann", "text": "I have a peanut allergy."}])
    result = runner.invoke(app, ["--home", str(home), "search", "peanut allergy"], env=ENV)
    assert result.exit_code != 0 and "it holds 'demo': add --session demo" in result.output, result.output
    _ingest(home, "other one", [{"speaker": "ann", "text": "Another session."}])
    result = runner.invoke(app, ["--home", str(home), "search", "peanut allergy"], env=ENV)
    assert "it holds 2 sessions ('demo', 'other one'): name one with --session" in result.output, result.output
