"""Chunk-level compaction: what one Dask task runs, and the public array-level calls
:func:`compact_array` (exact-size result) and :func:`compact_into` (caller buffers, no sync)."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import settings
from .dispatch import (
    compact_chunk,
    compact_many,
    compact_masked,
    compact_runs,
    remember_call,
    remember_into,
    repeated_call,
    repeated_into,
)
from .dispatch import compact_into as compact_into_chunk
from .predicate import Predicate, PredicateLike, as_predicate
from .task_report import report
from .validate import (
    as_declared,
    by_output,
    check_algorithm,
    check_apart,
    check_chunk_type,
    check_dtype,
    check_flag,
    check_into_buffer,
    check_output,
    check_stream,
    counted,
    either_order,
    frame_object,
    in_memory,
    is_dask_array,
    native,
    other_order_view,
    overlaps,
    swap_written,
    times_refused,
    to_native,
)


def compact_array(
    a: Any,
    pred: PredicateLike,
    *,
    output: str = "values",
    stable: bool = True,
    algorithm: str = "auto",
) -> Any:
    """Compact one in-memory NumPy (or CuPy) array, without Dask.

    Parameters
    ----------
    a : numpy.ndarray or cupy.ndarray
        Any shape; flattened in C order.
    pred : callable or str
        Elementwise predicate, e.g. ``lambda v: v > 0.5`` or ``"x > 0.5"``.
    output : {"values", "indices", "both"}
        The selected values (``a.ravel()[pred(a).ravel()]``), their flat indices
        (``np.flatnonzero(pred(a))``, int64), or the tuple ``(values, indices)``.
    stable : bool
        Keep the input order. ``False`` lets the GPU use the unordered kernel where it is
        faster (with ``algorithm="auto"``: calls of more than 2^22 elements; smaller ones
        keep the order all the same).
    algorithm : {"auto", "single-pass", "three-pass", "hybrid", "scan"}
        GPU kernel variant; ignored on the CPU, which has one fused loop, except ``"scan"``:
        the textbook map -> scan -> scatter compaction (predicate flags, their exclusive
        scan, a scatter; on the GPU the look-back scan of :func:`dask_compact.scan_array`),
        on either device, kept for comparison with the fused kernels.

    Returns
    -------
    array or tuple of arrays
        1-D, of exact length, of ``a``'s array type.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_compact import compact_array
    >>> compact_array(np.array([0.1, 0.7, 0.3, 0.9]), "x > 0.5")
    array([0.7, 0.9])
    >>> compact_array(np.array([[1, 5], [7, 2]]), lambda v: v > 4, output="indices")
    array([1, 2])
    """
    settings.warn_unknown()
    stable = check_flag(stable, "stable", "compact_array")
    if isinstance(a, np.ndarray) and a.dtype.kind in ("m", "M"):
        return _compact_times(a, pred, output, algorithm, stable)
    # The same predicate on the same kind of array again (a loop of small GPU calls): the call
    # kept the last time, without the checks and the dispatch it passed then.
    call = repeated_call(a, pred, output, stable, algorithm)
    if call is not None:
        try:
            return call(a, 0)
        except MemoryError:
            pass  # a GPU without room for its scratch: the checked call below counts first
    checked, p = _checked("compact_array", a, pred, output, stable, algorithm)
    out = compact_chunk(checked, p, output, stable, algorithm, 0)
    if checked is a:
        remember_call(a, pred, p, output, stable, algorithm)
    return out


def _compact_times(a: np.ndarray, pred: PredicateLike, output: str, algorithm: str,
                   stable: bool) -> Any:
    """compact_array of datetime64 / timedelta64 values: the predicate evaluated by NumPy (the
    compiled loop takes numeric dtypes), the selection taken by its mask."""
    check_output(output)
    check_algorithm(algorithm, stable)
    # a masked array refused as of any other dtype (until 2026-12-01, fourteenth session, a
    # regression review, this path took one: its values held the masked elements the
    # comparison of their data selected, its indices, np.flatnonzero's, did not)
    check_chunk_type(a, "compact_array", in_memory=True)
    a = a if a.dtype.isnative else a.astype(native(a.dtype))
    p = as_predicate(pred)
    with times_refused(p.source, a.dtype, in_memory=True):
        m = p.mask(a).ravel()
    values = a.ravel()[m] if output != "indices" else None
    indices = np.flatnonzero(m).astype(np.int64, copy=False) if output != "values" else None
    return by_output(values, indices, output)


def _checked(fn: str, a: Any, pred: PredicateLike, output: str, stable: bool, algorithm: str,
             stream: Any = None) -> tuple[Any, Predicate]:
    """The array-level calls' argument checks: ``a`` in native byte order and the predicate.
    ``stream``: :func:`compact_into`'s, checked here, where a conversion is queued on it."""
    check_output(output)
    check_algorithm(algorithm, stable)
    if not hasattr(a, "dtype") or not hasattr(a, "shape"):
        # a DataFrame (no dtype of its own) told its columns: np.asarray of it is one array
        # of all of them, row by row (until 2026-12-01, fifteenth session, a regression
        # review, it was told that, as a list is)
        frame = frame_object(a)
        if frame is not None:
            raise TypeError(f"{fn} needs a NumPy or CuPy array, not {frame}")
        # the conversion named, as scan_array's refusal names it (until 2026-12-01, fourteenth
        # session, only "not list": a new-user probe)
        raise TypeError(f"{fn} needs a NumPy or CuPy array, not {type(a).__name__}; convert "
                        "it first, e.g. np.asarray(a)")
    a = in_memory(a)
    if is_dask_array(a):
        # the dask call of the same operation (partition_array was told map_compact, a
        # compaction, until 2026-12-01; a probe)
        dask_call = ("dask_compact.partition(x, pred)" if fn == "partition_array"
                     else "x.map_compact(pred) (dask_compact.map_compact)")
        raise TypeError(f"{fn} takes an in-memory NumPy or CuPy array; for a dask array use "
                        f"{dask_call}")
    check_chunk_type(a, fn, in_memory=True)
    check_dtype(a.dtype, fn, output)
    p = as_predicate(pred)
    check_stream(stream, not isinstance(a, np.ndarray), "input")
    # big-endian data (validate.native), converted in the order of the stream the call runs
    # on: on the current one (until 2026-12-01, thirteenth session) compact_into's kernel on
    # another stream could read the copy before it was written
    a = to_native(a, stream)
    p.check(a.dtype)
    return a, p


