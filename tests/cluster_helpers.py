"""Helpers for the tests on a LocalCluster of worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import numpy as np


@contextlib.contextmanager
def cluster_for_kills(n_workers: int, threads_per_worker: int) -> Iterator:
    """A Client on a LocalCluster of worker processes whose tests SIGKILL workers.

    On a worker's loss, LocalCluster schedules a check ``distributed.deploy.lost-worker-timeout``
    (15 s) later that closes its nanny if no worker of that name is back by then. A second kill
    of the same worker within those 15 s, caught by the first kill's check while the nanny
    restarts it, closed that nanny for good: a CI run on a slower machine then waited 60 s for
    a worker that never came back. The nannies restart workers themselves; the check is off
    (one hour) while the cluster lives."""
    import dask
    from conftest import local_process_cluster

    with (
        dask.config.set({"distributed.deploy.lost-worker-timeout": "1h"}),
        local_process_cluster(n_workers, threads_per_worker) as c,
    ):
        yield c


def kill_a_worker_then_check(client, a: np.ndarray, m: np.ndarray, v, i) -> str:
    """SIGKILL one worker process, then check that ``v`` and ``i`` (a map_compact result of
    ``a`` selecting ``m``, values and indices) and a rechunk of ``v`` compute exactly; wait for
    the nanny's replacement. Returns the address of the worker killed."""
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    os.kill(pids[victim], signal.SIGKILL)
    try:
        np.testing.assert_array_equal(v.compute(), a[m])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
        np.testing.assert_array_equal(v.rechunk(997).compute(), a[m])
    finally:
        client.wait_for_workers(len(pids), timeout=60)
    assert pids[victim] not in client.run(os.getpid).values()  # it did die
    return victim


def rechunk_placed_by_data(client, monkeypatch, arr, marker: str):
    """``arr.rechunk(1009)`` persisted right after the call that made ``arr``, checking that
    the scheduler took none of the tasks over ``arr``'s pieces (those whose dependencies'
    group names contain ``marker``) for root tasks, which it places for balance rather than
    by their data, and that only merged pieces moved between workers. Returns it."""
    from distributed import get_task_stream, wait

    scheduler, rootish = client.cluster.scheduler, []
    real_rootish = scheduler.is_rootish

    def spy(ts):
        if any(marker in d.group.name for d in ts.dependencies):
            rootish.append(real_rootish(ts))
        return real_rootish(ts)

    monkeypatch.setattr(scheduler, "is_rootish", spy)
    with get_task_stream(client) as stream:
        r = arr.rechunk(1009).persist()
        wait(r)
    assert rootish and not any(rootish)
    moved = {str(t["key"]).split("-")[1] for t in stream.data
             for s in t["startstops"] if s["action"] == "transfer"}
    assert moved <= {"merge"}, moved
    return r
