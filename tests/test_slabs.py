"""How the frames are split between fact slabs and pages: facts stand in for pages the frames
cannot hold, the split never takes more than its share or the budget, a fact ranks by the piece
it came from, and a message with facts is paged in one pass (one search, each page faulted once)."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pager import context
from pager.config import Config
from pager.context import build, rank_facts
from pager.embed import HashEmbedder
from pager.facts import Draft
from pager.home import Home
from pager.store import MemoryStore

CITIES = ["Lisbon", "Oslo", "Krakow", "Seville", "Tallinn", "Bergen", "Porto", "Ghent"]


def filler(i: int) -> str:
    return (f"Note {i}: the quarterly inventory of warehouse {i} lists pallets, forklifts, shelving units, "
            f"packing tape and a broken printer in aisle {i}.")


def trips_home(tmp_path, budget: int = 1024, share: float = 0.5, facts: int = 8, excerpts: int = 0,
               fill: bool = False) -> tuple[Home, object]:
    """Eight trips of Maya's, each several pages from the next, and a fact for each of the first `facts`.
    The leftover is not filled unless asked (`fill`): these tests are about the frames' split, which the
    fill would hide (it shows what the frames left out)."""
    config = Config(home=tmp_path / "h", budget=budget, page_tokens=128, embedder="hash", fact_share=share,
                    excerpt_slabs=excerpts, fill=fill)
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("trips")
    trip_turns = []
    for k, city in enumerate(CITIES):
        s.append_many([{"speaker": "Sam", "text": filler(10 * k + j)} for j in range(8)])
        trip_turns.append(s.append("Maya", f"Maya visited {city} last week and loved the old harbour there.").turn)
    s.append_many([{"speaker": "Sam", "text": filler(900 + j)} for j in range(8)])
    s.add_facts([Draft(f"trip {city}", f"Maya visited {city}.", (t,)) for city, t in zip(CITIES[:facts], trip_turns)],
                "script")
    return home, s


def test_facts_show_the_evidence_of_pages_the_frames_cannot_hold(tmp_path):
    home, s = trips_home(tmp_path)
    ctx = build(s, "Which cities did Maya visit?", chat=False)
    assert ctx.facts, "the message is about the facts: some go in slabs"
    shown = [city for city in CITIES if city in ctx.memory]
    on_pages = [city for city in CITIES if any(city in s.pages[n].text for n in ctx.pages if n in s.pages)]
    # the trips lie on eight different pages and the budget holds fewer: the slabs bring the rest
    assert len(on_pages) < len(CITIES) == len(shown), (on_pages, shown)
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 1024
    home.journal.close(remove=True)


def test_a_fact_whose_page_is_shown_takes_no_room(tmp_path):
    home, s = trips_home(tmp_path, budget=4096)
    ctx = build(s, "Which cities did Maya visit?", chat=False)
    resident = set(s.resident())
    for n in ctx.facts:
        fact = s.facts.items[n - 1]
        assert not set(fact.pages) <= resident, f"{fact.id} repeats a resident page"
    home.journal.close(remove=True)


def test_a_second_fact_of_a_turn_waits_for_the_facts_of_other_turns(tmp_path):
    home, s = trips_home(tmp_path)
    lisbon = s.facts.items[0].turns
    s.add_facts([Draft(f"lisbon {i}", f"Maya visited Lisbon and the cities of its harbour, day {i}.", lisbon)
                 for i in range(8)], "script")
    ctx = build(s, "Which cities did Maya visit?", chat=False)
    shown = [s.facts.items[n - 1] for n in ctx.facts]
    told = [t for f in shown for t in f.turns]
    resident = set(ctx.pages)
    # a trip fact not shown though its turn is told by nothing in view
    waiting = [f for f in s.facts.items[:8] if not set(f.turns) & set(told) and not set(f.pages) <= resident]
    assert len(told) > len(set(told)), "the slabs have room for a second fact of a turn"
    assert not waiting, ("a turn was told twice while another waited", told, [f.id for f in waiting])
    home.journal.close(remove=True)


def test_a_fact_ranks_by_the_piece_it_came_from(tmp_path):
    home, s = trips_home(tmp_path)
    # two facts with the same words; the search scores the turn of the second one higher
    harbour = s.append("Maya", "The harbour in Bergen has a fish market and a funicular up the hill.").turn
    s.append_many([{"speaker": "Sam", "text": filler(950 + j)} for j in range(8)])
    first, second = s.add_facts([Draft("a", "Maya likes it there.", (1,)), Draft("b", "Maya likes it there.", (harbour,))],
                                "script")
    s.search("fish market funicular harbour Bergen", k=4, record=False)
    from pager.context import piece_weights

    order = [f.n for f, _, _ in rank_facts(s, "fish market funicular harbour Bergen", piece_weights(s))]
    assert order.index(second.n) < order.index(first.n)
    home.journal.close(remove=True)


def test_a_fact_dated_inside_the_date_a_message_names_ranks_first(tmp_path):
    from pager.search import label_time

    def order(fact_dates: bool) -> list[str]:
        config = Config(home=tmp_path / str(fact_dates), budget=1024, page_tokens=128, embedder="hash",
                        fact_dates=fact_dates)
        home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
        s = home.open("dates")
        turn = s.append("Maya", "I went to the market again.").turn
        # the same words twice: without the date signal the tie goes to the older fact, number 1
        s.add_facts([Draft("march", "Maya went to the market.", (turn,), ts=label_time("10 March 2023")),
                     Draft("may", "Maya went to the market.", (turn,), ts=label_time("8 May 2023"))], "script")
        ranked = [f.subject for f, _, _ in rank_facts(s, "Where did Maya go in May 2023?")]
        home.journal.close(remove=True)
        return ranked

    assert order(False)[0] == "march"
    assert order(True)[0] == "may", "the fact dated in the month the message names ranks first"
    assert Config().fact_dates is True


def test_a_trace_from_before_the_fact_dates_replays_without_them(tmp_path):
    from pager.replay import config_from

    start = {"session": "s", "budget": 2048, "page_tokens": 128, "policy": "clock",
             "config": {"budget": 2048, "map_tokens": 64}}
    assert config_from(start, tmp_path, None).fact_dates is False
    assert config_from({**start, "config": {**start["config"], "fact_dates": True}}, tmp_path, None).fact_dates is True


def test_a_message_with_facts_is_paged_in_one_pass(tmp_path):
    home, s = trips_home(tmp_path)
    events = []
    s.events.listeners.append(events.append)
    build(s, "Which cities did Maya visit?", chat=False)
    assert [e.kind for e in events].count("search") == 1
    faulted = [e.data["page"] for e in events if e.kind in ("fault", "hit")]
    assert len(faulted) == len(set(faulted)), "a page was paged twice"
    home.journal.close(remove=True)


def test_an_evidence_turn_no_fact_tells_reaches_a_small_budget_as_an_excerpt(tmp_path):
    # one trip with a fact, seven without: more than the frames left for pages hold, even once
    # the pages go to what the facts do not tell (beside_facts)
    home, s = trips_home(tmp_path, facts=1, excerpts=1)
    ctx = build(s, "Which cities did Maya visit?", chat=False)
    told = {t for f in s.facts.items for t in f.turns}
    trips = {t for t in range(1, s.turn_count + 1) if t not in told}
    assert ctx.excerpts, "a trip no fact tells, on a page the frames cannot hold, is shown as an excerpt"
    for turn in ctx.excerpts:
        assert turn not in told, "a turn a fact tells is not excerpted (the fact is shorter)"
        assert turn in trips
        page = next(n for n, p in s.pages.items() if any(t == turn for t, _, _ in p.spans))
        assert page not in ctx.pages, "an excerpt never repeats a resident page"
        text = next(p.piece_text(i) for n, p in s.pages.items() for i, (t, _, _) in enumerate(p.spans) if t == turn)
        lines = [line for line in ctx.memory.splitlines() if line.startswith(f"- p{page} ")]
        assert any(line.endswith(text) for line in lines), "the whole turn, as the page has it"
    block = next(b for b in ctx.memory.split("\n\n") if b.startswith("[excerpts"))
    assert ctx.tokens["facts"] >= s.tokenizer.count(block)
    shown = [city for city in CITIES[1:] if city in ctx.memory]
    on_pages = [city for city in CITIES[1:] if any(city in s.pages[n].text for n in ctx.pages if n in s.pages)]
    assert len(shown) > len(on_pages), (shown, on_pages)
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 1024
    # off (the default), the same question shows no excerpt: the lever is this setting
    home.journal.close(remove=True)
    home, s = trips_home(tmp_path / "off", facts=1)
    assert not build(s, "Which cities did Maya visit?", chat=False).excerpts
    home.journal.close(remove=True)


def test_pages_go_to_the_evidence_the_fact_slabs_do_not_tell(tmp_path, monkeypatch):
    """Four trips have a fact, four do not, and the budget holds fewer pages than the search finds:
    the pages go first to trips no fact tells, so more trips are in view than when the pages follow
    the search's order (TOLD_SHARE 1: a told turn keeps all its weight, the order before)."""

    def shown(share: float, folder) -> tuple[set[str], set[str], set[str]]:
        monkeypatch.setattr(context, "TOLD_SHARE", share)
        home, s = trips_home(folder, facts=4)
        ctx = build(s, "Which cities did Maya visit?", chat=False)
        assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 1024
        on_pages = {c for c in CITIES if any(c in s.pages[n].text for n in ctx.pages if n in s.pages)}
        told = {c for n in ctx.facts for c in CITIES if c in s.facts.items[n - 1].text}
        home.journal.close(remove=True)
        return on_pages, told, {c for c in CITIES if c in ctx.memory}

    share = context.TOLD_SHARE
    before_pages, _, before = shown(1.0, tmp_path / "search order")
    pages, told, now = shown(share, tmp_path / "beside facts")
    untold = set(CITIES[4:])   # the trips without a fact
    assert len(pages & untold) > len(before_pages & untold), (before_pages, pages)
    assert len(now) > len(before), (before, now)
    assert not pages & told, "a trip is shown twice, on a page and as a fact"


