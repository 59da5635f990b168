"""The long device functions a predicate may call, checked against NumPy on the GPU: integer
``//`` and ``%`` at every width (64-bit division is a long software sequence), and the float
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
    wide = rng.integers(info.min, info.max, 2000, dtype=dtype, endpoint=True)
    small = rng.integers(max(info.min, -300), min(info.max, 300), 1031, dtype=dtype)
    return np.concatenate([np.array(edges, dtype=dtype), wide, small])


def _divisors(dtype: str) -> list[int]:
    info = np.iinfo(dtype)
    ds = [7, 1, 2, 0, int(info.max), int(info.max) // 3 + 1]
    if info.min < 0:
        ds += [-3, -1, int(info.min), int(info.min) // 5]
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
