"""A newcomer's first hour (issue 13): each command driven the way the user drove it."""

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pager.cli.app import app

from conftest import DEMO, ENV, PEANUTS, answers, chat
import shutil

runner = CliRunner()


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
    import asyncio

    from mcp import Client

    from pager.tools import Toolkit
    from pager.tools.mcp_server import build

    async def over_mcp(memory):
        async with Client(build(memory)) as client:
            return (await client.call_tool("search", {"query": "peanut allergy", "k": 3})).content[0].text

    with Toolkit(config=_config(home)) as memory:
        result = asyncio.run(over_mcp(memory))
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


def test_paraphrased_questions_and_quotes_never_outrank_the_answer(maya, tmp_path):
    """A home after a few chats: the same question, a paraphrase, and the shell's quotes of
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
    assert stated < 500   # it was ~1,280 before the fixed regions scaled with the budget
    out = chat(tmp_path, ["The boat is called Saltire.", "What is the boat called?"], "--budget", str(stated),
               session="m")
    assert "Saltire" in answers(out)[-1] and "exceeds" not in out
    below = runner.invoke(app, ["--home", str(tmp_path), "chat", "-s", "m", "--budget", str(stated - 1)],
                          input="hi\n", env=ENV)
    assert below.exit_code != 0 and f"at least {stated}" in below.output


def test_the_stated_minimum_budget_answers_from_memory(maya, tmp_path):
    """Not only from the open tail: at the stated minimum a page far back is paged in and quoted."""
    import shutil

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    too_small = runner.invoke(app, ["--home", str(home), "chat", "-s", "maya", "--budget", "10"], input="hi\n", env=ENV)
    stated = int(too_small.output.rsplit("at least ", 1)[1].split()[0])
    for _ in range(2):   # and again, with the first asking now in the tail
        reply = answers(chat(home, ["Who is allergic to peanuts?"], "--budget", str(stated)))[0]
        assert reply.startswith("From p5 ") and PEANUTS in reply, (stated, reply)


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
    floor = 2 * page_tokens + 178   # the open tail and one page of memory to answer from
    assert minimum_budget(home.open("a")) == floor == config.with_(budget=floor).budget
    home.journal.close(remove=True)


@pytest.mark.parametrize("budget", [434, 700, 1000, 1300, 1600])
def test_every_budget_from_the_minimum_up_answers_with_tools_when_they_fit(tmp_path, budget):
    out = chat(tmp_path, ["The boat is called Saltire.", "What is the boat called?"], "--budget", str(budget),
               session="m")
    assert "Saltire" in answers(out)[-1], out
    assert ("search(" in out) == (budget >= 1000), out


# -- tracebacks -------------------------------------------------------------------------------------------
def test_an_unknown_embedder_is_one_line(tmp_path):
    for name in ("bogus", "text-embedding-3-small"):
        env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
        result = runner.invoke(app, ["--home", str(tmp_path), "search", "hi"], env={**env, "PAGER_EMBEDDER": name})
        assert result.exit_code != 0 and "Traceback" not in result.output
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and "wordllama" in lines[0], result.output
        assert name != "text-embedding-3-small" or "OPENAI_API_KEY" in lines[0]


def test_chat_takes_rich_markup_and_invalid_utf8_as_text(tmp_path):
    import subprocess
    import sys

    env = {**os.environ, **ENV, "PAGER_HOME": str(tmp_path)}
    script = "The closing tag [/] ends [bold]bold[/bold].\ncaf\xe9 is open late\nWhat ends bold?\n/search [/]\n/bookmarks\n"
    out = subprocess.run([sys.executable, "-m", "pager.cli", "chat", "-s", "[bold]"], input=script.encode("latin-1"),
                         capture_output=True, timeout=120, env=env)
    text = out.stdout.decode()
    assert out.returncode == 0 and "Traceback" not in out.stderr.decode(), out.stderr.decode()
    assert "you> caf\ufffd is open late" in text
    quoted = answers(text)[-1]      # the shell quotes a stored turn that holds markup, verbatim
    assert "The closing tag [/] ends [bold]bold[/bold]." in quoted, text
    trace = next((tmp_path / "traces").glob("*.jsonl"))
    assert runner.invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--check"], env=ENV).exit_code == 0
    summary = runner.invoke(app, ["--home", str(tmp_path / "r"), "trace", "show", str(trace)], env=ENV)
    assert summary.exit_code == 0 and "'[bold]'" in summary.output   # the session's name as it is, not as markup
    for args in (["--step", "1"], ["--html", str(tmp_path / "t.html")]):
        shown = runner.invoke(app, ["--home", str(tmp_path / "r"), "trace", "show", str(trace), *args], env=ENV)
        assert shown.exit_code == 0, shown.output
    inspected = runner.invoke(app, ["--home", str(tmp_path), "inspect", "-s", "[bold]"], env=ENV)
    assert inspected.exit_code == 0 and "session '[bold]'" in inspected.output


@pytest.fixture
def memory(tmp_path):
    from pager.config import Config
    from pager.tools import Toolkit

    with Toolkit(config=Config(home=tmp_path, embedder="hash", session="t")) as kit:
        yield kit


def test_toolkit_call_never_raises_for_what_a_model_can_send(memory):
    deep = []
    inner = deep
    for _ in range(5000):
        inner.append([])
        inner = inner[0]
    calls = [("remember", {"text": "caf\udce9"}), ("remember", '{"text": "caf\udce9"}'), ("search", {"query": deep}),
             ("search", '{"query": ' + "[" * 5000 + "]" * 5000 + "}"), ("page_in", {"page": "p²"}),
             ("page_in", '{"page": "p\u0663"}'), ("remember\udce9", {}), ("search", {"query": {1, 2}}),
             ("search", {"query": "peanuts", "k": "²"})]
    for name, arguments in calls:
        text, ok = memory.run(name, arguments)
        assert not ok and "Error" not in text and "invalid literal" not in text, (name, text)
    assert "lone surrogate" in memory.call("remember", {"text": "caf\udce9"})
    assert "nested too deeply" in memory.call("search", {"query": deep})
    assert "no page is called or bookmarked 'p²'" in memory.call("page_in", {"page": "p²"})
    assert memory.call("remember", {"text": "still working"}).startswith("remembered")


def test_a_full_disk_under_the_trace_is_reported_not_raised(memory):
    import errno

    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    memory._writer._fh.write = full
    text = memory.call("remember", {"text": "The boat is called Saltire."})
    assert text.startswith("remembered") and "No space left on device" in text
    assert "Saltire" in memory.call("search", {"query": "boat"})   # memory goes on; the trace has stopped
    assert "No space" not in memory.call("search", {"query": "boat"})   # said once


def test_mcp_answers_every_request_and_refuses_unknown_arguments(tmp_path):
    import subprocess
    import sys

    calls = [{"name": "remember", "arguments": {"text": "hi", "extra": 1}}, '{"name":"remember","arguments":{"text":"caf\\udce9"}}',
             '{"name":"search","arguments":{"query":' + "[" * 5000 + "]" * 5000 + "}}",
             {"name": "page_in", "arguments": {"page": "p²"}}, {"name": "search", "arguments": {"query": "hi"}}]
    lines = [json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}),
        json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"})]
    for i, call in enumerate(calls, 2):
        params = call if isinstance(call, str) else json.dumps(call)
        lines.append('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":%s}' % (i, params))
    env = {**os.environ, **ENV, "PAGER_HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "pager.cli", "mcp", "-s", "m"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    replies = {}
    for line in lines:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
        if '"id"' in line:   # a request: its reply comes before the next one is sent
            reply = json.loads(proc.stdout.readline() or "{}")
            replies[reply.get("id")] = reply
    proc.stdin.close()
    proc.wait(timeout=60)
    assert sorted(replies, key=str) == [1, 2, 3, 4, 5, 6], proc.stderr.read()
    texts = {i: replies[i]["result"]["content"][0]["text"] for i in range(2, 7)}
    assert replies[2]["result"]["isError"] and "unknown argument(s) extra" in texts[2]
    assert replies[3]["result"]["isError"] and "lone surrogate" in texts[3]
    assert replies[4]["result"]["isError"] and "nested too deeply" in texts[4]
    assert replies[5]["result"]["isError"] and "ValueError" not in texts[5]
    assert not replies[6]["result"]["isError"]


# -- silence ----------------------------------------------------------------------------------------------
def test_a_session_that_does_not_exist_is_named_and_sessions_lists_them(maya, tmp_path):
    for command in (["search", "peanuts", "-s", "mayaa"], ["inspect", "-s", "mayaa"], ["inspect", "-s", "mayaa", "--json"],
                    ["export", "-s", "mayaa"], ["check", "-s", "mayaa"]):
        result = runner.invoke(app, ["--home", str(maya), *command], env=ENV)
        assert result.exit_code == 1, result.output
        assert result.output.strip().splitlines() == [result.output.strip()]
        assert "no session 'mayaa'" in result.output and "it holds 'maya': add --session maya" in result.output
    listed = json.loads(runner.invoke(app, ["--home", str(maya), "sessions", "--json"], env=ENV).output)
    assert {(r["user"], r["session"], r["turns"], r["pages"]) for r in listed["sessions"]} >= {("", "maya", 390, 70)}   # 69 sealed and the open tail page
    table = runner.invoke(app, ["--home", str(maya), "sessions"], env=ENV)
    assert table.exit_code == 0 and "maya" in table.output and "390" in table.output
    for query, k, said in (("", "3", "give words to search for"), ("peanuts", "0", "ask for 1 page or more")):
        result = runner.invoke(app, ["--home", str(maya), "search", query, "-s", "maya", "-k", k], env=ENV)
        assert result.exit_code == 2 and said in result.output
    empty = runner.invoke(app, ["--home", str(tmp_path / "none"), "sessions"], env=ENV)
    assert empty.exit_code == 0 and "no sessions" in empty.output


def test_sessions_lists_a_chat_that_just_ended(tmp_path):
    chat(tmp_path, ["The boat is called Saltire."], session="boat")
    listed = json.loads(runner.invoke(app, ["--home", str(tmp_path), "sessions", "--json"], env=ENV).output)
    assert [(r["session"], r["turns"]) for r in listed["sessions"]] == [("boat", 2)]


def test_the_demo_says_where_its_data_went_and_the_next_command_finds_it(tmp_path):
    kept = tmp_path / "demo"
    out = runner.invoke(app, ["demo", "--keep", str(kept)]).output
    closing = out[out.index("Wall time"):]
    assert f"pager --home {kept} chat --session demo" in closing
    # the next command as the demo prints it: the default embedder, the one the demo's store was made with
    answer = runner.invoke(app, ["--home", str(kept), "chat", "--session", "demo", "--budget", "4096"],
                           input="How much money did we have for the Lisbon offsite?\n").output
    assert "18,400" in answers(answer)[-1]
    again = runner.invoke(app, ["demo", "--keep", str(kept)])
    assert again.exit_code != 0 and "already holds the demo" in again.output
    temporary = runner.invoke(app, ["demo"]).output
    assert "temporary folder" in temporary and "pager demo --keep DIR" in temporary


def test_a_chat_that_cannot_start_leaves_no_trace(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    result = runner.invoke(app, ["--home", str(tmp_path), "chat", "--model", "gpt-4o-mini"], input="hi\n",
                           env={**env, **ENV})
    assert result.exit_code != 0 and "OPENAI_API_KEY" in result.output
    assert not list(tmp_path.glob("traces/*.jsonl"))


# -- slow starts ------------------------------------------------------------------------------------------
def test_the_offline_chat_and_the_mcp_server_never_import_litellm(tmp_path):
    import subprocess
    import sys

    code = """
