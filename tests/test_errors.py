"""Bad input gets a clear error at call time, before anything is computed."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings

import dask.array as da
import numpy as np
import pytest

import dask_compact


@pytest.fixture
def x():
    return da.from_array(np.random.default_rng(0).random(100), chunks=30)


def test_not_a_dask_array():
    with pytest.raises(TypeError, match="dask array"):
        dask_compact.map_compact(np.arange(5), "x > 1")


def test_flatnonzero_of_an_in_memory_array_points_to_numpys():
    """flatnonzero of a NumPy array was pointed to dask_compact.compact_array, which takes a
    predicate and returns values unless told otherwise (a new-user probe, 2026-12-01,
    fourteenth session): NumPy's own np.flatnonzero is the in-memory call."""
    a = np.array([0, 3, 0, 1, 2])
    with pytest.raises(TypeError, match=r"or use np\.flatnonzero for an in-memory array"):
        dask_compact.flatnonzero(a)
    np.testing.assert_array_equal(
        dask_compact.flatnonzero(da.from_array(a, chunks=2)).compute(), np.flatnonzero(a))


def test_compact_of_an_in_memory_array_points_to_numpys_selection_by_a_mask():
    """compact (a selection by a mask) of a NumPy array was pointed to
    dask_compact.compact_array, which takes a predicate, and refuses the mask, pointing back
    to compact (a regression review, 2026-12-01, fifteenth session: the fourteenth's mask
    refusal made the loop): NumPy's a[mask] is the in-memory selection by a mask."""
    a = np.array([0.5, 3.0, 0.0, 1.0, 2.0])
    mask = a > 0.75
    with pytest.raises(TypeError, match=r"or use NumPy's a\[mask\] for an in-memory array"):
        dask_compact.compact(a, mask)
    np.testing.assert_array_equal(
        dask_compact.compact(da.from_array(a, chunks=2), mask).compute(), a[mask])


def test_unsupported_dtypes():
    # (datetime64 / timedelta64 are compacted: test_map_compact.py)
    for a in (np.array(["a", "b"]), np.array([object(), 1], dtype=object),
              np.ones(3, np.longdouble)):
        with pytest.raises(TypeError, match="compacts arrays of"):
            da.from_array(a, chunks=2).map_compact("x > 0")


@pytest.mark.parametrize("dtype", ["<U3", "S2", ">U3", "object"])
@pytest.mark.parametrize("shape", [(37,), (6, 5)])
def test_strings_and_objects_are_told_a_way_that_selects_them(dtype, shape):
    """Strings and objects were refused with the list of numeric dtypes only (until
    2026-12-06, a new-user probe): each call now says what selects them, for its output,
    and that, run as written, gives NumPy's answer (N-D input flattened, as the calls take
    it: the first hint indexed a 2-D array's rows, a review). Fixed-width strings are told
    compact_records, which gathers them, and compact, which selects them by a mask since
    2026-12-07 (its hint had indexed by a dask array, which dask warns of: each output chunk
    read every input chunk); objects are told the indices."""
    import re

    rng = np.random.default_rng(3)
    a = np.array([f"{i}" for i in rng.integers(0, 9, int(np.prod(shape)))])
    a = a.astype(dtype).reshape(shape)
    a.flat[7] = a.flat[11] = a.dtype.type("")  # empty ones: NumPy's zero of a string
    v = a.flat[4]
    m = a == v
    idx = np.flatnonzero(m)
    x = da.from_array(a, chunks=4)
    ns = {"dask_compact": dask_compact, "da": da, "np": np, "v": v, "a": a, "x": x,
          "mask": x == v}
    split = (np.concatenate([a[m], a[~m]]), int(m.sum()))
    fixed = dtype != "object"  # what compact_records gathers
    # (the call, its output, NumPy's answer, whether compact_records is named)
    calls = [(lambda o: x.map_compact(lambda b: b == v, output=o), fixed),
             (lambda o: dask_compact.compact(x, x == v, output=o), fixed),
             (lambda o: dask_compact.compact_array(a, lambda b: b == v, output=o), False)]
    cases = [(call, o, {"values": a[m], "indices": idx, "both": (a[m], idx)}[o], records)
             for call, records in calls for o in ("values", "indices", "both")]
    cases += [(lambda o: dask_compact.partition(x, lambda b: b == v), None, split, False),
              (lambda o: dask_compact.partition_array(a, lambda b: b == v), None, split, False),
              (lambda o: dask_compact.flatnonzero(x), None, np.flatnonzero(a), False)]
    for call, output, want, records in cases:
        if fixed and call is calls[1][0]:  # compact selects fixed-width strings itself
            got = call(output)
            got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
            for g, w in zip(got, want):
                assert not np.isnan(g.shape[0])
                np.testing.assert_array_equal(g.compute(), w)
            continue
        with pytest.raises(TypeError, match="compared by NumPy's own loops only") as e:
            call(output)
        said = str(e.value)
        assert ("compact_records" in said) == records, said
        code = re.findall(r"`([^`]*)`", said)[0]
        *setup, last = code.split("; ")
        env = dict(ns)
        exec("\n".join(setup), env)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # dask's PerformanceWarning: a hint to avoid
            got = eval(last, env)
            got = tuple(np.asarray(g) for g in got) if isinstance(got, tuple) else np.asarray(got)
        got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
        assert len(got) == len(want), code
        for g, w in zip(got, want):
            np.testing.assert_array_equal(np.asarray(g), w, err_msg=code)


