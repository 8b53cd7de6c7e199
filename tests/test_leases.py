"""Several hosts, one store: homes with their own journals and locks share a store, and a session
has one writer at a time across them (pager.lease). Each "host" here is a home folder of its own;
the store is a local folder and, where it matters, a bucket on the local S3 server."""

import os
import signal
import subprocess
import sys
import threading

import pytest

from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import LeaseHeld
from pager.home import Home
from pager.store import MIGRATIONS, SCHEMA_VERSION
import json
from typer.testing import CliRunner
from pager.cli.app import app
from conftest import ENV
from pager.fsck import check


@pytest.fixture(params=["disk", "s3", "s3ddb"])
def shared(request, tmp_path):
    """(config for a home named by its argument, environment for a child process) sharing one store:
    a folder, a bucket, or a bucket whose commits go through DynamoDB (s3+ddb://)."""
    if request.param == "disk":
        env, uri = {}, str(tmp_path / "store")
    else:
        env, uri = request.getfixturevalue(request.param)

    def config(name: str, **kw) -> Config:
        return Config.load(env={**env, "PAGER_EMBEDDER": "hash"}, home=tmp_path / name, db=uri, budget=2048, **kw)

    return config, {**env, "PAGER_EMBEDDER": "hash", "PAGER_DB": uri}


def texts(home: Home, session: str) -> list[str]:
    home.store.refresh()
    turns = home.store.turns("", session)
    assert [t.turn for t in turns] == list(range(1, len(turns) + 1)), "turns numbered without gaps"
    return [t.text for t in turns]


def test_a_second_host_is_refused_naming_the_holder_then_writes_after_release(shared):
    config, _ = shared
    a = Home(config("a"), embedder=HashEmbedder())
    a.open("s").append("ann", "written on host a")
    b = Home(config("b"), embedder=HashEmbedder())
    with pytest.raises(LeaseHeld) as refused:
        b.open("s").append("bob", "written on host b")
    message = str(refused.value)
    assert a.leases.holder in message and "last seen" in message and "PAGER_LEASE_WAIT_S" in message
    b.open("other").append("bob", "another session is free")  # one lease per session, not per store
    a.close()  # flushes, then releases
    turn = b.open("s").append("bob", "written on host b")
    assert turn.turn == 2  # numbered after what host a flushed
    b.close()
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:  # any host reads what was flushed
        assert texts(reader, "s") == ["written on host a", "written on host b"]
        assert texts(reader, "other") == ["another session is free"]


def test_a_writer_asked_to_wait_gets_the_lease_when_the_holder_closes(shared):
    config, _ = shared
    a = Home(config("a"), embedder=HashEmbedder())
    a.open("s").append("ann", "first, on host a")
    b = Home(config("b", lease_wait_s=120), embedder=HashEmbedder())
    started, done, errors = threading.Event(), threading.Event(), []

    def write():
        started.set()
        try:
            b.open("s").append("bob", "second, on host b after waiting")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    started.wait()
    assert not done.wait(0.5)  # still waiting while host a holds the lease (a, not a timer, ends it)
    a.close()
    thread.join(timeout=120)
    assert done.is_set() and not errors, errors
    b.close()
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "s") == ["first, on host a", "second, on host b after waiting"]


CHILD = """
import sys
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
home = Home(Config.load(home=sys.argv[1], lease_s=float(sys.argv[2]), budget=2048), embedder=HashEmbedder())
s = home.open("s")
for i in range(int(sys.argv[3])):
    s.append("ann", f"acknowledged {i} on host a")
    print("ok", i, flush=True)
print("holding", flush=True)
sys.stdin.read()
"""


