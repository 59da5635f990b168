"""The streaming batch engine below the CLI: the window arithmetic, the resume point, the
executors, and whole streaming runs against NumPy under budgets from one chunk at a time to
everything at once."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

zarr = pytest.importorskip("zarr")
pytestmark = pytest.mark.timeout(120)  # a stalled stream fails fast

from dask_compact.batch.executor import ThreadExecutor
from dask_compact.batch.job import NAMES, create_group, cut
from dask_compact.batch.manifest import Manifest
from dask_compact.batch.plan import (
    Layout,
    chunk_cost,
    out_chunks_total,
    parts_of,
    thread_cost,
)
from dask_compact.batch.stream import Job, run_stream
from dask_compact.batch.tasks import OutputArrays


def source_of(a: np.ndarray) -> SimpleNamespace:
    """What create_group needs of a :class:`Source` of ``a``: dtype, shape, no attributes
    and no dimension names."""
    return SimpleNamespace(dtype=a.dtype, shape=a.shape, attrs={}, dims=None)


# -- the arithmetic -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=0, max_size=30), out_chunk=st.integers(1, 50))
def test_parts_tile_the_output_exactly(counts, out_chunk):
    """Every selected element lands in exactly one output chunk, in order, and every output
    chunk but the last is full."""
    offsets, o = {}, 0
    for k, c in enumerate(counts):
        offsets[k] = o
        o += c
    total = o
    pieces = {k: np.arange(offsets[k], offsets[k] + c) for k, c in enumerate(counts)}
    got = []
    n_out = out_chunks_total(total, out_chunk)
    for j in range(n_out):
        parts = parts_of(j, out_chunk, offsets, dict(enumerate(counts)), 0, len(counts) - 1)
        data = np.concatenate([pieces[p.chunk][p.lo : p.hi] for p in parts])
        assert len(data) == (out_chunk if j < n_out - 1 else total - j * out_chunk)
        assert all(p.hi > p.lo for p in parts)
        got.append(data)
    flat = np.concatenate(got) if got else np.empty(0, int)
    np.testing.assert_array_equal(flat, np.arange(total))


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 30), min_size=1, max_size=20), out_chunk=st.integers(1, 40),
       data=st.data())
def test_resume_point_needs_nothing_that_is_not_on_disk(counts, out_chunk, data):
    total = sum(counts)
    n_out = out_chunks_total(total, out_chunk)
    written = data.draw(st.sets(st.integers(0, max(0, n_out - 1)))) if n_out else set()
    first, offset = Manifest({}, counts, written).resume_point(out_chunk)
    assert offset == sum(counts[:first])
    done = 0
    while done in written:
        done += 1
    # every element below the resume offset belongs to a written output chunk ...
    assert offset <= done * out_chunk or first == len(counts)
    # ... and every chunk before `first` lies wholly in written output chunks
    assert sum(counts[:first]) <= max(done * out_chunk, 0) or first == len(counts)


def test_layout_rows_and_cost():
    lay = Layout.make((10, 3), 4, 4, None)
    assert lay.rows == (0, 4, 8, 10) and lay.out_chunk == 12
    assert [lay.size(i) for i in range(3)] == [12, 12, 6]
    assert [lay.start(i) for i in range(3)] == [0, 12, 24]
    # a chunk's selection buffers at full length and half again (a small selection's copy);
    # the decoded chunk is the thread's buffer, charged apart (thread_cost)
    full = 12 * (4 + 8)
    assert chunk_cost(lay, 0, "both") == chunk_cost(lay, 2, "both") == full + full // 2
    assert chunk_cost(lay, 0, "both", copies=True) == 2 * full + full // 2
    # a thread's buffer (a chunk, or an output chunk put together) and, while a task runs, a
    # compressed chunk plus a decoded one, or an encoded output chunk (plus slices received)
    assert thread_cost(lay, "both") == max(48, full) + max(2 * 48, full)
    assert thread_cost(lay, "both", copies=True) == max(48, full) + 2 * full
    assert Layout.make((0,), 8, 5, None).nchunks == 0
    # an input chunk longer than the input (--chunks 10**12): the output chunk is at most the
    # input (zarr stores a chunk at its full length: 3.6 TiB for this one before)
    big = Layout.make((1000, 2), 4, 10**12, None)
    assert big.nchunks == 1 and big.out_chunk == 2000
    assert Layout.make((1000, 2), 4, 10**12, 7).out_chunk == 7  # given: as given


# -- the thread executor ---------------------------------------------------------------------------


def test_thread_executor_dependencies_priority_and_errors():
    ex = ThreadExecutor(1)
    gate = threading.Event()
    order = []
    blocker = ex.submit(gate.wait)
    a = ex.submit(lambda: order.append("read") or 1)
    b = ex.submit(lambda: order.append("write") or 2, priority=1)
    c = ex.submit(lambda x, y: x + y, a, b)
    gate.set()
    assert c.result(timeout=10) == 3 and blocker.result(timeout=10)
    assert order == ["write", "read"]  # the write was queued later but runs first
    bad = ex.submit(lambda: 1 / 0)
    dependent = ex.submit(lambda x: x, bad)
    with pytest.raises(ZeroDivisionError):
        dependent.result(timeout=10)
    assert ex.derive(lambda v: v * 10, c).result(timeout=10) == 30
    ex.close()


def test_thread_executor_stop_cancels_queued_and_waits_for_running():
    ex = ThreadExecutor(1)
    started, running_done = threading.Event(), []

    def slow():
        started.set()
        time.sleep(0.3)
        running_done.append(True)

    first = ex.submit(slow)
    queued = ex.submit(lambda: 1)
    started.wait(5)
    ex.stop()
    assert running_done == [True] and first.done()
    assert queued.cancelled()


def test_running_keys_include_tasks_that_may_still_start():
    # After a cancel, a worker goes on starting queued tasks until it hears of it: drain()
    # must wait for those too, not only for the tasks executing at its first look.
    from types import SimpleNamespace

    from dask_compact.batch.runner import running_keys

    states = {"a": "executing", "b": "ready", "c": "memory", "d": "released", "e": "cancelled",
              "f": "waiting", "g": "constrained", "h": "flight", "i": "error",
              "j": "long-running", "k": "resumed"}
    tasks = {k: SimpleNamespace(key=k, state=v) for k, v in states.items()}
    worker = SimpleNamespace(state=SimpleNamespace(
        tasks=tasks, all_running_tasks=[tasks["a"], tasks["e"], tasks["j"]]))
    assert sorted(running_keys(worker)) == ["a", "b", "e", "f", "g", "j", "k"]


# -- whole streaming runs --------------------------------------------------------------------------


class ArrayRows:
    """An in-memory reader (what ZarrRows does, without a store)."""

    kind = "memory"
    fingerprint = "memory"

    def __init__(self, a: np.ndarray) -> None:
        self.a = a
        self.shape, self.dtype = a.shape, a.dtype
        self.reads = 0

    def read(self, r0: int, r1: int) -> np.ndarray:
        self.reads += 1
        return self.a[r0:r1].copy()


def stream_once(tmp_path, a, where, mode, rows, out_chunk, budget, threads=2, writes=1,
                reader_type=ArrayRows):
    Src = source_of(a)

    lay = Layout.make(a.shape, a.dtype.itemsize, rows, out_chunk)
    store = str(tmp_path / f"g-{mode}-{rows}-{out_chunk}-{budget}-{writes}.zarr")
    create_group(store, lay, Src, mode, {"complete": False})
    reader = reader_type(a)
    job = Job(reader, lay, where, mode, "cpu", OutputArrays(store, NAMES[mode], lay.out_chunk),
              budget, Manifest({}), store, writes_per_task=writes)
    ex = ThreadExecutor(threads)
    try:
        total = run_stream(ex, job)
    finally:
        ex.close()
    cut(store, NAMES[mode], total)
    g = zarr.open_group(store=store, mode="r")
    return total, {k: g[k][:] for k in NAMES[mode]}, job


@pytest.mark.parametrize("budget", [1, 10**4, 10**9], ids=["one-chunk", "small", "all"])
@pytest.mark.parametrize("n, rows, out_chunk", [(0, 5, None), (1, 1, 1), (31, 4, 7),
                                                (1025, 33, 100), (1023, 1023, 31),
                                                (997, 10, 1000)])
def test_stream_matches_numpy(tmp_path, n, rows, out_chunk, budget):
    a = np.random.default_rng(n).random(n)
    for where in ("x > 0.6", "x > 2", "x >= 0"):  # some, none, all
        m = a > 0.6 if where == "x > 0.6" else (a > 2 if where == "x > 2" else a >= 0)
        total, arrays, job = stream_once(tmp_path / where.replace(" ", ""), a, where, "both",
                                         rows, out_chunk, budget)
        assert total == m.sum()
        np.testing.assert_array_equal(arrays["values"], a[m])
        np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))
        assert job.stats.chunks == job.layout.nchunks
        if budget == 1 and n:
            # one task at a time: the chunk being read, a piece partly written, and the pieces
            # waiting for the rest of one output chunk (a piece is charged the buffer it holds:
            # up to 4x its selection, see numpy_backend._trim)
            lay = job.layout
            biggest = max(chunk_cost(lay, i, "both") for i in range(lay.nchunks))
            piece = max(lay.size(i) for i in range(lay.nchunks)) * 16
            assert job.stats.peak_reserved <= biggest + piece + 4 * lay.out_chunk * 16


@pytest.mark.parametrize("writes", [2, 5, 10**6])
@pytest.mark.parametrize("budget", [1, 10**4, 10**9], ids=["one-chunk", "small", "all"])
@pytest.mark.parametrize("n, rows, out_chunk", [(1, 1, 1), (1025, 33, 7), (997, 100, 10),
                                                (4099, 1000, 37)])
def test_stream_with_several_writes_a_task_matches_numpy(tmp_path, n, rows, out_chunk, budget,
                                                         writes):
    """Output chunks written several a task (Job.writes_per_task): every chunk once, NumPy's
    arrays, at least the chunks over ``writes`` tasks and at most one a chunk."""
    a = np.random.default_rng(n + 7).random(n)
    for where in ("x > 0.6", "x >= 0"):
        m = a > 0.6 if where == "x > 0.6" else a >= 0
        total, arrays, job = stream_once(tmp_path / where.replace(" ", ""), a, where, "both",
                                         rows, out_chunk, budget, writes=writes)
        assert total == m.sum()
        np.testing.assert_array_equal(arrays["values"], a[m])
        np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))
        chunks = out_chunks_total(total, job.layout.out_chunk)
        assert -(-chunks // writes) <= job.stats.write_tasks <= chunks
        assert sorted(job.manifest.written) == list(range(chunks))
        if budget == 10**9 and chunks > writes:  # all at once: whole groups
            assert job.stats.write_tasks < chunks


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "uint64", "float32", "float64",
                                   "bool"])
def test_stream_dtypes_and_nd(tmp_path, dtype):
    rng = np.random.default_rng(3)
    a = (rng.random((67, 5)) * 100).astype(dtype)
    where = "x" if dtype == "bool" else "x > 40"
    m = a.astype(bool) if dtype == "bool" else a > 40
    for mode in ("values", "indices"):
        total, arrays, _ = stream_once(tmp_path, a, where, mode, 6, 13, 4000)
        expect = a[m] if mode == "values" else np.flatnonzero(m)
        np.testing.assert_array_equal(arrays[mode], expect)
        assert arrays[mode].dtype == expect.dtype


def test_budget_bounds_what_is_in_flight(tmp_path):
    a = np.random.default_rng(5).random(20_000)
    budget = 3 * (1000 * 8 + 1000 * 16)  # three chunks of 1000 at their worst case
    _, arrays, job = stream_once(tmp_path, a, "x < 0.5", "both", 1000, 700, budget, threads=2)
    assert job.stats.peak_reserved <= budget
    np.testing.assert_array_equal(arrays["values"], a[a < 0.5])


def test_tiny_tasks_are_read_a_bounded_number_at_a_time(tmp_path, monkeypatch):
    """Tasks far smaller than the budget: no more input chunks read at once than
    stream.tasks_ahead allows (their bookkeeping is memory the budget does not see; every
    task was in flight at once before), and NumPy's arrays."""
    from dask_compact.batch import stream

    monkeypatch.setattr(stream, "TASKS_AHEAD_MIN", 6)
    monkeypatch.setattr(stream, "TASKS_AHEAD_PER_THREAD", 1)
    a = np.random.default_rng(11).random(997)
    _, arrays, job = stream_once(tmp_path, a, "x > 0.3", "both", 3, 5, 10**9, threads=2)
    assert job.stats.peak_reading == 6
    np.testing.assert_array_equal(arrays["values"], a[a > 0.3])
    np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(a > 0.3))