def test_bad_output_algorithm_stable(x):
    with pytest.raises(ValueError, match="output must be"):
        x.map_compact("x > 0", output="mask")
    with pytest.raises(ValueError, match="algorithm must be"):
        x.map_compact("x > 0", algorithm="fastest")
    with pytest.raises(ValueError, match="stable=False"):
        x.map_compact("x > 0", algorithm="hybrid")
    assert len(x.map_compact("x > 0.5", algorithm="hybrid", stable=False).compute()) == int(
        (x.compute() > 0.5).sum()
    )


def test_bad_chunks(x):
    for bad in (0, -3, 2.5, "big", True):
        with pytest.raises(ValueError, match="chunks must be"):
            x.map_compact("x > 0", chunks=bad)
    with pytest.raises(ValueError, match="lazy"):
        x.map_compact("x > 0", chunks=10, lazy=True)


def test_reduction_in_predicate(x):
    for pred in (lambda v: v > v.mean(), lambda v: v > np.median(v), lambda v: v < np.max(v)):
        with pytest.raises(ValueError, match="reduc"):
            x.map_compact(pred)


def test_non_boolean_predicate(x):
    with pytest.raises(TypeError, match="boolean"):
        x.map_compact(lambda v: v + 1)
    with pytest.raises(TypeError, match="boolean"):
        x.map_compact("x * 2")


def test_predicate_not_defined_for_dtype(x):
    with pytest.raises(TypeError):
        x.map_compact(lambda v: (v & 1) == 1)  # bitwise_and on floats


def test_string_predicates_refused(x):
    for bad in ("__import__('os').system('true')", "x.__class__", "y > 1", "open('f')",
                "x[0] > 1", "lambda: 1", "[x for x in x]", "x > 'a'"):
        with pytest.raises(ValueError):
            x.map_compact(bad)


def test_pred_of_wrong_type(x):
    with pytest.raises(TypeError, match="callable or a string"):
        x.map_compact(42)


def test_mask_errors(x):
    with pytest.raises(ValueError, match="shape"):
        dask_compact.compact(x, np.ones(99, bool))
    with pytest.raises(TypeError, match="boolean"):
        dask_compact.compact(x, da.ones(100, chunks=30))


@pytest.mark.parametrize("mask", [lambda v: v > 3, "x > 3"], ids=["callable", "string"])
def test_a_predicate_passed_as_compacts_mask_points_to_map_compact(mask):
    """compact(x, pred) said "mask has shape (), x has shape (6,)" (a probe): a predicate
    is refused naming map_compact, which takes it."""
    x = da.arange(6, chunks=4)
    with pytest.raises(TypeError, match=r"not a (function|str); for a predicate .* "
                                        r"x\.map_compact\(pred\)"):
        dask_compact.compact(x, mask)
    np.testing.assert_array_equal(x.map_compact(mask).compute(), np.arange(6)[np.arange(6) > 3])


