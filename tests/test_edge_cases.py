"""Edge-case inputs of the Dask-level API: empty N-D arrays, big-endian data, masked and other
chunk types, odd ``chunks=`` values. Each gives NumPy's answer or a clear error up front."""

from __future__ import annotations

import re

import dask.array as da
import numpy as np
import pytest
from conftest import (
    DTYPES,
    EXACT_CHUNK_DTYPES,
    EXACT_VALUE_CHUNK_DTYPES,
    LOSSY_CHUNK_DTYPES,
    chunk_dtypes,
    hidden_dtype,
    hidden_dtype_pred,
    misfit_text,
    odd_chunks_as,
    random_array,
)
from next_steps_helpers import check_columns, check_next_steps

import dask_compact
from dask_compact import compact, compact_array, flatnonzero, map_compact
from dask_compact.graph import without_empty_chunks

EMPTY_SHAPES = [((10, 0), 5), ((0, 10), 5), ((3, 0, 4), (2, 1, 2)), ((0,), 5), ((2, 3, 0), 1)]


@pytest.mark.parametrize("shape, chunks", EMPTY_SHAPES)
@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("kw", [{}, {"lazy": True}, {"chunks": 4}, {"by_worker": False}])
def test_empty_nd_input_gives_empty_result(shape, chunks, output, kw):
    x = da.zeros(shape, chunks=chunks, dtype=np.float32)
    r = map_compact(x, "x > 0", output=output, **kw)
    got = r if output == "both" else (r,)
    for arr, dt in zip(
        got,
        ("float32", "int64")
        if output == "both"
        else (("float32",) if output == "values" else ("int64",)),
    ):
        assert arr.shape[0] == 0 or (kw.get("lazy") and np.isnan(arr.shape[0]))
        out = arr.compute()
        assert out.shape == (0,) and out.dtype == np.dtype(dt)


@pytest.mark.parametrize("shape, chunks", EMPTY_SHAPES)
def test_empty_nd_flatnonzero_and_compact(shape, chunks):
    x = da.zeros(shape, chunks=chunks, dtype=np.int16)
    f = flatnonzero(x)
    assert f.shape == (0,) and f.compute().dtype == np.int64
    c = compact(x, np.zeros(shape, dtype=bool))
    assert c.shape == (0,) and c.compute().dtype == np.int16
    c2 = compact(x, da.zeros(shape, chunks=chunks, dtype=bool), output="both")
    assert c2[0].shape == (0,) and c2[1].compute().dtype == np.int64


@pytest.mark.parametrize(
    "chunks",
    [10**20, 2**63, 0, -2, True, False, 1.5, "big", "0B", "-5MiB", "", "MiB", np.int64(0), [3],
     (3,), np.float64(3)],
)
def test_bad_chunks_is_the_documented_value_error(chunks):
    x = da.arange(10, chunks=5)
    with pytest.raises(ValueError, match="chunks must be a positive int"):
        x.map_compact("x > 3", chunks=chunks)


@pytest.mark.parametrize("chunks", [2**63 - 1, 10**15, np.int32(3), np.uint64(4), 1, "auto",
                                    -1, np.int64(-1), "16B", "1 kB", "64MiB"])
def test_large_and_numpy_int_chunks_work(chunks):
    a = np.arange(10)
    r = da.from_array(a, chunks=5).map_compact("x > 3", chunks=chunks)
    np.testing.assert_array_equal(r.compute(), a[a > 3])


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_chunks_as_dask_rechunk_takes_them(output):
    """-1 is one chunk, a byte size chunks of at most that many bytes of the widest output
    (the int64 indices where they are asked for), as dask's rechunk reads them."""
    a = np.random.default_rng(3).random(100_003).astype(np.float32)
    x = da.from_array(a, chunks=7_001)
    keep = a < 0.7
    one = x.map_compact("x < 0.7", output=output, chunks=-1)
    for r in one if isinstance(one, tuple) else (one,):
        assert r.chunks == ((int(keep.sum()),),)
    got = x.map_compact("x < 0.7", output=output, chunks="64kB")
    got = got if isinstance(got, tuple) else (got,)
    width = 8 if output != "values" else 4
    for r in got:
        assert max(r.chunks[0]) * width <= 64_000 and len(set(r.chunks[0][:-1])) == 1
        assert r.chunks == got[0].chunks  # the outputs of one call share their chunks
    want = {"values": (a[keep],), "indices": (np.flatnonzero(keep),),
            "both": (a[keep], np.flatnonzero(keep))}[output]
    for r, w in zip(got, want):
        np.testing.assert_array_equal(r.compute(), w)


@pytest.mark.parametrize("dtype", [d for d in DTYPES if np.dtype(d).itemsize > 1])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_big_endian_input_follows_numpy(dtype, output):
    rng = np.random.default_rng(3)
    a = random_array(rng, (1025,), dtype).astype(np.dtype(dtype).newbyteorder(">"))
    pred = (
        (lambda v: v.real > 0)
        if a.dtype.kind == "c"
        else ((lambda v: v) if a.dtype.kind == "b" else (lambda v: v > 0))
    )
    m = pred(a)
    x = da.from_array(a, chunks=100)
    r = x.map_compact(pred, output=output)
    got = r if output == "both" else ((r, None) if output == "values" else (None, r))
    if got[0] is not None:
        v = got[0].compute()
        assert v.dtype == np.dtype(dtype) and v.dtype.isnative  # native order (documented)
        np.testing.assert_array_equal(v, a[m])
    if got[1] is not None:
        np.testing.assert_array_equal(got[1].compute(), np.flatnonzero(m))
    np.testing.assert_array_equal(compact_array(a, pred), a[m])
    np.testing.assert_array_equal(compact(x, da.from_array(m, chunks=100)).compute(), a[m])


def test_big_endian_mask_path_and_nd():
    a = np.arange(60.0).reshape(6, 10).astype(">f8")
    x = da.from_array(a, chunks=(4, 3))
    got = x.map_compact(lambda v: np.isin(v, [3.0, 59.0, 17.0])).compute()
    np.testing.assert_array_equal(got, a[np.isin(a, [3.0, 59.0, 17.0])])


def test_masked_arrays_are_refused_with_the_way_out():
    a = np.linspace(0, 1, 10)
    xm = da.ma.masked_greater(da.from_array(a, chunks=5), 0.9)
    for call in (
        lambda: xm.map_compact("x > .5"),
        lambda: flatnonzero(xm),
        lambda: compact(xm, np.ones(10, bool)),
        lambda: compact(
            da.from_array(a, chunks=5), da.ma.masked_less(da.ones(10, chunks=5) > 0, 0)
        ),
        lambda: compact_array(np.ma.masked_greater(a, 0.9), "x > .5"),
    ):
        with pytest.raises(TypeError, match="masked arrays"):
            call()
    # the way out the message gives works and means "masked elements are never selected"
    d = da.ma.getdata(xm)
    got = compact(d, (d > 0.5) & ~da.ma.getmaskarray(xm)).compute()
    np.testing.assert_array_equal(got, a[(a > 0.5) & (a <= 0.9)])


@pytest.mark.parametrize("unit", ["datetime64[s]", "timedelta64[s]"])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_a_masked_array_of_times_in_memory_is_refused_as_any_other(unit, output):
    """compact_array takes datetime64 / timedelta64 by a path of its own (NumPy evaluates
    the predicate), which until 2026-12-01 (fourteenth session, a regression review) skipped
    the chunk-type check: a masked array of times was taken, and its masked elements that
    the comparison on their data selected came back in the values (7, two masked) but not
    in the indices (5), while every other dtype is refused. Refused now, as the others."""
    a = np.arange(10).astype(unit)
    m = np.ma.masked_greater(a, a[7])
    with pytest.raises(TypeError, match="masked arrays") as e:
        compact_array(m, lambda v: v > a[2], output=output)
    assert "compact_array(np.ma.filled(a" in str(e.value), str(e.value)
    # unmasked times still take that path, as NumPy selects
    got = compact_array(a, lambda v: v > a[2], output="both")
    np.testing.assert_array_equal(got[0], a[a > a[2]])
    np.testing.assert_array_equal(got[1], np.flatnonzero(a > a[2]))


def test_a_masked_array_in_memory_is_told_the_numpy_way_out_for_its_call():
    """Until 2026-12-01 (thirteenth session, the regression review) the in-memory calls were
    told the dask way out, ``da.ma.getdata(x)``, ``dask_compact.compact`` and ``map_compact``:
    calls and an array they were not given. Their advice is now NumPy's, naming the call (and
    the field), and what it says gives NumPy's selection of the unmasked elements."""
    a = np.linspace(0, 1, 11)
    m = np.ma.masked_greater(a, 0.9)
    for name, call in (
        ("compact_array", lambda: compact_array(m, "x > .5")),
        ("compact_into", lambda: dask_compact.compact_into(m, "x > .5", np.empty(11))),
        ("partition_array", lambda: dask_compact.partition_array(m, "x > .5")),
    ):
        with pytest.raises(TypeError, match="masked arrays") as e:
            call()
        said = str(e.value)
        assert "da.ma" not in said and "map_compact" not in said, said
        assert f"dask_compact.{name}(np.ma.filled(a, np.nan)" in said, said
    with pytest.raises(TypeError, match="masked arrays") as e:
        dask_compact.compact_records({"energy": m}, "energy > .5")
    said = str(e.value)
    assert "da.ma" not in said and "np.ma.filled(energy, np.nan)" in said, said
    # the way out it gives: NaN fails the comparison, so masked elements are never selected
    got = compact_array(np.ma.filled(m, np.nan), "x > .5")
    np.testing.assert_array_equal(got, a[(a > 0.5) & ~np.ma.getmaskarray(m)])
    # dask record fields are told the same, in dask's calls (they were told the one-array
    # compact/map_compact way until the same session), and what it says selects as NumPy
    xm = da.ma.masked_greater(da.from_array(a, chunks=4), 0.9)
    ids = da.arange(11, chunks=4)
    with pytest.raises(TypeError, match="masked arrays") as e:
        dask_compact.compact_records({"energy": xm, "id": ids}, "energy > .5")
    said = str(e.value)
    assert "da.ma.filled(energy, np.nan)" in said and "~da.ma.getmaskarray(energy)" in said
    assert "map_compact" not in said, said
    keep = ~np.ma.getmaskarray(m) & (a > 0.5)
    got = dask_compact.compact_records({"energy": da.ma.filled(xm, np.nan), "id": ids},
                                       "energy > .5")
    np.testing.assert_array_equal(got["id"].compute(), np.flatnonzero(keep))
    got = dask_compact.compact_records(
        {"energy": da.ma.getdata(xm), "unmasked": ~da.ma.getmaskarray(xm), "id": ids},
        lambda energy, unmasked: (energy > 0.5) & unmasked)
    np.testing.assert_array_equal(got["id"].compute(), np.flatnonzero(keep))


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_a_masked_dask_array_is_told_the_way_out_of_its_own_call(dtype):
    """``sort``, ``argsort``, ``partition`` and ``flatnonzero`` of a masked dask array were
    told the compaction's way out, ``compact(d, ...)`` or ``.map_compact(...)``: another
    call (a regression review, 2026-12-01, fourteenth session; the in-memory calls were given
    their own in the thirteenth). Each is told its own call now, and what it says gives
    NumPy's masked answer."""
    a = (np.arange(11)[::-1] % 7).astype(dtype)
    m = np.ma.masked_array(a, mask=np.arange(11) % 4 == 1)
    xm = da.ma.masked_array(da.from_array(a, chunks=4), mask=np.arange(11) % 4 == 1)
    calls = {"sort": lambda v: dask_compact.sort(v),
             "argsort": lambda v: dask_compact.argsort(v),
             "partition": lambda v: dask_compact.partition(v, "x > 3")[0],
             "flatnonzero": lambda v: dask_compact.flatnonzero(v)}
    for name, call in calls.items():
        with pytest.raises(TypeError, match="masked arrays") as e:
            call(xm)
        said = str(e.value)
        assert f"dask_compact.{name}(da.ma.filled(x, " in said, said
        assert "map_compact" not in said and "compact(d" not in said, said
    # what they say: masked last for a sort (np.ma.sort's fill for an integer dtype), never
    # selected for a split and flatnonzero
    last = np.nan if dtype == "float64" else np.iinfo(dtype).max
    got = dask_compact.sort(da.ma.filled(xm, last)).compute()
    np.testing.assert_array_equal(got[:m.count()], np.ma.sort(m).compressed())
    got = dask_compact.argsort(da.ma.filled(xm, last)).compute()
    np.testing.assert_array_equal(got[:m.count()], np.ma.argsort(m, kind="stable")[:m.count()])
    never = np.nan if dtype == "float64" else 0  # 0: not > 3
    values, k = dask_compact.partition(da.ma.filled(xm, never), "x > 3")
    np.testing.assert_array_equal(values.compute()[:k], m[m > 3].compressed())
    got = dask_compact.flatnonzero(da.ma.filled(xm, 0)).compute()
    np.testing.assert_array_equal(got, np.flatnonzero(m))


