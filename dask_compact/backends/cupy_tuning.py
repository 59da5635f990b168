"""What the CUDA kernels are launched with: the algorithms, the tile shapes and look-back
schedules per (compute capability, algorithm, element size) with the measurement behind each,
and the constants the kernels take as template parameters; and the switches of the exact-size
paths (which path a call takes: read at each call, so that tests and benchmarks can turn them).

One home for every number the launch layer and the kernels share: the kernels take them as
template parameters (``kernels/three_pass.cu``'s block, the scan's shape, the tile shape), so
nothing is written twice. ``TP_GROUP`` (1024 elements: 32 subgroups of a warp's 32 lanes) is
the three-pass algorithm's structure, not a tuning; a compile test checks it against the
kernel source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType

__all__ = [
    "ALGORITHMS", "OUTPUT_CODES", "Tuning", "Entry", "TABLE", "DIVMOD_TABLE", "MEASURED_ON",
    "tuning_for",
    "variant_for", "override_tuning", "override_lookback_sleeps", "resolve_algorithm",
    "SINGLE_PASS_VARIANTS", "EXACT_MODES", "TP_GROUP", "TP_BLOCK", "TP_SCAN_BLOCK",
    "TP_SCAN_ITEMS", "SCAN_BLOCK", "SCAN_ITEMS", "REC_BLOCK", "REC_ITEMS", "REC_GATHER_WORDS",
    "COPY_BLOCK", "COPY_MAX_GRID", "REC_DENSE_FROM", "REC_SPANS_BLOCK", "REC_SCAN_BLOCK",
    "REC_SCAN_ITEMS", "REC_GATHER_MIN_BLOCKS", "REC_GATHER_LOADS", "EXACT_MODE", "SPIN_MAX_N",
    "ONE_READ_MARGIN", "ONE_READ_ALWAYS_BYTES", "FAST_SMALL_CALLS", "UNSTABLE_SINGLE_PASS_MAX_N",
    "CHAINED_RUNS", "SPLIT_ROUTES", "SPLIT_ROUTE", "SPLIT_ONE_PASS_FROM", "REVERSE_ITEMS",
]  # fmt: skip

ALGORITHMS = ("single-pass", "three-pass", "hybrid")
OUTPUT_CODES = {"values": 1, "indices": 2, "both": 3}

# Three-pass (kernels/three_pass.cu): warp groups of TP_GROUP elements, TP_BLOCK threads per
# block of the flags and scatter kernels (8 groups), the group-count scan's shape.
TP_GROUP = 1024
TP_BLOCK = 256
TP_SCAN_BLOCK = 256
TP_SCAN_ITEMS = 16
# dcx_copy_out (a ready call's copy of its selection out of scratch): threads per block, and
# at most this many blocks (16 per SM of an H100: one 16-byte vector per thread up to 8.6 MB,
# grid-stride beyond).
COPY_BLOCK = 256
COPY_MAX_GRID = 2112
# dcx_tile_scan (the single-pass "prefix" exact path): one block of SCAN_BLOCK threads,
# SCAN_ITEMS tile counts per thread per round.
SCAN_BLOCK = 1024
SCAN_ITEMS = 8

# Tile shape of the record kernels (kernels/records.cu): BLOCK threads x ITEMS rows; a warp's
# ITEMS ballot words are one segment. 256 x 16 keeps 16 independent loads per thread in flight
# in the flags pass (the one-array tuning of 4-byte types on sm_90 is 256 x 16 with 16-byte
# vectors; rows are loaded one by one here, by a functor that reads several fields).
REC_BLOCK = 256
REC_ITEMS = 16
# The copy pass's two forms (kernels/records.cu): a span of REC_BLOCK * 32 * REC_GATHER_WORDS
# rows goes to the list form (dcx_rec_gather) when under REC_DENSE_FROM of its rows are
# selected, else to the per-lane scatter. Measured on the H100, 2^28 rows x 4 float32 (whole
# call, ms): words 1 / 2 at p = .05: 1.61 / 1.55, p = .5: 3.00 / 3.28, p = .95: 4.14 / 4.64
# (the scatter alone: 2.24 / 3.10 / 3.67), so one word (8192-row spans, 16 KiB of list) and the
# crossover near one half. Since the scatter stages its columns (REC_STAGE), 0.4: one H200,
# public call at 2^28 rows, p = .3 / .35 / .4 / .45 / .5 / a density per 5000 rows, ms: 0.5:
# 1.85 / 1.94 / 2.08 / 2.17 / 2.31 / 2.36; 0.4: 1.86 / 1.95 / 2.15 / 2.08 / 2.13 / 2.37; 0.35:
# 1.85 / 2.04 / 2.05 / 2.07 / 2.12 / 2.39 (2026-11-29_h200_9271a49_records_staged_copy.md).
REC_GATHER_WORDS = 1
REC_DENSE_FROM = 0.4
# The per-lane scatter's stride-1 columns of whole tiles staged through shared memory (16-byte
# loads and stores, dcx::stage_tile) rather than copied row by row: one H200, 2^28 rows of four
# float32 fields, the scatter kernel over every span at p = .5 / .95: 1.72 / 2.15 ms against
# 1.99 / 2.35 per lane.
REC_STAGE = True
# The list form's resident blocks per SM (its register bound) and rows in flight per thread and
# column: 2 and 8 (102 registers) until 2026-11-29.
REC_GATHER_MIN_BLOCKS = 4
REC_GATHER_LOADS = 4
# dcx_rec_spans sorts the spans into the two forms' work lists, a thread per span.
REC_SPANS_BLOCK = 256
# The records' tile scan (dcx_tile_scan_blocks): blocks of REC_SCAN_BLOCK threads x
# REC_SCAN_ITEMS tile counts, joined by look-back (2048 tiles, 8 Mi rows, a block).
REC_SCAN_BLOCK = 256
REC_SCAN_ITEMS = 8

# Single-pass look-back schedules, the VARIANT of dcx_single_pass: "classic" (compact_tiles)
# or "early" (compact_tiles_early: aggregate published as soon as a tile's loads arrive,
# look-back overlapped with the next tile's loads).
SINGLE_PASS_VARIANTS = {"classic": 0, "early": 1}
# Exact-size paths of algorithm="single-pass": "prefix" (count -> tile-prefix scan -> read the
# total -> allocate -> scatter at known prefixes) or "lookback" (count -> read the total ->
# allocate -> the look-back kernel). "prefix" measured faster only at p=0.95 (float32 1.230 vs
# 1.343 ms) and 1-8% slower at p <= 0.5, so the default (EXACT_MODE below) is "lookback"
# (benchmarks/results/NOTES-gpu.md).
EXACT_MODES = ("prefix", "lookback")

# ---- the exact-size paths' switches, read at each call (tests and benchmarks switch them) ----

# Exact-size path of algorithm="single-pass", one of EXACT_MODES.
EXACT_MODE = "lookback"
# Calls of up to this many elements watch the mapped count (cupy_ready.OneReadCall); larger
# ones (whose kernel runs longer than the spin would last, and whose callers may be many
# threads of a batch job) wait in a stream synchronisation, which releases the GIL, and read
# the same word after it.
SPIN_MAX_N = 1 << 22
# The one-read exact path (cupy_exact.run_one_read) is taken when the bytes it moves,
# n*s + 3*k*o (read the input, write the selection to scratch, copy it out), are under
# ONE_READ_MARGIN times those of counting first, 2*n*s + k*o (s: input itemsize, o: output
# bytes per selected element): when the selected fraction is under ONE_READ_MARGIN * s / (2*o)
# (0.4 for values of any dtype, 0.2 for float32 indices). The margin leaves room for the
# copy's launch.
ONE_READ_MARGIN = 0.8
# Every call takes the one-read path, whatever the fraction, while the most it can cost over
# counting first is small: n*(2*o - s) bytes (everything selected: written to scratch and
# copied out, less the second read of the input it saves) at most ONE_READ_ALWAYS_BYTES.
# Counting first costs launches, a plan and a host round trip (~100 us of host time on the
# H100), one read a launch and a copy (a cached ready call, cupy_ready.OneReadCall). Measured
# there (2026-11-25, compact_array per call, 2^22-2^26, p = .05/.5/.95, float32/float64
# values/indices, benchmarks/results/2026-11-25_h100_1862e9a_one_read_ab.txt; the bound
# swept by benchmarks/one_read_threshold.py): up to
# this bound one read was faster at every p (float32 values 2^24: 84/116/151 us against
# 180/177/187 us; 2^26: 169/310/498 against 243/375/532 us), past it slower at p = .95
# (float32 indices 2^25: 415 against 374 us).
ONE_READ_ALWAYS_BYTES = 1 << 28
# Such calls (and repeated compact_into calls) run through a cached ready call
# (cupy_ready.OneReadCall / IntoCall: packed launch, no plan); False: the general path (the
# tests compare both).
FAST_SMALL_CALLS = True
# stable=False with algorithm="auto" lets the call choose its kernel. Up to this many elements
# it takes the single-pass one (order kept all the same): its ready call watches the count in
# mapped host memory, where the hybrid's count is an atomic total, final only at the kernel's
# end, read back by a copy and a stream synchronisation, and its words need a memset per
# call. Measured on one H100 (public_calls.py, float32, p = .05/.5/.95, one run, f561870):
# at 2^20 47.6-60.0 us through the hybrid against 39.7-43.4 us through the single-pass
# kernel; at 2^24 the two were equal (81/113/148 against 79/110/147 us).
UNSTABLE_SINGLE_PASS_MAX_N = SPIN_MAX_N
# A run of chunks (compact_many, compact_runs) once its predicate has selected on the dtype and
# output: its chunks' single-pass kernels chained on the device into outputs sized from that
# fraction over the run's length (cupy_exact._run_chained); False: the run counts first or
# reads once into scratch and copies, as before 2026-12-02 (the tests and benchmarks compare
# both).
CHAINED_RUNS = True
# partition_array's route for values (and both) on the GPU (cupy_split.py): "counted" (count
# -> tile scan -> split at known places: 3n elements moved), "one-pass" (the split by look-back
# with the others written backwards from the end, then that run reversed in place: 2n + 2(n-k)
# moved), or "auto": one pass once the predicate's last call on the dtype selected at least
# SPLIT_ONE_PASS_FROM of its elements, counted before its first call and below. The bytes
# cross at k = n/2, but the look-back costs the one-pass split ~15% over the counted one's at
# the same bytes: one H100, 2^28 float32, each route forced (partition_bench.py, 60e96b6), ms
# counted / one pass at p = .05 1.26 / 2.03, .5 1.26 / 1.47, .6 1.29 / 1.40, .7 1.42 / 1.35,
# .8 1.28 / 1.16, .95 1.35 / 1.07. The tests and the benchmark force each route.
SPLIT_ROUTES = ("auto", "counted", "one-pass")
SPLIT_ROUTE = "auto"
SPLIT_ONE_PASS_FROM = 0.65
# dcx_reverse_tail (the one-pass route's second launch): pairs swapped per thread and round,
# all loaded before any is stored (COPY_BLOCK threads per block).
REVERSE_ITEMS = 8


@dataclass(frozen=True)
class Tuning:
    """Tile shape of the single-pass and hybrid kernels: BLOCK threads x ITEMS elements each;
    and the single-pass look-back's sleeps (``kernels/lookback.cuh``, LookbackPrefix; the
    other kernels take none): ``poll`` ns slept before a lane reads an unpublished
    predecessor again (0: at once), ``wait`` ns slept before the first read (negative: -wait
    ns, only where the first read found a predecessor unpublished). The defaults are the
    measured kernel (``dcx_single_pass<..., 20, 0, ...>``). Sleeps are off in every entry
    until measured (CUB's for sm_90 floats, 688 / 1140 ns, made
    ``compact_into`` 3-5% faster at 2^28 in one A/B of a patched kernel on one H200,
    ``benchmarks/results/2026-12-01_h200_31c3bfe_compaction_lookback_sleeps_ab.md``; measured
    through the package by ``benchmarks/lookback_sleeps_ab.py``)."""

    block: int
    items: int
    poll: int = 20
    wait: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.poll <= 1024 or not -4096 <= self.wait <= 4096:
            raise ValueError(f"look-back sleeps out of range (poll 0..1024 ns, wait "
                             f"-4096..4096 ns): {self}")

    @property
    def tile(self) -> int:
        return self.block * self.items


@dataclass(frozen=True)
class Entry:
    """One row of the table: the tile shape, the single-pass look-back schedule, and why."""

    tuning: Tuning
    variant: str = "classic"
    why: str = ""


# The compute capability every entry was measured on (one H100, sm_90; the sweeps are in
# benchmarks/results/NOTES-gpu.md). Other devices use these entries until measured there.
MEASURED_ON = "90"
_V = "8 vectors of 16 bytes per thread (128 bytes in flight)"
_N = "ITEMS <= 32: one 32-bit flag word per thread"
TABLE = MappingProxyType({
    # (compute capability, algorithm, itemsize) -> Entry
    ("90", "single-pass", 1): Entry(Tuning(256, 32), "classic",
        f"{_N}; early was 13% slower at p=0.05 (ptxas register cap, fewer blocks per SM)"),
    ("90", "single-pass", 2): Entry(Tuning(256, 32), "early",
        f"{_N}; early 7-28% faster than classic for float16 and 0-13% for uint16 (level for "
        "int16) at p=.05-.95, //, % (one H200, 2^26)"),
    ("90", "single-pass", 4): Entry(Tuning(512, 32), "early",
        "512x32 8%/4% faster than 256x32 at p=0.05/0.5 (2% slower at 0.95); early 18-23% "
        "faster than classic at 2^28"),
    ("90", "single-pass", 8): Entry(Tuning(256, 32), "early",
        "256x32 10-13% faster than 256x16 at every p; early 18-23% faster"),
    ("90", "single-pass", 16): Entry(Tuning(256, 8), "classic", f"{_V}; not swept"),
    ("90", "hybrid", 1): Entry(Tuning(256, 32), why=_N),
    ("90", "hybrid", 2): Entry(Tuning(256, 32), why=_N),
    ("90", "hybrid", 4): Entry(Tuning(256, 32), why=f"{_V}; fastest of the hybrid sweep"),
    ("90", "hybrid", 8): Entry(Tuning(256, 16), why=f"{_V}; fastest of the hybrid sweep"),
    ("90", "hybrid", 16): Entry(Tuning(256, 8), why=_V),
})  # fmt: skip
# Entries for predicates whose functor calls NumPy's float divmod (codegen.cuda_functor.
# DIVMOD_CALLS: `%` and `//` of floats, the out-of-line fdivmod_pair and dmod of
# kernels/npy_ops.cuh), over TABLE's. Each of a thread's unrolled items makes a call whose
# live state is kept in registers: at 256 x 32, an 8-byte type's single-pass and scatter
# kernels take 119-128 registers (ptxas, sm_90), two blocks per SM; at 256 x 16, 64-80.
# One H200, public compact_array on 2^26 float64, three A/Bs of two or three rounds (ms,
# 256 x 32 / 256 x 16): `x // 7 == 2` 1.13-1.23 / 0.95-1.11, `x % 5 == 1` 0.84-0.91 /
# 0.70-0.77, `x % 0.75 < 0.25` 0.91-0.94 / 0.89-1.02 (level, 2% slower in one A/B); 256 x 8
# slower than both. `x ** 1.5 < 3` (dpow, also out of line) 0.79-0.86 / 0.90-0.92: powers
# keep TABLE's shape. float16 and float32 were no faster at 16 or 8 items
# (benchmarks/results/2026-12-04_h200_divmod_tile_shape_ab.md).
DIVMOD_TABLE = MappingProxyType({
    ("90", "single-pass", 8): Entry(Tuning(256, 16), "early",
        "256x16 up to 16-17% faster than 256x32 for float64 // and %, level at worst (128 -> "
        "80 registers)"),
})  # fmt: skip

# Benchmarks that sweep tile shapes override entries here (override_tuning), never the table.
_overrides: dict[tuple[str, int], Tuning] = {}
# The single-pass look-back's sleeps (poll, wait) of a benchmark's A/B, over every shape
# (override_lookback_sleeps); None: each tuning's own.
_sleeps: tuple[int, int] | None = None


def _entry(algorithm: str, itemsize: int, cc: str, float_divmod: bool = False) -> Entry:
    # three-pass has no tile shape of its own; its module is keyed by the hybrid's
    alg = "hybrid" if algorithm == "three-pass" else algorithm
    for table in (DIVMOD_TABLE, TABLE) if float_divmod else (TABLE,):
        hit = table.get((cc, alg, itemsize)) or table.get((MEASURED_ON, alg, itemsize))
        if hit is not None:
            return hit
    raise KeyError((cc, alg, itemsize))


def tuning_for(algorithm: str, itemsize: int, cc: str = MEASURED_ON,
               float_divmod: bool = False) -> Tuning:
    """Tile shape of an algorithm for an element size on a compute capability;
    ``float_divmod``: for a predicate that calls NumPy's float divmod (:data:`DIVMOD_TABLE`)."""
    hit = _overrides.get((algorithm, itemsize))
    tuning = hit if hit is not None else _entry(algorithm, itemsize, cc, float_divmod).tuning
    if _sleeps is not None and algorithm == "single-pass":
        tuning = replace(tuning, poll=_sleeps[0], wait=_sleeps[1])
    return tuning


