"""Embedders: text → unit vectors. Offline by default.

wordllama ships its weights inside the package and needs no torch; its default loader
looks in the wrong folder and tries a download, so the package folder is passed and
downloads are disabled. `minilm` is a real sentence encoder, all-MiniLM-L6-v2, whose weights an
optional package ships (pager/minilm.py): stronger by meaning, about 30x the cost per text. `hash`
is a dependency-free fallback for tests and tiny machines; any other name is taken as a litellm
embedding model (used only when configured).
"""

from __future__ import annotations

import hashlib
import re
from typing import Protocol, Sequence

import numpy as np

from .errors import ConfigError


class Embedder(Protocol):
    name: str
    dim: int   # an embedder may also say `matryoshka = True`: its vectors are the leading dims of its bigger ones

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class WordLlamaModel:
    """wordllama's weights and tokenizer, loaded as `WordLlama.load` loads them (the same arrays, so the
    same bits) without importing the wordllama package: its import sets up the root logger and brings
    requests for downloads pager never makes, about half of an embedder's start-up (BENCHMARKS.md,
    "Start-up time"). The package's folder is found without running it; `avg_pool` is its own step."""

    WEIGHTS = "weights/l2_supercat_256.safetensors"
    TOKENIZER = "tokenizers/l2_supercat_tokenizer_config.json"

    def __init__(self, embedding: np.ndarray, tokenizer) -> None:
        self.embedding = embedding
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, dim: int) -> WordLlamaModel:
        from safetensors import safe_open
        from tokenizers import Tokenizer

        from .deferred import folder as package_folder

        folder = package_folder("wordllama")
        if folder is None:
            raise ImportError("No module named 'wordllama'")
        with safe_open(str(folder / cls.WEIGHTS), framework="np", device="cpu") as weights:
            embedding = weights.get_tensor("embedding.weight")[:, :dim]
        tokenizer = Tokenizer.from_file(str(folder / cls.TOKENIZER))
        tokenizer.enable_padding()
        tokenizer.no_truncation()
        return cls(np.ascontiguousarray(embedding.astype(np.float32)), tokenizer)

    @staticmethod
    def avg_pool(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """wordllama's masked mean: the same operations in the same order."""
        mask_sum = np.maximum(mask.sum(axis=1, keepdims=True), 1.0).astype(np.float32)
        return np.sum(x * mask[..., np.newaxis], axis=1, dtype=np.float32) / mask_sum


class WordLlamaEmbedder:
    """wordllama's 256-dim model cut to its first `dim` dimensions. The model is Matryoshka-trained
    (its leading dimensions carry a smaller model), and an embedding is the mean of token vectors, so
    the first 128 dims of a 256-dim embedding, renormalised, are exactly the 128-dim embedding: a store
    of 256-dim vectors is brought to 128 by cutting them (store.m006_vector_dims), no re-embedding.
    128 dims: LoCoMo recall within noise of 256 at half the index memory and dot-product cost
    (BENCHMARKS.md, "Why vectors have 128 dimensions")."""

    name = "wordllama"
    dim = 128
    FULL_DIM = 256       # the weights shipped in the package
    matryoshka = True    # a vector of more dims from this model, cut to `dim` and renormalised, is its own

    def __init__(self, dim: int | None = None) -> None:
        if dim is not None:
            self.dim = dim
        self._model = WordLlamaModel.load(self.dim)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if len(texts) <= self.ONE_BY_ONE:
            return np.concatenate([self._embed_one(t) for t in texts])
        return self._embed_many(list(texts))

    ONE_BY_ONE = 4   # up to this many texts (a query, its words) skip the batch tokenizer's thread pool
    CELLS = 1 << 16  # token slots (texts x the longest of them) pooled in one step of _embed_many

    def _embed_many(self, texts: list[str]) -> np.ndarray:
        """Many texts as wordllama's batch path embeds them, the same bits, in a few large steps.

        wordllama tokenizes and pools 64 texts at a time, and each step of each batch lets go of the
        interpreter's lock and waits to take it back: beside a busy thread (the ingest's packing, while
        its embedding thread embeds) each wait is a switch interval, and 1,000 texts took 5-7x their time
        (BENCHMARKS.md, "Cost against a plain vector store"). Here the texts are tokenized in one call, sorted by
        length and pooled in as few groups as CELLS allows. A text's vector is the sum of its token
        vectors in order, as any padding to a longer text leaves it (the mask adds exact zeros), so
        the grouping changes no bit (tests/test_search.py)."""
        from itertools import chain

        model = self._model
        encoded = self._plain().encode_batch(texts, add_special_tokens=False)
        ids = [e.ids for e in encoded]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        order = np.argsort(lengths, kind="stable")
        out = np.empty((len(texts), model.embedding.shape[1]), dtype=np.float32)
        start = 0
        while start < len(order):
            end = start + 1   # the longest group of the next texts (by length) whose slots fit CELLS
            while end < len(order) and (end + 1 - start) * int(lengths[order[end]]) <= self.CELLS:
                end += 1
            group = order[start:end]
            width = max(int(lengths[group[-1]]), 1)
            mask = np.arange(width) < lengths[group][:, None]
            tokens = np.zeros(mask.shape, dtype=np.int32)
            tokens[mask] = np.fromiter(chain.from_iterable(ids[i] for i in group.tolist()), dtype=np.int32,
                                       count=int(lengths[group].sum()))
            out[group] = self._pool(tokens, mask.astype(np.float32))
            start = end
        return out

    def _plain(self):
        """wordllama's tokenizer without its padding: _embed_many pads each group itself."""
        plain = getattr(self, "_plain_tokenizer", None)
        if plain is None:
            import copy

            plain = self._plain_tokenizer = copy.deepcopy(self._model.tokenizer)
            plain.no_padding()
        return plain

    def _embed_one(self, text: str) -> np.ndarray:
        """One text as wordllama's batch path embeds it (the same operations, so the same bits): a
        batch of one has no padding, so its mask is all ones. The batch tokenizer hands even one text
        to a thread pool, which on a busy machine costs more than the embedding."""
        ids = np.array([self._model.tokenizer.encode(text, add_special_tokens=False).ids], dtype=np.int32)
        return np.ascontiguousarray(self._pool(ids, np.ones(ids.shape, dtype=np.float32)), dtype=np.float32)

    def _pool(self, tokens: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """Rows of token ids (padded where mask is 0) to unit vectors, by wordllama's own steps: ids
        clamped to the vocabulary, the masked mean of their vectors, normalised."""
        model = self._model
        np.clip(tokens, 0, model.embedding.shape[0] - 1, out=tokens)
        pooled = model.avg_pool(model.embedding[tokens], mask)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
        return pooled


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 in process (pager/minilm.py): 384 dims, each text embedded once per process.

    Its vectors are a stronger signal than wordllama's, so the page search (`weights`, read by
    search.Index) and the fact search (`fact_vector_weight`) lean on them more; in a deep search
    (many pages wanted) a little less than wordllama's, whose feedback terms they would crowd out.
    Each weight was chosen on the LoCoMo development split where both of its halves (conv-26, 30, 41
    and conv-42, 43, 44) gained, or kept where they did not (BENCHMARKS.md, "A sentence encoder offline")."""

    name = "minilm"
    dim = 384
    weights = {"vector": 0.75}              # over search.Index.WEIGHTS (0.5): recall at 1,024 +0.007 on both halves
    deep_weights = {"vector": 0.75}         # over search.Index.DEEP_WEIGHTS (1.0): at 8,192 +0.001 on both halves
    expand_threshold = 0.55                 # search.Vocabulary.expand's (0.45 to 0.75 were no better; off: -0.012)
    fact_vector_weight = 1.0                # in a fact's own match (facts.Facts.search, 0.5): coverage +0.002 to +0.003
    whole_message = True                    # facts and summaries searched with the names in (context.message_vector):
                                            # without them, coverage -0.005 at 2,048 on both halves

    def __init__(self) -> None:
        from .minilm import MiniLM

        self._model = MiniLM()

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self._model.embed(texts)

    def fresh(self, texts: Sequence[str]) -> np.ndarray:
        """The texts' vectors computed anew, the cache neither read nor written: what another program
        embedding them would pay (`pager bench scale`'s reference)."""
        return self._model.fresh(list(texts))


class HashEmbedder:
    """Signed feature hashing of words and word pairs; deterministic, no model."""

    name = "hash"

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = re.findall(r"\w+", text.lower())
            for feature in words + [a + " " + b for a, b in zip(words, words[1:])]:
                h = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "little")
                out[row, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)


class LiteLLMEmbedder:
    """A provider's embedding model through litellm (needs its key or server)."""

    def __init__(self, model: str, dim: int | None = None) -> None:
        from .llm import litellm

        self.name = model
        try:
            litellm().get_llm_provider(model)
        except Exception:  # noqa: BLE001 - litellm names no provider for it
            raise ConfigError(f"PAGER_EMBEDDER={model!r} is not an embedder; {OTHERWISE}") from None
        try:
            missing = litellm().validate_environment(model=model).get("missing_keys") or []
        except Exception:  # noqa: BLE001 - a provider litellm cannot tell: the probe below says what is wrong
            missing = []
        if missing:
            raise ConfigError(f"embedder {model} needs {', '.join(missing)} in the environment; set it, or use "
                              "PAGER_EMBEDDER=wordllama (offline, the default)")
        self.dim = dim or len(self.embed(["dimension probe"])[0])

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        from .llm import litellm

        try:
            response = litellm().embedding(model=self.name, input=list(texts))
        except Exception as exc:  # noqa: BLE001 - litellm's many provider errors, one line for the user
            text = " ".join(str(exc).split())
            raise ConfigError(f"embedder {self.name!r} failed ({text[:160]}); {OTHERWISE}") from None
        vectors = np.array([row["embedding"] for row in response.data], dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1, norms)


def embedder_key(embedder: Embedder) -> str:
    """What a stored vector is tagged with: the embedder's name and size (`minilm/384`, `wordllama/128`). A
    vector stored under another key is made again, never compared with this embedder's."""
    return f"{getattr(embedder, 'name', type(embedder).__name__)}/{embedder.dim}"


WORDLLAMA_DIMS = ("64", "128", "256")  # the Matryoshka sizes of the 256-dim weights shipped with the package


def trace_embedder(name: str, dim: int | None) -> str:
    """The embedder to replay a trace with: the one it was recorded with, at the size it had (a trace
    written before traces carried `embedder_dim` was recorded with wordllama at 256 dims)."""
    if name == "wordllama" and (dim or 256) != WordLlamaEmbedder.dim:
        return f"wordllama:{dim or 256}"
    return name


OTHERWISE = ("use wordllama (offline, the default), minilm (offline, its optional package), hash, or a litellm "
             "embedding model such as "
             "text-embedding-3-small with its key set")
_CACHE: dict[str, Embedder] = {}


def make_embedder(name: str) -> Embedder:
    """The embedder called `name`, loaded once per process. `wordllama:256` (or :64) is wordllama at
    another size: what an earlier release stored (256), or what a trace recorded with it replays with."""
    if name not in _CACHE:
        if name == "wordllama" or name.startswith("wordllama:"):
            dim = name.partition(":")[2]
            if dim and dim not in WORDLLAMA_DIMS:
                raise ConfigError(f"PAGER_EMBEDDER={name!r}: wordllama comes in {', '.join(WORDLLAMA_DIMS)} dims; "
                                  "use wordllama (128) or wordllama:256")
            try:
                _CACHE[name] = WordLlamaEmbedder(int(dim) if dim else None)
                _CACHE[name].name = name
            except ImportError as exc:
                raise ConfigError(f"wordllama is not installed ({exc}); reinstall pager or set PAGER_EMBEDDER=hash") from None
        elif name == "minilm":
            try:
                _CACHE[name] = MiniLMEmbedder()
            except ImportError as exc:
                raise ConfigError(f"PAGER_EMBEDDER=minilm: {exc}; or use PAGER_EMBEDDER=wordllama (the default)") from None
        elif name == "hash":
            _CACHE[name] = HashEmbedder()
        else:
            _CACHE[name] = LiteLLMEmbedder(name)
    return _CACHE[name]