@pytest.mark.parametrize("mask", [None, True, np.bool_(False), 3.0])
def test_a_scalar_mask_is_a_type_error(mask):
    """No array at all: a TypeError saying what a mask is, not a ValueError about shape ()."""
    with pytest.raises(TypeError, match=r"mask must be a boolean dask or NumPy array of x's "
                                        r"shape \(6,\), not "):
        dask_compact.compact(da.arange(6, chunks=4), mask)


@pytest.mark.parametrize("shape", [(13, 3), (7, 2, 3)])
@pytest.mark.parametrize("kind", ["numpy", "dask"])
def test_a_row_mask_of_nd_x_is_refused_saying_how_to_select_rows(shape, kind):
    """README: the mask has x's shape. A mask of one value per row is refused, and both
    ways the message gives select NumPy's rows (x[mask])."""
    a = np.arange(np.prod(shape), dtype=float).reshape(shape)
    x = da.from_array(a, chunks=(4, *shape[1:]))
    rows = a.reshape(len(a), -1)[:, 0] % 3 != 0
    mask = rows if kind == "numpy" else da.from_array(rows, chunks=5)
    nones = ", ".join(["None"] * (len(shape) - 1))
    with pytest.raises(ValueError, match="to select rows of x") as info:
        dask_compact.compact(x, mask)
    assert f"da.broadcast_to(mask[:, {nones}], x.shape)" in str(info.value)
    assert 'compact_records({"x": x, "keep": mask}, "keep")["x"]' in str(info.value)
    # what it says, as written there
    keep = mask if kind == "dask" else da.from_array(mask)
    got = dask_compact.compact_records({"x": x, "keep": keep}, "keep")["x"]
    assert not np.isnan(got.shape[0]) and got.shape[1:] == shape[1:]
    np.testing.assert_array_equal(got.compute(), a[rows])
    index = (slice(None),) + (None,) * (len(shape) - 1)  # mask[:, None, ...]
    flat = dask_compact.compact(x, da.broadcast_to(mask[index], x.shape))
    np.testing.assert_array_equal(flat.compute(), a[rows].ravel())


def test_a_mask_declared_bool_whose_chunks_are_not(x):
    """map_blocks can declare dtype=bool over chunks that are not: a uint8 0/2 chunk is
    refused where it is computed, not taken as a selection of its nonzeros (by the rule of
    every chunk, validate.as_declared, which names the chunk and the fix)."""
    m = da.from_array(np.arange(100) % 3, chunks=30).map_blocks(
        lambda b: (b * 2).astype(np.uint8), dtype=bool)
    with pytest.raises(TypeError, match=r"chunk \d of the mask holds uint8, but its dask array "
                                        r"declares bool.*booleans \(b != 0"):
        dask_compact.compact(x, m).compute()


def test_a_mask_of_unknown_chunk_sizes():
    """x known, mask unknown: paired block by block where their chunk counts agree (each task
    checks its two blocks), else refused naming which side is unknown."""
    a = np.arange(10)
    x = da.from_array(a, chunks=5)
    keep = da.ones(10, chunks=5, dtype=bool)
    m = (x % 3 == 0)[keep]  # the same two blocks, sizes unknown
    np.testing.assert_array_equal(dask_compact.compact(x, m).compute(), a[a % 3 == 0])
    other = da.ones(10, chunks=2, dtype=bool)
    with pytest.raises(ValueError, match=r"mask has unknown chunk sizes .*\(2 and 5\)"):
        dask_compact.compact(x, other[other])
    with pytest.raises(ValueError, match=r"x has unknown chunk sizes .*\(5 and 2\)"):
        dask_compact.compact(other[other].astype(int), x > 3)
    longer = da.from_array(np.arange(12), chunks=6)
    with pytest.raises(ValueError, match="does not match"):
        dask_compact.compact(longer, keep[keep]).compute()


def test_a_numpy_mask_of_x_of_unknown_chunk_sizes_says_so():
    """x of unknown chunk sizes (``x[x > 0]``) with a NumPy mask of its length: refused
    saying to compute the chunk sizes, not "mask has shape (4,), x has shape (nan,)" (the
    shape check ran first, so the message written for this case was never reached: a
    new-user probe). With the sizes computed, the same mask selects as NumPy's."""
    a = np.array([3.0, -1.0, 2.0, 0.5, -2.0, 7.0])
    x = da.from_array(a, chunks=4)
    u = x[x > 0]
    keep = np.array([True, False, False, True])
    with pytest.raises(ValueError, match=r"a NumPy mask needs x with known chunk sizes; call "
                                         r"x\.compute_chunk_sizes\(\)"):
        dask_compact.compact(u, keep)
    u.compute_chunk_sizes()
    np.testing.assert_array_equal(dask_compact.compact(u, keep).compute(), a[a > 0][keep])