import asyncio, io, sys
from rich.console import Console
from pager.config import Config
from pager.cli.chat import run
home = sys.argv[1]
out = io.StringIO()
run(Config(home=home, embedder="hash", session="x"), stream=io.StringIO("The boat is Saltire.\\nWhat is the boat called?\\n"),
    console=Console(file=out), interactive=False)
assert "Saltire" in out.getvalue().split("What is the boat called?")[-1], out.getvalue()
print("chat", "litellm" in sys.modules)
from mcp import Client
from pager.tools import Toolkit
from pager.tools.mcp_server import build
kit = Toolkit(config=Config(home=home, embedder="hash", session="m"))
async def main():
    async with Client(build(kit)) as client:
        await client.call_tool("remember", {"text": "hello"})
        return (await client.call_tool("search", {"query": "hello"})).content[0].text
assert "hello" in asyncio.run(main())
kit.close()
print("mcp", "litellm" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["chat", "False", "mcp", "False"], out.stderr


def test_one_number_for_evictions_in_stats_trace_show_and_the_timeline(maya, tmp_path):
    import re
    import shutil

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    out = chat(home, ["Who is allergic to peanuts?", "What did we decide about the sync engine?",
                      "How much money did we have for the Lisbon offsite?", "/stats"], "--budget", "2048")
    stats = re.search(r"this chat: faults (\d+) · evictions (\d+) · hits (\d+)", out)
    assert stats and int(stats.group(2)) > 0, out
    trace = next((home / "traces").glob("maya-*.jsonl"))
    shown = runner.invoke(app, ["--home", str(tmp_path / "r"), "trace", "show", str(trace)], env=ENV).output
    paging = re.search(r"(\d+) faults · (\d+) hits · (\d+) evictions", shown)
    assert (paging.group(1), paging.group(3), paging.group(2)) == stats.groups(), (shown, out)
    page = tmp_path / "t.html"
    runner.invoke(app, ["--home", str(tmp_path / "r"), "trace", "show", str(trace), "--html", str(page)], env=ENV)
    timeline = re.search(r"(\d+) faults · (\d+) evictions", page.read_text())
    assert timeline.groups() == (stats.group(1), stats.group(2))


# -- docs that match the code ---------------------------------------------------------------------------
def test_the_cli_reference_lists_every_command_and_option_as_the_cli_has_them():
    import re

    from pager.cli.synopsis import synopsis

    root = Path(__file__).resolve().parents[1]
    page = (root / "docs" / "cli.md").read_text()
    block = re.search(r"^# Commands\n.*?```\n(.*?)```", page, re.S).group(1)
    assert block.strip() == synopsis().strip(), "run `python -m pager.cli.synopsis` and paste it into docs/cli.md"
    helped = runner.invoke(app, ["--help"]).output
    for name in re.findall(r"^pager ([a-z]+)", block, re.M):
        assert name in helped
    assert "(docs/cli.md)" in (root / "README.md").read_text(), "the README links the command list"


def test_the_readme_layout_names_every_module():
    import re

    root = Path(__file__).resolve().parents[1]
    layout = re.search(r"## Layout\n\n.*?```\n(.*?)```", (root / "README.md").read_text(), re.S).group(1)
    named = set(re.findall(r"[a-z_]+", layout))
    modules = {p.stem for p in (root / "pager").glob("*.py")} - {"__init__"}
    assert modules <= named, f"README's Layout does not name {sorted(modules - named)}"


def test_the_chat_page_transcript_is_what_a_fresh_run_prints(tmp_path):
    """The chat of docs/chat.md, replayed from its own `you>` lines on a fresh home: same answers, same counters."""
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "chat.md").read_text()
    transcript = re.search(r"```\n\$ pager chat --session maya --budget 4096\n(.*?)```", page, re.S).group(1)
    said = re.findall(r"^you> (.*)$", transcript, re.M)
    env = {"PAGER_EMBEDDER": "wordllama"}   # the default the page's chat ran with
    assert runner.invoke(app, ["--home", str(tmp_path), "ingest", str(DEMO), "--session", "maya"], env=env).exit_code == 0
    result = runner.invoke(app, ["--home", str(tmp_path), "chat", "--session", "maya", "--budget", "4096"],
                           input="".join(line + "\n" for line in said), env=env)
    flat = " ".join(result.output.split())
    stats = re.search(r"this chat: faults \d+ · evictions \d+ · hits \d+", " ".join(transcript.split())).group(0)
    assert stats in flat, (stats, flat[-400:])
    quoted = re.findall(r"^pager> (From p\d+)", transcript, re.M)   # page ids, not dates: a chat's own page is dated today
    assert len(quoted) == 4 and re.findall(r"pager> (From p\d+)", flat) == quoted