@pytest.mark.parametrize("dtype", ["int64", "uint8", "bool", "datetime64[s]"])
def test_the_masked_array_advice_runs_for_a_dtype_without_nan(dtype):
    """The in-memory advice, `np.ma.filled(a, np.nan)`, raised itself for a dtype that holds
    no NaN ("Cannot convert fill_value nan to dtype int64"), as did the records' for such a
    field (a regression review, 2026-12-01, fourteenth session). Each call is told a fill
    its dtype holds (NaT for times, which fails every comparison as NaN does; else a value
    the predicate does not select), and what it says selects as NumPy does."""
    a = (np.arange(11) % 2 == 0) if dtype == "bool" else np.arange(11).astype(dtype)
    m = np.ma.masked_array(a, mask=np.arange(11) > 8)
    t = a[3]
    pred = (lambda v: v) if dtype == "bool" else (lambda v: v > t)
    never = False if dtype == "bool" else a[0]  # a value of a that pred does not select
    keep = pred(a) & ~np.ma.getmaskarray(m)
    calls = {
        "compact_array": lambda b: compact_array(b, pred),
        "compact_into": lambda b: dask_compact.compact_into(b, pred, np.empty(11, b.dtype)),
        "partition_array": lambda b: dask_compact.partition_array(b, pred),
        # a field gathered (a time is not read by a record predicate)
        "compact_records": lambda b: dask_compact.compact_records(
            {"energy": b, "id": np.arange(11)}, "id > 3"),
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match="masked arrays") as e:
            call(m)
        said = str(e.value)
        assert "np.nan" not in said, said
        fill = re.search(r"np\.ma\.filled\((a|energy), ([^)]+\)?)\)", said)
        assert fill is not None, said
        value = fill.group(2)
        if dtype.startswith("datetime"):
            assert value == 'np.datetime64("NaT")', said
            filled = np.ma.filled(m, np.datetime64("NaT"))
        else:
            assert value == "v" and f"a value of {np.dtype(dtype)}" in said, said
            filled = np.ma.filled(m, never)
        if name == "compact_array":  # what it says selects as NumPy does
            np.testing.assert_array_equal(compact_array(filled, pred), a[keep])
    if dtype.startswith("datetime"):
        return
    # the records' other way out, the mask as a field of its own
    got = dask_compact.compact_records(
        {"energy": np.ma.getdata(m), "unmasked": ~np.ma.getmaskarray(m), "id": np.arange(11)},
        lambda energy, unmasked: pred(energy) & unmasked)
    np.testing.assert_array_equal(got["id"], np.flatnonzero(keep))


def test_masked_chunks_under_a_plain_meta_are_refused_in_the_tasks():
    """A dask array whose meta says ndarray but whose chunks are masked (map_blocks returning
    np.ma arrays without saying so): every chunk step refuses them, where the NumPy steps
    took them as data and dropped the mask (a probe found cumsum, sort, partition and
    map_compact doing so)."""
    x = da.from_array(np.arange(10.0), chunks=3)
    m = x.map_blocks(lambda b: np.ma.masked_greater(b, 6), meta=np.empty(0))
    assert type(m._meta) is np.ndarray
    calls = {
        "map_compact": lambda: m.map_compact("x > 2"),
        "map_compact, mask path": lambda: m.map_compact(lambda v: np.isin(v, [1.0, 7.0])),
        "compact": lambda: dask_compact.compact(m, x > 2),
        "compact_records": lambda: dask_compact.compact_records({"a": m, "b": x}, "a > 2")["a"],
        "cumsum": lambda: dask_compact.cumsum(m),
        "sort": lambda: dask_compact.sort(m),
        "argsort": lambda: dask_compact.argsort(m),
        "partition": lambda: dask_compact.partition(m, "x > 2")[0],
    }
    for name, call in calls.items():
        with pytest.raises(TypeError, match="masked array, though the dask array's meta"):
            r = call()
            r.compute()
            pytest.fail(f"{name}: no error")


@pytest.mark.parametrize("kw", [{}, {"lazy": True}, {"chunks": 3}, {"output": "indices"}])
def test_masked_chunks_of_compacts_mask_are_refused(kw):
    """compact's step is dispatched on the data chunk: a mask whose chunks are masked arrays
    under a plain meta was read as its data, the mask's own mask dropped (a probe). Refused
    as a masked mask is at call time; the way out gives NumPy's selection."""
    a = np.arange(10.0)
    x = da.from_array(a, chunks=4)
    m = x.map_blocks(lambda b: np.ma.masked_greater(b, 6) > 2, meta=np.empty(0, bool))
    with pytest.raises(TypeError, match="a chunk of the mask is a masked array, though"):
        out = compact(x, m, **kw)
        out.compute()
    keep = da.ma.getdata(m) & ~da.ma.getmaskarray(m)  # masked elements never selected
    want = a[(a > 2) & (a <= 6)]
    got = compact(x, keep, **kw).compute()
    np.testing.assert_array_equal(got, np.flatnonzero((a > 2) & (a <= 6))
                                  if kw.get("output") == "indices" else want)


def test_other_chunk_types_are_refused():
    class Weird(np.ndarray):
        pass

    w = np.arange(10.0).view(Weird)
    with pytest.raises(TypeError, match="NumPy or CuPy"):
        compact_array(w, "x > 3")
    x = da.from_array(np.arange(10.0), chunks=5).map_blocks(
        lambda b: b.view(Weird), meta=np.empty(0).view(Weird)
    )
    with pytest.raises(TypeError, match="NumPy or CuPy"):
        x.map_compact("x > 3")


@pytest.mark.parametrize(
    "bad",
    [np.arange(3), [1, 2, 3], 3.0, None, "x"],
)
def test_non_dask_input_is_a_type_error(bad):
    with pytest.raises(TypeError, match="needs a dask array"):
        map_compact(bad, "x > 0")


@pytest.mark.parametrize("dtype", ["object", "U3", "V4", "longdouble"])
def test_unsupported_dtypes_are_type_errors(dtype):
    if dtype == "longdouble" and np.dtype(np.longdouble) == np.dtype(np.float64):
        pytest.skip("longdouble is float64 here")
    x = da.from_array(np.zeros(4, dtype=dtype), chunks=2)
    with pytest.raises(TypeError, match="compacts arrays of"):
        x.map_compact(lambda v: v == v)


def test_zero_d_input():
    x = da.from_array(np.array(3.0))
    np.testing.assert_array_equal(x.map_compact("x > 1").compute(), np.array([3.0]))
    np.testing.assert_array_equal(
        x.map_compact("x > 5", output="indices").compute(), np.array([], dtype=np.int64)
    )
    np.testing.assert_array_equal(compact_array(np.array(3.0), "x > 1"), np.array([3.0]))


def test_version_is_exported():
    assert isinstance(dask_compact.__version__, str)


@pytest.mark.parametrize("shape,chunks", [
    ((2, 4), ((2, 0), (4,))),
    ((1, 1), ((1,), (0, 0, 1, 0, 0, 0))),
    ((3, 4), ((0, 2, 0, 1), (0, 3, 1))),
    ((3, 4, 2), ((1, 0, 2), (2, 0, 2), (0, 2))),
])
def test_nd_input_with_empty_chunks(shape, chunks):
    """Empty blocks of an N-D input (Dask's reshape accepts them and builds a graph that
    fails when computed): every call that flattens the input gives NumPy's answer."""
    a = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 1.5 - 2
    x = da.from_array(a, chunks=chunks)
    m = a > 0
    for output, want in (("values", a[m]), ("indices", np.flatnonzero(m))):
        np.testing.assert_array_equal(map_compact(x, "x > 0", output=output).compute(), want)
        np.testing.assert_array_equal(
            map_compact(x, "x > 0", output=output, lazy=True).compute(), want)
    # the masks from NumPy: Dask's own ``x > 0`` over empty blocks computes a wrong shape
    # (dask 2026.7.1: ((1,), (0, 0, 1, 0, 0, 0)) gives a (1, 6) result)
    dm = da.from_array(m, chunks=chunks)
    np.testing.assert_array_equal(compact(x, m).compute(), a[m])
    np.testing.assert_array_equal(compact(x, dm).compute(), a[m])
    np.testing.assert_array_equal(flatnonzero(dm).compute(), np.flatnonzero(m))
    values, split = dask_compact.partition(x, "x > 0")
    np.testing.assert_array_equal(values.compute(), np.concatenate([a[m], a[~m]]))
    assert int(split) == m.sum()
    np.testing.assert_allclose(dask_compact.cumsum(x).compute(), np.cumsum(a))


# A result of one element over several chunks had chunks (0, 1, 0): Dask takes an axis of length
# 1 as broadcastable, so ``y + 1`` computed three elements and ``x[i]`` lost a dependency.
ONE = np.array([0.1, 0.2, 0.3, 0.9, 0.4, 0.1, 0.3])