def test_pieces_waiting_for_a_sparse_output_chunk_do_not_stop_the_reads(tmp_path,
                                                                       monkeypatch):
    """A sparse selection fills an output chunk from many input chunks, whose pieces wait
    for it: the cap counted them too, so past it the job read one chunk at a time (a
    review: ``x > 0.9999`` 14.5 s against 9.0 s). Only reads count now: four threads keep
    reading side by side however many pieces wait."""
    from dask_compact.batch import stream

    monkeypatch.setattr(stream, "TASKS_AHEAD_MIN", 6)
    monkeypatch.setattr(stream, "TASKS_AHEAD_PER_THREAD", 1)
    lock = threading.Lock()
    seen = {"now": 0, "reads": 0, "most_late": 0}

    class Slow(ArrayRows):
        def read(self, r0, r1):
            with lock:
                seen["now"] += 1
                seen["reads"] += 1
                if seen["reads"] > 40:  # well past the cap's worth of waiting pieces
                    seen["most_late"] = max(seen["most_late"], seen["now"])
            time.sleep(0.01)
            with lock:
                seen["now"] -= 1
            return super().read(r0, r1)

    a = np.random.default_rng(1).random(400)
    _, arrays, job = stream_once(tmp_path, a, "x > 0.9", "both", 2, 400, 10**9, threads=4,
                                 reader_type=Slow)
    assert seen["most_late"] >= 2
    assert job.stats.peak_reading <= 6
    np.testing.assert_array_equal(arrays["values"], a[a > 0.9])


