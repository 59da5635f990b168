"""A cluster with a worker that cannot import dask_compact (dask_compact/workers_installed.py):
every call that would send it tasks of ours says so, naming it, before any task is sent.

Before (2026-12-01, distributed 2026.7.1): such a worker given one of our tasks stops (the
task's unpickling breaks its stream from the scheduler), the data it held is lost, and the call
went on without it where another worker served, or waited for ever where none did; the direct
path alone named the worker.
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from cluster_helpers import worker_named, worker_process
from distributed import wait

import dask_compact
from dask_compact import workers_installed
from dask_compact.workers_installed import WorkerWithoutDaskCompact

A = np.random.default_rng(7).random(8_009)


@pytest.fixture(scope="module")
def _cluster(tmp_path_factory):
    from conftest import local_process_cluster

    folder = tmp_path_factory.mktemp("bare")
    with (
        local_process_cluster(1, set_as_default=False) as c,
        worker_process(c.scheduler.address, folder, "bare", without_dask_compact=True),
    ):  # fmt: skip
        bare = worker_named(c, "bare")
        kept = c.scatter(np.arange(10), workers=[bare])
        yield c, bare, kept


@pytest.fixture
def cluster(_cluster):
    """A client, one worker process with dask_compact and one without it (``bare``), and a
    future held by ``bare`` (which must stay: the worker must not be stopped); the client
    the default scheduler of the tests that ask for it alone (it was every later test's
    too: conftest.client_as_default)."""
    from conftest import client_as_default

    c, bare, kept = _cluster
    with client_as_default(c):
        yield c, bare, kept


def _calls(c):
    """name -> a call that sends tasks of ours (or, lazy, builds a graph of them)."""
    good = [w for w in c.nthreads() if "bare" not in str(c.scheduler_info()["workers"][w])]
    x = da.from_array(A, chunks=1_000)  # a graph: its tasks may run on any worker
    held = c.persist(x, workers=good)
    wait(held)
    return {
        "map_compact over a graph": lambda: x.map_compact("x < 0.3"),
        "map_compact by_worker=False": lambda: held.map_compact("x < 0.3", by_worker=False),
        "map_compact lazy": lambda: held.map_compact("x < 0.3", lazy=True),
        "compact with a mask": lambda: dask_compact.compact(x, x < 0.3),
        "compact_records": lambda: dask_compact.compact_records({"a": x, "b": 2 * x}, "a < 0.3"),
        "compact_records lazy": lambda: dask_compact.compact_records(
            {"a": held}, "a < 0.3", lazy=True
        ),
        "partition": lambda: dask_compact.partition(held, "x < 0.3"),
        "cumsum": lambda: dask_compact.cumsum(held),
        "sort": lambda: dask_compact.sort(held),
        "argsort": lambda: dask_compact.argsort(x),
    }


# before: a call waited for the worker it had stopped; 180 s: the limit includes starting the
# cluster and a `dask worker` process, slow on a loaded 2-core CI machine
@pytest.mark.timeout(180)
def test_every_task_path_names_the_worker_without_the_package(cluster):
    c, bare, kept = cluster
    for name, call in _calls(c).items():
        with pytest.raises(WorkerWithoutDaskCompact,
                           match=f"worker {bare} cannot import dask_compact .*No module "
                                 "named 'dask_compact'.*install dask-compact.* on every "
                                 "worker"):  # fmt: skip
            call()
        assert bare in c.nthreads(), f"{name}: the worker was stopped"
    np.testing.assert_array_equal(kept.result(timeout=10), np.arange(10))  # its data kept
    held = c.persist(da.from_array(A, chunks=1_000), workers=[w for w in c.nthreads() if w != bare])
    wait(held)
    got = held.map_compact("x < 0.3")  # the direct path: asks only the input's holders
    np.testing.assert_array_equal(got.compute(), A[A < 0.3])
    # its result rebalanced (dask's rechunk tasks, which any worker runs): before, refused
    both = held.map_compact("x < 0.3", chunks=500, output="both")
    assert both[0].chunks[0][:-1] == (500,) * (len(both[0].chunks[0]) - 1)
    np.testing.assert_array_equal(both[0].compute(), A[A < 0.3])
    np.testing.assert_array_equal(both[1].compute(), np.flatnonzero(A < 0.3))


@pytest.mark.timeout(180)  # a cluster and a `dask worker` process started
def test_a_worker_joining_after_the_check_is_found_at_the_next_call(tmp_path):
    """The answer is kept per client and cluster size: a worker without the package that
    joins later is asked at the next call (the client refreshes the cluster's size every
    2 s; here at once, by ``worker_named``), and once it has left the calls run again."""
    from conftest import local_process_cluster

    with local_process_cluster(1) as c:
        x = da.from_array(A, chunks=1_000)
        np.testing.assert_array_equal(x.map_compact("x < 0.3").compute(), A[A < 0.3])
        with worker_process(c.scheduler.address, tmp_path, "late", without_dask_compact=True):
            late = worker_named(c, "late")
            with pytest.raises(WorkerWithoutDaskCompact, match=f"worker {late} cannot"):
                x.map_compact("x < 0.4")
            assert late in c.nthreads()
        c.scheduler_info()  # the client's view of the cluster, refreshed
        np.testing.assert_array_equal(x.map_compact("x < 0.5").compute(), A[A < 0.5])


@pytest.mark.timeout(180)
def test_a_worker_whose_import_fails_otherwise_is_named(tmp_path):
    """dask_compact there, but a dependency's import failing (a NumPy built for another
    ABI, say): before, the filter on "dask_compact" in the message let the worker pass, and
    the call's tasks stopped it."""
    from conftest import local_process_cluster

    raises = "raise ImportError('numpy.core.multiarray failed to import')"
    with (
        local_process_cluster(1) as c,
        worker_process(c.scheduler.address, tmp_path, "broken", import_raises=raises),
    ):  # fmt: skip
        broken = worker_named(c, "broken")
        with pytest.raises(WorkerWithoutDaskCompact,
                           match=f"worker {broken} cannot import dask_compact .*numpy.core."
                                 "multiarray failed to import"):  # fmt: skip
            da.from_array(A, chunks=1_000).map_compact("x < 0.3")
        assert broken in c.nthreads()


