"""LanceDB imported without the REST client pager never uses.

`import lancedb` imports `lance_namespace`, whose package imports `lance_namespace_urllib3_client`,
and that package's `__init__` imports every API class of the LanceDB REST namespace: 366 functions
wrapped in pydantic's `validate_call`, each building its schema at import time. That is about half
of LanceDB's import, ~0.7 s of CPU on this machine, and pager opens local or object-store URIs only.
`lancedb()` imports LanceDB with that package's `__init__` deferred (pager.deferred): the model
classes `lance_namespace` re-exports import as usual, and the first read of what the package itself
defines runs its `__init__`.

On Python 3.11 LanceDB decorates its methods with the `overrides` package's `override`, which reads
each method's bytecode at import to check that a base class defines it (105 methods, ~0.06 s); on 3.12
and later it takes `typing.override`, which only marks the method, and a plain class for
`EnforceOverrides`. pager imports it on 3.11 as it imports itself on 3.12: `overrides` stands in for
the import only, and is what it was afterwards. BENCHMARKS.md, "Start-up time", has the figures.
"""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

from .deferred import defer

DEFERRED = "lance_namespace_urllib3_client"


def lancedb() -> types.ModuleType:
    """The `lancedb` module, imported (once) with the REST namespace client's package deferred and, on
    Python 3.11, the override checks of 3.12 (none at import)."""
    if "lancedb" in sys.modules:
        return sys.modules["lancedb"]
    defer(DEFERRED)
    with _marking_overrides():
        import lancedb as module

    return module


def _mark(method):
    """typing.override of Python 3.12: the method marked, nothing checked."""
    try:
        method.__override__ = True
    except (AttributeError, TypeError):
        pass
    return method


class _EnforceOverrides:
    """What LanceDB's connection classes derive from on Python 3.12: a plain class."""


@contextmanager
def _marking_overrides():
    """On Python 3.11, `overrides` as LanceDB takes it on 3.12 while LanceDB imports, put back after."""
    if sys.version_info >= (3, 12):
        yield
        return
    stand_in = types.ModuleType("overrides")
    stand_in.override = lambda method=None, **options: _mark(method) if method is not None else _mark
    stand_in.EnforceOverrides = _EnforceOverrides
    before = sys.modules.get("overrides")
    sys.modules["overrides"] = stand_in
    try:
        yield
    finally:
        if before is None:
            sys.modules.pop("overrides", None)
        else:
            sys.modules["overrides"] = before
