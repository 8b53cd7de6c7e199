"""Upgrading pager one host at a time, on homes and stores that must survive it: a host downgraded
with a newer pager's journal in its home (left for the newer pager; nothing written), a store migrated
by a newer pager under a process still running this one (its writes stopped and nothing accepted lost,
unless the newer release declares this one compatible), a store or keys file a newer pager made
(refused, kept as it is), `pager migrate` killed while it makes a table or before it records the
store's numbers (finished by the next run), and two hosts migrating at once (no step applied twice, no
page lost)."""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pager import fsck, journal
from pager.cli.app import app
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import StoreError
from pager.home import Home
from pager.store import MIGRATIONS, SCHEMA_VERSION, LanceStore

from conftest import run_py, ENV


FIXTURE = Path(__file__).parent / "fixtures" / "home-v1"

runner = CliRunner()


def _files(root: Path) -> dict[str, int]:
    """Every file under root with its size: what a refused command must leave as it was."""
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*")) if p.is_file()}


def _newer_segment(folder: Path, name: str, turn: int) -> Path:
    """A journal segment as a newer pager (journal v+1) would leave it, holding one acknowledged turn."""
    op = {"op": "turn", "user": "", "session": "s", "turn": turn, "speaker": "ann", "role": "user", "date": "",
          "ts": 1.0, "ref": "", "key": "", "text": "a turn the newer pager acknowledged"}
    body = json.dumps({"v": journal.VERSION + 1, "ops": [op]}).encode()
    path = folder / name
    path.write_bytes(b"%s%08x %08x %s\n" % (journal.RS, len(body), zlib.crc32(body), body))
    return path


def _home_with_two_turns(tmp_path) -> tuple[Config, Path]:
    home = tmp_path / "h"
    cfg = Config(home=home, embedder="hash", budget=2048)
    with Home(cfg, embedder=HashEmbedder()) as h:
        h.open("s").append_many([{"speaker": "ann", "text": "hello one"}, {"speaker": "bob", "text": "hello two"}])
    lock = next((home / "locks").glob("*.lock"))
    last, generation = lock.read_text().split()[:2]
    lock.write_text(f"3 {int(generation) + 1}")   # the newer pager's turn 3 is durable, as its lock says
    return cfg, home


def test_a_dead_newer_pagers_journal_is_left_for_it_and_nothing_is_written(tmp_path):
    """A host downgraded after a newer pager died with turn 3 in its journal. Before: the older pager
    warned "upgrade pager to recover it", then moved the segment to journal/damaged/ (which no pager reads
    again), numbered its own turn after a gap, and `pager check` reported the gap: turn 3 lost even to
    the newer pager. Now every writing command refuses in one line naming the fix, and nothing changes."""
    cfg, home = _home_with_two_turns(tmp_path)
    segment = _newer_segment(home / "journal", "01000000000000000000-4242-abcdef-home.wal", 3)
    line = tmp_path / "more.jsonl"
    line.write_text(json.dumps({"speaker": "ann", "text": "after the downgrade"}) + "\n")
    before = _files(home)
    for args in (["ingest", str(line), "-s", "s"], ["migrate"], ["summarize", "-s", "s"]):
        result = runner.invoke(app, ["--home", str(home), *args], env=ENV)
        assert result.exit_code == 1, (args, result.output)
        assert "written by a newer pager" in result.output and "pip install -U pager" in result.output, result.output
        assert "Traceback" not in result.output
    with pytest.raises(StoreError, match="newer pager"):
        Home(cfg, embedder=HashEmbedder())
    assert segment.exists() and not (home / "journal" / "damaged").exists()
    assert _files(home) == before   # nothing written: no turn, no segment of the refused processes, no trace
    looked = runner.invoke(app, ["--home", str(home), "search", "hello", "-s", "s"], env=ENV)
    assert looked.exit_code == 0 and "newer than this pager" in looked.output   # a reader says so and reads the rest
    # an export or a check of it is not whole: said, not exit 0 with turn 3 left out
    for args in (["export", "-s", "s"], ["check", "-s", "s"]):
        result = runner.invoke(app, ["--home", str(home), *args], env=ENV)
        assert result.exit_code == 1 and "run the newer pager on this home once" in result.output, (args, result.output)
        assert "Traceback" not in result.output and '"text"' not in result.output


