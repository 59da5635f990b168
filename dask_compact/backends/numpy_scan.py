"""CPU scans (NumPy arrays): one sequential compiled loop, the order NumPy's ``cumsum`` adds
in, with a base (a dask chunk's global offset) folded in, so a chunk is one pass over its data.
Also the CPU form of ``compact_array(..., algorithm="scan")``: mask, scan, scatter.

The loops are in :mod:`.numpy_scan_loops`, imported at the first call that runs one. A
process without the room to load numba (a small distributed worker:
:func:`..compiler_room.no_room_for_compiler`) gets the same results from NumPy instead, the
same additions in the same order (:func:`_cumsum_into`), and never imports numba.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from ..compiler_room import compiled_loops
from ..predicate.core import Predicate

__all__ = ["scan", "total", "compact_scan"]

# The NumPy forms add this many elements a step, each step's first element to the last sum
# of the step before: what they add to memory is at most one step (a chunk-sized temporary
# is what a worker without room for numba may not have either).
_STEP = 1 << 16


def _loops() -> ModuleType | None:
    """The compiled loops, or None where this process has no room for numba."""
    return compiled_loops("dask_compact.backends.numpy_scan_loops")


def _prepared(a: np.ndarray, acc: np.dtype) -> np.ndarray:
    """``a`` flattened (C order) in a dtype the loop adds into ``acc`` without changing the
    accumulator's type: numba types ``acc += x`` by NumPy's promotion, which is ``acc`` for
    every default pairing (bool/intN -> int64, uintN -> uint64, floats); an explicit ``dtype=``
    that promotes elsewhere (uint64 input into int64: float64) casts the input first, as NumPy
    casts it before adding, and so does a float accumulator of another input dtype (numba
    would add int16 into float32 in float64). A narrower integer accumulator may be added in
    int64 by numba: its stores wrap to the same bits as NumPy's wrapped sums."""
    flat = np.ascontiguousarray(a).reshape(-1)
    if acc.kind == "f" and flat.dtype != acc or np.promote_types(flat.dtype, acc) != acc:
        flat = flat.astype(acc)
    return flat


def scan(a: np.ndarray, exclusive: bool, algorithm: str, acc: np.dtype,
         base: Any = None, out_dtype: Any = None) -> Any:
    """The scan of ``a`` (flattened in C order) into a new 1-D ``acc`` array, ``base`` added to
    every element, None for none (``algorithm``: "auto" or "sequential", checked by the
    caller); cast to ``out_dtype`` where given (a narrower integer: the sums' low bits)."""
    if out_dtype is not None and np.dtype(out_dtype) != np.dtype(acc):
        return _scan_narrow(a, exclusive, algorithm, acc, base, np.dtype(out_dtype))
    acc = np.dtype(acc)
    flat = _prepared(a, acc)
    out = np.empty(flat.size, dtype=acc)
    if flat.size:
        loops = _loops()
        if loops is not None:
            loops.scan_loop(flat, out, acc.type(0 if base is None else base), base is not None,
                            bool(exclusive))
        elif exclusive:  # element i: the sum before it, the base alone first
            out[0] = acc.type(0 if base is None else base)
            _cumsum_into(flat[:-1], out[1:], base)
        else:
            _cumsum_into(flat, out, base)
        at = int(bool(exclusive))  # where a[0] itself is the running sum
        if base is None and flat.dtype == acc and acc.kind == "f" and at < flat.size:
            # copied as bytes: numba 0.60's loop (the lowest allowed) quieted a signalling NaN
            # on the way through, which NumPy's cumsum keeps (a probe of the lowest versions)
            out[at:at + 1] = flat[:1]
    return out


def _scan_narrow(a: np.ndarray, exclusive: bool, algorithm: str, acc: np.dtype, base: Any,
                 narrow: np.dtype) -> np.ndarray:
    """The scan into a narrower integer ``narrow`` than the uint32 ``acc`` (their low bits):
    the loop stores ``narrow`` itself, adding in numba's int64 (each store wraps to the bits
    of the uint32 sum's low ones; the base, a uint32 offset, by its own low bits), which saves
    the uint32 output and its cast: one pass over the data."""
    loops = _loops()
    if loops is None:
        return scan(a, exclusive, algorithm, acc, base).astype(narrow)
    flat = _prepared(a, narrow)  # an input wider than ``narrow``: its low bits, the same sums
    out = np.empty(flat.size, dtype=narrow)
    if flat.size:
        low = narrow.type(0) if base is None else np.asarray(base, dtype=acc).astype(narrow)[()]
        loops.scan_loop(flat, out, low, base is not None, bool(exclusive))
    return out


