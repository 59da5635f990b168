"""The NumPy chunk backend: fused loop and mask path against NumPy's own boolean indexing."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from dask_compact import dispatch
from dask_compact.backends.numpy_backend import compact, compact_masked
from dask_compact.codegen import numba_loop
from dask_compact.codegen.numba_loop import cache_info, fused_loop
from dask_compact.predicate import as_predicate

DTYPES = [
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
]  # fmt: skip
SIZES = [0, 1, 31, 33, 63, 64, 65, 1023, 1025, 4099]  # 4099 is prime
PS = [0, 0.05, 0.5, 0.95, 1]


def random_array(dtype: str, shape, seed: int = 0) -> np.ndarray:
    """Random data of every dtype (never all zeros), with NaN/inf/-0.0 among floats."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    n = int(np.prod(shape))
    if dt.kind == "b":
        a = rng.random(n) < 0.5
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    elif dt.kind == "f":
        a = rng.random(n).astype(dt)
        if n > 10:
            a[rng.integers(0, n, 3)] = [np.nan, -0.0, np.inf]
    else:
        a = (rng.random(n) + 1j * rng.random(n)).astype(dt)
    return a.reshape(shape)


def selector(a: np.ndarray, p: float):
    """A traceable predicate true for about a fraction p of ``a`` (exactly none at p=0, all
    finite/real-part values at p=1)."""
    if a.dtype.kind == "b":
        return (lambda v: v) if p >= 0.5 else (lambda v: ~v)
    key = a.real if a.dtype.kind == "c" else a
    finite = key[np.isfinite(key)] if key.dtype.kind == "f" else key
    if finite.size == 0 or p == 0:
        return lambda v: v.real < v.real  # all false, NaN included
    t = key.dtype.type(np.quantile(finite.astype(np.float64), p, method="lower"))
    if a.dtype.kind == "c":
        return lambda v: (v.real <= t) | (v == 0)
    return lambda v: v <= t


def reference(a: np.ndarray, mask: np.ndarray, output: str, base: int = 0):
    values = a.ravel()[mask.ravel()]
    indices = np.flatnonzero(mask).astype(np.int64) + base
    return {"values": values, "indices": indices, "both": (values, indices)}[output]


def assert_same(got, want):
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == 2
        for g, w in zip(got, want):
            assert_same(g, w)
        return
    assert got.ndim == 1 and got.dtype == want.dtype and got.shape == want.shape
    assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_float32_sizes_and_fractions(size, output):
    a = random_array("float32", (size,), seed=size)
    for p in PS:
        f = selector(a, p)
        pred = as_predicate(f)
        assert_same(compact(a, pred, output, True, None, 10), reference(a, f(a), output, 10))


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "complex128"])
def test_both_store_forms_at_every_hit_count(output, dtype):
    """While the running mean of hits per block of 64 is under SPARSE_BELOW a block visits
    only its set bits, else it stores every row: a block of every hit count from 0 to 64 (at
    random positions) after a run of full blocks (the storing form) and after a run of empty
    ones (the visiting form), the last block partial; equal to NumPy."""
    rng = np.random.default_rng(17)
    blocks = []
    for hits in range(65):
        m = np.zeros(64, bool)
        m[rng.choice(64, hits, replace=False)] = True
        blocks += [np.ones(64 * 16, bool), m, np.zeros(64 * 16, bool), m]
    mask = np.concatenate(blocks + [np.ones(64 * 16, bool)])[:-13]  # a partial last block
    a = random_array(dtype, (mask.size,), seed=5)
    key = np.where(mask, a, 0).astype(dtype)
    key[mask & (key == 0)] = 1  # a selected row is never 0: the mask is exact
    f = lambda v: v != 0  # noqa: E731
    assert np.array_equal(f(key), mask)
    assert_same(compact(key, as_predicate(f), output, True, None, 7),
                reference(key, mask, output, 7))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [0, 1, 33, 1025])
def test_every_dtype(dtype, size, caplog):
    caplog.set_level(logging.DEBUG, logger="dask_compact")
    a = random_array(dtype, (size,), seed=size + 1)
    for p in PS:
        f = selector(a, p)
        pred = as_predicate(f)
        for output in ("values", "indices", "both"):
            assert_same(compact(a, pred, output, True, None, 3), reference(a, f(a), output, 3))
    # every dtype but float16 (no numba CPU half type) runs the fused loop
    assert ("mask path" in caplog.text) == (dtype == "float16")
    assert ("fused loop" in caplog.text) == (dtype != "float16")


