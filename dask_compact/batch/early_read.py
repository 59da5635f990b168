"""Reading the input's first chunks while the command is still starting.

A batch command spends its first second or so in one thread: Python's imports (zarr, dask,
NumPy, numba, CuPy), the input's opening and checks, the output group's creation, the
threads' start. On a host whose zstd decoding is the job's main work (16 cores, 64 chunks of
128 MiB: ~15 core-seconds of decode against ~1 s of start-up) the cores sit idle meanwhile.

:func:`begin` starts, as soon as the arguments are parsed, threads that decode the first
chunks of a local Zarr v3 array of zarr's default codecs (``bytes`` then ``zstd``) into
buffers of their own, by the same code the job's tasks use (:class:`.reader.ZarrChunkFiles`).
The job's chunk tasks then :func:`take` a chunk that was read early instead of reading it.

What it may hold is bounded as the job's memory is: it reads only the chunks the streaming
loop admits first (each charged its compressed and decoded sizes plus a full selection, see
:func:`early_cost`), under the ``--memory-budget`` given or, by default, a quarter of
the memory available (the job's default budget is half of what is then available, so its
first window holds at least those chunks). The loop stops it as it admits its first window
and drops anything outside that window; the job's tasks read every chunk it did not start.

It only ever saves time: an input it cannot read this way (another layout, a URL, a Zarr v2
array), a chunk it fails to read, or a job that reads differently (``--chunks``, a cluster's
workers) leaves the chunk to the task, which reads it and reports any
error as it would have. A chunk is read by exactly one of the two: the first to claim it.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import numpy as np

from .plan import Layout, chunk_cost, row_bytes, task_rows, thread_cost
from .reader import ChunkKeys, ZarrChunkFiles

_V3_TYPES = {
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
}

_active: EarlyRead | None = None
_active_lock = threading.Lock()


def plan(path: str, mode: str, budget: int | None) -> tuple[ZarrChunkFiles, int] | None:
    """The reader of the local Zarr array at ``path`` and how many of its first chunks to read
    early, or None where that does not apply. Reads only the array's ``zarr.json`` (no zarr
    import: that is part of what this overlaps)."""
    if "://" in path and not path.startswith(("file://", "local://")):  # .inputs.is_url
        return None
    url = os.path.abspath(path.removeprefix("file://").removeprefix("local://"))
    try:
        with open(os.path.join(url, "zarr.json"), "rb") as f:
            meta = json.load(f)
        reader = _reader(url, meta)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if reader is None:
        return None
    from .. import settings

    if task_rows(reader.chunk_rows, row_bytes(reader.shape, reader.dtype), reader.shape[0],
                 settings.get("batch.task-bytes")) != reader.chunk_rows:
        # the job's tasks each read several small chunks (.plan.task_rows), which it takes
        # whole or not at all: small chunks decode in little time, the read ahead has no
        # start to overlap
        return None
    # The job's own layout and charge per chunk (the streaming loop admits by the same rule).
    layout = Layout.make(reader.shape, reader.dtype.itemsize, reader.chunk_rows, None)
    cap = _memory_cap(budget, threads_cost(layout, mode))
    total, k = 0, 0
    while k < layout.nchunks:
        cost = early_cost(layout, k, mode)
        if total + cost > cap:
            break
        total += cost
        k += 1
    return (reader, k) if k else None


def early_cost(layout: Layout, k: int, mode: str) -> int:
    """What chunk k read early may hold: the array of its own it is decoded into (not a task
    thread's buffer), which waits for its task, and the selection the task then makes
    (:func:`.plan.chunk_cost`). The streaming loop charges the chunks read early the same."""
    return layout.in_bytes(k) + chunk_cost(layout, k, mode)


def threads_cost(layout: Layout, mode: str) -> int:
    """The buffers of the threaded scheduler's threads (one a core), which the job charges its
    budget before any chunk (:func:`.stream.charge_threads`)."""
    from dask.system import CPU_COUNT

    return CPU_COUNT * thread_cost(layout, mode)


def _reader(url: str, meta: dict[str, Any]) -> ZarrChunkFiles | None:
    """A chunk-file reader for the layout :func:`.reader.chunk_files_reader` accepts (the job
    compares its own reader with this one before taking anything, see :meth:`EarlyRead.take`),
    None for any other."""
    if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
        return None
    if meta.get("storage_transformers"):
        return None
    dtype_name = meta["data_type"]
    if not isinstance(dtype_name, str) or dtype_name not in _V3_TYPES:
        return None
    dtype = np.dtype(dtype_name)
    shape = tuple(int(s) for s in meta["shape"])
    grid = meta["chunk_grid"]
    if not shape or grid.get("name") != "regular":
        return None
    chunk_shape = tuple(int(s) for s in grid["configuration"]["chunk_shape"])
    if chunk_shape[1:] != shape[1:] or chunk_shape[0] < 1:
        return None
    codecs = meta["codecs"]
    if len(codecs) != 2 or codecs[0].get("name") != "bytes" or codecs[1].get("name") != "zstd":
        return None
    endian = (codecs[0].get("configuration") or {}).get("endian", "little")
    if dtype.itemsize > 1 and endian != "little":
        return None
    encoding = meta.get("chunk_key_encoding") or {}
    sep = (encoding.get("configuration") or {}).get("separator", "/")
    if encoding.get("name") != "default" or sep not in ("/", "."):
        return None
    n_rows = shape[0]
    nchunks = -(-n_rows // chunk_shape[0]) if n_rows else 0
    keys = ChunkKeys("c" + sep, sep.join(["", *["0"] * (len(shape) - 1)]), nchunks)
    return ZarrChunkFiles(url, shape, dtype, "", chunk_shape[0], keys, meta.get("fill_value"),
                          False)


def _memory_cap(budget: int | None, threads: int = 0) -> int:
    """A quarter of the memory available now (half of the job's default budget,
    :func:`.runner.memory_budget`), or the ``--memory-budget`` given, less the ``threads``'
    buffers the job charges it first, if smaller.

    "Available" as psutil's ``virtual_memory().available``, which the job's budget uses: on
    Linux the kernel's ``MemAvailable``, read here directly (psutil's import is 20 ms more
    before the threads start)."""
    avail = 0
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        import psutil

        avail = int(psutil.virtual_memory().available)
    cap = avail // 4
    return min(cap, budget - threads) if budget else cap


NICE = 10  # the early threads' niceness: the command's own thread (its imports) goes first


def _lower_priority() -> None:
    """This thread at niceness :data:`NICE` (Linux: per thread), where the command's thread,
    whose start-up this overlaps, and the GPU warm-up's keep theirs."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError):  # not Linux, or not permitted: the default priority
        pass


