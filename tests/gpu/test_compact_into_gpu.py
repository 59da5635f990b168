"""The public ``compact_into`` on CuPy arrays: caller buffers and a device count, no host
synchronisation, work queued on a given stream, and calls captured into a CUDA graph and
replayed on new data. Against NumPy. (The kernels themselves, every dtype and algorithm with
poisoned buffers, are tested through the internal entry in test_cupy_kernels.py.)

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from dask_compact import compact_array, compact_into, compact_records_into  # noqa: E402
from dask_compact.backends import cupy_tuning as ct  # noqa: E402
from dask_compact.predicate.parse import parse  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]
SIZES = [0, 1, 31, 33, 1023, 1025, 65_537, (1 << 20) + 7]
KERNELS = {  # id -> (stable, algorithm); "auto" with stable=False is single-pass up to 2^22
    "single-pass": (True, "auto"), "hybrid": (False, "hybrid"), "three-pass": (True, "three-pass"),
}
POISON = 0x5A


def data(n: int, dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(n) < 0.5
    if np.dtype(dtype).kind == "c":
        return (rng.random(n) * 100 + 1j).astype(dtype)
    return (rng.random(n) * 100).astype(dtype)


def pred_for(dtype: str, t: float):
    if dtype == "bool":
        return lambda v: v
    if np.dtype(dtype).kind == "c":
        return lambda v: v.real < t
    return lambda v: v < t


def poisoned(n: int, dtype) -> cupy.ndarray:
    buf = cupy.empty(n, dtype=dtype)
    buf.view(np.uint8).fill(POISON)
    return buf


def same_set(got: np.ndarray, want: np.ndarray, stable: bool) -> None:
    if stable:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_array_equal(np.sort(got), np.sort(want))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("ready", [True, False], ids=["ready-call", "general"])
def test_matches_numpy_tail_untouched(dtype, kernel, ready, monkeypatch):
    """Both the cached ready call (packed launch) and the general path; each size twice with
    new data, so the ready call is reused."""
    monkeypatch.setattr(ct, "FAST_SMALL_CALLS", ready)
    stable, algorithm = KERNELS[kernel]
    for n, seed in [(n, n + r) for n in SIZES for r in (0, 1)]:
        for t in (-1.0, 5.0, 50.0, 101.0):  # none, few, half, all
            a_np = data(n, dtype, seed=seed)
            pred = pred_for(dtype, t)
            m = np.asarray(pred(a_np))
            v, i = poisoned(n, a_np.dtype), poisoned(n, np.int64)
            count = compact_into(cupy.asarray(a_np), pred, (v, i), output="both",
                                 stable=stable, algorithm=algorithm)
            assert isinstance(count, cupy.ndarray) and count.dtype == np.int64
            k = int(count[0])
            assert k == int(m.sum())
            same_set(cupy.asnumpy(v[:k]), a_np[m], stable)
            same_set(cupy.asnumpy(i[:k]), np.flatnonzero(m), stable)
            assert (cupy.asnumpy(v[k:]).view(np.uint8) == POISON).all()
            assert (cupy.asnumpy(i[k:]).view(np.uint8) == POISON).all()


@pytest.mark.parametrize("output", ["values", "indices"])
@pytest.mark.parametrize("count_dtype", [np.int64, np.uint64])
def test_given_count_and_stream_no_sync_needed_between_calls(output, count_dtype):
    """Calls queued back to back on a non-blocking stream, each into its own buffers and
    count, read once at the end."""
    s = cupy.cuda.Stream(non_blocking=True)
    inputs = [data((1 << 18) + 3 * j, "float32", seed=j) for j in range(4)]
    with s:
        dev = [cupy.asarray(a) for a in inputs]
    outs, counts = [], []
    for a in dev:
        out = cupy.empty(a.size, dtype=a.dtype if output == "values" else np.int64)
        with s:  # zeroed in the stream's order, not the default stream's (which s ignores)
            count = cupy.zeros(1, dtype=count_dtype)
        assert compact_into(a, "x < 30", out, output=output, count=count, stream=s) is count
        outs.append(out)
        counts.append(count)
    s.synchronize()
    for a, out, count in zip(inputs, outs, counts):
        k = int(count.get()[0])
        want = a[a < 30] if output == "values" else np.flatnonzero(a < 30)
        np.testing.assert_array_equal(cupy.asnumpy(out[:k]), want)


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "first-call-in-capture"])
def test_graph_capture_replays_on_new_data(kernel, warm):
    """Captured once, replayed three times on new data written into the same input buffer:
    each replay gives that data's selection and count. Capture refuses a synchronisation, so
    this also shows the call never waits for the device."""
    stable, algorithm = KERNELS[kernel]
    n = (1 << 20) + 7
    # a structure of its own per case, so "first call in capture" really builds its module then
    pred = parse(f"(x < 40) & (x != {3.25 + 1000 * (list(KERNELS).index(kernel) + 10 * warm)})")
    a = cupy.asarray(data(n, "float64", seed=1))
    v, i = cupy.empty(n, np.float64), cupy.empty(n, np.int64)
    count = cupy.zeros(1, dtype=np.int64)
    s = cupy.cuda.Stream(non_blocking=True)
    s.wait_event(cupy.cuda.Stream.null.record())  # the input was written on the default one
    if warm:
        compact_into(a, pred, (v, i), output="both", count=count, stream=s,
                     stable=stable, algorithm=algorithm)
        s.synchronize()
    with s:
        s.begin_capture()
        compact_into(a, pred, (v, i), output="both", count=count, stream=s,
                     stable=stable, algorithm=algorithm)
        graph = s.end_capture()
    for seed in (2, 3, 4):
        host = data(n, "float64", seed=seed)
        a.set(host)
        count.fill(-1)
        cupy.cuda.Device().synchronize()
        graph.launch(stream=s)
        s.synchronize()
        m = pred.mask(host)
        k = int(count.get()[0])
        assert k == int(m.sum())
        same_set(cupy.asnumpy(v[:k]), host[m], stable)
        same_set(cupy.asnumpy(i[:k]), np.flatnonzero(m), stable)


def test_default_count_is_new_each_call():
    a = cupy.asarray(data(1025, "int32", seed=9))
    out = cupy.empty(1025, np.int32)
    c1 = compact_into(a, "x < 10", out)
    c2 = compact_into(a, "x < 90", out)
    assert c1 is not c2
    assert int(c1[0]) == int((cupy.asnumpy(a) < 10).sum())
    assert int(c2[0]) == int((cupy.asnumpy(a) < 90).sum())


@pytest.mark.parametrize(
    "make, kwargs, err, match",
    [
        (lambda a: np.empty(a.size, a.dtype), {}, TypeError, "must be a cupy array"),
        (lambda a: cupy.empty(a.size - 1, a.dtype), {}, ValueError, "every element"),
        (lambda a: cupy.empty(a.size, np.float64), {}, TypeError, "dtype float32"),
        (lambda a: a, {}, ValueError, "overlaps the input"),
        (lambda a: cupy.empty(2 * a.size, a.dtype)[::2], {}, ValueError, "contiguous"),
        (lambda a: cupy.empty(a.size, a.dtype), {"count": np.zeros(1, np.int64)}, TypeError,
         "count must be a cupy array"),
        (lambda a: cupy.empty(a.size, a.dtype), {"count": lambda: cupy.zeros(1, np.float64)},
         TypeError, "int64 or uint64"),
    ],
)
def test_bad_buffers_refused(make, kwargs, err, match):
    a = cupy.asarray(data(33, "float32", seed=5))
    before = a.copy()
    # a CuPy count made here, not at collection (where a machine without a GPU failed)
    kwargs = {k: v() if callable(v) else v for k, v in kwargs.items()}
    with pytest.raises(err, match=match):
        compact_into(a, "x > 50", make(a), **kwargs)
    cupy.testing.assert_array_equal(a, before)


def test_overlap_is_judged_by_the_elements_strides_included():
    """A reversed input just below its output is accepted (its elements end where the output
    begins); a strided one reaching into the output is refused; outputs sharing memory too."""
    mem = cupy.arange(40, dtype=cupy.float64)
    a = mem[:10][::-1]
    k = int(compact_into(a, "x > 2", mem[10:20])[0])
    assert k == 7 and cupy.asnumpy(mem[10:17]).tolist() == [9, 8, 7, 6, 5, 4, 3]
    mem = cupy.arange(40, dtype=cupy.float64)
    with pytest.raises(ValueError, match="overlaps the input"):
        compact_into(mem[::2][:10], "x > 2", mem[10:20])
    with pytest.raises(ValueError, match="overlaps the input"):
        compact_into(mem[5:15][::-1], "x > 2", mem[0:10])
    x = cupy.arange(10, dtype=cupy.float64)
    both = cupy.empty(20, cupy.float64)
    with pytest.raises(ValueError, match="out .values. and out .indices. overlap"):
        compact_into(x, "x > 2", (both[:10], both[5:15].view(cupy.int64)), output="both")


@pytest.mark.parametrize("stream", ["stream", 7, object()])
def test_a_stream_that_is_not_one_is_refused_before_anything_runs(stream):
    a = cupy.random.default_rng(3).random(1025, dtype=cupy.float32)
    out = cupy.full(1025, -1, cupy.float32)
    with pytest.raises(TypeError, match="must be a CUDA stream"):
        compact_into(a, "x > 0.5", out, stream=stream)
    assert bool((out == -1).all())


def other_order(a_np: np.ndarray) -> cupy.ndarray:
    """``a_np``'s numbers as a CuPy array of the other byte order: CuPy makes none, only views
    of a swapped dtype (here of the swapped numbers' bytes, copied as they are)."""
    swapped = a_np.astype(a_np.dtype.newbyteorder())
    return cupy.asarray(swapped.view(np.uint8)).view(swapped.dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int16", "uint32", "int64",
                                   "complex64", "complex128"])
