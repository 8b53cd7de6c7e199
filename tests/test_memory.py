"""The memory model: one call per sealed batch returns bookmarks AND memory operations (facts to
add, update or invalidate against the most similar current facts; state keys to set or unset).
A scripted model stands in for a real one (no network): on a project-written conversation where
values change, the current value is in the state and first among facts, the old one is superseded
with its dates and found when asked what it was before, an invalidated fact ends with no
successor, nothing is deleted; garbage answers keep what is valid and report the rest; a raising
model is an event, never a failed turn; the recorded answers replay exactly without a model."""

import json
import re

import pytest

from pager.agent import Agent
from pager.bench.record import record
from pager.config import Config
from pager.context import build
from pager.embed import HashEmbedder
from pager.errors import ConfigError
from pager.home import Home
from pager.memory import MemoryWriter, decode, parse
from pager.model import HandlerModel
from pager.offline import OfflineShell
from pager.page import Page
from pager.replay import replay
from pager.store import MemoryStore

TALK = [
    "My home city is Paris.",
    "The project deadline is 14 March, the launch review is on the same day.",
    "My medication dose is 10 mg, once a day with breakfast.",
    *[f"Small talk {i}: the weather, the trains, lunch at the corner cafe number {i}." for i in range(40)],
    "We moved! My home city is now Berlin, the flat is near the river.",
    "The client pushed the project deadline to 21 March.",
    "The doctor changed my medication dose to 20 mg.",
    *[f"More small talk {i}: a film, a book, a walk in the park number {i}." for i in range(20)],
    "I stopped taking the medication altogether, the doctor says I am fine.",
    *[f"Last small talk {i}: a quiet evening number {i}." for i in range(12)],
]
# what the scripted model knows about the turns above (1-based): subject, statement, state value (None: unset)
SAID = {1: ("home city", "Maya lives in Paris.", "Paris"),
        2: ("project deadline", "The project deadline is 14 March.", "14 March"),
        3: ("medication dose", "Maya takes 10 mg of her medication once a day.", "10 mg"),
        44: ("home city", "Maya moved to Berlin; she lives near the river.", "Berlin"),
        45: ("project deadline", "The project deadline moved to 21 March.", "21 March"),
        46: ("medication dose", "Maya's medication dose is now 20 mg.", "20 mg"),
        67: ("medication dose", "Maya stopped taking the medication.", None)}
BY_TEXT = {TALK[i - 1]: said for i, said in SAID.items()}   # what the model recognises in a page's line


