"""The one-read exact-size path of the public GPU call: after a call of a predicate selected a
small fraction, the next call of that predicate compacts into scratch and copies the selection
out instead of counting first. Against NumPy, whichever path runs, including a call whose data
selects far more than the previous call's did.

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from gpu_helpers import (  # noqa: E402
    check,
    device_count,
    expect,
    held_bytes,
    hold_kernel,
    pool_bytes,
)

from dask_compact import compact_array  # noqa: E402
from dask_compact.backends import cupy_backend as cb  # noqa: E402
from dask_compact.backends import cupy_calls as ck  # noqa: E402
from dask_compact.backends import cupy_exact as ce  # noqa: E402
from dask_compact.backends import cupy_tuning as ct  # noqa: E402
from dask_compact.predicate import as_predicate  # noqa: E402
from dask_compact.predicate.parse import parse  # noqa: E402 -- a fresh predicate: no memo yet

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["int8", "int32", "float32", "float64", "uint64"])
@pytest.mark.parametrize("n", [1, 31, 1025, 65_537, (1 << 20) + 7])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("stable", [True, False])
def test_second_call_takes_one_read_and_matches_numpy(dtype, n, output, stable, monkeypatch):
    monkeypatch.setattr(ct, "FAST_SMALL_CALLS", False)  # the general path's choice, counted
    taken = []
    real = ce.run_one_read
    monkeypatch.setattr(ce, "run_one_read", lambda *a: taken.append(1) or real(*a))
    rng = np.random.default_rng(n)
    pred = parse("x < 3")  # about 3% of 0..99
    s = np.dtype(dtype).itemsize
    o = {"values": s, "indices": 8, "both": s + 8}[output]
    previous = None
    for _ in range(3):
        a_host = (rng.random(n) * 100).astype(dtype)
        before = len(taken)
        got = compact_array(cupy.asarray(a_host), pred, output=output, stable=stable)
        check(got, expect(a_host, a_host < 3, output), output, stable)
        # a small call always reads once; a larger one counts first on the first call, and
        # after that reads once iff the previous call's fraction was under the threshold
        one_read = ce.always_reads_once(n, np.dtype(dtype), output) or (
            previous is not None and previous < ct.ONE_READ_MARGIN * s / (2 * o))
        assert (len(taken) > before) is one_read, (previous, s, o)
        previous = float((a_host < 3).mean())
    if not ce.always_reads_once(n, np.dtype(dtype), output):
        assert len(taken) == 2
    else:
        assert len(taken) == 3


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("stable", [True, False])
def test_large_calls_count_first_then_follow_the_fraction(output, stable, monkeypatch):
    """Above ONE_READ_ALWAYS_BYTES the path follows the previous call's fraction."""
    monkeypatch.setattr(ct, "ONE_READ_ALWAYS_BYTES", 1000)
    taken = []
    real = ce.run_one_read
    monkeypatch.setattr(ce, "run_one_read", lambda *a: taken.append(1) or real(*a))
    real_ready = ck.OneReadCall.__call__  # the cached ready call, where it applies
    monkeypatch.setattr(ck.OneReadCall, "__call__",
                        lambda self, *a: taken.append(1) or real_ready(self, *a))
    pred = parse("x < 3")
    rng = np.random.default_rng(3)
    for k in range(3):
        a_host = (rng.random(65_537) * 100).astype(np.float32)
        got = compact_array(cupy.asarray(a_host), pred, output=output, stable=stable)
        check(got, expect(a_host, a_host < 3, output), output, stable)
        assert len(taken) == (0 if k == 0 else k)


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_dense_data_after_sparse_data_is_still_exact(output):
    """The path is chosen from the previous call; data that selects everything this time is
    compacted exactly all the same (the scratch has room for n)."""
    pred = parse("x > 0.5")
    sparse = np.zeros(100_003, dtype=np.float32)
    sparse[::97] = 1
    dense = np.ones(100_003, dtype=np.float32)
    dense[::89] = 0
    for a_host in (sparse, dense, sparse, np.zeros(10, np.float32), dense):
        got = compact_array(cupy.asarray(a_host), pred, output=output)
        check(got, expect(a_host, a_host > 0.5, output), output, True)


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_large_one_read_calls_take_the_ready_call_and_stay_exact(output, monkeypatch):
    """Past the always-one-read bound, a call after one that selected little reads once
    through the cached ready call (not the general path), exact even when this call's data
    selects nearly everything; after a dense call too (since 2026-12-01, fifteenth session:
    the ready call writes into outputs sized from the previous fraction, at any fraction;
    a dense call after it counted first before)."""
    monkeypatch.setattr(ct, "ONE_READ_ALWAYS_BYTES", 1000)
    ready, general = [], []
    real_ready, real_general = ck.OneReadCall.__call__, ce.run_one_read
    monkeypatch.setattr(ck.OneReadCall, "__call__",
                        lambda self, *a: ready.append(1) or real_ready(self, *a))
    monkeypatch.setattr(ce, "run_one_read", lambda *a: general.append(1) or real_general(*a))
    pred = parse("x > 0.5")
    sparse = np.zeros(100_003, dtype=np.float32)
    sparse[::97] = 1
    dense = np.ones(100_003, dtype=np.float32)
    dense[::89] = 0
    took = []
    for a_host in (sparse, sparse, dense, dense, sparse, sparse):
        before = len(ready)
        got = compact_array(cupy.asarray(a_host), pred, output=output)
        check(got, expect(a_host, a_host > 0.5, output), output, True)
        took.append(len(ready) > before)
    assert took == [False, True, True, True, True, True] and not general


def test_one_read_result_is_an_exact_size_allocation():
    """The first call's result is a new exact-size array, not a view of the n-sized scratch;
    a later call's is the head of an output sized from the first call's fraction
    (cupy_ready.speculated: within half a percent and a few standard deviations of it)."""
    from dask_compact.backends.cupy_ready import speculated

    pred = parse("x < 0.01")
    a = cupy.random.default_rng(1).random(1 << 20, dtype=np.float32)
    want = cupy.asnumpy(a)[cupy.asnumpy(a) < 0.01]
    first = compact_array(a, pred)
    assert first.size == want.size and held_bytes(first) == pool_bytes(want.size, 4)
    got = compact_array(a, pred)
    assert held_bytes(got) == pool_bytes(speculated(want.size / a.size, a.size), 4)
    assert got.data.mem.size < a.nbytes // 10
    np.testing.assert_array_equal(cupy.asnumpy(got), want)


def test_threshold_follows_the_bytes_moved(monkeypatch):
    """Values of any dtype: under 0.4 of the input selected; float32 indices: under 0.2."""
    monkeypatch.setattr(ct, "ONE_READ_ALWAYS_BYTES", 1000)
    plan = ce.make_plan(cupy.zeros(1001, np.float32), as_predicate("x < 1"),
                    None, "values", "single-pass")
    for output, frac, want in (("values", 0.39, True), ("values", 0.41, False),
                               ("indices", 0.19, True), ("indices", 0.21, False)):
        plan.memo[("fraction", plan.spec.dtype, output)] = frac
        assert ce._one_read(plan, output) is want


def test_small_calls_run_the_cached_launch_and_match_the_general_path(monkeypatch):
    """Repeated small calls go through one cached _OneReadCall per (predicate, dtype, output,
    size, stream); inputs change between calls, results match NumPy and the general path, on
    the default stream and on another one, for every output and an index base."""
    pred = parse("(x > 0.2) & (x < 0.7)")
    rng = np.random.default_rng(8)
    built = []
    real = ck.OneReadCall
    monkeypatch.setattr(ck, "OneReadCall", lambda *a: built.append(1) or real(*a))
    for stream in (None, cupy.cuda.Stream(non_blocking=True)):
        with stream if stream is not None else cupy.cuda.Stream.null:
            for n in (1, 33, 1025, 65_521, 1 << 20):
                for output in ("values", "indices", "both"):
                    for _ in range(3):
                        a_host = rng.random(n).astype(np.float32)
                        a = cupy.asarray(a_host)
                        got = cb.compact(a, pred, output, True, "auto", 11)
                        v, i = a_host[(a_host > 0.2) & (a_host < 0.7)], np.flatnonzero(
                            (a_host > 0.2) & (a_host < 0.7)) + 11
                        check(got, {"values": v, "indices": i, "both": (v, i)}[output],
                              output, True)
                        monkeypatch.setattr(ct, "FAST_SMALL_CALLS", False)
                        check(cb.compact(a, pred, output, True, "auto", 11),
                              {"values": v, "indices": i, "both": (v, i)}[output], output, True)
                        monkeypatch.setattr(ct, "FAST_SMALL_CALLS", True)
    assert len(built) == 2 * 5 * 3  # one per (stream, size, output), reused by the repeats


def test_small_calls_on_views_nd_and_other_devices_are_exact():
    """Non-contiguous views take the general path; C-contiguous N-D input the cached one."""
    pred = parse("x < 0.5")
    base = cupy.random.default_rng(2).random(3 * 4099, dtype=np.float32)
    for a in (base[::3], base[1:].reshape(2, -1)[:, 1:], base.reshape(3, 4099)):
        h = cupy.asnumpy(a)
        np.testing.assert_array_equal(cupy.asnumpy(compact_array(a, pred)), h[h < 0.5])


