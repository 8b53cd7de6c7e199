"""Paging behaviour of one session: faults, eviction, pins, the tail, nothing lost."""

import pytest

from conftest import say, hash_config, listed_sessions
from pager.context import build
from pager.page import header_reserve
from pager.errors import BudgetError, InputError, PageNotFound
from pager.embed import HashEmbedder
from pager.home import Home

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke


def test_eviction_under_pressure_keeps_every_page(mem_home):
    s = mem_home.open("a")
    say(s, 200)
    assert s.counters["evictions"] > 0
    assert s.frames.used() <= s.frames.count
    # every turn's text is on some page or on the open tail, exactly once
    held = {}
    for page in s.pages.values():
        for t, a, b in page.spans:
            held.setdefault(t, []).append((a, b))
    for piece in s.packer.pieces:
        held.setdefault(piece.turn.turn, []).append((piece.start, piece.end))
    assert sorted(held) == list(range(1, 201))


def test_fault_loads_and_hit_does_not(mem_home):
    s = mem_home.open("a")
    say(s, 200)
    old = min(n for n in s.pages if not s.table[n].resident)
    assert s.fault(old, "test") is True
    assert s.table[old].resident and s.table[old].fault_count == 1
    assert s.fault(old, "test") is False
    assert s.counters["hits"] == 1


def test_pinned_and_tail_pages_are_never_evicted(mem_home):
    s = mem_home.open("a")
    say(s, 40)
    s.pin(2)
    for n in list(s.pages):
        s.fault(n, "sweep")
    say(s, 100, start=40)
    assert s.table[2].resident and s.table[2].pinned
    assert s.table[s.tail_n].resident
    evicted = []
    s.events.listeners.append(lambda e: e.kind == "evict" and evicted.append(e.data["page"]))
    for n in list(s.pages):
        s.fault(n, "sweep")
    assert "p2" not in evicted and f"p{s.tail_n}" not in evicted


def test_pinning_everything_is_a_clear_error(mem_home):
    s = mem_home.open("a")
    say(s, 200)
    s.resize(4)
    s.pin(1)
    s.pin(2)
    with pytest.raises(BudgetError, match="unpin"):
        s.pin(3)
    with pytest.raises(BudgetError, match="raise --budget"):
        s.resize(2)


def test_unknown_page_names_what_exists(mem_home):
    s = mem_home.open("a")
    say(s, 30)
    with pytest.raises(PageNotFound, match=r"p1\.\.p"):
        s.resolve("p999")


def test_empty_message_is_refused_and_nothing_accepted(mem_home):
    s = mem_home.open("a")
    with pytest.raises(InputError, match="empty"):
        s.append_many([{"text": "fine"}, {"text": "   "}])
    assert s.turn_count == 0


def test_message_over_the_budget_names_the_fix(mem_home):
    s = mem_home.open("a")
    say(s, 10)
    with pytest.raises(BudgetError, match="raise --budget to at least"):
        build(s, "word " * 3000, prefix="system")


def test_automatic_paging_brings_back_an_old_fact(mem_home):
    s = mem_home.open("a")
    s.append("maya", "My colleague Sam Okafor is allergic to peanuts, he carries an EpiPen.")
    say(s, 300)
    holder = next(n for n, p in s.pages.items() if "peanuts" in p.text)
    assert not s.table[holder].resident
    ctx = build(s, "What is Sam Okafor allergic to?", chat=False)
    assert holder in ctx.pages
    assert "peanuts" in ctx.memory


def test_header_fits_its_reserve_and_shows_date_and_model_bookmarks(mem_home):
    s = mem_home.open("a")
    s.append("maya", "We chose Yjs over operational transform for the Loom sync engine.", date="8 May 2023")
    say(s, 40)
    assert s.render.header(1).startswith("[p1 · 8 May 2023")
    s.bookmark([1], ["Yjs"], "the sync decision")
    header = s.render.header(1)
    assert header.startswith("[p1 · 8 May 2023 · bookmarks: Yjs")  # the model's bookmark comes first
    assert s.tokenizer.count(header) <= header_reserve(s.page_tokens)
    s.bookmark([1], ["a very long keyword that cannot possibly fit into a page header"], "")
    assert s.tokenizer.count(s.render.header(1)) <= header_reserve(s.page_tokens)


def test_current_message_is_shown_once(mem_home):
    s = mem_home.open("a")
    say(s, 5)
    t = s.append("maya", "a unique question about zebras?")
    ctx = build(s, t.text, prefix="sys", hide_turn=t.turn)
    assert ctx.system.count("zebras") == 0 and ctx.message.count("zebras") == 1


def test_a_long_message_is_hidden_on_every_page_it_fills(mem_home):
    """The current message is shown once, as the message: the sealed pages holding nothing but it are
    not shown while it is the message (each step of its turn), and are shown, counted exactly, after."""
    s = mem_home.open("a")
    say(s, 5)
    t = s.append("maya", " ".join(f"zebra{i}" for i in range(300)))
    own = [n for n, p in s.pages.items() if all(turn == t.turn for turn, _, _ in p.spans)]
    assert own, "the message filled pages of its own"
    for step in range(2):   # the blocks kept by the first step serve the second
        ctx = build(s, t.text, prefix="sys", hide_turn=t.turn, autopage=step == 0)
        assert not set(own) & set(ctx.pages) and "zebra150" not in ctx.system
    shown = [n for n in own if "zebra150" in s.pages[n].text.split()] + own[:1]
    for n in shown:
        s.fault(n, "test")
    after = build(s, "and now?", prefix="sys", autopage=False)
    assert set(shown) <= set(after.pages) and "zebra150" in after.system
    assert after.tokens["memory"] == s.tokenizer.count(after.memory)
    again = build(s, t.text, prefix="sys", hide_turn=t.turn, autopage=False)
    assert not set(own) & set(again.pages) and "zebra150" not in again.system
    assert again.tokens["memory"] == s.tokenizer.count(again.memory)


