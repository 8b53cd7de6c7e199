"""A reranker reorders the page search's best pieces and the best facts for a message: what it
prefers reaches a small budget that pager's own ranking leaves it out of; its failures are events and
the context is then pager's own; its answers are in the trace, so replay reproduces a session with
one without calling it."""

import json
import types

import pytest

from pager import llm
from pager.bench.record import record
from pager.config import Config
from pager.context import build
from pager.embed import HashEmbedder
from pager.errors import ConfigError
from pager.facts import Draft
from pager.home import Home
from pager.rerank import LiteLLMReranker
from pager.replay import replay
from pager.store import MemoryStore

QUESTION = "What outdoor activities does John enjoy?"
# facts sharing the question's words, and the one that answers it sharing none of them
DISTRACTORS = [f"John enjoys the activities of club {i}, indoor ones mostly, and does them every week." for i in range(40)]
ANSWER = "John started surfing five years ago and rides the waves off the north coast whenever the swell is up."
# the turn the answer came from amid the others: on neither the first page nor the open one, always in view
TALK = [{"speaker": "John", "text": f"Club {i} news: {text}"} for i, text in enumerate(DISTRACTORS)]
TALK.insert(20, {"speaker": "John", "text": "I took up a board sport at the beach a while ago."})
FACTS = ([Draft(f"club {i}", text, (i + 1 + (i >= 20),)) for i, text in enumerate(DISTRACTORS)]
         + [Draft("sport", ANSWER, (21,))])


class Scripted:
    """A reranker that knows surfing is an outdoor activity: it scores the texts naming it first."""

    name = "script/rerank"

    def __init__(self, fail: Exception | None = None, count: int = 0):
        self.calls, self.fail, self.count = 0, fail, count

    def scores(self, query, documents):
        self.calls += 1
        if self.fail is not None:
            raise self.fail
        out = [1.0 if "surfing" in d or "board sport" in d else 0.0 for d in documents]
        return out[:self.count] if self.count else out


def surfer(tmp_path, using=None, **kw):
    # the pages' keywords as this scene was set: with words first, every club page is also bookmarked
    # "enjoys" (a number on it lets its short words in), which the question's "enjoy" matches, and the
    # order of those equal pages decides whether the beach turn's page is paged in by chance
    config = Config(home=tmp_path / "h", budget=1024, embedder="hash", fill=False, words_first=False, **kw)
    home = Home(config, store=MemoryStore(), embedder=HashEmbedder(), durable=False)
    if using is not None:
        home.reranker = using
    s = home.open("john")
    s.append_many(TALK)
    s.add_facts(FACTS, "script")
    return home, s


def built(s) -> tuple:
    """The context for QUESTION at 1,024 tokens, and the events its making emitted."""
    events: list = []
    s.events.listeners.append(events.append)
    return build(s, QUESTION, chat=False), events


def shown(s, ctx) -> list[str]:
    return [s.facts.items[n - 1].text for n in ctx.facts]


def test_a_fact_the_reranker_prefers_reaches_a_budget_the_ranking_leaves_it_out_of(tmp_path):
    home, s = surfer(tmp_path / "plain")
    ctx = build(s, QUESTION, chat=False)
    assert ANSWER not in shown(s, ctx) and "board sport" not in ctx.memory, "the ranking by words must miss it here"
    home.journal.close(remove=True)

    reranker = Scripted()
    home, s = surfer(tmp_path / "reranked", reranker, reranker="script/rerank", rerank_pieces=0, rerank_facts=60)
    ctx, events = built(s)
    assert ANSWER in shown(s, ctx) and "board sport" not in ctx.memory, "told by its fact, not by its page"
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 1024
    (asked,) = [e for e in events if e.kind == "facts_reranked"]
    assert asked.data["model"] == "script/rerank" and asked.data["message"] == QUESTION
    assert s.facts.items[asked.data["order"][0] - 1].text == ANSWER
    assert sorted(asked.data["order"]) == sorted(asked.data["facts"]) and len(asked.data["facts"]) == 41
    build(s, QUESTION, chat=False)   # an agent's next step assembles the same message again
    assert reranker.calls == 1, "the answer for a message and its candidates is asked once"
    home.journal.close(remove=True)


