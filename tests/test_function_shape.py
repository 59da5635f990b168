"""A function's shape (predicate/function_shape.py): two functions of one code whose values
differ only in the ints and floats they read share a tree, and the numbers a later one gives
for its parameters are those its own trace would have. Checked here against the trace itself
(``as_predicate`` of the new function), for functions whose values steer the trace otherwise
(no shape kept), and for the values read from closures, defaults and globals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dask_compact.predicate import function_shape as fs
from dask_compact.predicate.core import as_predicate
from dask_compact.predicate.memo import value_key
from dask_compact.predicate.trace import trace

G_T = 0.5
G_N = 3


def _closure(t):
    return lambda v: v < t


def _band(lo, hi):
    return lambda v: (v > lo) & (v < hi) | (v == 7)


def _where(t):
    return lambda v: np.where(v > t, v, t) > 0.3


def _reflected(t):
    return lambda v: (t < v) & (v != t) & (np.maximum(v, t) <= 100)


def _default(t):
    return lambda v, t=t: v >= t


def _int_and_float(n, t):
    return lambda v: (v * n > t) | (v < -1.5)


# each maker: how its function is made from values (a tuple), and values to start from
SHAPED = {
    "closure": (_closure, (0.3,)),
    "band": (_band, (1, 9)),
    "where": (_where, (0.1,)),
    "reflected": (_reflected, (2.5,)),
    "default": (_default, (4,)),
    "int_and_float": (_int_and_float, (3, 0.25)),
}


@pytest.fixture(autouse=True)
def _fresh():
    fs.forget()
    yield
    fs.forget()


def _learned(f):
    fs.learn(f, as_predicate(f))
    return fs.numbers_for(f)


def _same_as_its_trace(g, fshape):
    found = fs.numbers_for(g)
    assert found is not None
    p = as_predicate(g)
    assert found[0] == fshape
    assert [value_key(v) for v in found[1]] == [value_key(v) for v in p.params]
    return p


@pytest.mark.parametrize("name", sorted(SHAPED))
def test_a_new_value_gives_the_numbers_its_own_trace_gives(name):
    make, first = SHAPED[name]
    f = make(*first)
    fshape, numbers = _learned(f)
    p0 = as_predicate(f)
    assert [value_key(v) for v in numbers] == [value_key(v) for v in p0.params]
    for k in range(1, 6):
        new = tuple(type(v)(v + k) for v in first)
        p = _same_as_its_trace(make(*new), fshape)
        assert p.expr == p0.expr


@settings(max_examples=60, deadline=None)
@given(lo=st.floats(allow_nan=True, allow_infinity=True), hi=st.integers(-2**70, 2**70))
def test_any_float_and_int_values(lo, hi):
    """Any float (nan, infinities, signed zeros) and any int a band may read."""
    fs.forget()
    f = _int_and_float(2, 0.5)
    fshape, _ = _learned(f)
    _same_as_its_trace(_int_and_float(hi, lo), fshape)


def _twice(t):
    return lambda v: v < t * 2


def _branch(t):
    return lambda v: v < 1 if t == 0 else v < t


def _power(t):
    return lambda v: v ** t > 1


def _cast(t):
    return lambda v: v < np.float32(t)


def _negated(t):
    return lambda v: v > -t


def _formatted(t):
    return lambda v: v < float(f"{t}")


def _math(t):
    return lambda v: v < math.sqrt(t)


def _keyed(t):
    table = {0.5: 1.0, 2.0: 3.0}
    return lambda v: v < table.get(t, 0.0)


def _indexed(i):
    table = (0.1, 0.2, 0.3)
    return lambda v: v < table[i]


def _truth(t):
    return lambda v: (v < 1) if t else (v > 1)


def _constant(t):
    return lambda v: t


@pytest.mark.parametrize("make", [_twice, _branch, _power, _cast, _negated, _formatted, _math,
                                  _keyed, _indexed, _truth, _constant])
def test_a_value_used_by_the_functions_own_code_keeps_no_shape(make):
    """Every use of a read number other than as an operand of the array: its value could
    steer the tree or its constants, so the function is traced per value."""
    arg = 1 if make is _indexed else 2.0
    f = make(arg)
    try:
        p = as_predicate(f)
    except ValueError:
        return  # refused outright (a constant predicate): nothing to keep
    fs.learn(f, p)
    assert fs.numbers_for(f) is None
    assert fs.numbers_for(make(0 if make is _indexed else 0.5)) is None


def test_bools_and_other_scalars_are_part_of_the_shape():
    """A bool is no number here (its kind differs, and it steers ``if``); a NumPy scalar is
    kept by value: each is another shape, or none."""
    def make(t, flag):
        return lambda v: (v < t) & flag

    f = make(0.5, True)
    fshape, _ = _learned(f)
    assert fs.numbers_for(make(0.7, True))[0] == fshape
    assert fs.numbers_for(make(0.7, False)) is None  # not learned for False
    g = _closure(np.float32(0.5))
    fs.learn(g, as_predicate(g))
    assert fs.numbers_for(g) is None  # no int nor float read: no shape


def test_int_and_float_values_are_different_shapes():
    f = _closure(3)
    fshape, _ = _learned(f)
    assert fs.numbers_for(_closure(3.0)) is None
    g = _closure(3.0)
    gshape, _ = _learned(g)
    assert gshape != fshape
    _same_as_its_trace(_closure(7), fshape)
    _same_as_its_trace(_closure(7.5), gshape)


def test_globals_are_read_at_each_call():
    global G_T, G_N

    def f(v):
        return (np.abs(v) < G_T) & (v != G_N)

    try:
        fshape, numbers = _learned(f)
        assert numbers == (0.5, 3)
        G_T, G_N = 0.75, -2
        p = _same_as_its_trace(f, fshape)
        assert p.params == (0.75, -2)
        G_T = 2.0
        assert fs.numbers_for(f)[1] == (2.0, -2)
    finally:
        G_T, G_N = 0.5, 3


class _Cfg:
    T = 0.5


def test_a_class_attribute_is_part_of_the_shape():
    """Numbers read off a class or module (``Cfg.T``) are the shape's, by value: another
    value is another shape, not learned."""
    f = lambda v: v < _Cfg.T  # noqa: E731
    g = lambda v: (v < _Cfg.T) | (v > G_T)  # noqa: E731
    assert _learned(f) is None  # no number read directly
    fshape, numbers = _learned(g)
    assert numbers == (0.5, 0.5)
    try:
        _Cfg.T = 0.25
        assert fs.numbers_for(g) is None
    finally:
        _Cfg.T = 0.5
    assert fs.numbers_for(g) == (fshape, (0.5, 0.5))


def test_a_cells_value_rebound_is_read_anew():
    t = 0.5
    f = lambda v: v < t  # noqa: E731
    fshape, _ = _learned(f)
    for t in (0.1, -3.0, float("inf"), 0.5):  # noqa: B007 -- the closure reads it
        assert fs.numbers_for(f) == (fshape, (t,))


def test_a_learning_trace_under_other_values_learns_nothing():
    """The slots are learned only from a trace that gave the predicate's own tree and
    numbers: a predicate traced before a value was rebound teaches nothing."""
    from dask_compact.predicate.trace import trace

    t = 0.5
    f = lambda v: v < t  # noqa: E731
    p = trace(f)  # (as_predicate learns at once, from one reading of the values)
    t = 0.25
    fs.learn(f, p)
    assert fs.numbers_for(f) is None
    fs.learn(f, trace(f))
    assert fs.numbers_for(f)[1] == (0.25,)


def test_a_new_value_is_not_traced_and_compacts_as_numpy(monkeypatch):
    """as_predicate (every public call, every backend) gives a function of a learned shape
    its tree with its own numbers, untraced; compact_array on NumPy arrays then equals NumPy,
    ints outside the dtype included (typed and folded as a traced predicate is)."""
    import dask_compact
    from dask_compact.predicate import trace as trace_module

    rng = np.random.default_rng(3)
    h8 = rng.integers(-128, 128, 4099).astype(np.int8)
    hf = rng.standard_normal(4099).astype(np.float32)
    np.testing.assert_array_equal(dask_compact.compact_array(hf, _band(-0.5, 0.5)),
                                  hf[(hf > -0.5) & (hf < 0.5) | (hf == 7)])

    def no_trace(*args, **kwargs):
        raise AssertionError("traced")

    monkeypatch.setattr(trace_module, "trace", no_trace)
    for lo, hi in [(-1.5, 0.25), (0.0, 1e9), (float("-inf"), -2.0), (0.5, -0.5)]:
        got = dask_compact.compact_array(hf, _band(lo, hi))
        np.testing.assert_array_equal(got, hf[(hf > lo) & (hf < hi) | (hf == 7)])
    monkeypatch.undo()
    np.testing.assert_array_equal(dask_compact.compact_array(h8, _band(-5, 9)),
                                  h8[(h8 > -5) & (h8 < 9) | (h8 == 7)])
    monkeypatch.setattr(trace_module, "trace", no_trace)
    for lo, hi in [(-300, 20), (100, 300), (-129, -128), (126, 127), (2**70, -2**70)]:
        got = dask_compact.compact_array(h8, _band(lo, hi))
        np.testing.assert_array_equal(got, h8[(h8 > lo) & (h8 < hi) | (h8 == 7)])


def test_a_function_reading_a_module_is_traced_per_value(monkeypatch):
    """Its key reads the module's attributes live, beside the numbers: traced each value."""
    import dask_compact
    from dask_compact.predicate import trace as trace_module

    def make(t):
        return lambda v: np.abs(v) < t

    h = np.random.default_rng(4).standard_normal(1031)
    dask_compact.compact_array(h, make(0.5))
    traced = []
    real = trace_module.trace
    monkeypatch.setattr(trace_module, "trace", lambda f, *a: traced.append(f) or real(f, *a))
    for t in (0.25, 1.5):
        np.testing.assert_array_equal(dask_compact.compact_array(h, make(t)), h[np.abs(h) < t])
    assert len(traced) == 2

