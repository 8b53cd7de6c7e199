"""Fusion, dates and the automatic-paging search."""

import time
from datetime import datetime

from pager.context import build
from pager.search import date_range, terms


def test_terms_stem_and_drop_stopwords():
    assert terms("We went camping and she camped") == ["went", "camp", "camp"]
    assert terms("东京塔") == ["东京", "京塔"]


def test_exact_keyword_page_ranks_first(mem_home):
    s = mem_home.open("a")
    for i in range(60):
        s.append("ann", f"ordinary talk number {i} about the weather, lunch and the sprint board")
    s.append("bob", "The staging cluster is called heron-staging and production is heron-prod.")
    for i in range(60):
        s.append("ann", f"more ordinary talk {i} about coffee and standups")
    hits = s.search("which cluster is heron-staging?", k=3)
    assert "heron-staging" in s.pages[hits[0].n].text
    assert hits[0].signals["bm25"] > 0  # explained


def test_bookmark_signal_finds_a_page_by_the_models_keyword(mem_home):
    s = mem_home.open("a")
    for i in range(80):
        s.append("ann", f"filler line {i} with nothing in particular")
    target = 5
    s.bookmark([target], ["Project Nightingale"], "the secret launch")
    hits = s.search("what is project nightingale", k=3)
    assert hits[0].n == target and "bookmark" in hits[0].signals


def test_temporal_query_finds_the_dated_page(mem_home):
    s = mem_home.open("a")
    for month in range(1, 13):
        ts = datetime(2023, month, 10).timestamp()
        for i in range(8):
            s.append("ann", f"we discussed the roadmap and the budget again, item {month}-{i}", ts=ts,
                     date=f"10 {datetime(2023, month, 10):%B} 2023")
    hits = s.search("what did we say about the budget in May 2023?", k=3)
    assert s.pages[hits[0].n].date_first == "10 May 2023"
    assert "date" in hits[0].signals


def test_date_range_expressions():
    now = datetime(2026, 11, 30, 12).timestamp()
    start, end = date_range("what happened on 8 May 2023?", now)
    assert start <= datetime(2023, 5, 8).timestamp() < end
    start, end = date_range("decisions from last May", now)
    assert datetime.fromtimestamp(start) == datetime(2026, 5, 1)
    start, end = date_range("in 2022 we moved", now)
    assert datetime.fromtimestamp(start).year == 2022 and datetime.fromtimestamp(end).year == 2023
    start, end = date_range("what did I say yesterday", now)
    assert datetime.fromtimestamp(start) == datetime(2026, 11, 29)
    assert date_range("what is the plan?", now) is None


def test_autopage_faults_with_readahead_inside_the_share(mem_home):
    s = mem_home.open("a")
    for i in range(150):
        s.append("ann", f"routine message {i} about nothing much at all")
    s.append("bob", "Remember: the vault code for the Oslo office is 7731.")
    for i in range(150):
        s.append("ann", f"routine message {i + 150} about nothing much at all")
    holder = next(n for n, p in s.pages.items() if "7731" in p.text)
    assert not s.table[holder].resident
    ctx = build(s, "what is the vault code for the Oslo office?", chat=False)
    assert holder in ctx.pages
    assert len(ctx.pages) <= ctx.frames
    faulted = sum(1 for e in s.table.values() if e.fault_count)
    assert faulted <= int(ctx.frames * s.home.config.autopage_share)
