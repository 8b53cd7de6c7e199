"""What a command loads before it answers: a command that only looks at a small session reads the
snapshot the last writer left, and imports neither LanceDB nor litellm (LanceDB alone is ~2.3 s of a
cold process, litellm ~6.5 s), nor the embedder unless it embeds a query; its answers are the ones the
store gives. With the default embedder (wordllama), as a new user runs them."""

import json
import subprocess
import sys

import pytest

from pager.bench.startup import NOTES   # the small session the start-up bench measures

# runs one command in a process of its own, then says which heavy packages it imported
PROBE = """
import json, sys
from pager.cli.app import app
try:
    app(sys.argv[1:], standalone_mode=False)
finally:
    loaded = [m for m in ("lancedb", "litellm", "wordllama", "tiktoken") if m in sys.modules]
    embed = sys.modules.get("pager.embed")
    loaded += [f"embedder {name}" for name in (embed._CACHE if embed else ())]   # embedders made, by name
    print("\\n" + json.dumps(loaded), file=sys.stderr)
"""

LOOKS = {"check": ["check", "-s", "planning"], "export": ["export", "-s", "planning"],
         "inspect": ["inspect", "-s", "planning", "--json"], "sessions": ["sessions", "--json"],
         "search": ["search", "Lisbon budget", "-s", "planning", "--json"]}


def command(home, args, cwd=None):
    out = subprocess.run([sys.executable, "-c", PROBE, "--home", str(home), *args], capture_output=True, text=True,
                         timeout=300, env={"PATH": "/usr/bin:/bin"}, cwd=cwd)
    assert out.returncode == 0, out.stderr
    return out.stdout, json.loads(out.stderr.strip().splitlines()[-1])


@pytest.fixture
def small_home(tmp_path):
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps(n) + "\n" for n in NOTES))
    home = tmp_path / "h"
    _, loaded = command(home, ["ingest", str(notes), "-s", "planning"])
    assert "lancedb" in loaded   # a write goes to the store
    out, _ = command(home, ["summarize", "-s", "planning"])   # summaries: a tier whose records have vectors
    assert "3 new summaries" in out
    return home


def test_looking_at_a_small_session_imports_no_lancedb_and_answers_as_the_store_does(small_home):
    fast = {name: command(small_home, args) for name, args in LOOKS.items()}
    for name, (_, loaded) in fast.items():
        assert "lancedb" not in loaded and "litellm" not in loaded, name
    for name in ("check", "export", "inspect", "sessions"):   # these embed nothing (the summaries' vectors are kept)
        assert "embedder wordllama" not in fast[name][1], name
    assert "embedder wordllama" in fast["search"][1]   # the query's vector
    assert "wordllama" not in fast["search"][1]   # made from its weights: the package is not imported
    for name, (_, loaded) in fast.items():   # the open page's counts come with the snapshot
        assert "tiktoken" not in loaded, name
    for cache in (small_home / "cache").iterdir():   # without the caches every answer comes from the store
        cache.unlink()
    slow = {name: command(small_home, args) for name, args in LOOKS.items()}
    assert "lancedb" in slow["check"][1] and "lancedb" in slow["export"][1]
    for name in LOOKS:
        assert fast[name][0] == slow[name][0], name
    assert "7 turns" in fast["check"][0] and "ok" in fast["check"][0]
    assert len(fast["export"][0].splitlines()) == 7


def test_a_snapshot_is_not_read_once_the_session_grew(small_home):
    from pager.config import Config
    from pager.home import Home

    writer = Home(Config(home=small_home))
    writer.open("planning").append("Sam", "The offsite moved to Porto.")
    writer.flush()   # in the store; the snapshot was written before it
    out, loaded = command(small_home, ["export", "-s", "planning"])
    assert "Porto" in out and "lancedb" in loaded
    writer.close()   # leaves a snapshot of eight turns
    out, loaded = command(small_home, ["export", "-s", "planning"])
    assert "Porto" in out and len(out.splitlines()) == 8 and "lancedb" not in loaded


def test_a_home_named_by_a_relative_path_finds_the_same_snapshot(small_home):
    """The caches are keyed by the store's real path: `--home h` from its parent folder and `--home /abs/h`
    are one home, and the snapshot one left serves the other."""
    out, loaded = command(small_home.name, ["export", "-s", "planning"], cwd=small_home.parent)
    assert len(out.splitlines()) == 7 and "lancedb" not in loaded


TAIL_PROBE = """
import json, sys
from pager.config import Config
from pager.home import Home
with Home(Config(home=sys.argv[1], page_tokens=64), read_only=True) as h:
    s = h.open("planning")
    pieces = [(p.turn.turn, p.start, p.end, p.line) for p in s.packer.pieces]
    out = {"pieces": pieces, "body": s.packer.body_tokens, "next": s.tail_n}
print(json.dumps({**out, "tiktoken": "tiktoken" in sys.modules}))
"""


def test_the_open_page_from_a_snapshot_packs_as_from_the_store_without_the_encoding(tmp_path):
    """A session whose last sealed page ends inside a turn: a read-only open from its snapshot packs the
    open page's turns again with the counts the snapshot brought (the encoding never loads), to the same
    pieces and count as an open that reads the store and counts them itself."""
    from pager.config import Config
    from pager.home import Home

    home = tmp_path / "h"
    long = "The offsite plan, item by item: " + ", ".join(f"stop {i} in Lisbon at {i + 9}:00" for i in range(40))
    with Home(Config(home=home, page_tokens=64)) as h:
        s = h.open("planning")
        for note in [*NOTES, {"speaker": "Maya", "text": long}]:
            s.append(note.get("speaker", "assistant"), note.get("text") or note["content"])
    def opened():
        out = subprocess.run([sys.executable, "-c", TAIL_PROBE, str(home)], capture_output=True, text=True,
                             timeout=300, env={"PATH": "/usr/bin:/bin"})
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    fast = opened()
    assert fast["pieces"] and fast["tiktoken"] is False
    assert fast["pieces"][0][1] > 0   # the open page starts inside the long turn, where the last sealed page ends
    for cache in (home / "cache").iterdir():
        cache.unlink()
    slow = opened()
    assert slow["tiktoken"] is True   # without the snapshot the open page is counted here
    assert {k: v for k, v in fast.items() if k != "tiktoken"} == {k: v for k, v in slow.items() if k != "tiktoken"}


def test_the_pager_process_starts_blas_on_one_thread_unless_its_user_chose():
    from pager.cli.app import one_blas_thread

    environ = {"PATH": "/usr/bin"}
    one_blas_thread(environ)
    assert environ["OPENBLAS_NUM_THREADS"] == "1"
    chosen = {"OMP_NUM_THREADS": "4"}
    one_blas_thread(chosen)
    assert chosen == {"OMP_NUM_THREADS": "4"}   # the user's choice is kept, and no other is added
    # `python -m pager` imports no numpy before main() sets it: a command that needs numpy imports it later
    out = subprocess.run([sys.executable, "-c", "import sys, pager.cli.app; print('numpy' in sys.modules)"],
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr
