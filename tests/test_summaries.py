"""Summaries: an episode summary and a rolling one, each covering a page range; a new summary of a
key is its next version and the old one stays; episodes end at a new day, a long silence or a topic
shift; the extractive producer invents no text; the summaries region holds the budget whatever
the summaries' sizes; replay is exact without calling a producer; a failing producer loses no turn;
summaries are durable across homes, recovered from a dead one's journal, and reloaded."""

import json

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from pager.bench.record import record
from pager.config import CHAT_FLOOR, Config
from pager.context import EXCERPTS_TITLE, build, render_map
from pager.embed import HashEmbedder
from pager.home import Home
from pager.replay import replay
from pager.store import MemoryStore
from pager.summaries import EPISODE, ROLLING, Draft, Extractive, Recorded, sentences
from pager.views import inspect_json, tier_hits
from typer.testing import CliRunner
from pager.cli.app import app
from conftest import ENV

pytestmark = pytest.mark.smoke   # in the one-minute subset: pytest -m smoke

DAY = 86_400
T0 = 1_700_000_000

# three days of talk: a trip, a garden, a job; each day one episode
DAYS = [
    [("Ana", "We booked the trip to Lisbon for June. The flights leave on the third."),
     ("Ben", "Lisbon in June sounds lovely. Did you book a hotel near the river?"),
     ("Ana", "Yes, a small hotel in Alfama. The trip lasts ten days."),
     ("Ben", "Take the tram to Belem, the pastries there are famous.")],
    [("Ana", "I planted tomatoes and basil in the garden this morning."),
     ("Ben", "Your garden gets a lot of sun, the tomatoes will love it."),
     ("Ana", "The basil is for pesto. I also want to plant peppers next week."),
     ("Ben", "Water the tomatoes every evening when it is hot.")],
    [("Ana", "I start the new job at the library on Monday."),
     ("Ben", "Congratulations! Is the library far from your flat?"),
     ("Ana", "Twenty minutes by bike. The job is cataloguing old maps."),
     ("Ben", "Old maps at the library, that fits you perfectly.")],
]


def messages(days=DAYS):
    out = []
    for d, day in enumerate(days):
        for j, (speaker, text) in enumerate(day):
            out.append({"speaker": speaker, "text": text, "ts": T0 + d * DAY + 60 * j})
    return out


def home_for(tmp_path, **kw):
    config = Config(home=tmp_path / "h", **{"budget": 2048, "page_tokens": 64, "embedder": "hash", **kw})
    return Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)


def failing(session, pages):
    raise ConnectionError("the summary model's provider is down")


def test_an_episode_summary_covers_its_page_range(tmp_path):
    home = home_for(tmp_path)
    s = home.open("days")
    turns = s.append_many(messages())
    made = s.summarize(Recorded([("day 2", "Ana planted tomatoes and basil.", [f"t{n}" for n in range(5, 9)])],
                                {f"t{t.turn}": t.turn for t in turns}))
    assert len(made) == 1
    episode = made[0]
    assert (episode.kind, episode.key, episode.version, episode.turns) == (EPISODE, "day 2", 1, (5, 8))
    holding = sorted(n for n, p in s.pages.items() if {5, 6, 7, 8} & set(p.turns))
    holding += [s.tail_n] if any(p.turn.turn in range(5, 9) for p in s.packer.pieces) else []
    assert episode.pages == (holding[0], holding[-1])          # first page of its first turn … last of its last
    record = next(x for x in inspect_json(s)["summaries"] if x["id"] == episode.id)
    assert record["pages"] == [f"p{holding[0]}", f"p{holding[-1]}"] and record["current"]
    home.journal.close(remove=True)


