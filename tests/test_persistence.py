"""What one process writes, another reads: pages, page table, bookmarks; kill -9 loses no acknowledged turn."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home

WRITER = """
import sys
from pager.config import Config
from pager.home import Home
cfg = Config(home=sys.argv[1], budget=2048, page_tokens=128, embedder="hash")
with Home(cfg) as home:
    s = home.open("work")
    for i in range(120):
        s.append("ann" if i % 2 else "bob", f"turn {i}: the Zeta{i % 7} build uses flag number {i * 13}")
    s.pin(3)
    s.bookmark([5], ["release notes"], "where the release plan is")
    s.fault(2, "test")
    print(__import__("json").dumps({"resident": s.resident(), "pages": len(s.pages), "tick": s.tick}))
"""

READER = """
import sys, json
from pager.config import Config
from pager.home import Home
cfg = Config(home=sys.argv[1], budget=2048, page_tokens=128, embedder="hash")
with Home(cfg) as home:
    s = home.open("work")
    print(json.dumps({"resident": s.resident(), "pages": len(s.pages), "tick": s.tick, "turns": s.turn_count,
                      "pinned": [n for n, e in s.table.items() if e.pinned], "release": sorted(s.directory.lookup("release notes")),
                      "text5": s.pages[5].text}))
"""


def py(code, *args):
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_page_table_survives_across_processes(tmp_path):
    home = str(tmp_path / "h")
    wrote = py(WRITER, home)
    read = py(READER, home)
    assert read["resident"] == wrote["resident"]
    assert read["pages"] == wrote["pages"] and read["tick"] == wrote["tick"]
    assert read["turns"] == 120 and read["pinned"] == [3] and read["release"] == [5]
    assert "turn" in read["text5"]


KILLED = """
import sys
from pager.config import Config
from pager.home import Home
cfg = Config(home=sys.argv[1], budget=2048, page_tokens=128, embedder="hash", flush_turns=64)
home = Home(cfg)
s = home.open("crash")
i = s.turn_count
while True:
    batch = [{"speaker": "ann", "text": f"acknowledged message {i + k}"} for k in range(7)]
    turns = s.append_many(batch)
    i += 7
    print(turns[-1].turn, flush=True)
"""


def test_kill_9_mid_ingest_loses_no_acknowledged_turn(tmp_path):
    home = str(tmp_path / "h")
    for round_ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", KILLED, home], stdout=subprocess.PIPE, text=True)
        acked = 0
        deadline = time.time() + 60
        target = 150 + 247 * round_
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            acked = int(line)
            if acked >= target:
                break
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert acked >= target
        out = py("""
import sys, json
from pager.config import Config
from pager.home import Home
cfg = Config(home=sys.argv[1], budget=2048, page_tokens=128, embedder="hash")
with Home(cfg) as home:
    s = home.open("crash")
    texts = [t.text for t in home.store.turns("", "crash")]
    print(json.dumps({"turns": s.turn_count, "texts": texts}))
""", home)
        texts = out["texts"]
        assert len(texts) == len(set(texts)), "a turn was stored twice"
        assert [t.split()[-1] for t in texts] == [str(i) for i in range(len(texts))], "order or gap"
        assert len(texts) >= acked, f"acknowledged {acked}, found {len(texts)}"
        assert out["turns"] == len(texts)
    assert not list((tmp_path / "h" / "journal").glob("*.jsonl")), "recovered segments are removed"


def test_the_index_cache_is_used_and_a_stale_or_damaged_one_is_ignored(tmp_path):
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home

    cfg = Config(home=tmp_path / "h", page_tokens=64, embedder="hash")
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        s.append_many([{"speaker": "ann", "text": f"note {i} about topic{i % 13} and the harbour"} for i in range(1000)])
        expected = [h.n for h in s.search("topic7 harbour", k=5)]
    caches = list((tmp_path / "h" / "cache").glob("*.index"))
    assert len(caches) == 1
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        assert s.index_saved == len(s.index)  # loaded from the cache
        assert [h.n for h in s.search("topic7 harbour", k=5)] == expected
    caches[0].write_bytes(b"not a pickle")
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("c")
        assert s.index_saved == -1  # rebuilt from the store
        assert [h.n for h in s.search("topic7 harbour", k=5)] == expected


SNAPSHOT_READER = """
import sys, json
from pager.config import Config
from pager.home import Home
cfg = Config(home=sys.argv[1], budget=2048, page_tokens=128, embedder="hash")
with Home(cfg) as home:
    s = home.open("big", read_only=sys.argv[2] == "ro")
    hits = s.search("ticket 1234 harbour", k=5, record=False)
    print(json.dumps({"snapshot": type(s.source).__name__, "lancedb": "lancedb" in sys.modules,
                      "hits": [[h.n, h.score] for h in hits], "turns": s.turn_count, "pages": len(s.pages),
                      "resident": s.resident(), "marks": sorted(s.directory.lookup("release notes")),
                      "tail": s.packer.pieces[-1].line if s.packer.pieces else ""}))
