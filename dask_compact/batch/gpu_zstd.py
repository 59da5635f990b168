"""zstd frames decoded and encoded on the GPU with nvCOMP (its C library,
``nvidia-libnvcomp-cu13``, in the ``gpu`` extra; called through :mod:`.nvcomp_capi`).

Decode: zarr 3.1 can hand out device buffers but decodes on the CPU; nvCOMP decodes a batch of
zstd frames on the device. Each chunk task copies its chunk files' compressed bytes to the
device and queues them to one decoder thread per device (:class:`_Decoder`), which decodes
whatever the tasks have queued as one batch. nvCOMP decodes the frames of a batch side by side,
each at about the same pace: measured on the H100 host, frames of 128 MiB (zarr's chunk of 2^25
float32, uniform random, zstd level 3) took 170 ms alone and 186 ms 48 at a time (0.79 against
34.7 GB/s), frames of 16 MiB 28 ms alone and 53 ms 256 at a time (0.60 against 80.9 GB/s); 16
CPU threads decoded the same at 7.5-9.8 GB/s. So the rate is set by the frames in flight: a job
that decodes on the GPU keeps many chunk tasks waiting on the decoder
(:func:`decode_threads`). One frame at a time per task (until 2026-11-27) decoded 8 GiB in
12.2 s there, against 1.3 s on the CPU.

Encode: an output chunk compacted on the GPU is encoded there as one zstd frame (its header
declares the content size, like numcodecs' frames, so every zstd reader decodes it), and only
the compressed bytes come back to the host. The chunks of all writer threads are encoded in
batches by one thread per device (:class:`_Encoder`). Measured on the H100 host: 6.1 GB/s for
batches of frames of 128 MiB, where numcodecs on 16 threads reached 2.1-4.5 GB/s, which then
also leaves the CPUs to decode the input.

Why one thread per device and direction, each calling nvCOMP on a stream of its own: it is
what batches the tasks' frames, and the decoder's and the encoder's batches then share the
device. (nvCOMP's Python codecs, used until 2026-11-27, of several threads each on its own
non-blocking stream crashed the process on the H100 host, SIGSEGV in a thread nvCOMP drives;
its C API replaced them, see :mod:`.nvcomp_capi`.)
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import numpy as np


def unavailable() -> str:
    """Why nvCOMP cannot decode or encode in this process ("" if it can)."""
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not importable ({e})"
    try:
        from .nvcomp_capi import _lib

        _lib()
    except (ImportError, OSError, AttributeError) as e:
        return f"nvCOMP is not installed ({e}; pip install nvidia-libnvcomp-cu13)"
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


def encode(data: Any) -> np.ndarray:
    """``data`` (a CuPy array on the current device, complete: its stream synchronised) as one
    zstd frame: a uint8 view of this thread's host buffer, valid until the thread's next use
    of that buffer. Blocks until the frame is on the host (copied through the device's
    staging ring, see .staging: a job encoding on the GPU runs more writers than cores)."""
    import cupy

    from .host_buffers import thread_host
    from .staging import ring

    flat = cupy.ascontiguousarray(data).reshape(-1).view(np.uint8)
    frame = _batcher(_Encoder, flat.device.id).submit(flat, flat.nbytes).result()
    host = thread_host((frame.size,), np.dtype(np.uint8))
    ring(flat.device.id).to_host(host, frame, cupy.cuda.get_current_stream())
    return host


class _Batcher:
    """One thread per device that runs the requests queued by every task thread in batches
    through nvCOMP's C API on a stream of its own (see the module's docstring). A request
    waits on a future: the requests queued while a batch runs make the next batch."""

    kind = ""
    max_items = 0  # requests in one batch
    max_bytes = 0  # and their bytes (the first request always goes)

    def __init__(self, dev: int) -> None:
        import queue

        self.dev = dev
        self.queue: queue.SimpleQueue[tuple[Any, int, Future[Any]]] = queue.SimpleQueue()
        self.batches = self.requests = 0  # run so far (what a batch held, on average)
        threading.Thread(target=self._run, name=f"dask-compact-nvcomp-{self.kind}-{dev}",
                         daemon=True).start()

    def submit(self, item: Any, nbytes: int) -> Future[Any]:
        fut: Future[Any] = Future()
        self.queue.put((item, nbytes, fut))
        return fut

    def _batch(self) -> list[tuple[Any, int, Future[Any]]]:
        import queue

        batch = [self.queue.get()]
        size = batch[0][1]
        while len(batch) < self.max_items and size < self.max_bytes:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            batch.append(item)
            size += item[1]
        return batch

    def _on_device(self) -> Any:
        """Enter this device, and make this thread's own non-blocking stream (``stream``):
        the decoder's and the encoder's batches then run side by side on the device (on the
        legacy default stream they queued behind each other: each batch uses only the SMs
        of its frames)."""
        import cupy

        device = cupy.cuda.Device(self.dev)
        with device:
            self.stream = cupy.cuda.Stream(non_blocking=True)
        return device

    def _run(self) -> None:
        with self._on_device():
            while True:
                batch = self._batch()
                self.batches += 1
                self.requests += len(batch)
                try:
                    results = self._process([item for item, _, _ in batch])
                except BaseException as e:  # noqa: BLE001 -- handed to the waiting tasks
                    if len(batch) == 1:
                        batch[0][2].set_exception(e)
                        continue
                    # Each request alone, so that a bad one fails its own task only (the
                    # task's error then names its chunk).
                    for item, _, fut in batch:
                        try:
                            fut.set_result(self._process([item])[0])
                        except BaseException as one:  # noqa: BLE001 -- as above
                            fut.set_exception(one)
                    continue
                for (_, _, fut), result in zip(batch, results):
                    if isinstance(result, BaseException):  # this request's own failure
                        fut.set_exception(result)
                    else:
                        fut.set_result(result)

    def _process(self, items: list[Any]) -> list[Any]:
        """Each item's result, or the exception that item alone raises."""
        raise NotImplementedError


