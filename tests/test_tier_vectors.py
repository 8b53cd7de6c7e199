"""Facts and summaries keep their vectors in the store (schema 9, `m009_tier_vectors`), tagged with the
embedder that made them: a writing open of a session with facts embeds none of them; a store written
before the column migrates and embeds its facts and summaries once, writing them back; another embedder
(another name or size) embeds them again instead of ranking by vectors it did not make; a fact a dead
process journaled and never stored is stored with its vector when it is recovered."""

import numpy as np
import pytest

from pager.config import Config
from pager.embed import HashEmbedder, embedder_key
from pager.facts import Draft
from pager.home import Home
from pager.store import LanceStore, MemoryStore
from pager.summaries import Draft as SummaryDraft


class Counting(HashEmbedder):
    """The hash embedder, saying which texts it embedded."""

    def __init__(self, dim: int = 256) -> None:
        super().__init__(dim)
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts += list(texts)
        return super().embed(texts)


class Other(Counting):
    """Another embedder of the same size: a store of its vectors opens with the hash embedder's size."""

    name = "other"

    def embed(self, texts):
        return -super().embed(texts)


FACTS = [Draft("home city", "Maya lives in Paris.", (1,)), Draft("project deadline", "The deadline is 14 March.", (2,)),
         Draft("home city", "Maya moved to Berlin, near the river.", (30,))]
SUMMARIES = [SummaryDraft("episode", "e1", "Maya talked about Paris and the deadline.", (1, 20)),
             SummaryDraft("rolling", "rolling", "Maya moved from Paris to Berlin; the deadline is 14 March.", (1, 40))]
TEXTS = [d.text for d in FACTS] + [d.text for d in SUMMARIES]


def _config(tmp_path) -> Config:
    return Config(home=tmp_path / "h", budget=1024, embedder="hash", page_tokens=128)


def _written(config: Config) -> None:
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("moves")
        s.append_many([{"speaker": "Maya", "text": f"turn {i}: the trains, the river, the cafe number {i}.",
                        "ts": 1_700_000_000 + 3_600 * i} for i in range(40)])
        s.add_facts(FACTS, "script")
        s.add_summaries(SUMMARIES, "script")


def _tier_texts(embedded: list[str]) -> list[str]:
    return [t for t in embedded if t in TEXTS]


def _held(s) -> dict[str, np.ndarray]:
    return {**{f.text: v for f, v in zip(s.facts.items, s.facts._vectors)},
            **{x.text: v for x, v in zip(s.summaries.items, s.summaries._vectors)}}


def _expected(embedder, texts=TEXTS) -> dict[str, np.ndarray]:
    return dict(zip(texts, embedder.embed(texts).astype(np.float16).astype(np.float32)))


def test_a_writing_open_of_a_session_with_facts_embeds_none_of_them(tmp_path):
    config = _config(tmp_path)
    _written(config)
    embedder = Counting()
    with Home(config, embedder=embedder) as home:
        s = home.open("moves")
        assert len(s.facts) == 3 and len(s.summaries) == 2
        assert _tier_texts(embedder.texts) == []
        held = _held(s)
        for text, vector in _expected(HashEmbedder()).items():
            assert np.array_equal(held[text], vector), text
        stored = home.store.tier_vectors("facts", "", "moves", embedder_key(embedder))
        assert sorted(stored) == [1, 2, 3]


def _before_schema_9(config: Config) -> None:
    """The store as schema 8 left it: facts and summaries without the columns, m009 not recorded."""
    store = LanceStore(str(config.db_uri), dim=HashEmbedder().dim)
    for table in ("facts", "summaries"):
        store._tables[table].drop_columns(["vector", "embedder"])
    store._tables["meta"].delete("key = 'migration:m009_tier_vectors'")
    store._tables["meta"].update(where="key = 'schema'", values={"value": "8"})
    store.close()