def test_tasks_ahead_grows_with_the_threads():
    from dask_compact.batch.stream import TASKS_AHEAD_MIN, TASKS_AHEAD_PER_THREAD, tasks_ahead

    assert tasks_ahead(0) == tasks_ahead(2) == TASKS_AHEAD_MIN
    many = 4 * TASKS_AHEAD_MIN // TASKS_AHEAD_PER_THREAD
    assert tasks_ahead(many) == 4 * TASKS_AHEAD_MIN


def test_a_failed_read_names_the_chunk(tmp_path):
    a = np.arange(100.0)

    class Broken(ArrayRows):
        def read(self, r0, r1):
            if r0 == 40:
                raise OSError("bad bytes")
            return super().read(r0, r1)

    lay = Layout.make(a.shape, 8, 20, 10)
    store = str(tmp_path / "g.zarr")

    Src = source_of(a)

    create_group(store, lay, Src, "values", {})
    job = Job(Broken(a), lay, "x > 1", "values", "cpu",
              OutputArrays(store, ("values",), 10), 10**9, Manifest({}), store)
    ex = ThreadExecutor(2)
    with pytest.raises(Exception, match=r"input chunk 2 \(rows 40:60\).*bad bytes"):
        run_stream(ex, job)
    ex.stop()


@pytest.mark.parametrize("seed", range(6))
def test_resume_from_any_written_subset(tmp_path, seed):
    """A job interrupted with any subset of its output chunks on disk (writes end out of
    order): the resumed stream rewrites exactly the missing ones, reads only the input chunks
    that feed them, and the arrays equal NumPy's."""
    import os
    import shutil

    rng = np.random.default_rng(seed)
    a = rng.random(3000)
    rows, C = 100, 170
    total, _, job = stream_once(tmp_path / "full", a, "x < 0.4", "both", rows, C, 10**9)
    lay = job.layout
    n_out = out_chunks_total(total, C)
    written = {j for j in range(n_out) if rng.random() < 0.6}
    store = tmp_path / "full" / f"g-both-{rows}-{C}-{10**9}-1.zarr"  # as stream_once names it
    part = tmp_path / "part.zarr"
    shutil.copytree(store, part)
    for name in NAMES["both"]:  # undo the cut, and drop the chunks "not yet written"
        z = zarr.open_array(store=str(part), path=name, mode="r+")
        z.resize((lay.n,))
        for j in set(range(n_out)) - written:
            os.remove(part / name / "c" / str(j))
    counts = [int((a[lay.start(i): lay.start(i) + lay.size(i)] < 0.4).sum())
              for i in range(lay.nchunks)]
    reader = ArrayRows(a)
    m = Manifest({}, counts, set(written))
    resumed = Job(reader, lay, "x < 0.4", "both", "cpu",
                  OutputArrays(str(part), NAMES["both"], C), 10**9, m, str(part))
    ex = ThreadExecutor(2)
    try:
        assert run_stream(ex, resumed) == total
    finally:
        ex.close()
    cut(str(part), NAMES["both"], total)
    g = zarr.open_group(store=str(part), mode="r")
    np.testing.assert_array_equal(g["values"][:], a[a < 0.4])
    np.testing.assert_array_equal(g["indices"][:], np.flatnonzero(a < 0.4))
    assert m.written == set(range(n_out))
    # the chunks read are exactly those feeding a missing output chunk
    offsets = np.concatenate([[0], np.cumsum(counts)])
    needed = {i for i in range(lay.nchunks) if counts[i] and any(
        j not in written for j in range(offsets[i] // C, (offsets[i + 1] - 1) // C + 1))}
    assert reader.reads == len(needed) == resumed.stats.chunks


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "int64", "float32",
                                   "float64"])
def test_chunk_files_written_directly_are_the_bytes_zarr_writes(tmp_path, dtype):
    """The direct writer and zarr's own write give byte-identical chunk files (whole chunks
    and the padded last one), so the output is an ordinary Zarr array."""
    import os

    from dask_compact.batch.job import writes_chunk_files
    from dask_compact.batch.tasks import write_chunk_file

    rng = np.random.default_rng(7)
    data = (rng.random(1000) * 300 - 100).astype(dtype)
    lay = Layout.make((1000,), data.dtype.itemsize, 1000, 300)

    Src = source_of(data)

    stores = {}
    for how in ("zarr", "direct"):
        store = str(tmp_path / f"{how}.zarr")
        create_group(store, lay, Src, "values", {})
        assert writes_chunk_files(store, ("values",))
        for j in range(4):
            part = data[j * 300 : (j + 1) * 300]
            if how == "zarr":
                zarr.open_array(store=store, path="values", mode="r+")[j * 300 :
                                                                      j * 300 + len(part)] = part
            else:
                write_chunk_file(os.path.join(store, "values"), j, part, 300)
        cut(store, ("values",), 1000)
        stores[how] = store
    for j in range(4):
        a, b = (open(os.path.join(stores[h], "values", "c", str(j)), "rb").read()
                for h in ("zarr", "direct"))
        assert a == b, j
    got = zarr.open_array(store=stores["direct"], path="values", mode="r")[:]
    np.testing.assert_array_equal(got, data)


def test_stream_with_direct_writes_matches_numpy(tmp_path):
    from dask_compact.batch.job import writes_chunk_files

    a = np.random.default_rng(9).random(5003)

    Src = source_of(a)

    lay = Layout.make(a.shape, 8, 400, 333)
    store = str(tmp_path / "g.zarr")
    create_group(store, lay, Src, "both", {})
    direct = writes_chunk_files(store, NAMES["both"])
    dest = OutputArrays(store, NAMES["both"], lay.out_chunk, direct)
    assert dest.direct
    job = Job(ArrayRows(a), lay, "x < 0.3", "both", "cpu", dest, 20_000, Manifest({}), store)
    ex = ThreadExecutor(2)
    try:
        total = run_stream(ex, job)
    finally:
        ex.close()
    cut(store, NAMES["both"], total)
    g = zarr.open_group(store=store, mode="r")
    np.testing.assert_array_equal(g["values"][:], a[a < 0.3])
    np.testing.assert_array_equal(g["indices"][:], np.flatnonzero(a < 0.3))


def test_gpu_warmup_without_a_gpu_ends_quietly():
    """Without CuPy or a device the warm-up thread ends at once, having prepared nothing; the
    job decides where to run (and says why) as before."""
    import importlib.util

    from dask_compact.batch.warmup import GpuWarmup

    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here (the GPU tests cover the warm-up)")
    w = GpuWarmup()
    w.prepare("x < 0.5", np.dtype("float32"), "values")
    w.close(timeout=30)
    assert w.devices == 0 and not w.prepared


def test_spare_threads_counts_the_idle_threads_of_the_pool():
    from dask_compact.batch.executor import spare_threads

    assert spare_threads() == 0  # not a pool thread
    ex = ThreadExecutor(4)
    release = threading.Event()
    started = threading.Semaphore(0)

    def hold() -> int:
        started.release()
        release.wait(30)
        return spare_threads()

    try:
        held = [ex.submit(hold) for _ in range(2)]
        for _ in held:
            assert started.acquire(timeout=30)
        assert ex.submit(spare_threads).result(timeout=30) == 1  # 3 of 4 run: it and the two
        release.set()
        assert [f.result(timeout=30) for f in held] in ([2, 2], [2, 3], [3, 2], [3, 3])
        release.clear()
        busy = [ex.submit(hold) for _ in range(6)]  # 4 run, 2 wait in the queue
        for _ in range(4):
            assert started.acquire(timeout=30)
        assert ex.spare() == 0
        release.set()
        [f.result(timeout=30) for f in busy]
    finally:
        release.set()
        ex.close()


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "float32", "int64", "float64"])
@pytest.mark.parametrize("n", [1, 31, 33, 1025, 65_537, 1_000_003])
def test_zstd_encode_on_spare_threads_is_a_frame_zarr_reads(dtype, n):
    """The multi-threaded encoder's frame differs from numcodecs' bytes, never from its data."""
    from numcodecs import Zstd

    from dask_compact.batch.tasks import zstd_encode

    a = (np.random.default_rng(n).random(n) * 200 - 50).astype(dtype)
    for spare in (0, 1, 3, 15):
        frame = zstd_encode(a, spare)
        np.testing.assert_array_equal(np.frombuffer(Zstd().decode(frame), dtype), a)


