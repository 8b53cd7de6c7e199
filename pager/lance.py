"""LanceDB imported without the REST client pager never uses.

`import lancedb` imports `lance_namespace`, whose package imports `lance_namespace_urllib3_client`,
and that package's `__init__` imports every API class of the LanceDB REST namespace: 366 functions
wrapped in pydantic's `validate_call`, each building its schema at import time. That is about half
of LanceDB's import, ~0.7 s of CPU on this machine, and pager opens local or object-store URIs only.

`lancedb()` imports LanceDB with that package's `__init__` deferred: the package is put in
`sys.modules` with its path, so its submodules (the model classes `lance_namespace` re-exports) import
as usual, and the first attribute read that the package itself would have defined runs its real
`__init__`. Nothing is lost if some version of LanceDB reads such an attribute while importing: the
package is then loaded whole, as before. BENCHMARKS.md, "Start-up time", has the figures.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from typing import Any

DEFERRED = "lance_namespace_urllib3_client"
_lock = threading.Lock()


def _deferred_package(name: str) -> types.ModuleType | None:
    """A package in `sys.modules` whose `__init__` runs on the first attribute it lacks, or None when
    it cannot be found (LanceDB then imports as it would)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return None
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
    return package


def lancedb() -> types.ModuleType:
    """The `lancedb` module, imported (once) with the REST namespace client's package deferred."""
    if "lancedb" in sys.modules:
        return sys.modules["lancedb"]
    with _lock:
        if DEFERRED not in sys.modules:
            package = _deferred_package(DEFERRED)
            if package is not None:
                sys.modules[DEFERRED] = package
    import lancedb as module

    return module
