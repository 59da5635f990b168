"""The geometry of a streaming job: input chunks as flat ranges, output chunks, which pieces of
which input chunks make up an output chunk, and what a chunk may cost in memory.

Pure arithmetic on the client, kept apart from the scheduling loop (:mod:`.stream`) so that it
can be tested on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

INDEX_BYTES = 8  # the int64 global indices of --output indices|both


@dataclass(frozen=True)
class Layout:
    """Input chunks (blocks of whole rows, so each is a contiguous run of the C order) and the
    output's chunk length.

    An element is one item of the input array; for a record (a Zarr group's fields, see
    :mod:`.records_job`) it is one row: ``shape`` is ``(rows,)``, ``itemsize`` the bytes of
    one row of every field read, and ``out_elem_bytes`` those of one selected row of every
    field compacted (plus its index)."""

    shape: tuple[int, ...]
    itemsize: int
    rows: tuple[int, ...]  # row boundaries of the input chunks: rows[i]:rows[i + 1]
    out_chunk: int  # the output arrays' Zarr chunk length
    out_elem_bytes: int = 0  # bytes per selected element; 0: from itemsize and the mode

    @classmethod
    def make(cls, shape: tuple[int, ...], itemsize: int, row_chunk: int,
             out_chunk: int | None, out_elem_bytes: int = 0) -> Layout:
        n_rows = shape[0]
        step = max(1, row_chunk)
        rows = tuple(range(0, n_rows, step)) + (n_rows,)
        if n_rows == 0:
            rows = (0,)
        row_elems = int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
        # an output chunk as long as an input chunk, but never longer than the input: zarr
        # stores every chunk at its full length (a chunk of 10^9 asked for 1,000 elements
        # allocated 7.45 GiB), and --chunks may exceed the rows
        whole = max(1, n_rows * row_elems)
        default = max(1, min(step, n_rows) * row_elems)
        return cls(tuple(shape), itemsize, rows, min(out_chunk or default, whole),
                   out_elem_bytes)

    @property
    def row_elems(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1

    @property
    def n(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nchunks(self) -> int:
        return len(self.rows) - 1

    def start(self, i: int) -> int:
        """Flat index of input chunk i's first element (its indices' base)."""
        return self.rows[i] * self.row_elems

    def size(self, i: int) -> int:
        return (self.rows[i + 1] - self.rows[i]) * self.row_elems

    def in_bytes(self, i: int) -> int:
        return self.size(i) * self.itemsize


def out_bytes_per_element(itemsize: int, mode: str) -> int:
    """Bytes one selected element occupies in the output pieces."""
    return {"values": itemsize, "indices": INDEX_BYTES, "both": itemsize + INDEX_BYTES}[mode]


def chunk_cost(layout: Layout, i: int, mode: str) -> int:
    """Memory one input chunk may hold from its read until its output is written, before its
    count is known: the decoded chunk plus a full selection (the worst case)."""
    size = layout.size(i)
    out = layout.out_elem_bytes or out_bytes_per_element(layout.itemsize, mode)
    return size * layout.itemsize + size * out


@dataclass(frozen=True)
class Part:
    """Elements ``lo:hi`` of input chunk ``chunk``'s compacted piece."""

    chunk: int
    lo: int
    hi: int


def parts_of(j: int, out_chunk: int, offsets: dict[int, int], counts: dict[int, int],
             first: int, last: int) -> list[Part]:
    """The pieces of input chunks ``first..last`` (offsets and counts known) that fill output
    chunk j, in order. Empty pieces are left out."""
    lo_j, hi_j = j * out_chunk, (j + 1) * out_chunk
    parts = []
    for k in range(first, last + 1):
        c = counts[k]
        if c == 0:
            continue
        o = offsets[k]
        lo, hi = max(lo_j, o), min(hi_j, o + c)
        if lo < hi:
            parts.append(Part(k, lo - o, hi - o))
    return parts


def out_chunks_below(end: int, out_chunk: int) -> int:
    """How many output chunks lie wholly below global offset ``end``."""
    return end // out_chunk


def out_chunks_total(total: int, out_chunk: int) -> int:
    return math.ceil(total / out_chunk) if total else 0
