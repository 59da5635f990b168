"""The batch CLI (`dask compact`, `python -m dask_compact`): results against NumPy, the
output's all-or-nothing contract, and short errors with a non-zero exit code."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import dask
import numpy as np
import pytest

zarr = pytest.importorskip("zarr")
from cli_helpers import kill_halfway, litter
from click.testing import CliRunner
from gpu_helpers import device_count

from dask_compact import cli

BIN = Path(sys.executable).parent


def run(*args: str, code: int = 0):
    result = CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    return result


def read_group(path: Path) -> tuple[dict, dict]:
    g = zarr.open_group(store=str(path), mode="r")
    return dict(g.attrs), {name: a[:] for name, a in g.arrays()}


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if "dask-compact-tmp" in p.name)


@pytest.fixture
def npy(tmp_path: Path) -> tuple[Path, np.ndarray]:
    a = np.random.default_rng(42).random(10_000)
    path = tmp_path / "in.npy"
    np.save(path, a)
    return path, a


@pytest.fixture
def zarr2d(tmp_path: Path) -> tuple[Path, np.ndarray]:
    # Chunks split along both axes: the CLI must still give C-order values and indices.
    a = np.random.default_rng(7).standard_normal((60, 50)).astype(np.float32)
    path = tmp_path / "in2d.zarr"
    z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(16, 20))
    z[:] = a
    return path, a


def test_npy_both_matches_numpy(npy, tmp_path):
    path, a = npy
    out = tmp_path / "out.zarr"
    res = run(path, out, "--where", "x > 0.7", "--output", "both", "--chunks", "3000")
    attrs, arrays = read_group(out)
    m = a > 0.7
    np.testing.assert_array_equal(arrays["values"], a[m])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))
    assert arrays["indices"].dtype == np.int64
    assert attrs["dask_compact"]["complete"] is True
    assert attrs["dask_compact"]["selected"] == m.sum()
    assert f"selected  {m.sum():,}" in res.stdout
    assert "GB/s" in res.stdout
    assert leftovers(tmp_path) == []


def test_chunks_longer_than_the_input(npy, tmp_path):
    """--chunks far beyond the rows: one read, and output chunks no longer than the input
    (the default output chunk was --chunks itself, padded to full length by zarr)."""
    path, a = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.7", "--output", "both", "--chunks", str(10**12))
    g = zarr.open_group(str(out), mode="r")
    assert g["values"].chunks == (a.size,)
    np.testing.assert_array_equal(g["values"][:], a[a > 0.7])
    np.testing.assert_array_equal(g["indices"][:], np.flatnonzero(a > 0.7))
    # an --output-chunks beyond the input likewise (10^9 float64 was a 7.45 GiB padded chunk)
    out2 = tmp_path / "out2.zarr"
    run(path, out2, "--where", "x > 0.7", "--output-chunks", str(10**9))
    g2 = zarr.open_group(str(out2), mode="r")
    assert g2["values"].chunks == (a.size,)
    np.testing.assert_array_equal(g2["values"][:], a[a > 0.7])


def test_zarr_nd_in_c_order(zarr2d, tmp_path):
    path, a = zarr2d
    out = tmp_path / "out.zarr"
    run(path, out, "-w", "(x > 0.5) | (x < -1.5)", "-o", "both", "--output-chunks", "100")
    _, arrays = read_group(out)
    m = (a > 0.5) | (a < -1.5)
    np.testing.assert_array_equal(arrays["values"], a[m])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))
    assert zarr.open_array(store=str(out / "values"), mode="r").chunks == (100,)


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_values_keep_the_input_attributes_and_dimension_name(tmp_path, zarr_format):
    """The selected values are still what the input's attributes describe (units, a
    description): they were written without them (a probe); a 1-D input's dimension name goes
    to both arrays, N-D input's (flattened) to neither."""
    rng = np.random.default_rng(4)
    a = rng.random(1031)
    src = tmp_path / "a.zarr"
    dims = {"dimension_names": ("time",)} if zarr_format == 3 else {}
    attrs = {"units": "K", "long_name": "temperature"}
    z = zarr.create_array(store=str(src), shape=a.shape, dtype=a.dtype, chunks=(200,),
                          zarr_format=zarr_format, **dims,
                          attributes={**attrs, **({"_ARRAY_DIMENSIONS": ["time"]}
                                                  if zarr_format == 2 else {})})
    z[:] = a
    out = tmp_path / "out.zarr"
    run(src, out, "-w", "x > 0.3", "-o", "both")
    values = zarr.open_array(store=str(out / "values"), mode="r")
    indices = zarr.open_array(store=str(out / "indices"), mode="r")
    got = dict(values.attrs)
    # a v2 array with dimension names (xarray's) also gets its fill value as xarray's marker
    assert got.pop("_FillValue", None) == ("AAAAAAAAAAA=" if zarr_format == 2 else None)
    assert got == attrs and dict(indices.attrs) == {}
    assert values.metadata.dimension_names == indices.metadata.dimension_names == ("time",)
    np.testing.assert_array_equal(values[:], a[a > 0.3])
    z2 = zarr.create_array(store=str(tmp_path / "b.zarr"), shape=(40, 30), dtype="f8",
                           chunks=(10, 30), dimension_names=("y", "x"), attributes=attrs)
    z2[:] = rng.random((40, 30))
    run(tmp_path / "b.zarr", tmp_path / "o2.zarr", "-w", "x > 0.3")
    values = zarr.open_array(store=str(tmp_path / "o2.zarr" / "values"), mode="r")
    assert dict(values.attrs) == attrs and values.metadata.dimension_names is None


def test_indices_only_and_json_summary(npy, tmp_path):
    path, a = npy
    out = tmp_path / "idx.zarr"
    res = run(path, out, "--where", "x < 0.1", "--output", "indices", "--json")
    summary = json.loads(res.stdout)
    _, arrays = read_group(out)
    assert list(arrays) == ["indices"]
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a < 0.1))
    assert summary["selected"] == int((a < 0.1).sum())
    assert summary["elements"] == a.size and summary["bytes"] == a.nbytes


def test_nothing_selected_writes_empty_arrays(npy, tmp_path):
    path, a = npy
    out = tmp_path / "empty.zarr"
    run(path, out, "--where", "x > 2", "--output", "both")
    attrs, arrays = read_group(out)
    assert arrays["values"].shape == (0,) and arrays["values"].dtype == a.dtype
    assert arrays["indices"].shape == (0,)
    assert attrs["dask_compact"]["complete"] is True


def test_nd_npy_integer(tmp_path):
    a = np.random.default_rng(3).integers(-100, 100, size=(40, 7, 3), dtype=np.int16)
    np.save(tmp_path / "cube.npy", a)
    run(tmp_path / "cube.npy", tmp_path / "o.zarr", "-w", "x >= 50", "--chunks", "9", "-o", "both")
    _, arrays = read_group(tmp_path / "o.zarr")
    np.testing.assert_array_equal(arrays["values"], a[a >= 50])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a >= 50))


