"""Reading blocks of rows of the input where a task runs: a Zarr array (local path or fsspec
URL) or a memory-mapped ``.npy`` file.

A reader pickles as its location and the input's fingerprint only; each process opens the input
once per version (:class:`_Handles`), so a distributed graph never carries data and a task
reads only the rows it compacts.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .plan import row_bytes
from .zstd_frames import content_size, declared_total, split

# Linux: fill the page tables of a new mapping at once (0 where the flag does not exist).
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def rows(a: Any, r0: int, r1: int) -> Any:
    """Rows ``r0:r1`` of the array ``a`` (a memory map, a Zarr array), where a 0-d array is one
    row of one element, its ``x.ravel()`` (a 0-d array cannot be sliced: "too many indices").
    The 0-d case: 2026-12-02 (nineteenth session), when the command stopped refusing it."""
    if len(a.shape):
        return a[r0:r1]
    return np.asarray(a[()]).reshape(1)[r0:r1]


class ZarrRows:
    """Rows ``r0:r1`` of a Zarr array, all trailing axes (whole Zarr chunks when the block is
    aligned with the array's chunks along axis 0)."""

    kind = "zarr"

    def __init__(self, url: str, shape: tuple[int, ...], dtype: np.dtype, fingerprint: str):
        self.url = url
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.fingerprint = fingerprint

    def read(self, r0: int, r1: int) -> np.ndarray:
        arr = _zarr_arrays.get(self.url, self.fingerprint)
        _same_input(self.url, (tuple(arr.shape), np.dtype(arr.dtype)), (self.shape, self.dtype))
        try:
            return np.asarray(rows(arr, r0, r1))
        except Exception as e:
            # zarr's error (a zstd one, say) does not say which chunk: find the first of the
            # block's chunks that fails on its own, and name it
            raise _chunk_error(arr, r0, r1, e) from e


def _chunk_error(arr: Any, r0: int, r1: int, e: Exception) -> Exception:
    """``e`` of reading rows r0:r1 of zarr array ``arr``, naming the first chunk (key and rows)
    whose own read fails; ``e`` itself where each reads alone (or no chunk grid is known)."""
    try:
        step = int(arr.chunks[0])
        for c in range(r0 // step, -(-r1 // step)):
            lo, hi = c * step, min((c + 1) * step, arr.shape[0])
            try:
                arr[lo:hi]
            except Exception as one:  # noqa: BLE001 -- the one to name
                key = arr.metadata.encode_chunk_key((c,) + (0,) * (arr.ndim - 1))
                return ValueError(f"Zarr chunk {key} (rows {lo}:{hi}): {type(one).__name__}: "
                                  f"{one}")
    except Exception:  # noqa: BLE001 -- no chunk grid to search: zarr's own error
        return e
    return e


class NpyRows:
    """Rows ``r0:r1`` of a ``.npy`` file, memory-mapped by each process that reads."""

    kind = "npy"

    def __init__(self, path: str, shape: tuple[int, ...], dtype: np.dtype, fingerprint: str):
        self.path = path
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.fingerprint = fingerprint

    def read(self, r0: int, r1: int) -> np.ndarray:
        mapped = _npy_maps.get(self.path, self.fingerprint)
        if mapped.fingerprint != self.fingerprint or not mapped.unchanged():
            # Another file than the job's (moved over it, or written in place): refused, not
            # mapped again. Mapped again, a job read half the old file and half the new one,
            # and committed (a review: a `cp -p` copy moved over it keeps its size and time,
            # so the fingerprint had not changed). A new job, with the new file's
            # fingerprint, maps the new file.
            raise InputChanged(
                f"{self.path} changed since the job started (another file moved over it, or "
                "written in place): run the job again once nothing writes to INPUT")
        _same_input(self.path, (tuple(mapped.array.shape), mapped.array.dtype),
                    (self.shape, self.dtype))
        # A copy: a memmap slice would keep the file mapped inside the piece.
        return np.array(rows(mapped.array, r0, r1))


class ChunkKeys(Sequence):
    """The chunk files' keys of a Zarr array chunked along axis 0 alone, by chunk index:
    ``prefix + str(c) + suffix`` (zarr's key of chunk ``(c, 0, ...)``), a sequence of ``n``.

    Why not a list: a reader travels with every task of a distributed job, and a list of every
    chunk's key made each task's arguments grow with the job: 10,000 one-row chunks under
    ``--local processes`` took 129 s where 5,000 took 42 s, the scheduler and worker
    unpickling those lists (2026-12-05, a py-spy profile)."""

    __slots__ = ("prefix", "suffix", "n")

    def __init__(self, prefix: str, suffix: str, n: int) -> None:
        self.prefix, self.suffix, self.n = prefix, suffix, int(n)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, c: Any) -> Any:
        if isinstance(c, slice):
            return [self[i] for i in range(*c.indices(self.n))]
        c = int(c)
        if c < 0:
            c += self.n
        if not 0 <= c < self.n:
            raise IndexError(f"chunk {c} of {self.n}")
        return f"{self.prefix}{c}{self.suffix}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ChunkKeys):
            return (self.prefix, self.suffix, self.n) == (other.prefix, other.suffix, other.n)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == self.n and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.prefix, self.suffix, self.n))

    def __reduce__(self) -> tuple:
        return ChunkKeys, (self.prefix, self.suffix, self.n)

    def __repr__(self) -> str:
        return f"ChunkKeys({self.prefix!r} + c + {self.suffix!r}, n={self.n})"


