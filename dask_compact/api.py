"""The Dask-level public API: :func:`map_compact`, :func:`compact`, :func:`flatnonzero`."""

from __future__ import annotations

import logging
import math
from typing import Any

import dask.array as da
import numpy as np
from dask.array.utils import meta_from_array
from dask.base import tokenize
from dask.utils import parse_bytes

from . import settings
from .graph import Plan, build, computed_call, input_form, without_empty_chunks
from .joined_chunks import declared_chunks, flat_blocks, joins_in_c_order, rechunked
from .predicate import Predicate, PredicateLike, as_predicate
from .predicate.core import NotElementwise, check_sample
from .predicate.expr import Call, Param, Var
from .validate import (
    as_declared_block,
    check_algorithm,
    check_chunk_type,
    check_dask_input,
    check_dtype,
    check_flag,
    check_output,
    native,
    times_refused,
    xarray_object,
)

logger = logging.getLogger("dask_compact")

Result = da.Array | tuple[da.Array, da.Array]
ChunksArg = None | int | str


def map_compact(
    x: da.Array,
    pred: PredicateLike,
    *,
    output: str = "values",
    lazy: bool = False,
    stable: bool = True,
    algorithm: str = "auto",
    chunks: ChunksArg = None,
    by_worker: bool = True,
) -> Result:
    """Select the elements of a dask array where an elementwise predicate holds.

    Each chunk is compacted on the worker (and GPU) that holds it; only the chunk counts come
    back to the client, where their exclusive scan gives the global offsets. The result is a
    1-D dask array with **known chunk sizes** (unless ``lazy=True``), persisted where it was
    computed, ready to slice, rechunk or store; nothing is recomputed from ``x``'s graph.

    Parameters
    ----------
    x : dask.array.Array
        Input of any shape and chunking, with NumPy or CuPy chunks. N-D input is taken in
        NumPy's C order (as ``x.ravel()``; dask rechunks first where the trailing axes are
        split into several chunks). ``datetime64`` and ``timedelta64`` (NumPy chunks): the
        predicate is evaluated by NumPy on each chunk (``lambda v: v > t0``), always stable,
        and the values selected by that mask (:func:`compact`).
    pred : callable or str
        Elementwise predicate. A callable (``lambda v: (v > 0.2) & (v < 0.3)``) is traced once
        into an expression that is compiled into the CPU loop or the GPU kernel; its literal
        constants are parameters, so a new threshold does not recompile. A callable that cannot
        be traced (``np.isin``, Python ``if`` on the data) is evaluated per chunk as a mask;
        on N-D input it may hold arrays that broadcast against the trailing axes, as in
        NumPy's ``a[a < c]`` (``lambda v: v < np.array([0.2, 0.5, 0.8])`` on (n, 3) data,
        evaluated on blocks of whole rows). A string is an expression in ``x``
        (``"(x > 0.2) & (x < 0.3)"``), parsed against a whitelist and never evaluated.
        Reductions (``v > v.mean()``) are refused: they would reduce each chunk, not the
        array.
    output : {"values", "indices", "both"}
        ``"values"``: ``np.asarray(x)[pred(np.asarray(x))]``. ``"indices"``: int64 global flat
        indices, ``np.flatnonzero(pred(np.asarray(x)))``. ``"both"``: ``(values, indices)``
        with identical chunks.
    lazy : bool
        Compute nothing now: phase 2 (the scan of the counts) stays in the graph, and the
        result's chunk sizes are unknown (nan) until computed.
    stable : bool
        Keep the original order. ``False`` lets the GPU reorder within a chunk (faster hybrid
        kernel); the CPU keeps the order either way.
    algorithm : {"auto", "single-pass", "three-pass", "hybrid", "scan"}
        GPU kernel variant (ignored for NumPy chunks, except ``"scan"``: the textbook map ->
        scan -> scatter compaction on either device, see :func:`compact_array`).
    chunks : int, "auto" or str, optional
        Rebalance the result into uniform chunks of this many elements (rows, for N-D
        output), using the global offsets: -1 for one chunk, ``"auto"`` for dask's size
        (the config ``array.chunk-size``), or a byte size such as ``"64MiB"`` for chunks of
        at most about that many bytes (the widest output's, as ``rechunk`` takes it).
    by_worker : bool
        When ``x`` is persisted on a distributed cluster, ask each worker directly (no Dask
        task: one round trip to the workers, each registering its pieces with the scheduler
        before it answers) to compact all the
        chunks it holds, one job per worker thread (one per GPU worker), wherever Dask placed
        them (consecutive or not); the result has one chunk per run of consecutive chunks
        (cut into a few where there are fewer than 5 runs; empty ones left out, see Returns),
        in the input's order, held where it
        was made, with no chunk moved between workers and with the tasks that remake a piece
        lost with its worker. Where that cannot run (or with
        ``dask.config.set({"dask-compact.direct": False})``), one task per worker thread does
        the same, its output chunks taken from its result by getitems left in the result's
        graph. This keeps Dask's per-task cost (about a millisecond) from dominating chunks
        that a GPU compacts in less. ``False``: one task per input chunk, and one output
        chunk per input chunk that selected something.
        Other schedulers and inputs always take one task per chunk.

    Returns
    -------
    dask.array.Array, or a tuple ``(values, indices)`` for ``output="both"``.
        Eager: no empty chunk (an empty result is one chunk of length 0), since Dask
        mishandles them (``y[::-1]``, ``y.std()``, ``y[[0, 3]]``, ...): the chunks that
        selected nothing are left out, with no task and no copy.

    Raises
    ------
    TypeError
        ``x`` is not a dask array, its dtype is not supported, or the predicate does not give
        booleans for it.
    ValueError
        Unknown ``output``/``algorithm``, a predicate that is not elementwise or contains a
        reduction, a string predicate outside the whitelist, ``chunks`` with ``lazy=True``, or
        N-D input of unknown chunk sizes.

    Examples
    --------
    >>> import dask.array as da
    >>> import dask_compact
    >>> x = da.arange(10, chunks=4)
    >>> y = x.map_compact(lambda v: (v % 3) == 0)
    >>> y.chunks
    ((2, 1, 1),)
    >>> y.compute()
    array([0, 3, 6, 9])
    >>> x.map_compact("x > 6", output="indices").compute()
    array([7, 8, 9])
    >>> v, i = x.map_compact("x < 2", output="both")
    >>> v.compute(), i.compute()
    (array([0, 1]), array([0, 1]))
    >>> x.map_compact("x >= 0", chunks=5).chunks
    ((5, 5),)
    >>> z = x.map_compact("x > 6", lazy=True)
    >>> z.chunks
    ((nan, nan, nan),)
    >>> z.compute()
    array([7, 8, 9])
    """
    settings.warn_unknown()
    x = _check_dask_array(x, "map_compact")
    lazy = check_flag(lazy, "lazy", "map_compact")
    stable = check_flag(stable, "stable", "map_compact")
    by_worker = check_flag(by_worker, "by_worker", "map_compact")
    check_output(output)
    check_algorithm(algorithm, stable)
    if x.dtype.kind in ("m", "M"):
        return _compact_times(x, pred, output, lazy, chunks)
    check_dtype(x.dtype, "map_compact", output)
    out_chunks = _check_chunks(chunks, lazy)
    p = as_predicate(pred)
    x = _native(x)
    whole = _whole_rows(p, x)
    if whole is not None:
        # the callable makes the mask on blocks of whole rows, and the mask selects
        mask = da.map_blocks(_mask_block, whole, p, declared=x.dtype, dtype=bool,
                             meta=meta_from_array(x._meta, ndim=x.ndim, dtype=bool))
        return compact(whole, mask, output=output, lazy=lazy, chunks=chunks)
    x1 = _ravel(x)
    # lazy, by_worker and the input's form build different tasks under these keys
    form = input_form(x1)
    token = tokenize("map_compact", x1.name, p, output, stable, algorithm, lazy,
                     by_worker, form, computed_call(lazy, form))
    # N-D rows of whole trailing axes: chunk i of x1 is block (i, 0, ...) of x, flattened
    whole_rows = (x.ndim > 1 and not _unknown(x) and x1.numblocks[0] == x.numblocks[0]
                  and all(n == 1 for n in x.numblocks[1:]))
    plan = Plan(x1, None, p, output, stable, algorithm, token, by_worker,
                source=x if whole_rows else None)
    return _result(build(plan, lazy, out_chunks), output)


