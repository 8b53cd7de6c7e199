"""Every persisted format carries its version: the store (named migrations, `pager migrate`), the
journal (frames), the caches (index pickles, session snapshots) and traces. A stale cache is
ignored; a format newer than this pager is refused, naming the fix."""

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pager import journal
from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import InputError, StoreError
from pager.caches import Snapshot
from pager.home import Home
from pager.search import INDEX_FORMAT
from pager.store import MIGRATIONS, SCHEMA_VERSION
from pager.trace import TRACE_VERSION, read_trace
from conftest import ENV

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

FIXTURE = Path(__file__).parent / "fixtures" / "home-v1"
runner = CliRunner()


def test_pager_migrate_applies_the_missing_steps_and_a_read_only_open_reports_them(tmp_path):
    home = tmp_path / "home"
    shutil.copytree(FIXTURE, home, ignore=shutil.ignore_patterns("expected.json", "journal"))
    env = {"PAGER_EMBEDDER": "hash"}
    looked = runner.invoke(app, ["--home", str(home), "inspect", "-s", "maya", "--json"], env=env)
    assert looked.exit_code == 0, looked.output
    names = [step.__name__ for step in MIGRATIONS]   # a release 0.1 store lacks every one
    assert f"lacks migration(s) {', '.join(names)}; run `pager migrate`" in looked.output
    migrated = runner.invoke(app, ["--home", str(home), "migrate"], env=env)
    assert migrated.exit_code == 0, migrated.output
    lines = migrated.output.strip().splitlines()
    assert [line.split(": ")[1].split()[0] for line in lines] == names, lines
    again = runner.invoke(app, ["--home", str(home), "migrate"], env=env)
    assert f"up to date: schema v{SCHEMA_VERSION}" in again.output
    looked = runner.invoke(app, ["--home", str(home), "inspect", "-s", "maya", "--json"], env=env)
    assert "lacks migration" not in looked.output and json.loads(looked.stdout)["turns"] == 120


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


def _home_with_pages(tmp_path) -> Config:
    cfg = Config(home=tmp_path / "h", embedder="hash", budget=2048)
    with Home(cfg, embedder=HashEmbedder()) as home:
        home.open("s").append_many([{"speaker": "ann", "text": f"line {i} about the harbour and boats " * 4}
                                    for i in range(60)])
    return cfg


@pytest.mark.parametrize("stale", [False, True])
def test_an_index_cache_of_another_format_is_ignored(tmp_path, stale):
    cfg = _home_with_pages(tmp_path)
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("s")
        cached = s.index
        cached.marker = "from the cache"  # what tells the cached index from a rebuilt one
        if stale:
            cached.format = INDEX_FORMAT - 1
        path = home.caches.index_path(s)
        path.parent.mkdir(exist_ok=True)
        planted = path.with_suffix(".planted")   # put in place as pager writes its caches: never in place,
        planted.write_bytes(pickle.dumps(cached, protocol=5))   # where the open session's index is mapped from
        os.replace(planted, path)
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("s")
        assert (getattr(s.index, "marker", None) == "from the cache") is not stale
        assert s.index.format == INDEX_FORMAT and s.search("harbour boats", k=3, record=False)


@pytest.mark.parametrize("stale", [False, True])
def test_a_session_snapshot_of_another_format_is_ignored(tmp_path, stale):
    cfg = _home_with_pages(tmp_path)
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("s")
        last, generation = home.read_counts(s)
        snapshot = Snapshot(generation, last, 0, None, [], [], [])
        if stale:
            snapshot.format = (Snapshot.FORMAT[0] - 1, Snapshot.FORMAT[1])
        path = home.caches.snapshot_path("", "s")
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(pickle.dumps(snapshot, protocol=5))   # after the close, which writes the session's own
    with Home(cfg, embedder=HashEmbedder(), read_only=True) as home:
        assert (home.caches.snapshot("", "s") is None) is stale


def test_a_trace_newer_than_this_pager_is_refused_naming_the_fix(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text(json.dumps({"v": TRACE_VERSION, "seq": 1, "kind": "note"}) + "\n"
                     + json.dumps({"v": TRACE_VERSION + 1, "seq": 2, "kind": "note"}) + "\n")
    with pytest.raises(InputError, match=f"t.jsonl:2: trace v{TRACE_VERSION + 1} is newer.*upgrade pager"):
        list(read_trace(trace))
    result = runner.invoke(app, ["replay", str(trace)])
    assert result.exit_code == 2 and "upgrade pager" in result.output and "Traceback" not in result.output


def test_a_journal_frame_newer_than_this_pager_is_kept_for_it_not_replayed(tmp_path):
    cfg = Config(home=tmp_path / "h", embedder="hash", budget=2048)
    folder = tmp_path / "h" / "journal"
    folder.mkdir(parents=True)
    op = {"op": "turn", "user": "", "session": "s", "turn": 1, "speaker": "ann", "text": "from the future",
          "role": "user", "date": "", "ts": 1.0, "ref": "", "key": ""}
    body = json.dumps({"v": journal.VERSION + 1, "ops": [op]}).encode()
    (folder / "dead-1-abc.wal").write_bytes(b"%s%08x %08x %s\n" % (journal.RS, len(body), __import__("zlib").crc32(body), body))
    # kept where the pager that can read it recovers it (journal/damaged/ is read by no pager): nothing written
    with pytest.raises(StoreError, match=f"journal v{journal.VERSION + 1}, written by a newer pager.*upgrade pager"):
        Home(cfg, embedder=HashEmbedder())
    assert (folder / "dead-1-abc.wal").exists() and not (folder / "damaged").exists()
    with Home(cfg, embedder=HashEmbedder(), read_only=True) as home:   # a reader says so and reads the rest
        assert home.open("s").turn_count == 0
        assert any("newer than this pager" in w and "upgrade pager" in w for w in home.warnings), home.warnings
