"""Source assembly of the CuPy modules: which kernel files and template instantiations one
module holds, and its complete source text (headers, the generated predicate functor, the
kernels, local includes inlined). Pure text: importing it imports no CuPy (the compile tests
build every module's source with nvcc on a machine without a GPU).
"""

from __future__ import annotations

import importlib.resources
import math
import re
from dataclasses import dataclass

import numpy as np

from ..codegen.cuda_functor import CudaFunctor, ctype
from . import cupy_tuning
from .cupy_tuning import (
    COPY_BLOCK,
    OUTPUT_CODES,
    REC_BLOCK,
    REC_GATHER_LOADS,
    REC_GATHER_MIN_BLOCKS,
    REC_GATHER_WORDS,
    REC_ITEMS,
    REC_SCAN_BLOCK,
    REC_SCAN_ITEMS,
    REC_STAGE,
    REVERSE_ITEMS,
    SCAN_BLOCK,
    SCAN_ITEMS,
    SINGLE_PASS_VARIANTS,
    TP_BLOCK,
    TP_SCAN_BLOCK,
    TP_SCAN_ITEMS,
    Tuning,
)

__all__ = [
    "FILES", "NVRTC_OPTIONS", "ModuleSpec", "RecordSpec", "module_source", "inline",
    "SORT_KEY_TYPES", "sort_keys_name", "sort_keys_source",
]  # fmt: skip

# Kernel files of each algorithm (one module = generated functor + these, includes inlined).
FILES = {
    "single-pass": ("count.cu", "single_pass.cu", "scatter.cu", "copy_out.cu", "partition.cu"),
    "hybrid": ("count.cu", "hybrid.cu", "copy_out.cu"),
    "three-pass": ("three_pass.cu",),
}
RECORD_FILES = ("count.cu", "records.cu")  # the records path's kernels (RecordSpec)
# NVRTC options (C++17 is the default of NVRTC and nvcc 13). CuPy appends -ftz=true;
# kernels/dcx_types.cuh keeps float32 predicates exact regardless. --fmad=false: NumPy rounds
# every operation, so a*b+c must not become one FMA.
NVRTC_OPTIONS = ("--fmad=false",)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([A-Za-z0-9_.]+)"\s*$', re.M)
_text_cache: dict[str, str] = {}


def _kernel_text(name: str) -> str:
    """A file of the installed ``dask_compact.kernels`` package (never found through __file__)."""
    if name not in _text_cache:
        _text_cache[name] = (
            importlib.resources.files("dask_compact.kernels").joinpath(name).read_text("utf-8")
        )
    return _text_cache[name]