def _zero_d(tmp_path: Path, kind: str, x: np.ndarray) -> Path:
    """``x`` (0-d) saved as INPUT of the ``kind`` given."""
    if kind == "npy":
        np.save(tmp_path / "scalar.npy", x)
        return tmp_path / "scalar.npy"
    path = tmp_path / f"scalar-{kind}.zarr"
    zarr.create_array(store=str(path), data=x, zarr_format=2 if kind == "zarr2" else 3,
                      overwrite=True)
    return path


@pytest.mark.parametrize("kind", ["npy", "zarr3", "zarr2"])
def test_a_0d_input_is_one_element_as_numpy_ravels_it(tmp_path, kind):
    """A 0-d INPUT is compacted as ``x.ravel()``, one element, as ``compact_array`` takes a
    0-d array: 1-D arrays of 0 or 1 elements, ``values`` NumPy's ``x.ravel()[m]`` and
    ``indices`` its ``np.flatnonzero(m)``. Until 2026-12-02 (nineteenth session, a probe) the
    command refused it ("holds a 0-d array (a scalar): nothing to compact") where the
    in-memory calls took it."""
    import dask_compact

    for value in (0.7, 0.2):  # selected, then not
        x = np.asarray(np.float32(value))
        src = _zero_d(tmp_path, kind, x)
        m = x.ravel() > 0.5
        for mode, names in (("both", ["indices", "values"]), ("values", ["values"]),
                            ("indices", ["indices"])):
            out = tmp_path / f"o-{value}-{mode}.zarr"
            res = run(src, out, "-w", "x > 0.5", "-o", mode, "--json")
            attrs, arrays = read_group(out)
            assert sorted(arrays) == names
            if "values" in arrays:
                assert arrays["values"].dtype == x.dtype
                np.testing.assert_array_equal(arrays["values"], x.ravel()[m], strict=True)
                # the in-memory call's answer, which the command now agrees with
                np.testing.assert_array_equal(arrays["values"],
                                              dask_compact.compact_array(x, "x > 0.5"))
            if "indices" in arrays:
                np.testing.assert_array_equal(arrays["indices"],
                                              np.flatnonzero(m).astype(np.int64), strict=True)
            assert attrs["dask_compact"]["input_shape"] == []  # the input's own shape
            assert json.loads(res.stdout)["selected"] == int(m.sum())


def test_existing_output_needs_overwrite(npy, tmp_path):
    path, a = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    res = run(path, out, "--where", "x > 0.9", code=2)
    assert "exists" in res.output and "--overwrite" in res.output
    np.testing.assert_array_equal(read_group(out)[1]["values"], a[a > 0.5])  # untouched
    run(path, out, "--where", "x > 0.9", "--overwrite")
    attrs, arrays = read_group(out)
    np.testing.assert_array_equal(arrays["values"], a[a > 0.9])
    assert attrs["dask_compact"]["where"] == "x > 0.9"
    assert leftovers(tmp_path) == []


def _fail_in_write_phase(monkeypatch, exc: type[BaseException]) -> None:
    """The write of output chunk 1 fails (chunk 0 is written): the group is half written.

    The wrapper is a closure, so a distributed worker gets it by value (the patched module
    attribute alone would be looked up afresh there)."""
    from dask_compact.batch import stream, tasks

    real = tasks.write_chunk

    def failing(dest, j, *args):
        if j == 1:
            raise exc("disk full (simulated)")
        return real(dest, j, *args)

    monkeypatch.setattr(stream.tasks, "write_chunk", failing)


@pytest.mark.parametrize(
    "where_run", [[], ["--local", "processes", "--workers", "2", "--progress"]],
    ids=["threads", "local-cluster"],
)
def test_failure_mid_write_leaves_no_output(npy, tmp_path, monkeypatch, where_run):
    path, _ = npy
    out = tmp_path / "out.zarr"
    _fail_in_write_phase(monkeypatch, OSError)
    res = run(path, out, "--where", "x > 0.1", "-o", "both", "--output-chunks", "500", *where_run,
              code=1)
    assert "job failed" in res.output and "disk full" in res.output
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_failure_keeps_previous_output(npy, tmp_path, monkeypatch):
    path, a = npy
    out = tmp_path / "out.zarr"
    run(path, out, "--where", "x > 0.5")
    _fail_in_write_phase(monkeypatch, OSError)
    run(path, out, "--where", "x > 0.1", "--overwrite", "--output-chunks", "500", code=1)
    attrs, arrays = read_group(out)
    assert attrs["dask_compact"]["where"] == "x > 0.5"
    np.testing.assert_array_equal(arrays["values"], a[a > 0.5])
    assert leftovers(tmp_path) == []


def test_interrupt_mid_write_cleans_up(npy, tmp_path, monkeypatch):
    path, _ = npy
    out = tmp_path / "out.zarr"
    _fail_in_write_phase(monkeypatch, KeyboardInterrupt)
    result = CliRunner().invoke(cli.main, [str(path), str(out), "-w", "x > 0.1",
                                           "--output-chunks", "500"])
    assert result.exit_code != 0
    assert not out.exists()
    assert leftovers(tmp_path) == []


def test_url_output_marked_complete_after_move(npy, monkeypatch):
    # fsspec's in-memory file system stands in for an object store (no atomic rename); the
    # command refuses it as OUTPUT (it ends with the process), but this one runs in-process
    import fsspec

    from dask_compact.batch import output

    monkeypatch.setattr(output, "EPHEMERAL_PROTOCOLS", ())
    path, a = npy
    fs = fsspec.filesystem("memory")
    url = "memory://cli-test/out.zarr"
    try:
        # threads: an in-memory file system exists only in this process, not on workers
        run(path, url, "--where", "x > 0.3", "-o", "both", "--local", "threads")
        g = zarr.open_group(store=url, mode="r")
        assert g.attrs["dask_compact"]["complete"] is True
        np.testing.assert_array_equal(g["values"][:], a[a > 0.3])
        assert [p for p in fs.ls("/cli-test", detail=False) if "tmp" in p] == []
        res = run(path, url, "--where", "x > 0.3", "--local", "threads", code=2)
        assert "--overwrite" in res.output
    finally:
        fs.rm("/cli-test", recursive=True)


@pytest.mark.parametrize("scheme", ["file://", "local://"])
def test_local_file_system_urls_are_paths(npy, tmp_path, scheme):
    """fsspec's local file system makes no parent folders: a ``local://`` OUTPUT failed on
    its own temporary group (FileNotFoundError). Both spellings of the local file system are
    taken as paths, for INPUT and OUTPUT (with a lock and an atomic rename)."""
    path, a = npy
    zpath = tmp_path / "in.zarr"
    zarr.create_array(store=str(zpath), shape=a.shape, chunks=(3_000,), dtype=a.dtype)[:] = a
    out = tmp_path / "new" / "out.zarr"
    run(f"{scheme}{zpath}", f"{scheme}{out}", "--where", "x > 0.3", "-o", "both",
        "--local", "threads")
    attrs, arrays = read_group(out)
    assert attrs["dask_compact"]["complete"] is True
    np.testing.assert_array_equal(arrays["values"], a[a > 0.3])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a > 0.3))
    run(path, f"{scheme}{out}", "--where", "x > 0.6", "--overwrite", "--local", "threads")
    np.testing.assert_array_equal(read_group(out)[1]["values"], a[a > 0.6])
    assert leftovers(out.parent) == []