@pytest.mark.parametrize("chunks", [2, 1, 3])
def test_one_selected_element_stays_one_element_in_arithmetic(chunks):
    x = da.from_array(ONE, chunks=chunks)
    want = ONE[ONE > 0.5]
    y = map_compact(x, lambda v: v > 0.5)
    v, i = map_compact(x, "x > 0.5", output="both")
    for arr in (y, v, i):
        assert arr.shape == (1,) and arr.numblocks == (1,)
    np.testing.assert_array_equal((y + 1).compute(), want + 1)
    np.testing.assert_array_equal((y * v).compute(), want * want)
    np.testing.assert_array_equal((x[i] + 0).compute(), want)
    np.testing.assert_array_equal(y[y > 0].compute(), want)
    np.testing.assert_array_equal((i * 2).compute(), np.flatnonzero(ONE > 0.5) * 2)
    np.testing.assert_array_equal((flatnonzero(x > 0.5) + 1).compute(), [4])


def test_one_selected_record_of_several_fields():
    a = np.arange(21.0).reshape(7, 3)
    x = da.from_array(a, chunks=(2, 2))
    r = dask_compact.compact_records(
        {"e": da.from_array(ONE, chunks=2), "p": x}, "e > 0.5", indices=True
    )
    for k, want in (("e", ONE[3:4]), ("p", a[3:4]), ("indices", np.array([3]))):
        assert r[k].numblocks[0] == 1
        np.testing.assert_array_equal((r[k] + 0).compute(), want)


def test_partition_sort_and_cumsum_of_one_element():
    x = da.from_array(np.array([5.0]), chunks=1)
    y, k = dask_compact.partition(x, "x > 9")
    assert k == 0 and y.numblocks == (1,)
    np.testing.assert_array_equal((y + 1).compute(), [6.0])
    # plain Dask's own boolean indexing leaves chunks (0, 0, 1, 0) for one element
    b = da.from_array(ONE, chunks=2)
    one = b[b > 0.5]
    one.compute_chunk_sizes()
    assert len(one.chunks[0]) > 1
    for out in (dask_compact.sort(one), dask_compact.cumsum(one)):
        assert out.numblocks == (1,)
        np.testing.assert_array_equal((out + 1).compute(), [1.9])


# Results kept one output chunk per input chunk, empty ones too, and Dask (2026.7.1)
# mishandles those in what a user does next: y[::-1] gave [], y.std() nan, y[[0, 3]] and
# y.argmax() raised, dd.concat of two results' DataFrames dropped a row (a new-user probe).
NEXT = np.random.default_rng(11).random(2_000) * 0.9
NEXT[1_234] = 0.95
SELECTIONS = {"empty": "x < -1", "one": "x > 0.92", "sparse": "x < 0.004", "full": "x >= 0"}


def _selected(name: str) -> np.ndarray:
    return {"empty": NEXT < -1, "one": NEXT > 0.92, "sparse": NEXT < 0.004,
            "full": NEXT >= 0}[name]  # fmt: skip


def test_the_sparse_selection_leaves_input_chunks_empty():
    # what the tests below stand on: some chunks of 100 select nothing, some several
    per_chunk = _selected("sparse").reshape(-1, 100).sum(axis=1)
    assert (per_chunk == 0).any() and (per_chunk > 1).any()
    assert _selected("one").sum() == 1


@pytest.mark.parametrize("sel", SELECTIONS)
def test_compactions_have_no_empty_chunks_and_what_follows_is_numpys(sel):
    x = da.from_array(NEXT, chunks=100)
    m = _selected(sel)
    want_v, want_i = NEXT[m], np.flatnonzero(m)
    v, i = map_compact(x, SELECTIONS[sel], output="both")
    assert v.chunks == i.chunks
    results = [(v, want_v), (i, want_i),
               (map_compact(x, SELECTIONS[sel]), want_v),
               (map_compact(x, SELECTIONS[sel], output="indices"), want_i),
               (map_compact(x, lambda q: np.isin(q, want_v)), want_v),  # the mask path
               (compact(x, m), want_v), (compact(x, da.from_array(m, chunks=100)), want_v),
               (flatnonzero(x * m), want_i)]  # fmt: skip
    for y, want in results:
        check_next_steps(y, want, scheduler="threads")
    check_columns({"v": (v, want_v), "i": (i, want_i)}, scheduler="threads")


@pytest.mark.parametrize("sel", SELECTIONS)
def test_records_and_partition_have_no_empty_chunks_and_what_follows_is_numpys(sel):
    m = _selected(sel)
    e = da.from_array(NEXT, chunks=100)
    pos = np.arange(3 * NEXT.size, dtype=np.float64).reshape(-1, 3)
    r = dask_compact.compact_records({"e": e, "pos": da.from_array(pos, chunks=(100, 3))},
                                     SELECTIONS[sel].replace("x", "e"), indices=True)
    assert r["e"].chunks[0] == r["pos"].chunks[0] == r["indices"].chunks[0]
    assert r["pos"].chunks[1] == (3,)  # only the row axis is compacted
    for k, want in (("e", NEXT[m]), ("pos", pos[m]), ("indices", np.flatnonzero(m))):
        check_next_steps(r[k], want, scheduler="threads")
    check_columns({"e": (r["e"], NEXT[m]), "indices": (r["indices"], np.flatnonzero(m))},
                  scheduler="threads")
    v, i, k = dask_compact.partition(e, SELECTIONS[sel], output="both")
    assert v.chunks == i.chunks and k == m.sum()
    order = np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)])
    check_next_steps(v, NEXT[order], scheduler="threads")
    check_next_steps(i, order, scheduler="threads")


@pytest.mark.parametrize("sel", ["empty", "sparse"])
def test_rebalanced_lazy_and_cumsum_results_over_empty_chunks(sel):
    x = da.from_array(NEXT, chunks=100)
    want = NEXT[_selected(sel)]
    for chunks in (3, "auto"):
        check_next_steps(map_compact(x, SELECTIONS[sel], chunks=chunks), want,
                         scheduler="threads")
    lazy = map_compact(x, SELECTIONS[sel], lazy=True)  # unknown chunks: left as they are
    assert len(lazy.chunks[0]) == 20 and all(np.isnan(lazy.chunks[0]))
    np.testing.assert_array_equal(lazy.compute(scheduler="threads"), want)
    # plain Dask's own boolean indexing leaves the empty chunks; cumsum's result does not
    plain = x[x < 0.004] if sel == "sparse" else x[x < -1]
    plain.compute_chunk_sizes()
    assert 0 in plain.chunks[0]
    check_next_steps(dask_compact.cumsum(plain), np.cumsum(want), scheduler="threads",
                     exact=False)  # chunk offsets added: float rounding apart from NumPy's
    check_next_steps(dask_compact.sort(plain), np.sort(want), scheduler="threads")


def test_empty_chunks_are_left_out_by_aliases_of_the_others():
    a = np.arange(24.0).reshape(6, 4)
    x = da.from_array(a, chunks=((0, 2, 0, 3, 1, 0), (1, 3)))
    y = without_empty_chunks(x)
    assert y.chunks == ((2, 3, 1), (1, 3)) and y.name == f"{x.name}-skipempty"
    layer = y.dask.layers[y.name]
    assert all(v in x.dask for v in layer.values())  # each block an alias: no task, no copy
    np.testing.assert_array_equal(y.compute(scheduler="threads"), a)
    empty = da.from_array(np.zeros((0, 4)), chunks=((0, 0, 0), (2, 2)))
    assert without_empty_chunks(empty).chunks == ((0,), (2, 2))
    one_column = da.from_array(np.ones((2, 1)), chunks=((2,), (0, 1, 0)))
    assert without_empty_chunks(one_column).chunks == ((2,), (1,))
    unknown = da.from_array(a, chunks=3).map_blocks(lambda b: b[b[:, 0] > 5], dtype=a.dtype)
    unknown = da.Array(unknown.dask, unknown.name, chunks=((np.nan, np.nan), (3, 1)),
                       meta=unknown._meta)
    assert without_empty_chunks(unknown) is unknown
    same = da.from_array(a, chunks=(2, 4))
    assert without_empty_chunks(same) is same


@pytest.mark.parametrize("where", [0, 1, 3])
def test_a_mask_computed_over_an_axis_of_length_one_in_several_chunks_is_refused(where):
    """A lazy result of one element after compute_chunk_sizes() has chunks like (1, 0); Dask
    computes y > t over it as a broadcast, one block for two, and compact / compact_records
    crashed with "'tuple' object has no attribute 'shape'" (a new-user probe). Refused now,
    saying to rechunk; arrays whose graph computes every block still give NumPy's answer."""
    rng = np.random.default_rng(where)
    a = rng.random(8) * 0.5
    a[where] = 0.95
    x = da.from_array(a, chunks=2)
    y = x.map_compact("x > 0.9", lazy=True)
    y.compute_chunk_sizes()
    assert len(y.chunks[0]) > 1 and sum(y.chunks[0]) == 1
    m = y > 0.5
    for call in (lambda: compact(m, np.ones(1, bool)), lambda: compact(y, m),
                 lambda: compact(y, m, lazy=True), lambda: map_compact(y * 2, "x > 1"),
                 lambda: dask_compact.compact_records({"v": y, "m": m}, "m"),
                 lambda: dask_compact.sort(y * 2), lambda: dask_compact.argsort(y * 2),
                 lambda: dask_compact.cumsum(y * 2)):  # fmt: skip
        with pytest.raises(ValueError, match=r"rechunk\(-1\)"):
            call()
    want = a[a > 0.9]
    np.testing.assert_array_equal(compact(y, np.ones(1, bool)).compute(), want)
    np.testing.assert_array_equal(compact(y, da.ones_like(y, dtype=bool)).compute(), want)
    np.testing.assert_array_equal(map_compact(y, "x > 0.5").compute(), want)
    r = y.rechunk(-1)
    np.testing.assert_array_equal(compact(r, r > 0.5).compute(), want)
    got = dask_compact.compact_records({"v": r, "m": r > 0.5}, "m")
    np.testing.assert_array_equal(got["v"].compute(), want)
    nd = da.from_array(np.array([[1.5]]), chunks=((1,), (0, 0, 1, 0, 0, 0)))
    with pytest.raises(ValueError, match=r"computes 1 of its 6 blocks.*rechunk\(-1\)"):
        compact(nd, nd > 0)


class _Carrier(np.ndarray):
    """An ndarray subclass that carries something beside its numbers (as astropy's Quantity
    carries a unit), whose chunks plain Dask's ``x[x > t]`` would keep as they are."""


def _second_chunk_masked(b, block_info=None):
    return np.ma.masked_greater(b, 0.5) if block_info[0]["chunk-location"][0] == 1 else b


def _second_chunk_carries(b, block_info=None):
    return b.view(_Carrier) if block_info[0]["chunk-location"][0] == 1 else b


@pytest.mark.parametrize("step", ["compact_blocks", "compact_held_runs"])
@pytest.mark.parametrize("make", [lambda b: np.ma.masked_greater(b, 0.5),
                                  lambda b: b.view(_Carrier)], ids=["masked", "subclass"])
