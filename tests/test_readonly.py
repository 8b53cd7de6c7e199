"""Commands that only look (search, inspect, export, check) write nothing, not even a cache or a
trace, and work on a home mounted read-only, live writers' journals included."""

import json
import subprocess

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home

runner = CliRunner()
LOOKS = [["search", "lighthouse keeper", "-s", "s"], ["inspect", "-s", "s", "--json"], ["export", "-s", "s"],
         ["check", "-s", "s"]]


@pytest.fixture
def home_with_a_live_writer(tmp_path):
    cfg = Config(home=tmp_path / "h", embedder="hash", budget=2048, flush_turns=10_000)
    with Home(cfg, embedder=HashEmbedder()) as h:
        s = h.open("s")
        for i in range(300):
            s.append("ann", f"note {i} about the harbour")
    live = Home(cfg, embedder=HashEmbedder())
    live.open("s").append("bob", "The lighthouse keeper's name is Ottilie.")  # only in live's journal
    yield cfg.home
    live.close()


def tree(root):
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def run(home, args):
    return runner.invoke(app, ["--home", str(home)] + args, env={"PAGER_EMBEDDER": "hash"})


def test_looking_writes_nothing(home_with_a_live_writer):
    home = home_with_a_live_writer
    before = tree(home)
    outputs = {}
    for args in LOOKS:
        result = run(home, args)
        assert result.exit_code == 0, (args, result.output)
        outputs[args[0]] = result.output
    assert tree(home) == before
    assert "Ottilie" in outputs["search"] and "Ottilie" in outputs["export"]
    assert json.loads(outputs["inspect"])["turns"] == 301
    assert "301 turns" in outputs["check"] and "ok" in outputs["check"]


def test_looking_works_on_a_read_only_mount(home_with_a_live_writer, tmp_path):
    view = tmp_path / "ro"
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(home_with_a_live_writer), str(view)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (needs root)")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True, capture_output=True)
        with pytest.raises(OSError):
            (view / "probe").write_text("x")
        for args in LOOKS:
            result = run(view, args)
            assert result.exit_code == 0, (args, result.output)
        assert "Ottilie" in run(view, ["search", "lighthouse keeper", "-s", "s"]).output
    finally:
        subprocess.run(["umount", "-l", str(view)], capture_output=True)
