"""A home written by release 0.1 (tests/fixtures/home-v1) opens with today's pager: the store is
migrated by its named steps with a notice, the dead process's v1 journal segment is recovered, and
searches answer as that release answered."""

import json
import shutil
from pathlib import Path

from pager import fsck
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home

FIXTURE = Path(__file__).parent / "fixtures" / "home-v1"


def test_a_release_0_1_home_opens_migrates_and_answers_the_same(tmp_path):
    home_path = tmp_path / "home"
    shutil.copytree(FIXTURE, home_path, ignore=shutil.ignore_patterns("expected.json"))
    expected = json.loads((FIXTURE / "expected.json").read_text())
    cfg = Config(home=home_path, embedder="hash", budget=2048)
    with Home(cfg, embedder=HashEmbedder()) as home:
        assert any("m002_turn_keys" in w for w in home.warnings), home.warnings
        assert any("m004_memory_tiers" in w for w in home.warnings), home.warnings
        assert any("m005_summaries" in w for w in home.warnings), home.warnings
        s = home.open("maya")
        assert s.turn_count == expected["turns"] and len(s.pages) == expected["pages"]
        assert sorted(e.n for e in s.table.values() if e.pinned) == expected["pinned"]
        assert [t.text for t in fsck.durable_turns(home, "", "maya")] == expected["texts"]
        for query, pages in expected["searches"].items():
            assert [h.id for h in s.search(query, k=5, record=False)] == pages, query
        assert [t.text for t in home.store.turns("bob", "other")] == expected["bob"]
        assert fsck.check(home, "", "maya").ok
        s.append("Maya", "a turn written by this release", key="k-1")
        s.set_state("home city", "Berlin")
    with Home(cfg, embedder=HashEmbedder()) as home:
        assert not home.warnings  # migrated once
        assert home.store.keys("", "maya") == {"k-1": expected["turns"] + 1}
        assert home.open("maya").state.values() == {"home city": "Berlin"}


def test_a_store_this_pager_cannot_read_refuses_to_open_naming_the_fix(tmp_path):
    import pytest

    from pager.errors import StoreError
    from pager.store import LanceStore

    uri = str(tmp_path / "db")
    LanceStore(uri, dim=8)
    with pytest.raises(StoreError, match="8-dim vectors.*PAGER_EMBEDDER"):
        LanceStore(uri, dim=16)
    store = LanceStore(uri, dim=8)
    store._set_meta({"schema": "99"})
    with pytest.raises(StoreError, match="schema v99, newer than this pager.*upgrade pager"):
        LanceStore(uri, dim=8)
