"""GPU scans against NumPy: every algorithm x dtype x odd size, both forms, explicit output
dtypes, misaligned views, offsets, > 2^31 elements (look-back), CuPy chunks in dask, and
compact_array(..., algorithm="scan") on CuPy arrays.

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

import dask  # noqa: E402
from conftest import scan_data as data  # noqa: E402
from conftest import scan_reference as reference  # noqa: E402

from dask_compact import compact_array, cumsum, scan_array  # noqa: E402
from dask_compact.backends import cupy_scan  # noqa: E402
from dask_compact.backends.cupy_scan_source import (  # noqa: E402
    GPU_ALGORITHMS,
    ScanTuning,
    override_scan_tuning,
)
from dask_compact.dispatch import scan_chunk  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64",
]  # fmt: skip
# around the warp (32), the shared block (512), look-back tiles (2048 / 4096 elements) and
# primes; 2^17 + 1 crosses several recursion levels of "shared" and many look-back windows
SIZES = [0, 1, 2, 31, 33, 511, 513, 1023, 1025, 2047, 2049, 4095, 4097, 7919, 65537, 2**17 + 1]


def assert_scan(got, a: np.ndarray, exclusive: bool, dtype=None) -> None:
    """``got`` (a CuPy array) is the scan of ``a``: integers exactly as NumPy's; floats against
    the float64 sums to a tolerance proportional to the running sum of magnitudes (the GPU
    adds in another order than NumPy's sequential loop)."""
    assert isinstance(got, cupy.ndarray)
    want = reference(a, exclusive, dtype)
    g = cupy.asnumpy(got)
    assert g.dtype == want.dtype and g.shape == want.shape, (g.dtype, want.dtype)
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(g, want)
        return
    a64 = a.ravel().astype(want.dtype).astype(np.float64)
    exact = reference(a64, exclusive)
    scale = np.cumsum(np.abs(a64)) + 1
    rtol = 2e-5 if want.dtype == np.float32 else 1e-13
    err = np.abs(g.astype(np.float64) - exact) / scale
    assert not err.size or err.max() <= rtol, (err.max(), a.dtype, a.size, exclusive)


def _check(a: np.ndarray, alg: str, exclusive: bool, dtype=None) -> None:
    got = scan_array(cupy.asarray(a), exclusive=exclusive, algorithm=alg, dtype=dtype)
    assert_scan(got, a, exclusive, dtype)


@pytest.mark.parametrize("alg", ["auto", *GPU_ALGORITHMS])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_algorithm_dtype_size(alg: str, dtype: str) -> None:
    for n in SIZES:
        a = data(dtype, n, seed=n)
        for exclusive in (True, False):
            _check(a, alg, exclusive)


@pytest.mark.parametrize("alg", GPU_ALGORITHMS)
@pytest.mark.parametrize(
    "dtype,out",
    [("int32", "int32"), ("int8", "uint64"), ("uint64", "int64"), ("int64", "int32"),
     ("int16", "float32"), ("bool", "float64"), ("float64", "float32"), ("uint32", "uint32"),
     ("uint8", "int32"), ("bool", "uint32"),
     # narrow integers: summed in uint32 and cast (scan.summing_dtype)
     ("int8", "int8"), ("int64", "int16"), ("uint16", "uint8"), ("bool", "int16")],
)  # fmt: skip
def test_explicit_output_dtypes(alg: str, dtype: str, out: str) -> None:
    for n in (1, 1025, 4097, 65537):
        a = data(dtype, n, seed=n + 1)
        for exclusive in (True, False):
            _check(a, alg, exclusive, dtype=out)


@pytest.mark.parametrize("out", ["int8", "int16", "uint8", "uint16"])
@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "uint16", "int32", "int64", "uint64"])
def test_narrow_outputs_stored_by_the_lookback(dtype: str, out: str) -> None:
    """The look-back stores a narrow dtype= itself (scan.cu's O, the low bits of the uint32
    sums; signed outputs through their unsigned kernel): the ready call (a contiguous array),
    the general one (a misaligned view: the element-wise tile), a base that wraps (a dask
    chunk's offset) and many tiles whose running sums wrap many times."""
    out_dt = np.dtype(out)
    for n in (1, 4097, 65537, 3 * 2**20 + 7):
        a = data(dtype, n + 1, seed=n)
        d = cupy.asarray(a)
        for exclusive in (True, False):
            got = scan_array(d, exclusive=exclusive, dtype=out)
            assert got.dtype == out_dt and got.data.ptr != d.data.ptr
            assert_scan(got, a, exclusive, out)
            got = scan_array(d[1:], exclusive=exclusive, dtype=out)  # misaligned: VEC = 1
            assert_scan(got, a[1:], exclusive, out)
            base = np.uint32(2**32 - 3)  # the chunk offsets are uint32 (scan.summing_dtype)
            got = scan_chunk(d, exclusive, "lookback", np.dtype(np.uint32), base, out_dtype=out)
            want = reference(a, exclusive, np.uint32).astype(np.uint64) + int(base)
            np.testing.assert_array_equal(cupy.asnumpy(got),
                                          (want % 2**32).astype(np.uint32).astype(out_dt))