def test_the_search_order_stands_when_the_slabs_tell_nothing(tmp_path):
    home, s = trips_home(tmp_path, facts=4)
    hits = s.search("Which cities did Maya visit?", k=6, record=False)
    weights = context.piece_weights(s)
    assert context.beside_facts(s, hits, weights, set()) == hits
    told = context.slab_turns(s, context.rank_facts(s, "Which cities did Maya visit?", weights), 1)
    assert told == {t for f in s.facts.items for t in f.turns}, "one slab holds the four trip facts"
    assert context.slab_turns(s, context.rank_facts(s, "Which cities did Maya visit?", weights), 0) == set()
    home.journal.close(remove=True)


def test_the_bench_counts_an_excerpt_as_its_whole_turn(tmp_path):
    from pager.bench.locomo import context_spans, covered

    home, s = trips_home(tmp_path, facts=4, excerpts=1)
    ctx = build(s, "Which cities did Maya visit?", chat=False)
    lengths = {t: len(text) for t, text in turn_texts(s).items()}
    spans = context_spans(s, ctx, lengths)
    assert ctx.excerpts and all(covered(spans[t], lengths[t]) for t in ctx.excerpts)
    hidden = [t for t in lengths if t not in ctx.excerpts and not any(t == u for n in ctx.pages if n in s.pages
                                                                    for u, _, _ in s.pages[n].spans)]
    hidden = [t for t in hidden if t not in {p.turn.turn for p in s.packer.pieces}]
    assert hidden and not any(covered(spans.get(t, []), lengths[t]) for t in hidden)
    home.journal.close(remove=True)