def test_memory_pressure_tells_the_model_what_goes_next(mem_home):
    from pager.context import next_victims

    s = mem_home.open("a")
    say(s, 200)
    ctx = build(s, "anything about w3x1?", chat=False, budget=1024)
    upcoming = next_victims(s, 2)
    assert s.frames.used() / s.frames.count >= s.home.config.pressure
    assert "memory pressure is high" in ctx.memory
    assert f"will evict p{upcoming[0]}, p{upcoming[1]} next" in ctx.memory
    assert "Bookmark what you will need again, or page_out" in ctx.memory
    # predicting runs the policy on copies: the page table and the CLOCK hand are untouched
    table, hand = s.table.snapshot(), s.policy.hand
    assert next_victims(s, 2) == upcoming
    assert s.table.snapshot() == table and s.policy.hand == hand


def test_a_page_shown_again_shows_its_new_bookmarks(mem_home):
    """A page's block is kept between turns only while its bookmarks are the same: a bookmark the
    model adds to a resident page is in its header at the next assembly, and counted exactly."""
    s = mem_home.open("a")
    say(s, 80)
    first = build(s, "anything about w3x1?", chat=False, budget=2048)
    n = first.pages[0]
    s.bookmark([n], ["zebra"])
    again = build(s, "anything about w3x1?", chat=False, budget=2048)
    assert n in again.pages
    header = next(line for line in again.memory.split("\n") if line.startswith(f"[p{n} "))
    assert "zebra" in header and header == s.render.header(n)
    for ctx in (first, again):
        assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory)


def test_a_reopened_session_keeps_its_pages_keywords_and_its_bookmarks(tmp_path):
    """The directory a session opens with holds its pages' own keywords and its stored bookmarks, as
    the writing process had them: with the keywords lost, every eviction bookmarked its page again and
    the bookmark signal of search lost every page's automatic keywords."""
    from pager.bench.scale import TextGenerator
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home

    config = Config(home=tmp_path / "home", budget=2048, page_tokens=128, embedder="hash")
    with Home(config, embedder=HashEmbedder()) as home:
        session = home.open("s")
        session.append_many([{"speaker": "ann", "text": text} for text in TextGenerator(3).turns(80)])
        session.bookmark([2], ("ledger",), "the model's own")
        before = {n: list(kws) for n, kws in session.directory.by_page.items()}
        index = {alias: set(pages) for alias, pages in session.directory.index.items()}
        query = " ".join(before[5][:2])
        hits = [(h.n, h.score) for h in session.search(query, k=5)]
    assert len(before) > 10 and all(session.pages[n].keywords for n in before if n in session.pages)
    with Home(config, embedder=HashEmbedder()) as home:
        session = home.open("s")
        assert {n: list(kws) for n, kws in session.directory.by_page.items()} == before
        assert session.directory.index == index
        assert [(h.n, h.score) for h in session.search(query, k=5)] == hits


def test_a_used_key_with_other_words_is_refused_and_the_retry_still_answered(lance_home):
    """A client reusing an idempotency key for a new message was answered with the first turn, and the
    new message was lost without a word. It is refused, naming the key, before anything of its batch is
    written; the same message again (a retry) still gets its turn back, from the journal and from the
    store after a flush, and a key used twice in one batch with other words is refused too."""
    s = lance_home.open("a")
    first = s.append("ada", "I live in Oslo.", key="k1")
    for when in ("in the journal", "in the store"):
        with pytest.raises(InputError, match="'k1' was first sent with other words .*a new message needs a new key"):
            s.append_many([{"speaker": "ada", "text": "Note this.", "key": "k2"},
                           {"speaker": "ada", "text": "I live in Bergen.", "key": "k1"}])
        assert s.append("ada", "I live in Oslo.", key="k1").turn == first.turn, when
        assert s.turn_count == 1 and s.held("k2") is None, when
        lance_home.flush()
    with pytest.raises(InputError, match="'k3' was first sent with other words"):
        s.append_many([{"speaker": "ada", "text": "One.", "key": "k3"}, {"speaker": "ada", "text": "Two.", "key": "k3"}])
    assert s.turn_count == 1


def test_a_pin_on_a_session_with_no_turns_is_refused_not_lost(tmp_path):
    """`/pin p1` on a new session said it was pinned, and the pin was gone after a restart: a session with
    no turns stores no page table. Its one page, the open page, holds nothing to keep resident, so the
    pin is refused, saying what to do; pinned once the page holds a turn, it stays pinned."""
    from pager.tools import Toolkit

    config = hash_config(tmp_path / "h", session="fresh")
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open()
        with pytest.raises(PageNotFound, match="holds nothing yet.*add what should stay resident first"):
            s.pin(1)
        assert not s.table[1].pinned
    with Toolkit(config=config) as memory:
        assert "holds nothing yet" in memory.call("pin", '{"page_id": "p1"}')   # the model is told, as text
    assert listed_sessions(tmp_path / "h") == {}   # nothing was made of it
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open()
        s.append("ann", "My name is Ann and I am allergic to peanuts.")
        s.pin(1)
    with Home(config, embedder=HashEmbedder()) as home:
        assert home.open().table[1].pinned