@pytest.mark.parametrize("call", ["sort", "argsort", "partition"])
def test_a_numpy_backed_dataarray_is_a_type_error_with_distributed_imported(call):
    """With distributed imported, sort, argsort and partition of an xarray DataArray of
    NumPy data crashed ("'NoneType' object has no attribute 'get'": its __dask_graph__()
    is None) before their type check (a new-user probe): a TypeError naming the type."""
    xr = pytest.importorskip("xarray")
    pytest.importorskip("distributed")
    arr = xr.DataArray(np.arange(10.0), dims="t")
    fn = {"sort": dask_compact.sort, "argsort": dask_compact.argsort,
          "partition": lambda a: dask_compact.partition(a, "x > 3")}[call]
    with pytest.raises(TypeError, match=f"{call} needs a dask array, not "):
        fn(arr)


@pytest.mark.parametrize("backed", ["dask", "numpy"])
@pytest.mark.parametrize("call", ["map_compact", "compact", "flatnonzero", "cumsum", "partition",
                                  "sort", "argsort", "compact_records", "records_mixed",
                                  "compact_array"])
def test_an_xarray_object_is_refused_pointing_to_its_data_and_the_accessor(call, backed):
    """An xarray DataArray passed where an array goes was told to be wrapped with
    ``da.from_array`` or converted with ``np.asarray`` (which computes a dask-backed one
    into memory), and a dask-backed field beside a dask array was called in-memory (a
    new-user probe): the error now names the array it wraps, ``.data``, and the accessor."""
    xr = pytest.importorskip("xarray")
    arr = xr.DataArray(np.arange(10.0), dims="t", name="v")
    if backed == "dask":
        arr = arr.chunk(3)
    calls = {
        "map_compact": lambda: dask_compact.map_compact(arr, "x > 3"),
        "compact": lambda: dask_compact.compact(arr, np.arange(10) > 3),
        "flatnonzero": lambda: dask_compact.flatnonzero(arr),
        "cumsum": lambda: dask_compact.cumsum(arr),
        "partition": lambda: dask_compact.partition(arr, "x > 3"),
        "sort": lambda: dask_compact.sort(arr),
        "argsort": lambda: dask_compact.argsort(arr),
        "compact_records": lambda: dask_compact.compact_records({"v": arr}, "v > 3"),
        "records_mixed": lambda: dask_compact.compact_records(
            {"w": da.arange(10.0, chunks=3), "v": arr}, "w > 3"),
        "compact_array": lambda: dask_compact.compact_array(arr, "x > 3"),
    }
    with pytest.raises(TypeError, match=r"xarray DataArray: pass the array it wraps, "
                                        r"\.data") as info:
        calls[call]()
    # the accessor selects: named where the call does, not for a sort or a scan
    selects = call not in ("sort", "argsort", "cumsum")
    assert (".compact.where(cond, dim)" in str(info.value)) == selects
    # what it says works
    got = dask_compact.map_compact(arr.chunk(3).data, "x > 3")
    np.testing.assert_array_equal(got.compute(), np.arange(4.0, 10.0))
    np.testing.assert_array_equal(arr.compact.where("v > 3").values, np.arange(4.0, 10.0))


def test_compact_array_errors():
    with pytest.raises(TypeError, match="NumPy or CuPy"):
        dask_compact.compact_array([1, 2, 3], "x > 1")
    with pytest.raises(ValueError, match="output must be"):
        dask_compact.compact_array(np.arange(3), "x > 1", output="nope")
    with pytest.raises(ValueError, match="output must be"):  # unhashable: still this error
        dask_compact.compact_array(np.arange(3), "x > 1", output=["values"])
    with pytest.raises(TypeError, match="callable or a string"):
        dask_compact.compact_array(np.arange(3), {"x": 1})