@pytest.mark.parametrize("alg", GPU_ALGORITHMS)
def test_views_nd_and_offsets(alg: str) -> None:
    """Misaligned and strided views (the look-back's element-wise tile), N-D input in C order,
    and a base offset (the dask path's) added to every element."""
    a = data("int32", 3 * 4099, seed=4)
    d = cupy.asarray(a)
    for view, ref in ((d[1:], a[1:]), (d[3::3], a[3::3]), (d.reshape(3, 4099)[:, 1:],
                                                          a.reshape(3, 4099)[:, 1:])):
        for exclusive in (True, False):
            got = scan_array(view, exclusive=exclusive, algorithm=alg)
            np.testing.assert_array_equal(cupy.asnumpy(got), reference(ref, exclusive))
    f = data("float32", 4099 * 3, seed=5)
    got = scan_array(cupy.asarray(f)[1:], exclusive=False, algorithm=alg)
    assert_scan(got, f[1:], False)
    acc = np.dtype(np.int64)
    for exclusive in (True, False):
        out = scan_chunk(d, exclusive, alg, acc, np.int64(-(10**12)))
        np.testing.assert_array_equal(cupy.asnumpy(out), reference(a, exclusive) - 10**12)
    u = cupy.asarray(data("uint8", 5000, seed=6))
    out = scan_chunk(u, False, alg, np.dtype(np.uint64), np.uint64(2**64 - 3))  # wraps
    want = (np.cumsum(cupy.asnumpy(u), dtype=np.uint64) + np.uint64(2**64 - 3))
    np.testing.assert_array_equal(cupy.asnumpy(out), want)
    assert scan_array(cupy.asarray(np.float64(2.5)), algorithm=alg).tolist() == [0.0]


# The look-back kernel at shapes other than the table's: small tiles (so these sizes span many
# tiles and a partial last one), a bound on the blocks per SM, each cache hint.
LOOKBACK_SHAPES = [ScanTuning(64, 2), ScanTuning(32, 1, 0, 3), ScanTuning(128, 4, 2, 2),
                   ScanTuning(96, 3, 0, 1)]


@pytest.mark.parametrize("tuning", LOOKBACK_SHAPES, ids=str)
@pytest.mark.parametrize("dtype,out", [("float32", None), ("int32", None), ("int32", "int64"),
                                       ("int64", None), ("float64", None), ("bool", None),
                                       ("int16", "int32"), ("uint8", "float64")])
def test_lookback_shapes(tuning: ScanTuning, dtype: str, out: str | None) -> None:
    acc = np.dtype(out) if out else np.cumsum(np.zeros(1, dtype)).dtype
    override_scan_tuning(acc.itemsize, tuning)
    try:
        for n in (1, 33, 4097, 65537, 2**20 + 3):
            a = data(dtype, n, seed=n + 11)
            for exclusive in (True, False):
                _check(a, "lookback", exclusive, dtype=out)
        h = data(dtype, 2**16 + 5, seed=3)
        tot = cupy.zeros(1, dtype=acc)
        got = cupy_scan.scan(cupy.asarray(h), True, "lookback", acc, 7, tot)  # total, base
        assert_scan(got - acc.type(7), h, True, acc)
        with np.errstate(over="ignore"):
            want = reference(h, False, acc)[-1] + acc.type(7)  # integers wrap as NumPy's
        if acc.kind == "f":
            h64 = h.astype(np.float64)
            assert abs(float(tot[0]) - 7 - h64.sum()) <= 1e-5 * (np.abs(h64).sum() + 7)
        else:
            assert tot.get()[0] == want
    finally:
        override_scan_tuning(acc.itemsize, None)


