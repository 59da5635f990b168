"""The CUDA IPC exchange of dask_compact.sort (backends/cuda_ipc.py) where it can be tested
without a GPU: when it may run (``ipc_refusal``), the table that keeps exported chunks alive
until the client releases them, the merge over joined pieces, and the refusal of a forced
``exchange="ipc"`` on NumPy chunks. The copies between GPUs run in tests/gpu/test_sort_gpu.py."""

from __future__ import annotations

import doctest
import pickle
import re

import numpy as np
import pytest

from dask_compact.backends import cuda_ipc, numpy_sort
from dask_compact.sort_graph import _merge_joined

GPU = dict(host="h", bus="0000:01:00.0", peers=["0000:02:00.0"], exportable=True, why="",
           free=80 * 2**30)
GPU2 = dict(GPU, bus="0000:02:00.0", peers=["0000:01:00.0"])


def test_ipc_runs_on_one_host_of_peer_gpus_with_room():
    assert cuda_ipc.ipc_refusal({"a": GPU, "b": GPU2}, {"a": 2**30, "b": 2**30}) is None
    # two workers sharing one GPU: IPC within the device
    assert cuda_ipc.ipc_refusal({"a": GPU, "b": dict(GPU)}, {"a": 1}) is None


@pytest.mark.parametrize("probes,need,match", [
    ({"a": GPU, "b": None}, {}, "no CuPy GPU on worker"),
    ({"a": GPU, "b": dict(GPU2, host="other")}, {}, "several hosts"),
    ({"a": GPU, "b": dict(GPU2, exportable=False, why="cudaErrorInvalidValue")}, {},
     "cannot be shared over CUDA IPC \\(cudaErrorInvalidValue\\)"),
    ({"a": dict(GPU, peers=[]), "b": GPU2}, {}, "cannot reach"),
    ({"a": GPU, "b": GPU2}, {"b": 79 * 2**30}, "worker b would need 79.0 GiB"),
    ({"a": GPU, "b": GPU2}, {"c": 1}, "worker c would need"),  # no answer from c
])  # fmt: skip
def test_ipc_refusals_say_why(probes, need, match):
    why = cuda_ipc.ipc_refusal(probes, need)
    assert why is not None
    assert re.search(match, why), why


def test_exported_chunks_live_until_released():
    rng = np.random.default_rng(0)
    a, b = np.sort(rng.random(100)), np.sort(rng.random(50))
    ia, ib = np.arange(100), np.arange(100, 150)
    want = np.concatenate([a[10:40], b[:5]])
    sa = cuda_ipc.pack("t1", 0, [[a], [ia]], [(0, a.size)])
    sb = cuda_ipc.pack("t1", 1, [[b], [ib]], [(0, b.size)])
    sb = pickle.loads(pickle.dumps(sb))  # as a merge gets it
    assert "t1" in cuda_ipc.exported_tokens()
    del a, ia  # the table keeps them
    got = cuda_ipc.join([sa, sb], [(0, 10, 40), (1, 0, 5)], 0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cuda_ipc.join([sa, sb], [(0, 10, 40), (1, 0, 5)], 1),
                                  np.r_[10:40, 100:105])
    assert cuda_ipc.release("t1") == 2 and cuda_ipc.release("t1") == 0
    assert "t1" not in cuda_ipc.exported_tokens()
    with pytest.raises(RuntimeError, match="released before its merges ran"):
        cuda_ipc.join([sa], [(0, 0, 1)], 0)


def test_released_segments_are_freed_in_the_background_and_settled_before_the_next_pack():
    import gc
    import weakref

    a = np.arange(1000.0)
    cuda_ipc.pack("t5", 0, [[a]], [(0, 1000)], segment_bytes=800)
    segs = cuda_ipc._kept["t5"][0][0]
    assert len(segs) == 10
    refs = [weakref.ref(g) for g in segs]
    del segs
    assert all(r() is not None for r in refs)
    assert cuda_ipc.release("t5") == 1
    cuda_ipc.settle()  # what the next pack and probe do first
    gc.collect()
    assert all(r() is None for r in refs)
    assert not cuda_ipc._freeing
    assert cuda_ipc.piece_counts()["release_s"] >= 0


def test_a_pack_is_the_slices_one_after_the_other():
    a, b = np.arange(10.0), np.arange(100.0, 120.0)
    s = cuda_ipc.pack("t3", 7, [[a, b], [a.astype(np.int64), b.astype(np.int64)]],
                      [(2, 5), (10, 12)])  # fmt: skip
    try:
        assert s.part == 7 and s.dtypes == ("<f8", "<i8")
        np.testing.assert_array_equal(cuda_ipc.join([s], [(0, 0, 5)], 0), [2, 3, 4, 110, 111])
        np.testing.assert_array_equal(cuda_ipc.join([s], [(0, 3, 5)], 1), [110, 111])
    finally:
        assert cuda_ipc.release("t3") == 1


