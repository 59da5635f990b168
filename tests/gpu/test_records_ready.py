"""compact_records' ready call (backends/cupy_records_ready.py), its repeated public call and
the ready sync-free call of compact_records_into,
against NumPy: a loop of calls on new data of one layout (kept workspace, packed launches,
outputs of earlier calls intact), the general call beside it, layouts that must not share a
call (dtype, trailing shape, rows, order in memory, a rebound constant), the workspace taken
per call, two streams, several threads, and bad input after a good call."""

from __future__ import annotations

import threading

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")

from gpu_helpers import ArmedStream, hold_kernel  # noqa: E402

from dask_compact import compact_records  # noqa: E402

pytestmark = pytest.mark.gpu


def batch(n: int, seed: int) -> dict:
    """A ray batch: origin and direction (n, 3) float32, throughput float32, pixel int32,
    depth uint8, alive bool."""
    rng = np.random.default_rng(seed)
    return {
        "origin": rng.random((n, 3)).astype(np.float32),
        "dir": rng.standard_normal((n, 3)).astype(np.float32),
        "throughput": rng.random(n).astype(np.float32),
        "pixel": rng.integers(0, 2**31 - 1, n).astype(np.int32),
        "depth": rng.integers(0, 9, n).astype(np.uint8),
        "alive": rng.random(n) < rng.random(),
    }


def want(f_np: dict, mask: np.ndarray, indices: bool) -> dict:
    out = {k: v[mask] for k, v in f_np.items()}
    if indices:
        out["indices"] = np.flatnonzero(mask)
    return out


def same(got: dict, expected: dict) -> None:
    assert list(got) == list(expected)
    for k, w in expected.items():
        g = got[k]
        assert isinstance(g, cupy.ndarray) and g.dtype == w.dtype and g.shape == w.shape, k
        np.testing.assert_array_equal(cupy.asnumpy(g), w, err_msg=k)


def test_a_loop_of_batches_of_one_layout() -> None:
    """Twelve calls, each on new data of one layout and a different selected fraction (none
    and all included): each against NumPy, and every earlier call's outputs unchanged by the
    later calls (the workspace is kept, the outputs are not)."""
    from dask_compact.backends import cupy_records_ready as ready

    n = (1 << 20) + 3
    pred = "alive & (throughput > 0.25) & (depth < 7)"
    kept = []
    for i in range(12):
        f_np = batch(n, 100 + i)
        if i == 3:
            f_np["alive"][:] = False
        if i == 4:
            f_np["alive"][:] = True
            f_np["throughput"][:] = 1
            f_np["depth"][:] = 0
        f = {k: cupy.asarray(v) for k, v in f_np.items()}
        mask = f_np["alive"] & (f_np["throughput"] > 0.25) & (f_np["depth"] < 7)
        got = compact_records(f, pred, indices=i % 2 == 0)
        expected = want(f_np, mask, i % 2 == 0)
        same(got, expected)
        kept.append((got, expected))
    for got, expected in kept:
        same(got, expected)
    assert any(k[3] == n for k in ready._calls._items), "the loop ran no ready call"


@pytest.mark.parametrize("n", [1, 31, 33, 4097, 8193, 65_537, 1_000_003])
@pytest.mark.parametrize("p", [0.0, 0.05, 0.5, 1.0])
def test_ready_and_general_calls_agree(monkeypatch, n: int, p: float) -> None:
    """The same call through the ready call and through the general one (its first call
    builds the ready call, the second runs it), against NumPy."""
    from dask_compact.backends import cupy_tuning

    f_np = batch(n, n)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    t = 1 - p - (1e-3 if p == 1 else 0)
    mask = f_np["throughput"] >= t if p else np.zeros(n, bool)
    pred = f"throughput >= {t!r}" if p else "throughput > 2"
    expected = want(f_np, mask, True)
    for fast in (False, True, True):
        monkeypatch.setattr(cupy_tuning, "FAST_SMALL_CALLS", fast)
        same(compact_records(f, pred, indices=True), expected)


