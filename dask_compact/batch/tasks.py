"""What the tasks of a streaming job run where they run: read and compact one input chunk
(:func:`read_compact`), slice a piece (:func:`take`), write one output chunk
(:func:`write_chunk`) or several (:func:`write_chunks`). Top-level functions of small
picklable arguments, so that the same code runs in a thread pool and on distributed
workers."""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import early_read, staging
from .executor import spare_threads
from .host_buffers import piece_alloc, pin_in_place, thread_host, thread_pinned
from .manifest import checksum, file_sum
from .reader import Reader, ZarrChunkFiles
from .shared import not_seen, open_chunk_file


class ChunkError(RuntimeError):
    """A task failed on one input chunk; the message names it (and keeps the cause's text)."""


@dataclass
class Piece:
    """One input chunk's selected values and/or global indices: NumPy arrays in host memory,
    or CuPy arrays on the device that compacted them (a job that encodes on the GPU)."""

    values: np.ndarray | None
    indices: np.ndarray | None
    count: int
    read_s: float = 0.0
    compact_s: float = 0.0
    device: str = "cpu"
    decode: str = "cpu"

    @property
    def nbytes(self) -> int:
        """The memory it holds: a selection may be a view of a larger buffer (at most 4x, see
        the CPU backend's ``_trim``), which it keeps whole."""
        return sum(_held(a) for a in (self.values, self.indices) if a is not None)

    def part(self, name: str) -> Any:
        """The output array ``name`` ("values" or "indices") of this piece."""
        return self.values if name == "values" else self.indices

    def slice(self, lo: int, hi: int) -> Piece:
        """Elements ``lo:hi`` (copies: the slice travels to another worker)."""
        return Piece(
            None if self.values is None else self.values[lo:hi].copy(),
            None if self.indices is None else self.indices[lo:hi].copy(),
            hi - lo,
        )


def _held(a: Any) -> int:
    root = a
    while isinstance(root.base, type(a)):  # NumPy or CuPy: a view keeps its base whole
        root = root.base
    return int(root.nbytes)


@dataclass(frozen=True)
class PieceInfo:
    """What the client learns of a piece: its count, bytes and timings (never its data)."""

    count: int
    nbytes: int
    read_s: float
    compact_s: float
    device: str  # "cpu", "gpu", or "skipped" (a resumed job's chunk already on disk)
    decode: str = "cpu"


@functools.lru_cache(maxsize=32)
def _predicate(where: str) -> Any:
    from ..predicate import as_predicate

    return as_predicate(where)


