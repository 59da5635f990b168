"""The compiled passes of the CPU split (:mod:`.numpy_split`), apart from it so that a process
without the room to load numba (:func:`..compiler_room.no_room_for_compiler`) splits with
NumPy without importing them: numba's import is the memory.

Each writes every element at its place, the selected ones from 0 and the others from the
count ``k``, each in order, choosing the place arithmetically (no branch to mispredict at
p = .5).
"""

from __future__ import annotations

import numpy as np

from ..codegen.numba_ready import njit  # numba, imported with Ctrl-C held
from .numpy_gather import as_rows  # the rows as units, for the passes (numba's module too)

__all__ = ["as_rows", "split1", "split2", "split_indices"]


@njit(nogil=True, cache=True, boundscheck=False)
def split1(bits, n, src, dst, k):  # pragma: no cover - compiled
    sel = 0
    rej = k
    for i in range(n):
        b = np.int64((bits[i >> 6] >> np.uint64(i & 63)) & np.uint64(1))
        dst[rej + (sel - rej) * b] = src[i]
        sel += b
        rej += 1 - b


@njit(nogil=True, cache=True, boundscheck=False)
def split2(bits, n, src, dst, k):  # pragma: no cover - compiled
    # rows of several units
    sel = 0
    rej = k
    for i in range(n):
        b = np.int64((bits[i >> 6] >> np.uint64(i & 63)) & np.uint64(1))
        at = rej + (sel - rej) * b
        for c in range(src.shape[1]):
            dst[at, c] = src[i, c]
        sel += b
        rej += 1 - b


@njit(nogil=True, cache=True, boundscheck=False)
def split_indices(bits, n, base, dst, k):  # pragma: no cover - compiled
    sel = 0
    rej = k
    for i in range(n):
        b = np.int64((bits[i >> 6] >> np.uint64(i & 63)) & np.uint64(1))
        dst[rej + (sel - rej) * b] = base + i
        sel += b
        rej += 1 - b
