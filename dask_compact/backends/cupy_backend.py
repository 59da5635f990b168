"""CuPy chunk backend: the thin launch layer over the CUDA kernels in ``kernels/``.

The kernels are templates (element type, generated predicate functor, output, tuning); this
module picks the instantiation, compiles it once per (device, predicate structure + dtype,
output, algorithm, tuning) with ``cupy.RawModule(code=..., name_expressions=[...])``, and
launches it on CuPy's current stream. Nothing is compiled at import time, and importing this
module does not import CuPy (the CI machine has none; the source builders here are used by the
compile tests).

Chunk flow (exact-size result, as the dispatch contract and the memory rule of docs/design.md,
Memory, demand: extra device memory per chunk at most the output plus O(n/1024)):

* ``single-pass``, ``EXACT_MODE == "lookback"`` (the default, with the look-back schedule of
  ``SINGLE_PASS_VARIANT``): count kernel (tile aggregates + total) -> read the count ->
  allocate -> the single-pass look-back kernel, which finds every aggregate already published.
  ``EXACT_MODE == "prefix"``: count kernel (tile counts) -> one-block scan of
  the tile counts (exclusive tile prefixes + total) -> read the one count -> allocate the output
  -> the scatter kernel (tile code of the hybrid, each tile's place read from its prefix: order
  kept, no look-back).
* ``hybrid``: count kernel -> read the count -> allocate -> atomic-offset kernel (unordered).
* ``three-pass`` (the published algorithm): predicate bitmask + group counts -> scan (total)
  -> read the count -> allocate -> scatter from the bitmask.

:func:`compact_into` is the internal entry that writes into preallocated outputs of capacity
``n`` and returns the device count without any host synchronisation (benchmarks, tests with
poisoned buffers). Only ``compact``/``compact_masked`` read a count (one per chunk).
"""

from __future__ import annotations

import importlib.resources
import re
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..codegen.cuda_functor import CodegenUnsupported, CudaFunctor, ctype, generate_functor
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow

__all__ = [
    "ALGORITHMS",
    "Tuning",
    "TUNING",
    "SINGLE_PASS_TUNING",
    "tuning_for",
    "ModuleSpec",
    "module_source",
    "compact",
    "compact_masked",
    "compact_into",
    "compact_into_public",
    "resolve_algorithm",
]

ALGORITHMS = ("single-pass", "three-pass", "hybrid")
OUTPUT_CODES = {"values": 1, "indices": 2, "both": 3}

# Kernel files of each algorithm (one module = generated functor + these, includes inlined).
_FILES = {
    "single-pass": ("count.cu", "single_pass.cu", "scatter.cu"),
    "hybrid": ("count.cu", "hybrid.cu"),
    "three-pass": ("three_pass.cu",),
}
# NVRTC options (C++17 is the default of NVRTC and nvcc 13). CuPy appends -ftz=true;
# kernels/dcx_types.cuh keeps float32 predicates exact regardless. --fmad=false: NumPy rounds
# every operation, so a*b+c must not become one FMA.
NVRTC_OPTIONS = ("--fmad=false",)

# Three-pass constants, as in kernels/three_pass.cu.
TP_GROUP = 1024
TP_BLOCK = 256
TP_SCAN_BLOCK = 256
TP_SCAN_ITEMS = 16

# Single-pass look-back schedule of compact_into (and of the "lookback" exact path), the
# VARIANT of dcx_single_pass: "classic" (compact_tiles) or "early" (compact_tiles_early:
# aggregate published as soon as a tile's loads arrive, look-back overlapped with the next
# tile's loads). Both stay selectable (variant=...) so one benchmark compares them.
SINGLE_PASS_VARIANTS = {"classic": 0, "early": 1}
# Default schedule per itemsize, as measured on the H100 at 2^28 (benchmarks/results/NOTES-gpu.md,
# run 2026-11-21_h100_5971f72-perf): "early" is 18-23% faster for float32 and float64 at every p;
# for int8 it is 13% slower at p=0.05 (ptxas register cap, fewer blocks per SM) and 13% faster
# at p=0.95, so 1-byte types keep "classic"; 2- and 16-byte types were not measured (classic).
SINGLE_PASS_VARIANT: dict[int, str] = {
    1: "classic", 2: "classic", 4: "early", 8: "early", 16: "classic",
}  # fmt: skip
# Exact-size path of algorithm="single-pass" (compact / compact_masked): "prefix" (count ->
# tile-prefix scan -> read the total -> allocate -> scatter at known prefixes) or "lookback"
# (count -> read the total -> allocate -> single-pass look-back kernel). "prefix" measured
# faster only at p=0.95 (float32 1.230 vs 1.343 ms) and 1-8% slower at p <= 0.5, so the
# default stays "lookback" (see NOTES-gpu.md for the suspected cost of the one-block scan).
EXACT_MODES = ("prefix", "lookback")
EXACT_MODE = "lookback"
# dcx_tile_scan: one block of SCAN_BLOCK threads, SCAN_ITEMS tile counts per thread per round.
SCAN_BLOCK = 1024
SCAN_ITEMS = 8


@dataclass(frozen=True)
class Tuning:
    """Tile shape of the single-pass and hybrid kernels: BLOCK threads x ITEMS elements each."""

    block: int
    items: int

    @property
    def tile(self) -> int:
        return self.block * self.items


# Per itemsize: 8 vectors of 16 bytes per thread for 4-byte and wider types (128 bytes in flight
# per thread), 2 or 4 vectors for the narrow ones (ITEMS <= 32: one 32-bit flag word per thread).
# Measured on an H100 (benchmarks/results/NOTES-gpu.md); benchmarks may override entries.
TUNING: dict[int, Tuning] = {
    1: Tuning(256, 32),
    2: Tuning(256, 32),
    4: Tuning(256, 32),
    8: Tuning(256, 16),
    16: Tuning(256, 8),
}
# The stable single-pass kernel pays one look-back per tile, so it likes larger tiles than the
# hybrid (H100 sweep, 2^28, NOTES-gpu.md): float32 512x32 was 8% / 4% faster than 256x32 at
# p=0.05 / 0.5 (2% slower at 0.95); float64 256x32 was 10-13% faster than 256x16 at every p.
# The hybrid stays at 256x32 / 256x16, where it measured fastest.
SINGLE_PASS_TUNING: dict[int, Tuning] = {4: Tuning(512, 32), 8: Tuning(256, 32)}


