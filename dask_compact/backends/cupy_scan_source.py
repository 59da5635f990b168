"""Source assembly and tuning of the scan modules (``kernels/scan.cu``, ``scan_compact.cu``):
which template instantiations one module holds, and its complete source. Pure text: importing
it imports no CuPy, so the compile tests build every module here with nvcc.

One scan module per (input dtype, accumulator dtype, algorithm, tuning): a first call compiles
only the algorithm it runs. One scan-compaction module per (predicate functor, dtype): the
``map`` (flags) and ``scatter`` kernels of ``compact_array(..., algorithm="scan")``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np

from ..codegen.cuda_functor import CudaFunctor, ctype
from .cupy_source import inline
from .cupy_tuning import OUTPUT_CODES

__all__ = [
    "GPU_ALGORITHMS", "ACC_DTYPES", "ScanTuning", "ScanEntry", "TABLE", "SIMPLE_BLOCK",
    "SHARED_BLOCK", "scan_tuning", "override_scan_tuning", "scan_ctype", "full_vec", "ScanSpec",
    "ScanCompactSpec",
]  # fmt: skip

# algorithm= values of a CuPy scan ("auto" is "lookback").
GPU_ALGORITHMS = ("lookback", "shared", "thread-efficient", "work-efficient", "naive")
# Accumulator (output) dtypes the kernels are built for: NumPy's cumsum gives int64, uint64,
# float32 or float64; int32 and uint32 are there for an explicit ``dtype=``.
ACC_DTYPES = tuple(np.dtype(t) for t in ("int32", "int64", "uint32", "uint64", "float32",
                                         "float64"))
# Threads per block of the one-element-per-thread kernels (naive, work- and thread-efficient,
# the finishing passes, the compaction's flags and scatter), grid-stride beyond 2^31 blocks.
SIMPLE_BLOCK = 256
# "shared": threads per block; each block scans 2 * SHARED_BLOCK elements (GPU Gems 3, ch. 39).
SHARED_BLOCK = 256


@dataclass(frozen=True)
class ScanTuning:
    """Tile shape of ``dcx_scan_lookback``: ``block`` threads, ``rows`` rows of one vector
    per lane (a tile holds block * rows * VEC elements, VEC from :func:`full_vec`);
    ``min_blocks`` per SM asked of ptxas through ``__launch_bounds__`` (0: none), which caps
    the registers; ``cache``: bit 0 loads and bit 1 stores full tiles with the evict-first
    ``.cs`` hint (``kernels/scan.cuh``, ScanTile), bit 2 loads them without L1 allocation and
    bit 3 with the 256-byte L2 prefetch (sweeps: ``benchmarks/scan_tuning.py``); ``poll`` and
    ``wait``: the look-back's polling (``scan_lookback``: ns slept before a lane reads an
    unpublished predecessor again, 0 none, negative an exponential back-off from that; ns
    slept before the first read); ``sched`` 1: warp 0 looks back while the other warps still
    scan (ScanTile::run_early); the last three named in the kernel only when not the
    defaults."""

    block: int
    rows: int
    min_blocks: int = 0
    cache: int = 0
    poll: int = 20
    wait: int = 0
    sched: int = 0


@dataclass(frozen=True)
class ScanEntry:
    tuning: ScanTuning
    why: str


# Keyed by (accumulator itemsize, whether the input is narrower: its vector holds fewer bytes
# and its registers fewer words). Measured on one H100 (sm_90) by benchmarks/scan_sweep.py,
# the public call beside CUB's ExclusiveSum and torch.cumsum in the same process
# (benchmarks/results/scan-sweep-2026-11-26-NVIDIA_H100_80GB_HBM3-*.md: 7993dd8 and 2d97d9f
# for the shapes, 9f2abeb for the blocks per SM and the cache hints).
# The look-back's sleeps of the 4-byte entries: CUB's for sm_90 floats (cccl's
# tuning_scan.cuh: 1140 ns before the first read, 688 ns per poll).
_CUB_SLEEPS_4 = ScanTuning(128, 32, 3, 0, 688, 1140)
_SHAPE_4 = ("at 2^28 128 x 32 beat 256 x 4 (the reasoned first choice: 0.955 ms, 75% of the "
            "copy, 0.92x CUB), 128 x 16 and 256 x 16; 1024 threads x 16-32 rows fell to "
            "0.25-0.8x; at 2^20 every shape is launch-bound. Bigger tiles mean fewer look-backs "
            "and 128 B of loads in flight per thread. ")
TABLE = MappingProxyType({
    (4, False): ScanEntry(_CUB_SLEEPS_4, _SHAPE_4 + "9f2abeb, 2^28: three blocks per "
                          "SM asked (168 registers): float32 0.822 ms, 87% of the copy, 1.08x "
                          "CUB, 1.25x torch.cumsum; int32 0.836 ms, 1.10x CUB (int32 had taken "
                          "189 registers, two blocks per SM: 0.912 ms, 0.97x CUB at 1602d39). "
                          ".cs stores, or loads and stores, were 0.3-2% faster, but under the "
                          "bound some instantiations of each spilled (float32 inclusive, int32 "
                          "exclusive; tests/test_kernels_compile.py refuses spills). 00cdee4: "
                          "128 x 20-28 rows at 3-4 blocks per SM, 96 x 32, 64 x 32 and 192 x 16 "
                          "were 1-7% slower (0.830-0.878 ms against 0.818-0.821). CUB's "
                          "sleeps in the look-back, on one H200 at 85184ae "
                          "(scan-tuning-2026-12-01-NVIDIA_H200-85184ae.md, one process): "
                          "float32 2^28 0.603 against 0.644 ms (85.0% of the copy against "
                          "79.6%; 1.45x torch.cumsum, 1.19x CUB), int32 0.608 against 0.645 "
                          "ms, 1.05-1.07x at 2^24 and 2^26 for both; 500 ns before the first "
                          "read alone 1.02x, polls every 100 ns or without a sleep level, a "
                          "whole-warp back-off 0.99x"),
    (4, True): ScanEntry(_CUB_SLEEPS_4, "not measured: the 4-byte entry (bool, int8 "
                         "and int16 inputs read 1-2 bytes a lane per row)"),
    (8, False): ScanEntry(ScanTuning(128, 16, 0, 3), "9f2abeb, int64 at 2^28: 1.557 ms, 91% of "
                          "the copy, 1.02x CUB, 1.19x torch.cumsum with .cs loads and stores "
                          "(1.573 ms without); 128 x 32 1.657-1.775 ms (two blocks per SM), "
                          "128 x 8 1.65 ms"),
    (8, True): ScanEntry(ScanTuning(128, 32, 0, 3), "9f2abeb, int32 -> int64 at 2^28: 1.223 "
                         "ms, 88% of the copy, 1.06x CUB, 2.46x torch.cumsum (128 x 16: 1.348 "
                         "ms, 0.96x; with .cs loads and stores 1.242 ms). The int32 input "
                         "leaves room for 32 rows in 168 registers (three blocks per SM). "
                         "Before the 16-byte status words (ed6fbb4) 128 x 32 took 1.60 ms. "
                         "CUB's sleeps for 8-byte sums (1290 / 632 ns) were level on one H200 "
                         "at 85184ae (1.018 / 0.999 / 0.990x at 2^28 / 2^26 / 2^24): not "
                         "taken"),
})  # fmt: skip
_override: dict[int, ScanTuning] = {}
# Incremented at each override: the ready scans (cupy_scan._ready_scans) are keyed by it, so a
# sweep's next call plans with its tuning
generation = 0


def scan_tuning(acc: np.dtype, dtype: np.dtype | None = None) -> ScanTuning:
    """The look-back tile shape for input ``dtype`` (None: as wide as ``acc``) scanned into
    accumulator ``acc``: a sweep's override, else the table."""
    size = np.dtype(acc).itemsize
    narrower = dtype is not None and np.dtype(dtype).itemsize < size
    return _override.get(size) or TABLE[(size, narrower)].tuning


