"""Batch job input: a Zarr array (local or fsspec URL) or a memory-mapped .npy file, as a dask
array."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import click
import dask.array as da
import numpy as np
from dask.base import tokenize

from .reader import (
    NpyRows,
    Reader,
    ZarrRows,
    chunk_files_reader,
    npy_fingerprint,
    zarr_fingerprint,
)

AUTO_CHUNK_BYTES = 128 * 2**20  # .npy input: about this much per input chunk

SEPARATOR = "://"


# ---------------------------------------------------------------------------------------------
# Input


class NpyBlocks:
    """A ``.npy`` file that dask slices block by block.

    Each process that reads a block memory-maps the file itself; the object pickles as its
    path, shape and dtype only, so a distributed graph never carries the data (a plain
    ``np.memmap`` handed to ``da.from_array`` would be pickled whole into every task).
    """

    def __init__(self, path: str) -> None:
        mm = np.load(path, mmap_mode="r")
        self.path = path
        self.shape: tuple[int, ...] = tuple(mm.shape)
        self.dtype = mm.dtype
        self.ndim = mm.ndim
        self._mm: np.memmap | None = None

    def __getitem__(self, index: Any) -> np.ndarray:
        if self._mm is None:
            self._mm = np.load(self.path, mmap_mode="r")
        # A copy: a memmap slice would keep the file open inside the chunk (and pickle badly).
        return np.array(self._mm[index])

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "shape": self.shape, "dtype": self.dtype, "ndim": self.ndim}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._mm = None


@dataclass
class Source:
    array: da.Array  # the input as a dask array (metadata, and the empty-input path)
    kind: str  # "npy" or "zarr"
    local_path: str | None  # for the INPUT/OUTPUT overlap check
    reader: Reader  # reads blocks of rows where a streaming task runs
    row_chunk: int  # rows per input chunk of the streaming job
    no_gpu_decode: str = ""  # why the reader cannot decode on a GPU ("" if it can)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype


def is_url(path: str) -> bool:
    return SEPARATOR in path and not path.startswith("file://")


def local(path: str) -> str:
    return os.path.abspath(path.removeprefix("file://"))


def leading_axis_chunks(ndim: int, n: int | str) -> tuple[Any, ...]:
    """Chunks split along axis 0 only: each chunk is then a contiguous run of the C order."""
    return (n,) + (-1,) * (ndim - 1)


def open_input(path: str, chunks: int | None, allow_missing_chunks: bool = False) -> Source:
    if not is_url(path) and not os.path.exists(local(path)):
        raise click.BadParameter(f"{path!r} does not exist", param_hint="INPUT")
    if path.endswith(".npy"):
        return open_npy(path, chunks)
    if not is_url(path) and os.path.isfile(local(path)):
        raise click.BadParameter(
            f"{path!r} is a file but not a .npy file; INPUT must be a Zarr array or a .npy file",
            param_hint="INPUT",
        )
    return open_zarr(path, chunks, allow_missing_chunks)


def open_npy(path: str, chunks: int | None) -> Source:
    if is_url(path):
        raise click.BadParameter(
            ".npy input must be a local file (it is memory-mapped); convert it to Zarr for "
            "remote storage",
            param_hint="INPUT",
        )
    p = local(path)
    try:
        blocks = NpyBlocks(p)
    except ValueError as e:  # object dtype: "Array can't be memory-mapped"; a bad header
        raise click.BadParameter(f"cannot memory-map {path!r}: {e}", param_hint="INPUT") from None
    check_shape_dtype(blocks.shape, blocks.dtype, path)
    st = os.stat(p)
    name = "npy-" + tokenize(p, st.st_mtime_ns, st.st_size)
    # dask's "auto" chunking divides by the block size, which is 0 for an empty array
    rows = chunks or ("auto" if 0 not in blocks.shape else max(1, blocks.shape[0]))
    x = da.from_array(
        blocks,
        chunks=leading_axis_chunks(blocks.ndim, rows),
        name=name,
        meta=np.empty((0,) * blocks.ndim, dtype=blocks.dtype),
        inline_array=True,
    )
    row_bytes = max(1, int(np.prod(blocks.shape[1:], dtype=np.int64)) * blocks.dtype.itemsize)
    row_chunk = chunks or max(1, AUTO_CHUNK_BYTES // row_bytes)
    reader = NpyRows(p, blocks.shape, blocks.dtype, npy_fingerprint(p))
    return Source(native_order(x), "npy", p, reader, row_chunk,
                  "the input is a .npy file (not compressed)")


def open_zarr(path: str, chunks: int | None, allow_missing_chunks: bool = False) -> Source:
    import zarr

    try:
        node = zarr.open(store=path, mode="r")
    except Exception as e:  # noqa: BLE001 -- zarr raises several types for "missing", "not zarr"
        raise click.BadParameter(
            f"cannot open {path!r} as a Zarr array: {type(e).__name__}: {e}", param_hint="INPUT"
        ) from None
    if isinstance(node, zarr.Group):
        names = sorted(name for name, _ in node.arrays())
        hint = f"; it holds the arrays {', '.join(names)}" if names else " with no arrays"
        raise click.BadParameter(
            f"{path!r} is a Zarr group, not an array: name the array, e.g. {path.rstrip('/')}/"
            f"{names[0] if names else 'NAME'}{hint}",
            param_hint="INPUT",
        )
    check_shape_dtype(node.shape, node.dtype, path)
    if not allow_missing_chunks:
        check_chunks_stored(node, path)
    x = da.from_zarr(node)
    if chunks is not None:
        x = x.rechunk(leading_axis_chunks(x.ndim, chunks))
    url = path if is_url(path) else local(path)
    fingerprint = zarr_fingerprint(node, url)
    fast, why_not = chunk_files_reader(node, url, fingerprint, allow_missing_chunks)
    reader: Reader = fast or ZarrRows(url, node.shape, node.dtype, fingerprint)
    # Blocks of whole Zarr chunks along axis 0 (all trailing axes): each read decodes every
    # chunk it touches exactly once.
    row_chunk = chunks or max(1, int(node.chunks[0]))
    return Source(native_order(x), "zarr", None if is_url(path) else local(path), reader,
                  row_chunk, why_not)


def check_chunks_stored(node: Any, path: str) -> None:
    """Refuse an array with chunks missing from its store: they would read as the fill value.

    One listing of the store (what ``nchunks_initialized`` does), never a chunk read. Zarr
    itself skips chunks that equal the fill value when ``write_empty_chunks`` is off, so a
    missing chunk may be intended: ``--allow-missing-chunks`` says so.
    """
    total = int(node.nchunks)
    stored = int(node.nchunks_initialized)
    if stored < total:
        raise click.BadParameter(
            f"{path!r}: {total - stored} of its {total} chunks are not in the store, and a "
            f"missing chunk reads as the fill value ({node.fill_value}): the input may be "
            "incomplete (an interrupted write, a lost object). If the missing chunks are meant "
            "to be fill values (Zarr skips writing chunks that equal the fill value), pass "
            "--allow-missing-chunks",
            param_hint="INPUT",
        )


def native_order(x: da.Array) -> da.Array:
    """Big-endian input (a ``>f8`` Zarr v2 array or ``.npy`` file) converted as it is read."""
    from ..validate import native

    dt = native(x.dtype)
    return x if dt == x.dtype else x.astype(dt)


def check_shape_dtype(shape: tuple[int, ...], dtype: Any, path: str) -> None:
    from ..validate import DTYPES, native

    if len(shape) == 0:
        raise click.BadParameter(
            f"{path!r} holds a 0-d array (a scalar): nothing to compact", param_hint="INPUT"
        )
    try:
        dt = native(np.dtype(dtype))
    except TypeError:  # zarr v3 data types without a NumPy equivalent
        dt = None
    if dt not in DTYPES:
        raise click.BadParameter(
            f"{path!r} has dtype {dtype}; supported: {', '.join(d.name for d in DTYPES)}",
            param_hint="INPUT",
        )