def test_layouts_do_not_share_a_call() -> None:
    """A call kept for one layout is not run on another: other dtypes, trailing shapes,
    rows, field order, a field in Fortran order or a strided view (not contiguous), an
    unaligned view (other copy units), a lambda whose constant was rebound."""
    n = 50_001
    rng = np.random.default_rng(5)
    a = rng.random(n).astype(np.float32)
    pos = rng.random((n, 3)).astype(np.float32)
    threshold = 0.5
    pred = lambda a: a < threshold  # noqa: E731 - rebound below

    def run(fields_np: dict, fields_cp: dict | None = None) -> None:
        f = fields_cp if fields_cp is not None else {k: cupy.asarray(v)
                                                     for k, v in fields_np.items()}
        mask = fields_np["a"] < threshold
        same(compact_records(f, pred), want(fields_np, mask, False))

    for _ in range(2):  # the second round runs each layout's kept call
        run({"a": a, "pos": pos})
        run({"a": a.astype(np.float64), "pos": pos})
        run({"a": a, "pos": pos.astype(np.float64)})
        run({"a": a, "pos": pos[:, :2].copy()})
        run({"a": a[:-1], "pos": pos[:-1]})
        run({"pos": pos, "a": a})
        fortran = cupy.asfortranarray(cupy.asarray(pos))
        run({"a": a, "pos": pos}, {"a": cupy.asarray(a), "pos": fortran})
        wide = cupy.asarray(np.repeat(pos, 2, axis=1))
        run({"a": a, "pos": pos[:, [0, 0, 1, 1, 2, 2]]}, {"a": cupy.asarray(a), "pos": wide})
        strided = cupy.asarray(np.repeat(a, 2))[::2]
        run({"a": a, "pos": pos}, {"a": strided, "pos": cupy.asarray(pos)})
        off = cupy.asarray(np.concatenate([[0], pos.ravel()]).astype(np.float32))[1:]
        run({"a": a, "pos": pos}, {"a": cupy.asarray(a), "pos": off.reshape(n, 3)})
    threshold = 0.2
    run({"a": a, "pos": pos})


def test_workspace_taken_per_call(monkeypatch) -> None:
    """A call whose workspace is above KEEP_SCRATCH_BYTES takes it from CuPy's pool per call
    and writes its pointers into the packed launches each time."""
    from dask_compact.backends import cupy_records_ready as ready

    monkeypatch.setattr(ready, "KEEP_SCRATCH_BYTES", 0)
    n = 300_017
    for seed in range(4):
        f_np = batch(n, seed)
        f = {k: cupy.asarray(v) for k, v in f_np.items()}
        _ = cupy.empty(1 << 20, dtype=np.uint8)  # other allocations between calls
        same(compact_records(f, "alive | (pixel % 5 == 1)", indices=True),
             want(f_np, f_np["alive"] | (f_np["pixel"] % 5 == 1), True))
    calls = [c for c in ready._by_content._items.values() if c.n == n]
    assert calls and all(c.ws is None for c in calls)