# --- 2026-12-02 (eighteenth session, a review): values that steer the trace unasked --------

def _served_as_traced(make, learned_at, later):
    """Learn ``make(learned_at)``'s shape, then check the invariant for each value of
    ``later``: where ``numbers_for`` serves ``make(t)``, a fresh trace of it (not the memo's)
    gives the learned tree and those very numbers."""
    f = make(learned_at)
    p = trace(f)
    assert p.expr is not None, p.reason
    fs.learn(f, p)
    for t in later:
        g = make(t)
        found = fs.numbers_for(g)
        if found is None:
            continue
        q = trace(g)
        assert q.expr == p.expr, (t, found)
        assert [value_key(v) for v in found[1]] == [value_key(v) for v in q.params], (t, found)


def _caught_conversion(t):
    def f(v):
        try:
            c = float(t)
        except TypeError:
            c = 1.0
        return v < c
    return f


def _caught_attribute(t):
    def f(v):
        try:
            c = t.real
        except AttributeError:
            c = 1.0
        return v < c
    return f


def _caught_arithmetic(t):
    def f(v):
        try:
            c = t + 0.0
        except Exception:  # noqa: BLE001 -- the probe: any error swallowed
            c = 1.0
        return v < c
    return f


def _class_attribute(t):
    return lambda v: v < (t if t.__class__ is float else 1.0)


