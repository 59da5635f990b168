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

from typing import Any

import dask.array as da

from .validate import as_declared_block


def declared_chunks(x: da.Array, checked: bool = False, fn: str = "sort",
                    what: str = "the input") -> da.Array:
    """``x`` with each chunk checked and in ``x``'s declared dtype (validate.as_declared),
    for a rechunk that joins chunks: Dask's concatenate takes the type of the chunk of
    highest ``__array_priority__`` (a plain one made plain data of another ndarray
    subclass, validate.check_chunk) and NumPy's promotion of their dtypes (a float64 chunk
    made float64 data of a float32 array, refused only after the join, under the joined
    chunk's index). ``checked``: a step before took x's chunks so already (the cast to
    native byte order, the time keys): ``x`` itself, each chunk taken once."""
    if checked:
        return x
    return da.map_blocks(as_declared_block, x, fn=fn, what=what, declared=x.dtype,
                         dtype=x.dtype, meta=x._meta)


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
