"""Compact a record (several aligned CuPy arrays, one device) by one predicate on the GPU.

Three launches of ``kernels/records.cu`` and one host sync: the flags pass (the generated
record functor reads the predicate's fields by row; one ballot word per 32 rows, a count per
tile), the tile-count scan (exclusive tile prefixes and the total), the total read to allocate
every output at its exact length, then the scatter, which copies every field's selected rows
(and writes their global indices) from the ballot words. Extra device memory: n/8 bytes of
words, 8 bytes per tile of 2048 rows, and the field table.

A predicate with no exact device form (:class:`CodegenUnsupported`: complex transcendentals,
...), a constant that does not fit its dtype, or a callable the tracer could not record is
evaluated by CuPy into a mask, which the same flags kernel reads (``dcx::RecMaskPred``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..codegen.cuda_functor import CodegenUnsupported, generate_record_functor
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow
from ..predicate.fields import record_mask
from ..validate import native
from .cupy_device import ptr_or_null
from .cupy_modules import compiled
from .cupy_source import RecordSpec
from .cupy_tuning import SCAN_BLOCK

__all__ = ["compact_records", "copy_unit"]

logger = logging.getLogger("dask_compact")

_UNITS = (16, 8, 4, 2, 1)


def copy_unit(row_bytes: int, *addresses: int) -> int:
    """The widest unit (bytes) dividing the row and every address: the scatter's load size."""
    return next(u for u in _UNITS if row_bytes % u == 0 and all(a % u == 0 for a in addresses))


# (tree, field dtypes) -> (TypedPredicate, functor) or the reason there is none: typing and
# code generation cost more than a launch.
_functors: BoundedCache[tuple, Any] = BoundedCache("cuda record functors")


def _functor(pred: Predicate, dtypes: dict[str, np.dtype]) -> Any:
    def build() -> Any:
        tp = pred.typed(dtypes)
        try:
            return tp, generate_record_functor(tp)
        except CodegenUnsupported as e:
            return e

    assert pred.expr is not None
    return _functors.get_or_build((pred.expr, tuple(sorted(dtypes.items()))), build)


def _flags_launch(pred: Predicate, read: dict[str, Any], n: int) -> tuple[RecordSpec, list]:
    """The module and the flags kernel's predicate arguments (field pointers and constants,
    or the mask)."""
    import cupy

    if pred.expr is not None:
        hit = _functor(pred, {k: v.dtype for k, v in read.items()})
        if isinstance(hit, CodegenUnsupported):
            logger.debug("record predicate %s takes the mask path: %s", pred.source, hit)
        else:
            tp, functor = hit
            try:
                params = list(tp.bind(pred.params))
            except ParamOverflow as e:
                logger.debug("record predicate %s takes the mask path: %s", pred.source, e)
            else:
                arrays = [read[name] for name, _ in tp.dtype]
                return RecordSpec(functor), [*arrays, *params]
    with np.errstate(all="ignore"):
        mask = record_mask(pred, read, n, cupy)
    return RecordSpec(None), [cupy.ascontiguousarray(mask, dtype=cupy.bool_)]


def _columns(src: dict[str, Any], out: dict[str, Any]) -> np.ndarray:
    """The scatter's table: per field, one (src, dst, unit, stride) column per unit of its row
    (a float32 (n, 3) field: three 4-byte columns, stride 3). Zero-width rows copy nothing."""
    rows = []
    for name, a in src.items():
        o = out[name]
        row = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
        if row == 0:
            continue
        unit = copy_unit(row, a.data.ptr, o.data.ptr)
        rows += [(a.data.ptr + u * unit, o.data.ptr + u * unit, unit, row // unit)
                 for u in range(row // unit)]  # fmt: skip
    return np.array(rows, dtype=np.int64).reshape(-1, 4)


def compact_records(
    fields: dict[str, Any], pred: Predicate, indices: bool, stable: bool, index_base: int,
    threads: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """Dispatch entry for CuPy records (see dask_compact.dispatch): every field's selected rows
    at exact length, in order (``stable`` is always honoured), plus ``"indices"``."""
    import cupy

    first = next(iter(fields.values()))
    n = int(first.shape[0])
    with cupy.cuda.Device(first.device.id):
        read = {}
        for name in pred.fields:
            a = fields[name]
            a = a.astype(native(a.dtype)) if not a.dtype.isnative else a
            read[name] = cupy.ascontiguousarray(a)
        spec, args = _flags_launch(pred, read, n)
        words_n = (n + 31) // 32
        tiles = (n + spec.tile - 1) // spec.tile
        total = 0
        if n:
            k = compiled(spec)
            names = spec.names()
            flags = k.module.get_function(names["flags"])
            scan = k.module.get_function(names["scan"])
            words = cupy.empty(words_n, dtype=cupy.uint32)
            counts = cupy.empty(tiles + 1, dtype=cupy.uint64)
            flags((tiles,), (spec.block,), (np.int64(n), words, counts, *args))
            scan((1,), (SCAN_BLOCK,), (counts, np.int64(tiles), counts[tiles:]))
            total = int(counts[tiles].get())  # the one host sync
        out = {name: cupy.empty((total, *a.shape[1:]), dtype=a.dtype)
               for name, a in fields.items()}  # fmt: skip
        idx = cupy.empty(total, dtype=cupy.int64) if indices else None
        if total:
            src = {name: cupy.ascontiguousarray(a) for name, a in fields.items()}
            table = _columns(src, out)
            d_table = cupy.asarray(table)
            scatter = k.module.get_function(names["scatter"])
            grid = (tiles, len(table) + (1 if indices else 0))  # a block per tile and column
            scatter(grid, (spec.block,), (np.int64(n), words, counts, d_table,
                                          np.int32(len(table)), ptr_or_null(idx),
                                          np.int64(index_base)))
            # the sources (contiguous copies, the table) must live until the scatter has run
            cupy.cuda.get_current_stream().synchronize()
        if indices:
            out["indices"] = idx
        return out
