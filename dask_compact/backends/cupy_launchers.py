"""One launcher per algorithm, each owning its typed workspace: what a chunk's compaction
queues on the current stream, up to the device count (``count``) and after it (``main``).

Workspaces (device memory beside the output, O(n / 1024) words: the memory rule of
docs/design.md):

* :class:`TileWords` (single-pass, hybrid): the look-back status word of every tile, the
  device count, the hybrid's atomic output counter and the counter that hands tiles to the
  persistent blocks, in one allocation zeroed by one memset.
* :class:`ThreePassWork`: the predicate bitmask (n/8 bytes), the group counts and offsets,
  the scan's status words and the count.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .cupy_device import NO_CAP, NULL, memset0, ptr_or_null
from .cupy_modules import OutputKernels, resident_blocks
from .cupy_source import ModuleSpec
from .cupy_tuning import SCAN_BLOCK, TP_BLOCK, TP_GROUP, TP_SCAN_BLOCK, TP_SCAN_ITEMS

__all__ = ["Plan", "TileWords", "ThreePassWork", "tile_words", "LAUNCHERS", "with_count"]


@dataclass
class Plan:
    """A flattened chunk and the compiled module that compacts it."""

    flat: Any  # 1-D contiguous cupy array (the values)
    mask: Any  # 1-D contiguous cupy bool array, or None (fused predicate)
    params: tuple  # NumPy scalars, kernel arguments of the functor
    spec: ModuleSpec
    output: str
    exact_mode: str = "prefix"  # single-pass exact path (cupy_tuning.EXACT_MODES)
    _kernels: OutputKernels | None = None
    memo: dict | None = None  # the predicate's memo (fused path): what earlier calls saw
    # the predicate checks each call's data first (negative integer exponents): no ready call
    checked: bool = False

    @property
    def n(self) -> int:
        return int(self.flat.size)

    @property
    def tiles(self) -> int:
        return -(-self.n // self.spec.tuning.tile)

    @property
    def kernels(self) -> OutputKernels:
        """role -> kernel on the current device (looked up once per plan; each group's
        module built at its first role's use)."""
        if self._kernels is None:
            self._kernels = OutputKernels(self.spec, self.output)
        return self._kernels


@dataclass(frozen=True)
class TileWords:
    """Words of the tile kernels, one allocation (``words``) zeroed by one memset."""

    words: Any
    status: Any  # one look-back status word per tile (single-pass), else None
    count: Any  # the device count
    counter: Any  # the hybrid's atomic output counter: the count itself outside the exact path
    tiles: Any  # hands out tiles to the persistent blocks


@dataclass(frozen=True)
class ThreePassWork:
    bitmask: Any  # the predicate's ballots, 32 words per group
    group_counts: Any
    offsets: Any  # each group's output offset (the scan's)
    status: Any  # the scan's look-back words
    count: Any


_reused = threading.local()


def tile_words(algorithm: str, tiles: int, exact: bool, reuse: bool = False) -> TileWords:
    """Zeroed tile words for a launch of ``tiles`` tiles.

    ``reuse``: this thread's words for (device, stream, algorithm, tiles), zeroed again: for a
    call whose words die with it. Stream order keeps a call's memset after the previous call's
    kernels; an allocation and three slices cost more than the kernels at 2^20 elements."""
    import cupy

    if reuse:
        key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, algorithm, tiles,
               exact)
        cache = getattr(_reused, "by_key", None)
        if cache is None:
            cache = _reused.by_key = {}
        ws = cache.get(key)
        if ws is None:
            if len(cache) >= 16:
                cache.clear()
            ws = cache[key] = tile_words(algorithm, tiles, exact)
        else:
            memset0(ws.words)
        return ws
    if algorithm == "single-pass":
        words = cupy.empty(tiles + 2, dtype=np.uint64)
        memset0(words)
        count = words[tiles : tiles + 1]
        return TileWords(words, words[:tiles], count, count, words[tiles + 1 :])
    words = cupy.empty(3, dtype=np.uint64)
    memset0(words)
    # exact path: the count kernel totals into "count", the hybrid kernel claims from "counter"
    counter = words[1:2] if exact else words[0:1]
    return TileWords(words, None, words[0:1], counter, words[2:3])


def with_count(algorithm: str, ws: TileWords, count: Any) -> TileWords:
    """``ws`` with the caller's 1-word ``count`` as where the total lands (compact_into): the
    single-pass kernel's last tile stores it there; the hybrid claims places from it, so it is
    zeroed first, in stream order."""
    if algorithm == "single-pass":
        return replace(ws, count=count)
    memset0(count)
    return replace(ws, count=count, counter=count)