@pytest.mark.parametrize("zstandard_present", [True, False])
def test_job_writing_every_chunk_on_spare_threads_matches_numpy(tmp_path, monkeypatch,
                                                               zstandard_present):
    """Every output chunk encoded as if threads were idle (zstd's multi-threaded encoder, or
    numcodecs where zstandard is missing): zarr reads back exactly NumPy's selection."""
    import sys

    import zarr
    from click.testing import CliRunner

    from dask_compact import cli
    from dask_compact.batch import tasks

    monkeypatch.setattr(tasks, "spare_threads", lambda: 3)
    if not zstandard_present:
        monkeypatch.setitem(sys.modules, "zstandard", None)  # import raises ImportError
    x = (np.random.default_rng(9).random(300_007) * 4 - 2).astype(np.float32)
    src = tmp_path / "in.zarr"
    zarr.create_array(store=str(src), shape=x.shape, dtype=x.dtype, chunks=(65_536,))[:] = x
    out = tmp_path / "out.zarr"
    r = CliRunner().invoke(cli.main, [str(src), str(out), "--where", "x > 0.5", "--output",
                                      "both", "--local", "threads", "--device", "cpu",
                                      "--output-chunks", "9999"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    g = zarr.open_group(str(out), mode="r")
    np.testing.assert_array_equal(g["values"][:], x[x > 0.5])
    np.testing.assert_array_equal(g["indices"][:], np.flatnonzero(x > 0.5))


@pytest.mark.parametrize("mode", ["values", "indices", "both"])
def test_stream_chunks_of_several_segments(tmp_path, mode, monkeypatch):
    """Input chunks of more than a segment (the CPU backend's ``_SEGMENT``, lowered here) are
    compacted segment by segment into buffers of the job's pool (``piece_alloc``), grown with
    their selection: the output equals NumPy's for none, some and every element selected."""
    from dask_compact.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "_SEGMENT", 64)
    a = np.random.default_rng(5).random(3001)
    for where in ("x > 0.6", "x > 2", "x >= 0"):
        m = a > 0.6 if where == "x > 0.6" else (a > 2 if where == "x > 2" else a >= 0)
        out = tmp_path / where.replace(" ", "")
        total, arrays, _ = stream_once(out, a, where, mode, 700, 500, 10**6)
        assert total == m.sum()
        if mode != "indices":
            np.testing.assert_array_equal(arrays["values"], a[m])
        if mode != "values":
            np.testing.assert_array_equal(arrays["indices"], np.flatnonzero(m))


@settings(max_examples=60, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 300)), max_size=80),
       st.sampled_from([0, 600, 1 << 20]))
