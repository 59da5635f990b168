"""compact_array's and compact_into's repeated GPU calls for a function whose numbers alone
changed (predicate/function_shape.py, backends/cupy_shaped.py): ``lambda v: v < t`` with a
new ``t`` at each call runs its shape's kept call with its own constants. Every result
against NumPy, the kept call seen to run where it should and never where the function's own
code uses the number.

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from gpu_helpers import check, expect, served_by_shape  # noqa: E402

from dask_compact import compact_array, compact_into  # noqa: E402
from dask_compact.backends import cupy_calls as ck  # noqa: E402
from dask_compact.backends import cupy_into_repeat  # noqa: E402

pytestmark = pytest.mark.gpu

G_T = 0.5


@pytest.fixture
def hits(monkeypatch):
    """The functions whose compact_array calls the shaped path served."""
    yield from served_by_shape(monkeypatch, ck, "shaped_call", functions_only=True)


@pytest.fixture
def into_hits(monkeypatch):
    yield from served_by_shape(monkeypatch, cupy_into_repeat, "_shaped_hit",
                               functions_only=True)


def _closure(t):
    return lambda v: v < t


THRESHOLDS = [0.5, 0.1, 0.9, 0.05, 0.99, 0.0, 1.0, 0.3, 0.5, 0.7, -0.0, 2.0, 0.25, 0.6]


@pytest.mark.parametrize("n", [1, 33, 1025, 100_003, 1 << 20])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("stable", [True, False])
def test_a_threshold_new_at_each_call_runs_the_shaped_call_exactly(n, output, stable, hits):
    rng = np.random.default_rng(n)
    h = rng.random(n, dtype=np.float32)
    a = cupy.asarray(h)
    for t in THRESHOLDS:
        check(compact_array(a, _closure(t), output=output, stable=stable),
              expect(h, h < t, output), output, stable)
    assert len(hits) >= len(THRESHOLDS) - 4


def _band(lo, hi):
    return lambda v: (v > lo) & (v <= hi)


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint8", "int32", "uint64", "float16",
                                   "float64"])
def test_every_dtype_and_numbers_that_type_otherwise(dtype, hits):
    """Ints outside the dtype (folded into another tree: never the shape's call), negative
    ints on unsigned dtypes, floats on int dtypes, floats past float16, signed zeros."""
    rng = np.random.default_rng(7)
    if dtype == "bool":
        h = rng.integers(0, 2, 10_007).astype(bool)
        values = [1, 0, 2, -1, 1, 0.5, 1.5, -0.5]
    elif dtype[0] in "iu":
        info = np.iinfo(dtype)
        h = rng.integers(info.min, info.max, 10_007, dtype=dtype, endpoint=True)
        values = [0, 5, -5, 100, 127, 128, 300, -129, 255, 256, -1, 7, 2**63 - 1, 1, 2**64,
                  2.5, -0.5, 1e30]
    else:
        h = (rng.standard_normal(10_007) * 100).astype(dtype)
        values = [0.5, -3.25, 0.0, 7, 65504.0, 65520.0, 1e400, -1e400, -0.0, 12.5, 3]
    a = cupy.asarray(h)
    for i, lo in enumerate(values):
        hi = values[(i + 3) % len(values)]
        with np.errstate(over="ignore"):
            want = (h > lo) & (h <= hi)
        check(compact_array(a, _band(lo, hi)), expect(h, want, "values"), "values", True)
    assert hits


def _twice(t):
    return lambda v: v < t * 2


def _branch(t):
    return lambda v: v < 0.75 if t == 0 else v < t


def _power(t):
    return lambda v: (v + 1) ** t > 1.5


def _cast(t):
    return lambda v: v < np.float32(t)


def _negated(t):
    return lambda v: v > -t


@pytest.mark.parametrize("make", [_twice, _branch, _power, _cast, _negated])
def test_a_number_the_functions_own_code_uses_is_traced_per_value(make, hits):
    h = np.random.default_rng(5).random(4099, dtype=np.float32)
    a = cupy.asarray(h)
    for t in (0.25, 0.0, 0.5, 2.0, 0.125, 0.25):
        want = np.asarray(make(t)(h))
        check(compact_array(a, make(t)), h[want], "values", True)
    assert not hits


def test_a_global_rebound_between_calls(hits):
    global G_T

    def f(v):
        return (v < G_T) & ~np.isnan(v)

    h = np.random.default_rng(3).random(1031, dtype=np.float32)
    h[::7] = np.nan
    a = cupy.asarray(h)
    try:
        for t in (0.5, 0.25, 0.75, 0.5, 0.1, 1.0):
            G_T = t
            check(compact_array(a, f), h[(h < t) & ~np.isnan(h)], "values", True)
    finally:
        G_T = 0.5
    assert len(hits) >= 3


def test_defaults_and_ints_then_floats(hits):
    """A default's value, and an int then a float in one place: two shapes, each right."""
    h = np.random.default_rng(4).integers(-50, 50, 5003).astype(np.int32)
    a = cupy.asarray(h)
    for t in (3, 7, -2, 3.5, -2.5, 10, 0.5, 49):
        f = lambda v, t=t: v >= t  # noqa: E731
        check(compact_array(a, f), h[h >= t], "values", True)
    assert len(hits) >= 4


def test_a_value_rebound_while_calls_run(hits):
    """One function, its cell rebound by another thread while this one calls: afterwards
    each value again selects its own (a run kept under one value's key with another's
    constants would not)."""
    h = np.random.default_rng(6).random(50_001, dtype=np.float32)
    a = cupy.asarray(h)
    ts = [0.2, 0.4, 0.6, 0.8]
    t = ts[0]
    f = lambda v: v < t  # noqa: E731
    wanted = {x: h[h < x] for x in ts}
    stop = threading.Event()

    def rebind() -> None:
        nonlocal t
        k = 0
        while not stop.is_set():
            t = ts[k % 4]
            k += 1

    th = threading.Thread(target=rebind)
    th.start()
    try:
        for _ in range(300):
            got = cupy.asnumpy(compact_array(a, f))
            assert any(got.size == w.size and np.array_equal(got, w) for w in wanted.values())
    finally:
        stop.set()
        th.join()
    for x in ts * 2:
        t = x
        check(compact_array(a, f), wanted[x], "values", True)


def test_threads_each_with_their_thresholds(hits):
    h = np.random.default_rng(2).random(50_001, dtype=np.float32)
    errors = []

    def work(seed: int) -> None:
        try:
            with cupy.cuda.Stream(non_blocking=True):
                a = cupy.asarray(h)
                rng = np.random.default_rng(seed)
                for _ in range(40):
                    t = float(rng.uniform(0, 1))
                    got = cupy.asnumpy(compact_array(a, lambda v, t=t: (v > t) & (v < 0.9)))
                    np.testing.assert_array_equal(got, h[(h > t) & (h < 0.9)])
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert hits


@pytest.mark.parametrize("n", [33, 100_003, 1 << 20])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("stable", [True, False])
def test_compact_into_with_a_threshold_new_at_each_call(n, output, stable, into_hits):
    """Into the same buffers, a new threshold each call; and calls queued into buffers of
    their own before any is read (each keeps the constants it was launched with)."""
    rng = np.random.default_rng(n)
    h = rng.random(n, dtype=np.float32)
    a = cupy.asarray(h)
    ts = [0.5, 0.1, 0.9, 0.5, 0.0, 1.0, 0.3, 0.7, 0.1]
    outs = []
    for t in ts:
        v = cupy.empty(n, np.float32)
        i = cupy.empty(n, np.int64)
        count = cupy.zeros(1, np.int64)
        compact_into(a, _closure(t), {"values": v, "indices": i, "both": (v, i)}[output],
                     output=output, count=count, stable=stable)
        outs.append((t, v, i, count))
    v = cupy.empty(n, np.float32)
    i = cupy.empty(n, np.int64)
    out = {"values": v, "indices": i, "both": (v, i)}[output]
    count = cupy.zeros(1, np.int64)
    for t in ts:
        compact_into(a, _closure(t), out, output=output, count=count, stable=stable)
        k = int(count.get()[0])
        got = (v[:k], i[:k]) if output == "both" else out[:k]
        check(got, expect(h, h < t, output), output, stable)
    for t, v1, i1, c1 in outs:
        k = int(c1.get()[0])
        got = (v1[:k], i1[:k]) if output == "both" else (v1 if output == "values" else i1)[:k]
        check(got, expect(h, h < t, output), output, stable)
    assert len(into_hits) >= 5


def test_a_value_called_again_gets_a_call_of_its_own(hits):
    """A shape serves a value's first call; its second goes the checked way and keeps the
    value's own repeated call, which every later call of it runs (a shaped run is made per
    call, slower than a kept one)."""
    h = np.random.default_rng(9).random(1 << 16, dtype=np.float32)
    a = cupy.asarray(h)
    for t in (0.5, 0.25, 0.25, 0.25, 0.25, 0.75, 0.75):
        check(compact_array(a, _closure(t)), h[h < t], "values", True)
    assert len(hits) == 2  # 0.25's first call and 0.75's
    assert len(ck._repeat_calls) == 3
