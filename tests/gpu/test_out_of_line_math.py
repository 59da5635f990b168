"""The long device functions a predicate may call, checked against NumPy on the GPU: integer
``//`` and ``%`` at every width (64-bit operands past 32 bits go through a double
reciprocal and two corrections, every bit of the results checked), and the float
transcendentals and powers (``exp``, ``log``, ``log2``, ``log10``, ``sin``, ``cos``, ``tan``,
``**``, computed through double). ``pow`` is an out-of-line device function, as ``fmod`` is,
so that NVRTC compiles it once per module, not once per unrolled item; the others stay inline
(out of line they ran slower per call). Any of them moved in or out keeps these checks."""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

import dask_compact  # noqa: E402

pytestmark = pytest.mark.gpu

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def _int_data(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(11)
    edges = [info.min, info.min + 1, info.max, info.max - 1, 0, 1, 2, 6, 7, 8, 13, 14]
    if info.min < 0:
        edges += [-1, -2, -6, -7, -8, -13, -14]
    if info.bits == 64:  # each side of the 32-bit fast path's bounds (npy_ops.cuh fits_half)
        edges += [2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1]
        if info.min < 0:
            edges += [-(2**31), -(2**31) - 1, -(2**32)]
    wide = rng.integers(info.min, info.max, 2000, dtype=dtype, endpoint=True)
    small = rng.integers(max(info.min, -300), min(info.max, 300), 1031, dtype=dtype)
    return np.concatenate([np.array(edges, dtype=dtype), wide, small])


def _divisors(dtype: str) -> list[int]:
    info = np.iinfo(dtype)
    ds = [7, 1, 2, 0, int(info.max), int(info.max) // 3 + 1]
    if info.min < 0:
        ds += [-3, -1, int(info.min), int(info.min) // 5]
    if info.bits == 64:
        ds += [2**31 - 1, 2**31, 2**32 + 3] + ([-(2**31), -(2**31) - 1] if info.min < 0 else [])
    return ds


@pytest.mark.parametrize("dtype", INTS)
def test_integer_floor_divide_and_remainder_match_numpy(dtype):
    """``x // d`` and ``x % d`` at every integer width: extremes of the dtype, the most
    negative value by -1, zero divisors (NumPy's 0), divisors of both signs and of full
    width; each result selected by ``== r`` (a sample of distinct results, the smallest and
    largest among them) and ``< median``, as NumPy selects it. Every mismatch is collected."""
    host = _int_data(dtype)
    dev = cupy.asarray(host)
    rng = np.random.default_rng(5)
    bad = []
    with np.errstate(all="ignore"):
        for d in _divisors(dtype):
            for op, res in (("//", host // host.dtype.type(d)), ("%", host % host.dtype.type(d))):
                values = np.unique(res)
                mid = values[len(values) // 2]
                picks = {values[0], values[-1], mid}
                picks.update(rng.choice(values, size=min(5, len(values)), replace=False))
                tests = [(f"x {op} {d} == {int(r)}", res == r) for r in sorted(picks)]
                tests.append((f"x {op} {d} < {int(mid)}", res < mid))
                for text, mask in tests:
                    got = cupy.asnumpy(dask_compact.compact_array(dev, text, output="indices"))
                    if not np.array_equal(got, np.flatnonzero(mask)):
                        bad.append((text, got.size, int(mask.sum())))
    assert not bad, (dtype, len(bad), bad[:20])


# 64-bit divisors of every magnitude: each side of 2^32 (the 32-bit path's bound), 2^52-2^53
# (where the double reciprocal stops being exact), 2^62-2^63 (the unsigned quotient's 0-or-1
# range); the most negative and the largest. 49, 98 and 103: k * d times the rounded 1 / d
# falls below k (49 * fl(1 / 49) < 1), the case divmod64's last correction is for
DIVISORS_64 = {
    "int64": [1, 3, 7, -7, 49, -98, 1000, -(2**31) - 1, 2**32 + 3, 2**52 - 1, 2**52 + 1,
              -(2**53) - 7, 2**62 + 11, -(2**62), 2**63 - 1, -(2**63), 123456789012345],
    "uint64": [1, 3, 7, 49, 103, 1000, 2**32 + 3, 2**52 - 1, 2**53 + 1, 2**62 + 11, 2**63 - 1,
               2**63, 2**63 + 5, 2**64 - 1, 123456789012345],
}


def _near_multiples(dtype: str, d: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """q * d + e for e in -2..2 and random q, wrapped to the dtype: where a quotient off by
    one would show."""
    info = np.iinfo(dtype)
    lo, hi = info.min // abs(d), info.max // abs(d)
    qs = [int(q) for q in rng.integers(lo, hi, n, dtype=dtype, endpoint=True)] + [lo, hi, 0, 1, -1]
    vals = [q * d + e for q in qs for e in (-2, -1, 0, 1, 2)]
    return np.array([v % 2**64 for v in vals], dtype=np.uint64).view(dtype)


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_64bit_floor_divide_and_remainder_every_bit(dtype):
    """Every bit of ``x // d`` and ``x % d`` of 64-bit types, on full-range random values,
    the dtype's edges and values near multiples of d, for divisors of every magnitude (the
    paths past 32 bits: npy_ops.cuh divmod64): ``(x // d) >> k & 1 == 1`` selects what
    NumPy's selects, k = 0..63. Every mismatch is collected."""
    rng = np.random.default_rng(29)
    base = _int_data(dtype)
    bad = []
    with np.errstate(all="ignore"):
        for d in DIVISORS_64[dtype]:
            host = np.concatenate([base, _near_multiples(dtype, d, 400, rng)])
            dev = cupy.asarray(host)
            for op, res in (("//", host // host.dtype.type(d)), ("%", host % host.dtype.type(d))):
                for k in range(64):
                    want = np.flatnonzero((res >> host.dtype.type(k)) & 1 == 1)
                    text = f"(x {op} {d}) >> {k} & 1 == 1"
                    got = cupy.asnumpy(dask_compact.compact_array(dev, text, output="indices"))
                    if not np.array_equal(got, want):
                        diff = np.setxor1d(got, want)
                        bad.append((text, host[diff[:3]].tolist()))
    assert not bad, (dtype, len(bad), bad[:20])


FLOAT_TEXTS = {
    "exp(x) < 2": lambda v: np.exp(v) < 2,
    "log(x) < 1.5": lambda v: np.log(v) < 1.5,
    "log2(x) > 1": lambda v: np.log2(v) > 1,
    "log10(x) > 0.25": lambda v: np.log10(v) > 0.25,
    "sin(x) < 0.5": lambda v: np.sin(v) < 0.5,
    "cos(x) > 0.2": lambda v: np.cos(v) > 0.2,
    "tan(x) > 1": lambda v: np.tan(v) > 1,
    "x ** 1.5 < 3": lambda v: v ** v.dtype.type(1.5) < 3,
    "x ** x > 2": lambda v: v ** v > 2,
    "isnan(exp(x) - exp(x))": lambda v: np.isnan(np.exp(v) - np.exp(v)),
}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_float_transcendentals_and_powers_match_numpy(dtype):
    """The out-of-line double functions at every float width, on random values and on 0, -0,
    inf, -inf, NaN, a subnormal and the dtype's largest value: each predicate selects what
    NumPy's selects. Every mismatch is collected."""
    info = np.finfo(dtype)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, float(info.tiny) / 4, float(info.max),
                1.0, -1.0, 2.0, 0.5]
    rng = np.random.default_rng(13)
    host = np.concatenate([np.array(specials, dtype=dtype),
                           (rng.standard_normal(2039) * 3).astype(dtype)])
    dev = cupy.asarray(host)
    bad = []
    with np.errstate(all="ignore"):
        for text, numpy_pred in FLOAT_TEXTS.items():
            want = np.flatnonzero(numpy_pred(host))
            got = cupy.asnumpy(dask_compact.compact_array(dev, text, output="indices"))
            if not np.array_equal(got, want):
                diff = np.setxor1d(got, want)
                bad.append((text, host[diff[:5]].tolist()))
    assert not bad, (dtype, len(bad), bad)


# sizes around the multiples of the divmod shape's tile (256 x 16 = 4096 elements) and of the
# table's (256 x 32 = 8192), a prime, and many tiles
TILE_SIZES = [0, 1, 31, 4093, 4095, 4096, 4097, 8191, 8192, 8193, 3 * 4096 + 17, 2**20 + 7]
# text -> whether it calls NumPy's float divmod (DIVMOD_TABLE's shape on 8-byte types)
FLOAT64_CALLS = {"x % 5 == 1": True, "x // 7 == 2": True, "x % 0.75 < 0.25": True,
                 "(x // 3 == 0) | (x < -60)": True, "x ** 1.5 < 3": False, "x < 0.5": False}


@pytest.mark.parametrize("text", list(FLOAT64_CALLS))
def test_float64_tile_shapes_by_call_match_numpy(text):
    """float64 predicates that call NumPy's float divmod run the single-pass kernels at
    ``cupy_tuning.DIVMOD_TABLE``'s shape and the others (``**``'s out-of-line pow too) at
    TABLE's (the plan says so), and every output, stable or not and through
    ``compact_into``, matches NumPy at sizes around both shapes' tile multiples, with NaN,
    infinities and -0.0 in the data. Every mismatch is collected."""
    from dask_compact.backends import cupy_exact, cupy_modules, cupy_tuning
    from dask_compact.predicate import as_predicate

    cc = cupy_modules.device_cc()
    probe = cupy.zeros(8, "float64")
    spec = cupy_exact.make_plan(probe, as_predicate(text), None, "values", "single-pass").spec
    divmod_shape = cupy_tuning.tuning_for("single-pass", 8, cc, float_divmod=True)
    table_shape = cupy_tuning.tuning_for("single-pass", 8, cc)
    assert spec.tuning == (divmod_shape if FLOAT64_CALLS[text] else table_shape)
    if cc == cupy_tuning.MEASURED_ON:
        assert divmod_shape != table_shape

    rng = np.random.default_rng(17)
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 5.0, -5.0, 1.0, 6.0, 14.0])
    bad = []
    for n in TILE_SIZES:
        host = rng.standard_normal(n) * 50
        host[rng.integers(0, max(n, 1), min(n, 40))] = rng.choice(specials, min(n, 40))
        dev = cupy.asarray(host)
        with np.errstate(all="ignore"):
            mask = eval(text, {"x": host})  # noqa: S307 - the test's own texts
        want_v, want_i = host[mask], np.flatnonzero(mask)
        for stable in (True, False):
            for alg in ("auto", "single-pass"):
                v, i = dask_compact.compact_array(dev, text, output="both", stable=stable,
                                                  algorithm=alg)
                v, i = cupy.asnumpy(v), cupy.asnumpy(i)
                if not stable:
                    order = np.argsort(i)
                    v, i = v[order], i[order]
                if not (np.array_equal(v, want_v, equal_nan=True)
                        and np.array_equal(i, want_i)):
                    bad.append((n, stable, alg, "both", len(i), len(want_i)))
        out = cupy.full(n, 7.0)
        count = int(dask_compact.compact_into(dev, text, out)[0])
        if not np.array_equal(cupy.asnumpy(out[:count]), want_v, equal_nan=True):
            bad.append((n, "compact_into", count, len(want_v)))
    assert not bad, (text, bad)
