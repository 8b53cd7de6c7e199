"""`import pager` for Python users: the public names, cheaply (the offline shell among them); a Toolkit
with typed methods that take the same path as `call`; conflicting arguments refused; a closed Toolkit or
Home refusing every call, naming the fix; one model protocol for the agent loop."""

from __future__ import annotations

import inspect
import json
from typing import get_type_hints

import pytest

from conftest import run_py, ENV
from pager.config import Config
from pager.errors import ConfigError, ToolError, PagerError, StoreError
from pager.tools import AGENT, Toolkit
import shutil
from typer.testing import CliRunner
from pager.cli.app import app
import pager

PUBLIC = ["Config", "Home", "Session", "build", "Toolkit", "Agent", "Model", "ModelReply", "PagerError",
          "ConfigError", "BudgetError", "InputError", "PageNotFound", "StoreError", "ModelError", "ToolError"]


def test_import_pager_is_cheap_and_gives_the_public_names():
    out = run_py("import sys, json, pager\n"
                 "heavy = lambda: sorted({m.split('.')[0] for m in sys.modules} & {'litellm', 'lancedb', 'numpy', 'mcp'})\n"
                 "before = heavy()\n"
                 f"names = {{n: getattr(pager, n).__module__ for n in {PUBLIC!r}}}\n"
                 "print(json.dumps([before, heavy(), names, pager.__all__]))")
    assert out.returncode == 0, out.stderr
    before, after, names, exported = json.loads(out.stdout)
    assert before == [], f"`import pager` imported {before}"
    assert "litellm" not in after and "lancedb" not in after, "the public names must not load a model or the store"
    assert names["Toolkit"] == "pager.tools.toolkit" and names["build"] == "pager.context"
    assert names["ToolError"] == "pager.errors" and names["Model"] == "pager.model"
    assert set(PUBLIC) <= set(exported)


def test_an_unknown_name_is_an_attribute_error():
    import pager

    with pytest.raises(AttributeError, match="no attribute 'Tolkit'"):
        pager.Tolkit  # noqa: B018


def test_readme_python_example_runs_from_the_top_level(tmp_path):
    import pager

    with pager.Home(pager.Config(home=tmp_path / "h", budget=2048, embedder="hash")) as home:
        session = home.open("work")
        assert isinstance(session, pager.Session)
        session.append("Maya", "We chose Yjs over OT for the sync engine.")
        context = pager.build(session, "what did we choose for sync?", prefix="You are helpful.")
        assert "Yjs" in context.messages()[0]["content"] and context.tokens["total"] <= 2048


# -- typed Toolkit methods ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", AGENT.names)
def test_each_tool_has_a_typed_method_with_the_tools_signature(name):
    tool, method = AGENT.functions[name], getattr(Toolkit, name)
    tool_params = list(inspect.signature(tool).parameters.values())[1:]     # after the injected session
    method_params = list(inspect.signature(method).parameters.values())[1:]  # after self
    assert [(p.name, p.default) for p in method_params] == [(p.name, p.default) for p in tool_params]
    tool_hints, method_hints = get_type_hints(tool), get_type_hints(method)
    assert all(method_hints[p.name] == tool_hints[p.name] for p in tool_params)


