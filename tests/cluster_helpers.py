"""Helpers for the tests on a LocalCluster of worker processes."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator

import numpy as np


@contextlib.contextmanager
def cluster_for_kills(
    n_workers: int, threads_per_worker: int, set_as_default: bool = True
) -> Iterator:
    """A Client on a LocalCluster of worker processes whose tests SIGKILL workers (the
    default scheduler while it is open, unless ``set_as_default`` is False: a module's
    cluster, see conftest.client_as_default).

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
        local_process_cluster(n_workers, threads_per_worker, set_as_default) as c,
    ):
        yield c


def kill_a_worker_then_check(client, a: np.ndarray, m: np.ndarray, v, i) -> str:
    """SIGKILL one worker process, then check that ``v`` and ``i`` (a map_compact result of
    ``a`` selecting ``m``, values and indices) and a rechunk of ``v`` compute exactly; wait for
    the nanny's replacement (:func:`until_replaced`). Returns the address of the worker
    killed."""
    pids = client.run(os.getpid)
    victim = sorted(pids)[0]
    os.kill(pids[victim], signal.SIGKILL)
    try:
        np.testing.assert_array_equal(v.compute(), a[m])
        np.testing.assert_array_equal(i.compute(), np.flatnonzero(m))
        np.testing.assert_array_equal(v.rechunk(997).compute(), a[m])
    finally:
        until_replaced(client, [pids[victim]], len(pids))
    assert pids[victim] not in client.run(os.getpid).values()  # it did die
    return victim


def _workers_now(dask_scheduler=None) -> tuple[dict, list]:
    """On the scheduler: each worker's (process id, status), and the worker plugins' names."""
    workers = {a: (ws.pid, ws.status.name) for a, ws in dask_scheduler.workers.items()}
    return workers, sorted(dask_scheduler.worker_plugins)


def _plugin_names(dask_worker=None) -> list:
    return sorted(dask_worker.plugins)


def until_replaced(client, gone_pids, n_workers: int, timeout: float = 120) -> None:
    """Wait until the worker processes ``gone_pids`` (killed, or retired) have left the
    scheduler, ``n_workers`` are running, each with every worker plugin the scheduler holds
    (the direct path's handler among them), and the client's view of the cluster
    (``scheduler_info``, whose size workers_installed.check_client reads) refreshed. (A
    refresh of the client's own, every 2 s, can still land after that one with an older view:
    seen twice in five kills, right after ``wait_for_workers``; a call then asks the workers
    once more whether they import dask_compact, which only a test that forbids every
    ``client.run`` notices.) By process id: a replacement may take the dead one's address.

    Why not ``client.wait_for_workers(n)``: right after a SIGKILL the scheduler still lists
    the dead worker as running (it learns of the death a moment later), so that call returned
    at once (0.02-0.11 s, measured on the loaded 2-core machine) with the replacement still
    to come, and the next test met it joining (a cluster changing under a test: what failed
    CI's counts test, there by a size the client heard late). The plugins too: the scheduler
    counts a worker as running before the worker has installed them
    (``Worker._register_with_scheduler``; a window of milliseconds, not seen to matter), and
    a direct call in it would fall back."""
    import time

    gone, deadline = set(gone_pids), time.monotonic() + timeout
    while True:
        workers, wanted = client.run_on_scheduler(_workers_now)
        running = [a for a, (pid, status) in workers.items() if status == "running"]
        if not gone & {pid for pid, _ in workers.values()} and len(running) >= n_workers:
            have = client.run(_plugin_names, on_error="return")
            if set(have) == set(workers) and all(
                isinstance(names, list) and set(wanted) <= set(names) for names in have.values()
            ):
                client.scheduler_info(n_workers=-1)  # the client's view, refreshed
                return
        assert time.monotonic() < deadline, f"{n_workers} new workers never ran: {workers}"
        time.sleep(0.1)


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


@contextlib.contextmanager
def worker_process(scheduler: str, folder, name: str, env: dict | None = None,
                   without_dask_compact: bool = False, import_raises: str | None = None
                   ) -> Iterator:
    """A ``dask worker`` process (one worker, one thread, no nanny) named ``name`` joining
    ``scheduler``, with ``env`` added to this process's environment, as a worker started on
    another machine; ``without_dask_compact``: its ``import dask_compact`` fails as where
    the package is not installed (a package of that name first on its path raising
    ModuleNotFoundError), or ``import_raises`` (its shim's ``raise`` statement: a dependency
    failing, say). Yields the Popen; stopped (its process group) at the end."""
    import subprocess
    import sys

    env = {**os.environ, **(env or {})}
    if without_dask_compact or import_raises:
        shim = folder / "hide-dask-compact" / "dask_compact"
        shim.mkdir(parents=True, exist_ok=True)
        (shim / "__init__.py").write_text((import_raises or
            "raise ModuleNotFoundError(\"No module named 'dask_compact'\", name='dask_compact')"
        ) + "\n")  # fmt: skip
        env["PYTHONPATH"] = os.pathsep.join(
            [str(shim.parent), *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", scheduler, "--name", name,
         "--nthreads", "1", "--no-nanny", "--no-dashboard", "--memory-limit", "0"],
        cwd=folder, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def worker_named(client, name: str, timeout: float = 30) -> str:
    """The address of the worker called ``name``, once it has joined."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for addr, info in client.scheduler_info(n_workers=-1)["workers"].items():
            if info.get("name") == name:
                return addr
        time.sleep(0.1)
    raise TimeoutError(f"worker {name} did not join within {timeout:g} s")


def persist_placed(client, a: np.ndarray, chunk: int, spans: list, loose: bool = True):
    """``a`` persisted as one dask array in chunks of ``chunk`` rows within each span
    ``(start, stop, worker)`` of rows (trailing axes whole where shorter), every chunk held by
    its span's worker, checked.

    Each span is persisted on its worker (``loose``: a lost chunk may be remade elsewhere),
    then the spans are joined and persisted again. The scheduler may run that second step's
    tasks on another worker, or steal a loose part's, and once (a CI run, 2026-12-08) one
    chunk of a slab landed on the other worker: the call under test, exact, cut its runs
    around it, not as the test meant. So the layout is checked, and made again under new
    keys (the same ones could still be held) until every chunk is where it is meant.
    Strict restrictions instead hung the worker-loss tests: a lost chunk could not be remade
    on another worker."""
    import dask.array as da
    from dask.core import flatten
    from distributed import wait

    meant = [{w} for s, e, w in spans for _ in range(s, min(e, len(a)), chunk)]
    for attempt in range(10):
        name = None if attempt == 0 else False
        parts = [client.persist(da.from_array(a[s:e], chunks=chunk, name=name), workers=[w],
                                allow_other_workers=loose) for s, e, w in spans]
        x = da.concatenate(parts).persist()
        wait(x)
        del parts
        blocks = [x.dask[k] for k in flatten(x.__dask_keys__())]
        placed = client.who_has(blocks)
        if [set(placed[f.key]) for f in blocks] == meant:
            return x
        del x, blocks
    raise AssertionError(f"{len(spans)} spans not placed as meant in 10 tries")
