"""An undated JSONL line among dated ones happened that day, not on the day of the import (the outside
tester's first hour: a note pasted into a dated log came out dated today)."""

import json

from typer.testing import CliRunner

from pager.cli.app import app
from pager.formats import carry_dates, keyed

from conftest import ENV

runner = CliRunner()
LOG = [
    {"speaker": "Ana", "text": "Kickoff for the harbour project.", "date": "3 March 2025"},
    {"speaker": "Ana", "text": "Noted: the crane permit is still missing."},
    {"speaker": "Ben", "text": "Permit filed.", "date": "9 March 2025", "ts": 1741521600},
    {"speaker": "Ben", "text": "Also ordered the fencing."},
]


def _ingest(home, path):
    result = runner.invoke(app, ["--home", str(home), "ingest", str(path), "--session", "log"], env=ENV)
    assert result.exit_code == 0, result.output
    return result.output


def test_an_undated_line_takes_the_day_of_the_dated_line_before_it(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps(m) + "\n" for m in [LOG[1]] + LOG))   # an undated line first, too
    _ingest(tmp_path / "h", path)
    exported = runner.invoke(app, ["--home", str(tmp_path / "h"), "export", "--session", "log"], env=ENV)
    turns = [json.loads(line) for line in exported.output.splitlines() if line.strip()]
    assert [t["date"] for t in turns] == ["3 March 2025", "3 March 2025", "3 March 2025", "9 March 2025",
                                          "9 March 2025"], turns
    assert turns[4]["ts"] == turns[3]["ts"] == 1741521600
    assert "0 new turns, 5 already held" in _ingest(tmp_path / "h", path)   # the same file adds nothing again


def test_keys_are_made_before_dates_are_carried_so_older_imports_are_not_repeated():
    keys = [m["key"] for m in keyed(LOG)]
    carried = carry_dates(keyed(LOG))
    assert [m["key"] for m in carried] == keys          # the keys of before this change
    assert carried[1]["date"] == "3 March 2025" and "date" not in LOG[1]
    undated = [{"speaker": "a", "text": "no dates here"}]
    assert carry_dates(undated) == undated              # a file without dates: its lines dated at import
