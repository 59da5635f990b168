"""Stable split of one NumPy array by a predicate (:func:`dask_compact.partition` on the CPU).

The records' predicate pass (:func:`.numpy_records.predicate_bits`: the generated loop writes
one bit per element and counts, or NumPy evaluates a mask-path callable), then one compiled
pass that writes every element at its place: the selected ones from 0 and the others from the
count, each in order, choosing the place arithmetically (no branch to mispredict at p = .5).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codegen.numba_ready import njit  # numba, imported with Ctrl-C held
from ..predicate.core import Predicate
from ..predicate.fields import record_predicate
from .numpy_gather import as_rows
from .numpy_records import predicate_bits

__all__ = ["split_chunk"]


@njit(nogil=True, cache=True, boundscheck=False)
def _split1(bits, n, src, dst, k):  # pragma: no cover - compiled
    sel = 0
    rej = k
    for i in range(n):
        b = np.int64((bits[i >> 6] >> np.uint64(i & 63)) & np.uint64(1))
        dst[rej + (sel - rej) * b] = src[i]
        sel += b
        rej += 1 - b


@njit(nogil=True, cache=True, boundscheck=False)
def _split2(bits, n, src, dst, k):  # pragma: no cover - compiled
    # rows of several units
    sel = 0
    rej = k
    for i in range(n):
        b = np.int64((bits[i >> 6] >> np.uint64(i & 63)) & np.uint64(1))
        at = rej + (sel - rej) * b
        for c in range(src.shape[1]):
            dst[at, c] = src[i, c]
        sel += b
        rej += 1 - b


@njit(nogil=True, cache=True, boundscheck=False)
def _split_indices(bits, n, base, dst, k):  # pragma: no cover - compiled
    sel = 0
    rej = k
    for i in range(n):
        b = np.int64((bits[i >> 6] >> np.uint64(i & 63)) & np.uint64(1))
        dst[rej + (sel - rej) * b] = base + i
        sel += b
        rej += 1 - b


def split_chunk(a: np.ndarray, pred: Predicate, output: str, index_base: int
                ) -> tuple[Any, int]:
    """Dispatch entry (see dask_compact.dispatch.split_chunk): ``(out, k)``."""
    chunk, a = a, np.ascontiguousarray(a.reshape(-1))
    n = a.size
    if pred.expr is not None:
        bits, k = predicate_bits(record_predicate(pred, ("x",)), {"x": a}, n)
    else:  # the mask path: the callable's checked mask is the one field read, made on the
        # chunk as given (a callable may broadcast constants against its trailing axes)
        m = np.ascontiguousarray(np.ravel(pred.mask(chunk, np), order="C"), dtype=bool)
        bits, k = predicate_bits(record_predicate("m", ("x", "m")), {"x": a, "m": m}, n)
    values = indices = None
    if output != "indices":
        values = np.empty_like(a)
        if n:  # an empty chunk moves nothing (its float16 once reached numba, which has none)
            src, dst = as_rows(a), as_rows(values)
            if src.shape[1] == 1:
                _split1(bits, n, src.reshape(-1), dst.reshape(-1), k)
            elif src.shape[1]:
                _split2(bits, n, src, dst, k)
    if output != "values":
        indices = np.empty(n, np.int64)
        _split_indices(bits, n, np.int64(index_base), indices, k)
    out = (values, indices) if output == "both" else values if output == "values" else indices
    return out, k
