"""What an outsider found on the memory tiers' writes with several processes and crashes, the 27th pass:
a Toolkit, state changes, facts, summaries and bookmarks written by one process while another writes
turns, homes sharing one store, holders SIGKILLed and recovered. Each test fails on the code before its
fix. Several Homes in one process stand for processes of one home, as tests/test_write_path.py does."""

import json

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.replay import replay
from pager.tools import Toolkit

QUIET = "ok that sounds fine to me, we can talk again later about it, number {}"   # a page with no keyword of its own


def _config(tmp_path, **kw) -> Config:
    return Config(home=tmp_path / "home", embedder="hash", page_tokens=128, session="s", **kw)


def test_a_bookmark_another_process_made_is_placed_as_its_maker_places_it_and_replays(tmp_path):
    """Process B bookmarks page p1 (the model's `bookmark` tool) while process A's Toolkit records a trace.
    Before: A took the bookmark in from B's journal behind the page's own keywords (B, and every process
    opening the session from the store, put a model's bookmark first), and wrote no event for it, so
    `pager replay --check` of A's trace diverged at A's next search (`bookmarks: zebra` recorded, not
    replayed); a bookmark B made before A's trace began was missing from its snapshot too."""
    config = _config(tmp_path)
    b = Home(config, embedder=HashEmbedder())
    sb = b.open("s")
    for i in range(30):
        sb.append("user", "Lisbon Porto Madrid Berlin Halvorsen contract " + QUIET.format(i))
    sb.bookmark([1], ["giraffe"], "before the trace")   # in B's journal only when A's trace begins
    a = Toolkit(config=config)
    assert a.session.directory.keywords(1)[0] == "giraffe"
    sb.bookmark([1], ["zebra"], "animals")
    found = a.call("search", json.dumps({"query": "Lisbon contract number 1", "k": 20}))
    assert "bookmarks: zebra, giraffe" in found, found   # the first four keywords of a page are shown
    with Home(config, embedder=HashEmbedder(), read_only=True) as c:   # what opening the session shows
        fresh = c.open("s").directory.keywords(1)
    assert a.session.directory.keywords(1) == fresh == sb.directory.keywords(1)
    assert fresh[:2] == ["zebra", "giraffe"]
    path = a._writer.path
    a.close()
    b.close()
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence
