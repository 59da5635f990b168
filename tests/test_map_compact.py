"""map_compact against NumPy: chunkings, sizes, selectivities, dtypes, N-D, outputs, modes."""

from __future__ import annotations

import math
import re
import threading

import dask
import dask.array as da
import numpy as np
import pytest
from chunk_shape_helpers import LENGTHS, SHAPES, misdeclared, refusal
from conftest import (
    DTYPES,
    HIDDEN_TIMES,
    LOSSY_TIMES,
    chunk_dtypes,
    hidden_times,
    random_array,
    threshold_predicate,
)

import dask_compact
from dask_compact.predicate.trace import NotElementwise

SIZES = [0, 1, 31, 33, 1023, 1025, 7919]
PS = [0, 0.05, 0.5, 0.95, 1]


def expected(a: np.ndarray, pred, output: str):
    m = np.asarray(pred(a))
    v, i = a[m], np.flatnonzero(m)
    return {"values": (v,), "indices": (i,), "both": (v, i)}[output]


def check(x: da.Array, a: np.ndarray, pred, output="values", **kw):
    got = x.map_compact(pred, output=output, **kw)
    got = got if output == "both" else (got,)
    for g, e in zip(got, expected(a, pred, output)):
        assert g.ndim == 1
        if not kw.get("lazy"):
            assert not any(math.isnan(c) for c in g.chunks[0]), (
                "eager result must have known chunks"
            )
            assert g.shape == e.shape
        r = g.compute()
        assert r.dtype == e.dtype
        np.testing.assert_array_equal(r, e)
    if output == "both":
        assert got[0].chunks == got[1].chunks
    return got


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("p", PS)
def test_sizes_and_selectivity(n, p):
    rng = np.random.default_rng(n * 7 + int(p * 100))
    a = rng.random(n).astype(np.float32)
    pred = threshold_predicate(a, p)
    for chunks in (max(n // 3, 1), 16, n or 1):
        check(da.from_array(a, chunks=chunks), a, pred)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_dtypes_and_outputs(dtype, output):
    rng = np.random.default_rng(abs(hash((dtype, output))) % 2**32)
    a = random_array(rng, 1025, dtype)
    for p in (0.05, 0.5):
        check(da.from_array(a, chunks=(100,)), a, threshold_predicate(a, p), output)


@pytest.mark.parametrize("p", [0, 1])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_empty_and_full_selection(p, output):
    a = np.random.default_rng(1).random(333)
    check(da.from_array(a, chunks=50), a, threshold_predicate(a, p), output)


@pytest.mark.parametrize(
    "chunks", [(1,) * 9, (2, 7), (9,), (3, 0, 6), (4, 1, 1, 3)], ids=lambda c: "-".join(map(str, c))
)
def test_uneven_and_tiny_chunks(chunks):
    a = np.random.default_rng(2).random(9)
    for output in ("values", "indices", "both"):
        check(da.from_array(a, chunks=(chunks,)), a, lambda v: v > 0.4, output)


@pytest.mark.parametrize(
    "shape,chunks",
    [
        ((7, 11), (3, 4)),
        ((7, 11), (2, 11)),
        ((4, 5, 6), (2, 3, 4)),
        ((1, 1), (1, 1)),
        ((0, 5), (1, 2)),
    ],
)
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_nd_c_order(shape, chunks, output):
    a = np.random.default_rng(3).standard_normal(shape)
    check(da.from_array(a, chunks=chunks), a, lambda v: v > 0.1, output)


def test_zero_d():
    a = np.array(3.5)
    check(da.from_array(a), a, lambda v: v > 1, "both")


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_lazy_equals_eager(output):
    a = np.random.default_rng(4).random(1000)
    x = da.from_array(a, chunks=128)
    got = check(x, a, lambda v: v < 0.3, output, lazy=True)
    for g in got:
        assert all(math.isnan(c) for c in g.chunks[0])


def test_lazy_computes_nothing_at_call_time():
    calls = []

    def source(b):
        calls.append(1)
        return b

    x = da.from_array(np.arange(100.0), chunks=10).map_blocks(source, meta=np.empty(0))
    y = x.map_compact("x > 50", lazy=True)
    assert calls == []
    np.testing.assert_array_equal(y.compute(), np.arange(51.0, 100.0))


@pytest.mark.parametrize("chunks", [1, 7, 100, 10_000, "auto"])
@pytest.mark.parametrize("output", ["values", "both"])
def test_rebalanced_output_chunks(chunks, output):
    a = np.random.default_rng(5).random(2000)
    got = check(
        da.from_array(a, chunks=(300, 1, 900, 799)), a, lambda v: v > 0.25, output, chunks=chunks
    )
    sizes = got[0].chunks[0]
    if chunks != "auto":
        assert all(s == chunks for s in sizes[:-1]) and 0 < sizes[-1] <= chunks


@pytest.mark.parametrize("chunks", [1000, "auto"])
@pytest.mark.parametrize("q", [2.0, 0.1])  # nothing selected, most
def test_both_outputs_of_a_rebalanced_call_share_their_chunks(chunks, q):
    """values and indices come back with identical chunks, "auto" included (dask sized each
    by its own dtype: float32 values in chunks twice as long as int64 indices) and an empty
    selection (dask left the empty chunks as they were)."""
    n = 2**25 if chunks == "auto" else 2**16  # "auto" splits only past 128 MiB
    a = np.random.default_rng(9).random(n).astype(np.float32)
    x = da.from_array(a, chunks=n // 8)
    v, i = x.map_compact(lambda t: t > q, output="both", chunks=chunks)
    assert v.chunks == i.chunks
    if q > 1:
        assert v.chunks == ((0,),)
    elif chunks == "auto":
        assert len(v.chunks[0]) > 1  # 30M int64 indices: more than one 128 MiB chunk
    np.testing.assert_array_equal(v.compute(), a[a > q])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(a > q))
    assert [b.compute().shape[0] for b in v.blocks] == list(v.chunks[0])


def test_unknown_chunk_input_works_for_all_outputs():
    a = np.random.default_rng(6).random(3000)
    x = da.from_array(a, chunks=250)
    u = x[x > 0.2]  # nan chunk sizes
    au = a[a > 0.2]
    for output in ("values", "indices", "both"):
        for lazy in (False, True):
            check(u, au, lambda v: v < 0.6, output, lazy=lazy)


def test_unknown_chunk_nd_input_raises_clear_error():
    x = da.ones((4, 4), chunks=2)
    u = x[x > 0].reshape((-1,))  # 1-D unknown is fine ...
    u2 = da.stack([u, u])  # ... but 2-D unknown cannot be put in C order
    with pytest.raises(ValueError, match="compute_chunk_sizes"):
        u2.map_compact("x > 0")


def test_no_chunk_computed_twice_and_no_recompute():
    lock = threading.Lock()
    runs: dict[int, int] = {}

    def source(b, block_info=None):
        with lock:
            i = block_info[0]["chunk-location"][0]
            runs[i] = runs.get(i, 0) + 1
        return b

    a = np.random.default_rng(7).random(10_000)
    x = da.from_array(a, chunks=1000).map_blocks(source, dtype=a.dtype)
    with dask.config.set(scheduler="threads"):
        v, i = x.map_compact(lambda q: q > 0.5, output="both", chunks=700)
        assert runs == {k: 1 for k in range(10)}
        # Using the result in every way a user would does not run the source again.
        np.testing.assert_array_equal(v.compute(), a[a > 0.5])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(a > 0.5))
        assert len(v) == (a > 0.5).sum()
        float(v[10:2000].sum().compute())
        v.rechunk(333).compute()
        assert runs == {k: 1 for k in range(10)}


def test_same_result_under_sync_threads_and_processes():
    a = np.random.default_rng(8).random(5000)
    x = da.from_array(a, chunks=600)
    for scheduler in ("sync", "threads", "processes"):
        with dask.config.set(scheduler=scheduler):
            v, i = x.map_compact("(x > 0.2) & (x < 0.7)", output="both")
            np.testing.assert_array_equal(v.compute(), a[(a > 0.2) & (a < 0.7)])
            np.testing.assert_array_equal(i.compute(), np.flatnonzero((a > 0.2) & (a < 0.7)))


def test_function_form_and_method_agree():
    a = np.random.default_rng(9).random(100)
    x = da.from_array(a, chunks=30)
    f = dask_compact.map_compact(x, "x > 0.5")
    m = x.map_compact("x > 0.5")
    np.testing.assert_array_equal(f.compute(), m.compute())
    lazy = [x.map_compact("x > 0.5", lazy=True) for _ in range(2)]
    assert lazy[0].name == lazy[1].name  # a graph: Dask's naming


def test_meta_and_names():
    x = da.from_array(np.arange(10, dtype=np.int16), chunks=4)
    v, i = x.map_compact("x > 3", output="both")
    assert isinstance(v._meta, np.ndarray) and v.dtype == np.int16
    assert i.dtype == np.int64
    assert v.name.startswith("compact-values-fused-")
    assert any(
        k.startswith("compact-") for k in map(str, x.map_compact("x > 3", lazy=True).dask.layers)
    )


def test_untraceable_predicate_takes_mask_path_and_says_so():
    a = np.arange(20)
    x = da.from_array(a, chunks=6)
    pred = lambda v: np.isin(v, [3, 5, 17])  # noqa: E731
    assert dask_compact.trace(pred).path == "mask"
    y = x.map_compact(pred)
    assert "mask" in y.name
    np.testing.assert_array_equal(y.compute(), [3, 5, 17])


def test_new_threshold_gives_new_keys():
    x = da.from_array(np.arange(100), chunks=10)
    a, b = x.map_compact(lambda v: v > 10), x.map_compact(lambda v: v > 20)
    assert a.name != b.name
    assert len(a) == 89 and len(b) == 79


def test_compact_with_mask():
    a = np.random.default_rng(10).random((30, 7))
    x = da.from_array(a, chunks=(8, 3))
    m = a > 0.6
    for mask in (m, da.from_array(m, chunks=(5, 7)), x > 0.6):
        v, i = dask_compact.compact(x, mask, output="both")
        np.testing.assert_array_equal(v.compute(), a[m])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))


