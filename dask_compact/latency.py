"""``low_latency(client)``: a distributed cluster's messages sent as they come, not in batches.

Every message between a distributed client, its scheduler and the workers goes through a
``BatchedSend``, which writes at most once per interval -- 10 ms from a client, 5 ms from the
scheduler to a worker, 2 ms from the scheduler to a client and from a worker -- so a message
that follows another within the interval waits for the rest of it. A call that sends a graph
and waits for a few tasks crosses four such streams. The intervals are fixed in
``distributed`` (no configuration key); they save messages on clusters that run many small
tasks, and cost latency on calls that run few. Measured on one H100 host (LocalCUDACluster,
2^30 float32 in 4 chunks, ``benchmarks/dask_gpu.py --low-latency``, the same cluster before
and after): ``map_compact(...).persist()`` 20.9-23.3 ms a call against 23.7-25.4 ms,
``map_blocks(...).persist()`` 28.9-30.7 against 36.5-37.8 ms, ``client.submit(f).result()``
6.5 against 13.1 ms; on 4 GPUs the floor halved and our calls stayed within the spread
(docs/design.md, "The three phases").
"""

from __future__ import annotations

from typing import Any

from dask.utils import parse_timedelta
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

__all__ = ["low_latency"]

PLUGIN_NAME = "dask-compact-low-latency"
# distributed's own intervals (client.py, scheduler.py, worker.py), restored by interval=None
DEFAULTS = {"client": 0.010, "scheduler_to_worker": 0.005, "scheduler_to_client": 0.002,
            "worker": 0.002}  # fmt: skip


def _set(stream: Any, seconds: float) -> None:
    # BatchedSend reads its interval at each write: a new value holds from the next one.
    if stream is not None and hasattr(stream, "interval"):
        stream.interval = seconds


class LowLatencyScheduler(SchedulerPlugin):
    """Sets the interval of the scheduler's streams to workers and clients, now and for those
    that connect later."""

    name = PLUGIN_NAME

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def start(self, scheduler: Any) -> None:
        for stream in [*scheduler.stream_comms.values(), *scheduler.client_comms.values()]:
            _set(stream, self.seconds)

    def add_worker(self, scheduler: Any, worker: str) -> None:
        _set(scheduler.stream_comms.get(worker), self.seconds)

    def add_client(self, scheduler: Any, client: str) -> None:
        # called before the client's stream exists: set it once the handler has made it
        scheduler.loop.add_callback(lambda: _set(scheduler.client_comms.get(client),
                                                 self.seconds))


class LowLatencyWorker(WorkerPlugin):
    """Sets the interval of a worker's stream to the scheduler (on every worker, also those
    that join later)."""

    name = PLUGIN_NAME

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def setup(self, worker: Any) -> None:
        _set(getattr(worker, "batched_stream", None), self.seconds)

    def teardown(self, worker: Any) -> None:  # unregistered: distributed's interval again
        _set(getattr(worker, "batched_stream", None), DEFAULTS["worker"])


async def _install_scheduler(seconds: float, dask_scheduler: Any = None) -> None:
    # replaces an earlier one without add_plugin's "overwriting" warning
    dask_scheduler.plugins.pop(PLUGIN_NAME, None)
    plugin = LowLatencyScheduler(seconds)
    await plugin.start(dask_scheduler)
    dask_scheduler.add_plugin(plugin, name=PLUGIN_NAME)


def _restore_scheduler(dask_scheduler: Any = None) -> bool:
    """On the scheduler: distributed's intervals back; whether the worker plugin is registered."""
    dask_scheduler.plugins.pop(PLUGIN_NAME, None)
    for stream in dask_scheduler.stream_comms.values():
        _set(stream, DEFAULTS["scheduler_to_worker"])
    for stream in dask_scheduler.client_comms.values():
        _set(stream, DEFAULTS["scheduler_to_client"])
    return PLUGIN_NAME in dask_scheduler.worker_plugins


