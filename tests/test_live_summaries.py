"""Summaries made during a live chat: when an episode closes (a new day, a long silence, a topic
shift), the agent loop writes its summary and the rolling summary's next version after the reply,
with the memory model in the call it makes for its batch of pages, else with the extractive
producer; a failing memory model loses no turn and the extractive producer writes them instead;
the session replays exactly from the trace without any producer; a setting turns it off."""

import json
import random
import re

import pytest

from pager.agent import Agent
from pager.config import Config
from pager.embed import HashEmbedder
from pager.errors import ConfigError
from pager.home import Home
from pager.memory import MemoryWriter, parse
from pager.model import HandlerModel
from pager.offline import OfflineShell
from pager.page import Page
from pager.replay import replay
from pager.store import MemoryStore
from pager.summaries import EPISODE, ROLLING, Draft, Episodes, Extractive, session_turns
from pager.trace import TraceWriter, begin

DAY = 86_400
T0 = 1_700_000_000

# what Ana tells the agent, three days of it: a trip, a garden, a job
DAYS = [
    ["We booked the trip to Lisbon for June. The flights leave on the third.",
     "Our hotel is a small place in Alfama near the river. The trip lasts ten days.",
     "I want to take the tram to Belem, the pastries there are famous."],
    ["I planted tomatoes and basil in the garden this morning.",
     "The basil is for pesto. I also want to plant peppers next week.",
     "The garden gets a lot of sun, I water the tomatoes every evening."],
    ["I start the new job at the library on Monday.",
     "The library is twenty minutes by bike. The job is cataloguing old maps."],
]


class Clock:
    def __init__(self) -> None:
        self.now = float(T0)

    def __call__(self) -> float:
        return self.now


class Scribe:
    """A scripted memory model: bookmarks for the pages shown and, when the prompt asks for
    summaries, one for each episode named and the rolling one."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.prompts: list[str] = []
        self.fail = fail

    def __call__(self, messages, tools):
        prompt = messages[-1]["content"]
        self.prompts.append(prompt)
        if self.fail:
            raise self.fail
        answer = {"bookmarks": {pid: {"keywords": ["talk"]} for pid in re.findall(r"^\[(p\d+)", prompt, re.M)},
                  "facts": []}
        asked = re.search(r"^Episodes: (.*)$", prompt, re.M)
        if asked:
            keys = re.findall(r"(e\d+) \(", asked.group(1))
            answer["summaries"] = {"episodes": {k: f"In {k} Ana told the agent about her day." for k in keys},
                                   "rolling": f"Ana talked with the agent over {len(keys)} more episode(s)."}
        return {"content": json.dumps(answer)}


def chat(tmp_path, trace=None, writer=None, **settings):
    """Ana's three days through the agent loop (offline shell), the clock moving a day between them."""
    clock = Clock()
    config = Config(home=tmp_path / "h", **{"budget": 2048, "page_tokens": 64, "embedder": "hash",
                                             "session": "days", "bookmark_batch": 2, **settings})
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), clock=clock, durable=False, writer=writer)
    s = home.open()
    events = []
    s.events.listeners.append(lambda e: events.append(e))
    if trace:
        s.events.listeners.append(TraceWriter(trace, note="a live chat across three days: summaries made as episodes close"))
    agent = Agent(s, HandlerModel(OfflineShell()), speaker="Ana")
    begin(s, "pager/offline", agent.budget)
    day_ends = []
    for d, day in enumerate(DAYS):
        for i, text in enumerate(day):
            clock.now = T0 + d * DAY + 60 * i
            assert not agent.ask(text).error
        day_ends.append(s.turn_count)
    return home, s, events, day_ends


def pages_of(s, first, last):
    held = {n for n, p in s.pages.items() for t, _, _ in p.spans if first <= t <= last}
    held |= {s.tail_n for p in s.packer.pieces if first <= p.turn.turn <= last}
    return min(held), max(held)


