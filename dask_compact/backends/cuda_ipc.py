"""CUDA IPC between the GPU workers of one host: the sort's exchange without Dask's comm.

Each worker packs, for each group of buckets, its sorted chunks' slices for that group one
after the other into segments of 256 MiB, each its own allocation (:func:`pack`), keeps them
alive under a token and hands out a :class:`Source`, a few kilobytes: the CUDA IPC handle of
each segment's allocation. A merge on another worker of the same host maps those allocations
into its own address space (``cudaIpcOpenMemHandle``, once per exchange) and copies its
pieces straight into the buffer it sorts, one ``cudaMemcpyAsync`` per segment a piece
touches (NVLink, or PCIe peer to peer) (:func:`join`). Only the handles travel through Dask.

Why: measured on 4 H100s (``benchmarks/exchange_probe.py``), 48 arrays of 256 MiB from three
workers into a fourth took 0.115-0.122 s through Dask over UCX (105-112 GB/s) and 33 ms of
copies over IPC (387-391 GB/s); over TCP Dask stages every byte through host memory and a
socket. Why packs of small segments: mapping each sorted chunk (1 GiB) took ~11 ms in the
sort (2 H100s, 2^32 float32 per GPU: 1.47 s of mapping over 2 workers and 4 calls), more
than its copy, and so did one pack of 4-8 GiB per worker and group (9-13 ms for any
allocation of 1 GiB or more in the probe), while an allocation of 256 MiB mapped in 0.01 ms.
A pack costs one more on-device copy of the exchanged bytes.

Lifetime: Dask's own store cannot keep an exported pack alive. Its active memory manager may
drop the exporting worker's replica of a handle while a copy of it lives elsewhere, and a
worker may spill the handle; the pack's memory would then go back to the allocator and be
reused while merges still read it. So the packs live in this module's table until the
client, once every merge has finished, calls :func:`release` with the token.

Nothing here imports CuPy at import time: the table and :func:`ipc_refusal` serve the client
and the CPU tests, and :func:`join` takes NumPy arrays where every source is in this process.
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Source", "pack", "release", "settle", "join", "probe", "ipc_refusal",
           "exported_tokens", "piece_counts"]

_lock = threading.Lock()
# token -> part -> the arrays exported for it (values, and for argsort the global indices)
_kept: dict[str, dict[int, tuple]] = {}
# an allocation mapped from another process: its IPC handle -> [mapped base pointer, the
# exchanges (tokens) using it]
_maps: dict[bytes, list] = {}
# what this process's joins did (the GPU tests read it to see which route ran)
stats: dict[str, float] = {"local_pieces": 0, "mapped_pieces": 0, "mappings": 0,
                           "open_s": 0.0, "copy_s": 0.0, "sync_s": 0.0, "release_s": 0.0}
# the threads releasing finished exchanges (see _release_later)
_freeing: list[threading.Thread] = []


def _me() -> tuple[str, int]:
    return socket.gethostname(), os.getpid()


# Exported arrays are cut into allocations of at most this many bytes, each a cudaMalloc of
# its own (not a block of CuPy's pool, which may lie inside a larger one): mapping another
# process's allocation took 0.01 ms at 256 MiB and 9-13 ms at 1 GiB and 4 GiB on 2 H100s
# (benchmarks/exchange_probe.py), whether the GPUs were busy or idle.
SEGMENT_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Source:
    """Where one exported part's arrays (a pack of sorted slices) can be copied from: array
    ``k`` is cut into segments of ``per_segment[k]`` elements (the last may hold fewer), and
    ``segments[k][s]`` is the IPC handle of segment s's allocation and its byte offset there."""

    token: str
    part: int
    host: str
    pid: int
    segments: tuple[tuple[tuple[bytes, int], ...], ...]
    per_segment: tuple[int, ...]
    dtypes: tuple[str, ...]

    def here(self) -> bool:
        return (self.host, self.pid) == _me()


def _base(ptr: int) -> int:
    """The start of the allocation holding device pointer ``ptr`` (a pool's array lies inside
    a larger ``cudaMalloc``: its handle maps that whole allocation)."""
    cuda = ctypes.CDLL("libcuda.so.1")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                      ctypes.c_uint64(ptr))  # fmt: skip
    if rc:
        raise RuntimeError(f"cuMemGetAddressRange failed with CUDA driver error {rc}")
    return int(base.value)


