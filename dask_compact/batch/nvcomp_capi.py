"""Batches of zstd frames decoded and encoded on the device through nvCOMP's C API
(``libnvcomp``, from the ``nvidia-libnvcomp-cu13`` wheel of the ``gpu`` extra), called by
ctypes.

Why not nvCOMP's Python ``Codec``: its ``decode`` and ``encode`` hold the GIL until the batch
is done (a frame of 128 MiB takes ~170 ms to decode however many are decoded beside it), so
every other thread of the job stood still meanwhile. Measured on one H200 host (16 cores, 48
frames of 128 MiB): a ticking thread saw a 72 ms gap during ``Codec.decode``, 1.3 ms during
the same batch through this module; 64 threads each queueing one frame to a decoder thread
calling ``Codec.decode`` took 0.94 s in 5 calls (the threads could not even queue their
frames while a call ran), 0.35 s in 2-3 calls through this module. A ctypes call releases
the GIL, the work is asynchronous on the stream, and the wait is CuPy's (which releases it
too). The C API also reports a status per frame and works in buffers the caller allocated, so
a task's chunk is decoded into memory of the task's own stream.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import numpy as np

SUCCESS = 0
# nvcompStatus_t values (nvcomp/shared_types.h), for the error messages
STATUS = {10: "invalid value", 11: "not supported", 12: "cannot decompress",
          13: "bad checksum", 15: "output buffer too small", 17: "misaligned buffer",
          18: "chunk too large", 19: "cannot compress", 20: "wrong input length",
          1000: "CUDA error", 10000: "internal error"}


class _Opts(ctypes.Structure):
    """``nvcompBatchedZstdDecompressOpts_t`` (a backend, 0: nvCOMP chooses, then 60 bytes
    that must be zero) and ``nvcompBatchedZstdCompressOpts_t`` (64 bytes that must be zero):
    both all zeros for the defaults."""

    _fields_ = [("backend", ctypes.c_int), ("reserved", ctypes.c_char * 60)]


@functools.cache
def _lib() -> Any:
    from nvidia import libnvcomp

    lib = libnvcomp.load_library()
    if lib is None:
        raise OSError("libnvcomp.so.6 could not be loaded")
    size_t, ptr, status = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
    for name, args in {
        "nvcompBatchedZstdDecompressGetTempSize":
            [size_t, size_t, _Opts, ctypes.POINTER(size_t), size_t, ptr],
        "nvcompBatchedZstdDecompressAsync":
            [ptr, ptr, ptr, ptr, size_t, ptr, size_t, ptr, _Opts, ptr, ptr],
        "nvcompBatchedZstdCompressGetTempSize":
            [size_t, size_t, _Opts, ctypes.POINTER(size_t), size_t, ptr],
        "nvcompBatchedZstdCompressGetMaxOutputChunkSize":
            [size_t, _Opts, ctypes.POINTER(size_t)],
        "nvcompBatchedZstdCompressAsync":
            [ptr, ptr, size_t, size_t, ptr, size_t, ptr, ptr, _Opts, ptr, ptr],
    }.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, status
    return lib


def _check(status: int, what: str) -> None:
    if status != SUCCESS:
        raise RuntimeError(f"nvCOMP {what}: {STATUS.get(status, 'status')} ({status})")


def _table(stream: Any, *columns: list[int]) -> tuple[Any, list[int]]:
    """The columns (pointers or sizes, one per frame) as one uint64 device array, uploaded
    on ``stream``; and each column's device address."""
    import cupy

    with stream:
        dev = cupy.asarray(np.array([v for c in columns for v in c], dtype=np.uint64))
    n = len(columns[0])
    return dev, [dev.data.ptr + 8 * n * k for k in range(len(columns))]