def test_a_run_of_chunks_checks_every_chunk_not_the_first_alone(step, make):
    """The steps that compact a run of chunks in one task (a worker's run on a cluster, asked
    directly or as a task) were dispatched on the first chunk's type, and the NumPy one took
    the rest with np.asarray: a masked (or other subclass) chunk after a plain one came back
    as plain data, its mask dropped (a new-user probe: 90 indices where 47 were unmasked).
    Every chunk is checked, as a lone chunk is."""
    from dask_compact.chunk import compact_blocks, compact_held_runs
    from dask_compact.predicate import as_predicate

    a = np.random.default_rng(5).random(20)
    blocks = [a[:10], make(a[10:])]
    p = as_predicate("x > 0.3")
    with pytest.raises(TypeError, match="though the dask array's meta"):
        if step == "compact_blocks":
            compact_blocks(blocks, p, "values", True, "auto", [0, 10])
        else:
            compact_held_runs([blocks], p, "values", True, "auto", [[0, 10]])


def test_masked_or_subclass_chunks_after_a_plain_one_are_refused_in_every_call():
    """The same chunks, under a plain meta, through every public call (threaded scheduler):
    refused, never returned as plain data (README: masked chunks under a plain meta are
    refused when computed, in any input; other ndarray subclasses likewise)."""
    a = np.random.default_rng(1).random(30)
    for blk in (_second_chunk_masked, _second_chunk_carries):
        x = da.from_array(a, chunks=10).map_blocks(blk, meta=np.empty(0))
        calls = {
            "map_compact": lambda: x.map_compact("x > 0.3"),
            "both": lambda: x.map_compact("x > 0.3", output="both")[1],
            "mask path": lambda: x.map_compact(lambda v: np.isin(v > 0.3, [True])),
            "flatnonzero": lambda: flatnonzero(x),
            "compact": lambda: compact(x, a > 0.3),
            "compact_records": lambda: dask_compact.compact_records(
                {"a": da.from_array(a, chunks=10), "x": x}, "a > 0.3")["x"],
            "cumsum": lambda: dask_compact.cumsum(x),
            "sort": lambda: dask_compact.sort(x),
            "partition": lambda: dask_compact.partition(x, "x > 0.3")[0],
        }
        for name, call in calls.items():
            with pytest.raises(TypeError, match="though the dask array's meta"):
                call().compute()
                pytest.fail(f"{blk.__name__}, {name}: no error")


def test_subclass_chunks_under_a_plain_meta_say_how_to_convert():
    """A chunk of another ndarray subclass under a plain meta lost what it carried (an astropy
    Quantity its unit, a probe): refused, naming its type, with a conversion that works."""
    a = np.random.default_rng(2).random(20)
    x = da.from_array(a, chunks=5).map_blocks(lambda b: b.view(_Carrier), meta=np.empty(0))
    with pytest.raises(TypeError, match=r"not test_edge_cases\._Carrier; convert the chunks "
                                        r"first, e.g. x\.map_blocks\(np\.asarray"):
        x.map_compact("x > 0.5").compute()
    y = x.map_blocks(np.asarray, meta=np.empty((0,), "float64"))
    np.testing.assert_array_equal(y.map_compact("x > 0.5").compute(), a[a > 0.5])
    assert type(dask_compact.sort(y).compute()) is np.ndarray


def test_numpy_scalar_chunks_are_told_a_conversion_that_works():
    """A chunk that is a NumPy scalar (a delayed function returning one) was told to convert
    with np.asarray, which makes it 0-d: followed, the advice failed again, on its shape (a
    probe, 2026-12-08). The advice is np.atleast_1d, and followed it works in every call."""
    import re

    import dask

    fd = da.from_delayed(dask.delayed(lambda: np.float64(3.0))(), shape=(1,), dtype=float)
    calls = {"cumsum": dask_compact.cumsum, "sort": dask_compact.sort,
             "map_compact": lambda v: v.map_compact("x > 1")}
    for name, call in calls.items():
        with pytest.raises(TypeError, match="not numpy.float64") as info:
            call(fd).compute()
        advised = re.search(r"e\.g\. (x\.map_blocks\(.*\))$", str(info.value)).group(1)
        assert advised.startswith("x.map_blocks(np.atleast_1d"), advised
        fixed = eval(advised, {"np": np, "x": fd})
        np.testing.assert_array_equal(call(fixed).compute(), [3.0], err_msg=name)


def test_a_matrix_is_not_told_of_astropy():
    """The refusal of an ndarray subclass tells astropy's Quantity way only to a Quantity: a
    np.matrix was told to call to_value(unit) (a probe, 2026-12-08)."""
    with pytest.raises(TypeError, match="not numpy.matrix") as info:
        dask_compact.scan_array(np.matrix([[1, 2], [3, 4]]))
    assert "astropy" not in str(info.value) and "np.asarray(a)" in str(info.value)


def test_memmap_chunks_are_numpy_data(tmp_path):
    """np.memmap is NumPy data in a file: its chunks are taken as they are, not refused as
    another ndarray subclass."""
    from dask_compact.chunk import compact_blocks
    from dask_compact.predicate import as_predicate

    a = np.random.default_rng(3).random(30)
    np.save(tmp_path / "a.npy", a)
    m = np.load(tmp_path / "a.npy", mmap_mode="r")
    blocks = [m[:10], m[10:]]
    assert all(type(b) is np.memmap for b in blocks)
    got = compact_blocks(blocks, as_predicate("x > 0.3"), "values", True, "auto", [0, 10])
    np.testing.assert_array_equal(got[0], a[a > 0.3])
    x = da.from_array(m, chunks=10).map_blocks(lambda b: b.view(np.memmap), meta=np.empty(0))
    np.testing.assert_array_equal(x.map_compact("x > 0.3").compute(), a[a > 0.3])
    np.testing.assert_allclose(dask_compact.cumsum(x).compute(), np.cumsum(a))


class _Duck:
    """A chunk of an array type with no backend, as a sparse array is to the steps."""

    def __init__(self, a: np.ndarray) -> None:
        self.a, self.shape, self.dtype, self.ndim = a, a.shape, a.dtype, a.ndim

    def reshape(self, *shape):
        return _Duck(self.a.reshape(*shape))


def test_chunks_of_another_array_type_under_a_plain_meta_are_refused_clearly():
    """Sparse chunks under a plain meta failed inside the steps with errors that said
    nothing ("No dispatch for <class COO>", "'csr_matrix' object has no attribute
    'nbytes'", a new-user probe): the per-chunk check refuses them, naming the type."""
    a = np.arange(12.0)
    x = da.from_array(a, chunks=4).map_blocks(_Duck, meta=np.empty(0))
    calls = {
        "map_compact": lambda: x.map_compact("x > 3"),
        "compact": lambda: compact(x, a > 3),
        "records": lambda: dask_compact.compact_records(
            {"a": da.from_array(a, chunks=4), "x": x}, "a > 3")["x"],
        "cumsum": lambda: dask_compact.cumsum(x),
        "partition": lambda: dask_compact.partition(x, "x > 3")[0],
        "sort": lambda: dask_compact.sort(x),
    }
    # each in its own words (since 2026-12-02, eighteenth session: "cumsum scans ...")
    verbs = {"cumsum": "scans", "partition": "partitions", "sort": "sorts"}
    for name, call in calls.items():
        with pytest.raises(TypeError, match=r"a chunk of (the input|field 'x'), though the dask"
                                            r" array's meta is NumPy's\) "
                                            + verbs.get(name, "compacts") + r" NumPy or Cu"
                                            r"Py chunks, not test_edge_cases\._Duck"):
            call().compute()
            pytest.fail(f"{name}: no error")


def _advised(err: TypeError) -> str:
    """The conversion a refusal advises: the call after "e.g. "."""
    return str(err).split("e.g. ")[1]


def test_pydata_sparse_chunks_are_refused_with_a_conversion_that_works():
    """The advice was x.map_blocks(np.asarray), which fails for pydata sparse chunks ("dtype
    inference failed": it refuses to densify); the one given per type works."""
    sparse = pytest.importorskip("sparse")
    a = np.random.default_rng(14).random(40)
    a[a < 0.6] = 0
    x = da.from_array(sparse.COO.from_numpy(a), chunks=7, asarray=False)
    hidden = da.from_array(a, chunks=7).map_blocks(sparse.COO.from_numpy, meta=np.empty(0))
    for arr, call in ((x, lambda: x.map_compact("x > 0.7")),
                      (hidden, lambda: hidden.map_compact("x > 0.7").compute())):
        with pytest.raises(TypeError, match="todense") as refused:
            call()
        y = eval(_advised(refused.value), {"np": np, "x": arr})
        np.testing.assert_array_equal(y.map_compact("x > 0.7").compute(), a[a > 0.7])
    with pytest.raises(TypeError, match="todense") as refused:
        compact_array(sparse.COO.from_numpy(a), "x > 0.7")
    assert _advised(refused.value) == "a.todense()"


def test_scipy_sparse_chunks_are_refused_with_a_conversion_that_works():
    """For scipy's sparse chunks the advised np.asarray built a graph that failed ("cannot
    reshape array of size 1", a 0-d object array); the advice given now works."""
    ss = pytest.importorskip("scipy.sparse")
    a = np.random.default_rng(15).random(40)
    a[a < 0.6] = 0
    x = da.from_array(ss.csr_matrix(a.reshape(8, 5)), chunks=(4, 5), asarray=False)
    with pytest.raises(TypeError, match="toarray") as refused:
        x.map_compact("x > 0.7")
    y = eval(_advised(refused.value), {"np": np, "x": x})
    np.testing.assert_array_equal(y.map_compact("x > 0.7").compute(), a[a > 0.7])


def test_recarray_views_of_plain_numbers_are_numpy_data():
    """Chunks that are ``np.recarray`` views of plain numbers carry nothing beside them: taken
    as they were before the per-chunk check (a probe of that check: refused, with a reason
    about extra information that a recarray does not have)."""
    a = np.random.default_rng(6).random(40)
    y = da.from_array(a, chunks=7).map_blocks(lambda b: b.view(np.recarray))
    np.testing.assert_array_equal(y.map_compact(lambda v: v > 0.5).compute(), a[a > 0.5])
    np.testing.assert_array_equal(dask_compact.sort(y).compute(), np.sort(a))


def test_records_in_one_array_are_pointed_to_compact_records():
    """A structured (record) dtype is refused by the compactions, with the call that takes
    it; and the meta in a conversion's advice for a structured chunk is Python that runs (its
    ``str``, "(numpy.record, [...])", was a SyntaxError: a probe ran the advice)."""
    rec = np.rec.fromarrays([np.random.default_rng(0).random(10), np.arange(10)], names="a,b")
    x = da.from_array(rec, chunks=4)
    with pytest.raises(TypeError, match=r"for records, compact_records\(\{name: x\[name\]"):
        x.map_compact(lambda r: r["a"] > 0.5)
    out = dask_compact.compact_records({name: x[name] for name in x.dtype.names}, "a > 0.5")
    for name in rec.dtype.names:
        np.testing.assert_array_equal(out[name].compute(), rec[name][rec["a"] > 0.5])
    y = x.map_blocks(lambda b: b.view(_Carrier), meta=np.empty(0))
    with pytest.raises(TypeError) as e:
        dask_compact.cumsum(y).compute()
    meta = re.search(r"meta=(np\.empty\(\(0,\), \[.*?\]\))", str(e.value)).group(1)
    assert eval(meta, {"np": np}).dtype == np.dtype(rec.dtype.descr)