def chunk_keys(encode: Callable[[tuple[int, ...]], str], n: int,
               zeros: tuple[int, ...]) -> ChunkKeys | list[str]:
    """The keys of chunks ``(c, *zeros)``, ``c < n``, by ``encode`` (zarr's
    ``metadata.encode_chunk_key``): a :class:`ChunkKeys` where ``encode`` puts ``c`` between a
    fixed prefix and suffix (checked on the first, second and last chunks and a probe), else
    the list of every key."""
    probe = 9876543
    key = encode((probe, *zeros))
    at = key.find(str(probe))
    if at >= 0 and key.count(str(probe)) == 1:
        keys = ChunkKeys(key[:at], key[at + len(str(probe)):], n)
        if all(keys[c] == encode((c, *zeros)) for c in {0, 1, n - 1} if 0 <= c < n):
            return keys
    return [encode((c, *zeros)) for c in range(n)]


class ZarrChunkFiles:
    """Rows ``r0:r1`` of a local Zarr v3 array stored as zstd-compressed chunks along axis 0
    (zarr's default codecs, ``bytes`` then ``zstd``; trailing axes in one chunk): the chunk
    files are read and decoded here, skipping zarr's per-call machinery, on the CPU with
    numcodecs' zstd straight into the block (the GIL released), or on the GPU with nvCOMP
    (:meth:`read_device`). See :func:`chunk_files_reader` for when this applies."""

    kind = "zarr"

    def __init__(self, url: str, shape: tuple[int, ...], dtype: np.dtype, fingerprint: str,
                 chunk_rows: int, keys: Sequence[str], fill_value: Any,
                 allow_missing: bool) -> None:
        self.url = url
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.fingerprint = fingerprint
        self.chunk_rows = chunk_rows
        # the chunk files' paths relative to url, by chunk index (a ChunkKeys, or a list)
        self.keys = keys
        self.fill_value = fill_value
        self.allow_missing = allow_missing

    def _named(self, c: int, path: bool = False) -> str:
        """Chunk ``c`` in an error: its key (or file, ``path``) and its rows. A task reads
        several chunks; a probe's damaged chunk was told as "input chunk 0 (rows 0:100003):
        ... Zarr chunk c/7" (the task's rows, not the chunk's) until 2026-12-07."""
        key = os.path.join(self.url, self.keys[c]) if path else self.keys[c]
        r0 = c * self.chunk_rows
        return f"{key} (rows {r0}:{min(r0 + self.chunk_rows, self.shape[0])})"

    def _raw(self, c: int) -> Any:
        """Chunk ``c``'s compressed bytes, memory-mapped (None: missing and allowed to be).

        Mapped rather than read: zstd then decodes straight from the page cache, with no copy
        into a fresh ``bytes`` per chunk (that copy and its page faults halved the decode rate
        of 16 threads on the H100 host, see :mod:`.host_buffers`). ``MAP_POPULATE`` maps every
        page in one system call instead of one fault per page. The caller closes the map."""
        path = os.path.join(self.url, self.keys[c])
        try:
            f = open(path, "rb")
        except FileNotFoundError:
            if self.allow_missing:
                return None
            raise FileNotFoundError(
                f"Zarr chunk {self._named(c)} is missing from the store") from None
        with f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""  # mmap refuses empty files; zstd refuses the empty frame
            return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE | _MAP_POPULATE,
                             prot=mmap.PROT_READ)

    def read(self, r0: int, r1: int, out: np.ndarray | None = None) -> np.ndarray:
        """The rows, decoded into ``out`` if given (e.g. pinned host memory for a copy to a
        GPU; C-contiguous, of the rows' shape and dtype)."""
        row = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        if out is None:
            out = np.empty((r1 - r0,) + self.shape[1:], self.dtype)
        flat = out.reshape(-1)
        at = 0
        chunk_bytes = self.chunk_rows * row_bytes(self.shape, self.dtype)  # edge chunks too
        for c, first, rows in chunk_spans(self.chunk_rows, r0, r1):
            raw = self._raw(c)
            n = rows * row
            try:
                if raw is None:
                    flat[at : at + n] = self.fill_value
                elif first == 0 and rows == self.chunk_rows:
                    # the whole chunk, in place
                    decode_chunk(raw, chunk_bytes, self._named(c), flat[at : at + n])
                else:  # an edge chunk (stored at full size) or a block boundary inside one
                    whole = np.frombuffer(decode_chunk(raw, chunk_bytes, self._named(c)),
                                          self.dtype)
                    flat[at : at + n] = whole[first * row : first * row + n]
            finally:
                _close(raw)
            at += n
        return out

    def read_device(self, r0: int, r1: int) -> Any:
        """The same rows as a CuPy array on the current device, decoded there by nvCOMP (see
        :func:`.gpu_zstd.decode_host`: the chunks' compressed bytes copied to the device on
        the current stream, decoded in a batch with other tasks' chunks). Where the chunks
        decode end to end (every one stored, of a size a multiple of 8 bytes) the rows are a
        view of the decoded buffer, with no copy."""
        import cupy

        from .gpu_zstd import decode_host

        spans = chunk_spans(self.chunk_rows, r0, r1)
        row = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        chunk_bytes = self.chunk_rows * row_bytes(self.shape, self.dtype)
        raws = [self._raw(c) for c, _, _ in spans]
        try:
            kept = [r for r in raws if r is not None]
            names = [self._named(c, path=True)
                     for (c, _, _), r in zip(spans, raws) if r is not None]
            buf, starts = decode_host(kept, [chunk_bytes] * len(kept), names)
        finally:
            for r in raws:
                _close(r)
        return rows_of_decoded(cupy, buf, starts, spans, [r is not None for r in raws], row,
                               self.dtype, self.fill_value, (r1 - r0,) + self.shape[1:])


