"""dask_compact.partition / partition_array (the stable split) against NumPy:
``np.concatenate([a[m], a[~m]])`` and the permutation ``concatenate([flatnonzero(m),
flatnonzero(~m)])``, for random data of every dtype, odd sizes and chunkings, empty and full
selections, N-D input, mask-path callables, a LocalCluster of worker processes, errors."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from chunk_shape_helpers import LENGTHS, SHAPES, misdeclared, refusal
from conftest import HeldChunks, random_array, threshold_predicate
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_compact import compact_array, partition, partition_array
from dask_compact.validate import DTYPES

SIZES = [0, 1, 31, 33, 1023, 1025, 4099]


def want(a: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    a, m = a.ravel(), m.ravel()
    order = np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)])
    return a[order], order, int(m.sum())


def check_dask(x: da.Array, pred, a: np.ndarray, m: np.ndarray) -> None:
    wv, wi, wk = want(a, m)
    v, i, k = partition(x, pred, output="both")
    assert k == wk
    for got, w in ((v, wv), (i, wi)):
        assert not any(np.isnan(got.chunks[0])) and sum(got.chunks[0]) == a.size
        c = got.compute()
        assert c.dtype == w.dtype
        np.testing.assert_array_equal(c, w)
    # the chunks are every chunk's selected piece, then every chunk's other piece, less the
    # empty ones (one chunk of length 0 where a is empty; graph.without_empty_chunks): a
    # chunk boundary at k
    sizes = v.chunks[0]
    assert v.chunks == i.chunks
    assert all(sizes) or sizes == (0,)
    assert wk in np.cumsum((0, *sizes))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", [0.0, 0.3, 1.0])
def test_in_memory_against_numpy(n: int, p: float) -> None:
    a = random_array(np.random.default_rng(n), n, np.float64)
    pred = threshold_predicate(a, p)
    wv, wi, wk = want(a, pred(a))
    v, k = partition_array(a, pred)
    np.testing.assert_array_equal(v, wv)
    assert k == wk
    i, k = partition_array(a, pred, output="indices")
    np.testing.assert_array_equal(i, wi)
    v, i, k = partition_array(a, pred, output="both")
    np.testing.assert_array_equal(v, wv)
    np.testing.assert_array_equal(i, wi)


@pytest.mark.parametrize("n", [0, 1, 2_003])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype(dtype: np.dtype, n: int) -> None:
    """(Empty float16 input once raised numba's NotImplementedError.)"""
    a = random_array(np.random.default_rng(3), n, dtype)
    pred = threshold_predicate(a, 0.4)
    m = np.asarray(pred(a))
    check_dask(da.from_array(a, chunks=301), pred, a, m)
    for output in ("values", "both"):
        *got, k = partition_array(a, pred, output=output)
        np.testing.assert_array_equal(got[0], want(a, m)[0])
        assert got[0].dtype == a.dtype and k == m.sum()


@pytest.mark.parametrize("chunks", [1, 7, 1000, 1025])
def test_dask_chunkings_and_nd(chunks: int) -> None:
    rng = np.random.default_rng(chunks)
    a = rng.random(1025)
    check_dask(da.from_array(a, chunks=chunks), "x < 0.3", a, a < 0.3)
    b = rng.integers(0, 10, (33, 31))
    check_dask(da.from_array(b, chunks=(7, 31)), lambda v: v % 3 == 1, b, b % 3 == 1)


def test_mask_path_and_string() -> None:
    a = np.random.default_rng(5).integers(0, 9, 999)
    # np.isin is not traced: evaluated per chunk as a mask
    check_dask(da.from_array(a, chunks=100), lambda v: np.isin(v, [1, 4]), a, np.isin(a, [1, 4]))
    v, k = partition_array(a, "(x == 2) | (x > 6)")
    np.testing.assert_array_equal(v, want(a, (a == 2) | (a > 6))[0])


@pytest.mark.parametrize("chunks", [(7, 3), (50, 3), (7, 2), (1, 1), (13, 1)])
def test_per_column_constants_as_compact_array_takes_them(chunks) -> None:
    """A callable that broadcasts a constant against the trailing axis (x < c on (n, 3)
    data), which compact_array and map_compact take: partition_array, partition and the scan
    algorithm take it too (they evaluated it on flattened chunks and refused it)."""
    b = np.random.default_rng(0).random((50, 3))
    c = np.array([0.2, 0.5, 0.8])
    m = b < c
    wv, wi, wk = want(b, m)
    v, i, k = partition_array(b, lambda v: v < c, output="both")
    np.testing.assert_array_equal(v, wv)
    np.testing.assert_array_equal(i, wi)
    assert k == wk
    np.testing.assert_array_equal(compact_array(b, lambda v: v < c, algorithm="scan"), b[m])
    x = da.from_array(b, chunks=chunks)
    check_dask(x, lambda v: v < c, b, m)
    got = x.map_compact(lambda v: v < c, algorithm="scan").compute()
    np.testing.assert_array_equal(got, b[m])
    with pytest.raises(ValueError, match="broadcast"):  # one constant per row: still refused
        partition(x, lambda v: v < np.ones(50))


def test_errors() -> None:
    x = da.arange(10, chunks=3)
    with pytest.raises(TypeError, match="dask array.*dask_compact.partition_array for an in"):
        partition(np.arange(3), "x > 1")
    with pytest.raises(TypeError, match="NumPy or CuPy"):
        partition_array([1, 2], "x > 1")
    # map_compact was the hint: a compaction, not the split asked for
    with pytest.raises(TypeError, match=r"in-memory.*dask_compact.partition\(x, pred\)"):
        partition_array(x, "x > 1")
    with pytest.raises(ValueError, match="output"):
        partition(x, "x > 1", output="mask")
    with pytest.raises(TypeError):
        partition(da.from_array(np.array(["a", "b"])), "x > 1")
    y = da.arange(12, chunks=5).reshape(3, 4)
    with pytest.raises(ValueError, match="2-D input with unknown chunk sizes"):
        partition(y[y[:, 0] > 3], "x > 5")
    with pytest.raises(ValueError):
        partition(x, lambda v: v > v.mean())  # not elementwise


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(-5, 5), max_size=300),
    st.integers(1, 50),
    st.integers(-6, 6),
)
def test_property(values: list, chunk: int, t: int) -> None:
    a = np.array(values, dtype=np.int32)
    check_dask(da.from_array(a, chunks=chunk), lambda v: v < t, a, a < t)


