"""Facts: a conversation whose values change (a move, a new deadline, a changed dose) with a
scripted memory model. The current value is in the state and first among facts; the old one is
marked superseded with its dates and found when asked what it was before; nothing is deleted;
facts share frames as slabs and the budget holds; a failing producer loses no turn; replay of a
session with facts is exact."""

import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pager.agent import Agent
from pager.bench.record import record
from pager.config import CHAT_FLOOR, Config
from pager.context import build
from pager.embed import HashEmbedder
from pager.facts import Draft
from pager.home import Home
from pager.model import HandlerModel
from pager.offline import OfflineShell
from pager.replay import replay
from pager.store import MemoryStore

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

TALK = [
    ("Maya", "My home city is Paris."),
    ("Maya", "The project deadline is 14 March, the launch review is on the same day."),
    ("Maya", "My medication dose is 10 mg, once a day with breakfast."),
    *[("Maya", f"Small talk {i}: the weather, the trains, lunch at the corner cafe number {i}.") for i in range(40)],
    ("Maya", "We moved! My home city is now Berlin, the flat is near the river."),
    ("Maya", "The client pushed the project deadline to 21 March."),
    ("Maya", "The doctor changed my medication dose to 20 mg."),
    *[("Maya", f"More small talk {i}: a film, a book, a walk in the park number {i}.") for i in range(20)],
]
# what a memory model said about the turns above: subject, statement, the turn it came from (1-based)
SAID = {1: ("home city", "Maya lives in Paris."), 2: ("project deadline", "The project deadline is 14 March."),
        3: ("medication dose", "Maya takes 10 mg of her medication once a day."),
        44: ("home city", "Maya moved to Berlin; she lives near the river."),
        45: ("project deadline", "The project deadline moved to 21 March."),
        46: ("medication dose", "Maya's medication dose is now 20 mg.")}


class Scripted:
    """A memory model that says SAID about the turns on the pages it is shown."""

    source = "script"

    def __init__(self):
        self.calls = 0

    def __call__(self, session, pages):
        self.calls += 1
        held = {t for n in pages if n in session.pages for t, _, _ in session.pages[n].spans}
        held |= {p.turn.turn for p in session.packer.pieces} if session.tail_n in pages else set()
        return [Draft(subject, text, (turn,)) for turn, (subject, text) in SAID.items() if turn in held]


def failing(session, pages):
    raise ConnectionError("the memory model's provider is down")


def home_for(tmp_path, **kw):
    config = Config(home=tmp_path / "h", **{"budget": 1024, "page_tokens": 128, "embedder": "hash", **kw})
    return Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)


def session_with_facts(home):
    s = home.open("moves")
    for i, (speaker, text) in enumerate(TALK):
        s.append(speaker, text, ts=1_700_000_000 + 86_400 * i)  # one turn a day
    s.extract_facts(Scripted())
    return s


def test_the_current_value_ranks_first_and_the_old_one_is_superseded_with_its_dates(tmp_path):
    home = home_for(tmp_path)
    s = session_with_facts(home)
    assert len(s.facts) == 6                        # nothing deleted: both values of each subject are kept
    for subject, old, new in [("home city", "Paris", "Berlin"), ("project deadline", "14 March", "21 March"),
                              ("medication dose", "10 mg", "20 mg")]:
        first, second = s.facts.history(subject)
        assert old in first.text and new in second.text
        assert s.facts.superseded_by(first) is second and s.facts.superseded_by(second) is None
        assert first.ts < second.ts and first.date != second.date
        record = next(f for f in s.facts.to_json() if f["id"] == first.id)
        assert record["valid_to"] == second.ts and record["superseded_by"] == second.id
    ranked = [f for f, _ in s.facts.search("Where does Maya live, which city?")]
    assert "Berlin" in ranked[0].text and any("Paris" in f.text for f in ranked)
    before = [f for f, _ in s.facts.search("Which city did Maya live in before?")]
    assert "Paris" in before[0].text
    old_dose = s.facts.history("medication dose")[0]
    assert "superseded by f6" in s.facts.line(old_dose) and "→" in s.facts.line(old_dose)  # marked, with its end
    ctx = build(s, "What was Maya's medication dose before the doctor changed it?", chat=False)
    assert "10 mg" in ctx.memory                                   # as a page or as the marked fact
    home.journal.close(remove=True)


def test_the_state_holds_the_current_value_the_offline_shell_was_told(tmp_path):
    home = home_for(tmp_path, budget=2048)
    s = home.open("moves")
    agent = Agent(s, HandlerModel(OfflineShell()))
    for text in ("My home city is Paris.", "My home city is now Berlin."):
        agent.ask(text)
    s.extract_facts(Scripted())
    assert s.state.values() == {"home city": "Berlin"}
    assert [c.value for c in s.state.history("home city")] == ["Paris", "Berlin"]
    home.journal.close(remove=True)