@pytest.mark.parametrize("ready", [True, False], ids=["ready-call", "general"])
def test_input_of_the_other_byte_order_matches_numpy(dtype, ready, monkeypatch):
    """A CuPy view of a swapped dtype (``a.view(a.dtype.newbyteorder())``) is compacted as
    the numbers it holds: the calls convert it to native order, each number's bytes reversed
    (validate.to_native). CuPy's ``astype`` to the native dtype copies the bits as they are
    (read in CuPy's source: its kernels type an element by kind and size), which is how the
    calls converted it until 2026-12-01 (thirteenth session). compact_array, compact_into on
    the array and on a strided view of it, compact_records_into with the predicate reading
    it; against NumPy."""
    monkeypatch.setattr(ct, "FAST_SMALL_CALLS", ready)
    n = 65_537
    a_np = data(n, dtype, seed=21)
    pred = pred_for(dtype, 50.0)
    m = np.asarray(pred(a_np))
    a = other_order(a_np)
    assert not a.dtype.isnative
    values, indices = compact_array(a, pred, output="both")
    assert values.dtype == a_np.dtype
    np.testing.assert_array_equal(cupy.asnumpy(values), a_np[m])
    np.testing.assert_array_equal(cupy.asnumpy(indices), np.flatnonzero(m))
    for x, x_np in ((a, a_np), (a[::3], a_np[::3])):
        mx = np.asarray(pred(x_np))
        v = cupy.empty(x.size, a_np.dtype)
        k = int(compact_into(x, pred, v)[0])
        assert k == int(mx.sum())
        np.testing.assert_array_equal(cupy.asnumpy(v[:k]), x_np[mx])
    if a_np.dtype.kind != "c":
        out = {"indices": cupy.empty(n, np.int64), "id": cupy.empty(n, np.int64)}
        fields = {"e": a, "id": cupy.arange(n, dtype=np.int64) * 3}
        k = int(compact_records_into(fields, "e < 50", out)[0])
        assert k == int(m.sum())
        np.testing.assert_array_equal(cupy.asnumpy(out["indices"][:k]), np.flatnonzero(m))
        np.testing.assert_array_equal(cupy.asnumpy(out["id"][:k]), np.flatnonzero(m) * 3)


