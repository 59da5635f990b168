"""The batch command's early read (dask_compact/batch/early_read.py): which inputs it reads,
how much, that a chunk is read by exactly one of it and the job's tasks, and that the job's
output is exact whether its chunks came from it, from the tasks, or from both; failures fall
back to the tasks' own reads and errors."""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from dask_compact import cli
from dask_compact.batch import early_read
from dask_compact.batch.entry_points import shared_scan
from dask_compact.batch.inputs import open_input
from dask_compact.batch.reader import ZarrChunkFiles, chunk_files_reader

CHUNK = 1000


def make(path: Path, a: np.ndarray, chunks: tuple[int, ...], **kw) -> Path:
    z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=chunks, **kw)
    z[:] = a
    return path


@pytest.fixture
def zin(tmp_path: Path) -> tuple[Path, np.ndarray]:
    a = np.random.default_rng(3).random(10 * CHUNK + 123).astype(np.float32)
    return make(tmp_path / "in.zarr", a, (CHUNK,)), a


def invoke(*args: object, code: int = 0):
    result = CliRunner().invoke(cli.main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result


@pytest.fixture
def read_first(monkeypatch):
    """The command's early read finishes every chunk it may read before the job starts (so
    the tasks take each of them: deterministic, where a real command races)."""
    begun: list[early_read.EarlyRead] = []
    original = early_read.begin

    def begin(*args):
        early = original(*args)
        if early is not None:
            early.join(timeout=60)
            begun.append(early)
        return early

    monkeypatch.setattr(early_read, "begin", begin)
    return begun


# -- which inputs, how many chunks ---------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "int8", "uint16", "int64", "bool"])
@pytest.mark.parametrize("shape,chunks", [((5000,), (999,)), ((300, 7), (64, 7)), ((1,), (1,))])
def test_plan_reads_the_chunk_files_the_job_reads(tmp_path, dtype, shape, chunks):
    a = (np.random.default_rng(1).random(shape) * 100).astype(dtype)
    path = make(tmp_path / "a.zarr", a, chunks)
    planned = early_read.plan(str(path), "values", None)
    assert planned is not None
    reader, count = planned
    job_reader, why = chunk_files_reader(zarr.open_array(str(path)), str(path), "fp", False)
    assert why == "" and job_reader is not None
    assert reader.keys == job_reader.keys and reader.chunk_rows == job_reader.chunk_rows
    nchunks = -(-shape[0] // chunks[0])
    assert count == nchunks  # a few MB: all of it fits a quarter of the memory
    early = early_read.EarlyRead(reader, count, 2)
    try:
        early.join(timeout=60)
        assert early.matches(job_reader)
        got = []
        for i in range(nchunks):
            r0, r1 = i * chunks[0], min((i + 1) * chunks[0], shape[0])
            taken = early.take(job_reader, r0, r1)
            assert taken is not None and taken[1] >= 0
            got.append(taken[0])
        np.testing.assert_array_equal(np.concatenate(got), a)
    finally:
        early.close()


def test_a_job_reader_is_compared_key_by_key_once(tmp_path):
    """The job asks the early read once per chunk whether its reader reads the same chunks;
    comparing the two readers' chunk keys each time cost a list walk per chunk: a job of
    70,001 one-row chunks took 170.6 s (19.4 s without it and the host pool's walk, against
    zarr's 23.7 s for reading the array whole). A reader that matched is known by identity."""
    a = np.arange(1, 41, dtype=np.int64)  # no chunk of the fill value (0): all are stored
    path = make(tmp_path / "a.zarr", a, (1,))
    reader, count = early_read.plan(str(path), "values", None)
    job_reader, _ = chunk_files_reader(zarr.open_array(str(path)), str(path), "fp", False)

    class Counted(list):
        compared = 0

        def __eq__(self, other):
            Counted.compared += 1
            return super().__eq__(other)

        __hash__ = None  # type: ignore[assignment]

    job_reader.keys = Counted(job_reader.keys)
    early = early_read.EarlyRead(reader, count, 2)
    try:
        early.join(timeout=60)
        got = [early.take(job_reader, i, i + 1) for i in range(len(a))]
        assert all(t is not None for t in got)
        np.testing.assert_array_equal(np.concatenate([t[0] for t in got]), a)
        assert Counted.compared <= 1
        other = SimpleNamespace(**vars(job_reader))  # not a ZarrChunkFiles: never matches
        assert not early.matches(other)
        assert early.take(other, 0, 1) is None
    finally:
        early.close()


def test_plan_refuses_what_the_chunk_file_reader_does_not_read(tmp_path):
    a = np.random.default_rng(2).random((40, 6)).astype(np.float32)
    cases = {
        "v2": make(tmp_path / "v2.zarr", a, (8, 6), zarr_format=2),
        "blosc": make(tmp_path / "blosc.zarr", a, (8, 6),
                      compressors=zarr.codecs.BloscCodec()),
        "uncompressed": make(tmp_path / "raw.zarr", a, (8, 6), compressors=None),
        "split trailing axis": make(tmp_path / "split.zarr", a, (8, 3)),
        "sharded": make(tmp_path / "shard.zarr", a, (8, 6), shards=(16, 6)),
        "big-endian": make(tmp_path / "be.zarr", a, (8, 6),
                           serializer=zarr.codecs.BytesCodec(endian="big")),
    }
    g = zarr.open_group(str(tmp_path / "group.zarr"), mode="w")
    g.create_array("x", shape=(10,), dtype="f4")
    cases["group"] = tmp_path / "group.zarr"
    cases["missing"] = tmp_path / "nothing.zarr"
    for why, path in cases.items():
        assert early_read.plan(str(path), "values", None) is None, why
    assert early_read.plan("s3://bucket/a.zarr", "values", None) is None
    npy = tmp_path / "a.npy"
    np.save(npy, a)
    assert early_read.plan(str(npy), "values", None) is None


def test_plan_reads_only_what_the_first_window_admits(zin):
    path, a = zin
    # the budget first holds the threads' buffers (one thread a core), then each chunk read
    # early: decoded into an array of its own, plus its full selection and half again
    threads = _threads_cost("values")
    one = CHUNK * 4 + CHUNK * 4 * 3 // 2
    for budget, expect in [(one * 3 + 5, 3), (one, 1), (one - 1, None)]:
        planned = early_read.plan(str(path), "values", threads + budget)
        assert (planned[1] if planned else None) == expect, budget
    # indices cost 8 bytes per element on top of the decoded 4
    planned = early_read.plan(str(path), "indices",
                              _threads_cost("indices") + (CHUNK * 4 + CHUNK * 12) * 2)
    assert planned is not None and planned[1] == 2


def _threads_cost(mode: str) -> int:
    """What the job charges its budget for its threads' buffers on this machine's cores."""
    from dask.system import CPU_COUNT

    from dask_compact.batch.plan import Layout, thread_cost

    lay = Layout.make((11 * CHUNK,), 4, CHUNK, None)
    return CPU_COUNT * thread_cost(lay, mode)


# -- one reader per chunk --------------------------------------------------------------------------


class GatedReader(ZarrChunkFiles):
    """Chunk 0's read waits for a gate; every read is counted."""

    def __init__(self, base: ZarrChunkFiles) -> None:
        super().__init__(base.url, base.shape, base.dtype, "", base.chunk_rows, base.keys,
                         base.fill_value, False)
        self.gate = threading.Event()
        self.reads: list[int] = []

    def read(self, r0, r1, out=None):
        self.reads.append(r0 // self.chunk_rows)
        if r0 == 0:
            assert self.gate.wait(30)
        return super().read(r0, r1, out)


def test_a_chunk_is_read_by_whoever_claims_it_first(zin):
    path, a = zin
    reader, count = early_read.plan(str(path), "values", None)
    gated = GatedReader(reader)
    early = early_read.EarlyRead(gated, 6, 1)  # one thread: it claims 0 and waits there
    try:
        while 0 not in gated.reads:
            threading.Event().wait(0.01)
        assert early.take(reader, 2 * CHUNK, 3 * CHUNK) is None  # the task claims chunk 2
        gated.gate.set()
        early.join(timeout=60)
        assert sorted(gated.reads) == [0, 1, 3, 4, 5]  # 2 left to the task
        for i in (0, 1, 3, 4, 5):
            block, _ = early.take(reader, i * CHUNK, (i + 1) * CHUNK)
            np.testing.assert_array_equal(block, a[i * CHUNK : (i + 1) * CHUNK])
        assert early.take(reader, 0, CHUNK) is None  # taken once only
        assert early.take(reader, 7 * CHUNK, 8 * CHUNK) is None  # past its count
        assert early.take(reader, 10, CHUNK + 10) is None  # not a chunk's rows
        assert early.summary()["chunks"] == 5
    finally:
        early.close()


def test_stop_drops_chunks_outside_the_window_and_close_drops_the_rest(zin):
    path, _ = zin
    reader, count = early_read.plan(str(path), "values", None)
    early = early_read.EarlyRead(reader, count, 2)
    early.join(timeout=60)
    early.stop(keep_below=4)
    assert early.take(reader, 5 * CHUNK, 6 * CHUNK) is None
    assert early.take(reader, 3 * CHUNK, 4 * CHUNK) is not None
    early.close()
    assert early.take(reader, 0, CHUNK) is None
    assert early.summary()["chunks"] == 1


def test_a_chunk_that_fails_early_is_left_to_the_task(zin):
    path, _ = zin
    with open(os.path.join(path, "c", "2"), "wb") as f:
        f.write(b"not zstd")
    reader, count = early_read.plan(str(path), "values", None)
    early = early_read.EarlyRead(reader, count, 2)
    try:
        early.join(timeout=60)
        assert early.take(reader, 2 * CHUNK, 3 * CHUNK) is None
        assert early.take(reader, 3 * CHUNK, 4 * CHUNK) is not None
    finally:
        early.close()


# -- the command ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["values", "indices", "both"])
@pytest.mark.parametrize("where", ["x < 0.3", "x < 2", "x > 2"])  # some, all, none selected
def test_command_with_chunks_read_early_matches_numpy(zin, tmp_path, read_first, mode, where):
    path, a = zin
    out = tmp_path / "out.zarr"
    summary = json.loads(invoke(path, out, "--where", where, "--output", mode, "--json",
                                "--device", "cpu").output)
    mask = eval(where, {"x": a})  # noqa: S307 -- the test's own expressions
    g = zarr.open_group(str(out), mode="r")
    if mode != "indices":
        np.testing.assert_array_equal(g["values"][:], a[mask])
    if mode != "values":
        np.testing.assert_array_equal(g["indices"][:], np.flatnonzero(mask))
    assert summary["read_ahead"]["chunks"] == 11  # every chunk, taken by the tasks
    assert summary["read_ahead"]["bytes"] == a.nbytes
    assert summary["task_seconds"]["read"] >= summary["read_ahead"]["read_s"]
    t = summary["timeline"]
    assert t["job"] <= t["loop"] <= t["first_piece"] <= t["last_piece"] <= t["end"]
    assert early_read.active() is None  # ended with the job


def test_command_under_a_budget_reads_early_only_its_first_window(zin, tmp_path, read_first):
    path, a = zin
    out = tmp_path / "out.zarr"
    # the threads' buffers, then three chunks of float32 values read early in flight
    budget = _threads_cost("values") + 3 * (CHUNK * 4 + CHUNK * 4 * 3 // 2)
    summary = json.loads(invoke(path, out, "--where", "x < 0.5", "--json", "--device", "cpu",
                                "--memory-budget", str(budget)).output)
    assert read_first[0].count == 3
    assert summary["read_ahead"]["chunks"] == 3
    assert summary["peak_reserved"] <= budget
    np.testing.assert_array_equal(zarr.open_group(str(out))["values"][:], a[a < 0.5])


def test_corrupted_chunk_read_early_is_named_by_the_task(zin, tmp_path, read_first):
    path, _ = zin
    with open(os.path.join(path, "c", "4"), "wb") as f:
        f.write(b"\x28\xb5\x2f\xfd garbage")
    out = tmp_path / "out.zarr"
    result = invoke(path, out, "--where", "x < 0.5", "--device", "cpu", code=1)
    assert "input chunk 4" in result.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if "dask-compact-tmp" in p.name]


@pytest.mark.parametrize("flags", [["--no-read-ahead"], ["--chunks", "500"],
                                   ["--local", "processes"], ["--resume"]])
def test_no_early_read_where_the_job_reads_otherwise(zin, tmp_path, flags, monkeypatch):
    path, a = zin
    monkeypatch.setattr(early_read, "begin",
                        lambda *args: pytest.fail("early read started"))
    extra = ["--workers", "1"] if "processes" in flags else []
    output = invoke(path, tmp_path / "o.zarr", "--where", "x < 0.5", "--json",
                    "--device", "cpu", *flags, *extra).output
    summary = json.loads(output.strip().splitlines()[-1])  # after --resume's line on stderr
    assert summary["read_ahead"] is None
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "o.zarr"))["values"][:],
                                  a[a < 0.5])


