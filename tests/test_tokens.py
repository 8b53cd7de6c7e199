"""The tokenizer's shortcuts are exact: a count by `encode_ordinary` is the count `encode` made, and
`least_tokens` never says more than the count; a slab packed with it passes over the same lines,
without counting those that cannot fit."""

import pytest
from hypothesis import given, settings, strategies as st

from pager import context
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.store import MemoryStore
from pager.tokens import LONGEST_TOKEN, get_tokenizer, least_tokens

ENCODINGS = st.sampled_from(["cl100k_base", "o200k_base"])
# the characters the bound is about: every kind of whitespace (ASCII, Unicode, the information separators
# Python splits on and the tokenizer does not), the punctuation runs o200k ends with "/" and newlines, and
# text that reads as a special token
SPACES = ["\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "\u1680", "\u2000", "\u2028", "\u2029",
          "\u202f", "\u3000"]
alphabet = st.one_of(st.characters(codec="utf-8", exclude_categories=["Cs"]),
                     st.sampled_from([" ", " ", "/", ".", "'", "'s", "-", "·", "Maya", "p12", "2023", *SPACES]))
texts = st.lists(alphabet, max_size=120).map("".join)
specials = st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", "<|endofprompt|>", "<|im_start|>", "\ud800", ""])

# the Unicode White_Space property: what the tokenizers' `\s` takes for whitespace
WHITE_SPACE = [*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F,
               0x3000]


@settings(max_examples=400, deadline=None)
@given(text=texts, special=specials, encoding=ENCODINGS)
def test_a_count_is_the_count_encode_makes(text, special, encoding):
    tokenizer = get_tokenizer(encoding)
    for t in (text, special + text, text + special + text):
        assert tokenizer.count(t) == len(tokenizer._enc.encode(t, disallowed_special=())), repr(t)
        assert tokenizer.encode(t) == tokenizer._enc.encode(t, disallowed_special=())


@settings(max_examples=600, deadline=None)
@given(text=texts, encoding=ENCODINGS)
def test_least_tokens_is_never_more_than_the_count(text, encoding):
    tokenizer = get_tokenizer(encoding)
    for t in (text, "- p4 · 8 May 2023 · " + text, text.replace(" ", "  ")):
        assert least_tokens(t) <= tokenizer.count(t), repr(t)


def test_least_tokens_counts_the_runs_between_spaces():
    assert least_tokens("") == 0
    assert least_tokens("   ") == 0
    assert least_tokens("- p4 · 8 May 2023 · Maya: the old harbour.") == 11
    assert least_tokens("a\tb  c \n d") == 3   # a tab or a newline joins a run; a run of whitespace is none
    # what the tokenizers take for whitespace, Python does too (so a run counted holds a character they do not)
    assert all(chr(c).isspace() for c in WHITE_SPACE)


def test_a_slab_passes_over_a_line_that_cannot_fit_without_counting_it(tmp_path):
    """pack_slabs places the lines a count of each would place, and asks the tokenizer for none whose
    words alone outnumber the room left (fails when every line is counted)."""
    config = Config(home=tmp_path / "h", page_tokens=128, embedder="hash")
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("slabs")
    words = "the quarterly inventory of warehouse lists pallets forklifts shelving units and tape".split()
    lines = [(i, "- " + " ".join(words[: 3 + (7 * i) % len(words)]) + f" {i}.") for i in range(40)]
    limit = 150

    counted: list[str] = []
    real = s.tokenizer.count
    s.tokenizer.count = lambda text: counted.append(text) or real(text)   # type: ignore[method-assign]
    try:
        packed = context.pack_slabs(s, lines, 1, context.EXCERPTS_TITLE, limit=limit)
    finally:
        del s.tokenizer.count

    # the reference: first fit with every line counted
    room, expected = limit - real(context.EXCERPTS_TITLE + context.SEPARATOR), []
    for item in lines:
        if room < 2:
            break
        cost = real(item[1]) + 1
        if cost <= room:
            expected.append(item)
            room -= cost
    assert packed == [expected]
    skipped = [line for _, line in lines if line not in counted and (_, line) not in expected]
    assert skipped, "a line longer in words than the room left was counted"
    assert all(line in counted for _, line in expected)
    home.close()


@pytest.mark.parametrize("encoding", sorted(LONGEST_TOKEN))
def test_the_known_longest_token_is_the_encodings_own(encoding):
    """LONGEST_TOKEN spares a walk over every token at start-up: it must be what the walk finds."""
    tokenizer = get_tokenizer(encoding)
    assert LONGEST_TOKEN[encoding] == max(len(b) for b in tokenizer._enc.token_byte_values())
    assert tokenizer.longest_token == LONGEST_TOKEN[encoding]