# ----------------------------------------------------------------- the repeated call ---------
# (backends/cupy_into_repeat.py: the same predicate, kind of input, buffers, count and stream
# again run the call kept the last time, without the public checks)


def _checks_counted(monkeypatch) -> list:
    import dask_compact.chunk as chunk

    seen: list = []
    real = chunk._checked

    def counted(*args, **kwargs):
        seen.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(chunk, "_checked", counted)
    return seen


@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("stable", [True, False])
@pytest.mark.parametrize("pred", ["string", "lambda"])
def test_repeated_call_on_new_inputs_into_the_same_buffers_matches_numpy(output, stable, pred,
                                                                         monkeypatch):
    """A loop of calls on new batches into the same buffers and count checks only the first
    call; every batch's selection equals NumPy's, and the buffers' tails stay untouched."""
    seen = _checks_counted(monkeypatch)
    n = (1 << 20) + 7
    v, i = poisoned(n, np.float32), poisoned(n, np.int64)
    out = {"values": v, "indices": i, "both": (v, i)}[output]
    count = cupy.zeros(1, dtype=np.int64)
    for seed, t in [(1, 50.0), (2, 5.0), (3, 95.0), (4, -1.0), (5, 101.0), (6, 50.0)]:
        a_np = data(n, "float32", seed=seed)
        p = f"x < {t!r}" if pred == "string" else (lambda x, t=t: x < t)
        v.view(np.uint8).fill(POISON)
        i.view(np.uint8).fill(POISON)
        assert compact_into(cupy.asarray(a_np), p, out, output=output, count=count,
                            stable=stable) is count
        m = a_np < t
        k = int(count[0])
        assert k == int(m.sum())
        if output != "indices":
            same_set(cupy.asnumpy(v[:k]), a_np[m], stable)
            assert (cupy.asnumpy(v[k:]).view(np.uint8) == POISON).all()
        if output != "values":
            same_set(cupy.asnumpy(i[:k]), np.flatnonzero(m), stable)
            assert (cupy.asnumpy(i[k:]).view(np.uint8) == POISON).all()
    # checked once in all: every later threshold runs the shape's kept call (a string's since
    # 2026-12-02, seventeenth session; a function's, whose default alone changes, since the
    # eighteenth: backends/cupy_into_repeat.py, predicate/function_shape.py)
    assert len(seen) == 1, seen


