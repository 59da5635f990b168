"""dask-compact: filter (stream-compact) dask arrays chunk by chunk, with known result sizes.

``import dask_compact`` adds :meth:`dask.array.Array.map_compact`.

The package imports lazily: ``dask.array`` (over a second to import where CuPy, SciPy and
xarray are installed, since it registers their chunk types) is imported only when something
needs it. The method is added to ``dask.array.Array`` at once if ``dask.array`` is already
imported, else the moment it is (:mod:`.accessor`); the public names below are imported on
first use. So ``python -m dask_compact``, which never builds a dask array, starts without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .accessor import register_when_imported as _register_when_imported

if TYPE_CHECKING:
    from .api import compact, flatnonzero, map_compact
    from .cache import cache_dir, clear_cache
    from .chunk import compact_array, compact_into
    from .latency import low_latency
    from .predicate import Predicate, as_predicate
    from .records import compact_records, compact_records_into
    from .scan import cumsum, scan_array
    from .sorting import argsort, sort
    from .stable_split import partition, partition_array
    from .workers_installed import WorkerWithoutDaskCompact

__version__ = "0.1.0"
__all__ = [
    "map_compact", "compact", "flatnonzero", "compact_array", "compact_into", "compact_records",
    "compact_records_into", "Predicate",
    "as_predicate", "trace", "cache_dir", "clear_cache", "sort", "argsort", "scan_array",
    "cumsum", "partition", "partition_array", "low_latency", "WorkerWithoutDaskCompact",
]  # fmt: skip

# public name -> the module that defines it
_LAZY = {
    "map_compact": "api", "compact": "api", "flatnonzero": "api",
    "cache_dir": "cache", "clear_cache": "cache",
    "compact_array": "chunk", "compact_into": "chunk", "compact_records": "records",
    "compact_records_into": "records",
    "Predicate": "predicate", "as_predicate": "predicate",
    "sort": "sorting", "argsort": "sorting",
    "scan_array": "scan", "cumsum": "scan",
    "partition": "stable_split", "partition_array": "stable_split",
    "low_latency": "latency",
    "WorkerWithoutDaskCompact": "workers_installed",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dask_compact' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def trace(pred: Any) -> Predicate:
    """The :class:`Predicate` a callable or string becomes; its repr says which path runs.

    >>> import dask_compact
    >>> dask_compact.trace(lambda v: v > 0.5)
    <Predicate fused: greater(x, p0) where p0=0.5>
    """
    from .predicate import as_predicate

    return as_predicate(pred)


_register_when_imported()
