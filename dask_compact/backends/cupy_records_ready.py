"""The records' ready call: a repeated sized :func:`compact_records` of one predicate on one
layout (field names, dtypes, trailing shapes, rows) with everything but the fields and the
outputs prepared: the module, the five kernels' arguments packed once
(``cupy_launch.PackedLaunch``), the grids, the workspace (ballot words, tile counts, warp
offsets, work lists) and a pinned buffer for the column table and one for the counts.

Why: the general call (``cupy_records.compact_records``) spends its host time on CuPy's
argument boxing of five launches, four workspace allocations, the predicate's functor lookup
and the column table's upload through a cache keyed by its bytes. On one H200 a 2^20-row call
of four float32 fields took 155-180 us, 0.5-0.9x the two-step recipe it replaces
(``compact_array(..., output="indices")`` then ``cupy.take`` per field), whose own small call
is ready-made; at 2^28 rows the GPU idled ~0.2 ms of a 1.2 ms call while the host queued.

Per call: the read fields' pointers into the flags kernel's slots, three launches, the total
and the two work lists' lengths copied into pinned memory with one synchronisation, every
output allocated at its exact length, the column table written into pinned memory and copied
to the device in stream order, and each copy form launched on its list. Calls are keyed per
(thread, predicate object, layout, rows, indices, device, stream): each is used by one
thread, in stream order, so the kept workspace and pinned buffers are reused safely (a call's
table is written after its own synchronisation, when the previous call's copy of it has run).
"""

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
from . import cupy_tuning as tuning
from .cupy_backend import _capturing, _kept_for_graphs
from .cupy_device import output_empty
from .cupy_launch import PackedLaunch
from .cupy_modules import compiled, typed_functor
from .cupy_ready import KEEP_SCRATCH_BYTES
from .cupy_source import RecordSpec

__all__ = ["RecordsCall", "ready_records_call", "ready_into_call", "upload_table",
           "record_functor", "column_entries", "no_room_note", "copy_unit",
           "repeated_records_call", "remember_records_call", "repeated_into",
           "remember_into"]

logger = logging.getLogger("dask_compact")

_UNITS = (16, 8, 4, 2, 1)


def copy_unit(row_bytes: int, *addresses: int) -> int:
    """The widest unit (bytes) dividing the row and every address: the copy's load size."""
    common = row_bytes
    for a in addresses:
        common |= a
    return next(u for u in _UNITS if common % u == 0)  # u divides all iff it divides their OR


