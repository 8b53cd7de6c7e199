"""What an outside tester found in a first hour (fresh clone, fresh venv, README only), each driven the
way the tester did."""

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import InputError
from pager.home import Home
from conftest import ENV

runner = CliRunner()


def _home(path, **kw) -> Home:
    return Home(Config(home=path, budget=2048, embedder="hash", **kw), embedder=HashEmbedder())


def test_a_session_opened_and_left_unwritten_is_not_made(tmp_path):
    """`printf 'hi\\n' | pager chat -s x/y` was refused at its message, yet the chat's close stored the
    page table of the session it had opened; the next `pager chat -s x/y` found the session settled and
    took the name the README says is refused. Opening writes nothing: the name is still refused, and
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


def test_replay_under_the_recorded_policy_changes_no_context(tmp_path):
    """`pager replay TRACE` (no --policy) printed `clock* … contexts changed 7/9` for a chat trace that
    `pager replay TRACE --check` reproduced exactly: the recorded policy was replayed as a what-if, its
    CLOCK hand restarted at frame 0, so the row meant to be the recording was not. Here the session's
    hand has moved (weeks appended under a small budget evict) before the traced questions."""
    import json

    from pager.agent import Agent
    from pager.model import HandlerModel
    from pager.offline import OfflineShell
    from pager.trace import TraceWriter, begin
    from conftest import DEMO

    lines = [json.loads(line) for line in DEMO.read_text().splitlines()]
    trace = tmp_path / "chat.jsonl"
    with Home(Config(home=tmp_path / "h", budget=4096, embedder="hash"), embedder=HashEmbedder()) as home:
        session = home.open("maya")
        for i in range(0, len(lines), 11):
            session.append_many(lines[i:i + 11])
        assert session.policy.hand != 0
        writer = TraceWriter(trace)
        session.events.listeners.append(writer)
        agent = Agent(session, HandlerModel(OfflineShell()))
        begin(session, "pager/offline", agent.budget)
        for question in ("Who is allergic to peanuts?", "When does Priya start?", "What did we pick for sync?"):
            agent.ask(question)
        writer.close()
    assert runner.invoke(app, ["replay", str(trace), "--check"], env=ENV).exit_code == 0
    for args in ([], ["--policy", "clock"], ["--policy", "all"]):
        result = runner.invoke(app, ["replay", str(trace), *args], env=ENV)
        assert result.exit_code == 0, result.output
        row = next(line for line in result.output.splitlines() if "clock*" in line)
        changed = row.split("│")[5].strip()
        assert changed.startswith("0/"), (args, row)


def test_a_model_name_no_provider_answers_to_is_refused_before_the_chat_starts(tmp_path):
    """`pager chat --model nosuchmodel-xyz` opened the REPL, and every message then came back as
    "(no answer: … LLM Provider NOT provided …)"; `--memory-model foo` said so on every sealed batch.
    A name litellm cannot route is refused in one line, naming the way out."""
    home = str(tmp_path / "h")
    for option in ("--model", "--memory-model", "--bookmark-model"):
        result = runner.invoke(app, ["--home", home, "chat", "--session", "s", option, "nosuchmodel-xyz"],
                               input="hello\n", env=ENV)
        assert result.exit_code == 1, (option, result.output)
        assert "you>" not in result.output and "provider/model" in result.output, (option, result.output)
        assert "Traceback" not in result.output


def test_a_routable_model_name_passes_the_check(monkeypatch):
    from pager.llm import LiteLLMModel

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    LiteLLMModel("openai/my-local-model").check()   # a provider litellm knows, its key set: not refused
    LiteLLMModel("gpt-4o-mini").check()


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
    tier_rows = [line for line in table.split("in the memory tiers")[1].splitlines() if line.startswith("│ summary")]
    assert tier_rows and all("weak" in line for line in tier_rows), table


def test_replay_and_trace_show_say_what_is_wrong_with_the_file_they_were_given(tmp_path):
    """`pager --home DIR replay missing.jsonl` sent the user to `ls ~/.pager/traces`, not DIR's traces;
    `pager replay conv.jsonl` (a conversation) said "an event needs a 'kind'; fix or delete that line";
    `pager trace show T --step 99` said "fewer than 99 model calls" without saying how many there are."""
    from conftest import chat

    home = tmp_path / "h"
    missing = runner.invoke(app, ["--home", str(home), "replay", str(tmp_path / "missing.jsonl")], env=ENV)
    assert missing.exit_code == 2 and f"ls {home / 'traces'}" in missing.output, missing.output
    shown = runner.invoke(app, ["--home", str(home), "trace", "show", str(tmp_path / "missing.jsonl")], env=ENV)
    assert shown.exit_code == 2 and f"ls {home / 'traces'}" in shown.output, shown.output
    conversation = tmp_path / "conv.jsonl"
    conversation.write_text('{"speaker": "Ann", "text": "hello", "date": "8 May 2023"}\n')
    wrong = runner.invoke(app, ["--home", str(home), "replay", str(conversation)], env=ENV)
    assert wrong.exit_code == 2 and "pager ingest" in wrong.output and "fix or delete" not in wrong.output, wrong.output
    chat(home, ["hello there", "what did I say?"], session="s")
    trace = next((home / "traces").glob("s-chat-*.jsonl"))
    far = runner.invoke(app, ["--home", str(home), "trace", "show", str(trace), "--step", "99"], env=ENV)
    calls = trace.read_text().count('"kind":"model_request"')
    assert far.exit_code == 1 and f"has {calls} model calls" in far.output and f"--step 1 to {calls}" in far.output, far.output


def test_ingest_says_which_dates_it_cannot_read_and_what_a_plain_text_file_needs(tmp_path):
    """A line dated "31 Feb 2023" or "yesterday" was taken without a word and dated the day it was
    imported (its header still saying 31 Feb 2023, so "what happened in February 2023?" cannot find it);
    a plain text file was refused with "line 1: not JSON (Expecting value); fix that line"."""
    home = str(tmp_path / "h")
    dated = tmp_path / "dated.jsonl"
    dated.write_text('{"speaker": "Ann", "text": "fine", "date": "8 May 2023"}\n'
                     '{"speaker": "Ann", "text": "odd", "date": "31 Feb 2023"}\n'
                     '{"speaker": "Ann", "text": "vague", "date": "yesterday"}\n'
                     '{"speaker": "Ann", "text": "exact", "date": "someday", "ts": 1683547200}\n')
    result = runner.invoke(app, ["--home", home, "ingest", str(dated), "-s", "d"], env=ENV)
    assert result.exit_code == 0, result.output
    assert f"{dated}:2: date '31 Feb 2023'" in result.output and "2 lines" in result.output, result.output
    assert '"ts"' in result.output
    plain = tmp_path / "notes.txt"
    plain.write_text("Ann: hi there\nBob: the code word is platypus\n")
    refused = runner.invoke(app, ["--home", home, "ingest", str(plain), "-s", "p"], env=ENV)
    assert refused.exit_code == 2 and '{"speaker": ' in refused.output and "fix that line" not in refused.output, refused.output
    one_bad = tmp_path / "one_bad.jsonl"
    one_bad.write_text('{"speaker": "Ann", "text": "fine"}\nnot json at all\n')
    refused = runner.invoke(app, ["--home", home, "ingest", str(one_bad), "-s", "p"], env=ENV)
    assert refused.exit_code == 2 and f"{one_bad}:2: not JSON" in refused.output and "fix that line" in refused.output


def test_summaries_with_a_key_it_does_not_have_says_so(maya, tmp_path):
    """`/summaries nokey` printed an empty table, where `/state nokey` says the state has no such key and
    names its keys; the ids the table shows (s1, s2 …) were not taken either."""
    import shutil

    from conftest import chat

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    assert runner.invoke(app, ["--home", str(home), "summarize", "-s", "maya"], env=ENV).exit_code == 0
    out = " ".join(chat(home, ["/summaries nokey", "/summaries s1"]).split())
    assert "no summary has the key 'nokey'" in out and "rolling" in out, out
    assert "summary 'e1': every version" in out and "│ s1 " in out, out


def test_a_store_of_another_vector_size_names_the_embedders_of_its_size(tmp_path):
    """`pager demo --keep D` (the demo keeps its own embedder) then `PAGER_EMBEDDER=hash pager --home D chat
    -s demo`: "set PAGER_EMBEDDER to the embedder it was made with", which the user never chose."""
    home = tmp_path / "h"
    (tmp_path / "a.jsonl").write_text('{"speaker": "Ann", "text": "hello"}\n')
    assert runner.invoke(app, ["--home", str(home), "ingest", str(tmp_path / "a.jsonl"), "-s", "a"],
                         env=ENV).exit_code == 0   # the hashing embedder: 256-dim
    result = runner.invoke(app, ["--home", str(home), "search", "hello", "-s", "a"], env={"PAGER_EMBEDDER": "wordllama"})
    assert result.exit_code != 0 and "PAGER_EMBEDDER=hash" in result.output and "wordllama:256" in result.output, result.output


def test_ingest_reads_standard_input_from_a_dash(tmp_path):
    """`… | pager ingest - -s a` said "no file at -; check the path"."""
    home = str(tmp_path / "h")
    result = runner.invoke(app, ["--home", home, "ingest", "-", "-s", "a"], env=ENV,
                           input='{"speaker": "Ann", "text": "hello"}\n{"speaker": "Bob", "text": "hi"}\n')
    assert result.exit_code == 0 and "a: 2 new turns" in result.output, result.output
    bad = runner.invoke(app, ["--home", home, "ingest", "-", "-s", "a"], env=ENV, input="not json\n")
    assert bad.exit_code == 2 and "<stdin>:1: not JSON" in bad.output, bad.output


def test_demo_keep_on_a_file_names_the_keep_option(tmp_path):
    """`pager demo --keep FILE` said "pick a folder with --home (or PAGER_HOME)": the demo has no --home."""
    file = tmp_path / "notes.txt"
    file.write_text("x")
    result = runner.invoke(app, ["demo", "--keep", str(file)], env=ENV)
    assert result.exit_code == 2 and "--keep" in result.output and "--home" not in result.output, result.output


def test_ingest_counts_the_open_page_as_chat_and_check_do(tmp_path):
    """`pager ingest` of three lines said "3 turns, 0 pages", while chat says "on 1 page" and /pages lists
    p1: where did my turns go?"""
    (tmp_path / "a.jsonl").write_text('{"speaker": "Ann", "text": "hello"}\n{"speaker": "Bob", "text": "hi"}\n')
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(tmp_path / "a.jsonl"), "-s", "a"], env=ENV)
    assert "a: 2 new turns → 2 turns on 1 page (p1 open)" in result.output, result.output
