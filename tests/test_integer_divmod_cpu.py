"""Integer ``//`` and ``%`` in the CPU loop against NumPy, value by value.

The loop divides integers through a float (float32 for 1- and 2-byte types, double for the
rest, where both operands are under 2^53 in magnitude: ``numba_loop.divmod_helper``), and by
the integer instruction beyond; 1- to 4-byte types take b = -1 the float way too (MIN // -1
wrapped to MIN). Both sides of that line are checked at every integer width: int8 and uint8
at every pair of operands, wider types at their extremes, at 2^53 and its neighbours, and at
random values, each quotient and remainder compared with NumPy's through a record predicate
over the operands and NumPy's results (``a // b != q`` must select no row; a result one off
must select every row). A property test draws arrays and divisors for the one-array
predicate.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dask_compact import compact_array, compact_records

INTS = ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]
P53 = 2**53


def _edges(dtype: str) -> list[int]:
    info = np.iinfo(dtype)
    vals = {0, 1, 2, 3, 7, 10, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32,
            P53 - 1, P53, P53 + 1, P53 + 2, 2**62, int(info.max), int(info.max) - 1,
            int(info.max) // 3 + 1}
    if info.min < 0:
        vals |= {-v for v in vals} | {int(info.min), int(info.min) + 1}
    return sorted(v for v in vals if info.min <= v <= info.max)


def _operands(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Every pair for the 8-bit types; else the edges crossed with themselves, and random
    pairs over the whole range and under 2^53."""
    info = np.iinfo(dtype)
    if info.bits == 8:
        v = np.arange(info.min, info.max + 1, dtype=dtype)
        return np.repeat(v, v.size), np.tile(v, v.size)
    e = np.array(_edges(dtype), dtype=dtype)
    rng = np.random.default_rng(info.bits)
    wide = rng.integers(info.min, info.max, 20000, dtype=dtype, endpoint=True)
    lo, hi = max(int(info.min), -P53), min(int(info.max), P53)
    near = rng.integers(lo, hi, 20000, dtype=dtype, endpoint=True)
    small = rng.integers(max(int(info.min), -1000), 1000, 20000, dtype=dtype)
    a = np.concatenate([np.repeat(e, e.size), wide, near, wide, e.repeat(7)[:20000]])
    b = np.concatenate([np.tile(e, e.size), small, small, wide, np.resize(e, 7 * e.size)[:20000]])
    return a[: b.size], b[: a.size]


@pytest.mark.parametrize("dtype", INTS)
def test_quotients_and_remainders_match_numpy_value_by_value(dtype: str) -> None:
    a, b = _operands(dtype)
    with np.errstate(all="ignore"):
        q, r = a // b, a % b
    fields = {"a": a, "b": b, "q": q, "r": r}
    wrong = compact_records(fields, "(a // b != q) | (a % b != r)", indices=True)
    bad = wrong["indices"]
    assert bad.size == 0, [(a[i], b[i], q[i], r[i]) for i in bad[:10]]
    # the check can fail: results one off differ at every row
    off = compact_records({**fields, "q": q + np.array(1, dtype=dtype)}, "a // b != q",
                          indices=True)
    assert off["indices"].size == a.size


@settings(max_examples=120, deadline=None)
@given(
    dtype=st.sampled_from(INTS),
    data=st.data(),
)
def test_one_array_divisions_by_a_constant_match_numpy(dtype: str, data: st.DataObject) -> None:
    info = np.iinfo(dtype)
    near = st.integers(max(int(info.min), -P53 - 4), min(int(info.max), P53 + 4))
    full = st.integers(int(info.min), int(info.max))
    x = data.draw(hnp.arrays(dtype, st.integers(0, 300), elements=st.one_of(full, near)))
    d = data.draw(st.one_of(st.sampled_from(_edges(dtype)), full, near))
    op = data.draw(st.sampled_from(["//", "%"]))
    divisor = np.dtype(dtype).type(d)
    with np.errstate(all="ignore"):
        res = x // divisor if op == "//" else x % divisor
    if res.size:
        pick = res[data.draw(st.integers(0, res.size - 1))]
        text = f"x {op} {d} == {int(pick)}"
        want = x[res == pick]
        with np.errstate(all="ignore"):
            got = compact_array(x, text)
        assert np.array_equal(got, want), (text, x, got, want)
