"""Stable split of one CuPy array by a predicate (:func:`dask_compact.partition` on the GPU).

The record passes of ``kernels/records.cu`` with the array as the one field: the flags pass
(the predicate, one ballot word per 32 elements, tile counts and warp offsets), the tile-count
scan, then ``dcx_rec_split``, which writes every element at its place in the output (the
selected ones first, in order, then the others, in order) and, when asked, its global index.
The output has the input's length, so nothing waits for the count: the split point comes back
as a device scalar read once at the end.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..predicate.core import Predicate
from ..predicate.fields import record_predicate
from .cupy_device import ptr_or_null
from .cupy_records import _columns, _Pass, _upload

__all__ = ["split_chunk"]


def split_chunk(a: Any, pred: Predicate, output: str, index_base: int) -> tuple[Any, int]:
    """Dispatch entry (see dask_compact.dispatch.split_chunk): ``(out, k)`` with ``out`` the
    partitioned values, int64 global indices, or both (a tuple), and ``k`` the split point."""
    import cupy

    a = cupy.ascontiguousarray(a.reshape(-1))
    n = int(a.size)
    with cupy.cuda.Device(a.device.id):
        stream = cupy.cuda.get_current_stream()
        if pred.expr is not None:
            fields = {"x": a}
            rpred = record_predicate(pred, ("x",))
        else:  # the mask path: the callable's mask is the one field the predicate reads
            fields = {"x": a, "m": cupy.ascontiguousarray(pred.mask(a, cupy))}
            rpred = record_predicate("m", ("x", "m"))
        passes = _Pass(fields, rpred, n)
        values = cupy.empty(n, dtype=a.dtype) if output != "indices" else None
        idx = cupy.empty(n, dtype=cupy.int64) if output != "values" else None
        if n:
            src = {"x": a} if values is not None else {}
            table = _columns(src, {"x": values} if values is not None else {})
            d_table = _upload(table, stream)
            kernel = passes.module.get_function(passes.names["split"])
            grid = (passes.tiles, len(table) + (1 if idx is not None else 0))
            kernel(grid, (passes.spec.block,), (
                np.int64(n), passes.words, passes.counts, passes.warp_offsets, d_table,
                np.int32(len(table)), ptr_or_null(idx), np.int64(index_base)))  # fmt: skip
        k = int(passes.total.get()[0]) if n else 0
    out = (values, idx) if output == "both" else values if output == "values" else idx
    return out, k
