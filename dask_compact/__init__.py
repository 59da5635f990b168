"""dask-compact: filter (stream-compact) dask arrays chunk by chunk, with known result sizes.

``import dask_compact`` adds :meth:`dask.array.Array.map_compact`.
"""

from .accessor import register as _register
from .api import compact, flatnonzero, map_compact
from .cache import cache_dir, clear_cache
from .chunk import compact_array
from .predicate import Predicate, as_predicate

__version__ = "0.1.0"
__all__ = [
    "map_compact", "compact", "flatnonzero", "compact_array", "Predicate", "as_predicate", "trace",
    "cache_dir", "clear_cache",
]  # fmt: skip


def trace(pred) -> Predicate:
    """The :class:`Predicate` a callable or string becomes; its repr says which path runs.

    >>> import dask_compact
    >>> dask_compact.trace(lambda v: v > 0.5)
    <Predicate fused: greater(x, p0) where p0=0.5>
    """
    return as_predicate(pred)


_register()
