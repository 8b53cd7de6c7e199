"""Several processes on one home at once: no lost or duplicated turns, readers see writers' pages."""

import json
import os
import subprocess
import sys
from pathlib import Path

from harness import seed_for
from pager import fsck
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home

DRIVER = Path(__file__).with_name("driver.py")
PAGER = [sys.executable, "-c", "from pager.cli.app import main; main()"]


def _start(home, session, seed, mode, count):
    return subprocess.Popen([sys.executable, str(DRIVER), str(home), session, str(seed), mode, str(count)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _acks(out: str) -> list[tuple[int, str]]:
    return [(int(line.split(" ", 2)[1]), line.split(" ", 2)[2]) for line in out.splitlines() if line.startswith("ack ")]


def test_every_kind_of_writer_and_reader_at_once(tmp_path):
    """3 sessions x 2 writers of different kinds (chat, ingest, Toolkit, MCP, the `pager ingest`
    command twice on one file), readers, and half the processes starting mid-run, after the first
    acknowledgement: every acknowledged turn is stored once, in order, on exactly one page or the
    open tail, and the file imported twice is stored once."""
    home = tmp_path / "home"
    lines = tmp_path / "import.jsonl"
    lines.write_text("".join(json.dumps({"speaker": "imp", "text": f"imported line {i} about the harbour"}) + "\n"
                             for i in range(150)))
    first = [("s1", "mixed"), ("s2", "mcp"), ("s3", "tools")]
    later = [("s1", "tools"), ("s2", "ingest")]
    procs = [(session, _start(home, session, seed_for("conc", session, mode), mode, 40)) for session, mode in first]
    first_ack = procs[0][1].stdout.readline()  # the first writer has acknowledged: now the rest start
    assert first_ack.startswith("ack "), procs[0][1].stderr.read()[-3000:]
    env = {**os.environ, "PAGER_EMBEDDER": "hash", "PAGER_HOME": str(home)}
    cli = [subprocess.Popen(PAGER + ["ingest", str(lines), "--session", "s3"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(2)]
    procs += [(session, _start(home, session, seed_for("conc", session, mode, 2), mode, 40)) for session, mode in later]
    readers = [_start(home, session, 7, "reader", 12) for session in ("s1", "s2")]
    acked: dict[str, list] = {"s1": _acks(first_ack), "s2": [], "s3": []}
    for session, proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        acked[session] += _acks(out)
    for proc in cli + readers:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
    with Home(Config(home=home, embedder="hash"), embedder=HashEmbedder()) as h:
        for session in ("s1", "s2", "s3"):
            assert not fsck.acknowledged(h, "", session, acked[session])
            report = fsck.check(h, "", session)
            assert report.ok, (session, report.problems)
            texts = [t.text for t in fsck.durable_turns(h, "", session)]
            assert len(acked[session]) >= 40
            if session == "s3":
                imported = [t for t in texts if t.startswith("imported line")]
                assert imported == [f"imported line {i} about the harbour" for i in range(150)]


READER = """
import sys, time
from pager.config import Config
from pager.home import Home
with Home(Config(home=sys.argv[1], embedder="hash")) as home:
    s = home.open("live")
    print("ready", flush=True)
    sys.stdin.readline()
    hits = s.search("lighthouse keeper", k=3)
    print("seen" if any("lighthouse keeper" in s.render.snippet(h) for h in hits) else "missed", s.turn_count, flush=True)
"""


def test_a_reader_sees_a_live_writers_pages(tmp_path):
    home = tmp_path / "home"
    reader = subprocess.Popen([sys.executable, "-c", READER, str(home)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "ready"
    with Home(Config(home=home, embedder="hash", flush_turns=10_000), embedder=HashEmbedder()) as h:
        s = h.open("live")
        for i in range(100):
            s.append("ann", f"filler {i}")
        s.append("bob", "The lighthouse keeper's name is Ottilie.")
        for i in range(100):
            s.append("ann", f"more filler {i}")
        out, _ = reader.communicate("go\n", timeout=60)  # the writer has not flushed: only its journal has them
    assert out.split() == ["seen", "201"]
