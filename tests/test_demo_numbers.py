"""`pager demo` states each of its numbers once and counts it the same way wherever it prints it again.

The demo runs as a new user runs it (`pager demo`, offline, a fresh PAGER_HOME); its output is read
back and every printing of a number compared: the frames of the budget (the intro, the frame strips,
the report, the replay's note), the conversation's turns and the session's, the pages sealed, and the
faults, hits and evictions of each section against the report's and the replay table's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

CELL = re.compile(r"p\d+|·")


def demo(home, *options: str) -> str:
    env = {**os.environ, "PAGER_HOME": str(home), "COLUMNS": "400", "NO_COLOR": "1"}
    done = subprocess.run([sys.executable, "-m", "pager.cli", "demo", *options], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def output(tmp_path_factory) -> str:
    return demo(tmp_path_factory.mktemp("home"))


def one(pattern: str, text: str) -> tuple[int, ...]:
    """The whole numbers of the one place the pattern matches (a printing the demo must have)."""
    found = re.findall(pattern, text)
    assert len(found) == 1, f"expected one match of {pattern!r}, found {len(found)}"
    return tuple(int(n) for n in (found[0] if isinstance(found[0], tuple) else (found[0],)))


def section(text: str, number: int) -> str:
    """The demo's numbered section, from its heading to the next one."""
    start = re.search(rf"^{number}\. ", text, re.M)
    assert start, f"no section {number}"
    end = re.search(rf"^{number + 1}\. ", text[start.end():], re.M)
    return text[start.start(): start.end() + end.start() if end else len(text)]


def test_frames_are_the_budgets_everywhere(output):
    budget, reserve, frames, tokens = one(r"Budget (\d+) tokens, less (\d+) for the memory map → (\d+) frames of "
                                          r"(\d+) tokens", output)
    assert frames == (budget - reserve) // tokens
    strips = re.findall(r"^\s+week\s+\d+: \d+ pages? sealed, \d+ evicted\n {5}(.*)$", output, re.M)
    asked = re.findall(r"^\s{5}((?:(?:p\d+\W?|·)\s+)+)$", section(output, 2), re.M)
    assert len(strips) >= 5 and len(asked) == 6
    assert all(len(CELL.findall(strip)) == frames for strip in strips + asked)
    total, size, now, rest = one(r"frames\s+(\d+) of (\d+) tokens; (\d+) hold pages now, (\d+) section 3's tiers", output)
    assert (total, size) == (frames, tokens) and now + rest == frames
    chat = section(output, 5)
    assert one(r"with all (\d+) frames and no model", chat) == (frames,)
    held = re.search(r"so ([\d, then]+) of the (\d+) frames hold pages", chat)
    assert held and int(held.group(2)) == frames
    assert all(int(n) <= frames for n in re.findall(r"\d+", held.group(1)))


def test_turns_are_the_conversations_and_then_the_sessions(output):
    bundled, = one(r"A bundled conversation: (\d+) turns", output)
    accepted, on_disk, conversation, added, said, replies = one(
        r"turns accepted / on disk\s+(\d+) / (\d+): the conversation's (\d+) and section 3's (\d+) "
        r"\(Maya's (\d+) statements, the shell's (\d+) replies\)", output)
    statements = re.findall(r"^\s+Maya: .* → ", section(output, 3), re.M)
    assert conversation == bundled and said == len(statements) and added == said + replies
    assert accepted == on_disk == bundled + added


def test_pages_sealed_add_up(output):
    weeks = re.findall(r"(\d+) pages? sealed", section(output, 1))
    total, ingested, later = one(r"pages sealed\s+(\d+) \((\d+) in section 1, (\d+) in section 3\)", output)
    assert ingested == int(weeks[-1]) and total == ingested + later


def test_faults_hits_and_evictions_are_the_sessions_by_section(output):
    totals = one(r"faults / hits / evictions\s+(\d+) / (\d+) / (\d+), all of this session", output)
    ingest = one(r"1\. ingest\s+(\d+) / (\d+) / (\d+)", output)
    questions = one(r"2\. questions\s+(\d+) / (\d+) / (\d+)", output)
    tiers = one(r"3\. memory tiers\s+(\d+) / (\d+) / (\d+)", output)
    assert totals == tuple(map(sum, zip(ingest, questions, tiers)))
    assert ingest[2] == int(re.findall(r"(\d+) evicted", section(output, 1))[-1])
    asked = re.findall(r"faulted in: (.*?) · (\d+) hits \(wanted, already resident\) · evicted (\d+)", section(output, 2))
    assert len(asked) == 6
    faulted = sum(len(re.findall(r"p\d+", pages)) for pages, _, _ in asked)
    assert questions == (faulted, sum(int(h) for _, h, _ in asked), sum(int(e) for _, _, e in asked))


def test_the_replay_table_counts_the_run_its_line_and_note_name(output):
    chat = section(output, 5)
    faults, hits, evictions, ingesting = one(r"reproduced exactly: (\d+) faults / (\d+) hits / (\d+) evictions, "
                                             r"(\d+) of them while ingesting", chat)
    assert "as in section 1" in chat and ingesting == int(re.findall(r"(\d+) evicted", section(output, 1))[-1])
    row = re.search(r"^clock\* +(\d+) +(\d+) +([\d.]+)% ", chat, re.M)
    assert row, chat
    assert (int(row.group(1)), int(row.group(2))) == (faults, evictions)
    assert float(row.group(3)) == (round(100 * hits / (faults + hits), 1) if faults + hits else 0.0)
    # the two runs are told apart, each with its own figure
    questions = one(r"2\. questions\s+(\d+) / \d+ / \d+", output)[0]
    assert one(r"no model, faulting (\d+) times", chat) == (questions,)
    assert one(r"its six questions fault (\d+) times", chat)[0] <= faults


def test_under_another_budget_the_replay_note_gives_the_recorded_chats_frames(tmp_path):
    output = demo(tmp_path, "--budget", "1024")
    frames, = one(r"→ (\d+) frames of", output)
    assert one(r"frames\s+(\d+) of \d+ tokens", output) == (frames,)
    chat = section(output, 5)
    recorded, = one(r"recorded under another budget, of (\d+) frames", chat)
    assert recorded != frames and one(r"of the (\d+) frames hold pages", chat) == (recorded,)
    assert one(r"with all (\d+) frames and no model", chat) == (frames,)
