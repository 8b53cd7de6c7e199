"""A session opens from the store's page columns without decoding its pages: each Page is made when
first touched, each page-table entry when first asked for, and the directory's page keywords when
first read. What is made late must be what an eager read of the store makes, and the pages another
process seals later must be seen beside the ones not yet decoded."""

import numpy as np

from pager.bench.scale import TextGenerator
from pager.bookmarks import Directory
from pager.embed import HashEmbedder
from pager.home import Home
from pager.page import Pages
from pager.page_table import Entry, PageTable

from conftest import say


def _written(config, turns: int = 90) -> None:
    """A session of several pages, a bookmark among them, closed (its index cache written)."""
    with Home(config, embedder=HashEmbedder()) as home:
        session = home.open("s")
        session.append_many([{"speaker": "ann", "text": text} for text in TextGenerator(5).turns(turns)])
        session.bookmark([3], ("ledger",), "the model's own")
        session.fault(2, "test")


def test_pages_made_when_first_touched_are_the_pages_the_store_holds(config):
    _written(config)
    with Home(config, embedder=HashEmbedder()) as home:
        session = home.open("s")
        assert isinstance(session.pages, Pages)
        assert session.pages.decoded() <= 1   # the last page only: the packer resumes where it ended
        eager, _ = home.store.pages(session.user, "s", with_vectors=False)
        assert len(eager) > 10 and list(session.pages) == [p.n for p in eager]
        for page in reversed(eager):   # out of order: each row decoded alone
            made = session.pages[page.n]
            assert made == page and made.__dict__ == page.__dict__   # piece_tokens too (not compared by ==)
            entry = session.table[page.n]
            assert (entry.tokens, entry.importance) == (page.tokens, page.importance)
        marks = home.store.bookmarks(session.user, "s")
        expected = Directory.of(marks, eager)
        assert session.directory.by_page == expected.by_page and session.directory.index == expected.index
    with Home(config, embedder=HashEmbedder()) as home:   # read in order, BATCH rows at a time
        session = home.open("s")
        session.pages.BATCH = 4
        assert [p.__dict__ for p in session.pages.values()] == [p.__dict__ for p in eager]


def test_a_bookmark_made_before_the_directory_is_read_is_placed_after_the_pages_keywords(config):
    _written(config)
    with Home(config, embedder=HashEmbedder()) as home:
        session = home.open("s")
        session.bookmark([4, 5], ("harbour",), "put first")
        eager, _ = home.store.pages(session.user, "s", with_vectors=False)
        expected = Directory.of(home.store.bookmarks(session.user, "s")[:1], eager)   # the stored one
        expected.add(("harbour",), (4, 5), "put first", first=True)
        assert session.directory.keywords(4)[0] == "harbour"
        assert session.directory.by_page == expected.by_page and session.directory.index == expected.index
        assert session.directory.notes == expected.notes


def test_the_page_table_makes_an_entry_when_asked_and_snapshots_the_others_as_never_used():
    table = PageTable()
    table.adopt_stored(np.array([50, 60, 70]), np.array([0.5, 0.0, 1.5]))
    assert len(table) == 3 and list(table) == [1, 2, 3] and 3 in table and 4 not in table and table.touched() == []
    table[2].use_count = 1
    table[4] = Entry(4, 9)
    assert [(e.n, e.tokens, e.importance) for e in table.touched()] == [(2, 60, 0.0), (4, 9, 0.0)]
    assert (table[3].tokens, table[3].importance) == (70, 1.5) and type(table[3].tokens) is int
    unused = [getattr(Entry(1), f) for f in PageTable.STATE_FIELDS]
    used = [getattr(table[2], f) for f in PageTable.STATE_FIELDS]
    assert table.snapshot() == {"2": used}
    assert table.snapshot(every=True) == {"1": unused, "2": used, "3": unused, "4": unused}


def test_a_page_another_process_seals_is_seen_after_sync(config):
    _written(config)
    a, b = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    try:
        sa, sb = a.open("s"), b.open("s")
        stored = len(sa.pages)
        assert sa.pages.decoded() <= 1
        say(sb, 40, start=1000)
        assert sb.tail_n > stored + 2
        sa.sync()
        assert sa.tail_n == sb.tail_n and sa.turn_count == sb.turn_count
        for n in range(1, sb.tail_n):
            assert sa.pages[n].__dict__ == sb.pages[n].__dict__
            assert n in sa.table and sa.table[n].tokens == sb.pages[n].tokens
            assert sa.directory.keywords(n) == sb.directory.keywords(n)
        assert sa.search("turn 1020 says", k=1)[0].n == sb.search("turn 1020 says", k=1)[0].n
    finally:
        b.close()
        a.close()
    with Home(config, embedder=HashEmbedder()) as home:   # and from the store, by a later process
        session = home.open("s")
        assert session.tail_n == sb.tail_n
        assert [session.pages[n].__dict__ for n in range(1, sb.tail_n)] == [sb.pages[n].__dict__
                                                                             for n in range(1, sb.tail_n)]


def test_the_pages_holding_turns_are_found_without_reading_the_others(config):
    _written(config)
    with Home(config, embedder=HashEmbedder()) as home:
        session = home.open("s")
        eager, _ = home.store.pages(session.user, "s", with_vectors=False)
        wanted = {1, 2, eager[4].last_turn, eager[-1].first_turn, eager[-1].last_turn + 50}
        expected: dict = {}
        for page in eager:
            for turn, _, _ in page.spans:
                if turn in wanted:
                    expected.setdefault(turn, ([], page.ts_last))[0].append(page.n)
        assert session.pages.holding(wanted) == expected and len(expected) == 4
        assert session.pages.decoded() <= 8 < len(eager)