def compact(
    x: da.Array,
    mask: Any,
    *,
    output: str = "values",
    lazy: bool = False,
    chunks: ChunksArg = None,
) -> Result:
    """Select the elements of ``x`` where the boolean array ``mask`` is true.

    ``mask`` is a boolean dask or NumPy array of ``x``'s shape (it is rechunked to ``x``'s
    chunks where they differ; where either has unknown chunk sizes, their blocks are paired
    in order, which needs as many blocks on both sides). Same result and phases as
    :func:`map_compact`. A predicate is :func:`map_compact`'s (TypeError here); rows of N-D
    ``x`` by a mask of one value per row are :func:`compact_records`'s (ValueError here,
    saying how).

    ``x`` may also hold ``datetime64`` or ``timedelta64`` values (NaT included), selected
    as their 8-byte integers, or fixed-width strings (``U<n>``, ``S<n>``; known chunk sizes
    needed), gathered as :func:`compact_records` gathers a field: a mask of Dask's own
    comparison selects them, ``compact(x, x == "a")``. ``output``, ``lazy`` and ``chunks``
    are :func:`map_compact`'s: the values, their global flat indices or both; nothing
    computed now; the result rebalanced into uniform chunks.

    Examples
    --------
    >>> import dask.array as da, numpy as np
    >>> from dask_compact import compact
    >>> x = da.arange(6, chunks=4)
    >>> compact(x, np.array([True, False, False, True, True, False])).compute()
    array([0, 3, 4])
    >>> t = da.from_array(np.arange("2026-01", "2026-07", dtype="datetime64[M]"), chunks=4)
    >>> compact(t, t >= np.datetime64("2026-04")).compute()
    array(['2026-04', '2026-05', '2026-06'], dtype='datetime64[M]')
    """
    settings.warn_unknown()
    x = _native(_check_dask_array(x, "compact"))
    lazy = check_flag(lazy, "lazy", "compact")
    check_output(output)
    _check_mask_is_an_array(mask, x)
    if x.dtype.kind in ("m", "M"):
        # datetime64 / timedelta64: 8-byte integers with a unit (NaT one of them), which a
        # mask selects as their int64 bits; the values come back in x's dtype
        out = compact(_view(x, np.dtype(np.int64)), mask, output=output, lazy=lazy,
                      chunks=chunks)
        if isinstance(out, tuple):  # output="both"
            return _view(out[0], x.dtype), out[1]
        return out if output == "indices" else _view(out, x.dtype)
    text = x.dtype.kind in ("U", "S")  # fixed-width strings: gathered, never compared
    if not text:
        check_dtype(x.dtype, "compact", output)
    out_chunks = _check_chunks(chunks, lazy)
    if isinstance(mask, np.ma.MaskedArray):
        check_chunk_type(mask, "compact")
    if not isinstance(mask, da.Array):
        mask = np.asarray(mask)
        # before the shape check: until 2026-12-01 x's nan shape failed it first, and the
        # error said "mask has shape (4,), x has shape (nan,)" (a new-user probe)
        if _unknown(x):
            raise ValueError(
                "a NumPy mask needs x with known chunk sizes; call x.compute_chunk_sizes()"
            )
        _check_mask_shape(mask, x)
        mask = da.from_array(mask, chunks=x.chunks)
    check_dask_input(mask, "the mask")
    check_chunk_type(mask._meta, "compact")
    if mask.dtype != np.dtype(bool):
        raise TypeError(f"mask must be boolean, not {mask.dtype}")
    if not _unknown(x) and not _unknown(mask):
        _check_mask_shape(mask, x)
    x1 = _ravel(x)
    m1 = _ravel(mask, "the mask")
    if _unknown(x1) or _unknown(m1):
        # blocks are paired in order (each task checks that its two blocks match)
        if m1.numblocks != x1.numblocks:
            which = " and ".join(n for n, a in (("x", x1), ("mask", m1)) if _unknown(a))
            raise ValueError(
                f"{which} {'have' if ' and ' in which else 'has'} unknown chunk sizes and the "
                f"two have different numbers of chunks ({x1.numblocks[0]} and "
                f"{m1.numblocks[0]}); call compute_chunk_sizes() first"
            )
    elif m1.chunks != x1.chunks:
        m1 = rechunked(m1, x1.chunks, "compact", "the mask")
    if text:
        return _compact_text(x1, m1, output, lazy, chunks)
    forms = (input_form(x1), input_form(m1))
    token = tokenize("compact", x1.name, m1.name, output, lazy, *forms,
                     computed_call(lazy, *forms))
    plan = Plan(x1, m1, None, output, True, "auto", token)
    return _result(build(plan, lazy, out_chunks), output)


