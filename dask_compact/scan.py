"""Prefix sums: :func:`scan_array` on one NumPy or CuPy array, :func:`cumsum` on a dask array.

The dask graph (docs/design.md, Scan) has the three phases of compaction: one task per chunk
computes the chunk's total, one small task scans the totals (exclusive, in the output dtype)
into every chunk's global offset, and one task per chunk scans the chunk with its offset
folded in (one pass over the chunk's data). The output's chunks are the input's.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from . import settings, workers_installed
from .dispatch import scan_chunk, scan_total
from .validate import (
    as_declared,
    block_shapes,
    check_chunk_type,
    check_flag,
    conversion,
    frame_object,
    in_memory,
    is_dask_array,
    native,
    to_native,
)

__all__ = ["scan_array", "cumsum", "scan_dtype", "CPU_ALGORITHMS", "GPU_ALGORITHMS"]

CPU_ALGORITHMS = ("auto", "sequential")
# kept in step with backends/cupy_scan_source.GPU_ALGORITHMS (a test checks)
GPU_ALGORITHMS = ("auto", "lookback", "shared", "thread-efficient", "work-efficient", "naive")
# Input dtypes (NumPy's cumsum of float16 adds in float16, which no scan is built for, so
# float16 is taken with a float32 or float64 dtype= only; complex is not a scan we build).
_INPUT_KINDS = "biuf"
_HALF = np.dtype(np.float16)
_ACC = tuple(np.dtype(t) for t in ("int32", "int64", "uint32", "uint64", "float32", "float64"))
# Integers narrower than the scans' accumulators, taken as an explicit dtype= as np.cumsum
# takes them (its sums wrap in that width): summed in uint32 and cast, which is exact, since
# a sum modulo 2^32 taken modulo 2^8 or 2^16 is the sum modulo 2^8 or 2^16 (unsigned, so the
# wrap is defined in C++ too; the elements' conversion to it is modular). Refused until
# 2026-12-06 (noticed by a probe: np.cumsum(a, dtype=np.int16) had no equal here).
_NARROW = tuple(np.dtype(t) for t in ("int8", "int16", "uint8", "uint16"))
_NARROW_SUM = np.dtype(np.uint32)


def _timedelta_sum(dt: np.dtype, call: str) -> str:
    """The way out for a scan of timedeltas, which NumPy's cumsum sums (until 2026-12-02,
    sixteenth session, a refusal probe, refused with none): their int64 counts of the unit,
    summed and cast back (astype, either byte order), NaT excepted."""
    a = "x" if call == "cumsum" else "a"
    return (f"; timedeltas sum as their int64 counts of {dt}'s unit: "
            f"`dask_compact.{call}({a}.astype('i8')).astype({a}.dtype)` (where {a} holds no "
            "NaT: NumPy's sum is NaT from a NaT on, an int64 sum is not)")


def scan_dtype(dtype: Any, out_dtype: Any = None, call: str = "cumsum") -> np.dtype:
    """The output (and accumulator) dtype of a scan of ``dtype``: NumPy's ``cumsum`` choice
    (bool and signed integers -> the platform integer, int64 on Linux; unsigned -> uint64;
    floats keep theirs), or ``out_dtype`` where given (in native byte order). TypeError for
    what is not built (``call``, ``cumsum`` or ``scan_array``, for a timedelta's way out).

    Each answer is kept per (dtype, out_dtype, call) where they hash: working it out (NumPy's
    own choice is asked of an empty ``np.cumsum``) took 4.9 of a NumPy scan_array's 18.5 us
    on the 2-core machine, on every call; refusals are not kept (each raises anew)."""
    try:
        hash((dtype, out_dtype))
    except TypeError:  # e.g. a list: refused by np.dtype in _scan_dtype, as it says
        return _scan_dtype(dtype, out_dtype, call)
    return _kept_scan_dtype(dtype, out_dtype, call)


def _scan_dtype(dtype: Any, out_dtype: Any, call: str) -> np.dtype:
    """:func:`scan_dtype`, worked out."""
    dt = native(np.dtype(dtype))
    # float16 into a float32 or float64 accumulator is NumPy's np.cumsum(a, dtype=...): each
    # element widened (exactly), the sums in the accumulator. Refused until 2026-12-01 (the
    # eleventh session's scan probe); the chunks are widened where they are scanned (widened).
    half_widened = dt == _HALF and out_dtype is not None and np.dtype(out_dtype).kind == "f"
    if dt.kind not in _INPUT_KINDS or (dt == _HALF and not half_widened):
        raise TypeError(
            f"scan takes bool, integer, float32 or float64 arrays, not {dt}"
            + ("; NumPy adds float16 in float16, which no scan here is built for: pass "
               "dtype=np.float32 or np.float64 to sum it in that type (np.cumsum(a, dtype=...))"
               if dt == _HALF else _timedelta_sum(dt, call) if dt.kind == "m" else "")
        )
    if out_dtype is None:
        acc = np.dtype(np.cumsum(np.zeros(0, dtype=dt)).dtype)
        if acc not in _ACC:
            # longdouble: NumPy sums it in longdouble, which no scan here is built for (the
            # compiled loop failed with a numba TypingError, a new-user probe)
            raise TypeError(
                f"scan takes bool, integer, float32 or float64 arrays, not {dt}; pass "
                "dtype=np.float64 to sum in float64, or use np.cumsum for its extended "
                "precision"
            )
        return acc
    # in native order, as the results of big-endian input come back (validate.native):
    # dtype=">i8" is int64, as np.cumsum takes it (refused until 2026-12-01, a new-user
    # probe)
    acc = native(np.dtype(out_dtype))
    if acc not in _ACC and acc not in _NARROW:
        taken = ", ".join(d.name for d in (*_NARROW, *_ACC))
        raise TypeError(
            f"dtype must be one of {taken} (the accumulator), not {acc}"
            + (f"; np.cumsum(a, dtype=bool) is a running logical or: {_running_or(call)} "
               "gives it" if acc.kind == "b" else "")
        )
    if dt.kind == "f" and acc.kind != "f":
        raise TypeError(
            f"a {dt} array is not summed into {acc}: cast it first (a.astype(...)) if truncation "
            "is meant"
        )
    return acc


_kept_scan_dtype = functools.lru_cache(maxsize=256)(_scan_dtype)


def _running_or(call: str) -> str:
    """``np.cumsum(a, dtype=bool)`` by ``call`` (``cumsum`` or ``scan_array``)."""
    if call == "scan_array":
        return "dask_compact.scan_array(a != 0, exclusive=False) > 0"
    return "dask_compact.cumsum(x != 0) > 0"


def summing_dtype(out: np.dtype) -> np.dtype:
    """The dtype the scans add in for output dtype ``out``: ``out`` itself, but uint32 for the
    narrow integers (``_NARROW``; the chunk scans store the low bits in ``out``, scan_chunk's
    ``out_dtype``: exact, see there)."""
    return _NARROW_SUM if out in _NARROW else out


def _check_algorithm(algorithm: Any, gpu: bool, fn: str) -> str:
    if algorithm in (GPU_ALGORITHMS if gpu else CPU_ALGORITHMS):
        return str(algorithm)
    if algorithm in GPU_ALGORITHMS or algorithm in CPU_ALGORITHMS:
        where, ok = ("CuPy", GPU_ALGORITHMS) if gpu else ("NumPy", CPU_ALGORITHMS)
        other = "NumPy" if gpu else "CuPy"
        raise ValueError(
            f'{fn}: algorithm="{algorithm}" runs on {other} data; {where} data takes '
            f"{', '.join(repr(a) for a in ok)}"
        )
    raise ValueError(
        f"{fn}: algorithm must be one of {', '.join(repr(a) for a in GPU_ALGORITHMS)} (CuPy) "
        f"or {', '.join(repr(a) for a in CPU_ALGORITHMS)} (NumPy), not {algorithm!r}"
    )


def _is_gpu(a: Any) -> bool:
    return type(a).__module__.split(".")[0] == "cupy"


def scan_array(a: Any, *, exclusive: bool = True, algorithm: str = "auto",
               dtype: Any = None) -> Any:
    """Prefix sums of one in-memory NumPy or CuPy array, without Dask.

    Parameters
    ----------
    a : numpy.ndarray or cupy.ndarray
        bool, integer, float32 or float64 data of any shape, flattened in C order as
        ``np.cumsum(a)`` flattens it; float16 with ``dtype=np.float32`` or ``np.float64``
        (widened, as ``np.cumsum(a, dtype=...)`` widens it).
    exclusive : bool
        ``True`` (the default): element i is the sum of the elements before i, so the result
        starts with 0 and has ``a.size`` elements (the offsets of a scatter). ``False``: the
        sum up to and including i, ``np.cumsum(a)``.
    algorithm : str
        NumPy input: ``"auto"`` or ``"sequential"`` (one compiled loop, NumPy's order of
        additions). CuPy input: ``"auto"``/``"lookback"`` (single pass with decoupled
        look-back: one read and one write), or the textbook algorithms, for comparison:
        ``"shared"`` (block scans in shared memory, then the block sums, recursively),
        ``"thread-efficient"`` and ``"work-efficient"`` (Blelloch's up-sweep and down-sweep
        over the input padded to a power of two; one thread per active node of each level,
        or one per element), ``"naive"`` (Hillis-Steele: a launch per level).
    dtype : dtype, optional
        The accumulator and output dtype (int32, int64, uint32, uint64, float32, float64;
        int8, int16, uint8, uint16 too, summed in uint32 and cast, which gives NumPy's sums
        in that width exactly). Default: what ``np.cumsum(a)`` gives (int64 for bool and
        signed integers, uint64 for unsigned, float32/float64 kept). Integer sums wrap
        around, as NumPy's do.

    Returns
    -------
    array
        1-D, ``a.size`` elements, of ``a``'s array type (and device).

    Raises
    ------
    TypeError
        Not a NumPy/CuPy array, a masked array, or an unsupported dtype.
    ValueError
        An unknown algorithm, or a GPU algorithm for NumPy data (and vice versa).

    Notes
    -----
    Float sums on the GPU are added in another order than NumPy's sequential loop (tile sums
    first, then their prefixes), so they agree with ``np.cumsum`` to rounding, not bit for bit,
    and the look-back scan may round differently from run to run.

    Examples
    --------
    >>> import numpy as np
    >>> from dask_compact import scan_array
    >>> scan_array(np.array([3, 1, 4, 1, 5]))
    array([0, 3, 4, 8, 9])
    >>> scan_array(np.array([3, 1, 4, 1, 5]), exclusive=False)
    array([ 3,  4,  8,  9, 14])
    >>> scan_array(np.array([True, False, True]), exclusive=False)
    array([1, 1, 2])
    >>> scan_array(np.array([[1, 2], [3, 4]], dtype=np.uint8)).dtype
    dtype('uint64')
    """
    settings.warn_unknown()
    exclusive = check_flag(exclusive, "exclusive", "scan_array")
    if isinstance(a, np.generic):
        a = np.asarray(a)  # a NumPy scalar, as np.cumsum takes it
    a = in_memory(a)
    if is_dask_array(a):
        # np.asarray(a) was the hint until 2026-12-01 (a probe): computing it to scan it here
        raise TypeError(
            "scan_array takes an in-memory NumPy or CuPy array; for a dask array use "
            "dask_compact.cumsum(x) (exclusive=True for scan_array's default)"
        )
    if isinstance(a, np.ma.MaskedArray):
        check_chunk_type(a, "scan_array", in_memory=True)  # refused, saying what to do
    frame = frame_object(a)  # a DataFrame's np.asarray mixes its columns (compact_array's)
    if frame is not None:
        raise TypeError(f"scan_array needs a NumPy or CuPy array, not {frame}")
    if type(a) is not np.ndarray and not _is_gpu(a):
        raise TypeError(
            f"scan_array needs a NumPy or CuPy array, not {type(a).__module__}."
            f"{type(a).__name__}; convert {conversion(a, in_memory=True)}"
        )
    acc = scan_dtype(a.dtype, dtype, "scan_array")
    alg = _check_algorithm(algorithm, _is_gpu(a), "scan_array")
    # the other byte order: NumPy's astype, CuPy's bytes reversed (CuPy's astype copies them
    # as they are: until 2026-12-01, thirteenth session, it scanned the unswapped numbers)
    a = to_native(a)
    s = summing_dtype(acc)  # ``acc`` itself (the same object) but for the narrow dtypes
    return scan_chunk(widened(a, s), exclusive, alg, s, None,
                      out_dtype=None if s is acc else acc)


def widened(a: Any, acc: np.dtype) -> Any:
    """``a`` as the scans take it: float16 (taken with a float32 or float64 ``dtype=`` only,
    :func:`scan_dtype`) widened to the accumulator, exactly, as ``np.cumsum(a, dtype=acc)``
    casts it; any other dtype as it is."""
    return a.astype(acc) if a.dtype == _HALF else a


def cumsum(x: Any, *, exclusive: bool = False, algorithm: str = "auto",
           dtype: Any = None) -> Any:
    """Prefix sums of a dask array (NumPy or CuPy chunks), with the input's known chunks (its
    empty ones left out, which Dask mishandles; an empty input is one chunk of length 0).

    Phase 1, one task per chunk: the chunk's total. Phase 2, one small task: the exclusive
    scan of the totals (in the output dtype), every chunk's global offset; only these numbers
    travel. Phase 3, one task per chunk: the chunk's scan with its offset folded in (one pass
    over the chunk on its worker and device). The result is lazy; nothing is computed here.

    Parameters
    ----------
    x : dask.array.Array
        bool, integer, float32 or float64 chunks of NumPy or CuPy arrays (float16 with a
        float32 or float64 ``dtype=``, as for :func:`scan_array`); N-D input is taken
        in C order (``x.ravel()``), as ``np.cumsum`` without ``axis``. 1-D input may have
        unknown chunk sizes (a lazy compaction's; the result's are unknown too, as
        ``da.cumsum``'s); N-D input needs known ones.
    exclusive : bool
        ``False`` (the default): ``np.cumsum``. ``True``: element i is the sum of the elements
        before i (0 first).
    algorithm : str
        The per-chunk scan, as for :func:`scan_array`: ``"auto"``/``"sequential"`` for NumPy
        chunks, ``"auto"``/``"lookback"`` and the other GPU algorithms for CuPy chunks (each
        adds the chunk's offset in its last pass).
    dtype : dtype, optional
        The accumulator and output dtype, as for :func:`scan_array` (default: ``np.cumsum``'s).

    Returns
    -------
    dask.array.Array
        1-D, ``x.size`` elements, the chunks of ``x.ravel()``, chunks of ``x``'s array type.

    Raises
    ------
    TypeError
        ``x`` is not a dask array, or of an unsupported chunk type or dtype.
    ValueError
        Unknown chunk sizes of N-D input, an unknown algorithm, or one for the other device.

    Notes
    -----
    Past the first chunk, each value is the chunk's own scan plus the sum of the chunks'
    totals before it (as ``da.cumsum`` adds): integers equal ``np.cumsum``'s exactly, floats
    to rounding, and where the running sum overflows to inf a later chunk can come back
    finite (an overflow inside the totals can cancel), where NumPy's stays inf.

    Examples
    --------
    >>> import dask.array as da
    >>> import dask_compact
    >>> x = da.arange(1, 8, chunks=3)
    >>> y = dask_compact.cumsum(x)
    >>> y.chunks
    ((3, 3, 1),)
    >>> y.compute()
    array([ 1,  3,  6, 10, 15, 21, 28])
    >>> dask_compact.cumsum(x, exclusive=True).compute()
    array([ 0,  1,  3,  6, 10, 15, 21])
    """
    settings.warn_unknown()
    import dask.array as da
    from dask.array.utils import meta_from_array
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    from .api import _check_dask_array, _native, _ravel
    from .graph import without_empty_chunks

    x = _check_dask_array(x, "cumsum")
    exclusive = check_flag(exclusive, "exclusive", "cumsum")
    acc = scan_dtype(x.dtype, dtype)
    alg = _check_algorithm(algorithm, _is_gpu(x._meta), "cumsum")
    unknown = any(math.isnan(c) for cs in x.chunks for c in cs)
    if unknown and x.ndim != 1:
        raise ValueError(
            f"cumsum of {x.ndim}-D input with unknown chunk sizes: its C order needs them; "
            "call x.compute_chunk_sizes() first (or pass a 1-D array)"
        )
    x1 = _ravel(_native(x))
    token = tokenize("dask_compact.cumsum", x1.name, exclusive, alg, acc.str)
    totals, offsets, name = f"cumsum-total-{token}", f"cumsum-offsets-{token}", f"cumsum-{token}"
    nb = x1.numblocks[0]
    declared = x1.dtype
    shapes = block_shapes(x1.chunks)
    # Unknown chunk sizes (a lazy compaction's, x[x > t]'s; as da.cumsum takes them, with
    # unknown sizes out): each total comes with its chunk's size, and the offsets task tells
    # which chunks have no element before them (refused until 2026-12-07, a new-user probe)
    total = _total_and_size if unknown else _total_block
    dsk: dict = {(totals, i): (total, (x1.name, i), acc, declared, i, shapes[i])
                 for i in range(nb)}
    dsk[(offsets, 0)] = ((_offsets_and_leads if unknown else _offsets),
                         [(totals, i) for i in range(nb)], acc)
    before = 0  # elements in the chunks before chunk i
    for i, size in enumerate(x1.chunks[0]):
        dsk[(name, i)] = (_scan_block, (x1.name, i), (offsets, 0), i, exclusive, alg, acc,
                          declared, None if unknown else before == 0, shapes[i])
        before += size
    deps: list[Any] = [x1]  # dask's typing does not count its Array as a DaskCollection
    graph = HighLevelGraph.from_collections(name, dsk, dependencies=deps)
    meta = meta_from_array(x1._meta, ndim=1, dtype=acc)
    workers_installed.check(x1)  # computed later (see workers_installed)
    # the input's chunks, less the empty ones (graph.without_empty_chunks: Dask mishandles them)
    return without_empty_chunks(da.Array(graph, name, chunks=x1.chunks, meta=meta))


def _offsets(totals: list[Any], acc: np.dtype) -> np.ndarray:
    """Every chunk's global offset: the exclusive scan of the chunk totals, in the dtype the
    scans of output dtype ``acc`` add in (:func:`summing_dtype`), in order (integers wrap
    as NumPy's cumsum does)."""
    acc = summing_dtype(acc)
    t = np.asarray(totals, dtype=acc)
    out = np.zeros(t.size, dtype=acc)
    if t.size > 1:
        with np.errstate(over="ignore"):
            np.cumsum(t[:-1], dtype=acc, out=out[1:])
    return out


def _offsets_and_leads(pairs: list[tuple[Any, int]],
                       acc: np.dtype) -> tuple[np.ndarray, list[bool]]:
    """For chunks of unknown sizes, :func:`_offsets` of their totals and, per chunk, whether
    no element comes before it (its scan is then NumPy's bit for bit; see _scan_block)."""
    sizes = np.array([n for _, n in pairs], dtype=np.int64)
    before = np.concatenate([[0], np.cumsum(sizes)[:-1]]) if sizes.size else sizes
    return _offsets([t for t, _ in pairs], acc), [bool(b == 0) for b in before]


def _total_and_size(block: Any, acc: np.dtype, declared: np.dtype | None = None, i: int = 0,
                    shape: tuple[int, ...] | None = None) -> tuple[Any, int]:  # fmt: skip
    """:func:`_total_block` and the chunk's size, for chunks of unknown sizes."""
    return _total_block(block, acc, declared, i, shape), int(block.size)


# Tasks call these module functions, never the Dispatch objects themselves: one in a task is
# pickled by value for a distributed worker, and there the lazy CuPy registration fills in the
# module's object, not the copy ("No dispatch for <class 'cupy.ndarray'>" on every worker).
# Each takes chunk i in x's ``declared`` dtype (validate.as_declared): a float64 chunk under a
# float32 array was summed in float32 without a word, a float32 one under float64 is cast.
def _total_block(block: Any, acc: np.dtype, declared: np.dtype | None = None, i: int = 0,
                 shape: tuple[int, ...] | None = None) -> Any:  # fmt: skip
    # the step is dispatched on the chunk's type: see validate.check_chunk; ``shape``: the
    # chunk's declared one (the offsets of the chunks after it are made of the totals, the
    # result's chunks of the declared sizes)
    block = as_declared(block, declared, "cumsum", i, shape=shape)
    acc = summing_dtype(acc)  # the narrow output dtypes are summed wider (see there)
    return scan_total(widened(block, acc), acc)


def _scan_block(block: Any, offsets: np.ndarray, i: int, exclusive: bool, algorithm: str,
                acc: np.dtype, declared: np.dtype | None = None, leads: bool | None = None,
                shape: tuple[int, ...] | None = None) -> Any:  # fmt: skip
    block = as_declared(block, declared, "cumsum", i, shape=shape)
    # A chunk with no element before it (the first, or one after empty chunks only: ``leads``)
    # has no offset: its scan is NumPy's bit for bit (see scan_chunk). Keyed by i == 0 until
    # 2026-12-01, a leading empty chunk made the next one add 0.0 (-0.0 came back 0.0, a
    # signalling NaN quieted; a new-user probe). Chunks of unknown sizes: the offsets task
    # gives (offsets, leads).
    if isinstance(offsets, tuple):
        offsets, firsts = offsets
        leads = firsts[i]
    if leads is None:
        leads = i == 0
    s = summing_dtype(acc)  # the narrow output dtypes are summed wider (see there)
    return scan_chunk(widened(block, s), exclusive, algorithm, s, None if leads else offsets[i],
                      out_dtype=None if s is acc else acc)
