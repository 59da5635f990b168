"""CPU scans (NumPy arrays): one sequential compiled loop, the order NumPy's ``cumsum`` adds
in, with a base (a dask chunk's global offset) folded in, so a chunk is one pass over its data.
Also the CPU form of ``compact_array(..., algorithm="scan")``: mask, scan, scatter.

Compiled once per (input dtype, output dtype) by numba (``cache=True``), shared by every call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codegen.numba_ready import njit  # numba, imported with Ctrl-C held
from ..predicate.core import Predicate

__all__ = ["scan", "total", "compact_scan"]


@njit(nogil=True, cache=True, boundscheck=False)
def _scan_loop(a, out, base, has_base, exclusive):  # pragma: no cover - compiled
    # Without a base the sum starts at a[0] itself, as NumPy's cumsum does: 0.0 + a[0] would
    # turn -0.0 into 0.0 and quiet a signalling NaN (a probe)
    if has_base:
        out[0] = base + a[0]
    else:
        out[0] = a[0]  # stored, then read: a[0] in the output's type
    acc = out[0]
    if exclusive:
        out[0] = base
        for i in range(1, a.size):
            out[i] = acc
            acc += a[i]
    else:
        for i in range(1, a.size):
            acc += a[i]
            out[i] = acc
    return acc


@njit(nogil=True, cache=True, boundscheck=False)
def _sum_loop(a, base):  # pragma: no cover - compiled
    acc = base
    for i in range(a.size):
        acc += a[i]
    return acc


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
         base: Any = None) -> Any:
    """The scan of ``a`` (flattened in C order) into a new 1-D ``acc`` array, ``base`` added to
    every element, None for none (``algorithm``: "auto" or "sequential", checked by the
    caller)."""
    acc = np.dtype(acc)
    flat = _prepared(a, acc)
    out = np.empty(flat.size, dtype=acc)
    if flat.size:
        _scan_loop(flat, out, acc.type(0 if base is None else base), base is not None,
                   bool(exclusive))
        at = int(bool(exclusive))  # where a[0] itself is the running sum
        if base is None and flat.dtype == acc and acc.kind == "f" and at < flat.size:
            # copied as bytes: numba 0.60's loop (the lowest allowed) quieted a signalling NaN
            # on the way through, which NumPy's cumsum keeps (a probe of the lowest versions)
            out[at:at + 1] = flat[:1]
    return out


def total(a: np.ndarray, acc: np.dtype) -> np.generic:
    """The sum of ``a`` in ``acc``, added in order (as the scan adds)."""
    acc = np.dtype(acc)
    flat = _prepared(a, acc)
    if flat.size == 0:
        return acc.type(0)
    return _wrapped(_sum_loop(flat, acc.type(0)), acc)


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


@njit(nogil=True, cache=True, boundscheck=False)
def _scatter(a, flags, pos, base, vals, idx, want_vals, want_idx):  # pragma: no cover
    for i in range(a.size):
        if flags[i]:
            k = pos[i]
            if want_vals:
                vals[k] = a[i]
            if want_idx:
                idx[k] = base + i


def compact_scan(a: np.ndarray, pred: Predicate, output: str, index_base: int) -> Any:
    """``compact_array(..., algorithm="scan")`` on the CPU: the predicate's boolean mask
    (NumPy's evaluation of the traced tree, or the callable), the exclusive scan of the mask
    (the loop above), one scatter loop."""
    flat = np.ascontiguousarray(a).reshape(-1)
    # a callable's mask on the chunk as given (it may broadcast against the trailing axes)
    flags = np.ascontiguousarray(np.ravel(pred.mask(flat if pred.expr is not None else a),
                                          order="C"))
    if flags.dtype != np.bool_:
        flags = flags.astype(np.bool_)
    pos = scan(flags, True, "sequential", np.dtype(np.int64))
    k = int(pos[-1]) + int(flags[-1]) if flat.size else 0
    want_v, want_i = output in ("values", "both"), output in ("indices", "both")
    vals = np.empty(k if want_v else 0, dtype=flat.dtype)
    idx = np.empty(k if want_i else 0, dtype=np.int64)
    if k:
        half = flat.dtype == np.float16  # numba has no float16: moved as its bits
        data, dst = (flat.view(np.uint16), vals.view(np.uint16)) if half else (flat, vals)
        _scatter(data, flags, pos, np.int64(index_base), dst, idx, want_v, want_i)
    if output == "values":
        return vals
    if output == "indices":
        return idx
    return vals, idx
