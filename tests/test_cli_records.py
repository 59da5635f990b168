"""The batch CLI on a Zarr group (``dask compact GROUP OUT --where EXPR --fields ...``): every
output array against NumPy's ``v[mask]``, the choice of fields, refusals with short messages,
and the same all-or-nothing output as the one-array job."""

from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from cli_helpers import kill_halfway, litter, run

from dask_compact.batch import stream, tasks

WHERE = "(mass > 5) & (x < 0.3)"

# name -> (dtype, trailing shape, Zarr chunk rows): every field chunked its own way
PARTICLES = {
    "x": ("f4", (), 100),
    "y": ("f4", (), 333),
    "z": ("f4", (), 64),
    "vx": ("f8", (), 250),
    "vy": ("f8", (), 1000),
    "vz": ("f8", (), 77),
    "mass": ("f4", (), 128),
    "id": ("i8", (), 500),
    "pos": ("f4", (3,), 90),
}


def make_particles(path: Path, n: int, seed: int = 5, zarr_format: int = 3,
                   endian: str = "<") -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    group = zarr.open_group(store=str(path), mode="w", zarr_format=zarr_format)
    data = {}
    for name, (dt, tail, rows) in PARTICLES.items():
        dtype = np.dtype(dt).newbyteorder(endian)
        if name == "id":
            v = np.arange(n, dtype=np.int64) * 7 + 3
        elif name == "mass":
            v = rng.random(n) * 10
        else:
            v = rng.random((n, *tail))
        v = v.astype(dtype)
        a = group.create_array(name, shape=v.shape, dtype=dtype, chunks=(rows, *tail))
        if n:
            a[:] = v
        data[name] = v
    return data


def read(path: Path) -> tuple[dict, dict[str, np.ndarray], dict[str, tuple]]:
    g = zarr.open_group(store=str(path), mode="r")
    arrays = dict(g.arrays())
    return (dict(g.attrs), {k: a[...] for k, a in arrays.items()},
            {k: a.chunks for k, a in arrays.items()})


def mask_of(data: dict[str, np.ndarray]) -> np.ndarray:
    return (data["mass"] > 5) & (data["x"] < np.float32(0.3))


@pytest.fixture
def particles(tmp_path):
    path = tmp_path / "particles.zarr"
    return path, make_particles(path, 1025)


# -- results --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 1025])
def test_every_field_and_the_indices_match_numpy(tmp_path, n):
    src = tmp_path / "p.zarr"
    data = make_particles(src, n, seed=n)
    out = tmp_path / "out.zarr"
    res = run(src, out, "--where", WHERE, "--output", "both", "--local", "threads")
    m = mask_of(data)
    attrs, arrays, _ = read(out)
    assert sorted(arrays) == sorted([*PARTICLES, "indices"])
    for name, v in data.items():
        np.testing.assert_array_equal(arrays[name], v[m])
        assert arrays[name].dtype == v.dtype and arrays[name].shape[1:] == v.shape[1:]
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))
    assert arrays["indices"].dtype == np.int64
    info = attrs["dask_compact"]
    assert info["complete"] is True and info["selected"] == m.sum() and info["where"] == WHERE
    assert info["fields"] == sorted(PARTICLES) and info["input_rows"] == n
    assert f"selected  {m.sum():,}" in res.output and "indices" in res.output
    assert litter(tmp_path) == []


def test_fields_picks_what_is_written_and_json_summary(particles, tmp_path):
    src, data = particles
    out = tmp_path / "out.zarr"
    res = run(src, out, "--where", WHERE, "--fields", "pos,id,vz", "--json",
              "--chunks", "200", "--output-chunks", "50")
    summary = json.loads(res.output)
    m = mask_of(data)
    _, arrays, chunks = read(out)
    assert sorted(arrays) == ["id", "pos", "vz"]  # mass and x are read, not written
    for name in ("pos", "id", "vz"):
        np.testing.assert_array_equal(arrays[name], data[name][m])
    assert chunks["pos"] == (50, 3) and chunks["id"] == (50,)
    # never longer than the input, asked for or not
    out2 = tmp_path / "out2.zarr"
    run(src, out2, "--where", WHERE, "--output-chunks", str(10**9))
    _, arrays2, chunks2 = read(out2)
    assert chunks2["pos"] == (1025, 3) and chunks2["id"] == (1025,)
    np.testing.assert_array_equal(arrays2["pos"], data["pos"][m])
    assert summary["fields"] == ["pos", "id", "vz"] and summary["arrays"] == ["pos", "id", "vz"]
    assert summary["read"] == ["mass", "x"] and summary["ignored"] == {}
    assert summary["rows"] == 1025 and summary["selected"] == m.sum()
    assert summary["input_kind"] == "zarr group" and summary["seconds"] > 0


def test_indices_only_and_output_chunks_follow_the_input(particles, tmp_path):
    src, data = particles
    out = tmp_path / "out.zarr"
    run(src, out, "--where", "(vx < 0.5) | (id == 10)", "--output", "indices")
    _, arrays, chunks = read(out)
    assert list(arrays) == ["indices"]
    np.testing.assert_array_equal(arrays["indices"],
                                  np.flatnonzero((data["vx"] < 0.5) | (data["id"] == 10)))
    assert chunks["indices"] == (PARTICLES["id"][2],)  # the rows of the first field it reads
    # every output array is chunked alike: the rows of the first field the predicate reads
    run(src, tmp_path / "o2.zarr", "--where", "id > 100", "--fields", "y,pos", "-o", "both")
    chunks = read(tmp_path / "o2.zarr")[2]
    assert chunks == {"y": (500,), "pos": (500, 3), "indices": (500,)}


@pytest.mark.parametrize("where, selected", [("mass > 100", 0), ("mass >= 0", 1025)])
def test_empty_and_full_selections(particles, tmp_path, where, selected):
    src, data = particles
    out = tmp_path / "out.zarr"
    run(src, out, "--where", where, "-o", "both")
    attrs, arrays, _ = read(out)
    assert attrs["dask_compact"]["complete"] is True
    for name, v in data.items():
        assert arrays[name].shape == (selected, *v.shape[1:]) and arrays[name].dtype == v.dtype
        np.testing.assert_array_equal(arrays[name], v[:selected])
    np.testing.assert_array_equal(arrays["indices"], np.arange(selected))


