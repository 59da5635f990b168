"""The seed's LSD radix sort built from the stable split, for ``sort(x, local="radix")`` on
NumPy or CuPy chunks (the same code: the split is :func:`dask_compact.partition_array`, which
runs the compiled CPU loop or the GPU kernel for the chunk's type).

Every element gets an unsigned key of its width that orders exactly as NumPy sorts
(:func:`order_key`); then, from the lowest bit up, one stable split by ``(key & bit) == 0``
(zeros first) per bit that differs between the keys. A sort of values splits the keys alone
and maps them back (:func:`sorted_values`); an argsort splits words that pack a digit of the
key with the element's rank (:func:`radix_order`), so no int64 permutation is gathered per
bit (that took 25-33 bytes an element). One split per key bit (32 for float32) against
NumPy's and CuPy's tuned sorts: kept to compare the textbook construction with them, not as
the default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "order_key", "from_order_key", "radix_order", "radix_sorted", "sorted_values",
    "values_of_sorted_keys", "sort_chunk", "sort_merge",
]

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
    0.0, every NaN equals every other and comes after +inf; signed integers by their value.

    A float's key is its bits with the sign bit set where it was clear and every bit flipped
    where it was set, made in place in one array beside a mask of the same width (three
    ``where`` passes held five arrays of the width at once: the radix sort's peak on floats)."""
    u = _UINT[a.dtype.itemsize]
    sign = u(1) << u(8 * a.dtype.itemsize - 1)
    if not a.dtype.isnative:  # the keys are read from the bits as native integers
        a = a.astype(a.dtype.newbyteorder("="))
    if a.dtype.kind == "f":
        key = folded_bits(a, xp)
        flip = key >> u(8 * a.dtype.itemsize - 1)  # 1 where the sign bit is set, else 0
        flip *= u(np.iinfo(u).max)  # all ones there
        flip |= sign
        key ^= flip
        del flip
        key[xp.isnan(a)] = u(np.iinfo(u).max)
        return key
    if a.dtype.kind == "i":
        return a.view(u) ^ sign
    return a.view(u)


def from_order_key(key: Any, dtype: np.dtype, xp: Any = np) -> Any:
    """The values (native ``dtype``) whose :func:`order_key` is ``key``, made **in ``key``'s
    memory** (a view of it is returned): exact for every key but a float's zero key (-0.0
    and 0.0 share it: it gives 0.0) and NaN key (every NaN shares it: it gives one NaN);
    :func:`sorted_values` puts the input's back there."""
    dtype = np.dtype(dtype).newbyteorder("=")
    u = key.dtype.type
    sign = u(1) << u(8 * dtype.itemsize - 1)
    if dtype.kind == "f":
        flip = key >> u(8 * dtype.itemsize - 1)  # 1 where the value was not negative
        flip -= u(1)  # 0 there, all ones elsewhere (unsigned arithmetic wraps)
        flip |= sign
        key ^= flip
    elif dtype.kind == "i":
        key ^= sign
    return key.view(dtype)


def _run(keys: Any, key: Any, xp: Any) -> tuple[int, int]:
    """Where sorted ``keys`` hold ``key``: [first, last + 1)."""
    at = xp.asarray([key], dtype=keys.dtype)
    return int(xp.searchsorted(keys, at, side="left")[0]), \
        int(xp.searchsorted(keys, at, side="right")[0])  # fmt: skip


def sorted_values(a: Any, xp: Any = np) -> Any:
    """``np.sort(a, kind="stable")`` of 1-D ``a`` (native byte order), bit for bit, by radix
    splits of its order keys alone: no permutation is made or gathered through (an argsort
    needs one: :func:`radix_order`).

    The sorted keys give back every value (:func:`from_order_key`) but a float's zeros and
    NaNs, whose keys are shared: their runs take the input's zeros and NaNs in input order,
    which is where a stable sort leaves them, so the signs of the zeros and the NaNs'
    payloads are NumPy's."""
    keys = radix_sorted(order_key(a, xp))
    if a.dtype.kind != "f" or a.size == 0:
        return from_order_key(keys, a.dtype, xp)
    return values_of_sorted_keys(keys, a, lambda k: from_order_key(k, a.dtype, xp), xp)


def values_of_sorted_keys(keys: Any, a: Any, values_of: Callable[[Any], Any],
                          xp: Any = np) -> Any:
    """The values of float ``a`` (1-D, native byte order) in the order of ``keys``, its
    :func:`order_key` sorted: ``values_of(keys)`` (which may make them in ``keys``' memory)
    gives back every value but the zeros and the NaNs, whose keys are shared (-0.0 and 0.0
    the sign bit alone, every NaN all ones): their runs take ``a``'s zeros and NaNs in input
    order, which is where a stable sort leaves them, so the signs of the zeros and the
    NaNs' payloads are NumPy's. The one repair of :func:`sorted_values` and
    :func:`.numpy_sort.sort_half` (float16 by its table of keys)."""
    u = keys.dtype.type
    sign = u(1) << u(8 * a.dtype.itemsize - 1)
    magnitude = ~sign  # every bit but the sign
    infinity = u(int(magnitude) & ~((1 << np.finfo(a.dtype).nmant) - 1))  # exponent all ones
    zeros = _run(keys, sign, xp)  # the key of 0.0 and -0.0
    first_nan = _run(keys, u(np.iinfo(u).max), xp)[0]
    out = values_of(keys)  # after the runs: it may overwrite keys
    del keys
    # both by the bits: CuPy's kernels flush subnormals to zero, and NumPy's isnan of
    # float16 took 26 ms for 2^22 values where the bits take 0.7 ms
    if zeros[1] > zeros[0]:
        out[zeros[0]:zeros[1]] = a[(a.view(u) & magnitude) == 0]
    if first_nan < a.size:  # a NaN's magnitude is above infinity's
        out[first_nan:] = a[(a.view(u) & magnitude) > infinity]
    return out