@pytest.mark.parametrize("dtype", ["<U5", ">U3", "S4"])
@pytest.mark.parametrize("n", [0, 1, 33, 1025])
def test_compact_fixed_width_strings(dtype, n):
    """Fixed-width strings selected by a mask as NumPy's a[mask] selects them, every output,
    known chunks, N-D input flattened, lazy and rebalanced results, empty and full masks (a
    TypeError until 2026-12-07, whose hint indexed by a dask array)."""
    rng = np.random.default_rng(n)
    long = ("eéeee" if "U" in dtype else "eeeee")[: int(dtype[-1])]  # bytes: ASCII
    words = np.array(["", "a", "bb", "ccc", "dddd", long])
    a = words[rng.integers(0, len(words), n)].astype(dtype)
    x = da.from_array(a, chunks=97)
    native = a.dtype.newbyteorder("=")
    for want_m in (a == a[:1].repeat(n) if n else a == a, rng.random(n) < 0.3,
                   np.zeros(n, bool), np.ones(n, bool)):
        for mask in (want_m, da.from_array(want_m, chunks=50)):
            v, i = dask_compact.compact(x, mask, output="both")
            assert v.chunks == i.chunks and not any(math.isnan(c) for c in v.chunks[0])
            got = v.compute()
            assert got.dtype == native
            np.testing.assert_array_equal(got, a[want_m])
            np.testing.assert_array_equal(i.compute(), np.flatnonzero(want_m))
        np.testing.assert_array_equal(dask_compact.compact(x, want_m, lazy=True).compute(),
                                      a[want_m])
        np.testing.assert_array_equal(dask_compact.compact(x, want_m, chunks=40).compute(),
                                      a[want_m])
    if n > 33:  # N-D input, flattened in C order; a comparison of Dask's as the mask
        b = a[: n // 3 * 3].reshape(-1, 3)
        y = da.from_array(b, chunks=(17, 2))
        np.testing.assert_array_equal(dask_compact.compact(y, y == b.flat[4]).compute(),
                                      b[b == b.flat[4]])
        # unknown chunk sizes (a selection's): the strings and the mask paired chunk by
        # chunk, the result's sizes known (refused until 2026-12-07)
        keep = rng.random(n) < 0.7
        yu = x[da.from_array(keep, chunks=97)]
        v, i = dask_compact.compact(yu, yu == a[0], output="both")
        assert v.chunks == i.chunks and not any(math.isnan(c) for c in v.chunks[0])
        np.testing.assert_array_equal(v.compute(), a[keep][a[keep] == a[0]])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(a[keep] == a[0]))