def _every_call(x: da.Array, a: np.ndarray, pred) -> dict:
    """Each public call over a dask array ``x`` (a record field too) and NumPy's answer for
    its values ``a``: name -> (what runs the call and returns its dask arrays, the NumPy
    arrays they must equal)."""
    import dask_compact as dc

    m = pred(a)
    e = np.linspace(0, 1, a.size)
    ed = da.from_array(e, chunks=x.chunks)
    stable = np.argsort(a, kind="stable")
    sums = np.cumsum(a)
    return {
        "map_compact": (lambda: [x.map_compact(pred)], [a[m]]),
        "indices": (lambda: [x.map_compact(pred, output="indices")], [np.flatnonzero(m)]),
        "both": (lambda: list(x.map_compact(pred, output="both")), [a[m], np.flatnonzero(m)]),
        "chunks=": (lambda: [x.map_compact(pred, chunks=7)], [a[m]]),
        "lazy": (lambda: [x.map_compact(pred, lazy=True)], [a[m]]),
        "by_worker=False": (lambda: [x.map_compact(pred, by_worker=False)], [a[m]]),
        "mask path": (lambda: [x.map_compact(lambda v: np.isin(pred(v), [True]))], [a[m]]),
        "compact": (lambda: [dc.compact(x, pred(x))], [a[m]]),
        "compact, NumPy mask": (lambda: [dc.compact(x, m)], [a[m]]),
        "flatnonzero": (lambda: [dc.flatnonzero(x)], [np.flatnonzero(a)]),
        "records, read": (lambda: list(dc.compact_records({"a": x, "e": ed}, "a != 0").values()),
                          [a[a != 0], e[a != 0]]),
        "records, gathered": (lambda: list(dc.compact_records({"e": ed, "a": x},
                                                              "e > 0.3").values()),
                              [e[e > 0.3], a[e > 0.3]]),
        "cumsum": (lambda: [dc.cumsum(x)], [sums]),
        "partition": (lambda: list(dc.partition(x, pred)[:1]),
                      [np.concatenate([a[m], a[~m]])]),
        "sort": (lambda: [dc.sort(x)], [np.sort(a)]),
        "sort, 3 buckets": (lambda: [dc.sort(x, buckets=3)], [np.sort(a)]),
        "argsort, 3 buckets": (lambda: [dc.argsort(x, buckets=3)], [stable]),
    }


def _check_every_call_in_the_declared_dtype(x, a, declared: str) -> None:
    """Each public call over ``x`` (whose chunks hold other dtypes than ``declared``) gives
    NumPy's answer on ``a``, the declared values, every chunk of it in NumPy's dtype."""
    for name, (call, want) in _every_call(x, a, hidden_dtype_pred(declared)).items():
        got = call()
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and chunk_dtypes(g) == {w.dtype}, (name, g.dtype)
            if name == "cumsum" and w.dtype.kind == "f":
                np.testing.assert_allclose(g.compute(), w, err_msg=name)
            else:
                np.testing.assert_array_equal(g.compute(), w, err_msg=name)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
@pytest.mark.parametrize("chunk_dtype, declared", EXACT_CHUNK_DTYPES)
def test_chunks_that_cast_exactly_to_the_declared_dtype_come_back_in_it(
        scheduler, chunk_dtype, declared):
    """A result declares its input's dtype, and every chunk of it holds that dtype: a chunk
    of a dtype that casts to the declared one exactly (float32 under float64, int16 under
    int64, bool under numbers, the other byte order) is cast as it is taken (odd chunks
    came back in their own dtype, float32 pieces in a float64 result). Every public call,
    against NumPy on the declared dtype's values."""
    import dask

    a, x = hidden_dtype(chunk_dtype, declared)
    with dask.config.set(scheduler=scheduler):
        _check_every_call_in_the_declared_dtype(x, a, declared)


@pytest.mark.parametrize("chunk_dtype, declared", EXACT_VALUE_CHUNK_DTYPES)
def test_chunks_whose_values_are_exact_in_the_declared_dtype_are_cast(chunk_dtype, declared):
    """Chunks of a dtype that can lose values in the declared one (float64 under float32,
    int64 under int32 or float64, signed under unsigned, ints under bool, complex under
    float) were refused by their dtype, where plain Dask's ``x[x > t]`` answers on their
    values (a probe's ``from_delayed(load(i), shape, dtype=float)`` over int64 chunks): cast
    where every value is exact in the declared dtype, in every public call, each chunk of
    the result in the declared dtype, against NumPy. (One scheduler: the rule is each
    chunk's, tested under both schedulers above.)"""
    a, x = hidden_dtype(chunk_dtype, declared)
    _check_every_call_in_the_declared_dtype(x, a, declared)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
@pytest.mark.parametrize("chunk_dtype, declared, value", LOSSY_CHUNK_DTYPES)
def test_chunks_that_would_lose_values_in_the_declared_dtype_are_refused(
        scheduler, chunk_dtype, declared, value):
    """A chunk holding a value that the declared dtype does not hold exactly (0.1 under
    float32, 2^31 under int32, -1 under uint32, 2 or 0.5 under bool, NaN under int64, 1j
    under float64, 2^53 + 1 under float64) came back in its own dtype, or was summed in the
    declared one without a word: refused, in every public call, naming the chunk, both
    dtypes, the value and where it is in the chunk, and the fixes, before a result is
    returned (when it is computed, for a lazy one). The chunks beside it, of the same
    dtypes but exact values, are cast (the test above)."""
    import dask

    a, x = hidden_dtype(chunk_dtype, declared, planted=value)
    calls = _every_call(x, a, hidden_dtype_pred(declared))
    if np.dtype(declared) == np.dtype(bool):
        del calls["cumsum"]  # bool sums into int64: the chunk's ints would too, but checked
    refused = (r"chunk [13579] of (the input|field 'a') holds "
               + re.escape(f"{np.dtype(chunk_dtype)}, but its dask array declares "
                           f"{np.dtype(declared)}, and its value "
                           f"{misfit_text(chunk_dtype, value)} (element 5 of the chunk) is "
                           f"not exact in {np.dtype(declared)}"))
    with dask.config.set(scheduler=scheduler):
        for name, (call, _) in calls.items():
            with pytest.raises(TypeError, match=refused):
                for g in call():
                    g.compute()
                pytest.fail(f"{name}: not refused")


def test_the_refusal_of_a_chunk_says_how_to_fix_it():
    """The message names the dtype every chunk casts to (the fix where the chunks are right)
    and a cast that means the loss; ``x.astype`` would cast nothing (Dask returns ``x``)."""
    a, x = hidden_dtype("float64", "float32", planted=0.1)
    with pytest.raises(TypeError) as refused:
        map_compact(x, "x > 3")
    text = str(refused.value)
    assert "dtype='float64' in the map_blocks, from_delayed or from_array that made it" in text
    fixed = x.map_blocks(lambda b: b.astype("float32"), dtype="float32")  # the advice, run
    with_loss = np.array(x.compute(), dtype="float32")
    np.testing.assert_array_equal(map_compact(fixed, "x > 3").compute(),
                                  with_loss[with_loss > 3])
    assert x.astype("float32") is x
    redeclared = da.from_array(a, chunks=10).map_blocks(odd_chunks_as, "float64", 0.1,
                                                        dtype="float64")
    got = map_compact(redeclared, "x > 3")
    assert chunk_dtypes(got) == {np.dtype("float64")}
    want = redeclared.compute()
    np.testing.assert_array_equal(got.compute(), want[want > 3])


def test_a_mask_of_integer_chunks_under_a_boolean_meta_is_cast_where_they_are_0_and_1():
    """``compact``'s mask declares bool; a chunk of 0s and 1s under it was taken as bytes,
    then refused by its dtype: cast (False and True are exactly 0 and 1, as NumPy's
    ``astype(bool)``); a chunk holding a 2 is refused, naming it and advising ``b != 0``;
    boolean chunks of the data under int64 are cast."""
    a = np.arange(40)
    x = da.from_array(a, chunks=10)
    m = (x % 3 == 0).map_blocks(odd_chunks_as, "int8", dtype=bool)
    np.testing.assert_array_equal(compact(x, m).compute(), a[a % 3 == 0])
    two = (x % 3 == 0).map_blocks(odd_chunks_as, "int8", 2, dtype=bool)
    with pytest.raises(TypeError, match=r"chunk [13] of the mask holds int8, but its dask "
                                        r"array declares bool, and its value 2 \(element 5 "
                                        r"of the chunk\).*b != 0"):
        compact(x, two).compute()
    np.testing.assert_array_equal(compact(x, (x % 3 == 0)).compute(), a[a % 3 == 0])


def test_a_chunk_in_the_declared_dtype_is_taken_without_a_copy():
    """The rule costs a dtype comparison per chunk: nothing is copied where they agree."""
    from dask_compact.validate import as_declared

    b = np.arange(10.0)
    assert as_declared(b, np.dtype("float64"), "f", 0) is b
    assert as_declared(b, None, "f", 0) is b
    cast = as_declared(b.astype("float32"), np.dtype("float64"), "f", 0)
    assert cast.dtype == np.dtype("float64")
    np.testing.assert_array_equal(cast, b)


def test_times_that_overflow_the_declared_finer_unit_are_refused():
    """Seconds under nanoseconds cast by dtype ("safe" in NumPy), but 3000-01-01 is past
    nanoseconds' range and wrapped to 1830-11-23 (a review): refused once any instant
    changes; in range, NaT among them, cast and selected as NumPy does."""
    import dask.array as da

    import dask_compact as dc

    def made(times):
        chunks = [np.array(times[i:i + 2], dtype="M8[s]") for i in range(0, len(times), 2)]
        blocks = [da.from_array(c, chunks=2) for c in chunks]
        return da.concatenate(blocks).map_blocks(lambda b: b, dtype="M8[ns]")

    far = made(["2000-01-01", "NaT", "3000-01-01", "2001-01-01"])
    with pytest.raises(TypeError, match="chunk 1 of the input holds datetime64"):
        dc.compact(far, da.ones(4, chunks=2, dtype=bool)).compute()
    near = made(["2000-01-01", "NaT", "2100-01-01", "2001-01-01"])
    got = dc.compact(near, da.ones(4, chunks=2, dtype=bool)).compute()
    want = np.array(["2000-01-01", "NaT", "2100-01-01", "2001-01-01"], dtype="M8[ns]")
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


class _OverflowingTimes(np.ndarray):
    """Times whose cast to a finer unit raises where an instant is past its range, as some
    NumPy versions do (NumPy 2.4 wraps it instead)."""

    def astype(self, dtype, *args, **kwargs):
        plain = np.asarray(self)
        cast = plain.astype(dtype, *args, **kwargs)
        if ((cast.astype(plain.dtype) != plain) & ~np.isnat(plain)).any():
            raise OverflowError("Overflow when converting between datetime64 units")
        return cast


