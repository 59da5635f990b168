"""String predicates: parsed with ast against a whitelist, never eval'd, same trees as tracing."""

from __future__ import annotations

import logging
import re

import dask.array as da
import numpy as np
import pytest

import dask_compact
from dask_compact.predicate import as_predicate
from dask_compact.predicate.expr import evaluate
from dask_compact.predicate.parse import parse
from dask_compact.predicate.trace import trace

RNG = np.random.default_rng(5)
A = np.concatenate([RNG.normal(scale=3, size=300), [np.nan, np.inf, -np.inf, -0.0]])


@pytest.mark.parametrize(
    "text, f",
    [
        ("(x > 0.2) & (x < 0.3)", lambda v: (v > 0.2) & (v < 0.3)),
        ("0.2 < x", lambda v: 0.2 < v),
        ("isnan(x) | (abs(x) > 5)", lambda v: np.isnan(v) | (np.abs(v) > 5)),
        ("~(x >= -1)", lambda v: ~(v >= -1)),
        ("where(x > 0, x, -x) < 2*pi", lambda v: np.where(v > 0, v, -v) < 2 * np.pi),
        ("x > sqrt(2)", lambda v: v > np.sqrt(2)),
        ("x ** 2 > 4", lambda v: v**2 > 4),
        ("minimum(x, 1) == 1", lambda v: np.minimum(v, 1) == 1),
        ("real(x) != inf", lambda v: np.real(v) != np.inf),
    ],
)
def test_same_tree_as_traced_lambda(text, f):
    p, q = parse(text), trace(f)
    assert p.path == "fused"
    assert p.expr == q.expr
    assert p.params == q.params
    assert np.array_equal(evaluate(p.expr, A, p.params), f(A))


@pytest.mark.parametrize(
    "text, f",
    [
        ("0.2 < x < 0.3", lambda v: (0.2 < v) & (v < 0.3)),
        ("-1 <= x < 1 != x", lambda v: (-1 <= v) & (v < 1) & (v != 1)),
        ("not (x > 1)", lambda v: ~(v > 1)),
        ("x > 1 and x < 3", lambda v: (v > 1) & (v < 3)),
        ("x < -1 or x > 1 or isnan(x)", lambda v: (v < -1) | (v > 1) | np.isnan(v)),
        ("not isfinite(x)", lambda v: ~np.isfinite(v)),
    ],
)
def test_chains_and_boolean_keywords_mean_elementwise_logic(text, f):
    p = parse(text)
    assert p.path == "fused"
    assert np.array_equal(p.mask(A), f(A))


def test_as_predicate_parses_strings_and_source_is_text():
    p = as_predicate("  x > 0.5 ")
    assert p.path == "fused" and p.source == "x > 0.5" and p.func is None


@pytest.mark.parametrize(
    "text, what",
    [
        ("x.__class__", "attribute"),
        ("x.real > 1", "attribute"),
        ("__import__('os').system('echo hi')", "__import__"),
        ("open('/etc/passwd')", "open"),
        ("eval('1') > x", "eval"),
        ("y > 1", "name 'y'"),
        ("np.sin(x) > 0", "attribute"),
        ("x[0] > 1", "subscript"),
        ("(lambda: x)() > 1", "lambda"),
        ("[c for c in x]", "comprehension"),
        ("'a' == x", "non-numeric"),
        ("b'a' == x", "non-numeric"),
        ("f'{x}' == x", "f-string"),
        ("isnan(x=x)", "keyword"),
        ("isnan(*x)", "starred"),
        ("x if x > 0 else 0", "conditional"),
        ("(x := 1) > 0", "assignment"),
        ("x is None", "`is`"),
        ("x in (1, 2)", "`in`"),
        ("sum(x) > 1", "'sum'"),
        ("mean(x) > 1", "'mean'"),
        ("x @ x", "@"),
        ("None == x", "non-numeric"),
        ("__builtins__", "__builtins__"),
        ("isnan.__call__(x)", "attribute"),
        ("2 ** 2 ** 2 ** 30 > x", "bits"),
        ("1 << 10 ** 6 > x", "bits"),
        ("-" * 500 + "x > 0", "nesting"),
        ("x" + " + x" * 1000, "characters"),
        ("(" * 5000 + "x" + ")" * 5000, "characters"),
        ("x > 1; import os", "syntax"),
        ("import os", "syntax"),
        ("x > ", "syntax"),
    ],
)
def test_attacks_and_unsupported_syntax_are_refused(text, what):
    with pytest.raises(ValueError, match="not allowed|not valid syntax|characters") as e:
        parse(text)
    assert what in str(e.value)


