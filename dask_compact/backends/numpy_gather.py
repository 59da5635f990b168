"""Gathers of the rows a bitmask selects (one bit per row, 64 rows per word), compiled once
per row layout and shared by every predicate: a record's fields are copied by these after the
predicate pass (:mod:`..codegen.numba_records`) has counted and written the bits.

Rows are moved as unsigned integers of the widest width that divides the row (a float32 field
is a uint32 column, a float32 ``(n, 3)`` field three uint32 columns, a complex128 one two
uint64 columns): a copy of bits, whatever the dtype, so six compiled gathers serve every field.
Columns take AVX-512's compress where the CPU has it (:mod:`..codegen.numba_compress`): 64,
32, 16 or 8 rows a step instead of one; rows of several units up to a vector's width (64
bytes) too, as one column whose lanes each row's bit covers (5 rows of a float32 ``(n, 3)``
field a step). Where the CPU has AVX2 but not AVX-512, the same steps by AVX2's permute,
32 bytes a step (8 rows of a 4-byte column, 4 of an 8-byte one).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

# First: numba imported with Ctrl-C held (numba_ready), before numba_compress imports it.
from ..codegen.numba_ready import njit, trailing_zeros

# isort: split
from numba.core import config as numba_config

# isort: split
from ..codegen.numba_compress import (
    COMPRESS_ITEMSIZES,
    HAVE_COMPRESS,
    HAVE_IOTA,
    IOTA_LANES,
    compress_iota,
    compress_store,
    ctpop,
    pack_lanes,
)

__all__ = ["as_rows", "gather_rows", "gather_indices", "column_gather", "column_plan",
           "gather_field", "popcount"]

# Below this many selected rows in a word of 64, visiting the set bits beats writing every row.
_SPARSE = 24
# ... and beats the compress below _STEP_ROWS rows per compress step (with AVX-512 two:
# 128 // lanes rows a word, 2 for 1-byte units, 64 lanes a step, up to 16 for 8-byte ones,
# 8 steps a word). Swept on the 2-core
# Xeon over 2^20 and 2^24 rows: from 1 row the compress lost at p <= 0.05 (float64 up to
# 0.45x, int16 0.86x), from 24 it gave up most of its gain at p = 0.1-0.3. AVX2's permute
# (8 or 4 lanes a step) from one row a step: on the 2-core Zen 4 (AVX-512 hidden), 2^22 rows,
# uint32 at p = .15 / .2 / .3 0.99 / 0.89 / 0.91 ms against 1.18 / 1.29 / 1.03 from two
# (scalar 1.18 / 1.32 / 1.75), uint64 at p = .3-.5 1.73-1.86 against 1.85-2.11.
_STEP_ROWS = 2 if HAVE_COMPRESS else 1
# ... and for the int64 indices (the positions compressed, 8 a step) below 8; AVX2's permute
# (4 a step) below 24: from 8 or 16 it lost 5-20% at p = .1-.2 (0.85-0.94 against 0.69-0.85
# ms), from 32 it gave up its gain at p = .4-.5 (1.18-1.24 against 0.89-1.06; scalar
# 1.22-1.39).
_INDICES_FROM = 8 if HAVE_COMPRESS else 24
# ... and for rows of several units below this many rows a word, or a third of the compress
# steps a word takes (r rows a step) where that is more: swept on the 2-core Xeon over 2^22
# rows, the two forms were level at 3-11 rows a word (float32 (n, 3): 6-10 rows, 13 steps;
# float64 (n, 3): 10-13, 32 steps; uint8 (n, 3): 3, 4 steps). Where the whole selection
# averages under half of it, the plain visit runs every word: with the per-word choice a ray
# batch (2^24 rows, three (n, 3) float32 fields) took 37-42 ms against 32-37 ms at p = 0.05 on
# the H200 host's CPU, though nearly every word took the visit there.
_ROWS_FROM = 8
_UNITS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


def as_rows(a: np.ndarray) -> np.ndarray:
    """``a`` (C-contiguous, any dtype, rows along axis 0) as a 2-D unsigned-integer view
    (rows, units): the same bytes, in the widest unit that divides the row."""
    # math.prod, the unit by arithmetic and one view of the flat array: 4 us a field where
    # np.prod, a generator and two views took 6.5 (1-D) to 19 us ((n, 3) rows) on the 2-core
    # machine, in a small record call of several fields twice a field
    a = np.ascontiguousarray(a)
    n = a.shape[0]
    row = a.itemsize * math.prod(a.shape[1:])
    if row == 0:
        return np.empty((n, 0), np.uint8)
    unit = 8 if row % 8 == 0 else 4 if row % 4 == 0 else 2 if row % 2 == 0 else 1
    flat = a.reshape(-1)
    if flat.itemsize % unit and unit % flat.itemsize:
        # an element of bytes the unit does not divide, rows of several (bytes S6 or a record
        # of 5 bytes in rows of two: 12 or 10 bytes, units of 4 or 2): NumPy views no such
        # element as the smaller unit, only the flat bytes. Until 2026-12-06 (forty-third
        # session, a probe of its own) compact_records of such a field raised NumPy's "When
        # changing to a smaller dtype, its size must be a divisor ..."
        flat = flat.view(np.uint8)
    return flat.view(_UNITS[unit]).reshape(n, row // unit)


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def popcount(w):  # pragma: no cover - compiled
    # set bits of a uint64 (also called by the generated record loops), as an int64: one
    # popcnt instruction where the CPU has it (numba_compress.ctpop); the same bit arithmetic
    # written out here (until 2026-12-04) compiled to some ten instructions
    return ctpop(np.uint64(w))


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _visit(word, src, s, dst, r):  # pragma: no cover - compiled
    # the rows s + j of src whose bit j of word is set, to dst[r], dst[r + 1], ...
    while word:
        dst[r] = src[s + trailing_zeros(word)]
        word &= word - np.uint64(1)
        r += 1


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _visit_positions(word, s, dst, r):  # pragma: no cover - compiled
    # s + j for every set bit j of word, to dst[r], dst[r + 1], ...
    while word:
        dst[r] = s + trailing_zeros(word)
        word &= word - np.uint64(1)
        r += 1


@njit(nogil=True, cache=True, boundscheck=False)
def _gather1(bits, n, src, dst):  # pragma: no cover - compiled
    k = 0
    cap = dst.shape[0]
    for w in range(bits.shape[0]):
        word = bits[w]
        if word == 0:
            continue
        s = w * 64
        c = popcount(word)
        if c == 64:
            dst[k : k + 64] = src[s : s + 64]
        elif c < _SPARSE or k + 64 > cap:
            # few rows (or the last ones): visit only the set bits
            _visit(word, src, s, dst, k)
        else:
            # many rows: every row written and kept by advancing r, no branch to mispredict
            # (the capacity test above makes the writes past the last kept row safe); the
            # word shifted one place a row (a shift by j was 15% slower at p = 0.5-0.95), a
            # fixed count of 64 where the word is whole (7% faster than a count of min(64, ...))
            r = k
            if s + 64 <= n:
                for j in range(64):
                    dst[r] = src[s + j]
                    r += np.int64(word & np.uint64(1))
                    word >>= np.uint64(1)
            else:
                for j in range(n - s):
                    dst[r] = src[s + j]
                    r += np.int64(word & np.uint64(1))
                    word >>= np.uint64(1)
        k += c
    return k


@njit(nogil=True, cache=True, boundscheck=False)
def _gather1_compress(bits, n, src, dst):  # pragma: no cover - compiled
    # _gather1 with AVX-512's compress for every word of enough rows, whole words included
    # (a slice copy of those was slower at p = 0.99); the scalar visit for the rest, the last
    # word of the input (the compress reads whole lanes) and the output's last 64 rows (it
    # writes whole lanes)
    k = 0
    cap = dst.shape[0]
    lanes = pack_lanes(src.itemsize)
    lane_mask = ~np.uint64(0) >> np.uint64(64 - lanes)  # (1 << 64) would be undefined
    least = _STEP_ROWS * (64 // lanes)
    for w in range(bits.shape[0]):
        word = bits[w]
        if word == 0:
            continue
        s = w * 64
        c = popcount(word)
        if c < least or s + 64 > n or k + 64 > cap:
            _visit(word, src, s, dst, k)
        else:
            r = k
            for q in range(64 // lanes):
                m = (word >> np.uint64(q * lanes)) & lane_mask
                compress_store(dst, r, src, s + q * lanes, m)
                r += popcount(m)
        k += c
    return k


@njit(nogil=True, cache=True, boundscheck=False)
def _gather2(bits, src, dst):  # pragma: no cover - compiled
    # rows of several units: visit the set bits, copy each row
    k = 0
    for w in range(bits.shape[0]):
        word = bits[w]
        if word:
            _visit_rows(word, src, w * 64, dst, k)
            k += popcount(word)
    return k


@njit(nogil=True, cache=True, boundscheck=False)
def _gather2_compress(bits, n, u, spread, src, dst):  # pragma: no cover - compiled
    # _gather2 with AVX-512's compress for every word of enough rows: rows of u units seen as
    # one column of n * u units, r = lanes // u whole rows a step (5 a step for a float32
    # (n, 3) field), each row's bit spread over its u lanes by ``spread`` (8 rows a lookup);
    # the set bits visited in the last word or two of the input and the output's last rows
    # (the compress reads and writes whole lanes)
    lanes = pack_lanes(src.itemsize)
    r = lanes // u
    row_bits = (np.uint64(1) << np.uint64(r)) - np.uint64(1)
    looks = (r + 7) // 8
    least = max(_ROWS_FROM, (64 + r - 1) // r // 3)
    cap = dst.shape[0]
    end = n * u
    src2 = src.reshape((n, u))
    dst2 = dst.reshape((cap // u, u))
    k = 0
    for w in range(bits.shape[0]):
        word = bits[w]
        if word == 0:
            continue
        s = w * 64
        c = popcount(word)
        if c < least or (s + 64) * u + lanes > end or (k + 64) * u + lanes > cap:
            _visit_rows(word, src2, s, dst2, k)
        else:
            at = k * u
            for j in range(0, 64, r):
                b = (word >> np.uint64(j)) & row_bits
                m = spread[b & np.uint64(255)]
                for q in range(1, looks):  # a fixed count: no branch on the data
                    m |= spread[(b >> np.uint64(8 * q)) & np.uint64(255)] << np.uint64(8 * q * u)
                compress_store(dst, at, src, (s + j) * u, m)
                at += popcount(m)
        k += c
    return k


@njit(nogil=True, cache=True, boundscheck=False, inline="always")
def _visit_rows(word, src, s, dst, r):  # pragma: no cover - compiled
    # the rows s + j of src whose bit j of word is set, to dst[r], dst[r + 1], ... (2-D, rows
    # of any width)
    width = src.shape[1]
    while word:
        row = s + trailing_zeros(word)
        for c in range(width):
            dst[r, c] = src[row, c]
        word &= word - np.uint64(1)
        r += 1


@njit(nogil=True, cache=True, boundscheck=False)
def _indices(bits, base, dst):  # pragma: no cover - compiled
    # the set bits visited in every word: writing every row of a dense word (as _gather1)
    # measured slower at p = 0.5 (10.6 against 6.9 ms on 2^24 rows) and the same at p = 0.95,
    # the int64 stores being what limits it
    k = 0
    for w in range(bits.shape[0]):
        word = bits[w]
        _visit_positions(word, base + w * 64, dst, k)
        k += popcount(word)
    return k


@njit(nogil=True, cache=True, boundscheck=False)
def _indices_compress(bits, base, dst):  # pragma: no cover - compiled
    # _indices with the compress (or AVX2's permute) of the word's positions, IOTA_LANES a
    # step, for words of _INDICES_FROM rows or more, except in the output's last 64 rows (all
    # the lanes are written)
    k = 0
    cap = dst.shape[0]
    lane_mask = np.uint64((1 << IOTA_LANES) - 1)
    for w in range(bits.shape[0]):
        word = bits[w]
        c = popcount(word)
        s = base + w * 64
        if c < _INDICES_FROM or k + 64 > cap:
            _visit_positions(word, s, dst, k)
        else:
            r = k
            for q in range(64 // IOTA_LANES):
                m = (word >> np.uint64(IOTA_LANES * q)) & lane_mask
                compress_iota(dst, r, s + IOTA_LANES * q, m)
                r += popcount(m)
        k += c
    return k


@functools.cache
def _spread(u: int) -> np.ndarray:
    """For each byte b of row bits, b's bits each repeated u times (8 rows of u units)."""
    row = (1 << u) - 1
    return np.array([sum(row << (u * i) for i in range(8) if b >> i & 1) & (2**64 - 1)
                     for b in range(256)], dtype=np.uint64)


