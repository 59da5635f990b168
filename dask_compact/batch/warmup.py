"""This host's GPUs made ready in the background while a batch job does its CPU-side set-up.

A job on the threaded scheduler that compacts on the GPUs of its own process met, in its first
chunks, everything CUDA and CuPy do once per process: the driver's start and a context per
device (0.2-0.3 s on the H100 host), then the predicate's kernels built or taken from CuPy's
disk cache, loaded, and loaded again lazily at their first launch, with 16 threads queueing
for it (0.5-0.7 s of the first chunks' wall time). Measured there: a command's job took 4.3 s
cold and 2.2 s when the same process ran it a second time.

:class:`GpuWarmup` starts the driver and the contexts in the background as soon as the command
starts (from the driver library while CuPy is still being imported: :mod:`.driver_start`),
which the imports, the opening of the input and the output group's creation overlap
(CUDA's calls release the GIL). Beside the contexts, from CuPy's import on, a second thread
imports the CuPy backend and, once the input's dtype is known, builds and runs the
predicate's kernels on each device the job will use
(:func:`dask_compact.backends.cupy_backend.prepare`; NVRTC needs no context), and where
several devices are driven, registers their staging pieces (:mod:`.staging`).

Contexts one device after another: on a host of four H200s, CUDA's start (``cuInit``, in the first
``getDeviceCount``) took 0.55-1.04 s and each context 0.13-0.14 s, and four contexts made from
four threads at once took as long as one after another (0.49-0.51 s against 0.54-0.55 s: the
driver makes them in turn); a warm-up with a thread per device made commands of 2^16
elements slower there (by 0.4-0.6 s), its threads' Python work competing with the command's
set-up.
Only the devices the job's chunks use get kernels and staging pieces, and contexts too when the
job is known before they are made; the job's end starts no further step
(:meth:`GpuWarmup.close`), so a short job does not wait for devices it never used.

It only ever saves time: a failure there is silent, and the job's own first chunk meets and
reports the same error.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np


class GpuWarmup:
    """Contexts on the visible devices, then the kernels for ``(where, dtype, mode)`` and the
    staging pieces (``rings``: on one GPU too) on the devices a job uses once :meth:`prepare`
    names them, one device after another; :meth:`close` ends it."""

    def __init__(self, rings: bool = False) -> None:
        # whether the job copies through staging rings on one GPU too (nvCOMP's codec; on
        # several GPUs it always does, see .staging)
        self._rings = rings
        self.prepared = False  # whether the kernels were built and run on every device asked
        # step -> time.perf_counter() when it had ended on every device it was to run on
        # ("asked": prepare() called; "contexts", "backend": the CuPy backend imported,
        # "kernels", "rings"), for the job's timeline
        self.ended: dict[str, float] = {}
        self._contexts_taken = 0  # devices whose context the runtime holds
        self._request: tuple[str, np.dtype, str, int | None] | None = None
        self._asked = threading.Event()  # prepare() or close() was called
        self._stop = threading.Event()  # close() was called: start no further step
        self._lock = threading.Lock()
        self._kernels_thread: threading.Thread | None = None  # started by the first thread
        self._thread = threading.Thread(target=self._run, name="dask-compact-gpu-warmup",
                                        daemon=True)
        self._thread.start()

    @property
    def devices(self) -> int:
        """Devices with a context so far."""
        return self._contexts_taken

    def prepare(self, where: str, dtype: np.dtype, mode: str, chunks: int | None = None
                ) -> None:
        """Build the predicate's kernels for ``dtype`` and output ``mode`` on the devices a job
        of ``chunks`` chunks uses (chunk i on device i % n; None: every device). The first
        call only: a job has one predicate, dtype and mode."""
        with self._lock:
            if self._asked.is_set():
                return
            self._request = (where, np.dtype(dtype), mode, chunks)
            self.ended["asked"] = time.perf_counter()
            self._asked.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the steps :meth:`prepare` asked for to end (bounded by ``timeout``);
        whether they have."""
        return self._join(timeout)

    def close(self, timeout: float | None = None) -> None:
        """Start no further step and wait for the ones under way (bounded by ``timeout``)."""
        with self._lock:
            self._stop.set()
            self._asked.set()
        self._join(timeout)

    def _join(self, timeout: float | None) -> bool:
        """Join the warm-up's threads (the kernels' is started by the first), within
        ``timeout`` in all; whether both have ended."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        self._thread.join(timeout)
        with self._lock:
            kernels = self._kernels_thread
        if kernels is not None:
            kernels.join(None if deadline is None else max(0.0, deadline - time.perf_counter()))
        return not self._thread.is_alive() and not (kernels is not None and kernels.is_alive())

    def timeline(self) -> dict[str, float]:
        """When each step had ended on every device, in seconds since the process started
        (the job summary's timeline: ``gpu_asked``, ``gpu_contexts``, ``gpu_backend``,
        ``gpu_kernels``, ``gpu_rings``)."""
        from .job import process_age

        age, now = process_age(), time.perf_counter()
        with self._lock:
            return {f"gpu_{k}": age - (now - t) for k, t in self.ended.items()}

    def _contexts(self, n: int) -> int:
        """How many of the ``n`` devices get a context: those the job uses, if it is known;
        none once the command has ended."""
        if self._stop.is_set():
            return 0
        return n if self._request is None else self._used(n)

    def _run(self) -> None:
        from .driver_start import DriverStart

        # CUDA's start and the contexts, through the driver, while CuPy is being imported
        driver = DriverStart(self._contexts)
        try:
            import cupy

            n = cupy.cuda.runtime.getDeviceCount()  # CUDA's start, if the driver's is not done
            # The kernels beside the contexts: NVRTC needs no context (a module's load waits
            # for its device's), and the backend's import and the compile had begun only once
            # every context was made (on the H100 host the job's first piece waited for them:
            # 0.46 s after the contexts from CuPy's cache, 1.5-2.0 s compiling).
            kernels = threading.Thread(target=self._kernels, args=(cupy, n), daemon=True,
                                       name="dask-compact-gpu-kernels")
            with self._lock:
                self._kernels_thread = kernels
            kernels.start()
            for d in range(n):
                if d >= self._contexts(n):
                    break
                with cupy.cuda.Device(d):
                    cupy.cuda.runtime.free(0)  # the runtime takes the device's context
                self._contexts_taken += 1
            self._end("contexts")
        except Exception:  # noqa: BLE001 -- no CuPy, driver or device: the job decides
            return
        finally:
            driver.release()  # the runtime holds the contexts it took

    def _kernels(self, cupy: Any, n: int) -> None:
        """The predicate's kernels on the devices the job uses, then their staging pieces."""
        try:
            from ..backends import cupy_backend  # noqa: F401 -- imported before it is needed
        except Exception:  # noqa: BLE001 -- the first chunk meets and reports it
            return
        self._end("backend")
        self._asked.wait()
        request, used = self._request, self._used(n)
        if request is None:
            return
        where, dtype, mode, _ = request
        try:
            for d in range(used):
                if self._stop.is_set():
                    return
                _prepare(cupy, d, where, dtype, mode)
            self._end("kernels")
            self.prepared = True
            from . import staging

            if not (staging.staged_devices(n) or self._rings):
                return
            # After the kernels, not beside them: on 4x H200 a thread of their own made the
            # rings no sooner (ready 2.27-2.66 s into the command against 2.20-2.64 s) and the
            # kernels later (2.73-3.60 s against 1.48-2.36 s; other instances, one run each,
            # batch-2026-11-27-4x_NVIDIA_H200-2dc4575.md and -adbbac8.md): both go through
            # the driver.
            for d in range(used):
                if self._stop.is_set():
                    return
                with cupy.cuda.Device(d):
                    staging.ring(d)  # the device's pinned pieces, registered once
            self._end("rings")
        except Exception:  # noqa: BLE001 -- the first chunk meets and reports it
            return

    def _used(self, n: int) -> int:
        """How many of the ``n`` devices the job that asked uses (0 if none asked)."""
        if self._request is None:
            return 0
        chunks = self._request[3]
        return n if chunks is None else min(n, chunks)

    def _end(self, step: str) -> None:
        """``step`` has ended on every device it was to run on: its time is kept."""
        with self._lock:
            self.ended[step] = time.perf_counter()


def _prepare(cupy: Any, d: int, where: str, dtype: np.dtype, mode: str) -> None:
    from ..backends.cupy_backend import prepare
    from ..predicate import as_predicate

    # A predicate object of its own: the tasks' (tasks._predicate) learns the selected
    # fraction from real chunks only. Compiled modules are shared by value (the functor and
    # module caches of the CuPy backend), so the tasks find them built.
    pred = as_predicate(where)
    with cupy.cuda.Device(d):
        prepare(pred, dtype, mode)
