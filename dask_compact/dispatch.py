"""Chunk-type dispatch: which backend compacts a NumPy chunk, which a CuPy one.

Follows dask-image's pattern (``dask.utils.Dispatch`` with ``register_lazy``): the CuPy backend
is registered lazily, so importing dask_compact never imports CuPy, and the graph code never
asks what kind of chunk it holds.

Backend contract (both functions, every backend):

``compact_chunk(a, pred, output, stable, algorithm, index_base) -> out``
    ``a`` any shape (flattened in C order); ``pred`` a :class:`~dask_compact.predicate.Predicate`;
    ``output`` in {"values", "indices", "both"}; ``index_base`` an int added to every index
    (the chunk's global start), so indices come out global without another pass.
    Returns a 1-D array of exact length (``a.dtype`` values or int64 indices), or the tuple
    ``(values, indices)`` for "both".

``compact_masked(a, mask, output, index_base) -> out``
    Same, selecting where the boolean array ``mask`` (``a``'s shape) is true.

``compact_into(a, pred, output, out_values, out_indices, count, stable, algorithm, stream)
-> count``
    Writes the selection into caller buffers of capacity >= ``a.size`` (``None`` for the
    output not asked for) and its length into ``count`` (a 1-element int64 or uint64 array
    of ``a``'s type and device; None: a new int64 one), and returns ``count``. On the GPU
    nothing waits for the device: the work is queued on ``stream`` (None: the current
    stream) and may be captured into a CUDA graph. Arguments are checked by the caller
    (:func:`dask_compact.compact_into`).

``compact_many(blocks, pred, output, stable, algorithm, bases) -> out``
    A run of chunks compacted by one task (dispatched on the first chunk's type): the
    concatenation of ``compact_chunk(blocks[i], ..., bases[i])`` over i, built without
    compacting twice (the GPU counts the whole run with one host synchronisation).

``compact_runs(runs, pred, output, stable, algorithm, bases) -> tuple``
    Every run of chunks one task compacts (a list of runs, each a list of chunks): a tuple
    of ``compact_many(runs[r], ..., bases[r])`` over r. NumPy: exactly that; CuPy: every
    chunk counted with one host synchronisation, each run's output a view of one allocation.

``compact_records(like, fields, pred, indices, stable, index_base, threads=1) -> dict``
    A record (dict name -> array, rows along axis 0; ``like``, one of them, is what the call
    is dispatched on)
    compacted by a record predicate (:mod:`.predicate.fields`): every field's selected rows at
    exact length, plus ``"indices"`` (int64, ``index_base`` + row) when asked. ``threads``:
    CPU threads one call may use (1 inside Dask tasks).

``compact_records_into(like, fields, pred, out, count, stream) -> count``
    The same into caller buffers (``out``: name -> buffer of capacity ``n`` rows, for the
    fields to write and optionally ``"indices"``), the count into ``count``; on the GPU
    queued on ``stream`` with no host synchronisation. Arguments are checked by the caller.

``scan_chunk(a, exclusive, algorithm, acc, base, out_dtype=None) -> out``
    The scan (prefix sum) of ``a`` flattened in C order, into a new 1-D array of dtype ``acc``
    (or ``out_dtype``, a narrower integer that the sums in ``acc`` wrap into: their low bits)
    and ``a``'s type, ``base`` (the chunk's global offset) added to every element; None for
    no offset (the first chunk, one array: NumPy's first element is ``a[0]`` itself, not
    ``0 + a[0]``, which loses a -0.0 and quiets a signalling NaN) (:mod:`dask_compact.scan`).
    ``scan_total(a, acc)``: the sum of ``a`` in ``acc`` as a NumPy scalar on the host.

``repeated_call(a, pred_like, output, stable, algorithm) -> call or None`` and
``remember_call(a, pred_like, pred, output, stable, algorithm)``
    :func:`dask_compact.compact_array`'s repeated call: a backend may keep, per predicate the
    caller passes (keyed so that only an equal predicate finds it), a call that skips the
    checks and the dispatch when it is passed again with the same arguments and the same
    kind of array (CuPy: the ready one-read call of a small call; NumPy: the compiled loop
    with its bound constants, ``backends/numpy_calls.py``); every other type: None, and
    nothing kept. NumPy keeps ``compact_records``' checked predicate the same way (below).

``repeated_into(a, pred_like, out, output, count, stream, stable, algorithm) -> count or None``
and ``remember_into(a, pred_like, pred, out, output, count, stream, stable, algorithm)``
    The same for :func:`dask_compact.compact_into`, kept per predicate, the input's kind
    (type, dtype, size) and the buffers' and count's memory: the repeated call runs at once
    and returns the count, or None where nothing is kept.

``repeated_records_call(like, fields, pred_like, indices) -> call or None`` and
``remember_records_call(like, fields, pred_like, pred, indices)``
    The same for :func:`dask_compact.compact_records` on in-memory fields (dispatched on one
    of them): a call kept per predicate and fields' layout, ``call(fields, index_base)``.

``repeated_records_into(like, fields, pred_like, out, count, stream) -> count or None`` and
``remember_records_into(like, fields, pred_like, pred, out, count, stream)``
    The same for :func:`dask_compact.compact_records_into`, kept per predicate and the
    arguments' memory (the same fields, buffers and count): the repeated call runs at once
    and returns the count, or None where nothing is kept.

``compact_chunk``/``compact_many`` with ``algorithm="scan"`` run the textbook map -> scan ->
scatter compaction of the backend's ``compact_scan`` instead of the fused kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from dask.utils import Dispatch

compact_chunk = Dispatch("compact_chunk")
compact_masked = Dispatch("compact_masked")
compact_many = Dispatch("compact_many")
compact_runs = Dispatch("compact_runs")
compact_into = Dispatch("compact_into")
compact_records = Dispatch("compact_records")
compact_records_into = Dispatch("compact_records_into")
scan_chunk = Dispatch("scan_chunk")
scan_total = Dispatch("scan_total")
repeated_call = Dispatch("repeated_call")
remember_call = Dispatch("remember_call")
repeated_into = Dispatch("repeated_into")
remember_into = Dispatch("remember_into")
repeated_records_call = Dispatch("repeated_records_call")
remember_records_call = Dispatch("remember_records_call")
repeated_records_into = Dispatch("repeated_records_into")
remember_records_into = Dispatch("remember_records_into")


def _nothing_kept(*args: object) -> None:
    """A type with no repeated call of its own (every one but CuPy's, and NumPy's for
    ``compact_array`` and ``compact_records``): the public call checks each time."""
    return None


for _keeper in (repeated_call, remember_call, repeated_into, remember_into,
                repeated_records_call, remember_records_call, repeated_records_into,
                remember_records_into):
    _keeper.register(object, _nothing_kept)


_NUMPY_KEPT = (repeated_call, remember_call, repeated_records_call, remember_records_call)


def _numpy_calls() -> Any:
    """``backends.numpy_calls``, imported at the first NumPy call of one of its hooks (numba's
    loop module comes with it), its functions then registered in place of the forwarders
    below: a repeated small call takes a few microseconds, and an import statement per call
    would be a tenth of them."""
    from .backends import numpy_calls as nc

    for hook in _NUMPY_KEPT:
        hook.register(np.ndarray, getattr(nc, hook.__name__))
    return nc


def _forward_to_numpy_calls(name: str) -> Callable[..., Any]:
    def forward(*args: Any) -> Any:
        return getattr(_numpy_calls(), name)(*args)

    return forward


for _hook in _NUMPY_KEPT:
    _hook.register(np.ndarray, _forward_to_numpy_calls(_hook.__name__))


@compact_chunk.register(np.ndarray)
def _compact_chunk_numpy(a, pred, output, stable, algorithm, index_base):
    if algorithm == "scan":
        from .backends.numpy_scan import compact_scan

        return compact_scan(a, pred, output, index_base)
    from .backends.numpy_backend import compact

    return compact(a, pred, output, stable, algorithm, index_base)


@compact_masked.register(np.ndarray)
def _compact_masked_numpy(a, mask, output, index_base):
    from .backends.numpy_backend import compact_masked as impl

    return impl(a, mask, output, index_base)


@compact_many.register(np.ndarray)
def _compact_many_numpy(blocks, pred, output, stable, algorithm, bases):
    if algorithm == "scan":
        from .backends.numpy_scan import compact_scan

        return _concat_scan_compactions(compact_scan, blocks, pred, output, bases, np)
    from .backends.numpy_backend import compact_many as impl

    return impl(blocks, pred, output, stable, algorithm, bases)


@compact_runs.register(np.ndarray)
def _compact_runs_numpy(runs, pred, output, stable, algorithm, bases):
    return tuple(_compact_many_numpy(r, pred, output, stable, algorithm, b)
                 for r, b in zip(runs, bases))


@compact_into.register(np.ndarray)
def _compact_into_numpy(a, pred, output, out_values, out_indices, count, stable, algorithm,
                        stream):
    from .backends.numpy_backend import compact_into as impl

    return impl(a, pred, output, out_values, out_indices, count)


@compact_records.register(np.ndarray)
def _compact_records_numpy(like, fields, pred, indices, stable, index_base, threads=1):
    from .backends.numpy_records import compact_records as impl

    return impl(fields, pred, indices, stable, index_base, threads)


@compact_records_into.register(np.ndarray)
def _compact_records_into_numpy(like, fields, pred, out, count, stream):
    from .backends.numpy_records import compact_records_into as impl

    return impl(fields, pred, out, count)


@scan_chunk.register(np.ndarray)
def _scan_chunk_numpy(a, exclusive, algorithm, acc, base, out_dtype=None):
    from .backends.numpy_scan import scan

    return scan(a, exclusive, algorithm, acc, base, out_dtype)


@scan_total.register(np.ndarray)
def _scan_total_numpy(a, acc):
    from .backends.numpy_scan import total

    return total(a, acc)


def _concat_scan_compactions(impl, blocks, pred, output, bases, xp):
    """compact_many with algorithm="scan": each chunk's scan compaction, concatenated."""
    parts = [impl(b, pred, output, base) for b, base in zip(blocks, bases)]
    if output != "both":
        return xp.concatenate(parts)
    return xp.concatenate([p[0] for p in parts]), xp.concatenate([p[1] for p in parts])