def chunk_spans(chunk_rows: int, r0: int, r1: int) -> list[tuple[int, int, int]]:
    """(chunk, first row in it, rows) for each chunk of ``chunk_rows`` rows that rows
    ``r0:r1`` touch, in order."""
    out = []
    c = r0 // chunk_rows
    while c * chunk_rows < r1:
        lo = max(r0, c * chunk_rows)
        hi = min(r1, (c + 1) * chunk_rows)
        out.append((c, lo - c * chunk_rows, hi - lo))
        c += 1
    return out


def rows_of_decoded(xp: Any, buf: Any, starts: list[int], spans: list[tuple[int, int, int]],
                    stored: list[bool], row: int, dtype: np.dtype, fill: Any,
                    shape: tuple[int, ...]) -> Any:
    """The rows ``spans`` cover (``(chunk, first row in it, rows)``, in order) out of ``buf``,
    the uint8 array in which the stored chunks were decoded, chunk k of them at byte
    ``starts[k]``; a chunk not ``stored`` gives ``fill``. ``xp``: the array module of ``buf``
    (CuPy for :meth:`ZarrChunkFiles.read_device`; NumPy in the tests). Where the spans' bytes
    lie end to end in ``buf`` (every chunk stored, each a multiple of 8 bytes) the result is
    a view of ``buf``, with no copy."""
    isz = np.dtype(dtype).itemsize
    places: list[tuple[int, int] | None] = []  # each span's bytes in buf (None: fill)
    at = iter(starts)
    for (_, first, rows), kept in zip(spans, stored):
        if not kept:
            places.append(None)
            continue
        lo = next(at) + first * row * isz
        places.append((lo, lo + rows * row * isz))
    whole = [p for p in places if p is not None]
    if whole and len(whole) == len(places) and all(
            a[1] == b[0] for a, b in zip(whole, whole[1:])):
        return buf[whole[0][0] : whole[-1][1]].view(dtype).reshape(shape)
    parts = [xp.full(span[2] * row, fill, dtype) if p is None
             else buf[p[0] : p[1]].view(dtype) for span, p in zip(spans, places)]
    if not parts:
        return xp.empty(shape, dtype)
    flat = parts[0] if len(parts) == 1 else xp.concatenate(parts)
    return flat.reshape(shape)