def test_lookback_total_word_and_module_cache() -> None:
    a = cupy.asarray(data("int32", 100_003, seed=7))
    tot = cupy.zeros(1, dtype=np.int64)
    out = cupy_scan.scan(a, True, "lookback", np.dtype(np.int64), 5, tot)
    assert int(tot[0]) == int(a.sum(dtype=np.int64)) + 5
    assert int(out[0]) == 5
    before = len(cupy_scan._modules.values())
    scan_array(a, algorithm="lookback")
    assert len(cupy_scan._modules.values()) == before  # built once per (device, spec)
    assert cupy_scan.total(a, np.dtype(np.int64)) == a.get().sum(dtype=np.int64)


def test_errors_on_cupy() -> None:
    a = cupy.arange(10)
    with pytest.raises(ValueError, match="runs on NumPy data"):
        scan_array(a, algorithm="sequential")
    x = da.from_array(np.arange(10), chunks=3).map_blocks(cupy.asarray)
    with pytest.raises(ValueError, match="runs on NumPy data"):
        cumsum(x, algorithm="sequential")


@pytest.mark.usefixtures("big_device_memory")
@pytest.mark.slow
@pytest.mark.parametrize("exclusive", [True, False])
def test_lookback_beyond_2_pow_31(exclusive: bool) -> None:
    """One int8 array of 2^31 + 2^20 + 3 elements into int64: 64-bit tiles and indices."""
    n = 2**31 + 2**20 + 3
    free = cupy.cuda.runtime.memGetInfo()[0]
    if free < 24 * 2**30:
        pytest.skip("needs ~24 GiB of free device memory")
    a = cupy.empty(n, dtype=cupy.int8)
    cupy.ElementwiseKernel(
        "", "int8 y",
        "unsigned long long h = (unsigned long long)i * 0x9E3779B97F4A7C15ull; "
        "y = (signed char)(h >> 56);",
        "dcx_test_scan_fill",
    )(a)
    out = scan_array(a, exclusive=exclusive, algorithm="lookback")
    assert out.dtype == np.int64 and out.size == n
    step = 2**28
    carry = 0
    for s in range(0, n, step):
        blk = a[s : s + step].astype(np.int64)
        inc = cupy.cumsum(blk) + carry
        want = inc if not exclusive else inc - blk
        assert bool(cupy.all(out[s : s + step] == want)), s
        carry = int(inc[-1])
        del blk, inc, want
    del a, out
    cupy.get_default_memory_pool().free_all_blocks()