def test_pieces_straddling_segments_are_joined_in_order():
    rng = np.random.default_rng(5)
    chunks = [np.sort(rng.random(m)) for m in (37, 5, 64)]
    orders = [np.arange(m, dtype=np.int64) + 100 * i for i, m in enumerate((37, 5, 64))]
    cuts = [(3, 30), (0, 5), (10, 61)]
    s = cuda_ipc.pack("t4", 0, [chunks, orders], cuts, segment_bytes=7 * 8)  # 7 per segment
    try:
        assert s.per_segment == (7, 7) and len(s.segments[0]) == -(-(27 + 5 + 51) // 7)
        whole = np.concatenate([c[lo:hi] for c, (lo, hi) in zip(chunks, cuts)])
        ids = np.concatenate([o[lo:hi] for o, (lo, hi) in zip(orders, cuts)])
        for lo, hi in [(0, 83), (6, 8), (13, 14), (20, 70), (82, 83), (5, 5)]:
            np.testing.assert_array_equal(cuda_ipc.join([s], [(0, lo, hi)], 0), whole[lo:hi])
            np.testing.assert_array_equal(cuda_ipc.join([s], [(0, lo, hi)], 1), ids[lo:hi])
        got = cuda_ipc.join([s, s], [(1, 50, 60), (0, 0, 9)], 0)
        np.testing.assert_array_equal(got, np.r_[whole[50:60], whole[0:9]])
    finally:
        cuda_ipc.release("t4")


@pytest.mark.parametrize("local", ["auto", "radix"])
@pytest.mark.parametrize("indices", [False, True])
def test_merge_over_joined_pieces_is_the_stable_sort(local, indices):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 20, 3000).astype(np.float32)
    a[::7] = np.nan
    parts = np.array_split(a, 3)
    starts = [0, len(parts[0]), len(parts[0]) + len(parts[1])]
    srcs = []
    for c, (p, s) in enumerate(zip(parts, starts)):
        v, o, _ = numpy_sort.sort_chunk(p, indices, s, np.zeros(0, np.int64), local)
        srcs.append(cuda_ipc.pack("t2", c, [[v]] + ([[o]] if o is not None else []), [(0, v.size)]))
    try:
        pieces = [(k, 0, len(p)) for k, p in enumerate(parts)]
        got = _merge_joined(srcs, pieces, indices, local)
    finally:
        cuda_ipc.release("t2")
    want = np.argsort(a, kind="stable") if indices else np.sort(a)
    np.testing.assert_array_equal(got, want)


def test_joined_merge_sorts_one_array_that_a_plain_merge_would_copy():
    v = np.array([3.0, 1.0, 2.0])
    o = np.array([10, 11, 12])
    np.testing.assert_array_equal(numpy_sort.sort_merge(v, [v], None), v)  # one sorted piece
    np.testing.assert_array_equal(numpy_sort.sort_merge(v, [v], None, joined=True), [1, 2, 3])
    np.testing.assert_array_equal(numpy_sort.sort_merge(v, [v], [o], joined=True), [11, 12, 10])
    np.testing.assert_array_equal(
        numpy_sort.sort_merge(v, [v], [o], local="radix", joined=True), [11, 12, 10])


def test_docstring_examples():
    failures, tried = doctest.testmod(cuda_ipc)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize("segment_bytes", [None, 4096])
