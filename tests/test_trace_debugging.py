"""Finding out why an agent forgot something with what the README offers: `pager trace show` (a step's
regions adding up, the pages as the model read them, an HTML timeline naming what left each frame and
holding each page's text once) and `pager replay --check` on traces of resumed chats, of the toolkit,
cut by a crash, trimmed or edited by hand, and thousands of events long."""

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pager.replay as rp
from pager.bench.record import record
from pager.cli.app import app
from pager.config import Config


runner = CliRunner()

ENV = {"PAGER_EMBEDDER": "hash", "PAGER_USER": "", "PAGER_SESSION": "", "PAGER_MODEL": "", "PAGER_BUDGET": "",
       "PAGER_POLICY": ""}

TOPICS = ["the sync engine", "the CI bill", "Halvorsen", "the hiring plan", "the offsite", "the roadmap", "Okta SSO"]


def _talk(n: int) -> list[dict]:
    return [{"speaker": "Maya" if i % 2 == 0 else "assistant", "role": "user" if i % 2 == 0 else "assistant",
             "text": f"Note {i}: {TOPICS[i % len(TOPICS)]} again, item {100 + 37 * i % 900} for the backlog.",
             "date": f"{1 + i // 20} March 2025"} for i in range(n)]


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory) -> Path:
    """A chat of 40 questions over 160 ingested turns under a small budget: evictions all along, excerpts in
    the frames' leftover."""
    out = tmp_path_factory.mktemp("long") / "long.jsonl"
    questions = [f"What did we say about {TOPICS[i % len(TOPICS)]} and item {100 + 37 * i % 900}?" for i in range(40)]
    record(out, _talk(160), questions, Config(embedder="hash", budget=1200, session="long"), "offline (no LLM)")
    return out


def _chat(home: Path, *lines: str, budget: int = 900) -> Path:
    before = set((home / "traces").glob("*.jsonl")) if (home / "traces").exists() else set()
    result = runner.invoke(app, ["--home", str(home), "chat", "-s", "maya", "--budget", str(budget)],
                           input="\n".join([*lines, "/quit"]) + "\n", env=ENV)
    assert result.exit_code == 0, result.output
    (trace,) = set((home / "traces").glob("*.jsonl")) - before
    return trace


def test_session_end_counts_the_events_of_its_own_trace(tmp_path):
    """A resumed chat's trace ended with `session_end` saying 268 faults where it held 44 fault events: it
    gave the session's counters, which run on across runs and processes in the stored page table (and
    counted evictions the chat made before its trace began). It counts the trace's own events now."""
    talk = tmp_path / "talk.jsonl"
    talk.write_text("".join(json.dumps(t) + "\n" for t in _talk(120)))
    assert runner.invoke(app, ["--home", str(tmp_path), "ingest", str(talk), "-s", "maya"], env=ENV).exit_code == 0
    _chat(tmp_path, "What about the CI bill?", "My locker code is 4417.", "What about Okta SSO?")
    second = _chat(tmp_path, "What is my locker code?", "What about the offsite?", budget=700)
    events = [json.loads(line) for line in second.read_text().splitlines()]
    end = events[-1]
    assert end["kind"] == "session_end"
    for kind, counter in (("fault", "faults"), ("hit", "hits"), ("evict", "evictions")):
        assert end[counter] == sum(e["kind"] == kind for e in events), (counter, end)


def _cut(trace: Path, out: Path, after_kind: str) -> Path:
    """The trace as a SIGKILL leaves it: every line up to the last `after_kind` of its last message, then a
    torn line."""
    lines = trace.read_text().splitlines()
    last_user = max(i for i, line in enumerate(lines) if '"kind":"user"' in line)
    at = max(i for i, line in enumerate(lines) if i > last_user and f'"kind":"{after_kind}"' in line)
    out.write_text("\n".join(lines[: at + 1]) + "\n" + lines[at + 1][:40])
    return out


@pytest.mark.parametrize("after_kind", ["evict", "model_request", "tool_result"])
def test_a_trace_cut_mid_message_by_a_crash_checks_and_says_it_was_cut(long_trace, tmp_path, after_kind):
    """A chat SIGKILLed mid-message leaves a readable trace (README), but `replay --check` failed it:
    "diverged at the end of the recording (recorded event #-1): expected (no more events recorded)", the
    replay going on with the rest of the message. Every recorded event is compared; what the recording
    never held is not a divergence, and the output says the run was cut short."""
    cut = _cut(long_trace, tmp_path / "cut.jsonl", after_kind)
    result = runner.invoke(app, ["replay", str(cut), "--check"])
    assert result.exit_code == 0, result.output
    assert "reproduced exactly" in result.output and "cut short" in result.output and "#-1" not in result.output