def _script(kit, typed: bool):
    """The same work, once with typed methods and once with `call` as a model would send it."""
    if typed:
        for i in range(30):
            kit.remember(f"note {i}: the Zeta{i % 4} build needs flag {i * 3}", role="assistant" if i % 3 else "user")
        kit.remember("The vault code for the Oslo office is 7731.", speaker="maya")
        yield kit.search("Oslo vault code", k=3)
        yield kit.page_out("p1")
        yield kit.page_in("p1")
        yield kit.bookmark(["p1"], ["vault"], note="codes")
        yield kit.pin("p2")
        yield kit.unpin("p2")
        yield kit.context("Oslo vault", budget=900)
        with pytest.raises(ToolError, match="page 'p99999' does not exist"):
            kit.page_in("p99999")
        with pytest.raises(ToolError, match="k must be a whole number"):
            kit.search("x", k="many")  # type: ignore[arg-type]
    else:
        for i in range(30):
            kit.call("remember", {"text": f"note {i}: the Zeta{i % 4} build needs flag {i * 3}",
                                  **({"role": "assistant"} if i % 3 else {})})
        kit.call("remember", {"text": "The vault code for the Oslo office is 7731.", "speaker": "maya"})
        yield kit.call("search", {"query": "Oslo vault code", "k": 3})
        yield kit.call("page_out", {"page_id": "p1"})
        yield kit.call("page_in", {"page": "p1"})
        yield kit.call("bookmark", {"page_ids": ["p1"], "keywords": ["vault"], "note": "codes"})
        yield kit.call("pin", {"page_id": "p2"})
        yield kit.call("unpin", {"page_id": "p2"})
        yield kit.call("context", {"query": "Oslo vault", "budget": 900})
        assert "page 'p99999' does not exist" in kit.call("page_in", {"page": "p99999"})
        assert "k must be a whole number" in kit.call("search", {"query": "x", "k": "many"})


def _events(tmp_path, typed: bool):
    kit = Toolkit(config=Config(home=tmp_path / ("typed" if typed else "call"), session="agent", embedder="hash",
                                budget=2048))
    events = []
    kit.session.events.listeners.append(lambda e: events.append({"kind": e.kind, **e.data}))
    try:
        answers = list(_script(kit, typed))
    finally:
        kit.close()
    volatile = {"ts", "trace", "path"}
    return answers, [{k: v for k, v in e.items() if k not in volatile} for e in events]


def test_typed_methods_take_the_same_traced_path_as_call(tmp_path):
    typed_answers, typed_events = _events(tmp_path, typed=True)
    call_answers, call_events = _events(tmp_path, typed=False)
    assert typed_answers == call_answers
    assert "7731" in typed_answers[0] and "7731" in typed_answers[-1]
    kinds = [e["kind"] for e in typed_events]
    assert kinds.count("external_call") == 31 + 7 + 2 and "fault" in kinds
    assert typed_events == call_events


def test_a_typed_call_is_replayed_like_any_other(tmp_path):
    from pager.replay import replay

    kit = Toolkit(config=Config(home=tmp_path / "h", session="agent", embedder="hash", budget=2048))
    list(_script(kit, typed=True))
    path = kit._writer.path
    kit.close()
    run = replay(path, check=True)
    assert run.divergence is None, run.divergence.describe()


# -- conflicting arguments ---------------------------------------------------------------------------------

@pytest.mark.parametrize("given, field", [({"session": "other"}, "session"), ({"user": "bob"}, "user"),
                                          ({"home": "elsewhere"}, "home")])
def test_toolkit_refuses_an_argument_that_contradicts_its_config(tmp_path, given, field):
    config = Config(home=tmp_path / "h", session="agent", embedder="hash")
    with pytest.raises(ConfigError, match=f"Toolkit got {field}=.* and a config with {field}=.*; pass one of them"):
        Toolkit(config=config, **given)


def test_toolkit_accepts_arguments_that_agree_with_its_config(tmp_path):
    config = Config(home=tmp_path / "h", session="agent", embedder="hash")
    with Toolkit(config=config, session="agent", home=tmp_path / "h", trace=False) as kit:
        assert kit.session.name == "agent"


def test_opening_an_open_session_with_another_policy_is_an_error(mem_home):
    s = mem_home.open("a", policy="lru")
    assert mem_home.open("a") is s and mem_home.open("a", policy="lru") is s
    with pytest.raises(ConfigError, match="already open with policy lru, not clock; switch it with session.set_policy"):
        mem_home.open("a", policy="clock")
    assert s.policy.name == "lru"
    s.set_policy("clock")
    assert mem_home.open("a", policy="clock") is s


# -- the model protocol ------------------------------------------------------------------------------------