def _killed_while_holding(script: str, home, lease_s: str, turns: int, env: dict) -> None:
    """Run a lease holder that acknowledges `turns` turns, then SIGKILL it once it says it holds."""
    child = subprocess.Popen([sys.executable, "-c", script, str(home), lease_s, str(turns)], env={**os.environ, **env},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    while (line := child.stdout.readline()) and line.strip() != "holding":
        lines.append(line)
    assert len(lines) == turns, child.stderr.read()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()


def test_a_holder_killed_with_sigkill_loses_its_lease_after_the_expiry_and_its_home_recovers(shared, tmp_path):
    config, env = shared
    _killed_while_holding(CHILD, tmp_path / "a", "2", 5, env)
    # host b waits for the lease: it lapses 2 s after host a was last seen (the event ends the wait)
    b = Home(config("b", lease_wait_s=120), embedder=HashEmbedder())
    b.open("s").append("bob", "host b, after the lease lapsed")
    b.close()
    # host a restarts: its own home recovers the dead process's journal; nothing acknowledged is lost
    with Home(config("a"), embedder=HashEmbedder()) as a:
        assert a.recovered == 5
        assert any("numbered over by another home" in w for w in a.warnings), a.warnings
        got = texts(a, "s")
    assert got[0] == "host b, after the lease lapsed"
    assert got[1:] == [f"acknowledged {i} on host a" for i in range(5)]   # in the order acknowledged


def test_hosts_claiming_one_lease_at_once_have_one_winner(shared):
    config, _ = shared
    homes = [Home(config(f"h{i}"), embedder=HashEmbedder()) for i in range(4)]
    for home in homes:
        _ = home.store  # connected before the race starts
    barrier, won, refused = threading.Barrier(len(homes)), [], []

    def claim(home):
        barrier.wait()
        try:
            home.leases.ensure("", "contended", wait=False)
            won.append(home)
        except LeaseHeld as exc:
            refused.append(str(exc))

    threads = [threading.Thread(target=claim, args=(home,)) for home in homes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 3, (won, refused)
    assert all(won[0].leases.holder in message for message in refused)
    for home in homes:
        home.close()


@pytest.mark.slow
def test_ten_holders_killed_in_a_row_lose_nothing_acknowledged(tmp_path):
    """The issue's SIGKILL ×10 on a local store: each round a holder acknowledges turns and is killed,
    another home waits out the lease and writes, and the killed home recovers its journal."""
    uri = str(tmp_path / "store")
    env = {"PAGER_EMBEDDER": "hash", "PAGER_DB": uri}

    def config(name: str, **kw) -> Config:
        return Config.load(env=env, home=tmp_path / name, budget=2048, **kw)

    expected: list[str] = []
    for round_ in range(10):
        _killed_while_holding(CHILD.replace("acknowledged {i}", f"r{round_} acknowledged {{i}}"), tmp_path / "a", "1", 3, env)
        expected += [f"r{round_} acknowledged {i} on host a" for i in range(3)]
        with Home(config("b", lease_wait_s=120), embedder=HashEmbedder()) as b:
            b.open("s").append("bob", f"r{round_} host b")
        expected.append(f"r{round_} host b")
        with Home(config("a"), embedder=HashEmbedder()) as a:
            assert a.recovered == 3, (round_, a.warnings)
            got = texts(a, "s")
        assert sorted(got) == sorted(expected), f"round {round_}"


def test_a_live_holder_keeps_its_leases_by_renewing_them(shared):
    import time

    config, _ = shared
    a = Home(config("a", lease_s=3), embedder=HashEmbedder())
    names = [f"s{i}" for i in range(5)]
    for name in names:
        a.open(name).append("ann", f"held by a: {name}")
    first = {name: a.store.lease("", name)["seen"] for name in names}
    while not all(a.store.lease("", name)["seen"] > first[name] for name in names):
        time.sleep(0.05)  # the event: every lease renewed by the background thread
    b = Home(config("b", lease_s=3), embedder=HashEmbedder())
    for name in names:
        with pytest.raises(LeaseHeld):
            b.open(name).append("bob", "refused while a lives")
    a.close()
    b.open("s0").append("bob", "after a closed")
    b.close()


def test_an_idle_writer_gives_its_lease_up_and_takes_it_again_on_its_next_write(shared):
    """A lease is held while the session is written, not while it is open: host a writes, goes idle and
    gives the lease up (after flushing) without closing; host b writes the session; a's next write is
    refused while b holds it, then waits for it, and is numbered after b's turns: nothing lost or twice."""
    import time

    config, _ = shared
    a = Home(config("a", lease_idle_s=0.4), embedder=HashEmbedder())
    sa = a.open("s")
    sa.append("ann", "a1")
    sa.append("ann", "a2", key="k-a2")
    sa.set_state("city", "Berlin")
    while a.store.lease("", "s") is not None or ("", "s") in a.leases.held:
        time.sleep(0.05)  # the event: host a gave the lease up (in the store, then in its own books) while open
    assert not a.closed
    b = Home(config("b", lease_idle_s=0), embedder=HashEmbedder())  # b keeps it until it closes
    sb = b.open("s")
    assert sb.append("bob", "b1").turn == 3  # a flushed before it gave up: b numbers after a's turns
    sb.set_state("city", "Paris")
    with pytest.raises(LeaseHeld) as refused:
        sa.append("ann", "a3")
    assert b.leases.holder in str(refused.value)
    sb.append("bob", "b2")
    a.leases.wait_s = 120
    done, errors, got = threading.Event(), [], []

    def write():
        try:
            got.append(sa.append("ann", "a3", key="k-a3").turn)
            got.append(sa.append("ann", "a2", key="k-a2").turn)  # a retry of an acknowledged turn: kept once
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    assert not done.wait(0.5)  # waiting while host b holds the lease (b's close, not a timer, ends it)
    b.close()
    thread.join(timeout=120)
    assert done.is_set() and not errors, errors
    assert got == [5, 2] and sa.turn_count == 5  # numbered after b's turns, which host a took in
    sa.set_state("pet", "cat")  # numbered after b's change of the working state
    assert sa.state.values() == {"city": "Paris", "pet": "cat"}
    a.close()
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "s") == ["a1", "a2", "b1", "b2", "a3"]
        assert [(c.seq, c.key, c.value) for c in reader.store.state_changes("", "s")] == [
            (1, "city", "Berlin"), (2, "city", "Paris"), (3, "pet", "cat")]


def test_a_store_opened_while_another_process_creates_it_still_takes_leases(tmp_path, monkeypatch):
    """The creator makes the leases table last; a process that listed the tables just before gets
    it once it is there, instead of writing as if no lease existed (or failing at its flush)."""
    from pager.store import LanceStore

    uri = str(tmp_path / "db")
    made_leases = LanceStore._create_leases
    monkeypatch.setattr(LanceStore, "_create_leases", lambda self: None)   # the creator, paused before its last table
    LanceStore(uri, dim=8)
    monkeypatch.setattr(LanceStore, "_create_leases", made_leases)
    early = LanceStore(uri, dim=8)               # listed the tables while the leases table was not there
    made_leases(LanceStore(uri, dim=8, read_only=True))   # the creator goes on and makes it
    assert early.lease("u", "s") is None
    entry = {"holder": "h1", "expires": 1e12}
    assert early.swap_lease("u", "s", lambda held: (entry, held)) is None   # nobody held it
    assert early.swap_lease("u", "s", lambda held: (held, held)) == entry
    assert LanceStore(uri, dim=8).lease("u", "s")["holder"] == "h1"
def test_a_home_that_restarts_while_another_holds_the_lease_recovers_when_it_takes_the_lease(shared, tmp_path):
    """Host a's holder is killed; host b waits out the lease and writes; host a restarts while b still
    holds it, so its journal cannot be recovered yet. Host a reads the session meanwhile without the
    dead turns at numbers b gave other turns, and its first write recovers them first: every host
    sees the turns numbered without gaps, in the order each host acknowledged them."""
    config, env = shared
    _killed_while_holding(CHILD, tmp_path / "a", "2", 5, env)
    dead_segment = list((tmp_path / "a").rglob("*.wal"))
    assert len(dead_segment) == 1
    b = Home(config("b", lease_wait_s=120), embedder=HashEmbedder())
    b.open("s").append("bob", "host b, after the lease lapsed")
    b.open("other").append("bob", "another session of host b")
    a = Home(config("a"), embedder=HashEmbedder())  # restarts while b holds the lease
    assert a.recovered == 0 and any("recovered when this home next writes it" in w for w in a.warnings), a.warnings
    s = a.open("s")
    assert s.turn_count == 0   # b's turn is not flushed yet; the dead turns wait, at no number
    b.close()
    s.sync()
    assert s.turn_count == 1 and [t.text for t in s.home.store.turns("", "s")] == ["host b, after the lease lapsed"]
    turn = s.append("ann", "host a, after its restart")
    assert turn.turn == 7, turn
    dead = [f"acknowledged {i} on host a" for i in range(5)]
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:   # recovered before the turn
        assert texts(reader, "s") == ["host b, after the lease lapsed", *dead]
    assert not dead_segment[0].exists(), "the dead segment goes once all of it is in the store"
    a.close()
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "s") == ["host b, after the lease lapsed", *dead, "host a, after its restart"]
    with Home(config("a"), embedder=HashEmbedder()) as again:   # nothing left to recover, nothing twice
        assert again.recovered == 0 and not again.warnings, again.warnings


