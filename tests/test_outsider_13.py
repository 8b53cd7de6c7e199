"""What an outside tester still found after issue 13, each driven the way the tester did."""

import shutil

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from conftest import DEMO, ENV, answers, chat

runner = CliRunner()
PEANUTS = "Sam Okafor is allergic to peanuts"

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
    """The tester's loop: budgets from the smallest up, both questions each time, then 1000 again. At
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


def test_paraphrased_questions_and_quotes_never_outrank_the_answer(maya, tmp_path):
    """The tester's home after a few chats: the same question, a paraphrase, and the shell's quotes of
    p5 on pages of their own. `pager search` ranks p5 first for both queries; echoes are marked."""
    import json

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    for _ in range(3):
        chat(home, ["Who is allergic to peanuts?", "Who is allergic to peanuts?", "Does anyone have a peanut allergy?"],
             "--budget", "4096")
    for query in ("Who is allergic to peanuts?", "peanut allergy", "Does anyone have a peanut allergy?"):
        result = runner.invoke(app, ["--home", str(home), "search", query, "-s", "maya", "-k", "5", "--json"], env=ENV)
        found = json.loads(result.output)["results"]
        assert found[0]["page"] == "p5", (query, found)
        for hit in found[1:]:
            if "allerg" in hit["snippet"].lower() and "peanut" in hit["snippet"].lower():
                assert hit["signals"].get("echo"), (query, hit)   # a question or a quote of p5: an echo


def test_the_shells_own_replies_are_not_a_pages_bookmarks(maya, tmp_path):
    """Its canned note ("Noted — … PAGER_MODEL …") and its quotes of p5 (EpiPen, Sam Okafor) gave chat
    pages the keywords of the shell and of the page quoted."""
    from pager.config import Config
    from pager.home import Home

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    notes = [f"hello world number {i}, the harbour lights are on" for i in range(12)]
    chat(home, notes + ["Who is allergic to peanuts?"] * 8, "--budget", "4096")
    with Home(Config(home=home, embedder="hash", session="maya")) as h:
        s = h.open()
        chat_pages = [p for n, p in s.pages.items() if n > 70]
        assert chat_pages, sorted(s.pages)
        for page in chat_pages:
            words = {w.lower() for w in page.keywords}
            assert not words & {"llm", "pager_model", "noted", "configured", "offline", "answers"}, page.keywords
            assert not words & {"epipen", "sam okafor", "20 march 2025", "booking"}, page.keywords


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


def test_search_with_k_below_one_is_refused_in_words(maya, tmp_path):
    from pager.config import Config
    from pager.errors import ToolError
    from pager.tools import Toolkit

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    with Toolkit(config=Config(home=home, session="maya", embedder="hash")) as m:
        for k in (0, -1):
            with pytest.raises(ToolError, match="k of 1 or more"):
                m.search("peanut allergy", k=k)
        assert "p5" in m.search("peanut allergy", k=1)


def test_replay_all_stars_the_policy_in_force_when_recorded(maya, tmp_path):
    """A chat that switched with `/policy lru` before its questions is reproduced by the lru row; the
    star used to sit on clock, the policy the session started with."""
    from pager import replay as rp

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    chat(home, ["/policy bogus", "/pin p9999", "/policy lru", *QUESTIONS, "What about Lisbon?"], "--budget", "2048")
    trace = next((home / "traces").glob("maya-chat-*.jsonl"))
    result = runner.invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--policy", "all"], env=ENV)
    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line for line in result.output.splitlines() if line.startswith("│ ")
            and line.split()[1].rstrip("*") in ("clock", "lru", "lfu", "scored")}
    assert "lru*" in rows and "clock*" not in rows, result.output
    assert "switched clock → lru" in " ".join(result.output.split()), result.output
    lru = rp.replay(trace, policy="lru")
    assert lru.changed_contexts == 0   # the starred row is the one that reproduces the recording


def test_bare_policy_and_pin_commands_say_what_to_give(tmp_path):
    out = " ".join(chat(tmp_path, ["/policy", "/pin", "/unpin", "/policy lru", "/policy"], session="s").split())
    assert "policy clock; /policy NAME switches to one of clock, lru, lfu, scored" in out, out
    assert "usage: /pin PAGE" in out and "usage: /unpin PAGE" in out and "unknown policy ''" not in out
    assert "policy lru; /policy NAME" in out
    assert "page '' does not exist" not in out
    trace = next((tmp_path / "traces").glob("s-*.jsonl"))
    assert runner.invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--check"]).exit_code == 0


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
