"""A process of a home that dies while another process of the same home runs on (a `pager ingest`
killed beside a `pager serve`) is recovered by that live process (Home.recover_dead): at its next
flush, or when its sessions go idle, the dead process's turns and other records reach the store
once, its journal segment goes, and the live process gives its idle leases up again, as if the
dead process had closed. Before, the segment waited for the next process to start: its turns
reached no other host, and the live process held its leases for good (a dead segment counted as a
live sibling's)."""

import json
import signal
import subprocess
import sys
import time

from pager.config import Config
from pager.embed import HashEmbedder
from pager.fsck import check
from pager.home import Home
from pager.replay import replay
from pager.trace import TraceWriter, begin

from conftest import say

DYING = """
import sys
from pager.config import Config
from pager.home import Home
cfg = Config(home=sys.argv[1], budget=2048, page_tokens=128, embedder="hash", flush_turns=100_000)
home = Home(cfg)
s = home.open("shared")
turns = s.append_many([{"speaker": "dee", "text": f"the dying process says {i}"} for i in range(int(sys.argv[2]))])
s.set_state("owner", "dee")
s.bookmark([s.tail_n], ["dying"], note="before the kill")
print(turns[-1].turn, flush=True)
sys.stdin.read()   # alive until killed
"""


def _dying(home: str, turns: int) -> int:
    """Run a process of the home that appends `turns` turns, a state change and a bookmark, never
    flushes, and is killed with SIGKILL once it has acknowledged them; returns its last turn."""
    proc = subprocess.Popen([sys.executable, "-c", DYING, home, str(turns)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()   # the acknowledgement: everything above is in its journal
        assert line.strip(), proc.stderr.read()
        return int(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)


def _segments(home) -> list[str]:
    return sorted(p.name for p in (home.local / "journal").glob("*.wal"))


def test_a_live_process_recovers_a_sibling_killed_beside_it_at_its_next_flush(tmp_path):
    config = Config(home=tmp_path / "h", budget=2048, page_tokens=128, embedder="hash", flush_turns=16)
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("shared")
        say(s, 5)                                    # journaled, not flushed (16 records make a flush)
        last = _dying(str(tmp_path / "h"), 30)
        assert last == 35
        assert len(_segments(home)) == 2             # ours and the dead process's
        say(s, 12, start=100)                        # 17 records: a flush, then the dead segment is recovered
        assert _segments(home) == [home.journal.path.name]
        assert any("recovered the journal" in w for w in home.warnings), home.warnings
        stored = home.store.turns("", "shared")
        assert [t.turn for t in stored] == list(range(1, 48))   # once each, in order, nothing missing
        assert [t.text for t in stored[5:35]] == [f"the dying process says {i}" for i in range(30)]
        assert [c.key for c in home.store.state_changes("", "shared")] == ["owner"]
        assert [b.note for b in home.store.bookmarks("", "shared") if b.note] == ["before the kill"]
        assert s.turn_count == 47 and s.state.values() == {"owner": "dee"}
        report = check(home, "", "shared")
        assert not report.problems, report.problems
    with Home(config, embedder=HashEmbedder()) as again:   # the next process finds nothing left to recover
        assert again.recovered == 0 and again.open("shared").turn_count == 47
        assert not check(again, "", "shared").problems


def test_a_live_process_gives_its_idle_leases_up_after_a_sibling_dies(tmp_path):
    """A dead process's segment counted as a live sibling's, so the idle leases were kept, and renewed,
    until this process closed: no other host could write the session meanwhile."""
    config = Config(home=tmp_path / "h", budget=2048, page_tokens=128, embedder="hash", lease_s=2.0,
                    lease_idle_s=0.3)
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("shared")
        say(s, 3)
        _dying(str(tmp_path / "h"), 4)
        say(s, 1, start=100)   # written after the other process died: the lease is this process's now
        assert ("", "shared") in home.leases.held
        deadline = time.monotonic() + 60   # the lease thread looks every lease_idle_s / 4: an event, waited for
        while home.leases.held and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not home.leases.held, (home.warnings, _segments(home))
        assert home.store.swap_lease("", "shared", lambda entry: (entry, entry)) is None   # no holder in the store
        assert [t.turn for t in home.store.turns("", "shared")] == list(range(1, 9))
        assert len(_segments(home)) <= 1


def test_a_trace_replays_exactly_across_a_sibling_recovered_while_it_records(tmp_path):
    """The dead process's records this process had not read are taken in with their events before its
    segment is recovered (here by the lease thread, the session idle), and its pins are not laid over
    this process's page table: the recording replays with --check."""
    config = Config(home=tmp_path / "h", budget=2048, page_tokens=128, embedder="hash", lease_s=2.0,
                    lease_idle_s=0.3)
    live, other = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    s, dying = live.open("shared"), other.open("shared")
    writer = TraceWriter(tmp_path / "live.jsonl")
    s.events.listeners.append(writer)
    begin(s, "pager/offline", 2048)
    say(s, 4)
    dying.sync()
    say(dying, 6, start=50)
    dying.pin(1)
    dying.set_state("phase", "two")
    other.journal.close(remove=False)   # as a SIGKILL leaves it: the segment stays, its lock is gone
    other.leases.stop()
    deadline = time.monotonic() + 60    # recovered by the lease thread once the session is idle: waited for
    while len(_segments(live)) > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not live.journal.dead() and len(_segments(live)) == 1
    assert not s.table[1].pinned        # the dead process's pin was its own page table's
    assert s.turn_count == 10 and s.state.values() == {"phase": "two"}
    say(s, 3, start=100)
    writer.close()
    kinds = [(e["kind"], e.get("origin")) for e in map(json.loads, open(writer.path))]
    assert ("append", "other process") in kinds
    run = replay(writer.path, check=True)
    assert run.divergence is None, run.divergence
    assert not check(live, "", "shared").problems
    live.close()
