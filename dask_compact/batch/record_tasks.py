"""The chunk task of a streaming job on a Zarr group (:mod:`.records_job`): read one block of
rows of every field the job uses, select the rows by the record predicate, and hand on the
selected rows of the fields it writes (plus their indices).

The same contract as :func:`.tasks.read_compact` (called with the same arguments by the
streaming loop, :mod:`.stream`), with a :class:`RecordReader` in place of one array's reader
and a :class:`RecordPiece` (one array per output name) in place of a :class:`.tasks.Piece`.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from .reader import Reader
from .tasks import ChunkError, _held, _read, _thread_stream, _to_host

INDICES = "indices"


@dataclass(frozen=True)
class RecordReader:
    """Readers of the fields of a record (all with the same number of rows): the fields to
    write, then those the predicate reads and are not written. Pickles as the fields'
    locations only, like each :data:`.reader.Reader`."""

    fields: dict[str, Reader]
    written: tuple[str, ...]

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


_checked: dict[tuple[Any, ...], Any] = {}
_checked_lock = threading.Lock()


def _predicate(where: str, blocks: dict[str, Any]) -> Any:
    """The record predicate, parsed and typed once per process for these fields' names,
    dtypes and trailing shapes (the job's chunks all share them)."""
    from ..records_check import check_record_predicate

    key = (where, tuple((n, b.dtype.str, b.shape[1:]) for n, b in blocks.items()))
    p = _checked.get(key)
    if p is None:
        p = check_record_predicate(where, blocks)
        with _checked_lock:
            _checked[key] = p
    return p


def read_compact_records(
    reader: RecordReader, i: int, r0: int, r1: int, base: int, where: str, mode: str,
    device: str, decode: str = "cpu", encode: str = "cpu",
) -> RecordPiece:
    """Read rows ``r0:r1`` (input chunk ``i``; ``base`` is its first row, the indices' base)
    of every field, select them, and keep the written fields' selected rows.

    ``device``: as for :func:`.tasks.read_compact` ("cpu", "gpu": this worker's device,
    "gpu-all": device ``i % n``). The fields are decoded on the CPU (``decode`` and
    ``encode`` are always "cpu" for a record). A field the predicate reads but the job does
    not write is dropped after the selection."""
    from ..dispatch import compact_records

    where_from = f"input chunk {i} (rows {r0}:{r1})"
    t0 = time.perf_counter()
    blocks = {name: _read(rd, r0, r1, f"field {name!r} of {where_from}")
              for name, rd in reader.fields.items()}
    t1 = time.perf_counter()
    indices = mode != "values"
    keep = [*reader.written, *([INDICES] if indices else [])]
    try:
        p = _predicate(where, blocks)
        if not device.startswith("gpu"):
            # One thread per task: the job's pool already runs a task per core.
            first = next(iter(blocks.values()))
            out = compact_records(first, blocks, p, indices, True, base, 1)
            arrays = {name: out[name] for name in keep}
            on = "cpu"
        else:
            arrays = _on_gpu(blocks, p, indices, base, keep, i, device)
            on = "gpu"
    except Exception as e:
        raise ChunkError(f"cannot compact {where_from}: {type(e).__name__}: {e}") from e
    count = int(len(next(iter(arrays.values())))) if arrays else 0
    return RecordPiece(arrays, count, t1 - t0, time.perf_counter() - t1, on)


def _on_gpu(blocks: dict[str, Any], p: Any, indices: bool, base: int, keep: list[str], i: int,
            device: str) -> dict[str, Any]:
    """The selection on a GPU (this worker's, or device ``i % n`` for "gpu-all"), copied back
    to host memory for the writes."""
    import cupy

    from ..dispatch import compact_records

    ndev = cupy.cuda.runtime.getDeviceCount()
    dev = i % ndev if device == "gpu-all" else cupy.cuda.runtime.getDevice()
    with cupy.cuda.Device(dev), _thread_stream(dev):
        on_dev = {name: cupy.asarray(b) for name, b in blocks.items()}
        first = next(iter(on_dev.values()))
        out = compact_records(first, on_dev, p, indices, True, base, 1)
        del on_dev
        return {name: _to_host(out[name]) for name in keep}
