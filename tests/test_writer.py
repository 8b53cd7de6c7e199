"""Bookmarks written by a model: parsed defensively, kept durably, replayed without the model."""

import json
import re

import pytest

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.agent import Agent
from pager.llm import LiteLLMModel, litellm, register
from pager.offline import OfflineShell
from pager.replay import replay
from pager.trace import TraceWriter, begin
from pager.writer import parse


@pytest.fixture(scope="module", autouse=True)
def providers():
    litellm()  # import once for the module (seconds)


class Librarian:
    """A scripted bookmark model: names the general thing a page is about, as a real model would."""

    CATEGORIES = {"puppy": ["dog", "pet"], "kickboxing": ["martial arts", "sport"], "tart": ["recipe", "dessert"]}

    def __init__(self, fail: bool = False) -> None:
        self.calls, self.fail = 0, fail

    def __call__(self, messages, tools):
        self.calls += 1
        if self.fail:
            raise RuntimeError("provider is down")
        prompt = messages[-1]["content"]
        answer = {}
        for pid, body in re.findall(r"^\[(p\d+)[^\]]*\]\n(.*?)(?=\n\n\[p\d+|\Z)", prompt, re.S | re.M):
            words = [w for key, ws in self.CATEGORIES.items() if key in body for w in ws]
            answer[pid] = {"keywords": words or ["chat"], "note": "what the page is about"}
        return {"content": "Here you go:\n" + json.dumps(answer)}


def home_with(tmp_path, librarian, name="librarian", **kw):
    register(name, librarian)
    cfg = Config(home=tmp_path / "home", budget=2048, page_tokens=128, embedder="hash",
                 bookmark_model=f"pager/{name}", bookmark_batch=4, **kw)
    return Home(cfg, embedder=HashEmbedder())


def chatter(s, n, start=0):
    for i in range(start, start + n):
        s.append("ann" if i % 2 else "maria", f"small talk {i} about the weather and the bus timetable")


def test_parse_keeps_only_valid_keywords_of_pages_asked_about():
    wanted = {"p1": 1, "p2": 2}
    reply = 'Sure!\n{"p1": {"keywords": ["dog", "pet", "dog", 7, "' + "x" * 60 + '"], "note": "Coco  the puppy"},' \
            ' "p9": {"keywords": ["not asked"]}, "P2": {"keywords": "book, novel"}, "p3": "nonsense"}'
    marks = parse(reply, wanted)
    assert [(m.page, m.keywords, m.note) for m in marks] == [(1, ("dog", "pet"), "Coco the puppy"),
                                                               (2, ("book", "novel"), "")]
    assert parse("no JSON here", wanted) == []
    assert parse('{"p1": {"keywords": [', wanted) == []
    assert parse('["p1", "dog"]', wanted) == []


def test_the_model_names_what_offline_keywords_cannot_and_search_finds_it(tmp_path):
    librarian = Librarian()
    with home_with(tmp_path, librarian) as home:
        s = home.open("a")
        chatter(s, 30)
        s.append("maria", "Guess what - I got a puppy two weeks ago! Her name's Coco.")
        chatter(s, 30, start=30)
        holder = next(n for n, p in s.pages.items() if "Coco" in p.text)
        assert "pet" not in [k.lower() for k in s.directory.keywords(holder)]
        assert s.write_bookmarks() and librarian.calls >= 1
        s.write_bookmarks(force=True)
        assert not s.unwritten
        assert holder in s.directory.lookup("pets")          # plural query, singular keyword
        hit = s.search("What pets does Maria have?", k=3)[0]
        assert hit.n == holder and "bookmark" in hit.signals
    # durable: another process (here a new Home) sees the model's bookmarks
    with Home(Config(home=tmp_path / "home", budget=2048, page_tokens=128, embedder="hash"),
              embedder=HashEmbedder()) as again:
        assert holder in again.open("a").directory.lookup("dog")


def test_batches_wait_until_full_unless_forced(tmp_path):
    librarian = Librarian()
    with home_with(tmp_path, librarian) as home:
        s = home.open("a")
        chatter(s, 20)
        sealed = len(s.unwritten)
        assert 0 < sealed < 4
        assert s.write_bookmarks() == [] and librarian.calls == 0
        assert len(s.write_bookmarks(force=True)) == sealed and librarian.calls == 1
        assert all(s.directory.keywords(n)[0] == "chat" for n in s.pages)   # the model's words come first


def test_a_failing_model_leaves_offline_keywords_and_no_exception(tmp_path):
    librarian = Librarian(fail=True)
    with home_with(tmp_path, librarian, name="down") as home:
        s = home.open("a")
        events = []
        s.events.listeners.append(events.append)
        chatter(s, 40)
        before = {n: list(s.directory.keywords(n)) for n in s.pages}
        assert s.write_bookmarks(force=True) == []
        assert "provider is down" in s.writer_error
        assert [e.kind for e in events].count("writer_error") == 1
        assert all(s.directory.keywords(n) == before[n] for n in before)
        s.append("ann", "still working")   # the session goes on
        assert s.turn_count == 41


