"""The reliability rules on CuPy chunks: the mask path's slice check and the up-front sample
check with CuPy arrays, empty N-D CuPy input, the bounded cache of CuPy modules, and refused
predicates before any kernel runs."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
da = pytest.importorskip("dask.array")

import dask  # noqa: E402
from conftest import device_pool_capped  # noqa: E402

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


def test_a_mask_declared_bool_whose_cupy_chunks_are_not():
    """As on NumPy chunks: a uint8 0/2 chunk of a mask declared bool is refused, not taken as
    a selection of its nonzeros (the CuPy path once cast it to bool)."""
    a, x = _x(1000, 300)
    m = da.from_array(np.arange(1000) % 3, chunks=300).map_blocks(
        lambda b: cupy.asarray(b * 2, dtype=cupy.uint8), dtype=bool)
    with dask.config.set(scheduler="threads"):
        with pytest.raises(TypeError, match="holds uint8, but its dask array declares bool"):
            dask_compact.compact(x, m).compute()
        ok = da.from_array(np.arange(1000) % 3 == 0, chunks=300).map_blocks(cupy.asarray)
        got = cupy.asnumpy(dask_compact.compact(x, ok).compute())
    np.testing.assert_array_equal(got, a[np.arange(1000) % 3 == 0])


POWERS = [("2 ** x > 1", [3, -1, 5] * 400), ("x ** -3 != 7", [3, 4, 5] * 400),
          ("(x > 100) & (x ** (x - 4) > 0)", [3, 4, 5] * 400)]


@pytest.mark.parametrize("text, values", POWERS)
def test_negative_integer_powers_raise_on_the_gpu_as_numpy_does(text, values):
    """A kernel cannot raise (it gives 0, as CuPy does), so the GPU paths evaluate the integer
    powers' exponents first: every public path raises NumPy's ValueError, and a repeated call
    (the ready-call cache) checks its new data again."""
    msg = "Integers to negative integer powers"
    a = np.array(values, dtype=np.int64)
    d = cupy.asarray(a)
    with pytest.raises(ValueError, match=msg):
        np.asarray(a)[as_predicate(text).mask(a, np)]
    for kw in ({}, {"stable": False}, {"algorithm": "scan"}, {"output": "indices"}):
        with pytest.raises(ValueError, match=msg):
            dask_compact.compact_array(d, text, **kw)
    with pytest.raises(ValueError, match=msg):
        as_predicate(text).mask(d, cupy)  # the mask path's evaluation
    with pytest.raises(ValueError, match=msg):
        dask_compact.compact_into(d, text, cupy.empty_like(d))
    with pytest.raises(ValueError, match=msg):
        dask_compact.compact_records({"x": d, "y": d * 2}, text)
    x = da.from_array(a, chunks=700).map_blocks(cupy.asarray)
    with dask.config.set(scheduler="threads"), pytest.raises(ValueError, match=msg):
        x.map_compact(text).compute()
    good = cupy.asarray(np.abs(a) + 4)
    p = as_predicate(text)
    # the same predicate object and size: the repeated-call paths (none for a constant -3)
    for _ in range(3 if "-3" not in text else 0):
        want = np.abs(a) + 4
        np.testing.assert_array_equal(cupy.asnumpy(dask_compact.compact_array(good, p)),
                                      want[p.mask(want, np)])
        with pytest.raises(ValueError, match=msg):
            dask_compact.compact_array(d, p)
        dask_compact.compact_into(good, p, cupy.empty_like(d))  # compact_into's ready call
        with pytest.raises(ValueError, match=msg):
            dask_compact.compact_into(d, p, cupy.empty_like(d))
    assert dask_compact.compact_array(d[:0], text).size == 0  # nothing computed: no error


def test_out_of_device_memory_counts_first_then_says_why():
    """A call that reads once needs n-sized scratch; without room for it the call counts first
    (room for the result alone) and answers; without room for the result it raises CuPy's
    OutOfMemoryError (a MemoryError) with a note saying what it needed and what to do."""
    n = 1 << 24  # float32: one read whatever it selects (ONE_READ_ALWAYS_BYTES), 64 MiB scratch
    a = cupy.random.default_rng(5).random(n, dtype=cupy.float32)
    h = cupy.asnumpy(a)
    with device_pool_capped(24 << 20):  # a 5% result fits, the scratch not
        for stable in (True, True, False):  # the ready call, the repeated call, unstable
            got = dask_compact.compact_array(a, "x < 0.05", stable=stable)
            want = h[h < 0.05]
            np.testing.assert_array_equal(np.sort(cupy.asnumpy(got)) if not stable
                                          else cupy.asnumpy(got), np.sort(want)
                                          if not stable else want)
        with pytest.raises(MemoryError) as err:
            dask_compact.compact_array(a, "x < 0.95")
        assert any("ran out of device memory after counting first" in note
                   for note in getattr(err.value, "__notes__", ())), err.value
    np.testing.assert_array_equal(cupy.asnumpy(a), h)  # the input is untouched
    got = dask_compact.compact_array(a, "x < 0.95")  # and the same call works with room
    np.testing.assert_array_equal(cupy.asnumpy(got), h[h < 0.95])


@pytest.mark.parametrize("dtype", ["int8", "int64", "uint16", "float16", "float32", "float64"])
@pytest.mark.parametrize("text", ["x ** -1 > 0.3", "x ** 0.5 < 1.2", "(x * 2) ** -1 != 0"])
def test_scalar_powers_on_the_gpu_as_numpy_computes_them(dtype, text):
    """``x ** -1`` / ``x ** 0.5`` are np.reciprocal / np.sqrt on float arrays and np.power on
    the others: the kernels answer bit for bit as NumPy does, or raise where it raises (the
    GPU review probe's last silent divergence, ``v ** -1`` on int64, was CuPy's 0)."""
    rng = np.random.default_rng(6)
    a = (rng.normal(size=5003) * 3).astype(dtype)
    if a.dtype.kind == "f":
        a[:6] = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-30]).astype(a.dtype)
    d = cupy.asarray(a)
    p = as_predicate(text)
    try:
        with np.errstate(all="ignore"):
            want = p.mask(a, np)
    except (ValueError, OverflowError):
        with pytest.raises((ValueError, OverflowError)):
            dask_compact.compact_array(d, text)
        return
    for output, ref in (("values", a[want]), ("indices", np.flatnonzero(want))):
        np.testing.assert_array_equal(
            cupy.asnumpy(dask_compact.compact_array(d, text, output=output)), ref)
    np.testing.assert_array_equal(cupy.asnumpy(p.mask(d, cupy)), want)  # the mask path


def test_constant_numpy_scalar_exponents_and_capture_of_data_exponents():
    """A NumPy scalar exponent (np.int64(2)) runs and is checked once (CuPy refuses NumPy
    scalars in its functions: the check once handed it one); an exponent from the data cannot
    be checked inside a CUDA graph capture (a host sync), so such a call is refused there."""
    a = np.arange(-50, 50, dtype=np.int64)
    d = cupy.asarray(a)
    k = np.int64(2)
    p = as_predicate(lambda v: v ** k > 5)
    for _ in range(3):
        np.testing.assert_array_equal(cupy.asnumpy(dask_compact.compact_array(d, p)),
                                      a[a ** k > 5])
    with pytest.raises(ValueError, match="Integers to negative integer powers"):
        dask_compact.compact_array(d, lambda v: v ** np.int64(-2) > 5)
    pos = cupy.asarray(np.arange(1, 60, dtype=np.int64))
    out = cupy.empty_like(pos)
    q = as_predicate("2 ** (x - 1) > 4")
    s = cupy.cuda.Stream(non_blocking=True)
    dask_compact.compact_into(pos, q, out, stream=s)  # outside a capture: checked, runs
    s.synchronize()
    with s:
        s.begin_capture()
        try:
            with pytest.raises(ValueError, match="graph capture"):
                dask_compact.compact_into(pos, q, out, stream=s)
        finally:
            s.end_capture()


def test_prepare_warms_a_predicate_whose_exponent_is_negative_on_zeros():
    """prepare() plans on zeros; `2 ** (x - 1)` is negative there, which is no reason to skip
    building the kernels (the data is checked when it comes)."""
    from dask_compact.backends import cupy_backend

    p = as_predicate("2 ** (x - 1) > 4")
    cupy_backend.prepare(p, np.dtype(np.int64), "values")
    a = np.arange(1, 100, dtype=np.int64)
    np.testing.assert_array_equal(
        cupy.asnumpy(dask_compact.compact_array(cupy.asarray(a), p)), a[2 ** (a - 1) > 4])


def test_a_cupy_lookup_table_on_cupy_chunks_selects_as_numpy():
    """``lut[v]`` with a CuPy table on CuPy chunks: NumPy's answer (a lookup is elementwise;
    2026-11-30 the tracer sends lookups to the mask path; CuPy's indexing converts the index
    with ``__array__`` directly, which the first version of that refused)."""
    rng = np.random.default_rng(21)
    lut = rng.random(51) > 0.5
    a = rng.integers(0, 50, 10_007)
    lut_d = cupy.asarray(lut)
    x = da.from_array(a, chunks=997).map_blocks(cupy.asarray)
    with dask.config.set(scheduler="threads"):
        for pred, mask in ((lambda v: lut_d[v], lut[a]),
                           (lambda v: ~lut_d[v] & (v > 3), ~lut[a] & (a > 3))):
            want = a[mask]
            got = x.map_compact(pred).compute()
            assert isinstance(got, cupy.ndarray)
            np.testing.assert_array_equal(cupy.asnumpy(got), want)
            np.testing.assert_array_equal(
                cupy.asnumpy(dask_compact.compact_array(cupy.asarray(a), pred)), want)


def test_host_callables_on_cupy_chunks_fail_clearly():
    """A NumPy table or np.vectorize on CuPy chunks: CuPy refuses the implicit copy to the
    host; the error names the predicate, before any result is claimed."""
    rng = np.random.default_rng(22)
    lut = rng.random(51) > 0.5
    a = rng.integers(0, 50, 1_001)
    x = da.from_array(a, chunks=97).map_blocks(cupy.asarray)
    keep = np.vectorize(lambda z: z > 25, otypes=[bool])
    with dask.config.set(scheduler="threads"):
        for pred in (lambda v: lut[v], keep):
            with pytest.raises(Exception) as info:
                x.map_compact(pred).compute()
            assert "predicate" in "\n".join([str(info.value), *getattr(
                info.value, "__notes__", [])]), info.value


def test_a_mask_over_a_length_one_axis_in_several_cupy_chunks_is_refused():
    """As on NumPy chunks (tests/test_edge_cases.py): Dask's y > t over chunks (1, 0) has one
    block for two; refused, saying to rechunk."""
    a = np.array([0.1, 0.95, 0.2, 0.3])
    x = da.from_array(a, chunks=2).map_blocks(cupy.asarray)
    with dask.config.set(scheduler="threads"):
        y = x.map_compact("x > 0.9", lazy=True)
        y.compute_chunk_sizes()
        with pytest.raises(ValueError, match=r"rechunk\(-1\)"):
            dask_compact.compact(y, y > 0.5)
        r = y.rechunk(-1)
        got = dask_compact.compact(r, r > 0.5).compute()
    np.testing.assert_array_equal(cupy.asnumpy(got), [0.95])


INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
WRAPPING = {  # integer arithmetic that wraps in NumPy at the type's extremes
    "negate": lambda v: -v > 0,
    "negate below": lambda v: np.negative(v) < 0,
    "negate equal": lambda v: -v == v,  # a 16-bit register's upper bits must not count
    "abs": lambda v: abs(v) < 0,
    "floor_divide by -1": lambda v: v // -1 > 0,
    "square": lambda v: v * v > 1,
    "times -1": lambda v: v * -1 > 0,
    "double": lambda v: v + v < v,
    "minus one": lambda v: v - 1 > v,
    "cube": lambda v: v ** 3 > v,
    "shift": lambda v: (v << 7) < v,
}


@pytest.mark.parametrize(
    "dtype, name",  # NumPy refuses -1 as a constant for an unsigned array
    [(t, k) for t in INT_DTYPES for k in WRAPPING if t[0] == "i" or "-1" not in k],
)
def test_integer_arithmetic_wraps_as_numpy_at_the_extremes(dtype, name):
    """A probe: on the GPU -x of int16 -32768 compared as +32768 (`-x > 0` selected it, `abs(x)
    < 0` did not), where NumPy wraps to -32768: ptxas miscompiled a 16-bit negation before a
    16-bit compare. Every path of a traced predicate against NumPy at each integer type's
    extremes, mixed with random values."""
    info = np.iinfo(dtype)
    edges = np.array([info.min, info.min + 1, info.min // 2, -1 if info.min else 0, 0, 1, 2,
                      info.max // 2, info.max - 1, info.max], dtype=dtype)
    rng = np.random.default_rng(11)
    host = np.concatenate([edges, rng.integers(info.min, info.max, 4_091, dtype=dtype,
                                               endpoint=True), edges])
    pred = WRAPPING[name]
    with np.errstate(over="ignore"):
        mask = pred(host)
    want = host[mask]
    d = cupy.asarray(host)
    for algorithm in ("auto", "single-pass", "three-pass"):
        got = dask_compact.compact_array(d, pred, algorithm=algorithm)
        np.testing.assert_array_equal(cupy.asnumpy(got), want, err_msg=algorithm)
    got = dask_compact.compact_array(d, pred, algorithm="hybrid", stable=False)
    np.testing.assert_array_equal(np.sort(cupy.asnumpy(got)), np.sort(want))
    i = dask_compact.compact_array(d, pred, output="indices")
    np.testing.assert_array_equal(cupy.asnumpy(i), np.flatnonzero(mask))


HUGE_INTS = {
    "complex rint": lambda x: (2**64 * x) <= np.rint(x),
    "real of rint": lambda x: np.real(np.rint(x) + 2**70) > 0,
    "where": lambda x: np.where(x < 2**64, 2**70, -np.inf) >= x,
    "where of x": lambda x: np.where(x > 0, 2**64, x) > 0,
    "times": lambda x: (x * 2**70) > 0,
    "maximum": lambda x: np.maximum(x, 2**65) > 0,
    "power": lambda x: x ** 2**64 > 1,
    "real of a product": lambda x: np.real(x * 2**100) > 0,
    "real plus": lambda x: np.real(np.rint(x)) == np.real(x) + 2**64,
    "where of rint": lambda x: np.where(np.rint(x) == x, x, 2**64) == x,
}


@pytest.mark.parametrize("dtype", ["complex64", "complex128", "float16", "float32", "float64",
                                   "uint32", "int8", "int64"])
@pytest.mark.parametrize("name", list(HUGE_INTS))
def test_python_ints_beyond_int64_on_the_cupy_fallback(dtype, name):
    """Predicates the GPU does not compile (complex rint, power, sqrt; a constant that does
    not fit its loop) run with CuPy, which refused a Python int beyond int64 (OverflowError:
    Python int too large to convert to C long; the GPU probe of 2026-11-30, fifth session)
    where NumPy answers: the int now goes to CuPy as NumPy converts it (NEP 50), and where
    NumPy raises, so does the call."""
    f = HUGE_INTS[name]
    host = ((np.arange(33) - 16.5 + 1j) if dtype.startswith("c") else
            np.arange(33) - (16 if dtype[0] == "i" else 0)).astype(dtype)
    try:
        with np.errstate(all="ignore"):
            want = f(host)
    except (OverflowError, ValueError, TypeError) as e:
        with pytest.raises((type(e), ValueError)), np.errstate(all="ignore"):
            dask_compact.compact_array(cupy.asarray(host), f, output="indices")
        return
    with np.errstate(all="ignore"):
        got = dask_compact.compact_array(cupy.asarray(host), f, output="indices")
    if name == "power" and dtype.startswith("c"):
        # a complex power runs as CuPy's, which differs from NumPy's at such magnitudes (the
        # fallback follows CuPy: design.md, "The GPU against NumPy"; on the H200 3 of 33
        # elements): the constant must reach it as NumPy converts it, complex 2**64
        want = cupy.asnumpy(cupy.asarray(host) ** cupy.asarray(host.dtype.type(2**64)) > 1)
    np.testing.assert_array_equal(cupy.asnumpy(got), np.flatnonzero(want))


SIGNED_ZEROS = [-0.0, 0.0, np.nan, -np.nan, -1.0, 1.0, -np.inf, np.inf, 2.5]
# string predicates (the fused kernels, not a callable's CuPy calls), NumPy's names
MINMAX = [f"signbit({fn}({args}))" for fn in ("minimum", "maximum", "fmin", "fmax")
          for args in ("x, 0.0", "x, -0.0", "0.0, x", "-0.0, x")]
MINMAX += ["1 / minimum(x, 0) < 0", "1 / maximum(x, -0.0) < 0"]


def _numpy_text(text: str, a: np.ndarray) -> np.ndarray:
    names = {n: getattr(np, n) for n in ("signbit", "minimum", "maximum", "fmin", "fmax",
                                         "negative", "absolute", "real")}
    return eval(text, dict(names, x=a))  # noqa: S307 -- the test's own literals


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("text", MINMAX)
def test_signed_zero_ties_of_minimum_and_maximum(dtype, text):
    """+0.0 against -0.0 in minimum/maximum/fmin/fmax: the GPU gives what the CPU loop gives
    (float32/64: the second operand, as x86 NumPy's minimum and maximum; float16: the first,
    as NumPy's half loops everywhere). The GPU probe of 2026-11-30 (fifth session): the GPU
    gave -0.0 for minimum(-0.0, 0), so `1 / minimum(x, 0) < 0` selected -0.0 there only.
    NumPy's own ties are not the same on every machine (aarch64's fmin/fmax instructions;
    x86's np.fmin with the array's length): minimum/maximum are checked against NumPy on
    x86-64 and float16 everywhere, fmin/fmax against the CPU loop only."""
    import platform

    assert as_predicate(text).path == "fused"
    host = np.tile(np.array(SIGNED_ZEROS, dtype=dtype), 7)
    with np.errstate(all="ignore"):
        cpu = dask_compact.compact_array(host, text, output="indices")
        got = cupy.asnumpy(dask_compact.compact_array(cupy.asarray(host), text, output="indices"))
        want = np.flatnonzero(_numpy_text(text, host))
    np.testing.assert_array_equal(got, cpu)
    if dtype == "float16" or (platform.machine() in ("x86_64", "AMD64")
                              and not text.startswith("signbit(fm")):
        np.testing.assert_array_equal(got, want)


NAN_SIGNS = ["signbit(-x)", "signbit(negative(x))", "signbit(abs(x))", "signbit(absolute(x))",
             "signbit(-absolute(x))"]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("text", NAN_SIGNS)
def test_negate_and_abs_of_a_nan_are_on_its_sign_bit(dtype, text):
    """-x flips a NaN's sign bit and abs(x) clears it, as IEEE 754 and NumPy's loops do; the
    GPU's float64 -x and abs(x) left it (the GPU probe of 2026-11-30, fifth session). Complex:
    the real part of -x (abs of complex is a float magnitude, a NaN's sign open: left out)."""
    vals = np.tile(np.array([np.nan, -np.nan, -0.0, 0.0, -1.0, 1.0, np.inf, -np.inf]), 9)
    with np.errstate(all="ignore"):
        if dtype.startswith("complex"):
            if "abs" in text:
                pytest.skip("abs of a complex NaN is hypot's NaN, whose sign IEEE leaves open")
            text = text.replace("signbit(", "signbit(real(", 1) + ")"
            host = (vals + 1j * np.roll(vals, 1)).astype(dtype)
        else:
            host = vals.astype(dtype)
        assert as_predicate(text).path == "fused"
        want = np.flatnonzero(_numpy_text(text, host))
        got = cupy.asnumpy(dask_compact.compact_array(cupy.asarray(host), text, output="indices"))
    np.testing.assert_array_equal(got, want)


def test_a_strided_input_whose_contiguous_copy_does_not_fit_says_so():
    """The kernels read by flat index, so a strided view is copied whole first (a.nbytes more
    device memory). A probe's compact_into of ``a[::2]`` into an allocated output, its result
    1 MiB, raised CuPy's bare "Out of memory allocating ..."; the error now names the copy,
    and the call answers once there is room."""
    a = cupy.random.default_rng(6).random(1 << 24, dtype=cupy.float32)
    v = a[::2]  # 32 MiB to copy
    h = cupy.asnumpy(v)
    out = cupy.empty(v.size, dtype=v.dtype)
    calls = {
        "compact_into": lambda: dask_compact.compact_into(v, "x < 0.01", out),
        "compact_array": lambda: dask_compact.compact_array(v, "x < 0.01"),
        "scan_array": lambda: dask_compact.scan_array(v),
        "partition_array": lambda: dask_compact.partition_array(v, "x < 0.01"),
        "compact_records": lambda: dask_compact.compact_records({"x": v, "y": v}, "x < 0.01"),
    }
    for name, call in calls.items():
        with device_pool_capped(8 << 20), pytest.raises(MemoryError) as err:
            call()
        assert any("non-contiguous CuPy array" in note and "32.0 MiB" in note
                   for note in getattr(err.value, "__notes__", ())), (name, err.value)
    count = dask_compact.compact_into(v, "x < 0.01", out)
    np.testing.assert_array_equal(cupy.asnumpy(out[: int(count[0])]), h[h < 0.01])
    np.testing.assert_array_equal(cupy.asnumpy(dask_compact.compact_array(v, "x < 0.01")),
                                  h[h < 0.01])
    got = dask_compact.compact_records({"x": v, "y": v}, "x < 0.01")
    np.testing.assert_array_equal(cupy.asnumpy(got["y"]), h[h < 0.01])


@pytest.mark.parametrize("text", [
    "x < np.e", "(x > -np.inf) & (x < np.inf)", "x != np.nan", "x == numpy.nan",
    "maximum(x, np.nan) <= np.pi", "where(isnan(x), np.inf, x) > math.tau",
    "x * 2 < np.e ** 2 - np.euler_gamma", "x > -cupy.inf"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32", "uint8"])
def test_numpy_constants_in_string_predicates_match_numpy_on_the_gpu(text, dtype):
    """NumPy's constants as literals of a string predicate (2026-12-02, sixteenth session):
    the GPU's fused kernel (constants are kernel arguments, never spelled in the CUDA source)
    and the mask path give NumPy's selection, NaN and inf included."""
    import math

    rng = np.random.default_rng(len(text) + len(dtype))
    h = (rng.random(4099) * 8 - 1).astype(dtype)
    if np.dtype(dtype).kind == "f":
        h[::97] = np.nan
        h[1::89] = np.inf
        h[2::83] = -np.inf
    env = {"x": h, "np": np, "numpy": np, "cupy": np, "math": math,
           "maximum": np.maximum, "where": np.where, "isnan": np.isnan}
    with np.errstate(all="ignore"):
        m = eval(text, env)  # the reference: NumPy itself on the same text
    got = dask_compact.compact_array(cupy.asarray(h), text)
    np.testing.assert_array_equal(cupy.asnumpy(got), h[m])
    idx = dask_compact.compact_array(cupy.asarray(h), text, output="indices")
    np.testing.assert_array_equal(cupy.asnumpy(idx), np.flatnonzero(m))


@pytest.mark.parametrize("dtype,t", [
    ("float64", np.float32(0.1)), ("float32", np.float64(0.1)), ("float64", np.float64(np.nan)),
    ("int64", np.int64(-5)), ("uint8", np.uint8(200)), ("float16", np.float16(0.3)),
    ("int32", np.float32(2.5)),
])
@pytest.mark.parametrize("op", ["<", "==", "!="])
def test_a_numpy_scalar_as_numpy_prints_it_matches_numpy_on_the_gpu(dtype, t, op):
    """``x < np.float32(0.1)`` (NumPy 2's repr of a scalar in an f-string, a constant of its
    type since 2026-12-02): the GPU kernel compares as NumPy does with that scalar."""
    rng = np.random.default_rng(len(dtype) + len(op))
    with np.errstate(invalid="ignore"):
        h = np.concatenate([np.array([0.1, float(np.float32(0.1)), 0.3, 2.5, -5, 200, np.nan]),
                            rng.random(4093) * 10 - 5]).astype(dtype)
    text = f"x {op} {t!r}"
    with np.errstate(all="ignore"):
        m = eval(f"h {op} t")
    got = dask_compact.compact_array(cupy.asarray(h), text)
    np.testing.assert_array_equal(cupy.asnumpy(got), h[m])


@pytest.mark.parametrize("dtype", ["bool", "int8", "float32", "uint64"])
@pytest.mark.parametrize("t", [np.True_, np.False_])
@pytest.mark.parametrize("op", ["==", "!=", "<"])
def test_a_numpy_bool_as_numpy_prints_it_matches_numpy_on_the_gpu(dtype, t, op):
    """``x == np.True_`` (NumPy 2's repr of a bool scalar, a constant since 2026-12-02,
    seventeenth session): the GPU kernel compares as NumPy does with it."""
    h = np.random.default_rng(len(dtype) + len(op)).integers(0, 3, 4099).astype(dtype)
    text = f"x {op} {t!r}"
    got = dask_compact.compact_array(cupy.asarray(h), text)
    np.testing.assert_array_equal(cupy.asnumpy(got), h[eval(f"h {op} t")])


DIVMOD_XS = [0.0, -0.0, 1.0, -1.0, 2.5, -2.5, 7.0, -7.0, 0.3, -0.3, 1e30, -1e30, 6e4, 3e-39,
             -3e-39, 5e-324, np.inf, -np.inf, np.nan, 1.7e308]
DIVMOD_DS = [3.0, -3.0, 0.5, -0.5, 0.0, -0.0, np.inf, -np.inf, np.nan, 1e-3, 1e30, 7.0, 3e-39]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_float_remainder_and_floor_divide_match_numpy_at_special_values(dtype):
    """x % d and x // d on floats (NumPy's npy_divmod: the remainder takes the divisor's sign,
    zero and infinite divisors, NaN, signed zeros, subnormals, ratios of 1e30 whose fmod runs
    long) give NumPy's values: each distinct result r is selected by ``x % d == r`` as NumPy
    selects it, its sign by signbit (where the result is not NaN), NaN by isnan. Since
    2026-12-03 (twenty-fourth session) fmod and the divmod are out-of-line device functions
    (inlined per item they made a module 12-20x slower to compile); this checks the values
    stayed. The sign of a NaN result is left out: IEEE leaves it open, x86's NumPy makes
    ``inf % 3`` a negative NaN, and the GPU's float conversions make every NaN positive (this
    test's first GPU run, 2026-12-03, found float16 and float32 differing there and nowhere
    else checked). Every mismatch is collected, so one GPU run shows them all."""
    rng = np.random.default_rng(7)
    bad = []
    with np.errstate(all="ignore"):
        host = np.concatenate([np.array(DIVMOD_XS).astype(dtype),
                               (rng.standard_normal(45) * 50).astype(dtype)])
        dev = cupy.asarray(host)
        for d0 in DIVMOD_DS:
            d = float(np.dtype(dtype).type(d0))  # the divisor as the dtype holds it
            for op, res in (("%", host % d), ("//", host // d)):
                texts = [f"signbit(x {op} {d!r}) & ~isnan(x {op} {d!r})",
                         f"isnan(x {op} {d!r})", f"isinf(x {op} {d!r})"]
                texts += [f"x {op} {d!r} == {float(r)!r}" for r in np.unique(res[~np.isnan(res)])]
                for text in texts:
                    want = np.flatnonzero(eval(text.replace("x", "host"), {  # noqa: S307
                        "host": host, "signbit": np.signbit, "isnan": np.isnan,
                        "isinf": np.isinf, "inf": np.inf, "nan": np.nan}))
                    got = cupy.asnumpy(dask_compact.compact_array(dev, text, output="indices"))
                    if not np.array_equal(got, want):
                        bad.append((text, got.tolist(), want.tolist()))
    assert not bad, (dtype, len(bad), bad[:20])


def _adds_out(v):
    np.add(v, 1, out=v)  # ufunc out=: the tracer stops, the mask path runs it
    return v > 3


def _adds_to_astype(v):
    w = v.astype(v.dtype, copy=False)  # the argument itself
    w += 1
    return w > 3


def _reads_only(v):
    return np.isin(v, cupy.asarray([2.0, 5.0])) | np.isnan(v)


@pytest.mark.parametrize("pred", [_adds_out, _adds_to_astype])
def test_a_mask_path_callable_writing_into_its_cupy_argument_is_refused_and_changes_nothing(pred):
    """CuPy arrays have no read-only flag: a mask-path callable writing into its argument
    changed the caller's CuPy array (or a persisted chunk) silently, where a NumPy one is
    refused (2026-12-06). It now gets a copy, compared after the call: refused, and every
    input as it was (contiguous, a strided view, persisted chunks, record fields)."""
    c = cupy.arange(1.0, 9.0)
    with pytest.raises(ValueError, match="writes into its argument"):
        dask_compact.compact_array(c, pred)
    cupy.testing.assert_array_equal(c, cupy.arange(1.0, 9.0))
    big = cupy.arange(1.0, 17.0)
    with pytest.raises(ValueError, match="writes into its argument"):
        dask_compact.compact_array(big[::2], pred)
    cupy.testing.assert_array_equal(big, cupy.arange(1.0, 17.0))
    x = da.from_array(np.arange(1.0, 9.0), chunks=3).map_blocks(cupy.asarray).persist()
    with pytest.raises(ValueError, match="writes into its argument"):
        x.map_compact(pred)
    cupy.testing.assert_array_equal(x.compute(), cupy.arange(1.0, 9.0))

    def record(mass, energy):
        return pred(mass) & (energy > 0)

    fields = {"mass": cupy.arange(1.0, 9.0), "energy": cupy.ones(8)}
    with pytest.raises(ValueError, match="writes into its argument"):
        dask_compact.compact_records(fields, record)
    cupy.testing.assert_array_equal(fields["mass"], cupy.arange(1.0, 9.0))


def test_a_mask_path_callable_reading_its_cupy_argument_is_not_refused():
    """The comparison is of bytes: NaNs, -0.0 and a strided input are no change."""
    a = np.array([2.0, np.nan, -0.0, 5.0, 7.0, np.nan, 0.0, 2.0] * 5)
    for given in (cupy.asarray(a), cupy.asarray(np.repeat(a, 2))[::2]):
        got = dask_compact.compact_array(given, _reads_only)
        np.testing.assert_array_equal(cupy.asnumpy(got), a[np.isin(a, [2.0, 5.0]) | np.isnan(a)])
    fields = {"mass": cupy.asarray(a), "energy": cupy.ones(a.size)}
    got = dask_compact.compact_records(fields, lambda mass, energy: _reads_only(mass))
    np.testing.assert_array_equal(cupy.asnumpy(got["mass"]),
                                  a[np.isin(a, [2.0, 5.0]) | np.isnan(a)])  # fmt: skip
