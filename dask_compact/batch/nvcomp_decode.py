"""A batch of zstd frames decoded on the device through nvCOMP's C API (``libnvcomp``, from
the ``nvidia-libnvcomp-cu13`` wheel that ``nvidia-nvcomp-cu13`` installs), called by ctypes.

Why not nvCOMP's Python ``Codec.decode``: it holds the GIL until the batch is decoded (a
frame of 128 MiB takes ~170 ms however many are decoded beside it), so every other thread of
the job stood still meanwhile. Measured on one H200 host (64 frames of 128 MiB, 16 cores):
64 threads each queueing one frame to a decoder thread calling ``Codec.decode`` took 0.94 s in
5 calls (the threads could not even queue their frames while a call ran), against 0.17 s for
the 64 frames in one call; in a whole job decoding on the GPU the CPU threads' encoding took
twice its time. A ctypes call releases the GIL, the decode is asynchronous on the stream, and
the wait is CuPy's (which releases it too). The C API also reports a status per frame and
decodes into buffers the caller allocated (at the sizes the frames' headers declare), so a
task's chunk lands in memory of the task's own stream.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

SUCCESS = 0
# nvcompStatus_t values a decode reports (nvcomp/shared_types.h), for the error messages
STATUS = {10: "invalid value", 11: "not supported", 12: "cannot decompress",
          13: "bad checksum", 15: "output buffer too small", 17: "misaligned buffer",
          18: "chunk too large", 20: "wrong input length", 1000: "CUDA error",
          10000: "internal error"}


class _DecompressOpts(ctypes.Structure):
    """``nvcompBatchedZstdDecompressOpts_t``: the backend (0: nvCOMP chooses) and 60 bytes
    that must be zero."""

    _fields_ = [("backend", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


@functools.cache
def _lib() -> Any:
    from nvidia import libnvcomp

    lib = libnvcomp.load_library()
    if lib is None:
        raise OSError("libnvcomp.so.6 could not be loaded")
    size_t, ptr = ctypes.c_size_t, ctypes.c_void_p
    lib.nvcompBatchedZstdDecompressGetTempSize.argtypes = [
        size_t, size_t, _DecompressOpts, ctypes.POINTER(size_t), size_t, ptr]
    lib.nvcompBatchedZstdDecompressGetTempSize.restype = ctypes.c_int
    lib.nvcompBatchedZstdDecompressAsync.argtypes = [
        ptr, ptr, ptr, ptr, size_t, ptr, size_t, ptr, _DecompressOpts, ptr, ptr]
    lib.nvcompBatchedZstdDecompressAsync.restype = ctypes.c_int
    return lib


def _check(status: int, what: str) -> None:
    if status != SUCCESS:
        raise RuntimeError(f"nvCOMP {what}: {STATUS.get(status, 'status')} ({status})")


def decode_into(frames: list[Any], outs: list[Any], stream: Any) -> list[str]:
    """Decode the zstd frames ``frames`` (uint8 CuPy arrays, complete) into ``outs`` (uint8
    CuPy arrays of the sizes the frames decode to; each allocation 8-byte aligned, as CuPy's
    are) on ``stream`` and wait for it. Returns one message per frame: "" where it decoded to
    exactly its output's size, else what went wrong."""
    import cupy

    n = len(frames)
    if n == 0:
        return []
    lib = _lib()
    opts = _DecompressOpts(0)
    sizes = [int(o.nbytes) for o in outs]
    temp_bytes = ctypes.c_size_t(0)
    _check(lib.nvcompBatchedZstdDecompressGetTempSize(
        n, max(sizes), opts, ctypes.byref(temp_bytes), sum(sizes), stream.ptr),
        "temporary size")
    # One table on the device: input pointers, input bytes, output bytes, output pointers.
    table = np.array([f.data.ptr for f in frames] + [f.nbytes for f in frames] + sizes
                     + [o.data.ptr for o in outs], dtype=np.uint64)
    with stream:
        dev_table = cupy.asarray(table)
        actual = cupy.zeros(n, np.uint64)
        statuses = cupy.full(n, -1, np.int32)
        temp = cupy.empty(max(1, temp_bytes.value), np.uint8)
    at = dev_table.data.ptr
    _check(lib.nvcompBatchedZstdDecompressAsync(
        at, at + 8 * n, at + 16 * n, actual.data.ptr, n, temp.data.ptr, temp_bytes.value,
        at + 24 * n, opts, statuses.data.ptr, stream.ptr), "decode")
    stream.synchronize()
    got, done = statuses.get(stream=stream), actual.get(stream=stream)
    return [_message(int(s), int(d), want) for s, d, want in zip(got, done, sizes)]


def _message(status: int, decoded: int, want: int) -> str:
    if status != SUCCESS:
        return f"nvCOMP could not decode it: {STATUS.get(status, 'status')} ({status})"
    if decoded != want:
        return f"it decoded to {decoded} bytes, not {want}"
    return ""