def _compact_text(x1: da.Array, m1: da.Array, output: str, lazy: bool,
                  chunks: ChunksArg) -> Result:
    """:func:`compact` of fixed-width strings (flat ``x1``, its aligned mask ``m1``): the
    records' gather copies their bytes as any field's, so the result has known chunks and
    the phases of every other dtype. Until 2026-12-07 they were refused, pointing to
    ``x.ravel()[flatnonzero(mask)]``, whose indexing by a dask array made each output chunk
    read every input chunk (dask's "Increasing number of chunks" warning; 1e6 strings in
    100 chunks 4.8 s, through the records 1.1 s)."""
    from .records import compact_records

    # unknown chunk sizes (x[m]): the records pair the strings and the mask chunk by chunk
    if output == "indices":  # the strings are not needed
        return compact(m1, m1, output="indices", lazy=lazy, chunks=chunks)
    got = compact_records({"values": x1, "keep": m1}, "keep", indices=output == "both",
                          lazy=lazy, chunks=chunks)
    return (got["values"], got["indices"]) if output == "both" else got["values"]


def _check_mask_is_an_array(mask: Any, x: da.Array) -> None:
    """TypeError for a ``mask`` that is no array: a predicate (``compact(x, lambda v: v >
    3)`` said "mask has shape ()", where map_compact was meant), a scalar or None."""
    if isinstance(mask, str) or callable(mask):
        raise TypeError(
            f"compact selects by a mask: a boolean dask or NumPy array of x's shape "
            f"{x.shape}, not a {type(mask).__name__}; for a predicate (a callable or a "
            "string) use dask_compact.map_compact(x, pred) or x.map_compact(pred)"
        )
    # a 0-d mask of 0-d x has its shape (NumPy's a[np.array(True)] is [a]): the usual checks
    if not isinstance(mask, da.Array) and np.ndim(mask) == 0 and x.ndim > 0:
        raise TypeError(
            f"mask must be a boolean dask or NumPy array of x's shape {x.shape}, not "
            f"{mask!r}; to select by a condition, pass it computed on x (compact(x, x > 3)), "
            "or the predicate to x.map_compact(pred)"
        )


