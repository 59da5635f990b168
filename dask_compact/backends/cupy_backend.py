"""CuPy chunk backend: the entry points of the dispatch (``compact``, ``compact_many``,
``compact_masked``, ``compact_into``), the choice of kernel and exact-size path per call, and
the cache of ready calls.

The layer is split by job: ``cupy_tuning`` (algorithms, tile shapes per compute capability
with the measurement behind each, constants shared with the kernels), ``cupy_source`` (which
template instantiations a module holds, its source), ``cupy_modules`` (per-device caches:
compiled modules, functors, grids), ``cupy_launchers`` (one launcher per algorithm with its
typed workspace), ``cupy_ready`` (repeated small calls with packed launches), ``cupy_device``
(copies, count readback), ``cupy_launch`` (the packed ``cuLaunchKernel``). Nothing is
compiled at import time, and importing these modules does not import CuPy (the CI machine
has none; the source builders are used by the compile tests).

Chunk flow (exact-size result, as the dispatch contract and the memory rule of docs/design.md,
Memory, demand: extra device memory per chunk at most the output plus O(n/1024)):

* ``single-pass``, ``EXACT_MODE == "lookback"`` (the default, with the look-back schedule of
  ``cupy_tuning.variant_for``): count kernel (tile aggregates + total) -> read the count ->
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

import contextlib
from typing import Any

import numpy as np

from ..cache import BoundedCache
from ..codegen.cuda_functor import CodegenUnsupported, ctype
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow
from ..predicate.memo import TRACED_UNDER, trace_key
from .cupy_device import (
    by_output,
    check_powers,
    concat_outputs,
    contiguous,
    device_copy,
    head_rows,
    memset0,
    output_empty,
    read_counts,
    read_words,
)
from .cupy_launch import thread_key
from .cupy_launchers import LAUNCHERS, Plan, tile_words, with_count
from .cupy_modules import device_cc, typed_functor
from .cupy_ready import (
    SPIN_MAX_N,
    IntoCall,
    OneReadCall,
    fraction_key,
    learn,
    learned,
    speculated,
)
from .cupy_shaped import forget as forget_shaped
from .cupy_shaped import has_shape, remember_shaped, shape_serves, shaped_call
from .cupy_source import ModuleSpec
from .cupy_tuning import (
    EXACT_MODES,
    OUTPUT_CODES,
    SINGLE_PASS_VARIANTS,
    resolve_algorithm,
    tuning_for,
    variant_for,
)

__all__ = [
    "compact", "compact_many", "compact_masked", "compact_into", "compact_into_public",
    "prepare", "EXACT_MODE", "ONE_READ_ALWAYS_BYTES", "ONE_READ_MARGIN", "FAST_SMALL_CALLS",
    "CHAINED_RUNS", "forget_ready_calls",
]

# Exact-size path of algorithm="single-pass" (cupy_tuning.EXACT_MODES; tests switch it).
EXACT_MODE = "lookback"


def _flatten(a: Any) -> Any:
    return contiguous(a).reshape(-1)


def _plan(
    a: Any, pred: Predicate | None, mask: Any, output: str, algorithm: str,
    variant: str | None = None, exact_mode: str | None = None, check: bool = True,
) -> Plan:
    """Choose the fused kernel or, failing that, the mask path (logged on the predicate path).
    ``check``: test ``a`` for negative integer exponents first (cupy_device.check_powers;
    False for :func:`prepare`'s zeros, which are not the data)."""
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
    cc = device_cc()
    if algorithm != "single-pass":
        variant = "classic"  # one module per (predicate, dtype, algorithm, tuning) elsewhere
    elif variant is None:
        variant = variant_for(dtype.itemsize, cc)
    ctype(dtype)  # raises for dtypes without a device type
    tuning = tuning_for(algorithm, dtype.itemsize, cc)
    if mask is None:
        assert pred is not None
        if pred.path == "fused":
            # What the plan takes from the predicate, kept on it (see Predicate.memo): a
            # repeated call with the same predicate object skips typing, binding and the
            # module spec. None: the fused kernel cannot run it (the mask path below).
            key = ("cupy", dtype, algorithm, variant, tuning)
            if key not in pred.memo:
                try:
                    tp, functor = typed_functor(dtype, pred)
                    shape = (tuning_for(algorithm, dtype.itemsize, cc, float_divmod=True)
                             if functor.float_divmod else tuning)
                    pred.memo[key] = (tp.bind(pred.params),
                                      ModuleSpec(dtype, algorithm, functor, shape, variant),
                                      tp)
                except (CodegenUnsupported, ParamOverflow):
                    pred.memo[key] = None
            fused = pred.memo[key]
            if fused is not None:
                if check:
                    check_powers(fused[2], flat, pred.params)
                # an exponent from the data is checked per call: no ready call (which skips
                # the plan); a constant one passed now holds for the predicate's every call
                return Plan(flat, None, fused[0], fused[1], output, exact_mode,
                            memo=pred.memo, checked=fused[2].data_powers)
        mask = pred.mask(a, cupy)
    m = _flatten(cupy.asarray(mask))
    if m.dtype != np.bool_:
        m = m.astype(np.bool_)
    if m.size != flat.size:
        raise ValueError(f"mask of {m.size} elements for a chunk of {flat.size}")
    spec = ModuleSpec(dtype, algorithm, None, tuning, variant)
    return Plan(flat, m, (), spec, output, exact_mode)


def _run_exact(plans: list[Plan], output: str, bases: list[int],
               counts: list[int] | None = None, run: bool = False) -> Any:
    """Count, allocate exactly, compact: for one chunk or a run of chunks of one task.

    A run is counted first (every chunk's count kernels queued), its counts come back in ONE
    host synchronisation, and then every chunk is compacted into its slice of one exact-size
    output: the output of a run is the concatenation of its chunks' outputs, without a copy.
    ``counts``, if given, receives each plan's selected count. ``run``: a run's call
    (compact_many, compact_runs), which chains its chunks into outputs sized from the
    predicate's previous fraction once it has one (:func:`_run_chained`).
    """

    dtype = plans[0].flat.dtype
    live = [(p, b) for p, b in zip(plans, bases) if p.n]
    got: list[int] = []
    if live and len({p.flat.device.id for p, _ in live}) > 1:
        # Not one device: each chunk on its own device, then one concatenation (rare: a task
        # on a dask-cuda worker sees one GPU).
        parts = [_run_exact([p], output, [b]) for p, b in live]
        got = [len(q[0] if output == "both" else q) for q in parts]
        out = concat_outputs(parts, output)
    else:
        out = None
        if run and _chains(live, output):
            try:
                out = _run_chained(live, output, got)
            except MemoryError:  # its outputs did not fit: as below, from the start
                got.clear()
        if out is None and live and all(_one_read(p, output) for p, _ in live):
            try:
                out = _run_one_read(live, output, got)
            except MemoryError:
                # its n-sized scratch (or scratch and result together) did not fit on the
                # device: counting first needs room for the result alone
                got.clear()
        if out is None:
            try:
                out = _run_count_first(live, output, dtype, got)
            except MemoryError as e:
                e.add_note(out_of_memory_note(live, output))
                raise
    if counts is not None:
        it = iter(got)
        counts.extend(next(it) if p.n else 0 for p in plans)
    return out


def out_of_memory_note(live: list[tuple[Plan, int]], output: str) -> str:
    """What a compaction that ran out of device memory needed, and what to do instead."""
    n = sum(p.n for p, _ in live)
    dtype = live[0][0].flat.dtype if live else np.dtype(np.float64)
    most = n * _out_bytes(np.dtype(dtype), output)
    dev = live[0][0].flat.device.id if live else 0
    return (f"dask_compact: compacting {n:,} {dtype} elements on GPU {dev} ran out of device "
            f"memory after counting first (its result takes up to {most / 2**20:,.1f} MiB, "
            "all of it where every element is selected, and nothing else of that size). "
            "Free device memory (cupy.get_default_memory_pool().free_all_blocks() returns "
            "what CuPy's pool keeps) or compact smaller chunks (map_compact over a dask array "
            "of smaller chunks).")


def _run_count_first(live: list[tuple[Plan, int]], output: str, dtype: np.dtype,
                     sink: list[int] | None = None) -> Any:
    """The exact path that counts first: every chunk's count kernels, one host sync for all
    counts, one exact-size allocation, then the chunks' compactions into their slices."""
    import cupy

    vals = idx = None
    with (live[0][0].flat.device if live else cupy.cuda.Device()):
        # one chunk: its workspace is dead once its output is made, so the thread's is reused
        workspaces = [LAUNCHERS[p.spec.algorithm].count(p, reuse=len(live) == 1)
                      for p, _ in live]
        counts = read_counts([ws.count for ws in workspaces])  # the one host sync
        if sink is not None:
            sink.extend(int(c) for c in counts)
        total = sum(counts)
        if live:
            # a run's fraction too (until 2026-12-02, sixteenth session, only one chunk's:
            # runs of large chunks at high fractions never learned, and never chained)
            learn(live[0][0].memo, live[0][0].spec.dtype, output, total,
                  sum(p.n for p, _ in live))
        vals = output_empty(total, dtype) if output in ("values", "both") else None
        idx = output_empty(total, np.int64) if output in ("indices", "both") else None
        off = 0
        for (p, base), ws, c in zip(live, workspaces, counts):
            if c:
                LAUNCHERS[p.spec.algorithm].main(
                    p, int(base), None if vals is None else vals[off:off + c],
                    None if idx is None else idx[off:off + c], ws, exact=True,
                )
            off += c
    return by_output(vals, idx, output)


# The one-read exact path (below) is taken when the bytes it moves, n*s + 3*k*o (read the
# input, write the selection to scratch, copy it out), are under ONE_READ_MARGIN times those
# of counting first, 2*n*s + k*o (s: input itemsize, o: output bytes per selected element):
# when the selected fraction is under ONE_READ_MARGIN * s / (2*o) (0.4 for values of any
# dtype, 0.2 for float32 indices). The margin leaves room for the copy's launch.
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


def _call_algorithm(algorithm: str, stable: bool, n: int) -> str:
    """The kernel a public call runs (see UNSTABLE_SINGLE_PASS_MAX_N)."""
    if algorithm == "auto" and not stable and n <= UNSTABLE_SINGLE_PASS_MAX_N:
        return "single-pass"
    return resolve_algorithm(algorithm, stable)


def _exact_algorithm(algorithm: str, stable: bool, a: Any, pred: Predicate,
                     output: str) -> str:
    """The kernel an exact-size call (compact_array's) runs: :func:`_call_algorithm`'s, but
    stable=False past UNSTABLE_SINGLE_PASS_MAX_N takes the single-pass kernel once the
    predicate has selected: its speculative call (one read, no copy; OneReadCall._speculate)
    beats the hybrid's count first or scratch and copy (one H200, 2^28 float32, p = .5 /
    .95: 561-564 / 691-693 us against 831-941 / 956-980 us; at p = .05 level), and keeps the
    order too. The same choice for the call and for the repeated call kept after it."""
    alg = _call_algorithm(algorithm, stable, a.size)
    if (alg == "hybrid" and algorithm == "auto" and FAST_SMALL_CALLS
            and _selected_before(pred, np.dtype(a.dtype), output)):
        return "single-pass"
    return alg


def _out_bytes(dtype: np.dtype, output: str) -> int:
    s = dtype.itemsize
    return {"values": s, "indices": 8, "both": s + 8}[output]


def always_reads_once(n: int, dtype: np.dtype, output: str) -> bool:
    """Whether a call on ``n`` elements reads once whatever it selects (see
    ONE_READ_ALWAYS_BYTES)."""
    return n * (2 * _out_bytes(dtype, output) - dtype.itemsize) <= ONE_READ_ALWAYS_BYTES


def _reads_once(memo: dict | None, dtype: np.dtype, output: str, n: int) -> bool:
    """Whether a call on ``n`` elements of ``dtype`` compacts in one read of its input:
    always while that costs little (always_reads_once), else when the predicate's previous
    call on this dtype and output selected a small enough fraction (its first call counts
    first)."""
    if memo is None:
        return False
    if always_reads_once(n, dtype, output):
        return True
    frac = learned(memo, dtype, output)
    if frac is None:
        return False
    return frac < ONE_READ_MARGIN * dtype.itemsize / (2 * _out_bytes(dtype, output))


def _one_read(plan: Plan, output: str) -> bool:
    return plan.spec.algorithm != "three-pass" and _reads_once(plan.memo, plan.spec.dtype,
                                                                output, plan.n)


def _run_one_read(live: list[tuple[Plan, int]], output: str,
                  sink: list[int] | None = None) -> Any:
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
        off = 0
        for j, (p, base) in enumerate(live):
            # this thread's words for the stream, zeroed again in stream order per chunk; the
            # chunk's total lands in counts[j]
            ws = with_count(alg, tile_words(alg, p.tiles, exact=False, reuse=True),
                            counts[j:j + 1])
            LAUNCHERS[alg].main(p, int(base), None if vals is None else vals[off:off + p.n],
                         None if idx is None else idx[off:off + p.n], ws)
            off += p.n
        got = read_words(counts)  # the one host sync
        if sink is not None:
            sink.extend(int(c) for c in got)
        total = sum(got)
        learn(plan0.memo, plan0.spec.dtype, output, total, total_n)
        out_v = None if vals is None else output_empty(total, dtype)
        out_i = None if idx is None else output_empty(total, np.int64)
        src = dst = 0
        for (p, _), k in zip(live, got):
            for out, scratch in ((out_v, vals), (out_i, idx)):
                if out is not None and k:
                    device_copy(out, dst, scratch, src, k)
            src += p.n
            dst += k
    return by_output(out_v, out_i, output)


# A run of chunks (compact_many, compact_runs) once its predicate has selected on the dtype and
# output: its chunks' single-pass kernels chained on the device into outputs sized from that
# fraction over the run's length (_run_chained); False: the run counts first or reads once
# into scratch and copies, as before 2026-12-02 (the tests and benchmarks compare both).
CHAINED_RUNS = True


def _chains(live: list[tuple[Plan, int]], output: str) -> bool:
    """Whether the run ``live`` (not empty, one device) is chained (:func:`_run_chained`):
    every chunk through the single-pass kernel with the fused predicate, of one dtype, and
    the predicate has selected on that dtype and output before."""
    if not CHAINED_RUNS or not live:
        return False
    plan0 = live[0][0]
    if plan0.memo is None or learned(plan0.memo, plan0.spec.dtype, output) is None:
        return False
    return all(p.spec.algorithm == "single-pass" and p.mask is None and p.memo is plan0.memo
               and p.spec.dtype == plan0.spec.dtype for p, _ in live)


def _run_chained(live: list[tuple[Plan, int]], output: str,
                 sink: list[int] | None = None) -> Any:
    """A run's exact-size output in one read of each chunk, with no scratch and no copy: the
    run's outputs hold :func:`cupy_ready.speculated` of the predicate's previous fraction
    over the run's length (``room``), and the chunks' single-pass kernels are chained on the
    device (:func:`queue_chain`): chunk j's kernel takes its first tile's place from a
    device word that chunk j - 1's last tile stored (its start plus its count; zeroed for
    the first chunk), so every place is in the run's outputs, and writes nothing at or past
    ``room`` (kernels/single_pass.cu, ``d_start`` and ``cap``). Kernels of one stream run
    in order: no kernel waits on another. The chunks' ends come back in one host
    synchronisation; a run that selected no more than the room returns its outputs' first
    ``total`` elements, one that selected more (every count is whole, whatever was written)
    runs again where it overflowed (:func:`_chained_overflow`). OneReadCall._speculate does
    the same for one chunk; memory likewise: the result keeps its allocation alive, at most
    0.5% + 4 sqrt(k) + 256 elements over k plus the size class."""
    plan0 = live[0][0]
    dtype, memo = plan0.flat.dtype, plan0.memo
    frac = learned(memo, plan0.spec.dtype, output)
    assert frac is not None
    total_n = sum(p.n for p, _ in live)
    room = speculated(frac, total_n)
    with plan0.flat.device:
        vals = output_empty(room, dtype) if output != "indices" else None
        idx = output_empty(room, np.int64) if output != "values" else None
        ends = read_words(queue_chain(live, vals, idx, room))  # the one host sync
        total = ends[-1]
        if sink is not None:
            sink.extend(e - s for s, e in zip([0, *ends], ends))
        learn(memo, plan0.spec.dtype, output, total, total_n)
        if total > room:
            return _chained_overflow(live, output, vals, idx, ends, room)
    return by_output(None if vals is None else head_rows(vals, total),
                     None if idx is None else head_rows(idx, total), output)


def queue_chain(live: list[tuple[Plan, int]], vals: Any, idx: Any, room: int) -> Any:
    """Queue the chained kernels of a run (:func:`_run_chained`) into ``vals`` / ``idx``,
    writing nothing at or past ``room``; returns the device words of the chunks' ends in the
    run's selection (chunk j's start plus its whole count), final once the stream gets
    there. The current device is the chunks'."""
    import cupy

    # starts[j]: where chunk j's selection starts; chunk j's kernel stores starts[j + 1]
    starts = cupy.empty(len(live) + 1, dtype=np.uint64)
    memset0(starts[:1])
    cap = np.uint64(room)
    for j, (p, base) in enumerate(live):
        # this thread's words for the stream, zeroed again in stream order per chunk
        ws = with_count("single-pass",
                        tile_words("single-pass", p.tiles, exact=False, reuse=True),
                        starts[j + 1:j + 2])
        LAUNCHERS["single-pass"].main(p, int(base), vals, idx, ws, cap=cap,
                                      start=starts[j:j + 1])
    return starts[1:]


def _chained_overflow(live: list[tuple[Plan, int]], output: str, vals: Any, idx: Any,
                      ends: list[int], room: int) -> Any:
    """A chained run that selected more than its outputs' ``room`` (ends: each chunk's end
    in the run's selection, whole counts): exact-size outputs, into which the chunks that
    ended within the room are copied (one copy for all of them: they were written whole) and
    the rest run again into their places, unbounded (a second read of those chunks, as
    counting first costs)."""
    dtype = live[0][0].flat.dtype
    total = ends[-1]
    out_v = output_empty(total, dtype) if vals is not None else None
    out_i = output_empty(total, np.int64) if idx is not None else None
    done = 0  # the selection of the chunks written whole
    j = 0
    while ends[j] <= room:
        done = ends[j]
        j += 1
    if done:
        for out, written in ((out_v, vals), (out_i, idx)):
            if out is not None:
                device_copy(out, 0, written, 0, done)
    at = done
    for (p, base), end in zip(live[j:], ends[j:]):
        if end > at:
            ws = tile_words("single-pass", p.tiles, exact=False, reuse=True)
            LAUNCHERS["single-pass"].main(p, int(base),
                                          None if out_v is None else out_v[at:end],
                                          None if out_i is None else out_i[at:end], ws)
        at = end
    return by_output(out_v, out_i, output)


# (kind, thread (cupy_launch.thread_key), id(predicate), dtype, output, algorithm, n, device,
# stream) -> (predicate, its OneReadCall or IntoCall, or None where the general path runs)
_ready_calls: BoundedCache[tuple, tuple] = BoundedCache("ready calls")


def _ready_call(kind: type, a: Any, pred: Predicate, output: str, algorithm: str,
                stream_ptr: int, stream: Any = None) -> Any:
    """The ready call of ``kind`` for ``a`` (C-contiguous, on the current device, not empty)
    and a fused predicate, or None where the general path runs. ``stream``: the stream the
    call will run on where it is not the current one (``compact_into``'s ``stream=``)."""
    import cupy

    if a.size == 0 or algorithm == "three-pass" or pred.path != "fused":
        return None
    if not a.flags.c_contiguous:
        return None
    dev = a.data.device_id
    if dev != cupy.cuda.runtime.getDevice():
        return None
    key = (kind, thread_key(), id(pred), a.dtype, output, algorithm, a.size, dev,
           stream_ptr)
    hit = _ready_calls.get(key)
    if hit is not None and hit[0] is pred:
        return hit[1]
    plan = _plan(a, pred, None, output, algorithm)
    call = None
    if plan.memo is not None and plan.mask is None and not plan.checked:
        try:
            # its words made in the order of the stream it runs on: freed when the entry is
            # evicted, they go back to that stream's share of CuPy's pool. Made on the current
            # stream (until 2026-12-01, a poisoned-pool probe), they went back to that one's,
            # whose next allocation could be handed them while the call's last launch on
            # `stream` still used them
            with contextlib.nullcontext() if stream is None else stream:
                call = kind(plan, output)
        except AttributeError:  # a CuPy without RawKernel.kernel or the driver's launch
            call = None
    # the predicate held: its id is not reused while the entry lives; None: the general path
    _ready_calls.put(key, (pred, call))
    return call


def forget_ready_calls() -> None:
    """Drop the ready and repeated calls kept in this process: a kept call runs the module it
    was made with, so a benchmark that changes a tuning between calls
    (``cupy_tuning.override_tuning``, ``override_lookback_sleeps``) drops them, and the next
    call plans with the new one."""
    from .cupy_into_repeat import forget as forget_into

    _ready_calls.clear()
    _repeat_calls.clear()
    forget_shaped()
    forget_into()


def _selected_before(pred: Predicate, dtype: np.dtype, output: str) -> bool:
    """Whether ``pred`` has run on ``dtype`` for ``output`` before: its single-pass ready call
    then writes into outputs sized from that call's fraction (OneReadCall._speculate), at any
    fraction."""
    return learned(getattr(pred, "memo", None), dtype, output) is not None


def _one_read_call(a: Any, pred: Predicate, output: str, algorithm: str) -> Any:
    """The ready one-read call for ``a`` where this call reads once (see _reads_once: small,
    or after a call that selected little; or, with the single-pass kernel, after any call of
    the predicate on this dtype and output: OneReadCall's speculative outputs), or None (the
    general path). A larger call gains
    as much from it as a small one: the general path's plan and launches cost ~85 us of host
    time at 2^24 on the H100 (154 us a call against 69 us for compact_into's ready call)."""
    import cupy

    # up to ONE_READ_ALWAYS_BYTES / 32 elements every dtype and output reads once (2o - s is
    # at most 32 bytes: complex128 "both"): a small call skips the test
    if a.size > ONE_READ_ALWAYS_BYTES >> 5:
        dtype = np.dtype(a.dtype)
        speculates = algorithm == "single-pass" and _selected_before(pred, dtype, output)
        if not speculates and not _reads_once(getattr(pred, "memo", None), dtype, output,
                                              a.size):
            return None
    return _ready_call(OneReadCall, a, pred, output, algorithm,
                       cupy.cuda.get_current_stream().ptr)


# compact_array's repeated call: (thread, the caller's predicate as a key, dtype, n, output,
# stable, algorithm, stream) -> (the device, its OneReadCall, the predicate object). A hit
# skips the public checks, the dispatch and the ready-call lookup (5-6 us of a 30 us call on
# the H100 host), which an equal predicate already passed on that dtype. The key: a string
# itself; a function its trace key (predicate/memo.py: its code and the current values of
# what it reads, so a rebound constant is a new key, as for the trace memo); a Predicate its
# identity (held in the entry, so the id is not reused while it lives). Anything else is not
# kept.
_repeat_calls: BoundedCache[tuple, tuple] = BoundedCache("repeated calls")


def caller_key(pred_like: Any) -> Any:
    """The predicate a caller passed, as a repeated call's key (see above), or None where it
    is not kept. A Predicate's key is its identity: the entry must hold it."""
    if isinstance(pred_like, str):
        return pred_like
    if isinstance(pred_like, Predicate):
        return ("predicate", id(pred_like))
    return trace_key(pred_like)


def kept_key(pred_like: Any, pred: Predicate) -> Any:
    """:func:`caller_key` for keeping a call that ran ``pred``, made from ``pred_like``: None
    where ``pred_like`` is a function whose key now is not the one ``pred`` was traced under.
    A thread rebinding a constant the function reads while the call ran would otherwise keep
    a call that compacted with one value under the other's key, and every later call with the
    other value would run it (a new-user probe found that race in the trace memo, 2026-11-30:
    predicate/memo.py trace_under_key). A mask-path predicate runs the function itself."""
    pk = caller_key(pred_like)
    if pk is None or isinstance(pred_like, (str, Predicate)) or pred.expr is None:
        return pk
    return pk if pred.memo.get(TRACED_UNDER) == pk else None


def _repeat_key(a: Any, pred_like: Any, output: str, stable: bool, algorithm: str,
                pred: Predicate | None = None) -> tuple | None:
    import cupy

    pk = caller_key(pred_like) if pred is None else kept_key(pred_like, pred)
    if pk is None:
        return None
    return (thread_key(), pk, a.dtype, a.size, output, stable, algorithm,
            cupy.cuda.get_current_stream().ptr)


def repeated_call(a: Any, pred_like: Any, output: str, stable: bool, algorithm: str) -> Any:
    """The one-read call that :func:`remember_call` kept for this thread, predicate, dtype,
    size, stream and arguments, if ``a`` is C-contiguous on that call's device, the current
    one; else None (the public call checks and dispatches as usual)."""
    if not FAST_SMALL_CALLS:
        return None
    try:
        key = _repeat_key(a, pred_like, output, stable, algorithm)
        hit = None if key is None else _repeat_calls.get(key)
    except TypeError:  # an unhashable argument: the checks say what is wrong with it
        return None
    if not a.flags.c_contiguous:
        return None
    import cupy

    if hit is None:
        # a string or function whose numbers alone differ from a kept one's: its shape's
        # call, rebound
        if key is None or a.data.device_id != cupy.cuda.runtime.getDevice():
            return None
        if not shape_serves(pred_like, key):
            return None  # no shape, or a function's value again: the checked call keeps its own
        return shaped_call(a, pred_like, key)
    dev = hit[0]
    if a.data.device_id != dev or cupy.cuda.runtime.getDevice() != dev:
        return None
    return hit[1]


def remember_call(a: Any, pred_like: Any, pred: Predicate, output: str, stable: bool,
                  algorithm: str) -> None:
    """After a public call on ``a`` (checked, native byte order) that ran its ready one-read
    call: keep that call under ``pred_like``, the predicate the caller passed, for
    :func:`repeated_call`. For sizes that read once whatever the previous call selected (the
    choice needs no memo), and for larger ones where the single-pass kernel runs and the
    predicate has selected on this dtype and output: the checked call then always takes the
    ready call too, which writes into outputs sized from the last fraction
    (OneReadCall._speculate). Without it a 2^24 float32 call paid the checks and dispatch
    each time: one H200, two rounds, p = .05 / .5 / .95, 84-126 us a call, 0.57-0.70x CUB
    into a preallocated buffer; kept, 56-98 us, 0.81-1.01x (2^28: 1.08-1.25x -> 1.18-1.44x;
    2026-12-04_h200_repeated_large_calls_ab.md)."""
    if not FAST_SMALL_CALLS or algorithm == "scan" or not a.dtype.isnative:
        return
    key = _repeat_key(a, pred_like, output, stable, algorithm, pred)
    if key is None:
        return
    import cupy

    alg = _exact_algorithm(algorithm, stable, a, pred, output)
    if a.size > ONE_READ_ALWAYS_BYTES >> 5 and not (
            alg == "single-pass" and _selected_before(pred, np.dtype(a.dtype), output)):
        return
    call = _ready_call(OneReadCall, a, pred, output, alg, cupy.cuda.get_current_stream().ptr)
    if call is not None:
        _repeat_calls.put(key, (a.data.device_id, call, pred_like))
        # a shape's call serves texts of other numbers from this text's fraction: only where
        # a call reads once whatever it selects (a larger one would size a new threshold's
        # outputs from another's fraction, where its checked first call counts first)
        if has_shape(pred_like) and a.size <= ONE_READ_ALWAYS_BYTES >> 5:
            remember_shaped(a, pred_like, pred, key, output, alg)


# ----------------------------------------------------------------------------- public ---------


def compact(
    a: Any, pred: Predicate, output: str, stable: bool, algorithm: str, index_base: int,
    *, variant: str | None = None, exact_mode: str | None = None,
) -> Any:
    """Dispatch entry for CuPy chunks (see dask_compact.dispatch): exact-length 1-D results.

    ``variant`` / ``exact_mode`` (benchmarks, tests) override the tuning table's look-back
    schedule / EXACT_MODE.
    """
    alg = _exact_algorithm(algorithm, stable, a, pred, output)
    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    if variant is None and exact_mode is None and FAST_SMALL_CALLS:
        call = _one_read_call(a, pred, output, alg)
        if call is not None:
            try:
                return call(a, index_base)
            except MemoryError:
                pass  # no room for its n-sized scratch: the general path below counts first
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
    plan = _plan(sample, pred, None, output, alg, check=False)
    key = fraction_key(plan.spec.dtype, output)
    had = plan.memo is not None and key in plan.memo
    _run_count_first([(plan, 0)], output, plan.flat.dtype)
    if plan.memo is not None and plan.spec.algorithm != "three-pass":  # as _one_read allows
        _run_one_read([(plan, 0)], output)
    cupy.cuda.get_current_stream().synchronize()
    if plan.memo is not None and not had:
        plan.memo.pop(key, None)


def _run_algorithm(algorithm: str, stable: bool, blocks: list[Any], pred: Predicate,
                   output: str) -> str:
    """The kernel a run of chunks runs: ``resolve_algorithm``'s, but stable=False takes the
    single-pass kernel once the predicate has selected on the run's dtype and output, as
    :func:`_exact_algorithm` for one chunk: its chained run (one read, no scratch, no copy)
    beats the hybrid's count first or scratch and copy, and keeps the order too."""
    alg = resolve_algorithm(algorithm, stable)
    if (alg == "hybrid" and algorithm == "auto" and CHAINED_RUNS and blocks
            and _selected_before(pred, np.dtype(blocks[0].dtype), output)):
        return "single-pass"
    return alg


def compact_many(
    blocks: list[Any], pred: Predicate, output: str, stable: bool, algorithm: str, bases: list[int],
) -> Any:
    """Dispatch entry for a run of CuPy chunks compacted by one task: the concatenation of
    their outputs (``bases[i]`` is chunk i's global index start), with one host sync."""
    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    alg = _run_algorithm(algorithm, stable, blocks, pred, output)
    return _run_exact([_plan(b, pred, None, output, alg) for b in blocks], output, list(bases),
                      run=True)


def compact_runs(
    runs: list[list[Any]], pred: Predicate, output: str, stable: bool, algorithm: str,
    bases: list[list[int]],
) -> tuple:
    """Dispatch entry for every run of chunks one worker thread holds (one task): one output
    per run, all chunks counted with ONE host sync and compacted into one exact-size
    allocation, of which each run's output is a view (a sync per run cost a round trip each
    where Dask's placement leaves runs of one chunk)."""
    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    alg = _run_algorithm(algorithm, stable, [b for r in runs for b in r], pred, output)
    plans = [_plan(b, pred, None, output, alg) for r in runs for b in r]
    counts: list[int] = []
    out = _run_exact(plans, output, [int(b) for bs in bases for b in bs], counts, run=True)
    pieces, at, j = [], 0, 0
    for r in runs:
        k = sum(counts[j:j + len(r)])
        j += len(r)
        if output == "both":
            pieces.append((out[0][at:at + k], out[1][at:at + k]))
        else:
            pieces.append(out[at:at + k])
        at += k
    return tuple(pieces)


def compact_masked(a: Any, mask: Any, output: str, index_base: int, algorithm: str = "auto") -> Any:
    """Dispatch entry: compact ``a`` where the boolean ``mask`` (same shape) is true."""
    import cupy

    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    if np.dtype(mask.dtype) != np.bool_:
        # As the NumPy backend: a 0/2 uint8 chunk of a mask declared bool is a caller's error,
        # not a selection of its nonzeros (NumPy indexing would gather by the values).
        raise TypeError(f"mask must be a boolean array, got dtype {mask.dtype}")
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
    CuPy array, or a new int64 one), as CUB's ``DeviceSelect`` leaves it. Entries past the
    count are left untouched, which the tests check with poisoned buffers; the benchmarks time
    this path against CUB. ``variant`` overrides the tuning table's look-back schedule.
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
                count = cupy.empty(1, dtype=np.int64)
            if plan.n == 0:
                memset0(count)
                return count
            capturing = _capturing(stream)
            launcher = LAUNCHERS[alg]
            if alg == "three-pass":
                ws = launcher.count(plan)
                launcher.main(plan, index_base, out_values, out_indices, ws)
                cupy.cuda.runtime.memcpyAsync(count.data.ptr, ws.count.data.ptr, 8,
                                              cupy.cuda.runtime.memcpyDeviceToDevice,
                                              stream.ptr)
            else:
                # Graph capture: words of its own that the graph keeps using; otherwise this
                # thread's words for the stream, zeroed in stream order (a call's memset runs
                # after the previous call's kernel).
                ws = with_count(alg, tile_words(alg, plan.tiles, exact=False,
                                                reuse=not capturing), count)
                launcher.main(plan, index_base, out_values, out_indices, ws)
            if capturing:
                _kept_for_graphs.append((ws, plan.flat, plan.mask))
    return count


