"""The command line: instant help (and `python -m pager`), ingest, inspect (--json, --pages), demo
(--keep), the chat's commands and `--model offline`, errors as one line."""

import json
import re
import subprocess
import sys

from typer.testing import CliRunner

from pager.cli.app import app
from conftest import ENV, chat, numbered_conversation

runner = CliRunner()


def test_help_is_instant_and_imports_nothing_heavy():
    code = "import sys, time; t=time.perf_counter(); from pager.cli.app import app; " \
           "print(time.perf_counter()-t, 'lancedb' in sys.modules, 'litellm' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[1:] == ["False", "False", "False"]
    # what --help itself loads, not how long it takes on a busy machine (measured ~0.1 s here)
    code = ("import sys; from pager.cli.app import main; sys.argv = ['pager', '--help']\ntry:\n    main()\n"
            "except SystemExit:\n    pass\n"
            "print([m for m in ('lancedb', 'litellm', 'numpy', 'pyarrow') if m in sys.modules], file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage" in done.stdout and done.stderr.strip().splitlines()[-1] == "[]", done.stderr[-500:]


def test_python_dash_m_pager_runs_the_command_line(tmp_path):
    """`python -m pager --help` said "'pager' is a package and cannot be directly executed"; the way to
    run pager from a virtual environment's Python without its `pager` script on PATH."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pager", "--help"], capture_output=True, text=True, timeout=120,
                          env={**__import__("os").environ, "PAGER_HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout and "demo" in done.stdout


def test_ingest_then_inspect_json(tmp_path):
    data = tmp_path / "conv.jsonl"
    lines = [json.dumps({"speaker": "ann" if i % 2 else "bob", "text": f"line {i} about topic {i % 5}"}) for i in range(120)]
    data.write_text("\n".join(lines) + "\n")
    home = str(tmp_path / "h")
    env = {"PAGER_EMBEDDER": "hash"}
    result = runner.invoke(app, ["--home", home, "ingest", str(data), "--session", "s1"], env=env)
    assert result.exit_code == 0, result.output
    assert "120 turns" in result.output
    result = runner.invoke(app, ["--home", home, "inspect", "--session", "s1", "--json"], env=env)
    assert result.exit_code == 0, result.output
    state = json.loads(result.output)
    for key in ("session", "turns", "pages", "frames", "resident", "pinned", "bookmarks", "faults", "evictions"):
        assert key in state
    assert state["session"] == "s1" and state["turns"] == 120 and state["pages"] > 3
    assert len(state["resident"]) <= state["frames"]
    result = runner.invoke(app, ["--home", home, "inspect", "--session", "s1"], env=env)
    assert result.exit_code == 0 and "page table" in result.output


def test_inspect_pages_limits_the_page_table_rows(tmp_path):
    """`pager inspect --pages N` ("page-table rows to show", default 40) showed every page: the count
    of the session's pages, printed in the heading, was kept in the option's own variable."""
    home = str(tmp_path / "h")
    assert runner.invoke(app, ["--home", home, "ingest", str(numbered_conversation(tmp_path / "c.jsonl", 60)), "-s", "s"],
                         env=ENV).exit_code == 0
    pages = json.loads(runner.invoke(app, ["--home", home, "inspect", "-s", "s", "--json"], env=ENV).output)["pages"]
    assert pages > 3
    shown = runner.invoke(app, ["--home", home, "inspect", "-s", "s", "--pages", "2"], env=ENV)
    assert shown.exit_code == 0 and f"page table ({pages} pages, showing 2)" in shown.output, shown.output


def test_bad_jsonl_names_the_line_and_imports_nothing(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"speaker": "a", "text": "fine"}\n{"speaker": "a", "text": \n')
    home = str(tmp_path / "h")
    result = runner.invoke(app, ["--home", home, "ingest", str(data)], env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 2
    assert "bad.jsonl:2" in result.output and "nothing was imported" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["--home", home, "inspect", "--json"], env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 1 and "no session 'default'" in result.output   # nothing was imported


def test_invalid_utf8_is_a_clear_error(tmp_path):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(b'{"speaker": "a", "text": "ok"}\n{"speaker": "a", "text": "caf\xe9"}\n')
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(data)], env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 2 and "latin1.jsonl:2: not valid UTF-8" in result.output


def test_demo_runs_offline_and_finds_the_old_facts(tmp_path):
    result = runner.invoke(app, ["demo", "--keep", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    assert "facts found in the prompt" in result.output
    assert "6 / 6" in result.output
    assert "394 / 394" in result.output    # the 390 turns of the file, and Maya's two statements with their replies
    said = " ".join(result.output.split())
    # the tiers: recorded facts with one superseded, the state the offline shell parsed, the value before
    assert "facts 14 written from the pages, 1 superseded" in said
    assert "f2 (5 Mar 2025 → 14 Jul 2025, superseded by f9, p2): The platform team has six engineers and one SRE." in said
    assert "state half marathon target: 1:40 (p71) · before: 1:45" in said
    assert "✓ p2 (5 March 2025) is in the prompt with the old value, which f2 marks superseded by f9" in said
    assert re.search(r"summaries \d+ episodes .* and a rolling summary of the whole session \(p1–p\d+\)", said)
    # what Maya said, not the assistant's replies, and not one theme twice
    assert re.search(r"- s\d+ \(e\d+ · p39–p40, 14 Jul 2025\): Maya: .*Priya Raman accepted the senior SRE", said)
    # the replay table's equal rows are explained, with the trace's own figures
    faults = re.search(r"^clock\* +(\d+) +\d+ +0\.0% +\S+ +(\d+) ", result.output, re.M)
    assert faults, result.output
    assert (f"so all fault the same {faults.group(1)} times (no hits)" in said
            and f"a clairvoyant policy would fault {faults.group(2)} times" in said)


def test_demo_keep_on_a_file_names_the_keep_option(tmp_path):
    """`pager demo --keep FILE` said "pick a folder with --home (or PAGER_HOME)": the demo has no --home."""
    file = tmp_path / "notes.txt"
    file.write_text("x")
    result = runner.invoke(app, ["demo", "--keep", str(file)], env=ENV)
    assert result.exit_code == 2 and "--keep" in result.output and "--home" not in result.output, result.output


def test_demo_keep_refuses_a_folder_of_other_files(tmp_path):
    """`pager demo --keep ~/work` built the demo's home (db, journal, locks, traces) among the files of a
    project folder. A folder that holds anything and is not a pager home is refused, naming the fix."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    result = runner.invoke(app, ["demo", "--keep", str(folder)], env=ENV)
    assert result.exit_code == 2, result.output
    assert "not a pager home" in result.output and "new or empty folder" in result.output
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


def test_search_shows_ranked_pages_with_signals(tmp_path):
    data = tmp_path / "conv.jsonl"
    lines = [json.dumps({"speaker": "ann", "text": f"filler {i} about lunch"}) for i in range(80)]
    lines.insert(40, json.dumps({"speaker": "bob", "text": "The wifi password at the cabin is moose-lake-42."}))
    data.write_text("\n".join(lines) + "\n")
    home = str(tmp_path / "h")
    env = {"PAGER_EMBEDDER": "hash"}
    assert runner.invoke(app, ["--home", home, "ingest", str(data)], env=env).exit_code == 0
    result = runner.invoke(app, ["--home", home, "search", "cabin wifi password", "-k", "3", "--json"], env=env)
    assert result.exit_code == 0, result.output
    top = json.loads(result.output)["results"][0]
    assert "moose-lake-42" in top["snippet"] and top["signals"]["bm25"] > 0
    result = runner.invoke(app, ["--home", home, "search", "cabin wifi password"], env=env)
    assert result.exit_code == 0 and "moose-lake-42" in result.output


def test_chat_through_piped_input_prints_frames_and_the_quoted_answer(tmp_path):
    home = str(tmp_path / "h")
    env = {**__import__("os").environ, "PAGER_EMBEDDER": "hash", "PAGER_HOME": home}
    conv = tmp_path / "c.jsonl"
    lines = [json.dumps({"speaker": "ann", "text": f"chit chat number {i} about the weather"}) for i in range(300)]
    lines.insert(3, json.dumps({"speaker": "maya", "text": "The spare key is under the blue flowerpot."}))
    conv.write_text("\n".join(lines) + "\n")
    subprocess.run([sys.executable, "-m", "pager.cli", "ingest", str(conv), "-s", "house"], env=env, check=True,
                   capture_output=True)
    script = "Where is the spare key?\n/frames\n/stats\n/quit\n"
    out = subprocess.run([sys.executable, "-m", "pager.cli", "chat", "-s", "house", "--budget", "2048"], env=env,
                         input=script, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "offline memory shell" in out.stdout
    assert "blue flowerpot" in out.stdout and "From p" in out.stdout
    assert "frames of session 'house'" in out.stdout and "faults" in out.stdout
    assert "Traceback" not in out.stderr
    traces = list((tmp_path / "h" / "traces").glob("house-*.jsonl"))
    kinds = [json.loads(line)["kind"] for line in traces[0].read_text().splitlines()]
    assert "model_request" in kinds and "tool_call" in kinds and "fault" in kinds
    assert "snapshot" in kinds  # the session was resumed: its earlier turns and paging state open the trace
    from pager.replay import replay

    assert replay(traces[0], check=True).divergence is None


def test_chat_through_clirunner(tmp_path):
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "chat", "-s", "x"],
                           input="Remember: the boat is called Saltire.\nWhat is the boat called?\n/frames\n/quit\n",
                           env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 0, result.output
    answer = result.output.split("What is the boat called?")[-1]
    assert "Saltire" in answer and "From p1" in answer
    assert "Noted" in result.output.split("What is the boat called?")[0]  # a statement is acknowledged
    assert "frames of session 'x'" in result.output


def test_chat_with_a_model_and_no_key_is_one_line(tmp_path):
    env = {k: v for k, v in __import__("os").environ.items() if not k.endswith("_API_KEY")}
    out = subprocess.run([sys.executable, "-m", "pager.cli", "--home", str(tmp_path / "h"), "chat", "--model",
                          "gpt-4o-mini"], input="hi\n", capture_output=True, text=True, timeout=120,
                         env={**env, "PAGER_EMBEDDER": "hash"})
    assert out.returncode != 0
    assert "OPENAI_API_KEY" in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_model_offline_is_the_offline_shell_in_chat_as_in_serve(tmp_path):
    """`pager serve` calls the offline shell `offline` (and takes PAGER_MODEL=offline); with that setting
    exported, or `--model offline`, `pager chat` refused to start: "model 'offline' names no provider
    litellm knows". It is the offline shell in both now."""
    home = ["--home", str(tmp_path)]
    for args, env in (([], {**ENV, "PAGER_MODEL": "offline"}), (["--model", "offline"], ENV)):
        result = runner.invoke(app, [*home, "chat", "-s", "s", *args], input="my locker code is 3141\n/quit\n", env=env)
        assert result.exit_code == 0, result.output
        assert "offline memory shell" in result.output and "pager>" in result.output, result.output


def test_a_policy_asked_for_wins_over_the_sessions_own(tmp_path):
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home

    cfg = Config(home=tmp_path / "h", embedder="hash", policy="clock")
    with Home(cfg, embedder=HashEmbedder()) as h:
        h.open("p").append("ann", "a turn")
    with Home(cfg.with_(policy="lru"), embedder=HashEmbedder()) as h:  # pager chat --policy lru
        assert h.open("p").policy.name == "lru"
    with Home(cfg.with_(policy=""), embedder=HashEmbedder()) as h:     # no --policy: the session's own
        assert h.open("p").policy.name == "lru"


def test_bare_policy_and_pin_commands_say_what_to_give(tmp_path):
    out = " ".join(chat(tmp_path, ["/policy", "/pin", "/unpin", "/policy lru", "/policy"], session="s").split())
    assert "policy clock; /policy NAME switches to one of clock, lru, lfu, scored" in out, out
    assert "usage: /pin PAGE" in out and "usage: /unpin PAGE" in out and "unknown policy ''" not in out
    assert "policy lru; /policy NAME" in out
    assert "page '' does not exist" not in out
    trace = next((tmp_path / "traces").glob("s-*.jsonl"))
    assert runner.invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--check"]).exit_code == 0


def test_a_folder_given_as_a_trace_is_one_line(tmp_path):
    for args in (["trace", "show", str(tmp_path)], ["replay", str(tmp_path), "--check"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "is a folder" in result.output, result.output
        assert "Traceback" not in result.output


def test_bare_check_checks_every_session_and_counts_pages_as_inspect_does(tmp_path):
    data = tmp_path / "conv.jsonl"
    data.write_text("".join(json.dumps({"speaker": "ann", "text": f"line {i} about topic {i % 5}"}) + "\n"
                            for i in range(61)))
    home = str(tmp_path / "h")
    env = {"PAGER_EMBEDDER": "hash"}
    assert runner.invoke(app, ["--home", home, "ingest", str(data), "-s", "one"], env=env).exit_code == 0
    assert runner.invoke(app, ["--home", home, "ingest", str(data), "-s", "two"], env=env | {"PAGER_USER": "acme"}
                         ).exit_code == 0
    result = runner.invoke(app, ["--home", home, "check"], env=env)   # no session named: the whole home
    assert result.exit_code == 0, result.output
    assert "session 'one'" in result.output and "session 'two' of user 'acme'" in result.output, result.output
    line = next(x for x in result.output.splitlines() if "session 'one'" in x)
    assert "open tail" in line and line.endswith("ok"), line
    pages = json.loads(runner.invoke(app, ["--home", home, "inspect", "-s", "one", "--json"], env=env).output)["pages"]
    assert f"61 turns, {pages} pages" in line, (line, pages)   # the open tail is a page in both


def test_check_counts_turns_only_a_journal_holds_apart_from_the_open_tail(tmp_path):
    """Turns a process has acknowledged and not yet flushed (a live one's, or a dead one's before the next
    writer recovers them) are on no stored page: check said "N pages (the last the open tail, 870 turns)"
    where inspect, which packs them, said hundreds of pages more."""
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home

    home = tmp_path / "h"
    cfg = Config(home=home, session="s", embedder="hash", flush_turns=10**6)
    with Home(cfg, embedder=HashEmbedder()) as h:
        s = h.open("s")
        s.append_many([{"speaker": "ann", "text": f"stored line {i} about topic {i % 5}"} for i in range(40)])
        h.flush()
        s.append_many([{"speaker": "ann", "text": f"journal line {i} about lunch and the weather"} for i in range(300)])
        result = runner.invoke(app, ["--home", str(home), "check", "-s", "s"], env={"PAGER_EMBEDDER": "hash"})
        stored_pages = len(h.store.pages("", "s", with_vectors=False)[0])
    assert result.exit_code == 0, result.output
    line = result.output.strip().splitlines()[0]
    assert line.startswith("session 's': 340 turns, "), line
    assert "300 turns only in this home's journal" in line and line.endswith("ok"), line
    tail = re.search(r"the open tail, (\d+) turns?\)", line)
    assert tail is None or int(tail.group(1)) < 40, line   # the stored tail only, not the journal's 300
    assert f"{stored_pages + (tail is not None)} pages" in line, (line, stored_pages)


def test_a_session_holding_only_a_working_state_is_listed_inspected_and_checked(tmp_path):
    """A state set through the library before any turn is kept, but no command admitted the session:
    `pager sessions` listed nothing and `inspect`, `search` and `check` said there was no such session."""
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home

    home, env = tmp_path / "h", {"PAGER_EMBEDDER": "hash"}
    with Home(Config(home=home, embedder="hash"), embedder=HashEmbedder()) as h:
        h.open("prefs").set_state("diet", "vegetarian")
        h.open("talk").append("ann", "a turn of another session")
    for _ in range(2):   # from the store, then from the listing cache the first listing may leave
        listed = runner.invoke(app, ["--home", str(home), "sessions", "--json"], env=env)
        assert listed.exit_code == 0, listed.output
        assert {(r["session"], r["turns"]) for r in json.loads(listed.output)["sessions"]} == {("prefs", 0), ("talk", 1)}
    shown = runner.invoke(app, ["--home", str(home), "inspect", "-s", "prefs", "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    found = runner.invoke(app, ["--home", str(home), "search", "diet", "-s", "prefs"], env=env)
    assert found.exit_code == 0 and "vegetarian" in found.output, found.output
    checked = runner.invoke(app, ["--home", str(home), "check", "-s", "prefs"], env=env)
    assert checked.exit_code == 0 and checked.output.strip().endswith("ok"), checked.output
    missing = runner.invoke(app, ["--home", str(home), "inspect", "-s", "nothing"], env=env)
    assert missing.exit_code != 0 and "no session 'nothing'" in missing.output, missing.output


def test_a_budget_from_the_environment_is_named_and_one_line_gets_no_rate(tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"speaker": "ann", "text": "hello there"}) + "\n")
    home = str(tmp_path / "h")
    result = runner.invoke(app, ["--home", home, "ingest", str(data)], env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 0 and "ingested 1 line into 1 session" in result.output, result.output
    assert "lines/s" not in result.output   # one line's rate would be start-up time, not ingest speed
    result = runner.invoke(app, ["--home", home, "search", "hello"], env={"PAGER_EMBEDDER": "hash", "PAGER_BUDGET": "-5"})
    assert result.exit_code != 0 and "PAGER_BUDGET" in result.output and "Traceback" not in result.output, result.output