def _check_mask_shape(mask: Any, x: da.Array) -> None:
    """ValueError unless ``mask`` has ``x``'s shape; for a mask of one value per row of N-D
    ``x``, the two ways to select rows."""
    if mask.shape == x.shape:
        return
    how = ""
    if x.ndim > 1 and mask.shape == x.shape[:1]:
        # both tried (tests/test_errors.py): compact_records gathers whole rows with known
        # chunks; a mask broadcast over the row selects the same elements, flattened
        nones = ", ".join(["None"] * (x.ndim - 1))
        how = (
            ". compact selects elements by a mask of x's shape; to select rows of x by a mask "
            "of one value per row, take x as a record's field: dask_compact.compact_records("
            '{"x": x, "keep": mask}, "keep")["x"] (rows of shape (k, '
            f"{', '.join(map(str, x.shape[1:]))}), known chunks; a NumPy mask wrapped in "
            "da.from_array first), or broadcast the mask to x's shape: dask_compact.compact("
            f"x, da.broadcast_to(mask[:, {nones}], x.shape)) (the rows' elements, flattened "
            "in C order)"
        )
    raise ValueError(f"mask has shape {mask.shape}, x has shape {x.shape}{how}")


def flatnonzero(
    a: da.Array, *, lazy: bool = False, chunks: ChunksArg = None
) -> da.Array:
    """Global flat indices of the non-zero elements of ``a``, with known chunk sizes.

    Equals ``np.flatnonzero(np.asarray(a))``; ``datetime64`` and ``timedelta64`` input
    included (non-zero: not the epoch, not a zero duration; NaT is non-zero). ``lazy`` and
    ``chunks`` are :func:`map_compact`'s: nothing computed now (the chunk sizes nan until
    computed); the result rebalanced into uniform chunks of that size.

    Examples
    --------
    >>> import dask.array as da
    >>> from dask_compact import flatnonzero
    >>> flatnonzero(da.from_array([0, 3, 0, 1, 2], chunks=2)).compute()
    array([1, 3, 4])
    """
    settings.warn_unknown()
    a = _check_dask_array(a, "flatnonzero")
    lazy = check_flag(lazy, "lazy", "flatnonzero")
    if a.dtype.kind in ("m", "M"):  # NumPy's non-zero datetimes: not the epoch (NaT is not)
        a = _view(_native(a), np.dtype(np.int64))
    check_dtype(a.dtype, "flatnonzero")
    if a.dtype == np.dtype(bool):
        pred = Predicate(Var(), (), None, "x")
    else:
        zero = a.dtype.type(0)
        expr = Call("not_equal", (Var(), Param(0, a.dtype.name)))
        pred = Predicate(expr, (zero,), None, "x != 0")
    out = map_compact(a, pred, output="indices", lazy=lazy, chunks=chunks)
    assert isinstance(out, da.Array)  # one output: never the ("both") tuple
    return out