def column_entries(fields: list[tuple[int, int, int]]) -> list[int]:
    """The copy's column table, flat: per field (row bytes, source, destination), one (src,
    dst, unit, stride) column per unit of its row (a float32 (n, 3) field: three 4-byte
    columns, stride 3; kernels/records.cu's FieldCopy). Zero-width rows copy nothing."""
    flat: list[int] = []
    for row, sp, dp in fields:
        if row == 0:
            continue
        unit = copy_unit(row, sp, dp)
        stride = row // unit
        for u in range(stride):
            flat += (sp + u * unit, dp + u * unit, unit, stride)
    return flat


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
        if _capturing(stream):
            _kept_for_graphs.append(hit)
        return hit
    mem = cupy.cuda.alloc_pinned_memory(max(table.nbytes, 8))
    host = np.frombuffer(mem, dtype=np.int64, count=table.size).reshape(table.shape)
    host[...] = table
    d = cupy.empty(table.shape, dtype=np.int64)
    cupy.cuda.runtime.memcpyAsync(d.data.ptr, host.ctypes.data, table.nbytes,
                                  cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
    if _capturing(stream):
        _kept_for_graphs.append(mem)  # the graph copies from it at every replay
    else:
        event = cupy.cuda.Event(disable_timing=True)
        event.record(stream)
        _pinned.append((event, mem))
        while _pinned and _pinned[0][0].done:
            _pinned.pop(0)
    _tables.put(key, d)
    return d


_pinned: list[tuple] = []  # (event after the copy, pinned table) until the copy has run


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
        self.rows = {name: row for name, _, _, row in self.layout}
        self.tiles = tiles = -(-n // spec.tile)
        self.nspans = nspans = -(-n // spec.span)
        self.scan_blocks = spec.scan_blocks(tiles)
        self.per = spec.span // spec.tile
        # the column table: at most one column per byte of every row
        most = max(1, sum(row for *_, row in self.layout))
        self.table_mem = cupy.cuda.alloc_pinned_memory(32 * most)
        self.table = np.frombuffer(self.table_mem, dtype=np.int64, count=4 * most)
        self.host_mem = cupy.cuda.alloc_pinned_memory(24)
        self.host = np.frombuffer(self.host_mem, dtype=np.uint64, count=3)
        # the workspace, one allocation: the tile counts (the prefixes, the total, the lists'
        # lengths, the scan's status words), the column table, the ballot words, the warp
        # offsets, the two work lists
        sizes = (8 * (tiles + 3 + self.scan_blocks), 32 * most, 4 * -(-n // 32),
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
        self.spans.scalar(2, np.uint32(min(math.ceil(spec.span * tuning.REC_DENSE_FROM),
                                           spec.span + 1)))
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
        self.spans(self.spans_grid, tuning.REC_SPANS_BLOCK, 0, sp)

    def _queue_copy(self, table: int, ncols: int, idx: int, index_base: int,
                    lengths: tuple[int, int] | None, sp: int) -> None:
        """Pass 4, each form on its list: ``lengths`` (dense, sparse spans) as read back, or
        None (sync-free) for grids over every span whose blocks read the lengths on the
        device (cupy_records._Pass.scatter)."""
        columns = ncols + (idx != 0)
        if not columns:
            return
        dense, sparse = lengths if lengths is not None else (self.nspans, self.nspans)
        for role, spans in (("gather", sparse), ("scatter", dense)):
            if not spans:
                continue
            launch = self.copies[role]
            launch.pointer(4, table)
            launch.int64(5, ncols)  # an int32 argument: its low bytes (little-endian)
            launch.pointer(6, idx)
            launch.int64(7, index_base)
            launch.int64(9, spans if lengths is not None else -1)
            if role == "gather":
                launch(spans, self.spec.block, 0, sp)
            elif sparse or lengths is None:
                launch(spans * self.per, self.spec.block, 0, sp, columns)
            else:  # every span dense: no list to read, a block per tile
                launch.pointer(8, 0)
                launch(self.tiles, self.spec.block, 0, sp, columns)
                launch.pointer(8, self.lists_ptr)

    def into(self, fields: dict[str, Any], dst: dict[str, Any], idx: Any, count: Any,
             index_base: int = 0) -> None:
        """The sync-free call (compact_records_into): the selection into the caller's buffers
        ``dst`` (and ``idx``), the total into ``count``, all queued on this call's stream
        with nothing waited for. Not for a stream being captured: a graph keeps the general
        call's own workspace, which no later call reuses."""
        import cupy

        runtime = cupy.cuda.runtime
        sp = self.stream.ptr
        ws = self.ws if self.ws is not None else self._workspace()  # noqa: F841 - held
        self._queue_passes(fields, sp)
        rows = self.rows
        table = np.array(column_entries([(rows[name], fields[name].data.ptr, buf.data.ptr)
                                         for name, buf in dst.items()]), dtype=np.int64)
        # the device table of these buffers, uploaded once (cached by content): a loop over
        # the same buffers copies nothing, and no pinned memory is overwritten while queued
        d_table = upload_table(table.reshape(-1, 4), self.stream) if len(table) else None
        self._queue_copy(0 if d_table is None else d_table.data.ptr, len(table) // 4,
                         0 if idx is None else idx.data.ptr, index_base, None, sp)
        runtime.memcpyAsync(count.data.ptr, self.counts_ptr + 8 * self.tiles, 8,
                            runtime.memcpyDeviceToDevice, sp)

    def _columns(self, fields: dict[str, Any], out: dict[str, Any]) -> int:
        """The column table (cupy_records._columns) written into pinned memory; its rows."""
        flat = column_entries([(row, fields[name].data.ptr, out[name].data.ptr)
                               for name, _, _, row in self.layout])
        self.table[:len(flat)] = flat
        return len(flat) // 4

    def __call__(self, fields: dict[str, Any], index_base: int) -> dict[str, Any]:
        """Every field's selected rows at exact length (and ``"indices"``), for ``fields``
        of this call's layout, C-contiguous, on its device (the current one)."""
        import cupy

        runtime = cupy.cuda.runtime
        sp = self.stream.ptr
        ws = self.ws if self.ws is not None else self._workspace()  # noqa: F841 - held
        self._queue_passes(fields, sp)
        runtime.memcpyAsync(self.host.ctypes.data, self.counts_ptr + 8 * self.tiles, 24,
                            runtime.memcpyDeviceToHost, sp)
        self.stream.synchronize()  # the call's one host sync
        total, dense, sparse = (int(v) for v in self.host)
        try:
            out = {name: output_empty(total, dtype, tail) for name, dtype, tail, _ in self.layout}
            idx = output_empty(total, np.int64) if self.indices else None
        except MemoryError as e:  # CuPy's OutOfMemoryError is one
            no_room_note(e, total, self.n, fields, self.indices, self.device)
            raise
        if total:
            ncols = self._columns(fields, out)
            if ncols:
                runtime.memcpyAsync(self.table_ptr, self.table.ctypes.data, 32 * ncols,
                                    runtime.memcpyHostToDevice, sp)
            self._queue_copy(self.table_ptr, ncols, 0 if idx is None else idx.data.ptr,
                             index_base, (dense, sparse), sp)
        if idx is not None:
            out["indices"] = idx
        return out


def record_functor(pred: Predicate, read: dict[str, np.dtype]) -> tuple | None:
    """(typed predicate, generated functor, bound constants) of a record predicate over the
    read fields' dtypes, or None where it has no exact device form (CodegenUnsupported: the
    mask path) or a constant does not fit its dtype."""
    if pred.expr is None:
        return None
    try:
        tp, functor = typed_functor(pred.expr, field_dtypes(read), pred,
                                    generate_record_functor)
        return tp, functor, list(tp.bind(pred.params))
    except (CodegenUnsupported, ParamOverflow) as e:
        logger.debug("record predicate %s takes the mask path: %s", pred.source, e)
        return None


# (thread, id(predicate), layout, n, indices or "into", device, stream, REC_DENSE_FROM) ->
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
    current stream, or None where the general call runs: no rows, a field not C-contiguous,
    a read field not in native byte order, the fields off the current device, the mask path,
    integer powers."""
    return _ready(fields, pred, indices, False)


def ready_into_call(fields: dict[str, Any], pred: Predicate) -> Any:
    """The same for compact_records_into (its :meth:`RecordsCall.into`), or None: also while
    the current stream is being captured into a CUDA graph (the general call then gives the
    graph a workspace of its own)."""
    import cupy

    if _capturing(cupy.cuda.get_current_stream()):
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
        if not a.flags.c_contiguous:
            return None
    layout = tuple((name, a.dtype, a.shape[1:]) for name, a in fields.items())
    key = (threading.get_ident(), id(pred), layout, n, "into" if into else indices, dev,
           cupy.cuda.get_current_stream().ptr, tuning.REC_DENSE_FROM)
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


# compact_records' repeated call, as compact_array's (cupy_backend.repeated_call): (thread,
# the caller's predicate as a key, indices, stream, every field's (name, type, dtype, shape,
# device)) -> (device, its RecordsCall, the caller's predicate). A hit skips the public
# checks (18-38 us on the 2-core CI machine for four fields) and the dispatch: everything
# they examined is in the key, and an equal key passed them.
_repeats: BoundedCache[tuple, tuple] = BoundedCache("repeated record calls")


def _repeat_key(fields: dict[str, Any], pred_like: Any, indices: bool) -> tuple | None:
    import cupy

    from .cupy_backend import caller_key

    pk = caller_key(pred_like)
    if pk is None:
        return None
    layout = tuple((name, type(a), a.dtype, a.shape, a.data.device_id)
                   for name, a in fields.items())
    return (threading.get_ident(), pk, indices, cupy.cuda.get_current_stream().ptr, layout)


def repeated_records_call(fields: dict[str, Any], pred_like: Any, indices: bool) -> Any:
    """The ready call :func:`remember_records_call` kept for this thread, predicate, layout
    and stream, if every field is C-contiguous and the current device is theirs; else None
    (the public call checks and dispatches as usual)."""
    from . import cupy_backend

    if not cupy_backend.FAST_SMALL_CALLS:
        return None
    try:
        key = _repeat_key(fields, pred_like, indices)
        hit = None if key is None else _repeats.get(key)
    except (TypeError, AttributeError):  # not arrays, unhashable: the checks say what
        return None
    if hit is None:
        return None
    import cupy

    if cupy.cuda.runtime.getDevice() != hit[0]:
        return None
    for a in fields.values():
        if not a.flags.c_contiguous:
            return None
    return hit[1]


def remember_records_call(fields: dict[str, Any], pred_like: Any, pred: Predicate,
                          indices: bool) -> None:
    """After a public call on ``fields`` (checked, every array the caller's) that ran a
    ready call: keep it under ``pred_like``, the predicate the caller passed."""
    from . import cupy_backend

    if not cupy_backend.FAST_SMALL_CALLS:
        return
    import cupy

    key = _repeat_key(fields, pred_like, indices)
    if key is None:
        return
    call = ready_records_call(fields, pred, indices)
    if call is not None:
        dev = next(iter(fields.values())).data.device_id
        if dev == cupy.cuda.runtime.getDevice():
            _repeats.put(key, (dev, call, pred_like))


# compact_records_into's repeated call: (thread, the caller's predicate as a key, the stream,
# every field's and buffer's (name, type, dtype, shape, strides, pointer, device), the count's
# (type, dtype, shape, pointer) or None) -> (device, the RecordsCall, the caller's predicate,
# the written fields, the indices buffer's name or None). With the pointers and strides in the
# key an equal key is the same memory in the same layout, whose checks (contiguity, room,
# overlaps) passed the last time.
_into_repeats: BoundedCache[tuple, tuple] = BoundedCache("repeated record into calls")


def _desc(a: Any) -> tuple:
    return (type(a), a.dtype, a.shape, a.strides, a.data.ptr, a.data.device_id)


def _into_key(fields: dict[str, Any], pred_like: Any, out: Any, count: Any, stream: Any
              ) -> tuple | None:  # fmt: skip
    import cupy

    from .cupy_backend import caller_key

    pk = caller_key(pred_like)
    if pk is None or type(out) is not dict:
        return None
    sp = (cupy.cuda.get_current_stream() if stream is None else stream).ptr
    return (threading.get_ident(), pk, sp,
            tuple((name, _desc(a)) for name, a in fields.items()),
            tuple((name, _desc(b)) for name, b in out.items()),
            None if count is None else (type(count), count.dtype, count.shape, count.data.ptr))


def repeated_into(fields: dict[str, Any], pred_like: Any, out: Any, count: Any,
                  stream: Any) -> Any:
    """Run the ready call :func:`remember_into` kept for these arguments and return the count
    array, or None where none is kept (or the stream is being captured): the public call then
    checks and dispatches as usual."""
    from . import cupy_backend

    if not cupy_backend.FAST_SMALL_CALLS:
        return None
    try:
        key = _into_key(fields, pred_like, out, count, stream)
        hit = None if key is None else _into_repeats.get(key)
    except (TypeError, AttributeError):  # not arrays, unhashable: the checks say what
        return None
    if hit is None:
        return None
    import cupy

    dev, call, _, written, idx_name = hit
    if cupy.cuda.runtime.getDevice() != dev or _capturing(call.stream):
        return None
    if count is None:
        with call.stream:  # allocated in the stream's order, as the general call does
            count = cupy.empty(1, dtype=np.int64)
    call.into(fields, {name: out[name] for name in written},
              None if idx_name is None else out[idx_name], count)
    return count


def remember_into(fields: dict[str, Any], pred_like: Any, pred: Predicate, out: Any,
                  count: Any, stream: Any) -> None:
    """After a public compact_records_into on these (checked) arguments: keep its ready call
    under the caller's predicate and the arguments' memory for :func:`repeated_into`."""
    from . import cupy_backend

    if not cupy_backend.FAST_SMALL_CALLS:
        return
    import cupy

    key = _into_key(fields, pred_like, out, count, stream)
    if key is None:
        return
    dev = next(iter(fields.values())).data.device_id
    target = cupy.cuda.get_current_stream() if stream is None else stream
    with cupy.cuda.Device(dev), target:
        call = ready_into_call(fields, pred)
    if call is not None:
        written = tuple(name for name in out if name in fields)
        idx_name = "indices" if "indices" in out and "indices" not in fields else None
        _into_repeats.put(key, (dev, call, pred_like, written, idx_name))