def test_a_live_chat_summarizes_each_episode_as_it_closes_and_the_rolling_summary_grows(tmp_path):
    home, s, events, ends = chat(tmp_path)
    episodes = [x for x in s.summaries.items if x.kind == EPISODE]
    # day 1 closed when the first message of day 2 came, day 2 on day 3; day 3 is still open
    assert [(x.key, x.turns) for x in episodes] == [("e1", (1, ends[0])), ("e7", (ends[0] + 1, ends[1]))]
    for x in episodes:
        assert x.pages == pages_of(s, *x.turns) and x.source == "extractive"
    assert "Lisbon" in episodes[0].text and ("tomatoes" in episodes[1].text or "basil" in episodes[1].text)
    versions = s.summaries.versions(ROLLING)
    assert [(v.version, v.turns) for v in versions] == [(1, (1, ends[0])), (2, (1, ends[1]))]
    assert versions[1].pages == pages_of(s, 1, ends[1])
    # made after the reply of the message that closed the episode, as trace events
    kinds = [e.kind for e in events]
    first_of_day2 = [i for i, e in enumerate(events) if e.kind == "user" and e.data["text"] == DAYS[1][0]][0]
    written = kinds.index("summaries_written")
    assert written > first_of_day2 and kinds[first_of_day2:written].count("model_reply") == 1
    assert kinds.count("summary") == 4 and "memory_error" not in kinds
    home.journal.close(remove=True)


def test_the_live_chat_replays_exactly_taking_the_recorded_summaries(tmp_path, monkeypatch):
    path = tmp_path / "live.jsonl"
    home, s, _, _ = chat(tmp_path, trace=path)
    home.journal.close(remove=True)
    made = [(x.key, x.version, x.text) for x in s.summaries.items]
    assert len(made) == 4

    def no_producer(*a, **k):
        raise AssertionError("replay ran a summary producer")

    for name in ("__call__", "closed", "after", "rolling"):
        monkeypatch.setattr(Extractive, name, no_producer)
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence.describe()
    replayed = [e for e in run.events if e["kind"] == "summary"]
    assert [(e["key"], e["version"]) for e in replayed] == [(k, v) for k, v, _ in made]


def test_with_a_memory_model_the_summaries_ride_on_its_batch_call(tmp_path, monkeypatch):
    scribe = Scribe()
    path = tmp_path / "scribe.jsonl"
    home, s, events, ends = chat(tmp_path, trace=path, memory_model="pager/scribe",
                                 writer=MemoryWriter(HandlerModel(scribe, "pager/scribe"), 2))
    asked = [p for p in scribe.prompts if "\nEpisodes: " in p]
    assert len(asked) == 2 and "Episodes: e1 (t1–t6)" in asked[0] and "Previous rolling summary: (none yet)" in asked[0]
    assert "Ana talked with the agent over 1 more episode(s)." in asked[1]   # the previous version, to update
    # no call of its own: each ask is the batch call, flushed early, bookmarks and summaries in one answer
    assert all("[p" in p for p in asked)
    sealed_calls = sum(1 for e in events if e.kind == "bookmarks_written")
    assert len(scribe.prompts) == sealed_calls
    episodes = [x for x in s.summaries.items if x.kind == EPISODE]
    assert [(x.key, x.turns, x.source) for x in episodes] == [("e1", (1, ends[0]), "model"),
                                                              ("e7", (ends[0] + 1, ends[1]), "model")]
    assert [x.source for x in s.summaries.versions(ROLLING)] == ["model", "model"]
    assert episodes[0].pages == pages_of(s, 1, ends[0])
    home.journal.close(remove=True)
    scribe.fail = AssertionError("replay called the memory model")
    monkeypatch.setattr(Extractive, "after", lambda *a, **k: pytest.fail("replay ran the extractive producer"))
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence.describe()


def test_a_failing_memory_model_loses_no_turn_and_the_extractive_producer_writes_the_summaries(tmp_path):
    scribe = Scribe(fail=ConnectionError("the provider is down"))
    home, s, events, ends = chat(tmp_path, memory_model="pager/scribe",
                                 writer=MemoryWriter(HandlerModel(scribe, "pager/scribe"), 2))
    assert s.turn_count == 2 * sum(len(d) for d in DAYS)                     # every message and reply kept
    assert "provider is down" in s.memory_error and any(e.kind == "memory_error" for e in events)
    assert [(x.key, x.source) for x in s.summaries.items if x.kind == EPISODE] == [("e1", "extractive"), ("e7", "extractive")]
    assert [x.version for x in s.summaries.versions(ROLLING)] == [1, 2]
    home.journal.close(remove=True)


def test_an_answer_that_leaves_a_summary_out_is_filled_by_the_extractive_producer(tmp_path):
    class Forgetful(Scribe):
        def __call__(self, messages, tools):
            reply = json.loads(super().__call__(messages, tools)["content"])
            reply.get("summaries", {}).pop("rolling", None)
            return {"content": json.dumps(reply)}

    home, s, events, _ = chat(tmp_path, memory_model="pager/scribe",
                              writer=MemoryWriter(HandlerModel(Forgetful(), "pager/scribe"), 2))
    assert [x.source for x in s.summaries.items if x.kind == EPISODE] == ["model", "model"]
    assert [x.source for x in s.summaries.versions(ROLLING)] == ["extractive", "extractive"]
    rejected = [r for e in events if e.kind == "memory_rejected" for r in e.data["rejected"]]
    assert "summaries.rolling: none given" in rejected
    home.journal.close(remove=True)