def test_a_live_newer_pagers_journal_stops_this_ones_writes(tmp_path):
    """A newer pager running on the same home (its segment locked: alive). Before: the older one read past
    its frame, numbered its own turn 4 after a gap and packed pages without turn 3. Now it refuses."""
    cfg, home = _home_with_two_turns(tmp_path)
    segment = _newer_segment(home / "journal", "01000000000000000000-4343-abcdef-home.wal", 3)
    fd = os.open(segment, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)   # its process is alive
    try:
        with Home(cfg, embedder=HashEmbedder()) as h:
            with pytest.raises(StoreError, match="newer pager.*pip install -U pager"):
                h.open("s").append("ann", "beside the newer pager")
            assert [t.turn for t in h.store.turns("", "s")] == [1, 2]
            own = journal.read_segment(h.journal.path).ops if h.journal.path else []
            assert not [op for op in own if op["op"] == "turn"]
    finally:
        os.close(fd)
    assert segment.exists()


def _host_a(tmp_path, request, where: str) -> tuple[str, Config]:
    """(the store's URI, host A's config) for a store on disk or on the local S3 server."""
    env, uri = ({}, str(tmp_path / "store")) if where == "disk" else request.getfixturevalue("s3")
    return uri, Config.load(env={**env, **ENV}, home=tmp_path / "a", db=uri, budget=2048, lease_idle_s=0)


def _six_flushed(home: Home):
    """Session "s" of host A with six turns in the store, written before the upgrade."""
    s = home.open("s")
    for i in range(6):
        s.append("ann", f"before the upgrade {i}")
    home.flush()
    return s


MIGRATE_UNDER = {
    # a newer release's migration as it would run on another host: a column this pager does not write ...
    "a column": "st._tables['turns'].add_columns({'lang': \"CAST('' AS STRING)\"})\n"
                "st._tables['pages'].add_columns({'lang': \"CAST('' AS STRING)\"})\n",
    # ... or a change of no column (a new table; rows of the old shape it no longer reads alone)
    "a table": "import pyarrow as pa\nst.db.create_table('m009_things', schema=pa.schema([('x', pa.string())]))\n",
}


@pytest.mark.parametrize("change", sorted(MIGRATE_UNDER))
@pytest.mark.parametrize("where", ["disk", "s3"])
def test_a_store_a_newer_pager_migrates_under_a_running_process_stops_its_writes_and_loses_nothing(
        tmp_path, request, where, change):
    """Host A runs this pager; host B, upgraded, migrates the store (schema v+1). Before: A kept
    acknowledging turns; its flushes failed after 8 tries with "Append with different schema … location:
    /root/.cargo/…" (a column), or succeeded, writing rows under the newer schema (a table). Now A's next
    flush is refused in one line naming the fix, A takes nothing more in, and every turn it acknowledged
    is in the store or in its journal for its restart under the newer pager."""
    uri, cfg = _host_a(tmp_path, request, where)
    home = Home(cfg, embedder=HashEmbedder())
    s = _six_flushed(home)
    code = (f"from pager.store import LanceStore\nst = LanceStore({uri!r}, dim=256, storage_options="
            f"{cfg.storage_options!r})\n{MIGRATE_UNDER[change]}st._set_meta({{'schema': '{SCHEMA_VERSION + 1}', "
            "'migration:m009_newer': 'now'})\n")
    migrated = run_py(code)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    late = [s.append("ann", f"after the upgrade {i}").turn for i in range(3)]   # in the journal: acknowledged
    try:
        with pytest.raises(StoreError, match=f"migrated to schema v{SCHEMA_VERSION + 1} by a newer pager.*"
                                             "nothing accepted is lost.*pip install -U pager"):
            home.flush()
        with pytest.raises(StoreError, match="newer pager"):
            s.append("ann", "refused: no flush of this process can succeed")
    finally:
        with pytest.raises(StoreError, match="newer pager"):
            home.close()
    assert late == [7, 8, 9]
    journals = [p for p in (tmp_path / "a").rglob("*.wal")]
    kept = [op["turn"] for p in journals for op in journal.read_segment(p, final=True).ops if op["op"] == "turn"]
    assert kept == late   # what the store lacks waits in the journal for the upgraded pager
    stored = run_py(f"import lancedb\nprint(lancedb.connect({uri!r}, storage_options={cfg.storage_options!r})"
                    ".open_table('turns').count_rows())")
    assert stored.returncode == 0 and stored.stdout.split()[-1] == "6", stored.stderr[-1000:]