def test_facts_share_frames_as_slabs(tmp_path):
    home = home_for(tmp_path)
    s = session_with_facts(home)
    ctx = build(s, "Maya medication dose project deadline home city", chat=False, autopage=False)
    blocks = [b for b in ctx.memory.split("\n\n") if b.startswith(("[facts]", "[excerpts"))]
    slabs = blocks[: len(blocks) - ctx.filled]   # the rest fill the tokens the frames left over
    assert len(ctx.facts) > len(slabs) >= 1           # several facts in one frame
    assert all(s.tokenizer.count(b + "\n\n") <= s.page_tokens for b in slabs)
    assert ctx.tokens["facts"] == sum(s.tokenizer.count(b + "\n\n") for b in blocks)
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 1024
    home.journal.close(remove=True)


def test_a_failing_memory_model_loses_no_turn(tmp_path):
    home = home_for(tmp_path)
    s = home.open("down")
    events = []
    s.events.listeners.append(events.append)
    for speaker, text in TALK[:10]:
        s.append(speaker, text)
    assert s.extract_facts(failing) == []
    assert "provider is down" in s.memory_error and [e.kind for e in events].count("memory_error") == 1
    assert s.turn_count == 10 and len(s.facts) == 0
    s.append("Maya", "still here")
    assert s.turn_count == 11
    assert build(s, "home city?", chat=False).facts == []
    home.journal.close(remove=True)


def test_a_session_with_facts_replays_exactly(tmp_path):
    path = tmp_path / "facts.jsonl"

    def with_facts(session, agent):
        session.extract_facts(Scripted())

    record(path, [{"speaker": a, "text": t, "ts": 1_700_000_000 + 86_400 * i} for i, (a, t) in enumerate(TALK)],
           ["Where does Maya live now?", "What was the project deadline before?"],
           Config(budget=2048, session="facts", embedder="hash"), "facts, no LLM", setup=with_facts)
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert kinds.count("fact") == 6 and "facts_written" in kinds
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence.describe()
    assert sum(1 for e in run.events if e["kind"] == "fact") == 6


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(facts=st.lists(st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=400)
                      .filter(str.strip), min_size=1, max_size=30),
       budget=st.integers(min_value=400, max_value=6000), page_tokens=st.sampled_from([64, 128, 256]),
       share=st.sampled_from([0.0, 0.1, 0.3, 0.6, 0.9]), excerpts=st.sampled_from([0, 1, 2]),
       question=st.text(min_size=1, max_size=80).filter(str.strip))