@compact_chunk.register_lazy("cupy")
@compact_masked.register_lazy("cupy")
@compact_many.register_lazy("cupy")
@compact_runs.register_lazy("cupy")
@compact_into.register_lazy("cupy")
@compact_records.register_lazy("cupy")
@compact_records_into.register_lazy("cupy")
@scan_chunk.register_lazy("cupy")
@scan_total.register_lazy("cupy")
@repeated_call.register_lazy("cupy")
@remember_call.register_lazy("cupy")
@repeated_into.register_lazy("cupy")
@remember_into.register_lazy("cupy")
@repeated_records_call.register_lazy("cupy")
@remember_records_call.register_lazy("cupy")
@repeated_records_into.register_lazy("cupy")
@remember_records_into.register_lazy("cupy")
def _register_cupy() -> None:
    import cupy

    from .backends import cupy_backend, cupy_calls, cupy_into_repeat, cupy_scan

    compact_chunk.register(cupy.ndarray, _compact_chunk_cupy)
    compact_masked.register(cupy.ndarray, cupy_backend.compact_masked)
    compact_many.register(cupy.ndarray, _compact_many_cupy)
    compact_runs.register(cupy.ndarray, _compact_runs_cupy)
    compact_into.register(cupy.ndarray, cupy_backend.compact_into_public)
    compact_records.register(cupy.ndarray, _compact_records_cupy)
    compact_records_into.register(cupy.ndarray, _compact_records_into_cupy)
    scan_chunk.register(cupy.ndarray, cupy_scan.scan)
    scan_total.register(cupy.ndarray, cupy_scan.total)
    repeated_call.register(cupy.ndarray, cupy_calls.repeated_call)
    remember_call.register(cupy.ndarray, cupy_calls.remember_call)
    repeated_into.register(cupy.ndarray, cupy_into_repeat.repeated_into)
    remember_into.register(cupy.ndarray, cupy_into_repeat.remember_into)
    repeated_records_call.register(cupy.ndarray, _repeated_records_call_cupy)
    remember_records_call.register(cupy.ndarray, _remember_records_call_cupy)
    repeated_records_into.register(cupy.ndarray, _repeated_records_into_cupy)
    remember_records_into.register(cupy.ndarray, _remember_records_into_cupy)