def test_a_store_opened_while_another_process_makes_it_is_not_migrated(tmp_path, monkeypatch):
    """Two processes started on a new home at once: the second opens the store while the first is
    making its tables. It finds the store versioned (the meta table is made first, with its rows),
    makes the tables still missing itself, and runs no migration: before, it took the half-made store
    for one of release 0.1 and ran every migration on it, printing a notice for each."""
    from pager.store import LanceStore

    uri = str(tmp_path / "db")
    notices: list[str] = []
    made = LanceStore._create
    opened: list = []

    def paused(self, name, schema):   # the first process, stopped once its first table is made
        made(self, name, schema)
        if not opened:
            opened.append(None)        # the second process's own tables are made as usual
            opened[0] = LanceStore(uri, dim=8, notify=notices.append)

    monkeypatch.setattr(LanceStore, "_create", paused)
    first = LanceStore(uri, dim=8, notify=notices.append)
    second = opened[0]
    assert notices == []
    for store in (first, second):
        assert set(store._tables) == {"turns", "pages", "bookmarks", "states", "state_changes", "facts",
                                      "summaries", "meta", "leases"}
    meta = second._meta()
    assert meta["schema"] == str(SCHEMA_VERSION) and meta["dim"] == "8"
    assert all(meta[f"migration:{m.__name__}"] == "new store" for m in MIGRATIONS)
    assert first.swap_lease("u", "s", lambda held: ({"holder": "one", "expires": 1e12}, held)) is None
    assert second.lease("u", "s")["holder"] == "one"     # one leases table, shared