def _split(out: Any, output: str) -> tuple[Any, Any]:
    if output == "both":
        return out
    return (out, None) if output == "values" else (None, out)


def compact_block(
    block: Any, pred: Any, output: str, stable: bool, algorithm: str, index_base: int,
    direct: bool = False, declared: np.dtype | None = None, index: int = 0,
    shape: tuple[int, ...] | None = None,
) -> Any:
    """Phase 1 for one dask chunk: the output chunk itself when ``direct`` (one output),
    else ``(values | None, indices | None, input length)``. ``declared``: the input's
    dtype, which the chunk (chunk ``index``) is taken in (:func:`.validate.as_declared`);
    ``shape``: the chunk's declared shape, which it must have (None: unknown)."""
    block = as_declared(block, declared, "dask_compact", index, shape=shape)
    out = compact_chunk(block, pred, output, stable, algorithm, index_base)
    if direct:
        return out
    values, indices = _split(out, output)
    return values, indices, int(np.prod(block.shape))


def compact_blocks(
    blocks: list[Any], pred: Any, output: str, stable: bool, algorithm: str, bases: list[int],
    direct: bool = False, declared: np.dtype | None = None, first: int = 0,
    shapes: list[tuple[int, ...]] | None = None,
) -> Any:
    """Phase 1 for a run of consecutive dask chunks held by one worker, in ONE task: the
    concatenation of their outputs (``direct``), else ``(values | None, indices | None, n_in)``.

    ``bases[i]`` is chunk i's global input start, so indices come out global. Blocks of any
    shape are taken in C order, each in the ``declared`` dtype (``first``: the run's first
    chunk index; ``shapes``: the chunks' declared shapes; see :func:`_declared_run`)."""
    blocks = _declared_run(blocks, declared, first, shapes)
    impl = compact_many.dispatch(type(blocks[0]))
    out = impl(blocks, pred, output, stable, algorithm, bases)
    if direct:
        return out
    values, indices = _split(out, output)
    return values, indices, int(sum(np.prod(b.shape) for b in blocks))


