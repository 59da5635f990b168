"""map_compact on CuPy chunks: CuPy results and meta, known chunks, on the threaded scheduler
and on a dask_cuda.LocalCUDACluster. Needs CuPy and a CUDA device (and dask_cuda for the
cluster test)."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

import dask  # noqa: E402

import dask_compact  # noqa: E402,F401  (registers Array.map_compact)

pytestmark = pytest.mark.gpu


def _input(n: int = 2**20 + 11, chunks: int = 2**18):
    x_np = np.random.default_rng(0).random(n).astype(np.float32)
    return x_np, da.from_array(x_np, chunks=chunks).map_blocks(cupy.asarray)


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize(
    "algorithm,stable", [("auto", True), ("three-pass", True), ("hybrid", False)]
)
def test_threaded_scheduler(output: str, algorithm: str, stable: bool) -> None:
    x_np, x = _input()
    with dask.config.set(scheduler="threads"):
        r = x.map_compact(
            lambda v: (v > 0.2) & (v < 0.3), output=output, stable=stable, algorithm=algorithm
        )
        parts = r if output == "both" else (r,)
        for part in parts:
            assert isinstance(part._meta, cupy.ndarray)
            assert not any(np.isnan(c) for c in part.chunks[0])
        got = [p.compute() for p in parts]
    for g in got:
        assert isinstance(g, cupy.ndarray)
    m = (x_np > 0.2) & (x_np < 0.3)
    want = {
        "values": [x_np[m]],
        "indices": [np.flatnonzero(m)],
        "both": [x_np[m], np.flatnonzero(m)],
    }[output]
    for g, w in zip(got, want):
        g = cupy.asnumpy(g)
        if not stable:
            g, w = np.sort(g), np.sort(w)
        np.testing.assert_array_equal(g, w)


def test_local_cuda_cluster() -> None:
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    x_np, x = _input(2**22 + 3, 2**20)
    with (
        dask_cuda.LocalCUDACluster(n_workers=1, threads_per_worker=2) as cluster,
        distributed.Client(cluster) as client,
    ):
        y = x.map_compact("x < 0.125", output="both")
        v, i = y
        assert isinstance(v._meta, cupy.ndarray) and isinstance(i._meta, cupy.ndarray)
        assert sum(v.chunks[0]) == int((x_np < 0.125).sum())
        vv, ii = client.compute([v, i], sync=True)
        assert isinstance(vv, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(vv), x_np[x_np < 0.125])
        np.testing.assert_array_equal(cupy.asnumpy(ii), np.flatnonzero(x_np < 0.125))


def test_local_cuda_cluster_one_task_per_worker_run() -> None:
    """A persisted CuPy input: each worker compacts its run of chunks in one task, the result
    is in order with known chunks, and no chunk moves between workers."""
    dask_cuda = pytest.importorskip("dask_cuda")
    distributed = pytest.importorskip("distributed")
    ngpu = cupy.cuda.runtime.getDeviceCount()
    with (
        dask_cuda.LocalCUDACluster(n_workers=min(2, ngpu), threads_per_worker=1) as cluster,
        distributed.Client(cluster) as client,
    ):
        workers = sorted(client.nthreads())
        x_np = np.random.default_rng(4).random(2**22 + 5).astype(np.float32)
        cut = len(x_np) // len(workers)
        bounds = [
            (i * cut, len(x_np) if i == len(workers) - 1 else (i + 1) * cut)
            for i in range(len(workers))
        ]
        slabs = [
            client.persist(
                da.from_array(x_np[a:b], chunks=2**18).map_blocks(cupy.asarray), workers=[w]
            )
            for (a, b), w in zip(bounds, workers)
        ]
        x = da.concatenate(slabs).persist()
        distributed.wait(x)
        with distributed.get_task_stream() as ts:
            v, i = x.map_compact("x < 0.3", output="both")
        assert v.numblocks == (len(workers),) and v.chunks == i.chunks
        moved = [s for t in ts.data for s in t["startstops"] if s["action"] == "transfer"]
        assert moved == []
        m = x_np < 0.3
        np.testing.assert_array_equal(cupy.asnumpy(v.compute()), x_np[m])
        np.testing.assert_array_equal(cupy.asnumpy(i.compute()), np.flatnonzero(m))
        w = x.map_compact("x < 0.3", by_worker=False)
        assert w.numblocks == x.numblocks
        np.testing.assert_array_equal(cupy.asnumpy(w.compute()), x_np[m])
