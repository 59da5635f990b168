"""CF decoding of the fields a group job's ``--where`` reads (:mod:`dask_compact.batch.cf`):
bit for bit the values ``xr.open_zarr`` decodes, for the packings xarray writes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
xr = pytest.importorskip("xarray")

from dask_compact.batch.cf import Decoding, decoding  # noqa: E402
from dask_compact.batch.inputs import xarray_encodings  # noqa: E402

# (stored dtype, xarray's encoding of the variable, range of the values written)
PACKINGS = {
    "int16-scale-offset-fill": ("int16", {"scale_factor": 0.01, "add_offset": 273.15,
                                          "_FillValue": -32768}, (250, 320)),
    "int16-scale-offset": ("int16", {"scale_factor": 0.01, "add_offset": 273.15}, (250, 320)),
    "int8-scale-fill": ("int8", {"scale_factor": 0.5, "_FillValue": -128}, (-60, 60)),
    "uint8-scale-fill": ("uint8", {"scale_factor": 0.1, "_FillValue": 255}, (0, 25)),
    "uint16-scale-offset-fill": ("uint16", {"scale_factor": 0.001, "add_offset": -10.0,
                                            "_FillValue": 65535}, (-10, 55)),
    "int32-scale-offset-fill": ("int32", {"scale_factor": 1e-4, "add_offset": 5.0,
                                          "_FillValue": -1}, (0, 100)),
    "int16-fill": ("int16", {"_FillValue": -1}, (0, 1000)),
    "int16-offset": ("int16", {"add_offset": 100}, (0, 1000)),
    "float32-scale-offset": ("float32", {"scale_factor": 0.1, "add_offset": 3.0}, (-5, 5)),
    "float32-fill": ("float32", {"_FillValue": -999.0}, (-5, 5)),
    "float32-fill-not-a-float32": ("float32", {"_FillValue": 1e20}, (-5, 5)),
    "float64-float32-scale": ("float64", {"scale_factor": np.float32(0.1)}, (-5, 5)),
}


def _write(path, dtype, encoding, span, n=301, seed=0, missing_value=None):
    """A Dataset of one variable ``t`` written by xarray with ``encoding``: random values in
    ``span`` (whole numbers where no scale_factor packs them), a tenth of them NaN where a
    fill value or a float dtype can hold them."""
    rng = np.random.default_rng(seed)
    v = rng.uniform(*span, n)
    if "scale_factor" not in encoding and np.dtype(dtype).kind in "iu":
        v = np.round(v)
    if "_FillValue" in encoding or np.dtype(dtype).kind == "f":
        v[rng.random(n) < 0.1] = np.nan
    ds = xr.Dataset({"t": ("event", v)})
    if missing_value is not None:
        ds.t.attrs["missing_value"] = missing_value
    return ds, {"t": {**encoding, "dtype": dtype}}


def _stored(tmp_path, ds, enc, zarr_format):
    """``ds`` written by xarray with ``enc``: the stored array ``t`` and xarray's decoding."""
    path = tmp_path / "ds.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, zarr_format=zarr_format, encoding=enc, consolidated=False)
        want = xr.open_zarr(path, consolidated=False).t.values
    return zarr.open_group(str(path), mode="r")["t"], want


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("packing", list(PACKINGS))
def test_decoded_values_are_xarrays_bit_for_bit(tmp_path, packing, zarr_format):
    dtype, encoding, span = PACKINGS[packing]
    ds, enc = _write(tmp_path, dtype, encoding, span, seed=zarr_format)
    z, want = _stored(tmp_path, ds, enc, zarr_format)
    how = decoding(z)
    if "_FillValue" in encoding:  # the fill values are there, and decode to NaN
        assert np.isnan(want).sum() == np.isnan(ds.t.values).sum() > 0
    assert isinstance(how, Decoding), how
    got = how.apply(z[...])
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # exact; NaN where NaN
    out = np.full(z.shape, 7.0, how.dtype)  # into a buffer: the same values
    np.testing.assert_array_equal(how.apply(z[...], out), want)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_missing_value_and_fill_value_both_mask(tmp_path, zarr_format):
    ds, enc = _write(tmp_path, "int16", {"scale_factor": 0.01, "add_offset": 273.15,
                                         "_FillValue": -32768}, (250, 320), missing_value=-32767)
    ds.t.values[3] = (-32767 * 0.01) + 273.15  # stored as the missing value
    z, want = _stored(tmp_path, ds, enc, zarr_format)
    assert z[3] == -32767 and np.isnan(want[3])
    how = decoding(z)
    assert isinstance(how, Decoding) and how.applied[:2] == ("missing_value", "_FillValue")
    np.testing.assert_array_equal(how.apply(z[...]), want)


