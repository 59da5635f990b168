"""Scans on the CPU: scan_array and cumsum (NumPy chunks) against np.cumsum, the dask graph's
shape, a distributed LocalCluster, a property test, compact_array(..., algorithm="scan"), and
the errors. The GPU side is tests/gpu/test_scan_gpu.py."""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np
import pytest
from chunk_shape_helpers import LENGTHS, SHAPES, misdeclared, refusal
from conftest import scan_data as data
from conftest import scan_reference as reference
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dask_compact
from dask_compact import compact_array, compact_into, cumsum, scan_array
from dask_compact.scan import GPU_ALGORITHMS, scan_dtype

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64",
]  # fmt: skip
SIZES = [0, 1, 2, 31, 33, 1023, 1025, 4099, 65537]  # 4099 and 65537 are prime


def assert_scan(got: np.ndarray, want: np.ndarray, a: np.ndarray) -> None:
    """Integers exactly; floats to rounding relative to the running sum of magnitudes (the
    order of additions may differ from NumPy's, e.g. across dask chunks)."""
    assert type(got) is np.ndarray
    assert got.dtype == want.dtype and got.shape == want.shape
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    scale = np.cumsum(np.abs(a.ravel().astype(np.float64)))
    scale = np.concatenate([[0.0], scale])[: want.size] + scale[: want.size]  # both forms
    tol = 8 * np.finfo(want.dtype).eps * (scale + 1)
    assert np.all(np.abs(got.astype(np.float64) - want.astype(np.float64)) <= tol)


# ------------------------------------------------------------------------- scan_array --------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("exclusive", [True, False])
def test_scan_array_every_dtype_and_size(dtype: str, exclusive: bool) -> None:
    for n in SIZES:
        a = data(dtype, n, seed=n)
        want = reference(a, exclusive)
        got = scan_array(a, exclusive=exclusive)
        assert got.dtype == np.cumsum(a).dtype
        assert_scan(got, want, a)
        if want.dtype.kind == "f":
            # the CPU adds in NumPy's order: the same bits
            np.testing.assert_array_equal(got, want)


def test_output_dtype_is_numpys() -> None:
    for dt in DTYPES:
        assert scan_dtype(dt) == np.cumsum(np.zeros(3, dt)).dtype
    assert scan_dtype("int8") == np.dtype(np.int64)
    assert scan_dtype("uint16") == np.dtype(np.uint64)
    assert scan_dtype("bool") == np.dtype(np.int64)
    assert scan_dtype("float32") == np.dtype(np.float32)
    assert scan_dtype(">i4") == np.dtype(np.int64)


def test_kept_output_dtypes_are_the_worked_out_ones_and_refusals_repeat() -> None:
    """scan_dtype keeps its answers per (dtype, out_dtype, call) (scan._kept_scan_dtype):
    asked twice, each answer is what working it out gives; a refusal raises every time, with
    the same message; an unhashable dtype is refused as np.dtype refuses it."""
    from dask_compact import scan as scan_module

    cases = [(dt, None) for dt in DTYPES] + [
        ("int8", "uint64"), (">i4", None), (np.float16, np.float32), ("int32", ">f8"),
        (np.dtype("float32"), "float64"), (bool, None), (np.uint16, np.int32), ("int32", "int8")]
    for dt, out in cases:
        first = scan_dtype(dt, out)
        assert scan_dtype(dt, out) is first == scan_module._scan_dtype(dt, out, "cumsum")
    for dt, out in [("float16", None), ("m8[s]", None), ("float32", "int64"), ("int8", "f2"),
                    ("c8", None), ("int32", "bool")]:
        messages = set()
        for _ in range(2):
            with pytest.raises(TypeError) as e:
                scan_dtype(dt, out, "scan_array")
            messages.add(str(e.value))
        assert len(messages) == 1
    with pytest.raises(TypeError) as e:
        scan_dtype([1, 2])
    with pytest.raises(TypeError) as want:
        np.dtype([1, 2])
    assert str(e.value) == str(want.value)