# a predicate selecting part of each dtype's random data
_SELECT_BY_DTYPE = {
    "bool": lambda v: v,
    "complex64": lambda v: v.real > 0.3,
    "float64": lambda v: v > 0.3,
    "int32": lambda v: (v % 3) == 1,
}


@pytest.mark.parametrize("dtype", ["float64", "int32", "complex64", "bool"])
def test_nd_and_non_contiguous_input(dtype):
    base = random_array(dtype, (6, 50, 7), seed=4)
    f = _SELECT_BY_DTYPE[dtype]
    pred = as_predicate(f)
    views = [
        base,
        base[:, ::3, :],
        base.transpose(2, 0, 1),
        np.asfortranarray(base),
        base[::-1, 1, ::2],
    ]
    for v in views:
        for output in ("values", "indices", "both"):
            assert_same(compact(v, pred, output, True, None, 0), reference(v, f(v), output))


def test_zero_d_and_empty_nd():
    pred = as_predicate(lambda v: v > 0.5)
    assert_same(
        compact(np.array(0.7), pred, "both", True, None, 5), (np.array([0.7]), np.array([5]))
    )
    assert_same(compact(np.array(0.2), pred, "values", True, None, 0), np.array([], float))
    e = np.empty((3, 0, 2), np.float32)
    assert_same(compact(e, pred, "both", True, None, 0), (e.ravel(), np.array([], np.int64)))


def test_readonly_input():
    a = random_array("float64", (500,))
    a.setflags(write=False)
    pred = as_predicate(lambda v: v < 0.25)
    assert_same(compact(a, pred, "values", True, None, 0), a[a < 0.25])


def test_fused_path_runs_and_is_logged(caplog):
    a = random_array("float32", (100,))
    with caplog.at_level(logging.DEBUG, logger="dask_compact"):
        compact(a, as_predicate(lambda v: v > 0.5), "values", True, None, 0)
    assert "fused loop" in caplog.text


@pytest.mark.parametrize(
    "dtype, f, why",
    [
        ("float16", lambda v: v > 0.5, "float16"),
        ("float32", lambda v: np.exp(v) > 1.5, "bit-reproducible"),
        ("complex128", lambda v: v * v == 0, "complex"),
        ("int8", lambda v: v + 1000 > 0, "does not fit"),
    ],
)
def test_unsupported_in_loop_takes_mask_path(dtype, f, why, caplog):
    a = random_array(dtype, (300,))
    pred = as_predicate(f)
    assert pred.path == "fused"
    with caplog.at_level(logging.DEBUG, logger="dask_compact"):
        try:
            want = reference(a, f(a), "both")
        except OverflowError:  # NumPy refuses int8 + 1000; so must we
            with pytest.raises(OverflowError):
                compact(a, pred, "both", True, None, 0)
        else:
            assert_same(compact(a, pred, "both", True, None, 0), want)
    assert "mask path" in caplog.text and why in caplog.text


def test_untraceable_predicate_mask_path_still_correct(caplog):
    a = random_array("float64", (1000,))
    f = lambda v: np.isin(np.round(v * 10), [1.0, 3.0, 7.0])
    pred = as_predicate(f)
    assert pred.path == "mask"
    with caplog.at_level(logging.DEBUG, logger="dask_compact"):
        assert_same(compact(a, pred, "both", True, None, 2), reference(a, f(a), "both", 2))
    assert "np.isin" in caplog.text


def test_uint8_compared_with_negative_python_int_follows_numpy():
    a = random_array("uint8", (100,))
    pred = as_predicate(lambda v: v > -1)  # -1 does not fit uint8: NumPy still answers
    assert_same(compact(a, pred, "indices", True, None, 0), np.arange(100))


