"""Launch layer of the GPU scans (``kernels/scan.cu``) and of the scan compaction
(``kernels/scan_compact.cu``): one launcher per algorithm, the per-device module cache, the
look-back workspace. Modules are compiled on first use (never at import: importing this module
imports no CuPy) and kept per (device, spec) in a bounded cache, as the compaction modules.

Entry points (what :mod:`dask_compact.dispatch` registers for CuPy arrays):

``scan(a, exclusive, algorithm, acc, base, out_dtype=None)``  the scan of ``a`` (flattened in
    C order) into a new 1-D array of dtype ``acc``, or of ``out_dtype`` (a narrower integer
    that ``acc``'s sums wrap into); ``base`` (a host number) is added to every element.
``total(a, acc)``  the sum of ``a`` in ``acc`` as a NumPy scalar (the dask path's chunk totals).
``compact_scan(a, pred, output, index_base)``  map -> scan -> scatter compaction.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..predicate.core import Predicate
from . import cupy_scan_source
from .cupy_device import NULL, check_powers, contiguous, memset0
from .cupy_launch import PackedLaunch, thread_key
from .cupy_modules import build_modules
from .cupy_scan_source import (
    SHARED_BLOCK,
    SIMPLE_BLOCK,
    ScanCompactSpec,
    ScanSpec,
    full_vec,
)

__all__ = ["scan", "total", "compact_scan", "module_for"]

_MAX_GRID = 2**31 - 1


class _Module:
    """The scan kernels of one spec on one device, a module per kernel compiled at once
    (``cupy_modules.build_modules``, inside the cache's one build per key);
    ``kernel(role)`` its RawKernel."""

    def __init__(self, spec: ScanSpec | ScanCompactSpec) -> None:
        self.spec = spec
        self._names = spec.names()
        self.modules = build_modules(spec.source(), self._names)
        self._kernels: dict[str, Any] = {}

    def kernel(self, role: str) -> Any:
        k = self._kernels.get(role)
        if k is None:
            k = self._kernels[role] = self.modules[role].get_function(self._names[role])
        return k


_modules: BoundedCache[tuple, _Module] = BoundedCache("cupy scan modules")


def module_for(spec: ScanSpec | ScanCompactSpec) -> _Module:
    """The spec's module on the current device, built once (NVRTC, or CuPy's disk cache)."""
    import cupy

    return _modules.get_or_build((cupy.cuda.Device().id, spec), lambda: _Module(spec))


def _grid(n: int, block: int = SIMPLE_BLOCK) -> int:
    return max(1, min(-(-n // block), _MAX_GRID))


def _flat(a: Any) -> Any:
    return contiguous(a).reshape(-1)


def scan(a: Any, exclusive: bool, algorithm: str, acc: np.dtype, base: Any = 0,
         d_total: Any = None, out_dtype: Any = None) -> Any:
    """``a``'s scan in a new 1-D CuPy array of dtype ``acc`` (see the module docstring).

    ``algorithm``: "auto"/"lookback", "shared", "thread-efficient", "work-efficient", "naive"
    (checked by the caller). ``d_total`` (lookback only): a 1-element ``acc`` array that
    receives ``base`` + the sum of ``a``. ``out_dtype``: the result's dtype where it is a
    narrower integer that the uint32 ``acc`` wraps into (None: ``acc``); the look-back stores
    it itself (4 bytes an element moved for int16 -> int16, against 10 through a uint32 result
    and its cast: 1.90 ms at 2^28 on one H100, 0.38x torch.cumsum), the others are cast.
    """
    import cupy

    acc = np.dtype(acc)
    narrow = None if out_dtype is None or np.dtype(out_dtype) == acc else np.dtype(out_dtype)
    lookback = algorithm == "auto" or algorithm == "lookback"
    if narrow is not None and not lookback:
        return scan(a, exclusive, algorithm, acc, base, d_total).astype(narrow)
    if d_total is None and lookback and a.flags.c_contiguous and a.size:
        ready = _ready_scan(a.dtype, acc, exclusive, narrow)
        if ready is not None:
            return ready(a, base)
    flat = _flat(a)
    n = int(flat.size)
    out = cupy.empty(n, dtype=acc if narrow is None else narrow)
    alg = "lookback" if algorithm == "auto" else algorithm
    signed = base is None and acc.kind == "f"
    b = _base(acc, base)
    if n == 0:
        if d_total is not None:
            d_total.fill(b)
        return out
    spec = ScanSpec.make(np.dtype(flat.dtype), acc, alg, exclusive, narrow)
    mod = module_for(spec)
    ex = np.int32(1 if exclusive else 0)
    if alg == "lookback":
        _lookback(mod, spec, flat, out, n, b, d_total)
    elif d_total is not None:
        raise ValueError("d_total is written by the lookback scan only")
    elif alg == "naive":
        _naive(mod, flat, out, n, b, ex)
    elif alg in ("work-efficient", "thread-efficient"):
        _blelloch(mod, alg == "thread-efficient", flat, out, n, b, ex)
    elif alg == "shared":
        _shared(mod, flat, out, n, b, ex, top=True)
    else:  # pragma: no cover - checked by the caller
        raise ValueError(f"unknown GPU scan algorithm {algorithm!r}")
    if signed and exclusive:
        # the sum of nothing: 0.0, as the CPU's exclusive scan and np.sum([]) give. Zero bytes
        # are +0.0; a memset rather than `out[:1] = 0` (a view and an elementwise kernel's
        # launch), part of the 12 us the public call took over its kernel at 2^28 float32 on
        # one H100 (0.7907 against 0.7787 ms, benchmarks/scan_tuning.py at 584043d)
        memset0(out, acc.itemsize)
    return out


def _base(acc: np.dtype, base: Any) -> Any:
    """The kernels' ``base`` argument, in ``acc``. No base: -0.0 for floats, the sums'
    identity (kernels/scan.cuh), so that a leading -0.0 stays -0.0 as in np.cumsum (0.0 +
    -0.0 is 0.0; until 2026-12-01, a probe)."""
    if base is None:
        return acc.type(-0.0 if acc.kind == "f" else 0)
    return acc.type(base)


def _lookback(mod: _Module, spec: ScanSpec, flat: Any, out: Any, n: int, base: Any,
              d_total: Any) -> None:
    import cupy

    acc = spec.acc
    vec = full_vec(spec.dtype, acc)
    aligned = (flat.data.ptr % (vec * flat.itemsize) == 0
               and out.data.ptr % (vec * out.itemsize) == 0)
    if not aligned:
        vec = 1
    tile = spec.tuning.block * spec.tuning.rows * vec
    tiles = -(-n // tile)
    if tiles > _MAX_GRID:
        raise ValueError(f"{n} elements are more than the scan's grid can hold")
    # The tiles' status words, zeroed: one per tile (flag + value), two for an 8-byte
    # accumulator (value, flag + check; 16-byte aligned as every CuPy allocation is)
    words = cupy.empty(tiles * (acc.itemsize // 4), dtype=np.uint64)
    memset0(words)
    k = mod.kernel("vector" if vec > 1 else "scalar")
    k((tiles,), (spec.tuning.block,),
      (flat, out, np.int64(n), base, words, NULL if d_total is None else d_total))


class _ReadyScan:
    """The look-back scan of one (input dtype, accumulator, exclusive) kept for one thread,
    device and stream: its spec, tile sizes and packed launches (``cupy_launch``), so that a
    repeated ``scan`` call (``scan_array``'s, a dask chunk's) skips the spec, the module
    lookup and RawKernel's boxing of six arguments. The same launches, words and memsets as
    :func:`_lookback` and :func:`scan`'s float first element.

    Why: on one H100 a public scan_array call took 50-55 us of host time against 21-27 us
    for its launch alone and 17-21 us for torch.cumsum (``benchmarks/host_time_probe.py``,
    2026-12-06): a small scan is bound by it, and at 2^28 its first launch's wait is in a
    batch's time (0.7915 against 0.7829 ms)."""

    def __init__(self, dtype: np.dtype, acc: np.dtype, exclusive: bool,
                 narrow: np.dtype | None = None) -> None:
        import cupy

        self.acc = acc
        self.out = acc if narrow is None else narrow
        self.spec = ScanSpec.make(dtype, acc, "lookback", exclusive, narrow)
        self.module = module_for(self.spec)  # held: its kernels stay loaded while this lives
        self.vec = full_vec(self.spec.dtype, acc)
        self.block = self.spec.tuning.block
        self.rows = self.spec.tuning.rows
        self.words_per_tile = acc.itemsize // 4
        self.signed = acc.kind == "f"
        self.exclusive = exclusive
        self.launches = {v: PackedLaunch(self.module.kernel(role), 6)
                         for v, role in ((self.vec, "vector"), (1, "scalar"))}
        for launch in self.launches.values():
            launch.pointer(5, 0)  # no d_total
        self.base: bytes | None = None  # the base the slots hold, as bytes
        self.stream_ptr = cupy.cuda.get_current_stream().ptr

    def __call__(self, a: Any, base: Any) -> Any:
        import cupy

        acc = self.acc
        n = a.size
        out = cupy.empty(n, dtype=self.out)
        vec = self.vec
        if a.data.ptr % (vec * a.itemsize) or out.data.ptr % (vec * out.itemsize):
            vec = 1
        launch = self.launches[vec]
        tiles = -(-n // (self.block * self.rows * vec))
        if tiles > _MAX_GRID:
            raise ValueError(f"{n} elements are more than the scan's grid can hold")
        b = _base(acc, base)
        raw = b.tobytes()
        if raw != self.base:
            for one in self.launches.values():
                one.scalar(3, b)
            self.base = raw
        words = cupy.empty(tiles * self.words_per_tile, dtype=np.uint64)
        stream = self.stream_ptr
        runtime = cupy.cuda.runtime
        runtime.memsetAsync(words.data.ptr, 0, words.nbytes, stream)
        launch.pointer(0, a.data.ptr)
        launch.pointer(1, out.data.ptr)
        launch.int64(2, n)
        launch.pointer(4, words.data.ptr)
        launch(tiles, self.block, 0, stream)
        if base is None and self.signed and self.exclusive:
            runtime.memsetAsync(out.data.ptr, 0, acc.itemsize, stream)  # +0.0: see scan()
        return out


# (thread, device, stream, input dtype, accumulator, exclusive, narrow output dtype or None,
# the scan tunings' generation) -> its _ReadyScan, or None where a build failed (the general
# path then says why)
_ready_scans: BoundedCache[tuple, Any] = BoundedCache("ready scans")


def _ready_scan(dtype: Any, acc: Any, exclusive: bool,
                narrow: np.dtype | None = None) -> _ReadyScan | None:
    """The current thread's ready look-back scan for the current device and stream."""
    import cupy

    key = (thread_key(), cupy.cuda.runtime.getDevice(), cupy.cuda.get_current_stream().ptr,
           dtype, acc, exclusive, narrow, cupy_scan_source.generation)
    hit = _ready_scans.get(key)
    if hit is None:
        try:
            hit = _ReadyScan(np.dtype(dtype), np.dtype(acc), exclusive, narrow)
        except AttributeError:  # a CuPy without RawKernel.kernel or the driver's launch
            return None
        _ready_scans.put(key, hit)
    return hit


def _naive(mod: _Module, flat: Any, out: Any, n: int, base: Any, ex: Any) -> None:
    """Hillis-Steele: a level per power of two below n, ping-pong between two buffers."""
    import cupy

    g, blk = _grid(n), (SIMPLE_BLOCK,)
    if n == 1:
        mod.kernel("finish_in")((g,), blk, (flat, out, np.int64(n), base, ex))
        return
    bufs = [cupy.empty(n, dtype=out.dtype), cupy.empty(n, dtype=out.dtype)]
    mod.kernel("first")((g,), blk, (flat, bufs[0], np.int64(n), np.int64(1)))
    src, d = 0, 2
    while d < n:
        mod.kernel("step")((g,), blk, (bufs[src], bufs[1 - src], np.int64(n), np.int64(d)))
        src, d = 1 - src, 2 * d
    mod.kernel("finish")((g,), blk, (bufs[src], out, np.int64(n), base, ex))


def _blelloch(mod: _Module, active: bool, flat: Any, out: Any, n: int, base: Any,
              ex: Any) -> None:
    """Blelloch's up-sweep and down-sweep over the input padded to the next power of two."""
    import cupy

    m = 1 << max(0, (n - 1).bit_length())
    buf = cupy.empty(m, dtype=out.dtype)
    blk = (SIMPLE_BLOCK,)
    mod.kernel("pad")((_grid(m),), blk, (flat, buf, np.int64(n), np.int64(m)))
    up, down = mod.kernel("up"), mod.kernel("down")
    stride = 1
    while stride < m:  # up-sweep: levels of 2*stride-element blocks
        count = m // (2 * stride)
        if active:
            up((_grid(count),), blk, (buf, np.int64(count), np.int64(stride)))
        else:
            up((_grid(m),), blk, (buf, np.int64(m), np.int64(stride)))
        stride *= 2
    # the root (the total) becomes the identity, then the down-sweep; a float's is -0.0
    # (kernels/scan.cuh), which a memset cannot write
    if out.dtype.kind == "f":
        # as its sign bit alone: CuPy's fill writes a value equal to 0 by a memset (0.0)
        sign = np.dtype(f"u{out.dtype.itemsize}")
        buf[m - 1 :].view(sign).fill(sign.type(1) << sign.type(8 * out.dtype.itemsize - 1))
    else:
        cupy.cuda.runtime.memsetAsync(buf.data.ptr + (m - 1) * buf.itemsize, 0, buf.itemsize,
                                      cupy.cuda.get_current_stream().ptr)
    stride = m // 2
    while stride >= 1:
        count = m // (2 * stride)
        if active:
            down((_grid(count),), blk, (buf, np.int64(count), np.int64(stride)))
        else:
            down((_grid(m),), blk, (buf, np.int64(m), np.int64(stride)))
        stride //= 2
    mod.kernel("finish")((_grid(n),), blk, (flat, buf, out, np.int64(n), base, ex))


def _shared(mod: _Module, src: Any, dst: Any, n: int, base: Any, ex: Any, top: bool) -> None:
    """Block scans of 2 * SHARED_BLOCK elements; their sums scanned (exclusive, with the base)
    by the same kernel, recursively, in place; then each block adds its sum's prefix."""
    import cupy

    tile = 2 * SHARED_BLOCK
    nb = -(-n // tile)
    block = mod.kernel("block" if top else "block_acc")
    blk = (SHARED_BLOCK,)
    if nb == 1:
        block((1,), blk, (src, dst, NULL, np.int64(n), base, ex))
        return
    if nb > _MAX_GRID:
        raise ValueError(f"{n} elements are more than the scan's grid can hold")
    sums = cupy.empty(nb, dtype=dst.dtype)
    # no base inside the blocks: the sums' identity (-0.0 for floats, kernels/scan.cuh)
    block((nb,), blk, (src, dst, sums, np.int64(n), dst.dtype.type(-0.0), ex))
    _shared(mod, sums, sums, nb, base, np.int32(1), top=False)
    mod.kernel("add")((nb,), blk, (dst, sums, np.int64(n)))


# Blocks of the total's first launch at most (each a grid-stride share; the second launch's
# one block sums their partials): enough to fill an H100/H200 several times over.
_TOTAL_GRID = 1024


def total(a: Any, acc: np.dtype) -> np.generic:
    """The sum of ``a`` in ``acc`` as a NumPy scalar on the host (one device synchronisation):
    CuPy's reduction (the totals' order of addition does not matter for integers; for floats
    it is a tree, as the look-back scan's tile sums), but where float32 is summed or summed
    from: CuPy compiles its reductions with -ftz=true, which flushed float32 subnormals
    (elements, partial sums and their conversion into float64: a dask cumsum of subnormals
    on CuPy chunks lost every chunk's total on an H200, 2026-12-01), so there the scan
    module's ``dcx_scan_total`` sums them, in two launches."""
    import cupy

    flat = _flat(a)
    acc = np.dtype(acc)
    n = int(flat.size)
    if n == 0:  # adds nothing: -0.0 for floats, as numpy_scan.total
        return acc.type(-0.0 if acc.kind == "f" else 0)
    if np.dtype(np.float32) not in (acc, flat.dtype):
        got = acc.type(cupy.sum(flat, dtype=acc).get())
    else:
        mod = module_for(ScanSpec.make(np.dtype(flat.dtype), acc, "total", True))
        g = min(_grid(n), _TOTAL_GRID)
        partial = cupy.empty(g, dtype=acc)
        mod.kernel("partial")((g,), (SIMPLE_BLOCK,), (flat, partial, np.int64(n)))
        out = cupy.empty(1, dtype=acc)
        mod.kernel("final")((1,), (SIMPLE_BLOCK,), (partial, out, np.int64(g)))
        got = acc.type(out.get()[0])
    return _signed_zero(got, flat, acc)


def _signed_zero(got: np.generic, flat: Any, acc: np.dtype) -> np.generic:
    """A float total of 0: -0.0 where every element is -0.0, as NumPy's sum in order from
    -0.0 gives it. The reductions here start their threads at 0.0 (0.0 + -0.0 is 0.0), so a
    chunk of -0.0s totalled 0.0 and a cumsum's later chunks came back 0.0 where np.cumsum
    keeps -0.0 (the CPU's fault, found by a probe on 2026-12-01; numpy_scan.total). In
    round-to-nearest a sum is -0.0 only when every term is, and a zero total of elements
    that all carry the sign bit has only -0.0s: one more reduction, for zero totals only."""
    if acc.kind != "f" or got != 0 or np.signbit(got):
        return got
    import cupy

    if flat.dtype.kind == "f" and bool(cupy.signbit(flat).all()):
        return acc.type(-0.0)
    return got


# ------------------------------------------------------------------ scan compaction ----------


def compact_scan(a: Any, pred: Predicate, output: str, index_base: int) -> Any:
    """``compact_array(..., algorithm="scan")`` on a CuPy array: flags (the fused predicate's
    kernel, or the mask path's mask), the look-back exclusive scan of the flags with the total,
    one read of the total, the exact-size output, the scatter."""
    import cupy

    from ..codegen.cuda_functor import CodegenUnsupported
    from ..predicate.expr import ParamOverflow
    from .cupy_modules import typed_functor

    flat = _flat(a)
    dtype = np.dtype(flat.dtype)
    n = int(flat.size)
    pos_dtype = np.dtype(np.int32 if n < 2**31 else np.int64)
    functor, args = None, ()
    if pred.path == "fused":
        try:
            tp, functor = typed_functor(dtype, pred)
            args = tuple(tp.bind(pred.params))
        except (CodegenUnsupported, ParamOverflow):
            functor = None
        else:
            check_powers(tp, flat, pred.params)
    if functor is not None:
        mod = module_for(ScanCompactSpec(dtype, pos_dtype, functor))
        flags = cupy.empty(n, dtype=np.bool_)
        if n:
            mod.kernel("flags")((_grid(n),), (SIMPLE_BLOCK,), (flat, flags, np.int64(n), *args))
    else:
        mod = module_for(ScanCompactSpec(dtype, pos_dtype, None))
        flags = _flat(cupy.asarray(pred.mask(a, cupy)))
        if flags.dtype != np.bool_:
            flags = flags.astype(np.bool_)
    d_total = cupy.zeros(1, dtype=pos_dtype)
    pos = scan(flags, True, "lookback", pos_dtype, 0, d_total)
    k = int(d_total.get()[0])
    vals = cupy.empty(k, dtype=dtype) if output in ("values", "both") else None
    idx = cupy.empty(k, dtype=np.int64) if output in ("indices", "both") else None
    if k:
        mod.kernel(f"scatter_{output}")(
            (_grid(n),), (SIMPLE_BLOCK,),
            (flat, flags, pos, np.int64(n), np.int64(index_base),
             NULL if vals is None else vals, NULL if idx is None else idx))
    if output == "values":
        return vals
    if output == "indices":
        return idx
    return vals, idx
