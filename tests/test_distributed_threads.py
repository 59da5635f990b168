"""A worker with several threads gets as many runs of chunks (its own cluster: a second client
beside test_distributed's module client would share dask's global scheduler setting)."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
from distributed import Client, LocalCluster

import dask_compact  # noqa: F401  (registers Array.map_compact)


def test_threads_split_a_workers_run():
    """A worker with several threads gets as many runs, so its chunks still run in parallel."""
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0",
                      worker_dashboard_address=None) as cluster, Client(cluster) as c:
        a = np.random.default_rng(8).random(10_007)
        x = da.from_array(a, chunks=1_000).persist()
        y = x.map_compact("x < 0.5")
        assert y.numblocks == (6,)  # 2 runs, each cut in 3 (5 chunks at least: direct._parts)
        np.testing.assert_array_equal(y.compute(), a[a < 0.5])
        with dask.config.set({"dask-compact.direct": False}):  # the same as one task per run
            t = x.map_compact("x < 0.4")
        assert t.numblocks == (2,)
        np.testing.assert_array_equal(t.compute(), a[a < 0.4])
        assert sorted(c.nthreads().values()) == [2]