def tuning_for(algorithm: str, itemsize: int) -> Tuning:
    """Tile shape of an algorithm for an element size (one module per shape)."""
    if algorithm == "single-pass" and itemsize in SINGLE_PASS_TUNING:
        return SINGLE_PASS_TUNING[itemsize]
    return TUNING[itemsize]


def resolve_algorithm(algorithm: str, stable: bool) -> str:
    """``auto`` -> single-pass (stable) or hybrid (unstable); hybrid with stable=True is refused."""
    if algorithm == "auto":
        return "single-pass" if stable else "hybrid"
    if algorithm not in ALGORITHMS:
        raise ValueError(
            f"algorithm must be one of auto, {', '.join(ALGORITHMS)}; got {algorithm!r}"
        )
    if algorithm == "hybrid" and stable:
        raise ValueError("algorithm='hybrid' does not keep the order; pass stable=False to use it")
    return algorithm


# ----------------------------------------------------------------------------- sources --------


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_.]+)"\s*$', re.M)
_text_cache: dict[str, str] = {}


def _kernel_text(name: str) -> str:
    """A file of the installed ``dask_compact.kernels`` package (never found through __file__)."""
    if name not in _text_cache:
        _text_cache[name] = (
            importlib.resources.files("dask_compact.kernels").joinpath(name).read_text("utf-8")
        )
    return _text_cache[name]


def _inline(name: str, seen: set[str]) -> str:
    """``name`` with its local #includes inlined once each (so the source alone is the cache key
    of CuPy's on-disk kernel cache, and no include path is needed)."""
    if name in seen:
        return ""
    seen.add(name)
    text = _kernel_text(name)
    return _INCLUDE.sub(lambda m: _inline(m.group(1), seen), text).replace("#pragma once", "")


@dataclass(frozen=True)
class ModuleSpec:
    """Everything that selects one compiled module: one per (predicate structure + dtype,
    algorithm, tuning), holding the kernels of all three outputs."""

    dtype: np.dtype
    algorithm: str  # single-pass | three-pass | hybrid
    functor: CudaFunctor | None  # None: mask path (flags from a bool array)
    tuning: Tuning
    variant: str = "classic"  # single-pass look-back schedule (SINGLE_PASS_VARIANTS)

    def __hash__(self) -> int:
        # Looked up on every launch: hashing the functor (its source text) once is enough.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.dtype, self.algorithm, self.functor, self.tuning, self.variant))
            object.__setattr__(self, "_hash", h)
        return h

    @property
    def src(self) -> int:
        return 0 if self.functor is not None else 1

    @property
    def pred_name(self) -> str:
        return self.functor.name if self.functor is not None else "dcx::MaskPred"

    def _targs(self) -> str:
        return "".join(", " + c for c in (self.functor.param_ctypes if self.functor else ()))

    def names(self, output: str) -> dict[str, str]:
        """Kernel role -> name expression (template instantiation) for one output."""
        t = ctype(self.dtype)
        out = OUTPUT_CODES[output]
        b, i = self.tuning.block, self.tuning.items
        p, s, pa = self.pred_name, self.src, self._targs()
        if self.algorithm == "three-pass":
            return {
                "flags": f"dcx_tp_flags<{t}, {p}, {s}{pa}>",
                "scan": f"dcx_tp_scan<{TP_SCAN_BLOCK}, {TP_SCAN_ITEMS}>",
                "scatter": f"dcx_tp_scatter<{t}, {out}>",
            }
        if self.algorithm == "single-pass":
            v = SINGLE_PASS_VARIANTS[self.variant]
            return {
                "count": f"dcx_count<{t}, {p}, {s}, {b}, {i}{pa}>",
                "scan": f"dcx_tile_scan<{SCAN_BLOCK}, {SCAN_ITEMS}>",
                "main": f"dcx_single_pass<{t}, {p}, {out}, {s}, {b}, {i}, {v}{pa}>",
                "scatter": f"dcx_scatter<{t}, {p}, {out}, {s}, {b}, {i}{pa}>",
            }
        return {
            "count": f"dcx_count<{t}, {p}, {s}, {b}, {i}{pa}>",
            "main": f"dcx_hybrid<{t}, {p}, {out}, {s}, {b}, {i}{pa}>",
        }

    def all_names(self) -> list[str]:
        """Every instantiation of the module (all outputs), without repeats."""
        names: list[str] = []
        for output in OUTPUT_CODES:
            names += [n for n in self.names(output).values() if n not in names]
        return names

    def smem_bytes(self, output: str) -> int:
        out = OUTPUT_CODES[output]
        tile = self.tuning.tile
        return (tile * self.dtype.itemsize if out & 1 else 0) + (tile * 2 if out & 2 else 0)


def module_source(spec: ModuleSpec) -> str:
    """The complete CUDA source of one module: headers, the generated functor, the kernels."""
    seen: set[str] = set()
    parts = ["// dask_compact: generated module source\n", _inline("npy_ops.cuh", seen)]
    parts.append(_inline("compact_warp.cuh", seen))
    if spec.functor is not None:
        parts.append(spec.functor.source)
    for f in _FILES[spec.algorithm]:
        parts.append(_inline(f, seen))
    return "\n".join(parts)


# ----------------------------------------------------------------------------- modules --------


class _Compiled:
    """One RawModule and its kernels, on one device."""

    def __init__(self, spec: ModuleSpec) -> None:
        import cupy

        self.spec = spec
        self.module = cupy.RawModule(
            code=module_source(spec), options=NVRTC_OPTIONS, name_expressions=spec.all_names()
        )
        self._kernels: dict[str, Any] = {}

    def kernels(self, output: str) -> dict[str, Any]:
        """role -> RawKernel for one output (shared-memory limit raised where needed)."""
        out = {}
        for role, expr in self.spec.names(output).items():
            k = self._kernels.get(expr)
            if k is None:
                k = self.module.get_function(expr)
                smem = self.spec.smem_bytes(output)
                if role in ("main", "scatter") and smem > 0:
                    # static shared memory counts against the same 48 KB default limit
                    k.max_dynamic_shared_size_bytes = smem
                self._kernels[expr] = k
            out[role] = k
        return out