def test_threshold_change_reuses_compiled_loop():
    a = random_array("float64", (2000,), seed=9)
    compact(a, as_predicate(lambda v: (v > 0.1) & (v < 0.3)), "values", True, None, 0)
    before = cache_info()
    for lo, hi in [(0.2, 0.4), (0.0, 1.0), (0.5, 0.51)]:
        got = compact(
            a, as_predicate(lambda v, lo=lo, hi=hi: (v > lo) & (v < hi)), "values", True, None, 0
        )
        assert_same(got, a[(a > lo) & (a < hi)])
        got = compact(a, as_predicate(f"(x > {lo}) & (x < {hi})"), "values", True, None, 0)
        assert_same(got, a[(a > lo) & (a < hi)])
    after = cache_info()
    assert after["builds"] == before["builds"]
    assert after["specializations"] == before["specializations"]
    assert after["hits"] >= before["hits"] + 6


def test_disk_cache_file_and_unwritable_dir(tmp_path, monkeypatch):
    pred = as_predicate(lambda v: v != 3)
    tp = pred.typed(np.dtype("int16"))
    loop = fused_loop(tp, "indices")
    assert loop.path is not None and os.path.exists(loop.path)
    assert loop.path.startswith(os.environ["DASK_COMPACT_CACHE_DIR"])
    # a cache dir that cannot be created: compiled in memory, no disk cache, still correct
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("DASK_COMPACT_CACHE_DIR", str(blocker / "sub"))
    numba_loop.clear_cache()
    with pytest.warns(RuntimeWarning, match="cannot be used"):  # said once (test_cache)
        loop2 = fused_loop(tp, "values")
    assert loop2.path is None and "cache=False" in loop2.source
    a = random_array("int16", (100,))
    assert_same(compact(a, pred, "values", True, None, 0), a[a != 3])


def test_small_result_does_not_pin_the_buffer():
    a = random_array("float64", (100_000,))
    small = compact(a, as_predicate(lambda v: v < 0.001), "values", True, None, 0)
    assert small.base is None or small.base.size == small.size
    big = compact(a, as_predicate(lambda v: v < 0.9), "values", True, None, 0)
    assert_same(big, a[a < 0.9])


def test_compact_masked_and_dispatch():
    a = random_array("int32", (7, 9), seed=3)
    m = random_array("bool", (7, 9), seed=4)
    for output in ("values", "indices", "both"):
        assert_same(compact_masked(a, m, output, 100), reference(a, m, output, 100))
        assert_same(dispatch.compact_masked(a, m, output, 100), reference(a, m, output, 100))
    pred = as_predicate("x > 0")
    assert_same(dispatch.compact_chunk(a, pred, "values", False, "hybrid", 0), a[a > 0])
    with pytest.raises(ValueError):
        compact_masked(a, m[:3], "values", 0)
    with pytest.raises(TypeError):
        compact_masked(a, m.astype(int), "values", 0)
    with pytest.raises(ValueError):
        compact(a, pred, "mask", True, None, 0)


def test_non_boolean_predicate_is_an_error():
    a = random_array("float32", (10,))
    with pytest.raises(TypeError, match="boolean"):
        compact(a, as_predicate(lambda v: v + 1), "values", True, None, 0)