runner = CliRunner()


HOLDER = """
import sys
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
home = Home(Config.load(home=sys.argv[1], db=sys.argv[2], lease_s=1.0, budget=2048), embedder=HashEmbedder())
s = home.open("s")
for who, text in (("ann", "From host A: the venue is Lisbon."), ("assistant", "Noted."), ("ann", "The date is May 4")):
    s.append(who, text)
print("holding", flush=True)
sys.stdin.read()
"""


def _killed_holder_numbered_over(tmp_path):
    """Host a acknowledges three turns and is killed with SIGKILL holding the lease; host b, waiting
    for the lease, writes turns 1 and 2 of the same session once it lapses, the second saying what
    host a's turn 2 says. Returns (home a, store)."""
    store, a = str(tmp_path / "store"), tmp_path / "a"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(a), store], env={**os.environ, **ENV},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "holding", child.stderr.read()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    config = Config.load(env=ENV, home=tmp_path / "b", db=store, budget=2048, lease_wait_s=120)
    with Home(config, embedder=HashEmbedder()) as b:
        b.open("s").append("carol", "From host B: catering by Marco.")
        b.open("s").append("assistant", "Noted.")
    return a, store


def test_export_of_a_home_whose_dead_process_was_numbered_over_loses_nothing(tmp_path):
    """Before host a's home wrote again, `pager export` there printed host b's turn 1 in place of host
    a's acknowledged 'From host A: the venue is Lisbon.' (exit 0; the question was simply not in the
    file) and `pager check` said 'turn 1 means two messages' without a fix. Export refuses in one line
    naming the command that recovers the journal; check names it too; after it, every turn is there."""
    a, store = _killed_holder_numbered_over(tmp_path)
    args = ["--home", str(a), "--db", store]
    out = tmp_path / "a.jsonl"
    exported = runner.invoke(app, [*args, "export", "-s", "s", "--out", str(out)], env=ENV)
    assert exported.exit_code != 0 and not out.exists(), exported.output
    assert "pager migrate" in exported.output and "Traceback" not in exported.output
    checked = runner.invoke(app, [*args, "check", "-s", "s"], env=ENV)
    assert checked.exit_code == 1 and "pager migrate" in checked.output, checked.output
    assert runner.invoke(app, [*args, "migrate"], env=ENV).exit_code == 0
    exported = runner.invoke(app, [*args, "export", "-s", "s", "--out", str(out)], env=ENV)
    assert exported.exit_code == 0, exported.output
    texts = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    # host a's turns after host b's, in the order acknowledged; its 'Noted.' is its own, not host b's
    assert texts == ["From host B: catering by Marco.", "Noted.", "From host A: the venue is Lisbon.", "Noted.",
                     "The date is May 4"]
    assert runner.invoke(app, [*args, "check", "-s", "s"], env=ENV).exit_code == 0