def test_a_store_of_a_newer_schema_is_refused_by_every_command_and_nothing_is_written(tmp_path):
    """Before, each refused writing command left an empty journal segment behind (and its flock held by
    the process until it exited); a library caller's failed Home kept it open."""
    home = tmp_path / "h"
    made = tmp_path / "t.jsonl"
    made.write_text(json.dumps({"speaker": "ann", "text": "hello one"}) + "\n")
    assert runner.invoke(app, ["--home", str(home), "ingest", str(made), "-s", "s"], env=ENV).exit_code == 0
    LanceStore(str(home / "db"), dim=256)._set_meta({"schema": str(SCHEMA_VERSION + 1)})
    before = _files(home)
    for args in (["ingest", str(made), "-s", "s"], ["migrate"], ["summarize", "-s", "s"], ["search", "hello", "-s", "s"],
                 ["inspect", "-s", "s"], ["export", "-s", "s"], ["check", "-s", "s"], ["chat", "-s", "s", "--model", "offline"]):
        result = runner.invoke(app, ["--home", str(home), *args], env=ENV, input="/quit\n")
        assert result.exit_code != 0, (args, result.output)
        assert f"schema v{SCHEMA_VERSION + 1}, newer than this pager" in result.output, (args, result.output)
        assert "upgrade pager" in result.output and "Traceback" not in result.output
        assert _files(home) == before, args


@pytest.mark.parametrize("table", ["leases", "state_changes", "summaries"])
def test_a_table_a_killed_migrate_left_half_made_is_made_again(tmp_path, monkeypatch, table):
    """What SIGKILL leaves when it lands while a migration makes a table: the table's folder with no
    version (LanceDB writes the data before the manifest). Before: every command, `pager migrate` too,
    waited 10 s and refused the store for good, "Table 'leases' was not found; check --db". Now the
    table is made again, each missing step runs once, and nothing is lost."""
    monkeypatch.setattr(LanceStore, "MAKING_WAIT_S", 0.2, raising=False)
    home = tmp_path / "h"
    shutil.copytree(FIXTURE, home, ignore=shutil.ignore_patterns("expected.json"))
    (home / "db" / f"{table}.lance" / "data").mkdir(parents=True)
    looked = runner.invoke(app, ["--home", str(home), "inspect", "-s", "maya", "--json"], env=ENV)
    assert looked.exit_code == 0 and "left half-made" in looked.output, looked.output
    _migrated_once_and_whole(home)


