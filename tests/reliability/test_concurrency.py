"""Several processes on one home at once: no lost or duplicated turns, readers see writers' pages."""

import subprocess
import sys

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home

WRITER = """
import sys
from pager.config import Config
from pager.home import Home
home_path, session, tag, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cfg = Config(home=home_path, embedder="hash", flush_turns=16, compact_every=3, keep_versions_s=0.5)
with Home(cfg) as home:
    s = home.open(session)
    for i in range(count):
        if i % 3 == 0:
            s.append_many([{"speaker": tag, "text": f"{tag} turn {i}.{k} about the shared plan"} for k in range(3)])
        else:
            s.append(tag, f"{tag} turn {i} about the shared plan")
        if i % 10 == 0:
            s.search("shared plan", k=3)
print("done", s.turn_count, flush=True)
"""


def _expected(tag: str, count: int) -> set[str]:
    out = set()
    for i in range(count):
        if i % 3 == 0:
            out |= {f"{tag} turn {i}.{k} about the shared plan" for k in range(3)}
        else:
            out.add(f"{tag} turn {i} about the shared plan")
    return out


def test_writers_on_shared_and_separate_sessions(tmp_path):
    home = tmp_path / "home"
    count = 60
    plan = [("shared", "alpha"), ("shared", "beta"), ("solo-1", "gamma"), ("solo-2", "delta"), ("solo-3", "eps")]
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(home), session, tag, str(count)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for session, tag in plan]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    with Home(Config(home=home, embedder="hash"), embedder=HashEmbedder()) as h:
        for session in ("shared", "solo-1", "solo-2", "solo-3"):
            turns = h.store.turns("", session)
            texts = [t.text for t in turns]
            assert len(texts) == len(set(texts)), f"{session}: duplicated turns"
            assert [t.turn for t in turns] == list(range(1, len(turns) + 1)), f"{session}: gaps in turn numbers"
            tags = [tag for s, tag in plan if s == session]
            assert set(texts) == set().union(*(_expected(tag, count) for tag in tags)), f"{session}: lost turns"
            s = h.open(session)
            # every page of the session is on disk once, though both writers of "shared" sealed each
            stored = [row["n"] for row in h.store._rows("pages", "", session, columns=["n"])]
            assert sorted(stored) == list(range(1, len(stored) + 1)), f"{session}: pages stored twice or missing"
            assert s.turn_count == len(turns)
        shared = h.open("shared")
        assert {"alpha", "beta"} <= {p for page in shared.pages.values() for p in page.speakers}


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
