"""The memory tiers' records (bookmarks, state, facts, summaries) written by one process reach the
others and replay exactly: a bookmark another process made is placed as its maker places it, the
records of a process that closed before another read them are taken in, and the pages a Toolkit or a
served session sealed after the memory model's last full batch are handed to it at close. Several
Homes in one process stand for processes of one home, as in tests/reliability/test_write_path.py."""

import json

from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.replay import replay
from pager.tools import Toolkit


QUIET = "ok that sounds fine to me, we can talk again later about it, number {}"   # a page with no keyword of its own


def _config(tmp_path, **kw) -> Config:
    return Config(home=tmp_path / "home", embedder="hash", page_tokens=128, session="s", **kw)


def test_a_bookmark_another_process_made_is_placed_as_its_maker_places_it_and_replays(tmp_path):
    """Process B bookmarks page p1 (the model's `bookmark` tool) while process A's Toolkit records a trace.
    Before: A took the bookmark in from B's journal behind the page's own keywords (B, and every process
    opening the session from the store, put a model's bookmark first), and wrote no event for it, so
    `pager replay --check` of A's trace diverged at A's next search (`bookmarks: zebra` recorded, not
    replayed); a bookmark B made before A's trace began was missing from its snapshot too."""
    config = _config(tmp_path)
    b = Home(config, embedder=HashEmbedder())
    sb = b.open("s")
    for i in range(30):
        sb.append("user", "Lisbon Porto Madrid Berlin Halvorsen contract " + QUIET.format(i))
    sb.bookmark([1], ["giraffe"], "before the trace")   # in B's journal only when A's trace begins
    a = Toolkit(config=config)
    assert a.session.directory.keywords(1)[0] == "giraffe"
    sb.bookmark([1], ["zebra"], "animals")
    found = a.call("search", json.dumps({"query": "Lisbon contract number 1", "k": 20}))
    assert "bookmarks: zebra, giraffe" in found, found   # the first four keywords of a page are shown
    with Home(config, embedder=HashEmbedder(), read_only=True) as c:   # what opening the session shows
        fresh = c.open("s").directory.keywords(1)
    assert a.session.directory.keywords(1) == fresh == sb.directory.keywords(1)
    assert fresh[:2] == ["zebra", "giraffe"]
    path = a._writer.path
    a.close()
    b.close()
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence


class Namer:
    """A scripted memory model: a bookmark for every page it is shown, and a fact and a state value for
    every line saying "the code of N is C"."""

    def __init__(self) -> None:
        self.pages: list[str] = []

    def __call__(self, messages, tools):
        import re

        prompt = messages[-1]["content"]
        shown = re.findall(r"^\[(p\d+)", prompt, re.M)
        self.pages += shown
        facts, state = [], []
        for turn, name, code in re.findall(r"^\(t(\d+)\) [^:]+: the code of (\w+) is (\w+)", prompt, re.M):
            facts.append({"op": "ADD", "subject": f"code of {name}", "text": f"The code of {name} is {code}.",
                          "turns": [int(turn)]})
            state.append({"op": "set", "key": f"code of {name}", "value": code})
        answer = {"bookmarks": {p: {"keywords": ["named"], "note": ""} for p in shown},
                  "facts": facts or [{"op": "NONE"}], "state": state}
        return {"content": json.dumps(answer)}


def _writer(namer: Namer):
    from pager.memory import MemoryWriter
    from pager.model import HandlerModel

    return MemoryWriter(HandlerModel(namer, "pager/namer"), 4)


def _codes(session, start: int, n: int) -> None:
    for i in range(start, start + n):
        session.append("user", f"the code of door{i} is c{i}x " + " ".join(f"filler{i}w{j}" for j in range(14)))
        session.write_memory()   # what the agent loop does after each reply: a full batch of sealed pages


def _named_in_store(config: Config) -> tuple[set[int], set[int], set[str]]:
    """The sealed pages, the pages the memory model named, and the subjects of the facts, as stored."""
    with Home(config, embedder=HashEmbedder(), read_only=True) as reader:
        pages, _ = reader.store.pages("", "s", with_vectors=False)
        named = {n for m in reader.store.bookmarks("", "s") if m.source == "writer" for n in m.pages}
        return {p.n for p in pages}, named, {f.subject for f in reader.store.facts("", "s")}


def test_a_toolkit_closed_with_fewer_sealed_pages_than_a_batch_hands_them_to_the_memory_model(tmp_path):
    """Before: the pages a Toolkit sealed after the memory model's last full batch were never given to it,
    not at close and not by any later process (which only names the pages it seals itself): their
    bookmarks, facts and state were lost without a word. `pager chat` named them at its end."""
    config = _config(tmp_path, memory_model="pager/namer", bookmark_batch=4)
    namer = Namer()
    t = Toolkit(config=config)
    t.home._writer = _writer(namer)
    for i in range(14):
        t.remember(f"the code of door{i} is c{i}x " + " ".join(f"filler{i}w{j}" for j in range(14)))
    sealed = set(t.session.pages)
    assert len(sealed) % 4, "the test needs a partial batch at close"
    t.close()
    stored, named, subjects = _named_in_store(config)
    assert stored == sealed and named == sealed, (sorted(sealed), sorted(named))
    held = {f"code of door{t - 1}" for n in sealed for t in _turns_of(config, n)}
    assert held <= subjects


