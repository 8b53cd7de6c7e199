"""What `pager ingest` reads as people's files are: ISO timestamps, dates it cannot read (named, not
taken silently), standard input from `-`, Unicode line separators inside JSON strings, LoCoMo sessions
without a date; a JSON array, a pretty-printed file or a LoCoMo question of the wrong shape is refused
in one line saying how to convert or fix it."""

import json

import pytest
from typer.testing import CliRunner

from pager.cli.app import app
from pager.formats import parse_locomo

from conftest import ENV, ingest_file


runner = CliRunner()


def test_ingest_says_which_dates_it_cannot_read_and_what_a_plain_text_file_needs(tmp_path):
    """A line dated "31 Feb 2023" or "yesterday" was taken without a word and dated the day it was
    imported (its header still saying 31 Feb 2023, so "what happened in February 2023?" cannot find it);
    a plain text file was refused with "line 1: not JSON (Expecting value); fix that line"."""
    home = str(tmp_path / "h")
    dated = tmp_path / "dated.jsonl"
    dated.write_text('{"speaker": "Ann", "text": "fine", "date": "8 May 2023"}\n'
                     '{"speaker": "Ann", "text": "odd", "date": "31 Feb 2023"}\n'
                     '{"speaker": "Ann", "text": "vague", "date": "yesterday"}\n'
                     '{"speaker": "Ann", "text": "exact", "date": "someday", "ts": 1683547200}\n')
    result = runner.invoke(app, ["--home", home, "ingest", str(dated), "-s", "d"], env=ENV)
    assert result.exit_code == 0, result.output
    assert f"{dated}:2: date '31 Feb 2023'" in result.output and "2 lines" in result.output, result.output
    assert '"ts"' in result.output
    plain = tmp_path / "notes.txt"
    plain.write_text("Ann: hi there\nBob: the code word is platypus\n")
    refused = runner.invoke(app, ["--home", home, "ingest", str(plain), "-s", "p"], env=ENV)
    assert refused.exit_code == 2 and '{"speaker": ' in refused.output and "fix that line" not in refused.output, refused.output
    one_bad = tmp_path / "one_bad.jsonl"
    one_bad.write_text('{"speaker": "Ann", "text": "fine"}\nnot json at all\n')
    refused = runner.invoke(app, ["--home", home, "ingest", str(one_bad), "-s", "p"], env=ENV)
    assert refused.exit_code == 2 and f"{one_bad}:2: not JSON" in refused.output and "fix that line" in refused.output


def test_ingest_reads_standard_input_from_a_dash(tmp_path):
    """`… | pager ingest - -s a` said "no file at -; check the path"."""
    home = str(tmp_path / "h")
    result = runner.invoke(app, ["--home", home, "ingest", "-", "-s", "a"], env=ENV,
                           input='{"speaker": "Ann", "text": "hello"}\n{"speaker": "Bob", "text": "hi"}\n')
    assert result.exit_code == 0 and "a: 2 new turns" in result.output, result.output
    bad = runner.invoke(app, ["--home", home, "ingest", "-", "-s", "a"], env=ENV, input="not json\n")
    assert bad.exit_code == 2 and "<stdin>:1: not JSON" in bad.output, bad.output


SEPARATORS = "a line\u2028a paragraph\u2029a NEL\u0085the end"


def test_text_with_unicode_line_separators_survives_export_ingest_and_replay(tmp_path):
    """JSON keeps U+2028, U+2029 and U+0085 raw inside strings (text pasted from a web page or a word
    processor holds them), and pager read JSONL and traces with str.splitlines, which ends a line at
    each: `pager ingest` refused such a file ("not JSON", naming a line that was half of one), so did
    `pager ingest` of pager's own export, and a chat whose message held one left a trace that
    `pager replay` and `pager trace show` refused. Only \\n and \\r end a line now."""
    home = ["--home", str(tmp_path)]
    source = tmp_path / "pasted.jsonl"
    source.write_text(json.dumps({"speaker": "ann", "text": SEPARATORS}, ensure_ascii=False) + "\n", encoding="utf-8")
    run = CliRunner()
    imported = run.invoke(app, [*home, "ingest", str(source), "-s", "notes"], env={"PAGER_EMBEDDER": "hash"})
    assert imported.exit_code == 0, imported.output
    chatted = run.invoke(app, [*home, "chat", "-s", "notes"], input=f"{SEPARATORS} again\n/quit\n",
                         env={"PAGER_EMBEDDER": "hash"})
    assert chatted.exit_code == 0, chatted.output
    out = tmp_path / "notes.jsonl"
    assert run.invoke(app, [*home, "export", "-s", "notes", "--out", str(out)], env={"PAGER_EMBEDDER": "hash"}).exit_code == 0
    assert [json.loads(line)["text"] for line in out.read_text(encoding="utf-8").split("\n") if line][:2] == \
        [SEPARATORS, f"{SEPARATORS} again"]
    again = run.invoke(app, [*home, "ingest", str(out), "-s", "notes"], env={"PAGER_EMBEDDER": "hash"})
    assert again.exit_code == 0 and "0 new turns" in again.output, again.output
    trace = next((tmp_path / "traces").glob("notes-chat-*.jsonl"))
    replayed = run.invoke(app, [*home, "replay", str(trace), "--check"], env={"PAGER_EMBEDDER": "hash"})
    assert replayed.exit_code == 0, replayed.output


