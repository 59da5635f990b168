"""A call's graph sent to the scheduler at once, not at the client's next batch.

A distributed ``Client`` sends its messages to the scheduler (graphs, keys it no longer
wants) on one batched stream that writes at most once every 10 ms: a message that follows
another within 10 ms waits for the rest of the interval. In a loop of calls the previous
result's release, sent as it is dropped, is such a message, and the next call's graph waits
behind it. Measured on the 2-core CI machine's LocalCluster (2 workers), a bare
``client.submit(f).result()`` in a loop: 10.6-10.7 ms, 5.4-5.7 ms with the stream writing
the graph at once.

:func:`persist` is ``dask.persist`` followed by :func:`send_now`, which asks the stream to
write what it holds now (the graph ``dask.persist`` just queued on the client's event loop,
which runs callbacks in order). It uses ``BatchedSend``'s ``next_deadline`` and ``waker``,
not public API: where they are missing it does nothing, and the graph goes with the next
batch as before. :func:`gather` fetches a persisted collection's blocks with no graph at all
(the sort's sample and histogram, which ``compute()`` sent as graphs right behind another).

:func:`released_on_error` scopes an eager call: where it raises, every future the call made
(:func:`persist`'s, and those passed to :func:`made`) is released, so its pieces do not stay
on the workers. They would: a failed task's exception, re-raised on the client, keeps the
frames it passes through, and with them their futures, and the client keeps that exception
for as long as any future of the failed key lives, one of which is in those frames (a
new-user probe: 2 keys left held per failed ``map_compact`` on a persisted input, 78 with
``by_worker=False``, after ``gc.collect()``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dask

from . import workers_installed
from .imported import distributed_if_imported


def persist(*collections: Any, check: bool = True, **kwargs: Any) -> tuple:
    """``dask.persist(*collections, **kwargs)``, the graph sent without waiting for the
    client's next batch where the scheduler is a distributed one. Where that client has a
    worker without dask_compact, :class:`.workers_installed.WorkerWithoutDaskCompact` first
    (the tasks would stop that worker, see :mod:`.workers_installed`). ``check=False`` for
    a graph of dask's own tasks over held results (a rechunk, ``operator.add``), which any
    worker runs: the direct path's result rebalanced must not be refused for a worker
    holding none of it."""
    if check:
        workers_installed.check(*collections)
    out = dask.persist(*collections, **kwargs)
    send_now(out)
    if _this_thread.made is not None:
        distributed = distributed_if_imported()
        if distributed is not None:
            made(distributed.futures_of(out))
    return out


class _ThisThread(threading.local):
    """The futures made by the eager call in progress on this thread (None: no call scoped).

    Per thread, not a ContextVar: what a call schedules on an event loop (``add_callback``)
    runs in a copy of the calling thread's context, and so does what that starts: a client
    made during a call kept the call's list in its long-lived loop tasks, and on a worker the
    next task started after a call's ``secede`` ran inside the first one's scope (its
    futures counted there, released if the other call raised; 2026-11-30)."""

    made: list | None = None


_this_thread = _ThisThread()


def made(futures: Any) -> None:
    """Count ``futures`` among those the eager call in progress made (released if it
    raises, see :func:`released_on_error`)."""
    scope = _this_thread.made
    if scope is not None:
        scope.extend(futures)


@contextmanager
def released_on_error() -> Iterator[None]:
    """Release every future made inside (:func:`made`) where the block raises; nested
    scopes leave it to the outermost one, whose result is the one returned."""
    if _this_thread.made is not None:
        yield
        return
    scope: list = []
    _this_thread.made = scope
    try:
        yield
    except BaseException:
        for f in scope:
            f.release()
        raise
    finally:
        _this_thread.made = None
        scope.clear()  # dropped at once, whatever still refers to the list


def send_now(persisted: Any) -> None:
    """Have the client that holds ``persisted``'s futures write its queued messages now."""
    distributed = distributed_if_imported()
    if distributed is None:
        return
    client = None
    for f in distributed.futures_of(persisted):
        client = f.client
        break
    stream = getattr(client, "scheduler_comm", None)
    loop = getattr(client, "loop", None)
    if stream is None or loop is None or not hasattr(stream, "waker"):
        return

    def write_now() -> None:
        if hasattr(stream, "next_deadline"):
            stream.next_deadline = None
            stream.waker.set()

    loop.add_callback(write_now)


def wait(persisted: Any) -> None:
    """Until every future of ``persisted`` has finished (or failed: its error is raised where
    the result is used, as before); nothing to wait for under an in-process scheduler. The
    scheduler releases what those tasks read in the same step that reports them done, so
    once this returns, a graph input they read is no longer held or still to run for them."""
    distributed = distributed_if_imported()
    if distributed is None:
        return
    futures = distributed.futures_of(persisted)
    if futures:
        distributed.wait(futures)


def gather(persisted: Any) -> list | None:
    """The blocks of a persisted collection, fetched from the workers with no graph (so
    nothing waits for the client's next batch), in the collection's key order; None where
    they are not all futures (an in-process scheduler: compute it instead)."""
    distributed = distributed_if_imported()
    if distributed is None:
        return None
    from dask.core import flatten

    blocks = [persisted.dask[k] for k in flatten(persisted.__dask_keys__())]
    if not blocks or not all(isinstance(b, distributed.Future) for b in blocks):
        return None
    return list(blocks[0].client.gather(blocks))