# numba's JIT disabled (NUMBA_DISABLE_JIT=1, read at its import): the gathers below would run
# as Python, and their compress intrinsics cannot run at all ("not usable in pure-python": a
# new-user probe, 2026-11-30, every compact_records failed). NumPy does them instead.
_NO_JIT = bool(getattr(numba_config, "DISABLE_JIT", 0))


def _mask(bits: np.ndarray) -> np.ndarray:
    """The bool mask of every row ``bits`` covers (padding rows unset)."""
    return np.unpackbits(bits.view(np.uint8), bitorder="little").view(bool)


def gather_rows(bits: np.ndarray, n: int, src: np.ndarray, dst: np.ndarray) -> int:
    """Copy the selected rows of ``src`` into ``dst`` (both from :func:`as_rows`, ``dst`` of
    exactly the selected count); returns the count copied."""
    if _NO_JIT:
        dst[:] = src[_mask(bits)[:n]]
        return dst.shape[0]
    u = src.shape[1]
    if u == 1:
        if src.itemsize in COMPRESS_ITEMSIZES:
            return int(_gather1_compress(bits, n, src.reshape(-1), dst.reshape(-1)))
        return int(_gather1(bits, n, src.reshape(-1), dst.reshape(-1)))
    if u == 0:
        return dst.shape[0]
    if (src.itemsize in COMPRESS_ITEMSIZES and u <= pack_lanes(src.itemsize)
            and 128 * dst.shape[0] >= _ROWS_FROM * n):
        return int(_gather2_compress(bits, n, u, _spread(u), src.reshape(-1), dst.reshape(-1)))
    return int(_gather2(bits, src, dst))


