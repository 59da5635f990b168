"""Sort NumPy chunks: the chunk-level steps of :func:`dask_compact.sort` and ``argsort``.

Backend contract (this module and :mod:`.cupy_sort`; chosen by :mod:`dask_compact.dispatch`):

``sort_chunk(a, indices, base, positions, local="auto") -> (values, order, sample)``
    ``values``: ``a`` sorted as NumPy sorts (NaNs last; equal values in their input order when
    ``indices``). ``order``: int64 global indices (``base`` + position in ``a``) of ``values``
    when ``indices``, else None. ``sample``: ``values[positions]`` as a NumPy array (the
    splitter sample, sent to the client). With ``indices`` the values may be *keys* that order
    exactly as the values do (the GPU folds -0.0 into 0.0 and every NaN into one); they are
    only split and merged, never returned.

``sort_bounds(values, split_values, split_index, base) -> np.ndarray``
    For each splitter pair ``(v, i)`` (v of ``values``' dtype, i a global index), how many of
    the sorted chunk's elements come before it in the order (value, then global index) where
    the element at sorted position r has index ``base + r``: ``clip(i - base, lo, hi)`` with
    ``[lo, hi)`` the run of elements equal to ``v``. int64 on the host.

``sort_merge(like, values, orders, local="auto", joined=False) -> out``
    Output bucket from its pieces (one per input chunk, in chunk order; each sorted): with
    ``orders`` None the merged values, else the global indices ``orders`` in the merged order
    (ties keep piece order, so equal values come out by global index). ``joined``: ``values``
    (and ``orders``) hold one array, the pieces already one after the other (the CUDA IPC
    exchange copies them so), to be sorted as a whole; otherwise one piece is already sorted.

What measured fastest on the CPU (2^22 elements, 2 to 64 sorted runs): the merge is a
concatenation sorted again (NumPy's sort beat a compiled two-way merge tree from 16 runs on
for float32 values); a stable argsort of a 1, 2 or 4-byte dtype sorts one uint64 per element
(order-preserving key << 32 | position: positions are unique, so any sort is stable), 6x
faster than ``np.argsort(kind="stable")`` on float32 and int32 (NumPy's timsort); 1 and 2-byte
integers take NumPy's stable radix sort, and 8-byte types NumPy's stable sort.

``local="radix"`` (both steps, both backends): the seed's LSD radix sort from the stable split
(:mod:`.split_radix`).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from . import split_radix
from .split_radix import order_key

__all__ = [
    "sort_chunk", "sort_bounds", "sort_merge", "stable_argsort", "sort_kind", "order_key",
]

_MAX_PACKED = 2**32  # positions must fit the low 32 bits of the packed key


def sort_kind(dtype: np.dtype) -> Literal["stable"] | None:
    """NumPy's radix sort (``kind="stable"``) for 1 and 2-byte integers and bools, which it
    sorts in O(n) (5-15x faster than the default there); its stable sort for float16 too;
    else the default introsort.

    float16: NumPy 2.4's default sort of float16 dispatches on x86 CPUs with AVX512_ICL to
    a SIMD quicksort (x86-simd-sort) that left some nearly sorted inputs unsorted: a bucket
    re-sorted from its sorted pieces (:func:`sort_merge`) came out unsorted, and so did
    ``dask_compact.sort`` of 300,007 float16 values (the GPU probe of 2026-11-30, fifth
    session, on the CPU of its host). The stable sort does not take that path."""
    if dtype.kind in "biu" and dtype.itemsize <= 2:
        return "stable"
    return "stable" if dtype == np.dtype(np.float16) else None


def stable_argsort(a: np.ndarray) -> np.ndarray:
    """``np.argsort(a, kind="stable")`` as int64, by the fastest route measured (module doc)."""
    if (a.dtype.kind in "biu" and a.dtype.itemsize <= 2) or a.dtype.itemsize > 4 \
            or a.size >= _MAX_PACKED:  # fmt: skip
        return np.argsort(a, kind="stable").astype(np.int64, copy=False)
    packed = order_key(a).astype(np.uint64)
    packed <<= np.uint64(32)
    packed |= np.arange(a.size, dtype=np.uint64)
    packed.sort()
    packed &= np.uint64(_MAX_PACKED - 1)
    return packed.view(np.int64)


def sort_chunk(
    a: np.ndarray, indices: bool, base: int, positions: np.ndarray, local: str = "auto"
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    if local == "radix":
        return split_radix.sort_chunk(a, indices, base, positions, np)
    if indices:
        order = stable_argsort(a)
        values = a[order]
        order += np.int64(base)
        return values, order, values[positions]
    values = np.sort(a, kind=sort_kind(a.dtype))
    return values, None, values[positions]


def sort_bounds(
    values: np.ndarray, split_values: np.ndarray, split_index: np.ndarray, base: int
) -> np.ndarray:
    # NumPy's searchsorted orders NaNs last, as its sort does
    lo = np.searchsorted(values, split_values, side="left")
    hi = np.searchsorted(values, split_values, side="right")
    return np.clip(split_index - np.int64(base), lo, hi).astype(np.int64)


def sort_merge(like: Any, values: list, orders: list | None, local: str = "auto",
               joined: bool = False) -> np.ndarray:
    if local == "radix":
        return split_radix.sort_merge(values, orders, np, joined)
    if orders is None:
        if len(values) == 1 and not joined:
            return values[0].copy()  # a slice would keep its whole input chunk alive
        out = np.concatenate(values)
        out.sort(kind=sort_kind(out.dtype))
        return out
    if len(values) == 1 and not joined:
        return orders[0].copy()
    return np.concatenate(orders)[stable_argsort(np.concatenate(values))]