class Keeper:
    """A scripted memory model: reads the pages and the similar facts (with ids) in its prompt and
    answers like a careful real one would, inside a code fence with chatter after it."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.calls, self.fail, self.prompts = 0, fail, []

    def __call__(self, messages, tools):
        self.calls += 1
        prompt = messages[-1]["content"]
        self.prompts.append(prompt)
        if self.fail:
            raise self.fail
        shown = {subject: fid for fid, subject in re.findall(r"^- (f\d+) \[([^\]]+)\]", prompt, re.M)}
        facts, state = [], []
        for turn, line in re.findall(r"^\(t(\d+)\) [^:]+: (.*)$", prompt, re.M):
            turn = int(turn)
            if line not in BY_TEXT:
                continue
            subject, text, value = BY_TEXT[line]
            if value is None:
                facts.append({"op": "INVALIDATE", "id": shown[subject], "text": text, "turns": [turn]})
                state.append({"op": "unset", "key": subject})
                continue
            if subject in shown:
                facts.append({"op": "UPDATE", "id": shown[subject], "text": text, "turns": [f"t{turn}"]})
            else:
                facts.append({"op": "ADD", "subject": subject, "text": text, "turns": [turn]})
            state.append({"op": "set", "key": subject, "value": value})
        marks = {pid: {"keywords": ["chat"], "note": "a day of talk"} for pid in re.findall(r"^\[(p\d+)", prompt, re.M)}
        answer = {"bookmarks": marks, "facts": facts or [{"op": "NONE"}], "state": state}
        return {"content": "```json\n" + json.dumps(answer) + "\n```\nThat is all I found."}


def home_with(tmp_path, keeper, **kw):
    config = Config(home=tmp_path / "h", **{"budget": 1024, "page_tokens": 128, "embedder": "hash",
                                             "memory_model": "pager/keeper", "bookmark_batch": 4, **kw})
    return Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False,
                writer=MemoryWriter(HandlerModel(keeper, "pager/keeper"), 4))


def told(home, upto=len(TALK)):
    s = home.open("moves")
    s.append_many([{"speaker": "Maya", "text": t, "ts": 1_700_000_000 + 86_400 * i} for i, t in enumerate(TALK[:upto])])
    return s


def test_one_call_per_batch_writes_bookmarks_facts_and_state(tmp_path):
    keeper = Keeper()
    home = home_with(tmp_path, keeper)
    s = told(home, upto=66)
    sealed = len(s.unwritten)
    s.write_bookmarks(force=True)
    assert keeper.calls == -(-sealed // 4) and not s.unwritten          # one call per batch of 4 pages
    assert all(s.directory.keywords(n)[0] == "chat" for n in s.pages)   # its bookmarks, for every page
    assert s.state.values() == {"home city": "Berlin", "medication dose": "20 mg", "project deadline": "21 March"}
    assert [c.value for c in s.state.history("home city")] == ["Paris", "Berlin"]
    assert {c.source for c in s.state.changes} == {"memory"}
    # the update was decided against the similar facts the prompt showed, with their ids
    later = next(p for p in keeper.prompts if "(t44)" in p)
    assert re.search(r"^- f1 \[home city\] \(\d+ \w+ \d{4}\): Maya lives in Paris\.", later, re.M)
    assert len(s.facts) == 6 and len(s.facts.to_json()) == 6             # nothing deleted
    for subject, old, new in [("home city", "Paris", "Berlin"), ("project deadline", "14 March", "21 March"),
                              ("medication dose", "10 mg", "20 mg")]:
        first, second = s.facts.history(subject)
        assert old in first.text and new in second.text and s.facts.current(subject) is second
        record = next(f for f in s.facts.to_json() if f["id"] == first.id)
        assert record["valid_to"] == second.ts > record["valid_from"] and record["superseded_by"] == second.id
    ranked = [f for f, _ in s.facts.search("Where does Maya live, which city?")]
    assert "Berlin" in ranked[0].text
    before = [f for f, _ in s.facts.search("Which city did Maya live in before?")]
    assert "Paris" in before[0].text
    ctx = build(s, "Which city did Maya live in before Berlin?", chat=False)
    assert "Paris" in ctx.memory and "Berlin" in ctx.memory
    home.journal.close(remove=True)


def test_an_invalidated_fact_ends_with_no_successor_and_stays(tmp_path):
    home = home_with(tmp_path, Keeper())
    s = told(home)
    s.write_bookmarks(force=True)
    twenty = s.facts.history("medication dose")[1]
    end = s.facts.superseded_by(twenty)
    assert end is not None and end.ends and s.facts.current("medication dose") is None
    record = next(f for f in s.facts.to_json() if f["id"] == twenty.id)
    assert record["superseded_by"] is None and record["ended_by"] == end.id and record["valid_to"] == end.ts
    assert f"ended by {end.id}" in s.facts.line(twenty) and "no longer true" in s.facts.line(end)
    assert "medication dose" not in s.state.values() and len(s.state.history("medication dose")) == 3  # set, set, unset
    assert len(s.facts) == 7 and s.facts.similar("medication dose", None) == []   # nothing current to update
    home.journal.close(remove=True)


def test_facts_with_ends_are_durable_and_reload(tmp_path):
    config = Config(home=tmp_path / "h", budget=1024, page_tokens=128, embedder="hash", memory_model="pager/keeper",
                    bookmark_batch=4)
    with Home(config, embedder=HashEmbedder(), writer=MemoryWriter(HandlerModel(Keeper()), 4)) as home:
        s = told(home)
        s.write_bookmarks(force=True)
        before = s.facts.to_json()
    with Home(config.with_(memory_model=""), embedder=HashEmbedder()) as again:
        s = again.open("moves")
        assert s.facts.to_json() == before and s.facts.current("medication dose") is None
        assert s.state.values() == {"home city": "Berlin", "project deadline": "21 March"}


PAGE = Page("s", 3, "Maya: My home city is Berlin now.\nMaya: The deadline is 21 March.", 20, ((7, 0, 33), (8, 34, 63)),
            ((0, 33), (34, 63)))


@pytest.mark.parametrize("reply", [
    '```json\n{"facts": [{"op": "ADD", "subject": "home city", "text": "Maya lives in Berlin.", "turns": [7]}]}\n```',
    'Sure! {"facts": [{"op": "add", "subject": "home city", "text": "Maya lives in Berlin.", "turns": ["t7"]}]} Hope it helps {',
    '{"facts": [{"subject": "home city", "text": "Maya lives in Berlin."}]}',   # no op: add; no turns: the best turn
])
def test_the_answer_is_found_in_fences_and_chatter(reply):
    answer = parse(reply, [PAGE], {})
    assert [(d.op, d.subject, d.turns) for d in answer.facts] == [("add", "home city", (7,))]
    assert answer.rejected == []


def test_garbage_keeps_what_is_valid_and_says_what_is_not():
    reply = json.dumps({
        "bookmarks": {"p3": {"keywords": ["city", 4, "move"]}, "p99": {"keywords": ["x"]}, "p4": "oops"},
        "facts": [{"op": "UPDATE", "id": "f2", "text": "The deadline is 21 March.", "turns": [8]},
                  {"op": "UPDATE", "id": "f42", "text": "Unknown target.", "turns": [8]},
                  {"op": "INVALIDATE", "id": 2},
                  "a string", {"op": "MERGE", "text": "x"}, {"op": "ADD", "text": "No subject.", "turns": [7]},
                  {"op": "ADD", "subject": "pets", "text": "Maya has a cat named Pixel.", "turns": [99]},
                  {"op": "ADD", "subject": "x", "text": "y" * 400}, {"op": "NONE"}],
        "state": [{"op": "set", "key": "home city", "value": "Berlin"}, {"op": "set", "key": "it", "value": ""},
                  {"op": "unset", "key": "order id"}, ["nope"], {"op": "toggle", "key": "a"}]})
    answer = parse(reply, [PAGE], {2: "The deadline is 14 March."})
    assert [(m.page, m.keywords) for m in answer.marks] == [(3, ("city", "move"))]
    assert [(d.op, d.target, d.turns) for d in answer.facts] == [("update", 2, (8,)), ("invalidate", 2, (8,))]
    assert answer.state == [("home city", "Berlin"), ("order id", None)]
    rejected = "\n".join(answer.rejected)
    for said in ("p99", "p4", "'f42', not a current fact", "facts[3]: a str", "unknown op 'merge'",
                 "ADD without a subject", "not on these pages", "400 characters", "state[1]", "state[3]", "'toggle'"):
        assert said in rejected, (said, rejected)
    assert len(answer.rejected) == 11
    for nothing in ("", "no JSON here", '{"facts": [', "[1, 2]", None):
        empty = parse(nothing, [PAGE], {})
        assert empty.facts == [] and empty.marks == [] and len(empty.rejected) == 1
    assert decode('{"facts": "all"}') == {"facts": "all"} and parse('{"facts": "all"}', [PAGE], {}).rejected
    assert parse('{"bookmarks": ["p3"]}', [PAGE], {}).rejected == ["bookmarks: a list, not an object keyed by page id"]


def test_rejected_items_are_an_event_and_the_valid_rest_is_kept(tmp_path):
    def sloppy(messages, tools):
        return {"content": '{"facts": [{"op": "ADD", "subject": "home city", "text": "Maya lives in Paris.", '
                           '"turns": [1]}, {"op": "ADD"}], "state": "Paris"} trailing words'}

    home = home_with(tmp_path, sloppy)
    events = []
    s = told(home, upto=30)
    s.events.listeners.append(events.append)
    s.write_bookmarks(force=True)
    assert [f.text for f in s.facts.items] == ["Maya lives in Paris."]
    rejected = [e for e in events if e.kind == "memory_rejected"]
    assert rejected and any("state: a str" in r for r in rejected[0].data["rejected"])
    home.journal.close(remove=True)


def test_an_answer_cut_at_the_output_limit_is_said_to_be_cut(tmp_path):
    """A memory model's answer cut at its output limit was reported only as "holds no JSON object": the
    event says it was cut, and what makes the answers shorter."""
    def cut(messages, tools):
        return {"content": '{"facts": [{"op": "ADD", "subject": "home city", "text": "Maya lives', "finish_reason": "length"}

    home = home_with(tmp_path, cut)
    events = []
    s = told(home, upto=30)
    s.events.listeners.append(events.append)
    s.write_bookmarks(force=True)
    rejected = [r for e in events if e.kind == "memory_rejected" for r in e.data["rejected"]]
    assert any("cut at the memory model's output limit of 1024 tokens" in r and "PAGER_BOOKMARK_BATCH, now 4" in r
               for r in rejected), rejected
    home.journal.close(remove=True)
    assert Config.load(env={"PAGER_BOOKMARK_BATCH": "2"}).bookmark_batch == 2   # the setting the event names


@pytest.mark.parametrize("error", [ConnectionError("the provider is down"), TimeoutError("timed out after 60 s")])
def test_a_failing_memory_model_is_an_event_never_a_failed_turn(tmp_path, error):
    keeper = Keeper(fail=error)
    home = home_with(tmp_path, keeper, budget=2048)
    s = told(home, upto=40)
    events = []
    s.events.listeners.append(events.append)
    agent = Agent(s, HandlerModel(OfflineShell()))
    reply = agent.ask("What is my home city?")
    assert not reply.error and "Paris" in reply.text
    assert keeper.calls == 1 and str(error) in s.memory_error
    assert [e.kind for e in events].count("memory_error") == 1 and not any(e.kind == "writer_error" for e in events)
    assert s.turn_count == 42 and len(s.facts) == 0        # every turn kept; the batch keeps its offline keywords
    home.journal.close(remove=True)


def test_a_session_with_a_memory_model_replays_exactly_without_it(tmp_path):
    path = tmp_path / "memory.jsonl"
    keeper = Keeper()
    record(path, [{"speaker": "Maya", "text": t, "ts": 1_700_000_000 + 86_400 * i} for i, t in enumerate(TALK)],
           ["Where does Maya live now?", "What was the project deadline before?", "My home city is Lyon."],
           Config(budget=2048, session="memory", embedder="hash", memory_model="pager/keeper", bookmark_batch=4),
           "a memory model, scripted", writer=MemoryWriter(HandlerModel(keeper, "pager/keeper"), 4))
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert keeper.calls >= 2 and "facts_written" in kinds and "state_written" in kinds and "bookmarks_written" in kinds
    assert kinds.count("fact") == 7
    keeper.fail = AssertionError("replay called the memory model")
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence.describe()
    assert sum(1 for e in run.events if e["kind"] == "fact") == 7
    assert [e["value"] for e in run.events if e["kind"] == "state" and e["key"] == "home city"] == ["Paris", "Berlin", "Lyon"]


def test_one_setting_selects_the_memory_model(tmp_path):
    assert Config.load(env={"PAGER_MEMORY_MODEL": "gpt-4o-mini"}).writer_model == "gpt-4o-mini"
    assert Config.load(env={"PAGER_BOOKMARK_MODEL": "a"}, memory_model="a").writer_model == "a"
    with pytest.raises(ConfigError, match="--memory-model"):
        Config(bookmark_model="a", memory_model="b")


def test_the_timeline_shows_the_tiers_as_lanes(tmp_path):
    from pager import timeline

    path = tmp_path / "memory.jsonl"
    record(path, [{"speaker": "Maya", "text": t, "ts": 1_700_000_000 + 86_400 * i} for i, t in enumerate(TALK)],
           ["Where does Maya live now?", "My home city is Lyon.", "What is my home city?"],
           Config(budget=2048, session="memory", embedder="hash", memory_model="pager/keeper", bookmark_batch=4,
                  live_summaries=False),   # the tiers this model writes; no summaries, so no lane for them
           "a memory model, scripted", writer=MemoryWriter(HandlerModel(Keeper(), "pager/keeper"), 4))
    made = timeline.write(path, tmp_path / "t.html")
    page = (tmp_path / "t.html").read_text()
    assert made.tiers["facts"] == 7 and made.tiers["superseded"] == 3 and made.tiers["ended"] == 1
    assert made.tiers["state changes"] == 8 and made.tiers["summaries"] == 0    # 7 by the model, Lyon by the shell
    for lane in ("state", "facts"):
        assert f'data-lane="{lane}"' in page
    assert 'data-lane="summaries"' not in page                                 # no lane for a tier that is empty
    for kind in ("set", "ends"):   # a column's mark takes the colour of its strongest change
        assert f'data-kind="{kind}"' in page, kind
    assert "f4 [home city]: Maya moved to Berlin; she lives near the river. (supersedes f1)" in page
    assert "home city = Lyon (change" in page and "7 facts · 3 superseded · 1 ended" in page
    # summaries (the summaries tier's `summary` events) get their own lane
    first = made.columns[0]
    events = [{"kind": "summary", "seq": 1, "summary": "s2", "type": "rolling", "key": "session", "version": 2,
               "pages": ["p1", "p9"], "turns": [1, 30], "follows": "s1"},
              {"kind": "summary_written", "seq": 2, "summaries": [{"text": "Maya moved."}]}]
    made.columns = [first]
    first.start, first.marks = 0, {}
    timeline._tier_marks(made, events, None)
    page = timeline.render(made)
    assert 'data-lane="summaries"' in page and made.tiers["summaries"] == 2 and "s2 rolling session v2, p1–p9" in page


def test_chat_and_ingest_take_the_memory_model_flag(tmp_path):
    from typer.testing import CliRunner

    from pager.cli.app import app
    from pager.llm import register

    runner = CliRunner()
    assert "--memory-model" in runner.invoke(app, ["chat", "--help"]).output
    register("keeper-cli", Keeper())        # served through litellm's route, as a provider's model would be
    env = {"PAGER_EMBEDDER": "hash"}
    home = str(tmp_path / "h")
    said = "".join(t + "\n" for t in TALK[:50])
    result = runner.invoke(app, ["--home", home, "chat", "-s", "x", "--budget", "2048", "--memory-model",
                                 "pager/keeper-cli"], input=said + "/state\n/quit\n", env=env)
    assert result.exit_code == 0, result.output
    assert "memory model: add home city: Maya lives in Paris." in result.output
    assert "memory model: update f1: Maya moved to Berlin" in result.output
    conv = tmp_path / "conv.jsonl"
    conv.write_text("".join(json.dumps({"speaker": "Maya", "text": t}) + "\n" for t in TALK))
    result = runner.invoke(app, ["--home", home, "ingest", str(conv), "-s", "moves", "--memory-model",
                                 "pager/keeper-cli"], env=env)
    assert result.exit_code == 0, result.output
    assert "facts written, " in result.output
    looked = json.loads(runner.invoke(app, ["--home", home, "inspect", "-s", "moves", "--json"], env=env).output)
    assert [f["text"] for f in looked["facts"] if f["subject"] == "home city"][-1].startswith("Maya moved to Berlin")
    assert looked["state"]["home city"]["value"] == "Berlin" and "medication dose" not in looked["state"]


def test_the_demos_recorded_facts_are_what_its_script_writes_for_its_conversation():
    from pager.data.demo_script import build, memory
    from pager.demo import conversation_path, recorded_memory

    rows = build()
    shipped = [json.loads(line) for line in conversation_path().with_name("demo_memory.jsonl").read_text().splitlines()]
    assert shipped == memory(rows)
    for fact in shipped:       # each names the turn that says it
        said = rows[fact["turns"][0] - 1]["text"]
        assert set(re.findall(r"\d+(?:[,:]\d+)*", fact["text"])) <= set(re.findall(r"\d+(?:[,:]\d+)*", said)), (fact, said)
    assert len(recorded_memory().facts) == len(shipped)


def test_a_provider_that_times_out_is_a_memory_error_in_the_chat(tmp_path):
    from typer.testing import CliRunner

    from pager.cli.app import app
    from pager.llm import litellm, register

    def slow(messages, tools):
        raise litellm().Timeout("the provider took too long", model="pager/slow", llm_provider="pager")

    register("slow", slow)
    said = "".join(t + "\n" for t in TALK[:30]) + "What is my home city?\n/quit\n"
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "chat", "-s", "x", "--budget", "2048",
                                      "--memory-model", "pager/slow"], input=said, env={"PAGER_EMBEDDER": "hash"})
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "memory_error: pager/slow: still failing after 2 tries" in out
    assert "pager> From the state: “home city: Paris" in out      # the turn after it is answered all the same
