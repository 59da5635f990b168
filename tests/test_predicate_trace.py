"""Tracing callables into expression trees: operators, ufuncs, parameters, refusals, fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from dask_compact.predicate import as_predicate
from dask_compact.predicate.expr import Call, Param, Var, evaluate, structure_key
from dask_compact.predicate.trace import NotElementwise, trace

X = Var()
RNG = np.random.default_rng(11)
DATA = {
    "float64": np.concatenate([RNG.normal(size=200), [np.nan, np.inf, -np.inf, -0.0, 0.0]]),
    "float32": RNG.normal(size=205).astype(np.float32),
    "int16": RNG.integers(-300, 300, 205).astype(np.int16),
    "uint8": RNG.integers(0, 256, 205).astype(np.uint8),
    "complex128": RNG.normal(size=205) + 1j * RNG.normal(size=205),
}


def test_operators_map_to_numpy_ufuncs():
    p = trace(lambda v: (v > 0.2) & (v < 0.3))
    assert p.path == "fused"
    assert p.expr == Call(
        "bitwise_and",
        (Call("greater", (X, Param(0, "float"))), Call("less", (X, Param(1, "float")))),
    )
    assert p.params == (0.2, 0.3)


@pytest.mark.parametrize(
    "f, fn",
    [
        (lambda v: v + 1 > 0, "add"), (lambda v: 1 - v > 0, "subtract"),
        (lambda v: v * 2 > 0, "multiply"), (lambda v: 1 / v > 0, "true_divide"),
        (lambda v: v // 2 > 0, "floor_divide"), (lambda v: v % 2 > 0, "remainder"),
        (lambda v: 2 ** v > 0, "power"), (lambda v: v ** 3 > 0, "power"),
        (lambda v: v ** 2 > 0, "square"), (lambda v: -v > 0, "negative"),
        (lambda v: +v > 0, "positive"), (lambda v: abs(v) > 0, "absolute"),
        (lambda v: (v << 1) > 0, "left_shift"), (lambda v: (v >> 1) > 0, "right_shift"),
        (lambda v: (v | 1) > 0, "bitwise_or"), (lambda v: (v ^ 1) > 0, "bitwise_xor"),
        (lambda v: ~v > 0, "invert"), (lambda v: np.sqrt(v) > 0, "sqrt"),
        (lambda v: np.minimum(v, 1) > 0, "minimum"), (lambda v: np.divide(v, 3) > 0, "true_divide"),
        (lambda v: np.mod(v, 3) > 0, "remainder"), (lambda v: np.abs(v) > 0, "absolute"),
        (lambda v: np.real(v) > 0, "real"), (lambda v: v.imag > 0, "imag"),
    ],
)  # fmt: skip
def test_each_operation_traces(f, fn):
    p = trace(f)
    assert p.path == "fused", p.reason
    assert p.expr.fn == "greater"
    assert p.expr.args[0].fn == fn


def test_reflected_comparison_and_numpy_scalar_constants():
    p = trace(lambda v: 0.2 < v)
    assert p.expr == Call("greater", (X, Param(0, "float")))
    q = trace(lambda v: np.float32(0.2) < v)  # NumPy scalars dispatch through __array_ufunc__
    assert q.expr == Call("less", (Param(0, "float32"), X))
    assert q.params == (np.float32(0.2),)
    r = trace(lambda v: v == True)
    assert r.expr == Call("equal", (X, Param(0, "bool")))


def test_new_threshold_same_structure():
    a, b = trace(lambda v: (v > 0.1) & (v < 0.9)), trace(lambda v: (v > 0.4) & (v < 0.5))
    assert structure_key(a.expr) == structure_key(b.expr)
    assert a.params != b.params
    c = trace(lambda v: v > 1)  # int literal: another kind, another structure
    assert structure_key(c.expr) != structure_key(trace(lambda v: v > 1.0).expr)


def test_where_real_imag_and_ufuncs():
    f = lambda v: np.where(np.isnan(v), 0.0, np.abs(v)) > np.float64(1.5)
    p = trace(f)
    assert p.path == "fused"
    assert p.expr.args[0].fn == "where"
    a = DATA["float64"]
    assert np.array_equal(evaluate(p.expr, a, p.params), f(a))


@pytest.mark.parametrize("dtype", sorted(DATA))
@pytest.mark.parametrize(
    "f",
    [
        lambda v: (v.real > 0.2) & (v.real < 1),
        lambda v: np.isfinite(v) | (v == 0),
        lambda v: np.logical_not(v.real >= 3) ^ (v.real < -1),
        lambda v: np.maximum(v.real, 0.5) > 0.7,
        lambda v: np.where(v.real > 0, v.real, -v.real) * 3 - 1 <= 2,
        lambda v: np.sign(v.real) == np.float32(-1),
    ],
)
def test_evaluate_equals_callable(dtype, f):
    a = DATA[dtype]
    p = trace(f)
    assert p.path == "fused", p.reason
    with np.errstate(all="ignore"):
        assert np.array_equal(evaluate(p.expr, a, p.params), f(a))
        assert np.array_equal(p.mask(a), f(a))


@pytest.mark.parametrize(
    "f",
    [
        lambda v: v > v.mean(), lambda v: v > np.median(v), lambda v: v < v.max(),
        lambda v: v > np.percentile(v, 90), lambda v: v > np.add.reduce(v),
        lambda v: v > v.std() * 2, lambda v: v.sum() > 0, lambda v: v > np.nanmean(v),
    ],
)  # fmt: skip
def test_reductions_are_refused(f):
    with pytest.raises(ValueError, match="reduc.*each chunk separately.*compute"):
        trace(f)
    with pytest.raises(ValueError):
        as_predicate(f)


@pytest.mark.parametrize(
    "f",
    [
        lambda v: v[1:] > 0, lambda v: v[...] > 0, lambda v: v.reshape(-1) > 0, lambda v: v.T > 0,
        lambda v: np.sort(v) > 0, lambda v: np.diff(v) > 0, lambda v: np.roll(v, 1) > 0,
        lambda v: np.cumsum(v) > 0, lambda v: np.convolve(v, [1, 1]) > 0, lambda v: len(v) > 3,
        lambda v: [e > 0 for e in v], lambda v: np.add.accumulate(v) > 0, lambda v: v @ v > 0,
    ],
)  # fmt: skip
def test_non_elementwise_is_refused(f):
    with pytest.raises(ValueError, match="not elementwise"):
        trace(f)


def test_refusal_survives_user_except():
    def f(v):
        try:
            m = v.mean()
        except Exception:  # noqa: BLE001 - user code that swallows errors
            m = 0
        return v > m

    with pytest.raises(NotElementwise):
        trace(f)


@pytest.mark.parametrize(
    "f, reason",
    [
        (lambda v: np.isin(v, [1.0, 2.0]), "np.isin"),
        (lambda v: np.arctan2(v, 1.0) > 0, "np.arctan2"),
        (lambda v: np.add(v, 1, where=True) > 0, "where="),
        (lambda v: v.astype(int) > 0, "astype"),
        (lambda v: v > None, "None"),
        (lambda v: v > np.ones(3), "array of shape"),
        (lambda v: 1 / 0 > v, "ZeroDivisionError"),
    ],
)
def test_untraceable_falls_back_to_mask_path(f, reason):
    p = trace(f)
    assert p.path == "mask"
    assert p.expr is None and p.func is f
    assert reason in p.reason
    assert reason in repr(p)


def test_mask_path_is_correct():
    a = DATA["float64"]
    f = lambda v: np.isin(np.round(v), [0.0, 1.0])
    p = trace(f)
    assert p.path == "mask"
    assert np.array_equal(p.mask(a), f(a))


def test_swallowed_untraceable_still_mask_path():
    def f(v):
        try:
            return v.astype(int) > 1
        except Exception:  # noqa: BLE001, S110 - user code that swallows errors
            pass
        return v > 2

    assert trace(f).path == "mask"


@pytest.mark.parametrize(
    "f",
    [
        lambda v: v > 1 and v < 3,
        lambda v: (v > 0) if v else (v < 0),
        lambda v: 0.2 < v < 0.3,
        lambda v: float(v) > 1,
        lambda v: v > int(v),
        lambda v: v > np.asarray(v).mean(),
        lambda v: v > np.array(v)[0],
        lambda v: v > v.size,
        lambda v: v > v.shape[0],
        lambda v: v > np.size(v),
        lambda v: v > v.nbytes,
        lambda v: v > np.linalg.norm(v),
        lambda v: v > float(np.mean(np.asarray(v))),
        lambda v: v > np.nanpercentile(np.asarray(v), 50),
    ],
)
def test_materialising_the_chunk_is_refused(f):
    """Anything that turns the chunk into data (its values as an array, a scalar, its size)
    would be computed per chunk: refused like a reduction, never the mask path."""
    with pytest.raises(NotElementwise, match="refused|reduction|truth value"):
        trace(f)


def test_swallowed_refusal_is_still_refused():
    def f(v):
        try:
            m = float(np.asarray(v).mean())
        except Exception:  # noqa: BLE001 - user code that swallows errors
            m = 0.0
        return v > m

    with pytest.raises(NotElementwise):
        trace(f)


def test_constant_results_select_all_or_nothing():
    for value in (True, False, np.True_):
        p = trace(lambda v, value=value: value)
        assert p.path == "fused"
        a = DATA["float32"]
        assert np.array_equal(p.mask(a), np.full(a.shape, bool(value)))
    assert trace(lambda v: "yes").path == "mask"


def test_ufunc_as_predicate_and_source():
    p = trace(np.isnan)
    assert p.expr == Call("isnan", (X,))
    assert p.source == "isnan"
    q = trace(lambda v: v > 0.5)
    assert q.source == "lambda v: v > 0.5"

    def named(v):
        return v > 1

    assert trace(named).source.endswith("named")


def test_dask_array_inside_predicate_is_refused():
    da = pytest.importorskip("dask.array")
    m = da.ones(10, chunks=5).mean()
    with pytest.raises(ValueError, match="compute"):
        trace(lambda v: v > m)


class _RefusesHugeInts:
    """NumPy, but like CuPy refusing a Python int outside int64/uint64 in a ufunc call."""

    def __getattr__(self, name):
        f = getattr(np, name)

        def call(*args, **kwargs):
            for a in args:
                if isinstance(a, int) and not -(2**63) <= a < 2**64:
                    raise OverflowError("Python int too large to convert to C long")
            return f(*args, **kwargs)

        return call


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64", "uint64"])
@pytest.mark.parametrize("const", [2**64, 10**30, -(10**30), 2**63, -1, 1000])
@pytest.mark.parametrize("fn", ["less", "less_equal", "greater", "greater_equal", "equal",
                                "not_equal"])
def test_comparison_with_an_int_outside_the_dtype_is_numpys_answer(dtype, const, fn):
    """A Python int outside the array's integer range: every element compares alike, as
    NumPy 2 answers it, without handing the int to the array module (CuPy raised
    OverflowError for x < 2**64 on the GPU review probe of 2026-11-28)."""
    info = np.iinfo(dtype)
    x = np.array([info.min, -1 if info.min else 0, 0, 1, info.max], dtype)
    for args, want in (((Var(), Param(0, "int")), getattr(np, fn)(x, const)),
                       ((Param(0, "int"), Var()), getattr(np, fn)(const, x))):
        got = evaluate(Call(fn, args), x, (const,), _RefusesHugeInts())
        np.testing.assert_array_equal(got, want)



HUGE_INT_PREDICATES = [
    lambda x: (2**64 * x) <= np.rint(x),
    lambda x: np.real(np.rint(x) + 2**70) > 0,
    lambda x: np.where(x < 2**64, 2**70, -np.inf) >= x,
    lambda x: np.where(x > 0, 2**64, x) > 0,
    lambda x: (x + 2**64) > 2**64,
    lambda x: (x * 2**70) > 0,
    lambda x: np.maximum(x, 2**65) > 0,
    lambda x: np.real(x * 2**100) > 0,
    lambda x: x ** 2**64 > 1,
    lambda x: x - 2**63 < -(2**64),
    lambda x: x == 2**1024,
    lambda x: np.real(np.rint(x)) == np.real(x) + 2**64,
    lambda x: np.where(np.rint(x) == x, x, 2**64) == x,
]


@pytest.mark.parametrize("dtype", ["complex64", "complex128", "float16", "float32", "float64",
                                   "uint32", "int8", "int64", "uint64"])
@pytest.mark.parametrize("i", range(len(HUGE_INT_PREDICATES)))
def test_ints_beyond_int64_reach_an_array_module_as_numpy_uses_them(dtype, i):
    """Where the GPU evaluates a predicate with CuPy (complex rint, a constant that does not
    fit its loop), a Python int beyond int64 goes to it as NumPy converts it (NEP 50: to the
    loop's dtype); CuPy refused the int itself (OverflowError: Python int too large to convert
    to C long, the GPU probe of 2026-11-30) where NumPy answers. Where NumPy raises, so does
    the conversion. The array module here is NumPy refusing such ints as CuPy does."""
    f = HUGE_INT_PREDICATES[i]
    a = (np.arange(33) - 16.5 + 1j).astype(dtype) if dtype.startswith("c") else (
        (np.arange(33) - 16).astype(dtype) if dtype[0] != "u" else np.arange(33, dtype=dtype))
    p = trace(f)
    if p.expr is None:
        pytest.skip(f"not traced: {p.reason}")
    want, err = _numpy_or_error(f, a)
    with np.errstate(all="ignore"):
        if err is not None:
            with pytest.raises(type(err)):
                evaluate(p.expr, a, p.params, _RefusesHugeInts())
            return
        got = evaluate(p.expr, a, p.params, _RefusesHugeInts())
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fn, args", [
    ("multiply", (2**64, np.ones(3, np.complex64))),
    ("add", (np.ones(3, np.float16), 2**70)),
    ("add", (np.ones(3, np.float32), -(2**200))),
    ("maximum", (np.ones(3, np.uint8), 2**70)),
    ("where", (np.array([True, False, True]), 2**70, -np.inf)),
    ("where", (np.array([True, False, True]), 2**70, np.ones(3, np.float32))),
    ("where", (np.array([True, False, True]), 2**70, 1)),
    ("add", (np.ones(3, np.float64), 2**1024)),
])
def test_numpy_constants_converts_as_numpy_does(fn, args):
    """numpy_constants: NumPy's answer (value and dtype) is unchanged by the conversion, and
    where NumPy raises for the int, the conversion raises the same."""
    from dask_compact.predicate.expr import numpy_constants

    want, err = _numpy_or_error(lambda _: getattr(np, fn)(*args), None)
    if err is not None:
        with pytest.raises(type(err)), np.errstate(all="ignore"):
            numpy_constants(fn, list(args))
        return
    converted = numpy_constants(fn, list(args))
    assert not any(type(c) is int and abs(c) >= 2**63 for c in converted)
    with np.errstate(all="ignore"):
        got = getattr(np, fn)(*converted)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)

def _numpy_or_error(f, a):
    try:
        with np.errstate(all="ignore"):
            return f(a), None
    except (ValueError, OverflowError, TypeError) as e:
        return None, e


@pytest.mark.parametrize("dtype", ["bool", "int8", "int64", "uint8", "uint64", "float16",
                                   "float32", "float64", "complex64", "complex128"])
@pytest.mark.parametrize("f", [
    lambda v: v ** -1 > 0.3,
    lambda v: (v ** 0.5).real < 1.2,
    lambda v: (v * 2) ** -1 != 0,
    lambda v: (v ** 0.5 == v ** 0.5) & (v ** -1 < 2),
], ids=["inverse", "sqrt", "inverse of a product", "both"])
def test_scalar_powers_compile_as_numpy_computes_them(dtype, f):
    """``v ** -1`` and ``v ** 0.5`` are np.reciprocal / np.sqrt on float and complex arrays
    but np.power on the others (NumPy's fast_scalar_power): traced (no longer the mask path),
    typed per dtype, they answer bit for bit as NumPy does, or raise where it raises."""
    import dask_compact

    rng = np.random.default_rng(4)
    a = (rng.normal(size=301) * 3).astype(dtype) if dtype != "bool" else rng.random(301) < .5
    if a.dtype.kind in "fc":
        a[:6] = np.array([0, -0.0, np.inf, -np.inf, np.nan, 1e-30]).astype(a.dtype)
    elif a.dtype.kind in "iu":
        a[:3] = 0
    p = trace(f)
    assert p.path == "fused", p.reason
    want, err = _numpy_or_error(f, a)
    if err is not None:
        # NumPy's OverflowError for -1 in a uint8 loop is refused up front as a ValueError
        # naming the constant, as every constant NumPy refuses (test_predicate_refusals)
        raised = (type(err), ValueError) if isinstance(err, OverflowError) else type(err)
        with pytest.raises(raised), np.errstate(all="ignore"):  # NumPy warns before it raises
            dask_compact.compact_array(a, p)
        with pytest.raises(type(err)), np.errstate(all="ignore"):
            evaluate(p.expr, a, p.params)
        return
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(evaluate(p.expr, a, p.params), want)
        np.testing.assert_array_equal(dask_compact.compact_array(a, p), a[want])
        np.testing.assert_array_equal(dask_compact.compact_array(a, p, output="indices"),
                                      np.flatnonzero(want))


def test_np_vectorize_of_a_function_per_element_runs_on_the_mask_path():
    """np.vectorize converts its argument with __array__, which the tracer refused as if the
    chunk were used whole (a probe); a function applied per element is elementwise. With a
    core signature it acts on whole rows and stays refused."""
    import math

    import dask.array as da

    import dask_compact

    rng = np.random.default_rng(7)
    a = rng.uniform(0.5, 100, 1031)
    log = np.vectorize(math.log, otypes=[float])
    p = trace(lambda v: log(v) > 4)
    assert p.expr is None and "np.vectorize" in p.reason
    want = a[log(a) > 4]
    np.testing.assert_array_equal(dask_compact.compact_array(a, lambda v: log(v) > 4), want)
    got = da.from_array(a, chunks=97).map_compact(lambda v: log(v) > 4)
    np.testing.assert_array_equal(got.compute(), want)
    whole = np.vectorize(lambda r: r.sum(), signature="(n)->()")
    with pytest.raises(NotElementwise, match="converting the argument"):
        trace(lambda v: whole(v) > 4)
    with pytest.raises(NotElementwise, match="converting the argument"):
        trace(lambda v: np.asarray(v) > 4)


@pytest.mark.parametrize("chunks", [97, ((0, 400, 0, 631, 0),)])
def test_np_vectorize_without_otypes_runs_everywhere_empty_chunks_included(chunks):
    """np.vectorize without ``otypes`` cannot run on no values (NumPy will not guess its
    output type); until 2026-11-30 map_compact called the predicate on an empty test chunk
    and failed. Empty chunks now select nothing without a call."""
    import dask.array as da

    import dask_compact

    rng = np.random.default_rng(8)
    a = rng.random(1031)
    keep = np.vectorize(lambda z: z > 0.6)
    want = a[keep(a)]
    x = da.from_array(a, chunks=chunks)
    np.testing.assert_array_equal(x.map_compact(keep).compute(), want)
    np.testing.assert_array_equal(x.map_compact(keep, lazy=True).compute(), want)
    np.testing.assert_array_equal(dask_compact.compact_array(a, keep), want)
    assert dask_compact.compact_array(a[:0], keep).shape == (0,)
    fields = {"a": x, "b": x * 2}
    got = dask_compact.compact_records(fields, lambda a: keep(a))
    np.testing.assert_array_equal(got["b"].compute(), 2 * want)
    got = dask_compact.compact_records({"a": a, "b": 2 * a}, lambda a: keep(a))
    np.testing.assert_array_equal(got["b"], 2 * want)
    empty = dask_compact.compact_records({"a": a[:0], "b": a[:0]}, lambda a: keep(a))
    assert empty["b"].shape == (0,)


def _lookups(lut):
    return [lambda v: lut[v], lambda v: np.take(lut, v), lambda v: lut.take(v),
            lambda v: ~lut[v + 1]]  # fmt: skip


class _ConvertingTable:
    """A table whose C-level ``__getitem__`` converts the index with ``__array__`` without
    asking ``__index__`` first, as CuPy's indexing does (the GPU run of 2026-11-30 found
    ``lut_d[v]`` refused on CuPy chunks)."""

    __getitem__ = np.asarray  # a builtin: no Python frame between the subscript and __array__


def test_a_subscript_converting_its_index_directly_is_a_lookup():
    import dask_compact

    table = _ConvertingTable()
    p = trace(lambda v: table[v] > 3)
    assert p.expr is None and "indices" in p.reason
    a = np.random.default_rng(12).integers(0, 10, 1_009)
    np.testing.assert_array_equal(dask_compact.compact_array(a, lambda v: table[v] > 3), a[a > 3])
    with pytest.raises(NotElementwise, match="converting the argument"):
        trace(lambda v: table[np.asarray(v)] > 3)  # the conversion is asarray's, not [ ]'s


def test_an_int_conversion_caught_before_a_lookup_stays_refused():
    """``operator.index(v)`` caught by the user's code, then ``lut[v]``: the first refusal is
    final (a review: the lookup's took its place, and the predicate went to the mask path
    with a value that differs from chunk to chunk)."""
    import operator

    lut = np.random.default_rng(13).random(51) > 0.5

    def pred(v):
        try:
            n = operator.index(v)
        except Exception:  # noqa: BLE001 -- the point: the user's code catches it
            n = 0
        return lut[v] & (v > n)

    with pytest.raises(NotElementwise, match="Python int"):
        trace(pred)


def test_a_lookup_table_runs_on_the_mask_path():
    """``lut[v]``, ``np.take(lut, v)``, ``lut.take(v)`` convert the argument to indices with
    __array__, which the tracer refused as if the chunk were used whole (a new-user probe):
    a lookup is elementwise; the mask path gives NumPy's answer. np.asarray(v) stays
    refused, and so do int(v), range(v) and [..][v]."""
    import dask
    import dask.array as da

    import dask_compact

    rng = np.random.default_rng(11)
    lut = rng.random(51) > 0.5
    a = rng.integers(0, 50, 10_007)
    x = da.from_array(a, chunks=997)
    for f in _lookups(lut):
        p = trace(f)
        assert p.path == "mask" and "indices" in p.reason, p
        want = a[f(a)]
        np.testing.assert_array_equal(dask_compact.compact_array(a, f), want)
        with dask.config.set(scheduler="threads"):
            np.testing.assert_array_equal(x.map_compact(f).compute(), want)
            np.testing.assert_array_equal(x.map_compact(f, lazy=True).compute(), want)
        got = dask_compact.compact_records({"v": x, "w": x * 2}, lambda v: f(v), indices=True)
        np.testing.assert_array_equal(got["w"].compute(), 2 * want)
        np.testing.assert_array_equal(got["indices"].compute(), np.flatnonzero(f(a)))
    for f in [lambda v: np.asarray(v) > 4, lambda v: lut[int(v)], lambda v: [1, 2][v] > 0,
              lambda v: v > len(range(v)), lambda v: lut[np.asarray(v)]]:
        with pytest.raises(NotElementwise, match="refused"):
            trace(f)


def test_a_lookup_that_uses_the_chunk_whole_is_refused_by_the_slice_check():
    """The lookup takes the mask path, where the slice checks refuse a callable that goes on
    to use the chunk as a whole."""
    import dask.array as da

    import dask_compact  # noqa: F401

    a = np.random.default_rng(12).integers(0, 256, 4000).astype(np.uint8)
    lut = np.ones(256, bool)
    x = da.from_array(a, chunks=1000)
    with pytest.raises(NotElementwise, match="not elementwise"):
        x.map_compact(lambda v: lut[v] & (lut[v].sum() > 600)).compute()



def _isin(v, values):
    return np.isin(v, values)


def test_ensure_deterministic_refuses_a_mask_path_predicate_without_a_trace_key():
    """Under dask's tokenize.ensure-deterministic a mask-path predicate whose trace key is
    None got a new random output name at every call, silently (a new-user probe); dask's
    contract is to raise TokenizationError. Traced and keyed ones stay deterministic."""
    import functools

    import dask
    import dask.array as da
    from dask.base import tokenize
    from dask.tokenize import TokenizationError

    import dask_compact

    a = np.random.default_rng(14).integers(0, 20, 3001)
    x = da.from_array(a, chunks=301)
    held = np.array([1, 4])
    keyless = [functools.partial(_isin, values=(1, 4)), lambda v: np.isin(v, held),
               np.vectorize(lambda v: v in (1, 4), otypes=[bool])]  # fmt: skip
    with dask.config.set({"tokenize.ensure-deterministic": True}):
        for f in keyless:
            assert as_predicate(f).path == "mask"
            for call in (lambda: x.map_compact(f, lazy=True), lambda: x.map_compact(f),
                         lambda: dask_compact.compact_records({"v": x}, lambda v: f(v), lazy=True)):
                with pytest.raises(TokenizationError, match="mask path.*ensure-deterministic"):
                    call()
        keyed = lambda v: np.isin(v, (1, 4))  # noqa: E731
        for f in ("x > 4", lambda v: v > 4, keyed):
            assert x.map_compact(f, lazy=True).name == x.map_compact(f, lazy=True).name
        np.testing.assert_array_equal(x.map_compact(keyed).compute(), a[np.isin(a, (1, 4))])
    for f in keyless:  # the setting off: new names, as before
        np.testing.assert_array_equal(x.map_compact(f).compute(), a[np.isin(a, (1, 4))])
        with pytest.raises(TokenizationError, match="new at every call"):
            tokenize(as_predicate(f), ensure_deterministic=True)


def _vectorized_and_lookup_predicates(lut):
    # np.vectorize called once already, as map_compact's checks call it: NumPy keeps an
    # unpicklable ufunc on it
    vec = np.vectorize(lambda v: v % 7 > 2, otypes=[bool])
    vec(np.arange(3))
    return [vec, *_lookups(lut)]


def _check_on_the_scheduler(scheduler=None, n_predicates=None):
    import dask
    import dask.array as da

    import dask_compact

    rng = np.random.default_rng(13)
    lut = rng.random(51) > 0.5
    a = rng.integers(0, 50, 20_011)
    x = da.from_array(a, chunks=5003)
    with dask.config.set(scheduler=scheduler) if scheduler else dask.config.set({}):
        for f in _vectorized_and_lookup_predicates(lut)[:n_predicates]:
            want = a[f(a)]
            np.testing.assert_array_equal(x.map_compact(f).compute(), want)
            np.testing.assert_array_equal(x.map_compact(f, lazy=True).compute(), want)
            if isinstance(f, np.vectorize):
                continue  # a lambda that holds it is pickled by cloudpickle: NumPy's failure
            got = dask_compact.compact_records({"v": x, "w": x + 1}, lambda v: f(v))
            np.testing.assert_array_equal(got["w"].compute(), want + 1)


def test_vectorized_and_lookup_predicates_under_processes():
    """An np.vectorize predicate failed to pickle under the processes scheduler (NumPy's
    cached ufunc, made by map_compact's checks on the client); lookups travel too."""
    _check_on_the_scheduler("processes", 2)  # a pool per compute: slow, so two of them


def test_vectorized_and_lookup_predicates_on_a_cluster(process_client):
    _check_on_the_scheduler()