def read_compact(
    reader: Reader, i: int, r0: int, r1: int, base: int, where: str, mode: str, device: str,
    decode: str = "cpu", encode: str = "cpu",
) -> Piece:
    """Read rows ``r0:r1`` (input chunk ``i``, first flat index ``base``) and compact them.

    ``device="gpu"``: the chunk is compacted on the current CUDA device (a dask-cuda worker's
    own) and the selection copied back (the output is written from host memory); ``"gpu-all"``:
    the same on device ``i % n`` of the n visible devices (one process driving every GPU of
    the host: the threaded scheduler). ``decode="gpu"``: the chunk's compressed bytes go to the
    device and nvCOMP decodes them there (the reader's ``read_device``). ``encode="gpu"``: the
    selection stays on the device, where :func:`write_chunk` encodes it.
    """
    where_from = f"input chunk {i} (rows {r0}:{r1})"
    pred = _predicate(where)
    if not device.startswith("gpu"):
        t0 = time.perf_counter()
        early = early_read.take(reader, r0, r1)
        if early is not None:  # read while the command started (see .early_read)
            block, t0 = early[0], t0 - early[1]
        elif isinstance(reader, ZarrChunkFiles):
            # Decoded into this thread's reused buffer (see .host_buffers); the compaction
            # writes its selection into new arrays, so nothing keeps a view of the buffer.
            block = thread_host((r1 - r0,) + reader.shape[1:], reader.dtype)
            _read_into(reader, r0, r1, block, where_from)
        else:
            block = _read(reader, r0, r1, where_from)
        t1 = time.perf_counter()
        values, indices = _compact(block, pred, mode, base, where_from, piece_alloc)
        return _piece(values, indices, t1 - t0, time.perf_counter() - t1, "cpu", "cpu")

    import cupy

    dev, ring = device_and_ring(i, device, decode)
    with cupy.cuda.Device(dev), _thread_stream(dev):
        t0 = time.perf_counter()
        keep: Any = None  # host memory the copy to the device reads until the count is back
        early = early_read.take(reader, r0, r1) if decode == "gpu" else None
        decoded_by = "gpu" if decode == "gpu" and early is None else "cpu"
        if decoded_by == "gpu":
            # nvCOMP decodes it on the device, in a batch with other tasks' chunks (.gpu_zstd)
            try:
                block = reader.read_device(r0, r1)  # type: ignore[union-attr]
            except Exception as e:
                raise ChunkError(f"cannot read {where_from}: {type(e).__name__}: {e}") from e
        elif isinstance(reader, ZarrChunkFiles) and ring is not None:
            # Several GPUs driven from this process (or a chunk read early where nvCOMP
            # decodes the others): decoded into this thread's pageable buffer and copied
            # through the device's pinned pieces (see .staging). A chunk read early
            # (.early_read) is copied from where it lies.
            if early is None and decode != "gpu":
                early = early_read.take(reader, r0, r1)
            if early is not None:
                t0 -= early[1]
                host = np.ascontiguousarray(early[0])  # the ring copies contiguous bytes
                del early
            else:
                host = thread_host((r1 - r0,) + reader.shape[1:], reader.dtype)
                _read_into(reader, r0, r1, host, where_from)
            block = cupy.empty(host.shape, reader.dtype)
            ring.to_device(block, host, cupy.cuda.get_current_stream())
            del host  # the ring's pieces hold what the copy still reads
        elif isinstance(reader, ZarrChunkFiles):
            # Decoded straight into this thread's pinned buffer, then one asynchronous copy:
            # twice the bandwidth of a copy from pageable memory, and no staging copy. A
            # chunk read early (.early_read) is page-locked where it lies instead, or, where
            # that is refused, copied into the thread's buffer.
            shape = (r1 - r0,) + reader.shape[1:]
            early = early_read.take(reader, r0, r1)
            host = None
            if early is not None:
                t0 -= early[1]
                host = pin_in_place(early[0])
                if host is None:
                    host = thread_pinned(shape, reader.dtype)
                    np.copyto(host, early[0])
                del early
            else:
                host = thread_pinned(shape, reader.dtype)
                _read_into(reader, r0, r1, host, where_from)
            block = cupy.empty(shape, reader.dtype)
            block.set(host, stream=cupy.cuda.get_current_stream())
            # Dropped once the compaction has read its count back (which waits for the copy):
            # a chunk registered for this task alone is then unregistered and freed.
            keep = host
            del host
        else:
            block = cupy.asarray(_read(reader, r0, r1, where_from))
        t1 = time.perf_counter()
        values, indices = _compact(block, pred, mode, base, where_from)
        del block
        del keep  # the copy to the device has ended (see above)
        if encode == "gpu":
            # Another thread's stream encodes it: the selection must be complete first.
            cupy.cuda.get_current_stream().synchronize()
        else:
            values, indices = _to_host(values, ring), _to_host(indices, ring)
    return _piece(values, indices, t1 - t0, time.perf_counter() - t1, "gpu", decoded_by)


def device_and_ring(i: int, device: str, decode: str = "cpu"
                    ) -> tuple[int, staging.StagingRing | None]:
    """The device that compacts input chunk ``i`` (``device`` "gpu": this worker's; "gpu-all":
    ``i % n`` of the n this process sees), and the ring its copies go through where this
    process drives several devices or nvCOMP decodes (``decode="gpu"``: many more tasks than
    cores then copy, see .gpu_zstd.decode_threads), else None: the thread's pinned buffers,
    see .staging."""
    import cupy

    ndev = cupy.cuda.runtime.getDeviceCount()
    dev = i % ndev if device == "gpu-all" else cupy.cuda.runtime.getDevice()
    # A cluster worker drives one device whatever it sees; this process drives all it sees
    staged = (device == "gpu-all" and staging.staged_devices(ndev)) or decode == "gpu"
    return dev, staging.ring(dev) if staged else None