@pytest.mark.parametrize("dtype", ["datetime64[s]", "datetime64[ns]", ">M8[D]", "timedelta64[ms]",
                                   "<m8[us]"])
def test_compact_datetime_and_timedelta(dtype):
    """datetime64 / timedelta64 values (NaT among them, big-endian too) are selected as NumPy
    selects them, by a mask (every output, known and unknown chunks) or by a predicate that
    NumPy evaluates (map_compact and compact_array); a numeric string predicate is refused."""
    rng = np.random.default_rng(11)
    a = rng.integers(-(10**9), 10**9, 1025).astype(np.int64).astype(dtype)
    a[::7] = np.array("NaT", dtype=a.dtype)
    m = rng.random(a.size) < 0.4
    x = da.from_array(a, chunks=100)
    native = a.dtype.newbyteorder("=")
    for mask, want_m in ((m, m), (da.from_array(m, chunks=150), m), (x > a[3], a > a[3])):
        v, i = dask_compact.compact(x, mask, output="both")
        assert v.dtype == native and not any(math.isnan(c) for c in v.chunks[0])
        got = v.compute()
        assert got.dtype == native
        np.testing.assert_array_equal(got, a[want_m])  # NaT equals NaT here, as in NumPy's test
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(want_m))
        np.testing.assert_array_equal(dask_compact.compact(x, mask).compute(), a[want_m])
        np.testing.assert_array_equal(dask_compact.compact(x, mask, output="indices").compute(),
                                      np.flatnonzero(want_m))
    xu = x[x == x]  # unknown chunk sizes: NaT != NaT
    got = dask_compact.compact(xu, xu > a[5]).compute()
    kept = a[a == a]
    np.testing.assert_array_equal(got, kept[kept > a[5]])

    # predicates: NumPy evaluates them (a datetime constant is not compiled), every output
    t0, t1 = a[3], a[8]
    want_m = (a > t0) & (a < t1)
    for pred in (lambda v: (v > t0) & (v < t1), lambda v: ~np.isnat(v) & (v > t0) & (v < t1)):
        v, i = x.map_compact(pred, output="both")
        assert v.dtype == native and not any(math.isnan(c) for c in v.chunks[0])
        np.testing.assert_array_equal(v.compute(), a[want_m])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(want_m))
        np.testing.assert_array_equal(x.map_compact(pred, chunks=77).compute(), a[want_m])
        cv, ci = dask_compact.compact_array(a, pred, output="both")
        assert cv.dtype == native and ci.dtype == np.int64
        np.testing.assert_array_equal(cv, a[want_m])
        np.testing.assert_array_equal(ci, np.flatnonzero(want_m))
    nat = x.map_compact(np.isnat, output="indices").compute()
    np.testing.assert_array_equal(nat, np.flatnonzero(np.isnat(a)))
    # a number against a datetime: NumPy has no loop (refused before anything runs); against
    # a timedelta it is one in the array's unit
    try:
        want_n = a[a > 0]
    except TypeError:
        want_n = None
    if want_n is None:
        with pytest.raises(TypeError):
            x.map_compact("x > 0")
        with pytest.raises(TypeError):
            dask_compact.compact_array(a, "x > 0")
    else:
        np.testing.assert_array_equal(x.map_compact("x > 0").compute(), want_n)
        np.testing.assert_array_equal(dask_compact.compact_array(a, "x > 0"), want_n)
    with pytest.raises(NotElementwise):  # the slice check runs on this path too
        x.map_compact(lambda v: v > v.max())
    with pytest.raises(TypeError, match="partition splits numbers only: split the .* int64 view"):
        dask_compact.partition(x, lambda v: v > t0)  # the split is numeric only