def test_registration_does_not_clobber(monkeypatch):
    from dask_compact import accessor

    def other(self, *a, **k):
        return "theirs"

    monkeypatch.setattr(da.Array, "map_compact", other)
    with pytest.warns(RuntimeWarning, match="already defined"):
        accessor.register()
    assert da.Array.map_compact is other
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        accessor.register()  # our own method again: quiet
    assert getattr(da.Array.map_compact, "_dask_compact", False)


def test_a_callable_that_fails_is_named_with_what_it_got():
    """The user's callable raising on a chunk or on record fields (e.g. np.isin with a list,
    which CuPy refuses): its own exception, with a note naming the predicate and the array
    type it got."""
    a = np.random.default_rng(0).random(100)

    def picky(v):
        raise TypeError("not this kind of array")

    def picky_record(x, y):
        raise TypeError("not this kind of array")

    calls = [lambda: dask_compact.compact_array(a, picky),
             lambda: da.from_array(a, chunks=30).map_compact(picky).compute(),
             lambda: dask_compact.compact_records({"x": a, "y": a}, picky_record)]
    for call in calls:
        with pytest.raises(TypeError, match="not this kind") as info:
            call()
        notes = " ".join(getattr(info.value, "__notes__", []))
        assert "the predicate" in notes and "numpy.ndarray of dtype float64" in notes


@pytest.mark.parametrize("mask", [np.array(True), np.array(False), True, np.bool_(True)])
def test_a_zero_d_mask_of_zero_d_x_selects_as_numpy(mask):
    """A 0-d mask has a 0-d x's shape: NumPy's a[np.array(True)] is [a]. It was refused with
    a message that contradicted itself ("a boolean ... array of x's shape (), not
    array(True)", a new-user probe); a 0-d dask mask worked."""
    a = np.array(2.5)
    x = da.from_array(a)
    v, i = dask_compact.compact(x, mask, output="both")
    np.testing.assert_array_equal(v.compute(), a[np.asarray(mask)])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(mask))
    with pytest.raises(TypeError, match="mask must be boolean, not float64"):
        dask_compact.compact(x, np.array(1.0))


# Every public call with dask inputs, run in a subprocess whose dask.array was imported in
# dask's array-expr mode (dask reads array.query-planning once, at that import); prints one
# line per call: name, then the error's type and message, or "ok".
ARRAY_EXPR_CALLS = r"""
import importlib.util
import numpy as np, dask.array as da, dask_compact as dc
a = np.random.default_rng(0).random(101)
x = da.from_array(a, chunks=30)
if not type(x).__module__.startswith("dask.array._array_expr"):
    print("NOT-ARRAY-EXPR", type(x).__module__)
    raise SystemExit
calls = {
    "map_compact method": lambda: x.map_compact("x > 0.5"),
    "map_compact": lambda: dc.map_compact(x, "x > 0.5", output="both"),
    "map_compact lazy": lambda: dc.map_compact(x, "x > 0.5", lazy=True),
    "compact": lambda: dc.compact(x, x > 0.5),
    "compact NumPy mask": lambda: dc.compact(x, a > 0.5),
    "flatnonzero": lambda: dc.flatnonzero(x > 0.5),
    "cumsum": lambda: dc.cumsum(x),
    "sort": lambda: dc.sort(x),
    "argsort": lambda: dc.argsort(x),
    "partition": lambda: dc.partition(x, "x > 0.5"),
    "compact_records": lambda: dc.compact_records({"a": x, "b": x}, "a > 0.5"),
}
if importlib.util.find_spec("xarray") is not None:
    import xarray as xr
    ds = xr.Dataset({"v": ("r", x)})
    calls["xarray accessor"] = lambda: ds.compact.where("v > 0.5")
for name, call in calls.items():
    try:
        call()
        print(name, "|", "ok")
    except Exception as e:
        print(name, "|", type(e).__name__, "|", str(e).replace("\n", " "))
# the in-memory calls take no dask collection: they work in that mode too
got = dc.compact_array(a, "x > 0.5")
print("compact_array", "|", "ok" if np.array_equal(got, a[a > 0.5]) else "WRONG")
"""