class Echo:
    """A test's own model: no base class, only what the protocol asks for."""

    name = "echo"
    output_tokens = 256

    def window(self) -> int:
        return 50_000

    def complete(self, messages, tools):
        from pager.llm import ModelReply

        return ModelReply(f"echo: {messages[-1]['content']}")


def test_the_models_pager_ships_satisfy_the_protocol():
    from pager.llm import LiteLLMModel
    from pager.model import HandlerModel, Model
    from pager.offline import OfflineShell
    from pager.replay import ReplayModel

    for model in (LiteLLMModel("pager/offline"), ReplayModel([]), HandlerModel(OfflineShell()), Echo()):
        assert isinstance(model, Model), type(model).__name__
        params = list(inspect.signature(model.complete).parameters)
        assert params == ["messages", "tools"], (type(model).__name__, params)
    assert not isinstance(object(), Model)


def test_the_agent_loop_runs_on_any_model_of_the_protocol(mem_home):
    from pager.agent import Agent

    s = mem_home.open("a")
    reply = Agent(s, Echo()).ask("hello there")
    assert reply.text == "echo: hello there" and s.turn_count == 2


def test_the_offline_shell_in_process_answers_as_it_does_through_litellm(tmp_path):
    """HandlerModel(OfflineShell()) needs no litellm; the conversation, tool calls and trace are the same."""
    code = """
import json, sys
from pager.agent import Agent
from pager.config import Config
from pager.embed import HashEmbedder
from pager.home import Home
from pager.store import MemoryStore
from pager.offline import OfflineShell
from pager.model import HandlerModel
from pager.llm import LiteLLMModel, register

def run(model):
    home = Home(Config(home=sys.argv[1] + "/" + type(model).__name__, budget=2048, embedder="hash"),
                store=MemoryStore(), embedder=HashEmbedder(), durable=False, clock=lambda: 1.7e9)
    s = home.open("a")
    s.append("maya", "My daughter Ines is allergic to shellfish, keep that in mind for the party.", ts=1.7e9)
    for i in range(60):
        s.append("bob", f"turn {i} says " + " ".join(f"w{i}x{j}" for j in range(12)), ts=1.7e9)
    events = []
    s.events.listeners.append(lambda e: events.append({"kind": e.kind, **e.data}))
    replies = [Agent(s, model).ask(q).text for q in ("What is Ines allergic to?", "I bought a kayak.")]
    return replies, events

direct = run(HandlerModel(OfflineShell()))
imported = "litellm" in sys.modules
register("offline", OfflineShell())
routed = run(LiteLLMModel("pager/offline"))
print(json.dumps({"litellm_before": imported, "same": direct == routed, "direct": direct[0]}))
"""
    out = run_py(code.replace("sys.argv[1]", repr(str(tmp_path))))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["litellm_before"] is False, "the offline shell in process must not import litellm"
    assert "shellfish" in result["direct"][0] and result["direct"][1].startswith("Noted")
    assert result["same"], "HandlerModel and the litellm route must answer and trace alike"


# -- what `pip install .` brings, and what only `pager[bench]` does -----------------------------------------

BLOCK_BENCH = "import sys; sys.modules['rank_bm25'] = None; sys.modules['matplotlib'] = None\n"


def test_the_demo_runs_without_the_bench_packages(tmp_path):
    out = run_py(BLOCK_BENCH + "import sys\nfrom pager.cli.app import main\n"
                 f"sys.argv = ['pager', 'demo', '--keep', {str(tmp_path / 'demo')!r}]\nmain()")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Sam" in out.stdout and "peanut" in out.stdout.lower()