def inline(name: str, seen: set[str]) -> str:
    """``name`` with its local #includes inlined once each (so the source alone is the cache key
    of CuPy's on-disk kernel cache, and no include path is needed)."""
    if name in seen:
        return ""
    seen.add(name)
    text = _kernel_text(name)
    return _INCLUDE.sub(lambda m: inline(m.group(1), seen), text).replace("#pragma once", "")


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
                "flags": f"dcx_tp_flags<{t}, {p}, {s}, {TP_BLOCK}{pa}>",
                "scan": f"dcx_tp_scan<{TP_SCAN_BLOCK}, {TP_SCAN_ITEMS}>",
                "scatter": f"dcx_tp_scatter<{t}, {out}, {TP_BLOCK}>",
            }
        if self.algorithm == "single-pass":
            v = SINGLE_PASS_VARIANTS[self.variant]
            sleeps = f"{self.tuning.poll}, {self.tuning.wait}"  # the look-back's
            names = {
                "count": f"dcx_count<{t}, {p}, {s}, {b}, {i}{pa}>",
                "scan": f"dcx_tile_scan<{SCAN_BLOCK}, {SCAN_ITEMS}>",
                "main": f"dcx_single_pass<{t}, {p}, {out}, {s}, {b}, {i}, {v}, {sleeps}{pa}>",
                # the scatter of exact_mode "prefix" (tile prefixes known, no look-back)
                "prefix": f"dcx_scatter<{t}, {p}, {out}, {s}, {b}, {i}{pa}>",
                "copy_out": f"dcx_copy_out<{COPY_BLOCK}>",
                "partition": f"dcx_partition<{t}, {p}, {out}, {s}, {b}, {i}{pa}>",
                # partition's one-pass route (cupy_split.py): the split by look-back, then
                # the others' run put back in order
                "partition_lb": (f"dcx_partition_lookback<{t}, {p}, {out}, {s}, {b}, {i}, "
                                 f"{sleeps}{pa}>"),
                "reverse": f"dcx_reverse_tail<{t}, {out}, {COPY_BLOCK}, {REVERSE_ITEMS}>",
            }
            if self.functor is not None:
                # a chunk of a chained run (cupy_exact._run_chained, fused predicates only:
                # a mask-path run never chains, and ptxas spilled 4 bytes in its 2-byte kernels
                # of both outputs): VARIANT's bit 1
                names["chain"] = (
                    f"dcx_single_pass<{t}, {p}, {out}, {s}, {b}, {i}, {v | 2}, {sleeps}{pa}>")
            return names
        return {
            "count": f"dcx_count<{t}, {p}, {s}, {b}, {i}{pa}>",
            "main": f"dcx_hybrid<{t}, {p}, {out}, {s}, {b}, {i}{pa}>",
            "copy_out": f"dcx_copy_out<{COPY_BLOCK}>",
        }

    def all_names(self) -> list[str]:
        """Every instantiation of the spec (all outputs), without repeats."""
        names: list[str] = []
        for output in OUTPUT_CODES:
            names += [n for n in self.names(output).values() if n not in names]
        return names

    def group_names(self, output: str, group: str) -> dict[str, str]:
        """Role -> name expression of one output's kernels in ``group`` (:data:`GROUPS`)."""
        return {r: n for r, n in self.names(output).items() if group_of(r) == group}

    def source(self) -> str:
        return module_source(self)

    def shared_part(self, names: dict[str, str]) -> tuple[str, frozenset[str]] | None:
        """See :func:`shared_part`."""
        return shared_part(self.functor, names, FILES[self.algorithm])

    def group_source(self, output: str, group: str) -> str:
        """The source of the module of one output and group: the spec's, with a last line
        naming them. CuPy's kernel cache is keyed by the source (not by the names it
        instantiates), so modules of different names must differ in their text."""
        return f"{module_source(self)}\n// kernels: output {output}, group {group}\n"

    def smem_bytes(self, output: str) -> int:
        out = OUTPUT_CODES[output]
        tile = self.tuning.tile
        return (tile * self.dtype.itemsize if out & 1 else 0) + (tile * 2 if out & 2 else 0)


# The kernels of one spec, one output and one group are built together (a module each, compiled
# from a thread each: cupy_modules.build_modules): a new predicate compiles only what its calls
# use. NVRTC's time grows with the kernels instantiated (nvcc on
# float32 `x < 0.5`, single-pass: all 12 kernels of the three outputs 1.87 s, one output's 6
# 0.70 s, its 4 main-path ones 0.47 s, none 0.20 s); on the H100 host a job's first command
# with a new predicate waited 3.5 s for the 12. `partition()` alone uses the split group, the
# chained runs of compact_many / compact_runs (a run's calls after its first) the chain group,
# single-pass's exact_mode "prefix" (not the default) its scatter, the prefix group: in the
# compact group it was a third of the kernels every new predicate compiled, unused. One H200
# (16 cores), a new predicate's first compact_array on an empty cache, three rounds, median
# (s): int64 `x // 7 == 2` 2.32 -> 1.83, `x % 7 == 2` 2.05 -> 1.50, float64 `log(x) < 1.5`
# 1.95 -> 1.45, float32 `x ** 1.5 < 3` 0.80 -> 0.53, `sin(x) < 0.5` level, comparisons
# 0.50 -> 0.42-0.51 (benchmarks/results/2026-12-04_h200_prefix_scatter_group_first_calls.md).
GROUPS = ("compact", "split", "chain", "prefix")


def group_of(role: str) -> str:
    return _GROUP_OF.get(role, "compact")


_GROUP_OF = {"partition": "split", "partition_lb": "split", "reverse": "split",
             "chain": "chain", "prefix": "prefix"}


def shared_part(functor: CudaFunctor | None, names: dict[str, str],
                files: tuple[str, ...]) -> tuple[str, frozenset[str]] | None:
    """(the module source of ``files`` without a predicate, the roles of ``names`` whose
    kernels do not take ``functor``), or None where there are none. Those kernels compile the
    same from either source; built from the one without the predicate, their modules serve
    every predicate (``cupy_modules.build_modules``): a new predicate of the records path
    compiled six kernels where one takes it, of a values compaction five where three do.
    A kernel takes the predicate only as a template argument, so its name says which."""
    if functor is None:  # no predicate in the source: its text is the same for every call
        return None
    takes = re.compile(rf"\b{re.escape(functor.name)}\b")
    roles = frozenset(r for r, n in names.items() if not takes.search(n))
    return (_assemble(None, files), roles) if roles else None