def compact_group(
    runs: list[list[Any]], pred: Any, output: str, stable: bool, algorithm: str,
    bases: list[list[int]], declared: np.dtype | None = None, firsts: list[int] | None = None,
    shapes: list[list[tuple[int, ...]]] | None = None,
) -> tuple:
    """Phase 1 for every chunk one worker thread holds, in ONE task: a tuple with one output
    per run of consecutive chunks (see :func:`compact_blocks`; for ``output="both"`` each is
    ``(values, indices)``). ``bases[r][i]`` is the global input start of run r's chunk i,
    ``shapes[r][i]`` its declared shape."""
    out = compact_held_runs(runs, pred, output, stable, algorithm, bases, declared, firsts,
                            shapes)
    report(run_counts(out, output))  # the counts, with the task's completion
    return out


def compact_held_runs(
    runs: list[list[Any]], pred: Any, output: str, stable: bool, algorithm: str,
    bases: list[list[int]], declared: np.dtype | None = None, firsts: list[int] | None = None,
    shapes: list[list[tuple[int, ...]]] | None = None,
) -> tuple:
    """One output per run of chunks (see :func:`compact_group`), outside any task: what a
    group task and a worker asked directly (:mod:`dask_compact.direct`) both run.
    ``firsts[r]``: run r's first chunk index, ``shapes[r]`` its chunks' declared shapes
    (see :func:`_declared_run`)."""
    firsts = firsts if firsts is not None else [0] * len(runs)
    every: list = shapes if shapes is not None else [None] * len(runs)
    runs = [_declared_run(run, declared, f, s) for run, f, s in zip(runs, firsts, every)]
    impl = compact_runs.dispatch(type(runs[0][0]))
    return impl(runs, pred, output, stable, algorithm, bases)


def _declared_run(blocks: list[Any], declared: np.dtype | None, first: int,
                  shapes: list[tuple[int, ...]] | None = None) -> list[Any]:
    """A run of consecutive chunks (``first`` the index of its first), each checked and in
    the ``declared`` dtype (:func:`.validate.as_declared`: every chunk, since the step is
    dispatched on the first one's type and dtype) and of its declared shape (``shapes``,
    one per chunk; None: not checked), flattened in C order (a view of a contiguous
    block). The run's global indices are its chunks' declared starts: a chunk shorter or
    longer than declared put every later one off (until 2026-12-01)."""
    every: list = shapes if shapes is not None else [None] * len(blocks)
    return [as_declared(b, declared, "dask_compact", first + k, shape=s).reshape(-1)
            for k, (b, s) in enumerate(zip(blocks, every))]


_BOOL = np.dtype(bool)


def run_counts(pieces: tuple, output: str) -> list[int]:
    """The selected count of each run in a :func:`compact_group` result."""
    return [len(p[0] if output == "both" else p) for p in pieces]