def test_host_pool_takes_the_smallest_idle_buffer_that_fits_as_a_model_does(steps, keep):
    """The pool against a model of its rule: a request takes the smallest idle buffer that
    holds it if that is at most twice its size (else a new one); a buffer given back stays
    idle while the idle and leased bytes stay within ``keep``; ``peak`` is the most bytes
    idle and leased together. (The idle buffers were a list walked and summed per call,
    which made a job of 70,001 one-row chunks spend most of its time there; now they are
    kept in order of size.)"""
    import gc

    from dask_compact.batch.host_buffers import HostPool

    pool = HostPool(keep=keep)
    idle: list[int] = []  # the model: sizes of idle buffers
    leased: dict[int, tuple[np.ndarray, int]] = {}  # id -> (array, its buffer's size)
    peak = 0
    gc.disable()  # the leases go back when this test drops them, not at a collection
    try:
        for give_back, n in steps:
            if give_back and leased:
                key = sorted(leased)[n % len(leased)]
                size = leased.pop(key)[1]  # the array dropped: its lease goes back
                if sum(idle) + sum(s for _, s in leased.values()) + size <= keep:
                    idle.append(size)
                continue
            want = max(1, n * 8)
            fits = sorted(s for s in idle if want <= s <= 2 * want)
            size = fits[0] if fits else want
            if fits:
                idle.remove(size)
            arr = pool.alloc(n, np.float64)
            assert arr.shape == (n,) and arr.dtype == np.float64
            arr[:] = n  # writable, and its own memory
            leased[id(arr)] = (arr, size)
            peak = max(peak, sum(s for _, s in leased.values()) + sum(idle))
            root = arr
            while isinstance(root.base, np.ndarray):
                root = root.base
            assert root.nbytes == size, (steps, keep)
            assert pool.peak == peak
            del arr, root  # only `leased` holds it
        assert all(int(a[0]) == a.size for a, _ in leased.values() if a.size)
    finally:
        gc.enable()