def decode_chunk(raw: Any, want: int, name: str, out: np.ndarray | None = None) -> Any:
    """Chunk file ``raw`` (zstd frames) decoded on the CPU into ``out`` (``want`` bytes) or
    into new bytes; ValueError naming chunk ``name`` where it is not zstd or does not decode
    to exactly ``want`` bytes, as zarr refuses such a chunk.

    numcodecs decodes every frame of ``raw`` into ``out`` and refuses more than ``out``
    holds, but not less: a chunk that decodes short would leave the rest of ``out`` as it
    was (another chunk's values in a reused buffer). So ``out`` is decoded into only where
    the frames' headers declare ``want`` bytes in all (zstd checks each frame's content
    against its header); otherwise the chunk is decoded apart and its size checked."""
    from numcodecs import Zstd

    zstd = Zstd()
    try:
        if out is not None and _declares(raw, want):
            try:
                return zstd.decode(raw, out=out)
            except ValueError as e:  # frames past the chunk: "destination buffer too small"
                raise ValueError(f"Zarr chunk {name} does not decode to the chunk's {want} "
                                 f"bytes ({e})") from None
        decoded = zstd.decode(raw)
    except RuntimeError as e:  # numcodecs' error for a frame it cannot decode
        raise ValueError(f"Zarr chunk {name}: zstd could not decode it ({e})") from e
    got = memoryview(decoded).nbytes
    if got != want:
        raise ValueError(f"Zarr chunk {name} decodes to {got} bytes, not the chunk's {want}")
    if out is None:
        return decoded
    out.reshape(-1).view(np.uint8)[:] = np.frombuffer(decoded, np.uint8)
    return out


def _declares(raw: Any, want: int) -> bool:
    """Whether the zstd frames of ``raw`` declare ``want`` bytes in all: its first header
    does (one frame of the chunk's size, the usual case: no walk over its blocks; a frame
    after it makes numcodecs refuse the buffer), or every frame declares its size and the
    sizes add up."""
    view = memoryview(raw)
    return content_size(view[:18]) == want or declared_total(split(view)) == want


def _close(raw: Any) -> None:
    """Unmap a chunk file mapped by :meth:`ZarrChunkFiles._raw` now, or, where a view of it
    is still alive, once that view is garbage: on a distributed worker the sampling profiler
    can hold the frame of a function that viewed it (``BufferError: cannot close exported
    pointers exist``, seen on a LocalCUDACluster, and on the CI machine's LocalCluster when
    :meth:`ZarrChunkFiles.read` closed its maps itself: a records job failed with it)."""
    if isinstance(raw, mmap.mmap):
        try:
            raw.close()
        except BufferError:
            pass


