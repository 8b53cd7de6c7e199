"""What pager prints to a pipe reads whole: 80 columns (COLUMNS, as rich reads it) and no colour. Tables
fit the width with every header whole on one line, and the frames strip and its legend say each
frame's state in marks as well as in colours."""

import re

import pytest
from typer.testing import CliRunner

from pager.cli.app import app

from conftest import ENV, ingest_lines

runner = CliRunner()
PLAIN = {**ENV, "COLUMNS": "80", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("plain")
    ingest_lines(home, "notes", [{"speaker": "Maya", "text": f"Week {i}: the Lisbon offsite budget is {18_000 + i} euros, "
                                  f"booked at Casa do Rio for the platform team's {i}th retrospective.",
                                  "date": f"{i + 1} May 2023"} for i in range(40)])
    return home


def _run(home, *argv: str) -> str:
    result = runner.invoke(app, ["--home", str(home), *argv], env=PLAIN)
    assert result.exit_code == 0, result.output
    return result.output


def _header_line(output: str, headers: tuple[str, ...]) -> str:
    """The one line holding every header, in order, each whole."""
    pattern = r"\s+".join(re.escape(h) for h in headers)
    lines = [line for line in output.splitlines() if re.search(rf"(?:^|\s){pattern}(?:\s|$)", line)]
    assert lines, (headers, output)
    return lines[0]


@pytest.mark.parametrize("argv, headers", [
    (("inspect", "-s", "notes"), ("page", "resident", "frame", "pinned", "ref", "last use", "uses", "faults", "tokens",
                                  "date")),
    (("inspect", "-s", "notes"), ("frame", "page", "tokens", "fill", "flags", "date", "bookmarks")),
    (("search", "Lisbon offsite budget", "-s", "notes"), ("page", "score", "signals", "date", "bookmarks", "best piece")),
    (("sessions",), ("user", "session", "turns", "pages")),
    (("replay", "pager/data/demo_trace.jsonl", "--policy", "all"),
     ("policy", "faults", "evictions", "hit rate", "contexts changed", "OPT faults", "faults / OPT")),
])
def test_tables_fit_80_columns_with_every_header_whole_on_one_line(home, argv, headers):
    """At 80 columns (a pipe) the page table cut its headers to "resid…", "pinn…" and "faul…" and wrapped
    "last use" onto two lines, and the replay table wrapped "contexts changed" and "faults / OPT"; every
    cell of `pager search` wrapped under rules between nine columns of borders."""
    output = _run(home, *argv)
    assert max(map(len, output.splitlines())) <= 80, output
    _header_line(output, headers)
    assert "…" not in output.split("OPT: ")[0], output
    if argv == ("sessions",):   # the title was wrapped to the narrow table's width: "sessions in" / "/tmp/…"
        assert f"sessions in {home}" in output, output


def test_the_frames_legend_and_strip_read_without_colour(home):
    """Piped, the frames legend was "frames: tail pinned just faulted referenced resident free ·", which
    names states that only colours showed: no cell said which frame was the tail or referenced. Each
    state has a mark, in the strip and in the legend."""
    output = _run(home, "inspect", "-s", "notes")
    legend = next(line for line in output.splitlines() if line.startswith("frames:"))
    marks = dict(re.findall(r"p\d+(\W) (tail|pinned|just faulted|referenced)", legend))
    assert set(marks.values()) == {"tail", "pinned", "just faulted", "referenced"}, legend
    assert len(set(marks)) == 4 and "resident" in legend and "· free" in legend, legend
    strip = next(line for line in output.splitlines() if re.match(r"p\d+\W? ", line))
    tail = re.search(r"session 'notes': .*\(p(\d+) open\)", output).group(1)
    by_mark = {v: k for k, v in marks.items()}
    assert f"p{tail}{by_mark['tail']}" in strip, (strip, legend)
    assert re.search(rf"p\d+{re.escape(by_mark['referenced'])}", strip), strip
