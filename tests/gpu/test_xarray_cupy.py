"""ds.compact.where on CuPy-backed Datasets (dask arrays of CuPy chunks, and in memory),
against ``isel`` of the same Dataset's host copy: a string condition, a callable, and
ds.where's own form, a boolean DataArray, lazy and computed."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")
xr = pytest.importorskip("xarray")

import dask_compact  # noqa: E402,F401  (registers the accessor)

pytestmark = pytest.mark.gpu


def events(n: int, seed: int) -> xr.Dataset:
    """Host Dataset: fields of several dtypes, a 2-D variable, one without ``event``."""
    rng = np.random.default_rng(seed)
    return xr.Dataset(
        {
            "energy": ("event", (rng.random(n) * 10).astype(np.float32)),
            "eta": ("event", rng.standard_normal(n)),
            "nhit": ("event", rng.integers(0, 100, n).astype(np.int32)),
            "pos": (("event", "xyz"), rng.random((n, 3)).astype(np.float32)),
            "calib": ("xyz", np.arange(3.0)),
        },
        coords={"event": 1000 + np.arange(n), "run": ("event", np.arange(n) // 10)},
    )


def on_gpu(ds: xr.Dataset, chunk: int | None) -> xr.Dataset:
    """The same Dataset with CuPy data along ``event`` (dask arrays of CuPy chunks when
    ``chunk``); index coordinates stay in host memory, as xarray holds them."""
    out = ds.copy()
    for name, v in ds.data_vars.items():
        if "event" in v.dims:
            data = cupy.asarray(v.values)
            if chunk is not None:
                data = da.from_array(data, chunks={0: chunk}, asarray=False)
            out[name] = (v.dims, data)
    return out


def host(ds: xr.Dataset) -> xr.Dataset:
    """Every variable's values in host memory (index coordinates are there already)."""
    data = {n: v.variable.copy(data=_np(v.data)) for n, v in ds.data_vars.items()}
    coords = {n: ds[n].variable.copy(data=_np(ds[n].data))
              for n in ds.coords if n not in ds.xindexes}
    return ds.assign(data).assign_coords(coords)


def _np(a):
    a = a.compute() if hasattr(a, "compute") else a
    return cupy.asnumpy(a) if isinstance(a, cupy.ndarray) else np.asarray(a)


@pytest.mark.parametrize("n", [0, 1, 33, 1025, 65_537])
@pytest.mark.parametrize("form", ["string", "callable", "lazy-mask", "computed-mask"])
def test_cupy_dataset_matches_isel(n, form):
    ref_ds = events(n, seed=n)
    mask = (ref_ds.energy.values > 5) & (np.abs(ref_ds.eta.values) < 1)
    d = on_gpu(ref_ds, chunk=max(7, n // 6))
    cond = {
        "string": "(energy > 5) & (abs(eta) < 1)",
        "callable": lambda energy, eta: (energy > 5) & (abs(eta) < 1),
        "lazy-mask": (d.energy > 5) & (abs(d.eta) < 1),
        "computed-mask": ((d.energy > 5) & (abs(d.eta) < 1)).compute(),
    }[form]
    out = d.compact.where(cond, dim="event", indices="row")
    assert isinstance(out.energy.data, da.Array)
    assert isinstance(out.energy.data._meta, cupy.ndarray)
    assert not any(np.isnan(c) for c in out.energy.chunks[0])
    assert out.pos.chunks[0] == out.energy.chunks[0]
    got = host(out)
    np.testing.assert_array_equal(got.row.values, np.flatnonzero(mask))
    want = ref_ds.isel(event=np.flatnonzero(mask))
    xr.testing.assert_identical(got.drop_vars("row"), want)
    for name in ("energy", "eta", "nhit", "pos"):
        assert got[name].dtype == ref_ds[name].dtype


@pytest.mark.parametrize("n", [0, 31, 1025])
def test_in_memory_cupy_dataset_with_a_mask(n):
    ref_ds = events(n, seed=7 + n)
    mask = ref_ds.energy.values > 3
    d = on_gpu(ref_ds, chunk=None)
    out = d.compact.where(d.energy > 3)
    assert isinstance(out.energy.data, cupy.ndarray)
    xr.testing.assert_identical(host(out), ref_ds.isel(event=np.flatnonzero(mask)))
    arr = d.pos.compact.where(d.energy > 3)
    np.testing.assert_array_equal(cupy.asnumpy(arr.data), ref_ds.pos.values[mask])
