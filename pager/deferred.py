"""A package found, or imported, without running its `__init__` until something reads what it defines.

`folder(name)` is where an installed package's files are, found without importing it: the weights and
data files pager reads itself (wordllama's, MiniLM's, the tiktoken encodings litellm ships).

Some packages pager depends on import far more in their `__init__` than pager uses: lancedb's REST
namespace client builds the pydantic schemas of 366 API functions (pager.lance), snowballstemmer
imports the stemmers of 30 languages where pager stems English. `defer(name)` puts the package in
`sys.modules` with its path, so its submodules import as usual (`snowballstemmer.english_stemmer`),
and the first read of an attribute the package itself would have defined runs its real `__init__`:
whoever reads the package whole, a host program or a later version of the dependency, gets it whole.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from pathlib import Path
from typing import Any

_lock = threading.RLock()


def folder(name: str) -> Path | None:
    """The folder of installed package `name`, found without running it, or None when it is not installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def defer(name: str) -> None:
    """Put package `name` in `sys.modules` with its `__init__` not yet run, unless it is imported
    already or cannot be found (an import of it then does what it always does)."""
    with _lock:
        if name in sys.modules:
            return
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return
        package = types.ModuleType(name)
        package.__spec__ = spec
        package.__loader__ = spec.loader
        package.__file__ = spec.origin
        package.__path__ = list(spec.submodule_search_locations)
        loader = spec.loader

        def load(attribute: str) -> Any:
            if attribute.startswith("__"):
                raise AttributeError(attribute)
            with _lock:
                if "__getattr__" in package.__dict__:
                    del package.__getattr__
                    loader.exec_module(package)
            return getattr(package, attribute)

        package.__getattr__ = load  # type: ignore[method-assign]
        sys.modules[name] = package