def _handle(a: Any) -> tuple[bytes, int]:
    if isinstance(a, np.ndarray) or a.nbytes == 0:
        return b"", 0
    import cupy

    ptr = a.data.ptr
    return bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr)), ptr - _base(ptr)


def _keep(token: str, part: int, kinds: list[tuple[list, int, np.dtype]]) -> Source:
    """Keep each kind's segments (uint8 arrays) under ``token`` until :func:`release`."""
    with _lock:
        _kept.setdefault(token, {})[part] = tuple(segs for segs, _, _ in kinds)
    host, pid = _me()
    return Source(token, part, host, pid,
                  tuple(tuple(_handle(g) for g in segs) for segs, _, _ in kinds),
                  tuple(per for _, per, _ in kinds),
                  tuple(dt.str for _, _, dt in kinds))  # fmt: skip


def _raw(nbytes: int, numpy: bool) -> Any:
    """``nbytes`` of their own allocation (device: a ``cudaMalloc``, outside CuPy's pool)."""
    if numpy:
        return np.empty(nbytes, np.uint8)
    import cupy

    try:
        mem = cupy.cuda.Memory(nbytes)
    except (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.memory.OutOfMemoryError):
        # CuPy's pool may hold what is free: give it back and try once more
        cupy.get_default_memory_pool().free_all_blocks()
        mem = cupy.cuda.Memory(nbytes)
    return cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(mem, 0))


def pack(token: str, part: int, arrays: list[list], cuts: list[tuple[int, int]],
         segment_bytes: int | None = None) -> Source:  # fmt: skip
    """Export, as part ``part``, per kind ``arrays[k]`` (contiguous 1-D arrays), the slices
    ``arrays[k][i][lo:hi]`` for each ``(lo, hi) = cuts[i]``, one after the other, in segments
    of at most ``segment_bytes`` (default :data:`SEGMENT_BYTES`): another worker maps a few
    cheap allocations for all of this worker's slices, where mapping each sorted chunk
    (1 GiB) cost ~11 ms."""
    segment_bytes = segment_bytes or SEGMENT_BYTES
    settle()  # the last exchange's segments are freed before this one allocates
    kinds = []
    numpy = isinstance(arrays[0][0], np.ndarray)
    cupy = None if numpy else _cupy()
    for kind in arrays:
        dtype = kind[0].dtype
        item = dtype.itemsize
        per = max(1, segment_bytes // item)
        n = sum(hi - lo for lo, hi in cuts)
        segs = [_raw(min(per, n - i) * item, numpy) for i in range(0, n, per)]
        pos = 0
        for a, (lo, hi) in zip(kind, cuts):
            while lo < hi:
                seg, off = divmod(pos, per)
                k = min(hi - lo, per - off)
                if cupy is None:
                    segs[seg][off * item:(off + k) * item] = a[lo:lo + k].view(np.uint8)
                else:
                    cupy.cuda.runtime.memcpyAsync(
                        segs[seg].data.ptr + off * item, a.data.ptr + lo * item, k * item,
                        cupy.cuda.runtime.memcpyDeviceToDevice,
                        cupy.cuda.get_current_stream().ptr)  # fmt: skip
                pos, lo = pos + k, lo + k
        kinds.append((segs, per, dtype))
    if cupy is not None:
        # Another worker copies from the pack as soon as it has the handle, with nothing to
        # order its copy after this device's: the pack must be written before it is handed out
        cupy.cuda.get_current_stream().synchronize()
    return _keep(token, part, kinds)


def _cupy() -> Any:
    import cupy

    return cupy


def release(token: str) -> int:
    """End exchange ``token`` in this process: unmap the other workers' parts it mapped and
    drop the parts it exported, in a background thread (see :func:`_release_later`); the
    number of parts dropped."""
    with _lock:
        handles = _unmapped(token)
        parts = _kept.pop(token, {})
    n = len(parts)
    if parts or handles:
        _release_later(parts, handles)
    return n


def _release_later(parts: dict, handles: list[int]) -> None:
    """Unmap ``handles`` (mapped base pointers) and free ``parts`` (this function holds the
    only references) in a thread of their own. Each segment is a ``cudaMalloc`` whose
    ``cudaFree`` waits for the whole device, and an unmapping waits for the device's queued
    work: on 4 H100s the release took ~65-80 ms per worker of the sort's call, after its
    result was complete. Whatever maps, allocates for an exchange or reports free memory
    (:func:`_open`, :func:`pack`, :func:`probe`) first waits for these (:func:`settle`): a
    handle is never mapped twice and memory is never counted twice."""
    device = None
    for kinds in parts.values():
        for segs in kinds:
            for g in segs:
                if not isinstance(g, np.ndarray):
                    device = g.device.id
    if handles:
        device = _cupy().cuda.Device().id if device is None else device
    box = [parts]
    del parts

    def run() -> None:
        t0 = time.perf_counter()
        try:
            if device is None:
                box.clear()
            else:
                cupy = _cupy()
                with cupy.cuda.Device(device):
                    for ptr in handles:
                        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
                    box.clear()
        finally:
            with _lock:
                stats["release_s"] += time.perf_counter() - t0

    thread = threading.Thread(target=run, name="dask-compact-ipc-release", daemon=True)
    with _lock:
        _freeing.append(thread)
    thread.start()


def settle() -> None:
    """Wait until every released exchange is unmapped and its memory freed."""
    while True:
        with _lock:
            if not _freeing:
                return
            thread = _freeing.pop()
        thread.join()


def exported_tokens() -> list[str]:
    with _lock:
        return sorted(_kept)


def piece_counts() -> dict[str, float]:
    """What this process's joins did: pieces copied from its own parts and from mapped ones,
    allocations mapped, and the seconds spent mapping, queueing copies and waiting."""
    with _lock:
        return dict(stats)


def _open(handle: bytes, token: str) -> int:
    """The allocation behind ``handle`` mapped into this process for exchange ``token``: once,
    kept until every exchange that mapped it is released (each merge reads every other
    worker's pack; remapping per merge would repeat that for every bucket)."""
    import cupy

    rt = cupy.cuda.runtime
    with _lock:
        m = _maps.get(handle)
        if m is not None:
            m[1].add(token)
            return int(m[0])
    settle()  # a released exchange's unmapping may still be under way
    with _lock:
        m = _maps.get(handle)
        if m is None:
            m = _maps[handle] = [rt.ipcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess),
                                 set()]  # fmt: skip
            stats["mappings"] += 1
        m[1].add(token)
        return int(m[0])