def test_repeated_call_refuses_an_input_in_a_buffer_as_the_first_call_does():
    """The input's overlap with the buffers is compared on every repeated call: an input that
    is a view of the output buffer is refused, not compacted in place."""
    n = 4097
    out = cupy.empty(2 * n, np.float32)
    count = cupy.zeros(1, dtype=np.int64)
    a = cupy.asarray(data(n, "float32", seed=7))
    compact_into(a, "x < 60", out, count=count)
    compact_into(a, "x < 60", out, count=count)  # kept
    inside = out[n // 2 : n // 2 + n]
    inside[:] = a
    before = inside.copy()
    with pytest.raises(ValueError, match="overlaps the input"):
        compact_into(inside, "x < 60", out, count=count)
    cupy.testing.assert_array_equal(inside, before)
    # the count overlapping the input too, on a kept call of one element
    one = cupy.asarray([5.0], dtype=np.float32)
    for _ in range(2):
        compact_into(one, "x < 60", out[:1], count=count)
    with pytest.raises(ValueError, match="overlap"):
        compact_into(count.view(np.float32)[:1], "x < 60", out[:1], count=count)


def test_repeated_call_with_a_new_count_each_time_and_other_streams():
    """Without ``count`` every repeated call returns a new count array; a call on another
    stream, or on an input that is not contiguous, takes its own (checked) path; each result
    equals NumPy's."""
    n = 65_537
    out = cupy.empty(n, np.float64)
    a_np = data(n, "float64", seed=8)
    a = cupy.asarray(a_np)
    counts = [compact_into(a, "x < 30", out) for _ in range(3)]
    assert len({id(c) for c in counts}) == 3
    assert all(int(c[0]) == int((a_np < 30).sum()) for c in counts)
    s = cupy.cuda.Stream(non_blocking=True)
    s.wait_event(cupy.cuda.Stream.null.record())
    for _ in range(2):
        c = compact_into(a, "x < 30", out, stream=s)
        s.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(out[: int(c.get()[0])]), a_np[a_np < 30])
    big_np = data(2 * n, "float64", seed=9)
    strided = cupy.asarray(big_np)[::2]
    c = compact_into(strided, "x < 30", out)
    want = big_np[::2][big_np[::2] < 30]
    np.testing.assert_array_equal(cupy.asnumpy(out[: int(c[0])]), want)