_ISINSTANCE = isinstance  # a type test by another name: trace's own check looks for the name


def _isinstance_alias(t):
    return lambda v: v < (t if _ISINSTANCE(t, float) else 1.0)


def _match_class(t):
    def f(v):
        match t:
            case float():
                c = t
            case _:
                c = 1.0
        return v < c
    return f


@pytest.mark.parametrize("make", [_caught_conversion, _caught_attribute, _caught_arithmetic,
                                  _class_attribute, _isinstance_alias, _match_class])
def test_a_stand_used_and_the_error_caught_or_its_type_asked_learns_nothing(make):
    """The function's own code uses the number and catches the Stand's error, or asks its
    class (``t.__class__``, ``isinstance`` by another name, a class pattern): with the value
    learned from equal to the fallback (1.0) the fallback was learned as a literal, and until
    2026-12-02 ``make(3.0)`` was served (1.0,) where its trace gives (3.0,). Failed before
    the Stand noted its uses, every one of these."""
    _served_as_traced(make, 1.0, [3.0, -2.5, 1.0])
    assert fs.numbers_for(make(3.0)) is None


def test_a_stand_as_an_operand_notes_no_use():
    """The Stands of the shaped functions above are operands only: every way of meeting
    the array (reflected, in np.where and np.maximum) learns a shape."""
    for name in sorted(SHAPED):
        make, first = SHAPED[name]
        fs.forget()
        assert _learned(make(*first)) is not None, name


