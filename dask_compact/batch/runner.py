"""Where a batch job runs: a remote scheduler, a local GPU or CPU cluster, or threads; the
default memory budget; waiting for cancelled tasks to end."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import dask

from .signals import ignored

# ---------------------------------------------------------------------------------------------
# Where the work runs


@dataclass
class Runner:
    """The scheduler the job runs on; closing it stops what this command started."""

    description: str
    client: Any = None  # distributed.Client, or None for the threaded scheduler
    gpu: bool = False
    # fail a job whose cluster has had no workers this long (--no-workers-timeout; None:
    # wait, saying so: .executor.ClientExecutor.idle)
    no_workers_timeout: float | None = None
    _stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def close(self) -> None:
        self._stack.close()


def gpu_present() -> bool:
    """CuPy, dask-cuda and at least one CUDA device: what LocalCUDACluster needs."""
    try:
        import cupy
        import dask_cuda  # noqa: F401 -- only whether it imports

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 -- ImportError, or CUDARuntimeError without a driver
        return False


def client_has_cupy() -> bool:
    """CuPy chunks need CuPy here too: the graph's chunk metadata are CuPy arrays."""
    try:
        import cupy  # noqa: F401 -- only whether it imports
    except ImportError:
        return False
    return True


def worker_has_gpu() -> bool:
    """Run on each worker (``client.run``) to decide whether chunks should become CuPy."""
    return why_no_gpu() is None


def why_no_gpu() -> str | None:
    """Why this process cannot use a GPU (no CuPy, CUDA's own error: an old driver, none, no
    device), None where it can. Picklable, for ``client.run`` too."""
    try:
        import cupy
    except ImportError:
        return "cupy is not installed"
    try:
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return None
    except Exception as e:  # noqa: BLE001 -- CUDARuntimeError without a driver, and the like
        return f"CUDA: {e}"
    return "no CUDA device"


def _undo_scheduler_config(previous: Any, client_module: Any) -> None:
    """Undo what a Client that failed in ``__init__`` set in the dask config: it made itself
    the default scheduler (``scheduler="dask.distributed"``), which later computations in
    this process would look for. Only that key, back to ``previous`` (what the call read
    before it tried), and only while it still holds the failed Client's value and no running
    default Client, another thread's, is what it names. Until 2026-12-02 (sixteenth
    session, the fifteenth's probes) it was put back whatever it held, so a value another
    thread set meanwhile was popped or overwritten."""
    ours = "dask.distributed"
    if previous == ours or dask.config.get("scheduler", None) != ours:
        return  # the call set nothing, or another thread set something since
    if any(c.status == "running" for c in list(client_module._global_clients.values())):
        return  # another thread's Client is the default it names
    if previous is None:
        dask.config.config.pop("scheduler", None)
    else:
        dask.config.set(scheduler=previous)


def _loop_start_timed_out(e: AssertionError) -> bool:
    """Whether ``e`` is distributed's fixed 10 s wait for a new IO-loop thread running out
    (``LoopRunner._start_unlocked``'s bare ``assert loop is not None``), not another
    assertion."""
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and frames[-1].name == "_start_unlocked"


def _loop_started_retrying_once(make: Callable[[], Any]) -> Any:
    """``make()`` (a Client), once more if its IO-loop thread did not start in distributed's
    fixed 10 s; twice is a ``TimeoutError``. A Client starts a thread for its own loop and
    waits 10 s for it to run: a loaded 2-core CI machine missed that once (2026-12-07, CI of
    stop 110) and the command ended in distributed's bare AssertionError and a traceback.
    The loop fails before the Client registers itself as the default, so the second try
    starts from the same state. As :func:`_start_retrying_once` does for local clusters."""
    for attempt in (1, 2):
        try:
            return make()
        except AssertionError as e:
            if not _loop_start_timed_out(e):
                raise
            if attempt == 2:
                raise TimeoutError("the client's IO loop did not start within distributed's "
                                   "10 s, twice (is the machine overloaded?)") from e
            click.echo("dask compact: the client's IO loop did not start in time; trying "
                       "once more", err=True)
    raise AssertionError("unreachable")


