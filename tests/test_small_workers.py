"""Workers without the memory for numba's compiler (see :mod:`dask_compact.compiler_room`).

A probe (2026-11-30): 2 workers of 256 MiB each holding 50 MB of a persisted input (~155 MiB
RSS). A worker's first compiled loop loads numba (~100 MiB that stays): the workers passed
their pause fraction (80%) or were restarted at 95%, and ``map_compact`` never returned where
plain Dask's ``x[x > 0.97]`` took 0.2-0.5 s. Such workers now take the NumPy mask path.
"""

from __future__ import annotations

import logging
import sys
import time

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


@pytest.fixture
def small_workers():
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, memory_limit="256MiB",
                                 processes=True, dashboard_address=None,
                                 worker_dashboard_address=None) as cluster,
        distributed.Client(cluster) as c,
    ):  # fmt: skip
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


# The call is timed itself: the cluster's close after the restarts now and then takes ~26 s
# in distributed's nanny (seen in full-file runs on the loaded 2-core machine, not alone).
@pytest.mark.timeout(90)
@pytest.mark.parametrize("by_worker", [True, False])
@pytest.mark.filterwarnings("ignore")
def test_workers_that_keep_dying_end_the_call_with_killed_worker(small_workers, by_worker):
    """A worker restarted at each chunk (as by its nanny at 95% of its memory_limit): the
    direct call falls back to the tasks, and the tasks end with distributed's KilledWorker
    after its allowed failures, not a hang."""
    import os

    from distributed import KilledWorker, wait

    def dies_on_a_chunk(v):  # noqa: ANN001, ANN202 -- nested, so that it is sent by value
        if isinstance(v, np.ndarray) and v.size > 100:
            os._exit(1)
        return np.asarray(v) > 0.5  # np.asarray: not traced, so NumPy calls it on each chunk

    x = da.arange(10_000, chunks=1000, dtype=np.float64).persist()
    wait(x)
    start = time.monotonic()
    with pytest.raises(KilledWorker):
        x.map_compact(dies_on_a_chunk, by_worker=by_worker).compute()
    assert time.monotonic() - start < 30  # 3-7 s measured: 4 deaths and restarts
    # the last restart done before the cluster closes (a close during one took ~27 s)
    small_workers.wait_for_workers(2, timeout=20)


@pytest.fixture
def no_room(monkeypatch):
    """This process as a worker of 256 MiB, pausing at 80%, that has not loaded numba (nor
    built any loop: the check runs where the in-process cache misses, and an earlier test of
    this process built `x > c` on float64; a review found the tests failing after it)."""
    numba_loop.clear_cache()
    monkeypatch.setattr(compiler_room, "_LOADED", "not.a.module")
    monkeypatch.setattr(compiler_room, "_worker_limit", lambda: (256 << 20, 0.8, "pauses"))
    monkeypatch.setitem(sys.modules, "distributed", sys.modules.get("distributed", sys))


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
        dashboard_address=None,
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