RUNS = [[1], [0, 33, 0, 1025], [31, 1, 4099, 1023], [0, 0]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_compact_many_is_the_concatenation(dtype, output):
    """One task over a run of chunks: the chunks' outputs concatenated, indices global."""
    from dask_compact.backends.numpy_backend import compact_many

    for k, sizes in enumerate(RUNS):
        parts = [random_array(dtype, (n,), seed=k * 7 + j) for j, n in enumerate(sizes)]
        a = np.concatenate(parts)
        bases = [int(b) + 3 for b in np.concatenate([[0], np.cumsum(sizes)[:-1]])]
        for p in PS:
            f = selector(a, p)
            pred = as_predicate(f)
            got = compact_many(parts, pred, output, True, "auto", bases)
            assert_same(got, reference(a, np.asarray(f(a), dtype=bool), output, base=3))


def test_compact_many_mask_path_and_nd_chunks():
    """An untraceable predicate takes the mask path per chunk and is concatenated; N-D chunks
    are taken in C order, each from its own base."""
    from dask_compact.chunk import compact_blocks

    rng = np.random.default_rng(5)
    parts = [rng.random((3, 5)), rng.random((0, 5)), rng.random((7, 5))]
    flat = np.concatenate([q.ravel() for q in parts])
    pred = as_predicate(lambda v: np.isin(np.round(v * 10), [1, 4]))
    assert pred.path == "mask"
    m = np.isin(np.round(flat * 10), [1, 4])
    v, i = compact_blocks(parts, pred, "both", True, "auto", [0, 15, 15], True)
    assert_same((v, i), (flat[m], np.flatnonzero(m)))
    v, i, n_in = compact_blocks(
        parts, as_predicate("x < 0.5"), "values", True, "auto", [0, 15, 15], False
    )
    assert i is None and n_in == flat.size
    assert_same(v, flat[flat < 0.5])


def test_group_tasks():
    """One task per worker thread over the chunks it holds, consecutive or not; its runs are
    the output chunks."""
    from dask_compact.placement import group_tasks

    assert group_tasks([], {}) == []
    assert group_tasks(["a", "b", "a", "b"], {"a": 1, "b": 1}) == [[[0], [2]], [[1], [3]]]
    assert group_tasks(["a", "b", "a", "b", "b"], {"a": 1, "b": 1}) == [[[0], [2]], [[1], [3, 4]]]
    assert group_tasks(["a", None, None, "a"], {"a": 1}) == [[[0], [3]], [[1]], [[2]]]
    assert group_tasks(["a", "b"] * 4, {"a": 2, "b": 1}) == [
        [[0], [2]], [[1], [3], [5], [7]], [[4], [6]]
    ]
    assert group_tasks(["a"] * 8, {"a": 1}) == [[list(range(8))]]
    rng = np.random.default_rng(11)
    for _ in range(200):
        holders = list(rng.choice(["a", "b", "c", None], size=int(rng.integers(0, 40))))
        threads = {"a": 1, "b": 2, "c": 3}
        groups = group_tasks(holders, threads)
        flat = [i for g in groups for r in g for i in r]
        assert sorted(flat) == list(range(len(holders)))  # every chunk once
        for g in groups:
            assert len({holders[i] for r in g for i in r}) == 1  # one holder per task
            assert all(b - a == 1 for r in g for a, b in zip(r, r[1:]))  # runs consecutive
            assert all(r1[-1] + 1 < r2[0] for r1, r2 in zip(g, g[1:]))  # runs maximal, ordered
        for h, t in threads.items():  # at most one task per thread of a worker
            assert sum(holders[g[0][0]] == h for g in groups) <= t


# -- Calls of more than a segment (numpy_backend._SEGMENT) ------------------------------------

OUTPUTS = ("values", "indices", "both")
SEGMENT = 256  # rows of a segment in these tests (the module's is millions)
AROUND_SEGMENT = [SEGMENT - 1, SEGMENT, SEGMENT + 1, 2 * SEGMENT, 5 * SEGMENT + 37]


@pytest.fixture
def segmented(monkeypatch):
    """The segment lowered to SEGMENT rows, so that small calls take the segmented path; the
    list returned counts the calls that took it."""
    from dask_compact.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "_SEGMENT", SEGMENT)
    calls = []
    run = numpy_backend._run_segmented

    def counted(*args):
        calls.append(args)
        return run(*args)

    monkeypatch.setattr(numpy_backend, "_run_segmented", counted)
    return calls


@pytest.mark.parametrize(
    "dtype", ["bool", "int8", "uint16", "int32", "float32", "float64", "complex128"]
)
def test_segmented_calls_match_numpy(dtype, segmented):
    """Sizes around the segment (one less, equal, one more, two segments, several and a partial
    last one), none to every element selected, every output, a nonzero index base: equal to
    NumPy; only the calls of more than a segment take the segmented path."""
    for n in AROUND_SEGMENT:
        a = random_array(dtype, (n,), seed=n)
        for p in PS:
            f = selector(a, p)
            pred = as_predicate(f)
            for output in OUTPUTS:
                got = compact(a, pred, output, True, None, 11)
                assert_same(got, reference(a, f(a), output, 11))
    assert len(segmented) == 3 * len(PS) * len(OUTPUTS)


