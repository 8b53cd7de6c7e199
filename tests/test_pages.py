"""Packing turns onto pages."""

from hypothesis import given, settings, strategies as st

from pager.page import Packer, Turn, header_reserve
from pager.tokens import get_tokenizer

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