def test_a_lease_collected_while_the_pool_is_locked_does_not_deadlock():
    """A pooled buffer goes back to the pool from its lease's ``__del__``, which the garbage
    collector runs on whatever thread allocates when it collects: inside ``HostPool.alloc``,
    which holds the pool's lock, the give-back waited for that lock, on the same thread,
    forever. The twelfth session's probe hung there in a plain ``--local threads`` job (every
    task thread then waited for the lock). A lease in a reference cycle, collected while
    ``alloc`` holds the lock, now goes back without waiting: the alloc returns, and the
    buffer is idle in the pool for the next one."""
    import gc

    from dask_compact.batch.host_buffers import HostPool

    class Collecting(list):  # the collector runs as alloc looks up the idle buffers
        def __len__(self):
            gc.collect()
            return super().__len__()

    pool = HostPool(keep=1 << 20)
    gc.disable()
    try:
        a = pool.alloc(100, np.float64)
        cycle: list = [a]
        cycle.append(cycle)  # only the collector frees the buffer
        del a, cycle
        pool._idle = Collecting()
        done = []
        t = threading.Thread(target=lambda: done.append(pool.alloc(10, np.float64)),
                             daemon=True)
        t.start()
        t.join(10)
    finally:
        gc.enable()
    assert done, "HostPool.alloc deadlocked on its own lock"
    assert done[0].shape == (10,)
    b = pool.alloc(100, np.float64)  # the collected buffer, given back, is taken again
    assert b.shape == (100,)
    assert pool.peak == 800 + 80  # no third buffer was made