def test_the_job_reads_what_the_early_read_did_not(zin, tmp_path):
    """A real command (no joining): whatever the race gives, the output is exact and every
    chunk is read exactly once."""
    path, a = zin
    src = open_input(str(path), None)
    summary = json.loads(invoke(path, tmp_path / "o.zarr", "--where", "x >= 0.25", "--json",
                                "--device", "cpu").output)
    assert summary["chunks_read"] == 11
    assert 0 <= summary["read_ahead"]["chunks"] <= 11
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "o.zarr"))["values"][:],
                                  a[a >= 0.25])
    assert src.reader.keys == early_read.plan(str(path), "values", None)[0].keys


# -- one entry-point scan ------------------------------------------------------------------------


def test_shared_scan_selects_what_each_call_would_get():
    before_all = metadata.entry_points()
    before = {g: sorted(map(str, metadata.entry_points(group=g)))
              for g in ("console_scripts", "dask_cli", "numcodecs.codecs", "nonexistent")}
    original = metadata.entry_points
    with shared_scan():
        assert metadata.entry_points is not original
        for g, eps in before.items():
            assert sorted(map(str, metadata.entry_points(group=g))) == eps
        everything = metadata.entry_points()
        assert metadata.entry_points() is everything  # scanned once
        assert sorted(everything.groups) == sorted(before_all.groups)
        assert sorted(map(str, metadata.entry_points(group="console_scripts",
                                                     name="dask-compact"))) == [
            s for s in before["console_scripts"] if "name='dask-compact'" in s]
    assert metadata.entry_points is original


