"""Packing turns onto pages."""

import pytest
from hypothesis import given, settings, strategies as st

from pager.page import Packer, Turn, header_reserve
from pager.tokens import get_tokenizer

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

TOK = get_tokenizer("cl100k_base")


def turn(i, text, speaker="ann", date=""):
    return Turn("s", i, speaker, text, date=date)


def test_short_turns_are_packed_together():
    p = Packer("s", TOK, 128)
    sealed = []
    for i in range(1, 30):
        sealed += p.add(turn(i, f"short message number {i}"))
    assert sealed, "some pages sealed"
    assert all(len(page.turns) > 3 for page in sealed)
    assert all(page.tokens <= p.capacity for page in sealed)


def test_long_turn_spans_pages_and_keeps_every_character():
    p = Packer("s", TOK, 64)
    text = " ".join(f"word{i}" for i in range(400))
    pages = p.add(turn(1, text))
    pages.append(p.seal())
    assert len(pages) > 3
    pieces = [text[s:e] for page in pages for (_, s, e) in page.spans]
    assert "".join(pieces) == text
    assert all(page.tokens <= p.capacity for page in pages)


def test_date_change_inside_a_page_is_marked():
    p = Packer("s", TOK, 256)
    p.add(turn(1, "first", date="8 May 2023"))
    p.add(turn(2, "second", date="9 May 2023"))
    page = p.seal()
    assert "(9 May 2023)" in page.text and page.date_first == "8 May 2023"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=600), min_size=1, max_size=25), st.sampled_from([48, 64, 128, 256]))
def test_packing_is_deterministic_and_bounded(texts, size):
    def pack():
        p = Packer("s", TOK, size)
        out = []
        for i, t in enumerate(texts, 1):
            out += p.add(turn(i, t))
        if p.pieces:
            out.append(p.seal())
        return out

    a, b = pack(), pack()
    assert [(x.text, x.spans) for x in a] == [(x.text, x.spans) for x in b]
    assert all(x.tokens <= size - header_reserve(size) - 2 for x in a)
    assert [x.tokens for x in a] == [TOK.count(x.text) for x in a]   # kept from packing, never stale
    # every character of every turn is on exactly one page
    for i, t in enumerate(texts, 1):
        spans = sorted((s, e) for x in a for (n, s, e) in x.spans if n == i)
        assert spans[0][0] == 0 and spans[-1][1] == len(t)
        assert all(e1 == s2 for (_, e1), (s2, _) in zip(spans, spans[1:]))


@settings(max_examples=150, deadline=None)
@given(text=st.text(min_size=1, max_size=3000), start=st.integers(0, 2000), limit=st.integers(1, 300),
       head=st.sampled_from(["", "maya: ", "assistant (cont.): "]), encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_fit_end_cuts_where_one_more_character_would_not_fit(text, start, limit, head, encoding):
    tok = get_tokenizer(encoding)
    start = min(start, len(text) - 1)

    def fits(end):
        return tok.count(head + text[start:end]) <= limit

    end = tok.fit_end(text, start, limit, head=head)
    assert start + 1 <= end <= len(text)
    assert fits(end) or end == start + 1            # a piece moves on even when one character is too many
    assert end == len(text) or not fits(end + 1)
    prefix = tok.fit(text, limit)
    assert text.startswith(prefix) and tok.count(prefix) <= limit
    assert prefix == text or tok.count(text[:len(prefix) + 1]) > limit


def test_a_turn_of_megabytes_is_packed_with_counts_of_about_a_page_each():
    """A 2 MB message (one served request) once took minutes: every page re-counted the whole rest
    of the turn. Counted characters are the measure, not time: they must stay a small multiple of
    the text, and the pages must hold every character exactly once."""
    tok = get_tokenizer()
    counted = []
    count = tok.count
    tok.count = lambda text: counted.append(len(text)) or count(text)   # type: ignore[method-assign]
    try:
        words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
        text = " ".join(words[(i * 7 + i // 3) % 8] + str(i % 97) for i in range(300_000))
        packer = Packer("s", tok, 128)
        pages = packer.add(Turn("s", 1, "maya", text))
        if packer.pieces:
            pages.append(packer.seal())
    finally:
        del tok.count
    assert "".join(text[a:b] for page in pages for (_, a, b) in page.spans) == text
    assert all(page.tokens <= packer.capacity for page in pages)
    assert sum(counted) < 30 * len(text), f"counted {sum(counted):,} characters for a text of {len(text):,}"