def connect(address: str | None, scheduler_file: str | None, timeout: float) -> Any:
    from distributed import Client
    from distributed import client as client_module

    target = address or scheduler_file
    previous = dask.config.get("scheduler", None)
    registered = set(client_module._global_clients)

    def make() -> Any:
        if scheduler_file is not None:
            return Client(scheduler_file=scheduler_file, timeout=timeout)
        return Client(address, timeout=timeout)

    try:
        client = _loop_started_retrying_once(make)
    except (OSError, ValueError, TypeError, TimeoutError) as e:
        # A Client that fails in __init__ stays distributed's default client (its registry of
        # them, which dask's compute asks too), never closed: until 2026-12-01 (fourteenth
        # session, seen in CI) a later compute in this process (a test after the CLI's in the
        # same process) went to the unreachable scheduler and waited for ever. Only one not
        # running: another thread's Client made meanwhile stays the default (until
        # 2026-12-01, fifteenth session, a regression review, every one registered meanwhile
        # was dropped)
        for k in set(client_module._global_clients) - registered:
            made = client_module._global_clients.get(k)
            if made is None or made.status != "running":
                client_module._global_clients.pop(k, None)
                if made is not None:
                    # its teardown, once collected, would put back the config it found at
                    # its start, over what another thread set since: undone here instead
                    made._set_as_default = False
        _undo_scheduler_config(previous, client_module)
        # OSError: refused / timed out / TLS handshake failed; ValueError: unknown scheme or a
        # tls:// address without certificates in the dask config.
        raise click.ClickException(
            f"cannot connect to the scheduler at {target}: {type(e).__name__}: {e}"
        ) from None
    try:
        client.wait_for_workers(1, timeout=timeout)
    except (TimeoutError, OSError):
        client.close()
        raise click.ClickException(
            f"the scheduler at {target} has no workers (waited {timeout:g} s)"
        ) from None
    return client


def start(
    address: str | None,
    scheduler_file: str | None,
    local_cluster: str,
    device: str,
    timeout: float,
    n_workers: int | None,
    no_workers_timeout: float | None = None,
) -> Runner:
    if address or scheduler_file:
        client = connect(address, scheduler_file, timeout)
        runner = Runner(f"distributed scheduler {client.scheduler.address}", client, False,
                        no_workers_timeout=no_workers_timeout)
        runner._stack.callback(client.close)
        try:
            runner.gpu = remote_gpu(client, device)  # also checks each worker has the package
        except BaseException:
            runner.close()
            raise
        return runner

    kind = local_cluster
    if kind == "auto":
        # The threaded scheduler: a batch job's tasks read, decode and write (work that
        # releases the GIL) and nothing is serialised between processes. It was the fastest
        # mode measured on the GPU host too, compacting on the host's GPUs from one process
        # (benchmarks/batch_io.py; see the README). `--local processes|cuda` start a
        # LocalCluster / LocalCUDACluster instead (dashboard, one process per worker or GPU).
        kind = "threads"
        if device == "auto" and worker_has_gpu():
            device = "gpu"
    if device == "gpu" and kind == "processes":
        raise click.UsageError("--device gpu needs --local cuda, threads or auto, or a "
                               "--scheduler")
    if kind == "cuda" and not gpu_present():
        raise click.UsageError("--local cuda needs cupy, dask-cuda and a CUDA device ("
                               f"{why_no_gpu() or 'dask-cuda does not import'})")

    runner = Runner("threaded scheduler", gpu=False, no_workers_timeout=no_workers_timeout)
    if kind == "threads":
        if device == "gpu":
            # One process drives every GPU of the host: chunk i on device i % n.
            if (why := why_no_gpu()) is not None:
                raise click.UsageError(f"--device gpu needs cupy and a CUDA device ({why})")
            runner.gpu = True
            runner.description = "threaded scheduler (GPUs of this host)"
        runner._stack.enter_context(dask.config.set(scheduler="threads"))
        return runner

    try:
        start_local_cluster(runner, kind, device, n_workers)
    except BaseException:
        runner.close()  # a cluster that started but whose client failed must not linger
        raise
    return runner


def remote_gpu(client: Any, device: str) -> bool:
    """Whether a running cluster's chunks become CuPy: with ``auto`` only if every worker has
    a GPU (and CuPy is here, for the graph's chunk metadata); ``gpu`` is refused before the job
    where that does not hold (until 2026-11-30 it failed in the first task, with CUDA's error)."""
    if device == "cpu":
        on_workers(client, dask_compact_here)  # the GPU question below asks this too
        return False
    here = None if client_has_cupy() else "cupy is not installed where the command runs"
    workers = {w: why for w, why in on_workers(client, why_no_gpu).items() if why is not None}
    if device == "auto":
        return here is None and not workers
    if here is not None:
        raise click.UsageError(f"--device gpu: {here}")
    if workers:
        first, why = next(iter(workers.items()))
        raise click.UsageError(
            f"--device gpu: {len(workers)} of the cluster's workers cannot use a GPU ({first}: "
            f"{why}); use --device cpu or auto, or workers with GPUs (dask cuda worker)")
    return True


