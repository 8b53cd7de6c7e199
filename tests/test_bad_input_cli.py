"""Bad input on the command line (a name, a path, a value, a model, a file of the wrong kind): each is
one line naming the fix, never a traceback."""

import json
import socket

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.errors import InputError
from pager.formats import parse_jsonl
from conftest import ROOT

runner = CliRunner()
ENV = {"PAGER_EMBEDDER": "hash"}


def _one_line(result, code, *needles):
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, result.output


def test_serve_port_out_of_range_is_refused_by_the_option(tmp_path):
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "serve", "--port", "99999"])
    _one_line(result, 2, "--port", "65535")


def test_serve_on_a_port_in_use_says_so_and_never_claims_to_serve(tmp_path):
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    try:
        port = held.getsockname()[1]
        result = runner.invoke(app, ["--home", str(tmp_path / "h"), "serve", "--port", str(port)], env=ENV)
    finally:
        held.close()
    _one_line(result, 2, f"cannot listen on 127.0.0.1:{port}", "pick another --port")
    assert "pager serve on" not in result.output


@pytest.mark.parametrize("ts", ["1e20", "NaN", "-Infinity", "-5", "true", '"soon"'])
def test_a_ts_out_of_range_names_the_line_and_imports_nothing(tmp_path, ts):
    path = tmp_path / "f.jsonl"
    path.write_text('{"text": "fine", "ts": 1700000000}\n{"text": "bad", "ts": %s}\n' % ts)
    with pytest.raises(InputError, match=r"f.jsonl:2: \"ts\" must be seconds since the epoch, a number from 0"):
        parse_jsonl(path, "s")
    home = str(tmp_path / "h")
    result = runner.invoke(app, ["--home", home, "ingest", str(path)], env=ENV)
    _one_line(result, 2, "f.jsonl:2", "nothing was imported")
    assert "no sessions" in runner.invoke(app, ["--home", home, "sessions"], env=ENV).output


def test_ingest_with_pages_too_big_for_the_budget_names_a_fix_ingest_has(tmp_path):
    path = tmp_path / "f.jsonl"
    path.write_text('{"text": "hello"}\n')
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(path), "--page-tokens", "100000"], env=ENV)
    _one_line(result, 2, "lower --page-tokens", "PAGER_BUDGET")


def test_a_home_that_is_a_file_is_named_as_such(tmp_path):
    not_a_folder = tmp_path / "passwd"
    not_a_folder.write_text("root:x:0:0\n")
    for argv in (["sessions"], ["sessions", "--json"]):
        result = runner.invoke(app, ["--home", str(not_a_folder), *argv], env=ENV)
        assert result.exit_code != 0, result.output
        _one_line(result, result.exit_code, "is a file, not a folder", "--home")


def test_locomo_given_as_jsonl_hints_at_format_locomo(tmp_path):
    sample = {"sample_id": "c", "conversation": {"speaker_a": "a", "session_1": [{"speaker": "a", "text": "hi"}]},
              "qa": []}
    for content in (json.dumps([sample], indent=1), json.dumps([sample]), json.dumps(sample)):
        path = tmp_path / "locomo.json"
        path.write_text(content)
        result = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(path)], env=ENV)
        _one_line(result, 2, "--format locomo")
    path.write_text("[1, 2]\n")
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(path)], env=ENV)
    assert "--format locomo" not in result.output


def test_jsonl_given_as_locomo_says_to_drop_the_format(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text('{"text": "a"}\n{"text": "b"}\n')
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(path), "--format", "locomo"], env=ENV)
    _one_line(result, 2, "(JSONL), not a LoCoMo file", "without --format locomo")   # said "line 2: not JSON (Extra data)"


def test_a_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"speaker": "ann", "text": "hello"}\n')
    assert parse_jsonl(path, "s") == {"s": [{"speaker": "ann", "text": "hello", "role": "user", "date": "", "ref": ""}]}
    home = str(tmp_path / "h")
    result = runner.invoke(app, ["--home", home, "ingest", str(path), "--session", "s"], env=ENV)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command, env", [(["chat", "--budget", "99999999999"], {}),
                                          (["chat"], {"PAGER_BUDGET": "99999999999"})])
def test_a_budget_larger_than_any_model_is_refused_before_frames_are_made(tmp_path, command, env):
    """A budget of 10^11 tokens made a frame table of ~780M slots (20 GB, then an Arrow capacity
    traceback) before the chat could lower it to the model's window."""
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), *command], env={**ENV, **env}, input="/quit\n")
    _one_line(result, 2, "larger than any model's context window", "at most 10000000")


