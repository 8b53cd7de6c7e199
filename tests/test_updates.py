"""A value updated in plain text is answered with the new value; asked what it was before, the old one.

Found in a newcomer's first hour: "The product launch is on March 3." … "Update: the product launch
moved to April 10." … "When is the product launch?" was answered "March 3": the shorter first
statement ranked above the update (BM25's length norm), automatic paging faulted its page and
evicted the update's, and the offline shell quoted the best-matching line, the old one."""

import json

import pytest
from hypothesis import given, settings, strategies as st
from typer.testing import CliRunner

from pager.cli.app import app

from conftest import ENV, answers, chat

FILLER = [
    "I had pasta with mushrooms for lunch, it was good.",
    "Next week my sister visits from Lisbon with her kids.",
    "We should book the team offsite venue before the end of the month.",
    "The quarterly report needs two more charts about churn.",
    "Remind me to water the ferns on the balcony.",
    "The new intern starts on Monday and needs a laptop.",
    "Our team retro ran long again, mostly about flaky tests.",
    "I finished reading the novel about the lighthouse keeper.",
]
# (first statement, its update, a question about the value now, the new value, the old value, a question about before)
VALUES = [
    ("The product launch is on March 3.", "Update: the product launch moved to April 10.",
     "When is the product launch?", "April 10", "March 3", "When was the product launch planned before?"),
    ("Dana lives on Elm Street in Leeds.", "Dana moved to Bristol last month; she lives near the harbour now.",
     "Where does Dana live?", "Bristol", "Leeds", "Where did Dana live before?"),
    ("The grant application deadline is May 15.", "The grant application deadline was pushed back to June 1.",
     "What is the grant application deadline?", "June 1", "May 15", "What was the grant application deadline before?"),
    ("Grandpa takes 5 mg of amlodipine every morning.", "The doctor changed grandpa's amlodipine to 10 mg a day.",
     "How much amlodipine does grandpa take?", "10 mg", "5 mg", "How much amlodipine did grandpa take before?"),
]


def conversation() -> list[str]:
    """Every first statement, filler, then every update, more filler: the updates are pages later."""
    return [v[0] for v in VALUES] + FILLER + [v[1] for v in VALUES] + FILLER[::-1]


@pytest.fixture(scope="module")
def told(tmp_path_factory):
    home = tmp_path_factory.mktemp("updates")
    chat(home, conversation(), session="u")
    return home


@pytest.mark.parametrize("budget", ["1024", "8192"])
def test_the_shell_answers_the_updated_value(told, tmp_path, budget):
    import shutil

    home = tmp_path / "h"
    shutil.copytree(told, home)
    questions = [v[2] for v in VALUES]
    replies = answers(chat(home, questions, "--budget", budget, session="u"))
    assert len(replies) == len(VALUES)
    for (_, update, _, new, old, _), reply in zip(VALUES, replies):
        assert update in reply and new in reply and old not in reply, (budget, reply)


@pytest.mark.parametrize("budget", ["1024", "8192"])
def test_asked_what_it_was_before_the_shell_answers_the_old_value(told, tmp_path, budget):
    import shutil

    home = tmp_path / "h"
    shutil.copytree(told, home)
    replies = answers(chat(home, [v[5] for v in VALUES], "--budget", budget, session="u"))
    for (first, _, _, _, old, _), reply in zip(VALUES, replies):
        quoted = reply.split(" Also ")[0]   # the first quote answers; a second may give the update beside it
        assert reply.startswith("From ") and first in quoted and old in quoted, (budget, reply)


def _search(home, query: str) -> list[dict]:
    result = CliRunner().invoke(app, ["--home", str(home), "search", query, "-s", "u", "-k", "5", "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["results"]


def test_search_ranks_the_update_first_and_keeps_the_old_value_findable(told):
    for first, update, now, _, _, before in VALUES:
        found = _search(told, now)
        assert update in found[0]["snippet"], (now, found[:2])
        assert any(first in r["snippet"] for r in found), (now, found)   # the old value is still a hit
        assert any(first in r["snippet"] for r in _search(told, before)[:2]), before


def test_a_trace_of_updates_replays_exactly_and_needs_its_recorded_setting(tmp_path):
    """The ranking is recorded as a setting (session_start's config "supersede"): a trace made with it
    replays exactly; read as a trace from before it (the key removed), the searches come out otherwise,
    which is why replay runs traces without the key with the ranking off."""
    home = tmp_path / "h"
    chat(home, conversation() + [v[2] for v in VALUES], "--budget", "1024", session="u")
    trace = next((home / "traces").glob("u-*.jsonl"))
    replayed = CliRunner().invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--check"], env=ENV)
    assert replayed.exit_code == 0, replayed.output
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    start = next(e for e in lines if e["kind"] == "session_start")
    assert start["config"]["supersede"] is True
    del start["config"]["supersede"]
    older = tmp_path / "older.jsonl"
    older.write_text("".join(json.dumps(e) + "\n" for e in lines))
    diverged = CliRunner().invoke(app, ["--home", str(tmp_path / "r"), "replay", str(older), "--check"], env=ENV)
    assert diverged.exit_code == 1 and "diverged" in diverged.output, diverged.output


def _update_terms_by_regex_alone(text: str) -> tuple[str, ...]:
    from pager.search import _SENTENCE, UPDATE_CUE, terms

    if UPDATE_CUE.search(text) is None:
        return ()
    return tuple(t for sentence in _SENTENCE.split(text) if UPDATE_CUE.search(sentence) for t in terms(sentence))


_WORDS = ["Update:", "update", "the", "launch", "moved", "to", "April", "now", "is", "NOW", "now's", "it's", "no",
          "longer", "instead", "of", "pushed", "back", "cancelled", "Cut", "until", "know", "snow", "nowhere", "é",
          "now_x", "now2", "’s", "Dana’s", "called", "off", "changed", "change", "plans", "deadline", "10", "mg"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_WORDS), max_size=14), st.lists(st.sampled_from([" ", ". ", ", ", "-", "'", ": ", "\n"]),
                                                               min_size=14, max_size=14))