# the in-memory call of each dask call, for the message to a caller who passed an array
# (flatnonzero was pointed to compact_array until 2026-12-01, fourteenth session: a
# new-user probe; NumPy's own call is the one; and compact, a selection by a mask, until
# 2026-12-01, fifteenth session, a regression review: compact_array refuses a mask, pointing
# back to compact)
_IN_MEMORY = {"cumsum": "dask_compact.scan_array", "partition": "dask_compact.partition_array",
              "flatnonzero": "np.flatnonzero", "compact": "NumPy's a[mask]"}


def _check_dask_array(x: Any, fn: str) -> da.Array:
    if not isinstance(x, da.Array):
        xarray = xarray_object(x, selects=fn != "cumsum")
        if xarray is not None:
            raise TypeError(f"{fn} needs a dask array, not {xarray}")
        raise TypeError(
            f"{fn} needs a dask array, not {type(x).__name__}; wrap it with "
            f"dask.array.from_array(...), or use "
            f"{_IN_MEMORY.get(fn, 'dask_compact.compact_array')} for an in-memory array"
        )
    check_dask_input(x, "x")
    check_chunk_type(x._meta, fn)
    return x


def _view(x: da.Array, dtype: np.dtype) -> da.Array:
    """x's blocks viewed as ``dtype`` of the same item size (dask's ``Array.view`` needs known
    chunk sizes), each first in x's declared dtype (see :func:`_view_block`)."""
    return da.map_blocks(_view_block, x, declared=x.dtype, view_as=dtype, dtype=dtype)


def _view_block(block: Any, declared: np.dtype, view_as: np.dtype,
                block_id: tuple[int, ...] | None = None) -> Any:
    """``block`` as ``declared``, then its bits as ``view_as``. A chunk need not hold the
    dtype its dask array declares (``map_blocks(f, dtype="M8[s]")`` of chunks that are
    ``M8[s]`` under ``M8[ms]``, or ``>M8[s]``): a view of the chunk's bits in the declared
    dtype read seconds as milliseconds, and big-endian bytes as garbage dates (a new-user
    probe). Taken in the declared dtype by the rule of every chunk (validate.as_declared:
    cast where exact, refused where not, free where they agree)."""
    return as_declared_block(block, declared, "dask_compact", block_id).view(view_as)


def _native(x: da.Array) -> da.Array:
    """x in native byte order (converted chunk by chunk as it is read; see validate.native),
    each chunk by the rule of every chunk (validate.as_declared): Dask's ``astype`` casts
    any chunk, a float64 one of a ``>f4`` array to float32 as well."""
    dt = native(x.dtype)
    if dt == x.dtype:
        return x
    return da.map_blocks(as_declared_block, x, declared=dt, fn="dask_compact", dtype=dt,
                         meta=meta_from_array(x._meta, dtype=dt))


_MAX_CHUNK = np.iinfo(np.int64).max  # dask keeps chunk sizes in int64 arrays


def _unknown(x: da.Array) -> bool:
    return any(math.isnan(c) for cs in x.chunks for c in cs)