def test_a_group_with_stale_consolidated_metadata_is_read_as_it_is_on_disk(tmp_path):
    """A group consolidated and then grown (rows appended to every array, a field added):
    the job read the consolidated copy, 1,025 rows of 1,225 and no new field, and said it
    was complete (a new-user probe). It reads each array's own metadata."""
    src = tmp_path / "grown.zarr"
    make_particles(src, 1025)
    zarr.consolidate_metadata(str(src))
    rng = np.random.default_rng(8)
    data = {}
    for name in PARTICLES:
        a = zarr.open_array(store=str(src / name), mode="r+")
        a.resize((1225, *a.shape[1:]))
        a[1025:] = rng.random((200, *a.shape[1:])).astype(a.dtype) * 10
        data[name] = a[:]
    group = zarr.open_group(store=str(src), mode="r+", use_consolidated=False)
    extra = group.create_array("extra", shape=(1225,), dtype="i4", chunks=(300,))
    extra[:] = data["extra"] = np.arange(1225, dtype="i4")
    out = tmp_path / "out.zarr"
    run(src, out, "--where", WHERE, "--output", "both", "--local", "threads")
    m = mask_of(data)
    _, arrays, _ = read(out)
    assert sorted(arrays) == sorted([*PARTICLES, "extra", "indices"])
    for name, v in data.items():
        np.testing.assert_array_equal(arrays[name], v[m])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_an_xarray_dataset_comes_out_as_a_dataset(tmp_path, zarr_format):
    """The fields keep their attributes and dimension names, the group its attributes, so
    that xr.open_zarr opens the output (it refused it: no dimension names; a probe)."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(9)
    n = 3001
    ds = xr.Dataset({"energy": ("event", rng.random(n) * 10, {"units": "GeV"}),
                     "eta": ("event", rng.normal(size=n)),
                     "pos": (("event", "xyz"), rng.random((n, 3)))},
                    coords={"event": np.arange(n) * 3}, attrs={"title": "run 7"})
    src, out = tmp_path / "ds.zarr", tmp_path / "out.zarr"
    ds.chunk({"event": 1000}).to_zarr(src, zarr_format=zarr_format, consolidated=True)
    run(src, out, "--where", "(energy > 5) & (abs(eta) < 1)", "--output", "both")
    got = xr.open_zarr(out, consolidated=False)
    want = ds.isel(event=((ds.energy > 5) & (abs(ds.eta) < 1)).values)
    assert got.attrs["title"] == "run 7" and got.energy.attrs == {"units": "GeV"}
    assert got.pos.dims == ("event", "xyz") and got.indices.dims == ("event",)
    for name in ("energy", "eta", "pos", "event"):
        np.testing.assert_array_equal(got[name].values, want[name].values)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_variables_along_other_dimensions_are_kept(tmp_path, zarr_format):
    """A Dataset's coordinates and variables without the selected dimension come out
    unchanged, as ``ds.isel`` keeps them (they were dropped; a probe): the output opens as
    the Dataset selected, and ``--fields`` keeps the coordinates of the fields it writes."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(3)
    n = 1025
    ds = xr.Dataset({"energy": ("event", rng.random(n) * 10, {"units": "GeV"}),
                     "wave": (("event", "channel"), rng.random((n, 4)).astype("f4")),
                     "calib": ("channel", rng.random(4), {"note": "per channel"}),
                     "run": ((), 7)},
                    coords={"event": np.arange(n) * 2, "channel": ["a", "b", "c", "d"],
                            "gain": ("channel", np.arange(4) * 10)},
                    attrs={"title": "run 7"})
    src, out = tmp_path / "ds.zarr", tmp_path / "out.zarr"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zarr's: fixed-length strings have no v3 spec
        ds.chunk({"event": 300}).to_zarr(src, zarr_format=zarr_format, consolidated=False)
    res = run(src, out, "--where", "energy > 4")
    assert "kept      calib, channel, gain, run" in res.output
    assert "UnstableSpecification" not in res.output or zarr_format == 2
    got = xr.open_zarr(out, consolidated=False).load()
    want = ds.isel(event=np.flatnonzero(ds.energy.values > 4))
    xr.testing.assert_identical(got.drop_attrs(deep=False).assign_attrs(want.attrs), want)
    run(src, tmp_path / "f.zarr", "--where", "energy > 4", "--fields", "wave")
    got = xr.open_zarr(tmp_path / "f.zarr", consolidated=False).load()
    assert sorted(got.variables) == ["channel", "event", "gain", "wave"]  # as ds[["wave"]]
    xr.testing.assert_identical(got.wave, want.wave)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_dimensions_of_one_length_are_told_apart_by_name(tmp_path, zarr_format):
    """100 events and 100 channels: the channel variables are kept, not cut along axis 0 as
    event fields (a probe: exit 0, a Dataset xarray then refused), a variable with the
    events on another axis is left out and listed, a subgroup is listed, and naming arrays
    of two dimensions together is refused."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(8)
    n = 100
    ds = xr.Dataset({"energy": ("event", rng.random(n)),
                     "gain": ("ch", rng.random(n)),
                     "img": (("ch", "event"), rng.random((n, n)).astype("f4")),
                     "wave": (("event", "ch"), rng.random((n, n)).astype("f4"))},
                    coords={"ch": np.arange(n) * 3})
    src, out = tmp_path / "ds.zarr", tmp_path / "out.zarr"
    ds.chunk({"event": 30}).to_zarr(src, zarr_format=zarr_format, consolidated=False)
    zarr.open_group(store=str(src), mode="r+").create_group("meta").create_array(
        "s", shape=(n,), dtype="f8")[:] = 1.0
    res = run(src, out, "--where", "energy > 0.5", "--json")
    summary = json.loads(res.stdout)
    assert summary["fields"] == ["energy", "wave"] and summary["kept"] == ["ch", "gain"]
    assert "axis 1" in summary["ignored"]["img"] and "group" in summary["ignored"]["meta"]
    got = xr.open_zarr(out, consolidated=False).load()
    want = ds.drop_vars("img").isel(event=np.flatnonzero(ds.energy.values > 0.5))
    xr.testing.assert_identical(got.drop_attrs(deep=False), want)
    res = run(src, tmp_path / "o2.zarr", "--where", "(energy > 0.5) & (gain > 0.5)", code=2)
    assert "one dimension" in res.output and "'ch'" in res.output
    res = run(src, tmp_path / "o2.zarr", "--where", "energy > 0.5", "--fields", "img", code=2)
    assert "one dimension" in res.output and not (tmp_path / "o2.zarr").exists()



def test_a_kept_array_with_a_missing_chunk_is_refused(particles, tmp_path):
    src, _ = particles
    g = zarr.open_group(store=str(src), mode="r+")
    g.create_array("table", shape=(40,), dtype="f8", chunks=(10,))[:30] = 1.0
    res = run(src, tmp_path / "o.zarr", "--where", WHERE, code=2)
    assert "table" in res.output and "not in the store" in res.output
    run(src, tmp_path / "o.zarr", "--where", WHERE, "--allow-missing-chunks")
    np.testing.assert_array_equal(read(tmp_path / "o.zarr")[1]["table"], [1.0] * 30 + [0.0] * 10)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_a_v2_fill_value_stays_the_missing_value_marker(tmp_path, zarr_format):
    """xarray reads a format 2 array's fill value as its missing-value marker; the format 3
    output carries it as the _FillValue attribute (a probe got -9999 where NaN was)."""
    xr = pytest.importorskip("xarray")
    ds = xr.Dataset({"e": ("event", np.linspace(0, 1, 10)),
                     "t": ("event", [np.nan, 1, 2, np.nan, 4, 5, np.nan, 7, 8, 9]),
                     "k": ("event", np.arange(10, dtype="i4"))})
    ds.t.encoding["_FillValue"] = -9999.0
    ds.k.encoding["_FillValue"] = 3
    src, out = tmp_path / "ds.zarr", tmp_path / "out.zarr"
    ds.to_zarr(src, zarr_format=zarr_format, consolidated=False)
    run(src, out, "--where", "e > 0.2")
    got = xr.open_zarr(out, consolidated=False).load()
    read_back = xr.open_zarr(src, consolidated=False).load()
    want = read_back.isel(event=np.flatnonzero(read_back.e.values > 0.2))
    assert np.isnan(got.t.values[[1, 4]]).all() and np.isnan(got.k.values[4 - 3])
    xr.testing.assert_identical(got.drop_attrs(deep=False), want)


def test_big_endian_v2_group(tmp_path):
    src = tmp_path / "be.zarr"
    data = make_particles(src, 300, zarr_format=2, endian=">")
    out = tmp_path / "out.zarr"
    run(src, out, "--where", WHERE, "--fields", "vx,id,pos")
    m = mask_of(data)
    _, arrays, _ = read(out)
    for name in ("vx", "id", "pos"):
        np.testing.assert_array_equal(arrays[name], data[name][m])
        assert arrays[name].dtype.isnative


def test_arrays_that_are_not_fields_are_kept_or_listed(particles, tmp_path):
    """Arrays without the record's rows are copied unchanged (as xarray keeps a variable
    without the selected dimension; a probe found them dropped), a field-length array of a
    dtype without a fixed size is left out and listed."""
    src, data = particles
    g = zarr.open_group(store=str(src), mode="r+")
    g.create_array("run_info", shape=(7,), dtype="i4", chunks=(3,),
                   attributes={"what": "runs"})[:] = np.arange(7) * 3
    g.create_array("scale", shape=(), dtype="f8")[...] = 2.5
    g.create_array("label", shape=(1025,), dtype=str, chunks=(1025,))
    g.create_group("meta")
    out = tmp_path / "out.zarr"
    res = run(src, out, "--where", WHERE)
    assert "label (dtype" in res.output and "ignored" in res.output
    assert "kept      run_info, scale: copied unchanged" in res.output
    _, arrays, chunks = read(out)
    assert sorted(arrays) == sorted([*PARTICLES, "run_info", "scale"])
    np.testing.assert_array_equal(arrays["run_info"], np.arange(7) * 3)
    assert chunks["run_info"] == (3,) and float(arrays["scale"]) == 2.5
    assert dict(zarr.open_array(store=str(out / "run_info"), mode="r").attrs) == {"what": "runs"}
    res = run(src, tmp_path / "o1.zarr", "--where", WHERE, "--fields", "x,pos", "--json")
    summary = json.loads(res.stdout)
    assert summary["kept"] == [] and sorted(summary["ignored"]) == ["label", "meta", "run_info",
                                                                  "scale"]
    assert sorted(read(tmp_path / "o1.zarr")[1]) == ["pos", "x"]
    res = run(src, tmp_path / "o3.zarr", "--where", WHERE, "--output", "indices", "--json")
    assert json.loads(res.stdout)["kept"] == [] and sorted(read(tmp_path / "o3.zarr")[1]) == [
        "indices"]
    for option, args in [("--fields", ["--where", WHERE, "--fields", "x,run_info"]),
                         ("--where", ["--where", "(run_info > 0) & (mass > 5)"]),
                         ("--where", ["--where", "scale > 0"]),
                         ("--fields", ["--where", WHERE, "--fields", "label"])]:
        res = run(src, tmp_path / "o2.zarr", *args, code=2)
        assert option in res.output, res.output
        assert "run_info" in res.output or "scale" in res.output or "label" in res.output
    assert not (tmp_path / "o2.zarr").exists() and litter(tmp_path) == []


def test_a_field_name_that_is_not_a_python_name_is_said_to_be_the_problem(particles, tmp_path):
    """A field named `class` or `my-field` cannot be named in --where (a new-user probe got
    only "not valid syntax"); the message says which names, and --fields writes them."""
    src, data = particles
    g = zarr.open_group(store=str(src), mode="r+")
    g.create_array("class", shape=(1025,), dtype="i1", chunks=(300,))[:] = 1
    g.create_array("my-field", shape=(1025,), dtype="f4", chunks=(300,))[:] = 2
    res = run(src, tmp_path / "o.zarr", "--where", "class == 1", code=2)
    assert "'class', 'my-field' cannot be named in it" in res.output, res.output
    run(src, tmp_path / "o.zarr", "--where", WHERE, "--fields", "class,my-field,x")
    arrays = read(tmp_path / "o.zarr")[1]
    m = mask_of(data)
    assert sorted(arrays) == ["class", "my-field", "x"]
    np.testing.assert_array_equal(arrays["my-field"], np.full(m.sum(), 2, "f4"))
    np.testing.assert_array_equal(arrays["x"], data["x"][m])


# -- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--where", "(mass > 5) & (energy < 2)"], "'energy' is not allowed"),
        (["--where", "mass +"], "not valid syntax"),
        (["--where", "mass + 1"], "booleans"),
        (["--where", "pos > 1"], "--where reads only 1-D fields"),
        (["--where", WHERE, "--fields", "x,charge"], "'charge' is not an array"),
        (["--where", WHERE, "--fields", "x,,y"], "empty field name"),
        (["--where", WHERE, "--fields", "x,y,x"], "x named twice"),
        (["--where", WHERE, "--fields", "x", "-o", "indices"], "--output indices"),
        (["--where", WHERE, "--decode", "gpu"], "--decode gpu: not supported for a Zarr"),
        (["--where", WHERE, "--decode", "gpu", "--encode", "gpu"], "--decode gpu, --encode gpu"),
        (["--where", WHERE, "--memory-budget", "lots"], "--memory-budget"),
    ],
)
def test_refusals_leave_nothing(particles, tmp_path, args, message):
    src, _ = particles
    out = tmp_path / "out.zarr"
    res = run(src, out, *args, code=2)
    assert message in res.output
    assert not out.exists() and litter(tmp_path) == []


def test_a_group_whose_arrays_are_in_subgroups_names_them(tmp_path):
    # Until 2026-12-01 (a new-user probe) a group holding its arrays in a subgroup was
    # refused as "a Zarr group with no arrays", saying nothing of where they are.
    src = tmp_path / "nested.zarr"
    sub = zarr.open_group(str(src), mode="w").create_group("run1")
    sub.create_array("x", shape=(5,), chunks=(2,), dtype="f8")[:] = np.arange(5.0)
    res = run(src, tmp_path / "o.zarr", "--where", "x > 2", code=2)
    assert "run1" in res.output and f"{src}/run1" in res.output
    assert not (tmp_path / "o.zarr").exists()

def test_a_group_whose_arrays_are_in_subgroups_gives_one_that_holds_arrays(tmp_path):
    # Until 2026-12-01 (thirteenth session, the regression review) the example INPUT was the
    # first group by name, here an empty one ("aux"), whose own refusal then named nothing.
    src = tmp_path / "nested.zarr"
    root = zarr.open_group(str(src), mode="w")
    root.create_group("aux")
    root.create_group("run1").create_array("x", shape=(5,), chunks=(2,),
                                           dtype="f8")[:] = np.arange(5.0)
    res = run(src, tmp_path / "o.zarr", "--where", "x > 2", code=2)
    said = " ".join(res.output.split())
    assert "aux, run1" in said and f"e.g. {src}/run1" in said, said
    assert not (tmp_path / "o.zarr").exists()


def test_a_group_whose_arrays_are_deeper_gives_a_subgroup_that_leads_to_them(tmp_path):
    # Until 2026-12-01 (fourteenth session, a regression review) a group whose arrays are two
    # levels down (run1/cam/x) was given the first subgroup by name, an empty one ("aux"),
    # whose own refusal then named nothing: the one that holds them deeper now.
    src = tmp_path / "deep.zarr"
    root = zarr.open_group(str(src), mode="w")
    root.create_group("aux")
    root.create_group("run1").create_group("cam").create_array(
        "x", shape=(5,), chunks=(2,), dtype="f8")[:] = np.arange(5.0)
    res = run(src, tmp_path / "o.zarr", "--where", "x > 2", code=2)
    said = " ".join(res.output.split())
    assert "aux, run1" in said and f"e.g. {src}/run1" in said, said
    res = run(src / "run1", tmp_path / "o.zarr", "--where", "x > 2", code=2)
    said = " ".join(res.output.split())
    assert f"e.g. {src}/run1/cam" in said, said
    assert not (tmp_path / "o.zarr").exists()


def test_a_2d_field_in_where_gets_advice_for_the_command_line(particles, tmp_path):
    """The refusal of a 2-D field in --where says what a user of the command can do (which
    fields --where can read; store a column as its own array), not compact_records' Python
    advice, fields['pos_0'] = pos[:, 0] (a docs probe, 2026-11-30), which that call keeps."""
    import dask_compact

    src, data = particles
    res = run(src, tmp_path / "o.zarr", "--where", "(pos > 0.5) & (mass > 5)", code=2)
    message = " ".join(res.output.split())
    assert "'pos' has shape (1025, 3), more than one value per row" in message, message
    assert "this group's: id, mass, vx, vy, vz, x, y, z" in message, message
    assert "store that column in the group as a 1-D array of its own" in message, message
    assert "fields[" not in message and "[:, 0]" not in message, message
    assert not (tmp_path / "o.zarr").exists() and litter(tmp_path) == []
    with pytest.raises(ValueError, match=re.escape("fields['pos_0'] = pos[:, 0]")):
        dask_compact.compact_records(data, "pos > 0.5")
    # written, it is fine: only reading it in --where is refused
    run(src, tmp_path / "o.zarr", "--where", WHERE, "--fields", "pos,id")
    m = mask_of(data)
    np.testing.assert_array_equal(read(tmp_path / "o.zarr")[1]["pos"], data["pos"][m])


def test_unknown_field_message_names_the_group_arrays(particles, tmp_path):
    src, _ = particles
    res = run(src, tmp_path / "o.zarr", "--where", "energy > 1", code=2)
    assert "--where" in res.output and "Zarr group" in res.output
    assert "mass" in res.output and "vz" in res.output


def test_arrays_of_different_lengths_named_together(tmp_path):
    src = tmp_path / "g.zarr"
    g = zarr.open_group(store=str(src), mode="w")
    g.create_array("a", shape=(10,), dtype="f8")[:] = np.arange(10.0)
    g.create_array("b", shape=(12,), dtype="f8")[:] = np.arange(12.0)
    g.create_array("c", shape=(12,), dtype="f8")[:] = np.arange(12.0)
    out = tmp_path / "o.zarr"
    res = run(src, out, "--where", "(a > 1) & (b > 1)", code=2)
    assert "same number of rows" in res.output and "a (--where): 10" in res.output
    res = run(src, out, "--where", "a > 1", "--fields", "c", code=2)
    assert "c (--fields): 12" in res.output
    g.create_array("d", shape=(10,), dtype="f8")[:] = 2.0  # stored (zeros would not be)
    res = run(src, out, "--where", "1 > 0", code=2)  # 2 arrays of 10 rows, 2 of 12: which?
    assert "--fields" in res.output
    assert not out.exists() and litter(tmp_path) == []
    run(src, out, "--where", "b > 5", "-o", "both")  # the arrays of 10 rows: copied as they are
    _, arrays, _ = read(out)
    np.testing.assert_array_equal(arrays["c"], np.arange(6.0, 12.0))
    assert sorted(arrays) == ["a", "b", "c", "d", "indices"]
    np.testing.assert_array_equal(arrays["a"], np.arange(10.0))


def test_a_field_named_indices(tmp_path):
    src = tmp_path / "g.zarr"
    g = zarr.open_group(store=str(src), mode="w")
    g.create_array("e", shape=(5,), dtype="f8")[:] = np.arange(5.0)
    g.create_array("indices", shape=(5,), dtype="i8")[:] = np.arange(5) * 2
    res = run(src, tmp_path / "o.zarr", "--where", "e > 2", "-o", "both", code=2)
    assert "'indices'" in res.output and "--fields" in res.output
    res = run(src, tmp_path / "o.zarr", "--where", "indices > 2", "-o", "both", "--fields",
              "e", code=2)  # read by the predicate: it would meet the row indices on a GPU
    assert "--where reads the group's array 'indices'" in res.output
    run(src, tmp_path / "o.zarr", "--where", "e > 2")  # the field, compacted like any other
    np.testing.assert_array_equal(read(tmp_path / "o.zarr")[1]["indices"], [6, 8])
    run(src, tmp_path / "o2.zarr", "--where", "indices > 5")  # read and written, values only
    np.testing.assert_array_equal(read(tmp_path / "o2.zarr")[1]["e"], [3.0, 4.0])


def test_an_array_named_indices_that_is_not_a_field(tmp_path):
    """Copied with --output values; with both, the job's own indices take the name and the
    array is listed as not copied."""
    src = tmp_path / "g.zarr"
    g = zarr.open_group(store=str(src), mode="w")
    g.create_array("e", shape=(5,), dtype="f8")[:] = np.arange(5.0)
    g.create_array("indices", shape=(3,), dtype="i8")[:] = [7, 8, 9]
    run(src, tmp_path / "o.zarr", "--where", "e > 2")
    np.testing.assert_array_equal(read(tmp_path / "o.zarr")[1]["indices"], [7, 8, 9])
    res = run(src, tmp_path / "o2.zarr", "--where", "e > 2", "-o", "both")
    assert "not copied: --output both writes the row indices there" in res.output
    np.testing.assert_array_equal(read(tmp_path / "o2.zarr")[1]["indices"], [3, 4])


def test_missing_chunk_of_a_field_is_refused_unless_allowed(particles, tmp_path):
    src, data = particles
    (src / "id" / "c" / "1").unlink()  # rows 500..999 of id read as the fill value 0
    out = tmp_path / "out.zarr"
    res = run(src, out, "--where", WHERE, "--fields", "id", code=2)
    assert "id': 1 of its 3 chunks are not in the store" in res.output
    assert not out.exists() and litter(tmp_path) == []
    run(src, out, "--where", WHERE, "--fields", "x")  # id is not read: its chunks not checked
    run(src, out, "--where", WHERE, "--fields", "id", "--allow-missing-chunks", "--overwrite")
    ids = data["id"].copy()
    ids[500:1000] = 0
    np.testing.assert_array_equal(read(out)[1]["id"], ids[mask_of(data)])


@pytest.mark.parametrize("gaps", ["inner chunks", "whole shards"])
def test_missing_chunk_of_a_sharded_field_is_refused_unless_allowed(tmp_path, gaps):
    """A field's chunk never written inside a stored shard is missing too (a probe's group
    with such a field was accepted, and the chunk read as the fill value)."""
    rng = np.random.default_rng(4)
    mass, x = rng.random(1003) * 10, rng.random(1003).astype("f4")
    src = tmp_path / "g.zarr"
    group = zarr.open_group(store=str(src), mode="w")
    group.create_array("mass", shape=(1003,), dtype="f8", chunks=(10,), shards=(30,))[:] = mass
    a = group.create_array("x", shape=(1003,), dtype="f4", chunks=(10,), shards=(30,),
                           fill_value=0.25)
    # inner chunks: shard 0 stored without its chunks 1 and 2; whole shards: shard 0 not stored
    written, missing = ([(0, 10), (30, 1003)], 2) if gaps == "inner chunks" else ([(30, 1003)], 3)
    seen = np.full_like(x, 0.25)
    for lo, hi in written:
        a[lo:hi] = x[lo:hi]
        seen[lo:hi] = x[lo:hi]
    out = tmp_path / "out.zarr"
    res = run(src, out, "--where", WHERE, code=2)
    assert f"x': {missing} of its 101 chunks are not in the store" in res.output
    assert not out.exists() and litter(tmp_path) == []
    run(src, out, "--where", WHERE, "--output", "both", "--allow-missing-chunks")
    m = (mass > 5) & (seen < np.float32(0.3))
    arrays = read(out)[1]
    np.testing.assert_array_equal(arrays["x"], seen[m])
    np.testing.assert_array_equal(arrays["mass"], mass[m])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))


def test_a_group_in_a_zip_file_is_read_through_its_url(tmp_path):
    """``zip://::g.zip`` names the group at the zip file's root: its fields are at
    ``zip://mass::g.zip`` (a probe's job appended ``/mass`` to the whole URL and failed
    partway with NotADirectoryError). A zip file given as a path is refused, and the message
    gives the URL."""
    from zarr.storage import ZipStore

    rng = np.random.default_rng(6)
    mass, x = rng.random(1003) * 10, rng.random(1003).astype("f4")
    src = tmp_path / "g.zip"
    store = ZipStore(src, mode="w")
    group = zarr.open_group(store, mode="w")
    group.create_array("mass", shape=(1003,), dtype="f8", chunks=(100,))[:] = mass
    group.create_array("x", shape=(1003,), dtype="f4", chunks=(333,))[:] = x
    store.close()
    m = (mass > 5) & (x < np.float32(0.3))
    for i, url in enumerate([f"zip://::{src}", f"zip://::file://{src}"]):
        out = tmp_path / f"out{i}.zarr"
        run(url, out, "--where", WHERE, "--output", "both", "--local", "threads")
        arrays = read(out)[1]
        np.testing.assert_array_equal(arrays["mass"], mass[m])
        np.testing.assert_array_equal(arrays["x"], x[m])
        np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))
    res = run(src, tmp_path / "o.zarr", "--where", WHERE, code=2)
    assert f"zip://::{src}" in res.output
    res = run(f"zip://::{src}", tmp_path / "o.zarr", "--where", "x > 0.5", "--fields", "nope",
              code=2)
    assert "'nope' is not an array" in res.output


def test_a_zipped_field_with_missing_chunks_is_named_by_a_url_that_opens(tmp_path):
    """The refusal named ``zip://::/d/g.zip/mass``, which opens nothing (a probe)."""
    from zarr.storage import ZipStore

    src = tmp_path / "g.zip"
    store = ZipStore(src, mode="w")
    group = zarr.open_group(store, mode="w")
    group.create_array("mass", shape=(1003,), dtype="f8", chunks=(100,))[:500] = 1.0
    store.close()
    res = run(f"zip://::{src}", tmp_path / "o.zarr", "--where", "mass > 0", code=2)
    said = "".join(res.output.split())  # click wraps the message
    assert f"'zip://mass::{src}':6ofits11chunksarenotinthestore" in said
    assert zarr.open_array(f"zip://mass::{src}", mode="r").shape == (1003,)


