"""Device memory chores of the CuPy layer: zeroing, copies by ``cudaMemcpyAsync``, the count
words read back into pinned host memory with one synchronisation, joining outputs, what a
CUDA graph capture keeps alive (:func:`capturing`, ``kept_for_graphs``); and the one check a
kernel cannot make for itself (negative integer exponents, :func:`check_powers`)."""

from __future__ import annotations

import contextlib
import math
import threading
from typing import Any

import numpy as np

from ..validate import by_output

__all__ = ["NULL", "NO_CAP", "contiguous", "memset0", "ptr_or_null", "by_output", "device_copy",
           "head_copy", "head_rows", "output_empty", "class_items", "read_words", "read_counts",
           "concat_outputs", "check_powers", "capturing", "kept_for_graphs",
           "beside_the_pool"]

NULL = np.uint64(0)
# dcx_single_pass's cap argument where the output holds every selected element
# (kernels/compact_tile.cuh NO_CAP: the bound folds away)
NO_CAP = np.uint64(2**64 - 1)


def contiguous(a: Any) -> Any:
    """``a`` as C-contiguous device memory: ``a`` itself where it is, else a copy.

    The kernels read their input by flat index, so a strided view (``a[::2]``, a column of a
    2-D array) is copied whole first: ``a.nbytes`` more device memory for the call, beyond
    what the docs give for contiguous input. Where that copy does not fit, its MemoryError
    says so (a probe found CuPy's bare "Out of memory allocating ..." from a
    ``compact_into`` whose output was already allocated and whose result was 1 MiB)."""
    import cupy

    if a.flags.c_contiguous:
        return a
    try:
        return cupy.ascontiguousarray(a)
    except MemoryError as e:
        e.add_note(
            f"dask_compact: a non-contiguous CuPy array (shape {a.shape}, strides {a.strides})"
            f" is copied to contiguous device memory first ({a.nbytes / 2**20:,.1f} MiB), and"
            " that copy did not fit. Free device memory (cupy.get_default_memory_pool()."
            "free_all_blocks() returns what CuPy's pool keeps) or pass a contiguous array.")
        raise

# Exact-size outputs of at least this many bytes are allocated in size classes (see
# class_items). Below it CuPy's pool reuses blocks well enough and a view costs a call's
# host time where calls are microseconds (2^20 float32 values at p = .5: 2 MiB).
OUTPUT_CLASS_MIN_BYTES = 1 << 25