_D = 1.0  # a sentinel number: `t is _D` tells the object apart, not the value
_TYPE = type  # type by another name: trace's own check looks for the name `type`


def _identity(t):
    return lambda v: v < (t if t is not _D else 2.0)


def _identity_operator(t):
    import operator

    return lambda v: v < (t if operator.is_not(t, _D) else 2.0)


def _type_alias(t):
    return lambda v: v < (t if _TYPE(t) == float else 1.0)  # noqa: E721 -- == is no `is`


def _type_through_a_dunder(t):
    return lambda v: v < (t if float.__class__(t) == float else 1.0)  # noqa: E721


def _slot_called_on_it(t):
    return lambda v: v < (t if "float" in object.__repr__(t) else 1.0)


def _error_raised_unasked(t):
    def f(v):
        try:
            c = t if float.hex(t) else 1.0  # a Stand is no float: TypeError, unasked
        except TypeError:
            c = 1.0
        return v < c
    return f


@pytest.mark.parametrize("make, learned_at, later", [
    (_identity, 1.5, [_D, 3.0]),
    (_identity_operator, 1.5, [_D, 3.0]),
    (_type_alias, 1.0, [3.0]),
    (_type_through_a_dunder, 1.0, [3.0]),
    (_slot_called_on_it, 1.0, [3.0]),
    (_error_raised_unasked, 1.0, [3.0]),
])
def test_a_value_observed_without_asking_it_learns_nothing(make, learned_at, later):
    """What a Stand cannot note: the value's identity (``is``, ``operator.is_not``), its
    type (``type`` by another name, ``float.__class__``, a type's slot called on it) and an
    error raised by another without asking it, caught. Until 2026-12-02 each learned a
    shape whose numbers a later value's own trace does not give: ``_identity`` learned at
    1.5 served ``_D`` itself (1.0,) where its trace gives (2.0,), the others served (1.0,)
    for 3.0. Failed before, every one of these; none keeps a shape now."""
    _served_as_traced(make, learned_at, later)
    assert all(fs.numbers_for(make(t)) is None for t in later)


def test_is_none_and_comprehensions_keep_their_shape():
    """What the refusal above leaves alone: a test against None (a number is none) compiles
    to a jump of its own, and comprehensions and generators hold no handler."""
    def make(t, lo):
        def f(v):
            c = 0.0 if lo is None else lo
            out = (v < t) & (v > c)
            for m in (m for m in [v != k for k in (7, 8)]):
                out = out & m
            return out
        return f

    fshape, numbers = _learned(make(0.5, 0.25))
    assert numbers == (0.5, 0.25, 7, 8)
    _same_as_its_trace(make(0.75, -1.5), fshape)


@pytest.mark.parametrize("make", [_type_alias, _type_through_a_dunder, _slot_called_on_it])
def test_a_retrace_under_other_numbers_refuses_what_the_stand_did_not_see(make, monkeypatch):
    """The second witness (``_retraced``): with the static refusal lifted, a number's type
    observed without asking it (the ways above) still learns nothing, since a trace with
    another number does not give the numbers the Stand's branch learned. Failed before it
    (served (1.0,) for 3.0, as the test above found)."""
    monkeypatch.setattr(fs, "_unasked", lambda *args: False)
    _served_as_traced(make, 1.0, [3.0, 1.0, -0.0])
    assert fs.numbers_for(make(3.0)) is None


def test_a_retraces_numbers_are_apart_from_the_literals(monkeypatch):
    """The retrace's numbers differ from every literal and value learned from: one equal
    to the literal a Stand's branch learned would agree with it by the same coincidence.
    Here the fallback literal is the first number a retrace tries."""
    first = 0.6180339887
    assert fs._OTHER[float](0) == first

    def make(t):  # the literal in the code: a closure's number would be a place of its own
        return lambda v: v < (t if _TYPE(t) == float else 0.6180339887)  # noqa: E721

    monkeypatch.setattr(fs, "_unasked", lambda *args: False)
    _served_as_traced(make, first, [3.0])
    assert fs.numbers_for(make(3.0)) is None
    fs.forget()
    fshape, numbers = _learned(_band(first, fs._OTHER[int](0)))  # operands: kept
    assert numbers == (first, fs._OTHER[int](0), 7)
    _same_as_its_trace(_band(2.5, 4), fshape)


