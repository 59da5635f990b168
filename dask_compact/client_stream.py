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
"""

from __future__ import annotations

from typing import Any

import dask

from .imported import distributed_if_imported


def persist(*collections: Any, **kwargs: Any) -> tuple:
    """``dask.persist(*collections, **kwargs)``, the graph sent without waiting for the
    client's next batch where the scheduler is a distributed one."""
    out = dask.persist(*collections, **kwargs)
    send_now(out)
    return out


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

