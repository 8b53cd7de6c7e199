"""The 22nd docs pass: every command, flag and figure of the README run as written. What disagreed,
each checked the way the pass found it; and the README's `pager …` lines held to the CLI's parser."""

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from conftest import ENV, answers, chat

runner = CliRunner()
README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def _conversation(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"speaker": "ann" if i % 2 else "bob", "text": f"note {i}: the crate holds "
                                        f"{i * 7} bolts and {i} washers for bay {i % 5}", "date": "8 May 2023"}) + "\n"
                            for i in range(n)))
    return path


def test_inspect_pages_limits_the_page_table_rows(tmp_path):
    """`pager inspect --pages N` ("page-table rows to show", default 40) showed every page: the count
    of the session's pages, printed in the heading, was kept in the option's own variable."""
    home = str(tmp_path / "h")
    assert runner.invoke(app, ["--home", home, "ingest", str(_conversation(tmp_path / "c.jsonl", 60)), "-s", "s"],
                         env=ENV).exit_code == 0
    pages = json.loads(runner.invoke(app, ["--home", home, "inspect", "-s", "s", "--json"], env=ENV).output)["pages"]
    assert pages > 3
    shown = runner.invoke(app, ["--home", home, "inspect", "-s", "s", "--pages", "2"], env=ENV)
    assert shown.exit_code == 0 and f"page table ({pages} pages, showing 2)" in shown.output, shown.output


def test_migrate_on_an_object_store_made_at_the_default_vector_size(tmp_path, s3):
    """The README's `pager --db s3://memory/team migrate` refused every store made by this release:
    asking whether a store was there at all opened it as 256-dim, and today's default is 128."""
    env, uri = s3
    env = {**env, "PAGER_EMBEDDER": "wordllama"}   # the default the README's commands run with
    home = str(tmp_path / "h")
    made = runner.invoke(app, ["--home", home, "--db", uri, "ingest", str(_conversation(tmp_path / "c.jsonl", 6)),
                               "-s", "planning"], env=env)
    assert made.exit_code == 0, made.output
    migrated = runner.invoke(app, ["--home", home, "--db", uri, "migrate"], env=env)
    assert migrated.exit_code == 0 and "is up to date" in migrated.output, migrated.output
    empty = runner.invoke(app, ["--home", home, "--db", uri + "-none", "migrate"], env=env)
    assert empty.exit_code != 0 and "no pager store" in empty.output, empty.output


@pytest.mark.parametrize("tools", [False, True], ids=["no tools of its own", "tools of its own"])
def test_tool_choice_is_auto_or_none_as_the_readme_says(tools):
    """The README: "`tool_choice` may be `auto` or `none`". Without tools of the client's own, any
    other value was taken silently; with them, the refusal said only 'auto' was supported."""
    from pager.proxy import RequestError, parse

    mine = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]
    body = {"model": "offline", "messages": [{"role": "user", "content": "hi"}], **({"tools": mine} if tools else {})}
    for choice in ("auto", "none"):
        parse({**body, "tool_choice": choice}, None, "default", 2048)
    for choice in ("required", {"type": "function", "function": {"name": "weather"}}):
        with pytest.raises(RequestError) as refused:
            parse({**body, "tool_choice": choice}, None, "default", 2048)
        assert refused.value.param == "tool_choice" and "'auto' or 'none'" in str(refused.value)


