"""Benchmarks: recall on LoCoMo (locomo), cost at scale (scale), recorded traces (record).

Their own packages (rank-bm25 for the BM25 baseline, matplotlib for the plots) come with
`pip install 'pager[bench]'`; the engine, the demo and chat run without them.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType

from pager.errors import ConfigError

EXTRA = "pip install 'pager[bench]'"
PACKAGES = {"rank_bm25": "rank-bm25", "matplotlib": "matplotlib"}   # module -> the package that brings it


def need(module: str, purpose: str) -> ModuleType:
    """The module, or one line naming the install that brings it."""
    try:
        return import_module(module)
    except ImportError:
        raise ConfigError(f"{purpose} needs {PACKAGES.get(module, module)}, which is not installed; {EXTRA}") from None
