"""Workers without the memory for numba's compiler (see :mod:`dask_compact.compiler_room`).

A probe (2026-11-30): 2 workers of 256 MiB each holding 50 MB of a persisted input (~155 MiB
RSS). A worker's first compiled loop loads numba (~100 MiB that stays): the workers passed
their pause fraction (80%) or were restarted at 95%, and ``map_compact`` never returned where
plain Dask's ``x[x > 0.97]`` took 0.2-0.5 s. Such workers now take the NumPy mask path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys

import dask
import dask.array as da
import numpy as np
import pytest

import dask_compact  # noqa: F401 -- adds map_compact
from dask_compact import compiler_room
from dask_compact.backends import numpy_backend
from dask_compact.codegen import numba_loop
from dask_compact.predicate import as_predicate

N, CHUNK = 12_500_007, 1_000_000  # 100 MB of float64: 50 MB a worker


def _input() -> da.Array:
    """Made on the workers (a from_array graph would carry the whole array to each)."""
    return (da.arange(N, chunks=CHUNK, dtype=np.float64) * 0.6180339887) % 1.0


def _numpy() -> np.ndarray:
    a = (np.arange(N, dtype=np.float64) * 0.6180339887) % 1.0
    return a[a > 0.97]


def _numba_loaded(dask_worker=None) -> bool:  # noqa: ANN001 -- client.run's argument
    return "numba" in sys.modules


@contextlib.contextmanager
def _two_small_workers(**settings):
    """A client of two one-thread worker processes of 256 MiB, under dask ``settings``;
    closed within :data:`CLOSE_LIMIT` seconds (:func:`_close_or_kill`)."""
    distributed = pytest.importorskip("distributed")
    with dask.config.set(settings):
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit="256MiB", processes=True,
            dashboard_address=":0", worker_dashboard_address=None)
        try:
            with distributed.Client(cluster) as c:
                yield c
        finally:
            _close_or_kill(cluster)


CLOSE_LIMIT = 60  # s; a close on the loaded 2-core machine took up to 30 s (see below)


def _close_or_kill(cluster) -> None:
    """Close ``cluster``; where that takes over :data:`CLOSE_LIMIT` seconds, SIGKILL its worker
    processes and close it again. A CI run of 2026-12-01 (tenth session) waited on the close
    after ``test_workers_that_keep_dying_end_the_call_with_killed_worker[True]`` until the
    test's 240 s limit: the call had ended with KilledWorker and both workers were back, but
    a nanny's worker process never ended (its watcher thread still joining it). Not
    reproduced since; a close that hangs is distributed's, and what this test guards is the
    call, so the close is bounded rather than left to fail the run."""
    import signal

    try:
        cluster.close(timeout=CLOSE_LIMIT)
        return
    except Exception:  # noqa: BLE001 -- distributed's timeout error, whichever type
        pass
    for nanny in list(cluster.workers.values()):
        proc = getattr(getattr(nanny, "process", None), "process", None)
        pid = getattr(proc, "pid", None)
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        cluster.close(timeout=CLOSE_LIMIT)


@pytest.fixture
def small_workers():
    with _two_small_workers() as c:
        yield c


@pytest.mark.timeout(30)  # before: the workers paused (or were restarted) and the call hung
@pytest.mark.parametrize("by_worker", [True, False])
@pytest.mark.filterwarnings("ignore")
def test_workers_without_room_for_the_compiler_take_the_mask_path(small_workers, by_worker):
    from distributed import wait

    x = _input().persist()
    wait(x)
    got = x.map_compact(lambda v: v > 0.97, by_worker=by_worker).compute()
    np.testing.assert_array_equal(got, _numpy())
    assert not any(small_workers.run(_numba_loaded).values())


@pytest.fixture
def dying_workers():
    """:func:`small_workers` for workers that die under a call, their nannies restarting them.

    Two settings (2026-12-01: the test failed now and then on the loaded 2-core machine,
    with the old code too): LocalCluster closes a worker's nanny where no worker of that
    name is back ``distributed.deploy.lost-worker-timeout`` (15 s) after a loss; a worker
    that died again within those 15 s, caught restarting by the first death's check, lost
    its nanny for good (every worker's, so the call waited for ever: a test timeout). Off
    while the cluster lives, as in ``cluster_helpers.cluster_for_kills``. And the scheduler
    ends a task after 2 deaths of the workers running it (distributed's ``allowed-failures``,
    3 by default): one round of deaths on the tasks' path, not two, each waiting for the
    nannies' new processes (5-10 s apiece there)."""
    with _two_small_workers(**{"distributed.scheduler.allowed-failures": ALLOWED_FAILURES,
                               "distributed.deploy.lost-worker-timeout": "1h"}) as c:
        yield c


ALLOWED_FAILURES = 1


# A hang is what this guards against, the cluster's start and close timed too (func_only
# left the close unbounded; pytest-timeout takes one limit a test): those took up to 30 s each
# on the loaded machine, the call up to 54 s (see the docstring), so 240 s in all.
@pytest.mark.timeout(240)
@pytest.mark.parametrize("by_worker", [True, False])
@pytest.mark.filterwarnings("ignore")
def test_workers_that_keep_dying_end_the_call_with_killed_worker(dying_workers, by_worker):
    """A worker restarted at each chunk (as by its nanny at 95% of its memory_limit): the
    direct call falls back to the tasks, and the tasks end with distributed's KilledWorker
    after its allowed failures, not a hang.

    Until 2026-12-01 this failed now and then under load, with the old code too (3 of 3
    runs beside a busy loop and other tests): LocalCluster's lost-worker check closed the
    nannies of workers dying twice within 15 s (the call then hung: the 90 s timeout), or
    the call took 33-54 s against a bound of 30 s (3-7 s on an idle machine): every death
    waits for a new worker process, which took 5-10 s there. Now that check is off, the
    scheduler allows one failure, the error must come from that count, and only the call is
    timed, against a hang rather than the machine's speed (see :func:`dying_workers`)."""
    import os

    from distributed import KilledWorker, wait

    def dies_on_a_chunk(v):  # noqa: ANN001, ANN202 -- nested, so that it is sent by value
        if isinstance(v, np.ndarray) and v.size > 100:
            os._exit(1)
        return np.asarray(v) > 0.5  # np.asarray: not traced, so NumPy calls it on each chunk

    x = da.arange(10_000, chunks=1000, dtype=np.float64).persist()
    wait(x)
    with pytest.raises(KilledWorker) as killed:
        x.map_compact(dies_on_a_chunk, by_worker=by_worker).compute()
    assert killed.value.allowed_failures == ALLOWED_FAILURES  # the scheduler's count ended it
    # the last restarts done before the cluster closes (a close during one took ~27 s)
    dying_workers.wait_for_workers(2)


@pytest.fixture
def no_room(monkeypatch):
    """This process as a worker of 256 MiB, pausing at 80%, that has not loaded numba (nor
    built any loop: the check runs where the in-process cache misses, and an earlier test of
    this process built `x > c` on float64; a review found the tests failing after it)."""
    _refuse_here(monkeypatch)


def _refuse_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """See :func:`no_room`: also the compiled scans, splits and gathers forgotten (each backend
    keeps its module of loops once imported: numba is then loaded anyway)."""
    numba_loop.clear_cache()
    monkeypatch.setattr(compiler_room, "_LOADED", "not.a.module")
    monkeypatch.setattr(compiler_room, "_worker_limit", lambda: (256 << 20, 0.8, "pauses"))
    monkeypatch.setitem(sys.modules, "distributed", sys.modules.get("distributed", sys))
    monkeypatch.setattr(compiler_room, "_IMPORTED", {})


def test_the_reason_names_the_memory_limit(no_room):
    reason = compiler_room.no_room_for_compiler()
    assert reason is not None
    assert "memory_limit of 256 MiB" in reason and "80%" in reason


@pytest.mark.parametrize("output", ["values", "indices", "both"])
def test_no_room_takes_the_mask_path_and_logs_why(no_room, caplog, output):
    a = np.random.default_rng(3).random(10_000)
    pred = as_predicate(lambda v: v > 0.97)
    with caplog.at_level(logging.DEBUG, logger="dask_compact"):
        got = numpy_backend.compact(a, pred, output)
    assert "mask path (no room for numba" in caplog.text
    want = numpy_backend.compact_masked(a, a > 0.97, output)
    for g, w in zip(got if output == "both" else [got], want if output == "both" else [want]):
        np.testing.assert_array_equal(g, w)


def test_the_refusal_is_not_kept(monkeypatch):
    """A worker refused now compiles once it has the room (the refusal is not cached)."""
    tp = as_predicate(lambda v: v < 0.123456).typed(np.dtype(np.float64))
    numba_loop.clear_cache()  # the check runs where the in-process cache misses (see no_room)
    monkeypatch.setattr(numba_loop, "no_room_for_compiler", lambda: "no room")
    with pytest.raises(numba_loop.UnsupportedPredicate, match="no room"):
        numba_loop.fused_loop(tp, "values")
    monkeypatch.setattr(numba_loop, "no_room_for_compiler", lambda: None)
    assert callable(numba_loop.fused_loop(tp, "values"))


def test_the_limit_is_read_from_this_process_workers():
    """A cluster of threads: its workers' limit and pause fraction, none once it is closed."""
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1,
        threads_per_worker=1,
        processes=False,
        memory_limit="100MiB",
        dashboard_address=":0",
    ):
        assert compiler_room._worker_limit() == (100 << 20, 0.8, "pauses")
    assert compiler_room._worker_limit() == (None, 1.0, "")