def compact_block_masked(
    block: Any, mask: Any, output: str, index_base: int, direct: bool = False,
    declared: np.dtype | None = None, index: int = 0, shape: tuple[int, ...] | None = None,
    mask_shape: tuple[int, ...] | None = None,
) -> Any:
    """Phase 1 for one dask chunk selected by a boolean mask chunk (see :func:`compact_block`;
    the mask chunk is taken as booleans where ``declared`` is given). ``shape``,
    ``mask_shape``: the shapes the two chunks' arrays declare (None: unknown), checked
    before the two are compared, so that the refusal names the chunk that is not of its
    own."""
    block = as_declared(block, declared, "compact", index, shape=shape)
    # the step is dispatched on the data chunk: a masked mask chunk would select by its data;
    # a mask chunk of integers (0 and 1) under a boolean mask is refused, not read as bytes
    mask = as_declared(mask, None if declared is None else _BOOL, "compact", index, "the mask",
                       mask_shape)
    if mask.shape != block.shape:  # unknown sizes: the blocks are paired in order
        raise ValueError(
            f"mask chunk of shape {mask.shape} does not match data chunk {block.shape}"
        )
    out = compact_masked(block, mask, output, index_base)
    if direct:
        return out
    values, indices = _split(out, output)
    return values, indices, int(np.prod(block.shape))