def _cumsum_into(flat: np.ndarray, out: np.ndarray, base: Any) -> None:
    """The compiled scan's inclusive sums by NumPy: ``base + a[0]`` (``a[0]`` itself without a
    base), then ``+ a[1]``, ... in ``out``'s dtype, one after the other as the loop adds (and
    ``np.cumsum``: an accumulate adds in order, unlike ``np.sum``'s pairs); without the
    warnings of overflowing or invalid sums, which the loop does not give either."""
    if not flat.size:
        return
    out[...] = flat  # the loop's conversion of each element to the accumulator's type
    with np.errstate(all="ignore"):
        if base is not None:
            np.add(out.dtype.type(base), out[:1], out=out[:1])
        for lo in range(0, out.size, _STEP):
            step = out[lo : lo + _STEP]
            if lo:
                np.add(out[lo - 1 : lo], step[:1], out=step[:1])  # the sum so far, then a[lo]
            np.cumsum(step, out=step)


def total(a: np.ndarray, acc: np.dtype) -> np.generic:
    """The sum of ``a`` in ``acc``, added in order (as the scan adds)."""
    acc = np.dtype(acc)
    flat = _prepared(a, acc)
    # A float sum starts at -0.0, the identity of IEEE addition (-0.0 + v is v for every v):
    # from 0.0, a chunk of -0.0s totalled 0.0, and every later chunk of a cumsum whose prefix
    # sums to -0.0 came back 0.0 where np.cumsum keeps -0.0 (until 2026-12-01; a probe)
    zero = acc.type(-0.0 if acc.kind == "f" else 0)
    if flat.size == 0:
        return zero
    loops = _loops()
    if loops is not None:
        return _wrapped(loops.sum_loop(flat, zero), acc)
    last = np.empty(1, dtype=acc)
    for lo in range(0, flat.size, _STEP):  # -0.0 + a[0] + a[1] + ..., a step at a time
        step = np.empty(min(_STEP, flat.size - lo), dtype=acc)
        _cumsum_into(flat[lo : lo + _STEP], step, last[0] if lo else zero)
        last[0] = step[-1]
    return acc.type(last[0])


def _wrapped(value: Any, acc: np.dtype) -> np.generic:
    """``value`` (the loop's sum) as ``acc``: an integer accumulator narrower than the loop's
    64 bits wraps as NumPy's sums do (``acc.type`` of a Python int out of range raises)."""
    if acc.kind not in "iu":
        return acc.type(value)
    bits = 8 * acc.itemsize
    v = int(value) & ((1 << bits) - 1)
    if acc.kind == "i" and v >= 1 << (bits - 1):
        v -= 1 << bits
    return acc.type(v)


def compact_scan(a: np.ndarray, pred: Predicate, output: str, index_base: int) -> Any:
    """``compact_array(..., algorithm="scan")`` on the CPU: the predicate's boolean mask
    (NumPy's evaluation of the traced tree, or the callable), the exclusive scan of the mask
    (`numpy_scan_loops`), one scatter loop; NumPy's boolean indexing where this process has no
    room for numba (the same selection)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    # a callable's mask on the chunk as given (it may broadcast against the trailing axes)
    flags = np.ascontiguousarray(np.ravel(pred.mask(flat if pred.expr is not None else a),
                                          order="C"))
    if flags.dtype != np.bool_:
        flags = flags.astype(np.bool_)
    loops = _loops()
    if loops is None:  # NumPy's boolean indexing, the same selection
        from .numpy_backend import compact_masked

        return compact_masked(flat, flags, output, index_base)
    want_v, want_i = output in ("values", "both"), output in ("indices", "both")
    pos = scan(flags, True, "sequential", np.dtype(np.int64))
    k = int(pos[-1]) + int(flags[-1]) if flat.size else 0
    vals = np.empty(k if want_v else 0, dtype=flat.dtype)
    idx = np.empty(k if want_i else 0, dtype=np.int64)
    if k:
        half = flat.dtype == np.float16  # numba has no float16: moved as its bits
        data, dst = (flat.view(np.uint16), vals.view(np.uint16)) if half else (flat, vals)
        loops.scatter(data, flags, pos, np.int64(index_base), dst, idx, want_v, want_i)
    if output == "values":
        return vals
    if output == "indices":
        return idx
    return vals, idx