def test_pager_migrate_sigkilled_while_it_makes_a_table_is_finished_by_the_next_run(tmp_path, monkeypatch):
    """A real SIGKILL of `pager migrate` on a release 0.1 home, sent as soon as m003 begins to make the
    leases table (its folder appears: an event, not a duration); then `pager migrate` again."""
    monkeypatch.setattr(LanceStore, "MAKING_WAIT_S", 0.2, raising=False)
    home = tmp_path / "h"
    shutil.copytree(FIXTURE, home, ignore=shutil.ignore_patterns("expected.json"))
    started = subprocess.Popen([sys.executable, "-m", "pager", "--home", str(home), "migrate"],
                               env={**os.environ, **ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (home / "db" / "leases.lance").exists() and started.poll() is None:
            assert time.monotonic() < deadline, "pager migrate never began to make the leases table"
            time.sleep(0.0005)
        started.send_signal(signal.SIGKILL)
    finally:
        started.kill()
        started.wait()
    _migrated_once_and_whole(home)


def _migrated_once_and_whole(home: Path) -> None:
    expected = json.loads((FIXTURE / "expected.json").read_text())
    result = runner.invoke(app, ["--home", str(home), "migrate"], env=ENV)
    assert result.exit_code == 0, result.output
    names = [line.split(": ")[1].split()[0] for line in result.output.splitlines() if "was migrated" in line]
    assert len(names) == len(set(names)) and set(names) <= {m.__name__ for m in MIGRATIONS}, result.output
    again = runner.invoke(app, ["--home", str(home), "migrate"], env=ENV)
    assert again.exit_code == 0 and f"up to date: schema v{SCHEMA_VERSION}" in again.output, again.output
    checked = runner.invoke(app, ["--home", str(home), "check", "-s", "maya"], env=ENV)
    assert checked.exit_code == 0 and ": ok" in checked.output, checked.output
    with Home(Config(home=home, embedder="hash", budget=2048), embedder=HashEmbedder()) as h:
        assert [t.text for t in fsck.durable_turns(h, "", "maya")] == expected["texts"]
        assert h.store.lease("", "maya") is None and h.open("maya").append("Maya", "after the upgrade").turn == expected["turns"] + 1
        assert fsck.check(h, "", "maya").ok


def test_pages_a_process_stores_while_another_cuts_the_vectors_are_kept(tmp_path, monkeypatch):
    """Two hosts upgraded at once open a store of 256-dim wordllama vectors: both run m006_vector_dims.
    Host A finishes first and goes on writing; host B, which read the pages before A's cut, then commits
    its own cut as an overwrite. Before: the pages A stored meanwhile were gone from the store (LanceDB's
    overwrite does not conflict with the commits it follows); `pager check` took A's 45 turns for the open
    tail, and no reader found them on a stored page until a writer sealed them again. Now B adds what was
    stored between its read and its overwrite."""
    from pager import store as store_module
    from pager.embed import WordLlamaEmbedder

    texts = [f"turn {i} of the first host about the harbour, boats and the ferry timetable" for i in range(60)]
    old = Config(home=tmp_path / "old", embedder="wordllama", budget=2048)
    with Home(old, embedder=WordLlamaEmbedder(256)) as home:
        home.open("maya").append_many([{"speaker": "Maya", "text": t} for t in texts])
    uri = str(old.db_uri)
    meta = LanceStore(uri, dim=256)._tables["meta"]   # as the release before m006 left it
    meta.delete("key = 'migration:m006_vector_dims'")
    meta.update(where="key = 'schema'", values={"value": "5"})
    host_a = (f"from pager.config import Config\nfrom pager.home import Home\n"
              f"cfg = Config(home={str(tmp_path / 'a')!r}, db={uri!r}, embedder='wordllama', budget=2048)\n"
              "with Home(cfg) as home:\n"
              "    home.open('maya').append_many([{'speaker': 'Ann', 'text': f'host A after its cut {i} ' * 6} "
              "for i in range(40)])\n")
    cut, ran = store_module._cut, []

    def host_a_meanwhile(vectors, dim):   # B has begun reading the 256-dim pages: A migrates and writes now
        if not ran:
            ran.append(run_py(host_a))
            assert ran[0].returncode == 0, ran[0].stderr[-2000:]
        return cut(vectors, dim)

    monkeypatch.setattr(store_module, "_cut", host_a_meanwhile)
    notes: list[str] = []
    LanceStore(uri, dim=128, matryoshka=True, notify=notes.append)   # host B
    assert ran and any("m006_vector_dims" in n for n in notes), notes
    monkeypatch.setattr(store_module, "_cut", cut)
    with Home(Config(home=tmp_path / "reader", db=uri, embedder="wordllama", budget=2048), read_only=True) as reader:
        report = fsck.check(reader, "", "maya")
        assert report.ok, report.problems
        pages, vectors = reader.store.pages("", "maya")
        assert all(v.shape[1] == 128 for v in vectors)
        on_pages = " ".join(p.text for p in pages)
        assert reader.store.turn_count("", "maya") == 100 and "host A after its cut 30 " in on_pages


def test_a_keys_file_of_a_newer_pager_is_named_as_such_and_kept(tmp_path):
    """Before: "keys.json is damaged (version 2); restore it or remove it and create keys again", a fix
    that throws away every key the newer pager made. Now it names the newer pager and the upgrade, for
    every keys command and serve, and the file stays as it was."""
    home = tmp_path / "h"
    home.mkdir()
    keys = home / "keys.json"
    keys.write_text(json.dumps({"version": 2, "keys": [{"id": "3f9c2a7b1d04", "tenant": "acme", "scopes": ["read"]}]}))
    before = keys.read_bytes()
    for args in (["keys", "list"], ["keys", "create", "--tenant", "acme"], ["keys", "revoke", "3f9c2a7b1d04"]):
        result = runner.invoke(app, ["--home", str(home), *args], env=ENV)
        assert result.exit_code == 2, (args, result.output)
        assert "written by a newer pager" in result.output and "pip install -U pager" in result.output, result.output
        assert "remove it" not in result.output and "Traceback" not in result.output
    assert keys.read_bytes() == before


@pytest.mark.parametrize("where", ["disk", "s3"])
def test_a_newer_migration_declared_usable_by_older_pagers_lets_them_go_on(tmp_path, request, where):
    """A rolling upgrade with a migration older pagers can live with (a column they may leave empty, as
    m008_piece_tokens was for the release before it): the newer release records `compatible_from` in the
    store's meta, and a host still on this release keeps writing, and opens the store again, while the
    others are upgraded. Without the record (above) it refuses."""
    uri, cfg = _host_a(tmp_path, request, where)
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = _six_flushed(home)
        code = (f"import pyarrow as pa\nfrom pager.store import LanceStore\nst = LanceStore({uri!r}, dim=256, "
                f"storage_options={cfg.storage_options!r})\n"
                "st._tables['turns'].add_columns(pa.field('lang', pa.string()))\n"
                f"st._set_meta({{'schema': '{SCHEMA_VERSION + 1}', 'compatible_from': '{SCHEMA_VERSION}', "
                "'migration:m009_lang': 'now'})\n")
        migrated = run_py(code)
        assert migrated.returncode == 0, migrated.stderr[-2000:]
        late = [s.append("ann", f"after the upgrade {i}").turn for i in range(3)]
        home.flush()
    with Home(cfg, embedder=HashEmbedder()) as home:
        assert [t.turn for t in home.store.turns("", "s")] == [*range(1, 7), *late]
        assert home.open("s").append("ann", "still on the older release").turn == 10
        assert not any("migrated" in w for w in home.warnings)
    with Home(cfg, embedder=HashEmbedder(), read_only=True) as reader:
        assert fsck.check(reader, "", "s").ok
    meta = LanceStore(uri, dim=256, read_only=True, storage_options=cfg.storage_options)._meta()
    assert meta["schema"] == str(SCHEMA_VERSION + 1)   # this pager never wrote its own, older, number over it


def _wordllama_store_before_m006(tmp_path) -> Config:
    """A store of 256-dim wordllama vectors as the release before m006 left it (schema 5)."""
    from pager.embed import WordLlamaEmbedder

    cfg = Config(home=tmp_path / "old", embedder="wordllama", budget=2048)
    with Home(cfg, embedder=WordLlamaEmbedder(256)) as home:
        home.open("maya").append_many([{"speaker": "Maya", "text": f"turn {i} about the harbour, boats and ferries"}
                                       for i in range(80)])
    meta = LanceStore(str(cfg.db_uri), dim=256)._tables["meta"]
    for name in ("m006_vector_dims", "m007_fact_ends", "m008_piece_tokens"):
        meta.delete(f"key = 'migration:{name}'")
    meta.update(where="key = 'schema'", values={"value": "5"})
    return cfg


def test_a_migrate_killed_before_it_records_the_stores_numbers_is_finished_by_the_next_open(tmp_path, monkeypatch):
    """SIGKILL of `pager migrate` after its last step was recorded and before the store's schema and vector
    size were (two commits; seen once in three kills of a migrate cutting 1,276 pages to 128 dims). Before:
    meta said 256-dim vectors where the pages held 128, and every command, `pager migrate` too, refused the
    store for good: "holds 256-dim vectors, the embedder makes 128; set PAGER_EMBEDDER …", a fix that
    does not fix it. Now a step and the numbers it leaves are one commit, and the vector size is read from
    the pages table; a store an older pager's kill left so is put right by the next writing open."""
    cfg = _wordllama_store_before_m006(tmp_path)
    real = LanceStore._set_meta

    class Killed(BaseException):
        pass

    def killed_at_the_schema(self, values):   # the process dies as this commit would be sent
        if "schema" in values:
            raise Killed
        real(self, values)

    monkeypatch.setattr(LanceStore, "_set_meta", killed_at_the_schema)
    with pytest.raises(Killed):
        LanceStore(str(cfg.db_uri), dim=128, matryoshka=True)
    monkeypatch.setattr(LanceStore, "_set_meta", real)
    home = str(cfg.home)
    env = {"PAGER_EMBEDDER": "wordllama"}   # the default: wordllama at 128 dims
    result = runner.invoke(app, ["--home", home, "migrate"], env=env)
    assert result.exit_code == 0, result.output
    for args in (["inspect", "-s", "maya", "--json"], ["search", "ferries", "-s", "maya"], ["check", "-s", "maya"]):
        looked = runner.invoke(app, ["--home", home, *args], env=env)
        assert looked.exit_code == 0 and "dim vectors" not in looked.output, (args, looked.output)
    meta = LanceStore(str(cfg.db_uri), dim=128, read_only=True)._meta()
    assert (meta["schema"], meta["dim"]) == (str(SCHEMA_VERSION), "128")
    again = runner.invoke(app, ["--home", home, "migrate"], env=env)
    assert f"up to date: schema v{SCHEMA_VERSION}" in again.output, again.output


def test_steps_another_host_applied_meanwhile_are_not_applied_again(tmp_path):
    """Two hosts open a release 0.1 store at once: B begins with m002 while A runs every step. Before: B
    then applied all seven steps again (each a notice, each recorded twice). Now B reads what is recorded
    before each step and skips what A did."""
    from pager import store as store_module

    home = tmp_path / "h"
    shutil.copytree(FIXTURE, home, ignore=shutil.ignore_patterns("expected.json", "journal"))
    uri = str(home / "db")
    host_a = f"from pager.store import LanceStore\nLanceStore({uri!r}, dim=256)\n"
    first, ran = store_module.MIGRATIONS[0], []

    def a_runs_them_all_meanwhile(store):
        if not ran:
            ran.append(run_py(host_a))
            assert ran[0].returncode == 0, ran[0].stderr[-2000:]
        first(store)

    a_runs_them_all_meanwhile.__name__, a_runs_them_all_meanwhile.__doc__ = first.__name__, first.__doc__
    notes: list[str] = []
    store_module.MIGRATIONS[0] = a_runs_them_all_meanwhile
    try:
        LanceStore(uri, dim=256, notify=notes.append)   # host B
    finally:
        store_module.MIGRATIONS[0] = first
    assert ran and [n.split(": ")[1].split()[0] for n in notes] == [first.__name__], notes
    rows = LanceStore(uri, dim=256)._tables["meta"].search().limit(None).to_list()
    recorded = [r["key"] for r in rows if r["key"].startswith("migration:")]
    assert len(recorded) - len(set(recorded)) <= 1, recorded   # m002, which both began, at most twice
    assert set(recorded) == {f"migration:{m.__name__}" for m in MIGRATIONS}
