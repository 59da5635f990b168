"""What the tasks of a streaming job run where they run: read and compact one input chunk
(:func:`read_compact`), slice a piece (:func:`take`), write one output chunk
(:func:`write_chunk`). Top-level functions of small picklable arguments, so that the same code
runs in a thread pool and on distributed workers."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from .reader import Reader


class ChunkError(RuntimeError):
    """A task failed on one input chunk; the message names it (and keeps the cause's text)."""


@dataclass
class Piece:
    """One input chunk's selected values and/or global indices, in host memory."""

    values: np.ndarray | None
    indices: np.ndarray | None
    count: int
    read_s: float = 0.0
    compact_s: float = 0.0
    device: str = "cpu"

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.values, self.indices) if a is not None)


@dataclass(frozen=True)
class PieceInfo:
    """What the client learns of a piece: its count, bytes and timings (never its data)."""

    count: int
    nbytes: int
    read_s: float
    compact_s: float
    device: str


@functools.lru_cache(maxsize=32)
def _predicate(where: str) -> Any:
    from ..predicate import as_predicate

    return as_predicate(where)


def read_compact(
    reader: Reader, i: int, r0: int, r1: int, base: int, where: str, mode: str, device: str,
) -> Piece:
    """Read rows ``r0:r1`` (input chunk ``i``, first flat index ``base``) and compact them.

    ``device="gpu"``: the chunk is moved to the current CUDA device (a dask-cuda worker's
    own), compacted by the kernels, and the selection copied back (the output is written from
    host memory). ``"gpu-all"``: the same on device ``i % n`` of the n visible devices (one
    process driving every GPU of the host, the threaded scheduler).
    """
    from ..dispatch import compact_chunk
    from ..validate import native

    where_from = f"input chunk {i} (rows {r0}:{r1})"
    t0 = time.perf_counter()
    try:
        block = reader.read(r0, r1)
    except Exception as e:  # a corrupted or missing chunk: say which one
        raise ChunkError(f"cannot read {where_from}: {type(e).__name__}: {e}") from e
    if not block.dtype.isnative:
        block = block.astype(native(block.dtype))
    t1 = time.perf_counter()
    pred = _predicate(where)
    try:
        if device in ("gpu", "gpu-all"):
            values, indices = _compact_on_gpu(block, pred, mode, base, i if device == "gpu-all"
                                              else None)
        else:
            out = compact_chunk(block, pred, mode, True, "auto", base)
            values, indices = _split(out, mode)
    except Exception as e:
        raise ChunkError(f"cannot compact {where_from}: {type(e).__name__}: {e}") from e
    t2 = time.perf_counter()
    count = len(values) if values is not None else len(indices)
    return Piece(values, indices, int(count), t1 - t0, t2 - t1,
                 "gpu" if device.startswith("gpu") else "cpu")


def _split(out: Any, mode: str) -> tuple[Any, Any]:
    if mode == "both":
        return out
    return (out, None) if mode == "values" else (None, out)


def _compact_on_gpu(block: np.ndarray, pred: Any, mode: str, base: int, i: int | None
                    ) -> tuple:
    import cupy

    from ..dispatch import compact_chunk

    dev = cupy.cuda.runtime.getDevice() if i is None else i % cupy.cuda.runtime.getDeviceCount()
    with cupy.cuda.Device(dev):
        d = cupy.asarray(block)
        out = compact_chunk(d, pred, mode, True, "auto", base)
        values, indices = _split(out, mode)
        return (
            None if values is None else values.get(),
            None if indices is None else indices.get(),
        )


def info(piece: Piece) -> PieceInfo:
    return PieceInfo(piece.count, piece.nbytes, piece.read_s, piece.compact_s, piece.device)


def take(piece: Piece, lo: int, hi: int) -> Piece:
    """Elements ``lo:hi`` of a piece (copies: the slice travels to another worker)."""
    return Piece(
        None if piece.values is None else piece.values[lo:hi].copy(),
        None if piece.indices is None else piece.indices[lo:hi].copy(),
        hi - lo,
    )


class OutputArrays:
    """The output group's arrays, opened once per process by the tasks that write them."""

    def __init__(self, store: str, names: tuple[str, ...], out_chunk: int) -> None:
        self.store = store
        self.names = names
        self.out_chunk = out_chunk

    def array(self, name: str) -> Any:
        return _open_out(self.store, name)


@functools.lru_cache(maxsize=16)
def _open_out(store: str, name: str) -> Any:
    import zarr

    return zarr.open_array(store=store, path=name, mode="r+")


def write_chunk(dest: OutputArrays, j: int, los: list[int], his: list[int], *pieces: Piece
                ) -> float:
    """Write output chunk ``j`` from parts ``los[k]:his[k]`` of ``pieces[k]``; its seconds.

    Every output chunk has exactly one writer, so no two tasks ever write one Zarr chunk.
    """
    t0 = time.perf_counter()
    start = j * dest.out_chunk
    for name in dest.names:
        parts = [getattr(p, name)[lo:hi] for p, lo, hi in zip(pieces, los, his)]
        data = parts[0] if len(parts) == 1 else np.concatenate(parts)
        dest.array(name)[start : start + len(data)] = data
    return time.perf_counter() - t0


def peak_rss() -> int:
    """This process's peak resident memory in bytes (run on each worker at the end)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)