@pytest.mark.parametrize(
    "dtype,out",
    [("int32", "int32"), ("int8", "uint64"), ("uint64", "int64"), ("int64", "int32"),
     ("int16", "float32"), ("bool", "float64"), ("float64", "float32"), ("uint32", "uint32"),
     ("int32", "float64")],
)  # fmt: skip
def test_explicit_dtype(dtype: str, out: str) -> None:
    a = data(dtype, 1025, seed=3)
    for exclusive in (True, False):
        want = reference(a, exclusive, dtype=out)
        got = scan_array(a, exclusive=exclusive, dtype=out)
        assert got.dtype == np.dtype(out)
        assert_scan(got, want, a.astype(out))


def test_integer_sums_wrap_as_numpys() -> None:
    a = np.array([2**62, 2**62, 2**62, -5, 2**63 - 1], dtype=np.int64)
    np.testing.assert_array_equal(scan_array(a, exclusive=False), reference(a, False))
    u = np.full(7, np.iinfo(np.uint64).max, dtype=np.uint64)
    np.testing.assert_array_equal(scan_array(u, exclusive=True), reference(u, True))


@pytest.mark.parametrize("values, dtype", [([2**31, 2**31, 1, 7], "uint32"),
                                           ([2**30] * 4 + [1], "int32"),
                                           ([-(2**31)] * 3 + [5], "int32"),
                                           ([2**63, 2**63, 3], "uint64")])
@pytest.mark.parametrize("exclusive", [False, True])
def test_dask_cumsum_into_a_narrow_accumulator_wraps_across_chunks(values, dtype, exclusive):
    """A chunk's total that leaves the accumulator's range wraps, as NumPy's sums do (the
    CPU loop adds in 64 bits; its total was cast to the accumulator and raised)."""
    a = np.array(values, dtype=np.dtype(dtype))
    expect = np.cumsum(a, dtype=dtype)
    if exclusive:
        expect = np.concatenate([[0], expect[:-1]]).astype(dtype)
    for chunks in (1, 2, 3):
        got = cumsum(da.from_array(a, chunks=chunks), dtype=dtype, exclusive=exclusive)
        got = got.compute()
        assert got.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(got, expect)


@pytest.mark.parametrize("dtype,out", [("int8", "int8"), ("int64", "int16"), ("uint16", "uint8"),
                                       ("bool", "int16"), ("int32", "uint16"), ("uint64", "int8")])