def test_a_complete_trace_missing_its_last_events_names_where_the_replay_went_on(long_trace, tmp_path):
    """With its session_end kept (a trace trimmed by hand), a replay that goes past the recording still
    diverges, but the message named "recorded event #-1" and an expected "(no more events recorded)"."""
    lines = long_trace.read_text().splitlines()
    trimmed = tmp_path / "trimmed.jsonl"
    trimmed.write_text("\n".join(lines[:-4] + lines[-1:]) + "\n")
    result = runner.invoke(app, ["replay", str(trimmed), "--check"])
    assert result.exit_code == 1
    assert "#-1" not in result.output and "after the recording's last event" in result.output, result.output
    assert "message 40" in result.output and "replayed:" in result.output


def test_settings_that_decide_paging_are_in_the_trace(tmp_path):
    """A toolkit session with `Config(autopage_min_score=…, excerpt_slabs=…, pressure=…)` did not replay:
    session_start did not record the threshold a page needs to fault in on its own (nor the pressure of the
    map's notice, the state's and the facts' shares, the excerpt frames), so replay used the defaults and
    diverged at the first `context`."""
    from pager.tools import Toolkit

    config = Config(home=tmp_path, session="s", budget=1200, embedder="hash", autopage_min_score=50.0,
                    pressure=0.3, excerpt_slabs=2, fact_share=0.2, state_share=0.05)
    with Toolkit(config=config) as memory:
        for turn in _talk(60):
            memory.remember(turn["text"], role="user")
        memory.call("state_set", '{"key": "city", "value": "Paris"}')
        for question in ("the CI bill item", "What about item 137?", "Okta SSO"):
            memory.context(question, budget=1000)
    (trace,) = (tmp_path / "traces").glob("*.jsonl")
    result = runner.invoke(app, ["replay", str(trace), "--check"])
    assert result.exit_code == 0, result.output
    start = next(json.loads(line) for line in trace.read_text().splitlines() if '"session_start"' in line)
    assert start["config"]["autopage_min_score"] == 50.0 and start["config"]["excerpt_slabs"] == 2


def test_trace_show_step_shows_every_region_and_the_pages_text(long_trace):
    """`trace show --step N` printed "tokens: prefix 54 · memory map 22 · pages 693 · message 23 · tool
    exchanges 384 · total 1516": 340 tokens of facts and excerpts missing from the line, and "tool
    exchanges" 384 at a first step that had none (the tool schemas). It names every region, so the line
    adds up, and prints the pages as the model read them, not only their ids."""
    calls = [json.loads(line) for line in long_trace.read_text().splitlines() if '"kind":"model_request"' in line]
    n, request = next((i, e) for i, e in enumerate(calls, 1) if e["tokens"]["facts"] and e["step"] == 1)
    result = runner.invoke(app, ["trace", "show", str(long_trace), "--step", str(n)])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    line = re.search(r"tokens: (.*?) · total (\d+) of", text)
    assert line, text
    parts = dict((label.strip(), int(value)) for label, value in re.findall(r"([a-z ]+?) (\d+)(?: ·|$)", line[1]))
    assert sum(parts.values()) == int(line[2]) == request["tokens"]["total"], parts
    assert parts["facts and excerpts"] == request["tokens"]["facts"] and "tool exchanges" not in parts, parts
    assert parts["tool schemas and exchanges"] == request["tokens"]["scratch"]
    first = request["pages"][0]
    assert f"[{first} ·" in result.output     # the page's header line, then its text
    assert re.search(r"message \d+ \(turn \d+\), model step 1: ", text), text[:300]   # which message it was


def test_the_timeline_names_what_left_each_frame(long_trace, tmp_path):
    """The HTML timeline's red corner said "evicted here": not which page left, nor why."""
    out = tmp_path / "t.html"
    assert runner.invoke(app, ["trace", "show", str(long_trace), "--html", str(out)]).exit_code == 0
    marks = re.findall(r"<title>(evicted[^<]*)</title>", out.read_text())
    assert marks and all(re.fullmatch(r"evicted from f\d+: p\d+ \(policy clock\)(, p\d+ \(policy clock\))*", m)
                         for m in marks), marks[:5]


def test_the_timeline_holds_each_pages_text_once(tmp_path):
    """Every cell of the timeline carried its page's text as a <title>, once per column the page sat in: a
    chat of 2,292 model calls at the default budget made a 40 MB page, 21 MB of it those titles. The texts
    are kept once, shown on hover by a few lines of script, and a page's "</script>" cannot end it."""
    talk = _talk(120)
    talk[3]["text"] = "The unique marker zqx42 </script><script>alert(1)</script> stays text."
    trace = tmp_path / "t.jsonl"
    record(trace, talk, ["What did we say about zqx42?", "And the CI bill?", "And zqx42 again?"],
           Config(embedder="hash", budget=900, session="t"), "offline (no LLM)")
    out = tmp_path / "t.html"
    assert runner.invoke(app, ["trace", "show", str(trace), "--html", str(out)]).exit_code == 0
    page = out.read_text()
    columns = page.count("<g class=\"c\"")
    assert page.count("stays text") == 1 and columns > 10, (page.count("stays text"), columns)
    assert page.count("</script>") == 2 and page.count("alert(1)") == 1


