"""Prompt templates as text files, rendered with str.format."""

from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=None)
def load(name: str) -> str:
    return resources.files(__name__).joinpath(f"{name}.txt").read_text(encoding="utf-8")


def render(name: str, **values) -> str:
    return load(name).format(**values)
