"""Dask arrays one of whose chunks has another shape than the array declares (a
``from_delayed`` whose function returns 5 elements where ``shape=(7,)`` says 7): Dask
checks no chunk's shape, so every index and offset made of the declared sizes after such a
chunk was wrong (until 2026-12-01, the eleventh session's probe). Each call refuses it now,
in the task that sees the chunk, naming the chunk, its length and the declared one."""

from __future__ import annotations

import re

import dask
import dask.array as da
import numpy as np

# (actual, declared) lengths of the misdeclared chunk: shorter, longer, empty
LENGTHS = [(5, 7), (9, 7), (0, 3)]
# (actual, declared) shapes of a misdeclared N-D block: fewer rows, a trailing axis of
# another length, the same size in another shape
SHAPES = [((5, 3), (7, 3)), ((7, 4), (7, 3)), ((3, 7), (7, 3))]


def _chunk(shape: tuple, declared: tuple, start: int, dtype: np.dtype) -> da.Array:
    n = int(np.prod(shape))
    made = dask.delayed(lambda: (np.arange(start, start + n) % 11).astype(dtype).reshape(shape))
    return da.from_delayed(made(), shape=declared, dtype=dtype)


def misdeclared(actual: int | tuple, declared: int | tuple, dtype=np.int64) -> da.Array:
    """Three chunks, the middle one (chunk 1) of shape ``actual`` though declared
    ``declared`` (lengths, or N-D shapes whose trailing axes the others share)."""
    actual = actual if isinstance(actual, tuple) else (actual,)
    declared = declared if isinstance(declared, tuple) else (declared,)
    good = (7, *declared[1:])
    return da.concatenate([_chunk(good, good, 0, dtype), _chunk(actual, declared, 50, dtype),
                           _chunk(good, good, 100, dtype)])


def refusal(actual: int | tuple, declared: int | tuple, index: int | str = 1) -> str:
    """What the refusal of chunk ``index`` says (a regular expression; ``index`` may be
    one, ``r"\\d+"``)."""
    if isinstance(actual, tuple):
        got = f"has shape {actual}, but its dask array declares shape {declared}"
    else:
        got = f"has length {actual}, but its dask array declares length {declared}"
    return r"chunk " + str(index) + r" of .*" + re.escape(got)