def _to_host(a: Any, ring: staging.StagingRing | None = None) -> np.ndarray | None:
    """A device array copied to a new host array through this thread's pinned buffer, or
    through the device's ``ring`` where the job copies that way (see .staging).

    ``a.get()`` copies into pageable memory, which CUDA stages through its own pinned buffers
    with the CPU copying out of them; 16 threads doing that at once queue on the driver. A copy
    into pinned memory is a plain DMA on the thread's stream. The pinned buffer is free here:
    the chunk's copy to the device ended before the compaction's count came back."""
    if a is None:
        return None
    if ring is not None:
        out = piece_alloc(a.size, a.dtype).reshape(a.shape)
        ring.to_host(out, a, _cupy_stream())
        return out
    staging = thread_pinned((a.nbytes,), np.dtype(np.uint8))[: a.nbytes].view(a.dtype)
    staging = staging.reshape(a.shape)
    a.get(out=staging, blocking=True)  # on the current (the thread's) stream
    out = piece_alloc(a.size, a.dtype).reshape(a.shape)
    np.copyto(out, staging)
    return out


def _cupy_stream() -> Any:
    import cupy

    return cupy.cuda.get_current_stream()


_streams = threading.local()


def _thread_stream(dev: int) -> Any:
    """This thread's own non-blocking stream on device ``dev``: the copies and kernels of
    chunks handled by different threads overlap instead of queueing on the legacy default
    stream, and a stream (and the nvCOMP codec keyed by it) is made once per thread."""
    import cupy

    per_dev = getattr(_streams, "by_device", None)
    if per_dev is None:
        per_dev = _streams.by_device = {}
    if dev not in per_dev:
        with cupy.cuda.Device(dev):  # a stream belongs to the device current at its creation
            per_dev[dev] = cupy.cuda.Stream(non_blocking=True)
    return per_dev[dev]


def _read_into(reader: Any, r0: int, r1: int, out: np.ndarray, where_from: str) -> None:
    try:
        reader.read(r0, r1, out=out)
    except Exception as e:  # a corrupted or missing chunk: say which one
        raise ChunkError(f"cannot read {where_from}: {type(e).__name__}: {e}") from e


def _read(reader: Reader, r0: int, r1: int, where_from: str) -> np.ndarray:
    from ..validate import native

    try:
        block = reader.read(r0, r1)
    except Exception as e:  # a corrupted or missing chunk: say which one
        raise ChunkError(f"cannot read {where_from}: {type(e).__name__}: {e}") from e
    return block if block.dtype.isnative else block.astype(native(block.dtype))


def _compact(block: Any, pred: Any, mode: str, base: int, where_from: str,
             alloc: Any = None) -> tuple[Any, Any]:
    """``alloc``: where a NumPy block's selection buffers come from (see .host_buffers)."""
    from ..dispatch import compact_chunk

    try:
        if alloc is not None and isinstance(block, np.ndarray):
            from ..backends.numpy_backend import compact

            return _split(compact(block, pred, mode, True, "auto", base, alloc), mode)
        return _split(compact_chunk(block, pred, mode, True, "auto", base), mode)
    except Exception as e:
        raise ChunkError(f"cannot compact {where_from}: {type(e).__name__}: {e}") from e


def _piece(values: Any, indices: Any, read_s: float, compact_s: float, device: str,
           decode: str) -> Piece:
    count = len(values) if values is not None else len(indices)
    return Piece(values, indices, int(count), read_s, compact_s, device, decode)


def _split(out: Any, mode: str) -> tuple[Any, Any]:
    if mode == "both":
        return out
    return (out, None) if mode == "values" else (None, out)