def _exported(tmp_path, session: str) -> list[dict]:
    result = runner.invoke(app, ["--home", str(tmp_path / "home"), "export", "-s", session], env=ENV)
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_an_iso_timestamp_in_date_dates_the_turn_on_its_day(tmp_path):
    """`"date": "2023-05-08T10:00:00Z"`, what nearly every exporter writes, was warned about as naming no
    day ("like '8 May 2023' or 2023-05-08") and the turn dated the day it was imported: the ISO date was
    read only when a word boundary followed the day, and the T of a timestamp is no boundary. A question
    about May 2023 could not find it. It is read now, like `2023-05-08 10:00`."""
    lines = [{"speaker": "ann", "text": "the kickoff is today", "date": "2023-05-08T10:00:00Z"},
             {"speaker": "bob", "text": "and the review", "date": "2023-05-09T16:30:00.123+02:00"}]
    result = ingest_file(tmp_path, "stamps.jsonl", "".join(json.dumps(m) + "\n" for m in lines), "-s", "s")
    assert result.exit_code == 0 and "warning" not in result.output, result.output
    from datetime import datetime

    days = [datetime.fromtimestamp(t["ts"]).date().isoformat() for t in _exported(tmp_path, "s")]
    assert days == ["2023-05-08", "2023-05-09"]


@pytest.mark.parametrize("content, command", [
    ('[{"speaker": "ann", "text": "one"}, {"speaker": "bob", "text": "two"}]\n', "jq -c '.[]'"),
    ('[\n  {"speaker": "ann", "text": "one"},\n  {"speaker": "bob", "text": "two"}\n]\n', "jq -c '.[]'"),
    ('{\n  "speaker": "ann",\n  "text": "one"\n}\n', "jq -c ."),
])
def test_a_json_array_or_pretty_printed_file_is_named_with_the_command_that_converts_it(tmp_path, content, command):
    """A conversation saved as one JSON array (what `json.dump(messages)` writes), or pretty-printed, was
    refused with "expected an object like …" or "not JSON (Expecting value); fix that line": the line
    is not what is wrong, and nothing said that ingest reads one object per line. The error now says
    what the file is and the command that converts it, to a file that is not the one it reads."""
    result = ingest_file(tmp_path, "conversation.jsonl", content, "-s", "s")
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "not JSON lines" in result.output and command in result.output, result.output
    assert "conversation-lines.jsonl" in result.output, result.output   # never `> conversation.jsonl`: that empties it


