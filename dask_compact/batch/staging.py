"""Copies between pageable host memory and a GPU through a few pinned pieces per device.

The GPU path of a batch job decodes each chunk into host memory and copies it to a device.
On one GPU each worker thread decodes into its own page-locked buffer
(:func:`.host_buffers.thread_pinned`) and the copy is one asynchronous DMA. On several GPUs
that buffer's registration became the job's bottleneck: ``cudaHostRegister`` maps the memory
into every device's context and the driver registers one range at a time. Measured on 4 H200s
(64 threads, chunks of 128 MiB, ``benchmarks/batch_profile.py``): taking the threads' pinned
buffers cost 60.7 s of the threads' wall time (2.2 s of CPU) in a 4.7 s job, and pinning the
chunks read early 9.7 s more; the same job compacting on the CPU took 4.4 s.

:class:`StagingRing` instead keeps, per device, one registered slab cut into a few pieces:
a copy to the device goes piece by piece, each a CPU copy into a free piece and an
asynchronous DMA out of it (an event says when the piece is free again); a copy back is the
reverse. That is what the driver does for pageable memory, but without the driver's own
staging lock that 16 threads queued on (see :func:`.tasks._to_host`), and with one
registration per device instead of one per thread. It costs one more CPU copy of each chunk,
so one GPU keeps the per-thread buffers (:func:`staged_devices` decides).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np

from .host_buffers import pinned

PIECE_BYTES = 32 * 2**20  # one piece: a CPU copy of ~4 ms, a DMA of ~1 ms
# A process driving several devices: each registration is mapped into every device's context
# (cudaHostRegister memory is portable under unified addressing), so the rings' set-up grows
# with the square of the devices. Measured with 4 H100s (32 GiB batch job, alternating,
# 2026-11-27_4xh100_45fcf25_staging_ring_piece_ab.txt): rings of 32 MiB pieces ready 3.2-3.3 s
# into the command, of 8 MiB pieces 2.0-2.3 s; the command 5.39-5.89 s against 5.92-7.04 s.
# With 2 H200s the same change was neutral (3.14-3.17 against 2.95-3.56 s); one device keeps
# 32 MiB (not measured there).
SHARED_PIECE_BYTES = 8 * 2**20
PIECES = 16  # per device: up to 16 threads per device copy at once, each holding one piece

_lock = threading.Lock()  # guards _making
_making: dict[int, threading.Lock] = {}  # per device: one registration at a time, devices apart
_rings: dict[int, StagingRing] = {}


def staged_devices(ndev: int) -> bool:
    """Whether a job driving ``ndev`` devices from one process copies through the rings."""
    return ndev > 1


def piece_bytes(ndev: int) -> int:
    """The bytes of one ring piece in a process that sees ``ndev`` devices."""
    return SHARED_PIECE_BYTES if ndev > 1 else PIECE_BYTES


class StagingRing:
    """``pieces`` page-locked pieces of ``piece_bytes`` for copies to and from device
    ``device``; any number of threads may copy through it at once."""

    def __init__(self, device: int, pieces: int = PIECES, piece_bytes: int = PIECE_BYTES):
        self.device = device
        self.piece_bytes = piece_bytes
        self._slab = pinned(pieces * piece_bytes)  # one registration for all the pieces
        self._free: deque[int] = deque(range(pieces))
        self._events: list[Any] = [None] * pieces  # the last DMA out of / into each piece
        self._cond = threading.Condition()

    def _take(self) -> int:
        with self._cond:
            while not self._free:
                self._cond.wait()
            k = self._free.popleft()
            event, self._events[k] = self._events[k], None
        if event is not None:
            event.synchronize()  # the piece's last DMA has read it
        return k

    def _give(self, k: int, event: Any) -> None:
        with self._cond:
            self._events[k] = event
            self._free.append(k)
            self._cond.notify()

    def _spans(self, nbytes: int) -> Iterator[tuple[int, int]]:
        """(offset, bytes) of each piece-sized span of ``nbytes``."""
        for off in range(0, nbytes, self.piece_bytes):
            yield off, min(self.piece_bytes, nbytes - off)

    def _piece(self, k: int, n: int) -> np.ndarray:
        return self._slab[k * self.piece_bytes : k * self.piece_bytes + n]

    def to_device(self, dst: Any, src: np.ndarray, stream: Any) -> None:
        """Queue a copy of ``src`` (C-contiguous) into the CuPy array ``dst`` (same bytes) on
        ``stream``; ``src`` may be reused as soon as this returns."""
        import cupy

        rt = cupy.cuda.runtime
        data = _bytes(src, dst.nbytes)
        for off, n in self._spans(data.nbytes):
            k = self._take()
            event = None
            try:
                piece = self._piece(k, n)
                np.copyto(piece, data[off : off + n])
                rt.memcpyAsync(dst.data.ptr + off, piece.ctypes.data, n,
                               rt.memcpyHostToDevice, stream.ptr)  # fmt: skip
                event = cupy.cuda.Event(block=False, disable_timing=True)
                event.record(stream)
            finally:
                # An event that never recorded (an error above) would wait on nothing queued;
                # without one the piece is free at once, since no DMA was queued out of it.
                self._give(k, event)

    def gather_to_device(self, dst_ptr: int, nbytes: int, parts: list[tuple[int, Any]],
                         stream: Any) -> None:
        """Queue copies of ``parts`` (``(offset, host bytes)``: uint8 arrays, in increasing
        and non-overlapping order of offset, each within ``nbytes``) to device address
        ``dst_ptr + offset`` on ``stream``, packed into pieces: one DMA per piece of the
        range ``[0, nbytes)``, the gaps between parts copied as whatever the piece held.
        The parts' memory may be reused as soon as this returns.

        Why: the frames of a task's small chunks had one piece, one DMA and one event each
        (a chunk of 256 KiB, a few tens of microseconds of held GIL per frame on top of its
        copy); packed, a task of 8 MiB takes a piece for all of them."""
        import cupy

        rt = cupy.cuda.runtime
        at = 0  # the first part not yet wholly copied
        for off, n in self._spans(nbytes):
            k = self._take()
            event = None
            try:
                piece = self._piece(k, n)
                at = fill_piece(piece, off, parts, at)
                rt.memcpyAsync(dst_ptr + off, piece.ctypes.data, n,
                               rt.memcpyHostToDevice, stream.ptr)  # fmt: skip
                event = cupy.cuda.Event(block=False, disable_timing=True)
                event.record(stream)
            finally:
                self._give(k, event)

    def to_host(self, out: np.ndarray, src: Any, stream: Any) -> None:
        """Copy the CuPy array ``src`` into ``out`` (C-contiguous, same bytes), waiting for
        the work queued on ``stream`` before it."""
        import cupy

        rt = cupy.cuda.runtime
        data = _bytes(out, src.nbytes)
        for off, n in self._spans(data.nbytes):
            k = self._take()
            try:
                piece = self._piece(k, n)
                rt.memcpyAsync(piece.ctypes.data, src.data.ptr + off, n,
                               rt.memcpyDeviceToHost, stream.ptr)  # fmt: skip
                stream.synchronize()
                np.copyto(data[off : off + n], piece)
            finally:
                self._give(k, None)


def fill_piece(piece: np.ndarray, off: int, parts: list[tuple[int, Any]], at: int) -> int:
    """Copy into ``piece`` (uint8, the bytes ``[off, off + piece.nbytes)`` of a destination)
    what of ``parts`` (``(offset, uint8 array)``, in increasing and non-overlapping order)
    falls there, beginning with ``parts[at]``; returns the index of the first part not
    wholly copied yet (the next piece's ``at``)."""
    end = off + piece.nbytes
    while at < len(parts) and parts[at][0] < end:
        p_off, data = parts[at]
        lo, hi = max(p_off, off), min(p_off + data.nbytes, end)
        if lo < hi:
            piece[lo - off : hi - off] = data[lo - p_off : hi - p_off]
        if p_off + data.nbytes > end:
            break  # its rest goes in the next piece
        at += 1
    return at


def _bytes(a: np.ndarray, nbytes: int) -> np.ndarray:
    """``a``'s bytes (C-contiguous host memory of ``nbytes``, the device array's)."""
    if not a.flags.c_contiguous:
        raise ValueError("a staged copy needs C-contiguous host memory")
    if a.nbytes != nbytes:
        raise ValueError(f"a staged copy of {a.nbytes} host bytes to or from {nbytes}")
    return a.reshape(-1).view(np.uint8)


def ring(device: int) -> StagingRing:
    """Device ``device``'s ring, made (registered) on first use."""
    r = _rings.get(device)
    if r is None:
        with _lock:
            making = _making.setdefault(device, threading.Lock())
        with making:  # a slab of PIECES pieces faulted in and registered: other devices' go on
            r = _rings.get(device)
            if r is None:
                import cupy

                ndev = cupy.cuda.runtime.getDeviceCount()
                r = _rings[device] = StagingRing(device, PIECES, piece_bytes(ndev))
    return r