class EarlyRead:
    """Threads decoding chunks ``0..count-1`` of ``reader`` in order, until :meth:`stop`."""

    def __init__(self, reader: ZarrChunkFiles, count: int, threads: int) -> None:
        self.reader = reader
        self.count = count
        self._cond = threading.Condition()
        self._next = 0
        self._stopped = False
        # chunk -> None while an early thread reads it, then (array, seconds) or an exception
        self._chunks: dict[int, Any] = {}
        self._by_task: set[int] = set()  # chunks the job's tasks claimed first
        # the last reader found to match, known by identity after: the comparison walks every
        # chunk key, and a job asks once per chunk (a 70,001-chunk input spent most of its
        # time there)
        self._matched: Any = None
        self.taken = 0  # chunks the tasks took from here
        self.taken_bytes = 0
        self.read_s = 0.0  # seconds of the early threads on the chunks taken
        self._threads = [threading.Thread(target=self._work, name=f"dask-compact-early-{k}",
                                          daemon=True) for k in range(max(1, threads))]
        for t in self._threads:
            t.start()

    def _claim(self) -> int | None:
        with self._cond:
            while not self._stopped and self._next < self.count:
                i = self._next
                self._next += 1
                if i not in self._by_task:
                    self._chunks[i] = None
                    return i
            return None

    def _work(self) -> None:
        _lower_priority()
        r = self.reader
        while (i := self._claim()) is not None:
            r0, r1 = i * r.chunk_rows, min((i + 1) * r.chunk_rows, r.shape[0])
            t0 = time.perf_counter()
            try:
                seen = chunk_file_identity(r, i)  # before the read: see take()
                # A new array each: NumPy asks for transparent huge pages for it, so its
                # first touch costs little (on the H100 host 15 threads decoded 64 chunks of
                # 128 MiB at 8.2 GB/s so, 8.9 GB/s into one reused array per thread, and
                # 2.9 GB/s into mappings populated up front with MAP_POPULATE:
                # benchmarks/decode_buffers_probe.py).
                block = r.read(r0, r1)
                result: Any = (block, time.perf_counter() - t0, seen)
            except Exception as e:  # noqa: BLE001 -- the task reads the chunk and reports it
                result = e
            with self._cond:
                if i in self._chunks:  # not dropped by stop() meanwhile
                    self._chunks[i] = result
                self._cond.notify_all()

    def matches(self, reader: Any) -> bool:
        """Whether ``reader`` reads the same chunks the same way (the job's own reader)."""
        if reader is self.reader or reader is self._matched:
            return True
        mine = self.reader
        same = (isinstance(reader, ZarrChunkFiles) and reader.url == mine.url
                and reader.shape == mine.shape and reader.dtype == mine.dtype
                and reader.chunk_rows == mine.chunk_rows and reader.keys == mine.keys)
        if same:
            self._matched = reader
        return same

    def take(self, reader: Any, r0: int, r1: int) -> tuple[np.ndarray, float] | None:
        """Rows ``r0:r1`` as read early and the seconds that took (the caller owns the array
        from then on), or None: the caller reads them itself (and the early threads will not)."""
        rows = self.reader.chunk_rows
        i = r0 // rows
        if r0 != i * rows or r1 != min(r0 + rows, self.reader.shape[0]) or not self.matches(
                reader):
            return None
        with self._cond:
            if i not in self._chunks:
                self._by_task.add(i)
                return None
            while self._chunks.get(i, 0) is None:
                self._cond.wait()
            result = self._chunks.pop(i, None)
        if not isinstance(result, tuple):
            return None  # failed (or dropped): the task reads it and reports what fails
        block, seconds, seen = result
        if not unchanged_since(self.reader, i, seen):
            return None  # rewritten since it was read early: the task reads it as it is now
        with self._cond:
            self.taken += 1
            self.taken_bytes += block.nbytes
            self.read_s += seconds
        return block, seconds

    def stop(self, keep_below: int | None = None) -> None:
        """No chunk is started after this; read chunks at or above ``keep_below`` (outside the
        job's first window) are dropped."""
        with self._cond:
            self._stopped = True
            if keep_below is not None:
                for i in [i for i in self._chunks if i >= keep_below]:
                    del self._chunks[i]
            self._cond.notify_all()

    def close(self) -> None:
        """Stop and drop every chunk not taken."""
        self.stop(keep_below=0)

    def join(self, timeout: float | None = None) -> None:
        """Wait until the threads have ended (every chunk read, or :meth:`stop` called and the
        chunks in progress done)."""
        for t in self._threads:
            t.join(timeout)

    def summary(self) -> dict[str, Any]:
        return {"chunks": self.taken, "bytes": self.taken_bytes, "read_s": self.read_s}