def turn_texts(s) -> dict[int, str]:
    out: dict[int, str] = {}
    for p in s.pages.values():
        for t, start, end in p.spans:
            out[t] = out.get(t, "") + "x" * (end - start)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(budget=st.integers(min_value=600, max_value=5000), share=st.sampled_from([0.0, 0.2, 0.5, 0.9]),
       facts=st.integers(min_value=0, max_value=8), excerpts=st.sampled_from([0, 1, 3]),
       question=st.sampled_from(CITIES + ["warehouse pallets", "Maya"]), fill=st.booleans())
def test_the_split_keeps_its_share_and_the_budget(tmp_path_factory, budget, share, facts, excerpts, question, fill):
    home, s = trips_home(tmp_path_factory.mktemp("s"), budget=budget, share=share, facts=facts, excerpts=excerpts,
                         fill=fill)
    ctx = build(s, f"What about {question}?", chat=False)
    frames = (budget - home.config.map_reserve) // s.page_tokens
    blocks = [b for b in ctx.memory.split("\n\n") if b.startswith(("[facts]", "[excerpts"))]
    assert fill or not ctx.filled
    framed = blocks[: len(blocks) - ctx.filled]   # the leftover's blocks come last and take no frame
    slabs = sum(1 for b in framed if b.startswith("[facts]"))
    excerpt_slabs = [b for b in framed if b.startswith("[excerpts")]
    most = max(0, int(frames * share))
    assert slabs <= most and len(excerpt_slabs) <= min(excerpts, most)
    assert len(ctx.pages) + slabs + len(excerpt_slabs) <= frames
    assert all(s.tokenizer.count(b + "\n\n") <= s.page_tokens for b in framed)
    assert sum(b.count("\n- p") for b in blocks if b.startswith("[excerpts")) == len(ctx.excerpts)
    on_pages = {t for n in ctx.pages if n in s.pages for t, _, _ in s.pages[n].spans}
    assert not on_pages & set(ctx.excerpts), "an excerpt repeats a turn of a shown page"
    assert ctx.tokens["facts"] == sum(s.tokenizer.count(b + "\n\n") for b in blocks)
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= budget
    home.journal.close(remove=True)


