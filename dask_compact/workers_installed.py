"""Whether the workers of a call's cluster can import dask_compact, asked before a call sends
them tasks of ours.

A task of ours on a worker without the package does not fail as a task: the worker unpickles
it with the scheduler's message, and the ModuleNotFoundError breaks its stream from the
scheduler ("Failed to deserialize"). Measured with distributed 2026.7.1 (2026-12-01): the
worker stops, the data it held is lost (recomputed where it can be; scattered data for good),
the task goes to another worker, and where no other worker serves the call waits for ever. So a
failure cannot be explained after the fact (the worker is gone by then): the workers are asked
before, once per client and cluster size (:func:`check`), with one ``client.run`` of
:func:`here`, which is sent by reference to this module and so fails to unpickle where
dask_compact does not import (the batch CLI asks the same way, ``batch.runner.on_workers``).
The direct path (:mod:`.direct`) asks only the workers holding its input, in the question
it asks them anyway; both raise :class:`WorkerWithoutDaskCompact` through
:func:`cannot_import`.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from .cache import BoundedCache
from .imported import distributed_if_imported

__all__ = [
    "ANSWER_WITHIN",
    "WorkerWithoutDaskCompact",
    "cannot_import",
    "check",
    "check_client",
    "lacking",
]


class WorkerWithoutDaskCompact(ImportError):
    """A worker the call needs cannot import dask_compact."""


def cannot_import(missing: Mapping[str, str]) -> WorkerWithoutDaskCompact:
    """The error naming the workers of ``missing`` (address -> why its import failed) and
    what to install."""
    first, error = sorted(missing.items())[0]
    others = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    return WorkerWithoutDaskCompact(
        f"worker {first}{others} cannot import dask_compact ({error}): install "
        f"dask-compact, the same version as the client's, on every worker"
    )


def here(dask_worker: Any = None) -> None:
    """Nothing, run on each worker by :func:`lacking`: sent by reference to this module, its
    unpickling imports dask_compact there and fails where that fails."""


# The longest the workers' answer is waited for (seconds): the question takes 23-116 ms on
# the loaded 2-core machine; a worker that does not answer (stopped, SIGSTOP, but still
# listed until the scheduler's worker-ttl) held every call for the scheduler's broadcast,
# which has no time limit (distributed 2026.7.1): 30 s with a worker-ttl of 15 s.
ANSWER_WITHIN = 3.0


def lacking(client: Any) -> tuple[dict[str, str], bool]:
    """The workers of ``client``'s cluster that cannot import dask_compact, and why (one
    ``client.run``), and whether every worker answered. :func:`here` does nothing, so an
    error coming back is its unpickling's, whatever the import's message (a missing package,
    or one of its dependencies failing, a NumPy built for another ABI say): the scheduler
    passes it on as a plain Exception holding its repr. A worker that cannot be reached
    (closing meanwhile) answers an OSError (``CommClosedError`` included): not counted, the
    call's tasks go elsewhere. No answer within :data:`ANSWER_WITHIN`: none known."""
    try:
        answers = client.run(here, on_error="return", callback_timeout=ANSWER_WITHIN)
    except TimeoutError:  # asyncio's is the builtin one
        return {}, False
    missing = {w: _why(e) for w, e in answers.items() if _cannot_import(e)}
    return missing, not any(isinstance(e, OSError) for e in answers.values())


def _cannot_import(answer: Any) -> bool:
    """Whether a worker's answer to :func:`here` is its import's failure."""
    return type(answer) is Exception or isinstance(answer, ImportError)


def _why(error: BaseException) -> str:
    """The worker's error, as its message shows it."""
    return f"{type(error).__name__}: {error}" if isinstance(error, ImportError) else str(error)


# id(client) -> (a weak reference to the client, the cluster's size when its workers answered)
_checked: BoundedCache[int, tuple[Any, tuple]] = BoundedCache("clients whose workers import us")


def check(*collections: Any) -> None:
    """Raise :class:`WorkerWithoutDaskCompact` where the distributed client that runs
    ``collections`` now (dask's choice, as ``dask.persist`` makes it; the default or current
    client for a lazy call, whose graph is computed later) has a worker without dask_compact.
    Nothing where no distributed client runs them."""
    client = _client_of(collections)
    if client is not None:
        check_client(client)


def check_client(client: Any) -> None:
    """:func:`check` for ``client``: its workers asked once, again where the cluster's size
    as the client last saw it has changed (a worker joined or left; the client refreshes that
    every ``distributed.client.scheduler-info-interval``, 2 s, with no question of ours).
    Measured on the 2-core machine, loaded by other work, with 2 worker processes: the
    question 23-116 ms, a later call's look-up 50-70 us (mostly dask's ``get_scheduler``,
    which ``dask.persist`` runs anyway), against calls of 20-60 ms there."""
    size = _size(client)
    hit = _checked.get(id(client))
    if hit is not None and hit[0]() is client and hit[1] == size:
        return
    missing, all_answered = lacking(client)
    if missing:
        raise cannot_import(missing)
    if all_answered:  # else unknown: the call goes on, and the next one asks again
        _checked.put(id(client), (weakref.ref(client), size))


def _size(client: Any) -> tuple:
    """The cluster's workers and threads, as the client last heard (no question asked)."""
    info = getattr(client, "_scheduler_identity", None) or {}
    return (info.get("n_workers"), info.get("total_threads"))


def _client_of(collections: tuple) -> Any:
    """The distributed client dask would run ``collections`` on now, or None."""
    distributed = distributed_if_imported()
    if distributed is None:
        return None
    from dask.base import get_scheduler

    try:
        get = get_scheduler(collections=[c for c in collections if c is not None] or None)
    except (RuntimeError, ValueError):  # an asynchronous client here: the call refuses it
        return None
    client = getattr(get, "__self__", None)
    return client if isinstance(client, distributed.Client) else None
