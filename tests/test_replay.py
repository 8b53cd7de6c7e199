"""Traces: every sample replays exactly; an edited trace names where it diverges; OPT is a true optimum;
the recorded policy (the one in force when recorded, starred) changes no context, and `--check` refuses
another."""

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import ROOT, ENV, chat
from pager.cli.app import app
from pager.errors import InputError
from pager.replay import opt_faults, replay
from pager.trace import read_trace
import shutil
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

TRACES = sorted((ROOT / "traces").glob("*.jsonl")) + [ROOT / "pager" / "data" / "demo_trace.jsonl"]
runner = CliRunner()


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_every_sample_trace_replays_exactly(trace):
    first = json.loads(trace.read_text().splitlines()[0])
    said = "A real local model" if trace.stem.startswith("real_") else "no LLM"   # real_*: recorded with one
    assert first["kind"] == "note" and said in first["text"], "each trace opens with a note saying why"
    result = runner.invoke(app, ["replay", str(trace), "--check"])
    assert result.exit_code == 0, result.output
    assert "reproduced exactly" in result.output


def test_the_real_traces_hold_a_real_models_replies_and_its_recoveries():
    real = {p.stem: [json.loads(line) for line in p.read_text().splitlines()] for p in TRACES if p.stem.startswith("real_")}
    assert len(real) >= 3
    for events in real.values():
        start = next(e for e in events if e["kind"] == "session_start")
        assert not start["model"].startswith("pager/"), "recorded with a model, not the offline shell"
        assert any(e["kind"] == "model_reply" and e["text"] for e in events)
    kinds = {e["kind"] for events in real.values() for e in events}
    assert {"calls_in_text", "facts_written", "memory_rejected"} <= kinds
    recovered = real["real_unknown_tool_in_text"]
    result = next(e for e in recovered if e["kind"] == "tool_result")
    assert "unknown tool" in result["result"] and "page_in" in result["result"]


def _edit_one_eviction(trace: Path, out: Path, last: bool) -> int:
    lines = trace.read_text().splitlines()
    order = range(len(lines) - 1, -1, -1) if last else range(len(lines))
    for i in order:
        event = json.loads(lines[i])
        if event["kind"] == "evict":
            event["page"] = "p1" if event["page"] != "p1" else "p2"
            lines[i] = json.dumps(event)
            out.write_text("\n".join(lines) + "\n")
            return event["seq"]
    raise AssertionError("no eviction to edit")


@pytest.mark.parametrize("last, where", [(True, "message 1"), (False, "while appending turns")])
def test_an_edited_eviction_fails_check_and_names_the_step(tmp_path, last, where):
    edited = tmp_path / "edited.jsonl"
    seq = _edit_one_eviction(ROOT / "traces" / "eviction_under_pressure.jsonl", edited, last)
    result = runner.invoke(app, ["replay", str(edited), "--check"])
    assert result.exit_code == 1
    assert f"recorded event #{seq}" in result.output
    assert where in result.output and "expected" in result.output and "replayed" in result.output


def test_pinned_page_is_never_evicted_in_its_trace():
    run = replay(ROOT / "traces" / "pinned_fact_survives.jsonl")
    pinned = [e for e in run.events if e["kind"] == "pin"]
    assert pinned and pinned[0]["page"] == "p3"
    after = run.events[run.events.index(pinned[0]):]
    assert not [e for e in after if e["kind"] == "evict" and e["page"] == "p3"]


def test_malformed_tool_calls_trace_recovers():
    run = replay(ROOT / "traces" / "malformed_tool_call.jsonl")
    results = [e["result"] for e in run.events if e["kind"] == "tool_result"]
    assert any("not valid JSON" in r for r in results) and any("unknown tool" in r for r in results)
    assert any("does not exist" in r for r in results) and any("whole number" in r for r in results)
    final = [e for e in run.events if e["kind"] == "model_reply"][-1]
    assert "peanut" in final["text"]


def test_clock_and_lru_differ_on_their_trace_and_opt_bounds_both():
    trace = ROOT / "traces" / "clock_vs_lru.jsonl"
    clock, lru = replay(trace, policy="clock"), replay(trace, policy="lru")
    assert clock.faults != lru.faults
    assert clock.opt() <= min(clock.faults, lru.faults)


@pytest.mark.parametrize("trace", TRACES, ids=lambda p: p.stem)
def test_opt_never_exceeds_any_policy(trace):
    for policy in ("clock", "lru", "lfu", "scored"):
        run = replay(trace, policy=policy)
        assert run.opt() <= run.faults