def test_regions_hold_the_budget_with_facts_of_any_size(tmp_path_factory, facts, budget, page_tokens, share, excerpts,
                                                         question):
    config = Config(home=tmp_path_factory.mktemp("f"), budget=max(budget, 2 * page_tokens + CHAT_FLOOR), page_tokens=page_tokens,
                    embedder="hash", fact_share=share, excerpt_slabs=excerpts)
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("p")
    turns = s.append_many([{"speaker": "ann", "text": f"turn {i} " + text} for i, text in enumerate(facts)])
    # facts for every other turn: the rest can only be shown on pages or as excerpts
    s.add_facts([Draft(f"s{i % 4}", text, (turns[i].turn,)) for i, text in enumerate(facts) if i % 2 == 0], "script")
    s.set_state("mood", facts[0][:300])
    ctx = build(s, question + " " + facts[-1][:50], chat=False)
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= config.budget
    blocks = [b for b in ctx.memory.split("\n\n") if b.startswith(("[facts]", "[excerpts"))]
    slabs = blocks[: len(blocks) - ctx.filled]   # the rest fill the tokens the frames left over
    assert ctx.tokens["facts"] == sum(s.tokenizer.count(b + "\n\n") for b in blocks)
    assert sum(s.tokenizer.count(b + "\n\n") for b in slabs) <= len(slabs) * page_tokens
    assert len(ctx.pages) + len(slabs) <= max(1, (config.budget - config.map_reserve) // page_tokens)
    home.journal.close(remove=True)


def test_facts_are_durable_seen_by_another_process_recovered_and_reloaded(tmp_path):
    config = Config(home=tmp_path / "h", budget=1024, embedder="hash")
    a, b = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    sa, sb = a.open("moves"), b.open("moves")
    sa.append_many([{"speaker": s, "text": t, "ts": 1_700_000_000 + 86_400 * i} for i, (s, t) in enumerate(TALK)])
    sa.add_facts([Draft("home city", "Maya lives in Paris.", (1,))], "script")
    sb.sync()
    assert [f.text for f in sb.facts.items] == ["Maya lives in Paris."]
    moved = sb.add_facts([Draft("home city", "Maya moved to Berlin.", (44,))], "script")  # numbered after a's
    assert [f.n for f in moved] == [2]
    b.close()
    dead = Home(config, embedder=HashEmbedder())
    dead.open("moves").add_facts([Draft("medication dose", "Maya takes 20 mg.", (46,))], "script")
    dead.journal.close(remove=False)   # killed before any flush
    dead.leases.stop()   # and its lease thread dies with it
    a.close()
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("moves")
        assert [f.text for f in s.facts.items] == ["Maya lives in Paris.", "Maya moved to Berlin.", "Maya takes 20 mg."]
        paris, berlin = s.facts.history("home city")
        assert s.facts.superseded_by(paris) is berlin and paris.pages and berlin.turns == (44,)
        assert [f.n for f in home.store.facts("", "moves")] == [1, 2, 3]


def test_the_journal_refuses_malformed_facts():
    from pager import journal

    good = {"op": "fact", "user": "", "session": "s", "n": 1, "subject": "city", "text": "Maya lives in Paris.",
            "turns": [1], "pages": [1], "ts": 0.0, "date": "1 Jan 2024", "source": "script"}
    assert journal.valid(good) == ""
    assert journal.valid({**good, "n": 0}) and journal.valid({**good, "text": " "}) and journal.valid({**good, "turns": 1})


def test_best_first_is_the_stable_argsort_without_sorting_everything():
    import random

    import numpy as np

    from pager.facts import best_first

    seed = random.randrange(10**6)
    rng = np.random.default_rng(seed)
    for trial in range(500):
        n, k = int(rng.integers(1, 200)), int(rng.integers(0, 220))
        scores = rng.integers(0, 4, n).astype(np.float64) if trial % 2 else rng.random(n).astype(np.float32)
        scores[rng.integers(0, n, n // 3)] = 0.0   # ties, at the cut too
        assert best_first(scores, k).tolist() == np.argsort(-scores, kind="stable")[:k].tolist(), f"seed {seed}"


def test_the_offline_shell_quotes_a_fact_the_context_shows_and_a_superseded_one_only_for_the_past():
    """The shell quoted pages and the state, never the fact slabs: a fact whose page is on disk, shown
    in the context, went unanswered."""
    from pager.offline import OfflineShell

    system = ("[facts]\n- f2 (3 Mar 2025 → 9 May 2025, superseded by f7, p4): Ana lives in Paris, near the Gare du Nord.\n"
              "- f7 (9 May 2025, p31): Ana lives in Berlin, in Kreuzberg.\n\n"
              "[p12 · 1 April 2025]\nAna: The weather in spring is lovely where Ana lives.\n")
    shell = OfflineShell()
    now = shell.answer("Where does Ana live?", system)
    assert now.startswith("From fact f7 (9 May 2025, p31): “Ana lives in Berlin") and "Paris" not in now, now
    before = shell.answer("Where did Ana live before?", system)
    assert "f2" in before and "Paris" in before, before


@pytest.mark.parametrize("whole_message", [False, True])
def test_a_message_is_embedded_once_for_the_pages_the_facts_and_the_summaries(tmp_path, whole_message):
    """The facts and summaries are searched with the page search's vector of the message (the speakers it
    names left out), not an embedding of their own: one embedding a message, a second one cost ~0.1-0.3 ms.
    An embedder that reads names as part of a sentence (minilm: `whole_message`) embeds the whole message
    for them."""
    from pager.summaries import Draft as SummaryDraft

    class Counting(HashEmbedder):
        texts: list[str] = []

        def embed(self, texts):
            Counting.texts += list(texts)
            return super().embed(texts)

    Counting.whole_message = whole_message
    config = Config(home=tmp_path / "h", budget=2048, page_tokens=128, embedder="hash")
    home = Home(config, store=MemoryStore(), embedder=Counting(), durable=False)
    s = session_with_facts(home)
    s.add_summaries([SummaryDraft("episode", "the move", "Maya moved from Paris to Berlin.", (1, 44))], "script")
    Counting.texts = []
    message = "What did Maya say about her medication dose?"
    ctx = build(s, message, chat=False, autopage=False)
    asked = sorted(set(t for t in Counting.texts if "medication dose" in t))
    bare = "What did   say about her medication dose?"
    assert asked == ([bare, message] if whole_message else [bare]), Counting.texts
    assert ctx.facts and ctx.summaries == [1]   # both tiers were searched, with that vector
    assert s.facts.history("medication dose")[0].n in ctx.facts
    home.journal.close(remove=True)


def test_a_fact_line_is_counted_when_the_fact_is_written(tmp_path):
    """A fact's line (and the line of the fact it supersedes, which now says so) is counted when the fact is
    written, not by the first question that ranks it: that question's slabs count no line."""
    home = home_for(tmp_path)
    s = session_with_facts(home)
    older = s.facts.history("home city")[-1]
    made = s.add_facts([Draft("home city", "Maya moved again, to Lisbon.", (60,))], "script")
    shares = s.render._line_shares
    assert s.facts.line(made[0]) in shares and s.facts.line(older) in shares
    assert "superseded by" in s.facts.line(older)
    counted = []
    real = s.tokenizer.count
    s.tokenizer.count = lambda text: counted.append(text) or real(text)
    try:
        build(s, "Where does Maya live now?", chat=False)
    finally:
        del s.tokenizer.count
    assert not [t for t in counted if t.startswith("- f")], counted
    home.journal.close(remove=True)