@pytest.mark.parametrize(
    "where, message",
    [
        ("y > 0.5", "--where"),  # a name other than x
        ("x >", "--where"),  # not an expression
        ("x + 1", "--where"),  # not boolean
        ("__import__('os').system('true')", "--where"),  # never evaluated
    ],
)
def test_bad_predicate(npy, tmp_path, where, message):
    path, _ = npy
    res = run(path, tmp_path / "o.zarr", "--where", where, code=2)
    assert message in res.output
    assert not (tmp_path / "o.zarr").exists()


def test_input_errors(tmp_path, zarr2d):
    out = tmp_path / "o.zarr"
    assert "does not exist" in run(tmp_path / "missing.zarr", out, "-w", "x > 0", code=2).output
    (tmp_path / "notes.txt").write_text("hello")
    assert "not a .npy" in run(tmp_path / "notes.txt", out, "-w", "x > 0", code=2).output
    np.save(tmp_path / "dates.npy", np.arange(5).astype("datetime64[s]"))
    assert "dtype" in run(tmp_path / "dates.npy", out, "-w", "x > 0", code=2).output
    np.save(tmp_path / "words.npy", np.array(["a", "b"]))
    assert "dtype" in run(tmp_path / "words.npy", out, "-w", "x > 0", code=2).output
    np.save(tmp_path / "objects.npy", np.array([{}, 1], dtype=object))
    assert "memory-map" in run(tmp_path / "objects.npy", out, "-w", "x > 0", code=2).output
    # a file named .npy without NumPy's header: np.load calls it pickled data (a probe)
    for name, raw in (("garbage.npy", b"garbage"), ("empty.npy", b"")):
        (tmp_path / name).write_bytes(raw)
        res = run(tmp_path / name, out, "-w", "x > 0", code=2)
        assert "is not a .npy file (it does not start with NumPy's header" in res.output
        assert "pickled" not in res.output
    group = tmp_path / "group.zarr"
    zarr.open_group(store=str(group), mode="w").create_array("data", shape=(4,), dtype="f8")
    res = run(group, out, "-w", "x > 0", code=2)
    assert "group" in res.output and "data" in res.output
    path, _ = zarr2d
    assert "must not be INPUT" in run(path, path, "-w", "x > 0", "--overwrite", code=2).output
    assert not out.exists()


def test_a_memory_url_input_with_nothing_there_says_why(tmp_path):
    """fsspec's in-memory file system belongs to one process: the command starts with it
    empty. A new-user probe's ``memory://a3.zarr`` INPUT was refused with zarr's
    "GroupNotFoundError: No group found in store StorePath(FsspecStore, ...)", which did not
    say that nothing written there by another process can be seen."""
    out = tmp_path / "o.zarr"
    for url in ("memory://nothing-here/a.zarr", "simplecache::memory://nothing-here/a.zarr"):
        said = " ".join(run(url, out, "-w", "x > 0", code=2).output.split())
        assert "in-memory file system" in said and "empty when this command starts" in said
    assert not out.exists()


def test_a_name_with_colons_that_no_fsspec_url_is_refused_before_the_job(zarr2d, tmp_path,
                                                                          monkeypatch):
    """zarr reads every name with '::' as fsspec's chained URL: an OUTPUT named
    ``sel::v1.zarr`` started the job and failed with a FileNotFoundError of a ``.sel``
    folder, an INPUT folder ``a::b.zarr`` with zarr's GroupNotFoundError of ``a`` (a new-user
    probe). Both are refused before anything runs, naming the part that is no protocol;
    the chained URLs fsspec reads still run."""
    path, a = zarr2d
    work = tmp_path / "w"
    work.mkdir()
    monkeypatch.chdir(work)
    said = " ".join(run(path, "sel::v1.zarr", "-w", "x > 0", code=2).output.split())
    assert "Invalid value for OUTPUT" in said and "'sel' is no protocol fsspec knows" in said
    (work / "a::b.zarr").mkdir()
    said = " ".join(run("a::b.zarr", "o.zarr", "-w", "x > 0", code=2).output.split())
    assert "Invalid value for INPUT" in said and "'a' is no protocol fsspec knows" in said
    assert sorted(p.name for p in work.iterdir()) == ["a::b.zarr"]  # nothing written
    run(f"simplecache::file://{path}", "o.zarr", "-w", "x > 0.5")
    np.testing.assert_array_equal(zarr.open_group("o.zarr", mode="r")["values"][:], a[a > 0.5])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_scheduler_errors(npy, tmp_path):
    path, _ = npy
    out = tmp_path / "o.zarr"
    res = run(path, out, "-w", "x > 0", "--scheduler", f"tcp://127.0.0.1:{free_port()}",
              "--timeout", "0.5", code=1)
    assert "cannot connect to the scheduler" in res.output
    res = run(path, out, "-w", "x > 0", "--scheduler", "nope://127.0.0.1:1", code=1)
    assert "unknown address scheme" in res.output
    assert not out.exists()
    # The failed connections left no half-made default scheduler behind in this process:
    # neither in the config nor as distributed's default client, which a later compute here
    # went to and waited on for ever (until 2026-12-01, fourteenth session, seen in CI)
    assert dask.config.get("scheduler", None) is None
    from distributed.client import _get_global_client

    assert _get_global_client() is None


def test_a_failed_scheduler_keeps_a_client_made_meanwhile_as_the_default(npy, tmp_path,
                                                                          monkeypatch):
    """A failed --scheduler drops the half-made Client from distributed's registry of
    default clients: until 2026-12-01 (fifteenth session, a regression review) with every
    client registered while it tried, so another thread's Client, made in the process while
    the CLI's main waited on an unreachable scheduler, was no longer the default, and that
    thread's later computes ran on the local threads instead of its cluster. Only clients
    not running are dropped."""
    import gc
    import threading

    import distributed
    from distributed.client import _get_global_client

    path, _ = npy
    real = distributed.Client
    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    made = []

    def meanwhile(*args, **kwargs):  # another thread's Client, then the CLI's own fails
        t = threading.Thread(target=lambda: made.append(real(cluster)))
        t.start()
        t.join()
        return real(*args, **kwargs)

    # dask imports distributed's Client once, at its first use: the real one, not the patch
    dask.base._distributed_available()
    monkeypatch.setattr(distributed, "Client", meanwhile)
    try:
        said = run(path, tmp_path / "o.zarr", "-w", "x > 0", "--scheduler",
                   "nope://127.0.0.1:1", code=1).output  # its result holds the failed Client
        assert "unknown address scheme" in said
        assert _get_global_client() is made[-1]  # the latest (one more if connect retried)
        # the config names it still (since 2026-12-02 the failed call leaves a value it did
        # not set alone: here the meanwhile Client's, equal to its own)
        assert dask.config.get("scheduler", None) == "dask.distributed"
        import dask.array as da

        assert da.ones(10, chunks=5).sum().compute() == 10
    finally:
        monkeypatch.undo()
        for c in made:
            c.close()
        cluster.close()
        # the failed Client, once collected, sets the config's scheduler back to what it found
        # at its start, the meanwhile client's "dask.distributed": that client is closed now
        gc.collect()
        dask.config.config.pop("scheduler", None)
    assert _get_global_client() is None


def test_a_failed_scheduler_restores_only_the_config_it_set(monkeypatch):
    """A failed --scheduler put the config's ``scheduler`` back to what it read before it
    tried: until 2026-12-02 (sixteenth session, the fifteenth session's probes) it popped
    (or overwrote) a value another thread set meanwhile, and the failed Client, once
    collected, popped it again. Ordered by events: the other thread sets
    ``scheduler="synchronous"`` after the failed Client's own set, before connect restores.
    The value another thread set stays; connect restores only its Client's
    ``"dask.distributed"``, and only while it is still that value."""
    import gc
    import threading

    import click
    import distributed

    from dask_compact.batch.runner import connect

    real = distributed.Client
    tried, set_meanwhile = threading.Event(), threading.Event()

    def other_thread():
        tried.wait(30)
        dask.config.set(scheduler="synchronous")
        set_meanwhile.set()

    def failing(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        finally:
            assert dask.config.get("scheduler", None) == "dask.distributed"  # its own set
            tried.set()
            set_meanwhile.wait(30)

    t = threading.Thread(target=other_thread)
    t.start()
    monkeypatch.setattr(distributed, "Client", failing)
    monkeypatch.delitem(dask.config.config, "scheduler", raising=False)
    try:
        with pytest.raises(click.ClickException, match="unknown address scheme"):
            connect("nope://127.0.0.1:1", None, 5)
        t.join()
        assert dask.config.get("scheduler", None) == "synchronous"
        gc.collect()  # the failed Client's own teardown leaves it too
        assert dask.config.get("scheduler", None) == "synchronous"
    finally:
        t.join()
        dask.config.config.pop("scheduler", None)
    # and with nothing set meanwhile, what it set is undone (test_scheduler_errors: None)
    monkeypatch.setattr(distributed, "Client", real)
    with dask.config.set(scheduler="threads"):
        with pytest.raises(click.ClickException, match="unknown address scheme"):
            connect("nope://127.0.0.1:1", None, 5)
        assert dask.config.get("scheduler", None) == "threads"
        gc.collect()
        assert dask.config.get("scheduler", None) == "threads"


def test_a_client_loop_not_started_in_time_is_tried_once_more(monkeypatch, capsys):
    """distributed waits a fixed 10 s for a new Client's IO-loop thread to run, then fails
    with a bare AssertionError: on the loaded 2-core CI machine of 2026-12-07 (stop 110) a
    --scheduler job ended so, in a traceback. connect tries once more; a second miss is a
    clear error, with nothing left registered or set; other assertions are not retried."""
    import click
    import distributed
    from distributed.client import _get_global_client
    from distributed.utils import LoopRunner

    from dask_compact.batch.runner import connect

    real = LoopRunner._start_unlocked
    misses: list[object] = []
    allowed = [1]

    def _start_unlocked(self):  # distributed's name: only a miss there is retried
        if len(misses) < allowed[0]:
            misses.append(self)
            raise AssertionError
        return real(self)

    cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                       dashboard_address=":0")
    monkeypatch.delitem(dask.config.config, "scheduler", raising=False)
    try:
        monkeypatch.setattr(LoopRunner, "_start_unlocked", _start_unlocked)
        client = connect(cluster.scheduler_address, None, 10)
        try:
            assert len(misses) == 1
            assert "IO loop did not start in time; trying once more" in capsys.readouterr().err
            assert _get_global_client() is client
            assert client.submit(lambda v: v + 1, 1).result() == 2
        finally:
            client.close()
        dask.config.config.pop("scheduler", None)

        misses.clear()
        allowed[0] = 2
        with pytest.raises(click.ClickException, match="IO loop did not start"):
            connect(cluster.scheduler_address, None, 10)
        assert len(misses) == 2
        assert _get_global_client() is None
        assert dask.config.get("scheduler", None) is None

        def other(self):
            raise AssertionError("not the loop's wait")

        monkeypatch.setattr(LoopRunner, "_start_unlocked", other)
        with pytest.raises(AssertionError, match="not the loop's wait"):
            connect(cluster.scheduler_address, None, 10)
    finally:
        monkeypatch.undo()
        cluster.close()
        dask.config.config.pop("scheduler", None)


@pytest.mark.parametrize("content", ["", "not json", '{"no": "address"}', '{"address": 5}',
                                     "[1, 2]"])
def test_a_file_that_is_not_a_scheduler_file_is_refused_naming_it(npy, tmp_path, content):
    # Until 2026-12-01 (a new-user probe) --scheduler-file naming a file that holds no
    # scheduler address (empty, not JSON, no "address") ended in distributed's bare
    # AssertionError, a traceback and exit 1.
    path, _ = npy
    out = tmp_path / "o.zarr"
    sched = tmp_path / "scheduler.json"
    sched.write_text(content)
    res = run(path, out, "-w", "x > 0", "--scheduler-file", sched, "--timeout", "0.5", code=2)
    assert "--scheduler-file" in res.output and "not a scheduler file" in res.output
    assert not out.exists()
    assert dask.config.get("scheduler", None) is None


def test_a_scheduler_file_written_while_the_command_waits_is_read(npy, tmp_path):
    # A starting scheduler opens its file before it writes it: the command waits up to
    # --timeout for the address, then connects (here to nothing: exit 1, not a refusal).
    import threading

    path, _ = npy
    sched = tmp_path / "scheduler.json"
    sched.write_text("")
    late = threading.Timer(0.3, sched.write_text,
                           args=(json.dumps({"address": f"tcp://127.0.0.1:{free_port()}"}),))
    late.start()
    try:
        res = run(path, tmp_path / "o.zarr", "-w", "x > 0", "--scheduler-file", sched,
                  "--timeout", "3", code=1)
    finally:
        late.join()
    assert "cannot connect to the scheduler" in res.output

@pytest.mark.parametrize("option", ["--timeout", "--no-workers-timeout"])
def test_a_timeout_of_nan_is_refused(npy, tmp_path, option):
    # Until 2026-12-01 (a new-user probe) click's FloatRange let NaN through (no comparison
    # with it fails): --timeout nan failed later in distributed ("Invalid time unit: nan",
    # exit 1), --no-workers-timeout nan was silently never reached.
    path, _ = npy
    out = tmp_path / "o.zarr"
    res = run(path, out, "-w", "x > 0", "--scheduler", f"tcp://127.0.0.1:{free_port()}",
              option, "nan", code=2)
    assert option in res.output and "nan" in res.output
    assert not out.exists()


def test_a_resume_refused_names_the_options_that_differ(tmp_path):
    # Until 2026-12-01 (a new-user probe) the refusal named the job description's own keys,
    # "differs in rows (1000 then, 300 now)" for --chunks and "out_chunk" for
    # --output-chunks, and gave a changed INPUT as two hashes.
    import re

    a = np.random.default_rng(9).random(20011)
    path = tmp_path / "in.zarr"
    zarr.create_array(store=str(path), shape=a.shape, chunks=(1000,), dtype=a.dtype)[:] = a
    out = tmp_path / "o.zarr"
    args = ("--where", "x > 0.3", "--output-chunks", "500", "--local", "threads")
    kill_halfway(tmp_path, path, out, *args, writes=5)
    res = run(path, out, *args, "--chunks", "300", "--resume", code=2)
    assert ("differs in rows (--chunks or dask-compact.batch.task-bytes: 1000 then, 300 now)"
            in res.output)
    res = run(path, out, *args, "--output-chunks", "700", "--resume", code=2)
    assert "(--output-chunks: 500 then, 700 now)" in res.output
    zarr.open_array(str(path), mode="r+")[5] = 2.0
    res = run(path, out, *args, "--resume", code=2)
    assert "differs in input (INPUT's files changed since)" in res.output
    assert not re.search(r"[0-9a-f]{32}", res.output.replace(str(tmp_path), ""))
    run(path, out, *args)  # a plain run starts over on the new values
    a[5] = 2.0
    np.testing.assert_array_equal(zarr.open_array(str(out / "values"))[:], a[a > 0.3])

def test_a_resume_takes_the_same_where_written_otherwise(tmp_path):
    """``x>0.3`` and ``(x > 0.3)`` are one predicate: a --resume with the other spelling was
    refused as another job's (a probe, 2026-12-06); another predicate still is."""
    a = np.random.default_rng(10).random(20011)
    path = tmp_path / "in.zarr"
    zarr.create_array(store=str(path), shape=a.shape, chunks=(1000,), dtype=a.dtype)[:] = a
    out = tmp_path / "o.zarr"
    args = ("--output-chunks", "500", "--local", "threads")
    kill_halfway(tmp_path, path, out, "--where", "x > 0.3", *args, writes=5)
    res = run(path, out, "--where", "x > 0.35", *args, "--resume", code=2)
    assert "(--where: 'x > 0.3' then, 'x > 0.35' now)" in res.output
    res = run(path, out, "--where", "( x>0.3 )", *args, "--resume")
    assert "resum" in res.output
    np.testing.assert_array_equal(zarr.open_array(str(out / "values"))[:], a[a > 0.3])


def _zarr_v2(path: Path, a: np.ndarray) -> None:
    from numcodecs import Blosc

    shutil.rmtree(path, ignore_errors=True)
    zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(4,),
                      zarr_format=2, compressors=Blosc())[:] = a


def _zarr_v3(path: Path, a: np.ndarray) -> None:  # read by the chunk-file reader
    shutil.rmtree(path, ignore_errors=True)
    zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(4,))[:] = a


def _npy_saved(path: Path, a: np.ndarray) -> None:  # np.save rewrites the same inode
    np.save(path, a)


def _npy_replaced(path: Path, a: np.ndarray) -> None:  # a new file moved over it
    np.save(path.with_suffix(".new.npy"), a)
    os.replace(path.with_suffix(".new.npy"), path)


def _zipped(path: Path, a: np.ndarray) -> str:
    """The array zipped (a Zarr v3 store at the zip's root) into a new file moved over
    ``path``; INPUT is its zip URL. Same metadata for values of one shape and dtype: until
    2026-12-01 a zip INPUT was identified by its metadata alone, and on a running cluster a
    new-user probe's second job read the worker's handle on the first zip (exit 0, wrong)."""
    import zipfile

    store = path.with_suffix(".zarr")
    _zarr_v3(store, a)
    with zipfile.ZipFile(path.with_suffix(".new"), "w") as zf:
        for f in sorted(p for p in store.rglob("*") if p.is_file()):
            zf.write(f, f.relative_to(store).as_posix())
    os.replace(path.with_suffix(".new"), path)
    return f"zip://::{path}"


def _floats(n: int) -> np.ndarray:
    return np.random.default_rng(n).random(n) * 100


def _ints(n: int) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 100, n).astype(np.int32)


# an input rewritten at its path between two jobs: how, then its two versions
REWRITES = {
    "zarr v2 grown": (_zarr_v2, _floats(6), _floats(10)),
    "zarr v2 shrunk": (_zarr_v2, _floats(10), _floats(6)),
    "zarr v2 new dtype": (_zarr_v2, _floats(8), _ints(8)),
    "zarr v3 grown": (_zarr_v3, _floats(6), _floats(10)),
    "npy grown": (_npy_saved, _floats(6), _floats(10)),
    "npy shrunk": (_npy_saved, _floats(10), _floats(6)),
    "npy new dtype": (_npy_saved, _floats(8), _ints(8)),
    "npy replaced": (_npy_replaced, _floats(10), _floats(10) + 1),
    "zip replaced": (_zipped, _floats(10), _floats(10) + 1),
}


def _two_versions(tmp_path: Path, name: str, *args: str) -> None:
    """Two jobs on the input ``name`` of REWRITES, rewritten between them: each gives NumPy's
    selection of its version."""
    write, *versions = REWRITES[name]
    suffix = ".npy" if "npy" in name else ".zip" if "zip" in name else ".zarr"
    src = tmp_path / (name.replace(" ", "_") + suffix)
    for k, a in enumerate(versions):
        inp = write(src, a) or src  # a URL for a zip
        out = tmp_path / f"{src.stem}-{k}.zarr"
        run(inp, out, "-w", "x > 40", "-o", "both", *args)
        arrays = read_group(out)[1]
        assert arrays["values"].dtype == a.dtype, (name, k)
        np.testing.assert_array_equal(arrays["values"], a[a > 40], err_msg=f"{name}, {k}")
        np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a > 40))


@pytest.mark.parametrize("name", list(REWRITES))
def test_an_input_rewritten_between_two_jobs_of_one_process(tmp_path, name):
    """The process's open inputs are kept per version: until 2026-11-30 the second job read
    the first version's handle (a grown array read short, a new dtype failed or its bytes
    were written as the old dtype's, a replaced .npy file's old values)."""
    _two_versions(tmp_path, name)


def _local_cluster(n_workers: int):
    from distributed import LocalCluster

    return LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                        dashboard_address=":0")


# The running clusters the jobs below are given by --scheduler, one of each size for the
# module: a cluster a test was a start and a close apiece (2026-12-01 (thirteenth session), CI
# time). The jobs leave them as they were (a worker the test adds goes with it).
@pytest.fixture(scope="module")
def one_worker_cluster():
    with _local_cluster(1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def two_worker_cluster():
    with _local_cluster(2) as cluster:
        yield cluster


def test_an_input_rewritten_between_two_jobs_on_one_cluster(tmp_path, one_worker_cluster):
    """The same on a running cluster, whose one worker process serves both jobs."""
    for name in REWRITES:
        _two_versions(tmp_path, name, "--scheduler", one_worker_cluster.scheduler_address)


def test_a_0d_npy_read_by_a_worker_process(tmp_path, one_worker_cluster):
    """The 0-d INPUT's one row as a worker process reads it (the reader is pickled to it),
    not only in the command's own process: on the module's running cluster (its start is
    shared with the tests beside, CI time)."""
    x = np.asarray(np.int16(-3))
    src = _zero_d(tmp_path, "npy", x)
    run(src, tmp_path / "o.zarr", "-w", "x < 0", "-o", "both", "--scheduler",
        one_worker_cluster.scheduler_address)
    _, arrays = read_group(tmp_path / "o.zarr")
    np.testing.assert_array_equal(arrays["values"], x.ravel(), strict=True)
    np.testing.assert_array_equal(arrays["indices"], np.array([0]), strict=True)


@pytest.mark.skipif(device_count() > 0, reason="refusals for workers without a GPU")
def test_device_gpu_on_a_cluster_without_gpus_is_refused_before_the_job(npy, tmp_path,
                                                                        two_worker_cluster):
    """--device gpu on a running cluster whose workers cannot use a GPU: a usage error saying
    so before anything is written (until 2026-11-30 the job failed in its first task with
    CUDA's or CuPy's own error); --device auto computes on the CPUs there."""
    path, a = npy
    out = tmp_path / "o.zarr"
    cluster = two_worker_cluster
    res = run(path, out, "-w", "x > 0.25", "--scheduler", cluster.scheduler_address,
              "--device", "gpu", code=2)
    # no CuPy here (the CI machine), or CuPy without a driver on the workers
    assert "--device gpu: " in res.output, res.output
    assert ("cupy is not installed" in res.output
            or "2 of the cluster's workers cannot use a GPU" in res.output), res.output
    assert not out.exists() and not litter(tmp_path)
    run(path, out, "-w", "x > 0.25", "--scheduler", cluster.scheduler_address,
        "--device", "auto")
    np.testing.assert_array_equal(read_group(out)[1]["values"], a[a > 0.25])


def _lacks_dask_compact():
    raise ModuleNotFoundError("No module named 'dask_compact'")


def test_a_cluster_whose_workers_lack_dask_compact_is_one_error_line(npy, tmp_path,
                                                                     monkeypatch,
                                                                     two_worker_cluster):
    """On a cluster whose workers cannot import dask_compact the job ended with exit 1 and
    distributed's traceback of ~50 lines from the GPU check (``client.run(why_no_gpu)``,
    ending in ModuleNotFoundError; a probe, 2026-11-30). Now one ``Error:`` line naming the
    workers and what to install, exit 1 (the cluster, not the command line, is at fault);
    nothing written."""
    from dask_compact.batch import runner

    path, _ = npy
    out = tmp_path / "o.zarr"
    monkeypatch.setattr(runner, "why_no_gpu", _lacks_dask_compact)  # runs on the workers
    cluster = two_worker_cluster
    res = run(path, out, "-w", "x > 0.25", "--scheduler", cluster.scheduler_address, code=1)
    workers = sorted(cluster.scheduler_info["workers"])
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    assert (f"2 of the cluster's 2 workers ({', '.join(workers)}) cannot import dask_compact "
            "(No module named 'dask_compact')" in lines[0]), lines[0]
    assert "install dask-compact" in lines[0] and "on every worker" in lines[0], lines[0]
    assert not out.exists() and not litter(tmp_path)


def test_a_worker_without_dask_compact_stops_a_cpu_job_before_it_starts(npy, tmp_path,
                                                                         one_worker_cluster):
    """``--device cpu`` asks the workers nothing about GPUs: the job started, and failed
    where one of its tasks landed on that worker (``job failed: ModuleNotFoundError``), by
    the luck of placement (here its one chunk went to the other worker: exit 0). Every job
    on a cluster now first checks that its workers import dask_compact: one line naming the
    worker without it, exit 1."""
    from cluster_helpers import worker_named, worker_process
    from distributed import Client

    path, _ = npy
    out = tmp_path / "o.zarr"
    cluster = one_worker_cluster
    with (
        Client(cluster, set_as_default=False) as client,
        worker_process(cluster.scheduler_address, tmp_path, "bare",
                       without_dask_compact=True),
    ):  # fmt: skip
        bare = worker_named(client, "bare")
        res = run(path, out, "-w", "x > 0.25", "--scheduler", cluster.scheduler_address,
                  "--device", "cpu", code=1)
    assert res.output.strip() == (
        f"Error: worker {bare} cannot import dask_compact (ModuleNotFoundError(\"No module "
        "named 'dask_compact'\")): install dask-compact, the version this command runs, on "
        "every worker of the cluster"), res.output
    assert not out.exists()


def test_local_processes_cluster(npy, tmp_path):
    """A job on a local cluster of processes; the cluster's loggers are silenced while it
    closes, and the caller's level comes back (until 2026-12-01 (fifteenth session) a test of
    its own, a cluster and a job more: CI time)."""
    import logging

    path, a = npy
    out = tmp_path / "o.zarr"
    log = logging.getLogger("distributed")
    before = log.level
    log.setLevel(logging.INFO)
    try:
        res = run(path, out, "-w", "x > 0.25", "--local", "processes", "--workers", "2",
                  "--chunks", "2500", "--progress")
        assert log.level == logging.INFO
    finally:
        log.setLevel(before)
    assert "LocalCluster (2 worker processes)" in res.stdout
    np.testing.assert_array_equal(read_group(out)[1]["values"], a[a > 0.25])


def test_unusable_temporary_directory_is_one_error_line(npy, tmp_path):
    """A local cluster whose scratch folder (dask's temporary-directory) cannot be made: one
    ``Error:`` line naming the cause and the setting, exit 1, nothing written. Before
    (2026-12-01, a new-user probe): distributed's warning and a chained traceback of 80 lines
    ending ``RuntimeError: Cluster failed to start: [Errno 20] Not a directory``. A subprocess:
    distributed's warning goes to the logging handler's stderr, which click's runner does not
    capture."""
    path, _ = npy
    out = tmp_path / "o.zarr"
    (tmp_path / "notadir").write_text("")
    scratch = str(tmp_path / "notadir" / "x")
    proc = subprocess.run(
        [sys.executable, "-m", "dask_compact", str(path), str(out), "-w", "x > 0.5",
         "--local", "processes", "--workers", "1"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "DASK_TEMPORARY_DIRECTORY": scratch},
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: the local cluster did not start: "), (
        proc.stderr)
    assert "Not a directory" in lines[0] and "temporary-directory" in lines[0]
    assert f"({scratch!r}, from DASK_TEMPORARY_DIRECTORY)" in lines[0]
    assert proc.stdout == ""
    assert not out.exists() and litter(tmp_path) == []


def test_failed_start_names_the_setting_only_for_its_folder(monkeypatch):
    """The temporary-directory setting is named where the path that failed is it, above it
    (makedirs fails at the first folder it cannot make) or in it, and where it was set."""
    from dask_compact.batch.runner import failed_start

    monkeypatch.delenv("DASK_TEMPORARY_DIRECTORY", raising=False)
    with dask.config.set({"temporary-directory": "/ro/a/b"}):
        for failed in ("/ro/a", "/ro/a/b", "/ro/a/b/dask-scratch-space"):
            said = failed_start(PermissionError(13, "Permission denied", failed))
            assert said.startswith("the local cluster did not start: [Errno 13] Permission")
            assert "temporary-directory setting ('/ro/a/b', from the dask config)" in said
        for other in (OSError(98, "Address already in use"),
                      PermissionError(13, "Permission denied", "/ro/ab")):
            said = failed_start(other)
            assert "temporary-directory" not in said and "did not start: " in said


def test_subprocess(npy, tmp_path):
    """``dask compact`` (dask's command-line entry point). ``python -m dask_compact`` is
    checked alike by test_script_exit_codes_and_output (until 2026-12-01 (fourteenth
    session) here too: the same two runs again, CI time)."""
    path, a = npy
    out = tmp_path / "o.zarr"
    dask_exe = str(BIN / "dask") if (BIN / "dask").exists() else shutil.which("dask")
    if dask_exe is None:
        pytest.skip("no 'dask' executable (packages installed without their scripts)")
    argv = [dask_exe, "compact"]
    proc = subprocess.run([*argv, str(path), str(out), "-w", "x <= 0.05", "-o", "both", "--json"],
                          check=False, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["selected"] == int((a <= 0.05).sum())
    _, arrays = read_group(out)
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a <= 0.05))
    # A usage error: short message, exit code 2, no traceback.
    proc = subprocess.run([*argv, str(path), str(out), "-w", "x <= 0.05"],
                          check=False, capture_output=True, text=True, timeout=60,
                          cwd=tmp_path)
    assert proc.returncode == 2
    assert "--overwrite" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("flags", [[], ["--local", "processes", "--workers", "2"]])
def test_script_exit_codes_and_output(npy, tmp_path, flags):
    """``python -m dask_compact`` ends the process at once after the command (os._exit): the
    summary is flushed, the output complete, and each outcome keeps its exit code."""
    path, a = npy
    out = tmp_path / "o.zarr"
    base = [sys.executable, "-m", "dask_compact"]

    def call(*args):
        return subprocess.run([*base, *map(str, args)], check=False, capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    proc = call(path, out, "-w", "x > 0.5", "-o", "both", "--json", *flags)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["selected"] == int((a > 0.5).sum())
    _, arrays = read_group(out)
    np.testing.assert_array_equal(arrays["values"], a[a > 0.5])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a > 0.5))
    if flags:  # the refusals below take no flags: checked once, with the threaded job's output
        return  # (until 2026-12-01 (fifteenth session) in both cases: 3 subprocesses, CI time)
    # exists: needs --overwrite; a usage error: short message, exit code 2, no traceback
    exists = call(path, out, "-w", "x > 0.5")
    assert exists.returncode == 2
    assert "--overwrite" in exists.stderr and "Traceback" not in exists.stderr
    bad = call(path, tmp_path / "p.zarr", "-w", "y > 1")  # not a predicate in x
    assert bad.returncode == 2 and "--where" in bad.stderr
    missing = call(tmp_path / "nothing.zarr", tmp_path / "q.zarr", "-w", "x > 1")
    assert missing.returncode == 2 and not (tmp_path / "q.zarr").exists()


def test_terminate_handler_restored():
    import signal

    from dask_compact.batch.signals import terminate_as_exit

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as info, terminate_as_exit():
        os.kill(os.getpid(), signal.SIGTERM)
    assert info.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before


def test_summary_process_age_counts_from_the_process_start():
    """The summary's process_seconds: the process's age to within the clocks' 10 ms (psutil's
    create_time counts from a boot time cut to whole seconds: up to a second too long)."""
    code = ("import time; t0 = time.time(); from dask_compact.batch.job import process_age; "
            "a = process_age(); print(a - (time.time() - t0))")
    before_t0 = []  # the interpreter's own start, before the code's first line
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True)
        before_t0.append(float(r.stdout))
    # never shorter than the code's own time; the start's length varies with the machine's
    # load (0.78 s once in a CI run beside other jobs, 2026-12-01), so the bound is on the
    # shortest of the three
    assert min(before_t0) >= -0.02 and min(before_t0) < 0.75, before_t0


# -- the memory budget: what the summary says the job holds, and what it holds ---------------

_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def test_a_bad_memory_budget_is_said_before_the_wait_for_a_scheduler_file(npy, tmp_path):
    # Until 2026-12-01 (thirteenth session, a review) the scheduler file was waited for first
    # (up to --timeout), and only then was the budget refused.
    import time

    path, _ = npy
    sched = tmp_path / "being-written.json"
    sched.write_text("")  # a scheduler file not yet written: waited for
    start = time.monotonic()
    res = run(path, tmp_path / "o.zarr", "-w", "x > 0", "--scheduler-file", str(sched),
              "--timeout", "20", "--memory-budget", "abc", code=2)
    assert "--memory-budget" in res.output
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("budget", ["", " ", "kB", "GiB", "-1", "0", "abc", "1e999", "1e400 kB"])
def test_a_memory_budget_without_a_positive_number_is_refused(npy, tmp_path, budget):
    # Until 2026-12-01 (a new-user probe) dask's parse_bytes read "" and " " as 1 byte and a
    # bare unit as one of it ("kB": 1000 bytes), and the job ran on that budget. "1e999" (no
    # float) raised OverflowError, a traceback, exit 1 (until 2026-12-01 (thirteenth session)).
    path, _ = npy
    out = tmp_path / "o.zarr"
    res = run(path, out, "-w", "x > 0", "--local", "threads", "--memory-budget", budget, code=2)
    assert "--memory-budget" in res.output
    assert not out.exists()



def _size(text: str) -> float:
    number, unit = text.split()
    return float(number) * _UNITS[unit]


def _memory_line(out: str) -> tuple[float, float, str]:
    """(budget, in flight, the line) of a summary's "memory" line."""
    import re

    line = next(ln for ln in out.splitlines() if ln.startswith("memory"))
    m = re.search(r"budget (\S+ \S+), at most (\S+ \S+) in flight", line)
    assert m, line
    return _size(m[1]), _size(m[2]), line


@pytest.fixture(scope="module")
def chunky(tmp_path_factory) -> tuple[Path, np.ndarray]:
    """128 MiB of float64 in 32 Zarr chunks of 4 MiB: chunks large enough that the threads'
    buffers and the pieces kept whole weigh in the process's memory."""
    a = np.random.default_rng(11).random(2**24)
    path = tmp_path_factory.mktemp("chunky") / "in.zarr"
    z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=(2**19,))
    z[:] = a
    return path, a


# 16 MiB output chunks (four input chunks' worth), 30 % selected: a piece keeps its whole
# chunk-sized buffer (a selection of a quarter or more is a view, numpy_backend._trim), about
# 13 of them fill an output chunk, and a budget of 4 MiB is below what the job needs.
SMALL_BUDGET = ("--where", "x < 0.3", "--memory-budget", "4MiB", "--output-chunks",
                str(2**21), "--no-read-ahead")


def test_summary_in_flight_is_within_the_budget_or_says_why(chunky, tmp_path):
    """The summary's "at most X in flight" stays within the budget, or the line says the
    budget is below the job's minimum and gives the plan's estimate of it (2026-11-30: a
    probe's 64 MiB budget printed "at most 201.3 MB in flight" and nothing more), as an upper
    estimate: "this job needs at least" a figure above what it held read as a contradiction
    (a docs probe, the same day)."""
    path, a = chunky
    out = tmp_path / "o.zarr"
    res = run(path, out, *SMALL_BUDGET)
    budget, in_flight, line = _memory_line(res.stdout)
    assert budget == 4.2e6  # 4 MiB, as the summary prints it
    assert in_flight > budget, line  # SMALL_BUDGET is below this job's minimum
    assert "above the budget, which is below the least this job can run in" in line, line
    assert "needs at least" not in line, line
    import re

    estimate = _size(re.search(r"up to ([\d.]+ \w+) by the plan's estimate", line)[1])
    assert budget < in_flight <= estimate, line
    np.testing.assert_array_equal(read_group(out)[1]["values"], a[a < 0.3])


