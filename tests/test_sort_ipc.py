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
    sa = cuda_ipc.export("t1", 0, a, ia)
    sb = pickle.loads(pickle.dumps(cuda_ipc.export("t1", 1, b, ib)))  # as a merge gets it
    assert "t1" in cuda_ipc.exported_tokens()
    del a, ia  # the table keeps them
    got = cuda_ipc.join([sa, sb], [(10, 40), (0, 5)], 0)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(cuda_ipc.join([sa, sb], [(10, 40), (0, 5)], 1),
                                  np.r_[10:40, 100:105])
    assert cuda_ipc.release("t1") == 2 and cuda_ipc.release("t1") == 0
    assert "t1" not in cuda_ipc.exported_tokens()
    with pytest.raises(RuntimeError, match="released before its merges ran"):
        cuda_ipc.join([sa], [(0, 1)], 0)


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
        srcs.append(cuda_ipc.export("t2", c, v, o))
    try:
        cuts = [(0, len(p)) for p in parts]
        got = _merge_joined(srcs, cuts, indices, local)
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
