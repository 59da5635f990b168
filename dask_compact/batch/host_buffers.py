"""Host memory a batch job's chunk tasks reuse instead of allocating per chunk.

A chunk is 64-512 MiB. A fresh NumPy array of that size is a fresh ``mmap`` (glibc serves
allocations above 32 MiB that way, whatever ``mallopt`` says) whose every page faults on
first touch and is unmapped again at free; with 16 threads doing that at once the page-fault
and ``mmap`` locks of the process serialise them. Measured on the H100 host (16 cores, 64
zstd chunks of 128 MiB): decoding into a fresh array per chunk ran at 5.0 GB/s, into a
per-thread reused one 10.1 GB/s (with the compressed bytes memory-mapped, see
:mod:`.reader`).

The same holds for the selection a chunk task hands on (held until its output chunk is
written): compacting into a fresh array ran at 0.8 GB/s on the 2-core CI machine, into memory
already paged in at 5.3 GB/s. Those buffers outlive the task, so they come from a pool
(:class:`HostPool`) and go back to it when the last array viewing them is garbage.

Each worker thread keeps one scratch buffer of each kind and grows it when a larger chunk
comes:

* :func:`thread_host` -- the decoded chunk on the CPU path, or an output chunk put together
  from several pieces before it is encoded (either dropped by the end of the task);
* :func:`thread_pinned` -- the decoded chunk on the GPU path, in page-locked memory, so the
  copy to the device runs at full bandwidth and asynchronously;
* :func:`thread_field` -- one of each per field of a record's block (a Zarr group's job).

Pinned buffers are ordinary host memory page-locked in place (``cudaHostRegister``), not
``cudaHostAlloc``'d (CuPy's pinned memory pool, ``cupyx.empty_pinned``): measured on the H100
host, 16 threads each taking a 128 MiB buffer, ``cudaHostAlloc`` ran at 2.2 GB/s, serialised in
the driver (a second of a command's first chunks, every run), registering touched pages at
19.8 GB/s; a copy to the device from either runs at the same 54 GB/s.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

_local = threading.local()


def _thread_buffer(slot: str, shape: tuple[int, ...], dtype: np.dtype,
                   make: Callable[[int], np.ndarray]) -> np.ndarray:
    """This thread's buffer ``slot`` (uint8, from ``make(nbytes)``, grown when too small),
    viewed as ``shape``/``dtype``."""
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    buf = getattr(_local, slot, None)
    if buf is None or buf.nbytes < max(1, n):
        setattr(_local, slot, None)  # let the old buffer go before the new one is taken
        buf = make(max(1, n))
        setattr(_local, slot, buf)
    return buf[:n].view(dtype).reshape(shape)


def thread_host(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This thread's reusable host buffer viewed as ``shape``/``dtype``: valid until the
    thread's next call, so nothing that outlives the task may keep a view of it."""
    return _thread_buffer("host", shape, dtype, lambda n: np.empty(n, dtype=np.uint8))


PAGE = 4096