def test_a_turn_the_reranker_prefers_among_the_searchs_pieces_reaches_the_context(tmp_path):
    reranker = Scripted()
    home, s = surfer(tmp_path, reranker, reranker="script/rerank", rerank_pieces=100, rerank_facts=0)
    ctx, events = built(s)
    (asked,) = [e for e in events if e.kind == "pieces_reranked"]
    page, place = asked.data["order"][0]
    assert s.pages[page].spans[place][0] == 21, "the beach turn's piece goes first"
    assert sorted(map(tuple, asked.data["order"])) == sorted(map(tuple, asked.data["pieces"]))
    # its piece now has the search's best score: its page is paged in, or its fact ranks first
    assert "board sport" in ctx.memory or ANSWER in shown(s, ctx)
    assert ctx.tokens["memory"] == s.tokenizer.count(ctx.memory) <= 1024
    assert not [e for e in events if e.kind == "facts_reranked"], "rerank_facts 0: the facts keep pager's order"
    home.journal.close(remove=True)


def test_only_the_candidates_are_reordered(tmp_path):
    reranker = Scripted()
    home, s = surfer(tmp_path, reranker, reranker="script/rerank", rerank_pieces=0, rerank_facts=5)
    _, events = built(s)
    (asked,) = [e for e in events if e.kind == "facts_reranked"]
    assert len(asked.data["facts"]) == 5
    assert all(s.facts.items[n - 1].text != ANSWER for n in asked.data["facts"]), \
        "the answer ranks below the first five: the reranker is not shown it"
    home.journal.close(remove=True)


@pytest.mark.parametrize("reranker", [Scripted(fail=ConnectionError("the rerank server is down")), Scripted(count=3)],
                         ids=["raises", "too-few-scores"])
def test_a_failing_reranker_is_an_event_and_the_context_is_pagers_own(tmp_path, reranker):
    home, s = surfer(tmp_path / "plain")
    plain = build(s, QUESTION, chat=False)
    home.journal.close(remove=True)
    home, s = surfer(tmp_path / "failing", reranker, reranker="script/rerank")
    ctx, events = built(s)
    assert ctx.memory == plain.memory and ctx.facts == plain.facts
    failed = [e for e in events if e.kind == "rerank_failed"]
    assert sorted(e.data["stage"] for e in failed) == ["facts", "pieces"]
    assert all(e.data["model"] == "script/rerank" and e.data["error"] for e in failed)
    assert not [e for e in events if e.kind in ("facts_reranked", "pieces_reranked")]
    home.journal.close(remove=True)


def recorded(tmp_path) -> tuple:
    """A trace of two questions to the offline agent on the surfer's session, with a scripted reranker."""
    path = tmp_path / "reranked.jsonl"
    reranker = Scripted()

    def setup(session, agent):
        session.home.reranker = reranker
        session.add_facts(FACTS, "script")

    record(path, TALK, [QUESTION, "Which clubs does John go to?"],
           Config(budget=1024, session="john", embedder="hash", reranker="script/rerank"), "a reranker", setup=setup)
    return path, reranker


def test_a_session_with_a_reranker_replays_exactly_without_calling_it(tmp_path):
    path, reranker = recorded(tmp_path)
    events = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = [e["kind"] for e in events]
    assert kinds.count("facts_reranked") == kinds.count("pieces_reranked") == 2 and reranker.calls == 4
    (start,) = [e for e in events if e["kind"] == "session_start"]
    assert start["config"]["reranker"] == "script/rerank"
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence and run.divergence.describe()
    assert reranker.calls == 4, "replay calls no reranker: the trace's answers are fed back"
    replayed = [e["kind"] for e in run.events]
    assert replayed.count("facts_reranked") == replayed.count("pieces_reranked") == 2


def test_the_litellm_reranker_orders_by_the_answers_indices(monkeypatch):
    asked = {}

    def rerank(**kw):
        asked.update(kw)
        return types.SimpleNamespace(results=[{"index": 2, "relevance_score": 0.9}, {"index": 0, "relevance_score": 0.4}])

    monkeypatch.setattr(llm, "litellm", lambda: types.SimpleNamespace(rerank=rerank))
    scores = LiteLLMReranker("cohere/rerank-english-v3.0").scores("q", ["a", "b", "c"])
    assert scores == [0.4, float("-inf"), 0.9], "a document the answer leaves out ranks last"
    assert asked["model"] == "cohere/rerank-english-v3.0" and asked["documents"] == ["a", "b", "c"]
    assert asked["top_n"] == 3
    monkeypatch.setattr(llm, "litellm", lambda: types.SimpleNamespace(
        rerank=lambda **kw: types.SimpleNamespace(results=[{"index": 7, "relevance_score": 1.0}])))
    with pytest.raises(ValueError, match="index 7 for 3 documents"):
        LiteLLMReranker("cohere/rerank-english-v3.0").scores("q", ["a", "b", "c"])