def test_local_cluster_of_processes(process_client) -> None:
    a = np.random.default_rng(9).random(50_001).astype(np.float32)
    x = da.from_array(a, chunks=6_000).persist()
    check_dask(x, "x > 0.7", a, a > 0.7)
    u = x[x < 0.9]  # unknown chunk sizes, on the workers
    b = a[a < 0.9]
    check_dask(u, "x > 0.7", b, b > 0.7)


@pytest.mark.parametrize("n", [0, 1, 33, 1025])
def test_unknown_chunk_sizes(n: int) -> None:
    """1-D input of unknown chunk sizes (x[x > t], a lazy compaction), every output: the
    result's chunks known from the counts, the indices' global starts from a task over the
    chunks' sizes (refused until 2026-12-07, a new-user probe). Empty chunks first too."""
    rng = np.random.default_rng(n)
    a = rng.standard_normal(n)
    x = da.from_array(a, chunks=97)
    keep = (np.arange(n) > 200) & (rng.random(n) < 0.8)  # the first chunks select nothing
    u, b = x[da.from_array(keep, chunks=97)], a[keep]
    assert n == 0 or np.isnan(u.shape[0])
    for pred, m in (("x > 0.2", b > 0.2), (lambda v: v == v, b == b), ("x > 99", b > 99)):
        check_dask(u, pred, b, m)
        v, k = partition(u, pred)
        np.testing.assert_array_equal(v.compute(), want(b, m)[0])
        i, k = partition(u, pred, output="indices")
        np.testing.assert_array_equal(i.compute(), want(b, m)[1])
    lazy = x.map_compact("x > 0", lazy=True)
    check_dask(lazy, "x < 1", a[a > 0], a[a > 0] < 1)


@pytest.mark.parametrize("output", ["indices", "both"])
def test_unknown_sizes_indices_hold_no_input_chunk_for_the_others(output: str) -> None:
    """Each split counts its indices from its chunk's start, added once the counts are in:
    an input chunk is released once split. Until 2026-12-07 the splits waited for a starts
    task over every chunk's size, so the whole input was held at once."""
    a = np.random.default_rng(12).random(5_003)
    x = da.from_array(a, chunks=250)
    u, b = x[x < 0.8], a[a < 0.8]
    seen = HeldChunks(u.name)
    with seen, dask.config.set(scheduler="sync"):
        got = partition(u, "x > 0.3", output=output)
        expected = want(b, b > 0.3)
        np.testing.assert_array_equal(got[-2].compute(), expected[1])
        if output == "both":
            np.testing.assert_array_equal(got[0].compute(), expected[0])
    assert got[-1] == expected[2]
    assert u.numblocks[0] == 21 and 1 <= seen.most <= 2


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("actual, declared", LENGTHS + SHAPES)
def test_a_chunk_of_another_shape_than_declared_is_refused_naming_it(output, actual, declared):
    """A from_delayed chunk of 5 elements declared 7 (or N-D blocks of another shape): the
    split's pieces and indices were made of the declared sizes; refused now, naming the
    chunk and both shapes (until 2026-12-01, the eleventh session)."""
    x = misdeclared(actual, declared)
    with pytest.raises(ValueError, match=refusal(actual, declared)):
        partition(x, "x % 2 == 0", output=output)
