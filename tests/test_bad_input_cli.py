"""More bad input an outside tester found: each is one line naming the fix, never a traceback."""

import json
import socket

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.errors import InputError
from pager.formats import parse_jsonl

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
    rows = [line for line in first.output.splitlines() if "free" in line and "│" in line]
    assert len(rows) == 1 and "│   1–2 │" in rows[0], first.output   # 3 frames: the tail's, one row for two free
    again = runner.invoke(app, home, env=ENV, input="/stats\n/quit\n")
    assert "resumed with 4 turns on 1 page ·" in " ".join(again.output.split()), again.output
    assert "session: 4 turns on 1 page" in " ".join(again.output.split())


def test_escape_codes_typed_into_a_chat_are_not_sent_back_to_the_terminal(tmp_path):
    result = runner.invoke(app, ["--home", str(tmp_path / "h"), "chat", "-s", "esc"], env=ENV,
                           input="My code word is \x1b[31mred\x1b[0m and \x1b[2J.\nWhat is my code word?\n/quit\n")
    assert result.exit_code == 0, result.output
    reply = result.output.split("What is my code word?")[-1]
    assert "red" in reply and "\x1b" not in reply, repr(reply)
