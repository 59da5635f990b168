"""zstd frames decoded and encoded on the GPU with nvCOMP (``nvidia-nvcomp-cu13``, in the
``gpu`` extra).

Decode: zarr 3.1 can hand out device buffers but decodes on the CPU; nvCOMP decodes a batch of
zstd frames on the device. The chunk files' bytes are read into one pinned host buffer, copied
to the device in one transfer, and decoded as one batch on the current stream. It pays for
frames of up to a few MiB; frames of 128 MiB (zarr's chunk of 2^25 float32) decode far slower
than 16 CPU threads do (see the README).

Encode: an output chunk compacted on the GPU is encoded there as one zstd frame (its header
declares the content size, like numcodecs' frames, so every zstd reader decodes it), and only
the compressed bytes come back to the host. The chunks of all writer threads are encoded in
batches by one thread per device (:class:`_Encoder` says why). Measured on the H100 host: 6.1
GB/s for batches of frames of 128 MiB, where numcodecs on 16 threads reached 2.1-4.5 GB/s,
which then also leaves the CPUs to decode the input.

An nvCOMP codec holds mutable state and must not be shared between threads (nvCOMP's
thread-safety rules), so each decoding thread keeps its own, per device and stream.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import Any

import numpy as np

_local = threading.local()


def unavailable() -> str:
    """Why nvCOMP cannot decode or encode in this process ("" if it can)."""
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not importable ({e})"
    try:
        from nvidia import nvcomp  # noqa: F401 -- only whether it imports
    except ImportError as e:
        return f"nvCOMP is not installed ({e}; pip install nvidia-nvcomp-cu13)"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
    except Exception as e:  # noqa: BLE001 -- no driver
        return f"no CUDA device ({e})"
    return ""


def free_device_memory(all_devices: bool = False) -> list[int]:
    """Free bytes of the current device, or of every visible device."""
    import cupy

    if not all_devices:
        return [int(cupy.cuda.runtime.memGetInfo()[0])]
    out = []
    for d in range(cupy.cuda.runtime.getDeviceCount()):
        with cupy.cuda.Device(d):
            out.append(int(cupy.cuda.runtime.memGetInfo()[0]))
    return out


def _codec() -> Any:
    import cupy
    from nvidia import nvcomp

    dev = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream()
    codecs = getattr(_local, "codecs", None)
    if codecs is None:
        codecs = _local.codecs = {}
    key = (dev, stream.ptr)
    if key not in codecs:
        codecs[key] = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                   device_id=dev, cuda_stream=stream.ptr)
    return codecs[key]


def encode(data: Any) -> np.ndarray:
    """``data`` (a CuPy array on the current device, complete: its stream synchronised) as one
    zstd frame: a uint8 view of this thread's pinned buffer, valid until the thread's next use
    of that buffer. Blocks until the frame is on the host."""
    import cupy

    from .host_buffers import thread_pinned

    flat = cupy.ascontiguousarray(data).reshape(-1).view(np.uint8)
    frame = _encoder(flat.device.id).submit(flat).result()
    host = thread_pinned((frame.size,), np.dtype(np.uint8))
    frame.get(out=host, blocking=True)  # on this thread's current stream
    return host


MAX_BATCH_FRAMES = 64
MAX_BATCH_BYTES = 4 << 30


class _Encoder:
    """One thread per device that encodes the chunks queued by every writer thread, in batches.

    Why not each writer with its own codec on its own stream: on the H100 host that crashed
    the process (SIGSEGV in a thread nvCOMP drives, with or without a lock around the calls),
    as decoding did. One thread on the legacy stream is the way nvCOMP was measured to work,
    and batching is what makes it fast: nvCOMP encodes a lone frame of 128 MiB at 0.84 GB/s
    but a batch of 32 at 6.1 GB/s (frames in parallel). Writers wait on a future: the frames
    they queued while a batch ran make the next batch.
    """

    def __init__(self, dev: int) -> None:
        import queue

        self.dev = dev
        self.queue: queue.SimpleQueue[tuple[Any, Future[Any]]] = queue.SimpleQueue()
        threading.Thread(target=self._run, name=f"dask-compact-nvcomp-encode-{dev}",
                         daemon=True).start()

    def submit(self, flat: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self.queue.put((flat, fut))
        return fut

    def _batch(self) -> list[tuple[Any, Future[Any]]]:
        import queue

        batch = [self.queue.get()]
        size = batch[0][0].nbytes
        while len(batch) < MAX_BATCH_FRAMES and size < MAX_BATCH_BYTES:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            batch.append(item)
            size += item[0].nbytes
        return batch

    def _run(self) -> None:
        import cupy
        from nvidia import nvcomp

        with cupy.cuda.Device(self.dev):
            codec = nvcomp.Codec(algorithm="Zstd", bitstream_kind=nvcomp.BitstreamKind.RAW,
                                 device_id=self.dev, cuda_stream=0)
            while True:
                batch = self._batch()
                try:
                    encoded = codec.encode(nvcomp.as_arrays([flat for flat, _ in batch]))
                    # Copied out of nvCOMP's buffers here, so that nvCOMP's arrays are made
                    # and freed in this thread only.
                    frames = [cupy.asarray(e).view(np.uint8).reshape(-1).copy()
                              for e in encoded]
                    del encoded
                    cupy.cuda.Stream.null.synchronize()
                except BaseException as e:  # noqa: BLE001 -- handed to every waiting writer
                    for _, fut in batch:
                        fut.set_exception(e)
                    continue
                for (_, fut), frame in zip(batch, frames):
                    fut.set_result(frame)


_encoders: dict[int, _Encoder] = {}
_encoders_lock = threading.Lock()


def _encoder(dev: int) -> _Encoder:
    with _encoders_lock:
        if dev not in _encoders:
            _encoders[dev] = _Encoder(dev)
        return _encoders[dev]


def read_pinned(paths: list[str]) -> tuple[Any, list[int], list[int]]:
    """The files' bytes in one pinned host buffer: (buffer, offsets, sizes)."""
    from .host_buffers import pinned

    sizes = [os.path.getsize(p) for p in paths]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
    host = pinned(offsets[-1])
    view = memoryview(host.data)
    for p, o, n in zip(paths, offsets, sizes):
        with open(p, "rb", buffering=0) as f:
            got = f.readinto(view[o : o + n])
        if got != n:
            raise OSError(f"{p}: read {got} of {n} bytes")
    return host, offsets[:-1], sizes


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def frame_content_size(frame: bytes | memoryview) -> int | None:
    """The decompressed size a zstd frame header declares (RFC 8878, 3.1.1.1), or None when
    the header declares none or is not a zstd frame header."""
    b = bytes(frame[:18])
    if len(b) < 5 or b[:4] != ZSTD_MAGIC:
        return None
    fhd = b[4]
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    dict_size = (0, 1, 2, 4)[fhd & 3]
    at = 5 + (0 if single else 1) + dict_size
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or len(b) < at + size:
        return None
    value = int.from_bytes(b[at : at + size], "little")
    return value + 256 if size == 2 else value