def _unmapped(token: str) -> list[int]:
    """Forget what only exchange ``token`` still uses (under the lock): the mapped pointers
    to unmap."""
    ptrs = []
    for handle in [h for h, m in _maps.items() if token in m[1]]:
        m = _maps[handle]
        m[1].discard(token)
        if not m[1]:
            del _maps[handle]
            ptrs.append(int(m[0]))
    return ptrs


def _local(s: Source, which: int) -> list:
    with _lock:
        kinds = _kept.get(s.token, {}).get(s.part)
    if kinds is None:
        raise RuntimeError(f"part {s.part} of exchange {s.token} was released before its "
                           "merges ran")  # fmt: skip
    return kinds[which]


def _spans(s: Source, which: int, lo: int, hi: int):
    """(segment, first element in it, elements) covering elements ``lo:hi`` of array
    ``which`` of ``s``."""
    per = s.per_segment[which]
    while lo < hi:
        seg, off = divmod(lo, per)
        k = min(hi - lo, per - off)
        yield seg, off, k
        lo += k


def join(sources: list[Source], pieces: list[tuple[int, int, int]], which: int) -> Any:
    """Array ``which`` of the sources, elements ``lo:hi`` of source ``k`` for each ``(k, lo,
    hi)`` of ``pieces``, one after the other in one new array on this worker's device: local
    sources copied in place, the others mapped (until the exchange is released) and copied
    over the interconnect."""
    dtype = np.dtype(sources[0].dtypes[which])
    item = dtype.itemsize
    total = sum(hi - lo for _, lo, hi in pieces)
    if all(s.here() for s in sources):
        segs = [_local(s, which) for s in sources]
        if isinstance(segs[0][0], np.ndarray):  # NumPy: the same-process table, no device
            out = np.empty(total, dtype)
            raw, at = out.view(np.uint8), 0
            for k, lo, hi in pieces:
                for seg, off, n in _spans(sources[k], which, lo, hi):
                    raw[at:at + n * item] = segs[k][seg][off * item:(off + n) * item]
                    at += n * item
            return out
    import cupy

    rt = cupy.cuda.runtime
    out = cupy.empty(total, dtype)
    stream = cupy.cuda.get_current_stream()
    t_open = t_copy = 0.0
    at = 0
    try:
        for k, lo, hi in pieces:
            s = sources[k]
            local = _local(s, which) if s.here() else None
            for seg, off, n in _spans(s, which, lo, hi):
                t0 = time.perf_counter()
                if local is not None:
                    src = local[seg].data.ptr
                else:
                    handle, offset = s.segments[which][seg]
                    src = _open(handle, s.token) + offset
                t1 = time.perf_counter()
                rt.memcpyAsync(out.data.ptr + at, src + off * item, n * item,
                               rt.memcpyDeviceToDevice, stream.ptr)  # fmt: skip
                t_open, t_copy = t_open + t1 - t0, t_copy + time.perf_counter() - t1
                at += n * item
    finally:
        t0 = time.perf_counter()
        try:
            # The merge's sort follows on this stream anyway; the task ends only once the
            # copies are done, so the client's release never unmaps memory being read.
            stream.synchronize()
        finally:
            with _lock:
                stats["open_s"] += t_open
                stats["copy_s"] += t_copy
                stats["sync_s"] += time.perf_counter() - t0
                for k, _, _ in pieces:
                    stats["local_pieces" if sources[k].here() else "mapped_pieces"] += 1
    return out