def info(piece: Piece) -> PieceInfo:
    return PieceInfo(piece.count, piece.nbytes, piece.read_s, piece.compact_s, piece.device,
                     piece.decode)


def take(piece: Any, lo: int, hi: int) -> Any:
    """Elements ``lo:hi`` of a piece (a :class:`Piece` or a record's piece), copied."""
    return piece.slice(lo, hi)


class OutputArrays:
    """The output group's arrays, opened once per process by the tasks that write them.

    ``direct``: the arrays are local Zarr v3 arrays with zarr's default codecs (bytes, then
    zstd level 0 without checksum) and chunk keys ``c/<j>``, as :func:`.job.create_group`
    makes them; a chunk is then encoded by numcodecs and written as its file here, the bytes
    zarr itself would write, without zarr's per-call machinery.
    ``share``: a chunk compacted on a GPU goes to its device's encoder or to the writer's own
    thread, whichever :mod:`.encoder_choice` expects to be done sooner (``--encode auto``);
    otherwise every such chunk goes to the GPU's encoder.
    """

    def __init__(self, store: str, names: tuple[str, ...], out_chunk: int,
                 direct: bool = False, share: bool = False) -> None:
        self.store = store
        self.names = names
        self.out_chunk = out_chunk
        self.direct = direct
        self.share = share

    def array(self, name: str) -> Any:
        return _open_out(self.store, name)


@functools.lru_cache(maxsize=16)
def _open_out(store: str, name: str) -> Any:
    import zarr

    return zarr.open_array(store=store, path=name, mode="r+")


def write_chunk(dest: OutputArrays, j: int, los: list[int], his: list[int], *pieces: Piece
                ) -> tuple[float, int, dict[str, list[int]]]:
    """Write output chunk ``j`` from parts ``los[k]:his[k]`` of ``pieces[k]``; its seconds, how
    many of its arrays' chunks were encoded on a GPU, and each file it left, by its path in
    the group: ``[size, CRC-32C]`` (the resume manifest's record, see :mod:`.manifest`; for a
    local group only).

    Every output chunk has exactly one writer, so no two tasks ever write one Zarr chunk. The
    arrays may have trailing axes (a record's fields): a chunk is then ``out_chunk`` rows.
    """
    t0 = time.perf_counter()
    start = j * dest.out_chunk
    on_gpu = 0
    files: dict[str, list[int]] = {}
    for name in dest.names:
        parts = [p.part(name)[lo:hi] for p, lo, hi in zip(pieces, los, his)]
        if any(_on_device(q) for q in parts):
            on_one = _gather_device(parts)
            if on_one and dest.direct:
                key, files[f"{name}/{key}"], gpu = write_chunk_file_gpu(
                    os.path.join(dest.store, name), j, on_one, dest.out_chunk, dest.share)
                on_gpu += gpu
                continue
            parts = [q if isinstance(q, np.ndarray) else q.get() for q in parts]
        if len(parts) == 1:
            data = parts[0]
        else:  # put together in this thread's scratch buffer (see .host_buffers)
            total = sum(len(q) for q in parts)
            shape = (total, *parts[0].shape[1:])
            data = np.concatenate(parts, out=thread_host(shape, parts[0].dtype))
        if dest.direct:
            key, files[f"{name}/{key}"] = write_chunk_file(
                os.path.join(dest.store, name), j, data, dest.out_chunk)
        else:
            _check_sees(dest.store, name)
            z = dest.array(name)
            z[start : start + len(data)] = data
            if "://" not in dest.store:  # what zarr wrote, read back (small, just written)
                key = z.metadata.encode_chunk_key((j, *[0] * (z.ndim - 1)))
                files[f"{name}/{key}"] = file_sum(os.path.join(dest.store, name, key))
    return time.perf_counter() - t0, on_gpu, files