def test_opt_matches_the_textbook_example():
    refs = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1]
    string = [x for r in refs for x in (("use", r), ("assemble", 0))]
    assert opt_faults(string, frames=3 + 1) == 9  # 3 frames for pages plus the open tail


def test_opt_is_optimal_against_brute_force():
    from itertools import product

    rng = random.Random(5)
    for _ in range(30):
        refs = [rng.randrange(5) for _ in range(9)]
        string = [x for r in refs for x in (("use", r), ("assemble", 0))]
        best = min(_faults_with_choices(refs, 2, choices) for choices in product(range(2), repeat=len(refs)))
        assert opt_faults(string, frames=3) == best


def _faults_with_choices(refs, capacity, choices):
    cache, faults = [], 0
    for r, choice in zip(refs, choices):
        if r in cache:
            continue
        faults += 1
        if len(cache) == capacity:
            cache.pop(choice % len(cache))
        cache.append(r)
    return faults


def test_trace_show_step_and_html(tmp_path):
    trace = ROOT / "traces" / "fault_after_long_gap.jsonl"
    result = runner.invoke(app, ["trace", "show", str(trace), "--step", "1"])
    assert result.exit_code == 0, result.output
    assert "model call 1" in result.output and "memory map" in result.output and "total" in result.output
    html = tmp_path / "t.html"
    result = runner.invoke(app, ["trace", "show", str(trace), "--html", str(html)])
    assert result.exit_code == 0, result.output
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "peanuts" in page  # hover text of p5
    result = runner.invoke(app, ["trace", "show", str(trace), "--step", "99"])
    assert result.exit_code != 0 and "has 2 model calls; give --step 1 to 2" in result.output


def test_a_bundled_trace_shows_every_lane_of_the_timeline(tmp_path):
    """Each tier's lane can be seen from something bundled: state and facts from memory_model_updates,
    summaries from episode_summaries (written by the extractive producer through the session)."""
    for name, lanes in (("memory_model_updates", ("state", "facts")), ("episode_summaries", ("summaries",))):
        html = tmp_path / f"{name}.html"
        result = runner.invoke(app, ["trace", "show", str(ROOT / "traces" / f"{name}.jsonl"), "--html", str(html)])
        assert result.exit_code == 0, result.output
        for lane in lanes:
            assert f'data-lane="{lane}"' in html.read_text(), (name, lane)
    kinds = [json.loads(line)["kind"] for line in (ROOT / "traces" / "episode_summaries.jsonl").read_text().splitlines()]
    assert kinds.count("summaries_written") == 1 and kinds.count("summary") >= 2


def test_a_trace_cut_by_a_crash_is_still_readable(tmp_path):
    lines = (ROOT / "traces" / "pinned_fact_survives.jsonl").read_text().splitlines()
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:100]) + "\n" + lines[100][:17])
    assert len(list(read_trace(cut))) == 100
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text("\n".join(lines[:5] + ["{garbage"] + lines[6:]) + "\n")
    with pytest.raises(InputError, match=r"damaged.jsonl:6"):
        list(read_trace(damaged))
    result = runner.invoke(app, ["replay", str(damaged), "--check"])
    assert result.exit_code != 0 and "damaged.jsonl:6" in result.output and "Traceback" not in result.output


def test_a_session_resumed_at_a_smaller_budget_replays_exactly(tmp_path):
    """A session that never evicted at 8192 tokens, resumed at 1024: the recording's pages have no
    automatic bookmarks yet (they are made at a page's first eviction), while loading the snapshot at
    the smaller budget evicts, and bookmarks, as it goes. The snapshot carries the recording's
    bookmarks, and replay starts from them."""
    import json

    from conftest import ENV, chat
    from test_updates import VALUES, conversation

    home = tmp_path / "h"
    small_talk = ["ok, so it is on.", "yes, we do it.", "so be it, ok.", "it is a go.", "we can do it.", "ok, on it."]
    chat(home, small_talk * 4 + conversation(), "--budget", "8192", session="u")   # pages with no word to bookmark
    for old in (home / "traces").glob("u-*.jsonl"):
        old.unlink()
    chat(home, [v[2] for v in VALUES], "--budget", "1024", session="u")
    trace = next((home / "traces").glob("u-*.jsonl"))
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    assert any(e["kind"] == "bookmark" and e["source"] == "auto" for e in events)   # the first evictions here
    replayed = CliRunner().invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--check"], env=ENV)
    assert replayed.exit_code == 0, replayed.output
    assert next(e for e in events if e["kind"] == "snapshot")["bookmarks"] == []