def _check_chunks(chunks: ChunksArg, lazy: bool) -> ChunksArg:
    if chunks is None:
        return None
    if lazy:
        raise ValueError(
            "chunks= rebalances with the global offsets, which lazy=True does not compute; "
            "use lazy=False, or rechunk after compute_chunk_sizes()"
        )
    if isinstance(chunks, str):
        if chunks == "auto":
            return chunks
        try:  # a byte size, as dask's rechunk takes it ("64MiB": rows of that many bytes);
            # a number first (dask's parse_bytes reads "" as 1 byte and "MiB" as 1 MiB)
            size = parse_bytes(chunks) if chunks.strip()[:1].isdigit() else 0
        except ValueError:
            size = 0
        if size > 0:
            return chunks
    elif (
        isinstance(chunks, (int, np.integer))
        and not isinstance(chunks, (bool, np.bool_))
        and (0 < chunks <= _MAX_CHUNK or chunks == -1)
    ):
        return int(chunks)
    raise ValueError(
        "chunks must be a positive int (at most 2**63 - 1), -1 (one chunk), \"auto\" or a "
        f"byte size such as \"64MiB\", not {chunks!r}"
    )


def _compact_times(x: da.Array, pred: PredicateLike, output: str, lazy: bool,
                   chunks: ChunksArg) -> Result:
    """map_compact of datetime64 / timedelta64 values: the predicate evaluated by NumPy on
    each chunk (the compiled loop and kernels take numeric dtypes), then :func:`compact` by
    that mask. Always stable; ``algorithm`` and ``by_worker`` do not apply."""
    p = as_predicate(pred)
    x = _native(x)
    with times_refused(p.source, x.dtype):
        _check_predicate(p, x)
        if p.path == "fused":  # typed for numbers only: NumPy says now whether it has a loop
            p.mask(check_sample(x.dtype, like=meta_from_array(x._meta, ndim=1, dtype=x.dtype)),
                   what="a test sample")
    mask = da.map_blocks(_times_mask_block, x, p, declared=x.dtype, dtype=bool)
    return compact(x, mask, output=output, lazy=lazy, chunks=chunks)


def _times_mask_block(block: Any, p: Predicate, declared: np.dtype,
                      block_id: tuple[int, ...] | None = None) -> Any:
    """:func:`_mask_block` of a time chunk, NumPy's refusal of a time and a number told as
    :func:`_compact_times` tells it: a mask-path callable's failure on the test sample is left
    to the tasks (:func:`_check_predicate`), which until 2026-12-01 (fifteenth session, a
    regression review) raised NumPy's bare "ufunc 'greater' did not contain a loop", where
    compact_array gave the same callable the times' form."""
    with times_refused(p.source, declared):
        return _mask_block(block, p, declared, block_id)


def _mask_block(block: Any, p: Predicate, declared: np.dtype | None = None,
                block_id: tuple[int, ...] | None = None) -> Any:
    """The mask-path predicate on chunk ``block`` in its array's ``declared`` dtype, as the
    compaction takes the chunk after it (validate.as_declared_block): evaluated on the chunk's own
    dtype, it could select what the values cast to the declared one would not."""
    if declared is not None:
        block = as_declared_block(block, declared, "map_compact", block_id)
    return p.mask(block)


