"""Sort NumPy chunks: the chunk-level steps of :func:`dask_compact.sort` and ``argsort``.

Backend contract (this module and :mod:`.cupy_sort`; chosen by :mod:`dask_compact.dispatch`):

``sort_chunk(a, indices, base, positions, local="auto", values=True) -> (values, order, sample)``
    ``values``: ``a`` sorted as NumPy sorts (NaNs last; equal values in their input order when
    ``indices``). ``order``: int64 global indices (``base`` + position in ``a``) of ``values``
    when ``indices``, else None. ``sample``: ``values[positions]`` as a NumPy array (the
    splitter sample, sent to the client). With ``indices`` the values may be *keys* that order
    exactly as the values do (the GPU folds -0.0 into 0.0 and every NaN into one); they are
    only split and merged, never returned. ``values=False`` (only with ``indices`` and no
    ``positions``: the argsort of a whole array, which nothing splits or merges): ``values``
    is None and not made, a gather of the whole chunk saved.

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
integers take NumPy's stable radix sort, and 8-byte types NumPy's stable sort. float16 is
sorted through its uint16 order keys (one table lookup): the values by NumPy's radix sort of
the keys, the zeros and NaNs put back from the input (:func:`sort_half`; 23-27 ms against
320-400 ms for ``np.sort(kind="stable")`` and 48-64 ms for the default sort, which is wrong on
AVX512_ICL CPUs: :func:`sort_kind`), the argsort by the packed keys read from a table
(40-44 ms against 72-78 ms with ``order_key``'s, 470 ms for ``np.argsort(kind="stable")``);
a merge of two runs by NumPy's timsort, which merges them in one pass.

``local="radix"`` (both steps, both backends): the seed's LSD radix sort from the stable split
(:mod:`.split_radix`).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np

from . import split_radix
from .split_radix import order_key, values_of_sorted_keys

__all__ = [
    "sort_chunk", "sort_bounds", "sort_merge", "stable_argsort", "sort_kind", "sort_values",
    "sort_half", "half_keys", "order_key",
]

_MAX_PACKED = 2**32  # positions must fit the low 32 bits of the packed key


def sort_kind(dtype: np.dtype) -> Literal["stable"] | None:
    """NumPy's radix sort (``kind="stable"``) for 1 and 2-byte integers and bools, which it
    sorts in O(n) (5-15x faster than the default there); else the default introsort.

    float16 is sorted by its uint16 keys (:func:`sort_values`), and where it reaches NumPy's
    sort (``sort_merge`` of two pieces, where timsort's merge is faster) it asks this: NumPy
    2.4's default sort of float16 dispatches on x86 CPUs with AVX512_ICL to a SIMD quicksort
    (x86-simd-sort) that left some nearly sorted inputs unsorted (a bucket re-sorted from its
    sorted pieces, and ``dask_compact.sort`` of 300,007 float16 values: the GPU probe of
    2026-11-30, fifth session, on the CPU of its host), and its stable sort is a comparison
    sort 8x slower than the default (334 ms against 50 ms for 2^22 values). The answer here
    for float16 is the stable sort, should anything ask."""
    if dtype.kind in "biu" and dtype.itemsize <= 2:
        return "stable"
    return "stable" if _is_half(dtype) else None


# float16 sorted through uint16 keys. Every float16 bit pattern has its key in a table of
# 2^16 (order_key of them all: -0.0 and +0.0 share the key 0x8000, every NaN has 0xFFFF), and
# every key but those two has exactly one bit pattern, kept in the inverse table.


@functools.cache
def _half_tables() -> tuple[np.ndarray, np.ndarray]:
    """(key of each float16 bit pattern, bit pattern of each key): 128 KiB each."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    key = order_key(bits.view(np.float16))
    pattern = np.zeros(1 << 16, np.uint16)
    pattern[key] = bits  # the zero and NaN keys get some zero and NaN: the input's replace it
    return key, pattern


def _is_half(dtype: np.dtype) -> bool:
    """float16 in either byte order (a dtype of the other order is not equal to float16)."""
    return dtype.kind == "f" and dtype.itemsize == 2


def _half_bits(a: np.ndarray) -> np.ndarray:
    """The native uint16 bit patterns of float16 ``a``."""
    return (a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))).view(np.uint16)


