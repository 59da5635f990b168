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
predicate's kernels on each device (:func:`dask_compact.backends.cupy_backend.prepare`).
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
        self._requests: queue.SimpleQueue[tuple[Any, tuple] | None] = queue.SimpleQueue()
        self.devices = 0  # devices with a context, once the first step is done
        self.prepared = False  # whether the kernels were built and run on every device
        self._thread = threading.Thread(target=self._run, name="dask-compact-gpu-warmup",
                                        daemon=True)
        self._thread.start()

    def prepare(self, where: str, dtype: np.dtype, mode: str) -> None:
        """Build the predicate's kernels for ``dtype`` and output ``mode`` on each device."""
        self._requests.put((_prepare_all, (where, np.dtype(dtype), mode)))

    def prepare_records(self, where: str, fields: dict[str, tuple[np.dtype, tuple[int, ...]]],
                        indices: bool) -> None:
        """Build and run the record kernels of ``where`` over ``fields`` (name -> dtype and
        trailing shape: every field a chunk task reads) on each device."""
        self._requests.put((_prepare_records, (where, dict(fields), indices)))

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
        prepare, args = request
        try:
            prepare(cupy, n, *args)
        except Exception:  # noqa: BLE001 -- the first chunk meets and reports it
            return
        self.prepared = True


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


def _prepare_records(cupy: Any, n: int, where: str,
                     fields: dict[str, tuple[np.dtype, tuple[int, ...]]], indices: bool) -> None:
    from ..dispatch import compact_records
    from ..records_check import check_record_predicate

    # A predicate object of its own, as for one array; a few tiles of rows of varied values,
    # so that the predicate likely selects some and the copy's kernels run too (the copy is
    # skipped when nothing is selected; CUDA loads a kernel at its first launch).
    rows = 1 << 15
    for d in range(n):
        with cupy.cuda.Device(d):
            blocks = {name: _varied(cupy, (rows, *tail), dtype)
                      for name, (dtype, tail) in fields.items()}
            p = check_record_predicate(where, blocks)
            compact_records(next(iter(blocks.values())), blocks, p, indices, True, 0, 1)
            cupy.cuda.get_current_stream().synchronize()


def _varied(cupy: Any, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """Values of ``dtype`` spread over a range: uniform [0, 1) for floats, 0..255 for
    integers, alternating for booleans."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape))
    if dtype.kind == "f":
        return cupy.random.default_rng(0).random(size, dtype=np.float32).astype(dtype).reshape(
            shape)
    ramp = cupy.arange(size, dtype=np.int64)
    if dtype.kind == "b":
        return (ramp % 2 == 0).reshape(shape)
    return (ramp % 256).astype(dtype).reshape(shape)