def test_a_store_before_schema_9_migrates_and_embeds_its_facts_and_summaries_once(tmp_path):
    config = _config(tmp_path)
    _written(config)
    _before_schema_9(config)
    with Home(config, embedder=HashEmbedder(), read_only=True) as home:   # a reader: no migration, embedded here
        s = home.open("moves")
        assert [f.text for f in s.facts.items] == [d.text for d in FACTS]
        expected = _held(s)
    embedder = Counting()
    with Home(config, embedder=embedder) as home:
        s = home.open("moves")
        assert any("m009_tier_vectors" in w for w in home.warnings), home.warnings
        assert sorted(_tier_texts(embedder.texts)) == sorted(TEXTS)   # each once
        assert {t: v.tolist() for t, v in _held(s).items()} == {t: v.tolist() for t, v in expected.items()}
    again = Counting()
    with Home(config, embedder=again) as home:
        s = home.open("moves")
        assert not home.warnings   # migrated once
        assert _tier_texts(again.texts) == []   # written back by the open before
        assert {t: v.tolist() for t, v in _held(s).items()} == {t: v.tolist() for t, v in expected.items()}
        assert [f.text for f in home.store.facts("", "moves")] == [d.text for d in FACTS]   # the rows, whole
        assert [x.text for x in home.store.summaries("", "moves")] == [d.text for d in SUMMARIES]


def test_another_embedder_embeds_the_facts_again_and_stores_its_own_vectors(tmp_path):
    config = _config(tmp_path)
    _written(config)
    other = Other()
    with Home(config, embedder=other) as home:
        s = home.open("moves")
        assert sorted(_tier_texts(other.texts)) == sorted(TEXTS)
        held = _held(s)
        for text, vector in _expected(Other()).items():
            assert np.array_equal(held[text], vector), text   # its own vectors, none of the hash embedder's
    other = Other()
    with Home(config, embedder=other) as home:
        home.open("moves")
        assert _tier_texts(other.texts) == []
    back = Counting()
    with Home(config, embedder=back) as home:   # and back: the hash embedder's again
        s = home.open("moves")
        assert sorted(_tier_texts(back.texts)) == sorted(TEXTS)
        held = _held(s)
        for text, vector in _expected(HashEmbedder()).items():
            assert np.array_equal(held[text], vector), text


def test_a_fact_a_dead_process_journaled_is_stored_with_its_vector_when_recovered(tmp_path):
    config = _config(tmp_path)
    _written(config)
    dead = Home(config, embedder=HashEmbedder())
    dead.open("moves").add_facts([Draft("medication dose", "Maya takes 20 mg.", (35,))], "script")
    dead.journal.close(remove=False)   # killed before any flush
    dead.leases.stop()
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("moves")
        assert [f.text for f in s.facts.items][-1] == "Maya takes 20 mg."
    embedder = Counting()
    with Home(config, embedder=embedder) as home:
        s = home.open("moves")
        assert _tier_texts(embedder.texts) == [] and "Maya takes 20 mg." not in embedder.texts   # none embedded here
        assert sorted(home.store.tier_vectors("facts", "", "moves", embedder_key(embedder))) == [1, 2, 3, 4]
        expected = _expected(HashEmbedder(), ["Maya takes 20 mg."])["Maya takes 20 mg."]
        assert np.array_equal(s.facts._vectors[3], expected)


@pytest.mark.parametrize("store", [MemoryStore(), None], ids=["memory", "lance"])
def test_a_store_answers_only_the_vectors_of_the_embedder_asked_about(tmp_path, store):
    from pager.facts import Fact
    from pager.store import Batch

    store = store or LanceStore(str(tmp_path / "db"), dim=4)
    fact = Fact(1, "home city", "Maya lives in Paris.", (1,), (1,), 1.0, "1 Jan 2024", "script")
    vector = np.array([0.5, 0.5, 0.5, 0.5], dtype=np.float32)
    store.put(Batch(facts=[("", "s", fact)], vectored=[("facts", "", "s", fact, "a/4", vector)]))
    assert store.tier_vectors("facts", "", "s", "a/4")[1].tolist() == vector.tolist()
    assert store.tier_vectors("facts", "", "s", "b/4") == {}
    store.put(Batch(vectored=[("facts", "", "s", fact, "b/4", -vector)]))   # over the stored row
    assert store.tier_vectors("facts", "", "s", "b/4")[1].tolist() == (-vector).tolist()
    assert store.tier_vectors("facts", "", "s", "a/4") == {}
    assert store.facts("", "s") == [fact]
