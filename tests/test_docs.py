"""The README and the reference pages under docs/ as written: every `pager …` line in them parses as the
CLI has it, every link between them lands on a file and a heading, every setting is on the settings
page, and their figures (the budget floors), transcripts (the working state) and examples (the input
format, the Python library) are what the code gives today."""

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pager.cli.app import app

from conftest import answers, chat

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = sorted((ROOT / "docs").glob("*.md"))
DOCS = {path.name: path.read_text() for path in PAGES}


def test_the_readme_budget_floors_are_the_agents(tmp_path):
    """"the smallest that answers from memory is 434 … under ~1,400 the system prompt and tool schemas
    shrink": the full prompt and schemas need 1,635 tokens of budget since the state tools joined. The
    floors are in docs/cli.md, beside `pager chat --budget`."""
    from pager.agent import fixed_regions, minimum_budget
    from pager.config import Config
    from pager.embed import HashEmbedder
    from pager.home import Home
    from pager.store import MemoryStore
    from pager.tools import MODEL

    page = DOCS["cli.md"]
    smallest = int(re.search(r"the smallest that answers from memory is (\d+)", page).group(1))
    shrink = int(re.search(r"under ~([\d,]+) the system prompt", page).group(1).replace(",", ""))
    home = Home(Config(home=tmp_path, embedder="hash"), store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    session = home.open("a")
    assert minimum_budget(session, MODEL) == smallest
    full = next(b for b in range(smallest, 8192) if fixed_regions(session, MODEL, b)[0] == "full")
    assert round(full, -2) == shrink, f"the full prompt and tool schemas need a budget of {full}"
    home.journal.close(remove=True)


def test_the_readme_state_transcript_is_what_a_fresh_chat_answers(tmp_path):
    """The REPL section's transcript said Berlin was the state's change 3; a fresh chat numbers it 2."""
    block = re.search(r"```\n(you> My home city is Paris\..*?)```", README, re.S).group(1)
    said = re.findall(r"^you> (.*)$", block, re.M)
    day = re.compile(r"\d{1,2} [A-Z][a-z]{2} \d{4}")
    expected = [day.sub("DAY", " ".join(line.split())) for line in re.findall(r"^pager> (.*)$", block, re.M)]
    replies = [day.sub("DAY", reply) for reply in answers(chat(tmp_path, said, session="city"))]
    assert replies == expected


def _invocations(text: str) -> list[str]:
    """Every `pager …` a document shows outside the command list: lines of its code blocks (a `# note`
    cut off) and inline code in its prose."""
    fenced, lines, prose = False, [], []
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and line.strip().removeprefix("$ ").startswith("pager "):
            lines.append(line.strip().removeprefix("$ ").split(" #")[0])
        elif not fenced:
            prose.append(line)
    lines += [" ".join(code.split()) for code in re.findall(r"`(pager [^`]*)`", "\n".join(prose))]
    return [line for line in lines if "[" not in line]   # the command list: test_first_hour holds it to the CLI


def _refusal(line: str, root) -> str | None:
    """What the CLI's parser would refuse in a document's line: a command it lacks, or an option the
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


def test_every_pager_line_of_the_readme_and_the_docs_parses_as_the_cli_has_it():
    from typer.main import get_command

    root = get_command(app)
    lines = {"README.md": _invocations(README)} | {f"docs/{name}": _invocations(text) for name, text in DOCS.items()}
    every = [line for found in lines.values() for line in found]
    assert len(lines["README.md"]) > 10 and len(every) > 60 and "pager ingest - -s NAME" in every
    for page in ("cli.md", "chat.md", "serve.md", "storage.md", "traces.md", "input-format.md"):
        assert lines[f"docs/{page}"], f"docs/{page} shows no pager command"
    refused = {(doc, line): why for doc, found in lines.items() for line in found if (why := _refusal(line, root))}
    assert not refused, refused
    assert _refusal("pager chat -x NAME", root) and _refusal("pager trace show T", root) is None
    assert _refusal("pager trace shows T", root)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> set[str]:
    fenced, found = False, set()
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#+ (.*)", line)):
            found.add(_anchor(m.group(1)))
    return found


def test_every_link_of_the_readme_and_the_docs_lands_on_a_file_and_a_heading():
    """The README's detail moved to docs/; a link to a page or a section that moved again must fail here,
    not for a reader. Links into BENCHMARKS.md and RELIABILITY.md name the file only: their headings change."""
    broken = []
    for source in [ROOT / "README.md", *PAGES]:
        text = source.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, anchor = target.partition("#")
            file = (source.parent / path).resolve() if path else source
            if not file.exists():
                broken.append(f"{source.name}: {target} (no file)")
            elif anchor and file.name in ("BENCHMARKS.md", "RELIABILITY.md"):
                broken.append(f"{source.name}: {target} (link the file, not a heading that may be renamed)")
            elif anchor and file.suffix == ".md" and anchor not in _anchors(file.read_text()):
                broken.append(f"{source.name}: {target} (no such heading)")
    assert not broken, broken
    for page in PAGES:
        assert f"(docs/{page.name})" in README, f"the README's reference pages do not list docs/{page.name}"


def test_the_settings_page_names_every_variable_and_every_config_field():
    from pager.config import AWS_ENV, ENV, OPENAI_BASE_ENV, Config

    named = set(re.findall(r"`([A-Za-z_0-9]+)`", DOCS["settings.md"]))
    missing = [v for v in (*ENV, *AWS_ENV, *OPENAI_BASE_ENV) if v not in named]
    missing += [f.name for f in dataclasses.fields(Config) if f.name not in named]
    assert not missing, f"docs/settings.md does not name {missing}"
    rows = re.findall(r"^\| `(PAGER_[A-Z_0-9]+)` \| `([a-z_0-9]+)` \|", DOCS["settings.md"], re.M)
    assert dict(rows) == ENV, "each PAGER_* row names the Config field pager/config.py reads it into"


def test_the_input_format_example_imports_and_exports_as_the_page_says(tmp_path):
    """docs/input-format.md's first example, as a file, through its own two commands: three turns in,
    the same three out with a key each, and importing again adds nothing."""
    page = DOCS["input-format.md"]
    blocks = re.findall(r"```\n(.*?)```", page, re.S)
    example, commands = blocks[0], blocks[1].splitlines()
    assert commands == ["pager ingest notes.jsonl --session planning",
                        "pager export --session planning --out planning.jsonl"]
    (tmp_path / "notes.jsonl").write_text(example)
    runner, env = CliRunner(), {"PAGER_EMBEDDER": "hash"}
    home = ["--home", str(tmp_path / "h")]
    for line in commands:
        words = [w if not w.endswith(".jsonl") else str(tmp_path / w) for w in shlex.split(line)[1:]]
        result = runner.invoke(app, home + words, env=env)
        assert result.exit_code == 0, result.output
    given = [json.loads(line) for line in example.splitlines()]
    out = [json.loads(line) for line in (tmp_path / "planning.jsonl").read_text().splitlines()]
    assert [o["text"] for o in out] == [g.get("text", g.get("content")) for g in given]
    assert all(o["key"] for o in out) and out[0]["date"] == "8 May 2023" and out[2]["role"] == "assistant"
    again = runner.invoke(app, home + ["ingest", str(tmp_path / "notes.jsonl"), "--session", "planning"], env=env)
    assert again.exit_code == 0 and "0 new turns" in again.output, again.output


@pytest.mark.parametrize("index", [0, 1])
def test_the_python_page_examples_run(tmp_path, index):
    """docs/python.md's examples, each run as written but for its home, which is made under tmp_path."""
    from pager.llm import litellm

    blocks = re.findall(r"```python\n(.*?)```", DOCS["python.md"], re.S)
    assert len(blocks) == 2
    code = re.sub(r'home="[^"]*"', f'home="{tmp_path / "h"}", embedder="hash"', blocks[index])
    litellm()
    scope: dict = {}
    exec(compile(code, "docs/python.md", "exec"), scope)   # noqa: S102 - our own docs, run as a user would
    assert "home" in scope
