"""String predicates whose numbers change from call to call (predicate/template.py): a text of
a kept shape gets the first text's tree with its own numbers, and must be exactly what
parsing it gives; every result is checked against NumPy."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_compact import compact_array
from dask_compact.predicate import as_predicate, template
from dask_compact.predicate.expr import to_source
from dask_compact.predicate.memo import value_key
from dask_compact.predicate.parse import parse

# shapes kept: every number a comparison's operand (or negated right before it) beside x
KEPT = [
    "x < {}",
    "{} < x < {}",
    "(x > {}) & (x < {})",
    "(x >= {}) | ~(x != {})",
    "abs(x) <= {}",
    "where(x > {}, x, -x) < {}",
    "(x < {}) & ~isnan(x)",
    "x == {}",
    "  x > {} ",
]
# shapes never kept: a number the parse computes with (its value can change the tree)
NOT_KEPT = [
    "x * {} > 1",
    "x > - {}",
    "x > -({})",
    "x < abs({})",
    "x < 2 ** {}",
    "x < np.float64({})",
    "x + {} > x",
]


def _numbers(kind: str, k: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        if kind == "i":
            out.append(str(int(rng.integers(-300, 300))))
        else:
            out.append(repr(float(np.round(rng.uniform(-3, 3), 3))))
    return out


def _same(a, b) -> None:
    assert to_source(a.expr) == to_source(b.expr)
    assert [value_key(v) for v in a.params] == [value_key(v) for v in b.params]
    assert a.source == b.source


def _distinct(texts: list[str]) -> bool:
    return len(set(texts)) == len(texts) and len({float(t) for t in texts}) == len(texts)


@pytest.mark.parametrize("shape", KEPT)
@pytest.mark.parametrize("kind", ["i", "f"])
def test_a_kept_shape_gives_what_parsing_gives(shape, kind):
    k = shape.count("{}")
    first = ["0.125", "1.75", "-2.5"][:k] if kind == "f" else ["7", "-11", "13"][:k]
    text0 = shape.format(*first)
    template.remember_parsed(text0, parse(text0))
    assert template.like_parsed(text0) is not None, text0
    a = (np.random.default_rng(3).standard_normal(1031) * 100).astype(np.float64)
    for seed in range(12):
        nums = _numbers(kind, k, seed)
        text = shape.format(*nums)
        got = template.like_parsed(text)
        assert got is not None, text
        _same(got, parse(text))
        np.testing.assert_array_equal(compact_array(a, text), a[_numpy(text, a)])


class _Unchain(ast.NodeTransformer):
    """``a < x < b`` as NumPy needs it written: ``(a < x) & (x < b)``."""

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        operands = [node.left, *node.comparators]
        parts = [ast.Compare(operands[i], [op], [operands[i + 1]])
                 for i, op in enumerate(node.ops)]
        out: ast.AST = parts[0]
        for part in parts[1:]:
            out = ast.BinOp(out, ast.BitAnd(), part)
        return out


def _numpy(text: str, a: np.ndarray) -> np.ndarray:
    """NumPy's own answer for the text, evaluated on ``a``."""
    tree = ast.fix_missing_locations(_Unchain().visit(ast.parse(text.strip(), mode="eval")))
    env = {"x": a, "abs": np.abs, "where": np.where, "isnan": np.isnan, "np": np}
    return np.asarray(eval(compile(tree, "<test>", "eval"), env))  # noqa: S307 -- own texts


@pytest.mark.parametrize("shape", NOT_KEPT)
def test_a_number_the_parse_computes_with_keeps_its_shape_unkept(shape):
    for first in ("0", "1", "2", "0.5"):
        text = shape.format(first)
        template.remember_parsed(text, parse(text))
        assert template.like_parsed(text) is None, text


def test_texts_of_a_shape_unkept_are_parsed_each_time_and_exact():
    """The traps: a minus apart from its number (``- 0`` is ``0``), a number multiplied by
    ``False`` (0 there), an exponent: each parsed, and each result NumPy's."""
    a = (np.random.default_rng(4).standard_normal(1000) * 10).astype(np.float64)
    for shape in ("x > - {}", "x < {} * False + x", "x < 2 ** {}"):
        for n in ("0", "5", "3", "0"):
            text = shape.format(n)
            np.testing.assert_array_equal(compact_array(a, text), a[_numpy(text, a)])


def test_equal_numbers_and_other_kinds_are_shapes_of_their_own():
    text = "(x > 1) | (x < 1)"  # equal numbers: two parameters exchanged would not show
    template.remember_parsed(text, parse(text))
    assert template.like_parsed(text) is None
    assert template.shape_of("x < 3")[0] != template.shape_of("x < 3.0")[0]
    # ints past int64, quotes, digits in names, underscores: never lifted
    assert template.shape_of("x < 9223372036854775808") is None
    assert template.shape_of("x < np.datetime64('2020-01-01')") is None
    assert template.shape_of("x1 < y2") is None
    assert template.shape_of("x < 1_000") is None