def test_array_expr_mode_refused_by_every_call():
    """Under dask's array-expr mode (DASK_ARRAY__QUERY_PLANNING=True), every public call on
    dask arrays crashed deep inside with a misleading error ("Array.__init__() got an
    unexpected keyword argument 'chunks'", "'dict' object has no attribute 'layers'"; a
    new-user probe). Each now refuses up front, naming the mode and how to turn it off."""
    if importlib.util.find_spec("dask.array._array_expr") is None:
        pytest.skip("this dask has no array-expr mode")
    env = dict(os.environ, DASK_ARRAY__QUERY_PLANNING="True")
    proc = subprocess.run([sys.executable, "-c", ARRAY_EXPR_CALLS], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    if proc.stdout.startswith("NOT-ARRAY-EXPR"):
        pytest.skip(f"DASK_ARRAY__QUERY_PLANNING=True gave no array-expr arrays: {proc.stdout}")
    lines = dict(line.split(" | ", 1) for line in proc.stdout.splitlines())
    assert lines.pop("compact_array") == "ok"
    assert len(lines) >= 11, proc.stdout
    for name, got in lines.items():
        kind, _, message = got.partition(" | ")
        assert kind == "NotImplementedError", f"{name}: {got}"
        assert "array-expr mode" in message and "array.query-planning" in message, name
        assert "DASK_ARRAY__QUERY_PLANNING" in message, name


def test_yes_no_arguments_take_bools_only():
    # Until 2026-12-01 every yes/no argument was taken by its truth value: exclusive="no" gave
    # an exclusive scan, lazy="no" a lazy result (a new-user probe). One shared check now
    # (validate.check_flag): True/False, NumPy bools and 0/1 as the settings take them.
    a = np.array([3, 1, 4, 1, 5])
    x = da.from_array(a, chunks=2)
    calls = {
        "scan_array exclusive": lambda v: dask_compact.scan_array(a, exclusive=v),
        "cumsum exclusive": lambda v: dask_compact.cumsum(x, exclusive=v).compute(),
        "compact_array stable": lambda v: dask_compact.compact_array(a, "x > 1", stable=v),
        "compact_into stable": lambda v: dask_compact.compact_into(
            a, "x > 1", np.empty_like(a), stable=v)[0],
        "map_compact lazy": lambda v: x.map_compact("x > 1", lazy=v).compute(),
        "map_compact stable": lambda v: x.map_compact("x > 1", stable=v).compute(),
        "map_compact by_worker": lambda v: x.map_compact("x > 1", by_worker=v).compute(),
        "compact lazy": lambda v: dask_compact.compact(x, x > 1, lazy=v).compute(),
        "flatnonzero lazy": lambda v: dask_compact.flatnonzero(x > 1, lazy=v).compute(),
        "compact_records indices": lambda v: dask_compact.compact_records(
            {"a": a}, "a > 1", indices=v)["a"],
        "compact_records lazy": lambda v: dask_compact.compact_records(
            {"a": x}, "a > 1", lazy=v)["a"].compute(),
        "compact_records stable": lambda v: dask_compact.compact_records(
            {"a": a}, "a > 1", stable=v)["a"],
    }
    for what, call in calls.items():
        fn, name = what.split()
        for bad in ("no", "False", None, 2, -1, 0.5, [], np.array([True, False])):
            with pytest.raises(TypeError, match=f"{fn}: {name} must be True or False"):
                call(bad)
        want = call(True)
        for good in (np.True_, 1, np.int64(1)):
            np.testing.assert_array_equal(call(good), want)
        np.testing.assert_array_equal(call(np.False_), call(False))
        np.testing.assert_array_equal(call(0), call(False))
    np.testing.assert_array_equal(dask_compact.scan_array(a, exclusive=np.False_), np.cumsum(a))


@pytest.mark.parametrize("kind", ["dask", "pandas"])
@pytest.mark.parametrize("call", ["map_compact", "compact", "flatnonzero", "cumsum", "partition",
                                  "sort", "argsort", "compact_records", "compact_array"])
def test_a_dataframe_column_is_refused_saying_how_to_get_its_array(call, kind):
    """A DataFrame's column passed where an array goes was told to be wrapped with
    ``da.from_array`` (a new-user probe, 2026-12-01, fourteenth session): for a dask Series
    that raises in dask ("Trying to convert ... to a boolean value"), for a pandas Series it
    gave a dask array of pandas chunks, refused in turn; compact_records told a dask Series
    field to be converted with ``np.asarray`` (which computes it). The error now names the
    array to pass: ``.to_dask_array(lengths=True)``, or ``.to_numpy()``."""
    pd = pytest.importorskip("pandas")
    a = np.arange(10.0)
    s = pd.Series(a, name="v")
    if kind == "dask":
        dd = pytest.importorskip("dask.dataframe")
        s = dd.from_pandas(s, npartitions=3)
    calls = {
        "map_compact": lambda: dask_compact.map_compact(s, "x > 3"),
        "compact": lambda: dask_compact.compact(s, a > 3),
        "flatnonzero": lambda: dask_compact.flatnonzero(s),
        "cumsum": lambda: dask_compact.cumsum(s),
        "partition": lambda: dask_compact.partition(s, "x > 3"),
        "sort": lambda: dask_compact.sort(s),
        "argsort": lambda: dask_compact.argsort(s),
        "compact_records": lambda: dask_compact.compact_records({"v": s}, "v > 3"),
        "compact_array": lambda: dask_compact.compact_array(s, "x > 3"),
    }
    advice = (r"dask Series: pass its dask array, \.to_dask_array\(lengths=True\)"
              if kind == "dask" else r"pandas Series: pass its values, \.to_numpy\(\)")
    with pytest.raises(TypeError, match=advice):
        calls[call]()
    # what it says works
    if kind == "dask":
        got = dask_compact.map_compact(s.to_dask_array(lengths=True), "x > 3").compute()
    else:
        got = dask_compact.compact_array(s.to_numpy(), "x > 3")
    np.testing.assert_array_equal(got, a[a > 3])


@pytest.mark.parametrize("kind", ["dask", "pandas"])
def test_a_dataframe_as_records_fields_says_how_to_make_the_mapping(kind):
    """compact_records of a DataFrame said only "fields must be a mapping of name -> array
    (e.g. a dict), not DataFrame" (a new-user probe): the error now writes the mapping of
    its columns' arrays, which works."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"e": np.arange(10.0), "i": np.arange(10)})
    if kind == "dask":
        dd = pytest.importorskip("dask.dataframe")
        df = dd.from_pandas(df, npartitions=3)
    with pytest.raises(TypeError, match=r"fields must be a mapping of name -> array \(e\.g\. a "
                                        r"dict\), not a (dask|pandas) DataFrame") as info:
        dask_compact.compact_records(df, "e > 3")
    fields = ({c: df[c].to_dask_array(lengths=True) for c in df.columns} if kind == "dask"
              else {c: df[c].to_numpy() for c in df.columns})
    expected = "{c: df[c].to_dask_array(lengths=True) for c in df.columns}" if kind == "dask" \
        else "{c: df[c].to_numpy() for c in df.columns}"  # fmt: skip
    assert expected in str(info.value)
    out = dask_compact.compact_records(fields, "e > 3")
    np.testing.assert_array_equal(np.asarray(out["i"]), np.arange(4, 10))


@pytest.mark.parametrize("call", ["compact_array", "partition_array", "compact_into",
                                  "scan_array"])
def test_a_dataframe_given_to_an_in_memory_call_is_told_its_columns_not_np_asarray(call):
    """A pandas DataFrame given to compact_array, partition_array, compact_into (the list
    refusal's advice since the fourteenth session) or scan_array was told "convert it first,
    e.g. np.asarray(a)" (a regression review, 2026-12-01, fifteenth session), which makes one
    array of all its columns, row by row: compacted, its values mixed the columns. It is
    told a column's values, as a Series is."""
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"e": np.arange(10.0), "i": np.arange(10)})
    calls = {
        "compact_array": lambda: dask_compact.compact_array(df, "x > 3"),
        "partition_array": lambda: dask_compact.partition_array(df, "x > 3"),
        "compact_into": lambda: dask_compact.compact_into(df, "x > 3", np.empty(20)),
        "scan_array": lambda: dask_compact.scan_array(df),
    }
    with pytest.raises(TypeError, match=r"not a pandas DataFrame: pass a column's values, "
                                        r"df\[name\]\.to_numpy\(\)") as info:
        calls[call]()
    assert "np.asarray" not in str(info.value)
    got = dask_compact.compact_array(df["e"].to_numpy(), "x > 3")
    np.testing.assert_array_equal(got, np.arange(4.0, 10.0))


