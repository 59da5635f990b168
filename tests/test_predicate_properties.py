"""Property tests: random predicates, dtypes and arrays; the fused loop == expr.evaluate ==
the original callable on NumPy arrays, bit for bit (NaN, inf, -0.0 and edge integers included).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dask_compact import compact_records
from dask_compact.backends.numpy_backend import compact
from dask_compact.codegen.numba_loop import UnsupportedPredicate, fused_loop
from dask_compact.codegen.numba_records import record_bits_loop
from dask_compact.predicate.expr import ParamOverflow, evaluate
from dask_compact.predicate.fields import record_predicate
from dask_compact.predicate.parse import parse
from dask_compact.predicate.trace import trace

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float32", "float64", "complex64", "complex128",
]  # fmt: skip
UNARY = [
    "negative", "positive", "absolute", "square", "sqrt", "floor", "ceil", "trunc", "rint",
    "sign", "invert", "isnan", "isfinite", "isinf", "signbit", "logical_not", "real", "imag",
]  # fmt: skip
BINARY = [
    "add", "subtract", "multiply", "true_divide", "floor_divide", "remainder", "minimum",
    "maximum", "fmin", "fmax", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift",
    "right_shift", "power", "logical_and", "logical_or", "logical_xor",
]  # fmt: skip
COMPARE = ["less", "less_equal", "greater", "greater_equal", "equal", "not_equal"]
SETTINGS = settings(max_examples=35, deadline=None, suppress_health_check=[HealthCheck.too_slow])

weak_constants = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([0.0, -0.0, 0.5, -1.5, 2.0, float("nan"), float("inf"), -float("inf")]),
)


def strong_constant(dtype: str) -> st.SearchStrategy:
    return hnp.from_dtype(np.dtype(dtype)).map(lambda v: np.dtype(dtype).type(v))


def recipes(dtype: str) -> st.SearchStrategy:
    """Random expression recipes: ("x",), ("c", value) or (fn, *children)."""
    leaf = st.one_of(
        st.just(("x",)),
        st.just(("x",)),
        weak_constants.map(lambda v: ("c", v)),
        strong_constant(dtype).map(lambda v: ("c", v)),
    )

    def extend(children: st.SearchStrategy) -> st.SearchStrategy:
        return st.one_of(
            st.tuples(st.sampled_from(UNARY), children),
            st.tuples(st.sampled_from(BINARY + COMPARE), children, children),
            st.tuples(
                st.just("where"),
                st.tuples(st.sampled_from(COMPARE), children, children),
                children,
                children,
            ),
        )

    inner = st.recursive(leaf, extend, max_leaves=5)
    top = st.one_of(
        st.tuples(st.sampled_from(COMPARE), inner, leaf),
        st.tuples(st.sampled_from(["isnan", "isfinite", "signbit"]), inner),
        st.tuples(st.sampled_from(["logical_and", "logical_or"]),
                  st.tuples(st.sampled_from(COMPARE), inner, leaf),
                  st.tuples(st.just("isinf"), inner)),
    )  # fmt: skip
    return top


def build(recipe: tuple):
    """A plain NumPy callable computing the recipe (what a user would write)."""

    def f(v):
        def ev(r):
            if r[0] == "x":
                return v
            if r[0] == "c":
                return r[1]
            args = [ev(c) for c in r[1:]]
            if r[0] in ("real", "imag", "where"):
                return getattr(np, r[0])(*args)
            return getattr(np, r[0])(*args)

        return ev(recipe)

    return f


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


@st.composite
def cases(draw):
    dtype = draw(st.sampled_from(DTYPES))
    recipe = draw(recipes(dtype))
    elements = hnp.from_dtype(np.dtype(dtype))
    a = draw(hnp.arrays(np.dtype(dtype), st.integers(0, 140), elements=elements))
    return dtype, recipe, a


@SETTINGS
@given(cases())
def test_loop_equals_evaluate_equals_callable(case):
    _dtype, recipe, a = case
    f = build(recipe)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            expected = f(a)
        except (TypeError, ValueError, OverflowError, ZeroDivisionError):
            assume(False)
        assume(getattr(expected, "dtype", None) == np.dtype(bool) and expected.shape == a.shape)
        pred = trace(f)
        assert pred.path == "fused", pred.reason
        via_tree = evaluate(pred.expr, a, pred.params)
        assert np.array_equal(via_tree, expected)
        try:
            tp = pred.typed(a.dtype)
            params = tp.bind(pred.params)
            loop = fused_loop(tp, "both")
        except (UnsupportedPredicate, ParamOverflow):
            loop = None
        if loop is not None:
            out = np.empty(a.size, a.dtype)
            idx = np.empty(a.size, np.int64)
            k = loop(a, out, idx, 7, params)
            assert np.array_equal(idx[:k], np.flatnonzero(expected) + 7)
            assert _bits(out[:k]) == _bits(a[expected])
        # the backend, whichever path it takes, gives NumPy's answer
        values, indices = compact(a, pred, "both", True, None, 0)
        assert _bits(values) == _bits(a[expected])
        assert np.array_equal(indices, np.flatnonzero(expected))


SIMPLE = st.sampled_from(
    [
        ("(x > {0}) & (x < {1})", lambda v, s, t: (v > s) & (v < t)),
        ("{0} < x", lambda v, s, t: s < v),
        ("(abs(x - {0}) <= {1}) | isnan(x)", lambda v, s, t: (np.abs(v - s) <= t) | np.isnan(v)),
        ("~(x >= {0}) ^ (x == {1})", lambda v, s, t: ~(v >= s) ^ (v == t)),
        ("where(x > {0}, x, -x) < {1}", lambda v, s, t: np.where(v > s, v, -v) < t),
        ("(x * 2 + {0}) // 3 != {1}", lambda v, s, t: (v * 2 + s) // 3 != t),
    ]
)


@settings(max_examples=60, deadline=None)
@given(
    SIMPLE,
    st.floats(-3, 3, allow_nan=False).map(lambda f: round(f, 2)),
    st.floats(-3, 3, allow_nan=False).map(lambda f: round(f, 2)),
)
def test_parse_and_trace_build_the_same_tree(case, s, t):
    text, fn = case
    traced = trace(lambda v: fn(v, s, t))
    parsed = parse(text.format(repr(s), repr(t)))
    assert parsed.expr == traced.expr
    assert parsed.params == traced.params


def _integer_edge_predicates(dtype: str) -> list:
    signed = np.dtype(dtype).kind == "i"
    return [
        lambda v: v // 3 > 1,
        (lambda v: v // -1 < 0) if signed else (lambda v: v // 7 < 3),
        lambda v: np.floor_divide(7, v) > 0,
        lambda v: np.remainder(5, v) == 0,
        lambda v: (v << 3) > 5,
        lambda v: np.left_shift(1, v) > 2,
        (lambda v: np.right_shift(-64, v) == 0) if signed else
        (lambda v: np.right_shift(64, v) == 0),
        lambda v: v * v > 3,
        lambda v: np.power(v, 3) < 0,
        lambda v: -v > 1,
        lambda v: np.abs(v) > 2,
        lambda v: (v + 100) < v,
    ]


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint64"])
def test_integer_edges_division_shifts_power(dtype):
    info = np.iinfo(dtype)
    edge = [info.min, info.min + 1, -1, 0, 1, 2, 7, info.max - 1, info.max]
    a = np.array([e for e in edge if info.min <= e <= info.max] * 3, dtype=dtype)
    rng = np.random.default_rng(3)
    a = np.concatenate([a, rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)])
    with np.errstate(all="ignore"):
        for f in _integer_edge_predicates(dtype):
            pred = trace(f)
            assert pred.path == "fused", pred.reason
            expected = f(a)
            vals, idx = compact(a, pred, "both", True, None, 0)
            assert np.array_equal(idx, np.flatnonzero(expected)), pred
            assert np.array_equal(vals, a[expected])
            tp = pred.typed(a.dtype)
            fused_loop(tp, "both")  # compiled, not refused, for every one of these


def test_mixed_int64_uint64_comparison_is_exact():
    a = np.array([-1, 0, 2**62, -(2**63), 2**63 - 1], dtype=np.int64)
    big = np.uint64(2**64 - 1)
    for f in (lambda v: v < big, lambda v: v >= np.uint64(2**63), lambda v: v != big):
        pred = trace(f)
        assert np.array_equal(compact(a, pred, "indices", True, None, 0), np.flatnonzero(f(a)))
        fused_loop(pred.typed(a.dtype), "indices")


FLOAT_SPECIALS = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, np.inf, -np.inf, np.nan, -np.nan, 1e-310, 3.0]


def _float_special_predicates(ycast) -> list:
    return [
        lambda v: np.signbit(v // ycast),
        lambda v: np.isnan(v // ycast),
        lambda v: np.signbit(v % ycast),
        lambda v: (v % ycast) > 0.5,
        lambda v: np.signbit(np.maximum(v, ycast)),
        lambda v: np.signbit(np.minimum(ycast, v)),
        lambda v: np.signbit(np.fmax(v, ycast)),
        lambda v: np.isnan(np.fmin(v, ycast)),
        lambda v: np.signbit(np.sign(v)),
        lambda v: np.signbit(v / ycast),
        lambda v: np.signbit(np.sqrt(v)),
        lambda v: np.signbit(np.rint(v * ycast)),
    ]


def test_float_special_values_division_and_minmax():
    specials = FLOAT_SPECIALS
    for dt in ("float32", "float64"):
        a = np.array(specials, dt)
        grid = np.repeat(a, len(a)), np.tile(a, len(a))
        x = grid[0]
        ys = grid[1]
        for y in specials:
            with np.errstate(all="ignore"):
                for f in _float_special_predicates(np.dtype(dt).type(y)):
                    pred = trace(f)
                    got = compact(x, pred, "indices", True, None, 0)
                    assert np.array_equal(got, np.flatnonzero(f(x))), (dt, y, pred)
        assert ys.size == x.size


def numba_ahead_loops(test_name: str, params: dict) -> list | None:
    """The loops the tests of fixed predicates below build, for tests/numba_ahead.py to
    build in the background first (they take most of this file's time: a compile each)."""
    if test_name == "test_integer_edges_division_shifts_power":
        dtype = np.dtype(params["dtype"])
        return [(trace(f).typed(dtype), "both") for f in _integer_edge_predicates(dtype.name)]
    if test_name == "test_float_special_values_division_and_minmax":
        # the constant is a parameter of the loop: one loop per predicate and dtype
        return [(trace(f).typed(np.dtype(dt)), "indices")
                for dt in ("float32", "float64")
                for f in _float_special_predicates(np.dtype(dt).type(FLOAT_SPECIALS[2]))]
    return None


@pytest.mark.parametrize("dt", ["float32", "float64"])
def test_float_floor_division_and_remainder_run_in_the_loop(dt):
    """Float ``//`` and ``%`` compile into the fused loop (NumPy's npy_divmod spelled out) and
    give NumPy's answers bit for bit, special values included. Until 2026-12-01 (fifteenth
    session, a mixed-dtype probe) the helpers called ``math.fmod``, which numba does not
    compile: every float floor division or remainder (``x % 1.0 == 0``, and an int divided by
    a float, a mixed int64/uint64 ``//``) took the mask path, the helpers never ran."""
    a = np.array(FLOAT_SPECIALS + [7.0, -7.0, 2.5, 1e300, -3e-320, 5.5], dt)
    x, y = np.repeat(a, a.size), np.tile(a, a.size)
    for f in (lambda v, w: np.signbit(v // w), lambda v, w: (v // w) > 1,
              lambda v, w: np.isnan(v % w), lambda v, w: np.signbit(v % w),
              lambda v, w: (v % w) > 0.5, lambda v, w: (v // w) == (v % w)):
        with np.errstate(all="ignore"):
            want = f(x, y)
        pred = compact_records({"v": x, "w": y}, f, indices=True)["indices"]
        assert np.array_equal(pred, np.flatnonzero(want))
        tp = record_predicate(f, ("v", "w")).typed({"v": x.dtype, "w": y.dtype})
        record_bits_loop(tp)  # compiled, not refused
    for w in (2.5, -0.0, np.inf, -7.0):
        for f in (lambda v: np.signbit(v // w), lambda v: (v % w) == 0):
            with np.errstate(all="ignore"):
                want = f(x)
            fused_loop(trace(f).typed(x.dtype), "both")  # compiled, not refused
            got, idx = compact(x, trace(f), "both", True, None, 0)
            assert _bits(got) == _bits(x[want]) and np.array_equal(idx, np.flatnonzero(want))
