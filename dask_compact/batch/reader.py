"""Reading blocks of rows of the input where a task runs: a Zarr array (local path or fsspec
URL) or a memory-mapped ``.npy`` file.

A reader pickles as its location only; each process opens the input once (a small per-process
cache), so a distributed graph never carries data and a task reads only the rows it compacts.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np


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
        return np.asarray(_open_zarr(self.url)[r0:r1])


class NpyRows:
    """Rows ``r0:r1`` of a ``.npy`` file, memory-mapped by each process that reads."""

    kind = "npy"

    def __init__(self, path: str, shape: tuple[int, ...], dtype: np.dtype, fingerprint: str):
        self.path = path
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.fingerprint = fingerprint

    def read(self, r0: int, r1: int) -> np.ndarray:
        # A copy: a memmap slice would keep the file mapped inside the piece.
        return np.array(_open_npy(self.path)[r0:r1])


Reader = ZarrRows | NpyRows


@functools.lru_cache(maxsize=16)
def _open_zarr(url: str) -> Any:
    import zarr

    return zarr.open_array(store=url, mode="r")


@functools.lru_cache(maxsize=16)
def _open_npy(path: str) -> np.memmap:
    return np.load(path, mmap_mode="r")


def zarr_fingerprint(node: Any, url: str) -> str:
    """What identifies the input for a resumed job: its metadata and, for a local array, the
    modification time of its metadata document (rewritten whenever the array is recreated)."""
    meta = node.metadata.to_dict()
    parts = [repr(sorted(meta.items()))]
    for name in ("zarr.json", ".zarray"):
        p = os.path.join(url, name)
        if "://" not in url and os.path.exists(p):
            parts.append(str(os.stat(p).st_mtime_ns))
    from dask.base import tokenize

    return tokenize(*parts)


def npy_fingerprint(path: str) -> str:
    from dask.base import tokenize

    st = os.stat(path)
    return tokenize(path, st.st_mtime_ns, st.st_size)