@pytest.mark.parametrize("call", ["compact_array", "partition_array", "compact_into",
                                  "compact_records", "compact_records_into", "scan_array"])
def test_a_list_given_to_an_in_memory_call_is_told_the_conversion(call):
    """A Python list given to an in-memory call was refused without a way out ("compact_array
    needs a NumPy or CuPy array, not list"; "field 'e' is a list, not an array"), where
    scan_array's refusal named np.asarray (a new-user probe, 2026-12-01, fourteenth session):
    each now names the conversion, which works."""
    data = [0.1, 0.7, 0.3, 0.9]
    calls = {
        "compact_array": lambda a: dask_compact.compact_array(a, "x > 0.5"),
        "partition_array": lambda a: dask_compact.partition_array(a, "x > 0.5")[0][:2],
        "compact_into": lambda a: dask_compact.compact_into(a, "x > 0.5", np.empty(4)),
        "compact_records": lambda a: dask_compact.compact_records({"e": a}, "e > 0.5")["e"],
        "compact_records_into": lambda a: dask_compact.compact_records_into(
            {"e": a}, "e > 0.5", {"e": np.empty(4)}),
        "scan_array": lambda a: dask_compact.scan_array(a),
    }
    name = "e" if call.startswith("compact_records") else "a"
    with pytest.raises(TypeError, match=rf"convert it first, e\.g\. np\.asarray\({name}\)"):
        calls[call](data)
    calls[call](np.asarray(data))  # what it says works