# (device, spec) -> its module; bounded (dask_compact.cache): each holds compiled kernels.
_modules: BoundedCache[tuple, _Compiled] = BoundedCache("cupy modules")


def _compiled(spec: ModuleSpec) -> _Compiled:
    import cupy

    # dask's threaded scheduler may ask for the same module from many threads: built once
    return _modules.get_or_build((cupy.cuda.Device().id, spec), lambda: _Compiled(spec))


# ----------------------------------------------------------------------------- launches -------

_NULL = np.uint64(0)


def _memset0(arr: Any) -> None:
    import cupy

    cupy.cuda.runtime.memsetAsync(arr.data.ptr, 0, arr.nbytes, cupy.cuda.get_current_stream().ptr)


def _ptr(a: Any) -> Any:
    return _NULL if a is None else a


@dataclass
class _Plan:
    """A flattened chunk and the compiled module that compacts it."""

    flat: Any  # 1-D contiguous cupy array (the values)
    mask: Any  # 1-D contiguous cupy bool array, or None (fused predicate)
    params: tuple  # NumPy scalars, kernel arguments of the functor
    spec: ModuleSpec
    output: str
    exact_mode: str = "prefix"  # single-pass exact path (EXACT_MODES)
    _kernels: dict[str, Any] | None = None
    memo: dict | None = None  # the predicate's memo (fused path): what earlier calls saw

    @property
    def n(self) -> int:
        return int(self.flat.size)

    @property
    def kernels(self) -> dict[str, Any]:
        """role -> kernel on the current device (looked up once per plan)."""
        if self._kernels is None:
            self._kernels = _compiled(self.spec).kernels(self.output)
        return self._kernels


_functors: BoundedCache[tuple, tuple] = BoundedCache("cuda functors")


def _typed_functor(expr: Any, dtype: np.dtype, pred: Predicate) -> tuple:
    """Typing and code generation once per (tree, dtype): both cost more than a launch."""

    def build() -> tuple:
        tp = pred.typed(dtype)
        return tp, generate_functor(tp)

    return _functors.get_or_build((expr, dtype), build)


# Keyed by the kernel object's id: a module evicted and a new kernel at the same address may
# get an old entry, which is harmless (any grid is correct, see below); bounded all the same.
_grid_cache: BoundedCache[tuple, int] = BoundedCache("grid sizes")


def _resident_blocks(kernel: Any, block: int, smem: int) -> int:
    """Blocks of the persistent tile kernels to launch: as many as fit on the device at once.

    More would only wait (tiles are taken from a counter, so any grid is correct); fewer would
    leave SMs idle.
    """
    import cupy

    dev = cupy.cuda.Device()
    key = (dev.id, id(kernel), block, smem)
    g = _grid_cache.get(key)
    if g is None:
        try:
            attrs = dev.attributes
            regs = max(32, int(getattr(kernel, "num_regs", 64)))
            per_sm = min(
                attrs["MaxThreadsPerMultiProcessor"] // block,
                attrs["MaxRegistersPerMultiprocessor"] // (block * ((regs + 7) // 8 * 8)),
                attrs["MaxSharedMemoryPerMultiprocessor"] // (smem + 1024 + 64),
                32,
            )
            g = max(1, per_sm) * attrs["MultiProcessorCount"]
        except Exception:  # unknown attributes: one block per tile (correct, less overlap)
            g = 1 << 30
        _grid_cache.put(key, g)
    return g


def _flatten(a: Any) -> Any:
    import cupy

    return cupy.ascontiguousarray(a).reshape(-1)


def _plan(
    a: Any, pred: Predicate | None, mask: Any, output: str, algorithm: str,
    variant: str | None = None, exact_mode: str | None = None,
) -> _Plan:
    """Choose the fused kernel or, failing that, the mask path (logged on the predicate path)."""
    import cupy

    exact_mode = EXACT_MODE if exact_mode is None else exact_mode
    if variant is not None and variant not in SINGLE_PASS_VARIANTS:
        raise ValueError(
            f"variant must be one of {', '.join(SINGLE_PASS_VARIANTS)}; got {variant!r}"
        )
    if exact_mode not in EXACT_MODES:
        raise ValueError(f"exact_mode must be one of {', '.join(EXACT_MODES)}; got {exact_mode!r}")

    flat = _flatten(a)
    dtype = np.dtype(flat.dtype)
    if algorithm != "single-pass":
        variant = "classic"  # one module per (predicate, dtype, algorithm, tuning) elsewhere
    elif variant is None:
        variant = SINGLE_PASS_VARIANT.get(dtype.itemsize, "classic")
    ctype(dtype)  # raises for dtypes without a device type
    tuning = tuning_for(algorithm, dtype.itemsize)
    if mask is None:
        assert pred is not None
        if pred.path == "fused":
            # What the plan takes from the predicate, kept on it (see Predicate.memo): a
            # repeated call with the same predicate object skips typing, binding and the
            # module spec. None: the fused kernel cannot run it (the mask path below).
            key = ("cupy", dtype, algorithm, variant, tuning)
            if key not in pred.memo:
                try:
                    tp, functor = _typed_functor(pred.expr, dtype, pred)
                    pred.memo[key] = (tp.bind(pred.params),
                                      ModuleSpec(dtype, algorithm, functor, tuning, variant))
                except (CodegenUnsupported, ParamOverflow):
                    pred.memo[key] = None
            fused = pred.memo[key]
            if fused is not None:
                return _Plan(flat, None, fused[0], fused[1], output, exact_mode,
                             memo=pred.memo)
        mask = pred.mask(a, cupy)
    m = _flatten(cupy.asarray(mask))
    if m.dtype != np.bool_:
        m = m.astype(np.bool_)
    if m.size != flat.size:
        raise ValueError(f"mask of {m.size} elements for a chunk of {flat.size}")
    spec = ModuleSpec(dtype, algorithm, None, tuning, variant)
    return _Plan(flat, m, (), spec, output, exact_mode)