def test_ordinary_processes_are_not_refused():
    """No worker here, or numba already loaded: nothing to check."""
    assert compiler_room.no_room_for_compiler() is None


def test_a_worker_set_changing_during_the_check_is_no_limit(monkeypatch):
    """A cluster of threads may start or collect a worker while a task checks (a weak set
    changing size as it is listed): the limit is taken as unknown, the task goes on (a
    review: the RuntimeError failed the task)."""
    distributed = pytest.importorskip("distributed")

    class Changing:
        def __iter__(self):
            raise RuntimeError("Set changed size during iteration")

    monkeypatch.setattr(distributed.Worker, "_instances", Changing())
    assert compiler_room._worker_limit() == (None, 1.0, "")


def test_the_reason_says_restarted_where_pausing_is_off(monkeypatch):
    manager = type("M", (), {"memory_pause_fraction": False})()
    with dask.config.set({"distributed.worker.memory.terminate": 0.95}):
        assert compiler_room._ceiling_fraction(manager) == (0.95, "is restarted")
    assert compiler_room._ceiling_fraction(
        type("M", (), {"memory_pause_fraction": 0.8})()) == (0.8, "pauses")


# --- Every public call on a worker without room: NumPy's answer, and numba never imported ----
# (2026-11-30, sixth session: compact_records, partition, cumsum and algorithm="scan" loaded
# numba whatever the room; on the probe's 256 MiB workers each paused them for good and the
# call never returned, as map_compact had.)