# What calls captured into CUDA graphs use (tile state, copies of inputs): never freed, since
# a graph may be replayed at any time; O(n/1024) bytes per captured call on contiguous input.
_kept_for_graphs: list[tuple] = []


def compact_into_public(
    a: Any, pred: Predicate, output: str, out_values: Any, out_indices: Any, count: Any,
    stable: bool, algorithm: str, stream: Any,
) -> Any:
    """Dispatch entry of :func:`dask_compact.compact_into` (arguments already checked)."""
    import cupy

    alg = _call_algorithm(algorithm, stable, a.size)
    s = cupy.cuda.get_current_stream() if stream is None else stream
    if count is None:
        # in the order of the stream that writes it: CuPy's pool hands out a block freed on
        # the current stream at once, that stream's work still queued on it included, so a
        # count made there (until 2026-12-01) could be written over by that work after the
        # call had stored the count on another stream (a poisoned-pool probe)
        with a.device, s:
            count = cupy.empty(1, dtype=np.int64)
    if FAST_SMALL_CALLS:
        # a call captured into a graph takes the general path: its words must be its own
        if not _capturing(s):
            call = _ready_call(IntoCall, a, pred, output, alg, s.ptr, stream)
            if call is not None:
                return call(a, out_values, out_indices, count, s.ptr)
    return compact_into(a, pred, out_values, out_indices, algorithm=alg, count=count,
                        stream=stream)


def _capturing(stream: Any) -> bool:
    """Whether ``stream`` is capturing a CUDA graph (the legacy default stream never is)."""
    return stream.ptr not in (0, 1) and stream.is_capturing()
