"""The assembled context never exceeds its budget by a single token, whatever the regions hold:
the memory map, the working state (any number of keys, any text, any share), the summaries (any
number, any size, any share; the rolling one in the map) and the pages."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pager.config import CHAT_FLOOR, Config
from pager.context import build, size_frames
from pager.embed import HashEmbedder
from pager.home import Home
from pager.store import MemoryStore

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

# any printable text, plus the characters that sit at block boundaries: newlines, "[", "#", punctuation, spaces
alphabet = st.one_of(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]),
                     st.sampled_from(["\n", " ", "#", "[", "]", ".", "!", "/", "'", "\t"]))
words = st.text(alphabet=alphabet, min_size=1, max_size=300).filter(lambda t: t.strip() and "\x00" not in t)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    texts=st.lists(words, min_size=1, max_size=60),
    page_tokens=st.sampled_from([48, 64, 96, 128, 256, 512]),
    budget=st.integers(min_value=700, max_value=9000),
    policy=st.sampled_from(["clock", "lru", "lfu", "scored"]),
    questions=st.lists(words, min_size=1, max_size=4),
    chat=st.booleans(),
    encoding=st.sampled_from(["cl100k_base", "o200k_base"]),
    state=st.lists(st.tuples(st.text("abcdefghij XYZ_", min_size=1, max_size=40).filter(lambda k: k.strip(" _")),
                             words), max_size=12),
    state_share=st.sampled_from([0.0, 0.05, 0.15, 0.4, 0.8]),
    summaries=st.lists(st.tuples(st.booleans(), st.text(alphabet=alphabet, min_size=1, max_size=2000)
                                 .filter(lambda t: t.strip() and "\x00" not in t)), max_size=6),
    summary_share=st.sampled_from([0.0, 0.1, 0.3, 0.6]),
)
def test_context_never_exceeds_budget(tmp_path_factory, texts, page_tokens, budget, policy, questions, chat, encoding,
                                      state, state_share, summaries, summary_share):
    from pager.summaries import Draft
    budget = max(budget, 2 * page_tokens + CHAT_FLOOR)   # the smallest a Config accepts for these pages
    cfg = Config(home=tmp_path_factory.mktemp("h"), budget=budget, page_tokens=page_tokens, policy=policy,
                 embedder="hash", tokenizer=encoding, state_share=state_share, summary_share=summary_share)
    home = Home(cfg, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("p")
    s.append_many([{"speaker": f"sp{i % 3}", "text": t} for i, t in enumerate(texts)])
    for key, value in state:
        s.set_state(key, value[:400])
    s.add_summaries([Draft("rolling" if rolling else "episode", "rolling" if rolling else f"e{i}", text, (1, s.turn_count))
                     for i, (rolling, text) in enumerate(summaries)], "script")
    prefix = "You are a careful assistant." * 3
    for q in questions:
        ctx = build(s, q[:200], prefix=prefix if chat else "", chat=chat)
        if chat:
            recount = sum(4 + s.tokenizer.count(m["content"]) for m in ctx.messages()) + 3
        else:
            recount = s.tokenizer.count(ctx.memory)
        assert recount <= budget, (recount, budget)
        assert ctx.tokens["total"] == recount, "the per-segment count is the exact count of the whole"
        assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory)
        assert ctx.tokens["state"] <= budget * state_share
        assert bool(ctx.tokens["state"]) == ("[state" in ctx.memory)
        frames = size_frames(s, q[:200], prefix if chat else "", chat=chat)[0]   # before any region took some
        assert -(-ctx.tokens.get("summaries", 0) // page_tokens) <= int(frames * summary_share)   # whole frames, its share
        assert bool(ctx.summaries) == ("\n\n[summaries" in ctx.memory)
        assert ctx.dropped == []  # the frame arithmetic alone kept it in budget
        assert len(ctx.pages) <= ctx.frames
    home.journal.close(remove=True)


@settings(max_examples=400, deadline=None)
@given(header=st.text(alphabet=alphabet, max_size=60), body=words, separator=st.sampled_from(["\n\n", "\n"]),
       encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_a_block_counts_as_its_header_plus_its_body(header, body, separator, encoding):
    """Renderer.block_tokens adds two cached counts instead of counting each block whole: for every
    body it takes that way, the sum is the exact count of the block."""
    from pager.render import starts_clean
    from pager.tokens import get_tokenizer

    count = get_tokenizer(encoding).count
    header = "[" + header + "]"
    if starts_clean(body):
        assert count(header + "\n" + body + separator) == count(header + "\n") + count(body + separator)


@settings(max_examples=400, deadline=None)
@given(text=words, separator=st.sampled_from(["\n\n", "\n", " ", "]"]), encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_a_text_extended_counts_from_its_own_count(text, separator, encoding):
    """Tokenizer.count_extended recounts only a text's end after its last letter-space boundary: the
    result is the exact count of the whole, for any text and suffix."""
    from pager.tokens import get_tokenizer

    tokenizer = get_tokenizer(encoding)
    for t in (text, text + " said it", "Maya: " + text + " on 8 May."):
        assert tokenizer.count_extended(t, tokenizer.count(t), separator) == tokenizer.count(t + separator), repr(t)


keyword = st.text(alphabet=alphabet, min_size=1, max_size=30)


@settings(max_examples=400, deadline=None)
@given(n=st.integers(min_value=1, max_value=10**9), date=st.one_of(st.just(""), st.text(alphabet=alphabet, max_size=30),
                                                                   st.sampled_from(["8 May 2023", "1 Jan 1999", "2023-05-08"])),
       keywords=st.lists(st.one_of(keyword, st.from_regex(r"[a-z]{2,9}", fullmatch=True)), max_size=4),
       encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_a_header_counts_as_its_parts(n, date, keywords, encoding):
    """Renderer._header_parts sums cached counts of a header's parts instead of counting each new page's
    header: wherever _parts_exact allows it, the sum is the exact count (with and without its newline)."""
    from types import SimpleNamespace

    from pager.render import Renderer
    from pager.tokens import get_tokenizer

    tokenizer = get_tokenizer(encoding)
    render = Renderer(SimpleNamespace(tokenizer=tokenizer))
    keywords = tuple(keywords)
    if not Renderer._parts_exact(date, keywords):
        return
    base = "[" + " · ".join([f"p{n}"] + ([date] if date else []))
    header = f"{base} · bookmarks: {', '.join(keywords)}]" if keywords else base + "]"
    assert render._header_parts(n, date, keywords, "]") == tokenizer.count(header)
    assert render._header_parts(n, date, keywords, "]\n") == tokenizer.count(header + "\n")


@settings(max_examples=300, deadline=None)
@given(n=st.integers(min_value=1, max_value=10**7), date=st.sampled_from(["", "8 May 2023", "12 December 1999", "x"]),
       keywords=st.lists(st.from_regex(r"[a-z][a-z ]{0,14}[a-z0-9]", fullmatch=True), max_size=4),
       limit=st.integers(min_value=3, max_value=40), encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_a_header_fit_by_parts_is_the_counted_fit(n, date, keywords, limit, encoding):
    """The header's bookmarks fitted from its parts' counts are those the whole-header counts fit, and
    the tokens it keeps for the header with its newline are that header's count."""
    from types import SimpleNamespace

    from pager.render import Renderer
    from pager.tokens import get_tokenizer

    tokenizer = get_tokenizer(encoding)
    render = Renderer(SimpleNamespace(tokenizer=tokenizer))
    keywords = tuple(keywords)
    base = "[" + " · ".join([f"p{n}"] + ([date] if date else []))
    cut, line = render._fit_by_parts(n, date, keywords, limit)
    assert cut == render._fit_counted(base, keywords, limit)
    header = f"[p{n}]" if cut < 0 else (f"{base} · bookmarks: {', '.join(keywords[:cut])}]" if cut else base + "]")
    assert line == tokenizer.count(header + "\n")
