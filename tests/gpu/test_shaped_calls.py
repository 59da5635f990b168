"""compact_array's repeated GPU call for a string whose numbers alone changed
(backends/cupy_shaped.py): a threshold new at each call runs its shape's kept call with its
own constants. Every result against NumPy, and the kept call seen to run.

Needs CuPy and a CUDA device (marked ``gpu``; skipped elsewhere).
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from gpu_helpers import check, expect, served_by_shape  # noqa: E402

from dask_compact import compact_array  # noqa: E402
from dask_compact.backends import cupy_calls as ck  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture
def shaped_hits(monkeypatch):
    """How many calls the shaped path served (a call returned, not None)."""
    yield from served_by_shape(monkeypatch, ck, "shaped_call")


@pytest.mark.parametrize("n", [1, 33, 1025, 100_003, 1 << 20])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("stable", [True, False])
def test_a_threshold_new_at_each_call_runs_the_shaped_call_exactly(n, output, stable,
                                                                     shaped_hits):
    rng = np.random.default_rng(n)
    h = rng.random(n, dtype=np.float32)
    a = cupy.asarray(h)
    # fractions rising, falling and jumping (the kept call's outputs are sized from the
    # previous call's), empty and full selections, a threshold seen before in between
    ts = [0.5, 0.1, 0.9, 0.05, 0.99, 0.0, 1.0, 0.3, 0.5, 0.7, -0.0, 2.0, 0.25, 0.6]
    for t in ts:
        text = f"x < {t!r}"
        check(compact_array(a, text, output=output, stable=stable), expect(h, h < t, output),
              output, stable)
    assert len(shaped_hits) >= len(ts) - 4


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint64", "float16", "float64"])
def test_every_dtype_and_numbers_that_type_otherwise(dtype, shaped_hits):
    """Ints outside the dtype (``x < 300`` on int8 folds into another tree: no shaped call),
    negative ints on unsigned dtypes, floats on int dtypes, two numbers."""
    rng = np.random.default_rng(7)
    if dtype[0] in "iu":
        info = np.iinfo(dtype)
        h = rng.integers(info.min, info.max, 10_007, dtype=dtype, endpoint=True)
        values = ["0", "5", "-5", "100", "127", "128", "300", "-129", "255", "256", "-1", "7",
                  "9223372036854775807", "1"]
    else:
        h = (rng.standard_normal(10_007) * 100).astype(dtype)
        values = ["0.5", "-3.25", "0", "7", "65504.0", "1e400", "-1e400", "-0.0", "12.5"]
    a = cupy.asarray(h)
    for shape in ("x < {}", "({} < x) & (x <= {})"):
        for i, v in enumerate(values):
            w = values[(i + 3) % len(values)]
            text = shape.format(v, w)
            env = {"x": h}
            m = eval(text, env)  # noqa: S307 -- the test's own texts
            check(compact_array(a, text), expect(h, np.asarray(m), "values"), "values", True)
    assert shaped_hits


def test_the_first_texts_own_call_keeps_its_constants(shaped_hits):
    """The shape's call is rebound, never the first text's: that text again selects its own."""
    h = np.random.default_rng(1).random(4097, dtype=np.float32)
    a = cupy.asarray(h)
    for t in (0.5, 0.5, 0.2, 0.8, 0.5, 0.3, 0.5):
        check(compact_array(a, f"x < {t!r}"), h[h < t], "values", True)
    assert set(shaped_hits) == {"x < 0.2", "x < 0.8", "x < 0.3"}


def test_threads_each_with_their_thresholds(shaped_hits):
    h = np.random.default_rng(2).random(50_001, dtype=np.float32)
    errors = []

    def work(seed: int) -> None:
        try:
            with cupy.cuda.Stream(non_blocking=True):
                a = cupy.asarray(h)
                rng = np.random.default_rng(seed)
                for _ in range(40):
                    t = float(rng.uniform(0, 1))
                    got = cupy.asnumpy(compact_array(a, f"(x > {t!r}) & (x < 0.9)"))
                    np.testing.assert_array_equal(got, h[(h > t) & (h < 0.9)])
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[0]
    assert shaped_hits


def test_an_int_outside_the_dtype_takes_the_checked_path(shaped_hits):
    """``x < 300`` on int8 types to another tree (a boolean parameter in the comparison's
    place): never the shape's call with 300 bound into an int8 slot."""
    h = np.arange(-128, 128, dtype=np.int8)
    a = cupy.asarray(h)
    for t in ("5", "300", "-7", "-300", "3", "127", "128"):
        text = f"x < {t}"
        check(compact_array(a, text), h[h < int(t)], "values", True)
    assert "x < 300" not in shaped_hits and "x < -300" not in shaped_hits
    assert "x < 128" not in shaped_hits and "x < -7" in shaped_hits


@pytest.fixture
def into_hits(monkeypatch):
    """How many compact_into calls the shaped path served."""
    from dask_compact.backends import cupy_into_repeat

    yield from served_by_shape(monkeypatch, cupy_into_repeat, "_shaped_hit")


