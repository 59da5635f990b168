"""``ds.compact.where(cond, dim)``: the xarray accessor over compact_records, checked against
``ds.isel({dim: np.flatnonzero(mask)})`` with the mask computed by NumPy."""

from __future__ import annotations

import doctest
import re
import subprocess
import sys
import warnings

import numpy as np
import pytest

xr = pytest.importorskip("xarray")

import dask.array as da

import dask_compact
from dask_compact import xarray_accessor

COND = "(energy > 5) & (abs(eta) < 2.5)"


def events(n: int, seed: int = 0, *, string_index: bool = False) -> xr.Dataset:
    """An in-memory Dataset of n events: several dtypes, a 2-D variable with ``event`` first
    and one with it second, a variable without ``event``, index and non-index coordinates."""
    rng = np.random.default_rng(seed)
    index = (np.array([f"ev{i}" for i in range(n)], dtype=object) if string_index
             else 1000 + np.arange(n))
    ds = xr.Dataset(
        {
            "energy": ("event", rng.random(n) * 10, {"units": "GeV"}),
            "eta": ("event", (rng.random(n) * 6 - 3).astype(np.float32)),
            "nhit": ("event", rng.integers(0, 100, n).astype(np.int32)),
            "flag": ("event", rng.random(n) > 0.5),
            "hits": (("event", "layer"), rng.integers(0, 9, (n, 3))),
            "img": (("layer", "event"), rng.random((3, n)).astype(np.float32)),
            "calib": ("layer", np.arange(3.0), {"note": "no event dim"}),
        },
        coords={
            "event": index,
            "run": ("event", np.arange(n) // 10),
            "label": ("event", np.array([f"l{i}" for i in range(n)])),
            "layer": ["a", "b", "c"],
        },
        attrs={"title": "events", "version": 2},
    )
    return ds


def reference(ds: xr.Dataset, mask: np.ndarray) -> xr.Dataset:
    return ds.compute().isel(event=np.flatnonzero(mask))


def mask_of(ds: xr.Dataset, threshold: float = 5.0) -> np.ndarray:
    e, eta = ds.energy.values, ds.eta.values
    return (e > threshold) & (np.abs(eta) < 2.5)


def check_same(out: xr.Dataset, ref: xr.Dataset) -> None:
    """Same variables, values, dtypes, dimension order, attributes; dask variables along
    ``event`` with known and identical chunks."""
    got = out.compute()
    xr.testing.assert_identical(got, ref)
    assert list(out.data_vars) == list(ref.data_vars)
    for name, v in got.variables.items():
        assert v.dtype == ref.variables[name].dtype, name
        assert v.dims == ref.variables[name].dims, name
    assert out.sizes["event"] == ref.sizes["event"]
    sizes = {v.chunks[v.dims.index("event")] for v in out.variables.values()
             if v.chunks is not None and "event" in v.dims}
    assert len(sizes) <= 1, sizes
    for s in sizes:
        assert not any(np.isnan(c) for c in s) and sum(s) == ref.sizes["event"]


@pytest.mark.parametrize("n", [0, 1, 33, 1025])
@pytest.mark.parametrize("threshold", [-1.0, 5.0, 11.0], ids=["all", "some", "none"])
def test_dask_dataset_matches_isel(n, threshold):
    ds = events(n, seed=n)
    if threshold < 0:  # every row: energy > -1 and |eta| < 2.5 made true
        ds["eta"] = ds.eta * 0
    mask = mask_of(ds, threshold)
    d = ds.chunk(event=max(7, n // 8))  # odd chunk sizes, few enough tasks
    out = d.compact.where(f"(energy > {threshold}) & (abs(eta) < 2.5)", dim="event")
    check_same(out, reference(d, mask))
    assert isinstance(out.energy.data, da.Array)
    assert out.chunks["event"] == out.energy.chunks[0]  # one chunking for the whole Dataset
    assert out.calib.identical(ds.calib)  # no event dim: kept as it was
    assert out.encoding == {} and out.energy.encoding == {}


def test_full_and_empty_selection():
    d = events(100).chunk(event=16)
    full = d.compact.where("energy >= 0", dim="event")
    check_same(full, d.compute())
    empty = d.compact.where("energy < 0", dim="event")
    assert empty.sizes["event"] == 0
    check_same(empty, reference(d, np.zeros(100, bool)))


def test_default_dim_callable_and_indices():
    ds = events(257, seed=3)
    d = ds.chunk(event=50)
    mask = mask_of(ds)
    out = d.compact.where(lambda energy, eta: (energy > 5) & (abs(eta) < 2.5), indices="row")
    np.testing.assert_array_equal(out.row.values, np.flatnonzero(mask))
    assert out.row.dtype == np.int64 and "row" in out.coords
    assert out.row.chunks == out.energy.chunks
    check_same(out.drop_vars("row"), reference(d, mask))


def test_string_index_and_object_coordinates():
    ds = events(120, string_index=True)
    ds = ds.assign_coords(tag=("event", np.array([f"t{i}" for i in range(120)], dtype=object)))
    mask = mask_of(ds)
    for d in (ds.chunk(event=25), ds.chunk(event=25).assign_coords(tag=ds.tag)):
        out = d.compact.where(COND, dim="event")  # object tag chunked (dask) or in memory
        check_same(out, reference(d, mask))
        assert out.indexes["event"].equals(ds.indexes["event"][mask])


def test_in_memory_coordinates_of_a_dask_dataset():
    ds = events(99)
    mem = np.arange(99) * 0.5
    when = np.datetime64("2026-01-01") + np.arange(99).astype("timedelta64[h]")
    d = ds.chunk(event=10).assign_coords(mem=("event", mem), when=("event", when))
    d = d.assign_coords(stamp=("event", when)).set_xindex("stamp")  # a second index along event
    assert not isinstance(d.mem.data, da.Array)
    out = d.compact.where(COND, dim="event")
    check_same(out, reference(d, mask_of(ds)))
    assert isinstance(out.mem.data, da.Array)  # compacted in the same pass, chunked like all
    assert set(out.xindexes) == {"event", "layer", "stamp"}


def test_cond_reads_coordinates():
    ds = events(64)
    d = ds.chunk(event=9)
    mask = (ds.run.values % 2 == 0) & (ds.event.values > 1010)
    out = d.compact.where("(run % 2 == 0) & (event > 1010)")  # non-index and index coordinate
    check_same(out, reference(d, mask))


def test_multi_index_and_a_variable_named_x():
    ds = xr.Dataset({"v": (("a", "b"), np.arange(12.0).reshape(3, 4))},
                    coords={"a": [1, 2, 3], "b": list("wxyz")})
    st = ds.stack(event=("a", "b")).chunk(event=5)
    for cond, mask in (("v > 4.5", st.v.values > 4.5), ("(a > 1) & (v < 10)",
                                                         (st.a.values > 1) & (st.v.values < 10))):
        out = st.compact.where(cond)
        xr.testing.assert_identical(out.compute(), st.compute().isel(event=np.flatnonzero(mask)))
    # a coordinate named x (the one-array predicates' variable) beside the variables read
    d = xr.Dataset({"energy": ("event", np.arange(6.0)), "img": (("x", "event"), np.ones((2, 6)))},
                   coords={"x": [0, 1]}).chunk(event=4)
    assert d.compact.where("energy > 2").sizes == {"event": 3, "x": 2}


@pytest.mark.parametrize("chunked", [False, True])
def test_a_variable_named_like_a_generated_key_keeps_its_own_data(chunked):
    """A variable whose name is not a string gets a key of its own; a string variable
    named like that key must not take its place (both came back with one's data)."""
    n = 40
    ds = xr.Dataset({"e": ("ev", np.arange(n) * 1.0), 0: ("ev", np.arange(n)),
                     "<variable 1>": ("ev", -np.arange(n)),
                     "<<variable 1>>": ("ev", 7 * np.arange(n))})
    if chunked:
        ds = ds.chunk(ev=10)
    out = ds.compact.where("e > 30")
    xr.testing.assert_identical(out.compute(),
                                ds.compute().isel(ev=np.flatnonzero(np.arange(n) > 30)))


def test_rebalanced_empty_selection_keeps_one_chunking():
    """chunks= with nothing selected: every variable along the dimension with the same
    chunks (1-D and 2-D variables came back chunked apart, and Dataset.chunks raised)."""
    n = 100
    ds = xr.Dataset({"e": ("ev", np.arange(n) * 1.0),
                     "pos": (("ev", "xyz"), np.zeros((n, 3)))}).chunk(ev=10)
    out = ds.compact.where("e > 1000", chunks=7)
    assert out.chunks["ev"] == (0,)
    assert out.sizes["ev"] == 0 and out.pos.shape == (0, 3)


def test_in_memory_dataset():
    ds = events(1025, seed=5)
    mask = mask_of(ds)
    out = ds.compact.where(COND, indices="i")
    xr.testing.assert_identical(out.drop_vars("i"), reference(ds, mask))
    assert all(not isinstance(v.data, da.Array) for v in out.variables.values())
    np.testing.assert_array_equal(out.i.values, np.flatnonzero(mask))
    with pytest.raises(ValueError, match="chunks="):
        ds.compact.where(COND, chunks=10)


def test_chunks_rebalance():
    ds = events(1000)
    out = ds.chunk(event=100).compact.where(COND, dim="event", chunks=64)
    assert set(out.chunks["event"][:-1]) == {64}
    check_same(out, reference(ds, mask_of(ds)))


def test_matches_xarray_where_drop():
    """What xarray users write: ds.where(cond, drop=True), with the condition computed first
    (xarray refuses a dask one). It turns integers and booleans into floats and broadcasts
    variables without the dimension against the condition; the values agree elsewhere."""
    ds = events(500, seed=9)
    d = ds.chunk(event=64)
    cond = ((d.energy > 5) & (abs(d.eta) < 2.5)).compute()
    theirs = d.where(cond, drop=True).compute()
    ours = d.compact.where(COND).compute()
    assert ours.sizes["event"] == theirs.sizes["event"] == int(cond.sum())
    for name in ("energy", "eta", "nhit", "flag", "hits", "img"):
        np.testing.assert_array_equal(ours[name].values.astype(float),
                                      theirs[name].transpose(*ours[name].dims).values)
    assert theirs.nhit.dtype == np.float64 and ours.nhit.dtype == np.int32
    assert "event" in theirs.calib.dims and "event" not in ours.calib.dims
    xr.testing.assert_identical(ours.coords.to_dataset(), theirs.coords.to_dataset())


def test_dataarray():
    ds = events(77)
    arr = ds.energy.chunk(event=10)
    mask = ds.energy.values > 5
    ref = ds.energy.isel(event=np.flatnonzero(mask))
    for cond in ("x > 5", "energy > 5", lambda x: x > 5, lambda energy: energy > 5):
        out = arr.compact.where(cond)
        xr.testing.assert_identical(out.compute(), ref)
        assert out.chunks is not None and not np.isnan(out.shape[0])
    two_d = ds.img.chunk(event=10)  # (layer, event); cond on the coordinate along event
    out = two_d.compact.where("run < 3", dim="event", indices="row")
    xr.testing.assert_identical(out.compute().drop_vars("row"),
                                ds.img.isel(event=np.flatnonzero(ds.run.values < 3)))
    unnamed = xr.DataArray(np.arange(10.0), dims="x").chunk(x=3)
    np.testing.assert_array_equal(unnamed.compact.where("x > 6").values, [7.0, 8.0, 9.0])


def test_errors():
    d = events(50).chunk(event=10)
    with pytest.raises(ValueError, match="not a dimension"):
        d.compact.where(COND, dim="nope")
    with pytest.raises(ValueError, match="1-D along 'event'"):
        d.compact.where("(energy > 5) & (calib > 0)", dim="event")  # calib has no event dim
    with pytest.raises(ValueError, match="share no dimension"):
        d.compact.where("(energy > 5) & (calib > 0)")
    with pytest.raises(ValueError, match="1-D along 'event'"):
        d.compact.where("hits > 3", dim="event")  # 2-D
    with pytest.raises(ValueError, match="share 'event', 'layer'"):
        d.compact.where("hits > 3")
    with pytest.raises(ValueError):
        d.compact.where("energy > missing", dim="event")
    with pytest.raises(ValueError):
        d.compact.where(lambda energy, missing: energy > 1, dim="event")
    with pytest.raises(TypeError, match="boolean"):
        d.compact.where("energy * 2", dim="event")
    with pytest.raises(ValueError, match="indices="):
        d.compact.where(COND, indices="energy")
    with pytest.raises(TypeError):
        d.compact.where(COND, dim="event", lazy=True)  # xarray cannot hold unknown lengths
    # a Dataset is no condition; a mask DataArray must be boolean, 1-D along dim, aligned
    with pytest.raises(TypeError, match=r"Dataset; compact.where takes .*boolean DataArray"):
        d.compact.where((d.energy > 5).to_dataset(), dim="event")
    with pytest.raises(TypeError, match="dtype float64; compact.where takes a boolean one"):
        d.compact.where(d.energy)
    with pytest.raises(ValueError, match=r"dimensions \('event', 'layer'\)"):
        d.compact.where(d.hits > 3)
    with pytest.raises(ValueError, match="1-D along 'layer'"):
        d.compact.where(d.energy > 5, dim="layer")
    with pytest.raises(ValueError, match="49 rows along 'event', the Dataset 50"):
        d.compact.where((d.energy > 5).isel(event=slice(1, None)).drop_vars("event"))
    with pytest.raises(ValueError, match="index along 'event' differs"):
        d.compact.where((d.energy > 5).assign_coords(event=d.event.values[::-1]))
    with pytest.raises(ValueError, match="index along 'event' differs"):
        d.energy.compact.where((d.energy > 5).assign_coords(event=d.event.values + 1))
    missing = xr.DataArray(np.ones(50, bool), dims="row")
    with pytest.raises(ValueError, match="'row', which is not a dimension"):
        d.compact.where(missing)


@pytest.mark.parametrize("lazy", [True, False], ids=["dask-mask", "computed-mask"])
@pytest.mark.parametrize("n", [0, 1, 33, 1025])
def test_boolean_dataarray_condition(n, lazy):
    """ds.where(cond, drop=True)'s condition, a boolean DataArray: the same rows as isel, the
    mask itself not in the result, dtypes kept; on the DataArray accessor too."""
    ds = events(n, seed=n + 1)
    d = ds.chunk(event=max(7, n // 8))
    cond = (d.energy > 5) & (abs(d.eta) < 2.5)
    if not lazy:
        cond = cond.compute()
    mask = mask_of(ds)
    out = d.compact.where(cond, indices="cond")  # the mask's own name must not clash
    np.testing.assert_array_equal(out.cond.values, np.flatnonzero(mask))
    check_same(out.drop_vars("cond"), reference(d, mask))
    assert isinstance(out.energy.data, da.Array)
    img = d.img.compact.where(cond)
    xr.testing.assert_identical(img.compute(), ds.img.isel(event=np.flatnonzero(mask)))
    # an in-memory Dataset with a computed mask stays in memory
    mem = ds.compact.where(cond.compute())
    check_same(mem, reference(ds, mask))
    assert isinstance(mem.energy.data, np.ndarray)


def test_lazy_mask_is_computed_in_the_compacting_pass():
    """A mask built from the Dataset's own dask variables is evaluated in the pass that
    compacts: each energy chunk is made once (counted by a map_blocks that logs its calls)."""
    calls = []

    def count(block, block_info=None):
        calls.append(block_info[0]["chunk-location"])
        return block

    ds = events(200, seed=5)
    d = ds.chunk(event=50)
    d["energy"] = d.energy.copy(data=d.energy.data.map_blocks(count, dtype=float))
    out = d.compact.where(d.energy > 5)
    check_same(out, reference(ds, ds.energy.values > 5))
    assert sorted(calls) == [(i,) for i in range(4)], calls


def test_import_order_and_no_eager_xarray_import():
    """import dask_compact imports neither xarray nor the accessor; the accessor is there
    whichever of dask_compact and xarray is imported first."""
    code = (
        "import sys, dask_compact\n"
        "assert 'xarray' not in sys.modules and 'dask_compact.xarray_accessor' not in "
        "sys.modules\n"
        "import xarray as xr\n"
        "assert xr.Dataset.compact.__name__ == 'CompactDatasetAccessor'\n"
        "assert xr.DataArray.compact.__name__ == 'CompactDataArrayAccessor'\n"
        "import xarray, dask.array as da; assert hasattr(da.Array, 'map_compact')\n"
    )
    other_order = (
        "import xarray as xr, dask_compact\n"
        "assert xr.Dataset.compact.__name__ == 'CompactDatasetAccessor'\n"
        "import dask.array as da; assert hasattr(da.Array, 'map_compact')\n"
    )
    for c in (code, other_order):
        subprocess.run([sys.executable, "-W", "error", "-c", c], check=True)


def test_registration_does_not_clobber(monkeypatch):
    class Theirs:
        def __init__(self, obj):
            self.obj = obj

    monkeypatch.setattr(xr.Dataset, "compact", Theirs)
    with pytest.warns(RuntimeWarning, match="already defined"):
        xarray_accessor.register()
    assert xr.Dataset.compact is Theirs
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        xarray_accessor.register()  # our own accessor again: quiet
    assert xr.Dataset.compact is xarray_accessor.CompactDatasetAccessor
    assert dask_compact.compact_records  # the function the accessor calls


def test_docstring_examples():
    failures, tried = doctest.testmod(xarray_accessor, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried > 0
    assert failures == 0


def test_one_selected_event_stays_one_event_in_arithmetic():
    # a one-row result over several chunks had chunks (0, 1, 0): Dask broadcast it, and
    # ``out.energy * 2`` gave three values
    e = np.array([1.0, 7.0, 2.0, 3.0, 1.0, 2.0])
    ds = xr.Dataset({"energy": ("event", e), "id": ("event", np.arange(6))}).chunk(event=2)
    out = ds.compact.where("energy > 5")
    assert out.energy.data.numblocks == (1,)
    np.testing.assert_array_equal((out.energy * 2).values, [14.0])
    np.testing.assert_array_equal((out.id + out.energy).values, [8.0])


@pytest.mark.parametrize("chunked", [True, False])
def test_dataarray_named_like_its_dimension(chunked):
    """An array named like its dimension, without a coordinate of it: its one-variable
    Dataset made it that dimension's index coordinate, so the result came with a coordinate
    ``t`` and NumPy data, and a mask condition raised xarray's MergeError."""
    a = xr.DataArray(np.arange(6.0), dims="t", name="t", attrs={"u": "s"})
    if chunked:
        a = a.chunk(t=2)
    ref = a.isel(t=np.flatnonzero(a.values > 2))
    for cond in ("t > 2", "x > 2", lambda t: t > 2, a > 2, (a > 2).compute()):
        out = a.compact.where(cond)
        xr.testing.assert_identical(out.compute(), ref.compute())
        assert isinstance(out.data, da.Array) == chunked
        assert out.chunks is None or not np.isnan(out.shape[0])


def test_dataarray_indices_may_take_the_name_x():
    """indices= on an unnamed array: 'x' is the name cond reads it by, not a variable of
    the user's, so it names the positions' coordinate as any other new name does."""
    a = xr.DataArray(np.arange(6.0), dims="t").chunk(t=2)
    out = a.compact.where("x > 2", indices="x")
    np.testing.assert_array_equal(out.x.values, [3, 4, 5])
    xr.testing.assert_identical(out.compute().drop_vars("x"), a.isel(t=[3, 4, 5]).compute())
    named = a.rename("v").assign_coords(c=("t", np.arange(6)))
    for taken in ("v", "c"):
        with pytest.raises(ValueError, match=f"indices=.*not '{taken}'"):
            named.compact.where("v > 2", indices=taken)


def test_a_mask_that_is_no_dataarray_is_refused_naming_cond():
    """A NumPy, dask, pandas or list mask: the message named compact_records' ``pred`` and
    none of the forms the accessor takes; it names ``cond`` and says how to wrap a mask."""
    import pandas as pd

    d = events(20).chunk(event=5)
    m = np.arange(20) > 3
    for cond in (m, da.from_array(m, chunks=5), list(m), pd.Series(m)):
        with pytest.raises(TypeError, match=r"cond is a .*boolean DataArray.*"
                                            r"xr.DataArray\(mask, dims='event'\)"):
            d.compact.where(cond, "event")
        with pytest.raises(TypeError, match="cond is a"):
            d.energy.compact.where(cond)


def test_empty_selection_with_an_object_variable_has_one_chunking():
    """Nothing selected: the compacted variables had one empty chunk per input chunk and the
    object one (isel route) one, so Dataset.chunks raised; all now have isel's (0,)."""
    ds = xr.Dataset({"e": ("event", np.arange(6.0)), "k": (("event", "x"), np.ones((6, 2))),
                     "o": ("event", np.array(list("abcdef"), dtype=object))}).chunk(event=2)
    out = ds.compact.where("e > 100", "event", indices="row")
    assert dict(out.chunks) == {"event": (0,), "x": (2,)}
    assert out.row.chunks == ((0,),)
    xr.testing.assert_identical(out.drop_vars("row").compute(), ds.isel(event=[]).compute())


def test_chunks_along_the_other_dimensions_are_kept():
    """compact_records puts a field's trailing axes in one chunk: a variable chunked along
    another dimension came back merged there (isel keeps those chunks, and a variable
    without the dimension kept its own, so Dataset.chunks raised). Each column of blocks
    is now a field of its own: the blocks stay as large as they were."""
    ds = xr.Dataset({"e": ("event", np.arange(8.0)),
                     "xe": (("x", "event"), np.arange(32.0).reshape(4, 8)),
                     "exy": (("event", "x", "y"), np.arange(96).reshape(8, 4, 3)),
                     "nox": ("x", np.arange(4.0))}).chunk(event=4, x=2, y=2)
    keep = np.flatnonzero(np.arange(8.0) > 2)
    for chunks in (None, 2):
        out = ds.compact.where("e > 2", "event", chunks=chunks)
        xr.testing.assert_identical(out.compute(), ds.isel(event=keep).compute())
        assert out.chunks["x"] == (2, 2) and out.chunks["y"] == (2, 1)
        assert out.xe.chunks[0] == (2, 2) and out.exy.chunks[1:] == ((2, 2), (2, 1))
        assert max(out.exy.data.chunksize) <= 4


def test_in_memory_dataset_with_a_dask_mask_comes_back_in_memory():
    """A lazy condition on an in-memory Dataset: the mask was the lead field, so every
    variable came back as a dask array; isel of an in-memory Dataset gives NumPy."""
    ds = events(60, seed=2)
    cond = ((ds.energy > 5) & (abs(ds.eta) < 2.5)).chunk(event=16)
    out = ds.compact.where(cond)
    xr.testing.assert_identical(out, reference(ds, mask_of(ds)))
    assert all(not isinstance(v.data, da.Array) for v in out.variables.values())
    with pytest.raises(ValueError, match=r"in memory.*leave chunks= out.*chunk"):
        ds.compact.where(cond, chunks=10)


def test_chunks_on_an_in_memory_dataset_is_worded_for_the_accessor():
    """chunks= with an in-memory Dataset: the message spoke of compact_records' lazy=, which
    the accessor does not have."""
    with pytest.raises(ValueError, match="chunks=") as e:
        events(20).compact.where(COND, chunks=5)
    assert "lazy=" not in str(e.value) and "ds.chunk(" in str(e.value)


def test_encodings_kept_off_the_dimension_only():
    """The encodings of variables along dim describe the input's chunks (to_zarr would hold
    the new chunks to them): those keys are dropped, the rest kept (see the next test). The
    others, and the Dataset's, were dropped too where isel keeps them; they are kept now."""
    ds = xr.Dataset({"e": ("event", np.arange(8.0)), "calib": ("x", np.arange(3.0))})
    ds.e.encoding = {"chunks": (4,), "dtype": "float32"}
    ds.calib.encoding = {"chunks": (3,), "dtype": "float32"}
    ds.encoding = {"unlimited_dims": {"event"}}
    for d in (ds, ds.chunk(event=4)):
        out = d.compact.where("e > 2", "event")
        ref = d.isel(event=np.flatnonzero(ds.e.values > 2))
        xr.testing.assert_identical(out.compute(), ref.compute())
        assert out.e.encoding == {"dtype": "float32"}
        assert out.calib.encoding == ref.calib.encoding
        assert out.encoding == ref.encoding == {"unlimited_dims": {"event"}}
    assert ds.e.encoding == {"chunks": (4,), "dtype": "float32"}  # the input's untouched


def test_encodings_along_dim_keep_all_but_the_chunk_layout(tmp_path):
    """The encodings of variables along dim lost their CF packing, fill value and time units
    with their chunks (until 2026-12-01, fifteenth session; an xarray probe): a packed int16
    variable opened from Zarr, compacted and written back was stored as float64 without its
    scale_factor, -9999 fill value or time units. Only the keys that describe the input's
    chunk layout go; the rest is isel's, and the store written back is packed as the input."""
    pytest.importorskip("zarr")
    rng = np.random.default_rng(0)
    n = 50
    src = xr.Dataset(
        {"packed": ("time", rng.random(n) * 100), "t": ("time", rng.random(n) * 40 + 250),
         "obs": ("time", np.datetime64("2022-01-01", "ns") + np.arange(n) * 60_000_000_000)},
        coords={"time": np.arange(n)})
    src.packed.encoding = {"dtype": "int16", "scale_factor": 0.01, "add_offset": 0.0,
                           "_FillValue": -9999}
    src.t.encoding = {"_FillValue": -1e20}
    src.obs.encoding = {"units": "seconds since 2000-01-01", "dtype": "int64"}
    src.chunk(time=16).to_zarr(tmp_path / "in.zarr", consolidated=False)
    layout = {"chunks", "preferred_chunks", "shards", "chunksizes", "original_shape"}
    for chunks in ({}, None):
        ds = xr.open_zarr(tmp_path / "in.zarr", chunks=chunks, consolidated=False)
        m = ds.t.values > 270
        ref = ds.compute().isel(time=np.flatnonzero(m))
        out = ds.compact.where("t > 270", chunks=16 if chunks == {} else None)
        xr.testing.assert_identical(out.compute(), ref)
        for name in ("packed", "t", "obs", "time"):
            want = {k: v for k, v in ref[name].encoding.items() if k not in layout}
            assert out[name].encoding == want, name
            assert not layout & set(out[name].encoding), name
        path = tmp_path / f"out{chunks is None}.zarr"
        out.to_zarr(path, consolidated=False)
        xr.testing.assert_identical(xr.open_zarr(path, consolidated=False).compute(), ref)
        raw = xr.open_zarr(path, consolidated=False, decode_cf=False)
        assert raw.packed.dtype == np.int16 and raw.packed.attrs["scale_factor"] == 0.01
        assert raw.packed.attrs["_FillValue"] == -9999 and raw.t.attrs["_FillValue"] == -1e20
        assert raw.obs.attrs["units"] == "seconds since 2000-01-01"
    assert "chunks" in ds.packed.encoding  # the input's untouched


def test_a_dataarray_keeps_its_encoding_but_the_chunk_layout():
    """arr.compact.where lost the array's whole encoding (DataArray(variable) leaves it
    behind; until 2026-12-01, fifteenth session): kept as isel keeps it, less its chunks."""
    arr = xr.DataArray(np.arange(10), dims="e", name="v", coords={"e": np.arange(10) * 2})
    arr.encoding = {"dtype": "int16", "chunks": (4,), "scale_factor": 0.5}
    for a in (arr, arr.chunk(e=3)):
        out = a.compact.where("v > 3")
        xr.testing.assert_identical(out.compute(), arr.isel(e=np.arange(4, 10)))
        assert out.encoding == {"dtype": "int16", "scale_factor": 0.5}
    assert arr.encoding["chunks"] == (4,)


def test_rebalanced_result_writes_to_zarr(tmp_path):
    """What the README and docstring say: chunks= gives uniform chunks, which to_zarr takes
    (without it, chunks like (1, 3, 2) are refused by xarray's to_zarr)."""
    pytest.importorskip("zarr")
    ds = xr.Dataset({"e": ("event", np.arange(8.0))}).chunk(event=3)
    out = ds.compact.where("e > 1", "event", chunks=3)
    out.to_zarr(tmp_path / "out.zarr", consolidated=False)
    xr.testing.assert_identical(xr.open_zarr(tmp_path / "out.zarr", consolidated=False).compute(),
                                ds.isel(event=np.arange(2, 8)).compute())


def test_a_sparse_cond_is_refused_in_the_callers_words():
    """A cond computed from a sparse variable was refused as "compact_records (field
    'cond')", a call and a name the caller never gave (a new-user probe): refused as
    compact.where's cond, with a conversion that works."""
    sparse = pytest.importorskip("sparse")
    rng = np.random.default_rng(23)
    e, s = rng.random(41), rng.random((41, 3))
    s[s < 0.7] = 0
    ds = xr.Dataset({"energy": ("event", da.from_array(e, chunks=10)),
                     "s": (("event", "k"), da.from_array(sparse.COO.from_numpy(s),
                                                         chunks=(10, 3), asarray=False))})
    with pytest.raises(TypeError, match=r"^compact.where \(cond\) compacts NumPy or CuPy "
                                        r"chunks, not sparse\..*COO; .*todense\(\)"):
        ds.compact.where(ds.s[:, 0] > 0.5, dim="event")


@pytest.mark.parametrize("chunked", [False, True], ids=["in-memory", "dask"])
def test_cond_may_read_a_variable_named_indices(chunked):
    """A variable named ``indices``, the key compact_records returns the row positions under,
    read by cond where the positions are wanted too (an index coordinate along dim, or
    ``indices=``): refused until 2026-12-01 (a record probe) with "rename it first"; now
    the positions come back under a key of their own."""
    ds = events(41, seed=3).assign(indices=("event", np.arange(41) * 3))
    d = ds.chunk(event=8) if chunked else ds
    mask = (ds["indices"].values > 40) & (ds.energy.values > 3)
    want = reference(ds, mask)
    check_same(d.compact.where("(indices > 40) & (energy > 3)"), want)
    out = d.compact.where(lambda indices, energy: (indices > 40) & (energy > 3), indices="row")
    np.testing.assert_array_equal(out.row.values, np.flatnonzero(mask))
    check_same(out.drop_vars("row"), want)
    arr = d["indices"].compact.where("indices > 40", indices="row")
    xr.testing.assert_identical(
        arr.compute().drop_vars("row"),
        ds["indices"].isel(event=np.flatnonzero(ds["indices"].values > 40)))
    np.testing.assert_array_equal(arr.row.values, np.flatnonzero(ds["indices"].values > 40))


@pytest.mark.parametrize("chunked", [False, True], ids=["in-memory", "dask"])
def test_a_variable_with_dim_twice_is_indexed_as_isel_does(chunked):
    """A variable with ``dim`` on two axes (a (t, t) matrix, which xarray holds with a
    warning and isel indexes along both) made a field of rows whose trailing axis kept every
    column, and the call failed in xarray's Variable ("dimensions ('t',) must have the same
    length ...", a record probe of 2026-12-01); it takes the isel route now."""
    rng = np.random.default_rng(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xarray's warning of the duplicate dimension
        ds = xr.Dataset({"a": ("t", rng.standard_normal(19)),
                         "sq": (("t", "t"), np.arange(19 * 19).reshape(19, 19))})
        d = ds.chunk(t=5) if chunked else ds
        mask = ds.a.values > 0
        out = d.compact.where("a > 0")
        xr.testing.assert_identical(out.compute(), ds.isel(t=np.flatnonzero(mask)))


def test_a_cond_reading_times_says_the_mask_form_works():
    """A string or callable cond reading a datetime64 variable is refused (the compiled
    predicates compare numbers); the refusal had named map_compact and the gathered fields
    of compact_records (a record probe, 2026-12-01), not what works here: the condition as a
    boolean DataArray, which the same call evaluates chunk by chunk."""
    n = 40
    when = np.datetime64("2020-01-01T00", "ns") + np.arange(n).astype("m8[h]")
    when[::7] = np.datetime64("NaT")
    ds = xr.Dataset({"when": ("event", when), "e": ("event", np.arange(n) * 1.5)})
    d = ds.chunk(event=9)
    for cond in ("when > 0", lambda when: when > 0):
        with pytest.raises(TypeError, match=r"'when', of dtype datetime64\[ns\].*"
                           r"ds.compact.where\(ds\['when'\] > "):
            d.compact.where(cond)
    cut = np.datetime64("2020-01-02T00", "ns")
    out = d.compact.where(d["when"] > cut)
    xr.testing.assert_identical(out.compute(), ds.isel(event=np.flatnonzero(when > cut)))


@pytest.mark.parametrize("chunked", [False, True], ids=["in-memory", "dask"])
def test_a_cond_reading_strings_or_objects_says_the_mask_form_works(chunked):
    """A string or callable cond reading a variable of objects was refused as "field 'o'
    has dtype object" (no call, a field; NumPy's StringDType likewise, "field 'vs' has dtype
    StringDType()"), and one of strings, bytes or a structured dtype
    as "the predicate reads 's': dask_compact compacts arrays of ...", the structured one
    pointed to compact_records (until 2026-12-01, fifteenth session; an xarray probe). Each
    says now what works: the condition as a boolean DataArray, which gives isel's rows."""
    n = 12
    ds = xr.Dataset({
        "o": ("ev", np.array([None, "a"] * (n // 2), dtype=object)),
        "s": ("ev", np.array(["x", "yy", "z"] * (n // 3))),
        "b": ("ev", np.array([b"x", b"y"] * (n // 2))),
        "st": ("ev", np.zeros(n, dtype=[("p", "f4"), ("q", "i4")])),
        "vs": ("ev", np.array(["x", "yy"] * (n // 2), dtype=np.dtypes.StringDType())),
        "e": ("ev", np.arange(n) * 1.0)})
    d = ds.chunk(ev=5) if chunked else ds
    for name in ("o", "s", "b", "st", "vs"):
        for cond in (f"{name} > 1", f"isnan({name})", eval(f"lambda {name}: {name} > 1")):
            with pytest.raises(TypeError, match=rf"^ds.compact.where: cond reads {name!r}, of "
                               rf"dtype .*ds.compact.where\(ds\[{name!r}\] == ") as e:
                d.compact.where(cond)
            assert not re.search("field|compact_records|predicate", str(e.value)), e.value
    for mask, want in ((d.s == "yy", ds.s.values == "yy"), (d.b == b"x", ds.b.values == b"x"),
                       (d.o == None, ds.o.values == None),  # noqa: E711 - xarray's == None
                       (d.vs == "x", ds.vs.values == "x")):
        xr.testing.assert_identical(d.compact.where(mask).compute(),
                                    ds.isel(ev=np.flatnonzero(want)))


def test_a_cond_reading_no_1d_variables_is_not_told_to_pass_dim():
    """A cond reading a 2-D variable, or variables along different dimensions, without dim=
    was told "pass dim= to say which dimension to compact", which then refused it as not 1-D
    (until 2026-12-01, fifteenth session; an xarray probe): it says what is wrong at once."""
    d = events(20).chunk(event=10)
    for cond, said in (("hits > 3", r"'hits' \('event', 'layer'\)"),
                       ("(energy > 5) & (calib > 0)", r"'calib' \('layer',\)")):
        with pytest.raises(ValueError, match="1-D along the dimension to compact") as e:
            d.compact.where(cond)
        assert re.search(said, str(e.value)) and "pass dim=" not in str(e.value)
    with pytest.raises(ValueError, match=r"\(ds\['hits'\] > 0\)\.any\(OTHER_DIM\)"):
        d.compact.where("hits > 3")
    arr = xr.DataArray(np.ones((2, 3)), dims=("t", "e"), name="v")
    with pytest.raises(ValueError, match=r"arr.compact.where\(\(arr > 0\)\.any") as e:
        arr.compact.where("v > 0")
    assert "pass dim=" not in str(e.value) and "1-D along the dimension" in str(e.value)


def test_a_cond_on_pandas_nullable_columns_says_what_works():
    """A Dataset from a DataFrame holds nullable columns as pandas extension arrays. A cond
    reading one was refused as "compact_records (field 'k') takes arrays, not a pandas
    IntegerArray", a call and a name the caller never gave, and the mask ds.k > 2 (pandas'
    nullable boolean) as "cond is a DataArray of dtype boolean; compact.where takes a
    boolean one" (until 2026-12-01, fifteenth session; an xarray probe). Both say what
    the column is and the conversion that works, which gives isel's rows."""
    pd = pytest.importorskip("pandas")
    k = pd.array([4, 1, 0, None, 3, 2, 5], dtype="Int64")
    df = pd.DataFrame({"e": np.arange(7.0), "k": k}, index=pd.Index(np.arange(7) * 10, name="ev"))
    ds = xr.Dataset.from_dataframe(df)
    with pytest.raises(TypeError, match=r"^ds.compact.where: cond reads 'k', a pandas Int64 "
                                        r"array.*ds\['k'\]\.astype\('float64'\)") as e:
        ds.compact.where("k > 2")
    assert "compact_records" not in str(e.value)
    fixed = ds.assign(k=ds["k"].astype("float64"))
    xr.testing.assert_identical(fixed.compact.where("k > 2"), fixed.isel(ev=[0, 4, 6]))
    with pytest.raises(TypeError, match=r"pandas' nullable boolean.*\.fillna\(False\)"
                                        r"\.astype\(bool\)") as e:
        ds.compact.where(ds.k > 2)
    assert "takes a boolean one" not in str(e.value)
    out = ds.compact.where((ds.k > 2).fillna(False).astype(bool))
    xr.testing.assert_identical(out, ds.isel(ev=[0, 4, 6]))


def test_a_constant_cond_without_dim_is_refused_in_plain_words():
    """A cond reading no variable ("True", a constant) on a Dataset of several dimensions
    was refused as "the variables cond reads () share 'event', 'layer'" (a record probe,
    2026-12-01); it says that cond reads none and asks for dim=, which then works."""
    d = events(12).chunk(event=5)
    with pytest.raises(ValueError, match=r"cond reads no variable .*pass dim="):
        d.compact.where("True")
    check_same(d.compact.where("True", dim="event"), reference(d, np.ones(12, bool)))


@pytest.mark.parametrize("cond", ["string", "DataArray", "DataArray.compact"])
@pytest.mark.parametrize("actual, declared", [(5, 7), (9, 7), (0, 3)])
def test_a_variable_chunk_of_another_length_than_declared_is_refused_naming_it(cond, actual,
                                                                             declared):
    """A dask variable one of whose from_delayed chunks has 5 rows declared 7: the rows
    after it were taken 2 places off, their coordinates from the declared positions;
    refused now, naming the chunk and both lengths (until 2026-12-01, the eleventh
    session)."""
    from chunk_shape_helpers import misdeclared, refusal

    x = misdeclared(actual, declared)
    ds = xr.Dataset({"energy": ("event", x), "eta": ("event", x.astype(float) / 10)},
                    coords={"event": np.arange(x.shape[0])})
    with pytest.raises(ValueError, match=refusal(actual, declared)):
        if cond == "string":
            ds.compact.where("energy % 2 == 0", dim="event").compute()
        elif cond == "DataArray":
            ds.compact.where(ds.energy % 2 == 0, dim="event").compute()
        else:
            ds.energy.compact.where(ds.energy % 2 == 0, dim="event").compute()


def test_the_accessor_s_refusals_name_the_accessor_and_its_variables():
    """A chunk of another length than declared was refused as "compact_records: chunk 0 of
    field 'cond'" (the mask the caller passed, under a call and a name the caller never
    gave), and a refused cond in the words of a record predicate and its fields, until
    2026-12-01 (the eleventh session's probes). They name ds.compact.where (or
    arr.compact.where), cond and the variables now."""
    from chunk_shape_helpers import misdeclared

    x = misdeclared(5, 7)  # chunk 1 holds 5 rows, declared 7
    ds = xr.Dataset({"energy": ("event", x), "eta": ("event", x.astype(float) / 10)})
    cases = (
        (lambda: ds.compact.where(ds.energy % 2 == 0, dim="event"),
         "ds.compact.where: chunk 1 of cond has length 5"),
        (lambda: ds.energy.compact.where(ds.energy % 2 == 0, dim="event"),
         "arr.compact.where: chunk 1 of cond has length 5"),
        (lambda: ds.compact.where("eta > 0.1", dim="event"),
         "ds.compact.where: chunk 1 of variable 'eta' has length 5"),
        (lambda: ds.energy.compact.where("x > 1", dim="event"),
         "arr.compact.where: chunk 1 of the DataArray has length 5"),
    )
    for call, said in cases:
        with pytest.raises(ValueError, match=re.escape(said)) as refused:
            call().compute()
        assert "compact_records" not in str(refused.value)
        assert "field" not in str(refused.value)
    d = events(50)
    for cond, said in (
        (lambda energy: energy > energy.mean(),
         "ds.compact.where: `mean` of the variable 'energy' is a reduction: inside cond"),
        (lambda energy: np.cumsum(energy) > 1,
         "e.g. ds.compact.where(ds['energy'].cumsum(dim) > 0)"),
        (lambda nope: nope > 1, "ds.compact.where: cond takes 'nope', which is not a variable"),
        ("nope > 1", "the name 'nope' is not allowed (the variables are "),
        (lambda energy: energy + 1, "ds.compact.where: predicate"),
    ):
        with pytest.raises((ValueError, TypeError), match=re.escape(said)) as refused:
            d.compact.where(cond, dim="event")
        assert "field" not in str(refused.value) and "record" not in str(refused.value)


def test_a_variable_named_true_and_a_constant_cond_are_refused_in_the_accessor_s_words():
    """A cond reading a variable named True ("never the field named 'True'; rename that
    field"), a constant cond of numbers ("for no field (a constant)") and a callable taking
    values by position, np.isnan ("fields are passed by name"), spoke of fields (until
    2026-12-01, fifteenth session; an xarray probe)."""
    ds = xr.Dataset({"True": ("ev", np.arange(5.0)), "a": ("ev", np.arange(5.0))})
    for cond, said in (("True > 3", "never the variable named 'True'; rename that variable"),
                       ("1 + 1", "for no variable (a constant)"),
                       (lambda: 2.0, "for no variable (a constant)"),
                       (np.isnan, "positional-only; variables are passed by name")):
        with pytest.raises((ValueError, TypeError), match=re.escape(said)) as refused:
            ds.compact.where(cond, dim="ev")
        assert "field" not in str(refused.value)
    out = ds.compact.where(ds["True"] > 3)  # the form the refusal names
    xr.testing.assert_identical(out, ds.isel(ev=[4]))


def test_an_unknown_length_is_refused_in_the_accessor_s_words():
    """A dask array indexed by a dask mask (unknown chunk sizes) in a Dataset, or as the
    mask, was refused as "field(s) y have unknown chunk sizes" (compact_records' words) or
    "cond has nan rows along 'e', the Dataset nan" (until 2026-12-01, fifteenth session; an
    xarray probe): the accessor says which and what works."""
    x = da.from_array(np.arange(10.0), chunks=3)
    y = x[x > 2]
    ds = xr.Dataset({"y": ("e", y)})
    full = xr.Dataset({"a": ("e", x)})
    for call, said in (
            (lambda: ds.compact.where("y > 5"), "ds.compact.where: variable 'y' has an "),
            (lambda: ds.compact.where(ds.y > 5), "ds.compact.where: variable 'y' has an "),
            (lambda: full.compact.where(xr.DataArray(y > 5, dims="e")),
             "ds.compact.where: cond has an "),
            (lambda: ds.y.compact.where("y > 5"), "arr.compact.where: the DataArray has an ")):
        with pytest.raises(ValueError, match=re.escape(said) + "unknown length along 'e'.*"
                           "compute_chunk_sizes") as refused:
            call()
        assert "field" not in str(refused.value) and "nan" not in str(refused.value)
    # a variable of unknown length along another dimension is kept as it is, as by isel
    other = full.assign(y=("other", y))
    out = other.compact.where("a > 2")
    np.testing.assert_array_equal(out.y.values, np.arange(3.0, 10.0))
    np.testing.assert_array_equal(out.a.values, np.arange(3.0, 10.0))
    y.compute_chunk_sizes()  # what the refusal says
    out = xr.Dataset({"y": ("e", y)}).compact.where("y > 5")
    np.testing.assert_array_equal(out.y.values, np.arange(6.0, 10.0))


def test_a_list_of_dims_is_refused_plainly():
    """dim=["event"] (the list xarray's reductions take) failed as "unhashable type:
    'list'" (until 2026-12-01, fifteenth session; an xarray probe)."""
    d = events(10)
    for cond in (COND, d.energy > 5):
        with pytest.raises(TypeError, match=r"dim= names the one dimension to compact .*not "
                                            r"a list \(\['event'\]\)"):
            d.compact.where(cond, dim=["event"])
    with pytest.raises(TypeError, match=r"arr.compact.where compacts along one dimension"):
        d.energy.compact.where("x > 5", dim=["event"])


def test_indices_naming_another_dimension_is_refused():
    """indices="layer" (another dimension's name) came back as a coordinate layer (event)
    beside the layer dimension (until 2026-12-01, fifteenth session; an xarray probe):
    refused. The compacted dimension's own name (without an index) is taken."""
    ds = xr.Dataset({"a": ("ev", np.arange(6.0)), "img": (("ev", "layer"), np.ones((6, 2)))})
    for d in (ds, ds.chunk(ev=4)):
        for call in (lambda: d.compact.where("a > 2", indices="layer"),
                     lambda: d.img.compact.where(d.a > 2, indices="layer"),
                     lambda: d.img.assign_coords(lab=d.a).compact.where("lab > 2",
                                                                        indices="layer")):
            with pytest.raises(ValueError, match="not 'layer', which is another dimension"):
                call()
        out = d.compact.where("a > 2", indices="ev")
        np.testing.assert_array_equal(out.ev.values, [3, 4, 5])
        out = d.img.compact.where(d.a > 2, indices="ev")
        np.testing.assert_array_equal(out.ev.values, [3, 4, 5])


def test_an_empty_indices_name_is_refused():
    """indices="" added a coordinate named "" (a new-user probe), which xarray keeps but no
    attribute, to_zarr or netCDF writer takes: refused as a name already taken is."""
    ds = xr.Dataset({"a": ("ev", np.arange(6.0))})
    for d in (ds, ds.chunk(ev=4)):
        for call in (lambda: d.compact.where("a > 2", indices=""),
                     lambda: d.a.compact.where("x > 2", indices="")):
            with pytest.raises(ValueError, match="indices= names the coordinate .* not ''$"):
                call()


def test_a_reduction_per_row_is_told_the_condition_that_works():
    """``np.sum(v, axis=1)`` over a variable of two dimensions is refused as a reduction; the
    advice, in the accessor's words (thirteenth session), is a condition on the row sums,
    which run gives NumPy's selection."""
    rng = np.random.default_rng(31)
    ds = xr.Dataset({"e": ("event", rng.random(41)), "v": (("event", "k"), rng.random((41, 3)))})
    with pytest.raises(ValueError, match=re.escape("ds.compact.where(ds['v'].sum(OTHER_DIM)")) \
            as refused:
        ds.compact.where(lambda e, v: np.sum(v, axis=1) > e, dim="event")
    assert "field" not in str(refused.value) and "compact_records" not in str(refused.value)
    got = ds.compact.where(ds["v"].sum("k") > ds["e"], dim="event")
    keep = ds["v"].values.sum(axis=1) > ds["e"].values
    np.testing.assert_array_equal(got["v"].values, ds["v"].values[keep])


@pytest.mark.parametrize("chunked", [False, True])
def test_a_closure_over_a_row_mask_is_told_the_accessor_s_way_out(chunked):
    """A cond reading a mask of all the rows from outside (``lambda e: mask & (e > t)``,
    ``lambda e: mask``) was told the records' way out, ``compact_records({**fields, "keep":
    mask}, "keep")``: a call the accessor's caller never made (a regression review,
    2026-12-01, fourteenth session: the thirteenth's advice, shared by the accessor). It is
    told to pass the mask as cond, a DataArray along the dimension, which gives NumPy's
    selection."""
    rng = np.random.default_rng(32)
    ds = xr.Dataset({"e": ("event", rng.random(101)), "w": ("event", rng.random(101))})
    if chunked:
        ds = ds.chunk({"event": 30})
    mask = rng.random(101) > 0.5
    for cond in (lambda e: mask & (e > 0.3), lambda e: mask):
        with pytest.raises(ValueError, match=re.escape(
                "xr.DataArray(mask, dims=dim)")) as refused:  # fmt: skip
            ds.compact.where(cond, dim="event")
        said = str(refused.value)
        assert "compact_records" not in said and "field" not in said, said
    got = ds.compact.where(xr.DataArray(mask, dims="event") & (ds["e"] > 0.3), dim="event")
    keep = mask & (ds["e"].values > 0.3)
    np.testing.assert_array_equal(np.asarray(got["w"].values), ds["w"].values[keep])


@pytest.mark.parametrize("dtype", ["datetime64[s]", "timedelta64[s]"])
@pytest.mark.parametrize("cond", ["t > 3", lambda t: t > 3])
def test_a_cond_reading_times_is_told_a_comparison_of_its_kind(dtype, cond):
    """A cond reading a timedelta variable was told to compare it with a datetime64,
    `ds['t'] > np.datetime64('2020-01-01')`, which NumPy refuses (a refusal probe,
    2026-12-02, sixteenth session): the example is of the variable's own kind, and, run as
    written, gives isel's rows."""
    hours = (np.arange(40) * 7 % 11 * 3600).astype("m8[s]")
    t = hours if dtype.startswith("timedelta") else np.datetime64("2019-12-31T18:00") + hours
    ds = xr.Dataset({"t": ("ev", t.astype(dtype)), "v": ("ev", np.arange(40.0))})
    with pytest.raises(TypeError, match="compares numbers, not times") as e:
        ds.compact.where(cond)
    (code,) = re.findall(r"ds\.compact\.where\(.*\)\)", str(e.value))
    got = eval(code, {"ds": ds, "np": np})
    pred = eval(code.replace("ds.compact.where(", "(", 1), {"ds": ds, "np": np})
    xr.testing.assert_identical(got, ds.isel(ev=np.flatnonzero(pred.values)))
    assert 0 < got.sizes["ev"] < 40


def _roots_reached(dsk) -> int:
    """Over a graph's leaves (tasks no other depends on), the number of its roots (tasks of
    no dependency in it) each reaches: the pairs ``dask.order`` walks (its roots' connected
    leaves), linear in the variables where phase 1 stands between the inputs and the
    outputs, quadratic where one graph leads every input chunk to every output chunk."""
    from dask.core import get_deps

    deps, dependents = get_deps(dsk)
    reached: dict = {}

    def roots(k):
        if k not in reached:
            inner = [d for d in deps.get(k, ()) if d in deps]
            reached[k] = frozenset().union(*map(roots, inner)) if inner else frozenset([k])
        return reached[k]

    for k in sorted(deps, key=str):  # dependencies first enough: the graphs are shallow
        roots(k)
    return sum(len(roots(k)) for k in deps if not dependents.get(k))


def test_the_graphs_dask_orders_grow_linearly_with_the_variables(monkeypatch):
    """300 variables of 20,000 rows in 4 chunks took 4.6-9.5 s (the fifteenth session; 1000
    variables 17 s on the 2-core machine), growing with the square of the variables: one
    graph held the inputs, phase 1 and one output per variable, and dask's ordering walks
    every input chunk's reachable output chunks (as did its culling, layer by layer, and a
    copy of the growing graph per output). Counted here, not timed: the root-to-leaf pairs of
    every graph dask orders during the call, 4 times the variables giving at most ~4 times
    the pairs (16 times until 2026-12-02, sixteenth session, issue 11); the result still
    isel's."""
    import dask
    import dask.local
    import dask.order

    pairs: list[int] = []
    real = dask.order.order

    def spy(dsk, *args, **kwargs):
        pairs.append(_roots_reached(dsk))
        return real(dsk, *args, **kwargs)

    monkeypatch.setattr(dask.order, "order", spy)
    monkeypatch.setattr(dask.local, "order", spy)
    rng = np.random.default_rng(11)

    def walked(n_vars: int) -> int:
        ds = xr.Dataset({f"v{i}": ("event", (rng.random(1000) * 100).astype(
            np.float32 if i % 2 else np.int32)) for i in range(n_vars)},
            coords={"event": np.arange(1000) + 7}).chunk(event=250)
        pairs.clear()
        with dask.config.set(scheduler="threads"):
            out = ds.compact.where(ds.v0 > 50, dim="event")
        walked = sum(pairs)
        check_same(out, ds.compute().isel(event=np.flatnonzero(ds.v0.values > 50)))
        return walked

    small, large = walked(8), walked(32)
    assert 0 < small and large <= 5 * small, (small, large)


@pytest.mark.parametrize(("calendar", "where"), [
    ("noleap", "index"), ("360_day", "variable"), ("standard", "the DataArray"),
    ("noleap", "its coordinate")])
@pytest.mark.parametrize("form", ["string", "callable"])
def test_a_cond_reading_cftime_dates_is_told_a_comparison_with_one(calendar, where, form):
    """A string or callable cond reading cftime dates (xarray's use_cftime=True: object
    dtype, cftime.DatetimeNoLeap and the other calendars' classes) was told the generic
    `ds.compact.where(ds['time'] == value)` (until 2026-12-02, seventeenth session, the
    sixteenth's leftover), and an arr.compact.where call a ds form it has no ds for: each
    says now to compare with a date of the variable's calendar, as a boolean DataArray (the
    date in np.array: a dask array compares with no bare cftime date), and that advice, run
    as written on the dask-backed Dataset, gives isel's rows."""
    cftime = pytest.importorskip("cftime")
    n = 23
    t = xr.date_range("1999-12-20", periods=n, freq="D", calendar=calendar, use_cftime=True)
    # a data variable's dates, reversed: an example date of its first row, the latest,
    # selected no row (the middle row's is taken)
    when = np.asarray(t)[::-1]
    name = "when" if where in ("variable", "the DataArray") else "time"
    ds = xr.Dataset({"v": ("time", np.arange(n) * 1.5), "when": ("time", when)},
                    coords={"time": t}).chunk(time=5)
    subject = ds if where in ("index", "variable") else (
        ds["when"] if where == "the DataArray" else ds["v"])
    read = "x" if where == "the DataArray" else name
    cond = f"{read} > 3" if form == "string" else eval(f"lambda {read}: {read} > 3")
    with pytest.raises(TypeError, match="compares numbers, not times") as e:
        subject.compact.where(cond)
    said = str(e.value)
    call = "ds" if subject is ds else "arr"
    assert said.startswith(f"{call}.compact.where: cond reads {read!r}, of dtype object, "
                           f"cftime dates of calendar "), said
    assert "== value" not in said
    (code,) = re.findall(rf"{call}\.compact\.where\(.*\)\)", said)
    names = {"ds": ds, "arr": subject, "cftime": cftime, "np": np}
    got = eval(code, names)
    pred = eval(code.replace(f"{call}.compact.where(", "(", 1), names)
    xr.testing.assert_identical(got.compute(),
                                subject.isel(time=np.flatnonzero(pred.values)).compute())
    assert 0 < got.sizes["time"] < n


def test_a_cond_reading_objects_that_are_not_dates_keeps_the_equality_advice():
    """Next to the cftime advice (above): a variable of other objects (strings, None, Python
    dates, an empty one) keeps the `== value` advice, run as written with a value of its
    own."""
    import datetime

    n = 9
    ds = xr.Dataset({
        "o": ("ev", np.array(["a", None, "b"] * 3, dtype=object)),
        "d": ("ev", np.array([datetime.date(2000, 1, 1 + i) for i in range(n)], dtype=object)),
        "v": ("ev", np.arange(n) * 1.0)}).chunk(ev=4)
    for name, value in (("o", "'b'"), ("d", "datetime.date(2000, 1, 3)")):
        with pytest.raises(TypeError, match=rf"ds.compact.where\(ds\[{name!r}\] == value\)$"):
            ds.compact.where(f"{name} > 3")
        code = f"ds.compact.where(ds[{name!r}] == {value})"
        got = eval(code, {"ds": ds, "datetime": datetime})
        pred = eval(f"ds[{name!r}] == {value}", {"ds": ds, "datetime": datetime})
        xr.testing.assert_identical(got.compute(),
                                    ds.isel(ev=np.flatnonzero(pred.values)).compute())
    with pytest.raises(TypeError, match=r"ds.compact.where\(ds\['o'\] == value\)$"):
        ds.isel(ev=slice(0, 0)).compact.where("o > 3")
    arr = ds["o"]
    with pytest.raises(TypeError, match=r"^arr.compact.where: .*arr.compact.where\(arr == "
                       r"value\)$"):
        arr.compact.where("x > 3")


def test_a_dask_variable_of_cftime_dates_is_rechunked_without_xarray_s_warning():
    """A dask variable of cftime dates (objects: the isel route, rechunked to the result's
    chunks after) warned at every call, "The specified chunks separate the stored chunks
    along dimension "0" ... consider rechunking after loading" (xarray's rechunk of cftime
    takes the present chunks for a store's), about chunks of no store, and read its first
    chunk to tell (until 2026-12-02, seventeenth session, a cftime probe): rechunked by dask,
    no warning, isel's rows and the result's chunks."""
    cftime = pytest.importorskip("cftime")
    n = 31
    t = xr.date_range("2001-02-27", periods=n, freq="D", calendar="noleap", use_cftime=True)
    ds = xr.Dataset({"v": ("ev", np.arange(n) * 1.5), "when": ("ev", np.asarray(t)[::-1])},
                    attrs={"k": 1})
    d = ds.chunk(ev=7)
    mask = (np.arange(n) * 5) % 3 == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = d.compact.where(xr.DataArray(mask, dims="ev"))
    assert got["when"].chunks == got["v"].chunks
    xr.testing.assert_identical(got.compute(), ds.isel(ev=np.flatnonzero(mask)))
    assert isinstance(got["when"].values[0], cftime.DatetimeNoLeap)


def test_arr_compact_where_on_a_pandas_column_is_told_forms_of_arr():
    """arr.compact.where reading a pandas nullable column (the DataArray itself, or one of
    its coordinates) was told the Dataset's forms, ds['x'] = ds['x'].astype('float64') and
    ds.compact.where((ds['x'] > 2)...), of a ds the caller does not have and a name ('x')
    the array does not go by (until 2026-12-02, seventeenth session, as the dtype refusals
    beside it): both forms are arr's now, and each, run as written, gives isel's rows."""
    pd = pytest.importorskip("pandas")
    k = pd.array([4, 1, 0, None, 3, 2, 5], dtype="Int64")
    df = pd.DataFrame({"e": np.arange(7.0), "k": k},
                      index=pd.Index(np.arange(7) * 10, name="ev"))
    ds = xr.Dataset.from_dataframe(df)
    want = [0, 4, 6]
    for arr, cond in ((ds["k"], "x > 2"), (ds["k"], "k > 2"),
                      (ds["e"].assign_coords(kk=ds["k"]), "kk > 2")):
        with pytest.raises(TypeError, match=r"^arr.compact.where: cond reads") as e:
            arr.compact.where(cond)
        said = str(e.value)
        assert "ds[" not in said and "ds.compact" not in said, said
        (convert,) = re.findall(r"convert it first, (arr = .*?\)) \(pd.NA", said)
        (mask,) = re.findall(r"boolean DataArray: (arr\.compact\.where\(.*\))$", said)
        names = {"arr": arr}
        exec(convert, names)
        fixed = names["arr"]
        xr.testing.assert_identical(fixed.compact.where(cond), fixed.isel(ev=want))
        xr.testing.assert_identical(eval(mask, {"arr": arr}), arr.isel(ev=want))


def test_arr_compact_where_s_trace_refusals_give_forms_of_arr():
    """arr.compact.where's refusals of a cumulative sum, of a row's sum over a variable of
    two dimensions, of a closure over a row mask and of a 2-D coordinate without dim= gave
    the Dataset's forms, ds.compact.where(ds['x'].cumsum(dim) > 0) and the like, of a ds the
    caller does not have (until 2026-12-02, seventeenth session, as the dtype refusals'):
    arr and arr['c'] now, and each advice, its placeholders filled, gives isel's rows."""
    rng = np.random.default_rng(33)
    n = 29
    arr = xr.DataArray(rng.random(n) - 0.4, dims="t", name="v",
                       coords={"c": ("t", rng.random(n) - 0.6)}).chunk(t=7)
    wide = xr.DataArray(rng.random((n, 3)), dims=("t", "k"), name="w",
                        coords={"m": (("t", "k"), rng.random((n, 3))),
                                "e": ("t", rng.random(n) + 1)}).chunk(t=7)
    mask = rng.random(n) > 0.5
    cases = [
        (arr, lambda x: np.cumsum(x) > 0, {}, "arr.cumsum(dim) > 0"),
        (arr, lambda v, c: np.cumsum(c) > 0, {}, "arr['c'].cumsum(dim) > 0"),
        (wide, lambda w, e: np.sum(w, axis=1) > e, {"dim": "t"},
         "arr.sum(OTHER_DIM) > t, dim"),
        (wide, "m > 0.5", {}, "(arr['m'] > 0).any(OTHER_DIM)"),
        (arr, lambda c: mask & (c > 0), {"dim": "t"},
         "xr.DataArray(mask, dims=dim) & (arr['b'] > 3), dim"),
    ]
    for a, cond, kw, advice in cases:
        with pytest.raises(ValueError) as refused:
            a.compact.where(cond, **kw)
        said = str(refused.value)
        assert f"arr.compact.where({advice})" in said, said
        assert "ds[" not in said and "ds.compact" not in said, said
    ran = [
        (arr, arr.cumsum("t") > 0, np.cumsum(arr.values) > 0),
        (arr, arr["c"].cumsum("t") > 0, np.cumsum(arr["c"].values) > 0),
        (wide, wide.sum("k") > wide["e"], wide.values.sum(axis=1) > wide["e"].values),
        (wide, (wide["m"] > 0).any("k"), (wide["m"].values > 0).any(axis=1)),
        (arr, xr.DataArray(mask, dims="t") & (arr["c"] > 0), mask & (arr["c"].values > 0)),
    ]
    for a, cond, want in ran:
        xr.testing.assert_identical(a.compact.where(cond, "t").compute(),
                                    a.isel(t=np.flatnonzero(want)).compute())