@pytest.mark.parametrize("sets,sets_bytes", [(16, 256 << 10), (3, 256 << 10), (16, 8)])
def test_repeated_ready_calls_rotate_zeroed_word_sets_and_stay_exact(sets, sets_bytes,
                                                                      monkeypatch):
    """A ready call's single-pass kernel takes one of its tile-word sets in turn, and the
    first call of each round zeroes them all (cupy_ready.PackedKernel). Several rounds of
    calls of one predicate on one size of three tiles (so tiles look back at each other),
    each on new data, match NumPy, through compact_array's and compact_into's ready calls
    (each with its own sets): 16 sets, 3 sets, and one set (zeroed before every call but the
    first) where the byte cap allows no more."""
    from dask_compact import compact_into
    from dask_compact.backends import cupy_ready

    monkeypatch.setattr(cupy_ready, "WORD_SETS", sets)
    monkeypatch.setattr(cupy_ready, "WORD_SETS_BYTES", sets_bytes)
    made = []
    real = cupy_ready.PackedKernel.__init__
    monkeypatch.setattr(cupy_ready.PackedKernel, "__init__",
                        lambda self, *a: real(self, *a) or made.append(self.sets))
    n, calls = 40_009, 3 * sets + 5
    host = np.random.default_rng(sets + sets_bytes).random(n + calls, dtype=np.float32)
    dev = cupy.asarray(host)
    pred = parse("x < 0.5")  # a new predicate object: new ready calls, made under the patch
    out = cupy.empty(n, dtype=np.float32)
    count = cupy.zeros(1, dtype=np.int64)
    bad = []
    for i in range(calls):
        h = host[i : i + n]
        want = h[h < 0.5]
        a = dev[i : i + n]  # C-contiguous, new data at every call
        got = cupy.asnumpy(compact_array(a, pred))
        compact_into(a, pred, out, count=count)
        k = int(count.get()[0])
        if not (np.array_equal(got, want) and k == want.size
                and np.array_equal(cupy.asnumpy(out[:k]), want)):
            bad.append(i)
    assert not bad, f"{len(bad)} wrong calls, first {bad[:5]}"
    assert made == [sets if sets_bytes > 8 else 1] * 2  # compact_array's and compact_into's


def test_small_unstable_auto_calls_take_the_single_pass_kernel(monkeypatch):
    """stable=False with algorithm="auto" runs the single-pass kernel up to
    UNSTABLE_SINGLE_PASS_MAX_N elements (its count is watched, the hybrid's is copied back),
    the hybrid above it (until the predicate has selected once: then the single-pass
    kernel's speculative call) and whenever it is asked for by name; every result exact."""
    from dask_compact import compact_into
    from dask_compact.backends import cupy_ready

    kernels, speculated = [], []
    real = cupy_ready.PackedKernel.__init__
    monkeypatch.setattr(cupy_ready.PackedKernel, "__init__",
                        lambda self, plan, output: real(self, plan, output)
                        or kernels.append(plan.spec.algorithm))
    real_speculate = cupy_ready.OneReadCall._speculate
    monkeypatch.setattr(cupy_ready.OneReadCall, "_speculate",
                        lambda self, *a: speculated.append(self.kernel.hybrid)
                        or real_speculate(self, *a))
    monkeypatch.setattr(ct, "UNSTABLE_SINGLE_PASS_MAX_N", 50_000)
    rng = np.random.default_rng(5)
    for n, algorithm, want_kernel in [(50_000, "auto", "single-pass"),
                                      (50_001, "auto", "hybrid"),
                                      (1_000, "hybrid", "hybrid")]:
        pred = parse("x < 0.25")  # new ready calls for each case
        h = rng.random(n).astype(np.float32)
        a = cupy.asarray(h)
        del kernels[:]
        got = cupy.asnumpy(compact_array(a, pred, stable=False, algorithm=algorithm))
        out, count = cupy.empty(n, np.float32), cupy.empty(1, np.int64)
        compact_into(a, pred, out, count=count, stable=False, algorithm=algorithm)
        k = int(count.get()[0])
        want = np.sort(h[h < 0.25])  # the unordered kernel: compared as sets
        np.testing.assert_array_equal(np.sort(got), want)
        np.testing.assert_array_equal(np.sort(cupy.asnumpy(out[:k])), want)
        if algorithm == "auto" and want_kernel == "hybrid":
            # the call takes the hybrid; the repeated call kept after it, made once the
            # predicate has selected, the single-pass kernel's speculative call (one read, no
            # copy; cupy_calls.exact_algorithm), which the next call runs, order kept
            assert kernels == ["hybrid", "single-pass", "hybrid"], kernels
            del speculated[:]
            again = cupy.asnumpy(compact_array(a, pred, stable=False))
            np.testing.assert_array_equal(again, h[h < 0.25])
            assert speculated == [False], speculated
        else:
            assert kernels == [want_kernel] * 2, (n, algorithm, kernels)