def test_a_plain_zarr_v2_fill_value_is_not_a_missing_value(tmp_path):
    """zarr gives every format 2 array a fill value (0 here): only one xarray wrote
    (``_ARRAY_DIMENSIONS``) has it read as xarray's missing-value marker."""
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", zarr_format=2)
    a = g.create_array("a", shape=(5,), dtype="f8", fill_value=0.0)
    a[:] = [0, 1, 0, 2, 3]
    assert decoding(a) is None
    a.attrs["_ARRAY_DIMENSIONS"] = ["event"]
    how = decoding(a)
    assert isinstance(how, Decoding)
    np.testing.assert_array_equal(how.apply(a[...]), [np.nan, 1, np.nan, 2, 3])


def test_what_is_not_decoded_says_why(tmp_path):
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    plain = g.create_array("plain", shape=(3,), dtype="f4")
    nan_fill = g.create_array("nan_fill", shape=(3,), dtype="f4",
                              attributes={"_FillValue": "AAAAAAAA+H8="})
    times = g.create_array("times", shape=(3,), dtype="i8", attributes={
        "units": "days since 2000-01-01", "_FillValue": -1})
    unsigned = g.create_array("unsigned", shape=(3,), dtype="i1", attributes={
        "_Unsigned": "true", "scale_factor": 0.5})
    assert decoding(plain) is None and decoding(nan_fill) is None  # nothing changes
    assert "time-like" in decoding(times)
    assert "_Unsigned" in decoding(unsigned)


def test_a_renamed_predicate_reads_the_decoded_field():
    """The GPU path's predicate over a field both written (as stored) and read decoded: its
    variable renamed to the decoded copy's name (checked here on the CPU's loop)."""
    from dask_compact.backends.numpy_records import predicate_bits
    from dask_compact.batch.record_tasks import _decoded_name, _renamed
    from dask_compact.records_check import check_record_predicate

    stored = np.array([2685, 2686, 2687, -32768], np.int16)
    decoded = stored * 0.01 + 273.15
    decoded[3] = np.nan
    fields = {"t": decoded, "e": np.ones(4)}
    p = check_record_predicate("(t > 300.0) & (e > 0)", fields)
    q = _renamed(p, {"t": _decoded_name("t")})
    assert q.fields == ("e", "t/decoded") and _renamed(p, {"t": "t/decoded"}) is q
    bits, k = predicate_bits(q, {"t": stored, "t/decoded": decoded, "e": fields["e"]}, 4)
    want = np.flatnonzero(decoded > 300.0)
    assert k == len(want) == 2
    assert [j for j in range(4) if int(bits[0]) >> j & 1] == list(want)


def test_datetime_units_without_a_fill_value_say_why_they_are_not_decoded(tmp_path):
    """A "<unit> since <date>" field without a fill value (xarray's default for a time
    coordinate), which xarray decodes to datetimes, was None, "nothing changes", so --where
    compared its counts with no note (until 2026-12-02, seventeenth session); a bare time
    unit on a float stays None (xarray 2026.9 keeps it a float)."""
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    when = g.create_array("when", shape=(3,), dtype="i8",
                          attributes={"units": "days since 2000-01-01"})
    span = g.create_array("span", shape=(3,), dtype="f8", attributes={"units": "seconds"})
    assert "time-like units 'days since 2000-01-01'" in decoding(when)
    assert decoding(span) is None
    assert xarray_encodings(dict(when.attrs)) == ["units"]
    assert xarray_encodings(dict(span.attrs)) == []


def test_cf_time_reads_the_units_xarray_decodes_to_times():
    """cf_time: "<unit> since <epoch>" (datetime64; the epoch read for the standard calendars
    only, in the spellings xarray writes and CF allows) and a time unit with xarray's
    timedelta dtype attribute; a bare unit or other attributes are no time."""
    from dask_compact.batch.cf import cf_time, time_units

    t = cf_time({"units": "days since 2000-01-01"})
    assert (t.kind, t.unit, t.epoch) == ("M", "D", np.datetime64("2000-01-01", "ns"))
    t = cf_time({"units": "microseconds since 1970-01-01 00:00:00", "calendar": "standard"})
    assert (t.unit, t.epoch) == ("us", np.datetime64("1970-01-01T00:00:00", "ns"))
    t = cf_time({"units": "hour since 2001-02-03T04:05:06Z", "calendar": "proleptic_gregorian"})
    assert (t.unit, t.epoch) == ("h", np.datetime64("2001-02-03T04:05:06", "ns"))
    assert cf_time({"units": "days since 2000-01-01", "calendar": "noleap"}).epoch is None
    assert cf_time({"units": "days since 2000-1-1 0:0:0"}).epoch is None  # not read: no hint
    assert cf_time({"units": "fortnights since 2000-01-01"}).unit is None
    t = cf_time({"units": "hours", "dtype": "timedelta64[ns]"})
    assert (t.kind, t.unit, t.epoch) == ("m", "h", None)
    assert "xarray decodes timedeltas" in time_units({"units": "hours",
                                                      "dtype": "timedelta64[ns]"})
    for attrs in ({"units": "hours"}, {"units": "K"}, {}, {"dtype": "timedelta64[ns]"},
                  {"units": "metres", "dtype": "timedelta64[ns]"}):
        assert cf_time(attrs) is None and time_units(attrs) is None