def test_version_and_out_of_range_counts(tmp_path):
    from pager import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"pager {__version__}"
    trace = str(next((__import__("conftest").ROOT / "traces").glob("*.jsonl")))
    _one_line(runner.invoke(app, ["trace", "show", trace, "--step", "0"]), 2, "--step")   # said "fewer than 0 model calls"
    _one_line(runner.invoke(app, ["--home", str(tmp_path / "h"), "inspect", "--pages", "-1"], env=ENV), 2, "--pages")


def test_a_pin_is_said_once(tmp_path):
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "chat", "-s", "x", "--budget", "1024"], env=ENV,
                           input="hello there\n/pin p1\n/unpin p1\n/quit\n")
    assert result.exit_code == 0, result.output
    said = [line.strip() for line in result.output.splitlines() if line.strip().endswith("pinned p1")]
    assert said == ["pinned p1", "unpinned p1"], result.output   # "pinned p1" was said twice, "unpinned" by the REPL only


def test_a_missing_key_of_a_well_known_provider_is_said_before_litellm_is_imported(tmp_path):
    """`pager chat --model gpt-4o-mini` without a key took ~8 s (litellm's import) to say the key is missing."""
    import subprocess
    import sys

    code = ("import os, sys\nos.environ.pop('OPENAI_API_KEY', None)\nfrom pager.llm import LiteLLMModel\nfrom pager.errors import ModelError\n"
            "try:\n    LiteLLMModel('gpt-4o-mini').check()\nexcept ModelError as exc:\n    print(exc)\n"
            "print('litellm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["model gpt-4o-mini needs OPENAI_API_KEY in the environment; set it, or run without --model for "
                   "the offline memory shell", "False"], out
    # the chat says it before it starts importing litellm beside opening the home (the check after waited for it)
    chat = ("import io, os, sys\nos.environ.pop('OPENAI_API_KEY', None)\nfrom pager.cli.chat import run\n"
            "from pager.config import Config\nfrom pager.errors import ModelError\n"
            f"try:\n    run(Config(home={str(tmp_path / 'h')!r}, model='gpt-4o-mini', embedder='hash'), io.StringIO('hi\\n'))\n"
            "except ModelError as exc:\n    print(exc)\nprint('litellm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", chat], capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[-1] == "False" and "needs OPENAI_API_KEY" in out[0], out


@pytest.mark.parametrize("args, needle", [(["--home", "", "sessions"], "the home is empty"),
                                          (["chat", "-s", ".."], "is a path step"),
                                          (["chat", "-s", "."], "is a path step")])
def test_an_empty_home_and_dot_sessions_are_refused(tmp_path, args, needle):
    """`--home ""` silently meant the current folder; sessions "." and ".." were made."""
    if args[0] != "--home":
        args = ["--home", str(tmp_path / "h"), *args]
    result = runner.invoke(app, args, env=ENV, input="hello\n/quit\n")
    assert needle in result.output, result.output
    assert "Traceback" not in result.output
    if args[-1] in (".", ".."):
        assert "no sessions" in runner.invoke(app, ["--home", str(tmp_path / "h"), "sessions"], env=ENV).output


def test_the_repl_says_pages_frames_and_calls_as_a_person_reads_them(tmp_path):
    """A one-page session: 'resumed with 2 turns, 0 pages' while /pages listed p1, /frames a row per free
    frame, /stats '0 prompt tokens per model call' before any call, a tool call's arguments as \\u escapes."""
    home = ["--home", str(tmp_path / "h"), "chat", "-s", "y", "--budget", "1024"]
    first = runner.invoke(app, home, env=ENV, input="/stats\nhello\n¿Cuál es mi ciudad?\n/frames\n/quit\n")
    assert first.exit_code == 0, first.output
    said = " ".join(first.output.split())
    assert "no model call yet" in said and '"query": "¿Cuál es mi ciudad?"' in said and "\\u00bf" not in said
    rows = [line for line in first.output.splitlines() if line.split()[-1:] == ["free"] and "·" in line.split()[:2]]
    assert len(rows) == 1 and rows[0].split()[:2] == ["1–2", "·"], first.output   # 3 frames: the tail's, one row for two free
    again = runner.invoke(app, home, env=ENV, input="/stats\n/quit\n")
    assert "resumed with 4 turns on 1 page ·" in " ".join(again.output.split()), again.output
    assert "session: 4 turns on 1 page" in " ".join(again.output.split())