class _Registered:
    """Host memory page-locked for the CUDA devices while any array views it: registered on
    creation, unregistered when the last view is garbage (before NumPy frees the memory).

    The registered range is whole pages of its own (the allocation is over-sized and aligned),
    so two registrations never share a page: CUDA refuses to register a page twice."""

    def __init__(self, nbytes: int) -> None:
        import cupy

        size = -(-max(1, nbytes) // PAGE) * PAGE
        raw = np.empty(size + PAGE, dtype=np.uint8)
        skip = -raw.ctypes.data % PAGE
        self._mem = raw[skip : skip + size]
        self._runtime = cupy.cuda.runtime
        self._runtime.hostRegister(self._mem.ctypes.data, size, 0)  # cudaHostRegisterDefault
        self.__array_interface__ = self._mem[:nbytes].__array_interface__

    def __del__(self) -> None:
        try:
            self._runtime.hostUnregister(self._mem.ctypes.data)
        except Exception:  # noqa: BLE001 -- at interpreter exit CUDA may already be torn down
            pass


class _RegisteredArray:
    """An existing host array page-locked in place while any array views this object (the
    array itself is kept alive by it); unregistered when the last view is garbage."""

    def __init__(self, a: np.ndarray) -> None:
        import cupy

        self._a = a
        self._runtime = cupy.cuda.runtime
        self._runtime.hostRegister(a.ctypes.data, a.nbytes, 0)  # cudaHostRegisterDefault
        self.__array_interface__ = a.reshape(-1).view(np.uint8).__array_interface__

    def __del__(self) -> None:
        try:
            self._runtime.hostUnregister(self._a.ctypes.data)
        except Exception:  # noqa: BLE001 -- at interpreter exit CUDA may already be torn down
            pass


def pin_in_place(a: np.ndarray) -> np.ndarray | None:
    """``a`` (C-contiguous, its memory already written) page-locked in place, as a view of
    the same shape and dtype; unregistered when the view and its views are garbage. It becomes
    this thread's pinned buffer (:func:`thread_pinned`) if the thread has none or a smaller
    one. None where CUDA refuses (e.g. a page of ``a`` shared with another registration: small
    arrays from the heap); the caller then copies into :func:`thread_pinned`.

    A chunk decoded early (:mod:`.early_read`) into its own array goes to the device this
    way: registering written pages ran at 19.8 GB/s on the H100 host, against a copy into the
    thread's buffer plus, for each thread's first chunk, that buffer's own allocation and
    registration (2 GiB of fresh pages for 16 threads: the first chunks' 0.6-0.7 s)."""
    if a.nbytes == 0 or not a.flags.c_contiguous:
        return None
    try:
        mem = np.asarray(_RegisteredArray(a))
    except Exception:  # noqa: BLE001 -- cudaErrorHostMemoryAlreadyRegistered and the like
        return None
    own = getattr(_local, "pinned", None)
    if own is None or own.nbytes < mem.nbytes:
        _local.pinned = mem
    return mem.view(a.dtype).reshape(a.shape)


def pinned(nbytes: int) -> np.ndarray:
    """A page-locked uint8 host array of ``nbytes`` (unregistered and freed when the array and
    its views are garbage)."""
    return np.asarray(_Registered(nbytes))


def thread_field(k: int, shape: tuple[int, ...], dtype: np.dtype, pinned_memory: bool
                 ) -> np.ndarray:
    """This thread's reusable buffer for field ``k`` of a record's block (one per field, since
    a block's fields are decoded side by side; page-locked when ``pinned_memory``, for a copy
    to the GPU), viewed as ``shape``/``dtype``; the same rules as :func:`thread_host`."""
    if pinned_memory:
        return _thread_buffer(f"pinned-field-{k}", shape, dtype, pinned)
    return _thread_buffer(f"host-field-{k}", shape, dtype, lambda n: np.empty(n, dtype=np.uint8))


def thread_pinned(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This thread's reusable pinned buffer viewed as ``shape``/``dtype``.

    Reused by the thread's next chunk only after this one's copy is done: the compaction
    reads its count back to the host, which waits for everything queued before it on the
    thread's stream, the copy included."""
    return _thread_buffer("pinned", shape, dtype, pinned)


class _Lease:
    """Owner of one pooled buffer while arrays view it: NumPy keeps it as their base, and when
    the last of them is garbage the buffer goes back to the pool (as CuPy's pinned memory
    pool does with its pointers)."""

    def __init__(self, pool: HostPool, mem: np.ndarray) -> None:
        self._pool, self._mem = pool, mem
        self.__array_interface__ = mem.__array_interface__

    def __del__(self) -> None:
        self._pool._give_back(self._mem)


class HostPool:
    """Host buffers that chunk tasks reuse for their selections (see the module docstring).

    :meth:`alloc` has the signature of the CPU backend's ``alloc``. A request takes the
    smallest idle buffer that holds it, if that is at most twice its size (else a new one);
    a buffer given back is kept idle while the idle and leased buffers together stay within
    :attr:`keep` bytes, else freed at once (2026-11-30: idle ones alone up to ``keep`` held a
    budget's worth beside the pieces the budget already counts). So the pool holds at most the
    larger of ``keep`` and what is leased; :attr:`peak` is its high-water mark. The batch job
    sets ``keep`` for its run and empties the pool at the end (:func:`pool_for_job`)."""

    def __init__(self, keep: int = 0) -> None:
        self.keep = keep
        self.peak = 0  # the most bytes idle and leased together
        # idle buffers in order of size, and their bytes: a request finds its buffer by
        # bisection and nothing is summed per call (a job of 70,001 one-row chunks, each
        # giving back a selection buffer, spent much of its time walking this list)
        self._idle: list[np.ndarray] = []
        self._idle_bytes = 0
        self._leased = 0
        self._lock = threading.Lock()
        self._returned: list[np.ndarray] = []  # given back, not yet counted (_give_back)

    def alloc(self, n: int, dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = max(1, n * dtype.itemsize)
        with self._lock:
            self._take_returned()
            i = bisect.bisect_left(self._idle, nbytes, key=_nbytes)  # the smallest that fits
            if i < len(self._idle) and self._idle[i].nbytes <= 2 * nbytes:
                # by position: list.remove would compare the arrays elementwise
                mem = self._idle.pop(i)
                self._idle_bytes -= mem.nbytes
            else:
                mem = np.empty(nbytes, dtype=np.uint8)
            self._leased += mem.nbytes
            self.peak = max(self.peak, self._leased + self._idle_bytes)
        return np.asarray(_Lease(self, mem))[: n * dtype.itemsize].view(dtype)

    def _give_back(self, mem: np.ndarray) -> None:
        """From a lease's ``__del__``: never waits for the lock. The garbage collector runs
        that ``__del__`` on whatever thread allocates when it collects (a lease in a reference
        cycle), inside :meth:`alloc` too, which holds the lock: until 2026-12-01 (the twelfth
        session's probe) the give-back waited for it there, on the same thread, and a
        ``--local threads`` job hung. The buffer is queued (``list.append`` holds the GIL)
        and counted now if the lock is free, else by the lock's holder or the next call."""
        self._returned.append(mem)
        if self._lock.acquire(blocking=False):
            try:
                self._take_returned()
            finally:
                self._lock.release()

    def _take_returned(self) -> None:
        """Count the buffers given back (under the lock): idle while the idle and leased
        buffers stay within ``keep``, else freed."""
        while self._returned:
            mem = self._returned.pop()
            if self._idle_bytes + self._leased <= self.keep:  # mem is still counted as leased
                bisect.insort_right(self._idle, mem, key=_nbytes)
                self._idle_bytes += mem.nbytes
            self._leased -= mem.nbytes

    def clear(self) -> None:
        with self._lock:
            self._take_returned()
            self._idle.clear()
            self._idle_bytes = 0


def _nbytes(mem: np.ndarray) -> int:
    return mem.nbytes


PIECES = HostPool()


def piece_alloc(n: int, dtype: np.dtype) -> np.ndarray:
    """:meth:`HostPool.alloc` of :data:`PIECES`. Tasks call this module function rather than
    the pool object: a task function shipped by value (cloudpickle) then refers to it by name
    instead of trying to pickle a pool and its lock."""
    return PIECES.alloc(n, dtype)


@contextmanager
def pool_for_job(keep: int) -> Iterator[HostPool]:
    """:data:`PIECES` keeping up to ``keep`` idle bytes for the job's duration, emptied after
    (a long-lived worker process must not hold a finished job's memory)."""
    PIECES.keep = keep
    PIECES.peak = 0
    try:
        yield PIECES
    finally:
        PIECES.keep = 0
        PIECES.clear()