# --- a grammar of small predicates over three read numbers (a, b: floats; n: an int) -------
# Numbers drawn from a few values that the code's literals also hold, so that a value learned
# from often equals a literal (the coincidence every fault above needed); statements that
# steer by the numbers (a branch on them, a conversion in a try, a type test by another name,
# an identity test) beside operands.

_VALUES = (0.5, 1.0, -1.5, 2.0, 0.0, -0.0)
_SCALARS = ("a", "b", "n", "0.5", "1.0", "2", "-1.5")
_STEERED = ("(a * 2)", "(a if a > 0.5 else 1.0)", "float(b)", "(b or 0.5)", "max(a, 1.0)",
            "abs(a)", "-a", "(1.0, 2.0, 0.5)[n % 3]")
# operands all the same: a tuple's item, locals (c: 0.5 or the preamble's; d, e: b's)
_PASSED = ("(a, b)[0]", "c", "d", "e")
# mostly operands, so that a good share of the functions keep a shape to check
_ANY_SCALAR = _SCALARS * 3 + _PASSED + _STEERED
_PREAMBLES = (
    "", "", "", "",
    "    try:\n        c = float(a)\n    except TypeError:\n        c = 1.0\n",
    "    c = a if _ISINSTANCE(a, float) else 1.0\n",
    "    c = a if a is not _D else 2.0\n",
    "    c = a if _TYPE(b) == float else 0.5\n",
)


@st.composite
def _arrays(draw, depth=2):
    scalar = st.sampled_from(_ANY_SCALAR)
    if depth == 0 or draw(st.booleans()):
        return "v"
    inner = draw(_arrays(depth - 1))
    s = draw(scalar)
    return draw(st.sampled_from([f"({inner} + {s})", f"({s} * {inner})",
                                 f"np.maximum({inner}, {s})",
                                 f"np.where({inner} > {s}, {inner}, {s})", f"abs({inner})"]))


@st.composite
def _conditions(draw, depth=2):
    scalar = st.sampled_from(_ANY_SCALAR)
    e, s = draw(_arrays()), draw(scalar)
    leaf = draw(st.sampled_from([f"({e} < {s})", f"({s} >= {e})", f"({e} == {s})"]))
    if depth == 0 or draw(st.booleans()):
        return leaf
    other = draw(_conditions(depth - 1))
    return draw(st.sampled_from([f"({leaf} & {other})", f"({leaf} | {other})", f"~{leaf}"]))


@st.composite
def _sources(draw):
    lines = draw(st.sampled_from(_PREAMBLES)).splitlines()
    steered = bool(lines)  # c, the preamble's, is then an operand of the result
    if not lines:
        lines = ["    c = 0.5"]
    # d and e: locals of a number read (a walrus, or not); f2: a nested lambda with one
    # read as its default, which the returned condition goes through
    lines.append(draw(st.sampled_from(["    d = (e := b)", "    d = e = b"])))
    wrap = draw(st.booleans())
    if wrap:
        lines.append("    f2 = lambda w, k=n: w")
    if draw(st.booleans()):
        test = draw(st.sampled_from(["a > 0.5", "n == 2", "a", "b < a"]))
        lines += [f"    if {test}:", f"        return {draw(_conditions(1))}"]
    last = draw(_conditions())
    if steered:
        last = f"((v < c) & {last})"
    lines.append(f"    return f2({last})" if wrap else f"    return {last}")
    return "\n".join(lines) + "\n"


def _maker(source):
    text = "def make(a, b, n):\n    def f(v):\n" + "\n".join(
        "    " + line for line in source.splitlines()) + "\n    return f\n"
    ns = {"np": np, "_ISINSTANCE": _ISINSTANCE, "_D": _D, "_TYPE": _TYPE}
    exec(text, ns)  # noqa: S102 -- the generated predicate
    return ns["make"]


