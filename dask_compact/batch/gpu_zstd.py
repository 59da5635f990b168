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

Encode: an output chunk compacted on the GPU is encoded there as zstd frames of 16 MiB each
(:func:`frame_bytes`; each header declares its content size, like numcodecs' frames), and only
the compressed bytes come back to the host. The chunks of all writer threads are encoded in
batches by one thread per device (:class:`_Encoder`). Measured on the H100 host: 6.1 GB/s for
batches of frames of 128 MiB, 7.7 GB/s for batches of 8 chunks in frames of 16 MiB, where
numcodecs on 16 threads reached 2.1-4.5 GB/s, which then also leaves the CPUs to decode the
input. A chunk file of several frames (ours, or any zstd writer's) is decoded frame by frame
(:func:`chunk_frames`).

Why one thread per device and direction, each calling nvCOMP on a stream of its own: it is
what batches the tasks' frames, and the decoder's and the encoder's batches then share the
device. (nvCOMP's Python codecs, used until 2026-11-27, of several threads each on its own
non-blocking stream crashed the process on the H100 host, SIGSEGV in a thread nvCOMP drives;
its C API replaced them, see :mod:`.nvcomp_capi`.)
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, NamedTuple

import numpy as np

from .reader import decode_chunk
from .zstd_frames import Frame, content_size, declared_total, split


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


FRAME_BYTES = 16 << 20  # default of dask-compact.batch.gpu-frame-bytes


def frame_bytes() -> int:
    """The most bytes of an output chunk one zstd frame holds when nvCOMP encodes it
    (``dask-compact.batch.gpu-frame-bytes``, default 16 MiB; 0: one frame per chunk).

    Why several frames: nvCOMP encodes the frames of one call side by side, and a call lasts
    at least as long as its largest frame takes alone. Measured on one H100
    (``2026-11-27_h100_nvcomp_encode_call_latency.txt``): one chunk of 128 MiB in 112 ms as one
    frame, 45 ms as 8 frames of 16 MiB; 8 chunks 210 against 140 ms; 33 chunks 703 against
    634 ms. The batch job's encoder gets its chunks a few at a time as the pieces come, so its
    calls were mostly that fixed wait. A chunk of several frames is valid zstd that every zstd
    reader decodes as one (RFC 8878, 3.1); numcodecs reads it since 0.16.4 (earlier releases
    refuse it with "Destination buffer is too small"): set 0 where such readers must read the
    output."""
    from .. import settings

    return int(settings.get("batch.gpu-frame-bytes"))


def frame_cuts(nbytes: int, frame: int) -> list[tuple[int, int]]:
    """The (start, stop) byte ranges of ``nbytes`` cut into frames of at most ``frame`` bytes
    (0: one frame). Every frame starts 8-byte aligned, as nvCOMP's encoder wants its input."""
    if frame <= 0 or nbytes <= frame:
        return [(0, nbytes)]
    frame = max(8, frame - frame % 8)
    return [(lo, min(nbytes, lo + frame)) for lo in range(0, nbytes, frame)]


GIVE_UP_POLL_S = 0.02  # how often a queued request asks whether to leave the queue


def encode(data: Any, give_up: Callable[[], bool] | None = None) -> np.ndarray | None:
    """``data`` (a CuPy array on the current device, complete: its stream synchronised) as zstd
    frames of at most :func:`frame_bytes` each, concatenated: a uint8 view of this thread's
    host buffer, valid until the thread's next use of that buffer. Blocks until the frames are
    on the host (copied through the device's staging ring, see .staging: a job encoding on the
    GPU runs more writers than cores).

    ``give_up``: asked at once and then every :data:`GIVE_UP_POLL_S` while the request waits
    in the device's queue; where it says True and no batch has taken the request yet, the
    request leaves the queue and this returns None: the caller encodes ``data`` elsewhere
    (:mod:`.encoder_choice`: a chunk chosen for the GPU before the device's rate was known)."""
    import cupy

    from .host_buffers import thread_host
    from .staging import ring

    flat = cupy.ascontiguousarray(data).reshape(-1).view(np.uint8)
    parts = [flat[lo:hi] for lo, hi in frame_cuts(flat.nbytes, frame_bytes())]
    fut = _batcher(_Encoder, flat.device.id).submit(parts, flat.nbytes)
    while give_up is not None:
        if not fut.running() and give_up() and fut.cancel():
            return None
        try:
            fut.result(timeout=GIVE_UP_POLL_S)
            break
        except FutureTimeout:
            pass
    frames = fut.result()
    host = thread_host((sum(int(f.size) for f in frames),), np.dtype(np.uint8))
    stream = cupy.cuda.get_current_stream()
    at = 0
    for f in frames:
        ring(flat.device.id).to_host(host[at : at + f.size], f, stream)
        at += f.size
    return host


DECODE_WAIT_S = 0.5  # default of dask-compact.batch.gpu-decode-wait


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
        self.coming = 0  # requests announced (:meth:`announced`) and not submitted yet
        self._coming_lock = threading.Lock()
        self.wait_s = self.batch_wait()
        threading.Thread(target=self._run, name=f"dask-compact-nvcomp-{self.kind}-{dev}",
                         daemon=True).start()

    def batch_wait(self) -> float:
        """Seconds a batch may wait for announced requests (0: none)."""
        return 0.0

    @contextlib.contextmanager
    def announced(self) -> Iterator[list[bool]]:
        """A request the calling thread is preparing (e.g. copying its frames to the device)
        and will :meth:`submit` with the token this yields: until then, or until the block
        ends, a batch being formed may wait for it (up to :attr:`wait_s`)."""
        token = [True]
        with self._coming_lock:
            self.coming += 1
        try:
            yield token
        finally:
            self._arrived(token)

    def _arrived(self, token: list[bool]) -> None:
        with self._coming_lock:
            if token[0]:
                token[0] = False
                self.coming -= 1

    def submit(self, item: Any, nbytes: int, token: list[bool] | None = None) -> Future[Any]:
        fut: Future[Any] = Future()
        self.queue.put((item, nbytes, fut))
        if token is not None:  # after the put: a batch waiting for it then finds it queued
            self._arrived(token)
        return fut

    def _batch(self) -> list[tuple[Any, int, Future[Any]]]:
        """The next batch: requests taken from the queue, each marked running (one its task
        cancelled while it was queued is dropped: see :func:`encode`)."""
        import queue

        first = self.queue.get()
        while not first[2].set_running_or_notify_cancel():
            first = self.queue.get()
        batch = [first]
        size = first[1]
        until = time.monotonic() + self.wait_s
        while len(batch) < self.max_items and size < self.max_bytes:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                left = until - time.monotonic()
                if self.coming <= 0 or left <= 0:
                    break
                try:  # a short timeout: an announced request may end without coming
                    item = self.queue.get(timeout=min(left, 0.002))
                except queue.Empty:
                    continue
            if item[2].set_running_or_notify_cancel():
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
    """Encodes output chunks, a request being one chunk's frames (contiguous uint8 CuPy
    arrays, :func:`frame_cuts`), each as one zstd frame (:func:`.nvcomp_capi.encode`): a
    request's result is its frames, CuPy arrays allocated on the encoder's stream, complete
    (its writer copies them back and drops them on its own stream).

    A batch holds at most 1 GiB of chunks where they are cut into frames: on one H100, 8
    chunks of 128 MiB in frames of 16 MiB encoded at 7.7 GB/s, 16 or 33 at once at 6.9 GB/s,
    and a smaller batch hands its frames to their writers sooner. Chunks of one frame each
    (``gpu-frame-bytes`` 0) go in batches of up to 8 GiB: there the rate grows with the batch
    (8 chunks 5.1 GB/s, 33 chunks 6.3 GB/s)."""

    kind = "encode"
    max_items = 64

    def __init__(self, dev: int) -> None:
        self.max_bytes = (1 << 30) if frame_bytes() else (8 << 30)
        super().__init__(dev)

    def _process(self, items: list[Any]) -> list[Any]:
        from .nvcomp_capi import encode

        frames = encode([f for item in items for f in item], self.stream)
        results, at = [], 0
        for item in items:
            results.append(frames[at : at + len(item)])
            at += len(item)
        return results


class DecodeRequest(NamedTuple):
    """One task's frames for the decoder: device addresses and sizes of each frame's
    compressed bytes (complete on the device) and of the place it decodes into (8-byte
    aligned, of exactly the size its header declares); the task keeps the buffers alive."""

    in_ptrs: list[int]
    in_sizes: list[int]
    out_ptrs: list[int]
    out_sizes: list[int]


class _Decoder(_Batcher):
    """Decodes the zstd frames of chunk tasks (a request: :class:`DecodeRequest`, one task's
    frames) through nvCOMP's C API (:mod:`.nvcomp_capi`, which releases the GIL); a request's
    outputs are complete when its future is done (its result: the request itself)."""

    kind = "decode"
    max_items = 128  # nvCOMP decoded up to ~128 frames side by side at one frame's pace
    max_bytes = 16 << 30  # decoded bytes

    def batch_wait(self) -> float:
        """``dask-compact.batch.gpu-decode-wait`` (seconds, default :data:`DECODE_WAIT_S`): how
        long a batch waits for the requests of tasks still copying their frames to the
        device. A batch of 128 MiB frames lasts ~0.2 s however many it holds, so one batch
        of many is far faster than several of a few, which is what the tasks' copies, ending
        one after another, made: traced on the H100 host, 40 chunks took 3-4 batches, the
        decoder busy 0.8-1.1 s of a 1.5 s job; with the wait, one batch of 0.24 s. Same run,
        three rounds (``2026-11-28_h100_c9de21d_decode_wait_ab.md``): the ``dask-compact``
        script 1.86-2.16 s with 0.5 s against 2.20-2.39 s without."""
        from .. import settings

        return float(settings.get("batch.gpu-decode-wait"))

    def _process(self, items: list[Any]) -> list[Any]:
        from .nvcomp_capi import decode_into

        problems = iter(decode_into(
            [p for r in items for p in r.in_ptrs], [b for r in items for b in r.in_sizes],
            [p for r in items for p in r.out_ptrs], [b for r in items for b in r.out_sizes],
            self.stream))
        results: list[Any] = []
        for r in items:
            bad = [(k, m) for k, m in enumerate(next(problems) for _ in r.in_ptrs) if m]
            results.append(ValueError("; ".join(f"frame {k}: {m}" for k, m in bad)) if bad
                           else r)
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
    from .. import settings

    return int(settings.get("batch.gpu-decode-tasks")) * devices


def chunk_frames(chunk: bytes | memoryview, want: int, name: str) -> list[Frame] | None:
    """How nvCOMP decodes one chunk file (``chunk``, its compressed bytes) into ``want``
    bytes: its frames, each decoded to its own place in the chunk (the common case: one frame
    whose header declares ``want``); or None where the chunk is valid zstd that nvCOMP
    cannot be handed as it is (a frame that declares no size or an empty one, or frames whose
    sizes would put an output off the 8-byte alignment nvCOMP writes to): the CPU decodes
    that one. Raises ValueError naming the chunk where it is not zstd frames whose declared
    sizes add up to ``want``.

    nvCOMP trusts its input: a frame that is not what the chunk must hold can make the device
    fault (an illegal address, which ends the CUDA context), so every header is checked here
    first. Corruption inside a well-formed frame is not caught here."""
    view = memoryview(chunk)
    # Walked even where the first header declares ``want``: a frame may follow it (zarr then
    # refuses the chunk), and nvCOMP handed the whole file would decode the first frame only.
    # ~0.7 ms per 128 MiB chunk of 1000 blocks on the CI machine.
    frames = split(view)
    if not frames:
        got = content_size(view[:18])
        raise ValueError(f"{name} is not a zstd frame of {want} bytes (its header says {got})")
    total = declared_total(frames)
    if total is None:
        return None
    if total != want:
        # worded as the CPU decode's check (reader.decode_chunk) words it
        raise ValueError(f"Zarr chunk {name} decodes to {total} bytes, not the chunk's {want} "
                         "(as its zstd frame headers declare)")
    sizes = [f.content for f in frames]
    if any(s % 8 for s in sizes[:-1] if s is not None) or 0 in sizes:
        return None
    return frames


# Where a task's frames sit in its device buffer of compressed bytes: each at a multiple of
# this (CuPy's own allocations are 256-byte aligned, which is what nvCOMP was handed when each
# frame had its own array). Decoded chunks sit at multiples of OUT_ALIGN, nvCOMP's output
# alignment; frames inside a chunk are 8-byte multiples (chunk_frames).
IN_ALIGN = 256
OUT_ALIGN = 8


def _up(n: int, align: int) -> int:
    return -(-n // align) * align


def decode_host(chunks: list[Any], expected: list[int], names: list[str]) -> tuple[Any, list[int]]:
    """Chunk files in host memory (``chunks``: buffers such as memory-mapped files, each one
    or more zstd frames, :func:`chunk_frames`), each expected to decode to ``expected[k]``
    bytes, decoded on the current device into one new uint8 CuPy array (allocated on the
    current stream), complete: returns it and where each chunk begins in it (in order, each
    a multiple of :data:`OUT_ALIGN`: chunks of such sizes lie end to end).

    The frames are packed into one device buffer, copied through the device's staging ring
    (:mod:`.staging`, one registration per device, rather than a pinned buffer per task: a
    job decoding on the GPU runs many more tasks than cores, :func:`decode_threads`) on the
    current stream, then handed to the device's decoder, batched with other tasks' frames.
    One buffer each way rather than an array per frame or chunk: a job of small chunks
    (256 KiB) spent its time in that per-frame Python, not in nvCOMP. ``names`` (e.g. the
    files' paths) name a chunk in an error."""
    import cupy

    from .staging import ring

    plans = [chunk_frames(c, w, n) for c, w, n in zip(chunks, expected, names)]
    dev = cupy.cuda.runtime.getDevice()
    decoder = _batcher(_Decoder, dev)
    stream = cupy.cuda.get_current_stream()
    starts, at = [], 0
    for want in expected:
        at = _up(at, OUT_ALIGN)
        starts.append(at)
        at += want
    out = cupy.empty(max(1, at), np.uint8)
    parts: list[tuple[int, np.ndarray]] = []  # (place in the compressed buffer, bytes)
    out_ptrs: list[int] = []  # where each frame of parts decodes to, and its size
    out_sizes: list[int] = []
    on_cpu = []  # (start, bytes decoded on the CPU): chunks nvCOMP cannot be handed
    in_at = 0
    for chunk, plan, start, want, name in zip(chunks, plans, starts, expected, names):
        host = np.frombuffer(chunk, np.uint8)
        if plan is None:
            on_cpu.append((start, np.frombuffer(decode_chunk(host, want, name), np.uint8)))
            continue
        o = start
        for f in plan:
            in_at = _up(in_at, IN_ALIGN)
            parts.append((in_at, host[f.offset : f.offset + f.length]))
            size = int(f.content or 0)  # every frame of a plan declares its size
            out_ptrs.append(out.data.ptr + o)
            out_sizes.append(size)
            in_at += f.length
            o += size
    packed = cupy.empty(max(1, in_at), np.uint8) if parts else None
    # the decoder's next batch may wait for these frames (none to wait for: all on the CPU)
    coming = decoder.announced() if parts else contextlib.nullcontext([False])
    with coming as token:
        for start, decoded in on_cpu:
            ring(dev).to_device(out[start : start + decoded.nbytes], decoded, stream)
        if packed is not None:
            ring(dev).gather_to_device(packed.data.ptr, in_at, parts, stream)
        stream.synchronize()  # the decoder works on its own stream
        if packed is None:
            return out, starts
        req = DecodeRequest([packed.data.ptr + off for off, _ in parts],
                            [data.nbytes for _, data in parts], out_ptrs, out_sizes)
        done = decoder.submit(req, sum(expected), token)
    done.result()
    del packed  # the decoder is done with it
    return out, starts
