"""This host's GPUs made ready in the background while a batch job does its CPU-side set-up.

A job on the threaded scheduler that compacts on the GPUs of its own process met, in its first
chunks, everything CUDA and CuPy do once per process: the driver's start and a context per
device (0.2-0.3 s on the H100 host), then the predicate's kernels built or taken from CuPy's
disk cache, loaded, and loaded again lazily at their first launch, with 16 threads queueing
for it (0.5-0.7 s of the first chunks' wall time). Measured there: a command's job took 4.3 s
cold and 2.2 s when the same process ran it a second time.

:class:`GpuWarmup` starts the driver and the contexts in a thread as soon as the command
starts, which the imports, the opening of the input and the output group's creation overlap
(CUDA's calls release the GIL), and, once the input's dtype is known, builds and runs the
predicate's kernels on each device (:func:`dask_compact.backends.cupy_backend.prepare`),
and where several devices are driven, registers their staging pieces (:mod:`.staging`).
It only ever saves time: a failure there is silent, and the job's own first chunk meets and
reports the same error.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np


class GpuWarmup:
    """One background thread: contexts on every visible device at once, the kernels for
    ``(where, dtype, mode)`` once :meth:`prepare` names them; :meth:`close` ends it."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[str, np.dtype, str] | None] = (
            queue.SimpleQueue()
        )
        self.devices = 0  # devices with a context, once the first step is done
        self.prepared = False  # whether the kernels were built and run on every device
        self._asked = False
        self._thread = threading.Thread(target=self._run, name="dask-compact-gpu-warmup",
                                        daemon=True)
        self._thread.start()

    def prepare(self, where: str, dtype: np.dtype, mode: str) -> None:
        """Build the predicate's kernels for ``dtype`` and output ``mode`` on each device
        (the first call only: a job has one predicate, dtype and mode)."""
        if self._asked:
            return
        self._asked = True
        self._requests.put((where, np.dtype(dtype), mode))

    def close(self, timeout: float | None = None) -> None:
        """Drop what was not started and wait for the thread (bounded by ``timeout``)."""
        self._requests.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            import cupy

            n = cupy.cuda.runtime.getDeviceCount()
            for d in range(n):
                with cupy.cuda.Device(d):
                    cupy.cuda.runtime.free(0)  # cudaFree(0): creates the device's context
        except Exception:  # noqa: BLE001 -- no CuPy, driver or device: the job decides
            return
        self.devices = n
        request = self._requests.get()
        if request is None:
            return
        where, dtype, mode = request
        try:
            _prepare_all(cupy, n, where, dtype, mode)
        except Exception:  # noqa: BLE001 -- the first chunk meets and reports it
            return
        self.prepared = True
        from . import staging

        if staging.staged_devices(n):
            try:
                for d in range(n):  # each device's pinned pieces, registered once
                    with cupy.cuda.Device(d):
                        staging.ring(d)
            except Exception:  # noqa: BLE001 -- the first chunk meets and reports it
                return


def _prepare_all(cupy: Any, n: int, where: str, dtype: np.dtype, mode: str) -> None:
    from ..backends.cupy_backend import prepare
    from ..predicate import as_predicate

    # A predicate object of its own: the tasks' (tasks._predicate) learns the selected
    # fraction from real chunks only. Compiled modules are shared by value (the functor and
    # module caches of the CuPy backend), so the tasks find them built.
    pred = as_predicate(where)
    for d in range(n):
        with cupy.cuda.Device(d):
            prepare(pred, dtype, mode)
