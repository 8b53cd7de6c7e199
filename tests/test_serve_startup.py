"""`pager serve` answers at once: it warms what the first chat call would pay (LanceDB and the store's
tables, the tokenizer, the embedder, an offline turn) before it says it is ready, and a model it cannot
serve is refused from the files litellm ships, without importing litellm (seconds), before anything
is stored. Nothing here measures time: what is loaded, and in which order, is what is checked."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pager.config import Config
from pager.engine import Engine
from pager.keys import KeyRing
from pager.serve import Server

REFUSED = {"gpt-4o-mini": "OPENAI_API_KEY", "openai/gpt-4o-mini": "OPENAI_API_KEY",
           "claude-sonnet-4-20250514": "ANTHROPIC_API_KEY", "no-such-model": "provider/model",
           "madeup/model": "provider/model"}


def client_of(server):
    from starlette.testclient import TestClient

    return TestClient(server.app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000))


def test_a_model_the_server_cannot_serve_is_refused_without_litellm_and_stores_nothing(tmp_path, monkeypatch):
    import pager.llm
    import pager.serve

    def imported(*_a, **_k):
        raise AssertionError("litellm was imported on the way to a refusal")

    monkeypatch.setattr(pager.llm, "litellm", imported)
    monkeypatch.setattr(pager.serve, "load_models", imported)
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    config = Config(home=tmp_path / "home", embedder="hash")
    server = Server(Engine(config), KeyRing(config.home))
    with client_of(server) as client:
        for model, fix in REFUSED.items():
            r = client.post("/v1/chat/completions", headers={"X-Pager-Session": "refused"},
                            json={"model": model, "messages": [{"role": "user", "content": "remember 77"}]})
            assert r.status_code == 404, (model, r.text)
            error = r.json()["error"]
            assert error["code"] == "model_not_found" and fix in error["message"] and "'offline'" in error["message"]
        assert client.get("/sessions/refused").status_code == 404
        assert client.get("/sessions").json()["data"] == []
    journal = server.engine.home.journal
    assert not any(op.get("session") == "refused" for op in journal.read_new({}))


def test_the_refusal_from_shipped_names_is_never_stricter_than_litellms_own_check(monkeypatch):
    """A name refused as no provider's is one litellm cannot route either; a key said missing is one
    litellm's check asks for too."""
    from pager.errors import ModelError
    from pager.llm import UNROUTABLE, LiteLLMModel, routable, unservable

    names = ["gpt-4o-mini", "openai/gpt-4o-mini", "no-such-model", "nosuchmodel-xyz", "madeup/model", "a/b/c",
             "llama3", "command-r", "ollama/llama3", "ft:gpt-4o-mini:org::abc", "azure/my-deployment",
             "text-embedding-3-small", "deepseek-chat", "groq/llama3-8b-8192", "claude-sonnet-4-20250514"]
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GROQ_API_KEY"):
        monkeypatch.setenv(key, "sk-test")
    for name in names:
        if unservable(name) == UNROUTABLE:
            assert not routable(name), name
    assert unservable("no-such-model") == UNROUTABLE and unservable("ollama/llama3") == ""
    for key in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GROQ_API_KEY"):
        monkeypatch.delenv(key)
    for name in names:
        why = unservable(name)
        if why.startswith("needs "):
            with pytest.raises(ModelError, match=why.split()[1]):
                LiteLLMModel(name).check()


def test_serve_says_it_is_ready_only_after_the_warm_up_and_the_warm_up_writes_nothing_here(tmp_path, monkeypatch):
    import uvicorn

    import pager.serve

    order: list[str] = []
    engines: list[Engine] = []
    warm = pager.serve.warm

    def warming(engine):
        engines.append(engine)
        seconds = warm(engine)
        order.append("warm")
        return seconds

    monkeypatch.setattr(pager.serve, "warm", warming)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: order.append("serving"))
    config = Config(home=tmp_path / "home", embedder="hash")
    pager.serve.serve(config, port=0, on_listening=lambda port: order.append("listening"))
    assert order == ["warm", "listening", "serving"]
    home = engines[0].home
    try:
        assert home.loaded_store is not None and home.loaded_embedder is not None and home._tokenizer is not None
        assert home.store.sessions() == [] and home.sessions == {}
        assert not list((config.home / "traces").iterdir())
    finally:
        engines[0].close()


FIRST_CALL = """
import json, sys
from pathlib import Path
from starlette.testclient import TestClient
from pager.config import Config
from pager.engine import Engine
from pager.keys import KeyRing
from pager.proxy import warm
from pager.serve import Server

config = Config(home=Path(sys.argv[1]))
engine = Engine(config)
warm(engine)
server = Server(engine, KeyRing(config.home))
with TestClient(server.app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000)) as client:
    assert client.get("/healthz").json()["status"] == "ok"
    before = set(sys.modules)
    r = client.post("/v1/chat/completions", headers={"X-Pager-Session": "first"},
                    json={"model": "offline", "messages": [{"role": "user", "content": "The Lisbon budget is 4,000 euros."}]})
    assert r.status_code == 200, r.text
    loaded = sorted(set(sys.modules) - before)
print(json.dumps({"loaded": loaded, "embedder": type(engine.home.loaded_embedder).__name__}))
"""


def test_the_first_chat_call_after_the_warm_up_loads_nothing_new(tmp_path):
    """With the default embedder: every package and pager module the first call uses is loaded before
    `/healthz` says ok (and litellm is not: the offline model needs none)."""
    out = subprocess.run([sys.executable, "-c", FIRST_CALL, str(tmp_path / "home")], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    heavy = ("pager", "lancedb", "pyarrow", "numpy", "tiktoken", "wordllama", "litellm")
    assert [m for m in report["loaded"] if m.split(".")[0] in heavy] == []
    assert report["embedder"] == "WordLlamaEmbedder"
