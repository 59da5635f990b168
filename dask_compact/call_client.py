"""Which client an eager call runs on.

:func:`on_inputs_client` settles it for a builder (:func:`inputs_client`): the one holding
its input, as ``dask.persist(..., scheduler=client)`` would, inside a task the worker's (any
eager call, several tasks at once on a worker included), and none where the call would block
that client's own event loop.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from types import ModuleType
from typing import Any, TypeVar

from .client_stream import send_now
from .imported import distributed_if_imported

F = TypeVar("F", bound=Callable[..., Any])


class _ThisThread(threading.local):
    """Whether the eager call in progress on this thread has its client settled (nested
    calls, e.g. the sort's compactions, run on the outer call's).

    Per thread, not a ContextVar: what a call schedules on an event loop from its thread
    (``loop.add_callback``, as ``secede`` and every client method do) runs in a copy of the
    thread's context, and so does whatever that callback starts. On a worker that loop is
    the worker's: the next task it started after a call's ``secede`` ran with the flag set
    (2026-11-30, sixth session), skipped all of this (no worker client, no secede, its input's
    futures unbound) and failed ("'NoneType' object has no attribute 'wait'") or held the
    worker's only thread while waiting for its own work (hung)."""

    settled = False


_this_thread = _ThisThread()

ON_ITS_LOOP = (
    "dask_compact: an eager call waits for its result's chunk sizes, and this one was made on "
    "the event loop of {client}, which it would block (an asynchronous client, in a "
    "coroutine): run it in a thread, e.g. `y = await asyncio.to_thread(x.map_compact, "
    "pred)` (any eager call likewise: `asyncio.to_thread(dask_compact.sort, x)`), or, where "
    "the function takes lazy=True, build it lazily (its chunk sizes unknown until computed) "
    "and `await client.compute(...)` it."
)


CLOSED = (
    "dask_compact: {what} is built on futures of a client that is closed ({client}): they "
    "were cancelled when it closed (their data released, unless another client holds the "
    "same keys), so nothing was run. Call with an array persisted on a running client (its "
    "source persisted again, client.persist(...)); close a client only once the calls over "
    "what it persisted are done"
)

CANCELLED = (
    "dask_compact: {what} is built on futures that were cancelled (Client.cancel; their data "
    "released, unless another client holds the same keys), so nothing was run. Call with an "
    "array persisted again from its source (client.persist(...))"
)


def check_futures_live(a: Any, what: str) -> None:
    """ValueError, before anything is submitted, where the dask array ``a`` (``what`` in the
    message: "x", "the mask", "field 'v'") is built on futures that were cancelled: those of
    a client since closed (:data:`CLOSED`) or cancelled by it (:data:`CANCELLED`).

    What the calls said otherwise depended on the path: "Futures cancelled ... reason:
    unknown" (map_compact, asking the workers), "Client is closed. Can't send update-graph
    message" (sort, compact, partition), a graph that failed when computed (lazy calls,
    cumsum: dask's "Missing dependency", or with another client "lost dependencies"), and a
    sort of a cancelled input returned an array that failed when computed. Plain Dask's
    ``(x + 1).compute()`` says the same two things there.

    One look-up per persisted part of the graph: the first value of each materialized layer
    (where a persisted array keeps its futures, all of one client), nothing walked or
    materialized (``distributed.futures_of`` of a graph over 10^4 blocks took 0.4 s). A
    future that belongs to no client (unpickled inside a task) is not looked at."""
    distributed = distributed_if_imported()
    if distributed is None:
        return
    for future in _first_futures(distributed, a.__dask_graph__()):
        client = future.client
        if client is None:
            continue
        if client.status in ("closing", "closed"):
            raise ValueError(CLOSED.format(what=what, client=client.id))
        if future.status == "cancelled":
            raise ValueError(CANCELLED.format(what=what))


