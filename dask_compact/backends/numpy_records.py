"""Compact a record (several aligned NumPy arrays) on the CPU by one predicate.

Two steps, both compiled: the predicate pass writes one bit per row and counts
(:mod:`..codegen.numba_records`, generated from the predicate), then each field's selected rows
are copied into an output of exactly the selected length (:mod:`.numpy_gather`). A predicate
the loop cannot compute exactly as NumPy (float16, transcendental functions, a constant that
does not fit; see the one-array loop) or a callable the tracer could not record is evaluated
with NumPy into a mask, packed into the same bits.

A process without the room to load numba (a small distributed worker:
:func:`..compiler_room.no_room_for_compiler`) takes NumPy's mask and boolean indexing of every
field instead, the same answer, and never imports numba: the gathers (:mod:`.numpy_gather`,
numba's) are imported where the compiled path is taken, and the predicate pass asks itself
(:func:`..codegen.numba_records.record_bits_loop`).
"""

from __future__ import annotations

import logging
import os
import threading
from types import ModuleType
from typing import Any

import numpy as np

from ..codegen.numba_loop import UnsupportedPredicate
from ..codegen.numba_records import record_bits_loop
from ..compiler_room import compiled_loops
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow
from ..predicate.fields import record_mask
from ..validate import native

__all__ = ["compact_records", "compact_records_into", "gather_new", "predicate_bits",
           "predicate_mask"]

logger = logging.getLogger("dask_compact")



def gathers() -> ModuleType | None:
    """The compiled gathers (:mod:`.numpy_gather`), or None where this process has no room
    for numba."""
    return compiled_loops("dask_compact.backends.numpy_gather")


def _native(a: np.ndarray) -> np.ndarray:
    return a if a.dtype.isnative else a.astype(native(a.dtype))


