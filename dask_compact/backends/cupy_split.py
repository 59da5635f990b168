"""Stable split of one CuPy array by a predicate (:func:`dask_compact.partition` on the GPU).

The compaction module's exact-size passes without look-back (``cupy_launchers.SinglePass``'s
"prefix" mode): ``dcx_count`` leaves every tile's count, ``dcx_tile_scan`` turns them into
exclusive tile prefixes and the total, then ``dcx_partition`` (``kernels/partition.cu``)
writes every element of a tile at its place: the selected ones at the tile's prefix onward,
the others after the total. The output has the input's length, so nothing waits for the
count: the split point comes back as a device scalar read once at the end. A predicate the
fused kernels cannot run goes through its mask (the plan's mask path), as for compaction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..predicate.core import Predicate
from .cupy_backend import _plan  # the compaction's plan: the fused kernel or the mask path
from .cupy_device import NULL, ptr_or_null
from .cupy_launchers import tile_words
from .cupy_tuning import SCAN_BLOCK

__all__ = ["split_chunk"]


def split_chunk(a: Any, pred: Predicate, output: str, index_base: int) -> tuple[Any, int]:
    """Dispatch entry (see dask_compact.dispatch.split_chunk): ``(out, k)`` with ``out`` the
    partitioned values, int64 global indices, or both (a tuple), and ``k`` the split point."""
    import cupy

    a = cupy.ascontiguousarray(a.reshape(-1))
    n = int(a.size)
    with cupy.cuda.Device(a.device.id):
        values = cupy.empty(n, dtype=a.dtype) if output != "indices" else None
        idx = cupy.empty(n, dtype=cupy.int64) if output != "values" else None
        k = 0
        if n:
            plan = _plan(a, pred, None, output, "single-pass")
            kernels, tiles, nb = plan.kernels, plan.tiles, np.int64(n)
            block = plan.spec.tuning.block
            ws = tile_words("single-pass", tiles, exact=True)
            kernels["count"]((tiles,), (block,),
                             (plan.flat, ptr_or_null(plan.mask), nb, ws.status, NULL)
                             + plan.params)
            kernels["scan"]((1,), (SCAN_BLOCK,), (ws.status, np.int64(tiles), ws.count))
            kernels["partition"](
                (tiles,), (block,),
                (plan.flat, ptr_or_null(plan.mask), nb, np.int64(index_base),
                 ptr_or_null(values), ptr_or_null(idx), ws.status, ws.count) + plan.params,
                shared_mem=plan.spec.smem_bytes(output))
            k = int(ws.count.get()[0])
    out = (values, idx) if output == "both" else values if output == "values" else idx
    return out, k
