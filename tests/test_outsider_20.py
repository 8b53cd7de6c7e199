"""What an outside tester found in a first hour with pager, the 20th pass: the leftovers of the 19th
(a chat under the wrong PAGER_USER, `demo --keep` in a full folder, `trace show --html --step`, output
cut short by `| head` or a full disk), then what the hour itself turned up."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from typer.testing import CliRunner

from pager.cli.app import app

ENV = {"PAGER_EMBEDDER": "hash"}
ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _sessions(home) -> list[tuple[str, str]]:
    result = runner.invoke(app, ["--home", str(home), "sessions", "--json"], env=ENV)
    assert result.exit_code == 0, result.output
    return sorted((r["user"], r["session"]) for r in json.loads(result.stdout)["sessions"])


def test_chat_under_the_wrong_user_is_refused_naming_whose_the_session_is(tmp_path):
    """`PAGER_USER=alice pager ingest notes.jsonl -s notes`, then in a shell without the setting `pager chat
    -s notes`: the banner said "new session", and the first message started an empty session beside
    alice's. It is refused now (exit 2), naming alice and the setting; --new starts one all the same."""
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "the boat leaves at nine"}\n')
    home = ["--home", str(tmp_path / "home")]
    made = runner.invoke(app, [*home, "ingest", str(tmp_path / "one.jsonl"), "-s", "notes"], env={**ENV, "PAGER_USER": "alice"})
    assert made.exit_code == 0, made.output
    refused = runner.invoke(app, [*home, "chat", "-s", "notes"], input="when does the boat leave?\n", env=ENV)
    assert refused.exit_code == 2, refused.output
    assert "PAGER_USER=alice" in refused.output and "--new" in refused.output and "pager chat ·" not in refused.output
    assert _sessions(tmp_path / "home") == [("alice", "notes")]   # nothing was started
    started = runner.invoke(app, [*home, "chat", "-s", "notes", "--new"], input="hello\n", env=ENV)
    assert started.exit_code == 0 and "new session" in started.output, started.output
    assert _sessions(tmp_path / "home") == [("", "notes"), ("alice", "notes")]
    fresh = runner.invoke(app, [*home, "chat", "-s", "other"], input="hello\n", env=ENV)   # a name no one holds
    assert fresh.exit_code == 0 and "new session" in fresh.output, fresh.output


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


def test_trace_show_html_with_step_is_refused_not_ignored(tmp_path):
    """`pager trace show T --step 3 --html t.html` wrote the whole timeline and said nothing of --step. The
    timeline has every call as a column and --step prints one call's context: the two are refused
    together, naming both views, and nothing is written."""
    out = tmp_path / "t.html"
    result = runner.invoke(app, ["trace", "show", str(ROOT / "traces" / "clock_vs_lru.jsonl"), "--step", "2",
                                 "--html", str(out)], env=ENV)
    assert result.exit_code == 2, result.output
    assert "--step" in result.output and "--html" in result.output and not out.exists()


def _cut_short(args: list[str], home: Path) -> subprocess.CompletedProcess:
    """Run pager with a stdout whose reader has gone, as `| head` leaves it once it has read its lines."""
    read, write = os.pipe()
    os.close(read)   # every write now fails with EPIPE: no timing involved
    try:
        return subprocess.run([sys.executable, "-m", "pager.cli", *args], stdout=write, stderr=subprocess.PIPE,
                              timeout=120, env={**os.environ, **ENV, "PAGER_HOME": str(home)})
    finally:
        os.close(write)


def test_output_cut_short_by_head_exits_as_cat_does(tmp_path):
    """`pager export -s maya | head` exited 1, as a failure does (click's and rich's handlers of a broken
    pipe both exit 1). It exits 141 now, as `cat`, `seq` and `git log` cut short by a reader that went
    away do (128 + SIGPIPE), quietly, whether the command writes with echo or with rich."""
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "hello there"}\n')
    assert runner.invoke(app, ["--home", str(tmp_path), "ingest", str(tmp_path / "one.jsonl"), "-s", "s"], env=ENV).exit_code == 0
    for args in (["export", "-s", "s"], ["sessions"], ["tools"]):
        done = _cut_short(args, tmp_path)
        assert done.returncode == 141, (args, done.returncode, done.stderr.decode())
        assert not done.stderr.strip(), done.stderr.decode()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_output_to_a_full_disk_is_one_line_not_a_traceback(tmp_path):
    """`pager export -s maya > backup.jsonl` on a full disk (here /dev/full) printed a traceback ending in
    "OSError: [Errno 28] No space left on device"; every command writing stdout did."""
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "pager.cli", "tools"], stdout=full, stderr=subprocess.PIPE,
                              timeout=120, env={**os.environ, **ENV, "PAGER_HOME": str(tmp_path)})
    err = done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in err, err
    assert err.count("\n") == 1 and "No space left on device" in err and "free space" in err


