"""Stable split of one CuPy array by a predicate (:func:`dask_compact.partition` on the GPU).

Routes, chosen by the output (measured on one H100, 2^28 float32, alternating runs:
``benchmarks/results/2026-11-26_h100_d008ed4_partition_ab.md``) and, for values, by what the
predicate selected last (``cupy_tuning.SPLIT_ROUTE``):

* values (and both), counted first: the compaction module's exact-size passes without
  look-back (``cupy_launchers.SinglePass``'s "prefix" mode): ``dcx_count`` leaves every
  tile's count, ``dcx_tile_scan`` turns them into exclusive tile prefixes and the total, then
  ``dcx_partition`` (``kernels/partition.cu``) stages each tile permuted in shared memory and
  writes its selected elements at the tile's prefix onward and the others after the total,
  coalesced. The input is read twice: 3n elements moved at every fraction. 1.24-1.26 ms at
  every p, against 1.40-1.42 ms through the records' split.
* values (and both), one pass, once the predicate's last call selected at least
  ``SPLIT_ONE_PASS_FROM`` (0.65) of its elements: ``dcx_partition_lookback`` takes each
  tile's selected prefix by decoupled look-back and writes its others from the end of the
  output backwards (their place needs the total, known only at the end), then
  ``dcx_reverse_tail`` reverses ``out[k:]`` in place, k read on the device: 2n + 2(n-k)
  elements moved, fewer than 3n when more than half is selected; the look-back's cost moves
  the crossover to about 0.65 (one H100, 2^28 float32: 1.07 ms against 1.35 counted at
  p = .95, 1.47 against 1.26 at p = .5).
* indices alone: the records' passes with the array as the one field: the flags pass (one
  ballot word per 32 elements, tile counts and warp offsets), the tile-count scan, then
  ``dcx_rec_split`` writes every element's index at its place from the ballot words alone,
  without reading the input again: 1.39-1.46 ms, against 1.63 ms through dcx_partition.

The output has the input's length, so nothing waits for the count: the split point comes back
as a device scalar read once at the end. A predicate the fused kernels cannot run goes through
its mask (the plan's mask path; in the records' route, a boolean field), always counted first
there (a mask has no predicate object to remember its fraction on).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..predicate.core import Predicate
from ..predicate.fields import record_predicate
from . import cupy_tuning
from .cupy_device import NULL, contiguous, ptr_or_null
from .cupy_exact import make_plan  # the compaction's plan: the fused kernel or the mask path
from .cupy_launchers import Plan, tile_words
from .cupy_ready import learn, learned
from .cupy_records import _Pass
from .cupy_records_common import column_table, upload_table
from .cupy_tuning import COPY_BLOCK, COPY_MAX_GRID, REVERSE_ITEMS, SCAN_BLOCK, SPLIT_ROUTES

__all__ = ["split_chunk"]


def split_chunk(a: Any, pred: Predicate, output: str, index_base: int) -> tuple[Any, int]:
    """Dispatch entry (see dask_compact.dispatch.split_chunk): ``(out, k)`` with ``out`` the
    partitioned values, int64 global indices, or both (a tuple), and ``k`` the split point."""
    import cupy

    chunk, a = a, contiguous(a).reshape(-1)
    n = int(a.size)
    with cupy.cuda.Device(a.device.id):
        values = cupy.empty(n, dtype=a.dtype) if output != "indices" else None
        idx = cupy.empty(n, dtype=cupy.int64) if output != "values" else None
        k = 0
        if n:
            # the mask path's mask on the chunk as given (a callable may broadcast constants
            # against its trailing axes), then flat like the chunk
            mask = None if pred.expr is not None else cupy.ascontiguousarray(
                pred.mask(chunk, cupy).reshape(-1))
            split = _indices_by_records if values is None else _by_tiles
            k = split(a, pred, mask, output, values, idx, index_base)
    out = (values, idx) if output == "both" else values if output == "values" else idx
    return out, k


def _by_tiles(a: Any, pred: Predicate, mask: Any, output: str, values: Any, idx: Any,
              index_base: int) -> int:
    """The values route (see the module's docstring): counted first, or one pass; the split
    point. ``mask``: the mask path's, or None for a fused predicate."""
    plan = make_plan(a, pred, mask, output, "single-pass")
    kernels, tiles, nb = plan.kernels, plan.tiles, np.int64(plan.n)
    block, smem = plan.spec.tuning.block, plan.spec.smem_bytes(output)
    args = (plan.flat, ptr_or_null(plan.mask), nb, np.int64(index_base), ptr_or_null(values),
            ptr_or_null(idx))
    if one_pass(plan):
        # fresh tile words: the look-back's status (zeroed) and the tile counter
        ws = tile_words("single-pass", tiles, exact=False)
        kernels["partition_lb"]((tiles,), (block,),
                                args + (ws.status, ws.count, ws.tiles) + plan.params,
                                shared_mem=smem)
        grid = max(1, min(COPY_MAX_GRID, -(-(plan.n // 2) // (COPY_BLOCK * REVERSE_ITEMS))))
        kernels["reverse"]((grid,), (COPY_BLOCK,),
                           (ptr_or_null(values), ptr_or_null(idx), nb, ws.count))
    else:
        ws = tile_words("single-pass", tiles, exact=True)
        kernels["count"]((tiles,), (block,),
                         (plan.flat, ptr_or_null(plan.mask), nb, ws.status, NULL) + plan.params)
        kernels["scan"]((1,), (SCAN_BLOCK,), (ws.status, np.int64(tiles), ws.count))
        kernels["partition"]((tiles,), (block,), args + (ws.status, ws.count) + plan.params,
                             shared_mem=smem)
    k = int(ws.count.get()[0])
    learn(plan.memo, plan.spec.dtype, "split", k, plan.n)
    return k


def one_pass(plan: Plan) -> bool:
    """Whether this split takes the one-pass route (``cupy_tuning.SPLIT_ROUTE``, read now)."""
    route = cupy_tuning.SPLIT_ROUTE
    if route not in SPLIT_ROUTES:
        raise ValueError(f"SPLIT_ROUTE must be one of {', '.join(SPLIT_ROUTES)}; got {route!r}")
    if route != "auto":
        return route == "one-pass"
    frac = learned(plan.memo, plan.spec.dtype, "split")
    return frac is not None and frac >= cupy_tuning.SPLIT_ONE_PASS_FROM


def _indices_by_records(a: Any, pred: Predicate, mask: Any, output: str, values: Any,
                        idx: Any, index_base: int) -> int:
    """The records' flags pass and tile scan, then dcx_rec_split with the index column only
    (it reads the ballot words, not the input); the split point."""
    import cupy

    if pred.expr is not None:
        fields = {"x": a}
        rpred = record_predicate(pred, ("x",))
    else:  # the mask path: the callable's mask is the one field the predicate reads
        fields = {"x": a, "m": mask}
        rpred = record_predicate("m", ("x", "m"))
    passes = _Pass(fields, rpred, a.size, spans=False)  # no copy: the split reads the words
    d_table = upload_table(column_table({}, {}), cupy.cuda.get_current_stream())
    kernel = passes.module.kernel("split")
    kernel((passes.tiles, 1), (passes.spec.block,), (
        np.int64(a.size), passes.words, passes.counts, passes.warp_offsets, d_table,
        np.int32(0), idx, np.int64(index_base)))  # fmt: skip
    return int(passes.total.get()[0])
