"""Kernel launches whose arguments are packed once: ``cuLaunchKernel`` through CuPy's driver
bindings, with a pointer array into an array of argument slots that a repeated call updates
only where its arguments changed.

Why: CuPy's ``RawKernel.__call__`` inspects and boxes every argument at every launch. On the
H100 host a launch of the compaction kernel (10 arguments) cost 9.6-12 us of host time, while
the kernel itself, at 2^20 float32 elements, runs in about 5 us: a small call was bound by its
launches. Writing a slot is a NumPy item assignment.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

SLOT = 16  # bytes per argument: the widest is a complex128 predicate constant

# Whether this thread has bound the current device's primary context (see _bind), and its key
# in the kept calls' caches (thread_key).
_thread = threading.local()


def thread_key() -> object:
    """This thread's part of the keys of the calls kept between calls (``cupy_calls``'
    ready and repeated calls, the records' ones): an object made for this thread, which the
    entries it keys hold, so that no later thread ever has it. Until 2026-12-01 (thirteenth
    session, a concurrency probe) ``threading.get_ident()``, which a thread started after
    another has ended is often given again: it then ran the ended thread's kept calls, whose
    scratch and words that thread's last work could still be using on its per-thread default
    stream, another stream than the new thread's under the same pointer (2)."""
    key = getattr(_thread, "key", None)
    if key is None:
        key = _thread.key = object()
    return key


def _bind() -> None:
    """Make the current device's primary context current in this thread.

    ``cuLaunchKernel`` launches in the thread's current context, which only the runtime API
    sets (lazily, on a call that needs one). A ready call keeps its workspace, so a thread
    may reach its first launch having made no such call: a dask pool thread started after
    the one that built the call, which ``threading.get_ident()`` (the ready calls' key until
    2026-12-01, now :func:`thread_key`) gave the same id once the first had ended. Its launch
    then failed with
    CUDA_ERROR_INVALID_CONTEXT (the GPU tests of ds.compact.where, one run in two).
    ``cudaSetDevice`` binds the primary context (CUDA 12 and later)."""
    import cupy

    runtime = cupy.cuda.runtime
    runtime.setDevice(runtime.getDevice())
    _thread.bound = True


class PackedLaunch:
    """One kernel (a CuPy ``RawKernel``, on the current device) and the slots of its
    ``nargs`` arguments. Not thread-safe: each thread keeps its own (the slots are state)."""

    def __init__(self, kernel: Any, nargs: int) -> None:
        import cupy

        self.kernel = kernel  # keeps its module loaded while this lives
        self._func = int(kernel.kernel.ptr)  # the CUfunction on the current device
        self._slots = np.zeros(nargs * SLOT // 8, dtype=np.uint64)
        self._i64 = self._slots.view(np.int64)
        self._bytes = self._slots.view(np.uint8)
        base = self._slots.ctypes.data
        self._params = np.array([base + SLOT * i for i in range(nargs)], dtype=np.uint64)
        self._params_ptr = self._params.ctypes.data
        self._launch = cupy.cuda.driver.launchKernel

    def pointer(self, i: int, ptr: int) -> None:
        """Argument ``i`` is a device pointer (0: null)."""
        self._slots[i * (SLOT // 8)] = ptr

    def int64(self, i: int, value: int) -> None:
        self._i64[i * (SLOT // 8)] = value

    def uint64(self, i: int, value: int) -> None:
        self._slots[i * (SLOT // 8)] = value

    def scalar(self, i: int, value: np.generic) -> None:
        """Argument ``i`` is a NumPy scalar passed by value (its bytes, e.g. a float32)."""
        raw = np.frombuffer(np.asarray(value).tobytes(), dtype=np.uint8)
        if raw.size > SLOT:
            raise ValueError(f"a kernel argument of {raw.size} bytes does not fit a slot")
        self._bytes[i * SLOT : i * SLOT + raw.size] = raw

    def __call__(self, grid: int, block: int, shared_mem: int, stream_ptr: int,
                 grid_y: int = 1) -> None:
        if not getattr(_thread, "bound", False):
            _bind()
        self._launch(self._func, grid, grid_y, 1, block, 1, 1, shared_mem, stream_ptr,
                     self._params_ptr, 0)