class SinglePass:
    """Order kept: count kernel (tile aggregates + total) then the look-back kernel, which
    finds every aggregate published; or, ``exact_mode == "prefix"``, count -> one-block scan
    of the tile counts -> scatter at known prefixes. Alone (compact_into): the look-back
    kernel publishes as it goes."""

    def count(self, plan: Plan, reuse: bool = False) -> TileWords:
        k, nb, tiles = plan.kernels, np.int64(plan.n), plan.tiles
        ws = tile_words("single-pass", tiles, exact=True, reuse=reuse)
        block = plan.spec.tuning.block
        if plan.exact_mode == "prefix":  # tile counts -> exclusive tile prefixes + the total
            k["count"]((tiles,), (block,),
                       (plan.flat, ptr_or_null(plan.mask), nb, ws.status, NULL) + plan.params)
            k["scan"]((1,), (SCAN_BLOCK,), (ws.status, np.int64(tiles), ws.count))
            return ws
        k["count"]((tiles,), (block,),
                   (plan.flat, ptr_or_null(plan.mask), nb, ws.status, ws.count) + plan.params)
        return ws

    def main(self, plan: Plan, index_base: int, out_vals: Any, out_idx: Any, ws: TileWords,
             exact: bool = False, cap: Any = NO_CAP, start: Any = None) -> None:
        """The compaction; ``cap`` / ``start``: the look-back kernel's bound on the outputs
        and, for a chunk of a chained run (cupy_exact._run_chained), the device word of
        its start in the run's outputs (kernels/single_pass.cu, d_start: the "chain" role;
        ``ws.count`` then receives the next chunk's start)."""
        k, spec, tiles = plan.kernels, plan.spec, plan.tiles
        smem = spec.smem_bytes(plan.output)
        args = _tile_args(plan, index_base, out_vals, out_idx)
        if exact and plan.exact_mode == "prefix":  # tile prefixes known: no look-back
            grid = min(tiles, resident_blocks(k["prefix"], spec.tuning.block, smem))
            k["prefix"]((grid,), (spec.tuning.block,), args + (ws.status, ws.tiles) + plan.params,
                        shared_mem=smem)
            return
        kernel = k["main" if start is None else "chain"]
        grid = min(tiles, resident_blocks(kernel, spec.tuning.block, smem))
        kernel((grid,), (spec.tuning.block,),
               args + (ws.status, ws.count, ws.tiles, cap, ptr_or_null(start)) + plan.params,
               shared_mem=smem)


class Hybrid:
    """Order between tiles not kept: count kernel, then one atomic per tile claims its place."""

    def count(self, plan: Plan, reuse: bool = False) -> TileWords:
        ws = tile_words("hybrid", plan.tiles, exact=True, reuse=reuse)
        plan.kernels["count"](
            (plan.tiles,), (plan.spec.tuning.block,),
            (plan.flat, ptr_or_null(plan.mask), np.int64(plan.n), NULL, ws.count) + plan.params,
        )
        return ws

    def main(self, plan: Plan, index_base: int, out_vals: Any, out_idx: Any, ws: TileWords,
             exact: bool = False) -> None:
        k, spec = plan.kernels, plan.spec
        smem = spec.smem_bytes(plan.output)
        grid = min(plan.tiles, resident_blocks(k["main"], spec.tuning.block, smem))
        k["main"]((grid,), (spec.tuning.block,),
                  _tile_args(plan, index_base, out_vals, out_idx) + (ws.counter, ws.tiles)
                  + plan.params, shared_mem=smem)


class ThreePass:
    """The published algorithm: predicate bitmask + group counts -> scan (offsets, total) ->
    scatter from the bitmask. Its count is always a pass of its own."""

    def count(self, plan: Plan, reuse: bool = False) -> ThreePassWork:
        import cupy

        k, n = plan.kernels, plan.n
        ngroups = -(-n // TP_GROUP)
        scan_tiles = -(-ngroups // (TP_SCAN_BLOCK * TP_SCAN_ITEMS))
        words = cupy.empty(scan_tiles + 1, dtype=np.uint64)
        memset0(words)
        ws = ThreePassWork(
            bitmask=cupy.empty(ngroups * 32, dtype=np.uint32),
            group_counts=cupy.empty(ngroups, dtype=np.uint32),
            offsets=cupy.empty(ngroups, dtype=np.uint64),
            status=words[:scan_tiles], count=words[scan_tiles:],
        )
        k["flags"]((-(-ngroups // (TP_BLOCK // 32)),), (TP_BLOCK,),
                   (plan.flat, ptr_or_null(plan.mask), np.int64(n), ws.bitmask, ws.group_counts)
                   + plan.params)
        k["scan"]((scan_tiles,), (TP_SCAN_BLOCK,),
                  (ws.group_counts, np.int64(ngroups), ws.offsets, ws.status, ws.count))
        return ws

    def main(self, plan: Plan, index_base: int, out_vals: Any, out_idx: Any,
             ws: ThreePassWork, exact: bool = False) -> None:
        ngroups = -(-plan.n // TP_GROUP)
        plan.kernels["scatter"](
            (-(-ngroups // (TP_BLOCK // 32)),), (TP_BLOCK,),
            (plan.flat, np.int64(plan.n), np.int64(index_base), ws.bitmask, ws.offsets,
             ptr_or_null(out_vals), ptr_or_null(out_idx)),
        )


def _tile_args(plan: Plan, index_base: int, out_vals: Any, out_idx: Any) -> tuple:
    return (plan.flat, ptr_or_null(plan.mask), np.int64(plan.n), np.int64(index_base),
            ptr_or_null(out_vals), ptr_or_null(out_idx))


LAUNCHERS: dict[str, Any] = {
    "single-pass": SinglePass(), "hybrid": Hybrid(), "three-pass": ThreePass(),
}