def test_member_url_puts_the_name_where_the_path_is():
    from dask_compact.batch.inputs import member_url

    assert member_url("s3://b/g.zarr/", "x") == "s3://b/g.zarr/x"
    assert member_url("zip://::/d/g.zip", "x") == "zip://x::/d/g.zip"
    assert member_url("zip://sub::s3://b/g.zip", "x") == "zip://sub/x::s3://b/g.zip"
    # a cache in front takes its path from the part after it
    assert member_url("simplecache::s3://b/g", "x") == "simplecache::s3://b/g/x"
    assert (member_url("simplecache::zip://::/d/g.zip", "x")
            == "simplecache::zip://x::/d/g.zip")


def test_fields_needs_a_group(tmp_path):
    path = tmp_path / "a.npy"
    np.save(path, np.arange(10.0))
    res = run(path, tmp_path / "o.zarr", "--where", "x > 1", "--fields", "x", code=2)
    assert "--fields applies to a Zarr group INPUT" in res.output


def test_existing_output_needs_overwrite(particles, tmp_path):
    src, data = particles
    out = tmp_path / "out.zarr"
    run(src, out, "--where", WHERE, "--fields", "id")
    res = run(src, out, "--where", "mass > 9", "--fields", "id", code=2)
    assert "exists" in res.output and "--overwrite" in res.output
    np.testing.assert_array_equal(read(out)[1]["id"], data["id"][mask_of(data)])
    run(src, out, "--where", "mass > 9", "--fields", "id", "--overwrite")
    np.testing.assert_array_equal(read(out)[1]["id"], data["id"][data["mass"] > 9])
    inside = run(src, src / "sub", "--where", WHERE, code=2).output
    assert "must not be INPUT, lie inside it" in " ".join(inside.split())
    assert litter(tmp_path) == []