def test_nesting_limit_is_checked_before_evaluating():
    deep = "-" * 300 + "x > 0"
    with pytest.raises(ValueError, match="nesting"):
        parse(deep)
    with pytest.raises(ValueError, match="nesting|syntax"):
        parse("abs(" * 300 + "x" + ")" * 300)
    ok = "abs(" * 100 + "x" + ")" * 100 + " > 1"
    assert parse(ok).path == "fused"


def test_not_a_string():
    with pytest.raises(TypeError):
        parse(3)  # type: ignore[arg-type]


def test_constant_expression_and_constant_errors():
    assert parse("True").params == (True,)
    with pytest.raises(ValueError, match="ZeroDivisionError"):
        parse("x > 1 / 0")


def test_threshold_change_same_structure():
    a, b = parse("(x > 0.1) & (x < 0.2)"), parse("(x > 5.5) & (x < 7.25)")
    assert a.expr == b.expr and a.params != b.params


def test_a_field_named_like_a_python_constant_is_refused_where_named():
    """`True > 2` over a field named "True" selected nothing (Python's constant, not the field;
    a probe): refused, naming the field; the constant itself still works elsewhere."""
    fields = {"True": np.arange(6.0), "k": np.arange(6)}
    with pytest.raises(ValueError, match="never the field named 'True'"):
        dask_compact.compact_records(fields, "True > 2")
    got = dask_compact.compact_records({"a": np.arange(6.0), "k": np.arange(6)}, "(a > 2) & True")
    np.testing.assert_array_equal(got["k"], [3, 4, 5])


WHERE_TRUTH = [
    np.arange(-4, 8),
    np.arange(6).astype(np.uint8),
    np.array([0.0, -0.0, 1.5, np.nan, -np.inf, 2.0]),
    np.array([0, 1j, complex(np.nan, 0), 1, 0j]),
    np.array([True, False, True]),
]


@pytest.mark.parametrize("a", WHERE_TRUTH, ids=lambda a: str(a.dtype))
@pytest.mark.parametrize(
    "text", ["where(x, True, False)", "where(x - 1, 1, 0) == 1", "where(nan, x, 0) == x"]
)
def test_where_condition_is_its_truth_as_numpy(text, a, caplog):
    """NumPy's where reads a non-boolean condition as non-zero (NaN included) is true; so does
    the fused loop (logged), and the mask path of a dask array."""
    numpy = np.asarray(eval(text, {"x": a, "where": np.where, "nan": np.nan}))
    want = a[numpy]
    with caplog.at_level(logging.DEBUG, logger="dask_compact"):
        got = dask_compact.compact_array(a, text)
    assert "fused loop" in caplog.text
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(da.from_array(a, chunks=2).map_compact(text).compute(), want)
    assert np.array_equal(parse(text).mask(a), numpy)


@pytest.mark.parametrize(
    "text, says, works",
    [
        ("np.isnan(x)", "write isnan(x)", "isnan(x)"),
        ("numpy.abs(x) > 1", "write abs(x)", "abs(x) > 1"),
        ("np.logical_and(x > 0.2, x < 0.3)", "write logical_and(x > 0.2, x < 0.3)",
         "logical_and(x > 0.2, x < 0.3)"),
        ("x.real > 0", "write real(x)", "real(x) > 0"),
        ("abs(x).round() > 1", "methods are not available", None),
        ("x in (1, 2)", "write (x == 1) | (x == 2)", "(x == 1) | (x == 2)"),
        ("x not in (1, 2)", "write (x != 1) & (x != 2)", "(x != 1) & (x != 2)"),
        ("x = 0.5", "a comparison is written ==", "x == 0.5"),
        ("x => 0.5", "write >=", "x >= 0.5"),
        ("x =< 0.5", "write <=", "x <= 0.5"),
    ],
)
def test_numpy_habits_in_a_string_are_told_the_form_that_is_taken(text, says, works):
    """What a NumPy user writes in a string predicate (np.isnan(x), x in (1, 2), x = 0.5) was
    refused as "attribute access is not allowed", "`in` is not allowed" or "invalid syntax"
    with no form that works (a new-user probe, 2026-12-01, fourteenth session): each refusal
    now writes it, and that form parses."""
    with pytest.raises(ValueError, match="not allowed|not valid syntax") as e:
        parse(text)
    assert says in str(e.value)
    if works is not None:
        assert parse(works).path == "fused"


def test_a_records_name_refusal_shows_a_function_call_on_a_field():
    """A record predicate naming `x` was told "functions are called by bare name, e.g.
    `isnan(x)`", an example in the very name refused (a new-user probe, 2026-12-01,
    fourteenth session): the example calls the function on a field."""
    with pytest.raises(ValueError, match=r"the name 'x' is not allowed") as e:
        parse("x > 0.5", names=("energy", "eta"))
    assert "e.g. `isnan(energy)`" in str(e.value)
    assert "isnan(x)" not in str(e.value)
    assert parse("isnan(energy)", names=("energy", "eta")).path == "fused"