@pytest.mark.parametrize("n", [33, 100_003, 1 << 20])
@pytest.mark.parametrize("output", ["values", "indices", "both"])
@pytest.mark.parametrize("stable", [True, False])
@pytest.mark.parametrize("own_stream", [False, True])
def test_compact_into_with_a_threshold_new_at_each_call(n, output, stable, own_stream,
                                                        into_hits):
    """compact_into into the same buffers, a new threshold each call and earlier ones again,
    several calls queued before the results are read (their constants are the ones they were
    launched with): every result NumPy's."""
    from dask_compact import compact_into

    rng = np.random.default_rng(n)
    h = rng.random(n, dtype=np.float32)
    stream = cupy.cuda.Stream(non_blocking=True) if own_stream else None
    with stream if stream is not None else cupy.cuda.Stream.null:
        a = cupy.asarray(h)
    ts = [0.5, 0.1, 0.9, 0.5, 0.0, 1.0, 0.3, 0.7, 0.1]
    outs = []
    for t in ts:  # each into buffers of its own, read after all are queued
        v = cupy.empty(n, np.float32)
        i = cupy.empty(n, np.int64)
        out = {"values": v, "indices": i, "both": (v, i)}[output]
        count = cupy.zeros(1, np.int64)
        compact_into(a, f"x < {t!r}", out, output=output, count=count, stable=stable,
                     stream=stream)
        outs.append((t, v, i, count))
    # the same buffers each call: the repeated and shaped calls' keys hold them
    v = cupy.empty(n, np.float32)
    i = cupy.empty(n, np.int64)
    out = {"values": v, "indices": i, "both": (v, i)}[output]
    count = cupy.zeros(1, np.int64)
    sync = (stream or cupy.cuda.get_current_stream()).synchronize
    for t in ts:
        compact_into(a, f"x < {t!r}", out, output=output, count=count, stable=stable,
                     stream=stream)
        sync()  # a non-blocking stream: count.get() waits for the current one only
        k = int(count.get()[0])
        got = (v[:k], i[:k]) if output == "both" else out[:k]
        check(got, expect(h, h < t, output), output, stable)
    sync()
    for t, v1, i1, c1 in outs:
        k = int(c1.get()[0])
        got = (v1[:k], i1[:k]) if output == "both" else (v1 if output == "values" else i1)[:k]
        check(got, expect(h, h < t, output), output, stable)
    assert len(into_hits) >= 5


@pytest.mark.parametrize("text", ["x < 0.2" + "0" * 2100 + "1", "x < ١.٥", "x < 1٣",
                                  "x < ５.0"])
def test_a_text_the_parse_refuses_is_refused_with_its_shape_kept(text, shaped_hits):
    """The shaped call finds a text's shape with no parse: a text of the kept shape longer
    than parse.MAX_LENGTH, or whose numbers are in digits Python's syntax has not (float()
    and int() read them), ran there (until 2026-12-02, seventeenth session, a regression
    review); refused as the parse refuses it, however often the shape ran before."""
    h = np.random.default_rng(3).random(1031, dtype=np.float32)
    a = cupy.asarray(h)
    for t in ("x < 0.25", "x < 0.5", "x < 0.75", "x < 1", "x < 7"):
        check(compact_array(a, t), h[h < float(t.split()[-1])], "values", True)
    for _ in range(2):
        with pytest.raises(ValueError, match="over 2000|not valid syntax"):
            compact_array(a, text)
    assert text not in shaped_hits


def test_bool_and_float16_numbers_and_calls_evicted_or_cleared(shaped_hits):
    """Numbers that type or round otherwise: ints beside a bool array (compared in int64:
    2 and -1 select as NumPy), floats past float16 (65520.0 and 1e5 round to inf), signed
    zeros; then the shape's calls evicted (memory-entries 1, sizes cycled) and dropped by
    clear_cache() between runs of texts they served: each result NumPy's."""
    import dask

    import dask_compact
    from dask_compact.backends import cupy_shaped

    rng = np.random.default_rng(11)
    hb = rng.integers(0, 2, 4099).astype(bool)
    ab = cupy.asarray(hb)
    for v in ("1", "0", "2", "-1", "1", "0.5", "1.5", "-0.5"):
        text = f"x < {v}"
        check(compact_array(ab, text), hb[eval(text, {"x": hb})], "values", True)  # noqa: S307
    hh = (rng.standard_normal(4099) * 2e4).astype(np.float16)
    hh[:4] = [np.inf, -np.inf, -0.0, 0.0]
    ah = cupy.asarray(hh)
    for v in ("0.5", "65504.0", "65520.0", "1e5", "-1e5", "-0.0", "0.0", "1e400", "0.5"):
        text = f"(x <= {v}) | (x > 3e4)"
        with np.errstate(over="ignore"):  # NumPy's cast of 1e5 to float16 warns
            want = hh[eval(text, {"x": hh})]  # noqa: S307
        check(compact_array(ah, text), want, "values", True)
    with dask.config.set({"dask-compact.cache.memory-entries": 1}):
        hs = {n: rng.random(n, dtype=np.float32) for n in (257, 1031, 4099)}
        arrays = {n: cupy.asarray(h) for n, h in hs.items()}
        for k in range(30):
            n, t = (257, 1031, 4099)[k % 3], [0.25, 0.5, 0.75, 0.125][k % 4]
            if k == 17:
                dask_compact.clear_cache()
                assert not cupy_shaped._runs
            got = compact_array(arrays[n], f"x < {t!r}")
            check(got, hs[n][hs[n] < t], "values", True)
            assert len(cupy_shaped.shaped_calls) <= 1