def test_times_whose_cast_raises_overflow_are_refused_naming_the_first():
    """Where NumPy raises OverflowError for an instant past the declared unit's range (the
    GPU host's NumPy, 2026-12-04) instead of wrapping it: the same misfit as a wrapped one
    (the chunk refused by as_declared), the first such instant named, not NumPy's error. The
    NumPy stand-in is an ndarray subclass, which the public calls refuse as a chunk type, so
    the value step that as_declared takes is called directly."""
    from dask_compact.validate import _cast_by_value, _first_misfit

    times = np.array(["2000-01-01", "NaT", "3000-01-01", "2001-01-01", "2500-01-01",
                      "1999-01-01", "2400-01-01"], dtype="M8[s]")
    chunk = times.view(_OverflowingTimes)
    with pytest.raises(OverflowError):
        chunk.astype("M8[ns]")
    _, misfits = _cast_by_value(chunk, np.dtype("M8[ns]"))  # what as_declared refuses by
    np.testing.assert_array_equal(misfits, np.arange(7) == 2)
    assert _first_misfit(chunk, misfits) == "3000-01-01T00:00:00 (element 2 of the chunk)"
    near = times[[0, 1, 3, 5]].view(_OverflowingTimes)  # in range: cast as NumPy does
    got, misfits = _cast_by_value(near, np.dtype("M8[ns]"))
    assert not misfits.any()
    np.testing.assert_array_equal(got, times[[0, 1, 3, 5]].astype("M8[ns]"))


def test_int64_chunks_under_float64_beyond_2_53_are_refused_not_rounded():
    """int64 -> float64 is "safe" in NumPy but rounds past 2^53 (2^53 + 1 came back as 2^53
    from map_compact, a review): refused where a value is past it, naming it."""
    import dask.array as da

    v = np.array([2**53 + 1, 2**53 + 3, 5, 7], dtype=np.int64)
    x = da.from_array(v, chunks=2).map_blocks(lambda b: b, dtype=np.float64)
    with pytest.raises(TypeError, match="holds int64, but its dask array declares float64, "
                                        "and its value 9007199254740993 "):
        x.map_compact(lambda t: t > 6).compute()


def _astype(chunk: np.ndarray, declared) -> np.ndarray:
    """NumPy's ``astype``, its warnings (overflow, NaN into ints, complex parts) silenced:
    what the exact cases must equal, and what the inexact ones are compared by."""
    import warnings

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", np.exceptions.ComplexWarning)
        return np.asarray(chunk).astype(declared)


def _exact(value, cast) -> bool:
    """Whether ``cast`` (a Python number) is ``value`` exactly: Python compares ints and
    floats exactly (2**53 + 1 != 2.0**53); NaN is NaN, in each part of a complex; -0.0 is 0."""
    def parts(v):
        return (v.real, v.imag) if isinstance(v, complex) else (v, 0)

    def same(p, q):
        return p == q or (isinstance(p, float) and isinstance(q, float) and p != p and q != q)

    return all(same(p, q) for p, q in zip(parts(value), parts(cast)))


# (the chunk's values, its dtype, the declared dtype): each value exact, so the chunk is cast
EXACT_VALUES = [
    ([1.5, np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0,
      float(np.finfo(np.float32).max), 2.0**-149], "f8", "f4"),
    ([np.nan, np.inf, -0.0, 65504.0, 2.0**-24], "f4", "f2"),
    ([0.0, -0.0, 3.0, -(2.0**63), 2.0**62], "f8", "i8"),  # -0.0 is 0 in an int
    ([0.0, 255.0, -0.0], "f2", "u1"),
    ([0.0, -0.0, 1.0], "f8", "bool"),
    ([2**53, -(2**53), 2**60, 0], "i8", "f8"),  # whole multiples of a power of two
    ([2**64 - 2**11, 2**63], "u8", "f8"),
    ([2**24, 16777218, -3], "i8", "c8"),
    ([0, 2**32 - 1], "i8", "u4"),
    ([0, 2**63 - 1], "u8", "i8"),
    ([1 + 0j, -2 - 0j, complex(np.nan, 0)], "c16", "f4"),
    ([complex(1, np.inf), complex(np.nan, np.nan), 0.5j], "c16", "c8"),
    ([0, 1], "u8", "bool"),
]
# (the chunk's values, its dtype, the declared dtype, the first that does not fit)
MISFITS = [
    ([1.0, 2.0**24 + 1], "f8", "f4", 2.0**24 + 1),
    ([1.0, 1e300], "f8", "f4", 1e300),  # would be inf
    ([1.0, 1e-46], "f8", "f4", 1e-46),  # would be 0
    ([1.0, 1e-45], "f8", "f4", 1e-45),  # a float32 subnormal near it, not it
    ([70000.0], "f4", "f2", 70000.0),
    ([2.0, 2.0**63], "f8", "i8", 2.0**63),  # one past int64's range
    ([2.0, np.inf], "f8", "i8", np.inf),
    ([-1.0, 3.0], "f8", "u8", -1.0),
    ([-0.5, 3.0], "f8", "i4", -0.5),  # NumPy truncates it to 0
    ([2**63 - 1], "i8", "f8", 2**63 - 1),  # rounds to 2^63, past int64 on the way back
    ([2**64 - 1], "u8", "f8", 2**64 - 1),
    ([2**53 + 1], "u8", "c16", 2**53 + 1),
    ([1, -1], "i8", "u8", -1),
    ([2**63], "u8", "i8", 2**63),
    ([0, 1, -1], "i1", "bool", -1),
    ([1 + 0j, 0.1 + 0j], "c16", "c8", 0.1 + 0j),
    ([1 + 0j, complex(0, np.nan)], "c16", "f8", complex(0, np.nan)),
]


@pytest.mark.parametrize("values, chunk_dtype, declared", EXACT_VALUES)
def test_a_chunk_whose_values_are_exact_is_cast_as_numpy_casts(values, chunk_dtype, declared):
    """NaN, inf, -0.0, the extremes and subnormals of the declared float, whole floats under
    ints, ints within 2^53 (or whole multiples of a larger power of two) under float64: cast
    as NumPy's ``astype``, signs of zeros and NaNs kept where a float is declared."""
    from dask_compact.validate import as_declared

    chunk = np.array(values, dtype=chunk_dtype)
    got = as_declared(chunk, np.dtype(declared), "f", 0)
    want = _astype(chunk, declared)
    assert got.dtype == np.dtype(declared)
    np.testing.assert_array_equal(got, want)
    if want.dtype.kind in "fc":
        np.testing.assert_array_equal(np.signbit(got.real), np.signbit(chunk.real))


@pytest.mark.parametrize("values, chunk_dtype, declared, misfit", MISFITS)
def test_a_chunk_with_a_value_the_declared_dtype_does_not_hold_is_refused_naming_it(
        values, chunk_dtype, declared, misfit):
    from dask_compact.validate import as_declared

    chunk = np.array(values, dtype=chunk_dtype)
    where = values.index(misfit) if misfit == misfit else 1
    text = misfit_text(chunk_dtype, misfit)
    with pytest.raises(TypeError, match=re.escape(
            f"chunk 4 of the input holds {np.dtype(chunk_dtype)}, but its dask array declares "
            f"{np.dtype(declared)}, and its value {text} (element {where} of the chunk)")):
        as_declared(chunk, np.dtype(declared), "f", 4)


def _float32_samples() -> np.ndarray:
    """float32 values of every class: zeros, the subnormals' ends, the normals' least, NaN
    and inf of both signs, and random bit patterns."""
    tiny = np.finfo(np.float32).tiny
    named = np.array([0.0, -0.0, 1e-40, -1e-40, 1.4e-45, -1.4e-45, tiny * (1 - 2**-23), tiny,
                      -tiny, 1.0, 0.5, np.nan, -np.nan, np.inf, -np.inf, 3.4e38], np.float32)
    random_bits = np.random.default_rng(7).integers(0, 2**32, 20_000, dtype=np.uint32)
    return np.concatenate([named, random_bits.view(np.float32)])


def test_float32_subnormals_by_bits_agree_with_numpy():
    """validate.float32_subnormals (the bits: CuPy's -ftz=true kernels take a float32
    subnormal as 0 in every comparison, not in integer operations on its bits) marks exactly
    the nonzero values below float32's least normal, as NumPy's comparisons say; the
    imaginary parts' test by bits (validate._nonzero_parts) is ``!= 0`` (-0.0 is 0, NaN
    not), for float32 and float64 parts."""
    from dask_compact.validate import _nonzero_parts, float32_subnormals

    v = _float32_samples()
    want = (v != 0) & (np.abs(v) < np.finfo(np.float32).tiny)
    assert want[:9].sum() == 5  # the named subnormals: the test's own check
    np.testing.assert_array_equal(float32_subnormals(v), want)
    with np.errstate(invalid="ignore"):  # signalling NaNs among the random bits
        wide = v.astype(np.float64)
    for parts in (v, wide, v[:20_000].reshape(100, -1)[:, ::3]):
        np.testing.assert_array_equal(_nonzero_parts(parts), parts != 0)
    c = np.array([1 + 1e-40j, 1 - 0j, complex(0, -0.0), complex(0, np.nan)], np.complex64)
    np.testing.assert_array_equal(_nonzero_parts(c.imag), [True, False, False, True])


# float32 and complex64 chunks holding a subnormal, under every by-value dtype that does
# not hold it (a review's CuPy cases); and under those that hold it
F32_SUBNORMAL_CASES = [
    ([1e-40, 2.0], "f4", "i4"), ([2.0, 1e-40], "f4", "u1"), ([-1e-40, 2.0], "f4", "i8"),
    ([1e-40, 2.0], "f4", "f2"), ([0.0, 1e-40, 1.0], "f4", "bool"),
    ([0.5, 1e-40, 3.0], "f4", "i4"), ([1 + 1e-40j, 2 + 0j], "c8", "f4"),
    ([1e-40 + 0j, 2 + 0j], "c8", "f2"), ([1e-40 + 0j, -1e-40 + 0j], "c8", "f4"),
    ([1e-40, -1e-40, 2.0], "f4", "f8"), ([1e-40, 2.0], "f4", "c8"),
]


@pytest.mark.parametrize("values, chunk_dtype, declared", F32_SUBNORMAL_CASES)
def test_float32_subnormals_are_misfits_where_comparisons_flush_them(
        values, chunk_dtype, declared, monkeypatch):
    """Where float32 comparisons flush subnormals to 0 (CuPy's kernels, simulated here by
    comparing the flushed values), a float32 subnormal is still a misfit under an int, a
    bool or float16, by its bits: the same refusal, naming the same value, or the same cast,
    as NumPy's unflushed comparisons give."""
    from dask_compact import validate

    def answer(chunk):
        try:
            return validate.as_declared(chunk, np.dtype(declared), "f", 3)
        except TypeError as e:
            return str(e)

    chunk = np.array(values, dtype=chunk_dtype)
    want = answer(chunk)
    compared = validate._cast_real_compared

    def flushed(v, to, xp):  # the comparisons see 0 where a float32 subnormal is
        cast, misfits = compared(v, to, xp)
        if v.dtype == np.float32:
            v = np.where(validate.float32_subnormals(v), np.float32(0) * np.sign(v), v)
            misfits = compared(v, to, xp)[1]
        return cast, misfits

    monkeypatch.setattr(validate, "_cast_real_compared", flushed)
    monkeypatch.setattr(validate, "_flushes_subnormals", lambda xp: True)
    got = answer(chunk)
    if isinstance(want, str):
        assert got == want and ("e-40" in want or "1 more besides" in want)
    else:
        assert not isinstance(got, str), got
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype


def _ftz(a: np.ndarray) -> np.ndarray:
    """``a`` with its float32 subnormals (complex64 parts too) flushed to 0 of their sign, by
    their bits, as CUDA's ``-ftz=true`` flushes them."""
    a = np.asarray(a)
    if a.dtype == np.complex64:
        out = a.copy()
        out.real, out.imag = _ftz(a.real), _ftz(a.imag)
        return out
    if a.dtype != np.float32:
        return a
    bits = a.view(np.uint32)
    subnormal = (bits & np.uint32(0x7F800000)) == 0  # zeros are kept as they are
    return np.where(subnormal, bits & np.uint32(0x80000000), bits).view(np.float32)


def _float_part(dtype) -> np.dtype | None:
    dtype = np.dtype(dtype)
    if dtype.kind == "c":
        return np.dtype(dtype.char.lower())
    return dtype if dtype.kind == "f" else None


class _FlushingArray(np.ndarray):
    """NumPy data that computes as CuPy's kernels (compiled with ``-ftz=true``) do on a
    device: every ufunc (arithmetic, comparisons, reductions) takes float32 subnormals as 0
    and flushes its float32 results; ``astype`` flushes the float32 side of a conversion
    between float32 and another dtype (a ``cvt``: float32 into float64, complex128, ints or
    float16; float64 into float32), not a move (float32 into complex64 kept them on an
    H200, CuPy 14.2, where float32 into float64 gave ``[1e-40, -1e-40, 2]`` as
    ``[0, -0, 2]``). Integer operations on the bits, views, ``where`` and copies into a
    complex's parts are not flushed."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        assert "out" not in kwargs
        plain = [_ftz(a) if isinstance(a, np.ndarray) else a for a in inputs]
        result = getattr(ufunc, method)(*plain, **kwargs)
        results = result if isinstance(result, tuple) else (result,)
        flushed = tuple(_ftz(r).view(_FlushingArray) if isinstance(r, np.ndarray)
                        else _ftz(np.asarray(r))[()] for r in results)
        return flushed if isinstance(result, tuple) else flushed[0]

    def astype(self, dtype, *args, **kwargs):
        a = np.asarray(self)
        have, want = _float_part(a.dtype), _float_part(dtype)
        if have == np.float32 and want != np.float32:
            a = _ftz(a)
        cast = a.astype(dtype, *args, **kwargs)
        if want == np.float32 and have != np.float32:
            cast = _ftz(cast)
        return cast.view(_FlushingArray)


def _float32_values(n: int, seed: int) -> np.ndarray:
    """The named float32 values of every class (subnormals at both ends, signed zeros, NaN,
    inf) and ``n`` random bit patterns, half of them subnormals (their exponent bits
    cleared), NaNs quiet (a signalling NaN's cast warns and is quieted)."""
    named = np.array([1e-40, -1e-40, 2.0**-149, -(2.0**-149), 1.1754942e-38, -1.1754942e-38,
                      0.0, -0.0, 2.0, np.nan, np.inf, -np.inf, 2.0**-126], np.float32)
    bits = np.random.default_rng(seed).integers(0, 2**32, n, dtype=np.uint32)
    bits[::2] &= np.uint32(0x807FFFFF)
    nan = (bits & np.uint32(0x7F800000)) == np.uint32(0x7F800000)
    bits[nan] |= np.uint32(0x00400000)
    return np.concatenate([named, bits.view(np.float32)])


def _complex64_values(n: int, seed: int) -> np.ndarray:
    real, imag = _float32_values(n, seed), _float32_values(n, seed + 1)[::-1]
    out = np.empty(real.size, np.complex64)
    out.real, out.imag = real, imag
    return out


# CuPy's casts flush float32 subnormals (design.md, **Chunk dtypes**, "CuPy"): chunks whose
# dtype casts to the declared one exactly, float32 into float64 or complex128 and complex64
# into complex128, lost them (0 of their sign); complex64 under float64, cast by value, too;
# float64 chunks of float32 subnormals exactly (2**-149), under float32, complex64 (and
# complex128 ones under complex64 or float32) were refused, where NumPy casts them; inexact
# values in that range (1e-40 in float64, 2**-150) stay refused, as NumPy refuses them
FLUSHED_CAST_CASES = [
    (_float32_values(31, 1), "f8"), (_float32_values(1023, 2), "c16"),
    (_complex64_values(33, 3), "c16"), (_float32_values(33, 4), "c8"),
    (np.array([1e-40 + 0j, -1e-40 - 0j, 2 + 0j], np.complex64), "f8"),
    (np.array([1 + 1e-40j], np.complex64), "f8"),
    (_float32_values(1025, 5).astype(np.float64), "f4"),
    (_float32_values(31, 6).astype(np.float64), "c8"),
    (_complex64_values(33, 7).astype(np.complex128), "c8"),
    (_complex64_values(31, 8).real.astype(np.complex128), "f4"),
    (np.array([2.0**-149, 1e-40, -(2.0**-149), 2.0**-150, 3 * 2.0**-150]), "f4"),
    (np.array([2.0**-149 + 1e-40j, 1.0]), "c8"),
    (np.array([-(2.0**-149), 2.0**-126 * (1 - 2.0**-23), 2.0**-126 * (1 - 2.0**-24)]), "f4"),
]


@pytest.mark.parametrize("chunk, declared", FLUSHED_CAST_CASES,
                         ids=lambda c: str(c.dtype) if isinstance(c, np.ndarray) else c)
def test_casts_that_flush_float32_subnormals_give_numpy_s_answer(chunk, declared, monkeypatch):
    """A chunk on an array module whose kernels flush float32 subnormals (CuPy's; simulated
    by _FlushingArray) is cast or refused as NumPy's chunk of the same values: the same
    values (signs of zeros and of subnormals included), or the same refusal naming the same
    value."""
    from dask_compact import validate

    def answer(c):
        try:
            with np.errstate(invalid="ignore"):
                return validate.as_declared(c, np.dtype(declared), "f", 3)
        except TypeError as e:
            return str(e)

    want = answer(chunk)
    monkeypatch.setattr(validate, "_flushes_subnormals", lambda xp: True)
    monkeypatch.setattr(validate, "_taken_as_is", lambda a: True)
    got = answer(chunk.view(_FlushingArray))
    if isinstance(want, str):
        assert got == want
        return
    assert not isinstance(got, str), got
    assert got.dtype == want.dtype
    got = np.asarray(got)
    np.testing.assert_array_equal(got, want)
    for g, w in ((got.real, want.real), (got.imag, want.imag)):
        np.testing.assert_array_equal(np.signbit(g), np.signbit(w))
    assert np.isnan(chunk).any() == np.isnan(got).any()


def test_the_flushing_simulation_flushes_what_cupy_s_casts_flush():
    """The test's own check: _FlushingArray loses float32 subnormals in the casts CuPy's
    flush (a chunk cast by NumPy's astype alone, as before the fix, would not give NumPy's
    answer), and keeps them where the bits move."""
    f = np.array([1e-40, -1e-40, 2.0], np.float32).view(_FlushingArray)
    wide = np.asarray(f.astype(np.float64))
    np.testing.assert_array_equal(wide, [0, 0, 2])
    np.testing.assert_array_equal(np.signbit(wide), [False, True, False])
    assert np.asarray(f.astype(np.complex64))[0] == np.float32(1e-40)
    narrow = np.asarray(np.array([2.0**-149, 1.0]).view(_FlushingArray).astype(np.float32))
    np.testing.assert_array_equal(narrow, [0, 1])
    assert not (f[:1] != 0).any()  # comparisons flush too


def test_the_refusal_counts_the_misfits_and_places_them_in_an_nd_chunk():
    from dask_compact.validate import as_declared

    chunk = np.array([[1.0, 2.0], [0.5, 1.5]])
    with pytest.raises(TypeError, match=re.escape("its value 0.5 (element (1, 0) of the "
                                                  "chunk; 1 more besides)")):
        as_declared(chunk, np.dtype("int32"), "f", 0)


@pytest.mark.parametrize("values, chunk_dtype, misfit", [
    ([-(2**63), 5], "i8", -(2**63)),  # NaT's bits: NumPy's "safe" cast made NaT of it
    ([5, 2**63], "u8", 2**63),  # past int64: refused by its dtype before, as no others
    ([5, -(2**63) + 1, 2**63 - 1], "i8", None), ([0, 2**63 - 1], "u8", None),
    ([-128, 127], "i1", None), ([0, 2**32 - 1], "u4", None), ([True, False], "bool", None)])
def test_ints_under_timedelta64_are_counts_of_its_unit(values, chunk_dtype, misfit):
    """Ints and bools under a timedelta64 are cast by value (design.md, **Chunk dtypes**):
    the same count of the declared unit, as NumPy's astype; int64's least (NaT there) and
    uint64s past int64's greatest refused, naming them. Under a datetime64 they stay
    refused by their dtype."""
    from dask_compact.validate import as_declared

    chunk = np.array(values, dtype=chunk_dtype)
    declared = np.dtype("m8[s]")
    if misfit is None:
        got = as_declared(chunk, declared, "f", 0)
        assert got.dtype == declared
        np.testing.assert_array_equal(got.astype(np.int64), chunk.astype(np.int64))
        assert not np.isnat(got).any()
    else:
        with pytest.raises(TypeError, match=re.escape(
                f"holds {chunk.dtype}, but its dask array declares timedelta64[s], and its "
                f"value {misfit} (element {values.index(misfit)} of the chunk)")):
            as_declared(chunk, declared, "f", 2)
    with pytest.raises(TypeError, match="does not cast to datetime64.s. without loss"):
        as_declared(chunk, np.dtype("M8[s]"), "f", 0)


def test_kinds_no_value_passes_between_are_refused_by_dtype():
    """Times and numbers, datetimes and timedeltas, bytes and unicode: no value is looked at
    (an empty chunk too)."""
    from dask_compact.validate import as_declared

    for chunk, declared in [(np.arange(3), "M8[s]"), (np.zeros(0), "m8[s]"),
                            (np.array([1], "m8[s]"), "M8[s]"),
                            (np.array(["a"], "U1"), "S1"), (np.array([1], "M8[s]"), "int64")]:
        with pytest.raises(TypeError, match="does not cast to .* without loss"):
            as_declared(chunk, np.dtype(declared), "f", 0)


@pytest.mark.parametrize("chunk_dtype, declared", [
    ("f8", "f4"), ("i8", "i4"), ("i8", "u8"), ("f8", "i8"), ("c16", "f8"), ("i8", "bool"),
    ("i8", "f8"), ("M8[ms]", "M8[s]"), ("M8[s]", "M8[ns]"), ("U5", "U3")])
def test_an_empty_chunk_of_another_dtype_is_cast(chunk_dtype, declared):
    """No value to lose (a loader's ``np.array([])`` is float64, whatever it was declared):
    cast, N-D too, through a public call as well."""
    from dask_compact.validate import as_declared

    for shape in [(0,), (0, 3)]:
        got = as_declared(np.zeros(shape, chunk_dtype), np.dtype(declared), "f", 0)
        assert got.dtype == np.dtype(declared) and got.shape == shape
    if np.dtype(declared).kind in "biuf":
        a = np.arange(12).astype(declared)
        x = da.from_array(a, chunks=4).map_blocks(
            lambda b, block_id=None: b if block_id[0] != 1 else b[:0].astype(chunk_dtype),
            dtype=declared, chunks=((4, 0, 4),))
        got = x.map_compact(lambda v: v == v)
        assert chunk_dtypes(got) <= {np.dtype(declared)}
        np.testing.assert_array_equal(got.compute(), np.concatenate([a[:4], a[8:]]))


def test_from_delayed_int64_chunks_under_float_answer_as_plain_dask():
    """The probe's case: ``da.from_delayed(load(i), shape, dtype=float)`` over a loader that
    returns int64 ids: plain Dask's ``x[x > t]`` answers on the chunks' values; so do the
    calls, in float64, as NumPy's ``astype`` gives them."""
    import dask

    ids = np.random.default_rng(3).integers(0, 2**53, 1025)
    parts = [ids[i:i + 97] for i in range(0, ids.size, 97)]
    x = da.concatenate([da.from_delayed(dask.delayed(lambda p: p)(p), p.shape, dtype=float)
                        for p in parts])
    t = float(np.median(ids))
    want = ids.astype(float)[ids > t]
    np.testing.assert_array_equal(x[x > t].compute(), want)  # plain Dask
    got = x.map_compact(lambda v: v > t)
    assert chunk_dtypes(got) == {np.dtype(float)}
    np.testing.assert_array_equal(got.compute(), want)
    np.testing.assert_array_equal(dask_compact.sort(x, buckets=3).compute(),
                                  np.sort(ids.astype(float)))


@pytest.mark.parametrize("split", [(2, 2), (1, 3), (3, 1, 2)])
def test_nd_chunks_of_another_dtype_are_taken_in_the_declared_dtype_before_dask_joins_them(
        split):
    """A regression probe (2026-12-01): N-D input whose trailing axes are split is put in C
    order by Dask's reshape, which joins blocks in the first block's dtype: an int64 first
    block made the float32 blocks' 0.75 a 0 (map_compact dropped them, cumsum summed 12 for
    15, compact_records' rows held 0), before any check of ours; plain Dask's ``x[x > t]``
    is as wrong. Every chunk is now taken in the declared dtype first (joined_chunks)."""
    import dask

    rng = np.random.default_rng(5)
    shape = tuple(4 * k for k in split)
    ref = rng.integers(0, 50, shape) / 4  # quarters: exact in float32
    sizes = [s // k for s, k in zip(shape, split)]
    first = tuple(slice(0, s) for s in sizes)
    ref[first] = np.trunc(ref[first])  # the first block is int64: whole values
    load = dask.delayed(lambda b: b)
    blocks = np.empty(split, dtype=object)
    for idx in np.ndindex(*split):
        part = ref[tuple(slice(i * s, (i + 1) * s) for i, s in zip(idx, sizes))]
        blocks[idx] = da.from_delayed(load(part.astype("f4" if any(idx) else "i8")),
                                      part.shape, dtype="f8")
    x = da.block(blocks.tolist())
    t = 3.0
    np.testing.assert_array_equal(x.map_compact(lambda v: v > t).compute(), ref[ref > t])
    np.testing.assert_array_equal(compact(x, x > t).compute(), ref[ref > t])
    np.testing.assert_array_equal(dask_compact.cumsum(x).compute(), np.cumsum(ref))
    values, _k = dask_compact.partition(x, lambda v: v > t)
    np.testing.assert_array_equal(values.compute(),
                                  np.concatenate([ref[ref > t], ref[~(ref > t)]]).ravel())
    rows = ref.reshape(shape[0], -1)[:, 0] >= t
    got = dask_compact.compact_records({"a": x, "k": x[(slice(None),) + (0,) * (x.ndim - 1)]},
                                       lambda k: k >= t)
    np.testing.assert_array_equal(got["a"].compute(), ref[rows])


def test_a_mask_whose_joined_blocks_hold_another_dtype_is_refused_not_cast():
    """The same join for a mask: an int64 block of 2s declared bool became True in Dask's
    join after a first boolean block; refused now as a 1-D mask's chunk is (2 is not exact
    in bool), and a mask rechunked to x's chunks likewise."""
    import dask

    load = dask.delayed(lambda b: b)
    mb = {(i, j): (np.zeros((2, 2), bool) if j == 0 else np.full((2, 2), 2, "i8"))
          for i in range(2) for j in range(2)}
    m = da.block([[da.from_delayed(load(mb[i, j]), (2, 2), dtype=bool) for j in range(2)]
                  for i in range(2)])
    x = da.arange(16.0, chunks=4).reshape(4, 4).rechunk(2)
    with pytest.raises(TypeError, match="its value 2"):
        compact(x, m).compute()
    m1 = da.concatenate([da.from_delayed(load(np.array([False, True, 2, 0])[i:i + 2]), (2,),
                                         dtype=bool) for i in (0, 2)])
    with pytest.raises(TypeError, match="its value 2"):
        compact(da.arange(4.0, chunks=4), m1).compute()  # m1 rechunked to x's one chunk


def test_record_fields_rechunked_to_whole_rows_take_their_chunks_in_the_declared_dtype():
    """compact_records brings every field to whole rows in the first field's row chunks: an
    (n, 4) field split along its columns is rechunked, joining its blocks in the first
    block's dtype (an int64 block's, so the float32 blocks' 0.25s came back as 0)."""
    import dask

    load = dask.delayed(lambda b: b)
    a = np.arange(48.0).reshape(12, 4) / 4
    a[:, :2] = np.trunc(a[:, :2])
    f = da.concatenate([da.from_delayed(load(a[:, :2].astype("i8")), (12, 2), dtype="f8"),
                        da.from_delayed(load(a[:, 2:].astype("f4")), (12, 2), dtype="f8")],
                       axis=1)
    k = da.from_array(np.arange(12), chunks=3)
    got = dask_compact.compact_records({"k": k, "f": f}, lambda k: k % 2 == 0)
    np.testing.assert_array_equal(got["f"].compute(), a[::2])


_NUMBERS = [np.dtype(t) for t in ("bool", "int8", "int16", "int32", "int64", "uint8",
                                  "uint16", "uint32", "uint64", "float16", "float32",
                                  "float64", "complex64", "complex128")]


def _chunks_under_declared():
    """(a chunk, the declared dtype): values of the declared dtype in the chunk's (mostly
    exact), some of them replaced by any values of the chunk's dtype (NaN, inf, -0.0,
    subnormals, the extremes: hypothesis' own)."""
    from hypothesis import strategies as st
    from hypothesis.extra import numpy as hnp

    @st.composite
    def draw(draw):
        dtype, declared = draw(st.sampled_from(_NUMBERS)), draw(st.sampled_from(_NUMBERS))
        n = draw(st.integers(0, 9))
        chunk = _astype(draw(hnp.arrays(declared, n)), dtype)
        anything = draw(hnp.arrays(dtype, n))
        for i in draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=2)) if n else []:
            chunk[i] = anything[i]
        return chunk, declared

    return draw()


