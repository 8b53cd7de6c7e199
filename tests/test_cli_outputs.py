"""Output paths (--json, --out, --html, --plot) that cannot be written are refused in one line before
any work, and a report whose write fails at the end is printed rather than lost; output cut short by a
reader that went away (`| head`) exits as `cat` does, and a full disk is one line."""

import json

import pytest
from typer.testing import CliRunner

from pager.cli import app as cli
from pager.cli.app import app
import os
import subprocess
import sys
from pathlib import Path
from conftest import ENV

runner = CliRunner()


def _one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.stderr.splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("pager: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("argv", [
    ["bench", "scale", "--pages", "1000"],
    ["bench", "serve", "--clients", "1", "--shared", "0", "--turns", "1"],
    ["bench", "locomo", "--data", "nowhere.json", "--no-baselines"],
])
def test_bench_refuses_an_unwritable_json_before_running(tmp_path, monkeypatch, argv):
    from pager.bench import locomo, scale, serve

    def ran(*a, **k):
        raise AssertionError("the bench ran before the --json path was checked")

    for module in (scale, serve, locomo):
        monkeypatch.setattr(module, "main" if module is not locomo else "run", ran)
    result = runner.invoke(app, argv + ["--json", str(tmp_path / "missing" / "x.json")])
    _one_line_error(result, "does not exist", "mkdir -p")
    result = runner.invoke(app, argv + ["--json", str(tmp_path)])
    _one_line_error(result, "is a folder")


def test_bench_scale_prints_the_report_when_the_final_write_fails(tmp_path, monkeypatch):
    from pager.bench import scale

    target = tmp_path / "r.json"
    monkeypatch.setattr(scale, "main", lambda *a, **k: {"pages": 1000, "marker": "kept"})

    def refuse(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli.Path, "write_text", refuse)
    result = runner.invoke(app, ["bench", "scale", "--pages", "1000", "--json", str(target)])
    assert result.exit_code == 0, result.output
    assert "No space left on device" in result.stderr and "report follows on stdout" in result.stderr
    assert result.stdout.count('"marker": "kept"') >= 1


def _session(tmp_path):
    data = tmp_path / "conv.jsonl"
    data.write_text("".join(json.dumps({"speaker": "ann", "text": f"line {i}"}) + "\n" for i in range(4)))
    home = str(tmp_path / "h")
    assert runner.invoke(app, ["--home", home, "ingest", str(data), "--session", "s"]).exit_code == 0
    return home


def test_export_to_a_missing_folder_or_a_folder_is_one_line_and_leaves_no_temp_file(tmp_path):
    home = _session(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    result = runner.invoke(app, ["--home", home, "export", "--session", "s", "--out", str(tmp_path / "no" / "x.jsonl")])
    _one_line_error(result, "does not exist")
    result = runner.invoke(app, ["--home", home, "export", "--session", "s", "--out", str(out_dir)])
    _one_line_error(result, "is a folder")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert list(out_dir.iterdir()) == []


def test_export_write_failure_removes_its_temp_file(tmp_path, monkeypatch):
    from pager import export
    from pager.errors import InputError

    home = _session(tmp_path)
    from pager.config import Config
    from pager.home import Home

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export.os, "replace", refuse)
    with Home(Config.load(home=home), read_only=True) as h, pytest.raises(InputError, match="cannot write"):
        export.export_turns(h, "", "s", tmp_path / "x.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv.jsonl", "h"]


def test_trace_show_html_to_a_missing_folder_or_a_folder_is_one_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("")
    result = runner.invoke(app, ["trace", "show", str(trace), "--html", str(tmp_path / "no" / "t.html")])
    _one_line_error(result, "--html", "does not exist")
    result = runner.invoke(app, ["trace", "show", str(trace), "--html", str(tmp_path)])
    _one_line_error(result, "--html", "is a folder")


@pytest.mark.parametrize("argv", [
    ["bench", "scale", "--pages", "1000"],
    ["bench", "serve", "--clients", "1", "--shared", "0", "--turns", "1"],
])
def test_a_bench_refuses_to_build_into_a_folder_that_holds_something(tmp_path, monkeypatch, argv):
    from pager.bench import scale, serve

    built = []
    for module in (scale, serve):
        monkeypatch.setattr(module, "main", lambda *a, **k: built.append(a) or {"problems": [], "load": {"failed": 0}})
    home = tmp_path / "home"
    home.mkdir()
    (home / "pager.toml").write_text("# a user's settings\n")
    _one_line_error(runner.invoke(app, argv + ["--keep", str(home)]), "is not empty", "new or empty folder")
    _one_line_error(runner.invoke(app, argv + ["--keep", str(home / "pager.toml")]), "is a file")
    assert built == [] and (home / "pager.toml").read_text() == "# a user's settings\n"
    assert runner.invoke(app, argv + ["--keep", str(tmp_path / "new")]).exit_code == 0
    assert len(built) == 1


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