def test_escape_codes_typed_into_a_chat_are_not_sent_back_to_the_terminal(tmp_path):
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "chat", "-s", "esc"], env=ENV,
                           input="My code word is \x1b[31mred\x1b[0m and \x1b[2J.\nWhat is my code word?\n/quit\n")
    assert result.exit_code == 0, result.output
    reply = result.output.split("What is my code word?")[-1]
    assert "red" in reply and "\x1b" not in reply, repr(reply)


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


def test_a_routable_model_name_is_not_refused(monkeypatch):
    from pager.llm import LiteLLMModel

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    LiteLLMModel("openai/my-local-model").check()   # a provider litellm knows, its key set: not refused
    LiteLLMModel("gpt-4o-mini").check()


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


def test_keys_on_a_home_that_cannot_be_written_is_one_line(tmp_path):
    """`pager keys create` on a read-only home was a traceback (OSError from the keys' lock file); a home
    under a file is the same failure without needing a read-only mount. One line naming --home now."""
    (tmp_path / "file").write_text("not a folder")
    home = str(tmp_path / "file" / "home")
    for args in (["keys", "create", "--tenant", "acme"], ["keys", "revoke", "3f9c2a7b1d04"]):
        result = CliRunner().invoke(app, ["--home", home, *args])
        assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.output, result.exception)
        assert "cannot write the keys" in result.output and "--home" in result.output, result.output


@pytest.mark.parametrize("args", [["--clients", "0"], ["--turns", "0"], ["--alone-turns", "0"], ["--shared", "-1"],
                                  ["--earlier", "-5"]])
def test_bench_serve_refuses_counts_it_cannot_measure_before_it_runs(tmp_path, monkeypatch, args):
    """`pager bench serve --clients 0` (or --alone-turns 0, or a negative count) ran the whole load and
    then died with ZeroDivisionError computing its ratios. Refused by the option, before anything runs."""
    import pager.bench.serve

    def runs(*a, **kw):
        raise AssertionError("the bench ran")

    monkeypatch.setattr(pager.bench.serve, "main", runs)
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "bench", "serve", *args])
    assert result.exit_code == 2 and args[0] in result.output, result.output


@pytest.mark.parametrize("args", [["locomo", "--conversations", "0"], ["locomo", "--conversations", "-1"],
                                  ["locomo", "--questions", "0"], ["trace", "--conversation", "c1", "--questions", "0"]])
def test_bench_locomo_and_trace_refuse_no_conversations_or_questions(tmp_path, args):
    """`pager bench locomo --conversations 0` (or -1, a slice from the end) died with KeyError 'pager'
    after loading the data; `--questions 0` printed a table of recall 0.000 and all_hit 1.000 over no
    question. Refused by the option."""
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps([{"sample_id": "c1", "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "My dog is called Coco."}]},
        "qa": [{"question": "What is Ann's dog called?", "answer": "Coco", "evidence": ["D1:1"], "category": 1}]}]))
    more = ["--out", str(tmp_path / "t.jsonl")] if args[0] == "trace" else ["--no-baselines"]
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "bench", args[0], "--data", str(data), *args[1:], *more],
                                env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 2 and ("--conversations" in result.output or "--questions" in result.output), result.output


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


def test_trace_show_html_with_step_is_refused_not_ignored(tmp_path):
    """`pager trace show T --step 3 --html t.html` wrote the whole timeline and said nothing of --step. The
    timeline has every call as a column and --step prints one call's context: the two are refused
    together, naming both views, and nothing is written."""
    out = tmp_path / "t.html"
    result = runner.invoke(app, ["trace", "show", str(ROOT / "traces" / "clock_vs_lru.jsonl"), "--step", "2",
                                 "--html", str(out)], env=ENV)
    assert result.exit_code == 2, result.output
    assert "--step" in result.output and "--html" in result.output and not out.exists()


def test_a_budget_too_small_for_chat_names_only_settings_chat_has(tmp_path):
    """`pager chat --budget 433` said "lower --page-tokens", an option chat does not take (ingest's
    page size for new sessions): it now says where that option is, beside PAGER_PAGE_TOKENS."""
    result = runner.invoke(app, ["--home", str(tmp_path), "chat", "-s", "x", "--budget", "433"], input="/quit\n", env=ENV)
    assert result.exit_code == 2, result.output
    assert "--page-tokens where the command has it (or PAGER_PAGE_TOKENS) to at most 127" in result.output
    assert runner.invoke(app, ["--home", str(tmp_path), "chat", "-s", "x", "--budget", "433"], input="/quit\n",
                         env={**ENV, "PAGER_PAGE_TOKENS": "127"}).exit_code == 0