def half_keys(a: np.ndarray) -> np.ndarray:
    """``order_key(a)`` of float16 ``a`` by one table lookup (order_key's where passes took
    30 ms for 2^22 values, the lookup 7 ms)."""
    return _half_tables()[0][_half_bits(a)]


def sort_half(a: np.ndarray) -> np.ndarray:
    """``np.sort(a, kind="stable")`` of 1-D float16 ``a``, bit for bit, by NumPy's radix sort
    of its uint16 keys: 23-27 ms against 320-400 ms for 2^22 values (module doc).

    The sorted keys give back every value but the zeros and the NaNs, whose keys are shared:
    their runs are filled with the input's zeros and NaNs in input order
    (:func:`.split_radix.values_of_sorted_keys`, the radix sort's repair too)."""
    bits = _half_bits(a)
    keys = _half_tables()[0][bits]
    keys.sort(kind="stable")
    return values_of_sorted_keys(keys, bits.view(np.float16),
                                 lambda k: _half_tables()[1][k].view(np.float16))


def sort_values(a: np.ndarray, in_place: bool = False) -> np.ndarray:
    """``a`` sorted: float16 by :func:`sort_half` (a new array), bit for bit as
    ``np.sort(a, kind="stable")`` gives it; else NumPy's sort of :func:`sort_kind`, of ``a``
    itself where ``in_place``: equal by value to the stable sort, but the default introsort of
    float32/float64 may order equal keys (-0.0 and 0.0, NaNs of several payloads) otherwise,
    as the README says of the values."""
    if _is_half(a.dtype):
        return sort_half(a)
    if not in_place:
        return np.sort(a, kind=sort_kind(a.dtype))
    a.sort(kind=sort_kind(a.dtype))
    return a


def stable_argsort(a: np.ndarray) -> np.ndarray:
    """``np.argsort(a, kind="stable")`` as int64, by the fastest route measured (module doc)."""
    if (a.dtype.kind in "biu" and a.dtype.itemsize <= 2) or a.dtype.itemsize > 4 \
            or a.size >= _MAX_PACKED:  # fmt: skip
        if _is_half(a.dtype):  # NumPy's stable argsort of it: timsort
            return np.argsort(half_keys(a), kind="stable").astype(np.int64, copy=False)
        return np.argsort(a, kind="stable").astype(np.int64, copy=False)
    keys = half_keys(a) if _is_half(a.dtype) else order_key(a)
    packed = keys.astype(np.uint64)
    del keys
    packed <<= np.uint64(32)
    packed |= np.arange(a.size, dtype=np.uint64)
    packed.sort()
    packed &= np.uint64(_MAX_PACKED - 1)
    return packed.view(np.int64)


def sort_chunk(
    a: np.ndarray, indices: bool, base: int, positions: np.ndarray, local: str = "auto",
    values: bool = True,
) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray]:
    split_radix.check_values_asked(indices, positions, values)
    if local == "radix":
        return split_radix.sort_chunk(a, indices, base, positions, np, values)
    if indices:
        order = stable_argsort(a)
        v = a[order] if values else None
        if base:  # a pass over the int64 indices: none for the first chunk
            order += np.int64(base)
        if v is None:
            return None, order, np.zeros(0, a.dtype)
        return v, order, v[positions]
    v = sort_values(a)
    return v, None, v[positions]


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
        if len(values) == 2 and _is_half(out.dtype):
            # timsort merges two sorted runs in one pass: 10 ms against the keys' 25 ms for
            # 2^22 float16 (par at 4 runs, 27 against 50 ms at 64)
            out.sort(kind="stable")
            return out
        return sort_values(out, in_place=True)
    if len(values) == 1 and not joined:
        return orders[0].copy()
    return np.concatenate(orders)[stable_argsort(np.concatenate(values))]
