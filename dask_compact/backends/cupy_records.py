"""Compact a record (several aligned CuPy arrays, one device) by one predicate on the GPU.

Five launches of ``kernels/records.cu`` and one host sync: the flags pass (the generated
record functor reads the predicate's fields by row; one ballot word per 32 rows, a count per
tile), the tile-count scan (exclusive tile prefixes and the total), the spans' sort into two
work lists (sparse and dense spans of 8192 rows), the total and the lists' lengths read to
allocate every output at its exact length, then the copy, which writes every field's selected
rows (and their global indices) from the ballot words in two forms, each launched on its
list's spans only: a list in shared memory where a span is sparse, a per-lane scatter where it
is dense. Extra device memory: n/8 bytes of words, 8 bytes per tile of 4096 rows, 4 per warp
segment of 512 and 8 per span of 8192, and the field table.

A repeated call of one predicate on one layout runs the ready call of
``cupy_records_ready`` instead: the same kernels, launched from packed arguments on a kept
workspace.

A predicate with no exact device form (:class:`CodegenUnsupported`: complex transcendentals,
...), a constant that does not fit its dtype, or a callable the tracer could not record is
evaluated by CuPy into a mask, which the same flags kernel reads (``dcx::RecMaskPred``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..predicate.core import Predicate
from ..predicate.fields import record_mask
from ..validate import to_native
from . import cupy_tuning as tuning
from .cupy_device import (
    capturing,
    check_powers,
    contiguous,
    kept_for_graphs,
    output_empty,
    ptr_or_null,
)
from .cupy_modules import compiled
from .cupy_records_common import (
    column_table,
    copy_launches,
    copy_unit,
    native_fields,
    no_room_note,
    record_functor,
    upload_table,
)
from .cupy_records_ready import ready_into_call, ready_records_call
from .cupy_source import RecordSpec

__all__ = ["compact_records", "compact_records_into", "copy_unit"]

logger = logging.getLogger("dask_compact")


def _flags_launch(pred: Predicate, read: dict[str, Any], n: int) -> tuple[RecordSpec, list]:
    """The module and the flags kernel's predicate arguments (field pointers and constants,
    or the mask)."""
    import cupy

    typed = record_functor(pred, {k: v.dtype for k, v in read.items()})
    if typed is not None:
        tp, functor, params = typed
        check_powers(tp, read, pred.params)
        arrays = [read[name] for name, _ in tp.dtype]
        return RecordSpec(functor), [*arrays, *params]
    with np.errstate(all="ignore"):
        mask = record_mask(pred, read, n, cupy)
    return RecordSpec(None), [cupy.ascontiguousarray(mask, dtype=cupy.bool_)]


class _Pass:
    """Passes 1 to 3 queued on the current stream: the ballot words, the tile prefixes and,
    in ``counts[tiles]``, the total, then (``spans``) the copy's two work lists, whose lengths
    go to ``counts[tiles + 1]`` and ``[tiles + 2]``; what the copy needs, kept together (a
    capture keeps it for the graph's life)."""

    def __init__(self, fields: dict[str, Any], pred: Predicate, n: int,
                 spans: bool = True) -> None:  # fmt: skip
        import cupy

        read = {}
        for name in pred.fields:
            a = fields[name]
            # the other byte order: its bytes reversed (CuPy's astype copies them as they are)
            read[name] = contiguous(to_native(a))
        spec, args = _flags_launch(pred, read, n)
        self.n, self.spec, self.read, self.args = n, spec, read, args
        self.tiles = (n + spec.tile - 1) // spec.tile
        self.nspans = (n + spec.span - 1) // spec.span
        scan_blocks = spec.scan_blocks(self.tiles)
        # the last 2 + scan_blocks entries zeroed by the flags kernel
        self.counts = cupy.empty(spec.counts_size(self.tiles), dtype=cupy.uint64)
        self.words = cupy.empty((n + 31) // 32, dtype=cupy.uint32)
        self.warp_offsets = cupy.empty(self.tiles * (spec.block // 32), dtype=cupy.uint32)
        self.lists = cupy.empty(2 * self.nspans if spans else 0, dtype=cupy.uint32)
        if n:  # no rows: no module to build
            self.module = compiled(spec)  # held: an evicted entry stays loaded while in use
            flags = self.module.kernel("flags")
            scan = self.module.kernel("scan")
            flags((self.tiles,), (spec.block,),
                  (np.int64(n), self.words, self.counts, self.warp_offsets, *args))
            scan((scan_blocks,), (spec.scan_block,), (
                self.counts, np.int64(self.tiles), self.counts[self.tiles:],
                self.counts[self.tiles + 3:]))
            if spans:
                block = tuning.REC_SPANS_BLOCK
                self.module.kernel("spans")(((self.nspans + block - 1) // block,), (block,), (
                    np.int64(n), self.counts, np.uint32(spec.dense_from()), self.lists))
        else:
            self.counts.fill(0)

    @property
    def total(self) -> Any:
        """The selected count, on the device (a 1-element uint64 view)."""
        return self.counts[self.tiles:self.tiles + 1]

    def read_back(self) -> tuple[int, int, int]:
        """The total and the lengths of the two work lists (dense spans, sparse spans): the
        sized call's one host sync."""
        if not self.n:
            return 0, 0, 0
        total, dense, sparse = (int(v) for v in self.counts[self.tiles:self.tiles + 3].get())
        return total, dense, sparse

    def scatter(self, src: dict[str, Any], out: dict[str, Any], idx: Any, index_base: int,
                stream: Any, lengths: tuple[int, int] | None = None) -> list:
        """Pass 4 into ``out`` (and ``idx``); returns what must live until it has run. A span
        goes to the per-lane scatter from ``cupy_tuning.REC_DENSE_FROM`` of its rows selected.
        ``lengths`` (dense spans, sparse spans, as read back) sizes each form's grid to its
        list; without them (the sync-free call) each form's grid covers every span, and its
        blocks past the list's length (read on the device) exit."""

        src = {name: contiguous(a) for name, a in src.items()}
        table = column_table(src, out)
        if not self.n or (not len(table) and idx is None):
            return [src]
        d_table = upload_table(table, stream)
        spec = self.spec
        # both forms: (the words and places, the columns, the indices) + (list, its length)
        args = (np.int64(self.n), self.words, self.counts, self.warp_offsets, d_table,
                np.int32(len(table)), ptr_or_null(idx), np.int64(index_base))
        columns = len(table) + (1 if idx is not None else 0)
        for role, grid, reads_list, known in copy_launches(
                lengths, self.nspans, self.tiles, spec.span // spec.tile, columns):
            lists = self.lists if reads_list else None
            self.module.kernel(role)(grid, (spec.block,),
                                     (*args, ptr_or_null(lists), np.int64(known)))
        return [src, d_table]


def compact_records(
    fields: dict[str, Any], pred: Predicate, indices: bool, stable: bool, index_base: int,
    threads: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """Dispatch entry for CuPy records (see dask_compact.dispatch): every field's selected rows
    at exact length, in order (``stable`` is always honoured), plus ``"indices"``."""
    import cupy

    # fields of the other byte order (CuPy views of a swapped dtype) taken as native copies,
    # as the one-array calls take such input: the outputs are made in the fields' dtypes,
    # and CuPy refuses to make an array of the other order (until 2026-12-01, fourteenth
    # session, such a call raised CuPy's ValueError once it had counted), so they are native
    fields = native_fields(fields)
    if tuning.FAST_SMALL_CALLS:  # read at the call: tests and benchmarks turn it off
        call = ready_records_call(fields, pred, indices)
        if call is not None:
            return call(fields, index_base)
    first = next(iter(fields.values()))
    n = int(first.shape[0])
    with cupy.cuda.Device(first.device.id):
        stream = cupy.cuda.get_current_stream()
        passes = _Pass(fields, pred, n)
        total, dense, sparse = passes.read_back()  # the one host sync
        try:
            out = {name: output_empty(total, a.dtype, a.shape[1:])
                   for name, a in fields.items()}  # fmt: skip
            idx = output_empty(total, np.int64) if indices else None
        except MemoryError as e:  # CuPy's OutOfMemoryError is one
            no_room_note(e, total, n, fields, indices, first.device.id)
            raise
        if total:
            # what the scatter reads may be freed on return: CuPy's pool reuses a block only
            # for later work on its stream, and the table stays cached (or pinned until copied)
            passes.scatter(fields, out, idx, index_base, stream, (dense, sparse))
        if indices:
            out["indices"] = idx
        return out


def compact_records_into(
    fields: dict[str, Any], pred: Predicate, out: dict[str, Any], count: Any, stream: Any,
    index_base: int = 0,
) -> Any:
    """Dispatch entry of :func:`dask_compact.compact_records_into` (arguments checked): the
    selected rows into the caller's buffers (capacity n rows), the count into ``count``, all
    queued on ``stream`` with no host synchronisation (capturable into a CUDA graph)."""
    import cupy

    first = next(iter(fields.values()))
    n = int(first.shape[0])
    stream = cupy.cuda.get_current_stream() if stream is None else stream
    with cupy.cuda.Device(first.device.id), stream:
        if count is None:
            count = cupy.empty(1, dtype=np.int64)
        src = {name: fields[name] for name in out if name in fields}
        dst = {name: out[name] for name in src}
        idx = out["indices"] if "indices" in out and "indices" not in fields else None
        call = ready_into_call(fields, pred) if tuning.FAST_SMALL_CALLS else None
        if call is not None:
            call.into(fields, dst, idx, count, index_base)
            return count
        passes = _Pass(fields, pred, n)
        keep = passes.scatter(src, dst, idx, index_base, stream)
        cupy.cuda.runtime.memcpyAsync(count.data.ptr, passes.total.data.ptr, 8,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
        # the work is queued, not done: what it reads must outlive this call. CuPy's pool
        # frees in stream order (a block freed here is reused only by later work on this
        # stream), so the arrays may go; a capture keeps them for the graph's life.
        if capturing(stream):
            kept_for_graphs.append((passes, keep))
        return count
