"""The records' ready calls: a repeated sized :func:`compact_records` (or sync-free
:func:`compact_records_into`) of one predicate on one layout (field names, dtypes, trailing
shapes, rows) with everything but the fields and the outputs prepared: the module, the five
kernels' arguments packed once (``cupy_launch.PackedLaunch``), the grids, the workspace
(ballot words, tile counts, warp offsets, work lists) and a pinned buffer for the column
table and one for the counts.

Why: the general call (``cupy_records.compact_records``) spends its host time on CuPy's
argument boxing of five launches, four workspace allocations, the predicate's functor lookup
and the column table's upload through a cache keyed by its bytes. On one H200 a 2^20-row call
of four float32 fields took 155-180 us, 0.5-0.9x the two-step recipe it replaces
(``compact_array(..., output="indices")`` then ``cupy.take`` per field), whose own small call
is ready-made; at 2^28 rows the GPU idled ~0.2 ms of a 1.2 ms call while the host queued.

Per sized call: the read fields' pointers into the flags kernel's slots, three launches, the
total and the two work lists' lengths copied into pinned memory with one synchronisation,
every output allocated at its exact length, the column table written into pinned memory and
copied to the device in stream order, and each copy form launched on its list. Where the
previous call's outputs were all of at least OUTPUT_CLASS_MIN_BYTES (allocated in size
classes, see ``cupy_device.class_items``), outputs of their classes and their column table are
made while the GPU runs the first passes, and kept where this call's total falls in the same
classes (a loop of batches selecting about as much: the host's turn between the count and the
copy is then the launches); else they are freed before this call's are allocated, so the
transient peak is the previous call's outputs. Calls are keyed per (thread, predicate
object, layout, rows, indices, device, stream): each is used by one thread, in stream order,
so the kept workspace and pinned buffers are reused safely (the two pinned tables are written
in turn: when a call writes one, its upload two calls before has run, since the call between
synchronised).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..predicate.core import Predicate
from ..validate import other_order
from . import cupy_tuning as tuning
from .cupy_device import OUTPUT_CLASS_MIN_BYTES, capturing, class_items, landed, output_empty
from .cupy_launch import PackedLaunch, thread_key
from .cupy_modules import compiled
from .cupy_ready import KEEP_SCRATCH_BYTES
from .cupy_records_common import (
    column_entries,
    column_table,
    copy_launches,
    no_room_note,
    record_functor,
    upload_table,
)
from .cupy_source import RecordSpec

__all__ = ["RecordsCall", "ready_records_call", "ready_into_call"]


class RecordsCall:
    """A repeated sized records call with everything but its fields and outputs ready (see
    the module's docstring). Built from a predicate with a generated functor whose constants
    need no check against the data (no integer powers); not thread-safe (the packed slots and
    the pinned buffers are state): one per thread and stream."""

    def __init__(self, spec: RecordSpec, read: list[str], params: list, n: int,
                 layout: tuple, indices: bool) -> None:
        import cupy

        self.n, self.spec, self.indices = n, spec, indices
        self.module = compiled(spec)  # held: an evicted module stays loaded while this lives
        # outputs: (name, dtype, trailing shape, row bytes) per field, in the fields' order
        self.layout = [(name, dtype, tail, dtype.itemsize * math.prod(tail))
                       for name, dtype, tail in layout]
        self.tiles = tiles = -(-n // spec.tile)
        self.nspans = nspans = -(-n // spec.span)
        self.scan_blocks = spec.scan_blocks(tiles)
        self.per = spec.span // spec.tile
        # the column table: at most one entry per field
        most = max(1, len(self.layout))
        # two pinned tables, used in turn: a call writes its table before its sync when it
        # allocates its outputs early (below), when the previous call's upload of the other
        # table may still be queued (the one before it has run: the previous call synced)
        self.table_mem = cupy.cuda.alloc_pinned_memory(2 * 32 * most)
        self.tables = np.frombuffer(self.table_mem, dtype=np.int64, count=8 * most).reshape(2, -1)
        self.turn = 0
        # the previous sized call's total: its outputs' size classes are allocated while the
        # GPU runs this call's first passes, and kept where this call's total has the same
        self.last_total: int | None = None
        self.host_mem = cupy.cuda.alloc_pinned_memory(24)
        self.host = np.frombuffer(self.host_mem, dtype=np.uint64, count=3)
        # the workspace, one allocation: the tile counts (the prefixes, the total, the lists'
        # lengths, the scan's status words), the column table, the ballot words, the warp
        # offsets, the two work lists
        sizes = (8 * spec.counts_size(tiles), 32 * most, 4 * -(-n // 32),
                 4 * tiles * (spec.block // 32), 4 * 2 * nspans)
        self.at = np.cumsum((0, *sizes[:-1])).tolist()
        self.ws_bytes = sum(sizes)

        kernel = self.module.kernel
        self.flags = PackedLaunch(kernel("flags"), 4 + len(read) + len(params))
        self.flags.int64(0, n)
        self.read_slots = [(4 + i, name) for i, name in enumerate(read)]
        for i, v in enumerate(params):
            self.flags.scalar(4 + len(read) + i, v)
        self.scan = PackedLaunch(kernel("scan"), 4)
        self.scan.int64(1, tiles)
        self.spans = PackedLaunch(kernel("spans"), 4)
        self.spans.int64(0, n)
        self.dense_from = spec.dense_from()
        self.spans.scalar(2, np.uint32(self.dense_from))
        self.spans_grid = -(-nspans // tuning.REC_SPANS_BLOCK)
        self.copies = {role: PackedLaunch(kernel(role), 10) for role in ("gather", "scatter")}
        for launch in self.copies.values():
            launch.int64(0, n)
        # kept with the call up to KEEP_SCRATCH_BYTES (2^20 rows: 140 KiB), else taken from
        # CuPy's pool per call (a call keeps at most memory-entries of them)
        self.ws = self._workspace() if self.ws_bytes <= KEEP_SCRATCH_BYTES else None
        self.stream = cupy.cuda.get_current_stream()
        self.device = cupy.cuda.runtime.getDevice()

    def _workspace(self) -> Any:
        """A workspace, its pointers written into every launch's slots."""
        import cupy

        ws = cupy.empty(self.ws_bytes, dtype=np.uint8)
        counts, table, words, warps, lists = (ws.data.ptr + a for a in self.at)
        tiles = self.tiles
        self.counts_ptr, self.table_ptr, self.lists_ptr = counts, table, lists
        self.flags.pointer(1, words)
        self.flags.pointer(2, counts)
        self.flags.pointer(3, warps)
        self.scan.pointer(0, counts)
        self.scan.pointer(2, counts + 8 * tiles)
        self.scan.pointer(3, counts + 8 * (tiles + 3))
        self.spans.pointer(1, counts)
        self.spans.pointer(3, lists)
        for launch in self.copies.values():
            launch.pointer(1, words)
            launch.pointer(2, counts)
            launch.pointer(3, warps)
            launch.pointer(8, lists)
        return ws

    def _queue_passes(self, fields: dict[str, Any], sp: int) -> None:
        """Passes 1-3 (flags, tile scan, spans) on the read fields."""
        flags, spec = self.flags, self.spec
        for slot, name in self.read_slots:
            flags.pointer(slot, fields[name].data.ptr)
        flags(self.tiles, spec.block, 0, sp)
        self.scan(self.scan_blocks, spec.scan_block, 0, sp)
        dense_from = spec.dense_from()  # read at each call, as the general call reads it
        if dense_from != self.dense_from:
            self.dense_from = dense_from
            self.spans.scalar(2, np.uint32(dense_from))
        self.spans(self.spans_grid, tuning.REC_SPANS_BLOCK, 0, sp)

    def _queue_copy(self, table: int, ncols: int, idx: int, index_base: int,
                    lengths: tuple[int, int] | None, sp: int) -> None:
        """Pass 4, each form on its list: ``lengths`` (dense, sparse spans) as read back, or
        None (sync-free) for grids over every span whose blocks read the lengths on the
        device (copy_launches, as the general call)."""
        columns = ncols + (idx != 0)
        if not columns:
            return
        for role, grid, reads_list, known in copy_launches(lengths, self.nspans, self.tiles,
                                                           self.per, columns):
            launch = self.copies[role]
            launch.pointer(4, table)
            launch.int64(5, ncols)  # an int32 argument: its low bytes (little-endian)
            launch.pointer(6, idx)
            launch.int64(7, index_base)
            launch.pointer(8, self.lists_ptr if reads_list else 0)
            launch.int64(9, known)
            launch(grid[0], self.spec.block, 0, sp, grid[1] if len(grid) > 1 else 1)

    def into(self, fields: dict[str, Any], dst: dict[str, Any], idx: Any, count: Any,
             index_base: int = 0) -> None:
        """The sync-free call (compact_records_into): the selection into the caller's buffers
        ``dst`` (and ``idx``), the total into ``count``, all queued on this call's stream
        with nothing waited for. Not for a stream being captured: a graph keeps the general
        call's own workspace, which no later call reuses."""
        import cupy

        runtime = cupy.cuda.runtime
        sp = self.stream.ptr
        # what it allocates (a workspace not kept, the column table), in the order of the
        # stream that uses it: CuPy's pool takes a block freed on return back for the stream
        # it was made on, so one made on the current stream (until 2026-12-01: the repeated
        # call runs this outside the call's stream) went to the next allocation there while
        # this stream had still to run on it (a poisoned-pool probe)
        with self.stream:
            ws = self.ws if self.ws is not None else self._workspace()  # noqa: F841 - held
            self._queue_passes(fields, sp)
            table = column_table({name: fields[name] for name in dst}, dst)
            # the device table of these buffers, uploaded once (cached by content): a loop
            # over the same buffers copies nothing, and no pinned memory is overwritten while
            # queued
            d_table = upload_table(table, self.stream) if len(table) else None
            self._queue_copy(0 if d_table is None else d_table.data.ptr, len(table),
                             0 if idx is None else idx.data.ptr, index_base, None, sp)
            runtime.memcpyAsync(count.data.ptr, self.counts_ptr + 8 * self.tiles, 8,
                                runtime.memcpyDeviceToDevice, sp)

    def _upload_columns(self, fields: dict[str, Any], out: dict[str, Any], table: np.ndarray,
                        sp: int) -> int:
        """The column table (column_entries) written into the pinned ``table`` and copied to
        the workspace in stream order; its rows."""
        import cupy

        flat = column_entries([(row, fields[name].data.ptr, out[name].data.ptr)
                               for name, _, _, row in self.layout])
        table[:len(flat)] = flat
        if flat:
            cupy.cuda.runtime.memcpyAsync(self.table_ptr, table.ctypes.data, 8 * len(flat),
                                          cupy.cuda.runtime.memcpyHostToDevice, sp)
        return len(flat) // 4

    def _early_outputs(self, total: int | None) -> tuple[dict[str, Any], Any] | None:
        """Every output at the size class of ``total`` rows (the previous call's), allocated
        before this call's count is known, or None: no previous call, an output below
        OUTPUT_CLASS_MIN_BYTES there (its exact size would have to match), no memory."""
        import cupy

        rows = list(self.layout)
        if self.indices:
            rows.append(("indices", np.dtype(np.int64), (), 8))
        if not total or min(row for *_, row in rows) * total < OUTPUT_CLASS_MIN_BYTES:
            return None
        try:
            out = {name: cupy.empty((class_items(total, row), *tail), dtype=dtype)
                   for name, dtype, tail, row in rows}  # fmt: skip
        except MemoryError:  # CuPy's OutOfMemoryError is one: allocated after the count
            return None
        idx = out.pop("indices") if self.indices else None
        return out, idx

    @staticmethod
    def _fit(early: dict[str, Any], idx: Any, total: int) -> tuple[dict[str, Any], Any] | None:
        """The early outputs as this call's, where each has ``total``'s size class (the
        first ``total`` rows, as output_empty gives them), else None."""
        arrays = [*early.values(), *(() if idx is None else (idx,))]
        if any(class_items(total, a.nbytes // a.shape[0]) != a.shape[0] for a in arrays):
            return None
        out = {name: a if a.shape[0] == total else a[:total] for name, a in early.items()}
        return out, (None if idx is None else idx if idx.shape[0] == total else idx[:total])

    def __call__(self, fields: dict[str, Any], index_base: int) -> dict[str, Any]:
        """Every field's selected rows at exact length (and ``"indices"``), for ``fields``
        of this call's layout, C-contiguous, on its device (the current one)."""
        import cupy

        runtime = cupy.cuda.runtime
        sp = self.stream.ptr
        ws = self.ws if self.ws is not None else self._workspace()  # noqa: F841 - held
        try:
            self._queue_passes(fields, sp)
            runtime.memcpyAsync(self.host.ctypes.data, self.counts_ptr + 8 * self.tiles, 24,
                                runtime.memcpyDeviceToHost, sp)
            self.turn ^= 1
            table = self.tables[self.turn]
            # while the GPU runs passes 1-3: the outputs at the previous total's size classes
            # and their column table, uploaded in stream order (at 2^28 rows of four float32
            # fields the allocations alone took 28 us of the GPU's idle time between the
            # passes and the copy)
            early = self._early_outputs(self.last_total)
            ncols = 0 if early is None else self._upload_columns(fields, early[0], table, sp)
            self.stream.synchronize()  # the call's one host sync
        except BaseException:
            # interrupted before its sync (KeyboardInterrupt, or anything raised there): the
            # two pinned tables are written in turn on the word of that sync (the upload two
            # calls before has run), and the counts land in pinned memory later. Until
            # 2026-12-01 (fourteenth session; a sweep after the ready call's fix, daeb377) the
            # next call wrote its table early over the one the call before the interrupted
            # one was still to upload after its sync (that call's copy then ran with the next
            # call's column table: its outputs wrong), and a call evicted meanwhile gave its
            # count buffer back to CuPy's pool with the copy into it still to land. Waited
            # for here: no cost to a call not interrupted.
            landed(self.stream)
            raise
        total, dense, sparse = (int(v) for v in self.host)
        self.last_total = total
        fit = None if early is None else self._fit(*early, total)
        if fit is not None:
            out, idx = fit
        else:
            early = None  # freed: CuPy's pool reuses its blocks for these outputs
            try:
                out = {name: output_empty(total, dtype, tail)
                       for name, dtype, tail, _ in self.layout}  # fmt: skip
                idx = output_empty(total, np.int64) if self.indices else None
            except MemoryError as e:  # CuPy's OutOfMemoryError is one
                no_room_note(e, total, self.n, fields, self.indices, self.device)
                raise
            if total:  # the table's upload before the sync has run: rewritten
                ncols = self._upload_columns(fields, out, table, sp)
        if total:
            self._queue_copy(self.table_ptr, ncols, 0 if idx is None else idx.data.ptr,
                             index_base, (dense, sparse), sp)
        if idx is not None:
            out["indices"] = idx
        return out


# (thread, id(predicate), layout, n, indices or "into", device, stream) ->
# (predicate, its RecordsCall or None where the general call runs); the predicate is held so
# that its id is not reused while the entry lives.
_calls: BoundedCache[tuple, tuple] = BoundedCache("ready record calls")
# The same calls by what they compute (thread, module, the functor's fields and constants,
# layout, ...): a predicate made anew for each call (a Predicate passed with other fields, a
# callable without a trace key) finds the call an equal one made, instead of building another
# (a workspace and pinned buffers each).
_by_content: BoundedCache[tuple, RecordsCall] = BoundedCache("record calls by content")


def ready_records_call(fields: dict[str, Any], pred: Predicate, indices: bool) -> Any:
    """The ready call for these CuPy fields (checked, one device) and predicate on the
    current stream, or None where the general call runs: no rows, a field not C-contiguous
    or of the other byte order, the fields off the current device, the mask path, integer
    powers."""
    return _ready(fields, pred, indices, False)


def ready_into_call(fields: dict[str, Any], pred: Predicate) -> Any:
    """The same for compact_records_into (its :meth:`RecordsCall.into`), or None: also while
    the current stream is being captured into a CUDA graph (the general call then gives the
    graph a workspace of its own)."""
    import cupy

    if capturing(cupy.cuda.get_current_stream()):
        return None
    return _ready(fields, pred, False, True)


def _ready(fields: dict[str, Any], pred: Predicate, indices: bool, into: bool) -> Any:
    import cupy

    first = next(iter(fields.values()))
    n = int(first.shape[0])
    dev = first.data.device_id
    if not n or dev != cupy.cuda.runtime.getDevice():
        return None
    for a in fields.values():
        # no sized call for a field of the other byte order: compact_records runs the one of
        # its native copy (native_fields), and one kept for the field itself would be
        # repeated on it unconverted (records' _repeats), its output made in that order,
        # which CuPy refuses. compact_records_into copies it as it is, into its dtype
        if not a.flags.c_contiguous or (other_order(a) and not into):
            return None
    layout = tuple((name, a.dtype, a.shape[1:]) for name, a in fields.items())
    key = (thread_key(), id(pred), layout, n, "into" if into else indices, dev,
           cupy.cuda.get_current_stream().ptr)
    hit = _calls.get(key)
    if hit is not None and hit[0] is pred:
        return hit[1]
    call = None
    read = {name: fields[name].dtype for name in pred.fields}
    typed = record_functor(pred, read) if all(dt.isnative for dt in read.values()) else None
    # integer powers are checked against the data per call (check_powers): the general call
    if typed is not None and not typed[0].powers:
        tp, functor, params = typed
        spec, order = RecordSpec(functor), tuple(name for name, _ in tp.dtype)
        constants = tuple((np.asarray(v).dtype.str, np.asarray(v).tobytes()) for v in params)
        content = (key[0], spec, order, constants, *key[2:])
        call = _by_content.get(content)
        if call is None:
            try:
                call = RecordsCall(spec, list(order), params, n, layout, indices)
            except AttributeError:  # a CuPy without RawKernel.kernel or the driver's launch
                call = None
            else:
                _by_content.put(content, call)
    _calls.put(key, (pred, call))
    return call