def test_the_cue_word_check_skips_only_texts_the_cue_cannot_match(words, gaps):
    """update_terms looks for a cue only in texts holding one of its words: the same terms as the
    regex alone, on texts mixing cue words, near misses ("know", "now2", "now_x"), apostrophes and case."""
    from pager.search import update_terms

    text = "".join(w + g for w, g in zip(words, gaps))
    assert update_terms(text) == _update_terms_by_regex_alone(text), text


def test_a_cue_word_after_an_apostrophe_is_found():
    """Hypothesis found "the'cancelled": one token to the scan, two words to the cue's regex."""
    from pager.search import update_terms

    text = "the'cancelled meeting"
    assert update_terms(text) == _update_terms_by_regex_alone(text) != ()


@pytest.mark.parametrize("text, expected", [
    ("actually my city is now Lisbon", [("city", "Lisbon")]),
    ("Actually, my city is Lisbon.", [("city", "Lisbon")]),
    ("Oh, and my locker code is 4471", [("locker code", "4471")]),
    ("ok so my dose is now 20 mg", [("dose", "20 mg")]),
    ("Correction: my flight number is LH 402", [("flight number", "LH 402")]),
    ("btw remember that my locker code is 4471", [("locker code", "4471")]),
    ("actually I think my city is Lisbon", []),          # a hedge stays a hedge
    ("actually my sister is visiting next week", []),    # an event stays an event
])
def test_a_statement_after_a_word_of_talk_is_still_a_statement(text, expected):
    """`my city is Berlin`, then `actually my city is now Lisbon`: the shell answered "Noted — it's in
    memory" and kept Berlin, so "what is my city?" answered Berlin from the state."""
    from pager.state import parse_statements

    assert parse_statements(text) == expected


def test_asked_what_a_value_was_before_when_it_had_one_the_shell_says_so():
    """"what was my city before?" with one value in the state answered "From the state: city: Berlin",
    the value now given as the earlier one."""
    from pager.offline import OfflineShell

    system = "[state · 1 key]\n- city: Berlin (p71, 2 Dec 2026)\n"
    before = OfflineShell().answer("what was my city before?", system)
    assert "city: Berlin" in before and "no earlier value" in before, before
    now = OfflineShell().answer("what is my city?", system)
    assert now == "From the state: “city: Berlin (p71, 2 Dec 2026)”"


@pytest.mark.parametrize("first, update, now, before", [
    ("My home city is Paris.", "My home city is now Berlin.", "home city", "What was my home city before?"),
    VALUES[0][:3] + VALUES[0][5:],
])
def test_an_update_on_the_open_page_outranks_what_it_updates(tmp_path, first, update, now, before):
    """The update on the open page (not indexed until it is sealed) was matched by its words alone and
    scored below the page it updates: `pager search "home city"` listed "My home city is Paris." first
    and "My home city is now Berlin." second. An update on the open page ranks above the page it
    updates as a sealed one does, its line the snippet; asked what it was before, the old value first."""
    from conftest import ingest_lines

    ingest_lines(tmp_path, "u", [{"speaker": "Maya", "text": text, "date": "8 May 2023"}
                                 for text in [first, *FILLER, update]])
    found = _search(tmp_path, now)
    assert update in found[0]["snippet"] and found[0]["page"] == max((r["page"] for r in found), key=lambda n: int(n[1:])), found[:2]
    assert "update" in found[0]["signals"], found[0]
    assert any(first in r["snippet"] for r in found[1:]), found   # the old value is still a hit
    assert first in _search(tmp_path, before)[0]["snippet"], before