def test_the_leftover_shows_the_facts_the_frames_left_out(tmp_path):
    """More trip facts than the one slab the split may take holds: the tokens the frames leave over
    (the map's unused reserve, the remainder past the last frame, pages short of a frame) show more
    of them, and a second fact of a turn only after the first facts of the others; never a token
    over the budget, and no frame taken from the pages."""
    def shown(fill: bool, folder):
        home, s = trips_home(folder, facts=8, share=0.2, fill=fill)
        trips = [f.turns for f in s.facts.items]
        s.add_facts([Draft(f"{city} {i}", f"Maya walked along the harbour of {city} on day {i} of her trip.", turns)
                     for i in range(3) for city, turns in zip(CITIES, trips)], "script")
        ctx = build(s, "Which cities did Maya visit?", chat=False)
        assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 1024
        told = [t for n in ctx.facts for t in s.facts.items[n - 1].turns]
        home.journal.close(remove=True)
        return ctx, told

    before, _ = shown(False, tmp_path / "off")
    after, told = shown(True, tmp_path / "on")
    assert after.filled and not before.filled
    assert set(before.facts) < set(after.facts), "the slab's facts and more"
    assert after.pages == before.pages, "the fill takes no frame"
    assert after.tokens["memory"] > before.tokens["memory"]
    assert len(set(told)) == 3 < len(told), "each untold trip's first, then second facts"


def test_the_leftover_shows_whole_turns_of_pages_on_disk_without_facts(tmp_path):
    """No facts: what the frames leave over shows the best-scored turns of pages not resident, whole,
    each naming its page (page_in brings the rest); none repeats a shown page or the open tail."""
    def shown(fill: bool, folder):
        home, s = trips_home(folder, facts=0, fill=fill)
        ctx = build(s, "Which cities did Maya visit?", chat=False)
        assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 1024
        home.journal.close(remove=True)
        return ctx, s, {c for c in CITIES if c in ctx.memory}

    before, _, cities_before = shown(False, tmp_path / "off")
    after, s, cities_after = shown(True, tmp_path / "on")
    assert not before.excerpts and after.excerpts and after.filled == 1
    assert after.pages == before.pages and cities_before < cities_after == set(CITIES)
    on_pages = {t for n in after.pages if n in s.pages for t, _, _ in s.pages[n].spans}
    assert not on_pages & set(after.excerpts) and not {p.turn.turn for p in s.packer.pieces} & set(after.excerpts)
    block = next(b for b in after.memory.split("\n\n") if b.startswith("[excerpts"))
    lines = block.splitlines()[1:]
    trips = [("Maya visited" in line) for line in lines]
    assert all(line.startswith("- p") for line in lines) and trips == sorted(trips, reverse=True), \
        "the best-scored turns first: the trips, then what is left of the room"