def write_chunks(dest: OutputArrays, plan: list[tuple[int, list[int], list[int], list[int]]],
                 *pieces: Piece) -> list[tuple[float, int, dict[str, list[int]]]]:
    """Several output chunks in one task: for each ``(j, which, los, his)`` of ``plan``,
    :func:`write_chunk` of chunk ``j`` from parts ``los[k]:his[k]`` of ``pieces[which[k]]``;
    their results in that order. Small output chunks share a task (a task's cost to the
    scheduler is the same whatever it writes; see .plan.writes_per_task)."""
    return [write_chunk(dest, j, los, his, *[pieces[w] for w in which])
            for j, which, los, his in plan]


def write_chunk_file(array_dir: str, j: int, data: np.ndarray, chunk: int
                     ) -> tuple[str, list[int]]:
    """Chunk ``j`` of a Zarr v3 array with the default codecs, chunked along axis 0 only, as
    zarr writes it: padded to the chunk's rows with the fill value 0, zstd level 0 without
    checksum, at ``c/<j>`` (``c/<j>/0/...`` with trailing axes). Returns its key and
    ``[size, CRC-32C]`` of the bytes written (in memory: ~10% of the encode's time where
    nothing compresses, see :func:`.manifest.checksum`)."""
    if len(data) < chunk:
        # may be data's own buffer: then a no-op copy
        full = thread_host((chunk, *data.shape[1:]), data.dtype)
        full[: len(data)] = data
        full[len(data) :] = 0
        data = full
    encoded = zstd_encode(np.ascontiguousarray(data), spare_threads())
    key = "/".join(["c", str(j), *["0"] * (data.ndim - 1)])
    # never makes the array's folders: a worker that does not see them fails, named (.shared)
    with open_chunk_file(array_dir, key) as f:
        f.write(encoded)
    return key, [len(encoded), checksum(encoded)]


def _check_sees(store: str, name: str) -> None:
    """Before zarr writes a chunk of the local array ``name`` (zarr makes the folders it
    writes into): fail, naming this worker, where it does not see the array's folder."""
    if "://" not in store and not os.path.isdir(os.path.join(store, name)):
        raise not_seen(os.path.join(store, name))


MAX_ENCODE_THREADS = 4  # zstd's multi-threaded encoder gained nothing beyond 4 on 128 MiB


def zstd_encode(data: np.ndarray, spare: int = 0) -> bytes:
    """``data`` as one zstd frame of zarr's default level (3) with its content size and no
    checksum: by numcodecs on this thread; or, where ``spare`` threads of the pool are idle
    (the last output chunks of a job, written after every read has ended), by zstd's
    multi-threaded encoder on ``1 + spare`` threads (at most :data:`MAX_ENCODE_THREADS`),
    still one frame that every zstd reader decodes. Measured on the H100 host for a chunk of
    128 MiB: 0.25 s by numcodecs, 0.11 s on 4 threads; with every core busy numcodecs is the
    faster (0.46 s for 16 chunks at once, against 0.55 s by the zstandard package)."""
    if spare:
        try:
            import zstandard
        except ImportError:  # an optional speed-up: numcodecs writes the same chunk
            spare = 0
    if not spare:
        from numcodecs import Zstd

        return bytes(Zstd(level=0).encode(data))
    threads = min(MAX_ENCODE_THREADS, 1 + spare)
    encoder = zstandard.ZstdCompressor(level=3, threads=threads, write_checksum=False,
                                       write_content_size=True)
    return encoder.compress(data.reshape(-1).view(np.uint8).data)


def _on_device(a: Any) -> bool:
    return not isinstance(a, np.ndarray) and hasattr(a, "__cuda_array_interface__")


def _gather_device(parts: list[Any]) -> list[Any]:
    """The CuPy ``parts`` of an output chunk, or [] when a non-empty part is in host memory
    (the chunk is then put together on the host). Parts on several devices (one process
    driving several GPUs) are copied to the first one's by :func:`write_chunk_file_gpu`."""
    if any(isinstance(q, np.ndarray) and len(q) for q in parts):
        return []
    return [q for q in parts if _on_device(q)]


