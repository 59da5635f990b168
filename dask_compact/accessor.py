"""Registers ``dask.array.Array.map_compact`` (an accessor-style method, like xarray's)."""

from __future__ import annotations

import functools
import warnings

import dask.array as da

from . import api


def _map_compact(self: da.Array, pred, **kwargs):
    return api.map_compact(self, pred, **kwargs)


functools.update_wrapper(_map_compact, api.map_compact)
_map_compact.__name__ = "map_compact"
setattr(_map_compact, "_dask_compact", True)  # noqa: B010 - mark of our own method


def register() -> None:
    """Add ``map_compact`` to dask arrays; warn and leave it if something else defined it."""
    existing = getattr(da.Array, "map_compact", None)
    if existing is not None and not getattr(existing, "_dask_compact", False):
        warnings.warn(
            "dask.array.Array.map_compact is already defined by another package; dask_compact "
            "leaves it as it is: call dask_compact.map_compact(x, pred) instead",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    setattr(da.Array, "map_compact", _map_compact)  # noqa: B010 - a new attribute of a class
