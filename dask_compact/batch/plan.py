"""The geometry of a streaming job: input chunks as flat ranges, output chunks, which pieces of
which input chunks make up an output chunk, and what a chunk may cost in memory.

Pure arithmetic on the client, kept apart from the scheduling loop (:mod:`.stream`) so that it
can be tested on its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..validate import output_bytes

INDEX_BYTES = 8  # the int64 global indices of --output indices|both


def row_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    """Decoded bytes of one row (along axis 0) of an array of ``shape`` and ``dtype``; a 0-d
    array's one row is its one element."""
    return int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize


def task_rows(chunk_rows: int, row_bytes: int, n_rows: int, min_bytes: int) -> int:
    """Rows one task of a job reads and compacts: whole input chunks of ``chunk_rows`` rows
    (``row_bytes`` decoded bytes a row, at least one counted), as many as make ``min_bytes``
    (the setting ``dask-compact.batch.task-bytes``; 0: one chunk a task), never more than the
    input's ``n_rows`` rounded up to a chunk.

    Why: a job's tasks per input chunk (read and compact, its summary, the slices its writes
    take) each cost the scheduler the same whatever the chunk's size, and on a cluster that
    cost is milliseconds. Until 2026-12-05 a task read one chunk: 1,024 Zarr chunks of 64 KiB
    (2^24 float32) took 9.9-10.2 s under ``--local processes`` on the 2-core CI machine,
    1.9-2.1 s with tasks of 128 chunks (and :func:`writes_per_task`), the output the same
    (``benchmarks/results/batch-2026-12-05-cpu-13cd793-small-chunks.md``).

    >>> task_rows(16384, 4, 1 << 24, 8 << 20)  # chunks of 64 KiB: 128 a task
    2097152
    >>> task_rows(16384, 4, 1 << 24, 0), task_rows(1 << 25, 4, 1 << 31, 8 << 20)
    (16384, 33554432)
    >>> task_rows(1, 1, 10_000, 8 << 20)  # never past the input
    10000
    """
    chunk_rows = max(1, chunk_rows)
    per = max(1, min_bytes // (chunk_rows * max(1, row_bytes))) if min_bytes > 0 else 1
    chunks = max(1, -(-max(n_rows, 1) // chunk_rows))
    return chunk_rows * min(per, chunks)


@dataclass(frozen=True)
class Layout:
    """Input chunks (blocks of whole rows, so each is a contiguous run of the C order) and the
    output's chunk length.

    An element is one item of the input array (a 0-d array, ``shape`` ``()``, is one row of
    one element: its ``x.ravel()``); for a record (a Zarr group's fields, see
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
        n_rows = shape[0] if shape else 1  # a 0-d input: one row
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


def _out_elem(layout: Layout, mode: str) -> int:
    return layout.out_elem_bytes or output_bytes(layout.itemsize, mode)


def full_selection(layout: Layout, mode: str) -> int:
    """Bytes of the largest chunk's selection buffers (every element selected): the compaction
    writes into buffers of the chunk's length, and a pooled buffer (.host_buffers) is never
    larger than the largest chunk's."""
    return layout.size(0) * _out_elem(layout, mode) if layout.nchunks else 0


def chunk_cost(layout: Layout, i: int, mode: str, copies: bool = False) -> int:
    """Memory one input chunk's piece may hold from its read until its count is known: its
    selection buffers at full length, plus half of that (a selection under a quarter of them is
    copied into a pooled buffer up to twice its size before they go back). ``copies``: on a
    cluster, the piece's slices are also copied where it lives for the writers (see
    :func:`piece_charge`). The decoded chunk is not here: it is in the thread's buffer
    (:func:`thread_cost`)."""
    full = full_selection(layout, mode)
    return full + full // 2 + (full if copies else 0)


def piece_charge(nbytes: int, count: int, layout: Layout, mode: str, copies: bool) -> int:
    """What a piece is charged once its count is known, until it is dropped: the buffers it
    holds (``nbytes``, a view keeps its whole buffer) and, on a cluster, the copies of its
    slices cut for the writers (each element lands in one output chunk: its count at most)."""
    return nbytes + (count * _out_elem(layout, mode) if copies else 0)


def thread_cost(layout: Layout, mode: str, copies: bool = False) -> int:
    """Memory each thread of the job may hold whatever the pieces (2026-11-30: these were not
    charged, and 400 MiB workers paused at the default budget): its reused buffer
    (.host_buffers: a decoded chunk, or an output chunk put together and padded), and while a
    task runs either a chunk's compressed bytes plus a decoded block outside that buffer
    (zarr's path, a chunk read early), or an output chunk's encoded frame plus, on a cluster
    (``copies``), the slices received from other workers."""
    chunk = layout.in_bytes(0) if layout.nchunks else 0
    out = layout.out_chunk * _out_elem(layout, mode)
    return max(chunk, out) + max(2 * chunk, out * (2 if copies else 1))


def job_minimum(layout: Layout, mode: str, threads: int, copies: bool = False) -> int:
    """The least a job can run in: every thread's buffers, one chunk being read, the piece that
    straddles the last written output chunk and the pieces that fill the next one (a piece of
    a quarter or more of its chunk keeps its whole buffer: up to 4x its selection; on a
    cluster plus their slices' copies). The stream reads one chunk whenever nothing runs, so
    it holds at most the larger of this and its budget."""
    full = full_selection(layout, mode)
    out = layout.out_chunk * _out_elem(layout, mode)
    waiting = full + 4 * out + ((full + out) if copies else 0)
    return threads * thread_cost(layout, mode, copies) + chunk_cost(layout, 0, mode, copies) \
        + waiting


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


def writes_per_task(layout: Layout, mode: str, min_bytes: int) -> int:
    """Output chunks one write task writes: as many as hold ``min_bytes`` (the setting of
    :func:`task_rows`) of output at most, at least one; one where the setting is 0. Each is
    written as a task of its own would write it (:func:`.tasks.write_chunks`): only the
    scheduler's cost per task is shared.

    >>> lay = Layout.make((1 << 20,), 4, 1 << 16, 1 << 14)  # output chunks of 64 KiB
    >>> writes_per_task(lay, "values", 8 << 20), writes_per_task(lay, "both", 8 << 20)
    (128, 42)
    >>> writes_per_task(lay, "values", 0), writes_per_task(lay, "values", 1 << 10)
    (1, 1)
    """
    if min_bytes <= 0:
        return 1
    return max(1, min_bytes // max(1, layout.out_chunk * _out_elem(layout, mode)))


def out_chunks_below(end: int, out_chunk: int) -> int:
    """How many output chunks lie wholly below global offset ``end``."""
    return end // out_chunk


def out_chunks_total(total: int, out_chunk: int) -> int:
    return math.ceil(total / out_chunk) if total else 0