def _first_futures(distributed: ModuleType, graph: Any) -> Iterator[Any]:
    """The first value of each materialized layer of ``graph`` (a plain mapping: itself),
    where it is a future."""
    layers = getattr(graph, "layers", None)
    for layer in [graph] if layers is None else layers.values():
        if hasattr(layer, "is_materialized") and not layer.is_materialized():
            continue  # a Blockwise layer: tasks made on demand, no futures of its own
        first = next(iter(layer.values()), None)
        if isinstance(first, distributed.Future):
            yield first


def on_inputs_client(inputs: Callable[..., tuple]) -> Callable[[F], F]:
    """Run the decorated eager builder inside :func:`inputs_client` of the arrays it reads,
    ``inputs(*args, **kwargs)`` (empty for a lazy call: nothing runs then)."""

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            with inputs_client(*inputs(*args, **kwargs)):
                return fn(*args, **kwargs)

        return scoped  # type: ignore[return-value]

    return decorate


@contextmanager
def inputs_client(*inputs: Any) -> Iterator[None]:
    """An eager call over ``inputs`` (dask arrays; None and other values are skipped) runs,
    inside, on the client that holds them, as ``dask.persist(..., scheduler=client)`` would:

    * inside a task: on the worker's client (``worker_client``, as dask's own ``compute``
      there takes ``get_client()``), the task seceded from the worker's threads, as
      ``Client.get`` secedes, and for the rest of the task (:func:`_leave_the_pool`): the call
      asks that worker for work (its chunks' jobs, tasks), which would otherwise wait for the
      thread the call holds (a worker of one thread never answered). The input's futures,
      unpickled there, belong to no client until bound to it
      (:func:`_bind`: ``wait`` failed on them with "'NoneType' object has no attribute 'wait'");
    * persisted by a client that is not the default one (``Client(set_as_default=False)``):
      that client is the current one in this context (:func:`_make_current`), so what the call
      runs through dask or distributed (``dask.persist``, ``distributed.wait``, dask's
      ``get_scheduler``) takes it: they took the default client ("No clients found") or,
      with none, the local scheduler ("missing dependency");
    * otherwise as dask would choose: the default client, or, with none, the client of the
      futures a graph input is built on (``x + 1`` of a persisted ``x``; the local scheduler
      could not run it), or the local scheduler.

    Refused (RuntimeError, saying what to do) where that client's event loop is the one
    running this code: an asynchronous client in a coroutine. The call would block the loop
    its answers need, and distributed hands back un-awaited coroutines there ("'coroutine'
    object is not subscriptable")."""
    distributed = distributed_if_imported()
    # a dask collection with a graph: an xarray object answers __dask_graph__() with None
    # where it holds NumPy data, and the look-ups below failed on it with "'NoneType' object
    # has no attribute 'get'" before the call's own type check (until 2026-12-01, a
    # new-user probe: sort, argsort and partition of a DataArray with distributed imported)
    arrays = [a for a in inputs
              if hasattr(a, "__dask_graph__") and a.__dask_graph__() is not None]
    if distributed is None or not arrays or _this_thread.settled:
        yield
        return
    _this_thread.settled = True
    try:
        with ExitStack() as stack:
            client = _client_for(distributed, arrays, stack)
            if client is None:
                _refuse_an_asynchronous_default(distributed, arrays)
            elif client.asynchronous:
                raise RuntimeError(ON_ITS_LOOP.format(client=client))
            else:
                _make_current(distributed, client, stack)
            yield
    finally:
        _this_thread.settled = False


def _client_for(distributed: ModuleType, arrays: list, stack: ExitStack) -> Any:
    """The client an eager call over ``arrays`` runs on (None: as dask would choose), entered
    on ``stack`` where it is the worker's (inside a task)."""
    if _in_task(distributed):
        client = stack.enter_context(distributed.worker_client(separate_thread=False))
        _leave_the_pool(distributed)
        _bind(client, distributed.futures_of(arrays))
        return client
    held = _first_held(distributed, arrays)
    if held is None and _default(distributed) is None:
        # a graph over a non-default client's futures (x + 1 of a persisted x), which the
        # local scheduler could not run; nothing to search where the default client runs it
        held = next(iter(distributed.futures_of(arrays)), None)
    return None if held is None else held.client