def chunk_files_reader(node: Any, url: str, fingerprint: str,
                       allow_missing: bool) -> tuple[ZarrChunkFiles | None, str]:
    """A :class:`ZarrChunkFiles` for ``node`` where its layout allows, else None and why."""
    from zarr.codecs import BytesCodec, ZstdCodec

    meta = node.metadata
    if "://" in url:
        return None, "the input is not a local path"
    if getattr(meta, "zarr_format", None) != 3:
        return None, "the input is a Zarr v2 array"
    codecs = tuple(meta.codecs)
    if not (len(codecs) == 2 and isinstance(codecs[0], BytesCodec)
            and isinstance(codecs[1], ZstdCodec)):
        names = ", ".join(type(c).__name__ for c in codecs)
        return None, f"its codecs are {names}, not bytes + zstd"
    dtype = np.dtype(node.dtype)
    if dtype.itemsize > 1 and getattr(codecs[0].endian, "value", "little") != "little":
        return None, "its bytes are big-endian"
    if not node.shape:  # one element: nothing for a chunk-file reader to gain
        return None, "it is 0-d (one element)"
    if tuple(node.chunks[1:]) != tuple(node.shape[1:]):
        return None, "its chunks split the trailing axes"
    n_chunks = -(-node.shape[0] // node.chunks[0]) if node.shape[0] else 0
    zeros = (0,) * (len(node.shape) - 1)
    keys = chunk_keys(meta.encode_chunk_key, n_chunks, zeros)
    return ZarrChunkFiles(url, node.shape, dtype, fingerprint, int(node.chunks[0]), keys,
                          node.fill_value, allow_missing), ""


Reader = ZarrRows | NpyRows | ZarrChunkFiles


class InputChanged(ValueError):
    """The input a task reads is not the version its job planned on (rewritten since)."""


def _same_input(where: str, opened: tuple[tuple[int, ...], np.dtype],
                planned: tuple[tuple[int, ...], np.dtype]) -> None:
    """Refuse to read an input whose shape or dtype differ from the job's plan: rows past the
    new end would come back short, and a new dtype's bytes would be written as the planned
    dtype (a .npy of float64 rewritten as int32 gave an output chunk of twice its size)."""
    if opened != planned:
        raise InputChanged(
            f"{where} changed since the job started (shape {opened[0]}, dtype {opened[1]}; "
            f"the job planned on shape {planned[0]}, dtype {planned[1]}): run the job again "
            f"once nothing writes to INPUT")


class _Handles:
    """This process's open handles of inputs, one per location, for the version (fingerprint)
    last asked for; at most ``most`` locations, the least recently used dropped first.

    Keyed by location alone (until 2026-11-30) a process that serves several jobs (a
    ``--scheduler`` cluster's workers, an in-process job run twice) read a store rewritten at
    the same path through the handle of its first version: the old shape and dtype (a grown
    array read short, a new dtype failed or was written as the old one), a replaced .npy
    file's old inode. The job's fingerprint (what ``--resume`` and the commit's check compare)
    names the version, so a new version opens anew at no cost per task; the older version's
    handle is dropped then (a memory map of a replaced file holds its disk space)."""

    def __init__(self, open_version: Callable[[str], Any], most: int = 16) -> None:
        self._open = open_version
        self._most = most
        self._held: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, where: str, version: str) -> Any:
        """The handle of ``where`` at ``version``, opened now unless held."""
        with self._lock:
            held = self._held.get(where)
            if held is not None and held[0] == version:
                self._held.move_to_end(where)
                return held[1]
        handle = self._open(where)  # outside the lock: a URL's open may take a while
        with self._lock:
            self._held[where] = (version, handle)
            self._held.move_to_end(where)
            while len(self._held) > self._most:
                self._held.popitem(last=False)
        return handle


def _open_zarr(url: str) -> Any:
    import zarr

    return zarr.open_array(store=url, mode="r")