def test_a_chat_trace_with_written_bookmarks_replays_without_calling_the_model(tmp_path):
    librarian = Librarian()
    register("offline", OfflineShell())
    path = tmp_path / "writer.jsonl"
    with home_with(tmp_path, librarian) as home:
        s = home.open("a")
        trace = TraceWriter(path, note="bookmark writer")
        s.events.listeners.append(trace)
        begin(s, "pager/offline", 2048)
        agent = Agent(s, LiteLLMModel("pager/offline"))
        agent.ask("I got a puppy last week! Her name is Coco.")
        for i in range(30):
            agent.ask(f"note {i}: the bus timetable changed again on line {i}")
        agent.ask("What pets do I have?")
        trace.close()
        holder = next(n for n, p in s.pages.items() if "Coco" in p.text)
        assert s.table[holder].resident
    events = [json.loads(line) for line in path.read_text().splitlines()]
    autopaged = [e for e in events if e["kind"] == "search" and e["query"] == "What pets do I have?"][0]
    first = autopaged["results"][0]
    assert first["page"] == f"p{holder}" and "bookmark" in first   # found through the model's "pet" bookmark
    calls = librarian.calls
    assert calls >= 2        # the agent asked the writer each time a batch of pages had sealed
    kinds = [json.loads(line)["kind"] for line in path.read_text().splitlines()]
    assert kinds.count("bookmarks_written") == calls
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence
    assert librarian.calls == calls


def test_chat_and_ingest_with_a_bookmark_model(tmp_path):
    from typer.testing import CliRunner

    from pager.cli.app import app

    register("librarian-cli", Librarian())
    env = {"PAGER_EMBEDDER": "hash", "PAGER_BOOKMARK_MODEL": "pager/librarian-cli"}
    lines = "".join(f"note {i}: the bus timetable changed on line {i}\n" for i in range(12))
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "chat", "-s", "x", "--budget", "2048"],
                                input="I got a puppy, her name is Coco.\n" + lines + "/quit\n", env=env)
    assert result.exit_code == 0, result.output
    assert "bookmark model: p1 (" in result.output        # shown as it happens, forced at /quit for the rest
    conv = tmp_path / "conv.jsonl"
    conv.write_text("".join(json.dumps({"speaker": "ann", "text": f"kickboxing class number {i} was tough"}) + "\n"
                            for i in range(40)))
    result = CliRunner().invoke(app, ["--home", str(tmp_path / "h"), "ingest", str(conv), "-s", "gym"], env=env)
    assert result.exit_code == 0, result.output
    assert "pages bookmarked by pager/librarian-cli" in result.output
    with Home(Config(home=tmp_path / "h", embedder="hash"), embedder=HashEmbedder()) as home:
        s = home.open("gym")
        assert s.directory.lookup("martial arts") == set(s.pages)


def test_the_benchmark_measures_a_bookmark_model_once_per_conversation(tmp_path):
    from pager.bench.locomo import run

    librarian = Librarian()
    register("librarian-bench", librarian)
    things = ["kettle", "bike", "lamp", "scarf", "laptop", "teapot", "rug", "clock", "tent", "drill"]
    chatter = [{"speaker": "Maria", "dia_id": f"D1:{j + 1}",
                "text": f"Guess what, I got a new {things[j % 10]}! Her name is Unit{j}."} for j in range(200)]
    chatter[20] = {"speaker": "Maria", "dia_id": "D1:21", "text": "Guess what, I got a new puppy! Her name is Coco."}
    sample = {"sample_id": "tiny", "conversation": {"speaker_a": "Maria", "speaker_b": "John",
                                                    "session_1_date_time": "1:56 pm on 8 May, 2023",
                                                    "session_1": chatter},
              "qa": [{"question": "What pets does Maria have?", "category": 4, "evidence": ["D1:21"]}]}
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps([sample]))
    offline = run(data, [1024, 2048], Config(embedder="hash"), baselines=False, progress=False)
    config = Config(embedder="hash", bookmark_model="pager/librarian-bench")
    one_budget = run(data, [2048], config, baselines=False, progress=False)
    calls = librarian.calls
    with_model = run(data, [1024, 2048], config, baselines=False, progress=False)
    assert librarian.calls == 2 * calls       # written once per conversation, reused for the other budget
    assert with_model["bookmark_model"] == "pager/librarian-bench" and with_model["bookmark_model_errors"] == []
    assert [r["pager"]["recall"] for r in offline["results"]] == [0.0, 0.0]   # "pets" never meets "puppy"
    assert [r["pager"]["recall"] for r in with_model["results"]] == [1.0, 1.0]
    assert one_budget["results"][0]["pager"]["recall"] == 1.0


def test_the_toolkit_names_pages_that_other_agents_remember(tmp_path):
    from pager.tools import Toolkit

    librarian = Librarian()
    register("librarian-kit", librarian)
    config = Config(home=tmp_path / "kit", budget=2048, embedder="hash", bookmark_model="pager/librarian-kit",
                    bookmark_batch=2)
    kit = Toolkit(config=config)
    kit.call("remember", {"text": "Our new puppy Coco chewed the sofa."})
    for i in range(30):
        kit.call("remember", {"text": f"status line {i}: the build is green and the queue is empty"})
    assert librarian.calls >= 2
    found = kit.call("search", {"query": "pet", "k": 1})
    assert "Coco" in found
    kit.close()


def test_a_bookmark_model_without_its_key_is_one_line_and_nothing_is_ingested(tmp_path):
    import os
    import subprocess
    import sys

    conv = tmp_path / "c.jsonl"
    conv.write_text("".join(json.dumps({"speaker": "ann", "text": f"line {i}"}) + "\n" for i in range(30)))
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")} | {"PAGER_EMBEDDER": "hash"}
    home = str(tmp_path / "h")
    out = subprocess.run([sys.executable, "-m", "pager.cli", "--home", home, "ingest", str(conv), "-s", "t",
                          "--bookmark-model", "gpt-4o-mini"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [out.stderr.strip()] and "OPENAI_API_KEY" in out.stderr
    assert "--bookmark-model" in out.stderr
    seen = subprocess.run([sys.executable, "-m", "pager.cli", "--home", home, "inspect", "-s", "t", "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert seen.returncode == 1 and "no session 't'" in seen.stderr   # nothing was ingested