INITIALIZE = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})


def test_ctrl_c_stops_pager_mcp_while_it_waits_for_a_client(tmp_path):
    """`pager mcp` started in a terminal to see what it does waits for JSON-RPC on stdin; Ctrl-C did nothing
    until a line or Ctrl-D came (stdin was read by a worker thread that the cancel and the exit wait
    for). Now the event loop waits on stdin, and Ctrl-C exits 130 at once. Every wait here has a
    timeout and the child is killed in any case, so the test cannot hang."""
    import queue
    import signal
    import threading

    env = {**os.environ, **ENV, "PAGER_HOME": str(tmp_path)}
    # Ctrl-C as a terminal's foreground process takes it: a test run started in the background (`.ci/run &`)
    # ignores SIGINT, and a child inherits that, so the child gives itself Python's handler first
    terminal = ("import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "sys.argv = ['pager', 'mcp', '-s', 'desk']; runpy.run_module('pager.cli', run_name='__main__')")
    proc = subprocess.Popen([sys.executable, "-c", terminal], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        proc.stdin.write(INITIALIZE.encode() + b"\n")
        proc.stdin.flush()
        assert json.loads(lines.get(timeout=120))["id"] == 1   # serving, and waiting for the next line
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)    # stdin stays open: before, this waited for a line that never came
        err = proc.stderr.read().decode()
        assert code == 130 and "interrupted" in err, (code, err)
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_pager_mcp_reads_a_file_or_dev_null_on_stdin(tmp_path):
    """The loop waits on a terminal or a pipe; a file on stdin (`pager mcp < requests.jsonl`), which it
    cannot wait on, is read as before, and /dev/null ends the server at once."""
    requests = tmp_path / "requests.jsonl"
    requests.write_text(INITIALIZE + "\n")
    env = {**os.environ, **ENV, "PAGER_HOME": str(tmp_path)}
    with open(requests) as stdin:
        done = subprocess.run([sys.executable, "-m", "pager.cli", "mcp"], stdin=stdin, capture_output=True,
                              timeout=120, env=env)
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[0])["id"] == 1, done.stderr.decode()
    done = subprocess.run([sys.executable, "-m", "pager.cli", "mcp"], stdin=subprocess.DEVNULL, capture_output=True,
                          timeout=120, env=env)
    assert done.returncode == 0 and not done.stdout, done.stderr.decode()


def test_ingest_refuses_an_empty_session_name_as_chat_does(tmp_path):
    """`pager ingest notes.jsonl -s "$NAME"` with NAME unset imported into 'default' and said so in passing,
    where `pager chat -s ""` refuses the name and `pager search -s ""` looks for a session ''. It is
    refused now, and nothing is imported."""
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "hello there"}\n')
    result = runner.invoke(app, ["--home", str(tmp_path / "home"), "ingest", str(tmp_path / "one.jsonl"), "-s", ""], env=ENV)
    assert result.exit_code == 2 and "--session '' is empty" in result.output, result.output
    assert _sessions(tmp_path / "home") == []


def test_migrate_of_a_home_that_is_not_there_is_refused_not_made(tmp_path):
    """`pager --home ~/.pagr migrate` (a typo) made a new, empty store there and said it was up to date.
    It is refused now, naming the settings, and nothing is made; a real home migrates as before."""
    typo = tmp_path / "typo"
    result = runner.invoke(app, ["--home", str(typo), "migrate"], env=ENV)
    assert result.exit_code == 2, result.output
    assert "no pager store" in result.output and "PAGER_HOME" in result.output
    assert not (typo / "db").exists()
    (tmp_path / "one.jsonl").write_text('{"speaker": "ann", "text": "hello there"}\n')
    home = ["--home", str(tmp_path / "home")]
    assert runner.invoke(app, [*home, "ingest", str(tmp_path / "one.jsonl")], env=ENV).exit_code == 0
    result = runner.invoke(app, [*home, "migrate"], env=ENV)
    assert result.exit_code == 0 and "up to date" in result.output, result.output