def decode_files(paths: list[str], expected: list[int] | None = None) -> list[Any]:
    """Decode zstd frames stored in ``paths`` on the current device; one uint8 CuPy array per
    file, in order. Synchronises the stream before returning (the pinned buffer is then free
    to reuse, and the caller's kernels see finished data)."""
    import cupy
    from nvidia import nvcomp

    host, offsets, sizes = read_pinned(paths)
    if expected is not None:
        # nvCOMP trusts its input: a frame that is not what the chunk must hold can make the
        # device fault (an illegal address, which ends the CUDA context). Check each header
        # on the CPU first. Corruption inside a well-formed frame is not caught here.
        for p, o, n, want in zip(paths, offsets, sizes, expected):
            got = frame_content_size(memoryview(host)[o : o + min(n, 18)])
            if got != want:
                raise ValueError(f"{p} is not a zstd frame of {want} bytes "
                                 f"(its header says {got})")
    stream = cupy.cuda.get_current_stream()
    dev = cupy.empty(host.size, dtype=np.uint8)
    dev.set(host, stream=stream)
    views = [dev[o : o + n] for o, n in zip(offsets, sizes)]
    decoded = _codec().decode(nvcomp.as_arrays(views))
    out = [cupy.asarray(d).view(np.uint8).reshape(-1) for d in decoded]
    stream.synchronize()
    return out