@settings(max_examples=200, deadline=None)
@given(source=_sources(),
       first=st.tuples(st.sampled_from(_VALUES), st.sampled_from(_VALUES),
                       st.sampled_from((0, 1, 2, 7))),
       later=st.lists(st.tuples(st.sampled_from(_VALUES + (3.25, _D)),
                                st.sampled_from(_VALUES + (3.25,)),
                                st.sampled_from((0, 1, 2, 5))), min_size=1, max_size=4))
def test_generated_predicates_are_served_only_what_their_trace_gives(source, first, later):
    """Any function of the grammar, learned at one set of numbers: every later set it is
    served for gets the tree and numbers its own trace gives."""
    fs.forget()
    make = _maker(source)
    try:
        p = trace(make(*first))
    except ValueError:
        return  # refused outright (a constant, a truth value asked): nothing to learn
    if p.expr is None:
        return
    fs.learn(make(*first), p)
    for values in later:
        g = make(*values)
        found = fs.numbers_for(g)
        if found is None:
            continue
        q = trace(g)
        assert q.expr == p.expr, (source, first, values)
        assert [value_key(v) for v in found[1]] == [value_key(v) for v in q.params], (
            source, first, values, found[1], q.params)


G_R = 0.5


def _rebound_cell():
    c = 0.25

    def f(v):
        return v < c

    def rebind(x):
        nonlocal c
        c = x

    return f, rebind


def test_a_shape_served_while_a_thread_rebinds_its_numbers_keeps_its_key_and_numbers_one():
    """as_predicate of a function of a learned shape (function_shape.like_traced, 2026-12-02,
    eighteenth session) while another thread rebinds the global and the closure cell it
    reads, thousands of times a second: the trace key each predicate is kept under
    (TRACED_UNDER, the memo's) names the very number its tree was given (both from one
    frozen copy), and each memo entry's results are NumPy's for its key's value. (A mutant
    taking the key from the live function instead of the copy failed here.)"""
    import random
    import sys
    import threading
    import time

    from dask_compact.predicate.core import _traced
    from dask_compact.predicate.memo import TRACED_UNDER

    global G_R
    g, rebind = _rebound_cell()
    f = lambda v: v > G_R  # noqa: E731 - a lambda is what users pass
    for x in (0.5, 0.75):  # both shapes learned
        G_R = x
        rebind(x)
        as_predicate(f), as_predicate(g)
    stop = threading.Event()

    def rebinder() -> None:
        global G_R
        rng = random.Random(3)
        while not stop.is_set():
            x = rng.random()
            G_R = x
            rebind(x)
            time.sleep(0)

    served = bad = 0
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=rebinder, daemon=True)
    thread.start()
    try:
        for i in range(4000):
            for fn, name in ((f, "G_R"), (g, None)):
                p = as_predicate(fn)
                key = p.memo.get(TRACED_UNDER)
                if key is None or p.expr is None:
                    continue
                served += 1
                number = value_key(p.params[0])
                bad += (name, number) not in key if name else number not in key
            if i % 50 == 0:
                _traced().clear()  # served by like_traced again, not the memo
    finally:
        stop.set()
        thread.join(10)
        sys.setswitchinterval(interval)
    assert served > 1000 and bad == 0, (served, bad)
    import dask_compact

    a = np.random.default_rng(4).standard_normal(3001)
    for p in list(_traced()._items.values()):  # each value's call served by the memo
        t = p.params[0]
        G_R = t
        rebind(t)
        if ("G_R", value_key(t)) in p.memo[TRACED_UNDER]:
            np.testing.assert_array_equal(dask_compact.compact_array(a, f), a[a > t])
        else:
            np.testing.assert_array_equal(dask_compact.compact_array(a, g), a[a < t])


def test_clear_cache_forgets_the_learned_shapes():
    """dask_compact.clear_cache() drops what this process keeps, the functions' learned shapes
    too (they hold their trees and codes; until 2026-12-02, eighteenth session, only the GPU's
    forget_ready_calls dropped them)."""
    import dask_compact

    f = _closure(0.5)
    assert _learned(f) is not None
    dask_compact.clear_cache()
    assert fs.numbers_for(f) is None and not fs._SLOTS and not fs._TREES
