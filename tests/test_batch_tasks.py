"""How many input chunks one task of ``dask compact`` reads, and how many output chunks one task
writes (``dask-compact.batch.task-bytes``): the rule itself, and whole commands with it on,
against NumPy, under threads, worker processes and ``--resume``, for an array and for a Zarr
group's fields.

The rest of the suite runs with one chunk a task (tests/conftest.py); these tests set the
setting themselves, to a size that groups their small chunks."""

from __future__ import annotations

import json

import dask
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

zarr = pytest.importorskip("zarr")
pytestmark = pytest.mark.timeout(300)

from cli_helpers import kill_halfway, run  # noqa: E402

from dask_compact.batch import early_read  # noqa: E402
from dask_compact.batch.plan import task_rows  # noqa: E402

ENV = "DASK_DASK_COMPACT__BATCH__TASK_BYTES"
TASK_BYTES = 1 << 16  # 16 chunks of 1,000 float32 a task


@pytest.fixture
def grouped(monkeypatch):
    """Tasks of TASK_BYTES in this process and in the commands it starts."""
    monkeypatch.setenv(ENV, str(TASK_BYTES))
    with dask.config.set({"dask-compact.batch.task-bytes": TASK_BYTES}):
        yield


@settings(max_examples=300, deadline=None)
@given(chunk_rows=st.integers(1, 5000), row_bytes=st.integers(1, 4096),
       n_rows=st.integers(0, 10**6), min_bytes=st.sampled_from([0, 1, 1000, 1 << 16, 8 << 20]))
def test_a_task_reads_whole_chunks_enough_of_them_and_never_past_the_input(
        chunk_rows, row_bytes, n_rows, min_bytes):
    rows = task_rows(chunk_rows, row_bytes, n_rows, min_bytes)
    chunks = rows // chunk_rows
    assert rows % chunk_rows == 0 and chunks >= 1  # whole chunks: each decoded once
    if min_bytes == 0 or chunk_rows * row_bytes >= min_bytes:
        assert chunks == 1
    else:
        # as many chunks as make min_bytes without going over, unless the input ends first
        assert chunks * chunk_rows * row_bytes <= min_bytes or chunks == 1
        assert (chunks + 1) * chunk_rows * row_bytes > min_bytes or rows >= n_rows
    assert rows - chunk_rows < max(n_rows, 1)  # no task of chunks past the last one


def make(path, a, chunks):
    z = zarr.create_array(store=str(path), shape=a.shape, dtype=a.dtype, chunks=chunks)
    z[:] = a
    return path


@pytest.mark.parametrize("flags", [["--local", "threads"],
                                   ["--local", "processes", "--workers", "2"]])