@pytest.mark.parametrize("trace", ["traces/clock_vs_lru.jsonl", "pager/data/demo_trace.jsonl",
                                   "traces/pinned_fact_survives.jsonl"])
def test_benchmarks_policy_rows_of_the_bundled_traces_match_a_replay(trace):

    from pager import replay as rp

    root = Path(__file__).resolve().parents[1]
    row = next(line for line in (root / "BENCHMARKS.md").read_text().splitlines() if line.startswith(f"| `{trace}`"))
    cells = [c.strip().strip("*") for c in row.strip("|").split("|")][1:]
    runs = [rp.replay(root / trace, policy=p) for p in ("clock", "lru", "lfu", "scored")]
    opt = runs[0].opt()
    measured = [str(len(runs[0].digests)), *(str(r.faults) for r in runs), str(opt), f"{runs[0].faults / opt:.3f}"]
    assert cells == measured, f"BENCHMARKS says {cells}, a replay gives {measured}"


def test_chat_goes_on_when_its_trace_cannot_be_written(tmp_path, monkeypatch):
    import errno

    from pager.trace import TraceWriter

    real = TraceWriter._write

    def full_after_start(self, obj):
        if obj.get("kind") == "user":
            self._fh.write = lambda *_: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
        real(self, obj)

    monkeypatch.setattr(TraceWriter, "_write", full_after_start)
    out = chat(tmp_path, ["The boat is called Saltire.", "What is the boat called?"], session="full")
    assert out.count("the trace stopped: No space left on device") == 1
    assert "Saltire" in answers(out)[-1]


def test_a_window_overflow_shrinks_the_fixed_regions_too(mem_home):
    from conftest import say
    from pager.agent import Agent
    from pager.llm import ContextOverflow
    from pager.model import HandlerModel
    from pager.offline import Script

    s = mem_home.open("a")
    say(s, 100)
    script = Script([ContextOverflow("too long")] * 3 + [{"content": "fits now"}])
    agent = Agent(s, HandlerModel(script, name="pager/script"))
    assert agent.tier == "full"
    reply = agent.ask("summarise")
    assert reply.text == "fits now" and not reply.error, reply
    assert agent.tier == "bare" and len(script.seen[-1][0]["content"]) < len(script.seen[0][0]["content"])