# -- the README's figures and transcripts, against the code ---------------------------------------------------
def test_the_readme_budget_floors_are_the_agents(tmp_path):
    """"the smallest that answers from memory is 434 … under ~1,400 the system prompt and tool schemas
    shrink": the full prompt and schemas need 1,635 tokens of budget since the state tools joined."""
    from pager.agent import fixed_regions, minimum_budget
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home
    from pager.store import MemoryStore
    from pager.tools import MODEL

    smallest = int(re.search(r"the smallest that answers from memory is (\d+)", README).group(1))
    shrink = int(re.search(r"under ~([\d,]+) the system prompt", README).group(1).replace(",", ""))
    home = Home(Config(home=tmp_path, embedder="hash"), store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    session = home.open("a")
    assert minimum_budget(session, MODEL) == smallest
    full = next(b for b in range(smallest, 8192) if fixed_regions(session, MODEL, b)[0] == "full")
    assert round(full, -2) == shrink, f"the full prompt and tool schemas need a budget of {full}"
    home.journal.close(remove=True)


def test_the_readme_state_transcript_is_what_a_fresh_chat_answers(tmp_path):
    """The Memory tiers transcript said Berlin was the state's change 3; a fresh chat numbers it 2."""
    block = re.search(r"```\n(you> My home city is Paris\..*?)```", README, re.S).group(1)
    said = re.findall(r"^you> (.*)$", block, re.M)
    day = re.compile(r"\d{1,2} [A-Z][a-z]{2} \d{4}")
    expected = [day.sub("DAY", " ".join(line.split())) for line in re.findall(r"^pager> (.*)$", block, re.M)]
    replies = [day.sub("DAY", reply) for reply in answers(chat(tmp_path, said, session="city"))]
    assert replies == expected


def _readme_invocations() -> list[str]:
    """Every `pager …` the README shows outside its Commands list: lines of its code blocks (a `# note`
    cut off) and inline code in its prose."""
    fenced, lines, prose = False, [], []
    for line in README.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and line.strip().removeprefix("$ ").startswith("pager "):
            lines.append(line.strip().removeprefix("$ ").split(" #")[0])
        elif not fenced:
            prose.append(line)
    lines += [" ".join(code.split()) for code in re.findall(r"`(pager [^`]*)`", "\n".join(prose))]
    return [line for line in lines if "[" not in line]   # the Commands list: test_first_hour holds it to the CLI


def _refusal(line: str, root) -> str | None:
    """What the CLI's parser would refuse in a README line: a command it lacks, or an option the
    command (or the root, before the command) does not take."""
    command, words, i = root, shlex.split(line)[1:], 0
    while i < len(words):
        word = words[i]
        if word.startswith("-") and word != "-":   # a lone "-" is standard input, an argument
            name = word.split("=")[0]
            option = next((p for p in command.params if name in (*p.opts, *p.secondary_opts)), None)
            if option is None:
                return f"`{command.name}` takes no option {name}"
            i += 1 if option.is_flag or "=" in word else 2
            continue
        if hasattr(command, "commands"):
            if word not in command.commands:
                return f"`{command.name}` has no command {word!r}"
            command = command.commands[word]
        i += 1
    return None


def test_every_pager_line_of_the_readme_parses_as_the_cli_has_it():
    from typer.main import get_command

    root = get_command(app)
    lines = _readme_invocations()
    assert len(lines) > 30 and "pager ingest - -s NAME" in lines
    refused = {line: why for line in lines if (why := _refusal(line, root))}
    assert not refused, refused
    assert _refusal("pager chat -x NAME", root) and _refusal("pager trace shows T", root)


def test_a_budget_too_small_for_chat_names_only_settings_chat_has(tmp_path):
    """`pager chat --budget 433` said "lower --page-tokens", an option chat does not take (ingest's
    page size for new sessions): it now says where that option is, beside PAGER_PAGE_TOKENS."""
    result = runner.invoke(app, ["--home", str(tmp_path), "chat", "-s", "x", "--budget", "433"], input="/quit\n", env=ENV)
    assert result.exit_code == 2, result.output
    assert "--page-tokens where the command has it (or PAGER_PAGE_TOKENS) to at most 127" in result.output
    assert runner.invoke(app, ["--home", str(tmp_path), "chat", "-s", "x", "--budget", "433"], input="/quit\n",
                         env={**ENV, "PAGER_PAGE_TOKENS": "127"}).exit_code == 0