def test_a_long_replay_looks_at_each_event_a_bounded_number_of_times(long_trace, monkeypatch):
    """`trace show --step 1000` and `--html` of an 18,000-event chat took 75 s (the chat itself 6 s): at every
    sync the replay sorted the whole replayed stream again, and with --check compared it from the start
    after every input. Counted, not timed: the events sorted over a replay stay within a few times the
    stream's length."""
    seen = [0]
    sort = rp._comparable

    def counted(events):
        events = list(events)
        seen[0] += len(events)
        return sort(events)

    monkeypatch.setattr(rp, "_comparable", counted)
    run = rp.replay(long_trace, check=True)
    assert run.divergence is None
    assert seen[0] <= 4 * (len(run.events) + len(run.recorded)), (seen[0], len(run.events))


def test_a_trace_whose_snapshot_line_was_deleted_is_refused_naming_it(tmp_path):
    """A resumed session's `snapshot` is one enormous line (every earlier turn): the line a person trimming a
    trace to read it deletes first. Replay then began from an empty session, `--check` said it diverged at
    "turn 391 expected, turn 1 replayed", and `trace show --step` showed another session's prompts as the
    recording's. Both refuse now, naming the missing line."""
    talk = tmp_path / "talk.jsonl"
    talk.write_text("".join(json.dumps(t) + "\n" for t in _talk(60)))
    assert runner.invoke(app, ["--home", str(tmp_path), "ingest", str(talk), "-s", "maya"], env=ENV).exit_code == 0
    trace = _chat(tmp_path, "What about the CI bill?")
    trimmed = tmp_path / "trimmed.jsonl"
    trimmed.write_text("".join(line + "\n" for line in trace.read_text().splitlines() if '"kind":"snapshot"' not in line))
    for args in (["replay", str(trimmed), "--check"], ["trace", "show", str(trimmed), "--step", "1"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and "snapshot" in result.output and "60 turns" in result.output, result.output


def test_a_divergence_names_the_tool_call_it_followed_and_what_differed(tmp_path):
    """A toolkit session (no messages, only tool calls from the agent around it) edited by hand diverged "at
    event 138, before the first message", after 61 calls, and printed two search events cut at 300
    characters, identical as far as they went. It names the external call it followed, and the first field
    that differs."""
    from pager.tools import Toolkit

    with Toolkit(config=Config(home=tmp_path, session="s", budget=1200, embedder="hash")) as memory:
        for turn in _talk(60):
            memory.remember(turn["text"], role="user")
        for question in ("the CI bill item", "What about item 137?"):
            memory.context(question, budget=1000)
    (trace,) = (tmp_path / "traces").glob("*.jsonl")
    edited = tmp_path / "edited.jsonl"
    edited.write_text(trace.read_text().replace('"autopage_share":0.9', '"autopage_share":0.5'))
    result = runner.invoke(app, ["replay", str(edited), "--check"])
    assert result.exit_code == 1
    text = " ".join(result.output.split())
    assert "external call 61 (context" in text and "before the first message" not in text, text
    assert re.search(r"differs in \S+: recorded .+, replayed ", text), text


@pytest.mark.parametrize("kind, edit, said", [
    ("user", lambda e: e.pop("text"), "has no 'text'"),
    ("append", lambda e: e.pop("turns"), "has no 'turns'"),
    ("session_start", lambda e: e.update(budget="2048"), "'budget' (a whole number)"),
    ("user", lambda e: e.update(v="1"), "'v' is a number"),
])
def test_a_trace_edited_by_hand_is_refused_in_one_line_naming_the_event(long_trace, tmp_path, kind, edit, said):
    """A `user` event without its text, an `append` without turns, a budget written as "2048", a version as
    "1": `replay`, `trace show --step`, `--html` and `--policy all` each printed a traceback (KeyError,
    TypeError)."""
    events = [json.loads(line) for line in long_trace.read_text().splitlines()]
    edit(next(e for e in events if e["kind"] == kind))
    edited = tmp_path / "edited.jsonl"
    edited.write_text("".join(json.dumps(e) + "\n" for e in events))
    for args in (["replay", str(edited), "--check"], ["trace", "show", str(edited), "--step", "1"],
                 ["trace", "show", str(edited), "--html", str(tmp_path / "t.html")], ["replay", str(edited)]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and said in " ".join(result.output.split()), (args, result.output)