def override_scan_tuning(acc_itemsize: int, tuning: ScanTuning | None) -> None:
    """Benchmarks' tile-shape sweeps: use ``tuning`` for this accumulator size (None: undo)."""
    global generation
    generation += 1
    if tuning is None:
        _override.pop(acc_itemsize, None)
    else:
        if (tuning.block % 32 or not 32 <= tuning.block <= 1024 or tuning.rows < 1
                or tuning.min_blocks < 0 or tuning.cache not in range(16)
                or tuning.cache & 5 == 5 or not -1024 <= tuning.poll <= 1024
                or not 0 <= tuning.wait <= 4096 or tuning.sched not in (0, 1)):
            raise ValueError(f"bad scan tuning {tuning}")
        _override[acc_itemsize] = tuning


def scan_ctype(dtype: np.dtype) -> str:
    """The device type of a scan's input or accumulator (NumPy bool: ``dcx::b8``, a byte)."""
    dt = np.dtype(dtype)
    return "dcx::b8" if dt == np.dtype(bool) else ctype(dt)


def full_vec(dtype: np.dtype, acc: np.dtype) -> int:
    """Elements per lane and row of the look-back tile when input and output are aligned: one
    16-byte vector of the wider of the two types (float32 -> float32: 4; int8 -> int64: 2)."""
    return max(1, 16 // max(np.dtype(dtype).itemsize, np.dtype(acc).itemsize))


@dataclass(frozen=True)
class ScanSpec:
    """One compiled scan module: ``dtype`` (input) scanned into ``acc`` by ``algorithm``;
    ``exclusive`` is part of the look-back kernel's instantiation (the other algorithms take
    it as an argument: use :meth:`make`, which sets it to True for them)."""

    dtype: np.dtype
    acc: np.dtype
    algorithm: str
    tuning: ScanTuning
    exclusive: bool = True
    # the look-back's output dtype where it is not ``acc``: a narrower integer its sums wrap
    # into (dask_compact.scan's narrow dtypes), stored by the kernel
    out: np.dtype | None = None

    @classmethod
    def make(cls, dtype: np.dtype, acc: np.dtype, algorithm: str, exclusive: bool,
             out: np.dtype | None = None) -> ScanSpec:
        """The spec of one call (one module per spec and device); ``out``: the look-back's
        output dtype where it is narrower than ``acc`` (None: ``acc``)."""
        dtype, acc = np.dtype(dtype), np.dtype(acc)
        out = None if out is None or np.dtype(out) == acc else np.dtype(out)
        if out is not None and (algorithm != "lookback" or acc.kind != "u" or acc.itemsize != 4
                                or out.kind not in "iu" or out.itemsize >= acc.itemsize):
            raise ValueError(f"a {algorithm} scan summed in {acc} is not stored as {out}")
        tuning = scan_tuning(acc, dtype)
        if dtype.kind != "f" and acc.kind == "f":
            # integers summed as floats (an explicit dtype=): the conversions need registers
            # that the table's bound leaves out (int32 -> float32 spilled 28-68 bytes under
            # 168 registers, checked with ptxas by tests/test_kernels_compile.py)
            tuning = replace(tuning, min_blocks=0)
        return cls(dtype, acc, algorithm, tuning, exclusive or algorithm != "lookback", out)

    def names(self) -> dict[str, str]:
        """Kernel role -> name expression (template instantiation)."""
        t, a = scan_ctype(self.dtype), scan_ctype(self.acc)
        if self.algorithm == "lookback":
            tn = self.tuning
            head = f"dcx_scan_lookback<{t}, {a}, {tn.block}, {tn.rows}"
            tail = f"{tn.min_blocks}, {'true' if self.exclusive else 'false'}, {tn.cache}"
            if self.out is not None:  # named after the three it follows (scan.cu); unsigned:
                # an int16 output is the same bits as a uint16 one (one kernel for both)
                bits = scan_ctype(np.dtype(f"u{self.out.itemsize}"))
                tail += f", {tn.poll}, {tn.wait}, {tn.sched}, {bits}"
            elif (tn.poll, tn.wait, tn.sched) != (20, 0, 0):  # the kernel's defaults (scan.cu)
                tail += f", {tn.poll}, {tn.wait}" + (f", {tn.sched}" if tn.sched else "")
            tail += ">"
            v = full_vec(self.dtype, self.acc)
            names = {"vector": f"{head}, {v}, {tail}"}
            # misaligned views (a[1:]) take the element-wise tile (VEC = 1)
            names["scalar"] = f"{head}, 1, {tail}"
            return names
        if self.algorithm == "naive":
            return {
                "first": f"dcx_scan_hs_step<{t}, {a}>",
                "step": f"dcx_scan_hs_step<{a}, {a}>",
                "finish_in": f"dcx_scan_finish_inclusive<{t}, {a}>",  # n == 1: no level
                "finish": f"dcx_scan_finish_inclusive<{a}, {a}>",
            }
        if self.algorithm in ("work-efficient", "thread-efficient"):
            kind = "all" if self.algorithm == "work-efficient" else "active"
            return {
                "pad": f"dcx_scan_pad<{t}, {a}>",
                "up": f"dcx_scan_up_{kind}<{a}>",
                "down": f"dcx_scan_down_{kind}<{a}>",
                "finish": f"dcx_scan_finish_exclusive<{t}, {a}>",
            }
        if self.algorithm == "shared":
            s = SHARED_BLOCK
            return {
                "block": f"dcx_scan_shared_block<{t}, {a}, {s}>",
                "block_acc": f"dcx_scan_shared_block<{a}, {a}, {s}>",  # the block sums
                "add": f"dcx_scan_shared_add<{a}, {s}>",
            }
        if self.algorithm == "total":  # no scan: cupy_scan.total's sum
            s = SIMPLE_BLOCK
            return {
                "partial": f"dcx_scan_total<{t}, {a}, {s}>",
                "final": f"dcx_scan_total<{a}, {a}, {s}>",
            }
        raise ValueError(f"unknown scan algorithm {self.algorithm!r}")

    def all_names(self) -> list[str]:
        out: list[str] = []
        for n in self.names().values():
            if n not in out:
                out.append(n)
        return out

    def source(self) -> str:
        return "// dask_compact: scan module\n" + inline("scan.cu", set())


@dataclass(frozen=True)
class ScanCompactSpec:
    """One compiled module of the scan compaction: the flags kernel of a fused predicate
    (``functor``; None: the mask path, which has its flags already) and the scatter kernels
    of ``dtype`` with positions of type ``pos`` (int32 or int64)."""

    dtype: np.dtype
    pos: np.dtype
    functor: CudaFunctor | None

    def names(self) -> dict[str, str]:
        t, a = ctype(self.dtype), scan_ctype(self.pos)
        out = {f"scatter_{o}": f"dcx_scan_scatter<{t}, {a}, {c}>" for o, c in OUTPUT_CODES.items()}
        if self.functor is not None:
            pa = "".join(", " + c for c in self.functor.param_ctypes)
            out["flags"] = f"dcx_scan_flags<{t}, {self.functor.name}{pa}>"
        return out

    def all_names(self) -> list[str]:
        return list(self.names().values())

    def source(self) -> str:
        seen: set[str] = set()
        parts = ["// dask_compact: scan compaction module\n", inline("npy_ops.cuh", seen),
                 inline("compact_warp.cuh", seen)]
        if self.functor is not None:
            parts.append(self.functor.source)
        parts.append(inline("scan_compact.cu", seen))
        return "\n".join(parts)