@pytest.mark.usefixtures("one_bucket_per_chunk")  # 20,011 values: several buckets
def test_the_ipc_graph_on_workers_of_one_process_is_exact_and_releases_its_packs(
        monkeypatch, segment_bytes):  # fmt: skip
    """The exchange's graph (packs per worker and group, merges placed by group, pieces in
    chunk order, release after the merges) on NumPy chunks, where every worker lives in this
    process so the joins read the packs from the table: CUDA IPC's own precondition (CuPy
    chunks) is waived here; the copies between GPUs run in tests/gpu/test_sort_gpu.py."""
    da = pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    import dask_compact
    from dask_compact import sort_graph

    monkeypatch.setattr(sort_graph, "_ipc_refusal", lambda *a, **k: None)
    if segment_bytes:  # pieces that straddle the packs' segments
        monkeypatch.setattr(cuda_ipc, "SEGMENT_BYTES", segment_bytes)
    rng = np.random.default_rng(3)
    a = rng.integers(0, 30, 20_011).astype(np.float64)
    a[::13] = np.nan
    chunks = ((3001, 17, 4000, 2993, 5000, 1, 4999),)
    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:  # fmt: skip
        x = da.from_array(a, chunks=chunks).persist()
        distributed.wait(x)
        holders = {ws[0] for ws in client.who_has(distributed.futures_of(x)).values()}
        assert len(holders) > 1  # else there is no exchange to test
        with distributed.get_task_stream(client) as stream:
            y = dask_compact.sort(x)
            i = dask_compact.argsort(x)
        assert all(f.status == "finished" for f in distributed.futures_of(y))  # waited for
        assert cuda_ipc.exported_tokens() == []
        names = [t["key"][0] for t in stream.data if isinstance(t["key"], tuple)]
        packs = sum(n.startswith("sort-pack-") for n in names)
        assert 0 < packs <= 2 * len(holders) ** 2, packs  # per worker and group, 2 calls
        assert not any(n.startswith("sort-piece-") for n in names)
        np.testing.assert_array_equal(y.compute(), np.sort(a))
        np.testing.assert_array_equal(i.compute(), np.argsort(a, kind="stable"))


def test_ipc_is_refused_while_a_sorted_chunk_has_no_holder():
    """A chunk lost and being recomputed has no holder: the exchange cannot plan its packs,
    so it takes Dask's comm (and the workers are not even asked)."""
    from dask_compact.sort_graph import _ipc_refusal

    class DeviceMeta:  # stands for a CuPy array's type, by its module
        __module__ = "cupy._core.core"

    class Values:
        _meta = DeviceMeta()

    counts = np.ones((2, 2), np.int64)
    why = _ipc_refusal(None, Values(), np.zeros(2, np.int64), ["w"], [None, "w"], counts, 4)
    assert why is not None and "held by no worker" in why


def test_every_worker_packs_before_it_merges_and_a_held_result_keeps_its_keys(caplog):
    """A group's merges need every worker's pack of that group: a worker that ran its own
    merges before its remaining packs kept the others waiting (Dask's order put the merges
    first on some workers). And a second sort of the same array while the first result is
    held gets keys of its own (its graph names its own packs)."""
    import logging

    da = pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    import dask

    import dask_compact
    from dask_compact import sort_graph

    a = np.random.default_rng(8).random(2**18)
    # no work stealing, so that packs run where their chunks are held (with it, a loaded CI
    # machine's scheduler once moved one worker's packs to the others, CI run 24)
    with pytest.MonkeyPatch.context() as mp, \
            dask.config.set({"distributed.scheduler.work-stealing": False}), \
            distributed.LocalCluster(n_workers=4, threads_per_worker=1, processes=False,
                                     dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client, \
            caplog.at_level(logging.WARNING, logger="distributed.scheduler"):  # fmt: skip
        assert "stealing" not in cluster.scheduler.extensions
        mp.setattr(sort_graph, "_ipc_refusal", lambda *a, **k: None)
        # chunk k on worker k mod 4: every worker holds chunks, so every worker packs (as
        # persisted by Dask, one worker of a loaded CI machine once held none: 3 runs of 4)
        workers = sorted(client.nthreads())
        step = 2**18 // 32
        x = da.concatenate([
            client.persist(da.from_array(a[s:s + step], chunks=step), workers=[workers[k % 4]])
            for k, s in enumerate(range(0, a.size, step))
        ]).persist()
        distributed.wait(x)
        held = []
        for _ in range(3):
            with distributed.get_task_stream(client) as stream:
                held.append(dask_compact.sort(x, buckets=4))  # 2 MiB: else one bucket
            by_worker: dict = {}
            for t in stream.data:
                name = t["key"][0] if isinstance(t["key"], tuple) else t["key"]
                kind = "P" if name.startswith("sort-pack-") else "m" if "-out-" in name else ""
                if kind:
                    start = min(s["start"] for s in t["startstops"] if s["action"] == "compute")
                    by_worker.setdefault(t["worker"], []).append((start, kind))
            runs = ["".join(k for _, k in sorted(ts)) for ts in by_worker.values()]
            # the order is the property; which workers pack is the scheduler's choice (a pack
            # of chunks held by several workers runs on one of them: CI runs 24 and 46 of
            # 2026-12-06/07 gave ['PPPmm', 'PPPm', 'PPPm'], each in order, stealing off and
            # every chunk placed), so it asks only that packs ran on several workers
            assert all("mP" not in r for r in runs), runs
            assert sum("P" in r for r in runs) >= 2, runs
        assert len({y.name for y in held}) == 3
        for y in held:
            np.testing.assert_array_equal(y.compute(), np.sort(a))
    assert "Detected different `run_spec`" not in caplog.text
