"""Sort CuPy chunks on their GPU: the chunk-level steps of :func:`dask_compact.sort` and
``argsort`` (the contract is in :mod:`.numpy_sort`).

``cupy.sort`` and ``cupy.argsort`` are stable, and CuPy documents NaNs last; but Thrust may
take a radix sort over the float's bits for them, which puts NaNs with the sign bit set (what
x86 arithmetic makes, e.g. ``inf - inf``) first and -0.0 before 0.0. So, whichever route CuPy
takes: a sort of values moves any leading NaNs to the end (the values are equal to each other
otherwise, so nothing else changes), and an argsort sorts keys in which -0.0 is 0.0 and every
NaN is the positive quiet NaN, so equal values keep their index order as NumPy's stable
argsort does. Float chunks are searched for the splitters by their order keys: CuPy's
float32 and float16 comparisons flush subnormals, and ``cupy.searchsorted`` walks a run of
NaNs one by one for a NaN query.
"""

from __future__ import annotations

from typing import Any

import cupy
import numpy as np

from ..cache import BoundedCache
from . import split_radix
from .cupy_modules import build_modules
from .cupy_source import sort_keys_name, sort_keys_source

__all__ = ["sort_chunk", "sort_bounds", "sort_merge"]


def _keys(a: Any) -> Any:
    """``a`` where NumPy's sort order has ties that a sort over bits does not: -0.0 as 0.0,
    every NaN as one positive NaN; by one kernel (kernels/sort_keys.cu), a new array."""
    if a.dtype.kind != "f":
        return a
    u = np.dtype(f"u{a.dtype.itemsize}")
    bits = cupy.ascontiguousarray(a).view(u)
    keys = cupy.empty_like(bits)
    n = bits.size
    if n:
        inf, nan = (np.array(v, a.dtype).view(u)[()] for v in (np.inf, np.nan))
        blocks = min(-(-n // _KEY_BLOCK), _KEY_MAX_BLOCKS)
        _key_kernel(a.dtype.itemsize)((blocks,), (_KEY_BLOCK,), (bits, keys, np.int64(n), inf, nan))
    return keys.view(a.dtype)


_KEY_BLOCK = 256
# a grid-stride loop past this many blocks (2^20 blocks: 2^28 elements one each)
_KEY_MAX_BLOCKS = 1 << 20
# (device, float width) -> the keys kernel, built at its first use (NVRTC or CuPy's disk cache)
_key_kernels: BoundedCache[tuple[int, int], Any] = BoundedCache("cupy sort key kernels")


def _key_kernel(itemsize: int) -> Any:
    name = sort_keys_name(itemsize)

    def build() -> Any:
        return build_modules(sort_keys_source(), {"keys": name})["keys"].get_function(name)

    return _key_kernels.get_or_build((cupy.cuda.Device().id, itemsize), build)


def _nans_last(v: Any) -> Any:
    """A sorted float array with any NaNs the sort put first moved to the end (in order)."""
    if v.dtype.kind != "f" or v.size == 0 or not bool(cupy.isnan(v[0])):
        return v
    nan = cupy.isnan(v)
    return cupy.concatenate([v[~nan], v[nan]])


def sort_chunk(
    a: Any, indices: bool, base: int, positions: np.ndarray, local: str = "auto",
    values: bool = True,
) -> tuple[Any, Any, np.ndarray]:
    split_radix.check_values_asked(indices, positions, values)
    if local == "radix":
        return split_radix.sort_chunk(a, indices, base, positions, cupy, values)
    if indices:
        keys = _keys(a)
        order = cupy.argsort(keys).astype(cupy.int64, copy=False)
        v = keys[order] if values else None  # an argsort of the whole array drops them
        del keys
        if base:
            order += base
        if v is None:
            return None, order, np.zeros(0, a.dtype)
        return v, order, _sample(v, positions)
    v = _nans_last(cupy.sort(a))
    return v, None, _sample(v, positions)


def _sample(values: Any, positions: np.ndarray) -> np.ndarray:
    """``values[positions]`` on the host; nothing asked of the device for no positions (a
    one-chunk sort: the upload and the copy back cost ~0.1 ms of its call on the H100 host)."""
    if positions.size == 0:
        return np.zeros(0, values.dtype)
    return cupy.asnumpy(values[cupy.asarray(positions)])


def sort_bounds(values: Any, split_values: np.ndarray, split_index: np.ndarray,
                base: int) -> np.ndarray:  # fmt: skip
    if values.dtype.kind == "f":
        # searched by the order keys (NaNs the largest, -0.0 as 0.0), not by the floats:
        # CuPy's float32 and float16 comparisons flush subnormals (-1e-45 would be taken for
        # 0.0), and cupy.searchsorted walks a run of NaNs one by one for a NaN query
        split_values = split_radix.order_key(np.asarray(split_values, values.dtype), np)
        values = split_radix.order_key(values, cupy)
    q = cupy.asarray(split_values)
    lo = cupy.searchsorted(values, q, side="left")
    hi = cupy.searchsorted(values, q, side="right")
    lo_h, hi_h = cupy.asnumpy(lo).astype(np.int64), cupy.asnumpy(hi).astype(np.int64)
    return np.clip(split_index - np.int64(base), lo_h, hi_h)


def sort_merge(like: Any, values: list, orders: list | None, local: str = "auto",
               joined: bool = False) -> Any:
    if local == "radix":
        return split_radix.sort_merge(values, orders, cupy, joined)
    v = values[0] if len(values) == 1 else cupy.concatenate(values)
    if orders is None:
        if len(values) == 1 and not joined:
            return values[0].copy()
        return _nans_last(cupy.sort(v))
    if len(values) == 1 and not joined:
        return orders[0].copy()
    o = orders[0] if len(orders) == 1 else cupy.concatenate(orders)
    return o[cupy.argsort(v)]