def _bits_from_mask(m: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    words = (n + 63) // 64
    packed = np.zeros(words * 8, np.uint8)
    packed[: (n + 7) // 8] = np.packbits(m, bitorder="little")
    return packed.view("<u8").astype(np.uint64, copy=False), int(np.count_nonzero(m))


# Fields of at least this many bytes in all are gathered, and the predicate's fields read, by
# several threads (the compiled loops release the GIL): on the 2-core machine 2 threads took
# the four float32 fields of 2^24 rows from 50-58 ms to 29-46 ms, the predicate pass over one
# float32 field from 10.8-13.8 ms to 6.7-7.8 ms. Dask tasks pass threads=1 (the scheduler
# runs chunks in parallel).
THREADED_BYTES = 1 << 24
_pool: Any = None
# Two threads' first large calls at once each made a pool, one left idle for the process's
# life (until 2026-12-01, thirteenth session, read by a probe of calls made in tasks).
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    """In a forked child: the parent's pool, whose threads are not there, and its lock, which
    a parent thread may have held, dropped (the next large call makes its own). Until
    2026-12-01 (fourteenth session, a regression review) a child forked after a large call
    (``multiprocessing``'s default start on Linux) waited for ever in its own large call, on
    work the inherited pool had no thread to run."""
    global _pool, _pool_lock
    _pool = None
    _pool_lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forget_pool)


def _thread_pool(threads: int) -> Any:
    global _pool
    with _pool_lock:
        if _pool is None or _pool._max_workers < threads:
            from concurrent.futures import ThreadPoolExecutor

            _pool = ThreadPoolExecutor(threads, thread_name_prefix="dask_compact-gather")
        return _pool


def predicate_bits(
    pred: Predicate, fields: dict[str, np.ndarray], n: int, threads: int = 1
) -> tuple[np.ndarray, int]:
    """One bit per row (bit j of word w: row 64w + j is selected) and the selected count;
    ``threads``: how many threads may evaluate parts of the rows at once."""
    # big-endian fields are read in native order (validate.native); their output keeps them
    read = {name: _native(fields[name]) for name in pred.fields}
    if pred.expr is not None:
        try:
            tp = pred.typed({k: v.dtype for k, v in read.items()})
            loop = record_bits_loop(tp)
            params = tp.bind(pred.params)
        except (UnsupportedPredicate, ParamOverflow) as e:
            logger.debug("record predicate %s takes the mask path: %s", pred.source, e)
        else:
            bits = np.empty((n + 63) // 64, np.uint64)
            arrays = [np.ascontiguousarray(read[name]) for name, _ in tp.dtype]
            nbytes = sum(a.nbytes for a in arrays)
            if threads < 2 or nbytes < THREADED_BYTES:
                return bits, int(loop(np.int64(n), *arrays, bits, *params))

            def part(lo: int, hi: int) -> int:
                # rows [lo, hi), lo a multiple of 64: its own words of bits
                return int(loop(np.int64(hi - lo), *(a[lo:hi] for a in arrays),
                                bits[lo // 64 : (hi + 63) // 64], *params))

            cuts = [min(n, -(-n * i // threads // 64) * 64) for i in range(threads + 1)]
            counts = _thread_pool(threads).map(part, cuts[:-1], cuts[1:])
            return bits, sum(counts)
    return _bits_from_mask(_mask_of(pred, read, n), n)


def predicate_mask(pred: Predicate, fields: dict[str, np.ndarray], n: int) -> np.ndarray:
    """The boolean mask (``n`` rows) of the rows ``pred`` selects, by NumPy: what
    :func:`predicate_bits` packs on its mask path, and what the compiled pass computes."""
    return _mask_of(pred, {name: _native(fields[name]) for name in pred.fields}, n)


def _mask_of(pred: Predicate, read: dict[str, np.ndarray], n: int) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(record_mask(pred, read, n, np))


def compact_records(
    fields: dict[str, np.ndarray], pred: Predicate, indices: bool, stable: bool,
    index_base: int, threads: int = 1,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Every field's selected rows (exact length, in order), plus ``"indices"`` (int64, global:
    ``index_base`` + row) when asked. ``stable`` is accepted for the GPU's sake: the CPU
    always keeps the order. ``threads``: how many threads may gather fields at once."""
    first = next(iter(fields.values()))
    n = int(first.shape[0])
    g = gathers()
    if g is None:
        return _compact_records_masked(fields, predicate_mask(pred, fields, n), indices,
                                       index_base)
    bits, count = predicate_bits(pred, fields, n, threads)
    return gather_new(g, bits, n, count, fields, g.column_plan(fields), indices, index_base,
                      threads)


def gather_new(g: ModuleType, bits: np.ndarray, n: int, count: int,
               fields: dict[str, np.ndarray], plan: tuple, indices: bool, index_base: int,
               threads: int = 1) -> dict[str, np.ndarray]:
    """Every field's selected rows (``bits`` of ``n`` rows, ``count`` set) gathered into new
    outputs of exactly ``count`` rows by its column of ``plan`` (``g.column_plan(fields)``,
    ``g`` the compiled gathers), plus ``"indices"`` where asked: the step after the predicate
    pass of both the backend's call and a kept one (``numpy_calls.RecordsCall``).
    ``threads``: how many threads may gather fields at once."""
    if threads > 1 and count and len(plan) + indices > 1:
        if sum(fields[name].nbytes for name, *_ in plan) >= THREADED_BYTES:
            return _gather_new_threaded(g, bits, n, count, fields, plan, indices, index_base,
                                        threads)
    # one loop, no closure: a kept call of 64 rows and four fields took 3.5 us more with a
    # second loop and a job per field (2-core machine)
    out: dict[str, np.ndarray] = {}
    field = g.gather_field
    for name, dtype, tail, gather in plan:
        # a 1-D field's output without a shape tuple: 0.2-0.4 us a field of a 20-30 us call
        o = out[name] = np.empty((count, *tail), dtype) if tail else np.empty(count, dtype)
        if count:
            field(bits, n, fields[name], o, gather)
    if indices:
        idx = out["indices"] = np.empty(count, np.int64)
        if count:
            g.gather_indices(bits, int(index_base), idx)
    return out


def _gather_new_threaded(g: ModuleType, bits: np.ndarray, n: int, count: int,
                         fields: dict[str, np.ndarray], plan: tuple, indices: bool,
                         index_base: int, threads: int) -> dict[str, np.ndarray]:
    """:func:`gather_new` with the fields (and the indices) gathered by ``threads`` threads."""
    out = {name: np.empty((count, *tail), dtype) for name, dtype, tail, _ in plan}
    if indices:
        out["indices"] = np.empty(count, np.int64)

    def gather(column: Any) -> None:
        if column is None:
            g.gather_indices(bits, int(index_base), out["indices"])
        else:
            name = column[0]
            g.gather_field(bits, n, fields[name], out[name], column[3])

    list(_thread_pool(threads).map(gather, [*plan, None] if indices else plan))
    return out


def _compact_records_masked(fields: dict[str, np.ndarray], m: np.ndarray, indices: bool,
                            index_base: int) -> dict[str, np.ndarray]:
    """:func:`compact_records` by NumPy's boolean indexing of every field's rows (no numba)."""
    out = {name: np.ascontiguousarray(a[m]) for name, a in fields.items()}
    if indices:
        out["indices"] = _selected_rows(m, index_base)
    return out


def _selected_rows(m: np.ndarray, base: int) -> np.ndarray:
    rows = np.flatnonzero(m).astype(np.int64, copy=False)
    if base:
        rows += np.int64(base)
    return rows


def compact_records_into(
    fields: dict[str, np.ndarray], pred: Predicate, out: dict[str, np.ndarray], count: Any
) -> Any:
    """The selected rows into the caller's buffers ``out`` (capacity n rows; the fields to
    write and optionally ``"indices"``, the row numbers), the count into ``count`` (a new
    1-element int64 array if None); returns ``count``."""
    first = next(iter(fields.values()))
    n = int(first.shape[0])
    if count is None:
        count = np.empty(1, dtype=np.int64)
    g = gathers()
    if g is None:  # NumPy's indexing, no numba (see the module)
        m = predicate_mask(pred, fields, n)
        k = int(np.count_nonzero(m))
        if k:  # written in place: no k-row temporary on a worker short of memory
            for name, buf in out.items():
                if name in fields:
                    np.compress(m, fields[name], axis=0, out=buf[:k])
                else:
                    buf[:k] = np.flatnonzero(m)
        count[0] = k
        return count
    bits, k = predicate_bits(pred, fields, n)
    if k:
        plan = g.column_plan({name: fields[name] for name in out if name in fields})
        for name, _, _, gather in plan:
            g.gather_field(bits, n, fields[name], out[name][:k], gather)
        if "indices" in out and "indices" not in fields:
            g.gather_indices(bits, 0, out["indices"][:k])
    count[0] = k
    return count