def chunk_file_identity(reader: ZarrChunkFiles, i: int) -> tuple[int, ...] | None:
    """Chunk ``i``'s file: device, inode, size, modification and change times (more than
    :func:`.reader.zarr_fingerprint` keeps: at worst a chunk read again), None where it is
    missing; other errors of ``stat`` raise."""
    try:
        st = os.stat(os.path.join(reader.url, reader.keys[i]))
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def unchanged_since(reader: ZarrChunkFiles, i: int, seen: tuple[int, ...] | None) -> bool:
    """Whether chunk ``i``'s file is still the one seen just before it was read early.

    The early read starts before the job takes the input's fingerprint (what its commit
    checks the input against, :func:`.job.input_unchanged`), so a chunk rewritten between the
    two was read old while the fingerprint saw it new: a probe's job committed its first
    chunk old and its last new, exit 0. The file seen before the early read and again now,
    at the task (after the fingerprint), is the one the fingerprint saw, and a change after
    that is the commit's check's to see. One ``stat`` a chunk taken. False where ``stat``
    fails (a permission, a stale NFS handle): the task reads the chunk itself and reports
    what fails, as for a failed early read (a review: the error escaped the task raw)."""
    try:
        return chunk_file_identity(reader, i) == seen
    except OSError:
        return False


MAX_THREADS = 8


def default_threads(cores: int) -> int:
    """One per core but one (the command's own thread, whose imports and set-up this
    overlaps), at most :data:`MAX_THREADS`: more threads fault in more fresh memory at once,
    and the address space's lock they hold shared is the one the command's imports and CUDA's
    start want exclusive. Measured (whole `dask-compact` commands, two rounds each): on 16
    cores (8 GiB) 8 threads 2.64 / 2.58 s, 15 threads 2.71 / 2.58 s, none 3.15 / 2.98 s; on 32
    cores (16 GiB) 8 threads 3.82 / 3.77 s, 15 threads 4.07 / 3.83 s, 31 threads 4.64 /
    4.32 s, none 4.29 / 4.00 s (the command's thread reached the job 0.5 s later with 31)."""
    return max(1, min(MAX_THREADS, cores - 1))


def begin(path: str, mode: str, budget: int | None, threads: int | None = None
          ) -> EarlyRead | None:
    """Start reading ``path``'s first chunks in the background (see the module docstring) on
    ``threads`` threads (default: :func:`default_threads`); the started :class:`EarlyRead`, also
    the one :func:`take` uses, or None."""
    global _active
    planned = plan(path, mode, budget)
    if planned is None:
        return None
    reader, count = planned
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    early = EarlyRead(reader, count, min(count, threads or default_threads(cores)))
    with _active_lock:
        if _active is not None:
            _active.close()
        _active = early
    return early


def active() -> EarlyRead | None:
    return _active


def take(reader: Any, r0: int, r1: int) -> tuple[np.ndarray, float] | None:
    """:meth:`EarlyRead.take` of the started one; None when none was started."""
    early = _active
    return None if early is None else early.take(reader, r0, r1)


def stop(keep_below: int | None = None) -> None:
    early = _active
    if early is not None:
        early.stop(keep_below)


def end() -> dict[str, Any] | None:
    """Close the started one (its chunks not taken are freed); its :meth:`summary`."""
    global _active
    with _active_lock:
        early, _active = _active, None
    if early is None:
        return None
    early.close()
    return early.summary()