def test_dense_from_read_at_each_call(monkeypatch) -> None:
    """REC_DENSE_FROM is read at each call by a ready call too (it packs its launches once):
    0 sends every span to the scatter, 2 every span to the list form, rows exact each time."""
    from dask_compact.backends import cupy_records_ready as ready
    from dask_compact.backends import cupy_tuning

    n = 400_009
    f_np = batch(n, 7)
    rng = np.random.default_rng(8)
    f_np["alive"] = rng.random(n) < np.repeat(rng.random(n // 5_000 + 1), 5_000)[:n]
    f_np["alive"][::4096] = True  # no span without a selected row: each is in a list
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    expected = want(f_np, f_np["alive"], False)
    same(compact_records(f, "alive"), expected)
    for share, lists in ((0.0, (49, 0)), (2.0, (0, 49)), (0.5, None)):
        monkeypatch.setattr(cupy_tuning, "REC_DENSE_FROM", share)
        same(compact_records(f, "alive"), expected)
        # this layout's call (other tests in the process may have made calls of n rows)
        (call,) = [c for c in ready._by_content._items.values()
                   if c.n == n and [name for name, *_ in c.layout] == list(f)]
        if lists is not None:
            assert tuple(int(v) for v in call.host[1:]) == lists, share
        else:
            assert min(int(v) for v in call.host[1:]) > 5


def test_outputs_made_early_in_size_classes(monkeypatch) -> None:
    """Outputs of the previous call's size classes, made while the first passes run: kept
    where this call's total has the same classes (no output allocated after the count),
    freed and replaced where not (a total in another class, or one below the classes); rows
    exact every time, earlier calls' outputs intact, with and without indices."""
    from dask_compact.backends import cupy_records_ready as ready
    from dask_compact.backends.cupy_device import OUTPUT_CLASS_MIN_BYTES, class_items

    made = []
    real = ready.output_empty

    def counted(*args, **kwargs):
        made.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(ready, "output_empty", counted)
    n = 12_000_017
    rng = np.random.default_rng(11)
    perm = rng.permutation(n).astype(np.int64)
    f_np = {"a": rng.random(n).astype(np.float32), "xy": rng.standard_normal((n, 2))}
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    smallest = OUTPUT_CLASS_MIN_BYTES // 4 + 1  # rows from which every output has classes
    base, near, other = 10_000_000, 10_001_000, 11_500_000
    rows = (4, 8, 16)  # a, key and indices, xy
    assert all(class_items(base, r) == class_items(near, r) for r in rows)
    assert all(class_items(other, r) == class_items(other - 7, r) for r in rows)
    assert all(class_items(base, r) != class_items(other, r) for r in rows)
    kept = []
    # (selected rows, indices, whether outputs are allocated after the count); one predicate
    # (a call per predicate and layout), the key shifted to select the rows wanted
    for total, indices, after in ((base, False, True), (near, False, False),
                                  (smallest - 9, False, True), (base, False, True),
                                  (other, False, True), (other - 7, False, False),
                                  (base, True, True), (near, True, False)):
        f_np["key"] = perm - total
        f["key"] = cupy.asarray(f_np["key"])
        made.clear()
        got = compact_records(f, "key < 0", indices=indices)
        assert bool(made) == after, (total, indices)
        expected = want(f_np, f_np["key"] < 0, indices)
        same(got, expected)
        assert got["a"].shape[0] == total
        kept.append((got, expected))
    for got, expected in kept:
        same(got, expected)


def test_equal_predicates_share_a_call() -> None:
    """Two predicate objects of one text (a predicate made anew per call) find one ready
    call: built once, by what it computes."""
    from dask_compact.backends import cupy_records
    from dask_compact.backends import cupy_records_ready as ready
    from dask_compact.predicate.fields import _parsed
    from dask_compact.records_check import check_record_predicate

    n = 70_001
    f_np = batch(n, 17)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    p1 = check_record_predicate("depth > 3", f)
    _parsed.cache_clear()
    p2 = check_record_predicate("depth > 3", f)
    assert p1 is not p2
    for p in (p1, p2, p1):
        same(cupy_records.compact_records(f, p, True, True, 5),
             {**want(f_np, f_np["depth"] > 3, False),
              "indices": 5 + np.flatnonzero(f_np["depth"] > 3)})
    call = ready.ready_records_call(f, p1, True)
    assert call is not None and call is ready.ready_records_call(f, p2, True)


def test_two_streams_and_threads() -> None:
    """Calls queued on two streams in turn, and from four threads at once, each on its own
    data: every result is its data's."""
    n = 200_003
    data = [batch(n, 40 + i) for i in range(4)]
    f = [{k: cupy.asarray(v) for k, v in d.items()} for d in data]
    cupy.cuda.Device().synchronize()
    expected = [want(d, d["alive"] & (d["depth"] > 2), True) for d in data]
    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(2)]
    for rnd in range(3):
        for i in range(4):
            with streams[(i + rnd) % 2]:
                same(compact_records(f[i], "alive & (depth > 2)", indices=True), expected[i])
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with cupy.cuda.Stream(non_blocking=True):
                for _ in range(5):
                    same(compact_records(f[i], "alive & (depth > 2)", indices=True),
                         expected[i])
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@pytest.mark.parametrize("first", ["records", "array"])
def test_fresh_threads_one_after_another(first: str) -> None:
    """A dask pool thread can start after the thread that built a ready call has ended (and
    threading.get_ident(), the calls' key until 2026-12-01, may give it the same id): its
    first CUDA call was then a kept call's launch, in a thread where no runtime call had
    bound a context yet (the key is one object per thread now: cupy_launch.thread_key).
    That launch failed with CUDA_ERROR_INVALID_CONTEXT (ds.compact.where's GPU test on a
    threaded scheduler); each call below is its thread's first CUDA call."""
    from dask_compact import compact_array

    d = batch(100_003, 7)
    f = {k: cupy.asarray(v) for k, v in d.items()}
    a = cupy.asarray(np.random.default_rng(1).random(2**20).astype(np.float32))
    ha = cupy.asnumpy(a)
    cupy.cuda.Device().synchronize()
    expected = want(d, d["alive"] & (d["depth"] > 2), True)
    got: list = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            if first == "records":
                got.append(compact_records(f, "alive & (depth > 2)", indices=True))
            else:
                got.append(compact_array(a, "x > 0.5"))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    for _ in range(6):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert not errors, errors
    for g in got:
        if first == "records":
            same(g, expected)
        else:
            np.testing.assert_array_equal(cupy.asnumpy(g), ha[ha > 0.5])


def test_bad_input_after_a_good_call_is_refused() -> None:
    """The repeated call skips the checks only for a layout that passed them: rows of
    different lengths, a field named like the indices, an unknown field and a mixed
    NumPy/CuPy record are refused as on a first call."""
    n = 10_007
    f_np = batch(n, 9)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    pred = "alive & (depth > 2)"
    for _ in range(2):
        same(compact_records(f, pred, indices=True),
             want(f_np, f_np["alive"] & (f_np["depth"] > 2), True))
    with pytest.raises(ValueError, match="same number of rows"):
        compact_records({**f, "depth": f["depth"][:-1]}, pred, indices=True)
    with pytest.raises(ValueError, match="indices"):
        compact_records({**f, "indices": f["pixel"]}, pred, indices=True)
    with pytest.raises(ValueError, match="energy"):
        compact_records(f, "alive & (energy > 2)", indices=True)
    with pytest.raises(TypeError, match="mix NumPy and CuPy"):
        compact_records({**f, "pixel": f_np["pixel"]}, pred, indices=True)


@pytest.mark.parametrize("n", [1, 33, 8193, 1_000_003])
def test_into_loop_on_kept_buffers_and_new_ones(monkeypatch, n: int) -> None:
    """compact_records_into through its ready call: new data in the same fields and buffers
    each call (nothing waited for between calls but the count's read), other buffers every
    third call, a subset of the fields written, and the general call beside it."""
    from dask_compact import compact_records_into
    from dask_compact.backends import cupy_tuning

    f = {k: cupy.asarray(v) for k, v in batch(n, 50).items()}
    pred = "alive & (throughput < 0.7)"
    out = {"origin": cupy.empty((n, 3), np.float32), "depth": cupy.empty(n, np.uint8),
           "indices": cupy.empty(n, np.int64)}
    for i in range(7):
        monkeypatch.setattr(cupy_tuning, "FAST_SMALL_CALLS", i != 5)
        host = batch(n, 60 + i)
        for k in f:
            f[k].set(host[k])
        if i % 3 == 2:
            out = {k: cupy.empty_like(v) for k, v in out.items()}
        k = int(compact_records_into(f, pred, out).get()[0])
        mask = host["alive"] & (host["throughput"] < 0.7)
        assert k == int(mask.sum())
        np.testing.assert_array_equal(cupy.asnumpy(out["origin"][:k]), host["origin"][mask])
        np.testing.assert_array_equal(cupy.asnumpy(out["depth"][:k]), host["depth"][mask])
        np.testing.assert_array_equal(cupy.asnumpy(out["indices"][:k]), np.flatnonzero(mask))


def test_into_queued_back_to_back_on_a_stream() -> None:
    """Calls queued one after another on a non-blocking stream, each into buffers of its own
    and a count of its own, read only at the end: each holds its data's selection (the kept
    workspace is reused in stream order)."""
    from dask_compact import compact_records_into

    n = 300_001
    data = [batch(n, 70 + i) for i in range(4)]
    f = [{k: cupy.asarray(v) for k, v in d.items()} for d in data]
    s = cupy.cuda.Stream(non_blocking=True)
    s.wait_event(cupy.cuda.Stream.null.record())
    results = []
    for i in range(4):
        out = {"pixel": cupy.empty(n, np.int32), "dir": cupy.empty((n, 3), np.float32)}
        count = cupy.empty(1, np.uint64)
        compact_records_into(f[i], "depth > 4", out, count=count, stream=s)
        results.append((out, count))
    s.synchronize()
    for d, (out, count) in zip(data, results):
        mask = d["depth"] > 4
        k = int(count.get()[0])
        assert k == int(mask.sum())
        np.testing.assert_array_equal(cupy.asnumpy(out["pixel"][:k]), d["pixel"][mask])
        np.testing.assert_array_equal(cupy.asnumpy(out["dir"][:k]), d["dir"][mask])


def test_into_repeated_call_skips_only_equal_checks(monkeypatch) -> None:
    """compact_records_into again with the same fields, buffers and count runs the kept call
    without the checks (they are made to fail here: the call must not reach them); other
    buffers, another count or another predicate are checked, and bad ones refused."""
    import dask_compact.records as records
    from dask_compact import compact_records_into

    n = 20_011
    f_np = batch(n, 80)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    out = {"pixel": cupy.empty(n, np.int32), "indices": cupy.empty(n, np.int64)}
    count = cupy.empty(1, np.int64)
    mask = f_np["depth"] < 3
    compact_records_into(f, "depth < 3", out, count=count)

    def refuse(*args, **kwargs):
        raise AssertionError("checked again")

    with monkeypatch.context() as m:
        m.setattr(records, "checked_fields", refuse)
        for _ in range(3):
            host = batch(n, 81 + _)
            for k in f:
                f[k].set(host[k])
            got = compact_records_into(f, "depth < 3", out, count=count)
            k = int(got.get()[0])
            mask = host["depth"] < 3
            assert got is count and k == int(mask.sum())
            np.testing.assert_array_equal(cupy.asnumpy(out["pixel"][:k]), host["pixel"][mask])
            np.testing.assert_array_equal(cupy.asnumpy(out["indices"][:k]),
                                          np.flatnonzero(mask))
        with pytest.raises(AssertionError, match="checked again"):
            compact_records_into(f, "depth < 3", out)  # another (new) count
        with pytest.raises(AssertionError, match="checked again"):
            compact_records_into(f, "depth < 4", out, count=count)
    with pytest.raises(ValueError, match="room for every row|shape"):
        compact_records_into(f, "depth < 3", {"pixel": out["pixel"][:-1]}, count=count)
    with pytest.raises(ValueError, match="overlaps"):
        compact_records_into(f, "depth < 3", {"pixel": f["pixel"]}, count=count)
    with pytest.raises(ValueError, match="overlap"):
        compact_records_into(f, "depth < 3", {"indices": out["indices"]},
                             count=out["indices"][:1])


def test_a_closure_rebound_while_a_call_runs_is_not_kept_under_the_new_value(monkeypatch
                                                                               ) -> None:
    """compact_records and compact_records_into keep their call under the caller's predicate
    after the call: a closure constant rebound while it ran (from inside it here) must not
    keep the call of the old value under the new value's key (a new-user probe, 2026-11-30:
    the trace memo's race). Every later quiet call is exact."""
    import dask_compact.dispatch as dispatch
    import dask_compact.records as records
    from dask_compact import compact_records_into
    from dask_compact.backends import cupy_records_repeat as repeat

    n = 9_001
    f_np = batch(n, 90)
    f = {k: cupy.asarray(v) for k, v in f_np.items()}
    limit = 2

    def rebinding(real, name, module):
        def run(*args, **kwargs):
            nonlocal limit
            monkeypatch.setattr(module, name, real)
            out = real(*args, **kwargs)
            limit = 6
            return out
        return run

    pred = lambda depth: depth < limit  # noqa: E731
    repeat._repeats.clear()
    monkeypatch.setattr(records, "compact_records_in_memory", rebinding(
        records.compact_records_in_memory, "compact_records_in_memory", records))
    same(compact_records(f, pred, indices=True), want(f_np, f_np["depth"] < 2, True))
    assert len(repeat._repeats) == 0
    for limit in (6, 6, 2, 2):  # noqa: B007 -- the closure reads it
        same(compact_records(f, pred, indices=True), want(f_np, f_np["depth"] < limit, True))
    assert len(repeat._repeats) == 2

    limit = 1
    out = {"pixel": cupy.empty(n, np.int32)}
    count = cupy.empty(1, np.int64)
    repeat._into_repeats.clear()
    monkeypatch.setattr(dispatch, "compact_records_into", rebinding(
        dispatch.compact_records_into, "compact_records_into", dispatch))
    k = int(compact_records_into(f, pred, out, count=count).get()[0])
    assert k == int((f_np["depth"] < 1).sum())
    assert len(repeat._into_repeats) == 0
    for limit in (6, 6, 1, 1):  # noqa: B007
        k = int(compact_records_into(f, pred, out, count=count).get()[0])
        mask = f_np["depth"] < limit
        assert k == int(mask.sum())
        np.testing.assert_array_equal(cupy.asnumpy(out["pixel"][:k]), f_np["pixel"][mask])
    assert len(repeat._into_repeats) == 2


class _Interrupted(Exception):
    """Anything raised before a call's sync, not a KeyboardInterrupt."""


@pytest.mark.parametrize("error", [KeyboardInterrupt, _Interrupted], ids=["ctrl-c", "raised"])
def test_a_call_interrupted_before_its_sync_leaves_no_table_upload_queued(error,
                                                                          monkeypatch) -> None:
    """The ready call writes its column table into one of two pinned tables in turn, before
    its sync where it makes its outputs early (the previous total's size classes), relying
    on the call between to have synchronised. Until 2026-12-01 (fourteenth session; a sweep
    after the ready call's fix, daeb377) a call interrupted before its sync broke that: the
    next call wrote its table over the one the call before the interrupted one had queued
    after its sync, and that call's copy ran with the next call's column table (its outputs
    left unwritten). The interrupted call now waits for its stream before it raises. Here
    each call's uploads are held behind a timer kernel of 0.1-2 ms (a GPU behind the host);
    the first call of each round makes its outputs after its count (another size class than
    the round before), the second is interrupted, the third makes its outputs early."""
    from dask_compact.backends import cupy_records_ready as rr
    from dask_compact.backends import cupy_records_repeat

    kept = (rr._calls, rr._by_content, cupy_records_repeat._repeats)
    hold = hold_kernel()
    built: list = []
    real = rr.RecordsCall
    monkeypatch.setattr(rr, "RecordsCall", lambda *a: built.append(real(*a)) or built[-1])
    n = 8_000_003
    rng = np.random.default_rng(77)
    stream = cupy.cuda.Stream(non_blocking=True)
    pred = "k < 0.375"  # a constant of its own: a call of its own
    bad, busy = [], 0
    for c in kept:  # a call of this test only: made under the patch
        c.clear()
    try:
        with stream:
            a_np = rng.standard_normal(n)
            a = cupy.asarray(a_np)

            def fields(frac: float) -> tuple[dict, dict]:
                """Fields selecting about ``frac`` of the rows (float64: 8-byte rows, so 0.55 of
                them are above the size classes' bound)."""
                k_np = rng.random(n) * (0.375 / frac)
                return {"a": a_np, "k": k_np}, {"a": a, "k": cupy.asarray(k_np)}

            f_np, f = fields(0.5)
            same(compact_records(f, pred), want(f_np, f_np["k"] < 0.375, False))
            assert len(built) == 1
            call = built[0]
            upload, holds = call._upload_columns, [0]

            def held(*args):
                hold((1,), (1,), (np.uint64(holds[0]),))  # on the call's stream (the current)
                return upload(*args)

            call._upload_columns = held
            call.stream = armed = ArmedStream(call.stream)
            for i, ns in enumerate([100_000, 500_000, 2_000_000] * 4):
                holds[0] = ns
                (n1, f1), (_, f2), (n3, f3) = fields(0.55), fields(0.3), fields(0.8)
                stream.synchronize()
                got1 = compact_records(f1, pred)
                armed.error = error
                with pytest.raises(error):
                    compact_records(f2, pred)
                busy += not armed.done  # read at once: the interrupted call's work still queued
                got3 = compact_records(f3, pred)
                stream.synchronize()
                for got, g_np in ((got1, n1), (got3, n3)):
                    try:
                        same(got, want(g_np, g_np["k"] < 0.375, False))
                    except AssertionError:
                        bad.append((i, ns))
            assert len(built) == 1  # every call ran the one ready call
    finally:
        for c in kept:  # the call with the held uploads and the armed stream goes
            c.clear()
    assert not bad, f"{len(bad)} calls around an interrupted one wrong (round, hold ns): {bad}"
    assert not busy, f"{busy} interrupted calls left their work queued"