def _launch_main(
    plan: _Plan, index_base: int, out_vals: Any, out_idx: Any, ws: dict[str, Any],
    exact: bool = False,
) -> None:
    """The compaction kernel(s) proper, after the count (exact path) or alone (compact_into)."""
    spec, n = plan.spec, plan.n
    k = plan.kernels
    nb = np.int64(n)
    base = np.int64(index_base)
    if spec.algorithm == "three-pass":
        ngroups = -(-n // TP_GROUP)
        k["scatter"](
            (-(-ngroups // (TP_BLOCK // 32)),), (TP_BLOCK,),
            (plan.flat, nb, base, ws["bitmask"], ws["offsets"], _ptr(out_vals), _ptr(out_idx)),
        )
        return
    tiles = -(-n // spec.tuning.tile)
    smem = spec.smem_bytes(plan.output)
    grid = min(tiles, _resident_blocks(k["main"], spec.tuning.block, smem))
    args: tuple = (plan.flat, _ptr(plan.mask), nb, base, _ptr(out_vals), _ptr(out_idx))
    if spec.algorithm == "single-pass" and exact and plan.exact_mode == "prefix":
        # tile prefixes known (dcx_tile_scan): scatter without look-back
        grid = min(tiles, _resident_blocks(k["scatter"], spec.tuning.block, smem))
        args += (ws["status"], ws["tiles"])
        k["scatter"]((grid,), (spec.tuning.block,), args + plan.params, shared_mem=smem)
        return
    if spec.algorithm == "single-pass":
        args += (ws["status"], ws["count"])
    else:
        args += (ws["counter"],)
    args += (ws["tiles"],)
    k["main"]((grid,), (spec.tuning.block,), args + plan.params, shared_mem=smem)


def _launch_count(plan: _Plan, reuse: bool = False) -> dict[str, Any]:
    """Everything up to the device count: returns the workspace, ws["count"] holds the total.

    Workspace: O(n / tile) status words (single-pass), or the bitmask (n/8 bytes) and
    O(n/1024) group counts and offsets (three-pass).
    """
    import cupy

    spec, n = plan.spec, plan.n
    k = plan.kernels
    nb = np.int64(n)
    if spec.algorithm == "three-pass":
        ngroups = -(-n // TP_GROUP)
        scan_tiles = -(-ngroups // (TP_SCAN_BLOCK * TP_SCAN_ITEMS))
        words = cupy.empty(scan_tiles + 1, dtype=np.uint64)
        _memset0(words)
        ws = {
            "bitmask": cupy.empty(ngroups * 32, dtype=np.uint32),
            "group_counts": cupy.empty(ngroups, dtype=np.uint32),
            "offsets": cupy.empty(ngroups, dtype=np.uint64),
            "status": words[:scan_tiles],
            "count": words[scan_tiles:],
        }
        k["flags"](
            (-(-ngroups // (TP_BLOCK // 32)),), (TP_BLOCK,),
            (plan.flat, _ptr(plan.mask), nb, ws["bitmask"], ws["group_counts"]) + plan.params,
        )
        k["scan"](
            (scan_tiles,), (TP_SCAN_BLOCK,),
            (ws["group_counts"], np.int64(ngroups), ws["offsets"], ws["status"], ws["count"]),
        )
        return ws
    tiles = -(-n // spec.tuning.tile)
    ws = _tile_workspace(spec.algorithm, tiles, exact=True, reuse=reuse)
    if spec.algorithm == "single-pass" and plan.exact_mode == "prefix":
        # tile counts -> exclusive tile prefixes (in place) + the total
        k["count"](
            (tiles,), (spec.tuning.block,),
            (plan.flat, _ptr(plan.mask), nb, ws["status"], _NULL) + plan.params,
        )
        k["scan"]((1,), (SCAN_BLOCK,), (ws["status"], np.int64(tiles), ws["count"]))
        return ws
    status = ws["status"] if spec.algorithm == "single-pass" else _NULL
    k["count"](
        (tiles,), (spec.tuning.block,),
        (plan.flat, _ptr(plan.mask), nb, status, ws["count"]) + plan.params,
    )
    return ws


_workspaces = threading.local()


def _tile_workspace(algorithm: str, tiles: int, exact: bool, reuse: bool = False
                    ) -> dict[str, Any]:
    """Zeroed words of the tile kernels: look-back status (single-pass), the device count, the
    hybrid's atomic output counter, and the counter that hands out tiles (one memset).

    ``reuse``: this thread's words for (device, stream, algorithm, tiles), zeroed again: for
    a call whose workspace dies with it (one chunk, exact size). Stream order keeps a call's
    memset after the previous call's kernels; an allocation and three slices cost more than
    the kernels at 2^20 elements."""
    import cupy

    if reuse:
        key = (cupy.cuda.Device().id, cupy.cuda.get_current_stream().ptr, algorithm, tiles,
               exact)
        cache = getattr(_workspaces, "by_key", None)
        if cache is None:
            cache = _workspaces.by_key = {}
        ws = cache.get(key)
        if ws is None:
            if len(cache) >= 16:
                cache.clear()
            ws = cache[key] = _tile_workspace(algorithm, tiles, exact)
        else:
            _memset0(ws["words"])
        return ws
    if algorithm == "single-pass":
        words = cupy.empty(tiles + 2, dtype=np.uint64)
        _memset0(words)
        return {
            "status": words[:tiles], "count": words[tiles : tiles + 1],
            "tiles": words[tiles + 1 :], "words": words,
        }
    words = cupy.empty(3, dtype=np.uint64)
    _memset0(words)
    # exact path: the count kernel totals into "count", the hybrid kernel claims from "counter"
    counter = words[1:2] if exact else words[0:1]
    return {"count": words[0:1], "counter": counter, "tiles": words[2:3], "words": words}


def _run_exact(plans: list[_Plan], output: str, bases: list[int]) -> Any:
    """Count, allocate exactly, compact: for one chunk or a run of chunks of one task.

    A run is counted first (every chunk's count kernels queued), its counts come back in ONE
    host synchronisation, and then every chunk is compacted into its slice of one exact-size
    output: the output of a run is the concatenation of its chunks' outputs, without a copy.
    """

    dtype = plans[0].flat.dtype
    live = [(p, b) for p, b in zip(plans, bases) if p.n]
    if live and len({p.flat.device.id for p, _ in live}) > 1:
        # Not one device: each chunk on its own device, then one concatenation (rare: a task
        # on a dask-cuda worker sees one GPU).
        parts = [_run_exact([p], output, [b]) for p, b in live]
        return _concat_outputs(parts, output)
    if live and all(_one_read(p, output) for p, _ in live):
        return _run_one_read(live, output)
    return _run_count_first(live, output, dtype)


def _run_count_first(live: list[tuple[_Plan, int]], output: str, dtype: np.dtype) -> Any:
    """The exact path that counts first: every chunk's count kernels, one host sync for all
    counts, one exact-size allocation, then the chunks' compactions into their slices."""
    import cupy

    vals = idx = None
    with (live[0][0].flat.device if live else cupy.cuda.Device()):
        # one chunk: its workspace is dead once its output is made, so the thread's is reused
        workspaces = [_launch_count(p, reuse=len(live) == 1) for p, _ in live]
        counts = _read_counts([ws["count"] for ws in workspaces])  # the one host sync
        total = sum(counts)
        if len(live) == 1:
            _learn(live[0][0].memo, dtype, output, total, live[0][0].n)
        vals = cupy.empty(total, dtype=dtype) if output in ("values", "both") else None
        idx = cupy.empty(total, dtype=np.int64) if output in ("indices", "both") else None
        off = 0
        for (p, base), ws, c in zip(live, workspaces, counts):
            if c:
                _launch_main(
                    p, int(base), None if vals is None else vals[off:off + c],
                    None if idx is None else idx[off:off + c], ws, exact=True,
                )
            off += c
    return _by_output(vals, idx, output)


def _by_output(vals: Any, idx: Any, output: str) -> Any:
    if output == "values":
        return vals
    if output == "indices":
        return idx
    return vals, idx


# The one-read exact path (below) is taken when the bytes it moves, n*s + 3*k*o (read the
# input, write the selection to scratch, copy it out), are under ONE_READ_MARGIN times those
# of counting first, 2*n*s + k*o (s: input itemsize, o: output bytes per selected element):
# when the selected fraction is under ONE_READ_MARGIN * s / (2*o) (0.4 for values of any
# dtype, 0.2 for float32 indices). The margin leaves room for the copy's launch.
ONE_READ_MARGIN = 0.8
# Up to this many elements every call takes the one-read path, whatever the fraction: such a
# call is bound by its launches and its one host sync, not by bytes (on the H100, 2^20 float32:
# a kernel launch costs ~10 us of host time, the input's extra read ~1.5 us of the device's),
# and one read means one launch fewer before the count comes back. At 2^22 float32 the bytes
# the scratch adds (~15 MB at p = 0.95) cost about what the count launch did.
ONE_READ_ALWAYS = 1 << 22
# Such calls run through a cached _OneReadCall (packed launch, no plan); False: the general
# path (the tests compare both).
FAST_SMALL_CALLS = True


def _out_bytes(plan: _Plan, output: str) -> int:
    s = plan.spec.dtype.itemsize
    return {"values": s, "indices": 8, "both": s + 8}[output]


def _one_read(plan: _Plan, output: str) -> bool:
    """Whether this call compacts in one read of its input: a small call always, a larger one
    when the predicate's previous call on this dtype and output selected a small enough
    fraction (its first call counts first)."""
    if plan.memo is None or plan.spec.algorithm == "three-pass":
        return False
    if plan.n <= ONE_READ_ALWAYS:
        return True
    frac = plan.memo.get(("fraction", plan.spec.dtype, output))
    if frac is None:
        return False
    return frac < ONE_READ_MARGIN * plan.spec.dtype.itemsize / (2 * _out_bytes(plan, output))


def _learn(memo: dict | None, dtype: np.dtype, output: str, total: int, n: int) -> None:
    """What the next call of this predicate on ``dtype`` chooses its path by (_one_read)."""
    if memo is not None and n:
        memo[("fraction", dtype, output)] = total / n


def _run_one_read(live: list[tuple[_Plan, int]], output: str) -> Any:
    """Exact-size output with one read of the input: each chunk of the run is queued into its
    slice of n-sized scratch with the single-pass (or hybrid) kernel, as ``compact_into``
    does, the counts come back in one host synchronisation, and each chunk's selection is
    copied into its place in one exact-size array. Peak transient memory: the scratch (the
    run's n values and/or n int64 indices) plus the result."""
    import cupy

    plan0 = live[0][0]
    dtype, alg = plan0.flat.dtype, plan0.spec.algorithm
    total_n = sum(p.n for p, _ in live)
    with plan0.flat.device:
        vals = cupy.empty(total_n, dtype=dtype) if output in ("values", "both") else None
        idx = cupy.empty(total_n, dtype=np.int64) if output in ("indices", "both") else None
        counts = cupy.empty(len(live), dtype=np.uint64)
        if alg == "hybrid":
            _memset0(counts)  # the hybrid's tiles claim their places from it
        off = 0
        for j, (p, base) in enumerate(live):
            # this thread's words for the stream: zeroed again in stream order per chunk
            ws = dict(_tile_workspace(alg, -(-p.n // p.spec.tuning.tile), exact=False,
                                      reuse=True))
            ws["count" if alg == "single-pass" else "counter"] = counts[j:j + 1]
            _launch_main(p, int(base), None if vals is None else vals[off:off + p.n],
                         None if idx is None else idx[off:off + p.n], ws)
            off += p.n
        got = _read_words(counts)  # the one host sync
        total = sum(got)
        _learn(plan0.memo, plan0.spec.dtype, output, total, total_n)
        out_v = None if vals is None else cupy.empty(total, dtype=dtype)
        out_i = None if idx is None else cupy.empty(total, dtype=np.int64)
        src = dst = 0
        for (p, _), k in zip(live, got):
            for out, scratch in ((out_v, vals), (out_i, idx)):
                if out is not None and k:
                    _device_copy(out, dst, scratch, src, k)
            src += p.n
            dst += k
    return _by_output(out_v, out_i, output)


def _device_copy(dst: Any, dst_at: int, src: Any, src_at: int, k: int) -> None:
    """``dst[dst_at:dst_at+k] = src[src_at:src_at+k]`` as one ``cudaMemcpyAsync`` on the current
    stream (a slice assignment launches an elementwise kernel: several times the host time)."""
    import cupy

    s = src.itemsize
    cupy.cuda.runtime.memcpyAsync(dst.data.ptr + dst_at * s, src.data.ptr + src_at * s, k * s,
                                  cupy.cuda.runtime.memcpyDeviceToDevice,
                                  cupy.cuda.get_current_stream().ptr)


# Scratch of a cached small call is kept with it up to this many bytes (2^20 float32 values),
# saving an allocation per call; larger calls take theirs from CuPy's pool each time.
KEEP_SCRATCH_BYTES = 4 << 20
# Iterations of the host's wait for a mapped count before it falls back to a stream sync.
_SPIN = 4000
_NOT_YET = np.uint64(2**64 - 1)


class _PackedKernel:
    """The compaction kernel of one plan with its arguments packed once
    (``cupy_launch.PackedLaunch``: its own workspace words, the size, the predicate's
    constants), the grid and the shared memory; a call queues a memset of the words and one
    launch with the input, outputs and count pointers written into their slots. For repeated
    calls of one predicate on one size (see _OneReadCall, _IntoCall); not thread-safe (the
    slots are state): each thread keeps its own."""

    def __init__(self, plan: _Plan, output: str) -> None:
        from .cupy_launch import PackedLaunch

        spec, n = plan.spec, plan.n
        self.module = _compiled(spec)  # held: an evicted module stays loaded while this lives
        kernel = plan.kernels["main"]
        tiles = -(-n // spec.tuning.tile)
        self.block, self.smem = spec.tuning.block, spec.smem_bytes(output)
        self.grid = min(tiles, _resident_blocks(kernel, self.block, self.smem))
        ws = _tile_workspace(spec.algorithm, tiles, exact=False)  # its own words
        self.words, self.count = ws["words"], ws["count"]
        self.hybrid = spec.algorithm == "hybrid"
        # single-pass: (status, count, tiles); hybrid: (counter, tiles); the counter is the
        # count, zeroed with the words when it is the workspace's own
        fixed = [ws["counter"]] if self.hybrid else [ws["status"], ws["count"]]
        fixed.append(ws["tiles"])
        self.count_slot = 6 if self.hybrid else 7
        self.launch = PackedLaunch(kernel, 6 + len(fixed) + len(plan.params))
        self.launch.pointer(1, 0)  # no mask: the fused predicate
        self.launch.int64(2, n)
        for i, w in enumerate(fixed):
            self.launch.pointer(6 + i, w.data.ptr)
        for i, v in enumerate(plan.params):
            self.launch.scalar(6 + len(fixed) + i, v)

    def queue(self, a_ptr: int, base: int, vals_ptr: int, idx_ptr: int, count_ptr: int,
              stream_ptr: int) -> None:
        import cupy

        words = self.words
        cupy.cuda.runtime.memsetAsync(words.data.ptr, 0, words.nbytes, stream_ptr)
        launch = self.launch
        launch.pointer(0, a_ptr)
        launch.int64(3, base)
        launch.pointer(4, vals_ptr)
        launch.pointer(5, idx_ptr)
        launch.pointer(self.count_slot, count_ptr)
        launch(self.grid, self.block, self.smem, stream_ptr)


# Scratch of a cached small call is kept with it up to this many bytes (2^20 float32 values),
# saving an allocation per call; larger calls take theirs from CuPy's pool each time.
KEEP_SCRATCH_BYTES = 4 << 20
# Iterations of the host's wait for a mapped count before it falls back to a stream sync.
_SPIN = 4000
_NOT_YET = np.uint64(2**64 - 1)


class _OneReadCall:
    """A repeated small one-read call with everything but its input and outputs ready: the
    packed kernel, the scratch (up to KEEP_SCRATCH_BYTES; stream order makes its reuse safe:
    a call's kernel runs after the previous call's copy out of it). Per call it queues the
    kernel, waits for the count and copies the selection out. One per (thread, predicate
    object, dtype, output, algorithm, n, device, stream): see :func:`_one_read_call`.

    The count: the single-pass kernel's last tile stores the total with one plain store, so
    it is stored straight into pinned host memory (mapped: with unified addressing the host
    pointer is the device's too) and the host watches that word, instead of a device-to-host
    copy queued after the kernel and a stream synchronisation (10.6 us of the H100 host's
    time for 8 bytes, the copy engine's latency). The copy out is queued on the stream, so it
    starts after the kernel ends whatever the moment the count arrived. A word not written
    after _SPIN looks falls back to synchronising the stream (which raises a kernel's error).
    The hybrid's count is an atomic counter, final only at the end: it is read back as
    before."""

    def __init__(self, plan: _Plan, output: str) -> None:
        import cupy

        n = plan.n
        self.n, self.dtype, self.output, self.memo = n, plan.flat.dtype, output, plan.memo
        self.kernel = _PackedKernel(plan, output)
        self.mapped = not self.kernel.hybrid
        if self.mapped:
            self.host_mem = cupy.cuda.alloc_pinned_memory(8)
            self.host_count = np.frombuffer(self.host_mem, dtype=np.uint64, count=1)
        self.stream = cupy.cuda.get_current_stream()
        scratch = n * ((self.dtype.itemsize if output != "indices" else 0)
                       + (8 if output != "values" else 0))
        self.keep = scratch <= KEEP_SCRATCH_BYTES
        self.vals: Any = None
        self.idx: Any = None

    def _scratch(self) -> tuple[Any, Any]:
        import cupy

        vals, idx = self.vals, self.idx
        if vals is None and idx is None:
            n, output = self.n, self.output
            vals = cupy.empty(n, dtype=self.dtype) if output != "indices" else None
            idx = cupy.empty(n, dtype=np.int64) if output != "values" else None
            if self.keep:
                self.vals, self.idx = vals, idx
        return vals, idx

    def __call__(self, a: Any, base: int) -> Any:
        output, stream, kernel = self.output, self.stream, self.kernel
        vals, idx = self._scratch()
        vp = 0 if vals is None else vals.data.ptr
        ip = 0 if idx is None else idx.data.ptr
        if self.mapped:
            word = self.host_count
            word[0] = _NOT_YET  # the previous call's count was read: nothing writes it now
            kernel.queue(a.data.ptr, base, vp, ip, self.host_mem.ptr, stream.ptr)
            for _ in range(_SPIN):
                if word[0] != _NOT_YET:
                    break
            else:
                stream.synchronize()
                if word[0] == _NOT_YET:
                    raise RuntimeError("the compaction kernel ended without storing its count")
            total = int(word[0])
        else:
            kernel.queue(a.data.ptr, base, vp, ip, kernel.count.data.ptr, stream.ptr)
            (total,) = _read_counts([kernel.count])
        _learn(self.memo, self.dtype, output, total, self.n)
        return _by_output(None if vals is None else _head_copy(vals, total),
                          None if idx is None else _head_copy(idx, total), output)


class _IntoCall:
    """``compact_into``'s repeated call of one predicate on one size: the packed kernel, with
    the caller's outputs and count written into its slots per call; nothing waits. The
    hybrid's count is its atomic counter, zeroed in stream order first."""

    def __init__(self, plan: _Plan, output: str) -> None:
        self.kernel = _PackedKernel(plan, output)

    def __call__(self, a: Any, vals: Any, idx: Any, count: Any, stream_ptr: int) -> Any:
        import cupy

        if self.kernel.hybrid:
            cupy.cuda.runtime.memsetAsync(count.data.ptr, 0, 8, stream_ptr)
        self.kernel.queue(a.data.ptr, 0, 0 if vals is None else vals.data.ptr,
                          0 if idx is None else idx.data.ptr, count.data.ptr, stream_ptr)
        return count


# (kind, thread, id(predicate), dtype, output, algorithm, n, device, stream) -> (predicate,
# its _OneReadCall or _IntoCall, or None where the general path runs)
_ready_calls: BoundedCache[tuple, tuple] = BoundedCache("ready calls")


def _ready_call(kind: type, a: Any, pred: Predicate, output: str, algorithm: str,
                stream_ptr: int) -> Any:
    """The ready call of ``kind`` for ``a`` (C-contiguous, on the current device, not empty)
    and a fused predicate, or None where the general path runs."""
    import cupy

    if a.size == 0 or algorithm == "three-pass" or pred.path != "fused":
        return None
    if not a.flags.c_contiguous:
        return None
    dev = a.data.device_id
    if dev != cupy.cuda.runtime.getDevice():
        return None
    key = (kind, threading.get_ident(), id(pred), a.dtype, output, algorithm, a.size, dev,
           stream_ptr)
    hit = _ready_calls.get(key)
    if hit is not None and hit[0] is pred:
        return hit[1]
    plan = _plan(a, pred, None, output, algorithm)
    call = None
    if plan.memo is not None and plan.mask is None:
        try:
            call = kind(plan, output)
        except AttributeError:  # a CuPy without RawKernel.kernel or the driver's launch
            call = None
    # the predicate held: its id is not reused while the entry lives; None: the general path
    _ready_calls.put(key, (pred, call))
    return call


def _one_read_call(a: Any, pred: Predicate, output: str, algorithm: str) -> Any:
    """The ready one-read call for ``a`` (at most ONE_READ_ALWAYS elements), or None."""
    import cupy

    if a.size > ONE_READ_ALWAYS:
        return None
    return _ready_call(_OneReadCall, a, pred, output, algorithm,
                       cupy.cuda.get_current_stream().ptr)


def _head_copy(scratch: Any, k: int) -> Any:
    """The first ``k`` elements of ``scratch`` in a new exact-size array: one ``cudaMemcpyAsync``
    on the current stream (a slice's ``copy()`` launches an elementwise kernel, 17 us of host
    time at 2^19 elements on the H100, against ~3 us)."""
    import cupy

    out = cupy.empty(k, dtype=scratch.dtype)
    if k:
        _device_copy(out, 0, scratch, 0, k)
    return out


_count_buffers = threading.local()


def _read_words(words: Any) -> list[int]:
    """A uint64 device array on the host (one copy, one synchronisation of the stream)."""
    import cupy

    need = 8 * words.size
    host = _pinned_host(need)
    stream = cupy.cuda.get_current_stream()
    cupy.cuda.runtime.memcpyAsync(host.ctypes.data, words.data.ptr, need,
                                  cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()
    return [int(c) for c in host[:need].view(np.uint64)]


def _pinned_host(need: int) -> np.ndarray:
    """This thread's pinned buffer of at least ``need`` bytes (grown as needed)."""
    import cupy

    host = getattr(_count_buffers, "host", None)
    if host is None or host.size < need:
        mem = cupy.cuda.alloc_pinned_memory(max(need, 512))
        host = np.frombuffer(mem, dtype=np.uint8, count=max(need, 512))
        _count_buffers.host, _count_buffers.mem = host, mem
    return host


def _read_counts(words: list[Any]) -> list[int]:
    """The device count words on the host, with one synchronisation of the current stream.

    Each word is copied into this thread's pinned buffer by ``cudaMemcpyAsync``: a
    ``concatenate`` then ``get()`` cost two allocations, a kernel and a pageable copy, which
    at 2^20 elements took longer than the compaction."""
    import cupy

    if not words:
        return []
    need = 8 * len(words)
    host = _pinned_host(need)
    stream = cupy.cuda.get_current_stream()
    for i, w in enumerate(words):
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data + 8 * i, w.data.ptr, 8,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()
    return [int(c) for c in host[:need].view(np.uint64)]


def _concat_outputs(parts: list[Any], output: str) -> Any:
    import cupy

    if output == "both":
        return (cupy.concatenate([v for v, _ in parts]), cupy.concatenate([i for _, i in parts]))
    return cupy.concatenate(parts)


# ----------------------------------------------------------------------------- public ---------


def compact(
    a: Any, pred: Predicate, output: str, stable: bool, algorithm: str, index_base: int,
    *, variant: str | None = None, exact_mode: str | None = None,
) -> Any:
    """Dispatch entry for CuPy chunks (see dask_compact.dispatch): exact-length 1-D results.

    ``variant`` / ``exact_mode`` (benchmarks, tests) override SINGLE_PASS_VARIANT / EXACT_MODE.
    """
    alg = resolve_algorithm(algorithm, stable)
    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    if variant is None and exact_mode is None and FAST_SMALL_CALLS:
        call = _one_read_call(a, pred, output, alg)
        if call is not None:
            return call(a, index_base)
    plan = _plan(a, pred, None, output, alg, variant, exact_mode)
    return _run_exact([plan], output, [index_base])


def prepare(pred: Predicate, dtype: np.dtype, output: str, stable: bool = True,
            algorithm: str = "auto") -> None:
    """Make the current device ready to compact ``dtype`` chunks with ``pred``: its CUDA
    context, the predicate's typed functor, the module built (NVRTC, or CuPy's disk cache) and
    loaded, and both exact paths run once on a few zeros, since CUDA loads a kernel lazily at
    its first launch. What those runs teach the predicate's memo is forgotten: the first real
    chunk decides its path as if nothing had run.

    A batch job calls it in a background thread while it does its CPU-side set-up, so that its
    first chunks do not queue behind one another for that work (0.5-0.7 s on the H100 host)."""
    alg = resolve_algorithm(algorithm, stable)
    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    import cupy

    sample = cupy.zeros(4096, dtype=dtype)
    plan = _plan(sample, pred, None, output, alg)
    key = ("fraction", plan.spec.dtype, output)
    had = plan.memo is not None and key in plan.memo
    _run_count_first([(plan, 0)], output, plan.flat.dtype)
    if plan.memo is not None and plan.spec.algorithm != "three-pass":  # as _one_read allows
        _run_one_read([(plan, 0)], output)
    cupy.cuda.get_current_stream().synchronize()
    if plan.memo is not None and not had:
        plan.memo.pop(key, None)


def compact_many(
    blocks: list[Any], pred: Predicate, output: str, stable: bool, algorithm: str, bases: list[int],
) -> Any:
    """Dispatch entry for a run of CuPy chunks compacted by one task: the concatenation of
    their outputs (``bases[i]`` is chunk i's global index start), with one host sync."""
    alg = resolve_algorithm(algorithm, stable)
    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    return _run_exact([_plan(b, pred, None, output, alg) for b in blocks], output, list(bases))


def compact_masked(a: Any, mask: Any, output: str, index_base: int, algorithm: str = "auto") -> Any:
    """Dispatch entry: compact ``a`` where the boolean ``mask`` (same shape) is true."""
    import cupy

    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    if tuple(mask.shape) != tuple(a.shape):
        raise ValueError(f"mask of shape {mask.shape} does not match the chunk's {a.shape}")
    alg = resolve_algorithm(algorithm, True)
    return _run_exact([_plan(a, None, cupy.asarray(mask), output, alg)], output, [index_base])


def compact_into(
    a: Any,
    pred: Predicate | None,
    out_values: Any = None,
    out_indices: Any = None,
    *,
    mask: Any = None,
    algorithm: str = "single-pass",
    index_base: int = 0,
    variant: str | None = None,
    count: Any = None,
    stream: Any = None,
) -> Any:
    """Compact into preallocated outputs of capacity >= a.size; returns the device count.

    No host synchronisation: the count stays on the device (``count``, a 1-element 64-bit
    CuPy array, or a new uint64 one), as CUB's ``DeviceSelect`` leaves it. Entries past the
    count are left untouched, which the tests check with poisoned buffers; the benchmarks time
    this path against CUB. ``variant`` overrides SINGLE_PASS_VARIANT (the look-back schedule).
    Everything is queued on ``stream`` (default: the current one); while that stream captures
    a CUDA graph, the call's tile state (and any copy of the input or mask it made) is kept
    for the life of the process, since the graph may be replayed at any time.
    """
    import cupy

    if out_values is None and out_indices is None:
        raise ValueError("give out_values, out_indices or both")
    output = "both" if (out_values is not None and out_indices is not None) else (
        "values" if out_values is not None else "indices"
    )
    alg = resolve_algorithm(algorithm, algorithm != "hybrid")
    stream = cupy.cuda.get_current_stream() if stream is None else stream
    with stream:
        plan = _plan(a, pred, mask, output, alg, variant)
        for o in (out_values, out_indices):
            if o is not None and (o.size < plan.n or not o.flags.c_contiguous):
                raise ValueError("outputs must be contiguous with capacity >= a.size")
        with plan.flat.device:
            if count is None:
                count = cupy.empty(1, dtype=np.uint64)
            if plan.n == 0:
                _memset0(count)
                return count
            capturing = stream.ptr not in (0, 1) and stream.is_capturing()
            if alg == "three-pass":
                ws = _launch_count(plan)
                _launch_main(plan, index_base, out_values, out_indices, ws)
                cupy.cuda.runtime.memcpyAsync(count.data.ptr, ws["count"].data.ptr, 8,
                                              cupy.cuda.runtime.memcpyDeviceToDevice,
                                              stream.ptr)
            else:
                # Graph capture: words of its own that the graph keeps using; otherwise this
                # thread's words for the stream, zeroed in stream order (a call's memset runs
                # after the previous call's kernel).
                ws = dict(_tile_workspace(alg, -(-plan.n // plan.spec.tuning.tile),
                                          exact=False, reuse=not capturing))
                if alg == "single-pass":
                    ws["count"] = count  # the last tile stores the total there
                else:
                    _memset0(count)  # the hybrid's tiles claim their places from it
                    ws["counter"] = count
                _launch_main(plan, index_base, out_values, out_indices, ws)
            if capturing:
                _kept_for_graphs.append((ws, plan.flat, plan.mask))
    return count


# What calls captured into CUDA graphs use (tile state, copies of inputs): never freed, since
# a graph may be replayed at any time; O(n/1024) bytes per captured call on contiguous input.
_kept_for_graphs: list[tuple] = []


def compact_into_public(
    a: Any, pred: Predicate, out_values: Any, out_indices: Any, count: Any, stable: bool,
    algorithm: str, stream: Any,
) -> Any:
    """Dispatch entry of :func:`dask_compact.compact_into` (arguments already checked)."""
    import cupy

    alg = resolve_algorithm(algorithm, stable)
    if FAST_SMALL_CALLS:
        s = cupy.cuda.get_current_stream() if stream is None else stream
        # a call captured into a graph takes the general path: its words must be its own
        if s.ptr in (0, 1) or not s.is_capturing():
            output = "both" if (out_values is not None and out_indices is not None) else (
                "values" if out_values is not None else "indices")
            call = _ready_call(_IntoCall, a, pred, output, alg, s.ptr)
            if call is not None:
                return call(a, out_values, out_indices, count, s.ptr)
    return compact_into(a, pred, out_values, out_indices, algorithm=alg, count=count,
                        stream=stream)
