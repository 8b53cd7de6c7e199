"""Many small writes leave a bounded number of LanceDB files and versions (not a timing test)."""

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home


def test_files_and_versions_stay_bounded(tmp_path):
    cfg = Config(home=tmp_path / "h", page_tokens=64, embedder="hash", flush_turns=4, compact_every=5,
                 keep_versions_s=0)
    counts = []
    with Home(cfg, embedder=HashEmbedder()) as home:
        s = home.open("many")
        for round_ in range(4):
            for i in range(100):
                s.append("ann", f"round {round_} message {i} with a few words")
            home.flush()
            home.store.compact(0)
            counts.append(home.store.stats())
        assert home.flushes >= 100
    files = [c["files"] for c in counts]
    versions = [c["versions"] for c in counts]
    # 100 more flushes per round would add hundreds of files and versions if nothing were compacted
    assert max(files) - min(files) < 40, files
    assert max(versions) < 40, versions