def dask_compact_here() -> None:
    """Nothing, run on each worker (``client.run``) before a job: sent by reference to this
    module, it fails where dask_compact does not import (:func:`on_workers` says so)."""


def on_workers(client: Any, function: Callable[[], Any]) -> dict[str, Any]:
    """``client.run(function)``: each worker's answer, or a ClickException (exit 1, one line)
    naming the workers where it raised and why; where that is dask_compact's import, what to
    install. Before (2026-11-30, a probe: a worker without the package), the job ended with
    distributed's traceback of ~50 lines, ending in ``ModuleNotFoundError``."""
    answers = client.run(function, on_error="return")
    failed = {w: e for w, e in answers.items() if isinstance(e, BaseException)}
    if not failed:
        return answers
    named = sorted(failed)
    error = failed[named[0]]
    why = str(error) or type(error).__name__
    listed = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
    workers = (f"worker {listed}" if len(named) == 1 else
               f"{len(named)} of the cluster's {len(answers)} workers ({listed})")
    if "dask_compact" in why:
        raise click.ClickException(
            f"{workers} cannot import dask_compact ({why}): install dask-compact, the "
            f"version this command runs, on every worker of the cluster")
    raise click.ClickException(f"{workers} failed a check before the job: {why}")


def start_local_cluster(runner: Runner, kind: str, device: str, n_workers: int | None) -> None:
    import logging

    from distributed import Client

    # Unwound last, once the cluster is closed: this process's level as it was before
    # quiet_shutdown (a command run in-process leaves its caller's logging as it found it).
    log = logging.getLogger("distributed")
    runner._stack.callback(log.setLevel, log.level)

    if kind == "cuda":
        from dask.system import CPU_COUNT
        from dask_cuda import LocalCUDACluster

        # dask-cuda gives each GPU worker one thread; a batch job's chunk tasks mostly read,
        # decode and write (CPU work that releases the GIL), so each worker gets its share of
        # the cores, and reads proceed in parallel while the GPU compacts.
        n_gpus = n_workers or _device_count()
        threads = max(1, CPU_COUNT // max(1, n_gpus))
        cluster = runner._stack.enter_context(
            _start_retrying_once(
                lambda: LocalCUDACluster(n_workers=n_workers, threads_per_worker=threads)
            )
        )
        runner.description = f"LocalCUDACluster ({len(cluster.workers)} GPU workers)"
        runner.gpu = device != "cpu"
    else:
        from distributed import LocalCluster

        cluster = runner._stack.enter_context(
            _start_retrying_once(lambda: LocalCluster(n_workers=n_workers, dashboard_address=":0"))
        )
        runner.description = f"LocalCluster ({len(cluster.workers)} worker processes)"
    runner.client = runner._stack.enter_context(Client(cluster))
    # Runs first when the runner closes (an ExitStack unwinds in reverse): see quiet_shutdown.
    runner._stack.callback(quiet_shutdown, runner.client)
    with contextlib.suppress(Exception):  # a worker that cannot run it logs as before
        runner.client.run(_quiet_task_failures)


def _quiet_task_failures() -> None:
    """In a worker process of the command's own local cluster: distributed's "Compute Failed"
    log of a failed task (its key, task and traceback, on the stderr the command shares)
    left out, since the job's one ``Error:`` line says which chunk failed and why; it came
    above that line (a probe, 2026-12-06). Other worker logs stay."""
    import logging

    logging.getLogger("distributed.worker").addFilter(_DropMessage("Compute Failed"))


def _quiet_logs() -> None:
    import logging

    logging.getLogger("distributed").setLevel(logging.CRITICAL)


def quiet_shutdown(client: Any) -> None:
    """Before this command's local cluster closes: silence distributed's loggers in its worker
    processes and here. A worker whose heartbeat is in flight as the scheduler goes logs
    "Failed to communicate with scheduler during heartbeat" with a traceback on the shared
    stderr (seen once in three CI runs, after a SIGTERM): noise of our own shutdown
    after the command's one line. Best effort: a cluster that cannot be reached is closed
    all the same."""
    try:
        client.run(_quiet_logs)
    except Exception:  # noqa: BLE001 -- the close below still runs
        pass
    _quiet_logs()


def _device_count() -> int:
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


MIN_BUDGET = 32 * 2**20


def memory_budget(runner: Runner) -> int:
    """The default memory budget of a streaming job (what it may hold over all workers: the
    threads' buffers, chunks and pieces in flight): half of each worker's memory limit less
    what it holds once the job's code is loaded (:func:`loaded_rss`), so a worker stays below
    distributed's spill (70 %) and pause (80 %) thresholds where the job's minimum fits in it;
    without a cluster, half of the memory available on this machine."""
    import psutil

    if runner.client is None:
        return max(MIN_BUDGET, int(psutil.virtual_memory().available * 0.5))
    workers = runner.client.scheduler_info()["workers"]
    fallback = psutil.virtual_memory().total / max(1, len(workers))
    try:
        loaded = runner.client.run(loaded_rss)
    except Exception:  # noqa: BLE001 -- the heartbeats' figures then, a little low
        loaded = {}
    total = 0
    for addr, w in workers.items():
        limit = w.get("memory_limit") or fallback
        held = loaded.get(addr) or w.get("metrics", {}).get("memory", 0) or 0
        total += max(MIN_BUDGET // 4, int(0.5 * limit - held))
    return max(MIN_BUDGET, total)


def loaded_rss() -> int:
    """Run on each worker: its resident memory once the job's code is loaded and a compaction
    compiled. A fresh worker's heartbeat reported 56 MiB; the same worker held 173 MiB after a
    job of 1,000 elements (NumPy, numba and LLVM, zarr), memory the default budget had counted
    as free (2026-11-30: 400 MiB workers paused at the default budget). Loading it here costs
    the job nothing: its first task would."""
    import numpy as np
    import psutil

    from ..backends.numpy_backend import compact
    from ..predicate import as_predicate
    from . import tasks  # noqa: F401 -- the chunk tasks' own imports (zarr, numcodecs)

    compact(np.zeros(64), as_predicate("x < 0.5"))
    return int(psutil.Process().memory_info().rss)


# The longest a local cluster's start may take (a start takes seconds, tens of seconds on a
# loaded machine): past it the job ends with an error, instead of waiting forever with Ctrl-C
# and SIGTERM ignored. A probe (2026-12-06), the command run as a user whose
# multiprocessing resource tracker died: every nanny logged "Failed to start process"
# (BrokenPipeError) and distributed's LocalCluster waited on, more than 10 minutes; only
# SIGKILL ended the command, and it left its lock file beside OUTPUT.
LOCAL_START_LIMIT_S = 120.0


def _start_retrying_once(make: Callable[[], Any]) -> Any:
    """Start a local cluster; once more if its start timed out.

    distributed waits a fixed 10 s for the cluster's IO-loop thread to run (``LoopRunner``:
    an AssertionError past it) and for its workers; a loaded machine can miss that once (seen
    on a 2-core CI machine). A second start is the same request, not a hidden failure: a
    cluster that cannot start twice still fails. The workers are started with SIGINT and
    SIGTERM ignored, which they inherit (see :func:`.signals.ignored`).
    """
    for attempt in (1, 2):
        try:
            with ignored(signal.SIGINT, signal.SIGTERM), _no_warning_of_a_failed_start():
                return _within_limit(make, LOCAL_START_LIMIT_S)
        except (AssertionError, TimeoutError) as e:
            if attempt == 2:
                raise
            click.echo(f"dask compact: the local cluster did not start in time ({e!r}); "
                       "trying once more", err=True)
        except RuntimeError as e:
            if isinstance(e.__cause__, OSError):
                raise click.ClickException(failed_start(e.__cause__)) from None
            raise
    raise AssertionError("unreachable")


def _within_limit(make: Callable[[], Any], limit: float) -> Any:
    """``make()`` run in a thread and waited for at most ``limit`` seconds; past that the
    processes it started are killed and the job ends with a ClickException. In a thread, as
    the main thread cannot be woken from distributed's wait otherwise while the signals are
    ignored (their disposition is the process's: the workers that thread spawns inherit it
    all the same)."""
    import concurrent.futures
    import threading

    import psutil

    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    done: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            done.set_result(make())
        except BaseException as e:  # noqa: BLE001 -- raised in the main thread below
            done.set_exception(e)

    threading.Thread(target=run, name="dask-compact-cluster-start", daemon=True).start()
    try:
        return done.result(timeout=limit)
    except concurrent.futures.TimeoutError:
        if done.done():  # the start's own TimeoutError (the caller tries once more), or its
            return done.result()  # cluster, just made
    for child in me.children(recursive=True):
        if child.pid not in before:
            with contextlib.suppress(psutil.Error):
                child.kill()
    raise click.ClickException(
        f"the local cluster did not start in {limit:.0f} s (see distributed's log above: a "
        "worker process that cannot start); nothing was written. Run with --local threads, "
        "or start a cluster yourself and pass --scheduler")


# What distributed logs (a WARNING) as it closes a cluster whose start failed; the start's
# error follows, as the command's own one line.
_FAILED_START_LOG = "Cluster closed without starting up"


class _DropMessage(logging.Filter):
    """Drops the records whose message (its format string, before any arguments) starts
    with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith(self.prefix))


@contextlib.contextmanager
def _no_warning_of_a_failed_start() -> Any:
    """distributed's warning of a failed start left out while a local cluster starts: the
    failure is the command's ``Error:`` line (:func:`failed_start`)."""
    log = logging.getLogger("distributed.deploy.spec")
    drop = _DropMessage(_FAILED_START_LOG)
    log.addFilter(drop)
    try:
        yield
    finally:
        log.removeFilter(drop)


def failed_start(cause: OSError) -> str:
    """The one line for a local cluster whose start failed with ``cause`` (distributed raises
    ``RuntimeError("Cluster failed to start: ...")`` from it), naming dask's
    ``temporary-directory`` setting where the path that failed is that folder, above it or in
    it: the scheduler and the workers make their scratch space there. 2026-12-01, a new-user
    probe with ``DASK_TEMPORARY_DIRECTORY=/dev/null/x``: the command printed distributed's
    warning and a chained traceback of 80 lines (exit 1), where a bad ``--scheduler`` address
    gets one line."""
    said = f"the local cluster did not start: {cause}"
    setting = dask.config.get("temporary-directory", None)
    if not setting or cause.filename is None:
        return said
    scratch = os.path.abspath(os.path.expanduser(str(setting)))
    failed = os.path.abspath(os.fsdecode(cause.filename))
    if not (scratch == failed or scratch.startswith(failed.rstrip(os.sep) + os.sep)
            or failed.startswith(scratch + os.sep)):
        return said
    where = ("DASK_TEMPORARY_DIRECTORY" if os.environ.get("DASK_TEMPORARY_DIRECTORY")
             else "the dask config")
    return (f"{said}; its scheduler and workers keep their scratch files under dask's "
            f"temporary-directory setting ({str(setting)!r}, from {where}): set it to a folder "
            "that can be created and written, or unset it")


# Worker task states in which a task runs now or may still start: queued for a thread
# ("ready", "constrained"), waiting for its inputs, or occupying a thread (a cancelled one
# runs on until it returns).
MAY_RUN = frozenset({"waiting", "ready", "constrained", "executing", "long-running",
                     "cancelled", "resumed"})


def running_keys(dask_worker: Any) -> list[Any]:
    """Run on each worker: keys of the tasks that run or may still start there. A cancel
    reaches the workers after the client's call returns: until then a thread that ends one
    task takes the next queued one, so a task queued at the first look may be writing at the
    next (a failed job's temporary group was left once in CI on a local cluster, most likely
    by a write so started while the group was being removed)."""
    # (a task occupying a thread is executing, long-running, cancelled or resumed: MAY_RUN)
    return [k for k, ts in dask_worker.state.tasks.items() if ts.state in MAY_RUN]


def drain(client: Any, keys: set[Any], timeout: float) -> None:
    """Wait until no worker runs or may still start one of ``keys`` (bounded). A cancelled
    task is forgotten by the scheduler at once, but its thread runs on until the write
    returns, and a queued one starts until the worker hears of the cancel.

    Two quiet looks in a row, 0.1 s apart: ``client.run`` reaches a worker on its own
    connection, so a task the scheduler sent on the worker's batched stream just before the
    cancel may not be in the worker's state at the first look and run after it (2026-11-30:
    the group left once more, on a loaded machine, with one look)."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        running = client.run(running_keys)
        quiet = 0 if any(k in keys for ks in running.values() for k in ks) else quiet + 1
        if quiet == 2:
            return
        time.sleep(0.1)
