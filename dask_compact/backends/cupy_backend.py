"""CuPy chunk backend: the entry points of the dispatch (``compact``, ``compact_many``,
``compact_runs``, ``compact_masked``, ``compact_into``, ``compact_into_public``, ``prepare``).
Each picks its kernel (:mod:`.cupy_calls`), takes a ready call where one serves, else plans
and sizes its output exactly (:mod:`.cupy_exact`).

The layer is split by job: ``cupy_tuning`` (algorithms, tile shapes per compute capability
with the measurement behind each, constants shared with the kernels, the exact paths'
switches), ``cupy_source`` (which template instantiations a module holds, its source),
``cupy_modules`` (per-device caches: compiled modules, functors, grids), ``cupy_launchers``
(one launcher per algorithm with its typed workspace), ``cupy_exact`` (the plan and the
exact-size paths: count first, one read, chained runs), ``cupy_calls`` (the kernel a call
runs, the ready and repeated calls kept for it), ``cupy_ready`` (the ready calls: packed
launches), ``cupy_device`` (copies, count readback, graph capture), ``cupy_launch`` (the
packed ``cuLaunchKernel``). Nothing is compiled at import time, and importing these modules
does not import CuPy (the CI machine has none; the source builders are used by the compile
tests).

:func:`compact_into` is the internal entry that writes into preallocated outputs of capacity
``n`` and returns the device count without any host synchronisation (benchmarks, tests with
poisoned buffers). Only ``compact``/``compact_masked`` read a count (one per chunk).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..predicate.core import Predicate
from . import cupy_calls as calls
from . import cupy_exact as exact
from . import cupy_tuning as tuning
from .cupy_calls import forget_ready_calls
from .cupy_device import capturing, kept_for_graphs, memset0
from .cupy_launchers import LAUNCHERS, tile_words, with_count
from .cupy_ready import IntoCall, fraction_key
from .cupy_tuning import OUTPUT_CODES, resolve_algorithm

__all__ = [
    "compact", "compact_many", "compact_runs", "compact_masked", "compact_into",
    "compact_into_public", "prepare", "forget_ready_calls",
]


def compact(
    a: Any, pred: Predicate, output: str, stable: bool, algorithm: str, index_base: int,
    *, variant: str | None = None, exact_mode: str | None = None,
) -> Any:
    """Dispatch entry for CuPy chunks (see dask_compact.dispatch): exact-length 1-D results.

    ``variant`` / ``exact_mode`` (benchmarks, tests) override the tuning table's look-back
    schedule / EXACT_MODE.
    """
    alg = calls.exact_algorithm(algorithm, stable, a, pred, output)
    if output not in OUTPUT_CODES:
        raise ValueError(f"output must be values, indices or both; got {output!r}")
    if variant is None and exact_mode is None and tuning.FAST_SMALL_CALLS:
        call = calls.one_read_call(a, pred, output, alg)
        if call is not None:
            try:
                return call(a, index_base)
            except MemoryError:
                pass  # no room for its n-sized scratch: the general path below counts first
    plan = exact.make_plan(a, pred, None, output, alg, variant, exact_mode)
    return exact.run_exact([plan], output, [index_base])


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
    plan = exact.make_plan(sample, pred, None, output, alg, check=False)
    key = fraction_key(plan.spec.dtype, output)
    had = plan.memo is not None and key in plan.memo
    exact.run_count_first([(plan, 0)], output, plan.flat.dtype)
    # as cupy_exact._one_read allows
    if plan.memo is not None and plan.spec.algorithm != "three-pass":
        exact.run_one_read([(plan, 0)], output)
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
    if (alg == "hybrid" and algorithm == "auto" and tuning.CHAINED_RUNS and blocks
            and calls.selected_before(pred, np.dtype(blocks[0].dtype), output)):
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
    plans = [exact.make_plan(b, pred, None, output, alg) for b in blocks]
    return exact.run_exact(plans, output, list(bases), run=True)


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
    plans = [exact.make_plan(b, pred, None, output, alg) for r in runs for b in r]
    counts: list[int] = []
    out = exact.run_exact(plans, output, [int(b) for bs in bases for b in bs], counts, run=True)
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
    plan = exact.make_plan(a, None, cupy.asarray(mask), output, alg)
    return exact.run_exact([plan], output, [index_base])


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
        plan = exact.make_plan(a, pred, mask, output, alg, variant)
        for o in (out_values, out_indices):
            if o is not None and (o.size < plan.n or not o.flags.c_contiguous):
                raise ValueError("outputs must be contiguous with capacity >= a.size")
        with plan.flat.device:
            if count is None:
                count = cupy.empty(1, dtype=np.int64)
            if plan.n == 0:
                memset0(count)
                return count
            in_capture = capturing(stream)
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
                                                reuse=not in_capture), count)
                launcher.main(plan, index_base, out_values, out_indices, ws)
            if in_capture:
                kept_for_graphs.append((ws, plan.flat, plan.mask))
    return count


def compact_into_public(
    a: Any, pred: Predicate, output: str, out_values: Any, out_indices: Any, count: Any,
    stable: bool, algorithm: str, stream: Any,
) -> Any:
    """Dispatch entry of :func:`dask_compact.compact_into` (arguments already checked)."""
    import cupy

    alg = calls.call_algorithm(algorithm, stable, a.size)
    s = cupy.cuda.get_current_stream() if stream is None else stream
    if count is None:
        # in the order of the stream that writes it: CuPy's pool hands out a block freed on
        # the current stream at once, that stream's work still queued on it included, so a
        # count made there (until 2026-12-01) could be written over by that work after the
        # call had stored the count on another stream (a poisoned-pool probe)
        with a.device, s:
            count = cupy.empty(1, dtype=np.int64)
    if tuning.FAST_SMALL_CALLS:
        # a call captured into a graph takes the general path: its words must be its own
        if not capturing(s):
            call = calls.ready_call(IntoCall, a, pred, output, alg, s.ptr, stream)
            if call is not None:
                return call(a, out_values, out_indices, count, s.ptr)
    return compact_into(a, pred, out_values, out_indices, algorithm=alg, count=count,
                        stream=stream)