def test_the_rolling_summary_gets_a_new_version_on_new_pages_and_the_old_one_stays(tmp_path):
    home = home_for(tmp_path)
    s = home.open("roll")
    s.append_many(messages(DAYS[:2]))
    first = [x for x in s.summarize(Extractive()) if x.kind == ROLLING]
    assert len(first) == 1 and first[0].version == 1 and first[0].turns == (1, 8)
    assert s.summarize(Extractive()) == [] or all(x.kind != ROLLING for x in s.summarize(Extractive()))  # nothing new
    s.append_many(messages(DAYS[2:]))
    second = [x for x in s.summarize(Extractive()) if x.kind == ROLLING]
    assert len(second) == 1 and second[0].version == 2 and second[0].turns == (1, 12)
    assert second[0].pages[1] >= first[0].pages[1] and second[0].pages[0] == 1
    versions = s.summaries.versions(ROLLING)
    assert versions == [first[0], second[0]] and s.summaries.rolling is second[0]   # nothing deleted
    listed = inspect_json(s)["summaries"]
    assert [x["current"] for x in listed if x["key"] == ROLLING] == [False, True]
    assert "library" in second[0].text.lower() or "job" in second[0].text.lower()   # what was new is in it
    home.journal.close(remove=True)


def test_episodes_end_at_a_new_day_a_silence_or_a_topic_shift():
    class T:
        def __init__(self, turn, text, ts, date):
            self.turn, self.speaker, self.text, self.ts, self.date = turn, "a", text, ts, date

    x = Extractive(gap_s=3600, window=2, min_turns=4)
    day = [T(i + 1, f"talk about boats and sails {i}", T0 + i, "1 May") for i in range(3)]
    assert [len(e) for e in x.episodes(day + [T(4, "boats again", T0 + 10, "2 May")])] == [3, 1]      # a new day
    assert [len(e) for e in x.episodes(day + [T(4, "boats again", T0 + 7200, "1 May")])] == [3, 1]   # a silence
    boats = [T(i + 1, f"boats sails harbour {i}", T0 + i, "1 May") for i in range(5)]
    cakes = [T(i + 6, f"cakes flour oven {i}", T0 + 5 + i, "1 May") for i in range(3)]
    assert [len(e) for e in x.episodes(boats + cakes)] == [5, 3]                                   # a topic shift
    assert [len(e) for e in x.episodes(boats[:3] + cakes)] == [6]   # too short an episode to cut


def test_extractive_episode_summaries_are_verbatim_sentences_of_their_episode(tmp_path):
    home = home_for(tmp_path)
    s = home.open("ex")
    s.append_many(messages())
    made = s.summarize(Extractive(per_episode=2))
    episodes = [x for x in made if x.kind == EPISODE]
    assert [x.turns for x in episodes] == [(1, 4), (5, 8)]       # the third day is still open
    for episode, day in zip(episodes, DAYS):
        said = {line for speaker, text in day for line in sentences(speaker, text)}
        picked = [line for line in said if line in episode.text]
        assert len(picked) == 2 and len(episode.text) == len(" ".join(picked))   # nothing but its own sentences
    again = s.summarize(Extractive(per_episode=2))
    assert [x for x in again if x.kind == EPISODE] == []          # an episode is summarized once
    assert Extractive()(s, sorted(s.pages) + [s.tail_n]) == Extractive()(s, sorted(s.pages) + [s.tail_n])
    home.journal.close(remove=True)


def test_summaries_are_searched_shown_in_their_region_and_the_rolling_one_in_the_map(tmp_path):
    home = home_for(tmp_path, budget=4096, summary_share=0.3)
    s = home.open("shown")
    s.append_many(messages())
    s.summarize(Extractive())
    ctx = build(s, "what did Ana plant in the garden?", chat=False)
    assert ctx.summaries and "[summaries" in ctx.memory
    shown = s.summaries.items[ctx.summaries[0] - 1]
    assert "tomatoes" in shown.text or "basil" in shown.text
    assert ctx.tokens.get("summaries", 0) == s.tokenizer.count(next(b for b in ctx.memory.split("\n\n")
                                                             if b.startswith("[summaries")) + "\n\n")
    assert "so far (s" in render_map(s, 384, [])                     # the rolling summary, in a roomy map
    assert "so far" not in render_map(s, 60, [])                      # and not in a small one
    kinds = {r["kind"] for r in tier_hits(s, "tomatoes garden")}
    assert "summary" in kinds
    home.journal.close(remove=True)