NUMPY_CONSTANTS = [
    ("x < np.e", lambda v: v < np.e),
    ("x >= numpy.pi", lambda v: v >= np.pi),
    ("(x > -np.inf) & (x < np.inf)", lambda v: (v > -np.inf) & (v < np.inf)),
    ("x != np.nan", lambda v: v != np.nan),
    ("x == numpy.nan", lambda v: v == np.nan),
    ("x * 2 < np.e ** 2 - np.euler_gamma", lambda v: v * 2 < np.e**2 - np.euler_gamma),
    ("where(isnan(x), np.inf, x) > math.tau",
     lambda v: np.where(np.isnan(v), np.inf, v) > np.pi * 2),
    ("maximum(x, np.nan) <= np.pi", lambda v: np.maximum(v, np.nan) <= np.pi),
]


# every text on float64, the first on the other dtypes, two NaN ones (each case compiles)
CONSTANT_CASES = [(t, f, "float64") for t, f in NUMPY_CONSTANTS] + [
    (*NUMPY_CONSTANTS[0], dtype) for dtype in ("float32", "float16", "int32", "complex64")] + [
    (*NUMPY_CONSTANTS[3], "int32"), (*NUMPY_CONSTANTS[7], "float32")]


@pytest.mark.parametrize("text, f, dtype", CONSTANT_CASES,
                         ids=[f"{t}-{d}" for t, _, d in CONSTANT_CASES])
def test_numpy_constants_are_literals_of_a_string_predicate(text, f, dtype):
    """``"x < np.e"`` was refused with the general bare-name hint (the fifteenth session's
    probes; `np.pi` was told "write pi", and `e` has no bare name). NumPy's constants
    written as NumPy writes them (``np.e``, ``numpy.pi``, ``np.inf``, ``np.nan``,
    ``np.euler_gamma``, and ``math.tau``) are literals: the tree a lambda naming them gives,
    and NumPy's answer, compiled (float16 and complex on the mask path) and on the mask
    path, in memory; on dask arrays, in a split and in records for float32."""
    with np.errstate(all="ignore"):
        a = np.concatenate([RNG.normal(scale=4, size=1021), [np.e, np.pi, 2 * np.pi, -0.0,
                                                               np.nan, np.inf, -np.inf]])
        a = a.astype(dtype) if np.dtype(dtype).kind in "fc" else \
            np.clip(np.nan_to_num(a * 3), -100, 100).astype(dtype)
        want_m = np.asarray(f(a))
    p, q = parse(text), trace(f)
    assert p.expr == q.expr and repr(p.params) == repr(q.params)  # nan != nan
    want = a[want_m]
    np.testing.assert_array_equal(dask_compact.compact_array(a, text), want)
    np.testing.assert_array_equal(dask_compact.compact_array(a, text, output="indices"),
                                  np.flatnonzero(want_m))
    with np.errstate(all="ignore"):
        assert np.array_equal(p.mask(a), want_m)  # the mask path
    if dtype != "float32":
        return
    x = da.from_array(a, chunks=257)
    np.testing.assert_array_equal(x.map_compact(text).compute(), want)
    values, k = dask_compact.partition(x, text)
    np.testing.assert_array_equal(values.compute()[:k], want)
    got = dask_compact.compact_records({"v": a, "i": np.arange(a.size)},
                                       re.sub(r"\bx\b", "v", text))
    np.testing.assert_array_equal(got["i"], np.flatnonzero(want_m))


def test_a_bare_name_of_a_numpy_constant_is_told_how_to_write_it():
    """`e` has no bare name (it is too likely a misspelt variable or field, which would then
    compare with 2.718... and select all or nothing without a word): refused, told np.e."""
    with pytest.raises(ValueError, match="the name 'e' is not allowed") as e:
        parse("x < e")
    assert "write np.e" in str(e.value)
    assert parse("x < np.e").path == "fused"
    # a record's field named e is the field
    got = dask_compact.compact_records({"e": np.arange(6.0), "i": np.arange(6)}, "e < np.e")
    np.testing.assert_array_equal(got["i"], [0, 1, 2])


