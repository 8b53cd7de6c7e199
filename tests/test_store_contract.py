"""Behaviours every store must have: MemoryStore and LanceStore."""

import numpy as np
import pytest

from pager.bookmarks import Bookmark
from pager.page import Packer, Turn
from pager.tokens import get_tokenizer
from pager.store import Batch, LanceStore, MemoryStore

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


@pytest.fixture(params=["memory", "lance"])
def store(request, tmp_path):
    return MemoryStore(dim=8) if request.param == "memory" else LanceStore(str(tmp_path / "db"), dim=8)


def batch(user, session, turns=3, first=1):
    ts = [Turn(session, i, "ann", f"{session} text {i}", user=user) for i in range(first, first + turns)]
    packer = Packer(session, get_tokenizer(), 256, next_n=first, user=user)
    for t in ts:
        packer.add(t)
    page = packer.seal()
    vectors = np.arange(len(ts) * 8, dtype=np.float32).reshape(len(ts), 8) / 10
    return Batch(turns=ts, pages=[page], vectors=[vectors],
                 bookmarks=[(user, session, Bookmark(("k",), (first,), "note", "model", f"u{session}{first}", 1.0))],
                 states={(user, session): {"tick": first}})


def test_roundtrip(store):
    store.put(batch("u", "s"))
    assert [t.turn for t in store.turns("u", "s")] == [1, 2, 3]
    assert store.turn_count("u", "s") == 3
    pages, vectors = store.pages("u", "s")
    assert pages[0].n == 1 and vectors[0].shape == (3, 8)
    assert np.allclose(vectors[0], np.arange(24).reshape(3, 8) / 10, atol=0.05)  # float16 on disk
    assert pages[0] == batch("u", "s").pages[0]  # every field survives the round trip
    assert store.bookmarks("u", "s")[0].note == "note"
    assert store.state("u", "s") == {"tick": 1}


def test_writes_are_insert_if_absent(store):
    store.put(batch("u", "s"))
    store.put(batch("u", "s"))
    assert len(store.turns("u", "s")) == 3
    assert len(store.pages("u", "s")[0]) == 1
    assert len(store.bookmarks("u", "s")) == 1


def test_state_is_replaced(store):
    store.put(batch("u", "s"))
    store.put(Batch(states={("u", "s"): {"tick": 9}}))
    assert store.state("u", "s") == {"tick": 9}


def test_namespaces_are_isolated_even_with_hostile_ids(store):
    hostile = "s3' OR '1'='1"
    store.put(batch("u", "s"))
    store.put(batch("u2", "s", first=1))
    assert store.turns("u", hostile) == []
    assert store.pages("u", hostile)[0] == []
    assert store.bookmarks("u", hostile) == []
    assert store.state("u", hostile) is None
    store.put(batch("u", hostile))
    assert {t.session for t in store.turns("u", hostile)} == {hostile}
    assert {t.user for t in store.turns("u2", "s")} == {"u2"}
    assert len(store.turns("u", "s")) == 3


def test_sessions_lists_namespaces(store):
    store.put(batch("u", "a"))
    store.put(batch("v", "b", turns=2))
    store.put(Batch(turns=[Turn("b", 3, "ann", "on the open page", user="v")]))
    rows = {(r["user"], r["session"]): r for r in store.sessions()}
    assert rows[("u", "a")]["turns"] == 3 and rows[("v", "b")]["pages"] == 1
    # the last turn on a sealed page: `pager sessions` counts the open page from it
    assert rows[("u", "a")]["sealed_to"] == 3 and (rows[("v", "b")]["turns"], rows[("v", "b")]["sealed_to"]) == (3, 2)


def test_state_changes_are_kept_once_in_order_per_session(store):
    from pager.state import Change

    changes = [Change(i, "city", f"c{i}", False, i, i, float(i), "model") for i in (2, 1, 3)]
    store.put(Batch(changes=[("u", "s", c) for c in changes]))
    store.put(Batch(changes=[("u", "s", changes[0]), ("u", "other", changes[1])]))  # replayed after a crash
    assert store.state_changes("u", "s") == sorted(changes, key=lambda c: c.seq)
    assert [c.seq for c in store.state_changes("u", "s", after=1)] == [2, 3]
    assert [c.seq for c in store.state_changes("u", "other")] == [1] and store.state_changes("x", "s") == []


def test_facts_are_kept_once_in_order_per_session(store):
    from pager.facts import Fact

    facts = [Fact(n, "city", f"fact {n}", (n,), (1, 2), float(n), "8 May 2023", "script") for n in (2, 1)]
    store.put(Batch(facts=[("u", "s", f) for f in facts]))
    store.put(Batch(facts=[("u", "s", facts[0])]))  # replayed after a crash
    assert store.facts("u", "s") == sorted(facts, key=lambda f: f.n)
    assert [f.n for f in store.facts("u", "s", after=1)] == [2] and store.facts("u", "x") == []


def test_a_write_to_a_table_another_process_overwrote_goes_to_its_latest_version(tmp_path):
    """Two processes creating one new store on an object store: the second create of a table can
    commit as an overwrite, and an update from a handle opened before it conflicts however often it
    is retried on that handle ("the store write failed after 8 tries", seen with 3 homes on S3). The
    retry goes to the table's latest version."""
    from pager.store import LanceStore

    a = LanceStore(str(tmp_path / "db"), 64)
    b = LanceStore(str(tmp_path / "db"), 64)
    b.db.create_table("meta", schema=b._schemas()["meta"], mode="overwrite")   # as the second creator's commit
    b._set_meta({"schema": "9", "dim": "64"})
    a._set_meta({"probe": "after the overwrite"})
    a._tables["meta"].checkout_latest()
    assert a._meta()["probe"] == "after the overwrite" and a._meta()["dim"] == "64"
