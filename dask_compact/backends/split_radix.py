"""The seed's LSD radix sort built from the stable split, for ``sort(x, local="radix")`` on
NumPy or CuPy chunks (the same code: the split is :func:`dask_compact.partition_array`, which
runs the compiled CPU loop or the GPU kernel for the chunk's type).

Every element gets an unsigned key of its width that orders exactly as NumPy sorts
(:func:`order_key`); then, from the lowest bit up, one stable split by ``(key & bit) == 0``
(zeros first) per bit that differs between the keys reorders the keys and the permutation.
After the last bit the permutation is the stable argsort. One split per key bit (32 for
float32) against NumPy's and CuPy's tuned sorts: kept to compare the textbook construction
with them, not as the default.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["order_key", "radix_order", "sort_chunk", "sort_merge"]

_UINT: dict[int, Any] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def folded_bits(a: Any, xp: Any = np) -> Any:
    """The bits of float array ``a`` (native byte order) as unsigned integers of its width,
    -0.0's as +0.0's. By the bits, not as -0.0 + 0.0: that arithmetic flushes subnormals to
    zero in CuPy's kernels (compiled with -ftz), which then sorted among the zeros (the GPU
    review probe, 2026-11-28: np.float32(-1e-45) after 0.0)."""
    u = _UINT[a.dtype.itemsize]
    bits = a.view(u)
    return xp.where(bits == u(1) << u(8 * a.dtype.itemsize - 1), u(0), bits)


def order_key(a: Any, xp: Any = np) -> Any:
    """Unsigned integers of ``a``'s width that order exactly as NumPy sorts ``a``: -0.0 equals
    0.0, every NaN equals every other and comes after +inf; signed integers by their value."""
    u = _UINT[a.dtype.itemsize]
    sign = u(1) << u(8 * a.dtype.itemsize - 1)
    if not a.dtype.isnative:  # the keys are read from the bits as native integers
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype.kind == "f":
        bits = folded_bits(a, xp)
        key = xp.where((bits & sign) != 0, ~bits, bits | sign)
        return xp.where(xp.isnan(a), u(np.iinfo(u).max), key)
    if a.dtype.kind == "i":
        return a.view(u) ^ sign
    return a.view(u)


def radix_order(key: Any, xp: Any = np) -> Any:
    """The stable argsort (int64) of unsigned ``key`` by one stable split per differing bit."""
    from ..stable_split import partition_array

    perm = xp.arange(key.size, dtype=np.int64)
    if key.size < 2:
        return perm
    u = key.dtype.type
    # every key in [min, max] shares the bits above the highest one where min and max differ:
    # only the bits below it need a split
    top = (int(key.min()) ^ int(key.max())).bit_length()
    for b in range(top):
        order, _ = partition_array(key, f"(x & {int(u(1) << u(b))}) == 0", output="indices")
        key = key[order]
        perm = perm[order]
    return perm


def sort_chunk(a: Any, indices: bool, base: int, positions: np.ndarray, xp: Any
               ) -> tuple[Any, Any, np.ndarray]:
    """The contract of numpy_sort.sort_chunk, by the radix sort."""
    perm = radix_order(order_key(a, xp), xp)
    values = a[perm]
    sample = values[xp.asarray(positions)]
    sample = sample if xp is np else xp.asnumpy(sample)
    if indices:
        perm += np.int64(base)
        return values, perm, sample
    return values, None, sample


def sort_merge(values: list, orders: list | None, xp: Any, joined: bool = False) -> Any:
    """The contract of numpy_sort.sort_merge, by the radix sort (stable: ties keep the
    pieces' order)."""
    if len(values) == 1 and not joined:
        return (values[0] if orders is None else orders[0]).copy()
    v = xp.concatenate(values)
    perm = radix_order(order_key(v, xp), xp)
    return v[perm] if orders is None else xp.concatenate(orders)[perm]