SIZES = (0, 1, 31, 33, 64, 1023, 1025, 70_007)  # 70_007 (7 x 10_001): more than a scan step


def _values(n: int, dtype: str, seed: int) -> np.ndarray:
    """Random values of ``dtype`` with the awkward ones in: for floats NaN, +-0.0, +-inf and a
    signalling NaN; for integers the extremes (sums that wrap)."""
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(n) < 0.4
    if dt.kind == "f":
        a = (rng.standard_normal(n) * 100).astype(dt)
        special = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf], dt)
    else:
        info = np.iinfo(dt)
        a = rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
        special = np.array([info.min, info.max, 0], dt)
    a[: min(n, special.size)] = special[: min(n, special.size)]
    if dt == np.float64 and n:
        a[n // 2 : n // 2 + 1].view(np.uint64)[:] = 0x7FF0000000000001  # signalling NaN
    return a


def _same(got, want) -> None:  # noqa: ANN001 -- arrays, scalars, tuples of them
    """Equal to the bit, with the same dtype and shape."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()


def _both_ways(monkeypatch, call):  # noqa: ANN001, ANN202
    """``call()`` on the compiled path, then in a process without room for numba."""
    compiled = call()
    _refuse_here(monkeypatch)
    try:
        return compiled, call()
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("dtype", ["bool", "int8", "int32", "uint64", "int64", "float32",
                                   "float64"])
def test_no_room_scans_as_the_loop_and_numpy(monkeypatch, dtype):
    """scan_array and the chunk steps of cumsum (a chunk's scan from its offset, its total)
    give the compiled loop's bits without it, and np.cumsum's where that is the question."""
    from dask_compact import scan_array
    from dask_compact.backends import numpy_scan

    for n in SIZES:
        a = _values(n, dtype, n)
        acc = np.cumsum(a[:0]).dtype
        base = acc.type(-3.25 if acc.kind == "f" else 7)

        def calls(a=a, acc=acc, base=base):  # noqa: ANN001, ANN202
            return tuple(
                [scan_array(a, exclusive=e) for e in (True, False)]
                + [scan_array(a, exclusive=e, dtype=d) for e in (True, False)
                   for d in ("int32", "uint64", "float32", "float64")
                   if not (a.dtype.kind == "f" and np.dtype(d).kind != "f")]
                + [numpy_scan.scan(a, e, "auto", acc, base) for e in (True, False)]
                + [numpy_scan.total(a, acc), numpy_scan.total(a, np.dtype("int32"))
                   if a.dtype.kind != "f" else numpy_scan.total(a, np.dtype("float32"))]
            )

        with np.errstate(all="ignore"):
            compiled, plain = _both_ways(monkeypatch, calls)
            _same(plain, compiled)
            _same(plain[1], np.cumsum(a))
            _same(plain[0][1:], np.cumsum(a)[:-1])


@pytest.mark.parametrize("dtype", ["int8", "uint16", "float16", "float32", "float64"])
def test_no_room_partitions_and_scan_compactions_as_numpy(monkeypatch, dtype):
    """partition_array (its values, its indices, both; a traced predicate, one the loop
    refuses, an untraceable callable; a 2-D array) and compact_array(algorithm="scan")."""
    from dask_compact import compact_array, partition_array

    preds = ["x > 3", lambda v: np.sin(v) > 0.1, lambda v: v.astype(np.float64) > 3]
    for n in SIZES:
        a = _values(n, dtype, n + 1)
        a = a.reshape(-1, 7) if n == 70_007 else a

        def calls(a=a):  # noqa: ANN001, ANN202
            return tuple(
                [partition_array(a, p, output=o) for p in preds
                 for o in ("values", "indices", "both")]
                + [compact_array(a, "x > 3", output=o, algorithm="scan")
                   for o in ("values", "indices", "both")]
            )

        with np.errstate(all="ignore"):
            compiled, plain = _both_ways(monkeypatch, calls)
            _same(plain, compiled)
            flat = a.reshape(-1)
            m = flat > 3
            _same(plain[2][:2], (np.concatenate([flat[m], flat[~m]]),
                                 np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)])))
            assert plain[2][2] == int(m.sum())
            _same(plain[-1], (flat[m], np.flatnonzero(m)))


def test_no_room_compacts_records_as_numpy(monkeypatch):
    """compact_records (trailing axes, a big-endian field, indices; a traced predicate, one
    the loop refuses, an untraceable one) and compact_records_into."""
    from dask_compact import compact_records, compact_records_into

    for n in SIZES:
        e = _values(n, "float32", n + 2)
        fields = {"e": e, "id": np.arange(n, dtype=">i8"),
                  "pos": _values(3 * n, "float64", n).reshape(n, 3)}
        preds = ["(e > 3) | (id < 9)", lambda e: np.sin(e) > 0.1,
                 lambda e: e.astype(np.float64) > 3]

        def calls(fields=fields, preds=preds, n=n):  # noqa: ANN001, ANN202
            out = [compact_records(fields, p, indices=True) for p in preds]
            into = {"pos": np.empty((n, 3)), "id": np.empty(n, ">i8"),
                    "indices": np.empty(n, np.int64)}
            k = int(compact_records_into(fields, "e > 3", into)[0])
            return tuple(tuple(o.values()) for o in out) + tuple(
                into[name][:k] for name in into)

        with np.errstate(all="ignore"):
            compiled, plain = _both_ways(monkeypatch, calls)
            _same(plain, compiled)
            m = (e > 3) | (fields["id"] < 9)
            _same(plain[0], (e[m], fields["id"][m], fields["pos"][m], np.flatnonzero(m)))
            m = e > 3
            _same(plain[3:], (fields["pos"][m], fields["id"][m], np.flatnonzero(m)))


def test_the_record_pass_alone_builds_no_loop_without_room(no_room):
    """predicate_bits (the split's and the batch's record tasks' first pass) asks for the room
    as the one-array loop does: the mask path's bits, no loop built (nor cached: the room may
    come later)."""
    from dask_compact.backends.numpy_records import predicate_bits
    from dask_compact.codegen import numba_records
    from dask_compact.predicate.fields import record_predicate

    numba_records._loops.clear()
    e = _values(1025, "float64", 5)
    bits, k = predicate_bits(record_predicate("e < 0.4321", ("e",)), {"e": e}, e.size)
    m = e < 0.4321
    assert k == int(m.sum()) and len(numba_records._loops) == 0
    want = np.zeros(bits.size * 64, bool)
    want[: e.size] = m
    _same(bits, np.packbits(want, bitorder="little").view("<u8").astype(np.uint64))


def _refuse_the_compiler(dask_worker=None) -> None:  # noqa: ANN001 -- client.run's argument
    """This worker without room for numba whatever it holds (its limit and RSS as they are)."""
    from dask_compact import compiler_room

    compiler_room.COMPILER_FOOTPRINT = 1 << 50


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore")
def test_every_call_on_a_worker_without_room_leaves_numba_unloaded():
    """A worker process refused the compiler: each public call returns NumPy's answer, and
    numba is not imported there after it (its import is the memory such a worker lacks)."""
    distributed = pytest.importorskip("distributed")
    import dask_compact as dc

    rng = np.random.default_rng(11)
    a = rng.random(10_007)
    ints = rng.integers(-1000, 1000, 10_007, dtype=np.int32)
    pos = rng.random((10_007, 3)).astype(np.float32)
    m = a > 0.5

    def in_tasks(fn):  # noqa: ANN001, ANN202 -- fn on each chunk, results joined
        return da.from_array(a, chunks=1000).map_blocks(fn, chunks=(np.nan,), dtype=float)

    checks = {
        "map_compact": (lambda: x.map_compact("x > 0.5"), a[m]),
        "compact_records": (
            lambda: dc.compact_records({"x": x, "pos": xp}, "x > 0.5", indices=True),
            {"x": a[m], "pos": pos[m], "indices": np.flatnonzero(m)}),
        "partition": (lambda: dc.partition(x, "x > 0.5", output="both"),
                      (np.concatenate([a[m], a[~m]]),
                       np.concatenate([np.flatnonzero(m), np.flatnonzero(~m)]), int(m.sum()))),
        "cumsum": (lambda: (dc.cumsum(xi), dc.cumsum(xi, exclusive=True)),
                   (np.cumsum(ints), np.concatenate([[0], np.cumsum(ints)[:-1]]))),
        "scan compaction": (lambda: in_tasks(
            lambda b: dc.compact_array(b, "x > 0.5", algorithm="scan")), a[m]),
        "scan_array": (lambda: in_tasks(lambda b: dc.scan_array(b > 0.5, dtype=np.int64)),
                       np.concatenate([np.cumsum(c > 0.5) - (c > 0.5)
                                       for c in np.split(a, range(1000, a.size, 1000))])),
        "compact_into": (lambda: in_tasks(_compacted_into), a[m]),
        "sort radix": (lambda: (dc.sort(x, local="radix"), dc.argsort(x, local="radix")),
                       (np.sort(a), np.argsort(a, kind="stable"))),
    }
    with (
        distributed.LocalCluster(n_workers=1, threads_per_worker=1, memory_limit="4GiB",
                                 processes=True, dashboard_address=":0",
                                 worker_dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):  # fmt: skip
        client.run(_refuse_the_compiler)
        x = da.from_array(a, chunks=1000).persist()
        xi = da.from_array(ints, chunks=1000).persist()
        xp = da.from_array(pos, chunks=(1000, 3)).persist()
        for name, (call, want) in checks.items():
            got = dask.compute(call())[0]
            if isinstance(want, dict):
                _same(tuple(got.values()), tuple(want.values()))
            elif name == "partition":
                _same(tuple(got[:2]), want[:2])
                assert got[2] == want[2]
            else:
                _same(got, want)
            assert not any(client.run(_numba_loaded).values()), f"{name} loaded numba"


def _compacted_into(b: np.ndarray) -> np.ndarray:
    from dask_compact import compact_into

    out = np.empty_like(b)
    k = int(compact_into(b, "x > 0.5", out)[0])
    return out[:k]