def variant_for(itemsize: int, cc: str = MEASURED_ON) -> str:
    """The single-pass look-back schedule for an element size."""
    return _entry("single-pass", itemsize, cc).variant


def override_tuning(itemsize: int, tuning: Tuning | None,
                    algorithms: tuple[str, ...] = ("single-pass", "hybrid", "three-pass")) -> None:
    """Use ``tuning`` for ``itemsize`` (None: the table's again); for tile-shape sweeps."""
    for alg in algorithms:
        if tuning is None:
            _overrides.pop((alg, itemsize), None)
        else:
            _overrides[(alg, itemsize)] = tuning


def override_lookback_sleeps(poll: int | None, wait: int = 0) -> None:
    """The single-pass look-back's sleeps (:class:`Tuning`'s ``poll`` and ``wait``) for every
    element size, over the table's tile shapes and any override's; ``poll`` None: each
    tuning's own again. For an A/B in one process (``benchmarks/lookback_sleeps_ab.py``),
    never the table. A ready call kept by an earlier call runs the module it was made with:
    ``cupy_calls.forget_ready_calls()`` after a switch."""
    global _sleeps
    if poll is None:
        _sleeps = None
    else:
        Tuning(32, 1, poll, wait)  # the range check
        _sleeps = (poll, wait)


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
