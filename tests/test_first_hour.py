"""A newcomer's first hour (issue 13): each command driven the way the user drove it."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pager.cli.app import app

runner = CliRunner()
DEMO = Path(__file__).resolve().parents[1] / "pager" / "data" / "demo_conversation.jsonl"
ENV = {"PAGER_EMBEDDER": "hash"}
PEANUTS = "Sam Okafor is allergic to peanuts"


@pytest.fixture(scope="module")
def maya(tmp_path_factory):
    """A home with the demo conversation ingested as session 'maya' (the README's chat)."""
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


# -- echoes ----------------------------------------------------------------------------------------------
def test_asking_twice_quotes_the_fact_not_the_question(maya, tmp_path):
    home = tmp_path / "h"
    import shutil

    shutil.copytree(maya, home)
    replies = answers(chat(home, ["Who is allergic to peanuts?"] * 3, "--budget", "4096"))
    replies += answers(chat(home, ["Who is allergic to peanuts?"] * 2, "--budget", "4096"))  # a later run
    assert len(replies) == 5
    for reply in replies:
        assert reply.startswith("From p5 "), reply
        assert PEANUTS in reply
        assert "Who is allergic" not in reply and "From p5" not in reply[8:]  # no question, no quote of a quote
    # search (the CLI's and the tool's) puts the page with the fact first, not the echoes
    found = json.loads(runner.invoke(app, ["--home", str(home), "search", "peanut allergy", "-s", "maya", "-k", "100",
                                           "--json"], env=ENV).output)["results"]
    assert found[0]["page"] == "p5", found
    echoes = [r for r in found if "Who is allergic" in r["snippet"] or "From p5" in r["snippet"]]
    assert len(echoes) >= 2 and all(r["signals"].get("echo") for r in echoes)   # still findable, and marked
    from pager.tools import Toolkit

    with Toolkit(session="maya", config=_config(home)) as memory:
        result = memory.call("search", {"query": "peanut allergy", "k": 3})
    assert result.splitlines()[1].startswith("- p5 "), result


def test_automatic_paging_brings_the_fact_not_the_echo(maya, tmp_path):
    from pager.config import Config
    from pager.home import Home

    import shutil

    shutil.copytree(maya, tmp_path / "h")
    chat(tmp_path / "h", ["Who is allergic to peanuts?"] * 2, "--budget", "4096")
    with Home(Config(home=tmp_path / "h", embedder="hash", session="maya")) as home:
        s = home.open()
        hits = s.autopage("Who is allergic to peanuts?")
        assert hits[0].id == "p5", [(h.id, h.signals) for h in hits[:3]]


def test_the_shell_never_quotes_its_own_reply_or_an_earlier_question():
    from pager.offline import OfflineShell

    system = ("[p5 · 20 March 2025]\nMaya: Sam Okafor is allergic to peanuts, severe.\n"
              "[p71 · 1 Dec 2026]\nuser: Who is allergic to peanuts?\n"
              "assistant: From p5 (20 March 2025): “Maya: Sam Okafor is allergic to peanuts, severe.”\n")
    reply = OfflineShell().answer("who is allergic to peanuts?", system, ["p71", "p5"])
    assert reply == "From p5 (20 March 2025): “Maya: Sam Okafor is allergic to peanuts, severe.”"


def _config(home):
    from pager.config import Config

    return Config(home=home, embedder="hash", session="maya")


# -- replay of what chat wrote ----------------------------------------------------------------------------
def test_replay_check_passes_on_a_chat_with_mistyped_commands(tmp_path):
    out = chat(tmp_path, ["The boat is called Saltire.", "/policy bogus", "/pin p9999", "/pin", "/unpin x",
                          "/search", "/policy lru", "What is the boat called?"], session="boat")
    assert "unknown policy 'bogus'" in out and "Saltire" in out.split("What is the boat called?")[-1]
    trace = next((tmp_path / "traces").glob("boat-*.jsonl"))
    result = runner.invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--check"], env=ENV)
    assert result.exit_code == 0, result.output


# -- the minimum budget -----------------------------------------------------------------------------------
def test_the_stated_minimum_budget_answers(tmp_path):
    too_small = runner.invoke(app, ["--home", str(tmp_path), "chat", "-s", "m", "--budget", "10"], input="hi\n", env=ENV)
    assert too_small.exit_code != 0 and "Traceback" not in too_small.output
    stated = int(too_small.output.rsplit("at least ", 1)[1].split()[0])
    assert stated < 400   # it was ~1,280 before the fixed regions scaled with the budget
    out = chat(tmp_path, ["The boat is called Saltire.", "What is the boat called?"], "--budget", str(stated),
               session="m")
    assert "Saltire" in answers(out)[-1] and "exceeds" not in out
    below = runner.invoke(app, ["--home", str(tmp_path), "chat", "-s", "m", "--budget", str(stated - 1)],
                          input="hi\n", env=ENV)
    assert below.exit_code != 0 and f"at least {stated}" in below.output


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
@pytest.mark.parametrize("page_tokens", [64, 128, 256])
def test_the_config_floor_is_what_the_agent_needs(tmp_path, encoding, page_tokens):
    from pager.agent import minimum_budget
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home
    from pager.store import MemoryStore

    config = Config(home=tmp_path, page_tokens=page_tokens, embedder="hash", tokenizer=encoding)
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    assert minimum_budget(home.open("a")) == page_tokens + 178 == config.with_(budget=page_tokens + 178).budget
    home.journal.close(remove=True)


@pytest.mark.parametrize("budget", [400, 700, 1000, 1300, 1600])
def test_every_budget_from_the_minimum_up_answers_with_tools_when_they_fit(tmp_path, budget):
    out = chat(tmp_path, ["The boat is called Saltire.", "What is the boat called?"], "--budget", str(budget),
               session="m")
    assert "Saltire" in answers(out)[-1], out
    assert ("search(" in out) == (budget >= 1000), out