def column_gather(row_bytes: int) -> tuple[Any, np.dtype] | None:
    """The compiled gather that :func:`gather_rows` runs for rows of one unit of
    ``row_bytes`` bytes (1, 2, 4 or 8: a 1-D field, or a trailing axis of one such
    element), and the unsigned type of the 1-D views it takes: ``fn(bits, n, src, dst)`` on
    ``a.reshape(-1).view(unit)``. :func:`gather_field` calls it directly: through
    :func:`as_rows` and gather_rows' wrapper a field cost 5 us more, where the gather of a
    256-row float32 field takes 0.7 us (2-core machine). None where gather_rows does more
    (rows of several units, numba's JIT disabled)."""
    unit = _UNITS.get(row_bytes)
    if unit is None or _NO_JIT:
        return None
    # a dtype object: a view by it costs 0.36 us, by the type 0.47 (2-core machine)
    return (_gather1_compress if row_bytes in COMPRESS_ITEMSIZES else _gather1), np.dtype(unit)


# One field of a record as its gathers see it: name, dtype, row shape (``a.shape[1:]``) and
# its compiled column gather (:func:`column_gather`, None where :func:`gather_rows` runs).
Column = tuple[str, np.dtype, tuple[int, ...], Any]


def column_plan(fields: dict[str, np.ndarray]) -> tuple[Column, ...]:
    """Each field's :data:`Column`, in the fields' order: what the backend's call and a kept
    call (``numpy_calls.RecordsCall``, which makes it once) pass to :func:`gather_field`."""
    return tuple((name, a.dtype, a.shape[1:],
                  column_gather(a.dtype.itemsize * math.prod(a.shape[1:])))
                 for name, a in fields.items())


def gather_field(bits: np.ndarray, n: int, src: np.ndarray, dst: np.ndarray,
                 gather: Any) -> None:
    """The selected rows of ``src`` (``n`` rows) into ``dst`` (C-contiguous, exactly the
    selected count, ``src``'s dtype and row shape), by ``gather`` (its :data:`Column`'s)
    where ``src`` is C-contiguous too, else by :func:`gather_rows`."""
    if gather is not None and src.flags.c_contiguous:
        fn, unit = gather
        if dst.ndim == 1:  # without a reshape: 0.4-0.7 us a field of a 20-30 us call
            fn(bits, n, src.view(unit), dst.view(unit))
        else:
            fn(bits, n, src.reshape(-1).view(unit), dst.reshape(-1).view(unit))
        return
    gather_rows(bits, n, as_rows(src), as_rows(dst))


def gather_indices(bits: np.ndarray, base: int, dst: np.ndarray) -> int:
    """The global int64 index (``base`` + row) of every selected row into ``dst``."""
    if _NO_JIT:
        dst[:] = np.flatnonzero(_mask(bits)) + base
        return dst.shape[0]
    if HAVE_IOTA:
        return int(_indices_compress(bits, np.int64(base), dst))
    return int(_indices(bits, np.int64(base), dst))