def test_every_pair_of_number_dtypes_by_value():
    """Any chunk under any declared number dtype: cast, as NumPy's ``astype``, where each
    value comes back exactly (compared as Python numbers, exact between ints and floats),
    else refused naming the first value that does not: the rule against a reference that
    knows nothing of dtypes."""
    from hypothesis import given, settings

    from dask_compact.validate import as_declared

    @settings(max_examples=300, deadline=None)
    @given(_chunks_under_declared())
    def check(case):
        chunk, declared = case
        want = _astype(chunk, declared)
        exact = [_exact(v, c) for v, c in zip(chunk.tolist(), want.tolist())]
        if all(exact):
            got = as_declared(chunk, declared, "f", 0)
            assert got.dtype == declared
            np.testing.assert_array_equal(got, want)
            if declared.kind in "fc":  # the sign of a zero or NaN kept
                np.testing.assert_array_equal(np.signbit(got.real), np.signbit(want.real))
        else:
            first = exact.index(False)
            with pytest.raises(TypeError, match=re.escape(
                    f"its value {str(chunk[first])} (element {first} of the chunk")):
                as_declared(chunk, declared, "f", 0)

    check()


@pytest.mark.parametrize("dtype", ["datetime64[s]", ">M8[s]", "timedelta64[ms]"])
@pytest.mark.parametrize(("masked", "call"), [
    *[(m, c) for m in (True, False) for c in ("partition", "partition_array")],
    (False, "partition-unknown-sizes"),  # dask's x[m] declares no mask: refused as it runs
])
def test_a_time_array_given_to_partition_is_told_a_split_partition_takes(dtype, masked, call):
    """A masked time array given to ``partition`` was told to fill it with NaT and call
    ``partition`` again, which refuses time dtypes anyway (``partition`` splits numbers
    only), and an unmasked one was told the calls that take times, none of them a split
    (fifteenth session's probes, 2026-12-01). Each is told to split the times' int64 view,
    comparing times on it viewed back, and what it says, run as it is written, gives
    NumPy's split (masked elements never selected)."""
    a = (np.arange(13)[::-1] * 7 % 11).astype(dtype)
    a[4] = np.array("NaT", dtype)
    t = a[2]  # 5 elements after it, NaT not among them
    hidden = np.arange(13) % 5 == 1
    given = np.ma.masked_array(a, mask=hidden) if masked else a
    data = np.where(hidden, np.array("NaT", dtype), a) if masked else a
    m = data > t
    want = np.concatenate([data[m], data[~m]])
    if call != "partition_array":
        x = (da.ma.masked_array(da.from_array(a, chunks=4), mask=hidden) if masked
             else da.from_array(a, chunks=4))
        if call == "partition-unknown-sizes":  # dask's x.view refuses these (a probe)
            x = x[da.from_array(np.ones(a.size, bool), chunks=4)]
            assert np.isnan(x.shape[0])
        names = {"x": x}
    else:
        names = {"a": given}
    with pytest.raises(TypeError) as e:
        getattr(dask_compact, call.split("-")[0])(*names.values(), lambda v: v > t)
    said = str(e.value)
    code = re.findall(r"`([^`]*dask_compact\.[^`]*)`", said)
    assert len(code) == 1, said
    scope = {**names, "t": t, "np": np, "da": da, "dask_compact": dask_compact}
    exec(code[0], scope)  # as it is written
    v, k = scope["v"], scope["k"]
    v = v if call == "partition_array" else v.compute()
    assert v.dtype == np.dtype(dtype) and k == m.sum(), said
    bits = np.dtype(dtype).newbyteorder("=")  # of either order, compared as int64 bits
    np.testing.assert_array_equal(v.astype(bits).view("i8"), want.astype(bits).view("i8"))
    if masked:  # never selected: the masked elements' places hold NaT after k
        np.testing.assert_array_equal(v[:k], a[(a > t) & ~hidden])
