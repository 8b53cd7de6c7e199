"""What an outside tester still found after issue 13, each driven the way the tester did."""

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pager.cli.app import app

runner = CliRunner()
DEMO = Path(__file__).resolve().parents[1] / "pager" / "data" / "demo_conversation.jsonl"
ENV = {"PAGER_EMBEDDER": "hash"}
PEANUTS = "Sam Okafor is allergic to peanuts"

SYNC = "the sync engine will use the Yjs CRDT"
QUESTIONS = ["Who is allergic to peanuts?", "What did we decide about the sync engine?"]
BUDGETS = [434, 500, 600, 800, 900, 1000, 1100, 1300, 1600]


@pytest.fixture(scope="module")
def maya(tmp_path_factory):
    home = tmp_path_factory.mktemp("maya")
    result = runner.invoke(app, ["--home", str(home), "ingest", str(DEMO), "--session", "maya"], env=ENV)
    assert result.exit_code == 0, result.output
    return home


def chat(home, lines, *args, session="maya"):
    result = runner.invoke(app, ["--home", str(home), "chat", "--session", session, *args],
                           input="".join(line + "\n" for line in lines), env=ENV)
    assert result.exit_code == 0, result.output
    return result.output


def answers(output: str) -> list[str]:
    return [" ".join(part.split("you>")[0].split()) for part in output.split("pager>")[1:]]


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
