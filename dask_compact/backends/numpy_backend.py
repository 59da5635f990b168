"""Compact NumPy chunks on the CPU: the fused numba loop, or NumPy with a boolean mask.

See :mod:`dask_compact.dispatch` for the contract. The fused path (one pass, no mask array)
runs when the predicate was traced or parsed, its dtypes are ones the loop computes exactly,
and its constants fit their dtypes; otherwise the predicate is evaluated with NumPy into a mask
(the mask path), which gives NumPy's own results and errors. The path taken and why is logged
at DEBUG on the ``dask_compact`` logger.

``stable`` and ``algorithm`` choose between GPU kernels; the CPU loop is always stable and has
one algorithm, so they are accepted and ignored here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from ..codegen.numba_loop import OUTPUTS, UnsupportedPredicate, fused_loop
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow
from ..validate import by_output

__all__ = ["compact", "compact_into", "compact_many", "compact_masked"]

logger = logging.getLogger("dask_compact")

# Keep a view of the full-length output buffer only when it is at least this full; below it,
# copy the kept part so a tiny result does not pin a chunk-sized allocation. A quarter, not a
# half: at p = 0.5 a half would copy about every other chunk (a quarter of the loop's time at
# 2^24 float32), and the unwritten tail of a large buffer is never touched, so it costs address
# space rather than memory on Linux.
_KEEP_VIEW_FRACTION = 0.25


def _check_output(output: str) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {', '.join(OUTPUTS)}; got {output!r}")


Alloc = Callable[[int, np.dtype], np.ndarray]


def _trim(buf: np.ndarray, k: int, alloc: Alloc | None = None) -> np.ndarray:
    """The first ``k`` elements of a loop's output buffer: a view when they fill enough of it,
    else a copy (into ``alloc``'s memory when given, so the large buffer can be reused)."""
    if k == buf.shape[0] or k >= _KEEP_VIEW_FRACTION * buf.shape[0]:
        return buf[:k]
    if alloc is None:
        return buf[:k].copy()
    small = alloc(k, buf.dtype)
    small[:] = buf[:k]
    return small


def _flat(a: np.ndarray) -> np.ndarray:
    # C order, contiguous (a view when possible); the loop is compiled for C-contiguous 1-D.
    return np.ascontiguousarray(np.ravel(a, order="C"))


def _run_fused(a: np.ndarray, pred: Predicate, output: str, index_base: int,
               alloc: Alloc | None = None) -> Any:
    """The fused loop's result, or raise UnsupportedPredicate/ParamOverflow/TypeError."""
    return _run_fused_many([a], pred, output, [index_base], alloc)


def compact(
    a: np.ndarray,
    pred: Predicate,
    output: str = "values",
    stable: bool = True,
    algorithm: str | None = None,
    index_base: int = 0,
    alloc: Alloc | None = None,
) -> Any:
    """Select the elements of ``a`` (flattened in C order) where ``pred`` holds.

    Returns the values (``a.dtype``), the int64 indices ``index_base + flat index``, or both as
    a tuple, each 1-D of exact length.

    ``alloc(n, dtype)``: where the fused loop's output buffers (``a.size`` elements, of which
    the result is a view of the first ``count``) come from, e.g. a pool of buffers already
    paged in (the batch job's, see :mod:`dask_compact.batch.host_buffers`); default
    ``np.empty``, and a small result is then copied out of the large buffer.
    """
    _check_output(output)
    a = np.asarray(a)
    if pred.path == "fused":
        try:
            result = _run_fused(a, pred, output, index_base, alloc)
        except (UnsupportedPredicate, ParamOverflow, TypeError) as e:
            reason = str(e)
        else:
            logger.debug("compact %s %s chunk %s: fused loop", a.dtype, a.shape, pred)
            return result
    else:
        reason = pred.reason or "not traced"
    logger.debug("compact %s %s chunk %s: mask path (%s)", a.dtype, a.shape, pred, reason)
    return compact_masked(a, pred.mask(a), output, index_base)


def compact_many(
    blocks: list[np.ndarray], pred: Predicate, output: str = "values", stable: bool = True,
    algorithm: str | None = None, bases: list[int] | None = None,
) -> Any:
    """A run of chunks compacted by one task: the concatenation of their outputs.

    ``bases[i]`` is chunk i's global index start. The fused loop writes every chunk straight
    into its place in one buffer (no concatenation copy); the mask path concatenates.
    """
    _check_output(output)
    bases = [0] * len(blocks) if bases is None else list(bases)
    blocks = [np.asarray(b) for b in blocks]
    if len(blocks) == 1:
        return compact(blocks[0], pred, output, stable, algorithm, bases[0])
    if pred.path == "fused" and len({b.dtype for b in blocks}) == 1:
        try:
            return _run_fused_many(blocks, pred, output, bases)
        except (UnsupportedPredicate, ParamOverflow, TypeError):
            pass  # each chunk takes the mask path below, which logs why
    parts = [compact(b, pred, output, stable, algorithm, base) for b, base in zip(blocks, bases)]
    if output == "both":
        return np.concatenate([v for v, _ in parts]), np.concatenate([i for _, i in parts])
    return np.concatenate(parts)


def _run_fused_many(
    blocks: list[np.ndarray], pred: Predicate, output: str, bases: list[int],
    alloc: Alloc | None = None,
) -> Any:
    """Every chunk through the fused loop into one buffer (chunk i's indices from bases[i])."""
    dtype = blocks[0].dtype
    tp = pred.typed(dtype)  # TypeError where NumPy's typing refuses or gives non-bools
    loop = fused_loop(tp, output)
    params = tp.bind(pred.params)
    n = sum(b.size for b in blocks)
    make = alloc or (lambda m, dt: np.empty(m, dtype=dt))
    out = make(n, dtype) if output != "indices" else None
    idx = make(n, np.dtype(np.int64)) if output != "values" else None
    k = 0
    for b, base in zip(blocks, bases):
        k += loop(
            _flat(b), None if out is None else out[k:], None if idx is None else idx[k:],
            int(base), params,
        )
    return by_output(
        None if out is None else _trim(out, k, alloc),
        None if idx is None else _trim(idx, k, alloc), output
    )


def compact_masked(
    a: np.ndarray, mask: np.ndarray, output: str = "values", index_base: int = 0
) -> Any:
    """Select the elements of ``a`` where the boolean array ``mask`` (``a``'s shape) is true."""
    _check_output(output)
    a = np.asarray(a)
    mask = np.asarray(mask)
    if mask.dtype != np.dtype(bool):
        raise TypeError(f"mask must be a boolean array, got dtype {mask.dtype}")
    if mask.shape != a.shape:
        raise ValueError(f"mask shape {mask.shape} does not match the chunk's shape {a.shape}")
    m = np.ravel(mask, order="C")
    values = np.ravel(a, order="C")[m] if output != "indices" else None
    indices = None
    if output != "values":
        indices = np.flatnonzero(m).astype(np.int64, copy=False)
        if index_base:
            indices += np.int64(index_base)
    return by_output(values, indices, output)


def compact_into(
    a: np.ndarray, pred: Predicate, output: str, out_values: np.ndarray | None,
    out_indices: np.ndarray | None, count: np.ndarray | None = None,
) -> np.ndarray:
    """The selection of ``a`` written into the caller's buffers (capacity >= ``a.size``, the
    arguments checked by :func:`dask_compact.compact_into`), its length into ``count[0]``
    (None: a new int64 array).

    The fused loop writes straight into the buffers; it stores every element at the running
    count before deciding whether to keep it, so the element just past the count may hold
    scratch. The mask path writes the selection only.
    """
    flat = _flat(a)
    if count is None:
        count = np.empty(1, dtype=np.int64)
    if pred.path == "fused":
        try:
            tp = pred.typed(flat.dtype)
            k = fused_loop(tp, output)(flat, out_values, out_indices, 0, tp.bind(pred.params))
        except (UnsupportedPredicate, ParamOverflow, TypeError) as e:
            logger.debug("compact_into %s chunk %s: mask path (%s)", a.dtype, pred, e)
        else:
            count[0] = k
            return count
    m = np.ravel(np.asarray(pred.mask(a)), order="C")
    k = int(np.count_nonzero(m))
    if out_values is not None:
        np.compress(m, flat, out=out_values[:k])
    if out_indices is not None:
        out_indices[:k] = np.flatnonzero(m)
    count[0] = k
    return count