def _turns_of(config: Config, n: int) -> tuple[int, ...]:
    with Home(config, embedder=HashEmbedder(), read_only=True) as reader:
        pages, _ = reader.store.pages("", "s", with_vectors=False)
        return next(p.turns for p in pages if p.n == n)


def test_a_served_session_closed_when_idle_hands_its_last_sealed_pages_to_the_memory_model(tmp_path):
    """`pager serve` closes a session idle for --idle seconds. Before, the pages it had sealed since the
    memory model's last full batch were dropped from its list and never named, by it or after it reopened
    the session: every idle close cost up to a batch of pages their bookmarks, facts and state. Now the
    idle close hands them to the memory worker and closes the session once they are named; what a server
    still owes when it stops is named by the next one to open the session."""
    from pager.engine import Engine

    config = _config(tmp_path, memory_model="pager/namer", bookmark_batch=4)
    namer = Namer()
    now = [0.0]
    engine = Engine(config, home=Home(config, embedder=HashEmbedder(), writer=_writer(namer)), idle_s=60,
                    clock=lambda: now[0], traces=True)
    engine.call(lambda: _codes(engine.open("", "s", trace=True), 0, 14), tenant="", name="s")
    assert engine.memory.idle(30)
    s = engine.home.sessions[("", "s")]
    sealed = set(s.pages)
    assert len(sealed) % 4 and s.unwritten, "the test needs a partial batch at close"
    now[0] = 120.0
    engine.call(lambda: None)   # any request closes what is idle: its last pages go to the memory model first
    assert engine.memory.idle(30)
    engine.call(lambda: None)   # and then the session
    assert ("", "s") not in engine.home.sessions
    engine.call(lambda: _codes(engine.open("", "s", trace=True), 14, 14), tenant="", name="s")
    assert engine.memory.idle(30)
    later = set(engine.home.sessions[("", "s")].pages)
    engine.close()   # leaves what it owes in the store, to be named by the next server
    stored, named, _ = _named_in_store(config)
    assert sealed <= named, sorted(sealed - named)
    assert stored == later and named < later
    again = Engine(config, home=Home(config, embedder=HashEmbedder(), writer=_writer(namer)), traces=True)
    again.call(lambda: again.open("", "s", trace=True), tenant="", name="s")
    assert again.memory.idle(30)
    again.close()
    stored, named, _ = _named_in_store(config)
    assert stored == later and named == later, sorted(later - named)
    traces = sorted((tmp_path / "home" / "traces").glob("*serve*.jsonl"), key=lambda p: p.stat().st_mtime)
    assert len(traces) == 3   # one per time the session was open; the model's answers at idle close in the first
    assert any('"kind":"facts_written"' in line for line in traces[0].read_text().splitlines()[-8:])
    for path in traces:
        run = replay(path, check=True)
        assert run.divergence is None, (path.name, run.divergence)


def test_tier_records_of_a_process_that_closed_before_another_read_them_reach_the_live_one(tmp_path):
    """Process B (a script) sets a state key, writes a fact, a summary and a bookmark, and closes, which
    flushes them and removes its journal segment, before process A (a Toolkit recording a trace, as `pager
    chat` or `pager serve` would be) next looks. Before: A read the journals only, found the segment gone
    and, no turn being new, never asked the store: its working state stayed empty in every later prompt,
    its facts, summaries and bookmarks too, until A itself wrote one of a kind."""
    from pager.facts import Draft
    from pager.summaries import Draft as SummaryDraft

    config = _config(tmp_path)
    a = Toolkit(config=config)
    for i in range(12):
        a.remember("Lisbon Porto Madrid Berlin Halvorsen contract " + QUIET.format(i))
    b = Home(config, embedder=HashEmbedder())
    sb = b.open("s")
    sb.set_state("home city", "Berlin")
    sb.add_facts([Draft("home city", "Maya lives in Berlin.", (3,))], "model")
    sb.add_summaries([SummaryDraft("episode", "e1", "Maya and the Halvorsen contract.", (1, 6))], "model")
    sb.bookmark([1], ["zebra"])
    b.close()
    block = a.context("What is my home city?", budget=2000)
    assert "home city: Berlin" in block, block
    s = a.session
    assert (s.state.values(), len(s.facts), len(s.summaries)) == ({"home city": "Berlin"}, 1, 1)
    assert s.directory.keywords(1)[0] == "zebra"
    assert "1 fact(s)" in a.facts("Berlin")
    path = a._writer.path
    a.close()
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence
