"""The first chunks decoded while the command starts (dask_compact.batch.prefetch): what it
recognises, that the job's reader gets zarr's values whether a chunk came from it or not, that
a chunk it failed on is reported by the reader as any other, and that the CLI uses it only
where the chunks are read in its own process, charging it to the memory budget."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

zarr = pytest.importorskip("zarr")

from cli_helpers import run  # noqa: E402
from zarr_layouts import REFUSED_LAYOUTS  # noqa: E402

from dask_compact.batch import prefetch  # noqa: E402
from dask_compact.batch.reader import ZarrChunkFiles, chunk_files_reader  # noqa: E402
from dask_compact.batch.tasks import ChunkError, _read_into  # noqa: E402


@pytest.fixture(autouse=True)
def _no_prefetch_left():
    yield
    prefetch.stop()


def make(path, a, chunks, **kw):
    z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=chunks, **kw)
    z[...] = a
    return str(path)


def reader_of(path) -> ZarrChunkFiles:
    r, why = chunk_files_reader(zarr.open_array(path), path, "fp", False)
    assert isinstance(r, ZarrChunkFiles), why
    return r


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "float32", "float64",
                                   "complex64"])
@pytest.mark.parametrize("shape, chunks", [((1025,), (100,)), ((997,), (997,)),
                                           ((61, 5), (8, 5)), ((33, 2, 3), (7, 2, 3))])
def test_guess_names_the_files_and_sizes_zarr_reads(tmp_path, dtype, shape, chunks):
    a = (np.random.default_rng(7).random(shape) * 100).astype(dtype)
    path = make(tmp_path / "a.zarr", a, chunks)
    g = prefetch.guess(path)
    r = reader_of(path)
    whole = shape[0] // chunks[0]  # the partial last chunk is left to the reader
    assert g is not None and g.keys == r.keys[:whole] and g.chunk_rows == r.chunk_rows
    assert g.nbytes == int(np.prod(chunks)) * np.dtype(dtype).itemsize


def test_guess_declines_what_the_reader_does_not_decode_itself(tmp_path):
    a = np.arange(60.0).reshape(12, 5)
    for name, kw in REFUSED_LAYOUTS.items():
        assert prefetch.guess(make(tmp_path / name.replace(" ", "_"), a, **kw)) is None, name
    from zarr.codecs import BytesCodec

    big_endian = make(tmp_path / "be", a, (4, 5), serializer=BytesCodec(endian="big"))
    assert prefetch.guess(big_endian) is None
    assert chunk_files_reader(zarr.open_array(big_endian), big_endian, "fp", False)[0] is None
    group = tmp_path / "g.zarr"
    zarr.open_group(str(group), mode="w").create_array("x", shape=(4,), dtype="f4")
    assert prefetch.guess(str(group)) is None
    assert prefetch.guess(str(tmp_path / "missing")) is None
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "zarr.json").write_text("{not json")
    assert prefetch.guess(str(junk)) is None
    (junk / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "array"}))
    assert prefetch.guess(str(junk)) is None


def test_dot_separated_chunk_keys(tmp_path):
    a = np.arange(40, dtype=np.int32)
    path = make(tmp_path / "a.zarr", a, (8,),
                chunk_key_encoding={"name": "default", "separator": "."})
    g = prefetch.guess(path)
    assert g is not None and g.keys[:2] == ["c.0", "c.1"] == reader_of(path).keys[:2]


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("cap_chunks", [1, 4, 100])
def test_reads_through_the_prefetch_give_zarrs_values(tmp_path, threads, cap_chunks):
    rng = np.random.default_rng(cap_chunks)
    a = rng.standard_normal((1031, 3)).astype(np.float32)  # 10 whole chunks and a partial one
    path = make(tmp_path / "a.zarr", a, (100, 3))
    r = reader_of(path)
    p = prefetch.start(path, cap_chunks * 100 * 3 * 4, threads)
    assert p is not None and len(p._order) == min(10, cap_chunks)
    prefetch.wait(p, 60)  # else the reader may take over chunks not started yet
    # blocks of whole chunks (served from the prefetch), straddling ones and the edge
    for r0, r1 in [(0, 100), (100, 300), (250, 420), (300, 1031), (1000, 1031)]:
        out = np.full((r1 - r0, 3), np.nan, np.float32)
        r.read(r0, r1, out=out)
        np.testing.assert_array_equal(out, a[r0:r1])
    assert p.taken == min(cap_chunks, 10)  # every whole chunk prefetched, read whole once
    # a chunk is handed out once: read again, it is decoded by the reader
    np.testing.assert_array_equal(r.read(0, 100), a[:100])
    assert p.taken == min(cap_chunks, 10)


def test_once_the_job_reads_nothing_new_is_started(tmp_path, monkeypatch):
    a = np.arange(500, dtype=np.float64)
    path = make(tmp_path / "a.zarr", a, (50,))
    gate = threading.Event()
    real_claim = prefetch.Prefetch._claim
    monkeypatch.setattr(prefetch.Prefetch, "_claim",
                        lambda self: real_claim(self) if gate.wait(30) else None)
    p = prefetch.start(path, 10 * 50 * 8, 2)
    r = reader_of(path)
    # chunks 3 and 4 not started: the reader decodes them, and the job now reads for itself
    np.testing.assert_array_equal(r.read(150, 250), a[150:250])
    gate.set()
    for t in p._threads:
        t.join(30)
        assert not t.is_alive()  # each thread found nothing more to start
    np.testing.assert_array_equal(r.read(0, 500), a)
    assert p.taken == 0


def test_a_chunk_the_prefetch_failed_on_is_reported_by_the_reader(tmp_path):
    a = np.arange(1, 401, dtype=np.float32)
    path = make(tmp_path / "a.zarr", a, (100,))
    (tmp_path / "a.zarr" / "c" / "2").write_bytes(b"\x28\xb5\x2f\xfd junk")
    p = prefetch.start(path, 4 * 400, 2)
    prefetch.wait(p, 60)
    r = reader_of(path)
    out = np.empty(100, np.float32)
    with pytest.raises(ChunkError, match=r"input chunk 2 \(rows 200:300\)"):
        _read_into(r, 200, 300, out, "input chunk 2 (rows 200:300)")
    np.testing.assert_array_equal(r.read(0, 200), a[:200])
    assert p.taken == 2


def test_size_mismatch_and_other_arrays_are_not_served(tmp_path):
    a = np.arange(400, dtype=np.float32)
    path = make(tmp_path / "a.zarr", a, (100,))
    p = prefetch.start(path, 4 * 400, 1)
    prefetch.wait(p, 60)
    out = np.zeros(100, np.float32)
    assert not prefetch.take(str(tmp_path / "other.zarr"), "c/0", 400, out)
    assert not prefetch.take(path, "c/0", 396, out[:99])
    assert not (out != 0).any()
    assert not prefetch.take(path, "c/9", 400, out)
    assert prefetch.take(path, "c/1", 400, out) and p.taken == 1
    np.testing.assert_array_equal(out, a[100:200])


def test_start_declines_blocks_that_split_chunks_and_budgets_below_one(tmp_path):
    path = make(tmp_path / "a.zarr", np.arange(400, dtype=np.float32), (100,))
    assert prefetch.start(path, 399, 2) is None  # not one chunk fits
    assert prefetch.start(path, 4000, 2, rows=150) is None  # --chunks 150 reads half chunks
    assert prefetch.start(path, 4000, 2, rows=200) is not None


# -- through the command ------------------------------------------------------------------


def summary(*args) -> dict:
    return json.loads(run(*args, "--json").output.strip().splitlines()[-1])


def test_the_command_takes_its_first_chunks_from_the_prefetch(tmp_path, monkeypatch):
    real_start = prefetch.start

    def start_and_finish(*args, **kw):  # the decode done before the job reads: deterministic
        p = real_start(*args, **kw)
        if p is not None:
            prefetch.wait(p, 60)
        return p

    monkeypatch.setattr(prefetch, "start", start_and_finish)
    rng = np.random.default_rng(3)
    a = rng.random(40_000).astype(np.float32)
    src = make(tmp_path / "in.zarr", a, (1000,))
    s = summary(src, tmp_path / "out.zarr", "-w", "x < 0.3", "--local", "threads",
                "--device", "cpu", "--memory-budget", "200kB")
    # a quarter of the budget: 50 kB = 12 whole chunks of 4 kB, charged to the job
    assert s["prefetched_chunks"] == 12
    assert s["peak_reserved"] <= s["memory_budget"] == 200_000
    got = zarr.open_group(str(tmp_path / "out.zarr"))["values"][:]
    np.testing.assert_array_equal(got, a[a < 0.3])


@pytest.mark.parametrize("extra", [["--chunks", "1500"], ["--memory-budget", "15kB"],
                                   ["--decode", "gpu"]])
def test_no_prefetch_where_it_would_not_be_used(tmp_path, extra):
    a = np.random.default_rng(4).random(20_000).astype(np.float32)
    src = make(tmp_path / "in.zarr", a, (1000,))
    s = summary(src, tmp_path / "out.zarr", "-w", "x > 0.6", "--local", "threads", "--device",
                "cpu", *extra)
    assert s["prefetched_chunks"] == 0
    got = zarr.open_group(str(tmp_path / "out.zarr"))["values"][:]
    np.testing.assert_array_equal(got, a[a > 0.6])
    assert prefetch._current is None  # stopped with the command


def test_prefetch_is_stopped_when_the_command_refuses(tmp_path):
    a = np.random.default_rng(5).random(8000).astype(np.float32)
    src = make(tmp_path / "in.zarr", a, (1000,))
    result = run(src, tmp_path / "out.zarr", "-w", "y < 2", "--local", "threads", code=2)
    assert "--where" in result.output
    assert prefetch._current is None
    assert not os.path.exists(tmp_path / "out.zarr")