# -- failures mid-job -----------------------------------------------------------------------------


def _fail_after_first_chunk(monkeypatch) -> None:
    """Writes of output chunks after the first fail (the first is written): the temporary
    group is half written. The wrapper is a closure, so that cloudpickle sends it to worker
    processes by value."""
    real = tasks.write_chunk

    def write_chunk(dest, j, *args):
        if j > 0:
            raise OSError("disk full (simulated)")
        return real(dest, j, *args)

    monkeypatch.setattr(tasks, "write_chunk", write_chunk)


@pytest.mark.parametrize(
    "where_run", [["--local", "threads"], ["--local", "processes", "--workers", "2"]],
    ids=["threads", "processes"],
)
def test_failure_mid_write_leaves_no_output(particles, tmp_path, monkeypatch, where_run):
    src, data = particles
    out = tmp_path / "out.zarr"
    if where_run[1] == "processes":  # the same result on a local cluster, before the failure
        res = run(src, out, "--where", WHERE, "-o", "both", *where_run)
        assert "LocalCluster (2 worker processes)" in res.output
        _, arrays, _ = read(out)
        m = mask_of(data)
        for name, v in data.items():
            np.testing.assert_array_equal(arrays[name], v[m])
    _fail_after_first_chunk(monkeypatch)
    res = run(src, out, "--where", "mass > 1", "-o", "both", "--output-chunks", "100",
              "--overwrite", *where_run, code=1)
    assert "job failed" in res.output and "disk full" in res.output
    if where_run[1] == "processes":  # the previous output, untouched
        attrs, arrays, _ = read(out)
        assert attrs["dask_compact"]["where"] == WHERE
        np.testing.assert_array_equal(arrays["x"], data["x"][mask_of(data)])
    else:
        assert not out.exists()
    assert litter(tmp_path) == []