@pytest.mark.parametrize("args, names", [
    (["bench", "locomo", "--data", "DATA"], "the BM25 baseline (or --no-baselines) needs rank-bm25"),
    (["bench", "locomo", "--data", "DATA", "--no-baselines", "--plot", "out.png"], "--plot needs matplotlib"),
])
def test_bench_without_its_packages_says_the_one_install_that_fixes_it(tmp_path, args, names):
    data = tmp_path / "locomo.json"
    data.write_text("[]")
    args = [str(data) if a == "DATA" else a for a in args]
    out = run_py(BLOCK_BENCH + f"import sys\nfrom pager.cli.app import main\nsys.argv = ['pager', *{args!r}]\nmain()",
                 cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [f"pager: {names}, which is not installed; pip install 'pager[bench]'"]


def test_search_with_k_below_one_is_refused_in_words(maya, tmp_path):
    from pager.config import Config
    from pager.errors import ToolError
    from pager.tools import Toolkit

    home = tmp_path / "h"
    shutil.copytree(maya, home)
    with Toolkit(config=Config(home=home, session="maya", embedder="hash")) as m:
        for k in (0, -1):
            with pytest.raises(ToolError, match="k of 1 or more"):
                m.search("peanut allergy", k=k)
        assert "p5" in m.search("peanut allergy", k=1)


def test_the_offline_shell_the_readme_names_for_the_agent_loop_is_a_public_name(tmp_path):
    """The README's Python section says `HandlerModel(OfflineShell())` satisfies `pager.Model`, so
    `pager.Agent(session, model).ask("…")` runs with no key; `pager.HandlerModel` was there, but
    `pager.OfflineShell` was an AttributeError and nothing said where it lives."""
    import pager

    with pager.Home(Config(home=tmp_path, embedder="hash")) as home:
        session = home.open("work")
        agent = pager.Agent(session, pager.HandlerModel(pager.OfflineShell()))
        agent.ask("My locker code is 3141.")
        assert "3141" in agent.ask("What is my locker code?").text
    assert "OfflineShell" in pager.__all__


runner = CliRunner()


def _turns(home, session: str) -> list[str]:
    result = runner.invoke(app, ["--home", str(home), "export", "-s", session], env=ENV)
    assert result.exit_code == 0, result.output
    return [json.loads(line)["text"] for line in result.stdout.splitlines()]


@pytest.mark.parametrize("trace", [True, False])
def test_a_closed_toolkit_refuses_every_call_naming_the_fix(tmp_path, trace):
    """`memory.remember(...)` after `memory.close()` (or after the `with` block) raised `ValueError: I/O
    operation on closed file` from the trace writer; without a trace it reopened the closed home's journal
    behind its back and stored the turn. Now every call, typed or `call`, raises a PagerError saying the
    Toolkit is closed and to make a new one, and nothing is stored."""
    home = tmp_path / "home"
    with pager.Toolkit(config=Config(home=home, session="agent", embedder="hash"), trace=trace) as memory:
        memory.remember("The deploy key lives in the vault.")
    for late in (lambda: memory.remember("said after close"), lambda: memory.search("vault"),
                 lambda: memory.call("remember", '{"text": "said after close"}')):
        with pytest.raises(PagerError, match="closed.*new pager.Toolkit") as refused:
            late()
        assert not isinstance(refused.value, ToolError)
    memory.close()   # closing twice stays harmless
    assert _turns(home, "agent") == ["The deploy key lives in the vault."]


def test_a_closed_home_refuses_writes_naming_the_fix(tmp_path):
    """A `pager.Home` written after `close()` opened a new journal segment behind the close and accepted
    the turn (durable, found by the next process, but written through a home its program had let go of).
    Turns, state and bookmarks are refused now, and nothing is written."""
    from pager.embed import HashEmbedder
    from pager.home import Home

    config = Config(home=tmp_path / "h", budget=2048, page_tokens=128, embedder="hash")
    with Home(config, embedder=HashEmbedder()) as home:
        s = home.open("notes")
        s.append("ann", "the boat leaves at nine")
    for write in (lambda: s.append("ann", "written after close"), lambda: s.set_state("k", "v"),
                  lambda: s.bookmark([1], ["boat"])):
        with pytest.raises(StoreError, match="was closed.*new pager.Home"):
            write()
    assert not list((home.local / "journal").glob("*.wal"))
    assert _turns(tmp_path / "h", "notes") == ["the boat leaves at nine"]
