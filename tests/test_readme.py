"""The README as written: every `pager …` line in it parses as the CLI has it, and its figures (the
budget floors) and its transcripts (the working state) are what the code gives today."""

import re
import shlex
from pathlib import Path

from pager.cli.app import app

from conftest import answers, chat


README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


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