def test_tasks_read_several_small_chunks_and_the_output_is_numpys(tmp_path, grouped, flags):
    """101 chunks of 1,000 float32 (4 KB) in tasks of 16: 7 tasks; the output's chunks are the
    input's all the same, written several a task, and its arrays NumPy's."""
    a = np.random.default_rng(5).random(100_003).astype(np.float32)
    path = make(tmp_path / "in.zarr", a, (1000,))
    out = tmp_path / "out.zarr"
    res = run(path, out, "-w", "x < 0.3", "--output", "both", "--json", *flags)
    summary = json.loads(res.stdout)
    assert summary["input_chunks"] == 101 and summary["tasks"] == 7
    assert summary["chunks_read"] == 7
    # output chunks of 1,000 values and indices (12 KB): up to 5 a write task
    out_chunks = -(-int((a < 0.3).sum()) // 1000)
    assert -(-out_chunks // 5) <= summary["write_tasks"] < out_chunks
    g = zarr.open_group(str(out), mode="r")
    assert g["values"].chunks == (1000,)
    np.testing.assert_array_equal(g["values"][:], a[a < 0.3])
    np.testing.assert_array_equal(g["indices"][:], np.flatnonzero(a < 0.3))
    text = run(path, tmp_path / "out2.zarr", "-w", "x < 0.3", *flags).output
    assert "101 chunks in 7 tasks, from" in text


def test_rows_of_a_2d_input_are_grouped_by_their_bytes(tmp_path, grouped):
    """Chunks of 50 rows of 7 float64 (2,800 bytes): 23 a task; the output is the flat
    selection in C order, as NumPy's."""
    a = np.random.default_rng(6).random((3001, 7))
    path = make(tmp_path / "in.zarr", a, (50, 7))
    out = tmp_path / "out.zarr"
    summary = json.loads(run(path, out, "-w", "x > 0.6", "--json", "--local", "threads").stdout)
    rows = task_rows(50, 7 * 8, 3001, TASK_BYTES)
    assert rows == 50 * 23
    assert summary["input_chunks"] == 61 and summary["tasks"] == -(-3001 // rows)
    np.testing.assert_array_equal(zarr.open_group(str(out), mode="r")["values"][:], a[a > 0.6])


def test_chunks_given_are_what_a_task_reads(tmp_path, grouped):
    """--chunks is the rows a task reads, grouped or not, and the output's chunks."""
    a = np.random.default_rng(7).random(20_011)
    path = make(tmp_path / "in.zarr", a, (1000,))
    out = tmp_path / "out.zarr"
    summary = json.loads(run(path, out, "-w", "x < 0.5", "--chunks", "3000", "--json",
                             "--local", "threads").stdout)
    assert summary["input_chunks"] == summary["tasks"] == 7
    g = zarr.open_group(str(out), mode="r")
    assert g["values"].chunks == (3000,)
    np.testing.assert_array_equal(g["values"][:], a[a < 0.5])


def test_a_grouped_job_killed_resumes_to_numpys_output(tmp_path, grouped):
    """SIGKILLed once 3 output chunks are written, then --resume: NumPy's arrays; a resume
    with another task size is refused, naming the setting."""
    a = np.random.default_rng(8).random(200_003).astype(np.float32)
    path = make(tmp_path / "in.zarr", a, (1000,))
    out = tmp_path / "out.zarr"
    args = ("--where", "x > 0.3", "--output-chunks", "20000", "--local", "threads")
    kill_halfway(tmp_path, path, out, *args, writes=3)
    with dask.config.set({"dask-compact.batch.task-bytes": 2 * TASK_BYTES}):
        res = run(path, out, *args, "--resume", code=2)
    assert "--chunks or dask-compact.batch.task-bytes: 16000 then, 32000 now" in res.output
    resumed = json.loads(run(path, out, *args, "--resume", "--json").stdout)
    assert resumed["resumed_from_chunk"] is not None
    np.testing.assert_array_equal(zarr.open_group(str(out), mode="r")["values"][:], a[a > 0.3])


def test_no_early_read_where_tasks_read_several_chunks(tmp_path, grouped):
    """The early read decodes chunk by chunk, which a task of several would not take."""
    a = np.random.default_rng(9).random(50_000).astype(np.float32)
    path = make(tmp_path / "in.zarr", a, (1000,))
    assert early_read.plan(str(path), "values", None) is None
    with dask.config.set({"dask-compact.batch.task-bytes": 0}):
        planned = early_read.plan(str(path), "values", None)
    assert planned is not None and planned[1] > 0


@pytest.mark.parametrize("flags", [["--local", "threads"],
                                   ["--local", "processes", "--workers", "2"]])
def test_record_fields_in_small_chunks_are_read_several_a_task(tmp_path, grouped, flags):
    """A Zarr group's fields (chunks of 500 rows: 4 KB + 2 KB a chunk): the record's rows
    are grouped by the bytes of a row of every field read, and its output chunks (500 rows of
    12 bytes) written 10 a task; each field the NumPy selection."""
    rng = np.random.default_rng(10)
    n = 30_007
    e = rng.random(n)
    q = rng.integers(-5, 5, n).astype(np.int32)
    g = zarr.open_group(str(tmp_path / "in.zarr"), mode="w")
    for name, v in (("energy", e), ("charge", q)):
        g.create_array(name, shape=v.shape, dtype=v.dtype, chunks=(500,))[:] = v
    out = tmp_path / "out.zarr"
    summary = json.loads(run(tmp_path / "in.zarr", out, "-w", "(energy > 0.5) & (charge > 0)",
                             "--json", *flags).stdout)
    rows = task_rows(500, 12, n, TASK_BYTES)
    assert rows == 500 * 10
    assert summary["input_chunks"] == 61 and summary["tasks"] == -(-n // rows)
    keep = (e > 0.5) & (q > 0)
    got = zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(got["energy"][:], e[keep])
    np.testing.assert_array_equal(got["charge"][:], q[keep])
    assert got["energy"].chunks == (500,)
    out_chunks = -(-int(keep.sum()) // 500)
    assert -(-out_chunks // 10) <= summary["write_tasks"] < out_chunks
