"""The compiled loops of the CPU scans (:mod:`.numpy_scan`), apart from it so that a process
without the room to load numba (:func:`..compiler_room.no_room_for_compiler`) scans with NumPy
without importing them: numba's import is the memory.

Compiled once per (input dtype, output dtype) by numba (``cache=True``), shared by every call.
"""

from __future__ import annotations

from ..codegen.numba_ready import njit  # numba, imported with Ctrl-C held

__all__ = ["scan_loop", "sum_loop", "scatter"]


@njit(nogil=True, cache=True, boundscheck=False)
def scan_loop(a, out, base, has_base, exclusive):  # pragma: no cover - compiled
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
def sum_loop(a, base):  # pragma: no cover - compiled
    acc = base
    for i in range(a.size):
        acc += a[i]
    return acc


@njit(nogil=True, cache=True, boundscheck=False)
def scatter(a, flags, pos, base, vals, idx, want_vals, want_idx):  # pragma: no cover
    for i in range(a.size):
        if flags[i]:
            k = pos[i]
            if want_vals:
                vals[k] = a[i]
            if want_idx:
                idx[k] = base + i