@pytest.mark.parametrize("dtype,t", [
    ("float64", np.float32(0.1)), ("float32", np.float64(0.1)), ("float64", np.float64(0.37)),
    ("float64", np.float64(np.nan)), ("float64", np.float64(-np.inf)), ("int64", np.int64(-5)),
    ("uint8", np.uint8(200)), ("uint16", np.uint16(7)), ("float16", np.float16(0.3)),
    ("complex128", np.complex128(1 + 2j)), ("int32", np.float32(2.5)),
])
@pytest.mark.parametrize("op", ["<", ">=", "==", "!="])
def test_a_numpy_scalar_as_numpy_prints_it_is_a_constant_of_its_type(dtype, t, op):
    """``f"x < {t!r}"`` of a NumPy scalar writes ``x < np.float64(0.5)`` (NumPy 2's repr):
    until 2026-12-02 (sixteenth session) refused as attribute access. A constant of that
    type now, with NumPy's promotion rules (a float32 0.1 is not 0.1), on the compiled loop,
    the mask path and dask, equal to NumPy's own comparison with the scalar."""
    rng = np.random.default_rng(len(dtype) + len(op))
    base = np.array([0.1, float(np.float32(0.1)), 0.09999999, 0.1000000015, np.nan, np.inf,
                     -np.inf, 0.3, 2.5, -5, 7, 200, 0.37])
    with np.errstate(invalid="ignore"):  # NaN and negatives cast to integers: any value
        a = np.concatenate([base, rng.random(1000) * 10 - 5]).astype(
            "float64" if dtype.startswith("complex") else dtype)
    if dtype.startswith("complex"):
        a = (a + 2j * (rng.random(a.size) < 0.5)).astype(dtype)
    text = f"x {op} {t!r}"
    with np.errstate(all="ignore"):
        m = eval(f"a {op} t")
        want = a[m]
    assert text.startswith(f"x {op} np.")
    np.testing.assert_array_equal(dask_compact.compact_array(a, text), want)
    np.testing.assert_array_equal(dask_compact.compact_array(a, text, algorithm="scan"), want)
    x = da.from_array(a, chunks=257)
    np.testing.assert_array_equal(x.map_compact(text).compute(), want)


@pytest.mark.parametrize("dtype", ["bool", "int8", "float32", "uint64"])
@pytest.mark.parametrize("t", [np.True_, np.False_, np.bool_(True)])
@pytest.mark.parametrize("op", ["==", "!=", "<", ">="])
def test_a_numpy_bool_as_numpy_prints_it_is_a_constant(dtype, t, op):
    """NumPy 2 prints its bools ``np.True_`` and ``np.False_`` (not ``np.bool_(True)``):
    ``f"x == {t!r}"`` of one was refused as attribute access, "methods are not available",
    until 2026-12-02 (seventeenth session, a regression review of the sixteenth's NumPy
    scalars). A constant of NumPy's bool now, compared as NumPy compares with it."""
    a = np.random.default_rng(7).integers(0, 3, 1001).astype(dtype)
    text = f"x {op} {t!r}"
    want = a[eval(f"a {op} t")]
    np.testing.assert_array_equal(dask_compact.compact_array(a, text), want)
    np.testing.assert_array_equal(
        da.from_array(a, chunks=257).map_compact(text).compute(), want)


def test_a_numpy_scalar_of_a_numpy_constant_is_a_constant():
    """``np.float32(np.pi)``: the constant inside is NumPy's, not a variable (refused "a
    variable is compared as it is" until 2026-12-02, seventeenth session, a regression
    review); a field named like a constant inside one (``np.float64(inf)`` over a field
    ``inf``) is a variable, refused so (a NotElementwise error about Python floats before)."""
    a = np.linspace(0, 5, 1001).astype(np.float32)
    for text, t in (("x < np.float32(np.pi)", np.float32(np.pi)),
                    ("x >= np.float64(-math.e)", np.float64(-np.e))):
        np.testing.assert_array_equal(dask_compact.compact_array(a, text), a[a >= t]
                                      if ">=" in text else a[a < t])
    fields = {"x": a, "inf": a[::-1].copy()}
    with pytest.raises(ValueError, match="takes a number here"):
        dask_compact.compact_records(fields, "x < np.float64(inf)")
    np.testing.assert_array_equal(dask_compact.compact_records(fields, "x < np.inf")["x"], a)


@pytest.mark.parametrize("text,said", [
    ("np.float64(x) > 1", "takes a number here"),
    ("x > np.int8(300)", "out of bounds for int8"),
    ("x > np.uint8(-1)", "out of bounds for uint8"),
    ("x > np.float64(1, 2)", "np.float64(...) takes one number here"),
    ("x > np.ndarray(3)", "attribute access"),
    # as NumPy 2 prints its scalars of other types (told "methods are not available" until
    # 2026-12-02, seventeenth session, a regression review)
    (f"x > {np.longdouble(0.5)!r}", "np.longdouble is not a type dask_compact computes in"),
    (f"x > {np.datetime64('2020-01-05')!r}",
     "compare times in a callable, lambda v: v > np.datetime64('2020-01-05')"),
    (f"x > {np.timedelta64(3, 'D')!r}",
     "compare times in a callable, lambda v: v > np.timedelta64(3, 'D')"),
])
def test_numpy_scalar_calls_other_than_a_constant_are_refused(text, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        dask_compact.compact_array(np.arange(5.0), text)
