"""Host memory a batch job's chunk tasks reuse instead of allocating per chunk.

A chunk is 64-512 MiB. A fresh NumPy array of that size is a fresh ``mmap`` (glibc serves
allocations above 32 MiB that way, whatever ``mallopt`` says) whose every page faults on
first touch and is unmapped again at free; with 16 threads doing that at once the page-fault
and ``mmap`` locks of the process serialise them. Measured on the H100 host (16 cores, 64
zstd chunks of 128 MiB): decoding into a fresh array per chunk ran at 5.0 GB/s, into a
per-thread reused one 10.1 GB/s (with the compressed bytes memory-mapped, see
:mod:`.reader`).

So each worker thread keeps one buffer of each kind and grows it when a larger chunk comes:

* :func:`thread_host` -- the decoded chunk on the CPU path (dropped by the end of the task:
  compaction writes its selection into new, smaller arrays);
* :func:`thread_pinned` -- the decoded chunk on the GPU path, in page-locked memory, so the
  copy to the device runs at full bandwidth and asynchronously.

Pinned memory comes from CuPy's pinned memory pool (``cupy.cuda.alloc_pinned_memory``), not
``cupyx.empty_pinned``: importing ``cupyx`` imports SciPy's sparse module (0.7 s measured on
the H100 host), which a batch job never uses.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

_local = threading.local()


def _view(buf: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return buf[:n].view(dtype).reshape(shape)


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return max(1, int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize)


def thread_host(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This thread's reusable host buffer viewed as ``shape``/``dtype``: valid until the
    thread's next call, so nothing that outlives the task may keep a view of it."""
    n = _nbytes(shape, dtype)
    buf = getattr(_local, "host", None)
    if buf is None or buf.nbytes < n:
        _local.host = None  # let the old buffer go before the new one is taken
        buf = _local.host = np.empty(n, dtype=np.uint8)
    return _view(buf, shape, dtype)


def pinned(nbytes: int) -> np.ndarray:
    """A page-locked uint8 host array of ``nbytes`` from CuPy's pinned memory pool (returned
    to the pool when the array is garbage)."""
    import cupy

    mem = cupy.cuda.alloc_pinned_memory(max(1, nbytes))
    return np.frombuffer(mem, dtype=np.uint8, count=max(1, nbytes))


def thread_pinned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This thread's reusable pinned buffer viewed as ``shape``/``dtype``.

    Reused by the thread's next chunk only after this one's copy is done: the compaction
    reads its count back to the host, which waits for everything queued before it on the
    thread's stream, the copy included."""
    n = _nbytes(shape, dtype)
    buf = getattr(_local, "pinned", None)
    if buf is None or buf.nbytes < n:
        _local.pinned = None
        buf = _local.pinned = pinned(n)
    return _view(buf, shape, dtype)