def decode_into(in_ptrs: list[int], in_sizes: list[int], out_ptrs: list[int],
                out_sizes: list[int], stream: Any) -> list[str]:
    """Decode the zstd frames at device addresses ``in_ptrs`` (``in_sizes`` bytes each,
    complete) into ``out_ptrs`` (room for exactly the ``out_sizes`` bytes each frame decodes
    to; 8-byte aligned) on ``stream`` and wait for it. Returns one message per frame: "" where
    it decoded to exactly its output's size, else what went wrong.

    Addresses rather than arrays: a task's frames and outputs are places in one buffer each
    (:func:`.gpu_zstd.decode_host`), and a CuPy view per frame cost a few microseconds of
    held GIL each, thousands of times per job where chunks are small."""
    import cupy

    n = len(in_ptrs)
    if n == 0:
        return []
    lib = _lib()
    opts = _Opts(0)
    temp_bytes = ctypes.c_size_t(0)
    _check(lib.nvcompBatchedZstdDecompressGetTempSize(
        n, max(out_sizes), opts, ctypes.byref(temp_bytes), sum(out_sizes), stream.ptr),
        "temporary size")
    table, (ins, in_bytes, out_bytes, outs) = _table(
        stream, in_ptrs, in_sizes, out_sizes, out_ptrs)
    with stream:
        actual = cupy.zeros(n, np.uint64)
        statuses = cupy.full(n, -1, np.int32)
        temp = cupy.empty(max(1, temp_bytes.value), np.uint8)
    _check(lib.nvcompBatchedZstdDecompressAsync(
        ins, in_bytes, out_bytes, actual.data.ptr, n, temp.data.ptr, temp_bytes.value,
        outs, opts, statuses.data.ptr, stream.ptr), "decode")
    stream.synchronize()
    got, done = statuses.get(stream=stream), actual.get(stream=stream)
    del table
    return [_message(int(s), int(d), want) for s, d, want in zip(got, done, out_sizes)]


def _message(status: int, decoded: int, want: int) -> str:
    if status != SUCCESS:
        return f"nvCOMP could not decode it: {STATUS.get(status, 'status')} ({status})"
    if decoded != want:
        return f"it decoded to {decoded} bytes, not {want}"
    return ""


def encode(datas: list[Any], stream: Any) -> list[Any]:
    """Each of ``datas`` (contiguous uint8 CuPy arrays, complete; each allocation 8-byte
    aligned) as one zstd frame whose header declares its content size: uint8 CuPy arrays
    allocated on ``stream``, complete when this returns (it waits for the stream). Raises
    where nvCOMP reports a frame it could not encode."""
    import cupy

    n = len(datas)
    if n == 0:
        return []
    lib = _lib()
    opts = _Opts(0)
    sizes = [int(d.nbytes) for d in datas]
    cap, temp_bytes = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _check(lib.nvcompBatchedZstdCompressGetMaxOutputChunkSize(
        max(sizes), opts, ctypes.byref(cap)), "output size")
    _check(lib.nvcompBatchedZstdCompressGetTempSize(
        n, max(sizes), opts, ctypes.byref(temp_bytes), sum(sizes), stream.ptr),
        "temporary size")
    with stream:
        outs = [cupy.empty(cap.value, np.uint8) for _ in datas]
        out_sizes = cupy.zeros(n, np.uint64)
        statuses = cupy.full(n, -1, np.int32)
        temp = cupy.empty(max(1, temp_bytes.value), np.uint8)
    table, (ins, in_bytes, out_ptrs) = _table(
        stream, [d.data.ptr for d in datas], sizes, [o.data.ptr for o in outs])
    _check(lib.nvcompBatchedZstdCompressAsync(
        ins, in_bytes, max(sizes), n, temp.data.ptr, temp_bytes.value, out_ptrs,
        out_sizes.data.ptr, opts, statuses.data.ptr, stream.ptr), "encode")
    stream.synchronize()
    got, made = statuses.get(stream=stream), out_sizes.get(stream=stream)
    del table
    bad = [k for k, s in enumerate(got) if s != SUCCESS]
    if bad:
        s = int(got[bad[0]])
        raise RuntimeError(f"nvCOMP could not encode {len(bad)} of {n} frames: "
                           f"{STATUS.get(s, 'status')} ({s})")
    return [o[: int(m)] for o, m in zip(outs, made)]
