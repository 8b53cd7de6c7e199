"""LanceDB imported without the REST client pager never uses.

`import lancedb` imports `lance_namespace`, whose package imports `lance_namespace_urllib3_client`,
and that package's `__init__` imports every API class of the LanceDB REST namespace: 366 functions
wrapped in pydantic's `validate_call`, each building its schema at import time. That is about half
of LanceDB's import, ~0.7 s of CPU on this machine, and pager opens local or object-store URIs only.
`lancedb()` imports LanceDB with that package's `__init__` deferred (pager.deferred): the model
classes `lance_namespace` re-exports import as usual, and the first read of what the package itself
defines runs its `__init__`. BENCHMARKS.md, "Start-up time", has the figures.
"""

from __future__ import annotations

import sys
import types

from .deferred import defer

DEFERRED = "lance_namespace_urllib3_client"


def lancedb() -> types.ModuleType:
    """The `lancedb` module, imported (once) with the REST namespace client's package deferred."""
    if "lancedb" not in sys.modules:
        defer(DEFERRED)
    import lancedb as module

    return module
