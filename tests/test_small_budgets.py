"""From the smallest budget up, the page an answer is on stays in view: the offline shell answers from
the fact at every budget, a paging step never evicts the page being read, the page a model has just
paged in is in its next prompt, and a caller's context never overruns the budget it asked for (one too
small is refused, naming the smallest that works)."""

import shutil

import pytest

from conftest import DEMO, PEANUTS, answers, chat


SYNC = "the sync engine will use the Yjs CRDT"

QUESTIONS = ["Who is allergic to peanuts?", "What did we decide about the sync engine?"]

BUDGETS = [434, 500, 600, 800, 900, 1000, 1100, 1300, 1600]


def _answered_from_the_facts(replies: list[str], budget: int) -> None:
    assert len(replies) == 2, replies
    peanuts, sync = replies
    assert peanuts.startswith("From p5 ") and PEANUTS in peanuts, (budget, peanuts)
    assert "From p10 " in sync and SYNC in sync, (budget, sync)


@pytest.mark.parametrize("earlier", [False, True], ids=["fresh home", "after earlier chats"])
def test_the_shell_answers_from_the_fact_at_every_budget(maya, tmp_path, earlier):
    """Budgets from the smallest up, both questions each time, then 1000 again. At
    1000 the shell used to page in an echo page, the frames shrank with its tool messages, and both
    the answer page and the page it paged in were evicted: "I find nothing about that in memory"."""
    home = tmp_path / "h"
    shutil.copytree(maya, home)
    if earlier:   # earlier chats leave echo pages: the same question, a paraphrase, the shell's quotes
        chat(home, [*QUESTIONS, "Does anyone have a peanut allergy?", QUESTIONS[0]], "--budget", "4096")
    for budget in BUDGETS:
        _answered_from_the_facts(answers(chat(home, QUESTIONS, "--budget", str(budget))), budget)
    _answered_from_the_facts(answers(chat(home, QUESTIONS, "--budget", "1000")), 1000)


def test_a_paging_step_does_not_evict_the_page_the_answer_is_on(maya, tmp_path):
    """At 1000 the shell searches; what it reads must still be in view when it answers."""
    home = tmp_path / "h"
    shutil.copytree(maya, home)
    for budget in BUDGETS:
        chat(home, QUESTIONS, "--budget", str(budget))
    out = chat(home, QUESTIONS[:1], "--budget", "1000")
    assert "nothing about that" not in out and PEANUTS in answers(out)[0], out
    assert "evicted p5" not in out, out


def test_context_never_overruns_the_callers_budget(maya, tmp_path):
    """`m.context(q, budget=50)` clamped to 256 and returned 176 tokens: a budget too small is refused,
    naming the smallest that works; any other budget holds, by tiktoken's count."""
    import tiktoken

    from pager.config import Config
    from pager.errors import ToolError
    from pager.tools import Toolkit

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    enc = tiktoken.get_encoding("cl100k_base")
    with Toolkit(config=Config(home=home, session="maya", embedder="hash", tokenizer="cl100k_base")) as m:
        smallest = 2 * 128 + 48
        for budget in (1, 50, 100, 200, smallest - 1):
            with pytest.raises(ToolError, match=f"budget={smallest} or more"):
                m.context("Who is allergic to peanuts?", budget=budget)
            text = m.call("context", {"query": "Who is allergic to peanuts?", "budget": budget})
            assert f"budget={smallest} or more" in text
        for budget in (smallest, 350, 500, 1000, 4096):
            block = m.context("Who is allergic to peanuts?", budget=budget)
            assert len(enc.encode(block)) <= budget, budget
        assert PEANUTS in m.context("Who is allergic to peanuts?", budget=smallest)   # and it is useful


@pytest.mark.parametrize("budget", [1000, 1150, 1500])
def test_the_page_a_model_just_paged_in_is_in_its_next_prompt(tmp_path, budget):
    """A scripted model searches, then pages in p10: the search exchange gives way before the frames
    shrink below what the message uses (it used to evict both p5 and p10 at 1000)."""
    import json

    from pager.agent import Agent
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home
    from pager.model import HandlerModel
    from pager.offline import Script
    from pager.store import MemoryStore

    def call(name, arguments, id):
        return {"content": None, "tool_calls": [{"id": id, "type": "function",
                                                 "function": {"name": name, "arguments": json.dumps(arguments)}}]}

    home = Home(Config(home=tmp_path, budget=budget, embedder="hash"), store=MemoryStore(), embedder=HashEmbedder(),
                durable=False)
    s = home.open("a")
    s.append_many([json.loads(line) for line in DEMO.read_text().splitlines()])
    script = Script([call("search", {"query": QUESTIONS[0], "k": 3}, "c1"), call("page_in", {"page": "p10"}, "c2"),
                     {"content": "done"}])
    assert Agent(s, HandlerModel(script)).ask(QUESTIONS[0]).text == "done"
    assert "[p10 · " in script.seen[2][0]["content"], script.seen[2][0]["content"][:600]
    home.journal.close(remove=True)