def test_missing_chunk_allowed_reads_as_fill_value_with_early_read(zin, tmp_path, read_first):
    """The early threads never accept a missing chunk (it fails there); the task reads it under
    the job's own --allow-missing-chunks."""
    path, a = zin
    os.remove(os.path.join(path, "c", "3"))
    expect = a.copy()
    expect[3 * CHUNK : 4 * CHUNK] = 0  # zarr's default fill value
    out = tmp_path / "out.zarr"
    refused = invoke(path, out, "--where", "x < 0.5", "--device", "cpu", code=2)
    assert "missing" in refused.output and not out.exists()
    summary = json.loads(invoke(path, out, "--where", "x < 0.5", "--json", "--device", "cpu",
                                "--allow-missing-chunks").output)
    assert summary["read_ahead"]["chunks"] == 10  # all but the missing one
    np.testing.assert_array_equal(zarr.open_group(str(out))["values"][:],
                                  expect[expect < 0.5])


def test_thread_count_default_and_option(zin, tmp_path, monkeypatch):
    assert [early_read.default_threads(c) for c in (1, 2, 3, 9, 16, 64)] == [1, 1, 2, 8, 8, 8]
    path, a = zin
    seen = []
    original = early_read.EarlyRead

    class Counting(original):
        def __init__(self, reader, count, threads):
            seen.append(threads)
            super().__init__(reader, count, threads)

    monkeypatch.setattr(early_read, "EarlyRead", Counting)
    invoke(path, tmp_path / "o.zarr", "--where", "x < 0.5", "--device", "cpu",
           "--read-ahead-threads", "3")
    assert seen == [3]
    invoke(path, tmp_path / "p.zarr", "--where", "x < 0.5", "--device", "cpu")
    cores = len(os.sched_getaffinity(0))
    assert seen[1] == min(11, early_read.default_threads(cores))
    np.testing.assert_array_equal(zarr.open_group(str(tmp_path / "p.zarr"))["values"][:],
                                  a[a < 0.5])