"""


def _big_session(home_dir, turns=1700):
    cfg = Config(home=home_dir, budget=2048, page_tokens=128, embedder="hash")
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("big")
        s.append_many([{"speaker": "ann" if i % 2 else "bob", "text": f"ticket {i} about the harbour crane {i % 13}"}
                       for i in range(turns)])
        s.bookmark([2], ["release notes"], "the plan")
        s.search("harbour crane 7", k=8)      # page some in: the page table is not the default one


@pytest.mark.parametrize("turns", [1700, 40])
def test_a_read_only_open_uses_the_last_snapshot_without_the_store(tmp_path, turns):
    """Small sessions too (40 turns, 4 pages): below 200 pages none was kept, and every `pager search`
    of a small session paid LanceDB's import (~2.5 s of its 2.7)."""
    home = str(tmp_path / "h")
    _big_session(home, turns)
    fast, slow = py(SNAPSHOT_READER, home, "ro"), py(SNAPSHOT_READER, home, "rw")
    assert fast["snapshot"] == "Snapshot" and not fast["lancedb"]
    assert slow["snapshot"] == "NoneType" and slow["lancedb"]
    same = {k for k in fast if k not in ("snapshot", "lancedb")}
    assert {k: fast[k] for k in same} == {k: slow[k] for k in same}
    assert fast["turns"] == turns and fast["marks"] == [2]


def test_a_snapshot_is_not_trusted_once_something_was_appended(tmp_path):
    home = str(tmp_path / "h")
    _big_session(home)
    cfg = Config(home=home, budget=2048, page_tokens=128, embedder="hash")
    writer = Home(cfg, embedder=HashEmbedder())
    s = writer.open("big")
    s.append("ann", "ticket 1234 about the harbour: the crane is fixed")
    writer.flush()                   # in the store, but the snapshot was written before it
    read = py(SNAPSHOT_READER, home, "ro")
    assert read["snapshot"] == "NoneType" and read["turns"] == 1701
    assert "the crane is fixed" in read["tail"]
    writer.close()
    again = py(SNAPSHOT_READER, home, "ro")   # the writer's close left a new snapshot
    assert again["snapshot"] == "Snapshot" and again["turns"] == 1701 and not again["lancedb"]


def test_turns_embedded_while_the_journal_syncs_give_the_same_index(tmp_path):
    """A durable home embeds an accepted group's texts on an embedding thread during the fsync and seals
    pages with those vectors; the index is the one a home without that thread builds."""
    import numpy as np

    from pager.store import MemoryStore

    texts = [f"turn {i}: the Zeta{i % 7} build uses flag number {i * 13} " + "and more words " * (i % 9) for i in range(200)]

    def ingest(durable: bool):
        cfg = Config(home=tmp_path / f"h{durable}", budget=2048, page_tokens=128, embedder="hash")
        home = Home(cfg, store=MemoryStore(), embedder=HashEmbedder(), durable=durable)
        s = home.open("work")
        for i in range(0, len(texts), 20):
            s.append_many([{"speaker": "ann" if j % 2 else "bob", "text": t} for j, t in enumerate(texts[i : i + 20])])
        used = home.writes.early is not None
        vectors = s.index.vectors().copy()
        home.close()
        return vectors, used

    early, used = ingest(True)
    plain, unused = ingest(False)
    assert used and not unused   # the durable home handed the embedding over; the other had nothing to wait for
    assert len(early) > 100 and np.array_equal(early, plain)
