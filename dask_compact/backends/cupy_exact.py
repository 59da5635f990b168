"""The exact-size output of one CuPy chunk or a run of chunks, by the general path: the plan
(fused kernel or mask path), then one of three ways to size the output exactly.

* Count first (:func:`run_count_first`): every chunk's count kernels, one host sync for all
  counts, one exact-size allocation, then each chunk compacted into its slice. By algorithm:

  - ``single-pass``, ``EXACT_MODE == "lookback"`` (the default, with the look-back
    schedule of ``cupy_tuning.variant_for``): count kernel (tile aggregates + total) -> read the
    count -> allocate -> the single-pass look-back kernel, which finds every aggregate already
    published. ``"prefix"``: count kernel (tile counts) -> one-block scan of the tile counts
    (exclusive tile prefixes + total) -> read the one count -> allocate the output -> the
    scatter kernel (tile code of the hybrid, each tile's place read from its prefix: order
    kept, no look-back).
  - ``hybrid``: count kernel -> read the count -> allocate -> atomic-offset kernel (unordered).
  - ``three-pass`` (the published algorithm): predicate bitmask + group counts -> scan (total)
    -> read the count -> allocate -> scatter from the bitmask.

* One read (:func:`run_one_read`, where the predicate's last fraction says it moves fewer
  bytes, see ``cupy_tuning.ONE_READ_MARGIN``): each chunk into n-sized scratch, the counts in
  one sync, each selection copied into one exact-size array.
* Chained (:func:`_run_chained`, a run of chunks once its predicate has selected): the
  chunks' single-pass kernels chained on the device into outputs sized from that fraction.

Memory (the dispatch contract and docs/design.md, Memory): extra device memory per chunk at
most the output plus O(n/1024), but the one-read path's scratch (the run's n elements).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..codegen.cuda_functor import CodegenUnsupported, ctype
from ..predicate.core import Predicate
from ..predicate.expr import ParamOverflow
from ..validate import output_bytes
from . import cupy_tuning
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
from .cupy_launchers import LAUNCHERS, Plan, tile_words, with_count
from .cupy_modules import device_cc, typed_functor
from .cupy_ready import learn, learned, speculated
from .cupy_source import ModuleSpec
from .cupy_tuning import EXACT_MODES, SINGLE_PASS_VARIANTS, tuning_for, variant_for

__all__ = ["make_plan", "run_exact", "run_count_first", "run_one_read", "reads_once",
           "always_reads_once", "queue_chain", "out_of_memory_note"]


def _flatten(a: Any) -> Any:
    return contiguous(a).reshape(-1)


def make_plan(
    a: Any, pred: Predicate | None, mask: Any, output: str, algorithm: str,
    variant: str | None = None, exact_mode: str | None = None, check: bool = True,
) -> Plan:
    """Choose the fused kernel or, failing that, the mask path (logged on the predicate path).
    ``check``: test ``a`` for negative integer exponents first (cupy_device.check_powers;
    False for :func:`prepare`'s zeros, which are not the data)."""
    import cupy

    exact_mode = cupy_tuning.EXACT_MODE if exact_mode is None else exact_mode
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


def run_exact(plans: list[Plan], output: str, bases: list[int],
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
        parts = [run_exact([p], output, [b]) for p, b in live]
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
                out = run_one_read(live, output, got)
            except MemoryError:
                # its n-sized scratch (or scratch and result together) did not fit on the
                # device: counting first needs room for the result alone
                got.clear()
        if out is None:
            try:
                out = run_count_first(live, output, dtype, got)
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
    most = n * output_bytes(np.dtype(dtype).itemsize, output)
    dev = live[0][0].flat.device.id if live else 0
    return (f"dask_compact: compacting {n:,} {dtype} elements on GPU {dev} ran out of device "
            f"memory after counting first (its result takes up to {most / 2**20:,.1f} MiB, "
            "all of it where every element is selected, and nothing else of that size). "
            "Free device memory (cupy.get_default_memory_pool().free_all_blocks() returns "
            "what CuPy's pool keeps) or compact smaller chunks (map_compact over a dask array "
            "of smaller chunks).")


def run_count_first(live: list[tuple[Plan, int]], output: str, dtype: np.dtype,
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


def always_reads_once(n: int, dtype: np.dtype, output: str) -> bool:
    """Whether a call on ``n`` elements reads once whatever it selects (see
    ``cupy_tuning.ONE_READ_ALWAYS_BYTES``)."""
    most = n * (2 * output_bytes(dtype.itemsize, output) - dtype.itemsize)
    return most <= cupy_tuning.ONE_READ_ALWAYS_BYTES


def reads_once(memo: dict | None, dtype: np.dtype, output: str, n: int) -> bool:
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
    margin = cupy_tuning.ONE_READ_MARGIN
    return frac < margin * dtype.itemsize / (2 * output_bytes(dtype.itemsize, output))


def _one_read(plan: Plan, output: str) -> bool:
    return plan.spec.algorithm != "three-pass" and reads_once(plan.memo, plan.spec.dtype,
                                                                output, plan.n)


def run_one_read(live: list[tuple[Plan, int]], output: str,
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


def _chains(live: list[tuple[Plan, int]], output: str) -> bool:
    """Whether the run ``live`` (not empty, one device) is chained (:func:`_run_chained`):
    every chunk through the single-pass kernel with the fused predicate, of one dtype, and
    the predicate has selected on that dtype and output before."""
    if not cupy_tuning.CHAINED_RUNS or not live:
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