def _split_bits(key: Any) -> int:
    """How many low bits of ``key`` need a split: every key in [min, max] shares the bits
    above the highest one where min and max differ."""
    return (int(key.min()) ^ int(key.max())).bit_length() if key.size > 1 else 0


def radix_sorted(key: Any) -> Any:
    """Unsigned ``key`` sorted (a new array) by one stable split of the keys themselves per
    differing bit, lowest first: a split holds the keys and their split copy, nothing else.
    (The caller's reference goes with the call: pass a temporary to free it on the way.)"""
    from ..stable_split import partition_array

    u = key.dtype.type
    bits = _split_bits(key)
    if bits == 0:
        return key.copy()  # all equal; and an unsigned key is a view of the input
    for b in range(bits):
        key, _ = partition_array(key, f"(x & {int(u(1) << u(b))}) == 0", output="values")
    return key


def _digit(key: Any, low: int, width: int) -> Any:
    """Bits [low, low + width) of ``key``, in the narrowest unsigned type that holds them."""
    u = key.dtype.type
    d = (key >> u(low)) & u((1 << width) - 1)
    return d.astype(next(t for t in _UINT.values() if 8 * np.dtype(t).itemsize >= width),
                    copy=False)


def radix_order(key: Any, xp: Any = np) -> Any:
    """The stable argsort (int64) of unsigned ``key`` by one stable split per differing bit.

    Each split moves one word per element that holds a digit of the key above the element's
    rank (its position in the order so far): a uint32 where the bits to split and the rank
    fit 32 bits, else a uint64 whose low ``64 - rank bits`` hold the digit, so a key of 4
    bytes or less is one round and an 8-byte key two (below 2^32 elements), the second
    round's digit taken through the first's order. A split holds the words and their split
    copy (16 bytes an element at most); splitting the key beside an int64 permutation held
    the permutation, the split's int64 order and the permutation's gathered copy, 24 bytes
    an element besides the keys (an int8 chunk of 2^31 + 7 elements was killed at 23 GB,
    the fourth session's probe). The digits of later rounds are cut from the key before the
    first, and the key is let go (the caller's reference goes with a temporary argument)."""
    from ..stable_split import partition_array

    n = key.size
    top = _split_bits(key)
    if top == 0:
        return xp.arange(n, dtype=np.int64)
    rank_bits = max(1, (n - 1).bit_length())
    word = np.uint32 if top + rank_bits <= 32 else np.uint64
    per_round = 8 * np.dtype(word).itemsize - rank_bits
    widths = [min(per_round, top - low) for low in range(0, top, per_round)]
    digits = [_digit(key, low, w) for low, w in zip(range(0, top, per_round), widths)]
    del key
    rank_mask = word((1 << rank_bits) - 1)
    perm: Any = None
    for width in widths:
        d = digits.pop(0)
        words = (d if perm is None else d[perm]).astype(word)
        del d
        words <<= word(rank_bits)
        words |= xp.arange(n, dtype=word)
        for b in range(rank_bits, rank_bits + width):
            words, _ = partition_array(words, f"(x & {1 << b}) == 0", output="values")
        words &= rank_mask
        perm = words if perm is None else perm[words]
        del words
    return perm.view(np.int64) if word is np.uint64 else perm.astype(np.int64)


def check_values_asked(indices: bool, positions: np.ndarray, values: bool) -> None:
    """``sort_chunk``'s ``values=False`` is an argsort with no sample (module numpy_sort)."""
    if not values and (not indices or positions.size):
        raise ValueError("sort_chunk(values=False) is an argsort with no sample positions")


def sort_chunk(a: Any, indices: bool, base: int, positions: np.ndarray, xp: Any,
               values: bool = True) -> tuple[Any, Any, np.ndarray]:
    """The contract of numpy_sort.sort_chunk, by the radix sort: the values alone by
    :func:`sorted_values`, an argsort by :func:`radix_order`."""
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    if not indices:
        v = sorted_values(a, xp)
        return v, None, _sample(v, positions, xp)
    perm = radix_order(order_key(a, xp), xp)
    v = a[perm] if values else None
    if base:
        perm += np.int64(base)
    if v is None:
        return None, perm, np.zeros(0, a.dtype)
    return v, perm, _sample(v, positions, xp)


def _sample(values: Any, positions: np.ndarray, xp: Any) -> np.ndarray:
    sample = values[xp.asarray(positions)]
    return sample if xp is np else xp.asnumpy(sample)


def sort_merge(values: list, orders: list | None, xp: Any, joined: bool = False) -> Any:
    """The contract of numpy_sort.sort_merge, by the radix sort (stable: ties keep the
    pieces' order)."""
    if len(values) == 1 and not joined:
        return (values[0] if orders is None else orders[0]).copy()
    v = xp.concatenate(values)
    if orders is None:
        return sorted_values(v, xp)
    perm = radix_order(order_key(v, xp), xp)
    del v
    return xp.concatenate(orders)[perm]