def _cli_memory(path: Path, out: Path, *args: str) -> tuple[float, float, float]:
    """(budget, in flight, peak resident memory) of the CLI run in a process of its own."""
    proc = subprocess.run([sys.executable, "-m", "dask_compact", str(path), str(out), *args],
                          capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr
    budget, in_flight, line = _memory_line(proc.stdout)
    return budget, in_flight, _size(" ".join(line.split("peak per process ")[1].split()[:2]))


def test_in_flight_bounds_the_memory_the_job_holds(chunky, tmp_path):
    """What the job's process holds beyond a job of 1,000 elements (the same imports and
    compilation) is at most what the summary says is in flight (or the budget), give or take
    16 MiB for the allocator and the interpreter. Before 2026-11-30 the threads' decode and
    output-assembly buffers, the compressed chunks being read and the selections' idle pooled
    buffers were not counted: this job held 99 MB beyond its baseline and said 63 MB."""
    path, _ = chunky
    tiny = tmp_path / "tiny.zarr"
    z = zarr.create_array(store=str(tiny), shape=(1000,), dtype="float64", chunks=(1000,))
    z[:] = np.random.default_rng(12).random(1000)
    _, _, baseline = _cli_memory(tiny, tmp_path / "t.zarr", *SMALL_BUDGET)
    budget, in_flight, peak = _cli_memory(path, tmp_path / "o.zarr", *SMALL_BUDGET)
    allowance = 16 * 2**20
    print(f"baseline {baseline / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB, "
          f"in flight {in_flight / 1e6:.1f} MB, budget {budget / 1e6:.1f} MB")
    assert peak - baseline <= max(budget, in_flight) + allowance


def test_an_array_xarray_decodes_is_refused_without_raw(tmp_path):
    """An array INPUT stored packed by xarray: the one-array job compares stored values only,
    so "x > 300" on a packed temperature would select by the packed integers (it ran, with a
    note after the job). Refused before any work unless --raw says the condition is on the
    stored numbers; the message names the group form, which compares decoded values."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(4)
    t = rng.uniform(250, 320, 301)
    t[::7] = np.nan
    ds = xr.Dataset({"t": ("event", t), "f": ("event", rng.random(301).astype("f4"))})
    src = tmp_path / "ds.zarr"
    ds.to_zarr(src, zarr_format=2, consolidated=False, encoding={"t": {
        "dtype": "int16", "scale_factor": 0.01, "add_offset": 273.15, "_FillValue": -32768}})
    out = tmp_path / "o.zarr"
    res = run(f"{src}/t", out, "-w", "x > 300", code=2)
    assert "--raw" in res.output and "scale_factor" in res.output
    assert f"dask compact {src} OUTPUT" in res.output and "--fields t" in res.output
    assert not out.exists()
    res = run(f"{src}/t", out, "-w", "x > 2685", "-o", "both", "--raw")
    assert "note      --where compares the stored values" in res.output
    stored = zarr.open_array(store=str(src / "t"), mode="r")[...]
    np.testing.assert_array_equal(read_group(out)[1]["indices"], np.flatnonzero(stored > 2685))
    # a float array whose fill value is NaN decodes to itself: no refusal, no note
    res = run(f"{src}/f", tmp_path / "o2.zarr", "-w", "x > 0.5")
    assert "note" not in res.output


def test_an_array_whose_fill_value_the_condition_treats_as_nan_is_not_refused(tmp_path):
    """A float array's fill value (-999, which xarray reads as NaN): refused only where the
    condition tells it from NaN ("x != -999" selects it stored and selects NaN decoded); "x >
    0.5" selects neither, so the stored and decoded selections agree: it runs, with the note."""
    xr = pytest.importorskip("xarray")
    f = np.random.default_rng(5).random(203)
    f[::9] = np.nan
    src = tmp_path / "ds.zarr"
    xr.Dataset({"f": ("event", f)}).to_zarr(src, zarr_format=3, consolidated=False,
                                            encoding={"f": {"_FillValue": -999.0}})
    res = run(f"{src}/f", tmp_path / "o.zarr", "-w", "x != -999", code=2)
    assert "_FillValue" in res.output and "--raw" in res.output
    res = run(f"{src}/f", tmp_path / "o.zarr", "-w", "x > 0.5")
    assert "note      --where compares the stored values" in res.output
    np.testing.assert_array_equal(read_group(tmp_path / "o.zarr")[1]["values"], f[f > 0.5])


@pytest.mark.parametrize("dtype", [">f4", "<f4"])
def test_a_big_endian_array_is_not_refused_where_decoding_cannot_change_the_selection(
        tmp_path, dtype):
    """A Zarr v2 array of >f4 with a fill value of -999 (xarray's NaN) and "x > 50": the
    selection is the same stored or decoded, so it runs as <f4 does (the check compared the
    stored >f4 with the input's native float32, and refused it); "x != -999" is refused."""
    f = np.random.default_rng(6).uniform(0, 100, 90).astype(dtype)
    f[::8] = -999
    src = tmp_path / "a.zarr"
    z = zarr.create_array(store=str(src), shape=f.shape, dtype=dtype, chunks=(30,),
                          zarr_format=2, fill_value=-999,
                          attributes={"_ARRAY_DIMENSIONS": ["event"]})
    z[:] = f
    out = tmp_path / "o.zarr"
    res = run(src, out, "-w", "x > 50")
    assert "note      --where compares the stored values" in res.output
    np.testing.assert_array_equal(read_group(out)[1]["values"], f[f > 50])
    res = run(src, tmp_path / "o2.zarr", "-w", "x != -999", code=2)
    assert "_FillValue" in res.output and "--raw" in res.output


@pytest.mark.parametrize("dtype", ["datetime64[s]", "timedelta64[ms]"])
def test_a_time_array_input_is_refused_naming_the_library_call(tmp_path, dtype):
    """A datetime64 .npy INPUT was refused with the list of supported dtypes alone (a
    new-user probe, 2026-12-01, fourteenth session), though the library compacts such arrays:
    the refusal names the call that does, which works."""
    import dask.array as da

    import dask_compact

    t = np.arange(1000).astype(dtype)
    np.save(tmp_path / "t.npy", t)
    out = run(tmp_path / "t.npy", tmp_path / "o.zarr", "--where", "x > 5", code=2)
    assert "compacted by the library" in out.output
    assert "dask_compact.compact(x, x > t0, chunks=N).to_zarr(OUTPUT)" in out.output
    x = da.from_array(np.load(tmp_path / "t.npy"), chunks=300)
    dask_compact.compact(x, x > t[5], chunks=100).to_zarr(str(tmp_path / "o.zarr"))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "o.zarr"))[:], t[t > t[5]])