def class_items(n: int, row_bytes: int) -> int:
    """Rows to allocate for an exact-size output of ``n`` rows of ``row_bytes``: ``n``
    below OUTPUT_CLASS_MIN_BYTES, else ``n`` rounded up to a size class, a multiple of
    1/256 to 1/128 of the bytes (so at most 0.8% more).

    Why: an output's exact size changes from call to call, and CuPy's pool serves a request
    only from a free block at least as large. Where each call's output is a little larger
    than the last (a threshold raised a little each call), every call allocated new device
    memory and the pool grew by an output a call until the device was full; then CuPy freed
    every cached block and retried. One H200, a worker's job of 17 chunks of 2^28 float32
    (8.5 GiB out) in a loop: 12.6-13.2 ms a call while the pool grew from 30 to 133 GiB,
    44-91 ms at each such flush; the same sizes again from a grown pool: 12.1-13.6 ms. In
    size classes, such outputs share their class's blocks.

    >>> class_items(1000, 4)
    1000
    >>> n = (1 << 30) + 12345
    >>> class_items(n, 4) == class_items(n + 1000, 4) and 0 <= class_items(n, 4) - n < n / 128
    True
    """
    nbytes = n * row_bytes
    if nbytes < OUTPUT_CLASS_MIN_BYTES:
        return n
    step = 1 << (nbytes.bit_length() - 8)
    return -(-(-(-nbytes // step) * step) // row_bytes)


def head_rows(arr: Any, k: int) -> Any:
    """``arr[:k]`` of a C-contiguous CuPy array, made as a new array over its memory (which
    the memory pointer keeps alive, as a view's base does), not by CuPy's indexing: a small
    call's result is such a head of a larger allocation, and on one H200 the slice cost
    3.0 us of host time, the constructor 1.2 us, in a call of ~32 us whose host time is its
    floor (2026-12-02, ``benchmarks/results/2026-12-02_h200_*_small_call_host_profile.txt``).
    In an A/B of the public calls there (2^20, alternating rounds) about 1.5 us a call for
    float64 and within the host's noise for float32."""
    import cupy

    shape = arr.shape
    if k == shape[0]:
        return arr
    return cupy.ndarray(k if len(shape) == 1 else (k, *shape[1:]), arr.dtype, arr.data)


def output_empty(n: int, dtype: Any, tail: tuple = ()) -> Any:
    """An uninitialised CuPy array of shape ``(n, *tail)`` for an exact-size output: the
    first ``n`` rows of an allocation of :func:`class_items` rows (a view where that is
    more, which keeps the whole allocation alive)."""
    import cupy

    dtype = np.dtype(dtype)
    row = dtype.itemsize * math.prod(tail) if tail else dtype.itemsize
    if n * row < OUTPUT_CLASS_MIN_BYTES:  # the common small call: no arithmetic, no view
        return cupy.empty((n, *tail) if tail else n, dtype=dtype)
    rows = class_items(n, row)
    out = cupy.empty((rows, *tail), dtype=dtype)
    return head_rows(out, n)


def memset0(arr: Any, nbytes: int | None = None) -> None:
    """Zero ``arr``'s first ``nbytes`` (default: all of it) on the current stream; no view
    to make for a part, no elementwise kernel."""
    import cupy

    n = arr.nbytes if nbytes is None else nbytes
    cupy.cuda.runtime.memsetAsync(arr.data.ptr, 0, n, cupy.cuda.get_current_stream().ptr)


def ptr_or_null(a: Any) -> Any:
    return NULL if a is None else a


def device_copy(dst: Any, dst_at: int, src: Any, src_at: int, k: int,
                stream_ptr: int | None = None) -> None:
    """``dst[dst_at:dst_at+k] = src[src_at:src_at+k]`` as one ``cudaMemcpyAsync`` on
    ``stream_ptr`` (default: the current stream; a slice assignment launches an elementwise
    kernel: several times the host time)."""
    import cupy

    if stream_ptr is None:
        stream_ptr = cupy.cuda.get_current_stream().ptr
    s = src.itemsize
    cupy.cuda.runtime.memcpyAsync(dst.data.ptr + dst_at * s, src.data.ptr + src_at * s, k * s,
                                  cupy.cuda.runtime.memcpyDeviceToDevice, stream_ptr)


def head_copy(scratch: Any, k: int, stream_ptr: int | None = None) -> Any:
    """The first ``k`` elements of ``scratch`` in a new exact-size array: one ``cudaMemcpyAsync``
    on ``stream_ptr`` (default: the current stream; a slice's ``copy()`` launches an
    elementwise kernel, 17 us of host time at 2^19 elements on the H100, against ~3 us)."""
    out = output_empty(k, scratch.dtype)
    if k:
        device_copy(out, 0, scratch, 0, k, stream_ptr)
    return out


_count_buffers = threading.local()


def read_words(words: Any) -> list[int]:
    """A uint64 device array on the host (one copy, one synchronisation of the stream)."""
    import cupy

    need = 8 * words.size
    host = _pinned_host(need)
    stream = cupy.cuda.get_current_stream()
    try:
        cupy.cuda.runtime.memcpyAsync(host.ctypes.data, words.data.ptr, need,
                                      cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
    except BaseException:
        landed(stream)  # interrupted: its copy lands before it raises (see there)
        raise
    return [int(c) for c in host[:need].view(np.uint64)]


def landed(stream: Any) -> None:
    """The wait of a call interrupted with work still queued on ``stream`` that writes
    host-visible memory (``KeyboardInterrupt`` between its queueing and its synchronisation,
    or anything raised there): that work lands before the call re-raises, so that nothing
    the next call reads or reuses (a pinned count word or buffer, a pinned column table, memory
    handed back to CuPy's pool) is written late. Called from the ``except BaseException``
    around the queue-and-wait of every such call: the read backs here, the ready call's mapped
    count word (``cupy_ready``) and the records ready call's pinned tables
    (``cupy_records_ready``); each says there what went wrong without it. An uninterrupted
    call pays nothing; a failed wait (a kernel's error) leaves the call's own error.

    The read backs: their pinned buffer is the thread's, not the stream's: until 2026-12-01
    (fourteenth session; noted by the ready call's fix, daeb377) a copy left queued landed
    later, during the thread's next read back on another stream (after that read's own copy,
    before its host read: the next call took the interrupted call's count for its own), or,
    once the buffer had grown, in pinned memory CuPy's pool had handed on."""
    with contextlib.suppress(Exception):
        stream.synchronize()


def _pinned_host(need: int) -> np.ndarray:
    """This thread's pinned buffer of at least ``need`` bytes (grown as needed)."""
    import cupy

    host = getattr(_count_buffers, "host", None)
    if host is None or host.size < need:
        mem = cupy.cuda.alloc_pinned_memory(max(need, 512))
        host = np.frombuffer(mem, dtype=np.uint8, count=max(need, 512))
        _count_buffers.host, _count_buffers.mem = host, mem
    return host


def read_counts(words: list[Any]) -> list[int]:
    """The device count words on the host, with one synchronisation of the current stream.

    Each word is copied into this thread's pinned buffer by ``cudaMemcpyAsync``: a
    ``concatenate`` then ``get()`` cost two allocations, a kernel and a pageable copy, which
    at 2^20 elements took longer than the compaction."""
    import cupy

    if not words:
        return []
    need = 8 * len(words)
    host = _pinned_host(need)
    stream = cupy.cuda.get_current_stream()
    try:
        for i, w in enumerate(words):
            cupy.cuda.runtime.memcpyAsync(host.ctypes.data + 8 * i, w.data.ptr, 8,
                                          cupy.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
    except BaseException:
        landed(stream)  # interrupted: its copies land before it raises (see there)
        raise
    return [int(c) for c in host[:need].view(np.uint64)]


def concat_outputs(parts: list[Any], output: str) -> Any:
    """One output of the parts' (each a run's output, or a (values, indices) pair), on the
    current device, allocated as every exact-size output is (:func:`output_empty`)."""
    if output == "both":
        return (_concat([v for v, _ in parts]), _concat([i for _, i in parts]))
    return _concat(parts)


def _concat(arrays: list[Any]) -> Any:
    """The arrays (C-contiguous, of one dtype and row shape, on any devices) one after the
    other on the current device. A part on another device is copied peer to peer
    (``cudaMemcpyPeerAsync``: no peer access needed) after its device's current stream has
    run what made it (an event waited on by this stream: the copy must not read a part its
    compaction is still writing), and the host waits for those copies."""
    import cupy

    first = arrays[0]
    out = output_empty(sum(len(a) for a in arrays), first.dtype, first.shape[1:])
    stream = cupy.cuda.get_current_stream()
    here, rt, at = out.device.id, cupy.cuda.runtime, 0
    for a in arrays:
        if a.nbytes and a.device.id == here:
            rt.memcpyAsync(out.data.ptr + at, a.data.ptr, a.nbytes,
                           rt.memcpyDeviceToDevice, stream.ptr)
        elif a.nbytes:
            with a.device:
                made = cupy.cuda.Event(disable_timing=True)
                made.record()
            stream.wait_event(made)
            rt.memcpyPeerAsync(out.data.ptr + at, here, a.data.ptr, a.device.id, a.nbytes,
                               stream.ptr)
        at += a.nbytes
    if any(a.device.id != here for a in arrays):
        # a part freed on return goes back to its own device's pool, whose next user there
        # is not ordered after this stream's copy: wait for the copies (a rare path: a run
        # over several devices, which a dask-cuda worker never sees)
        stream.synchronize()
    return out


def check_powers(tp: Any, x: Any, params: tuple) -> None:
    """Raise NumPy's ValueError before a kernel runs where one of the typed predicate ``tp``'s
    integer powers has a negative exponent for the data ``x`` (an array, or a record's
    fields): a kernel cannot raise (it would give 0, as CuPy does). Nothing for most
    predicates; a host sync where an exponent depends on the data, which a CUDA graph capture
    does not allow: such a predicate is refused there, clearly, rather than captured unchecked.
    """
    if not tp.powers:
        return
    import cupy

    stream = cupy.cuda.get_current_stream()
    if tp.data_powers and capturing(stream):
        raise ValueError(
            "this predicate raises the power of an integer to an exponent computed from the "
            "data, which NumPy refuses where it is negative; checking that needs a host "
            "synchronisation, which a CUDA graph capture does not allow. Capture a predicate "
            "without it (a float power, e.g. x ** 2.0, or a constant exponent)."
        )
    tp.check_powers(x, params, cupy)


def capturing(stream: Any) -> bool:
    """Whether ``stream`` is capturing a CUDA graph (the legacy default stream never is)."""
    return stream.ptr not in (0, 1) and stream.is_capturing()


# What calls captured into CUDA graphs use (tile state, copies of inputs): never freed, since
# a graph may be replayed at any time; O(n/1024) bytes per captured call on contiguous input.
kept_for_graphs: list[Any] = []


@contextlib.contextmanager
def beside_the_pool() -> Any:
    """Work on the current stream ordered after, and then before, the legacy default stream:
    for arrays that dask's threaded scheduler made in its pool threads (their default streams,
    which every blocking stream and the legacy one order themselves with) and that this thread
    uses on a non-blocking stream of its own. Before: this stream waits for an event recorded
    on the legacy stream, which follows every blocking stream's work so far (a chunk read on
    this stream before the pool's copy into it ended: an argsort of wrong data from 8 threads
    of own streams on one H100, 2026-12-07). After: the legacy stream waits for this stream's
    work, so that memory the pool allocated, freed here once the work is queued, is reused by
    a pool thread only after the work has read it. No host sync; nothing on the legacy stream
    itself (already ordered) or while this stream captures a graph (the legacy stream cannot
    be used then)."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    if stream.ptr == 0 or capturing(stream):
        yield
        return
    legacy = cupy.cuda.Stream.null
    made = cupy.cuda.Event(disable_timing=True)
    made.record(legacy)
    stream.wait_event(made)
    try:
        yield
    finally:
        done = cupy.cuda.Event(disable_timing=True)
        done.record(stream)
        legacy.wait_event(done)
