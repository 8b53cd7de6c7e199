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
from pager.store import LanceStore

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
        assert any("m006_vector_dims" in w for w in home.warnings), home.warnings  # a no-op: hash vectors stay 256
        assert any("m008_piece_tokens" in w for w in home.warnings), home.warnings
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


def test_a_store_of_256_dim_wordllama_vectors_is_cut_to_128_and_answers_as_a_fresh_one(tmp_path):
    """m006_vector_dims: wordllama's vectors went from 256 to 128 dims (Matryoshka: the leading dims,
    renormalised, are the 128-dim embedding). A store written by the previous release (256-dim vectors,
    schema 4) is cut on open, with a notice; it then holds what a store written at 128 dims holds (to
    float16 rounding) and answers these searches with the same pages in the same order (over LoCoMo's
    1,157 questions 6 swap near-tied pages: BENCHMARKS.md). A read-only
    open before that refuses, naming `pager migrate`; a 256-dim index cache is rebuilt, not read."""
    import numpy as np
    import pytest

    from pager.bench.scale import TextGenerator
    from pager.embed import WordLlamaEmbedder
    from pager.errors import StoreError

    texts = json.loads((FIXTURE / "expected.json").read_text())["texts"] + TextGenerator(7).turns(900)
    old, new = WordLlamaEmbedder(256), WordLlamaEmbedder()
    assert new.dim == 128

    def write(folder, embedder):
        cfg = Config(home=tmp_path / folder, embedder="wordllama", budget=2048)
        with Home(cfg, embedder=embedder) as home:
            home.open("maya").append_many([{"speaker": "Maya", "text": t} for t in texts])
        return cfg

    before = write("old", old)
    meta = LanceStore(str(before.db_uri), dim=256)._tables["meta"]  # as the previous release left it: schema 4
    meta.delete("key = 'migration:m006_vector_dims'")
    meta.update(where="key = 'schema'", values={"value": "4"})
    assert any(path.suffix == ".index" for path in (tmp_path / "old" / "cache").iterdir())  # a 256-dim cache
    with pytest.raises(StoreError, match="256-dim vectors.*128.*pager migrate"):
        Home(before, embedder=new, read_only=True).open("maya")
    fresh = write("new", new)
    queries = ["peanut allergy", "sync engine CRDT", "Halvorsen contract", "CI bill browser tests", "who moved to Lisbon",
               "the dog's vet appointment", "budget for the offsite"]
    with Home(before, embedder=new) as migrated, Home(fresh, embedder=new, read_only=True) as made:
        a, b = migrated.open("maya"), made.open("maya")
        assert any("m006_vector_dims" in w for w in migrated.warnings), migrated.warnings
        (pages_a, vectors_a), (pages_b, vectors_b) = migrated.store.pages("", "maya"), made.store.pages("", "maya")
        assert [p.n for p in pages_a] == [p.n for p in pages_b] and len(pages_a) > 20
        assert all(va.shape == vb.shape and va.shape[1] == 128 for va, vb in zip(vectors_a, vectors_b))
        assert max(float(np.abs(va - vb).max()) for va, vb in zip(vectors_a, vectors_b)) < 2e-3  # float16 rounding
        for query in queries:
            assert [h.id for h in a.search(query, k=5, record=False)] == [h.id for h in b.search(query, k=5, record=False)], query
    with Home(before, embedder=new) as again:
        again.open("maya")
        assert not again.warnings  # cut once


def test_wordllama_comes_at_its_matryoshka_sizes_and_names_them_when_asked_for_another():
    import numpy as np
    import pytest

    from pager.embed import make_embedder, trace_embedder
    from pager.errors import ConfigError

    full, cut = make_embedder("wordllama:256"), make_embedder("wordllama")
    assert (full.dim, cut.dim) == (256, 128)
    a, b = full.embed(["the spare key is under the blue flowerpot"]), cut.embed(["the spare key is under the blue flowerpot"])
    head = a[:, :128] / np.linalg.norm(a[:, :128], axis=1, keepdims=True)
    assert float(np.abs(head - b).max()) < 1e-6  # the leading dims, renormalised, are the smaller model
    with pytest.raises(ConfigError, match="64, 128, 256"):
        make_embedder("wordllama:300")
    assert trace_embedder("wordllama", None) == "wordllama:256"   # recorded before traces carried the size
    assert trace_embedder("wordllama", 128) == "wordllama" and trace_embedder("hash", 256) == "hash"