def test_an_unreachable_worker_is_not_counted():
    """A connection's failure (the worker closing) is no import's: not named."""
    from distributed.comm.core import CommClosedError

    class Client:
        def run(self, *_, **__):
            return {
                "tcp://a:1": CommClosedError("closed"),
                "tcp://b:2": OSError("refused"),
                "tcp://c:3": None,
                "tcp://d:4": Exception("ImportError('libfoo.so')"),
            }

    missing, all_answered = workers_installed.lacking(Client())
    assert missing == {"tcp://d:4": "ImportError('libfoo.so')"}
    assert not all_answered  # the unreachable ones: not known, the answer not kept


@pytest.mark.timeout(180)
def test_a_worker_that_does_not_answer_holds_the_call_only_seconds(tmp_path, monkeypatch):
    """A listed worker that does not answer (stopped): the question waits ANSWER_WITHIN,
    then the call goes on, the answer not kept (asked again at the next call). Before: the
    scheduler's broadcast waited until the worker was dropped (worker-ttl, 5 minutes)."""
    import signal
    import time

    from conftest import local_process_cluster

    monkeypatch.setattr(workers_installed, "ANSWER_WITHIN", 1.0)
    asked = []
    real = workers_installed.lacking
    monkeypatch.setattr(workers_installed, "lacking", lambda c: asked.append(1) or real(c))
    with (
        local_process_cluster(1) as c,
        worker_process(c.scheduler.address, tmp_path, "frozen") as proc,
    ):  # fmt: skip
        worker_named(c, "frozen")
        proc.send_signal(signal.SIGSTOP)
        try:
            for _ in range(2):
                start = time.monotonic()
                workers_installed.check_client(c)  # no error: none known to lack it
                assert time.monotonic() - start < 6
            assert len(asked) == 2  # not kept
        finally:
            proc.send_signal(signal.SIGCONT)


def test_the_answer_is_asked_once_per_client_and_cluster_size(monkeypatch):
    """A hit is a look-up: no question to the workers while the cluster's size holds."""
    from conftest import local_process_cluster

    asked = []
    real = workers_installed.lacking

    def counted(client):
        asked.append(client.id)
        return real(client)

    monkeypatch.setattr(workers_installed, "lacking", counted)
    with local_process_cluster(2) as c:
        x = c.persist(da.from_array(A, chunks=1_000))
        wait(x)
        for t in (0.1, 0.2, 0.3):
            np.testing.assert_array_equal(
                x.map_compact(f"x < {t}", by_worker=False).compute(), A[A < t]
            )
        np.testing.assert_array_equal(dask_compact.sort(x).compute(), np.sort(A))
        assert asked == [c.id]


def test_the_error_is_public():
    assert dask_compact.WorkerWithoutDaskCompact is WorkerWithoutDaskCompact
    assert "WorkerWithoutDaskCompact" in dask_compact.__all__


def test_the_message_names_one_worker_and_counts_the_others():
    err = workers_installed.cannot_import({"tcp://b:2": "E: b", "tcp://a:1": "E: a"})
    assert isinstance(err, ImportError)
    assert str(err).startswith("worker tcp://a:1 (and 1 more) cannot import dask_compact (E: a)")


def test_the_module_cluster_serves_only_the_tests_that_ask_for_it():
    """After the cluster tests in the file's order, no distributed client is the default
    and a computation runs in this process (conftest.client_as_default). Until 2026-12-01 the
    module's cluster, with its worker that cannot import dask_compact, stayed the default
    to the module's end: a later test's call over a graph outside a cluster of its own
    would have been refused for that worker (the later tests compute on clusters of their
    own made the default inside, or nothing: none was seen to depend on it)."""
    from conftest import assert_no_client_is_the_default

    assert_no_client_is_the_default()
