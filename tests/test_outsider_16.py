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
