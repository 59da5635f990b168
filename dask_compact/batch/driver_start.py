"""CUDA's start and the devices' primary contexts, begun through the driver library before
CuPy is imported.

Where a batch job compacts on this process's GPUs, its first compaction waits for three things
in a row in the warm-up (:mod:`.warmup`): CuPy's import (0.43-0.57 s on a host of four H200s),
CUDA's start (``cuInit``, which CuPy's first ``getDeviceCount`` runs: 0.55-1.04 s there) and a
context per device (0.13-0.14 s each, made one at a time by the driver). The last two need
nothing of CuPy: :class:`DriverStart` runs them from ``libcuda`` (ctypes, which releases the
GIL) in a thread of its own while CuPy is imported. The contexts are the devices' *primary*
contexts, the ones the CUDA runtime (and so CuPy) uses: the runtime finds them made. The
reference taken here is dropped (:meth:`DriverStart.release`) once the runtime holds its own.

Only ever a head start: without the library (no driver, another platform), or on any error,
it does nothing and CuPy starts CUDA as before.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable

# The driver library's name where the driver is installed (the runtime loads the same one).
LIBRARY = {"linux": "libcuda.so.1", "win32": "nvcuda.dll"}.get(sys.platform, "")


class DriverStart:
    """``cuInit``, then the primary contexts of devices 0, 1, ... while ``devices(n)`` (``n``
    the device count; asked again before each) says more are wanted, in a thread started at
    once."""

    def __init__(self, devices: Callable[[int], int]) -> None:
        self._devices = devices
        self._lib: ctypes.CDLL | None = None
        self._retained: list[int] = []  # device handles whose primary context this holds
        self._thread = threading.Thread(target=self._run, name="dask-compact-cuda-start",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        if not LIBRARY:
            return
        try:
            lib = ctypes.CDLL(LIBRARY)
        except OSError:  # no driver here: CuPy reports it its own way, if it is asked
            return
        if lib.cuInit(0) != 0:
            return
        count = ctypes.c_int(0)
        if lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return
        self._lib = lib
        i = 0
        while i < self._devices(count.value):
            dev, ctx = ctypes.c_int(0), ctypes.c_void_p(0)
            if lib.cuDeviceGet(ctypes.byref(dev), i) != 0:
                return
            if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) != 0:
                return
            self._retained.append(dev.value)
            i += 1

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the thread (bounded by ``timeout``); whether it has ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def retained(self) -> int:
        """How many devices' primary contexts this holds."""
        return len(self._retained)

    def release(self) -> None:
        """Drop this object's references to the primary contexts (after the thread ends): the
        runtime keeps a context it has taken itself; one it never took is destroyed."""
        self._thread.join()
        lib, self._lib = self._lib, None
        retained, self._retained = self._retained, []
        if lib is None:
            return
        try:
            # cuDevicePrimaryCtxRelease is the _v2 symbol since CUDA 11 (the header maps it)
            release = (getattr(lib, "cuDevicePrimaryCtxRelease_v2", None)
                       or lib.cuDevicePrimaryCtxRelease)
            for dev in retained:
                release(ctypes.c_int(dev))
        except Exception:  # noqa: BLE001 -- a reference kept lives until the process ends
            pass