@pytest.mark.parametrize("dtype", ["int8", "float16", "float32", "complex128"])
def test_copy_out_kernel_copies_exactly_the_head(dtype):
    """The ready call's copy out (kernels/copy_out.cu): k elements of any byte length (16-byte
    vectors and a tail), nothing past them read into the result; a misaligned source (a view)
    takes cudaMemcpyAsync. Also above one vector per thread of the capped grid."""
    from dask_compact.backends import cupy_ready
    from dask_compact.backends.cupy_tuning import COPY_BLOCK, COPY_MAX_GRID

    plan = ce.make_plan(cupy.zeros(64, dtype=dtype), parse("x != 0"), None, "values", "single-pass")
    copy_out = cupy_ready.CopyOut(plan.kernels["copy_out"])
    itemsize = np.dtype(dtype).itemsize
    big = COPY_MAX_GRID * COPY_BLOCK * 16 // itemsize + 5  # grid-stride past the capped grid
    rng = np.random.default_rng(3)
    for n in (1, 7, 15, 16, 17, 1025, 65_537, big):
        h = (rng.random(n + 1) * 100).astype(dtype)
        scratch = cupy.asarray(h)
        for k in {0, 1, n // 3, n - 1, n}:
            for src, want in ((scratch, h), (scratch[1:], h[1:])):
                kk = min(k, src.size)
                got = copy_out(src, kk, cupy.cuda.get_current_stream().ptr)
                assert got.dtype == src.dtype and got.shape == (kk,)
                np.testing.assert_array_equal(cupy.asnumpy(got), want[:kk])


# -- compact_array's repeated call (cupy_calls.repeated_call) ----------------------------------

THRESHOLD = 0.5


def _no_dispatch(monkeypatch):
    """compact_array's checked path made to fail: a call that still works took the kept one."""
    import dask_compact.chunk as chunk

    def refuse(*args):
        raise AssertionError("dispatched")

    monkeypatch.setattr(chunk, "compact_chunk", refuse)


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16"])
def test_repeated_call_is_kept_and_exact_on_new_data(output, dtype, monkeypatch):
    ck._repeat_calls.clear()
    rng = np.random.default_rng(7)
    pred = lambda v: v < 40  # noqa: E731
    a_host = (rng.random(100_003) * 100).astype(dtype)
    check(compact_array(cupy.asarray(a_host), pred, output=output),
          expect(a_host, a_host < 40, output), output, True)
    assert len(ck._repeat_calls) == 1
    _no_dispatch(monkeypatch)
    for _ in range(3):  # new data of the same size: the kept call, exact
        a_host = (rng.random(100_003) * 100).astype(dtype)
        check(compact_array(cupy.asarray(a_host), pred, output=output),
              expect(a_host, a_host < 40, output), output, True)
    # the same predicate, another size, output or array layout: not the kept call
    with pytest.raises(AssertionError, match="dispatched"):
        compact_array(cupy.asarray(a_host[:-1]), pred, output=output)
    with pytest.raises(AssertionError, match="dispatched"):
        compact_array(cupy.asarray(a_host), pred, output=output, stable=False)
    with pytest.raises(AssertionError, match="dispatched"):
        compact_array(cupy.asarray(np.stack([a_host, a_host], 1))[:, 0], pred, output=output)


def test_repeated_call_follows_a_rebound_constant(monkeypatch):
    """A function reading a global: rebinding it is a new predicate (the trace key), never the
    kept call of the old value."""
    global THRESHOLD
    ck._repeat_calls.clear()
    pred = lambda v: v < THRESHOLD  # noqa: E731
    a_host = np.random.default_rng(8).random(65_537).astype(np.float32)
    a = cupy.asarray(a_host)
    try:
        for t in (0.5, 0.5, 0.25, 0.75, 0.25):
            THRESHOLD = t
            np.testing.assert_array_equal(cupy.asnumpy(compact_array(a, pred)),
                                          a_host[a_host < t])
        # 0.5's call kept; 0.75 and 0.25's first run the function's shape's call with their
        # own constants (since 2026-12-02, eighteenth session: predicate/function_shape), and
        # 0.25's second the checked call, which keeps its own
        assert len(ck._repeat_calls) == 2
        # a closure cell rebound: the same
        limit = 0.1
        closure = lambda v: v < limit  # noqa: E731
        for limit in (0.1, 0.9, 0.1):
            np.testing.assert_array_equal(cupy.asnumpy(compact_array(a, closure)),
                                          a_host[a_host < limit])
    finally:
        THRESHOLD = 0.5


@pytest.mark.parametrize("pred", ["x < 0.3", as_predicate("x < 0.3")])
def test_repeated_call_for_strings_and_predicates(pred, monkeypatch):
    ck._repeat_calls.clear()
    a_host = np.random.default_rng(9).random(4099)
    a = cupy.asarray(a_host)
    compact_array(a, pred)
    _no_dispatch(monkeypatch)
    np.testing.assert_array_equal(cupy.asnumpy(compact_array(a, pred)), a_host[a_host < 0.3])


def test_repeated_call_not_kept_where_it_must_not_be(monkeypatch):
    from dask_compact import clear_cache

    ck._repeat_calls.clear()
    a_host = np.random.default_rng(10).random(4099).astype(np.float32)
    a = cupy.asarray(a_host)
    pred = lambda v: v > 0.5  # noqa: E731
    # the general path only (the tests of both paths compare them): nothing kept or taken
    monkeypatch.setattr(ct, "FAST_SMALL_CALLS", False)
    compact_array(a, pred)
    assert len(ck._repeat_calls) == 0
    monkeypatch.setattr(ct, "FAST_SMALL_CALLS", True)
    # larger calls choose their path by the previous call's fraction: the hybrid kernel's
    # never kept (it counts first or reads once by that fraction); the single-pass kernel's
    # kept once the predicate has selected (the checked call always takes its ready call
    # then, writing into outputs sized from that fraction), and exact on new data, one
    # that selects more than the outputs hold too
    rng = np.random.default_rng(11)
    big_host = rng.random((ct.ONE_READ_ALWAYS_BYTES >> 5) + 1).astype(np.float32)
    big = cupy.asarray(big_host)
    for _ in range(2):
        got = cupy.asnumpy(compact_array(big, pred, algorithm="hybrid", stable=False))
        np.testing.assert_array_equal(np.sort(got), np.sort(big_host[big_host > 0.5]))
    assert len(ck._repeat_calls) == 0
    np.testing.assert_array_equal(cupy.asnumpy(compact_array(big, pred)),
                                  big_host[big_host > 0.5])
    assert len(ck._repeat_calls) == 1
    with monkeypatch.context() as m:
        _no_dispatch(m)
        for scale in (1.0, 0.6, 1.9):  # the same fraction, fewer, far more than it held
            new_host = (rng.random(big_host.size) * scale).astype(np.float32)
            got = cupy.asnumpy(compact_array(cupy.asarray(new_host), pred))
            np.testing.assert_array_equal(got, new_host[new_host > 0.5])
    ck._repeat_calls.clear()
    # a kept call, then clear_cache(): dispatched again
    compact_array(a, pred)
    assert len(ck._repeat_calls) == 1
    clear_cache()
    assert len(ck._repeat_calls) == 0
    # another stream: another entry
    compact_array(a, pred)
    with cupy.cuda.Stream():
        np.testing.assert_array_equal(cupy.asnumpy(compact_array(a, pred)), a_host[a_host > 0.5])
    assert len(ck._repeat_calls) == 2
    # bad arguments still get their own errors
    with pytest.raises(ValueError, match="output"):
        compact_array(a, pred, output="nope")
    with pytest.raises(ValueError, match="output"):
        compact_array(a, pred, output=["values"])  # unhashable: not looked up, then refused


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_large_outputs_in_size_classes_do_not_grow_the_pool(output):
    """An output of 32 MiB or more is a view of an allocation of its size class: exact, and a
    loop of calls each selecting a little more, each result kept while the next is made,
    reuses the pool's blocks instead of allocating an output a call (the pool grew until
    the device was full, then CuPy flushed it: a stall of 44-91 ms on one H200)."""
    from dask_compact.backends.cupy_device import class_items

    n = 1 << 24
    a = cupy.random.default_rng(21).random(n, dtype=cupy.float32)
    h = cupy.asnumpy(a)
    pool = cupy.get_default_memory_pool()
    prev, totals = None, []
    for r in range(12):
        t = 0.9 + r * 1e-6
        got = compact_array(a, f"x < {t!r}", output=output)
        check(got, expect(h, h < np.float32(t), output), output, True)
        for g in (got if output == "both" else (got,)):
            k = g.size
            assert class_items(k, g.itemsize) > k
            assert held_bytes(g) == pool_bytes(class_items(k, g.itemsize), g.itemsize)
        prev = got  # kept while the next call allocates, as a result not yet released
        totals.append(pool.total_bytes())
    del prev
    grown = totals[-1] - totals[1]
    one = sum(held_bytes(g) for g in (got if output == "both" else (got,)))
    assert grown <= one, (totals, one)  # one class step at most, not an output a call


@pytest.mark.skipif(device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_a_run_over_two_devices_comes_out_as_one_output(output):
    """A run whose chunks lie on two devices (each compacted on its own, then joined on the
    current device): equal to NumPy, and the join allocated in a size class like any large
    exact-size output (2 x 2^23 float32, 90% selected: 60 MiB of values)."""
    from dask_compact.backends.cupy_device import class_items
    from dask_compact.dispatch import compact_many
    from dask_compact.predicate import as_predicate

    rng = np.random.default_rng(9)
    host = [rng.random(2**23, dtype=np.float32) for _ in range(2)]
    blocks = []
    for dev, h in enumerate(host):
        with cupy.cuda.Device(dev):
            blocks.append(cupy.asarray(h))
    bases = [0, 2**23 + 5]
    with cupy.cuda.Device(0):
        got = compact_many.dispatch(cupy.ndarray)(blocks, as_predicate("x < 0.9"), output, True,
                                                  "auto", bases)
    parts = got if output == "both" else (got,)
    m = [h < 0.9 for h in host]
    want = {"values": [np.concatenate([h[k] for h, k in zip(host, m)])],
            "indices": [np.concatenate([np.flatnonzero(k) + b for k, b in zip(m, bases)])]}
    want["both"] = want["values"] + want["indices"]
    for p, w in zip(parts, want[output]):
        assert p.device.id == 0
        np.testing.assert_array_equal(cupy.asnumpy(p), w)
        rows = class_items(len(w), w.dtype.itemsize)
        assert held_bytes(p) == pool_bytes(rows, w.dtype.itemsize)


def test_a_constant_rebound_while_a_call_runs_is_not_kept_under_the_new_value(monkeypatch):
    """Another thread rebinding a global the predicate reads while a call compacts (here from
    inside the call, deterministically): the call used the old value; keeping it under the
    key of the new one (taken after the call) made every later call with the new value run
    the old one (the trace memo's race, a new-user probe 2026-11-30). Not kept; a quiet call
    with either value after it is exact."""
    import dask_compact.chunk as chunk

    global THRESHOLD
    ck._repeat_calls.clear()
    pred = lambda v: v < THRESHOLD  # noqa: E731
    a_host = np.random.default_rng(12).random(4099).astype(np.float32)
    a = cupy.asarray(a_host)
    real = chunk.compact_chunk

    def rebinding(*args, **kwargs):
        global THRESHOLD
        monkeypatch.setattr(chunk, "compact_chunk", real)
        out = real(*args, **kwargs)
        THRESHOLD = 0.875
        return out

    try:
        THRESHOLD = 0.125
        monkeypatch.setattr(chunk, "compact_chunk", rebinding)
        got = cupy.asnumpy(compact_array(a, pred))
        np.testing.assert_array_equal(got, a_host[a_host < 0.125])
        assert len(ck._repeat_calls) == 0
        for t in (0.875, 0.875, 0.125, 0.125):
            THRESHOLD = t
            np.testing.assert_array_equal(cupy.asnumpy(compact_array(a, pred)),
                                          a_host[a_host < t])
        # 0.875's call kept (0.125's first call was not, being traced under another value);
        # 0.125 again runs the shape's call with its own constant, and then its own
        assert len(ck._repeat_calls) == 2
    finally:
        THRESHOLD = 0.5


def test_repeated_call_of_a_predicate_reading_the_clock_reads_it_every_call():
    """``v < time.monotonic_ns()``: never a kept call, nor a kept trace (until 2026-11-30 the
    trace, and so the kept call, held the first call's clock reading)."""
    import time

    ck._repeat_calls.clear()
    now = time.monotonic_ns()
    host = np.random.default_rng(12).permutation(
        now + np.arange(-2_000, 2_000, dtype=np.int64) * 1_000_000)
    a = cupy.asarray(host)
    pred = lambda v: v < time.monotonic_ns()  # noqa: E731
    for _ in range(3):
        before = time.monotonic_ns()
        got = cupy.asnumpy(compact_array(a, pred))
        after = time.monotonic_ns()
        assert (host < before).sum() <= got.size <= (host < after).sum()
        np.testing.assert_array_equal(got, host[host < got.max() + 1])
        time.sleep(0.25)
    assert len(ck._repeat_calls) == 0


class _Interrupted(Exception):
    """Anything raised while a call waits for its count, not a KeyboardInterrupt."""


class _InterruptedWord(np.ndarray):
    """The ready call's mapped count word as the host sees it (a view of the same pinned
    memory): while ``armed`` holds an exception class, the next read of it raises that
    (a KeyboardInterrupt landing in the wait, with no predicate or timing needed)."""

    armed: list = []

    def __getitem__(self, i: Any) -> Any:
        if _InterruptedWord.armed:
            raise _InterruptedWord.armed.pop()()
        return super().__getitem__(i)


@pytest.mark.parametrize("error", [KeyboardInterrupt, _Interrupted], ids=["ctrl-c", "raised"])
@pytest.mark.parametrize("output", ["values", "both"])
@pytest.mark.parametrize("n", [1025, 1 << 20])
def test_a_call_interrupted_in_its_wait_leaves_nothing_a_next_call_reads(error, output, n,
                                                                         monkeypatch):
    """A small compact_array (its ready call, cupy_ready.OneReadCall) interrupted while it
    waits for the count its kernel stores into mapped host memory, then at once another call
    on new data (the same ready call: same predicate, size and stream). Until 2026-12-01
    (fourteenth session; left by the thirteenth session's probes) the interrupted kernel ran
    on and stored its count late into the word the next call had just reset and watched, so
    the next call took that count for its own: its selection cut short or padded with stale
    scratch. The interrupted call now waits for its stream before it raises: the stream is
    idle when it has raised, and every next call matches NumPy. The interrupted kernel is
    held behind a kernel of 0-400 us, so that it ends while the next call watches the word."""
    hold = hold_kernel()
    built = []
    real = ck.OneReadCall
    monkeypatch.setattr(ck, "OneReadCall", lambda *a: built.append(real(*a)) or built[-1])
    monkeypatch.setattr(_InterruptedWord, "armed", [])
    pred = parse("x < 0.5")  # a new predicate object: a new ready call, made under the patch
    rng = np.random.default_rng(n)
    stream = cupy.cuda.Stream(non_blocking=True)
    bad, busy = [], 0
    try:
        with stream:
            first = rng.random(n, dtype=np.float32)
            check(compact_array(cupy.asarray(first), pred, output=output),
                  expect(first, first < 0.5, output), output, True)
            assert len(built) == 1 and built[0].mapped
            call = built[0]
            call.host_count = call.host_count.view(_InterruptedWord)
            for i, ns in enumerate([0, 5_000, 20_000, 50_000, 100_000, 200_000, 400_000] * 6):
                few = rng.random(n, dtype=np.float32) * 5  # about 10% under 0.5
                many = rng.random(n, dtype=np.float32) * 0.55  # about 91%
                a_few, a_many = cupy.asarray(few), cupy.asarray(many)
                stream.synchronize()
                hold((1,), (1,), (np.uint64(ns),))
                _InterruptedWord.armed.append(error)
                with pytest.raises(error):
                    compact_array(a_few, pred, output=output)
                busy += not stream.done  # read at once: the interrupted kernel still queued
                got = compact_array(a_many, pred, output=output)
                want = expect(many, many < 0.5, output)
                try:
                    check(got, want, output, True)
                except AssertionError:
                    bad.append((i, ns))
            assert len(built) == 1  # every call ran the one ready call
    finally:
        cb.forget_ready_calls()  # the call with the patched word goes
    assert not bad, f"{len(bad)} calls after an interrupted one wrong (call, hold ns): {bad[:8]}"
    assert not busy, f"{busy} interrupted calls left their kernel running"


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("dtype", ["int8", "uint16", "float32", "float64"])
@pytest.mark.parametrize("n", [1025, 65_537, (1 << 22) + 9])
def test_speculative_outputs_follow_the_fraction_and_overflow_exactly(output, dtype, n,
                                                                      monkeypatch):
    """After a first call, the ready call writes into outputs sized from the predicate's
    previous fraction (cupy_ready.OneReadCall._speculate; 2026-12-01, fifteenth session):
    each result is the head of such an output, and a call selecting more than it holds runs
    again into exact outputs (two runs of the kernel, the second unbounded). Fractions that
    rise, fall and jump, none and all; against NumPy. stable=False takes the same call (the
    order kept): up to UNSTABLE_SINGLE_PASS_MAX_N always, past it once the predicate has
    selected (its first call there would take the hybrid; here a stable call comes first)."""
    from dask_compact.backends.cupy_ready import OneReadCall, speculated

    runs = []
    real = OneReadCall._run
    monkeypatch.setattr(OneReadCall, "_run",
                        lambda self, a, base, v, i, cap: runs.append(cap) or real(
                            self, a, base, v, i, cap))
    pred = parse("x < 50")
    rng = np.random.default_rng(n)
    prev = None
    for step, scale in enumerate((100, 100, 100.5, 55, 1000, 50, 49, 1000, 60, 200)):
        a_host = (rng.random(n) * scale).astype(dtype)
        a_host.flat[::3] = rng.integers(0, 100, a_host.flat[::3].size)  # some ints exactly
        for stable in (True, False):
            before = len(runs)
            got = compact_array(cupy.asarray(a_host), pred, output=output, stable=stable)
            m = a_host < 50
            check(got, expect(a_host, m, output), output, True)
            k = int(m.sum())
            caps = runs[before:]
            if prev is None:
                assert len(caps) <= 1  # the first call: scratch (or counting first)
            else:
                room = speculated(prev, n)
                assert caps[0] == room, (caps, room)
                # a second, unbounded run exactly where the selection overflowed the room
                assert len(caps) == (2 if k > room else 1), (step, k, room, caps)
                for g in (got if output == "both" else (got,)):
                    assert g.size == k
                    if k <= room:  # the head of the speculative output (else an exact one)
                        assert held_bytes(g) >= room * g.itemsize
            prev = k / n


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32", "float64"])
def test_the_kernel_writes_only_below_its_cap(output, dtype, monkeypatch):
    """dcx_single_pass's cap (kernels/compact_tile.cuh, TileSteps::copy_out): the first cap
    selected elements are written, in order, nothing at or past cap is touched, and the count
    is the whole count; caps at 0, inside a tile, at tile edges and past the count."""
    from dask_compact.backends.cupy_ready import OneReadCall

    n = 300_007
    pred = parse("x < 0.3")
    rng = np.random.default_rng(7)
    a_host = (rng.random(n) * (100 if np.dtype(dtype).kind in "iu" else 1)).astype(dtype)
    if np.dtype(dtype).kind in "iu":
        a_host = (a_host % 2).astype(dtype)  # 0 and 1: about half under 0.3
    a = cupy.asarray(a_host)
    built = []
    monkeypatch.setattr(ck, "OneReadCall", lambda *args: built.append(OneReadCall(*args))
                        or built[-1])
    compact_array(a, pred, output=output)  # builds the ready call (a new predicate object)
    assert len(built) == 1 and built[0].mapped
    call = built[0]
    m = a_host < 0.3
    want_v, want_i = a_host[m], np.flatnonzero(m)
    k = want_v.size
    for cap in (0, 1, 31, 4096, 4097, 65_536, k // 2 + 13, k - 1, k, k + 1, n):
        sentinel_v = np.array(7 if np.dtype(dtype).kind in "iu" else -3.5, dtype)
        vals = cupy.full(n, sentinel_v, dtype) if output != "indices" else None
        idx = cupy.full(n, -9, np.int64) if output != "values" else None
        total = call._run(a, 0, vals, idx, np.uint64(cap))
        assert total == k
        w = min(cap, k)
        if vals is not None:
            v = cupy.asnumpy(vals)
            np.testing.assert_array_equal(v[:w], want_v[:w])
            assert (v[w:] == sentinel_v).all(), (cap, int((v[w:] != sentinel_v).sum()))
        if idx is not None:
            i = cupy.asnumpy(idx)
            np.testing.assert_array_equal(i[:w], want_i[:w])
            assert (i[w:] == -9).all(), (cap, int((i[w:] != -9).sum()))


# ------------------------------------------------- predicates whose constants change ---------


@pytest.mark.parametrize("n", [40_009, (1 << 20) + 7])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("stable,algorithm", [(True, "auto"), (False, "hybrid")])
def test_a_threshold_new_at_each_call_stays_exact(n, output, stable, algorithm, monkeypatch):
    """A threshold chosen per call, as a string and as a function, through compact_array and
    compact_into, alternating with an earlier threshold whose kept calls (ready, repeated)
    run again: every result equals NumPy's. Few word sets, so that the kept calls' launches
    go through several rounds of them."""
    from dask_compact import compact_into
    from dask_compact.backends import cupy_ready

    monkeypatch.setattr(cupy_ready, "WORD_SETS", 3)
    rng = np.random.default_rng(n)
    v_out = cupy.empty(n, np.float32)
    i_out = cupy.empty(n, np.int64)
    out = {"values": v_out, "indices": i_out, "both": (v_out, i_out)}[output]
    count = cupy.zeros(1, np.int64)
    for call in range(24):
        t = 0.5 if call % 3 == 2 else float(rng.uniform(0.05, 0.95))
        h = rng.random(n, dtype=np.float32)
        a = cupy.asarray(h)
        pred = f"x < {t!r}" if call % 2 else (lambda v, t=t: v < t)
        want = expect(h, h < t, output)
        check(compact_array(a, pred, output=output, stable=stable, algorithm=algorithm), want,
              output, stable)
        compact_into(a, pred, out, output=output, count=count, stable=stable,
                     algorithm=algorithm)
        k = int(count.get()[0])
        got = (v_out[:k], i_out[:k]) if output == "both" else out[:k]
        check(got, want, output, stable)


def test_a_new_constant_is_checked_as_a_new_predicate():
    """Calls of one structure with other constants kept (ready and repeated calls) do not
    stand in for a new predicate's checks: a negative integer exponent, which NumPy refuses
    for integers, is refused after calls with positive ones."""
    a = cupy.arange(1, 1001, dtype=np.int64)
    h = cupy.asnumpy(a)
    for e in (2, 3):
        check(compact_array(a, f"x ** {e} > 1000"), h[h ** e > 1000], "values", True)
        check(compact_array(a, f"x ** {e} > 1000"), h[h ** e > 1000], "values", True)
    with pytest.raises(ValueError, match="negative integer powers"):
        np.asarray(h) ** -1
    with pytest.raises(ValueError, match="negative integer powers"):
        compact_array(a, "x ** -1 > 0")
