"""Assembly with the memory tiers takes shortcuts to stay cheap (per-line token counts summed
instead of each slab and summaries block counted whole, fact lines and the map's rolling line kept
between turns): on a seeded session with facts (some superseded), summaries and a working state,
every context it assembles is the one the slow reference path (everything rendered and counted
whole, every time) assembles, question after question, at small and large budgets."""

import random

import pytest
from hypothesis import given, settings, strategies as st

from pager.config import Config
from pager.context import build
from pager.embed import HashEmbedder
from pager.facts import Draft, Facts
from pager.home import Home
from pager.render import Renderer
from pager.store import MemoryStore
from pager.summaries import Draft as SummaryDraft

NAMES = "Maya Sam Priya Jonas Petra Ines".split()
WORDS = ("budget review deploy launch contract garden coffee trip marathon concert doctor flight hotel "
         "museum river dinner kids dog school report dashboard metrics cache index").split()


def seeded_session(tmp_path, seed: int, budget: int, tag: str):
    rng = random.Random(seed)
    cfg = Config(home=tmp_path / tag, budget=budget, page_tokens=128, embedder="hash")
    home = Home(cfg, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("ref")
    turns = [{"speaker": rng.choice(NAMES), "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 30)))
              + rng.choice([".", "!", "?", "", " (ok)", "\n- a list item"])} for _ in range(300)]
    s.append_many(turns)
    drafts = []
    for _ in range(60):   # about a third of the subjects are said again: those facts supersede older ones
        who, what = rng.choice(NAMES), rng.choice(WORDS)
        drafts.append(Draft(f"{who.lower()} {what}", f"{who}'s {what} is {rng.randint(1, 5000)}" + rng.choice([".", "", "!\n"]),
                            (rng.randint(1, s.turn_count),)))
    s.add_facts(drafts, "script")
    episodes = [SummaryDraft("episode", f"episode {i}", " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) + ".",
                             (first, first + 29)) for i, first in enumerate(range(1, 300, 30))]
    episodes.append(SummaryDraft("rolling", "rolling", "So far: " + " ".join(d.text for d in episodes[-3:]), (1, 300)))
    s.add_summaries(episodes, "script")
    for i in range(8):
        s.set_state(f"{WORDS[i]}_{i}", f"{NAMES[i % len(NAMES)]} owns the {WORDS[-1 - i]} until {i + 1} May")
    questions = [f"what did {rng.choice(NAMES)} say about the {rng.choice(WORDS)} and {rng.choice(WORDS)}"
                 + rng.choice(["?", " before?", " previously?", "."]) for _ in range(25)]
    return home, s, questions


def slow_reference(monkeypatch):
    """Everything rendered and counted whole, every time: no per-line sums, no kept lines."""
    monkeypatch.setattr(Renderer, "list_tokens", lambda self, title, lines, sep: self.s.tokenizer.count("\n".join([title, *lines]) + sep))
    monkeypatch.setattr(Renderer, "line_tokens", lambda self, line: self.s.tokenizer.count(line))
    monkeypatch.setattr(Facts, "line", lambda self, fact: self._line(fact))


@pytest.mark.parametrize("budget", [1024, 2048, 8192])
@pytest.mark.parametrize("seed", [3, 11])
def test_assembly_matches_the_slow_reference(tmp_path, monkeypatch, seed, budget):
    home, fast, questions = seeded_session(tmp_path, seed, budget, "fast")
    contexts = [build(fast, q, prefix="You are a helpful assistant.") for q in questions]
    home.journal.close(remove=True)
    with monkeypatch.context() as m:
        slow_reference(m)
        home, slow, _ = seeded_session(tmp_path, seed, budget, "slow")
        for q, got in zip(questions, contexts):
            slow.render.rolling_line = None   # the map's rolling line made afresh each turn
            want = build(slow, q, prefix="You are a helpful assistant.")
            assert (got.memory, got.pages, got.facts, got.summaries, got.tokens) == \
                   (want.memory, want.pages, want.facts, want.summaries, want.tokens), f"seed {seed}, budget {budget}: {q!r}"
        home.journal.close(remove=True)
    assert any(c.facts for c in contexts), "facts were in view"
    assert budget < 2048 or any(c.summaries for c in contexts), "summaries were in view"


alphabet = st.one_of(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]),
                     st.sampled_from(["\n", " ", "#", "[", "]", ".", "!", "/", "'", "\t", "-", "\r"]))


