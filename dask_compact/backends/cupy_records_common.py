"""What the GPU records calls share (``cupy_records``' general call and
``cupy_records_ready``'s ready calls): the copy's column table and its upload, the copy's
launches, the record predicate's generated functor, and the note of an output allocation that
did not fit."""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..codegen.cuda_functor import CodegenUnsupported, generate_record_functor
from ..predicate.core import Predicate, field_dtypes
from ..predicate.expr import ParamOverflow
from ..validate import other_order, to_native
from .cupy_device import capturing, kept_for_graphs
from .cupy_modules import typed_functor

__all__ = ["copy_unit", "column_entries", "column_table", "copy_launches", "upload_table",
           "record_functor", "no_room_note", "native_fields"]

logger = logging.getLogger("dask_compact")

_UNITS = (16, 8, 4, 2, 1)


def native_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with each field of the other byte order (:func:`other_order`) as a native
    copy, its numbers' bytes reversed on the current stream (``validate.to_native``, as the
    one-array calls take such input); ``fields`` itself where none is."""
    if not any(other_order(a) for a in fields.values()):
        return fields
    return {name: to_native(a) if other_order(a) else a for name, a in fields.items()}


def copy_unit(row_bytes: int, *addresses: int) -> int:
    """The widest unit (bytes) dividing the row and every address: the copy's load size."""
    common = row_bytes
    for a in addresses:
        common |= a
    return next(u for u in _UNITS if common % u == 0)  # u divides all iff it divides their OR


def column_entries(fields: list[tuple[int, int, int]]) -> list[int]:
    """The copy's column table, flat: per field (row bytes, source, destination), one (src,
    dst, unit, stride) entry, its rows ``stride`` units of ``unit`` bytes (a float32 (n, 3)
    field: 4-byte units, stride 3; kernels/records.cu's FieldCopy, whose blocks copy a row's
    units together). Zero-width rows copy nothing."""
    flat: list[int] = []
    for row, sp, dp in fields:
        if row == 0:
            continue
        if row <= 16 and not row & (row - 1) and not (sp | dp) & (row - 1):
            flat += (sp, dp, row, 1)  # the common case: one unit a row (copy_unit's answer)
            continue
        unit = copy_unit(row, sp, dp)
        flat += (sp, dp, unit, row // unit)
    return flat


def column_table(src: dict[str, Any], dst: dict[str, Any]) -> np.ndarray:
    """The column table (:func:`column_entries`) copying each field of ``src`` into the
    array of its name in ``dst``, as a (columns, 4) int64 array."""
    flat = column_entries([(a.dtype.itemsize * math.prod(a.shape[1:]), a.data.ptr,
                            dst[name].data.ptr) for name, a in src.items()])
    return np.array(flat, dtype=np.int64).reshape(-1, 4)


def copy_launches(lengths: tuple[int, int] | None, nspans: int, tiles: int, per: int,
                  columns: int) -> list[tuple[str, tuple[int, ...], bool, int]]:
    """Pass 4's launches (kernels/records.cu), each form on its work list: (kernel role,
    grid, whether its blocks read their list, the list's length or -1 where the blocks read
    it on the device). ``lengths``: (dense spans, sparse spans) as read back by the sized
    call, or None (the sync-free call: each form's grid covers every span). ``per``: tiles
    per span; ``columns``: the scatter's grid rows (the table's columns, plus one for the
    indices). Where the sized call knows that no span is sparse, the scatter takes every tile
    and reads no list (its load before a dense tile's other loads cost 0.2 ms at p = .95)."""
    dense, sparse = lengths if lengths is not None else (nspans, nspans)
    known = lengths if lengths is not None else (-1, -1)
    out: list[tuple[str, tuple[int, ...], bool, int]] = []
    if sparse:
        out.append(("gather", (sparse,), True, known[1]))
    if dense and columns:
        if lengths is not None and not sparse:
            out.append(("scatter", (tiles, columns), False, known[0]))
        else:
            out.append(("scatter", (dense * per, columns), True, known[0]))
    return out


def no_room_note(e: BaseException, total: int, n: int, fields: dict[str, Any], indices: bool,
                 device: int) -> None:
    """The note a sized call adds to the MemoryError of its outputs' allocation."""
    need = total * (sum(a.dtype.itemsize * math.prod(a.shape[1:]) for a in fields.values())
                    + (8 if indices else 0))
    e.add_note(
        f"dask_compact: the {total:,} selected rows of {n:,} ({need / 2**20:,.1f} MiB "
        f"over {len(fields)} fields) did not fit on GPU {device}. Free device "
        "memory (cupy.get_default_memory_pool().free_all_blocks() returns what "
        "CuPy's pool keeps) or compact fewer rows at a time (compact_records over "
        "dask arrays of smaller chunks).")


# (device, table bytes) -> the table on the device: a call repeated on the same buffers (a
# loop over batches, or the warm-up before a graph capture) uploads nothing, so a captured
# call allocates no pinned memory.
_tables: BoundedCache[tuple, Any] = BoundedCache("record column tables")


def upload_table(table: np.ndarray, stream: Any) -> Any:
    """The column table on the device (cached per content), copied in stream order from
    pinned memory (no host wait; a pageable copy would make the host wait and cannot be
    captured). The pinned buffer stays referenced until an event after the copy has run."""
    import cupy

    key = (cupy.cuda.Device().id, table.tobytes())
    hit = _tables.get(key)
    if hit is not None:
        if capturing(stream):
            kept_for_graphs.append(hit)
        return hit
    mem = cupy.cuda.alloc_pinned_memory(max(table.nbytes, 8))
    host = np.frombuffer(mem, dtype=np.int64, count=table.size).reshape(table.shape)
    host[...] = table
    d = cupy.empty(table.shape, dtype=np.int64)
    cupy.cuda.runtime.memcpyAsync(d.data.ptr, host.ctypes.data, table.nbytes,
                                  cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
    if capturing(stream):
        kept_for_graphs.append(mem)  # the graph copies from it at every replay
    else:
        event = cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        # under a lock (until 2026-12-01 (thirteenth session), a concurrency probe): threads
        # uploading at once that found the same finished head each popped one entry, the
        # second a table whose copy could still be queued (its pinned memory went back to
        # CuPy's pinned pool, and a table written there next was the one copied, into the
        # device table cached for these buffers), or popped an empty list (IndexError)
        with _pinned_lock:
            _pinned.append((event, mem))
            while _pinned and _pinned[0][0].done:
                _pinned.pop(0)
    _tables.put(key, d)
    return d


_pinned: list[tuple] = []  # (event after the copy, pinned table) until the copy has run
_pinned_lock = threading.Lock()  # guards _pinned: every thread's uploads go through it



def record_functor(pred: Predicate, read: dict[str, np.dtype]) -> tuple | None:
    """(typed predicate, generated functor, bound constants) of a record predicate over the
    read fields' dtypes, or None where it has no exact device form (CodegenUnsupported: the
    mask path) or a constant does not fit its dtype."""
    if pred.expr is None:
        return None
    try:
        tp, functor = typed_functor(field_dtypes(read), pred, generate_record_functor)
        return tp, functor, list(tp.bind(pred.params))
    except (CodegenUnsupported, ParamOverflow) as e:
        logger.debug("record predicate %s takes the mask path: %s", pred.source, e)
        return None