def test_memory_cap_is_a_quarter_of_what_the_job_calls_available():
    import psutil

    quarter = psutil.virtual_memory().available // 4
    assert abs(early_read._memory_cap(None) - quarter) <= 0.05 * quarter
    assert early_read._memory_cap(12345) == 12345


def test_chunks_rewritten_after_the_early_read_are_read_again(zin, tmp_path, monkeypatch):
    """The early read starts before the job's fingerprint (what the commit checks): chunks
    rewritten in between were committed old next to new ones, exit 0 (a probe). Rewritten
    here once the early read has read every chunk, before the job opens INPUT."""
    path, a = zin
    original = early_read.begin

    def begin_then_rewrite(*args):
        early = original(*args)
        early.join(timeout=60)
        z = zarr.open_array(str(path), mode="r+")
        z[:CHUNK] = 0.125
        z[-CHUNK:] = 0.125
        return early

    monkeypatch.setattr(early_read, "begin", begin_then_rewrite)
    out = tmp_path / "out.zarr"
    summary = json.loads(invoke(path, out, "--where", "x < 0.3", "--json", "--device",
                                "cpu").output)
    b = zarr.open_array(str(path))[:]
    np.testing.assert_array_equal(zarr.open_group(str(out))["values"][:], b[b < 0.3])
    assert summary["read_ahead"]["chunks"] == 8  # the 11 but 0, 9 and 10, rewritten


def test_a_chunk_file_that_cannot_be_stat_ed_is_read_by_its_task(monkeypatch):
    """A ``stat`` failing with another error than a missing file (a permission, a stale NFS
    handle) escaped ``take`` raw, where a failed early read is handed to the task to read
    again and report (a review): the chunk is now taken as changed."""
    reader = SimpleNamespace(url="/nowhere", keys=["c/0"])

    def refused(reader, i):
        raise PermissionError(13, "Permission denied", reader.keys[i])

    monkeypatch.setattr(early_read, "chunk_file_identity", refused)
    assert early_read.unchanged_since(reader, 0, (1, 2, 3, 4, 5)) is False
