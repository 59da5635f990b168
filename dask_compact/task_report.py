"""What a phase-1 task tells the scheduler as it ends, so the client learns it in the round
trip it makes anyway (asking the scheduler where the results are) instead of in a task and a
gather of its own.

A distributed worker sends each finished task's ``metadata`` (a msgpack-able dict of the
worker's state for that task) with its "task finished" message, and the scheduler keeps it on
its own task state while the result is held. A task writes its entry there while it runs; the
client reads it with one ``run_on_scheduler``. Outside a distributed worker (threads, a
synchronous scheduler) nothing is written and the reader gets None: the caller then counts
with tasks.
"""

from __future__ import annotations

from typing import Any

from .imported import distributed_if_imported

ENTRY = "dask-compact"


def report(value: Any) -> None:
    """Attach ``value`` (msgpack-able) to the running task's metadata, if it runs on a
    distributed worker."""
    distributed = distributed_if_imported()
    if distributed is None:
        return
    from distributed.utils import thread_state

    key = getattr(thread_state, "key", None)
    if key is None:
        return
    try:
        worker = distributed.get_worker()
    except ValueError:  # not in a worker's task
        return
    ts = worker.state.tasks.get(key)
    if ts is not None:
        ts.metadata[ENTRY] = value


def reported(keys: list, dask_scheduler: Any = None) -> list:
    """On the scheduler: each key's reported value, None where the key is not held in memory
    or reported nothing."""
    out = []
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        ok = ts is not None and ts.state == "memory" and ts.metadata
        out.append(ts.metadata.get(ENTRY) if ok else None)
    return out