def test_a_setting_turns_live_summaries_off(tmp_path):
    home, s, events, _ = chat(tmp_path, live_summaries=False)
    assert len(s.summaries) == 0 and not any(e.kind == "summaries_written" for e in events)
    home.journal.close(remove=True)
    assert Config.load(env={"PAGER_LIVE_SUMMARIES": "0"}).live_summaries is False
    assert Config.load(env={"PAGER_LIVE_SUMMARIES": "on"}).live_summaries is True
    with pytest.raises(ConfigError, match="PAGER_LIVE_SUMMARIES=0"):
        Config.load(env={"PAGER_LIVE_SUMMARIES": "maybe"})


def test_summaries_parse_keeps_what_was_asked_and_says_what_is_wrong():
    from pager.memory import Asked

    page = Page("s", 3, "Ana: We went to Lisbon.", 8, ((7, 0, 23),), ((0, 23),))
    asked = Asked({"e1": (1, 7, 5.0)}, (1, 7, 5.0))
    reply = json.dumps({"summaries": {"episodes": {"e1": "Ana went to Lisbon.", "e9": "Not asked."},
                                      "rolling": "x" * 5000}})
    answer = parse(reply, [page], {}, asked)
    assert [(d.kind, d.key, d.turns) for d in answer.summaries] == [(EPISODE, "e1", (1, 7))]
    assert any("e9" in r for r in answer.rejected) and any("summaries.rolling: 5000 characters" in r for r in answer.rejected)
    assert parse('{"summaries": "all"}', [page], {}, asked).rejected == ["summaries: a str, not an object"]
    assert parse('{"summaries": {}}', [page], {}).summaries == []   # not asked: not read