def test_a_narrow_integer_dtype_sums_as_numpys(dtype: str, out: str) -> None:
    """``dtype=np.int8`` (or int16, uint8, uint16) is np.cumsum's sum in that width, wrapping
    (summed in uint32 and cast: scan.summing_dtype). It was refused, "dtype must be one of
    int32, ...", where np.cumsum(a, dtype=np.int16) takes it (2026-12-06)."""
    for n in (0, 1, 31, 1025, 65537):
        a = data(dtype, n, seed=n + 7)
        for exclusive in (True, False):
            want = reference(a, exclusive, dtype=out)
            got = scan_array(a, exclusive=exclusive, dtype=out)
            assert got.dtype == np.dtype(out)
            np.testing.assert_array_equal(got, want)
            x = cumsum(da.from_array(a, chunks=max(1, n // 3)), exclusive=exclusive, dtype=out)
            assert x.dtype == np.dtype(out)
            got = x.compute()
            assert got.dtype == np.dtype(out)
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("loops", ["compiled", "numpy"])
def test_a_narrow_dtype_chunk_scan_stores_the_low_bits_of_its_uint32_sums(
        loops: str, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A dask chunk's scan into a narrow dtype: its uint32 offset (scan.summing_dtype) and sums
    taken by their low bits, by the compiled loop storing the narrow type itself
    (numpy_scan._scan_narrow) and by NumPy where numba has no room (a uint32 scan, cast)."""
    from dask_compact.backends import numpy_scan
    from dask_compact.dispatch import scan_chunk

    if loops == "numpy":
        monkeypatch.setattr(numpy_scan, "_loops", lambda: None)
    u32 = np.dtype(np.uint32)
    for dtype, out in (("int16", "int16"), ("int64", "int8"), ("bool", "uint16"),
                       ("uint64", "uint8"), ("int8", "int16")):
        for n in (0, 1, 33, 4099):
            a = data(dtype, n, seed=n + 3)
            for base in (None, np.uint32(2**32 - 3), np.uint32(70001)):
                for exclusive in (True, False):
                    got = scan_chunk(a, exclusive, "auto", u32, base, out_dtype=out)
                    want = reference(a, exclusive, u32).astype(np.uint64) + int(base or 0)
                    want = (want % 2**32).astype(u32).astype(out)
                    assert got.dtype == np.dtype(out)
                    np.testing.assert_array_equal(got, want)


def test_a_bool_dtype_is_told_a_running_or_that_works() -> None:
    """``np.cumsum(a, dtype=bool)`` is a running logical or; ``dtype=bool`` is refused saying
    what gives it, for each call in its own terms (scan_array's hint named cumsum, which
    refuses an in-memory array: a review, 2026-12-06). Run as written, NumPy's answer."""
    import re

    a = np.array([0, 0, -3, 0, 5, 0], dtype=np.int16)
    want = np.cumsum(a, dtype=bool)
    for call, arg in ((scan_array, a), (cumsum, da.from_array(a, chunks=4))):
        with pytest.raises(TypeError, match="running logical or") as e:
            call(arg, dtype=bool)
        code = re.search(r"or: (.*) gives it", str(e.value)).group(1)
        got = eval(code, {"dask_compact": dask_compact, "a": a, "x": arg})
        np.testing.assert_array_equal(np.asarray(got), want, err_msg=code)


def test_nd_input_is_flattened_in_c_order() -> None:
    a = data("int16", 6 * 7 * 5, seed=1).reshape(6, 7, 5)
    np.testing.assert_array_equal(scan_array(a, exclusive=False), np.cumsum(a))
    f = np.asfortranarray(a)
    np.testing.assert_array_equal(scan_array(f, exclusive=False), np.cumsum(a))
    np.testing.assert_array_equal(scan_array(a[:, ::2], exclusive=True),
                                  reference(a[:, ::2], True))
    assert scan_array(np.float32(2.5), exclusive=False).tolist() == [2.5]
    assert scan_array(np.zeros((3, 0)), exclusive=True).shape == (0,)


def test_big_endian_and_views() -> None:
    a = data("int32", 333, seed=2)
    np.testing.assert_array_equal(scan_array(a.astype(">i4"), exclusive=False), np.cumsum(a))
    np.testing.assert_array_equal(scan_array(a[1::3], exclusive=False), np.cumsum(a[1::3]))
    f = data("float64", 333, seed=2).astype(">f8")
    np.testing.assert_array_equal(scan_array(f, exclusive=False), np.cumsum(f.astype("<f8")))


def test_an_accumulator_dtype_of_either_byte_order_is_taken() -> None:
    """``dtype=">i8"`` is int64 (NumPy's ``np.cumsum(a, dtype=">i8")`` takes it): it was
    refused, "dtype must be one of int32, int64, ... not >i8" (a new-user probe of
    big-endian data, 2026-12-01). The sums come back in native order, as every result
    does."""
    a = np.arange(70_000).astype(">u2")
    for out in (">i8", ">u8", ">i4", ">u4", ">f8"):  # sums exact in each (or wrapping)
        for exclusive in (True, False):
            want = reference(a.astype("<u2"), exclusive, dtype=np.dtype(out).newbyteorder("="))
            got = scan_array(a, exclusive=exclusive, dtype=out)
            assert got.dtype == np.dtype(out).newbyteorder("=")
            np.testing.assert_array_equal(got, want)
            got = cumsum(da.from_array(a, chunks=9_999), exclusive=exclusive, dtype=out)
            assert got.dtype == np.dtype(out).newbyteorder("=")
            np.testing.assert_array_equal(got.compute(), want)
    # a narrow one too (summed in uint32 and cast), in native order; a half float is refused
    got = scan_array(a, exclusive=False, dtype=">i2")
    assert got.dtype == np.dtype("<i2")
    np.testing.assert_array_equal(got, reference(a.astype("<u2"), False, dtype="<i2"))
    with pytest.raises(TypeError, match="not float16"):
        scan_array(a, dtype=">f2")


def test_the_first_element_is_numpys_bit_for_bit() -> None:
    """NumPy's running sum starts at a[0] itself; 0.0 + a[0] turned a leading -0.0 into 0.0
    and quieted a signalling NaN (a probe). The first chunk of a dask cumsum has no offset
    either."""
    signalling = np.array([0x7FF0000000000001], np.uint64).view(np.float64)
    for a in (np.array([-0.0, 1.0]), np.array([-0.0, -0.0, 2.0], np.float32), signalling,
              np.concatenate([signalling, [1.0]])):
        want = np.cumsum(a)
        assert scan_array(a, exclusive=False).tobytes() == want.tobytes()
        assert scan_array(a, exclusive=True)[1:].tobytes() == want[:-1].tobytes()
    got = cumsum(da.from_array(np.array([-0.0, 1.0, 2.0, 3.5]), chunks=2)).compute()
    assert np.signbit(got).tolist() == [True, False, False, False]


def test_a_chunk_after_empty_chunks_only_is_numpys_bit_for_bit() -> None:
    """A chunk with no element before it takes no offset, whatever its index: with a leading
    empty chunk the next one added 0.0 (a leading -0.0 came back 0.0, a signalling NaN
    quieted; a new-user probe). Dask's own cumsum fails on a leading empty chunk."""
    x = np.array([-0.0, -0.0, -0.0], np.float32)
    for chunks in (((0, 3),), ((0, 0, 3),), ((0, 1, 0, 2),)):
        got = cumsum(da.from_array(x, chunks=chunks)).compute()
        assert np.signbit(got)[:1].tolist() == [True], chunks
    got = cumsum(da.from_array(x, chunks=((0, 3),))).compute()
    assert got.tobytes() == np.cumsum(x).tobytes()
    signalling = np.array([0x7FA00001, 0x3F800000], np.uint32).view(np.float32)
    got = cumsum(da.from_array(signalling, chunks=((0, 2),))).compute()
    assert got[:1].tobytes() == np.cumsum(signalling)[:1].tobytes()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_offsets_keep_a_negative_zero_sum(dtype: str) -> None:
    """A chunk after others adds their totals' sum, and a sum of -0.0s is -0.0: each total
    started at 0.0 (0.0 + -0.0 is 0.0), so every chunk after the first of an all -0.0 prefix
    came back 0.0 where np.cumsum keeps -0.0, an empty chunk's total (0.0) did the same
    between two chunks, and an exclusive scan's first element of such a chunk too (an
    adversarial probe, 2026-12-01). -0.0 is the sum's identity: -0.0 + v is v for every v."""
    x = np.array([-0.0, -0.0, -0.0, -0.0, 1.0, -1.0], dtype)
    for chunks in ((1,) * 6, (2, 4), (1, 0, 1, 0, 4), (0, 2, 0, 1, 3), (3, 0, 3)):
        got = cumsum(da.from_array(x, chunks=(chunks,))).compute()
        assert got.tobytes() == np.cumsum(x).tobytes(), chunks
        got = cumsum(da.from_array(x, chunks=(chunks,)), exclusive=True).compute()
        assert got.tobytes() == scan_array(x, exclusive=True).tobytes(), chunks
    a = np.zeros(0, dtype)
    from dask_compact.backends import numpy_scan

    assert np.signbit(numpy_scan.total(a, np.dtype(dtype)))  # an empty chunk adds nothing
    assert np.signbit(numpy_scan.total(x[:4], np.dtype(dtype)))


def test_sequential_is_auto() -> None:
    a = data("uint8", 1000, seed=5)
    np.testing.assert_array_equal(scan_array(a, algorithm="sequential"), scan_array(a))


def test_errors() -> None:
    a = np.arange(10)
    with pytest.raises(TypeError, match="NumPy or CuPy"):
        scan_array([1, 2, 3])
    with pytest.raises(TypeError, match="masked"):
        scan_array(np.ma.masked_array(a, a > 3))
    with pytest.raises(TypeError, match="float16"):
        scan_array(a.astype(np.float16))
    with pytest.raises(TypeError, match="complex128"):
        scan_array(a.astype(np.complex128))
    with pytest.raises(TypeError, match="cast it first"):
        scan_array(a.astype(np.float32), dtype=np.int64)
    with pytest.raises(TypeError, match="dtype must be one of"):
        scan_array(a, dtype=np.float16)
    with pytest.raises(TypeError, match="cast it first"):
        cumsum(da.from_array(np.linspace(0, 9, 10), chunks=4), dtype=np.int8)
    for alg in GPU_ALGORITHMS[1:]:
        with pytest.raises(ValueError, match="runs on CuPy data"):
            scan_array(a, algorithm=alg)
    with pytest.raises(ValueError, match="algorithm must be one of"):
        scan_array(a, algorithm="blelloch")
    x = da.arange(10, chunks=3)
    with pytest.raises(TypeError, match="dask array.*dask_compact.scan_array for an in-memory"):
        cumsum(a)
    # the other way round: np.asarray was the hint (computing the array to scan it here)
    with pytest.raises(TypeError, match=r"in-memory.*dask_compact.cumsum\(x\)"):
        scan_array(x)
    with pytest.raises(ValueError, match="runs on CuPy data"):
        cumsum(x, algorithm="lookback")
    with pytest.raises(ValueError, match="2-D input with unknown chunk sizes"):
        y = da.arange(12, chunks=5).reshape(3, 4)
        cumsum(y[y[:, 0] > 3])
    with pytest.raises(TypeError, match="float16"):
        cumsum(x.astype(np.float16))


@pytest.mark.parametrize("dtype,out", [("float64", None), ("int16", "int16"), ("bool", None),
                                       ("uint8", "int64"), ("float32", "float32")])
@pytest.mark.parametrize("exclusive", [False, True])
def test_cumsum_of_unknown_chunk_sizes(dtype: str, out: str | None, exclusive: bool) -> None:
    """1-D input of unknown chunk sizes (``x[x > t]``, a lazy compaction), as ``da.cumsum``
    takes it: refused until 2026-12-07 (a new-user probe), so the input had to be computed
    twice. The result's sizes are unknown too; empty chunks first keep NumPy's -0.0 and
    NaN bits in the first chunk that has elements (its scan has no offset)."""
    a = data(dtype, 1031, seed=5)
    x = da.from_array(a, chunks=97)
    keep = (np.arange(a.size) % 7 != 3) & (np.arange(a.size) > 300)  # first chunks empty
    xs = (x[da.from_array(keep, chunks=97)], x.map_compact(lambda v: v == v, lazy=True),
          x[da.from_array(np.zeros(a.size, bool), chunks=97)])
    for u, kept in zip(xs, (a[keep], a, a[:0])):
        y = cumsum(u, exclusive=exclusive, dtype=out)
        assert np.isnan(y.shape[0])
        got, want = y.compute(), reference(kept, exclusive, out)
        assert got.dtype == want.dtype
        if want.dtype.kind == "f":  # chunk offsets added as da.cumsum adds them
            np.testing.assert_allclose(got, want, rtol=1e-4 if dtype == "float32" else 1e-9,
                                       atol=1e-2)
        else:
            np.testing.assert_array_equal(got, want)
    z = np.array([5.0, 5.0, 5.0, -0.0, np.nan, 1.0])
    xz = da.from_array(z, chunks=2)
    got = cumsum(xz[xz != 5]).compute()  # one empty chunk, then -0.0 leads
    assert np.signbit(got[0]) and np.isnan(got[1]) and np.isnan(got[2])


def test_public_names() -> None:
    assert {"scan_array", "cumsum"} <= set(dask_compact.__all__)
    assert dask_compact.scan_array is scan_array and dask_compact.cumsum is cumsum


# ----------------------------------------------------------------------------- cumsum --------

ODD_CHUNKS = (1, 7, 0, 64, 3, 1025, 2, 400)  # 1502 elements, an empty chunk among them


@pytest.mark.parametrize("dtype", DTYPES)
def test_cumsum_odd_chunks(dtype: str) -> None:
    a = data(dtype, sum(ODD_CHUNKS), seed=7)
    x = da.from_array(a, chunks=(ODD_CHUNKS,))
    for exclusive in (False, True):
        y = cumsum(x, exclusive=exclusive)
        # the input's chunks less the empty one (graph.without_empty_chunks)
        assert y.chunks == (tuple(c for c in ODD_CHUNKS if c),)
        assert y.dtype == np.cumsum(a).dtype
        got = y.compute(scheduler="threads")
        assert_scan(got, reference(a, exclusive), a)


def test_cumsum_graph_is_three_phases_and_lazy() -> None:
    calls = []

    def source(b):
        calls.append(b.size)
        return b

    a = data("int32", 1000, seed=8)
    x = da.from_array(a, chunks=128).map_blocks(source, dtype=a.dtype)
    calls.clear()  # dask may have called it on a 0-size meta
    y = cumsum(x)
    assert calls == []  # nothing computed at call time
    layer = dict(y.dask.layers[y.name])
    names = {k[0].rsplit("-", 1)[0] for k in layer}
    assert names == {"cumsum-total", "cumsum-offsets", "cumsum"}
    assert len(layer) == 2 * x.numblocks[0] + 1
    np.testing.assert_array_equal(y.compute(scheduler="sync"), np.cumsum(a))
    # each chunk computed once for both of its readers
    assert sorted(calls) == sorted([128] * 7 + [1000 - 7 * 128])


def test_cumsum_nd_dtype_and_empty() -> None:
    a = data("uint8", 12 * 10, seed=9).reshape(12, 10)
    x = da.from_array(a, chunks=(5, 10))
    y = cumsum(x, dtype=np.uint32)
    assert y.dtype == np.uint32 and y.shape == (120,)
    np.testing.assert_array_equal(y.compute(), np.cumsum(a, dtype=np.uint32))
    e = cumsum(da.zeros(0, chunks=1, dtype=np.float32), exclusive=True)
    assert e.compute().shape == (0,) and e.dtype == np.float32
    # exclusive output has the input's length and starts with 0
    z = cumsum(da.ones(10, chunks=4, dtype=bool), exclusive=True).compute()
    np.testing.assert_array_equal(z, np.arange(10))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    values=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=6),
    exclusive=st.booleans(),
    dtype=st.sampled_from(["int32", "int64", "float64"]),
)
def test_cumsum_property(values, cuts, exclusive, dtype) -> None:
    """Any data, any chunking (empty chunks too): cumsum == np.cumsum, scan_array the same."""
    a = np.array(values, dtype=np.int64).astype(dtype)
    bounds = sorted({min(c, a.size) for c in cuts} | {0, a.size})
    chunks = tuple(b - c for c, b in zip(bounds, bounds[1:])) or (0,)
    x = da.from_array(a, chunks=(chunks,))
    want = reference(a, exclusive)
    with dask.config.set(scheduler="sync"):
        got = cumsum(x, exclusive=exclusive).compute()
    assert_scan(got, want, a)
    np.testing.assert_array_equal(scan_array(a, exclusive=exclusive), want)


# ------------------------------------------------------------ compaction on the scan --------


@pytest.mark.parametrize("dtype", DTYPES + ["float16", "complex64"])
def test_compact_array_scan_algorithm(dtype: str) -> None:
    for n in (0, 1, 33, 1025):
        a = data(dtype if dtype not in ("float16", "complex64") else "float32", n, seed=n)
        a = a.astype(dtype)
        pred = "x" if dtype == "bool" else "x > 0"
        m = a if dtype == "bool" else (a.real if a.dtype.kind == "c" else a) > 0
        v = compact_array(a, pred, algorithm="scan")
        np.testing.assert_array_equal(v, a[m])
        assert v.dtype == a.dtype
        i = compact_array(a, pred, output="indices", algorithm="scan")
        np.testing.assert_array_equal(i, np.flatnonzero(m))
        v2, i2 = compact_array(a, pred, output="both", algorithm="scan")
        np.testing.assert_array_equal(v2, a[m])
        np.testing.assert_array_equal(i2, np.flatnonzero(m))


def test_compact_scan_mask_path_nd_and_dask() -> None:
    a = data("int32", 2000, seed=11).reshape(40, 50) % 10
    got = compact_array(a, lambda v: np.isin(v, [2, 3]), algorithm="scan")  # mask path
    np.testing.assert_array_equal(got, a[np.isin(a, [2, 3])])
    x = da.from_array(a, chunks=(7, 50))
    with dask.config.set(scheduler="threads"):
        v, i = x.map_compact("x > 6", output="both", algorithm="scan")
        np.testing.assert_array_equal(v.compute(), a[a > 6])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(a > 6))
    with pytest.raises(ValueError, match="compact_into"):
        compact_into(a, "x > 1", np.empty(a.size, a.dtype), algorithm="scan")


# --------------------------------------------------------------------- distributed ----------


def test_cumsum_on_local_cluster(process_client) -> None:
    a = data("int32", 30_011, seed=12)
    x = da.from_array(a, chunks=2_001)
    y = cumsum(x)
    np.testing.assert_array_equal(y.compute(), np.cumsum(a))
    f = data("float32", 30_011, seed=13)
    fx = da.from_array(f, chunks=(1, 5_000, 0, 25_010))
    got = cumsum(fx, exclusive=True).compute()
    assert_scan(got, reference(f, True), f)
    # the scan compaction through a run of persisted chunks per worker (compact_many)
    p = x.persist()
    v = p.map_compact("x > 0", algorithm="scan")
    np.testing.assert_array_equal(v.compute(), a[a > 0])


@pytest.mark.skipif(np.dtype(np.longdouble) == np.dtype(np.float64),
                    reason="longdouble is float64 here")
def test_longdouble_is_refused_saying_what_works() -> None:
    """NumPy's cumsum of longdouble sums in longdouble, which no scan here is built for: the
    compiled loop failed with a numba TypingError (a new-user probe), the dask call when
    computed. A TypeError at the call says what works instead: dtype=np.float64 sums in
    float64, as np.cumsum(a, dtype=np.float64) does."""
    a = np.arange(10, dtype=np.longdouble) / 3
    x = da.from_array(a, chunks=3)
    for call in (lambda: scan_array(a, exclusive=False), lambda: cumsum(x)):
        with pytest.raises(TypeError, match="pass dtype=np.float64 to sum in float64"):
            call()
    want = np.cumsum(a, dtype=np.float64)
    np.testing.assert_array_equal(scan_array(a, exclusive=False, dtype=np.float64), want)
    np.testing.assert_allclose(cumsum(x, dtype=np.float64).compute(), want)
    for call in (lambda: dask_compact.sort(x), lambda: dask_compact.partition(x, "x > 1")):
        with pytest.raises(TypeError, match=np.dtype(np.longdouble).name):  # clear already
            call()


@pytest.mark.parametrize("exclusive", [False, True])
@pytest.mark.parametrize("actual, declared", LENGTHS + SHAPES)
def test_a_chunk_of_another_shape_than_declared_is_refused_naming_it(exclusive, actual,
                                                                     declared):
    """A from_delayed chunk of 5 elements declared 7: the result's chunks said 7 where 5
    sums came (a result of 19 elements declared 21); refused now, naming the chunk and both
    shapes (until 2026-12-01, the eleventh session)."""
    x = misdeclared(actual, declared)
    with pytest.raises(ValueError, match=refusal(actual, declared)):
        cumsum(x, exclusive=exclusive).compute()


def test_a_masked_array_is_refused_in_the_words_of_a_scan() -> None:
    # Until 2026-12-01 scan_array and cumsum were told how to compact a masked array ("never
    # selected: dask_compact.compact(...)"), not how to scan one (a probe). The advice given
    # is run: masked elements adding nothing, as np.ma.cumsum adds them.
    a = np.ma.masked_array(np.arange(10), np.arange(10) % 3 == 0)
    with pytest.raises(TypeError, match="masked") as e:
        scan_array(a, exclusive=False)
    assert "never selected" not in str(e.value)
    assert "scan_array(np.ma.filled(a, 0))" in str(e.value)
    np.testing.assert_array_equal(scan_array(np.ma.filled(a, 0), exclusive=False),
                                  np.ma.getdata(np.ma.cumsum(a)))
    x = da.ma.masked_array(da.arange(10, chunks=4), da.arange(10, chunks=4) % 3 == 0)
    with pytest.raises(TypeError, match="masked") as e:
        cumsum(x)
    assert "never selected" not in str(e.value)
    assert "cumsum(da.ma.filled(x, 0))" in str(e.value)
    np.testing.assert_array_equal(cumsum(da.ma.filled(x, 0)).compute(),
                                  np.ma.getdata(np.ma.cumsum(a)))
    # a masked chunk under a plain meta, refused when computed
    y = da.arange(10, chunks=4).map_blocks(lambda b: np.ma.masked_array(b, b % 3 == 0))
    with pytest.raises(TypeError, match="masked") as e:
        cumsum(y).compute()
    assert "never selected" not in str(e.value) and "da.ma.filled(x, 0)" in str(e.value)


@pytest.mark.parametrize("acc", ["float32", "float64"])
def test_float16_is_summed_into_a_float_dtype_as_numpy_sums_it(acc: str) -> None:
    # np.cumsum(a16, dtype=np.float64) widens each element and sums in float64; until
    # 2026-12-01 scan_array and cumsum refused float16 whatever dtype= said (the eleventh
    # session's scan probe). Without dtype= NumPy adds in float16, still refused.
    for n in (0, 1, 31, 33, 1023, 1025, 4099):
        a = data("float16", n, seed=n)
        if n > 8:
            a[[1, 5, 7]] = [np.nan, -0.0, np.inf]
        if n == 1:
            a[0] = -0.0
        for exclusive in (True, False):
            want = reference(a, exclusive, dtype=acc)
            got = scan_array(a, exclusive=exclusive, dtype=acc)
            assert got.dtype == np.dtype(acc)
            np.testing.assert_array_equal(got, want)  # bit for bit, as the other dtypes
            assert (np.signbit(got) == np.signbit(want)).all()
            x = da.from_array(a, chunks=max(n // 3, 1))
            got = cumsum(x, exclusive=exclusive, dtype=acc).compute()
            assert got.dtype == np.dtype(acc)
            np.testing.assert_allclose(got, want, rtol=1e-6 if acc == "float32" else 1e-12)
        big = a.astype(">f2")  # other byte order
        np.testing.assert_array_equal(scan_array(big, exclusive=False, dtype=acc),
                                      reference(a, False, dtype=acc))
    a = data("float16", 10)
    with pytest.raises(TypeError, match="dtype=np.float32 or np.float64"):
        scan_array(a)
    with pytest.raises(TypeError, match="dtype=np.float32 or np.float64"):
        cumsum(da.from_array(a, chunks=3))
    with pytest.raises(TypeError, match="float16"):
        scan_array(a, dtype=np.int64)


@pytest.mark.parametrize("dtype", ["timedelta64[s]", ">m8[ms]"])
@pytest.mark.parametrize("call", ["cumsum", "scan_array"])
def test_timedeltas_are_told_their_int64_sum(dtype, call):
    """NumPy's cumsum sums timedeltas; cumsum and scan_array refused them with no way out
    (a refusal probe, 2026-12-02, sixteenth session). The refusal says to sum their int64
    counts and cast back (NaT excepted, which it says); run as written, it gives NumPy's
    sum (scan_array's exclusive one)."""
    import re

    a = (np.arange(29)[::-1] * 7 % 13 - 4).astype(dtype)
    x = da.from_array(a, chunks=8)
    given = {"cumsum": x, "scan_array": a}[call]
    with pytest.raises(TypeError, match="timedeltas sum as their int64 counts") as e:
        getattr(dask_compact, call)(given)
    assert "NaT" in str(e.value)
    (code,) = re.findall(r"`([^`]*)`", str(e.value))
    got = np.asarray(eval(code, {"dask_compact": dask_compact, "x": x, "a": a}))
    want = np.cumsum(a)
    if call == "scan_array":  # exclusive, its default
        want = np.concatenate([np.zeros(1, want.dtype), want[:-1]])
    assert got.dtype == a.dtype
    np.testing.assert_array_equal(got, want)