@settings(max_examples=400, deadline=None)
@given(title=st.text(alphabet=alphabet, max_size=40), lines=st.lists(st.text(alphabet=alphabet, max_size=80), max_size=6),
       separator=st.sampled_from(["\n\n", "\n"]), encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_a_block_of_lines_counts_as_the_sum_of_its_lines(title, lines, separator, encoding):
    """Renderer.list_tokens sums cached per-line counts when every line starts with "-", else counts
    the whole: either way it is the exact count of the block."""
    from types import SimpleNamespace

    from pager.tokens import get_tokenizer

    tokenizer = get_tokenizer(encoding)
    renderer = Renderer(SimpleNamespace(tokenizer=tokenizer))
    lines = [("- " if i % 2 else "-") + line for i, line in enumerate(lines)]
    assert renderer.list_tokens(title, lines, separator) == tokenizer.count("\n".join([title, *lines]) + separator)


@settings(max_examples=400, deadline=None)
@given(title=st.text(alphabet=alphabet, max_size=40), lines=st.lists(st.text(alphabet=alphabet, max_size=80), max_size=6),
       separator=st.sampled_from(["\n\n", "\n", ""]), encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_lines_that_start_clean_count_as_the_sum_of_their_lines(title, lines, separator, encoding):
    """The memory map's lines (its notice, rolling line, title and bookmark lines) start with any
    character but whitespace and "/": Renderer.list_tokens sums their cached counts, and the sum is
    the exact count of the whole; a line that does not start clean makes it count the whole."""
    from types import SimpleNamespace

    from pager.render import starts_clean
    from pager.tokens import get_tokenizer

    tokenizer = get_tokenizer(encoding)
    renderer = Renderer(SimpleNamespace(tokenizer=tokenizer))
    assert renderer.list_tokens(title, lines, separator) == tokenizer.count("\n".join([title, *lines]) + separator)
    clean = [line for line in lines if starts_clean(line)]
    assert renderer.list_tokens(title, clean, separator) == tokenizer.count("\n".join([title, *clean]) + separator)
    counted = Renderer(SimpleNamespace(tokenizer=tokenizer))   # each line's own count known, as the map's are
    for line in clean:
        counted.line_tokens(line)
    assert counted.list_tokens(title, clean, separator) == tokenizer.count("\n".join([title, *clean]) + separator)


@settings(max_examples=300, deadline=None)
@given(title=st.text(alphabet=alphabet, max_size=20), lines=st.lists(st.text(alphabet=alphabet, max_size=60), max_size=6),
       encoding=st.sampled_from(["cl100k_base", "o200k_base"]))
def test_a_lines_kept_share_counts_it_wherever_it_stands(title, lines, encoding):
    """Renderer.line_share keeps what a line adds to a block once; the same renderer then counts the
    same lines in other orders, last or not, after each separator, and each count is the whole's."""
    from types import SimpleNamespace

    from pager.tokens import get_tokenizer

    tokenizer = get_tokenizer(encoding)
    renderer = Renderer(SimpleNamespace(tokenizer=tokenizer))
    lines = ["- " + line for line in lines]
    for order in (lines, lines[::-1], lines[1:] + lines[:1]):
        for separator in ("\n\n", "\n", ""):
            assert renderer.list_tokens(title, order, separator) == \
                tokenizer.count("\n".join([title, *order]) + separator), (order, separator)


def test_the_open_tails_count_follows_the_tail(tmp_path):
    """The open tail's block count is kept while its block is the same (each step of a turn shows it):
    a turn added to the tail is counted with it."""
    home, s, questions = seeded_session(tmp_path, 5, 2048, "tail")
    for i, q in enumerate(questions[:6]):
        before = build(s, q, prefix="You are a helpful assistant.")
        assert before.tokens["memory"] == s.tokenizer.count(before.memory)
        s.append_many([{"speaker": "Maya", "text": f"and one more thing number {i}"}])
        after = build(s, q, prefix="You are a helpful assistant.")
        assert s.tail_n in after.pages and after.memory != before.memory
        assert after.tokens["memory"] == s.tokenizer.count(after.memory)
    home.journal.close(remove=True)