def probe() -> dict | None:
    """What :func:`ipc_refusal` needs to know of this worker (run on each worker): its host and
    GPU, the GPUs it can reach peer to peer, whether its allocator's memory can be exported,
    and its free device memory (the driver's, plus what CuPy's pool holds unused). None where
    CuPy or a GPU is missing."""
    try:
        import cupy

        rt = cupy.cuda.runtime
        dev = cupy.cuda.Device().id
        bus = rt.deviceGetPCIBusId(dev)
        peers = [rt.deviceGetPCIBusId(d) for d in range(rt.getDeviceCount())
                 if d != dev and rt.deviceCanAccessPeer(dev, d)]  # fmt: skip
    except Exception:  # noqa: BLE001 -- no CuPy, no driver, no device: not a candidate
        return None
    try:
        a = cupy.empty(1 << 20, cupy.uint8)
        rt.ipcGetMemHandle(a.data.ptr)
        exportable, why = True, ""
        del a
    except Exception as e:  # noqa: BLE001 -- e.g. a cudaMallocAsync pool (RMM's async)
        exportable, why = False, f"{type(e).__name__}: {e}"
    settle()  # memory still being freed is not free yet
    free, _ = rt.memGetInfo()
    pool = cupy.get_default_memory_pool()
    if cupy.cuda.get_allocator() == pool.malloc:
        free += pool.free_bytes()
    host, pid = _me()
    return dict(host=host, pid=pid, bus=bus, peers=peers, exportable=exportable, why=why,
                free=int(free))


def ipc_refusal(probes: dict[str, dict | None], need: dict[str, int]) -> str | None:
    """Why the workers in ``probes`` (worker -> :func:`probe`'s answer) cannot exchange over
    CUDA IPC with ``need[w]`` bytes to allocate on worker w, or None where they can: one host,
    every GPU reachable from every other one, exportable memory, room for the merges (the
    exported packs stay on the device until every merge has run, so nothing is spilled).

    >>> p = dict(host="h", bus="0:1", peers=["0:2"], exportable=True, why="", free=100)
    >>> q = dict(p, bus="0:2", peers=["0:1"])
    >>> ipc_refusal({"a": p, "b": q}, {"a": 50, "b": 50}) is None
    True
    >>> ipc_refusal({"a": p, "b": dict(q, host="g")}, {})
    'the workers are on several hosts'
    """
    missing = sorted(w for w, p in probes.items() if p is None)
    if missing:
        return f"no CuPy GPU on worker(s) {', '.join(missing)}"
    answers: dict[str, dict] = {w: p for w, p in probes.items() if p is not None}
    if len({p["host"] for p in answers.values()}) > 1:
        return "the workers are on several hosts"
    for w, p in answers.items():
        if not p["exportable"]:
            return f"worker {w}'s device memory cannot be shared over CUDA IPC ({p['why']})"
        for v, q in answers.items():
            if q["bus"] != p["bus"] and q["bus"] not in p["peers"]:
                return f"worker {w}'s GPU cannot reach worker {v}'s peer to peer"
    for w, n in need.items():
        free = answers[w]["free"] if w in answers else 0
        if n > 0.9 * free:
            return (f"worker {w} would need {n / 2**30:.1f} GiB of device memory for its merges "
                    f"with {free / 2**30:.1f} GiB free")
    return None