def _leave_the_pool(distributed: ModuleType) -> None:
    """Have the task this code runs in secede from its worker's threads for the rest of the
    task, as ``worker_client`` secedes, but without its rejoin when the call returns.

    The call asks its own worker for work (its chunks' jobs, tasks), which would wait for the
    thread the call holds. And a task that has seceded stays "long-running" for its worker
    after it rejoins (distributed#5882): the worker hands its threads' work to the pool as if
    that thread were free, so what the task waited for next from its own worker (the sort's
    merges, still running when it returns: ``get_client().compute(y).result()``) queued
    behind it for good (a probe: hung; plain Dask's ``x.compute()`` in a task, which secedes
    and rejoins as well, then ``get_client().compute(z).result()`` hangs the same way).
    Staying out of the pool keeps the threads as the worker counts them: the rest of the task
    runs beside one more task on its worker. Nothing where the task has seceded already
    (inside ``worker_client``, an earlier call) or runs no thread of the pool."""
    from distributed.worker import thread_state  # where the worker puts start_time

    if not hasattr(thread_state, "start_time"):  # not a synchronous task (worker_client's test)
        return
    try:
        distributed.secede()
    except KeyError:  # seceded already: not one of the pool's threads
        pass


def _first_held(distributed: ModuleType, arrays: list) -> Any:
    """The future of the first block of the first of ``arrays`` persisted on a cluster (every
    block a future), or None: one look-up per array, the graphs below are not walked."""
    from dask.core import flatten

    for a in arrays:
        block = a.__dask_graph__().get(next(flatten(a.__dask_keys__()), None))
        if isinstance(block, distributed.Future):
            return block
    return None


def _refuse_an_asynchronous_default(distributed: ModuleType, arrays: list) -> None:
    """Raise :data:`ON_ITS_LOOP` where dask would take the default client for ``arrays`` (no
    held input) and refuse it: an asynchronous client, on its own loop. dask's own error
    ("Attempting to use an asynchronous Client in a synchronous context of
    `dask.compute`") says nothing of what to do; its ``get_scheduler`` decides, so a
    scheduler set in dask's config or its ``admin.async-client-fallback`` still apply."""
    default = _default(distributed)
    if default is None or not default.asynchronous:
        return
    from dask.base import get_scheduler

    try:
        get_scheduler(collections=arrays)
    except RuntimeError as refused:
        raise RuntimeError(ON_ITS_LOOP.format(client=default)) from refused


def _in_task(distributed: ModuleType) -> bool:
    """Whether this code runs inside a task on a worker."""
    try:
        distributed.get_worker()
    except ValueError:
        return False
    return True


def _default(distributed: ModuleType) -> Any:
    """The default client, None where there is none."""
    try:
        return distributed.default_client()
    except ValueError:
        return None


def _bind(client: Any, futures: list) -> None:
    """Bind the futures that belong to no client (unpickled inside a task) to ``client``, and
    have it want their keys, so the scheduler reports their state to it (a bound future is
    pending until then, and ``wait`` on it would never return) and keeps them for it while the
    call runs: what distributed's own ``get_dataset`` does for the futures it unpickles
    (``client-desires-keys``, a message ``Client`` has no public method for)."""
    loose = [f for f in futures if f.client is None]
    if not loose:
        return
    for f in loose:
        f.bind_client(client)
    client._send_to_scheduler({"op": "client-desires-keys", "keys": [f.key for f in loose]})
    send_now(loose)


def _make_current(distributed: ModuleType, client: Any, stack: ExitStack) -> None:
    """Make ``client`` the current client in this context until ``stack`` closes, where it is
    not the default one already.

    The task-local half of ``Client.as_current()``: its other half, ``dask.config.set(
    scheduler="dask.distributed")``, is process-wide, and another thread computing with the
    local scheduler meanwhile would be sent to a client (or fail for want of one). Where this
    distributed has no such context variable, ``as_current()`` whole."""
    if _default(distributed) is client:
        return
    current = getattr(distributed.client, "_current_client", None)
    if not isinstance(current, ContextVar):
        stack.enter_context(client.as_current())
        return
    token = current.set(client)
    stack.callback(current.reset, token)