def _float32_subnormals(n: int, mantissa_bits: int, seed: int) -> np.ndarray:
    """``n`` float32 subnormals of random signs whose mantissas are below 2^mantissa_bits:
    every partial sum of ``n`` of them a whole number of 2^-149 below 2^24 of them where
    ``n`` * 2^mantissa_bits <= 2^24, so exact in float32 in any order of the additions."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(1, 2**mantissa_bits, n, dtype=np.uint32)
    bits |= rng.integers(0, 2, n, dtype=np.uint32) << np.uint32(31)
    return bits.view(np.float32)


@pytest.mark.parametrize("alg", ["auto", *GPU_ALGORITHMS])
def test_float32_subnormals_are_summed_as_numpy_sums_them(alg: str) -> None:
    """CuPy compiles the scan kernels with -ftz=true: their float32 additions and the float32
    -> float64 conversion flushed subnormals (a float32 scan of subnormals into float64 came
    back all zeros on an H200, 2026-12-01). Sums exact in any order, so compared exactly."""
    for n in (1, 33, 1031, 4097, 65537):
        for exclusive in (False, True):
            for dtype, bits in ((None, 8), (np.float64, 23)):
                a = _float32_subnormals(n, bits, seed=n)
                want = reference(a, exclusive, dtype)
                got = scan_array(cupy.asarray(a), exclusive=exclusive, algorithm=alg,
                                 dtype=dtype)
                np.testing.assert_array_equal(cupy.asnumpy(got), want,
                                              err_msg=f"{n} {exclusive} {dtype}")
    a = _float32_subnormals(5003, 8, seed=1)
    x = da.from_array(a, chunks=(1, 33, 0, 1031, 2000, 1938)).map_blocks(cupy.asarray)
    for dtype in (None, np.float64):
        with dask.config.set(scheduler="threads"):
            got = cumsum(x, algorithm=alg, dtype=dtype).compute()
        np.testing.assert_array_equal(cupy.asnumpy(got), np.cumsum(a, dtype=dtype))


@pytest.mark.parametrize("dtype, acc", [("float32", "float32"), ("float32", "float64"),
                                        ("float64", "float32"), ("float64", "float64"),
                                        ("bool", "float32")])
def test_chunk_totals_keep_float32_subnormals(dtype: str, acc: str) -> None:
    """cupy_scan.total (the dask path's chunk totals) of float32 sums: CuPy's own sum flushed
    float32 subnormals (-ftz=true). Every sum here is exact in any order (whole numbers of
    2^-149 below 2^24 of them in float32, below 2^53 in float64; bools below 2^24), so
    compared exactly."""
    from dask_compact.backends.cupy_scan import total

    for n in (1, 31, 33, 1025, 7919, 2**17 + 1, 3 * 2**20 + 7):
        if dtype == "float32":
            a = _float32_subnormals(n, 23 if acc == "float64" else 2, seed=n)
        elif dtype == "float64":  # float32 subnormals in float64: exact under float32
            a = _float32_subnormals(n, 2, seed=n).astype(np.float64)
        else:
            a = data(dtype, n, seed=n)
        got = total(cupy.asarray(a), np.dtype(acc))
        assert isinstance(got, np.generic) and got.dtype == np.dtype(acc)
        want = np.sum(a.astype(np.float64)).astype(acc)
        assert got == want or (np.isnan(got) and np.isnan(want)), (n, got, want)


# ---------------------------------------------------------------------------- dask -----------


@pytest.mark.parametrize("alg", ["auto", *GPU_ALGORITHMS])
def test_cupy_chunks_in_dask(alg: str) -> None:
    chunks = (1, 7, 0, 4097, 3, 65537, 2, 1000)
    for dtype in ("int32", "float32", "uint8", "bool"):
        a = data(dtype, sum(chunks), seed=9)
        x = da.from_array(a, chunks=(chunks,)).map_blocks(cupy.asarray)
        for exclusive in (False, True):
            y = cumsum(x, exclusive=exclusive, algorithm=alg)
            # the input's chunks less the empty one (graph.without_empty_chunks)
            assert isinstance(y._meta, cupy.ndarray)
            assert y.chunks == (tuple(c for c in chunks if c),)
            with dask.config.set(scheduler="threads"):
                got = y.compute()
            assert_scan(got, a, exclusive)
    # a narrow integer dtype: summed in uint32, each chunk cast (scan.summing_dtype)
    a = data("int16", sum(chunks), seed=10)
    x = da.from_array(a, chunks=(chunks,)).map_blocks(cupy.asarray)
    for exclusive in (False, True):
        y = cumsum(x, exclusive=exclusive, algorithm=alg, dtype=np.int8)
        assert isinstance(y._meta, cupy.ndarray) and y.dtype == np.int8
        with dask.config.set(scheduler="threads"):
            got = y.compute()
        assert_scan(got, a, exclusive, np.int8)


@pytest.mark.parametrize("alg", ["auto", "lookback"])
def test_cupy_chunks_of_unknown_sizes(alg: str) -> None:
    """1-D CuPy chunks of unknown sizes (a boolean selection's), as da.cumsum takes them: the
    totals come with the chunks' sizes, the leading chunk after empty ones takes no offset
    (the CPU test: test_scan.py's test_cumsum_of_unknown_chunk_sizes)."""
    chunks = (7, 0, 4097, 3, 65537, 2)
    for dtype, out in (("int32", None), ("float32", None), ("int16", np.int16)):
        a = data(dtype, sum(chunks), seed=11)
        keep = np.arange(a.size) > 5000  # the first three chunks select nothing
        x = da.from_array(a, chunks=(chunks,)).map_blocks(cupy.asarray)
        u = x[da.from_array(keep, chunks=(chunks,)).map_blocks(cupy.asarray)]
        # dask's boolean indexing declares NumPy chunks (its meta) for CuPy ones: declared
        # as they are, as a user's map_blocks(..., meta=cupy.empty(0)) would
        u = da.Array(u.dask, u.name, u.chunks, meta=cupy.empty((0,), a.dtype))
        assert np.isnan(u.shape[0])
        for exclusive in (False, True):
            y = cumsum(u, exclusive=exclusive, algorithm=alg, dtype=out)
            assert isinstance(y._meta, cupy.ndarray) and np.isnan(y.shape[0])
            with dask.config.set(scheduler="threads"):
                got = y.compute()
            assert_scan(got, a[keep], exclusive, out)


@pytest.mark.parametrize("alg", ["auto", *GPU_ALGORITHMS])
def test_cupy_chunk_after_empty_chunks_only_takes_no_offset(alg: str) -> None:
    """After empty chunks only, a chunk is scanned as the first one is, with no offset: its
    bits are those of the one-chunk scan (a leading -0.0 was made 0.0 by an added offset on
    the CPU; the CPU test: test_scan.py, test_a_chunk_after_empty_chunks_only_...)."""
    a = np.array([-0.0, -0.0, -0.0, 1.5, -2.25], np.float32)

    def scanned(chunks: tuple) -> np.ndarray:
        x = da.from_array(a, chunks=chunks).map_blocks(cupy.asarray)
        with dask.config.set(scheduler="threads"):
            return cupy.asnumpy(cumsum(x, algorithm=alg).compute())

    one = scanned(((5,),))
    np.testing.assert_array_equal(one, np.cumsum(a))
    for chunks in (((0, 5),), ((0, 0, 5),)):
        assert scanned(chunks).tobytes() == one.tobytes(), chunks


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_cupy_offsets_keep_a_negative_zero_sum(dtype: str) -> None:
    """A sum of -0.0s is -0.0: the chunk totals started at 0.0 on the GPU as on the CPU, so
    every chunk after an all -0.0 prefix came back 0.0 where np.cumsum keeps -0.0 (the CPU
    test: test_scan.py, test_offsets_keep_a_negative_zero_sum)."""
    from dask_compact.backends.cupy_scan import total

    x = np.array([-0.0, -0.0, -0.0, -0.0, 1.0, -1.0], dtype)
    for chunks in ((1,) * 6, (2, 4), (1, 0, 1, 0, 4), (0, 2, 0, 1, 3), (3, 0, 3)):
        d = da.from_array(x, chunks=(chunks,)).map_blocks(cupy.asarray)
        with dask.config.set(scheduler="threads"):
            got = cupy.asnumpy(cumsum(d).compute())
            assert got.tobytes() == np.cumsum(x).tobytes(), chunks
            got = cupy.asnumpy(cumsum(d, exclusive=True).compute())
            assert got.tobytes() == scan_array(x, exclusive=True).tobytes(), chunks
    for acc in ("float32", "float64"):
        assert np.signbit(total(cupy.zeros(0, dtype), np.dtype(acc)))
        assert np.signbit(total(cupy.asarray(x[:4]), np.dtype(acc)))
        assert not np.signbit(total(cupy.asarray(x[3:]), np.dtype(acc)))  # -0.0 + 1 - 1
    assert total(cupy.asarray(x[:4]), np.dtype("int64")) == 0


@pytest.mark.parametrize("alg", ["auto", *GPU_ALGORITHMS])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_negative_zeros_are_summed_as_numpy_sums_them(alg: str, dtype: str) -> None:
    """The GPU scans started their sums at 0.0 (the kernels' identity and the base of a scan
    with none): a leading run of -0.0s came back 0.0 where np.cumsum keeps -0.0, in one tile
    and across tiles. The identity is -0.0 now; an exclusive scan's first element, the sum of
    nothing, stays 0.0 as on the CPU."""
    for n in (1, 5, 33, 1025, 70001, 2**20 + 3):
        a = np.full(n, -0.0, dtype)
        a[n // 2 :: 7] = 1.5  # a -0.0 prefix, then sums that are not zero, then back to zero
        a[n // 2 + 1 :: 7] = -1.5
        for exclusive in (False, True):
            got = cupy.asnumpy(scan_array(cupy.asarray(a), exclusive=exclusive, algorithm=alg))
            want = scan_array(a, exclusive=exclusive)
            assert got.tobytes() == want.tobytes(), (n, exclusive)
        assert np.signbit(got[1 : n // 2 + 1]).all()


def test_cupy_chunks_on_a_cluster_of_processes() -> None:
    """cumsum of CuPy chunks on worker processes (one GPU may serve both): the tasks call the
    dispatch by a module function. With the Dispatch object itself in the graph, each worker
    got a pickled copy whose lazy CuPy registration filled in the module's object instead:
    "No dispatch for <class 'cupy.ndarray'>" in every cumsum-total task (the new-user probe's
    gpu_cumsum_cluster.py, 2026-11-30). The sort and the partition of the same chunks too."""
    import dask_compact

    distributed = pytest.importorskip("distributed")
    a = np.arange(777_777, dtype=np.int64)
    f = data("float32", 100_003, seed=4)
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0") as lc,
        distributed.Client(lc),
    ):
        x = da.from_array(a, chunks=77_777).map_blocks(cupy.asarray)
        got = cumsum(x).compute()
        assert isinstance(got, cupy.ndarray)
        np.testing.assert_array_equal(cupy.asnumpy(got), np.cumsum(a))
        np.testing.assert_array_equal(cupy.asnumpy(cumsum(x, exclusive=True).compute()),
                                      reference(a, True))
        fx = da.from_array(f, chunks=10_007).map_blocks(cupy.asarray)
        assert_scan(cumsum(fx).compute(), f, False)
        s = dask_compact.sort(fx).compute()
        np.testing.assert_array_equal(cupy.asnumpy(s), np.sort(f))
        v, k = dask_compact.partition(fx, "x > 0")
        assert k == np.count_nonzero(f > 0)
        np.testing.assert_array_equal(cupy.asnumpy(v.compute()),
                                      np.concatenate([f[f > 0], f[~(f > 0)]]))


# ------------------------------------------------------------- compaction on the scan -------


@pytest.mark.parametrize("dtype", DTYPES + ["float16", "complex64"])
def test_compact_array_scan(dtype: str) -> None:
    for n in (0, 1, 33, 4097, 65537):
        a = data("float32" if dtype in ("float16", "complex64") else dtype, n, seed=n)
        a = a.astype(dtype)
        pred = "x" if dtype == "bool" else "x > 0"
        m = a if dtype == "bool" else (a.real if a.dtype.kind == "c" else a) > 0
        d = cupy.asarray(a)
        v = compact_array(d, pred, algorithm="scan")
        assert isinstance(v, cupy.ndarray) and v.dtype == a.dtype
        np.testing.assert_array_equal(cupy.asnumpy(v), a[m])
        v2, i2 = compact_array(d, pred, output="both", algorithm="scan")
        np.testing.assert_array_equal(cupy.asnumpy(v2), a[m])
        np.testing.assert_array_equal(cupy.asnumpy(i2), np.flatnonzero(m))
        i = compact_array(d, pred, output="indices", algorithm="scan")
        np.testing.assert_array_equal(cupy.asnumpy(i), np.flatnonzero(m))


def test_compact_scan_mask_path_and_map_compact() -> None:
    a = data("int32", 10_007, seed=3) % 10
    d = cupy.asarray(a)
    # astype is not traced: the callable is evaluated per chunk into a mask (the mask path)
    got = compact_array(d, lambda v: v.astype(np.float64) % 3 == 1, algorithm="scan")
    np.testing.assert_array_equal(cupy.asnumpy(got), a[a.astype(np.float64) % 3 == 1])
    x = da.from_array(a, chunks=1_001).map_blocks(cupy.asarray)
    with dask.config.set(scheduler="threads"):
        v, i = x.map_compact("x > 6", output="both", algorithm="scan")
        np.testing.assert_array_equal(cupy.asnumpy(v.compute()), a[a > 6])
        np.testing.assert_array_equal(cupy.asnumpy(i.compute()), np.flatnonzero(a > 6))


@pytest.mark.parametrize("alg", ["auto", *GPU_ALGORITHMS])
@pytest.mark.parametrize("acc", ["float32", "float64"])
def test_float16_into_a_float_dtype_on_cupy(alg: str, acc: str) -> None:
    # float16 with a float32/float64 dtype= (np.cumsum(a, dtype=...)), taken since
    # 2026-12-01: each chunk widened to the accumulator before the kernels (scan.widened)
    for n in (0, 1, 33, 2049, 4097):
        a = data("float16", n, seed=n)
        for exclusive in (False, True):
            _check(a, alg, exclusive, acc)
    chunks = (1, 7, 0, 4097, 3)
    a = data("float16", sum(chunks), seed=3)
    x = da.from_array(a, chunks=(chunks,)).map_blocks(cupy.asarray)
    for exclusive in (False, True):
        y = cumsum(x, exclusive=exclusive, algorithm=alg, dtype=acc)
        with dask.config.set(scheduler="threads"):
            assert_scan(y.compute(), a, exclusive, acc)
    with pytest.raises(TypeError, match="dtype=np.float32 or np.float64"):
        scan_array(cupy.asarray(a), algorithm=alg)


@pytest.mark.parametrize("dtype", ["int16", "int32", "uint32", "int64", "float32", "float64"])
def test_input_of_the_other_byte_order(dtype: str) -> None:
    """scan_array of a CuPy view of a swapped dtype (CuPy makes no such arrays otherwise)
    scans the numbers it holds, in native order: each number's bytes reversed
    (validate.to_native). CuPy's ``astype`` to the native dtype copies the bits as they are
    (read in CuPy's source), which is how it was converted until 2026-12-01 (thirteenth
    session). Against NumPy; cumsum of a dask array of such chunks too."""
    a = data(dtype, 65537, seed=5)
    swapped = a.astype(a.dtype.newbyteorder())
    x = cupy.asarray(swapped.view(np.uint8)).view(swapped.dtype)
    assert not x.dtype.isnative
    for exclusive in (True, False):
        assert_scan(scan_array(x, exclusive=exclusive), a, exclusive)
    chunks = da.from_array(swapped, chunks=8192).map_blocks(
        lambda b: cupy.asarray(b.view(np.uint8)).view(b.dtype), dtype=swapped.dtype,
        meta=cupy.empty(0, np.uint8).view(swapped.dtype))
    with dask.config.set(scheduler="threads"):
        got = cumsum(chunks).compute()
    assert_scan(got, a, False)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("alg", ["auto", *GPU_ALGORITHMS])
def test_exclusive_float_scan_starts_at_positive_zero(alg: str, dtype: str) -> None:
    """An exclusive float scan's first element is the sum of nothing, +0.0 (its bytes set by a
    memset after the kernels, which scan from -0.0 so that a leading -0.0 stays -0.0 in the
    sums after it), bit for bit the CPU's exclusive scan, whatever the input's first value."""
    for first in (-0.0, 0.0, -2.5):
        a = np.array([first, -0.0, 1.5, -0.0], dtype)
        got = cupy.asnumpy(scan_array(cupy.asarray(a), exclusive=True, algorithm=alg))
        cpu = scan_array(a, exclusive=True)
        assert not np.signbit(got[0]) and got[0] == 0, (first, got)
        assert got.tobytes() == cpu.tobytes(), (first, got, cpu)


@pytest.mark.parametrize("dtype,out", [("float32", None), ("int32", "int64"), ("float64", None),
                                       ("uint8", None)])
def test_repeated_lookback_calls_keep_one_ready_scan_per_stream(dtype: str, out: str | None):
    """A repeated look-back scan runs the ready scan kept for its thread, stream and dtypes
    (cupy_scan._ReadyScan: packed launches): bases that change from call to call (a dask
    chunk's offset, none), misaligned views (the element-wise tile), N-D input, another
    stream and another thread each give NumPy's scan, and one stream's calls build it once."""
    import threading

    acc = np.dtype(out) if out else np.cumsum(np.zeros(1, dtype)).dtype
    h = data(dtype, 70_001, seed=21)
    a = cupy.asarray(h)
    cupy_scan._ready_scans.clear()
    for base in (None, 7, None, 3, 3, None):
        for exclusive in (True, False):
            got = cupy_scan.scan(a, exclusive, "auto", acc, base)
            shift = 0 if base is None else acc.type(base)
            assert_scan(got - shift if base is not None else got, h, exclusive, acc)
    assert len(cupy_scan._ready_scans.values()) == 2  # exclusive and inclusive
    assert_scan(scan_array(a[1:], dtype=out), h[1:], True, acc)  # misaligned: VEC = 1
    sq = h[:250 * 280].reshape(250, 280)
    assert_scan(scan_array(cupy.asarray(sq), exclusive=False, dtype=out), sq, False, acc)
    with cupy.cuda.Stream(non_blocking=True) as s:
        got = scan_array(a, dtype=out)
        s.synchronize()
    assert_scan(got, h, True, acc)
    results: list = []
    th = threading.Thread(target=lambda: results.append(cupy.asnumpy(scan_array(a, dtype=out))))
    th.start()
    th.join()
    assert_scan(cupy.asarray(results[0]), h, True, acc)