def test_episodes_cut_one_turn_at_a_time_are_the_extractive_producers_episodes():
    from pager.page import Turn

    seed = random.randrange(10**6)
    rng = random.Random(seed)
    words = ["trip", "garden", "job", "maps", "river", "tomato", "bike", "hotel"]
    turns, ts = [], float(T0)
    for n in range(1, 400):
        ts += rng.choice([60, 60, 600, 3600, 8 * 3600, DAY])
        topic = words[(n // rng.randint(5, 30)) % len(words)]
        text = " ".join(rng.choice([topic, topic, rng.choice(words), "and", "the"]) for _ in range(rng.randint(1, 8)))
        turns.append(Turn("s", n, "Ana", text, "user", str(int(ts // DAY)), ts))
    rule = Extractive()
    cutter = Episodes(rule)
    closed = []
    for t in turns:
        closed += cutter.feed([t])
    whole = rule.episodes(turns)
    assert closed + cutter.rest() == whole, f"seed {seed}"
    assert len(closed) >= 10, f"seed {seed}"


# an ingested session: 4 turns on each of 3 days (3, 4 and 5 Nov 2026), then a chat on a later day
NOV3 = 1_793_700_000   # 3 Nov 2026, 10:00 UTC
INGESTED = [
    ["We compared Postgres and SQLite for the inventory service.",
     "Postgres wins for the inventory service because of concurrent writers.",
     "The migration scripts for Postgres go in the ops repository.",
     "Bruno will provision the Postgres cluster on Friday."],
    ["The frontend team chose Svelte for the dashboard rewrite.",
     "Svelte components for the dashboard need a design review.",
     "Carla owns the dashboard charts and the Svelte build.",
     "The dashboard rewrite ships before the holidays."],
    ["The quarterly budget review moved to Thursday afternoon.",
     "Finance wants the cloud budget split per team this quarter.",
     "The budget spreadsheet lives in the shared finance drive.",
     "Dara presents the budget numbers to the board."],
]


def said_on(day: int, text: str) -> bool:
    """Does a summary's text hold a line of that day's (verbatim, as the extractive producer keeps them)?"""
    return any(f"Ana: {line}" in text for line in INGESTED[day])


def ingested(tmp_path, session="live2"):
    clock = Clock()
    config = Config(home=tmp_path / "h", budget=2048, page_tokens=64, embedder="hash", session=session)
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), clock=clock, durable=False)
    s = home.open()
    s.append_many([{"speaker": "Ana", "text": text, "ts": NOV3 + d * DAY + 600 * i}
                   for d, day in enumerate(INGESTED) for i, text in enumerate(day)])   # ingested, not chatted
    clock.now = NOV3 + 20 * DAY
    return home, s


def test_the_first_live_use_summarizes_the_episodes_that_closed_before_the_chat(tmp_path):
    home, s = ingested(tmp_path)
    Agent(s, HandlerModel(OfflineShell()), speaker="Ana").ask("What database did we pick?")
    episodes = [(x.key, x.turns) for x in s.summaries.episodes()]
    assert episodes == [("e1", (1, 4)), ("e5", (5, 8)), ("e9", (9, 12))]   # the chat's own turns: still open
    rolling = s.summaries.rolling
    assert rolling.turns == (1, 12) and rolling.pages == pages_of(s, 1, 12)
    assert said_on(0, rolling.text) and said_on(2, rolling.text)     # day 1's and day 3's lines, as it claims
    # the same as `pager summarize` writes on an identical session
    _, twin = ingested(tmp_path / "twin")
    twin.append("Ana", "What database did we pick?", ts=NOV3 + 20 * DAY)
    twin.summarize(Extractive())
    assert [(x.key, x.turns) for x in twin.summaries.episodes()] == episodes
    assert twin.summaries.rolling.turns[0] == 1 and said_on(0, twin.summaries.rolling.text)
    home.journal.close(remove=True)


def test_a_rolling_version_covers_only_what_its_text_was_made_from(tmp_path):
    home, s = ingested(tmp_path)
    s.append("Ana", "What database did we pick?", ts=NOV3 + 20 * DAY)
    s.append("agent", "Postgres, for the inventory service.", role="assistant", ts=NOV3 + 20 * DAY + 1)
    # what an older pager's chat left: day 3's episode and a rolling summary of day 3 only
    day3 = " · ".join(f"Ana: {t}" for t in INGESTED[2][:2])
    s.add_summaries([Draft(EPISODE, "e9", day3, (9, 12)), Draft(ROLLING, ROLLING, day3, (9, 12))], "extractive")
    s.summarize(Extractive())   # adds e1 and e5, and the rolling summary's next version
    assert [(x.key, x.turns) for x in s.summaries.episodes()] == [("e1", (1, 4)), ("e5", (5, 8)), ("e9", (9, 12))]
    rolling = s.summaries.rolling
    assert rolling.version == 2 and rolling.turns == (1, 14)
    assert said_on(0, rolling.text) and said_on(1, rolling.text)
    # the live path, with a memory model or not, extends the same way: earlier episodes join the range
    home2, live = ingested(tmp_path / "live")
    live.add_summaries([Draft(EPISODE, "e9", day3, (9, 12)), Draft(ROLLING, ROLLING, day3, (9, 12))], "extractive")
    Agent(live, HandlerModel(OfflineShell()), speaker="Ana").ask("What database did we pick?")
    assert [x.key for x in live.summaries.episodes()] == ["e1", "e5", "e9"]
    assert live.summaries.rolling.turns == (1, 12) and said_on(0, live.summaries.rolling.text)
    home.journal.close(remove=True)
    home2.journal.close(remove=True)


def test_a_summary_never_quotes_the_offline_shells_replies(tmp_path):
    """A day of one message: the shell's reply ("Noted — … (offline memory shell: …)", or a quote of a
    page) is not what was said that day, so the episode's summary and the rolling one hold only Ana's."""
    clock = Clock()
    config = Config(home=tmp_path / "h", budget=2048, page_tokens=64, embedder="hash", session="short")
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), clock=clock, durable=False)
    s = home.open()
    agent = Agent(s, HandlerModel(OfflineShell()), speaker="Ana")
    for d, text in enumerate(["I start the new job at the library on Monday.",
                              "Where do I start the new job on Monday?",
                              "The garden gets a lot of sun this week."]):
        clock.now = T0 + d * DAY
        assert not agent.ask(text).error
    replies = [t.text for t in session_turns(s) if t.role == "assistant"]
    assert any("offline memory shell" in r for r in replies) and any(r.startswith("From p") for r in replies), replies
    summaries = [x.text for x in s.summaries.items]
    assert len(summaries) >= 3   # two closed days and the rolling summary
    for text in summaries:
        assert "offline memory shell" not in text and "From p" not in text and "from p" not in text, text
        assert "Ana: " in text
    home.journal.close(remove=True)