def test_flatnonzero():
    for a in (
        np.array([0, 3, 0, 0, -2, 7]),
        np.array([True, False, True]),
        np.zeros(5),
        np.arange(9.0) - 4,
    ):
        x = da.from_array(a, chunks=2)
        r = dask_compact.flatnonzero(x)
        assert r.chunks != ((),)
        np.testing.assert_array_equal(r.compute(), np.flatnonzero(a))


def test_flatnonzero_of_datetimes_is_numpys():
    """np.flatnonzero takes datetimes (non-zero: not the epoch; NaT is); it was refused (a
    probe)."""
    rng = np.random.default_rng(2)
    for a in (np.array(["1970-01-01", "NaT", "2020-01-01", "1970-01-01"], "M8[D]"),
              (rng.integers(-3, 3, 1031) * np.timedelta64(1, "s")).astype("m8[s]"),
              np.array(["NaT", "1970-01-01T00:00:00"], ">M8[s]")):
        for chunks in (1, 3, 500):
            got = dask_compact.flatnonzero(da.from_array(a, chunks=chunks)).compute()
            np.testing.assert_array_equal(got, np.flatnonzero(a))


def test_first_calls_from_several_threads_at_once():
    """A fresh process's first map_compact calls, from eight threads at once: dask.persist
    imports distributed in one of them while the others look for a cluster."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys, threading
        import numpy as np, dask.array as da
        import dask_compact  # noqa: F401
        assert "distributed" not in sys.modules
        x = da.from_array(np.arange(100.0), chunks=10)
        errors, results = [], []
        def work():
            try:
                results.append(x.map_compact("x > 50").compute())
            except Exception as e:
                errors.append(repr(e))
        ts = [threading.Thread(target=work) for _ in range(8)]
        [t.start() for t in ts]; [t.join() for t in ts]
        assert not errors, errors
        assert len(results) == 8 and all((r == np.arange(51.0, 100.0)).all() for r in results)
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


@pytest.mark.parametrize("module", ["joined_chunks", "direct", "records_graph", "sort_graph",
                                    "stable_split"])
def test_a_module_that_imports_dask_array_first_registers_the_method(module):
    """A module of ours that imports ``dask.array`` imported first, in a fresh interpreter (as
    a worker process that has not imported ``dask.array`` unpickles a task naming one of its
    functions): the method is registered, with its docs once ``api`` is imported. Until
    2026-12-01 (thirteenth session) ``import dask_compact.joined_chunks`` raised a circular
    ImportError (the registration imported ``api``, which imports ``joined_chunks`` half made):
    on a LocalCluster whose workers had not imported ``dask.array``, a ``sort`` that joins
    small chunks closed them, and waited for ever."""
    import subprocess
    import sys

    code = (f"import dask_compact.{module}, sys, dask.array as da\n"
            "assert hasattr(da.Array, 'map_compact')\n"
            "import dask_compact.api\n"
            "assert da.Array.map_compact.__doc__.startswith('Select the elements')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]


@pytest.mark.parametrize("chunk_dtype, declared", HIDDEN_TIMES)
def test_times_in_chunks_of_another_unit_or_byte_order_than_declared(chunk_dtype, declared):
    """The values were the chunk's bits read in the declared dtype: seconds as milliseconds
    (1000x off), big-endian bytes as garbage dates (a new-user probe); plain Dask's
    ``x[x > t0]`` gives the right times. Each chunk is cast to the declared dtype first
    (where that is exact: see the next test)."""
    a, x = hidden_times(chunk_dtype, declared)
    t0 = a[5]
    m = a > t0
    v, i = x.map_compact(lambda v: v > t0, output="both")
    assert v.dtype == a.dtype and chunk_dtypes(v) == {a.dtype}
    np.testing.assert_array_equal(v.compute(), a[m])
    np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
    np.testing.assert_array_equal(dask_compact.compact(x, x > t0).compute(), a[m])
    np.testing.assert_array_equal(dask_compact.compact(x, m, chunks=3).compute(), a[m])
    np.testing.assert_array_equal(dask_compact.flatnonzero(x).compute(), np.flatnonzero(a))
    np.testing.assert_array_equal(x[x > t0].compute(), a[m])  # plain Dask agrees


@pytest.mark.parametrize("chunk_dtype, declared", LOSSY_TIMES)
def test_times_in_chunks_of_a_finer_unit_than_declared_are_refused(chunk_dtype, declared):
    """Milliseconds under a result that declares seconds were cast, their fractions dropped
    without a word; the rule of every chunk (validate.as_declared) refuses a cast that
    loses, datetimes as numbers, and names the chunk, the instant and the fixes (whole
    seconds are cast: the test above)."""
    a, x = hidden_times(chunk_dtype, declared, fraction=True)
    t0 = a[5]
    refused = (r"chunk 1 of the input holds " + re.escape(
        f"{np.dtype(chunk_dtype)}, but its dask array declares {np.dtype(declared)}, and its "
        f"value {x.blocks[1].compute()[1]} (element 1 of the chunk)"))
    for call in (lambda: x.map_compact(lambda v: v > t0, output="both")[0],
                 lambda: dask_compact.compact(x, x > t0),
                 lambda: dask_compact.flatnonzero(x),
                 lambda: x.map_compact(lambda v: v > t0, lazy=True)):
        with pytest.raises(TypeError, match=refused):
            call().compute()
    with pytest.raises(TypeError, match=re.escape(f"dtype='{np.dtype(chunk_dtype)}'")):
        dask_compact.compact(x, x > t0)


MISDECLARED_CALLS = {
    "values": lambda x: x.map_compact("x % 2 == 0"),
    "indices": lambda x: x.map_compact("x % 2 == 0", output="indices"),
    "both": lambda x: x.map_compact("x % 2 == 0", output="both"),
    "lazy": lambda x: x.map_compact("x % 2 == 0", output="both", lazy=True),
    "chunks=": lambda x: x.map_compact("x % 2 == 0", output="indices", chunks=3),
    "by chunk": lambda x: x.map_compact("x % 2 == 0", output="indices", by_worker=False),
    "mask path": lambda x: x.map_compact(lambda v: np.isin(v, [0, 2, 4]), output="indices"),
    "compact": lambda x: dask_compact.compact(x, x % 2 == 0, output="indices"),
    "compact, NumPy mask": lambda x: dask_compact.compact(x, np.ones(x.shape, bool)),
    "flatnonzero": lambda x: dask_compact.flatnonzero(x),
}


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
@pytest.mark.parametrize("call", list(MISDECLARED_CALLS))
@pytest.mark.parametrize("actual, declared", LENGTHS)
def test_a_chunk_of_another_length_than_declared_is_refused_naming_it(scheduler, call, actual,
                                                                      declared):
    """A from_delayed chunk of 5 elements declared 7 (or 9, or none declared 3): every
    global index after it was off by the difference (and its values were taken as they
    came), a result presented as complete; refused now where the chunk is taken, naming
    it, its length and the declared one (until 2026-12-01, the eleventh session)."""
    x = misdeclared(actual, declared)
    with dask.config.set(scheduler=scheduler), pytest.raises(
            ValueError, match=refusal(actual, declared)):
        dask.compute(MISDECLARED_CALLS[call](x))


@pytest.mark.parametrize("call", ["indices", "by chunk", "compact", "per-column mask path",
                                  "split trailing axis"])
@pytest.mark.parametrize("actual, declared", SHAPES)
def test_an_nd_block_of_another_shape_than_declared_is_refused_naming_it(call, actual,
                                                                       declared):
    """N-D blocks of fewer rows, of a trailing axis of another length, or of the same size
    in another shape than declared: Dask's reshape failed with NumPy's "cannot reshape
    array of size 15 into shape (21,)", naming no chunk, took the same size in another
    shape as it came, and a per-column predicate failed as "not elementwise"."""
    x = misdeclared(actual, declared)
    calls = {**MISDECLARED_CALLS,
             "per-column mask path": lambda x: x.map_compact(lambda v: v < np.array([1, 5, 9]),
                                                             output="indices")}
    if call == "split trailing axis":  # blocks (1, 0) and (1, 1) misdeclared, joined in C order
        x, call = da.concatenate([x, x], axis=1), "indices"
    with pytest.raises(ValueError, match=refusal(actual, declared)):
        dask.compute(calls[call](x))


def test_chunks_of_their_declared_shapes_are_taken_as_before():
    """The check refuses what is misdeclared alone: the same from_delayed chunks declared as
    they are answer as NumPy does on them."""
    x = misdeclared(5, 5)
    a = x.compute()
    m = a % 2 == 0
    for call in ("values", "indices", "lazy", "chunks=", "by chunk", "mask path", "compact"):
        got = dask.compute(MISDECLARED_CALLS[call](x))[0]
        got = got[0] if isinstance(got, tuple) else got
        want = a[m] if call in ("values", "lazy") else np.flatnonzero(
            np.isin(a, [0, 2, 4]) if call == "mask path" else m)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["datetime64[M]", "timedelta64[D]"])
@pytest.mark.parametrize("pred", ["x > 5.5", lambda v: v > 5.5], ids=["string", "callable"])
@pytest.mark.parametrize("call", ["map_compact", "compact_array"])
def test_times_compared_with_a_number_are_told_to_compare_with_times(dtype, pred, call):
    """A predicate comparing datetime64 data with a number (timedelta64 with a float; NumPy
    takes an int as a count of its unit) raised NumPy's bare "ufunc 'greater' did not
    contain a loop with signature matching types (DateTime64DType, _PyLongDType)" (a
    new-user probe, 2026-12-01, fourteenth session), and a string predicate cannot name a
    time at all: the TypeError now says so and names the callable form, which works."""
    a = np.arange(12).astype(dtype)
    f = ((lambda p: da.from_array(a, chunks=5).map_compact(p).compute())
         if call == "map_compact" else (lambda p: dask_compact.compact_array(a, p)))
    with pytest.raises(TypeError, match=r"compare them with .*64 values") as e:
        f(pred)
    t0 = a[5]
    kind = "datetime64" if dtype.startswith("datetime") else "timedelta64"
    assert f"lambda v: v > np.{kind}(" in str(e.value)
    np.testing.assert_array_equal(f(lambda v: v > t0), a[a > t0])


@pytest.mark.parametrize("call", ["map_compact", "compact_array"])
def test_times_refusal_names_the_mask_selection_of_its_own_call(call):
    """The refusal of a time compared with a number told compact_array's caller to select by
    a mask with ``dask_compact.compact(x, x > t0)``, a dask call that refuses the NumPy array
    they hold (a regression review, 2026-12-01, fifteenth session): an in-memory call is told
    NumPy's own ``a[a > t0]``, a dask one ``compact``; either works as said."""
    a = np.arange(12).astype("datetime64[D]")
    t0 = a[5]
    if call == "map_compact":
        x = da.from_array(a, chunks=5)
        with pytest.raises(TypeError, match=r"compare them with") as e:
            x.map_compact(lambda v: v > 5).compute()
        assert "dask_compact.compact(x, x > t0)" in str(e.value)
        np.testing.assert_array_equal(dask_compact.compact(x, x > t0).compute(), a[a > t0])
    else:
        with pytest.raises(TypeError, match=r"compare them with") as e:
            dask_compact.compact_array(a, lambda v: v > 5)
        assert "a[a > t0]" in str(e.value) and "dask_compact.compact(" not in str(e.value)


@pytest.mark.parametrize("dtype", ["datetime64[D]", "timedelta64[s]"])
def test_times_compared_with_a_number_by_a_mask_path_callable_are_told_alike(dtype):
    """A callable that takes the mask path (one the trace cannot follow: ``v.astype(...)``)
    comparing times with a number was told the times' form by compact_array, but by
    map_compact only NumPy's bare "ufunc 'greater' did not contain a loop", raised in its
    tasks at compute (a regression review, 2026-12-01, fifteenth session: the check before
    the graph leaves such a callable's failure on its sample to the tasks). Its tasks now
    raise the same refusal; the form it names works."""
    a = np.arange(12).astype(dtype)
    t0 = a[5]
    x = da.from_array(a, chunks=5)
    pred = (lambda v: v.astype(v.dtype) > 5.5)
    with pytest.raises(TypeError, match=r"compare them with .*64 values"):
        dask_compact.compact_array(a, pred)
    with pytest.raises(TypeError, match=r"compare them with .*64 values"):
        x.map_compact(pred).compute()
    got = x.map_compact(lambda v: v.astype(v.dtype) > t0).compute()
    np.testing.assert_array_equal(got, a[a > t0])