def test_a_trace_from_before_the_fill_replays_without_it(tmp_path):
    from pager.replay import config_from

    start = {"session": "s", "budget": 2048, "page_tokens": 128, "policy": "clock",
             "config": {"budget": 2048, "map_tokens": 64}}
    assert config_from(start, tmp_path, None).fill is False   # recorded before the setting: assembled without it
    assert config_from({**start, "config": {**start["config"], "fill": True}}, tmp_path, None).fill is True


def test_the_fill_is_on_by_default_and_pager_fill_0_turns_it_off():
    from pager.errors import ConfigError

    assert Config.load(env={}).fill is True
    assert Config.load(env={"PAGER_FILL": "0"}).fill is False
    with pytest.raises(ConfigError, match="PAGER_FILL=1"):
        Config.load(env={"PAGER_FILL": "most"})


def test_the_split_reads_a_ranking_from_its_arrays_as_from_its_facts(tmp_path):
    """split reads a ranking's weights and line costs from arrays (RankedFacts); the same facts as a
    plain list, read one by one, split the frames alike; and a line a newer fact changed is counted again."""
    home, s = trips_home(tmp_path)
    question = "Which cities did Maya visit?"
    hits = s.search(question, k=6, record=False)
    weights = context.piece_weights(s)
    ranked = rank_facts(s, question, weights)
    assert isinstance(ranked, context.RankedFacts) and len(ranked) == 8
    assert ranked.numbers.tolist() == [f.n for f, _, _ in ranked]
    assert ranked.weights.tolist() == [w for _, _, w in ranked]

    def recounted(ranking) -> list[int]:
        return [s.tokenizer.count(line) + 1 for _, line, _ in ranking]

    assert context.line_costs(s, ranked).tolist() == recounted(ranked)
    fixed = context.fixed_pages(s)
    splits = set()
    for frames, most in ((8, 4), (6, 1), (4, 2), (3, 3), (2, 2)):
        by_arrays = context.split(s, hits, ranked, weights, frames, most, fixed)
        assert by_arrays == context.split(s, hits, list(ranked), weights, frames, most, fixed), (frames, most)
        splits.add(by_arrays[:2])
    assert len(splits) > 1, "the frames asked for change the split"
    # a newer fact on Lisbon's trip: the older one's line now names it, and its cost is that line's
    older = next(f for f in s.facts.items if f.subject == "trip Lisbon")
    s.add_facts([Draft("trip Lisbon", "Maya visited Lisbon again, for a week in the old town.", older.turns)], "script")
    again = rank_facts(s, question, weights)
    changed = dict((f.n, line) for f, line, _ in again)[older.n]
    assert "superseded by" in changed and changed not in [line for _, line, _ in ranked]
    assert context.line_costs(s, again).tolist() == recounted(again)
    home.journal.close(remove=True)


def test_a_fact_keeps_its_fields_and_turns_through_a_pickle(tmp_path):
    """Facts are slotted (no dict per fact) and cached as pickles with the session's snapshot."""
    import pickle

    from pager.facts import Fact

    fact = Fact(3, "trip oslo", "Maya visited Oslo.", (4, 9), (1, 2), 1.0, "8 May 2023", "script")
    back = pickle.loads(pickle.dumps(fact))
    assert back == fact and hash(back) == hash(fact) and back.turn_set == frozenset({4, 9})
    assert not hasattr(fact, "__dict__")
