"""Exact token counts with tiktoken, offline.

tiktoken downloads its encodings on first use; litellm ships cl100k_base and o200k_base,
so the cache folder is pointed there before tiktoken is imported. litellm itself is not
imported (it costs seconds): its folder is found with importlib.
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path

# Model families whose tokenizer is o200k_base; every other model is counted with cl100k.
O200K_PREFIXES = ("gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o", "gpt-oss")


def encoding_for_model(model: str | None) -> str:
    """o200k for the gpt-4o family and later OpenAI models, cl100k otherwise."""
    name = (model or "").split("/")[-1].lower()
    return "o200k_base" if name.startswith(O200K_PREFIXES) else "cl100k_base"


def _offline_cache() -> None:
    if os.environ.get("TIKTOKEN_CACHE_DIR"):
        return
    spec = importlib.util.find_spec("litellm")
    if spec and spec.submodule_search_locations:
        folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
        if folder.is_dir():
            os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)


class Tokenizer:
    """Counts, encodes and decodes with one tiktoken encoding."""

    def __init__(self, encoding: str = "cl100k_base"):
        _offline_cache()
        import tiktoken

        self.name = encoding
        self._enc = tiktoken.get_encoding(encoding)

    def count(self, text: str) -> int:
        return len(self._enc.encode(text, disallowed_special=())) if text else 0

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, disallowed_special=())

    def decode(self, ids: list[int]) -> str:
        return self._enc.decode(ids)

    def fit(self, text: str, limit: int) -> str:
        """The longest prefix of text, cut at a character boundary, of at most limit tokens."""
        if self.count(text) <= limit:
            return text
        lo, hi = 0, len(text)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.count(text[:mid]) <= limit:
                lo = mid
            else:
                hi = mid - 1
        return text[:lo]


@lru_cache(maxsize=4)
def get_tokenizer(encoding: str = "cl100k_base") -> Tokenizer:
    return Tokenizer(encoding)
