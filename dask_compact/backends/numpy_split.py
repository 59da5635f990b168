"""Stable split of one NumPy array by a predicate (:func:`dask_compact.partition` on the CPU).

The records' predicate pass (:func:`.numpy_records.predicate_bits`: the generated loop writes
one bit per element and counts, or NumPy evaluates a mask-path callable), then one compiled
pass that writes every element at its place (:mod:`.numpy_split_loops`, imported at the first
call that runs it). A process without the room to load numba (a small distributed worker:
:func:`..compiler_room.no_room_for_compiler`) splits with NumPy instead, the same answer
(``np.concatenate([a[m], a[~m]])`` and its indices), and never imports numba.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..compiler_room import compiled_loops
from ..predicate.core import Predicate
from ..predicate.fields import record_predicate
from .numpy_records import predicate_bits, predicate_mask

__all__ = ["split_chunk"]


def _loops() -> ModuleType | None:
    """The compiled passes, or None where this process has no room for numba."""
    return compiled_loops("dask_compact.backends.numpy_split_loops")


def split_chunk(a: np.ndarray, pred: Predicate, output: str, index_base: int
                ) -> tuple[Any, int]:
    """Dispatch entry (see dask_compact.dispatch.split_chunk): ``(out, k)``."""
    chunk, a = a, np.ascontiguousarray(a.reshape(-1))
    n = a.size
    loops = _loops()
    if loops is None:
        return _split_masked(a, _mask(chunk, a, pred), output, index_base)
    if pred.expr is not None:
        bits, k = predicate_bits(record_predicate(pred, ("x",)), {"x": a}, n)
    else:  # the mask path: the callable's checked mask is the one field read
        m = _mask(chunk, a, pred)
        bits, k = predicate_bits(record_predicate("m", ("x", "m")), {"x": a, "m": m}, n)
    values = indices = None
    if output != "indices":
        values = np.empty_like(a)
        if n:  # an empty chunk moves nothing (its float16 once reached numba, which has none)
            src, dst = loops.as_rows(a), loops.as_rows(values)
            if src.shape[1] == 1:
                loops.split1(bits, n, src.reshape(-1), dst.reshape(-1), k)
            elif src.shape[1]:
                loops.split2(bits, n, src, dst, k)
    if output != "values":
        indices = np.empty(n, np.int64)
        loops.split_indices(bits, n, np.int64(index_base), indices, k)
    out = (values, indices) if output == "both" else values if output == "values" else indices
    return out, k


def _mask(chunk: np.ndarray, a: np.ndarray, pred: Predicate) -> np.ndarray:
    """The predicate's mask of ``a`` (``chunk`` flattened), evaluated by NumPy; a callable's
    on the chunk as given (it may broadcast constants against its trailing axes)."""
    if pred.expr is not None:
        return predicate_mask(record_predicate(pred, ("x",)), {"x": a}, a.size)
    return np.ascontiguousarray(np.ravel(pred.mask(chunk, np), order="C"), dtype=bool)


def _split_masked(a: np.ndarray, m: np.ndarray, output: str, index_base: int
                  ) -> tuple[Any, int]:
    """The split by NumPy, no numba: the selected elements then the others, each in order.

    Written by ``np.compress`` straight into the output's two parts: ``concatenate`` of
    ``a[m]`` and ``a[~m]`` held the two parts beside the output (2x the chunk for values, 3x
    for both, a review measured), on the workers this path serves, those short of memory."""
    k = int(np.count_nonzero(m))
    rest = ~m
    values = indices = None
    if output != "indices":
        values = np.empty(a.size, dtype=a.dtype)
        np.compress(m, a, out=values[:k])
        np.compress(rest, a, out=values[k:])
    if output != "values":
        indices = np.empty(a.size, dtype=np.int64)
        rows = np.arange(index_base, index_base + a.size, dtype=np.int64)
        np.compress(m, rows, out=indices[:k])
        np.compress(rest, rows, out=indices[k:])
    out = (values, indices) if output == "both" else values if output == "values" else indices
    return out, k