def test_a_bookmark_or_pin_refused_for_the_lease_changes_nothing(tmp_path):
    """`pager mcp` on a host whose session another host was writing: `bookmark` came back refused
    (the lease), yet `context` then showed the page with the refused keyword, and the server's exit
    tried to write it ('pager: session … is being written by …' on stderr). A refused bookmark or pin
    leaves memory as it was, and closing writes nothing of it."""
    from pager.errors import LeaseHeld

    store = str(tmp_path / "store")

    def config(name: str) -> Config:
        return Config(home=tmp_path / name, db=store, embedder="hash", budget=2048)

    holder = Home(config("a"), embedder=HashEmbedder())
    holder.open("s").append("ann", "the venue is Lisbon")
    holder.flush()
    b = Home(config("b"), embedder=HashEmbedder())
    s = b.open("s")
    for refused in (lambda: s.bookmark(["p1"], ["refusedword"]), lambda: s.pin(1)):
        with pytest.raises(LeaseHeld):
            refused()
    assert "refusedword" not in s.directory.keywords(1) and not s.table[1].pinned
    b.close()   # nothing of the refused calls is left to write
    holder.close()
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert all("refusedword" not in mark.keywords for mark in reader.store.bookmarks("", "s"))


def test_a_writer_that_waited_for_the_lease_is_told_it_waited(tmp_path):
    """`PAGER_LEASE_WAIT_S=2 pager ingest …` waited 2 s, then said '… or set PAGER_LEASE_WAIT_S to wait
    for it', the setting it had just used. It says how long it waited and to raise the setting."""
    from pager.errors import LeaseHeld

    store = str(tmp_path / "store")
    holder = Home(Config(home=tmp_path / "a", db=store, embedder="hash", budget=2048), embedder=HashEmbedder())
    holder.open("s").append("ann", "on host a")
    waited = Home(Config(home=tmp_path / "b", db=store, embedder="hash", budget=2048, lease_wait_s=0.3),
                  embedder=HashEmbedder())
    with pytest.raises(LeaseHeld) as refused:
        waited.open("s").append("bob", "on host b")
    assert "waited 0.3 s" in str(refused.value) and "raise PAGER_LEASE_WAIT_S" in str(refused.value)
    assert holder.leases.holder in str(refused.value)
    holder.close()
    waited.close()


def _files(folder) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_a_reader_on_a_restarted_home_shows_no_dead_turn_at_a_number_another_home_gave(shared, tmp_path):
    """Host a's holder is killed; host b writes two turns and a state change and flushes; host a restarts
    while b holds the lease. `pager inspect` there said 5 turns (b's two, then three of the dead
    process's at numbers 3-5, its first two hidden under b's), `pager search` showed a dead turn on
    b's page, `pager sessions` said 5: none of it what the store holds or will hold. A reader now shows
    what the restarted writer shows (b's turns), says why in one line, and writes nothing."""
    config, env = shared
    _killed_while_holding(CHILD, tmp_path / "a", "2", 5, env)
    b = Home(config("b", lease_wait_s=120), embedder=HashEmbedder())
    sb = b.open("s")
    sb.append("bob", "host b one")
    sb.append("bob", "host b two")
    sb.set_state("city", "Paris")
    b.flush()
    a = Home(config("a"), embedder=HashEmbedder())   # restarts while b holds the lease: recovery waits
    assert a.recovered == 0
    s = a.open("s")
    assert s.turn_count == 2 and not [h for h in s.search("acknowledged on host a") if h.n != s.tail_n]
    args = ["--home", str(tmp_path / "a")]
    before = _files(tmp_path / "a")
    inspected = runner.invoke(app, [*args, "inspect", "-s", "s", "--json"], env=env)
    assert inspected.exit_code == 0 and "Traceback" not in inspected.output, inspected.output
    shown = json.loads(inspected.stdout.splitlines()[-1])
    assert shown["turns"] == 2 and shown["state"]["city"]["value"] == "Paris", shown
    assert "numbered" in inspected.output or "another home" in inspected.output   # the one line saying why
    found = runner.invoke(app, [*args, "search", "acknowledged on host a", "-s", "s"], env=env)
    assert found.exit_code == 0 and "Traceback" not in found.output, found.output
    rows = found.stdout.split("─")[-1] if "─" in found.stdout else ""   # the table's rows, under its header
    assert "acknowledged" not in rows, found.output
    listed = runner.invoke(app, [*args, "sessions", "--json"], env=env)
    assert listed.exit_code == 0, listed.output
    assert [r["turns"] for r in json.loads(listed.stdout.splitlines()[-1])["sessions"] if r["session"] == "s"] == [2]
    exported = runner.invoke(app, [*args, "export", "-s", "s"], env=env)
    assert exported.exit_code == 1 and "pager migrate" in exported.output and "Traceback" not in exported.output
    assert _files(tmp_path / "a") == before, "a reader wrote nothing"
    b.close()
    s.append("ann", "host a, after its restart")   # recovers the dead turns first
    a.close()
    dead = [f"acknowledged {i} on host a" for i in range(5)]
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "s") == ["host b one", "host b two", *dead, "host a, after its restart"]
    inspected = runner.invoke(app, [*args, "inspect", "-s", "s", "--json"], env=env)
    assert json.loads(inspected.stdout.splitlines()[-1])["turns"] == 8 and "another home" not in inspected.output