def test_interrupt_mid_write_cleans_up(particles, tmp_path, monkeypatch):
    src, _ = particles
    out = tmp_path / "out.zarr"
    real = stream._Stream.write_done

    def write_done(self, j, done, chunks):  # Ctrl-C once the first output chunk is written
        real(self, j, done, chunks)
        raise KeyboardInterrupt

    monkeypatch.setattr(stream._Stream, "write_done", write_done)
    res = run(src, out, "--where", WHERE, "--output-chunks", "50", code=130)
    assert "interrupted" in res.output and "was not written" in res.output
    assert not out.exists() and litter(tmp_path) == []


# -- streaming: budget, progress, resume, faults --------------------------------------------------


def test_streams_under_the_memory_budget_with_progress_and_summary(particles, tmp_path):
    """Blocks of 100 rows (every field's chunks straddle them), a budget of about two blocks:
    the job holds at most the budget in flight, reads each block once, and the result is
    NumPy's."""
    src, data = particles
    out = tmp_path / "out.zarr"
    res = run(src, out, "--where", WHERE, "-o", "both", "--chunks", "100", "--output-chunks",
              "30", "--memory-budget", "40kB", "--progress")
    assert "dask compact:" in res.stderr  # the progress bar, on stderr
    assert "budget 40.0 kB" in res.stdout and "task time read" in res.stdout
    m = mask_of(data)
    _, arrays, chunks = read(out)
    for name, v in data.items():
        np.testing.assert_array_equal(arrays[name], v[m])
        assert chunks[name] == (30, *v.shape[1:])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))
    summary = json.loads(run(src, tmp_path / "o2.zarr", "--where", WHERE, "-o", "both",
                             "--chunks", "100", "--memory-budget", "40kB", "--json").stdout)
    row_bytes = sum(np.dtype(dt).itemsize * int(np.prod(tail)) for dt, tail, _ in
                    PARTICLES.values())
    one_block = 100 * (2 * row_bytes + 8)  # its rows, and the worst case of its selection
    assert one_block < 40_000 < 11 * one_block  # so the budget bounds what runs at once
    assert summary["memory_budget"] == 40_000
    assert one_block <= summary["peak_reserved"] <= 40_000
    assert summary["input_chunks"] == summary["chunks_read"] == 11
    assert set(summary["task_seconds"]) == {"read", "compact", "write"}
    # compacted on CPUs, or on a GPU host by default on its GPUs
    assert summary["gpu_chunks"] == (11 if summary["gpu"] else 0)
    assert summary["resumed_from_chunk"] is None


def test_nd_fields_are_written_as_the_chunk_files_zarr_writes(tmp_path):
    """A field with trailing axes goes through the direct chunk-file writer: the files are the
    bytes zarr writes for the same rows (chunk keys ``c/<j>/0/0``)."""
    src = tmp_path / "g.zarr"
    g = zarr.open_group(store=str(src), mode="w")
    rng = np.random.default_rng(9)
    e = rng.random(777)
    cube = rng.integers(-50, 50, (777, 2, 3)).astype(np.int16)
    g.create_array("e", shape=e.shape, dtype=e.dtype, chunks=(100,))[:] = e
    g.create_array("cube", shape=cube.shape, dtype=cube.dtype, chunks=(64, 2, 3))[:] = cube
    out = tmp_path / "out.zarr"
    run(src, out, "--where", "e < 0.6", "--output-chunks", "64")
    m = e < 0.6
    ref = zarr.open_group(store=str(tmp_path / "ref.zarr"), mode="w")
    ref.create_array("cube", shape=(int(m.sum()), 2, 3), dtype=cube.dtype,
                     chunks=(64, 2, 3))[:] = cube[m]
    files = sorted(p.relative_to(out / "cube") for p in (out / "cube" / "c").rglob("*")
                   if p.is_file())
    assert files and all(len(f.parts) == 4 for f in files)  # c/<j>/0/0
    for f in files:
        assert (out / "cube" / f).read_bytes() == (tmp_path / "ref.zarr" / "cube" / f).read_bytes()
    np.testing.assert_array_equal(read(out)[1]["cube"], cube[m])


@pytest.mark.parametrize("where_run", [[], ["--local", "processes", "--workers", "2"]],
                         ids=["threads", "local-cluster"])