def test_a_negative_number_of_candidates_is_a_config_error():
    with pytest.raises(ConfigError, match="rerank_pieces -1 is negative"):
        Config(rerank_pieces=-1)


def test_a_local_rerank_server_reached_through_litellm_brings_the_answer(tmp_path, monkeypatch):
    """The whole way: litellm's `infinity/` provider posting to a rerank server on 127.0.0.1 (one that
    scores texts about surfing or a board sport first), as a user's own server would be reached."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    asked = []

    class Server(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            asked.append((self.path, body))
            results = [{"index": i, "relevance_score": float("surfing" in d or "board sport" in d)}
                       for i, d in enumerate(body["documents"])]
            out = json.dumps({"id": "r", "results": results}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Server)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("INFINITY_API_BASE", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        home, s = surfer(tmp_path, reranker="infinity/bge-reranker-base")
        events = []
        s.events.listeners.append(events.append)
        ctx = build(s, QUESTION, chat=False)
    finally:
        server.shutdown()
    assert not [e for e in events if e.kind == "rerank_failed"], [e.data for e in events if e.kind == "rerank_failed"]
    assert [path for path, _ in asked] == ["/rerank", "/rerank"], "the pieces, then the facts"
    assert asked[0][1]["model"] == "bge-reranker-base" and asked[0][1]["query"] == QUESTION
    assert ANSWER in shown(s, ctx) or "board sport" in ctx.memory
    home.journal.close(remove=True)


def test_the_timeline_has_a_lane_for_the_rerankers_answers(tmp_path):
    from pager import timeline

    path, _ = recorded(tmp_path)
    made = timeline.write(path, tmp_path / "t.html")
    page = (tmp_path / "t.html").read_text()
    assert made.tiers["reranker answers"] == 4 and made.tiers["reranker failures"] == 0
    assert 'data-lane="reranker"' in page and "4 reranker answers" in page
    first = [detail for kind, detail in made.columns[0].marks["reranker"]]
    assert any(d.startswith("script/rerank: 41 facts reordered, f41 first") for d in first), first
    assert len(made.columns[0].marks["reranker"]) == 2, "each question's answers mark the context they made"


def test_pager_search_says_when_the_reranker_failed_and_when_it_answered(maya, monkeypatch):
    from typer.testing import CliRunner

    from pager.cli.app import app

    def down(self, query, documents):
        raise ConnectionError("no rerank server on localhost:7997")

    monkeypatch.setattr(LiteLLMReranker, "scores", down)
    env = {"PAGER_EMBEDDER": "hash", "PAGER_RERANKER": "infinity/bge-reranker-base"}
    result = CliRunner().invoke(app, ["--home", str(maya), "search", "peanut allergy", "--session", "maya"], env=env)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "the reranker infinity/bge-reranker-base failed (ConnectionError: no rerank server" in said
    assert "unset PAGER_RERANKER" in said and "EpiPen" in said, "the pages are still listed, in pager's own order"

    monkeypatch.setattr(LiteLLMReranker, "scores", lambda self, query, documents: [float(len(d)) for d in documents])
    result = CliRunner().invoke(app, ["--home", str(maya), "search", "peanut allergy", "--session", "maya", "--json"],
                                env=env)
    assert json.loads(result.output)["reranker"] == {"model": "infinity/bge-reranker-base", "error": ""}
    plain = CliRunner().invoke(app, ["--home", str(maya), "search", "peanut allergy", "--session", "maya", "--json"],
                               env={"PAGER_EMBEDDER": "hash"})
    assert "reranker" not in json.loads(plain.output)


def test_the_repl_shows_the_rerankers_answers_and_its_failures(maya, monkeypatch):
    from typer.testing import CliRunner

    from pager.cli.app import app

    env = {"PAGER_EMBEDDER": "hash", "PAGER_RERANKER": "infinity/bge-reranker-base"}
    monkeypatch.setattr(LiteLLMReranker, "scores", lambda self, query, documents: [float(len(d)) for d in documents])
    result = CliRunner().invoke(app, ["--home", str(maya), "chat", "--session", "maya"],
                                input="What is Sam allergic to?\n", env=env)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "reranker: the search's" in said and "best pieces reordered" in said

    def down(self, query, documents):
        raise ConnectionError("no rerank server on localhost:7997")

    monkeypatch.setattr(LiteLLMReranker, "scores", down)
    result = CliRunner().invoke(app, ["--home", str(maya), "chat", "--session", "maya"],
                                input="What is Sam allergic to?\n", env=env)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "rerank_failed: ConnectionError: no rerank server on localhost:7997" in said
    assert "pager>" in said, "the reply comes all the same"