def low_latency(client: Any = None, interval: str | float | None = 0) -> None:
    """Send the messages of a distributed cluster as they come instead of in timed batches.

    Sets the batching interval of every ``BatchedSend`` stream of the cluster: from
    ``client`` to the scheduler, from the scheduler to each worker and each client, from each
    worker to the scheduler; workers and clients that connect later get it too (a scheduler
    and a worker plugin, named ``"dask-compact-low-latency"``). Another client's own stream to
    the scheduler is its process's: call this there as well. Results are the same either
    way; only when messages leave changes. Worth it for calls of few tasks in a loop (each
    ``map_compact`` call on a few GPUs); on clusters that run many thousands of tiny tasks
    batching saves the scheduler work, which distributed's defaults are tuned for.

    Parameters
    ----------
    client : distributed.Client, optional
        The client whose cluster to set (default: ``distributed.get_client()``). An
        asynchronous client's coroutine calls it in a thread
        (``await asyncio.to_thread(dask_compact.low_latency, client)``): on its loop it is
        refused.
    interval : str, float or None
        The interval, as ``dask.utils.parse_timedelta`` reads it (a number is seconds):
        0 (the default) writes each message at once, with those queued meanwhile. None
        restores distributed's intervals (10 ms from a client, 5 ms from the scheduler to a
        worker, 2 ms from the scheduler to a client and from a worker) and removes the
        plugins.

    Examples
    --------
    >>> import dask.array as da
    >>> from distributed import Client, LocalCluster
    >>> import dask_compact
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> dask_compact.low_latency(client)
    >>> x = da.arange(10, chunks=4)
    >>> x.map_compact(lambda v: v % 3 == 0).compute()
    array([0, 3, 6, 9])
    >>> dask_compact.low_latency(client, interval=None)  # distributed's intervals again
    >>> client.close()
    >>> cluster.close()
    """
    from distributed import Client, get_client

    # until 2026-12-01 (fourteenth session) no client at all gave distributed's "No global
    # client found and no address provided", and a LocalCluster or an address given for the
    # client "'LocalCluster' object has no attribute 'run_on_scheduler'" (a new-user probe)
    if client is None:
        try:
            client = get_client()
        except ValueError as e:
            raise ValueError(
                "dask_compact.low_latency sets the streams of a distributed cluster: no client "
                "given and none is the default: pass one, low_latency(client), or make one "
                "first, distributed.Client(...)") from e
    if not isinstance(client, Client):
        how = ("Client(address)" if isinstance(client, str) else "Client(cluster)"
               if hasattr(client, "scheduler_address") else "distributed.Client(...)")
        raise TypeError(f"dask_compact.low_latency takes a distributed Client, not "
                        f"{type(client).__name__}: pass {how}")
    if getattr(client, "asynchronous", False):
        # on its own event loop the client's calls return coroutines, not done: until
        # 2026-11-30 only the client's own stream was set and the plugins never installed (a
        # probe), or, with None, nothing restored on the cluster, with no error
        raise RuntimeError(
            f"dask_compact.low_latency was called on the event loop of {client} (an "
            "asynchronous client, in a coroutine), where it would have to wait for the "
            "cluster: run it in a thread, `await asyncio.to_thread(dask_compact.low_latency, "
            "client)` (likewise with interval=None)")
    if interval is None:
        if client.run_on_scheduler(_restore_scheduler):
            client.unregister_worker_plugin(PLUGIN_NAME)  # its teardown restores each worker
        _set(getattr(client, "scheduler_comm", None), DEFAULTS["client"])
        return
    try:
        seconds = (float(interval) if isinstance(interval, (int, float))
                   else parse_timedelta(interval, default="seconds"))
    except (TypeError, ValueError, KeyError):  # KeyError: parse_timedelta's unknown unit
        seconds = None
    if seconds is None or not seconds >= 0:
        raise ValueError(f"interval must be a duration >= 0 (seconds, or e.g. '1ms') or None, "
                         f"got {interval!r}")
    client.run_on_scheduler(_install_scheduler, seconds)
    client.register_plugin(LowLatencyWorker(seconds), name=PLUGIN_NAME)
    _set(getattr(client, "scheduler_comm", None), seconds)
