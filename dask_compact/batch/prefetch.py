"""The input's first chunks decoded while the command is still starting.

A batch command spends its first second on things that use one core: the interpreter, the
imports (zarr alone took 0.47 s on the H100 host, with the CuPy it imports), CUDA's start,
opening the input. Measured there with a timeline of a 3.55 s command on 8 GiB: the first
chunk was read 0.99 s after the process started, while decoding every chunk once takes the
16 cores 1.2 s. So, where the input is a local Zarr v3 array stored as bytes + zstd chunk
files (what the job's reader decodes itself, :class:`.reader.ZarrChunkFiles`), the command
starts decoding the first chunks at once, in threads of their own, before anything heavy is
imported, and the job's reader takes each of those chunks from here instead of decoding it.

Zarr stays the authority on the array: this module reads ``zarr.json`` as plain JSON only to
guess which files are the first chunks and how large they decode. The reader takes a chunk
from here only if the file (chunk key) and decoded size zarr gave it are the ones guessed, and
decodes it itself otherwise; a chunk that failed to decode here is decoded again by the
reader, which reports the error as for any chunk.

Only until the job starts: once its reader takes a first chunk from here, no new chunk is
started (the job's threads decode the rest into their reused buffers, twice as fast as into
fresh memory, see :mod:`.host_buffers`), and a chunk not started yet is left to the reader.

Memory: at most ``cap`` bytes of decoded chunks (a quarter of the job's memory budget, charged
to it: the job's window gets the rest), each in an array of its own, freed as soon as the
reader has copied it out. Measured on the H100 host, 8 GiB input, before this rule: letting
these threads decode every chunk made the command slower (4.4-4.8 s against 3.55 s), the
job's threads waiting on decodes into fresh memory; and a single shared anonymous mapping for
all chunks (``mmap.mmap(-1, n)`` is ``MAP_SHARED``: shmem) took 0.5 s to unmap at the end.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

# The JSON's data types this guess knows the item size of (zarr v3's numeric core types).
_ITEMSIZE = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "int32": 4,
    "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8, "complex64": 8,
    "complex128": 16,
}  # fmt: skip


@dataclass(frozen=True)
class Guess:
    """The first whole chunks of a local Zarr v3 array as its ``zarr.json`` describes them."""

    url: str  # the array's directory (absolute, as the job's reader has it)
    keys: list[str]  # chunk files relative to url, chunk 0 first, whole chunks only
    nbytes: int  # decoded bytes of one chunk
    chunk_rows: int


def guess(url: str) -> Guess | None:
    """The chunk files of ``url`` if its metadata is exactly what the job's chunk-file reader
    takes (v3, regular grid split along axis 0 only, little-endian bytes then zstd, default
    chunk keys); None for anything else, or anything unreadable."""
    try:
        with open(os.path.join(url, "zarr.json"), "rb") as f:
            meta = json.load(f)
        if meta.get("zarr_format") != 3 or meta.get("node_type") != "array":
            return None
        shape = [int(s) for s in meta["shape"]]
        grid = meta["chunk_grid"]
        chunks = [int(c) for c in grid["configuration"]["chunk_shape"]]
        enc = meta["chunk_key_encoding"]
        itemsize = _ITEMSIZE.get(meta["data_type"]) if isinstance(meta["data_type"], str) else None
        codecs = [c["name"] for c in meta["codecs"]]
        endian = meta["codecs"][0].get("configuration", {}).get("endian", "little")
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    sep = enc.get("configuration", {}).get("separator", "/")
    if (grid.get("name") != "regular" or enc.get("name") != "default" or sep not in "/."
            or itemsize is None or codecs != ["bytes", "zstd"]
            or (itemsize > 1 and endian != "little") or not shape or len(chunks) != len(shape)
            or chunks[1:] != shape[1:] or meta.get("storage_transformers")
            or chunks[0] <= 0):
        return None
    whole = shape[0] // chunks[0]  # the last, partial chunk is left to the reader
    zeros = "".join(f"{sep}0" for _ in shape[1:])
    keys = [f"c{sep}{c}{zeros}" for c in range(whole)]
    nbytes = int(np.prod(chunks, dtype=np.int64)) * itemsize
    return Guess(url, keys, nbytes, chunks[0]) if keys and nbytes else None


class Prefetch:
    """Decodes the first ``count`` chunks of ``g`` in ``threads`` daemon threads, in order."""

    def __init__(self, g: Guess, count: int, threads: int) -> None:
        self.url, self.nbytes = g.url, g.nbytes
        self.size = count * g.nbytes
        # the chunks in the order they are started, and their decodes, which the reader pops
        # as it takes or cancels them (a taken chunk is then referenced by nothing here)
        self._order = g.keys[:count]
        self._futures: dict[str, Future] = {key: Future() for key in self._order}
        self._lock = threading.Lock()
        self._closed = False  # no new chunk is started (the job has started, or stopped)
        self.taken = 0  # chunks the reader took from here
        self._next = 0
        self._threads = [
            threading.Thread(target=self._work, name=f"dask-compact-prefetch-{t}", daemon=True)
            for t in range(max(1, min(threads, count)))
        ]
        for t in self._threads:
            t.start()

    def _claim(self) -> tuple[str, Future] | None:
        with self._lock:
            while not self._closed and self._next < len(self._order):
                key = self._order[self._next]
                self._next += 1
                fut = self._futures.get(key)
                if fut is not None and fut.set_running_or_notify_cancel():
                    return key, fut
            return None  # closed, or every chunk started or taken over by the reader

    def _work(self) -> None:
        from numcodecs import Zstd

        zstd = Zstd()
        while (job := self._claim()) is not None:
            key, fut = job
            try:
                chunk = np.empty(self.nbytes, np.uint8)
                with open(os.path.join(self.url, key), "rb") as f:
                    raw = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE,
                                    prot=mmap.PROT_READ)
                try:
                    zstd.decode(raw, out=chunk)
                finally:
                    raw.close()
                fut.set_result(chunk)
            except BaseException as e:  # noqa: BLE001 -- the reader decodes this chunk again
                fut.set_exception(e)

    def take(self, key: str, nbytes: int, out: np.ndarray) -> bool:
        """Copy chunk ``key`` into ``out`` (``nbytes`` bytes) if it was, or is being, decoded
        here; False (nothing written) if the reader must decode it itself. A chunk not yet
        started is left to the reader (cancelled here), one being decoded is waited for."""
        with self._lock:
            self._closed = True  # the job is reading: its threads decode what is not started
            fut = self._futures.pop(key, None)
        if fut is None or nbytes != self.nbytes or fut.cancel():
            return False
        try:
            chunk = fut.result()
        except BaseException:  # noqa: BLE001 -- the reader's own decode reports it
            return False
        np.copyto(out.reshape(-1).view(np.uint8), chunk)
        with self._lock:
            self.taken += 1
        return True

    def close(self) -> None:
        """Stop: nothing more is started, what is not taken is dropped with the mapping."""
        with self._lock:
            self._closed = True
            futures, self._futures = self._futures, {}
        for fut in futures.values():
            fut.cancel()  # a decode still running ends on its own; its chunk is dropped
        # The mapping goes when the last decode still running has dropped its view.


_current: Prefetch | None = None


def start(url: str, cap: int, threads: int, rows: int | None = None) -> Prefetch | None:
    """Begin decoding the first chunks of the Zarr array at ``url`` (absolute local path) into
    at most ``cap`` bytes; None where :func:`guess` does not recognise it, not one chunk fits,
    or the job's blocks of ``rows`` rows (``--chunks``) would not read whole chunks. The job's
    reader finds it through :func:`take`."""
    global _current
    g = guess(url)
    if g is None or cap < g.nbytes or (rows is not None and rows % g.chunk_rows):
        return None
    count = min(len(g.keys), cap // g.nbytes)
    stop()
    _current = Prefetch(g, count, threads)
    return _current


def take(url: str, key: str, nbytes: int, out: np.ndarray) -> bool:
    """The reader's side: chunk ``key`` of ``url`` copied into ``out`` if it was prefetched."""
    p = _current
    return p is not None and p.url == url and p.take(key, nbytes, out)


def wait(p: Prefetch, timeout: float | None = None) -> None:
    """Until every chunk ``p`` started is decoded (or failed): for tests."""
    import concurrent.futures

    with p._lock:
        futures = list(p._futures.values())
    concurrent.futures.wait(futures, timeout)


def taken() -> int:
    """Chunks the job's reader has taken from the current prefetch (0 if none)."""
    return _current.taken if _current is not None else 0


def stop() -> None:
    global _current
    if _current is not None:
        _current.close()
        _current = None
