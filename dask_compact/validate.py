"""Argument checks shared by the array-level and the Dask-level API, with errors that say what
to do."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

OUTPUTS = ("values", "indices", "both")
# "scan": the textbook map -> scan -> scatter compaction (dask_compact.scan), for comparison;
# not for compact_into (chunk.compact_into says so).
ALGORITHMS = ("auto", "single-pass", "three-pass", "hybrid", "scan")
# What the GPU kernels and the CPU loop are built for (no longdouble, no datetime/object/str).
DTYPES = tuple(
    np.dtype(t)
    for t in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
)


_NATIVE_DTYPES = frozenset(DTYPES)


def check_output(output: Any) -> None:
    if output not in OUTPUTS:
        raise ValueError(f"output must be one of {OUTPUTS}, not {output!r}")


def check_flag(value: Any, name: str, fn: str) -> bool:
    """A yes/no argument (``exclusive=``, ``stable=``, ``lazy=``, ``indices=``,
    ``by_worker=``) as a bool: True or False, a NumPy bool, or the integers 0 and 1 (as the
    ``dask-compact.*`` settings take them). Anything else is refused: until 2026-12-01 each
    call took ``bool(value)``, so ``exclusive="no"`` gave an exclusive scan and
    ``lazy="no"`` a lazy result, as a Python truth test would (a new-user probe)."""
    if value is True or value is False:
        return value
    if isinstance(value, (np.bool_, int, np.integer)) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{fn}: {name} must be True or False, not {value!r}")


def by_output(values: Any, indices: Any, output: str) -> Any:
    """What a call returns for ``output``: the values, the indices, or both as a pair."""
    if output == "values":
        return values
    if output == "indices":
        return indices
    return values, indices


def output_bytes(itemsize: int, output: str) -> int:
    """Bytes one selected element occupies in ``output``: its value (``itemsize``), its int64
    index, or both."""
    return {"values": itemsize, "indices": 8, "both": itemsize + 8}[output]


def check_algorithm(algorithm: Any, stable: bool) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, not {algorithm!r}")
    if algorithm == "hybrid" and stable:
        raise ValueError(
            'algorithm="hybrid" does not keep the input order within a chunk; '
            "pass stable=False to accept that"
        )


def check_dtype(dtype: Any, call: str | None = None, output: str = "values") -> None:
    """TypeError unless ``dtype`` is one of :data:`DTYPES` in either byte order. ``call``:
    the call refusing it, for its way out with times (a split's, :func:`times_split`, or
    ``compact_into``'s for its ``output``)."""
    if isinstance(dtype, np.dtype) and dtype in _NATIVE_DTYPES:  # a hash, not 14 comparisons
        return
    given = np.dtype(dtype)
    dtype = native(given)
    if dtype not in DTYPES:
        how = ""
        if dtype.kind in ("m", "M") and call in ("partition", "partition_array"):
            how = "; " + times_split(call, given, call == "partition_array")
        elif dtype.kind in ("m", "M") and call == "compact_into":
            # its own call on the int64 views (until 2026-12-02, sixteenth session, a
            # refusal probe: told the calls that take times, none of them into buffers)
            out = {"values": "out.view('i8')", "indices": "out, output='indices'",
                   "both": "(out[0].view('i8'), out[1]), output='both'"}.get(output, "out")
            how = ("; compact_into compacts numbers only: compact the times' int64 view, "
                   "comparing times on it viewed back, into the int64 view of the values' "
                   "buffer (they land there as times), "
                   f"`dask_compact.compact_into(a.view('i8'), lambda b: b.view(a.dtype) > t, "
                   f"{out})`")
        elif dtype.kind in ("m", "M"):  # what NumPy users filter by a comparison, x[x > t]
            how = ("; datetime64 and timedelta64 arrays are taken by map_compact, compact, "
                   "compact_array, flatnonzero, sort and argsort, and as fields "
                   "compact_records gathers, only")
        elif dtype.kind in _TEXT_KINDS:
            how = text_selection(dtype, call, output)
        elif dtype.fields:  # records in one array: compact_records takes them by field
            how = ("; for records, compact_records({name: x[name] for name in "
                   "x.dtype.names}, pred) selects every field by a predicate over the fields "
                   "(and its indices=True gives the rows, e.g. for a split)")
        raise TypeError(
            f"dask_compact compacts arrays of {', '.join(d.name for d in DTYPES)}; not "
            f"{dtype}{how}"
        )


# Strings (bytes, str, StringDType) and objects: compared by NumPy's own loops only, which
# the compiled loops and kernels are not.
_TEXT_KINDS = "USTO"
# the calls whose refusal of them says what selects them (a record field read by the batch
# command's --where is told nothing of Python: the command has no way round)
_TEXT_WAYS = ("compact_array", "compact_into", "partition_array", "map_compact", "compact",
              "partition", "flatnonzero")


def text_selection(dtype: np.dtype, call: str | None, output: str = "values") -> str:
    """The way out for strings or objects given to ``call`` (with its ``output``), which no
    call here compares: NumPy in memory; for a dask array, Dask's own comparison and
    :func:`dask_compact.compact` by it for fixed-width strings (which it gathers), Dask's
    boolean indexing and ``compute_chunk_sizes()`` for objects (flat, as the calls take N-D
    input). Until 2026-12-06 the refusal listed the numeric dtypes only
    (a new-user probe asked how to select strings). Empty where ``call`` has none."""
    if call not in _TEXT_WAYS:
        return ""
    what = "objects" if dtype.kind == "O" else "strings"
    lead = f"; {what} are compared by NumPy's own loops only: "
    fnz = "dask_compact.flatnonzero"
    if call == "partition_array":
        return (lead + "split them with NumPy, `m = a == v; np.concatenate([a[m], a[~m]]), "
                "int(m.sum())`")
    if call in ("compact_array", "compact_into"):
        code = {"indices": "np.flatnonzero(a == v)",
                "both": "a[a == v], np.flatnonzero(a == v)"}.get(output, "a[a == v]")
        return lead + f"select them with NumPy, `{code}`"
    if call == "flatnonzero":  # NumPy's non-zero: a non-empty string, a true object
        test = {"O": "x.astype(bool)", "S": "x != b''"}.get(dtype.kind, "x != ''")
        return lead + f"`{fnz}({test})` gives the indices of the non-zero ones"
    fixed = dtype.kind in "US"  # compact (and compact_records) gather them, not objects
    if call == "partition":
        if fixed:
            return lead + ("split them by a mask of Dask's, `r = x.ravel(); m = r == v; "
                           "s = dask_compact.compact(r, m); "
                           "da.concatenate([s, dask_compact.compact(r, ~m)]), s.size` (known "
                           "chunks)")
        return lead + ("split them by Dask's boolean indexing, `r = x.ravel(); m = r == v; "
                       "s = r[m].compute_chunk_sizes(); "
                       "da.concatenate([s, r[~m].compute_chunk_sizes()]), s.size` (known "
                       "chunks)")
    if fixed:
        # compact copies their bytes by a mask (a gather of the records'), known chunks; the
        # indices hint below indexes by a dask array, each output chunk reading every input
        # chunk (dask's "Increasing number of chunks" warning)
        arg = "" if output == "values" else f", output={output!r}"
        return (lead + f"select them by a mask of Dask's, `dask_compact.compact(x, x == v{arg})` "
                "(known chunks), or carry them as a field of compact_records beside the "
                "fields its predicate reads")
    # objects: Dask's boolean indexing, its chunk sizes computed (indexing by flatnonzero's
    # dask array, the hint until 2026-12-07, made each output chunk read every input chunk)
    m = "mask" if call == "compact" else "x == v"  # compact's own mask, where it has one
    pick = f"y = x.ravel()[({m}).ravel()]; y.compute_chunk_sizes()"
    code = {"indices": f"{fnz}({m})", "both": f"{pick}, {fnz}({m})"}.get(output, pick)
    return lead + f"select them by Dask's boolean indexing, `{code}` (known chunks)"


def times_split(call: str, dtype: np.dtype, in_memory: bool, masked: bool = False) -> str:
    """The way out for ``partition`` or ``partition_array`` (``call``) given times, which
    they do not split (the split's loops and kernels are numeric): split the times' int64
    view, the predicate comparing times on it viewed back (a masked array filled first with
    NaT, never selected). Until 2026-12-02 (sixteenth session, the fifteenth's probes) a
    masked one was told to fill it and call ``partition`` again, which refused the dtype,
    and an unmasked one the calls that take times, none of them a split."""
    a, ma = ("a", "np.ma") if in_memory else ("x", "da.ma")
    if in_memory:
        code = (f"v, k = dask_compact.{call}(a.view('i8'), lambda b: b.view(a.dtype) > t); "
                "v = v.view(a.dtype)")
    else:
        # chunk by chunk: dask's Array.view refuses unknown chunk sizes (x[x > t]'s), which
        # partition takes (a probe, 2026-12-07)
        code = (f"v, k = dask_compact.{call}(x.map_blocks(lambda b: b.view('i8'), dtype='i8'), "
                "lambda b: b.view(x.dtype) > t); "
                "v = v.map_blocks(lambda b: b.view(x.dtype), dtype=x.dtype)")
    if not masked:
        return (f"{call} splits numbers only: split the {dtype} values' int64 view, comparing "
                f"times on it viewed back, `{code}`")
    kind = "datetime64" if dtype.kind == "M" else "timedelta64"
    return (f"Say what masked elements mean, e.g. never selected (NaT fails every comparison: "
            f"never selected by `x > t`), and split the {dtype} values' int64 view ({call} "
            f"splits numbers only), comparing times on it viewed back: "
            f'`{a} = {ma}.filled({a}, np.{kind}("NaT")); {code}`')


def native(dtype: np.dtype) -> np.dtype:
    """``dtype`` in the machine's byte order: what the kernels and the CPU loop compute in.

    Big-endian data (``>f8`` from a Zarr v2 store or a ``.npy`` file) is float64 all the same;
    it is converted as it is read, and the results come back in native order."""
    return dtype if dtype.isnative else dtype.newbyteorder("=")


def to_native(a: Any, stream: Any = None) -> Any:
    """An in-memory array ``a`` in native byte order: ``a`` itself where it is, else a copy.
    NumPy's ``astype`` converts; a CuPy array of the other order (CuPy makes none, only views
    of a swapped dtype, ``a.view(a.dtype.newbyteorder())``) has each number's bytes reversed
    (:func:`reversed_bytes`), queued on ``stream`` (None: the current one) on ``a``'s device,
    where the call that reads the copy runs. CuPy's ``astype`` copies the bits as they are
    (its kernels type an element by kind and size: ``>f4`` is ``float``, read in CuPy's
    ``_scalar.get_typename``), and until 2026-12-01 (thirteenth session) that copy was made
    on the current stream, not on ``compact_into``'s ``stream=``, whose kernel could read it
    before it was written."""
    if a.dtype.isnative:
        return a
    if _module_of(a) != "cupy":
        return a.astype(native(a.dtype))
    import cupy

    with a.device, contextlib.nullcontext() if stream is None else stream:
        return reversed_bytes(cupy, a)


def other_order(a: Any) -> bool:
    """Whether ``a`` (an array, or a dask array) holds numbers of the other byte order, of a
    plain dtype: for CuPy a view of a swapped dtype (``a.view(a.dtype.newbyteorder())``),
    since CuPy makes no such arrays itself (``_dtype.check_supported_dtype`` refuses a ``>``
    byte order). A structured dtype's order is its members' (its own reads ``|``): CuPy
    makes those, and :func:`reversed_bytes` would reverse whole records."""
    return a.dtype.byteorder in "<>"


def reversed_bytes(xp: Any, a: Any) -> Any:
    """A C-contiguous copy of ``a`` (of the other byte order) in native order, through
    module ``xp`` (NumPy or CuPy): each number's bytes (each part's, for complex) reversed
    by a copy of its bytes viewed backwards. The native view of the same size comes first:
    CuPy refuses to allocate an array of the other order (the copy of a strided view)."""
    dt = native(a.dtype)
    unit = dt.itemsize // (2 if dt.kind == "c" else 1)
    raw = xp.ascontiguousarray(a.view(dt)).reshape(-1).view(np.uint8).reshape(-1, unit)
    return xp.ascontiguousarray(raw[:, ::-1]).reshape(-1).view(dt).reshape(a.shape)


def other_order_dtype(dtype: np.dtype) -> np.dtype | None:
    """``dtype`` in the other byte order where a NumPy buffer of that order is taken for
    ``dtype`` (a number or a time of more than one byte: :func:`other_order_view`), else
    None: the one rule the ``*_into`` calls' views and refusals follow."""
    other = dtype.newbyteorder()
    return other if dtype.kind in "biufcmM" and other != dtype else None


def other_order_view(buf: Any, dtype: np.dtype | None) -> tuple[Any, bool]:
    """``buf`` viewed as ``dtype``, and True, where it is a NumPy array of ``dtype`` in the
    other byte order (a number or a time: ``np.empty_like(a)`` of a big-endian ``a``, a
    native buffer for a big-endian field); else ``buf`` itself, and False, for the buffer
    checks to judge. The ``*_into`` calls write through the view and then swap what they
    wrote in place (:func:`swap_written`), so the buffer holds the selection in its own
    order: refused until 2026-12-01 (a new-user probe), where converting costs one pass over
    the selection and no allocation. CuPy has no non-native dtypes."""
    if (not isinstance(buf, np.ndarray) or dtype is None or buf.dtype == dtype
            or buf.dtype != other_order_dtype(dtype)):
        return buf, False
    return buf.view(dtype), True


def either_order(kind: str, dtype: np.dtype) -> str:
    """" (either byte order)" where a refusal of a buffer for ``dtype`` on ``kind``'s arrays
    ("numpy" or "cupy") must say that a buffer of the other byte order is taken too
    (:func:`other_order_view`: NumPy's numbers and times of more than one byte); else "".
    Until 2026-12-02 (nineteenth session) ``compact_into``'s refusals named the native
    dtype alone."""
    taken = kind == "numpy" and other_order_dtype(dtype) is not None
    return " (either byte order)" if taken else ""


def counted(count: Any) -> np.dtype | None:
    """The dtype a count buffer of either byte order is written in (int64 or uint64, in
    native order), for :func:`other_order_view`; None for anything else."""
    dt = native(count.dtype) if isinstance(count, np.ndarray) else None
    return dt if dt in (np.dtype(np.int64), np.dtype(np.uint64)) else None


def swap_written(views: list[Any], k: int, count: Any = None) -> None:
    """Swap in place the first ``k`` elements (rows) of each of ``views`` and, where
    given, the 1-element ``count``: the written part of buffers of the other byte order
    (:func:`other_order_view`), back in their own."""
    for view in views:
        view[:k].byteswap(inplace=True)
    if count is not None:
        count.byteswap(inplace=True)


def is_dask_array(a: Any) -> bool:
    """Whether ``a`` is a dask array (or another dask collection with chunks), without
    importing dask."""
    return type(a).__module__.split(".")[0] == "dask" and hasattr(a, "chunks")


def check_blocks_in_graph(a: Any, what: str) -> None:
    """ValueError where the dask array ``a`` lists more blocks than its graph computes.

    Dask's elementwise operations take an axis of length 1 as broadcastable, also one split
    into several chunks (the empty chunks ``compute_chunk_sizes()`` leaves on a lazy result
    of one element, chunks ``(1, 0)``): ``y > t`` then has chunks ``(1, 0)`` but one block,
    computed from ``y``'s first, and a task given the others got their keys as tuples
    ("'tuple' object has no attribute 'shape'", a new-user probe); where the element is not
    in the first chunk, the block computed is the empty one. Only such axes are looked at:
    anything else costs nothing."""
    if not any(len(c) > 1 and sum(c) == 1 for c in a.chunks):
        return
    from dask.core import flatten

    graph = a.__dask_graph__()
    keys = list(flatten(a.__dask_keys__()))
    held = sum(k in graph for k in keys)
    if held < len(keys):
        raise ValueError(
            f"{what} has chunks {a.chunks} but its graph computes {held} of its {len(keys)} "
            "blocks: Dask's elementwise operations take an axis of length 1 split into "
            "several chunks (the empty ones compute_chunk_sizes() leaves on a result of one "
            "element) as broadcastable, so what was computed from it (y > t) does not hold "
            "one value per element. Rechunk first, y = y.rechunk(-1), and compute the mask "
            "from that, or select with y.map_compact(pred)"
        )


# Dask's experimental array-expr mode: dask.array's collections (``Array`` and what
# ``from_array``, ``map_blocks``... return) are then those of this package.
_ARRAY_EXPR = "dask.array._array_expr"


def _is_array_expr(a: Any) -> bool:
    """Whether ``a`` is an array (or the class of one) of dask's array-expr mode."""
    module = a.__module__ if isinstance(a, type) else type(a).__module__
    return module == _ARRAY_EXPR or module.startswith(_ARRAY_EXPR + ".")


def check_not_array_expr(a: Any, what: str) -> None:
    """NotImplementedError where dask's array-expr mode is on (the config
    ``array.query-planning``, read once, when ``dask.array`` is first imported): ``dask.array``
    then builds expression collections, which take no graph, and this package's graphs are
    built as ``da.Array(graph, name, chunks, ...)`` over ``HighLevelGraph`` layers and
    deterministic output keys (what held results, eager calls and the sort's exchange name
    and look up). Under that mode, each call crashed somewhere inside ("Array.__init__() got
    an unexpected keyword argument 'chunks'", "'dict' object has no attribute 'layers'", a
    new-user probe); dask's own ``FromGraph`` renames the output keys, so it is no small
    fix. Checked on the input and on ``dask.array.Array`` (the mode, also for an array made
    without it)."""
    import sys

    da = sys.modules.get("dask.array")
    if not _is_array_expr(a) and not (da is not None and _is_array_expr(da.Array)):
        return
    raise NotImplementedError(
        f"dask_compact does not support dask's array-expr mode yet (the dask config "
        f"array.query-planning is True here, so {what} is a {type(a).__module__}."
        f"{type(a).__name__}). Turn it off before dask.array is first imported: unset "
        "DASK_ARRAY__QUERY_PLANNING (or set it to False), or call "
        "dask.config.set({'array.query-planning': False}) before `import dask.array` "
        "(dask reads the setting once, at that import)"
    )


def check_dask_input(a: Any, what: str) -> None:
    """The checks of every dask input of a public call (``x``, ``compact``'s mask, each
    record field; ``what`` names it), lazy or eager, before anything is built or submitted:
    not under dask's array-expr mode (:func:`check_not_array_expr`), every block in its
    graph (:func:`check_blocks_in_graph`), and no futures of a closed client, or cancelled,
    under it (:func:`.call_client.check_futures_live`). The first check of each: the calls
    run it before the checks of the chunk type and dtype."""
    check_not_array_expr(a, what)
    check_blocks_in_graph(a, what)
    from .call_client import check_futures_live  # imports dask: not for in-memory calls

    check_futures_live(a, what)


def in_memory(a: Any) -> Any:
    """An ``np.memmap`` (a file mapped into memory, e.g. ``np.load(path, mmap_mode="r")``) as
    the plain ndarray of the same memory, nothing copied; anything else as it is. The
    in-memory calls take what NumPy's own functions take: a memmap is NumPy data."""
    return np.asarray(a) if isinstance(a, np.memmap) else a


def xarray_object(a: Any, selects: bool = True) -> str | None:
    """For an xarray object passed where an array goes, what to pass instead (for a
    message; ``selects``: the call selects, as the accessor does), else None. Until
    2026-12-01 it was told to be wrapped with ``da.from_array`` or converted with
    ``np.asarray`` (which computes a dask-backed one into memory), and a dask-backed field
    beside a dask array was called in-memory (a new-user probe)."""
    t = type(a)
    frame = frame_object(a)
    if frame is not None:
        return frame
    if t.__module__.split(".")[0] != "xarray":
        return None
    data = "ds[name].data" if t.__name__ == "Dataset" else ".data"
    accessor = ", or select with the xarray accessor, .compact.where(cond, dim)"
    return (f"an xarray {t.__name__}: pass the array it wraps, {data} (a dask array where it "
            f"is dask-backed){accessor if selects else ''}")


@contextlib.contextmanager
def times_refused(source: str, dtype: np.dtype,
                  in_memory: bool = False) -> Iterator[None]:  # fmt: skip
    """Around a predicate's evaluation on datetime64 / timedelta64 data: NumPy's TypeError
    (``t > 5``: no loop for a time and a number) re-raised as :func:`times_refusal`, any
    other error as it came (``compact_array``'s and ``map_compact``'s times paths, and
    ``map_compact``'s mask tasks)."""
    try:
        yield
    except TypeError as e:
        if not type(e).__module__.startswith("numpy"):
            raise
        raise times_refusal(source, dtype, e, in_memory) from e


def times_refusal(source: str, dtype: np.dtype, e: TypeError,
                  in_memory: bool = False) -> TypeError:
    """The refusal of a predicate NumPy cannot evaluate on datetime64 / timedelta64 data
    (``t > 5``: no loop for a time and a number), with the form that compares times: until
    2026-12-01 (fourteenth session) NumPy's bare "ufunc 'greater' did not contain a loop with
    signature matching types" (a new-user probe); a string cannot name a time at all. The
    selection by a mask of an in-memory call's array (``in_memory``) is NumPy's own: until
    2026-12-01 (fifteenth session, a regression review) compact_array was told
    ``dask_compact.compact(x, x > t0)``, which refuses a NumPy array."""
    kind, example = (("datetime64", "np.datetime64('2026-01-01')") if dtype.kind == "M"
                     else ("timedelta64", "np.timedelta64(3, 'h')"))
    by_mask = "NumPy's a[a > t0]" if in_memory else "dask_compact.compact(x, x > t0)"
    return TypeError(
        f"the predicate {source} cannot be evaluated on {dtype} values ({e}): compare them "
        f"with {kind} values, in a callable, lambda v: v > {example} (a string predicate "
        f"names numbers only), or select by a mask, {by_mask}")


def frame_object(a: Any) -> str | None:
    """For a pandas or dask DataFrame, Series or Index passed where an array (or a record's
    mapping of arrays) goes, what to pass instead (for a message), else None. Until
    2026-12-01 (fourteenth session) a column was told to be wrapped with ``da.from_array``,
    which raises for a dask Series and gives pandas chunks for a pandas one, and a dask
    Series field to be converted with ``np.asarray``, which computes it (a new-user probe)."""
    t = type(a)
    module = t.__module__
    if module.startswith(("dask.dataframe", "dask_expr")):
        kind, what, to = "dask", "dask array", ".to_dask_array(lengths=True)"
        note = " (lengths=True: known chunk sizes)"
    elif module.split(".")[0] == "pandas":
        kind, what, to = "pandas", "values", ".to_numpy()"
        note = " (in dask.array.from_array(...) for a call on dask arrays)"
    else:
        return None
    if t.__name__ == "DataFrame":
        return (f"a {kind} DataFrame: pass a column's {what}, df[name]{to}{note}; "
                f"compact_records takes the columns, {{c: df[c]{to} for c in df.columns}}")
    return f"a {kind} {t.__name__}: pass its {what}, {to}{note}"


def check_chunk_type(a: Any, fn: str, in_memory: bool = False,
                     source: str | None = None) -> None:
    """TypeError for chunk types whose selection would silently lose information.

    ``a`` is a chunk or a dask array's ``_meta`` (``in_memory``: the array an in-memory call
    was given, and the advice converts it rather than the chunks). NumPy arrays (exactly
    ``np.ndarray``, ``np.memmap``, file-backed NumPy data, or ``np.recarray``) and CuPy
    arrays are compacted.
    Every other type is refused, with how to convert it (:func:`conversion`): a masked
    array's mask would be dropped (and NumPy evaluates a predicate on masked data with its
    own rules); another ndarray subclass (astropy's ``Quantity``) would come back as plain
    numbers, without what it carries (plain Dask's ``x[x > 0.5]`` raises for a Quantity
    compared with a bare number); other array types (sparse) have no backend. ``source``: how
    the advice names the array (:func:`conversion`)."""
    if _taken_as_is(a):
        return
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(f"{fn} does not take masked arrays: their mask would be lost. "
                        + _masked_advice(fn.split(" ")[0], in_memory, source, a.dtype))
    what = "NumPy or CuPy arrays" if in_memory else "NumPy or CuPy chunks"
    # what the call does, in its words (until 2026-12-02, eighteenth session, a new-user
    # probe: "cumsum compacts NumPy or CuPy chunks", "sort compacts ...")
    verb = _VERBS.get(fn.split(" ")[0], "compacts")
    xarray = xarray_object(a)
    if xarray is not None:
        raise TypeError(f"{fn} {verb} {what}, not {xarray}")
    raise TypeError(
        f"{fn} {verb} {what}, not {type(a).__module__}.{type(a).__name__}; convert "
        f"{conversion(a, in_memory, source)}"
    )


_VERBS = {"cumsum": "scans", "scan_array": "scans", "sort": "sorts", "argsort": "sorts",
          "partition": "partitions", "partition_array": "partitions"}


def _masked_advice(call: str, in_memory: bool, source: str | None = None,
                   dtype: Any = None) -> str:
    """What to do with a masked array, for the refusal of ``call``: say what its masked
    elements mean. A scan's is a sum (until 2026-12-01 ``scan_array`` and ``cumsum`` were
    told how to compact one, a probe): masked elements adding nothing, as NumPy's masked
    ``cumsum`` adds them (it masks their places in the result too). An in-memory call's is
    NumPy's, in its own call (a record's field by ``source``): until 2026-12-01 (thirteenth
    session, the regression review) they were told dask's, ``da.ma.getdata(x)`` and
    ``compact``/``map_compact``, calls and an array they were not given. The fill that is
    never selected is one ``dtype`` holds (:func:`_never_selected`)."""
    if call in ("scan_array", "cumsum"):
        ma, a = ("np.ma", "a") if in_memory else ("da.ma", "x")
        return ("Say what masked elements add, e.g. nothing, as np.ma.cumsum adds them: "
                f"`dask_compact.{call}({ma}.filled({a}, 0))` (and `{ma}.getmaskarray({a})` "
                "for the places np.ma.cumsum masks)")
    fill, never = _never_selected(dtype)
    if call in ("partition", "partition_array") and getattr(dtype, "kind", "f") in "mM":
        # a fill partition takes as it is: it splits no times (until 2026-12-02, sixteenth
        # session, the fifteenth's probes: told da.ma.filled(x, NaT) and partition again)
        return times_split(call, dtype, in_memory, masked=True)
    # the dask calls that are not a compaction, in their own call (until 2026-12-01,
    # fourteenth session, a regression review, they were told compact(d, ...) and
    # .map_compact(...), as the in-memory calls were until the thirteenth)
    if not in_memory and call in ("sort", "argsort"):
        kind = getattr(dtype, "kind", "f")
        last = ("np.nan" if kind in "fc" else fill if kind in "mM"
                else "np.iinfo(x.dtype).max" if kind in "iu" else "True")
        return (f"Say where masked elements go, e.g. last, as np.ma.sort puts them: "
                f"`dask_compact.{call}(da.ma.filled(x, {last}))` (NaN and NaT sort last; an "
                "integer or bool dtype's largest value is np.ma.sort's own fill)")
    if not in_memory and call == "partition":
        return (f"Say what masked elements mean, e.g. never selected: "
                f"`dask_compact.partition(da.ma.filled(x, {fill}), pred)` {never}")
    if not in_memory and call == "flatnonzero":
        return ("Say what masked elements mean, e.g. never selected, as np.flatnonzero "
                "skips them: `dask_compact.flatnonzero(da.ma.filled(x, 0))`")
    if in_memory and call in ("compact_array", "compact_into", "partition_array"):
        return (f"Say what masked elements mean, e.g. never selected: "
                f"`dask_compact.{call}(np.ma.filled(a, {fill}), ...)` {never}")
    if call in ("compact_records", "compact_records_into"):
        # dask fields as in-memory ones, in dask's calls (until 2026-12-01, thirteenth
        # session, they were told the one-array compact/map_compact way)
        a, ma = (source or "a", "np.ma") if in_memory else (source or "x", "da.ma")
        return (f"Say what masked elements mean, e.g. never selected: the field as "
                f"`{ma}.filled({a}, {fill})` {never.replace('`x ', f'`{a} ')}, or its mask "
                f"as a field of its own, `~{ma}.getmaskarray({a})`, read by the predicate")
    return ("Say what masked elements mean, e.g. never selected: `d = da.ma.getdata(x); "
            "dask_compact.compact(d, (d > 0.5) & ~da.ma.getmaskarray(x))`, or filled: "
            f"`da.ma.filled(x, {fill}).map_compact(...)` {never}")


def _never_selected(dtype: Any) -> tuple[str, str]:
    """A fill of ``dtype`` that a comparison never selects, and why, for the masked-array
    advice: NaN for floats, NaT for times; a dtype with neither (integers, bools) is told to
    fill with a value of its own that the predicate does not select. Until 2026-12-01
    (fourteenth session, a regression review) every dtype was told ``np.nan``, which
    ``np.ma.filled`` refuses for an int64 array ("Cannot convert fill_value nan")."""
    kind = getattr(dtype, "kind", "f")
    if kind in "fc":
        return "np.nan", ("(NaN fails every comparison: masked elements are never selected by "
                          "`x > 0.5`)")
    if kind in "mM":
        name = "datetime64" if kind == "M" else "timedelta64"
        return (f'np.{name}("NaT")', "(NaT fails every comparison: masked elements are never "
                "selected by `x > t`)")
    return "v", (f"with `v` a value of {dtype} that the predicate does not select ({dtype} "
                 "holds no NaN, the fill that fails every comparison)")


# exactly these NumPy types are taken as they are: a memmap is NumPy data in a file, a
# recarray NumPy data whose fields are also attributes (a view of plain numbers carries
# nothing more; chunks of one were taken before the per-chunk check, a probe)
_PLAIN = (np.ndarray, np.memmap, np.recarray)


def _taken_as_is(a: Any) -> bool:
    """Whether ``a`` is of a type the calls compact as it is (:data:`_PLAIN`, or CuPy's)."""
    return type(a) in _PLAIN or _module_of(a) == "cupy"


def conversion(a: Any, in_memory: bool = False, source: str | None = None) -> str:
    """How to turn ``a`` (a chunk, a meta, or an in-memory array of a type the calls do not
    take) into NumPy data, for a message: what works for its type. ``np.asarray`` does not
    for sparse arrays (pydata's refuses to densify, scipy's gives a 0-d object array), and
    the meta must be given where Dask cannot infer it from a call on the meta. ``source``:
    the array as the advice names it (a record's field by its name: until 2026-12-01 every
    field was ``a``, a record probe), by default ``a`` in memory and ``x`` for a dask array."""
    module = type(a).__module__.split(".")[0]
    if module == "sparse" and hasattr(a, "todense"):  # pydata sparse (COO, GCXS, DOK)
        dense, note = "todense()", ""
    elif module == "scipy" and hasattr(a, "toarray"):  # scipy.sparse matrices and arrays
        dense, note = "toarray()", ""
    elif isinstance(a, np.ndarray):
        # another ndarray subclass: np.asarray keeps the numbers, drops what it carries. The
        # Quantity's way only for astropy's types (a np.matrix was told of it, a probe)
        dense = None
        note = (f" (which keeps the numbers alone: decide first what the "
                f"{type(a).__name__}'s extra information means"
                + ("; for an astropy Quantity, its values in one unit, lambda b: "
                   "b.to_value(unit))" if module == "astropy" else ")"))
    else:
        dense, note = None, ""
    if in_memory:
        name = source or "a"
        return f"it first, e.g. {f'{name}.{dense}' if dense else f'np.asarray({name})'}{note}"
    meta = f"np.empty({(0,) * max(getattr(a, 'ndim', 1), 1)}, {_dtype_source(a.dtype)})" \
        if hasattr(a, "dtype") else "np.empty(0)"  # fmt: skip
    # a chunk that is a NumPy scalar: np.asarray makes it 0-d, which a 1-D array's chunk of
    # one element is not (the advice failed when followed, a probe; an N-D array's chunk of
    # one element is refused by its shape then, which names the shape it needs)
    scalar = isinstance(a, np.generic)
    call = f"lambda b: b.{dense}" if dense else "np.atleast_1d" if scalar else "np.asarray"
    return f"the chunks first, e.g. {source or 'x'}.map_blocks({call}, meta={meta}){note}"


def _dtype_source(dtype: Any) -> str:
    """Python source that makes ``dtype`` (for a message's advice): a structured dtype's
    ``str`` ("(numpy.record, [...])" for records) is not one (a probe ran the advice: a
    SyntaxError), its field list is."""
    fields = getattr(dtype, "fields", None)
    return repr(np.dtype(dtype).descr) if fields else repr(str(dtype))


def check_chunk(chunk: Any, fn: str, what: str = "the input", source: str | None = None
                ) -> None:  # fmt: skip
    """The check of every chunk a step takes, before it computes (each chunk of a run, of
    ``compact``'s mask, of each record field, not the first alone): TypeError for a chunk of
    a type :func:`check_chunk_type` refuses, though its dask array's meta (checked when the
    call was made) is plain NumPy, as ``map_blocks`` without ``meta=`` declares it. The
    steps are dispatched on their first chunk's type, and the NumPy steps take any ndarray
    subclass: a masked chunk after a plain one lost its mask (a new-user probe), a Quantity
    its unit, and sparse chunks failed inside the backend with errors that said nothing."""
    if _taken_as_is(chunk):
        return  # every chunk of every task passes here: the common case in two lookups
    if isinstance(chunk, np.ma.MaskedArray):
        where = f"a chunk of {what} is a masked array, though the dask array's meta is not"
    else:
        where = f"a chunk of {what}, though the dask array's meta is NumPy's"
    check_chunk_type(chunk, f"{fn} ({where})", source=source)


def check_chunks(chunks: Any, fn: str, what: str = "the input") -> None:
    """:func:`check_chunk` on each of ``chunks``."""
    for c in chunks:
        check_chunk(c, fn, what)


def as_declared_block(block: Any, declared: np.dtype | None, fn: str,
                      block_id: tuple[int, ...] | None = None, what: str = "the input") -> Any:
    """:func:`as_declared` of a chunk that Dask's ``map_blocks`` passed with its ``block_id``
    (the chunk's index along each axis: the first names it, for 1-D input and N-D blocks of
    whole rows alike): the one form of the map_blocks steps that take their chunks in their
    array's declared dtype (the conversion to native byte order, the views of times as
    integers, the mask path's predicate, the sort's checked chunks and time keys). The
    block's shape is not checked here: the step after each of these checks it (or, before
    a join, :func:`.joined_chunks.declared_chunks`)."""
    return as_declared(block, declared, fn, block_id[0] if block_id else 0, what)


def declared_shape(grid: tuple[tuple[float, ...], ...], index: Any) -> tuple[int, ...] | None:
    """The shape a dask array whose ``chunks`` are ``grid`` declares for its block ``index``
    (a chunk index along each axis, or one int for the first axis of 1-D ``grid``); None
    where a size is unknown (nan), which nothing is checked against."""
    at = (index,) if isinstance(index, (int, np.integer)) else tuple(index)
    sizes = [c[i] for c, i in zip(grid, at)]
    if any(s != s for s in sizes):  # nan: unknown until computed
        return None
    return tuple(int(s) for s in sizes)


def block_shapes(grid: tuple[tuple[float, ...], ...]) -> list[tuple[int, ...] | None]:
    """:func:`declared_shape` of the blocks ``(i, 0, ..., 0)`` of an array whose ``chunks``
    are ``grid``, for every i, in one pass (about 0.3 us a block, where one call each took
    several): what the per-chunk tasks of a call carry."""
    tail = tuple(c[0] for c in grid[1:])
    if any(t != t for t in tail):
        return [None] * len(grid[0])
    ints = tuple(int(t) for t in tail)
    return [None if r != r else (int(r), *ints) for r in grid[0]]


def as_declared(chunk: Any, declared: np.dtype | None, fn: str, index: int,
                what: str = "the input", shape: tuple[int, ...] | None = None,
                source: str | None = None) -> Any:
    """``chunk``, checked (:func:`check_chunk`), in the dtype its dask array declares.

    A chunk need not hold the dtype its dask array declares (``map_blocks(f, dtype=...)`` of
    an ``f`` that returns another dtype for some chunks, ``from_delayed(load(i), shape,
    dtype=float)`` over a loader of int64): every step that takes a chunk takes it through
    here, so that a result, which declares the input's dtype, holds it in every chunk. One
    rule for every dtype: a chunk of the declared dtype is taken as it is (one dtype
    comparison, nothing per element); one whose dtype casts to the declared one exactly
    (:func:`_casts_exactly`: float32 to float64, int16 to int64, bool to any number, another
    byte order) is cast; one of another dtype is cast where each of its values is exact in
    the declared dtype (:func:`_cast_by_value`: int64 ids below 2^53 under float64, float64
    values that are float32s, NaN, inf and -0.0 among them, ints that fit a narrower or
    unsigned type, milliseconds of whole seconds, seconds whose instants fit nanoseconds)
    and refused where one is not, or where the dtypes are of kinds no value passes between
    (:func:`chunk_dtype_refusal`, naming the first such value): casting it would change its
    values. The values are looked at only for a chunk of another dtype than declared.

    ``declared`` None: the chunk is only checked. ``index``: the chunk's position in the
    array the call takes (for the message); ``what``: that array, as the message names it
    (``source``: as the advice of a refused chunk type names it, :func:`conversion`).

    ``shape``: the chunk's shape as its dask array declares it (None: not checked, where a
    size is unknown). A chunk of another shape is refused (:func:`chunk_shape_refusal`):
    every global index and offset is made of the declared sizes, so a ``from_delayed`` chunk
    of 5 elements declared 7 put every later element 2 places off (until 2026-12-01, the
    eleventh session's probe). One tuple comparison per chunk."""
    if not _taken_as_is(chunk):  # check_chunk's own first test, without its call
        check_chunk(chunk, fn, what, source)
    if shape is not None and chunk.shape != shape:
        raise chunk_shape_refusal(fn, what, index, tuple(chunk.shape), shape)
    dtype = chunk.dtype
    if dtype is declared or declared is None or dtype == declared:
        return chunk  # the common case: no copy, nothing per element
    if not dtype.isnative and _module_of(chunk) == "cupy":
        # a CuPy chunk of the other byte order (a view of a swapped dtype): its bytes reversed
        # first, since CuPy's casts copy them as they are (to_native; until 2026-12-01,
        # thirteenth session, its numbers were taken unswapped)
        chunk = to_native(chunk)
        dtype = chunk.dtype
        if dtype == declared:
            return chunk
    if _casts_exactly(dtype, declared):
        return _cast_exactly(chunk, declared)
    by_value = _cast_by_value(chunk, declared)
    if by_value is None:  # no value passes between these kinds (an int64 chunk of times)
        raise chunk_dtype_refusal(fn, what, index, dtype, declared)
    cast, misfits = by_value
    if misfits is None or not misfits.any():
        return cast
    raise chunk_dtype_refusal(fn, what, index, dtype, declared, _first_misfit(chunk, misfits))


def _casts_exactly(dtype: np.dtype, declared: np.dtype) -> bool:
    """Whether every value of ``dtype`` is one of ``declared``, so that a chunk is cast
    without a look at its values: NumPy's "safe" casts, less those that can lose one.
    Integers into a float with fewer mantissa bits (int64 and uint64 into float64 or
    complex128, which NumPy calls safe: exact to 2^53 only; a review found 2^53 + 1 coming
    back as 2^53), and times into another unit (3000-01-01 in seconds is out of
    nanoseconds' range, which NumPy calls safe too) are cast value by value
    (:func:`_cast_by_value`), as are ints and bools under a timedelta64 (int64's least is
    NaT there, which NumPy's "safe" cast makes of it)."""
    if dtype.kind in "mM" and declared.kind == dtype.kind:
        return native(dtype) == native(declared)  # the other byte order, the same unit
    if declared.kind == "m":  # ints and bools as counts of the unit, looked at (NaT)
        return False
    if not np.can_cast(dtype, declared, casting="safe"):
        return False
    if dtype.kind in "iu" and declared.kind in "fc":
        value_bits = dtype.itemsize * 8 - (dtype.kind == "i")
        return value_bits <= np.finfo(declared).nmant + 1
    return True


def _cast_exactly(chunk: Any, declared: np.dtype) -> Any:
    """``chunk.astype(declared)`` for a dtype it casts to exactly (:func:`_casts_exactly`),
    its float32 subnormals kept where the array module's casts flush them.

    CuPy compiles its casts with ``-ftz=true``: float32 into float64 and complex128, and
    complex64 into complex128 (each part a float32 converted to float64), flush float32
    subnormals to (signed) 0 (seen on an H200, CuPy 14.2: ``[1e-40, -1e-40, 2]`` under
    float64 came back ``[0, -0, 2]``); float32 into complex64 moves the bits and keeps them.
    There the parts holding a subnormal are rebuilt from its bits
    (:func:`_float32_subnormals_widened`): one pass over the chunk's bits to find one, the
    rebuild only where a chunk holds one."""
    cast = chunk.astype(declared)
    if _float_part(chunk.dtype) != _F32 or _float_part(declared) != _F64:
        return cast
    xp = _xp(chunk)
    if not _flushes_subnormals(xp):
        return cast
    if cast.dtype.kind != "c":
        rebuilt = _float32_subnormals_widened(chunk, cast, xp)
        return cast if rebuilt is None else rebuilt
    parts = (("real", chunk.real), ("imag", chunk.imag)) if chunk.dtype.kind == "c" else \
        (("real", chunk),)  # fmt: skip
    for name, values in parts:
        rebuilt = _float32_subnormals_widened(values, getattr(cast, name), xp)
        if rebuilt is not None:
            setattr(cast, name, rebuilt)  # a copy into the cast's parts (NumPy's, CuPy's)
    return cast


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _float_part(dtype: np.dtype) -> np.dtype | None:
    """The real dtype of ``dtype``'s parts (float32 for complex64), None for a non-float."""
    if dtype.kind == "c":
        return np.dtype(dtype.char.lower())
    return dtype if dtype.kind == "f" else None


def _float32_subnormals_widened(values: Any, cast: Any, xp: Any) -> Any:
    """``cast`` (float32 ``values`` in float64, from a cast that may have flushed their
    subnormals) with each nonzero subnormal of ``values`` rebuilt from its bits, or None
    where ``values`` hold none (:func:`float32_subnormals`: integer operations, not
    flushed)."""
    tiny = float32_subnormals(values)
    if not tiny.any():
        return None
    return xp.where(tiny, _float32_subnormal_values(values, xp), cast)


def _float32_subnormal_values(values: Any, xp: Any) -> Any:
    """The float64 values of float32 subnormals ``values``, from their bits: the mantissa
    bits times 2^-149, signed by the sign bit (float64 arithmetic, which ``-ftz=true`` does
    not flush; exact: a 23-bit integer times a power of two). Meaningless where ``values``
    are no subnormals."""
    bits = values.view(np.uint32)
    magnitude = (bits & np.uint32(0x007FFFFF)).astype(np.float64) * 2.0**-149
    return xp.where(bits >= np.uint32(0x80000000), -magnitude, magnitude)


def _float32_subnormals_narrowed(values: Any, cast: Any, misfits: Any, xp: Any
                                 ) -> tuple[Any, Any]:  # fmt: skip
    """float64 ``values`` cast into float32 (``cast``) by a cast that flushed float32
    subnormals to 0, so that the check marked the exact ones as ``misfits``: those of them
    that are float32 subnormals exactly (below 2^-126 in magnitude, their magnitude times
    2^149 a whole number, so below 2^23: the mantissa bits) are built as float32 bits (that
    number, the sign bit set where the value's is) and no longer marked. Inexact ones (1e-40,
    2^-150) stay marked, as NumPy's cast rounds them. Runs where misfits were found alone."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf, NaN and the largest values
        magnitude = xp.abs(values)
        scaled = magnitude * 2.0**149  # exact (a power of two) where magnitude < 2^-126
        exact = misfits & (magnitude < 2.0**-126) & (xp.trunc(scaled) == scaled)
    if not exact.any():
        return cast, misfits
    mantissa = xp.where(exact, scaled, 0.0).astype(np.uint32)
    sign = xp.signbit(values).astype(np.uint32) << np.uint32(31)
    # chosen as bits (integer operations): nothing float32 passes through a flushing kernel
    bits = xp.where(exact, mantissa | sign, cast.view(np.uint32))
    return bits.view(np.float32), misfits & ~exact


def _cast_by_value(chunk: Any, declared: np.dtype) -> tuple[Any, Any] | None:
    """``chunk`` cast to ``declared`` (as NumPy's ``astype``) and a boolean array, True
    where a value is not exact in ``declared`` (a misfit), or None where none is; None where
    the kinds of the two dtypes let no value pass (a number and a datetime, a time and a
    number, a time and another kind of time, bytes and unicode, records): such a chunk is
    refused by its dtype. Ints and bools under a timedelta64 are counts of its unit
    (:func:`_not_counts`: NaT's bits and uint64s past int64 are misfits).

    Numbers: exact is equal (a NaN is a NaN in any float, its payload aside; -0.0 is 0, as
    ``-0.0 == 0``: an int holds it as 0, a float keeps its sign, since a float cast does);
    a complex value's imaginary part must be 0 for a real dtype. Times: the same instant
    (NaT kept) in the other unit. Strings: the same string (not cut)."""
    kind, to = chunk.dtype.kind, declared.kind
    if to == "m" and kind in "biu":  # counts of the declared unit
        return chunk.astype(declared), _not_counts(chunk)
    if kind in "mMSU" or to in "mMSU":
        if kind != to:
            return None
        if kind in "mM":
            return _cast_times(chunk, declared)
        cast = chunk.astype(declared)
        return cast, cast.astype(chunk.dtype) != chunk
    if kind not in "biufc" or to not in "biufc":
        return None
    xp = _xp(chunk)
    with np.errstate(all="ignore"):  # an inexact value may overflow or be NaN in a cast
        if kind == "c" and to != "c":  # its real parts, where every imaginary part is 0
            cast, misfits = _cast_real(chunk.real, declared, xp)
            return cast, _either(misfits, _nonzero_parts(chunk.imag))
        if to == "c":  # real and imaginary parts, each in the declared complex's parts
            part = np.dtype(declared.char.lower())  # complex64 -> float32
            real, misfits = _cast_real(chunk.real, part, xp)
            cast = chunk.astype(declared)
            # float64 parts into float32 ones on a backend whose cast flushed float32
            # subnormals: the parts _cast_real cast keep them (written into the cast, a copy)
            rebuilt = _float_part(chunk.dtype) == _F64 and part == _F32 and \
                _flushes_subnormals(xp)  # fmt: skip
            if rebuilt:
                cast.real = real
            if kind == "c":
                imag, imag_misfits = _cast_real(chunk.imag, part, xp)
                misfits = _either(misfits, imag_misfits)
                if rebuilt:
                    cast.imag = imag
            return cast, misfits
        return _cast_real(chunk, declared, xp)


def _either(a: Any, b: Any) -> Any:
    """Misfits of two checks, either None (none)."""
    return b if a is None else a if b is None else a | b


def _nonzero_parts(parts: Any) -> Any:
    """Where the real numbers ``parts`` (a complex chunk's imaginary parts) are not 0 (-0.0
    is 0, NaN is not): float32 parts by their bits, which CuPy's flush of subnormals
    (:func:`float32_subnormals`) cannot touch (``1+1e-40j`` under float32 passed as
    ``1``), equal to ``parts != 0`` on NumPy."""
    if parts.dtype == np.float32:
        return (parts.view(np.uint32) & np.uint32(0x7FFFFFFF)) != 0
    return parts != 0


def float32_subnormals(values: Any) -> Any:
    """Where float32 ``values`` are nonzero subnormals (below 2^-126 in magnitude), decided by
    their bits: exponent bits 0, mantissa bits not.

    CuPy compiles its elementwise kernels with ``-ftz=true``, so its float32 arithmetic and
    comparisons take such a value as 0: ``trunc(v) == v``, ``v != 0`` and a round trip
    through float16 compared in float32 all said that ``1e-40`` is exact in an int, a bool or
    float16 (a review's CuPy float32 ``[1e-40, 2]`` under int32 came back ``[0, 2]``, where
    NumPy refuses naming 1e-40). Integer operations on the bits are not flushed."""
    bits = values.view(np.uint32)
    return (((bits & np.uint32(0x7F800000)) == 0)
            & ((bits & np.uint32(0x007FFFFF)) != 0))


def _flushes_subnormals(xp: Any) -> bool:
    """Whether ``xp``'s elementwise float32 operations flush subnormals to 0 (CuPy's do; a
    function, so that a CPU test can take NumPy's arrays through the CuPy path)."""
    return xp is not np


def _cast_real(values: Any, declared: np.dtype, xp: Any) -> tuple[Any, Any]:
    """:func:`_cast_by_value` of real numbers (bool, int, uint, float) into a real dtype.

    Where float32 arithmetic and casts flush subnormals (CuPy), the comparisons of
    :func:`_cast_real_compared` take a nonzero float32 subnormal as 0, so such values are
    marked by their bits: exact in float32 and float64 alone, a misfit in every other (bool,
    ints, float16). Under float64 (a complex64's real parts) the cast flushed them: they
    are rebuilt from their bits. A float64 value that is a float32 subnormal exactly
    (``2**-149``), flushed by the cast into float32 and so marked, is built as float32 bits
    (:func:`_float32_subnormals_narrowed`). NumPy's comparisons and casts need none of this
    (the same answers, nothing added)."""
    cast, misfits = _cast_real_compared(values, declared, xp)
    if not _flushes_subnormals(xp):
        return cast, misfits
    if values.dtype == _F32 and declared == _F64:
        rebuilt = _float32_subnormals_widened(values, cast, xp)
        return (cast if rebuilt is None else rebuilt), misfits
    holds_float32 = declared.kind == "f" and declared.itemsize >= 4  # float32, float64
    if values.dtype == _F32 and not holds_float32:
        tiny = float32_subnormals(values)
        if tiny.any():
            misfits = _either(misfits, tiny)
    elif values.dtype == _F64 and declared == _F32 and misfits is not None:
        cast, misfits = _float32_subnormals_narrowed(values, cast, misfits, xp)
    return cast, misfits


def _cast_real_compared(values: Any, declared: np.dtype, xp: Any) -> tuple[Any, Any]:
    """:func:`_cast_real` by comparisons of the values, exact where nothing is flushed."""
    kind, to = values.dtype.kind, declared.kind
    if kind in "iu" and _ints_fit(values, declared):
        return values.astype(declared), None  # the common case: two reductions
    if to == "b":  # 0 and 1 alone (-0.0 is 0)
        return values.astype(declared), (values != 0) & (values != 1)
    if to in "iu" and kind in "biu":  # the declared type's range, compared in the chunk's
        return values.astype(declared), _out_of_range(values, np.iinfo(declared))
    if to in "iu":  # floats: whole and in range (NaN and inf are neither)
        lo, end = _int_span(declared)
        if _floats_fit(values, lo, end, xp):
            return values.astype(declared), None  # the common case: three reductions
        # upcast, so that the bounds, powers of two, are exact (float16 has no 2^63)
        w = values if values.dtype.itemsize >= 8 else values.astype(np.float64)
        whole = (w >= lo) & (w < end) & (xp.trunc(w) == w)
        return values.astype(declared), ~whole
    cast = values.astype(declared)  # into a float
    if kind == "f":  # a narrower float: the wider one holds every value of it
        same = cast.astype(values.dtype) == values
        if same.all():
            return cast, None
        return cast, ~same & (values == values)  # a NaN is a NaN (its payload aside)
    # integers: back to the integer type where the float is in its range (out of range, the
    # cast back is undefined), compared there
    w = cast if declared.itemsize >= 8 else cast.astype(np.float64)
    lo, end = _int_span(values.dtype)
    inside = (w >= lo) & (w < end)
    back = xp.where(inside, w, 0).astype(values.dtype)
    return cast, ~inside | (back != values)


def _ints_fit(values: Any, declared: np.dtype) -> bool:
    """Whether integers ``values`` all lie where ``declared`` holds every integer (its range,
    0 and 1 for bool, up to 2^(mantissa bits) either side of 0 for a float): their least and
    greatest, as Python ints, compared exactly. Where they do not, each value is looked at
    (a float holds some integers beyond that span, and the refusal names the first misfit)."""
    if not values.size:
        return True
    if declared.kind == "b":
        lo, hi = 0, 1
    elif declared.kind in "iu":
        info = np.iinfo(declared)
        lo, hi = int(info.min), int(info.max)
    else:
        hi = 2 ** (np.finfo(declared).nmant + 1)
        lo = -hi
    return lo <= int(values.min()) and int(values.max()) <= hi


def _floats_fit(values: Any, lo: float, end: float, xp: Any) -> bool:
    """Whether floats ``values`` are all whole and within ``[lo, end)`` (Python floats, exact
    powers of two): their least and greatest compared as Python floats (exact for float16
    to float64; NaN fails every comparison), and one pass for wholeness. Where they are
    not, each value is looked at, for the first misfit."""
    if not values.size or values.dtype.itemsize > 8:  # longdouble: float() would round
        return False
    return (lo <= float(values.min()) and float(values.max()) < end
            and bool((xp.trunc(values) == values).all()))


def _int_span(dtype: np.dtype) -> tuple[float, float]:
    """The integers of ``dtype`` as ``[lo, end)`` in floats: powers of two (or 0), exact."""
    bits = dtype.itemsize * 8
    if dtype.kind == "u":
        return 0.0, 2.0**bits
    return -(2.0 ** (bits - 1)), 2.0 ** (bits - 1)


def _out_of_range(values: Any, info: np.iinfo) -> Any:
    """Where integers ``values`` are outside ``info``'s range, each bound compared in the
    values' own type (a uint64 compared with a Python int can be promoted to float64) and
    only where it lies inside that type's range."""
    have = np.iinfo(values.dtype)
    t = values.dtype.type
    misfits = values != values  # False everywhere, of the chunk's shape and array type
    if info.min > have.min:
        misfits |= values < t(info.min)
    if info.max < have.max:
        misfits |= values > t(info.max)
    return misfits


def _not_counts(values: Any) -> Any:
    """Where ints or bools ``values`` are no count a timedelta64 holds: int64's least (NaT's
    bits: ``[-2**63, 5]`` under ``m8[s]`` came back ``['NaT', 5]``, a review) and uint64s
    past int64's greatest; None where the dtype has none."""
    if values.dtype.kind == "b":
        return None
    have, counts = np.iinfo(values.dtype), np.iinfo(np.int64)
    t = values.dtype.type
    misfits = None
    if have.min <= counts.min:
        misfits = values == t(have.min)
    if have.max > counts.max:
        misfits = _either(misfits, values > t(counts.max))
    return misfits


def _cast_times(chunk: Any, declared: np.dtype) -> tuple[Any, Any]:
    """Times ``chunk`` cast to the time dtype ``declared`` and where an instant is not the same
    after it (:func:`_same_instants`). Where an instant is past the declared unit's range,
    NumPy 2.4 wraps it (found by :func:`_same_instants`) and other NumPy versions raise
    ``OverflowError`` (the GPU host's, 2026-12-04: a test of a refused chunk failed with
    NumPy's message instead of ours); then the first such instant is found by halving (a
    few casts of parts of the chunk) and is the misfit the refusal names."""
    try:
        cast = chunk.astype(declared)
    except OverflowError:
        flat = chunk.reshape(-1)
        lo, hi = 0, flat.size  # the first instant that overflows is in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            try:
                flat[lo:mid].astype(declared)
            except OverflowError:
                hi = mid
            else:
                lo = mid
        misfits = np.zeros(flat.size, bool)
        misfits[lo] = True
        return chunk, misfits.reshape(chunk.shape)
    return cast, ~_same_instants(cast, chunk)


def _same_instants(cast: Any, chunk: Any) -> Any:
    """Where the times ``cast`` to another unit are the same instants as ``chunk``'s (NaT
    kept): a unit change past the finer unit's range wraps silently in NumPy, and one into a
    coarser unit drops what it cannot hold (milliseconds under seconds)."""
    back = cast.astype(chunk.dtype)
    return (back == chunk) | (np.isnat(back) & np.isnat(chunk))


def _xp(a: Any) -> Any:
    """numpy, or cupy for a CuPy array (imported only then)."""
    if _module_of(a) == "cupy":
        import cupy

        return cupy
    return np


def _first_misfit(chunk: Any, misfits: Any) -> str:
    """The first value of ``chunk`` that ``misfits`` marks, where it is, and how many more,
    for the refusal's message."""
    flat = misfits.reshape(-1)
    i, count = int(flat.argmax()), int(flat.sum())
    value = chunk.reshape(-1)[i]
    if _module_of(value) == "cupy":
        value = value.get()[()]
    text = repr(value.item()) if chunk.dtype.kind in "SU" else str(value)
    where = i if chunk.ndim <= 1 else tuple(int(k) for k in np.unravel_index(i, chunk.shape))
    more = f"; {count - 1} more besides" if count > 1 else ""
    return f"{text} (element {where} of the chunk{more})"


def check_shape(chunk: Any, shape: tuple[int, ...] | None, fn: str, index: int,
                what: str = "the input") -> Any:
    """``chunk``, of the ``shape`` its dask array declares (None: unknown, not checked), or
    :func:`chunk_shape_refusal`: the shape check of :func:`as_declared`, for a step whose
    chunk an earlier step took in its declared dtype already (the sort's, after the cast to
    native byte order, the join of small chunks or the time keys)."""
    if shape is not None and chunk.shape != shape:
        raise chunk_shape_refusal(fn, what, index, tuple(chunk.shape), shape)
    return chunk


def chunk_shape_refusal(fn: str, what: str, index: int, shape: tuple[int, ...],
                        declared: tuple[float, ...]) -> ValueError:
    """The ValueError for chunk ``index`` of ``what`` whose ``shape`` is not the one its dask
    array ``declared`` (:func:`as_declared`): which chunk, its length and the declared one
    (the shapes, for N-D chunks), and the fix. Dask checks no chunk's shape: its
    ``compute()`` joins the chunks as they come, so the elements after such a chunk are at
    other positions than the array's chunks say."""
    if len(shape) == len(declared) == 1:
        got = f"has length {shape[0]}, but its dask array declares length {declared[0]}"
    else:
        got = f"has shape {shape}, but its dask array declares shape {declared}"
    return ValueError(
        f"{fn}: chunk {index} of {what} {got}; every index and offset after it would be "
        "wrong. Declare the shape each chunk has (shape= in the from_delayed, chunks= in the "
        "map_blocks that made it), or np.nan where it is known only once computed (then "
        "x.compute_chunk_sizes())"
    )


def chunk_dtype_refusal(fn: str, what: str, index: int, dtype: np.dtype,
                        declared: np.dtype, misfit: str | None = None) -> TypeError:
    """The TypeError for a chunk of ``dtype`` that does not cast to its array's ``declared``
    dtype without loss (:func:`as_declared`): which chunk, both dtypes, the first value the
    declared dtype does not hold (``misfit``, where the values were looked at), and the two
    fixes, a dtype that every chunk casts to exactly (where NumPy has one) or a cast of the
    chunks whose loss is meant. ``x.astype(declared)`` is no fix: Dask returns ``x`` itself
    where it already declares that dtype, and casts nothing."""
    try:
        wider = np.promote_types(dtype, declared)
    except TypeError:  # no dtype holds both (an int64 chunk under datetime64, say)
        wider = None
    if declared.kind == "b":  # a mask, or a field a predicate reads as booleans
        declare = ("make its chunks booleans (b != 0 in the map_blocks or the function that "
                   "made them), or ")
    elif wider is not None and wider != declared:
        declare = (f"declare a dtype every chunk casts to exactly (dtype={str(wider)!r} in the "
                   "map_blocks, from_delayed or from_array that made it), or ")
    else:
        declare = ("declare the dtype its chunks hold (dtype= in the map_blocks, from_delayed "
                   "or from_array that made it), or ")
    if misfit is None:
        loss = f"{dtype} does not cast to {declared} without loss"
    else:
        loss = (f"its value {misfit} is not exact in {declared} (a chunk of another dtype "
                "is cast where each of its values is exact in the declared one)")
    return TypeError(
        f"{fn}: chunk {index} of {what} holds {dtype}, but its dask array declares "
        f"{declared}, and {loss}; {declare}cast the chunks where the loss is meant: "
        f"x.map_blocks(lambda b: b.astype({str(declared)!r}), dtype={str(declared)!r}) "
        f"(x.astype({str(declared)!r}) casts nothing where x already declares {declared})"
    )


# type -> "cupy" or "numpy", as _module_of answers: a small call of compact_into asks 9 times
# (on the H100 host its checks took 17-26 us of a 2^20 call's 27-43 us of host time)
_MODULES: dict[type, str] = {}


def _module_of(a: Any) -> str:
    t = type(a)
    kind = _MODULES.get(t)
    if kind is None:
        kind = _MODULES[t] = "cupy" if t.__module__.split(".")[0] == "cupy" else "numpy"
    return kind


def _span(a: Any) -> tuple[int, int]:
    """The bytes ``[start, end)`` from an array's lowest element to past its highest: a
    reversed or strided view reaches below its data pointer or beyond its ``nbytes``."""
    if _module_of(a) == "cupy":
        start = int(a.data.ptr)
    else:
        start = int(a.__array_interface__["data"][0])
    lo = hi = start
    for n, stride in zip(a.shape, a.strides):
        if n == 0:
            return start, start
        if stride < 0:
            lo += (n - 1) * stride
        else:
            hi += (n - 1) * stride
    return lo, hi + int(a.itemsize)


def _span_in(a: Any, spans: dict[int, tuple[int, int]] | None) -> tuple[int, int]:
    if spans is None:
        return _span(a)
    s = spans.get(id(a))
    if s is None:
        s = spans[id(a)] = _span(a)
    return s


def overlaps(a: Any, b: Any, spans: dict[int, tuple[int, int]] | None = None) -> bool:
    """Whether arrays ``a`` and ``b`` share memory: their byte spans (:func:`_span`) meet and,
    for NumPy arrays, an element of one lies in the other (strided views can interleave
    without sharing an element); CuPy arrays whose spans meet count as overlapping.

    ``spans``: a dict (by ``id``) the caller keeps while it compares the same arrays several
    times, so each span is computed once (a NumPy span reads ``__array_interface__``, ~3 us:
    ``compact_records_into`` of four fields into four buffers spent 150 us on them)."""
    if not a.nbytes or not b.nbytes:
        return False
    (a0, a1), (b0, b1) = _span_in(a, spans), _span_in(b, spans)
    if not (a0 < b1 and b0 < a1):
        return False
    if _module_of(a) == "numpy" and _module_of(b) == "numpy":
        try:
            # bounded: an exact answer for many-dimensional strides can take long (NumPy's
            # stubs admit only its two named levels; any positive bound is valid at run time)
            return bool(np.shares_memory(a, b, max_work=10_000))  # type: ignore[arg-type]
        except np.exceptions.TooHardError:
            return True
    return True


def check_stream(stream: Any, on_gpu: bool, noun: str) -> None:
    """``stream`` of a ``*_into`` call on ``noun`` ("input", "fields"): None, or for CuPy
    arrays a CUDA stream object as CuPy's (``cupy.cuda.Stream``, ``cupy.cuda.ExternalStream``:
    an integer ``ptr``)."""
    if stream is None:
        return
    if not on_gpu:
        are = "is" if noun == "input" else "are"
        raise TypeError(f"stream is for CuPy {noun}; NumPy {noun} {are} compacted on this "
                        "thread")
    if not isinstance(getattr(stream, "ptr", None), int):
        raise TypeError("stream must be a CUDA stream such as cupy.cuda.Stream or "
                        f"cupy.cuda.ExternalStream; got {type(stream).__name__}")


def check_apart(buffers: dict[str, Any], spans: dict[int, tuple[int, int]] | None = None
                ) -> None:  # fmt: skip
    """ValueError where two of the output ``buffers`` (role -> array) share memory: each
    would overwrite what the other receives."""
    roles = [r for r, b in buffers.items() if b is not None]
    spans = {} if spans is None else spans
    for i, r in enumerate(roles):
        for q in roles[i + 1 :]:
            if overlaps(buffers[r], buffers[q], spans):
                raise ValueError(f"{r} and {q} overlap; each needs memory of its own")


def refuse_masked_out(buf: Any, role: str) -> None:
    """Refuse a masked array as an output buffer: the call writes its values, not its mask,
    so a masked element would hide a selected value. compact_into wrote into one, its mask
    left as it was; compact_records_into passed one to the compiled loop, which refused it
    with numba's traceback on a process's first call and took it after a plain buffer's (a
    records probe, 2026-12-06)."""
    if isinstance(buf, np.ma.MaskedArray):
        raise TypeError(f"{role} is a masked array: the call writes its values, not its mask, "
                        "so a masked element would hide a selected value. Pass a plain array (a "
                        "masked array's .data is a view of its values)")


def check_into_buffer(a: Any, buf: Any, role: str, dtype: np.dtype, size: int) -> None:
    """``buf`` can receive ``size`` elements of ``dtype`` for input ``a``: the same array type
    (and device), 1-D, C-contiguous, writeable, the exact dtype, the capacity, no overlap;
    not a masked array (:func:`refuse_masked_out`)."""
    kind = _module_of(a)
    refuse_masked_out(buf, role)
    if not hasattr(buf, "dtype") or _module_of(buf) != kind or not hasattr(buf, "flags"):
        raise TypeError(
            f"{role} must be a {kind} array like the input, not {type(buf).__module__}."
            f"{type(buf).__name__}"
        )
    if kind == "cupy" and buf.data.device_id != a.data.device_id:
        raise ValueError(f"{role} is on device {buf.data.device_id}, the input on "
                         f"{a.data.device_id}")
    flags = buf.flags
    if buf.ndim != 1 or not flags.c_contiguous:
        raise ValueError(f"{role} must be a 1-D contiguous array; got shape {buf.shape}"
                         + ("" if flags.c_contiguous else ", not contiguous"))
    if kind == "numpy" and not flags.writeable:
        raise ValueError(f"{role} is read-only")
    if buf.dtype != dtype:  # (NumPy buffers of the other byte order come as native views)
        raise TypeError(f"{role} must have dtype {dtype}{either_order(kind, dtype)}; got "
                        f"{buf.dtype}")
    if buf.size < size:
        raise ValueError(f"{role} holds {buf.size} elements; the input has {size}, and every "
                         "element may be selected")
    if overlaps(a, buf):
        raise ValueError(f"{role} overlaps the input; compaction is not done in place")
