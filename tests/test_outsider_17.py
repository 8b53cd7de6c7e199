"""What an outside tester found attacking the write path with several homes on one store: lease holders
killed with SIGKILL, homes restarting while another holds the lease, readers in between."""

import json

import pytest

from typer.testing import CliRunner

from pager.cli.app import app
from pager.embed import HashEmbedder
from pager.fsck import check
from pager.home import Home
from test_leases import CHILD, _killed_while_holding, shared, texts  # noqa: F401 - shared: the fixture

runner = CliRunner()


def _files(folder) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_a_reader_on_a_restarted_home_shows_no_dead_turn_at_a_number_another_home_gave(shared, tmp_path):  # noqa: F811
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
    assert not [line for line in found.stdout.splitlines() if "│" in line and "acknowledged" in line], found.output
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


def test_a_dead_journal_of_two_sessions_one_held_elsewhere_is_recovered_in_two_steps(shared, tmp_path):  # noqa: F811
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


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class _SlowLeases:
    """A store's leases whose compare-and-swap takes `delay` seconds of the clock to come back (S3 under load)."""

    def __init__(self, clock: _Clock) -> None:
        self.rows: dict = {}
        self.clock = clock
        self.delay = 0.0

    def swap_lease(self, user, session, change):
        entry, result = change(self.rows.get((user, session)))
        self.clock.t += self.delay
        if entry is None:
            self.rows.pop((user, session), None)
        else:
            self.rows[(user, session)] = entry
        return result


def test_a_lease_is_trusted_from_before_its_commit_not_from_when_it_came_back(monkeypatch):
    """A home counted its lease from when the store's commit came back, while the lease ran from before
    it: with a commit taking 2.5 s of a 3 s lease, it kept writing 0.5 s past the expiry, beside the
    home that had taken the lease over (a suspect for the turn the handover test on S3 under load stored twice)."""
    from pager.errors import LeaseHeld
    from pager.lease import Leases

    monkeypatch.setattr(Leases, "_start", lambda self: None)   # no renewal thread: the clock is ours
    clock = _Clock()
    store = _SlowLeases(clock)
    a = Leases(lambda: store, "a", lease_s=3.0, wait_s=0.0, clock=clock)
    b = Leases(lambda: store, "b", lease_s=3.0, wait_s=0.0, clock=clock)
    store.delay = 2.5
    assert a.ensure("", "s")          # claimed at 1000.0, came back at 1002.5: it expires at 1003.0
    store.delay = 0.0
    clock.t = 1003.2
    assert b.ensure("", "s")          # lapsed: b takes it over
    with pytest.raises(LeaseHeld):
        a.ensure("", "s")             # a asks the store again, and is refused, instead of writing beside b


class _LeaseTable:
    """A store's leases table in memory; says when a lease is renewed while the home's idle flush runs."""

    def __init__(self) -> None:
        import threading

        self.rows: dict = {}
        self.lock = threading.Lock()
        self.flushing = threading.Event()
        self.renewed_while_flushing = threading.Event()

    def _lease_slot(self, user, session) -> int:
        return 0

    def swap_lease(self, user, session, change):
        return self.swap_leases([(user, session)], change)[(user, session)]

    def swap_leases(self, keys, change):
        with self.lock:
            out = {}
            for key in keys:
                entry, out[key] = change(self.rows.get(key))
                if entry is None:
                    self.rows.pop(key, None)
                else:
                    self.rows[key] = entry
                    if self.flushing.is_set():
                        self.renewed_while_flushing.set()
            return out


def test_a_lease_is_renewed_while_the_home_flushes_before_giving_it_up():
    """The lease thread flushed the idle home itself before giving the lease up, and renewed nothing
    meanwhile: a flush slower than the lease (S3 under load) let it lapse, another home took it and
    numbered its turns over those being flushed (the handover test lost an acknowledged turn on S3)."""
    from pager.lease import Leases

    table = _LeaseTable()
    given: list = []

    def flush_then_give_up(keys):   # Home._release_idle, with a flush that ends once a renewal was seen
        table.flushing.set()
        table.renewed_while_flushing.wait(60)
        given.extend(leases.give_up(keys))

    leases = Leases(lambda: table, "a", lease_s=0.3, wait_s=0.0, idle_s=0.05, on_idle=flush_then_give_up)
    try:
        leases.ensure("", "s")
        assert table.renewed_while_flushing.wait(60), "the lease was not renewed while the home flushed"
        while not given:
            table.renewed_while_flushing.wait(0.05)   # the event: the lease given up after the flush
        assert given == [("", "s")] and ("", "s") not in table.rows and ("", "s") not in leases.held
    finally:
        leases.stop()


def test_a_home_whose_lease_lapsed_under_unflushed_turns_keeps_them_for_its_next_process(tmp_path):
    """Host a stalls (nothing renews its lease: a pause, a network cut off from the store) with three
    acknowledged turns not yet flushed; host b takes the lapsed lease and writes turn 1. Host a's next
    write took the lease back as if it had never lost it, numbered turn 4, and its flush stored turns
    2-4: its acknowledged turn 1 was lost (the store keeps the first record of a number) and its pages
    did not hold b's turn. Now the write is refused naming the fix, and the next process of home a
    recovers the three after b's turn, as a dead process's."""
    from pager.config import Config
    from pager.errors import StoreError

    store = str(tmp_path / "store")

    def config(name: str, **kw):
        return Config.load(env={"PAGER_EMBEDDER": "hash", "PAGER_DB": store}, home=tmp_path / name, budget=2048, **kw)

    a = Home(config("a", lease_s=1.0), embedder=HashEmbedder())
    sa = a.open("s")
    for i in range(3):
        sa.append("ann", f"a {i}")
    a.leases.stop()   # the stall: host a lives on, its lease is no longer renewed
    with Home(config("b", lease_wait_s=120), embedder=HashEmbedder()) as b:
        assert b.open("s").append("bob", "b 0").turn == 1   # waited for the lapse; a's turns are in no store
    with pytest.raises(StoreError, match="restart this process"):
        sa.append("ann", "a 3")
    a.close()
    with Home(config("a"), embedder=HashEmbedder()) as again:
        assert again.recovered == 3, again.warnings
    with Home(config("c"), embedder=HashEmbedder(), read_only=True) as reader:
        assert texts(reader, "s") == ["b 0", "a 0", "a 1", "a 2"]
        assert check(reader, "", "s").ok


def test_a_flush_renews_the_lease_before_it_writes(tmp_path):
    """A flush trusted a lease renewed up to lease_s/3 before, so a store write slower than the two
    thirds left could finish after another home had taken the lapsed lease over and numbered its turns
    over the ones being written (the handover test on S3 under load). It renews first: the write has a
    whole lease."""
    from pager.config import Config

    config = Config.load(env={"PAGER_EMBEDDER": "hash", "PAGER_DB": str(tmp_path / "store")}, home=tmp_path / "a",
                         budget=2048)
    with Home(config, embedder=HashEmbedder()) as a:
        a.open("s").append("ann", "a turn to flush")
        seen = a.store.lease("", "s")["seen"]
        a.flush()
        assert a.store.lease("", "s")["seen"] > seen
