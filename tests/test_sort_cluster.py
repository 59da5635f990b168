"""The default buckets of a sort of NumPy chunks on a distributed cluster (sort_cluster):
one bucket for small arrays and clusters of two threads, no more buckets than workers."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from conftest import local_process_cluster
from distributed import wait

import dask_compact
from dask_compact.sort_cluster import Shape, cluster_buckets, one_bucket

MiB = 2**20


def test_one_bucket_for_small_arrays_and_two_threads():
    many = Shape(workers=4, threads=16, smallest_limit=8 * 2**30)
    assert one_bucket(4 * MiB, 4, False, many)  # 16 MiB: the setting's default
    assert not one_bucket(4 * MiB + 1, 4, False, many)
    two = Shape(workers=2, threads=2, smallest_limit=8 * 2**30)
    assert one_bucket(2**28, 4, False, two)  # 1 GiB, a quarter of 8 GiB holds it twice
    assert one_bucket(2**29, 4, False, two)  # 2 GiB: exactly a quarter
    assert not one_bucket(2**29 + 1, 4, False, two)  # a quarter of a worker does not hold it
    assert not one_bucket(2**27, 4, True, two)  # an argsort's indices and keys: 20 B each
    assert one_bucket(2**40, 8, False, Shape(2, 2, 0))  # no limit set: nothing to check
    with dask.config.set({"dask-compact.sort.one-bucket-bytes": 0}):
        assert not one_bucket(16, 4, False, two)  # the rule off


def test_no_more_buckets_than_workers():
    many = Shape(workers=4, threads=16, smallest_limit=0)
    assert cluster_buckets(64, 2**27, 4, False, many) == 4
    assert cluster_buckets(3, 2**27, 4, False, many) == 3
    assert cluster_buckets(8, 2**20, 4, False, many) == 1  # 4 MiB: one bucket
    one = Shape(workers=1, threads=8, smallest_limit=2**20)  # too little memory for one
    assert cluster_buckets(8, 2**26, 4, False, one) == 2


@pytest.fixture(scope="module")
def two_workers():
    with local_process_cluster(2, set_as_default=False) as c:
        yield c


@pytest.mark.parametrize("graph", [True, False])
def test_two_single_thread_workers_sort_as_one_bucket(two_workers, graph):
    """2 workers x 1 thread (the CI machine's cluster): 32 MiB of float64 in 8 chunks is one
    bucket (2^24 float32 there: 0.33 s, against 0.59 s in 8 buckets), known sizes or not;
    ``buckets=`` still cuts it."""
    with two_workers.as_current(), dask.config.set(scheduler="dask.distributed"):
        # made on the workers: from_array's graph would carry the 32 MiB to every call
        x = da.random.default_rng(21).random(2**22, chunks=2**19)
        a = x.compute()
        if not graph:
            x = x.persist()
            wait(x)
        sel = x[x < 0.5]
        for arr, want in ((x, a), (sel, a[a < 0.5])):
            got = dask_compact.sort(arr)
            assert len(got.chunks[0]) == 1
            np.testing.assert_array_equal(got.compute(), np.sort(want))
            order = dask_compact.argsort(arr)
            assert len(order.chunks[0]) == 1
            np.testing.assert_array_equal(order.compute(), np.argsort(want, kind="stable"))
        cut = dask_compact.sort(x, buckets=3)
        assert len(cut.chunks[0]) == 3
        np.testing.assert_array_equal(cut.compute(), np.sort(a))