def rate_changes(n: int) -> dict[str, np.ndarray]:
    """Masks whose selected fraction changes along the input, so that the rate measured on the
    first rows projects the selection wrongly: nothing then everything, the reverse, blocks."""
    half = np.arange(n) >= n // 3
    blocks = (np.arange(n) // (SEGMENT // 3)) % 2 == 1
    rng = np.random.default_rng(n)
    rising = rng.random(n) < np.linspace(0, 1, n)
    # 1 row in 10 over the first 3%, then every row: held 1.93x the full-length buffers before
    # _Selection._grow went straight to the most past half of it
    late = np.where(np.arange(n) < n * 3 // 100, np.arange(n) % 10 < 1, True)
    return {"rising": half, "falling": ~half, "blocks": blocks, "ramp": rising, "late": late}


@pytest.mark.parametrize("output", OUTPUTS)
def test_segmented_calls_where_the_rate_changes(output, segmented):
    """A selection the first step underestimates grows its buffers several times, one it
    overestimates keeps a view of a larger buffer or a copy: equal to NumPy either way."""
    n = 9 * SEGMENT + 5
    for m in rate_changes(n).values():
        a = np.where(m, 2, 0).astype(np.int16) + np.arange(n, dtype=np.int16) % 2
        got = compact(a, as_predicate(lambda v: v >= 2), output, True, None, 4)
        assert_same(got, reference(a, m, output, 4))
    assert len(segmented) == 5


@pytest.mark.parametrize("dtype", ["float64", "int32", "complex64", "bool"])
def test_segmented_nd_and_non_contiguous_input(dtype, segmented):
    """N-D and non-contiguous chunks go through the loop a segment at a time (whole rows of
    axis 0 where they fit in a segment, each row's segments where not, a strided 1-D array in
    segments), each segment's indices from its place in the C order."""
    base = random_array(dtype, (6, 50, 7), seed=4)
    long_rows = random_array(dtype, (3, 1000), seed=5)
    f = _SELECT_BY_DTYPE[dtype]
    pred = as_predicate(f)
    views = [
        base,  # C-contiguous
        base[:, ::3, :],  # rows of 119: two per segment
        base.transpose(2, 0, 1),  # rows of 300, each of rows of 50
        np.asfortranarray(base),
        base[::-1, 1:, ::2],
        long_rows[:, ::2],  # rows of 500, each a strided 1-D array of two segments
        long_rows.ravel()[::3],
    ]
    for v in views:
        assert v.size > SEGMENT
        for output in OUTPUTS:
            assert_same(compact(v, pred, output, True, None, 9), reference(v, f(v), output, 9))
    assert len(segmented) == len(views) * len(OUTPUTS)


@pytest.mark.parametrize("output", OUTPUTS)
def test_segmented_compact_many(output, segmented):
    """Several chunks of one task (empty, under, at and over a segment, N-D, non-contiguous)
    through one grown output: the concatenation of their selections, indices from each chunk's
    base."""
    from dask_compact.backends.numpy_backend import compact_many

    rng = np.random.default_rng(8)
    sizes = [0, 100, SEGMENT, 1, 3 * SEGMENT + 7]
    parts = [rng.random(n) for n in sizes] + [rng.random((40, 20))[:, ::2], rng.random((9, 3))]
    flat = np.concatenate([q.ravel() for q in parts])
    bases = [int(b) + 5 for b in np.concatenate([[0], np.cumsum([q.size for q in parts])[:-1]])]
    for t in (0.0, 0.02, 0.5, 1.0):
        pred = as_predicate(f"x < {t}")
        got = compact_many(parts, pred, output, True, "auto", bases)
        assert_same(got, reference(flat, flat < t, output, 5))
    assert len(segmented) == 4


def _held_bytes(a: np.ndarray) -> int:
    from dask_compact.batch.tasks import _held

    return _held(a)


@pytest.mark.parametrize("output", OUTPUTS)
def test_segmented_calls_keep_the_alloc_contract(output, segmented):
    """With ``alloc`` (the batch job's pool of paged-in buffers): every buffer from it, a
    result a view of at most 4x its length or a copy of its own (``_trim``, which the batch
    job's piece charges count on), and at most 1.5x the full-length buffers held at once (what
    ``batch.plan.chunk_cost`` charges a chunk until its count is known)."""
    from dask_compact.batch.host_buffers import HostPool

    n = 9 * SEGMENT + 5
    a = random_array("float32", (n,), seed=2)
    masks = {f"p={p}": f(a) for p in PS for f in [selector(a, p)]} | rate_changes(n)
    full = n * {"values": 4, "indices": 8, "both": 12}[output]
    for name, m in masks.items():
        key = np.where(m, 1, 0).astype(np.int8)
        pool = HostPool()
        got = compact(key, as_predicate("x == 1"), output, True, None, 3, pool.alloc)
        assert_same(got, reference(key, m, output, 3))
        for part in got if output == "both" else (got,):
            assert _held_bytes(part) <= max(4 * part.nbytes, part.itemsize), name
            root = part
            while isinstance(root.base, np.ndarray):
                root = root.base
            assert type(root.base).__name__ == "_Lease", name  # pool memory
        assert pool.peak <= 1.5 * full, (name, pool.peak, full)
    assert len(segmented) == len(masks)


@pytest.mark.parametrize("output", OUTPUTS)
def test_segmented_call_memory_is_about_the_selection(output, monkeypatch):
    """2026-11-30 (a probe): ``compact_array`` of 2^31 + 7 int8 asked 16 GiB for 3 indices, a
    full-length int64 buffer. Now a call of more than a segment holds about its selection and
    a fraction of a segment: 2^24 int8 with three selected, the segment lowered to 2^20, peak
    traced memory (NumPy reports its allocations to tracemalloc) under a quarter byte per
    element, where the full-length buffers were 8 (indices), 1 (values) or 9 bytes (both),
    and NumPy's own ``np.flatnonzero(a == 3)`` makes a mask of 1 byte per element."""
    import tracemalloc

    from dask_compact import compact_array
    from dask_compact.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "_SEGMENT", 1 << 20)
    n = 1 << 24
    a = np.zeros(n, np.int8)
    where = [5, n // 2, n - 1]
    a[where] = 3
    compact_array(a[:1000], "x == 3", output=output)  # the loop compiled or loaded first
    tracemalloc.start()
    try:
        got = compact_array(a, "x == 3", output=output)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert_same(got, reference(a, a == 3, output))
    assert peak < n // 4, f"{peak / n:.2f} bytes per element"


@pytest.mark.parametrize("rising", ["0 then 1", "0.1 then 0.9", "ramp"])
def test_a_rate_rising_along_a_segmented_call_copies_little(rising, monkeypatch):
    """The buffers of a segmented call grow with its selection, each growth copying the
    selection so far. Projected at the call's rate so far, a rate rising along the call grew
    them four times, copying most of the selection again (a probe: 2^24 float64, "both",
    29 ms against 14 ms for one full-length buffer); projected at the last step's rate too,
    and grown to the most the rest could select once past a quarter of it, the copies are a
    small part of the selection. The result equals NumPy's."""
    from dask_compact.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "_SEGMENT", 1 << 16)  # a quarter of the call, as 2^22
    copied = []
    moved = numpy_backend._Selection._moved

    def counted(self, buf, cap):
        if buf is not None:
            copied.append(self.k)
        return moved(self, buf, cap)

    monkeypatch.setattr(numpy_backend._Selection, "_moved", counted)
    n = (1 << 18) + 7
    rng = np.random.default_rng(11)
    p = {"0 then 1": np.r_[np.zeros(n // 2), np.ones(n - n // 2)],
         "0.1 then 0.9": np.r_[np.full(n // 2, 0.1), np.full(n - n // 2, 0.9)],
         "ramp": np.linspace(0, 1, n)}[rising]
    a = rng.random(n) < p
    values, indices = compact(a.astype(np.float64), as_predicate(lambda v: v > 0.5), "both",
                              True, None, 0)
    np.testing.assert_array_equal(indices, np.flatnonzero(a))
    np.testing.assert_array_equal(values, np.ones(a.sum()))
    assert sum(copied) / 2 < 0.3 * a.sum(), (copied, a.sum())  # /2: values and indices


# -- Calls whose full-length buffers would be mapped fresh (numpy_backend._HEAP_BYTES) --------


def _heap(monkeypatch, nbytes: int) -> None:
    from dask_compact.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "_HEAP_BYTES", nbytes)


@pytest.mark.parametrize("output", OUTPUTS)
def test_calls_whose_buffers_would_be_mapped_fresh_run_segmented(output, segmented,
                                                                  monkeypatch):
    """Without a caller's alloc, a call of at most a segment whose full-length buffers would
    reach _HEAP_BYTES (which glibc maps fresh, every written page faulting in) runs segmented,
    with buffers of its selection's size; under it, or with alloc (paged-in memory), it keeps
    one full-length buffer. Equal to NumPy every way."""
    from dask_compact.batch.host_buffers import HostPool

    _heap(monkeypatch, 1024)  # the 32 MiB of the module, scaled to the lowered segment
    width = {"values": 4, "indices": 8, "both": 12}[output]
    at = -(-1024 // width)
    sizes = [at - 1, at, SEGMENT]  # under, reaching and over it, none over a segment
    assert SEGMENT * width >= 1024
    for n in sizes:
        a = random_array("float32", (n,), seed=n)
        for p in PS:
            f = selector(a, p)
            for alloc in (None, HostPool().alloc):
                got = compact(a, as_predicate(f), output, True, None, 7, alloc)
                assert_same(got, reference(a, f(a), output, 7))
    assert len(segmented) == 2 * len(PS)  # sizes[1:], without alloc


def test_buffers_under_the_heap_size_keep_their_projected_size(segmented, monkeypatch):
    """A segmented call whose projected buffers pass a quarter of what the rest could select
    goes straight to that (the full length) so that it grows once more at most; without alloc
    and under _HEAP_BYTES it keeps the projection instead: half of 9 segments selected ends in
    buffers of about half the length, not the whole."""
    from dask_compact.batch.host_buffers import HostPool

    n = 9 * SEGMENT + 5
    a = (np.arange(n) % 2).astype(np.float32)  # the same rate, 1/2, from the first step on
    pred = as_predicate("x == 1")
    held = {}
    for heap, alloc in [(1 << 30, None), (16, None), (1 << 30, "pool")]:
        _heap(monkeypatch, heap)
        got = compact(a, pred, "indices", True, None, 0,
                      HostPool().alloc if alloc else None)
        np.testing.assert_array_equal(got, np.flatnonzero(a == 1))
        held[heap, alloc] = _held_bytes(got) / (8 * n)
    assert held[1 << 30, None] < 0.6, held
    assert held[16, None] > 0.9 and held[1 << 30, "pool"] > 0.9, held


@pytest.mark.parametrize("output", OUTPUTS)
def test_buffers_kept_under_the_heap_size_bound_the_call_memory(output, segmented,
                                                                monkeypatch):
    """Where the rate changes along the call, a buffer kept at its projection (under
    _HEAP_BYTES) is outgrown at most once, straight to the most: the buffers held at once stay
    within the full-length ones plus _HEAP_BYTES, or 1.25x them, whichever is more."""
    import weakref

    from dask_compact.backends import numpy_backend

    n = 9 * SEGMENT + 5
    width = {"values": 2, "indices": 8, "both": 10}[output]
    full = n * width
    heap = full // 2
    _heap(monkeypatch, heap)
    live, peak = [0], [0]

    def freed(nbytes: int) -> None:
        live[0] -= nbytes

    def empty(m: int, dtype: np.dtype) -> np.ndarray:
        buf = np.empty(m, dtype=dtype)
        live[0] += buf.nbytes
        peak[0] = max(peak[0], live[0])
        weakref.finalize(buf, freed, buf.nbytes)
        return buf

    monkeypatch.setattr(numpy_backend, "_empty", empty)
    rng = np.random.default_rng(3)
    masks = rate_changes(n) | {f"p={p}": rng.random(n) < p for p in (0.2, 0.4, 0.6, 1)}
    for name, m in masks.items():
        a = np.where(m, 2, 0).astype(np.int16) + np.arange(n, dtype=np.int16) % 2
        live[0] = peak[0] = 0
        got = compact(a, as_predicate(lambda v: v >= 2), output, True, None, 4)
        assert_same(got, reference(a, m, output, 4))
        assert peak[0] <= max(1.25 * full, full + heap), (name, peak[0], full)
        del got  # its buffer freed before the next call's count starts


def test_a_falling_rate_samples_the_rest_and_keeps_heap_sized_buffers(segmented, monkeypatch):
    """A rate that falls along the call (all selected, then none) projects the whole length
    from its first step; where buffers of that length would reach _HEAP_BYTES, a sample of
    the rest of the input projects the selection instead, once per call: the buffers stay
    under _HEAP_BYTES (before, the full length: mapped fresh, every written page faulting
    in). With alloc (paged-in memory) nothing is sampled. Equal to NumPy every way."""
    from dask_compact.backends import numpy_backend
    from dask_compact.batch.host_buffers import HostPool

    n = 9 * SEGMENT + 5
    _heap(monkeypatch, n * 8 * 6 // 10)  # the full-length indices reach it, a third not
    sampled = []
    rest_sample = numpy_backend._rest_sample

    def counted(*args):
        sampled.append(rest_sample(*args))
        return sampled[-1]

    monkeypatch.setattr(numpy_backend, "_rest_sample", counted)
    m = np.arange(n) < n // 3
    a = np.where(m, 2.0, 0.0).astype(np.float32)
    pred = as_predicate("x > 1")
    held, samples = {}, {}
    for alloc in (None, "pool"):
        sampled.clear()
        got = compact(a, pred, "indices", True, None, 5, HostPool().alloc if alloc else None)
        assert_same(got, reference(a, m, "indices", 5))
        held[alloc], samples[alloc] = _held_bytes(got) / (8 * n), list(sampled)
    assert held[None] < 0.6 and held["pool"] > 0.9, held
    assert samples["pool"] == [] and len(samples[None]) == 1, samples
    got, size = samples[None][0]
    assert size > 0 and got / size < 1 / 3, samples  # the rest: at most the first third


def test_the_sample_of_the_rest_spreads_over_blocks_and_layouts(monkeypatch):
    """_rest_sample counts the selected among elements spread over what is left of the call:
    from a block's offset on, over the later blocks, C-contiguous or not, without aliasing
    with a periodic selection (every other element selected: about half, not all or none)."""
    from dask_compact.backends import numpy_backend

    monkeypatch.setattr(numpy_backend, "_sample_size", lambda: 2000)
    pred = as_predicate("x > 0")
    tp = pred.typed(np.dtype(np.int16))
    loop, params = fused_loop(tp, "both"), tp.bind(pred.params)
    sample = numpy_backend._rest_sample
    n = 60_000
    every_other = (np.arange(n) % 2).astype(np.int16)
    assert abs(sample(loop, [every_other], (0, 0), params, "both")[0] / 2000 - 0.5) < 0.05
    # the first 10_000 all selected, nothing after: sampled from 10_000 on, none selected
    first = np.where(np.arange(n) < 10_000, 1, 0).astype(np.int16)
    assert sample(loop, [first], (0, 10_000), params, "both") == (0, 2000)
    assert sample(loop, [first], (0, 0), params, "both")[0] in range(300, 370)  # 1/6
    # blocks: the rest of the first (none selected) and two later ones (all, then a
    # transposed block with its first half selected in C order)
    later = np.ones(20_000, np.int16)
    t = np.zeros((400, 50), np.int16)
    t[:200] = 1  # C order of t: its first half
    blocks = [first, later, np.ascontiguousarray(t).T.copy().T]
    assert not blocks[2].flags.c_contiguous
    got, size = sample(loop, blocks, (0, 10_000), params, "both")
    rest = 50_000 + 20_000 + 20_000
    assert size == 2000 and abs(got / size - 30_000 / rest) < 0.03
    assert sample(loop, [first], (0, n), params, "both") == (0, 0)  # nothing left
    assert sample(loop, [first[:5]], (0, 0), params, "both") == (5, 5)  # fewer than asked


def test_segmented_buffers_are_freed_with_their_result(monkeypatch):
    """A segmented call's buffers go with its result, without waiting for the cycle
    collector: a reference cycle through the call's sampler of the rest of its input kept
    each call's buffers alive until gc ran (a probe before it landed: calls in a loop took
    fresh memory each time, 40-55 ms a call against 3)."""
    import gc
    import weakref

    from dask_compact.backends import numpy_backend

    # not the segmented fixture: it keeps each call's arguments, the buffers among them
    monkeypatch.setattr(numpy_backend, "_SEGMENT", SEGMENT)
    n = 9 * SEGMENT + 5
    a = np.where(np.arange(n) < n // 3, 2.0, 0.0)
    gc.disable()
    try:
        for output in OUTPUTS:
            got = compact(a, as_predicate("x > 1"), output, True, None, 0)
            parts = got if output == "both" else (got,)
            roots = []
            for part in parts:
                root = part
                while isinstance(root.base, np.ndarray):
                    root = root.base
                roots.append(weakref.ref(root))
            del got, parts, part, root
            assert all(r() is None for r in roots), output
    finally:
        gc.enable()
