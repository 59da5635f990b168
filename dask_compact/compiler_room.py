"""Whether this process has the memory to load numba for its first compiled loop.

numba is imported at a process's first compiled loop, not with ``dask_compact``; what it adds
to the process stays until it ends. Measured on the 2-core machine (one process, numba 0.6x,
2026-11-30): 108 MiB after ``import dask_compact`` with Dask and distributed, +50 MiB at
``import numba`` (llvmlite's LLVM library among it), +47 MiB when the CPU target is set up
(:mod:`.codegen.numba_ready`), then +4 MiB for a first loop loaded from numba's disk cache or
+17 MiB for one compiled by LLVM. So ~100-115 MiB, nearly all of it the import, not LLVM or
our cache. A distributed worker measures its process's RSS against its ``memory_limit``:
2 workers of 256 MiB each holding 50 MB of a persisted input (~155 MiB RSS) passed 95% at
their first compiled loop and were restarted, the input lost; the restarted workers paused
and a ``map_compact`` never returned (2026-11-30, a probe), where plain Dask's ``x[x > c]``
took 0.2-0.5 s. Such a worker now takes the NumPy mask path (a boolean mask of the chunk, no
numba) until it has the room.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any

__all__ = ["COMPILER_FOOTPRINT", "no_room_for_compiler", "compiled_loops", "serving_workers"]

# What numba's import, its CPU target and a first loop add to a process (measured ~115 MiB at
# most, see above), with a margin for the loop's own temporaries.
COMPILER_FOOTPRINT = 128 << 20

# Imported once the CPU target is set up: from then on every check is this dict lookup.
_LOADED = "dask_compact.codegen.numba_ready"

_SERVING = frozenset({"running", "paused", "closing_gracefully"})
_process: Any = None  # psutil.Process of this process, made at the first slow check


# The modules of compiled loops imported so far (by :func:`compiled_loops`), by name
_IMPORTED: dict[str, ModuleType] = {}


def compiled_loops(module: str) -> ModuleType | None:
    """The module of numba loops ``module`` (absolute name, e.g.
    ``dask_compact.backends.numpy_scan_loops``), imported at its first call; None where this
    process has no room for numba (:func:`no_room_for_compiler`), asked again at every call
    until it is imported (a worker may have the room later). Importing such a module loads
    numba, which is what a small worker must not do: the backends' NumPy forms serve it."""
    loops = _IMPORTED.get(module)
    if loops is None:
        if no_room_for_compiler() is not None:
            return None
        loops = _IMPORTED[module] = importlib.import_module(module)
    return loops


def no_room_for_compiler() -> str | None:
    """Why numba must not be loaded in this process now (None: load it).

    Only a distributed worker with a ``memory_limit`` is ever refused: where its RSS plus
    :data:`COMPILER_FOOTPRINT` would pass the fraction at which it pauses (or, with pausing
    off, is restarted). Costs a dict lookup once numba is loaded (every ordinary worker after
    its first loop), and ~10 us (one RSS read) on a worker still without it (measured).
    """
    if _LOADED in sys.modules or "distributed" not in sys.modules:
        return None
    limit, fraction, verb = _worker_limit()
    if limit is None:
        return None
    ceiling = limit * fraction
    used = _rss()
    if used + COMPILER_FOOTPRINT <= ceiling:
        return None
    return (
        f"no room for numba in this worker: {used / 2**20:.0f} MiB used, its compiler "
        f"needs ~{COMPILER_FOOTPRINT / 2**20:.0f} MiB more, and the worker {verb} at "
        f"{fraction:.0%} of its memory_limit of {limit / 2**20:.0f} MiB"
    )


def serving_workers() -> list[Any]:
    """The distributed workers of this process that serve (running, paused or closing
    gracefully); none where distributed's worker module is not imported. ``Worker._instances``
    is a weak set that keeps closed workers of earlier clusters until they are collected."""
    module = sys.modules.get("distributed.worker")
    if module is None:
        return []
    try:
        instances = list(module.Worker._instances)
    except RuntimeError:  # a cluster of threads may start or collect a worker meanwhile
        return []
    return [w for w in instances if getattr(w.status, "name", None) in _SERVING]


def _worker_limit() -> tuple[int | None, float, str]:
    """The smallest ``memory_limit`` of the distributed workers in this process (one for a
    worker process, several for a cluster of threads, which all measure the same RSS), the
    fraction of it the compiler must stay under, and what the worker does there ("pauses",
    or "is restarted" with pausing off); (None, 1.0, "") where no worker has a limit."""
    limits = []
    for worker in serving_workers():
        manager = getattr(worker, "memory_manager", None)
        limit = getattr(manager, "memory_limit", None)
        if limit:
            limits.append((int(limit), _ceiling_fraction(manager)))
    if not limits:
        return None, 1.0, ""
    limit, (fraction, verb) = min(limits, key=lambda lf: lf[0] * lf[1][0])
    return limit, fraction, verb


def _ceiling_fraction(manager: Any) -> tuple[float, str]:
    """The worker's pause fraction; with pausing off, the nanny's terminate fraction (its
    restart), itself from Dask's config; and what the worker does there."""
    pause = getattr(manager, "memory_pause_fraction", False)
    if pause:
        return float(pause), "pauses"
    import dask

    terminate = dask.config.get("distributed.worker.memory.terminate", 0.95)
    return (float(terminate), "is restarted") if terminate else (1.0, "runs out of memory")


def _rss() -> int:
    global _process
    if _process is None:
        import psutil

        _process = psutil.Process()
    return int(_process.memory_info().rss)
