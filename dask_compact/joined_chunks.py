"""Chunks taken in their array's declared dtype before Dask joins them.

A rechunk or a reshape that joins chunks (an N-D input put in C order or in whole rows,
a mask or a record's field brought to another array's chunks, the sort's buckets) builds
each joined block with Dask's concatenate, which gives it the dtype of the chunks' NumPy
promotion or of the first of them: a float32 chunk's 0.75 under an int64 first chunk came
back as 0, an int64 2 in a boolean mask as True, before any check of ours saw the chunk
(a probe, 2026-12-01). So every chunk is taken by the rule of every chunk
(validate.as_declared) before such a join.
"""

from __future__ import annotations

import math
from typing import Any

import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.blockwise import blockwise
from dask.highlevelgraph import HighLevelGraph
from dask.layers import ArrayBlockIdDep, ArrayChunkShapeDep

from . import validate
from .validate import block_shapes


def declared_chunks(x: da.Array, checked: bool = False, fn: str = "sort",
                    what: str = "the input") -> da.Array:
    """``x`` with each chunk checked and in ``x``'s declared dtype (validate.as_declared),
    for a rechunk that joins chunks: Dask's concatenate takes the type of the chunk of
    highest ``__array_priority__`` (a plain one made plain data of another ndarray
    subclass, validate.check_chunk) and NumPy's promotion of their dtypes (a float64 chunk
    made float64 data of a float32 array, refused only after the join, under the joined
    chunk's index). ``checked``: a step before took x's chunks so already (the cast to
    native byte order, the time keys): each chunk's dtype is taken once, and here only its
    type and shape are checked.

    Each chunk is also checked against the shape ``x`` declares for it: the rechunk cuts and
    joins by the declared sizes, so a chunk longer than declared lost its tail there and a
    shorter one moved every later element, with nothing left for a later step to see
    (until 2026-12-01). The shape comes from Dask's own per-block argument (its
    ``ArrayChunkShapeDep``, as ``map_blocks`` passes ``block_id``): one small tuple per
    task, the layer still blockwise (fused with what makes the chunks), where the chunks
    themselves as an argument would be pickled with every task."""
    declared = None if checked else x.dtype
    ind = tuple(range(x.ndim))
    name = "dask-compact-declared-" + tokenize(x.name, declared, fn, what)
    layer = blockwise(_declared_block, name, ind, x.name, ind, ArrayBlockIdDep(x.chunks), ind,
                      ArrayChunkShapeDep(x.chunks), ind, numblocks={x.name: x.numblocks},
                      declared=declared, fn=fn, what=what)
    deps: list[Any] = [x]  # dask's typing does not count its Array as a DaskCollection
    return da.Array(HighLevelGraph.from_collections(name, layer, dependencies=deps), name,
                    chunks=x.chunks, meta=x._meta)


def flat_blocks(x: da.Array, fn: str, what: str = "the input") -> da.Array:
    """N-D ``x`` whose trailing axes are whole chunks (and no chunk empty) in C order: each
    block checked, in ``x``'s declared dtype and of its declared shape
    (validate.as_declared), and flattened, one task per block in place of Dask's reshape.
    Dask's reshape of a block of another shape than declared failed with NumPy's "cannot
    reshape array of size 15 into shape (21,)", naming no chunk, or took one of the same
    size in another shape as it came (until 2026-12-01). Measured on the 2-core machine,
    threaded scheduler, 16 blocks: the same time as Dask's reshape (a blockwise check
    before the reshape cost 1.3 ms more: Dask's handling of one more blockwise layer)."""
    name = "dask-compact-ravel-" + tokenize(x.name, x.dtype, fn, what)
    tail = tuple(int(s) for s in x.shape[1:])
    zeros = (0,) * (x.ndim - 1)
    shapes = block_shapes(x.chunks)
    layer: dict[Any, Any] = {
        (name, i): (_flat_block, (x.name, i, *zeros), x.dtype, fn, i, what, shapes[i])
        for i in range(x.numblocks[0])}
    deps: list[Any] = [x]  # dask's typing does not count its Array as a DaskCollection
    rows = tuple(c * math.prod(tail) for c in x.chunks[0])
    return da.Array(HighLevelGraph.from_collections(name, layer, dependencies=deps), name,
                    chunks=(rows,), meta=meta_from_array(x._meta, ndim=1))


def _flat_block(block: Any, declared: np.dtype, fn: str, index: int, what: str,
                shape: tuple[int, ...] | None) -> Any:
    return validate.as_declared(block, declared, fn, index, what, shape).reshape(-1)


def _declared_block(block: Any, block_id: tuple[int, ...], shape: tuple[float, ...],
                    declared: np.dtype | None, fn: str, what: str) -> Any:
    """Chunk ``block_id`` of an array, checked, in its ``declared`` dtype (None: a step
    before took it so, and only its shape is checked) and of its declared ``shape`` (not
    checked where a size is unknown, nan)."""
    known = None if any(s != s for s in shape) else tuple(int(s) for s in shape)
    index = block_id[0] if block_id else 0
    if declared is None:
        return validate.check_shape(block, known, fn, index, what)
    return validate.as_declared(block, declared, fn, index, what, known)


def rechunked(x: da.Array, chunks: Any, fn: str, what: str = "the input") -> da.Array:
    """``x.rechunk(chunks)``, each chunk taken in ``x``'s declared dtype first where the
    rechunk changes the chunks (and so may join some); ``x`` itself where it does not."""
    joined = x.rechunk(chunks)
    if joined.chunks == x.chunks:
        return x
    return declared_chunks(x, fn=fn, what=what).rechunk(chunks)


def joins_in_c_order(x: da.Array) -> bool:
    """Whether putting N-D ``x`` in C order (api._ravel: Dask's reshape, or a rechunk of its
    trailing axes into one chunk, or dropping empty chunks) joins chunks."""
    return x.ndim > 1 and (any(len(c) > 1 for c in x.chunks[1:])
                           or any(0 in c for c in x.chunks))
