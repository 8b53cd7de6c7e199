"""The memory model off `pager serve`'s request path (pager/memory_worker.py): while it answers, other
sessions' chat calls and the same session's next turn go on; what it has not named survives a failed
call and a restart. The memory model is scripted and held on a threading.Event, never timed."""

from __future__ import annotations

import json
import re
import threading

from pager.config import Config
from pager.embed import HashEmbedder
from pager.engine import Engine
from pager.home import Home
from pager.memory import MemoryWriter
from pager.model import HandlerModel
from pager.replay import replay

from test_serve import Running, _traces

LONG = "the {} shelf holds the spare parts, and " + " ".join(f"word{i}" for i in range(60))


class HeldMemory:
    """A scripted memory model: a bookmark "named" for every page it is shown, once `release` is set;
    it says when a call began (`called`) and fails while `failing` holds an error."""

    def __init__(self, held: bool = True) -> None:
        self.called, self.release = threading.Event(), threading.Event()
        if not held:
            self.release.set()
        self.failing: Exception | None = None
        self.shown: list[str] = []

    def __call__(self, messages, tools):
        self.called.set()
        assert self.release.wait(60), "the test never released the memory model"
        if self.failing is not None:
            raise self.failing
        pages = re.findall(r"^\[(p\d+)", messages[-1]["content"], re.M)
        self.shown += pages
        return {"content": json.dumps({"bookmarks": {p: {"keywords": ["named"], "note": ""} for p in pages},
                                       "facts": [{"op": "NONE"}], "state": []})}


def _config(tmp_path) -> Config:
    return Config(home=tmp_path / "home", embedder="hash", memory_model="pager/held", bookmark_batch=1)


def _home(config: Config, model: HeldMemory) -> Home:
    return Home(config, embedder=HashEmbedder(), writer=MemoryWriter(HandlerModel(model, "pager/held"), 1))


def _chat(running: Running, session: str, text: str) -> str:
    with running.http() as http:
        r = http.post("/v1/chat/completions", json={"model": "offline", "messages": [{"role": "user", "content": text}]},
                      headers={"X-Pager-Session": session}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _held(engine: Engine, name: str, what):
    """what(session), read under the session's lock and the engine lock, as a request would."""
    with engine.using("", name):
        return what(engine.home.sessions[("", name)])


def test_chat_calls_of_other_sessions_and_the_next_turn_complete_while_the_memory_model_answers(tmp_path):
    config = _config(tmp_path)
    model = HeldMemory()
    running = Running(config.home, config=config)
    engine = running.server.engine
    engine.home._writer = MemoryWriter(HandlerModel(model, "pager/held"), 1)
    try:
        for i in range(3):
            _chat(running, "busy", LONG.format(i))   # seals pages: their batch goes to the memory model
            if model.called.is_set():
                break
        assert model.called.wait(30), "no page sealed, so the memory model was never asked"
        assert engine.memory.holds("", "busy")
        # the memory model is held mid-call: another session's chat call, and this session's next turn, are answered
        assert _chat(running, "other", "a quick question about nothing in particular")
        assert _chat(running, "busy", "and one more thing to remember")
        assert not model.release.is_set() and engine.memory.holds("", "busy")
        model.release.set()
        assert engine.memory.idle(30)
        named = _held(engine, "busy", lambda s: (s.unwritten, s.naming, s.directory.lookup("named")))
        assert named[0] == [] and named[1] == [] and named[2], named
    finally:
        model.release.set()
        running.stop()
    traces = _traces(config.home, "busy")
    kinds = [json.loads(line)["kind"] for line in traces[0].read_text().splitlines()]
    assert "bookmarks_written" in kinds and "memory_error" not in kinds
    run = replay(traces[0], check=True)   # the answers kept between turns are fed back where they came
    assert run.divergence is None, run.divergence.describe()


def _seal(engine: Engine, name: str, n: int, start: int = 0) -> None:
    """n long turns, each followed by what the agent loop does after a reply."""
    def turns():
        s = engine.open("", name, trace=True)
        for i in range(start, start + n):
            s.append("user", LONG.format(i))
            s.write_memory()

    engine.call(turns, tenant="", name=name)


def test_a_failed_memory_model_call_is_an_event_and_its_pages_are_named_by_a_later_one(tmp_path):
    config = _config(tmp_path)
    model = HeldMemory(held=False)
    model.failing = ConnectionError("the local model server is down")
    engine = Engine(config, home=_home(config, model))
    try:
        _seal(engine, "s", 3)
        assert engine.memory.idle(30)
        owed, error = _held(engine, "s", lambda s: (list(s.unwritten), s.memory_error))
        assert owed and "server is down" in error     # nothing named, nothing lost
        model.failing = None
        _seal(engine, "s", 2, start=3)                # another page sealed: the call is tried again
        assert engine.memory.idle(30)
        owed, named = _held(engine, "s", lambda s: (s.unwritten, set(s.directory.lookup("named"))))
        assert owed == [] and set(range(1, max(named) + 1)) <= named
    finally:
        engine.close()


def test_pages_a_stopped_server_owed_the_memory_model_are_named_by_the_next_one(tmp_path):
    config = _config(tmp_path)
    model = HeldMemory()
    engine = Engine(config, home=_home(config, model))
    _seal(engine, "s", 3)
    assert model.called.wait(30)
    sealed = _held(engine, "s", lambda s: set(s.pages))
    engine.close()          # does not wait for the model: the call under way is abandoned, its pages stay owed
    model.release.set()
    with Home(config, embedder=HashEmbedder(), read_only=True) as reader:
        assert set(reader.store.state("", "s")["unwritten"]) == sealed
        assert not reader.open("s").directory.lookup("named")
    working = HeldMemory(held=False)
    again = Engine(config, home=_home(config, working))
    try:
        again.call(lambda: again.open("", "s"), tenant="", name="s")   # opened: what it owes goes to the model
        assert again.memory.idle(30)
        assert _held(again, "s", lambda s: set(s.directory.lookup("named"))) == sealed
    finally:
        again.close()
    with Home(config, embedder=HashEmbedder(), read_only=True) as reader:
        assert "unwritten" not in reader.store.state("", "s")
        assert set(reader.open("s").directory.lookup("named")) == sealed


KILLED = """
import sys, threading
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.memory import MemoryWriter
from pager.model import HandlerModel

never = threading.Event()
def held(messages, tools):   # a memory model that never answers
    print("asked", flush=True)
    never.wait()

cfg = Config(home=sys.argv[1], embedder="hash", memory_model="pager/held", bookmark_batch=1, flush_turns=100_000)
home = Home(cfg, embedder=HashEmbedder(), writer=MemoryWriter(HandlerModel(held, "pager/held"), 1))
s = home.open("s")
s.append_many([{"speaker": "user", "text": sys.argv[2].format(i)} for i in range(4)])
s.write_memory()   # asks about the first sealed page and waits: killed meanwhile
"""


def test_pages_sealed_by_a_process_killed_while_the_memory_model_answered_are_named_after_it(tmp_path):
    """SIGKILL while the model is asked, before any flush: the turns are recovered from the journal, the
    pages sealed again from them, and the next engine to open the session names every one."""
    import signal
    import subprocess
    import sys

    config = _config(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(config.home), LONG], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "asked", proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    engine = Engine(config, home=_home(config, HeldMemory(held=False)))
    try:
        engine.call(lambda: engine.open("", "s"), tenant="", name="s")
        assert engine.memory.idle(30)
        sealed, named = _held(engine, "s", lambda s: (set(s.pages), set(s.directory.lookup("named"))))
        assert sealed and named == sealed
    finally:
        engine.close()