def write_chunk_file_gpu(array_dir: str, j: int, parts: list[Any], chunk: int,
                         share: bool = False) -> tuple[str, list[int], bool]:
    """Chunk ``j`` of the same array as :func:`write_chunk_file`, from CuPy parts: put together
    and padded on their device, encoded there by nvCOMP as zstd frames of at most
    :func:`.gpu_zstd.frame_bytes` each, and only those copied back. The file's bytes differ
    from numcodecs' but decode to the same chunk (numcodecs reads several frames since
    0.16.4). With ``share``, where :func:`.encoder_choice.choose` expects this thread to
    write it sooner, the chunk is copied back as it is and encoded here as
    :func:`write_chunk_file` does. Returns its key, ``[size, CRC-32C]`` of the bytes written
    and whether the GPU encoded it."""
    import cupy

    from . import encoder_choice
    from .gpu_zstd import encode

    dev = parts[0].device.id
    with cupy.cuda.Device(dev), _thread_stream(dev):
        _wait_for_arrivals()
        # A part on another device (chunk i of a job driving several GPUs is on device i % n)
        # is copied peer to peer on this stream; its task synchronised it when it ended.
        moved = [q.device.id != dev for q in parts]
        parts = [q.copy() if m else q for q, m in zip(parts, moved)]
        if any(moved):
            cupy.cuda.get_current_stream().synchronize()  # the encoder runs on another stream
        if len(parts) == 1 and len(parts[0]) == chunk and parts[0].data.ptr % 8 == 0:
            # A slice of one piece, complete since its task ended. (nvCOMP's zstd wants its
            # input 4-byte aligned: a slice of 1- or 2-byte items may not be.)
            full = parts[0]
        else:
            full = cupy.empty(chunk, dtype=parts[0].dtype)
            at = 0
            for q in parts:
                full[at : at + len(q)] = q
                at += len(q)
            full[at:] = 0
            cupy.cuda.get_current_stream().synchronize()  # the encoder runs on another stream
        ticket = encoder_choice.choose(dev, full.nbytes) if share else None
        try:
            frames = None
            if ticket is None or ticket.gpu:
                frames = encode(full, ticket.better_on_cpu if ticket is not None else None)
                if frames is None:  # it left the device's queue (see .encoder_choice)
                    assert ticket is not None
                    ticket.moved()
            if frames is None:
                host = thread_host(full.shape, full.dtype)
                staging.ring(dev).to_host(host, full, cupy.cuda.get_current_stream())
                del full
                key, written = write_chunk_file(array_dir, j, host, chunk)
            else:
                key = f"c/{j}"
                with open_chunk_file(array_dir, key) as f:
                    f.write(frames.data)
                written = [frames.nbytes, checksum(frames.data)]
        except BaseException:
            if ticket is not None:
                ticket.abandoned()
            raise
        if ticket is not None:
            ticket.done()
        return key, written, ticket is None or ticket.gpu


def _wait_for_arrivals() -> None:
    """Wait until every copy queued so far on the current device's legacy default stream has
    landed: that is where a part that came from another worker was copied in (distributed's
    deserialisation: a ``cudaMemcpy`` from pageable memory, which returns once the bytes are
    staged, before its DMA to the device has ended). This thread's stream and the encoder's
    are non-blocking: they do not wait for the legacy stream, and read such a part too early.
    Seen once on 4x H200 (a LocalCUDACluster job with --encode gpu: one input chunk's ~880
    selected values written as zeros, every count right). A part made on this worker was
    synchronised by its task; the wait then finds nothing queued."""
    import cupy

    landed = cupy.cuda.Event(disable_timing=True)
    landed.record(cupy.cuda.Stream.null)
    landed.synchronize()


def peak_rss() -> int:
    """This process's peak resident memory in bytes (run on each worker at the end).

    On Linux the high-water mark of the process's own address space (``VmHWM``): the
    ``ru_maxrss`` of ``getrusage`` survives ``execve``, so a worker process spawned (fork,
    then exec) by a large parent reported the parent's size at the fork as its own peak
    (both workers of a test showed the pytest process's 783 MB)."""
    import resource
    import sys

    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