def _compact_chunk_cupy(a, pred, output, stable, algorithm, index_base):
    if algorithm == "scan":
        from .backends.cupy_scan import compact_scan

        return compact_scan(a, pred, output, index_base)
    from .backends.cupy_backend import compact

    return compact(a, pred, output, stable, algorithm, index_base)


def _compact_many_cupy(blocks, pred, output, stable, algorithm, bases):
    if algorithm == "scan":
        import cupy

        from .backends.cupy_scan import compact_scan

        return _concat_scan_compactions(compact_scan, blocks, pred, output, bases, cupy)
    from .backends.cupy_backend import compact_many

    return compact_many(blocks, pred, output, stable, algorithm, bases)


def _compact_runs_cupy(runs, pred, output, stable, algorithm, bases):
    if algorithm == "scan":
        return tuple(_compact_many_cupy(r, pred, output, stable, algorithm, b)
                     for r, b in zip(runs, bases))
    from .backends.cupy_backend import compact_runs

    return compact_runs(runs, pred, output, stable, algorithm, bases)


def _compact_records_into_cupy(like, fields, pred, out, count, stream):
    from .backends.cupy_records import compact_records_into as impl

    return impl(fields, pred, out, count, stream)


def _repeated_records_call_cupy(like, fields, pred_like, indices):
    from .backends.cupy_records_repeat import repeated_records_call as impl

    return impl(fields, pred_like, indices)