def test_a_failing_producer_loses_no_turn(tmp_path):
    home = home_for(tmp_path)
    s = home.open("down")
    events = []
    s.events.listeners.append(events.append)
    s.append_many(messages(DAYS[:1]))
    assert s.summarize(failing) == []
    assert "provider is down" in s.memory_error and [e.kind for e in events].count("memory_error") == 1
    assert s.turn_count == 4 and len(s.summaries) == 0
    s.append("Ana", "still here")
    assert s.turn_count == 5 and build(s, "trip?", chat=False).summaries == []
    home.journal.close(remove=True)


def test_a_session_with_summaries_replays_exactly_without_a_producer(tmp_path, monkeypatch):
    path = tmp_path / "summaries.jsonl"

    def with_summaries(session, agent):
        session.summarize(Extractive())

    record(path, messages(), ["What did Ana plant?", "Where is the new job?"],
           Config(budget=2048, page_tokens=64, session="sums", embedder="hash", summary_share=0.3),
           "summaries, no LLM", setup=with_summaries)
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    # two episodes and the rolling one by `summarize`; then the first question (asked today) closes the
    # third day's episode, summarized live (no new turn for the rolling one, which covers it already)
    assert kinds.count("summary") == 4 and kinds.count("summaries_written") == 2

    def no_producer(*a, **k):
        raise AssertionError("replay called a producer")

    for name in ("__call__", "after"):
        monkeypatch.setattr(Extractive, name, no_producer)
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence.describe()
    assert sum(1 for e in run.events if e["kind"] == "summary") == 4


def test_summaries_are_durable_across_homes_recovered_and_reloaded(tmp_path):
    config = Config(home=tmp_path / "h", budget=2048, page_tokens=64, embedder="hash")
    a, b = Home(config, embedder=HashEmbedder()), Home(config, embedder=HashEmbedder())
    sa, sb = a.open("days"), b.open("days")
    sa.append_many(messages())
    sa.add_summaries([Draft(EPISODE, "day 1", "Ana booked a trip to Lisbon.", (1, 4))], "script")
    sb.sync()
    assert [x.text for x in sb.summaries.items] == ["Ana booked a trip to Lisbon."]
    again = sb.add_summaries([Draft(EPISODE, "day 1", "Ana booked ten days in Lisbon, in Alfama.", (1, 4))], "script")
    assert [(x.n, x.version) for x in again] == [(2, 2)]       # numbered after a's, the key's next version
    b.close()
    dead = Home(config, embedder=HashEmbedder())
    dead.open("days").add_summaries([Draft(ROLLING, ROLLING, "Trip, garden, job.", (1, 12))], "script")
    dead.journal.close(remove=False)   # killed before any flush
    dead.leases.stop()   # and its lease thread dies with it
    a.close()
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("days")
        assert [(x.key, x.version) for x in s.summaries.items] == [("day 1", 1), ("day 1", 2), (ROLLING, 1)]
        assert s.summaries.current["day 1"].version == 2 and s.summaries.rolling.text == "Trip, garden, job."
        assert [x.n for x in home.store.summaries("", "days")] == [1, 2, 3]
    with Home(config, embedder=HashEmbedder(), read_only=True) as home:   # a read-only open (maybe a snapshot)
        assert len(home.open("days").summaries) == 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@example(texts=["0"] * 5 + ["0Ø𐀀", "0:0𐀀𒍀", "0ØØ𐀀𐀀", "0", "0", "0:0𐀀𒍀", "0:0ØØØØĒĒ𐀀𐀀𐀀"], budget=417, page_tokens=64,
         share=0.0, fact_share=0.3, question="0", chat=False)   # a leftover's facts block beside a full set of frames
