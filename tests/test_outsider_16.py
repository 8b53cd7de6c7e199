"""What an outside tester found attacking the write path with several homes on one store: lease holders
killed with SIGKILL, homes restarting while another holds the lease, readers in between."""

import json

from typer.testing import CliRunner

from pager.cli.app import app
from pager.embed import HashEmbedder
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