def compact_into(
    a: Any,
    pred: PredicateLike,
    out: Any,
    *,
    output: str = "values",
    count: Any = None,
    stream: Any = None,
    stable: bool = True,
    algorithm: str = "auto",
) -> Any:
    """Compact ``a`` into buffers you own; return the selected count as a 1-element array.

    The array-level call without allocations or host synchronisation, like CUB's
    ``DeviceSelect``: on the GPU the work is queued on ``stream`` and the count stays on the
    device until you read it, so calls can be queued back to back, overlapped on several
    streams, or captured into a CUDA graph (``stream.begin_capture()`` ...
    ``stream.end_capture()``) and replayed on new data in the same buffers.

    Parameters
    ----------
    a : numpy.ndarray or cupy.ndarray
        Any shape; flattened in C order (a C-contiguous CuPy array avoids a copy, which
        matters under graph capture: the copy is taken when captured, not when replayed).
    pred : callable or str
        Elementwise predicate, as for :func:`compact_array`.
    out : array, or tuple ``(values, indices)`` for ``output="both"``
        1-D contiguous arrays of ``a``'s type (and device) with room for ``a.size``
        elements: ``a``'s dtype for values, int64 for indices (flat indices into ``a``), in
        either byte order for NumPy (``np.empty_like(a)`` of a big-endian ``a``: written in
        the buffer's order). The first ``count`` elements receive the selection; those after
        it are unspecified.
    output : {"values", "indices", "both"}
        What ``out`` receives.
    count : array, optional
        A 1-element int64 or uint64 array of ``a``'s type (and device) that receives the
        count; by default a new int64 one. Pass one to keep a graph's or a loop's count in a
        buffer you hold.
    stream : cupy.cuda.Stream, optional
        The stream the GPU work is queued on (default: the current stream). NumPy input takes
        none.
    stable : bool
        Keep the input order (``False`` lets the GPU use the unordered kernel, as for
        :func:`compact_array`).
    algorithm : {"auto", "single-pass", "three-pass", "hybrid"}
        GPU kernel variant, as for :func:`compact_array`; ignored on the CPU.

    Returns
    -------
    count : array
        ``count`` (or the new one): a 1-element array; on the GPU its value is ready once the
        stream has reached this call: ``stream.synchronize()`` first, or
        ``count.get(stream=stream)``. ``int(count[0])`` waits only for the *current* stream,
        so with another ``stream`` (a non-blocking one above all) it can read the count
        before the call has written it.

    Notes
    -----
    Memory: nothing beyond ``out`` and ``count`` except O(a.size / 1024) bytes of tile
    state (``algorithm="three-pass"``: also its a.size / 8-byte predicate bitmask), for a
    C-contiguous ``a``; a CuPy ``a`` that is not (a strided view such as ``a[::2]``) is
    first copied whole, ``a.nbytes`` more device memory for the call. The
    state of a call made while its stream captures a graph is kept for the life of the
    process, since the graph may be replayed at any time.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_compact import compact_into
    >>> a = np.array([0.1, 0.7, 0.3, 0.9])
    >>> out = np.empty_like(a)
    >>> n = compact_into(a, "x > 0.5", out)
    >>> out[: n[0]]
    array([0.7, 0.9])
    >>> idx = np.empty(a.size, dtype=np.int64)
    >>> count = np.zeros(1, dtype=np.int64)
    >>> _ = compact_into(a, lambda v: v < 0.5, idx, output="indices", count=count)
    >>> idx[: count[0]]
    array([0, 2])
    """
    settings.warn_unknown()
    stable = check_flag(stable, "stable", "compact_into")
    if algorithm == "scan":
        raise ValueError('compact_into does not run algorithm="scan" (a comparison path of '
                         "compact_array and map_compact); use the default")
    # The same predicate on the same kind of input into the same buffers and count again (a
    # loop of small sync-free calls): the call kept the last time, without the checks it
    # passed then
    done = repeated_into(a, pred, out, output, count, stream, stable, algorithm)
    if done is not None:
        return done
    given, given_out = a, out
    a, p = _checked("compact_into", a, pred, output, stable, algorithm, stream)
    if output == "both":
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise TypeError('output="both" needs out=(values, indices)')
        values, indices = out
    elif output == "values":
        values, indices = out, None
    else:
        values, indices = None, out
    passed = (values, indices, count)
    values, indices, count = in_memory(values), in_memory(indices), in_memory(count)
    # the caller's own arrays, as they will be passed again (none converted for the call)
    own = all(x is y for x, y in zip(passed, (values, indices, count)))
    given_count = count
    # NumPy buffers of the other byte order (np.empty_like(a) of a big-endian a, whose dtype
    # NumPy's a[m] keeps): written through native views, then swapped (other_order_view)
    values, swap_values = other_order_view(values, a.dtype)
    indices, swap_indices = other_order_view(indices, np.dtype(np.int64))
    count, swap_count = other_order_view(count, counted(count))
    n = int(a.size)
    # big-endian input was converted to a native copy above: the caller's own array must not
    # be written over either
    caller = None if given is a else in_memory(given)
    for role, buf, dtype, needed in (
        ("out (values)", values, a.dtype, output != "indices"),
        ("out (indices)", indices, np.dtype(np.int64), output != "values"),
    ):
        if buf is None and needed:
            raise TypeError(f"{role} must be an array to write into, not None")
        if buf is not None:
            check_into_buffer(a, buf, role, dtype, n)
            if caller is not None and overlaps(caller, buf):
                raise ValueError(f"{role} overlaps the input; compaction is not done in place")
    if count is not None:  # else the backend makes one, on a's device
        if getattr(count, "dtype", None) not in (np.dtype(np.int64), np.dtype(np.uint64)):
            raise TypeError("count must be a 1-element int64 or uint64 array"
                            + either_order("numpy" if isinstance(a, np.ndarray) else "cupy",
                                         np.dtype(np.int64)))
        check_into_buffer(a, count, "count", count.dtype, 1)
        if count.size != 1:
            raise ValueError(f"count must have 1 element; got {count.size}")
    if output == "both" or count is not None:
        check_apart({"out (values)": values, "out (indices)": indices, "count": count})
    got = compact_into_chunk(a, p, output, values, indices, count, stable, algorithm, stream)
    if swap_values or swap_indices or swap_count:
        swapped = [b for b, swap in ((values, swap_values), (indices, swap_indices)) if swap]
        swap_written(swapped, int(got[0]), got if swap_count else None)
    elif own and given is a:
        remember_into(a, pred, p, given_out, output, given_count, stream, stable, algorithm)
    return got if given_count is None else given_count
