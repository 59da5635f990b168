"""dask_compact.partition / partition_array on CuPy against NumPy's stable split, through both
values routes: counted first (the compaction module's count and tile-scan kernels, then
dcx_partition of kernels/partition.cu) and one pass (dcx_partition_lookback, then
dcx_reverse_tail); the route "auto" takes is checked on its own."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

from conftest import random_array, threshold_predicate  # noqa: E402

from dask_compact import partition, partition_array  # noqa: E402
from dask_compact.backends import cupy_split, cupy_tuning  # noqa: E402
from dask_compact.backends.cupy_ready import fraction_key  # noqa: E402
from dask_compact.predicate import as_predicate  # noqa: E402
from dask_compact.validate import DTYPES  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(params=["counted", "one-pass"], autouse=True)
def route(request, monkeypatch) -> str:
    """Every test of the module through each values route (indices alone have one)."""
    monkeypatch.setattr(cupy_tuning, "SPLIT_ROUTE", request.param)
    return request.param

SIZES = [0, 1, 31, 33, 511, 513, 1023, 1025, 4095, 4097, 65_537, 1_000_003]


def want(a: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    a, m = a.ravel(), np.asarray(m).ravel()
    order = np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)])
    return a[order], order, int(m.sum())


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", [0.0, 0.05, 0.5, 1.0])
def test_against_numpy(n: int, p: float) -> None:
    a = random_array(np.random.default_rng(n), n, np.float32)
    pred = threshold_predicate(a, p)
    wv, wi, wk = want(a, pred(a))
    v, i, k = partition_array(cupy.asarray(a), pred, output="both")
    assert isinstance(v, cupy.ndarray) and isinstance(i, cupy.ndarray) and k == wk
    np.testing.assert_array_equal(cupy.asnumpy(v), wv)
    np.testing.assert_array_equal(cupy.asnumpy(i), wi)
    i2, k2 = partition_array(cupy.asarray(a), pred, output="indices")
    np.testing.assert_array_equal(cupy.asnumpy(i2), wi)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype(dtype: np.dtype) -> None:
    a = random_array(np.random.default_rng(4), 70_001, dtype)  # several tiles of every dtype
    pred = threshold_predicate(a, 0.4)
    wv, wi, wk = want(a, pred(a))
    v, i, k = partition_array(cupy.asarray(a), pred, output="both")
    assert v.dtype == a.dtype and k == wk
    np.testing.assert_array_equal(cupy.asnumpy(v), wv)
    np.testing.assert_array_equal(cupy.asnumpy(i), wi)


def test_mask_path_views_and_nd() -> None:
    rng = np.random.default_rng(6)
    a = cupy.asarray(rng.integers(0, 9, 20_001))[1:]  # an offset view
    v, k = partition_array(a, lambda x: x.astype(np.float64) % 3 == 1)  # not traced: a mask
    h = cupy.asnumpy(a)
    np.testing.assert_array_equal(cupy.asnumpy(v), want(h, h % 3 == 1)[0])
    b = cupy.asarray(rng.random((301, 7)))
    v, k = partition_array(b, "x < 0.5")
    hb = cupy.asnumpy(b)
    np.testing.assert_array_equal(cupy.asnumpy(v), want(hb, hb < 0.5)[0])


def test_per_column_constants() -> None:
    """A callable broadcasting a constant against the trailing axis: its mask is made on
    the chunk as given, then split flat (as on the CPU)."""
    hb = np.random.default_rng(8).random((4099, 3))
    c = cupy.asarray([0.2, 0.5, 0.8])
    b = cupy.asarray(hb)
    wv, wi, wk = want(hb, hb < cupy.asnumpy(c))
    for output in ("values", "indices", "both"):
        got = partition_array(b, lambda v: v < c, output=output)
        assert got[-1] == wk
        if output != "indices":
            np.testing.assert_array_equal(cupy.asnumpy(got[0]), wv)
        if output != "values":
            np.testing.assert_array_equal(cupy.asnumpy(got[-2]), wi)
    x = da.from_array(hb, chunks=(700, 3)).map_blocks(cupy.asarray)
    v, k = partition(x, lambda v: v < c)
    assert k == wk
    np.testing.assert_array_equal(cupy.asnumpy(v.compute()), wv)


def test_dask_cupy_chunks() -> None:
    a = np.random.default_rng(7).random(300_007)
    x = da.from_array(a, chunks=40_000).map_blocks(cupy.asarray)
    v, i, k = partition(x, "x > 0.8", output="both")
    wv, wi, wk = want(a, a > 0.8)
    assert k == wk and isinstance(v._meta, cupy.ndarray)
    assert not any(np.isnan(v.chunks[0]))
    np.testing.assert_array_equal(cupy.asnumpy(v.compute()), wv)
    np.testing.assert_array_equal(cupy.asnumpy(i.compute()), wi)


def test_dask_cupy_chunks_of_unknown_sizes() -> None:
    """1-D CuPy chunks of unknown sizes (a boolean selection's, declared CuPy: dask's own
    boolean indexing declares NumPy chunks): the indices' starts from a task over the
    chunks' sizes, the result's sizes from the counts (the CPU test: test_partition.py)."""
    a = np.random.default_rng(8).random(300_007)
    keep = np.arange(a.size) > 50_000  # the first two chunks select nothing
    x = da.from_array(a, chunks=40_000).map_blocks(cupy.asarray)
    u = x[da.from_array(keep, chunks=40_000).map_blocks(cupy.asarray)]
    u = da.Array(u.dask, u.name, u.chunks, meta=cupy.empty((0,), a.dtype))
    b = a[keep]
    v, i, k = partition(u, "x > 0.8", output="both")
    wv, wi, wk = want(b, b > 0.8)
    assert k == wk and isinstance(v._meta, cupy.ndarray)
    assert not any(np.isnan(v.chunks[0]))
    np.testing.assert_array_equal(cupy.asnumpy(v.compute()), wv)
    np.testing.assert_array_equal(cupy.asnumpy(i.compute()), wi)


@pytest.mark.parametrize("route", ["auto"], indirect=True)
@pytest.mark.parametrize("p", [0.3, 0.7, 1.0])
def test_auto_route_follows_the_last_fraction(p: float, monkeypatch) -> None:
    """"auto": the first call of a predicate counts first; the next takes one pass when the
    first selected at least SPLIT_ONE_PASS_FROM, and both are right."""
    taken: list[bool] = []
    real = cupy_split.one_pass
    monkeypatch.setattr(cupy_split, "one_pass", lambda plan: taken.append(real(plan)) or taken[-1])
    a = random_array(np.random.default_rng(11), 300_007, np.float32)
    pred = as_predicate(threshold_predicate(a, p))
    # a predicate of this shape may have split before (its memo is kept with it): forget that
    pred.memo.pop(fraction_key(a.dtype, "split"), None)
    wv, wi, wk = want(a, pred.mask(a, np))
    for _ in range(2):
        v, i, k = partition_array(cupy.asarray(a), pred, output="both")
        assert k == wk
        np.testing.assert_array_equal(cupy.asnumpy(v), wv)
        np.testing.assert_array_equal(cupy.asnumpy(i), wi)
    assert taken == [False, p >= cupy_tuning.SPLIT_ONE_PASS_FROM]


@pytest.mark.parametrize("route", ["one-pass"], indirect=True)
def test_one_pass_beyond_2_31_elements() -> None:
    """Places past 2^31 (the others' run is written from the end backwards, then reversed),
    checked on the device: int8, 2^31 + 4097 elements, about 70% selected."""
    n = (1 << 31) + 4097
    try:
        a = cupy.random.default_rng(5).integers(-128, 128, n, dtype=cupy.int8)
    except cupy.cuda.memory.OutOfMemoryError:
        pytest.skip("needs ~8 GiB of free device memory")
    try:
        v, k = partition_array(a, "x > -50")
        m = a > -50
        assert k == int(m.sum())
        assert bool((v[:k] == a[m]).all()) and bool((v[k:] == a[~m]).all())
    except cupy.cuda.memory.OutOfMemoryError:
        pytest.skip("needs ~8 GiB of free device memory")