def test_resume_after_sigkill_is_bit_identical(particles, tmp_path, where_run):
    src, data = particles
    # an array that is not a field: copied as the temporary group is made, kept on resume
    zarr.open_group(store=str(src), mode="r+").create_array(
        "table", shape=(7,), dtype="i4", chunks=(3,))[:] = np.arange(7) - 3
    args = ["--where", "mass > 2", "-o", "both", "--chunks", "50", "--output-chunks", "40",
            *where_run]
    ref = tmp_path / "ref.zarr"
    full = json.loads(run(src, ref, *args, "--json").stdout)
    out = tmp_path / "out.zarr"
    n_out = -(-full["selected"] // 40)
    kill_halfway(tmp_path, src, out, *args, writes=n_out // 2)
    assert [n for n in litter(tmp_path) if "tmp" in n]  # the interrupted job's group
    resumed = json.loads(run(src, out, *args, "--resume", "--json").stdout)
    assert resumed["resumed_from_chunk"] > 0
    assert resumed["chunks_read"] <= 0.7 * full["chunks_read"], (resumed, full)
    ref_attrs, ref_arrays, _ = read(ref)
    attrs, arrays, _ = read(out)
    assert attrs == ref_attrs and arrays.keys() == ref_arrays.keys()
    for k in arrays:
        assert arrays[k].dtype == ref_arrays[k].dtype
        np.testing.assert_array_equal(arrays[k], ref_arrays[k])
    np.testing.assert_array_equal(arrays["pos"], data["pos"][data["mass"] > 2])
    np.testing.assert_array_equal(arrays["table"], np.arange(7) - 3)
    assert "dask-compact-manifest.json" not in os.listdir(out)
    assert litter(tmp_path) == []


def test_resume_refuses_a_different_record_job(particles, tmp_path):
    src, data = particles
    out = tmp_path / "out.zarr"
    args = ["--where", "mass > 2", "--chunks", "50", "--output-chunks", "40"]
    kill_halfway(tmp_path, src, out, *args, "--fields", "x,id", writes=3)
    res = run(src, out, *args, "--fields", "x,y", "--resume", code=2)
    assert "differs in fields" in res.output
    run(src, out, *args, "--fields", "x,y")  # a run without --resume starts over
    _, arrays, _ = read(out)
    np.testing.assert_array_equal(arrays["y"], data["y"][data["mass"] > 2])
    assert litter(tmp_path) == []


@pytest.mark.parametrize("change", ["kept-array", "group-attribute"])
def test_resume_refuses_a_changed_kept_array_or_group_attribute(particles, tmp_path, change):
    """The arrays copied unchanged and the group's attributes are copied as the temporary
    group is made, not again on resume: a probe changed them between a kill and ``--resume``
    and got the old ones in a complete output. The resume is refused as a changed input."""
    src, data = particles
    g = zarr.open_group(store=str(src), mode="r+")
    g.attrs["run"] = 1
    table = np.random.default_rng(4).random(7)
    g.create_array("table", shape=(7,), dtype="f8", chunks=(3,))[:] = table
    out = tmp_path / "out.zarr"
    args = ["--where", "mass > 2", "--chunks", "50", "--output-chunks", "40"]
    kill_halfway(tmp_path, src, out, *args, writes=3)
    if change == "kept-array":
        table = table * 100
        zarr.open_array(store=str(src / "table"), mode="r+")[:] = table
    else:
        zarr.open_group(store=str(src), mode="r+").attrs["run"] = 2
    res = run(src, out, *args, "--resume", code=2)
    assert "differs in copied" in " ".join(res.output.split())
    run(src, out, *args)  # a run without --resume starts over
    attrs, arrays, _ = read(out)
    np.testing.assert_array_equal(arrays["table"], table)
    assert attrs["run"] == (2 if change == "group-attribute" else 1)
    np.testing.assert_array_equal(arrays["x"], data["x"][data["mass"] > 2])
    assert litter(tmp_path) == []


@pytest.mark.parametrize("change", ["field-chunk", "copied-chunk"])
def test_resume_checks_the_temporary_group_of_a_group_job(particles, tmp_path, change):
    """A killed group job's temporary group changed by hand before ``--resume``: a field's
    output chunk with one byte flipped (same size) is written again; a chunk of an array the
    group copied as it is, changed, starts the job over (it is copied when the group is
    made). It was committed as it was, exit 0, until 2026-12-01. The output is the
    uninterrupted job's."""
    src, data = particles
    g = zarr.open_group(store=str(src), mode="r+")
    table = np.random.default_rng(4).random(7)
    g.create_array("table", shape=(7,), dtype="f8", chunks=(7,))[:] = table
    args = ["--where", "mass > 2", "--chunks", "50", "--output-chunks", "40"]
    out = tmp_path / "out.zarr"
    kill_halfway(tmp_path, src, out, *args, writes=3)
    (left,) = [p for p in tmp_path.iterdir() if "dask-compact-tmp" in p.name]
    f = left / ("x" if change == "field-chunk" else "table") / "c" / ("1" if change ==
                                                                     "field-chunk" else "0")
    raw = bytearray(f.read_bytes())
    raw[-3] ^= 0x40  # a value's byte (random floats are stored as they are)
    f.write_bytes(bytes(raw))
    res = run(src, out, *args, "--resume")
    said = " ".join(res.stderr.split())
    assert ("output chunk 1 of the interrupted job" in said if change == "field-chunk"
            else "starting over" in said), said
    _, arrays, _ = read(out)
    np.testing.assert_array_equal(arrays["table"], table)
    for name in data:
        np.testing.assert_array_equal(arrays[name], data[name][data["mass"] > 2])
    assert litter(tmp_path) == []


def test_corrupted_chunk_of_a_field_is_named(particles, tmp_path):
    src, data = particles
    chunk_file = src / "vx" / "c" / "2"  # rows 500:750 of vx
    good = chunk_file.read_bytes()
    chunk_file.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(200))  # a zstd magic, then junk
    out = tmp_path / "out.zarr"
    res = run(src, out, "--where", WHERE, "--chunks", "300", code=1)
    # input chunks 1 and 2 both read that chunk; either may fail first
    assert re.search(r"field 'vx' of input chunk (1 \(rows 300:600|2 \(rows 600:900)\)",
                     res.output), res.output
    assert not out.exists() and litter(tmp_path) == []
    chunk_file.write_bytes(good)
    run(src, out, "--where", WHERE, "--chunks", "300")
    np.testing.assert_array_equal(read(out)[1]["vx"], data["vx"][mask_of(data)])


def test_raw_compares_the_stored_values_with_a_note(tmp_path):
    """--raw: --where compares the stored numbers, which mean something else than on
    xr.open_zarr's decoded values (a probe's isnan(ffl) selected no row of a float field
    whose NaNs are stored as -999): the summary says so, for the fields --where reads.
    Without --raw, the decoded values (below)."""
    xr = pytest.importorskip("xarray")
    n = 40
    ffl = np.arange(n, dtype="f4")
    ffl[::5] = np.nan
    ds = xr.Dataset({"ffl": ("event", ffl), "id": ("event", np.arange(n))})
    src = tmp_path / "ds.zarr"
    ds.to_zarr(src, zarr_format=2, encoding={"ffl": {"_FillValue": np.float32(-999)}},
               consolidated=False)
    res = run(src, tmp_path / "o.zarr", "--where", "ffl != -999", "--json", "--raw")
    summary = json.loads(res.stdout)
    assert summary["encoded"] == {"ffl": ["_FillValue"]} and summary["decoded"] == {}
    res = run(src, tmp_path / "o2.zarr", "--where", "ffl != -999", "--raw")
    assert "note      --where compares the stored values" in res.output
    assert "--raw" in res.output
    np.testing.assert_array_equal(read(tmp_path / "o2.zarr")[1]["id"],
                                  np.flatnonzero(~np.isnan(ffl)))
    res = run(src, tmp_path / "o3.zarr", "--where", "id > 3")
    assert "note" not in res.output and "decoded" not in res.output  # id has no encoding
    # without --raw: the values xarray reads, NaN where -999 is stored
    res = run(src, tmp_path / "o4.zarr", "--where", "isnan(ffl)", "--json")
    summary = json.loads(res.stdout)
    assert summary["decoded"] == {"ffl": ["_FillValue"]} and summary["encoded"] == {}
    np.testing.assert_array_equal(read(tmp_path / "o4.zarr")[1]["id"],
                                  np.flatnonzero(np.isnan(ffl)))
    res = run(src, tmp_path / "o5.zarr", "--where", "~isnan(ffl)")
    assert "decoded   ffl (_FillValue)" in res.output and "note" not in res.output
    np.testing.assert_array_equal(read(tmp_path / "o5.zarr")[1]["id"],
                                  np.flatnonzero(~np.isnan(ffl)))


# conditions on a fill value as stored (ffl: -999; t, a packed int16: -32768) or decoded
# (t: -32768 * 0.01 + 273.15), and the rows they select of the stored numbers (--raw)
ON_FILL_VALUES = {
    "ffl != -999": lambda g: g["ffl"] != -999,
    "ffl == -999": lambda g: g["ffl"] == -999,
    "-999 < ffl": lambda g: -999 < g["ffl"],
    "(id > 2) & (ffl != -999.0)": lambda g: (g["id"] > 2) & (g["ffl"] != -999),
    "-999 <= ffl < 30": lambda g: (-999 <= g["ffl"]) & (g["ffl"] < 30),
    "t != -32768": lambda g: g["t"] != -32768,
    "t > -54.53": lambda g: g["t"] > -54.53,
}


@pytest.mark.parametrize("where", list(ON_FILL_VALUES))
def test_a_condition_on_a_fill_value_of_a_decoded_field_is_refused(tmp_path, where):
    """A condition written on the stored numbers, as the command advised before --where read
    decoded values ("x != -999 for a fill value"): read decoded, the fill values are NaN and
    "ffl != -999" kept the fill rows (a review: 8 rows before, 10 after, exit 0). Refused
    before anything runs, saying why, what to write and that --raw compares the stored
    numbers; --raw runs it as before, a literal that is no fill value runs decoded."""
    xr = pytest.importorskip("xarray")
    n = 40
    ffl = np.arange(n, dtype="f8")
    ffl[::5] = np.nan
    t = np.linspace(250, 320, n)
    t[1::6] = np.nan
    ds = xr.Dataset({"ffl": ("event", ffl), "t": ("event", t), "id": ("event", np.arange(n))})
    src = tmp_path / "ds.zarr"
    ds.to_zarr(src, zarr_format=2, consolidated=False, encoding={
        "ffl": {"_FillValue": -999.0},
        "t": {"dtype": "int16", "scale_factor": 0.01, "add_offset": 273.15,
              "_FillValue": -32768}})
    out = tmp_path / "o.zarr"
    res = run(src, out, "--where", where, code=2)
    said = " ".join(res.output.split())
    name = "t" if "t " in where else "ffl"
    assert "Invalid value for --where" in said and "a fill value of" in said, said
    assert f"isnan({name})" in said and "--raw" in said and "decoded" in said
    assert not out.exists() and litter(tmp_path) == []
    run(src, out, "--where", where, "--raw")
    stored = {k: a[...] for k, a in zarr.open_group(str(src), mode="r").arrays()}
    np.testing.assert_array_equal(read(out)[1]["id"],
                                  np.flatnonzero(ON_FILL_VALUES[where](stored)))


def test_a_number_that_is_no_fill_value_runs_decoded(tmp_path):
    """Only the fill values are refused: "ffl != -998" compares the decoded values (NaN !=
    -998: the fill rows kept, as xarray's ds.where would)."""
    xr = pytest.importorskip("xarray")
    ffl = np.arange(20, dtype="f8")
    ffl[::5] = np.nan
    src = tmp_path / "ds.zarr"
    xr.Dataset({"ffl": ("event", ffl), "id": ("event", np.arange(20))}).to_zarr(
        src, consolidated=False, encoding={"ffl": {"_FillValue": -999.0}})
    res = run(src, tmp_path / "o.zarr", "--where", "(ffl != -998) & (id != -999)")
    assert "decoded   ffl (_FillValue)" in res.output
    np.testing.assert_array_equal(read(tmp_path / "o.zarr")[1]["id"], np.arange(20))


def test_a_predicate_refused_on_a_decoded_field_says_so(tmp_path):
    """Bit operations on a packed integer field: the predicate reads it decoded (a float),
    so they are refused; the message says why and names --raw, which allows them."""
    xr = pytest.importorskip("xarray")
    ds = xr.Dataset({"q": ("event", np.linspace(0, 3, 50))})
    src = tmp_path / "ds.zarr"
    ds.to_zarr(src, consolidated=False,
               encoding={"q": {"dtype": "int16", "scale_factor": 0.5, "_FillValue": -1}})
    res = run(src, tmp_path / "o.zarr", "--where", "(q & 1) == 1", code=2)
    assert "q as float64 (stored int16)" in res.output and "--raw" in res.output
    run(src, tmp_path / "o.zarr", "--where", "(q & 1) == 1", "--raw")
    stored = zarr.open_group(str(src), mode="r")["q"][...]
    np.testing.assert_array_equal(read(tmp_path / "o.zarr")[1]["q"], stored[stored & 1 == 1])


# (stored dtype, xarray's encoding, range of the decoded values, --fields): the packings
# xarray writes, the predicate's field written too or not
CF_PACKINGS = {
    "int16": ("int16", {"scale_factor": 0.01, "add_offset": 273.15, "_FillValue": -32768},
              (250, 320), None),
    "int8": ("int8", {"scale_factor": 0.5, "_FillValue": -128}, (-60, 60), "e"),
    "uint16": ("uint16", {"scale_factor": 0.001, "add_offset": -10.0, "_FillValue": 65535},
               (-10, 55), None),
    "float32": ("float32", {"scale_factor": 0.1, "add_offset": 3.0}, (-5, 5), "e"),
}


@pytest.mark.parametrize("zarr_format", [2, 3])
@pytest.mark.parametrize("packing", list(CF_PACKINGS))
def test_where_compares_the_values_xarray_decodes(tmp_path, packing, zarr_format):
    """A field xarray packed (scale_factor, add_offset, _FillValue): --where compares what
    xr.open_zarr gives, fill values as NaN, exactly at the boundary (a decoded value of the
    data, its packed neighbours on either side), and the output, written as stored with the
    encoding's attributes, opens in xarray as ds.isel of that selection (a user's "t > 300"
    had compared the packed integers)."""
    xr = pytest.importorskip("xarray")
    dtype, encoding, span, fields = CF_PACKINGS[packing]
    rng = np.random.default_rng(zarr_format)
    n = 1025
    t = rng.uniform(*span, n)
    if "_FillValue" in encoding:
        t[rng.random(n) < 0.1] = np.nan
    step = encoding.get("scale_factor", 1.0)
    mid = (span[0] + span[1]) / 2
    t[:3] = mid, mid + step, mid - step  # the boundary and its neighbours, once packed
    ds = xr.Dataset({"t": ("event", t), "e": ("event", rng.random(n))})
    src = tmp_path / "ds.zarr"
    ds.to_zarr(src, zarr_format=zarr_format, consolidated=False,
               encoding={"t": {**encoding, "dtype": dtype, "chunks": 100}})
    read_back = xr.open_zarr(src, consolidated=False).load()
    at = float(read_back.t.values[0])  # a decoded value: the boundary
    where = f"(t >= {at!r}) | (isnan(t) & (e < 0.5))"
    out = tmp_path / "out.zarr"
    res = run(src, out, "--where", where, "--output", "both", "--json",
              *(["--fields", fields] if fields else []))
    dt = read_back.t.values
    m = (dt >= at) | (np.isnan(dt) & (read_back.e.values < 0.5))
    assert m[0] and m[1] and not m[2] and 0 < m.sum() < n
    want = read_back.isel(event=np.flatnonzero(m))
    got = xr.open_zarr(out, consolidated=False).load()
    np.testing.assert_array_equal(got.indices.values, np.flatnonzero(m))
    names = [fields] if fields else ["t", "e"]
    xr.testing.assert_identical(got[names].drop_attrs(deep=False), want[names])
    assert json.loads(res.stdout)["decoded"]["t"][-1] in ("scale_factor", "add_offset")
    if not fields:  # the stored values, with the attributes that decode them
        stored = zarr.open_group(str(src), mode="r")["t"][...]
        np.testing.assert_array_equal(zarr.open_group(str(out), mode="r")["t"][...],
                                      stored[m])


def test_resume_of_a_job_that_compared_stored_values_names_raw(tmp_path):
    """A group job interrupted before --where read CF-encoded fields decoded compared the
    stored values; its identity has no "decoded", which --raw gives. The refusal of a plain
    --resume says to add --raw ("run it with the same arguments" could not work), and
    --resume --raw continues it to the stored values' selection."""
    xr = pytest.importorskip("xarray")
    n = 1000
    ffl = np.random.default_rng(8).uniform(0, 20, n)
    ffl[::7] = np.nan
    src = tmp_path / "ds.zarr"
    xr.Dataset({"ffl": ("event", ffl), "id": ("event", np.arange(n))}).to_zarr(
        src, consolidated=False, encoding={"ffl": {"_FillValue": -999.0}})
    out = tmp_path / "out.zarr"
    args = ["--where", "ffl > 10", "--chunks", "50", "--output-chunks", "40"]
    kill_halfway(tmp_path, src, out, *args, "--raw", writes=3)  # the earlier job's identity
    res = run(src, out, *args, "--resume", code=2)
    said = " ".join(res.output.split())
    assert "compared the stored values of ffl" in said and "add --raw" in said, said
    assert "same arguments" not in said
    run(src, out, *args, "--resume", "--raw")
    stored = zarr.open_group(str(src), mode="r")["ffl"][...]
    np.testing.assert_array_equal(read(out)[1]["id"], np.flatnonzero(stored > 10))
    assert litter(tmp_path) == []


def test_a_worker_keeps_a_bounded_number_of_record_predicates():
    """A long-lived worker running record jobs (``--scheduler-file``) of ever new ``--where``
    constants keeps at most ``memory-entries`` checked predicates, each still exact. Until
    2026-12-01 (fourteenth session, a long-running probe) ``record_tasks._predicate`` kept one
    per (where, fields) for the process's life: +3.6 kB a new ``--where``, 72 MiB after 20,000."""
    import dask

    from dask_compact.batch import record_tasks
    from dask_compact.records import compact_records

    rng = np.random.default_rng(3)
    blocks = {"x": rng.random(1001), "mass": rng.random(1001) * 10}
    with dask.config.set({"dask-compact.cache.memory-entries": 8}):
        for i in range(40):
            cut = i / 40
            pred = record_tasks._predicate(f"(mass > 5) & (x < {cut!r})", blocks)
            assert len(record_tasks._checked) <= 8
            got = compact_records(blocks, pred)
            keep = (blocks["mass"] > 5) & (blocks["x"] < cut)
            for name, v in blocks.items():
                np.testing.assert_array_equal(got[name], v[keep])


def _tree(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("dtype", ["datetime64[s]", "<M8[D]", "timedelta64[ms]"])
def test_where_on_a_time_field_is_told_raw_and_runs_with_it(tmp_path, dtype):
    """--where reading a datetime64/timedelta64 field was refused in compact_records' words,
    "datetime64 and timedelta64 arrays are taken by map_compact, compact, ...", calls of the
    Python API and no way out on the command line (until 2026-12-02, seventeenth session,
    the sixteenth's leftover). Refused now with what --raw compares (the stored int64
    counts, NaT the least int64) and a --where that runs: run as written, and with the
    refusal's NaT guard on a <, each gives NumPy's rows for the time the refusal names;
    INPUT untouched and no OUTPUT on the refusal."""
    rng = np.random.default_rng(3)
    n = 1031
    kind = np.dtype(dtype)
    if kind.kind == "M":
        t = (np.datetime64("2020-01-01", "D") + rng.integers(-400, 400, n)).astype(kind)
    else:
        t = (rng.integers(0, 6 * 3600 * 1000, n)).astype("m8[ms]").astype(kind)
    t[rng.random(n) < 0.1] = np.array("NaT").astype(kind)
    v = rng.random(n)
    src = tmp_path / "times.zarr"
    g = zarr.open_group(str(src), mode="w")
    g.create_array("t", shape=(n,), dtype=kind, chunks=(100,))[:] = t
    g.create_array("v", shape=(n,), dtype="f8", chunks=(333,))[:] = v
    before = _tree(src)
    out = tmp_path / "o.zarr"
    res = run(src, out, "--where", "(t > 3) & (v > 0.2)", "--local", "threads", code=2)
    said = " ".join(res.output.split())
    assert "compares numbers, not times" in said and "-9223372036854775808" in said, said
    assert not re.search("map_compact|compact_records|compact_array", said), said
    assert _tree(src) == before and not out.exists() and litter(tmp_path) == []
    (where, count, shown) = re.findall(r'--raw --where "(t > (\d+))" for the rows '
                                       r"(?:after|longer than) ([^;]+);", said)[0]
    unit = np.datetime_data(kind)[0]
    when = (np.datetime64(shown) if kind.kind == "M"
            else np.timedelta64(int(shown.split()[0]), unit))
    assert np.array([when]).astype(kind).astype(np.int64)[0] == int(count)
    for raw_where, mask in ((where, t > when),
                            (f"(t < {count}) & (t != -9223372036854775808) & (v > 0.2)",
                             (t < when) & (v > 0.2))):
        res = run(src, out, "--raw", "--where", raw_where, "--output", "both", "--local",
                  "threads", "--overwrite")
        assert "counted   t: --raw compares its stored int64 counts" in res.output
        _, got, _ = read(out)
        assert 0 < mask.sum() < n
        np.testing.assert_array_equal(got["indices"], np.flatnonzero(mask))
        np.testing.assert_array_equal(got["t"], t[mask])
        assert got["t"].dtype == kind
        np.testing.assert_array_equal(got["v"], v[mask])
    assert _tree(src) == before


def test_where_on_a_time_xarray_wrote_is_refused_without_raw_and_compares_counts_with_it(
        tmp_path):  # fmt: skip
    """xarray writes datetimes as int64 counts with CF units ("days since 2020-01-01") and
    timedeltas as counts with a time unit and ``dtype: "timedelta64[ns]"``; the predicate
    compares numbers. A group's field read by --where is refused without --raw, as a
    datetime64 field is, naming the stored count of an example: until 2026-12-07 (forty-seventh
    session, a new-user probe) it ran on the counts with a note (``time2 > 1577836800``, seconds
    since 1970, selected nothing from days since 2000), and a timedelta with no note at all.
    With --raw, and for a one-array INPUT (read as stored, as da.from_zarr reads it), the
    note names the field and its units and the rows are NumPy's on the stored counts."""
    xr = pytest.importorskip("xarray")
    n = 40
    when = np.datetime64("2020-01-01") + (np.arange(n) * 7 % 11).astype("m8[D]")
    when[3] = np.datetime64("NaT")
    took = (np.arange(n) % 9 * 3600 * 10**9).astype("m8[ns]")
    ds = xr.Dataset({"v": ("time", np.arange(n) * 0.5), "when": ("time", when),
                     "took": ("time", took)})
    ds.when.encoding = {"units": "days since 2000-01-01", "dtype": "int64"}
    ds.took.encoding = {"units": "hours", "dtype": "int64"}
    ds.to_zarr(tmp_path / "in.zarr", consolidated=False, zarr_format=3)
    group = zarr.open_group(str(tmp_path / "in.zarr"), mode="r")
    stored, hours = group["when"], group["took"]
    assert stored.dtype == np.int64 and stored.attrs["units"] == "days since 2000-01-01"
    assert hours.attrs["units"] == "hours" and hours.attrs["dtype"] == "timedelta64[ns]"
    counts = stored[...]
    out = tmp_path / "o.zarr"
    for where, hint in (("(when > 5) & (v > 3)", '--raw --where "when > 7305" for the rows '
                         "after 2020-01-01"),
                        ("took > 2", '--raw --where "took > 3" for the rows longer than 3 '
                         "hours")):
        res = run(tmp_path / "in.zarr", out, "--where", where, code=2)
        said = " ".join(res.output.split())
        assert "compares numbers, not times" in said and hint in said, said
        assert f"NaT is stored as {np.iinfo(np.int64).min}" in said, said
        assert not out.exists() and litter(tmp_path) == []
    # the example's count is the stored count of that time, as xarray encodes it
    assert ((np.datetime64("2020-01-01") - np.datetime64("2000-01-01")).astype(int) == 7305
            and counts[0] == 7305)
    for src, where, mask in ((tmp_path / "in.zarr", "(when > 7305) & (v > 3) & (took > 2)",
                              (counts > 7305) & (ds.v.values > 3) & (hours[...] > 2)),
                             (tmp_path / "in.zarr" / "when", "x > 7305", counts > 7305)):
        flags = ("--raw",) if src.name == "in.zarr" else ()
        res = run(src, out, *flags, "--where", where, "--output", "indices", "--local",
                  "threads", "--overwrite")
        said = " ".join(res.output.split())
        assert re.search(r"note --where compares the stored values, which xarray decodes for "
                         r"(took \(units; --raw\), when|x) \(units", said), said
        if not flags:
            assert f"{stored.attrs['units']!r}" in said, said
        assert 0 < mask.sum() < n - 1
        np.testing.assert_array_equal(read(out)[1]["indices"], np.flatnonzero(mask))


@pytest.mark.parametrize("named", ["run1", "run1/q"])
def test_fields_naming_a_subgroup_or_its_array_says_to_give_the_subgroup(tmp_path, named):
    """--fields naming a subgroup, or an array in it by path (run1/q), was told "'run1/q' is
    not an array of the Zarr group (its arrays: ...)", no word of the subgroup, which the job
    leaves out (until 2026-12-02, seventeenth session, a new-user probe): it says the
    subgroup's arrays are no fields of this record and gives the subgroup as an INPUT, which
    runs; no OUTPUT on the refusal."""
    src = tmp_path / "g.zarr"
    root = zarr.open_group(str(src), mode="w")
    root.create_array("x", shape=(9,), chunks=(4,), dtype="f8")[:] = np.arange(9.0)
    q = np.arange(1.0, 10.0)[::-1].copy()  # no chunk of fill values (never written)
    root.create_group("run1").create_array("q", shape=(9,), chunks=(4,), dtype="f8")[:] = q
    out = tmp_path / "o.zarr"
    res = run(src, out, "--where", "x > 2", "--fields", f"x,{named}", code=2)
    said = " ".join(res.output.split())
    assert "'run1' is a subgroup" in said and f"e.g. {src}/run1" in said, said
    assert not out.exists() and litter(tmp_path) == []
    run(src / "run1", out, "--where", "q > 2")
    np.testing.assert_array_equal(read(out)[1]["q"], q[q > 2])