def module_source(spec: ModuleSpec) -> str:
    """The complete CUDA source of one module: headers, the generated functor, the kernels."""
    return _assemble(spec.functor, FILES[spec.algorithm])


def _assemble(functor: CudaFunctor | None, files: tuple[str, ...]) -> str:
    """Headers, the generated functor (if any), then the kernel files, includes inlined."""
    seen: set[str] = set()
    parts = ["// dask_compact: generated module source\n", inline("npy_ops.cuh", seen)]
    parts.append(inline("compact_warp.cuh", seen))
    if functor is not None:
        parts.append(functor.source)
    parts += [inline(f, seen) for f in files]
    return "\n".join(parts)


@dataclass(frozen=True)
class RecordSpec:
    """One compiled record module: the flags kernel of one record predicate (its generated
    functor; None: the mask path's dcx::RecMaskPred), the tile-count scan and the scatter."""

    functor: CudaFunctor | None
    block: int = REC_BLOCK
    items: int = REC_ITEMS
    gather_words: int = REC_GATHER_WORDS
    gather_min_blocks: int = REC_GATHER_MIN_BLOCKS
    gather_loads: int = REC_GATHER_LOADS
    scan_block: int = REC_SCAN_BLOCK
    scan_items: int = REC_SCAN_ITEMS
    stage: bool = REC_STAGE

    @property
    def scan_tile(self) -> int:
        """Tile counts per block of the tile scan (dcx_tile_scan_blocks), whose status words
        the flags kernel zeroes: one per scan block."""
        return self.scan_block * self.scan_items

    def scan_blocks(self, tiles: int) -> int:
        """The tile scan's grid for ``tiles`` flags tiles (at least one block)."""
        return max(1, -(-tiles // self.scan_tile))

    def counts_size(self, tiles: int) -> int:
        """Entries of the counts array: the tile counts (then prefixes), the total, the two
        work lists' lengths and the tile scan's status words (kernels/records.cu)."""
        return tiles + 3 + self.scan_blocks(tiles)

    def dense_from(self) -> int:
        """Selected rows from which a span goes to the per-lane scatter, from
        ``cupy_tuning.REC_DENSE_FROM`` read now (tests change it): 0 sends every span to
        the scatter, above 1 none."""
        return min(math.ceil(self.span * cupy_tuning.REC_DENSE_FROM), self.span + 1)

    @property
    def span(self) -> int:
        """Rows per block of the list-form scatter (dcx_rec_gather)."""
        return self.block * self.gather_words * 32

    @property
    def tile(self) -> int:
        return self.block * self.items

    def names(self) -> dict[str, str]:
        """Kernel role -> name expression."""
        if self.functor is not None:
            pred = self.functor.name
            args = "".join(", " + c for c in self.functor.param_ctypes)
        else:
            pred, args = "dcx::RecMaskPred", ", const bool*"
        return {
            "flags": f"dcx_rec_flags<{pred}, {self.block}, {self.items}, "
                     f"{self.scan_tile}{args}>",
            "scan": f"dcx_tile_scan_blocks<{self.scan_block}, {self.scan_items}>",
            "scatter": f"dcx_rec_scatter<{self.block}, {self.items}, {self.span}, "
                       f"{str(self.stage).lower()}>",
            "gather": f"dcx_rec_gather<{self.block}, {self.gather_words}, {self.tile}, "
                      f"{self.gather_min_blocks}, {self.gather_loads}>",
            "spans": f"dcx_rec_spans<{self.tile}, {self.span}>",
            "split": f"dcx_rec_split<{self.block}, {self.items}>",
        }

    def all_names(self) -> list[str]:
        return list(self.names().values())

    def source(self) -> str:
        return _assemble(self.functor, RECORD_FILES)

    def shared_part(self, names: dict[str, str]) -> tuple[str, frozenset[str]] | None:
        """See :func:`shared_part`: all but the flags kernel."""
        return shared_part(self.functor, names, RECORD_FILES)


# kernels/sort_keys.cu: the float argsort's keys (cupy_sort._keys), one instantiation per
# float width, by the unsigned integer of that width.
SORT_KEY_TYPES = {2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}


def sort_keys_name(itemsize: int) -> str:
    """The name expression of the keys kernel for floats of ``itemsize`` bytes."""
    return f"dcx_sort_keys<{SORT_KEY_TYPES[itemsize]}>"


def sort_keys_source() -> str:
    return "// dask_compact: sort keys module\n" + inline("sort_keys.cu", set())