class _Encoder(_Batcher):
    """Encodes output chunks (one contiguous uint8 CuPy array each) as one zstd frame each
    (:func:`.nvcomp_capi.encode`), a CuPy array allocated on the encoder's stream, complete
    (its writer copies it back and drops it on its own stream).

    nvCOMP encodes the frames of a batch side by side: a lone frame of 128 MiB at 0.84 GB/s,
    a batch of 32 at 6.1 GB/s (H100 host, through nvCOMP's Python codec)."""

    kind = "encode"
    max_items = 64
    max_bytes = 8 << 30

    def _process(self, items: list[Any]) -> list[Any]:
        from .nvcomp_capi import encode

        return encode(items, self.stream)


class _Decoder(_Batcher):
    """Decodes the zstd frames of chunk tasks (a request: one task's frames, uint8 CuPy
    arrays on this device, complete, and the arrays they decode into, allocated by the task
    on its own stream at the sizes the frames declare) through nvCOMP's C API
    (:mod:`.nvcomp_capi`, which releases the GIL); a request's outputs are complete when
    its future is done."""

    kind = "decode"
    max_items = 128  # nvCOMP decoded up to ~128 frames side by side at one frame's pace
    max_bytes = 16 << 30  # decoded bytes

    def _process(self, items: list[Any]) -> list[Any]:
        from .nvcomp_capi import decode_into

        frames = [f for item in items for f in item[0]]
        outs = [o for item in items for o in item[1]]
        problems = iter(decode_into(frames, outs, self.stream))
        results: list[Any] = []
        for item_frames, item_outs in items:
            bad = [(k, m) for k, m in enumerate(next(problems) for _ in item_frames) if m]
            results.append(ValueError("; ".join(f"frame {k}: {m}" for k, m in bad)) if bad
                           else item_outs)
        return results


_batchers: dict[tuple[type, int], _Batcher] = {}
_batchers_lock = threading.Lock()


def _batcher(kind: type[_Batcher], dev: int) -> Any:
    with _batchers_lock:
        if (kind, dev) not in _batchers:
            _batchers[(kind, dev)] = kind(dev)
        return _batchers[(kind, dev)]


def decode_batches() -> tuple[int, int]:
    """(batches, requests) the decoders of this process have run so far, over all devices:
    how many tasks' chunks one nvCOMP call decoded, on average."""
    with _batchers_lock:
        ds = [b for (kind, _), b in _batchers.items() if kind is _Decoder]
    return sum(b.batches for b in ds), sum(b.requests for b in ds)


def decode_threads(devices: int) -> int:
    """Chunk tasks to run beside a job's CPU threads where nvCOMP decodes on ``devices``
    GPUs: they wait on the decoders (see the module's docstring) while the CPU threads
    encode, so the frames in flight, and the decoders' rate, grow with them
    (``dask-compact.batch.gpu-decode-tasks`` per device)."""
    import dask.config

    return max(0, int(dask.config.get("dask-compact.batch.gpu-decode-tasks", 32))) * devices


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


def decode_host(frames: list[Any], expected: list[int], names: list[str]) -> list[Any]:
    """zstd frames in host memory (``frames``: buffers such as memory-mapped chunk files),
    each expected to decode to ``expected[k]`` bytes, decoded on the current device: one new
    uint8 CuPy array per frame (allocated on the current stream), in order, complete.

    The frames go to the device through its staging ring (:mod:`.staging`, one registration
    per device, rather than a pinned buffer per task: a job decoding on the GPU runs many
    more tasks than cores, :func:`decode_threads`) on the current stream, then to the
    device's decoder, batched with other tasks' frames. ``names`` (e.g. the files' paths)
    name a frame in an error."""
    import cupy

    from .staging import ring

    # nvCOMP trusts its input: a frame that is not what the chunk must hold can make the
    # device fault (an illegal address, which ends the CUDA context). Check each header on
    # the CPU first. Corruption inside a well-formed frame is not caught here.
    for frame, want, name in zip(frames, expected, names):
        got = frame_content_size(memoryview(frame)[:18])
        if got != want:
            raise ValueError(f"{name} is not a zstd frame of {want} bytes "
                             f"(its header says {got})")
    dev = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream()
    on_device = []
    for frame in frames:
        host = np.frombuffer(frame, np.uint8)
        d = cupy.empty(host.size, np.uint8)
        ring(dev).to_device(d, host, stream)
        on_device.append(d)
    outs = [cupy.empty(want, np.uint8) for want in expected]
    stream.synchronize()  # the decoder works on its own stream
    return _batcher(_Decoder, dev).submit((on_device, outs), sum(expected)).result()