def _check_predicate(p: Predicate, x: da.Array, rows: bool = False) -> None:
    """Fail now, not inside every chunk task: type the fused tree (and its constants), or try
    the mask-path callable on a small sample of x's type and dtype, which also runs the mask
    path's slice check (a callable that reduces its chunk is refused). Empty chunks never
    call it (see :meth:`Predicate.mask`): until 2026-11-30 an empty test chunk did, and
    ``np.vectorize`` without ``otypes`` failed there.
    ``rows``: the chunks are blocks of whole rows of the N-D ``x``, not flat runs."""
    p.check(x.dtype)
    if p.path == "fused":
        return
    row_shape = x.shape[1:] if rows else ()
    row = math.prod(row_shape)
    like = meta_from_array(x._meta, ndim=1, dtype=x.dtype)
    sample = check_sample(x.dtype, row * max(2, 64 // row), like).reshape(-1, *row_shape)
    try:
        with np.errstate(all="ignore"):
            p.mask(sample, every_row=True, what="a test sample")
    except NotElementwise:
        raise
    except Exception as e:  # noqa: BLE001 - it may fail on made-up values only; the tasks tell
        logger.debug("predicate %s failed on a sample chunk: %r", p.source, e)


def _whole_rows(p: Predicate, x: da.Array) -> da.Array | None:
    """None where the predicate ``p`` takes x's flat chunks (:func:`_check_predicate`); else
    ``x`` in blocks of whole rows (its trailing axes in one chunk), where the mask-path
    callable takes those: per-column constants (``x < np.array([a, b, c])`` on (n, 3)
    data), which NumPy's ``a[a < c]`` and compact_array accept, cannot broadcast against
    flattened chunks. Raises what :func:`_refused_by_rows` says where p takes neither."""
    try:
        _check_predicate(p, x)
    except NotElementwise as flat:
        refusal = _refused_by_rows(p, x, flat)
        if refusal is not None:
            raise refusal from None
        whole = rechunked(x, {i: -1 for i in range(1, x.ndim)}, "dask_compact")
        # blocks already whole rows are not rechunked: each is checked all the same, since
        # the predicate takes them first (a block of 4 columns declared 3 failed there as a
        # predicate "not elementwise", naming no chunk; until 2026-12-01)
        return whole if whole is not x else declared_chunks(x, fn="dask_compact")
    return None


def _refused_by_rows(p: Predicate, x: da.Array, flat: NotElementwise
                     ) -> NotElementwise | None:
    """None where the mask-path callable ``p``, refused on flat chunks (``flat``: an array it
    holds does not broadcast against them), works on blocks of whole rows of the N-D ``x``
    (a small sample of rows, the slice check included); else what to
    raise: ``flat`` where rows do not apply, or why rows are refused (an array aligned with
    the whole input, a statistic of the block), which names the shape the caller knows."""
    if x.ndim < 2 or p.path == "fused":
        return flat
    if not math.prod(x.shape[1:]):
        return None  # rows of no elements: the input is empty, nothing to select
    try:
        _check_predicate(p, x, rows=True)
    except NotElementwise as refused:
        return refused
    except Exception as e:  # noqa: BLE001 -- it may fail on made-up values only; the tasks tell
        logger.debug("predicate %s failed on a sample of rows: %r", p.source, e)
    return None


def _ravel(x: da.Array, what: str = "the input") -> da.Array:
    """1-D view in C order whose chunks are contiguous runs of x's C order; where that
    joins chunks, each taken in x's declared dtype first (joined_chunks)."""
    if x.ndim == 1:
        return x
    if not _unknown(x) and x.size == 0:
        # Dask's reshape has no plan for a zero-length axis (and none is needed): one empty
        # chunk of x's array type.
        empty = meta_from_array(x._meta, ndim=1, dtype=x.dtype)[:0]
        return da.from_array(empty, chunks=(0,), meta=empty)
    if _unknown(x):
        raise ValueError(
            f"{x.ndim}-D input with unknown chunk sizes cannot be put in C order; call "
            "x.compute_chunk_sizes() first (or pass a 1-D array)"
        )
    if x.ndim > 1 and not joins_in_c_order(x):
        # blocks of whole rows, none empty: each checked (its declared shape too) and
        # flattened by a task of ours, in place of Dask's reshape (joined_chunks.flat_blocks)
        return flat_blocks(x, "dask_compact", what)
    # each chunk in x's declared dtype and of its declared shape before Dask joins chunks
    # (joined_chunks): a longer chunk's tail was cut away there (until 2026-12-01)
    x = declared_chunks(x, fn="dask_compact", what=what)
    if any(0 in c for c in x.chunks):
        # Dask's reshape accepts empty blocks but builds a graph that fails when computed
        # ("cannot reshape array of size 0", e.g. chunks ((2, 0), (4,))): drop them first
        x = x.rechunk(tuple(tuple(c for c in ax if c) for ax in x.chunks))
    try:
        return x.reshape(-1)
    except NotImplementedError:
        # Dask's reshape cannot always find contiguous chunks in one pass (e.g. empty arrays):
        # make the trailing axes single chunks, then every chunk is a run of C order.
        return x.rechunk({ax: -1 for ax in range(1, x.ndim)}).reshape(-1)


def _result(arrays: dict[str, da.Array], output: str) -> Result:
    if output == "both":
        return (without_empty_chunks(arrays["values"]),
                without_empty_chunks(arrays["indices"]))
    return without_empty_chunks(arrays[output])


from .accessor import adopt_docs  # noqa: E402 -- the method's docstring is this function's

adopt_docs(map_compact)