def _locomo(qa=None, **conversation) -> str:
    conv = {"speaker_a": "Ann", "speaker_b": "Bob", "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "My dog is called Coco."}]} | conversation
    return json.dumps([{"sample_id": "c1", "conversation": conv, "qa": qa or []}])


@pytest.mark.parametrize("qa, named", [
    ([{"question": "q", "category": "multi-hop", "evidence": ["D1:1"]}], '"category"'),
    (["What is Ann's dog called?"], "is not an object"),
    ([{"question": "q", "category": 1, "evidence": "D1:1"}], '"evidence"'),
])
def test_a_locomo_question_of_the_wrong_shape_is_named_not_a_traceback(tmp_path, qa, named):
    """`pager ingest --format locomo` of a file whose `qa` held a category in words, a question as a bare
    string, or evidence as one string printed a Python traceback (ValueError, AttributeError), or
    silently dropped the evidence; ingest does not even use the questions. Each is one line naming the
    sample and the question now, and nothing is imported."""
    result = ingest_file(tmp_path, "locomo.json", _locomo(qa), "--format", "locomo")
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    assert "c1 qa 1" in result.output and named in result.output, result.output


def test_a_locomo_session_without_a_date_is_not_dated_1970(tmp_path):
    """A LoCoMo session with no (or an unreadable) `session_N_date_time` gave its turns the timestamp 0:
    `pager export` showed them on 1 January 1970 and a date question could never reach them. They are
    dated as an undated JSONL line is now (the turns before them, else the day imported), with a warning
    naming the session."""
    content = _locomo(session_2=[{"speaker": "Bob", "dia_id": "D2:1", "text": "Coco learned to sit."}])
    result = ingest_file(tmp_path, "locomo.json", content, "--format", "locomo")
    assert result.exit_code == 0 and "session_2_date_time" in result.output, result.output
    assert all(t["ts"] > 86_400 and "1970" not in t["date"] for t in _exported(tmp_path, "c1"))
    (conversation,) = parse_locomo(tmp_path / "locomo.json")
    assert [m.get("ts") for m in conversation.messages][1:] == [None]


def test_ingesting_a_file_again_says_nothing_new_was_added_and_counts_in_words(tmp_path):
    """Ingesting the same 7-line file again said "0 new turns, 7 already held" and then "ingested 7
    lines", as if it had stored them again; one line added to the file said "1 new turns". The last line
    says what was added: all of it, some of it (with how many were already held), or nothing new."""
    home = ["--home", str(tmp_path / "h")]
    data = tmp_path / "notes.jsonl"
    data.write_text("".join(json.dumps({"speaker": "Maya", "text": f"note {i}"}) + "\n" for i in range(7)))
    run = lambda: runner.invoke(app, [*home, "ingest", str(data), "-s", "notes"], env=ENV)  # noqa: E731
    first = run()
    assert first.exit_code == 0 and "ingested 7 lines into 1 session in" in first.output, first.output
    again = run()
    assert again.exit_code == 0 and "notes: 0 new turns, 7 already held" in again.output, again.output
    last = again.output.strip().splitlines()[-1]
    assert last.startswith("nothing new: the 7 lines were already held") and "ingested" not in last, last
    with data.open("a") as fh:
        fh.write(json.dumps({"speaker": "Maya", "text": "note 7"}) + "\n")
    more = run()
    assert "notes: 1 new turn, 7 already held → 8 turns" in more.output, more.output
    assert "ingested 1 new line of 8 (7 already held) into 1 session in" in more.output, more.output


def test_a_line_said_by_a_bot_with_no_role_is_the_assistants_and_ingest_says_so(tmp_path):
    """`{"speaker": "Bot", "text": …}` was stored as the user's (no "role": the default), with no word:
    the offline shell then quoted the bot's lines as things the user said, and its bookmarks named them.
    A line with no role whose speaker names an assistant (Bot, Assistant, AI, ChatGPT, …) is the
    assistant's, and ingest says so in one warning naming the line and the fix for a person called so;
    an explicit role wins, and importing the file again adds nothing (its keys are the file's own)."""
    home = ["--home", str(tmp_path / "h")]
    data = tmp_path / "support.jsonl"
    lines = [{"speaker": "Maya", "text": "My order 4417 never arrived."},
             {"speaker": "Bot", "text": "Sorry to hear that, a refund is on its way."},
             {"speaker": "ChatGPT", "text": "Anything else about order 4417?"},
             {"speaker": "Bot", "role": "user", "text": "I am a person whose nickname is Bot."}]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    first = runner.invoke(app, [*home, "ingest", str(data), "-s", "help"], env=ENV)
    assert first.exit_code == 0, first.output
    assert "support.jsonl:2: speaker 'Bot' has no \"role\"" in first.output, first.output
    assert "2 lines like it" in first.output and '"role": "user"' in first.output
    exported = runner.invoke(app, [*home, "export", "-s", "help"], env=ENV)
    roles = [(row["speaker"], row["role"]) for row in map(json.loads, exported.output.splitlines())]
    assert roles == [("Maya", "user"), ("Bot", "assistant"), ("ChatGPT", "assistant"), ("Bot", "user")]
    again = runner.invoke(app, [*home, "ingest", str(data), "-s", "help"], env=ENV)
    assert "nothing new" in again.output, again.output
