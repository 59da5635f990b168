"""The reliability rules on CuPy chunks: the mask path's slice check and the up-front sample
check with CuPy arrays, empty N-D CuPy input, the bounded cache of CuPy modules, and refused
predicates before any kernel runs."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

import dask  # noqa: E402

import dask_compact  # noqa: E402
from dask_compact.backends import cupy_modules  # noqa: E402
from dask_compact.predicate import as_predicate  # noqa: E402

pytestmark = pytest.mark.gpu


def _x(n: int = 100_003, chunks: int = 10_000):
    a = np.random.default_rng(3).standard_normal(n)
    return a, da.from_array(a, chunks=chunks).map_blocks(cupy.asarray)


def test_mask_path_slice_check_on_cupy_chunks():
    a, x = _x()
    with dask.config.set(scheduler="threads"):
        with pytest.raises(ValueError, match="not elementwise"):
            x.map_compact(lambda v: v.astype(float) > v.astype(float).mean())
        got = x.map_compact(lambda v: v.astype(np.float32) > 0.5).compute()
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), a[a.astype(np.float32) > 0.5])
    p = as_predicate(lambda v: v.astype(float) > v.astype(float).max() - 1)
    with pytest.raises(ValueError, match="not elementwise"):
        p.mask(cupy.arange(1000.0))


def test_refusals_before_any_kernel_runs():
    _, x = _x()
    for bad in (lambda v: v > v.size, lambda v: v > float(v), "x" + " < x" * 250):
        with pytest.raises(ValueError):
            x.map_compact(bad)


@pytest.mark.parametrize("shape, chunks", [((10, 0), 5), ((3, 0, 4), (2, 1, 2))])
def test_empty_nd_cupy_input(shape, chunks):
    x = da.zeros(shape, chunks=chunks).map_blocks(cupy.asarray)
    with dask.config.set(scheduler="threads"):
        v, i = x.map_compact("x > 0", output="both")
        assert v.shape == (0,) and isinstance(v._meta, cupy.ndarray)
        assert v.compute().shape == (0,) and i.compute().dtype == np.int64


def test_cupy_modules_are_bounded_and_rebuilt():
    a = cupy.asarray(np.random.default_rng(4).standard_normal(50_001))
    texts = [" | ".join(["(x > 0.5)"] + [f"(x < -{j + 1})" for j in range(k)]) for k in range(5)]
    dask_compact.clear_cache()
    with dask.config.set({"dask-compact.cache.memory-entries": 2}):
        for _ in range(2):  # the second round rebuilds evicted modules
            for t in texts:
                got = dask_compact.compact_array(a, t)
                m = as_predicate(t).mask(a)
                cupy.testing.assert_array_equal(got, a[m])
        assert len(cupy_modules.modules) <= 2
        assert cupy_modules.modules.evictions >= 8
    dask_compact.clear_cache()


@pytest.mark.parametrize("op", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_int64_against_uint64_compares_as_numpy_does(op):
    """uint64 data against an np.int64 constant and int64 data against an np.uint64 one,
    exactly as NumPy's mixed loops (the GPU review probe met a compile error, 2026-11-28)."""
    import operator

    fn = getattr(operator, op)
    rng = np.random.default_rng(4)
    u = rng.integers(0, 2**64 - 1, 20_011, dtype=np.uint64, endpoint=True)
    u[:4] = [0, 2**53 + 1, 2**63, 2**64 - 1]
    i = rng.integers(-(2**63), 2**63 - 1, 20_011, dtype=np.int64, endpoint=True)
    i[:4] = [-1, 0, 2**53 + 1, 2**63 - 1]
    for host, c in ((u, np.int64(2**53 + 1)), (u, np.int64(-3)), (i, np.uint64(2**53 + 1)),
                    (i, np.uint64(2**63))):
        for pred in (lambda v: fn(v, c), lambda v: fn(c, v)):
            got = dask_compact.compact_array(cupy.asarray(host), pred)
            np.testing.assert_array_equal(cupy.asnumpy(got), host[pred(host)])


@pytest.mark.parametrize("text", ["x < 2**64", "x > 10**30", "x > -10**30", "x != 2**70"])
@pytest.mark.parametrize("dtype", ["int64", "uint64", "int8"])
def test_a_constant_outside_every_integer_range(dtype, text):
    """The mask path's CuPy evaluation refused these ints (OverflowError); NumPy 2 answers."""
    info = np.iinfo(dtype)
    host = np.random.default_rng(6).integers(info.min, info.max, 10_007, dtype=dtype,
                                             endpoint=True)
    want = host[eval(text.replace("x", "host"))]  # noqa: S307 -- the test's own literals
    got = dask_compact.compact_array(cupy.asarray(host), text)
    np.testing.assert_array_equal(cupy.asnumpy(got), want)