QUESTIONS = ["Who is allergic to peanuts?", "What did we decide about the sync engine?"]


def test_replay_all_stars_the_policy_in_force_when_recorded(maya, tmp_path):
    """A chat that switched with `/policy lru` before its questions is reproduced by the lru row; the
    star used to sit on clock, the policy the session started with."""
    from pager import replay as rp

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    chat(home, ["/policy bogus", "/pin p9999", "/policy lru", *QUESTIONS, "What about Lisbon?"], "--budget", "2048")
    trace = next((home / "traces").glob("maya-chat-*.jsonl"))
    result = runner.invoke(app, ["--home", str(tmp_path / "r"), "replay", str(trace), "--policy", "all"], env=ENV)
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.split()
            and line.split()[0].rstrip("*") in ("clock", "lru", "lfu", "scored")}
    assert "lru*" in rows and "clock*" not in rows, result.output
    assert "switched clock → lru" in " ".join(result.output.split()), result.output
    lru = rp.replay(trace, policy="lru")
    assert lru.changed_contexts == 0   # the starred row is the one that reproduces the recording


def test_replay_under_the_recorded_policy_changes_no_context(tmp_path):
    """`pager replay TRACE` (no --policy) printed `clock* … contexts changed 7/9` for a chat trace that
    `pager replay TRACE --check` reproduced exactly: the recorded policy was replayed as a what-if, its
    CLOCK hand restarted at frame 0, so the row meant to be the recording was not. Here the session's
    hand has moved (weeks appended under a small budget evict) before the traced questions."""
    import json

    from pager.agent import Agent
    from pager.model import HandlerModel
    from pager.offline import OfflineShell
    from pager.trace import TraceWriter, begin
    from conftest import DEMO

    lines = [json.loads(line) for line in DEMO.read_text().splitlines()]
    trace = tmp_path / "chat.jsonl"
    with Home(Config(home=tmp_path / "h", budget=4096, embedder="hash"), embedder=HashEmbedder()) as home:
        session = home.open("maya")
        for i in range(0, len(lines), 11):
            session.append_many(lines[i:i + 11])
        assert session.policy.hand != 0
        writer = TraceWriter(trace)
        session.events.listeners.append(writer)
        agent = Agent(session, HandlerModel(OfflineShell()))
        begin(session, "pager/offline", agent.budget)
        for question in ("Who is allergic to peanuts?", "When does Priya start?", "What did we pick for sync?"):
            agent.ask(question)
        writer.close()
    assert runner.invoke(app, ["replay", str(trace), "--check"], env=ENV).exit_code == 0
    for args in ([], ["--policy", "clock"], ["--policy", "all"]):
        result = runner.invoke(app, ["replay", str(trace), *args], env=ENV)
        assert result.exit_code == 0, result.output
        row = next(line for line in result.output.splitlines() if line.startswith("clock*"))
        changed = row.split()[4]   # policy, faults, evictions, hit rate, then the contexts changed
        assert changed.startswith("0/"), (args, row)


def test_replay_check_under_another_policy_is_refused_not_ignored(tmp_path):
    """`pager replay TRACE --check --policy lru` printed "ok: 887 recorded events reproduced exactly" for
    a trace recorded under CLOCK: --check ignored --policy (and took any name, `--policy bogus` too),
    so it looked as if LRU made the same decisions. The recorded policy is accepted; another is refused,
    naming the command that compares it."""
    trace = "traces/clock_vs_lru.jsonl"
    home = ["--home", str(tmp_path)]
    for policy in ("lru", "all", "bogus"):
        result = runner.invoke(app, [*home, "replay", trace, "--check", "--policy", policy], env=ENV)
        assert result.exit_code == 2 and "reproduced" not in result.output, (policy, result.output)
    result = runner.invoke(app, [*home, "replay", trace, "--check", "--policy", "lru"], env=ENV)
    assert "clock" in result.output and f"pager replay {trace} --policy lru" in result.output, result.output
    result = runner.invoke(app, [*home, "replay", trace, "--check", "--policy", "clock"], env=ENV)
    assert result.exit_code == 0 and "reproduced exactly" in result.output, result.output