@pytest.mark.parametrize("dtype", ["int8", "uint8", "uint64", "float16", "float32"])
def test_a_threshold_new_at_each_call_against_numpy_in_every_dtype(dtype):
    """Ints outside the dtype (``x < 300`` on int8, ``x > -1`` on uint8: NumPy 2 compares
    them exactly), negative zero, infinities from a literal's overflow."""
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype) if dtype[0] in "iu" else np.finfo(dtype)
    a = rng.integers(int(info.min) // 2, int(info.max) // 2, 997, dtype=np.int64).astype(dtype) \
        if dtype[0] in "iu" else (rng.standard_normal(997) * 100).astype(dtype)
    values = ["0", "-0", "-1", "300", "-300", "127", "-129", "256", "9223372036854775807",
              "0.5", "-0.0", "1e400", "65504.0"]
    for shape in ("x < {}", "(x >= {}) & (x != {})"):
        for v in values:
            text = shape.format(v, "1" if v != "1" else "2")
            want = a[_numpy(text, a)]
            np.testing.assert_array_equal(compact_array(a, text), want, err_msg=text)


@settings(max_examples=60, deadline=None)
@given(
    shape=st.sampled_from(KEPT),
    nums=st.lists(st.one_of(
        st.integers(-(2**63), 2**63 - 1).map(str),
        st.floats(allow_nan=False, allow_infinity=False, width=64).map(repr)),
        min_size=3, max_size=3),
)
def test_property_a_kept_shape_is_what_parsing_gives(shape, nums):
    k = shape.count("{}")
    text = shape.format(*nums[:k])
    got = template.like_parsed(text)
    want = parse(text)
    if got is not None:
        _same(got, want)
    template.remember_parsed(text, want)
    got = template.like_parsed(text)
    if got is not None:
        _same(got, want)


def test_as_predicate_takes_the_kept_tree_without_parsing(monkeypatch):
    from dask_compact.predicate import parse as parse_module

    as_predicate("x < 0.375")  # parsed, shape kept
    calls = []
    real = parse_module.parse
    monkeypatch.setattr(parse_module, "parse", lambda *a, **k: calls.append(a) or real(*a, **k))
    a = np.random.default_rng(6).random(1000)
    for t in np.random.default_rng(7).uniform(0.2, 0.8, 50):
        text = f"x < {float(t)!r}"
        np.testing.assert_array_equal(compact_array(a, text), a[a < float(t)])
    assert calls == []


@pytest.mark.parametrize("text", ["x < ١.٥", "x < 1.٥", "x < 1٣", "x < 2e٣", "x < ５.0",
                                  "(x > ٠.٥) & (x < 1.5)"])
def test_digits_python_refuses_are_refused_after_their_shape_is_kept(text):
    """``\\d`` reads Unicode's digits and float() and int() take them, but Python's syntax
    does not: a text of a kept shape written in them was refused before its shape was kept
    and ran after (until 2026-12-02, seventeenth session, a regression review)."""
    for first in ("x < 0.25", "x < 7", "x < 2e3", "(x > 0.25) & (x < 1.5)"):
        template.remember_parsed(first, parse(first))
    assert template.like_parsed(text) is None
    with pytest.raises(ValueError, match="not valid syntax"):
        as_predicate(text)


def test_a_text_longer_than_a_parse_takes_has_no_shape():
    """The GPU's kept call per shape (backends/cupy_shaped.py) finds a text's shape with no
    parse: a text of a kept shape past parse.MAX_LENGTH (a number of 2,100 digits) ran there
    where the parse refuses it (until 2026-12-02, seventeenth session, a regression review);
    a number of over 4,300 digits raised int()'s own ValueError."""
    from dask_compact.backends.cupy_shaped import shaped_key
    from dask_compact.predicate.parse import MAX_LENGTH

    template.remember_parsed("x < 0.25", parse("x < 0.25"))
    template.remember_parsed("x < 7", parse("x < 7"))
    for text in ("x < 0.2" + "0" * MAX_LENGTH + "1", "x < " + "0" * 5000,
                 "x < -" + "0" * (MAX_LENGTH - 4)):
        assert template.shape_of(text) is None
        assert not template.kept_shape(text)
        assert template.like_parsed(text) is None
        assert shaped_key(text, ("thread", text, "<f4", 10)) is None
        with pytest.raises(ValueError, match=f"over {MAX_LENGTH}"):
            as_predicate(text)
    at_limit = "x < 0." + "0" * (MAX_LENGTH - 7) + "1"
    assert len(at_limit) == MAX_LENGTH and template.like_parsed(at_limit) is not None