@pytest.mark.parametrize("call", ["map_compact", "method", "partition", "compact_array",
                                  "compact_into", "partition_array"])
def test_a_mask_passed_as_the_predicate_points_to_compact(call):
    """A boolean array passed as the predicate (``x.map_compact(x > 0.5)``, the NumPy habit
    of ``a[a > 0.5]``) was refused as "pred must be a callable or a string expression in
    `x`, not Array" (a new-user probe, 2026-12-01, fourteenth session), where compact_records
    already named the way to select by a mask: the error now names compact(x, mask) and
    NumPy's a[mask], which give the selection."""
    a = np.random.default_rng(3).random(50)
    x = da.from_array(a, chunks=16)
    calls = {
        "map_compact": lambda: dask_compact.map_compact(x, x > 0.5),
        "method": lambda: x.map_compact(x > 0.5),
        "partition": lambda: dask_compact.partition(x, x > 0.5),
        "compact_array": lambda: dask_compact.compact_array(a, a > 0.5),
        "compact_into": lambda: dask_compact.compact_into(a, a > 0.5, np.empty_like(a)),
        "partition_array": lambda: dask_compact.partition_array(a, a > 0.5),
    }
    with pytest.raises(TypeError, match=r"not Array|not ndarray") as info:
        calls[call]()
    assert "dask_compact.compact(x, mask)" in str(info.value)
    assert "a[mask]" in str(info.value)
    # what it says works
    np.testing.assert_array_equal(dask_compact.compact(x, x > 0.5).compute(), a[a > 0.5])


def test_a_refused_chunk_type_is_named_with_what_the_call_does():
    """A scan, a sort and a partition refuse a chunk type in their own words (until
    2026-12-02, eighteenth session, a new-user probe: "cumsum compacts NumPy or CuPy
    chunks", "sort compacts ...")."""
    import dask.array as da

    m = np.matrix(np.arange(6.0))
    x = da.from_array(m, chunks=2)
    for call, words in [(lambda: dask_compact.cumsum(x), "cumsum scans NumPy or CuPy chunks"),
                        (lambda: dask_compact.sort(x), "sort sorts NumPy or CuPy chunks"),
                        (lambda: dask_compact.argsort(x), "argsort sorts NumPy or CuPy"),
                        (lambda: dask_compact.partition_array(m, "x > 1"),
                         "partition_array partitions NumPy or CuPy arrays"),
                        (lambda: dask_compact.compact_array(m, "x > 1"),
                         "compact_array compacts NumPy or CuPy arrays")]:
        with pytest.raises(TypeError, match=words):
            call()
