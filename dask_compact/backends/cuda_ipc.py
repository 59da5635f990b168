"""CUDA IPC between the GPU workers of one host: the sort's exchange without Dask's comm.

Each worker packs, for each group of buckets, its sorted chunks' slices for that group into
one new array (:func:`pack`), keeps it alive under a token and hands out a :class:`Source`, a
few hundred bytes: the CUDA IPC handle of the pack's allocation and the pack's offset in it.
A merge on another worker of the same host maps that allocation into its own address space
(``cudaIpcOpenMemHandle``, once per exchange) and copies its pieces straight into the buffer
it sorts, one ``cudaMemcpyAsync`` each (NVLink, or PCIe peer to peer) (:func:`join`). Only
the handles travel through Dask.

Why: measured on 4 H100s (``benchmarks/exchange_probe.py``), 48 arrays of 256 MiB from three
workers into a fourth took 0.115-0.122 s through Dask over UCX (105-112 GB/s) and 33 ms of
copies over IPC (387-391 GB/s); over TCP Dask stages every byte through host memory and a
socket. Why packs: mapping each sorted chunk (1 GiB) took ~11 ms in the sort (2 H100s, 2^32
float32 per GPU: 1.47 s of mapping over 2 workers and 4 calls), more than its copy; a pack
per worker and group is one mapping per pair of workers, for one more on-device copy.

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

__all__ = ["Source", "export", "release", "join", "probe", "ipc_refusal", "exported_tokens",
           "piece_counts"]

_lock = threading.Lock()
# token -> part -> the arrays exported for it (values, and for argsort the global indices)
_kept: dict[str, dict[int, tuple]] = {}
# an allocation mapped from another process: its IPC handle -> [mapped base pointer, the
# exchanges (tokens) using it]
_maps: dict[bytes, list] = {}
# what this process's joins did (the GPU tests read it to see which route ran)
stats: dict[str, float] = {"local_pieces": 0, "mapped_pieces": 0, "mappings": 0,
                           "open_s": 0.0, "copy_s": 0.0, "sync_s": 0.0, "release_s": 0.0}


def _me() -> tuple[str, int]:
    return socket.gethostname(), os.getpid()


@dataclass(frozen=True)
class Source:
    """Where one exported part's arrays (a pack of sorted slices) can be copied from:
    ``handles[k]`` is the IPC handle of array k's allocation and the array's byte offset in
    it."""

    token: str
    part: int
    host: str
    pid: int
    handles: tuple[tuple[bytes, int], ...]
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
    if a.nbytes == 0:
        return b"", 0
    import cupy

    ptr = a.data.ptr
    return bytes(cupy.cuda.runtime.ipcGetMemHandle(ptr)), ptr - _base(ptr)


def export(token: str, part: int, *arrays: Any) -> Source:
    """Keep ``arrays`` (CuPy, or NumPy for this process alone; ``None`` entries are skipped)
    alive under ``token`` until :func:`release`, and say where they can be copied from."""
    kept = tuple(a for a in arrays if a is not None)
    with _lock:
        _kept.setdefault(token, {})[part] = kept
    host, pid = _me()
    handles = tuple(_handle(a) for a in kept) if not isinstance(kept[0], np.ndarray) else \
        tuple((b"", 0) for _ in kept)  # fmt: skip
    return Source(token, part, host, pid, handles, tuple(a.dtype.str for a in kept))


def pack(token: str, part: int, arrays: list[list], cuts: list[tuple[int, int]]) -> Source:
    """Export, as part ``part``, one new array per kind: ``arrays[k][i][lo:hi]`` for each
    ``(lo, hi) = cuts[i]``, one after the other. One allocation per kind, so another worker
    maps one allocation for all of this worker's slices (mapping an allocation cost ~11 ms
    on the H100s, a copy of 1 GiB under 1 ms)."""
    joined = []
    for kind in arrays:
        xp = np if isinstance(kind[0], np.ndarray) else _cupy()
        joined.append(xp.concatenate([a[lo:hi] for a, (lo, hi) in zip(kind, cuts)]))
    if not isinstance(joined[0], np.ndarray):
        # Another worker copies from the pack as soon as it has the handle, with nothing to
        # order its copy after this device's: the pack must be written before it is handed out
        _cupy().cuda.get_current_stream().synchronize()
    return export(token, part, *joined)


def _cupy() -> Any:
    import cupy

    return cupy


def release(token: str) -> int:
    """End exchange ``token`` in this process: drop the parts it exported and unmap the other
    workers' parts it mapped; the number of parts dropped."""
    t0 = time.perf_counter()
    with _lock:
        _unmap(token)
        n = len(_kept.pop(token, {}))
        stats["release_s"] += time.perf_counter() - t0
    return n


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
        if m is None:
            m = _maps[handle] = [rt.ipcOpenMemHandle(handle, rt.cudaIpcMemLazyEnablePeerAccess),
                                 set()]  # fmt: skip
            stats["mappings"] += 1
        m[1].add(token)
        return int(m[0])


def _unmap(token: str) -> None:
    """Unmap what only exchange ``token`` still uses (under the lock)."""
    for handle in [h for h, m in _maps.items() if token in m[1]]:
        m = _maps[handle]
        m[1].discard(token)
        if not m[1]:
            del _maps[handle]
            import cupy

            cupy.cuda.runtime.ipcCloseMemHandle(m[0])


def _local(s: Source, which: int) -> Any:
    with _lock:
        arrays = _kept.get(s.token, {}).get(s.part)
    if arrays is None:
        raise RuntimeError(f"part {s.part} of exchange {s.token} was released before its "
                           "merges ran")  # fmt: skip
    return arrays[which]


def join(sources: list[Source], pieces: list[tuple[int, int, int]], which: int) -> Any:
    """Array ``which`` of the sources, elements ``lo:hi`` of source ``k`` for each ``(k, lo,
    hi)`` of ``pieces``, one after the other in one new array on this worker's device: local
    sources copied in place, the others mapped (until the exchange is released) and copied
    over the interconnect."""
    dtype = np.dtype(sources[0].dtypes[which])
    total = sum(hi - lo for _, lo, hi in pieces)
    if all(s.here() for s in sources):
        first = _local(sources[0], which)
        if isinstance(first, np.ndarray):  # NumPy: the same-process table, no device
            parts = [_local(sources[k], which)[lo:hi] for k, lo, hi in pieces]
            return np.concatenate(parts) if parts else np.empty(0, dtype)
    import cupy

    rt = cupy.cuda.runtime
    out = cupy.empty(total, dtype)
    stream = cupy.cuda.get_current_stream()
    t0 = time.perf_counter()
    ptrs = [_local(s, which).data.ptr if s.here() else
            0 if not s.handles[which][0] else  # an empty array has no allocation
            _open(s.handles[which][0], s.token) + s.handles[which][1]
            for s in sources]  # fmt: skip
    t1 = time.perf_counter()
    at = 0
    try:
        for k, lo, hi in pieces:
            n = (hi - lo) * dtype.itemsize
            if n:
                rt.memcpyAsync(out.data.ptr + at, ptrs[k] + lo * dtype.itemsize, n,
                               rt.memcpyDeviceToDevice, stream.ptr)  # fmt: skip
            at += n
    finally:
        t2 = time.perf_counter()
        try:
            # The merge's sort follows on this stream anyway; the task ends only once the
            # copies are done, so the client's release never unmaps memory being read.
            stream.synchronize()
        finally:
            with _lock:
                stats["open_s"] += t1 - t0
                stats["copy_s"] += t2 - t1
                stats["sync_s"] += time.perf_counter() - t2
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
