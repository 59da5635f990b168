"""The chunk task of a streaming job on a Zarr group (:mod:`.records_job`): read one block of
rows of every field the job uses, select the rows by the record predicate, and hand on the
selected rows of the fields it writes (plus their indices).

The same contract as :func:`.tasks.read_compact` (called with the same arguments by the
streaming loop, :mod:`.stream`), with a :class:`RecordReader` in place of one array's reader
and a :class:`RecordPiece` (one array per output name) in place of a :class:`.tasks.Piece`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cache import BoundedCache
from .cf import Decoding
from .host_buffers import piece_alloc, thread_field
from .reader import Reader, ZarrChunkFiles
from .tasks import ChunkError, _held, _read, _read_into, _thread_stream, _to_host, device_and_ring

INDICES = "indices"


@dataclass(frozen=True)
class RecordReader:
    """Readers of the fields of a record (all with the same number of rows): the fields to
    write, then those the predicate reads and are not written. Pickles as the fields'
    locations only, like each :data:`.reader.Reader`.

    ``decode``: the fields the predicate reads as xarray decodes them (:mod:`.cf`), and how;
    it sees their decoded values, while the written fields are gathered as stored."""

    fields: dict[str, Reader]
    written: tuple[str, ...]
    decode: dict[str, Decoding] = field(default_factory=dict)

    @property
    def fingerprint(self) -> dict[str, str]:
        return {name: r.fingerprint for name, r in self.fields.items()}


@dataclass
class RecordPiece:
    """One input chunk's selected rows: name -> NumPy (or CuPy) array, every written field
    and ``"indices"`` when the job writes them."""

    arrays: dict[str, Any]
    count: int
    read_s: float = 0.0
    compact_s: float = 0.0
    device: str = "cpu"
    decode: str = "cpu"

    @property
    def nbytes(self) -> int:
        return sum(_held(a) for a in self.arrays.values())

    def part(self, name: str) -> Any:
        return self.arrays[name]

    def slice(self, lo: int, hi: int) -> RecordPiece:
        """Rows ``lo:hi`` (copies: the slice travels to another worker)."""
        return RecordPiece({k: a[lo:hi].copy() for k, a in self.arrays.items()}, hi - lo)


# (where, each field's name, dtype and trailing shape) -> the checked record predicate, the
# memory-entries most recently used. Until 2026-12-01 (fourteenth session, a long-running
# probe) a dict kept every one for the process's life: a worker of a long-lived cluster
# running jobs of ever new --where constants grew 3.6 kB a job, without bound (the one-array
# jobs' tasks._predicate keeps 32)
_checked: BoundedCache[tuple[Any, ...], Any] = BoundedCache("batch record predicates")


def _predicate(where: str, blocks: dict[str, Any]) -> Any:
    """The record predicate, parsed and typed once per process for these fields' names,
    dtypes and trailing shapes (the job's chunks all share them)."""
    from ..records_check import check_record_predicate

    key = (where, tuple((n, b.dtype.str, b.shape[1:]) for n, b in blocks.items()))
    return _checked.get_or_build(key, lambda: check_record_predicate(where, blocks))


def read_compact_records(
    reader: RecordReader, i: int, r0: int, r1: int, base: int, where: str, mode: str,
    device: str, decode: str = "cpu", encode: str = "cpu",
) -> RecordPiece:
    """Read rows ``r0:r1`` (input chunk ``i``; ``base`` is its first row, the indices' base)
    of every field, select them, and keep the written fields' selected rows.

    ``device``: as for :func:`.tasks.read_compact` ("cpu", "gpu": this worker's device,
    "gpu-all": device ``i % n``). The fields are decoded on the CPU (``decode`` and
    ``encode`` are always "cpu" for a record), each into this thread's reused buffer for it
    (page-locked for a GPU), as the one-array task decodes its chunk (see
    :mod:`.host_buffers`: fresh arrays cost their page faults, serialised across threads). A
    field the predicate reads but the job does not write is never gathered. A field the
    predicate reads decoded (``reader.decode``) is decoded on the CPU into a buffer of its
    own, which the predicate reads on the CPU or the GPU; its stored values are gathered."""
    where_from = f"input chunk {i} (rows {r0}:{r1})"
    on_gpu = device.startswith("gpu")
    dev, ring = device_and_ring(i, device) if on_gpu else (-1, None)
    t0 = time.perf_counter()
    blocks = {}
    for k, (name, rd) in enumerate(reader.fields.items()):
        at = f"field {name!r} of {where_from}"
        if isinstance(rd, ZarrChunkFiles):
            # page-locked for a copy to the GPU, unless the copy goes through a ring
            block = thread_field(k, (r1 - r0, *rd.shape[1:]), rd.dtype, on_gpu and not ring)
            _read_into(rd, r0, r1, block, at)
        else:
            block = _read(rd, r0, r1, at)
        blocks[name] = block
    seen = _decoded(reader.decode, blocks, on_gpu and not ring)
    t1 = time.perf_counter()
    indices = mode != "values"
    try:
        p = _predicate(where, seen)
        if on_gpu:
            arrays = _on_gpu(blocks, seen, p, indices, base, reader.written, dev, ring)
        else:
            arrays = _on_cpu(blocks, seen, p, indices, base, reader.written)
    except Exception as e:
        raise ChunkError(f"cannot compact {where_from}: {type(e).__name__}: {e}") from e
    count = int(len(next(iter(arrays.values())))) if arrays else 0
    return RecordPiece(arrays, count, t1 - t0, time.perf_counter() - t1,
                       "gpu" if on_gpu else "cpu")


def _decoded(decode: dict[str, Decoding], blocks: dict[str, Any], pinned: bool
             ) -> dict[str, Any]:
    """The fields as the predicate sees them: ``blocks`` with each field of ``decode`` decoded
    (:meth:`.cf.Decoding.apply`, NumPy's operations as xarray's) into this thread's buffer
    for it (after the fields' own, page-locked where ``pinned``)."""
    if not decode:
        return blocks
    seen = dict(blocks)
    for j, (name, d) in enumerate(decode.items()):
        stored = blocks[name]
        out = thread_field(len(blocks) + j, stored.shape, d.dtype, pinned)
        seen[name] = d.apply(stored, out)
    return seen


def _on_cpu(blocks: dict[str, Any], seen: dict[str, Any], p: Any, indices: bool, base: int,
            written: tuple[str, ...]) -> dict[str, Any]:
    """The selection by the compiled record loop: the predicate's bits and count first (over
    ``seen``, the fields as the predicate sees them), then each written field gathered from
    ``blocks`` (as stored) into an exact-size buffer of the job's pool (memory already paged
    in, see :mod:`.host_buffers`)."""
    from ..backends.numpy_gather import column_plan, gather_field, gather_indices
    from ..backends.numpy_records import predicate_bits

    n = int(next(iter(blocks.values())).shape[0])
    bits, k = predicate_bits(p, seen, n)
    out = {}
    for name, dtype, tail, gather in column_plan({name: blocks[name] for name in written}):
        buf = piece_alloc(k * int(np.prod(tail, dtype=np.int64)), dtype)
        out[name] = buf.reshape((k, *tail))
        if k:
            gather_field(bits, n, blocks[name], out[name], gather)
    if indices:
        out[INDICES] = piece_alloc(k, np.dtype(np.int64))
        if k:
            gather_indices(bits, int(base), out[INDICES])
    return out


def _on_gpu(blocks: dict[str, Any], seen: dict[str, Any], p: Any, indices: bool, base: int,
            written: tuple[str, ...], dev: int, ring: Any) -> dict[str, Any]:
    """The selection on device ``dev`` (see :func:`.tasks.device_and_ring`), copied back to
    host memory for the writes (through ``ring`` where there is one). A decoded field
    (``seen`` holds another array than ``blocks``) goes to the device decoded where only the
    predicate reads it; where it is written too, both go, the decoded one under a name no
    Zarr array can have (:func:`_decoded_name`), which the predicate then reads."""
    import cupy

    from ..dispatch import compact_records

    keep = [*written, *([INDICES] if indices else [])]
    sent = dict(blocks)
    renamed = {}
    for name, a in seen.items():
        if a is not blocks[name]:
            if name in written:
                renamed[name] = _decoded_name(name)
                sent[renamed[name]] = a
            else:
                sent[name] = a
    p = _renamed(p, renamed)
    # fields of a dtype CuPy has no arrays of (datetime64, timedelta64, fixed-size bytes and
    # strings, structured rows) travel as their bytes; gathered as such and viewed back on
    # the host (until 2026-12-02, seventeenth session, a new-user probe: CuPy's "Unsupported
    # dtype" failed the job on a GPU host for any such field it writes, --device auto)
    as_bytes = {name: b.dtype for name, b in sent.items() if b.dtype.kind in _NOT_ON_GPU}
    sent = {name: _bytes_of(b) if name in as_bytes else b for name, b in sent.items()}
    with cupy.cuda.Device(dev), _thread_stream(dev):
        stream = cupy.cuda.get_current_stream()
        on_dev = {}
        for name, b in sent.items():
            # from this thread's pinned buffers: asynchronous copies on the thread's stream,
            # complete before the compaction's count comes back (or through the ring's pieces)
            d = cupy.empty(b.shape, b.dtype)
            if ring is not None:
                ring.to_device(d, np.ascontiguousarray(b), stream)
            else:
                d.set(b, stream=stream)
            on_dev[name] = d
        first = next(iter(on_dev.values()))
        out = compact_records(first, on_dev, p, indices, True, base, 1)
        del on_dev
        host = {name: _to_host(out[name], ring) for name in keep}
        return {name: _from_bytes(a, as_bytes[name]) if name in as_bytes and a is not None else a
                for name, a in host.items()}


# the dtype kinds CuPy has no arrays of
_NOT_ON_GPU = "mMSUV"


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes as uint8, one more axis of its itemsize (rows stay rows; no byte order
    read, so a big-endian field comes back as it was)."""
    a = np.ascontiguousarray(a)
    return a.view(np.uint8).reshape(*a.shape, a.dtype.itemsize)


def _from_bytes(b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The rows :func:`_bytes_of` made, viewed as ``dtype`` again."""
    return np.ascontiguousarray(b).view(dtype).reshape(b.shape[:-1])


def _decoded_name(name: str) -> str:
    """The name of field ``name``'s decoded values beside its stored ones: a "/" cannot be in
    the name of a Zarr group's array, so it is no field's."""
    return f"{name}/decoded"


def _renamed(p: Any, names: dict[str, str]) -> Any:
    """The fused predicate ``p`` reading the fields ``names`` maps under their new names
    (kept in ``p``'s memo: the process's predicate is cached, see :func:`_predicate`)."""
    if not names:
        return p
    key = ("renamed", tuple(sorted(names.items())))
    hit = p.memo.get(key)
    if hit is None:
        hit = p.memo[key] = _renamed_now(p, names)
    return hit


def _renamed_now(p: Any, names: dict[str, str]) -> Any:
    from ..predicate.core import Predicate
    from ..predicate.expr import Call, Node, Var, variables

    def rename(node: Node) -> Node:
        if isinstance(node, Var):
            return Var(names.get(node.name, node.name))
        if isinstance(node, Call):
            return Call(node.fn, tuple(rename(a) for a in node.args))
        return node

    assert p.expr is not None  # a string predicate is always fused (predicate.parse)
    expr = rename(p.expr)
    return Predicate(expr=expr, params=p.params, func=None, source=p.source,
                     fields=variables(expr))
