"""Predicates that would silently depend on the chunking, or fail late, are refused up front.

Each case here gave a wrong answer, a RecursionError or an OverflowError inside the tasks
before the fixes of the reliability issue; now each gives NumPy's answer or a ValueError at
call time, before anything is computed.
"""

import functools
import itertools
import operator
import re

import dask
import dask.array as da
import numpy as np
import pytest

import dask_compact
from dask_compact.predicate import as_predicate
from dask_compact.predicate.trace import MAX_TREE_DEPTH, MAX_TREE_NODES, NotElementwise, TooLarge


@pytest.fixture
def x():
    return da.from_array(np.arange(10.0), chunks=5)


class _Counter(dask.callbacks.Callback):
    """Counts tasks run: a refusal must come before any."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def _pretask(self, key, dsk, state):
        self.n += 1


# The examples (NumPy on the whole array gives [5..9] and [] for the first two).
CHUNK_DEPENDENT = [
    lambda v: v > np.asarray(v).mean(),
    lambda v: v > v.size,
    lambda v: v.astype(float) > v.astype(float).mean(),
    lambda v: v > np.linalg.norm(v),
    lambda v: v > float(np.mean(np.asarray(v))),
    lambda v: v > np.nanpercentile(np.asarray(v), 50),
    lambda v: v > v.shape[0],
    lambda v: v.astype(float) > len(v.astype(float)),
    lambda v: v.astype(float) > np.max(np.sort(v.astype(float)), initial=0) - 3,
    lambda v: v.astype(float) > np.asarray(v.astype(float)).max() - 1,
]


@pytest.mark.parametrize("f", CHUNK_DEPENDENT)
def test_chunk_dependent_predicates_are_refused_before_running(x, f):
    counter = _Counter()
    with counter, pytest.raises(ValueError, match="elementwise|refused|reduction"):
        x.map_compact(f)
    assert counter.n == 0


@pytest.mark.parametrize("f, named", [
    (lambda v: np.cumsum(v) > 3, "`cumsum`"),
    (lambda v: np.multiply.accumulate(v) > 3, "`cumprod`"),
    (lambda v: np.maximum.accumulate(v) > 3, "`np.maximum.accumulate`"),
    (lambda v: np.logical_or.accumulate(v > 3), "`np.logical_or.accumulate`"),
])
def test_running_operations_are_named_as_written_and_point_to_compact(x, f, named):
    """Each running operation is named as the predicate wrote it, and the way out given is
    one that exists (dask_compact.compact with a boolean dask array; map_compact has no
    mask= parameter)."""
    with pytest.raises(ValueError, match="not elementwise") as info:
        x.map_compact(f)
    assert named in str(info.value) and "dask_compact.compact(x, m)" in str(info.value)
    assert "mask=" not in str(info.value)


def test_an_array_the_shape_of_the_input_in_a_predicate_is_refused_clearly():
    """NumPy accepts ``a[a > t]`` for ``t`` of ``a``'s shape; a predicate sees one chunk, or
    a slice of one, at a time: refused saying so, not with a broadcast error about shapes
    the caller never made."""
    a = np.arange(5.0)
    t = np.array([1.0, 5, 0, 9, 2])
    # the whole array broadcasts; its first rows alone (the slice check) do not
    # the shape said is the slice's, the chunk's own length beside it (until 2026-12-08 "rows
    # 0:2 of a chunk of shape (2,)", a probe); the way out in memory is NumPy's a[m]
    with pytest.raises(ValueError, match=r"failed on rows 0:2 of a chunk of 5 rows, an array "
                                         r"of shape \(2,\) .* at a time") as info:
        dask_compact.compact_array(a, lambda v: v > t)
    assert "dask_compact.compact(x, m)" in str(info.value) and "a[m]" in str(info.value)
    x = da.from_array(a, chunks=2)
    with pytest.raises(ValueError, match="at a time"):
        x.map_compact(lambda v: v > t)
    # an array that broadcasts against every slice still works in memory
    b = np.arange(12.0).reshape(4, 3)
    per_column = np.array([1.0, 5, 9])
    np.testing.assert_array_equal(dask_compact.compact_array(b, lambda v: v > per_column),
                                  b[b > per_column])


@pytest.mark.parametrize("n", [1, 33, 1025])
def test_a_predicate_returning_a_mask_of_the_whole_input_is_told_to_select_by_it(n):
    """``lambda v: mask``, ``mask`` a boolean array of the whole input, gave a chunk a mask of
    another shape: refused with the general "not elementwise: it returned shape (101,) for a
    chunk of shape (64,)" (a twelfth-session probe). Now refused naming the array it reads
    and pointing to selecting by the mask itself, which gives NumPy's answer."""
    a = np.random.default_rng(n).random(n + 2)
    mask = a > 0.5
    x = da.from_array(a, chunks=max(1, n // 2))
    for call in (lambda: x.map_compact(lambda v: mask),
                 lambda: dask_compact.compact_array(a, lambda v: mask),
                 lambda: dask_compact.compact_array(a[:n], lambda v: mask)):
        with pytest.raises(NotElementwise, match=r"it reads `mask` \(shape") as info:
            call()
        assert "dask_compact.compact(x, mask)" in str(info.value)
    np.testing.assert_array_equal(dask_compact.compact(x, mask).compute(), a[mask])
    np.testing.assert_array_equal(dask_compact.compact(x, da.from_array(mask, chunks=x.chunks))
                                  .compute(), a[mask])


def test_a_small_array_beside_a_wrong_shape_is_not_named_a_mask_of_the_whole_input():
    """A predicate that returns a mask of another shape while it reads a small array (a (1,)
    boolean constant, a lookup table it took part of) had that array named as "a mask of the
    whole input" and was told to select by it (a regression review, 2026-12-01, fourteenth
    session): the general refusal now, as before that wording; a mask of the whole input is
    still named."""
    a = np.random.default_rng(2).random(1031)
    x = da.from_array(a, chunks=100)
    one = np.array([True])
    table = np.array([True, False, True])
    for pred in (lambda v: one, lambda v: table[:2]):
        for call in (lambda: x.map_compact(pred), lambda: dask_compact.compact_array(a, pred)):
            with pytest.raises(NotElementwise, match="is not elementwise") as info:
                call()
            said = str(info.value)
            assert "from outside" not in said and "compact(x, mask)" not in said, said
    mask = a > 0.5
    with pytest.raises(NotElementwise, match=r"it reads `mask` \(shape \(1031,\)\)"):
        x.map_compact(lambda v: mask)
    # what works where it is meant: a broadcastable (1,) constant and a small lookup table
    np.testing.assert_array_equal(x.map_compact(lambda v: one & (v > 0.5)).compute(),
                                  a[one & (a > 0.5)])
    idx = (a * 3).astype(np.int64)
    np.testing.assert_array_equal(
        dask_compact.compact_array(idx, lambda v: table[v]), idx[table[idx]])


def test_an_array_aligned_with_nd_input_names_the_test_sample_not_a_chunk():
    """An (n, 1) array in a predicate on (n, 3) input is refused by the check on a sample of
    rows made before anything runs; the message called that sample "a chunk of shape (21,
    3)", a chunk the input (chunks of (4, 3)) never has (a probe)."""
    x = da.from_array(np.arange(39.0).reshape(13, 3), chunks=(4, 3))
    with pytest.raises(NotElementwise,
                       match=r"failed on a test sample, an array of shape \(21, 3\)") as info:
        x.map_compact(lambda v: v < np.zeros((13, 1)))
    assert "a chunk of shape" not in str(info.value)
    assert "dask_compact.compact(x, m)" in str(info.value)


def test_a_constant_aligned_with_the_rows_of_an_in_memory_array_is_told_why():
    """A (3, 1) constant on a (3, 100) array in memory: the call on the whole array works,
    its check on one row gives a (3, 100) mask; the refusal named only the shapes (and a
    "chunk" of one row), not the constant's broadcast that made it (a probe)."""
    b = np.random.default_rng(3).random((3, 100))
    c = np.array([[0.2], [0.5], [0.8]])
    with pytest.raises(NotElementwise, match=r"returned shape \(3, 100\) for rows 0:1") as info:
        dask_compact.compact_array(b, lambda v: v < c)
    assert "broadcast the input to a larger shape" in str(info.value)
    assert "each row's trailing axes" in str(info.value)
    # a mask of another shape that no broadcast made keeps the plain message
    with pytest.raises(NotElementwise, match=r"one boolean per element$"):
        dask_compact.compact_array(b, lambda v: np.ones((2, 2), bool))


@pytest.mark.parametrize("shape,chunks,const", [
    ((1001, 3), (97, 3), np.array([0.2, 0.5, 0.8])),  # blocks of whole rows
    ((1001, 3), (97, 2), np.array([0.2, 0.5, 0.8])),  # trailing axis split: rows made whole
    ((257, 2, 3), (31, 1, 3), np.array([[0.1, 0.5, 0.9], [0.9, 0.5, 0.1]])),
    ((257, 2, 3), (64, 2, 3), np.array([0.3, 0.6, 0.9])),
    # over two trailing axes: an empty flat chunk broadcasts to a (5, 0) mask, not an error
    ((203, 5, 3), (50, 5, 3), np.array([[0.5], [0.1], [0.9], [0.3], [0.6]])),
])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_per_column_constants_on_nd_input_select_as_numpy(shape, chunks, const, output):
    """``x < c`` with ``c`` broadcasting against the trailing axes, as NumPy's ``a[a < c]``
    (and compact_array) allow: map_compact evaluates the callable on blocks of whole rows;
    known chunk sizes, the elements in C order, lazy and rebalanced results alike."""
    a = np.random.default_rng(len(shape) + chunks[-1]).random(shape)
    x = da.from_array(a, chunks=chunks)
    m = a < const
    want = {"values": (a[m],), "indices": (np.flatnonzero(m),),
            "both": (a[m], np.flatnonzero(m))}[output]
    for kw in ({}, {"lazy": True}, {"chunks": 100}):
        got = x.map_compact(lambda v: v < const, output=output, **kw)
        got = got if isinstance(got, tuple) else (got,)
        for g, w in zip(got, want):
            if not kw.get("lazy"):
                assert not any(np.isnan(g.chunks[0]))
            np.testing.assert_array_equal(g.compute(), w)


def test_empty_nd_input_with_per_column_constants_is_empty():
    """Rows of no elements (a (5, 0, 3) input): nothing to select, whatever the constants
    broadcast against, as NumPy and compact_array give."""
    c3 = np.array([0.2, 0.5, 0.8])
    z = np.zeros((5, 0, 3))
    got = da.from_array(z, chunks=(2, 1, 1)).map_compact(lambda v: v < c3)
    assert got.shape == (0,) and got.compute().shape == (0,)
    assert dask_compact.compact_array(z, lambda v: v < c3).shape == (0,)


def test_a_reduction_past_the_tracer_is_refused_as_not_elementwise():
    """A callable that stops being traced (np.isin) and then reduces its chunk: refused as not
    elementwise before anything runs, not by the reduction's own error on an empty chunk."""
    x = da.from_array(np.random.default_rng(1).random(1000), chunks=100)
    with pytest.raises(NotElementwise, match="not elementwise"):
        x.map_compact(lambda v: np.isin(v, [-1.0]) | (v >= np.max(v)))


@pytest.mark.parametrize("cast, to", [
    (lambda v: np.float32(v) == v, "float32"),
    (lambda v: np.asarray(v, dtype=np.float16) > 1, "float16"),
    (lambda v: np.array(v, dtype="u1") > 1, "uint8"),
    (lambda v: np.bool_(v), "bool"),
])
def test_a_cast_through_a_numpy_type_is_told_to_use_astype(cast, to):
    """``np.float32(v)`` is an elementwise cast in NumPy, made through ``__array__``, which
    the tracer cannot record; the refusal's advice named statistics (a new-user probe,
    2026-12-03). It now names the cast and the ``astype`` that runs, before any task; and
    that ``astype`` gives NumPy's answer."""
    a = np.random.default_rng(4).standard_normal(1001) * 1e3
    a[::7] = np.round(a[::7])
    x = da.from_array(a, chunks=100)
    counter = _Counter()
    with counter, pytest.raises(NotElementwise, match=re.escape(f"v.astype('{to}')")):
        x.map_compact(cast)
    assert counter.n == 0
    with pytest.raises(NotElementwise, match=re.escape(f"v.astype('{to}')")):
        dask_compact.compact_array(a, cast)
    got = x.map_compact(lambda v: v.astype(to) == v).compute()
    np.testing.assert_array_equal(got, a[a.astype(to) == a])


def test_an_array_aligned_with_nd_input_is_still_refused():
    """Only constants that broadcast against blocks of whole rows are taken: one of the
    whole input's shape, or a statistic of a block, is refused as before."""
    a = np.random.default_rng(3).random((200, 3))
    x = da.from_array(a, chunks=(50, 3))
    with pytest.raises(ValueError, match="at a time"):
        x.map_compact(lambda v: v < a)
    with pytest.raises(ValueError, match="not elementwise"):
        x.map_compact(lambda v: v.astype(float) > v.astype(float).mean() + np.zeros(3))


def test_mask_path_slice_check_catches_what_the_tracer_cannot_see():
    """v.astype(...) is untraceable, so what follows it runs unseen: the slice check of every
    mask-path evaluation refuses a statistic of the chunk."""
    p = as_predicate(lambda v: v.astype(float) > v.astype(float).mean())
    assert p.path == "mask"
    with pytest.raises(NotElementwise, match="not elementwise"):
        p.mask(np.arange(100.0))
    # an elementwise mask-path predicate passes the check, on every chunk length
    q = as_predicate(lambda v: np.isin(v.astype(int) % 7, [1, 3]))
    for n in (0, 1, 2, 3, 31, 33, 64, 65, 1025):
        a = np.arange(n, dtype=np.int64)
        assert np.array_equal(q.mask(a), np.isin(a % 7, [1, 3]))


# A statistic that every part of a smooth chunk agrees on (a probe found both passing the
# head/tail slices: each chunk filtered against its own statistic, silently): refused by the
# checks of single rows and of the sample spread over the dtype's range.
def _adc(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = 200_000
    noise = np.concatenate([rng.normal(0, 10, n // 2), rng.normal(0, 50, n // 2)])
    return noise.round().astype(np.int16)


# (callable, data, chunk, whether a chunk's own rows tell: every part of an arange chunk
# agrees on v > v.mean() - 1000, only the sample's spread does not)
def _first_seen(v):
    """The first occurrence of each value: a chunk of distinct values, and any part of it,
    agrees with itself (every row selected), while values repeat from chunk to chunk."""
    _, first = np.unique(v.astype(np.float64), return_index=True)
    m = np.zeros(v.shape, bool)
    m[first] = True
    return m


# four chunks of the same 1000 distinct floats, shuffled (the float sample had no value twice)
_SEEN = np.concatenate([np.random.default_rng(s).permutation(1000) / 8 for s in range(4)])

STATISTIC_PAST_THE_TRACER = [
    (lambda v: v.astype(np.float64) > v.mean() - 1000, np.arange(1000, 11000), 1000, False),
    (lambda v: np.abs(v.astype(np.float64) - v.mean()) < 3 * v.std(), _adc(12), 10_000, True),
    (_first_seen, _SEEN, 1000, False),
]


@pytest.mark.parametrize("f, a, chunk, local", STATISTIC_PAST_THE_TRACER,
                         ids=["mean", "sigma-clip", "first-seen"])
def test_a_statistic_every_slice_agrees_on_is_refused(f, a, chunk, local):
    assert as_predicate(f).path == "mask"
    x = da.from_array(a, chunks=chunk)
    counter = _Counter()
    with counter, pytest.raises(NotElementwise, match="not elementwise"):
        x.map_compact(f, output="indices")
    assert counter.n == 0  # by the sample, before anything runs
    with pytest.raises(NotElementwise, match="not elementwise"):
        dask_compact.compact_records({"v": x, "w": x * 2}, lambda v: f(v))
    if local:  # and inside the tasks too: a chunk's single rows
        with pytest.raises(NotElementwise, match="not elementwise"):
            as_predicate(f).mask(a[:chunk])


def test_a_callable_failing_on_some_rows_of_a_chunk_is_not_elementwise():
    """np.sort(v)[-10] runs on a chunk but not on one row: refused as not elementwise (it
    raised IndexError with a note that blamed a chunk; a new-user probe)."""
    a = np.random.default_rng(6).standard_normal(1025)
    f = lambda v: v.astype(float) > np.sort(v.astype(float))[-10]
    for call in (lambda: dask_compact.compact_array(a, f),
                 lambda: da.from_array(a, chunks=300).map_compact(f)):
        with pytest.raises(NotElementwise, match=r"failed on rows 0:1 alone \(IndexError"):
            call()


_FLAKY: dict = {"error": None}


def _flaky_isin(m):
    """np.isin, failing on the slice check's 32 rows while _FLAKY holds an error."""
    if _FLAKY["error"] is not None and isinstance(m, np.ndarray) and m.size == 32:
        raise _FLAKY["error"]
    return np.isin(m, [True])


@pytest.mark.parametrize("error", [
    MemoryError("Unable to allocate 256. KiB"), OSError(5, "Input/output error"),
    TimeoutError("the store did not answer"), RecursionError("maximum recursion depth"),
], ids=lambda e: type(e).__name__)
def test_a_resource_error_in_the_slice_check_is_not_not_elementwise(error):
    """A MemoryError (or OSError...) of an elementwise mask-path callable on the rows 0:32
    that the slice check runs it on is passed on as it is, with the note naming the
    predicate: it is about resources, not how the callable depends on the chunking (it was
    reported as NotElementwise, "it depends on how the array is chunked", hiding the real
    error; a new-user probe, 2026-11-30). The same call again gives NumPy's answer."""
    a = np.random.default_rng(8).standard_normal(1001)
    f = lambda v: _flaky_isin(v > 0.5)  # noqa: E731
    want = a[a > 0.5]
    x = da.from_array(a, chunks=300)
    _FLAKY["error"] = error
    try:
        for call in (lambda: dask_compact.compact_array(a, f),
                     lambda: x.map_compact(f).compute(scheduler="threads")):
            with pytest.raises(type(error)) as info:
                call()
            assert not isinstance(info.value, NotElementwise)
            assert any("the predicate" in n for n in getattr(info.value, "__notes__", ())), info
    finally:
        _FLAKY["error"] = None
    np.testing.assert_array_equal(dask_compact.compact_array(a, f), want)
    np.testing.assert_array_equal(x.map_compact(f).compute(scheduler="threads"), want)


@pytest.mark.parametrize("f", [lambda v: v + 256 > 3, lambda v: v ** -1 > 0,
                               lambda v: np.maximum(v, 2**40) > 0])
def test_a_constant_numpy_refuses_with_overflow_error_is_one(f):
    """What NumPy raises as OverflowError (NEP 50: a Python int that does not fit the
    dtype) is an OverflowError here too, and still the ValueError of any refusal."""
    a = np.arange(10, dtype=np.uint8)
    with pytest.raises(OverflowError):
        f(a)
    for call in (lambda: dask_compact.compact_array(a, f),
                 lambda: da.from_array(a, chunks=3).map_compact(f)):
        with pytest.raises(OverflowError, match="does not fit uint8") as info:
            call()
        assert isinstance(info.value, ValueError)


def test_elementwise_mask_path_still_runs(x):
    got = x.map_compact(lambda v: np.isin(v, [1.0, 7.0])).compute()
    assert np.array_equal(got, np.array([1.0, 7.0]))


def test_random_predicates_are_refused(x):
    with pytest.raises(ValueError):
        x.map_compact(lambda v: np.random.random(v.shape) < 0.5)


@pytest.mark.parametrize(
    "text",
    [
        "x" + " < x" * 250,
        " and ".join(["x"] * 333),
        " | ".join(["(x > 1)"] * 240),
        "+".join(["x"] * 900) + " > 0",
    ],
)
def test_long_flat_chains_are_refused_clearly(x, text):
    with pytest.raises(ValueError, match="too large|nesting deeper|characters"):
        x.map_compact(text)


def test_long_traced_chains_are_refused_clearly(x):
    with pytest.raises(TooLarge):
        x.map_compact(lambda v: functools.reduce(operator.and_, [v > i for i in range(5000)]))
    # a shared subtree counts once per use: 2**40 paths would hang hashing and evaluation
    with pytest.raises(TooLarge):
        x.map_compact(lambda v: functools.reduce(lambda a, _: a + a, range(40), v) > 0)


def test_large_but_reasonable_predicates_still_compile_and_match_numpy():
    a = np.random.default_rng(0).integers(0, 200, 5003)
    codes = list(range(0, 200, 2))  # 100 alternatives: depth 101, 301 nodes
    text = " | ".join(f"(x == {c})" for c in codes)
    p = dask_compact.trace(text)
    assert p.path == "fused"
    x = da.from_array(a, chunks=1000)
    assert np.array_equal(x.map_compact(text).compute(), a[np.isin(a, codes)])
    deep = lambda v: (
        functools.reduce(lambda acc, i: acc + (v > i), range(MAX_TREE_DEPTH - 3), v) > 50
    )  # noqa: E731
    assert dask_compact.trace(deep).path == "fused"
    assert MAX_TREE_NODES >= 10 * MAX_TREE_DEPTH


@pytest.mark.parametrize(
    "dtype, text",
    [
        ("float64", "x > " + "1" * 1990),
        ("float64", "x > 10 ** 400"),
        ("int64", "x + 10 ** 30 > 0"),
        ("int8", "x + 1000 > 0"),
        ("float32", "x * " + "9" * 400 + " > 0"),
    ],
)
def test_literals_numpy_refuses_are_refused_before_anything_runs(dtype, text):
    x = da.from_array(np.arange(10).astype(dtype), chunks=5)
    with pytest.raises(ValueError, match="NumPy refuses"):
        x.map_compact(text)
    with pytest.raises(ValueError, match="NumPy refuses"):
        dask_compact.compact_array(np.arange(10).astype(dtype), text)


@pytest.mark.parametrize(
    "dtype, text",
    [
        ("int64", "x > " + "1" * 1990),
        ("int64", "x < 10 ** 30"),
        ("int8", "x > 1000"),
        ("uint8", "x > -1"),
        ("int64", "x > 2 ** 200"),
        ("float32", "x < 10 ** 30"),
        ("float64", "x < 1e400"),
    ],
)
def test_literals_numpy_compares_follow_numpy(dtype, text):
    a = np.arange(10).astype(dtype)
    x = da.from_array(a, chunks=5)
    expected = a[eval(text.replace("x", "a"))]  # noqa: S307 - fixed test strings
    assert np.array_equal(x.map_compact(text).compute(), expected)


def test_integer_power_limit_counts_bits_exactly():
    dask_compact.trace("x > 2 ** 4095")  # 4096 bits: at the limit
    with pytest.raises(ValueError, match="over 4096 bits"):
        dask_compact.trace("x > 2 ** 4096")
    with pytest.raises(ValueError, match="over 4096 bits"):
        dask_compact.trace("x > 10 ** 10 ** 9")


def test_error_messages_stay_short():
    with pytest.raises(ValueError) as e:
        dask_compact.compact_array(np.arange(3.0), "x > " + "1" * 1990)
    assert len(str(e.value)) < 600


@pytest.mark.parametrize("text, values", [
    ("power(x, -1) == 0", [3, 4, 5]),
    ("x ** -3 != 7", [3, 4, 5]),
    ("2 ** x > 1", [3, -1, 5]),
    ("(x > 100) & (x ** (x - 4) > 0)", [3, 4, 5]),  # NumPy computes every element
])
def test_negative_integer_powers_raise_as_numpy_does(text, values):
    """NumPy raises for a negative integer exponent; so do the CPU paths, and the guard the
    GPU paths run first (which cannot raise inside a kernel) finds the same exponents."""
    from dask_compact.predicate.expr import check_power_exponents

    a = np.array(values, dtype=np.int64)
    p = as_predicate(text)
    with pytest.raises(ValueError, match="Integers to negative integer powers"):
        np.asarray(a)[p.mask(a, np)]
    with pytest.raises(ValueError, match="Integers to negative integer powers"):
        dask_compact.compact_array(a, text)
    tp = p.typed(a.dtype)
    assert tp.powers
    with pytest.raises(ValueError, match="Integers to negative integer powers"):
        check_power_exponents(tp.powers, a, p.params, np)
    check_power_exponents(tp.powers, a[:0], p.params, np)  # nothing computed: no error


def test_powers_that_cannot_be_negative_need_no_check():
    """Float powers, unsigned and bool exponents, and non-negative ones answer as NumPy."""
    from dask_compact.predicate.expr import check_power_exponents

    a = np.array([0, 1, 2, 7], dtype=np.int64)
    for text in ("x ** 2 > 3", "2 ** x > 3", "x ** 1.5 > 1"):
        p = as_predicate(text)
        check_power_exponents(p.typed(a.dtype).powers, a, p.params, np)
        np.testing.assert_array_equal(dask_compact.compact_array(a, text), a[p.mask(a, np)])
    assert not as_predicate("x ** 1.5 > 1").typed(np.dtype(np.int64)).powers
    assert not as_predicate("x ** 2 > 3").typed(np.dtype(np.uint32)).powers


def test_exponent_checks_take_numpy_scalar_constants_and_know_what_needs_data():
    """A constant exponent is a NumPy scalar (np.int64(2)): its check must not hand it to the
    array module (CuPy refuses NumPy scalars), and it is settled once per predicate, where an
    exponent computed from the data is checked on every call."""
    from dask_compact.predicate.expr import check_power_exponents

    class DeviceOnly:  # an array module that, like CuPy, refuses anything but its arrays
        def __getattr__(self, name):
            def refuse(*args, **kwargs):
                raise TypeError(f"Unsupported type for {name}")
            return getattr(np, name) if name in ("power", "subtract", "add") else refuse

    a = np.arange(1, 6, dtype=np.int64)
    k = np.int64(2)
    p = as_predicate(lambda v: v ** k > 5)
    tp = p.typed(a.dtype)
    assert tp.powers and not tp.data_powers
    check_power_exponents(tp.powers, a, p.params, DeviceOnly())
    neg = as_predicate(lambda v: v ** np.int64(-2) > 5)
    with pytest.raises(ValueError, match="Integers to negative integer powers"):
        check_power_exponents(neg.typed(a.dtype).powers, a, neg.params, DeviceOnly())
    assert as_predicate("2 ** (x - 1) > 4").typed(a.dtype).data_powers
    assert not as_predicate("x ** 3 > 5").typed(a.dtype).data_powers


# `|`, `&` and `^` bind tighter than comparisons: without parentheses these are Python's
# chained comparisons (`x == (1 | x) == 2`), which ran on integers and selected other rows.
UNPARENTHESISED = [
    ("x == 1 | x == 2", "(x == 1) | (x == 2)"),
    ("x < 0 | x > 5", "(x < 0) | (x > 5)"),
    ("x > 0 & x < 3", "(x > 0) & (x < 3)"),
    ("x >= 2 ^ x <= 4", "(x >= 2) ^ (x <= 4)"),
]


@pytest.mark.parametrize("text, meant", UNPARENTHESISED)
@pytest.mark.parametrize("dtype", [np.int64, np.uint8, np.float32])
def test_unparenthesised_bitwise_chain_is_refused_with_the_fix(text, meant, dtype):
    a = np.arange(-5, 10).astype(dtype)
    x = da.from_array(a, chunks=4)
    for call in (lambda: dask_compact.compact_array(a, text),
                 lambda: x.map_compact(text),
                 lambda: dask_compact.compact_records({"x": a}, text)):
        with pytest.raises(ValueError, match="binds tighter than comparisons") as e:
            call()
        assert repr(meant) in str(e.value)
    # the parenthesised form is what was meant, and runs
    want = a[eval(meant, {"x": a})]
    np.testing.assert_array_equal(x.map_compact(meant).compute(), want)


PLAIN = {
    "0 < x < 3": lambda a: (0 < a) & (a < 3),
    "x & 1 == 1": lambda a: (a & 1) == 1,
    "(x | 1) == 3": lambda a: (a | 1) == 3,
    "-2 < x <= 4 < 9": lambda a: (-2 < a) & (a <= 4),
}


@pytest.mark.parametrize("text", list(PLAIN))
def test_plain_chains_and_bit_tests_still_run(text):
    a = np.arange(-5, 10)
    want = a[PLAIN[text](a)]
    np.testing.assert_array_equal(dask_compact.compact_array(a, text), want)
    np.testing.assert_array_equal(da.from_array(a, chunks=4).map_compact(text).compute(), want)


def test_constants_that_grow_through_functions_are_refused_at_once():
    """square(square(...(2**64))) doubles its digits at each level in Python's integers: 26
    levels (217 characters) took 34 s and 1.7 GB (a probe). Every constant operation is now
    bounded, so it is refused in no time, as is a long product of large powers."""
    import time

    a = np.linspace(-1, 1, 5)
    for text in ("x > " + "square(" * 40 + "2**64" + ")" * 40,
                 "x > " + "*".join(["(2**4095)"] * 150),
                 "x < " + "square(negative(" * 20 + "2**64" + "))" * 20):
        start = time.perf_counter()
        with pytest.raises(ValueError, match="bits"):
            dask_compact.compact_array(a, text)
        assert time.perf_counter() - start < 2
    ints = np.arange(-4, 8)
    np.testing.assert_array_equal(dask_compact.compact_array(ints, "x < square(2**20)"), ints)


def test_a_constant_too_long_to_print_still_gets_numpys_answer_or_error():
    """An integer over 4,300 digits cannot be repr'd: the error message raised that instead
    of NumPy's answer or error (a probe's v < 2**16384)."""
    big = 2**16384
    ints = np.arange(-4, 8)
    np.testing.assert_array_equal(dask_compact.compact_array(ints, lambda v: v < big),
                                  ints[ints < big])
    with pytest.raises(OverflowError, match="an integer of 16385 bits"):
        dask_compact.compact_array(ints.astype(float), lambda v: v < big)
    assert "16385 bits" in repr(dask_compact.trace(lambda v: v < big))


def test_a_callable_that_tests_its_arguments_type_runs_on_the_chunks():
    """The tracer's stand-in is no ndarray: isinstance(v, np.ndarray) was answered False and
    baked in, selecting the other half (a probe). Such a callable takes the mask path."""
    b = np.linspace(-1, 1, 5)

    def pred(v):
        return (v > 0) if isinstance(v, np.ndarray) else (v < 0)

    np.testing.assert_array_equal(dask_compact.compact_array(b, pred), b[pred(b)])
    assert dask_compact.trace(pred).path == "mask"
    x = da.from_array(b, chunks=2)
    np.testing.assert_array_equal(x.map_compact(pred).compute(), b[b > 0])


def test_a_callable_that_writes_into_its_argument_is_refused_and_changes_nothing():
    """A mask-path callable is run on the data itself and on parts of it for the checks: one
    that wrote in place (v *= 2) left the caller's array multiplied unevenly (a probe). It now
    gets a read-only view: refused, the data untouched, in memory and in a persisted input."""
    def doubles(v):
        v *= 2
        return np.isin(v, [2, 4, 8])

    def adds(v):
        np.add(v, 1, out=v)
        return np.isin(v, [2])

    c = np.arange(1, 9)
    with pytest.raises(ValueError, match="writes into its argument"):
        dask_compact.compact_array(c, doubles)
    np.testing.assert_array_equal(c, np.arange(1, 9))
    held = np.arange(1, 9)
    x = da.from_array(held, chunks=3).persist()
    with pytest.raises(ValueError, match="writes into its argument"):
        x.map_compact(adds)
    np.testing.assert_array_equal(x.compute(), np.arange(1, 9))

    def record(mass, energy):
        mass += 1
        return np.isin(mass, [2]) & (energy > 0)

    fields = {"mass": np.arange(1, 9), "energy": np.ones(8)}
    with pytest.raises(ValueError, match="writes into its argument"):
        dask_compact.compact_records(fields, record)
    np.testing.assert_array_equal(fields["mass"], np.arange(1, 9))


def test_a_callable_that_makes_its_argument_writeable_is_refused_and_changes_nothing():
    """The read-only view a mask-path callable gets was a view of the caller's writeable
    array, so ``setflags(write=True)`` turned writing back on: the call selected the values
    written, and the caller's array was left changed (compact_array raised NotElementwise
    after writing; a records probe, 2026-12-06). The view's base is now no array: refused
    before anything is written, also on the parts of a chunk the checks call it on."""
    def sevens(v):
        m = np.isin(v, [1, 2, 3])
        v.setflags(write=True)
        v[:] = 7
        return m

    calls = []

    def sevens_on_a_part(v):  # from its second call on: the parts the checks call it on
        calls.append(1)
        if len(calls) % 2 == 0:
            v.setflags(write=True)
            v[:] = 7
        return np.isin(v, [1, 2, 3])

    for pred in (sevens, sevens_on_a_part):
        calls.clear()
        c = np.arange(1, 9)
        with pytest.raises(ValueError, match="writes into its argument"):
            dask_compact.compact_array(c, pred)
        np.testing.assert_array_equal(c, np.arange(1, 9))
        held = da.from_array(np.arange(1, 9), chunks=4).persist()
        with pytest.raises(ValueError, match="writes into its argument"):
            held.map_compact(pred).compute()
        np.testing.assert_array_equal(held.compute(), np.arange(1, 9))

    def record(a, b):
        return sevens(a) & (b > 0)

    fields = {"a": np.arange(1, 9), "b": np.ones(8)}
    with pytest.raises(ValueError, match="writes into its argument"):
        dask_compact.compact_records(fields, record)
    with pytest.raises(ValueError, match="writes into its argument"):
        dask_compact.compact_records_into(fields, record, {"a": np.empty(8, np.int64)})
    np.testing.assert_array_equal(fields["a"], np.arange(1, 9))


@pytest.mark.parametrize("a", [
    np.arange(7.0), np.arange(20)[::3], np.arange(12.0).reshape(3, 4)[:, 1:3],
    np.arange(6, dtype=">i4"), np.zeros(0), np.ones(()), np.array(["ab", "c"]),
    np.array([1, "a", None], dtype=object), np.arange(4).astype("M8[s]"),
    np.zeros(3, dtype=np.dtype({"names": ["a", "b"], "formats": ["f8", "i1"],
                                "offsets": [0, 12], "itemsize": 16})),
    np.rec.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]), np.matrix([[1, 2]]),
], ids=lambda a: f"{type(a).__name__}-{a.dtype}-{a.shape}")
def test_a_frozen_view_is_the_array_and_stays_read_only(a):
    """core.frozen (what a mask-path callable gets of a NumPy chunk): the same dtype (a
    structured one with gaps too: the array interface names its padding), shape, type and
    values, read-only, and neither it nor a part of it can be made writeable."""
    from dask_compact.predicate.core import frozen

    v = frozen(a)
    assert (v.dtype, v.shape, type(v)) == (a.dtype, a.shape, type(a))
    assert a.dtype == object or v.tobytes() == a.tobytes()
    for view in (v, v[1:] if v.ndim else v):
        assert not view.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            view.setflags(write=True)
        assert frozen(view) is view  # a part of a frozen chunk is not wrapped again
        # no writeable array through `.base` (the caller's was, until a review)
        b = view.base
        while b is not None:
            assert not (isinstance(b, np.ndarray) and b.flags.writeable)
            b = getattr(b, "base", None)


def test_a_dtype_the_array_interface_cannot_say_gets_a_read_only_view():
    """NumPy's StringDType has no array-interface form: core.frozen falls back to a plain
    read-only view of it rather than fail (the calls refuse that dtype before a callable
    sees it; this keeps frozen total)."""
    from dask_compact.predicate.core import frozen

    a = np.array(["a", "bb"], dtype=np.dtypes.StringDType())
    v = frozen(a)
    assert v.dtype == a.dtype and not v.flags.writeable and a.flags.writeable
    assert list(v) == ["a", "bb"]


def _adds_in_place(v):
    v += 1
    return v > 1


def _adds_to_a_view(v):
    w = v.real
    w *= 2
    return w > 1


def _adds_through_another_name(v):
    w = v
    w -= 1
    return w > 0


def _adds_to_a_new_array(v):
    w = v * 1
    w += 1
    return w > 1


@pytest.mark.parametrize("pred", [_adds_in_place, _adds_to_a_view, _adds_through_another_name])
def test_a_traceable_callable_writing_into_its_argument_is_refused_too(pred):
    """An augmented assignment to the argument (``v += 1``) in a callable the tracer fuses was
    taken as ``v = v + 1``: the elements were selected by values never written, where NumPy
    changes the caller's array and the same line beside anything untraceable was refused
    (a probe, 2026-12-06). Refused now on every path, the data untouched; on an array the
    function made itself the augmented assignment is NumPy's."""
    c = np.array([-1.0, 0.5, 2.0, 3.5])
    with pytest.raises(ValueError, match="writes into its argument"):
        dask_compact.compact_array(c, pred)
    with pytest.raises(ValueError, match="writes into its argument"):
        da.from_array(c, chunks=2).map_compact(pred)
    np.testing.assert_array_equal(c, [-1.0, 0.5, 2.0, 3.5])

    def record(energy, mass):
        return pred(mass) & (energy > 0)

    fields = {"energy": np.ones(4), "mass": c}
    with pytest.raises(ValueError, match="writes into its argument `mass`"):
        dask_compact.compact_records(fields, record)
    np.testing.assert_array_equal(c, [-1.0, 0.5, 2.0, 3.5])


def test_an_augmented_assignment_to_a_new_array_is_numpys():
    c = np.array([-1.0, 0.5, 2.0, 3.5])
    assert dask_compact.trace(_adds_to_a_new_array).path == "fused"
    want = c[_adds_to_a_new_array(c)]
    np.testing.assert_array_equal(dask_compact.compact_array(c, _adds_to_a_new_array), want)
    got = da.from_array(c, chunks=3).map_compact(_adds_to_a_new_array).compute()
    np.testing.assert_array_equal(got, want)


# A chain whose bitwise operand the text shows in parentheses is the chain written, as any
# chain: `0 < (x & 3) < 2` is `(0 < (x & 3)) & ((x & 3) < 2)` (ast drops the parentheses).
PARENTHESISED = {
    "0 < (x & 3) < 2": lambda a: (0 < (a & 3)) & ((a & 3) < 2),
    "1 <= (x | 2) <= 3": lambda a: (1 <= (a | 2)) & ((a | 2) <= 3),
    "0 < (x ^ 1) < 5": lambda a: (0 < (a ^ 1)) & ((a ^ 1) < 5),
    "(x & 3) == 1 == True": lambda a: ((a & 3) == 1) & (1 == True),  # noqa: E712
    "0 < ( (x & 3) ) < 2": lambda a: (0 < (a & 3)) & ((a & 3) < 2),
    "0 < (\n  x & 3\n) < 2": lambda a: (0 < (a & 3)) & ((a & 3) < 2),
}


@pytest.mark.parametrize("text", list(PARENTHESISED))
@pytest.mark.parametrize("dtype", [np.int64, np.uint8])
def test_parenthesised_bitwise_operand_of_a_chain_runs_as_numpy(text, dtype):
    a = np.arange(-4, 8).astype(dtype)
    want = a[PARENTHESISED[text](a)]
    np.testing.assert_array_equal(dask_compact.compact_array(a, text), want)
    np.testing.assert_array_equal(da.from_array(a, chunks=4).map_compact(text).compute(), want)


@pytest.mark.parametrize(
    "text",
    [
        "0 < (x) & (3) < 2",  # the parentheses are the operands', not the `&`'s
        "0 < (x & 3) < 2 | x < 1",
        "(1 < 0 < # (\n x & 3\n)",  # the `(` is a comment's: refused, conservatively
    ],
)
def test_bitwise_operand_without_its_own_parentheses_is_still_refused(text):
    with pytest.raises(ValueError, match="binds tighter than comparisons"):
        dask_compact.compact_array(np.arange(-4, 8), text)


def test_bare_bitwise_chain_message_shows_both_readings_and_neither_as_the_other():
    a = np.arange(-4, 8)
    with pytest.raises(ValueError) as e:
        dask_compact.compact_array(a, "0 < x & 3 < 2")
    msg = str(e.value)
    assert "reads as the chained comparison '0 < (x & 3) < 2'" in msg
    assert "put each comparison in parentheses: '(0 < x) & (3 < 2)'" in msg
    # both forms it offers run, each as NumPy reads it
    np.testing.assert_array_equal(dask_compact.compact_array(a, "(0 < x) & (3 < 2)"),
                                  a[(0 < a) & (3 < 2)])
    np.testing.assert_array_equal(dask_compact.compact_array(a, "0 < (x & 3) < 2"),
                                  a[(0 < (a & 3)) & ((a & 3) < 2)])


@pytest.mark.parametrize(
    "pred",
    ["where(x > 0, x)", lambda v: np.where(v > 0, v)],
    ids=["string", "lambda"],
)
def test_where_with_two_arguments_says_it_takes_three(pred):
    with pytest.raises(ValueError, match=r"takes three, where\(cond, a, b\)") as e:
        dask_compact.compact_array(np.arange(-4, 8), pred)
    assert "indices" not in str(e.value)
    with pytest.raises(ValueError, match="either both or neither"):
        np.where(np.arange(3) > 0, np.arange(3))  # NumPy's own word for it


# Comparisons with a Python int outside the compared integer's dtype: NumPy 2 (NEP 50)
# compares by value, every element alike (uint8 != -1 is all True). Binding such a constant
# failed (ParamOverflow), which sent the chunks to NumPy-style evaluation: the mask path on
# CPUs, CuPy's ufuncs on GPUs (which flush float32 subnormals elsewhere in the predicate).
# Now the comparison is folded into a boolean constant and the compiled loop runs.
INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
COMPARISONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
               "==": operator.eq, "!=": operator.ne}
FUNCTIONS = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
             "==": np.equal, "!=": np.not_equal}


def _outside(dtype: str) -> list[int]:
    """Python ints outside ``dtype``: just past each end, and past int64 and uint64."""
    info = np.iinfo(dtype)
    wide = [int(info.min) - 1, int(info.max) + 1, 2**64, -(2**63) - 1, 2**70, -(2**70), 2**63]
    return [c for c in dict.fromkeys(wide) if not info.min <= c <= info.max]


def _inside(dtype: str) -> list[int]:
    info = np.iinfo(dtype)
    return [int(info.min), int(info.max), 0]


def _no_mask_path(monkeypatch) -> None:
    """Make the CPU mask path fail: the fused loop must run."""
    from dask_compact.backends import numpy_backend

    def refuse(*args, **kwargs):
        raise AssertionError("the mask path ran")

    monkeypatch.setattr(numpy_backend, "compact_masked", refuse)


@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_comparisons_with_ints_outside_the_dtype_run_fused_as_numpy(dtype, monkeypatch):
    from conftest import random_array

    from dask_compact.backends.numpy_backend import compact

    _no_mask_path(monkeypatch)
    rng = np.random.default_rng(len(dtype))
    arrays = [random_array(rng, (n,), dtype) for n in (0, 1, 33, 1025)]
    for (op, cmp), c, left in itertools.product(COMPARISONS.items(), _outside(dtype),
                                                (False, True)):
        side = f"{c} {op} x" if left else f"x {op} {c}"
        pred = as_predicate(f"({side}) | (x == 7)")  # one loop per dtype: the fold is a constant
        for a in arrays:
            want = (cmp(c, a) if left else cmp(a, c)) | (a == 7)
            got = compact(a, pred, "indices", True, None, 0)
            assert np.array_equal(got, np.flatnonzero(want)), (side, a.size)
        assert pred.typed(np.dtype(dtype)).folds, side
        # the function form, traced, and the answer of a chunk of one
        fn = FUNCTIONS[op]
        traced = as_predicate((lambda v: fn(c, v)) if left else (lambda v: fn(v, c)))
        a = arrays[1]
        want = np.flatnonzero(fn(c, a) if left else fn(a, c))
        assert np.array_equal(compact(a, traced, "indices", True, None, 0), want), side


@pytest.mark.parametrize("dtype", ["uint8", "int64", "uint64"])
def test_comparisons_with_ints_inside_the_dtype_are_not_folded(dtype, monkeypatch):
    from conftest import random_array

    from dask_compact.backends.numpy_backend import compact

    _no_mask_path(monkeypatch)
    a = random_array(np.random.default_rng(5), (333,), dtype)
    for (op, cmp), c, left in itertools.product(COMPARISONS.items(), _inside(dtype),
                                                (False, True)):
        side = f"{c} {op} x" if left else f"x {op} {c}"
        pred = as_predicate(side)
        assert not pred.typed(np.dtype(dtype)).folds, side
        want = np.flatnonzero(cmp(c, a) if left else cmp(a, c))
        assert np.array_equal(compact(a, pred, "indices", True, None, 0), want), side


def test_what_numpy_does_not_compare_by_value_is_not_folded():
    a = np.array([True, False, True])
    # a bool array meets a Python int in int64: one outside int64 is NumPy's OverflowError
    for text in ("x == 2**63", "x < 2**64", "x != -(2**63) - 1"):
        with pytest.raises(OverflowError):
            eval(text.replace("x", "a"))  # noqa: S307 - fixed test strings
        with pytest.raises(ValueError, match="NumPy refuses"):
            dask_compact.compact_array(a, text)
    # ... and one inside it is not folded, nor is a NumPy scalar (strong: uint8 != int64(-1)
    # compares in int64), nor arithmetic with the constant, which NumPy refuses
    assert np.array_equal(dask_compact.compact_array(a, "x != -1"), a[a != -1])
    u = np.arange(5, dtype=np.uint8)
    strong = as_predicate(lambda v: v != np.int64(-1))
    assert not strong.typed(u.dtype).folds
    assert np.array_equal(dask_compact.compact_array(u, strong), u)
    with pytest.raises(ValueError, match="NumPy refuses"):
        dask_compact.compact_array(u, "(x != -1) & (x + 300 > 0)")


@pytest.mark.parametrize("dtype, pred", [
    ("uint8", "(x + 300) != -1"), ("uint8", lambda v: (v << 300) != -1),
    ("uint8", "(x + -1) != -1"), ("int8", lambda v: np.maximum(v, 1000) != -1000),
    ("int8", lambda v: (v ** (v + 1)) > 200), ("int16", "70000 < (x ** (x - 1))"),
])  # fmt: skip
def test_a_comparison_whose_operand_numpy_refuses_is_not_folded_away(dtype, pred):
    """The fold drops the comparison's other side from the tree: where NumPy raises in it
    (a constant outside its loop dtype: OverflowError; a negative integer power: ValueError)
    the call must raise too. A regression probe found these answering (everything or
    nothing selected) after the fold was added."""
    a = np.arange(-5, 6).astype(dtype) if dtype[0] == "i" else np.arange(11, dtype=dtype)
    with pytest.raises((OverflowError, ValueError)):
        with np.errstate(all="ignore"):
            eval(pred, {"x": a}) if isinstance(pred, str) else pred(a)  # noqa: S307
    with pytest.raises((OverflowError, ValueError)):
        dask_compact.compact_array(a, pred)
    with pytest.raises((OverflowError, ValueError)):
        da.from_array(a, chunks=3).map_compact(pred).compute()
    if isinstance(pred, str):
        with pytest.raises((OverflowError, ValueError)):
            dask_compact.compact_records(
                {"x": a, "e": np.ones(a.size, np.float32)}, f"({pred}) & (e > 0)")


def test_a_slot_inside_then_outside_then_inside_the_dtype(monkeypatch):
    """The same tree with a constant inside, then outside the dtype, and back: the folded
    tree has its own key, so neither takes the other's compiled loop (or bound constants)."""
    from dask_compact.backends.numpy_backend import compact

    _no_mask_path(monkeypatch)
    a = np.arange(256, dtype=np.uint8)
    preds = []
    for t in (7, -1, 7, 300, 0, -1, 255, 256):
        for op, cmp in COMPARISONS.items():
            pred = as_predicate(f"(x {op} {t}) & (x < 100)")
            want = np.flatnonzero(cmp(a, t) & (a < 100))
            assert np.array_equal(compact(a, pred, "indices", True, None, 0), want), (op, t)
            preds.append((op, pred.typed(a.dtype)))
    keys: dict = {}
    for op, tp in preds:
        keys.setdefault((op, bool(tp.folds)), set()).add(tp.key)
    for op in COMPARISONS:
        assert len(keys[op, True]) == len(keys[op, False]) == 1
        assert keys[op, True] != keys[op, False]


def test_folded_trees_shared_by_two_comparisons_keep_their_own_values():
    """``x == -1`` and ``x != -1`` fold to the same tree (a boolean constant): one compiled
    loop or GPU functor, each predicate with its own value."""
    from dask_compact.backends import cupy_modules

    built = []

    def generate(tp):
        built.append(tp.expr)
        return object()

    dt = np.dtype(np.uint16)
    a = np.arange(10, dtype=dt)
    got = {}
    for op in ("==", "!=", "<", ">"):
        pred = as_predicate(f"(x {op} -1) | (x > 5)")
        tp, functor = cupy_modules.typed_functor(dt, pred, generate)
        got[op] = (functor, bool(tp.bind(pred.params)[-1]))
        assert np.array_equal(dask_compact.compact_array(a, pred),
                              a[COMPARISONS[op](a, -1) | (a > 5)])
    assert len(built) == 1 and len({f for f, _ in got.values()}) == 1
    assert {op: v for op, (_, v) in got.items()} == {"==": False, "!=": True, "<": False,
                                                     ">": True}


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
@pytest.mark.parametrize("text, op", [("~x", "~"), ("(x & 1) == 1", "&"), ("(x | 2) > 0", "|"),
                                      ("x << 1 > 2", "<<"), ("x >> 1 > 2", ">>")])
def test_bitwise_operators_on_floats_name_the_operator_and_the_form_that_works(dtype, text, op):
    """NumPy's own refusal ("ufunc 'invert' not supported for the input types, and the inputs
    could not be safely coerced ...") named no operator and no way out (a new-user probe,
    2026-12-01, fourteenth session); integers keep NumPy's bitwise answer."""
    a = (np.random.default_rng(3).random(33) * 8).astype(dtype)
    for pred in (text, eval("lambda x: " + text)):  # noqa: S307 -- the test's own literals
        with pytest.raises(TypeError, match=rf"\('{re.escape(op)}'\) is not defined for "
                                            rf"\({dtype}") as e:
            dask_compact.compact_array(a, pred)
        assert ("(x > 0) & (x < 1)" in str(e.value)) == (op in "~&|^")
        assert ("x * 2" in str(e.value)) == (op in ("<<", ">>"))
    if op != "~":  # (~x on integers is a number, not a condition)
        ints = np.arange(33)
        np.testing.assert_array_equal(dask_compact.compact_array(ints, text),
                                      ints[eval("lambda x: " + text)(ints)])  # noqa: S307