TWO_SESSIONS = """
import sys
from pager.config import Config
from pager.embed import HashEmbedder
from pager.fsck import check
from pager.home import Home
home = Home(Config.load(home=sys.argv[1], lease_s=1.0, budget=2048), embedder=HashEmbedder())
for name in ("free", "held"):
    s = home.open(name)
    for i in range(3):
        s.append("ann", f"{name} {i} on host a")
    s.set_state("city", f"Lisbon for {name}")
print("holding", flush=True)
sys.stdin.read()
"""


def test_a_dead_journal_of_two_sessions_one_held_elsewhere_is_recovered_in_two_steps(shared, tmp_path):
    """The dead process's journal holds ops of session 'free' (nobody else writes it) and 'held' (host b
    numbered over it and still holds its lease). Host a's restart recovers 'free' at once and keeps the
    segment for 'held'; a second restart meanwhile recovers nothing twice; the first write of 'held'
    recovers the rest, and only then is the segment gone."""
    import os
    import signal
    import subprocess
    import sys

    config, env = shared
    child = subprocess.Popen([sys.executable, "-c", TWO_SESSIONS, str(tmp_path / "a")], env={**os.environ, **env},
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "holding", child.stderr.read()
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    segment = list((tmp_path / "a").rglob("*.wal"))
    assert len(segment) == 1
    b = Home(config("b", lease_wait_s=120), embedder=HashEmbedder())
    sb = b.open("held")
    sb.append("bob", "held 0 on host b")
    sb.set_state("city", "Paris")
    b.flush()
    for restart in range(2):
        with Home(config("a"), embedder=HashEmbedder()) as a:
            assert a.recovered == (3 if restart == 0 else 0), (restart, a.warnings)
            assert segment[0].exists(), "kept until 'held' is recovered too"
            assert a.open("held").turn_count == 1 and a.open("held").state.values() == {"city": "Paris"}
            assert a.open("free").turn_count == 3
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "free") == [f"free {i} on host a" for i in range(3)]
        assert [(c.seq, c.value) for c in reader.store.state_changes("", "free")] == [(1, "Lisbon for free")]
    b.close()
    with Home(config("a"), embedder=HashEmbedder()) as a:
        a.open("held").append("ann", "host a, after its restarts")
        assert not segment[0].exists()
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "held") == ["held 0 on host b", *[f"held {i} on host a" for i in range(3)],
                                         "host a, after its restarts"]
        assert [(c.seq, c.value, c.turn) for c in reader.store.state_changes("", "held")] == [
            (1, "Paris", 1), (2, "Lisbon for held", 4)]
        assert texts(reader, "free") == [f"free {i} on host a" for i in range(3)]
        for name in ("free", "held"):
            report = check(reader, "", name)
            assert report.ok, (name, report.problems)
    assert not list((tmp_path / "a").rglob("*.wal"))
