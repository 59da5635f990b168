"""Chunk-level compaction: what one Dask task runs, and the public :func:`compact_array`."""

from __future__ import annotations

from typing import Any

import numpy as np

from .dispatch import compact_chunk, compact_many, compact_masked
from .predicate import PredicateLike, as_predicate
from .validate import check_algorithm, check_chunk_type, check_dtype, check_output, native


def compact_array(
    a: Any,
    pred: PredicateLike,
    *,
    output: str = "values",
    stable: bool = True,
    algorithm: str = "auto",
) -> Any:
    """Compact one in-memory NumPy (or CuPy) array, without Dask.

    Parameters
    ----------
    a : numpy.ndarray or cupy.ndarray
        Any shape; flattened in C order.
    pred : callable or str
        Elementwise predicate, e.g. ``lambda v: v > 0.5`` or ``"x > 0.5"``.
    output : {"values", "indices", "both"}
        The selected values (``a.ravel()[pred(a).ravel()]``), their flat indices
        (``np.flatnonzero(pred(a))``, int64), or the tuple ``(values, indices)``.
    stable : bool
        Keep the input order. ``False`` lets the GPU use the faster unordered kernel.
    algorithm : {"auto", "single-pass", "three-pass", "hybrid"}
        GPU kernel variant; ignored on the CPU, which has one fused loop.

    Returns
    -------
    array or tuple of arrays
        1-D, of exact length, of ``a``'s array type.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_compact import compact_array
    >>> compact_array(np.array([0.1, 0.7, 0.3, 0.9]), "x > 0.5")
    array([0.7, 0.9])
    >>> compact_array(np.array([[1, 5], [7, 2]]), lambda v: v > 4, output="indices")
    array([1, 2])
    """
    check_output(output)
    check_algorithm(algorithm, stable)
    if not hasattr(a, "dtype") or not hasattr(a, "shape"):
        raise TypeError(f"compact_array needs a NumPy or CuPy array, not {type(a).__name__}")
    check_chunk_type(a, "compact_array")
    check_dtype(a.dtype)
    p = as_predicate(pred)
    if not a.dtype.isnative:
        a = a.astype(native(a.dtype))  # big-endian data: see validate.native
    p.check(a.dtype)
    return compact_chunk(a, p, output, stable, algorithm, 0)


def _split(out: Any, output: str) -> tuple[Any, Any]:
    if output == "both":
        return out
    return (out, None) if output == "values" else (None, out)


def compact_block(
    block: Any, pred: Any, output: str, stable: bool, algorithm: str, index_base: int,
    direct: bool = False,
) -> Any:
    """Phase 1 for one dask chunk: the output chunk itself when ``direct`` (one output),
    else ``(values | None, indices | None, input length)``."""
    out = compact_chunk(block, pred, output, stable, algorithm, index_base)
    if direct:
        return out
    values, indices = _split(out, output)
    return values, indices, int(np.prod(block.shape))


def compact_blocks(
    blocks: list[Any], pred: Any, output: str, stable: bool, algorithm: str, bases: list[int],
    direct: bool = False,
) -> Any:
    """Phase 1 for a run of consecutive dask chunks held by one worker, in ONE task: the
    concatenation of their outputs (``direct``), else ``(values | None, indices | None, n_in)``.

    ``bases[i]`` is chunk i's global input start, so indices come out global."""
    impl = compact_many.dispatch(type(blocks[0]))
    out = impl(blocks, pred, output, stable, algorithm, bases)
    if direct:
        return out
    values, indices = _split(out, output)
    return values, indices, int(sum(np.prod(b.shape) for b in blocks))


def compact_block_masked(
    block: Any, mask: Any, output: str, index_base: int, direct: bool = False
) -> Any:
    """Phase 1 for one dask chunk selected by a boolean mask chunk (see :func:`compact_block`)."""
    if mask.shape != block.shape:
        raise ValueError(
            f"mask chunk of shape {mask.shape} does not match data chunk {block.shape}"
        )
    out = compact_masked(block, mask, output, index_base)
    if direct:
        return out
    values, indices = _split(out, output)
    return values, indices, int(np.prod(block.shape))
