"""A search always has nearest pages by meaning; for "xyzzy plugh" they are no answer (found in a
newcomer's first hour: k hits for nonsense read as "pager found something"). A hit holding no word of
the query, near it by meaning only below `weak_similarity`, is marked weak, a memory tier's hit as a
page's, and a search whose hits are all weak says that no page matches, in the CLI, its JSON, and the
search tool the model reads."""

import json

from typer.testing import CliRunner

from pager.cli.app import app
from pager.search import Hit, is_weak

from conftest import ENV

runner = CliRunner()


def _search(home, query: str, *args: str):
    result = runner.invoke(app, ["--home", str(home), "search", query, "-s", "maya", "-k", "5", *args], env=ENV)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_nonsense_query_matches_no_page(maya):
    found = json.loads(_search(maya, "xyzzy plugh", "--json"))
    assert found["results"], "the nearest pages are still listed, for a script to judge"
    assert all(r["weak"] is True for r in found["results"]), found["results"]
    assert {"kind", "page", "score", "signals", "date", "resident", "bookmarks", "snippet"} <= set(found["results"][0])
    shown = " ".join(_search(maya, "xyzzy plugh").split())
    assert "no page of session 'maya' matches 'xyzzy plugh' by its words" in shown and "weak" in shown, shown


def test_a_query_whose_words_a_page_holds_is_not_weak(maya):
    found = json.loads(_search(maya, "peanut allergy", "--json"))["results"]
    assert found[0]["page"] == "p5" and found[0]["weak"] is False, found[0]
    assert "no page of session" not in _search(maya, "peanut allergy")


def test_the_search_tool_tells_the_model_no_page_matches(maya):
    from pager.config import Config
    from pager.tools import Toolkit

    with Toolkit(config=Config(home=maya, embedder="hash", session="maya")) as memory:
        nonsense, real = memory.search("xyzzy plugh", k=3), memory.search("peanut allergy", k=3)
    assert nonsense.startswith("no page matches 'xyzzy plugh' by its words"), nonsense
    assert all(", weak" in line for line in nonsense.splitlines()[1:]), nonsense
    assert real.splitlines()[0].startswith("3 page(s) for 'peanut allergy'") and ", weak" not in real.splitlines()[1], real


def test_weak_is_no_word_no_other_match_and_a_low_similarity():
    near, far = Hit(3, 0.5, {"vector": 0.45}), Hit(4, 0.5, {"vector": 0.2, "episode": 0.2, "bm25": 1.5})
    assert not is_weak(near, False, 0.4)            # near enough by meaning alone
    assert is_weak(far, False, 0.4)                 # bm25 from the query's widened words is no match of its own
    assert not is_weak(far, True, 0.4)              # the page holds a word of the query
    assert not is_weak(Hit(5, 0.5, {"vector": 0.1, "bookmark": 0.3}), False, 0.4)
    assert not is_weak(Hit(6, 0.5, {"vector": 0.1, "date": 1.0}), False, 0.4)
    assert not is_weak(far, False, 0.0)             # weak_similarity 0: none is (traces recorded before it)


def test_tier_hits_near_by_meaning_only_are_marked_weak_like_pages(maya, tmp_path):
    """`pager search "xyzzy plugh"` said no page matches by its words and marked every page weak, then
    listed eight summaries "in the memory tiers" with scores, unmarked, as if they matched."""
    import json
    import shutil

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    assert runner.invoke(app, ["--home", str(home), "summarize", "-s", "maya"], env=ENV).exit_code == 0
    nothing = runner.invoke(app, ["--home", str(home), "search", "xyzzy plugh", "-s", "maya", "--json"], env=ENV)
    tiers = json.loads(nothing.output)["tiers"]
    assert tiers and all(t["weak"] for t in tiers if t["kind"] in ("fact", "summary")), tiers
    okta = json.loads(runner.invoke(app, ["--home", str(home), "search", "Okta", "-s", "maya", "--json"], env=ENV).output)
    hits = [t for t in okta["tiers"] if t["kind"] == "summary" and "Okta" in t["text"]]
    assert hits and not any(t["weak"] for t in hits)
    table = runner.invoke(app, ["--home", str(home), "search", "xyzzy plugh", "-s", "maya"], env=ENV,
                          terminal_width=200).output
    tier_rows = [line for line in table.split("in the memory tiers")[1].splitlines() if line.startswith("summary ")]
    assert tier_rows and all("weak" in line for line in tier_rows), table
