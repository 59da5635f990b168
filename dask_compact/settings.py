"""dask-compact's settings in dask's configuration, and their defaults in one place.

Set them with ``dask.config.set`` (also as a context manager), in ``~/.config/dask/*.yaml``,
or in the environment (``DASK_DASK_COMPACT__SORT__MIN_BUCKET=4096``)::

    dask-compact:
      cache:
        memory-entries: 64        # compiled loops/modules kept per cache and process
        disk-bytes: 268435456     # the disk cache's cap (256 MiB)
      direct: true                # phase 1 over a persisted input asked of the workers
      sort:
        exchange: auto            # how a cluster sort cuts its exchange: auto/ipc/worker/bucket
        min-bucket: 65536         # elements a bucket at least, when buckets= is not given
        max-pieces: 16384         # exchange pieces (chunks x buckets) at most

Every read goes through :func:`get`, which falls back to the default here. Registering the
defaults alone (``dask.config.update_defaults`` when a module is first imported) was not
enough: a module first imported inside a ``dask.config.set`` block on one of its own keys put
its defaults into the section the block had just made, and the block's end removed that
section with them, so every later ``sort`` raised ``KeyError: 'sort'``.
"""

from __future__ import annotations

from typing import Any

import dask.config

__all__ = ["DEFAULTS", "get"]

DEFAULTS: dict[str, Any] = {
    "cache": {"memory-entries": 64, "disk-bytes": 256 * 2**20},
    "direct": True,
    "sort": {"exchange": "auto", "min-bucket": 2**16, "max-pieces": 2**14},
}
# shown by dask.config.get("dask-compact") and by dask's config tooling
dask.config.update_defaults({"dask-compact": DEFAULTS})


def get(key: str) -> Any:
    """The setting ``dask-compact.<key>`` (e.g. ``"sort.min-bucket"``): the configured value,
    else its default."""
    default: Any = DEFAULTS
    for part in key.split("."):
        default = default[part]
    return dask.config.get(f"dask-compact.{key}", default=default)
