"""Stable split by a predicate: :func:`partition` (dask arrays) and :func:`partition_array`
(one NumPy or CuPy array).

On dask arrays, the three phases of :func:`dask_compact.map_compact`: phase 1 is one task per
chunk that splits the chunk (its selected elements first, then the others, both in order, plus
the count); the counts come back to the client with the persisted pieces, in the same
execution; the result's chunks are every chunk's selected piece in chunk order, then every
chunk's other piece (empty ones left out), so the result is the global stable split with
known chunk sizes (``count`` and ``chunk length - count``), and nothing moves between workers.
"""

from __future__ import annotations

import math
from typing import Any

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from . import call_client, client_stream, settings
from .api import (
    _check_dask_array,
    _native,
    _ravel,
    _unknown,
    _whole_rows,
)
from .chunk import _checked
from .dispatch import split_chunk
from .graph import (
    _extend,
    _fetch_counts,
    _meta,
    _starts,
    computed_call,
    input_form,
    shifted,
    without_empty_chunks,
)
from .predicate import Predicate, PredicateLike, as_predicate
from .remade import expect_from
from .validate import as_declared, block_shapes, check_dtype, check_output

__all__ = ["partition", "partition_array"]


def partition_array(a: Any, pred: PredicateLike, *, output: str = "values") -> tuple[Any, ...]:
    """Split one in-memory NumPy (or CuPy) array: the elements where ``pred`` holds first, then
    the others, each in their original order, without Dask.

    Parameters
    ----------
    a : numpy.ndarray or cupy.ndarray
        Any shape; flattened in C order.
    pred : callable or str
        Elementwise predicate, e.g. ``lambda v: v > 0.5`` or ``"x > 0.5"``.
    output : {"values", "indices", "both"}
        The split values, the permutation that gives them (int64 flat indices), or both.

    Returns
    -------
    tuple
        ``(values, k)``, ``(indices, k)`` or ``(values, indices, k)``: arrays of ``a.size``
        elements of ``a``'s array type and ``k`` (int), the number of selected elements, so
        ``values[:k]`` is ``compact_array(a, pred)``. Equal to NumPy's
        ``np.concatenate([a[m], a[~m]])`` with ``m = pred(a)`` (ravelled).

    Examples
    --------
    >>> import numpy as np
    >>> from dask_compact import partition_array
    >>> partition_array(np.array([5, 1, 7, 2, 9]), "x > 4")
    (array([5, 7, 9, 1, 2]), 3)
    >>> partition_array(np.array([5, 1, 7, 2, 9]), lambda v: v > 4, output="indices")
    (array([0, 2, 4, 1, 3]), 3)
    """
    settings.warn_unknown()
    a, p = _checked("partition_array", a, pred, output, True, "auto")
    out, k = split_chunk(a, p, output, 0)
    return (*out, k) if output == "both" else (out, k)