class _NpyMap:
    """A .npy file memory-mapped, the file's identity (device, inode, size, modification
    time) just before it was mapped, and its fingerprint (:func:`npy_fingerprint`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        st = os.stat(path)
        self.identity = _identity(st)
        self.fingerprint = _npy_token(path, st)
        self.array: np.memmap = np.load(path, mmap_mode="r")

    def unchanged(self) -> bool:
        """Whether the file is still the one mapped (one ``stat``, about a microsecond a
        task). A read of a mapped page past the end of a file truncated in place kills the
        process with SIGBUS (a worker lost, the job failing on its retries), and a file
        replaced under its name leaves the map on the old inode: the task refuses a changed
        file (:class:`InputChanged`) before it reads the map."""
        return _identity(os.stat(self.path)) == self.identity


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


_zarr_arrays = _Handles(_open_zarr)
_npy_maps = _Handles(_NpyMap)


def zarr_fingerprint(node: Any, url: str) -> str:
    """What identifies the input for a resumed job: its metadata and, for a local array, every
    file under the array's directory (path, size, modification time): zarr rewrites the chunk
    files, not its metadata document, when an array's values are written again, and a job
    resumed over new values would mix the old selection with the new. A URL's input is
    identified by its metadata only, except a member of an archive on the local file system
    (``zip://::/p/in.zip``): that adds the archive file's identity (:func:`_archive_identity`).
    """
    meta = node.metadata.to_dict()
    parts: list[Any] = [repr(sorted(meta.items()))]
    if "://" not in url:
        parts.append(hashlib.sha1(repr(_files(url)).encode()).hexdigest())
    else:
        parts.extend(_archive_identity(url))
    from dask.base import tokenize

    return tokenize(*parts)


def _archive_identity(url: str) -> list[tuple[int, int, int, int]]:
    """The device, inode, size and modification time of the local archive file that ``url``
    reads from (``zip://x::/p/in.zip``, fsspec's caches in front of the file looked through),
    none for a URL that reads from no archive or from one elsewhere. Until 2026-12-01 a zip
    INPUT was identified by its metadata alone: a new-user probe killed a job on
    ``zip://::/p/in.zip``, zipped other values under the same metadata over it, and
    ``--resume`` committed the two selections mixed, exit 0. One ``stat``: the archive file
    holds every byte of INPUT."""
    from fsspec.implementations.local import LocalFileSystem

    from .caches import resolved
    from .output import archive_file  # output imports .inputs, which imports this module

    archive = archive_file(url)
    if archive is None:
        return []
    fs, path = resolved(archive)
    return [_identity(os.stat(path))] if isinstance(fs, LocalFileSystem) else []


def _files(root: str) -> list[tuple[str, int, int]]:
    """(path relative to ``root``, size, modification time in ns) of every file under it,
    sorted (on the 2-core CI machine: 10,000 chunk files in about 80 ms); linked folders
    followed as zarr's reads follow them (:func:`walk_files`)."""
    return sorted((rel, st.st_size, st.st_mtime_ns) for rel, st in walk_files(root))


def walk_files(root: str) -> Iterator[tuple[str, os.stat_result]]:
    """(path relative to ``root``, ``stat``) of every file under the folder ``root``, through
    linked folders too (``in.zarr/c -> /other/disk/c``), since zarr's reads go through them;
    each folder once (by device and inode), so a link back up ends there. A dangling link is
    left out (zarr reads nothing there either). Until 2026-12-01 (a probe) a linked folder
    was one entry: the chunks check (zarr's listing, which does not follow it) refused such
    an INPUT as missing its chunks, and the input's identity did not see its files."""
    seen: set[tuple[int, int]] = set()
    st = os.stat(root)
    seen.add((st.st_dev, st.st_ino))
    stack = [root]
    while stack:
        top = stack.pop()
        with os.scandir(top) as entries:
            for e in entries:
                try:
                    st = e.stat()  # follows a link
                except (FileNotFoundError, NotADirectoryError):
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        stack.append(e.path)
                else:
                    yield os.path.relpath(e.path, root).replace(os.sep, "/"), st


def npy_fingerprint(path: str) -> str:
    """What identifies a .npy input (a job's, a resume's, the commit's check): its path, and
    the file's device, inode, size and modification time. The device and inode since
    2026-11-30: a copy made by ``cp -p`` and moved over the input keeps the size and time,
    and a job read half the old file, half the new one, and committed (a review). A job
    interrupted before cannot be resumed (:func:`npy_fingerprint_before_inode`)."""
    return _npy_token(path, os.stat(path))


def _npy_token(path: str, st: os.stat_result) -> str:
    from dask.base import tokenize

    return tokenize(path, *_identity(st))


def open_for_writing(path: str) -> bool:
    """Whether some process (this one too) has the file ``path`` open for writing, a writable
    memory map included, as Linux's file leases tell: a read lease is refused (EAGAIN) on a
    file open for writing. False where that cannot be told (not Linux, another user's file
    without CAP_LEASE, a file system without leases).

    A program writing a .npy through ``np.load(p, mmap_mode="r+")`` changes no modification
    time once its pages are mapped writable (measured: none in 2.5 s of writes, ext4 and
    tmpfs), so :func:`npy_fingerprint` cannot see it. The lease is let go at once: a process
    opening the file for writing meanwhile waits for that, and its break is signalled with
    SIGWINCH, ignored unless handled, not the default SIGIO, which would end this one."""
    import errno
    import fcntl
    import signal

    if not hasattr(fcntl, "F_SETLEASE"):
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGWINCH)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    except OSError as e:
        return e.errno in (errno.EAGAIN, errno.EBUSY)
    else:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return False
    finally:
        os.close(fd)


def npy_fingerprint_before_inode(path: str) -> str:
    """:func:`npy_fingerprint` as it was until 2026-11-30 (path, modification time, size):
    only to tell a ``--resume`` of a job interrupted then why it cannot continue."""
    from dask.base import tokenize

    st = os.stat(path)
    return tokenize(path, st.st_mtime_ns, st.st_size)