def _remember_records_call_cupy(like, fields, pred_like, pred, indices):
    from .backends.cupy_records_repeat import remember_records_call as impl

    return impl(fields, pred_like, pred, indices)


def _repeated_records_into_cupy(like, fields, pred_like, out, count, stream):
    from .backends.cupy_records_repeat import repeated_into

    return repeated_into(fields, pred_like, out, count, stream)


def _remember_records_into_cupy(like, fields, pred_like, pred, out, count, stream):
    from .backends.cupy_records_repeat import remember_into

    return remember_into(fields, pred_like, pred, out, count, stream)


def _compact_records_cupy(like, fields, pred, indices, stable, index_base, threads=1):
    from .backends.cupy_records import compact_records as impl

    return impl(fields, pred, indices, stable, index_base)


# dask_compact.sort and argsort: the chunk steps (contract in backends/numpy_sort.py).
sort_chunk = Dispatch("sort_chunk")
sort_bounds = Dispatch("sort_bounds")
sort_merge = Dispatch("sort_merge")
_SORT_STEPS = (sort_chunk, sort_bounds, sort_merge)


@sort_chunk.register_lazy("numpy")
@sort_bounds.register_lazy("numpy")
@sort_merge.register_lazy("numpy")
def _register_numpy_sort() -> None:
    from .backends import numpy_sort

    for step in _SORT_STEPS:
        step.register(np.ndarray, getattr(numpy_sort, step.__name__))


@sort_chunk.register_lazy("cupy")
@sort_bounds.register_lazy("cupy")
@sort_merge.register_lazy("cupy")
def _register_cupy_sort() -> None:
    import cupy

    from .backends import cupy_sort

    for step in _SORT_STEPS:
        step.register(cupy.ndarray, getattr(cupy_sort, step.__name__))


# dask_compact.partition: the stable split of one chunk.
# ``split_chunk(a, pred, output, index_base) -> (out, k)``: ``out`` of ``a.size`` elements,
# the selected ones first then the others, each in order (values, int64 global indices, or
# the tuple of both), and ``k`` the selected count.
split_chunk = Dispatch("split_chunk")


@split_chunk.register_lazy("numpy")
def _register_numpy_split() -> None:
    from .backends import numpy_split

    split_chunk.register(np.ndarray, numpy_split.split_chunk)


@split_chunk.register_lazy("cupy")
def _register_cupy_split() -> None:
    import cupy

    from .backends import cupy_split

    split_chunk.register(cupy.ndarray, cupy_split.split_chunk)


# A masked chunk is an ndarray subclass, which the NumPy steps above would take, dropping its
# mask. Every step's caller checks each chunk first (validate.check_chunk: a dask array whose
# _meta says ndarray can hold masked chunks, from map_blocks returning np.ma arrays without
# saying so); this refusal is what a step given one directly answers all the same.
def _refuse_masked(step: Dispatch) -> Callable[..., None]:
    def refuse(*args: object, **kwargs: object) -> None:
        from .validate import check_chunk

        check_chunk(np.ma.masked_array([]), step.__name__)

    return refuse


for _step in (compact_chunk, compact_masked, compact_many, compact_runs, compact_into,
              compact_records, compact_records_into, scan_chunk, scan_total, *_SORT_STEPS,
              split_chunk):
    _step.register(np.ma.MaskedArray, _refuse_masked(_step))