def split_block(block: Any, pred: Predicate, output: str, index_base: int,
                declared: np.dtype | None = None, index: int = 0,
                shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Phase 1 for one dask chunk (chunk ``index``, taken in the ``declared`` dtype, see
    :func:`.validate.as_declared`, and of its declared ``shape``): its split values and/or
    global indices, and its count."""
    # the step is dispatched on the chunk's type (validate.check_chunk)
    block = as_declared(block, declared, "partition", index, shape=shape)
    out, k = split_chunk(block, pred, output, index_base)
    if output == "both":
        return {"values": out[0], "indices": out[1], "k": k, "n": int(block.size)}
    return {output: out, "k": k, "n": int(block.size)}


def _head(part: dict, name: str) -> Any:
    return part[name][: part["k"]]


def _tail(part: dict, name: str) -> Any:
    return part[name][part["k"]:]


def _count(part: dict) -> np.ndarray:
    return np.array([[part["k"], part["n"]]], dtype=np.int64)


@call_client.on_inputs_client(lambda x, *_, **__: (x,))
@client_stream.released_on_error()
def partition(x: da.Array, pred: PredicateLike, *, output: str = "values") -> tuple[Any, ...]:
    """Stable split of a dask array: the elements where ``pred`` holds first, then the others,
    each in their original order, with known chunk sizes and the split point.

    Each chunk is split on the worker (and GPU) that holds it, in one pass over the chunk after
    the predicate's; only the counts come back to the client. The result's chunks are the
    selected piece of every input chunk, in order, then the other piece of every chunk, so no
    data moves between workers (``rechunk`` it for even chunks); empty pieces are left out
    (an empty result is one chunk of length 0), since Dask mishandles empty chunks.

    Parameters
    ----------
    x : dask.array.Array
        Input of any shape, NumPy or CuPy chunks; N-D input is taken in C order (as
        ``x.ravel()``) and needs known chunk sizes; 1-D input may have unknown ones (a
        lazy compaction's, ``x[x > t]``'s: with ``output="indices"`` or ``"both"`` each
        chunk's indices are counted from its start, and the starts added once the counts
        are in, so no input chunk waits for the others).
    pred : callable or str
        Elementwise predicate, as for :func:`dask_compact.map_compact`.
    output : {"values", "indices", "both"}
        The split values, the permutation that gives them (int64 global flat indices), or both.

    Returns
    -------
    tuple
        ``(values, k)``, ``(indices, k)`` or ``(values, indices, k)``: 1-D dask arrays of
        ``x.size`` elements with known chunks, persisted, and ``k`` (int) the number of
        selected elements: ``values[:k]`` equals ``x.map_compact(pred)``.

    Raises
    ------
    TypeError
        ``x`` is not a dask array or its dtype is not supported.
    ValueError
        Unknown ``output``, a predicate that is not elementwise, or N-D input of unknown
        chunk sizes.

    Examples
    --------
    >>> import dask.array as da
    >>> import dask_compact
    >>> x = da.from_array([5, 1, 7, 2, 9, 4], chunks=4)
    >>> y, k = dask_compact.partition(x, "x > 4")
    >>> k, y.chunks
    (3, ((2, 1, 2, 1),))
    >>> y.compute()
    array([5, 7, 9, 1, 2, 4])
    >>> i, k = dask_compact.partition(x, "x > 4", output="indices")
    >>> i.compute()
    array([0, 2, 4, 1, 3, 5])
    """
    settings.warn_unknown()
    x = _check_dask_array(x, "partition")
    check_output(output)
    check_dtype(x.dtype, "partition")
    p = as_predicate(pred)
    x = _native(x)
    unknown = _unknown(x)
    if unknown and x.ndim != 1:
        raise ValueError(
            f"partition of {x.ndim}-D input with unknown chunk sizes: its C order needs them; "
            "call x.compute_chunk_sizes() first (or pass a 1-D array)"
        )
    whole = None if unknown else _whole_rows(p, x)
    if whole is not None:
        # per-column constants, as map_compact takes them: the chunks are blocks of whole
        # rows, which split_chunk masks as they are
        x1 = whole
        keys = [(x1.name, i, *[0] * (x.ndim - 1)) for i in range(x1.numblocks[0])]
        rows = np.asarray(x1.chunks[0], dtype=np.int64) * math.prod(x.shape[1:])
    else:
        x1 = _ravel(x)
        keys = [(x1.name, i) for i in range(x1.numblocks[0])]
        # unknown sizes: the count tasks give them (nothing reads these zeros before)
        rows = np.asarray([0 if unknown else c for c in x1.chunks[0]], dtype=np.int64)
    nb = len(rows)
    token = tokenize("partition", x1.name, p, output, computed_call(False, input_form(x1)))
    p1 = f"partition-{token}"
    shapes = block_shapes(x1.chunks)  # of blocks (i, 0, ...): keys[i]
    # Input of unknown chunk sizes (x[x > t], a lazy compaction; refused until 2026-12-07):
    # each split counts its indices from 0 and finds its chunk's size, and the starts are
    # added once the counts are in (below), so no chunk waits for the others' sizes. Until
    # then (same day) the splits waited for a starts task over every chunk, holding every
    # input chunk until the last one had been read.
    starts = _starts(rows)  # unknown sizes: zeros
    layer: dict[Any, Any] = {(p1, i): (split_block, keys[i], p, output, int(starts[i]),
                                       x1.dtype, i, shapes[i]) for i in range(nb)}
    deps: list[Any] = [x1]  # dask's typing does not count Array
    graph = HighLevelGraph.from_collections(p1, layer, dependencies=deps)

    names = ["values", "indices"] if output == "both" else [output]
    pieces = []
    for name in names:
        oname = f"partition-{name}-{token}"
        piece = {(oname, i): (_head, (p1, i), name) for i in range(nb)}
        piece.update({(oname, nb + i): (_tail, (p1, i), name) for i in range(nb)})
        dtype = x1.dtype if name == "values" else np.dtype(np.int64)
        pieces.append(da.Array(_extend(graph, oname, piece, {p1}), oname,
                               chunks=((np.nan,) * (2 * nb),), meta=_meta(x1, dtype)))
    cname = f"partition-count-{token}"
    counts = da.Array(_extend(graph, cname, {(cname, i, 0): (_count, (p1, i)) for i in range(nb)},
                              {p1}), cname, chunks=((1,) * nb, (2,)), dtype=np.int64)
    # the pieces and the counts in ONE execution, then only the counts fetched
    persisted = list(client_stream.persist(*pieces, counts))
    fetched = _fetch_counts(persisted[-1]) if nb else np.zeros((0, 2), dtype=np.int64)
    k = fetched[:, 0]
    if unknown:  # each chunk's size, as its task found it
        rows = fetched[:, 1]
        if output != "values" and nb:  # the indices counted from each chunk's start
            j = names.index("indices")
            both = np.concatenate([_starts(rows)] * 2)  # a chunk's head and tail pieces
            persisted[j] = shifted(persisted[j], both, f"partition-indices-at-{token}")
    sizes = tuple(int(c) for c in k) + tuple(int(r - c) for r, c in zip(rows, k))
    expect_from(list(persisted[:-1]), [sizes] * (len(persisted) - 1))  # remade: same sizes
    result = [without_empty_chunks(da.Array(a.dask, a.name, chunks=(sizes,), meta=a._meta))
              for a in persisted[:-1]]
    return (*result, int(k.sum()))