@given(texts=st.lists(st.text(st.characters(codec="utf-8", exclude_categories=["Cs", "Cc"]), min_size=1, max_size=1500)
                      .filter(str.strip), min_size=1, max_size=12),
       budget=st.integers(min_value=400, max_value=6000), page_tokens=st.sampled_from([64, 128, 256]),
       share=st.sampled_from([0.0, 0.1, 0.3, 0.6]), fact_share=st.sampled_from([0.0, 0.3]),
       question=st.text(min_size=1, max_size=80).filter(str.strip), chat=st.booleans())
def test_regions_hold_the_budget_with_summaries_of_any_size(tmp_path_factory, texts, budget, page_tokens, share,
                                                            fact_share, question, chat):
    from pager.facts import Draft as FactDraft

    config = Config(home=tmp_path_factory.mktemp("s"), budget=max(budget, 2 * page_tokens + CHAT_FLOOR),
                    page_tokens=page_tokens, embedder="hash", summary_share=share, fact_share=fact_share)
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    s = home.open("p")
    turns = s.append_many([{"speaker": "ann", "text": f"turn {i} " + text[:300]} for i, text in enumerate(texts)])
    s.add_summaries([Draft(EPISODE if i % 3 else ROLLING, f"e{i}" if i % 3 else ROLLING, text,
                           (turns[0].turn, turns[i].turn)) for i, text in enumerate(texts)], "script")
    s.add_facts([FactDraft("s", text[:200], (turns[i].turn,)) for i, text in enumerate(texts)], "script")
    s.set_state("mood", texts[0][:300])
    prefix = "You are a careful assistant." if chat else ""
    ctx = build(s, question + " " + texts[-1][:50], prefix=prefix, chat=chat)
    if chat:
        recount = sum(4 + s.tokenizer.count(m["content"]) for m in ctx.messages()) + 3
    else:
        recount = s.tokenizer.count(ctx.memory)
    assert recount == ctx.tokens["total"] <= config.budget
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory)
    blocks = ctx.memory.split("\n\n")
    summary_blocks = [b for b in blocks if b.startswith("[summaries")]
    assert len(summary_blocks) == (1 if ctx.summaries else 0)
    summary_frames = -(-ctx.tokens.get("summaries", 0) // page_tokens)
    assert share or not ctx.summaries                            # no share, no region
    slabs = [b for b in blocks if b.startswith(("[facts]", EXCERPTS_TITLE))]
    slabs = slabs[: len(slabs) - ctx.filled]   # the leftover's blocks come last and take no frame
    assert len(ctx.pages) + len(slabs) + summary_frames <= max(1, (config.budget - config.map_reserve) // page_tokens)
    assert ctx.dropped == []
    home.journal.close(remove=True)


def test_the_journal_refuses_malformed_summaries():
    from pager import journal

    good = {"op": "summary", "user": "", "session": "s", "n": 1, "kind": "episode", "key": "day 1", "version": 1,
            "text": "Ana booked a trip.", "pages": [1, 2], "turns": [1, 4], "ts": 0.0, "date": "1 Jan 2024",
            "source": "script"}
    assert journal.valid(good) == ""
    assert journal.valid({**good, "version": 0})
    assert journal.valid({**good, "pages": [1]})
    assert journal.valid({**good, "text": " "})


def test_the_tiers_are_visible_in_search_inspect_the_repl_and_the_tools(tmp_path):
    from typer.testing import CliRunner

    from pager.cli.app import app
    from pager.facts import Draft as FactDraft
    from pager.tools import Toolkit

    config = Config(home=tmp_path / "h", budget=2048, page_tokens=64, embedder="hash", session="days")
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open()
        s.append_many(messages())
        s.add_facts([FactDraft("trip", "Ana's trip to Lisbon lasts ten days.", (3,)),
                     FactDraft("trip", "Ana's trip to Lisbon was cut to a week.", (12,))], "script")
        s.set_state("next trip", "Lisbon")
    env = {"PAGER_EMBEDDER": "hash"}
    runner = CliRunner()
    made = runner.invoke(app, ["--home", str(config.home), "summarize", "-s", "days"], env=env)
    assert made.exit_code == 0 and "3 new summaries" in made.output, made.output
    found = json.loads(runner.invoke(app, ["--home", str(config.home), "search", "Lisbon trip", "-s", "days", "--json"],
                                     env=env).output)
    assert {r["kind"] for r in found["results"]} == {"page"}
    kinds = {r["kind"] for r in found["tiers"]}
    assert kinds == {"fact", "summary", "state"}, found["tiers"]
    old = next(r for r in found["tiers"] if r["kind"] == "fact" and "ten days" in r["text"])
    assert old["superseded"] and old["superseded_by"] == "f2" and old["valid_to"] and old["date"]
    table = runner.invoke(app, ["--home", str(config.home), "search", "Lisbon trip", "-s", "days"],
                          env={**env, "COLUMNS": "250"}).output
    assert "superseded by f2" in " ".join(table.split()) and "summary" in table
    inspected = json.loads(runner.invoke(app, ["--home", str(config.home), "inspect", "-s", "days", "--json"],
                                         env=env).output)
    assert {"state", "facts", "summaries"} <= set(inspected) and len(inspected["summaries"]) == 3
    chat = runner.invoke(app, ["--home", str(config.home), "chat", "-s", "days", "--budget", "2048"],
                         input="/facts\n/facts Lisbon\n/summaries\n/summaries rolling\n/quit\n",
                         env={**env, "COLUMNS": "250"})   # wide enough that no table cell wraps
    out = " ".join(chat.output.split())
    assert chat.exit_code == 0 and "facts: 2, 1 superseded" in out and "superseded by f2" in out
    assert "summaries: 3 current" in out and "summary 'rolling': every version" in out
    with Toolkit(config=config, trace=False) as kit:
        assert "superseded by f2" in kit.facts("Lisbon") and kit.facts().startswith("2 fact(s), newest first")
        listed = kit.summaries()
        assert listed.startswith("rolling summary, version 1") and "the last 2 episode(s)" in listed
        assert "tomatoes" in kit.summaries("tomatoes garden") or "basil" in kit.summaries("tomatoes garden")


def test_the_extractive_rolling_summary_says_what_people_said_each_line_once(tmp_path):
    """The demo's rolling summary was two assistant sentences, each three times."""
    from pager.summaries import Extractive

    home = Home(Config(home=tmp_path / "h", embedder="hash"))
    s = home.open("roll")
    said = ["We picked the Yjs CRDT for the sync engine.", "Priya Raman accepted the senior SRE offer.",
            "Code freeze is on 30 September this year.", "I am training for the Berlin half marathon.",
            "Sam Okafor is allergic to peanuts, severely so.", "The design review moved to Wednesdays now."]
    for text in said * 2:
        s.append("maya", text)
        s.append("assistant", "Noted, and kept in the working state for you.", role="assistant")
    drafts = Extractive(rolling_sentences=4)(s, [p for p in range(1, s.tail_n + 1)])
    rolling = next(d for d in drafts if d.kind == "rolling")
    lines = rolling.text.split(" · ")
    assert len(lines) == len(set(lines)) == 4, rolling.text
    assert all(line.startswith("maya: ") for line in lines), rolling.text
    home.close()


runner = CliRunner()


def test_summaries_with_a_key_it_does_not_have_says_so(maya, tmp_path):
    """`/summaries nokey` printed an empty table, where `/state nokey` says the state has no such key and
    names its keys; the ids the table shows (s1, s2 …) were not taken either."""
    import shutil

    from conftest import chat

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    assert runner.invoke(app, ["--home", str(home), "summarize", "-s", "maya"], env=ENV).exit_code == 0
    out = " ".join(chat(home, ["/summaries nokey", "/summaries s1"]).split())
    assert "no summary has the key 'nokey'" in out and "rolling" in out, out
    assert "summary 'e1': every version" in out and " s1 " in out, out
